// The CUDA interpreter's float16 type: conversions round to nearest even like the
// hardware's cvt.rn.f16.f32 (numeric.h's portable conversion; NaN stays NaN).
#pragma once

#include <cstdint>

#include "oxijax/numeric.h"

struct __half {
  uint16_t bits;
};
inline __half __ushort_as_half(unsigned short bits) { return __half{bits}; }
inline unsigned short __half_as_ushort(__half h) { return h.bits; }
inline float __half2float(__half h) { return oxijax::half_to_float(h.bits); }
inline __half __float2half_rn(float x) { return __half{oxijax::float_to_half(x)}; }
inline __half __float2half(float x) { return __float2half_rn(x); }
