"""The CPU benchmark's rows at several thread counts, to tell where a gap to XLA comes
from: a row already behind at one thread is the kernel's; one that falls behind as
threads are added is scaling (memory bandwidth, how the work is cut, waking threads).

Each thread count runs `python -m oxijax bench` in its own process restricted to that
many CPUs: XLA's intra-op thread pool, on which oxijax's CPU kernels run as well, is as
large as the process's CPU affinity mask. Prints one table (per row and thread count:
oxijax ms, XLA ms, XLA / oxijax) and, with --json, writes the rows.

    python scripts/cpu_scaling.py --threads 1,4,16 --op gemm --op reduce --json out.json
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile


def thread_counts(available: int) -> list[int]:
    """1, 2, 4, ... below `available`, then `available`."""
    counts, t = [], 1
    while t < available:
        counts.append(t)
        t *= 2
    return counts + [available]


def bench_report(cpus: list[int], bench_args: list[str], xla_isa: str | None = None) -> dict:
    """The bench's JSON report, run on exactly these CPUs; with xla_isa, XLA:CPU held to
    that instruction set (xla_isa.py)."""
    launcher = [os.path.join(os.path.dirname(os.path.abspath(__file__)), "xla_isa.py"),
                xla_isa] if xla_isa else []
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "bench.json")
        env = dict(os.environ, JAX_PLATFORMS="cpu")
        result = subprocess.run(
            [sys.executable, *launcher, "-m", "oxijax", "bench", *bench_args, "--json", path],
            env=env, capture_output=True, text=True,
            preexec_fn=lambda: os.sched_setaffinity(0, cpus))
        if result.returncode != 0:
            raise SystemExit(f"bench on {len(cpus)} CPUs failed:\n{result.stdout}{result.stderr}")
        with open(path) as f:
            return json.load(f)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", help="comma-separated thread counts "
                        "(default 1, 2, 4, ... and every CPU this process may use)")
    parser.add_argument("--op", action="append", default=[], metavar="TEXT",
                        help="rows whose op contains TEXT (repeatable; default gemm, reduce)")
    parser.add_argument("--dtype", action="append", default=[],
                        help="as for bench (default float32 and bfloat16)")
    parser.add_argument("--size", action="append", default=[],
                        help="as for bench, repeatable (default large)")
    parser.add_argument("--repeats", type=int, default=5, help="as for bench")
    parser.add_argument("--json", metavar="FILE", help="also write the rows to this file")
    args = parser.parse_args(argv)

    available = sorted(os.sched_getaffinity(0))
    counts = ([int(t) for t in args.threads.split(",")] if args.threads
              else thread_counts(len(available)))
    if any(t < 1 for t in counts):
        parser.error("thread counts must be at least 1")
    if any(t > len(available) for t in counts):
        print(f"note: this process may use {len(available)} CPUs; larger thread counts "
              "are left out", file=sys.stderr)
    counts = sorted({t for t in counts if t <= len(available)})
    bench_args = ["--repeats", str(args.repeats)]
    for op in args.op or ["gemm", "reduce"]:
        bench_args += ["--op", op]
    for dtype in args.dtype or ["float32", "bfloat16"]:
        bench_args += ["--dtype", dtype]

    rows: dict[tuple[str, str, str], dict] = {}
    cpu = {}
    for size in args.size or ["large"]:
        for t in counts:
            print(f"size {size}, {t} thread(s) ...", file=sys.stderr, flush=True)
            report = bench_report(available[:t], ["--size", size, *bench_args])
            cpu = report["cpu"]
            for r in report["results"]:
                row = rows.setdefault((r["op"], r["shape"], r["dtype"]),
                                      {"op": r["op"], "shape": r["shape"], "dtype": r["dtype"],
                                       "threads": {}})
                row["threads"][t] = {"oxijax_ms": r["oxijax_ms"], "xla_ms": r.get("xla_ms"),
                                     "ratio": r.get("ratio")}
            if args.json:  # after every run, so that a run cut short keeps what it measured
                with open(args.json, "w") as f:
                    json.dump({"cpu": dict(cpu, threads=counts), "rows": list(rows.values())},
                              f, indent=1)

    from oxijax.benchmark import print_aligned

    print(f"CPU: {cpu['model']}, oxijax CPU kernels {cpu['kernels']}")
    print("each cell: oxijax ms / XLA ms = XLA / oxijax")
    table = [["op", "shape", "dtype"] + [f"{t} thread{'s' * (t > 1)}" for t in counts]]
    for row in rows.values():
        cells = []
        for t in counts:
            run = row["threads"].get(t)
            cells.append("-" if run is None or run["xla_ms"] is None else
                         f"{run['oxijax_ms']:.3f} / {run['xla_ms']:.3f} = {run['ratio']:.2f}")
        table.append([row["op"], row["shape"], row["dtype"]] + cells)
    print_aligned(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
