"""CudaBackend: the GPU's primary context (shared with JAX), driven from Python."""

from __future__ import annotations

from oxijax import _oxijax
from oxijax.backend._errors import DeviceError, from_driver
from oxijax.backend._pointer import PointerBackend
from oxijax.backend import _checks as checks

_native = _oxijax.backend


class _DeviceMemory:
    """Owns one cuMemAlloc; freed when the last reference (the backend's tracker, a JAX
    array made by to_jax_array) goes away."""

    __slots__ = ("device", "ptr")

    def __init__(self, device, ptr: int) -> None:
        self.device, self.ptr = device, ptr

    def __del__(self) -> None:
        try:
            self.device.free(self.ptr)
        except Exception:  # noqa: BLE001 - process exit: the driver may be gone already
            pass


class CudaBackend(PointerBackend):
    """Device `device` (a CUDA ordinal as the process sees it, 0 by default).

    init() retains the device's primary context and never fails: without a GPU, driver
    or CUDA build, device work raises DeviceError and synchronize() is a no-op.
    close() (or leaving ``with CudaBackend() as be:``) frees what is left and releases
    the context once; it never resets the device."""

    _kind = "cuda"

    def __init__(self, device: int = 0) -> None:
        super().__init__()
        self._ordinal = checks.count(device, "device")
        self._unavailable: DeviceError | None = None

    @property
    def device(self) -> int:
        return self._ordinal

    @property
    def has_device(self) -> bool:
        """Whether init() found a usable GPU (device work can run)."""
        return self._initialized and self._device is not None

    @property
    def stream(self) -> int:
        """The CUstream every op is enqueued on (0 without a device)."""
        return self._device.stream if self._device is not None else 0

    def mem_info(self) -> tuple[int, int]:
        """(free, total) bytes of the device, as cuMemGetInfo reports them."""
        self._require_init()
        return self._call(self._dev().mem_info)

    def __repr__(self) -> str:
        return (f"CudaBackend(device={self._ordinal}, initialized={self._initialized}, "
                f"has_device={self._device is not None}, "
                f"live_allocations={len(self._tracker)})")

    def _start(self) -> None:
        self._unavailable = None
        if not _native.cuda_built:
            self._unavailable = DeviceError("oxijax was built without CUDA kernels", -2,
                                            "OXIJAX_BUILT_WITHOUT_CUDA")
            return
        try:
            self._device = _native.CudaDevice(self._ordinal)
        except _native.DriverError as error:
            self._unavailable = from_driver(error)

    def _stop(self) -> None:
        device, self._device = self._device, None
        if device is not None:
            # Releases the context now, or once JAX drops the last array it was handed.
            self._call(device.close)

    def _no_device(self) -> Exception:
        return self._unavailable or DeviceError("no CUDA device", -1, "NO_DEVICE")

    def _call(self, fn, *args, nbytes=None):
        try:
            return fn(*args)
        except _native.DriverError as error:
            raise from_driver(error, nbytes) from None

    def _allocate(self, nbytes: int) -> tuple[int, object]:
        device = self._dev()
        ptr = self._call(device.alloc, nbytes, nbytes=nbytes)
        return ptr, _DeviceMemory(device, ptr)

    def _copy_in(self, dst: int, src_address: int, nbytes: int) -> None:
        self._call(self._dev().htod, dst, src_address, nbytes)

    def _copy_out(self, dst_address: int, src: int, nbytes: int) -> None:
        self._call(self._dev().dtoh, dst_address, src, nbytes)

    def _sync(self) -> None:
        if self._device is not None:
            self._call(self._device.synchronize)
