// The bfloat16 gemm on Intel AMX tiles (Sapphire Rapids and newer; the `amx` level),
// plugged into the panel engine of gemm_microkernel.h: its own packed element
// (AmxPair), panel shape, cache blocks, tile set-up (TileScope) and micro-kernel.
//
// One TDPBF16PS multiplies a 16 x 32 bfloat16 tile of A by a 32 x 16 tile of B into a
// 16 x 16 float tile of C: 8192 products, 16 times VDPBF16PS's on a 512-bit vector. The
// micro-kernel keeps a 32 x 32 block of C in four tile registers and, per 32 K steps,
// loads two tiles of A and two of B (the other four of the eight registers).
//
// Tile operands are rows of 64 bytes in memory, so both packed operands hold bfloat16
// pairs of consecutive K steps, like VDPBF16PS's, and K is padded to a multiple of 32:
//  - B keeps gemm_microkernel.h's pair panels (per pair of K steps, the panel's 32
//    columns' pairs): a tile of B is 16 such rows, half of each, 128 bytes apart;
//  - A is packed in tile order instead: per 16 pairs (32 K steps) of a 32-row panel,
//    each row's 16 pairs (64 bytes) one after another, so a tile of A is 1 KiB in one
//    piece.
// Products of two bfloat16 are exact in float, the sums are float; subnormal inputs
// count as zero, as on VDPBF16PS.
#pragma once

#include <type_traits>

#include "gemm_microkernel.h"

namespace oxijax::cpu::gemm_detail {

// Two bfloat16 of consecutive K steps (the lower step in the low half), packed for the
// AMX micro-kernel: A in tile order, B in pair panels (above). Defined on the amx level.
struct AmxPair;

// Whether P holds bfloat16 pairs (for VDPBF16PS or AMX).
template <typename P>
inline constexpr bool kPairs = std::is_same_v<P, BfPair> || std::is_same_v<P, AmxPair>;

// Re-lays pair panels in AMX's tile order (defined on the amx level only).
template <int P>
void pairs_to_tile_order(AmxPair* dst, const BfPair* src, int64_t width, int64_t kc);

#if defined(__AMX_BF16__)

struct AmxPair {
  uint32_t bits;
};

// Tile registers: 16 rows of 64 bytes, 16 pairs or 16 floats.
inline constexpr int kTileRows = 16, kTilePairs = 16;
// A 32 x 32 block of C: 2 x 2 tiles.
inline constexpr int kAmxBlock = 2 * kTileRows;

template <>
struct PanelShape<AmxPair> {
  static constexpr int kMR = kAmxBlock, kNR = kAmxBlock;
};

// The element gemm packs T into: AmxPair for bfloat16, else as gemm_microkernel.h says.
template <typename T>
using GemmPacked = std::conditional_t<std::is_same_v<T, bfloat16>, AmxPair, Packed<T>>;

// The cache blocks for AMX (every depth a multiple of kTilePairs):
//  - KC: the engine's deepest, 1024 pairs. The tiles of a K block accumulate in place,
//    so a block costs only C's tile loads and stores, and a deeper one fewer of them:
//    bfloat16 on a 2-core Xeon VM with AMX, 1024^3 / 2048^3 took 1.76 / 12.4 ms with
//    256 pairs (B's panel within L1), 1.47 / 9.0 with 1024;
//  - MC: an MC x KC block of A fills half of L2;
//  - pack: as for the other kernels, a quarter of L3 per packed operand.
template <>
inline const CacheBlocks& cache_blocks<AmxPair>() {
  static const CacheBlocks blocks = [] {
    constexpr int64_t kc = kMaxKC;
    const CacheSizes& c = cache_sizes();
    const int64_t mc = std::max<int64_t>(c.l2 / 2 / (kc * 4) / kAmxBlock, 1) * kAmxBlock;
    return CacheBlocks{kc, mc, c.l3 / 4 / int64_t(sizeof(AmxPair))};
  }();
  return blocks;
}

// The tile configuration (palette 1): eight tiles of 16 rows x 64 bytes. Tiles 0-3 hold
// C (rows 0-15 and 16-31, columns 0-15 and 16-31), 4-5 A's rows, 6-7 B's columns.
struct alignas(64) TileConfig {
  uint8_t palette = 1;
  uint8_t start_row = 0;
  uint8_t reserved[14] = {};
  uint16_t bytes_per_row[16] = {64, 64, 64, 64, 64, 64, 64, 64};
  uint8_t rows[16] = {16, 16, 16, 16, 16, 16, 16, 16};
};

// A thread's tiles are configured for the micro-kernel while it runs a region, and
// released after it, so that the thread carries no tile state (8 KiB more to save at
// each context switch) between calls.
template <>
struct TileScope<AmxPair> {
  TileScope() {
    static const TileConfig config;
    _tile_loadconfig(&config);
  }
  ~TileScope() { _tile_release(); }
  TileScope(const TileScope&) = delete;
  TileScope& operator=(const TileScope&) = delete;
};

// The pairs of one 32-step chunk of a panel (A's or B's): 2 KiB.
inline constexpr int64_t kChunkPairs = kAmxBlock * kTilePairs;

// Fetches a chunk into L1 ahead of its tile loads. A tile load waits for the products
// that read its register before (tile registers are not renamed), so loads from L2 are
// not hidden behind the products: one core ran the micro-kernel over panels in L2 at
// 0.75-0.8 TFLOP/s without this, 1.24-1.26 with the next chunk fetched (two or four
// chunks ahead, or every other line: no better).
inline void prefetch_chunk(const AmxPair* chunk) {
  const char* bytes = reinterpret_cast<const char*>(chunk);
  for (int line = 0; line < int(kChunkPairs * 4); line += 64)
    _mm_prefetch(bytes + line, _MM_HINT_T0);
}

// c (32 x 32 floats, rows ldc apart) = c_in (the same layout; zeros if null) + a 32-row
// panel of A @ a 32-column panel of B, kc pairs deep (a multiple of 16).
inline void amx_block(int64_t kc, const AmxPair* a, const AmxPair* b, const float* c_in,
                      float* c, int64_t ldc) {
  constexpr int kRowBytes = kTilePairs * 4, kPanelBytes = kAmxBlock * 4;
  const int64_t c_bytes = ldc * 4, lower = kTileRows * ldc;  // C's rows 16-31
  if (c_in != nullptr) {
    _tile_loadd(0, c_in, c_bytes);
    _tile_loadd(1, c_in + kTileRows, c_bytes);
    _tile_loadd(2, c_in + lower, c_bytes);
    _tile_loadd(3, c_in + lower + kTileRows, c_bytes);
  } else {
    _tile_zero(0);
    _tile_zero(1);
    _tile_zero(2);
    _tile_zero(3);
  }
  for (int64_t p = 0; p < kc; p += kTilePairs) {
    prefetch_chunk(a + kChunkPairs);
    prefetch_chunk(b + kChunkPairs);
    _tile_loadd(4, a, kRowBytes);
    _tile_loadd(5, a + kTileRows * kTilePairs, kRowBytes);
    _tile_loadd(6, b, kPanelBytes);
    _tile_loadd(7, b + kTilePairs, kPanelBytes);
    _tile_dpbf16ps(0, 4, 6);
    _tile_dpbf16ps(1, 4, 7);
    _tile_dpbf16ps(2, 5, 6);
    _tile_dpbf16ps(3, 5, 7);
    a += kChunkPairs;
    b += kChunkPairs;
  }
  _tile_stored(0, c, c_bytes);
  _tile_stored(1, c + kTileRows, c_bytes);
  _tile_stored(2, c + lower, c_bytes);
  _tile_stored(3, c + lower + kTileRows, c_bytes);
}

// The engine's micro-kernel contract (gemm_microkernel.h) on tiles:
// dst = alpha * product + beta * src for the block's top-left mr x nr. The tiles
// accumulate into dst itself when the block is whole, alpha is 1 and src is dst or
// unread (the engine's K blocks after the first, on its float scratch).
template <>
inline void micro_kernel<AmxPair, float>(int64_t kc, const AmxPair* __restrict a,
                                         const AmxPair* __restrict b, float* dst, int64_t ldd,
                                         const float* src, int64_t lds, float alpha,
                                         float beta, int mr, int nr) {
  const bool whole = mr == kAmxBlock && nr == kAmxBlock && alpha == 1.0f;
  if (whole && beta == 0.0f) return amx_block(kc, a, b, nullptr, dst, ldd);
  if (whole && beta == 1.0f && src == dst && lds == ldd) return amx_block(kc, a, b, dst, dst, ldd);
  alignas(64) float product[kAmxBlock * kAmxBlock];
  amx_block(kc, a, b, nullptr, product, kAmxBlock);
  __m512 acc[kAmxBlock][2];
  for (int i = 0; i < kAmxBlock; ++i)
    for (int v = 0; v < 2; ++v) acc[i][v] = _mm512_load_ps(product + i * kAmxBlock + v * 16);
  store_edge_tile(acc, dst, ldd, src, lds, alpha, beta, mr, nr);
}

// dst = the P-row panels of src (`width` rows, kc pairs deep, a multiple of 16, in the
// pair panel layout: pair kk of row ii at panel + kk * P + ii) in tile order (panel +
// (kk / 16) * P * 16 + ii * 16 + kk % 16): 16 x 16 blocks of pairs transposed.
template <int P>
void pairs_to_tile_order(AmxPair* dst, const BfPair* src, int64_t width, int64_t kc) {
  static_assert(P % kTileRows == 0);
  for (int64_t i = 0; i < width; i += P)
    for (int64_t p = 0; p < kc; p += kTilePairs)
      for (int r = 0; r < P; r += kTileRows)
        transpose_16(reinterpret_cast<float*>(dst + i * kc + p * P + r * kTilePairs),
                     kTilePairs, src + i * kc + p * P + r, P * 4, kTilePairs);
}

// Packs A's panels of P rows [i0, i1) (i0 a multiple of P) of
// M(i, kk) = src[i * rs + kk * cs], valid for i < rows and kk < k, in tile order: for K
// block b (start p0 pairs, depth kc) the panel at row i lives at dst + p0 * width + i * kc,
// as kc / 16 chunks of P rows x 16 pairs. Rows and K steps past the matrix are zeros.
template <int P>
void pack_tile_rows(AmxPair* dst, int64_t width, const bfloat16* src, int64_t rs, int64_t cs,
                    int64_t rows, int64_t i0, int64_t i1, const KBlocks& kb, int64_t k) {
  static_assert(P % kTileRows == 0);
  if (cs != 1) {
    // The pair panels of gemm_microkernel.h, a panel at a time, re-laid in tile order.
    Scratch<BfPair> pairs(P * kb.k);
    for (int64_t i = i0; i < i1; i += P) {
      pack_panels<P>(pairs.data(), P, src + i * rs, rs, cs, std::max<int64_t>(rows - i, 0), 0,
                     P, kb, k);
      for (int64_t blk = 0; blk < kb.count; ++blk)
        pairs_to_tile_order<P>(dst + kb.begin(blk) * width + i * kb.depth(blk),
                               pairs.data() + kb.begin(blk) * P, P, kb.depth(blk));
    }
    return;
  }
  // K contiguous: a row's 32 steps are one (masked) 64-byte load.
  for (int64_t blk = 0; blk < kb.count; ++blk) {
    const int64_t p0 = kb.begin(blk), kc = kb.depth(blk);
    for (int64_t i = i0; i < i1; i += P) {
      AmxPair* panel = dst + p0 * width + i * kc;
      for (int64_t p = 0; p < kc; p += kTilePairs) {
        const int64_t k0 = 2 * (p0 + p);  // the chunk's first K step
        const int64_t steps = std::clamp<int64_t>(k - k0, 0, 2 * kTilePairs);
        const __mmask32 in_k = steps == 32 ? ~__mmask32{0} : (__mmask32{1} << steps) - 1;
        for (int r = 0; r < P; ++r) {
          const __m512i row = i + r < rows
                                  ? _mm512_maskz_loadu_epi16(in_k, src + (i + r) * rs + k0)
                                  : _mm512_setzero_si512();
          _mm512_storeu_si512(panel + p * P + r * kTilePairs, row);
        }
      }
    }
  }
}

#endif

// ---------------------------------------------------------------- gemm's packing

#if !defined(__AMX_BF16__)
template <typename T>
using GemmPacked = Packed<T>;
#endif

// Whether T's products run on AMX tiles on this level (bfloat16 on `amx`).
template <typename T>
inline constexpr bool kOnTiles = !std::is_same_v<GemmPacked<T>, Packed<T>>;

// The smallest M * N * K that runs on tiles: below it their set-up (and the padding to
// 32 x 32 x 32) costs more than float FMAs (Acc<T>) take. On the 2-core Xeon VM with
// AMX, jitted bfloat16 gemm 4^3 to 16^3 took 6.0-6.5 us on tiles, 5.3-5.6 on FMAs; 32^3
// 6.8-7.4 against 6.7; 48^3 8.0-8.5 against 9.2. 3x3 conv2d, jitted, on tiles against
// FMAs: 1x4x8x8 * 4x4x3x3 (M * N * K = 9216) forward 7.5-9.3 us against 7.2-7.4, its
// filter gradient 8.5-8.6 against 7.5; 1x8x8x8 * 16x8x3x3 (73728) forward 9.8-10.0
// against 9.9; 1x16x8x8 * 16x16x3x3 (147456) 10.5-11.1 against 11.8-12.5.
inline constexpr double kMinTileProduct = 40.0 * 40.0 * 40.0;

// K in packed elements P: for AMX padded to whole tiles, so every K block's depth is a
// multiple of kKGranule<P>.
template <typename P>
inline constexpr int64_t kKGranule = 1;
template <typename P>
int64_t packed_depth(int64_t k) {
  return round_up(ceil_div(k, kStepsPer<P>), kKGranule<P>);
}

// Packs panels of R rows [i0, i1) of A (rows of op(a)) or of B (columns of op(b)) into
// P: the layouts of gemm_microkernel.h's pack_panels (k: K in source steps).
template <int R, typename P, typename T>
void pack_a_panels(P* dst, int64_t width, const T* src, int64_t rs, int64_t cs, int64_t rows,
                   int64_t i0, int64_t i1, const KBlocks& kb, int64_t k) {
  if constexpr (std::is_same_v<P, BfPair>)
    pack_panels<R>(dst, width, src, rs, cs, rows, i0, i1, kb, k);
  else
    pack_panels<R>(dst, width, src, rs, cs, rows, i0, i1, kb);
}
template <int R, typename P, typename T>
void pack_b_panels(P* dst, int64_t width, const T* src, int64_t rs, int64_t cs, int64_t rows,
                   int64_t i0, int64_t i1, const KBlocks& kb, int64_t k) {
  pack_a_panels<R>(dst, width, src, rs, cs, rows, i0, i1, kb, k);
}

#if defined(__AMX_BF16__)
template <>
inline constexpr int64_t kKGranule<AmxPair> = kTilePairs;
template <>
inline constexpr int64_t kStepsPer<AmxPair> = 2;

// A in tile order, B in pair panels.
template <int R>
void pack_a_panels(AmxPair* dst, int64_t width, const bfloat16* src, int64_t rs, int64_t cs,
                   int64_t rows, int64_t i0, int64_t i1, const KBlocks& kb, int64_t k) {
  pack_tile_rows<R>(dst, width, src, rs, cs, rows, i0, i1, kb, k);
}
template <int R>
void pack_b_panels(AmxPair* dst, int64_t width, const bfloat16* src, int64_t rs, int64_t cs,
                   int64_t rows, int64_t i0, int64_t i1, const KBlocks& kb, int64_t k) {
  pack_panels<R>(dst, width, src, rs, cs, rows, i0, i1, kb, k);
}
#endif

}  // namespace oxijax::cpu::gemm_detail
