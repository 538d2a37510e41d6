"""Differentiation of unary and binary, and their backward primitives.

- unary: tangent = oxijax_unary_grad(x, dx) = dx * f'(x) (one kernel; neg is linear).
  unary_grad is linear in dx and its own transpose. Its derivative in x is
  t * dx * f''(x), with f'' written in oxijax primitives (unary_grad, unary, binary), so
  derivatives of every order are oxijax kernels.
- binary: add/sub/mul/div through binary itself (and neg); max/min weigh each operand's
  tangent by oxijax_binary_partial, JAX's rule (1/2 each on ties). The cotangent of a
  broadcast operand is summed back to its shape with oxijax's reduce.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax.interpreters import ad

from oxijax import _primitive, _sharding
from oxijax._autodiff import (Zero, is_undefined, neg, scalar, shape_of, sum_terms, unbroadcast,
                              zero_cotangents, zero_tangent)
from oxijax._elementwise import binary_p, lift_batch, unary_p
from oxijax._enums import BinaryOp, UnaryOp

# ---------------------------------------------------------------- unary


def _unary_grad_batching(args, dims, *, op):
    """x and t share one shape: an unbatched one is broadcast to the batch."""
    if dims[0] == dims[1]:
        return unary_grad_p.bind(*args, op=op), dims[0]
    size = next(x.shape[d] for x, d in zip(args, dims) if d is not None)
    args = [_primitive.move_batch_to_front(x, d, size) for x, d in zip(args, dims)]
    return unary_grad_p.bind(*args, op=op), 0


unary_grad_p = _primitive.define(
    "unary_grad",
    abstract_eval=lambda x, t, *, op: jax.core.ShapedArray(x.shape, x.dtype),
    batching_rule=_unary_grad_batching, factors=_sharding.elementwise,
)


def _unary_jvp(primals, tangents, *, op):
    (x,), (dx,) = primals, tangents
    out = unary_p.bind(x, op=op)
    if type(dx) is Zero:
        return out, dx
    if op is UnaryOp.NEG:
        return out, neg(dx)
    return out, unary_grad_p.bind(x, dx, op=op)


def _unary_transpose(ct, x, *, op):
    if op is not UnaryOp.NEG:
        raise NotImplementedError(f"oxijax unary {op.name.lower()} is not linear")
    return zero_cotangents(ct, x) if type(ct) is Zero else [neg(ct)]


def _second_derivative(x, u, op):
    """u * f''(x) for the unary op f, from oxijax primitives (themselves differentiable,
    so every order works); None where f'' = 0 (relu and abs, as in JAX, and neg)."""
    def grad(v):  # v * f'(x)
        return unary_grad_p.bind(x, v, op=op)

    def mul(a, b):
        return binary_p.bind(a, b, op=BinaryOp.MUL)

    if op is UnaryOp.EXP:  # exp'' = exp'
        return grad(u)
    if op is UnaryOp.LOG:  # log'' = -1/x^2 = -log'^2
        return neg(grad(grad(u)))
    if op is UnaryOp.SQRT:  # sqrt'' = -2 sqrt'^3 (infinite at -0.0 with JAX's sign)
        return mul(grad(grad(grad(u))), scalar(-2.0, u.dtype))
    if op is UnaryOp.TANH:  # tanh'' = -2 tanh tanh'
        return mul(grad(u), mul(unary_p.bind(x, op=op), scalar(-2.0, u.dtype)))
    if op is UnaryOp.SIGMOID:  # sigmoid'' = sigmoid' (1 - 2 sigmoid) = -sigmoid' tanh(x/2),
        # which, unlike 1 - 2 sigmoid, does not cancel near 0 in half types
        half_x = mul(x, scalar(0.5, x.dtype))
        return neg(mul(grad(u), unary_p.bind(half_x, op=UnaryOp.TANH)))
    return None


def _unary_grad_jvp(primals, tangents, *, op):
    (x, t), (dx, dt) = primals, tangents
    out = unary_grad_p.bind(x, t, op=op)
    terms = [None if type(dt) is Zero else unary_grad_p.bind(x, dt, op=op)]
    if type(dx) is not Zero:  # d/dx (t * f'(x)) = (t * dx) * f''(x)
        terms.append(_second_derivative(x, binary_p.bind(t, dx, op=BinaryOp.MUL), op))
    tangent = sum_terms(terms)
    return out, zero_tangent(out) if tangent is None else tangent


def _unary_grad_transpose(ct, x, t, *, op):
    if is_undefined(x):
        raise NotImplementedError("oxijax_unary_grad is not linear in x")
    if type(ct) is Zero:
        return zero_cotangents(ct, x, t)
    return [None, unary_grad_p.bind(x, ct, op=op)]  # diagonal: its own transpose


ad.primitive_jvps[unary_p] = _unary_jvp
ad.primitive_transposes[unary_p] = _unary_transpose
ad.primitive_jvps[unary_grad_p] = _unary_grad_jvp
ad.primitive_transposes[unary_grad_p] = _unary_grad_transpose

# ---------------------------------------------------------------- binary

binary_partial_p = _primitive.define(
    "binary_partial",
    abstract_eval=lambda a, b, *, op: jax.core.ShapedArray(
        jnp.broadcast_shapes(a.shape, b.shape), a.dtype),
    batching_rule=lambda args, dims, **params: (
        binary_partial_p.bind(*lift_batch(args, dims), **params), 0),
    factors=_sharding.elementwise, nan_free=lambda op: True,  # 0, 1/2 or 1
)

def _binary_partial_jvp(primals, tangents, *, op):
    out = binary_partial_p.bind(*primals, op=op)
    return out, zero_tangent(out)  # piecewise constant


ad.primitive_jvps[binary_partial_p] = _binary_partial_jvp


def _bin(a, b, op):
    return binary_p.bind(a, b, op=op)


def _binary_jvp(primals, tangents, *, op):
    (a, b), (da, db) = primals, tangents
    out = _bin(a, b, op)
    if type(da) is Zero and type(db) is Zero:
        return out, zero_tangent(out)
    # Each term below has out's shape: a lone tangent of a broadcast operand is
    # broadcast by adding the other operand's zeros.
    if op is BinaryOp.ADD or op is BinaryOp.SUB:
        if type(db) is Zero and da.shape == out.shape:
            return out, da
        if type(da) is Zero and db.shape == out.shape:
            return out, neg(db) if op is BinaryOp.SUB else db
        if type(da) is Zero:
            da = jnp.zeros(a.shape, a.dtype)
        if type(db) is Zero:
            db = jnp.zeros(b.shape, b.dtype)
        return out, _bin(da, db, op)
    # Terms for the nonzero tangents only (each a function of that tangent).
    if op is BinaryOp.MUL:
        rules = (lambda t: _bin(t, b, op), lambda t: _bin(a, t, op))
    elif op is BinaryOp.DIV:  # da / b - (db * out) / b
        rules = (lambda t: _bin(t, b, op),
                 lambda t: neg(_bin(_bin(t, out, BinaryOp.MUL), b, op)))
    else:  # max / min
        rules = (lambda t: _bin(t, binary_partial_p.bind(a, b, op=op), BinaryOp.MUL),
                 lambda t: _bin(t, binary_partial_p.bind(b, a, op=op), BinaryOp.MUL))
    return out, sum_terms(rule(t) for rule, t in zip(rules, (da, db)) if type(t) is not Zero)


def _binary_transpose(ct, a, b, *, op):
    if type(ct) is Zero:
        return zero_cotangents(ct, a, b)
    ct_a = ct_b = None
    if op is BinaryOp.ADD or op is BinaryOp.SUB:
        if is_undefined(a):
            ct_a = unbroadcast(ct, shape_of(a))
        if is_undefined(b):
            ct_b = unbroadcast(ct, shape_of(b))
            ct_b = neg(ct_b) if op is BinaryOp.SUB else ct_b
    elif op is BinaryOp.MUL and is_undefined(a) != is_undefined(b):
        ct_a = unbroadcast(_bin(ct, b, op), shape_of(a)) if is_undefined(a) else None
        ct_b = unbroadcast(_bin(a, ct, op), shape_of(b)) if is_undefined(b) else None
    elif op is BinaryOp.DIV and is_undefined(a) and not is_undefined(b):
        ct_a = unbroadcast(_bin(ct, b, op), shape_of(a))
    else:
        raise NotImplementedError(f"oxijax binary {op.name.lower()} is not linear in these operands")
    return [ct_a, ct_b]


ad.primitive_jvps[binary_p] = _binary_jvp
ad.primitive_transposes[binary_p] = _binary_transpose
