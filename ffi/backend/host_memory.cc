#include "host_memory.h"

#include <atomic>
#include <new>

namespace oxijax::backend {
namespace {

std::atomic<int64_t> live_count_{0};
std::atomic<int64_t> live_bytes_{0};

// The nothrow form, checked here: a failure is then a plain null under every allocator
// (AddressSanitizer's throwing new aborts instead of throwing).
void* allocate(size_t nbytes) {
  void* data = ::operator new(nbytes, std::align_val_t{HostAllocation::kAlignment}, std::nothrow);
  if (data == nullptr) throw std::bad_alloc();
  return data;
}

}  // namespace

HostAllocation::HostAllocation(size_t nbytes)
    // Throws std::bad_alloc (MemoryError in Python) for sizes the host cannot back.
    : data_(allocate(nbytes)), size_(nbytes) {
  live_count_.fetch_add(1);
  live_bytes_.fetch_add(static_cast<int64_t>(nbytes));
}

HostAllocation::~HostAllocation() {
  ::operator delete(data_, std::align_val_t{kAlignment});
  live_count_.fetch_sub(1);
  live_bytes_.fetch_sub(static_cast<int64_t>(size_));
}

int64_t HostAllocation::live_count() { return live_count_.load(); }
int64_t HostAllocation::live_bytes() { return live_bytes_.load(); }

}  // namespace oxijax::backend
