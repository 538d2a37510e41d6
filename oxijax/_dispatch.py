"""Eager calls through one cached jit per public function, as jax.numpy's functions are.

An eager oxijax call would otherwise run its trace-time checks (dtype promotion, shape
checks, reshapes) op by op on concrete arrays, each an XLA dispatch of its own: ~10x
the cost of the jnp call. Calls whose array arguments are all concrete run instead the
same Python function under `jax.jit`, so the checks run once per shape and dtype and
the call costs one jit dispatch. Under a trace (even with constant operands), and for
tracers or other arguments (lists), the function runs as is, so that jaxprs show the
oxijax primitives themselves: `inline=True` no longer does that from jax 0.11 on.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import jax
import numpy as np

# Types jit takes as they are: plain values, and concrete jax.Array types (jaxlib's,
# added when first seen: a set lookup costs a tenth of isinstance against the ABC).
# Anything else (lists, tracers) takes the plain path.
_CONCRETE = {np.ndarray, float, int, bool, type(None)}


try:  # whether no transformation or trace is active (JAX has no public query)
    from jax._src.core import trace_ctx

    _top_level: Callable[[], bool] = trace_ctx.is_top_level
except (ImportError, AttributeError):  # other JAX versions: fall back to jit's inlining

    def _top_level() -> bool:
        return True


def _concrete(arrays: tuple[Any, ...]) -> bool:
    for x in arrays:  # a loop, not all(map(...)): ~0.4 us less per call
        if type(x) in _CONCRETE:
            continue
        if isinstance(x, jax.Array) and not isinstance(x, jax.core.Tracer):
            _CONCRETE.add(type(x))
            continue
        return False
    return True


def eager_jit(*static: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Decorates ``fn(*arrays, **params)``: the params become jit's static arguments.
    The caller checks and normalises them first: they must be hashable, and jit's
    cache would take axis=1.0 for an axis=1 it has seen."""

    def decorate(fn: Callable[..., Any]) -> Callable[..., Any]:
        # One jit per set of params, closed over them, so that a call hashes no static
        # argument in jit's dispatch (a Python __hash__ per enum, ~2 us of a ~10 us call).
        @functools.lru_cache(maxsize=512)
        def jitted(params: tuple[tuple[str, Any], ...]) -> Callable[..., Any]:
            return jax.jit(functools.partial(fn, **dict(params)), inline=True)

        @functools.wraps(fn)
        def call(*arrays: Any, **params: Any) -> Any:
            if _concrete(arrays) and _top_level():
                return jitted(tuple(params.items()))(*arrays)
            return fn(*arrays, **params)

        _DECORATED[call] = (fn, jitted)
        return call

    return decorate


# What each eager_jit function wraps: its plain function and its per-params jit cache.
_DECORATED: dict[Callable[..., Any], tuple[Callable[..., Any], Callable[..., Any]]] = {}


def with_params(call: Callable[..., Any], **params: Any) -> Callable[..., Any]:
    """An eager_jit function with its params bound once, here (the named ops: exp, add):
    a call then looks up and hashes nothing, ~3 us of an ~11 us eager call."""
    fn, jitted = _DECORATED[call]
    compiled = jitted(tuple(params.items()))

    def call_with_params(*arrays: Any) -> Any:
        if _concrete(arrays) and _top_level():
            return compiled(*arrays)
        return fn(*arrays, **params)

    return call_with_params


def with_params_but(call: Callable[..., Any], name: str, **params: Any) -> Callable[..., Any]:
    """with_params, but for param `name`, passed to each call as a plain int or str
    (sum's axis): a dict of with_params functions, one per value."""
    bound: dict[Any, Callable[..., Any]] = {}

    def call_with_params(x: Any, value: Any) -> Any:
        fn = bound.get(value)
        if fn is None:
            fn = bound[value] = with_params(call, **params, **{name: value})
        return fn(x)

    return call_with_params
