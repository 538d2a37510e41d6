"""`python -m oxijax` (or `oxijax`): info, a correctness check and the benchmark.

With no subcommand it prints `info` and runs `check`.
"""

from __future__ import annotations

import argparse
import math
import os
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
    forced = " (forced by OXIJAX_CPU_ISA)" if os.environ.get("OXIJAX_CPU_ISA") else ""
    print(f"  CPU kernels: {build['cpu_isa']}{forced}, compiled with {build['cpu_flags']}")
    print(f"  CPU kernel levels: built {', '.join(build['cpu_isa_built'])}; "
          f"this CPU runs {', '.join(build['cpu_isa_levels'])}")
    cuda = build["cuda_architectures"] if build["cuda"] else "not built"
    print(f"  CUDA kernels: {cuda}")
    from oxijax import _interpret

    print(f"  CUDA interpreter: {'built' if _interpret.available() else 'not built'}")
    print(f"  devices: {', '.join(str(d) for d in jax.devices())}")
    for platform, targets in oxijax.REGISTERED_TARGETS.items():
        print(f"  FFI targets on {platform}: {', '.join(sorted(targets))}")


def _error(fn, reference, args) -> float:
    expected = jax.jit(reference)(*(a.astype(jnp.float64) for a in args))
    return _cases.max_error(jax.jit(fn)(*args), expected)


def check(dtypes: list[str]) -> int:
    """Every op and its gradient, jitted on the default device, against the jnp reference
    in float64; the times compare the forward op with XLA's."""
    table = [["op", "dtype", "shape", "max rel err", "grad rel err", "oxijax ms", "XLA ms",
              "XLA/oxijax", ""]]
    failures = 0
    for case in _cases.cases("small"):
        for name in dtypes:
            args = case.make_args(DTYPES[name])
            bound = CHECK_TOLERANCE[name] * case.tolerance_factor
            error = _error(case.oxijax_fn, case.reference, args)
            # fwd+bwd cases already compare gradients; the others get |y|^2/2's gradients.
            grad_error = (math.nan if case.is_gradient else
                          _error(_cases.fwd_bwd(case.oxijax_fn), _cases.fwd_bwd(case.reference), args))
            ok = error <= bound and (math.isnan(grad_error) or grad_error <= bound)
            failures += not ok
            ours = median_seconds(jax.jit(case.oxijax_fn), args, 5)
            xla = median_seconds(jax.jit(case.xla_fn), args, 5)
            table.append([case.op, name, case.shape, f"{error:.2e}",
                          "-" if math.isnan(grad_error) else f"{grad_error:.2e}",
                          f"{ours * 1e3:.3f}", "n/a" if math.isnan(xla) else f"{xla * 1e3:.3f}",
                          "n/a" if math.isnan(xla) else f"{xla / ours:.2f}",
                          "ok" if ok else "FAIL"])
    benchmark.print_aligned(table)
    print(f"\n{len(table) - 1 - failures} passed, {failures} failed")
    return 1 if failures else 0


def bench(dtypes: list[str], repeats: int, size: str | None, json_path: str | None,
          plot_path: str | None, ops: list[str] | None = None) -> int:
    """oxijax vs XLA's own op (and other baselines) in the same run; ratio > 1: oxijax faster."""
    report = benchmark.run(dtypes, repeats, size, json_path, ops=ops)
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
    bench_p.add_argument("--op", action="append", metavar="TEXT",
                         help="only the rows whose op contains TEXT (e.g. 'train step')")
    args = parser.parse_args(argv)
    if args.command == "info":
        info()
        return 0
    if args.command == "bench":
        size, repeats = ("quick", 3) if args.quick else (args.size, args.repeats)
        return bench(args.dtype or ["float32"], repeats, size, args.json, args.plot, args.op)
    if args.command is None:
        info()
        print()
    return check(getattr(args, "dtype", None) or list(DTYPES))


if __name__ == "__main__":
    sys.exit(main())
