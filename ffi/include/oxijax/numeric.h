// Storage types for the half dtypes and the accumulation rule of SPEC: float16 and
// bfloat16 compute and accumulate in float32 and round once on store (round to
// nearest even); float32 accumulates in float32 and float64 in float64.
// Everything here is usable from host and device code.
#pragma once

#include <cstdint>
#include <cstring>

#include "oxijax/ops.h"

namespace oxijax {

struct half { uint16_t bits; };
struct bfloat16 { uint16_t bits; };

OXIJAX_HD uint32_t float_bits(float f) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(f);
#else
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return u;
#endif
}

OXIJAX_HD float bits_float(uint32_t u) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(u);
#else
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
#endif
}

// IEEE binary16 -> binary32, exact (subnormals, infinities and NaN payloads kept).
OXIJAX_HD float half_to_float(uint16_t h) {
  constexpr uint32_t kExpMask = 0x7c00u << 13;  // binary16 exponent, moved to binary32 place
  uint32_t out = (h & 0x7fffu) << 13;
  const uint32_t exp = out & kExpMask;
  out += (127u - 15u) << 23;              // rebias the exponent
  if (exp == kExpMask) {
    out += (128u - 16u) << 23;            // inf / NaN: all-ones exponent
  } else if (exp == 0) {                  // zero / subnormal: renormalise through the FPU
    out += 1u << 23;
    out = float_bits(bits_float(out) - bits_float(113u << 23));
  }
  return bits_float(out | ((h & 0x8000u) << 16));
}

// binary32 -> binary16, round to nearest even; overflow gives inf, NaN stays NaN.
OXIJAX_HD uint16_t float_to_half(float value) {
  uint32_t f = float_bits(value);
  const uint32_t sign = f & 0x80000000u;
  f ^= sign;
  uint32_t out;
  if (f >= (143u << 23)) {                // >= 65536: inf, or NaN if f > inf
    out = f > (255u << 23) ? 0x7e00u : 0x7c00u;
  } else if (f < (113u << 23)) {          // result is subnormal or zero
    constexpr uint32_t kDenormMagic = ((127u - 15u) + (23u - 10u) + 1u) << 23;
    out = float_bits(bits_float(f) + bits_float(kDenormMagic)) - kDenormMagic;
  } else {
    const uint32_t mant_odd = (f >> 13) & 1u;
    f += ((15u - 127u) << 23) + 0xfffu + mant_odd;
    out = f >> 13;
  }
  return static_cast<uint16_t>(out | (sign >> 16));
}

OXIJAX_HD float bfloat16_to_float(uint16_t b) { return bits_float(uint32_t(b) << 16); }

OXIJAX_HD uint16_t float_to_bfloat16(float value) {
  const uint32_t f = float_bits(value);
  if ((f & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((f >> 16) | 0x40u);  // quiet NaN
  return static_cast<uint16_t>((f + 0x7fffu + ((f >> 16) & 1u)) >> 16);
}

// Acc<T>: the type a T computes in.
template <typename T> struct AccumulatorOf { using type = float; };
template <> struct AccumulatorOf<double> { using type = double; };
template <typename T> using Acc = typename AccumulatorOf<T>::type;

OXIJAX_HD float load(half x) { return half_to_float(x.bits); }
OXIJAX_HD float load(bfloat16 x) { return bfloat16_to_float(x.bits); }
OXIJAX_HD float load(float x) { return x; }
OXIJAX_HD double load(double x) { return x; }

template <typename T> OXIJAX_HD T store(Acc<T> x);
template <> OXIJAX_HD half store<half>(float x) { return half{float_to_half(x)}; }
template <> OXIJAX_HD bfloat16 store<bfloat16>(float x) { return bfloat16{float_to_bfloat16(x)}; }
template <> OXIJAX_HD float store<float>(float x) { return x; }
template <> OXIJAX_HD double store<double>(double x) { return x; }

}  // namespace oxijax
