"""The benchmark's training-step rows (`python -m oxijax bench`): every implementation of a
row computes the same outputs and gradients, an implementation that cannot run here is
reported as "n/a" with its reason, and the 'gpu' size's rows are skipped on a CPU. Tiny
sizes only, no timing thresholds."""

import functools
import json
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from oxijax import _cases, benchmark

ON_GPU = jax.default_backend() == "gpu"
SMALL = _cases.training_cases("small")
PAIRS = [(case, dtype) for case in SMALL for dtype in case.dtypes]
IDS = [f"{case.op}-{dtype}" for case, dtype in PAIRS]


def run_step(impl, args):
    """One implementation's ((loss, out), grads) on args given in oxijax's layout, with
    out and grads brought back to that layout (what the benchmark compares)."""
    native = tuple(impl.to_native(a) for a in args)
    (loss, out), grads = jax.jit(_cases.training_step(impl.forward))(*native)
    assert len(grads) == len(args) - 1
    for g, x in zip(grads, native):  # gradients come in the implementation's layout
        assert g.shape == x.shape and g.dtype == x.dtype
    return loss, [np.asarray(impl.from_native(x), np.float64) for x in (out, *grads)]


def test_the_gpu_rows_have_the_requested_shapes():
    cases = {c.op: c for c in _cases.training_cases("gpu")}
    assert set(cases) == {"attention train step", "attention causal train step",
                          "conv2d 3x3 train step", "conv2d 3x3 stride 2 train step"}
    for op in ("attention train step", "attention causal train step"):
        assert cases[op].shape == "B2 H16 S4096 D128" and cases[op].dtypes == ("bfloat16",)
        assert [b.label for b in cases[op].baselines] == ["XLA", "cuDNN"]
    for op in ("conv2d 3x3 train step", "conv2d 3x3 stride 2 train step"):
        assert cases[op].shape == "32x256x28x28 * 256x256x3x3"
        assert set(cases[op].dtypes) == {"bfloat16", "float32"}
        assert [b.label for b in cases[op].baselines] == ["XLA (cuDNN)" if ON_GPU else "XLA"]
    assert _cases.training_cases("quick") == []


@pytest.mark.parametrize("case, dtype", PAIRS, ids=IDS)
def test_implementations_compute_the_same_step(case, dtype):
    """oxijax and every baseline that runs here give the same output and gradients (in
    oxijax's layout), and match the first baseline run in float64."""
    args = case.make_args(benchmark.DTYPES[dtype])
    reference_loss, reference = run_step(case.baselines[0], [a.astype(jnp.float64) for a in args])
    tolerance = benchmark.TRAINING_TOLERANCE[dtype]
    results = {}
    for impl in (case.oxijax, *case.baselines):
        if impl.label == "cuDNN" and not ON_GPU:
            with pytest.raises(Exception):  # cuDNN needs a GPU; the benchmark says n/a
                run_step(impl, args)
            continue
        try:
            loss, results[impl.label] = run_step(impl, args)
        except Exception:
            if impl.label == "cuDNN":  # e.g. a GPU without cuDNN's fused attention
                continue
            raise
        # loss = sum(out * cotangent): off by at most the output's tolerance times sum|cotangent|
        bound = tolerance * np.max(np.abs(reference[0])) * np.sum(np.abs(np.asarray(args[-1], np.float64)))
        assert abs(float(loss) - float(reference_loss)) <= bound, impl.label
        for got, want in zip(results[impl.label], reference):
            np.testing.assert_allclose(got, want, rtol=0,
                                       atol=tolerance * np.max(np.abs(want)), err_msg=impl.label)
    ours = results.pop(case.oxijax.label)
    assert results, "no baseline ran"
    for label, theirs in results.items():
        assert benchmark.relative_difference(theirs, ours) <= tolerance, label


@functools.cache
def measured(op, dtype):
    """The benchmark's row for the small case ``op`` (measured once per test session)."""
    case = next(c for c in SMALL if c.op == op)
    return benchmark._measure_training(case, dtype, repeats=1, copy=1.0)


@pytest.mark.parametrize("case, dtype", PAIRS, ids=IDS)
def test_measured_row(case, dtype):
    row = measured(case.op, dtype)
    assert row["agree"] and row["max_diff"] <= row["tolerance"]
    assert row["oxijax_ms"] > 0 and row["group"] == case.group
    first = case.baselines[0].label
    assert row["xla_ms"] == row["baselines"][first]["ms"] > 0
    assert row["ratio"] == pytest.approx(row["xla_ms"] / row["oxijax_ms"])
    if "cuDNN" in row["baselines"] and not ON_GPU:
        cudnn = row["baselines"]["cuDNN"]
        assert math.isnan(cudnn["ms"]) and math.isnan(cudnn["ratio"]) and cudnn["error"]
    json.dumps(row)  # the --json file holds it


def report_of(rows, notes=()):
    return benchmark.Report("cpu", "cpu", "cpu", "small", 1, rows, {"float32": 1.0}, list(notes))


def test_cudnn_column_says_why_on_a_cpu(capsys):
    if ON_GPU:
        pytest.skip("cuDNN may run here")
    case = next(c for c in SMALL if c.op == "attention causal train step")
    row = measured(case.op, "bfloat16")
    benchmark.print_table(report_of([row]))
    out = capsys.readouterr().out
    assert f"attention train step: {benchmark._GROUP_TITLES['attention train step']}" in out
    line = next(line for line in out.splitlines() if line.startswith(case.op))
    assert f"n/a: {row['baselines']['cuDNN']['error']}"[:40] in line and line.endswith("agree")


def _broken_case(forward):
    """The small conv2d row with one more baseline, computed by ``forward``."""
    case = next(c for c in SMALL if c.op == "conv2d 3x3 train step")
    return _cases.TrainingCase(case.op, case.shape, case.group, case.dtypes, case.make_args,
                               case.oxijax, (*case.baselines, _cases.Implementation("broken", forward)),
                               case.flops, case.bytes_moved)


def test_a_disagreeing_implementation_is_flagged(capsys):
    wrong = _broken_case(lambda x, w: 1.5 * jax.lax.conv_general_dilated(x, w, (1, 1), [(1, 1)] * 2))
    row = benchmark._measure_training(wrong, "float32", repeats=1, copy=1.0)
    assert not row["agree"] and row["baselines"]["broken"]["max_diff"] > 0.1
    assert row["baselines"][wrong.baselines[0].label]["max_diff"] <= row["tolerance"]
    benchmark.print_table(report_of([row]))
    out = capsys.readouterr().out
    assert "MISMATCH" in out


def test_a_failing_implementation_is_na_with_its_reason(capsys):
    def fails(x, w):
        raise ValueError("not on this device\nsecond line")

    row = benchmark._measure_training(_broken_case(fails), "float32", repeats=1, copy=1.0)
    assert row["baselines"]["broken"]["error"] == "ValueError: not on this device"
    assert row["agree"]  # the implementations that ran agree
    benchmark.print_table(report_of([row]))
    assert "n/a: ValueError: not on this device" in capsys.readouterr().out


def test_plan_skips_the_gpu_size_on_a_cpu_and_filters_dtypes():
    plan, notes = benchmark.training_plan("gpu", ["bfloat16", "float32"], "cpu")
    assert plan == [] and len(notes) == 1 and "need a GPU" in notes[0]
    plan, notes = benchmark.training_plan("gpu", ["bfloat16", "float32"], "gpu")
    assert len(plan) == 2 + 2 * 2 and notes == []
    plan, notes = benchmark.training_plan("gpu", ["float32"], "gpu")
    assert {c.op for c, _ in plan} == {"conv2d 3x3 train step", "conv2d 3x3 stride 2 train step"}
    assert len(notes) == 2 and all("--dtype bfloat16" in n for n in notes)
    assert benchmark.training_plan("gpu", ["float32"], "gpu", ["gemm"]) == ([], [])
    plan, notes = benchmark.training_plan("small", ["bfloat16"], "cpu", ["attention causal train"])
    assert [(c.op, d) for c, d in plan] == [("attention causal train step", "bfloat16")]


def test_cli_runs_the_rows_and_skips_the_gpu_size_on_a_cpu(tmp_path, capsys):
    from oxijax import __main__ as cli

    path = tmp_path / "bench.json"
    assert cli.main(["bench", "--size", "small", "--dtype", "bfloat16", "--op", "train step",
                     "--repeats", "1", "--json", str(path)]) == 0
    out = capsys.readouterr().out
    for group in ("attention train step", "conv2d train step"):
        assert f"\n{group}: " in out
    report = json.loads(path.read_text())
    assert {r["op"] for r in report["results"]} == {c.op for c in SMALL}
    assert all(r["agree"] for r in report["results"])
    if not ON_GPU:
        assert cli.main(["bench", "--size", "gpu", "--op", "train step", "--repeats", "1"]) == 0
        captured = capsys.readouterr()
        assert "need a GPU" in captured.out and "need a GPU" in captured.err
