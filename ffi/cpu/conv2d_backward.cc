// conv2d's data gradient, in the accumulator type A = Acc<T> (half types are widened
// once, so every sum runs in float32; the filter gradient is conv2d_filter_grad.cc):
//  - data, stride 1: a forward conv2d of dy with the filter flipped in space and its
//            channel axes swapped, padded by R - 1 - pad (the fast implicit-GEMM kernel);
//  - data, otherwise: GEMMs on cpu::gemm, a chunk of images at a time so that the column
//            matrices stay within kColumnBudget elements: dcol[i] (CRS x PQ) =
//            w^T (CRS x K) @ dy[i] (K x PQ), then col2im adds each column entry back onto
//            the input pixel it was read from;
// Padding and stride gaps are skipped (rows outside the image, columns outside
// inside_columns), so pixels no window reads get 0.
#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "gemm_microkernel.h"
#include "kernels.h"

namespace oxijax::cpu {
namespace {

constexpr int64_t kColumnBudget = int64_t{1} << 21;  // elements of A per column matrix
constexpr int64_t kGrain = int64_t{1} << 15;

// Images per chunk: as many as the budget allows, at least one.
int64_t chunk_images(const ConvShape& s) {
  return std::clamp<int64_t>(kColumnBudget / std::max<int64_t>(1, s.c * s.r * s.s * s.p * s.q), 1,
                             s.n);
}

// Output columns q whose input column q * stride_w - pad_w + t, for filter column t,
// lies inside the image: [lo, hi).
struct Columns {
  int64_t lo, hi;
};
Columns inside_columns(const ConvShape& s, int64_t t) {
  const int64_t first = s.pad_w - t;
  const int64_t lo =
      std::clamp<int64_t>(first > 0 ? (first + s.stride_w - 1) / s.stride_w : 0, 0, s.q);
  const int64_t last = s.w - 1 + s.pad_w - t;
  return {lo, std::clamp<int64_t>(last >= 0 ? last / s.stride_w + 1 : 0, lo, s.q)};
}

// dst[2 q] += src[q] for q in [lo, hi), with whole vectors from lo up to the returned q:
// eight values interleaved with zeros make sixteen consecutive addends, so the stride-2
// scatter is two plain vector additions (adding +0 leaves every sum as it was). The
// vectors stay below dst[2 hi - 1], inside the row that the caller's range covers.
template <typename A>
int64_t add_stride2([[maybe_unused]] A* dst, [[maybe_unused]] const A* src, int64_t lo,
                    [[maybe_unused]] int64_t hi) {
  int64_t q = lo;
#if defined(__AVX2__)
  if constexpr (std::is_same_v<A, float>) {
    const __m256 zero = _mm256_setzero_ps();
    for (; q + 8 < hi; q += 8) {  // the last odd lane, 2 q + 15, stays below 2 hi - 1
      const __m256 v = _mm256_loadu_ps(src + q);
      const __m256 even_lo = _mm256_unpacklo_ps(v, zero), even_hi = _mm256_unpackhi_ps(v, zero);
      float* d = dst + 2 * q;
      _mm256_storeu_ps(d, _mm256_add_ps(_mm256_loadu_ps(d),
                                         _mm256_permute2f128_ps(even_lo, even_hi, 0x20)));
      _mm256_storeu_ps(d + 8, _mm256_add_ps(_mm256_loadu_ps(d + 8),
                                             _mm256_permute2f128_ps(even_lo, even_hi, 0x31)));
    }
  }
#endif
  return q;
}

// col2im: adds every entry of one image plane's rows of the column matrix (row r * S + t,
// column p * Q + q: what output (p, q) reads through tap (r, t); rows `ld` elements
// apart) onto the input pixel it was read from.
template <typename A>
void col2im_rows(const ConvShape& s, const A* rows, int64_t ld, A* __restrict plane) {
  for (int64_t r = 0; r < s.r; ++r)
    for (int64_t t = 0; t < s.s; ++t) {
      const A* __restrict row = rows + (r * s.s + t) * ld;
      const Columns in = inside_columns(s, t);
      for (int64_t p = 0; p < s.p; ++p, row += s.q) {
        const int64_t h = p * s.stride_h - s.pad_h + r;
        if (h < 0 || h >= s.h) continue;
        A* dst = plane + h * s.w - s.pad_w + t;
        if (s.stride_w == 1) {
          for (int64_t q = in.lo; q < in.hi; ++q) dst[q] += row[q];
        } else if (s.stride_w == 2) {
          for (int64_t q = add_stride2(dst, row, in.lo, in.hi); q < in.hi; ++q)
            dst[2 * q] += row[q];
        } else {
          for (int64_t q = in.lo; q < in.hi; ++q) dst[q * s.stride_w] += row[q];
        }
      }
    }
}

// dst[i] = load(src[i]) for n elements, in parallel.
template <typename T, typename A>
void widen(const Parallel& par, const T* src, A* dst, int64_t n) {
  par.for_range(n, kGrain, [&](int64_t begin, int64_t end) {
    gemm_detail::widen(dst + begin, src + begin, end - begin);
  });
}

GemmShape plain_gemm(int64_t m, int64_t n, int64_t k, bool trans_a, bool trans_b, double beta) {
  GemmShape g;
  g.m = m, g.n = n, g.k = k, g.trans_a = trans_a, g.trans_b = trans_b, g.beta = beta;
  return g;
}

template <typename T>
void fill_zero(const Parallel& par, T* out, int64_t n) {
  par.for_range(n, int64_t{1} << 16, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) out[i] = store<T>(Acc<T>(0));
  });
}

// Stride 1: dx[c, h, w] = sum_{k, r, t} dy[k, h + pad_h - r, w + pad_w - t] w[k, c, r, t],
// a forward cross-correlation of dy (K channels, P x Q) with w'[c, k, R-1-r, S-1-t] and
// padding R-1-pad_h, S-1-pad_w, whose output is H x W.
template <typename T>
void backward_data_as_forward(const Parallel& par, const ConvShape& s, const T* dy,
                              const T* w, T* dx) {
  const int64_t rs = s.r * s.s;
  Scratch<T> flipped(s.groups * s.c * s.k * rs);
  par.for_range(s.groups * s.c * s.k, std::max<int64_t>(1, kGrain / rs),
                [&](int64_t begin, int64_t end) {
    for (int64_t u = begin; u < end; ++u) {  // u = (g, c, k) of the flipped filter
      const int64_t g = u / (s.c * s.k), c = u / s.k % s.c, k = u % s.k;
      const T* src = w + ((g * s.k + k) * s.c + c) * rs;
      T* dst = flipped.data() + u * rs;
      for (int64_t e = 0; e < rs; ++e) dst[e] = src[rs - 1 - e];
    }
  });
  ConvShape f = s;
  f.c = s.k, f.h = s.p, f.w = s.q, f.k = s.c, f.p = s.h, f.q = s.w;
  f.pad_h = s.r - 1 - s.pad_h, f.pad_w = s.s - 1 - s.pad_w;
  conv2d<T>(par, f, dy, flipped.data(), dx);
}

}  // namespace

template <typename T>
void conv2d_backward_data(const Parallel& par, const ConvShape& s, const T* dy, const T* w,
                          T* dx) {
  using A = Acc<T>;
  constexpr bool kSame = std::is_same_v<T, A>;
  const int64_t hw = s.h * s.w, pq = s.p * s.q, crs = s.c * s.r * s.s, rs = s.r * s.s;
  if (s.groups * s.n * s.c * hw == 0) return;
  if (s.k * crs * pq == 0) return fill_zero(par, dx, s.groups * s.n * s.c * hw);
  if (s.stride_h == 1 && s.stride_w == 1 && s.pad_h < s.r && s.pad_w < s.s)
    return backward_data_as_forward(par, s, dy, w, dx);
  const int64_t nb = chunk_images(s);
  Scratch<A> wide_w(kSame ? 0 : s.k * crs), wide_dy(kSame ? 0 : nb * s.k * pq);
  Scratch<A> dcol(nb * crs * pq);
  for (int64_t g = 0; g < s.groups; ++g) {
    const A* wg = reinterpret_cast<const A*>(w + g * s.k * crs);
    if constexpr (!kSame) widen(par, w + g * s.k * crs, wide_w.data(), s.k * crs), wg = wide_w.data();
    for (int64_t i0 = 0; i0 < s.n; i0 += nb) {
      const int64_t count = std::min(nb, s.n - i0), image0 = g * s.n + i0;
      const A* dyc = reinterpret_cast<const A*>(dy + image0 * s.k * pq);
      if constexpr (!kSame)
        widen(par, dy + image0 * s.k * pq, wide_dy.data(), count * s.k * pq), dyc = wide_dy.data();
      GemmShape gs = plain_gemm(crs, pq, s.k, /*trans_a=*/true, false, 0.0);
      gs.batch_dims = {count};
      gs.a_batch_strides = {0};
      gs.b_batch_strides = {s.k * pq};
      gemm<A>(par, gs, wg, dyc, nullptr, dcol.data());
      // col2im, one input plane (image, channel) per task.
      par.for_range(count * s.c, std::max<int64_t>(1, kGrain / (rs * pq)),
                    [&](int64_t begin, int64_t end) {
        Scratch<A> local(kSame ? 0 : hw);
        for (int64_t u = begin; u < end; ++u) {
          const int64_t i = u / s.c, c = u % s.c;
          T* plane = dx + ((image0 + i) * s.c + c) * hw;
          A* acc = kSame ? reinterpret_cast<A*>(plane) : local.data();
          std::fill(acc, acc + hw, A(0));
          const A* col = dcol.data() + (i * crs + c * rs) * pq;
          col2im_rows(s, col, pq, acc);
          if constexpr (!kSame)
            for (int64_t e = 0; e < hw; ++e) plane[e] = store<T>(acc[e]);
        }
      });
    }
  }
}

#define OXIJAX_INSTANTIATE(T)                                                                  \
  template void conv2d_backward_data<T>(const Parallel&, const ConvShape&, const T*, const T*, \
                                        T*);
OXIJAX_FOR_EACH_DTYPE(OXIJAX_INSTANTIATE)
#undef OXIJAX_INSTANTIATE

}  // namespace oxijax::cpu
