"""oxijax.backend: the Rust ``ComputeBackend`` trait for plain Python (SPEC §2).

Pointers are Python ints into memory the backend allocated (or imported from JAX); ops
take them with the trait's arguments, in the trait's order::

    from oxijax.backend import default_backend
    with default_backend() as be:            # CudaBackend with a GPU, else CpuBackend
        ptr = be.alloc(4 * 8)
        ...

``CudaBackend(interpret=True)`` is the same CUDA device code on the CUDA interpreter, no
GPU needed: every kernel access checked, for tests on small shapes (see CudaBackend).
"""

from oxijax._enums import BinaryOp, ReduceOp, Transpose, UnaryOp
from oxijax.backend._abc import ComputeBackend
from oxijax.backend._cpu import CpuBackend
from oxijax.backend._cuda import CudaBackend
from oxijax.backend._errors import (
    BackendError,
    DeviceError,
    InvalidArgument,
    NotInitialized,
    OutOfMemory,
    Unsupported,
)
from oxijax.backend._interop import import_jax_array, to_jax_array


def default_backend(device: int = 0) -> ComputeBackend:
    """An initialised CudaBackend when a GPU is usable, else an initialised CpuBackend."""
    cuda = CudaBackend(device)
    cuda.init()
    if cuda.has_device:
        return cuda
    cpu = CpuBackend()
    cpu.init()
    return cpu


__all__ = [
    "BackendError",
    "BinaryOp",
    "ComputeBackend",
    "CpuBackend",
    "CudaBackend",
    "DeviceError",
    "InvalidArgument",
    "NotInitialized",
    "OutOfMemory",
    "ReduceOp",
    "Transpose",
    "Unsupported",
    "UnaryOp",
    "default_backend",
    "import_jax_array",
    "to_jax_array",
]
