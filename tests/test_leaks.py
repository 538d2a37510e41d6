"""The pointer backend leaks no host memory: allocate/free cycles return to the
baseline, close() frees what is left, and so does interpreter exit without close().
Counted by the extension itself (_oxijax.backend.live_host_allocations / _bytes)."""

from __future__ import annotations

import gc
import subprocess
import sys
import textwrap

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from oxijax import _oxijax
from oxijax.backend import CpuBackend, InvalidArgument, OutOfMemory, import_jax_array, to_jax_array

native = _oxijax.backend


@pytest.fixture
def baseline() -> tuple[int, int]:
    """The live count before the test, after freeing earlier tests' garbage (so that the
    cycle collector frees nothing mid-test)."""
    gc.collect()
    return live()


def live() -> tuple[int, int]:
    return native.live_host_allocations(), native.live_host_bytes()


def test_alloc_free_cycles_return_to_baseline(baseline):
    with CpuBackend() as be:
        rng = np.random.default_rng(0)
        for _ in range(200):
            sizes = rng.integers(1, 1 << 16, size=8)
            ptrs = [be.alloc(int(n)) for n in sizes]
            assert live() == (baseline[0] + 8, baseline[1] + int(sizes.sum()))
            for ptr in rng.permutation(ptrs):
                be.free(int(ptr))
            assert live() == baseline
        # Failed calls allocate nothing either.
        for call in (lambda: be.alloc(1 << 60), lambda: be.free(12345), lambda: be.alloc(0)):
            try:
                call()
            except (InvalidArgument, OutOfMemory):
                pass
        assert live() == baseline


def test_close_frees_live_allocations(baseline):
    be = CpuBackend()
    be.init()
    for n in (1, 100, 1 << 20):
        be.alloc(n)
    assert live() == (baseline[0] + 3, baseline[1] + 1 + 100 + (1 << 20))
    be.close()
    assert live() == baseline
    be.close()  # twice is fine
    assert live() == baseline


def test_a_collected_backend_frees_its_allocations(baseline):
    be = CpuBackend()
    be.init()
    be.alloc(4096)
    del be  # freed by reference counting: no gc needed
    assert live() == baseline


def test_exported_memory_lives_until_jax_lets_go(baseline):
    with CpuBackend() as be:
        ptr = be.alloc(16)
        be.copy_htod(ptr, np.arange(4, dtype=np.float32))
        view = to_jax_array(be, ptr, (4,), "float32")
        be.free(ptr)
        assert live()[0] == baseline[0] + 1  # the view keeps it
        np.testing.assert_array_equal(view, np.arange(4))
        # JAX's own host memory: nothing allocated (a GPU array would be copied in).
        imported = import_jax_array(be, jnp.ones(3, device=jax.devices("cpu")[0]))
        assert live()[0] == baseline[0] + 1
        be.free(imported)
    del view
    assert live() == baseline


def test_interpreter_exit_without_close_frees_everything():
    # The extension prints its count after the interpreter has torn everything down
    # (Py_AtExit); backends left open, even one held by a reference cycle, must not leak.
    code = textwrap.dedent("""
        import numpy as np
        from oxijax import _oxijax
        from oxijax.backend import CpuBackend
        _oxijax.backend.report_live_host_memory_at_exit()
        kept = CpuBackend(); kept.init()
        for n in (64, 1 << 20, 12345):
            kept.alloc(n)
        cyclic = CpuBackend(); cyclic.init()
        cyclic.alloc(1 << 16)
        cyclic.self = cyclic  # only the cycle collector or the exit finaliser frees it
        print("live before exit:", _oxijax.backend.live_host_allocations())
    """)
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            timeout=120)
    assert result.returncode == 0, result.stderr
    assert "live before exit: 4" in result.stdout
    assert "oxijax: live host allocations at exit: 0 (0 bytes)" in result.stderr, result.stderr
    assert "leaked" not in result.stderr, result.stderr  # nanobind's own leak report
