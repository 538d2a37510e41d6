// CUDA attention derivatives, the backward (FlashAttention-2 style) and the JVP, as tiled
// SIMT kernels: P is recomputed from the forward's log-sum-exp and never stored beyond
// one tile. After delta, float16 / bfloat16 backward calls that the tensor cores take
// (mma_tile::tensor_cores_take: head_dim up to 256) continue in
// attention_backward_mma_kernels.cu, the same two-kernel scheme on mma.sync.
//
// The backward, three kernels on the caller's stream; its workspace holds only delta:
// 1. delta = rowsum(dO * O) per query row, one warp per row, in Acc<T>, at the start of
//    the workspace.
// 2. dK, dV: one CTA per (batch*head, tile of keys). The K/V tile and the tile's dK, dV
//    accumulators stay in shared memory while the CTA walks the query tiles that can see
//    its keys (causal: earlier query tiles are skipped). Per query tile:
//      P = exp(scale * Q K^T - lse), dS = P * (dO V^T - delta)     (tile x tile)
//      dV += P^T dO, dK += dS^T Q.
// 3. dQ: one CTA per (batch*head, tile of queries). The Q/dO tile and the tile's dQ
//    accumulator stay in shared memory while the CTA walks the key tiles its rows see
//    (causal: up to the last row's key_end), recomputing P and dS:  dQ += scale * dS K.
//    Recomputing P and dS costs less than sharing dQ between key tiles through atomics,
//    whose order (and so rounding) changes run to run.
// Rows that see no key (lse = -inf) and masked pairs get P = 0, so zero gradients.
//
// The JVP (forward-mode derivative), one CTA per (batch*head, tile of queries): the Q and
// dQ tiles and the tile's dO accumulator stay in shared memory while the K, V, dK and dV
// tiles stream past. With the forward's lse, P needs no rescaling:
//   P = exp(scale * Q K^T - lse),  W = P * scale * (dQ K^T + Q dK^T),  m = rowsum(W),
//   dO = P dV + W V - m * O.
//
// Every accumulator has one owner thread that sums in a fixed order (no atomics): the
// results are bit-identical run to run. Half types compute in float32, float64 in
// float64. Tiles have up to 32 rows (keys or queries) and shrink (16, 8, ..., 1) until
// their shared memory fits the device's opt-in limit, so any head_dim up to that limit
// works. Shared tiles read a column at a time by threads of different rows have an odd
// row stride (head_dim | 1), so those threads hit distinct banks. Launchers only enqueue
// (no allocation, no synchronisation).
#include <cuda_runtime.h>

#include <algorithm>
#include <climits>
#include <cstdint>
#include <limits>
#include <type_traits>

#include "attention_mma.h"
#include "convert.h"
#include "kernels.h"
#include "launch.h"
#include "mma_tile.h"

namespace oxijax::cuda {
namespace {

constexpr int kThreads = 128;
constexpr int kWarps = kThreads / 32;
constexpr int kMaxTile = 32;
// scores(): a thread's rows of its key column, at most kMaxTile^2 / kThreads.
constexpr int kScoreRows = kMaxTile * kMaxTile / kThreads;
// accumulate(): a thread's output rows, at most kMaxTile / kWarps.
constexpr int kOutRows = kMaxTile / kWarps;
static_assert(kThreads % kMaxTile == 0 && kMaxTile * kMaxTile % kThreads == 0 &&
              kMaxTile % kWarps == 0);

inline size_t round_up(size_t bytes) { return (bytes + 255) / 256 * 256; }

// Row stride of a shared tile read column-wise: odd, so that the rows of a column fall in
// distinct 4-byte banks (8-byte ones within a half-warp for double). The accumulators,
// which warps only access along a row, keep stride dim.
__host__ __device__ __forceinline__ int64_t padded(int64_t n) { return n | 1; }

// Shared memory of one dK/dV CTA with tile keys/rows and head_dim: K, V, Q, dO
// [tile][padded(dim)], the dK, dV accumulators [tile * dim], P, dS [tile][tile], lse and
// delta [tile].
inline size_t dkdv_smem_bytes(int tile, int64_t dim, size_t acc_bytes) {
  return size_t(tile) * size_t(4 * padded(dim) + 2 * dim + 2 * tile + 2) * acc_bytes;
}

// Shared memory of one dQ CTA: Q, dO, K, V [tile][padded(dim)], the dQ accumulator
// [tile * dim], dS [tile][tile], lse and delta [tile].
inline size_t dq_smem_bytes(int tile, int64_t dim, size_t acc_bytes) {
  return size_t(tile) * size_t(4 * padded(dim) + dim + tile + 2) * acc_bytes;
}

// Shared memory of one JVP CTA: Q, dQ, K, V, dK, dV [tile][padded(dim)], the dO
// accumulator [tile * dim], P, W [tile][padded(tile)], lse and m [tile].
inline size_t jvp_smem_bytes(int tile, int64_t dim, size_t acc_bytes) {
  return size_t(tile) * size_t(6 * padded(dim) + dim + 2 * padded(tile) + 2) * acc_bytes;
}

struct TileParams {
  int64_t seq_q, seq_kv, dim;
  double scale;
  bool causal;
  int tile;
  int64_t tiles;  // per (batch*head): key tiles (dK/dV), query tiles (dQ, JVP)
};

// Last key (exclusive) that query row i sees.
__device__ __forceinline__ int64_t key_end(const TileParams& p, int64_t i) {
  return attention_key_end(p.seq_q, p.seq_kv, p.causal, i);
}

__device__ __forceinline__ float exp_acc(float x) { return expf(x); }
__device__ __forceinline__ double exp_acc(double x) { return exp(x); }

// Rows [0, n) of a row-major [n][dim] block of global memory into shared rows of stride
// ld, converted to Acc<T>.
template <typename T>
__device__ __forceinline__ void load_rows(Acc<T>* dst, int ld, const T* __restrict__ src,
                                          int n, int dim) {
  for (int e = threadIdx.x; e < n * dim; e += blockDim.x) {
    const int r = e / dim;
    dst[r * ld + (e - r * dim)] = to_acc(src[e]);
  }
}

template <typename T>
__global__ void delta_kernel(const T* __restrict__ out, const T* __restrict__ dout,
                             Acc<T>* __restrict__ delta, int64_t rows, int64_t dim) {
  using A = Acc<T>;
  const int lane = threadIdx.x & 31;
  const int64_t warps = int64_t(gridDim.x) * (blockDim.x / 32);
  for (int64_t r = int64_t(blockIdx.x) * (blockDim.x / 32) + threadIdx.x / 32; r < rows;
       r += warps) {
    A sum = A(0);
    for (int64_t d = lane; d < dim; d += 32)
      sum += to_acc(out[r * dim + d]) * to_acc(dout[r * dim + d]);
    for (int offset = 16; offset > 0; offset >>= 1) sum += __shfl_down_sync(0xffffffffu, sum, offset);
    if (lane == 0) delta[r] = sum;
  }
}

// P = exp(scale * Q K^T - lse) and dS = P * (dO V^T - delta) of query rows i0 + [0, rows)
// and keys j0 + [0, nk), into ps (unless null) and dss, [tile][tile]; zero where out of
// range or masked. qs, dos, ks, vs have row stride ld. Thread t owns key column t % tile
// and rows t / tile + i * (kThreads / tile): it loads its K and V values once per d for
// all its rows, and a warp's Q and dO reads are one or two addresses.
template <typename A>
__device__ __forceinline__ void scores(const TileParams& p, int ld, const A* qs, const A* dos,
                                       const A* ks, const A* vs, const A* lse_s,
                                       const A* delta_s, int64_t i0, int rows, int64_t j0,
                                       int nk, A* ps, A* dss) {
  const int tile = p.tile, dim = int(p.dim);
  const int c = threadIdx.x % tile, r0 = threadIdx.x / tile, step = kThreads / tile;
  A s[kScoreRows], dp[kScoreRows];
#pragma unroll
  for (int i = 0; i < kScoreRows; ++i) s[i] = dp[i] = A(0);
  if (c < nk && r0 < rows) {
    for (int d = 0; d < dim; ++d) {
      const A kd = ks[c * ld + d], vd = vs[c * ld + d];
#pragma unroll
      for (int i = 0; i < kScoreRows; ++i) {
        const int r = r0 + i * step;
        if (r < rows) {
          s[i] += qs[r * ld + d] * kd;
          dp[i] += dos[r * ld + d] * vd;
        }
      }
    }
  }
  const A scale = A(p.scale);
  const A ninf = -std::numeric_limits<A>::infinity();
#pragma unroll
  for (int i = 0; i < kScoreRows; ++i) {
    const int r = r0 + i * step;
    if (r >= tile) continue;
    A pr = A(0), ds = A(0);
    if (r < rows && c < nk && lse_s[r] != ninf && j0 + c < key_end(p, i0 + r)) {
      pr = exp_acc(scale * s[i] - lse_s[r]);
      ds = pr * (dp[i] - delta_s[r]);
    }
    if (ps) ps[r * tile + c] = pr;
    dss[r * tile + c] = ds;
  }
}

// acc[y * dim + x] += sum over k < n, in order, of a[y * ay + k * ak] * b[k * ld + x], for
// y < ny and x < dim. Element (y, x) is thread (warp y % kWarps, lane x % 32)'s: per k a
// warp reads one a value per row (a broadcast) and 32 consecutive b values, and each
// thread keeps its kOutRows sums in registers.
template <typename A>
__device__ __forceinline__ void accumulate(A* acc, int dim, int ny, int n, const A* a, int ay,
                                           int ak, const A* b, int ld) {
  const int lane = threadIdx.x % 32, y0 = threadIdx.x / 32;
  if (y0 >= ny) return;
  for (int x = lane; x < dim; x += 32) {
    A g[kOutRows];
#pragma unroll
    for (int i = 0; i < kOutRows; ++i) g[i] = A(0);
    for (int k = 0; k < n; ++k) {
      const A bk = b[k * ld + x];
#pragma unroll
      for (int i = 0; i < kOutRows; ++i)
        if (y0 + i * kWarps < ny) g[i] += a[(y0 + i * kWarps) * ay + k * ak] * bk;
    }
#pragma unroll
    for (int i = 0; i < kOutRows; ++i)
      if (y0 + i * kWarps < ny) acc[(y0 + i * kWarps) * dim + x] += g[i];
  }
}

// Per query tile, lse and delta of its rows into shared memory.
template <typename A>
__device__ __forceinline__ void load_row_stats(A* lse_s, A* delta_s, const A* __restrict__ lse,
                                               const A* __restrict__ delta, int rows) {
  if (int(threadIdx.x) < rows) {
    lse_s[threadIdx.x] = lse[threadIdx.x];
    delta_s[threadIdx.x] = delta[threadIdx.x];
  }
}

template <typename T>
__global__ void __launch_bounds__(kThreads)
dkdv_kernel(TileParams p, const T* __restrict__ q, const T* __restrict__ k,
            const T* __restrict__ v, const T* __restrict__ dout,
            const Acc<T>* __restrict__ lse, const Acc<T>* __restrict__ delta,
            T* __restrict__ dk, T* __restrict__ dv) {
  using A = Acc<T>;
  OXIJAX_DYNAMIC_SHARED(smem_raw, 16);
  const int tile = p.tile, dim = int(p.dim), ld = int(padded(p.dim));
  A* ks = reinterpret_cast<A*>(smem_raw);
  A* vs = ks + tile * ld;
  A* qs = vs + tile * ld;
  A* dos = qs + tile * ld;
  A* dks = dos + tile * ld;
  A* dvs = dks + tile * dim;
  A* ps = dvs + tile * dim;
  A* dss = ps + tile * tile;
  A* lse_s = dss + tile * tile;
  A* delta_s = lse_s + tile;

  const int64_t bh = blockIdx.x / p.tiles;
  const int64_t j0 = (blockIdx.x % p.tiles) * tile;
  const int nk = int(min(int64_t(tile), p.seq_kv - j0));
  const int64_t kv_base = (bh * p.seq_kv + j0) * p.dim;
  load_rows(ks, ld, k + kv_base, nk, dim);
  load_rows(vs, ld, v + kv_base, nk, dim);
  for (int e = threadIdx.x; e < nk * dim; e += kThreads) dks[e] = dvs[e] = A(0);

  // Causal: query i sees key j0 iff i >= j0 - (Skv - Sq); earlier query tiles are skipped.
  const int64_t first_row = p.causal ? max(int64_t(0), j0 - (p.seq_kv - p.seq_q)) : 0;
  for (int64_t i0 = first_row / tile * tile; i0 < p.seq_q; i0 += tile) {
    const int rows = int(min(int64_t(tile), p.seq_q - i0));
    const int64_t q_base = (bh * p.seq_q + i0) * p.dim;
    __syncthreads();  // the previous tile's readers of qs, dos, ps, dss are done
    load_rows(qs, ld, q + q_base, rows, dim);
    load_rows(dos, ld, dout + q_base, rows, dim);
    load_row_stats(lse_s, delta_s, lse + bh * p.seq_q + i0, delta + bh * p.seq_q + i0, rows);
    __syncthreads();
    scores(p, ld, qs, dos, ks, vs, lse_s, delta_s, i0, rows, j0, nk, ps, dss);
    __syncthreads();
    accumulate(dvs, dim, nk, rows, ps, 1, tile, dos, ld);  // dV += P^T dO
    accumulate(dks, dim, nk, rows, dss, 1, tile, qs, ld);  // dK += dS^T Q
  }
  __syncthreads();  // accumulate()'s owners are done
  const A scale = A(p.scale);
  for (int e = threadIdx.x; e < nk * dim; e += kThreads) {
    dk[kv_base + e] = from_acc<T>(scale * dks[e]);
    dv[kv_base + e] = from_acc<T>(dvs[e]);
  }
}

template <typename T>
__global__ void __launch_bounds__(kThreads)
dq_kernel(TileParams p, const T* __restrict__ q, const T* __restrict__ k,
          const T* __restrict__ v, const T* __restrict__ dout, const Acc<T>* __restrict__ lse,
          const Acc<T>* __restrict__ delta, T* __restrict__ dq) {
  using A = Acc<T>;
  OXIJAX_DYNAMIC_SHARED(smem_raw, 16);
  const int tile = p.tile, dim = int(p.dim), ld = int(padded(p.dim));
  A* qs = reinterpret_cast<A*>(smem_raw);
  A* dos = qs + tile * ld;
  A* ks = dos + tile * ld;
  A* vs = ks + tile * ld;
  A* dqs = vs + tile * ld;
  A* dss = dqs + tile * dim;
  A* lse_s = dss + tile * tile;
  A* delta_s = lse_s + tile;

  const int64_t bh = blockIdx.x / p.tiles;
  const int64_t i0 = (blockIdx.x % p.tiles) * tile;
  const int rows = int(min(int64_t(tile), p.seq_q - i0));
  const int64_t q_base = (bh * p.seq_q + i0) * p.dim;
  load_rows(qs, ld, q + q_base, rows, dim);
  load_rows(dos, ld, dout + q_base, rows, dim);
  load_row_stats(lse_s, delta_s, lse + bh * p.seq_q + i0, delta + bh * p.seq_q + i0, rows);
  for (int e = threadIdx.x; e < rows * dim; e += kThreads) dqs[e] = A(0);

  // Keys [0, kv_end) cover every row of the tile (key_end is non-decreasing).
  const int64_t kv_end = key_end(p, i0 + rows - 1);
  for (int64_t j0 = 0; j0 < kv_end; j0 += tile) {
    const int nk = int(min(int64_t(tile), kv_end - j0));
    const int64_t kv_base = (bh * p.seq_kv + j0) * p.dim;
    __syncthreads();  // the previous tile's readers of ks, vs, dss are done
    load_rows(ks, ld, k + kv_base, nk, dim);
    load_rows(vs, ld, v + kv_base, nk, dim);
    __syncthreads();
    scores(p, ld, qs, dos, ks, vs, lse_s, delta_s, i0, rows, j0, nk, static_cast<A*>(nullptr),
           dss);
    __syncthreads();
    accumulate(dqs, dim, rows, nk, dss, tile, 1, ks, ld);  // dQ += dS K
  }
  __syncthreads();  // accumulate()'s owners are done
  const A scale = A(p.scale);
  for (int e = threadIdx.x; e < rows * dim; e += kThreads)
    dq[q_base + e] = from_acc<T>(scale * dqs[e]);
}

template <typename T>
__global__ void __launch_bounds__(kThreads)
jvp_kernel(TileParams p, const T* __restrict__ q, const T* __restrict__ k,
           const T* __restrict__ v, const T* __restrict__ out, const Acc<T>* __restrict__ lse,
           const T* __restrict__ dq, const T* __restrict__ dk, const T* __restrict__ dv,
           T* __restrict__ dout) {
  using A = Acc<T>;
  OXIJAX_DYNAMIC_SHARED(smem_raw, 16);
  const int tile = p.tile, dim = int(p.dim), ld = int(padded(p.dim));
  const int ldt = int(padded(tile));  // m's row sums read P and W with a thread per row
  A* qs = reinterpret_cast<A*>(smem_raw);
  A* dqs = qs + tile * ld;
  A* ks = dqs + tile * ld;
  A* vs = ks + tile * ld;
  A* dks = vs + tile * ld;
  A* dvs = dks + tile * ld;
  A* acc = dvs + tile * ld;
  A* ps = acc + tile * dim;
  A* ws = ps + tile * ldt;
  A* lse_s = ws + tile * ldt;
  A* m_s = lse_s + tile;

  const int64_t bh = blockIdx.x / p.tiles;
  const int64_t i0 = (blockIdx.x % p.tiles) * tile;
  const int rows = int(min(int64_t(tile), p.seq_q - i0));
  const A scale = A(p.scale);
  const A ninf = -std::numeric_limits<A>::infinity();
  const int64_t q_base = (bh * p.seq_q + i0) * p.dim;

  load_rows(qs, ld, q + q_base, rows, dim);
  load_rows(dqs, ld, dq + q_base, rows, dim);
  // Accumulator element e belongs to thread e % kThreads throughout: no barriers for it.
  for (int e = threadIdx.x; e < rows * dim; e += kThreads) acc[e] = A(0);
  if (int(threadIdx.x) < rows) {
    lse_s[threadIdx.x] = lse[bh * p.seq_q + i0 + threadIdx.x];
    m_s[threadIdx.x] = A(0);
  }

  // Keys [0, kv_end) cover every row of the tile (key_end is non-decreasing).
  const int64_t kv_end = key_end(p, i0 + rows - 1);
  for (int64_t j0 = 0; j0 < kv_end; j0 += tile) {
    const int nk = int(min(int64_t(tile), kv_end - j0));
    const int64_t kv_base = (bh * p.seq_kv + j0) * p.dim;
    __syncthreads();  // the previous tile's readers of ks, vs, dks, dvs, ps, ws are done
    load_rows(ks, ld, k + kv_base, nk, dim);
    load_rows(vs, ld, v + kv_base, nk, dim);
    load_rows(dks, ld, dk + kv_base, nk, dim);
    load_rows(dvs, ld, dv + kv_base, nk, dim);
    __syncthreads();

    // P and W for the (rows x keys) tile; rows that see no key (lse = -inf) get 0.
    for (int e = threadIdx.x; e < tile * tile; e += kThreads) {
      const int r = e / tile, c = e % tile;
      A pr = A(0), w = A(0);
      if (r < rows && c < nk && lse_s[r] != ninf && j0 + c < key_end(p, i0 + r)) {
        A s = A(0), ds = A(0);
        for (int d = 0; d < dim; ++d) {
          s += qs[r * ld + d] * ks[c * ld + d];
          ds += dqs[r * ld + d] * ks[c * ld + d] + qs[r * ld + d] * dks[c * ld + d];
        }
        pr = exp_acc(scale * s - lse_s[r]);
        w = pr * scale * ds;
      }
      ps[r * ldt + c] = pr;
      ws[r * ldt + c] = w;
    }
    __syncthreads();

    // dO += P dV + W V, summed over the keys in order; m += rowsum(W).
    for (int e = threadIdx.x; e < rows * dim; e += kThreads) {
      const int r = e / dim, d = e - r * dim;
      A g = A(0);
      for (int c = 0; c < nk; ++c)
        g += ps[r * ldt + c] * dvs[c * ld + d] + ws[r * ldt + c] * vs[c * ld + d];
      acc[e] += g;
    }
    if (int(threadIdx.x) < rows) {
      A sum = A(0);
      for (int c = 0; c < nk; ++c) sum += ws[threadIdx.x * ldt + c];
      m_s[threadIdx.x] += sum;
    }
  }
  __syncthreads();  // m_s's owners are done
  for (int e = threadIdx.x; e < rows * dim; e += kThreads)
    dout[q_base + e] = from_acc<T>(acc[e] - m_s[e / dim] * to_acc(out[q_base + e]));
}

inline unsigned grid_for(int64_t items, int per_block) {
  const int64_t blocks = (items + per_block - 1) / per_block;
  return unsigned(std::min<int64_t>(std::max<int64_t>(blocks, 1), int64_t(sm_count()) * 8));
}

// Sets tile to the largest (32, 16, ...) whose shared memory, smem(tile, dim, acc_bytes),
// fits the device's opt-in limit, and lets kernel use that much.
template <typename Kernel>
cudaError_t fit_tile(Kernel* kernel, size_t (*smem)(int, int64_t, size_t), int64_t dim,
                     size_t acc_bytes, int& tile) {
  int device = 0, optin = 48 * 1024;
  cudaError_t err = cudaGetDevice(&device);
  if (err == cudaSuccess)
    err = cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, device);
  if (err != cudaSuccess) return runtime_error(err);
  tile = kMaxTile;
  while (tile > 1 && smem(tile, dim, acc_bytes) > size_t(optin)) tile /= 2;
  const size_t bytes = smem(tile, dim, acc_bytes);
  if (bytes > size_t(optin)) return cudaErrorInvalidValue;
  if (bytes > 48 * 1024)
    return runtime_error(
        cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(bytes)));
  return cudaSuccess;
}

}  // namespace

size_t attention_backward_workspace_bytes(const AttentionShape& shape, size_t element_bytes) {
  const size_t acc = element_bytes == 8 ? 8 : 4;
  return round_up(size_t(shape.batch * shape.heads * shape.seq_q) * acc);
}

template <typename T>
cudaError_t attention_backward(cudaStream_t stream, const AttentionShape& shape, const T* q,
                               const T* k, const T* v, const T* out, const Acc<T>* lse,
                               const T* dout, T* dq, T* dk, T* dv, void* workspace) {
  using A = Acc<T>;
  const int64_t bh = shape.batch * shape.heads;
  const int64_t sq = shape.seq_q, skv = shape.seq_kv, dim = shape.head_dim;
  if (bh <= 0) return cudaSuccess;
  if (sq <= 0 || skv <= 0 || dim <= 0) {  // nothing attends: zero gradients
    cudaError_t err = cudaSuccess;
    if (sq * dim > 0) err = cudaMemsetAsync(dq, 0, size_t(bh * sq * dim) * sizeof(T), stream);
    if (err == cudaSuccess && skv * dim > 0)
      err = cudaMemsetAsync(dk, 0, size_t(bh * skv * dim) * sizeof(T), stream);
    if (err == cudaSuccess && skv * dim > 0)
      err = cudaMemsetAsync(dv, 0, size_t(bh * skv * dim) * sizeof(T), stream);
    return runtime_error(err);
  }
  A* delta = static_cast<A*>(workspace);
  if (cudaError_t err = launch(&delta_kernel<T>, grid_for(bh * sq, kThreads / 32), kThreads, 0,
                               stream, out, dout, delta, bh * sq, dim);
      err != cudaSuccess)
    return err;
  if constexpr (std::is_same_v<T, oxijax::half> || std::is_same_v<T, oxijax::bfloat16>) {
    bool tensor_cores = false;
    if (cudaError_t err =
            mma_tile::tensor_cores_take(dim, {q, k, v, out, dout, dq, dk, dv}, tensor_cores);
        err != cudaSuccess)
      return err;
    if (tensor_cores)
      return attention_backward_mma(stream, shape, q, k, v, dout, lse, delta, dq, dk, dv);
  }

  auto* dkdv = dkdv_kernel<T>;
  auto* dq_k = dq_kernel<T>;
  int kv_tile, q_tile;
  if (cudaError_t err = fit_tile(dkdv, dkdv_smem_bytes, dim, sizeof(A), kv_tile);
      err != cudaSuccess)
    return err;
  if (cudaError_t err = fit_tile(dq_k, dq_smem_bytes, dim, sizeof(A), q_tile); err != cudaSuccess)
    return err;
  const int64_t key_tiles = (skv + kv_tile - 1) / kv_tile;
  const int64_t query_tiles = (sq + q_tile - 1) / q_tile;
  if (bh * key_tiles > INT_MAX || bh * query_tiles > INT_MAX) return cudaErrorInvalidValue;
  const TileParams kv_params{sq, skv, dim, shape.scale, shape.causal, kv_tile, key_tiles};
  if (cudaError_t err = launch(dkdv, unsigned(bh * key_tiles), kThreads,
                               dkdv_smem_bytes(kv_tile, dim, sizeof(A)), stream, kv_params, q, k,
                               v, dout, lse, delta, dk, dv);
      err != cudaSuccess)
    return err;
  const TileParams q_params{sq, skv, dim, shape.scale, shape.causal, q_tile, query_tiles};
  return launch(dq_k, unsigned(bh * query_tiles), kThreads, dq_smem_bytes(q_tile, dim, sizeof(A)),
                stream, q_params, q, k, v, dout, lse, delta, dq);
}

template <typename T>
cudaError_t attention_jvp(cudaStream_t stream, const AttentionShape& shape, const T* q,
                          const T* k, const T* v, const T* out, const Acc<T>* lse, const T* dq,
                          const T* dk, const T* dv, T* dout) {
  using A = Acc<T>;
  const int64_t bh = shape.batch * shape.heads;
  const int64_t sq = shape.seq_q, skv = shape.seq_kv, dim = shape.head_dim;
  if (bh <= 0 || sq <= 0 || dim <= 0) return cudaSuccess;
  if (skv <= 0) {  // nothing attends: a zero tangent
    return runtime_error(cudaMemsetAsync(dout, 0, size_t(bh * sq * dim) * sizeof(T), stream));
  }
  auto* kernel = jvp_kernel<T>;
  int tile;
  if (cudaError_t err = fit_tile(kernel, jvp_smem_bytes, dim, sizeof(A), tile); err != cudaSuccess)
    return err;
  const int64_t query_tiles = (sq + tile - 1) / tile;
  if (bh * query_tiles > INT_MAX) return cudaErrorInvalidValue;
  const TileParams params{sq, skv, dim, shape.scale, shape.causal, tile, query_tiles};
  return launch(kernel, unsigned(bh * query_tiles), kThreads, jvp_smem_bytes(tile, dim, sizeof(A)),
                stream, params, q, k, v, out, lse, dq, dk, dv, dout);
}

#define OXIJAX_INSTANTIATE_ATTENTION_JVP(T)                                                   \
  template cudaError_t attention_jvp<T>(cudaStream_t, const AttentionShape&, const T*,        \
                                        const T*, const T*, const T*, const Acc<T>*, const T*, \
                                        const T*, const T*, T*);
OXIJAX_INSTANTIATE_ATTENTION_JVP(oxijax::half)
OXIJAX_INSTANTIATE_ATTENTION_JVP(oxijax::bfloat16)
OXIJAX_INSTANTIATE_ATTENTION_JVP(float)
OXIJAX_INSTANTIATE_ATTENTION_JVP(double)
#undef OXIJAX_INSTANTIATE_ATTENTION_JVP

#define OXIJAX_INSTANTIATE_ATTENTION_BACKWARD(T)                                              \
  template cudaError_t attention_backward<T>(cudaStream_t, const AttentionShape&, const T*,   \
                                             const T*, const T*, const T*, const Acc<T>*,     \
                                             const T*, T*, T*, T*, void*);
OXIJAX_INSTANTIATE_ATTENTION_BACKWARD(oxijax::half)
OXIJAX_INSTANTIATE_ATTENTION_BACKWARD(oxijax::bfloat16)
OXIJAX_INSTANTIATE_ATTENTION_BACKWARD(float)
OXIJAX_INSTANTIATE_ATTENTION_BACKWARD(double)
#undef OXIJAX_INSTANTIATE_ATTENTION_BACKWARD

}  // namespace oxijax::cuda
