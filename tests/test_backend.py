"""The seed's tests (oxicuda 0.1.8, cuda_backend.rs, module `tests`), ported: they hold
for CudaBackend with or without a GPU, and for CpuBackend."""

from __future__ import annotations

import math

import numpy as np
import pytest

from oxijax.backend import (
    BackendError,
    BinaryOp,
    ComputeBackend,
    CpuBackend,
    CudaBackend,
    DeviceError,
    InvalidArgument,
    NotInitialized,
    OutOfMemory,
    ReduceOp,
    Transpose,
    UnaryOp,
    Unsupported,
)

BACKENDS = [CudaBackend, CpuBackend]


@pytest.fixture(params=BACKENDS, ids=["cuda", "cpu"])
def backend(request):
    be = request.param()
    be.init()
    yield be
    be.close()


@pytest.mark.parametrize("cls", BACKENDS)
def test_new_is_uninitialized(cls):
    assert not cls().is_initialized()


@pytest.mark.parametrize("cls", BACKENDS)
def test_init_and_double_init(cls):
    be = cls()
    assert be.init() is None
    assert be.init() is None
    assert be.is_initialized()
    be.close()
    be.close()  # closing twice is a no-op
    assert not be.is_initialized()


def test_names():
    assert CudaBackend().name() == "cuda"
    assert CpuBackend().name() == "cpu"


@pytest.mark.parametrize("cls", BACKENDS)
def test_used_through_the_abstract_type(cls):
    be: ComputeBackend = cls()
    be.init()
    assert isinstance(be, ComputeBackend)
    assert be.is_initialized()
    assert be.synchronize() is None
    be.close()


def test_abstract_class_cannot_be_instantiated():
    with pytest.raises(TypeError):
        ComputeBackend()


@pytest.mark.parametrize("cls", BACKENDS)
def test_operations_fail_when_not_initialized(cls):
    be = cls()
    calls = [
        lambda: be.synchronize(),
        lambda: be.gemm("N", "N", 1, 1, 1, 1.0, 0, 1, 0, 1, 0.0, 0, 1),
        lambda: be.batched_gemm("N", "N", 1, 1, 1, 1.0, 0, 1, 1, 0, 1, 1, 0.0, 0, 1, 1, 1),
        lambda: be.conv2d_forward(0, [1, 1, 1, 1], 0, [1, 1, 1, 1], 0, [1, 1, 1, 1], [1, 1],
                                  [0, 0]),
        lambda: be.attention(0, 0, 0, 0, 1, 1, 1, 1, 1, 1.0, False),
        lambda: be.reduce("sum", 0, 0, [1], 0),
        lambda: be.unary("relu", 0, 0, 0),
        lambda: be.binary("add", 0, 0, 0, 0),
        lambda: be.alloc(1024),
        lambda: be.free(0),
        lambda: be.copy_htod(0, b"\x01\x02\x03"),
        lambda: be.copy_dtoh(bytearray(4), 0),
    ]
    for call in calls:
        with pytest.raises(NotInitialized, match="backend not initialized"):
            call()


def test_conv2d_validates_shapes(backend):
    good = dict(x=[1, 3, 32, 32], w=[64, 3, 3, 3], out=[1, 64, 30, 30], s=[1, 1], p=[0, 0])
    for key, bad in [("x", [1, 3, 32]), ("w", [64, 3, 3]), ("out", [1, 64, 30]), ("s", [1]),
                     ("p", [0, 0, 0]), ("s", [0, 1]), ("w", [64, 4, 3, 3]),
                     ("out", [1, 64, 31, 30])]:
        a = dict(good, **{key: bad})
        with pytest.raises(InvalidArgument):
            backend.conv2d_forward(0, a["x"], 0, a["w"], 0, a["out"], a["s"], a["p"])


@pytest.mark.parametrize("args", [
    (1, 1, 0, 128, 64, 0.125), (1, 1, 128, 0, 64, 0.125), (1, 1, 128, 128, 0, 0.125),
    (0, 1, 128, 128, 64, 0.125), (1, 0, 128, 128, 64, 0.125),
    (1, 1, 128, 128, 64, 0.0), (1, 1, 128, 128, 64, -1.0), (1, 1, 128, 128, 64, math.nan),
    (1, 1, 128, 128, 64, math.inf)])
def test_attention_validates_params(backend, args):
    with pytest.raises(InvalidArgument):
        backend.attention(0, 0, 0, 0, *args, False)


def test_reduce_validates_axis(backend):
    with pytest.raises(InvalidArgument, match="out of bounds"):
        backend.reduce(ReduceOp.SUM, 0, 0, [10, 20], 2)
    with pytest.raises(InvalidArgument, match="must not be empty"):
        backend.reduce(ReduceOp.SUM, 0, 0, [], 0)
    with pytest.raises(InvalidArgument):
        backend.reduce("median", 0, 0, [10], 0)


def test_gemm_validates(backend):
    for m, n, k in [(0, 2, 2), (2, 0, 2), (2, 2, 0)]:
        with pytest.raises(InvalidArgument, match="must all be > 0"):
            backend.gemm(Transpose.N, Transpose.N, m, n, k, 1.0, 0, 2, 0, 2, 0.0, 0, 2)
    # leading dimensions smaller than the stored rows
    with pytest.raises(InvalidArgument, match="lda"):
        backend.gemm("N", "N", 3, 2, 2, 1.0, 0, 2, 0, 2, 0.0, 0, 3)
    with pytest.raises(InvalidArgument, match="lda"):
        backend.gemm("T", "N", 3, 2, 4, 1.0, 0, 3, 0, 4, 0.0, 0, 3)
    with pytest.raises(InvalidArgument, match="ldb"):
        backend.gemm("N", "T", 2, 3, 2, 1.0, 0, 2, 0, 2, 0.0, 0, 2)
    with pytest.raises(InvalidArgument, match="ldc"):
        backend.gemm("N", "N", 3, 2, 2, 1.0, 0, 3, 0, 2, 0.0, 0, 2)
    with pytest.raises(InvalidArgument, match="trans_a"):
        backend.gemm("X", "N", 1, 1, 1, 1.0, 0, 1, 0, 1, 0.0, 0, 1)


def test_unary_binary_empty_is_noop(backend):
    assert backend.unary(UnaryOp.RELU, 0, 0, 0) is None
    assert backend.binary(BinaryOp.ADD, 0, 0, 0, 0) is None


def test_alloc_zero_bytes_is_error(backend):
    with pytest.raises(InvalidArgument, match="0 bytes"):
        backend.alloc(0)


def test_copy_empty_is_noop(backend):
    assert backend.copy_htod(0, b"") is None
    assert backend.copy_dtoh(bytearray(), 0) is None


def test_free_unknown_pointer_is_invalid(backend):
    with pytest.raises(InvalidArgument):
        backend.free(0x1234)


@pytest.mark.parametrize("cls", BACKENDS)
def test_repr(cls):
    text = repr(cls())
    assert cls.__name__ in text and "initialized" in text


def test_error_classes():
    assert str(NotInitialized()) == "backend not initialized"
    assert isinstance(InvalidArgument("x"), ValueError)
    assert isinstance(Unsupported("x"), NotImplementedError)
    assert str(Unsupported("x")) == "unsupported operation: x"
    error = DeviceError("boom", 700, "CUDA_ERROR_ILLEGAL_ADDRESS")
    assert isinstance(error, RuntimeError) and error.code == 700
    assert error.name == "CUDA_ERROR_ILLEGAL_ADDRESS" and "boom" in str(error)
    oom = OutOfMemory(1 << 40)
    assert isinstance(oom, MemoryError) and "out of device memory" in str(oom)
    assert "XLA_PYTHON_CLIENT_PREALLOCATE" in str(oom)
    for cls in (NotInitialized, InvalidArgument, Unsupported, DeviceError, OutOfMemory):
        assert issubclass(cls, BackendError)


def test_cuda_without_device_raises_device_error():
    be = CudaBackend()
    be.init()
    if be.has_device:
        pytest.skip("a GPU is usable here (the no-GPU path runs in test_backend_gpu.py)")
    with pytest.raises(DeviceError) as info:
        be.alloc(16)
    assert info.value.code is not None and info.value.name
    assert be.synchronize() is None
    # Arguments and pointers are checked before the device.
    with pytest.raises(InvalidArgument):
        be.alloc(0)
    with pytest.raises(InvalidArgument):
        be.unary("relu", 0, 0, 4)
    be.close()


def test_default_backend_is_usable():
    from oxijax.backend import default_backend

    with default_backend() as be:
        ptr = be.alloc(16)
        be.copy_htod(ptr, np.arange(4, dtype=np.float32).tobytes())
        be.unary("neg", ptr, ptr, 4)
        out = np.empty(4, np.float32)
        be.copy_dtoh(out, ptr)
        np.testing.assert_array_equal(out, -np.arange(4, dtype=np.float32))
