// What the CUDA kernels' launchers share with the CUDA interpreter (ffi/interp): the one
// way to launch a kernel, the declarations of shared memory, and the launch geometry
// (grid sizes follow the GPU actually in use). Under OXIJAX_CUDA_INTERPRET (the .cu
// files compiled by the host compiler) launches and shared memory are the interpreter's.
#pragma once

#ifdef OXIJAX_CUDA_INTERPRET
#include "oxijax_interp.h"
#else
#include <cuda_runtime.h>
#endif

#include <atomic>
#include <cstddef>
#include <utility>

// Static shared memory: OXIJAX_SHARED(float, tile, [32][33], 16) declares
// `__shared__ __align__(16) float tile[32][33]` (dims may be empty for a scalar or struct).
// Dynamic shared memory: OXIJAX_DYNAMIC_SHARED(smem, 16) declares the block's dynamic
// shared memory (the launch's shared_bytes) as `unsigned char smem[]`, 16-byte aligned.
#ifdef OXIJAX_CUDA_INTERPRET
#define OXIJAX_SHARED(type, name, dims, align)                     \
  static char oxijax_shared_site_##name;                          \
  type(&name) dims = ::oxijax::interp::shared_variable<type dims, align>( \
      &oxijax_shared_site_##name, #name)
#define OXIJAX_DYNAMIC_SHARED(name, align) \
  unsigned char* const name = ::oxijax::interp::dynamic_shared(align)
#else
#define OXIJAX_SHARED(type, name, dims, align) __shared__ __align__(align) type name dims
#define OXIJAX_DYNAMIC_SHARED(name, align) extern __shared__ __align__(align) unsigned char name[]
#endif

namespace oxijax::cuda {

// Launches kernel<<<grid, block, shared_bytes, stream>>>(args...) and returns the launch
// status (cudaGetLastError: an invalid configuration, a missing attribute for more than
// 48 KiB of dynamic shared memory, ...). Every launcher launches through here, so that
// the interpreter runs the same launchers.
template <typename... Params, typename... Args>
cudaError_t launch(void (*kernel)(Params...), dim3 grid, dim3 block, size_t shared_bytes,
                   cudaStream_t stream, Args&&... args) {
#ifdef OXIJAX_CUDA_INTERPRET
  return interp::launch(kernel, grid, block, shared_bytes, stream, std::forward<Args>(args)...);
#else
  kernel<<<grid, block, shared_bytes, stream>>>(std::forward<Args>(args)...);
  return cudaGetLastError();
#endif
}

// The status of a failed runtime call other than a launch (a device attribute,
// cudaFuncSetAttribute, ...), taken off the thread's last error, so that the next
// launch's status (cudaGetLastError) reports that launch and not this stale error.
// Launchers return it right away: no earlier error of theirs is pending then, as they
// check every launch right after it.
inline cudaError_t runtime_error(cudaError_t status) {
  if (status != cudaSuccess) (void)cudaGetLastError();
  return status;
}

// The geometry queries below fall back to a default when the runtime cannot answer and
// take their own error off the thread's last error, unless an error was pending before
// them: that one belongs to the caller (its next status check must still fail), so the
// last error is then left as it is.
namespace detail {
inline bool error_pending() { return cudaPeekAtLastError() != cudaSuccess; }
inline void clear_own_error(bool was_pending) {
  if (!was_pending) (void)cudaGetLastError();
}
}  // namespace detail

// Streaming multiprocessors of the current device, asked once per device (a fallback
// of 132, an H100/H200, if the runtime cannot say).
inline int sm_count() {
  constexpr int kFallback = 132, kMaxDevices = 64;
  static std::atomic<int> cache[kMaxDevices];
  const bool pending = detail::error_pending();
  int device = 0;
  if (cudaGetDevice(&device) != cudaSuccess) {
    detail::clear_own_error(pending);
    return kFallback;
  }
  const bool cached = device >= 0 && device < kMaxDevices;
  if (cached) {
    if (const int count = cache[device].load(std::memory_order_relaxed)) return count;
  }
  int count = 0;
  if (cudaDeviceGetAttribute(&count, cudaDevAttrMultiProcessorCount, device) != cudaSuccess ||
      count <= 0) {
    detail::clear_own_error(pending);
    count = kFallback;
  }
  if (cached) cache[device].store(count, std::memory_order_relaxed);
  return count;
}

// Blocks of `Threads` threads of `Kernel` resident per SM (the occupancy calculator,
// asked once per kernel).
template <auto Kernel, int Threads>
int resident_blocks() {
  static const int blocks = [] {
    const bool pending = detail::error_pending();
    int b = 0;
    if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&b, Kernel, Threads, 0) != cudaSuccess ||
        b < 1) {
      detail::clear_own_error(pending);
      b = 2048 / Threads;
    }
    return b;
  }();
  return blocks;
}

}  // namespace oxijax::cuda
