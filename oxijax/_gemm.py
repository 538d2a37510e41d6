"""gemm: alpha * op(a) @ op(b) + beta * c, batched and broadcast like jnp.matmul."""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp

from oxijax import _checks, _dispatch, _primitive, _sharding
from oxijax._enums import Transpose


def _matrix_dims(shape, trans: Transpose) -> tuple[int, int]:
    rows, cols = shape[-2:]
    return (cols, rows) if trans is not Transpose.N else (rows, cols)


def _abstract_eval(a, b, *c, trans_a, trans_b, alpha, beta, allow_tf32):
    m, _ = _matrix_dims(a.shape, trans_a)
    _, n = _matrix_dims(b.shape, trans_b)
    batch = jnp.broadcast_shapes(a.shape[:-2], b.shape[:-2])
    return jax.core.ShapedArray((*batch, m, n), a.dtype)


def _batching(args, dims, **params):
    size = next(x.shape[d] for x, d in zip(args, dims) if d is not None)
    a, b, *c = args
    a_dim, b_dim, *c_dim = dims
    # a and b keep equal ranks with a leading batch axis: an unbatched one gets a size-1
    # axis, which the kernel broadcasts (stride 0) instead of copying.
    lifted = [
        x[None] if d is None else jnp.moveaxis(x, d, 0)
        for x, d in ((a, a_dim), (b, b_dim))
    ]
    if c:
        out_shape = _abstract_eval(*lifted, **params).shape
        out_shape = (size, *out_shape[1:])
        lifted.append(_primitive.move_batch_to_front(c[0], c_dim[0], size))
        lifted[-1] = jnp.broadcast_to(lifted[-1], out_shape)
    return gemm_p.bind(*lifted, **params), 0


def _factors(avals_in, avals_out, *, trans_a, trans_b, **params):
    """Batch dims, m and n split freely; the contracted k is replicated. c arrives
    broadcast to the result's shape."""
    out = avals_out[0]
    a, b, *c = avals_in
    batch = out.shape[:-2]
    a_batch, b_batch = _sharding.broadcast([a.shape[:-2], b.shape[:-2]], batch, tag="batch")
    out_batch = tuple(f"batch{d}" for d in range(len(batch)))
    a_matrix = ("k", "m") if trans_a is not Transpose.N else ("m", "k")
    b_matrix = ("n", "k") if trans_b is not Transpose.N else ("k", "n")
    out_factors = out_batch + ("m", "n")
    operands = (a_batch + a_matrix, b_batch + b_matrix) + ((out_factors,) if c else ())
    return _sharding.Factors(operands, (out_factors,), frozenset({"k"}))


gemm_p = _primitive.define(
    "gemm", abstract_eval=_abstract_eval, batching_rule=_batching, factors=_factors
)


def gemm(
    a: Any,
    b: Any,
    c: Any = None,
    *,
    trans_a: Transpose | str = "N",
    trans_b: Transpose | str = "N",
    alpha: float = 1.0,
    beta: float = 0.0,
    precision: str = "highest",
) -> jax.Array:
    """``alpha * op(a) @ op(b) + beta * c``, row-major like ``jnp.matmul``.

    ``op(x)`` is ``x``, or its transpose over the last two axes for ``"T"``/``"C"``.
    Leading axes are batch axes and broadcast like ``jnp.matmul``; ``c`` broadcasts to the
    result. With ``beta == 0``, ``c`` is not read (NaN in it does not leak).
    ``alpha`` and ``beta`` are static Python numbers. float32 is exact by default
    (``precision="highest"``); ``precision="tf32"`` lets GPUs use TF32 tensor cores
    (as XLA's default float32 matmul does). Other dtypes and the CPU ignore it.
    """
    trans_a = Transpose.parse(trans_a, "trans_a")
    trans_b = Transpose.parse(trans_b, "trans_b")
    if precision not in ("highest", "tf32"):
        raise ValueError(f"precision must be 'highest' or 'tf32', got {precision!r}")
    return _gemm(
        a, b, c, trans_a=trans_a, trans_b=trans_b, alpha=_checks.static_float("alpha", alpha),
        beta=_checks.static_float("beta", beta), allow_tf32=precision == "tf32",
    )


@_dispatch.eager_jit("trans_a", "trans_b", "alpha", "beta", "allow_tf32")
def _gemm(a: Any, b: Any, c: Any, *, trans_a: Transpose, trans_b: Transpose, alpha: float,
          beta: float, allow_tf32: bool) -> jax.Array:
    if beta != 0.0 and c is None:
        raise ValueError("c is required when beta != 0")
    # c takes part in the promotion whenever it is given, read or not (like beta * c).
    a, b, *rest = _checks.promote(a=a, b=b, **({} if c is None else {"c": c}))
    c = rest[0] if rest else None
    _checks.rank("a", a, ">= 2", a.ndim >= 2)
    _checks.rank("b", b, ">= 2", b.ndim >= 2)
    dtype = a.dtype
    m, k = _matrix_dims(a.shape, trans_a)
    k_b, n = _matrix_dims(b.shape, trans_b)
    if k != k_b:
        raise ValueError(
            f"inner dimensions differ: op(a) is {m}x{k} (a {tuple(a.shape)}, trans_a={trans_a.name})"
            f" but op(b) is {k_b}x{n} (b {tuple(b.shape)}, trans_b={trans_b.name})"
        )
    try:
        batch = jnp.broadcast_shapes(a.shape[:-2], b.shape[:-2])
    except ValueError:
        raise ValueError(
            f"batch dims of a {tuple(a.shape)} and b {tuple(b.shape)} do not broadcast"
        ) from None
    out_shape = (*batch, m, n)
    if beta != 0.0:
        try:
            c = jnp.broadcast_to(c, out_shape)
        except ValueError:
            raise ValueError(
                f"c of shape {tuple(c.shape)} does not broadcast to the result {out_shape}"
            ) from None
    if 0 in out_shape:
        return jnp.zeros(out_shape, dtype)
    if k == 0:  # an empty sum: only the beta * c term is left
        return (beta * c).astype(dtype) if beta != 0.0 else jnp.zeros(out_shape, dtype)
    rank = len(out_shape)
    a = a.reshape((1,) * (rank - a.ndim) + a.shape)
    b = b.reshape((1,) * (rank - b.ndim) + b.shape)
    operands = (a, b, c) if beta != 0.0 else (a, b)
    return gemm_p.bind(
        *operands, trans_a=trans_a, trans_b=trans_b, alpha=alpha, beta=beta,
        allow_tf32=allow_tf32,
    )


def matmul(a: Any, b: Any) -> jax.Array:
    """``a @ b`` like ``jnp.matmul`` (1-D operands are promoted and squeezed back)."""
    return _MATMUL(a, b)


@_dispatch.eager_jit()
def _matmul(a: Any, b: Any) -> jax.Array:
    a, b = _checks.promote(a=a, b=b)
    if a.ndim == 0 or b.ndim == 0:
        raise ValueError("matmul operands must have rank >= 1 (use mul for scalars)")
    vector_a, vector_b = a.ndim == 1, b.ndim == 1
    result = gemm(a[None] if vector_a else a, b[:, None] if vector_b else b)
    if vector_b:
        result = result[..., 0]
    if vector_a:
        result = result[..., 0, :] if not vector_b else result[..., 0]
    return result


_MATMUL = _dispatch.with_params(_matmul)  # its jit looked up once, here
