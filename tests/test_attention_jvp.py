"""Forward mode of attention (the fused attention_jvp kernel) against the same
transformation of a jnp softmax attention: jax.jvp and jax.jacfwd, causal masks,
Sq != Skv, fully masked rows, jit / vmap; reverse mode as the transpose of the JVP (one
backward kernel, deterministic on the CPU); second derivatives raise."""

import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import assert_close, f64, random
from test_attention_grad import reference

import oxijax


def operands(b, h, sq, skv, d, dtype, seed=0):
    """q, k, v and tangents dq, dk, dv."""
    shapes = [(b, h, sq, d), (b, h, skv, d), (b, h, skv, d)] * 2
    return [random(s, dtype, seed + i) for i, s in enumerate(shapes)]


def jvp(fn, args):
    return jax.jit(lambda *a: jax.jvp(fn, a[:3], a[3:]))(*args)


def attn(causal, scale=None):
    return lambda q, k, v: oxijax.attention(q, k, v, scale=scale, causal=causal)


def ref(causal, scale):
    return lambda q, k, v: reference(q, k, v, scale, causal)


SHAPES = [(1, 1, 1, 1, 1), (2, 3, 5, 7, 16), (1, 2, 7, 5, 3), (1, 2, 63, 65, 32),
          (1, 1, 130, 260, 64), (1, 1, 200, 33, 8)]


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("b,h,sq,skv,d", SHAPES, ids=str)
def test_jvp_matches_reference(b, h, sq, skv, d, causal, dtype):
    args = operands(b, h, sq, skv, d, dtype)
    out, tangent = jvp(attn(causal), args)
    want_out, want_tangent = jvp(ref(causal, 1 / np.sqrt(d)), [jnp.asarray(f64(x)) for x in args])
    assert tangent.shape == out.shape == args[0].shape and tangent.dtype == dtype
    # Half types: out is rounded before it enters the tangent (- m_i O_i).
    factor = 1.0 if dtype in (jnp.float32, jnp.float64) else 4.0
    assert_close(out, want_out, dtype)
    assert_close(tangent, want_tangent, dtype, factor=factor)


def test_explicit_scale_and_some_zero_tangents():
    q, k, v, dq, _, _ = operands(1, 2, 9, 11, 8, jnp.float64)
    for fn, rf in [(attn(True, 3.0), ref(True, 3.0)), (attn(False, 0.1), ref(False, 0.1))]:
        got = jax.jit(lambda q, dq: jax.jvp(lambda q: fn(q, k, v), (q,), (dq,))[1])(q, dq)
        want = jax.jit(lambda q, dq: jax.jvp(lambda q: rf(q, k, v), (q,), (dq,))[1])(q, dq)
        np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-13)


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_jacfwd_and_jacrev_match_reference(causal):
    q, k, v, *_ = operands(1, 2, 4, 6, 3, jnp.float64)
    for jac in (jax.jacfwd, jax.jacrev):
        got = jax.jit(jac(attn(causal), (0, 1, 2)))(q, k, v)
        want = jax.jit(jac(ref(causal, 1 / np.sqrt(3)), (0, 1, 2)))(q, k, v)
        for g, w in zip(got, want):
            np.testing.assert_allclose(g, w, rtol=1e-11, atol=1e-13)


def test_fully_masked_rows_get_zero_tangents():
    # Causal with Sq > Skv: the first Sq - Skv queries see no key at all.
    args = operands(1, 2, 9, 3, 4, jnp.float32)
    out, tangent = jvp(attn(True), args)
    assert not np.isnan(f64(tangent)).any()
    np.testing.assert_array_equal(f64(tangent)[:, :, :6], 0.0)
    want = jvp(ref(True, 0.5), [jnp.asarray(f64(x)) for x in args])[1]
    np.testing.assert_allclose(f64(tangent), f64(want), rtol=1e-5, atol=1e-5)


def test_zero_sizes():
    q, k = jnp.ones((1, 2, 3, 4)), jnp.ones((1, 2, 0, 4))
    out, tangent = jax.jvp(attn(False), (q, k, k), (q, k, k))
    assert tangent.shape == q.shape
    np.testing.assert_array_equal(tangent, 0.0)


def test_vmap_of_jvp_and_jvp_of_vmap():
    shapes = [(3, 1, 2, 5, 8), (3, 1, 2, 6, 8), (3, 1, 2, 6, 8)] * 2
    args = [random(s, jnp.float64, i) for i, s in enumerate(shapes)]
    fn, rf = attn(True), ref(True, 1 / np.sqrt(8))
    want = [jax.jvp(rf, a[:3], a[3:])[1] for a in zip(*args)]
    batched = jax.jit(jax.vmap(lambda *a: jax.jvp(fn, a[:3], a[3:])[1]))(*args)
    outer = jax.jit(lambda *a: jax.jvp(jax.vmap(fn), a[:3], a[3:])[1])(*args)
    for i in range(3):
        np.testing.assert_allclose(batched[i], want[i], rtol=1e-12, atol=1e-13)
        np.testing.assert_allclose(outer[i], want[i], rtol=1e-12, atol=1e-13)
    # Unbatched k, v tangents (in_axes None) broadcast into the folded batch.
    q, k, v, dq, dk, dv = args
    partly = jax.vmap(lambda q, dq: jax.jvp(fn, (q, k[0], v[0]), (dq, dk[0], dv[0]))[1])(q, dq)
    for i in range(3):
        want_i = jax.jvp(rf, (q[i], k[0], v[0]), (dq[i], dk[0], dv[0]))[1]
        np.testing.assert_allclose(partly[i], want_i, rtol=1e-12, atol=1e-13)


def _primitives(jaxpr):
    return {eqn.primitive.name for eqn in jaxpr.jaxpr.eqns}


def test_jvp_is_fused_and_grad_runs_one_backward_kernel():
    sq, skv = 12, 20
    q, k, v, dq, dk, dv = operands(1, 2, sq, skv, 4, jnp.float32)
    fn = attn(True)
    jaxpr = jax.make_jaxpr(lambda *a: jax.jvp(fn, a[:3], a[3:]))(q, k, v, dq, dk, dv)
    assert _primitives(jaxpr) == {"oxijax_attention", "oxijax_attention_jvp"}
    # Symbolic zero tangents become zeros of the tangent's own shape, never Sq x Skv.
    jaxpr = jax.make_jaxpr(lambda q, dq: jax.jvp(lambda q: fn(q, k, v), (q,), (dq,)))(q, dq)
    assert _primitives(jaxpr) <= {"oxijax_attention", "oxijax_attention_jvp", "broadcast_in_dim"}
    assert all(sq * skv not in (np.prod(x.aval.shape[-2:]), np.prod(x.aval.shape))
               for eqn in jaxpr.jaxpr.eqns for x in eqn.outvars)
    loss = lambda q, k, v: jnp.sum(fn(q, k, v) * dq)  # noqa: E731
    text = str(jax.make_jaxpr(jax.grad(loss, (0, 1, 2)))(q, k, v))
    assert text.count("oxijax_attention_backward[") == 1 and "oxijax_attention_jvp" not in text
    text = str(jax.make_jaxpr(jax.jacrev(fn))(q, k, v))
    assert "oxijax_attention_backward[" in text and "oxijax_attention_jvp" not in text


def test_transpose_of_the_backward_is_the_jvp():
    # d/d(cotangent) of the VJP: the backward's own JVP and transpose rules.
    q, k, v, dq, dk, dv = operands(1, 2, 6, 7, 4, jnp.float64)
    ct = random(q.shape, jnp.float64, 9)
    probe = lambda fn: jax.grad(lambda ct: jnp.sum(jax.vjp(fn, q, k, v)[1](ct)[1] * dk))  # noqa: E731
    got = jax.jit(probe(attn(True)))(ct)
    np.testing.assert_allclose(got, jax.jit(probe(ref(True, 0.5)))(ct), rtol=1e-12, atol=1e-13)
    assert "oxijax_attention_jvp[" in str(jax.make_jaxpr(probe(attn(True)))(ct))


def test_second_derivatives_raise_clearly():
    q = random((1, 1, 4, 8), jnp.float32)
    loss = lambda q: jnp.sum(oxijax.attention(q, q, q))  # noqa: E731
    for second in (jax.hessian(loss), jax.jacfwd(jax.jacfwd(loss)),
                   lambda q: jax.jvp(jax.grad(loss), (q,), (q,))):
        with pytest.raises(NotImplementedError, match="first derivatives only"):
            second(q)


@pytest.mark.skipif((os.cpu_count() or 1) < 2, reason="XLA's CPU pool needs >= 2 threads")
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("b,h,sq,skv,d,dtype", [
    (1, 1, 96, 1100, 32, jnp.float32),    # many key blocks, one (batch, head)
    (1, 2, 700, 640, 16, jnp.float32),    # many query and key blocks
    (2, 3, 129, 300, 8, jnp.bfloat16),
], ids=str)
def test_derivatives_are_bit_reproducible(b, h, sq, skv, d, dtype, causal):
    # XLA's CPU intra-op pool has one thread per core: the key groups run concurrently.
    args = operands(b, h, sq, skv, d, dtype)
    grad = jax.jit(lambda *a: jax.vjp(attn(causal), *a[:3])[1](a[3]))
    tangent = jax.jit(lambda *a: jax.jvp(attn(causal), a[:3], a[3:])[1])
    first = [np.asarray(g) for g in (*grad(*args[:4]), tangent(*args))]
    for _ in range(2):
        for g, want in zip((*grad(*args[:4]), tangent(*args)), first):
            np.testing.assert_array_equal(np.asarray(g), want)


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("b,h,sq,skv,d", [(1, 2, 7, 5, 3), (2, 1, 64, 130, 64), (1, 2, 130, 127, 128),
                                          (1, 1, 9, 3, 4)], ids=str)
def test_jvp_on_gpu(b, h, sq, skv, d, causal, dtype, gpu):
    args = [jax.device_put(x, gpu) for x in operands(b, h, sq, skv, d, dtype)]
    out, tangent = jvp(attn(causal), args)
    assert tangent.devices() == {gpu} and tangent.dtype == dtype
    _, want = jvp(ref(causal, 1 / np.sqrt(d)), [jnp.asarray(f64(jax.device_get(x))) for x in args])
    assert_close(tangent, want, dtype, factor=1.0 if dtype in (jnp.float32, jnp.float64) else 4.0)
    again = jvp(attn(causal), args)[1]  # one owner per accumulator: deterministic
    np.testing.assert_array_equal(np.asarray(again), np.asarray(tangent))
