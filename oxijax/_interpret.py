"""The CUDA interpreter: oxijax's CUDA kernels, launchers and CUDA FFI handlers, compiled
by the host compiler into ``oxijax._oxijax_interp`` (built with the CUDA kernels), run
on the CPU with every CUDA thread a fiber and every memory access checked.

Inside ``with oxijax.cuda_interpreter():`` the oxijax ops of programs lowered for the CPU
call the interpreted CUDA handlers (targets ``oxijax_interp_<op>``) instead of the CPU
kernels: the same code a GPU runs, on host memory, with out-of-bounds, race,
uninitialised-read and misalignment checks. A failed check raises the op's error with
the interpreter's report (kernel, thread, source line). Slow: meant for tests on small
shapes, never for speed.
"""

from __future__ import annotations

import contextlib
import importlib
import threading
from collections.abc import Iterator
from types import ModuleType

import jax

_lock = threading.Lock()
_active = False
_module: ModuleType | None = None


def available() -> bool:
    """Whether this build has the interpreter module (it is built with the CUDA kernels)."""
    try:
        module()
    except ImportError:
        return False
    return True


def module() -> ModuleType:
    """``oxijax._oxijax_interp``, its handlers registered with XLA on first use."""
    global _module
    with _lock:
        if _module is None:
            try:
                loaded = importlib.import_module("oxijax._oxijax_interp")
            except ImportError as error:
                raise ImportError(
                    "this build of oxijax has no CUDA interpreter: it is built with the CUDA "
                    "kernels, when the CUDA toolkit (nvcc) is found at install time"
                ) from error
            for platform, targets in loaded.registrations().items():
                for name, capsule in targets.items():
                    jax.ffi.register_ffi_target(name, capsule, platform=platform)
            _module = loaded
        return _module


def active() -> bool:
    """Whether CPU lowerings call the interpreted CUDA handlers now."""
    return _active


def interpreted_target(target: str) -> str:
    """The interpreted handler's target name for FFI target `target`."""
    return target.replace("oxijax_", "oxijax_interp_", 1)


@contextlib.contextmanager
def cuda_interpreter(schedule: str = "shuffle", seed: int = 0) -> Iterator[ModuleType]:
    """Runs oxijax's CUDA kernels in the CUDA interpreter for the programs traced and
    compiled inside the block (JAX's compilation caches are cleared on entry and exit).

    ``schedule``: the order of threads (and blocks) between synchronisation points,
    ``"forward"``, ``"reverse"`` or ``"shuffle"`` (a fresh permutation at every point,
    drawn from ``seed``). Yields the interpreter module (reports, kernels launched).
    """
    global _active
    interp = module()
    previous = (_active, interp.schedule())
    interp.set_schedule(schedule, seed)
    _active = True
    jax.clear_caches()
    try:
        yield interp
    finally:
        _active = previous[0]
        interp.set_schedule(*previous[1])
        jax.clear_caches()
