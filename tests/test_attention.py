"""attention against a float64 NumPy softmax reference (causal, Sq != Skv, huge logits)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import assert_close, f64, random

import oxijax


def reference(q, k, v, scale, causal):
    q, k, v = f64(q), f64(k), f64(v)
    scores = scale * np.einsum("bhqd,bhkd->bhqk", q, k)
    sq, skv = q.shape[2], k.shape[2]
    if causal:
        visible = np.arange(skv)[None, :] <= np.arange(sq)[:, None] + (skv - sq)
        scores = np.where(visible, scores, -np.inf)
    row_max = np.max(scores, axis=-1, keepdims=True)
    row_max = np.where(np.isfinite(row_max), row_max, 0.0)
    weights = np.exp(scores - row_max)
    total = weights.sum(-1, keepdims=True)
    probs = np.divide(weights, total, out=np.zeros_like(weights), where=total > 0)
    return np.einsum("bhqk,bhkd->bhqd", probs, v)


def check(b, h, sq, skv, d, dtype, causal, scale=None, magnitude=2.0):
    q = random((b, h, sq, d), dtype, 1, -magnitude, magnitude)
    k = random((b, h, skv, d), dtype, 2, -magnitude, magnitude)
    v = random((b, h, skv, d), dtype, 3)
    fn = jax.jit(oxijax.attention, static_argnames=("scale", "causal"))
    actual = fn(q, k, v, scale=scale, causal=causal)
    assert actual.shape == q.shape and actual.dtype == q.dtype
    expected = reference(q, k, v, scale if scale is not None else 1 / np.sqrt(d), causal)
    # Half inputs round the scores' terms: allow for their effect through the softmax.
    factor = 1.0 if dtype in (jnp.float32, jnp.float64) else 2.0
    assert_close(actual, expected, dtype, scale=2.0, factor=factor)


SHAPES = [(1, 1, 1, 1, 1), (1, 1, 1, 5, 8), (2, 3, 5, 7, 16), (1, 2, 7, 5, 16), (1, 1, 17, 17, 3),
          (1, 2, 63, 65, 32), (2, 1, 64, 64, 64), (1, 1, 130, 127, 128), (1, 1, 3, 200, 256)]


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("b,h,sq,skv,d", SHAPES, ids=str)
def test_attention_matches_reference(b, h, sq, skv, d, causal, dtype):
    check(b, h, sq, skv, d, dtype, causal)


def test_explicit_scale_multiplies(dtype):
    check(1, 2, 9, 11, 8, dtype, False, scale=0.7)
    check(1, 2, 9, 11, 8, dtype, True, scale=3.0)


def test_huge_logits_stay_finite(dtype):
    # Scores near 1e3..1e4: a softmax without max subtraction would overflow.
    check(1, 2, 16, 24, 32, dtype, True, scale=1.0, magnitude=16.0)


def test_fully_masked_rows_are_zero():
    # Causal with Sq > Skv: the first Sq - Skv queries see no key at all.
    q, k = random((1, 1, 6, 4), jnp.float32, 1), random((1, 1, 2, 4), jnp.float32, 2)
    out = np.asarray(oxijax.attention(q, k, k, causal=True))
    assert not np.isnan(out).any()
    np.testing.assert_array_equal(out[0, 0, :4], 0.0)
    np.testing.assert_allclose(out, reference(q, k, k, 0.5, True), rtol=1e-5, atol=1e-6)


def test_zero_sizes():
    q = jnp.zeros((1, 2, 3, 4))
    np.testing.assert_array_equal(oxijax.attention(q, jnp.zeros((1, 2, 0, 4)), jnp.zeros((1, 2, 0, 4))), 0.0)
    assert oxijax.attention(jnp.zeros((0, 2, 3, 4)), jnp.zeros((0, 2, 5, 4)), jnp.zeros((0, 2, 5, 4))).shape == (0, 2, 3, 4)


def test_matches_jax_nn_dot_product_attention():
    q, k, v = (random((2, 4, 33, 16), jnp.float32, s) for s in (1, 2, 3))
    to_bshd = lambda x: jnp.swapaxes(x, 1, 2)  # noqa: E731
    for causal in (False, True):
        expected = to_bshd(jax.nn.dot_product_attention(to_bshd(q), to_bshd(k), to_bshd(v), is_causal=causal))
        np.testing.assert_allclose(oxijax.attention(q, k, v, causal=causal), expected, rtol=2e-5, atol=2e-6)


@pytest.mark.parametrize("in_axes", [(0, 0, 0), (0, None, None), (None, 1, 1), (2, 0, 0)], ids=str)
def test_vmap_folds_into_kernel_batch(in_axes):
    q, k, v = (random((3, 2, 2, 5, 8), jnp.float64, s) for s in (1, 2, 3))
    args = [jnp.moveaxis(x, 0, a) if a is not None else x[0] for x, a in zip((q, k, v), in_axes)]
    fn = lambda q, k, v: oxijax.attention(q, k, v, causal=True)  # noqa: E731
    got = jax.vmap(fn, in_axes=in_axes)(*args)
    for i in range(3):
        qi, ki, vi = (x[i] if a is not None else x[0] for x, a in zip((q, k, v), in_axes))
        np.testing.assert_allclose(got[i], reference(qi, ki, vi, 1 / np.sqrt(8), True), rtol=1e-12)
    jaxpr = jax.make_jaxpr(jax.vmap(fn, in_axes=in_axes))(*args)
    # One kernel call (inside the custom_vjp that makes attention differentiable).
    assert str(jaxpr).count("= oxijax_attention[") == 1


def test_long_sequence_many_key_blocks():
    check(1, 2, 700, 1100, 64, jnp.float32, True)
    check(1, 1, 513, 513, 128, jnp.bfloat16, False)


def test_composes_with_other_ops_under_jit():
    q, k, v = (random((1, 2, 40, 16), jnp.float32, s) for s in (1, 2, 3))
    w = random((16, 16), jnp.float32, 4)

    @jax.jit
    def layer(q, k, v, w):
        h = oxijax.attention(q, k, v, causal=True)
        return oxijax.mean(oxijax.relu(oxijax.gemm(h, w)), -1)

    h = reference(q, k, v, 0.25, True)
    expected = np.maximum(h @ f64(w), 0.0).mean(-1)
    np.testing.assert_allclose(layer(q, k, v, w), expected, rtol=1e-4, atol=1e-5)
