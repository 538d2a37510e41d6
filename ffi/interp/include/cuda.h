// The CUDA driver API types the pointer backend's CudaDevice uses, for the interpreted
// device (ffi/interp/driver.cc serves the calls). Values as in CUDA 13's cuda.h.
#pragma once

#include <cstddef>

enum CUresult {
  CUDA_SUCCESS = 0,
  CUDA_ERROR_INVALID_VALUE = 1,
  CUDA_ERROR_OUT_OF_MEMORY = 2,
  CUDA_ERROR_NOT_INITIALIZED = 3,
  CUDA_ERROR_NO_DEVICE = 100,
  CUDA_ERROR_INVALID_DEVICE = 101,
  CUDA_ERROR_INVALID_IMAGE = 200,
  CUDA_ERROR_INVALID_CONTEXT = 201,
  CUDA_ERROR_INVALID_HANDLE = 400,
  CUDA_ERROR_NOT_FOUND = 500,
  CUDA_ERROR_ILLEGAL_ADDRESS = 700,
  CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES = 701,
  CUDA_ERROR_LAUNCH_TIMEOUT = 702,
  CUDA_ERROR_ASSERT = 710,
  CUDA_ERROR_ILLEGAL_INSTRUCTION = 715,
  CUDA_ERROR_MISALIGNED_ADDRESS = 716,
  CUDA_ERROR_INVALID_ADDRESS_SPACE = 717,
  CUDA_ERROR_INVALID_PC = 718,
  CUDA_ERROR_LAUNCH_FAILED = 719,
  CUDA_ERROR_NOT_SUPPORTED = 801,
  CUDA_ERROR_UNKNOWN = 999,
};
using CUdevice = int;
using CUdeviceptr = unsigned long long;
using CUcontext = struct CUctx_st*;
using CUstream = struct CUstream_st*;
enum CUstream_flags { CU_STREAM_DEFAULT = 0, CU_STREAM_NON_BLOCKING = 1 };

// Declared for cuda_driver.h's function-pointer types; the interpreter defines them in
// ffi/interp/driver.cc.
extern "C" {
CUresult cuInit(unsigned flags);
CUresult cuDeviceGetCount(int* count);
CUresult cuDeviceGet(CUdevice* device, int ordinal);
CUresult cuDevicePrimaryCtxRetain(CUcontext* ctx, CUdevice device);
CUresult cuDevicePrimaryCtxRelease(CUdevice device);
CUresult cuCtxPushCurrent(CUcontext ctx);
CUresult cuCtxPopCurrent(CUcontext* ctx);
CUresult cuMemAlloc(CUdeviceptr* ptr, size_t bytes);
CUresult cuMemFree(CUdeviceptr ptr);
CUresult cuMemGetInfo(size_t* free_bytes, size_t* total_bytes);
CUresult cuMemcpyHtoDAsync(CUdeviceptr dst, const void* src, size_t bytes, CUstream stream);
CUresult cuMemcpyDtoHAsync(void* dst, CUdeviceptr src, size_t bytes, CUstream stream);
CUresult cuStreamCreate(CUstream* stream, unsigned flags);
CUresult cuStreamDestroy(CUstream stream);
CUresult cuStreamSynchronize(CUstream stream);
CUresult cuGetErrorName(CUresult error, const char** name);
CUresult cuGetErrorString(CUresult error, const char** text);
}
