#include "cpu_device.h"

#include <algorithm>
#include <cstring>
#include <thread>
#include <vector>

#include "cpu/isa_dispatch.h"
#include "host_pool.h"

namespace oxijax::backend {
namespace {

// One pool for the process, never destroyed: its threads die with the process, and no
// static destructor has to join them at exit.
HostPool& host_pool() {
  static HostPool* pool = new HostPool(
      std::max<int64_t>(0, int64_t(std::thread::hardware_concurrency()) - 1));
  return *pool;
}

}  // namespace

CpuDevice::CpuDevice() {
  par_ = host_pool().parallel();
}

void CpuDevice::copy(uintptr_t dst, uintptr_t src, size_t bytes) {
  if (bytes > 0) std::memmove(at<void>(dst), at<const void>(src), bytes);
}

void CpuDevice::unary(int dtype, int op, uintptr_t x, uintptr_t y, int64_t n) const {
  with_dtype(dtype, [&](auto t) {
    using T = decltype(t);
    cpu::kernels<T>().unary(par_, static_cast<UnaryOp>(op), at<const T>(x), at<T>(y), n);
  });
}

void CpuDevice::binary(int dtype, int op, uintptr_t a, uintptr_t b, uintptr_t out,
                       int64_t n) const {
  const BroadcastShape shape = flat_shape(n);
  with_dtype(dtype, [&](auto t) {
    using T = decltype(t);
    cpu::kernels<T>().binary(par_, static_cast<BinaryOp>(op), shape, at<const T>(a), at<const T>(b),
                at<T>(out));
  });
}

void CpuDevice::reduce(int dtype, int op, uintptr_t x, uintptr_t out,
                       const ReduceShape& shape) const {
  with_dtype(dtype, [&](auto t) {
    using T = decltype(t);
    cpu::kernels<T>().reduce(par_, static_cast<ReduceOp>(op), shape, at<const T>(x), at<T>(out));
  });
}

void CpuDevice::gemm(int dtype, const GemmProblem& problem, uintptr_t a, uintptr_t b,
                     uintptr_t c) const {
  const GemmShape shape = gemm_shape(problem);
  with_dtype(dtype, [&](auto t) {
    using T = decltype(t);
    cpu::kernels<T>().gemm(par_, shape, at<const T>(a), at<const T>(b),
              problem.beta != 0.0 ? at<const T>(c) : nullptr, at<T>(c));
  });
}

void CpuDevice::conv2d(int dtype, const ConvArgs& args) const {
  const ConvShape shape = conv_shape(args.input, args.filter, args.output, args.stride,
                                     args.padding);
  with_dtype(dtype, [&](auto t) {
    using T = decltype(t);
    cpu::kernels<T>().conv2d(par_, shape, at<const T>(args.x), at<const T>(args.w), at<T>(args.out));
  });
}

void CpuDevice::attention(int dtype, const AttentionArgs& args) const {
  const AttentionShape& s = args.shape;
  with_dtype(dtype, [&](auto t) {
    using T = decltype(t);
    // The kernel also writes each row's log-sum-exp (for the JAX backward pass).
    std::vector<Acc<T>> lse(size_t(s.batch * s.heads * s.seq_q));
    cpu::kernels<T>().attention(par_, s, at<const T>(args.q), at<const T>(args.k), at<const T>(args.v),
                   at<T>(args.out), lse.data());
  });
}

}  // namespace oxijax::backend
