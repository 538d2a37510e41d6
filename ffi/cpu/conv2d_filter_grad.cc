// conv2d's filter gradient as a GEMM whose operands are packed straight from dy and x:
//   dw[g] (K x C*R*S) = dy[g] (K x steps) @ im2col(x[g])^T (steps x C*R*S),
// where the contraction runs over the steps = N * P * Q output pixels of all images.
// A is dy, packed like any K-contiguous operand (register transposes of MR channel rows).
// B's columns are im2col rows (one channel c and tap (r, t) each): a panel's K steps are
// gathered L at a time, each column's L output pixels as one masked vector load from x
// per run (two at stride 2; conv2d_taps.h: the lanes of one output row inside the
// image, the same for every channel of a tap), then transposed in registers into the
// panel. No im2col matrix is written, and each B panel is multiplied while it is still
// in cache.
// Where the CPU has AVX512_BF16, bfloat16 is packed as pairs of consecutive steps
// (GemmPacked<T>: for VDPBF16PS, or AMX's tiles, dy then re-laid in tile order); an
// image of odd P * Q then ends with a zero step, so that no pair spans two images.
//
// Threads split the steps: each task sums its range into a private K x CRS partial, and
// the partials are added up at the end. When there are few steps and many columns,
// tasks split the columns too (with one range of steps, straight into dw).
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

constexpr double kMinTaskFlops = double(1 << 21);
// Bytes of all tasks' partial sums together, at most (unless one partial is larger):
// adding them up is a pass over all of them, kept a fraction of the product's work.
constexpr int64_t kPartialBytes = int64_t{8} << 20;

// Packed K steps gathered and transposed at a time: one float vector's lanes (with
// bfloat16 pairs, 32 steps as the 16-bit lanes of a vector).
#if defined(__AVX512F__)
constexpr int kLanes = 16;
#else
constexpr int kLanes = 8;
#endif

// col[l] = the input pixel that lane l's output pixel reads through the runs (of one
// channel's plane), 0 outside them, for l < kLanes; x is [lo, hi). Float and double
// take masked loads at stride 2 only where masks are cheap to make (AVX-512's mask
// registers): AVX2's mask vectors cost more per column than the copy lane by lane
// (11 % slower).
template <typename T, typename A>
inline void gather_column(A* col, const T* plane, const Run* run, int count, int64_t stride_w,
                          [[maybe_unused]] const T* lo, [[maybe_unused]] const T* hi) {
#if defined(__AVX512F__)
  [[maybe_unused]] const bool masked = stride_w == 1 || stride_w == 2;
#else
  [[maybe_unused]] const bool masked = stride_w == 1;
#endif
#if defined(OXIJAX_GEMM_X86_KERNEL)
  if constexpr (std::is_same_v<T, A>) {  // float, double: masked loads of T itself
    if (masked) {
      using S = Simd<A>;
      constexpr int V = S::kLanes, NV = kLanes / V;
#pragma GCC unroll 2
      for (int v = 0; v < NV; ++v)
        S::store(col + v * V, stride_w == 1 ? conv_detail::load_run_lanes<1>(plane, run, count, v)
                                            : conv_detail::load_run_lanes<2>(plane, run, count, v));
      return;
    }
  }
#endif
#if defined(__AVX512BW__) && defined(__AVX512VL__)
  if constexpr (sizeof(T) == 2) {  // half types: masked 16-bit loads, widened after
    if (masked) {
      _mm512_storeu_ps(col, conv_detail::load_half_lanes_as_float(plane, run, count, 0, stride_w));
      return;
    }
  }
#elif defined(__AVX2__)
  if constexpr (kLoad8<T>) {  // no masked 16-bit loads
    if (stride_w == 1 && count == 1 && run[0].bits == (uint32_t{1} << kLanes) - 1) {
      store8(col, load8(plane + run[0].off));  // one whole run
      return;
    }
    if constexpr (sizeof(T) == 2) {
      if (stride_w == 2) {  // whole spans inside x
        store8(col, conv_detail::load_half_lanes8(plane, run, count, 0, stride_w, lo, hi));
        return;
      }
    }
  }
#endif
  std::fill(col, col + kLanes, A(0));
  for (int i = 0; i < count; ++i) {
    const T* src = plane + run[i].off;
    if (stride_w == 1) {
      widen(col + run[i].a, src, run[i].b - run[i].a);
    } else {
      for (int l = run[i].a; l < run[i].b; ++l) col[l] = load(src[(l - run[i].a) * stride_w]);
    }
  }
}

#if defined(__AVX512BF16__)
// gather_column for bfloat16 pairs: the 2 * kLanes steps' values as 16-bit lanes, which
// are the kLanes pairs (step 2 l in the low half of pair l).
template <typename Pair, typename = std::enable_if_t<kPairs<Pair>>>
inline void gather_column(Pair* col, const bfloat16* plane, const Run* run, int count,
                          int64_t stride_w, const bfloat16*, const bfloat16*) {
  _mm512_storeu_si512(col, conv_detail::gather_bf16_lanes(plane, run, count, stride_w));
}
#endif

// d[l * NR + j] = tile[j * kLanes + l]: kLanes packed K steps of an NR-column panel from
// NR gathered columns.
template <int NR, typename P>
inline void transpose_tile(P* d, const P* tile) {
#if defined(__AVX512F__)
  if constexpr (sizeof(P) == 4) {  // float, or bfloat16 pairs: 32-bit words
    for (int j = 0; j < NR; j += 16)
      transpose_16(reinterpret_cast<float*>(d + j), NR, tile + j * kLanes, 4 * kLanes, 16);
    return;
  }
#elif defined(__AVX2__)
  if constexpr (std::is_same_v<P, float>) {
    for (int j = 0; j < NR; j += 8) transpose_8<8>(d + j, NR, tile + j * kLanes, kLanes);
    return;
  }
#endif
  for (int l = 0; l < kLanes; ++l)
    for (int j = 0; j < NR; ++j) d[l * NR + j] = tile[j * kLanes + l];
}

// One task's view of the problem (one group). Steps count output pixels, each image's
// rounded up to a whole packed element (spi); the K dimension counts packed elements.
// P: the packed element type (GemmPacked<T>, or Acc<T> for products too small for
// AMX's tiles).
template <typename T, typename P>
struct FilterGrad {
  using A = Acc<T>;
  static constexpr int MR = PanelShape<P>::kMR, NR = PanelShape<P>::kNR;
  // dy's packed element as pack_dy_rows writes it: for AMX, pair panels re-laid after.
  using Rows = std::conditional_t<kKGranule<P> == 1, P, BfPair>;
  static constexpr int64_t kSteps = kStepsPer<P>, kGroup = kLanes * kSteps;

  const ConvShape& s;
  const T* x;   // the group's images, [N, C, H, W]
  const T* dy;  // the group's output gradients, [N, K, P, Q]
  int64_t taps, hw, pq, spi, crs, mw;

  FilterGrad(const ConvShape& s_, const T* x_, const T* dy_)
      : s(s_), x(x_), dy(dy_), taps(s.r * s.s), hw(s.h * s.w), pq(s.p * s.q),
        spi(round_up(pq, kSteps)), crs(s.c * s.r * s.s), mw(round_up(s.k, MR)) {}

  // The packed elements of the group: N * spi / kSteps.
  int64_t length() const { return s.n * spi / kSteps; }

  // Packs `len` packed K steps of MR rows of dy from pixel pix of their image (rows
  // `ld` apart; rows past `valid` are zeros): d[kk * MR + ii] = row ii at step kk.
  void pack_dy_rows(A* d, const T* src, int64_t valid, int64_t len, int64_t) const {
    const int64_t kk0 = valid == MR ? transpose_steps<MR>(d, src, pq, len) : 0;
    for (int64_t ii = 0; ii < valid; ++ii)
      for (int64_t kk = kk0; kk < len; ++kk) d[kk * MR + ii] = load(src[ii * pq + kk]);
    for (int64_t ii = valid; ii < MR; ++ii)
      for (int64_t kk = 0; kk < len; ++kk) d[kk * MR + ii] = A(0);
  }
#if defined(__AVX512BF16__)
  void pack_dy_rows(BfPair* d, const bfloat16* src, int64_t valid, int64_t len,
                    int64_t pix) const {
    const int64_t whole = std::min(len, (pq - pix) / 2);  // pairs inside the image
    int64_t kk0 = 0;
    if (valid == MR)  // each pair is one 32-bit word of a row: transpose them
      for (; kk0 + 16 <= whole; kk0 += 16)
        for (int ii = 0; ii < MR; ii += 16)
          transpose_16(reinterpret_cast<float*>(d + kk0 * MR + ii), MR, src + ii * pq + 2 * kk0,
                       2 * pq, std::min(16, MR - ii));
    const auto value = [&](int64_t ii, int64_t step) -> uint32_t {
      return ii < valid && pix + step < pq ? src[ii * pq + step].bits : 0;
    };
    for (int64_t kk = kk0; kk < len; ++kk)
      for (int ii = 0; ii < MR; ++ii)
        d[kk * MR + ii].bits = value(ii, 2 * kk) | value(ii, 2 * kk + 1) << 16;
  }
#endif

  // Packs packed steps [k0, k0 + kc) of dy as MR-row panels (rows past K and steps past
  // `end` are zeros): a[i * kc + kk * MR + ii] = dy[k = i + ii, step k0 + kk].
  void pack_dy(Rows* a, int64_t k0, int64_t kc, int64_t end) const {
    const int64_t stop = std::min(end, k0 + kc);
    for (int64_t i = 0; i < mw; i += MR) {
      Rows* panel = a + i * kc;
      const int64_t valid = std::clamp<int64_t>(s.k - i, 0, MR);
      for (int64_t u = k0; u < stop;) {  // image by image
        const int64_t n = u * kSteps / spi, pix = u * kSteps % spi;
        const int64_t len = std::min((spi - pix) / kSteps, stop - u);
        pack_dy_rows(panel + (u - k0) * MR, dy + (n * s.k + i) * pq + pix, valid, len, pix);
        u += len;
      }
      std::fill(panel + (stop - k0) * MR, panel + kc * MR, Rows{});
    }
  }

  // The runs of every tap for each group of kGroup steps from packed step k0 (kc packed
  // steps, a multiple of kLanes): those of group u and tap `tap` are
  // runs[first[u * taps + tap]] up to runs[first[u * taps + tap + 1]].
  void find_runs(int64_t k0, int64_t kc, int64_t end, std::vector<Run>& runs,
                 std::vector<int32_t>& first) const {
    const int64_t groups = kc / kLanes, last = end * kSteps;
    first.resize(groups * taps + 1);
    int32_t count = 0;
    for (int64_t u = 0; u < groups; ++u) {
      const int64_t g0 = (k0 + u * kLanes) * kSteps;
      for (int64_t tap = 0; tap < taps; ++tap) {
        first[u * taps + tap] = count;
        for (int64_t l = 0; l < kGroup && g0 + l < last;) {  // image by image
          const int64_t step = g0 + l, n = step / spi, pix = step % spi;
          if (pix >= pq) {  // an odd image's padding step
            l += spi - pix;
            continue;
          }
          const int64_t len = std::min({pq - pix, kGroup - l, last - step});
          // Room for len more runs; the buffer grows to what the shape needs (a few runs
          // per group and tap), not to the worst case of one per lane.
          if (int64_t(runs.size()) < count + len) runs.resize(2 * (count + len));
          count += conv_detail::tap_runs(s, tap / s.s, tap % s.s, pix, int(l), len,
                                         n * s.c * hw, runs.data() + count);
          l += len;
        }
      }
    }
    first[groups * taps] = count;
  }

  // Packs the NR-column panel of im2col^T starting at column j0 over kc packed steps.
  void pack_x(P* b, int64_t j0, int64_t kc, const std::vector<Run>& runs,
              const std::vector<int32_t>& first) const {
    alignas(64) P tile[NR * kLanes];
    for (int64_t u = 0; u < kc / kLanes; ++u) {
      const int32_t* at = first.data() + u * taps;
      int64_t c = j0 / taps, tap = j0 % taps;
      for (int j = 0; j < NR; ++j) {
        P* col = tile + j * kLanes;
        if (c < s.c)
          gather_column(col, x + c * hw, runs.data() + at[tap], at[tap + 1] - at[tap],
                        s.stride_w, x, x + s.n * s.c * hw);
        else
          std::fill(col, col + kLanes, P{});
        if (++tap == taps) tap = 0, ++c;
      }
      transpose_tile<NR>(b + u * kLanes * NR, tile);
    }
  }

  // sum[k, j - c0] = the sum over packed steps [s0, s1) for columns j in [c0, c1)
  // (rows of sum ld apart).
  void run(A* sum, int64_t ld, int64_t s0, int64_t s1, int64_t c0, int64_t c1) const {
    // K blocks of equal depth (a multiple of kLanes; the last may be shorter).
    const int64_t blocks = ceil_div(s1 - s0, cache_blocks<P>().kc);
    const int64_t depth = round_up(ceil_div(s1 - s0, blocks), kLanes);
    Scratch<P> a(mw * depth), b(depth * NR);
    Scratch<Rows> rows(std::is_same_v<Rows, P> ? 0 : mw * depth);
    std::vector<Run> runs;
    std::vector<int32_t> first;
    [[maybe_unused]] const TileScope<P> tiles;
    for (int64_t k0 = s0; k0 < s1; k0 += depth) {
      const int64_t live = std::min(depth, s1 - k0), kc = round_up(live, kLanes);
      const bool first_block = k0 == s0;
      if constexpr (std::is_same_v<Rows, P>) {
        pack_dy(a.data(), k0, kc, s1);
      } else {
        pack_dy(rows.data(), k0, kc, s1);
        pairs_to_tile_order<MR>(a.data(), rows.data(), mw, kc);
      }
      find_runs(k0, kc, s1, runs, first);
      for (int64_t jp = c0; jp < c1; jp += NR) {
        pack_x(b.data(), jp, kc, runs, first);
        const int nr = int(std::min<int64_t>(NR, c1 - jp));
        // The live steps (padding is zeros), or whole tiles.
        const int64_t steps = kKGranule<P> == 1 ? live : kc;
        for (int64_t ir = 0; ir < s.k; ir += MR) {
          A* dst = sum + ir * ld + (jp - c0);
          micro_kernel<P>(steps, a.data() + ir * kc, b.data(), dst, ld, first_block ? nullptr : dst,
                          ld, A(1), first_block ? A(0) : A(1),
                          int(std::min<int64_t>(MR, s.k - ir)), nr);
        }
      }
    }
  }
};

template <typename P, typename T>
void backward_filter_packed_as(const Parallel& par, const ConvShape& s, const T* x,
                               const T* dy, T* dw) {
  using A = Acc<T>;
  constexpr int NR = PanelShape<P>::kNR;
  const int64_t pq = s.p * s.q, crs = s.c * s.r * s.s, size = s.k * crs;
  if (s.groups * size == 0) return;
  if (s.n * pq == 0) {
    par.for_range(s.groups * size, int64_t{1} << 16, [&](int64_t begin, int64_t end) {
      for (int64_t e = begin; e < end; ++e) dw[e] = store<T>(A(0));
    });
    return;
  }
  // Tasks: ranges of steps (each with its own partial sum) times ranges of column panels.
  const int64_t panels = ceil_div(crs, NR);
  const double flops = 2.0 * double(s.k) * double(crs) * double(s.n * pq);
  const int64_t steps = FilterGrad<T, P>(s, x, dy).length();  // packed K steps
  const int64_t want = std::clamp<int64_t>(int64_t(flops / kMinTaskFlops), 1, 2 * par.threads());
  const int64_t partials_fit = kPartialBytes / (size * int64_t(sizeof(A)));
  const int64_t step_chunk =
      round_up(ceil_div(steps, std::clamp<int64_t>(std::min(want, partials_fit), 1, steps)),
               kLanes);
  const int64_t step_tasks = ceil_div(steps, step_chunk);  // none is empty
  const int64_t col_tasks = std::min(panels, ceil_div(want, step_tasks));
  const int64_t panel_chunk = ceil_div(panels, col_tasks), chunk_cols = panel_chunk * NR;
  // One range of steps: each task sums its columns straight into dw (float32 / 64) or
  // into a small float slice of its own, rounded into dw.
  if (step_tasks == 1) {
    for (int64_t g = 0; g < s.groups; ++g) {
      const FilterGrad<T, P> problem(s, x + g * s.n * s.c * s.h * s.w, dy + g * s.n * s.k * pq);
      T* out = dw + g * size;
      par.for_range(col_tasks, 1, [&](int64_t begin, int64_t end) {
        for (int64_t ct = begin; ct < end; ++ct) {
          const int64_t c0 = ct * chunk_cols, c1 = std::min(crs, c0 + chunk_cols);
          if constexpr (std::is_same_v<T, A>) {
            problem.run(out + c0, crs, 0, steps, c0, c1);
          } else {
            Scratch<A> slice(s.k * (c1 - c0));
            problem.run(slice.data(), c1 - c0, 0, steps, c0, c1);
            for (int64_t k = 0; k < s.k; ++k)
              for (int64_t j = c0; j < c1; ++j)
                out[k * crs + j] = store<T>(slice.data()[k * (c1 - c0) + j - c0]);
          }
        }
      });
    }
    return;
  }
  Scratch<A> partials(step_tasks * size);
  for (int64_t g = 0; g < s.groups; ++g) {
    const FilterGrad<T, P> problem(s, x + g * s.n * s.c * s.h * s.w, dy + g * s.n * s.k * pq);
    par.for_range(step_tasks * col_tasks, 1, [&](int64_t begin, int64_t end) {
      for (int64_t u = begin; u < end; ++u) {
        const int64_t st = u / col_tasks, c0 = u % col_tasks * chunk_cols;
        problem.run(partials.data() + st * size + c0, crs, st * step_chunk,
                    std::min(steps, (st + 1) * step_chunk), c0, std::min(crs, c0 + chunk_cols));
      }
    });
    T* out = dw + g * size;
    par.for_range(size, int64_t{1} << 14, [&](int64_t begin, int64_t end) {
      for (int64_t e = begin; e < end; ++e) {
        A sum = partials.data()[e];
        for (int64_t t = 1; t < step_tasks; ++t) sum += partials.data()[t * size + e];
        out[e] = store<T>(sum);
      }
    });
  }
}

}  // namespace

template <typename T>
void conv2d_backward_filter(const Parallel& par, const ConvShape& s, const T* x, const T* dy,
                            T* dw) {
  if constexpr (kOnTiles<T>) {  // tiles pay for their set-up from kMinTileProduct on
    if (conv_detail::gemm_product(s) < kMinTileProduct)
      return backward_filter_packed_as<Acc<T>>(par, s, x, dy, dw);
  }
  backward_filter_packed_as<GemmPacked<T>>(par, s, x, dy, dw);
}

#define OXIJAX_INSTANTIATE(T)                                                          \
  template void conv2d_backward_filter<T>(const Parallel&, const ConvShape&, const T*, \
                                          const T*, T*);
OXIJAX_FOR_EACH_DTYPE(OXIJAX_INSTANTIATE)
#undef OXIJAX_INSTANTIATE

}  // namespace oxijax::cpu
