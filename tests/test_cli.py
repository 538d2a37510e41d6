"""`python -m oxijax`: info, check and bench run and report."""

import json
import subprocess
import sys

from oxijax import _cases


def run(*args):
    return subprocess.run([sys.executable, "-m", "oxijax", *args], capture_output=True, text=True)


def test_info_lists_targets():
    result = run("info")
    assert result.returncode == 0, result.stderr
    assert "FFI targets on cpu" in result.stdout and "oxijax_attention" in result.stdout


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
    assert {r["op"] for r in results} == {c.op for c in cli._cases.cases("small")}
    assert all(r["oxijax_ms"] > 0 and r["ratio"] > 0 and r["copy_gbps"] > 0 for r in results)
    # cuDNN attention is a baseline that cannot run on a CPU: reported, as NaN, not dropped.
    attention = next(r for r in results if r["op"] == "attention")
    assert set(attention["baselines"]) == {"XLA", "cuDNN"}
