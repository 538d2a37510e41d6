"""The op set of SPEC (one source of truth shared with ffi/include/oxijax/ops.h).

Members' values are the codes the C++ enums use; every ``op`` argument accepts a member
or its lowercase name, every transpose argument a member or ``"N"``, ``"T"``, ``"C"``.
"""

from __future__ import annotations

import enum


class _OpEnum(enum.IntEnum):
    def __str__(self) -> str:  # jaxprs show trans_a=T, op=RELU
        return self.name

    @classmethod
    def parse(cls, value: object, argument: str = "op") -> "_OpEnum":
        """Returns the member for a member or its (case-insensitive) name."""
        if isinstance(value, cls):
            return value
        if isinstance(value, str):
            member = cls.__members__.get(value.upper())
            if member is not None:
                return member
        names = ", ".join(repr(name.lower()) for name in cls.__members__)
        raise ValueError(f"{argument} must be a {cls.__name__} or one of {names}; got {value!r}")


class Transpose(_OpEnum):
    """How a gemm operand is read: as stored, transposed, or conjugate-transposed."""

    N = 0
    T = 1
    C = 2  # equals T for the real dtypes oxijax supports

    @classmethod
    def parse(cls, value: object, argument: str = "trans") -> "Transpose":
        if isinstance(value, cls):
            return value
        if isinstance(value, str) and value.upper() in cls.__members__:
            return cls[value.upper()]
        raise ValueError(f"{argument} must be a Transpose or one of 'N', 'T', 'C'; got {value!r}")


class ReduceOp(_OpEnum):
    """Reductions over one axis; MEAN of an empty axis is NaN, MAX/MIN propagate NaN."""

    SUM = 0
    MAX = 1
    MIN = 2
    MEAN = 3


class UnaryOp(_OpEnum):
    """Elementwise functions, with jnp's semantics (log(0) = -inf, sqrt(-1) = nan, relu
    propagates NaN)."""

    RELU = 0
    SIGMOID = 1
    TANH = 2
    EXP = 3
    LOG = 4
    SQRT = 5
    ABS = 6
    NEG = 7


class BinaryOp(_OpEnum):
    """Elementwise a (op) b with NumPy broadcasting; MAX/MIN propagate NaN."""

    ADD = 0
    SUB = 1
    MUL = 2
    DIV = 3
    MAX = 4
    MIN = 5
