"""The pointer backend's devices on raw addresses (use oxijax.backend)."""

from collections.abc import Sequence
from typing import Any


class DriverError(RuntimeError):
    pass

class HostAllocation:
    """
    Aligned host memory, freed with the object (MemoryError if the host cannot provide it).
    """

    def __init__(self, nbytes: int) -> None: ...

    @property
    def address(self) -> int: ...

    @property
    def size(self) -> int: ...

def live_host_allocations() -> int:
    """How many HostAllocations this process holds."""

def live_host_bytes() -> int:
    """The bytes they hold."""

def report_live_host_memory_at_exit() -> None:
    """
    At interpreter exit, after finalisation, prints the live host allocations to stderr.
    """

class CpuDevice:
    def __init__(self) -> None: ...

    def unary(self, dtype: int, op: int, x: int, y: int, n: int) -> None: ...

    def binary(self, dtype: int, op: int, a: int, b: int, out: int, n: int) -> None: ...

    def reduce(self, dtype: int, op: int, x: int, out: int, outer: int, axis: int, inner: int) -> None: ...

    def gemm(self, dtype: int, trans_a: bool, trans_b: bool, m: int, n: int, k: int, alpha: float, a: int, lda: int, stride_a: int, b: int, ldb: int, stride_b: int, beta: float, c: int, ldc: int, stride_c: int, batch: int) -> None:
        """Row-major strided batch, c in place (see problems.h)."""

    def conv2d(self, dtype: int, x: int, input: Sequence[int], w: int, filter: Sequence[int], out: int, output: Sequence[int], stride: Sequence[int], padding: Sequence[int]) -> None: ...

    def attention(self, dtype: int, q: int, k: int, v: int, out: int, batch: int, heads: int, seq_q: int, seq_kv: int, head_dim: int, scale: float, causal: bool) -> None: ...

def host_copy(dst: int, src: int, nbytes: int) -> None:
    """memmove(dst, src, nbytes) on host addresses."""

cuda_built: bool = ...

class CudaDevice:
    def __init__(self, ordinal: int) -> None: ...

    @property
    def ordinal(self) -> int: ...

    @property
    def stream(self) -> int: ...

    def alloc(self, nbytes: int) -> int: ...

    def free(self, ptr: int) -> None: ...

    def htod(self, dst: int, src: int, nbytes: int) -> None: ...

    def dtoh(self, dst: int, src: int, nbytes: int) -> None: ...

    def synchronize(self) -> None: ...

    def mem_info(self) -> tuple[int, int]: ...

    def close(self) -> None: ...

    def unary(self, dtype: int, op: int, x: int, y: int, n: int) -> None: ...

    def binary(self, dtype: int, op: int, a: int, b: int, out: int, n: int) -> None: ...

    def reduce(self, dtype: int, op: int, x: int, out: int, outer: int, axis: int, inner: int) -> None: ...

    def gemm(self, dtype: int, trans_a: bool, trans_b: bool, m: int, n: int, k: int, alpha: float, a: int, lda: int, stride_a: int, b: int, ldb: int, stride_b: int, beta: float, c: int, ldc: int, stride_c: int, batch: int) -> None:
        """Row-major strided batch, c in place (see problems.h)."""

    def conv2d(self, dtype: int, x: int, input: Sequence[int], w: int, filter: Sequence[int], out: int, output: Sequence[int], stride: Sequence[int], padding: Sequence[int]) -> None: ...

    def attention(self, dtype: int, q: int, k: int, v: int, out: int, batch: int, heads: int, seq_q: int, seq_kv: int, head_dim: int, scale: float, causal: bool) -> None: ...

def dlpack_view(ptr: int, shape: Sequence[int], dtype: int, device_type: int, device_id: int, owner: object) -> Any: ...
