// Thin functions: oxijax/backend validates everything (SPEC §2's order) before calling
// here; blocking work runs with the GIL released.
#include "bindings.h"

#include <nanobind/ndarray.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <cstdint>
#include <cstdio>
#include <vector>

#include "cpu_device.h"
#include "errors.h"
#include "host_memory.h"
#ifdef OXIJAX_WITH_CUDA
#include "cuda_device.h"
#endif

namespace nb = nanobind;
using namespace nb::literals;

namespace oxijax::backend {
namespace {

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

nb::dlpack::dtype dlpack_dtype(int code) {
  switch (static_cast<DType>(code)) {
    case DType::kFloat16: return {uint8_t(nb::dlpack::dtype_code::Float), 16, 1};
    case DType::kBFloat16: return {uint8_t(nb::dlpack::dtype_code::Bfloat), 16, 1};
    case DType::kFloat32: return {uint8_t(nb::dlpack::dtype_code::Float), 32, 1};
    case DType::kFloat64: return {uint8_t(nb::dlpack::dtype_code::Float), 64, 1};
  }
  throw std::invalid_argument("unknown dtype code");
}

}  // namespace

void bind_backend(nb::module_& parent) {
  nb::module_ m = parent.def_submodule(
      "backend", "The pointer backend's devices on raw addresses (use oxijax.backend).");

  // DriverError(code, name, message): a failure of the CUDA driver or of a kernel launch
  // (the driver's CUresult code and name either way, errors.h).
  static PyObject* driver_error =
      PyErr_NewException("oxijax._oxijax.backend.DriverError", PyExc_RuntimeError, nullptr);
  m.attr("DriverError") = nb::handle(driver_error);
  nb::register_exception_translator([](const std::exception_ptr& p, void* payload) {
    try {
      std::rethrow_exception(p);
    } catch (const DriverFailure& e) {
      nb::object args = nb::make_tuple(e.code, e.name, e.what());
      PyErr_SetObject(static_cast<PyObject*>(payload), args.ptr());
    }
  }, driver_error);

  nb::class_<HostAllocation>(m, "HostAllocation",
                             "Aligned host memory, freed with the object (MemoryError if the "
                             "host cannot provide it).")
      .def(nb::init<size_t>(), "nbytes"_a, nb::call_guard<nb::gil_scoped_release>())
      .def_prop_ro("address", &HostAllocation::address)
      .def_prop_ro("size", &HostAllocation::size);
  m.def("live_host_allocations", &HostAllocation::live_count,
        "How many HostAllocations this process holds.");
  m.def("live_host_bytes", &HostAllocation::live_bytes, "The bytes they hold.");
  // For the leak tests: after the interpreter has torn everything down (Py_AtExit runs
  // last), print to stderr what host memory is still allocated.
  m.def("report_live_host_memory_at_exit", [] {
    Py_AtExit([] {
      std::fprintf(stderr, "oxijax: live host allocations at exit: %lld (%lld bytes)\n",
                   static_cast<long long>(HostAllocation::live_count()),
                   static_cast<long long>(HostAllocation::live_bytes()));
    });
  }, "At interpreter exit, after finalisation, prints the live host allocations to stderr.");

  nb::class_<CpuDevice> cpu(m, "CpuDevice");
  cpu.def(nb::init<>());
  bind_ops(cpu);
  m.def("host_copy", &CpuDevice::copy, "dst"_a, "src"_a, "nbytes"_a,
        nb::call_guard<nb::gil_scoped_release>(),
        "memmove(dst, src, nbytes) on host addresses.");

#ifdef OXIJAX_WITH_CUDA
  m.attr("cuda_built") = true;
  nb::class_<CudaDevice> cuda(m, "CudaDevice");
  cuda.def(nb::init<int>(), "ordinal"_a, nb::call_guard<nb::gil_scoped_release>());
  const auto release = nb::call_guard<nb::gil_scoped_release>();
  cuda.def_prop_ro("ordinal", &CudaDevice::ordinal);
  cuda.def_prop_ro("stream", &CudaDevice::stream);
  cuda.def("alloc", &CudaDevice::alloc, "nbytes"_a, release);
  cuda.def("free", &CudaDevice::free, "ptr"_a, release);
  cuda.def("htod", &CudaDevice::htod, "dst"_a, "src"_a, "nbytes"_a, release);
  cuda.def("dtoh", &CudaDevice::dtoh, "dst"_a, "src"_a, "nbytes"_a, release);
  cuda.def("synchronize", &CudaDevice::synchronize, release);
  cuda.def("mem_info", &CudaDevice::mem_info, release);
  cuda.def("close", &CudaDevice::close, release);
  bind_ops(cuda);
#else
  m.attr("cuda_built") = false;
#endif

  // A DLPack-capable view of memory at `ptr` (row-major `shape`), keeping `owner`
  // alive until the consumer (jax.dlpack.from_dlpack) lets go of it.
  m.def("dlpack_view", [](uintptr_t ptr, std::vector<size_t> shape, int dtype, int device_type,
                          int device_id, nb::handle owner) {
    return nb::ndarray<nb::array_api>(reinterpret_cast<void*>(ptr), shape.size(), shape.data(), owner,
                         nullptr, dlpack_dtype(dtype), device_type, device_id);
  }, "ptr"_a, "shape"_a, "dtype"_a, "device_type"_a, "device_id"_a, "owner"_a);
}

}  // namespace oxijax::backend
