#include "parallel.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <exception>
#include <memory>
#include <mutex>
#include <thread>

namespace oxijax::cpu {
namespace {

// How long the calling thread waits for the helpers' last chunks before it sleeps.
constexpr auto kAwakeWait = std::chrono::microseconds(200);

// Shared by the caller and the helper tasks; a task that starts after the loop has
// finished sees no chunk left and touches nothing but this object, which it co-owns.
// A chunk that throws (a kernel's scratch allocation failing) counts as done: the
// first exception is kept for the caller, the chunks after it are skipped, and no
// exception ever leaves a pool thread.
struct LoopState {
  int64_t n, chunk, num_chunks;
  const std::function<void(int64_t, int64_t)>* body;
  // The caller's scheduler. It, and the pool handle in it (XLA's ffi::ThreadPool is
  // valid only while the handler runs), may be gone once the loop has returned, so it
  // is called only through the gate below, which the caller closes before it returns.
  const Parallel::Scheduler* schedule;
  std::atomic<int64_t> next{0};
  std::atomic<int64_t> done{0};
  std::atomic<bool> failed{false};
  std::exception_ptr error;  // the first failure; written under mu
  std::mutex mu;
  std::condition_variable cv;
  // The helpers inside `schedule` right now, plus kClosed once the caller is done: the
  // caller returns only after closing, and no one enters once it is closed.
  static constexpr int64_t kClosed = int64_t(1) << 62;
  std::atomic<int64_t> scheduling{0};

  bool enter_gate() {
    int64_t s = scheduling.load();
    do {
      if (s & kClosed) return false;
    } while (!scheduling.compare_exchange_weak(s, s + 1));
    return true;
  }
  void close_gate() {
    for (int64_t s = 0; !scheduling.compare_exchange_weak(s, kClosed); s = 0)
      std::this_thread::yield();
  }

  // Participant `first` (the caller is 0) starts participants first + 1 ... last - 1,
  // then runs chunks. It hands the upper half, [mid, last), to one new task, which
  // starts them the same way, keeps the lower half and halves again: the last of T
  // participants starts after about log2(T) wake-ups in a row, not after T - 1 calls
  // to `schedule` in a row from the caller (each a system call and, for a sleeping
  // thread, an inter-processor interrupt: tens of microseconds on a virtual machine).
  // XLA:CPU starts its own parallel loops' workers this way.
  static void participate(const std::shared_ptr<LoopState>& self, int64_t first, int64_t last) {
    while (last - first > 1 && self->next.load() < self->num_chunks) {
      const int64_t mid = first + (last - first) / 2;
      if (!self->enter_gate()) break;
      bool scheduled = true;
      try {
        (*self->schedule)([self, mid, last] { participate(self, mid, last); });
      } catch (...) {
        scheduled = false;  // out of memory: the participants running do the rest
      }
      self->scheduling.fetch_sub(1);
      if (!scheduled) break;
      last = mid;
    }
    self->work();
  }

  // Claims and runs chunks until none is left.
  void work() {
    int64_t ran = 0;
    for (int64_t c; (c = next.fetch_add(1)) < num_chunks; ++ran) {
      if (failed.load()) continue;
      const int64_t begin = c * chunk;
      try {
        (*body)(begin, std::min(n, begin + chunk));
      } catch (...) {
        std::lock_guard<std::mutex> lock(mu);
        if (!error) error = std::current_exception();
        failed.store(true);
      }
    }
    if (ran > 0 && done.fetch_add(ran) + ran == num_chunks) {
      std::lock_guard<std::mutex> lock(mu);
      cv.notify_all();
    }
  }
};

}  // namespace

void Parallel::for_range(int64_t n, int64_t grain,
                         const std::function<void(int64_t, int64_t)>& body) const {
  if (n <= 0) return;
  grain = std::max<int64_t>(grain, 1);
  // A few chunks per thread balance uneven chunks without much scheduling overhead.
  const int64_t max_chunks = std::max<int64_t>(1, (n + grain - 1) / grain);
  const int64_t num_chunks = std::min(max_chunks, threads() * 4);
  if (num_chunks == 1 || workers_ == 0) {
    body(0, n);
    return;
  }
  auto state = std::make_shared<LoopState>();
  state->n = n;
  state->chunk = (n + num_chunks - 1) / num_chunks;
  state->num_chunks = (n + state->chunk - 1) / state->chunk;
  state->body = &body;
  state->schedule = &schedule_;
  const int64_t helpers = std::min(workers_, state->num_chunks - 1);
  LoopState::participate(state, 0, helpers + 1);
  // The helpers are finishing their last chunks: wait for them awake for a while (a
  // thread put to sleep takes tens of microseconds to wake on a busy or virtual
  // machine, which shows on sub-millisecond ops), then asleep.
  const auto finished = [&] { return state->done.load() == state->num_chunks; };
  const auto give_up = std::chrono::steady_clock::now() + kAwakeWait;
  while (!finished() && std::chrono::steady_clock::now() < give_up) std::this_thread::yield();
  {
    std::unique_lock<std::mutex> lock(state->mu);
    state->cv.wait(lock, finished);
  }
  state->close_gate();
  if (state->error) std::rethrow_exception(state->error);
}

}  // namespace oxijax::cpu
