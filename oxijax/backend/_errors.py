"""The error classes of SPEC §2, with the trait's messages."""

from __future__ import annotations

# CUresult code of an out-of-memory failure (CUDA_ERROR_OUT_OF_MEMORY).
CUDA_ERROR_OUT_OF_MEMORY = 2


class BackendError(Exception):
    """Base of every error the pointer backend raises."""


class NotInitialized(BackendError):
    """A call before ``init()`` (or after ``close()``)."""

    def __init__(self) -> None:
        super().__init__("backend not initialized")


class InvalidArgument(BackendError, ValueError):
    """A bad argument or pointer; nothing was touched."""

    def __init__(self, message: str) -> None:
        super().__init__(f"invalid argument: {message}")


class Unsupported(BackendError, NotImplementedError):
    """An operation this backend does not provide."""

    def __init__(self, message: str) -> None:
        super().__init__(f"unsupported operation: {message}")


class DeviceError(BackendError, RuntimeError):
    """A failure of the device; ``code`` and ``name`` are the CUDA driver's error code
    and name (a CUresult: a failed kernel launch reports the driver's code with the
    meaning of the runtime's error, whose name is in the message), negative codes are
    oxijax's own (no driver, a build without CUDA, a closed backend)."""

    def __init__(self, message: str, code: int | None = None, name: str | None = None) -> None:
        self.code = code
        self.name = name
        detail = f"{name}: {message}" if name else message
        super().__init__(f"device error: {detail}")


class OutOfMemory(BackendError, MemoryError):
    """An allocation the device (or host) could not satisfy; the backend stays usable.
    ``host``: CpuBackend's device, the host, ran out (no GPU hint then)."""

    def __init__(self, nbytes: int | None = None, code: int | None = None,
                 name: str | None = None, host: bool = False) -> None:
        self.nbytes = nbytes
        self.code = code
        self.name = name
        wanted = f" ({nbytes} bytes requested)" if nbytes is not None else ""
        hint = ("the host could not provide it" if host else
                "If JAX runs in this process it preallocates most of the GPU's memory by "
                "default: set XLA_PYTHON_CLIENT_PREALLOCATE=false (or a smaller "
                "XLA_PYTHON_CLIENT_MEM_FRACTION) before importing jax")
        super().__init__(f"out of device memory{wanted}. {hint}")


def from_driver(error: Exception, nbytes: int | None = None) -> BackendError:
    """The backend error for a DriverError(code, name, message) of the extension."""
    code, name, message = error.args
    if code == CUDA_ERROR_OUT_OF_MEMORY:
        return OutOfMemory(nbytes, code, name)
    return DeviceError(message, code, name)
