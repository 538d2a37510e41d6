// Division by a run-time divisor that many threads share, as a multiply-high and a shift
// (a 64-bit integer division is a long instruction sequence on the GPU). The divisor's
// magic numbers are computed once on the host and travel in the kernel parameters.
#pragma once

#include <cstdint>
#include <type_traits>

namespace oxijax::cuda {

// The high half of a * b.
__host__ __device__ __forceinline__ uint32_t mulhi(uint32_t a, uint32_t b) {
#if defined(__CUDA_ARCH__)
  return __umulhi(a, b);
#else
  return static_cast<uint32_t>((uint64_t{a} * b) >> 32);
#endif
}
__host__ __device__ __forceinline__ uint64_t mulhi(uint64_t a, uint64_t b) {
#if defined(__CUDA_ARCH__)
  return __umul64hi(a, b);
#else
  return static_cast<uint64_t>((static_cast<unsigned __int128>(a) * b) >> 64);
#endif
}

// n / d for n < 2^(bits - 1) and 1 <= d < 2^(bits - 1) (I: uint32_t or uint64_t) by a
// multiply-high and a shift (the round-up method of Granlund & Montgomery, as in
// PyTorch's IntDivider): s = ceil(log2 d), m = floor(2^bits * (2^s - d) / d) + 1,
// n / d = (mulhi(n, m) + n) >> s. mulhi(n, m) < n, so the sum does not overflow.
template <typename I>
struct Divider {
  static_assert(std::is_same_v<I, uint32_t> || std::is_same_v<I, uint64_t>);
  I d = 1, m = 1;
  uint32_t s = 0;
  static Divider make(I d) {
    // Twice I's width, for the host-side computation of m.
    using Wide = std::conditional_t<std::is_same_v<I, uint32_t>, uint64_t, unsigned __int128>;
    constexpr int kBits = 8 * sizeof(I);
    Divider r;
    r.d = d;
    while ((Wide{1} << r.s) < d) ++r.s;
    r.m = static_cast<I>(((Wide{1} << kBits) * ((Wide{1} << r.s) - d)) / d + 1);
    return r;
  }
  __host__ __device__ __forceinline__ I div(I n) const { return (mulhi(n, m) + n) >> s; }
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
