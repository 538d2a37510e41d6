"""attention: softmax(scale * q k^T) v, fused with an online softmax, and its gradient
(FlashAttention-2 backward from the saved log-sum-exp) through jax.custom_vjp."""

from __future__ import annotations

import functools
import math
from typing import Any

import jax
import jax.numpy as jnp

from jax.interpreters import ad

from oxijax import _checks, _dispatch, _primitive, _sharding


def _abstract_eval(q, k, v, *, scale, causal):
    lse_dtype = jnp.float64 if q.dtype == jnp.float64 else jnp.float32
    return (
        jax.core.ShapedArray(q.shape, q.dtype),
        jax.core.ShapedArray(q.shape[:3], lse_dtype),
    )


def _batching(args, dims, **params):
    size = next(x.shape[d] for x, d in zip(args, dims) if d is not None)
    # vmap's axis joins the kernel's batch axis: [V, B, ...] -> [V * B, ...].
    q, k, v = (_primitive.move_batch_to_front(x, d, size) for x, d in zip(args, dims))
    merged = [x.reshape(size * x.shape[1], *x.shape[2:]) for x in (q, k, v)]
    out, lse = attention_p.bind(*merged, **params)
    return (out.reshape(size, -1, *out.shape[1:]), lse.reshape(size, -1, *lse.shape[1:])), (0, 0)


def _factors(avals_in, avals_out, *, scale, causal):
    """Batch and heads split freely, queries too unless causal (the mask's offset
    Skv - Sq is global); keys and head_dim are replicated."""
    replicated = {"kv", "d"} | ({"q"} if causal else set())
    kv = ("b", "h", "kv", "d")
    return _sharding.Factors((("b", "h", "q", "d"), kv, kv),
                             (("b", "h", "q", "d"), ("b", "h", "q")), frozenset(replicated))


attention_p = _primitive.define(
    "attention", abstract_eval=_abstract_eval, batching_rule=_batching, multiple_results=True,
    factors=_factors,
)


def _backward_abstract_eval(q, k, v, out, lse, dout, *, scale, causal):
    return tuple(jax.core.ShapedArray(x.shape, x.dtype) for x in (q, k, v))


def _backward_batching(args, dims, **params):
    size = next(x.shape[d] for x, d in zip(args, dims) if d is not None)
    moved = (_primitive.move_batch_to_front(x, d, size) for x, d in zip(args, dims))
    merged = [x.reshape(size * x.shape[1], *x.shape[2:]) for x in moved]
    grads = attention_backward_p.bind(*merged, **params)
    return tuple(g.reshape(size, -1, *g.shape[1:]) for g in grads), (0, 0, 0)


def _backward_factors(avals_in, avals_out, *, scale, causal):
    """Batch and heads split freely; dk and dv sum over the queries, so queries, keys
    and head_dim are replicated."""
    q, kv = ("b", "h", "q", "d"), ("b", "h", "kv", "d")
    return _sharding.Factors((q, kv, kv, q, ("b", "h", "q"), q), (q, kv, kv),
                             frozenset({"q", "kv", "d"}))


attention_backward_p = _primitive.define(
    "attention_backward", abstract_eval=_backward_abstract_eval,
    batching_rule=_backward_batching, multiple_results=True, factors=_backward_factors,
)


def _no_second_derivative(primals, tangents, **params):
    raise NotImplementedError(
        "oxijax.attention supports first derivatives only (jax.grad / jax.vjp); "
        "differentiating its gradient again is not implemented")


# Reached only by differentiating the custom_vjp's forward or backward pass again.
ad.primitive_jvps[attention_p] = _no_second_derivative
ad.primitive_jvps[attention_backward_p] = _no_second_derivative


@functools.partial(jax.custom_vjp, nondiff_argnums=(3, 4))
def _attention(q, k, v, scale, causal):
    out, _ = attention_p.bind(q, k, v, scale=scale, causal=causal)
    return out


def _attention_fwd(q, k, v, scale, causal):
    out, lse = attention_p.bind(q, k, v, scale=scale, causal=causal)
    return out, (q, k, v, out, lse)


def _attention_bwd(scale, causal, residuals, dout):
    return attention_backward_p.bind(*residuals, dout, scale=scale, causal=causal)


_attention.defvjp(_attention_fwd, _attention_bwd)


def attention(
    q: Any, k: Any, v: Any, *, scale: float | None = None, causal: bool = False
) -> jax.Array:
    """``softmax(scale * q @ k^T) @ v`` over the last two axes, fused.

    ``q`` is [B, H, Sq, D], ``k`` and ``v`` are [B, H, Skv, D]; the result is [B, H, Sq, D].
    ``scale`` multiplies the scores (default ``1/sqrt(D)``; positive and finite). With
    ``causal``, query ``i`` sees key ``j`` iff ``j <= i + (Skv - Sq)`` (bottom-right
    aligned); a query that sees no key gets zeros. The Sq x Skv scores are never stored.
    q, k and v promote to one dtype as in jax.numpy.

    Differentiable in reverse mode (``jax.grad``, ``jax.vjp``) by a fused backward
    kernel; a query that sees no key gets zero gradients. Forward mode (``jax.jvp``)
    and second derivatives are not supported and raise.
    """
    if not isinstance(causal, bool):
        raise TypeError(f"causal must be a bool, got {type(causal).__name__}")
    if scale is not None:
        scale = _checks.static_float("scale", scale)
        if scale <= 0:
            raise ValueError(f"scale must be positive, got {scale}")
    return _attention_checked(q, k, v, scale=scale, causal=causal)


@_dispatch.eager_jit("scale", "causal")
def _attention_checked(q: Any, k: Any, v: Any, *, scale: float | None, causal: bool) -> jax.Array:
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
    # The custom_vjp's arguments vary as its result does: their cotangents have their type.
    return _attention(*_primitive.insert_pvary(q, k, v), scale, causal)
