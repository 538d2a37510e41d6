"""Argument checks shared by every backend; each raises InvalidArgument naming the
argument. Nothing here touches memory or the device."""

from __future__ import annotations

import math
import operator

import numpy as np

from oxijax._enums import Transpose
from oxijax.backend._errors import InvalidArgument

# dtype name -> (code of ffi/backend/problems.h, bytes per element)
DTYPES = {"float16": (0, 2), "bfloat16": (1, 2), "float32": (2, 4), "float64": (3, 8)}


def dtype_of(dtype: object, default: str) -> tuple[str, int, int]:
    """(name, code, itemsize) of a dtype given by name, NumPy or JAX dtype; None: default."""
    if dtype is None:
        name = default
    else:
        try:
            name = np.dtype(dtype).name  # jnp.bfloat16 is an ml_dtypes NumPy dtype
        except TypeError:
            name = str(dtype)
    if name not in DTYPES:
        raise InvalidArgument(f"dtype must be one of {', '.join(DTYPES)}; got {dtype!r}")
    return (name, *DTYPES[name])


def integer(value: object, argument: str) -> int:
    """A Python int from any integer (bools are not integers here)."""
    if isinstance(value, bool):
        raise InvalidArgument(f"{argument} must be an integer; got {value!r}")
    try:
        return operator.index(value)
    except TypeError:
        raise InvalidArgument(f"{argument} must be an integer; got {value!r}") from None


def count(value: object, argument: str, minimum: int = 0) -> int:
    """An integer >= minimum."""
    value = integer(value, argument)
    if value < minimum:
        raise InvalidArgument(f"{argument} must be >= {minimum}; got {value}")
    return value


def pointer(value: object, argument: str) -> int:
    return count(value, argument)


def dims(values: object, argument: str, length: int | None = None) -> list[int]:
    try:
        values = list(values)
    except TypeError:
        raise InvalidArgument(f"{argument} must be a sequence of integers; got {values!r}") from None
    if length is not None and len(values) != length:
        raise InvalidArgument(f"{argument} must have {length} elements, got {len(values)}")
    return [count(v, f"{argument}[{i}]") for i, v in enumerate(values)]


def real(value: object, argument: str) -> float:
    try:
        return float(value)
    except (TypeError, ValueError):
        raise InvalidArgument(f"{argument} must be a real number; got {value!r}") from None


def parse(enum: type, value: object, argument: str):
    try:
        return enum.parse(value, argument)
    except ValueError as error:
        raise InvalidArgument(str(error)) from None


def transpose(value: object, argument: str) -> bool:
    """Whether the operand is read transposed (C equals T for real dtypes)."""
    return parse(Transpose, value, argument) != Transpose.N


def positive_scale(scale: object) -> float:
    value = real(scale, "scale")
    if not (value > 0 and math.isfinite(value)):
        raise InvalidArgument(f"scale must be a positive finite number, got {value}")
    return value
