// The CUDA driver API of the interpreted device: what the pointer backend's CudaDevice
// (ffi/backend/cuda_device.cc, compiled unchanged) calls, on host memory registered with
// the interpreter (memory.h). One device, ordinal 0, with an H200's 141 GB; streams run
// their work at once, so synchronising has nothing to wait for.
#include <cuda.h>

#include <cstring>
#include <string>

#include "memory.h"

namespace {

CUctx_st* const kContext = reinterpret_cast<CUctx_st*>(0x1);
constexpr size_t kTotalBytes = size_t(141) << 30;
thread_local int tls_pushed = 0;

CUresult check_device_range(const void* p, size_t bytes, bool write) {
  std::string why;
  return oxijax::interp::host_access(p, bytes, write, false, why) ? CUDA_SUCCESS
                                                                  : CUDA_ERROR_INVALID_VALUE;
}

}  // namespace

extern "C" {

CUresult cuInit(unsigned flags) { return flags == 0 ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE; }
CUresult cuDeviceGetCount(int* count) {
  *count = 1;
  return CUDA_SUCCESS;
}
CUresult cuDeviceGet(CUdevice* device, int ordinal) {
  if (ordinal != 0) return CUDA_ERROR_INVALID_DEVICE;
  *device = 0;
  return CUDA_SUCCESS;
}
CUresult cuDevicePrimaryCtxRetain(CUcontext* ctx, CUdevice device) {
  if (device != 0) return CUDA_ERROR_INVALID_DEVICE;
  *ctx = kContext;
  return CUDA_SUCCESS;
}
CUresult cuDevicePrimaryCtxRelease(CUdevice device) {
  return device == 0 ? CUDA_SUCCESS : CUDA_ERROR_INVALID_DEVICE;
}
CUresult cuCtxPushCurrent(CUcontext ctx) {
  if (ctx != kContext) return CUDA_ERROR_INVALID_CONTEXT;
  ++tls_pushed;
  return CUDA_SUCCESS;
}
CUresult cuCtxPopCurrent(CUcontext* ctx) {
  if (tls_pushed == 0) return CUDA_ERROR_INVALID_CONTEXT;
  --tls_pushed;
  if (ctx) *ctx = kContext;
  return CUDA_SUCCESS;
}
CUresult cuMemAlloc(CUdeviceptr* ptr, size_t bytes) {
  if (bytes == 0) return CUDA_ERROR_INVALID_VALUE;
  if (bytes > kTotalBytes - oxijax::interp::device_bytes_in_use()) return CUDA_ERROR_OUT_OF_MEMORY;
  void* p = oxijax::interp::device_alloc(bytes, "a cuMemAlloc of " + std::to_string(bytes) +
                                                    " bytes");
  if (p == nullptr) return CUDA_ERROR_OUT_OF_MEMORY;
  *ptr = reinterpret_cast<CUdeviceptr>(p);
  return CUDA_SUCCESS;
}
CUresult cuMemFree(CUdeviceptr ptr) {
  if (check_device_range(reinterpret_cast<void*>(ptr), 1, false) != CUDA_SUCCESS)
    return CUDA_ERROR_INVALID_VALUE;
  oxijax::interp::device_free(reinterpret_cast<void*>(ptr));
  return CUDA_SUCCESS;
}
CUresult cuMemGetInfo(size_t* free_bytes, size_t* total_bytes) {
  *total_bytes = kTotalBytes;
  *free_bytes = kTotalBytes - oxijax::interp::device_bytes_in_use();
  return CUDA_SUCCESS;
}
CUresult cuMemcpyHtoDAsync(CUdeviceptr dst, const void* src, size_t bytes, CUstream) {
  void* d = reinterpret_cast<void*>(dst);
  if (const CUresult r = check_device_range(d, bytes, true); r != CUDA_SUCCESS) return r;
  std::memcpy(d, src, bytes);
  return CUDA_SUCCESS;
}
CUresult cuMemcpyDtoHAsync(void* dst, CUdeviceptr src, size_t bytes, CUstream) {
  const void* s = reinterpret_cast<const void*>(src);
  if (const CUresult r = check_device_range(s, bytes, false); r != CUDA_SUCCESS) return r;
  std::memcpy(dst, s, bytes);
  return CUDA_SUCCESS;
}
CUresult cuStreamCreate(CUstream* stream, unsigned) {
  *stream = reinterpret_cast<CUstream>(new char);  // a distinct handle per stream
  return CUDA_SUCCESS;
}
CUresult cuStreamDestroy(CUstream stream) {
  delete reinterpret_cast<char*>(stream);
  return CUDA_SUCCESS;
}
CUresult cuStreamSynchronize(CUstream) { return CUDA_SUCCESS; }

CUresult cuGetErrorName(CUresult error, const char** name) {
  switch (error) {
#define OXIJAX_NAME(x) \
  case x: *name = #x; return CUDA_SUCCESS;
    OXIJAX_NAME(CUDA_SUCCESS)
    OXIJAX_NAME(CUDA_ERROR_INVALID_VALUE)
    OXIJAX_NAME(CUDA_ERROR_OUT_OF_MEMORY)
    OXIJAX_NAME(CUDA_ERROR_NOT_INITIALIZED)
    OXIJAX_NAME(CUDA_ERROR_NO_DEVICE)
    OXIJAX_NAME(CUDA_ERROR_INVALID_DEVICE)
    OXIJAX_NAME(CUDA_ERROR_INVALID_IMAGE)
    OXIJAX_NAME(CUDA_ERROR_INVALID_CONTEXT)
    OXIJAX_NAME(CUDA_ERROR_INVALID_HANDLE)
    OXIJAX_NAME(CUDA_ERROR_NOT_FOUND)
    OXIJAX_NAME(CUDA_ERROR_ILLEGAL_ADDRESS)
    OXIJAX_NAME(CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES)
    OXIJAX_NAME(CUDA_ERROR_LAUNCH_TIMEOUT)
    OXIJAX_NAME(CUDA_ERROR_ASSERT)
    OXIJAX_NAME(CUDA_ERROR_ILLEGAL_INSTRUCTION)
    OXIJAX_NAME(CUDA_ERROR_MISALIGNED_ADDRESS)
    OXIJAX_NAME(CUDA_ERROR_INVALID_ADDRESS_SPACE)
    OXIJAX_NAME(CUDA_ERROR_INVALID_PC)
    OXIJAX_NAME(CUDA_ERROR_LAUNCH_FAILED)
    OXIJAX_NAME(CUDA_ERROR_NOT_SUPPORTED)
    OXIJAX_NAME(CUDA_ERROR_UNKNOWN)
#undef OXIJAX_NAME
  }
  return CUDA_ERROR_INVALID_VALUE;
}

CUresult cuGetErrorString(CUresult error, const char** text) {
  switch (error) {
    case CUDA_SUCCESS: *text = "no error"; return CUDA_SUCCESS;
    case CUDA_ERROR_INVALID_VALUE: *text = "invalid argument"; return CUDA_SUCCESS;
    case CUDA_ERROR_OUT_OF_MEMORY: *text = "out of memory"; return CUDA_SUCCESS;
    case CUDA_ERROR_INVALID_DEVICE: *text = "invalid device ordinal"; return CUDA_SUCCESS;
    case CUDA_ERROR_INVALID_CONTEXT: *text = "invalid device context"; return CUDA_SUCCESS;
    case CUDA_ERROR_ILLEGAL_ADDRESS:
      *text = "an illegal memory access was encountered";
      return CUDA_SUCCESS;
    case CUDA_ERROR_MISALIGNED_ADDRESS: *text = "misaligned address"; return CUDA_SUCCESS;
    case CUDA_ERROR_LAUNCH_FAILED: *text = "unspecified launch failure"; return CUDA_SUCCESS;
    default: break;
  }
  const char* name = nullptr;
  if (cuGetErrorName(error, &name) != CUDA_SUCCESS) return CUDA_ERROR_INVALID_VALUE;
  *text = name;
  return CUDA_SUCCESS;
}

}  // extern "C"
