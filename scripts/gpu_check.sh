#!/usr/bin/env bash
# One-shot check on a GPU machine without internet (jax with CUDA already installed):
# install oxijax (a wheel carried in .gpu_wheel/, built elsewhere for this machine's
# Python with scripts/build_gpu_wheel.sh, saves the ~200 s build; else it builds here
# against the installed jaxlib for that GPU only), then, most important first: the GPU
# tests (a skip is a failure there), every kernel path under compute-sanitizer, the GPU
# benchmark, the CPU kernels on that machine's CPU, the error-path crash check, and
# whatever time is left for the whole suite. Logs, JSONs of benchmark results,
# kernel_report.txt/.json (scripts/kernel_report.py) and summary.txt (one line per step
# with its exit status) go to $OUT when it is set; the device tool returns at most 8
# files, so tar them. Every step has its own time limit, cut to what is left of the
# whole run's GPU_CHECK_SECONDS (default 570), so that a hang cannot eat the budget;
# later steps run even when one fails.
set -uo pipefail
cd "$(dirname "$0")/.."
out="${OUT:-$(mktemp -d)}"
mkdir -p "$out"
: > "$out/summary.txt"
failed=0

budget="${GPU_CHECK_SECONDS:-570}"
# step NAME LIMIT_SECONDS COMMAND...: runs COMMAND, logs it to $out/NAME.log; the limit
# is cut to what is left of the budget, and a step with under 10 s left is not run.
step() {
  local name="$1" limit="$2"
  shift 2
  local left=$((budget - SECONDS))
  [ "$limit" -gt "$left" ] && limit="$left"
  if [ "$limit" -lt 10 ]; then
    echo "$name: not run, no time left" | tee -a "$out/summary.txt"
    return
  fi
  local start=$SECONDS
  timeout "$limit" "$@" > "$out/$name.log" 2>&1
  local status=$?
  tail -n 25 "$out/$name.log"
  echo "$name: exit $status in $((SECONDS - start)) s" | tee -a "$out/summary.txt"
  [ "$status" -eq 0 ] || failed=1
}

export OXIJAX_REQUIRE_GPU=1 XLA_PYTHON_CLIENT_PREALLOCATE=false OXIJAX_CUDA=ON
export OXIJAX_CUDA_ARCHITECTURES="${OXIJAX_CUDA_ARCHITECTURES:-90-real}"
export CMAKE_BUILD_PARALLEL_LEVEL="${CMAKE_BUILD_PARALLEL_LEVEL:-$(nproc)}"
wheel=$(ls .gpu_wheel/oxijax-*.whl 2>/dev/null | head -n 1)
if [ -n "$wheel" ]; then
  step install 60 python -m pip install --no-deps --force-reinstall "$wheel"
  # A wheel from another machine's image may not load here (system libraries): build.
  (cd /tmp && python -c "import oxijax._oxijax, oxijax._oxijax_interp") > "$out/wheel_import.log" 2>&1 \
    || { echo "install: the carried wheel does not import, building" | tee -a "$out/summary.txt"; wheel=""; }
fi
[ -n "$wheel" ] || step build 270 python -m pip install --no-build-isolation --no-deps .
nvidia-smi > "$out/nvidia-smi.log" 2>&1 || true
sanitizer=$(command -v compute-sanitizer || ls /usr/local/cuda/bin/compute-sanitizer \
            /usr/local/cuda/compute-sanitizer/compute-sanitizer 2>/dev/null | head -n 1)
tour="$PWD/scripts/sanitize_gpu_ops.py"

# From here on, run outside the source tree so that the installed package (with its
# compiled extension) is imported, not ./oxijax.
cd tests
# pytest-xdist (on the GPU image) spreads the many small, compile-bound tests over workers.
# Work stealing (pytest-xdist >= 3.2), as in CI: the tests marked `slow` start first and
# a worker that runs out of tests takes over the rest of another's queue.
parallel=()
python -c "import xdist" 2>/dev/null && parallel=(-n 8)
python -c "import sys, xdist; sys.exit(tuple(map(int, xdist.__version__.split('.')[:2])) < (3, 2))" \
  2>/dev/null && parallel+=(--dist worksteal)
step info 10 python -m oxijax info
# Registers, shared memory, tensor-core instruction counts and occupancy of every kernel
# of the installed build (a few seconds on 16 cores). Informational: not a failure.
timeout 60 python ../scripts/kernel_report.py --json "$out/kernel_report.json" \
  > "$out/kernel_report.txt" 2>&1
echo "kernel_report: exit $? (informational)" | tee -a "$out/summary.txt"
# First: does the CUDA interpreter (which CI trusts for every kernel change) model this
# GPU's PTX instructions bit for bit?
step ptx_probe 30 python -m pytest -q -p no:cacheprovider --rootdir=. test_ptx_probe.py
step build_tests 15 python -m pytest -q -p no:cacheprovider --rootdir=. test_build.py
# Every test that takes the `gpu` fixture carries the `gpu` marker (tests/conftest.py).
step gpu_tests 140 python -m pytest -q --maxfail=20 -p no:cacheprovider "${parallel[@]}" --rootdir=. -m gpu .
# Every kernel path once under compute-sanitizer, only oxijax's kernels instrumented:
# memcheck (out-of-bounds, misaligned) here, racecheck (shared-memory hazards) late.
sanitize() {
  if [ -n "$sanitizer" ]; then
    step "sanitizer_$1" "$2" "$sanitizer" --tool "$1" --error-exitcode 1 \
      --kernel-name kns=oxijax python "$tour"
  else
    echo "sanitizer_$1: compute-sanitizer not found" | tee -a "$out/summary.txt"
    failed=1
  fi
}
sanitize memcheck 50  # 20 s on the H200
step bench 150 python -m oxijax bench --dtype float32 --dtype bfloat16 --repeats 5 --json "$out/bench.json"
# The CPU kernels on this machine's CPU (its lscpu.log says which ISA), at the
# level the extension loads here: the op tests, then the CPU benchmark, whose JSON is
# rewritten after every row so that a run cut off by its limit keeps what it measured.
lscpu > "$out/lscpu.log" 2>&1 || true
cpu_tests=(test_gemm.py test_reduce.py test_conv2d.py test_attention.py test_attention_grad.py
           test_elementwise.py test_numerics.py test_grad.py test_cpu_isa.py)
step cpu_tests 90 env JAX_PLATFORMS=cpu python -m pytest -q -x -p no:cacheprovider \
  "${parallel[@]}" --rootdir=. -m "not gpu and not cuda_interpret and not fuzz" \
  "${cpu_tests[@]}" -k "not under_every_other_level"
step cpu_bench 90 env JAX_PLATFORMS=cpu python -m oxijax bench --dtype float32 \
  --dtype bfloat16 --repeats 5 --json "$out/cpu_bench.json"
# The same rows as the README's CPU tables are printed (one run). Informational.
python ../scripts/cpu_table.py --from "$out/cpu_bench.json" > "$out/cpu_table.md" 2>&1
echo "cpu_table: exit $? (informational)" | tee -a "$out/summary.txt"
# The gemm and reduction rows (under 1.0 on this 16-core CPU in the last table) at 1, 4
# and all threads, small and large: behind at one thread is the kernel, behind only
# with more threads is scaling.
step cpu_scaling 100 python ../scripts/cpu_scaling.py --threads "1,4,$(nproc)" \
  --size quick --size large --json "$out/cpu_scaling.json"
# What waking a helper costs on this CPU, and a memory-bound loop on all threads with
# its helpers started one after another (cpu::Parallel before 2026-12-05) and as a tree
# (now): a few seconds, outside XLA.
step parallel_probe 30 bash -c 'probe="$(mktemp -d)/parallel_probe" && g++ -std=c++17 -O3 \
  -march=native -pthread -I../ffi ../scripts/parallel_probe.cc ../ffi/cpu/parallel.cc \
  -o "$probe" && "$probe"'
# The float32 gemm outside XLA (0.80 of XLA at 16 threads in the last table): the FMA
# peak, and the library's gemm at the avx512 level's flags as a share of it, on one
# thread and on all (scripts/gemm_probe.cc).
step gemm_probe 40 bash -c 'probe="$(mktemp -d)/gemm_probe" && bash ../scripts/build_gemm_probe.sh \
  "$probe" -march=x86-64-v4 -mtune=generic && "$probe"'
# The first H200 run (2026-12-04, jax 0.11.2) saw processes die (SIGSEGV) when a handler
# returned an error (the first being test_attention_grad's inconsistent-call test); the
# next run, after the scratch-alignment fix, did not. Kept: a native backtrace of those
# tests (cuda-gdb debugs host code too; the image has no gdb; -return-child-result gives
# pytest's status), after a control: does any custom-call error (here jax's own Python
# callback raising) crash this jax build, without oxijax loaded?
debugger=()
command -v cuda-gdb > /dev/null &&
  debugger=(cuda-gdb -q -batch -return-child-result -ex run -ex bt --args)
step jax_error_path 30 env JAX_PLATFORMS=cpu python -c '
import jax, jax.numpy as jnp
def fail(x):
    raise ValueError("planted")
f = jax.jit(lambda x: jax.pure_callback(fail, jax.ShapeDtypeStruct((3,), jnp.float32), x))
for _ in range(50):
    try:
        f(jnp.ones(3, jnp.float32)).block_until_ready()
    except Exception:
        pass
print("50 callback errors, no crash")'
step error_paths 60 env JAX_PLATFORMS=cpu "${debugger[@]}" python -m pytest -q \
  -p no:cacheprovider --rootdir=. test_attention_grad.py test_errors.py -k "inconsistent or rejects"
# Training steps (fwd+bwd) against cuDNN and XLA: attention B2 H16 S4096 D128, conv2d.
step bench_train 60 python -m oxijax bench --size gpu --dtype bfloat16 --dtype float32 \
  --op "train step" --repeats 5 --json "$out/bench_train.json"
sanitize racecheck 80  # 156 of 169 paths in 50 s
step tests 600 python -m pytest -q -p no:cacheprovider "${parallel[@]}" --rootdir=. .
exit "$failed"
