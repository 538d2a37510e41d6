// The CUDA interpreter's bfloat16 type: conversions round to nearest even like the
// hardware's cvt.rn.bf16.f32 (numeric.h's portable conversion; NaN stays NaN).
#pragma once

#include <cstdint>

#include "oxijax/numeric.h"

struct __nv_bfloat16 {
  uint16_t bits;
};
inline __nv_bfloat16 __ushort_as_bfloat16(unsigned short bits) { return __nv_bfloat16{bits}; }
inline unsigned short __bfloat16_as_ushort(__nv_bfloat16 h) { return h.bits; }
inline float __bfloat162float(__nv_bfloat16 h) { return oxijax::bfloat16_to_float(h.bits); }
inline __nv_bfloat16 __float2bfloat16_rn(float x) {
  return __nv_bfloat16{oxijax::float_to_bfloat16(x)};
}
inline __nv_bfloat16 __float2bfloat16(float x) { return __float2bfloat16_rn(x); }
