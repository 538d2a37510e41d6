// CPU attention backward (FlashAttention-2 style): the scores are recomputed from the
// forward's log-sum-exp, P = exp(scale * Q K^T - lse), never stored beyond one
// (key block x query block) tile:
//   delta = rowsum(dO * O),  dV = P^T dO,  dP = dO V^T,  dS = P * (dP - delta),
//   dQ = scale * dS K,       dK = scale * dS^T Q.
// The exponent is taken in base 2 (simd.h): P = exp2(S2 - lse * log2(e)), S2 the
// scores of the query block pre-scaled by scale * log2(e).
//
// Three parallel passes:
// 1. per (batch*head, query block): delta, and the query block laid out for pass 2 in
//    the compute type: Q (pre-scaled) and dO transposed ([D][Bq], the forward's
//    query-lane layout), Q and dO as rows of whole vectors ([Bq][Dp]; the inputs
//    themselves where they already are), lse and delta per lane.
// 2. per (batch*head, group of consecutive key blocks): the task owns its keys' dK and
//    dV rows and walks, key block by key block, the query blocks that can see them
//    (causal blocks above the diagonal are skipped). S^T = K Qt and dP^T = V dOt are
//    tiles over (key, query lane) like the forward's scores; dV += P^T dO, dK += dS^T Q
//    and dQ += dS K are tiles over (row, head dim) with P^T / dS^T broadcast. Each group
//    adds its dQ shares into a partial of its own, in key order (its first key block
//    writes it).
// 3. per (batch*head, query block): dQ = scale * the sum of the partials of the groups
//    that see the block, in group order, rounded.
// Deterministic: the groups depend on the shape alone (never on the thread count or on
// which thread finishes first), so every sum runs in one fixed order and the gradients
// are bit-identical run to run. Memory is O(S * D) per head, never Sq x Skv.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <type_traits>

#include "attention_rows.h"
#include "kernels.h"

namespace oxijax::cpu {
namespace {

using namespace simd;

constexpr int64_t kBq = kQueryBlock;

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
  int64_t sq, nqb, dim, dp;                // query rows and blocks, head dim, padded
  int64_t group_blocks, groups;            // key blocks per group, key groups
  // Q and dO as rows of the compute type with stride dp: the inputs themselves (q_in,
  // dout_in) where they already are, else copies (qr, dor: [bh][nqb * Bq][dp]).
  const A *q_in, *dout_in;
  Scratch<A> qr, dor;
  Scratch<A> qt, dot;                      // [bh][nqb][dim][Bq], qt scaled
  Scratch<A> lse, delta;                   // [bh][nqb][Bq]; lse in base 2, +inf where
                                           // no key is seen
  Scratch<A> dq;                           // [bh][groups][nqb * Bq][dp]
  // q_in_, dout_in_: q and dout where they are rows of A, else null.
  Prepared(int64_t bh, int64_t sq_, int64_t dim_, int64_t nkb, const A* q_in_,
           const A* dout_in_)
      : sq(sq_), nqb(ceil_div(sq_, kBq)), dim(dim_),
        dp((dim_ + kLanes<A> - 1) / kLanes<A> * kLanes<A>),
        group_blocks(ceil_div(nkb, key_groups(bh, nkb, bh * nqb * kBq * dim_))),
        groups(ceil_div(nkb, group_blocks)),  // none left empty
        q_in(dp == dim ? q_in_ : nullptr), dout_in(dp == dim ? dout_in_ : nullptr),
        qt(bh * nqb * dim * kBq), dot(bh * nqb * dim * kBq), lse(bh * nqb * kBq),
        delta(bh * nqb * kBq), dq(bh * groups * nqb * kBq * dp) {
    if (!q_in) qr.reset(bh * nqb * kBq * dp);
    if (!dout_in) dor.reset(bh * nqb * kBq * dp);
  }
  int64_t block(int64_t h, int64_t qb) const { return h * nqb + qb; }
  // Query block qb's Q and dO rows (stride dp).
  const A* q_rows(int64_t h, int64_t qb) const { return rows(q_in, qr, h, qb); }
  const A* dout_rows(int64_t h, int64_t qb) const { return rows(dout_in, dor, h, qb); }
  A* q_copy(int64_t h, int64_t qb) const { return qr.data() + block(h, qb) * kBq * dp; }
  A* dout_copy(int64_t h, int64_t qb) const { return dor.data() + block(h, qb) * kBq * dp; }
  // The first query block that key block kb's keys are visible to (causal: query i sees
  // key j0 iff i >= j0 - (Skv - Sq)); the later ones all see them.
  static int64_t first_query_block(const AttentionShape& shape, int64_t kb) {
    const int64_t j0 = kb * kKeyBlock;
    return (shape.causal ? std::max<int64_t>(0, j0 - (shape.seq_kv - shape.seq_q)) : 0) / kBq;
  }
  // Groups [0, n) write a partial of query block qb: their first key block sees it.
  int64_t groups_seeing(const AttentionShape& shape, int64_t qb) const {
    int64_t n = 0;
    while (n < groups && first_query_block(shape, n * group_blocks) <= qb) ++n;
    return n;
  }
  // Group g's dQ partial of query block qb of head h.
  A* partial(int64_t h, int64_t g, int64_t qb) const {
    return dq.data() + ((h * groups + g) * nqb + qb) * kBq * dp;
  }

 private:
  const A* rows(const A* in, const Scratch<A>& copy, int64_t h, int64_t qb) const {
    return in ? in + (h * sq + qb * kBq) * dim : copy.data() + block(h, qb) * kBq * dp;
  }
};

template <typename T>
void prepare_block(const AttentionShape& shape, const T* q, const T* out, const Acc<T>* lse,
                   const T* dout, int64_t h, int64_t qb, Prepared<Acc<T>>& pre) {
  using A = Acc<T>;
  constexpr int64_t ld = kBq;
  const int64_t dim = shape.head_dim, dp = pre.dp, sq = shape.seq_q;
  const int64_t i0 = qb * ld, rows = std::min(ld, sq - i0), blk = pre.block(h, qb);
  const int64_t base = h * sq + i0;
  if (!pre.q_in) rows_as<A>(q + base * dim, rows, dim, dp, pre.q_copy(h, qb));
  if (!pre.dout_in) rows_as<A>(dout + base * dim, rows, dim, dp, pre.dout_copy(h, qb));
  const A* dout_rows = pre.dout_rows(h, qb);
  transpose_rows(pre.q_rows(h, qb), dp, rows, ld, dim, A(shape.scale * kLog2e),
                 pre.qt.data() + blk * dim * ld, ld);
  transpose_rows(dout_rows, dp, rows, ld, dim, A(1), pre.dot.data() + blk * dim * ld, ld);
  const A inf = std::numeric_limits<A>::infinity();
  A* lanes_lse = pre.lse.data() + blk * ld;
  A* lanes_delta = pre.delta.data() + blk * ld;
  for (int64_t i = 0; i < ld; ++i) {
    // A row that sees no key (lse = -inf), or a padding lane, gets +inf: its weights
    // exp2(s - inf) are 0 instead of exp2(+inf).
    const A l = i < rows ? lse[base + i] : -inf;
    lanes_lse[i] = l == -inf ? inf : l * A(kLog2e);
    lanes_delta[i] = i < rows ? dot_row(dout_rows + i * dp, out + (base + i) * dim, dim) : A(0);
  }
}

// Key blocks a task keeps resident at once: their K, V, dK and dV rows (4 x 24 KB each
// with D = 64, in L2) meet each query block back to back, so that the block's Q and dO
// tiles and its tile of the group's dQ partial are fetched once per chunk.
constexpr int64_t kChunkBlocks = 2;
constexpr int64_t kChunkRows = kChunkBlocks * kKeyBlock;

// Per-task scratch.
template <typename A> struct Workspace {
  AlignedBuffer<A> st, dst;       // one pair's S^T and dS^T
  AlignedBuffer<A> k, v, dk, dv;  // a chunk's K (stride dp), V (stride dim), dK, dV rows
  Workspace(int64_t dim, int64_t dp, bool convert)
      : st(kKeyBlock * kBq), dst(kKeyBlock * kBq),
        k(convert || dp != dim ? kChunkRows * dp : 0), v(convert ? kChunkRows * dim : 0),
        dk(kChunkRows * dp), dv(kChunkRows * dp) {}
};

// One key block's operands: K rows (stride dp), V rows (stride dim), first key j0, and
// its dK, dV accumulators (stride dp; dK unscaled).
template <typename A> struct KeyBlock {
  const A *k, *v;
  int64_t j0, nk;
  A *dk, *dv;
};

// One (key block, query block) pair: accumulates the key block's dK, dV and adds its
// dQ share to dq (writes it when `first`).
template <typename A>
void pair(const AttentionShape& shape, const KeyBlock<A>& kb, int64_t h, int64_t qb,
          const Prepared<A>& pre, A* dq, bool first, Workspace<A>& ws) {
  using V = Vec<A>;
  constexpr int W = kLanes<A>;
  constexpr int64_t ld = kBq;
  const int64_t dim = pre.dim, dp = pre.dp, nk = kb.nk;
  const int64_t i0 = qb * ld, rows = std::min(ld, shape.seq_q - i0), blk = pre.block(h, qb);
  const int64_t vecs = (rows + W - 1) / W;  // query lane vectors in use
  const A* qt = pre.qt.data() + blk * dim * ld;
  const A* dot = pre.dot.data() + blk * dim * ld;
  A* st = ws.st.p;
  A* dst = ws.dst.p;

  // S^T = K Qt, dP^T = V dOt
  product<A, QueryLaneTile, false, false>(nk, vecs, dim, kb.k, dp, qt, ld, st, ld);
  product<A, QueryLaneTile, false, false>(nk, vecs, dim, kb.v, dim, dot, ld, dst, ld);

  // Causal: keys past a row's key_end get score -inf, on blocks that cross the diagonal.
  if (kb.j0 + nk > shape.key_end(i0)) {
    const A ninf = -std::numeric_limits<A>::infinity();
    for (int64_t i = 0; i < rows; ++i)
      for (int64_t j = std::max<int64_t>(shape.key_end(i0 + i) - kb.j0, 0); j < nk; ++j)
        st[j * ld + i] = ninf;
  }
  // P = exp2(S - lse), dS = P * (dP - delta), in place, row by row (contiguous).
  const A* lse = pre.lse.data() + blk * ld;
  const A* delta = pre.delta.data() + blk * ld;
  for (int64_t j = 0; j < nk; ++j)
    for (int64_t e = 0; e < vecs * W; e += W) {
      A* s = st + j * ld + e;
      A* ds = dst + j * ld + e;
      const V p = vexp2(vload<V>(s) - vload<V>(lse + e));
      vstore(s, p);
      vstore(ds, p * (vload<V>(ds) - vload<V>(delta + e)));
    }

  const A* qr = pre.q_rows(h, qb);
  const A* dor = pre.dout_rows(h, qb);
  // dV += P^T dO, dK += dS^T Q
  product<A, HeadDimTile, true, false>(nk, dp / W, rows, st, ld, dor, dp, kb.dv, dp);
  product<A, HeadDimTile, true, false>(nk, dp / W, rows, dst, ld, qr, dp, kb.dk, dp);
  if (first)  // dQ (+)= dS K
    product<A, HeadDimTile, false, true>(rows, dp / W, nk, dst, ld, kb.k, dp, dq, dp);
  else
    product<A, HeadDimTile, true, true>(rows, dp / W, nk, dst, ld, kb.k, dp, dq, dp);
}

// Key blocks [kb0, kb1) of head h (within group g): dK and dV of their keys; their dQ
// shares go to group g's partials, which the group's first chunk writes.
template <typename T>
void key_chunk(const AttentionShape& shape, const T* k, const T* v, T* dk, T* dv, int64_t h,
               int64_t g, int64_t kb0, int64_t kb1, const Prepared<Acc<T>>& pre,
               Workspace<Acc<T>>& ws) {
  using A = Acc<T>;
  const int64_t dim = shape.head_dim, dp = pre.dp, skv = shape.seq_kv;
  const int64_t j0 = kb0 * kKeyBlock, nrows = std::min(kb1 * kKeyBlock, skv) - j0;
  const int64_t ko = (h * skv + j0) * dim;
  const A* kp = rows_as<A>(k + ko, nrows, dim, dp, ws.k.p);
  const A* vp = rows_as<A>(v + ko, nrows, dim, dim, ws.v.p);
  std::fill(ws.dk.p, ws.dk.p + nrows * dp, A(0));
  std::fill(ws.dv.p, ws.dv.p + nrows * dp, A(0));
  const bool first_chunk = kb0 == g * pre.group_blocks;
  // Causal: query blocks before the first that sees a key block's keys skip it. Those
  // seeing a later key block see the earlier ones too (kb0 sees every query block).
  for (int64_t qb = pre.first_query_block(shape, kb0); qb < pre.nqb; ++qb) {
    for (int64_t kb = kb0; kb < kb1 && pre.first_query_block(shape, kb) <= qb; ++kb) {
      const int64_t r = (kb - kb0) * kKeyBlock;
      const KeyBlock<A> keys{kp + r * dp, vp + r * dim, j0 + r, std::min(kKeyBlock, nrows - r),
                             ws.dk.p + r * dp, ws.dv.p + r * dp};
      pair(shape, keys, h, qb, pre, pre.partial(h, g, qb), first_chunk && kb == kb0, ws);
    }
  }
  for (int64_t j = 0; j < nrows; ++j) {
    store_row(ws.dk.p + j * dp, dim, A(shape.scale), dk + ko + j * dim);
    store_row(ws.dv.p + j * dp, dim, A(1), dv + ko + j * dim);
  }
}

}  // namespace

template <typename T>
void attention_backward(const Parallel& par, const AttentionShape& shape, const T* q,
                        const T* k, const T* v, const T* out, const Acc<T>* lse,
                        const T* dout, T* dq, T* dk, T* dv) {
  using A = Acc<T>;
  constexpr int64_t ld = kBq;
  const int64_t bh = shape.batch * shape.heads;
  const int64_t sq = shape.seq_q, skv = shape.seq_kv, dim = shape.head_dim;
  if (bh <= 0 || sq <= 0 || skv <= 0 || dim <= 0) {  // nothing attends: zero gradients
    std::fill(dq, dq + bh * sq * dim, store<T>(A(0)));
    std::fill(dk, dk + bh * skv * dim, store<T>(A(0)));
    std::fill(dv, dv + bh * skv * dim, store<T>(A(0)));
    return;
  }
  const int64_t nkb = ceil_div(skv, kKeyBlock);
  const A *q_in = nullptr, *dout_in = nullptr;
  if constexpr (std::is_same_v<T, A>) q_in = q, dout_in = dout;
  Prepared<A> pre(bh, sq, dim, nkb, q_in, dout_in);
  const int64_t nqb = pre.nqb;

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
      for (int64_t kb = g * pre.group_blocks; kb < kb_end; kb += kChunkBlocks)
        key_chunk(shape, k, v, dk, dv, h, g, kb, std::min(kb + kChunkBlocks, kb_end), pre, ws);
    }
  });

  const A scale = A(shape.scale);
  const int64_t dp = pre.dp;
  par.for_range(bh * nqb, 1, [&](int64_t t0, int64_t t1) {
    AlignedBuffer<A> sum(ld * dp);
    for (int64_t t = t0; t < t1; ++t) {
      const int64_t h = t / nqb, qb = t % nqb, i0 = qb * ld, rows = std::min(ld, sq - i0);
      // Rows past `rows` of a partial are never written: only real rows are summed.
      const int64_t seen = pre.groups_seeing(shape, qb), n = rows * dp;
      std::fill(sum.p, sum.p + n, A(0));  // causal: no group may see the block
      for (int64_t g = 0; g < seen; ++g) {
        const A* partial = pre.partial(h, g, qb);
        for (int64_t e = 0; e < n; ++e) sum.p[e] += partial[e];
      }
      T* rowp = dq + (h * sq + i0) * dim;
      for (int64_t i = 0; i < rows; ++i) store_row(sum.p + i * dp, dim, scale, rowp + i * dim);
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
