"""The pointer backend's CUDA device: every compute, misuse and thread test of
test_backend_compute.py on CudaBackend, in two modes:

- ``gpu`` (marked ``gpu``): on a real GPU, plus JAX and the backend sharing one GPU (both
  directions, with JAX's preallocation on and off) and the no-GPU path in a process that
  sees no GPU. Skips without a GPU (fails with OXIJAX_REQUIRE_GPU=1).
- ``interpret`` (marked ``cuda_interpret``): ``CudaBackend(interpret=True)``, the same
  C++ device class, launchers and kernels on the CUDA interpreter, on any machine; every
  access is checked, and a test fails on any interpreter report or device memory left
  behind. Skips when the build has no interpreter (fails with
  OXIJAX_REQUIRE_INTERPRETER=1)."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import textwrap
import zlib

import jax.numpy as jnp
import numpy as np
import pytest
from conftest import require_interpreter
from test_backend_compute import *  # noqa: F401,F403 - the same tests, on CudaBackend

from oxijax.backend import (
    CudaBackend,
    DeviceError,
    InvalidArgument,
    NotInitialized,
    OutOfMemory,
    Unsupported,
    import_jax_array,
    to_jax_array,
)

MODES = [pytest.param("gpu", marks=pytest.mark.gpu, id="gpu"),
         pytest.param("interpret", marks=pytest.mark.cuda_interpret, id="interpret")]


@contextlib.contextmanager
def clean_interpreter(test_id: str):
    """The interpreter module (skips without one), its threads and blocks shuffled with a
    seed of the test's own; the block must leave no interpreter report (a failed launch)
    and no interpreted device memory behind."""
    interp = require_interpreter()
    interp.take_reports()
    in_use = interp.device_bytes_in_use()
    previous = interp.schedule()
    interp.set_schedule("shuffle", zlib.crc32(test_id.encode()))
    try:
        yield interp
    finally:
        interp.set_schedule(*previous)
    reports = interp.take_reports()
    assert not reports, "CUDA interpreter reports:\n" + "\n\n".join(reports)
    assert interp.device_bytes_in_use() == in_use, "interpreted device memory left allocated"


@pytest.fixture(params=MODES)
def mode(request):
    """"gpu" (skips without a GPU) or "interpret" (skips without the interpreter)."""
    if request.param == "gpu":
        request.getfixturevalue("gpu")
        yield "gpu"
    else:
        with clean_interpreter(request.node.nodeid):
            yield "interpret"


@pytest.fixture
def interp_mode(request):
    """interpret mode's checks, for the tests that exist only in interpret mode."""
    with clean_interpreter(request.node.nodeid) as interp:
        yield interp


def make_backend(mode: str, device: int = 0) -> CudaBackend:
    return CudaBackend(device, interpret=mode == "interpret")


@pytest.fixture
def backend(mode):  # noqa: F811 - replaces the CpuBackend fixture of test_backend_compute
    with make_backend(mode) as be:
        assert be.has_device, repr(be)
        assert be.interpreted == (mode == "interpret")
        yield be


def run_python(code: str, **env) -> str:
    result = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True,
                            text=True, timeout=120, env={**os.environ, **env})
    assert result.returncode == 0, result.stdout + result.stderr
    return result.stdout


def test_close_frees_everything(mode):  # noqa: F811 - CudaBackend's, not CpuBackend's
    be = make_backend(mode)
    be.init()
    for _ in range(3):
        be.alloc(100)
    assert be.live_allocations == 3
    be.close()
    assert be.live_allocations == 0 and not be.is_initialized()
    with pytest.raises(NotInitialized):
        be.alloc(4)


def test_close_releases_and_reinit_works(mode):
    be = make_backend(mode)
    be.init()
    ptr = be.alloc(1 << 20)
    free_before, total = be.mem_info()
    assert 0 < free_before <= total
    be.close()  # frees ptr, releases the context once
    be.close()
    with pytest.raises(NotInitialized):
        be.mem_info()
    be.init()
    assert be.has_device and be.live_allocations == 0
    be.free(be.alloc(16))
    be.close()
    assert ptr  # the old pointer is gone with the old context's bookkeeping


def test_out_of_memory(mode):
    with make_backend(mode) as be:
        with pytest.raises(OutOfMemory, match="XLA_PYTHON_CLIENT_PREALLOCATE") as caught:
            be.alloc(1 << 50)
        assert caught.value.code == 2 and caught.value.name == "CUDA_ERROR_OUT_OF_MEMORY"
        be.free(be.alloc(16))  # still usable


# -- GPU only: JAX and the backend on one GPU, a process without a GPU ------------------

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
        # a's row-major bytes read column-major are aᵀ, so C = (aᵀ)ᵀ·(aᵀ)ᵀ = a·a, and C
        # read back row-major is Cᵀ = aᵀ·aᵀ.
        c = to_jax_array(be, pc, (8, 8), "float64")
        np.testing.assert_allclose(np.asarray(c), np.asarray(a).T @ np.asarray(a).T,
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


# -- interpret only: the same promises where the device is the interpreter's ------------


@pytest.mark.cuda_interpret
def test_interpreted_jax_arrays_are_copied(interp_mode):
    # JAX has no client for the interpreter's memory: import copies in, export copies out.
    x = jnp.tanh(jnp.arange(4096, dtype=jnp.float32).reshape(64, 64) / 1000)
    with CudaBackend(interpret=True) as be:
        p = import_jax_array(be, x)
        assert p != x.unsafe_buffer_pointer()
        q = be.alloc(x.nbytes)
        be.unary("exp", p, q, x.size)
        z = to_jax_array(be, q, (64, 64))
        assert z.devices() == x.devices()
        be.free(q)
        np.testing.assert_allclose(np.asarray(z), np.exp(np.asarray(x)), rtol=1e-6)
        a = jnp.asarray(np.random.default_rng(0).standard_normal((8, 8)))
        pa, pc = import_jax_array(be, a), be.alloc(a.nbytes)
        be.gemm("T", "T", 8, 8, 8, 1.0, pa, 8, pa, 8, 0.0, pc, 8)
        # a's row-major bytes read column-major are aᵀ, so C = (aᵀ)ᵀ·(aᵀ)ᵀ = a·a, and C
        # read back row-major is Cᵀ = aᵀ·aᵀ.
        c = to_jax_array(be, pc, (8, 8), "float64")
        np.testing.assert_allclose(np.asarray(c), np.asarray(a).T @ np.asarray(a).T,
                                   rtol=1e-12)
    np.testing.assert_allclose(np.asarray(z + 0), np.exp(np.asarray(x)), rtol=1e-6)


@pytest.mark.cuda_interpret
def test_interpreted_missing_ordinal_is_a_missing_gpu(interp_mode):
    # The interpreter has device 0 only: another ordinal behaves as a GPU that is not there.
    be = CudaBackend(1, interpret=True)
    be.init()
    assert be.is_initialized() and not be.has_device and be.stream == 0
    be.synchronize()
    with pytest.raises(DeviceError) as caught:
        be.alloc(16)
    assert caught.value.name == "CUDA_ERROR_INVALID_DEVICE", caught.value
    be.close()


@pytest.mark.cuda_interpret
def test_interpreted_fresh_memory_is_poisoned(interp_mode):
    # Fresh device memory reads as 0xff bytes (NaN), and the order of checks holds.
    with CudaBackend(interpret=True) as be:
        p = be.alloc(16)
        out = np.zeros(4, np.float32)
        be.copy_dtoh(out, p)
        assert (out.view(np.uint32) == 0xFFFFFFFF).all()
        with pytest.raises(InvalidArgument, match="past the end"):
            be.unary("exp", p, p, 5)
        assert "interpret=True" in repr(be)
    with pytest.raises(InvalidArgument, match="interpret must be True or False"):
        CudaBackend(interpret=1)


def test_interpret_without_the_interpreter(monkeypatch):
    # A build without the interpreter (no CUDA toolkit at build time): a clear error.
    from oxijax import _interpret

    def absent():
        raise ImportError("this build of oxijax has no CUDA interpreter")

    monkeypatch.setattr(_interpret, "module", absent)
    with pytest.raises(Unsupported, match=r"interpret=True.*no CUDA interpreter"):
        CudaBackend(interpret=True)
    assert not CudaBackend().interpreted  # the GPU mode does not need it
