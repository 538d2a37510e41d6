// gemm on CUDA: out = alpha * op(a) @ op(b) + beta * c for every batch index.
//
// Kernels (one tile configuration per dtype path):
//  - float16 / bfloat16: tensor cores, mma.sync m16n8k16 (fp32 accumulation);
//  - float32 with allow_tf32: tensor cores, mma.sync m16n8k8 .tf32 (inputs rounded
//    with cvt.rna.tf32.f32, fp32 accumulation);
//  - float64: FP64 tensor cores, mma.sync m8n8k4 .f64;
//  - float32 (default, exact): SIMT register-tiled kernel, 128x128x8 block tile,
//    8x8 outputs per thread, shared-memory double buffering staged through registers.
// All need sm_80+ except the SIMT kernel.
//
// The tensor-core kernels share one template (mma_gemm_kernel): a block computes a BM x BN
// output tile; shared memory holds STAGES k-slices of BK elements (64 bytes), filled
// with cp.async. Each operand's slice keeps its global layout ("K-major" when k is the
// contiguous dim: a not transposed, b transposed; "MN-major" otherwise), so the global
// -> shared copy is a plain 2-D tile copy of 16-byte chunks in every case, and the
// fragment loads adapt instead (ldmatrix / ldmatrix.trans for 16-bit types, ldmatrix
// or 32/64-bit shared loads otherwise). Chunks are XOR-swizzled within their row so
// that both the copies and the fragment loads are free of bank conflicts. Edges
// (any m, n, k) are zero-filled by cp.async's src-size operand (0 for a copy outside
// the matrix).
//
// Global -> shared copies use the widest width (16, 8 or 4 bytes) that every chunk of
// an operand is aligned to (base pointer, leading dimension and batch strides); 16-bit
// operands with odd leading dimensions fall back to synchronous element loads. Since
// the leading dim is the stored row length, a copy of that width is then either
// wholly inside or wholly outside the matrix.
//
// Batch: blockIdx.x enumerates the output tiles (grouped along m for L2 reuse),
// blockIdx.y (and a loop, for > 65535 matrices) the batch items; per-operand batch
// offsets come from up to kMaxBatchRank merged batch dims (BatchIndex); the host
// loops over any dims beyond those, one launch per outer index. All offsets are 64-bit.
//
// Split-K: when the output tiles of all batch items cannot give every SM a block and k
// is long (a weight gradient: m = n = 512, k = 2^20 has 16 tiles for 132 SMs), blockIdx.z
// cuts k into ranges of whole k-slices; each block writes its raw sums to a float32
// (float64) workspace and split_sum_kernel adds the splits in a fixed order and applies
// alpha, beta and c: deterministic. See plan_split.
//
// Residency: the f16/bf16/f64 and SIMT kernels are register-capped at 128 so that two
// 256-thread blocks fit an SM (48 KB static shared memory each for the tensor-core
// kernels, 16.5 KB for SIMT); tf32 runs one block per SM. No kernel spills registers
// in its main loop (a few bytes spill outside it in some instantiations).
#include <cuda_runtime.h>

#include <algorithm>
#include <climits>
#include <cstdint>
#include <type_traits>
#include <vector>

#include "kernels.h"
#include "launch.h"
#include "ptx.h"

namespace oxijax::cuda {
namespace {

// ---------------------------------------------------------------------------------
// Parameters
// ---------------------------------------------------------------------------------

constexpr int kMaxBatchRank = 6;

// The batch dims after dropping size-1 dims and merging neighbours whose strides
// chain (for both operands); dim rank-1 is the innermost.
struct BatchIndex {
  int rank;
  int64_t dims[kMaxBatchRank];
  int64_t a_stride[kMaxBatchRank];
  int64_t b_stride[kMaxBatchRank];
};

// Copy widths of the global -> shared path: cp.async of 16, 8 or 4 bytes, or
// kCopySync (2-byte elements read one by one, stored synchronously).
constexpr int kCopySync = 2;

template <typename T>
struct Params {
  const T* a;
  const T* b;
  const T* c;  // read only when beta != 0
  T* out;
  int64_t m, n, k;
  int64_t lda, ldb;  // leading dims of a and b as stored
  int64_t ldc;       // row stride of out and c
  int64_t out_stride;  // elements between consecutive out (and c) matrices
  int64_t batch;
  int64_t tiles_m, tiles_n;  // tiles_m * tiles_n <= INT_MAX (gridDim.x)
  int64_t k_split;    // k per split (gridDim.z splits, a multiple of the slice k)
  Acc<T>* partial;    // split-K: [split][batch][m][n] raw sums; nullptr without splits
  Acc<T> alpha, beta;
  int a_copy, b_copy;  // copy width of each operand (bytes, see kCopySync)
  bool out_vec;        // out (and c) may be accessed in aligned vectors in the epilogue
  BatchIndex bi;
};

template <typename I>
__device__ __forceinline__ I imin(I x, I y) { return x < y ? x : y; }

__device__ __forceinline__ void batch_offsets(const BatchIndex& bi, int64_t item,
                                              int64_t& a_off, int64_t& b_off) {
  a_off = 0;
  b_off = 0;
#pragma unroll
  for (int d = kMaxBatchRank - 1; d >= 0; --d) {
    if (d < bi.rank) {
      const int64_t size = bi.dims[d];
      const int64_t q = item / size;
      const int64_t i = item - q * size;
      a_off += i * bi.a_stride[d];
      b_off += i * bi.b_stride[d];
      item = q;
    }
  }
}

// blockIdx.x -> (tile row, tile col), in groups of kGroup tile rows so that blocks
// running together share panels of a and b in L2. A bijection onto the tile grid.
__device__ __forceinline__ void tile_coords(int64_t tiles_m, int64_t tiles_n, int64_t& tm,
                                            int64_t& tn) {
  constexpr int64_t kGroup = 8;
  const int64_t pid = blockIdx.x;
  const int64_t per_group = kGroup * tiles_n;
  const int64_t group = pid / per_group;
  const int64_t first_m = group * kGroup;
  const int64_t rows = imin<int64_t>(tiles_m - first_m, kGroup);
  const int64_t r = pid - group * per_group;  // < rows * tiles_n
  tm = first_m + r % rows;
  tn = r / rows;
}

// ---------------------------------------------------------------------------------
// Epilogue: out = alpha * acc + beta * c, rounded once to T.
// ---------------------------------------------------------------------------------

// c is read (c[off]) only when beta != 0.
template <typename T>
__device__ __forceinline__ T finish(const Params<T>& p, Acc<T> acc, const T* c, int64_t off) {
  Acc<T> v = p.alpha * acc;
  if (p.beta != Acc<T>(0)) v = fma(p.beta, load(c[off]), v);
  return store<T>(v);
}

template <typename T>
struct alignas(2 * sizeof(T)) Pair {
  T x, y;
};

// Two horizontally adjacent results at element offset off (and off + 1 when `both`).
template <typename T>
__device__ __forceinline__ void store_pair(const Params<T>& p, int64_t off, bool both, Acc<T> v0,
                                           Acc<T> v1) {
  if (p.out_vec && both) {  // off is even: so are ldc, out_stride, n0 and the column
    Pair<T> cv{};
    if (p.beta != Acc<T>(0)) cv = *reinterpret_cast<const Pair<T>*>(p.c + off);
    Pair<T> r;
    r.x = finish(p, v0, &cv.x, 0);
    r.y = finish(p, v1, &cv.y, 0);
    *reinterpret_cast<Pair<T>*>(p.out + off) = r;
    return;
  }
  p.out[off] = finish(p, v0, p.c, off);
  if (both) p.out[off + 1] = finish(p, v1, p.c, off + 1);
}

// Split-K: the raw sums of row r, columns col (and col + 1 when `both`) of this split.
template <typename T>
__device__ __forceinline__ void store_partial(const Params<T>& p, int64_t item, int64_t r,
                                              int64_t col, bool both, Acc<T> v0, Acc<T> v1) {
  Acc<T>* dst = p.partial + ((int64_t(blockIdx.z) * p.batch + item) * p.m + r) * p.n + col;
  dst[0] = v0;
  if (both) dst[1] = v1;
}

enum class Kind { kF16, kBF16, kTF32, kF64 };

// ---------------------------------------------------------------------------------
// Tensor-core kernel configurations. Every configuration has BK * sizeof(T) == 64
// bytes: a K-major row of a slice is 4 chunks of 16 bytes, and one MMA k-step spans
// 32 bytes = 2 chunks.
// ---------------------------------------------------------------------------------

template <Kind K>
struct MmaConfig;

// kMinBlocks: resident blocks per SM the register allocation must allow (2 caps it at
// 128 registers a thread). The tf32 kernel's scalar fragment loads of MN-major slices
// need more than that without spilling in the main loop, so it runs one block per SM.
template <typename T, Kind K>
struct Mma16x8Config {  // float16, bfloat16 (m16n8k16) and tf32 (m16n8k8)
  using Elem = T;
  static constexpr Kind kKind = K;
  static constexpr int BM = 128, BN = 128, BK = 64 / int(sizeof(T));
  static constexpr int WARPS_M = 2, WARPS_N = 4, STAGES = 3;
  static constexpr int MMA_M = 16, MMA_N = 8, MMA_K = BK / 2;
  static constexpr int kMinBlocks = K == Kind::kTF32 ? 1 : 2;
};
template <>
struct MmaConfig<Kind::kF16> : Mma16x8Config<half, Kind::kF16> {};
template <>
struct MmaConfig<Kind::kBF16> : Mma16x8Config<bfloat16, Kind::kBF16> {};
template <>
struct MmaConfig<Kind::kTF32> : Mma16x8Config<float, Kind::kTF32> {};
template <>
struct MmaConfig<Kind::kF64> {  // m8n8k4
  using Elem = double;
  static constexpr Kind kKind = Kind::kF64;
  static constexpr int BM = 128, BN = 64, BK = 8;
  static constexpr int WARPS_M = 4, WARPS_N = 2, STAGES = 4;
  static constexpr int MMA_M = 8, MMA_N = 8, MMA_K = 4;
  static constexpr int kMinBlocks = 2;
};

// Chunk index of logical chunk `ch` of row `r` in a slice with kRowChunks chunks per
// row. The XOR stays inside the row (K-major rows have 4 chunks, MN-major rows a
// multiple of 8). Conflict-free accesses (16-byte units of a 128-byte bank sweep):
//  - K-major, ldmatrix (16/32-bit types): 8 rows r0..r0+7 (r0 % 8 == 0), one chunk:
//    unit = 4 * (r & 1) + (ch ^ ((r >> 1) & 3)) takes 8 distinct values.
//  - K-major, 64-bit loads: per half-warp 4 rows r0..r0+3 (r0 % 4 == 0), chunks
//    {2s, 2s+1}: unit = 4 * (r & 1) + (ch ^ (2 * ((r >> 1) & 1))), 8 distinct values.
//  - MN-major (row length a multiple of 128 bytes): the XOR is a bijection of r & 7
//    (ldmatrix.trans, 8 rows r0..r0+7), and 2 * (r & 3) separates the 4 rows
//    r0..r0+3 of the 32/64-bit fragment loads, which touch chunk pairs {2j, 2j+1}.
//  - cp.async writes: 8 consecutive threads write 2 rows x 4 chunks (K-major, the
//    same XOR for both rows) or 8 consecutive chunks of a row: distinct units.
template <int kRowChunks, bool kKMajor, bool k64Bit>
__device__ __forceinline__ int chunk_index(int r, int ch) {
  static_assert(kKMajor ? kRowChunks == 4 : kRowChunks % 8 == 0, "slice geometry");
  int x;
  if constexpr (kKMajor) {
    x = k64Bit ? ((r >> 1) & 1) << 1 : (r >> 1) & 3;
  } else {
    x = ((r & 3) << 1) | ((r >> 2) & 1);
  }
  return r * kRowChunks + (ch ^ x);
}

// One 16-byte chunk with copies narrower than 16 bytes: `bytes` (0..16) valid bytes at
// src, the rest zero-filled. width is 8 or 4 (cp.async, at least the element size) or
// kCopySync (2-byte elements, synchronous). Out of line: it keeps the register
// allocation of the kernels' main loops to the 16-byte path.
template <int kE>
__device__ __noinline__ void copy_chunk_narrow(uint32_t dst, const char* src, int bytes,
                                               int width) {
  if (width == 8) {
#pragma unroll
    for (int j = 0; j < 2; ++j) {
      const int b = bytes - 8 * j >= 8 ? 8 : (bytes - 8 * j > 0 ? bytes - 8 * j : 0);
      ptx::cp_async<8>(dst + 8 * j, b > 0 ? src + 8 * j : src, b);
    }
  } else if constexpr (kE <= 4) {
    if (width == 4) {
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const int b = bytes - 4 * j >= 4 ? 4 : (bytes - 4 * j > 0 ? bytes - 4 * j : 0);
        ptx::cp_async<4>(dst + 4 * j, b > 0 ? src + 4 * j : src, b);
      }
    } else if constexpr (kE == 2) {  // kCopySync: 2-byte aligned elements
      const int n = bytes / 2;
      const unsigned short* e = reinterpret_cast<const unsigned short*>(src);
      uint32_t w[4];
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const uint32_t lo = 2 * j < n ? uint32_t(__ldg(e + 2 * j)) : 0u;
        const uint32_t hi = 2 * j + 1 < n ? uint32_t(__ldg(e + 2 * j + 1)) : 0u;
        w[j] = lo | (hi << 16);
      }
      ptx::st_shared_v4(dst, w[0], w[1], w[2], w[3]);
    }
  }
}

// The global -> shared copies of one operand. A slice is kRows x kRowChunks chunks of
// 16 bytes; thread tid copies chunks idx = tid + i * kThreads (i < kIters), i.e. row
// r0 + i * kRowStep, chunk ch of its row (the same ch for every i, as kThreads is a
// multiple of kRowChunks). The stored matrix is rows x cols with leading dim ld; in a
// K-major slice the rows are m (or n) and the columns k, in an MN-major slice the
// rows are k. Everything that does not change along k is computed once per matrix;
// next() moves to the following k-slice.
template <typename T, int kThreads, int kRows, int kRowChunks, bool kKMajor>
struct SliceLoader {
  static constexpr int kE = int(sizeof(T));
  static constexpr int kPer = 16 / kE;  // elements per chunk
  static constexpr int kIters = kRows * kRowChunks / kThreads;
  static constexpr int kRowStep = kThreads / kRowChunks;
  static constexpr int kSliceK = kKMajor ? kRowChunks * kPer : kRows;  // k per slice
  static_assert(kThreads % kRowChunks == 0 && kIters * kThreads == kRows * kRowChunks,
                "chunk assignment");

  uintptr_t addr;  // the thread's first chunk in the current slice (read only where
                   // inside the matrix)
  int64_t k_rem;   // K-major: k_total - (first k of the chunk); MN-major: k_total - (k
                   // of the thread's first row), for the current slice
  int fixed;       // K-major: bit i set when chunk i's row is inside the matrix;
                   // MN-major: valid elements of each chunk (0..kPer)

  // (row0, col0): the first slice's origin in the stored matrix g (k0 = 0). The
  // methods take ld again (from the kernel parameters, not registers) and `any`, any
  // valid global address: the never-read source of fully zero-filled chunks.
  __device__ __forceinline__ SliceLoader(const T* g, int64_t ld, int64_t row0, int64_t col0,
                                         int64_t rows, int64_t cols, int tid) {
    const int r0 = tid / kRowChunks, ch = tid % kRowChunks;
    const int64_t gc = col0 + int64_t(ch) * kPer;
    addr = reinterpret_cast<uintptr_t>(g) + uintptr_t(((row0 + r0) * ld + gc) * kE);
    if constexpr (kKMajor) {
      k_rem = cols - gc;
      fixed = 0;
#pragma unroll
      for (int i = 0; i < kIters; ++i)
        if (row0 + r0 + i * kRowStep < rows) fixed |= 1 << i;
    } else {
      k_rem = rows - (row0 + r0);
      fixed = gc < cols ? int(imin<int64_t>(cols - gc, kPer)) : 0;
    }
  }

  // Valid elements of chunk i in the current slice.
  __device__ __forceinline__ int valid(int i) const {
    if constexpr (kKMajor) {
      if (!((fixed >> i) & 1) || k_rem <= 0) return 0;
      return int(imin<int64_t>(k_rem, kPer));
    } else {
      return i * kRowStep < k_rem ? fixed : 0;
    }
  }

  __device__ __forceinline__ static uint32_t dst(uint32_t slice, int i) {
    const int tid = threadIdx.x;
    const int r = tid / kRowChunks + i * kRowStep, ch = tid % kRowChunks;
    return slice + uint32_t(chunk_index<kRowChunks, kKMajor, kE == 8>(r, ch)) * 16u;
  }

  __device__ __forceinline__ const char* src(int i, int n, int64_t ld, const T* any) const {
    return n > 0 ? reinterpret_cast<const char*>(addr + uintptr_t(i * kRowStep * ld * kE))
                 : reinterpret_cast<const char*>(any);
  }

  // Copies the current slice to shared memory at `slice` (zero-filling outside the
  // matrix) with copies of `width` bytes (see copy_width).
  __device__ __forceinline__ void load(uint32_t slice, int width, int64_t ld,
                                       const T* any) const {
    if (width == 16) {
#pragma unroll
      for (int i = 0; i < kIters; ++i) {
        const int n = valid(i);
        ptx::cp_async<16>(dst(slice, i), src(i, n, ld, any), n * kE);
      }
    } else {
      load_narrow(slice, width, ld, any);
    }
  }

  __device__ __forceinline__ void load_narrow(uint32_t slice, int width, int64_t ld,
                                              const T* any) const {
#pragma unroll
    for (int i = 0; i < kIters; ++i) {
      const int n = valid(i);
      copy_chunk_narrow<kE>(dst(slice, i), src(i, n, ld, any), n * kE, width);
    }
  }

  __device__ __forceinline__ void next(int64_t ld) {
    addr += uintptr_t(kKMajor ? int64_t(kSliceK) * kE : kSliceK * ld * kE);
    k_rem -= kSliceK;
  }
};

// Reads element e of row r of a slice (scalar shared load).
template <typename V, int kRowChunks, bool kKMajor>
__device__ __forceinline__ V lds(const char* slice, int r, int e) {
  constexpr int kPer = 16 / int(sizeof(V));
  const int off = chunk_index<kRowChunks, kKMajor, sizeof(V) == 8>(r, e / kPer) * 16 +
                  (e % kPer) * int(sizeof(V));
  return *reinterpret_cast<const V*>(slice + off);
}

// ---------------------------------------------------------------------------------
// The tensor-core kernel.
//
// Fragment and ldmatrix layouts: ptx.h; lane = 4 * g + t (g = groupID, t = thread in
// group). ldmatrix of 32-bit data gives lane l the 32-bit column l%4 of row l/4.
// ---------------------------------------------------------------------------------

template <class Cfg, bool kTransA, bool kTransB>
__global__ void __launch_bounds__(Cfg::WARPS_M * Cfg::WARPS_N * 32, Cfg::kMinBlocks)
    mma_gemm_kernel(const Params<typename Cfg::Elem> p) {
  using T = typename Cfg::Elem;
  using AccT = Acc<T>;
  constexpr Kind kKind = Cfg::kKind;
  constexpr int BM = Cfg::BM, BN = Cfg::BN, BK = Cfg::BK, STAGES = Cfg::STAGES;
  constexpr int kThreads = Cfg::WARPS_M * Cfg::WARPS_N * 32;
  constexpr int kE = int(sizeof(T));
  constexpr int WTM = BM / Cfg::WARPS_M, WTN = BN / Cfg::WARPS_N;  // warp tile
  constexpr int MT = WTM / Cfg::MMA_M, NT = WTN / Cfg::MMA_N;       // MMAs per warp tile
  constexpr int KSTEPS = BK / Cfg::MMA_K;
  constexpr int kAccRegs = Cfg::MMA_M * Cfg::MMA_N / 32;
  static_assert(BK * kE == 64 && KSTEPS == 2, "a slice row is 64 bytes, two MMA k-steps");
  static_assert(NT % 2 == 0, "B fragments load in pairs of n-tiles");
  // Slice geometry: A is BM x BK (K-major) or BK x BM (MN-major); B is BN x BK or BK x BN.
  constexpr bool kAK = !kTransA, kBK = kTransB;  // K-major?
  constexpr int A_ROWS = kAK ? BM : BK, A_RC = kAK ? 4 : BM * kE / 16;
  constexpr int B_ROWS = kBK ? BN : BK, B_RC = kBK ? 4 : BN * kE / 16;
  constexpr int A_CHUNKS = A_ROWS * A_RC, B_CHUNKS = B_ROWS * B_RC;
  constexpr int STAGE_CHUNKS = A_CHUNKS + B_CHUNKS;

  OXIJAX_SHARED(uint4, smem, [STAGES * STAGE_CHUNKS], 128);

  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int wm = warp / Cfg::WARPS_N, wn = warp % Cfg::WARPS_N;
  const int g = lane >> 2, t = lane & 3;

  // The block tile's origin; a function of blockIdx only, recomputed where needed
  // rather than kept in registers through the main loop.
  const auto tile_origin = [&](int64_t& m0, int64_t& n0) {
    int64_t tm, tn;
    tile_coords(p.tiles_m, p.tiles_n, tm, tn);
    m0 = tm * BM;
    n0 = tn * BN;
  };
  // This split's k range (the whole of k without split-K).
  const int64_t k_begin = int64_t(blockIdx.z) * p.k_split;
  const int64_t k_len = imin<int64_t>(p.k - k_begin, p.k_split);
  const int64_t ktiles = (k_len + BK - 1) / BK;
  const uint32_t smem0 = ptx::shared_address(smem);
  const char* const smem_ptr = reinterpret_cast<const char*>(smem);

  for (int64_t item = blockIdx.y; item < p.batch; item += gridDim.y) {
    int64_t a_off, b_off;
    batch_offsets(p.bi, item, a_off, b_off);
    const T* const A = p.a + a_off + (kAK ? k_begin : k_begin * p.lda);
    const T* const B = p.b + b_off + (kBK ? k_begin : k_begin * p.ldb);

    int64_t m0, n0;
    tile_origin(m0, n0);
    using ALoader = SliceLoader<T, kThreads, A_ROWS, A_RC, kAK>;
    using BLoader = SliceLoader<T, kThreads, B_ROWS, B_RC, kBK>;
    ALoader la = kAK ? ALoader(A, p.lda, m0, 0, p.m, k_len, tid)    // a[m][k]
                     : ALoader(A, p.lda, 0, m0, k_len, p.m, tid);   // a[k][m]
    BLoader lb = kBK ? BLoader(B, p.ldb, n0, 0, p.n, k_len, tid)    // b[n][k]
                     : BLoader(B, p.ldb, 0, n0, k_len, p.n, tid);   // b[k][n]
    // Loads the next k-slice (slices are loaded in order) into `stage`.
    auto load_stage = [&](int stage) {
      const uint32_t sa = smem0 + uint32_t(stage * STAGE_CHUNKS) * 16u;
      const uint32_t sb = sa + uint32_t(A_CHUNKS) * 16u;
      la.load(sa, p.a_copy, p.lda, p.a);
      la.next(p.lda);
      lb.load(sb, p.b_copy, p.ldb, p.b);
      lb.next(p.ldb);
    };

    AccT acc[MT][NT][kAccRegs];
#pragma unroll
    for (int i = 0; i < MT; ++i)
#pragma unroll
      for (int j = 0; j < NT; ++j)
#pragma unroll
        for (int r = 0; r < kAccRegs; ++r) acc[i][j][r] = AccT(0);

    // Prologue: slices 0..STAGES-2, one commit group each (empty past the end).
#pragma unroll
    for (int s = 0; s < STAGES - 1; ++s) {
      if (s < ktiles) load_stage(s);
      ptx::cp_async_commit();
    }

    int read_stage = 0;  // the stage written in an iteration is the one read before it
    // Iteration kt (left = ktiles - kt) computes slice kt and loads slice kt + STAGES - 1.
    for (int64_t left = ktiles; left > 0; --left) {
      // Groups committed so far: STAGES - 1 + kt; at most STAGES - 2 pending means
      // slice kt has landed (for this thread; the barrier makes it everyone's), and
      // every warp is done with the stage computed in iteration kt - 1, which is the
      // one loaded now.
      ptx::cp_async_wait<STAGES - 2>();
      __syncthreads();
      if (left > STAGES - 1) load_stage(read_stage == 0 ? STAGES - 1 : read_stage - 1);
      ptx::cp_async_commit();

      const uint32_t sa = smem0 + uint32_t(read_stage * STAGE_CHUNKS) * 16u;
      const uint32_t sb = sa + uint32_t(A_CHUNKS) * 16u;
      const char* const pa = smem_ptr + read_stage * STAGE_CHUNKS * 16;
      const char* const pb = pa + A_CHUNKS * 16;

#pragma unroll
      for (int ks = 0; ks < KSTEPS; ++ks) {
        if constexpr (kKind == Kind::kF64) {
          double af[MT], bf[NT];
#pragma unroll
          for (int i = 0; i < MT; ++i) {
            const int mr = wm * WTM + i * 8 + g, kc = ks * 4 + t;
            if constexpr (kAK)
              af[i] = lds<double, A_RC, true>(pa, mr, kc);
            else
              af[i] = lds<double, A_RC, false>(pa, kc, mr);
          }
#pragma unroll
          for (int j = 0; j < NT; ++j) {
            const int nr = wn * WTN + j * 8 + g, kc = ks * 4 + t;
            if constexpr (kBK)
              bf[j] = lds<double, B_RC, true>(pb, nr, kc);
            else
              bf[j] = lds<double, B_RC, false>(pb, kc, nr);
          }
#pragma unroll
          for (int i = 0; i < MT; ++i)
#pragma unroll
            for (int j = 0; j < NT; ++j) ptx::mma_m8n8k4_f64(acc[i][j], af[i], bf[j]);
        } else {
          uint32_t af[MT][4], bf[NT][2];
          // A fragments.
#pragma unroll
          for (int i = 0; i < MT; ++i) {
            const int mb = wm * WTM + i * 16;  // first row of this m16 tile
            if constexpr (kAK) {
              // Matrices (rows mb..+7 | mb+8..+15) x (chunk 2ks | 2ks+1) -> a0..a3.
              const int r = mb + (lane & 15), ch = ks * 2 + (lane >> 4);
              ptx::ldmatrix_x4(af[i],
                               sa + uint32_t(chunk_index<A_RC, true, false>(r, ch)) * 16u);
            } else if constexpr (kKind != Kind::kTF32) {
              // Stored a[k][m]: matrix j = (k rows 8*(j/2).., m chunk (j%2)), transposed.
              const int r = ks * 16 + ((lane >> 4) << 3) + (lane & 7);
              const int ch = mb / 8 + ((lane >> 3) & 1);
              ptx::ldmatrix_x4_trans(af[i],
                                     sa + uint32_t(chunk_index<A_RC, false, false>(r, ch)) * 16u);
            } else {
              const int kr = ks * 8 + t;
              af[i][0] = lds<uint32_t, A_RC, false>(pa, kr, mb + g);
              af[i][1] = lds<uint32_t, A_RC, false>(pa, kr, mb + g + 8);
              af[i][2] = lds<uint32_t, A_RC, false>(pa, kr + 4, mb + g);
              af[i][3] = lds<uint32_t, A_RC, false>(pa, kr + 4, mb + g + 8);
            }
          }
          // B fragments, two n8 tiles per step.
#pragma unroll
          for (int j = 0; j < NT / 2; ++j) {
            const int nb = wn * WTN + j * 16;  // first column of this n16 pair
            if constexpr (kBK || kKind != Kind::kTF32) {
              uint32_t r4[4];
              if constexpr (kBK) {
                // Stored b[n][k]: matrices (n nb..+7, chunk 2ks), (nb..+7, 2ks+1),
                // (nb+8.., 2ks), (nb+8.., 2ks+1) = b0, b1 of tile 2j, b0, b1 of 2j+1.
                const int r = nb + ((lane >> 4) << 3) + (lane & 7);
                const int ch = ks * 2 + ((lane >> 3) & 1);
                ptx::ldmatrix_x4(r4,
                                 sb + uint32_t(chunk_index<B_RC, true, false>(r, ch)) * 16u);
              } else {
                // Stored b[k][n]: matrices (k rows 0-7 | 8-15 of the step) x (n chunk
                // nb/8 | nb/8+1), transposed: the same register order.
                const int r = ks * 16 + (lane & 15);
                const int ch = nb / 8 + (lane >> 4);
                ptx::ldmatrix_x4_trans(r4,
                                       sb + uint32_t(chunk_index<B_RC, false, false>(r, ch)) * 16u);
              }
              bf[2 * j][0] = r4[0];
              bf[2 * j][1] = r4[1];
              bf[2 * j + 1][0] = r4[2];
              bf[2 * j + 1][1] = r4[3];
            } else {  // tf32, stored b[k][n]
              const int kr = ks * 8 + t;
#pragma unroll
              for (int h = 0; h < 2; ++h) {
                bf[2 * j + h][0] = lds<uint32_t, B_RC, false>(pb, kr, nb + 8 * h + g);
                bf[2 * j + h][1] = lds<uint32_t, B_RC, false>(pb, kr + 4, nb + 8 * h + g);
              }
            }
          }
          if constexpr (kKind == Kind::kTF32) {
#pragma unroll
            for (int i = 0; i < MT; ++i)
#pragma unroll
              for (int r = 0; r < 4; ++r)
                af[i][r] = ptx::cvt_rna_tf32(__uint_as_float(af[i][r]));
#pragma unroll
            for (int j = 0; j < NT; ++j)
#pragma unroll
              for (int r = 0; r < 2; ++r)
                bf[j][r] = ptx::cvt_rna_tf32(__uint_as_float(bf[j][r]));
#pragma unroll
            for (int i = 0; i < MT; ++i)
#pragma unroll
              for (int j = 0; j < NT; ++j) ptx::mma_m16n8k8_tf32(acc[i][j], af[i], bf[j]);
          } else {
#pragma unroll
            for (int i = 0; i < MT; ++i)
#pragma unroll
              for (int j = 0; j < NT; ++j)
                ptx::mma_m16n8k16<kKind == Kind::kBF16>(acc[i][j], af[i], bf[j]);
          }
        }
      }
      read_stage = read_stage + 1 == STAGES ? 0 : read_stage + 1;
    }
    // Drain (only empty groups can be pending) and let every warp finish reading
    // shared memory before the next batch item's prologue overwrites it.
    ptx::cp_async_wait<0>();
    __syncthreads();

    // Epilogue straight from the accumulators: rows g (+8), columns 2t, 2t+1.
    tile_origin(m0, n0);
    const int64_t tile_off = item * p.out_stride + m0 * p.ldc + n0;
    const int rows_left = int(imin<int64_t>(p.m - m0, BM));
    const int cols_left = int(imin<int64_t>(p.n - n0, BN));
#pragma unroll
    for (int i = 0; i < MT; ++i)
#pragma unroll
      for (int j = 0; j < NT; ++j)
#pragma unroll
        for (int h = 0; h < kAccRegs / 2; ++h) {
          const int r = wm * WTM + i * Cfg::MMA_M + g + 8 * h;
          const int cl = wn * WTN + j * Cfg::MMA_N + 2 * t;
          if (r < rows_left && cl < cols_left) {
            if (p.partial)
              store_partial(p, item, m0 + r, n0 + cl, cl + 1 < cols_left, acc[i][j][2 * h],
                            acc[i][j][2 * h + 1]);
            else
              store_pair<T>(p, tile_off + int64_t(r) * p.ldc + cl, cl + 1 < cols_left,
                            acc[i][j][2 * h], acc[i][j][2 * h + 1]);
          }
        }
  }
}

// ---------------------------------------------------------------------------------
// Exact float32: SIMT kernel. 256 threads as 16 x 16; thread (tx, ty) owns rows
// {4ty..4ty+3, 64+4ty..64+4ty+3} and the same columns with tx. Shared slices are
// As[k][m] and Bs[k][n] (rows padded to 132 floats), double-buffered; the next slice
// is loaded into registers during the compute of the current one.
// ---------------------------------------------------------------------------------

constexpr int kSimtBM = 128, kSimtBN = 128, kSimtBK = 8, kSimtPad = 4;
constexpr int kSimtLd = kSimtBM + kSimtPad;  // 132 floats: 16-byte aligned rows

// One thread's 4 contiguous elements of an operand's k-slice. K-major operands (a[m][k],
// b[n][k]): the slice is 128 rows x 8 k; thread: row tid/2, k 4*(tid%2)..+3 (stored
// transposed). MN-major (a[k][m], b[k][n]): 8 k-rows x 128; thread: k-row tid/32,
// elements 4*(tid%32)..+3. Coalesced either way.
template <bool kKMajor>
struct QuadLoader {
  uintptr_t addr;  // the thread's first element in the current slice (dereferenced
                   // only where inside the matrix)
  int64_t k_rem;   // k_total - the k of that element
  int fixed;       // K-major: row inside (0/1); MN-major: valid elements (0..4)

  // mn0: first m (or n) of the block tile; mn: m (or n); kk: k.
  __device__ __forceinline__ QuadLoader(const float* g, int64_t ld, int64_t mn0, int64_t mn,
                                        int64_t kk, int tid) {
    int64_t off;
    if constexpr (kKMajor) {
      const int r = tid >> 1, c = (tid & 1) * 4;
      off = (mn0 + r) * ld + c;
      k_rem = kk - c;
      fixed = mn0 + r < mn;
    } else {
      const int r = tid >> 5, c = (tid & 31) * 4;
      off = r * ld + mn0 + c;
      k_rem = kk - r;
      const int64_t left = mn - (mn0 + c);
      fixed = left <= 0 ? 0 : int(imin<int64_t>(left, 4));
    }
    addr = reinterpret_cast<uintptr_t>(g) + uintptr_t(off * int64_t(sizeof(float)));
  }

  __device__ __forceinline__ void load(float (&v)[4], bool vec) const {
    int n;
    if constexpr (kKMajor)
      n = fixed && k_rem > 0 ? int(imin<int64_t>(k_rem, 4)) : 0;
    else
      n = k_rem > 0 ? fixed : 0;
    const float* const src = reinterpret_cast<const float*>(addr);
    if (vec && n == 4) {
      const float4 x = *reinterpret_cast<const float4*>(src);
      v[0] = x.x, v[1] = x.y, v[2] = x.z, v[3] = x.w;
    } else {
#pragma unroll
      for (int j = 0; j < 4; ++j) v[j] = j < n ? src[j] : 0.0f;
    }
  }

  // Stores v into the shared slice S[k][mn] (row length kSimtLd).
  __device__ __forceinline__ static void store(float* S, const float (&v)[4]) {
    const int tid = threadIdx.x;
    if constexpr (kKMajor) {
      const int r = tid >> 1, c = (tid & 1) * 4;
#pragma unroll
      for (int j = 0; j < 4; ++j) S[(c + j) * kSimtLd + r] = v[j];
    } else {
      const int r = tid >> 5, c = (tid & 31) * 4;
      *reinterpret_cast<float4*>(S + r * kSimtLd + c) = make_float4(v[0], v[1], v[2], v[3]);
    }
  }

  // ld: the operand's leading dim (from the kernel parameters).
  __device__ __forceinline__ void next(int64_t ld) {
    addr += uintptr_t(kKMajor ? int64_t(kSimtBK) * 4 : kSimtBK * ld * 4);
    k_rem -= kSimtBK;
  }
};

template <bool kTransA, bool kTransB>
__global__ void __launch_bounds__(256, 2) sgemm_simt_kernel(const Params<float> p) {
  static_assert(kSimtBM == kSimtBN, "square tiles");
  // Bank conflicts: the transposed stores S[c + j][r] of a warp hit banks
  // (4 * (c + j) + r) % 32, r in 16 consecutive rows, c in {0, 4}: distinct; the
  // float4 reads are broadcasts (A) or 16 consecutive float4 (B).
  OXIJAX_SHARED(float, As, [2][kSimtBK * kSimtLd], 16);
  OXIJAX_SHARED(float, Bs, [2][kSimtBK * kSimtLd], 16);

  const int tid = threadIdx.x, tx = tid & 15, ty = tid >> 4;
  // The block tile's origin, recomputed where needed (see mma_gemm_kernel).
  const auto tile_origin = [&](int64_t& m0, int64_t& n0) {
    int64_t tm, tn;
    tile_coords(p.tiles_m, p.tiles_n, tm, tn);
    m0 = tm * kSimtBM;
    n0 = tn * kSimtBN;
  };
  const bool a_vec = p.a_copy == 16, b_vec = p.b_copy == 16;

  for (int64_t item = blockIdx.y; item < p.batch; item += gridDim.y) {
    int64_t a_off, b_off;
    batch_offsets(p.bi, item, a_off, b_off);
    int64_t m0, n0;
    tile_origin(m0, n0);
    const int64_t k_begin = int64_t(blockIdx.z) * p.k_split;  // this split's k range
    const int64_t k_len = imin<int64_t>(p.k - k_begin, p.k_split);
    QuadLoader<!kTransA> la(p.a + a_off + (kTransA ? k_begin * p.lda : k_begin), p.lda, m0, p.m,
                            k_len, tid);
    QuadLoader<kTransB> lb(p.b + b_off + (kTransB ? k_begin : k_begin * p.ldb), p.ldb, n0, p.n,
                           k_len, tid);

    float acc[8][8];
#pragma unroll
    for (int i = 0; i < 8; ++i)
#pragma unroll
      for (int j = 0; j < 8; ++j) acc[i][j] = 0.0f;

    const int64_t ktiles = (k_len + kSimtBK - 1) / kSimtBK;
    float ra[4], rb[4];
    la.load(ra, a_vec);
    lb.load(rb, b_vec);
    la.next(p.lda);
    lb.next(p.ldb);
    QuadLoader<!kTransA>::store(As[0], ra);
    QuadLoader<kTransB>::store(Bs[0], rb);
    __syncthreads();
    for (int64_t kt = 0; kt < ktiles; ++kt) {
      const int buf = int(kt & 1);
      const bool more = kt + 1 < ktiles;
      if (more) {
        la.load(ra, a_vec);
        lb.load(rb, b_vec);
        la.next(p.lda);
        lb.next(p.ldb);
      }
      const float* const sa = As[buf];
      const float* const sb = Bs[buf];
#pragma unroll
      for (int kk = 0; kk < kSimtBK; ++kk) {
        const float4 a0 = *reinterpret_cast<const float4*>(sa + kk * kSimtLd + 4 * ty);
        const float4 a1 = *reinterpret_cast<const float4*>(sa + kk * kSimtLd + 64 + 4 * ty);
        const float4 b0 = *reinterpret_cast<const float4*>(sb + kk * kSimtLd + 4 * tx);
        const float4 b1 = *reinterpret_cast<const float4*>(sb + kk * kSimtLd + 64 + 4 * tx);
        const float av[8] = {a0.x, a0.y, a0.z, a0.w, a1.x, a1.y, a1.z, a1.w};
        const float bv[8] = {b0.x, b0.y, b0.z, b0.w, b1.x, b1.y, b1.z, b1.w};
#pragma unroll
        for (int i = 0; i < 8; ++i)
#pragma unroll
          for (int j = 0; j < 8; ++j) acc[i][j] = fmaf(av[i], bv[j], acc[i][j]);
      }
      // The other buffer was last read in iteration kt - 1, before the barrier that
      // ended it; this iteration's barrier publishes the new slice (and, after the
      // last one, frees shared memory for the next batch item).
      if (more) {
        QuadLoader<!kTransA>::store(As[buf ^ 1], ra);
        QuadLoader<kTransB>::store(Bs[buf ^ 1], rb);
      }
      __syncthreads();
    }

    // Epilogue, 4 adjacent columns at a time.
    tile_origin(m0, n0);
    const int64_t tile_off = item * p.out_stride + m0 * p.ldc + n0;
    const int rows_left = int(imin<int64_t>(p.m - m0, kSimtBM));
    const int cols_left = int(imin<int64_t>(p.n - n0, kSimtBN));
    const bool read_c = p.beta != 0.0f;
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      const int r = i < 4 ? 4 * ty + i : 64 + 4 * ty + (i - 4);
      if (r >= rows_left) continue;
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int cl = 64 * h + 4 * tx;
        if (cl >= cols_left) continue;
        if (p.partial) {
#pragma unroll
          for (int j = 0; j < 4; j += 2)
            if (cl + j < cols_left)
              store_partial(p, item, m0 + r, n0 + cl + j, cl + j + 1 < cols_left,
                            acc[i][4 * h + j], acc[i][4 * h + j + 1]);
          continue;
        }
        const int64_t off = tile_off + int64_t(r) * p.ldc + cl;
        if (p.out_vec && cl + 4 <= cols_left) {  // off % 4 == 0: ldc, out_stride, n0 + cl are
          float4 cv = make_float4(0.f, 0.f, 0.f, 0.f);
          if (read_c) cv = *reinterpret_cast<const float4*>(p.c + off);
          float4 v;
          v.x = finish(p, acc[i][4 * h + 0], &cv.x, 0);
          v.y = finish(p, acc[i][4 * h + 1], &cv.y, 0);
          v.z = finish(p, acc[i][4 * h + 2], &cv.z, 0);
          v.w = finish(p, acc[i][4 * h + 3], &cv.w, 0);
          *reinterpret_cast<float4*>(p.out + off) = v;
        } else {
#pragma unroll
          for (int j = 0; j < 4; ++j)
            if (cl + j < cols_left) p.out[off + j] = finish(p, acc[i][4 * h + j], p.c, off + j);
        }
      }
    }
  }
}

// ---------------------------------------------------------------------------------
// k == 0: out = beta * c (or 0), over batch x m x n elements of strided rows.
// ---------------------------------------------------------------------------------

template <typename T>
__global__ void __launch_bounds__(256) scale_c_kernel(const T* c, T* out, int64_t total,
                                                      int64_t m, int64_t n, int64_t ldc,
                                                      int64_t out_stride, Acc<T> beta) {
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < total; i += stride) {
    const int64_t row = i / n, item = row / m;
    const int64_t off = item * out_stride + (row - item * m) * ldc + (i - row * n);
    out[off] = store<T>(beta != Acc<T>(0) ? beta * load(c[off]) : Acc<T>(0));
  }
}

// ---------------------------------------------------------------------------------
// Split-K: out = alpha * (sum of the splits' partial sums, in split order) + beta * c.
// The fixed order keeps split-K results bit-identical from run to run.
// ---------------------------------------------------------------------------------

template <typename T>
__global__ void __launch_bounds__(256) split_sum_kernel(const Params<T> p, int splits) {
  const int64_t mn = p.m * p.n, total = p.batch * mn;
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < total; i += stride) {
    Acc<T> sum = p.partial[i];
    for (int z = 1; z < splits; ++z) sum += p.partial[z * total + i];
    const int64_t item = i / mn, r = (i - item * mn) / p.n, col = i - item * mn - r * p.n;
    const int64_t off = item * p.out_stride + r * p.ldc + col;
    p.out[off] = finish(p, sum, p.c, off);
  }
}

// ---------------------------------------------------------------------------------
// Host side
// ---------------------------------------------------------------------------------

// Block tile of the kernel a dtype (element bytes) runs: bm x bn outputs, bk per k-slice.
struct Tile {
  int64_t bm, bn, bk;
};
template <class Cfg> constexpr Tile tile_of() { return {Cfg::BM, Cfg::BN, Cfg::BK}; }
inline Tile tile_for(size_t element_bytes, bool allow_tf32) {
  if (element_bytes == 2) return tile_of<MmaConfig<Kind::kF16>>();  // bfloat16's is the same
  if (element_bytes == 8) return tile_of<MmaConfig<Kind::kF64>>();
  return allow_tf32 ? tile_of<MmaConfig<Kind::kTF32>>() : Tile{kSimtBM, kSimtBN, kSimtBK};
}

// Split-K plan: when the output tiles of all batch items cannot give every SM a block
// and k is long, k is cut into `splits` ranges of k_split (whole k-slices, at least
// kMinSplitSlices each) computed by separate blocks (gridDim.z); a second kernel sums
// them. About two blocks per SM in all, at most kMaxSplits, and a workspace of at most
// kMaxSplitBytes.
struct SplitPlan {
  int splits = 1;
  int64_t k_split = 0;
  size_t workspace = 0;
};
constexpr int64_t kMinSplitSlices = 8, kMaxSplits = 32;
constexpr size_t kMaxSplitBytes = size_t(256) << 20;

SplitPlan plan_split(const GemmShape& s, size_t element_bytes, bool allow_tf32) {
  SplitPlan plan;
  plan.k_split = s.k;
  const int64_t batch = s.batch_count();
  if (s.m <= 0 || s.n <= 0 || s.k <= 0 || batch <= 0) return plan;
  const Tile t = tile_for(element_bytes, allow_tf32);
  const int64_t blocks = ((s.m + t.bm - 1) / t.bm) * ((s.n + t.bn - 1) / t.bn) * batch;
  const int64_t slices = (s.k + t.bk - 1) / t.bk;
  const int64_t sms = sm_count();
  if (blocks >= sms || slices < 2 * kMinSplitSlices) return plan;
  const size_t acc_bytes = element_bytes == 8 ? 8 : 4;
  const size_t split_bytes = size_t(batch) * size_t(s.m) * size_t(s.n) * acc_bytes;
  int64_t splits = std::min({(2 * sms + blocks - 1) / blocks, slices / kMinSplitSlices,
                             kMaxSplits, int64_t(kMaxSplitBytes / split_bytes)});
  if (splits < 2) return plan;
  const int64_t slices_per_split = (slices + splits - 1) / splits;
  plan.k_split = slices_per_split * t.bk;
  plan.splits = int((s.k + plan.k_split - 1) / plan.k_split);
  plan.workspace = size_t(plan.splits) * split_bytes;
  return plan;
}

// The batch dims with size-1 dims dropped and neighbours merged where both operands'
// strides chain (offset = (i_outer * size + i) * stride), outermost first.
struct MergedBatch {
  std::vector<int64_t> dims, a_stride, b_stride;
};

MergedBatch merge_batch_dims(const GemmShape& s) {
  MergedBatch mb;
  for (size_t d = 0; d < s.batch_dims.size(); ++d) {
    const int64_t size = s.batch_dims[d];
    if (size == 1) continue;
    const int64_t sa = s.a_batch_strides[d], sb = s.b_batch_strides[d];
    if (!mb.dims.empty() && mb.a_stride.back() == sa * size && mb.b_stride.back() == sb * size) {
      mb.dims.back() *= size;
      mb.a_stride.back() = sa;
      mb.b_stride.back() = sb;
      continue;
    }
    mb.dims.push_back(size);
    mb.a_stride.push_back(sa);
    mb.b_stride.push_back(sb);
  }
  return mb;
}

// Requires mb.dims.size() <= kMaxBatchRank.
BatchIndex make_batch_index(const MergedBatch& mb) {
  BatchIndex bi{};
  bi.rank = int(mb.dims.size());
  for (int d = 0; d < bi.rank; ++d) {
    bi.dims[d] = mb.dims[d];
    bi.a_stride[d] = mb.a_stride[d];
    bi.b_stride[d] = mb.b_stride[d];
  }
  return bi;
}

// Widest copy (16, 8 or 4 bytes, at least one element) every chunk of an operand is
// aligned to; kCopySync for 2-byte elements with no 4-byte alignment.
int copy_width(const void* base, int64_t ld, const std::vector<int64_t>& strides,
               int elem_bytes) {
  for (int w = 16; w >= 4 && w >= elem_bytes; w /= 2) {
    bool ok = reinterpret_cast<uintptr_t>(base) % w == 0 && (ld * elem_bytes) % w == 0;
    for (int64_t st : strides) ok = ok && (st * elem_bytes) % w == 0;
    if (ok) return w;
  }
  return elem_bytes == 2 ? kCopySync : elem_bytes;
}

template <typename T>
bool aligned_to(const T* p, int bytes) {
  return reinterpret_cast<uintptr_t>(p) % bytes == 0;
}

template <class Cfg>
cudaError_t launch_mma(cudaStream_t stream, const GemmShape& s, const Params<typename Cfg::Elem>& p,
                       dim3 grid) {
  constexpr int kThreads = Cfg::WARPS_M * Cfg::WARPS_N * 32;
  if (!s.trans_a && !s.trans_b)
    return launch(&mma_gemm_kernel<Cfg, false, false>, grid, kThreads, 0, stream, p);
  if (!s.trans_a && s.trans_b)
    return launch(&mma_gemm_kernel<Cfg, false, true>, grid, kThreads, 0, stream, p);
  if (s.trans_a && !s.trans_b)
    return launch(&mma_gemm_kernel<Cfg, true, false>, grid, kThreads, 0, stream, p);
  return launch(&mma_gemm_kernel<Cfg, true, true>, grid, kThreads, 0, stream, p);
}

cudaError_t launch_simt(cudaStream_t stream, const GemmShape& s, const Params<float>& p,
                        dim3 grid) {
  if (!s.trans_a && !s.trans_b)
    return launch(&sgemm_simt_kernel<false, false>, grid, 256, 0, stream, p);
  if (!s.trans_a && s.trans_b)
    return launch(&sgemm_simt_kernel<false, true>, grid, 256, 0, stream, p);
  if (s.trans_a && !s.trans_b)
    return launch(&sgemm_simt_kernel<true, false>, grid, 256, 0, stream, p);
  return launch(&sgemm_simt_kernel<true, true>, grid, 256, 0, stream, p);
}

// Fills p for a block tile of bm x bn; false when the tile grid is too large.
template <typename T>
bool make_params(const GemmShape& s, const T* a, const T* b, const T* c, T* out, int64_t bm,
                 int64_t bn, const BatchIndex& bi, Params<T>& p, dim3& grid) {
  p.a = a, p.b = b, p.c = c, p.out = out;
  p.m = s.m, p.n = s.n, p.k = s.k;
  p.lda = s.a_ld();
  p.ldb = s.b_ld();
  p.ldc = s.out_ld();
  p.out_stride = s.out_stride();
  p.batch = s.batch_count();
  p.tiles_m = (s.m + bm - 1) / bm;
  p.tiles_n = (s.n + bn - 1) / bn;
  p.alpha = Acc<T>(s.alpha);
  p.beta = Acc<T>(s.beta);
  const int e = int(sizeof(T));
  p.a_copy = copy_width(a, p.lda, s.a_batch_strides, e);
  p.b_copy = copy_width(b, p.ldb, s.b_batch_strides, e);
  p.bi = bi;
  p.k_split = s.k;
  p.partial = nullptr;
  if (p.tiles_m > INT_MAX / p.tiles_n) return false;
  grid = dim3(unsigned(p.tiles_m * p.tiles_n), unsigned(p.batch < 65535 ? p.batch : 65535), 1);
  return true;
}

// More merged batch dims than a kernel indexes: one launch (of the innermost
// kMaxBatchRank dims) per index of the outer ones. Rare: it takes more than six batch
// dims that broadcast differently.
template <typename T>
cudaError_t gemm_outer_loop(cudaStream_t stream, const GemmShape& shape, const MergedBatch& mb,
                            const T* a, const T* b, const T* c, T* out, bool allow_tf32) {
  const size_t outer_rank = mb.dims.size() - kMaxBatchRank;
  GemmShape inner = shape;
  inner.batch_dims.assign(mb.dims.begin() + outer_rank, mb.dims.end());
  inner.a_batch_strides.assign(mb.a_stride.begin() + outer_rank, mb.a_stride.end());
  inner.b_batch_strides.assign(mb.b_stride.begin() + outer_rank, mb.b_stride.end());
  const int64_t out_step = inner.batch_count() * shape.out_stride();
  const int64_t outer_count = shape.batch_count() / inner.batch_count();
  for (int64_t o = 0; o < outer_count; ++o) {
    int64_t rest = o, a_off = 0, b_off = 0;
    for (size_t d = outer_rank; d-- > 0;) {  // innermost outer dim first
      const int64_t i = rest % mb.dims[d];
      rest /= mb.dims[d];
      a_off += i * mb.a_stride[d];
      b_off += i * mb.b_stride[d];
    }
    const T* c_item = c ? c + o * out_step : nullptr;
    if (const cudaError_t status = gemm(stream, inner, a + a_off, b + b_off, c_item,
                                        out + o * out_step, allow_tf32, nullptr);
        status != cudaSuccess)
      return status;
  }
  return cudaSuccess;
}

// Launches a gemm kernel over grid (x: tiles, y: batch), split along k as planned.
template <typename T, typename Launch>
cudaError_t launch_split(cudaStream_t stream, const GemmShape& shape, Params<T>& p, dim3 grid,
                         bool allow_tf32, void* workspace, Launch launch_kernel) {
  const SplitPlan plan = workspace ? plan_split(shape, sizeof(T), allow_tf32) : SplitPlan{};
  if (plan.splits < 2) return launch_kernel(p, grid);
  p.k_split = plan.k_split;
  p.partial = static_cast<Acc<T>*>(workspace);
  grid.z = unsigned(plan.splits);
  if (const cudaError_t err = launch_kernel(p, grid); err != cudaSuccess) return err;
  const int64_t total = p.batch * p.m * p.n;
  const int64_t blocks = std::min<int64_t>((total + 255) / 256, int64_t(sm_count()) * 8);
  return launch(&split_sum_kernel<T>, unsigned(blocks), 256, 0, stream, p, plan.splits);
}

}  // namespace

size_t gemm_workspace_bytes(const GemmShape& shape, size_t element_bytes, bool allow_tf32) {
  if (merge_batch_dims(shape).dims.size() > size_t(kMaxBatchRank)) return 0;
  const SplitPlan plan = plan_split(shape, element_bytes, allow_tf32 && element_bytes == 4);
  return plan.splits > 1 ? (plan.workspace + 255) / 256 * 256 : 0;
}

template <typename T>
cudaError_t gemm(cudaStream_t stream, const GemmShape& shape, const T* a, const T* b,
                 const T* c, T* out, bool allow_tf32, void* workspace) {
  using AccT = Acc<T>;
  if (shape.m < 0 || shape.n < 0 || shape.k < 0) return cudaErrorInvalidValue;
  const int64_t batch = shape.batch_count();
  if (batch <= 0 || shape.m == 0 || shape.n == 0) return cudaSuccess;
  const AccT beta = AccT(shape.beta);
  if (beta != AccT(0) && c == nullptr) return cudaErrorInvalidValue;

  if (shape.k == 0) {
    const int64_t total = batch * shape.m * shape.n;
    const int64_t blocks = (total + 255) / 256;
    return launch(&scale_c_kernel<T>, unsigned(blocks < 4096 ? blocks : 4096), 256, 0, stream,
                  c, out, total, shape.m, shape.n, shape.out_ld(), shape.out_stride(), beta);
  }

  if (shape.a_batch_strides.size() != shape.batch_dims.size() ||
      shape.b_batch_strides.size() != shape.batch_dims.size())
    return cudaErrorInvalidValue;
  const MergedBatch merged = merge_batch_dims(shape);
  if (merged.dims.size() > size_t(kMaxBatchRank))
    return gemm_outer_loop(stream, shape, merged, a, b, c, out, allow_tf32);
  const BatchIndex bi = make_batch_index(merged);

  Params<T> p;
  dim3 grid;
  // Vector epilogue: pairs (tensor-core kernels) or quads (SIMT) of adjacent columns.
  const auto out_vec = [&](int elems) {
    const int bytes = elems * int(sizeof(T));
    return shape.out_ld() % elems == 0 && shape.out_stride() % elems == 0 &&
           aligned_to(out, bytes) &&
           (beta == AccT(0) || aligned_to(c, bytes));
  };
  if constexpr (std::is_same_v<T, half> || std::is_same_v<T, bfloat16>) {
    using Cfg = MmaConfig<std::is_same_v<T, half> ? Kind::kF16 : Kind::kBF16>;
    if (!make_params(shape, a, b, c, out, Cfg::BM, Cfg::BN, bi, p, grid))
      return cudaErrorInvalidValue;
    p.out_vec = out_vec(2);
    return launch_split(stream, shape, p, grid, false, workspace,
                        [&](const Params<T>& q, dim3 g) { return launch_mma<Cfg>(stream, shape, q, g); });
  } else if constexpr (std::is_same_v<T, double>) {
    using Cfg = MmaConfig<Kind::kF64>;
    if (!make_params(shape, a, b, c, out, Cfg::BM, Cfg::BN, bi, p, grid))
      return cudaErrorInvalidValue;
    p.out_vec = out_vec(2);
    return launch_split(stream, shape, p, grid, false, workspace,
                        [&](const Params<T>& q, dim3 g) { return launch_mma<Cfg>(stream, shape, q, g); });
  } else {
    static_assert(std::is_same_v<T, float>);
    if (allow_tf32) {
      using Cfg = MmaConfig<Kind::kTF32>;
      if (!make_params(shape, a, b, c, out, Cfg::BM, Cfg::BN, bi, p, grid))
        return cudaErrorInvalidValue;
      p.out_vec = out_vec(2);
      return launch_split(stream, shape, p, grid, true, workspace,
                          [&](const Params<T>& q, dim3 g) { return launch_mma<Cfg>(stream, shape, q, g); });
    }
    if (!make_params(shape, a, b, c, out, kSimtBM, kSimtBN, bi, p, grid))
      return cudaErrorInvalidValue;
    p.out_vec = out_vec(4);
    return launch_split(stream, shape, p, grid, false, workspace,
                        [&](const Params<T>& q, dim3 g) { return launch_simt(stream, shape, q, g); });
  }
}

template cudaError_t gemm<half>(cudaStream_t, const GemmShape&, const half*, const half*,
                                const half*, half*, bool, void*);
template cudaError_t gemm<bfloat16>(cudaStream_t, const GemmShape&, const bfloat16*,
                                    const bfloat16*, const bfloat16*, bfloat16*, bool, void*);
template cudaError_t gemm<float>(cudaStream_t, const GemmShape&, const float*, const float*,
                                 const float*, float*, bool, void*);
template cudaError_t gemm<double>(cudaStream_t, const GemmShape&, const double*, const double*,
                                  const double*, double*, bool, void*);

}  // namespace oxijax::cuda

