"""The CPU kernels build for aarch64 (NEON), cross-compiled with Zig's clang (the
`ziglang` wheel of the test extra: a C++ toolchain with aarch64 glibc headers, nothing
to install system-wide). This checks that they compile and link as the kernel library
CMakeLists.txt builds there; running them needs an aarch64 machine."""

from __future__ import annotations

import concurrent.futures
import os
import pathlib
import struct
import subprocess
import sys

import pytest

pytest.importorskip("ziglang")

ROOT = pathlib.Path(__file__).resolve().parent.parent
CPU = ROOT / "ffi" / "cpu"
# The kernel library's sources (CMakeLists.txt OXIJAX_CPU_KERNEL_SOURCES): every .cc in
# ffi/cpu but the dispatcher, which is part of the extension.
SOURCES = sorted(p for p in CPU.glob("*.cc") if p.name != "isa_dispatch.cc")
EM_AARCH64 = 183


def zig(*args: str, cache: pathlib.Path) -> None:
    # Zig's caches go to the test's folder, not the user's home.
    env = dict(os.environ, ZIG_GLOBAL_CACHE_DIR=str(cache / "global"),
               ZIG_LOCAL_CACHE_DIR=str(cache / "local"))
    result = subprocess.run([sys.executable, "-m", "ziglang", "c++", *args],
                            capture_output=True, text=True, env=env, timeout=900)
    assert result.returncode == 0, result.stderr[-4000:]


def test_kernel_sources_are_listed_in_cmake():
    cmake = (ROOT / "CMakeLists.txt").read_text()
    assert all(f"ffi/cpu/{p.name}" in cmake for p in SOURCES)


def test_cpu_kernels_build_for_aarch64(tmp_path):
    # -O1: the compile is what is checked here, at half the time of -O3 (CI's budget).
    flags = ["-target", "aarch64-linux-gnu", "-std=c++17", "-O1", "-fno-math-errno",
             "-fPIC", "-fvisibility=hidden", "-fvisibility-inlines-hidden", "-Wall",
             "-Werror", f"-I{ROOT / 'ffi' / 'include'}", f"-I{CPU}",
             '-DOXIJAX_CPU_LEVEL="neon"', '-DOXIJAX_CPU_FLAGS="-O1"']
    objects = [tmp_path / f"{source.stem}.o" for source in SOURCES]
    with concurrent.futures.ThreadPoolExecutor(os.cpu_count() or 2) as pool:
        list(pool.map(lambda so: zig(*flags, "-c", str(so[0]), "-o", str(so[1]),
                                     cache=tmp_path),
                      zip(SOURCES, objects)))
    library = tmp_path / "liboxijax_cpu_neon.so"
    zig("-target", "aarch64-linux-gnu", "-shared", "-o", str(library), *map(str, objects),
        f"-Wl,--version-script={CPU / 'kernel_library.map'}", "-lpthread", cache=tmp_path)
    elf = library.read_bytes()
    assert elf[:4] == b"\x7fELF"
    assert struct.unpack_from("<H", elf, 18)[0] == EM_AARCH64
    assert b"oxijax_cpu_kernel_table" in elf
