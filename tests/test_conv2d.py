"""conv2d against lax.conv_general_dilated in float64."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import assert_close, f64, random

import oxijax


def reference(x, w, stride, padding):
    """Cross-correlation in NumPy float64: every (r, s) window of the padded input."""
    x, w = f64(x), f64(w)
    (sh, sw), (ph, pw) = stride, padding
    padded = np.pad(x, ((0, 0), (0, 0), (ph, ph), (pw, pw)))
    windows = np.lib.stride_tricks.sliding_window_view(padded, w.shape[2:], axis=(2, 3))
    return np.einsum("ncpqrs,kcrs->nkpq", windows[:, :, ::sh, ::sw], w)


CASES = [
    # (N, C, H, W), (K, R, S), stride, padding
    ((1, 1, 1, 1), (1, 1, 1), (1, 1), (0, 0)),
    ((1, 1, 5, 5), (1, 3, 3), (1, 1), (1, 1)),
    ((2, 3, 9, 7), (4, 3, 3), (2, 1), (1, 0)),
    ((1, 2, 8, 8), (3, 5, 5), (1, 1), (2, 2)),
    ((3, 5, 11, 13), (7, 1, 1), (1, 1), (0, 0)),
    ((2, 4, 10, 10), (5, 3, 2), (3, 2), (0, 1)),
    ((1, 16, 17, 19), (33, 3, 3), (1, 1), (1, 1)),
    ((2, 3, 4, 4), (2, 4, 4), (1, 1), (0, 0)),
    ((1, 1, 3, 3), (1, 3, 3), (1, 1), (2, 2)),
    ((2, 32, 14, 14), (64, 3, 3), (2, 2), (1, 1)),
    ((1, 229, 6, 7), (5, 3, 3), (1, 1), (1, 1)),  # C*R*S = 2061: two K blocks of pairs
    ((1, 3, 15, 33), (4, 3, 3), (2, 2), (0, 0)),  # stride 2 reads x's last element
    ((2, 5, 13, 63), (6, 3, 3), (2, 2), (1, 1)),  # stride 2, output rows longer than a panel
    ((37, 2, 3, 3), (3, 2, 2), (1, 1), (0, 0)),  # 4-pixel images: a panel spans 8 of them
    ((5, 24, 7, 7), (70, 3, 3), (1, 1), (1, 1)),  # 7x7: task slices span images
    # Edge cases above again with K * C*R*S * N*P*Q of at least 40^3, where bfloat16
    # runs on AMX's tiles rather than float FMAs (gemm_amx.h: kMinTileProduct).
    ((1, 3, 15, 33), (64, 3, 3), (2, 2), (0, 0)),
    ((37, 2, 3, 3), (96, 2, 2), (1, 1), (0, 0)),
    ((3, 5, 11, 13), (40, 1, 1), (1, 1), (0, 0)),
    ((2, 4, 10, 10), (80, 3, 2), (3, 2), (0, 1)),
]


@pytest.mark.parametrize("x_shape,w_shape,stride,padding", CASES, ids=str)
def test_conv2d_matches_lax(x_shape, w_shape, stride, padding, dtype):
    x = random(x_shape, dtype, seed=1)
    k, r, s = w_shape
    w = random((k, x_shape[1], r, s), dtype, seed=2)
    actual = jax.jit(oxijax.conv2d, static_argnames=("stride", "padding"))(
        x, w, stride=stride, padding=padding)
    expected = reference(x, w, stride, padding)
    assert actual.dtype == x.dtype
    terms = x_shape[1] * r * s
    assert_close(actual, expected, dtype, scale=4.0 * np.sqrt(terms))


def test_int_stride_and_padding():
    x, w = random((1, 2, 7, 7), jnp.float64, 1), random((3, 2, 3, 3), jnp.float64, 2)
    np.testing.assert_allclose(oxijax.conv2d(x, w, stride=2, padding=1),
                               reference(x, w, (2, 2), (1, 1)), rtol=1e-12)


def test_zero_sizes():
    assert oxijax.conv2d(jnp.zeros((0, 2, 5, 5)), jnp.zeros((3, 2, 3, 3))).shape == (0, 3, 3, 3)
    np.testing.assert_array_equal(oxijax.conv2d(jnp.zeros((1, 0, 5, 5)), jnp.zeros((3, 0, 3, 3))),
                                  np.zeros((1, 3, 3, 3)))
    assert oxijax.conv2d(jnp.zeros((1, 2, 5, 5)), jnp.zeros((0, 2, 3, 3))).shape == (1, 0, 3, 3)


# (x shape, w shape, stride, padding): empty inputs, and filters larger than the padded
# input, which lax answers with an empty result (P or Q = 0) rather than an error.
SMALL_CASES = [
    ((2, 3, 0, 4), (5, 3, 1, 2), (1, 1), (0, 0)),   # H = 0: P = 0
    ((2, 3, 0, 4), (5, 3, 1, 2), (1, 1), (1, 0)),   # H = 0 padded by 1: zeros from the padding
    ((2, 3, 0, 4), (5, 3, 3, 2), (2, 1), (1, 1)),
    ((1, 2, 2, 3), (4, 2, 3, 3), (1, 1), (0, 0)),   # input smaller than the filter
    ((1, 2, 2, 3), (4, 2, 5, 2), (1, 1), (1, 0)),   # still smaller once padded
    ((1, 2, 1, 1), (3, 2, 4, 4), (2, 3), (1, 1)),
    ((1, 2, 2, 2), (3, 2, 4, 4), (1, 1), (1, 1)),   # exactly the padded size: 1x1
    ((0, 2, 1, 1), (3, 2, 4, 4), (1, 1), (0, 0)),
]


@pytest.mark.parametrize("x_shape,w_shape,stride,padding", SMALL_CASES, ids=str)
def test_empty_and_small_inputs_like_lax(x_shape, w_shape, stride, padding):
    x, w = random(x_shape, jnp.float64, 1), random(w_shape, jnp.float64, 2)

    def lax_conv(x, w):
        return jax.lax.conv_general_dilated(x, w, stride, [(p, p) for p in padding])

    def ours(x, w):
        return oxijax.conv2d(x, w, stride=stride, padding=padding)

    expected = lax_conv(x, w)
    actual = ours(x, w)
    assert actual.shape == expected.shape and actual.dtype == expected.dtype
    np.testing.assert_allclose(actual, expected, rtol=1e-12, atol=1e-12)
    # gradients of sum(y * ct) with respect to x and w, for a random ct of y's shape
    ct = random(expected.shape, jnp.float64, 3)
    loss = lambda fn: lambda x, w: (fn(x, w) * ct).sum()  # noqa: E731
    for got, want in zip(jax.grad(loss(ours), (0, 1))(x, w), jax.grad(loss(lax_conv), (0, 1))(x, w)):
        assert got.shape == want.shape
        np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)


def test_nan_propagates():
    x = random((1, 1, 4, 4), jnp.float32).at[0, 0, 1, 1].set(jnp.nan)
    out = np.asarray(oxijax.conv2d(x, jnp.ones((1, 1, 2, 2), jnp.float32)))
    assert np.isnan(out[0, 0, :2, :2]).all() and not np.isnan(out[0, 0, 2:, :]).any()


@pytest.mark.parametrize("in_axes", [(0, None), (None, 0), (0, 0), (1, 2)], ids=str)
def test_vmap_folds_into_kernel(in_axes):
    x, w = random((3, 2, 4, 6, 6), jnp.float64, 1), random((3, 5, 4, 3, 3), jnp.float64, 2)
    xs = jnp.moveaxis(x, 0, in_axes[0]) if in_axes[0] is not None else x[0]
    ws = jnp.moveaxis(w, 0, in_axes[1]) if in_axes[1] is not None else w[0]
    fn = lambda x, w: oxijax.conv2d(x, w, padding=1)  # noqa: E731
    got = jax.vmap(fn, in_axes=in_axes)(xs, ws)
    for i in range(3):
        xi = x[i] if in_axes[0] is not None else x[0]
        wi = w[i] if in_axes[1] is not None else w[0]
        np.testing.assert_allclose(got[i], reference(xi, wi, (1, 1), (1, 1)), rtol=1e-12, atol=1e-12)
    jaxpr = jax.make_jaxpr(jax.vmap(fn, in_axes=in_axes))(xs, ws)
    assert sum(e.primitive.name == "oxijax_conv2d" for e in jaxpr.eqns) == 1


def test_benchmark_sized_layer():
    x, w = random((2, 64, 30, 30), jnp.float32, 1), random((64, 64, 3, 3), jnp.float32, 2)
    assert_close(oxijax.conv2d(x, w, padding=1), reference(x, w, (1, 1), (1, 1)), jnp.float32,
                 scale=4.0 * np.sqrt(64 * 9))
