"""The CUDA kernels: each op on the GPU against the float64 reference and against the
CPU kernels, over every dtype and awkward shapes. Skipped without a GPU (the `gpu`
fixture); OXIJAX_REQUIRE_GPU=1 turns the skips into failures."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import assert_close, f64, random
from test_attention import reference as attention_reference
from test_conv2d import CASES as CONV_CASES
from test_conv2d import reference as conv_reference
from test_elementwise import BINARY_REFERENCE, BROADCAST_PAIRS, UNARY_REFERENCE, rounded, unary_input
from test_reduce import REFERENCE as REDUCE_REFERENCE

import oxijax
from oxijax import BinaryOp, ReduceOp, UnaryOp

pytestmark = pytest.mark.usefixtures("gpu")


def on(device, *arrays):
    return [jax.device_put(x, device) for x in arrays]


def run_both(fn, gpu, *args):
    """fn jitted on the GPU and on the CPU; the GPU result must live on the GPU."""
    gpu_out = jax.jit(fn)(*on(gpu, *args))
    assert gpu_out.devices() == {gpu}
    cpu_out = jax.jit(fn)(*on(jax.devices("cpu")[0], *args))
    return gpu_out, cpu_out


@pytest.mark.parametrize("op", list(UnaryOp), ids=lambda o: o.name.lower())
@pytest.mark.parametrize("shape", [(1,), (7,), (3, 5), (1000003,)], ids=str)
def test_unary(op, shape, dtype, gpu):
    x = unary_input(op, shape, dtype)
    with np.errstate(all="ignore"):
        expected = rounded(UNARY_REFERENCE[op](f64(x)), dtype)
    gpu_out, cpu_out = run_both(lambda x: oxijax.unary(x, op), gpu, x)
    assert_close(gpu_out, expected, dtype, scale=0.0, factor=2.0)
    assert_close(gpu_out, f64(cpu_out), dtype, scale=0.0, factor=2.0)


@pytest.mark.parametrize("op", list(BinaryOp), ids=lambda o: o.name.lower())
@pytest.mark.parametrize("shapes", BROADCAST_PAIRS + [((4097, 1, 3), (1, 1025, 1))], ids=str)
def test_binary(op, shapes, dtype, gpu):
    a = random(shapes[0], dtype, seed=1)
    b = random(shapes[1], dtype, seed=2, low=0.5 if op is BinaryOp.DIV else -2.0)
    gpu_out, _ = run_both(lambda a, b: oxijax.binary(a, b, op), gpu, a, b)
    assert_close(gpu_out, rounded(BINARY_REFERENCE[op](f64(a), f64(b)), dtype), dtype, scale=0.0)


@pytest.mark.parametrize("op", list(ReduceOp), ids=lambda o: o.name.lower())
@pytest.mark.parametrize("shape,axis", [((1,), 0), ((7,), 0), ((33, 129), 0), ((33, 129), 1),
                                        ((3, 1 << 20), 1), ((1 << 16, 3), 0), ((2, 5000, 7), 1),
                                        ((1 << 22,), 0), ((5, 1, 3), 1)], ids=str)
def test_reduce(op, shape, axis, dtype, gpu):
    x = random(shape, dtype, seed=3)
    gpu_out, _ = run_both(lambda x: oxijax.reduce(x, op, axis), gpu, x)
    terms = 2.0 * (np.sqrt(shape[axis]) if op is ReduceOp.SUM else 1.0)
    assert_close(gpu_out, REDUCE_REFERENCE[op](f64(x), axis=axis), dtype, scale=terms)


def test_reduce_nan_propagates(gpu):
    x = jnp.asarray(np.arange(12.0).reshape(3, 4), jnp.float32).at[1, 2].set(jnp.nan)
    for op in ("max", "min", "sum"):
        out = f64(jax.jit(lambda x: oxijax.reduce(x, op, 1))(jax.device_put(x, gpu)))
        np.testing.assert_array_equal(np.isnan(out), [False, True, False])


GEMM_SIZES = [(1, 1, 1), (3, 5, 7), (17, 33, 65), (64, 64, 64), (129, 257, 300), (1000, 1, 513)]


@pytest.mark.parametrize("m,n,k", GEMM_SIZES, ids=str)
@pytest.mark.parametrize("trans", ["NN", "NT", "TN", "TT"])
def test_gemm(m, n, k, trans, dtype, gpu):
    ta, tb = trans
    a = random((k, m) if ta == "T" else (m, k), dtype, 1)
    b = random((n, k) if tb == "T" else (k, n), dtype, 2)
    c = random((m, n), dtype, 3)
    fn = lambda a, b, c: oxijax.gemm(a, b, c, trans_a=ta, trans_b=tb, alpha=0.5, beta=2.0)  # noqa: E731
    gpu_out, _ = run_both(fn, gpu, a, b, c)
    op_a = f64(a).T if ta == "T" else f64(a)
    op_b = f64(b).T if tb == "T" else f64(b)
    assert_close(gpu_out, 0.5 * op_a @ op_b + 2.0 * f64(c), dtype, scale=2.0 * np.sqrt(k) + 4.0)


# (2, 1) * 4 against (1, 2) * 4: eight batch dims that cannot merge, more than one
# launch indexes, so the host loops over the outer ones.
@pytest.mark.parametrize("batch_a,batch_b", [((4,), (4,)), ((3,), ()), ((2, 1), (1, 3)),
                                             ((2, 1) * 4, (1, 2) * 4)], ids=str)
def test_batched_gemm(batch_a, batch_b, dtype, gpu):
    a, b = random((*batch_a, 37, 19), dtype, 1), random((*batch_b, 19, 45), dtype, 2)
    gpu_out, _ = run_both(oxijax.matmul, gpu, a, b)
    assert_close(gpu_out, f64(a) @ f64(b), dtype, scale=4.0 * np.sqrt(19))


def test_gemm_beta_zero_never_reads_c(gpu):
    a, b = random((40, 30), jnp.float32, 1), random((30, 20), jnp.float32, 2)
    c = jnp.full((40, 20), jnp.nan, jnp.float32)
    out = jax.jit(lambda a, b, c: oxijax.gemm(a, b, c))(*on(gpu, a, b, c))
    assert not np.isnan(f64(out)).any()


def test_gemm_tf32_mode_is_close(gpu):
    a, b = random((256, 512), jnp.float32, 1), random((512, 128), jnp.float32, 2)
    out = jax.jit(lambda a, b: oxijax.gemm(a, b, precision="tf32"))(*on(gpu, a, b))
    expected = f64(a) @ f64(b)
    assert np.max(np.abs(f64(out) - expected)) <= 2e-3 * np.sqrt(512) * 4


@pytest.mark.parametrize("x_shape,w_shape,stride,padding", CONV_CASES, ids=str)
def test_conv2d(x_shape, w_shape, stride, padding, dtype, gpu):
    x = random(x_shape, dtype, seed=1)
    k, r, s = w_shape
    w = random((k, x_shape[1], r, s), dtype, seed=2)
    gpu_out, _ = run_both(lambda x, w: oxijax.conv2d(x, w, stride=stride, padding=padding), gpu, x, w)
    assert_close(gpu_out, conv_reference(x, w, stride, padding), dtype,
                 scale=4.0 * np.sqrt(x_shape[1] * r * s))


ATTENTION_SHAPES = [(1, 1, 1, 1, 1), (2, 3, 5, 7, 16), (1, 2, 63, 65, 64), (2, 2, 130, 127, 128),
                    (1, 1, 200, 3, 64), (1, 1, 3, 200, 256), (1, 1, 17, 29, 3), (1, 2, 600, 600, 128)]


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("b,h,sq,skv,d", ATTENTION_SHAPES, ids=str)
def test_attention(b, h, sq, skv, d, causal, dtype, gpu):
    q, k, v = (random((b, h, s, d), dtype, i) for i, s in enumerate((sq, skv, skv)))
    gpu_out, _ = run_both(lambda q, k, v: oxijax.attention(q, k, v, causal=causal), gpu, q, k, v)
    factor = 1.0 if dtype in (jnp.float32, jnp.float64) else 2.0
    assert_close(gpu_out, attention_reference(q, k, v, 1 / np.sqrt(d), causal), dtype,
                 scale=2.0, factor=factor)


def test_vmap_on_gpu(gpu):
    a, b = random((6, 5, 3), jnp.float32, 1), random((3, 4), jnp.float32, 2)
    out = jax.jit(jax.vmap(oxijax.matmul, in_axes=(0, None)))(*on(gpu, a, b))
    np.testing.assert_allclose(f64(out), f64(a) @ f64(b), rtol=1e-5, atol=1e-5)


def test_lowers_to_the_cuda_custom_call(gpu):
    a = jax.device_put(random((8, 8), jnp.float32), gpu)
    text = jax.jit(oxijax.matmul).lower(a, a).as_text()
    assert "oxijax_gemm" in text


def test_bad_shapes_raise_before_launch(gpu):
    with pytest.raises(ValueError, match="inner dimensions"):
        jax.jit(oxijax.matmul)(*on(gpu, jnp.ones((2, 3)), jnp.ones((4, 2))))
