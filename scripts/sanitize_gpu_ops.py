"""Every CUDA kernel path once, on small awkward shapes, for compute-sanitizer.

scripts/gpu_check.sh runs this under `compute-sanitizer --tool memcheck` and `--tool
racecheck`, restricted to oxijax's kernels; any sanitizer report fails the step. The
results are also compared with the CPU kernels, so a wrong answer fails it too.
Usage: python scripts/sanitize_gpu_ops.py  (needs a CUDA GPU and a CUDA build of oxijax)
"""

from __future__ import annotations

import os

os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")

import jax  # noqa: E402

jax.config.update("jax_enable_x64", True)

import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

import oxijax  # noqa: E402
from oxijax.backend import CudaBackend  # noqa: E402

GPU, CPU = jax.devices("cuda")[0], jax.devices("cpu")[0]
TOLERANCE = {jnp.float16: 2e-2, jnp.bfloat16: 1e-1, jnp.float32: 1e-3, jnp.float64: 1e-9}
failures: list[str] = []


def normal(shape, dtype, seed):
    values = np.random.default_rng(seed).standard_normal(shape)
    return values.astype(np.dtype(dtype))


def run(label: str, fn, *host_args) -> None:
    """fn jitted on the GPU and on the CPU; their results must agree."""
    dtype = host_args[0].dtype
    gpu = jax.jit(fn)(*(jax.device_put(a, GPU) for a in host_args))
    cpu = jax.jit(fn)(*(jax.device_put(a, CPU) for a in host_args))
    for g, c in zip(jax.tree.leaves(gpu), jax.tree.leaves(cpu)):
        g, c = np.asarray(g, np.float64), np.asarray(c, np.float64)
        scale = max(np.max(np.abs(c), initial=0.0), 1.0)
        if not np.allclose(g, c, rtol=0, atol=TOLERANCE[jnp.dtype(dtype).type] * scale,
                           equal_nan=True):
            failures.append(label)
    print(f"ok  {label}", flush=True)


def grad_of(fn):
    return jax.grad(lambda *a: jnp.sum(fn(*a).astype(jnp.float32) ** 2), argnums=(0, 1))


def elementwise() -> None:
    for dtype in (jnp.float16, jnp.bfloat16, jnp.float32, jnp.float64):
        x = normal((1031,), dtype, 0)
        for op in oxijax.UnaryOp:
            run(f"unary {op.name} {dtype.__name__}", lambda x, op=op: oxijax.unary(jnp.abs(x) if op.name in ("LOG", "SQRT") else x, op), x)
        for a_shape, b_shape in [((1031,), (1031,)), ((1031,), ()), ((7, 1, 33), (1, 5, 1)),
                                 ((2, 1) * 5, (1, 2) * 5)]:
            a, b = normal(a_shape, dtype, 1), normal(b_shape, dtype, 2)
            run(f"binary max {a_shape}x{b_shape} {dtype.__name__}", oxijax.maximum, a, b)
        run(f"unary_grad tanh {dtype.__name__}", grad_of(lambda x, y: oxijax.tanh(x) * y), x, x)
        run(f"binary_partial {dtype.__name__}", grad_of(oxijax.maximum), x, normal((1,), dtype, 3))


def reduce() -> None:
    for dtype in (jnp.bfloat16, jnp.float32, jnp.float64):
        for shape, axis in [((33, 129), 1), ((3, 300000), 1), ((33, 129), 0), ((70000, 3), 0),
                            ((2, 5000, 7), 1)]:
            for op in ("sum", "max"):
                run(f"reduce {op} {shape} axis {axis} {dtype.__name__}",
                    lambda x, op=op, axis=axis: oxijax.reduce(x, op, axis), normal(shape, dtype, 4))


def gemm() -> None:
    for dtype in (jnp.float16, jnp.bfloat16, jnp.float32, jnp.float64):
        a, b, c = normal((37, 19), dtype, 5), normal((19, 45), dtype, 6), normal((37, 45), dtype, 7)
        run(f"gemm {dtype.__name__}", lambda a, b, c: oxijax.gemm(a, b, c, beta=0.5), a, b, c)
        run(f"gemm T,T {dtype.__name__}", lambda a, b: oxijax.gemm(a, b, trans_a="T", trans_b="T"),
            normal((19, 37), dtype, 5), normal((45, 19), dtype, 6))
        run(f"gemm batched broadcast {dtype.__name__}", oxijax.matmul,
            normal((2, 1) * 4 + (9, 7), dtype, 8), normal((1, 2) * 4 + (7, 5), dtype, 9))
        run(f"gemm grad {dtype.__name__}", grad_of(oxijax.matmul), a, b)
    run("gemm tf32", lambda a, b: oxijax.gemm(a, b, precision="tf32"),
        normal((65, 33), jnp.float32, 10), normal((33, 17), jnp.float32, 11))
    run("gemm k=0", lambda a, b: oxijax.matmul(a, b), normal((3, 0), jnp.float32, 0),
        normal((0, 4), jnp.float32, 0))


def conv2d() -> None:
    for dtype in (jnp.float16, jnp.bfloat16, jnp.float32, jnp.float64):
        x, w = normal((2, 5, 11, 9), dtype, 12), normal((7, 5, 3, 3), dtype, 13)
        # Stride 2 takes the implicit-GEMM data gradient, stride 1 the flipped forward conv.
        for stride, padding in (((2, 1), (1, 2)), ((1, 1), (1, 0))):
            conv = lambda x, w, st=stride, pd=padding: oxijax.conv2d(x, w, stride=st, padding=pd)  # noqa: E731
            run(f"conv2d stride {stride} {dtype.__name__}", conv, x, w)
            run(f"conv2d stride {stride} grad {dtype.__name__}", grad_of(conv), x, w)


def attention() -> None:
    cases = [(jnp.bfloat16, 64), (jnp.float16, 128), (jnp.bfloat16, 40), (jnp.float32, 64),
             (jnp.float64, 32)]
    for dtype, d in cases:
        for causal in (False, True):
            q, k, v = (normal((1, 2, s, d), dtype, 14 + i) for i, s in enumerate((70, 97, 97)))
            att = lambda q, k, c=causal: oxijax.attention(q, k, k, causal=c)  # noqa: E731
            label = f"attention d={d} causal={causal} {dtype.__name__}"
            run(label, lambda q, k, v, c=causal: oxijax.attention(q, k, v, causal=c), q, k, v)
            run(f"{label} grad", grad_of(att), q, k)


def backend() -> None:
    """The pointer backend's own launches: padded leading dims, interior pointers."""
    with CudaBackend() as be:
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
            failures.append("backend gemm")
        x = normal((1031,), np.float32, 22)
        px, py = be.alloc(x.nbytes), be.alloc(x.nbytes)
        be.copy_htod(px, x)
        be.unary("exp", px + 4, py + 4, 1030)  # interior, 4-byte (not 16-byte) aligned
        be.binary("add", px + 4, py + 4, py, 1030)
        be.reduce("sum", px, py, [1, 1031], 1)
        be.attention(px, px, px, py, 1, 1, 8, 8, 16, 0.25, True)
        be.synchronize()
        print("ok  backend", flush=True)


if __name__ == "__main__":
    for section in (elementwise, reduce, gemm, conv2d, attention, backend):
        section()
    if failures:
        raise SystemExit(f"GPU and CPU disagree: {failures}")
    print("all kernel paths ran")
