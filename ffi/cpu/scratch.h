// Scratch memory of the CPU kernels, 64-byte aligned and never zeroed:
//  - AlignedBuffer: a task's own few tiles, allocated and freed with it;
//  - Scratch: larger buffers (packed gemm and conv2d operands, partial sums, attention's
//    layouts of Q, K and V) borrowed from a process-wide cache, so that repeated calls
//    reuse pages already mapped: a fresh page costs a fault and a zeroing, which also
//    evicts the operands from cache, and can cost more than the kernel's work on it.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <new>
#include <vector>

namespace oxijax::cpu {

// 64-byte aligned memory, or std::bad_alloc. Through the nothrow operator new and a
// throw of our own, so that under AddressSanitizer (allocator_may_return_null=1) running
// out of memory takes the same path as in a plain build: ASan's throwing operator new
// reports and aborts instead of throwing.
inline void* allocate_aligned(size_t bytes) {
  void* p = ::operator new(bytes, std::align_val_t(64), std::nothrow);
  if (p == nullptr) throw std::bad_alloc();
  return p;
}

template <typename A>
struct AlignedBuffer {
  A* p = nullptr;
  explicit AlignedBuffer(int64_t n)
      : p(static_cast<A*>(allocate_aligned(std::max<int64_t>(n, 1) * sizeof(A)))) {}
  ~AlignedBuffer() { ::operator delete(p, std::align_val_t(64)); }
  AlignedBuffer(const AlignedBuffer&) = delete;
  AlignedBuffer& operator=(const AlignedBuffer&) = delete;
};

// Blocks given back are kept for later calls, up to kCachedBytes in all; each is used
// by one holder at a time.
class ScratchCache {
 public:
  static constexpr size_t kCachedBytes = size_t(256) << 20;

  static ScratchCache& instance() {
    static ScratchCache* cache = new ScratchCache;  // never destroyed: calls may run at exit
    return *cache;
  }
  // A block of at least `bytes` (updated to its size): the smallest cached one that
  // fits, else a new one.
  void* take(size_t& bytes) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      auto best = blocks_.end();
      for (auto it = blocks_.begin(); it != blocks_.end(); ++it)
        if (it->bytes >= bytes && (best == blocks_.end() || it->bytes < best->bytes)) best = it;
      if (best != blocks_.end()) {
        void* p = best->p;
        bytes = best->bytes;
        blocks_.erase(best);
        cached_ -= bytes;
        return p;
      }
    }
    return allocate_aligned(bytes);
  }
  // Keeps the block for reuse (unless it alone is over kCachedBytes), dropping the
  // smallest ones beyond kCachedBytes.
  void give(void* p, size_t bytes) {
    if (bytes > kCachedBytes) {
      ::operator delete(p, std::align_val_t(64));
      return;
    }
    std::vector<Block> dropped;
    {
      std::lock_guard<std::mutex> lock(mu_);
      blocks_.push_back({p, bytes});
      cached_ += bytes;
      while (cached_ > kCachedBytes) {
        const auto smallest = std::min_element(
            blocks_.begin(), blocks_.end(),
            [](const Block& x, const Block& y) { return x.bytes < y.bytes; });
        cached_ -= smallest->bytes;
        dropped.push_back(*smallest);
        blocks_.erase(smallest);
      }
    }
    for (const Block& b : dropped) ::operator delete(b.p, std::align_val_t(64));
  }

 private:
  struct Block {
    void* p;
    size_t bytes;
  };
  std::mutex mu_;
  std::vector<Block> blocks_;
  size_t cached_ = 0;
};

// n values of A from the ScratchCache, given back on destruction (or reset); none
// (a null data()) for n <= 0 and until reset.
template <typename A>
class Scratch {
 public:
  Scratch() = default;
  explicit Scratch(int64_t n) { reset(n); }
  ~Scratch() { release(); }
  Scratch(const Scratch&) = delete;
  Scratch& operator=(const Scratch&) = delete;
  A* reset(int64_t n) {
    release();
    if (n > 0) {
      bytes_ = size_t(n) * sizeof(A);
      p_ = static_cast<A*>(ScratchCache::instance().take(bytes_));
    }
    return p_;
  }
  A* data() const { return p_; }

 private:
  void release() {
    if (p_) ScratchCache::instance().give(p_, bytes_);
    p_ = nullptr;
  }
  A* p_ = nullptr;
  size_t bytes_ = 0;
};

}  // namespace oxijax::cpu
