// CUDA conv2d as an implicit GEMM: per group g, out[g] viewed K x (N*P*Q) is
//   w[g] (K x C*R*S, row-major as stored) @ im2col(x[g]) (C*R*S x N*P*Q),
// with the im2col matrix gathered from x on the fly while shared-memory tiles are
// filled; it never exists in memory. Grid: x = pixel tiles, y = filter tiles, z = groups.
//
// * float16 / bfloat16: 128 (filters) x 64 (pixels) x 32 (C*R*S) block tiles, 8 warps
//   of 64 x 16, two blocks per SM, tensor cores (mma.sync m16n8k16, float32 accumulation) fed by ldmatrix;
//   the tile is rounded once to the storage type (RNE) and staged through shared memory
//   so that every store to out runs along q.
// * float32 / float64: SIMT, exact in the storage type. float: 128 x 128 x 8 block tiles,
//   8 x 8 outputs per thread; double: 64 x 64 x 8, 4 x 4 per thread.
// * Both: two shared-memory stages; the next tile is loaded to registers before the
//   current one is computed and stored after it, one barrier per tile. Each thread
//   gathers one fixed im2col column (decoded once into (image, h0, w0)); row kk of a tile
//   is decoded into (r, s, channel offset) by a table in shared memory, which a few
//   threads fill two tiles ahead by carrying (c, r, s) forward. Rows past C*R*S and
//   filters past K load zeros; so do taps outside the image (padding).
// * Bounds tests run in 32 bits: H, W, R and S must be below 2^29 (else the launcher
//   returns cudaErrorInvalidValue); a window whose origin lies 2^29 or more outside the
//   image is all padding and is never gathered. All offsets are 64-bit.
// * C*R*S == 0 gives zeros (no tiles, the epilogue stores the zero accumulators).
//   Launchers only enqueue: cudaSuccess without a launch for an empty output, else
//   the status of each launch, checked right after it (more than one launch only where
//   a grid dimension would pass its limit).
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <climits>
#include <cstdint>
#include <type_traits>

#include "kernels.h"
#include "launch.h"
#include "ptx.h"

namespace oxijax::cuda {
namespace {

constexpr int kNoTap = 1 << 30;                  // Tap::r of a row past C*R*S: never inside
constexpr int64_t kNear = int64_t{1} << 29;      // bound on |h0|, |w0| of a gathered window
constexpr int64_t kMaxExtent = int64_t{1} << 29; // H, W, R, S must be below this

// Everything a block needs, by value in the kernel parameters.
struct ConvParams {
  int64_t n, c, k;     // images, channels, filters (per group)
  int64_t q, pq, hw;   // Q, P*Q, H*W
  int64_t rs, kdim;    // R*S, C*R*S
  int64_t cols;        // N*P*Q
  int64_t stride_h, stride_w, pad_h, pad_w;
  int h, w, r, s;
  // The tile depth BK split as step_c * R*S + step_r * S + step_s (step_r < R, step_s < S).
  int64_t step_c;
  int step_r, step_s;
};

// One im2col row kk = c*R*S + r*S + s of a tile: x offset c*H*W + r*W + s from the
// window origin. A row past C*R*S has r = kNoTap, which fails every bounds test.
struct alignas(16) Tap {
  int r, s;
  int64_t delta;
};

// One im2col column j = n*P*Q + p*Q + q of group g.
struct Column {
  int64_t x_off;    // x index of (image, channel 0, h0, w0); meaningful when gather
  int64_t out_off;  // out index of (image, filter 0, p, q)
  int h0, w0;       // window origin p*stride_h - pad_h, q*stride_w - pad_w
  bool valid;       // j < N*P*Q
  bool gather;      // valid, and the origin is within kNear of the image
};

__device__ __forceinline__ Column decode_column(const ConvParams& p, int64_t g, int64_t j) {
  Column col;
  col.valid = j < p.cols;
  const int64_t n = col.valid ? j / p.pq : 0;
  const int64_t pq = col.valid ? j - n * p.pq : 0;
  const int64_t pi = pq / p.q, qi = pq - pi * p.q;
  const int64_t h0 = pi * p.stride_h - p.pad_h, w0 = qi * p.stride_w - p.pad_w;
  // An origin beyond kNear: every tap (0 <= r < R < kNear) misses the image anyway.
  col.gather = col.valid && h0 >= -kNear && h0 <= kNear && w0 >= -kNear && w0 <= kNear;
  col.h0 = col.gather ? static_cast<int>(h0) : 0;
  col.w0 = col.gather ? static_cast<int>(w0) : 0;
  const int64_t image = g * p.n + n;
  col.x_off = col.gather ? image * p.c * p.hw + h0 * p.w + w0 : 0;
  col.out_off = image * p.k * p.pq + pq;
  return col;
}

// |h0| <= 2^29 and 0 <= r < 2^29 or r == 2^30: h0 + r never overflows, and a
// kNoTap row lands at h >= 2^29 >= H.
__device__ __forceinline__ bool inside(const ConvParams& p, const Column& col, const Tap& t) {
  const int hh = col.h0 + t.r, ww = col.w0 + t.s;
  return col.gather && static_cast<unsigned>(hh) < static_cast<unsigned>(p.h) &&
         static_cast<unsigned>(ww) < static_cast<unsigned>(p.w);
}

// One 16-byte shared load (the compiler splits a plain struct copy in two).
__device__ __forceinline__ Tap load_tap(const Tap* t) {
  const int4 v = *reinterpret_cast<const int4*>(t);
  Tap out;
  out.r = v.x, out.s = v.y;
  out.delta = static_cast<int64_t>((static_cast<uint64_t>(static_cast<uint32_t>(v.w)) << 32) |
                                   static_cast<uint32_t>(v.z));
  return out;
}

// Row `row` of tile 0, then the same row of each next tile (kk += BK): (c, r, s) carried
// forward with one carry per digit, no division after start().
struct TapWalker {
  int64_t kk = 0, c = 0;
  int r = 0, s = 0;

  __device__ __forceinline__ void start(const ConvParams& p, int row) {  // needs kdim > 0
    kk = row;
    c = kk / p.rs;
    const int64_t rem = kk - c * p.rs;
    r = static_cast<int>(rem / p.s);
    s = static_cast<int>(rem - int64_t{r} * p.s);
  }
  __device__ __forceinline__ Tap tap(const ConvParams& p) const {
    Tap t;
    if (kk < p.kdim) {
      t.r = r, t.s = s, t.delta = c * p.hw + int64_t{r} * p.w + s;
    } else {
      t.r = kNoTap, t.s = 0, t.delta = 0;
    }
    return t;
  }
  template <int BK>
  __device__ __forceinline__ void next(const ConvParams& p) {
    kk += BK;
    s += p.step_s;  // s + step_s <= 2S - 2
    if (s >= p.s) s -= p.s, ++r;
    r += p.step_r;  // r + 1 + step_r <= 2R - 1
    if (r >= p.r) r -= p.r, ++c;
    c += p.step_c;
  }
};

// Per-thread global -> register loads of one BM x BK tile of w and one BK x BN tile of
// im2col(x). A: thread (a_m, a_k) loads rows a_m + i*kAStep, column a_k (a warp reads
// runs of BK consecutive kk). B: thread (b_k, b_j) loads column b_j, rows b_k + i*kBStep
// (a warp reads 32 consecutive output pixels).
template <typename E, int BM, int BN, int BK, int kThreads>
struct TileLoader {
  static constexpr int kAStep = kThreads / BK, kAIters = BM / kAStep;
  static constexpr int kBStep = kThreads / BN, kBIters = BK / kBStep;
  static_assert(kThreads % BK == 0 && BM % kAStep == 0, "A tile split");
  static_assert(kThreads % BN == 0 && BK % kBStep == 0, "B tile split");

  int a_k, a_m, b_j, b_k;
  int a_rows;        // rows i < a_rows are filters < K
  int64_t a_off;     // w index of (filter m0 + a_m, kk = a_k)
  int64_t a_stride;  // w index step between a thread's rows
  Column col;
  E a[kAIters], b[kBIters];

  __device__ __forceinline__ TileLoader(const ConvParams& p, int tid, int64_t g, int64_t m0,
                                        int64_t col0) {
    a_k = tid % BK, a_m = tid / BK;
    b_j = tid % BN, b_k = tid / BN;
    const int64_t row = m0 + a_m;
    // ceil((K - row) / kAStep) clamped to [0, kAIters]; C++ division truncates to 0.
    const int64_t rows = (p.k - row + kAStep - 1) / kAStep;
    a_rows = static_cast<int>(rows < 0 ? 0 : (rows > kAIters ? kAIters : rows));
    a_off = g * p.k * p.kdim + row * p.kdim + a_k;
    a_stride = int64_t{kAStep} * p.kdim;
    col = decode_column(p, g, col0 + b_j);
  }

  // Tile kt; taps: its BK rows.
  __device__ __forceinline__ void load(const ConvParams& p, const E* __restrict__ x,
                                       const E* __restrict__ w, int64_t kt, const Tap* taps) {
    const int64_t k0 = kt * BK;
    const bool k_ok = k0 + a_k < p.kdim;
    int64_t ai = a_off + k0;
#pragma unroll
    for (int i = 0; i < kAIters; ++i, ai += a_stride) a[i] = k_ok && i < a_rows ? w[ai] : E(0);
#pragma unroll
    for (int i = 0; i < kBIters; ++i) {
      const Tap t = load_tap(taps + b_k + i * kBStep);
      b[i] = inside(p, col, t) ? x[col.x_off + t.delta] : E(0);
    }
  }
};

// ------------------------------------------------------------------ float16 / bfloat16

// Two blocks per SM (128 registers a thread, no spills): a 128 x 64 tile keeps the
// accumulators at 32 registers a thread; 128 x 128 needs 165 registers (one block per
// SM) and spills when capped at 128.
struct TcConfig {
  static constexpr int kBM = 128, kBN = 64, kBK = 32, kThreads = 256, kMinBlocks = 2;
  static constexpr int kWarpM = 64, kWarpN = 16;  // warps: 2 (filters) x 4 (pixels)
  static constexpr int kWarpsN = kBN / kWarpN;
  static constexpr int kFragM = kWarpM / 16, kFragN = kWarpN / 8;
  // Row pitches (elements): 80 and 144 bytes, multiples of 16 (ldmatrix rows) whose
  // 8-row ldmatrix phases fall on distinct banks.
  static constexpr int kALd = kBK + 8;  // A stage: [kBM][kALd], kk contiguous
  static constexpr int kBLd = kBN + 8;  // B stage: [kBK][kBLd], pixels contiguous
  static constexpr int kCLd = kBN + 8;  // output staging: [kBM][kCLd]
  static constexpr int kAStage = kBM * kALd, kBStage = kBK * kBLd;
  static constexpr int kTileElems = 2 * kAStage + 2 * kBStage;
  static constexpr int kSmemElems = std::max(kTileElems, kBM * kCLd);
  static_assert(kBK % 16 == 0 && kWarpM % 16 == 0 && kWarpN % 16 == 0, "mma shape");
  static_assert((kBM / kWarpM) * kWarpsN * 32 == kThreads, "warp layout");
};

struct TcShared {
  alignas(16) uint16_t tiles[TcConfig::kSmemElems];  // 2 A stages, 2 B stages; then C
  Tap taps[2][TcConfig::kBK];
};

// Round to nearest even (NaN stays NaN, its payload may differ from numeric.h's).
template <bool kBf16>
__device__ __forceinline__ uint16_t round_b16(float v) {
  if constexpr (kBf16) {
    return __bfloat16_as_ushort(__float2bfloat16_rn(v));
  } else {
    return __half_as_ushort(__float2half_rn(v));
  }
}

// One BK-deep step over a stage: warp (wm, wn) updates its 64 x 32 accumulators.
template <bool kBf16>
__device__ __forceinline__ void tc_compute(
    const uint16_t* as, const uint16_t* bs, int lane, int wm, int wn,
    float (&acc)[TcConfig::kFragM][TcConfig::kFragN][4]) {
  using C = TcConfig;
#pragma unroll
  for (int ks = 0; ks < C::kBK; ks += 16) {
    uint32_t af[C::kFragM][4], bf[C::kFragN][2];
    // A 16 x 16 at (row0, ks): lanes 0-15 address rows 0-15 at column ks, lanes 16-31
    // the same rows at ks + 8; registers 0..3 = (rows 0-7, k 0-7), (8-15, 0-7),
    // (0-7, 8-15), (8-15, 8-15): the m16n8k16 A fragment.
#pragma unroll
    for (int mi = 0; mi < C::kFragM; ++mi) {
      const uint16_t* row = as + (wm * C::kWarpM + mi * 16 + (lane & 15)) * C::kALd + ks;
      ptx::ldmatrix_x4(af[mi], ptx::shared_address(row + (lane >> 4) * 8));
    }
    // B 16 x 16 (k x pixels) at (ks, col0), stored k-major, transposed on load: lanes
    // 0-7 address k rows 0-7 at col0, 8-15 rows 8-15 at col0, 16-23 rows 0-7 at col0 + 8,
    // 24-31 rows 8-15 at col0 + 8; registers 0, 1 = fragment of pixels col0..+7,
    // registers 2, 3 = of col0 + 8..+15.
#pragma unroll
    for (int nj = 0; nj < C::kFragN / 2; ++nj) {
      uint32_t r[4];
      const uint16_t* row = bs + (ks + (lane & 7) + ((lane >> 3) & 1) * 8) * C::kBLd;
      ptx::ldmatrix_x4_trans(
          r, ptx::shared_address(row + wn * C::kWarpN + nj * 16 + (lane >> 4) * 8));
      bf[2 * nj][0] = r[0], bf[2 * nj][1] = r[1];
      bf[2 * nj + 1][0] = r[2], bf[2 * nj + 1][1] = r[3];
    }
#pragma unroll
    for (int mi = 0; mi < C::kFragM; ++mi)
#pragma unroll
      for (int ni = 0; ni < C::kFragN; ++ni)
        ptx::mma_m16n8k16<kBf16>(acc[mi][ni], af[mi], bf[ni]);
  }
}

// One block: filters m0.. m0+127 by pixels col0 .. col0+127 of group g.
template <bool kBf16>
__device__ __forceinline__ void conv_tc_block(TcShared& sm, const ConvParams& p,
                                              const uint16_t* __restrict__ x,
                                              const uint16_t* __restrict__ w,
                                              uint16_t* __restrict__ out, int tid, int64_t g,
                                              int64_t m0, int64_t col0) {
  using C = TcConfig;
  using Loader = TileLoader<uint16_t, C::kBM, C::kBN, C::kBK, C::kThreads>;
  const int lane = tid & 31, warp = tid >> 5;
  const int wm = warp / C::kWarpsN, wn = warp % C::kWarpsN;

  Loader ld(p, tid, g, m0, col0);
  float acc[C::kFragM][C::kFragN][4];
#pragma unroll
  for (int mi = 0; mi < C::kFragM; ++mi)
#pragma unroll
    for (int ni = 0; ni < C::kFragN; ++ni)
#pragma unroll
      for (int e = 0; e < 4; ++e) acc[mi][ni][e] = 0.0f;

  auto stage_a = [&](int buf) { return sm.tiles + buf * C::kAStage; };
  auto stage_b = [&](int buf) { return sm.tiles + 2 * C::kAStage + buf * C::kBStage; };
  auto store = [&](int buf) {
    uint16_t* as = stage_a(buf);
    uint16_t* bs = stage_b(buf);
#pragma unroll
    for (int i = 0; i < Loader::kAIters; ++i)
      as[(ld.a_m + i * Loader::kAStep) * C::kALd + ld.a_k] = ld.a[i];
#pragma unroll
    for (int i = 0; i < Loader::kBIters; ++i)
      bs[(ld.b_k + i * Loader::kBStep) * C::kBLd + ld.b_j] = ld.b[i];
  };

  const int64_t tiles = (p.kdim + C::kBK - 1) / C::kBK;
  if (tiles > 0) {
    // taps[t & 1] holds tile t's rows: written two tiles ahead, read by the loads one
    // tile ahead, one barrier in between either way.
    TapWalker walker;
    if (tid < C::kBK) {
      walker.start(p, tid);
      sm.taps[0][tid] = walker.tap(p);
      walker.next<C::kBK>(p);
      sm.taps[1][tid] = walker.tap(p);
      walker.next<C::kBK>(p);
    }
    __syncthreads();
    ld.load(p, x, w, 0, sm.taps[0]);
    store(0);
    __syncthreads();
    for (int64_t kt = 0; kt < tiles; ++kt) {
      const int buf = static_cast<int>(kt & 1);
      const bool more = kt + 1 < tiles;
      if (more) ld.load(p, x, w, kt + 1, sm.taps[buf ^ 1]);  // in flight during the math
      if (tid < C::kBK) {                                    // tile kt + 2's rows
        sm.taps[buf][tid] = walker.tap(p);
        walker.next<C::kBK>(p);
      }
      tc_compute<kBf16>(stage_a(buf), stage_b(buf), lane, wm, wn, acc);
      if (more) store(buf ^ 1);  // that stage was last read before the previous barrier
      __syncthreads();
    }
  }

  // Epilogue: round, stage the kBM x kBN tile in shared memory (after the loop's last
  // barrier, or untouched when there were no tiles), then each thread stores column b_j
  // of every other row: a warp writes 32 consecutive pixels of one filter.
  uint16_t* cs = sm.tiles;
#pragma unroll
  for (int mi = 0; mi < C::kFragM; ++mi)
#pragma unroll
    for (int ni = 0; ni < C::kFragN; ++ni) {
      const int row = wm * C::kWarpM + mi * 16 + (lane >> 2);
      const int cc = wn * C::kWarpN + ni * 8 + (lane & 3) * 2;
      cs[row * C::kCLd + cc] = round_b16<kBf16>(acc[mi][ni][0]);
      cs[row * C::kCLd + cc + 1] = round_b16<kBf16>(acc[mi][ni][1]);
      cs[(row + 8) * C::kCLd + cc] = round_b16<kBf16>(acc[mi][ni][2]);
      cs[(row + 8) * C::kCLd + cc + 1] = round_b16<kBf16>(acc[mi][ni][3]);
    }
  __syncthreads();
  if (ld.col.valid) {
    int64_t o = ld.col.out_off + (m0 + ld.b_k) * p.pq;
    const int64_t o_step = int64_t{Loader::kBStep} * p.pq;
#pragma unroll 8
    for (int i = 0; i < C::kBM / Loader::kBStep; ++i, o += o_step) {
      const int m = ld.b_k + i * Loader::kBStep;
      if (m0 + m < p.k) out[o] = cs[m * C::kCLd + ld.b_j];
    }
  }
}

template <bool kBf16>
__global__ void __launch_bounds__(TcConfig::kThreads, TcConfig::kMinBlocks)
    conv2d_tc_kernel(const ConvParams p, const uint16_t* __restrict__ x,
                     const uint16_t* __restrict__ w, uint16_t* __restrict__ out,
                     int64_t col_tile0, int64_t m_tile0, int64_t g0) {
  OXIJAX_SHARED(TcShared, sm, , alignof(TcShared));
  conv_tc_block<kBf16>(sm, p, x, w, out, static_cast<int>(threadIdx.x), g0 + blockIdx.z,
                       (m_tile0 + blockIdx.y) * TcConfig::kBM,
                       (col_tile0 + blockIdx.x) * TcConfig::kBN);
}

// ------------------------------------------------------------------ float32 / float64

template <typename E, int BM, int BN, int BK, int TM, int TN>
struct SimtConfig {
  using T = E;
  static constexpr int kBM = BM, kBN = BN, kBK = BK, kTM = TM, kTN = TN;
  static constexpr int kThreadsN = BN / TN, kThreads = (BM / TM) * kThreadsN;
  static constexpr int kMinBlocks = 2;  // per SM: at most 128 registers a thread
  // A thread owns rows {ty*V.., BM/2 + ty*V..} and columns {tx*V.., BN/2 + tx*V..}:
  // two 16-byte shared loads per operand per k, conflict-free.
  static constexpr int kVec = 16 / static_cast<int>(sizeof(E));
  static_assert(TM == 2 * kVec && TN == 2 * kVec, "thread tile = two 16-byte vectors");
  static constexpr int kALd = BM + kVec;  // A stage: [BK][kALd], filters contiguous
  static constexpr int kBLd = BN + kVec;  // B stage: [BK][kBLd], pixels contiguous
};
using SimtFloat = SimtConfig<float, 128, 128, 8, 8, 8>;
using SimtDouble = SimtConfig<double, 64, 64, 8, 4, 4>;

template <class Cfg>
struct SimtShared {
  using T = typename Cfg::T;
  alignas(16) T a[2][Cfg::kBK][Cfg::kALd];
  alignas(16) T b[2][Cfg::kBK][Cfg::kBLd];
  Tap taps[2][Cfg::kBK];
};

__device__ __forceinline__ void load16(const float* src, float* dst) {
  const float4 v = *reinterpret_cast<const float4*>(src);
  dst[0] = v.x, dst[1] = v.y, dst[2] = v.z, dst[3] = v.w;
}
__device__ __forceinline__ void load16(const double* src, double* dst) {
  const double2 v = *reinterpret_cast<const double2*>(src);
  dst[0] = v.x, dst[1] = v.y;
}
__device__ __forceinline__ float fmadd(float a, float b, float c) { return fmaf(a, b, c); }
__device__ __forceinline__ double fmadd(double a, double b, double c) { return fma(a, b, c); }

template <class Cfg>
__device__ __forceinline__ void conv_simt_block(SimtShared<Cfg>& sm, const ConvParams& p,
                                                const typename Cfg::T* __restrict__ x,
                                                const typename Cfg::T* __restrict__ w,
                                                typename Cfg::T* __restrict__ out, int tid,
                                                int64_t g, int64_t m0, int64_t col0) {
  using T = typename Cfg::T;
  constexpr int BM = Cfg::kBM, BN = Cfg::kBN, BK = Cfg::kBK, TM = Cfg::kTM, TN = Cfg::kTN;
  constexpr int V = Cfg::kVec;
  using Loader = TileLoader<T, BM, BN, BK, Cfg::kThreads>;
  const int tx = tid % Cfg::kThreadsN, ty = tid / Cfg::kThreadsN;

  Loader ld(p, tid, g, m0, col0);
  T acc[TM][TN];
#pragma unroll
  for (int i = 0; i < TM; ++i)
#pragma unroll
    for (int j = 0; j < TN; ++j) acc[i][j] = T(0);

  auto store = [&](int buf) {
#pragma unroll
    for (int i = 0; i < Loader::kAIters; ++i) sm.a[buf][ld.a_k][ld.a_m + i * Loader::kAStep] = ld.a[i];
#pragma unroll
    for (int i = 0; i < Loader::kBIters; ++i) sm.b[buf][ld.b_k + i * Loader::kBStep][ld.b_j] = ld.b[i];
  };
  auto compute = [&](int buf) {
#pragma unroll
    for (int k = 0; k < BK; ++k) {
      T a[TM], b[TN];
      load16(&sm.a[buf][k][ty * V], a);
      load16(&sm.a[buf][k][BM / 2 + ty * V], a + V);
      load16(&sm.b[buf][k][tx * V], b);
      load16(&sm.b[buf][k][BN / 2 + tx * V], b + V);
#pragma unroll
      for (int i = 0; i < TM; ++i)
#pragma unroll
        for (int j = 0; j < TN; ++j) acc[i][j] = fmadd(a[i], b[j], acc[i][j]);
    }
  };

  const int64_t tiles = (p.kdim + BK - 1) / BK;
  if (tiles > 0) {  // the pipeline of conv_tc_block
    TapWalker walker;
    if (tid < BK) {
      walker.start(p, tid);
      sm.taps[0][tid] = walker.tap(p);
      walker.next<BK>(p);
      sm.taps[1][tid] = walker.tap(p);
      walker.next<BK>(p);
    }
    __syncthreads();
    ld.load(p, x, w, 0, sm.taps[0]);
    store(0);
    __syncthreads();
    for (int64_t kt = 0; kt < tiles; ++kt) {
      const int buf = static_cast<int>(kt & 1);
      const bool more = kt + 1 < tiles;
      if (more) ld.load(p, x, w, kt + 1, sm.taps[buf ^ 1]);
      if (tid < BK) {
        sm.taps[buf][tid] = walker.tap(p);
        walker.next<BK>(p);
      }
      compute(buf);
      if (more) store(buf ^ 1);
      __syncthreads();
    }
  }

  // Epilogue, straight from registers: out offsets of the thread's TN columns (two runs
  // of V consecutive pixels), then its TM rows.
  int64_t o_col[TN];
  bool c_ok[TN];
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int64_t j = col0 + h * (BN / 2) + tx * V;
    int64_t n = j < p.cols ? j / p.pq : 0;
    int64_t pq = j < p.cols ? j - n * p.pq : 0;
#pragma unroll
    for (int v = 0; v < V; ++v) {
      c_ok[h * V + v] = j + v < p.cols;
      o_col[h * V + v] = (g * p.n + n) * p.k * p.pq + pq;
      if (++pq == p.pq) pq = 0, ++n;
    }
  }
#pragma unroll
  for (int i = 0; i < TM; ++i) {
    const int64_t m = m0 + (i / V) * (BM / 2) + ty * V + i % V;
    if (m < p.k) {
#pragma unroll
      for (int j = 0; j < TN; ++j)
        if (c_ok[j]) out[o_col[j] + m * p.pq] = acc[i][j];
    }
  }
}

template <class Cfg>
__global__ void __launch_bounds__(Cfg::kThreads, Cfg::kMinBlocks)
    conv2d_simt_kernel(const ConvParams p, const typename Cfg::T* __restrict__ x,
                       const typename Cfg::T* __restrict__ w, typename Cfg::T* __restrict__ out,
                       int64_t col_tile0, int64_t m_tile0, int64_t g0) {
  OXIJAX_SHARED(SimtShared<Cfg>, sm, , alignof(SimtShared<Cfg>));
  conv_simt_block<Cfg>(sm, p, x, w, out, static_cast<int>(threadIdx.x), g0 + blockIdx.z,
                       (m_tile0 + blockIdx.y) * Cfg::kBM, (col_tile0 + blockIdx.x) * Cfg::kBN);
}

// ------------------------------------------------------------------ host side

// False when the shape is past the 32-bit bounds tests' limits.
bool make_params(const ConvShape& s, int bk, ConvParams& p) {
  if (s.h >= kMaxExtent || s.w >= kMaxExtent || s.r >= kMaxExtent || s.s >= kMaxExtent)
    return false;
  p = ConvParams{};
  p.n = s.n, p.c = s.c, p.k = s.k;
  p.q = s.q, p.pq = s.p * s.q, p.hw = s.h * s.w;
  p.rs = s.r * s.s, p.kdim = s.c * p.rs, p.cols = s.n * p.pq;
  p.stride_h = s.stride_h, p.stride_w = s.stride_w, p.pad_h = s.pad_h, p.pad_w = s.pad_w;
  p.h = static_cast<int>(s.h), p.w = static_cast<int>(s.w);
  p.r = static_cast<int>(s.r), p.s = static_cast<int>(s.s);
  if (p.rs > 0) {
    p.step_c = bk / p.rs;
    const int64_t rem = bk % p.rs;
    p.step_r = static_cast<int>(rem / s.s), p.step_s = static_cast<int>(rem % s.s);
  }
  return true;
}

// Launches kernel over (pixel tiles, filter tiles, groups), split where a grid
// dimension would pass its limit.
template <typename E, typename Kernel>
cudaError_t launch_tiles(cudaStream_t stream, Kernel kernel, int threads, int bm, int bn,
                         const ConvParams& p, int64_t groups, const E* x, const E* w, E* out) {
  constexpr int64_t kMaxX = INT_MAX, kMaxYZ = 65535;
  const int64_t col_tiles = (p.cols + bn - 1) / bn, m_tiles = (p.k + bm - 1) / bm;
  for (int64_t g0 = 0; g0 < groups; g0 += kMaxYZ)
    for (int64_t m0 = 0; m0 < m_tiles; m0 += kMaxYZ)
      for (int64_t c0 = 0; c0 < col_tiles; c0 += kMaxX) {
        const dim3 grid(static_cast<unsigned>(std::min(kMaxX, col_tiles - c0)),
                        static_cast<unsigned>(std::min(kMaxYZ, m_tiles - m0)),
                        static_cast<unsigned>(std::min(kMaxYZ, groups - g0)));
        if (const cudaError_t err = launch(kernel, grid, threads, 0, stream, p, x, w, out, c0,
                                           m0, g0);
            err != cudaSuccess)
          return err;
      }
  return cudaSuccess;
}

}  // namespace

template <typename T>
cudaError_t conv2d(cudaStream_t stream, const ConvShape& s, const T* x, const T* w, T* out) {
  if (s.groups <= 0 || s.n <= 0 || s.k <= 0 || s.p <= 0 || s.q <= 0) return cudaSuccess;
  ConvParams p;
  if constexpr (std::is_same_v<T, oxijax::half> || std::is_same_v<T, oxijax::bfloat16>) {
    using C = TcConfig;
    if (!make_params(s, C::kBK, p)) return cudaErrorInvalidValue;
    constexpr bool kBf16 = std::is_same_v<T, oxijax::bfloat16>;
    return launch_tiles(stream, conv2d_tc_kernel<kBf16>, C::kThreads, C::kBM, C::kBN, p,
                        s.groups, reinterpret_cast<const uint16_t*>(x),
                        reinterpret_cast<const uint16_t*>(w), reinterpret_cast<uint16_t*>(out));
  } else {
    using Cfg = std::conditional_t<std::is_same_v<T, double>, SimtDouble, SimtFloat>;
    static_assert(std::is_same_v<T, typename Cfg::T>, "conv2d: float32 or float64");
    if (!make_params(s, Cfg::kBK, p)) return cudaErrorInvalidValue;
    return launch_tiles(stream, conv2d_simt_kernel<Cfg>, Cfg::kThreads, Cfg::kBM, Cfg::kBN, p,
                        s.groups, x, w, out);
  }
}

template cudaError_t conv2d<oxijax::half>(cudaStream_t, const ConvShape&, const oxijax::half*,
                                          const oxijax::half*, oxijax::half*);
template cudaError_t conv2d<oxijax::bfloat16>(cudaStream_t, const ConvShape&,
                                              const oxijax::bfloat16*, const oxijax::bfloat16*,
                                              oxijax::bfloat16*);
template cudaError_t conv2d<float>(cudaStream_t, const ConvShape&, const float*, const float*,
                                   float*);
template cudaError_t conv2d<double>(cudaStream_t, const ConvShape&, const double*,
                                    const double*, double*);

}  // namespace oxijax::cuda
