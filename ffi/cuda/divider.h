// Division by a run-time divisor that many threads share, as a multiply-high and a shift
// (a 64-bit integer division is a long instruction sequence on the GPU). The divisor's
// magic numbers are computed once on the host and travel in the kernel parameters.
#pragma once

#include <cstdint>

namespace oxijax::cuda {

// n / d for n < 2^(bits - 1) and 1 <= d < 2^(bits - 1) by a multiply-high and a shift
// (the round-up method of Granlund & Montgomery, as in PyTorch's IntDivider):
// s = ceil(log2 d), m = floor(2^bits * (2^s - d) / d) + 1, n / d = (mulhi(n, m) + n) >> s.
// mulhi(n, m) < n, so the sum does not overflow.
template <typename I> struct Divider;

template <> struct Divider<uint32_t> {
  uint32_t d = 1, m = 1, s = 0;
  static Divider make(uint32_t d) {
    Divider r;
    r.d = d;
    while ((uint64_t{1} << r.s) < d) ++r.s;
    r.m = static_cast<uint32_t>(((uint64_t{1} << 32) * ((uint64_t{1} << r.s) - d)) / d + 1);
    return r;
  }
  __host__ __device__ __forceinline__ uint32_t div(uint32_t n) const {
#if defined(__CUDA_ARCH__)
    const uint32_t hi = __umulhi(n, m);
#else
    const uint32_t hi = static_cast<uint32_t>((uint64_t{n} * m) >> 32);
#endif
    return (hi + n) >> s;
  }
};

template <> struct Divider<uint64_t> {
  uint64_t d = 1, m = 1;
  uint32_t s = 0;
  static Divider make(uint64_t d) {
    using U128 = unsigned __int128;
    Divider r;
    r.d = d;
    while ((U128{1} << r.s) < d) ++r.s;
    r.m = static_cast<uint64_t>(((U128{1} << 64) * ((U128{1} << r.s) - d)) / d + 1);
    return r;
  }
  __host__ __device__ __forceinline__ uint64_t div(uint64_t n) const {
#if defined(__CUDA_ARCH__)
    const uint64_t hi = __umul64hi(n, m);
#else
    const uint64_t hi = static_cast<uint64_t>((static_cast<unsigned __int128>(n) * m) >> 64);
#endif
    return (hi + n) >> s;
  }
};

// n / d and n % d of a non-negative index.
struct QuotientRemainder {
  int64_t quot, rem;
};
__host__ __device__ __forceinline__ QuotientRemainder divmod(const Divider<uint64_t>& d,
                                                             int64_t n) {
  const uint64_t q = d.div(static_cast<uint64_t>(n));
  return {static_cast<int64_t>(q), n - static_cast<int64_t>(q * d.d)};
}

// The divider of d, of at least 1 (a dimension of size 0 is never divided by).
inline Divider<uint64_t> divider_of(int64_t d) {
  return Divider<uint64_t>::make(static_cast<uint64_t>(d > 1 ? d : 1));
}

}  // namespace oxijax::cuda
