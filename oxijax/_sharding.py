"""Sharded inputs: every op runs on its local shards, through JAX's SPMD partitioner.

Each op describes its dims as *factors* (as in einsum or Shardy's sharding rules): a
factor shared by operands and results is one logical dim, and a factor the kernel
cannot split locally (a contracted, reduced or convolved dim; the query axis of a
causal mask, whose offset is global) is *replicated*. The primitive's lowering wraps
its FFI call in `jax.experimental.custom_partitioning`: the partitioner keeps every
other factor sharded as the operands already are and runs the kernel on the local
blocks; only replicated factors are gathered (by JAX, never silently wrong).
On one device the FFI call is lowered as is.

custom_partitioning's rules are Python callbacks at compile time, which `jax.export`
cannot serialize. An exported program instead carries, on each FFI call, the op's
Shardy rule (`sdy.sharding_rule`, for sharding propagation) and the number of leading
dims that XLA's batch partitioner may split (`num_batch_dims`; every oxijax target is
registered as batch partitionable): when the deserialized program is compiled for
sharded inputs, the kernel runs on local blocks of those dims, and the partitioner
gathers the others (the op runs replicated over them).
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
import string
from collections.abc import Callable, Sequence
from typing import Any

import jax
from jax.experimental.custom_partitioning import custom_partitioning
from jax.extend.core import Primitive
from jax.interpreters import mlir
from jax.sharding import NamedSharding, PartitionSpec


@dataclasses.dataclass(frozen=True)
class Factors:
    """One factor name per dim of every operand and result, and the replicated factors."""

    operands: tuple[tuple[str, ...], ...]
    results: tuple[tuple[str, ...], ...]
    replicated: frozenset[str] = frozenset()

    def shardy_rule(self) -> tuple[str, tuple[str, ...]]:
        """Shardy's rule string (factors renamed to letters) and its replicated factors."""
        letters = iter(string.ascii_letters)
        names: dict[str, str] = {}
        for factor in itertools.chain(*self.operands, *self.results):
            if factor not in names:
                names[factor] = next(letters)
        side = lambda groups: ", ".join(" ".join(names[f] for f in g) for g in groups)  # noqa: E731
        rule = f"{side(self.operands)} -> {side(self.results)}"
        order = list(names)  # Shardy wants the special factors in order of appearance
        return rule, tuple(names[f] for f in order if f in self.replicated)


def broadcast(shapes: Sequence[Sequence[int]], out_shape: Sequence[int], tag: str = "d"
              ) -> tuple[tuple[str, ...], ...]:
    """Factors of operands broadcast (NumPy-style, right-aligned) to out_shape: dim i of
    the output is factor f"{tag}{i}"; an operand dim of size 1 under a larger output dim
    is a factor of its own (it has nothing to split)."""
    factors = []
    for i, shape in enumerate(shapes):
        offset = len(out_shape) - len(shape)
        factors.append(tuple(
            f"{tag}{offset + d}" if size == out_shape[offset + d] else f"{tag}{offset + d}_{i}"
            for d, size in enumerate(shape)))
    return tuple(factors)


def elementwise(avals_in, avals_out, **params) -> Factors:
    """unary / binary: every output dim can be split anywhere."""
    out_shape = avals_out[0].shape
    out = tuple(f"d{d}" for d in range(len(out_shape)))
    return Factors(broadcast([x.shape for x in avals_in], out_shape), (out,))


def _spec(sharding: Any, rank: int) -> tuple[Any, ...]:
    """The mesh axes of each dim (None: not split); unknown shardings count as replicated."""
    if not isinstance(sharding, NamedSharding):
        return (None,) * rank
    spec = tuple(sharding.spec)
    return spec + (None,) * (rank - len(spec))


def _axes(entry: Any) -> tuple[str, ...]:
    if entry is None:
        return ()
    return tuple(entry) if isinstance(entry, tuple) else (entry,)


def _factor_axes(factors: Factors, mesh, arg_shapes) -> dict[str, Any]:
    """Each splittable factor -> the mesh axes an operand already splits it over (the
    first operand wins; a mesh axis splits one factor at most; the dim must divide)."""
    chosen: dict[str, Any] = {}
    used: set[str] = set()
    for names, arg in zip(factors.operands, arg_shapes):
        for name, size, entry in zip(names, arg.shape, _spec(arg.sharding, len(names))):
            axes = _axes(entry)
            if not axes or name in factors.replicated or name in chosen or used & set(axes):
                continue
            parts = 1
            for axis in axes:
                parts *= mesh.shape[axis]
            if size % parts == 0:
                chosen[name] = entry
                used.update(axes)
    return chosen


def _shardings(mesh, groups, chosen) -> tuple[NamedSharding, ...]:
    return tuple(NamedSharding(mesh, PartitionSpec(*(chosen.get(f) for f in g))) for g in groups)


@functools.lru_cache(maxsize=None)
def _partitioned(ffi_primitive: Primitive, factors: Factors, params: tuple) -> Callable:
    """ffi_primitive.bind under custom_partitioning, for one set of params."""
    multiple = ffi_primitive.multiple_results

    def call(*args):
        return ffi_primitive.bind(*args, **dict(params))

    wrapped = custom_partitioning(call)

    def results(shardings):
        return list(shardings) if multiple else shardings[0]

    def infer(mesh, arg_shapes, result_shape):
        return results(_shardings(mesh, factors.results, _factor_axes(factors, mesh, arg_shapes)))

    def partition(mesh, arg_shapes, result_shape):
        chosen = _factor_axes(factors, mesh, arg_shapes)
        return (mesh, call, results(_shardings(mesh, factors.results, chosen)),
                _shardings(mesh, factors.operands, chosen))

    rule, replicated = factors.shardy_rule()
    wrapped.def_partition(partition=partition, infer_sharding_from_operands=infer,
                          sharding_rule=rule, need_replication_factors=replicated)
    return wrapped


def _lowering_needs_devices(primitive: Primitive) -> bool:
    """Tells jit that lowering `primitive` needs the device assignment, as lowering
    custom_partitioning does. JAX has no public hook for this: without the private set,
    oxijax falls back to gathering sharded operands."""
    try:
        from jax._src import dispatch

        dispatch.prim_requires_devices_during_lowering.add(primitive)
    except (ImportError, AttributeError):
        return False
    return True


def lowering(primitive: Primitive, ffi_primitive: Primitive,
             factors_of: Callable[..., Factors]) -> Callable | None:
    """A lowering rule for `primitive` running ffi_primitive under custom_partitioning,
    or None where this JAX cannot partition it.

    factors_of(avals_in, avals_out, **params) describes the op's dims for these shapes.
    """
    if not _lowering_needs_devices(primitive):
        return None

    def rule(ctx, *operands, **params):
        if ctx.module_context.lowering_parameters.for_export:  # see the module docstring
            return mlir.lower_fun(
                functools.partial(ffi_primitive.bind, **params),
                multiple_results=ffi_primitive.multiple_results)(ctx, *operands)
        factors = factors_of(ctx.avals_in, ctx.avals_out, **params)
        fn = _partitioned(ffi_primitive, factors, tuple(sorted(params.items())))
        return mlir.lower_fun(fn, multiple_results=ffi_primitive.multiple_results)(ctx, *operands)

    return rule


def batch_dims(factors: Factors) -> int:
    """How many leading dims every operand and result shares as one splittable factor,
    each keeping at least one dim after them (XLA's batch partitioner needs that)."""
    groups = factors.operands + factors.results
    count = 0
    while (all(len(g) > count + 1 for g in groups) and len({g[count] for g in groups}) == 1
           and groups[0][count] not in factors.replicated):
        count += 1
    return count


try:  # private: JAX's builder of custom_partitioning's Shardy rules
    from jax._src import custom_partitioning_sharding_rule as _sdy_rules
except ImportError:  # then an exported program's oxijax calls run replicated
    _sdy_rules = None  # type: ignore[assignment]


def register_batch_partitionable(target: str) -> None:
    """Lets XLA split `target`'s calls along their num_batch_dims leading dims."""
    register = getattr(jax.ffi, "register_ffi_target_as_batch_partitionable", None)
    if register is not None:
        register(target)


def export_lowering(ffi_lowering: Callable, factors_of: Callable[..., Factors]) -> Callable:
    """ffi_lowering, its call annotated (when it is being exported) with the op's Shardy
    rule and batch dims: a sharding description that serializes."""

    def rule(ctx, *operands, **params):
        results = ffi_lowering(ctx, *operands, **params)
        static = all(isinstance(d, int) for a in (*ctx.avals_in, *ctx.avals_out) for d in a.shape)
        if (not ctx.module_context.lowering_parameters.for_export or not static
                or _sdy_rules is None):
            return results
        factors = factors_of(ctx.avals_in, ctx.avals_out, **params)
        call = results[0].owner
        text, replicated = factors.shardy_rule()
        call.attributes["sdy.sharding_rule"] = _sdy_rules.sdy_sharding_rule_to_mlir(
            _sdy_rules.str_to_sdy_sharding_rule(text, need_replication_factors=replicated),
            [v.type for v in call.operands], [v.type for v in call.results])
        call.attributes["mhlo.frontend_attributes"] = mlir.ir.DictAttr.get(
            {"num_batch_dims": mlir.ir.StringAttr.get(str(batch_dims(factors)))})
        return results

    return rule
