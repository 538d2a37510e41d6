"""ptx.h's instructions, probed one by one (ffi/cuda/ptx_probe_kernels.cu).

On a GPU (`gpu`, run first by scripts/gpu_check.sh): the hardware and the CUDA
interpreter get the same random inputs and must agree bit for bit (ex2.approx within the
ISA's error bound: its hardware approximation is not specified), so the first GPU that
is lent shows whether the interpreter's model of the hardware is right.
Everywhere (`cuda_interpret`): the interpreter's results against NumPy models of the PTX
ISA's definitions, written independently of ffi/interp/ptx.cc."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
from conftest import require_interpreter

WORDS = 1024
CP_ASYNC, LDMATRIX, LDMATRIX_TRANS, MMA_F16, MMA_BF16, MMA_TF32, MMA_F64, CONVERT, ST_SHARED = range(9)
PROBES = {"cp_async": CP_ASYNC, "ldmatrix": LDMATRIX, "ldmatrix_trans": LDMATRIX_TRANS,
          "mma_f16": MMA_F16, "mma_bf16": MMA_BF16, "mma_tf32": MMA_TF32, "mma_f64": MMA_F64,
          "convert": CONVERT, "st_shared": ST_SHARED}


def probe(module, code, words):
    return np.asarray(module.ptx_probe(code, [int(w) for w in words]), np.uint32)


def _bits(values, dtype):
    return np.asarray(values, dtype).view(np.uint16 if np.dtype(dtype).itemsize == 2 else np.uint32)


def random_words(code, seed):
    """Inputs for a probe: random bit patterns where any are meaningful, random finite
    values (of the instruction's input type) where the instruction multiplies."""
    rng = np.random.default_rng(seed)
    words = rng.integers(0, 2**32, WORDS, dtype=np.uint64).astype(np.uint32)
    if code in (MMA_F16, MMA_BF16, MMA_TF32):
        half = {MMA_F16: np.float16, MMA_BF16: ml_dtypes.bfloat16}.get(code)
        for lane in range(32):
            w = words[10 * lane:10 * lane + 10]
            if half is None:  # tf32 operands: float32 values, low 13 bits set at random
                w[:6] = rng.standard_normal(6).astype(np.float32).view(np.uint32)
            else:
                w[:6] = _bits(rng.standard_normal(12) * 4, half).view(np.uint32)
            w[6:] = rng.standard_normal(4).astype(np.float32).view(np.uint32)
    elif code == MMA_F64:
        words[:256] = rng.standard_normal(128).view(np.uint32)
    elif code == CONVERT:
        specials = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, 1e-40, -1e-40, 3.4e38, 65504.0,
                             65520.0, 1.5, 2.5, -1.5, 1e-45, 127.9, -126.5], np.float32)
        values = rng.standard_normal(257).astype(np.float32) * np.float32(50)
        values[:specials.size] = specials
        words[:257] = values.view(np.uint32)
    return words


# ---------------------------------------------------------------- NumPy models


def model_cp_async(words):
    out = np.zeros(WORDS, np.uint32)
    for lane in range(32):
        tile = np.full(7, 0xDEADBEEF, np.uint32).view(np.uint8).copy()
        src = words[28 * lane:28 * lane + 7].view(np.uint8)
        for offset, size, valid in ((0, 16, lane % 17), (16, 8, lane % 9), (24, 4, lane % 5)):
            tile[offset:offset + size] = 0
            tile[offset:offset + valid] = src[offset:offset + valid]
        out[7 * lane:7 * lane + 7] = tile.view(np.uint32)
    return out


def model_ldmatrix(words, trans):
    mats = words[:128].view(np.uint16).reshape(4, 8, 8)  # matrix, row, column
    out = np.zeros(WORDS, np.uint32)
    for lane in range(32):
        row, col = lane // 4, 2 * (lane % 4)
        for j in range(4):
            m = mats[j].T if trans else mats[j]
            out[4 * lane + j] = int(m[row, col]) | (int(m[row, col + 1]) << 16)
    return out


def ldmatrix_rows(words):
    """The probe permutes the row addresses; undo it to get the matrices it loads."""
    rows = words[:128].reshape(32, 4)
    loaded = np.zeros_like(rows)
    for lane in range(32):
        loaded[lane] = rows[(lane // 8) * 8 + int(words[128 + lane] % 8)]
    return np.concatenate([loaded.ravel(), words[128:]])


def tensor_core_dot(a, b, c):
    """c + a @ b per element as an H200's tensor cores sum float32 accumulators (fitted to
    the hardware's probe results of 2026-12-04; the ISA leaves it to the implementation):
    exact products and c aligned to the largest exponent among them (a product's: the sum
    of its factors'), each truncated toward zero 25 bits below it, summed exactly, the sum
    rounded toward zero to float32. Finite normal operands only (what random_words gives)."""
    def exponent(x):  # floor(log2|x|), for x != 0
        return np.frexp(x)[1] - 1
    products = a[:, :, None] * b[None, :, :]  # row, k, column: exact in float64
    nonzero = products != 0
    raw = np.where(nonzero, exponent(a)[:, :, None] + exponent(b)[None, :, :], -10**6)
    top = np.maximum(raw.max(axis=1), np.where(c != 0, exponent(c), -10**6))
    unit = np.ldexp(1.0, np.maximum(top, -1000) - 25)  # (all-zero elements: any unit)
    kept = np.trunc(products / unit[:, None, :]).sum(axis=1) + np.trunc(c / unit)  # exact
    exact = kept * unit
    with np.errstate(over="ignore"):
        d = exact.astype(np.float32)  # beyond float32's range: inf
    rounded_up = np.isfinite(d) & (np.abs(d.astype(np.float64)) > np.abs(exact))
    return np.where(rounded_up, np.nextafter(d, np.float32(0)), d)


def model_mma(words, code):
    """D = A @ B + C with the ISA's fragment layouts, summed as the tensor cores do."""
    out = np.zeros(WORDS, np.uint32)
    if code == MMA_TF32:
        a, b = np.zeros((16, 8)), np.zeros((8, 8))
        k = 8
    else:
        a, b = np.zeros((16, 16)), np.zeros((16, 8))
        k = 16
    c = np.zeros((16, 8))
    half = np.float16 if code == MMA_F16 else ml_dtypes.bfloat16
    for lane in range(32):
        g, t = lane // 4, lane % 4
        w = words[10 * lane:10 * lane + 10]
        if code == MMA_TF32:
            v = (w[:6] & np.uint32(0xFFFFE000)).view(np.float32).astype(np.float64)
            a[g, t], a[g + 8, t], a[g, t + 4], a[g + 8, t + 4], b[t, g], b[t + 4, g] = v
        else:
            v = w[:6].view(np.uint16).view(half).astype(np.float64)  # pairs, low half first
            for h in range(2):
                a[g, 2 * t + h], a[g + 8, 2 * t + h] = v[h], v[2 + h]
                a[g, 2 * t + 8 + h], a[g + 8, 2 * t + 8 + h] = v[4 + h], v[6 + h]
                b[2 * t + h, g], b[2 * t + 8 + h, g] = v[8 + h], v[10 + h]
        cv = w[6:].view(np.float32).astype(np.float64)
        c[g, 2 * t], c[g, 2 * t + 1], c[g + 8, 2 * t], c[g + 8, 2 * t + 1] = cv
    assert a.shape[1] == k
    d = tensor_core_dot(a, b, c)
    for lane in range(32):
        g, t = lane // 4, lane % 4
        out[4 * lane:4 * lane + 4] = np.array(
            [d[g, 2 * t], d[g, 2 * t + 1], d[g + 8, 2 * t], d[g + 8, 2 * t + 1]], np.float32).view(np.uint32)
    return out


def model_convert(words):
    out = np.zeros(WORDS, np.uint32)
    x = words[:257].view(np.float32)
    for i in range(256):
        bits = int(words[i])
        if not np.isfinite(x[i]):  # NaN and inf keep their bits (the H200, 2026-12-04)
            tf32 = bits & 0xFFFFE000
        else:  # ties away from zero on the magnitude
            tf32 = (bits + 0x1000) & 0xFFFFE000
        pack = []
        for dtype in (ml_dtypes.bfloat16, np.float16):
            with np.errstate(over="ignore"):  # past float16's range is inf, as in the PTX
                lo, hi = (0x7FFF if np.isnan(v)
                          else int(np.asarray(v, np.float32).astype(dtype).view(np.uint16))
                          for v in (x[i], x[i + 1]))
            pack.append(lo | (hi << 16))
        out[4 * i:4 * i + 3] = [tf32, *pack]
    return out


def ulp_distance(a_bits, b_bits):
    a = a_bits.astype(np.int64)
    b = b_bits.astype(np.int64)
    a = np.where(a & 0x80000000, 0x80000000 - a, a)
    b = np.where(b & 0x80000000, 0x80000000 - b, b)
    return np.abs(a - b)


# ---------------------------------------------------------------- the interpreter vs NumPy


@pytest.fixture(scope="module")
def interp():
    return require_interpreter()


@pytest.mark.cuda_interpret
@pytest.mark.parametrize("seed", [0, 1])
def test_interpreter_matches_the_isa(interp, seed):
    for name, code in PROBES.items():
        words = random_words(code, seed)
        got = probe(interp, code, words)
        if code == CP_ASYNC:
            expected = model_cp_async(words)
        elif code in (LDMATRIX, LDMATRIX_TRANS):
            expected = model_ldmatrix(ldmatrix_rows(words), code == LDMATRIX_TRANS)
        elif code in (MMA_F16, MMA_BF16, MMA_TF32):
            expected = model_mma(words, code)
        elif code == MMA_F64:
            v = words[:256].view(np.float64).reshape(32, 4)  # a, b, c0, c1 per lane
            a, b = np.zeros((8, 4)), np.zeros((4, 8))
            for lane in range(32):
                a[lane // 4, lane % 4], b[lane % 4, lane // 4] = v[lane, 0], v[lane, 1]
            got_d = got[:128].view(np.float64).reshape(32, 2)
            for lane in range(32):
                g, t = lane // 4, lane % 4
                exact = a[g] @ b[:, 2 * t:2 * t + 2] + v[lane, 2:]
                np.testing.assert_allclose(got_d[lane], exact, rtol=1e-15, atol=1e-15)
            continue
        elif code == CONVERT:
            expected = model_convert(words)
            x = words[:256].view(np.float32)
            e = got[3::4][:256]
            with np.errstate(all="ignore"):
                ref = np.exp2(x.astype(np.float64)).astype(np.float32)
            ref = np.where(np.abs(ref) < np.finfo(np.float32).tiny, np.float32(0), ref)
            ref = np.where(np.abs(x) < np.finfo(np.float32).tiny, np.float32(1), ref)
            np.testing.assert_array_equal(np.isnan(e.view(np.float32)), np.isnan(ref))
            finite = ~np.isnan(ref)
            assert ulp_distance(e[finite], ref.view(np.uint32)[finite]).max() <= 2, name
            got = got.copy()
            got[3::4] = 0
        else:  # st.shared.v4: lane l stored in[4l..4l+3] at slot 31 - l
            expected = np.zeros(WORDS, np.uint32)
            expected[:128] = words[:128].reshape(32, 4)[::-1].ravel()
        np.testing.assert_array_equal(got, expected, err_msg=name)


# ---------------------------------------------------------------- the GPU vs the interpreter


@pytest.mark.parametrize("name", list(PROBES))
def test_gpu_matches_interpreter_bit_for_bit(gpu, interp, name):
    from oxijax._extension import _oxijax

    code = PROBES[name]
    for seed in range(4):
        words = random_words(code, seed)
        hardware = probe(_oxijax, code, words)
        model = probe(interp, code, words)
        if code == CONVERT:  # ex2.approx: within the ISA's 2 ulp, not bit for bit
            distance = ulp_distance(hardware[3::4][:256], model[3::4][:256])
            nan = np.isnan(hardware[3::4][:256].view(np.float32))
            assert distance[~nan].max() <= 2, f"ex2.approx differs by {distance[~nan].max()} ulp"
            hardware, model = hardware.copy(), model.copy()
            hardware[3::4] = model[3::4] = 0
        mismatch = np.flatnonzero(hardware != model)
        assert mismatch.size == 0, (
            f"{name}, seed {seed}: {mismatch.size} words differ, first at {mismatch[:8]}: "
            f"hardware {hardware[mismatch[:8]]}, interpreter {model[mismatch[:8]]}")
