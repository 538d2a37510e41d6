"""CpuBackend against NumPy float64 references: every op, padded leading dimensions,
batched gemm, conv stride/padding, causal attention with seq_q != seq_kv, dtype=,
misuse and threads. test_backend_gpu.py runs the same tests on CudaBackend."""

from __future__ import annotations

import threading

import jax.numpy as jnp
import numpy as np
import pytest
from conftest import TOLERANCE

from oxijax.backend import CpuBackend, InvalidArgument

DTYPE_NAMES = ["float16", "bfloat16", "float32", "float64"]


@pytest.fixture
def backend():
    with CpuBackend() as be:
        yield be
        assert be.live_allocations >= 0


def upload(be, array, dtype=None) -> int:
    array = np.asarray(array, dtype=np.dtype(dtype) if dtype else None)
    ptr = be.alloc(max(array.nbytes, 1))
    be.copy_htod(ptr, np.ascontiguousarray(array).reshape(-1).view(np.uint8))
    return ptr


def download(be, ptr, shape, dtype="float32") -> np.ndarray:
    out = np.empty(shape, dtype=np.dtype(jnp.dtype(dtype)))
    be.copy_dtoh(out.reshape(-1).view(np.uint8), ptr)
    with np.errstate(invalid="ignore"):  # NaN results widen to NaN on purpose
        return out.astype(np.float64)


def values(shape, dtype, seed=0, low=-2.0, high=2.0) -> np.ndarray:
    x = np.random.default_rng(seed).uniform(low, high, size=shape)
    return x.astype(np.dtype(jnp.dtype(dtype)))


def close(actual, expected, dtype, factor=1.0):
    tol = TOLERANCE[np.dtype(jnp.dtype(dtype))] * factor
    scale = np.max(np.abs(expected), initial=0.0)
    np.testing.assert_allclose(actual, expected, rtol=tol, atol=tol * (scale + 1e-300))


# -- gemm (column-major) -------------------------------------------------------------


def colmajor(matrix: np.ndarray, ld: int, fill=np.nan) -> np.ndarray:
    """The column-major storage of matrix with leading dimension ld (padding = fill)."""
    rows, cols = matrix.shape
    store = np.full((cols, ld), fill, dtype=matrix.dtype)
    store[:, :rows] = matrix.T
    return store.reshape(-1)


def test_gemm_identity(backend):
    a = upload(backend, [1.0, 0.0, 0.0, 1.0])
    b = upload(backend, [1.0, 3.0, 2.0, 4.0])
    c = upload(backend, np.zeros(4))
    backend.gemm("N", "N", 2, 2, 2, 1.0, a, 2, b, 2, 0.0, c, 2)
    backend.synchronize()
    np.testing.assert_array_equal(download(backend, c, 4, "float64"), [1.0, 3.0, 2.0, 4.0])


@pytest.mark.parametrize("trans_a", ["N", "T", "C"])
@pytest.mark.parametrize("trans_b", ["N", "T"])
@pytest.mark.parametrize("m,n,k,pad", [(1, 1, 1, 0), (5, 7, 3, 2), (33, 17, 65, 3)])
def test_gemm_random_padded(backend, trans_a, trans_b, m, n, k, pad):
    rng = np.random.default_rng(m * n * k)
    A = rng.standard_normal((k, m) if trans_a != "N" else (m, k))
    B = rng.standard_normal((n, k) if trans_b != "N" else (k, n))
    C = rng.standard_normal((m, n))
    lda, ldb, ldc = A.shape[0] + pad, B.shape[0] + pad + 1, m + pad
    a, b = upload(backend, colmajor(A, lda)), upload(backend, colmajor(B, ldb))
    c_store = colmajor(C, ldc, fill=7.0)
    c = upload(backend, c_store)
    alpha, beta = 1.5, -0.5
    backend.gemm(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc)
    opa = A.T if trans_a != "N" else A
    opb = B.T if trans_b != "N" else B
    got = download(backend, c, n * ldc, "float64").reshape(n, ldc)
    close(got[:, :m].T, alpha * opa @ opb + beta * C, "float64")
    np.testing.assert_array_equal(got[:, m:], 7.0)  # rows past m untouched


def test_gemm_beta_zero_ignores_nan_in_c(backend):
    a, b = upload(backend, np.ones(4)), upload(backend, np.ones(4))
    c = upload(backend, np.full(4, np.nan))
    backend.gemm("N", "N", 2, 2, 2, 1.0, a, 2, b, 2, 0.0, c, 2)
    np.testing.assert_array_equal(download(backend, c, 4, "float64"), 2.0)


@pytest.mark.parametrize("dtype", DTYPE_NAMES)
def test_gemm_dtypes(backend, dtype):
    m, n, k = 6, 5, 9
    A, B = values((m, k), dtype, 1), values((k, n), dtype, 2)
    a = upload(backend, colmajor(A, m))
    b = upload(backend, colmajor(B, k))
    c = upload(backend, np.zeros(m * n, np.dtype(jnp.dtype(dtype))))
    backend.gemm("N", "N", m, n, k, 1.0, a, m, b, k, 0.0, c, m, dtype=dtype)
    got = download(backend, c, (n, m), dtype).T
    close(got, A.astype(np.float64) @ B.astype(np.float64), dtype, factor=4)


@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_batched_gemm(backend, dtype):
    batch, m, n, k = 3, 4, 5, 6
    lda, ldb, ldc = m + 1, n, m + 2  # trans_b: B stored n x k
    sa, sb, sc = lda * k + 3, 0, ldc * n + 1  # sb = 0: one B for every matrix
    rng = np.random.default_rng(0)
    As = [rng.standard_normal((m, k)) for _ in range(batch)]
    B = rng.standard_normal((n, k))
    itemsize = np.dtype(dtype).itemsize
    a_store = np.zeros(sa * batch)
    for i, A in enumerate(As):
        a_store[i * sa:i * sa + lda * k] = colmajor(A, lda, 0.0)
    a = upload(backend, a_store, dtype)
    b = upload(backend, colmajor(B, ldb), dtype)
    c = upload(backend, np.full(sc * batch, 3.0), dtype)
    backend.batched_gemm("N", "T", m, n, k, 2.0, a, lda, sa, b, ldb, sb, 1.0, c, ldc, sc, batch,
                         dtype=dtype)
    got = download(backend, c, sc * batch, dtype)
    for i, A in enumerate(As):
        block = got[i * sc:i * sc + ldc * n].reshape(n, ldc)
        close(block[:, :m].T, 2.0 * A @ B.T + 3.0, dtype, factor=4)
        np.testing.assert_array_equal(block[:, m:], 3.0)
        np.testing.assert_array_equal(got[i * sc + ldc * n:(i + 1) * sc], 3.0)
    assert itemsize in (4, 8)


def test_batched_gemm_zero_count_is_noop(backend):
    assert backend.batched_gemm("N", "N", 1, 1, 1, 1.0, 0, 1, 1, 0, 1, 1, 0.0, 0, 1, 1, 0) is None


# -- conv2d --------------------------------------------------------------------------


def conv_reference(x, w, stride, padding):
    x, w = x.astype(np.float64), w.astype(np.float64)
    (sh, sw), (ph, pw) = stride, padding
    n, c, h, wd = x.shape
    k, _, r, s = w.shape
    xp = np.pad(x, ((0, 0), (0, 0), (ph, ph), (pw, pw)))
    p, q = (h + 2 * ph - r) // sh + 1, (wd + 2 * pw - s) // sw + 1
    out = np.zeros((n, k, p, q))
    for i in range(r):
        for j in range(s):
            patch = xp[:, :, i:i + sh * p:sh, j:j + sw * q:sw]
            out += np.einsum("ncpq,kc->nkpq", patch, w[:, :, i, j])
    return out


@pytest.mark.parametrize("stride,padding", [((1, 1), (0, 0)), ((2, 1), (1, 2)), ((3, 2), (2, 0))])
@pytest.mark.parametrize("dtype", ["float32", "float64", "bfloat16"])
def test_conv2d(backend, stride, padding, dtype):
    x, w = values((2, 3, 9, 8), dtype, 3), values((4, 3, 3, 2), dtype, 4)
    expected = conv_reference(x, w, stride, padding)
    xp, wp = upload(backend, x), upload(backend, w)
    out = backend.alloc(expected.size * np.dtype(jnp.dtype(dtype)).itemsize)
    backend.conv2d_forward(xp, x.shape, wp, w.shape, out, expected.shape, stride, padding,
                           dtype=dtype)
    close(download(backend, out, expected.shape, dtype), expected, dtype, factor=4)


def test_conv2d_1x1_seed(backend):
    x = upload(backend, np.ones(3 * 64, np.float32))
    w = upload(backend, np.full(12, 0.5, np.float32))
    out = backend.alloc(4 * 64 * 4)
    backend.conv2d_forward(x, [1, 3, 8, 8], w, [4, 3, 1, 1], out, [1, 4, 8, 8], [1, 1], [0, 0])
    np.testing.assert_array_equal(download(backend, out, 256), 1.5)


# -- attention -----------------------------------------------------------------------


def attention_reference(q, k, v, scale, causal):
    q, k, v = (t.astype(np.float64) for t in (q, k, v))
    s = scale * q @ np.swapaxes(k, -1, -2)
    sq, skv = q.shape[-2], k.shape[-2]
    if causal:
        visible = np.arange(skv)[None, :] <= np.arange(sq)[:, None] + (skv - sq)
        s = np.where(visible, s, -np.inf)
    m = np.max(s, axis=-1, keepdims=True)
    p = np.exp(s - np.where(np.isfinite(m), m, 0))
    total = p.sum(-1, keepdims=True)
    return np.where(total > 0, (p / np.where(total > 0, total, 1)) @ v, 0.0)


@pytest.mark.parametrize("sq,skv,causal", [(5, 5, False), (4, 9, True), (9, 4, True),
                                           (16, 16, True)])
@pytest.mark.parametrize("dtype", ["float32", "float16", "float64"])
def test_attention(backend, sq, skv, causal, dtype):
    b, h, d = 2, 3, 8
    q, k, v = (values(s, dtype, i) for i, s in enumerate([(b, h, sq, d), (b, h, skv, d),
                                                          (b, h, skv, d)]))
    scale = 0.3
    expected = attention_reference(q, k, v, scale, causal)
    qp, kp, vp = upload(backend, q), upload(backend, k), upload(backend, v)
    op = backend.alloc(q.nbytes)
    backend.attention(qp, kp, vp, op, b, h, sq, skv, d, scale, causal, dtype=dtype)
    close(download(backend, op, q.shape, dtype), expected, dtype, factor=4)


# -- reduce, unary, binary -----------------------------------------------------------

REDUCE = {"sum": np.sum, "max": np.max, "min": np.min, "mean": np.mean}


@pytest.mark.parametrize("op", list(REDUCE))
@pytest.mark.parametrize("shape,axis", [((2, 4), 1), ((3, 5, 7), 0), ((3, 5, 7), 1),
                                        ((4, 6), -1), ((1000,), 0)])
def test_reduce(backend, op, shape, axis):
    x = values(shape, "float32", 5)
    expected = REDUCE[op](x.astype(np.float64), axis=axis)
    xp = upload(backend, x)
    out = backend.alloc(max(expected.size, 1) * 4)
    backend.reduce(op, xp, out, shape, axis)
    close(download(backend, out, expected.shape), expected, "float32", factor=4)


def test_reduce_seed_rows(backend):
    x = upload(backend, np.arange(1, 9, dtype=np.float32))
    out = backend.alloc(8)
    backend.reduce("sum", x, out, [2, 4], 1)
    np.testing.assert_array_equal(download(backend, out, 2), [10.0, 26.0])


def test_reduce_empty_axis(backend):
    x, out = backend.alloc(4), backend.alloc(12)
    backend.reduce("mean", x, out, [3, 0], 1)
    assert np.isnan(download(backend, out, 3)).all()
    with pytest.raises(InvalidArgument, match="no identity"):
        backend.reduce("max", x, out, [3, 0], 1)


UNARY = {"relu": lambda x: np.maximum(x, 0), "sigmoid": lambda x: 1 / (1 + np.exp(-x)),
         "tanh": np.tanh, "exp": np.exp, "log": np.log, "sqrt": np.sqrt, "abs": np.abs,
         "neg": np.negative}


@pytest.mark.parametrize("op", list(UNARY))
@pytest.mark.parametrize("dtype", DTYPE_NAMES)
def test_unary(backend, op, dtype):
    low = 0.1 if op in ("log", "sqrt") else -3.0
    x = values(1037, dtype, 6, low=low, high=3.0)
    xp, yp = upload(backend, x), backend.alloc(x.nbytes)
    backend.unary(op, xp, yp, x.size, dtype=None if dtype == "float32" else dtype)
    close(download(backend, yp, x.shape, dtype), UNARY[op](x.astype(np.float64)), dtype, 2)


def test_unary_in_place_and_specials(backend):
    x = np.array([np.nan, -1.0, 0.0, 4.0], np.float32)
    p = upload(backend, x)
    backend.unary("sqrt", p, p, 4)
    got = download(backend, p, 4)
    assert np.isnan(got[0]) and np.isnan(got[1]) and got[2] == 0 and got[3] == 2


BINARY = {"add": np.add, "sub": np.subtract, "mul": np.multiply, "div": np.divide,
          "max": np.maximum, "min": np.minimum}


@pytest.mark.parametrize("op", list(BINARY))
@pytest.mark.parametrize("dtype", DTYPE_NAMES)
def test_binary(backend, op, dtype):
    a, b = values(999, dtype, 7), values(999, dtype, 8, low=0.5, high=2.0)
    ap, bp, out = upload(backend, a), upload(backend, b), backend.alloc(a.nbytes)
    backend.binary(op, ap, bp, out, a.size, dtype=np.dtype(jnp.dtype(dtype)))
    expected = BINARY[op](a.astype(np.float64), b.astype(np.float64))
    close(download(backend, out, a.shape, dtype), expected, dtype, 2)


def test_binary_seed_add(backend):
    a = upload(backend, np.arange(1, 7, dtype=np.float32))
    b = upload(backend, np.arange(10, 70, 10, dtype=np.float32))
    c = backend.alloc(24)
    backend.binary("add", a, b, c, 6)
    np.testing.assert_array_equal(download(backend, c, 6), [11, 22, 33, 44, 55, 66])


# -- pointers: interior, out of bounds, misuse ----------------------------------------


def test_interior_pointers_are_valid(backend):
    p = upload(backend, np.arange(8, dtype=np.float32))
    backend.unary("neg", p + 16, p + 16, 4)
    np.testing.assert_array_equal(download(backend, p, 8), [0, 1, 2, 3, -4, -5, -6, -7])
    with pytest.raises(InvalidArgument, match="inside the allocation"):
        backend.free(p + 4)


def test_misuse(backend):
    p = backend.alloc(16)
    before = download(backend, p, 4)
    with pytest.raises(InvalidArgument, match="past the end"):
        backend.copy_htod(p + 8, bytes(12))
    with pytest.raises(InvalidArgument, match="past the end"):
        backend.copy_dtoh(bytearray(20), p)
    with pytest.raises(InvalidArgument, match="past the end"):
        backend.unary("relu", p, p, 5)
    with pytest.raises(InvalidArgument, match="past the end"):
        backend.gemm("N", "N", 2, 2, 2, 1.0, p, 2, p, 2, 0.0, p, 2)  # 32 bytes of float64
    with pytest.raises(InvalidArgument, match="not inside any live allocation"):
        backend.unary("relu", 0xDEAD0000, p, 1)  # foreign pointer
    np.testing.assert_array_equal(download(backend, p, 4), before)  # nothing touched
    backend.free(p)
    with pytest.raises(InvalidArgument, match="already freed"):
        backend.free(p)  # double free
    with pytest.raises(InvalidArgument):
        backend.copy_htod(p, bytes(4))  # use after free
    with pytest.raises(InvalidArgument):
        backend.copy_dtoh(memoryview(bytes(4)), p)  # read-only destination
    assert backend.live_allocations == 0


def test_close_frees_everything():
    be = CpuBackend()
    be.init()
    for _ in range(3):
        be.alloc(100)
    assert be.live_allocations == 3
    be.close()
    assert be.live_allocations == 0 and not be.is_initialized()


# -- threads ---------------------------------------------------------------------------


def test_threads(backend):
    errors = []

    def worker(seed):
        try:
            rng = np.random.default_rng(seed)
            for _ in range(100):
                x = rng.standard_normal(64).astype(np.float32)
                p, q = backend.alloc(x.nbytes), backend.alloc(x.nbytes)
                backend.copy_htod(p, x)
                backend.binary("add", p, p, q, x.size)
                backend.unary("neg", q, q, x.size)
                out = np.empty_like(x)
                backend.synchronize()
                backend.copy_dtoh(out, q)
                np.testing.assert_array_equal(out, -(x + x))
                backend.free(p)
                backend.free(q)
        except Exception as error:  # noqa: BLE001 - reported below
            errors.append(error)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors[0]
    assert backend.live_allocations == 0


# -- JAX interop -----------------------------------------------------------------------


def test_import_and_export_jax_arrays(backend):
    from oxijax.backend import import_jax_array, to_jax_array

    x = jnp.arange(12, dtype=jnp.float32).reshape(3, 4) * 0.5
    p = import_jax_array(backend, x)
    out = backend.alloc(x.nbytes)
    backend.unary("exp", p, out, x.size)
    y = to_jax_array(backend, out, (3, 4), jnp.float32)
    np.testing.assert_allclose(np.asarray(y), np.exp(np.asarray(x)), rtol=1e-6)
    backend.free(out)  # the JAX array keeps the memory alive
    np.testing.assert_allclose(np.asarray(y + 0), np.exp(np.asarray(x)), rtol=1e-6)
    with pytest.raises(InvalidArgument, match="past the end"):
        to_jax_array(backend, p, (4, 4))
    backend.free(p)
    assert backend.live_allocations == 0
    assert to_jax_array(backend, 0, (0, 3)).shape == (0, 3)
