// CPU attention JVP (forward-mode derivative), fused like the forward: per (batch*head,
// block of query rows) the key/value blocks and their tangents stream past, the Sq x Skv
// scores are never stored. With the forward's log-sum-exp, P = exp(scale q k^T - lse)
// is final block by block (no online rescaling), and per query row i
//   dS_ij = scale (dq_i . k_j + q_i . dk_j),  m_i = sum_j P_ij dS_ij,
//   dO_i  = sum_j P_ij dv_j + sum_j (P_ij dS_ij) v_j - m_i O_i.
// Vectorised along the query axis as the forward (see attention.cc): Q and dQ are held
// transposed and scaled, Qt, dQt [D][Bq], so S^T = K Qt and dS^T = K dQt + dK Qt are
// lane products, and the output tangent accumulates transposed, dOt [D][Bq].
#include <algorithm>
#include <cstdint>
#include <limits>
#include <type_traits>

#include "kernels.h"
#include "simd.h"

namespace oxijax::cpu {
namespace {

using namespace simd;

constexpr int kMaxIV = kRegs >= 32 ? 4 : 2;  // vectors of query lanes per block
constexpr int64_t kBk = 128;                 // keys per streamed block

// Per-task scratch: O(block) memory.
template <typename A> struct Workspace {
  static constexpr int64_t kBq = int64_t(kMaxIV) * kLanes<A>;
  AlignedBuffer<A> qt, dqt, acc, st, dst, kb, vb, dkb, dvb;
  Workspace(int64_t d, bool convert)
      : qt(d * kBq), dqt(d * kBq), acc(d * kBq), st(kBk * kBq), dst(kBk * kBq),
        kb(convert ? kBk * d : 0), vb(convert ? kBk * d : 0),
        dkb(convert ? kBk * d : 0), dvb(convert ? kBk * d : 0) {}
};

// The operands of one (batch*head): q, out, dq and dout [Sq][D]; k, v, dk, dv [Skv][D].
template <typename T> struct Head {
  const T *q, *k, *v, *out, *dq, *dk, *dv;
  const Acc<T>* lse;
  T* dout;
};

// One (batch*head, query block) task with IV vectors of query lanes.
template <typename T, int IV>
void jvp_block(const AttentionShape& shape, const Head<T>& x, int64_t i0, int64_t rows,
               Workspace<Acc<T>>& ws) {
  using A = Acc<T>;
  using V = Vec<A>;
  constexpr int W = kLanes<A>;
  constexpr int64_t ld = int64_t(IV) * W;  // lanes in this block (>= rows)
  const int64_t dim = shape.head_dim;
  const A scale = A(shape.scale);
  const A inf = std::numeric_limits<A>::infinity();

  A* qt = ws.qt.p;
  A* dqt = ws.dqt.p;
  for (int64_t i = 0; i < ld; ++i)
    for (int64_t d = 0; d < dim; ++d) {
      const bool in = i < rows;
      qt[d * ld + i] = in ? scale * load(x.q[(i0 + i) * dim + d]) : A(0);
      dqt[d * ld + i] = in ? scale * load(x.dq[(i0 + i) * dim + d]) : A(0);
    }
  std::fill(ws.acc.p, ws.acc.p + dim * ld, A(0));

  // A row that sees no key (lse = -inf) and a padding lane get lse = +inf: their
  // weights exp(s - inf) are 0, so their tangent is 0.
  A lane_lse[ld];
  int64_t lim[ld];  // key_end per lane; padded lanes copy the last real row
  for (int64_t i = 0; i < ld; ++i) {
    const A l = i < rows ? x.lse[i0 + i] : -inf;
    lane_lse[i] = l == -inf ? inf : l;
    lim[i] = shape.key_end(i0 + std::min(i, rows - 1));
  }
  const int64_t kv_full = lim[0];      // keys [0, kv_full) are visible to every row
  const int64_t kv_end = lim[ld - 1];  // no row sees a key at or past kv_end
  V lse[IV], m[IV];
  for (int iv = 0; iv < IV; ++iv) {
    lse[iv] = vload<V>(lane_lse + iv * W);
    m[iv] = V{};
  }

  for (int64_t j0 = 0; j0 < kv_end; j0 += kBk) {
    const int64_t nk = std::min(kBk, kv_end - j0);
    const A* kp = as_compute(x.k + j0 * dim, nk * dim, ws.kb.p);
    const A* vp = as_compute(x.v + j0 * dim, nk * dim, ws.vb.p);
    const A* dkp = as_compute(x.dk + j0 * dim, nk * dim, ws.dkb.p);
    const A* dvp = as_compute(x.dv + j0 * dim, nk * dim, ws.dvb.p);
    A* st = ws.st.p;
    A* dst = ws.dst.p;
    lanes_product_all<A, IV>(kp, dim, nk, qt, ld, dim, st);          // S^T = K Qt
    lanes_product_all<A, IV>(kp, dim, nk, dqt, ld, dim, dst);        // dS^T = K dQt
    lanes_product_all<A, IV, true>(dkp, dim, nk, qt, ld, dim, dst);  //      + dK Qt
    if (j0 + nk > kv_full)  // causal: keys past a row's end get score -inf
      for (int64_t jj = 0; jj < nk; ++jj)
        for (int64_t i = 0; i < ld; ++i)
          if (j0 + jj >= lim[i]) st[jj * ld + i] = -inf;
    // P^T = exp(S^T - lse) and W^T = P^T * dS^T in place; m += column sums of W^T.
    for (int64_t jj = 0; jj < nk; ++jj)
      for (int iv = 0; iv < IV; ++iv) {
        const V p = vexp(vload<V>(st + jj * ld + iv * W) - lse[iv]);
        const V w = p * vload<V>(dst + jj * ld + iv * W);
        vstore(st + jj * ld + iv * W, p);
        vstore(dst + jj * ld + iv * W, w);
        m[iv] += w;
      }
    lanes_accumulate_all<A, IV>(st, ld, nk, dvp, dim, dim, ws.acc.p);  // dOt += dV^T P^T
    lanes_accumulate_all<A, IV>(dst, ld, nk, vp, dim, dim, ws.acc.p);  //      + V^T W^T
  }

  A lane_m[ld];
  for (int iv = 0; iv < IV; ++iv) vstore(lane_m + iv * W, m[iv]);
  for (int64_t i = 0; i < rows; ++i) {
    const T* orow = x.out + (i0 + i) * dim;
    T* drow = x.dout + (i0 + i) * dim;
    for (int64_t d = 0; d < dim; ++d)
      drow[d] = store<T>(ws.acc.p[d * ld + i] - lane_m[i] * load(orow[d]));
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
  for_query_blocks(
      par, bh, sq, Workspace<A>::kBq,
      [&] { return Workspace<A>(dim, !std::is_same_v<T, A>); },
      [&](int64_t h, int64_t i0, int64_t rows, Workspace<A>& ws) {
        const int64_t qo = h * sq * dim, ko = h * skv * dim;
        const Head<T> x{q + qo,  k + ko,  v + ko,  out + qo,     dq + qo,
                        dk + ko, dv + ko, lse + h * sq, dout + qo};
        dispatch<kMaxIV>(int((rows + W - 1) / W), [&](auto c) {
          jvp_block<T, decltype(c)::value>(shape, x, i0, rows, ws);
        });
      });
}

#define OXIJAX_INSTANTIATE_ATTENTION_JVP(T)                                                \
  template void attention_jvp<T>(const Parallel&, const AttentionShape&, const T*, const T*, \
                                 const T*, const T*, const Acc<T>*, const T*, const T*,     \
                                 const T*, T*);
OXIJAX_FOR_EACH_DTYPE(OXIJAX_INSTANTIATE_ATTENTION_JVP)
#undef OXIJAX_INSTANTIATE_ATTENTION_JVP

}  // namespace oxijax::cpu
