"""Run-time choice of the CPU kernels' instruction-set level (ffi/cpu/isa_dispatch.h):
the levels detected against the kernel's own /proc/cpuinfo, the default choice, the
OXIJAX_CPU_ISA override and its errors, and the op tests run again under every other
level this CPU runs."""

from __future__ import annotations

import os
import pathlib
import platform
import re
import shutil
import subprocess
import sys

import pytest

import oxijax

BUILD = oxijax.BUILD_INFO
ROOT = pathlib.Path(__file__).resolve().parent.parent
X86 = platform.machine() in ("x86_64", "AMD64")

# The op tests: every kernel against its jnp / NumPy float64 reference, forward and
# backward, through JAX and through the pointer backend's CPU device.
OP_TESTS = ["test_gemm.py", "test_conv2d.py", "test_attention.py", "test_attention_grad.py",
            "test_attention_jvp.py", "test_elementwise.py", "test_reduce.py",
            "test_numerics.py", "test_grad.py", "test_backend_compute.py"]

# /proc/cpuinfo flags of each x86-64 level above the baseline (x86-64-v3 includes v2;
# the kernel calls SSE3 "pni").
X86_LEVEL_FLAGS = {
    "avx2": {"pni", "ssse3", "sse4_1", "sse4_2", "popcnt", "cx16", "lahf_lm", "avx",
             "avx2", "bmi1", "bmi2", "f16c", "fma", "abm", "movbe", "xsave"},
    "avx512": {"avx512f", "avx512bw", "avx512cd", "avx512dq", "avx512vl"},
    "avx512bf16": {"avx512_bf16"},
    "amx": {"amx_tile", "amx_bf16"},
}
X86_LEVELS = ["baseline", "avx2", "avx512", "avx512bf16", "amx"]


def cpuinfo_field(name: str) -> str:
    for line in pathlib.Path("/proc/cpuinfo").read_text().splitlines():
        if line.split(":", 1)[0].strip() == name:
            return line.split(":", 1)[1].strip()
    pytest.skip(f"/proc/cpuinfo has no {name}")


def cpuinfo_flags() -> set[str]:
    return set(cpuinfo_field("flags").split())


def run_python(code: str, isa: str | None) -> subprocess.CompletedProcess:
    env = dict(os.environ)
    env.pop("OXIJAX_CPU_ISA", None)
    if isa is not None:
        env["OXIJAX_CPU_ISA"] = isa
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env=env, cwd=ROOT / "tests", timeout=300)


def test_the_level_in_use_is_the_default_unless_forced():
    assert BUILD["cpu_isa_levels"], "this CPU runs no level of the build"
    assert set(BUILD["cpu_isa_levels"]) <= set(BUILD["cpu_isa_built"])
    expected = os.environ.get("OXIJAX_CPU_ISA") or BUILD["cpu_isa_default"]
    assert BUILD["cpu_isa"] == expected


def test_the_default_is_the_best_level_but_avx512bf16_on_intel():
    """VDPBF16PS runs at half the rate of the FMAs on Intel CPUs (isa_dispatch.cc)."""
    best = BUILD["cpu_isa_levels"][-1]
    if X86 and best == "avx512bf16" and cpuinfo_field("vendor_id") == "GenuineIntel":
        assert BUILD["cpu_isa_default"] == "avx512"
    else:
        assert BUILD["cpu_isa_default"] == best


@pytest.mark.skipif(not X86, reason="x86-64 levels")
def test_x86_build_has_every_level():
    if os.environ.get("OXIJAX_CPU_LEVELS"):
        pytest.skip("built for the levels of OXIJAX_CPU_LEVELS only")
    assert BUILD["cpu_isa_built"] == X86_LEVELS
    flags = {"baseline": ["-march=x86-64"], "avx2": ["-march=x86-64-v3"],
             "avx512": ["-march=x86-64-v4"],
             "avx512bf16": ["-march=x86-64-v4", "-mavx512bf16"],
             "amx": ["-march=x86-64-v4", "-mavx512bf16", "-mamx-tile", "-mamx-bf16"],
             }[BUILD["cpu_isa"]]
    assert set(flags) <= set(BUILD["cpu_flags"].split())
    assert "-march=native" not in BUILD["cpu_flags"]


@pytest.mark.skipif(not X86, reason="x86-64 levels")
def test_detected_levels_match_proc_cpuinfo():
    """cpuid + XCR0 (isa_dispatch.cc) against the kernel's own reading of the CPU (which
    lists AMX only when it supports it: Linux 5.16 and newer grant it on request)."""
    flags = cpuinfo_flags()
    expected = ["baseline"]
    for level in X86_LEVELS[1:]:  # each includes the one before
        if not X86_LEVEL_FLAGS[level] <= flags:
            break
        expected.append(level)
    assert BUILD["cpu_isa_levels"] == [lv for lv in expected if lv in BUILD["cpu_isa_built"]]


@pytest.mark.parametrize("level", ["unknown", "avx512", "avx512bf16", "amx"])
def test_forcing_a_level_the_cpu_lacks_is_a_clear_import_error(level):
    if level in BUILD["cpu_isa_levels"]:
        pytest.skip(f"this CPU runs {level}")
    result = run_python("import oxijax", level)
    assert result.returncode != 0
    reason = "is not a level of this build" if level not in BUILD["cpu_isa_built"] else (
        "asks for instructions this CPU lacks")
    assert f"OXIJAX_CPU_ISA={level} {reason}" in result.stderr


@pytest.mark.parametrize("level", BUILD["cpu_isa_levels"])
def test_every_runnable_level_loads_and_computes(level):
    code = ("import oxijax, jax.numpy as jnp, numpy as np\n"
            "x = jnp.linspace(-3, 3, 1000, dtype=jnp.float32).reshape(40, 25)\n"
            "got = np.asarray(oxijax.gemm(x, x.T))\n"
            "want = np.asarray(x, np.float64) @ np.asarray(x, np.float64).T\n"
            "assert np.allclose(got, want, rtol=1e-5, atol=1e-4)\n"
            "print(oxijax.BUILD_INFO['cpu_isa'])")
    result = run_python(code, level)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == level


@pytest.mark.slow
@pytest.mark.skipif(len(BUILD["cpu_isa_levels"]) < 2, reason="this CPU runs one level")
def test_sums_are_bit_identical_on_every_level():
    """reduce.cc sums in the same order on every level, whatever its vector width: along
    rows, the lanes of one 512-bit vector (bfloat16's even and odd elements apart; rows
    shorter than that padded with zeros);
    over other axes, each column on its own."""
    code = ("import hashlib, oxijax, jax.numpy as jnp, numpy as np\n"
            "rng = np.random.default_rng(0)\n"
            "digest = hashlib.sha256()\n"
            "for dtype in (jnp.bfloat16, jnp.float16, jnp.float32):\n"
            "    for n in (7, 16, 31, 33, 4097, 70001):\n"
            "        rows = 39 if n < 64 else 3  # short rows: 16 at a time, the rest alone\n"
            "        x = jnp.asarray(rng.standard_normal((rows, n)) * 100, dtype)\n"
            "        y = x.reshape(-1, 3)  # columns of 3: narrower than any vector\n"
            "        for out in (oxijax.sum(x, 1), oxijax.mean(x, 1), oxijax.sum(x.ravel(), 0),\n"
            "                    oxijax.sum(x, 0), oxijax.sum(y, 0), oxijax.mean(y, 0)):\n"
            "            digest.update(np.asarray(out, np.float32).tobytes())\n"
            "print(digest.hexdigest())")
    digests = {}
    for level in BUILD["cpu_isa_levels"]:
        result = run_python(code, level)
        assert result.returncode == 0, result.stderr
        digests[level] = result.stdout.strip()
    assert len(set(digests.values())) == 1, digests


def test_kernel_libraries_export_only_their_table():
    """Each level's library keeps its own copies of shared templates (kernel_table.h):
    nothing but the table is visible to the dynamic linker."""
    nm = shutil.which("nm")
    if nm is None:
        pytest.skip("no nm (binutils)")
    from oxijax._extension import _oxijax

    folder = pathlib.Path(_oxijax.__file__).parent
    for level in BUILD["cpu_isa_built"]:
        library = folder / f"liboxijax_cpu_{level}.so"
        out = subprocess.run([nm, "-D", "--defined-only", str(library)], capture_output=True,
                             text=True, check=True).stdout
        assert [line.split()[-1] for line in out.splitlines()] == ["oxijax_cpu_kernel_table"]


# Every level this CPU runs but the one in use.
OTHER_LEVELS = [level for level in BUILD["cpu_isa_levels"] if level != BUILD["cpu_isa"]]

# Levels that compile only a few sources themselves and take the rest as the objects of
# a level below (CMakeLists.txt: OXIJAX_CPU_LEVEL_BASE_*, OXIJAX_CPU_LEVEL_OWN_SOURCES_*):
# that level, their own sources, and the feature macro that sets them apart. Checked by
# test_shared_objects_are_what_cmake_builds.
SHARES_OBJECTS_OF = {
    # bfloat16 gemm and conv2d (the forward, and the stride-1 data gradient that runs
    # it) on VDPBF16PS.
    "avx512bf16": ("avx512", {"gemm.cc", "conv2d.cc", "conv2d_filter_grad.cc"},
                   "__AVX512BF16__"),
    # bfloat16 gemm and conv2d on AMX tiles.
    "amx": ("avx512", {"gemm.cc", "conv2d.cc", "conv2d_filter_grad.cc"}, "__AMX_BF16__"),
}
# The op tests that run each of those sources.
TESTS_OF_SOURCE = {"gemm.cc": ["test_gemm.py", "test_grad.py"],
                   "conv2d.cc": ["test_conv2d.py", "test_grad.py"],
                   "conv2d_filter_grad.cc": ["test_conv2d.py", "test_grad.py"]}


def op_tests_for(level: str) -> list[str]:
    """The op tests that run code of `level` other than the level in use's: all of them,
    unless both levels are a level's objects but for a few sources."""
    def base_and_own(lv):
        base, own, _ = SHARES_OBJECTS_OF.get(lv, (lv, set(), None))
        return base, own

    base, own = base_and_own(level)
    in_use_base, in_use_own = base_and_own(BUILD["cpu_isa"])
    if base != in_use_base:
        return OP_TESTS
    differing = {test for source in own | in_use_own for test in TESTS_OF_SOURCE[source]}
    return [test for test in OP_TESTS if test in differing]


def test_shared_objects_are_what_cmake_builds():
    """A level of SHARES_OBJECTS_OF compiles exactly its own sources (CMakeLists.txt),
    which are the sources that pack for the gemm engine's element types (Packed<T>,
    GemmPacked<T>) where its instructions change them, and its feature macro appears
    nowhere else but in those sources and the engine's headers."""
    cmake = (ROOT / "CMakeLists.txt").read_text()
    own = {m.group(1): {pathlib.Path(p).name for p in m.group(2).split()}
           for m in re.finditer(r"set\(OXIJAX_CPU_LEVEL_OWN_SOURCES_(\w+) ([^)]*)\)", cmake)}
    base = dict(re.findall(r"set\(OXIJAX_CPU_LEVEL_BASE_(\w+) (\w+)\)", cmake))
    assert {lv: (b, o) for lv, (b, o, _) in SHARES_OBJECTS_OF.items()} == {
        lv: (base[lv], own[lv]) for lv in own}
    sources = {path.name: path.read_text() for path in (ROOT / "ffi" / "cpu").glob("*.cc")}
    packed_users = {name for name, text in sources.items() if "Packed<" in text}
    assert packed_users == own["avx512bf16"], packed_users
    assert {name for name, text in sources.items() if "GemmPacked<" in text} == own["amx"]
    headers = {"gemm_microkernel.h", "gemm_amx.h", "conv2d_taps.h"}
    for level, (_, own_sources, macro) in SHARES_OBJECTS_OF.items():
        users = {path.name for path in (ROOT / "ffi").rglob("*")
                 if path.is_file() and macro in path.read_text(errors="ignore")}
        assert users <= headers | own_sources, (level, users)


@pytest.mark.slow
@pytest.mark.skipif(not OTHER_LEVELS, reason="this CPU runs only one level of the build")
def test_op_tests_pass_under_every_other_level(tmp_path):
    """The op tests again, in a fresh process per other level on that level's kernels (the
    suite itself runs on the level in use), so CI checks every level its CPU runs against
    the references. The levels run one after another and share a JAX compilation cache:
    their programs are the same (a custom call finds its level's kernel when it runs), so
    after the first level most compilations are cache hits, ~40 % of a run's time."""
    failures = []
    for level in OTHER_LEVELS:
        env = dict(os.environ, OXIJAX_CPU_ISA=level,
                   JAX_COMPILATION_CACHE_DIR=str(tmp_path / "jax_cache"),
                   JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0",
                   JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES="0")
        tests = [f"{__file__}::test_the_level_in_use_is_the_default_unless_forced",
                 *(str(ROOT / "tests" / name) for name in op_tests_for(level))]
        result = subprocess.run(
            [sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider", "-p",
             "no:xdist", "-c", str(ROOT / "pyproject.toml"), "--rootdir", str(ROOT),
             "-m", "not gpu and not cuda_interpret and not fuzz", *tests],
            # Not the checkout's folder: `python -m` would import its oxijax/ before the
            # installed package.
            capture_output=True, text=True, env=env, cwd=tmp_path, timeout=1200)
        tail = "\n".join(result.stdout.splitlines()[-30:])
        if result.returncode != 0 or " passed" not in tail or " failed" in tail:
            failures.append(f"op tests under OXIJAX_CPU_ISA={level}:\n{tail}\n"
                            f"{result.stderr[-2000:]}")
    assert not failures, "\n\n".join(failures)


def test_gpu_check_leaves_out_tests_that_exist():
    """scripts/gpu_check.sh leaves this file's all-levels op test out of its timed CPU
    step by name (`-k "not ..."`): after a rename the test ran there again, minutes
    past the step's limit."""
    script = (ROOT / "scripts" / "gpu_check.sh").read_text()
    names = re.findall(r'-k "not (\w+)"', script)
    assert names
    tests = "".join(path.read_text() for path in (ROOT / "tests").glob("test_*.py"))
    for name in names:
        assert re.search(rf"def test_\w*{name}", tests), name
