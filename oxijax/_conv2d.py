"""conv2d: NCHW x KCRS cross-correlation, as an implicit GEMM in the kernels."""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp

from oxijax import _checks, _dispatch, _primitive, _sharding


# Largest stride and padding, as in the C++ checks (ffi/bindings/checks.cc): far beyond any
# real use, far below the overflow of the kernels' index arithmetic.
MAX_STEP = 2**31 - 1


# max of sizes that may be symbolic (jax.export): Python's max cannot compare those.
_max_dim = getattr(jax.core, "max_dim", max)


def _output_size(size: int, pad: int, window: int, stride: int) -> int:
    """Output positions along one axis; 0 when the window is larger than the padded
    input, as in lax (an empty result, not an error)."""
    return _max_dim((size + 2 * pad - window) // stride + 1, 0)


def _abstract_eval(x, w, *, stride_h, stride_w, pad_h, pad_w):
    groups, n, _, h, wd = x.shape
    k, r, s = w.shape[1], w.shape[3], w.shape[4]
    p, q = _output_size(h, pad_h, r, stride_h), _output_size(wd, pad_w, s, stride_w)
    return jax.core.ShapedArray((groups, n, k, p, q), x.dtype)


# The primitive works on [G, N, C, H, W] * [G, K, C, R, S] -> [G, N, K, P, Q]: G
# independent convolutions. vmap folds into N (only x batched), K (only w batched) or G.
def _batching(args, dims, **params):
    (x, w), (x_dim, w_dim) = args, dims
    if w_dim is None:
        x = jnp.moveaxis(x, x_dim, 1)  # [G, B, N, C, H, W]
        g, size, n = x.shape[:3]
        out = conv2d_p.bind(x.reshape(g, size * n, *x.shape[3:]), w, **params)
        return out.reshape(g, size, n, *out.shape[2:]), 1
    if x_dim is None:
        w = jnp.moveaxis(w, w_dim, 1)  # [G, B, K, C, R, S]
        g, size, k = w.shape[:3]
        out = conv2d_p.bind(x, w.reshape(g, size * k, *w.shape[3:]), **params)
        out = out.reshape(out.shape[0], out.shape[1], size, k, *out.shape[3:])
        return out, 2
    x, w = jnp.moveaxis(x, x_dim, 0), jnp.moveaxis(w, w_dim, 0)
    size, g = x.shape[:2]
    out = conv2d_p.bind(
        x.reshape(size * g, *x.shape[2:]), w.reshape(size * g, *w.shape[2:]), **params
    )
    return out.reshape(size, g, *out.shape[1:]), 0


def _factors(avals_in, avals_out, **params):
    """Groups, images and filters split freely; channels and the spatial dims (whose
    windows overlap across a split) are replicated."""
    return _sharding.Factors(
        (("g", "n", "c", "h", "w"), ("g", "k", "c", "r", "s")), (("g", "n", "k", "p", "q"),),
        frozenset("chwrspq"),
    )


conv2d_p = _primitive.define(
    "conv2d", abstract_eval=_abstract_eval, batching_rule=_batching, factors=_factors
)


def conv2d(
    x: Any,
    w: Any,
    *,
    stride: int | tuple[int, int] = (1, 1),
    padding: int | tuple[int, int] = (0, 0),
) -> jax.Array:
    """2-D cross-correlation: ``x`` [N, C, H, W] with ``w`` [K, C, R, S] -> [N, K, P, Q].

    ``P = max(0, (H + 2*pad_h - R) // stride_h + 1)`` and likewise ``Q``; zero padding
    (a filter larger than the padded input gives an empty result). Equals
    ``lax.conv_general_dilated(x, w, stride, [(ph, ph), (pw, pw)])``, with x and w
    promoted as in jax.numpy.
    """
    stride = _checks.static_int_pair("stride", stride, 1, MAX_STEP)
    padding = _checks.static_int_pair("padding", padding, 0, MAX_STEP)
    return _conv2d(x, w, stride=stride, padding=padding)


@_dispatch.eager_jit("stride", "padding")
def _conv2d(x: Any, w: Any, *, stride: tuple[int, int], padding: tuple[int, int]) -> jax.Array:
    x, w = _checks.promote(x=x, w=w)
    _checks.rank("x", x, "4 (N, C, H, W)", x.ndim == 4)
    _checks.rank("w", w, "4 (K, C, R, S)", w.ndim == 4)
    (stride_h, stride_w), (pad_h, pad_w) = stride, padding
    n, c, h, wd = x.shape
    k, c_w, r, s = w.shape
    if c != c_w:
        raise ValueError(f"channels differ: x has C={c} {tuple(x.shape)}, w has C={c_w} {tuple(w.shape)}")
    out_shape = (n, k, _output_size(h, pad_h, r, stride_h), _output_size(wd, pad_w, s, stride_w))
    # An empty result, or one that sums only padding or nothing: no kernel to run.
    if 0 in out_shape or 0 in x.shape or 0 in w.shape:
        return jnp.zeros(out_shape, x.dtype)
    params = dict(stride_h=stride_h, stride_w=stride_w, pad_h=pad_h, pad_w=pad_w)
    # reshapes, not x[None] and [0]: their transposes are reshapes, not (trivial) XLA sums
    out = conv2d_p.bind(x.reshape(1, *x.shape), w.reshape(1, *w.shape), **params)
    return out.reshape(out_shape)
