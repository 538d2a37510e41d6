// The XLA FFI handler symbols, one per op and platform. The nanobind module hands
// them to Python, which registers them with jax.ffi.register_ffi_target.
#pragma once

#include "xla/ffi/api/api.h"

#define OXIJAX_DECLARE_HANDLERS(platform)                       \
  XLA_FFI_DECLARE_HANDLER_SYMBOL(platform##_unary);             \
  XLA_FFI_DECLARE_HANDLER_SYMBOL(platform##_binary);            \
  XLA_FFI_DECLARE_HANDLER_SYMBOL(platform##_reduce);            \
  XLA_FFI_DECLARE_HANDLER_SYMBOL(platform##_gemm);              \
  XLA_FFI_DECLARE_HANDLER_SYMBOL(platform##_conv2d);            \
  XLA_FFI_DECLARE_HANDLER_SYMBOL(platform##_attention);

// The backward passes' handlers (autodiff).
#define OXIJAX_DECLARE_BACKWARD_HANDLERS(platform)                        \
  XLA_FFI_DECLARE_HANDLER_SYMBOL(platform##_unary_grad);                  \
  XLA_FFI_DECLARE_HANDLER_SYMBOL(platform##_binary_partial);              \
  XLA_FFI_DECLARE_HANDLER_SYMBOL(platform##_conv2d_backward_data);        \
  XLA_FFI_DECLARE_HANDLER_SYMBOL(platform##_conv2d_backward_filter);

namespace oxijax::bindings {
OXIJAX_DECLARE_HANDLERS(Cpu)
OXIJAX_DECLARE_BACKWARD_HANDLERS(Cpu)
#ifdef OXIJAX_WITH_CUDA
OXIJAX_DECLARE_HANDLERS(Cuda)
OXIJAX_DECLARE_BACKWARD_HANDLERS(Cuda)
#endif
}  // namespace oxijax::bindings
