// The Python extension `oxijax._oxijax`: hands the FFI handlers to Python as capsules
// (registered by oxijax/_ffi.py), reports how the extension was built, and holds the
// pointer backend's devices (submodule `backend`, ffi/backend).
#include <nanobind/nanobind.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include "backend/bindings.h"
#include "cpu/isa_dispatch.h"
#ifdef OXIJAX_WITH_CUDA
#include "ptx_probe.h"
#endif
#include "handlers.h"
#include "xla/ffi/api/c_api.h"

namespace nb = nanobind;
using namespace nb::literals;
namespace bindings = oxijax::bindings;

namespace {

template <typename Fn>
nb::capsule handler_capsule(Fn* fn) {
  static_assert(std::is_invocable_r_v<XLA_FFI_Error*, Fn, XLA_FFI_CallFrame*>,
                "an XLA FFI handler has the signature XLA_FFI_Error*(XLA_FFI_CallFrame*)");
  return nb::capsule(reinterpret_cast<void*>(fn));
}

// Target name -> handler capsule, for every target of one platform.
#define OXIJAX_ADD_TARGET(platform, name) \
  targets["oxijax_" #name] = handler_capsule(bindings::platform##_##name);
#define OXIJAX_ADD_CPU_TARGET(name) OXIJAX_ADD_TARGET(Cpu, name)
#define OXIJAX_ADD_CUDA_TARGET(name) OXIJAX_ADD_TARGET(Cuda, name)

nb::dict cpu_targets() {
  nb::dict targets;
  OXIJAX_FOR_EACH_TARGET(OXIJAX_ADD_CPU_TARGET)
  return targets;
}

#ifdef OXIJAX_WITH_CUDA
nb::dict cuda_targets() {
  nb::dict targets;
  OXIJAX_FOR_EACH_TARGET(OXIJAX_ADD_CUDA_TARGET)
  return targets;
}
#endif

}  // namespace

NB_MODULE(_oxijax, m) {
  m.doc() = "oxijax's XLA FFI handlers (use the oxijax package, not this module)";

  m.def("registrations", [] {
    nb::dict by_platform;
    by_platform["cpu"] = cpu_targets();
#ifdef OXIJAX_WITH_CUDA
    by_platform["CUDA"] = cuda_targets();
#endif
    return by_platform;
  }, "FFI handler capsules, keyed by platform and then by target name.");

  m.def("build_info", [] {
    nb::dict info;
#ifdef OXIJAX_WITH_CUDA
    info["cuda"] = true;
    info["cuda_architectures"] = std::string(OXIJAX_CUDA_ARCHITECTURES);
#else
    info["cuda"] = false;
    info["cuda_architectures"] = std::string();
#endif
    info["ffi_api_version"] = nb::make_tuple(XLA_FFI_API_MAJOR, XLA_FFI_API_MINOR);
    const oxijax::cpu::KernelTable& cpu = oxijax::cpu::kernel_table();
    info["cpu_isa"] = std::string(cpu.level);
    info["cpu_flags"] = std::string(cpu.flags);
    info["cpu_isa_levels"] = oxijax::cpu::runnable_isa_levels();
    info["cpu_isa_built"] = oxijax::cpu::built_isa_levels();
    info["cpu_isa_default"] = oxijax::cpu::default_isa_level();
    return info;
  }, "How this extension was built (CUDA support, architectures, FFI API version) and "
     "which CPU kernel level it runs: cpu_isa, chosen from cpu_isa_levels (those of "
     "cpu_isa_built this CPU runs) at load time (cpu_isa_default) or by OXIJAX_CPU_ISA.");

#ifdef OXIJAX_WITH_CUDA
  m.def("ptx_probe", &bindings::run_ptx_probe, "probe"_a, "words"_a,
        nb::call_guard<nb::gil_scoped_release>(),
        "Runs ptx.h probe `probe` (cuda/kernels.h PtxProbe) on the current GPU: 1024 words "
        "in, 1024 words out.");
#endif
  oxijax::backend::bind_backend(m);
}
