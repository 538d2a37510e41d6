// Reductions of x viewed as [outer, axis, inner] over the middle dim. The op is chosen
// once; the loops call Reducer<op> (oxijax/math.h) and accumulate in Acc<T>.
//
// Accuracy: sums are blocked and pairwise, as XLA's float32 tree reductions are. A
// block is folded with many independent accumulators (which also makes the loop
// vectorise), and blocks are combined pairwise, so the rounding error grows like
// log2(n) rather than n. The blocking depends only on the shape, never on the number
// of threads, so results are reproducible.
//
// inner == 1: each row is contiguous; rows run in parallel, and a long row is cut
//   into fixed-size chunks whose partial results are combined afterwards.
// inner > 1: for each outer index, the axis rows are folded into an accumulator
//   vector over a tile of inner (vectorised along inner, reading contiguous runs);
//   tasks are outer x inner tiles (x axis chunks when there are too few of those).
//   An inner narrower than a vector is widened by folding several consecutive rows
//   as one wider row and combining the lanes at the end (or, for a short axis, folded
//   by a loop unrolled for that inner). x is never transposed.
//
// Loops call R::combine(new value, accumulator): the combines are commutative, and
// with the accumulator second the NaN test of nan_max / nan_min falls on the loaded
// value, off the loop-carried dependency chain (MAX/MIN run ~1.5x faster).
#include <algorithm>
#include <cstdint>
#include <memory>
#include <utility>
#include <vector>

#include "kernels.h"
#include "oxijax/math.h"

namespace oxijax::cpu {
namespace {

// Elements per parallel task at least: smaller problems run on the calling thread.
constexpr int64_t kGrain = int64_t{1} << 16;
// inner == 1: elements folded by the independent accumulators before the pairwise tree.
constexpr int64_t kBlock = 4096;
// inner == 1: a longer row is reduced in parallel chunks of this many elements.
constexpr int64_t kRowChunk = int64_t{1} << 17;
// inner > 1: axis rows folded into one accumulator vector before the pairwise tree;
// inner tile width (accumulators kept in L1).
constexpr int64_t kRowBlock = 64;
constexpr int64_t kTile = 1024;
// inner > 1: axis rows combined per pass over the accumulator vector.
constexpr int64_t kRowsPerPass = 8;
// inner > 1: fewer outer x tile tasks than this also splits the axis.
constexpr int64_t kMinTasks = 8;

// Independent accumulators of the row kernel: four 512-bit vectors.
template <typename A> constexpr int kLanes = static_cast<int>(256 / sizeof(A));

// ------------------------------------------------------------ inner == 1

// Fold of x[0, n), n <= kBlock, with kLanes independent accumulators.
template <typename T, typename R>
Acc<T> row_block(const T* x, int64_t n) {
  using A = Acc<T>;
  constexpr int K = kLanes<A>, k = K / 4;
  A tail = R::template identity<A>();
  int64_t i = 0;
  if (n < k) {  // short rows: a plain fold
    for (; i < n; ++i) tail = R::combine(tail, A(load(x[i])));
    return tail;
  }
  A acc[K];
  for (int j = 0; j < K; ++j) acc[j] = R::template identity<A>();
  for (; i + K <= n; i += K) {
    for (int j = 0; j < K; ++j) acc[j] = R::combine(A(load(x[i + j])), acc[j]);
  }
  for (; i + k <= n; i += k) {  // one vector at a time
    for (int j = 0; j < k; ++j) acc[j] = R::combine(A(load(x[i + j])), acc[j]);
  }
  for (; i < n; ++i) tail = R::combine(tail, A(load(x[i])));
  for (int w = K / 2; w > 0; w /= 2) {
    for (int j = 0; j < w; ++j) acc[j] = R::combine(acc[j], acc[j + w]);
  }
  return R::combine(acc[0], tail);
}

// Pairwise fold of x[0, n) over blocks of kBlock elements.
template <typename T, typename R>
Acc<T> row_fold(const T* x, int64_t n) {
  if (n <= kBlock) return row_block<T, R>(x, n);
  const int64_t half = (n / kBlock + 1) / 2 * kBlock;  // kBlock <= half < n
  const Acc<T> lo = row_fold<T, R>(x, half);
  return R::combine(lo, row_fold<T, R>(x + half, n - half));
}

// Pairwise fold of p[0, n), n >= 1.
template <typename A, typename R>
A tree_fold(const A* p, int64_t n, int64_t stride = 1) {
  if (n == 1) return p[0];
  const int64_t half = n / 2;
  return R::combine(tree_fold<A, R>(p, half, stride),
                    tree_fold<A, R>(p + half * stride, n - half, stride));
}

template <typename T, typename R>
void reduce_rows(const Parallel& par, int64_t outer, int64_t axis, const T* x, T* out) {
  using A = Acc<T>;
  if (axis <= kRowChunk) {
    par.for_range(outer, std::max<int64_t>(1, kGrain / axis), [&](int64_t begin, int64_t end) {
      for (int64_t o = begin; o < end; ++o)
        out[o] = store<T>(R::finish(row_fold<T, R>(x + o * axis, axis), axis));
    });
    return;
  }
  const int64_t chunks = (axis + kRowChunk - 1) / kRowChunk;
  std::unique_ptr<A[]> partial(new A[outer * chunks]);
  par.for_range(outer * chunks, 1, [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) {
      const int64_t o = t / chunks, start = (t % chunks) * kRowChunk;
      partial[t] = row_fold<T, R>(x + o * axis + start, std::min(kRowChunk, axis - start));
    }
  });
  for (int64_t o = 0; o < outer; ++o)
    out[o] = store<T>(R::finish(tree_fold<A, R>(partial.get() + o * chunks, chunks), axis));
}

// ------------------------------------------------------------ inner > 1

// acc[j] = fold over r < rows (rows <= kRowBlock) of x[r * stride + j], j < w.
// Several rows per pass over acc, combined as a small tree: fewer acc loads and
// stores, no long dependency chains, and more independent loads in flight.
template <typename T, typename R>
void col_block(const T* x, int64_t stride, int64_t rows, int64_t w, Acc<T>* acc) {
  using A = Acc<T>;
  for (int64_t j = 0; j < w; ++j) acc[j] = R::template identity<A>();
  int64_t r = 0;
  for (; r + kRowsPerPass <= rows; r += kRowsPerPass) {
    const T* x0 = x + r * stride;
    const T* x1 = x0 + stride;
    const T* x2 = x1 + stride;
    const T* x3 = x2 + stride;
    const T* x4 = x3 + stride;
    const T* x5 = x4 + stride;
    const T* x6 = x5 + stride;
    const T* x7 = x6 + stride;
    for (int64_t j = 0; j < w; ++j) {
      const A v01 = R::combine(A(load(x0[j])), A(load(x1[j])));
      const A v23 = R::combine(A(load(x2[j])), A(load(x3[j])));
      const A v45 = R::combine(A(load(x4[j])), A(load(x5[j])));
      const A v67 = R::combine(A(load(x6[j])), A(load(x7[j])));
      acc[j] = R::combine(R::combine(R::combine(v01, v23), R::combine(v45, v67)), acc[j]);
    }
  }
  for (; r < rows; ++r) {
    const T* xr = x + r * stride;
    for (int64_t j = 0; j < w; ++j) acc[j] = R::combine(A(load(xr[j])), acc[j]);
  }
}

template <typename A, typename R>
void combine_into(A* acc, const A* other, int64_t w) {
  for (int64_t j = 0; j < w; ++j) acc[j] = R::combine(acc[j], other[j]);
}

// Slots of w accumulators that col_fold needs for `rows` rows.
inline int64_t fold_slots(int64_t rows) {
  int64_t blocks = (rows + kRowBlock - 1) / kRowBlock, slots = 2;
  while (blocks > 1) blocks >>= 1, ++slots;
  return slots;
}

// slots[0, w) = fold over r < rows of x[r * stride + j]: blocks of kRowBlock rows,
// combined pairwise with a binary-counter stack in slots (fold_slots(rows) * w).
template <typename T, typename R>
void col_fold(const T* x, int64_t stride, int64_t rows, int64_t w, Acc<T>* slots) {
  using A = Acc<T>;
  if (rows == 0) {
    for (int64_t j = 0; j < w; ++j) slots[j] = R::template identity<A>();
    return;
  }
  int level[64];
  int top = 0;
  for (int64_t start = 0; start < rows; start += kRowBlock) {
    col_block<T, R>(x + start * stride, stride, std::min(kRowBlock, rows - start), w,
                    slots + top * w);
    level[top++] = 0;
    while (top >= 2 && level[top - 1] == level[top - 2]) {
      combine_into<A, R>(slots + (top - 2) * w, slots + (top - 1) * w, w);
      ++level[top - 2];
      --top;
    }
  }
  for (; top >= 2; --top) combine_into<A, R>(slots + (top - 2) * w, slots + (top - 1) * w, w);
}

// inner < 16 and a short axis: one small accumulator per outer index, the inner
// length a compile-time constant so the row loop unrolls.
template <typename T, typename R, int kInner>
void narrow_rows(const T* x, int64_t axis, T* out, int64_t begin, int64_t end) {
  using A = Acc<T>;
  for (int64_t o = begin; o < end; ++o) {
    const T* xo = x + o * axis * kInner;
    A acc[kInner];
    for (int i = 0; i < kInner; ++i) acc[i] = R::template identity<A>();
    for (int64_t a = 0; a < axis; ++a)
      for (int i = 0; i < kInner; ++i) acc[i] = R::combine(acc[i], A(load(xo[a * kInner + i])));
    for (int i = 0; i < kInner; ++i) out[o * kInner + i] = store<T>(R::finish(acc[i], axis));
  }
}

template <typename T, typename R, int... kInner>
void reduce_narrow_impl(const Parallel& par, int64_t outer, int64_t axis, int64_t inner,
                        const T* x, T* out, std::integer_sequence<int, kInner...>) {
  using Fn = void (*)(const T*, int64_t, T*, int64_t, int64_t);
  static constexpr Fn fns[] = {&narrow_rows<T, R, kInner + 2>...};
  const Fn fn = fns[inner - 2];
  par.for_range(outer, std::max<int64_t>(1, kGrain / (axis * inner)),
                [&](int64_t begin, int64_t end) { fn(x, axis, out, begin, end); });
}

template <typename T, typename R>
void reduce_narrow(const Parallel& par, int64_t outer, int64_t axis, int64_t inner,
                   const T* x, T* out) {
  reduce_narrow_impl<T, R>(par, outer, axis, inner, x, out, std::make_integer_sequence<int, 14>());
}

template <typename T, typename R>
void reduce_cols(const Parallel& par, int64_t outer, int64_t axis, int64_t inner, const T* x,
                 T* out) {
  using A = Acc<T>;
  // A narrow inner is widened: `group` consecutive rows form one row of `width`
  // (a multiple of 16 lanes, >= 64), and the group's lanes are combined at the end.
  int64_t group = 1, width = inner;
  if (inner < 16) {
    int64_t lcm = inner;
    while (lcm % 16 != 0) lcm += inner;
    int64_t wide = lcm;
    while (wide < 64) wide *= 2;
    if (axis < 4 * (wide / inner)) return reduce_narrow<T, R>(par, outer, axis, inner, x, out);
    width = wide;
    group = wide / inner;
  }
  // Inner tiles of similar width (16-lane multiples where possible).
  const int64_t tiles = (width + kTile - 1) / kTile;
  int64_t tile_w = (width + tiles - 1) / tiles;
  tile_w = std::min(width, (tile_w + 15) / 16 * 16);
  const int64_t base = outer * tiles;
  // Axis chunks (in units of whole groups) when there are too few tasks.
  int64_t chunk_rows = axis;
  if (base < kMinTasks) {
    const int64_t want = (kMinTasks + base - 1) / base;
    const int64_t unit = kRowBlock * group;
    chunk_rows = std::max(unit, ((axis + want - 1) / want + unit - 1) / unit * unit);
    chunk_rows = std::min(chunk_rows, axis);
  }
  const int64_t chunks = (axis + chunk_rows - 1) / chunk_rows;
  const int64_t tasks = base * chunks;
  std::unique_ptr<A[]> partial;  // [outer, chunks, inner] when chunks > 1
  if (chunks > 1) partial.reset(new A[outer * chunks * inner]);
  const int64_t slots = fold_slots(chunk_rows / group + 1);
  const int64_t task_elems = std::max<int64_t>(1, chunk_rows * std::min(tile_w, inner));

  par.for_range(tasks, std::max<int64_t>(1, kGrain / task_elems), [&](int64_t begin, int64_t end) {
    std::unique_ptr<A[]> scratch(new A[slots * tile_w]);
    A* acc = scratch.get();
    for (int64_t t = begin; t < end; ++t) {
      const int64_t c = t % chunks, tile = (t / chunks) % tiles, o = t / chunks / tiles;
      const int64_t r0 = c * chunk_rows, rows = std::min(chunk_rows, axis - r0);
      const T* xo = x + (o * axis + r0) * inner;
      A* dst_acc = chunks > 1 ? partial.get() + (o * chunks + c) * inner : nullptr;
      if (group == 1) {
        const int64_t c0 = tile * tile_w, w = std::min(tile_w, inner - c0);
        col_fold<T, R>(xo + c0, inner, rows, w, acc);
        if (dst_acc) {
          std::copy(acc, acc + w, dst_acc + c0);
        } else {
          T* dst = out + o * inner + c0;
          for (int64_t j = 0; j < w; ++j) dst[j] = store<T>(R::finish(acc[j], axis));
        }
      } else {
        const int64_t full = rows / group, rem = rows - full * group;
        col_fold<T, R>(xo, width, full, width, acc);
        const T* tail = xo + full * width;
        for (int64_t j = 0; j < rem * inner; ++j) acc[j] = R::combine(acc[j], A(load(tail[j])));
        for (int64_t i = 0; i < inner; ++i) {
          const A v = tree_fold<A, R>(acc + i, group, inner);
          if (dst_acc) dst_acc[i] = v;
          else out[o * inner + i] = store<T>(R::finish(v, axis));
        }
      }
    }
  });
  if (chunks > 1) {
    for (int64_t o = 0; o < outer; ++o)
      for (int64_t i = 0; i < inner; ++i)
        out[o * inner + i] =
            store<T>(R::finish(tree_fold<A, R>(partial.get() + o * chunks * inner + i, chunks, inner), axis));
  }
}

template <typename T, ReduceOp op>
void reduce_op(const Parallel& par, const ReduceShape& shape, const T* x, T* out) {
  using R = Reducer<op>;
  using A = Acc<T>;
  const int64_t outer = shape.outer, axis = shape.axis, inner = shape.inner;
  if (outer <= 0 || inner <= 0) return;
  if (axis <= 0) {
    const T v = store<T>(R::finish(R::template identity<A>(), 0));
    std::fill(out, out + outer * inner, v);
    return;
  }
  if (inner == 1) reduce_rows<T, R>(par, outer, axis, x, out);
  else reduce_cols<T, R>(par, outer, axis, inner, x, out);
}

}  // namespace

template <typename T>
void reduce(const Parallel& par, ReduceOp op, const ReduceShape& shape, const T* x, T* out) {
  switch (op) {
    case ReduceOp::SUM: return reduce_op<T, ReduceOp::SUM>(par, shape, x, out);
    case ReduceOp::MAX: return reduce_op<T, ReduceOp::MAX>(par, shape, x, out);
    case ReduceOp::MIN: return reduce_op<T, ReduceOp::MIN>(par, shape, x, out);
    case ReduceOp::MEAN: return reduce_op<T, ReduceOp::MEAN>(par, shape, x, out);
  }
}

#define OXIJAX_INSTANTIATE(T) \
  template void reduce<T>(const Parallel&, ReduceOp, const ReduceShape&, const T*, T*);
OXIJAX_FOR_EACH_DTYPE(OXIJAX_INSTANTIATE)
#undef OXIJAX_INSTANTIATE

}  // namespace oxijax::cpu
