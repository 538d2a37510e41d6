"""scripts/kernel_report.py: per-kernel resources, tensor-core SASS counts and H200
occupancy of the built extension's sm_90 cubins (no GPU needed).

The report's own arithmetic (names, occupancy, the dynamic shared memory table) is tested
everywhere; the report on the extension runs when oxijax was built with CUDA kernels for
sm_90 and cuobjdump/nvdisasm are found (the test extra installs them from pip), and
skips otherwise."""

from __future__ import annotations

import importlib.util
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

import oxijax

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "scripts" / "kernel_report.py"
# The kernels that use tensor cores today (HMMA; DMMA for the float64 gemm config): the
# attention forward and backward, gemm, conv2d forward and backward.
TENSOR_CORE = ("attention_mma_kernel", "dkdv_mma_kernel", "dq_mma_kernel", "mma_gemm_kernel",
               "conv2d_tc_kernel", "igemm_tc_kernel")
SIMT = ("sgemm_simt_kernel",)


def _load_script():
    spec = importlib.util.spec_from_file_location("kernel_report", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


kernel_report = _load_script()


def _report(*args: str) -> dict:
    done = subprocess.run([sys.executable, str(SCRIPT), *args, "--json"], capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


@pytest.fixture(scope="module")
def extension() -> str:
    """The loaded extension's path; skips unless it has sm_90 CUDA kernels and the tools
    are found."""
    if not oxijax.BUILD_INFO["cuda"]:
        pytest.skip("oxijax was built without CUDA kernels")
    architectures = oxijax.BUILD_INFO["cuda_architectures"].split()
    if not any(re.fullmatch(r"90a?(-real)?", a) for a in architectures):
        pytest.skip(f"no sm_90 cubin in this build (architectures: {architectures})")
    missing = [tool for tool in ("cuobjdump", "nvdisasm") if kernel_report.find_tool(tool) is None]
    if missing:
        pytest.skip(f"{' and '.join(missing)} not found (pip install nvidia-cuda-cuobjdump "
                    "nvidia-cuda-nvdisasm: the test extra has them)")
    from oxijax._extension import _oxijax

    return _oxijax.__file__


@pytest.fixture(scope="module")
def resources(extension) -> dict:
    """Every kernel, without the disassembly."""
    return _report(extension, "--no-sass")


@pytest.fixture(scope="module")
def disassembled(extension) -> dict:
    """The tensor-core kernels and the SIMT gemm, with SASS instruction counts."""
    return _report(extension, "--kernel", "|".join(TENSOR_CORE + SIMT))


def _f64_kind() -> int:
    """The value of Kind::kF64 in gemm_kernels.cu (mma_gemm_kernel's float64 config)."""
    source = (ROOT / "ffi" / "cuda" / "gemm_kernels.cu").read_text()
    match = re.search(r"enum class Kind\s*\{([^}]*)\}", source)
    assert match, "gemm_kernels.cu declares no `enum class Kind`: update this test"
    return [name.strip() for name in match.group(1).split(",")].index("kF64")


def test_every_kernel_has_resources(resources):
    rows = resources["kernels"]
    assert rows and resources["arch"] == "sm_90"
    assert [r["name"] for r in rows] == sorted(r["name"] for r in rows)
    assert len({(r["cubin"], r["mangled"]) for r in rows}) == len(rows)
    for row in rows:
        assert 0 < row["registers"] <= 255, row["name"]
        for key in ("stack_bytes", "local_bytes", "static_shared_bytes"):
            assert isinstance(row[key], int) and row[key] >= 0, (row["name"], key)
        assert row["sass"] is None
        if row["threads_per_block"] is None:  # no __launch_bounds__: no occupancy
            assert row["occupancy"] is None, row["name"]
            continue
        # At least one block of the launch bound fits on an SM.
        assert row["blocks_per_sm"] >= 1 and 0 < row["occupancy"] <= 1, row["name"]
    for family in TENSOR_CORE:
        assert any(r["name"].startswith(family + "<") for r in rows), family


def test_tensor_core_kernels_use_tensor_cores(disassembled):
    rows = disassembled["kernels"]
    f64 = re.compile(rf"4KindE{_f64_kind()}E")
    assert any(f64.search(r["mangled"]) for r in rows), "no float64 mma_gemm_kernel"
    for row in rows:
        sass = row["sass"]
        assert all(isinstance(v, int) and v >= 0 for v in sass.values()), row["name"]
        assert sass["instructions"] > 0, row["name"]
        if row["name"].startswith(SIMT):
            assert sass["HMMA"] == sass["DMMA"] == 0, row["name"]
        elif row["name"].startswith("mma_gemm_kernel") and f64.search(row["mangled"]):
            assert sass["DMMA"] > 0 and sass["HMMA"] == 0, row["name"]
        else:
            assert row["name"].startswith(TENSOR_CORE), row["name"]
            assert sass["HMMA"] > 0 and sass["DMMA"] == 0, row["name"]


def test_table(disassembled):
    """The text table: one aligned line per kernel under the column titles."""
    lines = kernel_report.format_table(disassembled).splitlines()
    titles = next(i for i, line in enumerate(lines) if line.startswith("kernel "))
    assert all(line.startswith("# ") for line in lines[:titles])
    for title in ("regs", "stack", "STL", "LDL", "smem", "dyn_smem", "threads", "HMMA",
                  "DMMA", "LDSM", "LDGSTS", "blocks/SM", "occ", "limit"):
        assert title in lines[titles].split(), title
    rows = lines[titles + 2:]
    assert [row.split()[0] for row in rows] == [r["name"].split()[0] for r in disassembled["kernels"]]
    last = lines[titles].index(" limit") + 1  # columns aligned: the last starts in line
    assert all(row[last - 2:last] == "  " and row[last] != " " for row in rows)
    assert all(line.startswith(tuple(f"{k}<" for k in TENSOR_CORE + SIMT)) for line in rows)


def test_errors_are_one_line(tmp_path):
    """A missing file, or one without device code (or missing tools): exit status 1 and
    one line on stderr, no traceback."""
    not_elf = tmp_path / "_oxijax.so"
    not_elf.write_bytes(b"not an extension")
    for path in (tmp_path / "missing.so", not_elf):
        done = subprocess.run([sys.executable, str(SCRIPT), str(path), "--no-sass"],
                              capture_output=True, text=True, timeout=60)
        assert done.returncode == 1, done.stderr
        assert done.stderr.startswith("kernel_report: ") and done.stderr.count("\n") == 1


def test_short_names():
    short = kernel_report.short_name
    assert short("void oxijax::cuda::(anonymous namespace)::mma_gemm_kernel<oxijax::cuda::"
                 "(anonymous namespace)::MmaConfig<(oxijax::cuda::(anonymous namespace)::Kind)3>"
                 ", true, false>(oxijax::cuda::(anonymous namespace)::Params<oxijax::cuda::"
                 "(anonymous namespace)::MmaConfig<(oxijax::cuda::(anonymous namespace)::Kind)"
                 "3>::Elem>)") == "mma_gemm_kernel<MmaConfig<(Kind)3>, true, false>"
    assert short("void cub::CUB_300001_SM_800_900::detail::EmptyKernel<void>()") == \
        "EmptyKernel<void>"
    assert short("_Z1kv") == "_Z1kv"  # not demangled: kept


def test_occupancy_model():
    occupancy = kernel_report.occupancy
    # 244 registers, 128 threads, 1 KiB static + 80 KiB dynamic: 2 blocks by registers
    # (7936 per warp, 2 warps per sub-partition) and by shared memory (82 KiB each).
    assert occupancy(244, 128, 1024 + 81920) == {
        "blocks_per_sm": 2, "active_warps": 8, "occupancy": 0.125, "limit": "regs+smem"}
    assert occupancy(32, 256, 0)["blocks_per_sm"] == 8  # the 64 warps per SM
    assert occupancy(16, 32, 0)["limit"] == "blocks"  # 32 blocks per SM
    assert occupancy(64, 1024, 0)["blocks_per_sm"] == 1  # 64 K registers
    assert occupancy(65, 1024, 0)["blocks_per_sm"] == 0  # over the per-block register file
    assert occupancy(32, 128, 227 * 1024 + 1)["blocks_per_sm"] == 0  # over 227 KiB
    assert occupancy(32, 128, 100 * 1024)["blocks_per_sm"] == 2  # 101 KiB each of 228
    assert occupancy(32, None, 0)["occupancy"] is None


def test_dynamic_shared_table():
    table = kernel_report.DYNAMIC_SHARED
    dynamic = kernel_report.dynamic_shared
    assert dynamic("attention_mma_kernel<(MmaInput)1, 64>", table) == 5 * 64 * 64 * 2
    assert dynamic("attention_mma_kernel<(MmaInput)0, 128>", table) == 5 * 64 * 128 * 2
    assert dynamic("attention_mma_kernel<(MmaInput)2, 256>", table) == (64 + 4 * 32) * 256 * 2
    # dkdv: K, V [64][D], 2 x (Q, dO) [step][D] 16-bit, lse and delta 2 x step floats.
    assert dynamic("dkdv_mma_kernel<true, 128>", table) == 2 * (2 * 64 * 128 + 4 * 32 * 128) + 16 * 32
    assert dynamic("dq_mma_kernel<false, 64>", table) == 2 * (2 * 64 * 64 + 4 * 64 * 64)
    assert dynamic("mma_gemm_kernel<MmaConfig<(Kind)0>, true, true>", table) is None
    assert dynamic("anything", []) is None
    assert kernel_report.parse_dynamic(["^k<=4096"]) == [("^k<", 4096)]


def test_res_usage_parsing():
    text = """
Resource usage:
 Common:
  GLOBAL:0
 Function _Z1av:
  REG:32 STACK:8 SHARED:1024 LOCAL:0 CONSTANT[0]:888 TEXTURE:0 SURFACE:0 SAMPLER:0
 Function _Z1bv:
  REG:255 STACK:0 SHARED:0 LOCAL:16 CONSTANT[0]:528 TEXTURE:0 SURFACE:0 SAMPLER:0
"""
    usage = kernel_report.parse_res_usage(text)
    assert usage["_Z1av"]["REG"] == 32 and usage["_Z1av"]["STACK"] == 8
    assert usage["_Z1av"]["SHARED"] == 1024 and usage["_Z1bv"]["LOCAL"] == 16
