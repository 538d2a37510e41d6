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

#include "bind_ops.h"
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
  bind_cuda_device(cuda);
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
