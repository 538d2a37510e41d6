// gemm: out = alpha * op(a) @ op(b) + beta * c for every batch index, on the packed
// panel engine of gemm_microkernel.h.
//
// Each matrix is cut into super-blocks (rows_big x cols_big of the output) whose packed
// A rows and B columns (all of K) each fit cache_blocks().pack, a share of L3. The threads
// are used one of two ways:
//  - many or small matrices: each task runs whole matrices with its own buffers;
//  - few large matrices: a group of matrices at a time (one, when they are big); per
//    super-block all threads first pack A and B into shared buffers (one for_range),
//    then compute equal rectangles of the outputs from them (a second for_range).
//    Nothing is packed twice, and the end of a for_range is the only synchronisation
//    needed.
#include <algorithm>
#include <cstdint>
#include <memory>
#include <type_traits>
#include <vector>

#include "gemm_amx.h"
#include "kernels.h"

namespace oxijax::cpu {
namespace {

using namespace gemm_detail;

// A task should have at least this much work; smaller loops stay on one thread.
constexpr double kMinTaskFlops = double(1 << 21);
constexpr int64_t kMinPackElements = int64_t{1} << 15;

// One batch item.
template <typename T>
struct Matrices {
  const T* a;
  const T* b;
  const T* c;
  T* out;
};

// P: the packed element type (GemmPacked<T>, or Acc<T> for small AMX products).
template <typename T, typename P>
struct Plan {
  using A = Acc<T>;
  static constexpr int MR = PanelShape<P>::kMR, NR = PanelShape<P>::kNR;

  int64_t m, n, k;
  int64_t kp;  // K in packed elements (P), the depth of a packed row or column
  // op(a)(i, kk) = a[i * a_rs + kk * a_cs];  op(b)(kk, j) = b[j * b_rs + kk * b_cs].
  int64_t a_rs, a_cs, b_rs, b_cs;
  int64_t ldc;  // row stride of out and c
  A alpha, beta;
  KBlocks kb;
  int64_t rows_big, cols_big;  // super-block size, multiples of MR / NR

  explicit Plan(const GemmShape& s)
      : m(s.m), n(s.n), k(s.k), kp(packed_depth<P>(s.k)),
        a_rs(s.trans_a ? 1 : s.a_ld()), a_cs(s.trans_a ? s.a_ld() : 1),
        b_rs(s.trans_b ? s.b_ld() : 1), b_cs(s.trans_b ? 1 : s.b_ld()),
        ldc(s.out_ld()),
        alpha(A(s.alpha)), beta(A(s.beta)), kb(kp, cache_blocks<P>().kc, kKGranule<P>) {
    const CacheBlocks& blocks = cache_blocks<P>();
    rows_big = even_block(m, blocks.pack / kp, MR);
    // Half types also hold an MC-row stripe of the super-block in float
    // (compute_region), kept within the same budget.
    const int64_t col_limit = std::is_same_v<T, A>
                                  ? blocks.pack / kp
                                  : std::min(blocks.pack / kp, blocks.pack / blocks.mc);
    cols_big = even_block(n, col_limit, NR);
  }

  Target<T> target(const Matrices<T>& x, int64_t ib, int64_t jb) const {
    return {x.out + ib * ldc + jb, x.c != nullptr ? x.c + ib * ldc + jb : nullptr, ldc, alpha,
            beta};
  }
  void pack_a(P* dst, int64_t width, const Matrices<T>& x, int64_t ib, int64_t rows,
              int64_t i0, int64_t i1) const {
    pack_a_panels<MR>(dst, width, x.a + ib * a_rs, a_rs, a_cs, rows, i0, i1, kb, k);
  }
  void pack_b(P* dst, int64_t width, const Matrices<T>& x, int64_t jb, int64_t cols,
              int64_t j0, int64_t j1) const {
    pack_b_panels<NR>(dst, width, x.b + jb * b_rs, b_rs, b_cs, cols, j0, j1, kb, k);
  }
};

template <typename T, typename P>
struct Workspace {
  using A = Acc<T>;
  Scratch<P> a, b;
  Scratch<A> scratch;
  explicit Workspace(const Plan<T, P>& p)
      : a(p.rows_big * p.kp), b(p.cols_big * p.kp),
        scratch(std::is_same_v<T, A> ? 0 : cache_blocks<P>().mc * p.cols_big) {}
};

// One matrix on the calling thread.
template <typename T, typename P>
void gemm_serial(const Plan<T, P>& p, const Matrices<T>& x, Workspace<T, P>& ws) {
  constexpr int MR = Plan<T, P>::MR, NR = Plan<T, P>::NR;
  for (int64_t jb = 0; jb < p.n; jb += p.cols_big) {
    const int64_t nb = std::min(p.cols_big, p.n - jb), nw = round_up(nb, NR);
    p.pack_b(ws.b.data(), nw, x, jb, nb, 0, nw);
    for (int64_t ib = 0; ib < p.m; ib += p.rows_big) {
      const int64_t mb = std::min(p.rows_big, p.m - ib), mw = round_up(mb, MR);
      p.pack_a(ws.a.data(), mw, x, ib, mb, 0, mw);
      compute_region<T>(ws.a.data(), mw, ws.b.data(), nw, p.kb, 0, mb, 0, nb,
                        p.target(x, ib, jb), ws.scratch.data());
    }
  }
}

// `count` matrices on all threads at once; each has its own workspace, shared by the
// threads and written only in the pack phase. Per super-block, the threads first pack
// every matrix's A and B in pieces of about equal size (one for_range), then compute
// equal rectangles of every matrix's output block (a second for_range).
template <typename T, typename P>
void gemm_parallel(const Parallel& par, const Plan<T, P>& p, const Matrices<T>* xs,
                   const std::unique_ptr<Workspace<T, P>>* ws, int64_t count) {
  using A = Acc<T>;
  constexpr int MR = Plan<T, P>::MR, NR = Plan<T, P>::NR;
  // Pieces per matrix: four per thread in all, at least one of A and one of B.
  const int64_t pieces = std::max<int64_t>(2, ceil_div(4 * par.threads(), count));
  for (int64_t jb = 0; jb < p.n; jb += p.cols_big) {
    const int64_t nb = std::min(p.cols_big, p.n - jb), nw = round_up(nb, NR);
    for (int64_t ib = 0; ib < p.m; ib += p.rows_big) {
      const int64_t mb = std::min(p.rows_big, p.m - ib), mw = round_up(mb, MR);
      // Pack phase: A's panels, and B's when this column block starts.
      const bool with_b = ib == 0;
      const int64_t a_panels = mw / MR, b_panels = with_b ? nw / NR : 0;
      const double a_share = double(mw) / double(mw + (with_b ? nw : 0));
      const int64_t a_pieces =
          with_b ? std::clamp<int64_t>(int64_t(pieces * a_share + 0.5), 1, pieces - 1) : pieces;
      const int64_t a_chunk = ceil_div(a_panels, std::min(a_panels, a_pieces));
      const int64_t a_units = ceil_div(a_panels, a_chunk);
      const int64_t b_chunk =
          with_b ? ceil_div(b_panels, std::min(b_panels, pieces - a_pieces)) : 1;
      const int64_t b_units = with_b ? ceil_div(b_panels, b_chunk) : 0;
      const int64_t units = a_units + b_units;
      const int64_t unit_elems = std::max(a_chunk * MR, b_chunk * NR) * p.kp;
      par.for_range(count * units, ceil_div(kMinPackElements, unit_elems),
                    [&](int64_t begin, int64_t end) {
        for (int64_t t = begin; t < end; ++t) {
          const int64_t item = t / units, u = t % units;
          if (u < a_units) {
            p.pack_a(ws[item]->a.data(), mw, xs[item], ib, mb, u * a_chunk * MR,
                     std::min(a_panels, (u + 1) * a_chunk) * MR);
          } else {
            const int64_t v = u - a_units;
            p.pack_b(ws[item]->b.data(), nw, xs[item], jb, nb, v * b_chunk * NR,
                     std::min(b_panels, (v + 1) * b_chunk) * NR);
          }
        }
      });
      // Compute phase: equal rectangles of each output block, one per task.
      int64_t rc, cc;
      split_grid(a_panels, nw / NR, pieces, rc, cc);
      const int64_t rp = ceil_div(a_panels, rc), cp = ceil_div(nw / NR, cc);
      const double unit_flops = 2.0 * rc * MR * cc * NR * p.k;
      par.for_range(count * rp * cp, int64_t(kMinTaskFlops / unit_flops) + 1,
                    [&](int64_t begin, int64_t end) {
        Scratch<A> scratch(std::is_same_v<T, A> ? 0 : cache_blocks<P>().mc * cc * NR);
        for (int64_t t = begin; t < end; ++t) {
          const int64_t item = t / (rp * cp), u = t % (rp * cp);
          const int64_t r0 = (u / cp) * rc * MR, c0 = (u % cp) * cc * NR;
          compute_region<T>(ws[item]->a.data(), mw, ws[item]->b.data(), nw, p.kb, r0,
                            std::min(mb, r0 + rc * MR), c0, std::min(nb, c0 + cc * NR),
                            p.target(xs[item], ib, jb), scratch.data());
        }
      });
    }
  }
}

int64_t batch_offset(const GemmShape& s, const std::vector<int64_t>& strides, int64_t item) {
  int64_t offset = 0;
  for (int64_t d = static_cast<int64_t>(s.batch_dims.size()) - 1; d >= 0; --d) {
    offset += (item % s.batch_dims[d]) * strides[d];
    item /= s.batch_dims[d];
  }
  return offset;
}

// gemm of K > 0 with operands packed as P, for every batch item.
template <typename P, typename T>
void gemm_packed_as(const Parallel& par, const GemmShape& shape, const T* a, const T* b,
                    const T* c, T* out) {
  const int64_t batch = shape.batch_count(), mn = shape.m * shape.n;
  const int64_t out_stride = shape.out_stride();
  const Plan<T, P> p(shape);
  const auto item = [&](int64_t i) {
    return Matrices<T>{a + batch_offset(shape, shape.a_batch_strides, i),
                       b + batch_offset(shape, shape.b_batch_strides, i),
                       c != nullptr ? c + i * out_stride : nullptr, out + i * out_stride};
  };
  const double flops = 2.0 * double(mn) * double(shape.k);
  const int64_t threads = par.threads();
  // Whole matrices per task unless that leaves threads idle with big matrices to do.
  const bool split_matrices = threads > 1 && flops >= 4 * kMinTaskFlops &&
                              batch < 4 * threads && batch % threads != 0;
  if (split_matrices) {
    // Matrices taken together while their workspaces fit in two packed operands' budget
    // (with 8 matrices of 256^3 on 16 threads, one matrix at a time would leave each
    // for_range a few microseconds of work per thread).
    const int64_t ws_elems = p.rows_big * p.kp + p.cols_big * p.kp;
    const int64_t group = std::clamp<int64_t>(
        2 * cache_blocks<P>().pack / std::max<int64_t>(1, ws_elems), 1, batch);
    std::vector<std::unique_ptr<Workspace<T, P>>> ws;
    for (int64_t g = 0; g < group; ++g) ws.push_back(std::make_unique<Workspace<T, P>>(p));
    std::vector<Matrices<T>> xs(group);
    for (int64_t i0 = 0; i0 < batch; i0 += group) {
      const int64_t count = std::min(group, batch - i0);
      for (int64_t g = 0; g < count; ++g) xs[g] = item(i0 + g);
      gemm_parallel(par, p, xs.data(), ws.data(), count);
    }
    return;
  }
  par.for_range(batch, int64_t(kMinTaskFlops / flops) + 1, [&](int64_t begin, int64_t end) {
    Workspace<T, P> ws(p);
    for (int64_t i = begin; i < end; ++i) gemm_serial(p, item(i), ws);
  });
}

}  // namespace

template <typename T>
void gemm(const Parallel& par, const GemmShape& shape, const T* a, const T* b, const T* c,
          T* out) {
  using A = Acc<T>;
  const int64_t batch = shape.batch_count(), mn = shape.m * shape.n;
  if (batch == 0 || mn == 0) return;
  const A beta = A(shape.beta);
  const int64_t ldc = shape.out_ld(), out_stride = shape.out_stride();
  if (shape.k == 0) {  // empty sum: out = beta * c, row by row (rows may be padded)
    par.for_range(batch * shape.m, (int64_t{1} << 16) / shape.n + 1,
                  [&](int64_t begin, int64_t end) {
      for (int64_t row = begin; row < end; ++row) {
        const int64_t offset = (row / shape.m) * out_stride + (row % shape.m) * ldc;
        for (int64_t j = offset; j < offset + shape.n; ++j)
          out[j] = store<T>(beta != A(0) ? beta * load(c[j]) : A(0));
      }
    });
    return;
  }
  if constexpr (kOnTiles<T>) {  // tiles pay for their set-up from kMinTileProduct on
    if (double(shape.m) * double(shape.n) * double(shape.k) < kMinTileProduct)
      return gemm_packed_as<Acc<T>>(par, shape, a, b, c, out);
  }
  gemm_packed_as<GemmPacked<T>>(par, shape, a, b, c, out);
}

#define OXIJAX_INSTANTIATE(T)                                                          \
  template void gemm<T>(const Parallel&, const GemmShape&, const T*, const T*, const T*, \
                        T*);
OXIJAX_FOR_EACH_DTYPE(OXIJAX_INSTANTIATE)
#undef OXIJAX_INSTANTIATE

}  // namespace oxijax::cpu
