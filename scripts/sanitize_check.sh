#!/usr/bin/env bash
# Builds the CPU extension with AddressSanitizer + UndefinedBehaviorSanitizer into
# build/sanitize and runs the op tests against it, beside the installed oxijax (which
# must be installed, for the Python sources and the dependencies). Any sanitizer report
# aborts the run: zero reports is a pass. Usage: scripts/sanitize_check.sh [pytest args]
set -euo pipefail
cd "$(dirname "$0")/.."
build=build/sanitize
python=$(command -v python)

cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DOXIJAX_SANITIZE=ON \
  -DOXIJAX_CUDA=OFF -DPython_EXECUTABLE="$python" > "$build.configure.log" 2>&1 \
  || { cat "$build.configure.log"; exit 1; }
cmake --build "$build" --target _oxijax
extension=$(ls "$PWD/$build"/_oxijax*.so)

# Python itself is not instrumented, so the ASan runtime must be loaded first. Leak
# checking is off: the interpreter keeps objects alive at exit by design (the backend's
# own leak check is a test). Every report is fatal.
# libstdc++ is preloaded too, so that ASan's C++-exception interceptor finds it.
export LD_PRELOAD="$(gcc -print-file-name=libasan.so) $(gcc -print-file-name=libstdc++.so)"
# allocator_may_return_null: the out-of-memory tests ask for more than exists on purpose.
# detect_stack_use_after_return=0: for that check ASan moves a frame's locals to a
# "fake stack" that does not keep the 64-byte alignment GCC gives local arrays on the
# AVX-512 levels, whose aligned stores (vmovdqa64 to a zero-padded tail buffer) then
# fault (GCC 12, elementwise.cc). No kernel returns the address of a local.
export ASAN_OPTIONS="detect_leaks=0:halt_on_error=1:abort_on_error=1:strict_string_checks=1:detect_stack_use_after_return=0:allocator_may_return_null=1"
export UBSAN_OPTIONS="halt_on_error=1:print_stacktrace=1"
export OXIJAX_EXTENSION="$extension" OXIJAX_EXPECT_SANITIZED=1 OXIJAX_CUDA=OFF
cd tests
# The op tests (subprocesses such as nvcc must not inherit the preloaded runtime).
# (test_failure_paths.py is left out: its address-space limits starve ASan's shadow memory.)
tests=(test_build.py test_errors.py test_elementwise.py test_reduce.py test_gemm.py
       test_conv2d.py test_attention.py test_fuzz_ops.py test_fuzz_backend.py test_numerics.py test_grad.py
       test_attention_grad.py test_backend.py test_backend_compute.py test_leaks.py)
[ "$#" -gt 0 ] && tests=("$@")
"$python" -m pytest -q -p no:cacheprovider -k "not test_shared_math_compiles_for_cuda" "${tests[@]}"
