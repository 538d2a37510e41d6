"""The extension and the shared math header, as built."""

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import oxijax

ROOT = Path(__file__).resolve().parents[1]
OPS = ["unary", "binary", "reduce", "gemm", "conv2d", "attention"]
OPS += ["attention_backward", "attention_jvp"]
OPS += ["unary_grad", "binary_partial", "conv2d_backward_data", "conv2d_backward_filter"]  # autodiff


def test_every_op_is_registered_on_cpu():
    assert sorted(oxijax.REGISTERED_TARGETS["cpu"]) == sorted(f"oxijax_{op}" for op in OPS)


def _nvcc():
    return shutil.which("nvcc") or ("/usr/local/cuda/bin/nvcc" if Path("/usr/local/cuda/bin/nvcc").exists() else None)


@pytest.mark.skipif(_nvcc() is None or os.environ.get("OXIJAX_CUDA") == "OFF",
                    reason="built without nvcc (or with OXIJAX_CUDA=OFF)")
def test_cuda_kernels_are_built_and_registered():
    assert oxijax.BUILD_INFO["cuda"] is True
    # The default architectures, or those the build was asked for (CI: sm_90 only).
    requested = os.environ.get("OXIJAX_CUDA_ARCHITECTURES", "80-real;90-real;90-virtual")
    assert oxijax.BUILD_INFO["cuda_architectures"].split() == requested.split(";")
    assert sorted(oxijax.REGISTERED_TARGETS["cuda"]) == sorted(f"oxijax_{op}" for op in OPS)
    # The CUDA interpreter is built with the CUDA kernels; its handlers are CPU targets.
    from oxijax import _interpret

    registered = _interpret.module().registrations()["cpu"]
    assert sorted(registered) == sorted(f"oxijax_interp_{op}" for op in OPS)


def test_build_info():
    info = oxijax.BUILD_INFO
    assert isinstance(info["cuda"], bool)
    major, minor = info["ffi_api_version"]
    assert (major, minor) >= (0, 1)


# The op math must compile for the GPU too: one definition serves both (issue 3 adds
# the kernels that use it). This compiles every functor in a device function.
DEVICE_USE = r"""
#include "oxijax/math.h"
#include "oxijax/numeric.h"
using namespace oxijax;
template <UnaryOp op> __device__ float u(float x) { return Unary<op>{}(x); }
template <BinaryOp op> __device__ double b(double x, double y) { return Binary<op>{}(x, y); }
template <ReduceOp op> __device__ float r(float x, float y) {
  return Reducer<op>::finish(Reducer<op>::combine(Reducer<op>::template identity<float>(), Reducer<op>::combine(x, y)), 2);
}
__global__ void all_ops(float* out, const half* h, const bfloat16* bf) {
  float x = load(h[0]) + load(bf[0]);
  x += u<UnaryOp::RELU>(x) + u<UnaryOp::SIGMOID>(x) + u<UnaryOp::TANH>(x) + u<UnaryOp::EXP>(x)
     + u<UnaryOp::LOG>(x) + u<UnaryOp::SQRT>(x) + u<UnaryOp::ABS>(x) + u<UnaryOp::NEG>(x);
  x += float(b<BinaryOp::ADD>(x, 1) + b<BinaryOp::SUB>(x, 1) + b<BinaryOp::MUL>(x, 2)
     + b<BinaryOp::DIV>(x, 2) + b<BinaryOp::MAX>(x, 0) + b<BinaryOp::MIN>(x, 0));
  x += r<ReduceOp::SUM>(x, 1) + r<ReduceOp::MAX>(x, 1) + r<ReduceOp::MIN>(x, 1) + r<ReduceOp::MEAN>(x, 1);
  OnlineSoftmax<float> softmax;
  float factor = softmax.rescale(x);
  softmax.add(softmax.weight(x));
  out[0] = load(store<half>(x * factor * softmax.normaliser() + softmax.log_sum_exp()));
  out[1] = load(store<bfloat16>(x));
}
"""


@pytest.mark.skipif(_nvcc() is None, reason="nvcc is not installed")
def test_shared_math_compiles_for_cuda(tmp_path):
    nvcc = _nvcc()
    source = tmp_path / "device_use.cu"
    source.write_text(DEVICE_USE)
    result = subprocess.run(
        [nvcc, "-std=c++17", "-arch=sm_80", "-c", str(source), "-o", str(tmp_path / "d.o"),
         "-I", str(ROOT / "ffi" / "include")], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr


def test_import_in_fresh_interpreter():
    code = "import oxijax, jax.numpy as jnp; print(float(oxijax.sum(jnp.ones(3), 0)))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "3.0"


@pytest.mark.skipif(os.environ.get("OXIJAX_EXPECT_SANITIZED") != "1",
                    reason="only under scripts/sanitize_check.sh")
def test_the_sanitized_extension_is_the_one_loaded():
    from oxijax._extension import _oxijax

    assert "-fsanitize=address,undefined" in oxijax.BUILD_INFO["cpu_flags"]
    assert os.path.samefile(_oxijax.__file__, os.environ["OXIJAX_EXTENSION"])


def test_cuda_lowering_without_a_gpu():
    """Lowering for CUDA needs no GPU: a CUDA build emits the custom call, a CPU-only
    build explains that it has no CUDA kernels."""
    import jax
    import jax.numpy as jnp

    lower = jax.jit(oxijax.relu).trace(jnp.ones(3)).lower
    if "cuda" in oxijax.REGISTERED_TARGETS:
        assert "oxijax_unary" in lower(lowering_platforms=("cuda",)).as_text()
    else:
        with pytest.raises(NotImplementedError, match="no CUDA kernel in this build"):
            lower(lowering_platforms=("cuda",))


def test_extension_stubs_are_current(tmp_path):
    """oxijax/_oxijax/*.pyi (committed, from a CUDA build) describe the extension as built.
    Regenerate after changing the bindings:
    python -m nanobind.stubgen -m oxijax._oxijax -r --exclude-values -O oxijax"""
    subprocess.run([sys.executable, "-m", "nanobind.stubgen", "-m", "oxijax._oxijax", "-r",
                    "--exclude-values", "-q", "-O", str(tmp_path)], check=True)
    for generated in sorted((tmp_path / "_oxijax").glob("*.pyi")):
        committed = (ROOT / "oxijax" / "_oxijax" / generated.name).read_text()
        if oxijax.BUILD_INFO["cuda"]:
            assert generated.read_text() == committed, generated.name
        else:  # a CPU-only build lacks CudaDevice; everything it has must be described
            missing = set(generated.read_text().splitlines()) - set(committed.splitlines())
            assert not missing, (generated.name, missing)
