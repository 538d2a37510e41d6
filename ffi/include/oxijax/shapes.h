// Problem descriptions passed from the FFI bindings (which validate them) to the
// kernels of either platform. All sizes count elements; all layouts are row-major.
#pragma once

#include <cstdint>
#include <vector>

#include "oxijax/ops.h"  // OXIJAX_HD

namespace oxijax {

// out[..., m, n] = alpha * op(a) @ op(b) + beta * c, for every batch index.
// op(a) is m x k: a is stored [..., m, k], or [..., k, m] when trans_a.
// Batch dims broadcast like jnp.matmul: a stride of 0 repeats a matrix.
// Leading dims (elements between stored rows) default to packed (0); the pointer
// backend sets them for padded matrices. c shares out's layout (c may be out).
struct GemmShape {
  int64_t m = 0, n = 0, k = 0;
  bool trans_a = false, trans_b = false;
  double alpha = 1.0, beta = 0.0;            // beta == 0: c is never read
  std::vector<int64_t> batch_dims;           // the output's batch dims
  std::vector<int64_t> a_batch_strides;      // element offset between a's matrices, per dim
  std::vector<int64_t> b_batch_strides;
  int64_t lda = 0, ldb = 0, ldc = 0;         // 0: packed
  int64_t out_batch_stride = 0;              // between out's (and c's) matrices; 0: m * ldc
  int64_t batch_count() const {
    int64_t count = 1;
    for (int64_t d : batch_dims) count *= d;
    return count;
  }
  int64_t a_ld() const { return lda != 0 ? lda : (trans_a ? m : k); }
  int64_t b_ld() const { return ldb != 0 ? ldb : (trans_b ? k : n); }
  int64_t out_ld() const { return ldc != 0 ? ldc : n; }
  int64_t out_stride() const { return out_batch_stride != 0 ? out_batch_stride : m * out_ld(); }
};

// Cross-correlation over `groups` independent problems:
// x [groups, n, c, h, w] * w [groups, k, c, r, s] -> out [groups, n, k, p, q].
struct ConvShape {
  int64_t groups = 1, n = 0, c = 0, h = 0, w = 0;
  int64_t k = 0, r = 0, s = 0, p = 0, q = 0;
  int64_t stride_h = 1, stride_w = 1, pad_h = 0, pad_w = 0;
};

// Last key index (exclusive) that attention query row i may see: causal attention is
// bottom-right aligned (row i sees key j iff j <= i + (seq_kv - seq_q)). The one
// definition of the mask for the CPU and CUDA kernels.
OXIJAX_HD int64_t attention_key_end(int64_t seq_q, int64_t seq_kv, bool causal, int64_t i) {
  if (!causal) return seq_kv;
  const int64_t end = i + (seq_kv - seq_q) + 1;
  return end < 0 ? 0 : (end > seq_kv ? seq_kv : end);
}

// q [batch, heads, seq_q, head_dim], k/v [batch, heads, seq_kv, head_dim].
// Causal: query i sees key j iff j <= i + (seq_kv - seq_q) (bottom-right aligned).
struct AttentionShape {
  int64_t batch = 0, heads = 0, seq_q = 0, seq_kv = 0, head_dim = 0;
  double scale = 1.0;
  bool causal = false;
  // Last key index (exclusive) that query row i may see.
  int64_t key_end(int64_t i) const { return attention_key_end(seq_q, seq_kv, causal, i); }
};

// Elementwise a (op) b over the output's dims; strides are per output dim, 0 where
// that operand is broadcast.
struct BroadcastShape {
  std::vector<int64_t> dims, a_strides, b_strides;
};

// The same broadcast with size-1 dims dropped and neighbours merged where both operands'
// strides allow it (outermost first), so common cases become one or two dims.
// total == 0: an empty output (dims then left empty); no dims and total 1: a scalar.
struct SimplifiedBroadcast {
  std::vector<int64_t> dims, sa, sb;
  int64_t total = 1;
};

inline SimplifiedBroadcast simplify(const BroadcastShape& shape) {
  SimplifiedBroadcast s;
  for (int64_t d : shape.dims) s.total *= d;
  if (s.total == 0) return s;
  for (size_t d = 0; d < shape.dims.size(); ++d) {
    const int64_t n = shape.dims[d];
    if (n == 1) continue;
    const int64_t sa = shape.a_strides[d], sb = shape.b_strides[d];
    if (!s.dims.empty() && s.sa.back() == sa * n && s.sb.back() == sb * n) {
      s.dims.back() *= n;
      s.sa.back() = sa;
      s.sb.back() = sb;
    } else {
      s.dims.push_back(n);
      s.sa.push_back(sa);
      s.sb.push_back(sb);
    }
  }
  return s;
}

// x viewed as [outer, axis, inner] reduced over its middle dim into out [outer, inner].
struct ReduceShape {
  int64_t outer = 1, axis = 0, inner = 1;
};

}  // namespace oxijax
