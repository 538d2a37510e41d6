// CUDA attention derivatives, the backward (FlashAttention-2 style) and the JVP, as tiled
// SIMT kernels: P is recomputed from the forward's log-sum-exp and never stored beyond
// one tile.
//
// Three kernels on the caller's stream:
// 1. delta = rowsum(dO * O) per query row, one warp per row, in Acc<T>.
// 2. One CTA per (batch*head, tile of kTile keys): the K/V tile and the tile's dK, dV
//    accumulators stay in shared memory while the CTA walks the query tiles that can
//    see its keys (causal: earlier query tiles are skipped). Per query tile:
//      P = exp(scale * Q K^T - lse), dS = P * (dO V^T - delta)     (kTile x kTile)
//      dV += P^T dO, dK += dS^T Q, dQ += scale * dS K (atomicAdd into an Acc<T>
//      workspace, as several key tiles feed each query row).
//    Rows that see no key (lse = -inf) and masked pairs get P = 0, so zero gradients.
// 3. dQ workspace -> dq, rounded to T.
//
// The JVP (forward-mode derivative), one CTA per (batch*head, tile of kTile queries):
// the Q and dQ tiles and the tile's dO accumulator stay in shared memory while the K,
// V, dK and dV tiles stream past. With the forward's lse, P needs no rescaling:
//   P = exp(scale * Q K^T - lse),  W = P * scale * (dQ K^T + Q dK^T),  m = rowsum(W),
//   dO = P dV + W V - m * O.
// Every accumulator has one owner thread: the JVP is deterministic.
//
// Half types compute in float32, float64 in float64. The tile shrinks (16, 8, 4, 2, 1)
// until its shared memory fits the device's opt-in limit, so any head_dim up to that
// limit works. Launchers only enqueue (no allocation, no synchronisation).
#include <cuda_runtime.h>

#include <algorithm>
#include <climits>
#include <cstdint>
#include <limits>

#include "convert.h"
#include "kernels.h"
#include "launch.h"

namespace oxijax::cuda {
namespace {

constexpr int kThreads = 128;
constexpr int kMaxTile = 16;

inline size_t round_up(size_t bytes) { return (bytes + 255) / 256 * 256; }

// Shared memory of one CTA with tile rows/keys and head_dim: K, V, dK, dV [tile][dim],
// Q, dO [tile][dim], P, dS [tile][tile], lse and delta [tile].
inline size_t main_smem_bytes(int tile, int64_t dim, size_t acc_bytes) {
  return (size_t(6) * tile * dim + size_t(2) * tile * tile + size_t(2) * tile) * acc_bytes;
}

// Shared memory of one JVP CTA: Q, dQ, dO, K, V, dK, dV [tile][dim], P, W [tile][tile],
// lse and m [tile].
inline size_t jvp_smem_bytes(int tile, int64_t dim, size_t acc_bytes) {
  return (size_t(7) * tile * dim + size_t(2) * tile * tile + size_t(2) * tile) * acc_bytes;
}

struct TileParams {
  int64_t seq_q, seq_kv, dim;
  double scale;
  bool causal;
  int tile;
  int64_t tiles;  // per (batch*head): key tiles (backward), query tiles (JVP)
};

// Last key (exclusive) that query row i sees; as AttentionShape::key_end.
__device__ __forceinline__ int64_t key_end(const TileParams& p, int64_t i) {
  if (!p.causal) return p.seq_kv;
  const int64_t end = i + (p.seq_kv - p.seq_q) + 1;
  return end < 0 ? 0 : (end > p.seq_kv ? p.seq_kv : end);
}

__device__ __forceinline__ float exp_acc(float x) { return expf(x); }
__device__ __forceinline__ double exp_acc(double x) { return exp(x); }

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

template <typename T>
__global__ void __launch_bounds__(kThreads)
backward_kernel(TileParams p, const T* __restrict__ q, const T* __restrict__ k,
                const T* __restrict__ v, const T* __restrict__ dout,
                const Acc<T>* __restrict__ lse, const Acc<T>* __restrict__ delta,
                Acc<T>* __restrict__ dq_acc, T* __restrict__ dk, T* __restrict__ dv) {
  using A = Acc<T>;
  OXIJAX_DYNAMIC_SHARED(smem_raw, 16);
  A* smem = reinterpret_cast<A*>(smem_raw);
  const int tile = p.tile;
  const int64_t dim = p.dim;
  A* ks = smem;
  A* vs = ks + tile * dim;
  A* dks = vs + tile * dim;
  A* dvs = dks + tile * dim;
  A* qs = dvs + tile * dim;
  A* dos = qs + tile * dim;
  A* ps = dos + tile * dim;
  A* dss = ps + tile * tile;
  A* lse_s = dss + tile * tile;
  A* delta_s = lse_s + tile;

  const int64_t bh = blockIdx.x / p.tiles;
  const int64_t j0 = (blockIdx.x % p.tiles) * tile;
  const int nk = int(min(int64_t(tile), p.seq_kv - j0));
  const A scale = A(p.scale);
  const A ninf = -std::numeric_limits<A>::infinity();
  const int64_t kv_base = (bh * p.seq_kv + j0) * dim;

  for (int64_t e = threadIdx.x; e < int64_t(tile) * dim; e += blockDim.x) {
    const bool in = e < int64_t(nk) * dim;
    ks[e] = in ? to_acc(k[kv_base + e]) : A(0);
    vs[e] = in ? to_acc(v[kv_base + e]) : A(0);
    dks[e] = A(0);
    dvs[e] = A(0);
  }

  // Causal: query i sees key j0 iff i >= j0 - (Skv - Sq); earlier query tiles are skipped.
  const int64_t first_row = p.causal ? max(int64_t(0), j0 - (p.seq_kv - p.seq_q)) : 0;
  for (int64_t i0 = first_row / tile * tile; i0 < p.seq_q; i0 += tile) {
    const int rows = int(min(int64_t(tile), p.seq_q - i0));
    const int64_t q_base = (bh * p.seq_q + i0) * dim;
    __syncthreads();  // the previous tile's readers of qs, dos, ps, dss are done
    for (int64_t e = threadIdx.x; e < int64_t(tile) * dim; e += blockDim.x) {
      const bool in = e < int64_t(rows) * dim;
      qs[e] = in ? to_acc(q[q_base + e]) : A(0);
      dos[e] = in ? to_acc(dout[q_base + e]) : A(0);
    }
    if (threadIdx.x < tile) {
      const int r = threadIdx.x;
      lse_s[r] = r < rows ? lse[bh * p.seq_q + i0 + r] : ninf;
      delta_s[r] = r < rows ? delta[bh * p.seq_q + i0 + r] : A(0);
    }
    __syncthreads();

    // P and dS for the (rows x keys) tile.
    for (int e = threadIdx.x; e < tile * tile; e += blockDim.x) {
      const int r = e / tile, c = e % tile;
      A pr = A(0), ds = A(0);
      const A l = lse_s[r];
      if (r < rows && c < nk && l != ninf && j0 + c < key_end(p, i0 + r)) {
        A s = A(0), dp = A(0);
        for (int64_t d = 0; d < dim; ++d) {
          s += qs[r * dim + d] * ks[c * dim + d];
          dp += dos[r * dim + d] * vs[c * dim + d];
        }
        pr = exp_acc(scale * s - l);
        ds = pr * (dp - delta_s[r]);
      }
      ps[e] = pr;
      dss[e] = ds;
    }
    __syncthreads();

    // dV += P^T dO and dK += dS^T Q, each (key, column) owned by one thread.
    for (int64_t e = threadIdx.x; e < int64_t(nk) * dim; e += blockDim.x) {
      const int c = int(e / dim);
      const int64_t d = e % dim;
      A gv = A(0), gk = A(0);
      for (int r = 0; r < rows; ++r) {
        gv += ps[r * tile + c] * dos[r * dim + d];
        gk += dss[r * tile + c] * qs[r * dim + d];
      }
      dvs[e] += gv;
      dks[e] += gk;
    }
    // dQ += scale * dS K, shared with the other key tiles through atomics.
    for (int64_t e = threadIdx.x; e < int64_t(rows) * dim; e += blockDim.x) {
      const int r = int(e / dim);
      const int64_t d = e % dim;
      A g = A(0);
      for (int c = 0; c < nk; ++c) g += dss[r * tile + c] * ks[c * dim + d];
      if (g != A(0)) atomicAdd(dq_acc + q_base + e, scale * g);
    }
  }
  __syncthreads();
  for (int64_t e = threadIdx.x; e < int64_t(nk) * dim; e += blockDim.x) {
    dk[kv_base + e] = from_acc<T>(scale * dks[e]);
    dv[kv_base + e] = from_acc<T>(dvs[e]);
  }
}

template <typename T>
__global__ void __launch_bounds__(kThreads)
jvp_kernel(TileParams p, const T* __restrict__ q, const T* __restrict__ k,
           const T* __restrict__ v, const T* __restrict__ out, const Acc<T>* __restrict__ lse,
           const T* __restrict__ dq, const T* __restrict__ dk, const T* __restrict__ dv,
           T* __restrict__ dout) {
  using A = Acc<T>;
  OXIJAX_DYNAMIC_SHARED(smem_raw, 16);
  A* smem = reinterpret_cast<A*>(smem_raw);
  const int tile = p.tile;
  const int64_t dim = p.dim;
  A* qs = smem;
  A* dqs = qs + tile * dim;
  A* acc = dqs + tile * dim;
  A* ks = acc + tile * dim;
  A* vs = ks + tile * dim;
  A* dks = vs + tile * dim;
  A* dvs = dks + tile * dim;
  A* ps = dvs + tile * dim;
  A* ws = ps + tile * tile;
  A* lse_s = ws + tile * tile;
  A* m_s = lse_s + tile;

  const int64_t bh = blockIdx.x / p.tiles;
  const int64_t i0 = (blockIdx.x % p.tiles) * tile;
  const int rows = int(min(int64_t(tile), p.seq_q - i0));
  const A scale = A(p.scale);
  const A ninf = -std::numeric_limits<A>::infinity();
  const int64_t q_base = (bh * p.seq_q + i0) * dim;

  for (int64_t e = threadIdx.x; e < int64_t(tile) * dim; e += blockDim.x) {
    const bool in = e < int64_t(rows) * dim;
    qs[e] = in ? to_acc(q[q_base + e]) : A(0);
    dqs[e] = in ? to_acc(dq[q_base + e]) : A(0);
    acc[e] = A(0);
  }
  if (threadIdx.x < tile) {
    const int r = threadIdx.x;
    lse_s[r] = r < rows ? lse[bh * p.seq_q + i0 + r] : ninf;
    m_s[r] = A(0);
  }

  // Keys [0, kv_end) cover every row of the tile (key_end is non-decreasing).
  const int64_t kv_end = key_end(p, i0 + rows - 1);
  for (int64_t j0 = 0; j0 < kv_end; j0 += tile) {
    const int nk = int(min(int64_t(tile), kv_end - j0));
    const int64_t kv_base = (bh * p.seq_kv + j0) * dim;
    __syncthreads();  // the previous tile's readers of ks, vs, dks, dvs, ps, ws are done
    for (int64_t e = threadIdx.x; e < int64_t(tile) * dim; e += blockDim.x) {
      const bool in = e < int64_t(nk) * dim;
      ks[e] = in ? to_acc(k[kv_base + e]) : A(0);
      vs[e] = in ? to_acc(v[kv_base + e]) : A(0);
      dks[e] = in ? to_acc(dk[kv_base + e]) : A(0);
      dvs[e] = in ? to_acc(dv[kv_base + e]) : A(0);
    }
    __syncthreads();

    // P and W for the (rows x keys) tile; rows that see no key (lse = -inf) get 0.
    for (int e = threadIdx.x; e < tile * tile; e += blockDim.x) {
      const int r = e / tile, c = e % tile;
      A pr = A(0), w = A(0);
      const A l = lse_s[r];
      if (r < rows && c < nk && l != ninf && j0 + c < key_end(p, i0 + r)) {
        A s = A(0), ds = A(0);
        for (int64_t d = 0; d < dim; ++d) {
          s += qs[r * dim + d] * ks[c * dim + d];
          ds += dqs[r * dim + d] * ks[c * dim + d] + qs[r * dim + d] * dks[c * dim + d];
        }
        pr = exp_acc(scale * s - l);
        w = pr * scale * ds;
      }
      ps[e] = pr;
      ws[e] = w;
    }
    __syncthreads();

    // dO += P dV + W V, each (row, column) owned by one thread; m += rowsum(W).
    for (int64_t e = threadIdx.x; e < int64_t(rows) * dim; e += blockDim.x) {
      const int r = int(e / dim);
      const int64_t d = e % dim;
      A g = A(0);
      for (int c = 0; c < nk; ++c)
        g += ps[r * tile + c] * dvs[c * dim + d] + ws[r * tile + c] * vs[c * dim + d];
      acc[e] += g;
    }
    if (threadIdx.x < rows) {
      A sum = A(0);
      for (int c = 0; c < nk; ++c) sum += ws[threadIdx.x * tile + c];
      m_s[threadIdx.x] += sum;
    }
  }
  __syncthreads();
  for (int64_t e = threadIdx.x; e < int64_t(rows) * dim; e += blockDim.x)
    dout[q_base + e] = from_acc<T>(acc[e] - m_s[e / dim] * to_acc(out[q_base + e]));
}

template <typename T>
__global__ void store_kernel(const Acc<T>* __restrict__ acc, T* __restrict__ out, int64_t n) {
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x)
    out[i] = from_acc<T>(acc[i]);
}

inline unsigned grid_for(int64_t items, int per_block) {
  const int64_t blocks = (items + per_block - 1) / per_block;
  return unsigned(std::min<int64_t>(std::max<int64_t>(blocks, 1), int64_t(sm_count()) * 8));
}

// Sets tile to the largest (16, 8, ...) whose shared memory, smem(tile, dim, acc_bytes),
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
  const size_t rows = size_t(shape.batch * shape.heads * shape.seq_q);
  return round_up(rows * size_t(shape.head_dim) * acc) + round_up(rows * acc);
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
  auto* kernel = backward_kernel<T>;
  int tile;
  if (cudaError_t err = fit_tile(kernel, main_smem_bytes, dim, sizeof(A), tile); err != cudaSuccess)
    return err;
  const size_t smem = main_smem_bytes(tile, dim, sizeof(A));
  const int64_t key_tiles = (skv + tile - 1) / tile;
  if (bh * key_tiles > INT_MAX) return cudaErrorInvalidValue;

  A* dq_acc = static_cast<A*>(workspace);
  A* delta = reinterpret_cast<A*>(static_cast<char*>(workspace) +
                                  round_up(size_t(bh * sq * dim) * sizeof(A)));
  if (cudaError_t err = cudaMemsetAsync(dq_acc, 0, size_t(bh * sq * dim) * sizeof(A), stream);
      err != cudaSuccess)
    return runtime_error(err);
  if (cudaError_t err = launch(&delta_kernel<T>, grid_for(bh * sq, kThreads / 32), kThreads, 0,
                               stream, out, dout, delta, bh * sq, dim);
      err != cudaSuccess)
    return err;
  const TileParams params{sq, skv, dim, shape.scale, shape.causal, tile, key_tiles};
  if (cudaError_t err = launch(kernel, unsigned(bh * key_tiles), kThreads, smem, stream, params, q,
                               k, v, dout, lse, delta, dq_acc, dk, dv);
      err != cudaSuccess)
    return err;
  return launch(&store_kernel<T>, grid_for(bh * sq * dim, kThreads), kThreads, 0, stream, dq_acc,
                dq, bh * sq * dim);
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
