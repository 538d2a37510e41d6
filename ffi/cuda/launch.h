// Launch geometry shared by the CUDA kernels: grid sizes follow the GPU actually in use.
#pragma once

#include <cuda_runtime.h>

#include <atomic>

namespace oxijax::cuda {

// Streaming multiprocessors of the current device, asked once per device (a fallback
// of 132, an H100/H200, if the runtime cannot say).
inline int sm_count() {
  constexpr int kFallback = 132, kMaxDevices = 64;
  static std::atomic<int> cache[kMaxDevices];
  int device = 0;
  if (cudaGetDevice(&device) != cudaSuccess) {
    (void)cudaGetLastError();  // clear it: the caller's launch status must not see it
    return kFallback;
  }
  const bool cached = device >= 0 && device < kMaxDevices;
  if (cached) {
    if (const int count = cache[device].load(std::memory_order_relaxed)) return count;
  }
  int count = 0;
  if (cudaDeviceGetAttribute(&count, cudaDevAttrMultiProcessorCount, device) != cudaSuccess ||
      count <= 0) {
    (void)cudaGetLastError();
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
    int b = 0;
    if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&b, Kernel, Threads, 0) != cudaSuccess ||
        b < 1) {
      (void)cudaGetLastError();
      b = 2048 / Threads;
    }
    return b;
  }();
  return blocks;
}

}  // namespace oxijax::cuda
