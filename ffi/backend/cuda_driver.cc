#include "cuda_driver.h"

#include <dlfcn.h>

#include <mutex>
#include <string>

#include "errors.h"

namespace oxijax::backend {
namespace {

#ifdef OXIJAX_CUDA_INTERPRET
// The interpreted device's driver (ffi/interp/driver.cc), linked into the module.
CudaDriver load_driver() {
  return CudaDriver{&cuInit, &cuDeviceGetCount, &cuDeviceGet, &cuDevicePrimaryCtxRetain,
                    &cuDevicePrimaryCtxRelease, &cuCtxPushCurrent, &cuCtxPopCurrent,
                    &cuMemAlloc, &cuMemFree, &cuMemGetInfo, &cuMemcpyHtoDAsync,
                    &cuMemcpyDtoHAsync, &cuStreamCreate, &cuStreamDestroy,
                    &cuStreamSynchronize, &cuGetErrorName, &cuGetErrorString};
}
#else
template <typename Fn>
void load(void* lib, Fn& fn, const char* symbol) {
  fn = reinterpret_cast<Fn>(dlsym(lib, symbol));
  if (fn == nullptr)
    throw DriverFailure(kNoDriver, "CUDA_DRIVER_SYMBOL_MISSING",
                        std::string("libcuda.so.1 has no ") + symbol);
}

CudaDriver load_driver() {
  // Never dlclose'd: the driver stays loaded for the process (JAX uses it too).
  void* lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  if (lib == nullptr) {
    const char* why = dlerror();
    throw DriverFailure(kNoDriver, "CUDA_DRIVER_NOT_FOUND",
                        std::string("cannot load the CUDA driver (libcuda.so.1): ") +
                            (why != nullptr ? why : "unknown error"));
  }
  CudaDriver d;
  load(lib, d.init, "cuInit");
  load(lib, d.device_get_count, "cuDeviceGetCount");
  load(lib, d.device_get, "cuDeviceGet");
  load(lib, d.primary_ctx_retain, "cuDevicePrimaryCtxRetain");
  load(lib, d.primary_ctx_release, "cuDevicePrimaryCtxRelease_v2");
  load(lib, d.ctx_push_current, "cuCtxPushCurrent_v2");
  load(lib, d.ctx_pop_current, "cuCtxPopCurrent_v2");
  load(lib, d.mem_alloc, "cuMemAlloc_v2");
  load(lib, d.mem_free, "cuMemFree_v2");
  load(lib, d.mem_get_info, "cuMemGetInfo_v2");
  load(lib, d.memcpy_htod_async, "cuMemcpyHtoDAsync_v2");
  load(lib, d.memcpy_dtoh_async, "cuMemcpyDtoHAsync_v2");
  load(lib, d.stream_create, "cuStreamCreate");
  load(lib, d.stream_destroy, "cuStreamDestroy_v2");
  load(lib, d.stream_synchronize, "cuStreamSynchronize");
  load(lib, d.get_error_name, "cuGetErrorName");
  load(lib, d.get_error_string, "cuGetErrorString");
  return d;
}
#endif

}  // namespace

const CudaDriver& CudaDriver::get() {
  // A failed load is retried on the next call (call_once rethrows and stays unset).
  static std::once_flag once;
  static CudaDriver driver;
  std::call_once(once, [] { driver = load_driver(); });
  return driver;
}

void CudaDriver::check(CUresult result, const char* what) const {
  if (result == CUDA_SUCCESS) return;
  const char* name = nullptr;
  const char* text = nullptr;
  if (get_error_name(result, &name) != CUDA_SUCCESS) name = "CUDA_ERROR_UNKNOWN";
  if (get_error_string(result, &text) != CUDA_SUCCESS) text = "unknown error";
  throw DriverFailure(static_cast<int>(result), name, std::string(what) + ": " + text);
}

}  // namespace oxijax::backend
