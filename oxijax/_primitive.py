"""Building blocks for oxijax's JAX primitives.

Each op is a primitive of its own (``oxijax_gemm`` ...) with an abstract evaluation, a
lowering to its FFI target on every platform with registered handlers, and a batching
rule that folds vmap's axis into the kernel's own batch dimension.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import jax
import numpy as np
from jax.extend.core import Primitive
from jax.interpreters import batching, mlir

from oxijax import _sharding
from oxijax._enums import _OpEnum
from oxijax._ffi import REGISTERED_TARGETS


def _as_attribute(name: str, value: Any) -> Any:
    """Python parameter -> the FFI attribute type its handler decodes."""
    if isinstance(value, _OpEnum):
        return np.int32(int(value))
    if isinstance(value, bool):
        return value
    if isinstance(value, int):
        return np.int64(value)
    if isinstance(value, float):
        return np.float64(value)
    # e.g. a conv2d gradient's input size, symbolic in jax.export: attributes are static
    raise TypeError(f"oxijax parameter {name}={value!r} must be a static number (FFI attribute); "
                    "a symbolic dimension cannot be one: export with a concrete size for it")


def _ffi_lowering(target: str) -> Callable[..., Any]:
    lower = jax.ffi.ffi_lowering(target)

    def rule(ctx, *operands, **params):
        return lower(ctx, *operands, **{k: _as_attribute(k, v) for k, v in params.items()})

    return rule


@functools.lru_cache(maxsize=None)
def _compiled(primitive: Primitive, params: tuple[tuple[str, Any], ...]) -> Callable[..., Any]:
    return jax.jit(functools.partial(primitive.bind, **dict(params)))


def _weak_typed(abstract_eval: Callable[..., Any]) -> Callable[..., Any]:
    """abstract_eval with results weak-typed when every operand is, as lax's primitives
    type them (oxijax.add(1.0, 2.0) is weak like 1.0 + 2.0)."""

    def rule(*avals, **params):
        out = abstract_eval(*avals, **params)
        if not all(aval.weak_type for aval in avals):
            return out
        if isinstance(out, (tuple, list)):
            return type(out)(aval.update(weak_type=True) for aval in out)
        return out.update(weak_type=True)

    return rule


def _not_built(name: str) -> Callable[..., Any]:
    def rule(ctx, *operands, **params):
        raise NotImplementedError(
            f"oxijax_{name} has no CUDA kernel in this build of oxijax (built without nvcc, "
            "or with OXIJAX_CUDA=OFF): reinstall with nvcc available (README: Installing with "
            "CUDA), or compute on CPU arrays")

    return rule


def define(
    name: str,
    *,
    abstract_eval: Callable[..., Any],
    batching_rule: Callable[..., Any],
    multiple_results: bool = False,
    factors: Callable[..., _sharding.Factors] | None = None,
) -> Primitive:
    """Creates ``oxijax_<name>``, lowered to the FFI target of the same name.

    Parameters passed to ``bind`` must be hashable; they become FFI attributes.
    ``factors(avals_in, avals_out, **params)`` describes the op's dims for sharded
    inputs (see _sharding.py); without it, sharded operands are gathered first.
    """
    primitive = Primitive(f"oxijax_{name}")
    primitive.multiple_results = multiple_results
    # Eager calls run the op through a cached single-op jit, as JAX's own primitives do.
    primitive.def_impl(
        lambda *args, **params: _compiled(primitive, tuple(sorted(params.items())))(*args)
    )
    abstract_eval = _weak_typed(abstract_eval)
    primitive.def_abstract_eval(abstract_eval)
    batching.primitive_batchers[primitive] = batching_rule
    target = f"oxijax_{name}"
    platforms = [p for p, targets in REGISTERED_TARGETS.items() if target in targets]
    if "cuda" not in platforms:  # a clear error on GPU arrays instead of a missing rule
        mlir.register_lowering(primitive, _not_built(name), platform="cuda")
    if factors is None:
        for platform in platforms:
            mlir.register_lowering(primitive, _ffi_lowering(target), platform=platform)
        return primitive
    # The FFI call itself, seen only by the lowering: custom_partitioning wraps it.
    ffi_call = Primitive(f"oxijax_{name}_ffi")
    ffi_call.multiple_results = multiple_results
    ffi_call.def_abstract_eval(abstract_eval)
    lowering = _sharding.lowering(primitive, ffi_call, factors)
    for platform in platforms:
        mlir.register_lowering(ffi_call, _ffi_lowering(target), platform=platform)
        mlir.register_lowering(primitive, lowering or _ffi_lowering(target), platform=platform)
    return primitive


def move_batch_to_front(x: jax.Array, bdim: int | None, size: int) -> jax.Array:
    """x with vmap's axis first; an unbatched x gets a broadcast leading axis."""
    if bdim is None:
        return jax.numpy.broadcast_to(x, (size, *x.shape))
    return jax.numpy.moveaxis(x, bdim, 0)
