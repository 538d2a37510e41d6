// Validation of every op's buffers and attributes, shared by the CPU and CUDA
// handlers. Each check fills in the problem shape for the kernels, or returns an
// InvalidArgument error that names what is wrong. The Python layer checks the same
// things at trace time; these checks are the second line, for direct ffi_call users.
#pragma once

#include <optional>

#include "common.h"
#include "oxijax/shapes.h"

namespace oxijax::bindings {

ffi::Error check_unary(const ffi::AnyBuffer& x, const ffi::AnyBuffer& y, UnaryOp op, int64_t& count);

ffi::Error check_binary(const ffi::AnyBuffer& a, const ffi::AnyBuffer& b,
                                          const ffi::AnyBuffer& out, BinaryOp op, BroadcastShape& shape);

ffi::Error check_reduce(const ffi::AnyBuffer& x, const ffi::AnyBuffer& out,
                                       ReduceOp op, int64_t axis, ReduceShape& shape);

// Splits gemm's variadic operands into a, b and (when beta != 0) c.
ffi::Error gemm_operands(const ffi::RemainingArgs& operands, std::optional<ffi::AnyBuffer>& a,
                         std::optional<ffi::AnyBuffer>& b, std::optional<ffi::AnyBuffer>& c);

// `c` is absent when beta == 0 (it is then never read).
ffi::Error check_gemm(const ffi::AnyBuffer& a, const ffi::AnyBuffer& b,
                                   const ffi::AnyBuffer* c, const ffi::AnyBuffer& out,
                                   Transpose trans_a, Transpose trans_b, double alpha,
                                   double beta, GemmShape& shape);

ffi::Error check_conv2d(const ffi::AnyBuffer& x, const ffi::AnyBuffer& w,
                                     const ffi::AnyBuffer& out, int64_t stride_h,
                                     int64_t stride_w, int64_t pad_h, int64_t pad_w, ConvShape& s);

ffi::Error check_attention(const ffi::AnyBuffer& q, const ffi::AnyBuffer& k,
                                             const ffi::AnyBuffer& v, const ffi::AnyBuffer& out,
                                             const ffi::AnyBuffer& lse, double scale, bool causal, AttentionShape& s);

// The forward's operands and results (as check_attention), the output's cotangent and
// the gradients dq, dk, dv.
ffi::Error check_attention_backward(const ffi::AnyBuffer& q, const ffi::AnyBuffer& k,
                                    const ffi::AnyBuffer& v, const ffi::AnyBuffer& out,
                                    const ffi::AnyBuffer& lse, const ffi::AnyBuffer& dout,
                                    const ffi::AnyBuffer& dq, const ffi::AnyBuffer& dk,
                                    const ffi::AnyBuffer& dv, double scale, bool causal,
                                    AttentionShape& s);
// The forward's operands and results (as check_attention), the tangents dq, dk, dv and
// the result's tangent dout.
ffi::Error check_attention_jvp(const ffi::AnyBuffer& q, const ffi::AnyBuffer& k,
                               const ffi::AnyBuffer& v, const ffi::AnyBuffer& out,
                               const ffi::AnyBuffer& lse, const ffi::AnyBuffer& dq,
                               const ffi::AnyBuffer& dk, const ffi::AnyBuffer& dv,
                               const ffi::AnyBuffer& dout, double scale, bool causal,
                               AttentionShape& s);
// Backward kernels. unary_grad: x, t and out share one shape.
ffi::Error check_unary_grad(const ffi::AnyBuffer& x, const ffi::AnyBuffer& t,
                            const ffi::AnyBuffer& out, UnaryOp op, int64_t& count);
// binary_partial: op is MAX or MIN; operands broadcast as in binary.
ffi::Error check_binary_partial(const ffi::AnyBuffer& a, const ffi::AnyBuffer& b,
                                const ffi::AnyBuffer& out, BinaryOp op, BroadcastShape& shape);
// conv2d backward: dy [G, N, K, P, Q] must be the forward result of dx (data) or x
// (filter) [G, N, C, H, W] with w or dw [G, K, C, R, S], whose H, W (R, S) are given
// again as attributes; s describes the forward problem.
ffi::Error check_conv2d_backward_data(const ffi::AnyBuffer& dy, const ffi::AnyBuffer& w,
                                      const ffi::AnyBuffer& dx, int64_t stride_h,
                                      int64_t stride_w, int64_t pad_h, int64_t pad_w,
                                      int64_t input_h, int64_t input_w, ConvShape& s);
ffi::Error check_conv2d_backward_filter(const ffi::AnyBuffer& x, const ffi::AnyBuffer& dy,
                                        const ffi::AnyBuffer& dw, int64_t stride_h,
                                        int64_t stride_w, int64_t pad_h, int64_t pad_w,
                                        int64_t filter_h, int64_t filter_w, ConvShape& s);

}  // namespace oxijax::bindings
