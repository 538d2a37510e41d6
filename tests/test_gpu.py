"""The CUDA kernels: each op against the float64 reference and against the CPU kernels,
over every dtype and awkward shapes, in two modes (the `target` fixture):

- ``gpu``: on the first CUDA device; skipped without one (OXIJAX_REQUIRE_GPU=1 turns the
  skips into failures). Marked `gpu` (scripts/gpu_check.sh runs ``-m gpu``).
- ``interp``: on the CPU, the CUDA handlers and kernels run in the CUDA interpreter
  (every memory access checked: bounds, shared-memory races, uninitialised reads,
  misalignment); skipped when the build has none (OXIJAX_REQUIRE_INTERPRETER=1 turns that
  into a failure). Marked `cuda_interpret`. The interpreter runs each CUDA thread as a
  fiber, so by default it takes a subset of each list (every op, dtype and kernel path);
  HYPOTHESIS_PROFILE=slow takes every case, the few too large for it shrunk to the
  largest analogue that takes the same path.

The CPU kernels' results are computed before the interpreter is entered (it replaces
them while active), and every interpreted run must have launched a CUDA kernel."""

import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import assert_close, f64, random, require_interpreter
from test_attention import reference as attention_reference
from test_conv2d import CASES as CONV_CASES
from test_conv2d import reference as conv_reference
from test_elementwise import BINARY_REFERENCE, BROADCAST_PAIRS, UNARY_REFERENCE, rounded, unary_input
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
    return Target(jax.devices("cpu")[0], require_interpreter())


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


UNARY_SHAPES = [(1,), (7,), (3, 5), (1000003,)]


@pytest.mark.parametrize("op", list(UnaryOp), ids=lambda o: o.name.lower())
@cases("shape", UNARY_SHAPES, quick=[(7,), (3, 5), (4099,)])
def test_unary(op, shape, dtype, target):
    x = unary_input(op, shape, dtype)
    with np.errstate(all="ignore"):
        expected = rounded(UNARY_REFERENCE[op](f64(x)), dtype)
    out, cpu_out = run_both(lambda x: oxijax.unary(x, op), target, x)
    assert_close(out, expected, dtype, scale=0.0, factor=2.0)
    assert_close(out, f64(cpu_out), dtype, scale=0.0, factor=2.0)


BINARY_PAIRS = BROADCAST_PAIRS + [((4097, 1, 3), (1, 1025, 1))]


@pytest.mark.parametrize("op", list(BinaryOp), ids=lambda o: o.name.lower())
@cases("shapes", BINARY_PAIRS, quick=BINARY_PAIRS)
def test_binary(op, shapes, dtype, target):
    a = random(shapes[0], dtype, seed=1)
    b = random(shapes[1], dtype, seed=2, low=0.5 if op is BinaryOp.DIV else -2.0)
    out, _ = run_both(lambda a, b: oxijax.binary(a, b, op), target, a, b)
    assert_close(out, rounded(BINARY_REFERENCE[op](f64(a), f64(b)), dtype), dtype, scale=0.0)


REDUCE_CASES = [((1,), 0), ((7,), 0), ((33, 129), 0), ((33, 129), 1), ((3, 1 << 20), 1),
                ((1 << 16, 3), 0), ((2, 5000, 7), 1), ((1 << 22,), 0), ((5, 1, 3), 1)]


@pytest.mark.parametrize("op", list(ReduceOp), ids=lambda o: o.name.lower())
@cases("shape,axis", REDUCE_CASES, quick=REDUCE_CASES)
def test_reduce(op, shape, axis, dtype, target):
    x = random(shape, dtype, seed=3)
    out, _ = run_both(lambda x: oxijax.reduce(x, op, axis), target, x)
    terms = 2.0 * (np.sqrt(shape[axis]) if op is ReduceOp.SUM else 1.0)
    assert_close(out, REDUCE_REFERENCE[op](f64(x), axis=axis), dtype, scale=terms)


@both_modes
def test_reduce_nan_propagates(target):
    x = jnp.asarray(np.arange(12.0).reshape(3, 4), jnp.float32).at[1, 2].set(jnp.nan)
    for op in ("max", "min", "sum"):
        out = f64(target.run(lambda x: oxijax.reduce(x, op, 1), x))
        np.testing.assert_array_equal(np.isnan(out), [False, True, False])


GEMM_SIZES = [(1, 1, 1), (3, 5, 7), (17, 33, 65), (64, 64, 64), (129, 257, 300), (1000, 1, 513)]


@pytest.mark.parametrize("trans", ["NN", "NT", "TN", "TT"])
@cases("m,n,k", GEMM_SIZES, quick=GEMM_SIZES)
def test_gemm(m, n, k, trans, dtype, target):
    ta, tb = trans
    a = random((k, m) if ta == "T" else (m, k), dtype, 1)
    b = random((n, k) if tb == "T" else (k, n), dtype, 2)
    c = random((m, n), dtype, 3)
    fn = lambda a, b, c: oxijax.gemm(a, b, c, trans_a=ta, trans_b=tb, alpha=0.5, beta=2.0)  # noqa: E731
    out, _ = run_both(fn, target, a, b, c)
    op_a = f64(a).T if ta == "T" else f64(a)
    op_b = f64(b).T if tb == "T" else f64(b)
    assert_close(out, 0.5 * op_a @ op_b + 2.0 * f64(c), dtype, scale=2.0 * np.sqrt(k) + 4.0)


# (2, 1) * 4 against (1, 2) * 4: eight batch dims that cannot merge, more than one
# launch indexes, so the host loops over the outer ones.
BATCHES = [((4,), (4,)), ((3,), ()), ((2, 1), (1, 3)), ((2, 1) * 4, (1, 2) * 4)]


@cases("batch_a,batch_b", BATCHES, quick=BATCHES)
def test_batched_gemm(batch_a, batch_b, dtype, target):
    a, b = random((*batch_a, 37, 19), dtype, 1), random((*batch_b, 19, 45), dtype, 2)
    out, _ = run_both(oxijax.matmul, target, a, b)
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


@cases("x_shape,w_shape,stride,padding", CONV_CASES, quick=CONV_CASES)
def test_conv2d(x_shape, w_shape, stride, padding, dtype, target):
    x = random(x_shape, dtype, seed=1)
    k, r, s = w_shape
    w = random((k, x_shape[1], r, s), dtype, seed=2)
    out, _ = run_both(lambda x, w: oxijax.conv2d(x, w, stride=stride, padding=padding), target, x, w)
    assert_close(out, conv_reference(x, w, stride, padding), dtype,
                 scale=4.0 * np.sqrt(x_shape[1] * r * s))


ATTENTION_SHAPES = [(1, 1, 1, 1, 1), (2, 3, 5, 7, 16), (1, 2, 63, 65, 64), (2, 2, 130, 127, 128),
                    (1, 1, 200, 3, 64), (1, 1, 3, 200, 256), (1, 1, 17, 29, 3), (1, 2, 600, 600, 128)]


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@cases("b,h,sq,skv,d", ATTENTION_SHAPES, quick=ATTENTION_SHAPES)
def test_attention(b, h, sq, skv, d, causal, dtype, target):
    q, k, v = (random((b, h, s, d), dtype, i) for i, s in enumerate((sq, skv, skv)))
    out, _ = run_both(lambda q, k, v: oxijax.attention(q, k, v, causal=causal), target, q, k, v)
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
