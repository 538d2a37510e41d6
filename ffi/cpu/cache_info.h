// The running machine's data cache sizes, read once, for the cache blocking of the gemm
// engine (gemm_microkernel.h) and the order in which reduce.cc reads rows. Kernels must
// not probe the CPU themselves (the ISA dispatcher does that), so this asks the C
// library: glibc's sysconf answers from cpuid on x86 and with 0 where it does not know
// (aarch64, some VMs); other C libraries lack the _SC_LEVEL* names. Unknown sizes get
// typical values.
#pragma once

#include <algorithm>
#include <cstdint>

#include <unistd.h>

namespace oxijax::cpu {

struct CacheSizes {
  int64_t l2;  // bytes of one core's L2
  int64_t l3;  // bytes of the L3 a core shares with its neighbours
};

namespace cache_detail {

// Typical sizes where the C library cannot tell.
inline constexpr CacheSizes kFallback{int64_t{512} << 10, int64_t{8} << 20};
// sysconf reports the whole package's L3 on some CPUs (AMD EPYC: every core complex's,
// while a core only caches in its own complex's, at most 32 MiB so far).
inline constexpr int64_t kMaxL3 = int64_t{32} << 20;

inline int64_t sysconf_or(int name, int64_t fallback) {
  const long value = sysconf(name);
  return value > 0 ? int64_t{value} : fallback;
}

}  // namespace cache_detail

inline const CacheSizes& cache_sizes() {
  static const CacheSizes sizes = [] {
    using namespace cache_detail;
    CacheSizes s = kFallback;
#if defined(_SC_LEVEL2_CACHE_SIZE) && defined(_SC_LEVEL3_CACHE_SIZE)
    s.l2 = sysconf_or(_SC_LEVEL2_CACHE_SIZE, s.l2);
    s.l3 = sysconf_or(_SC_LEVEL3_CACHE_SIZE, s.l3);
#endif
    // Keep nonsense out of the blocking: an L3 is no smaller than the L2 it backs.
    s.l3 = std::max(std::min(s.l3, kMaxL3), s.l2);
    return s;
  }();
  return sizes;
}

}  // namespace oxijax::cpu
