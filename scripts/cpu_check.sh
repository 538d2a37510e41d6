#!/usr/bin/env bash
# The CPU measurements a machine owes the README's tables and docs/performance.md, in
# one run (about 6 minutes on 2 cores), for an installed oxijax (`pip install .`):
#   bash scripts/cpu_check.sh [OUTDIR]          (default: a new temporary folder)
# 1. facts.log: the date, lscpu, the cache sizes the C library reports (from which the
#    gemm takes its blocking), `python -m oxijax info`;
# 2. gemm_probe_<level>.log: scripts/gemm_probe.cc at each x86 level from avx2 up that
#    this CPU runs: the FMA peak, and the library's float32 gemm as a share of it, on
#    one thread and on all, then on one thread with the L2 posed at 256 KiB to 2 MiB;
# 3. numpy_gemm.log: NumPy's matmul (its BLAS, with the BLAS's own choice of kernel)
#    and oxijax's jitted gemm, float32 1024^3, taken in turns, on one CPU and on all;
# 4. cpu_scaling.log: the gemm, reduction and training-step rows at one thread and at
#    all (scripts/cpu_scaling.py): behind at one thread is the kernel, behind only with
#    more threads is scaling;
# 5. table.md (from runs/*.json): the README's table, `scripts/cpu_table.py --runs 6`.
# summary.txt has a line per step with its exit status; later steps run when one fails.
set -uo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
out="${1:-$(mktemp -d)}"
mkdir -p "$out/runs"
out="$(cd "$out" && pwd)"
: > "$out/summary.txt"
failed=0

# step NAME COMMAND...: runs COMMAND, its output to $out/NAME.log.
step() {
  local name="$1" start=$SECONDS
  shift
  "$@" > "$out/$name.log" 2>&1
  local status=$?
  echo "$name: exit $status in $((SECONDS - start)) s" | tee -a "$out/summary.txt"
  [ "$status" -eq 0 ] || failed=1
}

# Outside the source tree, so that the installed package is imported, not ./oxijax.
cd "$out"
cpus=$(python -c 'import os; print(len(os.sched_getaffinity(0)))')

facts() {
  date -u
  lscpu
  for cache in LEVEL1_DCACHE_SIZE LEVEL2_CACHE_SIZE LEVEL3_CACHE_SIZE; do
    echo "getconf $cache: $(getconf "$cache" 2>/dev/null)"
  done
  JAX_PLATFORMS=cpu python -m oxijax info
}
step facts facts

# The x86 levels at or above avx2 (the probe times FMA code) that this CPU runs, with
# their compiler flags (CMakeLists.txt's).
probe_levels=()
if grep -qw avx2 /proc/cpuinfo && grep -qw fma /proc/cpuinfo; then
  probe_levels+=("avx2:-march=x86-64-v3")
  grep -qw avx512bw /proc/cpuinfo && grep -qw avx512vl /proc/cpuinfo &&
    probe_levels+=("avx512:-march=x86-64-v4")
fi
gemm_probe() {
  local flags="$1" exe
  exe="$(mktemp -d)/gemm_probe"
  bash "$root/scripts/build_gemm_probe.sh" "$exe" $flags -mtune=generic || return
  "$exe" "$cpus" || return
  for l2 in 262144 524288 1048576 2097152; do
    OXIJAX_PROBE_L2=$l2 "$exe" 1 || return
  done
}
for entry in "${probe_levels[@]}"; do
  step "gemm_probe_${entry%%:*}" gemm_probe "${entry#*:}"
done

numpy_gemm() {
  local threads
  for threads in 1 "$cpus"; do
    python - "$threads" <<'EOF'
import os, sys, time
threads = int(sys.argv[1])
os.sched_setaffinity(0, sorted(os.sched_getaffinity(0))[:threads])
os.environ["JAX_PLATFORMS"] = "cpu"
import numpy as np, jax, oxijax

rng = np.random.default_rng(0)
a, b = (rng.standard_normal((1024, 1024), dtype=np.float32) for _ in range(2))
ja, jb = jax.device_put(a), jax.device_put(b)
gemm = jax.jit(oxijax.matmul)
sides = {"NumPy": lambda: a @ b, "oxijax": lambda: gemm(ja, jb).block_until_ready()}
times = {name: [] for name in sides}
# Blocks of five calls, the sides in turns (a slow spell of the machine hits both), with
# a pause after each: OpenBLAS's threads spin for a while after a call, and would take
# the CPUs of the other side's helpers.
for block in range(7):
    for name, f in sides.items():
        for _ in range(5):
            t0 = time.perf_counter()
            f()
            if block:  # the first block warms up
                times[name].append(time.perf_counter() - t0)
        time.sleep(0.3)
try:
    blas = np.show_config(mode="dicts")["Build Dependencies"]["blas"]
    blas = f"{blas.get('name')} {blas.get('version')}"
except (TypeError, KeyError):  # NumPy before 1.26
    blas = "unknown"
print(f"{threads} CPU(s); NumPy {np.__version__}, BLAS {blas}")
for name, t in times.items():
    t.sort()
    print(f"  {name:7s} min {t[0] * 1e3:7.2f} ms  median {t[len(t) // 2] * 1e3:7.2f} ms"
          f"  ({2 * 1024**3 / t[len(t) // 2] / 1e9:6.1f} GFLOP/s)")
EOF
  done
}
step numpy_gemm numpy_gemm

step cpu_scaling python "$root/scripts/cpu_scaling.py" --threads "1,$cpus" --op gemm \
  --op reduce --op "train step" --json "$out/cpu_scaling.json"

step table python "$root/scripts/cpu_table.py" --runs 6 --json-dir "$out/runs"
python "$root/scripts/cpu_table.py" --from "$out"/runs/*.json > "$out/table.md"

echo "results in $out"
exit "$failed"
