"""Moving memory between JAX and a backend: zero-copy through DLPack where the memory
already lives where it is wanted, one copy otherwise."""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np

from oxijax import _oxijax
from oxijax.backend import _checks as checks
from oxijax.backend._cpu import CpuBackend
from oxijax.backend._cuda import CudaBackend
from oxijax.backend._errors import InvalidArgument

_DLPACK_CPU, _DLPACK_CUDA = 1, 2


def _same_place(backend, device) -> bool:
    if isinstance(backend, CpuBackend):
        return device.platform == "cpu"
    if isinstance(backend, CudaBackend) and backend.has_device and not backend.interpreted:
        hardware_id = getattr(device, "local_hardware_id", None)
        return device.platform == "gpu" and (
            hardware_id if hardware_id is not None else device.id) == backend.device
    return False


def import_jax_array(backend, array: jax.Array) -> int:
    """A pointer to `array`'s data inside `backend`; free it with ``backend.free(ptr)``.

    Waits until the array is computed. On the array's own device (CPU arrays for
    CpuBackend, arrays on the same GPU for CudaBackend) the pointer is the array's
    memory, and the backend keeps the array alive until the pointer is freed (writing
    through it changes the array); elsewhere the data is copied into a new allocation."""
    backend._require_init()
    if not isinstance(array, jax.Array):
        raise InvalidArgument(f"array must be a jax.Array; got {type(array).__name__}")
    if len(array.devices()) != 1 or not array.is_fully_addressable:
        raise InvalidArgument("array must live on a single device (not sharded)")
    if array.nbytes == 0:
        raise InvalidArgument("cannot import an empty array")
    array.block_until_ready()
    if _same_place(backend, next(iter(array.devices()))):
        ptr = array.unsafe_buffer_pointer()
        backend._tracker.add(ptr, array.nbytes, array, imported=True)
        return ptr
    host = np.ascontiguousarray(np.asarray(array))
    ptr = backend.alloc(host.nbytes)
    try:
        backend.copy_htod(ptr, host.view(np.uint8).reshape(-1))
    except BaseException:
        backend.free(ptr)
        raise
    return ptr


def to_jax_array(backend, ptr: int, shape, dtype="float32") -> jax.Array:
    """A JAX array of `shape` and `dtype` over backend memory at `ptr`.

    Zero-copy through DLPack (waiting for the backend's queued work first): the array is
    a view that keeps the memory alive even after ``backend.free(ptr)``, and sees later
    writes to it. Where JAX cannot take the memory (no JAX GPU backend) it is copied."""
    backend._require_init()
    shape = tuple(checks.dims(shape, "shape"))
    name, code, size = checks.dtype_of(dtype, "float32")
    nbytes = math.prod(shape) * size
    if nbytes == 0:
        return jnp.zeros(shape, name)
    ptr = checks.pointer(ptr, "ptr")
    owner = backend._tracker.find(ptr, nbytes, "ptr").owners[-1]
    backend.synchronize()
    if isinstance(backend, CudaBackend):
        # The interpreter's device memory is host memory that no JAX client owns: copied.
        usable = backend.has_device and not backend.interpreted
        where = (_DLPACK_CUDA, backend.device) if usable else None
    else:
        where = (_DLPACK_CPU, 0)
    if where is not None:
        view = _oxijax.backend.dlpack_view(ptr, list(shape), code, *where, owner)
        try:
            return jax.dlpack.from_dlpack(view)
        except (RuntimeError, TypeError, ValueError):
            pass  # JAX has no client for that device: copy below
    host = bytearray(nbytes)
    backend.copy_dtoh(host, ptr)
    return jnp.asarray(np.frombuffer(host, dtype=np.dtype(name)).reshape(shape))
