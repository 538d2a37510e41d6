// The engine shared by gemm.cc and conv2d.cc, in the BLIS / GotoBLAS style: operands
// are packed into panels (A in MR-row panels, B in NR-column panels, both cut into
// KC-deep blocks and zero padded), and an MR x NR register-tiled micro-kernel runs
// over them. Half types are widened to float while packing, so the micro-kernels only
// exist for float and double, except where the CPU has AVX512_BF16: there gemm packs
// bfloat16 as pairs of K steps for VDPBF16PS (Packed<T>). The register tile is fixed
// per instruction set; the cache blocks (KC, MC, the packed super-block size) follow
// the running machine's cache sizes.
//
// Packed layout of an operand with `width` rows (A) or columns (B), padded to the
// panel size P: for K block b (start k0, depth kc) the panel starting at row i lives
// at  dst + k0 * width + i * kc,  as kc consecutive groups of P values.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <type_traits>

#if defined(__SSE2__)
#include <immintrin.h>
#endif

#include "cache_info.h"
#include "oxijax/numeric.h"
#include "scratch.h"

// x86 micro-kernels on intrinsics (AVX-512, or AVX2 with FMA); elsewhere (SSE2 baseline,
// NEON) a portable one on vector extensions.
#if defined(__AVX512F__) || (defined(__AVX2__) && defined(__FMA__))
#define OXIJAX_GEMM_X86_KERNEL 1
#endif

namespace oxijax::cpu::gemm_detail {

// ---------------------------------------------------------------- register tiles

// MR x NR: the block of C a micro-kernel call keeps in registers.
template <typename A> struct Blocking;
// kMR x kNR: the register tile. A panel's last rows (M not a multiple of kMR) run a
// tile of only kMidRows or kFewRows rows when they fit, instead of multiplying rows of
// zeros (64 rows are 4 x 14 + 8 on AVX-512, not 5 x 14), and a last column tile of at
// most kNR / 2 columns a tile of one vector.
#if defined(__AVX512F__)
// 14 x 2 zmm accumulators + 2 B vectors + 1 broadcast = 31 of the 32 zmm registers.
template <> struct Blocking<float> {
  static constexpr int kMR = 14, kNR = 32, kMidRows = 8, kFewRows = 4;
};
template <> struct Blocking<double> {
  static constexpr int kMR = 14, kNR = 16, kMidRows = 8, kFewRows = 4;
};
#else
// 6 x 2 vectors of accumulators + 2 B vectors + 1 broadcast = 15 of the 16 vector
// registers (ymm with AVX2, xmm with SSE2, q with NEON).
#if defined(__AVX__)
inline constexpr int kVecBytes = 32;
#else
inline constexpr int kVecBytes = 16;
#endif
template <> struct Blocking<float> {
  static constexpr int kMR = 6, kNR = 2 * kVecBytes / 4, kMidRows = 4, kFewRows = 2;
};
template <> struct Blocking<double> {
  static constexpr int kMR = 6, kNR = 2 * kVecBytes / 8, kMidRows = 4, kFewRows = 2;
};
#endif
// Every tile is two vectors wide (kNR is twice a vector's lanes).
inline constexpr int kTileVectors = 2;

// The panels of packed element type P: kMR rows of A and kNR columns of B, the register
// tile of its accumulator type (gemm_amx.h gives AMX's tile block its own).
template <typename P>
struct PanelShape {
  static constexpr int kMR = Blocking<Acc<P>>::kMR, kNR = Blocking<Acc<P>>::kNR;
};

inline int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }
inline int64_t round_up(int64_t a, int64_t b) { return ceil_div(a, b) * b; }

// ---------------------------------------------------------------- packed elements

// Two bfloat16 of consecutive K steps (the lower step in the low half), the operand
// element of VDPBF16PS: acc += a.lo * b.lo + a.hi * b.hi per float lane. Panels of
// pairs are laid out like panels of floats over K / 2 (rounded up) steps.
struct BfPair {
  uint32_t bits;
};

// The element type gemm packs T into: bfloat16 pairs where the CPU has AVX512_BF16
// (twice the products per instruction of float FMAs; products of two bfloat16 are
// exact in float either way, but VDPBF16PS treats subnormal inputs and results as
// zero), else T's accumulator type (half types widened while packing).
#if defined(__AVX512BF16__)
inline constexpr bool kBf16Pairs = true;
#else
inline constexpr bool kBf16Pairs = false;
#endif
template <typename T>
using Packed = std::conditional_t<kBf16Pairs && std::is_same_v<T, bfloat16>, BfPair, Acc<T>>;

// K steps per packed element.
template <typename P>
inline constexpr int64_t kStepsPer = std::is_same_v<P, BfPair> ? 2 : 1;

// ---------------------------------------------------------------- cache blocks

// The cache blocks of the running machine (cache_info.h):
//  - KC: a KC x NR micro-panel of B and an MR x KC sliver of A fill a quarter of L2.
//    BLIS sizes them for L1 instead, but with the AVX-512 14 x 32 tile that gives
//    KC = 176 on a 32 KiB L1, and each K block is a pass over C: on a Zen 4, KC = 1024
//    made the float32 gemm 5-8 % faster at 1024^3 to 2048^3 (bfloat16 pairs ~4 %;
//    the AVX2 6 x 16 tile, KC 368 -> 1024, no change). The micro-panels then stream
//    from L2, which feeds L1 faster than the FMAs consume them;
//  - MC: an MC x KC block of A fills about half of L2 (the rest holds B micro-panels
//    and C), so every B micro-panel reuses it from there;
//  - pack: each packed operand (a super-block of A rows or B columns over all of K) a
//    quarter of L3, so both stay there while every thread works through them.
struct CacheBlocks {
  int64_t kc;    // depth of a K block
  int64_t mc;    // rows of an A block, a multiple of MR
  int64_t pack;  // elements of one packed operand
};

// KC stays in a range where the K loop's start-up and C traffic are amortised and
// the packed slivers are not absurdly long, whatever the cache sizes claim.
inline constexpr int64_t kMinKC = 64, kMaxKC = 1024;

// P: the packed element type (kc and pack count P elements; a BfPair holds two K steps).
template <typename P>
const CacheBlocks& cache_blocks() {
  static const CacheBlocks blocks = [] {
    using A = Acc<P>;
    constexpr int64_t MR = Blocking<A>::kMR, NR = Blocking<A>::kNR, size = sizeof(P);
    const CacheSizes& c = cache_sizes();
    const int64_t kc = std::clamp<int64_t>(c.l2 / 4 / ((MR + NR) * size) / 8 * 8, kMinKC,
                                           kMaxKC);
    const int64_t mc = std::max<int64_t>(c.l2 / 2 / (kc * size) / MR, 1) * MR;
    return CacheBlocks{kc, mc, c.l3 / 4 / size};
  }();
  return blocks;
}

// Cuts n into equal blocks of at most `limit` (both multiples of P, n rounded up):
// the block size, so that no block is a sliver.
inline int64_t even_block(int64_t n, int64_t limit, int64_t P) {
  const int64_t padded = round_up(n, P);
  limit = std::max(limit / P * P, int64_t{P});
  return round_up(ceil_div(padded, ceil_div(padded, limit)), P);
}

// The K dimension cut into `count` blocks of equal depth (the last may be shorter),
// so that a K just above KC does not leave a sliver block. With a `granule` (k and kc
// multiples of it), every depth is a multiple of it too.
struct KBlocks {
  int64_t k = 0, count = 0, size = 0;
  KBlocks(int64_t k_, int64_t kc, int64_t granule = 1) : k(k_) {
    count = k > 0 ? ceil_div(k, kc) : 0;
    size = count > 0 ? round_up(ceil_div(k, count), granule) : 0;
    count = size > 0 ? ceil_div(k, size) : 0;
  }
  int64_t begin(int64_t b) const { return b * size; }
  int64_t depth(int64_t b) const { return std::min(size, k - b * size); }
};

// ---------------------------------------------------------------- conversions

#if defined(__AVX2__)
// Eight (four) consecutive T as floats in one instruction or two: whether T has such a
// load (half needs F16C).
template <typename T>
inline constexpr bool kLoad8 = std::is_same_v<T, float> || std::is_same_v<T, bfloat16>
#if defined(__F16C__)
                               || std::is_same_v<T, half>
#endif
    ;

inline __m256 load8(const float* p) { return _mm256_loadu_ps(p); }
inline __m128 load4(const float* p) { return _mm_loadu_ps(p); }
inline void store8(float* p, __m256 v) { _mm256_storeu_ps(p, v); }
// A bfloat16 is the top half of a float: widen the 16-bit lanes and shift them up.
inline __m256 load8(const bfloat16* p) {
  const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}
inline __m128 load4(const bfloat16* p) {
  const __m128i h = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(p));
  return _mm_castsi128_ps(_mm_slli_epi32(_mm_cvtepu16_epi32(h), 16));
}

// p[0..8) = store<T>(v), rounded to nearest even as float_to_bfloat16 does (a NaN
// stays a quiet NaN).
inline void store8(bfloat16* p, __m256 v) {
  const __m256i f = _mm256_castps_si256(v);
  const __m256i top = _mm256_srli_epi32(f, 16);
  const __m256i odd = _mm256_and_si256(top, _mm256_set1_epi32(1));
  const __m256i rounded =
      _mm256_srli_epi32(_mm256_add_epi32(f, _mm256_add_epi32(_mm256_set1_epi32(0x7fff), odd)), 16);
  const __m256i magnitude = _mm256_and_si256(f, _mm256_set1_epi32(0x7fffffff));
  const __m256i nan = _mm256_cmpgt_epi32(magnitude, _mm256_set1_epi32(0x7f800000));
  const __m256i quiet = _mm256_or_si256(top, _mm256_set1_epi32(0x40));
  const __m256i r = _mm256_blendv_epi8(rounded, quiet, nan);
  // Both 128-bit halves pack their four lanes to 16 bits; gather the two results.
  const __m256i packed = _mm256_permute4x64_epi64(_mm256_packus_epi32(r, r), 0x08);
  _mm_storeu_si128(reinterpret_cast<__m128i*>(p), _mm256_castsi256_si128(packed));
}

#if defined(__F16C__)
inline __m256 load8(const half* p) {
  return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
}
inline __m128 load4(const half* p) {
  return _mm_cvtph_ps(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p)));
}
// Rounds to nearest even like float_to_half (overflow gives inf; a NaN stays NaN).
inline void store8(half* p, __m256 v) {
  _mm_storeu_si128(reinterpret_cast<__m128i*>(p), _mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT));
}
#endif

// Elements 0, 2, ..., 14 of p[0..16) as floats (a stride-2 load). Each even element is
// the low half of a 32-bit word.
inline __m256 load8_even(const bfloat16* p) {
  const __m256i words = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
  return _mm256_castsi256_ps(_mm256_slli_epi32(words, 16));
}
#if defined(__F16C__)
inline __m256 load8_even(const half* p) {
  const __m256i low = _mm256_and_si256(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)),
                                       _mm256_set1_epi32(0xffff));
  // Both 128-bit halves pack their four words to 16 bits; gather the two results.
  const __m256i packed = _mm256_permute4x64_epi64(_mm256_packus_epi32(low, low), 0x08);
  return _mm256_cvtph_ps(_mm256_castsi256_si128(packed));
}
#endif
#endif

// out[j] = store<T>(s[j] + beta * load(c[j])) for j < n: a row of float results rounded
// once to a half type (c is not read when beta == 0).
template <typename T>
void round_row(T* out, const float* s, const T* c, float beta, int64_t n) {
  int64_t j = 0;
#if defined(__AVX2__)
  if constexpr (kLoad8<T>) {
    const __m256 vb = _mm256_set1_ps(beta);
    if (beta != 0.0f) {
      for (; j + 8 <= n; j += 8)
        store8(out + j, _mm256_add_ps(_mm256_loadu_ps(s + j), _mm256_mul_ps(vb, load8(c + j))));
    } else {
      for (; j + 8 <= n; j += 8) store8(out + j, _mm256_loadu_ps(s + j));
    }
  }
#endif
  if (beta != 0.0f) {
    for (; j < n; ++j) out[j] = store<T>(s[j] + beta * load(c[j]));
  } else {
    for (; j < n; ++j) out[j] = store<T>(s[j]);
  }
}

// ---------------------------------------------------------------- packing

#if defined(__AVX2__)
// d[0..Rows) = the first Rows lanes of v, Rows <= 8.
template <int Rows>
inline void store_lanes(float* d, __m256 v) {
  if constexpr (Rows == 8) {
    _mm256_storeu_ps(d, v);
  } else {
    __m128 part = _mm256_castps256_ps128(v);
    if constexpr (Rows >= 4) {
      _mm_storeu_ps(d, part);
      part = _mm256_extractf128_ps(v, 1);
    }
    constexpr int at = Rows & 4, rest = Rows & 3;
    if constexpr (rest >= 2) _mm_storel_pi(reinterpret_cast<__m64*>(d + at), part);
    if constexpr (rest == 3) _mm_store_ss(d + at + 2, _mm_movehl_ps(part, part));
    if constexpr (rest == 1) _mm_store_ss(d + at, part);
  }
}

// d[kk * ld + ii] = s[ii * rs + kk] as floats for ii < Rows <= 8, kk < 8: up to eight
// rows of eight values transposed in registers (rows past Rows are not read).
template <int Rows, typename T>
inline void transpose_8(float* d, int64_t ld, const T* s, int64_t rs) {
  __m256 r[8];
  for (int i = 0; i < 8; ++i) r[i] = i < Rows ? load8(s + i * rs) : _mm256_setzero_ps();
  __m256 t[8];
  for (int i = 0; i < 8; i += 2) {  // pairs of rows interleaved
    t[i] = _mm256_unpacklo_ps(r[i], r[i + 1]);
    t[i + 1] = _mm256_unpackhi_ps(r[i], r[i + 1]);
  }
  for (int i = 0; i < 8; i += 4) {  // r[i + m], 128-bit lane l: rows i..i+3 of column 4l+m
    r[i] = _mm256_shuffle_ps(t[i], t[i + 2], 0x44);
    r[i + 1] = _mm256_shuffle_ps(t[i], t[i + 2], 0xee);
    r[i + 2] = _mm256_shuffle_ps(t[i + 1], t[i + 3], 0x44);
    r[i + 3] = _mm256_shuffle_ps(t[i + 1], t[i + 3], 0xee);
  }
  for (int m = 0; m < 4; ++m) {  // rows 0..3 and 4..7 of columns m and 4 + m
    store_lanes<Rows>(d + m * ld, _mm256_permute2f128_ps(r[m], r[4 + m], 0x20));
    store_lanes<Rows>(d + (4 + m) * ld, _mm256_permute2f128_ps(r[m], r[4 + m], 0x31));
  }
}

// Eight K steps of a full panel of P rows: d[kk * P + ii] = s[ii * rs + kk], kk < 8,
// eight rows at a time (rows I.. of the panel).
template <int P, int I = 0, typename T>
inline void transpose_panel_8(float* d, const T* s, int64_t rs) {
  if constexpr (I < P) {
    transpose_8<std::min(8, P - I)>(d + I, P, s + I * rs, rs);
    transpose_panel_8<P, I + 8>(d, s, rs);
  }
}
#endif

#if defined(__AVX512F__)
// d[kk * ld + ii] = row ii's value kk for ii < rows <= 16, kk < 16, where row ii holds
// 16 32-bit values at s + ii * row_bytes: up to sixteen rows transposed in registers
// (lanes past `rows` are neither loaded nor stored). Only moves bits: it serves float
// and bfloat16 pairs alike.
// (GCC 12 wrongly reports the shuffle intrinsics' internal _mm512_undefined_ps() as
// uninitialised: bug 105593.)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
inline void transpose_16(float* d, int64_t ld, const void* s, int64_t row_bytes, int rows) {
  const auto* bytes = static_cast<const char*>(s);
  __m512 r[16], t[16];
  for (int i = 0; i < 16; ++i)
    r[i] = i < rows ? _mm512_loadu_ps(bytes + i * row_bytes) : _mm512_setzero_ps();
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

// As many K steps of a full panel of P rows as whole register transposes cover, from
// a K-contiguous source: d[kk * P + ii] = load(s[ii * rs + kk]). Returns how many.
template <int P, typename T, typename A>
int64_t transpose_steps([[maybe_unused]] A* d, [[maybe_unused]] const T* s,
                        [[maybe_unused]] int64_t rs, [[maybe_unused]] int64_t kc) {
  int64_t kk = 0;
#if defined(__AVX512F__)
  if constexpr (std::is_same_v<T, float>) {
    for (; kk + 16 <= kc; kk += 16)
      for (int ii = 0; ii < P; ii += 16)
        transpose_16(d + kk * P + ii, P, s + ii * rs + kk, rs * 4, std::min(16, P - ii));
    return kk;
  }
#endif
#if defined(__AVX2__)
  if constexpr (std::is_same_v<A, float> && kLoad8<T>)
    for (; kk + 8 <= kc; kk += 8) transpose_panel_8<P>(d + kk * P, s + kk, rs);
#endif
  return kk;
}

// d[j] = load(s[j]) for j < n: eight and then four lanes at a time where T widens in
// registers (with a constant n, as for one K step of a panel, the loops unroll away).
template <typename T, typename A>
inline void widen(A* d, const T* s, int64_t n) {
  int64_t j = 0;
#if defined(__AVX2__)
  if constexpr (std::is_same_v<A, float> && kLoad8<T>) {
    for (; j + 8 <= n; j += 8) _mm256_storeu_ps(d + j, load8(s + j));
    if (j + 4 <= n) {
      _mm_storeu_ps(d + j, load4(s + j));
      j += 4;
    }
  }
#endif
  for (; j < n; ++j) d[j] = load(s[j]);
}

// Packs panels of P rows [i0, i1) (i0 a multiple of P) of the matrix
// M(i, kk) = src[i * rs + kk * cs], valid for i < rows, over all of K; rows past
// `rows` become zeros. Used for A (rows of op(a)) and for B (columns of op(b)).
template <int P, typename T, typename A>
void pack_panels(A* dst, int64_t width, const T* src, int64_t rs, int64_t cs, int64_t rows,
                 int64_t i0, int64_t i1, const KBlocks& kb) {
  if (cs == 1 && rs != 1) {
    // K contiguous (a not transposed, b transposed): a panel's P source rows are read
    // as long streams over all of K, transposed into the panel in registers.
    for (int64_t i = i0; i < i1; i += P) {
      const int64_t valid = std::clamp<int64_t>(rows - i, 0, P);
      for (int64_t b = 0; b < kb.count; ++b) {
        const int64_t k0 = kb.begin(b), kc = kb.depth(b);
        A* d = dst + k0 * width + i * kc;
        const T* s = src + i * rs + k0;
        const int64_t kk0 = valid == P ? transpose_steps<P>(d, s, rs, kc) : 0;
        for (int64_t ii = 0; ii < valid; ++ii)
          for (int64_t kk = kk0; kk < kc; ++kk) d[kk * P + ii] = load(s[ii * rs + kk]);
        for (int64_t ii = valid; ii < P; ++ii)
          for (int64_t kk = 0; kk < kc; ++kk) d[kk * P + ii] = A(0);
      }
    }
    return;
  }
  // Panels whose P rows all exist, and with a contiguous panel dimension (b not
  // transposed, a transposed), are straight copies of source rows: kStepsPerVisit source
  // rows at a time across all of them, so that the source streams in order and each
  // panel gets whole cache lines per visit. One source row at a time wrote each panel
  // one K step per visit, and the panels' write points, kc * P elements apart (a multiple
  // of 2 KiB), fall into a few L1 sets: 8 x 256^3 float32 with A transposed (43 panels
  // of 6 rows), one Xeon core at `avx2`, packing A took 6 % of the samples, now 3 %.
  constexpr int64_t kStepsPerVisit = 16;
  const int64_t full_end =
      rs == 1 ? std::clamp<int64_t>(i0 + (rows - i0) / P * P, i0, i1) : i0;
  for (int64_t b = 0; b < kb.count; ++b) {
    const int64_t k0 = kb.begin(b), kc = kb.depth(b);
    A* block = dst + k0 * width;
    for (int64_t k1 = 0; k1 < kc; k1 += kStepsPerVisit) {
      const int64_t k2 = std::min(kc, k1 + kStepsPerVisit);
      for (int64_t i = i0; i < full_end; i += P) {
        A* d = block + i * kc;
        const T* s = src + k0 * cs + i;
        for (int64_t kk = k1; kk < k2; ++kk) widen(d + kk * P, s + kk * cs, P);
      }
    }
    for (int64_t i = full_end; i < i1; i += P) {
      A* d = block + i * kc;
      const int64_t valid = std::clamp<int64_t>(rows - i, 0, P);
      const T* s = src + i * rs + k0 * cs;
      for (int64_t kk = 0; kk < kc; ++kk, d += P) {
        int ii = 0;
        for (; ii < valid; ++ii) d[ii] = load(s[ii * rs + kk * cs]);
        for (; ii < P; ++ii) d[ii] = A(0);
      }
    }
  }
}

#if defined(__AVX512BF16__)
// d[j] = the pairs (row0[j], row1[j]) for j < P: two source rows (K steps) of a panel
// interleaved, 16 columns at a time (the last vector masked where P is no multiple).
// Pair: BfPair, or another 32-bit pair type of the same layout (gemm_amx.h).
template <int P, typename Pair>
inline void interleave_rows(Pair* d, const bfloat16* row0, const bfloat16* row1) {
  for (int j = 0; j < P; j += 16) {
    const int n = std::min(16, P - j);
    const __mmask16 mask = static_cast<__mmask16>((1u << n) - 1);
    const __m512i lo = _mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(mask, row0 + j));
    const __m512i hi = _mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(mask, row1 + j));
    _mm512_mask_storeu_epi32(d + j, mask, _mm512_or_si512(lo, _mm512_slli_epi32(hi, 16)));
  }
}

// pack_panels for bfloat16 pairs: kb counts pairs (K / 2 rounded up, or more), k is K
// itself; pairs past K (the last step of an odd K, a padded K) are zeros.
template <int P, typename Pair>
void pack_panels(Pair* dst, int64_t width, const bfloat16* src, int64_t rs, int64_t cs,
                 int64_t rows, int64_t i0, int64_t i1, const KBlocks& kb, int64_t k) {
  static_assert(sizeof(Pair) == sizeof(uint32_t));
  const auto value = [&](int64_t i, int64_t kk) -> uint32_t {
    return i < rows && kk < k ? src[i * rs + kk * cs].bits : 0;
  };
  for (int64_t b = 0; b < kb.count; ++b) {
    const int64_t p0 = kb.begin(b), kc = kb.depth(b);
    Pair* block = dst + p0 * width;
    // Pairs wholly inside K; panels whose P rows all exist.
    const int64_t whole = std::clamp<int64_t>(k / 2 - p0, 0, kc);
    const int64_t full_end = std::clamp<int64_t>(i0 + (rows - i0) / P * P, i0, i1);
    int64_t done = 0;  // pairs of the full panels packed in registers
    if (cs == 1 && rs != 1) {
      // K contiguous: each pair is one 32-bit word of a source row; transpose them.
      done = whole / 16 * 16;
      for (int64_t i = i0; i < full_end; i += P)
        for (int64_t pp = 0; pp < done; pp += 16)
          for (int ii = 0; ii < P; ii += 16)
            transpose_16(reinterpret_cast<float*>(block + i * kc + pp * P + ii), P,
                         src + (i + ii) * rs + 2 * (p0 + pp), rs * 2, std::min(16, P - ii));
    } else if (rs == 1) {
      // Panel dimension contiguous: two source rows at a time across all full panels,
      // so that the source streams in order.
      done = whole;
      for (int64_t pp = 0; pp < done; ++pp) {
        const bfloat16* row0 = src + 2 * (p0 + pp) * cs;
        for (int64_t i = i0; i < full_end; i += P)
          interleave_rows<P>(block + i * kc + pp * P, row0 + i, row0 + cs + i);
      }
    }
    for (int64_t i = i0; i < i1; i += P) {
      Pair* d = block + i * kc;
      for (int64_t pp = i < full_end ? done : 0; pp < kc; ++pp) {
        const int64_t kk = 2 * (p0 + pp);
        for (int ii = 0; ii < P; ++ii)
          d[pp * P + ii].bits = value(i + ii, kk) | value(i + ii, kk + 1) << 16;
      }
    }
  }
}
#endif

// ---------------------------------------------------------------- micro-kernels
//
// acc = (MR x kc panel of A) @ (kc x NR panel of B), then for the top-left mr x nr:
//   dst[i, j] = alpha * acc[i, j] + beta * src[i, j]   (src not read when beta == 0).
// src may equal dst (accumulating over K blocks).

#if defined(OXIJAX_GEMM_X86_KERNEL)
template <typename A> struct Simd;
#if defined(__AVX512F__)
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
  // Elements 0, 2, 4, ... of lo then of hi: the lanes of a stride-2 load of two vectors.
  static V even_lanes(V lo, V hi) {
    const __m512i even =
        _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
    return _mm512_permutex2var_ps(lo, even, hi);
  }
  static Mask lanes(uint32_t bits) { return static_cast<Mask>(bits); }
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
  static V even_lanes(V lo, V hi) {
    return _mm512_permutex2var_pd(lo, _mm512_setr_epi64(0, 2, 4, 6, 8, 10, 12, 14), hi);
  }
  static Mask lanes(uint32_t bits) { return static_cast<Mask>(bits); }
};
#else
// AVX2 masks are vectors whose lanes are all ones (on) or zeros (off); masked loads do
// not touch the lanes that are off.
template <> struct Simd<float> {
  using V = __m256;
  using Mask = __m256i;
  static constexpr int kLanes = 8;
  static V zero() { return _mm256_setzero_ps(); }
  static V set1(float x) { return _mm256_set1_ps(x); }
  static V load(const float* p) { return _mm256_loadu_ps(p); }
  static void store(float* p, V v) { _mm256_storeu_ps(p, v); }
  static V fma(V a, V b, V c) { return _mm256_fmadd_ps(a, b, c); }
  static V mul(V a, V b) { return _mm256_mul_ps(a, b); }
  static V maskz_load(Mask m, const float* p) { return _mm256_maskload_ps(p, m); }
  static V mask_load(V old, Mask m, const float* p) {
    return _mm256_blendv_ps(old, _mm256_maskload_ps(p, m), _mm256_castsi256_ps(m));
  }
  // Lane j is on when bit j of `bits` is set.
  static Mask lanes(uint32_t bits) {
    const __m256i bit = _mm256_setr_epi32(1, 2, 4, 8, 16, 32, 64, 128);
    return _mm256_cmpeq_epi32(_mm256_and_si256(_mm256_set1_epi32(int(bits)), bit), bit);
  }
  // Elements 0, 2, 4, ... of lo then of hi: the lanes of a stride-2 load of two vectors.
  // (shuffle: lo0 lo2 hi0 hi2 | lo4 lo6 hi4 hi6; then the middle 64-bit pairs swapped)
  static V even_lanes(V lo, V hi) {
    const __m256 pairs = _mm256_shuffle_ps(lo, hi, 0x88);
    return _mm256_castpd_ps(_mm256_permute4x64_pd(_mm256_castps_pd(pairs), 0xd8));
  }
};
template <> struct Simd<double> {
  using V = __m256d;
  using Mask = __m256i;
  static constexpr int kLanes = 4;
  static V zero() { return _mm256_setzero_pd(); }
  static V set1(double x) { return _mm256_set1_pd(x); }
  static V load(const double* p) { return _mm256_loadu_pd(p); }
  static void store(double* p, V v) { _mm256_storeu_pd(p, v); }
  static V fma(V a, V b, V c) { return _mm256_fmadd_pd(a, b, c); }
  static V mul(V a, V b) { return _mm256_mul_pd(a, b); }
  static V maskz_load(Mask m, const double* p) { return _mm256_maskload_pd(p, m); }
  static V mask_load(V old, Mask m, const double* p) {
    return _mm256_blendv_pd(old, _mm256_maskload_pd(p, m), _mm256_castsi256_pd(m));
  }
  static Mask lanes(uint32_t bits) {
    const __m256i bit = _mm256_setr_epi64x(1, 2, 4, 8);
    return _mm256_cmpeq_epi64(_mm256_and_si256(_mm256_set1_epi64x(bits), bit), bit);
  }
  static V even_lanes(V lo, V hi) {  // (lo0 hi0 lo2 hi2, then the middle pair swapped)
    return _mm256_permute4x64_pd(_mm256_unpacklo_pd(lo, hi), 0xd8);
  }
};
#endif

// How far ahead of the FMAs (in K steps) the micro-kernel prefetches its A sliver
// into L1: the sliver streams from L2, B's micro-panel already sits in L1.
inline constexpr int kPrefetchSteps = 8;
// The K steps before its end at which a micro-kernel call prefetches its tile of C:
// a few hundred cycles, enough to hide an L2 or L3 hit, yet late enough that the A and
// B streams do not evict the lines again before the tile is stored (the rows of a tile
// often share one L1 set, as leading dimensions tend to be powers of two).
inline constexpr int64_t kPrefetchCSteps = 32;

// acc += (ROWS x steps of an A sliver whose K steps are MR apart) @ (steps x NV vectors
// of a B micro-panel whose K steps are NR apart).
template <int MR, int NR, typename A, typename V, int ROWS, int NV>
inline void multiply_steps(int64_t steps, const A* a, const A* b, V (&acc)[ROWS][NV]) {
  using S = Simd<A>;
  constexpr int L = S::kLanes;
#pragma GCC unroll 4
  for (int64_t k = 0; k < steps; ++k) {
    _mm_prefetch(reinterpret_cast<const char*>(a + kPrefetchSteps * MR), _MM_HINT_T0);
    V bv[NV];
#pragma GCC unroll 8
    for (int v = 0; v < NV; ++v) bv[v] = S::load(b + v * L);
#pragma GCC unroll 64
    for (int i = 0; i < ROWS; ++i) {
      const V ai = S::set1(a[i]);
#pragma GCC unroll 8
      for (int v = 0; v < NV; ++v) acc[i][v] = S::fma(ai, bv[v], acc[i][v]);
    }
    a += MR;
    b += NR;
  }
}

#if defined(__AVX512BF16__)
// The same over A and B pairs: each VDPBF16PS adds two K steps' products to 16 float
// lanes.
template <int MR, int NR, typename V, int ROWS, int NV>
inline void multiply_steps(int64_t steps, const BfPair* a, const BfPair* b, V (&acc)[ROWS][NV]) {
  constexpr int L = 16;
#pragma GCC unroll 4
  for (int64_t k = 0; k < steps; ++k) {
    _mm_prefetch(reinterpret_cast<const char*>(a + kPrefetchSteps * MR), _MM_HINT_T0);
    __m512bh bv[NV];
#pragma GCC unroll 8
    for (int v = 0; v < NV; ++v) bv[v] = (__m512bh)_mm512_loadu_si512(b + v * L);
#pragma GCC unroll 64
    for (int i = 0; i < ROWS; ++i) {
      const __m512bh ai = (__m512bh)_mm512_set1_epi32(int(a[i].bits));
#pragma GCC unroll 8
      for (int v = 0; v < NV; ++v) acc[i][v] = _mm512_dpbf16_ps(acc[i][v], ai, bv[v]);
    }
    a += MR;
    b += NR;
  }
}
#endif

// A full tile: alpha * acc (+ beta * src) stored as whole vectors.
template <typename A, typename V, int MR, int NV>
inline void store_tile(const V (&acc)[MR][NV], A* dst, int64_t ldd, const A* src, int64_t lds,
                       A alpha, A beta) {
  using S = Simd<A>;
  constexpr int L = S::kLanes;
  const V va = S::set1(alpha), vb = S::set1(beta);
#pragma GCC unroll 64
  for (int i = 0; i < MR; ++i) {
#pragma GCC unroll 8
    for (int v = 0; v < NV; ++v) {
      V r = S::mul(va, acc[i][v]);
      if (beta != A(0)) r = S::fma(vb, S::load(src + i * lds + v * L), r);
      S::store(dst + i * ldd + v * L, r);
    }
  }
}

// An edge tile: only its top-left mr x nr is stored (src read there alone).
template <typename A, typename V, int MR, int NV>
inline void store_edge_tile(const V (&acc)[MR][NV], A* dst, int64_t ldd, const A* src,
                            int64_t lds, A alpha, A beta, int mr, int nr) {
  using S = Simd<A>;
  constexpr int L = S::kLanes;
#if defined(__AVX512F__)
  // Masked lanes are neither loaded nor stored.
  typename S::Mask mask[NV];
  for (int v = 0; v < NV; ++v) {
    const int left = std::clamp(nr - v * L, 0, L);
    mask[v] = static_cast<typename S::Mask>(left == L ? ~0u : (1u << left) - 1);
  }
  const V va = S::set1(alpha), vb = S::set1(beta);
#pragma GCC unroll 64
  for (int i = 0; i < MR; ++i) {  // unrolled, so that acc stays in registers
    if (i >= mr) break;
#pragma GCC unroll 8
    for (int v = 0; v < NV; ++v) {
      V r = S::mul(va, acc[i][v]);
      if (beta != A(0)) r = S::fma(vb, S::maskz_load(mask[v], src + i * lds + v * L), r);
      S::mask_store(dst + i * ldd + v * L, mask[v], r);
    }
  }
#else
  // Through memory: AVX2 masked stores are slow, and edge tiles are rare.
  alignas(64) A tile[MR][NV * L];
#pragma GCC unroll 64
  for (int i = 0; i < MR; ++i)
#pragma GCC unroll 8
    for (int v = 0; v < NV; ++v) S::store(&tile[i][v * L], acc[i][v]);
  for (int i = 0; i < mr; ++i)
    for (int j = 0; j < nr; ++j) {
      A r = alpha * tile[i][j];
      if (beta != A(0)) r += beta * src[i * lds + j];
      dst[i * ldd + j] = r;
    }
#endif
}

// The top-left ROWS x NV vectors of an MR x NR tile (mr x nr of them stored).
template <int ROWS, int NV, typename P, typename A>
void tile_kernel(int64_t kc, const P* __restrict a, const P* __restrict b, A* dst,
                 int64_t ldd, const A* src, int64_t lds, A alpha, A beta, int mr, int nr) {
  using S = Simd<A>;
  using V = typename S::V;
  constexpr int MR = Blocking<A>::kMR, NR = Blocking<A>::kNR;
  V acc[ROWS][NV];
#pragma GCC unroll 64
  for (int i = 0; i < ROWS; ++i)
#pragma GCC unroll 8
    for (int v = 0; v < NV; ++v) acc[i][v] = S::zero();
  const int64_t head = std::max<int64_t>(kc - kPrefetchCSteps, 0);
  multiply_steps<MR, NR>(head, a, b, acc);
  for (int i = 0; i < mr; ++i) {
    _mm_prefetch(reinterpret_cast<const char*>(dst + i * ldd), _MM_HINT_T0);
    _mm_prefetch(reinterpret_cast<const char*>(dst + i * ldd + nr - 1), _MM_HINT_T0);
  }
  multiply_steps<MR, NR>(kc - head, a + head * MR, b + head * NR, acc);
  if (mr == ROWS && nr == NV * S::kLanes)
    store_tile(acc, dst, ldd, src, lds, alpha, beta);
  else
    store_edge_tile(acc, dst, ldd, src, lds, alpha, beta, mr, nr);
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

// The top-left ROWS x NV vectors of an MR x NR tile (mr x nr of them stored).
template <int ROWS, int NV, typename P, typename A>
void tile_kernel(int64_t kc, const P* __restrict a, const P* __restrict b, A* dst,
                 int64_t ldd, const A* src, int64_t lds, A alpha, A beta, int mr, int nr) {
  using V = typename Vec<A>::type;
  constexpr int MR = Blocking<A>::kMR, NR = Blocking<A>::kNR, L = kVecBytes / sizeof(A);
  V acc[ROWS][NV];
  for (int i = 0; i < ROWS; ++i)
    for (int v = 0; v < NV; ++v) acc[i][v] = V{};
  for (int64_t k = 0; k < kc; ++k, a += MR, b += NR) {
    V bv[NV];
    for (int v = 0; v < NV; ++v) std::memcpy(&bv[v], b + v * L, sizeof(V));
    for (int i = 0; i < ROWS; ++i) {
      const V ai = V{} + a[i];
      for (int v = 0; v < NV; ++v) acc[i][v] = madd(ai, bv[v], acc[i][v]);
    }
  }
  A tile[ROWS][NV * L];
  std::memcpy(tile, acc, sizeof tile);
  for (int i = 0; i < mr; ++i)
    for (int j = 0; j < nr; ++j) {
      A r = alpha * tile[i][j];
      if (beta != A(0)) r += beta * src[i * lds + j];
      dst[i * ldd + j] = r;
    }
}
#endif

// The rows of a tile kernel for mr rows: as few of kMR, kMidRows, kFewRows as hold them.
template <int NV, typename P, typename A>
void tile_rows(int64_t kc, const P* __restrict a, const P* __restrict b, A* dst, int64_t ldd,
               const A* src, int64_t lds, A alpha, A beta, int mr, int nr) {
  using B = Blocking<A>;
  if (mr > B::kMidRows)
    tile_kernel<B::kMR, NV>(kc, a, b, dst, ldd, src, lds, alpha, beta, mr, nr);
  else if (mr > B::kFewRows)
    tile_kernel<B::kMidRows, NV>(kc, a, b, dst, ldd, src, lds, alpha, beta, mr, nr);
  else
    tile_kernel<B::kFewRows, NV>(kc, a, b, dst, ldd, src, lds, alpha, beta, mr, nr);
}

// P: the packed element type; its accumulator type A is what dst holds. Computes the
// top-left mr x nr of an MR x NR tile, with only as many of its rows as needed and
// half of its columns when nr fits them.
template <typename P, typename A = Acc<P>>
void micro_kernel(int64_t kc, const P* __restrict a, const P* __restrict b, A* dst,
                  int64_t ldd, const A* src, int64_t lds, A alpha, A beta, int mr, int nr) {
  constexpr int NR = Blocking<A>::kNR;
  if (nr > NR / 2)
    tile_rows<kTileVectors>(kc, a, b, dst, ldd, src, lds, alpha, beta, mr, nr);
  else
    tile_rows<kTileVectors / 2>(kc, a, b, dst, ldd, src, lds, alpha, beta, mr, nr);
}

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

// The MR rows of nr elements at p (ld apart) into L2, one micro-kernel call before the
// call that stores them: an output the program has not touched lately comes from memory,
// which the kernel's own prefetch, a few hundred cycles before its stores, cannot hide.
// One Xeon core, 8 x 256^3 float32 (A transposed) into outputs rotating over 64 MiB,
// medians of eight alternating runs: `avx2` 82.5 -> 85 GFLOP/s, `avx512` 119 -> 125;
// jitted, 3.06-3.19 -> 2.96-3.01 ms; 1024^3 unchanged.
template <int MR, typename A>
inline void prefetch_tile_to_l2(const A* p, int64_t ld, int nr) {
  for (int i = 0; i < MR; ++i) {
    __builtin_prefetch(p + i * ld, 1, 2);
    __builtin_prefetch(p + i * ld + nr - 1, 1, 2);
  }
}

// What a thread sets up before running micro-kernels on packed elements P and undoes
// after: nothing, but for AMX's tiles (gemm_amx.h).
template <typename P>
struct TileScope {};

// Computes rows [r0, r1) x columns [c0, c1) of the product of packed A (a_width rows)
// and packed B (b_width columns) over all of K, both packed as P (kb counts P steps).
// r0 and c0 are multiples of MR and NR; t.out / t.c point at element (0, 0). For half
// types, `scratch` (cache_blocks<P>().mc * (c1 - c0) floats) accumulates an MC-row
// stripe in float, rounded once when it is stored.
template <typename T, typename P = Acc<T>>
void compute_region(const P* ap, int64_t a_width, const P* bp, int64_t b_width,
                    const KBlocks& kb, int64_t r0, int64_t r1, int64_t c0, int64_t c1,
                    const Target<T>& t, Acc<T>* scratch) {
  using A = Acc<T>;
  constexpr bool kDirect = std::is_same_v<T, A>;
  constexpr int MR = PanelShape<P>::kMR, NR = PanelShape<P>::kNR;
  const int64_t mc = cache_blocks<P>().mc;
  [[maybe_unused]] const TileScope<P> tiles;
  const int64_t ls = c1 - c0;  // scratch row length
  for (int64_t ic = r0; ic < r1; ic += mc) {
    const int64_t ie = std::min(ic + mc, r1);
    for (int64_t blk = 0; blk < kb.count; ++blk) {
      const int64_t k0 = kb.begin(blk), kc = kb.depth(blk);
      const bool first = blk == 0;
      const P* ablk = ap + k0 * a_width;
      const P* bblk = bp + k0 * b_width;
      for (int64_t jr = c0; jr < c1; jr += NR) {
        const int nr = static_cast<int>(std::min<int64_t>(NR, c1 - jr));
        for (int64_t ir = ic; ir < ie; ir += MR) {
          const int mr = static_cast<int>(std::min<int64_t>(MR, ie - ir));
          if constexpr (kDirect) {
            A* dst = t.out + ir * t.ld + jr;
            if (ir + MR < ie) prefetch_tile_to_l2<MR>(dst + MR * t.ld, t.ld, nr);
            const A* src = first ? (t.beta != A(0) ? t.c + ir * t.ld + jr : nullptr) : dst;
            micro_kernel<P>(kc, ablk + ir * kc, bblk + jr * kc, dst, t.ld, src, t.ld, t.alpha,
                            first ? t.beta : A(1), mr, nr);
          } else {
            A* dst = scratch + (ir - ic) * ls + (jr - c0);
            micro_kernel<P>(kc, ablk + ir * kc, bblk + jr * kc, dst, ls, dst, ls, t.alpha,
                            first ? A(0) : A(1), mr, nr);
          }
        }
      }
    }
    if constexpr (!kDirect) {
      for (int64_t i = ic; i < ie; ++i)
        round_row(t.out + i * t.ld + c0, scratch + (i - ic) * ls,
                  t.beta != A(0) ? t.c + i * t.ld + c0 : nullptr, t.beta, ls);
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
