"""Failure paths: running out of host memory (in a kernel's scratch space or in a backend
allocation) raises a Python exception and leaves everything usable; errors on one thread
do not disturb others; a failed op call does not spoil later ones."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import threading

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import oxijax
from oxijax.backend import CpuBackend, InvalidArgument, OutOfMemory

# Lowers the address-space limit of the subprocess to what it maps now plus `margin`
# bytes, so that the next large allocation fails; `unlimit()` lifts it again.
LIMIT = textwrap.dedent("""
    import resource
    def mapped():
        with open("/proc/self/status") as f:
            return next(int(l.split()[1]) * 1024 for l in f if l.startswith("VmSize"))
    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    def limit(margin):
        resource.setrlimit(resource.RLIMIT_AS, (mapped() + margin, hard))
    def unlimit():
        resource.setrlimit(resource.RLIMIT_AS, (soft, hard))
""")


def run_python(code: str) -> str:
    """Runs `code` after LIMIT in a fresh process on the CPU platform (host memory is
    what runs out; on a GPU machine the ops would run on the GPU)."""
    result = subprocess.run([sys.executable, "-c", LIMIT + textwrap.dedent(code)],
                            capture_output=True, text=True, timeout=300,
                            env={**os.environ, "JAX_PLATFORMS": "cpu"})
    assert result.returncode == 0, f"exit {result.returncode}\n{result.stdout}\n{result.stderr}"
    return result.stdout


def test_kernel_scratch_exhaustion_raises_in_python():
    # attention's backward pass keeps scratch of five times q's size here (Q and dO copied
    # to rows padded to the vector width, 1022 -> 1024 columns on every level; Q^T, dO^T and
    # one dQ partial) beside XLA's result buffers (dq as large as q). The limit leaves room
    # for the results plus one more q-sized mapping (a thread's new malloc arena reserves
    # 64 MiB of address space) but not for the scratch, by a wide gap: with three q-sized
    # blocks of scratch (head dim 1024) CI once saw the run fit, as if what was mapped
    # when the limit was set shrank by more than a q afterwards. Every operand is ready and
    # the collector has run before the limit is taken. Without the handlers' exception guard,
    # std::bad_alloc would unwind into XLA and abort the process. The kernels keep scratch
    # between calls (ScratchCache), so the warm-up runs a small problem (threads started,
    # small blocks cached) and the large one is only compiled ahead of the limited run.
    out = run_python("""
        import gc, jax, jax.numpy as jnp, numpy as np, oxijax
        def operands(sq, dim):
            q = jnp.asarray(np.random.default_rng(0).standard_normal((1, 1, sq, dim), np.float32))
            kv, lse = q[:, :, :8], jnp.zeros(q.shape[:3], jnp.float32)
            return q, kv, kv, q, lse, q
        def backward(q, kv):
            results = [jax.ShapeDtypeStruct(a.shape, a.dtype) for a in (q, kv, kv)]
            call = jax.ffi.ffi_call("oxijax_attention_backward", results)
            return jax.jit(lambda *a: call(*a, scale=np.float64(0.03), causal=False))
        small = operands(64, 64)
        jax.block_until_ready(backward(small[0], small[1])(*small))  # warm: threads started
        args = jax.block_until_ready(operands(16384, 1022))
        q = args[0]
        compiled = backward(q, args[1]).lower(*args).compile()
        run = lambda: jax.block_until_ready(compiled(*args))
        gc.collect()
        limit(q.nbytes * 5 // 2)
        try:
            run()
            print("no error")
        except Exception as e:
            print("raised:", type(e).__name__, e)
        unlimit()
        expected, again = run(), run()
        print("usable:", all(bool(jnp.array_equal(a, b)) for a, b in zip(again, expected)))
    """)
    assert "raised:" in out and "out of host memory" in out, out
    assert "usable: True" in out, out


def test_backend_alloc_beyond_the_host_raises_out_of_memory():
    with CpuBackend() as be:
        with pytest.raises(OutOfMemory, match="out of device memory") as raised:
            be.alloc(1 << 60)
        assert raised.value.nbytes == 1 << 60 and isinstance(raised.value, MemoryError)
        assert be.live_allocations == 0
        ptr = be.alloc(64)  # still usable
        be.copy_htod(ptr, np.arange(16, dtype=np.float32))
        be.unary("neg", ptr, ptr, 16)
        host = np.empty(16, np.float32)
        be.copy_dtoh(host, ptr)
        np.testing.assert_array_equal(host, -np.arange(16, dtype=np.float32))
        be.free(ptr)


def test_backend_alloc_under_an_address_space_limit_raises_out_of_memory():
    out = run_python("""
        import numpy as np
        from oxijax import _oxijax
        from oxijax.backend import CpuBackend, OutOfMemory
        be = CpuBackend(); be.init()
        small = be.alloc(1 << 20)
        limit(64 << 20)
        try:
            be.alloc(256 << 20)
            print("no error")
        except OutOfMemory as e:
            print("raised OutOfMemory:", e.nbytes)
        ptr = be.alloc(4096)      # fits under the limit
        be.copy_htod(ptr, np.ones(1024, np.float32))
        be.reduce("sum", ptr, small, [1024], 0)
        total = np.empty(1, np.float32); be.copy_dtoh(total, small)
        print("sum:", total[0], "live:", be.live_allocations,
              _oxijax.backend.live_host_allocations())
        be.close()
        print("after close:", _oxijax.backend.live_host_allocations())
    """)
    assert f"raised OutOfMemory: {256 << 20}" in out, out
    assert "sum: 1024.0 live: 2 2" in out and "after close: 0" in out, out


def test_errors_on_some_threads_do_not_disturb_others():
    rng = np.random.default_rng(1)
    n = 4096
    data = [rng.standard_normal(n).astype(np.float32) for _ in range(4)]
    failures: list[BaseException] = []
    with CpuBackend() as be:
        def compute(x: np.ndarray) -> None:
            src, dst = be.alloc(x.nbytes), be.alloc(x.nbytes)
            try:
                be.copy_htod(src, x)
                for _ in range(30):
                    be.unary("tanh", src, dst, n)
                    be.binary("mul", dst, src, dst, n)
                    got = np.empty_like(x)
                    be.copy_dtoh(got, dst)
                    np.testing.assert_allclose(got, np.tanh(x) * x, rtol=1e-6, atol=1e-6)
            finally:
                be.free(src), be.free(dst)

        def misuse() -> None:
            ptr = be.alloc(64)
            try:
                for _ in range(100):
                    with pytest.raises(InvalidArgument):
                        be.unary("exp", ptr, ptr, 1 << 20)  # runs past the allocation
                    with pytest.raises(InvalidArgument):
                        be.free(ptr + 8)
                    with pytest.raises(InvalidArgument):
                        be.reduce("sum", ptr, ptr, [4, 4], 5)
            finally:
                be.free(ptr)

        def guarded(fn, *args):
            try:
                fn(*args)
            except BaseException as e:  # noqa: BLE001  (reported below)
                failures.append(e)

        threads = [threading.Thread(target=guarded, args=(compute, x)) for x in data]
        threads += [threading.Thread(target=guarded, args=(misuse,)) for _ in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert not failures, failures
        assert be.live_allocations == 0


def test_jax_errors_on_some_threads_do_not_disturb_others():
    x = jnp.linspace(-3, 3, 1000, dtype=jnp.float32)
    good = jax.jit(lambda x: oxijax.unary(x, "tanh"))
    bad = jax.jit(lambda x: jax.ffi.ffi_call("oxijax_unary", jax.ShapeDtypeStruct((7,), x.dtype))(
        x, op=np.int32(0)))
    failures: list[BaseException] = []

    def run(fn) -> None:
        try:
            fn()
        except BaseException as e:  # noqa: BLE001
            failures.append(e)

    def compute() -> None:
        for _ in range(20):
            np.testing.assert_allclose(good(x), np.tanh(np.asarray(x)), rtol=1e-6, atol=1e-6)

    def misuse() -> None:
        for _ in range(20):
            with pytest.raises(Exception, match="unary result has shape"):
                jax.block_until_ready(bad(x))

    threads = [threading.Thread(target=run, args=(f,)) for f in (compute, misuse) * 4]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not failures, failures


def test_a_failed_op_call_does_not_spoil_later_calls():
    a = jnp.arange(6, dtype=jnp.float32).reshape(2, 3)
    with pytest.raises(Exception, match="inner dimensions differ"):
        jax.block_until_ready(jax.jit(lambda a: jax.ffi.ffi_call(
            "oxijax_gemm", jax.ShapeDtypeStruct((2, 2), jnp.float32))(
            a, a, trans_a=np.int32(0), trans_b=np.int32(0), alpha=np.float64(1),
            beta=np.float64(0), allow_tf32=False))(a))
    np.testing.assert_allclose(oxijax.gemm(a, a.T), a @ a.T)
    np.testing.assert_allclose(oxijax.reduce(a, "sum", 1), a.sum(1))
    np.testing.assert_allclose(oxijax.attention(a[None, None], a[None, None], a[None, None]),
                               jax.nn.dot_product_attention(
                                   a[None, :, None], a[None, :, None], a[None, :, None]
                               ).transpose(0, 2, 1, 3), rtol=1e-6)
