// CUDA FFI handlers: validate (checks.h, the same checks as on the CPU), pick the
// dtype, enqueue the kernels of ffi/cuda on XLA's stream. They never synchronise and
// never allocate device memory themselves (reduce's workspace comes from XLA's scratch
// allocator); a failed launch becomes an ffi::Error that JAX raises in Python.
// The CUDA interpreter's module compiles this file too (OXIJAX_CUDA_INTERPRET), with its
// own stream, scratch memory and buffer registration (ffi/interp/ffi_context.h).
#include <cuda_runtime_api.h>

#include <cstdint>
#include <optional>
#include <string>

#include "checks.h"
#include "common.h"
#include "handlers.h"
#include "cuda/kernels.h"
#ifdef OXIJAX_CUDA_INTERPRET
#include "interp/ffi_context.h"
#endif

namespace oxijax::bindings {
namespace {

#ifdef OXIJAX_CUDA_INTERPRET
using Stream = interp::FfiStream;
using Scratch = interp::FfiScratch;
template <auto Impl>
using CudaHandler = interp::FfiHandler<Impl>;
#else
using Stream = ffi::PlatformStream<cudaStream_t>;
using Scratch = ffi::ScratchAllocator;
template <auto Impl>
using CudaHandler = Handler<Impl>;
#endif

ffi::Error launched(cudaError_t status, const char* op) {
  if (status == cudaSuccess) return ffi::Error::Success();
  return ffi::Error::Internal(std::string("oxijax: CUDA ") + op + " kernel launch failed: " +
                              cudaGetErrorName(status) + ": " + cudaGetErrorString(status));
}

// `bytes` of XLA's scratch memory at the 256-byte alignment the kernels' workspaces
// promise (cuda/kernels.h), or nullptr when it needs none. Never cudaMalloc: XLA owns and
// reuses this memory. XLA refuses an alignment above 16 (kMaxAlignment in ffi_api.cc;
// seen on an H200 with jax 0.11.2), so take 16-byte-aligned memory with room to round up.
constexpr size_t kWorkspaceAlignment = 256;
constexpr size_t kXlaScratchAlignment = 16;

ffi::Error scratch_workspace(Scratch& scratch, size_t bytes, const char* what,
                             void*& workspace) {
  workspace = nullptr;
  if (bytes == 0) return ffi::Error::Success();
  std::optional<void*> allocated =
      scratch.Allocate(bytes + kWorkspaceAlignment - kXlaScratchAlignment, kXlaScratchAlignment);
  if (!allocated)
    return ffi::Error(ffi::ErrorCode::kResourceExhausted,
                      std::string("oxijax: no scratch memory for the ") + what);
  const auto address = reinterpret_cast<uintptr_t>(*allocated);
  workspace = reinterpret_cast<void*>((address + kWorkspaceAlignment - 1) &
                                      ~(kWorkspaceAlignment - 1));
  return ffi::Error::Success();
}

ffi::Error UnaryImpl(cudaStream_t stream, ffi::AnyBuffer x, ffi::Result<ffi::AnyBuffer> y,
                     UnaryOp op) {
  int64_t n;
  if (auto err = check_unary(x, *y, op, n); err.failure()) return err;
  return dispatch_float(x.element_type(), [&](auto t) {
    using T = decltype(t);
    return launched(cuda::unary(stream, op, typed<T>(x), typed<T>(y), n), "unary");
  });
}

ffi::Error BinaryImpl(cudaStream_t stream, ffi::AnyBuffer a, ffi::AnyBuffer b,
                      ffi::Result<ffi::AnyBuffer> out, BinaryOp op) {
  BroadcastShape shape;
  if (auto err = check_binary(a, b, *out, op, shape); err.failure()) return err;
  return dispatch_float(a.element_type(), [&](auto t) {
    using T = decltype(t);
    return launched(cuda::binary(stream, op, shape, typed<T>(a), typed<T>(b), typed<T>(out)),
                    "binary");
  });
}

ffi::Error ReduceImpl(cudaStream_t stream, Scratch scratch, ffi::AnyBuffer x,
                      ffi::Result<ffi::AnyBuffer> out, ReduceOp op, int64_t axis) {
  ReduceShape shape;
  if (auto err = check_reduce(x, *out, op, axis, shape); err.failure()) return err;
  const size_t bytes = cuda::reduce_workspace_bytes(shape, ffi::ByteWidth(x.element_type()));
  void* workspace;
  if (auto err = scratch_workspace(scratch, bytes, "reduce workspace", workspace); err.failure())
    return err;
  return dispatch_float(x.element_type(), [&](auto t) {
    using T = decltype(t);
    return launched(cuda::reduce(stream, op, shape, typed<T>(x), typed<T>(out), workspace),
                    "reduce");
  });
}

ffi::Error GemmImpl(cudaStream_t stream, Scratch scratch, ffi::RemainingArgs operands,
                    ffi::Result<ffi::AnyBuffer> out, Transpose trans_a, Transpose trans_b,
                    double alpha, double beta, bool allow_tf32) {
  std::optional<ffi::AnyBuffer> a, b, c;
  if (auto err = gemm_operands(operands, a, b, c); err.failure()) return err;
  GemmShape shape;
  if (auto err = check_gemm(*a, *b, c ? &*c : nullptr, *out, trans_a, trans_b, alpha, beta, shape);
      err.failure())
    return err;
  const size_t bytes =
      cuda::gemm_workspace_bytes(shape, ffi::ByteWidth(a->element_type()), allow_tf32);
  void* workspace;
  if (auto err = scratch_workspace(scratch, bytes, "gemm split-K workspace", workspace);
      err.failure())
    return err;
  return dispatch_float(a->element_type(), [&](auto t) {
    using T = decltype(t);
    const T* c_data = (c && beta != 0.0) ? typed<T>(*c) : nullptr;
    return launched(cuda::gemm(stream, shape, typed<T>(*a), typed<T>(*b), c_data, typed<T>(out),
                               allow_tf32, workspace),
                    "gemm");
  });
}

ffi::Error Conv2dImpl(cudaStream_t stream, ffi::AnyBuffer x, ffi::AnyBuffer w,
                      ffi::Result<ffi::AnyBuffer> out, int64_t stride_h, int64_t stride_w,
                      int64_t pad_h, int64_t pad_w) {
  ConvShape shape;
  if (auto err = check_conv2d(x, w, *out, stride_h, stride_w, pad_h, pad_w, shape); err.failure())
    return err;
  return dispatch_float(x.element_type(), [&](auto t) {
    using T = decltype(t);
    return launched(cuda::conv2d(stream, shape, typed<T>(x), typed<T>(w), typed<T>(out)),
                    "conv2d");
  });
}

ffi::Error AttentionImpl(cudaStream_t stream, ffi::AnyBuffer q, ffi::AnyBuffer k,
                         ffi::AnyBuffer v, ffi::Result<ffi::AnyBuffer> out,
                         ffi::Result<ffi::AnyBuffer> lse, double scale, bool causal,
                         bool allow_tf32) {
  AttentionShape shape;
  if (auto err = check_attention(q, k, v, *out, *lse, scale, causal, shape); err.failure())
    return err;
  return dispatch_float(q.element_type(), [&](auto t) {
    using T = decltype(t);
    return launched(cuda::attention(stream, shape, typed<T>(q), typed<T>(k), typed<T>(v),
                                    typed<T>(out), typed<Acc<T>>(lse), allow_tf32),
                    "attention");
  });
}

ffi::Error AttentionBackwardImpl(cudaStream_t stream, Scratch scratch,
                                 ffi::AnyBuffer q, ffi::AnyBuffer k, ffi::AnyBuffer v,
                                 ffi::AnyBuffer out, ffi::AnyBuffer lse, ffi::AnyBuffer dout,
                                 ffi::Result<ffi::AnyBuffer> dq, ffi::Result<ffi::AnyBuffer> dk,
                                 ffi::Result<ffi::AnyBuffer> dv, double scale, bool causal) {
  AttentionShape shape;
  if (auto err = check_attention_backward(q, k, v, out, lse, dout, *dq, *dk, *dv, scale, causal,
                                          shape);
      err.failure())
    return err;
  const size_t bytes =
      cuda::attention_backward_workspace_bytes(shape, ffi::ByteWidth(q.element_type()));
  void* workspace;
  if (auto err = scratch_workspace(scratch, bytes, "attention backward workspace", workspace);
      err.failure())
    return err;
  return dispatch_float(q.element_type(), [&](auto t) {
    using T = decltype(t);
    return launched(cuda::attention_backward(stream, shape, typed<T>(q), typed<T>(k),
                                             typed<T>(v), typed<T>(out), typed<Acc<T>>(lse),
                                             typed<T>(dout), typed<T>(dq), typed<T>(dk),
                                             typed<T>(dv), workspace),
                    "attention backward");
  });
}

ffi::Error AttentionJvpImpl(cudaStream_t stream, ffi::AnyBuffer q, ffi::AnyBuffer k,
                            ffi::AnyBuffer v, ffi::AnyBuffer out, ffi::AnyBuffer lse,
                            ffi::AnyBuffer dq, ffi::AnyBuffer dk, ffi::AnyBuffer dv,
                            ffi::Result<ffi::AnyBuffer> dout, double scale, bool causal) {
  AttentionShape shape;
  if (auto err = check_attention_jvp(q, k, v, out, lse, dq, dk, dv, *dout, scale, causal, shape);
      err.failure())
    return err;
  return dispatch_float(q.element_type(), [&](auto t) {
    using T = decltype(t);
    return launched(cuda::attention_jvp(stream, shape, typed<T>(q), typed<T>(k), typed<T>(v),
                                        typed<T>(out), typed<Acc<T>>(lse), typed<T>(dq),
                                        typed<T>(dk), typed<T>(dv), typed<T>(dout)),
                    "attention jvp");
  });
}

}  // namespace

// Handlers that only launch kernels are command-buffer (CUDA graph) compatible; reduce
// is not, as it may take scratch memory.
XLA_FFI_DEFINE_HANDLER_SYMBOL(Cuda_unary, CudaHandler<UnaryImpl>::Call,
                              ffi::Ffi::Bind()
                                  .Ctx<Stream>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Ret<ffi::AnyBuffer>()
                                  .Attr<UnaryOp>("op"),
                              {ffi::Traits::kCmdBufferCompatible});

XLA_FFI_DEFINE_HANDLER_SYMBOL(Cuda_binary, CudaHandler<BinaryImpl>::Call,
                              ffi::Ffi::Bind()
                                  .Ctx<Stream>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Ret<ffi::AnyBuffer>()
                                  .Attr<BinaryOp>("op"),
                              {ffi::Traits::kCmdBufferCompatible});

XLA_FFI_DEFINE_HANDLER_SYMBOL(Cuda_reduce, CudaHandler<ReduceImpl>::Call,
                              ffi::Ffi::Bind()
                                  .Ctx<Stream>()
                                  .Ctx<Scratch>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Ret<ffi::AnyBuffer>()
                                  .Attr<ReduceOp>("op")
                                  .Attr<int64_t>("axis"));

XLA_FFI_DEFINE_HANDLER_SYMBOL(Cuda_gemm, CudaHandler<GemmImpl>::Call,
                              ffi::Ffi::Bind()
                                  .Ctx<Stream>()
                                  .Ctx<Scratch>()
                                  .RemainingArgs()
                                  .Ret<ffi::AnyBuffer>()
                                  .Attr<Transpose>("trans_a")
                                  .Attr<Transpose>("trans_b")
                                  .Attr<double>("alpha")
                                  .Attr<double>("beta")
                                  .Attr<bool>("allow_tf32"));

XLA_FFI_DEFINE_HANDLER_SYMBOL(Cuda_conv2d, CudaHandler<Conv2dImpl>::Call,
                              ffi::Ffi::Bind()
                                  .Ctx<Stream>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Ret<ffi::AnyBuffer>()
                                  .Attr<int64_t>("stride_h")
                                  .Attr<int64_t>("stride_w")
                                  .Attr<int64_t>("pad_h")
                                  .Attr<int64_t>("pad_w"),
                              {ffi::Traits::kCmdBufferCompatible});

XLA_FFI_DEFINE_HANDLER_SYMBOL(Cuda_attention, CudaHandler<AttentionImpl>::Call,
                              ffi::Ffi::Bind()
                                  .Ctx<Stream>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Ret<ffi::AnyBuffer>()
                                  .Ret<ffi::AnyBuffer>()
                                  .Attr<double>("scale")
                                  .Attr<bool>("causal")
                                  .Attr<bool>("allow_tf32"),
                              {ffi::Traits::kCmdBufferCompatible});

// Not command-buffer compatible: it takes scratch memory, like reduce.
XLA_FFI_DEFINE_HANDLER_SYMBOL(Cuda_attention_backward, CudaHandler<AttentionBackwardImpl>::Call,
                              ffi::Ffi::Bind()
                                  .Ctx<Stream>()
                                  .Ctx<Scratch>()
                                  .Arg<ffi::AnyBuffer>()  // q
                                  .Arg<ffi::AnyBuffer>()  // k
                                  .Arg<ffi::AnyBuffer>()  // v
                                  .Arg<ffi::AnyBuffer>()  // out
                                  .Arg<ffi::AnyBuffer>()  // lse
                                  .Arg<ffi::AnyBuffer>()  // dout
                                  .Ret<ffi::AnyBuffer>()  // dq
                                  .Ret<ffi::AnyBuffer>()  // dk
                                  .Ret<ffi::AnyBuffer>()  // dv
                                  .Attr<double>("scale")
                                  .Attr<bool>("causal"));

XLA_FFI_DEFINE_HANDLER_SYMBOL(Cuda_attention_jvp, CudaHandler<AttentionJvpImpl>::Call,
                              ffi::Ffi::Bind()
                                  .Ctx<Stream>()
                                  .Arg<ffi::AnyBuffer>()  // q
                                  .Arg<ffi::AnyBuffer>()  // k
                                  .Arg<ffi::AnyBuffer>()  // v
                                  .Arg<ffi::AnyBuffer>()  // out
                                  .Arg<ffi::AnyBuffer>()  // lse
                                  .Arg<ffi::AnyBuffer>()  // dq
                                  .Arg<ffi::AnyBuffer>()  // dk
                                  .Arg<ffi::AnyBuffer>()  // dv
                                  .Ret<ffi::AnyBuffer>()  // dout
                                  .Attr<double>("scale")
                                  .Attr<bool>("causal"),
                              {ffi::Traits::kCmdBufferCompatible});

// ---------------------------------------------------------------- backward passes

namespace {

ffi::Error UnaryGradImpl(cudaStream_t stream, ffi::AnyBuffer x, ffi::AnyBuffer t,
                         ffi::Result<ffi::AnyBuffer> out, UnaryOp op) {
  int64_t n;
  if (auto err = check_unary_grad(x, t, *out, op, n); err.failure()) return err;
  return dispatch_float(x.element_type(), [&](auto tag) {
    using T = decltype(tag);
    return launched(cuda::unary_grad(stream, op, typed<T>(x), typed<T>(t), typed<T>(out), n),
                    "unary_grad");
  });
}

ffi::Error BinaryPartialImpl(cudaStream_t stream, ffi::AnyBuffer a, ffi::AnyBuffer b,
                             ffi::Result<ffi::AnyBuffer> out, BinaryOp op) {
  BroadcastShape shape;
  if (auto err = check_binary_partial(a, b, *out, op, shape); err.failure()) return err;
  return dispatch_float(a.element_type(), [&](auto tag) {
    using T = decltype(tag);
    return launched(
        cuda::binary_partial(stream, op, shape, typed<T>(a), typed<T>(b), typed<T>(out)),
        "binary_partial");
  });
}

ffi::Error Conv2dBackwardDataImpl(cudaStream_t stream, Scratch scratch,
                                  ffi::AnyBuffer dy, ffi::AnyBuffer w,
                                  ffi::Result<ffi::AnyBuffer> dx, int64_t stride_h,
                                  int64_t stride_w, int64_t pad_h, int64_t pad_w,
                                  int64_t input_h, int64_t input_w) {
  ConvShape shape;
  if (auto err = check_conv2d_backward_data(dy, w, *dx, stride_h, stride_w, pad_h, pad_w,
                                            input_h, input_w, shape);
      err.failure())
    return err;
  const size_t bytes =
      cuda::conv2d_backward_data_workspace_bytes(shape, ffi::ByteWidth(dy.element_type()));
  void* workspace;
  if (auto err = scratch_workspace(scratch, bytes, "conv2d data gradient", workspace);
      err.failure())
    return err;
  return dispatch_float(dy.element_type(), [&](auto tag) {
    using T = decltype(tag);
    return launched(cuda::conv2d_backward_data(stream, shape, typed<T>(dy), typed<T>(w),
                                               typed<T>(dx), workspace),
                    "conv2d_backward_data");
  });
}

ffi::Error Conv2dBackwardFilterImpl(cudaStream_t stream, Scratch scratch,
                                    ffi::AnyBuffer x, ffi::AnyBuffer dy,
                                    ffi::Result<ffi::AnyBuffer> dw, int64_t stride_h,
                                    int64_t stride_w, int64_t pad_h, int64_t pad_w,
                                    int64_t filter_h, int64_t filter_w) {
  ConvShape shape;
  if (auto err = check_conv2d_backward_filter(x, dy, *dw, stride_h, stride_w, pad_h, pad_w,
                                              filter_h, filter_w, shape);
      err.failure())
    return err;
  const size_t bytes =
      cuda::conv2d_backward_filter_workspace_bytes(shape, ffi::ByteWidth(x.element_type()));
  void* workspace;
  if (auto err = scratch_workspace(scratch, bytes, "conv2d filter gradient", workspace);
      err.failure())
    return err;
  return dispatch_float(x.element_type(), [&](auto tag) {
    using T = decltype(tag);
    return launched(cuda::conv2d_backward_filter(stream, shape, typed<T>(x), typed<T>(dy),
                                                 typed<T>(dw), workspace),
                    "conv2d_backward_filter");
  });
}

}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(Cuda_unary_grad, CudaHandler<UnaryGradImpl>::Call,
                              ffi::Ffi::Bind()
                                  .Ctx<Stream>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Ret<ffi::AnyBuffer>()
                                  .Attr<UnaryOp>("op"),
                              {ffi::Traits::kCmdBufferCompatible});

XLA_FFI_DEFINE_HANDLER_SYMBOL(Cuda_binary_partial, CudaHandler<BinaryPartialImpl>::Call,
                              ffi::Ffi::Bind()
                                  .Ctx<Stream>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Ret<ffi::AnyBuffer>()
                                  .Attr<BinaryOp>("op"),
                              {ffi::Traits::kCmdBufferCompatible});

// Not command-buffer compatible: it may take scratch memory (as reduce).
XLA_FFI_DEFINE_HANDLER_SYMBOL(Cuda_conv2d_backward_data, CudaHandler<Conv2dBackwardDataImpl>::Call,
                              ffi::Ffi::Bind()
                                  .Ctx<Stream>()
                                  .Ctx<Scratch>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Ret<ffi::AnyBuffer>()
                                  .Attr<int64_t>("stride_h")
                                  .Attr<int64_t>("stride_w")
                                  .Attr<int64_t>("pad_h")
                                  .Attr<int64_t>("pad_w")
                                  .Attr<int64_t>("input_h")
                                  .Attr<int64_t>("input_w"));

// Not command-buffer compatible: it may take scratch memory (as reduce).
XLA_FFI_DEFINE_HANDLER_SYMBOL(Cuda_conv2d_backward_filter, CudaHandler<Conv2dBackwardFilterImpl>::Call,
                              ffi::Ffi::Bind()
                                  .Ctx<Stream>()
                                  .Ctx<Scratch>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Ret<ffi::AnyBuffer>()
                                  .Attr<int64_t>("stride_h")
                                  .Attr<int64_t>("stride_w")
                                  .Attr<int64_t>("pad_h")
                                  .Attr<int64_t>("pad_w")
                                  .Attr<int64_t>("filter_h")
                                  .Attr<int64_t>("filter_w"));

}  // namespace oxijax::bindings
