// Shared-memory tiles of 16-bit elements for the attention tensor-core kernels
// (attention_kernels.cu, attention_backward_mma_kernels.cu): what they load, how they lay
// it out, and how ldmatrix turns it into mma.m16n8k16 fragments (ptx.h has the fragment
// layouts); and the limits and constants the attention kernels share.
//
// A tile is [rows][D]: D is the head dim padded to a multiple of 64, `dim` the real one.
// Padding columns and rows past the matrix are zero-filled, so they add nothing to any
// product. A dim that is a multiple of 8 is copied by cp.async, 16 bytes at a time; any
// other (rows not 16-byte aligned) element by element, synchronously. 16-byte chunk c of row r lives at chunk c ^ (r & 7) of that
// row: 8 consecutive rows of one chunk column fall in 8 different 16-byte bank groups,
// so cp.async stores and ldmatrix loads are bank-conflict free.
#pragma once

#include <climits>
#include <cstdint>
#include <initializer_list>

#include "launch.h"
#include "ptx.h"

namespace oxijax::cuda::mma_tile {

// The inputs of a tensor-core attention kernel: float16 or bfloat16 (mma m16n8k16), or
// float32 rounded to TF32 (mma m16n8k8, opt-in). A float32 tile is stored as a tile of
// twice as many 16-bit columns, so that everything below counts 16-bit units.
enum class MmaInput { kF16, kBF16, kTF32 };

// The padded head dims (in 16-bit units) the tensor-core attention kernels are built for.
inline constexpr int kMaxMmaDim = 256;

// Sequence lengths the attention kernels index in 32-bit arithmetic (row and key indices
// plus a tile); larger ones are refused (cudaErrorInvalidValue).
inline constexpr int64_t kMaxSeq = int64_t(INT_MAX) - 1024;
// Exponentials are 2^(x * log2(e)) (ex2.approx).
inline constexpr double kLog2e = 1.4426950408889634073599246810019;

// The padded head dim for `dim` 16-bit units (0 when no tensor-core kernel takes it).
inline int padded_dim(int64_t dim) {
  if (dim <= 0 || dim > kMaxMmaDim) return 0;
  return int((dim + 63) / 64 * 64);
}

// Whether a float16/bfloat16 attention call with this head_dim and these buffers runs on
// tensor cores: a padded dim exists, every pointer is 16-byte aligned (cp.async copies
// 16 bytes; XLA's buffers always are) and the GPU is sm_80 or newer. Returns a failed
// device query's status.
inline cudaError_t tensor_cores_take(int64_t dim, std::initializer_list<const void*> buffers,
                                     bool& take) {
  take = false;
  if (padded_dim(dim) == 0) return cudaSuccess;
  for (const void* p : buffers)
    if ((reinterpret_cast<uintptr_t>(p) & 15u) != 0) return cudaSuccess;
  int device = 0, major = 0;
  cudaError_t err = cudaGetDevice(&device);
  if (err == cudaSuccess)
    err = cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device);
  if (err != cudaSuccess) return runtime_error(err);
  take = major >= 8;
  return cudaSuccess;
}

// Element offset of 16-byte chunk `chunk` of row `row` in a [rows][D] tile.
template <int D> __device__ __forceinline__ int swz(int row, int chunk) {
  static_assert(D % 64 == 0, "the swizzle needs whole groups of 8 chunks per row");
  return row * D + ((chunk ^ (row & 7)) << 3);
}

// Copies rows row0..row0+kRows-1 of a [rows][dim] matrix into the [kRows][D] tile at
// shared address dst; rows at or past `rows` and columns at or past `dim` are zero.
// Visible to the block after cp_async_wait and a barrier.
template <int kRows, int D, int kThreads>
__device__ __forceinline__ void load(uint32_t dst, const uint16_t* __restrict__ src, int row0,
                                     int rows, int dim, int tid) {
  constexpr int kChunks = D / 8;
  static_assert(kRows * kChunks % kThreads == 0, "tile chunks per thread");
  const bool whole_chunks = dim % 8 == 0;
#pragma unroll
  for (int i = 0; i < kRows * kChunks / kThreads; ++i) {
    const int idx = tid + i * kThreads;
    const int r = idx / kChunks, c = idx % kChunks;
    const uint32_t to = dst + 2u * uint32_t(swz<D>(r, c));
    const bool row_ok = row0 + r < rows;
    const uint16_t* row = src + int64_t(row_ok ? row0 + r : 0) * dim;
    if (whole_chunks) {
      const bool ok = row_ok && 8 * c < dim;
      ptx::cp_async<16>(to, ok ? row + 8 * c : src, ok ? 16 : 0);
    } else {
      uint32_t w[4];
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const int e = 8 * c + 2 * j;
        const uint32_t lo = row_ok && e < dim ? uint32_t(row[e]) : 0u;
        const uint32_t hi = row_ok && e + 1 < dim ? uint32_t(row[e + 1]) : 0u;
        w[j] = lo | (hi << 16);
      }
      ptx::st_shared_v4(to, w[0], w[1], w[2], w[3]);
    }
  }
}

// The 32-bit word (row, col) of a float32 tile (in 16-bit units [rows][D]) at `tile`.
template <int D>
__device__ __forceinline__ uint32_t load_word(const unsigned char* tile, int row, int col) {
  return *reinterpret_cast<const uint32_t*>(tile + 2 * swz<D>(row, col >> 2) + 4 * (col & 3));
}

// Rounds fragment registers holding float32 values to TF32 (cvt.rna), as mma .tf32 expects.
template <int N> __device__ __forceinline__ void round_tf32(uint32_t (&r)[N]) {
#pragma unroll
  for (int i = 0; i < N; ++i) r[i] = ptx::cvt_rna_tf32(__uint_as_float(r[i]));
}

// The A fragment of rows row0..row0+15, columns 16kk..16kk+15 of a row-major tile (for
// float32 data: rows row0.., float columns 8kk..8kk+7, the m16n8k8 .tf32 A layout).
template <int D>
__device__ __forceinline__ void load_a(uint32_t (&a)[4], uint32_t tile, int row0, int kk,
                                       int lane) {
  ptx::ldmatrix_x4(a, tile + 2u * uint32_t(swz<D>(row0 + (lane & 15), 2 * kk + (lane >> 4))));
}

// B fragments of two n8 tiles, k = 16kk..16kk+15, n = n0..n0+15, from a tile stored as
// [n][k] (B's columns are the tile's rows, as K in Q.K^T): b[0], b[1] for n0..n0+7,
// b[2], b[3] for n0+8..n0+15.
template <int D>
__device__ __forceinline__ void load_b_rows(uint32_t (&b)[4], uint32_t tile, int n0, int kk,
                                            int lane) {
  const int row = n0 + (lane & 7) + ((lane >> 4) << 3);
  ptx::ldmatrix_x4(b, tile + 2u * uint32_t(swz<D>(row, 2 * kk + ((lane >> 3) & 1))));
}

// B fragments of two n8 tiles, k = k0..k0+15, n = 16nb..16nb+15, from a tile stored as
// [k][n] (as V in P.V): same register order as load_b_rows.
template <int D>
__device__ __forceinline__ void load_b_cols(uint32_t (&b)[4], uint32_t tile, int k0, int nb,
                                            int lane) {
  const int row = k0 + (lane & 7) + (((lane >> 3) & 1) << 3);
  ptx::ldmatrix_x4_trans(b, tile + 2u * uint32_t(swz<D>(row, 2 * nb + (lane >> 4))));
}

// The A fragment (16 rows x 16 k) made of two float32 accumulator tiles: c0 holds
// columns 0..7, c1 columns 8..15, rounded to nearest even into the input type.
template <bool kBf16>
__device__ __forceinline__ void a_from_acc(uint32_t (&a)[4], const float (&c0)[4],
                                           const float (&c1)[4]) {
  a[0] = ptx::cvt_rn_pack<kBf16>(c0[0], c0[1]);
  a[1] = ptx::cvt_rn_pack<kBf16>(c0[2], c0[3]);
  a[2] = ptx::cvt_rn_pack<kBf16>(c1[0], c1[1]);
  a[3] = ptx::cvt_rn_pack<kBf16>(c1[2], c1[3]);
}

// acc0, acc1 += a * (the two n8 tiles of b): one k-step of 16 16-bit units, m16n8k16 or,
// for TF32 (operands already rounded), m16n8k8.
template <MmaInput kIn>
__device__ __forceinline__ void mma_pair(float (&acc0)[4], float (&acc1)[4],
                                         const uint32_t (&a)[4], const uint32_t (&b)[4]) {
  if constexpr (kIn == MmaInput::kTF32) {
    ptx::mma_m16n8k8_tf32(acc0, a, {b[0], b[1]});
    ptx::mma_m16n8k8_tf32(acc1, a, {b[2], b[3]});
  } else {
    ptx::mma_m16n8k16<kIn == MmaInput::kBF16>(acc0, a, {b[0], b[1]});
    ptx::mma_m16n8k16<kIn == MmaInput::kBF16>(acc1, a, {b[2], b[3]});
  }
}

}  // namespace oxijax::cuda::mma_tile
