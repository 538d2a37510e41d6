"""Differentiation of gemm: out = alpha * op(a) @ op(b) + beta * c.

The tangent is gemm(da, b) + gemm(a, db) + beta * dc (gemm is bilinear in a and b);
gemm without c is transposed through gemm itself with the transpose flags swapped, and
the cotangent of an operand whose batch dims were broadcast is summed over them with
oxijax's reduce.
"""

from __future__ import annotations

from jax.interpreters import ad

from oxijax._autodiff import (Zero, is_undefined, scalar, shape_of, sum_terms, unbroadcast,
                              zero_cotangents, zero_tangent)
from oxijax._elementwise import binary_p
from oxijax._enums import BinaryOp, Transpose
from oxijax._gemm import gemm_p

N, T = Transpose.N, Transpose.T


def _flip(trans: Transpose) -> Transpose:
    return N if trans is not N else T


def _jvp(primals, tangents, *, trans_a, trans_b, alpha, beta, allow_tf32):
    a, b, *c = primals
    da, db, *dc = tangents
    params = dict(trans_a=trans_a, trans_b=trans_b, alpha=alpha, allow_tf32=allow_tf32)
    out = gemm_p.bind(*primals, beta=beta, **params)
    terms = [
        None if type(da) is Zero else gemm_p.bind(da, b, beta=0.0, **params),
        None if type(db) is Zero else gemm_p.bind(a, db, beta=0.0, **params),
    ]
    if dc and type(dc[0]) is not Zero:  # c has out's shape (gemm() broadcast it)
        terms.append(dc[0] if beta == 1.0 else
                     binary_p.bind(dc[0], scalar(beta, dc[0].dtype), op=BinaryOp.MUL))
    tangent = sum_terms(terms)
    return out, zero_tangent(out) if tangent is None else tangent


def _transpose(ct, a, b, *c, trans_a, trans_b, alpha, beta, allow_tf32):
    if c or is_undefined(a) == is_undefined(b):
        raise NotImplementedError("oxijax gemm is linear only in one of a, b (without c)")
    if type(ct) is Zero:
        return zero_cotangents(ct, a, b)
    params = dict(alpha=alpha, beta=0.0, allow_tf32=allow_tf32)
    # With A = op(a), B = op(b): dA = alpha * ct @ B^T and dB = alpha * A^T @ ct.
    if is_undefined(a):
        if trans_a is N:
            ct_a = gemm_p.bind(ct, b, trans_a=N, trans_b=_flip(trans_b), **params)
        else:  # a = A^T: da = alpha * B @ ct^T
            ct_a = gemm_p.bind(b, ct, trans_a=trans_b, trans_b=T, **params)
        return [unbroadcast(ct_a, shape_of(a)), None]
    if trans_b is N:
        ct_b = gemm_p.bind(a, ct, trans_a=_flip(trans_a), trans_b=N, **params)
    else:  # b = B^T: db = alpha * ct^T @ A
        ct_b = gemm_p.bind(ct, a, trans_a=T, trans_b=trans_a, **params)
    return [None, unbroadcast(ct_b, shape_of(b))]


ad.primitive_jvps[gemm_p] = _jvp
ad.primitive_transposes[gemm_p] = _transpose
