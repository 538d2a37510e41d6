// Device-side conversions between the storage types of numeric.h and their compute
// type, using the hardware instructions (round to nearest even like numeric.h's
// portable versions; NaN payloads may differ, NaN stays NaN), and packed vector access.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

#include "oxijax/numeric.h"

namespace oxijax::cuda {

__device__ __forceinline__ float to_acc(oxijax::half x) {
  return __half2float(__ushort_as_half(x.bits));
}
__device__ __forceinline__ float to_acc(oxijax::bfloat16 x) {
  return __uint_as_float(static_cast<uint32_t>(x.bits) << 16);
}
__device__ __forceinline__ float to_acc(float x) { return x; }
__device__ __forceinline__ double to_acc(double x) { return x; }

template <typename T> __device__ __forceinline__ T from_acc(Acc<T> x);
template <> __device__ __forceinline__ oxijax::half from_acc<oxijax::half>(float x) {
  return oxijax::half{__half_as_ushort(__float2half_rn(x))};
}
template <> __device__ __forceinline__ oxijax::bfloat16 from_acc<oxijax::bfloat16>(float x) {
  return oxijax::bfloat16{__bfloat16_as_ushort(__float2bfloat16_rn(x))};
}
template <> __device__ __forceinline__ float from_acc<float>(float x) { return x; }
template <> __device__ __forceinline__ double from_acc<double>(double x) { return x; }

// 128-bit global loads and stores: V consecutive elements as one access.
constexpr int kVecBytes = 16;
template <typename T, int V>
struct alignas(sizeof(T) * V) Pack {
  T v[V];
};
template <typename T> constexpr int kMaxVec = kVecBytes / static_cast<int>(sizeof(T));

}  // namespace oxijax::cuda
