"""The CPU kernels on aarch64 (NEON). Cross-compiled with Zig's clang (the `ziglang`
wheel of the test extra: a C++ toolchain with its own aarch64 C library, nothing to
install system-wide) and linked as the kernel library CMakeLists.txt builds there; then
linked into tests/native/kernel_runner.cc as one static program and run under
qemu-aarch64 (Debian's qemu-user; those tests skip without it), every kernel checked
against the same float64 references as the op tests.

The target is aarch64-linux-musl: a static program runs under qemu-user without an
aarch64 sysroot. The kernels use no C library call that glibc and musl declare
differently but sysconf's cache sizes (cache_info.h), which musl lacks (the defaults)."""

from __future__ import annotations

import concurrent.futures
import fcntl
import os
import pathlib
import shutil
import struct
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import DTYPE_IDS, DTYPES, assert_close, f64, random
from test_attention_grad import reference as attention_reference
from test_elementwise import BINARY_REFERENCE, SPECIAL, UNARY_REFERENCE, rounded, unary_input
from test_grad import UNARY as UNARY_JNP
from test_grad import unary_input as unary_grad_input

from oxijax import BinaryOp, ReduceOp, UnaryOp

pytest.importorskip("ziglang")
# Building the kernels for aarch64 takes minutes.
pytestmark = pytest.mark.slow

ROOT = pathlib.Path(__file__).resolve().parent.parent
CPU = ROOT / "ffi" / "cpu"
# The kernel library's sources (CMakeLists.txt OXIJAX_CPU_KERNEL_SOURCES): every .cc in
# ffi/cpu but the dispatcher, which is part of the extension.
SOURCES = sorted(p for p in CPU.glob("*.cc") if p.name != "isa_dispatch.cc")
RUNNER = ROOT / "tests" / "native" / "kernel_runner.cc"
TARGET = "aarch64-linux-musl"
EM_AARCH64 = 183
QEMU = shutil.which("qemu-aarch64") or shutil.which("qemu-aarch64-static")
THREADS = 3  # the runner's loops: the calling thread and two helpers


def zig(*args: str, cache: pathlib.Path) -> None:
    # Zig's caches go to the test's folder, not the user's home.
    env = dict(os.environ, ZIG_GLOBAL_CACHE_DIR=str(cache / "global"),
               ZIG_LOCAL_CACHE_DIR=str(cache / "local"))
    result = subprocess.run([sys.executable, "-m", "ziglang", "c++", *args],
                            capture_output=True, text=True, env=env, timeout=900)
    assert result.returncode == 0, result.stderr[-4000:]


@pytest.fixture(scope="module")
def build(tmp_path_factory) -> pathlib.Path:
    """A folder with the kernel library (liboxijax_cpu_neon.so) and the runner program
    (kernel_runner) built for aarch64: built once per test session, under pytest-xdist
    by the first worker to get here while the others wait (they share the base temp
    folder's parent)."""
    base = tmp_path_factory.getbasetemp()
    shared = base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base
    folder = shared / "aarch64"
    with open(shared / "aarch64.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (folder / "built").exists():
            shutil.rmtree(folder, ignore_errors=True)
            folder.mkdir()
            compile_and_link(folder)
            (folder / "built").touch()
    return folder


def compile_and_link(folder: pathlib.Path) -> None:
    # -O1: a correctness build at half the compile time of -O3 (CI's budget); the NEON
    # code paths are the same.
    flags = ["-target", TARGET, "-std=c++17", "-O1", "-fno-math-errno",
             "-fPIC", "-fvisibility=hidden", "-fvisibility-inlines-hidden", "-Wall",
             "-Werror", f"-I{ROOT / 'ffi' / 'include'}", f"-I{CPU}",
             '-DOXIJAX_CPU_LEVEL="neon"', '-DOXIJAX_CPU_FLAGS="-O1"']
    with concurrent.futures.ThreadPoolExecutor(os.cpu_count() or 2) as pool:
        list(pool.map(lambda s: zig(*flags, "-c", str(s), "-o", str(folder / f"{s.stem}.o"),
                                    cache=folder), [*SOURCES, RUNNER]))
    kernels = [str(folder / f"{s.stem}.o") for s in SOURCES]
    # The library as CMakeLists.txt links it, but without the C and C++ libraries (left
    # to the loader, as a shared library may): the static runner links those, and
    # building them twice would double the time.
    zig("-target", TARGET, "-shared", "-nostdlib", "-nostdlib++", "-o",
        str(folder / "liboxijax_cpu_neon.so"), *kernels,
        f"-Wl,--version-script={CPU / 'kernel_library.map'}", cache=folder)
    zig("-target", TARGET, "-static", "-o", str(folder / "kernel_runner"),
        str(folder / "kernel_runner.o"), *kernels, cache=folder)


def test_kernel_sources_are_listed_in_cmake():
    cmake = (ROOT / "CMakeLists.txt").read_text()
    assert all(f"ffi/cpu/{p.name}" in cmake for p in SOURCES)


def test_cpu_kernels_build_for_aarch64(build):
    for name in ("liboxijax_cpu_neon.so", "kernel_runner"):
        elf = (build / name).read_bytes()
        assert elf[:4] == b"\x7fELF", name
        assert struct.unpack_from("<H", elf, 18)[0] == EM_AARCH64, name
        assert b"oxijax_cpu_kernel_table" in elf, name


# ------------------------------------------------------------ running under qemu


class Runner:
    """tests/native/kernel_runner.cc for aarch64 under qemu: kernel calls in, results out."""

    def __init__(self, program: pathlib.Path):
        self.program = program
        self.calls: list[tuple[bytes, list[tuple[tuple[int, ...], np.dtype]]]] = []

    def add(self, kernel: str, dtype, inputs, outputs, params) -> int:
        """Queues a call; `outputs` are (shape, dtype) pairs. Returns its index."""
        inputs = [np.ascontiguousarray(x) for x in inputs]
        outputs = [(tuple(shape), np.dtype(dt)) for shape, dt in outputs]
        sizes = [x.nbytes for x in inputs] + [int(np.prod(s)) * d.itemsize for s, d in outputs]
        line = " ".join(str(v) for v in (kernel, np.dtype(dtype).name, THREADS, len(inputs),
                                          len(outputs), *sizes, *params))
        self.calls.append((line.encode() + b"\n" + b"".join(x.tobytes() for x in inputs),
                           outputs))
        return len(self.calls) - 1

    def run(self) -> list[list[np.ndarray]]:
        """Runs the queued calls in one process; their outputs, in order."""
        calls, self.calls = self.calls, []
        result = subprocess.run([QEMU, str(self.program)], input=b"".join(c for c, _ in calls),
                                capture_output=True, timeout=600)
        assert result.returncode == 0, result.stderr.decode()[-4000:]
        out, offset, answers = result.stdout, 0, []
        for _, outputs in calls:
            arrays = []
            for shape, dtype in outputs:
                count = int(np.prod(shape))
                arrays.append(np.frombuffer(out, dtype, count, offset).reshape(shape))
                offset += count * dtype.itemsize
            answers.append(arrays)
        assert offset == len(out), "the runner wrote more than the calls' outputs"
        return answers


@pytest.fixture
def runner(build) -> Runner:
    """A Runner of its own per test: a failed test leaves no queued calls behind."""
    if QEMU is None:
        pytest.skip("qemu-aarch64 is not installed (Debian: apt-get install qemu-user)")
    return Runner(build / "kernel_runner")


def host(x, dtype=None) -> np.ndarray:
    """A drawn jax array as a NumPy array of the kernel's element type."""
    return np.asarray(x if dtype is None else jnp.asarray(x, dtype))


def acc(dtype) -> np.dtype:
    """The kernels' accumulator type Acc<T>: float64 for float64, else float32."""
    return np.dtype(np.float64 if np.dtype(dtype) == np.float64 else np.float32)


dtypes = pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)


def test_runner_runs_the_neon_kernels(runner):
    result = subprocess.run([QEMU, str(runner.program)], input=b"level\n", capture_output=True,
                            timeout=60)
    assert result.stdout.decode().strip() == "neon", result.stderr.decode()


@dtypes
def test_unary_and_its_gradient_on_aarch64(runner, dtype):
    forwards, grads = [], []
    for op in UnaryOp:
        for i, n in enumerate((1, 7, 1000, 4099)):
            x = host(unary_input(op, (n,), dtype, i))
            forwards.append((op, x, runner.add("unary", dtype, [x], [(x.shape, dtype)],
                                               [op.value, n])))
            x, t = host(unary_grad_input(op, (n,), dtype, i)), host(random((n,), dtype, i + 9))
            grads.append((op, x, t, runner.add("unary_grad", dtype, [x, t], [(x.shape, dtype)],
                                               [op.value, n])))
        x = host(SPECIAL, dtype)
        forwards.append((op, x, runner.add("unary", dtype, [x], [(x.shape, dtype)],
                                           [op.value, x.size])))
    results = runner.run()
    for op, x, call in forwards:
        with np.errstate(all="ignore"):
            expected = rounded(UNARY_REFERENCE[op](f64(x)), dtype)
        assert_close(results[call][0], expected, dtype, scale=0.0)
    for op, x, t, call in grads:  # test_grad's tolerance
        _, vjp = jax.vjp(UNARY_JNP[op], jnp.asarray(f64(x)))
        assert_close(results[call][0], vjp(jnp.asarray(f64(t)))[0], dtype, factor=4.0)


def broadcast_params(a_shape, b_shape):
    """The output's dims and each operand's element strides per output dim (0: broadcast)."""
    dims = np.broadcast_shapes(a_shape, b_shape)

    def strides(shape):
        shape = (1,) * (len(dims) - len(shape)) + tuple(shape)
        packed = np.cumprod((1,) + shape[:0:-1])[::-1]
        return [0 if s == 1 else int(p) for s, p in zip(shape, packed)]

    return dims, [len(dims), *dims, *strides(a_shape), *strides(b_shape)]


@dtypes
def test_binary_and_its_partials_on_aarch64(runner, dtype):
    shapes = [((1,), (1,)), ((7,), (7,)), ((3, 5), (5,)), ((2, 1, 4), (3, 1)),
              ((), (257,)), ((1030,), (1030,)), ((4, 33), (4, 1))]
    cases = []
    for op in BinaryOp:
        for i, (sa, sb) in enumerate(shapes):
            # Small integers in half of the cases: ties for max and min.
            a, b = (random(s, dtype, 2 * i + j) for j, s in enumerate((sa, sb)))
            if i % 2:
                a, b = jnp.round(a), jnp.round(b)
            a, b = host(a), host(b)
            dims, params = broadcast_params(sa, sb)
            cases.append((op, a, b, runner.add("binary", dtype, [a, b], [(dims, dtype)],
                                               [op.value, *params])))
    partials = []
    for op in (BinaryOp.MAX, BinaryOp.MIN):
        for i, (sa, sb) in enumerate(shapes):
            a, b = (host(jnp.round(random(s, dtype, 3 * i + j))) for j, s in enumerate((sa, sb)))
            dims, params = broadcast_params(sa, sb)
            partials.append((op, a, b, runner.add("binary_partial", dtype, [a, b],
                                                  [(dims, dtype)], [op.value, *params])))
    a, b = host(SPECIAL, dtype), host(np.roll(SPECIAL, 3), dtype)
    cases += [(op, a, b, runner.add("binary", dtype, [a, b], [(a.shape, dtype)],
                                    [op.value, *broadcast_params(a.shape, b.shape)[1]]))
              for op in BinaryOp]
    results = runner.run()
    for op, a, b, call in cases:
        with np.errstate(all="ignore"):
            expected = rounded(BINARY_REFERENCE[op](f64(a), f64(b)), dtype)
        assert_close(results[call][0], expected, dtype, scale=0.0)
    for op, a, b, call in partials:
        a, b = np.broadcast_arrays(f64(a), f64(b))
        wins = a > b if op is BinaryOp.MAX else a < b
        expected = np.where(wins, 1.0, np.where(a == b, 0.5, 0.0))
        np.testing.assert_array_equal(f64(results[call][0]), expected)


@dtypes
def test_reduce_on_aarch64(runner, dtype):
    shapes = [(1, 1, 1), (3, 7, 1), (1, 1000, 1), (4, 33, 65), (2, 5, 300), (1, 4099, 1),
              (3, 1, 17)]
    cases = []
    for op in ReduceOp:
        for i, (outer, axis, inner) in enumerate(shapes):
            x = host(random((outer, axis, inner), dtype, i))
            cases.append((op, x, runner.add("reduce", dtype, [x], [((outer, inner), dtype)],
                                            [op.value, outer, axis, inner])))
    x = host(np.broadcast_to(SPECIAL, (3, SPECIAL.size)), dtype)  # NaN / inf in every row
    cases += [(op, x.reshape(1, 3, -1), runner.add("reduce", dtype, [x], [((1, x.shape[1]), dtype)],
                                                   [op.value, 1, 3, x.shape[1]]))
              for op in ReduceOp]
    results = runner.run()
    for op, x, call in cases:
        x = f64(x)
        with np.errstate(all="ignore"):
            expected = {ReduceOp.SUM: np.sum, ReduceOp.MAX: np.max, ReduceOp.MIN: np.min,
                        ReduceOp.MEAN: np.mean}[op](x, axis=1)
            terms = np.sum(np.abs(x), axis=1) / (x.shape[1] if op is ReduceOp.MEAN else 1)
        scale = 0.0 if op in (ReduceOp.MAX, ReduceOp.MIN) else np.max(terms[np.isfinite(terms)],
                                                                         initial=0.0)
        assert_close(results[call][0], rounded(expected, dtype), dtype, scale=scale)


GEMMS = [(1, 1, 1), (3, 5, 7), (64, 64, 64), (65, 33, 130), (130, 70, 90), (17, 200, 3)]


@dtypes
def test_gemm_on_aarch64(runner, dtype):
    cases = []
    for i, (m, n, k) in enumerate(GEMMS):
        for trans_a, trans_b in ((0, 0), (1, 0), (0, 1), (1, 1)):
            alpha, beta = (1.0, 0.0) if (trans_a, trans_b) != (1, 1) else (-0.5, 0.75)
            # Two batches of a against one b (b's batch stride 0), c added where beta != 0.
            a = host(random((2, k, m) if trans_a else (2, m, k), dtype, i))
            b = host(random((n, k) if trans_b else (k, n), dtype, i + 1))
            c = host(random((2, m, n), dtype, i + 2))
            inputs = [a, b, c] if beta else [a, b]
            params = [m, n, k, trans_a, trans_b, alpha, beta, 1, 2, m * k, 0, 0, 0, 0, 0]
            call = runner.add("gemm", dtype, inputs, [((2, m, n), dtype)], params)
            cases.append((a, b, c, trans_a, trans_b, alpha, beta, call))
    results = runner.run()
    for a, b, c, trans_a, trans_b, alpha, beta, call in cases:
        a, b = f64(a), f64(b)
        a = np.swapaxes(a, -1, -2) if trans_a else a
        b = b.T if trans_b else b
        expected = alpha * (a @ b) + beta * f64(c)
        scale = np.max(abs(alpha) * (np.abs(a) @ np.abs(b)) + abs(beta) * np.abs(f64(c)))
        assert_close(results[call][0], expected, dtype, scale=scale)


# groups, n, c, h, w, k, r, s, stride, pad
CONVS = [(1, 1, 1, 5, 5, 1, 3, 3, 1, 1), (2, 2, 3, 9, 7, 4, 3, 3, 2, 1),
         (1, 1, 8, 16, 16, 16, 3, 3, 1, 1), (1, 2, 5, 6, 6, 3, 1, 1, 1, 0),
         (1, 1, 3, 7, 7, 2, 5, 5, 2, 2)]


def conv_reference(x, w, stride, pad):
    """[G, N, C, H, W] * [G, K, C, R, S], each group its own problem (float64)."""
    conv = lambda x, w: jax.lax.conv_general_dilated(x, w, (stride, stride), [(pad, pad)] * 2)
    return jax.vmap(conv)(x, w)


@dtypes
def test_conv2d_and_its_gradients_on_aarch64(runner, dtype):
    cases = []
    for i, (g, n, c, h, w, k, r, s, stride, pad) in enumerate(CONVS):
        p, q = (h + 2 * pad - r) // stride + 1, (w + 2 * pad - s) // stride + 1
        params = [g, n, c, h, w, k, r, s, p, q, stride, stride, pad, pad]
        x = host(random((g, n, c, h, w), dtype, i))
        wt = host(random((g, k, c, r, s), dtype, i + 1))
        dy = host(random((g, n, k, p, q), dtype, i + 2))
        calls = (runner.add("conv2d", dtype, [x, wt], [(dy.shape, dtype)], params),
                 runner.add("conv2d_backward_data", dtype, [dy, wt], [(x.shape, dtype)], params),
                 runner.add("conv2d_backward_filter", dtype, [x, dy], [(wt.shape, dtype)], params))
        cases.append((x, wt, dy, stride, pad, calls))
    results = runner.run()
    for x, wt, dy, stride, pad, (forward, data, filt) in cases:
        x, wt, dy = (jnp.asarray(f64(v)) for v in (x, wt, dy))
        conv = lambda x, w: conv_reference(x, w, stride, pad)
        out, vjp = jax.vjp(conv, x, wt)
        dx, dw = vjp(dy)
        # Each result's scale: the largest sum of |terms|, the same sums over |inputs|.
        abs_out, abs_vjp = jax.vjp(conv, jnp.abs(x), jnp.abs(wt))
        adx, adw = abs_vjp(jnp.abs(dy))
        assert_close(results[forward][0], out, dtype, scale=float(jnp.max(abs_out)))
        assert_close(results[data][0], dx, dtype, scale=float(jnp.max(adx)))
        assert_close(results[filt][0], dw, dtype, scale=float(jnp.max(adw)))


ATTENTIONS = [(1, 1, 1, 1, 1), (2, 3, 5, 7, 16), (1, 2, 7, 5, 3), (1, 1, 17, 17, 1),
              (1, 2, 63, 65, 32), (1, 1, 130, 127, 64)]


@dtypes
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_attention_and_its_derivatives_on_aarch64(runner, dtype, causal):
    """The forward (out, lse), then the backward and the jvp from the forward's results,
    as the handlers chain them."""
    problems = []
    for i, (b, h, sq, skv, d) in enumerate(ATTENTIONS):
        q, k, v = (host(random(shape, dtype, i + j))
                   for j, shape in enumerate(((b, h, sq, d), (b, h, skv, d), (b, h, skv, d))))
        scale = 1 / np.sqrt(d)
        params = [b, h, sq, skv, d, scale, int(causal)]
        call = runner.add("attention", dtype, [q, k, v], [(q.shape, dtype), ((b, h, sq), acc(dtype))],
                          params)
        problems.append((q, k, v, scale, params, call))
    forward = runner.run()
    derivatives = []
    for i, (q, k, v, scale, params, call) in enumerate(problems):
        out, lse = forward[call]
        dout = host(random(q.shape, dtype, i + 10))
        dq, dk, dv = (host(random(x.shape, dtype, i + 20 + j)) for j, x in enumerate((q, k, v)))
        derivatives.append((
            runner.add("attention_backward", dtype, [q, k, v, out, lse, dout],
                       [(q.shape, dtype), (k.shape, dtype), (v.shape, dtype)], params),
            runner.add("attention_jvp", dtype, [q, k, v, out, lse, dq, dk, dv],
                       [(q.shape, dtype)], params),
            dout, (dq, dk, dv)))
    results = runner.run()
    half = np.dtype(dtype) in (np.dtype(jnp.float16), np.dtype(jnp.bfloat16))
    for (q, k, v, scale, _, call), (backward, jvp, dout, tangents) in zip(problems, derivatives):
        args = [jnp.asarray(f64(x)) for x in (q, k, v)]
        fn = lambda q, k, v: attention_reference(q, k, v, scale, causal)
        out, vjp = jax.vjp(fn, *args)
        got_out, got_lse = forward[call]
        assert_close(got_out, out, dtype, scale=2.0, factor=2.0 if half else 1.0)
        scores = scale * np.einsum("bhqd,bhkd->bhqk", *map(f64, (q, k)))
        sq, skv = q.shape[2], k.shape[2]
        if causal:
            visible = np.arange(skv)[None, :] <= np.arange(sq)[:, None] + (skv - sq)
            scores = np.where(visible, scores, -np.inf)
        with np.errstate(divide="ignore"):
            lse = np.log(np.sum(np.exp(scores), axis=-1))
        assert_close(got_lse, lse, acc(dtype), scale=1.0, factor=4.0 if half else 1.0)
        for got, want in zip(results[backward], vjp(jnp.asarray(f64(dout)))):
            assert_close(got, want, dtype, factor=4.0 if half else 1.0)
        _, want = jax.jvp(fn, args, [jnp.asarray(f64(t)) for t in tangents])
        assert_close(results[jvp][0], want, dtype, factor=4.0 if half else 1.0)
