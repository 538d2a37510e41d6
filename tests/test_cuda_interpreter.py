"""The CUDA interpreter itself: each check catches its planted bug (and passes the correct
twin), the PTX models agree with the ISA's fragment layouts, launches are refused where
the hardware refuses them, schedules do not change results, and the defects the review
found stay fixed. The kernels' own coverage is in test_cuda_kernel_paths.py and
test_gpu.py (interpreter mode)."""

from __future__ import annotations

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import assert_close, f64, random, require_interpreter
from test_attention import reference as attention_reference

import oxijax

pytestmark = pytest.mark.cuda_interpret


@pytest.fixture(scope="module")
def interp():
    return require_interpreter()


# name -> (status the buggy twin fails with, words its report must contain)
PLANTED = {
    "barrier": ("cudaErrorLaunchFailure", r"shared-memory data race \((read after write|write after read)\)"),
    "out_of_bounds": ("cudaErrorIllegalAddress", r"out-of-bounds global write of 4 bytes"),
    "uninitialized": ("cudaErrorLaunchFailure", r"read of uninitialised shared memory"),
    "shared_out_of_bounds": ("cudaErrorIllegalAddress", r"out-of-bounds shared read"),
    "misaligned_cp_async": ("cudaErrorMisalignedAddress", r"misaligned cp\.async of 16 bytes"),
    "cp_async_wait": ("cudaErrorLaunchFailure", r"missing cp\.async\.wait_group"),
    "divergent_mma": ("cudaErrorLaunchFailure", r"deadlock.*mma\.sync.*lane 16 exited"),
    "misaligned_vector": ("cudaErrorMisalignedAddress", r"misaligned 16-byte access"),
}


def test_every_planted_case_is_tested(interp):
    assert set(interp.planted_cases()) == set(PLANTED) | {"fragment"}


@pytest.mark.parametrize("name", sorted(PLANTED))
@pytest.mark.parametrize("order", ["forward", "reverse", "shuffle"])
def test_planted_bug_is_caught(interp, name, order):
    interp.set_schedule(order, 7)
    try:
        status, report, _ = interp.run_planted(name, True)
        clean_status, clean_report, _ = interp.run_planted(name, False)
    finally:
        interp.set_schedule("shuffle", 0)
    expected_status, words = PLANTED[name]
    assert status == expected_status, report
    assert re.search(words, report), report
    # The report names the kernel, the thread and the source line.
    assert "planted_kernels.cu:" in report or "ptx.h:" in report or "deadlock" in report, report
    assert (clean_status, clean_report) == ("cudaSuccess", "")


@pytest.mark.parametrize("order,kind", [("forward", "write after read"),
                                        ("reverse", "read after write")])
def test_missing_barrier_report_names_both_sides(interp, order, kind):
    # Forward: thread 0 reads slot 1, then thread 1 writes it. Reverse: the other way.
    interp.set_schedule(order, 0)
    try:
        status, report, _ = interp.run_planted("barrier", True)
    finally:
        interp.set_schedule("shuffle", 0)
    assert status == "cudaErrorLaunchFailure"
    assert f"shared-memory data race ({kind}) on __shared__ tile + " in report, report
    assert report.count("planted_kernels.cu:") >= 2, report  # both accesses located
    assert "with no __syncthreads() between them" in report


def _fragment_reference():
    a = np.array([[(i + 2 * k) % 7 - 3 for k in range(16)] for i in range(16)], np.float64)
    b = np.array([[(3 * k + j) % 5 - 2 for j in range(8)] for k in range(16)], np.float64)
    return (a @ b).ravel()


def test_mma_fragments_follow_the_isa_layout(interp):
    """ldmatrix + mma.sync m16n8k16 as the PTX ISA lays fragments out gives A @ B; a wrong
    fragment index in the kernel (registers a1, a2 swapped) gives a wrong product."""
    status, _, correct = interp.run_planted("fragment", False)
    assert status == "cudaSuccess"
    np.testing.assert_array_equal(correct, _fragment_reference())
    status, _, wrong = interp.run_planted("fragment", True)
    assert status == "cudaSuccess"
    assert np.any(np.asarray(wrong) != _fragment_reference())


@pytest.mark.parametrize("order", ["forward", "reverse", "shuffle"])
def test_schedules_agree(interpreter, order):
    interpreter.set_schedule(order, 3)
    a = random((37, 70), jnp.bfloat16, 1)
    b = random((70, 45), jnp.bfloat16, 2)
    x = random((300, 129), jnp.float32, 3)
    out = jax.jit(lambda a, b, x: (oxijax.matmul(a, b), oxijax.sum(x, 1)))(a, b, x)
    assert_close(out[0], f64(a) @ f64(b), jnp.bfloat16, factor=2.0)
    assert_close(out[1], f64(x).sum(1), jnp.float32, scale=2.0 * np.sqrt(129))


# ---------------------------------------------------------------- launch limits


def test_launch_log_and_configuration_only_mode(interpreter):
    """set_execute(False) checks and logs launches without running them: for launch
    geometry at sizes the interpreter could not execute."""
    interpreter.take_launch_log()
    interpreter.set_execute(False)
    try:
        x = jnp.zeros((4, 3), jnp.float32)
        jax.jit(oxijax.exp)(x).block_until_ready()
    finally:
        interpreter.set_execute(True)
    (kernel, grid, block, shared), = interpreter.take_launch_log()
    assert "unary_kernel" in kernel and grid[0] >= 1 and block[0] in (128, 256, 512)


GRID_LIMIT = 65535


def _assert_grids_within_limits(log):
    assert log, "no launch"
    for kernel, grid, block, _ in log:
        assert grid[0] < 2**31 and grid[1] <= GRID_LIMIT and grid[2] <= GRID_LIMIT, (kernel, grid)
        assert block[0] * block[1] * block[2] <= 1024, (kernel, block)


def test_conv2d_backward_grid_splits_above_65535_groups(interpreter):
    """Review defect: both conv2d backward passes launched gridDim.z = groups; at >= 65536
    groups (a vmap-folded batch) the launch failed with cudaErrorInvalidConfiguration."""
    groups = 70000
    x = jnp.zeros((groups, 1, 1, 3, 3), jnp.float32)
    w = jnp.zeros((groups, 1, 1, 1, 1), jnp.float32)
    conv = lambda x, w: oxijax.conv2d(x, w, stride=2).sum()  # noqa: E731
    interpreter.take_launch_log()
    interpreter.set_execute(False)
    try:
        grads = jax.jit(jax.vmap(jax.grad(conv, (0, 1))))(x, w)
        jax.block_until_ready(grads)
    finally:
        interpreter.set_execute(True)
    log = interpreter.take_launch_log()
    _assert_grids_within_limits(log)
    kernels = " ".join(kernel for kernel, _, _, _ in log)
    assert "DataProblem" in kernels and "FilterProblem" in kernels, kernels


def test_conv2d_backward_grid_splits_above_65535_tiles(interpreter):
    """Review defect: a stride-2 layer with N=256 at 128x128 gives gridDim.y = 65536."""
    x = jnp.zeros((256, 1, 128, 128), jnp.bfloat16)
    w = jnp.zeros((1, 1, 1, 1), jnp.bfloat16)
    interpreter.take_launch_log()
    interpreter.set_execute(False)
    try:
        grads = jax.jit(jax.grad(lambda x, w: oxijax.conv2d(x, w, stride=2).astype(
            jnp.float32).sum(), (0, 1)))(x, w)
        jax.block_until_ready(grads)
    finally:
        interpreter.set_execute(True)
    _assert_grids_within_limits(interpreter.take_launch_log())


# ---------------------------------------------------------------- review defects


@pytest.mark.parametrize("dtype", [jnp.float16, jnp.bfloat16], ids=["f16", "bf16"])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_attention_with_a_scale_below_float_range(interpreter, dtype, causal):
    """Review defect: scale * log2(e) rounded to 0 in float made masked scores
    -inf * 0 = NaN on the tensor-core path. Every score is then 0: a uniform average over
    the visible keys (a query that sees none gets zeros)."""
    q = random((1, 2, 70, 64), dtype, 1)
    k = random((1, 2, 90, 64), dtype, 2)
    v = random((1, 2, 90, 64), dtype, 3)
    interpreter.take_launched_kernels()
    out = jax.jit(lambda q, k, v: oxijax.attention(q, k, v, scale=1e-300, causal=causal))(q, k, v)
    assert any("attention_mma_kernel" in name for name in interpreter.take_launched_kernels())
    expected = attention_reference(f64(q), f64(k), f64(v), 0.0, causal)
    assert_close(out, expected, dtype, factor=2.0)


# Error handling of the launchers, with failures injected where the GPU's runtime could
# fail (cudaError_t values as in driver_types.h).
INVALID_CONFIGURATION, OUT_OF_RESOURCES, INVALID_VALUE = 9, 701, 1


def test_a_failed_launch_reaches_python_with_its_report(interpreter):
    x = random((1000,), jnp.float32, 1)
    interpreter.inject_failure("launch", OUT_OF_RESOURCES)
    with pytest.raises(Exception, match=r"(?s)cudaErrorLaunchOutOfResources.*unary_kernel.*"
                                         r"injected launch failure"):
        jax.block_until_ready(jax.jit(oxijax.exp)(x))
    # No stale error: the next launch works.
    assert_close(jax.jit(oxijax.tanh)(x), np.tanh(f64(x)), jnp.float32, scale=0.0, factor=2.0)


def test_sm_count_failure_leaves_no_error_behind(interpreter):
    """Review defect: sm_count()/resident_blocks() cleared errors with cudaGetLastError,
    which could swallow (or leave) a launcher's error. A failed device query now falls
    back to 132 SMs, clears only its own error, and the launch succeeds."""
    x = random((5000,), jnp.float32, 2)
    interpreter.inject_failure("cudaGetDevice", INVALID_VALUE)
    assert_close(jax.jit(oxijax.exp)(x), np.exp(f64(x)), jnp.float32, scale=0.0, factor=2.0)
    assert_close(jax.jit(oxijax.relu)(x), np.maximum(f64(x), 0), jnp.float32, scale=0.0)


@pytest.mark.parametrize("api,dim", [("cudaDeviceGetAttribute", 64), ("cudaFuncSetAttribute", 128)])
def test_attention_attribute_failure_is_not_left_stale(interpreter, api, dim):
    """Review defect: the attention launcher returned a device-attribute error without
    clearing it, so the next launcher reported it. The failing call raises; the next one
    (any op) succeeds."""
    q = random((1, 1, 20, dim), jnp.float16, 1)
    interpreter.inject_failure(api, INVALID_VALUE)
    with pytest.raises(Exception, match="cudaErrorInvalidValue"):
        jax.block_until_ready(jax.jit(oxijax.attention)(q, q, q))
    x = random((300,), jnp.float32, 3)
    assert_close(jax.jit(oxijax.sqrt)(jnp.abs(x)), np.sqrt(np.abs(f64(x))), jnp.float32,
                 scale=0.0, factor=2.0)
    out = jax.jit(oxijax.attention)(q, q, q)
    assert_close(out, attention_reference(q, q, q, 1 / np.sqrt(dim), False), jnp.float16,
                 factor=2.0)


@pytest.mark.parametrize("runtime_error,driver_code,driver_name", [
    (INVALID_CONFIGURATION, 1, "CUDA_ERROR_INVALID_VALUE"),
    (OUT_OF_RESOURCES, 701, "CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES"),
])
def test_backend_launch_failures_report_the_driver_code(interp, runtime_error, driver_code,
                                                        driver_name):
    """Review defect: the pointer backend put a cudaError_t where it promises the driver's
    CUresult. On the interpreted device, an injected launch failure must surface as the
    CUresult of the same meaning (its runtime name stays in the message)."""
    from oxijax._extension import _oxijax

    device = interp.backend.CudaDevice(0)
    try:
        x = device.alloc(4 * 64)
        host = np.arange(64, dtype=np.float32)
        device.htod(x, host.ctypes.data, host.nbytes)
        interp.inject_failure("launch", runtime_error)
        with pytest.raises(_oxijax.backend.DriverError) as failure:
            device.unary(2, 3, x, x, 64)
        code, name, message = failure.value.args
        assert (code, name) == (driver_code, driver_name)
        assert "cudaError" in message
        device.unary(2, 3, x, x, 64)  # the device stays usable
        device.free(x)
    finally:
        interp.inject_failure("launch", 0, 0)
        device.close()
