"""ComputeBackend: the Rust trait as a Python abstract class, same method names and
argument order. Pointers are Python ints; ``dtype=`` (keyword only) opens the dtypes
beyond the trait's (gemm: float64 column-major; everything else: float32 row-major)."""

from __future__ import annotations

import abc
from collections.abc import Sequence


class ComputeBackend(abc.ABC):
    @abc.abstractmethod
    def name(self) -> str: ...

    @abc.abstractmethod
    def init(self) -> None:
        """Selects the device; a second call is a no-op."""

    @abc.abstractmethod
    def is_initialized(self) -> bool: ...

    @abc.abstractmethod
    def gemm(self, trans_a, trans_b, m: int, n: int, k: int, alpha: float, a_ptr: int,
             lda: int, b_ptr: int, ldb: int, beta: float, c_ptr: int, ldc: int, *,
             dtype=None) -> None:
        """C = alpha·op(A)·op(B) + beta·C on column-major matrices (C is m×n)."""

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
        """NCHW input × KCRS filter → NKPQ output (cross-correlation, zero padding)."""

    @abc.abstractmethod
    def attention(self, q_ptr: int, k_ptr: int, v_ptr: int, o_ptr: int, batch: int,
                  heads: int, seq_q: int, seq_kv: int, head_dim: int, scale: float,
                  causal: bool, *, dtype=None) -> None:
        """softmax(scale·Q·Kᵀ)·V over [batch, heads, seq, head_dim] tensors."""

    @abc.abstractmethod
    def reduce(self, op, input_ptr: int, output_ptr: int, shape: Sequence[int], axis: int, *,
               dtype=None) -> None: ...

    @abc.abstractmethod
    def unary(self, op, input_ptr: int, output_ptr: int, n: int, *, dtype=None) -> None: ...

    @abc.abstractmethod
    def binary(self, op, a_ptr: int, b_ptr: int, output_ptr: int, n: int, *,
               dtype=None) -> None: ...

    @abc.abstractmethod
    def synchronize(self) -> None:
        """Waits for all work submitted so far."""

    @abc.abstractmethod
    def alloc(self, nbytes: int) -> int: ...

    @abc.abstractmethod
    def free(self, ptr: int) -> None: ...

    @abc.abstractmethod
    def copy_htod(self, dst: int, src) -> None:
        """Copies the bytes-like src into backend memory at dst."""

    @abc.abstractmethod
    def copy_dtoh(self, dst, src: int) -> None:
        """Fills the writable buffer dst from backend memory at src."""
