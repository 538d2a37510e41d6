// The device the CUDA interpreter stands for (an H200, sm_90), the runtime API's state
// (last error, per-kernel attributes) and the record of what ran, for the tests.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "state.h"

namespace oxijax::interp {

struct DeviceProperties {
  int sm_count = 132;
  int compute_major = 9, compute_minor = 0;
  int max_threads_per_block = 1024;
  size_t max_static_shared = 48 << 10;       // also the default dynamic limit
  size_t max_shared_optin = 227 << 10;       // cudaDevAttrMaxSharedMemoryPerBlockOptin
  size_t max_shared_per_sm = 228 << 10;
  int max_threads_per_sm = 2048;
  uint64_t max_grid_x = (uint64_t(1) << 31) - 1;
  unsigned max_grid_yz = 65535;
};
inline constexpr DeviceProperties kDevice{};

// The dynamic shared memory a launch of `kernel` may ask for (48 KiB unless raised by
// cudaFuncSetAttribute).
size_t dynamic_shared_limit(const void* kernel);
// Keeps the launch for take_launched_kernels() and take_launch_log().
void record_launch(const Launch& launch);
// Whether launches run their blocks (tests of launch configurations alone turn it off:
// the configuration is checked and logged, nothing is executed).
bool execute_launches();
void set_execute_launches(bool execute);

struct LaunchRecord {
  std::string kernel;
  dim3 grid, block;
  size_t shared_bytes;
};
// Sets the runtime's last error and keeps the report; returns status.
cudaError_t finish_launch(Launch& launch, cudaError_t status);

// For the Python module: the reports of failed launches (oldest first) and the names
// of the kernels launched, since the last call.
std::vector<std::string> take_reports();
std::vector<std::string> take_launched_kernels();
std::vector<LaunchRecord> take_launch_log();

// Fault injection, for tests of the launchers' error handling: the next `count` calls of
// `api` ("launch", "cudaDeviceGetAttribute", "cudaFuncSetAttribute", "cudaGetDevice",
// "cudaMemsetAsync") fail with `status` as the GPU's runtime would report it.
void inject_failure(const std::string& api, cudaError_t status, int count);
// The injected status for one call of `api` (cudaSuccess when none is pending).
cudaError_t injected_failure(const char* api);

}  // namespace oxijax::interp
