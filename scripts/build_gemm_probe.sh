#!/usr/bin/env bash
# Builds scripts/gemm_probe.cc, with the library's gemm, into EXE at the compiler flags
# of a CPU level (CMakeLists.txt's OXIJAX_CPU_LEVEL_FLAGS_*):
#   scripts/build_gemm_probe.sh EXE -march=x86-64-v3 -mtune=generic
# for scripts/cpu_check.sh, scripts/gpu_check.sh and tests/test_cli.py. CXX picks the
# compiler (default g++).
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
exe="$1"
shift
"${CXX:-g++}" -std=c++17 -O3 "$@" -pthread -I"$root/ffi" -I"$root/ffi/cpu" \
  -I"$root/ffi/include" "$root/scripts/gemm_probe.cc" "$root/ffi/cpu/gemm.cc" \
  "$root/ffi/cpu/parallel.cc" -ldl -o "$exe"
