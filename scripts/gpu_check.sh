#!/usr/bin/env bash
# One-shot check on a GPU machine without internet (jax with CUDA already installed):
# build against the installed jaxlib for that GPU only, run the GPU tests (a skip is a
# failure there), the whole suite, then the benchmark. Logs and a JSON of benchmark
# results go to $OUT when it is set. Budget: under 8 minutes on an H200.
set -euo pipefail
cd "$(dirname "$0")/.."
out="${OUT:-$(mktemp -d)}"
mkdir -p "$out"

export OXIJAX_REQUIRE_GPU=1 XLA_PYTHON_CLIENT_PREALLOCATE=false OXIJAX_CUDA=ON
export OXIJAX_CUDA_ARCHITECTURES="${OXIJAX_CUDA_ARCHITECTURES:-90-real}"
export CMAKE_BUILD_PARALLEL_LEVEL="${CMAKE_BUILD_PARALLEL_LEVEL:-$(nproc)}"
python -m pip install --no-build-isolation --no-deps . 2>&1 | tail -n 20 | tee "$out/build.log"
nvidia-smi 2>&1 | tee "$out/nvidia-smi.log" || true

# From here on, run outside the source tree so that the installed package (with its
# compiled extension) is imported, not ./oxijax.
cd tests
python -m oxijax info 2>&1 | tee "$out/info.log"
python -m pytest -q -x -p no:cacheprovider --rootdir=. test_gpu.py test_build.py 2>&1 | tee "$out/gpu_tests.log"
python -m pytest -q -p no:cacheprovider --rootdir=. . 2>&1 | tee "$out/tests.log"
python -m oxijax check 2>&1 | tee "$out/check.log"
python -m oxijax bench --dtype float32 --dtype bfloat16 --json "$out/bench.json" 2>&1 | tee "$out/bench.log"
