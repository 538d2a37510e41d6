// CUDA elementwise kernels, the backward functors (oxijax/math.h's UnaryGrad and
// BinaryPartial) on the binary kernels of elementwise.h.
#include "elementwise.h"

namespace oxijax::cuda {

// The backward kernels reuse the binary kernels: unary_grad is a same-shape binary op,
// which needs only the one-dim kernels (binary_with's broadcasting ones made this file
// compile nearly four times longer).
template <typename T>
cudaError_t unary_grad(cudaStream_t stream, UnaryOp op, const T* x, const T* t, T* out,
                       int64_t n) {
  if (n <= 0) return cudaSuccess;
  switch (op) {
#define OXIJAX_CASE(OP) \
  case UnaryOp::OP:       \
    return launch_flat<T, UnaryGrad<UnaryOp::OP>, false, false>(stream, x, t, out, n);
    OXIJAX_CASE(RELU) OXIJAX_CASE(SIGMOID) OXIJAX_CASE(TANH) OXIJAX_CASE(EXP)
    OXIJAX_CASE(LOG) OXIJAX_CASE(SQRT) OXIJAX_CASE(ABS) OXIJAX_CASE(NEG)
#undef OXIJAX_CASE
  }
  return cudaErrorInvalidValue;
}

template <typename T>
cudaError_t binary_partial(cudaStream_t stream, BinaryOp op, const BroadcastShape& shape,
                           const T* a, const T* b, T* out) {
  if (op == BinaryOp::MAX)
    return binary_with<T, BinaryPartial<BinaryOp::MAX>>(stream, shape, a, b, out);
  if (op == BinaryOp::MIN)
    return binary_with<T, BinaryPartial<BinaryOp::MIN>>(stream, shape, a, b, out);
  return cudaErrorInvalidValue;
}

#define OXIJAX_INSTANTIATE(T)                                                                  \
  template cudaError_t unary_grad<T>(cudaStream_t, UnaryOp, const T*, const T*, T*, int64_t);  \
  template cudaError_t binary_partial<T>(cudaStream_t, BinaryOp, const BroadcastShape&,        \
                                         const T*, const T*, T*);
OXIJAX_INSTANTIATE(oxijax::half)
OXIJAX_INSTANTIATE(oxijax::bfloat16)
OXIJAX_INSTANTIATE(float)
OXIJAX_INSTANTIATE(double)
#undef OXIJAX_INSTANTIATE

}  // namespace oxijax::cuda
