"""Shared pieces of oxijax's differentiation rules.

Every forward primitive gets a JVP rule whose tangent is built from oxijax primitives
that are linear in the tangent (gemm, conv2d and its backward primitives, binary
add/sub/mul/div, unary neg and unary_grad, reduce sum/mean). Those have transpose
rules that again call oxijax primitives, so reverse mode runs oxijax kernels only;
broadcasts and reshapes are the only other ops in a gradient.
"""

from __future__ import annotations

from collections.abc import Sequence

import jax
import jax.numpy as jnp
from jax.interpreters import ad

from oxijax._elementwise import binary_p, unary_p
from oxijax._enums import BinaryOp, ReduceOp, UnaryOp
from oxijax._reduce import reduce_p

Zero = ad.Zero
is_undefined = ad.is_undefined_primal


def shape_of(x) -> tuple[int, ...]:
    """The shape of an array, or of the undefined primal (or gradient accumulator, which
    JAX's bilinear transposes pass) in a transpose rule."""
    return tuple(x.aval.shape) if hasattr(x, "aval") else tuple(jnp.shape(x))


def zero_tangent(primal) -> Zero:
    """A symbolic zero tangent for a primal value."""
    return Zero(jax.typeof(primal).to_tangent_aval())


def sum_terms(terms):
    """Sum (by oxijax's add) of the tangent terms that are not None; None if none is."""
    total = None
    for term in terms:
        if term is not None:
            total = term if total is None else binary_p.bind(total, term, op=BinaryOp.ADD)
    return total


def zero_cotangents(ct, *args):
    """Transpose rules' answer to a symbolic zero cotangent: zeros for the undefined args."""
    return [Zero(x.aval.to_ct_aval()) if is_undefined(x) else None for x in args]


def neg(x):
    return unary_p.bind(x, op=UnaryOp.NEG)


def scalar(value: float, dtype) -> jax.Array:
    return jnp.asarray(value, dtype)


def unbroadcast(ct: jax.Array, shape: Sequence[int]) -> jax.Array:
    """The cotangent of an operand NumPy-broadcast from `shape` to ct.shape: ct summed
    (by oxijax's reduce) over the dims broadcasting added or stretched."""
    shape = tuple(shape)
    if ct.shape == shape:
        return ct
    lead = ct.ndim - len(shape)
    stretched = [d for d in range(ct.ndim)
                 if d < lead or (shape[d - lead] == 1 and ct.shape[d] != 1)]
    for d in reversed(stretched):  # highest first: lower indices stay valid
        ct = reduce_p.bind(ct, op=ReduceOp.SUM, axis=d)
    return ct.reshape(shape)
