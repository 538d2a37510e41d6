"""reduce against NumPy float64 references, every axis position, NaN and empty axes."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import assert_close, f64, random

import oxijax
from oxijax import ReduceOp

REFERENCE = {ReduceOp.SUM: np.sum, ReduceOp.MAX: np.max, ReduceOp.MIN: np.min, ReduceOp.MEAN: np.mean}
CASES = [((1,), 0), ((7,), 0), ((7,), -1), ((3, 5), 0), ((3, 5), 1), ((2, 3, 4), 1),
         ((4, 1, 6), 1), ((2, 3, 5, 7), 2), ((1, 1), 0), ((33, 129), 0), ((33, 129), 1),
         ((5000,), 0), ((2, 3000, 3), 1)]


@pytest.mark.parametrize("op", list(ReduceOp), ids=lambda o: o.name.lower())
@pytest.mark.parametrize("shape,axis", CASES, ids=str)
def test_reduce_matches_numpy(op, shape, axis, dtype):
    x = random(shape, dtype, seed=3)
    expected = REFERENCE[op](f64(x), axis=axis)
    actual = jax.jit(oxijax.reduce, static_argnums=(1, 2))(x, op, axis)
    assert actual.dtype == x.dtype
    # Sums are accurate relative to the magnitude of their terms, not of the result.
    terms = np.max(np.abs(f64(x)), initial=0.0)
    if op is ReduceOp.SUM:
        terms *= np.sqrt(x.shape[axis])
    assert_close(actual, expected, dtype, scale=terms)


# Row lengths around the contiguous-row kernel's blocks (16 float32 lanes, 32 bfloat16
# elements; a bfloat16 sum pads a shorter one), its MAX / MIN vectors (the last one
# overlapping; rows of 1 to 7 elements are read by two overlapping loads of 2, 4 or 8
# bytes) and its short-row limit (4 KiB, read one row after another, 16 rows per call);
# 37 rows: two calls of 16 and five rows alone.
ROW_LENGTHS = [1, 2, 3, 4, 5, 7, 8, 15, 16, 17, 24, 31, 32, 33, 63, 64, 65, 100, 257, 1023, 1024,
               1025, 2049]


def test_rows_of_every_short_length(dtype):
    xs = []
    for n in ROW_LENGTHS:
        x = np.array(random((37, n), dtype, seed=n), np.float64)
        x[n % 37, n // 2] = np.nan  # one row with a NaN, at a different place each time
        x[(n + 2) % 37, n - 1] = -np.nan  # and one with a NaN of sign 1, last
        x[(n + 1) % 37, :] = -0.0
        xs.append(jax.device_put(x.astype(np.dtype(dtype))))
    ops = list(ReduceOp)
    results = jax.jit(lambda xs: [[oxijax.reduce(x, op, 1) for op in ops] for x in xs])(xs)
    for n, x, row in zip(ROW_LENGTHS, xs, results):
        for op, actual in zip(ops, row):
            expected = REFERENCE[op](f64(x), axis=1)
            terms = np.nanmax(np.abs(f64(x))) * (np.sqrt(n) if op is ReduceOp.SUM else 1)
            assert_close(actual, expected, dtype, scale=terms)
            if op is ReduceOp.SUM:  # a sum of zeros is +0, as XLA's (its init value is +0)
                assert not np.signbit(f64(actual)[(n + 1) % 37]), (n, op)


# MAX / MIN read an x that fits the L3 row after row, a larger one (cache_info.h caps the
# L3 at 32 MiB) eight rows or 128 KiB chunks side by side: 40 MiB, rows of 32 KiB and of
# 1 MiB (chunked), NaN of either sign in some rows, a row's extremum in its last element.
@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16], ids=["f32", "bf16"])
@pytest.mark.parametrize("row_bytes", [1 << 15, 1 << 20], ids=["32KiB", "1MiB"])
def test_max_min_of_an_x_larger_than_the_l3(row_bytes, dtype):
    itemsize = np.dtype(dtype).itemsize
    n = row_bytes // itemsize
    x = np.random.default_rng(7).standard_normal((40 << 20) // row_bytes * n, np.float32)
    x = x.reshape(-1, n)
    x[3, n // 3] = np.nan
    x[17, n - 1] = -np.nan
    x[5, n - 1], x[6, n - 1] = 100.0, -100.0
    x = jnp.asarray(x, dtype)
    for name in ("max", "min"):
        actual = f64(jax.jit(getattr(oxijax, name), static_argnums=1)(x, 1))
        np.testing.assert_array_equal(actual, getattr(np, name)(f64(x), axis=1))


@pytest.mark.parametrize("op", [ReduceOp.MAX, ReduceOp.MIN, ReduceOp.SUM, ReduceOp.MEAN],
                         ids=lambda o: o.name.lower())
def test_nan_propagates_like_jnp(op, dtype):
    x = np.arange(12.0).reshape(3, 4)
    x[1, 2] = np.nan
    x = jnp.asarray(x, dtype=dtype)
    for axis in (0, 1):
        expected = f64(getattr(jnp, op.name.lower())(x.astype(jnp.float64), axis=axis))
        assert_close(oxijax.reduce(x, op, axis), expected, dtype)


def test_infinities(dtype):
    x = jnp.asarray([[np.inf, 1.0], [-np.inf, 2.0], [np.inf, -np.inf]], dtype=dtype)
    np.testing.assert_array_equal(f64(oxijax.max(x, 1)), [np.inf, 2.0, np.inf])
    np.testing.assert_array_equal(f64(oxijax.min(x, 1)), [1.0, -np.inf, -np.inf])
    np.testing.assert_array_equal(np.isnan(f64(oxijax.sum(x, 0))), [True, False])


def test_empty_axis():
    x = jnp.zeros((3, 0, 2), jnp.float32)
    np.testing.assert_array_equal(oxijax.sum(x, 1), np.zeros((3, 2)))
    assert np.all(np.isnan(oxijax.mean(x, 1)))
    for op in ("max", "min"):
        with pytest.raises(ValueError, match="size 0"):
            oxijax.reduce(x, op, 1)
    assert oxijax.sum(x, 0).shape == (0, 2)
    assert oxijax.max(x, 2).shape == (3, 0)


@pytest.mark.parametrize("dtype", [jnp.float16, jnp.bfloat16], ids=["f16", "bf16"])
def test_half_types_accumulate_in_float32(dtype):
    # 4096 ones: a float16 / bfloat16 accumulator would stall at 2048 / 256.
    x = jnp.ones((4096,), dtype)
    assert f64(oxijax.sum(x, 0)) == 4096.0
    np.testing.assert_array_equal(f64(oxijax.mean(x, 0)), 1.0)


def test_large_float32_sum_is_accurate():
    x = random((1 << 22,), jnp.float32, seed=5, low=0.0, high=1.0)
    expected = np.sum(f64(x))
    assert abs(float(oxijax.sum(x, 0)) - expected) <= 1e-5 * expected


def test_aliases_and_negative_axis():
    x = random((3, 4, 5), jnp.float32)
    for name in ("sum", "max", "min", "mean"):
        np.testing.assert_array_equal(getattr(oxijax, name)(x, -2), oxijax.reduce(x, name, 1))


def test_vmap_keeps_batch_axis_in_place():
    x = random((4, 5, 6), jnp.float64)
    for in_axis in range(3):
        for axis in range(2):
            got = jax.vmap(lambda t: oxijax.sum(t, axis), in_axes=in_axis)(x)
            want = jnp.sum(jnp.moveaxis(x, in_axis, 0), axis=axis + 1)
            np.testing.assert_allclose(got, want, rtol=1e-12)
    jaxpr = jax.make_jaxpr(jax.vmap(lambda t: oxijax.mean(t, 0), in_axes=2))(x)
    names = [e.primitive.name for e in jaxpr.eqns]
    assert names.count("oxijax_reduce") == 1 and "reduce_sum" not in names
