"""Fuzzing every JAX op (hypothesis): valid draws of random ranks, shapes, dtypes, axes,
transposes, broadcasting, strides, paddings, scales and flags match a NumPy float64
reference; invalid draws raise the documented TypeError/ValueError naming the argument.

`HYPOTHESIS_PROFILE=slow pytest -m fuzz` runs 1000 draws per test (see conftest)."""

from __future__ import annotations

import functools
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import assert_close, f64
from fuzz_strategies import (
    broadcast_pairs, dtypes, fuzz_settings, prod, seeds, shapes, sides, values,
)
from hypothesis import given, settings
from hypothesis import strategies as st
from test_attention import reference as attention_reference
from test_conv2d import reference as conv_reference
from test_elementwise import BINARY_REFERENCE, UNARY_REFERENCE, rounded

import oxijax
from oxijax import BinaryOp, ReduceOp, UnaryOp

pytestmark = pytest.mark.fuzz

# One XLA program per shape (eagerly, their reshapes and slices would compile one each).
jit_gemm = jax.jit(oxijax.gemm, static_argnames=("trans_a", "trans_b", "alpha", "beta", "precision"))
jit_conv2d = jax.jit(oxijax.conv2d, static_argnames=("stride", "padding"))
jit_attention = jax.jit(oxijax.attention, static_argnames=("scale", "causal"))
REDUCE_REFERENCE = {ReduceOp.SUM: np.sum, ReduceOp.MAX: np.max, ReduceOp.MIN: np.min,
                    ReduceOp.MEAN: np.mean}


# An op given as a member or as its name in any case.
def op_spellings(enum):
    return st.sampled_from(list(enum)).flatmap(
        lambda op: st.sampled_from([op, op.name.lower(), op.name]))


# -- valid draws ---------------------------------------------------------------------


@fuzz_settings
@given(shape=shapes(), op=op_spellings(UnaryOp), dtype=dtypes, seed=seeds,
       specials=st.sampled_from([0.0, 0.2]))
def test_unary(shape, op, dtype, seed, specials):
    x = values(shape, dtype, seed, low=-4.0, high=4.0, specials=specials)
    out = oxijax.unary(x, op)
    assert out.shape == x.shape and out.dtype == x.dtype
    with np.errstate(all="ignore"):
        expected = rounded(UNARY_REFERENCE[UnaryOp.parse(op)](f64(x)), dtype)
    assert_close(out, expected, dtype, scale=0.0)


@fuzz_settings
@given(pair=broadcast_pairs(), swap=st.booleans(), op=op_spellings(BinaryOp), dtype=dtypes,
       seed=seeds, specials=st.sampled_from([0.0, 0.2]))
def test_binary(pair, swap, op, dtype, seed, specials):
    a_shape, b_shape = pair[::-1] if swap else pair
    a = values(a_shape, dtype, seed, specials=specials)
    low = 0.25 if BinaryOp.parse(op) is BinaryOp.DIV else -2.0  # no overflow from tiny divisors
    b = values(b_shape, dtype, seed + 1, low=low, specials=specials)
    out = oxijax.binary(a, b, op)
    assert out.shape == np.broadcast_shapes(a_shape, b_shape) and out.dtype == a.dtype
    with np.errstate(all="ignore"):
        expected = rounded(BINARY_REFERENCE[BinaryOp.parse(op)](f64(a), f64(b)), dtype)
    assert_close(out, expected, dtype, scale=0.0)


@fuzz_settings
@given(shape=shapes(min_dims=1), data=st.data(), op=op_spellings(ReduceOp), dtype=dtypes,
       seed=seeds, specials=st.sampled_from([0.0, 0.0, 0.05]))
def test_reduce(shape, data, op, dtype, seed, specials):
    axis = data.draw(st.integers(-len(shape), len(shape) - 1), label="axis")
    if shape[axis] == 0 and ReduceOp.parse(op) in (ReduceOp.MAX, ReduceOp.MIN):
        i = axis % len(shape)  # an invalid draw (test_reduce_invalid): reduce one element
        shape = shape[:i] + (1,) + shape[i + 1:]
    x = values(shape, dtype, seed, specials=specials)
    out = oxijax.reduce(x, op, axis)
    with np.errstate(all="ignore"), warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # the mean of an empty axis is NaN
        expected = REDUCE_REFERENCE[ReduceOp.parse(op)](f64(x), axis=axis)
    assert out.shape == expected.shape and out.dtype == x.dtype
    assert_close(out, expected, dtype, scale=2.0 * np.sqrt(max(shape[axis], 1)))


@st.composite
def gemm_problems(draw):
    """Broadcast batch dims, m, n, k (with 0, 1 and ragged tiles), at most ~250k MACs."""
    batch_a, batch_b = draw(broadcast_pairs(max_size=6).filter(lambda p: max(map(len, p)) <= 3))
    batch = prod(np.broadcast_shapes(batch_a, batch_b)) or 1
    budget = 250_000 // batch
    m = draw(sides(min(129, budget)))
    n = draw(sides(min(129, budget // max(m, 1))))
    k = draw(sides(min(129, budget // max(m * n, 1))))
    return batch_a, batch_b, m, n, k


@fuzz_settings
@given(problem=gemm_problems(), trans_a=st.sampled_from(["N", "T", "C", "n", "t"]),
       trans_b=st.sampled_from(["N", "T", "C", "c"]), alpha=st.floats(-2, 2),
       beta=st.sampled_from([0.0, 0.0, 1.0, -0.5, 1.75]), c_form=st.sampled_from(["full", "row", "none"]),
       precision=st.sampled_from(["highest", "tf32"]), dtype=dtypes, seed=seeds)
def test_gemm(problem, trans_a, trans_b, alpha, beta, c_form, precision, dtype, seed):
    batch_a, batch_b, m, n, k = problem
    a = values((*batch_a, *((k, m) if trans_a in "TCtc" else (m, k))), dtype, seed)
    b = values((*batch_b, *((n, k) if trans_b in "TCtc" else (k, n))), dtype, seed + 1)
    out_shape = (*np.broadcast_shapes(batch_a, batch_b), m, n)
    # c broadcasts to the result; with beta == 0 it is not read, so NaN must not leak.
    c_shape = {"full": out_shape, "row": (1, n), "none": None}[c_form]
    c = None if c_shape is None else values(c_shape, dtype, seed + 2, specials=1.0 * (beta == 0))
    if c is None and beta != 0:
        beta = 0.0
    out = jit_gemm(a, b, c, trans_a=trans_a, trans_b=trans_b, alpha=alpha, beta=beta,
                   precision=precision)
    assert out.shape == out_shape and out.dtype == a.dtype
    op_a = np.swapaxes(f64(a), -1, -2) if trans_a in "TCtc" else f64(a)
    op_b = np.swapaxes(f64(b), -1, -2) if trans_b in "TCtc" else f64(b)
    expected = alpha * (op_a @ op_b) + (beta * f64(c) if beta else 0.0)
    assert_close(out, np.broadcast_to(expected, out_shape), dtype,
                 scale=4.0 * np.sqrt(k) + 2.0)


@st.composite
def conv_problems(draw):
    """N, C, H, W, K, R, S, stride, padding with the filter fitting the padded input."""
    stride = (draw(st.integers(1, 4)), draw(st.integers(1, 4)))
    padding = (draw(st.integers(0, 3)), draw(st.integers(0, 3)))
    r, s = draw(st.integers(1, 5)), draw(st.integers(1, 5))
    h = draw(sides(33).filter(lambda v: v + 2 * padding[0] >= r))
    w = draw(sides(33).filter(lambda v: v + 2 * padding[1] >= s))
    p = (h + 2 * padding[0] - r) // stride[0] + 1
    q = (w + 2 * padding[1] - s) // stride[1] + 1
    budget = 150_000 // (p * q * r * s)
    c = draw(sides(min(33, max(budget, 1))))
    k = draw(sides(min(33, max(budget // max(c, 1), 1))))
    n = draw(sides(min(3, max(budget // max(c * k, 1), 1))))
    return (n, c, h, w), (k, c, r, s), stride, padding


@fuzz_settings
@given(problem=conv_problems(), int_args=st.booleans(), dtype=dtypes, seed=seeds)
def test_conv2d(problem, int_args, dtype, seed):
    x_shape, w_shape, stride, padding = problem
    x, w = values(x_shape, dtype, seed), values(w_shape, dtype, seed + 1)
    # An int stands for both sides (only when they agree).
    stride_arg = stride[0] if int_args and stride[0] == stride[1] else stride
    padding_arg = padding[0] if int_args and padding[0] == padding[1] else padding
    out = jit_conv2d(x, w, stride=stride_arg, padding=padding_arg)
    expected = conv_reference(x, w, stride, padding)
    assert out.shape == expected.shape and out.dtype == x.dtype
    scale = 4.0 * np.sqrt(x_shape[1] * w_shape[2] * w_shape[3]) + 1.0
    assert_close(out, expected, dtype, scale=scale)


@st.composite
def attention_problems(draw):
    """B, H, Sq, Skv, D with Sq != Skv as often as not, at most ~400k score terms."""
    b, h = draw(sides(3)), draw(sides(3))
    budget = 400_000 // max(b * h, 1)
    sq = draw(sides(min(129, budget)))
    skv = draw(sides(min(129, budget // max(sq, 1))))
    d = draw(sides(min(129, budget // max(sq * skv, 1)), minimum=1))
    return b, h, sq, skv, d


@fuzz_settings
@given(problem=attention_problems(), causal=st.booleans(),
       scale_factor=st.one_of(st.none(), st.floats(0.05, 2.0)), dtype=dtypes, seed=seeds)
def test_attention(problem, causal, scale_factor, dtype, seed):
    b, h, sq, skv, d = problem
    q = values((b, h, sq, d), dtype, seed)
    k = values((b, h, skv, d), dtype, seed + 1)
    v = values((b, h, skv, d), dtype, seed + 2)
    # scale is relative to 1/sqrt(D): larger ones make the softmax ill-conditioned.
    scale = None if scale_factor is None else scale_factor / np.sqrt(d)
    out = jit_attention(q, k, v, scale=scale, causal=causal)
    assert out.shape == q.shape and out.dtype == q.dtype
    if skv == 0:  # no key at all: every query row yields zeros
        expected = np.zeros(q.shape)
    else:
        expected = attention_reference(q, k, v, 1 / np.sqrt(d) if scale is None else scale, causal)
    factor = 1.0 if dtype in (jnp.float32, jnp.float64) else 2.0
    assert_close(out, expected, dtype, scale=2.0, factor=factor)


# -- invalid draws -------------------------------------------------------------------
# Each fault builds one bad call from a valid one: (call, exception type, message fragment).

bad_names = st.text(min_size=0, max_size=8).filter(lambda s: s.upper() not in {
    *UnaryOp.__members__, *BinaryOp.__members__, *ReduceOp.__members__})
bad_op_values = st.one_of(bad_names, st.integers(-3, 20), st.none(), st.floats(allow_nan=True))
bad_dtypes = st.sampled_from([np.int8, np.int32, np.int64, np.uint8, np.bool_, np.complex64])
not_arrays = st.sampled_from(["text", None, object(), {"a": 1}, b"bytes"])


def bad_dtype_array(draw, shape):
    """An array that no float promotes away: integers and bools are rejected on their
    own, only complex numbers also beside a float (float32 + int32 is float32)."""
    return jax.device_put(np.zeros(shape, draw(bad_dtypes)))


def complex_array(x):
    """x as complex64: beside a float it promotes to a complex result, a TypeError."""
    return recast(x, np.complex64)


def recast(x, dtype):
    """x in another dtype, converted on the host (astype would compile per shape)."""
    return jax.device_put(np.asarray(x).astype(np.dtype(dtype)))


def traced(fn, value):
    """fn(value) with value traced under jit (a static argument that is not static)."""
    return lambda: jax.jit(fn)(value)


def expect(case):
    call, error, fragment = case
    with pytest.raises(error, match=fragment):
        call()


def unary_fault(draw, kind):
    dtype = draw(dtypes)
    x = values(draw(shapes(max_size=64)), dtype, 0)
    if kind == "op":
        return (lambda: oxijax.unary(x, draw(bad_op_values))), ValueError, "op must be a UnaryOp"
    if kind == "dtype":
        bad = bad_dtype_array(draw, x.shape)
        return (lambda: oxijax.unary(bad, "relu")), TypeError, "x must have dtype"
    if kind == "not_array":
        return (lambda: oxijax.unary(draw(not_arrays), "exp")), TypeError, "x must be an array"
    raise AssertionError(kind)


@fuzz_settings
@given(data=st.data(), kind=st.sampled_from(["op", "dtype", "not_array"]))
def test_unary_invalid(data, kind):
    expect(unary_fault(data.draw, kind))


def non_broadcasting_pair(draw):
    """Two shapes with one right-aligned dimension of distinct sides, neither 1."""
    a, b = draw(broadcast_pairs(max_size=256))
    side, other = draw(st.lists(st.sampled_from([0, 2, 3, 5, 17]), min_size=2, max_size=2,
                                unique=True))
    where = draw(st.integers(0, min(len(a), len(b))))
    a = a[:len(a) - where] + (side,) + a[len(a) - where:]
    b = b[:len(b) - where] + (other,) + b[len(b) - where:]
    return a, b


def binary_fault(draw, kind):
    dtype = draw(dtypes)
    a_shape, b_shape = draw(broadcast_pairs(max_size=64))
    a, b = values(a_shape, dtype, 0), values(b_shape, dtype, 1)
    if kind == "op":
        return (lambda: oxijax.binary(a, b, draw(bad_op_values))), ValueError, "op must be a BinaryOp"
    if kind == "broadcast":
        a_shape, b_shape = non_broadcasting_pair(draw)
        a, b = values(a_shape, dtype, 0), values(b_shape, dtype, 1)
        return (lambda: oxijax.binary(a, b, "add")), ValueError, "do not broadcast"
    if kind == "mixed":
        b = complex_array(b)
        return (lambda: oxijax.binary(a, b, "mul")), TypeError, "b must have dtype"
    if kind == "dtype":
        bad = bad_dtype_array(draw, b_shape)
        return (lambda: oxijax.binary(bad, bad, "sub")), TypeError, "a must have dtype"
    if kind == "not_array":
        return (lambda: oxijax.binary(a, draw(not_arrays), "div")), TypeError, "b must be an array"
    raise AssertionError(kind)


@fuzz_settings
@given(data=st.data(), kind=st.sampled_from(["op", "broadcast", "mixed", "dtype", "not_array"]))
def test_binary_invalid(data, kind):
    expect(binary_fault(data.draw, kind))


def reduce_fault(draw, kind):
    dtype = draw(dtypes)
    shape = draw(shapes(min_dims=1, max_size=64))
    x = values(shape, dtype, 0)
    rank = len(shape)
    if kind == "op":
        return (lambda: oxijax.reduce(x, draw(bad_op_values), 0)), ValueError, "op must be a ReduceOp"
    if kind == "axis_range":
        axis = draw(st.one_of(st.integers(rank, rank + 40), st.integers(-rank - 40, -rank - 1)))
        return (lambda: oxijax.reduce(x, "sum", axis)), ValueError, f"axis {axis} is out of range"
    if kind == "axis_type":
        axis = draw(st.sampled_from([0.0, 1.5, True, None, "0", (0,), np.float32(0)]))
        return (lambda: oxijax.reduce(x, "mean", axis)), TypeError, "axis must be an int"
    if kind == "axis_traced":
        return traced(lambda a: oxijax.reduce(x, "sum", a), 0), TypeError, "axis must be an int"
    if kind == "scalar":
        scalar = values((), dtype, 0)
        return (lambda: oxijax.reduce(scalar, "sum", 0)), ValueError, "rank >= 1"
    if kind == "empty_axis":
        axis = draw(st.integers(0, rank - 1))
        empty = values(shape[:axis] + (0,) + shape[axis + 1:], dtype, 0)
        op = draw(st.sampled_from(["max", "min", ReduceOp.MAX, ReduceOp.MIN]))
        return (lambda: oxijax.reduce(empty, op, axis)), ValueError, "size 0 has no identity"
    if kind == "dtype":
        bad = bad_dtype_array(draw, shape)
        return (lambda: oxijax.reduce(bad, "sum", 0)), TypeError, "x must have dtype"
    raise AssertionError(kind)


@fuzz_settings
@given(data=st.data(), kind=st.sampled_from(["op", "axis_range", "axis_type", "axis_traced",
                                              "scalar", "empty_axis", "dtype"]))
def test_reduce_invalid(data, kind):
    expect(reduce_fault(data.draw, kind))


def gemm_fault(draw, kind):
    dtype = draw(dtypes)
    m, n, k = (draw(st.integers(1, 9)) for _ in range(3))
    a, b = values((m, k), dtype, 0), values((k, n), dtype, 1)
    c = values((m, n), dtype, 2)
    if kind == "rank":
        low = values(draw(shapes(max_dims=1, max_size=16)), dtype, 3)
        if draw(st.booleans()):
            return (lambda: oxijax.gemm(low, b)), ValueError, "a must have rank >= 2"
        return (lambda: oxijax.gemm(a, low)), ValueError, "b must have rank >= 2"
    if kind == "inner":
        k2 = draw(st.integers(0, 12).filter(lambda v: v != k))
        b2 = values((k2, n), dtype, 1)
        return (lambda: oxijax.gemm(a, b2)), ValueError, "inner dimensions differ"
    if kind == "trans":
        bad = draw(st.one_of(st.text(max_size=3).filter(lambda s: s.upper() not in "NTC" or not s),
                             st.integers(), st.none()))
        which = draw(st.sampled_from(["trans_a", "trans_b"]))
        return (lambda: oxijax.gemm(a, b, **{which: bad})), ValueError, f"{which} must be"
    if kind == "no_c":
        beta = draw(st.floats(-3, 3).filter(lambda v: v != 0))
        return (lambda: oxijax.gemm(a, b, beta=beta)), ValueError, "c is required"
    if kind == "c_shape":
        c2 = values((m + draw(st.integers(1, 3)), n), dtype, 2)
        return (lambda: oxijax.gemm(a, b, c2, beta=1.0)), ValueError, "does not broadcast"
    if kind == "batch":
        a3 = values((2, m, k), dtype, 0)
        b3 = values((draw(st.sampled_from([3, 4, 5])), k, n), dtype, 1)
        return (lambda: oxijax.gemm(a3, b3)), ValueError, "do not broadcast"
    if kind == "non_finite":
        which = draw(st.sampled_from(["alpha", "beta"]))
        value = draw(st.sampled_from([np.nan, np.inf, -np.inf]))
        return (lambda: oxijax.gemm(a, b, c, **{which: value})), ValueError, f"{which} must be finite"
    if kind == "not_number":
        which = draw(st.sampled_from(["alpha", "beta"]))
        value = draw(st.sampled_from(["x", None, [1.0], object()]))
        return (lambda: oxijax.gemm(a, b, c, **{which: value})), TypeError, f"{which} must be a number"
    if kind == "traced":
        which = draw(st.sampled_from(["alpha", "beta"]))
        return (traced(lambda s: oxijax.gemm(a, b, c, **{which: s}), 2.0), TypeError,
                f"{which} must be a static")
    if kind == "precision":
        bad = draw(st.sampled_from(["fast", "HIGHEST", "", "bf16", None]))
        return (lambda: oxijax.gemm(a, b, precision=bad)), ValueError, "precision must be"
    if kind == "mixed":
        if draw(st.booleans()):
            return (lambda: oxijax.gemm(a, complex_array(b))), TypeError, "b must have dtype"
        return (lambda: oxijax.gemm(a, b, complex_array(c), beta=1.0)), TypeError, "c must have dtype"
    if kind == "dtype":
        bad = bad_dtype_array(draw, (m, k))
        return (lambda: oxijax.gemm(bad, recast(b, bad.dtype))), TypeError, "a must have dtype"
    raise AssertionError(kind)


GEMM_FAULTS = ["rank", "inner", "trans", "no_c", "c_shape", "batch", "non_finite",
               "not_number", "traced", "precision", "mixed", "dtype"]


@fuzz_settings
@given(data=st.data(), kind=st.sampled_from(GEMM_FAULTS))
def test_gemm_invalid(data, kind):
    expect(gemm_fault(data.draw, kind))


def conv_fault(draw, kind):
    dtype = draw(dtypes)
    n, c, k = draw(st.integers(1, 3)), draw(st.integers(1, 4)), draw(st.integers(1, 4))
    h, wd = draw(st.integers(3, 9)), draw(st.integers(3, 9))
    r, s = draw(st.integers(1, 3)), draw(st.integers(1, 3))
    x, w = values((n, c, h, wd), dtype, 0), values((k, c, r, s), dtype, 1)
    if kind == "rank":
        shape = draw(shapes(max_dims=6, max_size=64).filter(lambda t: len(t) != 4))
        bad = values(shape, dtype, 2)
        if draw(st.booleans()):
            return (lambda: oxijax.conv2d(bad, w)), ValueError, "x must have rank 4"
        return (lambda: oxijax.conv2d(x, bad)), ValueError, "w must have rank 4"
    if kind == "channels":
        w2 = values((k, c + draw(st.integers(1, 3)), r, s), dtype, 1)
        return (lambda: oxijax.conv2d(x, w2)), ValueError, "channels differ"
    if kind == "stride_low":
        bad = draw(st.one_of(st.integers(-5, 0), st.tuples(st.integers(-3, 0), st.integers(1, 3)),
                             st.tuples(st.integers(1, 3), st.integers(-3, 0))))
        return (lambda: oxijax.conv2d(x, w, stride=bad)), ValueError, "stride must be >= 1"
    if kind == "padding_low":
        bad = draw(st.one_of(st.integers(-5, -1), st.tuples(st.integers(-3, -1), st.integers(0, 3))))
        return (lambda: oxijax.conv2d(x, w, padding=bad)), ValueError, "padding must be >= 0"
    if kind == "pair_form":
        which = draw(st.sampled_from(["stride", "padding"]))
        bad = draw(st.sampled_from([(1,), (1, 1, 1), [], (1.0, 1), (True, 1), ("1", 1), True]))
        return (lambda: oxijax.conv2d(x, w, **{which: bad})), ValueError, f"{which} must be an int or a pair"
    if kind == "pair_type":
        which = draw(st.sampled_from(["stride", "padding"]))
        bad = draw(st.sampled_from([1.0, None, 2.5]))
        return (lambda: oxijax.conv2d(x, w, **{which: bad})), TypeError, f"{which} must be an int or a pair"
    if kind == "mixed":
        return (lambda: oxijax.conv2d(x, complex_array(w))), TypeError, "w must have dtype"
    if kind == "dtype":
        bad = bad_dtype_array(draw, x.shape)
        return (lambda: oxijax.conv2d(bad, recast(w, bad.dtype))), TypeError, "x must have dtype"
    raise AssertionError(kind)


@fuzz_settings
@given(data=st.data(), kind=st.sampled_from(["rank", "channels", "stride_low", "padding_low",
                                              "pair_form", "pair_type", "mixed", "dtype"]))
def test_conv2d_invalid(data, kind):
    expect(conv_fault(data.draw, kind))


def attention_fault(draw, kind):
    dtype = draw(dtypes)
    b, h, sq, skv, d = (draw(st.integers(1, 5)) for _ in range(5))
    q = values((b, h, sq, d), dtype, 0)
    k, v = values((b, h, skv, d), dtype, 1), values((b, h, skv, d), dtype, 2)
    if kind == "rank":
        shape = draw(shapes(max_dims=6, max_size=64).filter(lambda t: len(t) != 4))
        bad = values(shape, dtype, 3)
        which = draw(st.sampled_from(["q", "k", "v"]))
        args = {"q": q, "k": k, "v": v, which: bad}
        return (lambda: oxijax.attention(**args)), ValueError, f"{which} must have rank 4"
    if kind == "kv_mismatch":
        axis = draw(st.sampled_from([0, 1, 3]))
        shape = list(k.shape)
        shape[axis] += draw(st.integers(1, 3))
        k2, v2 = values(shape, dtype, 1), values(shape, dtype, 2)
        return (lambda: oxijax.attention(q, k2, v2)), ValueError, "must match q"
    if kind == "k_v_differ":
        v2 = values((b, h, skv + draw(st.integers(1, 3)), d), dtype, 2)
        return (lambda: oxijax.attention(q, k, v2)), ValueError, "must have one shape"
    if kind == "scale_low":
        scale = draw(st.one_of(st.floats(max_value=0.0, allow_nan=False, allow_infinity=False),
                               st.just(-0.0)))
        return (lambda: oxijax.attention(q, k, v, scale=scale)), ValueError, "scale must be positive"
    if kind == "scale_non_finite":
        scale = draw(st.sampled_from([np.nan, np.inf, -np.inf]))
        return (lambda: oxijax.attention(q, k, v, scale=scale)), ValueError, "scale must be finite"
    if kind == "scale_traced":
        return traced(lambda s: oxijax.attention(q, k, v, scale=s), 0.5), TypeError, "scale must be a static"
    if kind == "causal":
        causal = draw(st.sampled_from([1, 0, "yes", None, np.bool_(True)]))
        return (lambda: oxijax.attention(q, k, v, causal=causal)), TypeError, "causal must be a bool"
    if kind == "causal_traced":
        return traced(lambda c: oxijax.attention(q, k, v, causal=c), True), TypeError, "causal must be a bool"
    if kind == "mixed":
        which = draw(st.sampled_from(["k", "v"]))
        args = {"q": q, "k": k, "v": v}
        args[which] = complex_array(args[which])
        return (lambda: oxijax.attention(**args)), TypeError, f"{which} must have dtype"
    if kind == "no_head_dim":
        q0, k0 = values((b, h, sq, 0), dtype, 0), values((b, h, skv, 0), dtype, 1)
        return (lambda: oxijax.attention(q0, k0, k0)), ValueError, "head_dim of 0 has no default scale"
    if kind == "dtype":
        bad = bad_dtype_array(draw, q.shape)
        k2, v2 = recast(k, bad.dtype), recast(v, bad.dtype)
        return (lambda: oxijax.attention(bad, k2, v2)), TypeError, "q must have dtype"
    raise AssertionError(kind)


ATTENTION_FAULTS = ["rank", "kv_mismatch", "k_v_differ", "scale_low", "scale_non_finite",
                    "scale_traced", "causal", "causal_traced", "mixed", "no_head_dim", "dtype"]


@fuzz_settings
@given(data=st.data(), kind=st.sampled_from(ATTENTION_FAULTS))
def test_attention_invalid(data, kind):
    expect(attention_fault(data.draw, kind))


# -- gradients (lighter: half the profile's draws) ----------------------------------
# vjp through oxijax (one jitted program per shape) against analytic NumPy float64
# gradients, in float32 and float64; inputs stay off kinks, ties and poles.

light_settings = settings(fuzz_settings,
                          max_examples=max(settings.default.max_examples // 2, 10))
grad_dtypes = st.sampled_from([jnp.float32, jnp.float64])
UNARY_DERIVATIVE = {
    UnaryOp.RELU: lambda x: (x > 0) * 1.0,
    UnaryOp.SIGMOID: lambda x: np.exp(-x) / (1 + np.exp(-x)) ** 2,
    UnaryOp.TANH: lambda x: 1 - np.tanh(x) ** 2,
    UnaryOp.EXP: np.exp,
    UnaryOp.LOG: lambda x: 1 / x,
    UnaryOp.SQRT: lambda x: 0.5 / np.sqrt(x),
    UnaryOp.ABS: np.sign,
    UnaryOp.NEG: lambda x: -np.ones_like(x),
}
BINARY_PARTIALS = {  # (d/da, d/db)
    BinaryOp.ADD: (lambda a, b: np.ones_like(a), lambda a, b: np.ones_like(b)),
    BinaryOp.SUB: (lambda a, b: np.ones_like(a), lambda a, b: -np.ones_like(b)),
    BinaryOp.MUL: (lambda a, b: b, lambda a, b: a),
    BinaryOp.DIV: (lambda a, b: 1 / b, lambda a, b: -a / b**2),
    BinaryOp.MAX: (lambda a, b: (a > b) * 1.0, lambda a, b: (b > a) * 1.0),
    BinaryOp.MIN: (lambda a, b: (a < b) * 1.0, lambda a, b: (b < a) * 1.0),
}


@functools.lru_cache(maxsize=None)
def jit_vjp(fn, **static):
    """A jitted (primals, cotangent) -> gradients of fn(*primals, **static)."""
    def pullback(primals, cotangent):
        return jax.vjp(lambda *p: fn(*p, **static), *primals)[1](cotangent)
    return jax.jit(pullback)


def unbroadcast(grad, shape):
    """Sums grad over the axes that broadcasting added or stretched from 1 to shape."""
    grad = grad.sum(axis=tuple(range(grad.ndim - len(shape))))
    return grad.sum(axis=tuple(i for i, s in enumerate(shape) if s == 1), keepdims=True)


def off_kinks(x, low):
    """Moves values within 0.1 of 0 (relu, abs, div's pole) or below low away."""
    x = np.where(np.abs(x) < 0.1, 0.5, x)
    return np.maximum(x, low)


@light_settings
@given(shape=shapes(max_dims=3, max_size=512), op=st.sampled_from(list(UnaryOp)),
       dtype=grad_dtypes, seed=seeds)
def test_unary_vjp(shape, op, dtype, seed):
    low = 0.3 if op in (UnaryOp.LOG, UnaryOp.SQRT) else -np.inf
    x = off_kinks(f64(values(shape, dtype, seed)), low).astype(dtype)
    g = f64(values(shape, dtype, seed + 1))
    (dx,) = jit_vjp(oxijax.unary, op=op)((jax.device_put(x),), jax.device_put(g.astype(dtype)))
    assert_close(dx, g * UNARY_DERIVATIVE[op](f64(x)), dtype, factor=4.0)


@light_settings
@given(pair=broadcast_pairs(max_size=512), op=st.sampled_from(list(BinaryOp)),
       dtype=grad_dtypes, seed=seeds)
def test_binary_vjp(pair, op, dtype, seed):
    a = f64(values(pair[0], dtype, seed))
    b = off_kinks(f64(values(pair[1], dtype, seed + 1)), -np.inf).astype(dtype)
    out_shape = np.broadcast_shapes(a.shape, b.shape)
    g = f64(values(out_shape, dtype, seed + 2))
    primals = (jax.device_put(a.astype(dtype)), jax.device_put(b))
    da, db = jit_vjp(oxijax.binary, op=op)(primals, jax.device_put(g.astype(dtype)))
    partial_a, partial_b = BINARY_PARTIALS[op]
    a, b = np.broadcast_to(a, out_shape), np.broadcast_to(f64(b), out_shape)
    assert_close(da, unbroadcast(g * partial_a(a, b), pair[0]).reshape(pair[0]), dtype, factor=4.0)
    assert_close(db, unbroadcast(g * partial_b(a, b), pair[1]).reshape(pair[1]), dtype, factor=4.0)


@light_settings
@given(shape=shapes(min_dims=1, max_dims=3, max_size=512, min_side=1), data=st.data(),
       op=st.sampled_from(list(ReduceOp)), dtype=grad_dtypes, seed=seeds)
def test_reduce_vjp(shape, data, op, dtype, seed):
    axis = data.draw(st.integers(0, len(shape) - 1), label="axis")
    x = f64(values(shape, dtype, seed))
    g = np.expand_dims(f64(values(shape[:axis] + shape[axis + 1:], dtype, seed + 1)), axis)
    (dx,) = jit_vjp(oxijax.reduce, op=op, axis=axis)((jax.device_put(x.astype(dtype)),),
                                                      jax.device_put(g.squeeze(axis).astype(dtype)))
    if op is ReduceOp.SUM:
        expected = np.broadcast_to(g, shape)
    elif op is ReduceOp.MEAN:
        expected = np.broadcast_to(g / shape[axis], shape)
    else:  # the gradient goes to the extremum (ties have probability ~0 here)
        pick = np.argmax if op is ReduceOp.MAX else np.argmin
        expected = g * (np.arange(shape[axis]).reshape([-1] + [1] * (len(shape) - axis - 1))
                        == np.expand_dims(pick(x, axis=axis), axis))
    assert_close(dx, expected, dtype, factor=4.0)


@light_settings
@given(batch=broadcast_pairs(max_size=4).filter(lambda p: max(map(len, p)) <= 2),
       m=sides(33, minimum=1), n=sides(33, minimum=1), k=sides(33, minimum=1),
       trans_a=st.sampled_from("NT"), trans_b=st.sampled_from("NT"), alpha=st.floats(-2, 2),
       beta=st.sampled_from([0.0, 1.5]), dtype=grad_dtypes, seed=seeds)
def test_gemm_vjp(batch, m, n, k, trans_a, trans_b, alpha, beta, dtype, seed):
    a_shape = (*batch[0], *((k, m) if trans_a == "T" else (m, k)))
    b_shape = (*batch[1], *((n, k) if trans_b == "T" else (k, n)))
    out_shape = (*np.broadcast_shapes(batch[0], batch[1]), m, n)
    a, b, c = (f64(values(s, dtype, seed + i)) for i, s in enumerate((a_shape, b_shape, out_shape)))
    g = f64(values(out_shape, dtype, seed + 3))
    primals = tuple(jax.device_put(t.astype(dtype)) for t in ((a, b, c) if beta else (a, b)))
    grads = jit_vjp(oxijax.gemm, trans_a=trans_a, trans_b=trans_b, alpha=alpha, beta=beta)(
        primals, jax.device_put(g.astype(dtype)))
    op_a = np.swapaxes(a, -1, -2) if trans_a == "T" else a
    op_b = np.swapaxes(b, -1, -2) if trans_b == "T" else b
    d_op_a = alpha * g @ np.swapaxes(op_b, -1, -2)
    d_op_b = alpha * np.swapaxes(op_a, -1, -2) @ g
    d_a = np.swapaxes(d_op_a, -1, -2) if trans_a == "T" else d_op_a
    d_b = np.swapaxes(d_op_b, -1, -2) if trans_b == "T" else d_op_b
    scale = 4.0 * np.sqrt(max(m, n, k)) + 2.0
    assert_close(grads[0], unbroadcast(d_a, a_shape).reshape(a_shape), dtype, scale=scale, factor=4.0)
    assert_close(grads[1], unbroadcast(d_b, b_shape).reshape(b_shape), dtype, scale=scale, factor=4.0)
    if beta:
        assert_close(grads[2], beta * g, dtype, factor=4.0)
