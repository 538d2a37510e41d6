"""The CPU kernels' parallel loop (ffi/cpu/parallel.cc) under ThreadSanitizer and
AddressSanitizer + UBSan: tests/native/parallel_stress.cc runs thousands of loops of
random sizes with 15 helper threads, each loop checking that every index ran exactly
once, that a failing chunk's exception reaches the caller, and that no helper called
the loop's scheduler after the loop had returned (helpers start further helpers, and
XLA's pool handle is valid only during the FFI call). Then every op, on an XLA
intra-op pool of 16 threads, against references. The op tests run on the machine's own
thread count (one helper on a 2-core machine, which starts no other); these cover the
many-thread interleavings, and helpers starting helpers through XLA's pool."""

from __future__ import annotations

import os
import pathlib
import shutil
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
SOURCES = [ROOT / "tests" / "native" / "parallel_stress.cc", ROOT / "ffi" / "cpu" / "parallel.cc"]
COMPILER = os.environ.get("CXX") or shutil.which("c++") or shutil.which("g++")
SANITIZERS = {"tsan": "thread", "asan": "address,undefined"}
HELPERS = 15  # as on a 16-core machine
# The programs bring their own sanitizer runtime: none preloaded (scripts/sanitize_check.sh).
NATIVE_ENV = {k: v for k, v in os.environ.items() if k != "LD_PRELOAD"}


def build(folder: pathlib.Path, sanitizer: str, sources: list[pathlib.Path]) -> subprocess.CompletedProcess:
    return subprocess.run(
        [COMPILER, "-std=c++17", "-O1", "-g", "-pthread", f"-fsanitize={sanitizer}",
         "-fno-sanitize-recover=all", "-fno-omit-frame-pointer", f"-I{ROOT / 'ffi' / 'cpu'}",
         *map(str, sources), "-o", str(folder / "parallel_stress")],
        capture_output=True, text=True, env=NATIVE_ENV, timeout=300)


# Under ThreadSanitizer a run takes 15-17 s (slow: scheduled first), under ASan ~1.5 s.
@pytest.fixture(scope="module", params=[
    pytest.param(name, marks=[pytest.mark.slow] if name == "tsan" else [])
    for name in sorted(SANITIZERS)])
def stress_program(request, tmp_path_factory) -> pathlib.Path:
    if COMPILER is None:
        pytest.skip("no C++ compiler (CXX, c++ or g++)")
    sanitizer = SANITIZERS[request.param]
    folder = tmp_path_factory.mktemp(request.param)
    probe = folder / "probe.cc"
    probe.write_text("int main() { return 0; }\n")
    if build(folder, sanitizer, [probe]).returncode != 0:
        pytest.skip(f"{COMPILER} cannot link -fsanitize={sanitizer} here")
    result = build(folder, sanitizer, SOURCES)
    assert result.returncode == 0, result.stderr[-4000:]
    return folder / "parallel_stress"


@pytest.mark.parametrize("mode", ["threads", "late", "throw"])
def test_parallel_loop(stress_program, mode):
    env = dict(NATIVE_ENV, TSAN_OPTIONS="halt_on_error=1", ASAN_OPTIONS="detect_leaks=1")
    result = subprocess.run([str(stress_program), mode, str(HELPERS), "1500"],
                            capture_output=True, text=True, env=env, timeout=300)
    assert result.returncode == 0, result.stderr[-4000:]
    assert result.stdout.strip() == "ok"
    assert "WARNING" not in result.stderr and "ERROR" not in result.stderr, result.stderr[-4000:]


# Every op at sizes that cut into many chunks, on an XLA intra-op pool of 16 threads
# (PJRT_NPROC sets its size; 15 helpers even on a 2-core machine, where the op tests run
# one): helpers started by helpers through XLA's own pool, every result against a
# float64 (NumPy) or jnp reference.
MANY_HELPERS = r"""
import jax, jax.numpy as jnp, numpy as np, oxijax
jax.config.update("jax_default_matmul_precision", "highest")
rng = np.random.default_rng(0)
def close(name, got, want, rtol):
    got = np.asarray(got, np.float64); want = np.asarray(want, np.float64)
    err = np.max(np.abs(got - want)) / max(np.max(np.abs(want)), 1e-30)
    assert got.shape == want.shape and err <= rtol, (name, got.shape, want.shape, err)
x = rng.standard_normal(1 << 22).astype(np.float32)
m = rng.standard_normal((2048, 2048)).astype(np.float32)
row = rng.standard_normal(2048).astype(np.float32)
f64 = lambda a: np.asarray(a, np.float64)
close("sum", jax.jit(lambda v: oxijax.sum(v, 0))(x), f64(x).sum(), 1e-5)
close("sum axis 0", jax.jit(lambda v: oxijax.sum(v, 0))(m), f64(m).sum(0), 1e-5)
close("max axis 1", jax.jit(lambda v: oxijax.max(v, 1))(m), f64(m).max(1), 0)
mb = jnp.asarray(m, jnp.bfloat16)
close("max axis 1 bf16", jax.jit(lambda v: oxijax.max(v, 1))(mb), f64(mb).max(1), 0)
close("exp", jax.jit(oxijax.exp)(x), np.exp(f64(x)), 1e-6)
close("max bcast", jax.jit(oxijax.maximum)(m, row), np.maximum(f64(m), f64(row)), 0)
a, b = (rng.standard_normal((512, 512)).astype(np.float32) for _ in range(2))
close("gemm", jax.jit(oxijax.matmul)(a, b), f64(a) @ f64(b), 1e-5)
ab, bb = jnp.asarray(a, jnp.bfloat16), jnp.asarray(b, jnp.bfloat16)
close("gemm bf16", jax.jit(oxijax.matmul)(ab, bb), f64(ab) @ f64(bb), 1e-2)
ba, bb8 = (rng.standard_normal((8, 256, 256)).astype(np.float32) for _ in range(2))
close("batched gemm", jax.jit(oxijax.matmul)(ba, bb8), f64(ba) @ f64(bb8), 1e-5)
img = rng.standard_normal((4, 32, 28, 28)).astype(np.float32)
w = rng.standard_normal((32, 32, 3, 3)).astype(np.float32)
conv = lambda i, k: oxijax.conv2d(i, k, padding=(1, 1))
ref = lambda i, k: jax.lax.conv_general_dilated(i, k, (1, 1), [(1, 1), (1, 1)])
loss = lambda f: lambda *t: jnp.sum(f(*t) ** 2)
close("conv2d", jax.jit(conv)(img, w), ref(f64(img), f64(w)), 1e-5)
for got, want in zip(jax.jit(jax.grad(loss(conv), (0, 1)))(img, w),
                     jax.grad(loss(ref), (0, 1))(f64(img), f64(w))):
    close("conv2d grad", got, want, 1e-5)
q, k, v = (rng.standard_normal((1, 8, 512, 64)).astype(np.float32) for _ in range(3))
def attention_ref(q, k, v):
    s = jnp.einsum("bhqd,bhkd->bhqk", q, k) / np.sqrt(q.shape[-1])
    return jnp.einsum("bhqk,bhkd->bhqd", jax.nn.softmax(s, -1), v)
close("attention", jax.jit(oxijax.attention)(q, k, v), attention_ref(f64(q), f64(k), f64(v)), 1e-5)
for got, want in zip(jax.jit(jax.grad(loss(oxijax.attention), (0, 1, 2)))(q, k, v),
                     jax.grad(loss(attention_ref), (0, 1, 2))(f64(q), f64(k), f64(v))):
    close("attention grad", got, want, 1e-4)
print("ok")
"""


def test_ops_on_an_xla_pool_of_16_threads():
    env = dict(os.environ, PJRT_NPROC="16", JAX_PLATFORMS="cpu", JAX_ENABLE_X64="1")
    result = subprocess.run([sys.executable, "-c", MANY_HELPERS], capture_output=True,
                            text=True, env=env, timeout=600)
    assert result.returncode == 0, result.stderr[-4000:]
    assert result.stdout.strip().endswith("ok")
