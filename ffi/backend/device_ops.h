// The op entry points both backend devices (CpuDevice, CudaDevice) provide, on raw
// addresses. Row-major; gemm is GemmProblem's in-place strided batch. The binding
// (bindings.cc) exposes each device class with these methods.
#pragma once

#include <cstdint>
#include <vector>

#include "problems.h"

namespace oxijax::backend {

// Arguments of conv2d_forward, in the trait's order.
struct ConvArgs {
  uintptr_t x, w, out;
  std::vector<int64_t> input, filter, output, stride, padding;
};

// Arguments of attention, in the trait's order (dims as AttentionShape).
struct AttentionArgs {
  uintptr_t q, k, v, out;
  AttentionShape shape;
};

}  // namespace oxijax::backend
