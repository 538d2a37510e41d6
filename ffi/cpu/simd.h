// The CPU attention kernels' SIMD layer (forward, JVP and backward): GCC/Clang vector
// extensions sized to the target (explicit FMA and a vectorised exp on x86), compile-time
// dispatch on small tile sizes, the query-lane products they share, 64-byte aligned
// scratch buffers and the query-block task loop.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <new>
#include <type_traits>

#include "oxijax/numeric.h"
#include "parallel.h"

#if defined(__AVX512F__) || defined(__AVX__) || defined(__FMA__)
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

template <typename V> inline V vload(const void* p) {
  V v;
  std::memcpy(&v, p, sizeof v);
  return v;
}
template <typename V> inline void vstore(void* p, V v) { std::memcpy(p, &v, sizeof v); }
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

// exp for float lanes: Cody-Waite reduction x = n*ln2 + r, |r| <= ln2/2, Cephes'
// expf polynomial (measured <= 1 ulp), times 2^n. Correct for any x: exp(-inf) = 0,
// exp(+inf) = inf, NaN propagates; with AVX-512 results in the subnormal range are
// exact-ish (vscalefps), elsewhere they flush to 0 (an absolute error < 1.2e-38, next
// to a running softmax sum >= 1).
inline VecF vexp_poly(VecF r) {
  VecF p = splat<VecF>(1.9875691500e-4f);
  p = vfma(p, r, splat<VecF>(1.3981999507e-3f));
  p = vfma(p, r, splat<VecF>(8.3334519073e-3f));
  p = vfma(p, r, splat<VecF>(4.1665795894e-2f));
  p = vfma(p, r, splat<VecF>(1.6666665459e-1f));
  p = vfma(p, r, splat<VecF>(5.0000001201e-1f));
  return vfma(p, r * r, r + splat<VecF>(1.0f));
}
inline VecF vexp(VecF x) {
#if defined(__AVX512F__)
  // The maskz_ forms with a full mask are the plain instructions; they avoid GCC 12's
  // bogus -Wmaybe-uninitialized on _mm512_undefined_ps in the unmasked intrinsics.
  constexpr __mmask16 all = 0xffff;
  // Clamp with the NaN-preserving operand order (vmaxps/vminps return the second
  // operand when either is NaN); outside [-104, 89] exp is 0 or inf in float anyway.
  x = _mm512_maskz_max_ps(all, splat<VecF>(-104.0f), x);
  x = _mm512_maskz_min_ps(all, splat<VecF>(89.0f), x);
  const VecF n = _mm512_maskz_roundscale_ps(all, x * splat<VecF>(1.44269504088896341f),
                                            _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  VecF r = vfma(n, splat<VecF>(-0.693359375f), x);
  r = vfma(n, splat<VecF>(2.12194440e-4f), r);
  return _mm512_maskz_scalef_ps(all, vexp_poly(r), n);  // p * 2^n, right under/overflow
#else
  const VecF lo = splat<VecF>(-87.33654f), hi = splat<VecF>(88.72283f);
  const VecF xc = x < lo ? lo : (x > hi ? hi : x);  // comparisons are false for NaN
  const VecF magic = splat<VecF>(12582912.0f);         // 1.5 * 2^23: round to nearest
  const VecF t = vfma(xc, splat<VecF>(1.44269504088896341f), magic);
  const VecF n = t - magic;
  VecF r = vfma(n, splat<VecF>(-0.693359375f), xc);
  r = vfma(n, splat<VecF>(2.12194440e-4f), r);
  const VecF p = vexp_poly(r);
  // n in [-126, 128]; 2^n as two factors so that n = 128 (x ~ 88.7) stays finite.
  const VecI ni = reinterpret_cast<VecI>(t) - reinterpret_cast<VecI>(magic);
  const VecI n1 = ni >> 1, n2 = ni - n1;
  const VecF s1 = reinterpret_cast<VecF>((n1 + 127) << 23);
  const VecF s2 = reinterpret_cast<VecF>((n2 + 127) << 23);
  const VecF y = p * s1 * s2;
  return x < lo ? VecF{} : (x > hi ? splat<VecF>(INFINITY) : y);
#endif
}

// The same for double lanes: Cody-Waite with fdlibm's split of ln2, then the Taylor
// series of e^r to degree 13 (truncation < 1e-17 relative for |r| <= ln2/2; ~1 ulp).
inline VecD vexp(VecD x) {
  const VecD ln2_hi = splat<VecD>(6.93147180369123816490e-01);
  const VecD ln2_lo = splat<VecD>(1.90821492927058770002e-10);
  const VecD log2e = splat<VecD>(1.44269504088896338700e+00);
  const auto poly = [](VecD r) {
    constexpr double c[] = {1.0 / 6227020800.0, 1.0 / 479001600.0, 1.0 / 39916800.0,
                            1.0 / 3628800.0,    1.0 / 362880.0,    1.0 / 40320.0,
                            1.0 / 5040.0,       1.0 / 720.0,       1.0 / 120.0,
                            1.0 / 24.0,         1.0 / 6.0,         0.5,
                            1.0,                1.0};
    VecD p = splat<VecD>(c[0]);
    for (int i = 1; i < 14; ++i) p = vfma(p, r, splat<VecD>(c[i]));
    return p;
  };
#if defined(__AVX512F__)
  constexpr __mmask8 all = 0xff;
  x = _mm512_maskz_max_pd(all, splat<VecD>(-746.0), x);  // NaN-preserving clamps
  x = _mm512_maskz_min_pd(all, splat<VecD>(710.0), x);
  const VecD n = _mm512_maskz_roundscale_pd(all, x * log2e,
                                            _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  VecD r = vfma(n, -ln2_hi, x);
  r = vfma(n, -ln2_lo, r);
  return _mm512_maskz_scalef_pd(all, poly(r), n);
#else
  typedef int64_t VecL __attribute__((vector_size(kVecBytes)));
  const VecD lo = splat<VecD>(-708.3964185322641), hi = splat<VecD>(709.782712893384);
  const VecD xc = x < lo ? lo : (x > hi ? hi : x);
  const VecD magic = splat<VecD>(6755399441055744.0);  // 1.5 * 2^52
  const VecD t = vfma(xc, log2e, magic);
  const VecD n = t - magic;
  VecD r = vfma(n, -ln2_hi, xc);
  r = vfma(n, -ln2_lo, r);
  const VecD p = poly(r);
  const VecL ni = reinterpret_cast<VecL>(t) - reinterpret_cast<VecL>(magic);
  const VecL n1 = ni >> 1, n2 = ni - n1;
  const VecD s1 = reinterpret_cast<VecD>((n1 + 1023) << 52);
  const VecD s2 = reinterpret_cast<VecD>((n2 + 1023) << 52);
  const VecD y = p * s1 * s2;
  return x < lo ? VecD{} : (x > hi ? splat<VecD>(INFINITY) : y);
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

// out[jt][:] = sum_d rows[jt][d] * bt[d][:] for JT rows (row stride ldr, lanes ld);
// with Add, out[jt][:] += the same.
template <typename A, int IV, int JT, bool Add = false>
inline void lanes_product(const A* __restrict rows, int64_t ldr, const A* __restrict bt,
                          int64_t ld, int64_t dim, A* __restrict out) {
  using V = Vec<A>;
  constexpr int W = kLanes<A>;
  V acc[JT][IV];
  for (int jt = 0; jt < JT; ++jt)
    for (int iv = 0; iv < IV; ++iv) acc[jt][iv] = Add ? vload<V>(out + jt * ld + iv * W) : V{};
  for (int64_t d = 0; d < dim; ++d) {
    V b[IV];
    for (int iv = 0; iv < IV; ++iv) b[iv] = vload<V>(bt + d * ld + iv * W);
    for (int jt = 0; jt < JT; ++jt) {
      const V r = splat<V>(rows[jt * ldr + d]);
      for (int iv = 0; iv < IV; ++iv) acc[jt][iv] = vfma(b[iv], r, acc[jt][iv]);
    }
  }
  for (int jt = 0; jt < JT; ++jt)
    for (int iv = 0; iv < IV; ++iv) vstore(out + jt * ld + iv * W, acc[jt][iv]);
}

constexpr int kLaneRows = kRegs >= 32 ? 6 : 4;  // register tile rows of the lanes_* loops

// lanes_product over all n rows, in register tiles of kLaneRows rows.
template <typename A, int IV, bool Add = false>
void lanes_product_all(const A* rows, int64_t ldr, int64_t n, const A* bt, int64_t ld,
                       int64_t dim, A* out) {
  int64_t j = 0;
  for (; j + kLaneRows <= n; j += kLaneRows)
    lanes_product<A, IV, kLaneRows, Add>(rows + j * ldr, ldr, bt, ld, dim, out + j * ld);
  if (j < n)
    dispatch<kLaneRows - 1>(int(n - j), [&](auto c) {
      lanes_product<A, IV, decltype(c)::value, Add>(rows + j * ldr, ldr, bt, ld, dim,
                                                    out + j * ld);
    });
}

// outt[dt][:] += sum_j rows[j][dt] * st[j][:] for DT head-dim entries (as Ot += V^T P^T);
// without Add, outt[dt][:] = the same.
template <typename A, int IV, int DT, bool Add = true>
inline void lanes_accumulate(const A* __restrict st, int64_t ld, int64_t nk,
                             const A* __restrict rows, int64_t ldr, A* __restrict outt) {
  using V = Vec<A>;
  constexpr int W = kLanes<A>;
  V acc[DT][IV];
  for (int dt = 0; dt < DT; ++dt)
    for (int iv = 0; iv < IV; ++iv) acc[dt][iv] = Add ? vload<V>(outt + dt * ld + iv * W) : V{};
  for (int64_t j = 0; j < nk; ++j) {
    V s[IV];
    for (int iv = 0; iv < IV; ++iv) s[iv] = vload<V>(st + j * ld + iv * W);
    for (int dt = 0; dt < DT; ++dt) {
      const V r = splat<V>(rows[j * ldr + dt]);
      for (int iv = 0; iv < IV; ++iv) acc[dt][iv] = vfma(s[iv], r, acc[dt][iv]);
    }
  }
  for (int dt = 0; dt < DT; ++dt)
    for (int iv = 0; iv < IV; ++iv) vstore(outt + dt * ld + iv * W, acc[dt][iv]);
}

// lanes_accumulate over all `dim` head-dim entries of nk rows (row stride ldr).
template <typename A, int IV, bool Add = true>
void lanes_accumulate_all(const A* st, int64_t ld, int64_t nk, const A* rows, int64_t ldr,
                          int64_t dim, A* outt) {
  int64_t d = 0;
  for (; d + kLaneRows <= dim; d += kLaneRows)
    lanes_accumulate<A, IV, kLaneRows, Add>(st, ld, nk, rows + d, ldr, outt + d * ld);
  if (d < dim)
    dispatch<kLaneRows - 1>(int(dim - d), [&](auto c) {
      lanes_accumulate<A, IV, decltype(c)::value, Add>(st, ld, nk, rows + d, ldr, outt + d * ld);
    });
}

// n values of src in the compute type A: src itself when T is A, else converted into buf.
template <typename A, typename T>
inline const A* as_compute(const T* src, int64_t n, A* buf) {
  if constexpr (std::is_same_v<T, A>) {
    return src;
  } else {
    for (int64_t e = 0; e < n; ++e) buf[e] = load(src[e]);
    return buf;
  }
}

template <typename A> struct AlignedBuffer {
  A* p = nullptr;
  explicit AlignedBuffer(int64_t n)
      : p(static_cast<A*>(::operator new(std::max<int64_t>(n, 1) * sizeof(A),
                                         std::align_val_t(64)))) {}
  ~AlignedBuffer() { ::operator delete(p, std::align_val_t(64)); }
  AlignedBuffer(const AlignedBuffer&) = delete;
  AlignedBuffer& operator=(const AlignedBuffer&) = delete;
};

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
