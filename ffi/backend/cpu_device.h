// The CPU backend's device: runs the same CPU kernels as the JAX path (ffi/cpu) on a
// process-wide host thread pool; every call blocks until its result is written.
#pragma once

#include <cstddef>
#include <cstdint>

#include "cpu/parallel.h"
#include "device_ops.h"

namespace oxijax::backend {

class CpuDevice {
 public:
  CpuDevice();

  static void copy(uintptr_t dst, uintptr_t src, size_t bytes);
  void unary(int dtype, int op, uintptr_t x, uintptr_t y, int64_t n) const;
  void binary(int dtype, int op, uintptr_t a, uintptr_t b, uintptr_t out, int64_t n) const;
  void reduce(int dtype, int op, uintptr_t x, uintptr_t out, const ReduceShape& shape) const;
  void gemm(int dtype, const GemmProblem& problem, uintptr_t a, uintptr_t b, uintptr_t c) const;
  void conv2d(int dtype, const ConvArgs& args) const;
  void attention(int dtype, const AttentionArgs& args) const;

 private:
  cpu::Parallel par_;
};

}  // namespace oxijax::backend
