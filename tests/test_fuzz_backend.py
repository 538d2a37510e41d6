"""Fuzzing every CpuBackend method (hypothesis): valid draws against NumPy float64
(column-major gemm with padded leading dimensions, batched gemm with strides, conv2d,
attention, reduce, unary, binary, interior pointers), invalid draws raising the documented
InvalidArgument without touching memory, and a state machine of alloc/free/copies against
a model of the bytes. Every draw frees what it allocated: live allocations return to 0."""

from __future__ import annotations

import contextlib
import warnings

import jax.numpy as jnp
import numpy as np
import pytest
from conftest import assert_close
from fuzz_strategies import fuzz_settings, seeds, shapes, sides
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    Bundle, RuleBasedStateMachine, consumes, invariant, precondition, rule,
)
from test_backend_compute import (
    BINARY, REDUCE, UNARY, attention_reference, colmajor, conv_reference, download, upload,
)

from oxijax.backend import CpuBackend, InvalidArgument

pytestmark = pytest.mark.fuzz

DTYPE_NAMES = ("float16", "bfloat16", "float32", "float64")
# dtype= accepts a name, a NumPy dtype or a JAX dtype; None is the trait's default.
dtype_args = st.sampled_from(DTYPE_NAMES).flatmap(
    lambda name: st.sampled_from([name, np.dtype(jnp.dtype(name)), jnp.dtype(name)]))


def name_of(dtype, default):
    return default if dtype is None else jnp.dtype(dtype).name


@pytest.fixture(scope="module")
def be():
    with CpuBackend() as backend:
        yield backend


@contextlib.contextmanager
def allocations(be):
    """Frees every pointer listed in the yielded list, then checks nothing is left."""
    ptrs = []
    try:
        yield ptrs
    finally:
        for ptr in ptrs:
            be.free(ptr)
        assert be.live_allocations == 0


def host(values, dtype):
    return np.asarray(values).astype(np.dtype(jnp.dtype(dtype)))


def random_values(shape, dtype, seed, low=-2.0, high=2.0):
    return host(np.random.default_rng(seed).uniform(low, high, size=shape), dtype)


# -- gemm and batched_gemm ------------------------------------------------------------


@st.composite
def gemm_problems(draw):
    m, n, k = (draw(sides(65, minimum=1)) for _ in range(3))
    trans_a, trans_b = draw(st.sampled_from("NTC")), draw(st.sampled_from("NTCntc"))
    pads = [draw(st.sampled_from([0, 0, 1, 3, 17])) for _ in range(3)]
    batch = draw(st.integers(0, 3)) if draw(st.booleans()) else None  # None: plain gemm
    return m, n, k, trans_a, trans_b, pads, batch


@fuzz_settings
@given(problem=gemm_problems(), alpha=st.floats(-2, 2),
       beta=st.sampled_from([0.0, 1.0, -0.5]), dtype=st.one_of(st.none(), dtype_args),
       shared=st.sampled_from([None, "a", "b"]), gaps=st.lists(st.integers(0, 5), min_size=3,
                                                                max_size=3), seed=seeds)
def test_gemm(be, problem, alpha, beta, dtype, shared, gaps, seed):
    m, n, k, trans_a, trans_b, pads, batch = problem
    name = name_of(dtype, "float64")
    ta, tb = trans_a in "TCtc", trans_b in "TCtc"
    a_rows, a_cols = (k, m) if ta else (m, k)
    b_rows, b_cols = (n, k) if tb else (k, n)
    lda, ldb, ldc = a_rows + pads[0], b_rows + pads[1], m + pads[2]
    count = 1 if batch is None else batch
    stored = max(count, 1)  # batch_count 0 stores one matrix that must stay untouched
    # Strides leave gaps between matrices; a stride of 0 shares one A or B across the batch.
    stride_a = 0 if shared == "a" else lda * a_cols + gaps[0]
    stride_b = 0 if shared == "b" else ldb * b_cols + gaps[1]
    stride_c = ldc * n + gaps[2]
    rng = np.random.default_rng(seed)
    As = [host(rng.uniform(-2, 2, (a_rows, a_cols)), name) for _ in range(stored)]
    Bs = [host(rng.uniform(-2, 2, (b_rows, b_cols)), name) for _ in range(stored)]
    Cs = [host(rng.uniform(-2, 2, (m, n)) if beta else np.full((m, n), np.nan), name)
          for _ in range(stored)]
    if shared == "a":
        As = [As[0]] * stored
    if shared == "b":
        Bs = [Bs[0]] * stored

    def store(mats, ld, stride, fill):
        """The batch in one column-major buffer; padding and gaps hold `fill`."""
        buffer = host(np.full(stride * (stored - 1) + ld * mats[0].shape[1], fill), name)
        for i, mat in enumerate(mats):
            buffer[i * stride:i * stride + ld * mat.shape[1]] = colmajor(mat, ld, fill)
        return buffer

    a_store = store(As, lda, stride_a, np.nan)  # padding is never read: NaN would leak
    b_store = store(Bs, ldb, stride_b, np.nan)
    c_store = store(Cs, ldc, stride_c, 7.0)
    with allocations(be) as ptrs:
        a, b, c = (upload(be, s) for s in (a_store, b_store, c_store))
        ptrs += [a, b, c]
        if batch is None:
            be.gemm(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc, dtype=dtype)
        else:
            be.batched_gemm(trans_a, trans_b, m, n, k, alpha, a, lda, stride_a, b, ldb, stride_b,
                            beta, c, ldc, stride_c, count, dtype=dtype)
        got = download(be, c, c_store.shape, name)
    expected = c_store.astype(np.float64)
    for i in range(count):
        op_a = As[i].astype(np.float64).T if ta else As[i].astype(np.float64)
        op_b = Bs[i].astype(np.float64).T if tb else Bs[i].astype(np.float64)
        block = alpha * op_a @ op_b + (beta * Cs[i].astype(np.float64) if beta else 0.0)
        start = i * stride_c
        view = expected[start:start + ldc * n].reshape(n, ldc)
        view[:, :m] = block.T
    # Padding rows and gaps between C's matrices are untouched (still 7.0).
    assert_close(got, expected, jnp.dtype(name), scale=4.0 * np.sqrt(k) + 2.0, factor=2.0)


def gemm_fault(be, draw, ptrs):
    """A bad gemm call from a valid one: (call, message fragment)."""
    m, n, k = (draw(st.integers(1, 6)) for _ in range(3))
    name = draw(st.sampled_from(DTYPE_NAMES))
    size = np.dtype(jnp.dtype(name)).itemsize
    a, b, c = (be.alloc(36 * size) for _ in range(3))
    ptrs += [a, b, c]
    args = dict(trans_a="N", trans_b="N", m=m, n=n, k=k, alpha=1.0, a_ptr=a, lda=m, b_ptr=b,
                ldb=k, beta=0.0, c_ptr=c, ldc=m, dtype=name)
    kind = draw(st.sampled_from(["zero_dim", "negative", "not_int", "ld", "too_small", "trans",
                                 "dtype", "foreign", "freed", "past_end", "alpha"]))
    if kind == "zero_dim":
        args[draw(st.sampled_from("mnk"))] = 0
        fragment = "must all be > 0"
    elif kind == "negative":
        which = draw(st.sampled_from(["m", "n", "k", "a_ptr"]))
        args[which] = draw(st.integers(-(2**40), -1))
        fragment = f"{which} must be >= 0"
    elif kind == "not_int":
        which = draw(st.sampled_from(["m", "lda", "c_ptr"]))
        args[which] = draw(st.sampled_from([1.0, True, "3", None]))
        fragment = f"{which} must be an integer"
    elif kind == "ld":
        which, rows = draw(st.sampled_from([("lda", m), ("ldb", k), ("ldc", m)]))
        args[which] = draw(st.integers(0, rows - 1)) if rows > 1 else 0
        fragment = f"{which} = .* is smaller than|{which} must be >= 1"
    elif kind == "too_small":
        # 36 elements hold at most a 6x6 matrix: ask for more through the leading dimension.
        which = draw(st.sampled_from(["lda", "ldb", "ldc"]))
        args[which] = 36 // min(m, n, k) + 1 + draw(st.integers(0, 50))
        fragment = "past the end"
    elif kind == "trans":
        args[draw(st.sampled_from(["trans_a", "trans_b"]))] = draw(st.sampled_from(["X", "", 1, None]))
        fragment = "must be a Transpose"
    elif kind == "dtype":
        args["dtype"] = draw(st.sampled_from(["int32", "float128", np.int8, "complex64", "i4", jnp.int16]))
        fragment = "dtype must be one of"
    elif kind == "foreign":
        args["b_ptr"] = draw(st.sampled_from([0, 8, 0xDEAD0000]))
        fragment = "not inside any live allocation"
    elif kind == "freed":
        gone = be.alloc(36 * size)
        be.free(gone)
        args["a_ptr"] = gone
        fragment = "not inside any live allocation"  # nothing was allocated after it
    elif kind == "past_end":
        args["c_ptr"] = c + draw(st.integers((36 - m * n) * size + 1, 36 * size - 1))
        fragment = "past the end"
    elif kind == "alpha":
        args[draw(st.sampled_from(["alpha", "beta"]))] = draw(st.sampled_from(["x", None, [1]]))
        fragment = "must be a real number"
    return (lambda: be.gemm(**args)), fragment, (c, 36 * size)


def expect_untouched(be, call, fragment, region):
    """call raises InvalidArgument matching fragment and leaves region's bytes as they were."""
    ptr, nbytes = region
    before = (np.arange(nbytes) % 251).astype(np.uint8)
    be.copy_htod(ptr, before)
    with pytest.raises(InvalidArgument, match=fragment):
        call()
    after = np.empty(nbytes, np.uint8)
    be.copy_dtoh(after, ptr)
    np.testing.assert_array_equal(after, before)


@fuzz_settings
@given(data=st.data())
def test_gemm_invalid(be, data):
    with allocations(be) as ptrs:
        call, fragment, region = gemm_fault(be, data.draw, ptrs)
        expect_untouched(be, call, fragment, region)


@fuzz_settings
@given(data=st.data())
def test_batched_gemm_invalid(be, data):
    m, n, k, batch = (data.draw(st.integers(1, 4)) for _ in range(4))
    with allocations(be) as ptrs:
        a, b, c = (be.alloc(8 * 64) for _ in range(3))
        ptrs += [a, b, c]
        args = [("N", "N", m, n, k, 1.0, a, m, m * k, b, k, k * n, 0.0, c, m, m * n, batch)]
        kind = data.draw(st.sampled_from(["overlap", "stride_neg", "too_many", "count"]))
        call = list(args[0])
        if kind == "overlap" and batch > 1:
            call[15] = data.draw(st.integers(0, m * n - 1))
            fragment = "overlap"
        elif kind == "stride_neg":
            where, name = data.draw(st.sampled_from([(8, "stride_a"), (11, "stride_b"),
                                                     (15, "stride_c")]))
            call[where] = data.draw(st.integers(-100, -1))
            fragment = f"{name} must be >= 0"
        elif kind == "count":
            call[16] = data.draw(st.integers(-5, -1))
            fragment = "batch_count must be >= 0"
        else:  # 64 float64 hold fewer matrices than asked for
            call[16] = 64 // (m * n) + 1 + data.draw(st.integers(0, 5))
            call[15] = m * n
            fragment = "past the end"
        expect_untouched(be, lambda: be.batched_gemm(*call), fragment, (c, 8 * 64))


# -- conv2d_forward --------------------------------------------------------------------


@st.composite
def conv_problems(draw):
    stride = (draw(st.integers(1, 3)), draw(st.integers(1, 3)))
    padding = (draw(st.integers(0, 2)), draw(st.integers(0, 2)))
    r, s = draw(st.integers(1, 4)), draw(st.integers(1, 4))
    h = draw(sides(33).filter(lambda v: v + 2 * padding[0] >= r))
    w = draw(sides(33).filter(lambda v: v + 2 * padding[1] >= s))
    n, c, k = draw(sides(3)), draw(sides(17, minimum=1)), draw(sides(17, minimum=1))
    return (n, c, h, w), (k, c, r, s), stride, padding


@fuzz_settings
@given(problem=conv_problems(), dtype=st.one_of(st.none(), dtype_args), seed=seeds)
def test_conv2d_forward(be, problem, dtype, seed):
    x_shape, w_shape, stride, padding = problem
    name = name_of(dtype, "float32")
    x, w = random_values(x_shape, name, seed), random_values(w_shape, name, seed + 1)
    expected = conv_reference(x, w, stride, padding)
    with allocations(be) as ptrs:
        xp, wp = upload(be, x), upload(be, w)
        out = be.alloc(max(expected.size, 1) * x.itemsize)
        ptrs += [xp, wp, out]
        be.conv2d_forward(xp, x_shape, wp, w_shape, out, expected.shape, stride, padding,
                          dtype=dtype)
        if expected.size:
            got = download(be, out, expected.shape, name)
            assert_close(got, expected, jnp.dtype(name),
                         scale=4.0 * np.sqrt(x_shape[1] * w_shape[2] * w_shape[3]) + 1.0)


@fuzz_settings
@given(data=st.data())
def test_conv2d_forward_invalid(be, data):
    draw = data.draw
    n, c, h, w, k, r, s = 1, 2, 5, 5, 3, 3, 3
    x_shape, w_shape, out_shape = [n, c, h, w], [k, c, r, s], [n, k, 3, 3]
    stride, padding = [1, 1], [0, 0]
    with allocations(be) as ptrs:
        xp, wp, op = be.alloc(4 * 50), be.alloc(4 * 54), be.alloc(4 * 27)
        ptrs += [xp, wp, op]
        args = dict(input_ptr=xp, input_shape=x_shape, filter_ptr=wp, filter_shape=w_shape,
                    output_ptr=op, output_shape=out_shape, stride=stride, padding=padding)
        kind = draw(st.sampled_from(["rank", "pair", "stride", "channels", "zero", "too_large",
                                     "out_shape", "negative", "small_buffer", "dtype"]))
        if kind == "rank":
            which = draw(st.sampled_from(["input_shape", "filter_shape", "output_shape"]))
            args[which] = draw(st.lists(st.integers(1, 4), max_size=6).filter(lambda v: len(v) != 4))
            fragment = f"{which} .* must have 4 elements"
        elif kind == "pair":
            which = draw(st.sampled_from(["stride", "padding"]))
            args[which] = draw(st.lists(st.integers(1, 3), max_size=5).filter(lambda v: len(v) != 2))
            fragment = f"{which} must have 2 elements"
        elif kind == "stride":
            args["stride"] = draw(st.sampled_from([[0, 1], [1, 0], [0, 0]]))
            fragment = "stride must be >= 1"
        elif kind == "channels":
            args["filter_shape"] = [k, c + draw(st.integers(1, 3)), r, s]
            fragment = "filter channels"
        elif kind == "zero":
            args["filter_shape"] = draw(st.sampled_from([[0, c, r, s], [k, c, 0, s], [k, c, r, 0]]))
            fragment = "must be > 0"
        elif kind == "too_large":
            args["filter_shape"] = [k, c, h + 1 + draw(st.integers(0, 3)), s]
            fragment = "larger than the padded input"
        elif kind == "out_shape":
            bad = list(out_shape)
            bad[draw(st.integers(0, 3))] += draw(st.integers(1, 3))
            args["output_shape"] = bad
            fragment = "output_shape must be"
        elif kind == "negative":
            args["padding"] = [draw(st.integers(-3, -1)), 0]
            fragment = r"padding\[0\] must be >= 0"
        elif kind == "small_buffer":
            args["input_shape"], args["output_shape"] = [2, c, h, w], [2, k, 3, 3]
            fragment = "past the end"
        else:
            args["dtype"] = draw(st.sampled_from(["int32", "uint8", "float8"]))
            fragment = "dtype must be one of"
        expect_untouched(be, lambda: be.conv2d_forward(**args), fragment, (op, 4 * 27))


# -- attention -------------------------------------------------------------------------


@fuzz_settings
@given(b=sides(3, minimum=1), h=sides(3, minimum=1), sq=sides(65, minimum=1),
       skv=sides(65, minimum=1), d=sides(33, minimum=1), causal=st.booleans(),
       scale_factor=st.floats(0.05, 2.0), dtype=st.one_of(st.none(), dtype_args), seed=seeds)
def test_attention(be, b, h, sq, skv, d, causal, scale_factor, dtype, seed):
    name = name_of(dtype, "float32")
    q = random_values((b, h, sq, d), name, seed)
    k, v = (random_values((b, h, skv, d), name, seed + i) for i in (1, 2))
    scale = scale_factor / np.sqrt(d)
    with allocations(be) as ptrs:
        qp, kp, vp, op = upload(be, q), upload(be, k), upload(be, v), be.alloc(q.nbytes)
        ptrs += [qp, kp, vp, op]
        be.attention(qp, kp, vp, op, b, h, sq, skv, d, scale, causal, dtype=dtype)
        got = download(be, op, q.shape, name)
    factor = 1.0 if name in ("float32", "float64") else 2.0
    assert_close(got, attention_reference(q, k, v, scale, causal), jnp.dtype(name), scale=2.0,
                 factor=factor)


@fuzz_settings
@given(data=st.data())
def test_attention_invalid(be, data):
    draw = data.draw
    sizes = dict(batch=1, heads=2, seq_q=3, seq_kv=4, head_dim=5)
    with allocations(be) as ptrs:
        q, k, v, o = be.alloc(4 * 30), be.alloc(4 * 40), be.alloc(4 * 40), be.alloc(4 * 30)
        ptrs += [q, k, v, o]
        args = dict(q_ptr=q, k_ptr=k, v_ptr=v, o_ptr=o, **sizes, scale=0.5, causal=False)
        kind = draw(st.sampled_from(["zero", "scale", "scale_type", "big", "foreign"]))
        if kind == "zero":
            args[draw(st.sampled_from(list(sizes)))] = 0
            fragment = "must be > 0"
        elif kind == "scale":
            args["scale"] = draw(st.one_of(st.floats(max_value=0.0),
                                           st.sampled_from([np.nan, np.inf, -np.inf])))
            fragment = "scale must be a positive finite number"
        elif kind == "scale_type":
            args["scale"] = draw(st.sampled_from(["x", None, [0.5]]))
            fragment = "scale must be a real number"
        elif kind == "big":  # buffers hold one batch of this problem, not more
            args[draw(st.sampled_from(list(sizes)))] = draw(st.integers(6, 100))
            fragment = "past the end"
        else:
            args[draw(st.sampled_from(["q_ptr", "k_ptr", "v_ptr", "o_ptr"]))] = draw(
                st.sampled_from([0, 1 << 48]))
            fragment = "not inside any live allocation"
        expect_untouched(be, lambda: be.attention(**args), fragment, (o, 4 * 30))


# -- reduce, unary, binary -------------------------------------------------------------


@fuzz_settings
@given(shape=shapes(min_dims=1), data=st.data(), op=st.sampled_from(list(REDUCE)),
       dtype=st.one_of(st.none(), dtype_args), seed=seeds)
def test_reduce(be, shape, data, op, dtype, seed):
    axis = data.draw(st.integers(-len(shape), len(shape) - 1), label="axis")
    name = name_of(dtype, "float32")
    x = random_values(shape, name, seed)
    with allocations(be) as ptrs:
        kept = shape[:axis % len(shape)] + shape[axis % len(shape) + 1:]
        out_size = int(np.prod(kept))
        xp, out = upload(be, x), be.alloc(max(out_size, 1) * x.itemsize)
        ptrs += [xp, out]
        if shape[axis] == 0 and op in ("max", "min"):  # even when the result is empty too
            with pytest.raises(InvalidArgument, match="no identity"):
                be.reduce(op, xp, out, shape, axis, dtype=dtype)
            return
        be.reduce(op, xp, out, shape, axis, dtype=dtype)
        with np.errstate(all="ignore"), warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)  # the mean of an empty axis is NaN
            expected = REDUCE[op](x.astype(np.float64), axis=axis)
        got = download(be, out, expected.shape, name)
    assert_close(got, expected, jnp.dtype(name), scale=2.0 * np.sqrt(max(shape[axis], 1)))


@pytest.mark.parametrize("op", ["max", "min"])
def test_reduce_empty_axis_of_empty_result_raises(be, op):
    """Found by test_reduce: max/min over an empty axis returned silently when the
    result was empty too (shape (0, 0, 0)); jnp and oxijax.reduce raise."""
    with allocations(be) as ptrs:
        ptrs.append(be.alloc(4))
        with pytest.raises(InvalidArgument, match="no identity"):
            be.reduce(op, ptrs[0], ptrs[0], (0, 0, 0), 0)


@fuzz_settings
@given(data=st.data())
def test_reduce_invalid(be, data):
    draw = data.draw
    shape = draw(shapes(min_dims=1, max_size=64, min_side=1))
    rank, size = len(shape), int(np.prod(shape))
    with allocations(be) as ptrs:
        xp, out = be.alloc(4 * size), be.alloc(4 * size)
        ptrs += [xp, out]
        args = dict(op="sum", input_ptr=xp, output_ptr=out, shape=shape, axis=0)
        kind = draw(st.sampled_from(["empty", "axis", "axis_type", "op", "empty_axis", "big"]))
        if kind == "empty":
            args["shape"] = draw(st.sampled_from([[], ()]))
            fragment = "shape must not be empty"
        elif kind == "axis":
            args["axis"] = draw(st.one_of(st.integers(rank, rank + 9), st.integers(-rank - 9, -rank - 1)))
            fragment = "out of bounds"
        elif kind == "axis_type":
            args["axis"] = draw(st.sampled_from([0.0, None, "0", True]))
            fragment = "axis must be an integer"
        elif kind == "op":
            args["op"] = draw(st.sampled_from(["prod", "", 0, None, "relu"]))
            fragment = "op must be a ReduceOp"
        elif kind == "empty_axis":
            args.update(op=draw(st.sampled_from(["max", "min"])), shape=(*shape, 0),
                        axis=rank)
            fragment = "no identity"
        else:
            args["shape"] = (*shape, draw(st.integers(2, 5)))
            fragment = "past the end"
        expect_untouched(be, lambda: be.reduce(**args), fragment, (out, 4 * size))


@fuzz_settings
@given(n=sides(4096), offsets=st.tuples(st.integers(0, 3), st.integers(0, 3), st.integers(0, 3)),
       binary=st.booleans(), in_place=st.booleans(), data=st.data(),
       dtype=st.one_of(st.none(), dtype_args), seed=seeds)
def test_elementwise(be, n, offsets, binary, in_place, data, dtype, seed):
    """unary and binary on interior pointers (offsets in elements), optionally in place."""
    name = name_of(dtype, "float32")
    op = data.draw(st.sampled_from(list(BINARY if binary else UNARY)), label="op")
    low = 0.1 if op in ("log", "sqrt") else -3.0
    a = random_values(n + offsets[0], name, seed, low=low, high=3.0)
    b = random_values(n + offsets[1], name, seed + 1, low=0.25 if op == "div" else -2.0)
    size = a.itemsize
    with allocations(be) as ptrs:
        ap, bp = upload(be, a), upload(be, b)
        out = ap if in_place else be.alloc((n + offsets[2]) * size + 1)
        ptrs += [ap, bp] + ([] if in_place else [out])
        o_off = offsets[0] if in_place else offsets[2]
        x, y = ap + offsets[0] * size, bp + offsets[1] * size
        if binary:
            be.binary(op, x, y, out + o_off * size, n, dtype=dtype)
            reference = BINARY[op](a[offsets[0]:].astype(np.float64), b[offsets[1]:].astype(np.float64))
        else:
            be.unary(op, x, out + o_off * size, n, dtype=dtype)
            reference = UNARY[op](a[offsets[0]:].astype(np.float64))
        got = download(be, out, n + o_off, name)[o_off:]
    expected = host(reference, name).astype(np.float64)  # rounded once, as stored
    assert_close(got, expected, jnp.dtype(name), scale=0.0)


@fuzz_settings
@given(data=st.data(), binary=st.booleans())
def test_elementwise_invalid(be, data, binary):
    draw = data.draw
    n = draw(st.integers(1, 64))
    with allocations(be) as ptrs:
        a, b, out = be.alloc(4 * n), be.alloc(4 * n), be.alloc(4 * n)
        ptrs += [a, b, out]
        args = dict(op="add" if binary else "exp", input_ptr=a, output_ptr=out, n=n)
        if binary:
            args = dict(op="add", a_ptr=a, b_ptr=b, output_ptr=out, n=n)
        kind = draw(st.sampled_from(["op", "n_neg", "n_big", "offset", "freed", "dtype"]))
        if kind == "op":
            args["op"] = draw(st.sampled_from(["cube", "pow", "", 3, None]))
            fragment = "op must be a (Unary|Binary)Op"
        elif kind == "n_neg":
            args["n"] = draw(st.integers(-(2**62), -1))
            fragment = "n must be >= 0"
        elif kind == "n_big":
            args["n"] = n + draw(st.one_of(st.integers(1, 64), st.integers(2**40, 2**60)))
            fragment = "past the end"
        elif kind == "offset":
            args["output_ptr"] = out + 4 * draw(st.integers(1, n))
            fragment = "past the end|not inside any live allocation"
        elif kind == "freed":
            gone = be.alloc(4 * n)
            be.free(gone)
            args["output_ptr"] = gone
            fragment = "not inside any live allocation"
        else:
            args["dtype"] = draw(st.sampled_from(["int32", "float8", np.complex128]))
            fragment = "dtype must be one of"
        call = (lambda: be.binary(**args)) if binary else (lambda: be.unary(**args))
        if kind == "freed" and any(p <= args["output_ptr"] < p + 4 * n for p in ptrs):
            return  # the freed address was reused by a live allocation: a valid call
        expect_untouched(be, call, fragment, (out, 4 * n))


# -- memory: alloc, free, copies against a model of the bytes ---------------------------


class MemoryMachine(RuleBasedStateMachine):
    """Random alloc/free/copy sequences: the backend's bytes and live allocations always
    equal the model's; every misuse raises InvalidArgument and changes nothing."""

    live = Bundle("live")

    def __init__(self):
        super().__init__()
        self.be = CpuBackend()
        self.be.init()
        self.model: dict[int, bytearray] = {}
        self.freed: list[int] = []

    def holder(self, address):
        return next((p for p, data in self.model.items() if p <= address < p + len(data)), None)

    @rule(target=live, nbytes=st.integers(1, 300), seed=seeds)
    def alloc(self, nbytes, seed):
        ptr = self.be.alloc(nbytes)
        assert self.holder(ptr) is None and self.holder(ptr + nbytes - 1) is None
        data = np.random.default_rng(seed).integers(0, 256, nbytes, dtype=np.uint8)
        self.be.copy_htod(ptr, data)
        self.model[ptr] = bytearray(data.tobytes())
        return ptr

    @rule(nbytes=st.integers(-(2**40), 0))
    def alloc_nothing(self, nbytes):
        with pytest.raises(InvalidArgument, match="cannot allocate 0 bytes|nbytes must be >= 0"):
            self.be.alloc(nbytes)

    @rule(ptr=consumes(live))
    def free(self, ptr):
        self.be.free(ptr)
        del self.model[ptr]
        self.freed.append(ptr)

    @precondition(lambda self: self.freed)
    @rule(data=st.data())
    def free_again(self, data):
        ptr = data.draw(st.sampled_from(self.freed))
        if self.holder(ptr) is not None:
            return  # a later allocation reused the address
        with pytest.raises(InvalidArgument, match="already freed"):
            self.be.free(ptr)

    @rule(ptr=live, data=st.data())
    def free_interior(self, ptr, data):
        if len(self.model[ptr]) > 1:
            inner = ptr + data.draw(st.integers(1, len(self.model[ptr]) - 1))
            with pytest.raises(InvalidArgument, match="points inside"):
                self.be.free(inner)

    @rule(ptr=live, data=st.data(), seed=seeds)
    def copy_in(self, ptr, data, seed):
        size = len(self.model[ptr])
        offset = data.draw(st.integers(0, size - 1))
        nbytes = data.draw(st.integers(0, size - offset + 8))
        payload = np.random.default_rng(seed).integers(0, 256, nbytes, dtype=np.uint8)
        if nbytes and offset + nbytes > size:
            with pytest.raises(InvalidArgument, match="past the end"):
                self.be.copy_htod(ptr + offset, payload)
        else:
            self.be.copy_htod(ptr + offset, payload)
            self.model[ptr][offset:offset + nbytes] = payload.tobytes()

    @rule(ptr=live, data=st.data())
    def copy_out(self, ptr, data):
        size = len(self.model[ptr])
        offset = data.draw(st.integers(0, size - 1))
        nbytes = data.draw(st.integers(0, size - offset + 8))
        out = bytearray(nbytes)
        if nbytes and offset + nbytes > size:
            with pytest.raises(InvalidArgument, match="past the end"):
                self.be.copy_dtoh(out, ptr + offset)
        else:
            self.be.copy_dtoh(out, ptr + offset)
            assert out == self.model[ptr][offset:offset + nbytes]

    @rule(address=st.integers(0, 2**64), nbytes=st.integers(1, 64))
    def copy_foreign(self, address, nbytes):
        if self.holder(address) is not None:
            return
        with pytest.raises(InvalidArgument, match="not inside any live allocation"):
            self.be.copy_htod(address, bytes(nbytes))
        with pytest.raises(InvalidArgument, match="not inside any live allocation"):
            self.be.copy_dtoh(bytearray(nbytes), address)

    @rule(ptr=live)
    def copy_read_only(self, ptr):
        with pytest.raises(InvalidArgument, match="writable"):
            self.be.copy_dtoh(bytes(1), ptr)

    @invariant()
    def live_count(self):
        assert self.be.live_allocations == len(self.model)

    def teardown(self):
        for ptr in list(self.model):
            self.be.free(ptr)
        assert self.be.live_allocations == 0
        self.be.close()


# The profile's max_examples sequences of up to 20 steps each.
MemoryMachine.TestCase.settings = settings(fuzz_settings, stateful_step_count=20)
test_memory = MemoryMachine.TestCase
