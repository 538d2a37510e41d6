"""Every CUDA kernel path once, on small awkward shapes, for compute-sanitizer.

scripts/gpu_check.sh runs this under `compute-sanitizer --tool memcheck` and `--tool
racecheck`, restricted to oxijax's kernels; any sanitizer report fails the step. The
results are also compared with the CPU kernels, so a wrong answer fails it too.

With ``--interpret`` the same tour runs without a GPU, in the CUDA interpreter
(oxijax._oxijax_interp): the JAX cases run their programs lowered for the CPU inside
``oxijax.cuda_interpreter()`` (the CUDA handlers, launchers and kernels, every access
checked), the pointer-backend case on ``CudaBackend(interpret=True)``. An interpreter
report (out-of-bounds, race, uninitialised or misaligned access) fails the case it
stopped and is printed in full; the tour goes on and fails at the end. The shapes are the
GPU tour's but for the batched broadcast GEMM (same eight batch dimensions, fewer
products): about 20 s on two CPU cores.

Usage: python scripts/sanitize_gpu_ops.py [--interpret]
(without --interpret: needs a CUDA GPU and a CUDA build of oxijax). In-process:
``tour(interpret=True)`` returns the list of failures (empty: the tour passed).
"""

from __future__ import annotations

import argparse
import os

os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")

import jax  # noqa: E402

jax.config.update("jax_enable_x64", True)

import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

import oxijax  # noqa: E402
from oxijax.backend import CudaBackend  # noqa: E402

TOLERANCE = {jnp.float16: 2e-2, jnp.bfloat16: 1e-1, jnp.float32: 1e-3, jnp.float64: 1e-9}


class Tour:
    """One run of the tour: on the GPU (each case at once), or interpreted (cases are
    collected, then all run inside one cuda_interpreter() block, then on the CPU, so
    that JAX's caches are cleared twice, not twice per case)."""

    def __init__(self, interpret: bool) -> None:
        self.interpret = interpret
        self.failures: list[str] = []
        self.pending: list[tuple[str, object, tuple]] = []

    def run(self, label: str, fn, *host_args) -> None:
        """fn jitted on the device under test and on the CPU; their results must agree."""
        if self.interpret:
            self.pending.append((label, fn, host_args))
            return
        gpu, cpu = jax.devices("cuda")[0], jax.devices("cpu")[0]
        tested = jax.jit(fn)(*(jax.device_put(a, gpu) for a in host_args))
        self.compare(label, tested, jax.jit(fn)(*(jax.device_put(a, cpu) for a in host_args)),
                     host_args[0].dtype)

    def compare(self, label: str, tested, reference, dtype) -> None:
        for g, c in zip(jax.tree.leaves(tested), jax.tree.leaves(reference), strict=True):
            g, c = np.asarray(g, np.float64), np.asarray(c, np.float64)
            scale = max(np.max(np.abs(c), initial=0.0), 1.0)
            if g.shape != c.shape or not np.allclose(
                    g, c, rtol=0, atol=TOLERANCE[jnp.dtype(dtype).type] * scale, equal_nan=True):
                self.failures.append(label)
                print(f"FAIL {label}: results differ from the CPU kernels'", flush=True)
                return
        print(f"ok  {label}", flush=True)

    def finish(self) -> None:
        """Interpreted: runs the collected cases (a failed one records the interpreter's
        report), then their CPU references."""
        if not self.pending:
            return
        cpu = jax.devices("cpu")[0]
        tested: list[object] = []
        with oxijax.cuda_interpreter(schedule="shuffle", seed=0):
            for label, fn, host_args in self.pending:
                try:
                    result = jax.jit(fn)(*(jax.device_put(a, cpu) for a in host_args))
                    tested.append(jax.block_until_ready(result))
                except Exception as error:  # noqa: BLE001 - the report is the finding
                    self.failures.append(label)
                    print(f"FAIL {label}: {type(error).__name__}: {error}", flush=True)
                    tested.append(None)
        for (label, fn, host_args), result in zip(self.pending, tested, strict=True):
            if result is not None:
                reference = jax.jit(fn)(*(jax.device_put(a, cpu) for a in host_args))
                self.compare(label, result, reference, host_args[0].dtype)
        self.pending.clear()


def normal(shape, dtype, seed):
    values = np.random.default_rng(seed).standard_normal(shape)
    return values.astype(np.dtype(dtype))


def grad_of(fn):
    return jax.grad(lambda *a: jnp.sum(fn(*a).astype(jnp.float32) ** 2), argnums=(0, 1))


def elementwise(t: Tour) -> None:
    for dtype in (jnp.float16, jnp.bfloat16, jnp.float32, jnp.float64):
        x = normal((1031,), dtype, 0)
        for op in oxijax.UnaryOp:
            positive = op.name in ("LOG", "SQRT")
            t.run(f"unary {op.name} {dtype.__name__}",
                  lambda x, op=op, p=positive: oxijax.unary(jnp.abs(x) if p else x, op), x)
        for a_shape, b_shape in [((1031,), (1031,)), ((1031,), ()), ((7, 1, 33), (1, 5, 1)),
                                 ((2, 1) * 5, (1, 2) * 5)]:
            a, b = normal(a_shape, dtype, 1), normal(b_shape, dtype, 2)
            t.run(f"binary max {a_shape}x{b_shape} {dtype.__name__}", oxijax.maximum, a, b)
        t.run(f"unary_grad tanh {dtype.__name__}", grad_of(lambda x, y: oxijax.tanh(x) * y), x, x)
        t.run(f"binary_partial {dtype.__name__}", grad_of(oxijax.maximum), x,
              normal((1,), dtype, 3))


def reduce(t: Tour) -> None:
    for dtype in (jnp.bfloat16, jnp.float32, jnp.float64):
        for shape, axis in [((33, 129), 1), ((3, 300000), 1), ((33, 129), 0), ((70000, 3), 0),
                            ((2, 5000, 7), 1)]:
            for op in ("sum", "max"):
                t.run(f"reduce {op} {shape} axis {axis} {dtype.__name__}",
                      lambda x, op=op, axis=axis: oxijax.reduce(x, op, axis),
                      normal(shape, dtype, 4))


def gemm(t: Tour) -> None:
    # Eight broadcast batch dimensions: 256 products on the GPU; interpreted, 4 (the same
    # kernel path, a sixty-fourth of the work).
    if t.interpret:
        a_batch, b_batch = (2,) + (1,) * 7, (1,) * 7 + (2,)
    else:
        a_batch, b_batch = (2, 1) * 4, (1, 2) * 4
    for dtype in (jnp.float16, jnp.bfloat16, jnp.float32, jnp.float64):
        a, b, c = normal((37, 19), dtype, 5), normal((19, 45), dtype, 6), normal((37, 45), dtype, 7)
        t.run(f"gemm {dtype.__name__}", lambda a, b, c: oxijax.gemm(a, b, c, beta=0.5), a, b, c)
        t.run(f"gemm T,T {dtype.__name__}",
              lambda a, b: oxijax.gemm(a, b, trans_a="T", trans_b="T"),
              normal((19, 37), dtype, 5), normal((45, 19), dtype, 6))
        t.run(f"gemm batched broadcast {dtype.__name__}", oxijax.matmul,
              normal(a_batch + (9, 7), dtype, 8), normal(b_batch + (7, 5), dtype, 9))
        t.run(f"gemm grad {dtype.__name__}", grad_of(oxijax.matmul), a, b)
        # Few output tiles, long k: split-K, then the splits' sum.
        t.run(f"gemm split-k {dtype.__name__}", oxijax.matmul,
              normal((21, 1100), dtype, 5), normal((1100, 13), dtype, 6))
    t.run("gemm tf32", lambda a, b: oxijax.gemm(a, b, precision="tf32"),
          normal((65, 33), jnp.float32, 10), normal((33, 17), jnp.float32, 11))
    t.run("gemm k=0", lambda a, b: oxijax.matmul(a, b), normal((3, 0), jnp.float32, 0),
          normal((0, 4), jnp.float32, 0))
    # oxijax.gemm answers k = 0 without a kernel; the FFI target itself launches one.
    t.run("gemm k=0 ffi (out = beta·c)", gemm_k0_ffi, normal((3, 0), jnp.float32, 0),
          normal((0, 4), jnp.float32, 0), normal((3, 4), jnp.float32, 1))


def gemm_k0_ffi(a, b, c):
    """The gemm FFI target called directly with k = 0: out = 2·c (scale_c_kernel)."""
    from oxijax import _interpret

    target = _interpret.interpreted_target("oxijax_gemm") if _interpret.active() else "oxijax_gemm"
    call = jax.ffi.ffi_call(target, jax.ShapeDtypeStruct(c.shape, c.dtype))
    return call(a, b, c, trans_a=np.int32(0), trans_b=np.int32(0), alpha=np.float64(1.0),
                beta=np.float64(2.0), allow_tf32=False)


def conv2d(t: Tour) -> None:
    for dtype in (jnp.float16, jnp.bfloat16, jnp.float32, jnp.float64):
        x, w = normal((2, 5, 11, 9), dtype, 12), normal((7, 5, 3, 3), dtype, 13)
        # Stride 2 takes the implicit-GEMM data gradient, stride 1 the flipped forward conv.
        for stride, padding in (((2, 1), (1, 2)), ((1, 1), (1, 0))):
            conv = lambda x, w, st=stride, pd=padding: oxijax.conv2d(x, w, stride=st, padding=pd)  # noqa: E731
            t.run(f"conv2d stride {stride} {dtype.__name__}", conv, x, w)
            t.run(f"conv2d stride {stride} grad {dtype.__name__}", grad_of(conv), x, w)
    # A filter gradient deep enough (N·P·Q) to be split over blocks, then summed.
    for dtype in (jnp.float32, jnp.bfloat16):
        t.run(f"conv2d filter grad split {dtype.__name__}", grad_of(oxijax.conv2d),
              normal((1, 1, 40, 40), dtype, 12), normal((2, 1, 3, 3), dtype, 13))


def attention(t: Tour) -> None:
    # Tensor cores for half types with head dims up to 256 (200: padded to 256, output
    # columns in halves; 36: element copies); 264: SIMT.
    cases = [(jnp.bfloat16, 64), (jnp.float16, 128), (jnp.bfloat16, 40), (jnp.float16, 200),
             (jnp.bfloat16, 36), (jnp.float16, 264), (jnp.float32, 64), (jnp.float64, 32)]
    for dtype, d in cases:
        for causal in (False, True):
            q, k, v = (normal((1, 2, s, d), dtype, 14 + i) for i, s in enumerate((70, 97, 97)))
            att = lambda q, k, c=causal: oxijax.attention(q, k, k, causal=c)  # noqa: E731
            label = f"attention d={d} causal={causal} {dtype.__name__}"
            t.run(label, lambda q, k, v, c=causal: oxijax.attention(q, k, v, causal=c), q, k, v)
            t.run(f"{label} grad", grad_of(att), q, k)
            if causal:  # forward mode
                t.run(f"{label} jvp", lambda q, k, att=att: jax.jvp(
                    lambda q: att(q, k), (q,), (k[:, :, :70],)), q, k)
    q, k = normal((1, 2, 70, 48), jnp.float32, 14), normal((1, 2, 97, 48), jnp.float32, 15)
    t.run("attention tf32 float32", lambda q, k: oxijax.attention(q, k, k, precision="tf32"), q, k)


def backend(t: Tour) -> None:
    """The pointer backend's own launches: padded leading dims, interior pointers."""
    try:
        with CudaBackend(interpret=t.interpret) as be:
            m, n, k, ld = 5, 6, 7, 9
            a = np.asfortranarray(normal((ld, k), np.float64, 20))
            b = np.asfortranarray(normal((ld, n), np.float64, 21))
            pa, pb, pc = be.alloc(a.nbytes), be.alloc(b.nbytes), be.alloc(ld * n * 8)
            be.copy_htod(pa, a.tobytes(order="F"))
            be.copy_htod(pb, b.tobytes(order="F"))
            be.copy_htod(pc, np.zeros(ld * n))
            be.gemm("N", "N", m, n, k, 1.0, pa, ld, pb, ld, 0.0, pc, ld)
            out = np.empty(ld * n)
            be.copy_dtoh(out, pc)
            if not np.allclose(out.reshape((ld, n), order="F")[:m], a[:m] @ b[:k], atol=1e-9):
                t.failures.append("backend gemm")
            x = normal((1031,), np.float32, 22)
            px, py = be.alloc(x.nbytes), be.alloc(x.nbytes)
            be.copy_htod(px, x)
            be.unary("exp", px + 4, py + 4, 1030)  # interior, 4-byte (not 16-byte) aligned
            be.binary("add", px + 4, py + 4, py, 1030)
            be.reduce("sum", px, py, [1, 1031], 1)
            be.attention(px, px, px, py, 1, 1, 8, 8, 16, 0.25, True)
            be.reduce("mean", px, py, [3, 0, 2], 1)  # an empty axis: the output filled, NaN
            be.synchronize()
            mean = np.zeros(6, np.float32)
            be.copy_dtoh(mean, py)
            if not np.isnan(mean).all():
                t.failures.append("backend mean over an empty axis")
    except Exception as error:
        if not t.interpret:
            raise
        t.failures.append("backend")
        print(f"FAIL backend: {type(error).__name__}: {error}", flush=True)
        return
    print("ok  backend", flush=True)


SECTIONS = (elementwise, reduce, gemm, conv2d, attention, backend)


def tour(interpret: bool = False) -> list[str]:
    """Runs every section; returns the labels of the cases that failed (empty: passed).
    Interpreted, a report of the interpreter outside any case is a failure too."""
    t = Tour(interpret)
    if interpret:
        from oxijax import _interpret

        interp = _interpret.module()  # ImportError without the interpreter
        interp.take_reports()
    for section in SECTIONS:
        section(t)
        t.finish()
    if interpret:
        for report in interp.take_reports():
            # Every report belongs to a failed launch, whose case is already a failure;
            # printed in full here in any case.
            print(f"interpreter report:\n{report}", flush=True)
            if not t.failures:
                t.failures.append("interpreter report")
    return t.failures


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--interpret", action="store_true",
                        help="run the tour in the CUDA interpreter instead of on a GPU")
    args = parser.parse_args(argv)
    failures = tour(interpret=args.interpret)
    if failures:
        where = "the CUDA interpreter" if args.interpret else "GPU"
        raise SystemExit(f"{where} and CPU disagree (or a launch failed): {failures}")
    print("all kernel paths ran")
    return 0


if __name__ == "__main__":
    main()
