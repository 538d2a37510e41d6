// The engine shared by gemm.cc and conv2d.cc, in the BLIS / GotoBLAS style: operands
// are packed into panels (A in MR-row panels, B in NR-column panels, both cut into
// KC-deep blocks and zero padded), and an MR x NR register-tiled micro-kernel runs
// over them. Half types are widened to float while packing, so the micro-kernels only
// exist for float and double.
//
// Packed layout of an operand with `width` rows (A) or columns (B), padded to the
// panel size P: for K block b (start k0, depth kc) the panel starting at row i lives
// at  dst + k0 * width + i * kc,  as kc consecutive groups of P values.
#pragma once

#include <algorithm>
#include <array>
#include <cstdint>
#include <cstring>
#include <memory>
#include <mutex>
#include <new>
#include <type_traits>

#if defined(__AVX512F__) || defined(__FMA__)
#include <immintrin.h>
#endif

#include "oxijax/numeric.h"

namespace oxijax::cpu::gemm_detail {

// Register tile (MR x NR) and cache blocks. KC keeps a B micro-panel (KC x NR) in L1,
// MC keeps an A block (MC x KC) in L2.
template <typename A> struct Blocking;
#if defined(__AVX512F__)
// 14 x 2 zmm accumulators + 2 B vectors + 1 broadcast = 31 of the 32 zmm registers.
template <> struct Blocking<float> {
  static constexpr int kMR = 14, kNR = 32;
  static constexpr int64_t kKC = 256, kMC = 14 * 12;
};
template <> struct Blocking<double> {
  static constexpr int kMR = 14, kNR = 16;
  static constexpr int64_t kKC = 256, kMC = 14 * 6;
};
#else
// Portable: GCC vector extensions of the widest plain vector width; 6 x 2 vectors
// of accumulators fit 16 vector registers.
#if defined(__AVX__)
inline constexpr int kVecBytes = 32;
#else
inline constexpr int kVecBytes = 16;
#endif
template <> struct Blocking<float> {
  static constexpr int kMR = 6, kNR = 2 * kVecBytes / 4;
  static constexpr int64_t kKC = 256, kMC = 6 * 16;
};
template <> struct Blocking<double> {
  static constexpr int kMR = 6, kNR = 2 * kVecBytes / 8;
  static constexpr int64_t kKC = 256, kMC = 6 * 16;
};
#endif

// Bytes of one packed operand that a call keeps at once: the packed panels of one
// super-block stay in L3 while every thread works on them.
inline constexpr int64_t kPackBytes = int64_t{6} << 20;
template <typename A> inline constexpr int64_t kPackBudget = kPackBytes / int64_t(sizeof(A));

inline int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }
inline int64_t round_up(int64_t a, int64_t b) { return ceil_div(a, b) * b; }

// Cuts n into equal blocks of at most `limit` (both multiples of P, n rounded up):
// the block size, so that no block is a sliver.
inline int64_t even_block(int64_t n, int64_t limit, int64_t P) {
  const int64_t padded = round_up(n, P);
  limit = std::max(limit / P * P, int64_t{P});
  return round_up(ceil_div(padded, ceil_div(padded, limit)), P);
}

// Uninitialised, 64-byte aligned memory (no per-element construction, no zeroing).
template <typename A>
class Buffer {
 public:
  explicit Buffer(int64_t n = 0) { reserve(n); }
  void reserve(int64_t n) {
    if (n <= capacity_) return;
    ptr_.reset(static_cast<A*>(::operator new(sizeof(A) * n, std::align_val_t{64})));
    capacity_ = n;
  }
  A* data() const { return ptr_.get(); }

 private:
  struct Free {
    void operator()(A* p) const { ::operator delete(p, std::align_val_t{64}); }
  };
  std::unique_ptr<A, Free> ptr_;
  int64_t capacity_ = 0;
};

// Packing memory borrowed from a few process-wide spare buffers, each lent to one
// holder at a time, so repeated calls reuse warm, already mapped pages: fresh pages
// cost a fault and a zeroing each, which also evicts the operands from cache. When
// every spare is lent, or n is too big to keep, the holder gets memory of its own.
// The spares live as long as the process: at most kSpares x kSpareBytes.
struct Spare {
  static constexpr int kSpares = 8;
  static constexpr int64_t kSpareBytes = int64_t{8} << 20;
  std::mutex mu;
  Buffer<unsigned char> buffer;
  static std::array<Spare, kSpares>& all() {
    static std::array<Spare, kSpares> spares;
    return spares;
  }
};

template <typename A>
class Scratch {
 public:
  explicit Scratch(int64_t n) {
    const int64_t bytes = n * int64_t(sizeof(A));
    if (bytes > 0 && bytes <= Spare::kSpareBytes) {
      for (Spare& s : Spare::all()) {
        if (!s.mu.try_lock()) continue;
        held_ = &s;
        s.buffer.reserve(bytes);
        data_ = reinterpret_cast<A*>(s.buffer.data());
        return;
      }
    }
    own_.reserve(n);
    data_ = own_.data();
  }
  ~Scratch() {
    if (held_ != nullptr) held_->mu.unlock();
  }
  Scratch(const Scratch&) = delete;
  Scratch& operator=(const Scratch&) = delete;
  A* data() const { return data_; }

 private:
  Spare* held_ = nullptr;
  Buffer<A> own_;
  A* data_ = nullptr;
};

// The K dimension cut into `count` blocks of equal depth (the last may be shorter),
// so that a K just above KC does not leave a sliver block.
struct KBlocks {
  int64_t k = 0, count = 0, size = 0;
  KBlocks(int64_t k_, int64_t kc) : k(k_) {
    count = k > 0 ? ceil_div(k, kc) : 0;
    size = count > 0 ? ceil_div(k, count) : 0;
  }
  int64_t begin(int64_t b) const { return b * size; }
  int64_t depth(int64_t b) const { return std::min(size, k - b * size); }
};

#if defined(__AVX512F__)
// d[kk * ld + ii] = s[ii * rs + kk] for ii < rows <= 16, kk < 16: up to sixteen rows of
// 16 floats transposed in registers (lanes past `rows` are neither loaded nor stored).
// (GCC 12 wrongly reports the shuffle intrinsics' internal _mm512_undefined_ps() as
// uninitialised: bug 105593.)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
inline void transpose_16(float* d, int64_t ld, const float* s, int64_t rs, int rows) {
  __m512 r[16], t[16];
  for (int i = 0; i < 16; ++i) r[i] = i < rows ? _mm512_loadu_ps(s + i * rs) : _mm512_setzero_ps();
  for (int i = 0; i < 16; i += 2) {  // pairs of rows interleaved
    t[i] = _mm512_unpacklo_ps(r[i], r[i + 1]);
    t[i + 1] = _mm512_unpackhi_ps(r[i], r[i + 1]);
  }
  for (int j = 0; j < 16; j += 4) {  // r[j + m], 128-bit lane l: rows j..j+3 of column 4l+m
    const __m512d a0 = _mm512_castps_pd(t[j]), a1 = _mm512_castps_pd(t[j + 1]);
    const __m512d a2 = _mm512_castps_pd(t[j + 2]), a3 = _mm512_castps_pd(t[j + 3]);
    r[j] = _mm512_castpd_ps(_mm512_unpacklo_pd(a0, a2));
    r[j + 1] = _mm512_castpd_ps(_mm512_unpackhi_pd(a0, a2));
    r[j + 2] = _mm512_castpd_ps(_mm512_unpacklo_pd(a1, a3));
    r[j + 3] = _mm512_castpd_ps(_mm512_unpackhi_pd(a1, a3));
  }
  for (int m = 0; m < 4; ++m) {  // gather the 128-bit lanes of each column
    t[m] = _mm512_shuffle_f32x4(r[m], r[4 + m], 0x88);
    t[4 + m] = _mm512_shuffle_f32x4(r[m], r[4 + m], 0xdd);
    t[8 + m] = _mm512_shuffle_f32x4(r[8 + m], r[12 + m], 0x88);
    t[12 + m] = _mm512_shuffle_f32x4(r[8 + m], r[12 + m], 0xdd);
  }
  const auto mask = static_cast<__mmask16>((1u << rows) - 1);
  for (int m = 0; m < 4; ++m) {
    _mm512_mask_storeu_ps(d + m * ld, mask, _mm512_shuffle_f32x4(t[m], t[8 + m], 0x88));
    _mm512_mask_storeu_ps(d + (8 + m) * ld, mask, _mm512_shuffle_f32x4(t[m], t[8 + m], 0xdd));
    _mm512_mask_storeu_ps(d + (4 + m) * ld, mask, _mm512_shuffle_f32x4(t[4 + m], t[12 + m], 0x88));
    _mm512_mask_storeu_ps(d + (12 + m) * ld, mask, _mm512_shuffle_f32x4(t[4 + m], t[12 + m], 0xdd));
  }
}
#pragma GCC diagnostic pop
#endif

// Packs panels of P rows [i0, i1) (i0 a multiple of P) of the matrix
// M(i, kk) = src[i * rs + kk * cs], valid for i < rows, over all of K; rows past
// `rows` become zeros. Used for A (rows of op(a)) and for B (columns of op(b)).
template <int P, typename T, typename A>
void pack_panels(A* dst, int64_t width, const T* src, int64_t rs, int64_t cs, int64_t rows,
                 int64_t i0, int64_t i1, const KBlocks& kb) {
  if (cs == 1 && rs != 1) {
    // K contiguous (a not transposed, b transposed): a panel's P source rows are read
    // as long streams over all of K, each scattered into the panel with stride P.
    for (int64_t i = i0; i < i1; i += P) {
      const int64_t valid = std::clamp<int64_t>(rows - i, 0, P);
      for (int64_t b = 0; b < kb.count; ++b) {
        const int64_t k0 = kb.begin(b), kc = kb.depth(b);
        A* d = dst + k0 * width + i * kc;
        const T* s = src + i * rs + k0;
        int64_t kk0 = 0;
#if defined(__AVX512F__)
        if constexpr (std::is_same_v<T, float>) {
          if (valid == P)
            for (; kk0 + 16 <= kc; kk0 += 16)
              for (int ii = 0; ii < P; ii += 16)
                transpose_16(d + kk0 * P + ii, P, s + ii * rs + kk0, rs, std::min(16, P - ii));
        }
#endif
        for (int64_t ii = 0; ii < valid; ++ii)
          for (int64_t kk = kk0; kk < kc; ++kk) d[kk * P + ii] = load(s[ii * rs + kk]);
        for (int64_t ii = valid; ii < P; ++ii)
          for (int64_t kk = 0; kk < kc; ++kk) d[kk * P + ii] = A(0);
      }
    }
    return;
  }
  for (int64_t b = 0; b < kb.count; ++b) {
    const int64_t k0 = kb.begin(b), kc = kb.depth(b);
    for (int64_t i = i0; i < i1; i += P) {
      A* d = dst + k0 * width + i * kc;
      const int64_t valid = std::clamp<int64_t>(rows - i, 0, P);
      const T* s = src + i * rs + k0 * cs;
      if (valid == P && rs == 1) {
        // Panel dim contiguous (b not transposed, a transposed): straight row copies.
        for (int64_t kk = 0; kk < kc; ++kk, s += cs, d += P)
          for (int ii = 0; ii < P; ++ii) d[ii] = load(s[ii]);
      } else {
        for (int64_t kk = 0; kk < kc; ++kk, d += P) {
          int ii = 0;
          for (; ii < valid; ++ii) d[ii] = load(s[ii * rs + kk * cs]);
          for (; ii < P; ++ii) d[ii] = A(0);
        }
      }
    }
  }
}

// ---------------------------------------------------------------- micro-kernels
//
// acc = (MR x kc panel of A) @ (kc x NR panel of B), then for the top-left mr x nr:
//   dst[i, j] = alpha * acc[i, j] + beta * src[i, j]   (src not read when beta == 0).
// src may equal dst (accumulating over K blocks).

#if defined(__AVX512F__)
template <typename A> struct Simd;
template <> struct Simd<float> {
  using V = __m512;
  using Mask = __mmask16;
  static constexpr int kLanes = 16;
  static V zero() { return _mm512_setzero_ps(); }
  static V set1(float x) { return _mm512_set1_ps(x); }
  static V load(const float* p) { return _mm512_loadu_ps(p); }
  static void store(float* p, V v) { _mm512_storeu_ps(p, v); }
  static V mask_load(V old, Mask m, const float* p) { return _mm512_mask_loadu_ps(old, m, p); }
  static V fma(V a, V b, V c) { return _mm512_fmadd_ps(a, b, c); }
  static V mul(V a, V b) { return _mm512_mul_ps(a, b); }
  static V maskz_load(Mask m, const float* p) { return _mm512_maskz_loadu_ps(m, p); }
  static void mask_store(float* p, Mask m, V v) { _mm512_mask_storeu_ps(p, m, v); }
};
template <> struct Simd<double> {
  using V = __m512d;
  using Mask = __mmask8;
  static constexpr int kLanes = 8;
  static V zero() { return _mm512_setzero_pd(); }
  static V set1(double x) { return _mm512_set1_pd(x); }
  static V load(const double* p) { return _mm512_loadu_pd(p); }
  static void store(double* p, V v) { _mm512_storeu_pd(p, v); }
  static V mask_load(V old, Mask m, const double* p) { return _mm512_mask_loadu_pd(old, m, p); }
  static V fma(V a, V b, V c) { return _mm512_fmadd_pd(a, b, c); }
  static V mul(V a, V b) { return _mm512_mul_pd(a, b); }
  static V maskz_load(Mask m, const double* p) { return _mm512_maskz_loadu_pd(m, p); }
  static void mask_store(double* p, Mask m, V v) { _mm512_mask_storeu_pd(p, m, v); }
};

template <typename A>
void micro_kernel(int64_t kc, const A* __restrict a, const A* __restrict b, A* dst,
                  int64_t ldd, const A* src, int64_t lds, A alpha, A beta, int mr, int nr) {
  using S = Simd<A>;
  using V = typename S::V;
  constexpr int MR = Blocking<A>::kMR, L = S::kLanes, NV = Blocking<A>::kNR / L;
  // The C rows are touched only after the K loop: start fetching them now.
  for (int i = 0; i < mr; ++i) {
    _mm_prefetch(reinterpret_cast<const char*>(dst + i * ldd), _MM_HINT_T0);
    _mm_prefetch(reinterpret_cast<const char*>(dst + i * ldd + NV * L - 1), _MM_HINT_T0);
  }
  V acc[MR][NV];
#pragma GCC unroll 64
  for (int i = 0; i < MR; ++i)
#pragma GCC unroll 8
    for (int v = 0; v < NV; ++v) acc[i][v] = S::zero();
#pragma GCC unroll 2
  for (int64_t k = 0; k < kc; ++k) {
    V bv[NV];
#pragma GCC unroll 8
    for (int v = 0; v < NV; ++v) bv[v] = S::load(b + v * L);
#pragma GCC unroll 64
    for (int i = 0; i < MR; ++i) {
      const V ai = S::set1(a[i]);
#pragma GCC unroll 8
      for (int v = 0; v < NV; ++v) acc[i][v] = S::fma(ai, bv[v], acc[i][v]);
    }
    a += MR;
    b += NV * L;
  }
  typename S::Mask mask[NV];
  for (int v = 0; v < NV; ++v) {
    const int left = std::clamp(nr - v * L, 0, L);
    mask[v] = static_cast<typename S::Mask>(left == L ? ~0u : (1u << left) - 1);
  }
  const V va = S::set1(alpha), vb = S::set1(beta);
#pragma GCC unroll 64
  for (int i = 0; i < MR; ++i) {
    if (i >= mr) break;
#pragma GCC unroll 8
    for (int v = 0; v < NV; ++v) {
      V r = S::mul(va, acc[i][v]);
      if (beta != A(0)) r = S::fma(vb, S::maskz_load(mask[v], src + i * lds + v * L), r);
      S::mask_store(dst + i * ldd + v * L, mask[v], r);
    }
  }
}
#else
template <typename A> struct Vec {
  typedef A type __attribute__((vector_size(kVecBytes)));
};

// c + a * b, fused where the ISA has it (-ffp-contract is off in ISO C++ modes).
template <typename V>
inline V madd(V a, V b, V c) {
#if defined(__FMA__)
  if constexpr (sizeof(V) == 32 && sizeof(a[0]) == 4)
    return V(_mm256_fmadd_ps(__m256(a), __m256(b), __m256(c)));
  if constexpr (sizeof(V) == 32 && sizeof(a[0]) == 8)
    return V(_mm256_fmadd_pd(__m256d(a), __m256d(b), __m256d(c)));
#endif
  return c + a * b;
}

template <typename A>
void micro_kernel(int64_t kc, const A* __restrict a, const A* __restrict b, A* dst,
                  int64_t ldd, const A* src, int64_t lds, A alpha, A beta, int mr, int nr) {
  using V = typename Vec<A>::type;
  constexpr int MR = Blocking<A>::kMR, NR = Blocking<A>::kNR, L = kVecBytes / sizeof(A);
  constexpr int NV = NR / L;
  V acc[MR][NV];
  for (int i = 0; i < MR; ++i)
    for (int v = 0; v < NV; ++v) acc[i][v] = V{};
  for (int64_t k = 0; k < kc; ++k, a += MR, b += NR) {
    V bv[NV];
    for (int v = 0; v < NV; ++v) std::memcpy(&bv[v], b + v * L, sizeof(V));
    for (int i = 0; i < MR; ++i) {
      const V ai = V{} + a[i];
      for (int v = 0; v < NV; ++v) acc[i][v] = madd(ai, bv[v], acc[i][v]);
    }
  }
  A tile[MR][NR];
  std::memcpy(tile, acc, sizeof tile);
  for (int i = 0; i < mr; ++i)
    for (int j = 0; j < nr; ++j) {
      A r = alpha * tile[i][j];
      if (beta != A(0)) r += beta * src[i * lds + j];
      dst[i * ldd + j] = r;
    }
}
#endif

// ---------------------------------------------------------------- macro-kernel

// Where a block of results goes: out[i * ld + j] = alpha * (A @ B)[i, j] + beta * c[...];
// c is read only when beta != 0.
template <typename T>
struct Target {
  T* out;
  const T* c;
  int64_t ld;
  Acc<T> alpha, beta;
};

// Computes rows [r0, r1) x columns [c0, c1) of the product of packed A (a_width rows)
// and packed B (b_width columns) over all of K. r0 and c0 are multiples of MR and NR;
// t.out / t.c point at element (0, 0). For half types, `scratch` (kMC * (c1 - c0)
// floats) accumulates an MC-row stripe in float, rounded once when it is stored.
template <typename T>
void compute_region(const Acc<T>* ap, int64_t a_width, const Acc<T>* bp, int64_t b_width,
                    const KBlocks& kb, int64_t r0, int64_t r1, int64_t c0, int64_t c1,
                    const Target<T>& t, Acc<T>* scratch) {
  using A = Acc<T>;
  constexpr bool kDirect = std::is_same_v<T, A>;
  constexpr int MR = Blocking<A>::kMR, NR = Blocking<A>::kNR;
  constexpr int64_t MC = Blocking<A>::kMC;
  const int64_t ls = c1 - c0;  // scratch row length
  for (int64_t ic = r0; ic < r1; ic += MC) {
    const int64_t ie = std::min(ic + MC, r1);
    for (int64_t blk = 0; blk < kb.count; ++blk) {
      const int64_t k0 = kb.begin(blk), kc = kb.depth(blk);
      const bool first = blk == 0;
      const A* ablk = ap + k0 * a_width;
      const A* bblk = bp + k0 * b_width;
      for (int64_t jr = c0; jr < c1; jr += NR) {
        const int nr = static_cast<int>(std::min<int64_t>(NR, c1 - jr));
        for (int64_t ir = ic; ir < ie; ir += MR) {
          const int mr = static_cast<int>(std::min<int64_t>(MR, ie - ir));
          if constexpr (kDirect) {
            A* dst = t.out + ir * t.ld + jr;
            const A* src = first ? (t.beta != A(0) ? t.c + ir * t.ld + jr : nullptr) : dst;
            micro_kernel<A>(kc, ablk + ir * kc, bblk + jr * kc, dst, t.ld, src, t.ld, t.alpha,
                            first ? t.beta : A(1), mr, nr);
          } else {
            A* dst = scratch + (ir - ic) * ls + (jr - c0);
            micro_kernel<A>(kc, ablk + ir * kc, bblk + jr * kc, dst, ls, dst, ls, t.alpha,
                            first ? A(0) : A(1), mr, nr);
          }
        }
      }
    }
    if constexpr (!kDirect) {
      for (int64_t i = ic; i < ie; ++i) {
        const A* s = scratch + (i - ic) * ls;
        T* o = t.out + i * t.ld;
        if (t.beta != A(0)) {
          const T* c = t.c + i * t.ld;
          for (int64_t j = c0; j < c1; ++j) o[j] = store<T>(s[j - c0] + t.beta * load(c[j]));
        } else {
          for (int64_t j = c0; j < c1; ++j) o[j] = store<T>(s[j - c0]);
        }
      }
    }
  }
}

// Splits a grid of row x column tiles into at most `target` rectangles of equal size
// (as near as the tile counts allow), minimising the largest one. Returns the tiles
// per piece along each axis.
inline void split_grid(int64_t row_tiles, int64_t col_tiles, int64_t target, int64_t& row_chunk,
                       int64_t& col_chunk) {
  row_chunk = row_tiles, col_chunk = col_tiles;
  for (int64_t rp = 1; rp <= std::min(row_tiles, target); ++rp) {
    const int64_t rc = ceil_div(row_tiles, rp);
    const int64_t cc = ceil_div(col_tiles, std::min(col_tiles, target / rp));
    if (rc * cc < row_chunk * col_chunk) row_chunk = rc, col_chunk = cc;
  }
}

}  // namespace oxijax::cpu::gemm_detail
