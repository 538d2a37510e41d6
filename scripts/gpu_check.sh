#!/usr/bin/env bash
# One-shot check on a GPU machine without internet (jax with CUDA already installed):
# build against the installed jaxlib, run the test suite, then the benchmark. Logs and a
# JSON of benchmark results go to $OUT when it is set. (The CUDA kernels and their GPU
# tests arrive with issue 3; until then this checks the CPU path on that machine.)
set -euo pipefail
cd "$(dirname "$0")/.."
out="${OUT:-$(mktemp -d)}"
mkdir -p "$out"

export XLA_PYTHON_CLIENT_PREALLOCATE=false
python -m pip install --no-build-isolation --no-deps . 2>&1 | tail -n 20 | tee "$out/build.log"
# From here on, run outside the source tree so that the installed package (with its
# compiled extension) is imported, not ./oxijax.
cd tests
python -m oxijax info 2>&1 | tee "$out/info.log"
python -m pytest -q -x -p no:cacheprovider --rootdir=. . 2>&1 | tee "$out/tests.log"
python -m oxijax bench --dtype float32 --dtype bfloat16 --json "$out/bench.json" 2>&1 | tee "$out/bench.log"
