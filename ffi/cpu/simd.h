// The CPU attention kernels' SIMD layer (forward, JVP and backward): GCC/Clang vector
// extensions sized to the target (explicit FMA, NaN-keeping max / min and a vectorised
// exp2 on x86), compile-time dispatch on small tile sizes, the attention blocking and
// the register-tiled products all three share, and the query-block task loop (operands
// in the compute type and scratch memory: attention_rows.h). (vector_math.h builds the
// elementwise kernels' math on its vector types and max / min.)
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <type_traits>

#include "oxijax/numeric.h"
#include "parallel.h"

#if defined(__SSE2__)
#include <immintrin.h>
#endif

namespace oxijax::cpu::simd {

// ---------------------------------------------------------------------------------
// A minimal SIMD layer on GCC/Clang vector extensions (portable: any target gets a
// correct build; x86 gets explicit FMA).

#if defined(__AVX512F__)
constexpr int kVecBytes = 64;
constexpr int kRegs = 32;
#elif defined(__AVX__)
constexpr int kVecBytes = 32;
constexpr int kRegs = 16;
#else
constexpr int kVecBytes = 16;
constexpr int kRegs = 16;
#endif

typedef float VecF __attribute__((vector_size(kVecBytes)));
typedef double VecD __attribute__((vector_size(kVecBytes)));
typedef int32_t VecI __attribute__((vector_size(kVecBytes)));

template <typename A> struct Simd;
template <> struct Simd<float> { using V = VecF; };
template <> struct Simd<double> { using V = VecD; };

template <typename A> using Vec = typename Simd<A>::V;
template <typename A> constexpr int kLanes = kVecBytes / int(sizeof(A));

// Unaligned vector loads and stores (an under-aligned, may_alias vector type: plain
// vmovups, and the values stay in registers where memcpy can bounce them via the stack).
// Byte-aligned: vectors of 16-bit lanes load from any element of a half-type array.
template <typename V> struct Unaligned {
  typedef V type __attribute__((aligned(1), may_alias));
};
template <typename V> inline V vload(const void* p) {
  return *static_cast<const typename Unaligned<V>::type*>(p);
}
template <typename V> inline void vstore(void* p, V v) {
  *static_cast<typename Unaligned<V>::type*>(p) = v;
}
template <typename V> struct ElemOf;
template <> struct ElemOf<VecF> { using type = float; };
template <> struct ElemOf<VecD> { using type = double; };

// All lanes = x.
template <typename V> inline V splat(typename ElemOf<V>::type x) {
  if constexpr (std::is_same_v<V, VecF>) {
#if defined(__AVX512F__)
    return _mm512_set1_ps(x);
#elif defined(__AVX__)
    return _mm256_set1_ps(x);
#else
    return x - VecF{};  // x - (+0) == x exactly, signed zeros included
#endif
  } else {
#if defined(__AVX512F__)
    return _mm512_set1_pd(x);
#elif defined(__AVX__)
    return _mm256_set1_pd(x);
#else
    return x - VecD{};
#endif
  }
}

// a * b + c, fused where the target has FMA.
inline VecF vfma(VecF a, VecF b, VecF c) {
#if defined(__AVX512F__)
  return _mm512_fmadd_ps(a, b, c);
#elif defined(__FMA__) && defined(__AVX__)
  return _mm256_fmadd_ps(a, b, c);
#else
  return a * b + c;
#endif
}
inline VecD vfma(VecD a, VecD b, VecD c) {
#if defined(__AVX512F__)
  return _mm512_fmadd_pd(a, b, c);
#elif defined(__FMA__) && defined(__AVX__)
  return _mm256_fmadd_pd(a, b, c);
#else
  return a * b + c;
#endif
}

// a > b ? a : b (kMax) or a < b ? a : b, b where either is NaN, on float or double
// vectors of 16, 32 or 64 bytes (narrower ones than VecF / VecD fold short rows in wide
// builds): x86's max / min instructions (one instruction where the plain ?: is a compare
// and a blend). The AVX-512 maskz_ forms with a full mask are the plain instructions; they
// avoid GCC 12's bogus -Wmaybe-uninitialized on _mm512_undefined_* in the unmasked ones.
template <bool kMax, typename V> inline V extremum_or_second(V a, V b) {
  [[maybe_unused]] constexpr bool kFloat = std::is_same_v<std::decay_t<decltype(a[0])>, float>;
#if defined(__AVX512F__)
  if constexpr (sizeof(V) == 64) {
    if constexpr (kFloat)
      return kMax ? _mm512_maskz_max_ps(0xffff, a, b) : _mm512_maskz_min_ps(0xffff, a, b);
    else
      return kMax ? _mm512_maskz_max_pd(0xff, a, b) : _mm512_maskz_min_pd(0xff, a, b);
  }
#endif
#if defined(__AVX__)
  if constexpr (sizeof(V) == 32) {
    if constexpr (kFloat) return kMax ? _mm256_max_ps(a, b) : _mm256_min_ps(a, b);
    else return kMax ? _mm256_max_pd(a, b) : _mm256_min_pd(a, b);
  }
#endif
#if defined(__SSE2__)
  if constexpr (sizeof(V) == 16) {
    if constexpr (kFloat) return kMax ? _mm_max_ps(a, b) : _mm_min_ps(a, b);
    else return kMax ? _mm_max_pd(a, b) : _mm_min_pd(a, b);
  }
#endif
  return (kMax ? a > b : a < b) ? a : b;
}
template <typename V> inline V max_or_second(V a, V b) { return extremum_or_second<true>(a, b); }
template <typename V> inline V min_or_second(V a, V b) { return extremum_or_second<false>(a, b); }

// x clamped to [lo, hi], a NaN x kept.
template <typename V> inline V clamp(V x, V lo, V hi) {
  return min_or_second(hi, max_or_second(lo, x));
}

// 2^x for the softmax arguments of the attention kernels (a score minus its row's max
// or log-sum-exp, in base 2: x <= 0 up to rounding). Split x = n + r, n = round(x), |r|
// <= 1/2 (exact), a polynomial for 2^r, times 2^n built in the exponent bits. x is
// first clamped so that n spans one step past the normal exponents at both ends, where
// the bits of 2^n are 0 (2^x < 2^-126.5 flushes to 0: an absolute error next to a
// softmax sum >= 1 or a probability of 1) and inf (2^x > 2^127.5 overflows, a little
// early). So exp2(-inf) = 0 exactly, and a NaN x stays NaN through p * 2^n.
// float: SLEEF's exp2f polynomial (<= 0.84 ulp on [-1/2, 1/2], measured).
inline VecF vexp2(VecF x) {
  const auto poly = [](VecF r) {
    VecF p = splat<VecF>(1.535920892e-4f);
    p = vfma(p, r, splat<VecF>(1.339262701e-3f));
    p = vfma(p, r, splat<VecF>(9.618384764e-3f));
    p = vfma(p, r, splat<VecF>(5.550347269e-2f));
    p = vfma(p, r, splat<VecF>(2.402264476e-1f));
    p = vfma(p, r, splat<VecF>(6.931471825e-1f));
    return vfma(p, r, splat<VecF>(1.0f));
  };
#if defined(__AVX512F__)
  constexpr __mmask16 all = 0xffff;  // see max_or_second
  // Out there 2^x is 0 or inf after the scaling.
  x = clamp(x, splat<VecF>(-152.0f), splat<VecF>(129.0f));
  const VecF n = _mm512_maskz_roundscale_ps(all, x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  return _mm512_maskz_scalef_ps(all, poly(x - n), n);
#else
  x = clamp(x, splat<VecF>(-127.0f), splat<VecF>(128.0f));
  const VecF magic = splat<VecF>(12582912.0f);  // 1.5 * 2^23: rounds to an integer
  const VecF t = x + magic;
  // 2^n, n in [-127, 128]: the low bits of t hold n, its others shift out.
  const VecF scale = reinterpret_cast<VecF>((reinterpret_cast<VecI>(t) << 23) + (127 << 23));
  return poly(x - (t - magic)) * scale;
#endif
}

// The same for double lanes: e^(r ln2) by its Taylor series to degree 13 (truncation <
// 1e-17 relative for |r ln2| <= ln2/2; ~1 ulp); 0 below 2^-1022.5, inf above 2^1023.5.
inline VecD vexp2(VecD x) {
  const auto poly = [](VecD r) {
    constexpr double c[] = {1.0 / 6227020800.0, 1.0 / 479001600.0, 1.0 / 39916800.0,
                            1.0 / 3628800.0,    1.0 / 362880.0,    1.0 / 40320.0,
                            1.0 / 5040.0,       1.0 / 720.0,       1.0 / 120.0,
                            1.0 / 24.0,         1.0 / 6.0,         0.5,
                            1.0,                1.0};
    const VecD u = r * splat<VecD>(0.69314718055994530942);
    VecD p = splat<VecD>(c[0]);
    for (int i = 1; i < 14; ++i) p = vfma(p, u, splat<VecD>(c[i]));
    return p;
  };
#if defined(__AVX512F__)
  constexpr __mmask8 all = 0xff;
  x = clamp(x, splat<VecD>(-1080.0), splat<VecD>(1025.0));
  const VecD n = _mm512_maskz_roundscale_pd(all, x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  return _mm512_maskz_scalef_pd(all, poly(x - n), n);
#else
  typedef int64_t VecL __attribute__((vector_size(kVecBytes)));
  x = clamp(x, splat<VecD>(-1023.0), splat<VecD>(1024.0));
  const VecD magic = splat<VecD>(6755399441055744.0);  // 1.5 * 2^52
  const VecD t = x + magic;
  const VecD scale =
      reinterpret_cast<VecD>((reinterpret_cast<VecL>(t) << 52) + (int64_t{1023} << 52));
  return poly(x - (t - magic)) * scale;
#endif
}

// Calls f(std::integral_constant<int, n>) for a runtime 1 <= n <= N.
template <int N, typename F> inline void dispatch(int n, F&& f) {
  if constexpr (N >= 1) {
    if (n == N) {
      f(std::integral_constant<int, N>{});
      return;
    }
    dispatch<N - 1>(n, f);
  }
}

// ---------------------------------------------------------------------------------
// Attention blocking, shared by the forward, backward and JVP kernels.

// Query rows per block: a whole number of vectors on every target and of head-dim tile
// rows (HeadDimTile). Keys per block: a whole number of query-lane tile rows
// (QueryLaneTile). With D = 64 a block pair's working set (the transposed query block,
// a 48 x 64 accumulator, the 96 x 48 score tile, 96 keys and values: 12 + 12 + 18 + 24
// + 24 KB in float) stays in L2, and each product's tile operands in L1.
constexpr int64_t kQueryBlock = 48;
constexpr int64_t kKeyBlock = 96;

// The kernels' softmax works in base 2: scores are scaled by log2(e) with the softmax
// scale (folded into the query block), so the weights are exp2(s - max) (vexp2, no
// range reduction by ln 2), and lse converts between bases at the edges.
constexpr double kLog2e = 1.44269504088896340736;
constexpr double kLn2 = 0.69314718055994530942;

// ---------------------------------------------------------------------------------
// Register-tiled products. Every product of the attention kernels has one shape,
//   c[r][:] (+)= sum_{k < n} a(r, k) * b[k][:],
// with b's rows loaded as whole vectors and a's values broadcast, a either row-major,
// a(r, k) = a[r * lda + k], or column-major, a(r, k) = a[r + k * lda] (a transposed
// score tile S^T [key][query lane] read by query rows).
// A tile keeps R x NV accumulators in registers; per k it loads NV vectors of b and
// broadcasts R values of a: R x NV independent FMA chains, more than the two FMA
// ports x 4 cycles of latency need, in R x NV + NV + 1 registers.

// Tile shapes: along the head dim (64 = 4 AVX-512 / 8 AVX2 vectors) and along the
// kQueryBlock query lanes of a block (3 / 6 vectors).
struct HeadDimTile {
  static constexpr int kRows = 6;
  static constexpr int kVecs = kRegs >= 32 ? 4 : 2;
};
struct QueryLaneTile {
  static constexpr int kRows = kRegs >= 32 ? 8 : 6;
  static constexpr int kVecs = kRegs >= 32 ? 3 : 2;
};

// One tile; n >= 1 (a do-while: no zero-trip path, across which GCC would keep the
// accumulators in memory).
template <typename A, int R, int NV, bool Accumulate, bool ColMajorA>
[[gnu::noinline]] void product_tile(const A* __restrict a, int64_t lda, int64_t n,
                                    const A* __restrict b, int64_t ldb, A* __restrict c,
                                    int64_t ldc) {
  using V = Vec<A>;
  constexpr int W = kLanes<A>;
  V acc[R][NV];
  for (int r = 0; r < R; ++r)
    for (int v = 0; v < NV; ++v) acc[r][v] = Accumulate ? vload<V>(c + r * ldc + v * W) : V{};
  int64_t k = 0;
  do {
    V bv[NV];
    for (int v = 0; v < NV; ++v) bv[v] = vload<V>(b + k * ldb + v * W);
    for (int r = 0; r < R; ++r) {
      const V ar = splat<V>(ColMajorA ? a[r + k * lda] : a[r * lda + k]);
      for (int v = 0; v < NV; ++v) acc[r][v] = vfma(bv[v], ar, acc[r][v]);
    }
  } while (++k < n);
  for (int r = 0; r < R; ++r)
    for (int v = 0; v < NV; ++v) vstore(c + r * ldc + v * W, acc[r][v]);
}

// The product over `rows` rows and `vecs` vectors of columns in Tile-shaped tiles (the
// edges in smaller ones). Column strips outermost: a strip of b (n x Tile::kVecs
// vectors) stays in L1 while the row tiles stream a past it.
template <typename A, typename Tile, bool Accumulate, bool ColMajorA>
void product(int64_t rows, int64_t vecs, int64_t n, const A* a, int64_t lda, const A* b,
             int64_t ldb, A* c, int64_t ldc) {
  constexpr int W = kLanes<A>;
  if (n <= 0) {  // an empty sum
    if (!Accumulate)
      for (int64_t r = 0; r < rows; ++r) std::fill(c + r * ldc, c + r * ldc + vecs * W, A(0));
    return;
  }
  for (int64_t v0 = 0; v0 < vecs; v0 += Tile::kVecs) {
    dispatch<Tile::kVecs>(int(std::min<int64_t>(Tile::kVecs, vecs - v0)), [&](auto nv) {
      constexpr int NV = decltype(nv)::value;
      const auto tile = [&](auto nr, int64_t r) {
        product_tile<A, decltype(nr)::value, NV, Accumulate, ColMajorA>(
            a + (ColMajorA ? r : r * lda), lda, n, b + v0 * W, ldb, c + r * ldc + v0 * W, ldc);
      };
      int64_t r = 0;
      for (; r + Tile::kRows <= rows; r += Tile::kRows)
        tile(std::integral_constant<int, Tile::kRows>{}, r);
      if (r < rows) dispatch<Tile::kRows - 1>(int(rows - r), [&](auto nr) { tile(nr, r); });
    });
  }
}

// ---------------------------------------------------------------------------------
// Calls block(h, i0, rows, ws) for every (batch*head h, block of up to bq query rows
// from i0) on par, with one scratch ws = make_ws() per chunk of tasks. Cheap and
// expensive (causal) query blocks are interleaved so that any contiguous run of tasks
// carries a balanced amount of work.
template <typename MakeWorkspace, typename Block>
void for_query_blocks(const Parallel& par, int64_t bh, int64_t sq, int64_t bq,
                      MakeWorkspace make_ws, Block block) {
  const int64_t nqb = (sq + bq - 1) / bq;
  par.for_range(bh * nqb, 1, [&](int64_t t0, int64_t t1) {
    auto ws = make_ws();
    for (int64_t t = t0; t < t1; ++t) {
      const int64_t h = t / nqb, r = t % nqb;
      const int64_t i0 = ((r % 2 == 0) ? r / 2 : nqb - 1 - r / 2) * bq;
      block(h, i0, std::min(bq, sq - i0), ws);
    }
  });
}

}  // namespace oxijax::cpu::simd
