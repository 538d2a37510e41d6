"""Loads the compiled extension and registers its FFI handlers with XLA."""

from __future__ import annotations

import jax

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


#: Lowering platform -> FFI target names registered on it.
REGISTERED_TARGETS = _register()
BUILD_INFO = dict(_oxijax.build_info())
