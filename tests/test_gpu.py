"""The CUDA kernels: each op against the float64 reference and against the CPU kernels,
over every dtype and awkward shapes, in two modes (the `target` fixture):

- ``gpu``: on the first CUDA device; skipped without one (OXIJAX_REQUIRE_GPU=1 turns the
  skips into failures). Marked `gpu` (scripts/gpu_check.sh runs ``-m gpu``).
- ``interp``: on the CPU, the CUDA handlers and kernels run in the CUDA interpreter
  (every memory access checked: bounds, shared-memory races, uninitialised reads,
  misalignment); skipped when the build has none (OXIJAX_REQUIRE_INTERPRETER=1 turns that
  into a failure). Marked `cuda_interpret`. The interpreter runs each CUDA thread as a
  fiber, so by default it takes a subset of each list: every op, dtype and kernel path,
  the largest shapes replaced by smaller ones that take the same path (about 40 s with
  -n 2 on two cores); HYPOTHESIS_PROFILE=slow takes every case (a few minutes).

The CPU kernels' results are computed before the interpreter is entered (it replaces
them while active), and every interpreted run must have launched a CUDA kernel."""

import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import assert_close, f64, random, require_interpreter
from test_attention import reference as attention_reference
from test_attention_grad import expected_grads as attention_expected_grads
from test_attention_grad import inputs as attention_grad_inputs
from test_conv2d import CASES as CONV_CASES
from test_conv2d import reference as conv_reference
from test_elementwise import BINARY_REFERENCE, BROADCAST_PAIRS, UNARY_REFERENCE, rounded, unary_input
from test_grad import BINARY as BINARY_GRAD_REFERENCE
from test_grad import CONV_CASES as CONV_GRAD_CASES
from test_grad import GEMM_CASES as GEMM_GRAD_CASES
from test_grad import REDUCE as REDUCE_GRAD_REFERENCE
from test_grad import UNARY as UNARY_GRAD_REFERENCE
from test_grad import binary_inputs, conv_fn, conv_inputs, gemm_fn, gemm_inputs, gemm_reference
from test_grad import conv_reference as conv_grad_reference
from test_grad import unary_input as unary_grad_input
from test_reduce import REFERENCE as REDUCE_REFERENCE

import oxijax
from oxijax import BinaryOp, ReduceOp, UnaryOp

# HYPOTHESIS_PROFILE=slow (conftest): the interpreter takes every case, not a subset.
SLOW = os.environ.get("HYPOTHESIS_PROFILE") == "slow"

GPU = pytest.param("gpu", marks=pytest.mark.gpu, id="gpu")
INTERP = pytest.param("interp", marks=pytest.mark.cuda_interpret, id="interp")


class Target:
    """Where a test's oxijax ops run: `device`, through the CUDA interpreter when
    `interp` (its module) is set."""

    def __init__(self, device, interp=None):
        self.device, self.interp = device, interp

    @property
    def interpreted(self):
        return self.interp is not None

    def run(self, fn, *args):
        """jax.jit(fn) on the target's device (in the interpreter, when interpreted: it
        must launch at least one CUDA kernel unless `fn` has an empty output)."""
        args = on(self.device, *args)
        if not self.interpreted:
            out = jax.jit(fn)(*args)
        else:
            assert not self.interp.take_launched_kernels(), "kernels ran outside the interpreter"
            self.interp.take_reports()
            with oxijax.cuda_interpreter(schedule="shuffle", seed=0):
                out = jax.block_until_ready(jax.jit(fn)(*args))
            assert not self.interp.take_reports()
            launched = self.interp.take_launched_kernels()
            empty = all(leaf.size == 0 for leaf in jax.tree.leaves(out))
            assert launched or empty, "no CUDA kernel ran in the interpreter"
        assert all(leaf.devices() == {self.device} for leaf in jax.tree.leaves(out))
        return out


@pytest.fixture(params=[GPU, INTERP])
def target(request):
    """The GPU (the `gpu` fixture's skips), or the CPU through the CUDA interpreter."""
    if request.param == "gpu":
        return Target(request.getfixturevalue("gpu"))
    interp = require_interpreter()
    interp.take_launched_kernels()  # earlier tests' launches (the log is per process)
    interp.take_reports()
    return Target(jax.devices("cpu")[0], interp)


def cases(names, full, quick, slow=None):
    """parametrize(names) over (target, *case): every case of `full` on the GPU; in the
    interpreter, the cases of `quick` by default, with HYPOTHESIS_PROFILE=slow those of
    `slow` (default: `full`). A single name takes bare values, several take tuples."""
    single = "," not in names
    params = []
    for mode, chosen in (("gpu", full), ("interp", (slow or full) if SLOW else quick)):
        marks = pytest.mark.gpu if mode == "gpu" else pytest.mark.cuda_interpret
        for case in chosen:
            values = (case,) if single else case
            params.append(pytest.param(mode, *values, marks=marks, id=f"{mode}-{case}"))
    return pytest.mark.parametrize("target," + names, params, indirect=["target"])


def both_modes(fn):
    return pytest.mark.parametrize("target", [GPU, INTERP], indirect=True)(fn)


def on(device, *arrays):
    return [jax.device_put(x, device) for x in arrays]


def run_both(fn, target, *args):
    """fn jitted on the target and on the CPU (the CPU kernels: in the interpreter mode,
    computed first, before the interpreter is entered); the target's result must live on
    the target's device."""
    cpu = jax.devices("cpu")[0]
    if target.interpreted:
        cpu_out = jax.jit(fn)(*on(cpu, *args))
        return target.run(fn, *args), cpu_out
    gpu_out = target.run(fn, *args)
    cpu_out = jax.jit(fn)(*on(cpu, *args))
    return gpu_out, cpu_out


def run_on(target, fn, *args):
    """fn jitted on the target, for tests that need no CPU kernels' result: on the GPU
    also run on the CPU (run_both, as ever); in the interpreter only interpreted."""
    if target.interpreted:
        return target.run(fn, *args)
    return run_both(fn, target, *args)[0]


UNARY_SHAPES = [(1,), (7,), (3, 5), (1000003,)]


@pytest.mark.parametrize("op", list(UnaryOp), ids=lambda o: o.name.lower())
# (20011,): several blocks, an unaligned vector body and a tail, as (1000003,).
@cases("shape", UNARY_SHAPES, quick=[(1,), (7,), (3, 5), (20011,)])
def test_unary(op, shape, dtype, target):
    x = unary_input(op, shape, dtype)
    with np.errstate(all="ignore"):
        expected = rounded(UNARY_REFERENCE[op](f64(x)), dtype)
    out, cpu_out = run_both(lambda x: oxijax.unary(x, op), target, x)
    assert_close(out, expected, dtype, scale=0.0, factor=2.0)
    assert_close(out, f64(cpu_out), dtype, scale=0.0, factor=2.0)


BINARY_PAIRS = BROADCAST_PAIRS + [((4097, 1, 3), (1, 1025, 1))]
# The large pair (12.6M outputs: a grid-stride loop) takes seconds a case in the
# interpreter; a smaller one takes the same rank-3, one-element-per-item kernel.
BINARY_QUICK = BROADCAST_PAIRS + [((129, 1, 3), (1, 257, 1))]


@pytest.mark.parametrize("op", list(BinaryOp), ids=lambda o: o.name.lower())
@cases("shapes", BINARY_PAIRS, quick=BINARY_QUICK)
def test_binary(op, shapes, dtype, target):
    a = random(shapes[0], dtype, seed=1)
    b = random(shapes[1], dtype, seed=2, low=0.5 if op is BinaryOp.DIV else -2.0)
    out = run_on(target, lambda a, b: oxijax.binary(a, b, op), a, b)
    assert_close(out, rounded(BINARY_REFERENCE[op](f64(a), f64(b)), dtype), dtype, scale=0.0)


REDUCE_CASES = [((1,), 0), ((7,), 0), ((33, 129), 0), ((33, 129), 1), ((3, 1 << 20), 1),
                ((1 << 16, 3), 0), ((2, 5000, 7), 1), ((1 << 22,), 0), ((5, 1, 3), 1)]
# Smaller rows of the split (multi-block, workspace) row and whole-array reductions.
REDUCE_QUICK = [case for case in REDUCE_CASES if case[0] not in ((3, 1 << 20), (1 << 22,))]
REDUCE_QUICK += [((3, 1 << 16), 1), ((1 << 18,), 0)]


@pytest.mark.parametrize("op", list(ReduceOp), ids=lambda o: o.name.lower())
@cases("shape,axis", REDUCE_CASES, quick=REDUCE_QUICK)
def test_reduce(op, shape, axis, dtype, target):
    x = random(shape, dtype, seed=3)
    out = run_on(target, lambda x: oxijax.reduce(x, op, axis), x)
    terms = 2.0 * (np.sqrt(shape[axis]) if op is ReduceOp.SUM else 1.0)
    assert_close(out, REDUCE_REFERENCE[op](f64(x), axis=axis), dtype, scale=terms)


@both_modes
def test_reduce_nan_propagates(target):
    x = jnp.asarray(np.arange(12.0).reshape(3, 4), jnp.float32).at[1, 2].set(jnp.nan)
    for op in ("max", "min", "sum"):
        out = f64(target.run(lambda x: oxijax.reduce(x, op, 1), x))
        np.testing.assert_array_equal(np.isnan(out), [False, True, False])


# (40, 24, 4100) and (5, 300, 2999): few output tiles and a long k, split over blocks.
GEMM_SIZES = [(1, 1, 1), (3, 5, 7), (17, 33, 65), (64, 64, 64), (129, 257, 300), (1000, 1, 513),
              (40, 24, 4100), (5, 300, 2999)]
# Smaller analogues of the two large sizes: ragged tiles in m and n and more k-tiles than
# pipeline stages; several m-tiles, n = 1 and an odd k (unaligned rows); split-K.
GEMM_QUICK = GEMM_SIZES[:4] + [(129, 130, 100), (300, 1, 129), (40, 24, 1100)]


@pytest.mark.parametrize("trans", ["NN", "NT", "TN", "TT"])
@cases("m,n,k", GEMM_SIZES, quick=GEMM_QUICK)
def test_gemm(m, n, k, trans, dtype, target):
    ta, tb = trans
    a = random((k, m) if ta == "T" else (m, k), dtype, 1)
    b = random((n, k) if tb == "T" else (k, n), dtype, 2)
    c = random((m, n), dtype, 3)
    fn = lambda a, b, c: oxijax.gemm(a, b, c, trans_a=ta, trans_b=tb, alpha=0.5, beta=2.0)  # noqa: E731
    out = run_on(target, fn, a, b, c)
    op_a = f64(a).T if ta == "T" else f64(a)
    op_b = f64(b).T if tb == "T" else f64(b)
    assert_close(out, 0.5 * op_a @ op_b + 2.0 * f64(c), dtype, scale=2.0 * np.sqrt(k) + 4.0)


# (2, 1) * 4 against (1, 2) * 4: eight batch dims that cannot merge, more than one
# launch indexes, so the host loops over the outer ones.
BATCHES = [((4,), (4,)), ((3,), ()), ((2, 1), (1, 3)), ((2, 1) * 4, (1, 2) * 4)]
# Seven batch dims also exceed what one launch indexes: two launches, not four.
BATCHES_QUICK = BATCHES[:3] + [((2, 1) * 3 + (2,), (1, 2) * 3 + (1,))]


@cases("batch_a,batch_b", BATCHES, quick=BATCHES_QUICK)
def test_batched_gemm(batch_a, batch_b, dtype, target):
    a, b = random((*batch_a, 37, 19), dtype, 1), random((*batch_b, 19, 45), dtype, 2)
    out = run_on(target, oxijax.matmul, a, b)
    assert_close(out, f64(a) @ f64(b), dtype, scale=4.0 * np.sqrt(19))


@both_modes
def test_gemm_beta_zero_never_reads_c(target):
    a, b = random((40, 30), jnp.float32, 1), random((30, 20), jnp.float32, 2)
    c = jnp.full((40, 20), jnp.nan, jnp.float32)
    out = target.run(lambda a, b, c: oxijax.gemm(a, b, c), a, b, c)
    assert not np.isnan(f64(out)).any()


@both_modes
def test_gemm_tf32_mode_is_close(target):
    a, b = random((256, 512), jnp.float32, 1), random((512, 128), jnp.float32, 2)
    out = target.run(lambda a, b: oxijax.gemm(a, b, precision="tf32"), a, b)
    expected = f64(a) @ f64(b)
    assert np.max(np.abs(f64(out) - expected)) <= 2e-3 * np.sqrt(512) * 4


@both_modes
def test_attention_tf32_mode_is_close(target):
    """float32 attention on TF32 tensor cores (opt-in), head dims up to 128 (padded)."""
    for d in (20, 128):
        q, k, v = (random((1, 2, s, d), jnp.float32, i) for i, s in enumerate((70, 50, 50)))
        fn = lambda q, k, v: oxijax.attention(q, k, v, causal=True, precision="tf32")  # noqa: E731
        out = target.run(fn, q, k, v)
        expected = attention_reference(q, k, v, 1 / np.sqrt(d), True)
        assert np.max(np.abs(f64(out) - expected)) <= 4e-3


@cases("x_shape,w_shape,stride,padding", CONV_CASES, quick=CONV_CASES)
def test_conv2d(x_shape, w_shape, stride, padding, dtype, target):
    x = random(x_shape, dtype, seed=1)
    k, r, s = w_shape
    w = random((k, x_shape[1], r, s), dtype, seed=2)
    out = run_on(target, lambda x, w: oxijax.conv2d(x, w, stride=stride, padding=padding), x, w)
    assert_close(out, conv_reference(x, w, stride, padding), dtype,
                 scale=4.0 * np.sqrt(x_shape[1] * r * s))


ATTENTION_SHAPES = [(1, 1, 1, 1, 1), (2, 3, 5, 7, 16), (1, 2, 63, 65, 64), (2, 2, 130, 127, 128),
                    (1, 1, 200, 3, 64), (1, 1, 3, 200, 256), (1, 1, 17, 29, 3), (1, 2, 600, 600, 128),
                    (1, 2, 70, 50, 80), (1, 1, 33, 97, 200)]
# Several query tiles and key tiles (ragged) without the two largest sizes; head dims
# padded on tensor cores (80 -> 128, 200 -> 256).
ATTENTION_QUICK = (ATTENTION_SHAPES[:3] + [(1, 2, 130, 127, 128)] + ATTENTION_SHAPES[4:7]
                   + ATTENTION_SHAPES[8:])


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@cases("b,h,sq,skv,d", ATTENTION_SHAPES, quick=ATTENTION_QUICK)
def test_attention(b, h, sq, skv, d, causal, dtype, target):
    q, k, v = (random((b, h, s, d), dtype, i) for i, s in enumerate((sq, skv, skv)))
    out = run_on(target, lambda q, k, v: oxijax.attention(q, k, v, causal=causal), q, k, v)
    factor = 1.0 if dtype in (jnp.float32, jnp.float64) else 2.0
    assert_close(out, attention_reference(q, k, v, 1 / np.sqrt(d), causal), dtype,
                 scale=2.0, factor=factor)


@both_modes
def test_vmap(target):
    a, b = random((6, 5, 3), jnp.float32, 1), random((3, 4), jnp.float32, 2)
    out = target.run(jax.vmap(oxijax.matmul, in_axes=(0, None)), a, b)
    np.testing.assert_allclose(f64(out), f64(a) @ f64(b), rtol=1e-5, atol=1e-5)


@both_modes
def test_lowers_to_the_cuda_custom_call(target):
    a = jax.device_put(random((8, 8), jnp.float32), target.device)
    if not target.interpreted:
        assert "oxijax_gemm" in jax.jit(oxijax.matmul).lower(a, a).as_text()
        return
    with oxijax.cuda_interpreter():
        text = jax.jit(oxijax.matmul).lower(a, a).as_text()
    assert "oxijax_interp_gemm" in text


@both_modes
def test_bad_shapes_raise_before_launch(target):
    with pytest.raises(ValueError, match="inner dimensions"):
        target.run(oxijax.matmul, jnp.ones((2, 3)), jnp.ones((4, 2)))
    if target.interpreted:
        assert not target.interp.take_launched_kernels()


# ---------------------------------------------------------------- backward passes


def vjp_of(fn):
    """(*args, cotangent) -> the cotangents of fn's args."""
    return lambda *args: jax.vjp(fn, *args[:-1])[1](args[-1])


def check_vjp(target, fn, reference, args, dtype, factor):
    """The vjp of fn on the target against that of the jnp `reference` in float64 and
    that of the CPU kernels, for one random cotangent."""
    ct = random(jax.eval_shape(fn, *args).shape, dtype, 9)
    expected = jax.jit(vjp_of(reference))(*[jnp.asarray(f64(x)) for x in (*args, ct)])
    got, cpu = run_both(vjp_of(fn), target, *args, ct)
    for g, e, c, x in zip(got, expected, cpu, args):
        assert g.dtype == x.dtype and g.shape == x.shape
        assert_close(g, f64(e), dtype, factor=factor)
        assert_close(g, f64(c), dtype, factor=factor)


GRAD_DTYPES = {"f32": jnp.float32, "bf16": jnp.bfloat16, "f64": jnp.float64}
GRAD_FAMILIES = [(family, dtype) for family in ("unary", "binary", "reduce", "gemm")
                 for dtype in GRAD_DTYPES]
# unary_grad has kernels of its own (every dtype); the other families' backward passes
# are forward kernels, each dtype of which the forward tests above take.
GRAD_FAMILIES_QUICK = [("unary", "f32"), ("unary", "bf16"), ("unary", "f64"),
                       ("binary", "bf16"), ("reduce", "f32"), ("gemm", "bf16")]
CONV_GRAD_ALL = CONV_GRAD_CASES + [((4, 32, 20, 20), (16, 3, 3), (2, 2), (1, 1)),
                                   ((8, 8, 32, 32), (8, 5, 5), (1, 1), (2, 2))]
# Smaller analogues of the two large layers: the filter gradient's reduction split over
# blocks (a workspace and sum_splits_kernel), with the data gradient as an implicit GEMM
# (stride 2) and as a forward conv2d of the flipped filter (stride 1).
CONV_GRAD_QUICK = CONV_GRAD_CASES + [((2, 8, 24, 24), (8, 3, 3), (2, 2), (1, 1)),
                                     ((2, 4, 12, 12), (8, 3, 3), (1, 1), (1, 1))]


def grad_cases(family, dtype):
    """(fn, float64 jnp reference, args) of test_grad.py's GPU test, by op family."""
    if family == "unary":
        return [(lambda x, op=op: oxijax.unary(x, op), UNARY_GRAD_REFERENCE[op],
                 (unary_grad_input(op, (5, 67), dtype),)) for op in UnaryOp]
    if family == "binary":
        return [(lambda a, b, op=op: oxijax.binary(a, b, op), BINARY_GRAD_REFERENCE[op],
                 binary_inputs(op, ((6, 37), (37,)), dtype)) for op in BinaryOp]
    if family == "reduce":
        return [(lambda x, op=op: oxijax.reduce(x, op, 1),
                 lambda x, op=op: REDUCE_GRAD_REFERENCE[op](x, 1),
                 (random((5, 129), dtype, 10),)) for op in ReduceOp]
    if family == "gemm":
        return [(gemm_fn(*c[2:]), gemm_reference(*c[2:]), gemm_inputs(c, dtype))
                for c in GEMM_GRAD_CASES]
    raise ValueError(family)


@cases("family,dtype", GRAD_FAMILIES, quick=GRAD_FAMILIES_QUICK)
def test_grads(family, dtype, target):
    dtype = GRAD_DTYPES[dtype]
    for fn, reference, args in grad_cases(family, dtype):
        check_vjp(target, fn, reference, args, dtype, factor=8.0)


@pytest.mark.parametrize("dtype", list(GRAD_DTYPES.values()), ids=list(GRAD_DTYPES))
@cases("x_shape,w_shape,stride,padding", CONV_GRAD_ALL, quick=CONV_GRAD_QUICK)
def test_conv2d_grads(x_shape, w_shape, stride, padding, dtype, target):
    """Both backward kernels (data and filter): strides, padding, windows that skip rows."""
    args = conv_inputs((x_shape, w_shape, stride, padding), dtype)
    check_vjp(target, conv_fn(stride, padding), conv_grad_reference(stride, padding), args,
              dtype, factor=8.0)


ATTENTION_GRAD_SHAPES = [(1, 2, 7, 5, 3), (2, 1, 64, 130, 64), (1, 2, 130, 127, 128),
                         (1, 1, 200, 256, 64), (1, 1, 70, 90, 96), (1, 2, 100, 77, 256)]
# Smaller analogues: several (ragged) key tiles and query tiles, causal skipping query
# tiles (Sq < Skv), and a head_dim of 128 with queries that see no key (causal, Sq > Skv);
# a head dim above 128 (160 -> 192: the tensor-core backward's column halves).
ATTENTION_GRAD_QUICK = [(1, 2, 7, 5, 3), (2, 1, 24, 40, 64), (1, 1, 40, 33, 128),
                        (1, 1, 30, 45, 160)]


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@cases("b,h,sq,skv,d", ATTENTION_GRAD_SHAPES, quick=ATTENTION_GRAD_QUICK)
def test_attention_grads(b, h, sq, skv, d, causal, dtype, target):
    q, k, v, dout = attention_grad_inputs(b, h, sq, skv, d, dtype)
    fn = lambda q, k, v: oxijax.attention(q, k, v, causal=causal)  # noqa: E731
    got, cpu = run_both(vjp_of(fn), target, q, k, v, dout)
    expected = attention_expected_grads(q, k, v, dout, 1 / np.sqrt(d), causal)
    factor = 1.0 if dtype in (jnp.float32, jnp.float64) else 4.0
    for g, want, c in zip(got, expected, cpu):
        assert_close(g, want, dtype, factor=factor)
        assert_close(g, f64(c), dtype, factor=factor)
