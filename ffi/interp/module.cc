// The Python extension `oxijax._oxijax_interp`: the CUDA kernels, launchers and FFI
// handlers of ffi/cuda and ffi/bindings compiled for the CUDA interpreter. It hands the
// handlers to Python as CPU targets (oxijax_interp_<op>), the pointer backend's
// interpreted CUDA device, the schedule, and what ran or failed, for the tests.
#include <nanobind/nanobind.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/vector.h>

#include <stdexcept>

#include "backend/bind_ops.h"
#include "backend/cuda_device.h"
#include "backend/errors.h"
#include "device.h"
#include "handlers.h"
#include "memory.h"
#include "planted.h"
#include "ptx_probe.h"

namespace nb = nanobind;
using namespace nb::literals;
namespace ix = oxijax::interp;

namespace {

#define OXIJAX_ADD_INTERP_TARGET(name) \
  targets["oxijax_interp_" #name] = nb::capsule(reinterpret_cast<void*>(oxijax::bindings::Cuda_##name));

nb::dict interp_targets() {
  nb::dict targets;
  OXIJAX_FOR_EACH_TARGET(OXIJAX_ADD_INTERP_TARGET)
  return targets;
}

ix::Order parse_order(const std::string& name) {
  if (name == "forward") return ix::Order::kForward;
  if (name == "reverse") return ix::Order::kReverse;
  if (name == "shuffle") return ix::Order::kShuffle;
  throw std::invalid_argument("schedule order must be 'forward', 'reverse' or 'shuffle', not '" +
                              name + "'");
}

}  // namespace

NB_MODULE(_oxijax_interp, m) {
  m.doc() = "oxijax's CUDA kernels on the CUDA interpreter (use oxijax.cuda_interpreter)";

  m.def("registrations", [] {
    nb::dict by_platform;
    by_platform["cpu"] = interp_targets();
    return by_platform;
  }, "FFI handler capsules of the interpreted CUDA handlers, keyed by platform and target.");

  m.def("set_schedule", [](const std::string& order, uint64_t seed) {
    ix::set_schedule(ix::Schedule{parse_order(order), seed});
  }, "order"_a, "seed"_a = 0,
     "Thread and block order between synchronisation points: 'forward', 'reverse' or "
     "'shuffle' (a new permutation at every point, from `seed`).");
  m.def("schedule", [] {
    const ix::Schedule s = ix::current_schedule();
    const char* names[] = {"forward", "reverse", "shuffle"};
    return nb::make_tuple(names[int(s.order)], s.seed);
  });
  m.def("take_reports", &ix::take_reports,
        "The reports of the launches that failed since the last call, oldest first.");
  m.def("take_launched_kernels", &ix::take_launched_kernels,
        "The kernels launched since the last call (demangled names, each once).");
  m.def("take_launch_log", [] {
    nb::list log;
    for (const ix::LaunchRecord& r : ix::take_launch_log())
      log.append(nb::make_tuple(r.kernel, nb::make_tuple(r.grid.x, r.grid.y, r.grid.z),
                                nb::make_tuple(r.block.x, r.block.y, r.block.z), r.shared_bytes));
    return log;
  }, "The launches since the last call: (kernel, grid, block, dynamic shared bytes).");
  m.def("set_execute", &ix::set_execute_launches, "execute"_a,
        "False: launches are checked and logged but run nothing (launch-configuration tests).");
  m.def("inject_failure", [](const std::string& api, int status, int count) {
    ix::inject_failure(api, cudaError_t(status), count);
  }, "api"_a, "status"_a, "count"_a = 1,
     "The next `count` calls of `api` ('launch', 'cudaDeviceGetAttribute', "
     "'cudaFuncSetAttribute', 'cudaGetDevice', 'cudaMemsetAsync') fail with cudaError_t "
     "`status` (0 clears).");
  m.def("device_bytes_in_use", &ix::device_bytes_in_use);
  m.def("planted_cases", &ix::planted_cases);
  m.def("run_planted", [](const std::string& name, bool buggy) {
    ix::PlantedResult r;
    {
      nb::gil_scoped_release release;
      r = ix::run_planted(name, buggy);
    }
    return nb::make_tuple(r.status, r.report, r.output);
  }, "name"_a, "buggy"_a, "Runs a planted-bug case: (status, report, output).");

  m.def("ptx_probe", &oxijax::bindings::run_ptx_probe, "probe"_a, "words"_a,
        nb::call_guard<nb::gil_scoped_release>(),
        "Runs ptx.h probe `probe` in the interpreter: 1024 words in, 1024 words out.");

  // The pointer backend's CUDA device on the interpreter; driver failures raise
  // oxijax._oxijax.backend.DriverError like the real device's.
  nb::module_ backend = m.def_submodule("backend", "The interpreted CUDA device.");
  nb::object driver_error = nb::module_::import_("oxijax._oxijax").attr("backend").attr("DriverError");
  static PyObject* error_type = driver_error.inc_ref().ptr();
  nb::register_exception_translator([](const std::exception_ptr& p, void*) {
    try {
      std::rethrow_exception(p);
    } catch (const oxijax::backend::DriverFailure& e) {
      nb::object args = nb::make_tuple(e.code, e.name, e.what());
      PyErr_SetObject(error_type, args.ptr());
    }
  });
  nb::class_<oxijax::backend::CudaDevice> device(backend, "CudaDevice");
  oxijax::backend::bind_cuda_device(device);
}
