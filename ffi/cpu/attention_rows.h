// The attention kernels' operands between the element type T and the compute type
// A = Acc<T>: rows converted to A (K and V for every query block, a block's Q and dO
// rows), a query block transposed into the query-lane layout, rows rounded back to T, a
// row's dot product. Whole vectors where A is float (half_convert.h's conversions, the
// same values as numeric.h's scalar load / store), numeric.h's scalar ones for the
// tails and for double.
#pragma once

#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "half_convert.h"
#include "oxijax/numeric.h"
#include "parallel.h"
#include "scratch.h"
#include "simd.h"

namespace oxijax::cpu::simd {

// `rows` rows of `dim` values of T (contiguous) as rows of A with stride ld >= dim,
// zero beyond dim: src itself where that is already so, else converted into buf.
template <typename A, typename T>
const A* rows_as(const T* src, int64_t rows, int64_t dim, int64_t ld, A* buf) {
  if constexpr (std::is_same_v<T, A>) {
    if (ld == dim) return src;
  }
  constexpr int W = kLanes<A>;
  for (int64_t r = 0; r < rows; ++r) {
    const T* s = src + r * dim;
    A* d = buf + r * ld;
    int64_t e = 0;
    if constexpr (std::is_same_v<A, float>)
      for (; e + W <= dim; e += W) vstore(d + e, vmath::load_lanes(s + e));
    for (; e < dim; ++e) d[e] = load(s[e]);
    for (; e < ld; ++e) d[e] = A(0);
  }
  return buf;
}

// rows_as for a whole tensor of `rows` rows, converted once (in parallel) for every
// query block to share: src itself where it already is, else a copy in buf.
template <typename A, typename T>
const A* rows_as(const Parallel& par, const T* src, int64_t rows, int64_t dim, int64_t ld,
                 Scratch<A>& buf) {
  if constexpr (std::is_same_v<T, A>) {
    if (ld == dim) return src;
  }
  constexpr int64_t kRowsPerTask = 256;
  buf.reset(rows * ld);
  par.for_range((rows + kRowsPerTask - 1) / kRowsPerTask, 1, [&](int64_t t0, int64_t t1) {
    const int64_t r0 = t0 * kRowsPerTask, r1 = std::min(rows, t1 * kRowsPerTask);
    rows_as<A>(src + r0 * dim, r1 - r0, dim, ld, buf.data() + r0 * ld);
  });
  return buf.data();
}

// The query-lane layout of a block: dst[d * ld + i] = scale * src[i * lds + d] for the
// `rows` rows of src (d < dim), 0 in the lanes [rows, lanes).
template <typename A, typename T>
void transpose_rows(const T* src, int64_t lds, int64_t rows, int64_t lanes, int64_t dim,
                    A scale, A* dst, int64_t ld) {
  constexpr int W = kLanes<A>;
  for (int64_t i = 0; i < rows; ++i) {
    const T* s = src + i * lds;
    int64_t d = 0;
    if constexpr (std::is_same_v<A, float>)
      for (; d + W <= dim; d += W) {
        const VecF x = vmath::load_lanes(s + d) * splat<VecF>(scale);
        for (int l = 0; l < W; ++l) dst[(d + l) * ld + i] = x[l];
      }
    for (; d < dim; ++d) dst[d * ld + i] = scale * load(s[d]);
  }
  for (int64_t d = 0; d < dim; ++d) std::fill(dst + d * ld + rows, dst + d * ld + lanes, A(0));
}

// dst[d] = store<T>(scale * src[d]) for d < dim.
template <typename T, typename A>
void store_row(const A* src, int64_t dim, A scale, T* dst) {
  constexpr int W = kLanes<A>;
  int64_t d = 0;
  if constexpr (std::is_same_v<A, float>)
    for (; d + W <= dim; d += W) vmath::store_lanes(dst + d, vload<VecF>(src + d) * splat<VecF>(scale));
  for (; d < dim; ++d) dst[d] = store<T>(scale * src[d]);
}

// sum_d a[d] * load(b[d]) over d < dim, in W lane-wise partial sums.
template <typename A, typename T>
A dot_row(const A* a, const T* b, int64_t dim) {
  using V = Vec<A>;
  constexpr int W = kLanes<A>;
  V acc{};
  int64_t d = 0;
  for (; d + W <= dim; d += W) {
    V x;
    if constexpr (std::is_same_v<A, float>) x = vmath::load_lanes(b + d);
    else x = vload<V>(b + d);
    acc = vfma(vload<V>(a + d), x, acc);
  }
  A sum = A(0);
  for (int l = 0; l < W; ++l) sum += acc[l];
  for (; d < dim; ++d) sum += a[d] * load(b[d]);
  return sum;
}

}  // namespace oxijax::cpu::simd
