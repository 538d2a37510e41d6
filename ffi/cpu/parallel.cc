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
  std::atomic<int64_t> next{0};
  std::atomic<int64_t> done{0};
  std::atomic<bool> failed{false};
  std::exception_ptr error;  // the first failure; written under mu
  std::mutex mu;
  std::condition_variable cv;

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
  const int64_t helpers = std::min(workers_, state->num_chunks - 1);
  try {
    for (int64_t i = 0; i < helpers; ++i) schedule_([state] { state->work(); });
  } catch (...) {
    // Could not hand out more tasks (out of memory): the caller does the rest itself.
  }
  state->work();
  // The helpers are finishing their last chunks: wait for them awake for a while (a
  // thread put to sleep takes tens of microseconds to wake on a busy or virtual
  // machine, which shows on sub-millisecond ops), then asleep.
  const auto finished = [&] { return state->done.load() == state->num_chunks; };
  const auto give_up = std::chrono::steady_clock::now() + kAwakeWait;
  while (!finished() && std::chrono::steady_clock::now() < give_up) std::this_thread::yield();
  std::unique_lock<std::mutex> lock(state->mu);
  state->cv.wait(lock, finished);
  if (state->error) std::rethrow_exception(state->error);
}

}  // namespace oxijax::cpu
