// The nanobind submodule `_oxijax.backend`: the pointer backend's devices on raw
// addresses (see oxijax/backend for the checked, documented API).
#pragma once

#include <nanobind/nanobind.h>

namespace oxijax::backend {

void bind_backend(nanobind::module_& parent);

}  // namespace oxijax::backend
