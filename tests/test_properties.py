"""Property tests: random shapes, axes, transposes and broadcasting against references."""

import hypothesis.extra.numpy as hnp
import jax.numpy as jnp
import numpy as np
from conftest import assert_close, f64, random
from hypothesis import given
from hypothesis import strategies as st
from test_attention import reference as attention_reference
from test_conv2d import reference as conv_reference
from test_elementwise import BINARY_REFERENCE, UNARY_REFERENCE, rounded

import oxijax
from oxijax import BinaryOp, ReduceOp, UnaryOp

dtypes = st.sampled_from([jnp.float16, jnp.bfloat16, jnp.float32, jnp.float64])
seeds = st.integers(0, 2**16)


@given(shapes=hnp.mutually_broadcastable_shapes(num_shapes=2, max_dims=5, min_side=0, max_side=6),
       op=st.sampled_from(list(BinaryOp)), dtype=dtypes, seed=seeds)
def test_binary_any_broadcast(shapes, op, dtype, seed):
    a_shape, b_shape = shapes.input_shapes
    a = random(a_shape, dtype, seed)
    b = random(b_shape, dtype, seed + 1, low=0.25 if op is BinaryOp.DIV else -2.0)
    out = oxijax.binary(a, b, op)
    assert out.shape == shapes.result_shape
    assert_close(out, rounded(BINARY_REFERENCE[op](f64(a), f64(b)), dtype), dtype, scale=0.0)


@given(shape=hnp.array_shapes(min_dims=0, max_dims=4, min_side=0, max_side=9),
       op=st.sampled_from(list(UnaryOp)), dtype=dtypes, seed=seeds)
def test_unary_any_shape(shape, op, dtype, seed):
    x = random(shape, dtype, seed, low=0.01 if op in (UnaryOp.LOG, UnaryOp.SQRT) else -3.0)
    with np.errstate(all="ignore"):
        expected = rounded(UNARY_REFERENCE[op](f64(x)), dtype)
    assert_close(oxijax.unary(x, op), expected, dtype, scale=0.0)


@given(shape=hnp.array_shapes(min_dims=1, max_dims=4, min_side=1, max_side=12),
       data=st.data(), op=st.sampled_from(list(ReduceOp)), dtype=dtypes, seed=seeds)
def test_reduce_any_axis(shape, data, op, dtype, seed):
    axis = data.draw(st.integers(-len(shape), len(shape) - 1))
    x = random(shape, dtype, seed)
    expected = {ReduceOp.SUM: np.sum, ReduceOp.MAX: np.max, ReduceOp.MIN: np.min,
                ReduceOp.MEAN: np.mean}[op](f64(x), axis=axis)
    assert_close(oxijax.reduce(x, op, axis), expected, dtype, scale=2.0 * np.sqrt(shape[axis]))


@given(m=st.integers(1, 40), n=st.integers(1, 40), k=st.integers(1, 40),
       trans_a=st.sampled_from("NTC"), trans_b=st.sampled_from("NTC"),
       batch=hnp.mutually_broadcastable_shapes(num_shapes=2, max_dims=2, max_side=3),
       alpha=st.floats(-2, 2), beta=st.sampled_from([0.0, 1.0, -0.5]), dtype=dtypes, seed=seeds)
def test_gemm_any_shape(m, n, k, trans_a, trans_b, batch, alpha, beta, dtype, seed):
    batch_a, batch_b = batch.input_shapes
    a = random((*batch_a, *((k, m) if trans_a != "N" else (m, k))), dtype, seed)
    b = random((*batch_b, *((n, k) if trans_b != "N" else (k, n))), dtype, seed + 1)
    out_shape = (*batch.result_shape, m, n)
    c = random(out_shape, dtype, seed + 2)
    out = oxijax.gemm(a, b, c, trans_a=trans_a, trans_b=trans_b, alpha=alpha, beta=beta)
    op_a = np.swapaxes(f64(a), -1, -2) if trans_a != "N" else f64(a)
    op_b = np.swapaxes(f64(b), -1, -2) if trans_b != "N" else f64(b)
    expected = alpha * (op_a @ op_b) + beta * f64(c)
    assert_close(out, expected, dtype, scale=4.0 * np.sqrt(k) + 2.0)


@given(n=st.integers(1, 3), c=st.integers(1, 5), h=st.integers(1, 12), w=st.integers(1, 12),
       k=st.integers(1, 6), r=st.integers(1, 4), s=st.integers(1, 4),
       stride=st.tuples(st.integers(1, 3), st.integers(1, 3)),
       padding=st.tuples(st.integers(0, 2), st.integers(0, 2)), dtype=dtypes, seed=seeds)
def test_conv2d_any_shape(n, c, h, w, k, r, s, stride, padding, dtype, seed):
    if h + 2 * padding[0] < r or w + 2 * padding[1] < s:
        return  # an invalid draw: covered by test_errors
    x, wt = random((n, c, h, w), dtype, seed), random((k, c, r, s), dtype, seed + 1)
    out = oxijax.conv2d(x, wt, stride=stride, padding=padding)
    assert_close(out, conv_reference(x, wt, stride, padding), dtype, scale=4.0 * np.sqrt(c * r * s))


@given(b=st.integers(1, 2), h=st.integers(1, 3), sq=st.integers(1, 70), skv=st.integers(1, 70),
       d=st.sampled_from([1, 2, 5, 8, 16, 33, 64]), causal=st.booleans(), dtype=dtypes, seed=seeds)
def test_attention_any_shape(b, h, sq, skv, d, causal, dtype, seed):
    q, k, v = (random((b, h, s, d), dtype, seed + i) for i, s in enumerate((sq, skv, skv)))
    out = oxijax.attention(q, k, v, causal=causal)
    factor = 1.0 if dtype in (jnp.float32, jnp.float64) else 2.0
    assert_close(out, attention_reference(q, k, v, 1 / np.sqrt(d), causal), dtype, scale=2.0, factor=factor)
