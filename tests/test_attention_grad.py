"""Gradients of attention (the fused backward kernel; forward mode is test_attention_jvp.py) against the gradients of a jnp
softmax attention in float64: causal masks, Sq != Skv, odd sizes, fully masked rows,
jit / vmap, sharded inputs, and on the GPU against the CPU."""

import json
import os
import subprocess
import sys
import textwrap

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import assert_close, f64, random
from jax.test_util import check_grads

import oxijax


def reference(q, k, v, scale, causal):
    """Softmax attention in jnp (differentiable), computed in the inputs' dtype."""
    scores = scale * jnp.einsum("bhqd,bhkd->bhqk", q, k)
    sq, skv = q.shape[2], k.shape[2]
    visible = jnp.arange(skv)[None, :] <= jnp.arange(sq)[:, None] + (skv - sq)
    if causal:
        scores = jnp.where(visible, scores, -jnp.inf)
    row_max = jnp.max(scores, axis=-1, keepdims=True)
    weights = jnp.exp(scores - jax.lax.stop_gradient(jnp.where(jnp.isfinite(row_max), row_max, 0)))
    total = weights.sum(-1, keepdims=True)
    probs = weights / jnp.where(total > 0, total, 1)
    return jnp.einsum("bhqk,bhkd->bhqd", probs, v)


def inputs(b, h, sq, skv, d, dtype):
    q = random((b, h, sq, d), dtype, 1)
    k = random((b, h, skv, d), dtype, 2)
    v = random((b, h, skv, d), dtype, 3)
    dout = random((b, h, sq, d), dtype, 4)
    return q, k, v, dout


def grads(fn, q, k, v, dout):
    """jit(vjp(fn)) applied to the cotangent dout."""
    return jax.jit(lambda q, k, v, g: jax.vjp(fn, q, k, v)[1](g))(q, k, v, dout)


def expected_grads(q, k, v, dout, scale, causal):
    args = [jnp.asarray(f64(x)) for x in (q, k, v, dout)]
    return grads(lambda q, k, v: reference(q, k, v, scale, causal), *args)


def check(b, h, sq, skv, d, dtype, causal, scale=None):
    q, k, v, dout = inputs(b, h, sq, skv, d, dtype)
    actual = grads(lambda q, k, v: oxijax.attention(q, k, v, scale=scale, causal=causal),
                   q, k, v, dout)
    expected = expected_grads(q, k, v, dout, scale or 1 / np.sqrt(d), causal)
    # Half types: the output and its cotangent are rounded once more before delta.
    factor = 1.0 if dtype in (jnp.float32, jnp.float64) else 4.0
    for name, got, want, like in zip("qkv", actual, expected, (q, k, v)):
        assert got.shape == like.shape and got.dtype == like.dtype, name
        assert_close(got, want, dtype, factor=factor)


SHAPES = [(1, 1, 1, 1, 1), (1, 1, 1, 5, 8), (2, 3, 5, 7, 16), (1, 2, 7, 5, 3),
          (1, 1, 17, 17, 1), (1, 2, 63, 65, 32), (2, 1, 64, 130, 64), (1, 1, 130, 127, 128),
          (1, 2, 300, 20, 8)]  # causal: whole query blocks see no key


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("b,h,sq,skv,d", SHAPES, ids=str)
def test_gradients_match_reference(b, h, sq, skv, d, causal, dtype):
    check(b, h, sq, skv, d, dtype, causal)


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("b,h,sq,skv,d", [(1, 1, 3, 4, 2), (1, 2, 5, 3, 3), (2, 1, 4, 4, 1)], ids=str)
def test_check_grads_float64(b, h, sq, skv, d, causal):
    q, k, v, _ = inputs(b, h, sq, skv, d, jnp.float64)
    check_grads(lambda q, k, v: oxijax.attention(q, k, v, causal=causal), (q, k, v),
                order=1, modes=["rev"])


def test_explicit_scale_and_long_sequences():
    check(1, 2, 9, 11, 8, jnp.float64, True, scale=3.0)
    check(1, 1, 300, 520, 64, jnp.float32, True)


def test_fully_masked_rows_get_zero_gradients():
    # Causal with Sq > Skv: the first Sq - Skv queries see no key at all.
    q, k, v, dout = inputs(1, 2, 9, 3, 4, jnp.float32)
    dq, dk, dv = grads(lambda q, k, v: oxijax.attention(q, k, v, causal=True), q, k, v, dout)
    for g in (dq, dk, dv):
        assert not np.isnan(f64(g)).any()
    np.testing.assert_array_equal(f64(dq)[:, :, :6], 0.0)
    expected = expected_grads(q, k, v, dout, 0.5, True)
    for got, want in zip((dq, dk, dv), expected):
        np.testing.assert_allclose(f64(got), f64(want), rtol=1e-5, atol=1e-5)


def test_zero_sizes_give_zero_gradients():
    loss = lambda q, k, v: jnp.sum(oxijax.attention(q, k, v))  # noqa: E731
    q, k = jnp.ones((1, 2, 3, 4)), jnp.ones((1, 2, 0, 4))
    dq, dk, dv = jax.grad(loss, (0, 1, 2))(q, k, k)
    np.testing.assert_array_equal(dq, 0.0)
    assert dq.shape == q.shape and dk.shape == dv.shape == k.shape
    empty = jnp.ones((0, 2, 3, 4))
    assert all(g.shape == empty.shape for g in jax.grad(loss, (0, 1, 2))(empty, empty, empty))


def test_vmap_of_grad_and_grad_of_vmap():
    q, k, v = (random((3, 2, 2, 6, 8), jnp.float64, s) for s in (1, 2, 3))
    loss = lambda q, k, v: jnp.sum(oxijax.attention(q, k, v, causal=True) ** 2)  # noqa: E731
    ref_loss = lambda q, k, v: jnp.sum(reference(q, k, v, 1 / np.sqrt(8), True) ** 2)  # noqa: E731
    expected = [jax.grad(ref_loss, (0, 1, 2))(q[i], k[i], v[i]) for i in range(3)]
    per_example = jax.jit(jax.vmap(jax.grad(loss, (0, 1, 2)), in_axes=(0, None, 0)))(q, k[0], v)
    for i in range(3):
        want = jax.grad(ref_loss, (0, 1, 2))(q[i], k[0], v[i])
        for got, w in zip(per_example, want):
            np.testing.assert_allclose(got[i], w, rtol=1e-10, atol=1e-12)
    total = jax.jit(jax.grad(lambda q, k, v: jnp.sum(jax.vmap(loss)(q, k, v)), (0, 1, 2)))(q, k, v)
    for i in range(3):
        for got, w in zip(total, expected[i]):
            np.testing.assert_allclose(got[i], w, rtol=1e-10, atol=1e-12)
    jaxpr = str(jax.make_jaxpr(jax.vmap(jax.grad(loss, (0, 1, 2))))(q, k, v))
    assert jaxpr.count("= oxijax_attention_backward[") == 1


def test_unsupported_derivatives_raise_clearly():
    q = random((1, 1, 4, 8), jnp.float32)
    loss = lambda q: jnp.sum(oxijax.attention(q, q, q))  # noqa: E731
    with pytest.raises(NotImplementedError, match="first derivatives only"):
        jax.grad(lambda q: jnp.sum(jax.grad(loss)(q)))(q)


def test_handler_rejects_inconsistent_backward_calls():
    f32 = lambda *s: jax.ShapeDtypeStruct(s, jnp.float32)  # noqa: E731
    x, lse = jnp.ones((1, 1, 4, 8), jnp.float32), jnp.zeros((1, 1, 4), jnp.float32)
    call = jax.ffi.ffi_call("oxijax_attention_backward", (f32(1, 1, 4, 8), f32(1, 1, 4, 8), f32(1, 1, 4, 8)))
    attrs = dict(scale=np.float64(1), causal=False)
    with pytest.raises(Exception, match="attention output cotangent has shape"):
        jax.block_until_ready(jax.jit(lambda *a: call(*a, **attrs))(x, x, x, x, lse, jnp.ones((1, 1, 3, 8), jnp.float32)))
    with pytest.raises(Exception, match="share one dtype"):
        jax.block_until_ready(jax.jit(lambda *a: call(*a, **attrs))(x, x, x, x, lse, jnp.ones((1, 1, 4, 8), jnp.float64)))


SHARDED = textwrap.dedent(
    """
    import json, re
    import jax, jax.numpy as jnp, numpy as np
    from jax.sharding import NamedSharding, PartitionSpec as P
    import oxijax

    jax.config.update("jax_enable_x64", True)
    mesh = jax.make_mesh((2, 2), ("x", "y"))
    args = [np.random.default_rng(s).standard_normal((4, 2, 16, 8)) for s in range(3)]
    grad = jax.jit(jax.grad(lambda q, k, v: jnp.sum(oxijax.attention(q, k, v, causal=True) ** 2),
                            (0, 1, 2)))
    # Forward mode too: the tangents are sharded like the primals.
    jvp = jax.jit(lambda *a: jax.jvp(lambda q, k, v: oxijax.attention(q, k, v, causal=True),
                                     a[:3], a[3:])[1])
    sharded = [jax.device_put(a, NamedSharding(mesh, P("x", "y"))) for a in args]
    got, want = grad(*sharded), grad(*(jnp.asarray(a) for a in args))
    got_t, want_t = jvp(*sharded, *sharded[::-1]), jvp(*args, *args[::-1])
    collectives = lambda f, *a: re.findall(  # noqa: E731
        r"all-gather|all-reduce|all-to-all|collective-permute", f.lower(*a).compile().as_text())
    print(json.dumps({
        "close": all(bool(np.allclose(g, w, rtol=1e-12, atol=1e-12)) for g, w in zip(got, want))
                 and bool(np.allclose(got_t, want_t, rtol=1e-12, atol=1e-12)),
        "collectives": sorted(set(collectives(grad, *sharded) + collectives(jvp, *sharded, *sharded))),
        "spec": [list(map(str, g.sharding.spec)) for g in (*got, got_t)],
    }))
    """
)


def test_sharded_gradients_and_tangents_stay_local():
    env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=4",
               JAX_PLATFORMS="cpu")
    run = subprocess.run([sys.executable, "-c", SHARDED], capture_output=True, text=True,
                         env=env, timeout=300)
    assert run.returncode == 0, run.stderr[-4000:]
    result = json.loads(run.stdout.strip().splitlines()[-1])
    assert result["close"] and result["collectives"] == [], result
    assert all(spec[:2] == ["x", "y"] for spec in result["spec"]), result


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("b,h,sq,skv,d", [(1, 2, 7, 5, 3), (2, 1, 64, 130, 64), (1, 2, 130, 127, 128),
                                          (1, 1, 200, 256, 64)], ids=str)
def test_gradients_on_gpu(b, h, sq, skv, d, causal, dtype, gpu):
    q, k, v, dout = (jax.device_put(x, gpu) for x in inputs(b, h, sq, skv, d, dtype))
    actual = grads(lambda q, k, v: oxijax.attention(q, k, v, causal=causal), q, k, v, dout)
    assert all(g.devices() == {gpu} for g in actual)
    expected = expected_grads(*(jax.device_get(x) for x in (q, k, v, dout)), 1 / np.sqrt(d), causal)
    factor = 1.0 if dtype in (jnp.float32, jnp.float64) else 4.0
    for got, want in zip(actual, expected):
        assert_close(got, want, dtype, factor=factor)
