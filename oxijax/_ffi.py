"""Loads the compiled extension and registers its FFI handlers with XLA."""

from __future__ import annotations

import jax
import jax.export

from oxijax._extension import _oxijax

_PLATFORMS = {"cpu": "cpu", "CUDA": "cuda"}  # FFI platform name -> jax lowering platform


def _register() -> dict[str, list[str]]:
    registered: dict[str, list[str]] = {}
    for platform, targets in _oxijax.registrations().items():
        for name, capsule in targets.items():
            jax.ffi.register_ffi_target(name, capsule, platform=platform)
            registered.setdefault(_PLATFORMS[platform], []).append(name)
    return registered


def cuda_available() -> bool:
    """Whether this build has CUDA kernels and JAX sees a CUDA GPU to run them on."""
    if "cuda" not in REGISTERED_TARGETS:
        return False
    try:
        return bool(jax.devices("cuda"))
    except RuntimeError:
        return False


def export_disabled_checks() -> list[jax.export.DisabledSafetyCheck]:
    """The safety checks that ``jax.export.export`` must skip to serialize programs that
    call oxijax: one ``DisabledSafetyCheck.custom_call`` per oxijax FFI target (forward
    and backward). JAX refuses custom calls it does not know to be stable; oxijax's
    target names and attributes are (README: Exporting), so pass::

        jax.export.export(jax.jit(f), disabled_checks=oxijax.export_disabled_checks())
    """
    names = sorted({name for targets in REGISTERED_TARGETS.values() for name in targets})
    return [jax.export.DisabledSafetyCheck.custom_call(name) for name in names]


#: Lowering platform -> FFI target names registered on it.
REGISTERED_TARGETS = _register()
BUILD_INFO = dict(_oxijax.build_info())
