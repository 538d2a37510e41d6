// The CUDA kernels' launchers: one per op, called by the CUDA FFI handlers (and later
// by the pointer backend). Each enqueues its kernels on `stream` and returns the
// launch status (the first failing launch's, each checked right after it, else
// cudaSuccess); none synchronises or allocates.
// T is the storage type of numeric.h (half, bfloat16, float, double); launchers
// reinterpret half/bfloat16 as __half/__nv_bfloat16 internally. Shapes arrive
// validated by ffi/bindings/checks.h. Plain C++ header: the handlers compile with the
// host compiler.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "oxijax/numeric.h"
#include "oxijax/ops.h"
#include "oxijax/shapes.h"

namespace oxijax::cuda {

template <typename T>
cudaError_t unary(cudaStream_t stream, UnaryOp op, const T* x, T* y, int64_t n);

template <typename T>
cudaError_t binary(cudaStream_t stream, BinaryOp op, const BroadcastShape& shape, const T* a,
                   const T* b, T* out);

// Device workspace a reduce of this shape needs (0 when none); the caller passes at
// least this many bytes, 256-byte aligned.
size_t reduce_workspace_bytes(const ReduceShape& shape, size_t element_bytes);
template <typename T>
cudaError_t reduce(cudaStream_t stream, ReduceOp op, const ReduceShape& shape, const T* x,
                   T* out, void* workspace);

// allow_tf32: float32 inputs may use TF32 tensor cores (opt-in); other dtypes ignore it.
// When the output tiles cannot fill the GPU and k is long, gemm splits k over blocks
// (split-K) and needs a device workspace of gemm_workspace_bytes (256-byte aligned; none
// when 0). Without a workspace (nullptr) it never splits.
size_t gemm_workspace_bytes(const GemmShape& shape, size_t element_bytes, bool allow_tf32);
template <typename T>
cudaError_t gemm(cudaStream_t stream, const GemmShape& shape, const T* a, const T* b,
                 const T* c, T* out, bool allow_tf32, void* workspace);

template <typename T>
cudaError_t conv2d(cudaStream_t stream, const ConvShape& shape, const T* x, const T* w, T* out);

// allow_tf32: float32 inputs may use TF32 tensor cores (opt-in); other dtypes ignore it.
template <typename T>
cudaError_t attention(cudaStream_t stream, const AttentionShape& shape, const T* q, const T* k,
                      const T* v, T* out, Acc<T>* lse, bool allow_tf32);

// Attention gradients (FlashAttention-2 backward): dq like q, dk and dv like k, from the
// forward's out and lse and the output cotangent dout; deterministic (no atomics). Needs
// a device workspace of attention_backward_workspace_bytes, 256-byte aligned: at its
// start the per-row delta = rowsum(dout * out), in float32 / float64.
size_t attention_backward_workspace_bytes(const AttentionShape& shape, size_t element_bytes);
template <typename T>
cudaError_t attention_backward(cudaStream_t stream, const AttentionShape& shape, const T* q,
                               const T* k, const T* v, const T* out, const Acc<T>* lse,
                               const T* dout, T* dq, T* dk, T* dv, void* workspace);
// Forward-mode derivative of attention: dout (like q) from the tangents dq, dk, dv and
// the forward's out and lse; no workspace.
template <typename T>
cudaError_t attention_jvp(cudaStream_t stream, const AttentionShape& shape, const T* q,
                          const T* k, const T* v, const T* out, const Acc<T>* lse, const T* dq,
                          const T* dk, const T* dv, T* dout);
// ---------------------------------------------------------------- backward passes

// out = t * f'(x) over n elements.
template <typename T>
cudaError_t unary_grad(cudaStream_t stream, UnaryOp op, const T* x, const T* t, T* out,
                       int64_t n);

// d op(a, b) / da for op MAX or MIN, broadcast like binary.
template <typename T>
cudaError_t binary_partial(cudaStream_t stream, BinaryOp op, const BroadcastShape& shape,
                           const T* a, const T* b, T* out);

// conv2d's backward passes (shape describes the forward problem): dx from dy and w, dw
// from x and dy. backward_filter may split its long reduction over blocks: it needs a
// device workspace of conv2d_backward_filter_workspace_bytes (256-byte aligned; none
// when 0).
// backward_data with stride 1 keeps a flipped copy of the filter in a device workspace
// of conv2d_backward_data_workspace_bytes (256-byte aligned; none when 0).
size_t conv2d_backward_data_workspace_bytes(const ConvShape& shape, size_t element_bytes);
template <typename T>
cudaError_t conv2d_backward_data(cudaStream_t stream, const ConvShape& shape, const T* dy,
                                 const T* w, T* dx, void* workspace);
size_t conv2d_backward_filter_workspace_bytes(const ConvShape& shape, size_t element_bytes);
template <typename T>
cudaError_t conv2d_backward_filter(cudaStream_t stream, const ConvShape& shape, const T* x,
                                   const T* dy, T* dw, void* workspace);

// ---------------------------------------------------------------- ptx.h probes
// One warp applies one group of ptx.h's instructions to kProbeWords words (device
// memory) and writes kProbeWords words: the hardware-versus-interpreter test's kernel
// (ptx_probe_kernels.cu documents each probe's layout).
enum class PtxProbe : int32_t {
  kCpAsync = 0, kLdmatrix, kLdmatrixTrans, kMmaF16, kMmaBf16, kMmaTf32, kMmaF64, kConvert,
  kStShared
};
inline constexpr int kProbeWords = 1024;
cudaError_t ptx_probe(cudaStream_t stream, PtxProbe probe, const uint32_t* in, uint32_t* out);

}  // namespace oxijax::cuda
