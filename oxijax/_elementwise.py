"""unary and binary: elementwise ops with NumPy broadcasting."""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from oxijax import _checks, _primitive, _sharding
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


def unary(x: Any, op: UnaryOp | str) -> jax.Array:
    """Applies ``op`` (relu, sigmoid, tanh, exp, log, sqrt, abs, neg) elementwise.

    NaN passes through every op; ``log(0) = -inf``; ``sqrt(-1) = nan``. Half types
    compute in float32 and round once.
    """
    op = UnaryOp.parse(op)
    x = _checks.array("x", x)
    if x.size == 0:
        return x
    return unary_p.bind(x, op=op)


def _binary_abstract_eval(a, b, *, op):
    return jax.core.ShapedArray(np.broadcast_shapes(a.shape, b.shape), a.dtype)


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


def _operands(a: Any, b: Any) -> tuple[jax.Array, jax.Array]:
    """Arrays of one dtype; a Python scalar takes the other operand's dtype (like jnp)."""
    scalar = (bool, int, float)
    if isinstance(a, scalar) and hasattr(b, "dtype"):
        a = jnp.asarray(a, dtype=b.dtype)
    elif isinstance(b, scalar) and hasattr(a, "dtype"):
        b = jnp.asarray(b, dtype=a.dtype)
    a, b = _checks.array("a", a), _checks.array("b", b)
    _checks.same_dtype(a=a, b=b)
    return a, b


def binary(a: Any, b: Any, op: BinaryOp | str) -> jax.Array:
    """``a (op) b`` elementwise with NumPy broadcasting (add, sub, mul, div, max, min).

    ``max``/``min`` propagate NaN like ``jnp.maximum``/``jnp.minimum``.
    """
    op = BinaryOp.parse(op)
    a, b = _operands(a, b)
    try:
        shape = np.broadcast_shapes(a.shape, b.shape)
    except ValueError:
        raise ValueError(
            f"a of shape {tuple(a.shape)} and b of shape {tuple(b.shape)} do not broadcast"
        ) from None
    if 0 in shape:
        return jnp.zeros(shape, a.dtype)
    return binary_p.bind(a, b, op=op)


def _unary_alias(op: UnaryOp):
    def alias(x: Any) -> jax.Array:
        return unary(x, op)

    alias.__name__ = alias.__qualname__ = op.name.lower()
    alias.__doc__ = f"``unary(x, UnaryOp.{op.name})``."
    return alias


def _binary_alias(op: BinaryOp, name: str):
    def alias(a: Any, b: Any) -> jax.Array:
        return binary(a, b, op)

    alias.__name__ = alias.__qualname__ = name
    alias.__doc__ = f"``binary(a, b, BinaryOp.{op.name})``."
    return alias


relu, sigmoid, tanh, exp, log, sqrt, abs, neg = (_unary_alias(op) for op in UnaryOp)
add, sub, mul, div = (_binary_alias(op, op.name.lower()) for op in list(BinaryOp)[:4])
maximum = _binary_alias(BinaryOp.MAX, "maximum")
minimum = _binary_alias(BinaryOp.MIN, "minimum")
