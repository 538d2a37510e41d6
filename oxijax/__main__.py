"""`python -m oxijax` (or `oxijax`): info, a correctness check and the benchmark.

With no subcommand it prints `info` and runs `check`.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time

import jax

jax.config.update("jax_enable_x64", True)  # float64 inputs and references

import jax.numpy as jnp  # noqa: E402

import oxijax  # noqa: E402
from oxijax import _cases  # noqa: E402

DTYPES = {"float16": jnp.float16, "bfloat16": jnp.bfloat16, "float32": jnp.float32, "float64": jnp.float64}
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


def median_seconds(fn, args, repeats: int) -> float:
    """Median time per call of fn(*args) after a warm-up; NaN if it cannot run here.

    Each sample runs enough back-to-back calls (dispatched asynchronously, synchronised
    once) to last ~20 ms, so that dispatch latency does not hide short GPU kernels.
    """
    try:
        jax.block_until_ready(fn(*args))  # compile and warm up
        start = time.perf_counter()
        jax.block_until_ready(fn(*args))
        single = time.perf_counter() - start
    except Exception:  # e.g. XLA:CPU has no float16 dot_general; cuDNN needs a GPU
        return float("nan")
    calls = max(1, min(1000, int(0.02 / max(single, 1e-9))))
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(calls):
            out = fn(*args)
        jax.block_until_ready(out)
        times.append((time.perf_counter() - start) / calls)
    return statistics.median(times)


def copy_gbps(elements: int, dtype, repeats: int) -> float:
    """Device-to-device copy bandwidth (read + write) at this size: the yardstick of the
    memory-bound ops."""
    x = _cases._normal((elements,), dtype, 0)
    seconds = median_seconds(jax.jit(jnp.copy), (x,), repeats)
    return 2 * elements * jnp.dtype(dtype).itemsize / seconds / 1e9


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


def _rate(case, seconds: float, itemsize: int, copy: float) -> str:
    if case.flops:
        return f"{case.flops / seconds / 1e12:.2f} TFLOP/s"
    gbps = case.bytes_moved * itemsize / seconds / 1e9
    return f"{gbps:.1f} GB/s ({100 * gbps / copy:.0f}% copy)"


def bench(dtypes: list[str], repeats: int, json_path: str | None, size: str | None) -> int:
    """oxijax vs XLA's own op (and other baselines) in the same run; ratio > 1: oxijax faster."""
    size = size or ("gpu" if jax.default_backend() == "gpu" else "large")
    device = jax.devices()[0]
    print(f"benchmark on {device.device_kind} ({device.platform}), sizes '{size}', "
          f"median of {repeats}", flush=True)
    rows = []
    for name in dtypes:
        dtype = DTYPES[name]
        copy = copy_gbps(_cases.SIZES[size].elements, dtype, repeats)
        print(f"  copy yardstick {name}: {copy:.1f} GB/s", flush=True)
        for case in _cases.cases(size):
            args = case.make_args(dtype)
            ours = median_seconds(jax.jit(case.oxijax_fn), args, repeats)
            baselines = {"XLA": case.xla_fn, **dict(case.baselines)}
            times = {label: median_seconds(jax.jit(fn), args, repeats) for label, fn in baselines.items()}
            rate = _rate(case, ours, jnp.dtype(dtype).itemsize, copy)
            rows.append({"op": case.op, "dtype": name, "shape": case.shape, "oxijax_ms": ours * 1e3,
                         "xla_ms": times["XLA"] * 1e3, "ratio": times["XLA"] / ours, "rate": rate,
                         "copy_gbps": copy,
                         "baselines": {k: {"ms": t * 1e3, "ratio": t / ours} for k, t in times.items()}})
            versus = "  ".join(f"{k} n/a" if math.isnan(t) else f"{k} {t * 1e3:9.3f} ms ({k}/oxijax {t / ours:5.2f})"
                               for k, t in times.items())
            print(f"  {case.op:<20} {name:<8} {case.shape:<28} oxijax {ours * 1e3:9.3f} ms"
                  f"  {rate:>26}  {versus}", flush=True)
            if json_path:  # after every row, so that an interrupted run keeps its results
                with open(json_path, "w") as f:
                    json.dump({"device": str(device), "device_kind": device.device_kind,
                               "jax": jax.__version__, "date": time.strftime("%Y-%m-%d"),
                               "sizes": size, "results": rows}, f, indent=1)
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="oxijax", description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="command")
    sub.add_parser("info", help="versions, build, devices and registered FFI targets")
    check_p = sub.add_parser("check", help="every op against its jnp reference")
    check_p.add_argument("--dtype", action="append", choices=list(DTYPES))
    bench_p = sub.add_parser("bench", help="oxijax vs XLA timings")
    bench_p.add_argument("--dtype", action="append", choices=list(DTYPES))
    bench_p.add_argument("--repeats", type=int, default=10)
    bench_p.add_argument("--json", help="also write the results to this file")
    bench_p.add_argument("--size", choices=list(_cases.SIZES),
                         help="problem sizes (default: 'gpu' on a GPU, else 'large')")
    args = parser.parse_args(argv)
    if args.command == "info":
        info()
        return 0
    if args.command == "bench":
        return bench(args.dtype or ["float32"], args.repeats, args.json, args.size)
    if args.command is None:
        info()
        print()
    return check(getattr(args, "dtype", None) or list(DTYPES))


if __name__ == "__main__":
    sys.exit(main())
