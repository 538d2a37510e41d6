// Stress test of cpu::Parallel::for_range (ffi/cpu/parallel.cc) with threads of its own,
// built by tests/test_parallel.py with ThreadSanitizer or AddressSanitizer. Every loop
// checks that each index ran exactly once and that no helper called the loop's
// scheduler after for_range had returned (the handle to XLA's pool dies with the FFI
// call). Modes: `threads` runs each task on a thread of its own, joined after the loop;
// `late` runs them only after their loop has returned, as a pool busy elsewhere would;
// `throw` makes one index of every loop throw, which for_range must hand back.
// Usage: parallel_stress <threads|late|throw> <workers> <loops>; prints "ok" and exits 0.
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <deque>
#include <memory>
#include <mutex>
#include <random>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "parallel.h"

namespace {

using oxijax::cpu::Parallel;

[[noreturn]] void fail(const char* what) {
  std::fprintf(stderr, "parallel_stress: %s\n", what);
  std::abort();
}

// Open while its loop runs: a call to the scheduler after that is the bug looked for.
struct Token {
  std::atomic<bool> open{true};
};

}  // namespace

int main(int argc, char** argv) {
  if (argc != 4) fail("usage: parallel_stress <threads|late|throw> <workers> <loops>");
  const std::string mode = argv[1];
  const int workers = std::atoi(argv[2]);
  const int loops = std::atoi(argv[3]);
  if (mode != "threads" && mode != "late" && mode != "throw") fail("unknown mode");

  std::mutex threads_mu;
  std::vector<std::thread> threads;  // the tasks started during a loop
  std::deque<Parallel::Task> late;   // the `late` mode's tasks, run after their loop
  std::mt19937 rng(12345);
  for (int loop = 0; loop < loops; ++loop) {
    const int64_t n = std::uniform_int_distribution<int64_t>(1, 3000)(rng);
    const int64_t grain = std::uniform_int_distribution<int64_t>(1, 64)(rng);
    const int64_t bad = mode == "throw" ? std::uniform_int_distribution<int64_t>(0, n - 1)(rng) : -1;
    auto token = std::make_shared<Token>();
    auto par = std::make_unique<Parallel>(workers, [&, token](Parallel::Task task) {
      if (!token->open.load()) fail("a helper scheduled a task after its loop had returned");
      if (mode == "late") {
        late.push_back(std::move(task));  // only the loop's caller reaches here in this mode
      } else {
        std::lock_guard<std::mutex> lock(threads_mu);
        threads.emplace_back(std::move(task));
      }
    });
    std::vector<std::atomic<int>> visits(n);
    bool threw = false;
    try {
      par->for_range(n, grain, [&](int64_t begin, int64_t end) {
        if (begin < 0 || end > n || begin >= end) fail("a chunk outside [0, n)");
        for (int64_t i = begin; i < end; ++i) {
          if (i == bad) throw std::runtime_error("chunk failed");
          visits[i].fetch_add(1);
        }
      });
    } catch (const std::runtime_error&) {
      threw = true;
    }
    token->open.store(false);
    par.reset();  // the scheduler is gone too: AddressSanitizer reports any later call
    if (threw != (bad >= 0)) fail(bad >= 0 ? "a chunk's exception was lost" : "unexpected exception");
    for (int64_t i = 0; i < n; ++i) {
      const int v = visits[i].load();
      if (v > 1 || (v == 0 && bad < 0)) fail("an index ran twice or never");
    }
    for (auto& t : threads) t.join();
    threads.clear();
    for (; !late.empty(); late.pop_front()) late.front()();  // they find nothing to do
  }
  std::puts("ok");
  return 0;
}
