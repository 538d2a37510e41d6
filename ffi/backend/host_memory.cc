#include "host_memory.h"

#include <atomic>
#include <new>

namespace oxijax::backend {
namespace {

std::atomic<int64_t> live_count_{0};
std::atomic<int64_t> live_bytes_{0};

}  // namespace

HostAllocation::HostAllocation(size_t nbytes)
    // Throws std::bad_alloc (MemoryError in Python) for sizes the host cannot back.
    : data_(::operator new(nbytes, std::align_val_t{kAlignment})), size_(nbytes) {
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
