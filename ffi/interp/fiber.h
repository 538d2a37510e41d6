// Fibers: one per CUDA thread, so that the threads of a warp and of a block can meet at
// warp-synchronous instructions and barriers in any order the schedule picks. A fiber
// runs on its own stack (guard page below it) until it yields back to the host thread's
// scheduler; switching saves only the callee-saved registers (a few nanoseconds on
// x86-64; elsewhere ucontext, slower but portable).
#pragma once

#include <cstddef>
#include <cstdint>

#if !defined(__x86_64__)
#include <ucontext.h>
#endif

namespace oxijax::interp {

class Fiber {
 public:
  static constexpr size_t kStackBytes = 256 << 10;  // kernels keep register tiles on it

  Fiber();
  ~Fiber();
  Fiber(const Fiber&) = delete;
  Fiber& operator=(const Fiber&) = delete;

  // Makes the next resume() start entry(arg) from the top of the stack; entry must end
  // by yield_to_scheduler(), never by returning.
  void reset(void (*entry)(void*), void* arg);
  // Runs the fiber until it yields (call from the scheduler).
  void resume();
  // Back to the scheduler that resumed the current fiber (call from the fiber).
  void yield();

  uintptr_t stack_low() const { return reinterpret_cast<uintptr_t>(stack_); }
  static constexpr size_t stack_bytes() { return kStackBytes; }

 private:
  unsigned char* mapping_ = nullptr;  // guard page + stack
  unsigned char* stack_ = nullptr;
#if defined(__x86_64__)
  void* sp_ = nullptr;
  void* scheduler_sp_ = nullptr;
#else
  ucontext_t context_{};
  ucontext_t scheduler_{};
#endif
};

}  // namespace oxijax::interp
