"""Bad input raises a clear TypeError/ValueError at trace time, naming the argument;
and the C++ handlers reject inconsistent calls that bypass the Python checks."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import oxijax

f32 = jnp.ones((2, 3), jnp.float32)
x4 = jnp.ones((1, 2, 5, 5), jnp.float32)
w4 = jnp.ones((3, 2, 3, 3), jnp.float32)
q4 = jnp.ones((1, 2, 4, 8), jnp.float32)

BAD_CALLS = [
    # (call, exception, fragment of the message)
    (lambda: oxijax.unary(f32, "cube"), ValueError, "op must be a UnaryOp"),
    (lambda: oxijax.unary(jnp.ones(3, jnp.int32), "relu"), TypeError, "x must have dtype"),
    (lambda: oxijax.unary("text", "relu"), TypeError, "x must be an array"),
    (lambda: oxijax.binary(f32, f32, "pow"), ValueError, "op must be a BinaryOp"),
    (lambda: oxijax.binary(f32, jnp.ones(4, jnp.float32), "add"), ValueError, "do not broadcast"),
    (lambda: oxijax.binary(f32, f32.astype(jnp.complex64), "add"), TypeError, "b must have dtype"),
    (lambda: oxijax.binary(jnp.ones(3, jnp.int32), 2, "add"), TypeError, "a must have dtype"),
    (lambda: oxijax.sigmoid(jnp.ones(3, jnp.int32)), TypeError, "x must have dtype"),
    (lambda: oxijax.sum(jnp.ones(3, jnp.int32), 0), TypeError, "x must have dtype"),
    (lambda: oxijax.binary(jnp.ones(2, jnp.complex64), jnp.ones(2, jnp.complex64), "add"), TypeError, "a must have dtype"),
    (lambda: oxijax.reduce(f32, "prod", 0), ValueError, "op must be a ReduceOp"),
    (lambda: oxijax.reduce(f32, "sum", 2), ValueError, "axis 2 is out of range"),
    (lambda: oxijax.reduce(f32, "sum", -3), ValueError, "axis -3 is out of range"),
    (lambda: oxijax.reduce(f32, "sum", 0.5), TypeError, "axis must be an int"),
    (lambda: oxijax.reduce(jnp.float32(1.0), "sum", 0), ValueError, "rank >= 1"),
    (lambda: oxijax.reduce(jnp.ones((2, 0)), "max", 1), ValueError, "size 0"),
    (lambda: oxijax.gemm(f32, f32), ValueError, "inner dimensions differ"),
    (lambda: oxijax.gemm(jnp.ones(3), f32), ValueError, "a must have rank >= 2"),
    (lambda: oxijax.gemm(f32, f32, trans_b="X"), ValueError, "trans_b must be"),
    (lambda: oxijax.gemm(f32, f32.T, beta=1.0), ValueError, "c is required"),
    (lambda: oxijax.gemm(f32, f32.T, jnp.ones((3, 3), jnp.float32), beta=1.0), ValueError, "does not broadcast"),
    (lambda: oxijax.gemm(f32, f32.T, alpha=float("nan")), ValueError, "alpha must be finite"),
    (lambda: oxijax.gemm(f32, f32.T, alpha="x"), TypeError, "alpha must be a number"),
    (lambda: oxijax.gemm(f32, f32.T, precision="fast"), ValueError, "precision must be"),
    (lambda: oxijax.attention(q4, q4, q4, precision="fast"), ValueError, "precision must be"),
    (lambda: oxijax.gemm(f32, f32.T.astype(jnp.complex64)), TypeError, "b must have dtype"),
    (lambda: oxijax.gemm(f32, f32.T, jnp.ones(2, jnp.complex64), beta=1.0), TypeError, "c must have dtype"),
    (lambda: oxijax.gemm(jnp.ones((2, 2, 3)), jnp.ones((3, 3, 4))), ValueError, "do not broadcast"),
    (lambda: oxijax.conv2d(f32, w4), ValueError, "x must have rank 4"),
    (lambda: oxijax.conv2d(x4, jnp.ones((3, 4, 3, 3), jnp.float32)), ValueError, "channels differ"),
    (lambda: oxijax.conv2d(x4, w4, stride=0), ValueError, "stride must be >= 1"),
    (lambda: oxijax.conv2d(x4, w4, stride=(1, 2, 3)), ValueError, "stride must be an int or a pair"),
    (lambda: oxijax.conv2d(x4, w4, padding=-1), ValueError, "padding must be >= 0"),
    (lambda: oxijax.conv2d(x4, w4, padding=2**62), ValueError, "padding must be <= 2147483647"),
    (lambda: oxijax.conv2d(x4, w4, stride=(1, 2**40)), ValueError, "stride must be <= 2147483647"),
    (lambda: oxijax.conv2d(x4.astype(jnp.int8), w4.astype(jnp.int8)), TypeError, "x must have dtype"),
    (lambda: oxijax.attention(q4[0], q4, q4), ValueError, "q must have rank 4"),
    (lambda: oxijax.attention(q4, q4[..., :4], q4[..., :4]), ValueError, "must match q"),
    (lambda: oxijax.attention(q4, q4, q4[:, :, :2]), ValueError, "must have one shape"),
    (lambda: oxijax.attention(q4, q4, q4, scale=0.0), ValueError, "scale must be positive"),
    (lambda: oxijax.attention(q4, q4, q4, scale=float("inf")), ValueError, "scale must be finite"),
    (lambda: oxijax.attention(q4, q4, q4, causal=1), TypeError, "causal must be a bool"),
    (lambda: oxijax.attention(q4, q4, q4.astype(jnp.complex64)), TypeError, "v must have dtype"),
]


@pytest.mark.parametrize("call,error,fragment", BAD_CALLS, ids=[m for *_, m in BAD_CALLS])
def test_bad_input_raises_clear_error(call, error, fragment):
    with pytest.raises(error, match=fragment):
        call()


def test_traced_alpha_is_rejected():
    with pytest.raises(TypeError, match="alpha must be a static"):
        jax.jit(lambda a, s: oxijax.gemm(a, a.T, alpha=s))(f32, 2.0)


# Direct ffi_calls skip every Python check: the handlers must still refuse them, with
# an ffi::Error that JAX raises as a Python exception (never a crash). Each case is
# (target, result shapes, operand shapes, attributes, fragment of the message).
def S(*shape, dtype=jnp.float32):
    return jax.ShapeDtypeStruct(shape, dtype)


def i32(v):
    return np.int32(v)


def i64(v):
    return np.int64(v)


def f64(v):
    return np.float64(v)


HUGE = 2**62
I32_MAX, I32_MIN = 2**31 - 1, -(2**31)
F16, F64 = jnp.float16, jnp.float64

UNARY = dict(op=i32(0))
GEMM = dict(trans_a=i32(0), trans_b=i32(0), alpha=f64(1), beta=f64(0), allow_tf32=False)
CONV = dict(stride_h=i64(1), stride_w=i64(1), pad_h=i64(0), pad_w=i64(0))
CONV_DATA = dict(CONV, input_h=i64(5), input_w=i64(5))
CONV_FILTER = dict(CONV, filter_h=i64(3), filter_w=i64(3))
ATTN = dict(scale=f64(1), causal=False)  # the derivative kernels' attributes
ATTN_FWD = dict(ATTN, allow_tf32=False)
# Consistent operands of each target, which the cases below spoil one thing at a time.
X5, W5, Y5 = S(1, 1, 2, 5, 5), S(1, 3, 2, 3, 3), S(1, 1, 3, 3, 3)
Q, KV, LSE = S(1, 2, 4, 8), S(1, 2, 6, 8), S(1, 2, 4)
ATTN_OUT = (Q, LSE)
ATTN_BWD_ARGS = (Q, KV, KV, Q, LSE, Q)
ATTN_BWD_OUT = (Q, KV, KV)
ATTN_JVP_ARGS = (Q, KV, KV, Q, LSE, Q, KV, KV)


def with_(attrs, **changes):
    return {**attrs, **changes}


def replace(shapes, i, new):
    return tuple(new if j == i else s for j, s in enumerate(shapes))


RAW_CALLS = [
    # unary
    ("oxijax_unary", S(3), (S(2),), UNARY, "unary result has shape"),
    ("oxijax_unary", S(2), (S(2),), dict(op=i32(8)), "unknown unary op"),
    ("oxijax_unary", S(2), (S(2),), dict(op=i32(-1)), "unknown unary op"),
    ("oxijax_unary", S(2), (S(2),), dict(op=i32(I32_MAX)), "unknown unary op"),
    ("oxijax_unary", S(2), (S(2),), dict(op=i32(I32_MIN)), "unknown unary op"),
    ("oxijax_unary", S(2, dtype=jnp.int32), (S(2, dtype=jnp.int32),), UNARY, "unsupported dtype"),
    ("oxijax_unary", S(2, dtype=F16), (S(2),), UNARY, "share one dtype"),
    ("oxijax_unary", S(2), (S(2), S(2)), UNARY, "argument"),
    ("oxijax_unary", S(2), (S(2),), dict(op=i64(0)), "op"),  # an int64 where int32 is due
    ("oxijax_unary", S(2), (S(2),), {}, "number of attributes"),
    # binary
    ("oxijax_binary", S(4), (S(3), S(3)), dict(op=i32(0)), "does not broadcast"),
    ("oxijax_binary", S(2, 3), (S(3), S(3)), dict(op=i32(0)), "is not the broadcast"),
    ("oxijax_binary", S(3), (S(2, 3), S(3)), dict(op=i32(0)), "rank is smaller"),
    ("oxijax_binary", S(3), (S(3), S(3, dtype=F64)), dict(op=i32(0)), "share one dtype"),
    ("oxijax_binary", S(3, dtype=F16), (S(3), S(3)), dict(op=i32(0)), "share one dtype"),
    ("oxijax_binary", S(3), (S(3), S(3)), dict(op=i32(6)), "unknown binary op"),
    ("oxijax_binary", S(3), (S(3), S(3)), dict(op=i32(-1)), "unknown binary op"),
    ("oxijax_binary", S(3), (S(3),), dict(op=i32(0)), "argument"),
    # reduce
    ("oxijax_reduce", S(2), (S(2, 3),), dict(op=i32(0), axis=i64(5)), "out of range"),
    ("oxijax_reduce", S(2), (S(2, 3),), dict(op=i32(0), axis=i64(-1)), "out of range"),
    ("oxijax_reduce", S(2), (S(2, 3),), dict(op=i32(0), axis=i64(HUGE)), "out of range"),
    ("oxijax_reduce", S(2), (S(2, 3),), dict(op=i32(0), axis=i64(-(2**63))), "out of range"),
    ("oxijax_reduce", S(3), (S(2, 3),), dict(op=i32(0), axis=i64(1)), "reduce result has shape"),
    ("oxijax_reduce", S(2, dtype=F64), (S(2, 3),), dict(op=i32(0), axis=i64(1)), "share one dtype"),
    ("oxijax_reduce", S(2), (S(2, 3),), dict(op=i32(4), axis=i64(1)), "unknown reduce op"),
    ("oxijax_reduce", S(2), (S(2, 3),), dict(op=i32(-7), axis=i64(1)), "unknown reduce op"),
    ("oxijax_reduce", S(), (S(),), dict(op=i32(0), axis=i64(0)), "rank >= 1"),
    ("oxijax_reduce", S(2), (S(2, 0),), dict(op=i32(1), axis=i64(1)), "no identity"),
    # gemm: operands a, b and optionally c
    ("oxijax_gemm", S(2, 2), (S(2, 3), S(2, 2)), GEMM, "inner dimensions differ"),
    ("oxijax_gemm", S(2, 4), (S(2, 3), S(3, 2)), GEMM, "gemm result has shape"),
    ("oxijax_gemm", S(2, 2), (S(2, 3), S(3, 2)), with_(GEMM, beta=f64(1)), "needs c"),
    ("oxijax_gemm", S(2, 2), (S(2, 3),), GEMM, "takes a, b and optionally c"),
    ("oxijax_gemm", S(2, 2), (), GEMM, "takes a, b and optionally c"),
    ("oxijax_gemm", S(2, 2), (S(2, 3), S(3, 2), S(2, 2), S(2, 2)), GEMM, "takes a, b and optionally c"),
    ("oxijax_gemm", S(2, 2), (S(2, 3), S(3, 2), S(3, 3)), with_(GEMM, beta=f64(1)), "gemm c has shape"),
    ("oxijax_gemm", S(2, 2), (S(2, 3), S(3, 2), S(2, 2, dtype=F64)), with_(GEMM, beta=f64(1)), "gemm c must have"),
    ("oxijax_gemm", S(2, 2, dtype=F64), (S(2, 3), S(3, 2)), GEMM, "share one dtype"),
    ("oxijax_gemm", S(2, 2), (S(2, 3), S(3, 2)), with_(GEMM, trans_a=i32(3)), "unknown transpose"),
    ("oxijax_gemm", S(2, 2), (S(2, 3), S(3, 2)), with_(GEMM, trans_b=i32(-1)), "unknown transpose"),
    ("oxijax_gemm", S(2, 2), (S(2, 3), S(3, 2)), with_(GEMM, trans_b=i32(I32_MAX)), "unknown transpose"),
    ("oxijax_gemm", S(2, 2), (S(2, 3), S(3, 2)), with_(GEMM, alpha=f64(np.nan)), "must be finite"),
    ("oxijax_gemm", S(2, 2), (S(2, 3), S(3, 2), S(2, 2)), with_(GEMM, beta=f64(np.inf)), "must be finite"),
    ("oxijax_gemm", S(2, 2), (S(2, 3), S(3, 2)), with_(GEMM, alpha=f64(-np.inf)), "must be finite"),
    ("oxijax_gemm", S(2), (S(3), S(3)), GEMM, "rank >= 2"),
    ("oxijax_gemm", S(2, 2, 2), (S(2, 2, 3), S(3, 2)), GEMM, "rank >= 2"),
    ("oxijax_gemm", S(3, 2, 2), (S(2, 2, 3), S(3, 3, 2)), GEMM, "do not broadcast"),
    ("oxijax_gemm", S(2, 2, 2), (S(1, 2, 3), S(3, 3, 2)), GEMM, "gemm result has shape"),
    ("oxijax_gemm", S(2, 2), (S(2, 3), S(3, 2)), with_(GEMM, allow_tf32=i32(1)), "Wrong scalar data type"),
    # conv2d
    ("oxijax_conv2d", Y5, (X5, S(1, 3, 4, 3, 3)), CONV, "channels differ"),
    ("oxijax_conv2d", Y5, (X5, S(2, 3, 2, 3, 3)), CONV, "different group counts"),
    ("oxijax_conv2d", S(1, 3, 3, 3), (S(1, 2, 5, 5), S(3, 2, 3, 3)), CONV, "conv2d expects"),
    ("oxijax_conv2d", Y5, (X5, W5), with_(CONV, stride_h=i64(0)), "stride must be"),
    ("oxijax_conv2d", Y5, (X5, W5), with_(CONV, stride_w=i64(-1)), "stride must be"),
    ("oxijax_conv2d", Y5, (X5, W5), with_(CONV, stride_w=i64(-(2**63))), "stride must be"),
    ("oxijax_conv2d", Y5, (X5, W5), with_(CONV, pad_h=i64(-1)), "padding must be"),
    ("oxijax_conv2d", Y5, (X5, W5), with_(CONV, pad_w=i64(-(2**63))), "padding must be"),
    # Steps whose index arithmetic (H + 2 * pad, ceil_div by the stride) would overflow
    ("oxijax_conv2d", Y5, (X5, W5), with_(CONV, pad_h=i64(HUGE)), "padding must be <= 2147483647"),
    ("oxijax_conv2d", Y5, (X5, W5), with_(CONV, pad_w=i64(2**63 - 1)), "padding must be <= "),
    ("oxijax_conv2d", S(1, 1, 3, 1, 3), (X5, W5), with_(CONV, pad_h=i64(HUGE), stride_h=i64(HUGE)), "<= 2147483647"),
    ("oxijax_conv2d", S(1, 1, 3, 1, 3), (X5, W5), with_(CONV, stride_h=i64(2**63 - 1)), "stride must be <= "),
    ("oxijax_conv2d", S(1, 1, 3, 4, 4), (X5, W5), CONV, "conv2d result has shape"),
    ("oxijax_conv2d", S(1, 1, 3, 3, 3, dtype=F16), (X5, W5), CONV, "share one dtype"),
    ("oxijax_conv2d", Y5, (X5, S(1, 3, 2, 9, 9)), CONV, "larger than the padded input"),
    ("oxijax_conv2d", Y5, (X5, W5), {k: v for k, v in CONV.items() if k != "pad_w"}, "number of attributes"),
    # attention
    ("oxijax_attention", ATTN_OUT, (Q, S(1, 2, 5, 8), KV), ATTN_FWD, "attention v has shape"),
    ("oxijax_attention", ATTN_OUT, (Q, Q, Q), with_(ATTN_FWD, scale=f64(-1)), "scale must be positive"),
    ("oxijax_attention", ATTN_OUT, (Q, Q, Q), with_(ATTN_FWD, scale=f64(0)), "scale must be positive"),
    ("oxijax_attention", ATTN_OUT, (Q, Q, Q), with_(ATTN_FWD, scale=f64(np.nan)), "scale must be positive"),
    ("oxijax_attention", ATTN_OUT, (Q, Q, Q), with_(ATTN_FWD, scale=f64(np.inf)), "scale must be positive"),
    ("oxijax_attention", (Q, S(1, 2, 4, dtype=F64)), (Q, Q, Q), ATTN_FWD, "log-sum-exp must be"),
    ("oxijax_attention", (Q, S(1, 2, 4, dtype=F16)), (Q, Q, Q), ATTN_FWD, "log-sum-exp must be"),
    ("oxijax_attention", (Q, S(1, 2, 5)), (Q, Q, Q), ATTN_FWD, "log-sum-exp has shape"),
    ("oxijax_attention", (Q, S(1, 2, 4, 1)), (Q, Q, Q), ATTN_FWD, "log-sum-exp has shape"),
    ("oxijax_attention", ATTN_OUT, (Q, S(2, 2, 6, 8), S(2, 2, 6, 8)), ATTN_FWD, "does not match q"),
    ("oxijax_attention", ATTN_OUT, (Q, S(1, 1, 6, 8), S(1, 1, 6, 8)), ATTN_FWD, "does not match q"),
    ("oxijax_attention", ATTN_OUT, (Q, S(1, 2, 6, 4), S(1, 2, 6, 4)), ATTN_FWD, "does not match q"),
    ("oxijax_attention", ATTN_OUT, (Q, KV, S(1, 2, 6, 4)), ATTN_FWD, "attention v has shape"),
    ("oxijax_attention", (S(2, 4, 8), S(2, 4)), (S(2, 4, 8),) * 3, ATTN_FWD, "attention expects"),
    ("oxijax_attention", (S(1, 2, 4, 7), LSE), (Q, KV, KV), ATTN_FWD, "attention result has shape"),
    ("oxijax_attention", (S(1, 2, 4, 8, dtype=F16), LSE), (Q, KV, KV), ATTN_FWD, "share one dtype"),
    ("oxijax_attention", (Q,), (Q, KV, KV), ATTN_FWD, "result"),
    # attention_backward: q, k, v, out, lse, dout -> dq, dk, dv
    *[("oxijax_attention_backward", ATTN_BWD_OUT, replace(ATTN_BWD_ARGS, i, bad), ATTN, fragment)
      for i, bad, fragment in [
          (0, S(2, 2, 4, 8), "does not match q"),
          (1, S(1, 2, 6, 4), "does not match q"),
          (2, S(1, 2, 5, 8), "attention v has shape"),
          (3, S(1, 2, 4, 4), "attention result has shape"),
          (4, S(1, 2, 4, dtype=F64), "log-sum-exp must be"),
          (4, S(1, 2, 3), "log-sum-exp has shape"),
          (5, S(1, 2, 4, 4), "output cotangent has shape"),
          (5, S(1, 2, 4, 8, dtype=F16), "share one dtype"),
      ]],
    *[("oxijax_attention_backward", replace(ATTN_BWD_OUT, i, bad), ATTN_BWD_ARGS, ATTN, fragment)
      for i, bad, fragment in [
          (0, KV, "attention dq has shape"),
          (1, Q, "attention dk has shape"),
          (2, S(1, 2, 6, 8, dtype=F64), "share one dtype"),
          (2, S(1, 1, 6, 8), "attention dv has shape"),
      ]],
    ("oxijax_attention_backward", ATTN_BWD_OUT, ATTN_BWD_ARGS, with_(ATTN, scale=f64(np.nan)), "scale must be positive"),
    ("oxijax_attention_backward", ATTN_BWD_OUT, ATTN_BWD_ARGS, with_(ATTN, scale=f64(-np.inf)), "scale must be positive"),
    ("oxijax_attention_backward", ATTN_BWD_OUT, ATTN_BWD_ARGS[:5], ATTN, "argument"),
    ("oxijax_attention_backward", ATTN_BWD_OUT[:2], ATTN_BWD_ARGS, ATTN, "result"),
    # attention_jvp: q, k, v, out, lse, dq, dk, dv -> dout
    *[("oxijax_attention_jvp", Q, replace(ATTN_JVP_ARGS, i, bad), ATTN, fragment)
      for i, bad, fragment in [
          (0, S(2, 2, 4, 8), "does not match q"),
          (2, S(1, 2, 5, 8), "attention v has shape"),
          (3, S(1, 2, 4, 4), "attention result has shape"),
          (4, S(1, 2, 4, dtype=F64), "log-sum-exp must be"),
          (5, KV, "tangent dq has shape"),
          (6, Q, "tangent dk has shape"),
          (7, S(1, 2, 6, 4), "tangent dv has shape"),
          (7, S(1, 2, 6, 8, dtype=F16), "share one dtype"),
      ]],
    ("oxijax_attention_jvp", KV, ATTN_JVP_ARGS, ATTN, "result tangent has shape"),
    ("oxijax_attention_jvp", S(1, 2, 4, 8, dtype=F64), ATTN_JVP_ARGS, ATTN, "share one dtype"),
    ("oxijax_attention_jvp", Q, ATTN_JVP_ARGS, with_(ATTN, scale=f64(0)), "scale must be positive"),
    ("oxijax_attention_jvp", Q, ATTN_JVP_ARGS[:7], ATTN, "argument"),
    ("oxijax_attention_jvp", (Q, Q), ATTN_JVP_ARGS, ATTN, "result"),
    # unary_grad: x, t -> out
    ("oxijax_unary_grad", S(3), (S(3), S(4)), UNARY, "tangent has shape"),
    ("oxijax_unary_grad", S(4), (S(3), S(3)), UNARY, "unary_grad result has shape"),
    ("oxijax_unary_grad", S(3), (S(3), S(3, dtype=F16)), UNARY, "share one dtype"),
    ("oxijax_unary_grad", S(3, dtype=F64), (S(3), S(3)), UNARY, "share one dtype"),
    ("oxijax_unary_grad", S(3), (S(3), S(3)), dict(op=i32(8)), "unknown unary op"),
    ("oxijax_unary_grad", S(3), (S(3), S(3)), dict(op=i32(I32_MIN)), "unknown unary op"),
    ("oxijax_unary_grad", S(3), (S(3),), UNARY, "argument"),
    # binary_partial: max and min only
    ("oxijax_binary_partial", S(3), (S(3), S(3)), dict(op=i32(0)), "max and min only"),
    ("oxijax_binary_partial", S(3), (S(3), S(3)), dict(op=i32(-1)), "max and min only"),
    ("oxijax_binary_partial", S(3), (S(3), S(3)), dict(op=i32(I32_MAX)), "max and min only"),
    ("oxijax_binary_partial", S(4), (S(3), S(3)), dict(op=i32(4)), "does not broadcast"),
    ("oxijax_binary_partial", S(3), (S(3), S(3, dtype=F64)), dict(op=i32(5)), "share one dtype"),
    ("oxijax_binary_partial", S(2, 3), (S(3), S(3)), dict(op=i32(5)), "is not the broadcast"),
    # conv2d_backward_data: dy, w -> dx
    ("oxijax_conv2d_backward_data", X5, (Y5, W5), with_(CONV_DATA, input_h=i64(6)), "expected input_h"),
    ("oxijax_conv2d_backward_data", X5, (Y5, W5), with_(CONV_DATA, input_w=i64(-1)), "expected input_h"),
    ("oxijax_conv2d_backward_data", X5, (Y5, W5), with_(CONV_DATA, stride_h=i64(0)), "stride must be"),
    ("oxijax_conv2d_backward_data", X5, (Y5, W5), with_(CONV_DATA, pad_w=i64(-3)), "padding must be"),
    ("oxijax_conv2d_backward_data", X5, (Y5, W5), with_(CONV_DATA, pad_h=i64(HUGE)), "padding must be <= "),
    ("oxijax_conv2d_backward_data", X5, (S(1, 1, 3, 4, 4), W5), CONV_DATA, "conv2d result has shape"),
    ("oxijax_conv2d_backward_data", X5, (Y5, S(1, 3, 4, 3, 3)), CONV_DATA, "channels differ"),
    ("oxijax_conv2d_backward_data", S(1, 1, 2, 5, 5, dtype=F64), (Y5, W5), CONV_DATA, "share one dtype"),
    ("oxijax_conv2d_backward_data", X5, (Y5, W5), CONV, "number of attributes"),
    # conv2d_backward_filter: x, dy -> dw
    ("oxijax_conv2d_backward_filter", W5, (X5, Y5), with_(CONV_FILTER, filter_h=i64(2)), "expected filter_h"),
    ("oxijax_conv2d_backward_filter", W5, (X5, Y5), with_(CONV_FILTER, filter_w=i64(HUGE)), "expected filter_h"),
    ("oxijax_conv2d_backward_filter", W5, (X5, Y5), with_(CONV_FILTER, stride_w=i64(-5)), "stride must be"),
    ("oxijax_conv2d_backward_filter", W5, (X5, Y5), with_(CONV_FILTER, pad_h=i64(-1)), "padding must be"),
    ("oxijax_conv2d_backward_filter", W5, (X5, Y5), with_(CONV_FILTER, pad_w=i64(HUGE)), "padding must be <= "),
    ("oxijax_conv2d_backward_filter", W5, (X5, S(1, 1, 3, 2, 3)), CONV_FILTER, "conv2d result has shape"),
    ("oxijax_conv2d_backward_filter", W5, (S(2, 1, 2, 5, 5), Y5), CONV_FILTER, "different group counts"),
    ("oxijax_conv2d_backward_filter", S(1, 3, 2, 3, 3, dtype=F16), (X5, Y5), CONV_FILTER, "share one dtype"),
    # A zero-size x whose other dims multiply past int64 (XLA accepts it and, dw being
    # non-empty, runs the handler; XLA skips handlers whose results are all empty)
    ("oxijax_conv2d_backward_filter", S(1, 1, 1, 3, 3), (S(1, 0, 1, 2**32, 2**32), S(1, 0, 1, 2**32 - 2, 2**32 - 2)),
     CONV_FILTER, "overflows int64"),
]


def call_raw(target, out, operands, attrs):
    """Runs the target on operands of the given shapes, made inside the jit (zero-size
    ones with huge dims cannot exist as NumPy arrays)."""
    out = list(out) if isinstance(out, tuple) else out
    make = lambda: [jnp.ones(s.shape, s.dtype) for s in operands]  # noqa: E731
    return jax.block_until_ready(jax.jit(lambda: jax.ffi.ffi_call(target, out)(*make(), **attrs))())


@pytest.mark.parametrize("target,out,operands,attrs,fragment", RAW_CALLS,
                         ids=[f"{c[0][7:]}-{i}-{c[-1]}" for i, c in enumerate(RAW_CALLS)])
def test_handlers_reject_inconsistent_calls(target, out, operands, attrs, fragment):
    with pytest.raises(Exception, match=fragment):
        call_raw(target, out, operands, attrs)


def test_every_target_is_attacked():
    from oxijax._ffi import REGISTERED_TARGETS

    assert {c[0] for c in RAW_CALLS} == set(REGISTERED_TARGETS["cpu"])
