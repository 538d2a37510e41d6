#!/usr/bin/env bash
# Builds oxijax's wheel for the GPU machine into .gpu_wheel/ (ignored by git): Python 3.12
# as on the machine's image, the CUDA kernels for sm_90 only, against the oldest jaxlib
# supported (pyproject.toml's build requirements). scripts/gpu_check.sh installs it
# there instead of building, which saves ~200 s of the device lease; carry .gpu_wheel.
# The build directory (build/cp312-...) is kept, so a rebuild after a change is quick.
set -euo pipefail
cd "$(dirname "$0")/.."
venv="${GPU_WHEEL_VENV:-build/gpu-wheel-venv}"
if [ ! -x "$venv/bin/python" ]; then
  "${PYTHON:-python3.12}" -m venv "$venv"
  "$venv/bin/python" -m pip install -q "jax==0.7.0" "jaxlib==0.7.0" "nanobind>=2.4" \
    "scikit-build-core>=0.10"
fi
rm -rf .gpu_wheel
OXIJAX_CUDA=ON OXIJAX_CUDA_ARCHITECTURES="${OXIJAX_CUDA_ARCHITECTURES:-90-real}" \
  "$venv/bin/python" -m pip wheel --no-build-isolation --no-deps -w .gpu_wheel .
ls -l .gpu_wheel
