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


try:  # converts keeping (or setting) the weak type, as jnp's own promotion does
    from jax._src.lax.lax import _convert_element_type as _convert
except ImportError:  # other JAX versions: results of weak operands come out strongly typed
    def _convert(x, dtype, weak_type):
        return jax.lax.convert_element_type(x, dtype)


def _operand(name: str, value: Any) -> Any:
    """value if JAX takes it as an array operand (arrays, tracers, Python scalars; lists
    become arrays), else a TypeError naming `name`."""
    if isinstance(value, (list, tuple)):
        return jnp.asarray(value)
    if hasattr(value, "dtype") and hasattr(value, "shape") or isinstance(value, (bool, int, float)):
        return value
    raise TypeError(f"{name} must be an array, got {type(value).__name__}")


def _inexact(dtype: np.dtype) -> np.dtype:
    """The float that jnp.exp or jnp.divide turn integers and bools into: float64 for
    64-bit integers, float32 for the others (float32 for both without x64)."""
    if jnp.issubdtype(dtype, jnp.integer) or dtype == np.bool_:
        return jax.dtypes.canonicalize_dtype(np.float64 if dtype.itemsize == 8 else np.float32)
    return dtype


def promote(inexact: bool = False, **operands: Any) -> list[jax.Array]:
    """The operands as arrays of their common dtype, promoted as jax.numpy does
    (jnp.result_type: Python scalars and weak-typed values take the others' dtype; the
    results are weak-typed where jnp's would be: int32 + 1.0 is a weak float), and with
    `inexact` integers made floats as jnp.divide makes them. A dtype outside the four
    floats is a TypeError naming the first operand that is not a float."""
    values = [_operand(name, value) for name, value in operands.items()]
    dtype, weak = jax.dtypes.result_type(*values, return_weak_type_flag=True)
    dtype = _inexact(dtype) if inexact else dtype
    if dtype not in SUPPORTED_DTYPES:
        names = [n for n, v in zip(operands, values) if jnp.result_type(v) not in SUPPORTED_DTYPES]
        name = names[0] if names else next(iter(operands))
        raise TypeError(f"{name} must have dtype {_DTYPE_NAMES}, got "
                        f"{jnp.result_type(values[list(operands).index(name)])}")
    return [_convert(v, dtype, weak) for v in values]


def array(name: str, value: Any, inexact: bool = False) -> jax.Array:
    """value as a jax array of a supported dtype, or a TypeError naming `name`; with
    `inexact`, integers and bools become floats as in jnp.exp or jnp.mean."""
    return promote(inexact, **{name: value})[0]


def strong(x: jax.Array) -> jax.Array:
    """x without its weak type: jnp's reductions and attention return strongly typed
    results even for weak-typed inputs."""
    return _convert(x, x.dtype, False)


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


def static_int(name: str, value: Any) -> int:
    """A Python int (not a bool) known at trace time."""
    if not isinstance(value, (int, np.integer)) or isinstance(value, bool):
        raise TypeError(f"{name} must be an int, got {type(value).__name__}")
    return int(value)


def axis(name: str, value: int, ndim: int) -> int:
    if not -ndim <= value < ndim:
        raise ValueError(f"{name} {value} is out of range for an input of rank {ndim}")
    return value % ndim
