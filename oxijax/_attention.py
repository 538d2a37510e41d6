"""attention: softmax(scale * q k^T) v, fused with an online softmax, and its derivatives.

``attention_p`` returns the output and the rows' log-sum-exp (lse). Its JVP rule binds
``attention_jvp_p``, a fused kernel linear in the tangents (dq, dk, dv), so forward mode
(``jax.jvp``, ``jax.jacfwd``) keeps O(S) memory. Reverse mode is JAX's linearize and
transpose: the transpose of ``attention_jvp_p`` is ``attention_backward_p``, the
FlashAttention-2 backward from the saved lse, and vice versa. Second derivatives would
need the derivatives of those two kernels in q, k, v and raise instead.
"""

from __future__ import annotations

import math
from typing import Any

import jax
import jax.numpy as jnp

from jax.interpreters import ad

from oxijax import _checks, _dispatch, _primitive, _sharding
from oxijax._autodiff import Zero, is_undefined, zero_cotangents, zero_tangent


def _abstract_eval(q, k, v, *, scale, causal, allow_tf32):
    lse_dtype = jnp.float64 if q.dtype == jnp.float64 else jnp.float32
    return (
        jax.core.ShapedArray(q.shape, q.dtype),
        jax.core.ShapedArray(q.shape[:3], lse_dtype),
    )


def _folded(primitive, args, dims, **params):
    """Batching of an attention primitive: vmap's axis joins the kernel's batch axis of
    every operand and result, [V, B, ...] -> [V * B, ...]."""
    size = next(x.shape[d] for x, d in zip(args, dims) if d is not None)
    moved = (_primitive.move_batch_to_front(x, d, size) for x, d in zip(args, dims))
    results = primitive.bind(*(x.reshape(size * x.shape[1], *x.shape[2:]) for x in moved),
                             **params)
    unfold = lambda r: r.reshape(size, -1, *r.shape[1:])  # noqa: E731
    if not primitive.multiple_results:
        return unfold(results), 0
    return tuple(map(unfold, results)), (0,) * len(results)


def _batching(args, dims, **params):
    return _folded(attention_p, args, dims, **params)


def _jvp_batching(args, dims, **params):
    return _folded(attention_jvp_p, args, dims, **params)


def _backward_batching(args, dims, **params):
    return _folded(attention_backward_p, args, dims, **params)


def _factors(avals_in, avals_out, *, scale, causal, allow_tf32):
    """Batch and heads split freely, queries too unless causal (the mask's offset
    Skv - Sq is global); keys and head_dim are replicated."""
    replicated = {"kv", "d"} | ({"q"} if causal else set())
    kv = ("b", "h", "kv", "d")
    return _sharding.Factors((("b", "h", "q", "d"), kv, kv),
                             (("b", "h", "q", "d"), ("b", "h", "q")), frozenset(replicated))


def _jvp_factors(avals_in, avals_out, *, scale, causal):
    """As the forward's: each query row's tangent needs only its own q, out, lse, dq."""
    replicated = {"kv", "d"} | ({"q"} if causal else set())
    q, kv = ("b", "h", "q", "d"), ("b", "h", "kv", "d")
    return _sharding.Factors((q, kv, kv, q, ("b", "h", "q"), q, kv, kv), (q,),
                             frozenset(replicated))


def _backward_factors(avals_in, avals_out, *, scale, causal):
    """Batch and heads split freely; dk and dv sum over the queries, so queries, keys
    and head_dim are replicated."""
    q, kv = ("b", "h", "q", "d"), ("b", "h", "kv", "d")
    return _sharding.Factors((q, kv, kv, q, ("b", "h", "q"), q), (q, kv, kv),
                             frozenset({"q", "kv", "d"}))


def _jvp_abstract_eval(q, k, v, out, lse, dq, dk, dv, *, scale, causal):
    return jax.core.ShapedArray(q.shape, q.dtype)


def _backward_abstract_eval(q, k, v, out, lse, dout, *, scale, causal):
    return tuple(jax.core.ShapedArray(x.shape, x.dtype) for x in (q, k, v))


attention_p = _primitive.define(
    "attention", abstract_eval=_abstract_eval, batching_rule=_batching, multiple_results=True,
    factors=_factors,
)
# attention_jvp_p(q, k, v, out, lse, dq, dk, dv) -> dout: the tangent of out.
attention_jvp_p = _primitive.define(
    "attention_jvp", abstract_eval=_jvp_abstract_eval, batching_rule=_jvp_batching,
    factors=_jvp_factors,
)
# attention_backward_p(q, k, v, out, lse, dout) -> (dq, dk, dv): the transpose of the JVP.
attention_backward_p = _primitive.define(
    "attention_backward", abstract_eval=_backward_abstract_eval,
    batching_rule=_backward_batching, multiple_results=True, factors=_backward_factors,
)

_SECOND_ORDER = (
    "oxijax.attention supports first derivatives only (jax.grad, jax.vjp, jax.jvp, "
    "jax.jacfwd, jax.jacrev); differentiating its derivative again (jax.hessian, "
    "Hessian-vector products) is not implemented")


def _jvp(primals, tangents, *, scale, causal, allow_tf32):
    q, k, v = primals
    out, lse = attention_p.bind(q, k, v, scale=scale, causal=causal, allow_tf32=allow_tf32)
    # Zero tangents are instantiated: the kernel is one fused pass either way.
    dq, dk, dv = map(ad.instantiate_zeros, tangents)
    dout = attention_jvp_p.bind(q, k, v, out, lse, dq, dk, dv, scale=scale, causal=causal)
    # lse is the kernels' residual, never returned by oxijax.attention: no tangent.
    return (out, lse), (dout, zero_tangent(lse))


def _linear_jvp(primitive, nonlinear):
    """JVP of a primitive linear in its operands after the first `nonlinear` ones (the
    primal q, k, v, out, lse): itself applied to their tangents, where the others have none."""
    def rule(primals, tangents, **params):
        if any(type(t) is not Zero for t in tangents[:nonlinear]):
            raise NotImplementedError(_SECOND_ORDER)
        result = primitive.bind(*primals, **params)
        linear = [ad.instantiate_zeros(t) for t in tangents[nonlinear:]]
        return result, primitive.bind(*primals[:nonlinear], *linear, **params)
    return rule


def _transpose_to(primitive, nonlinear):
    """Transpose rule of a primitive linear in its operands after the first `nonlinear`,
    whose transpose is `primitive` (attention_jvp_p <-> attention_backward_p)."""
    def rule(ct, *args, **params):
        fixed, linear = args[:nonlinear], args[nonlinear:]
        if any(is_undefined(x) for x in fixed):
            raise NotImplementedError(_SECOND_ORDER)
        cts = ct if isinstance(ct, (list, tuple)) else [ct]
        if all(type(c) is Zero for c in cts):
            return [None] * nonlinear + zero_cotangents(None, *linear)
        result = primitive.bind(*fixed, *map(ad.instantiate_zeros, cts), **params)
        result = result if primitive.multiple_results else [result]
        return [None] * nonlinear + [r if is_undefined(x) else None
                                     for r, x in zip(result, linear)]
    return rule


ad.primitive_jvps[attention_p] = _jvp
ad.primitive_jvps[attention_jvp_p] = _linear_jvp(attention_jvp_p, 5)
ad.primitive_jvps[attention_backward_p] = _linear_jvp(attention_backward_p, 5)
ad.primitive_transposes[attention_jvp_p] = _transpose_to(attention_backward_p, 5)
ad.primitive_transposes[attention_backward_p] = _transpose_to(attention_jvp_p, 5)


def attention(
    q: Any, k: Any, v: Any, *, scale: float | None = None, causal: bool = False,
    precision: str = "highest",
) -> jax.Array:
    """``softmax(scale * q @ k^T) @ v`` over the last two axes, fused.

    ``q`` is [B, H, Sq, D], ``k`` and ``v`` are [B, H, Skv, D]; the result is [B, H, Sq, D].
    ``scale`` multiplies the scores (default ``1/sqrt(D)``; positive and finite). With
    ``causal``, query ``i`` sees key ``j`` iff ``j <= i + (Skv - Sq)`` (bottom-right
    aligned); a query that sees no key gets zeros. The Sq x Skv scores are never stored.
    q, k and v promote to one dtype as in jax.numpy.

    float32 attention is exact by default (``precision="highest"``);
    ``precision="tf32"`` lets GPUs use TF32 tensor cores for the forward pass (inputs
    rounded to 10 mantissa bits, float32 accumulation; head_dim up to
    128), as ``gemm``'s option does. Gradients and the CPU stay exact; other dtypes
    ignore it.

    Differentiable in reverse mode (``jax.grad``, ``jax.vjp``) by a fused backward
    kernel and in forward mode (``jax.jvp``, ``jax.jacfwd``) by a fused JVP kernel, both
    with O(S) memory; a query that sees no key gets zero gradients and tangents. Second
    derivatives are not supported and raise ``NotImplementedError``.
    """
    if not isinstance(causal, bool):
        raise TypeError(f"causal must be a bool, got {type(causal).__name__}")
    if scale is not None:
        scale = _checks.static_float("scale", scale)
        if scale <= 0:
            raise ValueError(f"scale must be positive, got {scale}")
    if precision not in ("highest", "tf32"):
        raise ValueError(f"precision must be 'highest' or 'tf32', got {precision!r}")
    return _attention_checked(q, k, v, scale=scale, causal=causal,
                              allow_tf32=precision == "tf32")


@_dispatch.eager_jit("scale", "causal", "allow_tf32")
def _attention_checked(q: Any, k: Any, v: Any, *, scale: float | None, causal: bool,
                       allow_tf32: bool) -> jax.Array:
    # Strongly typed like jax.nn.dot_product_attention's result.
    q, k, v = map(_checks.strong, _checks.promote(q=q, k=k, v=v))
    for name, x in (("q", q), ("k", k), ("v", v)):
        _checks.rank(name, x, "4 (B, H, S, D)", x.ndim == 4)
    if k.shape != v.shape:
        raise ValueError(f"k {tuple(k.shape)} and v {tuple(v.shape)} must have one shape")
    b, h, sq, d = q.shape
    if (k.shape[0], k.shape[1], k.shape[3]) != (b, h, d):
        raise ValueError(
            f"k {tuple(k.shape)} must match q {tuple(q.shape)} in batch, heads and head_dim"
        )
    if scale is None:
        if d == 0:
            raise ValueError("head_dim of 0 has no default scale; pass scale")
        if not isinstance(d, int):  # symbolic (jax.export): the scale is a static attribute
            raise ValueError(f"head_dim {d} is symbolic and has no static default scale; pass scale")
        scale = 1.0 / math.sqrt(d)
    if q.size == 0 or k.shape[2] == 0:
        return jnp.zeros(q.shape, q.dtype)
    return attention_p.bind(q, k, v, scale=scale, causal=causal, allow_tf32=allow_tf32)[0]
