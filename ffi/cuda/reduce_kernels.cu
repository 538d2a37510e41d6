// CUDA reduce kernels: x viewed as [outer, axis, inner] reduced over its middle dim
// into out [outer, inner], in one pass over x, never transposed.
//
// inner == 1 (rows of `axis` contiguous elements):
// * short rows, or rows enough to give every warp one: groups of G lanes (G a power of
//   two <= 32, sized to the row) reduce one row each with 128-bit loads (a scalar head
//   up to the row's 16-byte boundary, a scalar tail), then shuffle-reduce in the group;
//   grid-stride over the rows.
// * otherwise one block of kThreads per row chunk, CUB BlockReduce across the block.
//   Rows too long for one block (or too few rows to fill the device) are split into
//   `chunks` chunks; each block writes its partial into the workspace [outer, chunks]
//   and a second launch of the group kernel reduces the partials.
// inner > 1 (columns):
// * thread (tx, ty) of a (bx, by) block owns V consecutive columns of one outer index
//   (128-bit loads where inner and x's alignment allow) and folds every by-th row of the
//   block's axis range; blocks tile the (outer x inner / V) column vectors, so a warp
//   reads contiguous memory whether inner is wide (tx along it) or narrow (ty along
//   consecutive rows); the by partials are combined as a tree in shared memory.
// * a long axis, or too few column tiles to fill the device, splits the axis over
//   blocks: partials go to the workspace [outer, split, inner] and a second launch of
//   the same kernel (no split) reduces them.
//
// Accuracy: every thread folds a bounded number of elements per accumulator (at most
// kMaxPacksPerThread / kUnroll per lane of a pack in the row kernels, kMaxRowsPerThread /
// kUnroll for columns), each step combining kUnroll loads as a small tree; partials are
// combined by trees (shuffles, BlockReduce, shared memory). float32 sums therefore stay
// close to pairwise accuracy. The combine order differs from the CPU kernels.
//
// The plans (and so the workspace size) depend only on the shape and the element size,
// never on the device or the pointers: reduce_workspace_bytes and reduce agree. A
// misaligned x only narrows the loads. Empty results launch nothing; axis == 0 fills out
// with finish(identity, 0) (sum 0, mean NaN).
#include <cub/cub.cuh>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <limits>

#include "convert.h"
#include "kernels.h"
#include "launch.h"
#include "oxijax/math.h"

namespace oxijax::cuda {
namespace {

constexpr int kThreads = 256;           // threads per block
constexpr int kUnroll = 4;              // loads in flight per thread per step
constexpr int64_t kTargetBlocks = 1024;  // blocks that fill a large GPU (a wave on an H200)
// inner == 1
constexpr int64_t kGroupPacks = 256;        // rows of at most this many packs: lane groups
constexpr int64_t kGroupPacksLong = 2048;   // ... or this many, given a row for every warp
constexpr int64_t kMinPacksPerThread = 4;   // a row chunk gives each thread at least ...
constexpr int64_t kMaxPacksPerThread = 64;  // ... and at most this many packs
// inner > 1
constexpr int64_t kMinRowsPerThread = 8;    // block rows (by) leave each thread this many
constexpr int64_t kMinSplitRows = 64;       // an axis split leaves each thread this many
constexpr int64_t kMaxRowsPerThread = 1024;  // rows folded by one thread at most

template <ReduceOp op> struct Combine {
  template <typename A> __device__ __forceinline__ A operator()(const A& a, const A& b) const {
    return Reducer<op>::combine(a, b);
  }
};

__host__ __device__ __forceinline__ uintptr_t address(const void* p) {
  return reinterpret_cast<uintptr_t>(p);
}

// ------------------------------------------------------------ host helpers

// Reducer<op>::identity, evaluated on the host and passed to the kernels. Written out
// here because instantiating Reducer::identity in a .cu file also compiles its device
// side, which calls std::numeric_limits (constexpr host functions; nvcc warns without
// --expt-relaxed-constexpr). Same values: 0 for SUM / MEAN, -inf for MAX, +inf for MIN.
template <ReduceOp op, typename A>
A identity_of() {
  if constexpr (op == ReduceOp::MAX) return -std::numeric_limits<A>::infinity();
  else if constexpr (op == ReduceOp::MIN) return std::numeric_limits<A>::infinity();
  else return A(0);
}

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

int pow2_ceil(int64_t n) {
  int p = 1;
  while (p < n && p < (1 << 30)) p <<= 1;
  return p;
}


// Grids: lane-group kernels stride over rows with one wave of resident blocks; kernels
// over virtual blocks (equal work items) take up to `waves` waves and loop over the rest.
template <auto Kernel>
unsigned wave_grid(int64_t blocks, int waves) {
  const int64_t cap = int64_t{sm_count()} * resident_blocks<Kernel, kThreads>() * waves;
  return static_cast<unsigned>(std::max<int64_t>(1, std::min(blocks, cap)));
}

size_t acc_bytes(size_t element_bytes) { return element_bytes == 8 ? 8 : 4; }

int max_vec(size_t element_bytes) {
  return kVecBytes / static_cast<int>(std::clamp<size_t>(element_bytes, 1, kVecBytes));
}

// Lanes per row for rows of `n` elements of `element_bytes`.
int group_for(int64_t n, size_t element_bytes) {
  return std::min(32, pow2_ceil(ceil_div(n, max_vec(element_bytes))));
}

// ------------------------------------------------------------ plans

// inner == 1: lane groups (chunks == 0), or blocks over `chunks` chunks of chunk_len.
struct RowPlan {
  int group = 32;
  int64_t chunks = 0, chunk_len = 0;
};

RowPlan plan_rows(int64_t outer, int64_t axis, size_t element_bytes) {
  RowPlan plan;
  const int v = max_vec(element_bytes);
  const int64_t packs = ceil_div(axis, v);
  const int64_t warps_to_fill = kTargetBlocks * (kThreads / 32);
  if (packs <= kGroupPacks || (outer >= warps_to_fill && packs <= kGroupPacksLong)) {
    plan.group = group_for(axis, element_bytes);
    return plan;
  }
  const int64_t step = int64_t{kThreads} * v;  // elements per block-wide pack load
  const int64_t by_accuracy = ceil_div(axis, step * kMaxPacksPerThread);
  const int64_t by_parallelism = ceil_div(kTargetBlocks, outer);
  const int64_t cap = std::max<int64_t>(1, axis / (step * kMinPacksPerThread));
  const int64_t chunks = std::max(by_accuracy, std::min(by_parallelism, cap));
  plan.chunk_len = ceil_div(ceil_div(axis, chunks), step) * step;
  plan.chunks = ceil_div(axis, plan.chunk_len);
  return plan;
}

// inner > 1: block shape and tiling for V-wide column vectors.
struct ColGeom {
  int bx = 1, by = 1;
  int64_t iv = 1, ncv = 1, tiles = 1;  // vectors per row, column vectors, column tiles
};

ColGeom col_geom(int64_t outer, int64_t axis, int64_t inner, int v) {
  ColGeom g;
  g.iv = inner / v;
  g.ncv = outer * g.iv;
  const int bx_min = std::min(pow2_ceil(g.iv), 32);
  g.by = std::min(kThreads / bx_min, pow2_ceil(ceil_div(axis, kMinRowsPerThread)));
  g.bx = std::min(kThreads / g.by, pow2_ceil(g.ncv));
  g.tiles = ceil_div(g.ncv, g.bx);
  return g;
}

// Widest pack (elements, a power of two) that divides inner.
int col_vec(int64_t inner, size_t element_bytes) {
  int v = max_vec(element_bytes);
  while (v > 1 && inner % v != 0) v /= 2;
  return v;
}

struct ColPlan {
  int64_t split = 1, chunk = 0;  // axis ranges per column tile and their length
};

ColPlan plan_cols(int64_t outer, int64_t axis, int64_t inner, size_t element_bytes) {
  const ColGeom g = col_geom(outer, axis, inner, col_vec(inner, element_bytes));
  const int64_t by_accuracy = ceil_div(axis, g.by * kMaxRowsPerThread);
  const int64_t by_parallelism = ceil_div(kTargetBlocks, g.tiles);
  const int64_t cap = std::max<int64_t>(1, axis / (g.by * kMinSplitRows));
  const int64_t split = std::max(by_accuracy, std::min(by_parallelism, cap));
  ColPlan plan;
  plan.chunk = ceil_div(axis, split);
  plan.split = ceil_div(axis, plan.chunk);
  return plan;
}

// ------------------------------------------------------------ device folds

// This lane's fold of p[0, n) shared among `lanes` lanes (lane < lanes): scalar head
// up to the 16-byte boundary, packs of V (kUnroll in flight, combined as a tree), a
// scalar tail; the V accumulators end combined as a tree.
template <typename In, ReduceOp op, int V, typename A>
__device__ __forceinline__ A lane_fold(const In* p, int64_t n, int lane, int lanes, A identity) {
  using R = Reducer<op>;
  using P = Pack<In, V>;
  A acc[V];
#pragma unroll
  for (int k = 0; k < V; ++k) acc[k] = identity;
  const int64_t head = min(
      n, static_cast<int64_t>(((kVecBytes - (address(p) & (kVecBytes - 1))) & (kVecBytes - 1)) /
                              sizeof(In)));
  for (int64_t i = lane; i < head; i += lanes) acc[0] = R::combine(acc[0], A(to_acc(p[i])));
  const int64_t packs = (n - head) / V;
  const P* pv = reinterpret_cast<const P*>(p + head);
  int64_t i = lane;
  for (; i + (kUnroll - 1) * int64_t{lanes} < packs; i += kUnroll * int64_t{lanes}) {
    P q[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) q[u] = pv[i + u * int64_t{lanes}];
#pragma unroll
    for (int k = 0; k < V; ++k) {
      A t[kUnroll];
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) t[u] = to_acc(q[u].v[k]);
#pragma unroll
      for (int w = kUnroll / 2; w > 0; w /= 2)
#pragma unroll
        for (int u = 0; u < w; ++u) t[u] = R::combine(t[u], t[u + w]);
      acc[k] = R::combine(acc[k], t[0]);
    }
  }
  for (; i < packs; i += lanes) {
    const P q = pv[i];
#pragma unroll
    for (int k = 0; k < V; ++k) acc[k] = R::combine(acc[k], A(to_acc(q.v[k])));
  }
  for (int64_t t = head + packs * V + lane; t < n; t += lanes)
    acc[0] = R::combine(acc[0], A(to_acc(p[t])));
#pragma unroll
  for (int w = V / 2; w > 0; w /= 2)
#pragma unroll
    for (int k = 0; k < w; ++k) acc[k] = R::combine(acc[k], acc[k + w]);
  return acc[0];
}

template <typename A>
struct RowArgs {
  int64_t outer = 0, axis = 0;  // rows and their length (for partials: the chunk count)
  int64_t chunks = 1, chunk_len = 0;
  int group = 32;
  long long count = 0;  // elements reduced into each output (finish's n)
  A identity{};
};

// inner == 1, groups of G = args.group lanes per row: out[r] = finish(fold(x[r, :])).
// In is T, or Acc<T> for the second pass over row-chunk partials.
template <typename In, typename T, ReduceOp op>
__global__ void __launch_bounds__(kThreads)
    row_group_kernel(const In* __restrict__ x, T* __restrict__ out, const RowArgs<Acc<T>> args) {
  using A = Acc<T>;
  using R = Reducer<op>;
  const int lane = threadIdx.x & 31;
  const int g = args.group;
  const int sub = lane / g, glane = lane & (g - 1);
  const int64_t rows_per_warp = 32 / g;
  const int64_t warp = (int64_t{blockIdx.x} * kThreads + threadIdx.x) >> 5;
  const int64_t warps = int64_t{gridDim.x} * (kThreads / 32);
  // Warp-uniform loop: every lane runs every step, so full-mask shuffles are safe.
  for (int64_t r0 = warp * rows_per_warp; r0 < args.outer; r0 += warps * rows_per_warp) {
    const int64_t row = r0 + sub;
    const bool valid = row < args.outer;
    A v = lane_fold<In, op, kMaxVec<In>>(x + (valid ? row : 0) * args.axis,
                                         valid ? args.axis : 0, glane, g, args.identity);
    for (int off = g / 2; off > 0; off >>= 1)
      v = R::combine(v, __shfl_xor_sync(0xffffffffu, v, off));
    if (valid && glane == 0) out[row] = from_acc<T>(R::finish(v, args.count));
  }
}

// inner == 1, a block per (row, chunk): out[r] = finish(fold) when chunks == 1, else
// ws[r * chunks + c] = the chunk's fold.
template <typename T, ReduceOp op>
__global__ void __launch_bounds__(kThreads)
    row_chunk_kernel(const T* __restrict__ x, T* __restrict__ out, Acc<T>* __restrict__ ws,
                     const RowArgs<Acc<T>> args) {
  using A = Acc<T>;
  using R = Reducer<op>;
  using BlockReduce = cub::BlockReduce<A, kThreads>;
  using Temp = typename BlockReduce::TempStorage;
  OXIJAX_SHARED(Temp, temp, , alignof(Temp));
  const int64_t blocks = args.outer * args.chunks;
  for (int64_t b = blockIdx.x; b < blocks; b += gridDim.x) {
    const int64_t row = b / args.chunks, c = b - row * args.chunks;
    const int64_t begin = c * args.chunk_len;
    const int64_t n = min(args.chunk_len, args.axis - begin);
    A v = lane_fold<T, op, kMaxVec<T>>(x + row * args.axis + begin, n, threadIdx.x, kThreads,
                                        args.identity);
    v = BlockReduce(temp).Reduce(v, Combine<op>());
    if (threadIdx.x == 0) {
      if (args.chunks > 1) ws[b] = v;
      else out[row] = from_acc<T>(R::finish(v, args.count));
    }
    __syncthreads();  // temp is reused by the next block
  }
}

template <typename A>
struct ColArgs {
  int64_t axis = 0, inner = 0;  // x is [outer, axis, inner]
  int64_t iv = 1, ncv = 1, tiles = 1;
  int64_t split = 1, chunk = 0;  // axis ranges of `chunk` rows
  int bx = 1, by = 1;
  bool partial = false;  // write ws [outer, split, inner] instead of out
  long long count = 0;
  A identity{};
};

// inner > 1. Virtual block b = (tile, s) covers column vectors [tile * bx, +bx) and
// rows [s * chunk, +chunk); thread (tx, ty) folds rows ty, ty + by, ... of its vector.
template <typename In, typename T, ReduceOp op, int V>
__global__ void __launch_bounds__(kThreads)
    col_kernel(const In* __restrict__ x, T* __restrict__ out, Acc<T>* __restrict__ ws,
               const ColArgs<Acc<T>> args) {
  using A = Acc<T>;
  using R = Reducer<op>;
  using P = Pack<In, V>;
  OXIJAX_SHARED(A, smem, [kThreads * V], alignof(A));
  const int tx = threadIdx.x, ty = threadIdx.y, bx = args.bx, by = args.by;
  const int64_t blocks = args.tiles * args.split;
  for (int64_t b = blockIdx.x; b < blocks; b += gridDim.x) {
    const int64_t tile = b / args.split, s = b - tile * args.split;
    const int64_t cv = tile * bx + tx;
    const bool valid = cv < args.ncv;
    A acc[V];
#pragma unroll
    for (int k = 0; k < V; ++k) acc[k] = args.identity;
    int64_t o = 0, j = 0;
    if (valid) {
      o = cv / args.iv;
      j = cv - o * args.iv;
      const int64_t a0 = s * args.chunk, a1 = min(args.axis, a0 + args.chunk);
      const int64_t stride = int64_t{by} * args.inner;
      const In* p = x + (o * args.axis + a0 + ty) * args.inner + j * V;
      int64_t a = a0 + ty;
      for (; a + (kUnroll - 1) * int64_t{by} < a1; a += kUnroll * int64_t{by}) {
        P q[kUnroll];
#pragma unroll
        for (int u = 0; u < kUnroll; ++u) q[u] = *reinterpret_cast<const P*>(p + u * stride);
        p += kUnroll * stride;
#pragma unroll
        for (int k = 0; k < V; ++k) {
          A t[kUnroll];
#pragma unroll
          for (int u = 0; u < kUnroll; ++u) t[u] = to_acc(q[u].v[k]);
#pragma unroll
          for (int w = kUnroll / 2; w > 0; w /= 2)
#pragma unroll
            for (int u = 0; u < w; ++u) t[u] = R::combine(t[u], t[u + w]);
          acc[k] = R::combine(acc[k], t[0]);
        }
      }
      for (; a < a1; a += by, p += stride) {
        const P q = *reinterpret_cast<const P*>(p);
#pragma unroll
        for (int k = 0; k < V; ++k) acc[k] = R::combine(acc[k], A(to_acc(q.v[k])));
      }
    }
    if (by > 1) {  // tree over ty in shared memory (block-uniform branch)
      A* mine = smem + (ty * bx + tx) * V;
#pragma unroll
      for (int k = 0; k < V; ++k) mine[k] = acc[k];
      __syncthreads();
      for (int h = by / 2; h > 0; h >>= 1) {
        if (ty < h) {
          const A* other = smem + ((ty + h) * bx + tx) * V;
#pragma unroll
          for (int k = 0; k < V; ++k) mine[k] = R::combine(mine[k], other[k]);
        }
        __syncthreads();
      }
#pragma unroll
      for (int k = 0; k < V; ++k) acc[k] = mine[k];
    }
    if (ty == 0 && valid) {
      if (args.partial) {
        A* w = ws + (o * args.split + s) * args.inner + j * V;
#pragma unroll
        for (int k = 0; k < V; ++k) w[k] = acc[k];
      } else {
        T* y = out + o * args.inner + j * V;
#pragma unroll
        for (int k = 0; k < V; ++k) y[k] = from_acc<T>(R::finish(acc[k], args.count));
      }
    }
    __syncthreads();  // smem is reused by the next block
  }
}

template <typename T>
__global__ void __launch_bounds__(kThreads) fill_kernel(T* out, int64_t n, T value) {
  for (int64_t i = int64_t{blockIdx.x} * kThreads + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * kThreads)
    out[i] = value;
}

// ------------------------------------------------------------ launchers

template <typename In, typename T, ReduceOp op>
cudaError_t launch_row_groups(cudaStream_t stream, const In* x, T* out, int64_t outer,
                              int64_t axis, long long count) {
  RowArgs<Acc<T>> args;
  args.outer = outer;
  args.axis = axis;
  args.group = group_for(axis, sizeof(In));
  args.count = count;
  args.identity = identity_of<op, Acc<T>>();
  const int64_t rows_per_block = int64_t{kThreads} / args.group;
  constexpr auto kernel = row_group_kernel<In, T, op>;
  return launch(kernel, wave_grid<kernel>(ceil_div(outer, rows_per_block), 1), kThreads, 0,
                stream, x, out, args);
}

template <typename In, typename T, ReduceOp op, int V>
cudaError_t launch_cols_v(cudaStream_t stream, const In* x, T* out, Acc<T>* ws, int64_t outer,
                          int64_t axis, int64_t inner, const ColPlan& plan, long long count) {
  const ColGeom g = col_geom(outer, axis, inner, V);
  ColArgs<Acc<T>> args;
  args.axis = axis;
  args.inner = inner;
  args.iv = g.iv;
  args.ncv = g.ncv;
  args.tiles = g.tiles;
  args.split = plan.split;
  args.chunk = plan.chunk;
  args.bx = g.bx;
  args.by = g.by;
  args.partial = plan.split > 1;
  args.count = count;
  args.identity = identity_of<op, Acc<T>>();
  constexpr auto kernel = col_kernel<In, T, op, V>;
  return launch(kernel, wave_grid<kernel>(g.tiles * plan.split, 4), dim3(g.bx, g.by), 0, stream,
                x, out, ws, args);
}

// Column reduce of x [outer, axis, inner] with the widest pack that inner and x allow.
template <typename In, typename T, ReduceOp op>
cudaError_t launch_cols(cudaStream_t stream, const In* x, T* out, Acc<T>* ws, int64_t outer,
                        int64_t axis, int64_t inner, const ColPlan& plan, long long count) {
  int v = col_vec(inner, sizeof(In));
  while (v > 1 && address(x) % (v * sizeof(In)) != 0) v /= 2;
  constexpr int VM = kMaxVec<In>;
  if (v == 8) {
    if constexpr (VM >= 8) return launch_cols_v<In, T, op, 8>(stream, x, out, ws, outer, axis, inner, plan, count);
  } else if (v == 4) {
    if constexpr (VM >= 4) return launch_cols_v<In, T, op, 4>(stream, x, out, ws, outer, axis, inner, plan, count);
  } else if (v == 2) {
    if constexpr (VM >= 2) return launch_cols_v<In, T, op, 2>(stream, x, out, ws, outer, axis, inner, plan, count);
  }
  return launch_cols_v<In, T, op, 1>(stream, x, out, ws, outer, axis, inner, plan, count);
}

template <typename T, ReduceOp op>
cudaError_t reduce_op(cudaStream_t stream, const ReduceShape& shape, const T* x, T* out,
                      void* workspace) {
  using A = Acc<T>;
  using R = Reducer<op>;
  const int64_t outer = shape.outer, axis = shape.axis, inner = shape.inner;
  if (outer <= 0 || inner <= 0) return cudaSuccess;
  if (axis <= 0) {
    const int64_t n = outer * inner;
    const T value = store<T>(R::finish(identity_of<op, A>(), 0));
    constexpr auto kernel = fill_kernel<T>;
    return launch(kernel, wave_grid<kernel>(ceil_div(n, kThreads), 1), kThreads, 0, stream, out, n,
                  value);
  }
  A* ws = static_cast<A*>(workspace);
  const long long count = axis;
  if (inner == 1) {
    const RowPlan plan = plan_rows(outer, axis, sizeof(T));
    if (plan.chunks == 0) return launch_row_groups<T, T, op>(stream, x, out, outer, axis, count);
    RowArgs<A> args;
    args.outer = outer;
    args.axis = axis;
    args.chunks = plan.chunks;
    args.chunk_len = plan.chunk_len;
    args.count = count;
    args.identity = identity_of<op, A>();
    constexpr auto kernel = row_chunk_kernel<T, op>;
    if (const cudaError_t status = launch(kernel, wave_grid<kernel>(outer * plan.chunks, 4),
                                          kThreads, 0, stream, x, out, ws, args);
        status != cudaSuccess || plan.chunks <= 1)
      return status;
    return launch_row_groups<A, T, op>(stream, ws, out, outer, plan.chunks, count);
  }
  const ColPlan plan = plan_cols(outer, axis, inner, sizeof(T));
  if (const cudaError_t status =
          launch_cols<T, T, op>(stream, x, out, ws, outer, axis, inner, plan, count);
      status != cudaSuccess || plan.split <= 1)
    return status;
  ColPlan second;  // one pass over the partials, no further split
  second.chunk = plan.split;
  return launch_cols<A, T, op>(stream, ws, out, nullptr, outer, plan.split, inner, second, count);
}

}  // namespace

size_t reduce_workspace_bytes(const ReduceShape& shape, size_t element_bytes) {
  const int64_t outer = shape.outer, axis = shape.axis, inner = shape.inner;
  if (outer <= 0 || inner <= 0 || axis <= 0) return 0;
  if (inner == 1) {
    const RowPlan plan = plan_rows(outer, axis, element_bytes);
    return plan.chunks > 1 ? static_cast<size_t>(outer * plan.chunks) * acc_bytes(element_bytes)
                           : 0;
  }
  const ColPlan plan = plan_cols(outer, axis, inner, element_bytes);
  return plan.split > 1
             ? static_cast<size_t>(outer * plan.split * inner) * acc_bytes(element_bytes)
             : 0;
}

template <typename T>
cudaError_t reduce(cudaStream_t stream, ReduceOp op, const ReduceShape& shape, const T* x,
                   T* out, void* workspace) {
  switch (op) {
    case ReduceOp::SUM: return reduce_op<T, ReduceOp::SUM>(stream, shape, x, out, workspace);
    case ReduceOp::MAX: return reduce_op<T, ReduceOp::MAX>(stream, shape, x, out, workspace);
    case ReduceOp::MIN: return reduce_op<T, ReduceOp::MIN>(stream, shape, x, out, workspace);
    case ReduceOp::MEAN: return reduce_op<T, ReduceOp::MEAN>(stream, shape, x, out, workspace);
  }
  return cudaErrorInvalidValue;
}

#define OXIJAX_INSTANTIATE(T)                                                                   \
  template cudaError_t reduce<T>(cudaStream_t, ReduceOp, const ReduceShape&, const T*, T*, void*);
OXIJAX_INSTANTIATE(oxijax::half)
OXIJAX_INSTANTIATE(oxijax::bfloat16)
OXIJAX_INSTANTIATE(float)
OXIJAX_INSTANTIATE(double)
#undef OXIJAX_INSTANTIATE

}  // namespace oxijax::cuda
