"""CpuBackend: host memory and the CPU kernels of the JAX path; always available."""

from __future__ import annotations

from oxijax import _oxijax
from oxijax.backend._errors import OutOfMemory
from oxijax.backend._pointer import PointerBackend

_native = _oxijax.backend


class CpuBackend(PointerBackend):
    """The same contract as CudaBackend on host memory; ops block until done."""

    _kind = "cpu"

    def _start(self) -> None:
        self._device = _native.CpuDevice()

    def _stop(self) -> None:
        self._device = None

    def _allocate(self, nbytes: int) -> tuple[int, object]:
        # The HostAllocation owns the memory (64-byte aligned): freeing drops it, an
        # exported JAX view keeps it. _oxijax.backend.live_host_allocations() counts them.
        try:
            memory = _native.HostAllocation(nbytes)
        except MemoryError:
            raise OutOfMemory(nbytes, host=True) from None
        return memory.address, memory

    def _call(self, fn, *args):
        try:
            return fn(*args)
        except MemoryError:  # a kernel's scratch allocation (std::bad_alloc)
            raise OutOfMemory(host=True) from None

    def _copy_in(self, dst: int, src_address: int, nbytes: int) -> None:
        _native.host_copy(dst, src_address, nbytes)

    def _copy_out(self, dst_address: int, src: int, nbytes: int) -> None:
        _native.host_copy(dst_address, src, nbytes)

    def _sync(self) -> None:
        pass  # every op has finished when it returns
