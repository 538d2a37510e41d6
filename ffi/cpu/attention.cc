// Fused CPU attention (FlashAttention-2 style): per (batch, head, block of query rows)
// the scaled query block and the output accumulator stay resident while key/value
// blocks stream past; the Sq x Skv score matrix is never materialised.
//
// Layout trick: everything is vectorised along the QUERY axis. The query block is
// stored transposed, Qt [D][Bq], and the output accumulator too, Ot [D][Bq]. Then
//   S^T[j][i]  = sum_d K[j][d] * Qt[d][i]      (broadcast K[j][d], vector over i)
//   Ot[d][i]  += sum_j V[j][d] * P^T[j][i]     (broadcast V[j][d], vector over i)
// so K and V are read in place (no per-block transpose/packing for float/double),
// the per-row max/sum of the online softmax are lane-wise (vertical) operations, and
// the per-row rescale is a lane-wise multiply. Only Q (in) and O (out) are
// transposed, once per query block.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <new>
#include <type_traits>

#include "kernels.h"
#include "oxijax/math.h"
#include "simd.h"

namespace oxijax::cpu {
namespace {

using namespace simd;

// ---------------------------------------------------------------------------------
// Tiling parameters.

constexpr int kMaxIV = kRegs >= 32 ? 4 : 2;  // vectors of query lanes per block
constexpr int64_t kBk = 128;                 // keys per streamed block
// Rows of the register tile (keys for S, head-dim entries for P.V) for IV vectors.
constexpr int tile_rows(int iv) {
  const int r = (kRegs - 8) / iv;
  return r > 12 ? 12 : r;
}

// st[jt][:] = Qt^T . K[jt] for JT keys (st row stride ld, K row stride dim); raises
// the per-lane block max bmax to cover them.
template <typename A, int IV, int JT>
inline void score_tile(const A* __restrict qt, int64_t ld, const A* __restrict kp,
                       int64_t dim, A* __restrict st, Vec<A>* bmax) {
  using V = Vec<A>;
  constexpr int W = kLanes<A>;
  lanes_product<A, IV, JT>(kp, dim, qt, ld, dim, st);
  for (int jt = 0; jt < JT; ++jt)
    for (int iv = 0; iv < IV; ++iv) {
      const V s = vload<V>(st + jt * ld + iv * W);
      bmax[iv] = s > bmax[iv] ? s : bmax[iv];
    }
}

// ot[dt][:] = ot[dt][:] * factor + sum_j V[j][dt] * pt[j][:] for DT head-dim rows.
template <typename A, int IV, int DT>
inline void pv_tile(const A* __restrict pt, int64_t ld, int64_t nk, const A* __restrict vp,
                    int64_t ldv, A* __restrict ot, const Vec<A>* factor) {
  using V = Vec<A>;
  constexpr int W = kLanes<A>;
  V acc[DT][IV];
  for (int dt = 0; dt < DT; ++dt)
    for (int iv = 0; iv < IV; ++iv) acc[dt][iv] = vload<V>(ot + dt * ld + iv * W) * factor[iv];
  for (int64_t j = 0; j < nk; ++j) {
    V p[IV];
    for (int iv = 0; iv < IV; ++iv) p[iv] = vload<V>(pt + j * ld + iv * W);
    for (int dt = 0; dt < DT; ++dt) {
      const V vv = splat<V>(vp[j * ldv + dt]);
      for (int iv = 0; iv < IV; ++iv) acc[dt][iv] = vfma(p[iv], vv, acc[dt][iv]);
    }
  }
  for (int dt = 0; dt < DT; ++dt)
    for (int iv = 0; iv < IV; ++iv) vstore(ot + dt * ld + iv * W, acc[dt][iv]);
}

// Unnormalised weights of one key row of scores, in place; adds them to `sum`.
// OnlineSoftmax::weight lane-wise: exp(s - max), 0 for masked (-inf) scores. mx is the
// running max, or 0 where that is still -inf: then every score so far is -inf (weight
// exp(-inf) = 0) or NaN (stays NaN), as weight() has it.
template <typename A, int IV>
inline void weights_row(A* __restrict s, const Vec<A>* mx, Vec<A>* sum) {
  using V = Vec<A>;
  constexpr int W = kLanes<A>;
  for (int iv = 0; iv < IV; ++iv) {
    const V w = vexp(vload<V>(s + iv * W) - mx[iv]);
    vstore(s + iv * W, w);
    sum[iv] += w;
  }
}

// Per-task scratch: O(block) memory.
template <typename A> struct Workspace {
  static constexpr int64_t kBq = int64_t(kMaxIV) * kLanes<A>;
  int64_t dim;
  AlignedBuffer<A> qt, ot, st, kb, vb;
  Workspace(int64_t d, bool convert)
      : dim(d), qt(d * kBq), ot(d * kBq), st(kBk * kBq),
        kb(convert ? kBk * d : 0), vb(convert ? kBk * d : 0) {}
};

// One (batch*head, query block) task with IV vectors of query lanes.
template <typename T, int IV>
void attend_block(const AttentionShape& shape, const T* q, const T* k, const T* v, T* out,
                  Acc<T>* lse, int64_t i0, int64_t rows, Workspace<Acc<T>>& ws) {
  using A = Acc<T>;
  using V = Vec<A>;
  constexpr int W = kLanes<A>;
  constexpr int64_t ld = int64_t(IV) * W;  // lanes in this block (>= rows)
  const int64_t dim = shape.head_dim;
  const A scale = A(shape.scale);

  A* qt = ws.qt.p;
  A* ot = ws.ot.p;
  A* st = ws.st.p;
  for (int64_t i = 0; i < ld; ++i) {
    if (i < rows) {
      const T* qrow = q + (i0 + i) * dim;
      for (int64_t d = 0; d < dim; ++d) qt[d * ld + i] = scale * load(qrow[d]);
    } else {
      for (int64_t d = 0; d < dim; ++d) qt[d * ld + i] = A(0);
    }
  }
  std::fill(ot, ot + dim * ld, A(0));

  OnlineSoftmax<A> os[ld];
  int64_t lim[ld];  // key_end per lane; padded lanes copy the last real row
  for (int64_t i = 0; i < ld; ++i) lim[i] = shape.key_end(i0 + std::min(i, rows - 1));
  const int64_t kv_full = lim[0];     // keys [0, kv_full) are visible to every row
  const int64_t kv_end = lim[ld - 1];  // no row sees a key at or past kv_end

  constexpr int JT = tile_rows(IV);
  constexpr int DT = tile_rows(IV);
  for (int64_t j0 = 0; j0 < kv_end; j0 += kBk) {
    const int64_t nk = std::min(kBk, kv_end - j0);
    const A* kp = as_compute(k + j0 * dim, nk * dim, ws.kb.p);
    const A* vp = as_compute(v + j0 * dim, nk * dim, ws.vb.p);

    // S^T = K_blk . Qt, and the block max per lane.
    const A ninf = -std::numeric_limits<A>::infinity();
    V m[IV];
    for (int iv = 0; iv < IV; ++iv) m[iv] = splat<V>(ninf);
    int64_t j = 0;
    for (; j + JT <= nk; j += JT)
      score_tile<A, IV, JT>(qt, ld, kp + j * dim, dim, st + j * ld, m);
    if (j < nk)
      dispatch<JT - 1>(int(nk - j), [&](auto c) {
        score_tile<A, IV, decltype(c)::value>(qt, ld, kp + j * dim, dim, st + j * ld, m);
      });

    // Causal mask on blocks that cross the diagonal; the max is then taken again.
    if (j0 + nk > kv_full) {
      for (int iv = 0; iv < IV; ++iv) m[iv] = splat<V>(ninf);
      for (int64_t jj = 0; jj < nk; ++jj) {
        A* srow = st + jj * ld;
        for (int64_t i = 0; i < ld; ++i)
          if (j0 + jj >= lim[i]) srow[i] = ninf;
        for (int iv = 0; iv < IV; ++iv) {
          const V s = vload<V>(srow + iv * W);
          m[iv] = s > m[iv] ? s : m[iv];
        }
      }
    }

    // Online softmax per row: rescale by the block max, weights and their sums.
    A lane[ld], lane_factor[ld], lane_max[ld];
    for (int iv = 0; iv < IV; ++iv) vstore(lane + iv * W, m[iv]);
    for (int64_t i = 0; i < ld; ++i) {
      lane_factor[i] = os[i].rescale(lane[i]);
      lane_max[i] = os[i].max == ninf ? A(0) : os[i].max;
    }
    V factor[IV], mx[IV], sum[IV];
    for (int iv = 0; iv < IV; ++iv) {
      factor[iv] = vload<V>(lane_factor + iv * W);
      mx[iv] = vload<V>(lane_max + iv * W);
      sum[iv] = V{};
    }
    for (int64_t jj = 0; jj < nk; ++jj) weights_row<A, IV>(st + jj * ld, mx, sum);
    for (int iv = 0; iv < IV; ++iv) vstore(lane + iv * W, sum[iv]);
    for (int64_t i = 0; i < ld; ++i) os[i].add(lane[i]);

    // Ot = Ot * factor + V_blk^T . P^T
    int64_t d = 0;
    for (; d + DT <= dim; d += DT) pv_tile<A, IV, DT>(st, ld, nk, vp + d, dim, ot + d * ld, factor);
    if (d < dim)
      dispatch<DT - 1>(int(dim - d), [&](auto c) {
        pv_tile<A, IV, decltype(c)::value>(st, ld, nk, vp + d, dim, ot + d * ld, factor);
      });
  }

  for (int64_t i = 0; i < rows; ++i) {
    const A norm = os[i].normaliser();
    lse[i0 + i] = os[i].log_sum_exp();
    T* orow = out + (i0 + i) * dim;
    for (int64_t d = 0; d < dim; ++d) orow[d] = store<T>(ot[d * ld + i] * norm);
  }
}

}  // namespace

template <typename T>
void attention(const Parallel& par, const AttentionShape& shape, const T* q, const T* k,
               const T* v, T* out, Acc<T>* lse) {
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
        dispatch<kMaxIV>(int((rows + W - 1) / W), [&](auto c) {
          attend_block<T, decltype(c)::value>(shape, q + qo, k + ko, v + ko, out + qo,
                                              lse + h * sq, i0, rows, ws);
        });
      });
}

#define OXIJAX_INSTANTIATE_ATTENTION(T)                                                 \
  template void attention<T>(const Parallel&, const AttentionShape&, const T*, const T*, \
                             const T*, T*, Acc<T>*);
OXIJAX_FOR_EACH_DTYPE(OXIJAX_INSTANTIATE_ATTENTION)
#undef OXIJAX_INSTANTIATE_ATTENTION

}  // namespace oxijax::cpu
