"""The pointer backend on a GPU: every compute, misuse and thread test of
test_backend_compute.py on CudaBackend, JAX and the backend sharing one GPU (both
directions, with JAX's preallocation on and off), and the no-GPU path in a process that
sees no GPU. Skips without a GPU (fails with OXIJAX_REQUIRE_GPU=1)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest
from test_backend_compute import *  # noqa: F401,F403 - the same tests, on CudaBackend

from oxijax.backend import CudaBackend

pytestmark = pytest.mark.usefixtures("gpu")


@pytest.fixture
def backend(gpu):  # noqa: F811 - replaces the CpuBackend fixture of test_backend_compute
    with CudaBackend(0) as be:
        assert be.has_device, repr(be)
        yield be


def run_python(code: str, **env) -> str:
    result = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True,
                            text=True, timeout=120, env={**os.environ, **env})
    assert result.returncode == 0, result.stdout + result.stderr
    return result.stdout


def test_close_releases_and_reinit_works(gpu):
    be = CudaBackend()
    be.init()
    ptr = be.alloc(1 << 20)
    free_before, total = be.mem_info()
    assert 0 < free_before <= total
    be.close()  # frees ptr, releases the context once
    be.close()
    be.init()
    assert be.has_device and be.live_allocations == 0
    be.free(be.alloc(16))
    be.close()
    assert ptr  # the old pointer is gone with the old context's bookkeeping


MIXED = """
    import os
    import jax, jax.numpy as jnp, numpy as np
    from oxijax.backend import CudaBackend, import_jax_array, to_jax_array
    x = jnp.arange(4096, dtype=jnp.float32).reshape(64, 64) / 100  # JAX first
    y = jax.jit(lambda a: jnp.tanh(a @ a))(x)
    with CudaBackend() as be:
        # JAX -> backend: zero-copy import of a computed array
        p = import_jax_array(be, y)
        assert p == y.unsafe_buffer_pointer()
        q = be.alloc(y.nbytes)
        be.unary("exp", p, q, y.size)
        # backend -> JAX: zero-copy view, then more JAX work on it
        z = to_jax_array(be, q, (64, 64))
        assert z.devices() == y.devices(), (z.devices(), y.devices())
        w = jax.jit(lambda t: t.sum())(z)
        np.testing.assert_allclose(float(w), float(jnp.exp(y).sum()), rtol=1e-5)
        be.free(q)
        np.testing.assert_allclose(np.asarray(z), np.exp(np.asarray(y)), rtol=1e-6)
        be.free(p)
        # gemm through the backend on memory JAX produced, read back through JAX
        a = jnp.asarray(np.random.default_rng(0).standard_normal((8, 8)))
        pa = import_jax_array(be, a)
        pc = be.alloc(a.nbytes)
        be.gemm("T", "T", 8, 8, 8, 1.0, pa, 8, pa, 8, 0.0, pc, 8)
        c = to_jax_array(be, pc, (8, 8), "float64")  # column-major C = Aᵀ·Aᵀ
        np.testing.assert_allclose(np.asarray(c).T, np.asarray(a).T @ np.asarray(a).T,
                                   rtol=1e-12)
    del z, c
    print("ok", os.environ.get("XLA_PYTHON_CLIENT_PREALLOCATE"))
"""


@pytest.mark.parametrize("preallocate", ["true", "false"])
def test_jax_and_backend_share_the_gpu(gpu, preallocate):
    out = run_python(MIXED, XLA_PYTHON_CLIENT_PREALLOCATE=preallocate, JAX_ENABLE_X64="1")
    assert out.strip() == f"ok {preallocate}"


def test_backend_before_jax(gpu):
    # The backend retains the primary context first; JAX then joins it.
    run_python("""
        import numpy as np
        from oxijax.backend import CudaBackend, to_jax_array
        be = CudaBackend(); be.init()
        p = be.alloc(64)
        be.copy_htod(p, np.arange(16, dtype=np.float32))
        import jax.numpy as jnp
        x = to_jax_array(be, p, (16,))
        assert float(jnp.sum(x)) == 120.0
        be.close()
        assert float(jnp.sum(x)) == 120.0  # memory JAX holds outlives close()
        del x
    """, XLA_PYTHON_CLIENT_PREALLOCATE="false")


def test_no_gpu_path(gpu):
    out = run_python("""
        from oxijax.backend import CudaBackend, DeviceError, default_backend
        be = CudaBackend(); be.init()
        assert be.is_initialized() and not be.has_device
        be.synchronize()
        try:
            be.alloc(16)
        except DeviceError as e:
            print("DeviceError", e.code, e.name)
        print(default_backend().name())
    """, CUDA_VISIBLE_DEVICES="")
    lines = out.split("\n")
    assert lines[0].startswith("DeviceError") and lines[1] == "cpu", out


def test_out_of_memory(gpu):
    from oxijax.backend import OutOfMemory

    with CudaBackend() as be:
        with pytest.raises(OutOfMemory, match="XLA_PYTHON_CLIENT_PREALLOCATE"):
            be.alloc(1 << 50)
