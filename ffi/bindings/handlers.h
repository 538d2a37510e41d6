// The XLA FFI handler symbols, one per target and platform. The nanobind module hands
// them to Python, which registers them with jax.ffi.register_ffi_target.
#pragma once

#include "xla/ffi/api/api.h"

// Every FFI target, as X(name): the handler of platform P is P_name, registered as
// "oxijax_name". The forward ops, then their derivatives (autodiff).
#define OXIJAX_FOR_EACH_TARGET(X)                                                     \
  X(unary) X(binary) X(reduce) X(gemm) X(conv2d) X(attention)                        \
  X(attention_backward) X(attention_jvp) X(unary_grad) X(binary_partial)             \
  X(conv2d_backward_data) X(conv2d_backward_filter)

#define OXIJAX_DECLARE_CPU_HANDLER(name) XLA_FFI_DECLARE_HANDLER_SYMBOL(Cpu_##name);
#define OXIJAX_DECLARE_CUDA_HANDLER(name) XLA_FFI_DECLARE_HANDLER_SYMBOL(Cuda_##name);

namespace oxijax::bindings {
OXIJAX_FOR_EACH_TARGET(OXIJAX_DECLARE_CPU_HANDLER)
#ifdef OXIJAX_WITH_CUDA
OXIJAX_FOR_EACH_TARGET(OXIJAX_DECLARE_CUDA_HANDLER)
#endif
}  // namespace oxijax::bindings

#undef OXIJAX_DECLARE_CPU_HANDLER
#undef OXIJAX_DECLARE_CUDA_HANDLER
