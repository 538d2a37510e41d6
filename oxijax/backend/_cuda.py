"""CudaBackend: the GPU's primary context (shared with JAX), driven from Python; or,
with ``interpret=True``, the same C++ device class on the CUDA interpreter."""

from __future__ import annotations

from oxijax import _oxijax
from oxijax.backend._errors import DeviceError, InvalidArgument, Unsupported, from_driver
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


def _interpreted_device_class():
    """``oxijax._oxijax_interp.backend.CudaDevice``; Unsupported when this build has no
    CUDA interpreter (it is built with the CUDA kernels, when nvcc is found)."""
    from oxijax import _interpret

    try:
        return _interpret.module().backend.CudaDevice
    except ImportError as error:
        raise Unsupported(
            "CudaBackend(interpret=True) needs the CUDA interpreter (oxijax._oxijax_interp), "
            f"which this build of oxijax lacks ({error})") from error


class CudaBackend(PointerBackend):
    """Device `device` (a CUDA ordinal as the process sees it, 0 by default).

    init() retains the device's primary context and never fails: without a GPU, driver
    or CUDA build, device work raises DeviceError and synchronize() is a no-op.
    close() (or leaving ``with CudaBackend() as be:``) frees what is left and releases
    the context once; it never resets the device.

    ``interpret=True`` runs the same device class (ffi/backend/cuda_device.cc), with the
    same CUDA kernels and launchers, on the CUDA interpreter (``oxijax._interpret``)
    instead of a GPU: device memory is host memory between redzones (fresh bytes 0xff),
    there is one device, ordinal 0 (another ordinal behaves like a missing GPU: init()
    succeeds, device work raises DeviceError), with an H200's memory size for mem_info(),
    and its stream runs work at once. Every access of every CUDA thread is checked: an
    out-of-bounds, racy, uninitialised or misaligned access stops the kernel and the op
    raises DeviceError whose message holds the interpreter's report (kernel, thread,
    source line; also in ``oxijax._oxijax_interp.take_reports()``). Same checks, errors
    and lifetime as on a GPU; slow, so for tests on small shapes. Needs no GPU, but a
    build with the interpreter: without it the constructor raises Unsupported. JAX never
    sees this memory as GPU memory (import_jax_array copies in, to_jax_array copies out)."""

    _kind = "cuda"

    def __init__(self, device: int = 0, *, interpret: bool = False) -> None:
        super().__init__()
        self._ordinal = checks.count(device, "device")
        if not isinstance(interpret, bool):
            raise InvalidArgument(f"interpret must be True or False; got {interpret!r}")
        self._interpret = interpret
        self._device_class = _interpreted_device_class() if interpret else None
        self._unavailable: DeviceError | None = None

    @property
    def device(self) -> int:
        return self._ordinal

    @property
    def has_device(self) -> bool:
        """Whether init() found a usable GPU (or, interpreted, the interpreter's device)."""
        return self._initialized and self._device is not None

    @property
    def interpreted(self) -> bool:
        """Whether the device is the CUDA interpreter's (``interpret=True``), not a GPU."""
        return self._interpret

    @property
    def stream(self) -> int:
        """The CUstream every op is enqueued on (0 without a device)."""
        return self._device.stream if self._device is not None else 0

    def mem_info(self) -> tuple[int, int]:
        """(free, total) bytes of the device, as cuMemGetInfo reports them."""
        self._require_init()
        return self._call(self._dev().mem_info)

    def __repr__(self) -> str:
        interpret = ", interpret=True" if self._interpret else ""
        return (f"CudaBackend(device={self._ordinal}{interpret}, "
                f"initialized={self._initialized}, has_device={self._device is not None}, "
                f"live_allocations={len(self._tracker)})")

    def _start(self) -> None:
        self._unavailable = None
        if self._interpret:
            try:
                self._device = self._device_class(self._ordinal)
            except _native.DriverError as error:
                self._unavailable = from_driver(error)
            return
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
