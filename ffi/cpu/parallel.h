// Parallel loops for the CPU kernels, independent of who owns the threads: the FFI
// handlers run them on XLA's intra-op pool (ffi::ThreadPool), a caller without a pool
// runs them inline. The calling thread always takes part, so a loop finishes even if
// the pool never runs the tasks it was given (no deadlock when called from a pool thread).
// Helpers start further helpers (a tree, see parallel.cc); the loop returns only once no
// helper can call `schedule` any more.
#pragma once

#include <cstdint>
#include <functional>

namespace oxijax::cpu {

class Parallel {
 public:
  using Task = std::function<void()>;
  using Scheduler = std::function<void(Task)>;

  // Runs everything on the calling thread.
  Parallel() = default;
  // `workers` extra threads are reachable through `schedule`.
  Parallel(int64_t workers, Scheduler schedule)
      : workers_(workers), schedule_(std::move(schedule)) {}

  int64_t threads() const { return workers_ + 1; }

  // Calls body(begin, end) over [0, n) in chunks of at least `grain` items.
  void for_range(int64_t n, int64_t grain,
                 const std::function<void(int64_t, int64_t)>& body) const;

 private:
  int64_t workers_ = 0;
  Scheduler schedule_;
};

}  // namespace oxijax::cpu
