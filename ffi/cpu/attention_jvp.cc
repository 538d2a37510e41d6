// CPU attention JVP (forward-mode derivative), fused like the forward: per (batch*head,
// block of query rows) the key/value blocks and their tangents stream past, the Sq x Skv
// scores are never stored. With the forward's log-sum-exp, P = exp(scale q k^T - lse)
// is final block by block (no online rescaling), and per query row i
//   dS_ij = scale (dq_i . k_j + q_i . dk_j),  m_i = sum_j P_ij dS_ij,
//   dO_i  = sum_j P_ij dv_j + sum_j (P_ij dS_ij) v_j - m_i O_i.
// Laid out as the forward (see attention.cc): Q and dQ are held transposed and scaled by
// scale * log2(e), Qt, dQt [D][Bq], so S^T = K Qt and dS^T = K dQt + dK Qt (both in
// base 2, P = exp2(S^T - lse * log2(e))) are tiles over (key, query lane); the output
// tangent accumulates in row layout, dO [Bq][D], from P^T and (P dS)^T broadcast.
#include <algorithm>
#include <cstdint>
#include <limits>
#include <type_traits>

#include "attention_rows.h"
#include "kernels.h"

namespace oxijax::cpu {
namespace {

using namespace simd;

// Per-task scratch: O(block) memory.
template <typename A> struct Workspace {
  int64_t dp;  // the head dim padded to whole vectors: dO's, V's and dV's row stride
  AlignedBuffer<A> qt, dqt, acc, st, dst;
  Workspace(int64_t dim, int64_t dp_)
      : dp(dp_), qt(dim * kQueryBlock), dqt(dim * kQueryBlock), acc(kQueryBlock * dp),
        st(kKeyBlock * kQueryBlock), dst(kKeyBlock * kQueryBlock) {}
};

// The operands of one (batch*head): q, out, dq and dout [Sq][D]; k, dk [Skv][D] and v,
// dv [Skv][Dp] in the compute type (half types converted once, for all query blocks).
template <typename T> struct Head {
  const T *q, *out, *dq;
  const Acc<T> *k, *v, *dk, *dv;
  const Acc<T>* lse;
  T* dout;
};

// One (batch*head, query block) task: rows query rows from i0.
template <typename T>
void jvp_block(const AttentionShape& shape, const Head<T>& x, int64_t i0, int64_t rows,
               Workspace<Acc<T>>& ws) {
  using A = Acc<T>;
  using V = Vec<A>;
  constexpr int W = kLanes<A>;
  constexpr int64_t ld = kQueryBlock;
  const int64_t dim = shape.head_dim, dp = ws.dp;
  const int64_t vecs = (rows + W - 1) / W;  // query lane vectors in use
  const A qscale = A(shape.scale * kLog2e);
  const A inf = std::numeric_limits<A>::infinity();

  A* qt = ws.qt.p;
  A* dqt = ws.dqt.p;
  transpose_rows(x.q + i0 * dim, dim, rows, vecs * W, dim, qscale, qt, ld);
  transpose_rows(x.dq + i0 * dim, dim, rows, vecs * W, dim, qscale, dqt, ld);
  A* acc = ws.acc.p;
  std::fill(acc, acc + rows * dp, A(0));

  // A row that sees no key (lse = -inf) and a padding lane get lse = +inf: their
  // weights exp2(s - inf) are 0, so their tangent is 0.
  A lane_lse[ld];
  int64_t lim[ld];  // key_end per lane; padded lanes copy the last real row
  for (int64_t i = 0; i < ld; ++i) {
    const A l = i < rows ? x.lse[i0 + i] : -inf;
    lane_lse[i] = l == -inf ? inf : l * A(kLog2e);
    lim[i] = shape.key_end(i0 + std::min(i, rows - 1));
  }
  const int64_t kv_full = lim[0];      // keys [0, kv_full) are visible to every row
  const int64_t kv_end = lim[ld - 1];  // no row sees a key at or past kv_end
  A lane_m[ld];                        // m per lane
  std::fill(lane_m, lane_m + ld, A(0));

  for (int64_t j0 = 0; j0 < kv_end; j0 += kKeyBlock) {
    const int64_t nk = std::min(kKeyBlock, kv_end - j0);
    const A* kp = x.k + j0 * dim;
    const A* dkp = x.dk + j0 * dim;
    const A* vp = x.v + j0 * dp;
    const A* dvp = x.dv + j0 * dp;
    A* st = ws.st.p;
    A* dst = ws.dst.p;
    // S^T = K Qt, dS^T = K dQt + dK Qt
    product<A, QueryLaneTile, false, false>(nk, vecs, dim, kp, dim, qt, ld, st, ld);
    product<A, QueryLaneTile, false, false>(nk, vecs, dim, kp, dim, dqt, ld, dst, ld);
    product<A, QueryLaneTile, true, false>(nk, vecs, dim, dkp, dim, qt, ld, dst, ld);
    if (j0 + nk > kv_full)  // causal: keys past a row's end get score -inf
      for (int64_t i = 0; i < vecs * W; ++i)
        for (int64_t j = std::max<int64_t>(lim[i] - j0, 0); j < nk; ++j) st[j * ld + i] = -inf;
    // P^T = exp2(S^T - lse) and W^T = P^T * dS^T in place (dS^T back from base 2: * ln2);
    // m += column sums of W^T.
    for (int64_t v = 0; v < vecs; ++v) {
      const V lse = vload<V>(lane_lse + v * W);
      V m = vload<V>(lane_m + v * W);
      for (int64_t j = 0; j < nk; ++j) {
        A* s = st + j * ld + v * W;
        A* ds = dst + j * ld + v * W;
        const V p = vexp2(vload<V>(s) - lse);
        const V w = p * vload<V>(ds) * splat<V>(A(kLn2));
        vstore(s, p);
        vstore(ds, w);
        m += w;
      }
      vstore(lane_m + v * W, m);
    }
    product<A, HeadDimTile, true, true>(rows, dp / W, nk, st, ld, dvp, dp, acc, dp);   // dO += P dV
    product<A, HeadDimTile, true, true>(rows, dp / W, nk, dst, ld, vp, dp, acc, dp);   //    + W V
  }

  for (int64_t i = 0; i < rows; ++i) {
    const T* orow = x.out + (i0 + i) * dim;
    T* drow = x.dout + (i0 + i) * dim;
    for (int64_t d = 0; d < dim; ++d)
      drow[d] = store<T>(acc[i * dp + d] - lane_m[i] * load(orow[d]));
  }
}

}  // namespace

template <typename T>
void attention_jvp(const Parallel& par, const AttentionShape& shape, const T* q, const T* k,
                   const T* v, const T* out, const Acc<T>* lse, const T* dq, const T* dk,
                   const T* dv, T* dout) {
  using A = Acc<T>;
  constexpr int W = kLanes<A>;
  const int64_t bh = shape.batch * shape.heads;
  const int64_t sq = shape.seq_q, skv = shape.seq_kv, dim = shape.head_dim;
  if (bh <= 0 || sq <= 0) return;
  const int64_t dp = (dim + W - 1) / W * W;
  Scratch<A> kbuf, vbuf, dkbuf, dvbuf;
  const A* kc = rows_as<A>(par, k, bh * skv, dim, dim, kbuf);
  const A* vc = rows_as<A>(par, v, bh * skv, dim, dp, vbuf);
  const A* dkc = rows_as<A>(par, dk, bh * skv, dim, dim, dkbuf);
  const A* dvc = rows_as<A>(par, dv, bh * skv, dim, dp, dvbuf);
  for_query_blocks(
      par, bh, sq, kQueryBlock, [&] { return Workspace<A>(dim, dp); },
      [&](int64_t h, int64_t i0, int64_t rows, Workspace<A>& ws) {
        const int64_t qo = h * sq * dim, ko = h * skv * dim, vo = h * skv * dp;
        const Head<T> x{q + qo,   out + qo, dq + qo,       kc + ko,  vc + vo,
                        dkc + ko, dvc + vo, lse + h * sq, dout + qo};
        jvp_block<T>(shape, x, i0, rows, ws);
      });
}

#define OXIJAX_INSTANTIATE_ATTENTION_JVP(T)                                                \
  template void attention_jvp<T>(const Parallel&, const AttentionShape&, const T*, const T*, \
                                 const T*, const T*, const Acc<T>*, const T*, const T*,     \
                                 const T*, T*);
OXIJAX_FOR_EACH_DTYPE(OXIJAX_INSTANTIATE_ATTENTION_JVP)
#undef OXIJAX_INSTANTIATE_ATTENTION_JVP

}  // namespace oxijax::cpu
