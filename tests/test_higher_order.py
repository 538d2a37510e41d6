"""Derivatives of every order of unary, binary, reduce, gemm and conv2d: jax.hessian, a
third derivative and a Hessian-vector product, under jit, against the same
transformation of the jnp/lax reference (float64 tight, float32 and the half types at
their tolerance); the derivative programs run oxijax kernels only; and gradients are
bit-reproducible on XLA's multi-threaded CPU pool."""

import functools
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import assert_close, f64, random
from jax.flatten_util import ravel_pytree
from test_grad import (BINARY, CONV_CASES, GEMM_CASES, MATH, REDUCE, UNARY, binary_inputs,
                       conv_fn, conv_inputs, conv_reference, gemm_fn, gemm_inputs,
                       gemm_reference, primitives)

import oxijax
from oxijax import BinaryOp, ReduceOp, UnaryOp


def _derivatives(loss, args, directions, hvp=True):
    """jax.hessian, the third derivative along two directions (nested jax.grad: reverse
    over reverse over reverse) and (with hvp) a Hessian-vector product (jvp of grad) of
    loss, in all of args at once (flattened into one vector)."""
    flat, unravel = ravel_pytree(args)
    u, v = (ravel_pytree(d)[0] for d in directions)
    scalar = lambda z: loss(*unravel(z))  # noqa: E731

    def third(z):
        return jnp.vdot(v, jax.grad(lambda z: jnp.vdot(u, jax.grad(scalar)(z)))(z))

    hessian = jax.hessian(scalar)(flat)
    return (hessian, jax.grad(third)(flat),
            jax.jvp(jax.grad(scalar), (flat,), (u,))[1] if hvp else hessian @ u)


def _scalar(fn, w, *args):
    y = fn(*args)
    return jnp.sum(w * y * (1 + y))


def compare(cases):
    """For each (name, fn, reference, args): every derivative of a scalar function of
    fn's result, in float64 and float32, equals that of the same function of the
    reference's, computed in float64. The function, sum(w * y * (1 + y)), has higher
    derivatives for bilinear ops (gemm, conv2d) too. args are float32 (exact in both
    dtypes). One jit per dtype for all the cases, as compiling takes most of the time
    (so the reference's Hessian-vector product is its Hessian times the vector)."""
    inputs = []
    for _, fn, _, args in cases:
        weights = random(jax.eval_shape(fn, *args).shape, jnp.float32, 20)
        directions = [[random(x.shape, jnp.float32, 30 + 2 * i + j) for i, x in enumerate(args)]
                      for j in range(2)]
        inputs.append((weights, args, directions))

    def run(fns, dtype, hvp=True):
        def all_cases(inputs):
            return [_derivatives(functools.partial(_scalar, fn, w), args, directions, hvp)
                    for fn, (w, args, directions) in zip(fns, inputs)]
        return jax.jit(all_cases)(jax.tree.map(lambda x: x.astype(dtype), inputs))

    expected = run([case[2] for case in cases], jnp.float64, hvp=False)
    for dtype in (jnp.float64, jnp.float32):
        got = run([case[1] for case in cases], dtype)
        for (name, *_), got_case, expected_case in zip(cases, got, expected):
            for what, g, e in zip(("hessian", "third", "hvp"), got_case, expected_case):
                assert g.dtype == dtype
                try:
                    assert_close(g, f64(e), dtype, factor=4.0)
                except AssertionError as error:
                    raise AssertionError(f"{name}, {what}, {np.dtype(dtype)}: {error}") from None


# ---------------------------------------------------------------- each op


def test_unary():
    cases = []
    for op in UnaryOp:
        low = 0.3 if op in (UnaryOp.LOG, UnaryOp.SQRT) else -2.0
        x = random((5,), jnp.float32, int(op), low)
        cases.append((op.name, functools.partial(oxijax.unary, op=op), UNARY[op], (x,)))
    compare(cases)


def test_binary():
    """b broadcasts; max and min see ties (a[0] == b), where each side gets half."""
    cases = []
    for op in BinaryOp:
        a, b = binary_inputs(op, ((2, 3), (3,)), jnp.float32)
        cases.append((op.name, functools.partial(oxijax.binary, op=op), BINARY[op],
                      (a.at[0].set(b), b)))
    compare(cases)


def test_reduce():
    """Ties for max and min: a row of equal values and rows with two equal extremes."""
    x = random((3, 4), jnp.float32, 2)
    top = x[1:, 0].max() + 1
    x = x.at[0].set(x[0, 0]).at[1:, 2].set(top).at[1:, 3].set(top)
    compare([(op.name, functools.partial(oxijax.reduce, op=op, axis=1),
              functools.partial(REDUCE[op], axis=1), (x,)) for op in ReduceOp])


def test_gemm():
    """Both operands transposed; batch dims broadcast (a's, then both) with c and beta."""
    cases = [GEMM_CASES[i] for i in (1, 3, 4)]
    compare([(str(case), gemm_fn(*case[2:]), gemm_reference(*case[2:]),
              gemm_inputs(case, jnp.float32)) for case in cases])


def test_conv2d():
    """Strided (GEMM + col2im) and stride-1 (as a forward conv) data gradients."""
    compare([(str(case), conv_fn(*case[2:]), conv_reference(*case[2:]),
              conv_inputs(case, jnp.float32)) for case in (CONV_CASES[1], CONV_CASES[3])])


# ---------------------------------------------------------------- JAX's conventions

# Exact in every dtype: kinks, signed zeros, tiny, saturating and non-finite inputs.
SPECIAL = [-30.0, -3.0, -2.0**-10, 0.0, -0.0, 0.5, 2.0, 30.0, np.nan, np.inf, -np.inf]


def _unary_derivatives(unary, x):
    """The second and third derivatives of every unary op at each point of x."""
    def derivative(fn, order):
        for _ in range(order):
            fn = jax.grad(fn)
        return jax.vmap(fn)(x)
    return [derivative(functools.partial(unary, op=op), order)
            for op in UnaryOp for order in (2, 3)]


def test_unary_special_points():
    """Second and third derivatives at the kinks (relu and abs: 0 as in JAX), at 0 and
    -0 (log, sqrt: infinities of JAX's signs), outside the domain, at NaN and the
    infinities, and where half types overflow: what the jnp function's derivatives give
    in float64, rounded to the dtype."""
    points = np.array(SPECIAL)
    expected = jax.jit(functools.partial(_unary_derivatives, lambda s, op: UNARY[op](s)))(
        jnp.asarray(points))
    ox = jax.jit(functools.partial(_unary_derivatives,
                                   lambda s, op: oxijax.unary(s[None], op)[0]))
    for dtype in (jnp.float64, jnp.float32, jnp.float16, jnp.bfloat16):
        got = ox(jnp.asarray(points.astype(np.dtype(dtype))))
        for g, e in zip(got, expected):
            with np.errstate(over="ignore"):  # rounding to inf where the dtype overflows
                rounded = np.asarray(e).astype(np.dtype(dtype))
            # Point by point, with a floor of 1e-6 for what saturates: the second
            # derivative of sigmoid at 30 is 0 in float32 arithmetic, 9e-14 in float64.
            assert_close(g, f64(rounded), dtype, scale=1e-6, factor=2.0)


def test_composite_network():
    """A Newton step's ingredients for a small conv + MLP network (every op at once):
    the Hessian in the weights and a Hessian-vector product, against jnp/lax in float64;
    in float64 and bfloat16 (inputs exact in bfloat16)."""
    x = random((2, 2, 5, 5), jnp.bfloat16, 3)
    params = (random((3, 2, 3, 3), jnp.bfloat16, 4, -0.5, 0.5),
              random((27, 4), jnp.bfloat16, 5, -0.5, 0.5), random((4,), jnp.bfloat16, 6, 0.5, 1.0))

    def network(ops):
        conv, matmul, unary, add, mul, div, maximum, reduce = ops

        def loss(k, w, s):
            h = unary(conv(x.astype(k.dtype), k), "tanh").reshape(2, 27)
            z = add(matmul(h, w), unary(s, "sqrt"))
            z = maximum(unary(z, "sigmoid"), mul(unary(z, "exp"), 0.1))
            return reduce(reduce(div(unary(z, "log"), s), "max", 1), "mean", 0)

        def hessian_and_hvp(*p):
            return jax.hessian(loss, (0, 1, 2))(*p), jax.jvp(jax.grad(loss, (0, 1, 2)), p, p)[1]
        return jax.jit(hessian_and_hvp)

    ox = (lambda x, k: oxijax.conv2d(x, k), oxijax.matmul, oxijax.unary, oxijax.add,
          oxijax.mul, oxijax.div, oxijax.maximum, oxijax.reduce)
    funcs = {"tanh": jnp.tanh, "sqrt": jnp.sqrt, "sigmoid": jax.nn.sigmoid, "exp": jnp.exp,
             "log": jnp.log}
    reductions = {"max": jnp.max, "mean": jnp.mean}
    ref = (conv_reference((1, 1), (0, 0)), jnp.matmul, lambda x, op: funcs[op](x), jnp.add,
           jnp.multiply, jnp.divide, jnp.maximum, lambda x, op, axis: reductions[op](x, axis))
    expected = network(ref)(*(p.astype(jnp.float64) for p in params))
    for dtype in (jnp.float64, jnp.bfloat16):
        got = network(ox)(*(p.astype(dtype) for p in params))
        for g, e in zip(jax.tree.leaves(got), jax.tree.leaves(expected)):
            assert g.dtype == dtype
            assert_close(g, f64(e), dtype, factor=4.0)


# ---------------------------------------------------------------- oxijax kernels only


def _oxijax_loss(fn):
    """sum(fn(...)**2) in oxijax ops, so that only the derivatives' own ops are left."""
    def flat_sum(y):
        return oxijax.sum(y.reshape(-1), 0)
    return lambda *args: flat_sum(oxijax.mul(fn(*args), fn(*args)))


@pytest.mark.parametrize("name", ["unary", "binary", "reduce", "gemm", "conv2d"])
def test_derivatives_run_oxijax_kernels(name):
    """The Hessian-vector product and the third derivative are oxijax kernels, reshapes
    and broadcasts: no XLA arithmetic."""
    a, b = binary_inputs(BinaryOp.DIV, ((3, 4), (4,)), jnp.float32)
    x, w = conv_inputs(CONV_CASES[1], jnp.float32)
    fns = {
        "unary": (lambda a: oxijax.mul(oxijax.tanh(oxijax.sigmoid(a)),
                                       oxijax.log(oxijax.sqrt(oxijax.exp(a)))), (a,)),
        "binary": (lambda a, b: oxijax.minimum(oxijax.div(oxijax.mul(a, b), b), a), (a, b)),
        "reduce": (lambda a: oxijax.add(oxijax.max(a, 1), oxijax.mean(a, 1)), (a,)),
        "gemm": (lambda a, b: oxijax.gemm(a, b, trans_b="T"), (a, a[:2])),
        "conv2d": (conv_fn(*CONV_CASES[1][2:]), (x, w)),
    }
    fn, args = fns[name]
    loss, argnums = _oxijax_loss(fn), tuple(range(len(args)))

    def hvp(*args):
        return jax.jvp(jax.grad(loss, argnums), args, args)[1]

    def third(*args):
        return jax.grad(_oxijax_loss(jax.grad(loss, 0)), argnums)(*args)

    for derivative in (hvp, third):
        names = primitives(derivative, *args)
        assert not names & MATH, (derivative.__name__, names & MATH)
        assert any(n.startswith("oxijax_") for n in names)


# ---------------------------------------------------------------- determinism


def _xla_threads() -> int:
    """Threads of XLA:CPU's intra-op pool (the custom calls' ffi::ThreadPool); Linux."""
    tasks = "/proc/self/task"
    if not os.path.isdir(tasks):
        pytest.skip("counting XLA's threads needs Linux's /proc")
    return sum(open(f"{tasks}/{t}/comm").read().startswith("tf_XLAEigen")
               for t in os.listdir(tasks))


DETERMINISM = {  # large enough that each kernel splits its work among the threads
    "unary": (oxijax.tanh, [(300, 300)]),
    # b's gradient: a column sum split along the axis into partial sums
    "binary": (lambda a, b: oxijax.maximum(oxijax.div(a, b), a), [(300, 300), (300,)]),
    # b's gradient: row sums longer than one parallel chunk
    "binary_long_rows": (oxijax.mul, [(2, 3 << 16), (2, 1)]),
    "reduce": (lambda x: oxijax.add(oxijax.max(oxijax.mul(x, x), 1), oxijax.mean(x, 0)),
               [(256, 256)]),
    # an odd batch of big matrices: each split among the threads; b summed over the batch
    "gemm": (lambda a, b: oxijax.gemm(a, b, trans_b="T"), [(3, 192, 160), (192, 160)]),
    "conv2d": (lambda x, w: oxijax.conv2d(x, w, padding=1), [(16, 16, 24, 24), (16, 16, 3, 3)]),
    "conv2d_strided": (lambda x, w: oxijax.conv2d(x, w, stride=2),
                       [(24, 16, 24, 24), (16, 16, 3, 3)]),
}


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16], ids=["f32", "bf16"])
@pytest.mark.parametrize("name", list(DETERMINISM))
def test_gradients_are_bit_reproducible(name, dtype):
    """Three runs of a gradient on XLA's multi-threaded pool give the same bits."""
    fn, shapes = DETERMINISM[name]
    args = [random(shape, dtype, i, 0.1, 2.0) for i, shape in enumerate(shapes)]
    if name == "reduce":  # ties for max
        args[0] = args[0].at[:, 7].set(args[0][:, 3])
    argnums = tuple(range(len(args)))
    grad = jax.jit(jax.grad(lambda *a: oxijax.sum(fn(*a).reshape(-1), 0), argnums))
    runs = [grad(*args) for _ in range(3)]
    if _xla_threads() < 2:
        pytest.skip("XLA:CPU runs single-threaded on this machine")
    for run in runs[1:]:
        for first, again in zip(runs[0], run):
            np.testing.assert_array_equal(again, first)
