"""The CUDA attention backward is deterministic: its gradients are bit-identical under every
thread and block order of the CUDA interpreter (no atomics; every sum has one owner
thread and a fixed order)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import random

import oxijax

pytestmark = pytest.mark.cuda_interpret

# Head dims per dtype; add more to cover more kernels (half types up to 256 reach the
# tensor-core backward, 264 stays on SIMT).
HEAD_DIMS = {
    jnp.float16: (36, 64, 200, 264),
    jnp.bfloat16: (33, 128),
    jnp.float32: (64,),
    jnp.float64: (40,),
}
PARAMS = [(dtype, d, causal) for dtype, dims in HEAD_DIMS.items() for d in dims
          for causal in (False, True)]
SCHEDULES = [("forward", 0), ("reverse", 0), ("shuffle", 1), ("shuffle", 2), ("shuffle", 3)]
BITS = {2: np.uint16, 4: np.uint32, 8: np.uint64}


def _bits(x):
    x = np.asarray(x)
    return x.view(BITS[x.dtype.itemsize])


@pytest.mark.parametrize("dtype,head_dim,causal", PARAMS,
                         ids=[f"{jnp.dtype(t).name}-d{d}-{'causal' if c else 'full'}"
                              for t, d, c in PARAMS])
def test_attention_grad_is_bit_identical_across_schedules(interpreter, dtype, head_dim, causal):
    # Several ragged query and key tiles; causal with Sq < Skv, so every row sees a key
    # and dQ sums over several key tiles.
    q = random((1, 2, 45, head_dim), dtype, 1)
    k = random((1, 2, 70, head_dim), dtype, 2)
    v = random((1, 2, 70, head_dim), dtype, 3)
    acc = jnp.float64 if dtype == jnp.float64 else jnp.float32
    ct = random((1, 2, 45, head_dim), acc, 4)
    grad = jax.jit(jax.grad(
        lambda q, k, v: jnp.sum(oxijax.attention(q, k, v, causal=causal).astype(acc) * ct),
        (0, 1, 2)))
    runs = []
    for order, seed in SCHEDULES:
        interpreter.set_schedule(order, seed)
        runs.append([_bits(g) for g in grad(q, k, v)])
    for run in runs[1:]:
        for got, want in zip(run, runs[0]):
            assert np.array_equal(got, want)
    assert interpreter.take_reports() == []
