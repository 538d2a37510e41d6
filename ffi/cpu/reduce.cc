// Reductions of x viewed as [outer, axis, inner] over the middle dim. The op is chosen
// once; the loops apply Reducer<op> (oxijax/math.h), on SIMD vectors lane by lane where
// they can, and accumulate in Acc<T>; half types are widened in registers.
//
// Accuracy: sums are blocked and pairwise, as XLA's float32 tree reductions are. A
// block is folded with many independent accumulators, and blocks are combined
// pairwise, so the rounding error grows like log2(n) rather than n. The blocking
// depends only on the shape, never on the number of threads or the instruction set
// (the same lanes on every target), so results are reproducible.
//
// inner == 1: each row is contiguous. Rows are folded eight at a time, side by side (one
//   core reads memory much faster from several sequential streams than from one; rows of
//   at most 4 KiB sixteen at a time, one after the other, as are all rows of a MAX / MIN
//   whose x fits the L3), each with a vector of accumulators and a horizontal reduce at
//   the end of a block (several rows' lanes merged); a long row is cut into fixed-size
//   chunks, folded eight at a time the same way, and combined afterwards. MAX / MIN are
//   exact, so they skip the blocking; on float16 / bfloat16 they compare integer keys of
//   the raw bits, twice the lanes of a float compare.
// inner > 1: for each outer index, the axis rows are folded into an accumulator
//   vector over a tile of inner (vectorised along inner, reading contiguous runs);
//   tasks are outer x inner tiles (x axis chunks when there are too few of those).
//   An inner narrower than a vector is widened by folding several consecutive rows
//   as one wider row and combining the lanes at the end (or, for a short axis, folded
//   by a loop unrolled for that inner). x is never transposed.
//
// Loops combine (new value, accumulator): the combines are commutative, and with the
// accumulator second the NaN test of nan_max / nan_min falls on the loaded value, off
// the loop-carried dependency chain.
#include <algorithm>
#include <array>
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <utility>
#include <vector>

#include "cache_info.h"
#include "half_convert.h"
#include "kernels.h"
#include "oxijax/math.h"
#include "scratch.h"
#include "simd.h"

namespace oxijax::cpu {
namespace {

// Elements per parallel task at least: smaller problems run on the calling thread.
constexpr int64_t kGrain = int64_t{1} << 16;
// inner == 1: elements folded by the independent accumulators before the pairwise tree
// (256 per float32 lane). Each block costs a fixed ~250 cycles besides its loads: with
// 1024 (64 per lane) a 1 Mi-element float32 sum on one Zen 4 core took 65 us, with 4096
// 58 us (XLA: 68), and bfloat16 53 -> 48 us (XLA: 47).
constexpr int64_t kBlock = 4096;
// inner == 1: a longer row is reduced in parallel chunks of this many elements (128 KiB
// of float32: a 16 Mi-element sum is 64 tasks of eight chunks, a few for each of 16
// threads, so that one late thread does not hold up the rest).
constexpr int64_t kRowChunk = int64_t{1} << 15;
// inner > 1: axis rows folded into one accumulator vector before the pairwise tree;
// inner tile width (accumulators kept in L1).
constexpr int64_t kRowBlock = 64;
constexpr int64_t kTile = 1024;
// inner > 1: axis rows combined per pass over the accumulator vector.
constexpr int64_t kRowsPerPass = 8;
// inner > 1: fewer outer x tile tasks than this also splits the axis. A constant (the
// summation order must not depend on the thread count) that gives every thread of a
// 16-thread machine several tasks: 4096 x 4096 over axis 0 is 4 tiles x 16 axis chunks.
constexpr int64_t kMinTasks = 64;

// inner == 1: accumulator lanes per row block: one 512-bit vector's worth on every target
// (two AVX2 vectors, four SSE ones), so that every build sums in the same order.
template <typename A> constexpr int kRowLanes = static_cast<int>(64 / sizeof(A));
// inner == 1: rows (or row chunks) folded together. Each is a sequential stream; one
// core reads memory ~1.7x faster from eight streams at once than from one (Zen 3).
constexpr int kStreams = 8;
// inner == 1: rows of at most kShortRowBytes folded per call (one after the other, their
// lanes merged 16 rows to a vector on AVX-512 float32; fold_lanes_of_rows): each call
// has a fixed cost. One Zen 4 core, max over 65536 x 16 float32 rows: 265 us with 8 per
// call, 234 with 16 (XLA: 137).
constexpr int kShortStreams = 16;
// inner == 1: ranges of at most this many bytes are read one after the other, not side
// by side: streams of a few cache lines each are too short for the prefetchers, and
// eight of them side by side made rows of 64 to 1024 float32 0.7-0.9x XLA's speed on
// one Zen 4 core (16384 x 64 summed over rows: 124 -> 103 us, XLA 91). Longer rows stay
// side by side, as measured on Zen 3 (on the Zen 4, rows of 4096 float32 one after the
// other were ~5 % faster still; not measured on Zen 3). MAX / MIN of an x that fits the
// L3 read every range one after the other (sequential_bytes).
constexpr int64_t kShortRowBytes = 4096;
// inner == 1: MAX / MIN prefetch each stream this many bytes ahead of its loads. The
// hardware prefetchers stop at every 4 KiB page, where a stream read on its own (MAX /
// MIN of an x that fits the L3) then waits. One core of the 2-core Xeon VM with AMX,
// avx512, 64-byte aligned x, us, without -> with: bfloat16 4096 x 4096 1250-1290 ->
// 1170-1210 (XLA ~1200), 16384 x 256 311-319 -> 287, 16384 x 100 153 -> 117-121,
// 65536 x 24 237-242 -> 245; float32 16384 x 256 630 -> 579, 65536 x 24 283-292 ->
// 225-231, 4096 x 4096 (side by side) 2525-2666 -> 2455-2509. 1 KiB and 4 KiB ahead
// did about as well. The sums gained on float32 (8-12 % on 4096 x 4096) but lost on
// bfloat16 (6-8 %), and do without. Not measured on an AMD core.
constexpr int64_t kPrefetchBytes = 2048;

// ------------------------------------------------------------ SIMD lanes

// Reducer<op>::combine lane by lane on simd.h's vectors: the same results (nan_max /
// nan_min keep the first operand where it wins or is NaN). Written so that x86 gets one
// max / min instruction (which returns its second operand on NaN) and one NaN select.
template <ReduceOp op> struct LaneCombine {  // SUM, MEAN
  template <typename V> static V combine(V a, V b) { return a + b; }
};
template <> struct LaneCombine<ReduceOp::MAX> {
  template <typename V> static V combine(V a, V b) { return a != a ? a : vmath::max_or_second(a, b); }
};
template <> struct LaneCombine<ReduceOp::MIN> {
  template <typename V> static V combine(V a, V b) { return a != a ? a : vmath::min_or_second(a, b); }
};
template <typename R> struct LanesOf;
template <ReduceOp op> struct LanesOf<Reducer<op>> { using type = LaneCombine<op>; };

// One vector of x's values in Acc<T>, widened in registers.
template <typename T> simd::Vec<Acc<T>> load_vec(const T* x) {
  if constexpr (std::is_same_v<T, double>) return simd::vload<simd::VecD>(x);
  else return vmath::load_lanes(x);
}

// ------------------------------------------------------------ inner == 1

// v with lane j combined with lane j + w, for w = width, width / 2, ..., 1: lane 0 holds
// the pairwise fold of v's lanes. In registers, one shuffle per step: a store and a
// scalar tree per row made short rows slow (4096 x 256 float32 summed over rows in 86
// instead of 73 us on one Zen 4 core; XLA 68).
template <int width, typename V, int... j>
V lanes_from(V v, std::integer_sequence<int, j...>) {  // lane j = v[j + width], wrapped
  return __builtin_shufflevector(v, v, ((j + width) % int(sizeof...(j)))...);
}
template <int width, typename V, typename Combine>
V fold_lanes(V v, Combine combine) {
  if constexpr (width == 0) {
    return v;
  } else {
    constexpr int W = sizeof(V) / sizeof(v[0]);
    const V upper = lanes_from<width>(v, std::make_integer_sequence<int, W>());
    return fold_lanes<width / 2>(combine(v, upper), combine);
  }
}

// Lanes g / 2 wide from each group of g lanes of a, then of b: the lower half of each
// group (offset 0) or the upper half (offset g / 2).
template <int g, int offset, typename V, int... k>
V group_halves(V a, V b, std::integer_sequence<int, k...>) {
  constexpr int W = sizeof...(k), h = g / 2, groups = W / g;
  return __builtin_shufflevector(
      a, b, ((k / h < groups ? 0 : W - groups * g) + k / h * g + offset + k % h)...);
}

// Lanes 0, step, 2 * step, ... of v as a vector of sizeof...(r) lanes.
template <int step, typename V, int... r>
auto lanes_every(V v, std::integer_sequence<int, r...>) {
  return __builtin_shufflevector(v, v, (r * step)...);
}

// v[0, n), each holding W / g rows in groups of g lanes, merged pairwise (rows in order)
// while each group's lower half is combined with its upper half, down to one vector; then
// each group folded in place. Row r's fold is in lane r * (W / n) of the result.
template <int g, int n, typename V, typename Combine>
V merge_rows(V* v, Combine combine) {
  if constexpr (n == 1) {
    return fold_lanes<g / 2>(v[0], combine);
  } else {
    constexpr auto k = std::make_integer_sequence<int, int(sizeof(V) / sizeof(v[0][0]))>();
    for (int i = 0; i < n / 2; ++i)
      v[i] = combine(group_halves<g, 0>(v[2 * i], v[2 * i + 1], k),
                     group_halves<g, g / 2>(v[2 * i], v[2 * i + 1], k));
    return merge_rows<g / 2, n / 2>(v, combine);
  }
}

// out[s] = finish(lane 0 of fold_lanes<W / 2>(v[s], combine)) for s < S (finish: lane by
// lane on a vector), with the same pairings (so the same bits), up to W rows at once:
// two shuffles and a combine merge two rows' halves into one vector, so W rows take
// about W combines, where row by row they took W chains of log2(W) shuffle-and-combine
// steps; the results leave in one vector store (scalar reads of a 512-bit store stall:
// it does not forward to them). v is overwritten.
template <typename V, int S, typename Combine, typename E, typename Finish>
void fold_lanes_of_rows(V (&v)[S], Combine combine, E* out, Finish finish) {
  constexpr int W = sizeof(V) / sizeof(E), B = S < W ? S : W;
  for (int s0 = 0; s0 < S; s0 += B) {
    const V merged = finish(merge_rows<W, B>(v + s0, combine));
    simd::vstore(out + s0, lanes_every<W / B>(merged, std::make_integer_sequence<int, B>()));
  }
}

// acc[s] = init, then step(acc[s], s, i) for every range s < S and i = 0, K, ... < full,
// then last(acc[s], s): ranges of at most sequential_bytes one after the other (each
// one's accumulators in registers for its run), longer ones side by side, a step of each
// in turn.
template <int S, int K, typename Acc, typename Step, typename Last>
void for_steps(int64_t full, int64_t range_bytes, int64_t sequential_bytes, const Acc& init,
               Acc (&acc)[S], Step step, Last last) {
  if (range_bytes <= sequential_bytes) {
    for (int s = 0; s < S; ++s) {
      Acc a = init;
      for (int64_t i = 0; i < full; i += K) step(a, s, i);
      last(a, s);
      acc[s] = a;
    }
  } else {
    for (Acc& a : acc) a = init;
    for (int64_t i = 0; i < full; i += K)
      for (int s = 0; s < S; ++s) step(acc[s], s, i);
    for (int s = 0; s < S; ++s) last(acc[s], s);
  }
}

template <typename R>
constexpr bool kExtremum = std::is_same_v<R, Reducer<ReduceOp::MAX>> ||
                           std::is_same_v<R, Reducer<ReduceOp::MIN>>;

// MAX / MIN of float16 / bfloat16 on integer keys, twice the lanes of a float compare and
// nothing widened. The bits of x with the magnitude flipped where the sign is set order
// as the values do, as int16 (-0 just below +0); for MIN those are complemented, which
// reverses the order. Adding the bits of +inf plus one then moves the key of MAX's
// identity -inf (MIN's +inf) to 0 and, as uint16, every NaN (of either sign) above the
// other infinity's. So an unsigned max, one instruction, takes a NaN over anything as
// nan_max / nan_min do, with no NaN test per element: one Zen 4 core, 16384 bfloat16
// rows of 64 / 128, max 76 / 104 -> 67 / 90 us (XLA 63 / 82).
template <typename T> constexpr uint16_t kInfBits = std::is_same_v<T, bfloat16> ? 0x7f80 : 0x7c00;
template <typename T> constexpr uint16_t kKeyOffset = kInfBits<T> + 1;
template <typename R>
constexpr uint16_t kKeyFlip = std::is_same_v<R, Reducer<ReduceOp::MIN>> ? 0xffff : 0;

template <typename V> struct Signed16 {
  typedef int16_t type __attribute__((vector_size(sizeof(V))));
};

// v with the magnitude bits flipped where the sign is set: its own inverse.
template <typename V>
V flip_negative(V v) {
  const auto s = reinterpret_cast<typename Signed16<V>::type>(v);
  return reinterpret_cast<V>(s ^ ((s >> 15) & 0x7fff));
}

// The keys of a vector of 16-bit float bits, and back (a NaN to T's quiet NaN).
template <typename T, typename R, typename V>
V extremum_key(V bits) {
  return (flip_negative(bits) ^ kKeyFlip<R>) + kKeyOffset<T>;
}
template <typename T, typename R, typename V>
V extremum_bits(V key) {
  constexpr uint16_t kQuietNan = std::is_same_v<T, bfloat16> ? 0x7fc0 : 0x7e00;
  const V bits = flip_negative((key - kKeyOffset<T>) ^ kKeyFlip<R>);
  return key > uint16_t(2 * kInfBits<T> + 1) ? V{} + kQuietNan : bits;
}

// dst[0, n) = src[0, n) for 2 <= n * sizeof(T) < 64 bytes by a few overlapping copies
// of a fixed size, at most a vector (no call, no loop over the elements).
template <int kSize> struct Chunk {
  typedef char type __attribute__((vector_size(kSize)));
};
template <typename T>
void copy_short(const T* src, int64_t n, T* dst) {
  const int64_t bytes = n * int64_t(sizeof(T));
  const char* from = reinterpret_cast<const char*>(src);
  char* to = reinterpret_cast<char*>(dst);
  const auto copy = [&](auto size) {
    using C = typename Chunk<decltype(size)::value>::type;
    constexpr int64_t kSize = sizeof(C);
    for (int64_t at = 0; at < bytes - kSize; at += kSize)
      simd::vstore(to + at, simd::vload<C>(from + at));
    simd::vstore(to + bytes - kSize, simd::vload<C>(from + bytes - kSize));
  };
  if constexpr (simd::kVecBytes >= 32) {
    if (bytes >= 32) return copy(std::integral_constant<int, 32>());
  }
  if (bytes >= 16) copy(std::integral_constant<int, 16>());
  else if (bytes >= 8) copy(std::integral_constant<int, 8>());
  else if (bytes >= 4) copy(std::integral_constant<int, 4>());
  else copy(std::integral_constant<int, 2>());
}

// The lanes fold_extremum compares: integer keys for float16 / bfloat16, else the values.
template <typename T> using ExtremumLane = std::conditional_t<sizeof(T) == 2, uint16_t, T>;

// A 16-byte vector whose lanes are all elements of p[0, n) (some twice), for n shorter
// than that vector: two overlapping loads of 8 or 4 bytes, or one element repeated.
template <typename V, typename T>
V cover_short(const T* p, int64_t n) {
  typedef uint64_t Words __attribute__((vector_size(16)));
  const char* first = reinterpret_cast<const char*>(p);
  const char* last = first + n * int64_t(sizeof(T));
  uint64_t lo, hi;
  if (last - first >= 8) {
    std::memcpy(&lo, first, 8);
    std::memcpy(&hi, last - 8, 8);
  } else if (last - first >= 4) {
    uint32_t a, b;
    std::memcpy(&a, first, 4);
    std::memcpy(&b, last - 4, 4);
    lo = hi = a | uint64_t(b) << 32;
  } else {  // one 16-bit element
    uint16_t a;
    std::memcpy(&a, first, 2);
    lo = hi = a * 0x0001000100010001ull;
  }
  const Words words = {lo, hi};
  V v;
  std::memcpy(&v, &words, 16);
  return v;
}

// out[s] = MAX / MIN of x[s][0, n) for S ranges at once, in vectors of kBytes. Both are
// exact and idempotent, so a row's last vector may overlap the one before it, and a row
// shorter than a vector takes vectors half as wide (down to 16 bytes, filled by
// cover_short): no tail element by element and no padded copy. One Zen 4 core, 65536
// rows, us, element by element -> padded with the identity -> overlapping (XLA):
// float32 x 24 2010 -> 308 -> 198 (153), x 7 1600 -> 273 -> 114 (136); bfloat16 x 24
// 519 (scalar tail) -> 175 (161), x 7 464 -> 132 (158).
// float16 / bfloat16 compare integer keys (extremum_key), twice the lanes of a float
// compare, and nothing is widened; floats compare with nan_max / nan_min's NaN rule.
template <typename T, typename R, int S, int kBytes = simd::kVecBytes>
void fold_extremum(const T* const* x, int64_t n, int64_t sequential_bytes, Acc<T>* out) {
  using E = ExtremumLane<T>;
  typedef E VecE __attribute__((vector_size(kBytes)));
  constexpr int W = kBytes / int(sizeof(E));
  if constexpr (kBytes > 16) {
    if (n < W) return fold_extremum<T, R, S, kBytes / 2>(x, n, sequential_bytes, out);
  }
  constexpr bool kKeys = sizeof(T) == 2;
  const auto better = [](auto a, auto b) {
    if constexpr (kKeys) return a > b ? a : b;  // unsigned (MIN's keys reversed)
    else return LanesOf<R>::type::combine(a, b);  // nan_max / nan_min's NaN rule
  };
  const auto lanes = [](VecE v) {
    if constexpr (kKeys) return extremum_key<T, R>(v);
    else return v;
  };
  VecE acc[S];
  if (n < W) {  // only at 16 bytes
    for (int s = 0; s < S; ++s) acc[s] = lanes(cover_short<VecE>(x[s], n));
  } else {
    E identity = 0;  // the keys' (-inf's or, for MIN, +inf's)
    if constexpr (!kKeys) identity = R::template identity<T>();
    // Vectors at 0, W, 2W, ..., the last one ending at n (a separate last step was slower:
    // 16384 float32 rows of 100 on one Zen 4 core, 118 -> 125 us).
    for_steps<S, W>(
        (n + W - 1) / W * W, n * int64_t(sizeof(T)), sequential_bytes, VecE{} + identity, acc,
        [&](VecE& a, int s, int64_t i) {
          __builtin_prefetch(reinterpret_cast<const char*>(x[s] + i) + kPrefetchBytes);
          a = better(lanes(simd::vload<VecE>(x[s] + std::min(i, n - W))), a);
        },
        [](VecE&, int) {});
  }
  if constexpr (kKeys) {
    // Keys back to T's bits on the merged vector, and widened to floats a vector at a
    // time, not row by row.
    uint16_t keys[S];
    fold_lanes_of_rows(acc, better, keys, [](VecE key) { return extremum_bits<T, R>(key); });
    const T* values = reinterpret_cast<const T*>(keys);
    constexpr int L = simd::kLanes<float>;
    int s = 0;
    for (; s + L <= S; s += L) simd::vstore(out + s, vmath::load_lanes(values + s));
    for (; s < S; ++s) out[s] = load(values[s]);
  } else {
    fold_lanes_of_rows(acc, better, out, [](VecE v) { return v; });
  }
}

// out[s] = sum of x[s][0, n) for S blocks at once (independent streams; MAX / MIN take
// fold_extremum). Each block: lane j of kRowLanes accumulators takes the elements j,
// j + kRowLanes, ..., and the lanes are combined pairwise (lane j with j + w, w =
// kRowLanes / 2, ..., 1). A partial last block is the block that ends at n, its lanes
// before the tail zeroed; a row shorter than a block is padded with zeros into one block
// (bfloat16) or folded in order (the other types).
// bfloat16 has twice the lanes: of each 2 * kRowLanes elements the even ones go to the
// first kRowLanes lanes, the odd ones to the others, which are combined first (lane j
// with j + kRowLanes). A shift and a mask of 32-bit words make them floats where
// widening in memory's order takes a shuffle per 16 elements: a 1 Mi-element sum on one
// Zen 4 core took 47 us, now 37 (XLA: 47).
template <typename T, typename R, int S>
void fold_blocks(const T* const* x, int64_t n, Acc<T>* out) {
  using A = Acc<T>;
  using V = simd::Vec<A>;
  using L = typename LanesOf<R>::type;
  constexpr bool kEvenOdd = std::is_same_v<T, bfloat16>;
  constexpr int K = kRowLanes<A> * (kEvenOdd ? 2 : 1), W = simd::kLanes<A>, NV = K / W;
  const int64_t full = n / K * K;
  std::array<V, NV> acc[S], init;
  init.fill(simd::splat<V>(R::template identity<A>()));
  // A block of K at p, without its elements below skip (kSkip): lane j of vector v holds
  // element v * W + j of the block, or (bfloat16) 2 (v * W + j) and, in the odd half,
  // that + 1.
  using Bits = std::conditional_t<sizeof(A) == 4, int32_t, int64_t>;
  typedef Bits VecBits __attribute__((vector_size(sizeof(V))));
  const auto step = [&](std::array<V, NV>& a, const T* p, auto kSkip, int64_t skip = 0) {
    const auto kept = [&](V v, int first, int every) {
      if constexpr (!decltype(kSkip)::value) {
        return v;
      } else {
        VecBits index;
        for (int j = 0; j < W; ++j) index[j] = first + every * j;
        const VecBits keep = index >= Bits(skip);  // true: all bits set
        return reinterpret_cast<V>(reinterpret_cast<VecBits>(v) & keep);
      }
    };
    if constexpr (kEvenOdd) {
      for (int v = 0; v < NV / 2; ++v) {
        const vmath::VecF2 words = vmath::load_bfloat16_even_odd(p + 2 * v * W);
        a[v] = L::combine(kept(words.lo, 2 * v * W, 2), a[v]);
        a[v + NV / 2] = L::combine(kept(words.hi, 2 * v * W + 1, 2), a[v + NV / 2]);
      }
    } else {
      for (int v = 0; v < NV; ++v) a[v] = L::combine(kept(load_vec(p + v * W), v * W, 1), a[v]);
    }
  };
  // A row of at least a block: its partial last block is the block that ends at n with
  // the elements before `full` dropped (+0 in their lanes, which turns a -0 sum into +0,
  // as an empty tail does), right after the row's other steps: one more vector step, not
  // a loop element by element (float16 / 32 / 64) or a padded copy (bfloat16). One Zen 4
  // core, 16384 rows of 100, us: float32 137 -> 121, bfloat16 135 -> 104 (XLA 113, 88).
  // bfloat16 rows shorter than a block are padded with zeros into one block, copied
  // before the loop, so that the stores have landed when the block is read (a vector load
  // right after the stores it spans is not forwarded): 65536 rows, x 16 690 -> 265-290 us,
  // x 24 1020 -> 290 (XLA 290-300). Other types fold such rows in order: as fast (float32
  // x 7: 190-230 either way).
  if (kEvenOdd && n < K) {
    T blocks[S][K];
    const T* padded[S];
    for (int s = 0; s < S; ++s) {
      std::memset(blocks[s], 0, sizeof(blocks[s]));  // a vector or two of stores
      copy_short(x[s], n, blocks[s]);
      padded[s] = blocks[s];
    }
    return fold_blocks<T, R, S>(padded, K, out);
  }
  if (n < K) {  // in order
    for (int s = 0; s < S; ++s) {
      A folded = R::template identity<A>();
      for (int64_t i = 0; i < n; ++i) folded = R::combine(folded, A(load(x[s][i])));
      out[s] = folded;
    }
    return;
  }
  for_steps<S, K>(
      full, n * int64_t(sizeof(T)), kShortRowBytes, init, acc,
      [&](std::array<V, NV>& a, int s, int64_t i) { step(a, x[s] + i, std::false_type()); },
      [&](std::array<V, NV>& a, int s) {
        if (full < n) step(a, x[s] + n - K, std::true_type(), K - (n - full));
      });
  V rows[S];
  for (int s = 0; s < S; ++s) {
    for (int w = NV / 2; w > 0; w /= 2)
      for (int v = 0; v < w; ++v) acc[s][v] = L::combine(acc[s][v], acc[s][v + w]);
    rows[s] = acc[s][0];
  }
  // + 0: a -0 sum becomes +0, as XLA's (its init value is +0).
  const V zero = simd::splat<V>(R::template identity<A>());
  fold_lanes_of_rows(rows, [](V a, V b) { return L::combine(a, b); }, out,
                     [&](V folded) { return L::combine(folded, zero); });
}

// Elements per block of fold_ranges: kBlock for sums; MAX and MIN are exact, so that
// any blocking gives the same value (up to the sign of a zero and the payload of a NaN),
// and the longest block (one kRowChunk) costs the least.
template <typename R> constexpr int64_t kFoldBlock = kExtremum<R> ? kRowChunk : kBlock;

// out[s] = pairwise fold of x[s][0, n) over blocks of kFoldBlock<R> elements, for S
// ranges of the same length at once; the tree depends only on n. MAX / MIN read ranges
// of at most sequential_bytes one after the other, longer ones side by side (for_steps);
// sums do so at kShortRowBytes.
template <typename T, typename R, int S>
void fold_ranges(const T* const* x, int64_t n, int64_t sequential_bytes, Acc<T>* out) {
  constexpr int64_t kB = kFoldBlock<R>;
  if (n <= kB) {
    if constexpr (kExtremum<R>) return fold_extremum<T, R, S>(x, n, sequential_bytes, out);
    else return fold_blocks<T, R, S>(x, n, out);
  }
  const int64_t half = (n / kB + 1) / 2 * kB;  // kB <= half < n
  const T* right[S];
  for (int s = 0; s < S; ++s) right[s] = x[s] + half;
  Acc<T> lo[S], hi[S];
  fold_ranges<T, R, S>(x, half, sequential_bytes, lo);
  fold_ranges<T, R, S>(right, n - half, sequential_bytes, hi);
  for (int s = 0; s < S; ++s) out[s] = R::combine(lo[s], hi[s]);
}

// Pairwise fold of p[0, n), n >= 1.
template <typename A, typename R>
A tree_fold(const A* p, int64_t n, int64_t stride = 1) {
  if (n == 1) return p[0];
  const int64_t half = n / 2;
  return R::combine(tree_fold<A, R>(p, half, stride),
                    tree_fold<A, R>(p + half * stride, n - half, stride));
}

// Folds the ranges start(u) .. start(u) + length(u) for u in [u0, u1): S at a time
// while they have the same length, the rest one by one; results(u, values, count) for
// each group of count consecutive units (sequential_bytes: see fold_ranges).
template <typename T, typename R, int S, typename Start, typename Length, typename Result>
void fold_units(const T* x, int64_t u0, int64_t u1, int64_t sequential_bytes, Start start,
                Length length, Result results) {
  const auto same_length = [&](int64_t u) {
    for (int s = 1; s < S; ++s)
      if (length(u + s) != length(u)) return false;
    return true;
  };
  int64_t u = u0;
  for (; u + S <= u1 && same_length(u); u += S) {
    const T* ranges[S];
    for (int s = 0; s < S; ++s) ranges[s] = x + start(u + s);
    Acc<T> values[S];
    fold_ranges<T, R, S>(ranges, length(u), sequential_bytes, values);
    results(u, values, S);
  }
  for (; u < u1; ++u) {
    const T* range = x + start(u);
    Acc<T> value;
    fold_ranges<T, R, 1>(&range, length(u), sequential_bytes, &value);
    results(u, &value, 1);
  }
}

// out[i] = store<T>(R::finish(values[i], axis)) for i < count: whole vectors at a time
// where Acc<T> is float (the same finish, MEAN's division, and rounding, lane by lane).
template <typename T, typename R>
void finish_rows(const Acc<T>* values, int count, int64_t axis, T* out) {
  int i = 0;
  if constexpr (std::is_same_v<Acc<T>, float>) {
    constexpr int W = simd::kLanes<float>;
    for (; i + W <= count; i += W) {
      simd::VecF v = simd::vload<simd::VecF>(values + i);
      if constexpr (std::is_same_v<R, Reducer<ReduceOp::MEAN>>)
        v = v / simd::splat<simd::VecF>(float(axis));
      vmath::store_lanes(out + i, v);
    }
  }
  for (; i < count; ++i) out[i] = store<T>(R::finish(values[i], axis));
}

// inner == 1: ranges of at most this many bytes are read one after the other, longer
// ones side by side. MAX / MIN of an x that fits the L3 read every range one after the
// other: from cache, one stream at a time was faster at every length, where from memory
// ranges of 16 KiB were as fast either way and chunks of 128 KiB side by side faster.
// One Zen 4 core, float32 max, us (XLA), side by side -> one after the other: 1024 x
// 4096 357-407 -> 305-315 (300-330); 2048 x 4096 1020-1200 -> 870-995 (860-1140); 1024
// x 8192 0.87 -> 0.96 of XLA; 128 x 65536 0.93-0.97 -> 1.03; from memory, 4096 x 4096
// 0.96-1.04 either way, 512 x 65536 1.15 -> 0.98. Sums side by side were faster from
// cache too (float32 2048 x 4096: 813-847 against 873-1006 us).
template <typename R>
int64_t sequential_bytes(int64_t x_bytes) {
  if (kExtremum<R> && x_bytes <= cache_sizes().l3) return INT64_MAX;
  return kShortRowBytes;
}

template <typename T, typename R>
void reduce_rows(const Parallel& par, int64_t outer, int64_t axis, const T* x, T* out) {
  using A = Acc<T>;
  const int64_t sequential = sequential_bytes<R>(outer * axis * int64_t(sizeof(T)));
  // Tasks of whole groups of kShortStreams rows (or chunks: two groups of kStreams).
  constexpr int64_t kGroup = kShortStreams;
  const auto for_groups = [&](int64_t units, int64_t grain, auto body) {
    const int64_t groups = (units + kGroup - 1) / kGroup;
    par.for_range(groups, std::max<int64_t>(1, grain / kGroup), [&](int64_t g0, int64_t g1) {
      body(g0 * kGroup, std::min(units, g1 * kGroup));
    });
  };
  if (axis <= kRowChunk) {
    for_groups(outer, kGrain / axis, [&](int64_t begin, int64_t end) {
      const auto fold = [&](auto streams) {
        fold_units<T, R, decltype(streams)::value>(
            x, begin, end, sequential, [axis](int64_t o) { return o * axis; },
            [axis](int64_t) { return axis; },
            [&](int64_t o, const A* v, int count) { finish_rows<T, R>(v, count, axis, out + o); });
      };
      const bool short_rows = axis * int64_t(sizeof(T)) <= kShortRowBytes;
      if (short_rows) fold(std::integral_constant<int, kShortStreams>());
      else fold(std::integral_constant<int, kStreams>());
    });
    return;
  }
  // Long rows: chunks of kRowChunk elements (the last one shorter) reduced in parallel,
  // then combined pairwise.
  const int64_t chunks = (axis + kRowChunk - 1) / kRowChunk;
  Scratch<A> partial(outer * chunks);
  for_groups(outer * chunks, 1, [&](int64_t begin, int64_t end) {
    fold_units<T, R, kStreams>(
        x, begin, end, sequential,
        [&](int64_t t) { return t / chunks * axis + t % chunks * kRowChunk; },
        [&](int64_t t) { return std::min(kRowChunk, axis - t % chunks * kRowChunk); },
        [&](int64_t t, const A* v, int count) { std::copy(v, v + count, partial.data() + t); });
  });
  for (int64_t o = 0; o < outer; ++o)
    out[o] = store<T>(R::finish(tree_fold<A, R>(partial.data() + o * chunks, chunks), axis));
}

// ------------------------------------------------------------ inner > 1

// The operations of col_block on one column (U = Acc<T>) or on a vector of columns
// (U = simd::Vec<Acc<T>>): the same combines, lane by lane.
template <typename T, typename R, typename U>
struct Columns {
  using A = Acc<T>;
  static constexpr bool kScalar = std::is_same_v<U, A>;
  static U load_x(const T* p) {
    if constexpr (kScalar) return A(load(*p));
    else return load_vec(p);
  }
  static U load_acc(const A* p) {
    if constexpr (kScalar) return *p;
    else return simd::vload<U>(p);
  }
  static void store_acc(A* p, U v) {
    if constexpr (kScalar) *p = v;
    else simd::vstore(p, v);
  }
  static U combine(U a, U b) {
    if constexpr (kScalar) return R::combine(a, b);
    else return LanesOf<R>::type::combine(a, b);
  }
};

// acc[j] = fold over r < rows (rows <= kRowBlock) of x[r * stride + j], j < w.
// Several rows per pass over acc, combined as a small tree: fewer acc loads and
// stores, no long dependency chains, and more independent loads in flight. Whole
// vectors of columns first (half types widened in registers), then single columns.
template <typename T, typename R>
void col_block(const T* x, int64_t stride, int64_t rows, int64_t w, Acc<T>* acc) {
  using A = Acc<T>;
  using V = simd::Vec<A>;
  constexpr int W = simd::kLanes<A>;
  for (int64_t j = 0; j < w; ++j) acc[j] = R::template identity<A>();
  const int64_t wv = w / W * W;
  int64_t r = 0;
  for (; r + kRowsPerPass <= rows; r += kRowsPerPass) {
    const T* xr = x + r * stride;
    // acc[j..] = the tree of rows r .. r + 8 combined into acc[j..].
    const auto pass = [&](auto unit, int64_t j) {
      using C = Columns<T, R, decltype(unit)>;
      const auto at = [&](int k) { return C::load_x(xr + k * stride + j); };
      const auto v01 = C::combine(at(0), at(1));
      const auto v23 = C::combine(at(2), at(3));
      const auto v45 = C::combine(at(4), at(5));
      const auto v67 = C::combine(at(6), at(7));
      C::store_acc(acc + j, C::combine(C::combine(C::combine(v01, v23), C::combine(v45, v67)),
                                       C::load_acc(acc + j)));
    };
    for (int64_t j = 0; j < wv; j += W) pass(V{}, j);
    for (int64_t j = wv; j < w; ++j) pass(A{}, j);
  }
  for (; r < rows; ++r) {
    const T* xr = x + r * stride;
    const auto fold = [&](auto unit, int64_t j) {
      using C = Columns<T, R, decltype(unit)>;
      C::store_acc(acc + j, C::combine(C::load_x(xr + j), C::load_acc(acc + j)));
    };
    for (int64_t j = 0; j < wv; j += W) fold(V{}, j);
    for (int64_t j = wv; j < w; ++j) fold(A{}, j);
  }
}

template <typename A, typename R>
void combine_into(A* acc, const A* other, int64_t w) {
  for (int64_t j = 0; j < w; ++j) acc[j] = R::combine(acc[j], other[j]);
}

// Rows p[r * stride, + w) for r < n combined pairwise into row 0: per column, the same
// tree (and so the same result) as tree_fold with that stride.
template <typename A, typename R>
void tree_fold_rows(A* p, int64_t n, int64_t stride, int64_t w) {
  if (n == 1) return;
  const int64_t half = n / 2;
  tree_fold_rows<A, R>(p, half, stride, w);
  tree_fold_rows<A, R>(p + half * stride, n - half, stride, w);
  combine_into<A, R>(p, p + half * stride, w);
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
  Scratch<A> partial(chunks > 1 ? outer * chunks * inner : 0);  // [outer, chunks, inner]
  const int64_t slots = fold_slots(chunk_rows / group + 1);
  const int64_t task_elems = std::max<int64_t>(1, chunk_rows * std::min(tile_w, inner));

  par.for_range(tasks, std::max<int64_t>(1, kGrain / task_elems), [&](int64_t begin, int64_t end) {
    Scratch<A> scratch(slots * tile_w);
    A* acc = scratch.data();
    for (int64_t t = begin; t < end; ++t) {
      const int64_t c = t % chunks, tile = (t / chunks) % tiles, o = t / chunks / tiles;
      const int64_t r0 = c * chunk_rows, rows = std::min(chunk_rows, axis - r0);
      const T* xo = x + (o * axis + r0) * inner;
      A* dst_acc = chunks > 1 ? partial.data() + (o * chunks + c) * inner : nullptr;
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
    // The chunks' partials combined pairwise as tree_fold would, a whole run of inner
    // at a time (vectorised), in parallel over outer x runs of inner.
    const int64_t runs = (inner + kTile - 1) / kTile;
    par.for_range(outer * runs, std::max<int64_t>(1, kGrain / (chunks * kTile)),
                  [&](int64_t begin, int64_t end) {
      for (int64_t t = begin; t < end; ++t) {
        const int64_t o = t / runs, i0 = t % runs * kTile, w = std::min(kTile, inner - i0);
        A* p = partial.data() + o * chunks * inner + i0;
        tree_fold_rows<A, R>(p, chunks, inner, w);
        for (int64_t i = 0; i < w; ++i) out[o * inner + i0 + i] = store<T>(R::finish(p[i], axis));
      }
    });
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
