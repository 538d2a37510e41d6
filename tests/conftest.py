"""Shared test helpers: float64 is on, inputs are drawn per dtype, and results are
compared with an independent float64 reference at a tolerance fitting the dtype."""

from __future__ import annotations

import os

import jax

jax.config.update("jax_enable_x64", True)
# References built from jnp / lax ops in full float32 on a GPU too (XLA's default there
# rounds float32 matmul and conv inputs to TF32), as oxijax's default precision is.
jax.config.update("jax_default_matmul_precision", "highest")

import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402
from hypothesis import settings  # noqa: E402

settings.register_profile("default", max_examples=25, deadline=None)
settings.register_profile("slow", max_examples=1000, deadline=None)
# CI's share of the slow profile: what fits its 20-minute budget on two cores.
settings.register_profile("ci", max_examples=400, deadline=None)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "default"))

DTYPES = [jnp.float16, jnp.bfloat16, jnp.float32, jnp.float64]
DTYPE_IDS = ["f16", "bf16", "f32", "f64"]

# Relative tolerance of one result, as a fraction of the reference's magnitude: a little
# above one rounding of the output plus float32 (or float64) accumulation error.
TOLERANCE = {
    np.dtype(jnp.float16): 4e-3,
    np.dtype(jnp.bfloat16): 2e-2,
    np.dtype(jnp.float32): 2e-5,
    np.dtype(jnp.float64): 1e-12,
}


def pytest_collection_modifyitems(items):
    """Tests that use the `gpu` fixture are marked `gpu` (scripts/gpu_check.sh: -m gpu);
    those that use `interpreter` are marked `cuda_interpret`. Tests marked `slow` run
    first (in their order): a worker that draws a test of minutes at the end of the
    run would keep the run going alone (with `--dist worksteal`, the other worker
    takes over the rest of its queue meanwhile)."""
    for item in items:
        names = getattr(item, "fixturenames", ())
        if "gpu" in names:
            item.add_marker(pytest.mark.gpu)
        if "interpreter" in names:
            item.add_marker(pytest.mark.cuda_interpret)
    items.sort(key=lambda item: item.get_closest_marker("slow") is None)


def require_interpreter():
    """oxijax._oxijax_interp; skips when this build has no CUDA interpreter (it is built
    with the CUDA kernels), fails instead with OXIJAX_REQUIRE_INTERPRETER=1."""
    from oxijax import _interpret

    if not _interpret.available():
        message = "this build has no CUDA interpreter (built without the CUDA toolkit)"
        if os.environ.get("OXIJAX_REQUIRE_INTERPRETER") == "1":
            pytest.fail(f"OXIJAX_REQUIRE_INTERPRETER=1 but {message}")
        pytest.skip(message)
    return _interpret.module()


@pytest.fixture
def interpreter():
    """Runs the test's oxijax ops on the CPU through the CUDA interpreter (the CUDA
    kernels and handlers, every access checked); yields its module. Reports of failed
    launches are cleared before and after."""
    import oxijax

    module = require_interpreter()
    module.take_reports()
    with oxijax.cuda_interpreter(schedule="shuffle", seed=0) as interp:
        yield interp
    module.take_reports()


@pytest.fixture
def gpu():
    """The first CUDA device; skips without one, fails instead with OXIJAX_REQUIRE_GPU=1."""
    from oxijax._ffi import cuda_available

    if not cuda_available():
        message = "no CUDA GPU (or oxijax was built without CUDA kernels)"
        if os.environ.get("OXIJAX_REQUIRE_GPU") == "1":
            pytest.fail(f"OXIJAX_REQUIRE_GPU=1 but {message}")
        pytest.skip(message)
    return jax.devices("cuda")[0]


@pytest.fixture(params=DTYPES, ids=DTYPE_IDS)
def dtype(request):
    return request.param


def random(shape, dtype, seed=0, low=-2.0, high=2.0):
    """Uniform values in [low, high), exactly representable in dtype. Converted on the host
    (ml_dtypes) and transferred with device_put, so that no XLA computation is compiled for
    each new shape (jnp.asarray compiles a copy per shape and dtype)."""
    values = np.random.default_rng(seed).uniform(low, high, size=shape)
    return jax.device_put(values.astype(np.dtype(dtype)))


def f64(x) -> np.ndarray:
    """x as a float64 NumPy array (a host conversion, exact for every supported dtype)."""
    return np.asarray(x).astype(np.float64)


def assert_close(actual, expected, dtype, scale=None, factor=1.0):
    """|actual - expected| <= tol * (|expected| + scale), NaN and inf matching exactly.

    `scale` defaults to the largest finite |expected| (errors of sums are relative to
    the magnitude of their terms, not of the result)."""
    actual, expected = f64(actual), np.asarray(expected, dtype=np.float64)
    assert actual.shape == expected.shape, (actual.shape, expected.shape)
    if expected.size == 0:
        return
    finite = np.isfinite(expected)
    np.testing.assert_array_equal(np.isnan(actual), np.isnan(expected), "NaN positions differ")
    np.testing.assert_array_equal(actual[~finite & ~np.isnan(expected)],
                                  expected[~finite & ~np.isnan(expected)], "infinities differ")
    if scale is None:
        scale = np.max(np.abs(expected[finite]), initial=0.0)
    tol = TOLERANCE[np.dtype(dtype)] * factor
    err = np.abs(actual[finite] - expected[finite])
    bound = tol * (np.abs(expected[finite]) + scale) + np.finfo(np.float64).tiny
    worst = np.argmax(err - bound) if err.size else 0
    assert np.all(err <= bound), (
        f"max error {err.max():.3g} above tolerance (worst: got {actual[finite][worst]!r}, "
        f"expected {expected[finite][worst]!r})"
    )
