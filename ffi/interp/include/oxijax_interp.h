// The CUDA interpreter's device side: what nvcc gives a .cu file (the execution-space
// keywords, threadIdx and friends, barriers, warp intrinsics, atomics, device math) for
// the host C++ compiler, plus the models of ffi/cuda/ptx.h's instructions and the launch
// that runs a kernel's blocks, each CUDA thread a fiber (ffi/interp/runtime.cc).
//
// The kernels' own loads and stores are checked through the compiler's ThreadSanitizer
// instrumentation, served by the interpreter's runtime (ffi/interp/checks.cc) instead of
// libtsan: bounds of every global and shared access, shared-memory races between the
// threads of a block within a barrier interval, reads of uninitialised memory, misaligned
// vector accesses.
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <tuple>
#include <type_traits>
#include <utility>

#include "cuda_runtime_api.h"

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline __attribute__((always_inline))
#define __noinline__  // (libstdc++ spells the attribute __attribute__((__noinline__)))
#define __launch_bounds__(...)
#define __align__(n) __attribute__((aligned(n)))
#define __restrict__ __restrict

namespace oxijax::interp {

// ------------------------------------------------------------------ built-in variables
uint3 thread_idx();
uint3 block_idx();
dim3 block_dim();
dim3 grid_dim();

// ------------------------------------------------------------------ synchronisation
void sync_threads();                  // __syncthreads: bar.sync 0 over the block
void sync_warp(unsigned mask);        // __syncwarp
[[noreturn]] void trap(const char* what);

// Warp shuffles and votes on 32-bit or 64-bit values (PTX ISA "shfl.sync", "vote.sync").
enum class Shuffle { kIndex, kUp, kDown, kXor };
uint64_t shuffle(unsigned mask, uint64_t value, int bytes, Shuffle mode, int lane_arg,
                 int width);
unsigned vote_ballot(unsigned mask, bool predicate);

template <typename T>
T shuffle_as(unsigned mask, T value, Shuffle mode, int lane_arg, int width) {
  static_assert(sizeof(T) == 4 || sizeof(T) == 8, "shuffles move 32-bit or 64-bit values");
  uint64_t bits = 0;
  std::memcpy(&bits, &value, sizeof(T));
  bits = shuffle(mask, bits, int(sizeof(T)), mode, lane_arg, width);
  T out;
  std::memcpy(&out, &bits, sizeof(T));
  return out;
}

// ------------------------------------------------------------------ atomics
// Read-modify-write of `bytes` at addr, checked like any access; returns the old bits.
enum class AtomicOp { kAdd, kMax, kMin, kExch, kCas };
uint64_t atomic_rmw(void* addr, int bytes, AtomicOp op, bool floating, bool is_signed,
                    uint64_t operand, uint64_t compare);

template <typename T>
T atomic_as(T* addr, AtomicOp op, T value, T compare = T()) {
  uint64_t v = 0, c = 0;
  std::memcpy(&v, &value, sizeof(T));
  std::memcpy(&c, &compare, sizeof(T));
  const uint64_t old = atomic_rmw(addr, int(sizeof(T)), op, std::is_floating_point_v<T>,
                                  std::is_signed_v<T>, v, c);
  T out;
  std::memcpy(&out, &old, sizeof(T));
  return out;
}

// ------------------------------------------------------------------ shared memory
// The block's instance of a static __shared__ variable declared at `site` (one per
// declaration and template instantiation), and the dynamic shared memory.
void* shared_variable_bytes(const void* site, const char* name, size_t bytes, size_t align);
unsigned char* dynamic_shared(size_t align);
template <typename T, size_t kAlign>
T& shared_variable(const void* site, const char* name) {
  constexpr size_t align = kAlign > alignof(T) ? kAlign : alignof(T);
  return *static_cast<T*>(shared_variable_bytes(site, name, sizeof(T), align));
}
uint32_t shared_address(const void* p);  // cvta.to.shared

// ------------------------------------------------------------------ ptx.h's instructions
// Models of the PTX ISA's semantics, in ffi/interp/ptx.cc (sections cited there).
void cp_async(uint32_t dst, const void* src, int bytes, int src_bytes);
void cp_async_commit();
void cp_async_wait(int pending);
void ldmatrix_x4(uint32_t (&r)[4], uint32_t addr, bool trans);
void mma_m16n8k16(float (&d)[4], const uint32_t (&a)[4], const uint32_t (&b)[2], bool bf16);
void mma_m16n8k8_tf32(float (&d)[4], const uint32_t (&a)[4], const uint32_t (&b)[2]);
void mma_m8n8k4_f64(double (&d)[2], double a, double b);
uint32_t cvt_rna_tf32(float x);
uint32_t cvt_rn_pack(float lo, float hi, bool bf16);
float ex2_approx_ftz(float x);
void st_shared_v4(uint32_t addr, uint32_t w0, uint32_t w1, uint32_t w2, uint32_t w3);

// ------------------------------------------------------------------ launch
// One launch: checks the configuration as the hardware does, then runs every block
// (block and thread order from the schedule, see interp::Schedule) on the calling host
// thread and returns its status; a failed check stops the kernel and leaves a report.
using KernelBody = void (*)(const void* closure);
cudaError_t launch_erased(const void* kernel, dim3 grid, dim3 block, size_t shared_bytes, KernelBody body, const void* closure,
                          const void* params, size_t params_bytes);

template <typename Kernel, typename Tuple, size_t... I>
__attribute__((no_sanitize_thread)) void call_kernel(Kernel kernel, const Tuple& params,
                                                     std::index_sequence<I...>) {
  kernel(std::get<I>(params)...);  // each CUDA thread gets its own copy of the parameters
}

template <typename... Params>
struct LaunchClosure {
  void (*kernel)(Params...);
  std::tuple<std::decay_t<Params>...> params;
  __attribute__((no_sanitize_thread)) static void run(const void* self) {
    const auto& c = *static_cast<const LaunchClosure*>(self);
    call_kernel(c.kernel, c.params, std::index_sequence_for<Params...>{});
  }
};

template <typename... Params, typename... Args>
cudaError_t launch(void (*kernel)(Params...), dim3 grid, dim3 block, size_t shared_bytes,
                   cudaStream_t /*stream: launches run in order, at once*/, Args&&... args) {
  const LaunchClosure<Params...> closure{kernel, {std::forward<Args>(args)...}};
  return launch_erased(reinterpret_cast<const void*>(kernel), grid, block, shared_bytes, &LaunchClosure<Params...>::run, &closure, &closure,
                       sizeof closure);
}

}  // namespace oxijax::interp

#define threadIdx (::oxijax::interp::thread_idx())
#define blockIdx (::oxijax::interp::block_idx())
#define blockDim (::oxijax::interp::block_dim())
#define gridDim (::oxijax::interp::grid_dim())
constexpr int warpSize = 32;

inline void __syncthreads() { ::oxijax::interp::sync_threads(); }
inline void __syncwarp(unsigned mask = 0xffffffffu) { ::oxijax::interp::sync_warp(mask); }
[[noreturn]] inline void __trap() { ::oxijax::interp::trap("__trap()"); }

template <typename T>
T __shfl_sync(unsigned mask, T v, int lane, int width = 32) {
  return ::oxijax::interp::shuffle_as(mask, v, ::oxijax::interp::Shuffle::kIndex, lane, width);
}
template <typename T>
T __shfl_up_sync(unsigned mask, T v, unsigned delta, int width = 32) {
  return ::oxijax::interp::shuffle_as(mask, v, ::oxijax::interp::Shuffle::kUp, int(delta), width);
}
template <typename T>
T __shfl_down_sync(unsigned mask, T v, unsigned delta, int width = 32) {
  return ::oxijax::interp::shuffle_as(mask, v, ::oxijax::interp::Shuffle::kDown, int(delta),
                                      width);
}
template <typename T>
T __shfl_xor_sync(unsigned mask, T v, int lane_mask, int width = 32) {
  return ::oxijax::interp::shuffle_as(mask, v, ::oxijax::interp::Shuffle::kXor, lane_mask, width);
}
inline unsigned __ballot_sync(unsigned mask, int p) {
  return ::oxijax::interp::vote_ballot(mask, p != 0);
}
inline int __any_sync(unsigned mask, int p) {
  return ::oxijax::interp::vote_ballot(mask, p != 0) != 0;
}
inline int __all_sync(unsigned mask, int p) {
  return ::oxijax::interp::vote_ballot(mask, p != 0) == mask;
}

template <typename T>
T atomicAdd(T* addr, T v) {
  return ::oxijax::interp::atomic_as(addr, ::oxijax::interp::AtomicOp::kAdd, v);
}
template <typename T>
T atomicMax(T* addr, T v) {
  return ::oxijax::interp::atomic_as(addr, ::oxijax::interp::AtomicOp::kMax, v);
}
template <typename T>
T atomicMin(T* addr, T v) {
  return ::oxijax::interp::atomic_as(addr, ::oxijax::interp::AtomicOp::kMin, v);
}
template <typename T>
T atomicExch(T* addr, T v) {
  return ::oxijax::interp::atomic_as(addr, ::oxijax::interp::AtomicOp::kExch, v);
}
template <typename T>
T atomicCAS(T* addr, T compare, T v) {
  return ::oxijax::interp::atomic_as(addr, ::oxijax::interp::AtomicOp::kCas, v, compare);
}

// Device math and bit casts (the CUDA Math API's host-computable subset).
inline float __uint_as_float(unsigned u) { float f; std::memcpy(&f, &u, 4); return f; }
inline unsigned __float_as_uint(float f) { unsigned u; std::memcpy(&u, &f, 4); return u; }
inline float __int_as_float(int u) { float f; std::memcpy(&f, &u, 4); return f; }
inline int __float_as_int(float f) { int u; std::memcpy(&u, &f, 4); return u; }
inline double __longlong_as_double(long long u) { double f; std::memcpy(&f, &u, 8); return f; }
inline long long __double_as_longlong(double f) { long long u; std::memcpy(&u, &f, 8); return u; }
inline unsigned __umulhi(unsigned a, unsigned b) { return unsigned((uint64_t(a) * b) >> 32); }
inline unsigned long long __umul64hi(unsigned long long a, unsigned long long b) {
  return (unsigned long long)((unsigned __int128)a * b >> 64);
}
template <typename T>
T __ldg(const T* p) { return *p; }
inline float rsqrtf(float x) { return 1.0f / std::sqrt(x); }
inline double rsqrt(double x) { return 1.0 / std::sqrt(x); }
inline float __expf(float x) { return std::exp(x); }
inline float __logf(float x) { return std::log(x); }
inline float __fdividef(float a, float b) { return a / b; }
inline float exp2f_approx(float x) { return std::exp2(x); }
inline int min(int a, int b) { return a < b ? a : b; }
inline int max(int a, int b) { return a > b ? a : b; }
inline unsigned min(unsigned a, unsigned b) { return a < b ? a : b; }
inline unsigned max(unsigned a, unsigned b) { return a > b ? a : b; }
inline long long min(long long a, long long b) { return a < b ? a : b; }
inline long long max(long long a, long long b) { return a > b ? a : b; }
inline long min(long a, long b) { return a < b ? a : b; }
inline long max(long a, long b) { return a > b ? a : b; }
inline float min(float a, float b) { return std::fmin(a, b); }
inline float max(float a, float b) { return std::fmax(a, b); }
inline double min(double a, double b) { return std::fmin(a, b); }
inline double max(double a, double b) { return std::fmax(a, b); }
using std::exp;
using std::exp2;
using std::fabs;
using std::fma;
using std::fmax;
using std::fmin;
using std::log;
using std::sqrt;
using std::tanh;
