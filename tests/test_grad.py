"""Differentiation of gemm, conv2d, reduce, unary and binary: check_grads in float64
(forward and reverse mode), float32/bfloat16 gradients against jax.grad of the jnp
reference, JAX's tie and NaN conventions, jit, vmap, second derivatives, and the
backward passes running oxijax kernels. GPU variants skip without a GPU."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import assert_close, f64, random
from jax.test_util import check_grads

import oxijax
from oxijax import BinaryOp, ReduceOp, UnaryOp

UNARY = {
    UnaryOp.RELU: jax.nn.relu, UnaryOp.SIGMOID: jax.nn.sigmoid, UnaryOp.TANH: jnp.tanh,
    UnaryOp.EXP: jnp.exp, UnaryOp.LOG: jnp.log, UnaryOp.SQRT: jnp.sqrt, UnaryOp.ABS: jnp.abs,
    UnaryOp.NEG: jnp.negative,
}
BINARY = {
    BinaryOp.ADD: jnp.add, BinaryOp.SUB: jnp.subtract, BinaryOp.MUL: jnp.multiply,
    BinaryOp.DIV: jnp.divide, BinaryOp.MAX: jnp.maximum, BinaryOp.MIN: jnp.minimum,
}
REDUCE = {ReduceOp.SUM: jnp.sum, ReduceOp.MAX: jnp.max, ReduceOp.MIN: jnp.min,
          ReduceOp.MEAN: jnp.mean}
BROADCAST_PAIRS = [((3, 4), (3, 4)), ((3, 4), (4,)), ((2, 1, 3), (4, 1)), ((5,), ()),
                   ((1,), (2, 3))]
CONV_CASES = [  # (N, C, H, W), (K, R, S), stride, padding
    ((1, 1, 1, 1), (1, 1, 1), (1, 1), (0, 0)),
    ((2, 3, 7, 6), (4, 3, 2), (2, 3), (1, 2)),
    ((1, 2, 8, 7), (3, 2, 2), (3, 3), (0, 0)),  # rows and columns no window reads
    ((2, 2, 5, 5), (2, 3, 3), (1, 1), (1, 1)),
    ((2, 3, 9, 6), (4, 3, 2), (1, 1), (2, 0)),  # stride 1: data gradient as a forward conv
    ((1, 2, 4, 4), (2, 1, 2), (1, 1), (1, 2)),  # stride 1, padding >= filter: the GEMM path
]
GEMM_CASES = [  # a shape, b shape, trans_a, trans_b, beta
    ((3, 5), (5, 4), "N", "N", 0.0),
    ((5, 3), (4, 5), "T", "T", 0.0),
    ((2, 3, 5), (5, 4), "N", "N", 2.0),
    ((1, 5, 3), (2, 5, 4), "T", "N", 0.0),
    ((2, 1, 3, 5), (3, 4, 5), "N", "T", -1.5),
]


def unary_input(op, shape, dtype, seed=0):
    """Away from the kinks (0 for relu and abs) and inside log's and sqrt's domain."""
    low = 0.3 if op in (UnaryOp.LOG, UnaryOp.SQRT) else -2.0
    x = random(shape, jnp.float64, seed, low, 2.0)
    if op in (UnaryOp.RELU, UnaryOp.ABS):
        x = jnp.where(jnp.abs(x) < 0.1, 0.5, x)
    return x.astype(dtype)


def binary_inputs(op, shapes, dtype):
    a = random(shapes[0], jnp.float64, 1)
    b = random(shapes[1], jnp.float64, 2)
    if op is BinaryOp.DIV:
        b = jnp.where(jnp.abs(b) < 0.5, 1.5, b)
    return a.astype(dtype), b.astype(dtype)


def gemm_fn(trans_a, trans_b, beta):
    return lambda a, b, c: oxijax.gemm(a, b, c, trans_a=trans_a, trans_b=trans_b,
                                       alpha=0.7, beta=beta)


def gemm_reference(trans_a, trans_b, beta):
    def fn(a, b, c):
        t = lambda x, flag: jnp.swapaxes(x, -1, -2) if flag == "T" else x  # noqa: E731
        return 0.7 * jnp.matmul(t(a, trans_a), t(b, trans_b),
                                precision=jax.lax.Precision.HIGHEST) + beta * c
    return fn


def gemm_inputs(case, dtype):
    a_shape, b_shape, trans_a, trans_b, beta = case
    a, b = random(a_shape, dtype, 3), random(b_shape, dtype, 4)
    out = jax.eval_shape(gemm_reference(trans_a, trans_b, 0.0), a, b, 0.0).shape
    return a, b, random(out[-1:], dtype, 5)  # c broadcasts to the result


def conv_fn(stride, padding):
    return lambda x, w: oxijax.conv2d(x, w, stride=stride, padding=padding)


def conv_reference(stride, padding):
    return lambda x, w: jax.lax.conv_general_dilated(
        x, w, stride, [(p, p) for p in padding], precision=jax.lax.Precision.HIGHEST)


def conv_inputs(case, dtype):
    (n, c, h, w), (k, r, s), _, _ = case
    return random((n, c, h, w), dtype, 6), random((k, c, r, s), dtype, 7)


def check(fn, args, order=1):
    check_grads(fn, args, order, modes=("fwd", "rev"), atol=1e-6, rtol=1e-6)


# ---------------------------------------------------------------- float64 check_grads


@pytest.mark.parametrize("op", list(UnaryOp), ids=lambda o: o.name.lower())
def test_unary_check_grads(op):
    check(lambda x: oxijax.unary(x, op), (unary_input(op, (3, 5), jnp.float64),))


@pytest.mark.parametrize("op", list(BinaryOp), ids=lambda o: o.name.lower())
@pytest.mark.parametrize("shapes", BROADCAST_PAIRS, ids=str)
def test_binary_check_grads(op, shapes):
    check(lambda a, b: oxijax.binary(a, b, op), binary_inputs(op, shapes, jnp.float64))


@pytest.mark.parametrize("op", list(ReduceOp), ids=lambda o: o.name.lower())
@pytest.mark.parametrize("axis", [0, -1, 1])
def test_reduce_check_grads(op, axis):
    check(lambda x: oxijax.reduce(x, op, axis), (random((3, 4, 5), jnp.float64, 8),))


@pytest.mark.parametrize("case", GEMM_CASES, ids=str)
def test_gemm_check_grads(case):
    check(gemm_fn(*case[2:]), gemm_inputs(case, jnp.float64))


@pytest.mark.parametrize("case", CONV_CASES, ids=str)
def test_conv2d_check_grads(case):
    check(conv_fn(*case[2:]), conv_inputs(case, jnp.float64))


# ------------------------------------------- float32 / bfloat16 against jax.grad of jnp

LOW_DTYPES = [jnp.float32, jnp.bfloat16]


def compare_grads(fn, reference, args, dtype, factor=4.0):
    """vjp of fn and of the jnp reference (in float64) with one random cotangent."""
    out, vjp = jax.vjp(fn, *args)
    ct = random(out.shape, dtype, 9)
    got = vjp(ct)
    _, ref_vjp = jax.vjp(reference, *[jnp.asarray(f64(x)) for x in args])
    expected = ref_vjp(jnp.asarray(f64(ct)))
    for g, e, x in zip(got, expected, args):
        assert g.dtype == x.dtype and g.shape == x.shape
        assert_close(g, f64(e), dtype, factor=factor)


@pytest.mark.parametrize("dtype", LOW_DTYPES, ids=["f32", "bf16"])
@pytest.mark.parametrize("op", list(UnaryOp), ids=lambda o: o.name.lower())
def test_unary_grad_dtypes(op, dtype):
    x = unary_input(op, (7, 33), dtype)
    compare_grads(lambda x: oxijax.unary(x, op), UNARY[op], (x,), dtype)


@pytest.mark.parametrize("dtype", LOW_DTYPES, ids=["f32", "bf16"])
@pytest.mark.parametrize("op", list(BinaryOp), ids=lambda o: o.name.lower())
@pytest.mark.parametrize("shapes", [((6, 37), (37,)), ((3, 1, 5), (4, 1))], ids=str)
def test_binary_grad_dtypes(op, shapes, dtype):
    compare_grads(lambda a, b: oxijax.binary(a, b, op), BINARY[op],
                  binary_inputs(op, shapes, dtype), dtype, factor=8.0)


@pytest.mark.parametrize("dtype", LOW_DTYPES, ids=["f32", "bf16"])
@pytest.mark.parametrize("op", list(ReduceOp), ids=lambda o: o.name.lower())
def test_reduce_grad_dtypes(op, dtype):
    x = random((5, 129), dtype, 10)
    compare_grads(lambda x: oxijax.reduce(x, op, 1), lambda x: REDUCE[op](x, 1), (x,), dtype)


@pytest.mark.parametrize("dtype", LOW_DTYPES, ids=["f32", "bf16"])
@pytest.mark.parametrize("case", GEMM_CASES, ids=str)
def test_gemm_grad_dtypes(case, dtype):
    compare_grads(gemm_fn(*case[2:]), gemm_reference(*case[2:]), gemm_inputs(case, dtype), dtype)


@pytest.mark.parametrize("dtype", LOW_DTYPES, ids=["f32", "bf16"])
@pytest.mark.parametrize("case", CONV_CASES + [((2, 16, 12, 12), (8, 3, 3), (2, 2), (1, 1))],
                         ids=str)
def test_conv2d_grad_dtypes(case, dtype):
    compare_grads(conv_fn(*case[2:]), conv_reference(*case[2:]), conv_inputs(case, dtype), dtype)


FILTER_GRAD_CASES = [  # (N, C, H, W), (K, R, S), stride, padding
    ((3, 5, 23, 19), (7, 3, 3), (1, 1), (1, 1)),  # rows wrap and images end mid-vector
    ((2, 2, 64, 64), (3, 3, 3), (1, 1), (1, 1)),  # one task, several K blocks of pixels
    ((1, 256, 4, 4), (128, 3, 3), (1, 1), (1, 1)),  # few pixels: tasks split the columns
    ((4, 3, 6, 5), (2, 2, 3), (1, 1), (0, 1)),  # rows shorter than a vector: many runs
    ((3, 4, 17, 21), (5, 3, 3), (2, 2), (1, 1)),  # stride 2: a vector spans several rows
    ((2, 3, 9, 41), (4, 3, 3), (2, 2), (1, 1)),  # stride 2, runs of whole vectors
    ((2, 40, 9, 9), (33, 1, 1), (1, 1), (0, 0)),  # K and C*R*S past whole register tiles
    ((2, 3, 11, 13), (4, 3, 5), (1, 3), (3, 0)),  # padding rows, stride 3: lane by lane
    # The small cases again with K * C*R*S * N*P*Q of at least 40^3, where bfloat16 runs
    # on AMX's tiles rather than float FMAs (gemm_amx.h: kMinTileProduct).
    ((4, 3, 6, 5), (48, 2, 3), (1, 1), (0, 1)),
    ((3, 4, 17, 21), (40, 3, 3), (2, 2), (1, 1)),
    ((2, 3, 9, 41), (40, 3, 3), (2, 2), (1, 1)),
    ((2, 3, 11, 13), (40, 3, 5), (1, 3), (3, 0)),
]


@pytest.mark.parametrize("dtype", [jnp.float64, jnp.float32, jnp.bfloat16, jnp.float16],
                         ids=["f64", "f32", "bf16", "f16"])
@pytest.mark.parametrize("case", FILTER_GRAD_CASES, ids=str)
def test_conv2d_filter_gradient(case, dtype):
    """The filter gradient (a GEMM over every image's output pixels, packed straight from
    x and dy) against XLA's in float64, with a NaN in x reaching exactly the taps that
    read it."""
    x, w = conv_inputs(case, dtype)
    x = x.at[-1, 0, x.shape[2] // 2, 1].set(jnp.nan)
    ct = random(jax.eval_shape(conv_reference(*case[2:]), x, w).shape, dtype, 9)
    got = jax.vjp(lambda w: conv_fn(*case[2:])(x, w), w)[1](ct)[0]
    expected = jax.vjp(lambda w: conv_reference(*case[2:])(jnp.asarray(f64(x)), w),
                       jnp.asarray(f64(w)))[1](jnp.asarray(f64(ct)))[0]
    assert got.dtype == w.dtype and np.isnan(f64(got)).any()
    assert_close(got, f64(expected), dtype, factor=4.0)


def test_conv2d_filter_gradient_vmapped():
    """vmap over images and weights together folds into the kernel's groups (here with
    work enough for the tasks to split the pixels into partial sums)."""
    case = ((2, 8, 32, 32), (16, 3, 3), (1, 1), (1, 1))
    x, w = conv_inputs(case, jnp.float32)
    xs, ws = jnp.stack([x, -x, 0.5 * x]), jnp.stack([w, 2 * w, -w])
    loss = lambda conv: lambda x, w: (conv(*case[2:])(x, w) ** 2).sum()  # noqa: E731
    grad = lambda conv: jax.vmap(jax.grad(loss(conv), argnums=1))  # noqa: E731
    got = jax.jit(grad(conv_fn))(xs, ws)
    expected = grad(conv_reference)(jnp.asarray(f64(xs)), jnp.asarray(f64(ws)))
    assert_close(got, f64(expected), jnp.float32, factor=4.0)


# ---------------------------------------------------------------- JAX's conventions


def test_conventions_match_jax():
    """Kinks, ties and NaN give what jax.grad of the jnp function gives."""
    x = jnp.array([0.0, -0.0, 1.0, jnp.nan, -jnp.inf, 4.0])
    for op in UnaryOp:
        got = jax.grad(lambda x: oxijax.unary(x, op).sum())(x)
        expected = jax.grad(lambda x: UNARY[op](x).sum())(x)
        np.testing.assert_allclose(got, expected, rtol=1e-12, err_msg=op.name)
    a = jnp.array([1.0, 2.0, jnp.nan, 3.0])
    b = jnp.array([1.0, 3.0, 1.0, jnp.nan])
    for op in (BinaryOp.MAX, BinaryOp.MIN):
        got = jax.grad(lambda a, b: oxijax.binary(a, b, op).sum(), (0, 1))(a, b)
        expected = jax.grad(lambda a, b: BINARY[op](a, b).sum(), (0, 1))(a, b)
        np.testing.assert_array_equal(got, expected)
    x = jnp.array([[1.0, 3.0, 3.0, 0.0], [2.0, jnp.nan, 1.0, 1.0], [5.0, 5.0, 5.0, 5.0]])
    for op in (ReduceOp.MAX, ReduceOp.MIN):
        g = jnp.arange(3.0)
        got = jax.vjp(lambda x: oxijax.reduce(x, op, 1), x)[1](g)[0]
        expected = jax.vjp(lambda x: REDUCE[op](x, 1), x)[1](g)[0]
        np.testing.assert_array_equal(got, expected)
        got = jax.jvp(lambda x: oxijax.reduce(x, op, 1), (x,), (x + 1,))[1]
        expected = jax.jvp(lambda x: REDUCE[op](x, 1), (x,), (x + 1,))[1]
        np.testing.assert_array_equal(got, expected)


def test_zero_size():
    a, b = jnp.ones((0, 3)), jnp.ones((3,))
    ga, gb = jax.grad(lambda a, b: oxijax.mul(a, b).sum(), (0, 1))(a, b)
    assert ga.shape == (0, 3) and gb.shape == (3,) and not gb.any()
    gx = jax.grad(lambda x: oxijax.conv2d(x, jnp.ones((2, 3, 1, 1))).sum())(jnp.ones((0, 3, 2, 2)))
    assert gx.shape == (0, 3, 2, 2)


# ---------------------------------------------------------------- jit, vmap, order 2


def test_jit_and_vmap():
    x, w = conv_inputs(CONV_CASES[1], jnp.float64)
    stride, padding = CONV_CASES[1][2:]
    loss = lambda x, w: oxijax.sum(oxijax.tanh(conv_fn(stride, padding)(x, w)).reshape(-1), 0)  # noqa: E731
    ref = lambda x, w: jnp.tanh(conv_reference(stride, padding)(x, w)).sum()  # noqa: E731
    got = jax.jit(jax.grad(loss, (0, 1)))(x, w)
    for g, e in zip(got, jax.grad(ref, (0, 1))(x, w)):
        assert_close(g, f64(e), jnp.float64)
    # vmap over a batch of x (w shared), of w (x shared) and of both.
    xs, ws = jnp.stack([x, 2 * x]), jnp.stack([w, -w])
    for axes in [(0, None), (None, 0), (0, 0)]:
        args = (xs if axes[0] is not None else x, ws if axes[1] is not None else w)
        got = jax.vmap(jax.grad(loss, (0, 1)), axes)(*args)
        expected = jax.vmap(jax.grad(ref, (0, 1)), axes)(*args)
        for g, e in zip(got, expected):
            assert_close(g, f64(e), jnp.float64)
    a, b = binary_inputs(BinaryOp.MAX, ((4, 3), (3,)), jnp.float64)
    got = jax.vmap(jax.grad(lambda a, b: oxijax.sum(oxijax.maximum(a, b), 0).sum(), (0, 1)))(a, a)
    expected = jax.vmap(jax.grad(lambda a, b: jnp.maximum(a, b).sum(), (0, 1)))(a, a)
    for g, e in zip(got, expected):
        assert_close(g, f64(e), jnp.float64)
    a, b, c = gemm_inputs(GEMM_CASES[2], jnp.float64)
    loss = lambda a, b, c: gemm_fn(*GEMM_CASES[2][2:])(a, b, c).sum()  # noqa: E731
    ref = lambda a, b, c: gemm_reference(*GEMM_CASES[2][2:])(a, b, c).sum()  # noqa: E731
    got = jax.vmap(jax.grad(loss, (0, 1, 2)), (0, None, None))(jnp.stack([a, -a]), b, c)
    expected = jax.vmap(jax.grad(ref, (0, 1, 2)), (0, None, None))(jnp.stack([a, -a]), b, c)
    for g, e in zip(got, expected):
        assert_close(g, f64(e), jnp.float64)


def test_second_derivatives():
    """The jvp rules compose: order 2 in both modes (every order: test_higher_order.py)."""
    x, w = conv_inputs(CONV_CASES[1], jnp.float64)
    check(conv_fn(*CONV_CASES[1][2:]), (x, w), order=2)
    check(gemm_fn(*GEMM_CASES[2][2:]), gemm_inputs(GEMM_CASES[2], jnp.float64), order=2)
    for op in BinaryOp:
        check(lambda a, b: oxijax.binary(a, b, op), binary_inputs(op, ((3, 4), (4,)), jnp.float64),
              order=2)
    for op in ReduceOp:
        check(lambda x: oxijax.reduce(x, op, 1), (random((3, 4), jnp.float64, 11),), order=2)
    for op in UnaryOp:
        check(lambda x: oxijax.unary(x, op), (unary_input(op, (3, 4), jnp.float64),), order=2)


# ---------------------------------------------------------------- oxijax kernels only

MATH = {"mul", "div", "add", "sub", "neg", "max", "min", "exp", "log", "tanh", "logistic",
        "sqrt", "abs", "select_n", "dot_general", "conv_general_dilated", "reduce_sum",
        "reduce_max", "reduce_min", "integer_pow", "sign"}


def primitives(fn, *args):
    names = set()

    def walk(jaxpr):
        for eqn in jaxpr.eqns:
            names.add(eqn.primitive.name)
            for sub in jax.core.subjaxprs(eqn) if hasattr(jax.core, "subjaxprs") else []:
                walk(sub)
            for param in eqn.params.values():
                if hasattr(param, "jaxpr"):
                    walk(param.jaxpr)

    walk(jax.make_jaxpr(fn)(*args).jaxpr)
    return names


@pytest.mark.parametrize("name", ["unary", "binary", "reduce", "gemm", "conv2d"])
def test_backward_runs_oxijax_kernels(name):
    x, w = conv_inputs(CONV_CASES[1], jnp.float32)
    a, b = binary_inputs(BinaryOp.DIV, ((3, 4), (4,)), jnp.float32)
    fns = {
        "unary": (lambda a: oxijax.tanh(a), (a,)),
        "binary": (lambda a, b: oxijax.minimum(oxijax.div(oxijax.mul(a, b), b), a), (a, b)),
        "reduce": (lambda a: oxijax.add(oxijax.max(a, 1), oxijax.mean(a, 1)), (a,)),
        "gemm": (lambda a, b: oxijax.gemm(a, b, trans_b="T"), (a, a[:2])),
        "conv2d": (conv_fn(*CONV_CASES[1][2:]), (x, w)),
    }
    fn, args = fns[name]

    def grads(*args):
        out, vjp = jax.vjp(fn, *args)
        return vjp(out)

    names = primitives(grads, *args)
    assert not names & MATH, names & MATH
    assert any(n.startswith("oxijax_") for n in names)
    if name == "conv2d":
        assert {"oxijax_conv2d_backward_data", "oxijax_conv2d_backward_filter"} <= names


# ---------------------------------------------------------------- GPU


def on(device, *arrays):
    return [jax.device_put(x, device) for x in arrays]


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16, jnp.float64], ids=["f32", "bf16", "f64"])
def test_gpu_grads(dtype, gpu):
    """Every op's gradient on the GPU equals the jnp reference's (and the CPU's)."""
    cpu = jax.devices("cpu")[0]
    cases = [(lambda x, op=op: oxijax.unary(x, op), UNARY[op], (unary_input(op, (5, 67), dtype),))
             for op in UnaryOp]
    cases += [(lambda a, b, op=op: oxijax.binary(a, b, op), BINARY[op],
               binary_inputs(op, ((6, 37), (37,)), dtype)) for op in BinaryOp]
    cases += [(lambda x, op=op: oxijax.reduce(x, op, 1), lambda x, op=op: REDUCE[op](x, 1),
               (random((5, 129), dtype, 10),)) for op in ReduceOp]
    cases += [(gemm_fn(*c[2:]), gemm_reference(*c[2:]), gemm_inputs(c, dtype)) for c in GEMM_CASES]
    conv = CONV_CASES + [((4, 32, 20, 20), (16, 3, 3), (2, 2), (1, 1)),
                         ((8, 8, 32, 32), (8, 5, 5), (1, 1), (2, 2))]
    cases += [(conv_fn(*c[2:]), conv_reference(*c[2:]), conv_inputs(c, dtype)) for c in conv]
    for fn, reference, args in cases:
        compare_grads(jax.jit(fn), reference, on(gpu, *args), dtype, factor=8.0)
        out, vjp = jax.vjp(jax.jit(fn), *on(gpu, *args))
        ct = random(out.shape, dtype, 9)
        gpu_grads = vjp(jax.device_put(ct, gpu))
        assert all(g.devices() == {gpu} for g in gpu_grads)
        cpu_grads = jax.vjp(jax.jit(fn), *on(cpu, *args))[1](jax.device_put(ct, cpu))
        for g, c in zip(gpu_grads, cpu_grads):
            assert_close(g, f64(c), dtype, factor=8.0)
