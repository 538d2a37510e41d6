"""unary and binary against NumPy float64 references (rounded once to the dtype)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import assert_close, f64, random

import oxijax
from oxijax import BinaryOp, UnaryOp

UNARY_REFERENCE = {
    UnaryOp.RELU: lambda x: np.where(np.isnan(x), x, np.maximum(x, 0.0)),
    UnaryOp.SIGMOID: lambda x: 1.0 / (1.0 + np.exp(-x)),
    UnaryOp.TANH: np.tanh,
    UnaryOp.EXP: np.exp,
    UnaryOp.LOG: np.log,
    UnaryOp.SQRT: np.sqrt,
    UnaryOp.ABS: np.abs,
    UnaryOp.NEG: np.negative,
}
BINARY_REFERENCE = {
    BinaryOp.ADD: np.add,
    BinaryOp.SUB: np.subtract,
    BinaryOp.MUL: np.multiply,
    BinaryOp.DIV: np.divide,
    BinaryOp.MAX: np.maximum,
    BinaryOp.MIN: np.minimum,
}
SHAPES = [(), (1,), (7,), (3, 5), (2, 3, 4), (1000,), (3, 1, 257)]


def rounded(values, dtype):
    """A float64 reference rounded once to dtype, as the kernels store it."""
    with np.errstate(all="ignore"):
        return np.asarray(values, np.float64).astype(np.dtype(dtype)).astype(np.float64)


def unary_input(op, shape, dtype, seed=0):
    low = 0.01 if op in (UnaryOp.LOG, UnaryOp.SQRT) else -4.0
    return random(shape, dtype, seed=seed, low=low, high=4.0)


@pytest.mark.parametrize("op", list(UnaryOp), ids=lambda o: o.name.lower())
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_unary_matches_numpy(op, shape, dtype):
    x = unary_input(op, shape, dtype)
    with np.errstate(all="ignore"):
        expected = rounded(UNARY_REFERENCE[op](f64(x)), dtype)
    actual = jax.jit(oxijax.unary, static_argnums=1)(x, op)
    assert actual.dtype == x.dtype and actual.shape == x.shape
    assert_close(actual, expected, dtype, scale=0.0)


SPECIAL = np.array([np.nan, np.inf, -np.inf, 0.0, -0.0, -1.0, 1.0, 1e-30, 88.0, -88.0, 1e4, -1e4])


@pytest.mark.parametrize("op", list(UnaryOp), ids=lambda o: o.name.lower())
def test_unary_special_values_like_jnp(op, dtype):
    x = jnp.asarray(SPECIAL, dtype=dtype)
    reference = {
        UnaryOp.RELU: jax.nn.relu, UnaryOp.SIGMOID: jax.nn.sigmoid, UnaryOp.TANH: jnp.tanh,
        UnaryOp.EXP: jnp.exp, UnaryOp.LOG: jnp.log, UnaryOp.SQRT: jnp.sqrt,
        UnaryOp.ABS: jnp.abs, UnaryOp.NEG: jnp.negative,
    }[op]
    # Rounded by XLA, as jnp rounds: XLA:CPU flushes denormal results to zero.
    expected = f64(reference(x.astype(jnp.float64)).astype(dtype))
    assert_close(oxijax.unary(x, op), expected, dtype, scale=0.0)


def test_unary_aliases_and_names():
    x = random((5,), jnp.float32)
    for op in UnaryOp:
        alias = getattr(oxijax, op.name.lower())
        np.testing.assert_array_equal(alias(x), oxijax.unary(x, op.name.lower()))


BROADCAST_PAIRS = [
    ((), ()), ((5,), ()), ((), (5,)), ((4, 5), (5,)), ((4, 1), (1, 5)), ((2, 3, 4), (3, 1)),
    ((2, 1, 4), (1, 3, 1)), ((1,), (7, 1)), ((3, 1, 2, 1, 5), (2, 4, 1)), ((1000,), (1000,)),
    ((2, 0, 3), (3,)),
    # 10 alternating broadcast dims: nothing merges (the CUDA kernel loops over the outer ones).
    ((3, 1) * 5, (1, 2) * 5),
]


@pytest.mark.parametrize("op", list(BinaryOp), ids=lambda o: o.name.lower())
@pytest.mark.parametrize("shapes", BROADCAST_PAIRS, ids=str)
def test_binary_broadcasting_matches_numpy(op, shapes, dtype):
    a = random(shapes[0], dtype, seed=1)
    b = random(shapes[1], dtype, seed=2, low=0.5 if op is BinaryOp.DIV else -2.0)
    expected = rounded(BINARY_REFERENCE[op](f64(a), f64(b)), dtype)
    actual = jax.jit(oxijax.binary, static_argnums=2)(a, b, op)
    assert actual.dtype == a.dtype
    assert_close(actual, expected, dtype, scale=0.0)


# 40 MiB outputs: above glibc's largest mmap threshold (32 MiB), so each is a fresh
# mapping whose pages the kernels map a chunk at a time (populate in elementwise.cc); a
# second call reuses nothing. Odd row length: chunks that end inside a row.
@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16], ids=["f32", "bf16"])
def test_large_fresh_outputs(dtype):
    rows = (40 << 20) // np.dtype(dtype).itemsize // 4099
    rng = np.random.default_rng(3)
    x = jnp.asarray(rng.standard_normal((rows, 4099), np.float32), dtype)
    row = jnp.asarray(rng.standard_normal(4099, np.float32), dtype)
    for _ in range(2):
        np.testing.assert_array_equal(f64(jax.jit(oxijax.relu)(x)), np.maximum(f64(x), 0.0))
        actual = jax.jit(lambda x, r: oxijax.binary(x, r, "max"))(x, row)
        np.testing.assert_array_equal(f64(actual), np.maximum(f64(x), f64(row)))


@pytest.mark.parametrize("op", list(BinaryOp), ids=lambda o: o.name.lower())
def test_binary_special_values_like_jnp(op, dtype):
    a = jnp.asarray(SPECIAL, dtype=dtype)
    b = jnp.asarray(np.roll(SPECIAL, 3), dtype=dtype)
    reference = {
        BinaryOp.ADD: jnp.add, BinaryOp.SUB: jnp.subtract, BinaryOp.MUL: jnp.multiply,
        BinaryOp.DIV: jnp.divide, BinaryOp.MAX: jnp.maximum, BinaryOp.MIN: jnp.minimum,
    }[op]
    expected = rounded(reference(a.astype(jnp.float64), b.astype(jnp.float64)), dtype)
    assert_close(oxijax.binary(a, b, op), expected, dtype, scale=0.0)


def test_binary_python_scalar_takes_array_dtype():
    x = random((3,), jnp.bfloat16)
    assert oxijax.mul(x, 2.0).dtype == jnp.bfloat16
    assert oxijax.sub(1.0, x).dtype == jnp.bfloat16
    np.testing.assert_array_equal(f64(oxijax.sub(1.0, x)), f64(1.0 - x))


def test_binary_aliases():
    a, b = random((4, 3), jnp.float32, 1), random((3,), jnp.float32, 2)
    for name, op in [("add", "add"), ("sub", "sub"), ("mul", "mul"), ("div", "div"),
                     ("maximum", "max"), ("minimum", "min")]:
        np.testing.assert_array_equal(getattr(oxijax, name)(a, b), oxijax.binary(a, b, op))


def test_elementwise_vmap_folds_into_one_call():
    a, b = random((6, 4, 3), jnp.float32, 1), random((4, 3), jnp.float32, 2)
    jaxpr = jax.make_jaxpr(jax.vmap(oxijax.add, in_axes=(0, None)))(a, b)
    calls = [e for e in jaxpr.eqns if e.primitive.name == "oxijax_binary"]
    assert len(calls) == 1
    np.testing.assert_allclose(jax.vmap(oxijax.add, in_axes=(0, None))(a, b), a + b)
    np.testing.assert_allclose(jax.vmap(oxijax.mul, in_axes=(1, 0))(a, b), jnp.swapaxes(a, 0, 1) * b[:, None])
    np.testing.assert_allclose(jax.vmap(oxijax.exp, in_axes=2)(a), jnp.moveaxis(jnp.exp(a), 2, 0), rtol=1e-6)
    nested = jax.vmap(jax.vmap(oxijax.sub, in_axes=(0, None)), in_axes=(0, None))(a, b[0])
    np.testing.assert_allclose(nested, a - b[0])


def test_binary_vmap_of_both_operands():
    a, b = random((5, 2, 3), jnp.float64, 1), random((5, 3), jnp.float64, 2)
    np.testing.assert_allclose(jax.vmap(oxijax.div)(a, b), a / b[:, None, :])
    c = random((2, 3), jnp.float64, 3)
    np.testing.assert_allclose(jax.jit(jax.vmap(oxijax.maximum, in_axes=(2, 1)))(a, c),
                               jnp.moveaxis(jnp.maximum(a, c[None]), 2, 0))


def test_zero_size_inputs():
    assert oxijax.relu(jnp.zeros((0, 3))).shape == (0, 3)
    assert oxijax.add(jnp.zeros((0, 3)), jnp.zeros((3,))).shape == (0, 3)


def test_eager_calls_match_traced_calls_and_traces_stay_flat():
    """Eager calls run through a cached jit (oxijax/_dispatch.py); under a trace, even
    with constant operands, the primitive itself shows in the jaxpr."""
    a, b = random((4, 3), jnp.float32, 1), random((3,), jnp.bfloat16, 2)
    np.testing.assert_array_equal(oxijax.mul(a, b), jax.jit(oxijax.mul)(a, b))
    for fn in (lambda: oxijax.mul(a, b), lambda: oxijax.sum(oxijax.exp(a), 0)):
        names = [e.primitive.name for e in jax.make_jaxpr(fn)().eqns]
        assert names[-1].startswith("oxijax_") and not any("jit" in n for n in names), names
