// CUDA attention forward (FlashAttention-2 style): per (batch*head, block of query
// rows) the query block and the output accumulator stay on chip while key/value tiles
// stream past with an online softmax (oxijax/math.h OnlineSoftmax, one per row and
// owner thread); the Sq x Skv score matrix is never stored.
//
// Two kernels:
//
// * Tensor-core path (float16 / bfloat16, head_dim up to 256, 16-byte aligned pointers,
//   sm_80+; mma_tile.h). The head dim is padded to 64, 128, 192 or 256 in shared memory
//   (zero columns, skipped k-steps). One CTA of 4 warps per (b*h, 64
//   query rows); warp w owns rows 16w..16w+15. The Q tile is loaded once (cp.async) and,
//   up to head dim 128, kept in registers as mma A fragments. K/V tiles of 64 keys (32
//   above head dim 128, where the output accumulators take 128 registers) are double
//   buffered in shared memory by cp.async (tile t+1 loads while tile t computes).
//   S = Q.K^T and O += P.V use mma.sync.m16n8k16 (float32 accumulate); P is rounded to
//   the input type for the second product, as FlashAttention-2 does. Each thread holds
//   rows g and g+8 of its warp (g = lane/4) across the 4 lanes of a quad: the block max
//   is reduced over the quad with shuffles, the running sums stay per thread and are
//   summed once at the end. Shared tiles are XOR-swizzled (mma_tile.h) so that cp.async
//   stores and ldmatrix loads are bank-conflict free.
//   Causal: key tiles past the block's last visible key are never loaded; only tiles
//   that reach past a warp's first row's key_end are masked; a warp skips tiles that
//   none of its rows can see. Exponentials use ex2.approx on the score scaled by
//   scale*log2(e) minus max*log2(e) (one FFMA + MUFU per score).
//
// * SIMT path (float32, float64, and the half types with any other head_dim or
//   unaligned pointers). One CTA of 128 threads (8 x 16) per (b*h, 32 query rows,
//   chunk of output columns: 128 for float32 and the half types, 64 for float64);
//   thread (ty, tx) owns rows 4ty..4ty+3, keys tx + 16j of each key tile, and
//   columns tx*VW.. of each 16*VW-wide column slice (VW = 16 bytes / sizeof(Acc)).
//   S is accumulated over head_dim in chunks of 16 through shared memory, P goes
//   through shared memory, V is staged through shared memory in (key half, column
//   slice) pieces; each stage's global loads are issued into registers before the
//   previous stage computes (register prefetch), so any T converts on the way in.
//   Any head_dim works: a head_dim wider than one column chunk recomputes S once per
//   extra chunk; the softmax statistics of every chunk are computed identically, and
//   chunk 0 writes the log-sum-exp. float64 computes in float64 (exp), the others in
//   float32 (expf) with OnlineSoftmax::weight itself.
//
// Both write lse (log-sum-exp of the scaled scores; -inf for a fully masked row, whose
// output is zeros) for every row. Launchers only enqueue; they return cudaSuccess
// without launching when there is no query row, else the launch's status.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <climits>
#include <cstdint>
#include <limits>
#include <type_traits>

#include "convert.h"
#include "kernels.h"
#include "launch.h"
#include "mma_tile.h"
#include "oxijax/math.h"
#include "ptx.h"

namespace oxijax::cuda {
namespace {

using mma_tile::kLog2e;
using mma_tile::kMaxSeq;
constexpr int64_t kMaxDim = int64_t(1) << 24;  // the SIMT path's 32-bit stage offsets

struct AttnParams {
  int64_t tasks;       // batch*heads * q_blocks * d_chunks
  int seq_q, seq_kv, dim;
  int q_blocks;        // ceil(seq_q / block rows)
  int d_chunks;        // output column chunks per (b*h, q block); 1 for the mma path
  int causal;
  double scale;        // the SIMT path's scale (cast to Acc)
  float scale_f;       // mma path: scale, and scale * log2(e)
  float scale_log2e;
};

// attention_key_end in the kernels' 32-bit sequence lengths: keys [0, key_end(row)) are
// visible.
__device__ __forceinline__ int key_end(int seq_q, int seq_kv, bool causal, int64_t row) {
  return int(attention_key_end(seq_q, seq_kv, causal, row));
}

// ============================================================== tensor-core path

constexpr int kMmaRows = 64;     // query rows per CTA (4 warps x 16)
constexpr int kMmaThreads = 128;

// Keys per K/V tile: 32 above head dim 128, where the output accumulators take 128
// registers per thread; Q fragments stay in registers up to head dim 128 and are
// reloaded from shared memory per k-step above it.
template <int D> constexpr int kMmaKeys = D <= 128 ? 64 : 32;
template <int D> constexpr bool kQInRegisters = D <= 128;

template <int D> constexpr size_t mma_smem_bytes() {  // Q + 2 x K + 2 x V tiles
  return (size_t(kMmaRows) + 4 * kMmaKeys<D>) * D * sizeof(uint16_t);
}

// D: the padded head dim in 16-bit units (twice the float32 columns for TF32).
template <mma_tile::MmaInput kIn, int D>
__global__ void __launch_bounds__(kMmaThreads, D == 64 ? 3 : 2)
    attention_mma_kernel(const AttnParams p, const uint16_t* __restrict__ q,
                         const uint16_t* __restrict__ k, const uint16_t* __restrict__ v,
                         uint16_t* __restrict__ out, float* __restrict__ lse) {
  using namespace mma_tile;
  constexpr bool kTf32 = kIn == MmaInput::kTF32;
  constexpr bool kBf16 = kIn == MmaInput::kBF16;
  constexpr int kKeys = kMmaKeys<D>;
  constexpr int kKVTile = kKeys * D;     // 16-bit units of one K or V tile
  constexpr int kChunks = D / 8;
  constexpr int kDSteps = D / 16;        // k-steps of S = Q.K^T
  constexpr int kOTiles = kTf32 ? D / 16 : D / 8;  // n8 tiles of the output columns
  constexpr int kNTiles = kKeys / 8;     // n8 tiles of S
  constexpr float kNegInf = -std::numeric_limits<float>::infinity();

  OXIJAX_DYNAMIC_SHARED(smem_raw, 128);
  uint16_t* const s_q = reinterpret_cast<uint16_t*>(smem_raw);  // [64][D], later O staging
  const uint32_t q_addr = ptx::shared_address(s_q);
  const uint32_t k_addr = q_addr + 2u * kMmaRows * D;  // [2][kKeys][D]
  const uint32_t v_addr = k_addr + 4u * kKVTile;       // [2][kKeys][D]

  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  const int g = lane >> 2, tq = lane & 3;  // mma groupID, thread in group
  const int seq_q = p.seq_q, seq_kv = p.seq_kv;
  const int dim = kTf32 ? 2 * p.dim : p.dim;  // 16-bit units per row
  const bool causal = p.causal != 0;

  for (int64_t task = blockIdx.x; task < p.tasks; task += gridDim.x) {
    if (task != blockIdx.x) __syncthreads();  // the previous task's smem readers are done
    const int64_t bh = task / p.q_blocks;
    const int qi = int(task % p.q_blocks);
    const int qb = causal ? p.q_blocks - 1 - qi : qi;  // causal: longest blocks first
    const int m0 = qb * kMmaRows;
    const uint16_t* qg = q + bh * seq_q * int64_t(dim);
    const uint16_t* kg = k + bh * seq_kv * int64_t(dim);
    const uint16_t* vg = v + bh * seq_kv * int64_t(dim);

    // Keys [0, kv_end) cover every real row of the block (key_end is non-decreasing).
    const int kv_end = key_end(seq_q, seq_kv, causal, min(m0 + kMmaRows - 1, seq_q - 1));
    const int n_tiles = (kv_end + kKeys - 1) / kKeys;
    const int wrow0 = m0 + warp * 16;
    const bool warp_live = wrow0 < seq_q;
    const int warp_kv_min = key_end(seq_q, seq_kv, causal, wrow0);  // no mask needed below it
    const int warp_kv_max = warp_live ? key_end(seq_q, seq_kv, causal, min(wrow0 + 15, seq_q - 1)) : 0;
    const int kend[2] = {key_end(seq_q, seq_kv, causal, wrow0 + g), key_end(seq_q, seq_kv, causal, wrow0 + g + 8)};

    float o[kOTiles][4];
#pragma unroll
    for (int n = 0; n < kOTiles; ++n)
#pragma unroll
      for (int e = 0; e < 4; ++e) o[n][e] = 0.f;
    OnlineSoftmax<float> os[2];  // rows g and g + 8 (this thread's share of the quad)

    if (n_tiles > 0) {
      load<kMmaRows, D, kMmaThreads>(q_addr, qg, m0, seq_q, dim, tid);
      ptx::cp_async_commit();
      load<kKeys, D, kMmaThreads>(k_addr, kg, 0, seq_kv, dim, tid);
      load<kKeys, D, kMmaThreads>(v_addr, vg, 0, seq_kv, dim, tid);
      ptx::cp_async_commit();
      ptx::cp_async_wait<1>();  // the Q group is done
      __syncthreads();

      // A fragments of the warp's 16 rows (reloaded per k-step when not kept here).
      uint32_t qf[kQInRegisters<D> ? kDSteps : 1][4];
      if constexpr (kQInRegisters<D>) {
#pragma unroll
        for (int kk = 0; kk < kDSteps; ++kk) {
          load_a<D>(qf[kk], q_addr, warp * 16, kk, lane);
          if constexpr (kTf32) round_tf32(qf[kk]);
        }
      }

      for (int t = 0; t < n_tiles; ++t) {
        const int n0 = t * kKeys;
        const uint32_t stage_off = 2u * uint32_t(kKVTile) * uint32_t(t & 1);
        if (t + 1 < n_tiles) {  // prefetch tile t+1 into the other stage
          const uint32_t next_off = 2u * uint32_t(kKVTile) * uint32_t((t + 1) & 1);
          load<kKeys, D, kMmaThreads>(k_addr + next_off, kg, n0 + kKeys, seq_kv, dim, tid);
          load<kKeys, D, kMmaThreads>(v_addr + next_off, vg, n0 + kKeys, seq_kv, dim, tid);
        }
        ptx::cp_async_commit();   // possibly empty: keeps one group per iteration
        ptx::cp_async_wait<1>();  // all but the newest group: tile t has landed
        __syncthreads();

        if (n0 < warp_kv_max) {  // warp-uniform: some row of this warp sees a key here
          // ---- S = Q . K^T (16 x kKeys per warp), over the real head dim's k-steps
          float s[kNTiles][4];
#pragma unroll
          for (int j = 0; j < kNTiles; ++j)
#pragma unroll
            for (int e = 0; e < 4; ++e) s[j][e] = 0.f;
          const uint32_t kb = k_addr + stage_off;
#pragma unroll
          for (int kk = 0; kk < kDSteps; ++kk) {
            if (16 * kk < dim) {
              uint32_t reloaded[4];
              if constexpr (!kQInRegisters<D>) {
                load_a<D>(reloaded, q_addr, warp * 16, kk, lane);
                if constexpr (kTf32) round_tf32(reloaded);
              }
              const uint32_t(&a)[4] = kQInRegisters<D> ? qf[kk] : reloaded;
#pragma unroll
              for (int nb = 0; nb < kNTiles / 2; ++nb) {
                uint32_t b[4];
                load_b_rows<D>(b, kb, 16 * nb, kk, lane);
                if constexpr (kTf32) round_tf32(b);
                mma_pair<kIn>(s[2 * nb], s[2 * nb + 1], a, b);
              }
            }
          }

          // ---- mask: keys at or past a row's key_end (causal, or past seq_kv), only in
          // tiles that reach past the warp's first row's key_end (warp-uniform). Masked
          // scores are dropped by selects, from the max and after the exponential, never
          // scaled as -inf: -inf * a scale that rounds to 0 in float would be NaN.
          const bool edge = n0 + kKeys > warp_kv_min;
          const auto masked = [&](int j, int e) {
            return n0 + 8 * j + 2 * tq + (e & 1) >= kend[e >> 1];
          };

          // ---- online softmax (rows g, g+8; the quad's 4 lanes share a row)
          float mx[2] = {kNegInf, kNegInf};
          if (edge) {
#pragma unroll
            for (int j = 0; j < kNTiles; ++j)
#pragma unroll
              for (int e = 0; e < 4; ++e)
                mx[e >> 1] = fmaxf(mx[e >> 1], masked(j, e) ? kNegInf : s[j][e]);
          } else {
#pragma unroll
            for (int j = 0; j < kNTiles; ++j) {
              mx[0] = fmaxf(mx[0], fmaxf(s[j][0], s[j][1]));
              mx[1] = fmaxf(mx[1], fmaxf(s[j][2], s[j][3]));
            }
          }
#pragma unroll
          for (int r = 0; r < 2; ++r) {
            mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 1));
            mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 2));
            // scale > 0: max(raw) * scale is exactly the max of the rounded scaled scores;
            // no visible key leaves the max -inf (not -inf * scale).
            const float factor =
                os[r].rescale(mx[r] == kNegInf ? kNegInf : mx[r] * p.scale_f);
            // weight(s) = exp(s*scale - max) = 2^(s*scale*log2e - max*log2e); with max
            // still -inf every visible score is -inf (-> 0) or NaN (stays NaN), as
            // weight() has it. A scale that rounds to 0 makes every weight 1: uniform.
            const float mlog = os[r].max == kNegInf ? 0.f : os[r].max * float(kLog2e);
#pragma unroll
            for (int j = 0; j < kNTiles; ++j)
#pragma unroll
              for (int e = 2 * r; e < 2 * r + 2; ++e)
                s[j][e] = ptx::ex2_approx_ftz(fmaf(s[j][e], p.scale_log2e, -mlog));
            if (edge) {
#pragma unroll
              for (int j = 0; j < kNTiles; ++j)
#pragma unroll
                for (int e = 2 * r; e < 2 * r + 2; ++e)
                  if (masked(j, e)) s[j][e] = 0.f;
            }
            float sum = 0.f;
#pragma unroll
            for (int j = 0; j < kNTiles; ++j)
#pragma unroll
              for (int e = 2 * r; e < 2 * r + 2; ++e) sum += s[j][e];
            os[r].add(sum);  // this lane's partial row sum; lanes are summed at the end
#pragma unroll
            for (int n = 0; n < kOTiles; ++n) {
              o[n][2 * r] *= factor;
              o[n][2 * r + 1] *= factor;
            }
          }

          // ---- O += P . V (P from the S accumulators, rounded to the input type)
          const uint32_t vb = v_addr + stage_off;
          if constexpr (kTf32) {
            // Per 8 keys: the mma's k = t and t + 4 stand for keys 2t and 2t + 1, the
            // columns this thread holds of P; B's rows follow (V loaded word by word:
            // ldmatrix cannot transpose 32-bit data). Rows 2t of one chunk column fall in
            // distinct swizzled chunks: conflict-free.
            const unsigned char* vt = smem_raw + (vb - q_addr);
#pragma unroll
            for (int j = 0; j < kNTiles; ++j) {
              uint32_t a[4] = {__float_as_uint(s[j][0]), __float_as_uint(s[j][2]),
                               __float_as_uint(s[j][1]), __float_as_uint(s[j][3])};
              round_tf32(a);
              const int key = 8 * j + 2 * tq;
#pragma unroll
              for (int n = 0; n < kOTiles; ++n) {
                if (16 * n < dim) {
                  uint32_t b[2] = {load_word<D>(vt, key, 8 * n + g), load_word<D>(vt, key + 1, 8 * n + g)};
                  round_tf32(b);
                  ptx::mma_m16n8k8_tf32(o[n], a, b);
                }
              }
            }
          } else {
#pragma unroll
            for (int kk = 0; kk < kKeys / 16; ++kk) {
              uint32_t a[4];
              a_from_acc<kBf16>(a, s[2 * kk], s[2 * kk + 1]);
#pragma unroll
              for (int nb = 0; nb < kDSteps; ++nb) {
                if (16 * nb < dim) {
                  uint32_t b[4];
                  load_b_cols<D>(b, vb, 16 * kk, nb, lane);
                  mma_pair<kIn>(o[2 * nb], o[2 * nb + 1], a, b);
                }
              }
            }
          }
        }
        __syncthreads();  // every warp is done with this stage before it is refilled
      }
    }

    // ---- epilogue: full row sums, normalise, stage the warp's rows through its own
    // rows of the Q tile (only this warp ever read them), 16-byte coalesced stores.
    float norm[2], row_lse[2];
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      float total = os[r].sum;
      total += __shfl_xor_sync(0xffffffffu, total, 1);
      total += __shfl_xor_sync(0xffffffffu, total, 2);
      os[r].sum = total;
      norm[r] = os[r].normaliser();
      row_lse[r] = os[r].log_sum_exp();
    }
    __syncwarp();
#pragma unroll
    for (int n = 0; n < kOTiles; ++n)
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        const int row = warp * 16 + g + 8 * r;
        if constexpr (kTf32) {  // float columns 8n + 2t, 8n + 2t + 1
          *reinterpret_cast<float2*>(s_q + swz<D>(row, 2 * n + (tq >> 1)) + 4 * (tq & 1)) =
              make_float2(o[n][2 * r] * norm[r], o[n][2 * r + 1] * norm[r]);
        } else {
          *reinterpret_cast<uint32_t*>(s_q + swz<D>(row, n) + 2 * tq) =
              ptx::cvt_rn_pack<kBf16>(o[n][2 * r] * norm[r], o[n][2 * r + 1] * norm[r]);
        }
      }
    __syncwarp();
    uint16_t* og = out + bh * seq_q * int64_t(dim);
#pragma unroll
    for (int i = 0; i < 16 * kChunks / 32; ++i) {
      const int idx = i * 32 + lane;
      const int row = warp * 16 + idx / kChunks, c = idx % kChunks;
      if (m0 + row < seq_q && 8 * c < dim) {
        uint16_t* to = og + int64_t(m0 + row) * dim + c * 8;
        const uint16_t* from = s_q + swz<D>(row, c);
        if (dim % 8 == 0) {
          *reinterpret_cast<uint4*>(to) = *reinterpret_cast<const uint4*>(from);
        } else {  // rows not 16-byte aligned: element by element
          for (int e = 0; e < 8 && 8 * c + e < dim; ++e) to[e] = from[e];
        }
      }
    }
    if (tq == 0) {
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        const int row = wrow0 + g + 8 * r;
        if (row < seq_q) lse[bh * seq_q + row] = row_lse[r];
      }
    }
  }
}

// ===================================================================== SIMT path

// Tile sizes per accumulator type: BM query rows, BN keys per tile, DK head_dim columns
// per S chunk, VW elements per 16-byte vector, NSC column slices of 16*VW per CTA.
// kSimtThreads = 128 threads as 8 x 16: thread (ty, tx) owns rows 4ty..4ty+3
// (TM = BM/8), keys tx + 16j (TN = BN/16) and, per slice, columns tx*VW..tx*VW+VW-1.
template <typename A> struct SimtConfig;
template <> struct SimtConfig<float> {
  static constexpr int kBM = 32, kBN = 64, kDK = 16, kVW = 4, kNSC = 2;
};
template <> struct SimtConfig<double> {
  static constexpr int kBM = 32, kBN = 32, kDK = 16, kVW = 2, kNSC = 2;
};
constexpr int kSimtThreads = 128;  // 8 x 16

// 16-byte shared-memory vector loads.
__device__ __forceinline__ void ld16(const float* p, float (&v)[4]) {
  const float4 t = *reinterpret_cast<const float4*>(p);
  v[0] = t.x, v[1] = t.y, v[2] = t.z, v[3] = t.w;
}
__device__ __forceinline__ void ld16(const double* p, double (&v)[2]) {
  const double2 t = *reinterpret_cast<const double2*>(p);
  v[0] = t.x, v[1] = t.y;
}

template <typename T>
__global__ void __launch_bounds__(kSimtThreads, 2)
    attention_simt_kernel(const AttnParams p, const T* __restrict__ q,
                          const T* __restrict__ k, const T* __restrict__ v,
                          T* __restrict__ out, Acc<T>* __restrict__ lse) {
  using A = Acc<T>;
  using C = SimtConfig<A>;
  constexpr int BM = C::kBM, BN = C::kBN, DK = C::kDK, VW = C::kVW, NSC = C::kNSC;
  constexpr int VC = 16 * VW;       // columns per slice
  constexpr int TM = BM / (kSimtThreads / 16), TN = BN / 16;
  constexpr int QS = DK + VW;       // padded row strides (elements) of the shared tiles
  constexpr int PS = BN + VW;
  constexpr int VS = VC + VW;
  constexpr int kRowStep = kSimtThreads / 16;  // rows of threads
  constexpr int kVParts = 2;                    // V slices are staged in key halves
  constexpr int BV = BN / kVParts;              // keys per V stage
  constexpr int kQLoads = BM / kRowStep;        // elements per thread and stage
  constexpr int kKLoads = BN / kRowStep;
  constexpr int kVRows = BV / kRowStep;
  constexpr int kVLoads = kVRows * VW;
  constexpr int kBuf = kQLoads + kKLoads > kVLoads ? kQLoads + kKLoads : kVLoads;
  static_assert(DK == 16, "a chunk row is one element per tx");
  static_assert(BM % kRowStep == 0 && BN % (kRowStep * kVParts) == 0, "rows per thread");
  static_assert(DK % VW == 0 && BV % VW == 0, "vector loads");
  constexpr A kNegInf = -std::numeric_limits<A>::infinity();

  OXIJAX_SHARED(A, s_q, [BM * QS], 16);  // Q chunk [BM][DK]
  OXIJAX_SHARED(A, s_k, [BN * QS], 16);  // K chunk [BN][DK]
  OXIJAX_SHARED(A, s_p, [BM * PS], 16);  // P [BM][BN]
  OXIJAX_SHARED(A, s_v, [BV * VS], 16);  // V stage [BV][VC]

  const int tid = threadIdx.x, tx = tid & 15, ty = tid >> 4;
  const int D = p.dim, seq_q = p.seq_q, seq_kv = p.seq_kv;
  const bool causal = p.causal != 0;
  const A scale = A(p.scale);

  for (int64_t task = blockIdx.x; task < p.tasks; task += gridDim.x) {
    if (task != blockIdx.x) __syncthreads();  // the previous task's smem readers are done
    const int64_t per_head = int64_t(p.q_blocks) * p.d_chunks;
    const int64_t bh = task / per_head;
    const int64_t rem = task % per_head;
    const int qi = int(rem / p.d_chunks), dc = int(rem % p.d_chunks);
    const int qb = causal ? p.q_blocks - 1 - qi : qi;  // causal: longest blocks first
    const int m0 = qb * BM;
    const int dc0 = dc * (NSC * VC);  // first output column of this CTA
    const T* qg = q + bh * seq_q * int64_t(D);
    const T* kg = k + bh * seq_kv * int64_t(D);
    const T* vg = v + bh * seq_kv * int64_t(D);

    const int kv_end = key_end(seq_q, seq_kv, causal, min(m0 + BM - 1, seq_q - 1));
    const int n_tiles = (kv_end + BN - 1) / BN;
    const int nc = (D + DK - 1) / DK;  // S chunks per tile (0 only if D == 0)
    const int nv = dc0 < D ? min(NSC, (D - dc0 + VC - 1) / VC) : 0;  // V slices per tile
    int kend[TM];
#pragma unroll
    for (int r = 0; r < TM; ++r) kend[r] = key_end(seq_q, seq_kv, causal, m0 + ty * TM + r);

    A o[NSC][TM][VW];
#pragma unroll
    for (int sc = 0; sc < NSC; ++sc)
#pragma unroll
      for (int r = 0; r < TM; ++r)
#pragma unroll
        for (int c = 0; c < VW; ++c) o[sc][r][c] = A(0);
    OnlineSoftmax<A> os[TM];
    A buf[kBuf];  // the next stage's elements, loaded before the current stage computes

    // Stages of a key tile: nc chunks of Q and K (DK columns each), then nv column
    // slices of V in kVParts key parts. Thread (ty, tx) moves column tx (+ 16j) of
    // rows ty + 8i: a warp reads 2 rows x 16 consecutive elements per load. Offsets
    // within a stage are 32-bit (i * 8 * D < 2^31 for D <= kMaxDim).
    const int step = kRowStep * D;
    const auto fetch_qk = [&](int n0, int d0) {
      const int col = d0 + tx;
      const bool col_ok = col < D;
      const T* qp = qg + (int64_t(m0 + ty) * D + col);
      const T* kp = kg + (int64_t(n0 + ty) * D + col);
#pragma unroll
      for (int i = 0; i < kQLoads; ++i)
        buf[i] = col_ok && m0 + ty + kRowStep * i < seq_q ? to_acc(qp[i * step]) : A(0);
#pragma unroll
      for (int i = 0; i < kKLoads; ++i)
        buf[kQLoads + i] =
            col_ok && n0 + ty + kRowStep * i < seq_kv ? to_acc(kp[i * step]) : A(0);
    };
    const auto store_qk = [&]() {
#pragma unroll
      for (int i = 0; i < kQLoads; ++i) s_q[(ty + kRowStep * i) * QS + tx] = buf[i];
#pragma unroll
      for (int i = 0; i < kKLoads; ++i) s_k[(ty + kRowStep * i) * QS + tx] = buf[kQLoads + i];
    };
    const auto fetch_v = [&](int n0, int c0) {  // keys n0.., columns c0..
      const T* vp = vg + (int64_t(n0 + ty) * D + c0 + tx);
#pragma unroll
      for (int i = 0; i < kVRows; ++i)
#pragma unroll
        for (int j = 0; j < VW; ++j)
          buf[i * VW + j] = n0 + ty + kRowStep * i < seq_kv && c0 + tx + 16 * j < D
                                ? to_acc(vp[i * step + 16 * j])
                                : A(0);
    };
    const auto store_v = [&]() {
#pragma unroll
      for (int i = 0; i < kVRows; ++i)
#pragma unroll
        for (int j = 0; j < VW; ++j) s_v[(ty + kRowStep * i) * VS + tx + 16 * j] = buf[i * VW + j];
    };

    if (n_tiles > 0 && nc > 0) fetch_qk(0, 0);
    for (int t = 0; t < n_tiles; ++t) {
      const int n0 = t * BN;

      // ---- S = Q . K^T over head_dim chunks
      A s[TM][TN];
#pragma unroll
      for (int r = 0; r < TM; ++r)
#pragma unroll
        for (int j = 0; j < TN; ++j) s[r][j] = A(0);
      for (int c = 0; c < nc; ++c) {
        __syncthreads();  // readers of the previous chunk (or of s_p / s_v) are done
        store_qk();
        __syncthreads();
        if (c + 1 < nc) fetch_qk(n0, (c + 1) * DK);
        else if (nv > 0) fetch_v(n0, dc0);
        else if (t + 1 < n_tiles) fetch_qk(n0 + BN, 0);
#pragma unroll
        for (int dd = 0; dd < DK; dd += VW) {
          A qv[TM][VW], kv[TN][VW];
#pragma unroll
          for (int r = 0; r < TM; ++r) ld16(&s_q[(ty * TM + r) * QS + dd], qv[r]);
#pragma unroll
          for (int j = 0; j < TN; ++j) ld16(&s_k[(tx + 16 * j) * QS + dd], kv[j]);
#pragma unroll
          for (int r = 0; r < TM; ++r)
#pragma unroll
            for (int j = 0; j < TN; ++j)
#pragma unroll
              for (int w = 0; w < VW; ++w) s[r][j] = fma(qv[r][w], kv[j][w], s[r][j]);
        }
      }

      // ---- online softmax; row r's 16 owners are the 16 lanes with this ty
#pragma unroll
      for (int r = 0; r < TM; ++r) {
        A bmax = kNegInf;
#pragma unroll
        for (int j = 0; j < TN; ++j) {
          const A x = n0 + tx + 16 * j < kend[r] ? s[r][j] * scale : kNegInf;
          s[r][j] = x;
          bmax = fmax(bmax, x);
        }
#pragma unroll
        for (int off = 1; off < 16; off <<= 1)
          bmax = fmax(bmax, __shfl_xor_sync(0xffffffffu, bmax, off));
        const A factor = os[r].rescale(bmax);
        A sum = A(0);
#pragma unroll
        for (int j = 0; j < TN; ++j) {
          const A w = os[r].weight(s[r][j]);
          s[r][j] = w;
          sum += w;
        }
        os[r].add(sum);  // this lane's partial row sum; lanes are summed at the end
#pragma unroll
        for (int sc = 0; sc < NSC; ++sc)
#pragma unroll
          for (int c = 0; c < VW; ++c) o[sc][r][c] *= factor;
      }
      // s_p's last readers (previous tile's P.V) finished before this tile's first
      // chunk barrier (nv > 0 implies D > 0, so nc >= 1).
      if (nv > 0) {
#pragma unroll
        for (int r = 0; r < TM; ++r)
#pragma unroll
          for (int j = 0; j < TN; ++j) s_p[(ty * TM + r) * PS + tx + 16 * j] = s[r][j];
      }

      // ---- O += P . V, one column slice at a time, V staged in key halves
#pragma unroll
      for (int sc = 0; sc < NSC; ++sc) {
        if (sc < nv) {  // CTA-uniform
#pragma unroll
          for (int part = 0; part < kVParts; ++part) {
            __syncthreads();  // s_p written; the previous V stage's readers are done
            store_v();
            __syncthreads();
            if (part + 1 < kVParts) fetch_v(n0 + (part + 1) * BV, dc0 + sc * VC);
            else if (sc + 1 < nv) fetch_v(n0, dc0 + (sc + 1) * VC);
            else if (t + 1 < n_tiles) fetch_qk(n0 + BN, 0);
#pragma unroll 2
            for (int n = 0; n < BV; n += VW) {
              A pv[TM][VW], vv[VW][VW];
#pragma unroll
              for (int r = 0; r < TM; ++r) ld16(&s_p[(ty * TM + r) * PS + part * BV + n], pv[r]);
#pragma unroll
              for (int w = 0; w < VW; ++w) ld16(&s_v[(n + w) * VS + tx * VW], vv[w]);
#pragma unroll
              for (int r = 0; r < TM; ++r)
#pragma unroll
                for (int w = 0; w < VW; ++w)
#pragma unroll
                  for (int c = 0; c < VW; ++c)
                    o[sc][r][c] = fma(pv[r][w], vv[w][c], o[sc][r][c]);
            }
          }
        }
      }
    }

    // ---- epilogue
    T* og = out + bh * seq_q * int64_t(D);
#pragma unroll
    for (int r = 0; r < TM; ++r) {
      A total = os[r].sum;
#pragma unroll
      for (int off = 1; off < 16; off <<= 1) total += __shfl_xor_sync(0xffffffffu, total, off);
      os[r].sum = total;
      const A norm = os[r].normaliser();
      const int row = m0 + ty * TM + r;
      if (row < seq_q) {
        if (dc == 0 && tx == 0) lse[bh * seq_q + row] = os[r].log_sum_exp();
#pragma unroll
        for (int sc = 0; sc < NSC; ++sc) {
          if (sc < nv) {
#pragma unroll
            for (int c = 0; c < VW; ++c) {
              const int col = dc0 + sc * VC + tx * VW + c;
              if (col < D) og[int64_t(row) * D + col] = from_acc<T>(o[sc][r][c] * norm);
            }
          }
        }
      }
    }
  }
}

// ===================================================================== launchers

inline unsigned grid_for(int64_t tasks) {
  return static_cast<unsigned>(tasks < int64_t(INT_MAX) ? tasks : int64_t(INT_MAX));
}

template <mma_tile::MmaInput kIn, int D>
cudaError_t launch_mma(cudaStream_t stream, AttnParams p, int64_t bh, const void* q,
                       const void* k, const void* v, void* out, float* lse) {
  p.q_blocks = int((p.seq_q + kMmaRows - 1) / kMmaRows);
  p.d_chunks = 1;
  p.tasks = bh * p.q_blocks;
  const auto kernel = attention_mma_kernel<kIn, D>;
  constexpr size_t smem = mma_smem_bytes<D>();
  if constexpr (smem > 48 * 1024) {
    const cudaError_t err =
        cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem));
    if (err != cudaSuccess) return runtime_error(err);
  }
  return launch(kernel, grid_for(p.tasks), kMmaThreads, smem, stream, p,
                static_cast<const uint16_t*>(q), static_cast<const uint16_t*>(k),
                static_cast<const uint16_t*>(v), static_cast<uint16_t*>(out), lse);
}

// The tensor-core kernel for a padded head dim of `units` 16-bit units.
template <mma_tile::MmaInput kIn>
cudaError_t launch_mma(cudaStream_t stream, const AttnParams& p, int64_t bh, int units,
                       const void* q, const void* k, const void* v, void* out, float* lse) {
  switch (units) {
    case 64: return launch_mma<kIn, 64>(stream, p, bh, q, k, v, out, lse);
    case 128: return launch_mma<kIn, 128>(stream, p, bh, q, k, v, out, lse);
    case 192: return launch_mma<kIn, 192>(stream, p, bh, q, k, v, out, lse);
    default: return launch_mma<kIn, 256>(stream, p, bh, q, k, v, out, lse);
  }
}

template <typename T>
cudaError_t launch_simt(cudaStream_t stream, AttnParams p, int64_t bh, const T* q, const T* k,
                        const T* v, T* out, Acc<T>* lse) {
  using C = SimtConfig<Acc<T>>;
  constexpr int kCols = C::kNSC * 16 * C::kVW;  // output columns per CTA
  p.q_blocks = int((p.seq_q + C::kBM - 1) / C::kBM);
  p.d_chunks = p.dim > 0 ? int((int64_t(p.dim) + kCols - 1) / kCols) : 1;
  p.tasks = bh * p.q_blocks * p.d_chunks;
  return launch(&attention_simt_kernel<T>, grid_for(p.tasks), kSimtThreads, 0, stream, p, q, k,
                v, out, lse);
}

}  // namespace

template <typename T>
cudaError_t attention(cudaStream_t stream, const AttentionShape& shape, const T* q, const T* k,
                      const T* v, T* out, Acc<T>* lse, bool allow_tf32) {
  if (shape.batch <= 0 || shape.heads <= 0 || shape.seq_q <= 0) return cudaSuccess;
  if (shape.seq_kv < 0 || shape.head_dim < 0 || shape.seq_q > kMaxSeq ||
      shape.seq_kv > kMaxSeq || shape.head_dim > kMaxDim ||
      shape.batch > INT64_MAX / shape.heads)
    return cudaErrorInvalidValue;
  const int64_t bh = shape.batch * shape.heads;
  // bh * q blocks * column chunks must fit in int64 (it does for any real allocation).
  if (bh > (int64_t(1) << 40)) return cudaErrorInvalidValue;

  AttnParams p{};
  p.seq_q = int(shape.seq_q);
  p.seq_kv = int(shape.seq_kv);
  p.dim = int(shape.head_dim);
  p.causal = shape.causal ? 1 : 0;
  p.scale = shape.scale;
  p.scale_f = float(shape.scale);
  p.scale_log2e = float(shape.scale * kLog2e);

  // Tensor cores: the half types, and float32 when TF32 is allowed (head_dim up to 128).
  constexpr bool kHalf = std::is_same_v<T, oxijax::half> || std::is_same_v<T, oxijax::bfloat16>;
  if (kHalf || (std::is_same_v<T, float> && allow_tf32)) {
    const int64_t units = shape.head_dim * int64_t(sizeof(T) / 2);  // 16-bit units per row
    bool tensor_cores = false;
    if (cudaError_t err = mma_tile::tensor_cores_take(units, {q, k, v, out}, tensor_cores);
        err != cudaSuccess)
      return err;
    if (tensor_cores) {
      using mma_tile::MmaInput;
      constexpr MmaInput kIn = std::is_same_v<T, oxijax::half>       ? MmaInput::kF16
                               : std::is_same_v<T, oxijax::bfloat16> ? MmaInput::kBF16
                                                                      : MmaInput::kTF32;
      if constexpr (!std::is_same_v<T, double>)
        return launch_mma<kIn>(stream, p, bh, mma_tile::padded_dim(units), q, k, v, out, lse);
    }
  }
  return launch_simt<T>(stream, p, bh, q, k, v, out, lse);
}

template cudaError_t attention<oxijax::half>(cudaStream_t, const AttentionShape&,
                                             const oxijax::half*, const oxijax::half*,
                                             const oxijax::half*, oxijax::half*, float*, bool);
template cudaError_t attention<oxijax::bfloat16>(cudaStream_t, const AttentionShape&,
                                                 const oxijax::bfloat16*,
                                                 const oxijax::bfloat16*,
                                                 const oxijax::bfloat16*, oxijax::bfloat16*,
                                                 float*, bool);
template cudaError_t attention<float>(cudaStream_t, const AttentionShape&, const float*,
                                      const float*, const float*, float*, float*, bool);
template cudaError_t attention<double>(cudaStream_t, const AttentionShape&, const double*,
                                       const double*, const double*, double*, double*, bool);

}  // namespace oxijax::cuda
