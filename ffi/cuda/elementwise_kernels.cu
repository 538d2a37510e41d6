// CUDA elementwise kernels, the forward ops: unary ops over a contiguous array, and binary
// ops with NumPy broadcasting (the kernels and launchers: elementwise.h).
#include "elementwise.h"

namespace oxijax::cuda {

template <typename T>
cudaError_t unary(cudaStream_t stream, UnaryOp op, const T* x, T* y, int64_t n) {
  if (n <= 0) return cudaSuccess;
  switch (op) {
    case UnaryOp::RELU: return unary_op<T, UnaryOp::RELU>(stream, x, y, n);
    case UnaryOp::SIGMOID: return unary_op<T, UnaryOp::SIGMOID>(stream, x, y, n);
    case UnaryOp::TANH: return unary_op<T, UnaryOp::TANH>(stream, x, y, n);
    case UnaryOp::EXP: return unary_op<T, UnaryOp::EXP>(stream, x, y, n);
    case UnaryOp::LOG: return unary_op<T, UnaryOp::LOG>(stream, x, y, n);
    case UnaryOp::SQRT: return unary_op<T, UnaryOp::SQRT>(stream, x, y, n);
    case UnaryOp::ABS: return unary_op<T, UnaryOp::ABS>(stream, x, y, n);
    case UnaryOp::NEG: return unary_op<T, UnaryOp::NEG>(stream, x, y, n);
  }
  return cudaErrorInvalidValue;
}

template <typename T>
cudaError_t binary(cudaStream_t stream, BinaryOp op, const BroadcastShape& shape, const T* a,
                   const T* b, T* out) {
  switch (op) {
    case BinaryOp::ADD: return binary_with<T, Binary<BinaryOp::ADD>>(stream, shape, a, b, out);
    case BinaryOp::SUB: return binary_with<T, Binary<BinaryOp::SUB>>(stream, shape, a, b, out);
    case BinaryOp::MUL: return binary_with<T, Binary<BinaryOp::MUL>>(stream, shape, a, b, out);
    case BinaryOp::DIV: return binary_with<T, Binary<BinaryOp::DIV>>(stream, shape, a, b, out);
    case BinaryOp::MAX: return binary_with<T, Binary<BinaryOp::MAX>>(stream, shape, a, b, out);
    case BinaryOp::MIN: return binary_with<T, Binary<BinaryOp::MIN>>(stream, shape, a, b, out);
  }
  return cudaErrorInvalidValue;
}

#define OXIJAX_INSTANTIATE(T)                                                                  \
  template cudaError_t unary<T>(cudaStream_t, UnaryOp, const T*, T*, int64_t);                 \
  template cudaError_t binary<T>(cudaStream_t, BinaryOp, const BroadcastShape&, const T*,      \
                                 const T*, T*);
OXIJAX_INSTANTIATE(oxijax::half)
OXIJAX_INSTANTIATE(oxijax::bfloat16)
OXIJAX_INSTANTIATE(float)
OXIJAX_INSTANTIATE(double)
#undef OXIJAX_INSTANTIATE

}  // namespace oxijax::cuda
