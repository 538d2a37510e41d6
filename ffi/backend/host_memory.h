// CpuBackend's host memory: one aligned allocation per object, freed by its destructor,
// with process-wide counts of what is live, so that tests can prove nothing leaks
// (allocate/free cycles, close(), interpreter exit).
#pragma once

#include <cstddef>
#include <cstdint>

namespace oxijax::backend {

class HostAllocation {
 public:
  static constexpr size_t kAlignment = 64;  // a cache line

  // Throws std::bad_alloc when the host cannot provide nbytes.
  explicit HostAllocation(size_t nbytes);
  ~HostAllocation();
  HostAllocation(const HostAllocation&) = delete;
  HostAllocation& operator=(const HostAllocation&) = delete;

  uintptr_t address() const { return reinterpret_cast<uintptr_t>(data_); }
  size_t size() const { return size_; }

  // Allocations (and their requested bytes) not yet destroyed, in this process.
  static int64_t live_count();
  static int64_t live_bytes();

 private:
  void* data_;
  size_t size_;
};

}  // namespace oxijax::backend
