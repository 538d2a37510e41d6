"""ComputeBackend: the Rust trait as a Python abstract class, same method names and
argument order. Pointers are Python ints; ``dtype=`` (keyword only) opens the dtypes
beyond the trait's (gemm: float64 column-major; everything else: float32 row-major)."""

from __future__ import annotations

import abc
from collections.abc import Sequence


class ComputeBackend(abc.ABC):
    """The trait. Every method checks, in order: initialised (else ``NotInitialized``),
    arguments (``InvalidArgument``), pointers known to this backend and large enough for
    what the call reads or writes (``InvalidArgument``), then runs on the device
    (``DeviceError``, ``OutOfMemory``)."""

    @abc.abstractmethod
    def name(self) -> str:
        """The backend's name ("cuda", "cpu")."""

    @abc.abstractmethod
    def init(self) -> None:
        """Selects the device; a second call is a no-op."""

    @abc.abstractmethod
    def is_initialized(self) -> bool:
        """Whether ``init()`` has run (and ``close()`` has not since)."""

    @abc.abstractmethod
    def gemm(self, trans_a, trans_b, m: int, n: int, k: int, alpha: float, a_ptr: int,
             lda: int, b_ptr: int, ldb: int, beta: float, c_ptr: int, ldc: int, *,
             dtype=None) -> None:
        """C = alpha·op(A)·op(B) + beta·C on column-major matrices (C is m×n).

        ``trans_a``/``trans_b``: ``Transpose`` or "N", "T", "C" (C equals T for real
        dtypes). op(A) is m×k, stored k×m when transposed; ``lda`` is at least the stored
        row count (m or k), likewise ``ldb`` and ``ldc >= m``; rows past m in C are never
        touched. ``m``, ``n``, ``k`` must be > 0. With ``beta == 0`` C is not read.
        Default dtype float64."""

    def batched_gemm(self, trans_a, trans_b, m: int, n: int, k: int, alpha: float, a_ptr: int,
                     lda: int, stride_a: int, b_ptr: int, ldb: int, stride_b: int, beta: float,
                     c_ptr: int, ldc: int, stride_c: int, batch_count: int, *,
                     dtype=None) -> None:
        """gemm for each of batch_count matrices; strides count elements of the dtype.

        This default runs one gemm per matrix; backends override it with one call."""
        from oxijax.backend._checks import dtype_of

        itemsize = dtype_of(dtype, "float64")[2]
        for i in range(batch_count):
            self.gemm(trans_a, trans_b, m, n, k, alpha, a_ptr + i * stride_a * itemsize, lda,
                      b_ptr + i * stride_b * itemsize, ldb, beta,
                      c_ptr + i * stride_c * itemsize, ldc, dtype=dtype)

    @abc.abstractmethod
    def conv2d_forward(self, input_ptr: int, input_shape: Sequence[int], filter_ptr: int,
                       filter_shape: Sequence[int], output_ptr: int,
                       output_shape: Sequence[int], stride: Sequence[int],
                       padding: Sequence[int], *, dtype=None) -> None:
        """NCHW input × KCRS filter → NKPQ output (cross-correlation, zero padding).

        Shapes have rank 4 and positive sizes, ``stride`` (≥ 1) and ``padding`` (≥ 0) have
        length 2, channels agree, and ``output_shape`` is (N, K, P, Q) with
        P = (H + 2·pad_h − R) // stride_h + 1 (likewise Q). Default float32."""

    @abc.abstractmethod
    def attention(self, q_ptr: int, k_ptr: int, v_ptr: int, o_ptr: int, batch: int,
                  heads: int, seq_q: int, seq_kv: int, head_dim: int, scale: float,
                  causal: bool, *, dtype=None) -> None:
        """softmax(scale·Q·Kᵀ)·V over row-major [batch, heads, seq, head_dim] tensors:
        Q and O have seq_q rows, K and V seq_kv. Every size must be > 0 and ``scale``
        positive and finite. Causal: query i sees key j iff j ≤ i + (seq_kv − seq_q); a
        query that sees no key gets zeros. Default float32."""

    @abc.abstractmethod
    def reduce(self, op, input_ptr: int, output_ptr: int, shape: Sequence[int], axis: int, *,
               dtype=None) -> None:
        """Reduces the row-major array of ``shape`` over ``axis`` (negative allowed) with
        ``op`` (``ReduceOp`` or "sum", "max", "min", "mean"); the output has ``shape``
        without ``axis``. An empty shape or an axis out of range is ``InvalidArgument``.
        NaN propagates through max/min; the mean of an empty axis is NaN. Default float32."""

    @abc.abstractmethod
    def unary(self, op, input_ptr: int, output_ptr: int, n: int, *, dtype=None) -> None:
        """output[i] = op(input[i]) for ``n`` elements (``UnaryOp`` or "relu", "sigmoid",
        "tanh", "exp", "log", "sqrt", "abs", "neg"); ``n == 0`` is a no-op. In place
        (output == input) is allowed. Default float32."""

    @abc.abstractmethod
    def binary(self, op, a_ptr: int, b_ptr: int, output_ptr: int, n: int, *,
               dtype=None) -> None:
        """output[i] = op(a[i], b[i]) for ``n`` elements (``BinaryOp`` or "add", "sub",
        "mul", "div", "max", "min"); ``n == 0`` is a no-op. Default float32."""

    @abc.abstractmethod
    def synchronize(self) -> None:
        """Waits for all work submitted so far."""

    @abc.abstractmethod
    def alloc(self, nbytes: int) -> int:
        """``nbytes`` (> 0) of backend memory; returns its address. ``OutOfMemory`` when
        the device (or host) cannot provide it."""

    @abc.abstractmethod
    def free(self, ptr: int) -> None:
        """Frees an allocation by its start address (or releases an imported array).
        An unknown, interior or already-freed pointer is ``InvalidArgument``."""

    @abc.abstractmethod
    def copy_htod(self, dst: int, src) -> None:
        """Copies the bytes-like src into backend memory at dst."""

    @abc.abstractmethod
    def copy_dtoh(self, dst, src: int) -> None:
        """Fills the writable buffer dst from backend memory at src."""
