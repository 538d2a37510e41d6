// Fused CPU attention (FlashAttention-2 style): per (batch, head, block of query rows)
// the scaled query block and the output accumulator stay resident while key/value
// blocks stream past; the Sq x Skv score matrix is never materialised.
//
// Layouts. The scores of a (key block, query block) tile are kept transposed,
// S^T [key][query lane], with the query block transposed too, Qt [D][query lane]:
//   S^T[j][i] = sum_d K[j][d] * Qt[d][i]      (broadcast K[j][d], vectors over i)
// so the online softmax's per-row max, sums and rescale factors are lane-wise
// (vertical) vector operations. The output accumulates in row layout, O [query][D]:
//   O[i][:]  += sum_j P^T[j][i] * V[j][:]     (broadcast P^T[j][i], vectors of V's row)
// so K and V are read in place (half types: converted to float once, for all query
// blocks), and only Q is transposed, once per query block.
//
// The softmax works in base 2 (simd.h): Qt holds q * scale * log2(e); lse is
// converted back to base e.
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

// Per-task scratch: O(block) memory.
template <typename A> struct Workspace {
  int64_t dp;  // the head dim padded to whole vectors: O's and V's row stride
  AlignedBuffer<A> qt, o, st;
  AlignedBuffer<A> max, sum, factor;  // online softmax state per query lane, base 2
  Workspace(int64_t dim, int64_t dp_)
      : dp(dp_), qt(dim * kQueryBlock), o(kQueryBlock * dp), st(kKeyBlock * kQueryBlock),
        max(kQueryBlock), sum(kQueryBlock), factor(kQueryBlock) {}
};

// One key block of the online softmax, on the first `vecs` vectors of query lanes:
// turns the scores st (S^T, stride kQueryBlock) into unnormalised weights in place and
// updates each lane's max and sum; factor receives the rescale factor of the lanes'
// earlier sums and outputs. OnlineSoftmax's rules (oxijax/math.h) lane-wise: NaN
// scores do not raise the max but make their weights (and the row) NaN; masked scores
// (-inf) weigh 0; while a lane's max is still -inf, every score so far is -inf or NaN,
// and weighs exp2(s - 0).
template <typename A>
void softmax_block(A* __restrict st, int64_t nk, int64_t vecs, A* __restrict max,
                   A* __restrict sum, A* __restrict factor) {
  using V = Vec<A>;
  constexpr int W = kLanes<A>;
  const A ninf = -std::numeric_limits<A>::infinity();
  for (int64_t v = 0; v < vecs; ++v) {
    A* col = st + v * W;
    V block_max = splat<V>(ninf);
    for (int64_t j = 0; j < nk; ++j) {
      const V s = vload<V>(col + j * kQueryBlock);
      block_max = s > block_max ? s : block_max;
    }
    const V old_max = vload<V>(max + v * W);
    const V new_max = block_max > old_max ? block_max : old_max;
    const V f = new_max == old_max ? splat<V>(A(1)) : vexp2(old_max - new_max);
    const V m = new_max == splat<V>(ninf) ? V{} : new_max;
    V block_sum = V{};
    for (int64_t j = 0; j < nk; ++j) {
      const V w = vexp2(vload<V>(col + j * kQueryBlock) - m);
      vstore(col + j * kQueryBlock, w);
      block_sum += w;
    }
    vstore(max + v * W, new_max);
    vstore(sum + v * W, vload<V>(sum + v * W) * f + block_sum);
    vstore(factor + v * W, f);
  }
}

// One (batch*head, query block) task: rows query rows from i0; k and v in the compute
// type, rows of stride dim and dp.
template <typename T>
void attend_block(const AttentionShape& shape, const T* q, const Acc<T>* k, const Acc<T>* v,
                  T* out, Acc<T>* lse, int64_t i0, int64_t rows, Workspace<Acc<T>>& ws) {
  using A = Acc<T>;
  using V = Vec<A>;
  constexpr int W = kLanes<A>;
  constexpr int64_t ld = kQueryBlock;
  const int64_t dim = shape.head_dim, dp = ws.dp;
  const int64_t vecs = (rows + W - 1) / W;  // query lane vectors in use
  const A ninf = -std::numeric_limits<A>::infinity();

  A* qt = ws.qt.p;
  A* o = ws.o.p;
  A* st = ws.st.p;
  const A qscale = A(shape.scale * kLog2e);
  transpose_rows(q + i0 * dim, dim, rows, vecs * W, dim, qscale, qt, ld);
  std::fill(o, o + rows * dp, A(0));
  std::fill(ws.max.p, ws.max.p + ld, ninf);
  std::fill(ws.sum.p, ws.sum.p + ld, A(0));

  int64_t lim[ld];  // key_end per lane; padded lanes copy the last real row
  for (int64_t i = 0; i < ld; ++i) lim[i] = shape.key_end(i0 + std::min(i, rows - 1));
  const int64_t kv_full = lim[0];      // keys [0, kv_full) are visible to every row
  const int64_t kv_end = lim[ld - 1];  // no row sees a key at or past kv_end

  for (int64_t j0 = 0; j0 < kv_end; j0 += kKeyBlock) {
    const int64_t nk = std::min(kKeyBlock, kv_end - j0);
    const A* kp = k + j0 * dim;
    const A* vp = v + j0 * dp;

    product<A, QueryLaneTile, false, false>(nk, vecs, dim, kp, dim, qt, ld, st, ld);  // S^T = K Qt
    if (j0 + nk > kv_full)  // causal: keys past a row's end get score -inf
      for (int64_t i = 0; i < vecs * W; ++i)
        for (int64_t j = std::max<int64_t>(lim[i] - j0, 0); j < nk; ++j) st[j * ld + i] = ninf;
    softmax_block(st, nk, vecs, ws.max.p, ws.sum.p, ws.factor.p);

    for (int64_t i = 0; i < rows; ++i) {  // O *= factor, row by row
      const A f = ws.factor.p[i];
      if (f == A(1)) continue;
      for (A* e = o + i * dp; e < o + (i + 1) * dp; e += W) vstore(e, vload<V>(e) * splat<V>(f));
    }
    product<A, HeadDimTile, true, true>(rows, dp / W, nk, st, ld, vp, dp, o, dp);  // O += P V
  }

  for (int64_t i = 0; i < rows; ++i) {
    const A s = ws.sum.p[i];
    const A norm = s == A(0) ? A(0) : A(1) / s;
    // NaN stays NaN; a row that saw no key (sum 0) gets -inf.
    lse[i0 + i] = s == A(0) ? ninf : ws.max.p[i] * A(kLn2) + std::log(s);
    store_row(o + i * dp, dim, norm, out + (i0 + i) * dim);
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
  const int64_t dp = (dim + W - 1) / W * W;
  Scratch<A> kbuf, vbuf;
  const A* kc = rows_as<A>(par, k, bh * skv, dim, dim, kbuf);
  const A* vc = rows_as<A>(par, v, bh * skv, dim, dp, vbuf);
  for_query_blocks(
      par, bh, sq, kQueryBlock, [&] { return Workspace<A>(dim, dp); },
      [&](int64_t h, int64_t i0, int64_t rows, Workspace<A>& ws) {
        const int64_t qo = h * sq * dim;
        attend_block<T>(shape, q + qo, kc + h * skv * dim, vc + h * skv * dp, out + qo,
                        lse + h * sq, i0, rows, ws);
      });
}

#define OXIJAX_INSTANTIATE_ATTENTION(T)                                                 \
  template void attention<T>(const Parallel&, const AttentionShape&, const T*, const T*, \
                             const T*, T*, Acc<T>*);
OXIJAX_FOR_EACH_DTYPE(OXIJAX_INSTANTIATE_ATTENTION)
#undef OXIJAX_INSTANTIATE_ATTENTION

}  // namespace oxijax::cpu
