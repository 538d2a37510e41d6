"""`python -m oxijax` (or `oxijax`): info, a correctness check and the benchmark.

With no subcommand it prints `info` and runs `check`.
"""

from __future__ import annotations

import argparse
import sys

import jax

jax.config.update("jax_enable_x64", True)  # float64 inputs and references

import jax.numpy as jnp  # noqa: E402

import oxijax  # noqa: E402
from oxijax import _cases, benchmark  # noqa: E402
from oxijax.benchmark import DTYPES, median_seconds  # noqa: E402

# Largest relative error `check` accepts: a few roundings of the dtype.
CHECK_TOLERANCE = {"float16": 1e-2, "bfloat16": 5e-2, "float32": 1e-4, "float64": 1e-10}


def info() -> None:
    build = oxijax.BUILD_INFO
    print(f"oxijax {oxijax.__version__}  jax {jax.__version__}  FFI API {build['ffi_api_version']}")
    print(f"  CPU kernels: {build['cpu_flags']}")
    cuda = build["cuda_architectures"] if build["cuda"] else "not built"
    print(f"  CUDA kernels: {cuda}")
    print(f"  devices: {', '.join(str(d) for d in jax.devices())}")
    for platform, targets in oxijax.REGISTERED_TARGETS.items():
        print(f"  FFI targets on {platform}: {', '.join(sorted(targets))}")


def _table(rows: list[dict], columns: list[tuple[str, str, str]]) -> None:
    print("  ".join(f"{title:>{width}}" for _, title, width in columns))
    for row in rows:
        print("  ".join(f"{row[key]:>{width}}" for key, _, width in columns))


def check(dtypes: list[str]) -> int:
    """Every op, jitted on the default device, against its jnp reference in float64."""
    rows, failures = [], 0
    for case in _cases.cases("small"):
        for name in dtypes:
            args = case.make_args(DTYPES[name])
            ours = jax.jit(case.oxijax_fn)
            xla = jax.jit(case.xla_fn)
            expected = jax.jit(case.reference)(*(a.astype(jnp.float64) for a in args))
            error = _cases.max_error(ours(*args), expected)
            ok = error <= CHECK_TOLERANCE[name] * case.tolerance_factor
            failures += not ok
            rows.append({
                "op": case.op, "dtype": name, "shape": case.shape, "error": f"{error:.2e}",
                "ours": f"{median_seconds(ours, args, 5) * 1e3:.3f}",
                "xla": f"{median_seconds(xla, args, 5) * 1e3:.3f}",
                "status": "ok" if ok else "FAIL",
            })
    rows = [dict(r, ratio=f"{float(r['xla']) / max(float(r['ours']), 1e-9):.2f}") for r in rows]
    rows = [dict(r, xla="n/a", ratio="n/a") if r["xla"] == "nan" else r for r in rows]
    _table(rows, [("op", "op", "20"), ("dtype", "dtype", "8"), ("shape", "shape", "22"),
                  ("error", "max rel err", "11"), ("ours", "oxijax ms", "9"), ("xla", "XLA ms", "9"),
                  ("ratio", "XLA/oxijax", "10"), ("status", "", "4")])
    print(f"\n{len(rows) - failures} passed, {failures} failed")
    return 1 if failures else 0


def bench(dtypes: list[str], repeats: int, size: str | None, json_path: str | None,
          plot_path: str | None) -> int:
    """oxijax vs XLA's own op (and other baselines) in the same run; ratio > 1: oxijax faster."""
    report = benchmark.run(dtypes, repeats, size, json_path)
    benchmark.print_table(report)
    if plot_path:
        benchmark.plot(report, plot_path)
        print(f"plot written to {plot_path}")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="oxijax", description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="command")
    sub.add_parser("info", help="versions, build, devices and registered FFI targets")
    check_p = sub.add_parser("check", help="every op against its jnp reference")
    check_p.add_argument("--dtype", action="append", choices=list(DTYPES))
    bench_p = sub.add_parser("bench", help="oxijax vs XLA timings")
    bench_p.add_argument("--dtype", action="append", choices=list(DTYPES))
    bench_p.add_argument("--repeats", type=int, default=10, help="timed runs per measurement")
    bench_p.add_argument("--json", metavar="FILE", help="also write the results to this file")
    bench_p.add_argument("--plot", metavar="FILE.png",
                         help="plot the speed-ups (and a roofline on a GPU) with matplotlib")
    bench_p.add_argument("--size", choices=list(_cases.SIZES),
                         help="problem sizes (default: 'gpu' on a GPU, else 'large')")
    bench_p.add_argument("--quick", action="store_true",
                         help="small sizes and 3 repeats: a run of well under a minute")
    args = parser.parse_args(argv)
    if args.command == "info":
        info()
        return 0
    if args.command == "bench":
        size, repeats = ("quick", 3) if args.quick else (args.size, args.repeats)
        return bench(args.dtype or ["float32"], repeats, size, args.json, args.plot)
    if args.command is None:
        info()
        print()
    return check(getattr(args, "dtype", None) or list(DTYPES))


if __name__ == "__main__":
    sys.exit(main())
