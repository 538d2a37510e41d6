"""`python -m oxijax`: info, check and bench run and report."""

import json
import os
import subprocess
import sys

import pytest

import oxijax
from oxijax import _cases


def run(*args):
    return subprocess.run([sys.executable, "-m", "oxijax", *args], capture_output=True, text=True)


def test_info_lists_targets():
    result = run("info")
    assert result.returncode == 0, result.stderr
    assert "FFI targets on cpu" in result.stdout and "oxijax_attention" in result.stdout


@pytest.mark.slow
def test_check_passes_every_op():
    result = run("check", "--dtype", "float32", "--dtype", "bfloat16")
    assert result.returncode == 0, result.stdout + result.stderr
    lines = result.stdout.splitlines()
    for op in ("unary exp", "binary add", "reduce sum axis 0", "gemm", "conv2d 3x3 pad 1", "attention causal"):
        assert any(line.strip().startswith(op) and line.rstrip().endswith("ok") for line in lines), op
    # every case of the check (fwd+bwd cases included), in both dtypes
    assert lines[-1] == f"{2 * len(_cases.cases('small'))} passed, 0 failed"


def test_bench_writes_json(tmp_path, monkeypatch):
    from oxijax import __main__ as cli

    path = tmp_path / "bench.json"
    assert cli.main(["bench", "--size", "small", "--repeats", "2", "--json", str(path)]) == 0
    report = json.loads(path.read_text())
    results = report["results"]
    assert report["sizes"] == "small"
    assert report["cpu"]["kernels"] == oxijax.BUILD_INFO["cpu_isa"]
    assert report["cpu"]["threads"] >= 1
    cases = cli._cases.cases("small") + cli._cases.eager_cases()
    # and the training-step rows that run in float32 (the default dtype)
    cases += [c for c in cli._cases.training_cases("small") if "float32" in c.dtypes]
    assert {r["op"] for r in results} == {c.op for c in cases}
    assert all(r["oxijax_ms"] > 0 and r["ratio"] > 0 and r["copy_gbps"] > 0 for r in results)
    # cuDNN attention is a baseline that cannot run on a CPU: reported, as NaN, not dropped.
    attention = next(r for r in results if r["op"] == "attention")
    assert set(attention["baselines"]) == {"XLA", "cuDNN"}


def test_bench_quick_prints_a_table_and_plots(tmp_path, capsys):
    from oxijax import __main__ as cli

    plot = tmp_path / "bench.png"
    assert cli.main(["bench", "--quick", "--dtype", "float32", "--plot", str(plot)]) == 0
    out = capsys.readouterr().out
    header = next(line for line in out.splitlines() if line.startswith("op "))
    assert "oxijax ms" in header and "XLA/oxijax" in header
    rows = [line for line in out.splitlines() if line.startswith(("gemm ", "attention "))]
    assert rows and all("TFLOP/s" in line for line in rows)
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_roofline_plot_for_a_gpu_report(tmp_path):
    """The roofline panel only appears on a GPU; draw it from a synthetic GPU report."""
    from oxijax import benchmark

    row = {"op": "gemm", "dtype": "bfloat16", "shape": "8192^3", "oxijax_ms": 1.5, "xla_ms": 1.2,
           "ratio": 0.8, "flops": 2.0 * 8192**3, "bytes": 6.0 * 8192**2, "copy_gbps": 4000.0,
           "baselines": {"XLA": {"ms": 1.2, "ratio": 0.8}}}
    report = benchmark.Report("cuda:0", "NVIDIA H200", "gpu", "gpu", 5, [row], {"bfloat16": 4000.0})
    figure = benchmark.plot(report, str(tmp_path / "roofline.png"))
    assert len(figure.axes) == 2
    assert (tmp_path / "roofline.png").stat().st_size > 0


def test_cpu_scaling_script_tables_rows_by_thread_count(tmp_path):
    # scripts/cpu_scaling.py: the bench's rows, each thread count in its own process.
    from pathlib import Path

    script = Path(__file__).resolve().parents[1] / "scripts" / "cpu_scaling.py"
    path = tmp_path / "scaling.json"
    result = subprocess.run(
        [sys.executable, str(script), "--threads", "1,100000", "--op", "eager sum",
         "--size", "quick", "--dtype", "float32", "--repeats", "2", "--json", str(path)],
        capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr
    report = json.loads(path.read_text())
    # A thread count above the CPUs this process may use is left out, with a note.
    assert report["cpu"]["threads"] == [1] and report["cpu"]["kernels"]
    assert "larger thread counts are left out" in result.stderr
    [row] = report["rows"]
    assert (row["op"], row["dtype"]) == ("eager sum", "float32")
    run = row["threads"]["1"]
    assert run["oxijax_ms"] > 0 and run["xla_ms"] > 0 and run["ratio"] > 0
    line = next(line for line in result.stdout.splitlines() if line.startswith("eager sum"))
    assert f"= {run['ratio']:.2f}" in line


def test_xla_isa_script_holds_xla_to_avx2_with_the_same_results():
    # scripts/xla_isa.py, for like-for-like tables: XLA:CPU's LLVM code and its YNNPACK
    # kernels held to AVX2 on a CPU with more. XLA's results must not change (a float32
    # dot and a bfloat16 max along rows against NumPy float64), and YNNPACK must hold the
    # written flags. Where this jaxlib lacks the symbol, the script says so and stops.
    from pathlib import Path

    if "avx2" not in oxijax.BUILD_INFO["cpu_isa_levels"]:  # the levels this CPU runs
        pytest.skip("this CPU has no AVX2")
    script = Path(__file__).resolve().parents[1] / "scripts" / "xla_isa.py"
    code = """
import os, jax, jax.numpy as jnp, numpy as np, xla_isa
x = np.random.default_rng(0).standard_normal((300, 200)).astype(np.float32)
exact = x.astype(np.float64) @ x.T.astype(np.float64)
print(float(np.abs(np.asarray(jnp.dot(x, x.T)) - exact).max() / np.abs(exact).max()))
rows = jnp.asarray(x, jnp.bfloat16)
print(bool((np.asarray(jnp.max(rows, axis=1), np.float64) ==
            np.asarray(rows, np.float64).max(axis=1)).all()))
flags, guard = xla_isa._cells(xla_isa._library())
print(flags.value, guard.value, os.environ["XLA_FLAGS"])
"""
    result = subprocess.run([sys.executable, str(script), "avx2", "-c", code],
                            capture_output=True, text=True, cwd=script.parent,
                            env=dict(os.environ, JAX_PLATFORMS="cpu"))
    if result.returncode != 0 and ("has no symbol" in result.stderr or
                                   "cannot list the symbols" in result.stderr):
        pytest.skip(result.stderr.strip())
    assert result.returncode == 0, result.stdout + result.stderr
    error, rows_equal, caps = result.stdout.split("\n")[-4:-1]
    assert float(error) < 1e-5 and rows_equal == "True"
    flags, guard, xla_flags = caps.split(" ", 2)
    assert (int(flags), int(guard)) == (0x7F, 1) and "--xla_cpu_max_isa=AVX2" in xla_flags


def test_cpu_table_script_gives_the_median_of_its_runs(tmp_path):
    # scripts/cpu_table.py: the README's table, the median of runs in fresh processes.
    from pathlib import Path

    script = Path(__file__).resolve().parents[1] / "scripts" / "cpu_table.py"
    result = subprocess.run(
        [sys.executable, str(script), "--runs", "3", "--json-dir", str(tmp_path),
         "--op", "eager sum", "--size", "quick", "--dtype", "float32", "--repeats", "2"],
        capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr
    reports = [json.loads((tmp_path / f"bench_{i}.json").read_text()) for i in (1, 2, 3)]
    runs = [r["results"][0] for r in reports]
    header, _, names, _, row = result.stdout.splitlines()[:5]
    cpu = reports[0]["cpu"]
    assert cpu["model"] in header and f"`{cpu['kernels']}`" in header
    assert ", ".join(oxijax.BUILD_INFO["cpu_isa_levels"]) in header
    assert reports[0]["started"][:10] in header and "median of 3 runs" in header
    assert names.startswith("| op | shape | dtype | oxijax ms | XLA ms |")
    cells = [c.strip() for c in row.strip("|").split("|")]
    mine = sorted(r["oxijax_ms"] for r in runs)[1]
    xla = sorted(r["xla_ms"] for r in runs)[1]
    assert cells[:5] == ["eager sum", runs[0]["shape"], "float32", f"{mine:.3f}", f"{xla:.3f}"]
    assert cells[6] == f"{xla / mine:.2f}"
    assert cells[7] == ", ".join(f"{r['xla_ms'] / r['oxijax_ms']:.2f}" for r in runs)

    # The same table from the saved reports.
    again = subprocess.run(
        [sys.executable, str(script), "--from", *(str(tmp_path / f"bench_{i}.json")
                                                   for i in (1, 2, 3))],
        capture_output=True, text=True)
    assert again.returncode == 0, again.stderr
    assert again.stdout == result.stdout

    # Runs of another kernel level make no one table with these.
    other = dict(reports[0], cpu=dict(reports[0]["cpu"], kernels="another level"))
    (tmp_path / "other.json").write_text(json.dumps(other))
    mixed = subprocess.run(
        [sys.executable, str(script), "--from", str(tmp_path / "bench_1.json"),
         str(tmp_path / "other.json")], capture_output=True, text=True)
    assert mixed.returncode != 0 and "make no one table" in mixed.stderr

    # Runs with XLA held to a level (--xla-isa) say so, and make no table with others.
    held = [dict(r, xla_isa="avx2") for r in reports]
    for i, report in enumerate(held):
        (tmp_path / f"held_{i}.json").write_text(json.dumps(report))
    paths = [str(tmp_path / f"held_{i}.json") for i in range(3)]
    table = subprocess.run([sys.executable, str(script), "--from", *paths],
                           capture_output=True, text=True)
    assert table.returncode == 0, table.stderr
    assert "XLA:CPU held to `avx2` (scripts/xla_isa.py)" in table.stdout.splitlines()[0]
    assert table.stdout.splitlines()[1:] == result.stdout.splitlines()[1:]
    mixed = subprocess.run([sys.executable, str(script), "--from", paths[0],
                            str(tmp_path / "bench_1.json")], capture_output=True, text=True)
    assert mixed.returncode != 0 and "make no one table" in mixed.stderr


def test_gemm_probe_times_the_library_gemm_at_a_posed_l2(tmp_path):
    # scripts/gemm_probe.cc (scripts/cpu_check.sh): the FMA peak and cpu::gemm<float> as
    # a share of it, with the cache sizes posed through sysconf; it checks the results.
    import platform
    import shutil
    from pathlib import Path

    compiler = os.environ.get("CXX") or shutil.which("g++") or shutil.which("c++")
    if compiler is None:
        pytest.skip("no C++ compiler (CXX, g++ or c++)")
    if platform.machine() != "x86_64" or "avx2" not in oxijax.BUILD_INFO["cpu_isa_levels"]:
        pytest.skip("the probe times x86 FMA code: this CPU has no AVX2 + FMA")
    root = Path(__file__).resolve().parents[1]
    probe = tmp_path / "gemm_probe"
    build = subprocess.run(
        ["bash", str(root / "scripts" / "build_gemm_probe.sh"), str(probe), "-march=x86-64-v3"],
        capture_output=True, text=True, timeout=600, env=dict(os.environ, CXX=compiler))
    assert build.returncode == 0, build.stderr[-4000:]
    result = subprocess.run([str(probe), "1"], capture_output=True, text=True, timeout=300,
                            env=dict(os.environ, OXIJAX_PROBE_L2=str(256 << 10),
                                     OXIJAX_PROBE_L3=str(4 << 20)))
    assert result.returncode == 0, result.stdout + result.stderr
    lines = result.stdout.splitlines()
    assert lines[0].startswith("the gemm's blocking from L2 256 KiB, L3 4096 KiB")
    assert lines[1].startswith("1 thread: FMA peak") and float(lines[1].split()[4]) > 0
    cases = [line.split() for line in lines[2:]]
    assert [c[0] for c in cases] == ["1024^3", "1024^3", "8"] and len(lines) == 5
    assert all(float(c[c.index("median") + 1]) > 0 for c in cases)
