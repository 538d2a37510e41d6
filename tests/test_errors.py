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
    (lambda: oxijax.binary(f32, f32.astype(jnp.float16), "add"), TypeError, "share one dtype"),
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
    (lambda: oxijax.gemm(f32, f32.T.astype(jnp.float64)), TypeError, "share one dtype"),
    (lambda: oxijax.gemm(jnp.ones((2, 2, 3)), jnp.ones((3, 3, 4))), ValueError, "do not broadcast"),
    (lambda: oxijax.conv2d(f32, w4), ValueError, "x must have rank 4"),
    (lambda: oxijax.conv2d(x4, jnp.ones((3, 4, 3, 3), jnp.float32)), ValueError, "channels differ"),
    (lambda: oxijax.conv2d(x4, w4, stride=0), ValueError, "stride must be >= 1"),
    (lambda: oxijax.conv2d(x4, w4, stride=(1, 2, 3)), ValueError, "stride must be an int or a pair"),
    (lambda: oxijax.conv2d(x4, w4, padding=-1), ValueError, "padding must be >= 0"),
    (lambda: oxijax.conv2d(x4, jnp.ones((3, 2, 9, 9), jnp.float32)), ValueError, "larger than the padded input"),
    (lambda: oxijax.attention(q4[0], q4, q4), ValueError, "q must have rank 4"),
    (lambda: oxijax.attention(q4, q4[..., :4], q4[..., :4]), ValueError, "must match q"),
    (lambda: oxijax.attention(q4, q4, q4[:, :, :2]), ValueError, "must have one shape"),
    (lambda: oxijax.attention(q4, q4, q4, scale=0.0), ValueError, "scale must be positive"),
    (lambda: oxijax.attention(q4, q4, q4, scale=float("inf")), ValueError, "scale must be finite"),
    (lambda: oxijax.attention(q4, q4, q4, causal=1), TypeError, "causal must be a bool"),
    (lambda: oxijax.attention(q4, q4.astype(jnp.float16), q4), TypeError, "share one dtype"),
]


@pytest.mark.parametrize("call,error,fragment", BAD_CALLS, ids=[m for *_, m in BAD_CALLS])
def test_bad_input_raises_clear_error(call, error, fragment):
    with pytest.raises(error, match=fragment):
        call()


def test_traced_alpha_is_rejected():
    with pytest.raises(TypeError, match="alpha must be a static"):
        jax.jit(lambda a, s: oxijax.gemm(a, a.T, alpha=s))(f32, 2.0)


# Direct ffi_calls skip every Python check: the handlers must still refuse them.
def ffi(target, out, *args, **attrs):
    return jax.ffi.ffi_call(target, out)(*args, **attrs)


def i32(v):
    return np.int32(v)


RAW_CALLS = [
    ("oxijax_unary", jax.ShapeDtypeStruct((3,), jnp.float32), (jnp.ones(2, jnp.float32),), dict(op=i32(0)), "unary result has shape"),
    ("oxijax_unary", jax.ShapeDtypeStruct((2,), jnp.float32), (jnp.ones(2, jnp.float32),), dict(op=i32(99)), "unknown unary op"),
    ("oxijax_unary", jax.ShapeDtypeStruct((2,), jnp.int32), (jnp.ones(2, jnp.int32),), dict(op=i32(0)), "unsupported dtype"),
    ("oxijax_binary", jax.ShapeDtypeStruct((4,), jnp.float32), (jnp.ones(3, jnp.float32), jnp.ones(3, jnp.float32)), dict(op=i32(0)), "does not broadcast"),
    ("oxijax_binary", jax.ShapeDtypeStruct((2, 3), jnp.float32), (jnp.ones(3, jnp.float32), jnp.ones(3, jnp.float32)), dict(op=i32(0)), "is not the broadcast"),
    ("oxijax_binary", jax.ShapeDtypeStruct((3,), jnp.float32), (jnp.ones(3, jnp.float32), jnp.ones(3, jnp.float64)), dict(op=i32(0)), "share one dtype"),
    ("oxijax_reduce", jax.ShapeDtypeStruct((2,), jnp.float32), (jnp.ones((2, 3), jnp.float32),), dict(op=i32(0), axis=np.int64(5)), "out of range"),
    ("oxijax_reduce", jax.ShapeDtypeStruct((3,), jnp.float32), (jnp.ones((2, 3), jnp.float32),), dict(op=i32(0), axis=np.int64(1)), "reduce result has shape"),
    ("oxijax_gemm", jax.ShapeDtypeStruct((2, 2), jnp.float32), (jnp.ones((2, 3), jnp.float32), jnp.ones((2, 2), jnp.float32)),
     dict(trans_a=i32(0), trans_b=i32(0), alpha=np.float64(1), beta=np.float64(0), allow_tf32=False), "inner dimensions differ"),
    ("oxijax_gemm", jax.ShapeDtypeStruct((2, 4), jnp.float32), (jnp.ones((2, 3), jnp.float32), jnp.ones((3, 2), jnp.float32)),
     dict(trans_a=i32(0), trans_b=i32(0), alpha=np.float64(1), beta=np.float64(0), allow_tf32=False), "gemm result has shape"),
    ("oxijax_gemm", jax.ShapeDtypeStruct((2, 2), jnp.float32), (jnp.ones((2, 3), jnp.float32), jnp.ones((3, 2), jnp.float32)),
     dict(trans_a=i32(0), trans_b=i32(0), alpha=np.float64(1), beta=np.float64(1), allow_tf32=False), "needs c"),
    ("oxijax_conv2d", jax.ShapeDtypeStruct((1, 1, 3, 3, 3), jnp.float32), (jnp.ones((1, 1, 2, 5, 5), jnp.float32), jnp.ones((1, 3, 4, 3, 3), jnp.float32)),
     dict(stride_h=np.int64(1), stride_w=np.int64(1), pad_h=np.int64(0), pad_w=np.int64(0)), "channels differ"),
    ("oxijax_conv2d", jax.ShapeDtypeStruct((1, 1, 3, 3, 3), jnp.float32), (jnp.ones((1, 1, 2, 5, 5), jnp.float32), jnp.ones((1, 3, 2, 3, 3), jnp.float32)),
     dict(stride_h=np.int64(0), stride_w=np.int64(1), pad_h=np.int64(0), pad_w=np.int64(0)), "stride must be"),
    ("oxijax_conv2d", jax.ShapeDtypeStruct((1, 1, 3, 4, 4), jnp.float32), (jnp.ones((1, 1, 2, 5, 5), jnp.float32), jnp.ones((1, 3, 2, 3, 3), jnp.float32)),
     dict(stride_h=np.int64(1), stride_w=np.int64(1), pad_h=np.int64(0), pad_w=np.int64(0)), "conv2d result has shape"),
    ("oxijax_attention", (jax.ShapeDtypeStruct((1, 1, 4, 8), jnp.float32), jax.ShapeDtypeStruct((1, 1, 4), jnp.float32)),
     (jnp.ones((1, 1, 4, 8), jnp.float32), jnp.ones((1, 1, 5, 8), jnp.float32), jnp.ones((1, 1, 6, 8), jnp.float32)),
     dict(scale=np.float64(1), causal=False), "attention v has shape"),
    ("oxijax_attention", (jax.ShapeDtypeStruct((1, 1, 4, 8), jnp.float32), jax.ShapeDtypeStruct((1, 1, 4), jnp.float32)),
     (jnp.ones((1, 1, 4, 8), jnp.float32),) * 3, dict(scale=np.float64(-1), causal=False), "scale must be positive"),
    ("oxijax_attention", (jax.ShapeDtypeStruct((1, 1, 4, 8), jnp.float32), jax.ShapeDtypeStruct((1, 1, 4), jnp.float64)),
     (jnp.ones((1, 1, 4, 8), jnp.float32),) * 3, dict(scale=np.float64(1), causal=False), "log-sum-exp must be"),
]


@pytest.mark.parametrize("target,out,args,attrs,fragment", RAW_CALLS, ids=[c[-1] for c in RAW_CALLS])
def test_handlers_reject_inconsistent_calls(target, out, args, attrs, fragment):
    with pytest.raises(Exception, match=fragment):
        jax.block_until_ready(jax.jit(lambda *a: ffi(target, out, *a, **attrs))(*args))
