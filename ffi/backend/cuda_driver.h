// The few CUDA driver API functions the pointer backend uses, loaded from libcuda.so.1
// at run time (dlopen), so that the extension imports on machines without a driver.
// Compiled only with OXIJAX_WITH_CUDA.
#pragma once

#include <cuda.h>

namespace oxijax::backend {

struct CudaDriver {
  // Members are named after the API functions; the _v2 entry points are loaded where
  // cuda.h maps the plain name onto them.
  decltype(&::cuInit) init;
  decltype(&::cuDeviceGetCount) device_get_count;
  decltype(&::cuDeviceGet) device_get;
  decltype(&::cuDevicePrimaryCtxRetain) primary_ctx_retain;
  decltype(&::cuDevicePrimaryCtxRelease) primary_ctx_release;
  decltype(&::cuCtxPushCurrent) ctx_push_current;
  decltype(&::cuCtxPopCurrent) ctx_pop_current;
  decltype(&::cuMemAlloc) mem_alloc;
  decltype(&::cuMemFree) mem_free;
  decltype(&::cuMemGetInfo) mem_get_info;
  decltype(&::cuMemcpyHtoDAsync) memcpy_htod_async;
  decltype(&::cuMemcpyDtoHAsync) memcpy_dtoh_async;
  decltype(&::cuStreamCreate) stream_create;
  decltype(&::cuStreamDestroy) stream_destroy;
  decltype(&::cuStreamSynchronize) stream_synchronize;
  decltype(&::cuGetErrorName) get_error_name;
  decltype(&::cuGetErrorString) get_error_string;

  // The process's driver, loaded on first use; throws DriverFailure(kNoDriver) when
  // libcuda.so.1 or one of the functions is missing.
  static const CudaDriver& get();

  // Throws DriverFailure(result, its name, "<what>: <description>") unless CUDA_SUCCESS.
  void check(CUresult result, const char* what) const;
};

}  // namespace oxijax::backend
