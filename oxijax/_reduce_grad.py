"""Differentiation of reduce.

sum and mean are linear: their tangent is the reduce of the tangent, their transpose a
broadcast of the cotangent (divided by the axis length for mean, by oxijax's div) by
oxijax's mul, whose transpose is oxijax's sum.
max and min follow JAX's rule: the tangent is the mean of the tangents at the
positions equal to the result (split equally among ties; NaN where the result is
NaN). Those positions are weighted by oxijax_binary_partial(x, result), which is 1/2
exactly where x equals the result, and the weights' sum divides: the 1/2 cancels.
"""

from __future__ import annotations

import jax.numpy as jnp
from jax import lax
from jax.interpreters import ad

from oxijax._autodiff import Zero, scalar, zero_cotangents, zero_tangent
from oxijax._elementwise import binary_p
from oxijax._elementwise_grad import binary_partial_p
from oxijax._enums import BinaryOp, ReduceOp
from oxijax._reduce import reduce_p


def _sum(x, axis):
    return reduce_p.bind(x, op=ReduceOp.SUM, axis=axis)


def _jvp(primals, tangents, *, op, axis):
    (x,), (dx,) = primals, tangents
    out = reduce_p.bind(x, op=op, axis=axis)
    if type(dx) is Zero:
        return out, zero_tangent(out)
    if op in (ReduceOp.SUM, ReduceOp.MEAN):
        return out, reduce_p.bind(dx, op=op, axis=axis)
    chooser = BinaryOp.MAX if op is ReduceOp.MAX else BinaryOp.MIN
    weights = binary_partial_p.bind(x, lax.expand_dims(out, (axis,)), op=chooser)
    chosen = _sum(binary_p.bind(dx, weights, op=BinaryOp.MUL), axis)
    return out, binary_p.bind(chosen, _sum(weights, axis), op=BinaryOp.DIV)


def _transpose(ct, x, *, op, axis):
    if op not in (ReduceOp.SUM, ReduceOp.MEAN):
        raise NotImplementedError(f"oxijax reduce {op.name.lower()} is not linear")
    if type(ct) is Zero:
        return zero_cotangents(ct, x)
    shape = x.aval.shape
    if op is ReduceOp.MEAN:
        ct = binary_p.bind(ct, scalar(shape[axis], ct.dtype), op=BinaryOp.DIV)
    # Broadcast back by multiplying with ones along the axis (exact, -0.0 and NaN
    # included): transposed in turn (third derivatives), that is oxijax's sum again,
    # where lax.broadcast_in_dim's transpose would be XLA's reduce_sum.
    ones = jnp.ones((1,) * axis + (shape[axis],) + (1,) * (len(shape) - axis - 1), ct.dtype)
    kept = shape[:axis] + (1,) + shape[axis + 1:]
    return [binary_p.bind(ct.reshape(kept), ones, op=BinaryOp.MUL)]


ad.primitive_jvps[reduce_p] = _jvp
ad.primitive_transposes[reduce_p] = _transpose
