// The CUDA backend's device: the retained primary context of one GPU (shared with
// JAX's own CUDA client), one non-blocking stream, and the launchers of ffi/cuda (the
// same ones the FFI handlers call). Every entry point pushes the primary context on
// the calling thread and pops it on return, so any thread may call. Ops enqueue on the
// stream and return; copies, free and synchronize wait for the stream. Compiled only
// with OXIJAX_WITH_CUDA.
#pragma once

#include <cuda.h>

#include <cstddef>
#include <atomic>
#include <cstdint>
#include <mutex>
#include <shared_mutex>
#include <utility>

#include "cuda_driver.h"
#include "device_ops.h"

namespace oxijax::backend {

class CudaDevice {
 public:
  // Loads the driver, initialises it and retains the primary context of `ordinal`;
  // throws DriverFailure when any of that fails.
  explicit CudaDevice(int ordinal);
  ~CudaDevice();
  CudaDevice(const CudaDevice&) = delete;
  CudaDevice& operator=(const CudaDevice&) = delete;

  int ordinal() const { return ordinal_; }
  uintptr_t stream() const { return reinterpret_cast<uintptr_t>(stream_); }

  uintptr_t alloc(size_t bytes);
  // Allowed after close(): memory still held elsewhere (a JAX array) is freed later.
  void free(uintptr_t ptr);
  void htod(uintptr_t dst, uintptr_t src, size_t bytes);
  void dtoh(uintptr_t dst, uintptr_t src, size_t bytes);
  void synchronize();
  std::pair<size_t, size_t> mem_info();
  // No new work; the context is released (once) as soon as no allocation is live.
  void close();

  void unary(int dtype, int op, uintptr_t x, uintptr_t y, int64_t n);
  void binary(int dtype, int op, uintptr_t a, uintptr_t b, uintptr_t out, int64_t n);
  void reduce(int dtype, int op, uintptr_t x, uintptr_t out, const ReduceShape& shape);
  void gemm(int dtype, const GemmProblem& problem, uintptr_t a, uintptr_t b, uintptr_t c);
  void conv2d(int dtype, const ConvArgs& args);
  void attention(int dtype, const AttentionArgs& args);

 private:
  class Current;  // pushes ctx_ for a scope
  void require_open() const;
  // Holds use_mu_ shared for the caller's scope and checks, under it, that the device is
  // open: entry points that use the stream or the context outside mu_ start with it.
  std::shared_lock<std::shared_mutex> use();
  void release_if_done() noexcept;  // with mu_ held
  // Device scratch of at least `bytes` (reduce partials, attention's log-sum-exp),
  // grown on demand; call with workspace_mu_ held until the launch is enqueued.
  void* workspace(size_t bytes);

  const CudaDriver& driver_;
  int ordinal_;
  CUdevice device_ = 0;
  CUcontext ctx_ = nullptr;
  CUstream stream_ = nullptr;
  std::mutex mu_;  // live_, released_ and closing
  int64_t live_ = 0;
  std::atomic<bool> closed_{false};
  bool released_ = false;
  // Shared by every entry point between its open check and its return, exclusive for
  // the release: the stream, the workspace and the context are never torn down under an
  // op that passed its check. Taken after mu_ where both are held.
  std::shared_mutex use_mu_;
  std::mutex workspace_mu_;  // taken after use_mu_
  CUdeviceptr workspace_ = 0;
  size_t workspace_bytes_ = 0;
};

}  // namespace oxijax::backend
