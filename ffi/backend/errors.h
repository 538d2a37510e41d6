// Errors of the pointer backend's C++ side. A DriverFailure carries the CUDA driver's
// error code (a CUresult; a kernel launcher's runtime status is mapped onto the driver's
// code with the same meaning, see cuda_device.cc) and name; the binding turns it into
// oxijax._oxijax.backend.DriverError(code, name, message), which oxijax.backend maps
// onto DeviceError / OutOfMemory. Bad arguments throw std::invalid_argument (ValueError):
// the Python layer validates first, so those are a safety net.
#pragma once

#include <stdexcept>
#include <string>

namespace oxijax::backend {

struct DriverFailure : std::runtime_error {
  DriverFailure(int code, std::string name, const std::string& message)
      : std::runtime_error(message), code(code), name(std::move(name)) {}
  int code;
  std::string name;
};

// Codes for failures that are not the driver's own.
constexpr int kNoDriver = -1;    // libcuda.so.1 could not be loaded
constexpr int kNotBuilt = -2;    // this extension has no CUDA kernels
constexpr int kClosed = -3;      // the backend was closed

}  // namespace oxijax::backend
