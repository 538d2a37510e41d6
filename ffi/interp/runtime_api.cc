// The CUDA runtime API calls the launchers make, answered for an interpreted H200: the
// last-error state (per host thread, as the runtime's is per thread), device and kernel
// attributes, memset and copies on registered device memory. A failed launch's report
// travels with its error: cudaGetErrorString of that error on the same thread appends it,
// so the FFI handlers' error messages carry it to Python.
#include <algorithm>
#include <cstring>
#include <atomic>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "device.h"
#include "memory.h"

namespace oxijax::interp {
namespace {

thread_local cudaError_t tls_last_error = cudaSuccess;
thread_local cudaError_t tls_report_status = cudaSuccess;
thread_local std::string tls_report;
thread_local std::string tls_message;

std::mutex g_mu;
std::vector<std::string> g_reports;
std::vector<Launch> g_launched;
std::atomic<bool> g_execute{true};
std::map<const void*, size_t> g_dynamic_limit;
std::map<std::string, std::pair<cudaError_t, int>> g_injected;

cudaError_t set_error(cudaError_t status, std::string report) {
  tls_last_error = status;
  tls_report_status = status;
  tls_report = std::move(report);
  std::lock_guard lock(g_mu);
  g_reports.push_back(tls_report);
  return status;
}

const char* description(cudaError_t e) {
  switch (e) {
    case cudaSuccess: return "no error";
    case cudaErrorInvalidValue: return "invalid argument";
    case cudaErrorMemoryAllocation: return "out of memory";
    case cudaErrorInvalidConfiguration: return "invalid configuration argument";
    case cudaErrorInvalidDevice: return "invalid device ordinal";
    case cudaErrorNoDevice: return "no CUDA-capable device is detected";
    case cudaErrorInvalidDeviceFunction: return "invalid device function";
    case cudaErrorLaunchOutOfResources: return "too many resources requested for launch";
    case cudaErrorIllegalAddress: return "an illegal memory access was encountered";
    case cudaErrorMisalignedAddress: return "misaligned address";
    case cudaErrorLaunchFailure: return "unspecified launch failure";
    case cudaErrorAssert: return "device-side assert triggered";
    case cudaErrorIllegalInstruction: return "an illegal instruction was encountered";
    case cudaErrorNotSupported: return "operation not supported";
  }
  return "unrecognized error code";
}

}  // namespace

void inject_failure(const std::string& api, cudaError_t status, int count) {
  std::lock_guard lock(g_mu);
  g_injected[api] = {status, count};
}

cudaError_t injected_failure(const char* api) {
  std::lock_guard lock(g_mu);
  auto it = g_injected.find(api);
  if (it == g_injected.end() || it->second.second <= 0) return cudaSuccess;
  --it->second.second;
  return it->second.first;
}

size_t dynamic_shared_limit(const void* kernel) {
  std::lock_guard lock(g_mu);
  auto it = g_dynamic_limit.find(kernel);
  return it == g_dynamic_limit.end() ? kDevice.max_static_shared : it->second;
}

void record_launch(const Launch& launch) {
  std::lock_guard lock(g_mu);
  if (g_launched.size() < 100000) g_launched.push_back(launch);
}

bool execute_launches() { return g_execute.load(); }
void set_execute_launches(bool execute) { g_execute.store(execute); }

cudaError_t finish_launch(Launch& launch, cudaError_t status) {
  if (status == cudaSuccess) return status;
  return set_error(status, launch.report);
}

std::vector<std::string> take_reports() {
  std::lock_guard lock(g_mu);
  return std::exchange(g_reports, {});
}

std::vector<LaunchRecord> take_launch_log() {
  std::vector<Launch> launches;
  {
    std::lock_guard lock(g_mu);
    launches = std::exchange(g_launched, {});
  }
  std::vector<const void*> kernels;
  for (const Launch& l : launches) kernels.push_back(l.kernel);
  const std::vector<std::string> names = kernel_names(kernels);
  std::vector<LaunchRecord> log;
  for (size_t i = 0; i < launches.size(); ++i)
    log.push_back(LaunchRecord{names[i], launches[i].grid, launches[i].block,
                               launches[i].shared_bytes});
  return log;
}

std::vector<std::string> take_launched_kernels() {
  std::vector<std::string> unique;
  for (const LaunchRecord& r : take_launch_log())
    if (std::find(unique.begin(), unique.end(), r.kernel) == unique.end())
      unique.push_back(r.kernel);
  return unique;
}

}  // namespace oxijax::interp

namespace ix = oxijax::interp;

extern "C" {

cudaError_t cudaGetLastError() { return std::exchange(ix::tls_last_error, cudaSuccess); }
cudaError_t cudaPeekAtLastError() { return ix::tls_last_error; }

const char* cudaGetErrorName(cudaError_t e) {
  switch (e) {
#define OXIJAX_NAME(x) \
  case x: return #x;
    OXIJAX_NAME(cudaSuccess)
    OXIJAX_NAME(cudaErrorInvalidValue)
    OXIJAX_NAME(cudaErrorMemoryAllocation)
    OXIJAX_NAME(cudaErrorInvalidConfiguration)
    OXIJAX_NAME(cudaErrorInvalidDevice)
    OXIJAX_NAME(cudaErrorNoDevice)
    OXIJAX_NAME(cudaErrorInvalidDeviceFunction)
    OXIJAX_NAME(cudaErrorLaunchOutOfResources)
    OXIJAX_NAME(cudaErrorIllegalAddress)
    OXIJAX_NAME(cudaErrorMisalignedAddress)
    OXIJAX_NAME(cudaErrorLaunchFailure)
    OXIJAX_NAME(cudaErrorAssert)
    OXIJAX_NAME(cudaErrorIllegalInstruction)
    OXIJAX_NAME(cudaErrorNotSupported)
#undef OXIJAX_NAME
  }
  return "cudaErrorUnknown";
}

const char* cudaGetErrorString(cudaError_t e) {
  ix::tls_message = ix::description(e);
  if (e != cudaSuccess && e == ix::tls_report_status && !ix::tls_report.empty())
    ix::tls_message += "\n" + ix::tls_report;
  return ix::tls_message.c_str();
}

cudaError_t cudaGetDevice(int* device) {
  if (const cudaError_t e = ix::injected_failure("cudaGetDevice"))
    return ix::set_error(e, "injected cudaGetDevice failure");
  *device = 0;
  return cudaSuccess;
}

cudaError_t cudaDeviceGetAttribute(int* value, cudaDeviceAttr attr, int device) {
  if (const cudaError_t e = ix::injected_failure("cudaDeviceGetAttribute"))
    return ix::set_error(e, "injected cudaDeviceGetAttribute failure");
  if (device != 0)
    return ix::set_error(cudaErrorInvalidDevice, "the interpreter has one device, 0");
  const auto& d = ix::kDevice;
  switch (attr) {
    case cudaDevAttrMaxThreadsPerBlock: *value = d.max_threads_per_block; break;
    case cudaDevAttrMaxBlockDimX: *value = 1024; break;
    case cudaDevAttrMaxBlockDimY: *value = 1024; break;
    case cudaDevAttrMaxBlockDimZ: *value = 64; break;
    case cudaDevAttrMaxGridDimX: *value = int(d.max_grid_x); break;
    case cudaDevAttrMaxGridDimY: *value = int(d.max_grid_yz); break;
    case cudaDevAttrMaxGridDimZ: *value = int(d.max_grid_yz); break;
    case cudaDevAttrMaxSharedMemoryPerBlock: *value = int(d.max_static_shared); break;
    case cudaDevAttrWarpSize: *value = 32; break;
    case cudaDevAttrMultiProcessorCount: *value = d.sm_count; break;
    case cudaDevAttrComputeCapabilityMajor: *value = d.compute_major; break;
    case cudaDevAttrComputeCapabilityMinor: *value = d.compute_minor; break;
    case cudaDevAttrMaxSharedMemoryPerMultiprocessor: *value = int(d.max_shared_per_sm); break;
    case cudaDevAttrMaxSharedMemoryPerBlockOptin: *value = int(d.max_shared_optin); break;
    default:
      return ix::set_error(cudaErrorInvalidValue,
                           "device attribute " + std::to_string(int(attr)) +
                               " is not modelled by the interpreter");
  }
  return cudaSuccess;
}

cudaError_t cudaMalloc(void** ptr, size_t bytes) {
  *ptr = oxijax::interp::device_alloc(bytes, "a cudaMalloc of " + std::to_string(bytes) + " bytes");
  return *ptr ? cudaSuccess : ix::set_error(cudaErrorMemoryAllocation, "cudaMalloc: out of memory");
}

cudaError_t cudaFree(void* ptr) {
  if (ptr != nullptr) oxijax::interp::device_free(ptr);
  return cudaSuccess;
}

cudaError_t cudaMemcpy(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind) {
  return cudaMemcpyAsync(dst, src, bytes, kind, nullptr);
}

// Launches ran when they were made: nothing is outstanding.
cudaError_t cudaDeviceSynchronize() { return cudaSuccess; }

cudaError_t cudaMemsetAsync(void* ptr, int value, size_t bytes, cudaStream_t) {
  if (const cudaError_t e = ix::injected_failure("cudaMemsetAsync"))
    return ix::set_error(e, "injected cudaMemsetAsync failure");
  std::string why;
  if (!ix::host_access(ptr, bytes, true, false, why))
    return ix::set_error(cudaErrorInvalidValue, "cudaMemsetAsync: " + why);
  std::memset(ptr, value, bytes);
  return cudaSuccess;
}

cudaError_t cudaMemcpyAsync(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind,
                            cudaStream_t) {
  std::string why;
  const bool dst_device = kind == cudaMemcpyHostToDevice || kind == cudaMemcpyDeviceToDevice;
  const bool src_device = kind == cudaMemcpyDeviceToHost || kind == cudaMemcpyDeviceToDevice;
  if ((src_device && !ix::host_access(src, bytes, false, false, why)) ||
      (dst_device && !ix::host_access(dst, bytes, true, false, why)))
    return ix::set_error(cudaErrorInvalidValue, "cudaMemcpyAsync: " + why);
  std::memmove(dst, src, bytes);
  return cudaSuccess;
}

cudaError_t cudaFuncSetAttribute_untyped(const void* func, cudaFuncAttribute attr, int value) {
  if (const cudaError_t e = ix::injected_failure("cudaFuncSetAttribute"))
    return ix::set_error(e, "injected cudaFuncSetAttribute failure");
  if (attr == cudaFuncAttributeMaxDynamicSharedMemorySize) {
    if (value < 0 || size_t(value) > ix::kDevice.max_shared_optin)
      return ix::set_error(cudaErrorInvalidValue,
                           "cudaFuncSetAttribute: " + std::to_string(value) +
                               " bytes of dynamic shared memory, above the H200's 227 KiB");
    std::lock_guard lock(ix::g_mu);
    ix::g_dynamic_limit[func] = size_t(value);
  }
  return cudaSuccess;
}

// Blocks per SM from the thread and shared-memory limits (registers are not modelled).
cudaError_t cudaOccupancyMaxActiveBlocksPerMultiprocessor_untyped(int* blocks, const void*,
                                                                  int threads,
                                                                  size_t shared_bytes) {
  if (threads <= 0 || threads > 1024)
    return ix::set_error(cudaErrorInvalidValue, "occupancy query for " +
                                                    std::to_string(threads) + " threads");
  int by_threads = ix::kDevice.max_threads_per_sm / ((threads + 31) / 32 * 32);
  int by_shared = shared_bytes == 0
                      ? 32
                      : int(ix::kDevice.max_shared_per_sm / (shared_bytes + 1024));
  *blocks = std::max(0, std::min({by_threads, by_shared, 32}));
  return cudaSuccess;
}

}  // extern "C"
