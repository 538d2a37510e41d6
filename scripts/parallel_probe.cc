// What starting a parallel loop's helpers costs on this machine, outside XLA: a probe for
// the CPU rows that fall behind XLA only with many threads (docs/performance.md). Built
// and run by scripts/gpu_check.sh on the GPU machine's 16-core CPU; by hand, from the
// repository's root:
//   g++ -std=c++17 -O3 -march=native -pthread -Iffi scripts/parallel_probe.cc
//       ffi/cpu/parallel.cc -o parallel_probe
//   ./parallel_probe [threads]
// 1. Waking a thread asleep on another CPU: how long the caller's notify takes, and when
//    the thread runs, from the notify's start (medians of 200).
// 2. A memory-bound loop, the sum of 16 Mi floats in 64 chunks as the reduction kernels
//    cut it, on `threads` threads (default: all the process may use), its helpers
//    started (a) one after another by the caller, as cpu::Parallel did before
//    2026-12-05, and (b) as a tree, as cpu::Parallel does now; the two taken in turns,
//    the helpers asleep before each loop, as between the back-to-back calls of the
//    benchmark. Medians of the loop's time, of when the caller starts its first chunk,
//    and of when the last helper starts its first.

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "backend/host_pool.h"
#include "probe_cpus.h"

namespace {

using oxijax::backend::HostPool;
using oxijax::cpu::Parallel;
using Clock = std::chrono::steady_clock;

double micros(Clock::time_point since) {
  return std::chrono::duration<double, std::micro>(Clock::now() - since).count();
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

void let_threads_sleep() { std::this_thread::sleep_for(std::chrono::milliseconds(2)); }

// When each participant of one loop started its first chunk.
class Starts {
 public:
  explicit Starts(Clock::time_point t0) : t0_(t0), caller_(std::this_thread::get_id()) {}
  void chunk_begins() {
    const double t = micros(t0_);
    std::lock_guard<std::mutex> lock(mu_);
    const auto me = std::this_thread::get_id();
    if (std::find(seen_.begin(), seen_.end(), me) != seen_.end()) return;
    seen_.push_back(me);
    if (me == caller_) caller_first_ = t;
    last_first_ = std::max(last_first_, t);
  }
  double caller_first() const { return caller_first_; }  // -1: the caller ran no chunk
  double last_first() const { return last_first_; }
  size_t participants() const { return seen_.size(); }

 private:
  Clock::time_point t0_;
  std::thread::id caller_;
  std::mutex mu_;
  std::vector<std::thread::id> seen_;
  double caller_first_ = -1, last_first_ = 0;
};

float sum_chunk(const float* x, int64_t begin, int64_t end) {
  float s[16] = {};
  int64_t i = begin;
  for (; i + 16 <= end; i += 16)
    for (int l = 0; l < 16; ++l) s[l] += x[i + l];
  for (; i < end; ++i) s[0] += x[i];
  float total = 0;
  for (float v : s) total += v;
  return total;
}

// The loop as cpu::Parallel ran it before: the caller schedules every helper, then works.
void flat_for_range(HostPool& pool, int64_t helpers, int64_t chunks,
                    const std::function<void(int64_t)>& chunk) {
  struct State {
    std::atomic<int64_t> next{0}, done{0};
    int64_t chunks;
    const std::function<void(int64_t)>* chunk;
    void work() {
      int64_t ran = 0;
      for (int64_t c; (c = next.fetch_add(1)) < chunks; ++ran) (*chunk)(c);
      done.fetch_add(ran);
    }
  };
  auto state = std::make_shared<State>();
  state->chunks = chunks;
  state->chunk = &chunk;
  for (int64_t i = 0; i < helpers; ++i) pool.schedule([state] { state->work(); });
  state->work();
  while (state->done.load() < chunks) std::this_thread::yield();
}

// The sleeper on another CPU than the caller's: a wake-up across CPUs, as a helper's.
void wake_up_costs(const probe::Cpus& cpus) {
  if (cpus.count < 2) return;
  cpus.pin_to(0);
  std::mutex mu;
  std::condition_variable cv;
  bool go = false, quit = false;
  Clock::time_point t0;
  std::atomic<double> woke{0};
  std::thread sleeper([&] {
    cpus.pin_to(1);
    for (;;) {
      std::unique_lock<std::mutex> lock(mu);
      cv.wait(lock, [&] { return go || quit; });
      if (quit) return;
      go = false;
      woke.store(micros(t0));
    }
  });
  std::vector<double> notify, run;
  for (int i = 0; i < 200; ++i) {
    let_threads_sleep();
    woke.store(-1);
    {
      std::lock_guard<std::mutex> lock(mu);
      go = true;
      t0 = Clock::now();
    }
    cv.notify_one();
    notify.push_back(micros(t0));
    while (woke.load() < 0) std::this_thread::yield();
    run.push_back(woke.load());
  }
  {
    std::lock_guard<std::mutex> lock(mu);
    quit = true;
  }
  cv.notify_one();
  sleeper.join();
  cpus.unpin();
  std::printf("waking a thread asleep on another CPU: notify %.1f us, the thread runs %.1f us after it began\n",
              median(notify), median(run));
}

}  // namespace

int main(int argc, char** argv) {
  const probe::Cpus cpus(argc, argv, "parallel_probe");
  const int threads = cpus.threads;
  std::printf("%d threads (%d CPUs allowed)\n", threads, cpus.count);
  wake_up_costs(cpus);

  const int64_t n = int64_t{1} << 24, chunks = std::min<int64_t>(64, 4 * threads);
  const int64_t per_chunk = (n + chunks - 1) / chunks;
  std::vector<float> x(n, 1.0f);
  HostPool pool(threads - 1);
  const Parallel par = pool.parallel();
  struct Series {
    const char* name;
    std::vector<double> total{}, caller{}, last{};
  } flat{"one after another"}, tree{"as a tree"};
  std::atomic<double> sink{0};
  for (int rep = 0; rep < 60; ++rep) {
    for (Series* s : {&flat, &tree}) {
      let_threads_sleep();
      const auto t0 = Clock::now();
      Starts starts(t0);
      const std::function<void(int64_t)> chunk = [&](int64_t c) {
        starts.chunk_begins();
        const float v = sum_chunk(x.data(), c * per_chunk, std::min(n, (c + 1) * per_chunk));
        sink.store(sink.load() + v);
      };
      if (s == &flat)
        flat_for_range(pool, threads - 1, chunks, chunk);
      else
        par.for_range(chunks, 1, [&](int64_t b, int64_t e) {
          for (int64_t c = b; c < e; ++c) chunk(c);
        });
      s->total.push_back(micros(t0));
      s->caller.push_back(starts.caller_first());
      s->last.push_back(starts.last_first());
    }
  }
  std::printf("sum of 16 Mi floats in %lld chunks, medians of 60 loops each:\n", (long long)chunks);
  for (const Series* s : {&flat, &tree})
    std::printf("  helpers started %-17s loop %7.1f us (%.0f GB/s); caller's first chunk at "
                "%6.1f us; last helper's first chunk at %6.1f us\n",
                s->name, median(s->total), 4.0 * n / median(s->total) / 1e3, median(s->caller),
                median(s->last));
  return 0;
}
