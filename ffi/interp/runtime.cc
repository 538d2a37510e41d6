// The CUDA interpreter's launch: configuration checks as the hardware makes them, then
// every block on the calling host thread, each CUDA thread a fiber, run in the schedule's
// order between synchronisation points (barriers, warp-synchronous instructions).
#include <algorithm>
#include <cstdlib>
#include <new>
#include <atomic>
#include <cstdio>
#include <mutex>
#include <numeric>
#include <random>
#include <sstream>

#include "device.h"
#include "state.h"

namespace oxijax::interp {

thread_local Block* tls_block = nullptr;
thread_local Thread* tls_thread = nullptr;

namespace {

std::atomic<int> g_order{int(Order::kShuffle)};
std::atomic<uint64_t> g_seed{0};
std::atomic<uint64_t> g_launches{0};

// Per host thread: the fibers, the shared window and its shadow, reused by every block.
struct FreeDeleter {
  void operator()(void* p) const { std::free(p); }
};
struct HostThread {
  std::vector<Thread> threads;
  std::unique_ptr<unsigned char, FreeDeleter> arena;  // 4 KiB aligned
  std::unique_ptr<SharedCell[]> cells;
  uint32_t gen = 0;
  std::mt19937_64 rng;
};
thread_local HostThread tls_host;

// The shared window: the dynamic shared memory, then the static variables, each after
// a redzone (inaccessible bytes, so that an overrun of one is out of bounds).
constexpr size_t kRedzone = 64;
constexpr size_t kWindowBytes =
    (kDevice.max_shared_optin + kDevice.max_static_shared + 64 * kRedzone + 4095) / 4096 * 4096;

void run_thread(void* arg) {
  auto* t = static_cast<Thread*>(arg);
  Block& b = *tls_block;
  b.launch->body(b.launch->closure);
  InRuntime in_runtime;
  // cp.async groups never waited for land when the thread exits.
  if (!t->open_group.empty()) t->committed.push_back(std::move(t->open_group));
  for (auto& group : t->committed)
    for (const auto& copy : group) land_copy(b, t->linear, copy);
  t->committed.clear();
  t->open_group.clear();
  t->wait = Wait::kDone;
  ++b.done;
  // Exited threads count as arrived at a pending barrier.
  if (b.at_barrier > 0 && b.at_barrier + b.done == b.threads) {
    for (int i = 0; i < b.threads; ++i)
      if ((*b.thread_pool)[i].wait == Wait::kBarrier) (*b.thread_pool)[i].wait = Wait::kReady;
    b.at_barrier = 0;
    ++b.epoch;
  }
  t->fiber->yield();
  __builtin_unreachable();
}

// A thread that fails is never resumed, so a yield returns only to a running kernel.
void yield_current() { tls_thread->fiber->yield(); }

std::vector<int> order_of(int n, HostThread& host) {
  std::vector<int> order(static_cast<size_t>(n));
  std::iota(order.begin(), order.end(), 0);
  switch (Order(g_order.load(std::memory_order_relaxed))) {
    case Order::kForward: break;
    case Order::kReverse: std::reverse(order.begin(), order.end()); break;
    case Order::kShuffle: std::shuffle(order.begin(), order.end(), host.rng); break;
  }
  return order;
}

std::string deadlock_report(const Block& b) {
  std::ostringstream out;
  out << "deadlock: no thread can run.";
  for (int w = 0; w < b.warps; ++w) {
    const Warp& warp = b.warp_state[size_t(w)];
    if (warp.arrived == 0) continue;
    uint32_t missing = warp.mask & ~warp.arrived;
    out << " Warp " << w << " waits in " << warp.op << " (mask 0x" << std::hex << warp.mask
        << ") for lanes 0x" << missing << std::dec << " (";
    for (int lane = 0; lane < 32; ++lane) {
      if (!((missing >> lane) & 1)) continue;
      const int linear = w * 32 + lane;
      if (linear >= b.threads) {
        out << "lane " << lane << " does not exist; ";
        continue;
      }
      const Thread& t = (*b.thread_pool)[size_t(linear)];
      out << "lane " << lane
          << (t.wait == Wait::kDone      ? " exited"
              : t.wait == Wait::kBarrier ? " waits at __syncthreads"
                                         : " waits elsewhere")
          << "; ";
    }
    out << ").";
  }
  if (b.at_barrier > 0)
    out << " " << b.at_barrier << " threads wait at __syncthreads while others wait in a "
        << "warp instruction.";
  return out.str();
}

cudaError_t run_block(Launch& launch, uint3 idx, HostThread& host) {
  Block b;
  b.launch = &launch;
  b.idx = idx;
  b.threads = int(launch.block.x * launch.block.y * launch.block.z);
  b.warps = (b.threads + 31) / 32;
  b.warp_state.assign(size_t(b.warps), Warp{});
  b.thread_pool = &host.threads;
  b.gen = ++host.gen;
  if (b.gen == 0) b.gen = ++host.gen;  // 0 marks a never-used cell
  b.arena = host.arena.get();
  b.arena_bytes = kWindowBytes;
  b.dynamic_bytes = launch.shared_bytes;
  b.static_top = (launch.shared_bytes + kRedzone + 127) / 128 * 128;
  b.cells = host.cells.get();
  tls_block = &b;
  on_block_start(b);

  while (host.threads.size() < size_t(b.threads)) {
    host.threads.emplace_back();
    host.threads.back().fiber = std::make_unique<Fiber>();
  }
  for (int i = 0; i < b.threads; ++i) {
    Thread& t = host.threads[size_t(i)];
    t.linear = i;
    t.lane = i % 32;
    t.warp = i / 32;
    t.idx = uint3{unsigned(i) % launch.block.x, unsigned(i) / launch.block.x % launch.block.y,
                  unsigned(i) / (launch.block.x * launch.block.y)};
    t.wait = Wait::kReady;
    t.in_runtime = 0;
    t.waiting_at = nullptr;
    t.open_group.clear();
    t.committed.clear();
    t.fiber->reset(&run_thread, &t);
  }

  while (b.done < b.threads) {
    bool ran = false;
    for (int i : order_of(b.threads, host)) {
      Thread& t = host.threads[size_t(i)];
      if (t.wait != Wait::kReady) continue;
      tls_thread = &t;
      t.fiber->resume();
      tls_thread = nullptr;
      ran = true;
      if (launch.status != cudaSuccess) {
        tls_block = nullptr;
        return launch.status;
      }
    }
    if (!ran) {
      launch.status = cudaErrorLaunchFailure;
      launch.report = "oxijax CUDA interpreter: kernel " + kernel_name(launch.kernel) +
                      ", block (" + std::to_string(idx.x) + "," + std::to_string(idx.y) + "," +
                      std::to_string(idx.z) + "): " + deadlock_report(b);
      tls_block = nullptr;
      return launch.status;
    }
  }
  tls_block = nullptr;
  return cudaSuccess;
}

cudaError_t configuration_error(Launch& launch, cudaError_t status, const std::string& why) {
  launch.status = status;
  launch.report = "oxijax CUDA interpreter: launch of " + kernel_name(launch.kernel) +
                  " refused: " + why;
  return status;
}

cudaError_t check_configuration(Launch& l) {
  const dim3 g = l.grid, k = l.block;
  auto dims = [](dim3 d) {
    return "(" + std::to_string(d.x) + ", " + std::to_string(d.y) + ", " + std::to_string(d.z) +
           ")";
  };
  if (g.x == 0 || g.y == 0 || g.z == 0 || k.x == 0 || k.y == 0 || k.z == 0)
    return configuration_error(l, cudaErrorInvalidConfiguration,
                               "a zero grid or block dimension: grid " + dims(g) + ", block " +
                                   dims(k));
  if (uint64_t(g.x) > kDevice.max_grid_x || g.y > kDevice.max_grid_yz ||
      g.z > kDevice.max_grid_yz)
    return configuration_error(l, cudaErrorInvalidConfiguration,
                               "grid " + dims(g) + " exceeds (2^31-1, 65535, 65535)");
  if (k.x > 1024 || k.y > 1024 || k.z > 64 || uint64_t(k.x) * k.y * k.z > 1024)
    return configuration_error(l, cudaErrorInvalidConfiguration,
                               "block " + dims(k) + " exceeds 1024 threads or (1024, 1024, 64)");
  const size_t allowed = dynamic_shared_limit(l.kernel);
  if (l.shared_bytes > allowed)
    return configuration_error(
        l, cudaErrorInvalidValue,
        std::to_string(l.shared_bytes) + " bytes of dynamic shared memory, above the kernel's " +
            std::to_string(allowed) +
            " (more than 48 KiB needs cudaFuncSetAttribute(MaxDynamicSharedMemorySize))");
  return cudaSuccess;
}

}  // namespace

Schedule current_schedule() {
  return Schedule{Order(g_order.load()), g_seed.load()};
}
void set_schedule(Schedule s) {
  g_order.store(int(s.order));
  g_seed.store(s.seed);
}

cudaError_t launch_erased(const void* kernel, dim3 grid, dim3 block, size_t shared_bytes,
                          KernelBody body, const void* closure, const void* params,
                          size_t params_bytes) {
  Launch launch{kernel, grid, block, shared_bytes, body, closure,
                reinterpret_cast<uintptr_t>(params), params_bytes};
  if (tls_block != nullptr)
    return finish_launch(launch, configuration_error(launch, cudaErrorNotSupported,
                                                     "a launch from device code"));
  if (check_configuration(launch) != cudaSuccess) return finish_launch(launch, launch.status);
  if (const cudaError_t injected = injected_failure("launch"))
    return finish_launch(launch, configuration_error(launch, injected, "injected launch failure"));

  HostThread& host = tls_host;
  if (!host.arena) {
    host.arena.reset(static_cast<unsigned char*>(std::aligned_alloc(4096, kWindowBytes)));
    if (!host.arena) throw std::bad_alloc();
    host.cells.reset(new SharedCell[kWindowBytes]());
  }
  const uint64_t number = g_launches.fetch_add(1);
  host.rng.seed(g_seed.load() * 0x9e3779b97f4a7c15ull + number);
  record_launch(launch);
  if (!execute_launches()) return finish_launch(launch, cudaSuccess);

  // Blocks in the schedule's order too (x fastest, as blockIdx enumerates them).
  const uint64_t blocks = uint64_t(grid.x) * grid.y * grid.z;
  const Order order = Order(g_order.load());
  std::vector<uint64_t> shuffled;
  if (order == Order::kShuffle && blocks <= (uint64_t(1) << 20)) {
    shuffled.resize(blocks);
    std::iota(shuffled.begin(), shuffled.end(), uint64_t(0));
    std::shuffle(shuffled.begin(), shuffled.end(), host.rng);
  }
  for (uint64_t i = 0; i < blocks; ++i) {
    uint64_t n = order == Order::kReverse ? blocks - 1 - i : shuffled.empty() ? i : shuffled[i];
    const uint3 idx{unsigned(n % grid.x), unsigned(n / grid.x % grid.y),
                    unsigned(n / (uint64_t(grid.x) * grid.y))};
    if (run_block(launch, idx, host) != cudaSuccess) break;
  }
  return finish_launch(launch, launch.status);
}

[[noreturn]] void fail(cudaError_t status, const std::string& what) {
  InRuntime in_runtime;
  Block& b = *tls_block;
  Launch& l = *b.launch;
  if (l.status == cudaSuccess) {
    l.status = status;
    l.report = "oxijax CUDA interpreter: kernel " + kernel_name(l.kernel) + ", " +
               describe_thread(b, tls_thread ? tls_thread->linear : 0) + ": " + what;
  }
  tls_thread->wait = Wait::kDone;
  tls_thread->fiber->yield();  // the scheduler abandons this fiber
  __builtin_unreachable();
}

std::string describe_thread(const Block& b, int linear) {
  const Thread& t = (*b.thread_pool)[size_t(linear)];
  std::ostringstream out;
  out << "thread (" << t.idx.x << "," << t.idx.y << "," << t.idx.z << ") [warp " << t.warp
      << " lane " << t.lane << "] of block (" << b.idx.x << "," << b.idx.y << "," << b.idx.z
      << ")";
  return out.str();
}

// ------------------------------------------------------------------ built-ins

uint3 thread_idx() { return tls_thread->idx; }
uint3 block_idx() { return tls_block->idx; }
dim3 block_dim() { return tls_block->launch->block; }
dim3 grid_dim() { return tls_block->launch->grid; }

void sync_threads() {
  InRuntime in_runtime;
  Thread& t = *tls_thread;
  Block& b = *tls_block;
  t.wait = Wait::kBarrier;
  if (++b.at_barrier + b.done == b.threads) {
    for (int i = 0; i < b.threads; ++i)
      if ((*b.thread_pool)[i].wait == Wait::kBarrier) (*b.thread_pool)[i].wait = Wait::kReady;
    b.at_barrier = 0;
    ++b.epoch;
  }
  yield_current();
}

void warp_collective(const char* op, uint32_t mask, void* record,
                     void (*complete)(void* const* records, uint32_t mask, const void* pc),
                     const void* pc) {
  InRuntime in_runtime;
  Thread& t = *tls_thread;
  Block& b = *tls_block;
  Warp& w = b.warp_state[size_t(t.warp)];
  const uint32_t bit = 1u << t.lane;
  const int lanes = std::min(32, b.threads - t.warp * 32);
  const uint32_t existing = lanes == 32 ? 0xffffffffu : (1u << lanes) - 1;
  std::ostringstream why;
  if (!(mask & bit)) {
    why << op << " with mask 0x" << std::hex << mask << " that leaves out the calling lane";
    fail(cudaErrorIllegalInstruction, why.str());
  }
  if (mask & ~existing) {
    why << op << " with mask 0x" << std::hex << mask << " naming lanes that do not exist "
        << "(the warp has " << std::dec << lanes << ")";
    fail(cudaErrorIllegalInstruction, why.str());
  }
  if (w.arrived == 0) {
    w.op = op;
    w.mask = mask;
  } else if (w.op != op || w.mask != mask) {
    why << "divergent warp: lanes 0x" << std::hex << w.arrived << " wait in " << w.op
        << " (mask 0x" << w.mask << "), this lane executes " << op << " (mask 0x" << mask << ")";
    fail(cudaErrorIllegalInstruction, why.str() + " at " + describe_code(code_offset(pc)));
  }
  w.records[t.lane] = record;
  w.arrived |= bit;
  if (w.arrived == mask) {
    complete(w.records, mask, pc);
    w.arrived = 0;
    for (int lane = 0; lane < 32; ++lane) {
      if (!((mask >> lane) & 1) || lane == t.lane) continue;
      Thread& other = (*b.thread_pool)[size_t(t.warp * 32 + lane)];
      other.wait = Wait::kReady;
      other.waiting_at = nullptr;
    }
    return;
  }
  t.wait = Wait::kWarp;
  t.waiting_at = op;
  yield_current();
}

void sync_warp(unsigned mask) {
  warp_collective("__syncwarp", mask, nullptr,
                  [](void* const*, uint32_t, const void*) {
                    Block& b = *tls_block;
                    ++b.warp_state[size_t(tls_thread->warp)].epoch;
                  },
                  __builtin_return_address(0));
}

namespace {
struct ShuffleRecord {
  uint64_t value;
  int lane_arg;
  uint64_t result;
};
}  // namespace

uint64_t shuffle(unsigned mask, uint64_t value, int bytes, Shuffle mode, int lane_arg,
                 int width) {
  InRuntime in_runtime;
  if (width <= 0 || width > 32 || (width & (width - 1)))
    fail(cudaErrorIllegalInstruction, "warp shuffle width " + std::to_string(width) +
                                          " is not a power of two up to 32");
  struct Full {
    ShuffleRecord r;
    Shuffle mode;
    int width, bytes;
  } record{{value, lane_arg, 0}, mode, width, bytes};
  static const char* const kNames[] = {"__shfl_sync", "__shfl_up_sync", "__shfl_down_sync",
                                       "__shfl_xor_sync"};
  warp_collective(
      kNames[int(mode)], mask, &record,
      [](void* const* records, uint32_t m, const void*) {
        // PTX ISA "shfl.sync": lanes are split into segments of `width`; a source lane
        // outside the segment (or, for up/down, past its ends) gives the lane's own value.
        for (int lane = 0; lane < 32; ++lane) {
          if (!((m >> lane) & 1)) continue;
          auto* r = static_cast<Full*>(records[lane]);
          const int seg = lane & ~(r->width - 1), offset = lane - seg;
          int src = lane;
          switch (r->mode) {
            case Shuffle::kIndex: src = seg + (r->r.lane_arg & (r->width - 1)); break;
            case Shuffle::kUp: src = offset - r->r.lane_arg >= 0 ? lane - r->r.lane_arg : lane; break;
            case Shuffle::kDown:
              src = offset + r->r.lane_arg < r->width ? lane + r->r.lane_arg : lane;
              break;
            case Shuffle::kXor: {
              const int x = lane ^ r->r.lane_arg;
              src = (x & ~(r->width - 1)) == seg ? x : lane;
              break;
            }
          }
          if (src < 0 || src > 31 || !((m >> src) & 1))
            fail(cudaErrorIllegalInstruction,
                 "warp shuffle reads lane " + std::to_string(src) + ", which is not in the mask");
          r->r.result = static_cast<Full*>(records[src])->r.value;
        }
      },
      __builtin_return_address(0));
  return record.r.result;
}

unsigned vote_ballot(unsigned mask, bool predicate) {
  InRuntime in_runtime;
  struct Record {
    bool predicate;
    unsigned result;
  } record{predicate, 0};
  warp_collective("__ballot_sync", mask, &record,
                  [](void* const* records, uint32_t m, const void*) {
                    unsigned ballot = 0;
                    for (int lane = 0; lane < 32; ++lane)
                      if (((m >> lane) & 1) && static_cast<Record*>(records[lane])->predicate)
                        ballot |= 1u << lane;
                    for (int lane = 0; lane < 32; ++lane)
                      if ((m >> lane) & 1) static_cast<Record*>(records[lane])->result = ballot;
                  },
                  __builtin_return_address(0));
  return record.result;
}

[[noreturn]] void trap(const char* what) {
  InRuntime in_runtime;
  fail(cudaErrorIllegalInstruction, std::string(what) + " at " +
                                        describe_code(code_offset(__builtin_return_address(0))));
}

// ------------------------------------------------------------------ shared memory

void* shared_variable_bytes(const void* site, const char* name, size_t bytes, size_t align) {
  InRuntime in_runtime;
  Block& b = *tls_block;
  for (const SharedVariable& v : b.variables)
    if (v.site == site) return b.arena + v.offset;
  const size_t offset = (b.static_top + align - 1) / align * align;
  size_t used = 0;
  for (const SharedVariable& v : b.variables) used += v.bytes;
  if (used + bytes > kDevice.max_static_shared)
    fail(cudaErrorLaunchOutOfResources,
         "static shared memory above 48 KiB (" + std::to_string(used + bytes) + " bytes with " +
             name + ")");
  if (used + bytes + b.dynamic_bytes > kDevice.max_shared_optin)
    fail(cudaErrorLaunchOutOfResources,
         "static + dynamic shared memory above the H200's 227 KiB per block");
  b.variables.push_back(SharedVariable{site, name, offset, bytes});
  b.static_top = offset + bytes + kRedzone;
  return b.arena + offset;
}

unsigned char* dynamic_shared(size_t align) {
  (void)align;  // the window starts 4 KiB aligned
  return tls_block->arena;
}

uint32_t shared_address(const void* p) {
  InRuntime in_runtime;
  Block& b = *tls_block;
  const uintptr_t a = reinterpret_cast<uintptr_t>(p), base = reinterpret_cast<uintptr_t>(b.arena);
  if (a - base >= b.arena_bytes) {
    std::ostringstream why;
    why << "cvta.to.shared of " << p << ", which is not in shared memory";
    fail(cudaErrorIllegalAddress, why.str());
  }
  return uint32_t(a - base);
}

}  // namespace oxijax::interp
