"""reduce: sum, max, min or mean over one axis, without transposing the input."""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp

from oxijax import _checks, _dispatch, _primitive, _sharding
from oxijax._enums import ReduceOp


def _abstract_eval(x, *, op, axis):
    return jax.core.ShapedArray(x.shape[:axis] + x.shape[axis + 1 :], x.dtype)


def _batching(args, dims, *, op, axis):
    (x,), (bdim,) = args, dims
    # The batch axis stays where it is; only the reduced axis' index may shift.
    if bdim <= axis:
        return reduce_p.bind(x, op=op, axis=axis + 1), bdim
    return reduce_p.bind(x, op=op, axis=axis), bdim - 1


def _factors(avals_in, avals_out, *, op, axis):
    dims = tuple(f"d{d}" for d in range(avals_in[0].ndim))
    return _sharding.Factors((dims,), (dims[:axis] + dims[axis + 1 :],), frozenset({dims[axis]}))


reduce_p = _primitive.define(
    "reduce", abstract_eval=_abstract_eval, batching_rule=_batching, factors=_factors,
    nan_free=lambda op, axis: op in (ReduceOp.MAX, ReduceOp.MIN),
)


def reduce(x: Any, op: ReduceOp | str, axis: int) -> jax.Array:
    """Reduces ``x`` over ``axis`` (negative allowed) with sum, max, min or mean.

    The axis is removed from the result. Half types accumulate in float32. NaN
    propagates through max and min; the mean of an empty axis is NaN; max and min of
    an empty axis raise ``ValueError``. mean takes integers too and returns floats, as
    ``jnp.mean`` does; like jnp's reductions, results are never weak-typed.
    """
    # Static params are checked before the (cached) eager jit, which would take axis=1.0
    # for the axis=1 it has seen.
    return _reduce(x, op=ReduceOp.parse(op), axis=_checks.static_int("axis", axis))


@_dispatch.eager_jit("op", "axis")
def _reduce(x: Any, *, op: ReduceOp, axis: int) -> jax.Array:
    x = _checks.array("x", x, inexact=op is ReduceOp.MEAN)
    x = _checks.strong(x)
    if x.ndim == 0:
        raise ValueError("x must have rank >= 1 to be reduced, got a scalar")
    axis = _checks.axis("axis", axis, x.ndim)
    out_shape = x.shape[:axis] + x.shape[axis + 1 :]
    if x.shape[axis] == 0:
        if op in (ReduceOp.MAX, ReduceOp.MIN):
            raise ValueError(f"{op.name.lower()} over axis {axis} of size 0 has no identity")
        return jnp.full(out_shape, 0 if op is ReduceOp.SUM else jnp.nan, x.dtype)
    if x.size == 0:
        return jnp.zeros(out_shape, x.dtype)
    return reduce_p.bind(x, op=op, axis=axis)


# The named reductions, each with its op bound once (see _dispatch.with_params_but), keyed
# by name: a str's hash is cached, an enum's is not.
_NAMED = {op.name.lower(): _dispatch.with_params_but(_reduce, "axis", op=op) for op in ReduceOp}


def sum(x: Any, axis: int) -> jax.Array:  # noqa: A001 - mirrors jnp.sum
    """``reduce(x, ReduceOp.SUM, axis)``."""
    return _NAMED["sum"](x, _checks.static_int("axis", axis))


def max(x: Any, axis: int) -> jax.Array:  # noqa: A001
    """``reduce(x, ReduceOp.MAX, axis)``."""
    return _NAMED["max"](x, _checks.static_int("axis", axis))


def min(x: Any, axis: int) -> jax.Array:  # noqa: A001
    """``reduce(x, ReduceOp.MIN, axis)``."""
    return _NAMED["min"](x, _checks.static_int("axis", axis))


def mean(x: Any, axis: int) -> jax.Array:
    """``reduce(x, ReduceOp.MEAN, axis)``."""
    return _NAMED["mean"](x, _checks.static_int("axis", axis))
