"""unary and binary: elementwise ops with NumPy broadcasting."""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp

from oxijax import _checks, _dispatch, _primitive, _sharding
from oxijax._enums import BinaryOp, UnaryOp


def _unary_abstract_eval(x, *, op):
    return jax.core.ShapedArray(x.shape, x.dtype)


def _unary_batching(args, dims, *, op):
    (x,), (bdim,) = args, dims
    return unary_p.bind(x, op=op), bdim  # elementwise: the batch axis passes through


unary_p = _primitive.define(
    "unary", abstract_eval=_unary_abstract_eval, batching_rule=_unary_batching,
    factors=_sharding.elementwise,
    nan_free=lambda op: op in (UnaryOp.RELU, UnaryOp.ABS, UnaryOp.NEG),
)


# Ops whose jnp counterpart turns integer inputs into floats (jnp.exp(int32) is float32);
# relu, abs and neg keep jnp's integer results and sigmoid rejects integers: a TypeError.
_TO_FLOAT = frozenset({UnaryOp.TANH, UnaryOp.EXP, UnaryOp.LOG, UnaryOp.SQRT})


def unary(x: Any, op: UnaryOp | str) -> jax.Array:
    """Applies ``op`` (relu, sigmoid, tanh, exp, log, sqrt, abs, neg) elementwise.

    NaN passes through every op; ``log(0) = -inf``; ``sqrt(-1) = nan``. Half types
    compute in float32 and round once. tanh, exp, log and sqrt take integers too and
    return floats, as jnp's do.
    """
    return _unary(x, op=UnaryOp.parse(op))


@_dispatch.eager_jit("op")
def _unary(x: Any, *, op: UnaryOp) -> jax.Array:
    x = _checks.array("x", x, inexact=op in _TO_FLOAT)
    if x.size == 0:
        return x
    return unary_p.bind(x, op=op)


def _binary_abstract_eval(a, b, *, op):
    return jax.core.ShapedArray(jnp.broadcast_shapes(a.shape, b.shape), a.dtype)


def lift_batch(args, dims):
    """Two NumPy-broadcasting operands with vmap's axis in front (size 1 where unbatched)."""
    size = next(x.shape[d] for x, d in zip(args, dims) if d is not None)
    # Logical (unbatched) rank of the result; both operands become [batch, 1.., *shape].
    ranks = [x.ndim - (d is not None) for x, d in zip(args, dims)]
    out_rank = max(ranks)
    lifted = []
    for x, d, r in zip(args, dims, ranks):
        if d is None:
            lifted.append(x.reshape((1,) * (out_rank + 1 - r) + x.shape))
        else:
            x = jnp.moveaxis(x, d, 0)
            lifted.append(x.reshape((size,) + (1,) * (out_rank - r) + x.shape[1:]))
    return lifted


def _binary_batching(args, dims, *, op):
    return binary_p.bind(*lift_batch(args, dims), op=op), 0


binary_p = _primitive.define(
    "binary", abstract_eval=_binary_abstract_eval, batching_rule=_binary_batching,
    factors=_sharding.elementwise,
    nan_free=lambda op: op in (BinaryOp.MAX, BinaryOp.MIN),
    divisor=lambda op: 1 if op is BinaryOp.DIV else None,
)


def binary(a: Any, b: Any, op: BinaryOp | str) -> jax.Array:
    """``a (op) b`` elementwise with NumPy broadcasting (add, sub, mul, div, max, min).

    Dtypes promote as in jax.numpy (a Python scalar takes the array's dtype).
    ``max``/``min`` propagate NaN like ``jnp.maximum``/``jnp.minimum``.
    """
    return _binary(a, b, op=BinaryOp.parse(op))


@_dispatch.eager_jit("op")
def _binary(a: Any, b: Any, *, op: BinaryOp) -> jax.Array:
    a, b = _checks.promote(op is BinaryOp.DIV, a=a, b=b)
    try:
        shape = jnp.broadcast_shapes(a.shape, b.shape)
    except ValueError:
        raise ValueError(
            f"a of shape {tuple(a.shape)} and b of shape {tuple(b.shape)} do not broadcast"
        ) from None
    if 0 in shape:
        return jnp.zeros(shape, a.dtype)
    return binary_p.bind(a, b, op=op)


# The named forms of unary and binary, each with its op bound once: an eager call
# neither parses nor hashes it (keyed by name: a str's hash is cached, an enum's is not).
_NAMED_UNARY = {op.name.lower(): _dispatch.with_params(_unary, op=op) for op in UnaryOp}
_NAMED_BINARY = {op.name.lower(): _dispatch.with_params(_binary, op=op) for op in BinaryOp}


def relu(x: Any) -> jax.Array:
    """``max(x, 0)`` elementwise (NaN stays NaN): ``unary(x, "relu")``."""
    return _NAMED_UNARY["relu"](x)


def sigmoid(x: Any) -> jax.Array:
    """``1 / (1 + exp(-x))`` elementwise: ``unary(x, "sigmoid")``."""
    return _NAMED_UNARY["sigmoid"](x)


def tanh(x: Any) -> jax.Array:
    """Hyperbolic tangent elementwise: ``unary(x, "tanh")``."""
    return _NAMED_UNARY["tanh"](x)


def exp(x: Any) -> jax.Array:
    """``e**x`` elementwise: ``unary(x, "exp")``."""
    return _NAMED_UNARY["exp"](x)


def log(x: Any) -> jax.Array:
    """Natural logarithm elementwise (``log(0) = -inf``): ``unary(x, "log")``."""
    return _NAMED_UNARY["log"](x)


def sqrt(x: Any) -> jax.Array:
    """Square root elementwise (``sqrt(-1) = nan``): ``unary(x, "sqrt")``."""
    return _NAMED_UNARY["sqrt"](x)


def abs(x: Any) -> jax.Array:  # noqa: A001 - mirrors jnp.abs
    """Absolute value elementwise: ``unary(x, "abs")``."""
    return _NAMED_UNARY["abs"](x)


def neg(x: Any) -> jax.Array:
    """``-x`` elementwise: ``unary(x, "neg")``."""
    return _NAMED_UNARY["neg"](x)


def add(a: Any, b: Any) -> jax.Array:
    """``a + b`` with broadcasting: ``binary(a, b, "add")``."""
    return _NAMED_BINARY["add"](a, b)


def sub(a: Any, b: Any) -> jax.Array:
    """``a - b`` with broadcasting: ``binary(a, b, "sub")``."""
    return _NAMED_BINARY["sub"](a, b)


def mul(a: Any, b: Any) -> jax.Array:
    """``a * b`` with broadcasting: ``binary(a, b, "mul")``."""
    return _NAMED_BINARY["mul"](a, b)


def div(a: Any, b: Any) -> jax.Array:
    """``a / b`` with broadcasting: ``binary(a, b, "div")``."""
    return _NAMED_BINARY["div"](a, b)


def maximum(a: Any, b: Any) -> jax.Array:
    """Elementwise maximum, NaN-propagating like ``jnp.maximum``: ``binary(a, b, "max")``."""
    return _NAMED_BINARY["max"](a, b)


def minimum(a: Any, b: Any) -> jax.Array:
    """Elementwise minimum, NaN-propagating like ``jnp.minimum``: ``binary(a, b, "min")``."""
    return _NAMED_BINARY["min"](a, b)
