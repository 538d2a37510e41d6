// Where the input pixels of one filter tap lie for a run of consecutive output pixels:
// the geometry shared by conv2d's forward packing (an im2col row: a panel of output
// pixels for one channel and tap) and its filter gradient's (an im2col column: a vector
// of output pixels, the GEMM's K steps, for one channel and tap).
#pragma once

#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "gemm_microkernel.h"
#include "oxijax/shapes.h"

namespace oxijax::cpu::conv_detail {

// M * N * K of the convolution's implicit GEMM (output channels x C*R*S x N*P*Q), for
// gemm_amx.h's kMinTileProduct.
inline double gemm_product(const ConvShape& s) {
  return double(s.k) * double(s.c * s.r * s.s) * double(s.n * s.p * s.q);
}

// Lanes [a, b) of a vector of output pixels whose inputs through one tap lie inside the
// image: lane j reads plane[off + (j - a) * stride_w] of a channel's plane. `bits` has
// bits a .. b-1 set.
struct Run {
  int64_t off;
  int32_t a, b;
  uint32_t bits;
};

// Appends to `out` the runs of tap (r, t) for lanes [lane0, lane0 + len), which hold
// the output pixels pix0, pix0 + 1, ... (pixel = p * Q + q) of one image: the lanes
// split where they wrap to the next output row, clipped to the image. `image_off` is
// added to every offset. Returns how many runs it appended (at most len).
inline int tap_runs(const ConvShape& s, int64_t r, int64_t t, int64_t pix0, int lane0,
                    int64_t len, int64_t image_off, Run* out) {
  using gemm_detail::ceil_div;
  int n = 0;
  for (int64_t j = 0; j < len;) {
    const int64_t p = (pix0 + j) / s.q, q0 = (pix0 + j) % s.q;
    const int64_t seg = std::min(s.q - q0, len - j);
    const int64_t h = p * s.stride_h - s.pad_h + r;
    const int64_t w0 = q0 * s.stride_w - s.pad_w + t;  // input column of output column q0
    const int64_t lo = std::min(seg, w0 >= 0 ? 0 : ceil_div(-w0, s.stride_w));
    const int64_t hi = std::min(seg, w0 < s.w ? ceil_div(s.w - w0, s.stride_w) : 0);
    if (h >= 0 && h < s.h && lo < hi) {
      const int32_t a = int32_t(lane0 + j + lo), b = int32_t(lane0 + j + hi);
      const uint32_t bits = uint32_t((uint64_t{1} << b) - (uint64_t{1} << a));
      out[n++] = {image_off + h * s.w + w0 + lo * s.stride_w, a, b, bits};
    }
    j += seg;
  }
  return n;
}

// tap_runs for `len` lanes holding the consecutive columns col0, col0 + 1, ... of a
// group's images laid end to end (column n * P * Q + pixel), split where they pass from
// one image to the next; offsets count from the group's first image.
inline int tap_runs_across_images(const ConvShape& s, int64_t r, int64_t t, int64_t col0,
                                  int64_t len, Run* out) {
  const int64_t pq = s.p * s.q, image = s.c * s.h * s.w;
  int n = 0;
  for (int64_t j = 0; j < len;) {
    const int64_t pix = (col0 + j) % pq, seg = std::min(pq - pix, len - j);
    n += tap_runs(s, r, t, pix, int(j), seg, (col0 + j) / pq * image, out + n);
    j += seg;
  }
  return n;
}

// The address lane `lane` of a run would read, were the run to extend there (the runs'
// stride is 1 or 2): integer arithmetic, as it may lie outside the plane (masked loads
// never touch it).
template <int Stride = 1, typename T>
inline const T* lane_address(const T* plane, const Run& run, int lane) {
  return reinterpret_cast<const T*>(reinterpret_cast<std::intptr_t>(plane) +
                                    std::intptr_t(sizeof(T)) * (run.off + Stride * (lane - run.a)));
}

// A stride-2 run read as whole spans: the bits of the elements that lanes
// [first, first + lanes) of the run read from the 2 * lanes elements starting where lane
// `first` reads (lane j at element 2 (j - first)), the odd elements between two of its
// lanes included: those lie inside the same input row, and are dropped when the even
// elements are kept. The element after the run's last lane is not included (it may lie
// past the end of x). lanes <= 16.
inline uint32_t stride2_span_bits(const Run& run, int first, int lanes) {
  const int a = std::clamp(run.a - first, 0, lanes), b = std::clamp(run.b - first, 0, lanes);
  return a < b ? uint32_t((uint64_t{1} << (2 * b - 1)) - (uint64_t{1} << (2 * a))) : 0;
}

#if defined(OXIJAX_GEMM_X86_KERNEL)
// Float / double lanes [v L, v L + L) (L = one vector) read through runs of stride 1 or
// 2, zeros outside the runs: a masked load per run (two at stride 2, whose even elements
// are kept). RunLanes makes the masks once for many planes (every channel of a tap);
// load_run_lanes makes them as it loads (a single use).
template <int Stride, typename A>
class RunLoads {
 public:
  using S = gemm_detail::Simd<A>;
  using V = typename S::V;
  static constexpr int L = S::kLanes;
  static_assert(Stride == 1 || Stride == 2);

  // The mask of masked load h (h < Stride) of lanes [v L, v L + L) through `run`.
  static typename S::Mask mask(const Run& run, int v, int h) {
    constexpr uint32_t kAll = (uint32_t{1} << L) - 1;
    if constexpr (Stride == 1) return S::lanes((run.bits >> (v * L)) & kAll);
    else return S::lanes((stride2_span_bits(run, v * L, L) >> (h * L)) & kAll);
  }
  // Bytes from a plane to the element that a run's lane 0 would read.
  static std::intptr_t offset(const Run& run) {
    return std::intptr_t(sizeof(A)) * (run.off - Stride * run.a);
  }
  // Where load h of vector v starts: integer arithmetic, as it may lie outside the
  // plane (masked-off lanes are never touched).
  static const A* span(const A* plane, std::intptr_t offset, int v, int h) {
    return reinterpret_cast<const A*>(reinterpret_cast<std::intptr_t>(plane) + offset) +
           (Stride * v + h) * L;
  }
  // The lanes, from the parts the Stride loads filled.
  static V lanes(const V (&part)[Stride]) {
    if constexpr (Stride == 1) return part[0];
    else return S::even_lanes(part[0], part[1]);
  }
};

template <int Stride, typename A>
typename RunLoads<Stride, A>::V load_run_lanes(const A* plane, const Run* run, int count, int v) {
  using R = RunLoads<Stride, A>;
  typename R::V part[Stride];
  for (auto& p : part) p = R::S::zero();
  for (int i = 0; i < count; ++i)
    for (int h = 0; h < Stride; ++h)
      part[h] = R::S::mask_load(part[h], R::mask(run[i], v, h),
                                R::span(plane, R::offset(run[i]), v, h));
  return R::lanes(part);
}

template <typename A, int NV, int Stride>
class RunLanes {
  using R = RunLoads<Stride, A>;
  static constexpr int kMaxRuns = NV * R::L;  // one per lane

 public:
  RunLanes(const Run* run, int count) : count_(std::max(count, 2)) {
    // Two runs at least (a vector of output pixels mostly spans one or two output rows):
    // those loads are unconditional, a missing run's masks are empty.
    const Run none{0, 0, 0, 0};
    for (int i = 0; i < count_; ++i) {
      const Run& r = i < count ? run[i] : none;
      offset_[i] = R::offset(r);
      for (int v = 0; v < NV; ++v)
        for (int h = 0; h < Stride; ++h) mask_[i][v][h] = R::mask(r, v, h);
    }
  }

  // Lanes [v L, v L + L) of one plane.
  typename R::V load(const A* plane, int v) const {
    typename R::V part[Stride];
    for (int h = 0; h < Stride; ++h) {
      part[h] = R::S::maskz_load(mask_[0][v][h], R::span(plane, offset_[0], v, h));
      part[h] = R::S::mask_load(part[h], mask_[1][v][h], R::span(plane, offset_[1], v, h));
    }
    for (int i = 2; i < count_; ++i)
      for (int h = 0; h < Stride; ++h)
        part[h] = R::S::mask_load(part[h], mask_[i][v][h], R::span(plane, offset_[i], v, h));
    return R::lanes(part);
  }

 private:
  std::intptr_t offset_[kMaxRuns];
  typename R::S::Mask mask_[kMaxRuns][NV][Stride];
  int count_;
};
#endif

#if defined(__AVX512BW__) && defined(__AVX512VL__)
// The 16-bit elements (float16 / bfloat16 bits) that lanes [first, first + 16) read
// through the runs (stride 1 or 2) of one channel's plane, zeros outside the runs:
// one masked load per run; at stride 2 a 32-element load whose even elements
// VPMOVDW keeps.
template <typename T>
inline __m256i load_half_lanes(const T* plane, const Run* run, int count, int first,
                               int64_t stride_w) {
  if (stride_w == 1) {
    __m256i lanes = _mm256_setzero_si256();
    for (int i = 0; i < count; ++i)
      lanes = _mm256_mask_loadu_epi16(lanes, __mmask16(run[i].bits >> first),
                                      lane_address(plane, run[i], first));
    return lanes;
  }
  __m512i span = _mm512_setzero_si512();
  for (int i = 0; i < count; ++i)
    span = _mm512_mask_loadu_epi16(span, stride2_span_bits(run[i], first, 16),
                                   lane_address<2>(plane, run[i], first));
  return _mm512_cvtepi32_epi16(span);
}

// load_half_lanes widened to floats.
template <typename T>
inline __m512 load_half_lanes_as_float(const T* plane, const Run* run, int count, int first,
                                       int64_t stride_w) {
  const __m256i bits = load_half_lanes(plane, run, count, first, stride_w);
  if constexpr (std::is_same_v<T, bfloat16>)
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(bits), 16));
  else
    return _mm512_cvtph_ps(bits);
}
#endif

#if defined(__AVX2__) && !defined(__AVX512F__)
// AVX2 has no masked 16-bit loads. Blends into `out` the float lanes [first, first + 8)
// (those set in `lanes`, a Simd<float> mask) that one run of stride 1 or 2 reads from a
// plane of 16-bit T (kLoad8): one load of the run's whole span (8 or 16 elements) where
// it lies inside x, [lo, hi), widened; element by element where it crosses an end of x.
template <typename T>
inline __m256 blend_half_run8(__m256 out, const T* plane, const Run& run, int first,
                              int64_t stride_w, __m256i lanes, const T* lo, const T* hi) {
  const T* span = stride_w == 1 ? lane_address<1>(plane, run, first)
                                : lane_address<2>(plane, run, first);
  const std::intptr_t at = reinterpret_cast<std::intptr_t>(span);
  if (at >= reinterpret_cast<std::intptr_t>(lo) &&
      at + 8 * stride_w * std::intptr_t(sizeof(T)) <= reinterpret_cast<std::intptr_t>(hi)) {
    const __m256 all = stride_w == 1 ? gemm_detail::load8(span) : gemm_detail::load8_even(span);
    return _mm256_blendv_ps(out, all, _mm256_castsi256_ps(lanes));
  }
  alignas(32) float values[8];
  _mm256_store_ps(values, out);
  for (int j = std::max(run.a, first); j < std::min(run.b, first + 8); ++j)
    values[j - first] = load(plane[run.off + (j - run.a) * stride_w]);
  return _mm256_load_ps(values);
}

// Float lanes [first, first + 8) read through runs, zeros outside them.
template <typename T>
inline __m256 load_half_lanes8(const T* plane, const Run* run, int count, int first,
                               int64_t stride_w, const T* lo, const T* hi) {
  __m256 out = _mm256_setzero_ps();
  for (int i = 0; i < count; ++i) {
    const uint32_t bits = (run[i].bits >> first) & 0xffu;
    if (bits != 0)
      out = blend_half_run8(out, plane, run[i], first, stride_w,
                            gemm_detail::Simd<float>::lanes(bits), lo, hi);
  }
  return out;
}

// load_half_lanes8 of lanes [8 v, 8 v + 8), v < NV, for many planes through the same runs
// (every channel of a tap): the lane masks are made once.
template <typename T, int NV>
class HalfRunLanes8 {
  static constexpr int kMaxRuns = 8 * NV;  // one per lane

 public:
  // `run` must outlive the HalfRunLanes8.
  HalfRunLanes8(const Run* run, int count, int64_t stride_w, const T* lo, const T* hi)
      : run_(run), count_(count), stride_w_(stride_w), lo_(lo), hi_(hi) {
    for (int i = 0; i < count; ++i)
      for (int v = 0; v < NV; ++v) {
        const uint32_t bits = (run[i].bits >> (8 * v)) & 0xffu;
        live_[i][v] = bits != 0;
        mask_[i][v] = gemm_detail::Simd<float>::lanes(bits);
      }
  }

  __m256 load(const T* plane, int v) const {
    __m256 out = _mm256_setzero_ps();
    for (int i = 0; i < count_; ++i)
      if (live_[i][v])
        out = blend_half_run8(out, plane, run_[i], 8 * v, stride_w_, mask_[i][v], lo_, hi_);
    return out;
  }

 private:
  const Run* run_;
  int count_;
  int64_t stride_w_;
  const T *lo_, *hi_;
  bool live_[kMaxRuns][NV];
  __m256i mask_[kMaxRuns][NV];
};
#endif

#if defined(__AVX512BF16__)
// The 32 bfloat16 that lanes [0, 32) read through the runs (of one channel's plane) as
// the 16-bit lanes of a vector, zeros outside the runs.
inline __m512i gather_bf16_lanes(const bfloat16* plane, const Run* run, int count,
                                 int64_t stride_w) {
  if (stride_w == 1) {  // one masked load per run
    __m512i lanes = _mm512_setzero_si512();
    for (int i = 0; i < count; ++i)
      lanes = _mm512_mask_loadu_epi16(lanes, __mmask32(run[i].bits),
                                      lane_address(plane, run[i], 0));
    return lanes;
  }
  if (stride_w == 2)
    return _mm512_inserti64x4(
        _mm512_castsi256_si512(load_half_lanes(plane, run, count, 0, 2)),
        load_half_lanes(plane, run, count, 16, 2), 1);
  alignas(64) uint16_t lanes[32] = {};
  for (int i = 0; i < count; ++i)
    for (int j = run[i].a; j < run[i].b; ++j)
      lanes[j] = plane[run[i].off + (j - run[i].a) * stride_w].bits;
  return _mm512_load_si512(lanes);
}
#endif

}  // namespace oxijax::cpu::conv_detail
