#include "problems.h"

#include <cmath>
#include <string>

namespace oxijax::backend {
namespace {

void require(bool ok, const char* what) {
  if (!ok) throw std::invalid_argument(std::string("oxijax backend: ") + what);
}

}  // namespace

GemmShape gemm_shape(const GemmProblem& p) {
  require(p.m > 0 && p.n > 0 && p.k > 0, "gemm needs m, n, k > 0");
  require(p.batch >= 0, "gemm needs batch >= 0");
  require(p.lda >= (p.trans_a ? p.m : p.k), "lda is smaller than a's stored row");
  require(p.ldb >= (p.trans_b ? p.k : p.n), "ldb is smaller than b's stored row");
  require(p.ldc >= p.n, "ldc is smaller than c's stored row");
  require(p.stride_a >= 0 && p.stride_b >= 0 && p.stride_c >= 0, "negative batch stride");
  require(p.batch <= 1 || p.stride_c >= p.m * p.ldc, "c's matrices overlap");
  GemmShape s;
  s.m = p.m, s.n = p.n, s.k = p.k;
  s.trans_a = p.trans_a, s.trans_b = p.trans_b;
  s.alpha = p.alpha, s.beta = p.beta;
  s.batch_dims = {p.batch};
  s.a_batch_strides = {p.stride_a};
  s.b_batch_strides = {p.stride_b};
  s.lda = p.lda, s.ldb = p.ldb, s.ldc = p.ldc;
  s.out_batch_stride = p.batch > 1 ? p.stride_c : p.m * p.ldc;
  return s;
}

ConvShape conv_shape(const std::vector<int64_t>& input, const std::vector<int64_t>& filter,
                     const std::vector<int64_t>& output, const std::vector<int64_t>& stride,
                     const std::vector<int64_t>& padding) {
  require(input.size() == 4 && filter.size() == 4 && output.size() == 4,
          "conv2d shapes must have 4 elements");
  require(stride.size() == 2 && padding.size() == 2, "conv2d stride/padding need 2 elements");
  ConvShape s;
  s.n = input[0], s.c = input[1], s.h = input[2], s.w = input[3];
  s.k = filter[0], s.r = filter[2], s.s = filter[3];
  s.stride_h = stride[0], s.stride_w = stride[1], s.pad_h = padding[0], s.pad_w = padding[1];
  require(filter[1] == s.c && output[0] == s.n && output[1] == s.k, "conv2d shapes disagree");
  require(s.n >= 0 && s.c > 0 && s.k > 0 && s.r > 0 && s.s > 0 && s.h >= 0 && s.w >= 0,
          "conv2d dims out of range");
  require(s.stride_h > 0 && s.stride_w > 0 && s.pad_h >= 0 && s.pad_w >= 0,
          "conv2d stride/padding out of range");
  require(s.h + 2 * s.pad_h >= s.r && s.w + 2 * s.pad_w >= s.s, "conv2d filter exceeds input");
  s.p = (s.h + 2 * s.pad_h - s.r) / s.stride_h + 1;
  s.q = (s.w + 2 * s.pad_w - s.s) / s.stride_w + 1;
  require(output[2] == s.p && output[3] == s.q, "conv2d output shape disagrees");
  return s;
}

AttentionShape attention_shape(int64_t batch, int64_t heads, int64_t seq_q, int64_t seq_kv,
                               int64_t head_dim, double scale, bool causal) {
  require(batch > 0 && heads > 0 && seq_q > 0 && seq_kv > 0 && head_dim > 0,
          "attention dims must be > 0");
  require(scale > 0 && std::isfinite(scale), "attention scale must be positive and finite");
  AttentionShape s;
  s.batch = batch, s.heads = heads, s.seq_q = seq_q, s.seq_kv = seq_kv, s.head_dim = head_dim;
  s.scale = scale, s.causal = causal;
  return s;
}

ReduceShape reduce_shape(int64_t outer, int64_t axis, int64_t inner) {
  require(outer >= 0 && axis >= 0 && inner >= 0, "reduce dims must be >= 0");
  ReduceShape s;
  s.outer = outer, s.axis = axis, s.inner = inner;
  return s;
}

BroadcastShape flat_shape(int64_t n) {
  require(n >= 0, "n must be >= 0");
  BroadcastShape s;
  s.dims = {n};
  s.a_strides = {1};
  s.b_strides = {1};
  return s;
}

}  // namespace oxijax::backend
