// conv2d's backward passes. With stride 1 (and padding smaller than the filter), the
// data gradient is the forward conv2d of dy with the filter flipped in space and its
// channel axes swapped (kept in the workspace), padded by R - 1 - pad: the forward's
// implicit GEMM, tensor cores included. Otherwise, as implicit GEMMs (no im2col buffer):
// each block computes a tile of a per-group GEMM whose operands are gathered from the
// tensors as the tiles are loaded, accumulating in Acc<T>: on tensor cores for float16 /
// bfloat16 (igemm_tc_kernel, mma.sync, gathers along each operand's contiguous index so
// that they coalesce), SIMT FMAs for float32 / float64 (igemm_kernel).
//  - data:   one GEMM per stride phase (input rows h = first + stride * i, columns
//            alike): only the taps r = tap0 + stride * j reach those rows, from the output
//            rows p = base + i - j, so the stride gaps' structural zeros are never
//            multiplied: dx (N*Hph*Wph x C) = dy-gather (N*Hph*Wph x K*Th*Tw) @ w-gather;
//  - filter: dw (K x C*R*S) = dy (K x N*P*Q) @ x-gather (N*P*Q x C*R*S). Its reduction
//            is long and the output small, so it is split over blocks (blockIdx.z) into
//            Acc<T> partial sums in the workspace, added in a second kernel.
// Launchers only enqueue; they return the first failing launch's status, else
// cudaSuccess. A grid dimension that would pass its limit (2^31 - 1 for x, 65535 for y
// and z) is split over several launches, as the forward does.
#include <cuda_runtime.h>

#include <algorithm>
#include <climits>
#include <cstdint>
#include <type_traits>

#include "convert.h"
#include "divider.h"
#include "kernels.h"
#include "launch.h"
#include "ptx.h"

namespace oxijax::cuda {
namespace {

constexpr int kBM = 64, kBN = 64, kBK = 16;
constexpr int kThreads = 256;  // 16 x 16 threads, 4 x 4 outputs each
constexpr int kTM = 4, kTN = 4;

// One backward problem: GEMM sizes per group and the gathers of its operands.
// kAAlongK / kBAlongK: whether consecutive depth indices kk of operand A / B read
// neighbouring addresses (else consecutive rows / columns do); the tensor-core kernel
// gathers along that index so that a warp's loads coalesce.

// One stride phase of the data gradient along one spatial axis: the input rows h = first +
// stride * i (i < count) are reached only by the taps r = tap0 + stride * j (j < taps),
// from the output rows p = base + i - j. Every other (h, r) pair meets a stride gap.
struct Phase {
  int64_t first, count, tap0, taps, base;
};

// The phase of input rows h with h % stride == first (size: H; filter R; output P).
inline Phase make_phase(int64_t first, int64_t size, int64_t filter, int64_t stride,
                        int64_t pad) {
  Phase ph;
  ph.first = first;
  ph.count = first < size ? (size - first + stride - 1) / stride : 0;
  ph.tap0 = (first + pad) % stride;
  ph.taps = ph.tap0 < filter ? (filter - ph.tap0 + stride - 1) / stride : 0;
  ph.base = (first + pad - ph.tap0) / stride;
  return ph;
}

// The data gradient of the input pixels of one (row, column) stride phase:
// dx (N*Hph*Wph x C) = dy-gather (N*Hph*Wph x K*Th*Tw) @ w (K*Th*Tw x C) over the phase's
// taps only, so no multiply-add lands on a stride gap.
template <typename T>
struct DataProblem {
  static constexpr bool kAAlongK = false, kBAlongK = true;
  const T* dy;
  const T* w;
  ConvShape s;
  Phase ph, pw;
  // Dividers of the row index (phase pixels: Hph*Wph, then Wph) and of the depth index
  // (taps: Th*Tw, then Tw), so that no gathered element costs a 64-bit division.
  Divider<uint64_t> by_pixels, by_cols, by_taps, by_col_taps;

  static DataProblem make(const T* dy, const T* w, const ConvShape& s, Phase ph, Phase pw) {
    return {dy, w, s, ph, pw, divider_of(ph.count * pw.count), divider_of(pw.count),
            divider_of(ph.taps * pw.taps), divider_of(pw.taps)};
  }
  __device__ int64_t m() const { return s.n * ph.count * pw.count; }
  __device__ int64_t n() const { return s.c; }
  __device__ int64_t depth() const { return s.k * ph.taps * pw.taps; }
  // A[row, kk]: dy at the output (p, q) whose tap (r, t) reads the phase's pixel `row`.
  __device__ Acc<T> a(int64_t g, int64_t row, int64_t kk) const {
    const auto [img, pix] = divmod(by_pixels, row);
    const auto [k, tap] = divmod(by_taps, kk);
    const auto [pix_row, pix_col] = divmod(by_cols, pix);
    const auto [tap_row, tap_col] = divmod(by_col_taps, tap);
    const int64_t p = ph.base + pix_row - tap_row, q = pw.base + pix_col - tap_col;
    if (p < 0 || p >= s.p || q < 0 || q >= s.q) return Acc<T>(0);
    return to_acc(dy[(((g * s.n + img) * s.k + k) * s.p + p) * s.q + q]);
  }
  __device__ Acc<T> b(int64_t g, int64_t kk, int64_t c) const {
    const auto [k, tap] = divmod(by_taps, kk);
    const auto [tap_row, tap_col] = divmod(by_col_taps, tap);
    const int64_t r = ph.tap0 + s.stride_h * tap_row, t = pw.tap0 + s.stride_w * tap_col;
    return to_acc(w[((g * s.k + k) * s.c + c) * s.r * s.s + r * s.s + t]);
  }
  __device__ int64_t out_index(int64_t g, int64_t row, int64_t c) const {
    const auto [img, pix] = divmod(by_pixels, row);
    const auto [pix_row, pix_col] = divmod(by_cols, pix);
    const int64_t h = ph.first + s.stride_h * pix_row, x = pw.first + s.stride_w * pix_col;
    return ((g * s.n + img) * s.c + c) * s.h * s.w + h * s.w + x;
  }
};

template <typename T>
struct FilterProblem {
  static constexpr bool kAAlongK = true, kBAlongK = true;
  const T* x;
  const T* dy;
  ConvShape s;
  // Dividers of the depth index (output pixels: P*Q, then Q) and of the column index
  // (taps: R*S, then S), so that no gathered element costs a 64-bit division.
  Divider<uint64_t> by_pixels, by_q, by_taps, by_s;

  static FilterProblem make(const T* x, const T* dy, const ConvShape& s) {
    return {x, dy, s, divider_of(s.p * s.q), divider_of(s.q), divider_of(s.r * s.s),
            divider_of(s.s)};
  }
  __device__ int64_t m() const { return s.k; }
  __device__ int64_t n() const { return s.c * s.r * s.s; }
  __device__ int64_t depth() const { return s.n * s.p * s.q; }
  __device__ Acc<T> a(int64_t g, int64_t k, int64_t j) const {
    const auto [img, pix] = divmod(by_pixels, j);
    return to_acc(dy[((g * s.n + img) * s.k + k) * s.p * s.q + pix]);
  }
  // B[j, col]: the input pixel that output j's window tap (r, t) of channel c reads.
  __device__ Acc<T> b(int64_t g, int64_t j, int64_t col) const {
    const auto [img, pix] = divmod(by_pixels, j);
    const auto [p, q] = divmod(by_q, pix);
    const auto [c, tap] = divmod(by_taps, col);
    const auto [tap_row, tap_col] = divmod(by_s, tap);
    const int64_t h = p * s.stride_h - s.pad_h + tap_row, w = q * s.stride_w - s.pad_w + tap_col;
    if (h < 0 || h >= s.h || w < 0 || w >= s.w) return Acc<T>(0);
    return to_acc(x[((g * s.n + img) * s.c + c) * s.h * s.w + h * s.w + w]);
  }
  __device__ int64_t out_index(int64_t g, int64_t k, int64_t col) const {
    return (g * s.k + k) * s.c * s.r * s.s + col;
  }
};

// The first block of a launch in each dimension of the whole grid.
struct GridOrigin {
  int64_t x, y, z;
};

// Whole grid: (n tiles, m tiles, groups * splits), from `origin` on in this launch. Split
// z of a group reduces depth slice [z * chunk, (z + 1) * chunk). With one split the
// result is stored in out; otherwise partial sums go to partial[split][out_index].
template <typename T, typename Problem>
__global__ void __launch_bounds__(kThreads)
    igemm_kernel(Problem pr, int64_t splits, int64_t chunk, T* out, Acc<T>* partial,
                 int64_t out_size, GridOrigin origin) {
  using A = Acc<T>;
  OXIJAX_SHARED(A, as, [kBK][kBM], alignof(A));
  OXIJAX_SHARED(A, bs, [kBK][kBN], alignof(A));
  const int64_t z = origin.z + blockIdx.z;
  const int64_t g = z / splits, split = z % splits;
  const int64_t m0 = (origin.y + blockIdx.y) * kBM, n0 = (origin.x + blockIdx.x) * kBN;
  const int64_t m = pr.m(), n = pr.n(), depth = pr.depth();
  const int64_t k_begin = split * chunk, k_end = std::min(depth, k_begin + chunk);
  const int tx = threadIdx.x % 16, ty = threadIdx.x / 16;
  A acc[kTM][kTN] = {};
  for (int64_t k0 = k_begin; k0 < k_end; k0 += kBK) {
    // Each thread loads kBM * kBK / kThreads = 4 elements of each tile.
    for (int i = threadIdx.x; i < kBM * kBK; i += kThreads) {
      const int row = i % kBM, kk = i / kBM;
      const int64_t gm = m0 + row, gk = k0 + kk;
      as[kk][row] = (gm < m && gk < k_end) ? pr.a(g, gm, gk) : A(0);
      const int64_t gn = n0 + row;
      bs[kk][row] = (gn < n && gk < k_end) ? pr.b(g, gk, gn) : A(0);
    }
    __syncthreads();
#pragma unroll
    for (int kk = 0; kk < kBK; ++kk) {
      A av[kTM], bv[kTN];
#pragma unroll
      for (int i = 0; i < kTM; ++i) av[i] = as[kk][ty * kTM + i];
#pragma unroll
      for (int j = 0; j < kTN; ++j) bv[j] = bs[kk][tx * kTN + j];
#pragma unroll
      for (int i = 0; i < kTM; ++i)
#pragma unroll
        for (int j = 0; j < kTN; ++j) acc[i][j] += av[i] * bv[j];
    }
    __syncthreads();
  }
#pragma unroll
  for (int i = 0; i < kTM; ++i) {
    const int64_t gm = m0 + ty * kTM + i;
    if (gm >= m) continue;
#pragma unroll
    for (int j = 0; j < kTN; ++j) {
      const int64_t gn = n0 + tx * kTN + j;
      if (gn >= n) continue;
      const int64_t at = pr.out_index(g, gm, gn);
      if (splits == 1) out[at] = from_acc<T>(acc[i][j]);
      else partial[split * out_size + at] = acc[i][j];
    }
  }
}

// out[i] = sum over splits of partial[split][i].
template <typename T>
__global__ void sum_splits_kernel(const Acc<T>* partial, int64_t splits, int64_t size, T* out) {
  for (int64_t i = int64_t{blockIdx.x} * blockDim.x + threadIdx.x; i < size;
       i += int64_t{gridDim.x} * blockDim.x) {
    Acc<T> total = 0;
    for (int64_t sp = 0; sp < splits; ++sp) total += partial[sp * size + i];
    out[i] = from_acc<T>(total);
  }
}

// ------------------------------------------------------------------ tensor cores
// The same implicit GEMMs for float16 / bfloat16 on tensor cores: kTcBM x kTcBN x kTcBK
// block tiles, 4 warps of 32 x 32, mma.sync m16n8k16 with float32 accumulation. Both
// operands are gathered (kTcGather elements of each per thread and tile, along the
// problem's coalesced index) into registers while the previous tile computes, then stored
// to shared memory as [row][k] (A) and [column][k] (B) with a pitch of 40 elements: the
// 8 rows an ldmatrix reads fall in distinct 16-byte bank groups.
constexpr int kTcBM = 64, kTcBN = 64, kTcBK = 32, kTcThreads = 128;
constexpr int kTcPitch = kTcBK + 8;
constexpr int kTcGather = kTcBM * kTcBK / kTcThreads;  // 16

// Row or column (rc) and depth (kk) offsets of gathered element i of thread tid: along k
// (32 consecutive kk per row) or along the rows (64 consecutive rows per kk).
template <bool kAlongK>
__device__ __forceinline__ void gather_slot(int tid, int i, int& rc, int& kk) {
  const int e = tid + i * kTcThreads;
  if constexpr (kAlongK) {
    rc = e / kTcBK, kk = e % kTcBK;
  } else {
    rc = e % kTcBM, kk = e / kTcBM;
  }
}

template <bool kBf16, typename Problem>
__global__ void __launch_bounds__(kTcThreads)
    igemm_tc_kernel(Problem pr, int64_t splits, int64_t chunk,
                    std::conditional_t<kBf16, oxijax::bfloat16, oxijax::half>* out,
                    float* partial, int64_t out_size, GridOrigin origin) {
  using T = std::conditional_t<kBf16, oxijax::bfloat16, oxijax::half>;
  OXIJAX_SHARED(uint16_t, as, [kTcBM * kTcPitch], 16);
  OXIJAX_SHARED(uint16_t, bs, [kTcBN * kTcPitch], 16);
  const int64_t z = origin.z + blockIdx.z;
  const int64_t g = z / splits, split = z % splits;
  const int64_t m0 = (origin.y + blockIdx.y) * kTcBM, n0 = (origin.x + blockIdx.x) * kTcBN;
  const int64_t m = pr.m(), n = pr.n(), depth = pr.depth();
  const int64_t k_begin = split * chunk, k_end = std::min(depth, k_begin + chunk);
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int wm = warp >> 1, wn = warp & 1;  // the warp's 32 x 32 quarter of the tile

  uint16_t ra[kTcGather], rb[kTcGather];  // the next tile's gathered elements
  const auto gather = [&](int64_t k0) {
#pragma unroll
    for (int i = 0; i < kTcGather; ++i) {
      int rc, kk;
      gather_slot<Problem::kAAlongK>(tid, i, rc, kk);
      const bool in_a = m0 + rc < m && k0 + kk < k_end;
      ra[i] = in_a ? from_acc<T>(pr.a(g, m0 + rc, k0 + kk)).bits : uint16_t(0);
      gather_slot<Problem::kBAlongK>(tid, i, rc, kk);
      const bool in_b = n0 + rc < n && k0 + kk < k_end;
      rb[i] = in_b ? from_acc<T>(pr.b(g, k0 + kk, n0 + rc)).bits : uint16_t(0);
    }
  };
  const auto store = [&]() {
#pragma unroll
    for (int i = 0; i < kTcGather; ++i) {
      int rc, kk;
      gather_slot<Problem::kAAlongK>(tid, i, rc, kk);
      as[rc * kTcPitch + kk] = ra[i];
      gather_slot<Problem::kBAlongK>(tid, i, rc, kk);
      bs[rc * kTcPitch + kk] = rb[i];
    }
  };

  float acc[2][4][4] = {};
  const uint32_t a_base = ptx::shared_address(as), b_base = ptx::shared_address(bs);
  if (k_begin < k_end) gather(k_begin);
  for (int64_t k0 = k_begin; k0 < k_end; k0 += kTcBK) {
    __syncthreads();  // the previous tile's readers are done
    store();
    __syncthreads();
    if (k0 + kTcBK < k_end) gather(k0 + kTcBK);  // in flight while this tile computes
#pragma unroll
    for (int ks = 0; ks < kTcBK / 16; ++ks) {
      uint32_t a[2][4], b[2][4];
#pragma unroll
      for (int i = 0; i < 2; ++i) {
        const int row = wm * 32 + 16 * i + (lane & 15);
        ptx::ldmatrix_x4(a[i], a_base + 2u * uint32_t(row * kTcPitch + 16 * ks + 8 * (lane >> 4)));
      }
#pragma unroll
      for (int j = 0; j < 2; ++j) {
        const int col = wn * 32 + 16 * j + (lane & 7) + ((lane >> 4) << 3);
        ptx::ldmatrix_x4(b[j], b_base + 2u * uint32_t(col * kTcPitch + 16 * ks +
                                                      8 * ((lane >> 3) & 1)));
      }
#pragma unroll
      for (int i = 0; i < 2; ++i)
#pragma unroll
        for (int j = 0; j < 2; ++j) {
          ptx::mma_m16n8k16<kBf16>(acc[i][2 * j], a[i], {b[j][0], b[j][1]});
          ptx::mma_m16n8k16<kBf16>(acc[i][2 * j + 1], a[i], {b[j][2], b[j][3]});
        }
    }
  }
  // Rows g, g + 8 and columns 2t, 2t + 1 of each 16 x 8 accumulator.
  const int gq = lane >> 2, tq = lane & 3;
#pragma unroll
  for (int i = 0; i < 2; ++i)
#pragma unroll
    for (int j = 0; j < 4; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int64_t gm = m0 + wm * 32 + 16 * i + gq + 8 * (e >> 1);
        const int64_t gn = n0 + wn * 32 + 8 * j + 2 * tq + (e & 1);
        if (gm >= m || gn >= n) continue;
        const int64_t at = pr.out_index(g, gm, gn);
        if (splits == 1) out[at] = from_acc<T>(acc[i][j][e]);
        else partial[split * out_size + at] = acc[i][j][e];
      }
}

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// Splits of the filter gradient's reduction: enough blocks for two waves, each split at
// least 8 depth tiles long, at most 64 splits.
int64_t filter_splits(const ConvShape& s) {
  const int64_t tiles = ceil_div(s.k, kBM) * ceil_div(s.c * s.r * s.s, kBN) * s.groups;
  const int64_t depth_tiles = ceil_div(s.n * s.p * s.q, kBK);
  const int64_t want = ceil_div(2 * int64_t{sm_count()}, std::max<int64_t>(1, tiles));
  return std::clamp<int64_t>(std::min(want, depth_tiles / 8), 1, 64);
}

// The data gradient as a forward conv2d (see the top of the file).
bool data_as_forward(const ConvShape& s) {
  return s.stride_h == 1 && s.stride_w == 1 && s.pad_h < s.r && s.pad_w < s.s;
}

// flipped[g, c, k, R-1-r, S-1-t] = w[g, k, c, r, t], grid-stride.
template <typename T>
__global__ void flip_filter_kernel(const T* __restrict__ w, ConvShape s, T* __restrict__ flipped) {
  const int64_t rs = s.r * s.s, total = s.groups * s.c * s.k * rs;
  for (int64_t e = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; e < total;
       e += int64_t(gridDim.x) * blockDim.x) {
    const int64_t tap = e % rs, u = e / rs;  // u = (g, c, k) of the flipped filter
    const int64_t k = u % s.k, c = u / s.k % s.c, g = u / (s.k * s.c);
    flipped[e] = w[((g * s.k + k) * s.c + c) * rs + (rs - 1 - tap)];
  }
}

// The implicit-GEMM kernel for T (tensor cores for the half types) over (n tiles, m
// tiles, zs) blocks, in as many launches as the grid limits need (y and z: 65535, x:
// 2^31 - 1).
template <typename T, typename Problem>
cudaError_t launch_igemm(cudaStream_t stream, const Problem& pr, int64_t n, int64_t m,
                         int64_t zs, int64_t splits, int64_t chunk, T* out, Acc<T>* partial,
                         int64_t out_size) {
  constexpr bool kHalf = std::is_same_v<T, oxijax::half> || std::is_same_v<T, oxijax::bfloat16>;
  const int64_t n_tiles = ceil_div(n, kHalf ? kTcBN : kBN), m_tiles = ceil_div(m, kHalf ? kTcBM : kBM);
  constexpr int64_t kMaxX = INT_MAX, kMaxYZ = 65535;
  for (int64_t z0 = 0; z0 < zs; z0 += kMaxYZ)
    for (int64_t y0 = 0; y0 < m_tiles; y0 += kMaxYZ)
      for (int64_t x0 = 0; x0 < n_tiles; x0 += kMaxX) {
        const dim3 grid(unsigned(std::min(kMaxX, n_tiles - x0)),
                        unsigned(std::min(kMaxYZ, m_tiles - y0)),
                        unsigned(std::min(kMaxYZ, zs - z0)));
        const GridOrigin origin{x0, y0, z0};
        cudaError_t status;
        if constexpr (kHalf)
          status = launch(&igemm_tc_kernel<std::is_same_v<T, oxijax::bfloat16>, Problem>, grid,
                          kTcThreads, 0, stream, pr, splits, chunk, out, partial, out_size,
                          origin);
        else
          status = launch(&igemm_kernel<T, Problem>, grid, kThreads, 0, stream, pr, splits,
                          chunk, out, partial, out_size, origin);
        if (status != cudaSuccess) return status;
      }
  return cudaSuccess;
}

}  // namespace

size_t conv2d_backward_data_workspace_bytes(const ConvShape& s, size_t element_bytes) {
  if (!data_as_forward(s)) return 0;
  return size_t(s.groups * s.c * s.k * s.r * s.s) * element_bytes;
}

template <typename T>
cudaError_t conv2d_backward_data(cudaStream_t stream, const ConvShape& s, const T* dy,
                                 const T* w, T* dx, void* workspace) {
  const int64_t m = s.n * s.h * s.w;
  if (s.groups <= 0 || m <= 0 || s.c <= 0) return cudaSuccess;
  if (data_as_forward(s) && s.k > 0) {
    if (workspace == nullptr) return cudaErrorInvalidValue;
    T* flipped = static_cast<T*>(workspace);
    const int64_t total = s.groups * s.c * s.k * s.r * s.s;
    const unsigned blocks = unsigned(std::min<int64_t>(ceil_div(total, 256), 4 * sm_count()));
    if (const cudaError_t status = launch(&flip_filter_kernel<T>, blocks, 256, 0, stream, w, s,
                                          flipped);
        status != cudaSuccess)
      return status;
    ConvShape f = s;
    f.c = s.k, f.h = s.p, f.w = s.q, f.k = s.c, f.p = s.h, f.q = s.w;
    f.pad_h = s.r - 1 - s.pad_h, f.pad_w = s.s - 1 - s.pad_w;
    return conv2d<T>(stream, f, dy, flipped, dx);
  }
  // One implicit GEMM per (row, column) stride phase. A phase without taps (stride
  // above the filter) or filters (K = 0) has depth 0 and still runs: it stores zeros.
  for (int64_t fh = 0; fh < std::min(s.stride_h, s.h); ++fh)
    for (int64_t fw = 0; fw < std::min(s.stride_w, s.w); ++fw) {
      const auto pr =
          DataProblem<T>::make(dy, w, s, make_phase(fh, s.h, s.r, s.stride_h, s.pad_h),
                               make_phase(fw, s.w, s.s, s.stride_w, s.pad_w));
      const int64_t depth = s.k * pr.ph.taps * pr.pw.taps;
      if (const cudaError_t status =
              launch_igemm<T>(stream, pr, s.c, s.n * pr.ph.count * pr.pw.count, s.groups, 1,
                              std::max<int64_t>(depth, 1), dx, nullptr, 0);
          status != cudaSuccess)
        return status;
    }
  return cudaSuccess;
}

size_t conv2d_backward_filter_workspace_bytes(const ConvShape& s, size_t element_bytes) {
  const int64_t splits = filter_splits(s);
  if (splits == 1) return 0;
  const size_t acc_bytes = element_bytes == 8 ? 8 : 4;
  return size_t(splits) * size_t(s.groups * s.k * s.c * s.r * s.s) * acc_bytes;
}

template <typename T>
cudaError_t conv2d_backward_filter(cudaStream_t stream, const ConvShape& s, const T* x,
                                   const T* dy, T* dw, void* workspace) {
  const int64_t cols = s.c * s.r * s.s, out_size = s.groups * s.k * cols;
  if (out_size <= 0) return cudaSuccess;
  const int64_t splits = filter_splits(s), depth = s.n * s.p * s.q;
  if (splits > 1 && workspace == nullptr) return cudaErrorInvalidValue;
  const int64_t chunk = ceil_div(ceil_div(std::max<int64_t>(depth, 1), splits), kTcBK) * kTcBK;
  auto* partial = static_cast<Acc<T>*>(workspace);
  if (const cudaError_t status =
          launch_igemm<T>(stream, FilterProblem<T>::make(x, dy, s), cols, s.k, s.groups * splits,
                          splits, chunk, dw, partial, out_size);
      status != cudaSuccess || splits <= 1)
    return status;
  const unsigned blocks = unsigned(std::min<int64_t>(ceil_div(out_size, 256), 4 * sm_count()));
  return launch(&sum_splits_kernel<T>, blocks, 256, 0, stream, partial, splits, out_size, dw);
}

#define OXIJAX_INSTANTIATE(T)                                                                   \
  template cudaError_t conv2d_backward_data<T>(cudaStream_t, const ConvShape&, const T*,       \
                                               const T*, T*, void*);                           \
  template cudaError_t conv2d_backward_filter<T>(cudaStream_t, const ConvShape&, const T*,     \
                                                 const T*, T*, void*);
OXIJAX_INSTANTIATE(oxijax::half)
OXIJAX_INSTANTIATE(oxijax::bfloat16)
OXIJAX_INSTANTIATE(float)
OXIJAX_INSTANTIATE(double)
#undef OXIJAX_INSTANTIATE

}  // namespace oxijax::cuda
