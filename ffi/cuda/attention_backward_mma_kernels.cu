// Attention gradients on tensor cores (float16 / bfloat16, FlashAttention-2 style):
// mma.sync m16n8k16 with float32 accumulation, P and dS recomputed per tile from the
// forward's log-sum-exp and never stored. Deterministic: no atomics; every accumulator
// has one owner thread that sums in a fixed order, so the gradients are bit-identical
// from run to run.
//
// Two kernels after delta = rowsum(dO * O) (attention_backward_kernels.cu):
// * dkdv: one CTA of 4 warps per (b*h, block of 64 keys, chunk of output columns); warp w
//   owns keys 16w..16w+15 and keeps their dK, dV in registers while Q / dO tiles of
//   kStep queries stream past (cp.async, double buffered). Per tile, transposed:
//     S^T = K Q^T, dP^T = V dO^T                    (16 keys x kStep queries per warp)
//     P^T = exp(scale S^T - lse), dS^T = P^T (dP^T - delta)
//     dV += P^T dO, dK += dS^T Q                    (P^T, dS^T rounded to the input type)
//   and dK is scaled once at the end.
// * dq: one CTA of 4 warps per (b*h, block of 64 queries, chunk of output columns); warp w
//   owns queries 16w..16w+15 and keeps their dQ in registers while K / V tiles stream
//   past: S = Q K^T, dP = dO V^T, dS = P (dP - delta), dQ += dS K.
// dQ in its own kernel recomputes S and dP (7 matrix products instead of FlashAttention-2's
// 5) instead of one atomic per dQ element per key tile: that is the price of determinism.
// Head dims above 128 split the output columns into chunks of DOut (CTAs of one (b*h,
// block) recompute S and dP per chunk), which keeps the accumulators within 255
// registers.
//
// Shared tiles are mma_tile.h's: swizzled [rows][D], the head dim padded to D = 64, 128,
// 192 or 256 with zero columns (their k-steps and output column pairs are skipped).
// Masks as the forward: key j is visible to query i iff j < key_end(i); rows that see no
// key (lse = -inf) and padding rows get P = 0, hence zero gradients. P = 2^(S scale log2e -
// lse log2e) with ex2.approx, as the forward computes its weights.
#include <cuda_runtime.h>

#include <algorithm>
#include <climits>
#include <cstdint>
#include <limits>
#include <type_traits>

#include "attention_mma.h"
#include "launch.h"
#include "mma_tile.h"
#include "ptx.h"

namespace oxijax::cuda {
namespace {

using namespace mma_tile;

constexpr int kThreads = 128;  // 4 warps
constexpr int kBlock = 64;     // rows a CTA owns: keys (dkdv) or queries (dq), 16 per warp
constexpr float kInf = std::numeric_limits<float>::infinity();

// Tile parameters per padded head dim: DOut output columns per CTA, Step rows per streamed
// tile (chosen so that accumulators, S and dP stay within the register file).
template <int D> struct BwdConfig {
  static constexpr int kDOut = D <= 128 ? D : D / 2;
  static constexpr int kStep = kDOut <= 64 ? 64 : 32;
  static constexpr int kChunks = D / kDOut;
};

struct BwdParams {
  int64_t tasks;  // batch*heads * blocks * column chunks
  int seq_q, seq_kv, dim;
  int blocks;     // 64-row blocks per (b*h): key blocks (dkdv), query blocks (dq)
  int causal;
  float scale, scale_log2e;
};

// A launch's task: (b*h, 64-row block, first output column of its chunk).
struct Task {
  int64_t bh;
  int block, col0;
};
template <int D> __device__ __forceinline__ Task decode_task(const BwdParams& p, int64_t task) {
  using C = BwdConfig<D>;
  const int64_t per_bh = int64_t(p.blocks) * C::kChunks;
  const int rem = int(task % per_bh);
  return {task / per_bh, rem / C::kChunks, (rem % C::kChunks) * C::kDOut};
}

// lse * log2(e) for the kernels' exponent, +inf for rows past seq_q and rows that see no
// key (lse = -inf): their P is 2^-inf = 0.
__device__ __forceinline__ float lse_log2e(const float* lse, int64_t row_base, int row,
                                           int seq_q) {
  const float l = row < seq_q ? lse[row_base + row] : -kInf;
  return l == -kInf ? kInf : l * float(kLog2e);
}

// Stores rows row0 + g (+8) of a warp's 16-row float32 accumulator times `factor`, columns
// col0 + 8n + 2t (+1), into a [rows][dim] matrix: two elements per 32-bit store (one by
// one for an odd dim, whose rows are not 4-byte aligned).
template <bool kBf16, int kTiles>
__device__ __forceinline__ void store_rows(uint16_t* __restrict__ dst, const float (&acc)[kTiles][4],
                                           float factor, int row0, int rows, int col0, int dim,
                                           int lane) {
  const int g = lane >> 2, t = lane & 3;
#pragma unroll
  for (int n = 0; n < kTiles; ++n) {
    const int col = col0 + 8 * n + 2 * t;
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const int row = row0 + g + 8 * r;
      if (row < rows && col < dim) {
        const uint32_t pair =
            ptx::cvt_rn_pack<kBf16>(acc[n][2 * r] * factor, acc[n][2 * r + 1] * factor);
        uint16_t* to = dst + int64_t(row) * dim + col;
        if (dim % 2 == 0) {
          *reinterpret_cast<uint32_t*>(to) = pair;
        } else {
          to[0] = uint16_t(pair);
          if (col + 1 < dim) to[1] = uint16_t(pair >> 16);
        }
      }
    }
  }
}

// The two score-like products of a warp: s = A1 B1^T and dp = A2 B2^T, where A1, A2 are
// rows row0..row0+15 of row-major [rows][D] tiles and B1, B2 [kStep][D] tiles, over the
// real head dim's k-steps (dim 16-bit units): S and dP in both kernels.
template <MmaInput kIn, int D, int kStep>
__device__ __forceinline__ void two_products(float (&s)[kStep / 8][4], float (&dp)[kStep / 8][4],
                                             uint32_t a1, uint32_t b1, uint32_t a2,
                                             uint32_t b2, int row0, int dim, int lane) {
#pragma unroll
  for (int j = 0; j < kStep / 8; ++j)
#pragma unroll
    for (int e = 0; e < 4; ++e) s[j][e] = dp[j][e] = 0.f;
#pragma unroll
  for (int kk = 0; kk < D / 16; ++kk) {
    if (16 * kk < dim) {
      uint32_t a1f[4], a2f[4];
      load_a<D>(a1f, a1, row0, kk, lane);
      load_a<D>(a2f, a2, row0, kk, lane);
#pragma unroll
      for (int nb = 0; nb < kStep / 16; ++nb) {
        uint32_t b[4];
        load_b_rows<D>(b, b1, 16 * nb, kk, lane);
        mma_pair<kIn>(s[2 * nb], s[2 * nb + 1], a1f, b);
        load_b_rows<D>(b, b2, 16 * nb, kk, lane);
        mma_pair<kIn>(dp[2 * nb], dp[2 * nb + 1], a2f, b);
      }
    }
  }
}

template <bool kBf16, int D>
__global__ void __launch_bounds__(kThreads)
    dkdv_mma_kernel(const BwdParams p, const uint16_t* __restrict__ q,
                    const uint16_t* __restrict__ k, const uint16_t* __restrict__ v,
                    const uint16_t* __restrict__ dout, const float* __restrict__ lse,
                    const float* __restrict__ delta, uint16_t* __restrict__ dk,
                    uint16_t* __restrict__ dv) {
  using C = BwdConfig<D>;
  constexpr MmaInput kIn = kBf16 ? MmaInput::kBF16 : MmaInput::kF16;
  constexpr int kStep = C::kStep, kOut = C::kDOut / 8;  // n8 tiles of the output columns
  constexpr int kStepTile = kStep * D;

  OXIJAX_DYNAMIC_SHARED(smem_raw, 128);
  const uint32_t k_addr = ptx::shared_address(smem_raw);  // [64][D]
  const uint32_t v_addr = k_addr + 2u * kBlock * D;       // [64][D]
  const uint32_t q_addr = v_addr + 2u * kBlock * D;       // [2][kStep][D]
  const uint32_t do_addr = q_addr + 4u * kStepTile;       // [2][kStep][D]
  float* const lse_s = reinterpret_cast<float*>(smem_raw + 2 * (2 * kBlock * D + 4 * kStepTile));
  float* const delta_s = lse_s + 2 * kStep;               // [2][kStep] each

  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  const int g = lane >> 2, tq = lane & 3;
  const int seq_q = p.seq_q, seq_kv = p.seq_kv, dim = p.dim;
  const bool causal = p.causal != 0;

  for (int64_t task = blockIdx.x; task < p.tasks; task += gridDim.x) {
    if (task != blockIdx.x) __syncthreads();  // the previous task's smem readers are done
    const auto [bh, block, col0] = decode_task<D>(p, task);
    const int j0 = block * kBlock;
    const int64_t q_rows = bh * seq_q, kv_rows = bh * seq_kv;
    const uint16_t* qg = q + q_rows * dim;
    const uint16_t* dog = dout + q_rows * dim;

    // Causal: query i sees key j iff j - i <= seq_kv - seq_q; queries before the block's
    // first viewer are skipped, and a warp skips tiles before its own first viewer.
    const int64_t shift = int64_t(seq_kv) - seq_q;
    const int64_t first_row = causal ? max(int64_t(0), j0 - shift) : 0;
    const int wj0 = j0 + 16 * warp;
    const int64_t warp_first_row = causal ? wj0 - shift : INT64_MIN;
    const int i_begin = int(min(first_row, int64_t(seq_q))) / kStep * kStep;
    const int n_tiles = first_row < seq_q ? (seq_q - i_begin + kStep - 1) / kStep : 0;

    float dk_acc[kOut][4], dv_acc[kOut][4];
#pragma unroll
    for (int n = 0; n < kOut; ++n)
#pragma unroll
      for (int e = 0; e < 4; ++e) dk_acc[n][e] = dv_acc[n][e] = 0.f;

    const auto load_stage = [&](int t) {
      const int i0 = i_begin + t * kStep, stage = t & 1;
      load<kStep, D, kThreads>(q_addr + 2u * kStepTile * stage, qg, i0, seq_q, dim, tid);
      load<kStep, D, kThreads>(do_addr + 2u * kStepTile * stage, dog, i0, seq_q, dim, tid);
      if (tid < kStep) {
        lse_s[stage * kStep + tid] = lse_log2e(lse, q_rows, i0 + tid, seq_q);
        delta_s[stage * kStep + tid] = i0 + tid < seq_q ? delta[q_rows + i0 + tid] : 0.f;
      }
    };

    if (n_tiles > 0) {
      load<kBlock, D, kThreads>(k_addr, k + kv_rows * dim, j0, seq_kv, dim, tid);
      load<kBlock, D, kThreads>(v_addr, v + kv_rows * dim, j0, seq_kv, dim, tid);
      load_stage(0);
      ptx::cp_async_commit();
    }
    for (int t = 0; t < n_tiles; ++t) {
      const int i0 = i_begin + t * kStep, stage = t & 1;
      if (t + 1 < n_tiles) load_stage(t + 1);
      ptx::cp_async_commit();   // possibly empty: keeps one group per iteration
      ptx::cp_async_wait<1>();  // all but the newest group: tile t has landed
      __syncthreads();

      // Warp-uniform: some query of the tile sees one of the warp's keys.
      if (wj0 < seq_kv && i0 + kStep - 1 >= warp_first_row) {
        const uint32_t qs = q_addr + 2u * kStepTile * stage, dos = do_addr + 2u * kStepTile * stage;
        float s[kStep / 8][4], dp[kStep / 8][4];  // S^T, dP^T
        two_products<kIn, D, kStep>(s, dp, k_addr, qs, v_addr, dos, 16 * warp, dim, lane);
        // P^T and dS^T: element e of tile j is key wj0 + g + 8(e/2), query i0 + 8j + 2t + e%2.
#pragma unroll
        for (int j = 0; j < kStep / 8; ++j)
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            const int col = 8 * j + 2 * tq + (e & 1);
            const int key = wj0 + g + 8 * (e >> 1);
            const bool visible = !causal || int64_t(key) - (i0 + col) <= shift;
            const float pr = visible ? ptx::ex2_approx_ftz(fmaf(s[j][e], p.scale_log2e,
                                                                -lse_s[stage * kStep + col]))
                                     : 0.f;
            s[j][e] = pr;
            dp[j][e] = pr * (dp[j][e] - delta_s[stage * kStep + col]);
          }
        // dV += P^T dO, dK += dS^T Q over the tile's queries.
#pragma unroll
        for (int kq = 0; kq < kStep / 16; ++kq) {
          uint32_t ap[4], as[4];
          a_from_acc<kBf16>(ap, s[2 * kq], s[2 * kq + 1]);
          a_from_acc<kBf16>(as, dp[2 * kq], dp[2 * kq + 1]);
#pragma unroll
          for (int nb = 0; nb < kOut / 2; ++nb) {
            if (col0 + 16 * nb < dim) {
              uint32_t b[4];
              load_b_cols<D>(b, dos, 16 * kq, col0 / 16 + nb, lane);
              mma_pair<kIn>(dv_acc[2 * nb], dv_acc[2 * nb + 1], ap, b);
              load_b_cols<D>(b, qs, 16 * kq, col0 / 16 + nb, lane);
              mma_pair<kIn>(dk_acc[2 * nb], dk_acc[2 * nb + 1], as, b);
            }
          }
        }
      }
      __syncthreads();  // every warp is done with this stage before it is refilled
    }
    store_rows<kBf16>(dk + kv_rows * dim, dk_acc, p.scale, wj0, seq_kv, col0, dim, lane);
    store_rows<kBf16>(dv + kv_rows * dim, dv_acc, 1.f, wj0, seq_kv, col0, dim, lane);
  }
}

template <bool kBf16, int D>
__global__ void __launch_bounds__(kThreads)
    dq_mma_kernel(const BwdParams p, const uint16_t* __restrict__ q,
                  const uint16_t* __restrict__ k, const uint16_t* __restrict__ v,
                  const uint16_t* __restrict__ dout, const float* __restrict__ lse,
                  const float* __restrict__ delta, uint16_t* __restrict__ dq) {
  using C = BwdConfig<D>;
  constexpr MmaInput kIn = kBf16 ? MmaInput::kBF16 : MmaInput::kF16;
  constexpr int kStep = C::kStep, kOut = C::kDOut / 8;
  constexpr int kStepTile = kStep * D;

  OXIJAX_DYNAMIC_SHARED(smem_raw, 128);
  const uint32_t q_addr = ptx::shared_address(smem_raw);  // [64][D]
  const uint32_t do_addr = q_addr + 2u * kBlock * D;      // [64][D]
  const uint32_t k_addr = do_addr + 2u * kBlock * D;      // [2][kStep][D]
  const uint32_t v_addr = k_addr + 4u * kStepTile;        // [2][kStep][D]

  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  const int g = lane >> 2, tq = lane & 3;
  const int seq_q = p.seq_q, seq_kv = p.seq_kv, dim = p.dim;
  const bool causal = p.causal != 0;

  for (int64_t task = blockIdx.x; task < p.tasks; task += gridDim.x) {
    if (task != blockIdx.x) __syncthreads();  // the previous task's smem readers are done
    const auto [bh, block, col0] = decode_task<D>(p, task);
    const int m0 = (causal ? p.blocks - 1 - block : block) * kBlock;  // causal: longest first
    const int64_t q_rows = bh * seq_q, kv_rows = bh * seq_kv;
    const uint16_t* kg = k + kv_rows * dim;
    const uint16_t* vg = v + kv_rows * dim;

    const auto key_end = [&](int row) {
      return int(attention_key_end(seq_q, seq_kv, causal, row));
    };
    const int kv_end = key_end(min(m0 + kBlock, seq_q) - 1);
    const int n_tiles = (kv_end + kStep - 1) / kStep;
    const int wrow0 = m0 + 16 * warp;
    const int warp_kv_max = wrow0 < seq_q ? key_end(min(wrow0 + 15, seq_q - 1)) : 0;
    float lrow[2], drow[2];
    int kend[2];
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const int row = wrow0 + g + 8 * r;
      lrow[r] = lse_log2e(lse, q_rows, row, seq_q);
      drow[r] = row < seq_q ? delta[q_rows + row] : 0.f;
      kend[r] = key_end(row);
    }

    float dq_acc[kOut][4];
#pragma unroll
    for (int n = 0; n < kOut; ++n)
#pragma unroll
      for (int e = 0; e < 4; ++e) dq_acc[n][e] = 0.f;

    const auto load_stage = [&](int t) {
      const uint32_t off = 2u * kStepTile * (t & 1);
      load<kStep, D, kThreads>(k_addr + off, kg, t * kStep, seq_kv, dim, tid);
      load<kStep, D, kThreads>(v_addr + off, vg, t * kStep, seq_kv, dim, tid);
    };

    if (n_tiles > 0) {
      load<kBlock, D, kThreads>(q_addr, q + q_rows * dim, m0, seq_q, dim, tid);
      load<kBlock, D, kThreads>(do_addr, dout + q_rows * dim, m0, seq_q, dim, tid);
      load_stage(0);
      ptx::cp_async_commit();
    }
    for (int t = 0; t < n_tiles; ++t) {
      const int n0 = t * kStep;
      if (t + 1 < n_tiles) load_stage(t + 1);
      ptx::cp_async_commit();
      ptx::cp_async_wait<1>();
      __syncthreads();

      if (n0 < warp_kv_max) {  // warp-uniform: some row of this warp sees a key here
        const uint32_t ks = k_addr + 2u * kStepTile * (t & 1), vs = v_addr + 2u * kStepTile * (t & 1);
        float s[kStep / 8][4], dp[kStep / 8][4];  // S, dP
        two_products<kIn, D, kStep>(s, dp, q_addr, ks, do_addr, vs, 16 * warp, dim, lane);
        // dS: element e of tile j is row wrow0 + g + 8(e/2), key n0 + 8j + 2t + e%2.
#pragma unroll
        for (int j = 0; j < kStep / 8; ++j)
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            const int r = e >> 1;
            const bool visible = n0 + 8 * j + 2 * tq + (e & 1) < kend[r];
            const float pr =
                visible ? ptx::ex2_approx_ftz(fmaf(s[j][e], p.scale_log2e, -lrow[r])) : 0.f;
            dp[j][e] = pr * (dp[j][e] - drow[r]);
          }
        // dQ += dS K over the tile's keys.
#pragma unroll
        for (int kk = 0; kk < kStep / 16; ++kk) {
          uint32_t as[4];
          a_from_acc<kBf16>(as, dp[2 * kk], dp[2 * kk + 1]);
#pragma unroll
          for (int nb = 0; nb < kOut / 2; ++nb) {
            if (col0 + 16 * nb < dim) {
              uint32_t b[4];
              load_b_cols<D>(b, ks, 16 * kk, col0 / 16 + nb, lane);
              mma_pair<kIn>(dq_acc[2 * nb], dq_acc[2 * nb + 1], as, b);
            }
          }
        }
      }
      __syncthreads();
    }
    store_rows<kBf16>(dq + q_rows * dim, dq_acc, p.scale, wrow0, seq_q, col0, dim, lane);
  }
}

template <int D> constexpr size_t dkdv_smem_bytes() {
  return size_t(2) * (2 * kBlock * D + 4 * BwdConfig<D>::kStep * D) +
         size_t(4) * sizeof(float) * BwdConfig<D>::kStep;
}
template <int D> constexpr size_t dq_smem_bytes() {
  return size_t(2) * (2 * kBlock * D + 4 * BwdConfig<D>::kStep * D);
}

template <typename Kernel, typename... Args>
cudaError_t launch_mma(Kernel* kernel, size_t smem, BwdParams p, cudaStream_t stream,
                       Args... args) {
  if (smem > 48 * 1024) {
    const cudaError_t err =
        cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem));
    if (err != cudaSuccess) return runtime_error(err);
  }
  // One CTA per task; beyond INT_MAX tasks each CTA walks the tasks grid-stride.
  const int64_t grid = std::min<int64_t>(p.tasks, INT_MAX);
  return launch(kernel, unsigned(grid), kThreads, smem, stream, p, args...);
}

template <bool kBf16, int D>
cudaError_t backward(cudaStream_t stream, const AttentionShape& shape, const uint16_t* q,
                     const uint16_t* k, const uint16_t* v, const uint16_t* dout,
                     const float* lse, const float* delta, uint16_t* dq, uint16_t* dk,
                     uint16_t* dv) {
  const int64_t bh = shape.batch * shape.heads;
  BwdParams p{};
  p.seq_q = int(shape.seq_q);
  p.seq_kv = int(shape.seq_kv);
  p.dim = int(shape.head_dim);
  p.causal = shape.causal ? 1 : 0;
  p.scale = float(shape.scale);
  p.scale_log2e = float(shape.scale * kLog2e);

  p.blocks = (p.seq_kv + kBlock - 1) / kBlock;
  p.tasks = bh * p.blocks * BwdConfig<D>::kChunks;
  if (cudaError_t err = launch_mma(&dkdv_mma_kernel<kBf16, D>, dkdv_smem_bytes<D>(), p, stream,
                                   q, k, v, dout, lse, delta, dk, dv);
      err != cudaSuccess)
    return err;
  p.blocks = (p.seq_q + kBlock - 1) / kBlock;
  p.tasks = bh * p.blocks * BwdConfig<D>::kChunks;
  return launch_mma(&dq_mma_kernel<kBf16, D>, dq_smem_bytes<D>(), p, stream, q, k, v, dout, lse,
                    delta, dq);
}

}  // namespace

template <typename T>
cudaError_t attention_backward_mma(cudaStream_t stream, const AttentionShape& shape, const T* q,
                                   const T* k, const T* v, const T* dout, const float* lse,
                                   const float* delta, T* dq, T* dk, T* dv) {
  static_assert(std::is_same_v<T, oxijax::half> || std::is_same_v<T, oxijax::bfloat16>);
  constexpr bool kBf16 = std::is_same_v<T, oxijax::bfloat16>;
  if (shape.seq_q > kMaxSeq || shape.seq_kv > kMaxSeq) return cudaErrorInvalidValue;
  const auto* q16 = reinterpret_cast<const uint16_t*>(q);
  const auto* k16 = reinterpret_cast<const uint16_t*>(k);
  const auto* v16 = reinterpret_cast<const uint16_t*>(v);
  const auto* do16 = reinterpret_cast<const uint16_t*>(dout);
  auto* dq16 = reinterpret_cast<uint16_t*>(dq);
  auto* dk16 = reinterpret_cast<uint16_t*>(dk);
  auto* dv16 = reinterpret_cast<uint16_t*>(dv);
  switch (padded_dim(shape.head_dim)) {
    case 64:
      return backward<kBf16, 64>(stream, shape, q16, k16, v16, do16, lse, delta, dq16, dk16, dv16);
    case 128:
      return backward<kBf16, 128>(stream, shape, q16, k16, v16, do16, lse, delta, dq16, dk16, dv16);
    case 192:
      return backward<kBf16, 192>(stream, shape, q16, k16, v16, do16, lse, delta, dq16, dk16, dv16);
    case 256:
      return backward<kBf16, 256>(stream, shape, q16, k16, v16, do16, lse, delta, dq16, dk16, dv16);
    default:
      return cudaErrorInvalidValue;
  }
}

template cudaError_t attention_backward_mma<oxijax::half>(
    cudaStream_t, const AttentionShape&, const oxijax::half*, const oxijax::half*,
    const oxijax::half*, const oxijax::half*, const float*, const float*, oxijax::half*,
    oxijax::half*, oxijax::half*);
template cudaError_t attention_backward_mma<oxijax::bfloat16>(
    cudaStream_t, const AttentionShape&, const oxijax::bfloat16*, const oxijax::bfloat16*,
    const oxijax::bfloat16*, const oxijax::bfloat16*, const float*, const float*,
    oxijax::bfloat16*, oxijax::bfloat16*, oxijax::bfloat16*);

}  // namespace oxijax::cuda
