"""Every CUDA kernel path, executed in the CUDA interpreter: each case runs one oxijax call
(or pointer-backend op) on small, awkward shapes, checks the result against a float64
reference, and checks that the kernel it is meant to reach is the one that ran. The last
test checks that the cases together reach every __global__ kernel in ffi/cuda."""

from __future__ import annotations

import pathlib
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import assert_close, f64, random, require_interpreter
from test_attention import reference as attention_reference

import oxijax

F16, BF16, F32, F64 = jnp.float16, jnp.bfloat16, jnp.float32, jnp.float64
STORAGE = {F16: "half", BF16: "bfloat16", F32: "float", F64: "double"}
CUDA_DIR = pathlib.Path(__file__).resolve().parents[1] / "ffi" / "cuda"


def _conv_ref(x, w, stride, pad):
    return jax.lax.conv_general_dilated(jnp.asarray(x, F64), jnp.asarray(w, F64), stride,
                                        [(pad[0], pad[0]), (pad[1], pad[1])])


# ---------------------------------------------------------------- cases
# Each case: (id, kernels it must launch (regexes on the demangled names), run) where
# run() returns [(actual, expected float64, dtype, assert_close kwargs), ...].

CASES: list[tuple[str, list[str], object]] = []


def case(case_id, *kernels):
    def register(run):
        CASES.append((case_id, list(kernels), run))
        return run
    return register


for dt in (F16, BF16, F32, F64):
    t = STORAGE[dt]

    @case(f"unary-{t}", rf"unary_kernel<{t}, .*Unary<")
    def _unary(dt=dt):
        x = random((1027,), dt, 1)
        return [(oxijax.exp(x), np.exp(f64(x)), dt, dict(scale=0.0, factor=2.0)),
                (oxijax.tanh(x[3:10]), np.tanh(f64(x[3:10])), dt, dict(scale=0.0, factor=2.0))]

    @case(f"binary-flat-{t}", rf"binary_flat_kernel<{t}, .*Binary<")
    def _binary(dt=dt):
        a, b = random((999,), dt, 1), random((999,), dt, 2, low=0.5)
        return [(oxijax.div(a, b), f64(a) / f64(b), dt, dict(scale=0.0, factor=2.0))]

    @case(f"binary-broadcast-{t}", rf"binary_general_kernel<{t}, .*Binary<")
    def _broadcast(dt=dt):
        a, b = random((3, 1, 37), dt, 1), random((5, 1), dt, 2)
        return [(oxijax.maximum(a, b), np.maximum(f64(a), f64(b)), dt, dict(scale=0.0))]

    @case(f"unary-grad-{t}", rf"binary_flat_kernel<{t}, .*UnaryGrad<")
    def _unary_grad(dt=dt):
        x = random((301,), dt, 3)
        g = jax.grad(lambda x: oxijax.sigmoid(x).astype(F32).sum())(x)
        s = 1 / (1 + np.exp(-f64(x)))
        return [(g, s * (1 - s), dt, dict(factor=4.0))]

    @case(f"binary-partial-{t}", rf"binary_general_kernel<{t}, .*BinaryPartial<")
    def _partial(dt=dt):
        a, b = random((4, 9), dt, 1), random((9,), dt, 2)
        g = jax.grad(lambda a: oxijax.maximum(a, b).astype(F32).sum())(a)
        return [(g, (f64(a) >= f64(b)).astype(np.float64), dt, dict(scale=0.0))]

    @case(f"reduce-rows-{t}", rf"row_group_kernel<{t}, {t}, ")
    def _rows(dt=dt):
        x = random((33, 129), dt, 4)
        return [(oxijax.max(x, 1), f64(x).max(1), dt, dict(scale=0.0)),
                (oxijax.sum(x, 1), f64(x).sum(1), dt, dict(scale=2.0 * np.sqrt(129)))]

    @case(f"reduce-split-rows-{t}", rf"row_chunk_kernel<{t}, ", rf"row_group_kernel<")
    def _split_rows(dt=dt):
        x = random((2, 70001), dt, 5)
        return [(oxijax.sum(x, 1), f64(x).sum(1), dt, dict(scale=2.0 * np.sqrt(70001)))]

    @case(f"reduce-columns-{t}", rf"col_kernel<{t}, {t}, ")
    def _cols(dt=dt):
        x = random((301, 5, 24), dt, 6)
        y = random((19, 3), dt, 7)
        return [(oxijax.mean(x, 1), f64(x).mean(1), dt, dict(scale=2.0)),
                (oxijax.min(y, 0), f64(y).min(0), dt, dict(scale=0.0))]

# gemm: every tensor-core configuration (and exact float32 SIMT) x transposes, ragged
# tiles, odd leading dims (narrow and synchronous copies), batches that broadcast.
GEMM_KERNEL = {F16: r"mma_gemm_kernel<MmaConfig<\(Kind\)0>", BF16: r"mma_gemm_kernel<MmaConfig<\(Kind\)1>",
               F32: r"sgemm_simt_kernel<", F64: r"mma_gemm_kernel<MmaConfig<\(Kind\)3>"}
for dt in (F16, BF16, F32, F64):
    for trans in ("NN", "NT", "TN", "TT"):
        @case(f"gemm-{STORAGE[dt]}-{trans}", GEMM_KERNEL[dt])
        def _gemm(dt=dt, trans=trans):
            m, n, k = 17, 33, 65
            a = random((k, m) if trans[0] == "T" else (m, k), dt, 1)
            b = random((n, k) if trans[1] == "T" else (k, n), dt, 2)
            c = random((m, n), dt, 3)
            out = oxijax.gemm(a, b, c, trans_a=trans[0], trans_b=trans[1], alpha=0.5, beta=-1.5)
            fa = f64(a).T if trans[0] == "T" else f64(a)
            fb = f64(b).T if trans[1] == "T" else f64(b)
            return [(out, 0.5 * fa @ fb - 1.5 * f64(c), dt, dict(scale=2.0 * k))]

    @case(f"gemm-batched-{STORAGE[dt]}", GEMM_KERNEL[dt])
    def _batched(dt=dt):
        a, b = random((3, 1, 130, 7), dt, 4), random((2, 7, 129), dt, 5)  # odd k: narrow copies
        return [(oxijax.matmul(a, b), f64(a) @ f64(b), dt, dict(scale=2.0 * 7))]


@case("gemm-tf32", r"mma_gemm_kernel<MmaConfig<\(Kind\)2>, false, true>")
def _tf32():
    a, b = random((40, 23), F32, 1), random((9, 23), F32, 2)
    out = oxijax.gemm(a, b, trans_b="T", precision="tf32")
    return [(out, f64(a) @ f64(b).T, F32, dict(scale=2.0 * 23, factor=300.0))]


# Split-K: few output tiles, long k (a weight gradient's shape); the splits are summed in
# a fixed order by split_sum_kernel.
for dt, precision in ((F16, "highest"), (BF16, "highest"), (F32, "highest"), (F32, "tf32"), (F64, "highest")):
    kernel = GEMM_KERNEL[dt] if precision == "highest" else r"mma_gemm_kernel<MmaConfig<\(Kind\)2>"

    @case(f"gemm-split-k-{STORAGE[dt]}-{precision}", kernel, rf"split_sum_kernel<{STORAGE[dt]}>")
    def _split_k(dt=dt, precision=precision):
        m, n, k = 19, 37, 1500
        a, b, c = random((k, m), dt, 1), random((k, n), dt, 2), random((m, n), dt, 3)
        out = oxijax.gemm(a, b, c, trans_a="T", alpha=0.5, beta=-1.5, precision=precision)
        factor = 300.0 if precision == "tf32" else 1.0
        return [(out, 0.5 * f64(a).T @ f64(b) - 1.5 * f64(c), dt, dict(scale=2.0 * k, factor=factor))]


CONV_KERNEL = {F16: r"conv2d_tc_kernel<false>", BF16: r"conv2d_tc_kernel<true>",
               F32: r"conv2d_simt_kernel<SimtConfig<float", F64: r"conv2d_simt_kernel<SimtConfig<double"}
for dt in (F16, BF16, F32, F64):
    t = STORAGE[dt]

    @case(f"conv2d-{t}", CONV_KERNEL[dt])
    def _conv(dt=dt):
        x, w = random((2, 5, 9, 11), dt, 1), random((6, 5, 3, 2), dt, 2)
        out = oxijax.conv2d(x, w, stride=(2, 1), padding=(1, 2))
        return [(out, _conv_ref(x, w, (2, 1), (1, 2)), dt, dict(scale=2.0 * 30))]

    @case(f"conv2d-data-grad-stride1-{t}", r"flip_filter_kernel<", CONV_KERNEL[dt])
    def _data1(dt=dt):
        x, w = random((2, 3, 7, 6), dt, 1), random((4, 3, 3, 3), dt, 2)
        g = jax.grad(lambda x: oxijax.conv2d(x, w, padding=1).astype(F32).sum())(x)
        ref = jax.grad(lambda x: _conv_ref(x, w, (1, 1), (1, 1)).sum())(jnp.asarray(f64(x)))
        return [(g, ref, dt, dict(scale=2.0 * 36))]

    igemm = (rf"igemm_tc_kernel<{'true' if dt == BF16 else 'false'}, " if dt in (F16, BF16)
             else rf"igemm_kernel<{t}, ")

    @case(f"conv2d-grads-stride2-{t}", igemm + "DataProblem", igemm + "FilterProblem")
    def _grads2(dt=dt):
        x, w = random((2, 3, 9, 8), dt, 1), random((4, 3, 3, 2), dt, 2)
        f = lambda x, w: oxijax.conv2d(x, w, stride=2, padding=(1, 0)).astype(F32).sum()  # noqa: E731
        gx, gw = jax.grad(f, (0, 1))(x, w)
        rx, rw = jax.grad(lambda x, w: _conv_ref(x, w, (2, 2), (1, 0)).sum(), (0, 1))(
            jnp.asarray(f64(x)), jnp.asarray(f64(w)))
        return [(gx, rx, dt, dict(scale=2.0 * 24)), (gw, rw, dt, dict(scale=2.0 * 40))]


for dt, kernel in ((F32, r"igemm_kernel<float, FilterProblem"),
                   (BF16, r"igemm_tc_kernel<true, FilterProblem")):
    @case(f"conv2d-filter-grad-split-{STORAGE[dt]}", kernel, rf"sum_splits_kernel<{STORAGE[dt]}>")
    def _split_filter(dt=dt):
        x, w = random((1, 1, 150, 150), dt, 1), random((2, 1, 3, 3), dt, 2)
        g = jax.grad(lambda w: oxijax.conv2d(x, w).astype(F32).sum())(w)
        ref = jax.grad(lambda w: _conv_ref(x, w, (1, 1), (0, 0)).sum())(jnp.asarray(f64(w)))
        return [(g, ref, dt, dict(scale=2.0 * 150))]


def _attention_case(dt, d, causal, sq=70, skv=50, precision="highest", factor=2.0):
    def run():
        q, k, v = random((1, 2, sq, d), dt, 1), random((1, 2, skv, d), dt, 2), random((1, 2, skv, d), dt, 3)
        scale = 1.0 / np.sqrt(d)
        out = oxijax.attention(q, k, v, causal=causal, precision=precision)
        return [(out, attention_reference(q, k, v, scale, causal), dt, dict(factor=factor))]
    return run


MMA_INPUT = {F16: 0, BF16: 1, F32: 2}  # mma_tile::MmaInput (float32: TF32)
# Every padded head dim (16-bit units): 64, 128, 192, 256; real head dims below them.
# Head dims that are not multiples of 8 (3, 33, 255) copy element by element.
for dt, d, padded in ((F16, 64, 64), (BF16, 128, 128), (F16, 128, 128), (BF16, 64, 64),
                      (F16, 40, 64), (BF16, 80, 128), (F16, 160, 192), (BF16, 200, 256),
                      (F16, 256, 256), (BF16, 3, 64), (F16, 33, 64), (BF16, 255, 256)):
    for causal in (False, True):
        c = "causal" if causal else "full"
        case(f"attention-mma-{STORAGE[dt]}-d{d}-{c}",
             rf"attention_mma_kernel<\(MmaInput\){MMA_INPUT[dt]}, {padded}>")(
            _attention_case(dt, d, causal))
# TF32 (opt-in): float32 head dims up to 128 = 256 16-bit units.
for d, padded in ((20, 64), (5, 64), (64, 128), (72, 192), (127, 256)):
    case(f"attention-tf32-d{d}", rf"attention_mma_kernel<\(MmaInput\)2, {padded}>")(
        _attention_case(F32, d, True, precision="tf32", factor=300.0))
for dt, d in ((F32, 16), (F64, 200), (BF16, 264), (F32, 130)):
    case(f"attention-simt-{STORAGE[dt]}-d{d}", rf"attention_simt_kernel<{STORAGE[dt]}>")(
        _attention_case(dt, d, True, sq=40, skv=25))  # Sq > Skv: fully masked rows


def _attention_grad_case(dt, d, sq, skv):
    def run():
        q, k, v = random((1, 2, sq, d), dt, 1), random((1, 2, skv, d), dt, 2), random((1, 2, skv, d), dt, 3)
        acc = F64 if dt == F64 else F32
        ours = jax.grad(lambda q, k, v: jnp.sum(oxijax.attention(q, k, v, causal=True).astype(acc) ** 2),
                        (0, 1, 2))(q, k, v)

        def ref(q, k, v):
            s = jnp.einsum("bhqd,bhkd->bhqk", q, k) / np.sqrt(d)
            vis = jnp.arange(skv)[None, :] <= jnp.arange(sq)[:, None] + (skv - sq)
            s = jnp.where(vis, s, -jnp.inf)
            p = jnp.where(vis, jax.nn.softmax(jnp.where(vis, s, -1e300), -1), 0.0)
            return jnp.sum(jnp.einsum("bhqk,bhkd->bhqd", p, v) ** 2)

        refs = jax.grad(ref, (0, 1, 2))(*(jnp.asarray(f64(a)) for a in (q, k, v)))
        return [(o, r, dt, dict(factor=8.0)) for o, r in zip(ours, refs)]
    return run


def _grad_kernels(t):
    return rf"delta_kernel<{t}>", rf"dkdv_kernel<{t}>", rf"dq_kernel<{t}>"


# Half types at head_dim 264, which the tensor-core backward (up to 256) leaves to SIMT.
# Sq > Skv: causal rows that see no key.
for dt, d in ((F16, 264), (BF16, 264), (F32, 64), (F64, 64)):
    case(f"attention-grad-{STORAGE[dt]}", *_grad_kernels(STORAGE[dt]))(
        _attention_grad_case(dt, d, sq=30, skv=20))
# Tiles of 32 keys and queries, ragged in both: several of each, Sq < Skv.
case("attention-grad-float-tile32", *_grad_kernels("float"))(
    _attention_grad_case(F32, 64, sq=77, skv=101))
# Tensor cores: every padded head dim; above 128 the output columns split in halves.
# Sq > Skv: rows that see no key; Sq < Skv: several key blocks per query block.
for dt, d, padded, sq, skv in ((F16, 64, 64, 30, 20), (BF16, 128, 128, 70, 50),
                               (F16, 40, 64, 45, 130), (BF16, 160, 192, 30, 20),
                               (F16, 200, 256, 20, 70), (BF16, 33, 64, 30, 40),
                               (F16, 255, 256, 20, 30)):
    t, bf = STORAGE[dt], "true" if dt == BF16 else "false"
    case(f"attention-grad-mma-{t}-d{d}", rf"delta_kernel<{t}>", rf"dkdv_mma_kernel<{bf}, {padded}>",
         rf"dq_mma_kernel<{bf}, {padded}>")(_attention_grad_case(dt, d, sq=sq, skv=skv))

for dt in (F16, BF16, F32, F64):
    t = STORAGE[dt]

    @case(f"attention-jvp-{t}", rf"jvp_kernel<{t}>")
    def _attention_jvp(dt=dt):
        q, k, v = random((1, 1, 24, 32), dt, 1), random((1, 1, 24, 32), dt, 2), random((1, 1, 24, 32), dt, 3)
        tq = random((1, 1, 24, 32), dt, 4)
        _, ours = jax.jvp(lambda q: oxijax.attention(q, k, v), (q,), (tq,))
        ref = jax.jvp(lambda q: attention_reference_jnp(q, jnp.asarray(f64(k)), jnp.asarray(f64(v))),
                      (jnp.asarray(f64(q)),), (jnp.asarray(f64(tq)),))[1]
        return [(ours, ref, dt, dict(factor=8.0))]


def attention_reference_jnp(q, k, v):
    s = jnp.einsum("bhqd,bhkd->bhqk", q, k) / np.sqrt(q.shape[-1])
    return jnp.einsum("bhqk,bhkd->bhqd", jax.nn.softmax(s, -1), v)


def _short(name: str) -> str:
    """A demangled kernel name without its namespaces."""
    return re.sub(r"oxijax::|cuda::|mma_tile::|\(anonymous namespace\)::", "", name)


@pytest.mark.parametrize("case_id,kernels,run", CASES, ids=[c[0] for c in CASES])
def test_kernel_path(interpreter, case_id, kernels, run):
    # The cases take the thread orders in turn: a missing barrier shows under some order.
    number = [c[0] for c in CASES].index(case_id)
    interpreter.set_schedule(("forward", "reverse", "shuffle")[number % 3], number)
    interpreter.take_launched_kernels()
    results = run()
    launched = [_short(name) for name in interpreter.take_launched_kernels()]
    for actual, expected, dtype, kwargs in results:
        assert_close(actual, expected, dtype, **kwargs)
    for pattern in kernels:
        assert any(re.search(pattern, name) for name in launched), (pattern, launched)
    assert interpreter.take_reports() == []


# ---------------------------------------------------------------- direct FFI calls
# Paths the jax functions never take (they answer without a kernel) but an FFI call can:
# a gemm with k = 0 (out = beta * c) and a reduce over an empty axis (the identity).


def test_ffi_only_kernels(interpreter):
    c = random((3, 4), F32, 1)
    gemm = jax.ffi.ffi_call("oxijax_interp_gemm", jax.ShapeDtypeStruct((3, 4), F32))
    out = gemm(jnp.zeros((3, 0), F32), jnp.zeros((0, 4), F32), c, trans_a=np.int32(0),
               trans_b=np.int32(0), alpha=np.float64(1.0), beta=np.float64(2.0), allow_tf32=False)
    np.testing.assert_array_equal(f64(out), 2 * f64(c))
    reduce = jax.ffi.ffi_call("oxijax_interp_reduce", jax.ShapeDtypeStruct((3,), F32))
    sums = reduce(jnp.zeros((3, 0), F32), op=np.int32(0), axis=np.int64(1))  # sum: zeros
    np.testing.assert_array_equal(f64(sums), np.zeros(3))
    launched = " ".join(_short(name) for name in interpreter.take_launched_kernels())
    assert "scale_c_kernel<float>" in launched and "fill_kernel<float>" in launched, launched


def test_cases_reach_every_kernel():
    """Every __global__ kernel of ffi/cuda is some case's expected kernel (static)."""
    kernels = set()
    for source in CUDA_DIR.glob("*.cu"):
        text = re.sub(r"__launch_bounds__\([^)]*\)", "", source.read_text())
        kernels |= set(re.findall(r"__global__[^(]*?\b(\w+)\s*\(", text))
    expected = " ".join(p for _, patterns, _ in CASES for p in patterns)
    expected += " scale_c_kernel fill_kernel"  # test_ffi_only_kernels
    expected += " ptx_probe_kernel"  # test_ptx_probe.py
    missing = sorted(k for k in kernels if k not in expected)
    assert len(kernels) >= 20 and not missing, missing
