// The op methods every backend device class exposes to Python (the same names and
// arguments for CpuDevice, CudaDevice and the CUDA interpreter's device), bound with the
// GIL released.
#pragma once

#include <nanobind/nanobind.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/vector.h>

#include <cstdint>
#include <vector>

#include "device_ops.h"
#include "problems.h"

namespace oxijax::backend {

namespace nb = nanobind;
using namespace nb::literals;

template <class Device>
void bind_ops(nb::class_<Device>& cls) {
  const auto release = nb::call_guard<nb::gil_scoped_release>();
  cls.def("unary", [](Device& d, int dtype, int op, uintptr_t x, uintptr_t y, int64_t n) {
    d.unary(dtype, op, x, y, n);
  }, "dtype"_a, "op"_a, "x"_a, "y"_a, "n"_a, release);
  cls.def("binary", [](Device& d, int dtype, int op, uintptr_t a, uintptr_t b, uintptr_t out,
                       int64_t n) { d.binary(dtype, op, a, b, out, n); },
          "dtype"_a, "op"_a, "a"_a, "b"_a, "out"_a, "n"_a, release);
  cls.def("reduce", [](Device& d, int dtype, int op, uintptr_t x, uintptr_t out, int64_t outer,
                       int64_t axis, int64_t inner) {
    d.reduce(dtype, op, x, out, reduce_shape(outer, axis, inner));
  }, "dtype"_a, "op"_a, "x"_a, "out"_a, "outer"_a, "axis"_a, "inner"_a, release);
  cls.def("gemm", [](Device& d, int dtype, bool trans_a, bool trans_b, int64_t m, int64_t n,
                     int64_t k, double alpha, uintptr_t a, int64_t lda, int64_t stride_a,
                     uintptr_t b, int64_t ldb, int64_t stride_b, double beta, uintptr_t c,
                     int64_t ldc, int64_t stride_c, int64_t batch) {
    GemmProblem p;
    p.trans_a = trans_a, p.trans_b = trans_b, p.m = m, p.n = n, p.k = k;
    p.alpha = alpha, p.beta = beta, p.batch = batch;
    p.lda = lda, p.stride_a = stride_a, p.ldb = ldb, p.stride_b = stride_b;
    p.ldc = ldc, p.stride_c = stride_c;
    d.gemm(dtype, p, a, b, c);
  }, "dtype"_a, "trans_a"_a, "trans_b"_a, "m"_a, "n"_a, "k"_a, "alpha"_a, "a"_a, "lda"_a,
     "stride_a"_a, "b"_a, "ldb"_a, "stride_b"_a, "beta"_a, "c"_a, "ldc"_a, "stride_c"_a,
     "batch"_a, release, "Row-major strided batch, c in place (see problems.h).");
  cls.def("conv2d", [](Device& d, int dtype, uintptr_t x, std::vector<int64_t> input,
                       uintptr_t w, std::vector<int64_t> filter, uintptr_t out,
                       std::vector<int64_t> output, std::vector<int64_t> stride,
                       std::vector<int64_t> padding) {
    d.conv2d(dtype, ConvArgs{x, w, out, input, filter, output, stride, padding});
  }, "dtype"_a, "x"_a, "input"_a, "w"_a, "filter"_a, "out"_a, "output"_a, "stride"_a,
     "padding"_a, release);
  cls.def("attention", [](Device& d, int dtype, uintptr_t q, uintptr_t k, uintptr_t v,
                          uintptr_t out, int64_t batch, int64_t heads, int64_t seq_q,
                          int64_t seq_kv, int64_t head_dim, double scale, bool causal) {
    d.attention(dtype, AttentionArgs{q, k, v, out,
                                     attention_shape(batch, heads, seq_q, seq_kv, head_dim,
                                                     scale, causal)});
  }, "dtype"_a, "q"_a, "k"_a, "v"_a, "out"_a, "batch"_a, "heads"_a, "seq_q"_a, "seq_kv"_a,
     "head_dim"_a, "scale"_a, "causal"_a, release);
}


// A CUDA device class (CudaDevice, or the interpreter's): memory, copies, lifetime, ops.
template <class Device>
void bind_cuda_device(nb::class_<Device>& cls) {
  const auto release = nb::call_guard<nb::gil_scoped_release>();
  cls.def(nb::init<int>(), "ordinal"_a, release);
  cls.def_prop_ro("ordinal", &Device::ordinal);
  cls.def_prop_ro("stream", &Device::stream);
  cls.def("alloc", &Device::alloc, "nbytes"_a, release);
  cls.def("free", &Device::free, "ptr"_a, release);
  cls.def("htod", &Device::htod, "dst"_a, "src"_a, "nbytes"_a, release);
  cls.def("dtoh", &Device::dtoh, "dst"_a, "src"_a, "nbytes"_a, release);
  cls.def("synchronize", &Device::synchronize, release);
  cls.def("mem_info", &Device::mem_info, release);
  cls.def("close", &Device::close, release);
  bind_ops(cls);
}

}  // namespace oxijax::backend
