// Whole vectors of half / bfloat16 / float in memory <-> simd.h's VecF, for kernels that
// compute half types in float (numeric.h). The same values as numeric.h's scalar
// load / store: widening is exact, narrowing rounds to nearest even, overflows to inf
// and keeps NaN a NaN. Bit-exact but for NaN payloads: F16C / AVX-512 quieten a
// signalling float16 NaN when widening, and keep a NaN's top payload bits when
// narrowing where numeric.h writes 0x7e00.
//
// bfloat16 is the top half of a float: shifts, and a 32 -> 16 bit pack for the
// narrowing. float16 uses the conversion instructions where the target has them
// (F16C, AVX-512), else numeric.h's bit algorithms lane by lane.
#pragma once

#include <cstdint>
#include <type_traits>

#include "oxijax/numeric.h"
#include "vector_math.h"

namespace oxijax::cpu::vmath {

// kLanes 16-bit values.
typedef uint16_t VecH __attribute__((vector_size(simd::kVecBytes / 2)));

inline VecH load_h(const void* p) { return simd::vload<VecH>(p); }
inline void store_h(void* p, VecH v) { simd::vstore(p, v); }

// kLanes 16-bit values from p, zero-extended. (GCC lowers __builtin_convertvector of a
// whole AVX2 vector in two halves; the intrinsic is one vpmovzxwd from memory.)
inline VecU widen_u16(const void* p) {
#if defined(__AVX512F__)
  return reinterpret_cast<VecU>(
      _mm512_maskz_cvtepu16_epi32(kAllLanes, _mm256_loadu_si256(static_cast<const __m256i*>(p))));
#elif defined(__AVX2__)
  return reinterpret_cast<VecU>(_mm256_cvtepu16_epi32(_mm_loadu_si128(static_cast<const __m128i*>(p))));
#else
  return __builtin_convertvector(load_h(p), VecU);
#endif
}

// Lanes < 2^16 to 16 bits. (AVX2: one saturating pack, exact for such lanes, and one
// cross-lane permute instead of a mask, pack and permute.)
inline VecH narrow_u32(VecU u) {
#if defined(__AVX2__) && !defined(__AVX512F__)
  const __m256i v = reinterpret_cast<__m256i>(u);
  const __m256i packed = _mm256_permute4x64_epi64(_mm256_packus_epi32(v, v), 0x08);
  return reinterpret_cast<VecH>(_mm256_castsi256_si128(packed));
#else
  return __builtin_convertvector(u, VecH);
#endif
}

inline VecF bfloat16_to_float(const void* p) { return from_bits(widen_u16(p) << 16); }

// float_to_bfloat16 of every lane, in the low 16 bits of a 32-bit lane: round to
// nearest even; NaN quietened, sign kept.
inline VecU bfloat16_bits(VecF x) {
  const VecU u = bits(x);
  const VecU rounded = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
  const VecU quiet_nan = (u >> 16) | 0x40u;
  return x != x ? quiet_nan : rounded;
}
inline VecH float_to_bfloat16(VecF x) { return narrow_u32(bfloat16_bits(x)); }

inline VecF half_to_float(const void* p) {
#if defined(__AVX512F__)
  return _mm512_maskz_cvtph_ps(kAllLanes, _mm256_loadu_si256(static_cast<const __m256i*>(p)));
#elif defined(__F16C__) && defined(__AVX__)
  return _mm256_cvtph_ps(_mm_loadu_si128(static_cast<const __m128i*>(p)));
#else
  // numeric.h's half_to_float on every lane.
  const VecU h = widen_u16(p);
  const VecU exp_mask = VecU{} + (0x7c00u << 13);
  VecU out = (h & 0x7fffu) << 13;
  const VecU exp = out & exp_mask;
  out += (127u - 15u) << 23;
  out += exp == exp_mask ? (128u - 16u) << 23 : VecU{};  // inf / NaN
  const VecU sub = out + (1u << 23);                     // zero / subnormal: renormalise
  const VecF renorm = from_bits(sub) - from_bits(VecU{} + (113u << 23));
  out = exp == 0 ? bits(renorm) : out;
  return from_bits(out | ((h & 0x8000u) << 16));
#endif
}

inline VecH float_to_half(VecF x) {
#if defined(__AVX512F__)
  return reinterpret_cast<VecH>(
      _mm512_maskz_cvtps_ph(kAllLanes, x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
#elif defined(__F16C__) && defined(__AVX__)
  return reinterpret_cast<VecH>(_mm256_cvtps_ph(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
#else
  // numeric.h's float_to_half on every lane; magnitudes are < 2^31, so the signed
  // comparisons of VecI are exact.
  VecU f = bits(x);
  const VecU sign = f & 0x80000000u;
  f ^= sign;
  const VecI fi = reinterpret_cast<VecI>(f);
  const VecU inf_or_nan = fi > int32_t{255 << 23} ? VecU{} + 0x7e00u : VecU{} + 0x7c00u;
  constexpr uint32_t kDenormMagic = ((127u - 15u) + (23u - 10u) + 1u) << 23;
  const VecU magic = VecU{} + kDenormMagic;
  const VecU subnormal = bits(from_bits(f) + from_bits(magic)) - magic;
  const VecU normal = (f + (((15u - 127u) << 23) + 0xfffu) + ((f >> 13) & 1u)) >> 13;
  VecU out = fi >= int32_t{143 << 23} ? inf_or_nan
                                      : (fi < int32_t{113 << 23} ? subnormal : normal);
  return narrow_u32(out | (sign >> 16));
#endif
}

// Two vectors of floats.
struct VecF2 {
  VecF lo, hi;
};

// 2 * kLanes bfloat16 at p as floats, split by position: the even elements (p[0], p[2],
// ...) and the odd ones, by a shift and a mask of each 32-bit word (no shuffle): the
// same split on every level, for sums whose order must not depend on it.
inline VecF2 load_bfloat16_even_odd(const bfloat16* p) {
  const VecU words = simd::vload<VecU>(p);
  return {from_bits(words << 16), from_bits(words & 0xffff0000u)};
}

// kLanes values of p as floats, and back.
template <typename T> inline VecF load_lanes(const T* p) {
  if constexpr (std::is_same_v<T, float>) return simd::vload<VecF>(p);
  else if constexpr (std::is_same_v<T, bfloat16>) return bfloat16_to_float(p);
  else return half_to_float(p);
}
template <typename T> inline void store_lanes(T* p, VecF v) {
  if constexpr (std::is_same_v<T, float>) simd::vstore(p, v);
  else if constexpr (std::is_same_v<T, bfloat16>) store_h(p, float_to_bfloat16(v));
  else store_h(p, float_to_half(v));
}

// 2 * kLanes values of T at p as two vectors of floats, and back, for lane-wise ops
// only: the lanes may be in another order than memory's, which store_pair undoes.
// bfloat16 on AVX2 / AVX-512 is widened by interleaving with zeros and narrowed by one
// saturating pack per pair (both permute within 128-bit blocks, inversely): one
// instruction per vector to widen and half a one to narrow, where doing either in
// memory's order takes two or three.
#if defined(__AVX512BW__)
typedef __m512i VecBits;
inline VecBits load_bits(const void* p) { return _mm512_loadu_si512(p); }
inline void store_bits(void* p, VecBits v) { _mm512_storeu_si512(p, v); }
inline VecF2 interleave_zeros(VecBits v) {
  const VecBits zero = _mm512_setzero_si512();
  return {reinterpret_cast<VecF>(_mm512_unpacklo_epi16(zero, v)),
          reinterpret_cast<VecF>(_mm512_unpackhi_epi16(zero, v))};
}
inline VecBits pack_u32(VecU lo, VecU hi) {
  return _mm512_packus_epi32(reinterpret_cast<VecBits>(lo), reinterpret_cast<VecBits>(hi));
}
#define OXIJAX_BFLOAT16_INTERLEAVED 1
#elif defined(__AVX2__) && !defined(__AVX512F__)
typedef __m256i VecBits;
inline VecBits load_bits(const void* p) { return _mm256_loadu_si256(static_cast<const VecBits*>(p)); }
inline void store_bits(void* p, VecBits v) { _mm256_storeu_si256(static_cast<VecBits*>(p), v); }
inline VecF2 interleave_zeros(VecBits v) {
  const VecBits zero = _mm256_setzero_si256();
  return {reinterpret_cast<VecF>(_mm256_unpacklo_epi16(zero, v)),
          reinterpret_cast<VecF>(_mm256_unpackhi_epi16(zero, v))};
}
inline VecBits pack_u32(VecU lo, VecU hi) {
  return _mm256_packus_epi32(reinterpret_cast<VecBits>(lo), reinterpret_cast<VecBits>(hi));
}
#define OXIJAX_BFLOAT16_INTERLEAVED 1
#endif

template <typename T> inline VecF2 load_pair(const T* p) {
#if defined(OXIJAX_BFLOAT16_INTERLEAVED)
  if constexpr (std::is_same_v<T, bfloat16>) return interleave_zeros(load_bits(p));
#endif
  return {load_lanes(p), load_lanes(p + kLanes)};
}
template <typename T> inline void store_pair(T* p, VecF2 v) {
#if defined(OXIJAX_BFLOAT16_INTERLEAVED)
  if constexpr (std::is_same_v<T, bfloat16>) {
    store_bits(p, pack_u32(bfloat16_bits(v.lo), bfloat16_bits(v.hi)));
    return;
  }
#endif
  store_lanes(p, v.lo);
  store_lanes(p + kLanes, v.hi);
}
#undef OXIJAX_BFLOAT16_INTERLEAVED

}  // namespace oxijax::cpu::vmath
