"""Differentiation of conv2d, and its backward primitives.

conv2d is bilinear in (x, w); so are its two backward primitives, and the three are
each other's transposes:
  oxijax_conv2d_backward_data(dy, w)   -> dx, the transpose of conv2d in x,
  oxijax_conv2d_backward_filter(x, dy) -> dw, the transpose of conv2d in w.
Both forward and reverse mode, and derivatives of any order, are therefore oxijax
kernels. All three work on [G, N, C, H, W] / [G, K, C, R, S] / [G, N, K, P, Q] (see
_conv2d.py) and carry the forward's stride and padding; the backward primitives also
carry the size that the stride makes ambiguous (the input's H, W or the filter's R, S).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax.interpreters import ad

from oxijax import _primitive, _sharding
from oxijax._autodiff import shape_of
from oxijax._conv2d import conv2d_p

_CONV = ("stride_h", "stride_w", "pad_h", "pad_w")


def _conv_params(params):
    return {k: params[k] for k in _CONV}


# ---------------------------------------------------------------- backward data


def _data_abstract_eval(dy, w, *, input_h, input_w, **conv):
    return jax.core.ShapedArray((dy.shape[0], dy.shape[1], w.shape[2], input_h, input_w), dy.dtype)


def _data_batching(args, dims, **params):
    (dy, w), (dy_dim, w_dim) = args, dims
    if w_dim is None:  # fold the batch into the images
        dy = jnp.moveaxis(dy, dy_dim, 1)
        g, size, n = dy.shape[:3]
        out = backward_data_p.bind(dy.reshape(g, size * n, *dy.shape[3:]), w, **params)
        return out.reshape(g, size, n, *out.shape[2:]), 1
    if dy_dim is None:  # into the channels: each channel's gradient is independent
        w = jnp.moveaxis(w, w_dim, 2)  # [G, K, B, C, R, S]
        g, k, size, c = w.shape[:4]
        out = backward_data_p.bind(dy, w.reshape(g, k, size * c, *w.shape[4:]), **params)
        return out.reshape(out.shape[0], out.shape[1], size, c, *out.shape[3:]), 2
    dy, w = jnp.moveaxis(dy, dy_dim, 0), jnp.moveaxis(w, w_dim, 0)
    size, g = dy.shape[:2]
    out = backward_data_p.bind(dy.reshape(size * g, *dy.shape[2:]),
                               w.reshape(size * g, *w.shape[2:]), **params)
    return out.reshape(size, g, *out.shape[1:]), 0


def _data_factors(avals_in, avals_out, **params):
    """Groups, images and input channels split; filters (contracted) and space do not."""
    return _sharding.Factors(
        (("g", "n", "k", "p", "q"), ("g", "k", "c", "r", "s")), (("g", "n", "c", "h", "w"),),
        frozenset("khwrspq"),
    )


backward_data_p = _primitive.define(
    "conv2d_backward_data", abstract_eval=_data_abstract_eval, batching_rule=_data_batching,
    factors=_data_factors,
)

# ---------------------------------------------------------------- backward filter


def _filter_abstract_eval(x, dy, *, filter_h, filter_w, **conv):
    return jax.core.ShapedArray((x.shape[0], dy.shape[2], x.shape[2], filter_h, filter_w), x.dtype)


def _filter_batching(args, dims, **params):
    (x, dy), (x_dim, dy_dim) = args, dims
    if x_dim is None:  # fold the batch into the filters
        dy = jnp.moveaxis(dy, dy_dim, 2)  # [G, N, B, K, P, Q]
        g, n, size, k = dy.shape[:4]
        out = backward_filter_p.bind(x, dy.reshape(g, n, size * k, *dy.shape[4:]), **params)
        return out.reshape(out.shape[0], size, k, *out.shape[2:]), 1
    if dy_dim is None:  # into the channels
        x = jnp.moveaxis(x, x_dim, 2)  # [G, N, B, C, H, W]
        g, n, size, c = x.shape[:4]
        out = backward_filter_p.bind(x.reshape(g, n, size * c, *x.shape[4:]), dy, **params)
        return out.reshape(out.shape[0], out.shape[1], size, c, *out.shape[3:]), 2
    x, dy = jnp.moveaxis(x, x_dim, 0), jnp.moveaxis(dy, dy_dim, 0)
    size, g = x.shape[:2]
    out = backward_filter_p.bind(x.reshape(size * g, *x.shape[2:]),
                                 dy.reshape(size * g, *dy.shape[2:]), **params)
    return out.reshape(size, g, *out.shape[1:]), 0


def _filter_factors(avals_in, avals_out, **params):
    """Groups, filters and channels split; images (contracted) and space do not."""
    return _sharding.Factors(
        (("g", "n", "c", "h", "w"), ("g", "n", "k", "p", "q")), (("g", "k", "c", "r", "s"),),
        frozenset("nhwrspq"),
    )


backward_filter_p = _primitive.define(
    "conv2d_backward_filter", abstract_eval=_filter_abstract_eval,
    batching_rule=_filter_batching, factors=_filter_factors,
)

# ---------------------------------------------------------------- transposes


def _data(dy, w, like_x, params):
    """dx for a forward input shaped like like_x."""
    h, wd = shape_of(like_x)[3:]
    return backward_data_p.bind(dy, w, input_h=h, input_w=wd, **_conv_params(params))


def _filter(x, dy, like_w, params):
    r, s = shape_of(like_w)[3:]
    return backward_filter_p.bind(x, dy, filter_h=r, filter_w=s, **_conv_params(params))


def _conv(x, w, params):
    return conv2d_p.bind(x, w, **_conv_params(params))


# conv2d(x, w) = y:           x <- data(ct, w),   w <- filter(x, ct)
ad.defbilinear(conv2d_p,
               lambda ct, x, w, **p: _data(ct, w, x, p),
               lambda ct, x, w, **p: _filter(x, ct, w, p))
# backward_data(dy, w) = dx:  dy <- conv2d(ct, w), w <- filter(ct, dy)
ad.defbilinear(backward_data_p,
               lambda ct, dy, w, **p: _conv(ct, w, p),
               lambda ct, dy, w, **p: _filter(ct, dy, w, p))
# backward_filter(x, dy) = dw: x <- data(dy, ct),  dy <- conv2d(x, ct)
ad.defbilinear(backward_filter_p,
               lambda ct, x, dy, **p: _data(dy, ct, x, p),
               lambda ct, x, dy, **p: _conv(x, ct, p))
