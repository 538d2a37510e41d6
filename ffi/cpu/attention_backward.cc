// CPU attention backward (FlashAttention-2 style): the scores are recomputed from the
// forward's log-sum-exp, P = exp(scale * Q K^T - lse), never stored beyond one
// (key block x query block) tile:
//   delta = rowsum(dO * O),  dV = P^T dO,  dP = dO V^T,  dS = P * (dP - delta),
//   dQ = scale * dS K,       dK = scale * dS^T Q.
//
// Three parallel passes:
// 1. per (batch*head, query block): delta, and the query block laid out for pass 2 in
//    the compute type: Q and dO transposed ([D][Bq], the forward's query-lane layout;
//    Q pre-scaled) and as rows padded to whole vectors ([Bq][Dp]); lse per lane.
// 2. per (batch*head, group of consecutive key blocks): the task owns its keys' dK and
//    dV rows and walks, key block by key block, the query blocks that can see them
//    (causal blocks above the diagonal are skipped). S^T and dP^T = V dO^T are
//    vectorised over query lanes like the forward; dV and dK over the head dim
//    (broadcast P^T[j][i], vector of dO[i][:]). Each group adds its dQ^T share into a
//    partial accumulator of its own, in key order (its first key block writes it).
// 3. per (batch*head, query block): dQ = scale * the sum of the partials of the groups
//    that see the block, in group order, transposed back, rounded.
// Deterministic: the groups depend on the shape alone (never on the thread count or on
// which thread finishes first), so every sum runs in one fixed order and the gradients
// are bit-identical run to run. Memory is O(S * D) per head, never Sq x Skv.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <memory>
#include <type_traits>

#include "kernels.h"
#include "simd.h"

namespace oxijax::cpu {
namespace {

using namespace simd;

constexpr int kMaxIV = kRegs >= 32 ? 4 : 2;  // vectors of query lanes per query block
constexpr int64_t kBk = 128;                 // keys per key block
constexpr int kRowVecs = kRegs >= 32 ? 4 : 2;   // head-dim vectors per register tile
constexpr int kRowRows = 6;                     // register tile rows in head-dim kernels

template <typename A> constexpr int64_t kBq = int64_t(kMaxIV) * kLanes<A>;

// c[jt][dv] += sum_{i < n} at[jt][i] * b[i][dv] for JT rows and DV head-dim vectors
// (dV += P^T dO, dK += dS^T Q): broadcast at's lane values, vectors along the head dim.
template <typename A, int JT, int DV>
inline void rows_accumulate(const A* __restrict at, int64_t ld, int64_t n,
                            const A* __restrict b, int64_t ldb, A* __restrict c, int64_t ldc) {
  using V = Vec<A>;
  constexpr int W = kLanes<A>;
  V acc[JT][DV];
  for (int jt = 0; jt < JT; ++jt)
    for (int dv = 0; dv < DV; ++dv) acc[jt][dv] = vload<V>(c + jt * ldc + dv * W);
  for (int64_t i = 0; i < n; ++i) {
    V bv[DV];
    for (int dv = 0; dv < DV; ++dv) bv[dv] = vload<V>(b + i * ldb + dv * W);
    for (int jt = 0; jt < JT; ++jt) {
      const V a = splat<V>(at[jt * ld + i]);
      for (int dv = 0; dv < DV; ++dv) acc[jt][dv] = vfma(bv[dv], a, acc[jt][dv]);
    }
  }
  for (int jt = 0; jt < JT; ++jt)
    for (int dv = 0; dv < DV; ++dv) vstore(c + jt * ldc + dv * W, acc[jt][dv]);
}

// c[nk][dp] += at[nk][:n] . b[n][dp], dp a whole number of vectors.
template <typename A>
void rows_accumulate_all(const A* at, int64_t ld, int64_t nk, int64_t n, const A* b,
                         int64_t dp, A* c) {
  constexpr int W = kLanes<A>;
  for (int64_t d = 0; d < dp; d += int64_t(kRowVecs) * W) {
    const int dv = int(std::min<int64_t>(kRowVecs, (dp - d) / W));
    dispatch<kRowVecs>(dv, [&](auto v) {
      constexpr int DV = decltype(v)::value;
      int64_t j = 0;
      for (; j + kRowRows <= nk; j += kRowRows)
        rows_accumulate<A, kRowRows, DV>(at + j * ld, ld, n, b + d, dp, c + j * dp + d, dp);
      if (j < nk)
        dispatch<kRowRows - 1>(int(nk - j), [&](auto r) {
          rows_accumulate<A, decltype(r)::value, DV>(at + j * ld, ld, n, b + d, dp,
                                                     c + j * dp + d, dp);
        });
    });
  }
}

// Pass 2's tasks: about kTasks (batch*head, key group) pairs, whatever the thread count.
// Each group has a dQ partial of Sq x D; the groups shrink in number (to no fewer than
// 4) so that the partials stay within kPartials elements or 4x the gradient dQ.
constexpr int64_t kTasks = 64;
constexpr int64_t kPartials = int64_t(1) << 24;

inline int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

inline int64_t key_groups(int64_t bh, int64_t nkb, int64_t dq_elements) {
  const int64_t by_memory = std::max<int64_t>(4, kPartials / std::max<int64_t>(dq_elements, 1));
  return std::max<int64_t>(1, std::min({nkb, ceil_div(kTasks, bh), by_memory}));
}

// Pass 1's per-query-block layout, shared read-only by the tasks of pass 2, and the dQ
// partials of the key groups, each written by one task only.
template <typename A> struct Prepared {
  int64_t nqb, dim, dp;                    // query blocks, head dim, padded head dim
  int64_t group_blocks, groups;            // key blocks per group, key groups
  std::unique_ptr<A[]> qt, dot;            // [bh][nqb][dim][Bq], qt scaled
  std::unique_ptr<A[]> qr, dor;            // [bh][nqb * Bq][dp]
  std::unique_ptr<A[]> lse, delta;         // [bh][nqb][Bq]; lse +inf where no key is seen
  std::unique_ptr<A[]> dqt;                // [bh][groups][nqb][dim][Bq]
  Prepared(int64_t bh, int64_t nqb_, int64_t dim_, int64_t nkb)
      : nqb(nqb_), dim(dim_),
        dp((dim_ + kLanes<A> - 1) / kLanes<A> * kLanes<A>),
        group_blocks(ceil_div(nkb, key_groups(bh, nkb, bh * nqb_ * kBq<A> * dim_))),
        groups(ceil_div(nkb, group_blocks)),  // none left empty
        qt(new A[bh * nqb * dim * kBq<A>]), dot(new A[bh * nqb * dim * kBq<A>]),
        qr(new A[bh * nqb * kBq<A> * dp]), dor(new A[bh * nqb * kBq<A> * dp]),
        lse(new A[bh * nqb * kBq<A>]), delta(new A[bh * nqb * kBq<A>]),
        dqt(new A[bh * groups * nqb * dim * kBq<A>]) {}
  int64_t block(int64_t h, int64_t qb) const { return h * nqb + qb; }
  // The first query block that key block kb's keys are visible to (causal: query i sees
  // key j0 iff i >= j0 - (Skv - Sq)); the later ones all see them.
  static int64_t first_query_block(const AttentionShape& shape, int64_t kb) {
    const int64_t j0 = kb * kBk;
    return (shape.causal ? std::max<int64_t>(0, j0 - (shape.seq_kv - shape.seq_q)) : 0) / kBq<A>;
  }
  // Groups [0, n) write a partial of query block qb: their first key block sees it.
  int64_t groups_seeing(const AttentionShape& shape, int64_t qb) const {
    int64_t n = 0;
    while (n < groups && first_query_block(shape, n * group_blocks) <= qb) ++n;
    return n;
  }
  // Group g's dQ^T partial of query block qb of head h.
  A* partial(int64_t h, int64_t g, int64_t qb) const {
    return dqt.get() + ((h * groups + g) * nqb + qb) * dim * kBq<A>;
  }
};

template <typename T>
void prepare_block(const AttentionShape& shape, const T* q, const T* out, const Acc<T>* lse,
                   const T* dout, int64_t h, int64_t qb, Prepared<Acc<T>>& pre) {
  using A = Acc<T>;
  constexpr int64_t ld = kBq<A>;
  const int64_t dim = shape.head_dim, dp = pre.dp, sq = shape.seq_q;
  const int64_t i0 = qb * ld, rows = std::min(ld, sq - i0), blk = pre.block(h, qb);
  const A scale = A(shape.scale);
  A* qt = pre.qt.get() + blk * dim * ld;
  A* dot = pre.dot.get() + blk * dim * ld;
  A* qr = pre.qr.get() + blk * ld * dp;
  A* dor = pre.dor.get() + blk * ld * dp;
  A* lanes_lse = pre.lse.get() + blk * ld;
  A* lanes_delta = pre.delta.get() + blk * ld;
  const int64_t base = h * sq + i0;
  for (int64_t i = 0; i < ld; ++i) {
    A delta = A(0);
    for (int64_t d = 0; d < dp; ++d) {
      const bool in = i < rows && d < dim;
      const A qv = in ? load(q[(base + i) * dim + d]) : A(0);
      const A gv = in ? load(dout[(base + i) * dim + d]) : A(0);
      if (in) delta += gv * load(out[(base + i) * dim + d]);
      qr[i * dp + d] = qv;
      dor[i * dp + d] = gv;
      if (d < dim) {
        qt[d * ld + i] = scale * qv;
        dot[d * ld + i] = gv;
      }
    }
    // A row that sees no key (lse = -inf), or a padding lane, gets +inf: its weights
    // exp(s - inf) are 0 instead of exp(+inf).
    const A l = i < rows ? lse[base + i] : -std::numeric_limits<A>::infinity();
    lanes_lse[i] = l == -std::numeric_limits<A>::infinity() ? std::numeric_limits<A>::infinity() : l;
    lanes_delta[i] = delta;
  }
}

// Per-task scratch.
template <typename A> struct Workspace {
  AlignedBuffer<A> st, dpt, dk, dv, kb, vb;
  Workspace(int64_t dim, int64_t dp, bool convert)
      : st(kBk * kBq<A>), dpt(kBk * kBq<A>), dk(kBk * dp), dv(kBk * dp),
        kb(convert ? kBk * dim : 0), vb(convert ? kBk * dim : 0) {}
};

// One (key block, query block) pair with IV vectors of query lanes: accumulates the key
// block's dK, dV (ws.dk, ws.dv, unscaled dK) and adds its dQ^T share to dqt (writes it
// when `first`).
template <typename A, int IV>
void pair(const AttentionShape& shape, const A* kp, const A* vp, int64_t j0, int64_t nk,
          int64_t h, int64_t qb, const Prepared<A>& pre, A* dqt, bool first, Workspace<A>& ws) {
  using V = Vec<A>;
  constexpr int W = kLanes<A>;
  constexpr int64_t ld = kBq<A>;
  const int64_t dim = pre.dim, dp = pre.dp;
  const int64_t i0 = qb * ld, rows = std::min(ld, shape.seq_q - i0), blk = pre.block(h, qb);
  const A* qt = pre.qt.get() + blk * dim * ld;
  const A* dot = pre.dot.get() + blk * dim * ld;
  A* st = ws.st.p;
  A* dpt = ws.dpt.p;

  lanes_product_all<A, IV>(kp, dim, nk, qt, ld, dim, st);   // S^T = K Qt (scaled)
  lanes_product_all<A, IV>(vp, dim, nk, dot, ld, dim, dpt);  // dP^T = V dO^T

  // Causal: keys past a row's key_end get score -inf, on blocks that cross the diagonal.
  if (j0 + nk > shape.key_end(i0)) {
    const A ninf = -std::numeric_limits<A>::infinity();
    for (int64_t i = 0; i < rows; ++i)
      for (int64_t jj = std::max<int64_t>(shape.key_end(i0 + i) - j0, 0); jj < nk; ++jj)
        st[jj * ld + i] = ninf;
  }
  // P = exp(S - lse), dS = P * (dP - delta), in place.
  V lse[IV], delta[IV];
  for (int iv = 0; iv < IV; ++iv) {
    lse[iv] = vload<V>(pre.lse.get() + blk * ld + iv * W);
    delta[iv] = vload<V>(pre.delta.get() + blk * ld + iv * W);
  }
  for (int64_t jj = 0; jj < nk; ++jj)
    for (int iv = 0; iv < IV; ++iv) {
      const V p = vexp(vload<V>(st + jj * ld + iv * W) - lse[iv]);
      vstore(st + jj * ld + iv * W, p);
      vstore(dpt + jj * ld + iv * W, p * (vload<V>(dpt + jj * ld + iv * W) - delta[iv]));
    }

  rows_accumulate_all<A>(st, ld, nk, rows, pre.dor.get() + blk * ld * dp, dp, ws.dv.p);
  rows_accumulate_all<A>(dpt, ld, nk, rows, pre.qr.get() + blk * ld * dp, dp, ws.dk.p);

  if (first)  // dQ^T (+)= K^T dS^T
    lanes_accumulate_all<A, IV, false>(dpt, ld, nk, kp, dim, dim, dqt);
  else
    lanes_accumulate_all<A, IV>(dpt, ld, nk, kp, dim, dim, dqt);
}

// One key block of head h: dK and dV of its keys; its dQ^T shares go to group g's partial.
template <typename T>
void key_block(const AttentionShape& shape, const T* k, const T* v, T* dk, T* dv, int64_t h,
               int64_t g, int64_t kb, const Prepared<Acc<T>>& pre, Workspace<Acc<T>>& ws) {
  using A = Acc<T>;
  constexpr int W = kLanes<A>;
  constexpr int64_t ld = kBq<A>;
  const int64_t dim = shape.head_dim, dp = pre.dp, skv = shape.seq_kv;
  const int64_t j0 = kb * kBk, nk = std::min(kBk, skv - j0);
  const int64_t ko = (h * skv + j0) * dim;
  const A* kp = as_compute(k + ko, nk * dim, ws.kb.p);
  const A* vp = as_compute(v + ko, nk * dim, ws.vb.p);
  std::fill(ws.dk.p, ws.dk.p + nk * dp, A(0));
  std::fill(ws.dv.p, ws.dv.p + nk * dp, A(0));
  // Causal: query blocks before the first that sees these keys are skipped. The group's
  // first key block sees every query block its later ones do, so it writes the partials.
  const bool first = kb == g * pre.group_blocks;
  for (int64_t qb = pre.first_query_block(shape, kb); qb < pre.nqb; ++qb) {
    const int64_t rows = std::min(ld, shape.seq_q - qb * ld);
    dispatch<kMaxIV>(int((rows + W - 1) / W), [&](auto c) {
      pair<A, decltype(c)::value>(shape, kp, vp, j0, nk, h, qb, pre, pre.partial(h, g, qb),
                                  first, ws);
    });
  }
  const A scale = A(shape.scale);
  for (int64_t j = 0; j < nk; ++j)
    for (int64_t d = 0; d < dim; ++d) {
      dk[ko + j * dim + d] = store<T>(scale * ws.dk.p[j * dp + d]);
      dv[ko + j * dim + d] = store<T>(ws.dv.p[j * dp + d]);
    }
}

}  // namespace

template <typename T>
void attention_backward(const Parallel& par, const AttentionShape& shape, const T* q,
                        const T* k, const T* v, const T* out, const Acc<T>* lse,
                        const T* dout, T* dq, T* dk, T* dv) {
  using A = Acc<T>;
  constexpr int64_t ld = kBq<A>;
  const int64_t bh = shape.batch * shape.heads;
  const int64_t sq = shape.seq_q, skv = shape.seq_kv, dim = shape.head_dim;
  if (bh <= 0 || sq <= 0 || skv <= 0 || dim <= 0) {  // nothing attends: zero gradients
    std::fill(dq, dq + bh * sq * dim, store<T>(A(0)));
    std::fill(dk, dk + bh * skv * dim, store<T>(A(0)));
    std::fill(dv, dv + bh * skv * dim, store<T>(A(0)));
    return;
  }
  const int64_t nqb = (sq + ld - 1) / ld, nkb = (skv + kBk - 1) / kBk;
  Prepared<A> pre(bh, nqb, dim, nkb);

  par.for_range(bh * nqb, 1, [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t)
      prepare_block(shape, q, out, lse, dout, t / nqb, t % nqb, pre);
  });

  const int64_t groups = pre.groups;
  par.for_range(bh * groups, 1, [&](int64_t t0, int64_t t1) {
    Workspace<A> ws(dim, pre.dp, !std::is_same_v<T, A>);
    for (int64_t t = t0; t < t1; ++t) {
      const int64_t h = t / groups, r = t % groups;
      // Causal key groups have uneven work (late keys are seen by few queries):
      // interleave cheap and expensive ones as the forward does.
      const int64_t g = (r % 2 == 0) ? r / 2 : groups - 1 - r / 2;
      const int64_t kb_end = std::min(nkb, (g + 1) * pre.group_blocks);
      for (int64_t kb = g * pre.group_blocks; kb < kb_end; ++kb)
        key_block(shape, k, v, dk, dv, h, g, kb, pre, ws);
    }
  });

  const A scale = A(shape.scale);
  par.for_range(bh * nqb, 1, [&](int64_t t0, int64_t t1) {
    AlignedBuffer<A> sum(dim * ld);
    for (int64_t t = t0; t < t1; ++t) {
      const int64_t h = t / nqb, qb = t % nqb, i0 = qb * ld, rows = std::min(ld, sq - i0);
      // Lanes past `rows` of a partial are never written: only real rows are summed.
      const int64_t seen = pre.groups_seeing(shape, qb);
      for (int64_t d = 0; d < dim; ++d) std::fill_n(sum.p + d * ld, rows, A(0));
      for (int64_t g = 0; g < seen; ++g) {
        const A* partial = pre.partial(h, g, qb);
        for (int64_t d = 0; d < dim; ++d)
          for (int64_t i = 0; i < rows; ++i) sum.p[d * ld + i] += partial[d * ld + i];
      }
      T* rowp = dq + (h * sq + i0) * dim;
      for (int64_t i = 0; i < rows; ++i)
        for (int64_t d = 0; d < dim; ++d) rowp[i * dim + d] = store<T>(scale * sum.p[d * ld + i]);
    }
  });
}

#define OXIJAX_INSTANTIATE_ATTENTION_BACKWARD(T)                                          \
  template void attention_backward<T>(const Parallel&, const AttentionShape&, const T*,   \
                                      const T*, const T*, const T*, const Acc<T>*,        \
                                      const T*, T*, T*, T*);
OXIJAX_FOR_EACH_DTYPE(OXIJAX_INSTANTIATE_ATTENTION_BACKWARD)
#undef OXIJAX_INSTANTIATE_ATTENTION_BACKWARD

}  // namespace oxijax::cpu
