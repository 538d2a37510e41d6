// The CPU kernels. Each is a template over the element type T in {half, bfloat16,
// float, double}, explicitly instantiated in its own file, and computes in Acc<T>.
// Shapes arrive validated (see ffi/bindings/checks.h); kernels trust them.
#pragma once

#include <cstdint>

#include "oxijax/numeric.h"
#include "oxijax/ops.h"
#include "oxijax/shapes.h"
#include "parallel.h"

namespace oxijax::cpu {

template <typename T>
void unary(const Parallel& par, UnaryOp op, const T* x, T* y, int64_t n);

template <typename T>
void binary(const Parallel& par, BinaryOp op, const BroadcastShape& shape,
            const T* a, const T* b, T* out);

// Backward of unary: out = t * f'(x), all of n elements.
template <typename T>
void unary_grad(const Parallel& par, UnaryOp op, const T* x, const T* t, T* out, int64_t n);

// d op(a, b) / da for op MAX or MIN (1, 1/2 on ties, 0), broadcast like binary.
template <typename T>
void binary_partial(const Parallel& par, BinaryOp op, const BroadcastShape& shape,
                    const T* a, const T* b, T* out);

template <typename T>
void reduce(const Parallel& par, ReduceOp op, const ReduceShape& shape, const T* x, T* out);

// c may be null when shape.beta == 0. c and out have the output's shape.
template <typename T>
void gemm(const Parallel& par, const GemmShape& shape, const T* a, const T* b,
          const T* c, T* out);

template <typename T>
void conv2d(const Parallel& par, const ConvShape& shape, const T* x, const T* w, T* out);

// lse [batch, heads, seq_q] receives each row's log-sum-exp of the scaled scores
// (-inf for a fully masked row), for the backward pass.
template <typename T>
void attention(const Parallel& par, const AttentionShape& shape, const T* q, const T* k,
               const T* v, T* out, Acc<T>* lse);

// Gradients of attention from the forward's out and lse and the output's cotangent
// dout: dq like q, dk and dv like k (FlashAttention-2 backward, O(S) scratch).
template <typename T>
void attention_backward(const Parallel& par, const AttentionShape& shape, const T* q,
                        const T* k, const T* v, const T* out, const Acc<T>* lse,
                        const T* dout, T* dq, T* dk, T* dv);
// Forward-mode derivative of attention: dout, like q, is the tangent of the result for
// tangents dq (like q), dk and dv (like k), from the forward's out and lse (linear in
// the tangents; a fused pass with O(block) scratch).
template <typename T>
void attention_jvp(const Parallel& par, const AttentionShape& shape, const T* q, const T* k,
                   const T* v, const T* out, const Acc<T>* lse, const T* dq, const T* dk,
                   const T* dv, T* dout);

// Backward of conv2d (shape describes the forward problem): dx from dy [G, N, K, P, Q]
// and w, and dw from x and dy. Input pixels no output window reads get a zero gradient.
template <typename T>
void conv2d_backward_data(const Parallel& par, const ConvShape& shape, const T* dy, const T* w,
                          T* dx);
template <typename T>
void conv2d_backward_filter(const Parallel& par, const ConvShape& shape, const T* x,
                            const T* dy, T* dw);

#define OXIJAX_FOR_EACH_DTYPE(X) X(half) X(bfloat16) X(float) X(double)

}  // namespace oxijax::cpu
