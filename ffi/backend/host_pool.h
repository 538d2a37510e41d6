// Worker threads for cpu::Parallel outside XLA: the pointer backend's CPU device, and
// scripts/parallel_probe.cc. The caller of a loop always works too, so a queue shared by
// concurrent callers never deadlocks, it only shares the workers. Destroy it never (its
// threads die with the process) or only when idle.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <mutex>
#include <thread>
#include <vector>

#include "cpu/parallel.h"

namespace oxijax::backend {

class HostPool {
 public:
  explicit HostPool(int64_t workers) {
    for (int64_t i = 0; i < workers; ++i) threads_.emplace_back([this] { run(); });
  }
  HostPool(const HostPool&) = delete;
  HostPool& operator=(const HostPool&) = delete;
  ~HostPool() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stopping_ = true;
    }
    cv_.notify_all();
    for (auto& t : threads_) t.join();
  }

  int64_t workers() const { return static_cast<int64_t>(threads_.size()); }
  void schedule(cpu::Parallel::Task task) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      tasks_.push_back(std::move(task));
    }
    cv_.notify_one();
  }
  // A Parallel whose helpers are this pool's threads.
  cpu::Parallel parallel() {
    if (workers() == 0) return cpu::Parallel();
    return cpu::Parallel(workers(), [this](cpu::Parallel::Task t) { schedule(std::move(t)); });
  }

 private:
  void run() {
    for (;;) {
      cpu::Parallel::Task task;
      {
        std::unique_lock<std::mutex> lock(mu_);
        cv_.wait(lock, [this] { return stopping_ || !tasks_.empty(); });
        if (tasks_.empty()) return;
        task = std::move(tasks_.front());
        tasks_.pop_front();
      }
      task();
    }
  }
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<cpu::Parallel::Task> tasks_;
  bool stopping_ = false;
  std::vector<std::thread> threads_;
};

}  // namespace oxijax::backend
