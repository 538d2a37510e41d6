// The CUDA interpreter's state, shared by its runtime files: a launch, the block that
// is running on this host thread and its CUDA threads (fibers), and the failure path.
#pragma once

#include <cstddef>
#include <cstdint>
#include <deque>
#include <memory>
#include <string>
#include <vector>

#include "fiber.h"
#include "oxijax_interp.h"

namespace oxijax::interp {

// The order in which runnable threads (and the blocks of a grid) run between two
// synchronisation points; a missing barrier shows under some order as a race or a wrong
// result. kShuffle draws a new permutation at every point (seeded, so reproducible).
enum class Order { kForward, kReverse, kShuffle };
struct Schedule {
  Order order = Order::kShuffle;
  uint64_t seed = 0;
};
Schedule current_schedule();
void set_schedule(Schedule s);

struct Launch {
  const void* kernel;
  dim3 grid, block;
  size_t shared_bytes;
  KernelBody body;
  const void* closure;
  uintptr_t params;  // the parameter block: read-only for the kernel
  size_t params_bytes;
  cudaError_t status = cudaSuccess;
  std::string report;  // the first failure
};

struct PendingCopy {
  uint32_t dst;
  const void* src;
  int bytes, src_bytes;
  const void* pc;  // the cp.async instruction
};

enum class Wait : uint8_t { kReady, kBarrier, kWarp, kDone };

struct Thread {
  int linear = 0, lane = 0, warp = 0;
  uint3 idx{};
  Wait wait = Wait::kReady;
  int in_runtime = 0;  // > 0 while the interpreter's own code runs on this thread
  std::unique_ptr<Fiber> fiber;
  const char* waiting_at = nullptr;  // the warp instruction it waits in
  std::vector<PendingCopy> open_group;               // cp.async since the last commit
  std::deque<std::vector<PendingCopy>> committed;    // oldest first
};

struct Warp {
  uint32_t arrived = 0, mask = 0;
  const char* op = nullptr;
  uint32_t epoch = 0;  // completed __syncwarp()s: orders the lanes' shared accesses
  void* records[32] = {};
};

// A static __shared__ variable's place in the block's shared window.
struct SharedVariable {
  const void* site;
  const char* name;
  size_t offset, bytes;
};

// Per byte of the shared window: who last wrote and read it, in which barrier interval
// (epoch) and warp interval, for the race, uninitialised-read and cp.async checks.
struct SharedCell {
  uint32_t gen;  // the block whose record this is (others' records are void)
  uint32_t w_epoch, r_epoch;
  uint16_t writer, reader;
  uint16_t w_warp_epoch, r_warp_epoch;
  uint32_t w_pc, r_pc;  // code offsets in the module, for reports
  uint8_t flags;
};
enum CellFlag : uint8_t { kInit = 1, kManyReaders = 2, kPending = 4 };

struct Block {
  Launch* launch = nullptr;
  uint3 idx{};
  int threads = 0, warps = 0;
  std::vector<Thread>* thread_pool = nullptr;
  std::vector<Warp> warp_state;
  uint32_t gen = 0;    // distinguishes this block's shadow records
  uint32_t epoch = 0;  // completed __syncthreads()
  int at_barrier = 0, done = 0;
  unsigned char* arena = nullptr;  // the shared window
  size_t arena_bytes = 0, dynamic_bytes = 0, static_top = 0;
  std::vector<SharedVariable> variables;
  SharedCell* cells = nullptr;
};

// The block running on this host thread and its running CUDA thread (null outside).
extern thread_local Block* tls_block;
extern thread_local Thread* tls_thread;

// Marks the interpreter's own code running on a CUDA thread: its memory accesses are
// not the kernel's (inline library code such as std::string's may be the instrumented
// copy that the kernels' translation units emitted).
struct InRuntime {
  Thread* t;
  InRuntime() : t(tls_thread) {
    if (t) ++t->in_runtime;
  }
  ~InRuntime() {
    if (t) --t->in_runtime;
  }
  InRuntime(const InRuntime&) = delete;
  InRuntime& operator=(const InRuntime&) = delete;
};

// Stops the running kernel with `status` and a report (which names the kernel, block and
// thread); called from a CUDA thread, never returns to it.
[[noreturn]] void fail(cudaError_t status, const std::string& what);
// "thread (x,y,z) of block (x,y,z)".
std::string describe_thread(const Block& b, int linear);
// Source location (function, file:line) of a code offset or address in the module.
std::string describe_code(uint32_t offset);
uint32_t code_offset(const void* pc);
std::string kernel_name(const void* kernel);
std::vector<std::string> kernel_names(const std::vector<const void*>& kernels);

// Memory checks (checks.cc): one access of `bytes` at addr by thread `linear` of the
// running block, `pc` the instruction's address.
enum class Access : uint8_t { kRead, kWrite, kAtomic };
void check_access(uintptr_t addr, size_t bytes, Access kind, const void* pc, int linear);
void on_block_start(Block& b);
// A cp.async's destination bytes: pending until the copy lands (`landed`).
void mark_pending(Block& b, int linear, uint32_t dst, int bytes, const void* pc);
void land_copy(Block& b, int linear, const PendingCopy& copy);

// Address of `bytes` of the shared window at shared address `addr`, checked.
unsigned char* shared_pointer(uint32_t addr, size_t bytes, size_t align, Access kind,
                              const void* pc, int linear, const char* what);

// Warp-synchronous instructions: every lane in `mask` arrives with its record; the last
// one to arrive runs complete(records, mask) for all of them.
void warp_collective(const char* op, uint32_t mask, void* record,
                     void (*complete)(void* const* records, uint32_t mask, const void* pc),
                     const void* pc);

}  // namespace oxijax::interp
