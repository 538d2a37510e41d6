// Where the float32 gemm stands on this CPU, outside XLA: the probe for the gemm rows
// under 1.0 (docs/performance.md). scripts/cpu_check.sh builds it at each x86 level
// the CPU runs and calls it with several posed L2 sizes; by hand, e.g. at the avx2
// level's flags:
//   scripts/build_gemm_probe.sh gemm_probe -march=x86-64-v3 -mtune=generic
//   ./gemm_probe [threads]
// Prints, on one thread and on `threads` (default: the CPUs the process may use):
// 1. the FMA peak: 12 independent FMA chains on the level's vector registers (ymm, or
//    zmm where compiled for AVX-512), GFLOP/s, every thread running its own loop;
// 2. cpu::gemm<float> (the library's code at the same flags) on the benchmark's
//    shapes: 1024^3 into one output, the same into outputs taking turns over 64 MiB
//    (cold, as a buffer XLA has not used lately), and 8 x 256^3 with A transposed;
//    best and median GFLOP/s of 15 calls and the median's share of the peak.
// OXIJAX_PROBE_L2 and OXIJAX_PROBE_L3 (bytes) replace what sysconf reports of the
// caches, from which the gemm takes its blocking (cache_info.h): one machine then runs
// the blocking another machine's caches give it.
#ifndef _GNU_SOURCE
#define _GNU_SOURCE  // RTLD_NEXT
#endif
#include <dlfcn.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <thread>
#include <vector>

#include "backend/host_pool.h"
#include "cpu/cache_info.h"
#include "cpu/kernels.h"
#include "probe_cpus.h"

#if !defined(__x86_64__) || !defined(__FMA__)
#error "gemm_probe times x86 FMA code: build it at the avx2 level's flags or above"
#endif

// The cache sizes the gemm sees: the environment's where given, else the C library's.
extern "C" long sysconf(int name) {
  using Sysconf = long (*)(int);
  static const Sysconf real = reinterpret_cast<Sysconf>(dlsym(RTLD_NEXT, "sysconf"));
  const char* posed = name == _SC_LEVEL2_CACHE_SIZE   ? std::getenv("OXIJAX_PROBE_L2")
                      : name == _SC_LEVEL3_CACHE_SIZE ? std::getenv("OXIJAX_PROBE_L3")
                                                      : nullptr;
  return posed ? std::atol(posed) : real(name);
}

namespace {

using oxijax::GemmShape;
using oxijax::backend::HostPool;
using oxijax::cpu::Parallel;
using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

// 12 independent chains: more than two FMA ports x 4 cycles of latency need.
double fma_loop_gflops() {
  constexpr long kIterations = 100'000'000;
  long n = kIterations;
  const auto t0 = Clock::now();
#if defined(__AVX512F__)
#define OXIJAX_FMA(i) "vfmadd231ps %%zmm14, %%zmm15, %%zmm" #i "\n"
  constexpr int kLanes = 16;
#else
#define OXIJAX_FMA(i) "vfmadd231ps %%ymm14, %%ymm15, %%ymm" #i "\n"
  constexpr int kLanes = 8;
#endif
  asm volatile("1:\n" OXIJAX_FMA(0) OXIJAX_FMA(1) OXIJAX_FMA(2) OXIJAX_FMA(3) OXIJAX_FMA(4)
                   OXIJAX_FMA(5) OXIJAX_FMA(6) OXIJAX_FMA(7) OXIJAX_FMA(8) OXIJAX_FMA(9)
                       OXIJAX_FMA(10) OXIJAX_FMA(11) "dec %0\n jnz 1b\n"
               : "+r"(n)
               :
               : "xmm0", "xmm1", "xmm2", "xmm3", "xmm4", "xmm5", "xmm6", "xmm7", "xmm8",
                 "xmm9", "xmm10", "xmm11", "cc");
#undef OXIJAX_FMA
  return 2.0 * 12 * kLanes * kIterations / seconds_since(t0) / 1e9;
}

// Every thread runs the loop at once; their sum. Best of three.
double fma_peak(int threads) {
  double best = 0;
  for (int rep = 0; rep < 3; ++rep) {
    std::vector<double> each(threads);
    std::vector<std::thread> pool;
    for (int t = 0; t < threads; ++t) pool.emplace_back([&each, t] { each[t] = fma_loop_gflops(); });
    for (auto& t : pool) t.join();
    double sum = 0;
    for (double g : each) sum += g;
    best = std::max(best, sum);
  }
  return best;
}

struct Case {
  const char* name;
  GemmShape shape;
  int64_t outputs;  // output buffers taking turns
};

Case square(const char* name, int64_t size, int64_t outputs) {
  GemmShape s;
  s.m = s.n = s.k = size;
  return {name, s, outputs};
}

Case batched() {
  GemmShape s;
  s.m = s.n = s.k = 256;
  s.trans_a = true;
  s.batch_dims = {8};
  s.a_batch_strides = {256 * 256};
  s.b_batch_strides = {256 * 256};
  return {"8 x 256^3 T,N", s, 1};
}

// The largest error, relative to the largest magnitude, of some of the last call's output
// entries against float64 sums: a probe of wrong results would time nothing.
double max_error(const Case& c, const std::vector<float>& a, const std::vector<float>& b,
                 const std::vector<float>& out) {
  const GemmShape& s = c.shape;
  double error = 0, scale = 0;
  for (int64_t e = 0; e < 97; ++e) {
    const int64_t m = s.batch_count(), batch = e % m, i = (e * 389) % s.m, j = (e * 613) % s.n;
    const float* am = a.data() + batch * s.m * s.k;
    const float* bm = b.data() + batch * s.k * s.n;
    double exact = 0;
    for (int64_t k = 0; k < s.k; ++k)
      exact += double(s.trans_a ? am[k * s.m + i] : am[i * s.k + k]) * double(bm[k * s.n + j]);
    const int64_t last = (16 % c.outputs) * m * s.m * s.n;  // the 17th call's output
    error = std::max(error, std::abs(out[last + (batch * s.m + i) * s.n + j] - exact));
    scale = std::max(scale, std::abs(exact));
  }
  return error / std::max(scale, 1.0);
}

// Times 15 calls after 2 warm-ups; false if the results are wrong.
bool time_case(const Case& c, const Parallel& par, double peak) {
  const GemmShape& s = c.shape;
  const int64_t batch = s.batch_count();
  std::vector<float> a(batch * s.m * s.k), b(batch * s.k * s.n);
  for (size_t i = 0; i < a.size(); ++i) a[i] = float(i % 17) * 0.25f - 2.0f;
  for (size_t i = 0; i < b.size(); ++i) b[i] = float(i % 13) * 0.5f - 3.0f;
  const int64_t out_elems = batch * s.m * s.n;
  std::vector<float> out(out_elems * c.outputs);
  std::vector<double> gflops;
  for (int call = 0; call < 17; ++call) {
    float* o = out.data() + (call % c.outputs) * out_elems;
    const auto t0 = Clock::now();
    oxijax::cpu::gemm<float>(par, s, a.data(), b.data(), nullptr, o);
    const double t = seconds_since(t0);
    if (call >= 2) gflops.push_back(2.0 * batch * s.m * s.n * s.k / t / 1e9);  // 2 warm-ups
  }
  std::sort(gflops.begin(), gflops.end());
  const double median = gflops[gflops.size() / 2];
  std::printf("  %-32s best %7.1f  median %7.1f GFLOP/s  (%.0f %% of the FMA peak)\n", c.name,
              gflops.back(), median, 100.0 * median / peak);
  return max_error(c, a, b, out) <= 1e-5;
}

}  // namespace

int main(int argc, char** argv) {
  const probe::Cpus cpus(argc, argv, "gemm_probe");
  const oxijax::cpu::CacheSizes& caches = oxijax::cpu::cache_sizes();
  std::printf("the gemm's blocking from L2 %lld KiB, L3 %lld KiB; %d CPUs allowed\n",
              (long long)caches.l2 >> 10, (long long)caches.l3 >> 10, cpus.count);
  const std::vector<Case> cases = {square("1024^3", 1024, 1),
                                   square("1024^3 into cold outputs", 1024, 16), batched()};
  const int threads = cpus.threads;
  for (const int t : threads > 1 ? std::vector<int>{1, threads} : std::vector<int>{1}) {
    // One thread stays on one CPU; more may use every CPU allowed.
    if (t == 1) cpus.pin_to(0);
    else cpus.unpin();
    const double peak = fma_peak(t);
    std::printf("%d thread%s: FMA peak %.1f GFLOP/s\n", t, t > 1 ? "s" : "", peak);
    HostPool pool(t - 1);
    const Parallel par = pool.parallel();
    for (const Case& c : cases) {
      if (!time_case(c, par, peak)) {
        std::fprintf(stderr, "%s: wrong results\n", c.name);
        return 1;
      }
    }
  }
  return 0;
}
