"""The ops paired with their XLA equivalents, for `python -m oxijax check` and `bench`."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np

import oxijax


@dataclasses.dataclass(frozen=True)
class Case:
    op: str
    shape: str
    make_args: Callable[[jnp.dtype], tuple]
    oxijax_fn: Callable
    xla_fn: Callable
    flops: float = 0.0        # useful floating-point work, for TFLOP/s
    bytes_moved: float = 0.0  # minimum memory traffic in elements, for GB/s
    reference_fn: Callable | None = None  # float64 reference for `check`; default xla_fn
    tolerance_factor: float = 1.0  # > 1 where the op trades precision on purpose (TF32)
    # More implementations to time against, by label (e.g. cuDNN's attention); one that
    # cannot run on this device or dtype is reported as n/a.
    baselines: tuple[tuple[str, Callable], ...] = ()
    eager: bool = False  # timed as called, not under jax.jit: the cost of eager dispatch

    @property
    def is_gradient(self) -> bool:
        """A forward-and-backward case: its result already holds the gradients."""
        return self.op.endswith("fwd+bwd")

    @property
    def reference(self) -> Callable:
        return self.reference_fn or self.xla_fn


def _normal(shape, dtype, seed):
    return jnp.asarray(np.random.default_rng(seed).standard_normal(shape), dtype)


def _bhsd_attention(q, k, v, causal=False, implementation=None):
    swap = lambda x: jnp.swapaxes(x, 1, 2)  # noqa: E731 - jax.nn wants [B, S, H, D]
    return swap(jax.nn.dot_product_attention(swap(q), swap(k), swap(v), is_causal=causal,
                                             implementation=implementation))


def _cudnn_attention(causal: bool) -> tuple[tuple[str, Callable], ...]:
    """cuDNN's fused attention (GPU, half types only; n/a elsewhere)."""
    return (("cuDNN", lambda q, k, v: _bhsd_attention(q, k, v, causal, "cudnn")),)


def _attention_jnp(q, k, v, causal=False):
    """Plain jnp attention that keeps the inputs' precision (jax.nn's softmax is float32)."""
    scores = jnp.einsum("bhqd,bhkd->bhqk", q, k) / jnp.sqrt(q.shape[-1]).astype(q.dtype)
    if causal:
        sq, skv = q.shape[2], k.shape[2]
        visible = jnp.arange(skv)[None, :] <= jnp.arange(sq)[:, None] + (skv - sq)
        scores = jnp.where(visible, scores, -jnp.inf)
    return jnp.einsum("bhqk,bhkd->bhqd", jax.nn.softmax(scores, axis=-1), v)


def fwd_bwd(op: Callable) -> Callable:
    """op's result and the gradients of |result|^2 / 2 for every input (one forward and
    one backward pass), flattened into one array so that `check` compares them all."""
    def fn(*args):
        y, vjp = jax.vjp(op, *args)
        return jnp.concatenate([y.ravel(), *(g.ravel() for g in vjp(y))])
    return fn


def _fwd_bwd_cases(b, heads, s, d) -> list[Case]:
    """Attention forward + backward against jax.nn.dot_product_attention's (XLA, cuDNN)."""
    def make(t):
        return tuple(_normal((b, heads, s, d), t, i) for i in range(3))

    flops = 3.5 * 4.0 * b * heads * s * s * d  # the backward is 5 products to the forward's 2
    return [
        Case(f"attention{' causal' * causal} fwd+bwd", f"B{b} H{heads} S{s} D{d}", make,
             fwd_bwd(lambda q, k, v, c=causal: oxijax.attention(q, k, v, causal=c)),
             fwd_bwd(lambda q, k, v, c=causal: _bhsd_attention(q, k, v, c)),
             flops=flops / (2 if causal else 1), bytes_moved=8 * b * heads * s * d,
             reference_fn=fwd_bwd(lambda q, k, v, c=causal: _attention_jnp(q, k, v, c)),
             baselines=(("cuDNN", fwd_bwd(lambda q, k, v, c=causal: _bhsd_attention(q, k, v, c, "cudnn"))),))
        for causal in (False, True)
    ]


def eager_cases() -> list[Case]:
    """Tiny ops called eagerly, where the time is Python and dispatch, not the kernel."""
    def tiny(*shapes):
        return lambda t: tuple(_normal(shape, t, i) for i, shape in enumerate(shapes))

    return [
        Case("eager exp", "8", tiny((8,)), oxijax.exp, jnp.exp, eager=True),
        Case("eager add", "8", tiny((8,), (8,)), oxijax.add, jnp.add, eager=True),
        Case("eager sum", "8", tiny((8,)), lambda x: oxijax.sum(x, 0), lambda x: jnp.sum(x, 0),
             eager=True),
        Case("eager matmul", "4x4", tiny((4, 4), (4, 4)), oxijax.matmul, jnp.matmul, eager=True),
    ]


def _highest(dtype) -> jax.lax.Precision | None:
    """XLA's precision matching oxijax's exact float32 kernels: on a GPU, XLA's default
    rounds float32 matmul and conv inputs to TF32 (the "gemm tf32" rows compare that)."""
    return jax.lax.Precision.HIGHEST if dtype == jnp.float32 else None


def _conv_xla(x, w, stride=(1, 1), padding=(1, 1)):
    return jax.lax.conv_general_dilated(x, w, stride, [(p, p) for p in padding],
                                        precision=_highest(x.dtype))


@dataclasses.dataclass(frozen=True)
class Sizes:
    elements: int               # unary / binary / reduce-all
    rows: int                   # rows x rows for broadcast binary and axis reductions
    gemm: tuple[int, ...]       # n for n^3 gemms
    conv: tuple[int, ...]       # batch, channels in, height, width, channels out (3x3 filter)
    attention: tuple[int, ...]  # batch, heads, sequence, head_dim
    # The training-step rows (bench only; see training_cases): attention as above, conv2d
    # as above with stride 1 and 2, padding 1. Empty: none at this size.
    train_attention: tuple[int, ...] = ()
    train_conv: tuple[int, ...] = ()


SIZES = {
    "small": Sizes(4099, 63, (67,), (2, 5, 11, 9, 7), (2, 3, 37, 16),  # `check`
                   (1, 2, 40, 16), (2, 4, 9, 9, 6)),
    # bench --quick; no training-step rows: on a CPU their XLA compiles alone take ~2-5 s each
    "quick": Sizes(1 << 20, 1024, (256,), (2, 32, 28, 28, 32), (1, 4, 256, 64)),
    "large": Sizes(1 << 24, 4096, (1024,), (8, 64, 56, 56, 64), (1, 8, 1024, 64),  # CPU bench
                   (1, 8, 1024, 64), (8, 64, 28, 28, 64)),
    # GPU bench: the sizes of the H200 goals (>= 2^26 elements, 4096^3 and 8192^3 gemms,
    # head_dim 128 at S = 4096); training steps of a long-context attention layer and of a
    # ResNet stage-3 convolution (N32 C256 28x28 K256).
    "gpu": Sizes(1 << 26, 8192, (4096, 8192), (32, 128, 56, 56, 128), (2, 16, 4096, 128),
                 (2, 16, 4096, 128), (32, 256, 28, 28, 256)),
}


def cases(size: str) -> list[Case]:
    """The cases at one of SIZES: "small" (correctness check), "quick", "large" (CPU bench),
    "gpu"."""
    sizes = SIZES[size]
    n_elem, rows = sizes.elements, sizes.rows
    conv, att = sizes.conv, sizes.attention

    gemm_n = sizes.gemm[0]

    def vec(dtype, count=1):
        return tuple(_normal((n_elem,), dtype, s) for s in range(count))

    n, c, h, w, k = conv
    b, heads, s, d = att
    conv_flops = 2.0 * n * k * h * w * c * 9
    att_flops = 4.0 * b * heads * s * s * d
    att_bytes = 4 * b * heads * s * d  # q, k, v in, out
    return [
        Case("unary relu", f"{n_elem}", vec, lambda x: oxijax.relu(x), jax.nn.relu, bytes_moved=2 * n_elem),
        Case("unary exp", f"{n_elem}", vec, lambda x: oxijax.exp(x), jnp.exp, bytes_moved=2 * n_elem),
        Case("unary tanh", f"{n_elem}", vec, lambda x: oxijax.tanh(x), jnp.tanh, bytes_moved=2 * n_elem),
        Case("binary add", f"{n_elem}", lambda t: vec(t, 2), oxijax.add, jnp.add, bytes_moved=3 * n_elem),
        Case("binary max (bcast)", f"{rows}x{rows} , {rows}",
             lambda t: (_normal((rows, rows), t, 0), _normal((rows,), t, 1)),
             oxijax.maximum, jnp.maximum, bytes_moved=2 * rows * rows),
        Case("reduce sum (all)", f"{n_elem}", vec, lambda x: oxijax.sum(x, 0), lambda x: jnp.sum(x, 0),
             bytes_moved=n_elem),
        Case("reduce sum axis 0", f"{rows}x{rows}", lambda t: (_normal((rows, rows), t, 0),),
             lambda x: oxijax.sum(x, 0), lambda x: jnp.sum(x, 0), bytes_moved=rows * rows),
        Case("reduce max axis 1", f"{rows}x{rows}", lambda t: (_normal((rows, rows), t, 0),),
             lambda x: oxijax.max(x, 1), lambda x: jnp.max(x, 1), bytes_moved=rows * rows),
        *(case for gemm_n in sizes.gemm for case in _gemm_cases(gemm_n)),
        Case("gemm T,N batched", f"8x{gemm_n // 4}^3",
             lambda t: (_normal((8, gemm_n // 4, gemm_n // 4), t, 0), _normal((8, gemm_n // 4, gemm_n // 4), t, 1)),
             lambda a, b: oxijax.gemm(a, b, trans_a="T"),
             lambda a, b: jnp.matmul(jnp.swapaxes(a, -1, -2), b, precision=_highest(a.dtype)),
             flops=2.0 * 8 * (gemm_n // 4) ** 3, bytes_moved=3 * 8 * (gemm_n // 4) ** 2),
        Case("conv2d 3x3 pad 1", f"{n}x{c}x{h}x{w} * {k}x{c}x3x3",
             lambda t: (_normal((n, c, h, w), t, 0), _normal((k, c, 3, 3), t, 1)),
             lambda x, wt: oxijax.conv2d(x, wt, padding=1), _conv_xla, flops=conv_flops,
             bytes_moved=n * c * h * w + k * c * 9 + n * k * h * w),
        Case("conv2d 3x3 fwd+bwd", f"{n}x{c}x{h}x{w} * {k}x{c}x3x3",
             lambda t: (_normal((n, c, h, w), t, 0), _normal((k, c, 3, 3), t, 1)),
             fwd_bwd(lambda x, wt: oxijax.conv2d(x, wt, padding=1)), fwd_bwd(_conv_xla),
             flops=3 * conv_flops, bytes_moved=3 * (n * c * h * w + k * c * 9 + n * k * h * w)),
        Case("attention", f"B{b} H{heads} S{s} D{d}",
             lambda t: tuple(_normal((b, heads, s, d), t, i) for i in range(3)),
             oxijax.attention, _bhsd_attention, flops=att_flops, bytes_moved=att_bytes,
             reference_fn=_attention_jnp,
             baselines=_cudnn_attention(False)),
        Case("attention causal", f"B{b} H{heads} S{s} D{d}",
             lambda t: tuple(_normal((b, heads, s, d), t, i) for i in range(3)),
             lambda q, k, v: oxijax.attention(q, k, v, causal=True),
             lambda q, k, v: _bhsd_attention(q, k, v, causal=True), flops=att_flops / 2,
             bytes_moved=att_bytes,
             reference_fn=lambda q, k, v: _attention_jnp(q, k, v, causal=True),
             baselines=_cudnn_attention(True)),
        *_fwd_bwd_cases(b, heads, s, d),
    ]


def _identity(x):
    return x


def _swap_bhsd(x):
    """[B, H, S, D] <-> [B, S, H, D] (oxijax.attention's layout <-> jax.nn's)."""
    return jnp.swapaxes(x, 1, 2)


@dataclasses.dataclass(frozen=True)
class Implementation:
    """One implementation of a training step's forward pass, in its own layout.

    ``to_native`` takes one array of the case (inputs and cotangent, in oxijax's layout)
    to this implementation's layout, ``from_native`` takes its output and gradients back;
    the benchmark applies both outside the timed function.
    """
    label: str
    forward: Callable
    to_native: Callable = _identity
    from_native: Callable = _identity


@dataclasses.dataclass(frozen=True)
class TrainingCase:
    """A training step of one layer, timed as ``jax.jit(training_step(forward))`` for
    oxijax and for every baseline; all implementations compute the same function."""
    op: str
    shape: str
    group: str                  # the benchmark prints one table per group
    dtypes: tuple[str, ...]     # the dtypes it runs in (when --dtype asks for them)
    make_args: Callable[[jnp.dtype], tuple]  # (inputs..., cotangent), oxijax's layout
    oxijax: Implementation
    baselines: tuple[Implementation, ...]  # the first is the row's "XLA" column
    flops: float = 0.0          # forward + backward, as Case.flops
    bytes_moved: float = 0.0    # inputs, cotangent, output and gradients, in elements


def training_step(forward: Callable) -> Callable:
    """``(*inputs, cotangent) -> ((loss, out), grads)``: ``jax.value_and_grad`` of
    ``loss = sum(out * cotangent)`` (accumulated in at least float32) with respect to every
    input, with the layer's output ``out`` as auxiliary result. The cotangent of ``out``
    is therefore exactly ``cotangent``, whatever the dtype, and every implementation
    must also materialise its forward output, as in a real training step."""
    def step(*args):
        *inputs, cotangent = args

        def loss(*xs):
            out = forward(*xs)
            acc = jnp.promote_types(out.dtype, jnp.float32)
            return jnp.sum(out.astype(acc) * cotangent.astype(acc)), out

        return jax.value_and_grad(loss, argnums=tuple(range(len(inputs))), has_aux=True)(*inputs)
    return step


def _conv_reference(stride: int):
    """lax.conv_general_dilated, 3x3, padding 1; float32 at precision HIGHEST (no TF32),
    like oxijax's exact float32 kernels."""
    def forward(x, w):
        return jax.lax.conv_general_dilated(x, w, (stride, stride), [(1, 1), (1, 1)],
                                            precision=_highest(x.dtype))
    return forward


def training_cases(size: str) -> list[TrainingCase]:
    """The training-step rows of the benchmark at ``size``: attention (bfloat16, causal and
    not) against jax.nn.dot_product_attention's "xla" and "cudnn" implementations, each in
    its native layout, and 3x3 conv2d (bfloat16 and float32, stride 1 and 2) against
    lax.conv_general_dilated, which XLA runs through cuDNN on a GPU."""
    sizes = SIZES[size]
    cases = []
    if sizes.train_attention:
        b, heads, s, d = sizes.train_attention

        def make_attention(t):
            return tuple(_normal((b, heads, s, d), t, i) for i in range(4))  # q, k, v, dout

        for causal in (False, True):
            flops = 3.5 * 4.0 * b * heads * s * s * d  # backward: 5 products to forward's 2
            cases.append(TrainingCase(
                f"attention{' causal' * causal} train step", f"B{b} H{heads} S{s} D{d}",
                "attention train step", ("bfloat16",), make_attention,
                Implementation("oxijax", lambda q, k, v, c=causal: oxijax.attention(q, k, v, causal=c)),
                tuple(Implementation(
                    label, lambda q, k, v, c=causal, i=impl: jax.nn.dot_product_attention(
                        q, k, v, is_causal=c, implementation=i), _swap_bhsd, _swap_bhsd)
                    for label, impl in (("XLA", "xla"), ("cuDNN", "cudnn"))),
                flops=flops / (2 if causal else 1), bytes_moved=8 * b * heads * s * d))
    if sizes.train_conv:
        n, c, h, w, k = sizes.train_conv
        label = "XLA (cuDNN)" if jax.default_backend() == "gpu" else "XLA"
        for stride in (1, 2):
            p, q = (h - 1) // stride + 1, (w - 1) // stride + 1

            def make_conv(t, p=p, q=q):
                return (_normal((n, c, h, w), t, 0), _normal((k, c, 3, 3), t, 1),
                        _normal((n, k, p, q), t, 2))

            cases.append(TrainingCase(
                f"conv2d 3x3{f' stride {stride}' * (stride > 1)} train step",
                f"{n}x{c}x{h}x{w} * {k}x{c}x3x3", "conv2d train step", ("bfloat16", "float32"),
                make_conv,
                Implementation("oxijax", lambda x, wt, s=stride: oxijax.conv2d(
                    x, wt, stride=s, padding=1)),
                (Implementation(label, _conv_reference(stride)),),
                flops=3 * 2.0 * n * k * p * q * c * 9,  # forward, data and filter gradients
                bytes_moved=2 * (n * c * h * w + k * c * 9 + n * k * p * q)))
    return cases


def _gemm_cases(n: int) -> list[Case]:
    """Like with like: exact float32 against HIGHEST, TF32 against XLA's GPU default."""
    def make(t):
        return _normal((n, n), t, 0), _normal((n, n), t, 1)

    return [
        Case("gemm", f"{n}^3", make, oxijax.matmul,
             lambda a, b: jnp.matmul(a, b, precision=jax.lax.Precision.HIGHEST), flops=2.0 * n**3,
             bytes_moved=3 * n * n),
        Case("gemm tf32", f"{n}^3", make, lambda a, b: oxijax.gemm(a, b, precision="tf32"),
             jnp.matmul, flops=2.0 * n**3, bytes_moved=3 * n * n, tolerance_factor=50.0),
    ]


def max_error(actual, expected) -> float:
    """Largest |difference| relative to the reference's magnitude (NaN if they disagree on NaN)."""
    a = np.asarray(jnp.asarray(actual, jnp.float64))
    e = np.asarray(jnp.asarray(expected, jnp.float64))
    if a.shape != e.shape or not np.array_equal(np.isnan(a), np.isnan(e)):
        return math.nan
    finite = np.isfinite(e)
    if not np.array_equal(a[~finite], e[~finite]):
        return math.inf
    scale = max(np.max(np.abs(e[finite]), initial=0.0), 1e-30)
    return float(np.max(np.abs(a[finite] - e[finite]), initial=0.0) / scale)
