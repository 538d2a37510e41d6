"""The README's CPU benchmark table for this machine: runs `python -m oxijax bench` several
times, each in a fresh process on the CPU, and prints one markdown table per kind of row
(ops, training steps) of the median times, the ratio of the medians and every run's
ratio, under a line naming the date and time, the CPU, the kernel levels it runs and
the one in use, and jax's version. A single run's ratio moves by 10-20 % on a shared VM;
the spread of the runs shows how far to trust a row.

    python scripts/cpu_table.py --runs 6 --json-dir runs/ > table.md
    python scripts/cpu_table.py --from runs/*.json        # the table of saved reports
    python scripts/cpu_table.py --xla-isa avx2            # XLA held to AVX2 (xla_isa.py)

Other arguments go to the bench (default: --dtype float32 --dtype bfloat16 --repeats 5).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from collections.abc import Sequence
from typing import Any

from cpu_scaling import bench_report  # scripts/, beside this file

DEFAULT_BENCH_ARGS = ["--dtype", "float32", "--dtype", "bfloat16", "--repeats", "5"]


def bench_reports(runs: int, bench_args: Sequence[str], json_dir: str | None,
                  xla_isa: str | None = None) -> list[dict]:
    """`runs` bench reports, each from its own process on every CPU this one may use
    (with xla_isa, XLA held to that level), saved in json_dir when given."""
    cpus = sorted(os.sched_getaffinity(0))
    reports = []
    for i in range(1, runs + 1):
        print(f"run {i} of {runs} ...", file=sys.stderr, flush=True)
        reports.append(bench_report(cpus, list(bench_args), xla_isa))
        if xla_isa:
            reports[-1]["xla_isa"] = xla_isa
        if json_dir:
            with open(os.path.join(json_dir, f"bench_{i}.json"), "w") as f:
                json.dump(reports[-1], f, indent=1)
    return reports


def _rate(row: dict[str, Any], ms: float) -> str:
    if row.get("flops"):
        return f"{row['flops'] / ms / 1e6:.1f} GFLOP/s"
    if row.get("bytes"):
        return f"{row['bytes'] / ms / 1e6:.1f} GB/s"
    return ""


def setup(report: dict[str, Any]) -> tuple:
    """What must be the same for runs to share a table."""
    cpu = report["cpu"]
    return (cpu["model"], cpu["kernels"], cpu["threads"], report["jax"], report["sizes"],
            report["repeats"], report.get("xla_isa", ""))


def header(reports: Sequence[dict[str, Any]]) -> str:
    """The line above the table: when, on which CPU, with which kernels and jax."""
    first, cpu = reports[0], reports[0]["cpu"]
    # Reports from before the start and end times were recorded give their date only.
    timed = all("started" in r for r in reports)
    start = min(r["started"] if timed else r["date"] for r in reports)
    end = max(r["finished"] if timed else r["date"] for r in reports)
    if start != end:  # "2026-12-05 16:52–16:56", or with the end's date where it differs
        start += "–" + (end[11:] if end[:10] == start[:10] else end)
    runs = len(reports)
    levels = ", ".join(cpu.get("levels", [])) or "not recorded"
    xla = (f"; XLA:CPU held to `{first['xla_isa']}` (scripts/xla_isa.py)"
           if first.get("xla_isa") else "")
    return (f"**{cpu['model']}, {cpu['threads']} threads** — taken {start} UTC; CPU kernel "
            f"levels this CPU runs: {levels}; level in use `{cpu['kernels']}`{xla}; jax "
            f"{first['jax']}, `--size {first['sizes']} --repeats {first['repeats']}`, oxijax's "
            f"and XLA's runs taken in turn, the median of {runs} run{'s' * (runs > 1)} (the "
            f"ratio is of the median times; the single runs' ratios are in the last column).")


def tables(reports: Sequence[dict[str, Any]]) -> str:
    """The markdown tables of the op rows and the training-step rows, rows in the order
    the bench ran them; a row missing from some runs is the median of the others."""
    rows: dict[tuple[str, str, str], list[dict[str, Any]]] = {}
    for report in reports:
        for row in report["results"]:
            if row.get("xla_ms") is not None:
                rows.setdefault((row["op"], row["dtype"], row["shape"]), []).append(row)
    ops, steps = [], []
    for (op, dtype, shape), runs in rows.items():
        mine = statistics.median(r["oxijax_ms"] for r in runs)
        xla = statistics.median(r["xla_ms"] for r in runs)
        singles = ", ".join(f"{r['xla_ms'] / r['oxijax_ms']:.2f}" for r in runs)
        cells = [op, shape, dtype, f"{mine:.3f}", f"{xla:.3f}"]
        if "group" in runs[0]:
            steps.append(cells + [f"{xla / mine:.2f}", singles])
        else:
            ops.append(cells + [_rate(runs[0], mine), f"{xla / mine:.2f}", singles])
    out = []
    for first, body, rate in (("op", ops, True), ("training step", steps, False)):
        if not body:
            continue
        names = [first, "shape", "dtype", "oxijax ms", "XLA ms"] + ["oxijax rate"] * rate
        names += ["XLA / oxijax", "single runs"]
        align = ["---"] * 3 + ["---:"] * (len(names) - 4) + ["---"]
        out += ["| " + " | ".join(line) + " |" for line in [names, align, *body]] + [""]
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=6, help="bench runs (default 6)")
    parser.add_argument("--json-dir", help="keep each run's report here")
    parser.add_argument("--from", dest="reports", nargs="+", metavar="JSON",
                        help="make the table of these saved bench reports instead")
    parser.add_argument("--xla-isa", choices=["avx2", "avx512"],
                        help="hold XLA:CPU to this instruction set (scripts/xla_isa.py); "
                        "set OXIJAX_CPU_ISA to the same level for a like-for-like table")
    args, bench_args = parser.parse_known_args(argv)
    if args.reports:
        reports = []
        for path in args.reports:
            with open(path) as f:
                reports.append(json.load(f))
    else:
        if args.runs < 1:
            parser.error("--runs must be at least 1")
        if args.json_dir:
            os.makedirs(args.json_dir, exist_ok=True)
        reports = bench_reports(args.runs, bench_args or DEFAULT_BENCH_ARGS, args.json_dir,
                                args.xla_isa)
    if not any(r["results"] for r in reports):
        raise SystemExit("no rows in these reports")
    setups = sorted({setup(r) for r in reports})
    if len(setups) > 1:
        raise SystemExit("these reports differ in CPU, kernel level, threads, jax, --size or "
                         "--repeats, so they make no one table: " + "; ".join(map(str, setups)))
    print(header(reports))
    print()
    print(tables(reports), end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())
