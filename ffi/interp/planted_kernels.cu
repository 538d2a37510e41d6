// Small kernels with planted bugs, each beside its correct twin, that show the CUDA
// interpreter's checks catching what they claim to (tests/test_cuda_interpreter.py).
// Compiled only into the interpreter's module. Each case launches on interpreted device
// memory and returns the launch status, the report and the output.
#include <cuda_runtime.h>

#include <cstdint>
#include <cstring>
#include <stdexcept>
#include <string>
#include <vector>

#include "device.h"
#include "launch.h"
#include "memory.h"
#include "oxijax/numeric.h"
#include "planted.h"
#include "ptx.h"

namespace oxijax::interp {
namespace {

using cuda::launch;
namespace ptx = cuda::ptx;

constexpr int kThreads = 128;

// out[i] = in[(i + 1) % n] staged through shared memory (cleared first); without the
// second barrier a thread may read its neighbour's slot before the neighbour's write.
template <bool kBarrier>
__global__ void rotate_kernel(const float* in, float* out) {
  OXIJAX_SHARED(float, tile, [kThreads], 16);
  const int i = threadIdx.x;
  tile[i] = 0.0f;
  __syncthreads();
  tile[i] = in[i];
  if (kBarrier) __syncthreads();
  out[i] = tile[(i + 1) % kThreads];
}

// Writes n + kOverrun elements of a buffer of n.
template <int kOverrun>
__global__ void fill_kernel(float* out, int n) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n + kOverrun) out[i] = float(i);
}

// Reads a shared slot nobody wrote (kBug) or the one the thread wrote.
template <bool kBug>
__global__ void uninitialized_kernel(float* out) {
  OXIJAX_SHARED(float, tile, [2 * kThreads], 16);
  const int i = threadIdx.x;
  tile[i] = float(i);
  __syncthreads();
  out[i] = tile[kBug ? kThreads + i : i];
}

// Overruns a static shared array by one element.
template <int kOverrun>
__global__ void shared_overrun_kernel(float* out) {
  OXIJAX_SHARED(float, tile, [kThreads], 16);
  const int i = threadIdx.x;
  tile[i] = 1.0f;
  __syncthreads();
  if (i == 0) out[0] = tile[kThreads - 1 + kOverrun];
}

// cp.async of 16 bytes to a shared address 8 bytes off its alignment (kOffset 8).
template <int kOffset>
__global__ void cp_async_kernel(const float* in, float* out) {
  OXIJAX_SHARED(float, tile, [8 * kThreads], 16);
  const int i = threadIdx.x;
  ptx::cp_async<16>(ptx::shared_address(tile + 4 * i) + kOffset, in + 4 * i, 16);
  ptx::cp_async_commit();
  ptx::cp_async_wait<0>();
  __syncthreads();
  out[i] = tile[(4 * i + 4) % (4 * kThreads)];
}

// Reads cp.async's destination before waiting for it (kWait false).
template <bool kWait>
__global__ void cp_async_wait_kernel(const float* in, float* out) {
  OXIJAX_SHARED(float, tile, [4 * kThreads], 16);
  const int i = threadIdx.x;
  ptx::cp_async<16>(ptx::shared_address(tile + 4 * i), in + 4 * i, 16);
  ptx::cp_async_commit();
  if (kWait) ptx::cp_async_wait<0>();
  out[i] = tile[4 * i];
}

// One warp: D (16 x 8) = A (16 x 16) * B (16 x 8) with ldmatrix and mma.sync m16n8k16
// (float16). A is row-major, B is given as B^T (8 x 16, row-major), D row-major float.
// kSwap swaps the A fragment's registers 1 and 2: a wrong fragment index.
template <bool kSwap>
__global__ void mma_kernel(const uint16_t* a, const uint16_t* bt, float* d) {
  OXIJAX_SHARED(uint16_t, sa, [16 * 16], 16);
  OXIJAX_SHARED(uint16_t, sb, [8 * 16], 16);
  const int lane = threadIdx.x;
  for (int e = lane; e < 16 * 16; e += 32) sa[e] = a[e];
  for (int e = lane; e < 8 * 16; e += 32) sb[e] = bt[e];
  __syncwarp();
  uint32_t af[4], bf4[4];
  // A: matrices (rows 0-7 | 8-15) x (cols 0-7 | 8-15) -> a0..a3 (lanes 0-15 rows at col 0,
  // lanes 16-31 the same rows at col 8).
  ptx::ldmatrix_x4(af, ptx::shared_address(sa + (lane & 15) * 16 + (lane >> 4) * 8));
  // B^T rows are B's columns: matrices (k 0-7) and (k 8-15) of n 0-7 give b0, b1.
  ptx::ldmatrix_x4(bf4, ptx::shared_address(sb + (lane & 7) * 16 + ((lane >> 3) & 1) * 8));
  if (kSwap) {
    const uint32_t t = af[1];
    af[1] = af[2];
    af[2] = t;
  }
  float acc[4] = {0.f, 0.f, 0.f, 0.f};
  const uint32_t bf[2] = {bf4[0], bf4[1]};
  ptx::mma_m16n8k16<false>(acc, af, bf);
  const int g = lane >> 2, t = lane & 3;
  d[g * 8 + 2 * t] = acc[0];
  d[g * 8 + 2 * t + 1] = acc[1];
  d[(g + 8) * 8 + 2 * t] = acc[2];
  d[(g + 8) * 8 + 2 * t + 1] = acc[3];
}

// Lanes 16-31 skip a warp-wide mma (kDiverge): undefined on the GPU, a report here.
template <bool kDiverge>
__global__ void divergent_kernel(float* out) {
  const int lane = threadIdx.x;
  float acc[4] = {0.f, 0.f, 0.f, 0.f};
  const uint32_t a[4] = {0x3c003c00u, 0, 0, 0}, b[2] = {0x3c003c00u, 0};
  if (!kDiverge || lane < 16) ptx::mma_m16n8k16<false>(acc, a, b);
  out[lane] = acc[0];
}

// Loads a float4 from an address 4 bytes past 16-byte alignment (kOffset 1).
template <int kOffset>
__global__ void misaligned_vector_kernel(const float* in, float* out) {
  const int i = threadIdx.x;
  const float4 v = *reinterpret_cast<const float4*>(in + 4 * i + kOffset);
  out[i] = v.x + v.y + v.z + v.w;
}

struct Memory {
  std::vector<void*> blocks;
  ~Memory() {
    for (void* p : blocks) device_free(p);
  }
  template <typename T>
  T* alloc(size_t n, std::string label) {
    void* p = device_alloc(n * sizeof(T), std::move(label));
    blocks.push_back(p);
    return static_cast<T*>(p);
  }
  template <typename T>
  T* upload(const std::vector<T>& host, std::string label) {
    T* p = alloc<T>(host.size(), std::move(label));
    std::memcpy(p, host.data(), host.size() * sizeof(T));
    std::string why;
    host_access(p, host.size() * sizeof(T), true, false, why);  // marks it written
    return p;
  }
};

std::vector<float> iota(int n) {
  std::vector<float> v(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) v[size_t(i)] = float(i);
  return v;
}

template <typename T>
std::vector<double> download(const T* p, size_t n) {
  std::vector<double> out(n);
  for (size_t i = 0; i < n; ++i) out[i] = double(p[i]);
  return out;
}

PlantedResult finish(cudaError_t status, std::vector<double> output) {
  PlantedResult r;
  r.status = cudaGetErrorName(status);
  if (status != cudaSuccess) {
    const std::vector<std::string> reports = take_reports();
    r.report = reports.empty() ? "" : reports.back();
  }
  cudaGetLastError();
  r.output = std::move(output);
  return r;
}

template <bool kCorrect>
PlantedResult barrier_case() {
  Memory m;
  const float* in = m.upload(iota(kThreads), "in");
  float* out = m.alloc<float>(kThreads, "out");
  const cudaError_t s = launch(&rotate_kernel<kCorrect>, 1, kThreads, 0, nullptr, in, out);
  return finish(s, s == cudaSuccess ? download(out, kThreads) : std::vector<double>{});
}

template <int kOverrun>
PlantedResult out_of_bounds_case() {
  Memory m;
  float* out = m.alloc<float>(1000, "out");
  const cudaError_t s = launch(&fill_kernel<kOverrun>, 8, kThreads, 0, nullptr, out, 1000);
  return finish(s, {});
}

template <bool kBug>
PlantedResult uninitialized_case() {
  Memory m;
  float* out = m.alloc<float>(kThreads, "out");
  return finish(launch(&uninitialized_kernel<kBug>, 1, kThreads, 0, nullptr, out), {});
}

template <int kOverrun>
PlantedResult shared_overrun_case() {
  Memory m;
  float* out = m.alloc<float>(1, "out");
  return finish(launch(&shared_overrun_kernel<kOverrun>, 1, kThreads, 0, nullptr, out), {});
}

template <int kOffset>
PlantedResult cp_async_case() {
  Memory m;
  const float* in = m.upload(iota(4 * kThreads), "in");
  float* out = m.alloc<float>(kThreads, "out");
  return finish(launch(&cp_async_kernel<kOffset>, 1, kThreads, 0, nullptr, in, out), {});
}

template <bool kWait>
PlantedResult cp_async_wait_case() {
  Memory m;
  const float* in = m.upload(iota(4 * kThreads), "in");
  float* out = m.alloc<float>(kThreads, "out");
  return finish(launch(&cp_async_wait_kernel<kWait>, 1, kThreads, 0, nullptr, in, out), {});
}

// A[i][k] = (i + 2k) % 7 - 3 and B[k][j] = (3k + j) % 5 - 2 (exact in float16); the test
// recomputes D from the same formulas.
template <bool kSwap>
PlantedResult fragment_case() {
  Memory m;
  std::vector<uint16_t> a(16 * 16), bt(8 * 16);
  for (int i = 0; i < 16; ++i)
    for (int k = 0; k < 16; ++k) a[size_t(i * 16 + k)] = float_to_half(float((i + 2 * k) % 7 - 3));
  for (int j = 0; j < 8; ++j)
    for (int k = 0; k < 16; ++k)
      bt[size_t(j * 16 + k)] = float_to_half(float((3 * k + j) % 5 - 2));
  const uint16_t* da = m.upload(a, "a");
  const uint16_t* db = m.upload(bt, "b");
  float* d = m.alloc<float>(16 * 8, "d");
  const cudaError_t s = launch(&mma_kernel<kSwap>, 1, 32, 0, nullptr, da, db, d);
  return finish(s, s == cudaSuccess ? download(d, 16 * 8) : std::vector<double>{});
}

template <bool kDiverge>
PlantedResult divergent_case() {
  Memory m;
  float* out = m.alloc<float>(32, "out");
  return finish(launch(&divergent_kernel<kDiverge>, 1, 32, 0, nullptr, out), {});
}

template <int kOffset>
PlantedResult misaligned_vector_case() {
  Memory m;
  const float* in = m.upload(iota(4 * kThreads + 4), "in");
  float* out = m.alloc<float>(kThreads, "out");
  return finish(launch(&misaligned_vector_kernel<kOffset>, 1, kThreads, 0, nullptr, in, out), {});
}

}  // namespace

std::vector<std::string> planted_cases() {
  return {"barrier",        "out_of_bounds",    "uninitialized",   "shared_out_of_bounds",
          "misaligned_cp_async", "cp_async_wait", "fragment",     "divergent_mma",
          "misaligned_vector"};
}

PlantedResult run_planted(const std::string& name, bool buggy) {
  if (name == "barrier") return buggy ? barrier_case<false>() : barrier_case<true>();
  if (name == "out_of_bounds") return buggy ? out_of_bounds_case<1>() : out_of_bounds_case<0>();
  if (name == "uninitialized") return buggy ? uninitialized_case<true>() : uninitialized_case<false>();
  if (name == "shared_out_of_bounds")
    return buggy ? shared_overrun_case<1>() : shared_overrun_case<0>();
  if (name == "misaligned_cp_async") return buggy ? cp_async_case<8>() : cp_async_case<0>();
  if (name == "cp_async_wait") return buggy ? cp_async_wait_case<false>() : cp_async_wait_case<true>();
  if (name == "fragment") return buggy ? fragment_case<true>() : fragment_case<false>();
  if (name == "divergent_mma") return buggy ? divergent_case<true>() : divergent_case<false>();
  if (name == "misaligned_vector")
    return buggy ? misaligned_vector_case<1>() : misaligned_vector_case<0>();
  throw std::invalid_argument("no planted case named " + name);
}

}  // namespace oxijax::interp
