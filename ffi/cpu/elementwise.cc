// Elementwise kernels: unary ops over a contiguous array and binary ops with
// broadcasting. The op is chosen once, outside the loops.
//
// Types that compute in float (float, float16, bfloat16) run whole SIMD vectors: the
// operands are widened in registers (half_convert.h), the op is the lane-wise functor of
// vector_math.h (the math of oxijax/math.h, with vectorised exp / log / tanh), and the
// result is rounded once on store. float64, strided operands and the backward functors
// call the scalar functors of oxijax/math.h, the math shared with the CUDA kernels.
//
// Binary shapes are first simplified: dims of size 1 are dropped and adjacent dims
// merged where both operands' strides allow it, so the common cases (same shape,
// scalar operand, row / column broadcast) become one or two dims with a tight inner
// loop whose operand strides (0 or 1) are compile-time constants.
//
// Parallel chunks end on page boundaries of the output: a large output is usually a
// fresh allocation, and first touching its pages (page faults) costs more than the
// math; this way no page is faulted in by two threads, and each chunk of a fresh output
// maps its pages in one system call (populate).
#include <algorithm>
#include <cstdint>
#include <type_traits>
#include <vector>

#include <sys/mman.h>

#include "half_convert.h"
#include "kernels.h"
#include "oxijax/math.h"
#include "vector_math.h"

// glibc's libmvec has SIMD versions of exp, log and tanh (1-4 ulp, like the scalar
// ones give or take an ulp); glibc's <math.h> announces them only under -ffast-math.
// Announcing them here lets GCC vectorise the scalar loops that call them (float64, and
// the backward functors UnaryGrad<EXP/TANH/SIGMOID>): without this, those loops make
// one scalar libm call per element and run 4-10x slower. Needs glibc >= 2.35 (SIMD tanh)
// and libmvec at link time (g++ links libm, whose linker script pulls libmvec in as
// needed). Define OXIJAX_NO_LIBMVEC to build without it.
#if !defined(OXIJAX_NO_LIBMVEC) && defined(__GNUC__) && !defined(__clang__) && \
    defined(__x86_64__) && defined(__GLIBC__) && defined(__GLIBC_PREREQ)
#if __GLIBC_PREREQ(2, 35)
extern "C" {
#define OXIJAX_SIMD_DECL __THROW __attribute__((__simd__("notinbranch")))
float expf(float) OXIJAX_SIMD_DECL;
float logf(float) OXIJAX_SIMD_DECL;
float tanhf(float) OXIJAX_SIMD_DECL;
double exp(double) OXIJAX_SIMD_DECL;
double log(double) OXIJAX_SIMD_DECL;
double tanh(double) OXIJAX_SIMD_DECL;
#undef OXIJAX_SIMD_DECL
}
#endif
#endif

namespace oxijax::cpu {
namespace {

// Elements per parallel chunk at least: smaller arrays run on the calling thread.
constexpr int64_t kGrain = int64_t{1} << 16;
// The granule of first-touch page faults (the smallest page size of x86-64 and aarch64).
constexpr int64_t kPageBytes = 4096;

// A large output is usually a new mapping of the allocator without pages: each first
// store to a page traps into the kernel, which zeroes and maps it. One
// MADV_POPULATE_WRITE (Linux 5.14) per parallel chunk maps its pages without a trap per
// page. Zen 4 VM, 4096 x 4096 into a fresh 64 MiB, ms (XLA): two cores, float32 max with
// a broadcast row 21.9-24.1 -> 16.6-17.5 (18.6-23.1), relu 19.2-20.8 -> 16.4-16.8
// (17.8-22.9), bfloat16 max 10.5-12.5 -> 7.4-8.9 (10.7-12.5); one core, float32 relu
// 37.8-38.7 -> 34.0-34.8 (31.1-32.4). On pages that are mapped already (a reused heap
// buffer) it walks them for nothing (2048 x 2048 float32 max 1.06 -> 1.70 ms), and a
// mincore test per chunk cost 2-15 us per call on outputs of 256 KiB to 4 MiB: so one
// test per call, of the output's last page, for outputs of at least kPopulateBytes.
// Best effort: an older kernel's EINVAL leaves the pages to fault.
constexpr int64_t kPopulateBytes = int64_t{4} << 20;

// Whether the page of end's last byte is not mapped yet (then none of a fresh mapping
// of the allocator that ends there is).
bool fresh_pages(const void* end) {
#if defined(__linux__) && defined(MADV_POPULATE_WRITE)
  const uintptr_t last = (reinterpret_cast<uintptr_t>(end) - 1) / kPageBytes * kPageBytes;
  unsigned char mapped = 1;
  return mincore(reinterpret_cast<void*>(last), kPageBytes, &mapped) == 0 && !(mapped & 1);
#else
  (void)end;
  return false;
#endif
}

// Maps the whole pages of [begin, end) (fresh_pages said they are not mapped).
void populate(const void* begin, const void* end) {
#if defined(__linux__) && defined(MADV_POPULATE_WRITE)
  constexpr uintptr_t kPage = kPageBytes;
  const uintptr_t lo = (reinterpret_cast<uintptr_t>(begin) + kPage - 1) / kPage * kPage;
  const uintptr_t hi = reinterpret_cast<uintptr_t>(end) / kPage * kPage;
  if (hi > lo) madvise(reinterpret_cast<void*>(lo), hi - lo, MADV_POPULATE_WRITE);
#else
  (void)begin, (void)end;
#endif
}

// Calls body(begin, end) over [0, n) on par, in chunks of at least kGrain elements
// that end on page boundaries of out, each chunk's pages mapped first where out is a
// large fresh mapping.
template <typename T, typename Body>
void for_output_pages(const Parallel& par, const T* out, int64_t n, const Body& body) {
  constexpr int64_t kPage = kPageBytes / sizeof(T);
  const auto address = reinterpret_cast<uintptr_t>(out);
  const int64_t head = static_cast<int64_t>((kPageBytes - address % kPageBytes) % kPageBytes) /
                       static_cast<int64_t>(sizeof(T));  // elements before the first boundary
  const bool fresh = n * int64_t(sizeof(T)) >= kPopulateBytes && fresh_pages(out + n);
  const auto chunk = [&](int64_t begin, int64_t end) {
    if (fresh) populate(out + begin, out + end);
    body(begin, end);
  };
  if (head >= n) return chunk(0, n);
  const int64_t pages = (n - head + kPage - 1) / kPage;
  par.for_range(pages, kGrain / kPage, [&](int64_t p0, int64_t p1) {
    chunk(p0 == 0 ? 0 : head + p0 * kPage, std::min(n, head + p1 * kPage));
  });
}

// The lane-wise functor of vector_math.h for a functor of oxijax/math.h (void: none),
// used when T computes in float.
template <typename F> struct LaneOp { using type = void; };
template <UnaryOp op> struct LaneOp<Unary<op>> { using type = vmath::VecUnary<op>; };
template <BinaryOp op> struct LaneOp<Binary<op>> { using type = vmath::VecBinary<op>; };
template <typename T, typename F>
constexpr bool kHasLanes = std::is_same_v<Acc<T>, float> && !std::is_void_v<typename LaneOp<F>::type>;

// Elements per step of the vector loops: a pair of vectors.
constexpr int kStep = 2 * vmath::kLanes;

// ---------------------------------------------------------------- unary

template <typename T, typename F>
void unary_span(const T* x, T* y, int64_t n) {
  const F f;
  for (int64_t i = 0; i < n; ++i) y[i] = store<T>(f(load(x[i])));
}

// unary_span on pairs of vectors (half_convert.h's unit); the last partial pair goes
// through zero-padded copies.
template <typename T, typename V>
void unary_lanes(const T* x, T* y, int64_t n) {
  const V f;
  const auto apply = [&f](const T* in, T* out) {
    const vmath::VecF2 v = vmath::load_pair(in);
    vmath::store_pair(out, {f(v.lo), f(v.hi)});
  };
  int64_t i = 0;
  for (; i + kStep <= n; i += kStep) apply(x + i, y + i);
  if (i < n) {
    T in[kStep] = {}, out[kStep];
    std::copy(x + i, x + n, in);
    apply(in, out);
    std::copy(out, out + (n - i), y + i);
  }
}

template <typename T, UnaryOp op>
void unary_op(const Parallel& par, const T* x, T* y, int64_t n) {
  using F = Unary<op>;
  for_output_pages(par, y, n, [&](int64_t begin, int64_t end) {
    if constexpr (kHasLanes<T, F>)
      unary_lanes<T, typename LaneOp<F>::type>(x + begin, y + begin, end - begin);
    else
      unary_span<T, F>(x + begin, y + begin, end - begin);
  });
}

// ---------------------------------------------------------------- binary

// Elements i .. i + kStep of an operand of stride S (0 or 1) as floats; `first` is its
// element 0.
template <int S, typename T>
vmath::VecF2 operand_pair(const T* p, int64_t i, vmath::VecF first) {
  if constexpr (S == 1) return vmath::load_pair(p + i);
  else return {first, first};
}

// out[i] = f(a[i * SA], b[i * SB]) on pairs of vectors, SA, SB in {0, 1}, not both 0;
// the last partial pair goes through zero-padded copies.
template <typename T, typename V, int SA, int SB>
void binary_lanes(const T* a, const T* b, T* out, int64_t n) {
  const V f;
  const vmath::VecF a0 = simd::splat<vmath::VecF>(load(a[0]));
  const vmath::VecF b0 = simd::splat<vmath::VecF>(load(b[0]));
  const auto apply = [&](const T* ap, const T* bp, int64_t i, T* dst) {
    const vmath::VecF2 av = operand_pair<SA>(ap, i, a0), bv = operand_pair<SB>(bp, i, b0);
    vmath::store_pair(dst, {f(av.lo, bv.lo), f(av.hi, bv.hi)});
  };
  int64_t i = 0;
  for (; i + kStep <= n; i += kStep) apply(a, b, i, out + i);
  if (i < n) {
    T a_rest[kStep] = {}, b_rest[kStep] = {}, rest[kStep];
    if constexpr (SA == 1) std::copy(a + i, a + n, a_rest);
    if constexpr (SB == 1) std::copy(b + i, b + n, b_rest);
    apply(a_rest, b_rest, 0, rest);
    std::copy(rest, rest + (n - i), out + i);
  }
}

// out[i] = f(a[i * SA], b[i * SB]) for i < n, with SA, SB in {0, 1}; -1 means the
// stride is a runtime value.
template <typename T, typename F, int SA, int SB>
struct BinarySpan {
  static void run(const T* a, int64_t sa, const T* b, int64_t sb, T* out, int64_t n) {
    const F f;
    if constexpr (kHasLanes<T, F> && SA >= 0 && SB >= 0 && SA + SB > 0) {
      binary_lanes<T, typename LaneOp<F>::type, SA, SB>(a, b, out, n);
    } else if constexpr (SA == 1 && SB == 1) {
      for (int64_t i = 0; i < n; ++i) out[i] = store<T>(f(load(a[i]), load(b[i])));
    } else if constexpr (SA == 0 && SB == 1) {
      const auto av = load(a[0]);
      for (int64_t i = 0; i < n; ++i) out[i] = store<T>(f(av, load(b[i])));
    } else if constexpr (SA == 1 && SB == 0) {
      const auto bv = load(b[0]);
      for (int64_t i = 0; i < n; ++i) out[i] = store<T>(f(load(a[i]), bv));
    } else if constexpr (SA == 0 && SB == 0) {
      const T v = store<T>(f(load(a[0]), load(b[0])));
      for (int64_t i = 0; i < n; ++i) out[i] = v;
    } else {
      for (int64_t i = 0; i < n; ++i) out[i] = store<T>(f(load(a[i * sa]), load(b[i * sb])));
    }
  }
};

template <typename T, typename F>
void (*pick_span(int64_t sa, int64_t sb))(const T*, int64_t, const T*, int64_t, T*, int64_t) {
  if (sa == 1 && sb == 1) return &BinarySpan<T, F, 1, 1>::run;
  if (sa == 0 && sb == 1) return &BinarySpan<T, F, 0, 1>::run;
  if (sa == 1 && sb == 0) return &BinarySpan<T, F, 1, 0>::run;
  if (sa == 0 && sb == 0) return &BinarySpan<T, F, 0, 0>::run;
  return &BinarySpan<T, F, -1, -1>::run;
}

// A narrow last dim (a few elements) makes the per-row loop all overhead. Then the
// last two dims [rows, inner] form one flat block, processed a few hundred elements
// at a time: an operand contiguous over the block is read in place, any other is
// first gathered into a small buffer (built once per block when it repeats every
// row, as a broadcast row does), and a contiguous loop does the math.
constexpr int64_t kNarrow = 32;      // inner dims below this use the block path
constexpr int64_t kPiece = 512;      // elements per gathered piece

template <typename T, typename F>
struct NarrowBlock {
  int64_t rows, inner;
  int64_t pa, la, pb, lb;  // operand strides over [rows, inner]
  using Span = void (*)(const T*, int64_t, const T*, int64_t, T*, int64_t);
  Span generic;            // strides la, lb: partial rows
  int64_t group;           // rows per piece

  static bool flat(int64_t p, int64_t l, int64_t inner) { return l == 1 && p == inner; }

  // buf[r * inner + j] = x[r * p + j * l] for r < nr, j < inner.
  void gather(const T* x, int64_t p, int64_t l, int64_t nr, T* buf) const {
    for (int64_t r = 0; r < nr; ++r)
      for (int64_t j = 0; j < inner; ++j) buf[r * inner + j] = x[r * p + j * l];
  }

  // Elements [k0, k1) of the block whose operands start at a and b.
  void run(const T* a, const T* b, T* out, int64_t k0, int64_t k1) const {
    const bool a_flat = flat(pa, la, inner), b_flat = flat(pb, lb, inner);
    T abuf[kPiece], bbuf[kPiece];
    bool a_built = false, b_built = false;
    int64_t k = k0;
    if (k % inner != 0) {  // finish a partial row
      const int64_t r = k / inner, j = k % inner, len = std::min(inner - j, k1 - k);
      generic(a + r * pa + j * la, la, b + r * pb + j * lb, lb, out + k, len);
      k += len;
    }
    while (k1 - k >= inner) {
      const int64_t r = k / inner, nr = std::min(group, (k1 - k) / inner), len = nr * inner;
      const T* ap = a + k;
      if (!a_flat) {
        if (pa != 0) gather(a + r * pa, pa, la, nr, abuf);
        else if (!a_built) gather(a, 0, la, group, abuf), a_built = true;
        ap = abuf;
      }
      const T* bp = b + k;
      if (!b_flat) {
        if (pb != 0) gather(b + r * pb, pb, lb, nr, bbuf);
        else if (!b_built) gather(b, 0, lb, group, bbuf), b_built = true;
        bp = bbuf;
      }
      BinarySpan<T, F, 1, 1>::run(ap, 1, bp, 1, out + k, len);
      k += len;
    }
    if (k < k1) {  // a partial last row
      const int64_t r = k / inner;
      generic(a + r * pa, la, b + r * pb, lb, out + k, k1 - k);
    }
  }
};

// out = F(a, b) with broadcasting, for any two-operand functor of oxijax/math.h.
template <typename T, typename F>
void binary_with(const Parallel& par, const BroadcastShape& shape, const T* a, const T* b,
                 T* out) {
  const SimplifiedBroadcast s = simplify(shape);
  if (s.total == 0) return;
  const int rank = static_cast<int>(s.dims.size());
  if (rank == 0) {  // every dim is 1: one element
    out[0] = store<T>(F()(load(a[0]), load(b[0])));
    return;
  }
  const int64_t inner = s.dims[rank - 1];
  const int64_t isa = s.sa[rank - 1], isb = s.sb[rank - 1];
  const auto span = pick_span<T, F>(isa, isb);
  if (rank == 1) {
    for_output_pages(par, out, inner, [&](int64_t begin, int64_t end) {
      span(a + begin * isa, isa, b + begin * isb, isb, out + begin, end - begin);
    });
    return;
  }
  // The output is a sequence of blocks: the last dim, or the last two for a narrow
  // last dim with enough rows.
  NarrowBlock<T, F> narrow{};
  const bool use_narrow = inner < kNarrow && s.dims[rank - 2] >= 2 * (kPiece / inner);
  if (use_narrow) {
    narrow.rows = s.dims[rank - 2];
    narrow.inner = inner;
    narrow.pa = s.sa[rank - 2];
    narrow.pb = s.sb[rank - 2];
    narrow.la = isa;
    narrow.lb = isb;
    narrow.generic = span;
    narrow.group = kPiece / inner;
  }
  const int outer_rank = use_narrow ? rank - 2 : rank - 1;
  const int64_t block = use_narrow ? inner * narrow.rows : inner;
  // Flat chunks of the output; each walks the blocks' index like an odometer.
  for_output_pages(par, out, s.total, [&](int64_t begin, int64_t end) {
    std::vector<int64_t> index(outer_rank);
    int64_t rest = begin / block, oa = 0, ob = 0;
    for (int d = outer_rank - 1; d >= 0; --d) {
      index[d] = rest % s.dims[d];
      rest /= s.dims[d];
      oa += index[d] * s.sa[d];
      ob += index[d] * s.sb[d];
    }
    int64_t pos = begin, k0 = begin % block;
    for (;;) {
      const int64_t k1 = std::min(block, k0 + (end - pos));
      T* block_out = out + (pos - k0);
      if (use_narrow) narrow.run(a + oa, b + ob, block_out, k0, k1);
      else span(a + oa + k0 * isa, isa, b + ob + k0 * isb, isb, block_out + k0, k1 - k0);
      pos += k1 - k0;
      if (pos >= end) break;
      k0 = 0;
      for (int d = outer_rank - 1; d >= 0; --d) {
        oa += s.sa[d];
        ob += s.sb[d];
        if (++index[d] < s.dims[d]) break;
        oa -= s.sa[d] * s.dims[d];
        ob -= s.sb[d] * s.dims[d];
        index[d] = 0;
      }
    }
  });
}

// The backward kernels reuse the binary loops: unary_grad is a same-shape binary op,
// which needs only the contiguous loop (binary_with's broadcasting paths made this file
// compile 1.5 times longer).
template <typename T, UnaryOp op>
void unary_grad_op(const Parallel& par, const T* x, const T* t, T* out, int64_t n) {
  for_output_pages(par, out, n, [&](int64_t begin, int64_t end) {
    BinarySpan<T, UnaryGrad<op>, 1, 1>::run(x + begin, 1, t + begin, 1, out + begin,
                                             end - begin);
  });
}

}  // namespace

template <typename T>
void unary(const Parallel& par, UnaryOp op, const T* x, T* y, int64_t n) {
  if (n <= 0) return;
  switch (op) {
#define OXIJAX_CASE(OP) \
  case UnaryOp::OP: return unary_op<T, UnaryOp::OP>(par, x, y, n);
    OXIJAX_CASE(RELU) OXIJAX_CASE(SIGMOID) OXIJAX_CASE(TANH) OXIJAX_CASE(EXP)
    OXIJAX_CASE(LOG) OXIJAX_CASE(SQRT) OXIJAX_CASE(ABS) OXIJAX_CASE(NEG)
#undef OXIJAX_CASE
  }
}

template <typename T>
void binary(const Parallel& par, BinaryOp op, const BroadcastShape& shape, const T* a,
            const T* b, T* out) {
  switch (op) {
#define OXIJAX_CASE(OP) \
  case BinaryOp::OP: return binary_with<T, Binary<BinaryOp::OP>>(par, shape, a, b, out);
    OXIJAX_CASE(ADD) OXIJAX_CASE(SUB) OXIJAX_CASE(MUL) OXIJAX_CASE(DIV)
    OXIJAX_CASE(MAX) OXIJAX_CASE(MIN)
#undef OXIJAX_CASE
  }
}

template <typename T>
void unary_grad(const Parallel& par, UnaryOp op, const T* x, const T* t, T* out, int64_t n) {
  if (n <= 0) return;
  switch (op) {
#define OXIJAX_CASE(OP) \
  case UnaryOp::OP: return unary_grad_op<T, UnaryOp::OP>(par, x, t, out, n);
    OXIJAX_CASE(RELU) OXIJAX_CASE(SIGMOID) OXIJAX_CASE(TANH) OXIJAX_CASE(EXP)
    OXIJAX_CASE(LOG) OXIJAX_CASE(SQRT) OXIJAX_CASE(ABS) OXIJAX_CASE(NEG)
#undef OXIJAX_CASE
  }
}

template <typename T>
void binary_partial(const Parallel& par, BinaryOp op, const BroadcastShape& shape, const T* a,
                    const T* b, T* out) {
  if (op == BinaryOp::MAX) return binary_with<T, BinaryPartial<BinaryOp::MAX>>(par, shape, a, b, out);
  if (op == BinaryOp::MIN) return binary_with<T, BinaryPartial<BinaryOp::MIN>>(par, shape, a, b, out);
}

#define OXIJAX_INSTANTIATE(T)                                                       \
  template void unary_grad<T>(const Parallel&, UnaryOp, const T*, const T*, T*, int64_t); \
  template void binary_partial<T>(const Parallel&, BinaryOp, const BroadcastShape&,   \
                                  const T*, const T*, T*);                          \
  template void unary<T>(const Parallel&, UnaryOp, const T*, T*, int64_t);          \
  template void binary<T>(const Parallel&, BinaryOp, const BroadcastShape&, const T*, \
                          const T*, T*);
OXIJAX_FOR_EACH_DTYPE(OXIJAX_INSTANTIATE)
#undef OXIJAX_INSTANTIATE

}  // namespace oxijax::cpu
