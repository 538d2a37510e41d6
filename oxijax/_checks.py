"""Trace-time argument checks: every error names the argument and what was expected."""

from __future__ import annotations

import math
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

SUPPORTED_DTYPES = tuple(
    np.dtype(d) for d in (jnp.float16, jnp.bfloat16, jnp.float32, jnp.float64)
)
_DTYPE_NAMES = "float16, bfloat16, float32 or float64"


def array(name: str, value: Any) -> jax.Array:
    """value as a jax array of a supported dtype, or a TypeError naming `name`."""
    if not hasattr(value, "dtype") or not hasattr(value, "shape"):
        if isinstance(value, (bool, int, float)) or isinstance(value, (list, tuple)):
            value = jnp.asarray(value)
            if not jnp.issubdtype(value.dtype, jnp.floating):
                value = value.astype(jnp.result_type(float))
        else:
            raise TypeError(f"{name} must be an array, got {type(value).__name__}")
    if np.dtype(value.dtype) not in SUPPORTED_DTYPES:
        raise TypeError(f"{name} must have dtype {_DTYPE_NAMES}, got {value.dtype}")
    return jnp.asarray(value)


def same_dtype(**arrays: jax.Array) -> np.dtype:
    dtypes = {name: np.dtype(x.dtype) for name, x in arrays.items()}
    if len(set(dtypes.values())) > 1:
        listed = ", ".join(f"{name}: {dtype}" for name, dtype in dtypes.items())
        raise TypeError(f"operands must share one dtype ({listed})")
    return next(iter(dtypes.values()))


def rank(name: str, x: jax.Array, expected: int | str, ok: bool) -> None:
    if not ok:
        raise ValueError(f"{name} must have rank {expected}, got shape {tuple(x.shape)}")


def static_float(name: str, value: Any) -> float:
    """A Python number known at trace time (it becomes a kernel attribute)."""
    if isinstance(value, jax.core.Tracer):
        raise TypeError(f"{name} must be a static Python number, not a traced value")
    try:
        result = float(value)
    except (TypeError, ValueError):
        raise TypeError(f"{name} must be a number, got {type(value).__name__}") from None
    if not math.isfinite(result):
        raise ValueError(f"{name} must be finite, got {result}")
    return result


def static_int_pair(name: str, value: Any, minimum: int, maximum: int) -> tuple[int, int]:
    """A pair of Python ints (an int is used for both) in [minimum, maximum]."""
    pair = (value, value) if isinstance(value, (int, np.integer)) else value
    try:
        pair = tuple(pair)
    except TypeError:
        raise TypeError(f"{name} must be an int or a pair of ints, got {value!r}") from None
    if len(pair) != 2 or not all(isinstance(v, (int, np.integer)) and not isinstance(v, bool) for v in pair):
        raise ValueError(f"{name} must be an int or a pair of ints, got {value!r}")
    if min(pair) < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {value!r}")
    if max(pair) > maximum:
        raise ValueError(f"{name} must be <= {maximum}, got {value!r}")
    return int(pair[0]), int(pair[1])


def axis(name: str, value: Any, ndim: int) -> int:
    if not isinstance(value, (int, np.integer)) or isinstance(value, bool):
        raise TypeError(f"{name} must be an int, got {type(value).__name__}")
    if not -ndim <= value < ndim:
        raise ValueError(f"{name} {value} is out of range for an input of rank {ndim}")
    return int(value) % ndim
