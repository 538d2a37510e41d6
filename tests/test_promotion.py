"""Dtype promotion and weak types as in jax.numpy: every op's result dtype and weak_type
against the jnp/lax op's in the same trace (jax.eval_shape: no compilation), over the
four float dtypes, integers, Python scalars and weak-typed traced values; a promoted
dtype outside the four floats is a TypeError naming the argument."""

import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import assert_close, random

import oxijax
from oxijax._checks import SUPPORTED_DTYPES

FLOATS = {"f16": jnp.float16, "bf16": jnp.bfloat16, "f32": jnp.float32, "f64": jnp.float64}
# Operand kinds: arrays of each dtype, Python scalars (constants of the trace) and a
# weak-typed traced value (a Python float passed to the traced function).
ARRAYS = {**FLOATS, "i32": jnp.int32, "i64": jnp.int64, "bool": jnp.bool_, "c64": jnp.complex64}
KINDS = [*ARRAYS, "weak", "py_float", "py_int"]


def operand(kind, shape, weak):
    """An operand of `kind` inside the trace; `weak` is the traced weak scalar."""
    if kind == "weak":
        return jnp.broadcast_to(weak, shape)
    if kind in ("py_float", "py_int"):
        return 1.5 if kind == "py_float" else 2
    return jnp.ones(shape, ARRAYS[kind])


def typed(fn, kinds, shapes):
    """(dtype, weak_type) of fn's result on operands of these kinds, or the exception
    type it raises."""
    def traced(weak):
        return fn(*(operand(k, s, weak) for k, s in zip(kinds, shapes)))

    try:
        out = jax.eval_shape(traced, 1.5)
    except (TypeError, ValueError) as error:
        return type(error), str(error)
    return np.dtype(out.dtype), out.weak_type


def check_table(ours, reference, kind_lists, shapes, names):
    """For every combination of operand kinds: our dtype and weak_type are jnp's where
    jnp's dtype is one of the four floats; elsewhere a TypeError naming an argument
    whose own dtype is not a float."""
    for kinds in itertools.product(*kind_lists):
        expected = typed(reference, kinds, shapes)
        got = typed(ours, kinds, shapes)
        if isinstance(expected[0], np.dtype) and expected[0] in SUPPORTED_DTYPES:
            assert got == expected, (kinds, got, expected)
        else:
            assert got[0] is TypeError, (kinds, got, expected)
            named = next(n for n, k in zip(names, kinds) if k not in FLOATS and k not in
                         ("weak", "py_float"))
            assert f"{named} must have dtype" in got[1], (kinds, got)


BINARY = [("add", jnp.add), ("sub", jnp.subtract), ("mul", jnp.multiply),
          ("div", jnp.divide), ("maximum", jnp.maximum), ("minimum", jnp.minimum)]


@pytest.mark.parametrize("name,reference", BINARY, ids=[b[0] for b in BINARY])
def test_binary_promotion_table(name, reference):
    # One promotion for all; div's differs for integers (jnp.divide gives floats).
    kinds = KINDS if name in ("add", "div") else [*FLOATS, "i32", "c64", "weak", "py_float"]
    check_table(getattr(oxijax, name), reference, [kinds, kinds], [(2, 3), (3,)], "ab")


def test_gemm_promotion_table():
    kinds = [*ARRAYS, "weak"]
    check_table(oxijax.matmul, jnp.matmul, [kinds, kinds], [(2, 3), (3, 4)], "ab")
    check_table(lambda a, b: oxijax.gemm(a, b, trans_b="T"), lambda a, b: a @ b.T,
                [kinds, kinds], [(2, 3), (4, 3)], "ab")
    # c joins the promotion (beta * c, as jnp would): one row of a and b per c kind
    check_table(lambda a, b, c: oxijax.gemm(a, b, c, beta=1.0), lambda a, b, c: a @ b + c,
                [["bf16", "weak"], ["f16", "weak"], kinds], [(2, 3), (3, 4), (4,)], "abc")


def test_conv2d_promotion_table():
    # lax.conv wants one dtype; oxijax promotes x and w as jnp would add them
    kinds = [*ARRAYS, "weak"]
    check_table(oxijax.conv2d, jnp.add, [kinds, kinds], [(1, 2, 3, 3), (1, 2, 3, 3)], "xw")


def test_attention_promotion_table():
    """dtype of jnp.result_type(q, k, v); never weak, like jax.nn.dot_product_attention."""

    def reference(q, k, v):
        return jnp.add(q, jnp.add(k, v)).astype(jnp.result_type(q, k, v))  # strong

    q, kinds = (1, 2, 4, 8), [*FLOATS, "i32", "c64", "weak"]
    check_table(oxijax.attention, reference, [kinds, kinds, ["f16", "c64", "weak"]], [q, q, q],
                "qkv")


UNARY = [("relu", jax.nn.relu), ("sigmoid", jax.nn.sigmoid), ("tanh", jnp.tanh),
         ("exp", jnp.exp), ("log", jnp.log), ("sqrt", jnp.sqrt), ("abs", jnp.abs),
         ("neg", jnp.negative)]
REDUCE = [("sum", jnp.sum), ("max", jnp.max), ("min", jnp.min), ("mean", jnp.mean)]


@pytest.mark.parametrize("name,reference", UNARY + REDUCE, ids=[u[0] for u in UNARY + REDUCE])
def test_single_operand_dtypes_like_jnp(name, reference):
    """exp(int32) is float32 as in jnp, relu(int32) an int32 in jnp: a TypeError here;
    reductions are strongly typed like jnp's."""
    kinds = [*ARRAYS, "weak"]
    if name == "abs":  # jnp.abs(complex64) is float32; oxijax has no complex kernels
        kinds.remove("c64")
        with pytest.raises(TypeError, match="x must have dtype"):
            oxijax.abs(jnp.ones(3, jnp.complex64))
    ours = getattr(oxijax, name)
    if (name, reference) in REDUCE:  # over axis 0 of a vector (no Python scalars)
        ours, reference = (lambda x: getattr(oxijax, name)(x, 0)), (lambda x, f=reference: f(x, 0))
    else:
        kinds += ["py_float", "py_int"]
    check_table(ours, reference, [kinds], [(3,)], "x")


def test_mixed_precision_values_match_jnp():
    g = random((5,), jnp.bfloat16)
    step = jax.jit(lambda g, lr: oxijax.mul(g, lr))(g, 1e-3)
    assert step.dtype == jnp.bfloat16
    np.testing.assert_array_equal(step, jax.jit(jnp.multiply)(g, 1e-3))
    a, b = random((4, 3), jnp.float32, 1), random((3,), jnp.bfloat16, 2)
    np.testing.assert_array_equal(oxijax.add(a, b), jnp.add(a, b))
    both = oxijax.add(1.0, 2.0)
    assert both.weak_type and both.dtype == jnp.add(1.0, 2.0).dtype and float(both) == 3.0
    x, w = random((2, 3, 6, 6), jnp.float16, 3), random((4, 3, 3, 3), jnp.float32, 4)
    assert_close(oxijax.conv2d(x, w),
                 jax.lax.conv(x.astype(jnp.float32), w, (1, 1), "VALID"), jnp.float32)
    m = random((5, 3), jnp.float16, 5)
    assert_close(oxijax.matmul(m, a.T), jnp.matmul(m, a.T), jnp.float32)
    q = random((1, 2, 4, 8), jnp.float32, 6)
    assert_close(oxijax.attention(q, q.astype(jnp.bfloat16), q),
                 oxijax.attention(q, q.astype(jnp.bfloat16).astype(jnp.float32), q), jnp.float32)
    assert_close(oxijax.exp(jnp.arange(3)), jnp.exp(jnp.arange(3)), jnp.float64)
