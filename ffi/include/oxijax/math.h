// The math of every op, written once for the CPU and the CUDA kernels.
// Functors take and return the accumulator type (float or double, see numeric.h);
// kernels pick the functor at compile time (a template argument), so the inner loops
// carry no switch. NaN behaviour follows jax.numpy: NaN propagates through relu,
// max and min; log(0) = -inf; sqrt(-1) = NaN.
#pragma once

#include <cmath>
#include <limits>

#include "oxijax/ops.h"

namespace oxijax {

template <UnaryOp op> struct Unary;
template <> struct Unary<UnaryOp::RELU> {
  // NaN passes through as in jax.nn.relu. Only x > 0 is kept, so that a negative
  // subnormal, which compares equal to 0 where subnormals are flushed (XLA's threads),
  // becomes 0 rather than a negative result.
  template <typename A> OXIJAX_HD A operator()(A x) const {
    return (x > A(0) || x != x) ? x : A(0);
  }
};
template <> struct Unary<UnaryOp::SIGMOID> {
  template <typename A> OXIJAX_HD A operator()(A x) const {
    using std::exp;
    // Evaluate on the side where exp cannot overflow: exact 0 and 1 at the tails.
    const A e = exp(-(x < A(0) ? -x : x));
    return x >= A(0) ? A(1) / (A(1) + e) : e / (A(1) + e);
  }
};
template <> struct Unary<UnaryOp::TANH> {
  template <typename A> OXIJAX_HD A operator()(A x) const { using std::tanh; return tanh(x); }
};
template <> struct Unary<UnaryOp::EXP> {
  template <typename A> OXIJAX_HD A operator()(A x) const { using std::exp; return exp(x); }
};
template <> struct Unary<UnaryOp::LOG> {
  template <typename A> OXIJAX_HD A operator()(A x) const { using std::log; return log(x); }
};
template <> struct Unary<UnaryOp::SQRT> {
  template <typename A> OXIJAX_HD A operator()(A x) const { using std::sqrt; return sqrt(x); }
};
template <> struct Unary<UnaryOp::ABS> {
  template <typename A> OXIJAX_HD A operator()(A x) const { using std::fabs; return fabs(x); }
};
template <> struct Unary<UnaryOp::NEG> {
  template <typename A> OXIJAX_HD A operator()(A x) const { return -x; }
};

// NaN-propagating max/min (jnp.maximum / jnp.minimum semantics).
template <typename A> OXIJAX_HD A nan_max(A a, A b) { return (a > b || a != a) ? a : b; }
template <typename A> OXIJAX_HD A nan_min(A a, A b) { return (a < b || a != a) ? a : b; }

template <BinaryOp op> struct Binary;
template <> struct Binary<BinaryOp::ADD> {
  template <typename A> OXIJAX_HD A operator()(A a, A b) const { return a + b; }
};
template <> struct Binary<BinaryOp::SUB> {
  template <typename A> OXIJAX_HD A operator()(A a, A b) const { return a - b; }
};
template <> struct Binary<BinaryOp::MUL> {
  template <typename A> OXIJAX_HD A operator()(A a, A b) const { return a * b; }
};
template <> struct Binary<BinaryOp::DIV> {
  template <typename A> OXIJAX_HD A operator()(A a, A b) const { return a / b; }
};
template <> struct Binary<BinaryOp::MAX> {
  template <typename A> OXIJAX_HD A operator()(A a, A b) const { return nan_max(a, b); }
};
template <> struct Binary<BinaryOp::MIN> {
  template <typename A> OXIJAX_HD A operator()(A a, A b) const { return nan_min(a, b); }
};

// Derivatives for the backward passes, matching jax.grad of the jnp functions.
// UnaryGrad<op>()(x, t) = t * f'(x), in the order of operations of JAX's own jvp rules:
// relu'(0) = 0 and abs'(0) = 1 (JAX's choices), log'(0) = sqrt'(0) = inf.
template <UnaryOp op> struct UnaryGrad;
template <> struct UnaryGrad<UnaryOp::RELU> {
  // Selects, never multiplies: an inf or NaN t is dropped where x <= 0 (or NaN), as in JAX.
  template <typename A> OXIJAX_HD A operator()(A x, A t) const { return x > A(0) ? t : A(0); }
};
template <> struct UnaryGrad<UnaryOp::SIGMOID> {
  template <typename A> OXIJAX_HD A operator()(A x, A t) const {
    const A s = Unary<UnaryOp::SIGMOID>()(x);
    return t * (s * (A(1) - s));
  }
};
template <> struct UnaryGrad<UnaryOp::TANH> {
  template <typename A> OXIJAX_HD A operator()(A x, A t) const {
    using std::tanh;
    const A y = tanh(x);
    return (t + t * y) * (A(1) - y);
  }
};
template <> struct UnaryGrad<UnaryOp::EXP> {
  template <typename A> OXIJAX_HD A operator()(A x, A t) const { using std::exp; return t * exp(x); }
};
template <> struct UnaryGrad<UnaryOp::LOG> {
  template <typename A> OXIJAX_HD A operator()(A x, A t) const { return t / x; }
};
template <> struct UnaryGrad<UnaryOp::SQRT> {
  template <typename A> OXIJAX_HD A operator()(A x, A t) const {
    using std::sqrt;
    return t * (A(0.5) / sqrt(x));
  }
};
template <> struct UnaryGrad<UnaryOp::ABS> {
  template <typename A> OXIJAX_HD A operator()(A x, A t) const { return x >= A(0) ? t : -t; }
};
template <> struct UnaryGrad<UnaryOp::NEG> {
  template <typename A> OXIJAX_HD A operator()(A, A t) const { return -t; }
};

// d max(a, b) / da (and likewise min) as JAX defines it: 1 where a alone is the result,
// 1/2 each on a tie, 0 where b is the result or the result is NaN.
template <BinaryOp op> struct BinaryPartial;
template <> struct BinaryPartial<BinaryOp::MAX> {
  template <typename A> OXIJAX_HD A operator()(A a, A b) const {
    const A m = nan_max(a, b);
    return A(a == m ? 1 : 0) / A(b == m ? 2 : 1);
  }
};
template <> struct BinaryPartial<BinaryOp::MIN> {
  template <typename A> OXIJAX_HD A operator()(A a, A b) const {
    const A m = nan_min(a, b);
    return A(a == m ? 1 : 0) / A(b == m ? 2 : 1);
  }
};

// A reduction is an identity, an associative combine and a finish step that sees the
// number of reduced elements (MEAN divides by it; the mean of nothing is 0/0 = NaN).
template <ReduceOp op> struct Reducer;
template <> struct Reducer<ReduceOp::SUM> {
  template <typename A> OXIJAX_HD static A identity() { return A(0); }
  template <typename A> OXIJAX_HD static A combine(A a, A b) { return a + b; }
  template <typename A> OXIJAX_HD static A finish(A acc, long long) { return acc; }
};
template <> struct Reducer<ReduceOp::MEAN> {
  template <typename A> OXIJAX_HD static A identity() { return A(0); }
  template <typename A> OXIJAX_HD static A combine(A a, A b) { return a + b; }
  template <typename A> OXIJAX_HD static A finish(A acc, long long n) { return acc / A(n); }
};
template <> struct Reducer<ReduceOp::MAX> {
  template <typename A> OXIJAX_HD static A identity() { return -std::numeric_limits<A>::infinity(); }
  template <typename A> OXIJAX_HD static A combine(A a, A b) { return nan_max(a, b); }
  template <typename A> OXIJAX_HD static A finish(A acc, long long) { return acc; }
};
template <> struct Reducer<ReduceOp::MIN> {
  template <typename A> OXIJAX_HD static A identity() { return std::numeric_limits<A>::infinity(); }
  template <typename A> OXIJAX_HD static A combine(A a, A b) { return nan_min(a, b); }
  template <typename A> OXIJAX_HD static A finish(A acc, long long) { return acc; }
};

// Online softmax for one attention row (FlashAttention's recurrence). Scores arrive
// block by block; masked scores are -inf. Before a block's weights are added, the
// output accumulated so far is multiplied by rescale(block_max). A row that never sees
// an unmasked key keeps sum == 0 and finishes as zeros, never NaN.
template <typename A> struct OnlineSoftmax {
  A max = -std::numeric_limits<A>::infinity();
  A sum = A(0);

  // Raises the running max to cover a new block; returns the factor for old sums.
  OXIJAX_HD A rescale(A block_max) {
    using std::exp;
    const A new_max = block_max > max ? block_max : max;
    const A factor = new_max == max ? A(1) : exp(max - new_max);  // exp(-inf) = 0 on first block
    max = new_max;
    sum *= factor;
    return factor;
  }
  // Unnormalised probability of a score under the current max (0 for masked scores).
  OXIJAX_HD A weight(A score) const {
    using std::exp;
    return score == -std::numeric_limits<A>::infinity() ? A(0) : exp(score - max);
  }
  OXIJAX_HD void add(A weight_sum) { sum += weight_sum; }
  // Factor that turns the accumulated output into the softmax average.
  OXIJAX_HD A normaliser() const { return sum == A(0) ? A(0) : A(1) / sum; }
  // log(sum(exp(scores))), -inf for a fully masked row; saved for the backward pass.
  OXIJAX_HD A log_sum_exp() const {
    using std::log;
    return sum == A(0) ? -std::numeric_limits<A>::infinity() : max + log(sum);  // NaN stays NaN
  }
};

}  // namespace oxijax
