#include "fiber.h"

#include <sys/mman.h>
#include <unistd.h>

#include <cstring>
#include <new>

#if defined(__x86_64__)
// oxijax_interp_switch(&save_sp, load_sp): pushes the System V callee-saved registers
// and the SSE/x87 control words on the current stack, stores the stack pointer, loads
// the other one and pops the same from it.
asm(R"(
  .text
  .p2align 4
  .type oxijax_interp_switch,@function
oxijax_interp_switch:
  pushq %rbp
  pushq %rbx
  pushq %r12
  pushq %r13
  pushq %r14
  pushq %r15
  subq $8, %rsp
  stmxcsr (%rsp)
  fnstcw 4(%rsp)
  movq %rsp, (%rdi)
  movq %rsi, %rsp
  ldmxcsr (%rsp)
  fldcw 4(%rsp)
  addq $8, %rsp
  popq %r15
  popq %r14
  popq %r13
  popq %r12
  popq %rbx
  popq %rbp
  ret
  .size oxijax_interp_switch, .-oxijax_interp_switch

  .p2align 4
  .type oxijax_interp_fiber_start,@function
oxijax_interp_fiber_start:
  movq %rbx, %rdi
  callq *%r12
  ud2
  .size oxijax_interp_fiber_start, .-oxijax_interp_fiber_start
)");
extern "C" void oxijax_interp_switch(void** save_sp, void* load_sp);
extern "C" void oxijax_interp_fiber_start();
#endif

namespace oxijax::interp {

Fiber::Fiber() {
  const size_t page = size_t(sysconf(_SC_PAGESIZE));
  void* m = mmap(nullptr, kStackBytes + page, PROT_READ | PROT_WRITE,
                 MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (m == MAP_FAILED) throw std::bad_alloc();
  mapping_ = static_cast<unsigned char*>(m);
  mprotect(mapping_, page, PROT_NONE);  // a stack overflow faults instead of corrupting
  stack_ = mapping_ + page;
}

Fiber::~Fiber() { munmap(mapping_, kStackBytes + size_t(sysconf(_SC_PAGESIZE))); }

#if defined(__x86_64__)
void Fiber::reset(void (*entry)(void*), void* arg) {
  // The frame oxijax_interp_switch pops: control words, r15..r12, rbx, rbp, then the
  // return address. After `ret` the stack is 16-byte aligned, as before a call.
  auto* top = reinterpret_cast<uint64_t*>(stack_ + kStackBytes);
  uint64_t* sp = top - 8;
  const uint32_t mxcsr = 0x1f80, fpu_control = 0x037f;  // the ABI's initial values
  sp[0] = uint64_t(mxcsr) | (uint64_t(fpu_control) << 32);
  sp[1] = 0;                                  // r15
  sp[2] = 0;                                  // r14
  sp[3] = 0;                                  // r13
  sp[4] = reinterpret_cast<uint64_t>(entry);  // r12
  sp[5] = reinterpret_cast<uint64_t>(arg);    // rbx
  sp[6] = 0;                                  // rbp
  sp[7] = reinterpret_cast<uint64_t>(&oxijax_interp_fiber_start);
  sp_ = sp;
}

void Fiber::resume() { oxijax_interp_switch(&scheduler_sp_, sp_); }
void Fiber::yield() { oxijax_interp_switch(&sp_, scheduler_sp_); }
#else
void Fiber::reset(void (*entry)(void*), void* arg) {
  getcontext(&context_);
  context_.uc_stack.ss_sp = stack_;
  context_.uc_stack.ss_size = kStackBytes;
  context_.uc_link = nullptr;
  // makecontext passes int arguments: split the pointer in two halves.
  const uint64_t bits = reinterpret_cast<uint64_t>(arg);
  const uint64_t fn = reinterpret_cast<uint64_t>(entry);
  makecontext(&context_, reinterpret_cast<void (*)()>(+[](unsigned f_hi, unsigned f_lo,
                                                          unsigned a_hi, unsigned a_lo) {
                reinterpret_cast<void (*)(void*)>((uint64_t(f_hi) << 32) | f_lo)(
                    reinterpret_cast<void*>((uint64_t(a_hi) << 32) | a_lo));
              }),
              4, unsigned(fn >> 32), unsigned(fn), unsigned(bits >> 32), unsigned(bits));
}

void Fiber::resume() { swapcontext(&scheduler_, &context_); }
void Fiber::yield() { swapcontext(&context_, &scheduler_); }
#endif

}  // namespace oxijax::interp
