// The Python extension `oxijax._oxijax`: hands the FFI handlers to Python as capsules
// (registered by oxijax/_ffi.py) and reports how the extension was built.
#include <nanobind/nanobind.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include "handlers.h"
#include "xla/ffi/api/c_api.h"

namespace nb = nanobind;
namespace bindings = oxijax::bindings;

namespace {

template <typename Fn>
nb::capsule handler_capsule(Fn* fn) {
  static_assert(std::is_invocable_r_v<XLA_FFI_Error*, Fn, XLA_FFI_CallFrame*>,
                "an XLA FFI handler has the signature XLA_FFI_Error*(XLA_FFI_CallFrame*)");
  return nb::capsule(reinterpret_cast<void*>(fn));
}

#define OXIJAX_HANDLER_DICT(platform)                                   \
  [] {                                                                  \
    nb::dict targets;                                                   \
    targets["oxijax_unary"] = handler_capsule(bindings::platform##_unary);         \
    targets["oxijax_binary"] = handler_capsule(bindings::platform##_binary);       \
    targets["oxijax_reduce"] = handler_capsule(bindings::platform##_reduce);       \
    targets["oxijax_gemm"] = handler_capsule(bindings::platform##_gemm);           \
    targets["oxijax_conv2d"] = handler_capsule(bindings::platform##_conv2d);       \
    targets["oxijax_attention"] = handler_capsule(bindings::platform##_attention); \
    return targets;                                                     \
  }()

// Adds the backward passes' targets (autodiff) to a platform's dict.
#define OXIJAX_ADD_BACKWARD_HANDLERS(dict_item, platform)                                       \
  [](nb::dict targets) {                                                                        \
    targets["oxijax_unary_grad"] = handler_capsule(bindings::platform##_unary_grad);            \
    targets["oxijax_binary_partial"] = handler_capsule(bindings::platform##_binary_partial);    \
    targets["oxijax_conv2d_backward_data"] =                                                    \
        handler_capsule(bindings::platform##_conv2d_backward_data);                             \
    targets["oxijax_conv2d_backward_filter"] =                                                  \
        handler_capsule(bindings::platform##_conv2d_backward_filter);                           \
  }(nb::cast<nb::dict>(dict_item))

}  // namespace

NB_MODULE(_oxijax, m) {
  m.doc() = "oxijax's XLA FFI handlers (use the oxijax package, not this module)";

  m.def("registrations", [] {
    nb::dict by_platform;
    by_platform["cpu"] = OXIJAX_HANDLER_DICT(Cpu);
    OXIJAX_ADD_BACKWARD_HANDLERS(by_platform["cpu"], Cpu);
#ifdef OXIJAX_WITH_CUDA
    by_platform["CUDA"] = OXIJAX_HANDLER_DICT(Cuda);
    OXIJAX_ADD_BACKWARD_HANDLERS(by_platform["CUDA"], Cuda);
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
    info["cpu_flags"] = std::string(OXIJAX_CPU_FLAGS);
    return info;
  }, "How this extension was built: CUDA support, architectures, FFI API version.");
}
