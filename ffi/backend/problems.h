// The pointer backend's problem descriptions: raw arguments (row-major, as the Python
// layer passes them after mapping the trait's column-major gemm) turned into the
// kernels' shape structs, with the basic sanity checks repeated in C++.
#pragma once

#include <cstdint>
#include <stdexcept>
#include <vector>

#include "oxijax/numeric.h"
#include "oxijax/shapes.h"

namespace oxijax::backend {

// Element types by code, as oxijax.backend passes them.
enum class DType : int { kFloat16 = 0, kBFloat16 = 1, kFloat32 = 2, kFloat64 = 3 };

// Calls body(T{}) with T the storage type of the dtype code.
template <typename Body>
void with_dtype(int code, Body&& body) {
  switch (static_cast<DType>(code)) {
    case DType::kFloat16: return body(half{});
    case DType::kBFloat16: return body(bfloat16{});
    case DType::kFloat32: return body(float{});
    case DType::kFloat64: return body(double{});
  }
  throw std::invalid_argument("unknown dtype code");
}

// A strided batch of row-major gemms, c updated in place:
// c_i = alpha * op(a_i) @ op(b_i) + beta * c_i, with a_i = a + i * stride_a etc.
struct GemmProblem {
  bool trans_a = false, trans_b = false;
  int64_t m = 0, n = 0, k = 0;
  double alpha = 1.0, beta = 0.0;
  int64_t lda = 0, stride_a = 0, ldb = 0, stride_b = 0, ldc = 0, stride_c = 0;
  int64_t batch = 1;
};
GemmShape gemm_shape(const GemmProblem& p);

ConvShape conv_shape(const std::vector<int64_t>& input, const std::vector<int64_t>& filter,
                     const std::vector<int64_t>& output, const std::vector<int64_t>& stride,
                     const std::vector<int64_t>& padding);

AttentionShape attention_shape(int64_t batch, int64_t heads, int64_t seq_q, int64_t seq_kv,
                               int64_t head_dim, double scale, bool causal);

ReduceShape reduce_shape(int64_t outer, int64_t axis, int64_t inner);

// The elementwise binary op over n elements, no broadcasting.
BroadcastShape flat_shape(int64_t n);

template <typename T>
T* at(uintptr_t address) {
  return reinterpret_cast<T*>(address);
}

}  // namespace oxijax::backend
