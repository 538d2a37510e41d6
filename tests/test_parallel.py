"""The CPU kernels' parallel loop (ffi/cpu/parallel.cc) under ThreadSanitizer and
AddressSanitizer + UBSan: tests/native/parallel_stress.cc runs thousands of loops of
random sizes with 15 helper threads, each loop checking that every index ran exactly
once, that a failing chunk's exception reaches the caller, and that no helper called
the loop's scheduler after the loop had returned (helpers start further helpers, and
XLA's pool handle is valid only during the FFI call). The op tests cover the loop's
results on the machine's own thread count; this covers the many-thread interleavings a
2-core machine would not otherwise produce."""

from __future__ import annotations

import os
import pathlib
import shutil
import subprocess

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
SOURCES = [ROOT / "tests" / "native" / "parallel_stress.cc", ROOT / "ffi" / "cpu" / "parallel.cc"]
COMPILER = os.environ.get("CXX") or shutil.which("c++") or shutil.which("g++")
SANITIZERS = {"tsan": "thread", "asan": "address,undefined"}
HELPERS = 15  # as on a 16-core machine


def compile(folder: pathlib.Path, sanitizer: str, sources: list[pathlib.Path]) -> subprocess.CompletedProcess:
    return subprocess.run(
        [COMPILER, "-std=c++17", "-O1", "-g", "-pthread", f"-fsanitize={sanitizer}",
         "-fno-sanitize-recover=all", "-fno-omit-frame-pointer", f"-I{ROOT / 'ffi' / 'cpu'}",
         *map(str, sources), "-o", str(folder / "parallel_stress")],
        capture_output=True, text=True, timeout=300)


@pytest.fixture(scope="module", params=sorted(SANITIZERS))
def stress_program(request, tmp_path_factory) -> pathlib.Path:
    if COMPILER is None:
        pytest.skip("no C++ compiler (CXX, c++ or g++)")
    sanitizer = SANITIZERS[request.param]
    folder = tmp_path_factory.mktemp(request.param)
    probe = folder / "probe.cc"
    probe.write_text("int main() { return 0; }\n")
    if compile(folder, sanitizer, [probe]).returncode != 0:
        pytest.skip(f"{COMPILER} cannot link -fsanitize={sanitizer} here")
    result = compile(folder, sanitizer, SOURCES)
    assert result.returncode == 0, result.stderr[-4000:]
    return folder / "parallel_stress"


@pytest.mark.parametrize("mode", ["pool", "late", "throw"])
def test_parallel_loop(stress_program, mode):
    env = dict(os.environ, TSAN_OPTIONS="halt_on_error=1", ASAN_OPTIONS="detect_leaks=1")
    result = subprocess.run([str(stress_program), mode, str(HELPERS), "1500"],
                            capture_output=True, text=True, env=env, timeout=300)
    assert result.returncode == 0, result.stderr[-4000:]
    assert result.stdout.strip() == "ok"
    assert "WARNING" not in result.stderr and "ERROR" not in result.stderr, result.stderr[-4000:]
