"""Runs Python with XLA:CPU held to a lower instruction set, so that oxijax's kernels at a
level (OXIJAX_CPU_ISA) can be compared on one machine with XLA's code for the same level:
an AVX2 machine's table taken on an AVX-512 one, for instance.

    python scripts/xla_isa.py avx2 -m oxijax bench --op gemm
    python scripts/cpu_table.py --xla-isa avx2 --runs 3      # the same, for the table

XLA:CPU has two sources of machine code. LLVM compiles its fusions for the host, which
`--xla_cpu_max_isa` caps. YNNPACK, which runs its dots and some reductions (jaxlib 0.10:
`ynn::dot_fp32_*`, `ynn::max_k1_bf16_*`), picks its kernels from cpuid on first use and
has no switch: XLA_FLAGS left XLA's float32 gemm on its AVX-512 kernel. So this script
also writes YNNPACK's cached instruction-set flags (a function-local static in jaxlib's
libjax_common.so, found by its symbol) before anything uses them. That is a diagnostic's
liberty, not something to ship: the script first checks, in a child process, that the
flags YNNPACK detects on this CPU have the layout it assumes, and stops otherwise.
"""

from __future__ import annotations

import ctypes
import functools
import os
import runpy
import subprocess
import sys

# Per level: YNNPACK's arch flags (ynnpack/base/arch.h: sse2 1 << 0, ssse3, sse41, avx,
# f16c, avx2, fma3, then avx512f, bw, vl, dq at 1 << 7 .. 10) and XLA's --xla_cpu_max_isa.
LEVELS = {"avx2": (0x7F, "AVX2"), "avx512": (0x7FF, "AVX512")}
# Bits of the detected flags that must agree with /proc/cpuinfo for the layout to hold.
_CHECKED_BITS = {"avx2": 5, "fma": 6, "avx512f": 7, "avx512bw": 8, "avx512vl": 9, "avx512dq": 10}
# ynn::get_supported_arch_flags()::flags and its guard variable, mangled (nm -C, which
# demangles, takes three times as long over the library's symbols).
_FLAGS = "_ZZN3ynn24get_supported_arch_flagsEvE5flags"
_GUARD = "_ZGVZN3ynn24get_supported_arch_flagsEvE5flags"


def _library() -> str:
    import jaxlib

    return os.path.join(os.path.dirname(jaxlib.__file__), "libjax_common.so")


@functools.cache
def _symbols(path: str) -> dict[str, int]:
    """Addresses (relative to the library's load base) of YNNPACK's flags and their guard."""
    try:
        out = subprocess.run(["nm", path], capture_output=True, text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError) as error:
        raise SystemExit(f"xla_isa: cannot list the symbols of {path} with nm: {error}")
    found = {}
    for line in out.splitlines():
        address, _, name = line.split(" ", 2) if line.count(" ") == 2 else ("", "", "")
        if name in (_FLAGS, _GUARD):
            found[name] = int(address, 16)
    if len(found) != 2:
        raise SystemExit(f"xla_isa: {path} has no symbol {_FLAGS} (YNNPACK's flags): this "
                         "jaxlib's YNNPACK cannot be capped this way")
    return found


def _cells(path: str) -> tuple[ctypes.c_uint64, ctypes.c_uint8]:
    """The flags and the first byte of their guard in this process (jaxlib loaded)."""
    import jax  # noqa: F401  (loads libjax_common.so)

    base = None
    with open("/proc/self/maps") as maps:
        for line in maps:
            fields = line.split()
            if len(fields) >= 6 and fields[5] == path and int(fields[2], 16) == 0:
                base = int(fields[0].split("-")[0], 16)
                break
    if base is None:
        raise SystemExit(f"xla_isa: {path} is not mapped in this process")
    symbols = _symbols(path)
    return (ctypes.c_uint64.from_address(base + symbols[_FLAGS]),
            ctypes.c_uint8.from_address(base + symbols[_GUARD]))


def detected_flags() -> int:
    """YNNPACK's flags as it detects them on this CPU (call in a fresh process)."""
    import jax
    import jax.numpy as jnp

    x = jnp.ones((256, 256), jnp.float32)
    jax.block_until_ready(jax.jit(lambda a: a @ a)(x))
    flags, guard = _cells(_library())
    if not guard.value:
        raise SystemExit("xla_isa: a float32 dot did not initialise YNNPACK's flags")
    return flags.value


def check_layout() -> None:
    """Stops unless the flags YNNPACK detects here agree with /proc/cpuinfo on every
    checked bit, i.e. unless LEVELS' bits mean what they are taken to mean."""
    result = subprocess.run(
        [sys.executable, "-c", "import xla_isa; print(xla_isa.detected_flags())"],
        capture_output=True, text=True, cwd=os.path.dirname(os.path.abspath(__file__)),
        env=dict(os.environ, JAX_PLATFORMS="cpu"))
    if result.returncode != 0:
        raise SystemExit(f"xla_isa: could not read YNNPACK's flags:\n{result.stderr}")
    flags = int(result.stdout.split()[-1])
    with open("/proc/cpuinfo") as f:
        cpu = set(next(line for line in f if line.startswith("flags")).split(":")[1].split())
    wrong = [name for name, bit in _CHECKED_BITS.items() if bool(flags >> bit & 1) != (name in cpu)]
    if wrong:
        raise SystemExit(f"xla_isa: YNNPACK's flags {flags:#x} disagree with /proc/cpuinfo on "
                         f"{', '.join(wrong)}: its layout is not the one assumed here")


def cap(level: str) -> None:
    """Holds XLA:CPU in this process to `level`: call before jax is used."""
    flags, max_isa = LEVELS[level]
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") +
                               f" --xla_cpu_max_isa={max_isa}").strip()
    cached, guard = _cells(_library())
    if guard.value:
        raise SystemExit("xla_isa: YNNPACK has already read its flags in this process")
    cached.value = flags
    guard.value = 1


def main(argv: list[str]) -> int:
    if len(argv) < 3 or argv[0] not in LEVELS or argv[1] not in ("-m", "-c"):
        raise SystemExit(f"usage: xla_isa.py {{{','.join(LEVELS)}}} (-m MODULE | -c CODE) [ARGS]")
    level, mode, target, rest = argv[0], argv[1], argv[2], argv[3:]
    check_layout()
    cap(level)
    if mode == "-c":
        sys.argv = ["-c", *rest]
        exec(compile(target, "<string>", "exec"), {"__name__": "__main__"})
    else:
        sys.argv = [target, *rest]
        runpy.run_module(target, run_name="__main__", alter_sys=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
