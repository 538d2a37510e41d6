"""CpuBackend: host memory and the CPU kernels of the JAX path; always available."""

from __future__ import annotations

import numpy as np

from oxijax import _oxijax
from oxijax.backend._pointer import PointerBackend

_native = _oxijax.backend
_ALIGN = 64  # bytes; every allocation starts on a cache line


class CpuBackend(PointerBackend):
    """The same contract as CudaBackend on host memory; ops block until done."""

    _kind = "cpu"

    def _start(self) -> None:
        self._device = _native.CpuDevice()

    def _stop(self) -> None:
        self._device = None

    def _allocate(self, nbytes: int) -> tuple[int, object]:
        # The NumPy buffer owns the memory: freeing drops it, an exported JAX view keeps it.
        buffer = np.empty(nbytes + _ALIGN - 1, dtype=np.uint8)
        offset = -buffer.ctypes.data % _ALIGN
        return buffer.ctypes.data + offset, buffer

    def _copy_in(self, dst: int, src_address: int, nbytes: int) -> None:
        _native.host_copy(dst, src_address, nbytes)

    def _copy_out(self, dst_address: int, src: int, nbytes: int) -> None:
        _native.host_copy(dst_address, src, nbytes)

    def _sync(self) -> None:
        pass  # every op has finished when it returns
