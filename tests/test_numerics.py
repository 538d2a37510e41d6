"""Numerics at the edges: float16 overflow to inf, huge and tiny magnitudes, denormals,
all-equal softmax rows, and long float16 / bfloat16 reductions.

References are computed in float64 with NumPy and rounded once to the dtype.

Subnormals: the kernels compute in the floating-point environment of the thread that
runs them. Inside JAX that is XLA's, which flushes subnormal float32 / float64 inputs
and results to zero (FTZ/DAZ), exactly as jnp's own ops do on the CPU; the pointer
backend's threads keep IEEE subnormals. float16 subnormals are normal in the float32
arithmetic of the float16 kernels, so they are always kept. Where a value is subnormal
in the arithmetic's type, the tests accept the IEEE result or the flushed one.
jnp differs from the IEEE result beyond flushing in two places, both left as they are:
it divides by multiplying with the reciprocal (``1e30 / 3e38`` gives 0 in float32,
``0 / 6e-8`` NaN in float16) and it evaluates float16 ``sigmoid(-12)`` as 0 (the true
value, 6.1e-6, is a float16 subnormal, which oxijax returns)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import DTYPE_IDS, DTYPES, TOLERANCE

import oxijax


def as_f64(x) -> np.ndarray:
    return np.asarray(x).astype(np.float64)


def rounded(values, dtype) -> np.ndarray:
    """A float64 reference rounded once to dtype (and back to float64 for comparing);
    values beyond the dtype's range become infinities, as intended."""
    with np.errstate(over="ignore"):
        return np.asarray(values, np.float64).astype(np.dtype(dtype)).astype(np.float64)


def assert_matches(actual, reference, dtype, rtol=None, scale=0.0):
    """actual equals one of the references (float64; several when flushing subnormals
    may change the result) rounded to dtype, elementwise: within rtol of |reference| +
    scale, or one subnormal step; NaN and infinities (with sign) exactly."""
    got = as_f64(actual)
    references = reference if isinstance(reference, list) else [reference]
    rtol = TOLERANCE[np.dtype(dtype)] if rtol is None else rtol
    tiny = float(jnp.finfo(dtype).smallest_subnormal)
    ok = np.zeros(got.shape, bool)
    for ref in references:
        want = np.broadcast_to(rounded(ref, dtype), got.shape)
        with np.errstate(invalid="ignore"):
            close = np.abs(got - want) <= rtol * (np.abs(want) + scale) + tiny
        # A subnormal where the flushed arithmetic has a zero (or the reverse) is the
        # same value to that arithmetic (max(0, -1e-40) may return either operand).
        same_flushed = flushed(got, dtype) == flushed(want, dtype)
        ok |= (np.isnan(got) & np.isnan(want)) | (got == want) | close | same_flushed
    bad = np.argwhere(~ok)
    assert bad.size == 0, (f"{len(bad)} mismatches, first at {tuple(bad[0])}: got "
                           f"{got[tuple(bad[0])]!r}, references "
                           f"{[np.broadcast_to(r, got.shape)[tuple(bad[0])] for r in references]}")


def arithmetic_type(dtype):
    return np.float64 if dtype == jnp.float64 else np.float32


def flushed(values, dtype) -> np.ndarray:
    """values with the subnormals of dtype's arithmetic type replaced by (signed) zeros."""
    values = np.asarray(values, np.float64)
    tiny = float(np.finfo(arithmetic_type(dtype)).tiny)
    with np.errstate(invalid="ignore"):  # inf * 0 in the branch np.where discards
        return np.where(np.abs(values) < tiny, values * 0.0, values)


def ieee_or_flushed(f, dtype, *args) -> list:
    """f's float64 result on args, and the results where subnormal inputs and/or results
    are flushed to zero: any of them is a correct result (see the module docstring)."""
    with np.errstate(all="ignore"):
        exact, daz = f(*args), f(*(flushed(a, dtype) for a in args))
    return [exact, daz, flushed(exact, dtype), flushed(daz, dtype)]


def edge_values(dtype) -> np.ndarray:
    """Zeros, subnormals, the smallest normal, 1e-30 and 1e30, overflowing exponents,
    the largest finite value, infinities and NaN (as float64, then rounded to dtype)."""
    info = jnp.finfo(dtype)
    sub, tiny, big = float(info.smallest_subnormal), float(info.tiny), float(info.max)
    values = [0.0, 1.0, 0.5, sub, 3 * sub, tiny / 2, tiny, 1e-30, 1e30, 12.0, 89.0, 710.0,
              big, np.inf, np.nan]
    return rounded(values + [-v for v in values], dtype)


UNARY_REFERENCE = {
    "relu": lambda x: np.maximum(x, 0.0),
    "sigmoid": lambda x: 1.0 / (1.0 + np.exp(-x)),
    "tanh": np.tanh,
    "exp": np.exp,
    "log": np.log,
    "sqrt": np.sqrt,
    "abs": np.abs,
    "neg": np.negative,
}
BINARY_REFERENCE = {"add": np.add, "sub": np.subtract, "mul": np.multiply,
                    "div": np.divide, "max": np.maximum, "min": np.minimum}


def host(values, dtype) -> jax.Array:
    return jnp.asarray(np.asarray(values).astype(np.dtype(dtype)))


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("op", list(UNARY_REFERENCE))
def test_unary_at_the_edges(op, dtype):
    x = edge_values(dtype)
    reference = ieee_or_flushed(UNARY_REFERENCE[op], dtype, x)
    got = oxijax.unary(host(x, dtype), op)
    assert_matches(got, reference, dtype)
    if op in ("relu", "abs", "sqrt", "exp", "sigmoid"):  # never negative (regression:
        assert not np.any(as_f64(got) < 0)                # relu(-1e-40) was -1e-40)


# The CPU kernels' float32 vector polynomials (ffi/cpu/vector_math.h) at their stated
# accuracy, in ulp of the float32 result: (op, reference, inputs kept, bound). Measured
# on every 61st float32 (70 M values): exp 1.01, log 0.80, sigmoid 1.81, tanh 2.37.
ULP_BOUNDS = [
    ("exp", np.exp, lambda x: np.abs(x) < 88.0, 1.02),
    ("log", np.log, lambda x: x > 0, 1.02),
    ("sigmoid", lambda x: 1.0 / (1.0 + np.exp(-x)), lambda x: np.abs(x) < 1e30, 1.9),
    ("tanh", np.tanh, lambda x: np.abs(x) < 1e30, 2.4),
]


@pytest.mark.parametrize("op,reference,keep,bound", ULP_BOUNDS, ids=[b[0] for b in ULP_BOUNDS])
def test_float32_transcendentals_within_their_ulp_bounds(op, reference, keep, bound):
    # Every 997th float32 bit pattern from the smallest normal up, both signs (4.3 M
    # values); subnormal inputs and results are left out (XLA's threads flush them).
    x = np.arange(0x00800000, 0x7f800000, 997, dtype=np.uint32).view(np.float32)
    x = np.concatenate([x, -x])
    x = x[keep(x.astype(np.float64))]
    cpu = jax.devices("cpu")[0]
    got = as_f64(oxijax.unary(jax.device_put(x, cpu), op))
    with np.errstate(over="ignore"):
        want = reference(x.astype(np.float64))
    normal = np.abs(want) >= 2.0**-126
    ulp = np.spacing(np.abs(want[normal]).astype(np.float32)).astype(np.float64)
    errors = np.abs(got[normal] - want[normal]) / ulp
    worst = int(np.argmax(errors))
    assert errors[worst] <= bound, (f"{op}({x[normal][worst]!r}) is off by {errors[worst]:.3f} ulp "
                                    f"(bound {bound})")


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("op", list(BINARY_REFERENCE))
def test_binary_at_the_edges(op, dtype):
    x = edge_values(dtype)
    a, b = x[:, None], x[None, :]  # every pair, through broadcasting
    reference = ieee_or_flushed(BINARY_REFERENCE[op], dtype, a, b)
    assert_matches(oxijax.binary(host(a, dtype), host(b, dtype), op), reference, dtype)


def test_float16_overflow_matches_jnp():
    f16 = jnp.float16
    x = jnp.asarray([11.0, 12.0, -12.0, 65504.0], f16)
    np.testing.assert_array_equal(oxijax.unary(x, "exp"), jnp.exp(x))  # exp(12) = inf
    big = jnp.asarray([65504.0, -65504.0, 300.0, 255.0], f16)
    for op, ref in (("add", jnp.add), ("sub", jnp.subtract), ("mul", jnp.multiply)):
        np.testing.assert_array_equal(oxijax.binary(big, big, op), ref(big, big))
    np.testing.assert_array_equal(oxijax.binary(big, jnp.flip(big), "sub"),
                                  jnp.flip(big) * -1 + big)
    # Sums accumulate in float32, so only a result beyond 65504 overflows: as jnp.
    rows = jnp.asarray([[65504.0, 65504.0, 0.0], [65504.0, 65504.0, -65504.0],
                        [-65504.0, -65504.0, 1.0]], f16)
    np.testing.assert_array_equal(oxijax.reduce(rows, "sum", 1), jnp.sum(rows, 1))
    np.testing.assert_array_equal(oxijax.reduce(rows, "sum", 1), [np.inf, 65504.0, -np.inf])
    np.testing.assert_array_equal(oxijax.reduce(rows, "mean", 1), jnp.mean(rows, 1))
    a = jnp.asarray([[300.0, 300.0], [1.0, -1.0]], f16)
    np.testing.assert_array_equal(oxijax.gemm(a, a.T), jnp.matmul(a, a.T))  # 180000 -> inf
    np.testing.assert_array_equal(oxijax.gemm(a, a.T)[0], [np.inf, 0.0])


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
def test_max_min_of_infinities_match_jnp(dtype):
    x = host([[np.inf, 1.0, -2.0], [-np.inf, -np.inf, -np.inf], [np.inf, -np.inf, 0.0],
              [3.0, np.inf, np.inf]], dtype)
    for op, ref in (("max", jnp.max), ("min", jnp.min), ("sum", jnp.sum)):
        for axis in (0, 1):
            np.testing.assert_array_equal(as_f64(oxijax.reduce(x, op, axis)),
                                          as_f64(ref(x, axis=axis)))


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
def test_reduce_at_the_edges(dtype):
    x = edge_values(dtype)
    # Sums of values that cannot overflow the float32 (float64) accumulator
    finite = x[np.abs(x) < np.finfo(arithmetic_type(dtype)).max / 64]
    rtol = TOLERANCE[np.dtype(dtype)]
    unit = np.finfo(arithmetic_type(dtype)).eps / 2  # the accumulator's rounding unit
    for values in (finite, x[np.abs(x) < 1e-20], np.abs(finite), -np.abs(finite)):
        rows = host(values[None, :], dtype)
        # A sum in any order errs by up to n * unit * sum|x|: where 1e30 and -1e30
        # cancel, the small terms added to either are lost in one order, kept in another.
        sum_scale = len(values) * unit * float(np.sum(np.abs(values))) / rtol
        with np.errstate(all="ignore"):
            for op, ref, scale in (("sum", np.sum, sum_scale),
                                   ("mean", np.mean, sum_scale / len(values)),
                                   ("max", np.max, 0.0), ("min", np.min, 0.0)):
                assert_matches(oxijax.reduce(rows, op, 1), ref(values[None, :], axis=1), dtype,
                               scale=scale)


def subnormal_matrix(dtype, shape, seed):
    """Values of a few subnormal steps (exact in every dtype), signs mixed."""
    rng = np.random.default_rng(seed)
    steps = rng.integers(-8, 9, size=shape)
    return steps * float(jnp.finfo(dtype).smallest_subnormal)


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
def test_denormals_through_gemm_conv_and_attention(dtype):
    sub = subnormal_matrix(dtype, (5, 7), 0)
    ones = np.random.default_rng(1).integers(-2, 3, size=(7, 3)).astype(np.float64)
    matmul = np.matmul
    # Subnormal products of subnormals and small integers, exact sums of them.
    assert_matches(oxijax.gemm(host(sub, dtype), host(ones, dtype)),
                   ieee_or_flushed(matmul, dtype, sub, ones), dtype, rtol=0)
    # Subnormal results of normal inputs: x * 2^-k.
    scale = float(jnp.finfo(dtype).tiny) / 4
    a = rounded(np.random.default_rng(2).integers(-3, 4, size=(4, 6)), dtype)
    b = rounded(np.eye(6) * scale, dtype)
    assert_matches(oxijax.gemm(host(a, dtype), host(b, dtype)),
                   ieee_or_flushed(matmul, dtype, a, b), dtype, rtol=0)
    # conv2d of a subnormal image with a small integer filter.
    x = subnormal_matrix(dtype, (1, 2, 5, 5), 3)
    w = np.random.default_rng(4).integers(-1, 2, size=(3, 2, 2, 2)).astype(np.float64)
    assert_matches(oxijax.conv2d(host(x, dtype), host(w, dtype)),
                   ieee_or_flushed(conv_reference, dtype, x, w), dtype, rtol=0)
    # Attention with subnormal values: the softmax weights are normal, the result a
    # (rounded) weighted average of subnormals.
    q = np.random.default_rng(5).standard_normal((1, 1, 4, 8))
    v = subnormal_matrix(dtype, (1, 1, 6, 8), 6)
    k = np.random.default_rng(7).standard_normal((1, 1, 6, 8))
    q, k = rounded(q, dtype), rounded(k, dtype)
    got = oxijax.attention(host(q, dtype), host(k, dtype), host(v, dtype))
    assert_matches(got, ieee_or_flushed(lambda v: attention_reference(q, k, v), dtype, v), dtype,
                   rtol=TOLERANCE[np.dtype(dtype)] * 4)


def conv_reference(x, w):
    """Valid cross-correlation, NCHW with KCRS, in float64."""
    r, s = w.shape[2:]
    windows = np.lib.stride_tricks.sliding_window_view(x, (r, s), axis=(2, 3))
    return np.einsum("ncpqrs,kcrs->nkpq", windows, w)


def attention_reference(q, k, v, scale=None, causal=False):
    scale = 1.0 / np.sqrt(q.shape[-1]) if scale is None else scale
    s = np.einsum("bhqd,bhkd->bhqk", q, k) * scale
    if causal:
        sq, skv = s.shape[-2:]
        s = np.where(np.arange(skv)[None, :] <= np.arange(sq)[:, None] + (skv - sq), s, -np.inf)
    p = np.exp(s - s.max(-1, keepdims=True))
    return np.einsum("bhqk,bhkd->bhqd", p / p.sum(-1, keepdims=True), v)


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
def test_all_equal_softmax_rows_average_exactly(dtype):
    # q = 0 (or identical keys): every score is equal and the weights are exactly 1/Skv;
    # with integer values and Skv a power of two the average is exact in every dtype.
    rng = np.random.default_rng(8)
    v = rng.integers(-16, 17, size=(2, 3, 16, 8)).astype(np.float64)
    k = np.broadcast_to(rng.standard_normal((1, 1, 1, 8)), v.shape)
    for q in (np.zeros((2, 3, 5, 8)), rng.standard_normal((2, 3, 5, 8))):
        keys = k if q.any() else rng.standard_normal(v.shape)
        got = oxijax.attention(host(q, dtype), host(keys, dtype), host(v, dtype))
        want = np.broadcast_to(v.mean(axis=2, keepdims=True), q.shape)
        np.testing.assert_array_equal(as_f64(got), rounded(want, dtype))


def fused_along_k(a, b):
    """float32 a @ b as one fused multiply-add per k, in order: each product is exact in
    float64, and the sum rounds to float32 (the double rounding cannot matter for the
    overflowing sums this models)."""
    a64, b64 = as_f64(a), as_f64(b)
    acc = np.zeros((a64.shape[0], b64.shape[1]), np.float32)
    with np.errstate(over="ignore", invalid="ignore"):
        for k in range(a64.shape[1]):
            acc = (a64[:, k:k + 1] * b64[k:k + 1, :] + acc).astype(np.float32)
    return acc


@pytest.mark.parametrize("dtype", [jnp.float16, jnp.float32], ids=["f16", "f32"])
def test_huge_and_tiny_magnitudes_in_gemm_and_attention(dtype):
    big = 65504.0 if dtype == jnp.float16 else 1e30
    small = 1.0 / 1024 if dtype == jnp.float16 else 1e-30
    rng = np.random.default_rng(9)
    signs = rng.choice([-1.0, 1.0], size=(3, 4))
    # big * small products are moderate; big * big overflows to inf like jnp.
    a, b = host(signs * big, dtype), host(signs.T * small, dtype)
    terms = np.abs(as_f64(a)) @ np.abs(as_f64(b))  # errors are relative to these
    assert_matches(oxijax.gemm(a, b), as_f64(a) @ as_f64(b), dtype, scale=terms)
    # big * big overflows. With fused multiply-adds along k (the CUDA kernels and every
    # CPU kernel level but x86-64's baseline) an inf sum absorbs a later exact, finite
    # product of the other sign; unfused, every product rounds to +-inf first and mixed
    # signs make NaN. (A library's result depends on its order: XLA:CPU's matches the
    # fused one, cuBLAS's tree makes NaN.)
    on_cpu = jax.default_backend() == "cpu"
    if dtype == jnp.float32 and on_cpu and oxijax.BUILD_INFO["cpu_isa"] == "baseline":
        products = np.asarray(a)[:, None, :] * np.asarray(a)[None, :, :]  # float32, rounded
        np.testing.assert_array_equal(oxijax.gemm(a, a.T), products.sum(axis=-1))
    elif dtype == jnp.float32:
        np.testing.assert_array_equal(oxijax.gemm(a, a.T), fused_along_k(a, a.T))
    else:
        np.testing.assert_array_equal(oxijax.gemm(a, a.T), jnp.matmul(a, a.T))
    # Huge scores (computed in float32 even for float16 inputs) make softmax one-hot;
    # tiny ones make it uniform.
    v = rng.integers(-8, 9, size=(1, 2, 4, 8)).astype(np.float64)
    # Rows of q all +1 or all -1 and keys with 0..3 minus signs: distinct scores (ties
    # of huge scores would be broken by rounding, differently from the reference).
    q = rng.choice([-1.0, 1.0], size=(1, 2, 3, 1)) * np.ones(8)
    k = np.where(np.arange(8) < 8 - np.arange(4)[:, None], 1.0, -1.0)[None, None].repeat(2, 1)
    for magnitude in ((1e15, 1e-15) if dtype == jnp.float32 else (64.0, 1.0 / 256)):
        scale = 1.0 / 8
        qq, kk = q * magnitude, k * magnitude
        got = oxijax.attention(host(qq, dtype), host(kk, dtype), host(v, dtype), scale=scale)
        assert_matches(got, attention_reference(rounded(qq, dtype), rounded(kk, dtype), v, scale),
                       dtype, rtol=TOLERANCE[np.dtype(dtype)] * 4)
    # Tiny q and k: scores underflow, every weight is 1/4 and the average exact.
    tiny_q = host(q * small * small, dtype)
    got = oxijax.attention(tiny_q, host(q[:, :, :1].repeat(4, 2), dtype), host(v, dtype))
    np.testing.assert_array_equal(as_f64(got), rounded(np.broadcast_to(v.mean(2, keepdims=True),
                                                                       q.shape), dtype))


@pytest.mark.parametrize("dtype", [jnp.float16, jnp.bfloat16], ids=["f16", "bf16"])
@pytest.mark.parametrize("op", ["sum", "mean"])
def test_long_half_precision_reductions(op, dtype):
    # 10^7 terms accumulated in float32: the error stays within a few float32 roundings of
    # sum|x| plus the final rounding to dtype (naive float16 accumulation would stall).
    n = 10**7
    rng = np.random.default_rng(10)
    values = rng.uniform(-1.0, 3.0, size=n).astype(np.dtype(dtype))  # mean 1: no cancellation
    exact = values.astype(np.float64)
    total, magnitude = exact.sum(), np.abs(exact).sum()
    reference, scale = (total, magnitude) if op == "sum" else (total / n, magnitude / n)
    if op == "sum" and dtype == jnp.float16:
        values, reference, scale = values[: n // 200], exact[: n // 200].sum(), magnitude / 200
    got = float(np.asarray(oxijax.reduce(jnp.asarray(values), op, 0)).astype(np.float64))
    eps32, eps_out = float(np.finfo(np.float32).eps), float(jnp.finfo(dtype).eps)
    bound = 4 * eps32 * scale + eps_out * abs(reference)
    assert abs(got - reference) <= bound, (got, reference, bound)
