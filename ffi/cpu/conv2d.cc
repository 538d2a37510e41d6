// conv2d as an implicit GEMM on the engine of gemm_microkernel.h: per group g,
// out[g] (K x N*P*Q) = w[g] (K x C*R*S) @ im2col(x[g]) (C*R*S x N*P*Q), the images'
// columns laid end to end. The weights are packed once per group and shared by all
// tasks; each task owns a range of output columns and packs just that slice of the
// im2col matrix straight from x, so no full im2col buffer ever exists. A slice may
// span images, so that small images (7x7, 14x14) fill whole register tiles; such a
// slice is computed into a staging buffer and copied to its images' outputs. Where the CPU has
// AVX512_BF16, bfloat16 is packed as pairs of consecutive im2col rows for VDPBF16PS or
// AMX's tiles, like gemm's operands (GemmPacked<T>; a product too small for the tiles,
// gemm_amx.h's kMinTileProduct, on float FMAs); else it is widened to float.
#include <algorithm>
#include <cstdint>
#include <type_traits>
#include <vector>

#include "conv2d_taps.h"
#include "gemm_amx.h"
#include "kernels.h"

namespace oxijax::cpu {
namespace {

using namespace gemm_detail;
using conv_detail::Run;
using conv_detail::tap_runs_across_images;

constexpr double kMinTaskFlops = double(1 << 21);
// Elements of a task's packed im2col slice (C*R*S x columns): about half of L2.
constexpr int64_t kSliceElements = int64_t{1} << 17;

#if defined(OXIJAX_GEMM_X86_KERNEL)
// Float / double with stride_w 1 or 2: one filter tap's rows for every channel are a
// masked load per run and vector (two at stride 2), with the masks made once for the
// tap (conv_detail::RunLanes). On AVX2 float16 / bfloat16 too, as plain loads of the
// runs' spans where they lie inside the image, [lo, hi) (conv_detail::HalfRunLanes8).
template <typename T>
inline constexpr bool kTapCopy = std::is_same_v<T, float> || std::is_same_v<T, double>
#if !defined(__AVX512F__)
                                 || (sizeof(T) == 2 && kLoad8<T>)
#endif
    ;

template <int NR, int Stride, typename T, typename A>
void copy_tap(A* d, int64_t d_step, const T* channel, int64_t hw, int64_t channels,
              const Run* run, int count, [[maybe_unused]] const T* lo,
              [[maybe_unused]] const T* hi) {
  constexpr int L = Simd<A>::kLanes, NV = NR / L;
  const auto lanes = [&] {
    if constexpr (std::is_same_v<T, A>) return conv_detail::RunLanes<A, NV, Stride>(run, count);
#if !defined(__AVX512F__)
    else return conv_detail::HalfRunLanes8<T, NV>(run, count, Stride, lo, hi);
#endif
  }();
  for (int64_t c = 0; c < channels; ++c, channel += hw, d += d_step) {
#pragma GCC unroll 4
    for (int v = 0; v < NV; ++v) Simd<A>::store(d + v * L, lanes.load(channel, v));
  }
}
#else
template <typename T> inline constexpr bool kTapCopy = false;
template <int NR, int Stride, typename T, typename A>
void copy_tap(A*, int64_t, const T*, int64_t, int64_t, const Run*, int, const T*, const T*) {}
#endif

// The runs of every filter tap (r, t) over `len` panel columns from column col0 of a
// group's images: counts[tap] of them at runs + tap * NR.
template <int NR>
void panel_runs(const ConvShape& s, int64_t col0, int64_t len, Run* runs, int* counts) {
  for (int64_t tap = 0; tap < s.r * s.s; ++tap)
    counts[tap] = tap_runs_across_images(s, tap / s.s, tap % s.s, col0, len, runs + tap * NR);
}

// Packs columns [j0, j0 + cols) of the im2col matrix of one group's images (x: N x C x
// H x W, columns n * P * Q + pixel) as NR column panels over all K blocks, zero padding
// the panels past `cols`. `runs` and `counts` have room for R * S * NR and R * S entries.
template <int NR, typename T, typename A>
void pack_im2col(A* dst, int64_t width, const T* x, const ConvShape& s, int64_t j0,
                 int64_t cols, const KBlocks& kb, Run* runs, int* counts) {
  const int64_t taps = s.r * s.s, hw = s.h * s.w;
  [[maybe_unused]] const bool fast = kTapCopy<T> && (s.stride_w == 1 || s.stride_w == 2);
  for (int64_t jp = 0; jp < width; jp += NR) {
    panel_runs<NR>(s, j0 + jp, std::min(cols, jp + NR) - jp, runs, counts);
    for (int64_t b = 0; b < kb.count; ++b) {
      const int64_t k0 = kb.begin(b), kc = kb.depth(b);
      A* d = dst + k0 * width + jp * kc;
      if constexpr (kTapCopy<T>) {
        if (fast) {
          // Tap by tap: rows k = c * taps + tap of this block, for every channel c.
          for (int64_t tap = 0; tap < taps; ++tap) {
            const int64_t c0 = k0 <= tap ? 0 : ceil_div(k0 - tap, taps);
            const int64_t c1 = k0 + kc <= tap ? 0 : (k0 + kc - 1 - tap) / taps + 1;
            if (c1 <= c0) continue;
            A* rows = d + (c0 * taps + tap - k0) * NR;
            const auto copy = s.stride_w == 1 ? copy_tap<NR, 1, T, A> : copy_tap<NR, 2, T, A>;
            copy(rows, taps * NR, x + c0 * hw, hw, c1 - c0, runs + tap * NR, counts[tap], x,
                 x + s.n * s.c * hw);
          }
          continue;
        }
      }
      int64_t c = k0 / taps, tap = k0 % taps;  // row k0 of im2col is channel c, tap `tap`
      for (int64_t kk = 0; kk < kc; ++kk, d += NR) {
        const Run* run = runs + tap * NR;
        const int n = counts[tap];
        const T* channel = x + c * hw;
        if (++tap == taps) tap = 0, ++c;
#if defined(__AVX512BW__) && defined(__AVX512VL__)
        if constexpr (sizeof(T) == 2) {  // half types: masked 16-bit loads, widened after
          if (s.stride_w <= 2) {
            for (int v = 0; v < NR; v += 16)
              _mm512_storeu_ps(d + v, conv_detail::load_half_lanes_as_float(channel, run, n, v,
                                                                            s.stride_w));
            continue;
          }
        }
#endif
        for (int j = 0; j < NR; ++j) d[j] = A(0);
        for (int i = 0; i < n; ++i) {
          const T* src = channel + run[i].off;
          if (s.stride_w == 1) {
            widen(d + run[i].a, src, run[i].b - run[i].a);
          } else {
            for (int j = run[i].a; j < run[i].b; ++j)
              d[j] = load(src[(j - run[i].a) * s.stride_w]);
          }
        }
      }
    }
  }
}

#if defined(__AVX512BF16__)
// pack_im2col as bfloat16 pairs (kb counts pairs): pair kk of column j holds rows 2 kk
// and 2 kk + 1 of the im2col matrix (zeros past its last row), as VDPBF16PS and AMX's
// tiles of B take them (Pair: BfPair or AmxPair).
template <int NR, typename Pair, typename = std::enable_if_t<kPairs<Pair>>>
void pack_im2col(Pair* dst, int64_t width, const bfloat16* x, const ConvShape& s,
                 int64_t j0, int64_t cols, const KBlocks& kb, Run* runs, int* counts) {
  static_assert(NR == 32, "one 16-bit lane per column of a 512-bit vector");
  const int64_t taps = s.r * s.s, hw = s.h * s.w, rows = s.c * taps;
  const auto row = [&](int64_t k) {
    if (k >= rows) return _mm512_setzero_si512();
    const int64_t tap = k % taps;
    return conv_detail::gather_bf16_lanes(x + k / taps * hw, runs + tap * NR, counts[tap],
                                          s.stride_w);
  };
  // Sixteen pairs: the 32-bit lanes lo | hi << 16 of two rows' 16-bit lanes.
  const auto interleave = [](__m256i lo, __m256i hi) {
    return _mm512_or_si512(_mm512_cvtepu16_epi32(lo),
                           _mm512_slli_epi32(_mm512_cvtepu16_epi32(hi), 16));
  };
  for (int64_t jp = 0; jp < width; jp += NR) {
    panel_runs<NR>(s, j0 + jp, std::min(cols, jp + NR) - jp, runs, counts);
    for (int64_t b = 0; b < kb.count; ++b) {
      const int64_t p0 = kb.begin(b), kc = kb.depth(b);
      Pair* d = dst + p0 * width + jp * kc;
      for (int64_t pp = 0; pp < kc; ++pp, d += NR) {
        const __m512i lo = row(2 * (p0 + pp)), hi = row(2 * (p0 + pp) + 1);
        _mm512_storeu_si512(d, interleave(_mm512_castsi512_si256(lo), _mm512_castsi512_si256(hi)));
        _mm512_storeu_si512(d + 16, interleave(_mm512_extracti64x4_epi64(lo, 1),
                                               _mm512_extracti64x4_epi64(hi, 1)));
      }
    }
  }
}
#endif

// conv2d with operands packed as P (GemmPacked<T>, or Acc<T> for products too small
// for AMX's tiles).
template <typename P, typename T>
void conv2d_packed_as(const Parallel& par, const ConvShape& s, const T* x, const T* w,
                      T* out) {
  using A = Acc<T>;
  constexpr int MR = PanelShape<P>::kMR, NR = PanelShape<P>::kNR;
  const int64_t cols = s.p * s.q, kd = s.c * s.r * s.s, m = s.k;
  const int64_t images = s.groups * s.n;
  if (images == 0 || m == 0 || cols == 0) return;
  if (kd == 0) {
    par.for_range(images * m * cols, int64_t{1} << 16, [&](int64_t begin, int64_t end) {
      for (int64_t i = begin; i < end; ++i) out[i] = store<T>(A(0));
    });
    return;
  }
  const int64_t kp = packed_depth<P>(kd);  // packed K steps
  const KBlocks kb(kp, cache_blocks<P>().kc, kKGranule<P>);
  const int64_t mw = round_up(m, MR), hw = s.h * s.w;

  // Groups whose packed weights fit the budget are done together.
  const int64_t group_step =
      std::clamp<int64_t>(cache_blocks<P>().pack / (mw * kp), 1, s.groups);

  // Output columns per task: a slice of about kSliceElements of a group's N * P * Q, or
  // less when that would leave threads without work.
  const int64_t group_cols = s.n * cols, col_tiles = ceil_div(group_cols, NR);
  int64_t slice_tiles = std::clamp<int64_t>(kSliceElements / (kp * NR), 1, col_tiles);
  const int64_t want = 4 * par.threads();
  if (group_step * ceil_div(col_tiles, slice_tiles) < want)
    slice_tiles = ceil_div(col_tiles, ceil_div(want, group_step));
  const int64_t slices = ceil_div(col_tiles, slice_tiles), slice = slice_tiles * NR;
  const double slice_flops = 2.0 * double(m) * double(kd) * double(slice);
  const bool may_span = s.n > 1 && cols % slice != 0;

  Scratch<P> wpack(group_step * mw * kp);
  for (int64_t g0 = 0; g0 < s.groups; g0 += group_step) {
    const int64_t gn = std::min(group_step, s.groups - g0);
    par.for_range(gn, ceil_div(int64_t{1} << 15, mw * kp), [&](int64_t begin, int64_t end) {
      for (int64_t g = begin; g < end; ++g) {
        P* dst = wpack.data() + g * mw * kp;
        const T* src = w + (g0 + g) * m * kd;
        pack_a_panels<MR>(dst, mw, src, kd, 1, m, 0, mw, kb, kd);
      }
    });
    par.for_range(gn * slices, int64_t(kMinTaskFlops / slice_flops) + 1,
                  [&](int64_t begin, int64_t end) {
      Scratch<P> bpack(kp * slice);
      std::vector<Run> runs(s.r * s.s * NR);
      std::vector<int> counts(s.r * s.s);
      Scratch<A> scratch(std::is_same_v<T, A> ? 0 : cache_blocks<P>().mc * slice);
      Scratch<T> staged(may_span ? m * slice : 0);  // a slice that spans images
      for (int64_t u = begin; u < end; ++u) {
        const int64_t g = g0 + u / slices, j0 = u % slices * slice;
        const int64_t nc = std::min(slice, group_cols - j0), width = round_up(nc, NR);
        pack_im2col<NR>(bpack.data(), width, x + g * s.n * s.c * hw, s, j0, nc, kb, runs.data(),
                        counts.data());
        T* group_out = out + g * s.n * m * cols;
        const int64_t first = j0 / cols, last = (j0 + nc - 1) / cols;  // images
        const bool spans = first != last;
        const Target<T> t{spans ? staged.data() : group_out + first * m * cols + j0 % cols,
                          nullptr, spans ? nc : cols, A(1), A(0)};
        compute_region<T, P>(wpack.data() + (g - g0) * mw * kp, mw, bpack.data(), width, kb, 0,
                             m, 0, nc, t, scratch.data());
        if (!spans) continue;
        for (int64_t j = j0; j < j0 + nc;) {  // image by image
          const int64_t pix = j % cols, len = std::min(cols - pix, j0 + nc - j);
          for (int64_t k = 0; k < m; ++k)
            std::copy_n(staged.data() + k * nc + (j - j0), len,
                        group_out + (j / cols * m + k) * cols + pix);
          j += len;
        }
      }
    });
  }
}

}  // namespace

template <typename T>
void conv2d(const Parallel& par, const ConvShape& s, const T* x, const T* w, T* out) {
  if constexpr (kOnTiles<T>) {  // tiles pay for their set-up from kMinTileProduct on
    if (conv_detail::gemm_product(s) < kMinTileProduct)
      return conv2d_packed_as<Acc<T>>(par, s, x, w, out);
  }
  conv2d_packed_as<GemmPacked<T>>(par, s, x, w, out);
}

#define OXIJAX_INSTANTIATE(T) \
  template void conv2d<T>(const Parallel&, const ConvShape&, const T*, const T*, T*);
OXIJAX_FOR_EACH_DTYPE(OXIJAX_INSTANTIATE)
#undef OXIJAX_INSTANTIATE

}  // namespace oxijax::cpu
