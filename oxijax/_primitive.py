"""Building blocks for oxijax's JAX primitives.

Each op is a primitive of its own (``oxijax_gemm`` ...) with an abstract evaluation, a
lowering to its FFI target on every platform with registered handlers, and a batching
rule that folds vmap's axis into the kernel's own batch dimension.

Results are typed as JAX types the results of its own (lax) primitives: inside
``jax.shard_map`` an operand that varies over fewer manual axes than another is
``pvary``'d first, so that a result varies over the union of its operands' axes and
the transpose puts the ``psum`` where JAX would; weak_type is that of all operands.
Eager calls, ``jax.disable_jit``, ``jax_debug_nans``/``jax_debug_infs`` and checkify's
float checks treat oxijax primitives as they treat lax's.
"""

from __future__ import annotations

import functools
import importlib
from collections.abc import Callable
from typing import Any

import jax
import numpy as np
from jax.extend.core import Primitive
from jax.interpreters import batching, mlir
from jax.sharding import NamedSharding, PartitionSpec

from oxijax import _interpret, _sharding
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


def _ffi_lowering(target: str, platform: str) -> Callable[..., Any]:
    lower = jax.ffi.ffi_lowering(target)
    # On the CPU, inside oxijax.cuda_interpreter(): the interpreted CUDA handler.
    interpreted = jax.ffi.ffi_lowering(_interpret.interpreted_target(target))

    def rule(ctx, *operands, **params):
        use = interpreted if platform == "cpu" and _interpret.active() else lower
        return use(ctx, *operands, **{k: _as_attribute(k, v) for k, v in params.items()})

    return rule


def _private(module: str, *names: str) -> Any:
    """The first of `names` in jax._src.<module>, or None: JAX renames its internals
    between versions, and each use below has a fallback."""
    try:
        found = importlib.import_module(f"jax._src.{module}")
    except ImportError:
        return None
    return next((getattr(found, name) for name in names if hasattr(found, name)), None)


def _float_checks(primitive: Primitive, nan_free: Callable[..., bool],
                  divisor: Callable[..., int | None]) -> None:
    """Registers checkify's float checks for `primitive`, as checkify does for lax's:
    a NaN in the results (unless nan_free(**params): ops that only select or negate,
    like lax's max and abs, are not checked) and, for a division, a zero divisor
    (operand `divisor(**params)`). Without checkify's private table, nothing is checked."""
    try:
        from jax._src import checkify
    except ImportError:
        return
    if not all(hasattr(checkify, name) for name in ("error_checks", "nan_error_check",
                                                    "assert_func", "get_traceback",
                                                    "DivisionByZeroError")):
        return

    # JAX 0.11 threads a CheckifyContext (the error codes handed out so far) through the
    # rules, before the error: rule(ctx, error, enabled_errors, *args), and likewise
    # assert_func(ctx, error, ...) and nan_error_check(prim, ctx, error, ...).
    with_context = hasattr(checkify, "CheckifyContext")

    def rule(*rule_args, **params):
        ctx = rule_args[:1] if with_context else ()
        error, enabled_errors, *args = rule_args[len(ctx):]
        index = divisor(**params)
        if index is not None and checkify.DivisionByZeroError in enabled_errors:
            error = checkify.assert_func(*ctx, error, jax.numpy.any(args[index] == 0),
                                         checkify.DivisionByZeroError(checkify.get_traceback()))
        if nan_free(**params):
            return error, primitive.bind(*args, **params)
        return checkify.nan_error_check(primitive, *ctx, error, enabled_errors, *args, **params)

    checkify.error_checks[primitive] = rule


# lax's own rules. Without them (another JAX) oxijax results do not vary over manual
# axes, and eager calls run the single-op jit below.
_insert_pvary = _private("core", "auto_insert_reshard", "standard_insert_pvary")
_vma_rule = _private("core", "standard_vma_rule")
_apply_primitive = _private("dispatch", "apply_primitive")


def _pvary_to_union(*args: Any) -> list[Any]:
    """args pvary'd to their union of varying manual axes, as lax's primitives pvary
    their operands (a no-op outside shard_map): the transpose psums a replicated
    operand's cotangent."""
    return list(args) if _insert_pvary is None else list(_insert_pvary(*args))


class _Primitive(Primitive):
    """A primitive whose bind applies _pvary_to_union to its operands."""

    def bind(self, *args, **params):
        return super().bind(*_pvary_to_union(*args), **params)


def _typed(name: str, abstract_eval: Callable[..., Any], multiple_results: bool
           ) -> Callable[..., Any]:
    """abstract_eval with its results typed as lax types its own: weak_type if every
    operand is weak and, inside shard_map, replicated on the current mesh and varying
    over the operands' (equal, after bind's pvary) manual axes. Elsewhere the results'
    sharding stays unspecified, so that the partitioner (custom_partitioning) picks it
    (typing them replicated on an Explicit mesh would gather them)."""
    get_mesh = getattr(jax.sharding, "get_abstract_mesh", None)

    def rule(*avals, **params):
        out = abstract_eval(*avals, **params)
        weak = all(a.weak_type for a in avals)
        if _vma_rule is None or get_mesh is None:
            results = [o.update(weak_type=weak) for o in (out if multiple_results else [out])]
            return results if multiple_results else results[0]
        _vma_rule(name, *avals)  # raises if the operands vary over different axes
        like, mesh = avals[0], get_mesh()
        manual = bool(getattr(mesh, "manual_axes", ()))
        typed = [like.update(shape=o.shape, dtype=o.dtype, weak_type=weak,
                             sharding=NamedSharding(mesh, PartitionSpec()) if manual
                             else o.sharding)
                 for o in (out if multiple_results else [out])]
        return typed if multiple_results else typed[0]

    return rule


def _impl(primitive: Primitive) -> Callable[..., Any]:
    """Eager calls: JAX's impl of its own primitives (a cached single-op jit that runs
    under disable_jit, and that debug_nans/debug_infs check), or that jit directly."""
    if _apply_primitive is not None:
        return functools.partial(_apply_primitive, primitive)

    @functools.lru_cache(maxsize=None)
    def compiled(params: tuple[tuple[str, Any], ...]) -> Callable[..., Any]:
        def call(*args):
            return primitive.bind(*args, **dict(params))

        call.__name__ = call.__qualname__ = primitive.name  # named in debug_nans' error
        call._apply_primitive = True  # type: ignore[attr-defined]  # debug_nans: no re-run
        return jax.jit(call)

    def impl(*args, **params):
        with jax.disable_jit(False):
            return compiled(tuple(sorted(params.items())))(*args)

    return impl


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
    nan_free: Callable[..., bool] = lambda **params: False,
    divisor: Callable[..., int | None] = lambda **params: None,
) -> Primitive:
    """Creates ``oxijax_<name>``, lowered to the FFI target of the same name.

    Parameters passed to ``bind`` must be hashable; they become FFI attributes.
    ``factors(avals_in, avals_out, **params)`` describes the op's dims for sharded
    inputs (see _sharding.py); without it, sharded operands are gathered first.
    ``nan_free(**params)``: the op never makes a NaN of non-NaN operands;
    ``divisor(**params)``: the operand that divides, if any (checkify's float checks).
    """
    primitive = _Primitive(f"oxijax_{name}")
    primitive.multiple_results = multiple_results
    primitive.def_impl(_impl(primitive))
    _float_checks(primitive, nan_free, divisor)
    abstract_eval = _typed(primitive.name, abstract_eval, multiple_results)
    primitive.def_abstract_eval(abstract_eval)
    batching.primitive_batchers[primitive] = batching_rule
    target = f"oxijax_{name}"
    platforms = [p for p, targets in REGISTERED_TARGETS.items() if target in targets]
    if "cuda" not in platforms:  # a clear error on GPU arrays instead of a missing rule
        mlir.register_lowering(primitive, _not_built(name), platform="cuda")
    if factors is None:
        for platform in platforms:
            mlir.register_lowering(primitive, _ffi_lowering(target, platform), platform=platform)
        return primitive
    # The FFI call itself, seen only by the lowering: custom_partitioning wraps it (or,
    # exported, it carries its own sharding description).
    ffi_call = _Primitive(f"oxijax_{name}_ffi")
    ffi_call.multiple_results = multiple_results
    ffi_call.def_abstract_eval(abstract_eval)
    lowering = _sharding.lowering(primitive, ffi_call, factors)
    _sharding.register_batch_partitionable(target)
    for platform in platforms:
        ffi_lowering = _sharding.export_lowering(_ffi_lowering(target, platform), factors)
        mlir.register_lowering(ffi_call, ffi_lowering, platform=platform)
        mlir.register_lowering(primitive, lowering or ffi_lowering, platform=platform)
    return primitive


def move_batch_to_front(x: jax.Array, bdim: int | None, size: int) -> jax.Array:
    """x with vmap's axis first; an unbatched x gets a broadcast leading axis."""
    if bdim is None:
        return jax.numpy.broadcast_to(x, (size, *x.shape))
    return jax.numpy.moveaxis(x, bdim, 0)
