#include "checks.h"

#include <cmath>
#include <sstream>
#include <vector>

namespace oxijax::bindings {
namespace {

std::vector<int64_t> dims_of(const ffi::AnyBuffer& buffer) {
  auto dims = buffer.dimensions();
  return std::vector<int64_t>(dims.begin(), dims.end());
}

std::string to_string(const std::vector<int64_t>& dims) {
  std::ostringstream out;
  out << "[";
  for (size_t i = 0; i < dims.size(); ++i) out << (i ? ", " : "") << dims[i];
  out << "]";
  return out.str();
}

// Whether the product of a buffer's non-zero dims fits in int64. XLA accepts shapes
// such as [0, 2^32, 2^32]; the checks multiply subsets of these dims (strides, batch
// and row counts), which is then free of signed overflow.
bool extent_fits(const ffi::AnyBuffer& buffer) {
  int64_t product = 1;
  for (int64_t dim : buffer.dimensions())
    if (dim != 0 && __builtin_mul_overflow(product, dim, &product)) return false;
  return true;
}

// All operands of an op share one floating dtype, and their extents fit in int64.
ffi::Error check_buffers(std::initializer_list<const ffi::AnyBuffer*> buffers) {
  const ffi::DataType dtype = (*buffers.begin())->element_type();
  for (const ffi::AnyBuffer* buffer : buffers) {
    if (buffer->element_type() != dtype) return invalid("operands and result must share one dtype");
    if (!extent_fits(*buffer))
      return invalid("a buffer of shape " + to_string(dims_of(*buffer)) +
                     " has dims whose product overflows int64");
  }
  return dispatch_float(dtype, [](auto) { return ffi::Error::Success(); });
}

ffi::Error expect_dims(const char* what, const ffi::AnyBuffer& buffer,
                       const std::vector<int64_t>& expected) {
  if (dims_of(buffer) == expected) return ffi::Error::Success();
  return invalid(std::string(what) + " has shape " + to_string(dims_of(buffer)) +
                 ", expected " + to_string(expected));
}

constexpr int64_t kMaxConvStep = (int64_t{1} << 31) - 1;  // stride and padding

template <typename Enum>
bool in_range(Enum value, int32_t count) {
  const auto code = static_cast<int32_t>(value);
  return code >= 0 && code < count;
}

}  // namespace

ffi::Error check_unary(const ffi::AnyBuffer& x, const ffi::AnyBuffer& y, UnaryOp op, int64_t& count) {
  if (!in_range(op, kNumUnaryOps)) return invalid("unknown unary op code");
  if (auto err = check_buffers({&x, &y}); err.failure()) return err;
  if (auto err = expect_dims("unary result", y, dims_of(x)); err.failure()) return err;
  count = static_cast<int64_t>(x.element_count());
  return ffi::Error::Success();
}

ffi::Error check_binary(const ffi::AnyBuffer& a, const ffi::AnyBuffer& b,
                                          const ffi::AnyBuffer& out, BinaryOp op, BroadcastShape& shape) {
  if (!in_range(op, kNumBinaryOps)) return invalid("unknown binary op code");
  if (auto err = check_buffers({&a, &b, &out}); err.failure()) return err;
  const auto a_dims = dims_of(a), b_dims = dims_of(b), out_dims = dims_of(out);
  const size_t rank = out_dims.size();
  if (a_dims.size() > rank || b_dims.size() > rank)
    return invalid("binary result rank is smaller than an operand's");
  shape.dims = out_dims;
  shape.a_strides.assign(rank, 0);
  shape.b_strides.assign(rank, 0);
  // Walk from the last dim (NumPy aligns shapes on the right).
  auto strides_for = [&](const std::vector<int64_t>& dims, std::vector<int64_t>& strides,
                         const char* name) -> ffi::Error {
    int64_t stride = 1;
    for (size_t i = 0; i < dims.size(); ++i) {
      const size_t d = dims.size() - 1 - i, o = rank - 1 - i;
      if (dims[d] != out_dims[o] && dims[d] != 1)
        return invalid(std::string("binary operand ") + name + " of shape " + to_string(dims) +
                       " does not broadcast to " + to_string(out_dims));
      strides[o] = dims[d] == 1 ? 0 : stride;
      stride *= dims[d];
    }
    return ffi::Error::Success();
  };
  if (auto err = strides_for(a_dims, shape.a_strides, "a"); err.failure()) return err;
  if (auto err = strides_for(b_dims, shape.b_strides, "b"); err.failure()) return err;
  for (size_t o = 0; o < rank; ++o) {
    const size_t from_end = rank - o;
    const int64_t ad = from_end <= a_dims.size() ? a_dims[a_dims.size() - from_end] : 1;
    const int64_t bd = from_end <= b_dims.size() ? b_dims[b_dims.size() - from_end] : 1;
    const int64_t want = ad == 1 ? bd : ad;
    if (out_dims[o] != want || (ad != 1 && bd != 1 && ad != bd))
      return invalid("binary result shape " + to_string(out_dims) +
                     " is not the broadcast of the operands' shapes");
  }
  return ffi::Error::Success();
}

ffi::Error check_reduce(const ffi::AnyBuffer& x, const ffi::AnyBuffer& out,
                                       ReduceOp op, int64_t axis, ReduceShape& shape) {
  if (!in_range(op, kNumReduceOps)) return invalid("unknown reduce op code");
  if (auto err = check_buffers({&x, &out}); err.failure()) return err;
  auto dims = dims_of(x);
  const int64_t rank = static_cast<int64_t>(dims.size());
  if (rank == 0) return invalid("reduce needs an input of rank >= 1");
  if (axis < 0 || axis >= rank)
    return invalid("reduce axis " + std::to_string(axis) + " is out of range for rank " +
                   std::to_string(rank));
  shape = ReduceShape{};
  for (int64_t d = 0; d < axis; ++d) shape.outer *= dims[d];
  shape.axis = dims[axis];
  for (int64_t d = axis + 1; d < rank; ++d) shape.inner *= dims[d];
  if (shape.axis == 0 && (op == ReduceOp::MAX || op == ReduceOp::MIN) &&
      shape.outer * shape.inner > 0)
    return invalid("max/min over an empty axis has no identity");
  dims.erase(dims.begin() + axis);
  if (auto err = expect_dims("reduce result", out, dims); err.failure()) return err;
  return ffi::Error::Success();
}

ffi::Error gemm_operands(const ffi::RemainingArgs& operands, std::optional<ffi::AnyBuffer>& a,
                         std::optional<ffi::AnyBuffer>& b, std::optional<ffi::AnyBuffer>& c) {
  if (operands.size() != 2 && operands.size() != 3)
    return invalid("gemm takes a, b and optionally c");
  for (size_t i = 0; i < operands.size(); ++i) {
    auto buffer = operands.get<ffi::AnyBuffer>(i);
    if (!buffer) return invalid("gemm operands must be buffers");
    (i == 0 ? a : i == 1 ? b : c) = *buffer;
  }
  return ffi::Error::Success();
}

ffi::Error check_gemm(const ffi::AnyBuffer& a, const ffi::AnyBuffer& b,
                                   const ffi::AnyBuffer* c, const ffi::AnyBuffer& out,
                                   Transpose trans_a, Transpose trans_b, double alpha,
                                   double beta, GemmShape& shape) {
  if (!in_range(trans_a, kNumTranspose) || !in_range(trans_b, kNumTranspose))
    return invalid("unknown transpose code");
  if (!std::isfinite(alpha) || !std::isfinite(beta)) return invalid("alpha and beta must be finite");
  if (beta != 0.0 && c == nullptr) return invalid("gemm with beta != 0 needs c");
  if (auto err = check_buffers({&a, &b, &out}); err.failure()) return err;
  if (c != nullptr && c->element_type() != out.element_type())
    return invalid("gemm c must have the dtype of a and b");
  const auto a_dims = dims_of(a), b_dims = dims_of(b);
  const size_t rank = a_dims.size();
  if (rank < 2 || b_dims.size() != rank)
    return invalid("gemm operands must have the same rank >= 2 (got " + to_string(a_dims) +
                   " and " + to_string(b_dims) + ")");
  shape = GemmShape{};
  shape.trans_a = is_transposed(trans_a);
  shape.trans_b = is_transposed(trans_b);
  shape.alpha = alpha;
  shape.beta = beta;
  shape.m = a_dims[rank - (shape.trans_a ? 1 : 2)];
  shape.k = a_dims[rank - (shape.trans_a ? 2 : 1)];
  const int64_t kb = b_dims[rank - (shape.trans_b ? 1 : 2)];
  shape.n = b_dims[rank - (shape.trans_b ? 2 : 1)];
  if (kb != shape.k)
    return invalid("gemm inner dimensions differ: op(a) is " + std::to_string(shape.m) + "x" +
                   std::to_string(shape.k) + ", op(b) is " + std::to_string(kb) + "x" +
                   std::to_string(shape.n));
  const int64_t batch_rank = static_cast<int64_t>(rank) - 2;
  shape.batch_dims.resize(batch_rank);
  shape.a_batch_strides.resize(batch_rank);
  shape.b_batch_strides.resize(batch_rank);
  int64_t a_stride = shape.m * shape.k, b_stride = shape.k * shape.n;
  for (int64_t d = batch_rank - 1; d >= 0; --d) {
    const int64_t ad = a_dims[d], bd = b_dims[d];
    if (ad != bd && ad != 1 && bd != 1)
      return invalid("gemm batch dims " + to_string(a_dims) + " and " + to_string(b_dims) +
                     " do not broadcast");
    shape.batch_dims[d] = ad == 1 ? bd : ad;
    shape.a_batch_strides[d] = ad == 1 ? 0 : a_stride;
    shape.b_batch_strides[d] = bd == 1 ? 0 : b_stride;
    a_stride *= ad;
    b_stride *= bd;
  }
  std::vector<int64_t> out_dims = shape.batch_dims;
  out_dims.push_back(shape.m);
  out_dims.push_back(shape.n);
  if (auto err = expect_dims("gemm result", out, out_dims); err.failure()) return err;
  if (c != nullptr)
    if (auto err = expect_dims("gemm c", *c, out_dims); err.failure()) return err;
  return ffi::Error::Success();
}

ffi::Error check_conv2d(const ffi::AnyBuffer& x, const ffi::AnyBuffer& w,
                                     const ffi::AnyBuffer& out, int64_t stride_h,
                                     int64_t stride_w, int64_t pad_h, int64_t pad_w, ConvShape& s) {
  if (auto err = check_buffers({&x, &w, &out}); err.failure()) return err;
  const auto x_dims = dims_of(x), w_dims = dims_of(w);
  if (x_dims.size() != 5 || w_dims.size() != 5)
    return invalid("conv2d expects x [G, N, C, H, W] and w [G, K, C, R, S]");
  if (stride_h < 1 || stride_w < 1) return invalid("conv2d stride must be >= 1");
  if (pad_h < 0 || pad_w < 0) return invalid("conv2d padding must be >= 0");
  // Far beyond any real use, and far below the overflow of the kernels' index arithmetic
  // (H + 2 * pad, ceil_div by the stride).
  if (stride_h > kMaxConvStep || stride_w > kMaxConvStep)
    return invalid("conv2d stride must be <= " + std::to_string(kMaxConvStep));
  if (pad_h > kMaxConvStep || pad_w > kMaxConvStep)
    return invalid("conv2d padding must be <= " + std::to_string(kMaxConvStep));
  s = ConvShape{};
  s.groups = x_dims[0];
  s.n = x_dims[1], s.c = x_dims[2], s.h = x_dims[3], s.w = x_dims[4];
  s.k = w_dims[1], s.r = w_dims[3], s.s = w_dims[4];
  s.stride_h = stride_h, s.stride_w = stride_w, s.pad_h = pad_h, s.pad_w = pad_w;
  if (w_dims[0] != s.groups) return invalid("conv2d x and w have different group counts");
  if (w_dims[2] != s.c)
    return invalid("conv2d channels differ: x has " + std::to_string(s.c) + ", w has " +
                   std::to_string(w_dims[2]));
  if (s.h + 2 * pad_h < s.r || s.w + 2 * pad_w < s.s)
    return invalid("conv2d filter is larger than the padded input");
  s.p = (s.h + 2 * pad_h - s.r) / stride_h + 1;
  s.q = (s.w + 2 * pad_w - s.s) / stride_w + 1;
  if (auto err = expect_dims("conv2d result", out, {s.groups, s.n, s.k, s.p, s.q}); err.failure())
    return err;
  return ffi::Error::Success();
}

ffi::Error check_attention(const ffi::AnyBuffer& q, const ffi::AnyBuffer& k,
                                             const ffi::AnyBuffer& v, const ffi::AnyBuffer& out,
                                             const ffi::AnyBuffer& lse, double scale, bool causal, AttentionShape& s) {
  if (auto err = check_buffers({&q, &k, &v, &out}); err.failure()) return err;
  const auto acc_dtype =
      q.element_type() == ffi::DataType::F64 ? ffi::DataType::F64 : ffi::DataType::F32;
  if (lse.element_type() != acc_dtype)
    return invalid("attention log-sum-exp must be float64 for float64 inputs, else float32");
  if (!(scale > 0.0) || !std::isfinite(scale)) return invalid("attention scale must be positive and finite");
  const auto q_dims = dims_of(q), k_dims = dims_of(k);
  if (q_dims.size() != 4 || k_dims.size() != 4)
    return invalid("attention expects q [B, H, Sq, D] and k, v [B, H, Skv, D]");
  s = AttentionShape{};
  s.batch = q_dims[0], s.heads = q_dims[1], s.seq_q = q_dims[2], s.head_dim = q_dims[3];
  s.seq_kv = k_dims[2];
  s.scale = scale;
  s.causal = causal;
  if (k_dims[0] != s.batch || k_dims[1] != s.heads || k_dims[3] != s.head_dim)
    return invalid("attention k of shape " + to_string(k_dims) + " does not match q " +
                   to_string(q_dims));
  if (auto err = expect_dims("attention v", v, k_dims); err.failure()) return err;
  if (auto err = expect_dims("attention result", out, q_dims); err.failure()) return err;
  if (auto err = expect_dims("attention log-sum-exp", lse, {s.batch, s.heads, s.seq_q});
      err.failure())
    return err;
  return ffi::Error::Success();
}

ffi::Error check_attention_backward(const ffi::AnyBuffer& q, const ffi::AnyBuffer& k,
                                    const ffi::AnyBuffer& v, const ffi::AnyBuffer& out,
                                    const ffi::AnyBuffer& lse, const ffi::AnyBuffer& dout,
                                    const ffi::AnyBuffer& dq, const ffi::AnyBuffer& dk,
                                    const ffi::AnyBuffer& dv, double scale, bool causal,
                                    AttentionShape& s) {
  if (auto err = check_attention(q, k, v, out, lse, scale, causal, s); err.failure()) return err;
  if (auto err = check_buffers({&q, &dout, &dq, &dk, &dv}); err.failure()) return err;
  const auto q_dims = dims_of(q), k_dims = dims_of(k);
  if (auto err = expect_dims("attention output cotangent", dout, q_dims); err.failure()) return err;
  if (auto err = expect_dims("attention dq", dq, q_dims); err.failure()) return err;
  if (auto err = expect_dims("attention dk", dk, k_dims); err.failure()) return err;
  return expect_dims("attention dv", dv, k_dims);
}

ffi::Error check_attention_jvp(const ffi::AnyBuffer& q, const ffi::AnyBuffer& k,
                               const ffi::AnyBuffer& v, const ffi::AnyBuffer& out,
                               const ffi::AnyBuffer& lse, const ffi::AnyBuffer& dq,
                               const ffi::AnyBuffer& dk, const ffi::AnyBuffer& dv,
                               const ffi::AnyBuffer& dout, double scale, bool causal,
                               AttentionShape& s) {
  if (auto err = check_attention(q, k, v, out, lse, scale, causal, s); err.failure()) return err;
  if (auto err = check_buffers({&q, &dq, &dk, &dv, &dout}); err.failure()) return err;
  const auto q_dims = dims_of(q), k_dims = dims_of(k);
  if (auto err = expect_dims("attention tangent dq", dq, q_dims); err.failure()) return err;
  if (auto err = expect_dims("attention tangent dk", dk, k_dims); err.failure()) return err;
  if (auto err = expect_dims("attention tangent dv", dv, k_dims); err.failure()) return err;
  return expect_dims("attention result tangent", dout, q_dims);
}

// ---------------------------------------------------------------- backward kernels

ffi::Error check_unary_grad(const ffi::AnyBuffer& x, const ffi::AnyBuffer& t,
                            const ffi::AnyBuffer& out, UnaryOp op, int64_t& count) {
  if (!in_range(op, kNumUnaryOps)) return invalid("unknown unary op code");
  if (auto err = check_buffers({&x, &t, &out}); err.failure()) return err;
  if (auto err = expect_dims("unary_grad tangent", t, dims_of(x)); err.failure()) return err;
  if (auto err = expect_dims("unary_grad result", out, dims_of(x)); err.failure()) return err;
  count = static_cast<int64_t>(x.element_count());
  return ffi::Error::Success();
}

ffi::Error check_binary_partial(const ffi::AnyBuffer& a, const ffi::AnyBuffer& b,
                                const ffi::AnyBuffer& out, BinaryOp op, BroadcastShape& shape) {
  if (op != BinaryOp::MAX && op != BinaryOp::MIN)
    return invalid("binary_partial is defined for max and min only");
  return check_binary(a, b, out, op, shape);
}

// The backward passes are checked as the forward problem they belong to: dy must be
// what conv2d makes of (dx or x) and (w or dw).
ffi::Error check_conv2d_backward_data(const ffi::AnyBuffer& dy, const ffi::AnyBuffer& w,
                                      const ffi::AnyBuffer& dx, int64_t stride_h,
                                      int64_t stride_w, int64_t pad_h, int64_t pad_w,
                                      int64_t input_h, int64_t input_w, ConvShape& s) {
  if (auto err = check_conv2d(dx, w, dy, stride_h, stride_w, pad_h, pad_w, s); err.failure())
    return err;
  if (s.h != input_h || s.w != input_w)
    return invalid("conv2d backward_data result is " + std::to_string(s.h) + "x" +
                   std::to_string(s.w) + ", expected input_h x input_w " +
                   std::to_string(input_h) + "x" + std::to_string(input_w));
  return ffi::Error::Success();
}

ffi::Error check_conv2d_backward_filter(const ffi::AnyBuffer& x, const ffi::AnyBuffer& dy,
                                        const ffi::AnyBuffer& dw, int64_t stride_h,
                                        int64_t stride_w, int64_t pad_h, int64_t pad_w,
                                        int64_t filter_h, int64_t filter_w, ConvShape& s) {
  if (auto err = check_conv2d(x, dw, dy, stride_h, stride_w, pad_h, pad_w, s); err.failure())
    return err;
  if (s.r != filter_h || s.s != filter_w)
    return invalid("conv2d backward_filter result is " + std::to_string(s.r) + "x" +
                   std::to_string(s.s) + ", expected filter_h x filter_w " +
                   std::to_string(filter_h) + "x" + std::to_string(filter_w));
  return ffi::Error::Success();
}

}  // namespace oxijax::bindings
