// The interpreter's memory checks. The kernels are compiled with -fsanitize=thread, which
// makes the compiler call __tsan_readN / __tsan_writeN before every load and store that
// may touch memory shared between threads; this file is the runtime behind those calls
// (libtsan is not linked). Each access of a running CUDA thread is classified:
//  - its own fiber stack (registers and local memory): not checked;
//  - the block's shared window: bounds (the dynamic shared memory and each static
//    variable separately), races with other threads of the block in the same barrier
//    interval, reads of bytes never written, reads of a cp.async's bytes before they land;
//  - the launch's parameters: read only;
//  - anything else is global memory: it must lie inside one registered buffer
//    (memory.h), and reads need initialised bytes.
// Every 2-, 4-, 8- and 16-byte access must be aligned to its size, as on the GPU.
#include <dlfcn.h>
#include <link.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <shared_mutex>
#include <sstream>
#include <vector>

#include "memory.h"
#include "state.h"

namespace oxijax::interp {
namespace {

// ------------------------------------------------------------------ global buffers

struct Buffer {
  uintptr_t base = 0;
  size_t bytes = 0;
  std::string label;
  std::vector<uint8_t> init;  // per byte; empty when all bytes are initialised
  void* mapping = nullptr;    // device_alloc's block (redzones included)
};

std::shared_mutex g_mu;
std::map<uintptr_t, std::shared_ptr<Buffer>> g_buffers;
std::atomic<uint64_t> g_version{1};  // bumped when a buffer goes away
std::atomic<size_t> g_device_bytes{0};

struct Cache {
  uint64_t version = 0;
  Buffer* buffer = nullptr;
};
thread_local Cache tls_cache;

Buffer* find_buffer(uintptr_t a) {
  Cache& c = tls_cache;
  const uint64_t version = g_version.load(std::memory_order_acquire);
  if (c.version == version && c.buffer && a - c.buffer->base < c.buffer->bytes) return c.buffer;
  std::shared_lock lock(g_mu);
  auto it = g_buffers.upper_bound(a);
  if (it == g_buffers.begin()) return nullptr;
  --it;
  Buffer* b = it->second.get();
  if (a - b->base >= b->bytes) return nullptr;
  c.version = version;
  c.buffer = b;
  return b;
}

// "N bytes past the end of buffer 'x' (B bytes at 0x...)" for an address in no buffer.
std::string nearest_buffer(uintptr_t a) {
  std::shared_lock lock(g_mu);
  std::ostringstream out;
  auto next = g_buffers.upper_bound(a);
  if (next != g_buffers.begin()) {
    const Buffer& b = *std::prev(next)->second;
    out << (a - (b.base + b.bytes)) << " bytes past the end of " << b.label << " (" << b.bytes
        << " bytes at 0x" << std::hex << b.base << std::dec << ")";
    if (next != g_buffers.end()) out << "; ";
  }
  if (next != g_buffers.end()) {
    const Buffer& b = *next->second;
    out << (b.base - a) << " bytes before " << b.label << " (" << b.bytes << " bytes at 0x"
        << std::hex << b.base << std::dec << ")";
  }
  std::string s = out.str();
  return s.empty() ? "no device buffer is registered" : s;
}

// The module's read-only data (constant tables, literals): kernels may read it.
struct StaticData {
  std::vector<std::pair<uintptr_t, uintptr_t>> ranges;
  StaticData() {
    Dl_info info{};
    if (!dladdr(reinterpret_cast<const void*>(&nearest_buffer), &info)) return;
    struct Arg {
      const void* base;
      std::vector<std::pair<uintptr_t, uintptr_t>>* ranges;
    } arg{info.dli_fbase, &ranges};
    dl_iterate_phdr(
        [](dl_phdr_info* phdr, size_t, void* data) {
          auto* a = static_cast<Arg*>(data);
          if (reinterpret_cast<const void*>(phdr->dlpi_addr) != a->base) return 0;
          for (int i = 0; i < phdr->dlpi_phnum; ++i) {
            const ElfW(Phdr)& p = phdr->dlpi_phdr[i];
            if (p.p_type == PT_LOAD && !(p.p_flags & PF_W))
              a->ranges->emplace_back(phdr->dlpi_addr + p.p_vaddr,
                                      phdr->dlpi_addr + p.p_vaddr + p.p_memsz);
          }
          return 1;
        },
        &arg);
  }
  bool contains(uintptr_t a, size_t n) const {
    for (auto [lo, hi] : ranges)
      if (a >= lo && a + n <= hi) return true;
    return false;
  }
};

const StaticData& static_data() {
  static const StaticData data;
  return data;
}

const char* verb(Access kind) {
  return kind == Access::kRead ? "read" : kind == Access::kWrite ? "write" : "atomic";
}

std::string hex(uintptr_t a) {
  std::ostringstream out;
  out << "0x" << std::hex << a;
  return out.str();
}

void check_global(uintptr_t a, size_t n, Access kind, const void* pc) {
  Buffer* b = find_buffer(a);
  if (b == nullptr || a + n > b->base + b->bytes) {
    if (kind == Access::kRead && b == nullptr && static_data().contains(a, n)) return;
    std::ostringstream why;
    why << "out-of-bounds global " << verb(kind) << " of " << n << " bytes at " << hex(a);
    if (b != nullptr)
      why << ", overrunning the end of " << b->label << " (" << b->bytes << " bytes at "
          << hex(b->base) << ") by " << (a + n - (b->base + b->bytes)) << " bytes";
    else
      why << ": " << nearest_buffer(a);
    fail(cudaErrorIllegalAddress, why.str() + ", at " + describe_code(code_offset(pc)));
  }
  if (b->init.empty()) return;
  uint8_t* init = b->init.data() + (a - b->base);
  if (kind != Access::kWrite) {  // reads and atomics need written bytes
    for (size_t i = 0; i < n; ++i)
      if (!init[i]) {
        std::ostringstream why;
        why << "read of uninitialised global memory: byte " << (a + i - b->base) << " of "
            << b->label << " was never written, at " << describe_code(code_offset(pc));
        fail(cudaErrorLaunchFailure, why.str());
      }
  } else {
    std::memset(init, 1, n);
  }
}

// ------------------------------------------------------------------ shared memory

constexpr uint16_t kNobody = 0xffff;

std::string shared_place(const Block& b, size_t off) {
  std::ostringstream out;
  if (off < b.dynamic_bytes) {
    out << "dynamic shared memory + " << off;
    return out.str();
  }
  for (const SharedVariable& v : b.variables)
    if (off >= v.offset && off < v.offset + v.bytes) {
      out << "__shared__ " << v.name << " + " << (off - v.offset);
      return out.str();
    }
  out << "shared offset " << off;
  return out.str();
}

void shared_bounds(const Block& b, size_t off, size_t n, Access kind, const void* pc) {
  if (off + n <= b.dynamic_bytes) return;
  for (const SharedVariable& v : b.variables)
    if (off >= v.offset && off + n <= v.offset + v.bytes) return;
  std::ostringstream why;
  why << "out-of-bounds shared " << verb(kind) << " of " << n << " bytes at shared offset "
      << off << " (dynamic shared memory: " << b.dynamic_bytes << " bytes";
  for (const SharedVariable& v : b.variables)
    why << "; " << v.name << ": " << v.bytes << " bytes at " << v.offset;
  why << "), at " << describe_code(code_offset(pc));
  fail(cudaErrorIllegalAddress, why.str());
}

// Whether `earlier` (by thread u in warp interval u_warp_epoch) happens before an access
// of thread t in the same barrier interval: only through a __syncwarp of their warp.
bool ordered(const Block& b, int u, uint16_t u_warp_epoch, int t) {
  return u / 32 == t / 32 && uint16_t(b.warp_state[size_t(t / 32)].epoch) != u_warp_epoch;
}

[[noreturn]] void race(const Block& b, size_t off, const char* kind, int other,
                       uint32_t other_pc, const char* other_verb, int me, const void* pc,
                       const char* my_verb) {
  std::ostringstream why;
  why << "shared-memory data race (" << kind << ") on " << shared_place(b, off)
      << " in barrier interval " << b.epoch << ": " << other_verb << " by "
      << describe_thread(b, other) << " at " << describe_code(other_pc) << ", then " << my_verb
      << " by " << describe_thread(b, me) << " at " << describe_code(code_offset(pc))
      << ", with no __syncthreads() between them";
  fail(cudaErrorLaunchFailure, why.str());
}

void check_shared(Block& b, size_t off, size_t n, Access kind, const void* pc, int t) {
  shared_bounds(b, off, n, kind, pc);
  const uint16_t warp_epoch = uint16_t(b.warp_state[size_t(t / 32)].epoch);
  const uint32_t where = code_offset(pc);
  for (size_t i = off; i < off + n; ++i) {
    SharedCell& c = b.cells[i];
    if (c.gen != b.gen) {
      c = SharedCell{};
      c.gen = b.gen;
      c.writer = c.reader = kNobody;
    }
    const bool wrote_now = c.writer != kNobody && c.w_epoch == b.epoch && c.writer != t &&
                           !ordered(b, c.writer, c.w_warp_epoch, t);
    if (kind == Access::kRead) {
      if (c.flags & kPending) {
        std::ostringstream why;
        why << "read of " << shared_place(b, i) << " before the cp.async that fills it "
            << "(issued by " << describe_thread(b, c.writer) << " at " << describe_code(c.w_pc)
            << ") has landed: a missing cp.async.wait_group, at " << describe_code(where);
        fail(cudaErrorLaunchFailure, why.str());
      }
      if (!(c.flags & kInit)) {
        std::ostringstream why;
        why << "read of uninitialised shared memory (" << shared_place(b, i)
            << " was never written in this block), at " << describe_code(where);
        fail(cudaErrorLaunchFailure, why.str());
      }
      if (wrote_now) race(b, i, "read after write", c.writer, c.w_pc, "write", t, pc, "read");
      if (c.reader == kNobody || c.r_epoch != b.epoch) {
        c.reader = uint16_t(t);
        c.r_epoch = b.epoch;
        c.r_warp_epoch = warp_epoch;
        c.r_pc = where;
        c.flags &= uint8_t(~kManyReaders);
      } else if (c.reader != t) {
        c.flags |= kManyReaders;
      }
    } else if (kind == Access::kWrite) {
      if (wrote_now) race(b, i, "write after write", c.writer, c.w_pc, "write", t, pc, "write");
      if (c.reader != kNobody && c.r_epoch == b.epoch &&
          ((c.flags & kManyReaders) ||
           (c.reader != t && !ordered(b, c.reader, c.r_warp_epoch, t))))
        race(b, i, "write after read", c.reader, c.r_pc, "read", t, pc, "write");
      c.writer = uint16_t(t);
      c.w_epoch = b.epoch;
      c.w_warp_epoch = warp_epoch;
      c.w_pc = where;
      c.reader = kNobody;
      c.flags = uint8_t((c.flags | kInit) & ~(kManyReaders | kPending));
    } else {  // atomics do not race with each other
      if (!(c.flags & kInit)) {
        fail(cudaErrorLaunchFailure, "atomic on uninitialised shared memory (" +
                                         shared_place(b, i) + "), at " + describe_code(where));
      }
    }
  }
}

void check_alignment(uintptr_t a, size_t n, const void* pc) {
  if ((n == 2 || n == 4 || n == 8 || n == 16) && a % n != 0) {
    std::ostringstream why;
    why << "misaligned " << n << "-byte access at " << hex(a) << ", at "
        << describe_code(code_offset(pc));
    fail(cudaErrorMisalignedAddress, why.str());
  }
}

}  // namespace

void check_access(uintptr_t a, size_t n, Access kind, const void* pc, int linear) {
  Block& b = *tls_block;
  const uintptr_t window = reinterpret_cast<uintptr_t>(b.arena);
  if (a - window < b.arena_bytes) {
    check_shared(b, a - window, n, kind, pc, linear);
    return;
  }
  const Launch& l = *b.launch;
  if (a - l.params < l.params_bytes) {
    if (kind != Access::kRead)
      fail(cudaErrorIllegalAddress, "write to the kernel's parameters, at " +
                                        describe_code(code_offset(pc)));
    return;
  }
  check_global(a, n, kind, pc);
}

// The hook behind every instrumented access: the running CUDA thread's own stack is
// local memory; outside a kernel (the launchers' host code) nothing is checked.
__attribute__((always_inline)) inline void on_access(void* addr, size_t n, Access kind,
                                                     bool aligned, const void* pc) {
  Thread* t = tls_thread;
  if (t == nullptr || t->in_runtime) return;
  const uintptr_t a = reinterpret_cast<uintptr_t>(addr);
  if (a - t->fiber->stack_low() < Fiber::stack_bytes()) return;
  InRuntime in_runtime;
  if (aligned) check_alignment(a, n, pc);
  check_access(a, n, kind, pc, t->linear);
}

void on_block_start(Block& b) {
  // Fresh shared memory holds garbage: 0xff is NaN in every float dtype.
  std::memset(b.arena, 0xff, std::min(b.arena_bytes, b.dynamic_bytes));
}

void mark_pending(Block& b, int linear, uint32_t dst, int bytes, const void* pc) {
  check_shared(b, dst, size_t(bytes), Access::kWrite, pc, linear);
  for (int i = 0; i < bytes; ++i) b.cells[dst + uint32_t(i)].flags |= kPending;
  std::memset(b.arena + dst, 0xff, size_t(bytes));  // undefined until it lands
}

// The copy reads its source when it lands, as late as the PTX memory model allows.
void land_copy(Block& b, int linear, const PendingCopy& copy) {
  if (copy.src_bytes > 0)
    check_access(reinterpret_cast<uintptr_t>(copy.src), size_t(copy.src_bytes), Access::kRead,
                 copy.pc, linear);
  for (int i = 0; i < copy.bytes; ++i) b.cells[copy.dst + uint32_t(i)].flags &= ~kPending;
  check_shared(b, copy.dst, size_t(copy.bytes), Access::kWrite, copy.pc, linear);
  std::memcpy(b.arena + copy.dst, copy.src, size_t(copy.src_bytes));
  std::memset(b.arena + copy.dst + copy.src_bytes, 0, size_t(copy.bytes - copy.src_bytes));
}

unsigned char* shared_pointer(uint32_t addr, size_t bytes, size_t align, Access kind,
                              const void* pc, int linear, const char* what) {
  Block& b = *tls_block;
  if (addr % align != 0) {
    std::ostringstream why;
    why << what << " at shared address " << addr << ", not " << align << "-byte aligned, at "
        << describe_code(code_offset(pc));
    fail(cudaErrorMisalignedAddress, why.str());
  }
  if (size_t(addr) + bytes > b.arena_bytes) {
    std::ostringstream why;
    why << what << " at shared address " << addr << ", outside the shared window, at "
        << describe_code(code_offset(pc));
    fail(cudaErrorIllegalAddress, why.str());
  }
  check_shared(b, addr, bytes, kind, pc, linear);
  return b.arena + addr;
}

// ------------------------------------------------------------------ memory.h

void register_buffer(void* p, size_t bytes, std::string label, bool initialized) {
  if (p == nullptr || bytes == 0) return;
  auto b = std::make_shared<Buffer>();
  b->base = reinterpret_cast<uintptr_t>(p);
  b->bytes = bytes;
  b->label = std::move(label);
  if (!initialized) {
    b->init.assign(bytes, 0);
    std::memset(p, 0xff, bytes);
  }
  std::unique_lock lock(g_mu);
  g_buffers[b->base] = std::move(b);
}

void unregister_buffer(void* p) {
  if (p == nullptr) return;
  std::unique_lock lock(g_mu);
  g_buffers.erase(reinterpret_cast<uintptr_t>(p));
  g_version.fetch_add(1, std::memory_order_release);
}

namespace {
constexpr size_t kDeviceRedzone = 256;  // also the allocation alignment, as cudaMalloc's
}

void* device_alloc(size_t bytes, std::string label) {
  const size_t rounded = (bytes + kDeviceRedzone - 1) / kDeviceRedzone * kDeviceRedzone;
  void* mapping = std::aligned_alloc(kDeviceRedzone, rounded + 2 * kDeviceRedzone);
  if (mapping == nullptr) return nullptr;
  auto* p = static_cast<unsigned char*>(mapping) + kDeviceRedzone;
  register_buffer(p, bytes == 0 ? 1 : bytes, std::move(label), false);
  {
    std::unique_lock lock(g_mu);
    g_buffers[reinterpret_cast<uintptr_t>(p)]->mapping = mapping;
  }
  g_device_bytes.fetch_add(bytes);
  return p;
}

void device_free(void* p) {
  void* mapping = nullptr;
  size_t bytes = 0;
  {
    std::unique_lock lock(g_mu);
    auto it = g_buffers.find(reinterpret_cast<uintptr_t>(p));
    if (it == g_buffers.end() || it->second->mapping == nullptr) return;
    mapping = it->second->mapping;
    bytes = it->second->bytes;
    g_buffers.erase(it);
    g_version.fetch_add(1, std::memory_order_release);
  }
  g_device_bytes.fetch_sub(bytes);
  std::free(mapping);
}

size_t device_bytes_in_use() { return g_device_bytes.load(); }

bool host_access(const void* p, size_t bytes, bool write, bool require_init, std::string& why) {
  if (bytes == 0) return true;
  const uintptr_t a = reinterpret_cast<uintptr_t>(p);
  Buffer* b = find_buffer(a);
  if (b == nullptr || a + bytes > b->base + b->bytes) {
    why = std::to_string(bytes) + " bytes at " + hex(a) + " are not inside one device buffer (" +
          (b ? "they overrun " + b->label : nearest_buffer(a)) + ")";
    return false;
  }
  if (!b->init.empty()) {
    uint8_t* init = b->init.data() + (a - b->base);
    if (write) {
      std::memset(init, 1, bytes);
    } else if (require_init && std::find(init, init + bytes, uint8_t(0)) != init + bytes) {
      why = "a copy reads uninitialised bytes of " + b->label;
      return false;
    }
  }
  return true;
}

}  // namespace oxijax::interp

// ------------------------------------------------------------------ ThreadSanitizer ABI
// The entry points GCC and Clang emit under -fsanitize=thread (see libtsan's
// tsan_interface.h), served here. Atomics perform the operation for real (the launchers'
// host code uses std::atomic) and are checked like any access inside a kernel.

namespace ix = oxijax::interp;

#define OXIJAX_TSAN_ACCESS(n)                                                                \
  extern "C" void __tsan_read##n(void* a) {                                                 \
    ix::on_access(a, n, ix::Access::kRead, true, __builtin_return_address(0));              \
  }                                                                                         \
  extern "C" void __tsan_write##n(void* a) {                                                \
    ix::on_access(a, n, ix::Access::kWrite, true, __builtin_return_address(0));             \
  }                                                                                         \
  extern "C" void __tsan_unaligned_read##n(void* a) {                                       \
    ix::on_access(a, n, ix::Access::kRead, false, __builtin_return_address(0));             \
  }                                                                                         \
  extern "C" void __tsan_unaligned_write##n(void* a) {                                      \
    ix::on_access(a, n, ix::Access::kWrite, false, __builtin_return_address(0));            \
  }                                                                                         \
  extern "C" void __tsan_volatile_read##n(void* a) {                                        \
    ix::on_access(a, n, ix::Access::kRead, true, __builtin_return_address(0));              \
  }                                                                                         \
  extern "C" void __tsan_volatile_write##n(void* a) {                                       \
    ix::on_access(a, n, ix::Access::kWrite, true, __builtin_return_address(0));             \
  }
OXIJAX_TSAN_ACCESS(1)
OXIJAX_TSAN_ACCESS(2)
OXIJAX_TSAN_ACCESS(4)
OXIJAX_TSAN_ACCESS(8)
OXIJAX_TSAN_ACCESS(16)
#undef OXIJAX_TSAN_ACCESS

extern "C" void __tsan_read_range(void* a, unsigned long n) {
  ix::on_access(a, n, ix::Access::kRead, false, __builtin_return_address(0));
}
extern "C" void __tsan_write_range(void* a, unsigned long n) {
  ix::on_access(a, n, ix::Access::kWrite, false, __builtin_return_address(0));
}
extern "C" void __tsan_init() {}
extern "C" void __tsan_func_entry(void*) {}
extern "C" void __tsan_func_exit() {}
extern "C" void __tsan_vptr_update(void**, void*) {}
extern "C" void __tsan_vptr_read(void**) {}
extern "C" void __tsan_atomic_thread_fence(int) { __atomic_thread_fence(__ATOMIC_SEQ_CST); }
extern "C" void __tsan_atomic_signal_fence(int) {}

#define OXIJAX_TSAN_ATOMIC(n, T)                                                              \
  extern "C" T __tsan_atomic##n##_load(const volatile T* a, int) {                           \
    ix::on_access(const_cast<T*>(a), n / 8, ix::Access::kRead, true,                         \
                  __builtin_return_address(0));                                              \
    return __atomic_load_n(a, __ATOMIC_SEQ_CST);                                             \
  }                                                                                          \
  extern "C" void __tsan_atomic##n##_store(volatile T* a, T v, int) {                        \
    ix::on_access(const_cast<T*>(a), n / 8, ix::Access::kAtomic, true,                       \
                  __builtin_return_address(0));                                              \
    __atomic_store_n(a, v, __ATOMIC_SEQ_CST);                                                \
  }                                                                                          \
  extern "C" T __tsan_atomic##n##_exchange(volatile T* a, T v, int) {                        \
    return __atomic_exchange_n(a, v, __ATOMIC_SEQ_CST);                                      \
  }                                                                                          \
  extern "C" T __tsan_atomic##n##_fetch_add(volatile T* a, T v, int) {                       \
    return __atomic_fetch_add(a, v, __ATOMIC_SEQ_CST);                                       \
  }                                                                                          \
  extern "C" T __tsan_atomic##n##_fetch_sub(volatile T* a, T v, int) {                       \
    return __atomic_fetch_sub(a, v, __ATOMIC_SEQ_CST);                                       \
  }                                                                                          \
  extern "C" T __tsan_atomic##n##_fetch_and(volatile T* a, T v, int) {                       \
    return __atomic_fetch_and(a, v, __ATOMIC_SEQ_CST);                                       \
  }                                                                                          \
  extern "C" T __tsan_atomic##n##_fetch_or(volatile T* a, T v, int) {                        \
    return __atomic_fetch_or(a, v, __ATOMIC_SEQ_CST);                                        \
  }                                                                                          \
  extern "C" T __tsan_atomic##n##_fetch_xor(volatile T* a, T v, int) {                       \
    return __atomic_fetch_xor(a, v, __ATOMIC_SEQ_CST);                                       \
  }                                                                                          \
  extern "C" T __tsan_atomic##n##_fetch_nand(volatile T* a, T v, int) {                      \
    return __atomic_fetch_nand(a, v, __ATOMIC_SEQ_CST);                                      \
  }                                                                                          \
  extern "C" int __tsan_atomic##n##_compare_exchange_strong(volatile T* a, T* c, T v, int,   \
                                                            int) {                           \
    return __atomic_compare_exchange_n(a, c, v, false, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST);  \
  }                                                                                          \
  extern "C" int __tsan_atomic##n##_compare_exchange_weak(volatile T* a, T* c, T v, int,     \
                                                          int) {                             \
    return __atomic_compare_exchange_n(a, c, v, true, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST);   \
  }                                                                                          \
  extern "C" T __tsan_atomic##n##_compare_exchange_val(volatile T* a, T c, T v, int, int) {  \
    __atomic_compare_exchange_n(a, &c, v, false, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST);        \
    return c;                                                                                \
  }
OXIJAX_TSAN_ATOMIC(8, uint8_t)
OXIJAX_TSAN_ATOMIC(16, uint16_t)
OXIJAX_TSAN_ATOMIC(32, uint32_t)
OXIJAX_TSAN_ATOMIC(64, uint64_t)
#undef OXIJAX_TSAN_ATOMIC
