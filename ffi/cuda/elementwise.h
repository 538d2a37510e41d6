// The elementwise kernels and their launchers, shared by elementwise_kernels.cu (the
// forward ops) and elementwise_grad_kernels.cu (the backward functors, as binary ops):
// two translation units, so that the build compiles their many instantiations in
// parallel. Everything is internal to the unit that includes it.
//
// The kernels: unary ops over a contiguous array, and binary ops with NumPy broadcasting
// by strides (a broadcast operand is never materialised).
//
// * Every kernel is a grid-stride loop over "items" of V consecutive outputs: V = 16 /
//   sizeof(T) (one 128-bit load or store) where the pointers allow it, else fewer (down
//   to 1). Each thread loads kUnroll items before it computes, so several loads are in
//   flight per thread; a grid is at most one wave of resident blocks. Packs are kept in
//   their storage type until the math, which runs in Acc<T> (oxijax/math.h functors).
// * The op is chosen by a switch on the host: kernels are templates over the functor,
//   so no loop carries a switch.
// * unary, and binary whose simplified shape is one dim with operand strides in {0, 1}
//   (same shape, one operand a scalar, or both): a scalar head up to out's 16-byte
//   boundary, a 128-bit body and a scalar tail. The body is vectorised when every
//   contiguous operand has out's address modulo 16 (XLA's buffers all are 16-byte
//   aligned); otherwise the whole run is scalar.
// * binary, general: BroadcastShape is simplified on the host (size-1 dims dropped,
//   adjacent dims merged where both operands' strides allow it). The merged dims, at
//   most kMaxDims, travel by value in the kernel parameters with precomputed
//   magic-number dividers (32-bit index math when every index and offset fits in 31
//   bits, else 64-bit). When the innermost merged dim is a multiple of V and each
//   operand is contiguous (stride 1: vector loads) or broadcast (stride 0: one scalar
//   load) along it, an item is V outputs of one row; otherwise V = 1, any strides.
//   A shape with more than kMaxDims dims after merging (NumPy-style broadcasting needs
//   at least 9 alternating broadcast / non-broadcast dims to get there) runs as one
//   launch over the innermost kMaxDims dims per index of the outer ones.
//
// Launchers only enqueue; they return cudaSuccess without launching for empty arrays,
// else the status of the launch (the first failing one where there are several).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <type_traits>
#include <vector>

#include "convert.h"
#include "divider.h"
#include "kernels.h"
#include "launch.h"
#include "oxijax/math.h"

namespace oxijax::cuda {
namespace {

constexpr int kThreads = 256;  // threads per block
constexpr int kUnroll = 4;     // items per thread per grid-stride step
constexpr int kMaxDims = 8;    // merged dims of a general broadcast

inline uintptr_t address(const void* p) { return reinterpret_cast<uintptr_t>(p); }

// ------------------------------------------------------------ launch geometry


// Blocks for `items` items: enough to cover them once, at most one wave.
unsigned grid_for(int64_t items, int blocks_per_sm) {
  const int64_t per_block = int64_t{kThreads} * kUnroll;
  const int64_t want = (items + per_block - 1) / per_block;
  const int64_t cap = int64_t{sm_count()} * blocks_per_sm;
  return static_cast<unsigned>(std::max<int64_t>(1, std::min(want, cap)));
}

// ------------------------------------------------------------ unary

// y[i] = f(x[i]) for i < n: x + head is aligned to V * sizeof(T) (head < V); the
// body runs in packs, head and tail elements one per thread.
template <typename T, typename F, int V>
__global__ void __launch_bounds__(kThreads)
    unary_kernel(const T* x, T* y, int64_t n, int64_t head) {
  using P = Pack<T, V>;
  const F f;
  const int64_t body = (n - head) / V;
  const P* xv = reinterpret_cast<const P*>(x + head);
  P* yv = reinterpret_cast<P*>(y + head);
  const int64_t step = int64_t{gridDim.x} * kThreads * kUnroll;
  for (int64_t base = int64_t{blockIdx.x} * kThreads * kUnroll + threadIdx.x; base < body;
       base += step) {
    P p[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int64_t i = base + u * kThreads;
      if (i < body) p[u] = xv[i];
    }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int64_t i = base + u * kThreads;
      if (i < body) {
        P r;
#pragma unroll
        for (int k = 0; k < V; ++k) r.v[k] = from_acc<T>(f(to_acc(p[u].v[k])));
        yv[i] = r;
      }
    }
  }
  if (V > 1) {
    const int64_t t = int64_t{blockIdx.x} * kThreads + threadIdx.x;
    const int64_t tail_start = head + body * V;
    if (t < head) y[t] = from_acc<T>(f(to_acc(x[t])));
    if (t < n - tail_start) y[tail_start + t] = from_acc<T>(f(to_acc(x[tail_start + t])));
  }
}

template <typename T, UnaryOp op>
cudaError_t unary_op(cudaStream_t stream, const T* x, T* y, int64_t n) {
  using F = Unary<op>;
  constexpr int VM = kMaxVec<T>;
  const uintptr_t mis = address(y) % kVecBytes;
  const bool vec = address(y) % sizeof(T) == 0 && address(x) % kVecBytes == mis;
  if (vec) {
    const int64_t head = std::min<int64_t>(n, (kVecBytes - mis) % kVecBytes / sizeof(T));
    constexpr auto kernel = unary_kernel<T, F, VM>;
    const unsigned grid = grid_for((n - head) / VM, resident_blocks<kernel, kThreads>());
    return launch(kernel, grid, kThreads, 0, stream, x, y, n, head);
  }
  constexpr auto kernel = unary_kernel<T, F, 1>;
  const unsigned grid = grid_for(n, resident_blocks<kernel, kThreads>());
  return launch(kernel, grid, kThreads, 0, stream, x, y, n, int64_t{0});
}

// ------------------------------------------------------------ binary, one dim

// out[i] = f(a[i or 0], b[i or 0]) for i < n; a (b) is a single element when AS (BS).
// Layout as unary_kernel: out + head and the contiguous operands + head are aligned.
template <typename T, typename F, int V, bool AS, bool BS>
__global__ void __launch_bounds__(kThreads)
    binary_flat_kernel(const T* a, const T* b, T* out, int64_t n, int64_t head) {
  using P = Pack<T, V>;
  const F f;
  T a0{}, b0{};
  if (AS) a0 = a[0];
  if (BS) b0 = b[0];
  const int64_t body = (n - head) / V;
  const P* av = reinterpret_cast<const P*>(a + head);
  const P* bv = reinterpret_cast<const P*>(b + head);
  P* ov = reinterpret_cast<P*>(out + head);
  const int64_t step = int64_t{gridDim.x} * kThreads * kUnroll;
  for (int64_t base = int64_t{blockIdx.x} * kThreads * kUnroll + threadIdx.x; base < body;
       base += step) {
    P pa[kUnroll], pb[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int64_t i = base + u * kThreads;
      if (i < body) {
        if (!AS) pa[u] = av[i];
        if (!BS) pb[u] = bv[i];
      }
    }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int64_t i = base + u * kThreads;
      if (i < body) {
        P r;
#pragma unroll
        for (int k = 0; k < V; ++k)
          r.v[k] = from_acc<T>(f(to_acc(AS ? a0 : pa[u].v[k]), to_acc(BS ? b0 : pb[u].v[k])));
        ov[i] = r;
      }
    }
  }
  if (V > 1) {
    const int64_t t = int64_t{blockIdx.x} * kThreads + threadIdx.x;
    const int64_t tail_start = head + body * V;
    if (t < head)
      out[t] = from_acc<T>(f(to_acc(AS ? a0 : a[t]), to_acc(BS ? b0 : b[t])));
    if (t < n - tail_start) {
      const int64_t i = tail_start + t;
      out[i] = from_acc<T>(f(to_acc(AS ? a0 : a[i]), to_acc(BS ? b0 : b[i])));
    }
  }
}

template <typename T, typename F, bool AS, bool BS>
cudaError_t launch_flat(cudaStream_t stream, const T* a, const T* b, T* out, int64_t n) {
  constexpr int VM = kMaxVec<T>;
  const uintptr_t mis = address(out) % kVecBytes;
  const bool vec = address(out) % sizeof(T) == 0 && (AS || address(a) % kVecBytes == mis) &&
                   (BS || address(b) % kVecBytes == mis);
  if (vec) {
    const int64_t head = std::min<int64_t>(n, (kVecBytes - mis) % kVecBytes / sizeof(T));
    constexpr auto kernel = binary_flat_kernel<T, F, VM, AS, BS>;
    const unsigned grid = grid_for((n - head) / VM, resident_blocks<kernel, kThreads>());
    return launch(kernel, grid, kThreads, 0, stream, a, b, out, n, head);
  }
  constexpr auto kernel = binary_flat_kernel<T, F, 1, AS, BS>;
  const unsigned grid = grid_for(n, resident_blocks<kernel, kThreads>());
  return launch(kernel, grid, kThreads, 0, stream, a, b, out, n, int64_t{0});
}

// ------------------------------------------------------------ binary, general

// A simplified broadcast over `items` items, dims innermost first: dim 0 counts the
// items of a row (inner / V), its strides are per item (V * the element stride).
// The outermost dim (rank - 1) needs no divider. Strides are element offsets; with
// I = uint64_t they may be negative (two's complement), with uint32_t they are not.
template <typename I>
struct General {
  int rank = 0;
  I items = 0;
  Divider<I> div[kMaxDims];
  I sa[kMaxDims] = {}, sb[kMaxDims] = {};
};

template <typename I>
__host__ __device__ __forceinline__ void offsets(const General<I>& g, I item, I& oa, I& ob) {
  I rest = item;
  oa = 0;
  ob = 0;
#if defined(__CUDA_ARCH__)  // (host compilers warn about the pragma)
#pragma unroll
#endif
  for (int k = 0; k < kMaxDims; ++k) {
    if (k + 1 == g.rank) {
      oa += rest * g.sa[k];
      ob += rest * g.sb[k];
      break;
    }
    const I q = g.div[k].div(rest);
    const I r = rest - q * g.div[k].d;
    oa += r * g.sa[k];
    ob += r * g.sb[k];
    rest = q;
  }
}

// out[item * V + k] = f(a[oa + k or oa], b[ob + k or ob]), k < V: AV (BV) loads V
// contiguous elements of a (b), otherwise one element, used V times.
template <typename T, typename F, int V, typename I, bool AV, bool BV>
__global__ void __launch_bounds__(kThreads)
    binary_general_kernel(const General<I> g, const T* a, const T* b, T* out) {
  using P = Pack<T, V>;
  using S = std::make_signed_t<I>;
  using PA = std::conditional_t<AV, P, T>;
  using PB = std::conditional_t<BV, P, T>;
  const F f;
  const I step = static_cast<I>(gridDim.x) * (kThreads * kUnroll);
  for (I base = static_cast<I>(blockIdx.x) * (kThreads * kUnroll) + threadIdx.x; base < g.items;
       base += step) {
    PA pa[kUnroll];
    PB pb[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const I i = base + u * kThreads;
      if (i < g.items) {
        I oa, ob;
        offsets(g, i, oa, ob);
        pa[u] = *reinterpret_cast<const PA*>(a + static_cast<S>(oa));
        pb[u] = *reinterpret_cast<const PB*>(b + static_cast<S>(ob));
      }
    }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const I i = base + u * kThreads;
      if (i < g.items) {
        P r;
        if constexpr (AV && BV) {
#pragma unroll
          for (int k = 0; k < V; ++k) r.v[k] = from_acc<T>(f(to_acc(pa[u].v[k]), to_acc(pb[u].v[k])));
        } else if constexpr (AV) {
          const auto y = to_acc(pb[u]);
#pragma unroll
          for (int k = 0; k < V; ++k) r.v[k] = from_acc<T>(f(to_acc(pa[u].v[k]), y));
        } else if constexpr (BV) {
          const auto x = to_acc(pa[u]);
#pragma unroll
          for (int k = 0; k < V; ++k) r.v[k] = from_acc<T>(f(x, to_acc(pb[u].v[k])));
        } else {
          const T v = from_acc<T>(f(to_acc(pa[u]), to_acc(pb[u])));
#pragma unroll
          for (int k = 0; k < V; ++k) r.v[k] = v;
        }
        reinterpret_cast<P*>(out)[i] = r;
      }
    }
  }
}

template <typename I>
General<I> make_general(const SimplifiedBroadcast& s, int v) {
  General<I> g;
  const int rank = static_cast<int>(s.dims.size());
  g.rank = rank;
  g.items = static_cast<I>(s.total / v);
  for (int k = 0; k < rank; ++k) {
    const int d = rank - 1 - k;
    const int64_t n = k == 0 ? s.dims[d] / v : s.dims[d];
    const int64_t scale = k == 0 ? v : 1;
    if (k + 1 < rank) g.div[k] = Divider<I>::make(static_cast<I>(n));
    g.sa[k] = static_cast<I>(s.sa[d] * scale);
    g.sb[k] = static_cast<I>(s.sb[d] * scale);
  }
  return g;
}

// Whether items of v outputs work: the innermost dim splits into whole items, out is
// aligned for them and each operand is broadcast along it (stride 0) or contiguous
// (stride 1, aligned, and every outer stride a multiple of v, so every row is aligned).
template <typename T>
bool vector_fits(const SimplifiedBroadcast& s, int v, const T* a, const T* b, const T* out) {
  const size_t rank = s.dims.size();
  const uintptr_t bytes = static_cast<uintptr_t>(v) * sizeof(T);
  if (s.dims[rank - 1] % v != 0 || address(out) % bytes != 0) return false;
  auto operand_fits = [&](const T* p, const std::vector<int64_t>& strides) {
    if (strides[rank - 1] == 0) return true;
    if (strides[rank - 1] != 1 || address(p) % bytes != 0) return false;
    for (size_t d = 0; d + 1 < rank; ++d)
      if (strides[d] % v != 0) return false;
    return true;
  };
  return operand_fits(a, s.sa) && operand_fits(b, s.sb);
}

template <typename T, typename F, int V, typename I>
cudaError_t launch_general_v(cudaStream_t stream, const SimplifiedBroadcast& s, const T* a,
                             const T* b, T* out) {
  const General<I> g = make_general<I>(s, V);
  const int64_t items = static_cast<int64_t>(g.items);
  const size_t rank = s.dims.size();
  if constexpr (V == 1) {
    constexpr auto kernel = binary_general_kernel<T, F, 1, I, false, false>;
    return launch(kernel, grid_for(items, resident_blocks<kernel, kThreads>()), kThreads, 0,
                  stream, g, a, b, out);
  } else {
    const bool av = s.sa[rank - 1] == 1, bv = s.sb[rank - 1] == 1;
    if (av && bv) {
      constexpr auto kernel = binary_general_kernel<T, F, V, I, true, true>;
      return launch(kernel, grid_for(items, resident_blocks<kernel, kThreads>()), kThreads, 0,
                    stream, g, a, b, out);
    } else if (av) {
      constexpr auto kernel = binary_general_kernel<T, F, V, I, true, false>;
      return launch(kernel, grid_for(items, resident_blocks<kernel, kThreads>()), kThreads, 0,
                    stream, g, a, b, out);
    } else if (bv) {
      constexpr auto kernel = binary_general_kernel<T, F, V, I, false, true>;
      return launch(kernel, grid_for(items, resident_blocks<kernel, kThreads>()), kThreads, 0,
                    stream, g, a, b, out);
    } else {
      constexpr auto kernel = binary_general_kernel<T, F, V, I, false, false>;
      return launch(kernel, grid_for(items, resident_blocks<kernel, kThreads>()), kThreads, 0,
                    stream, g, a, b, out);
    }
  }
}

// Largest offset reachable through `strides`, or -1 when a stride is negative.
int64_t max_offset(const SimplifiedBroadcast& s, const std::vector<int64_t>& strides) {
  int64_t m = 0;
  for (size_t d = 0; d < s.dims.size(); ++d) {
    if (strides[d] < 0) return -1;
    m += (s.dims[d] - 1) * strides[d];
  }
  return m;
}

template <typename T, typename F>
cudaError_t launch_general(cudaStream_t stream, const SimplifiedBroadcast& s, const T* a,
                           const T* b, T* out) {
  constexpr int VM = kMaxVec<T>;
  constexpr int64_t kLimit32 = int64_t{1} << 31;
  const int64_t ma = max_offset(s, s.sa), mb = max_offset(s, s.sb);
  const bool small = s.total < kLimit32 && ma >= 0 && ma < kLimit32 && mb >= 0 && mb < kLimit32;
  if (small) {
    if (vector_fits(s, VM, a, b, out))
      return launch_general_v<T, F, VM, uint32_t>(stream, s, a, b, out);
    if constexpr (VM / 2 > 1) {
      if (vector_fits(s, VM / 2, a, b, out))
        return launch_general_v<T, F, VM / 2, uint32_t>(stream, s, a, b, out);
    }
    return launch_general_v<T, F, 1, uint32_t>(stream, s, a, b, out);
  }
  if (vector_fits(s, VM, a, b, out))
    return launch_general_v<T, F, VM, uint64_t>(stream, s, a, b, out);
  return launch_general_v<T, F, 1, uint64_t>(stream, s, a, b, out);
}

// More merged dims than a kernel's parameters carry: one launch of the innermost
// kMaxDims dims per index of the outer dims (rare; see the header comment).
template <typename T, typename F>
cudaError_t launch_outer_loop(cudaStream_t stream, const SimplifiedBroadcast& s, const T* a,
                              const T* b, T* out) {
  const size_t outer_rank = s.dims.size() - kMaxDims;
  SimplifiedBroadcast inner;
  inner.dims.assign(s.dims.begin() + outer_rank, s.dims.end());
  inner.sa.assign(s.sa.begin() + outer_rank, s.sa.end());
  inner.sb.assign(s.sb.begin() + outer_rank, s.sb.end());
  for (int64_t d : inner.dims) inner.total *= d;
  const int64_t outer_count = s.total / inner.total;
  for (int64_t o = 0; o < outer_count; ++o) {
    int64_t rest = o, oa = 0, ob = 0;
    for (size_t d = outer_rank; d-- > 0;) {  // innermost outer dim first
      const int64_t i = rest % s.dims[d];
      rest /= s.dims[d];
      oa += i * s.sa[d];
      ob += i * s.sb[d];
    }
    if (const cudaError_t status =
            launch_general<T, F>(stream, inner, a + oa, b + ob, out + o * inner.total);
        status != cudaSuccess)
      return status;
  }
  return cudaSuccess;
}

// out = F(a, b) with broadcasting, for any two-operand functor of oxijax/math.h.
template <typename T, typename F>
cudaError_t binary_with(cudaStream_t stream, const BroadcastShape& shape, const T* a, const T* b,
                        T* out) {
  const SimplifiedBroadcast s = simplify(shape);
  if (s.total <= 0) return cudaSuccess;
  const size_t rank = s.dims.size();
  if (rank == 0)  // every dim is 1: one element
    return launch_flat<T, F, true, true>(stream, a, b, out, 1);
  if (rank == 1) {
    const int64_t sa = s.sa[0], sb = s.sb[0];
    if (sa == 1 && sb == 1)
      return launch_flat<T, F, false, false>(stream, a, b, out, s.total);
    if (sa == 0 && sb == 1)
      return launch_flat<T, F, true, false>(stream, a, b, out, s.total);
    if (sa == 1 && sb == 0)
      return launch_flat<T, F, false, true>(stream, a, b, out, s.total);
    if (sa == 0 && sb == 0)
      return launch_flat<T, F, true, true>(stream, a, b, out, s.total);
  }
  if (rank > static_cast<size_t>(kMaxDims)) return launch_outer_loop<T, F>(stream, s, a, b, out);
  return launch_general<T, F>(stream, s, a, b, out);
}

}  // namespace

}  // namespace oxijax::cuda
