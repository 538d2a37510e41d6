"""Hypothesis strategies shared by the fuzzers: shapes whose sides come from a bounded set
(0, 1, primes, sizes just above the kernels' tiles), so that XLA's per-shape compilation
cache hits often and the references stay cheap; and input values with sprinkled specials."""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st

# 16/32/64/128 are tile sizes of the CPU and CUDA kernels; one above runs a ragged tile.
SIDES = (0, 1, 2, 3, 5, 7, 13, 16, 17, 31, 33, 64, 65, 129)
DTYPES = (jnp.float16, jnp.bfloat16, jnp.float32, jnp.float64)
SPECIALS = np.array([np.nan, np.inf, -np.inf, 0.0, -0.0])

dtypes = st.sampled_from(DTYPES)
seeds = st.integers(0, 2**32 - 1)

# Every draw is independent (database=None: nothing replays between runs or CI jobs);
# compilation makes some draws slow, which is expected, not a health problem.
fuzz_settings = settings(
    database=None, deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                           HealthCheck.filter_too_much],
)


@st.composite
def sides(draw, budget: int, minimum: int = 0) -> int:
    """One side from SIDES that keeps a product within budget (0 and 1 always fit)."""
    return draw(st.sampled_from([s for s in SIDES if minimum <= s and max(s, 1) <= budget]
                                or [max(minimum, 1)]))


@st.composite
def shapes(draw, min_dims: int = 0, max_dims: int = 4, max_size: int = 4096,
           min_side: int = 0) -> tuple[int, ...]:
    """A shape of random rank whose sides multiply to at most max_size (zeros aside)."""
    shape, size = [], 1
    for _ in range(draw(st.integers(min_dims, max_dims))):
        side = draw(sides(max_size // size, min_side))
        shape.append(side)
        size *= max(side, 1)
    return tuple(shape)


@st.composite
def broadcast_pairs(draw, max_size: int = 4096) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """Two shapes that broadcast: suffixes of one shape with some sides set to 1."""
    full = draw(shapes(max_size=max_size))

    def part():
        drop = draw(st.integers(0, len(full)))
        return tuple(1 if draw(st.booleans()) else s for s in full[drop:])

    return part(), part()


def values(shape, dtype, seed, low=-2.0, high=2.0, specials=0.0):
    """Uniform values in [low, high), a fraction `specials` of them NaN, ±inf or ±0,
    converted on the host (no XLA computation per shape)."""
    rng = np.random.default_rng(seed)
    x = np.asarray(rng.uniform(low, high, size=shape))
    if specials and x.size:
        mask = rng.random(x.shape) < specials
        x[mask] = rng.choice(SPECIALS, int(mask.sum()))
    return jax.device_put(x.astype(np.dtype(dtype)))  # jnp.asarray compiles per shape


def prod(shape) -> int:
    return math.prod(shape)
