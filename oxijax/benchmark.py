"""oxijax against XLA's own ops, timed in the same process.

``run()`` measures every case of ``oxijax._cases`` (jitted, warmed up, median of several
pipelined runs, ``block_until_ready``; the "eager" rows call tiny ops without jit, so
they time the dispatch of an eager call) and returns a :class:`Report`; ``print_table`` and
``plot`` present it. ``python -m oxijax bench`` is the command-line front end.
"""

from __future__ import annotations

import dataclasses
import json
import math
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp

from oxijax import _cases

DTYPES = {"float16": jnp.float16, "bfloat16": jnp.bfloat16, "float32": jnp.float32,
          "float64": jnp.float64}

# Dense peak rates (FLOP/s by dtype, with "tf32" for TF32 tensor cores) and memory
# bandwidth (bytes/s) of GPUs the roofline knows, matched against device_kind. Others get
# a roofline from the measured copy bandwidth alone.
PEAKS: dict[str, dict[str, float]] = {
    "H200": {"bfloat16": 989e12, "float16": 989e12, "tf32": 494e12, "float32": 67e12,
             "float64": 67e12, "bandwidth": 4.8e12},
    "H100": {"bfloat16": 989e12, "float16": 989e12, "tf32": 494e12, "float32": 67e12,
             "float64": 67e12, "bandwidth": 3.35e12},
    "A100": {"bfloat16": 312e12, "float16": 312e12, "tf32": 156e12, "float32": 19.5e12,
             "float64": 19.5e12, "bandwidth": 2.0e12},
}


def median_seconds(fn: Callable, args: Sequence[Any], repeats: int) -> float:
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


def copy_gbps(elements: int, dtype: Any, repeats: int) -> float:
    """Device-to-device copy bandwidth (read + write) at this size: the yardstick of the
    memory-bound ops."""
    x = _cases._normal((elements,), dtype, 0)
    seconds = median_seconds(jax.jit(jnp.copy), (x,), repeats)
    return 2 * elements * jnp.dtype(dtype).itemsize / seconds / 1e9


@dataclasses.dataclass
class Report:
    device: str
    device_kind: str
    platform: str
    sizes: str
    repeats: int
    rows: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    copy_gbps: dict[str, float] = dataclasses.field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {"device": self.device, "device_kind": self.device_kind,
                "platform": self.platform, "jax": jax.__version__,
                "date": time.strftime("%Y-%m-%d"), "sizes": self.sizes,
                "repeats": self.repeats, "copy_gbps": self.copy_gbps, "results": self.rows}


def _progress(total: int, enabled: bool):
    """A tqdm bar on stderr when tqdm is installed, else one line per step."""
    if not enabled:
        return None
    try:
        from tqdm.auto import tqdm
    except ImportError:
        return None
    return tqdm(total=total, unit="case", file=sys.stderr, leave=False)


def run(dtypes: Sequence[str] = ("float32",), repeats: int = 10, size: str | None = None,
        json_path: str | None = None, progress: bool = True) -> Report:
    """Times every case of ``size`` ('small', 'quick', 'large', 'gpu'; default 'gpu' on
    a GPU, else 'large') for each dtype against XLA and the case's other baselines.

    With ``json_path`` the report is rewritten after every row, so that an interrupted
    run keeps what it measured.
    """
    size = size or ("gpu" if jax.default_backend() == "gpu" else "large")
    device = jax.devices()[0]
    report = Report(str(device), device.device_kind, device.platform, size, repeats)
    cases = _cases.cases(size) + _cases.eager_cases()
    bar = _progress(len(cases) * len(dtypes), progress)
    step = 0
    for name in dtypes:
        dtype = DTYPES[name]
        report.copy_gbps[name] = copy_gbps(_cases.SIZES[size].elements, dtype, repeats)
        for case in cases:
            step += 1
            if bar is not None:
                bar.set_description(f"{case.op} {name}")
            elif progress:
                print(f"[{step}/{len(cases) * len(dtypes)}] {case.op} {name}", file=sys.stderr,
                      flush=True)
            report.rows.append(_measure(case, name, repeats, report.copy_gbps[name]))
            if bar is not None:
                bar.update()
            if json_path:
                with open(json_path, "w") as f:
                    json.dump(report.to_json(), f, indent=1)
    if bar is not None:
        bar.close()
    return report


def _measure(case: _cases.Case, dtype_name: str, repeats: int, copy: float) -> dict[str, Any]:
    dtype = DTYPES[dtype_name]
    args = case.make_args(dtype)
    wrap = (lambda fn: fn) if case.eager else jax.jit
    ours = median_seconds(wrap(case.oxijax_fn), args, repeats)
    baselines = {"XLA": case.xla_fn, **dict(case.baselines)}
    times = {label: median_seconds(wrap(fn), args, repeats) for label, fn in baselines.items()}
    itemsize = jnp.dtype(dtype).itemsize
    row: dict[str, Any] = {
        "op": case.op, "dtype": dtype_name, "shape": case.shape, "oxijax_ms": ours * 1e3,
        "xla_ms": times["XLA"] * 1e3, "ratio": times["XLA"] / ours,
        "flops": case.flops, "bytes": case.bytes_moved * itemsize, "copy_gbps": copy,
        "baselines": {k: {"ms": t * 1e3, "ratio": t / ours} for k, t in times.items()},
    }
    if case.flops:
        row["tflops"] = case.flops / ours / 1e12
    if case.bytes_moved:
        row["gbps"] = case.bytes_moved * itemsize / ours / 1e9
    return row


def _rate(row: dict[str, Any], versus_copy: bool) -> str:
    """TFLOP/s, or GB/s with (on a GPU) the share of the measured copy bandwidth. A CPU
    copy of a fresh buffer is dominated by page faults, so the share would mislead there."""
    if "tflops" in row:
        return f"{row['tflops']:.2f} TFLOP/s"
    if "gbps" in row:
        share = f" ({100 * row['gbps'] / row['copy_gbps']:.0f}% copy)" if versus_copy else ""
        return f"{row['gbps']:.1f} GB/s{share}"
    return ""


def _fmt(value: float, spec: str) -> str:
    return "n/a" if math.isnan(value) else format(value, spec)


def print_table(report: Report, file=None) -> None:
    """The report as an aligned table: one row per (op, dtype), one ratio per baseline."""
    file = file or sys.stdout
    labels = [k for k in report.rows[0]["baselines"]] if report.rows else []
    for row in report.rows:
        labels += [k for k in row["baselines"] if k not in labels]
    header = ["op", "dtype", "shape", "oxijax ms", "rate"]
    header += [f"{k} ms" for k in labels] + [f"{k}/oxijax" for k in labels]
    table = [header]
    for row in report.rows:
        base = row["baselines"]
        nan = {"ms": math.nan, "ratio": math.nan}
        table.append([row["op"], row["dtype"], row["shape"], _fmt(row["oxijax_ms"], ".3f"),
                      _rate(row, report.platform == "gpu")]
                     + [_fmt(base.get(k, nan)["ms"], ".3f") for k in labels]
                     + [_fmt(base.get(k, nan)["ratio"], ".2f") for k in labels])
    print(f"{report.device_kind} ({report.platform}), sizes '{report.sizes}', median of "
          f"{report.repeats}; copy " + ", ".join(f"{k} {v:.1f} GB/s"
                                                  for k, v in report.copy_gbps.items()), file=file)
    print_aligned(table, file=file)


def print_aligned(table: list[list[str]], left: int = 3, file=None) -> None:
    """Rows of cells in aligned columns (the first `left` left-aligned, numbers right-
    aligned), with a rule under the header row."""
    widths = [max(len(r[i]) for r in table) for i in range(len(table[0]))]
    for i, r in enumerate(table):
        cells = [c.ljust(w) if j < left else c.rjust(w) for j, (c, w) in enumerate(zip(r, widths))]
        print("  ".join(cells).rstrip(), file=file or sys.stdout)
        if i == 0:
            print("  ".join("-" * w for w in widths), file=file or sys.stdout)


def _peaks(report: Report) -> dict[str, float] | None:
    return next((p for kind, p in PEAKS.items() if kind in report.device_kind), None)


def plot(report: Report, path: str | None = None):
    """Speed-up over XLA per op (log scale, 1 = parity); on a GPU also a roofline of the
    achieved rate against arithmetic intensity. Returns the matplotlib Figure."""
    import matplotlib

    if path:
        matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt

    roofline = report.platform == "gpu"
    fig, axes = plt.subplots(1, 2 if roofline else 1, figsize=(14 if roofline else 9, 5),
                             squeeze=False)
    _plot_ratios(axes[0][0], report)
    if roofline:
        _plot_roofline(axes[0][1], report)
    fig.suptitle(f"oxijax vs XLA on {report.device_kind} ({time.strftime('%Y-%m-%d')})")
    fig.tight_layout()
    if path:
        fig.savefig(path, dpi=120)
    return fig


def _plot_ratios(ax, report: Report) -> None:
    import matplotlib.ticker
    ops = list(dict.fromkeys(r["op"] for r in report.rows))
    dtypes = list(dict.fromkeys(r["dtype"] for r in report.rows))
    width = 0.8 / max(len(dtypes), 1)
    for i, name in enumerate(dtypes):
        ratios = {r["op"]: r["ratio"] for r in report.rows if r["dtype"] == name}
        xs = [j + i * width for j, op in enumerate(ops) if not math.isnan(ratios.get(op, math.nan))]
        ys = [ratios[op] for op in ops if not math.isnan(ratios.get(op, math.nan))]
        ax.bar(xs, ys, width, label=name)
    ax.axhline(1.0, color="black", linewidth=0.8)
    ax.set_yscale("log")
    ax.yaxis.set_major_formatter(matplotlib.ticker.FormatStrFormatter("%g"))
    ax.yaxis.set_minor_formatter(matplotlib.ticker.FormatStrFormatter("%g"))
    ax.set_xticks([j + 0.4 - width / 2 for j in range(len(ops))], ops, rotation=60, ha="right",
                  fontsize=8)
    ax.set_ylabel("XLA time / oxijax time (> 1: oxijax faster)")
    ax.legend()


def _plot_roofline(ax, report: Report) -> None:
    peaks = _peaks(report) or {}
    bandwidth = peaks.get("bandwidth") or 1e9 * max(report.copy_gbps.values(), default=1.0)
    rows = [r for r in report.rows if r["flops"] and r["bytes"] and not math.isnan(r["oxijax_ms"])]
    intensities = [r["flops"] / r["bytes"] for r in rows] or [1.0]
    for name in dict.fromkeys(r["dtype"] for r in rows):
        peak = peaks.get(name)
        knee = [peak / bandwidth] if peak else []  # where the memory roof meets the compute roof
        xs = sorted([min(intensities) / 4, max(intensities) * 4, *knee])
        if knee and knee[0] == xs[-1]:  # show the flat compute roof past the knee too
            xs.append(knee[0] * 4)
        roof = [min(bandwidth * x, peak) if peak else bandwidth * x for x in xs]
        ax.plot(xs, [y / 1e12 for y in roof], linestyle="--", linewidth=0.8,
                label=f"roof {name}")
        pts = [r for r in rows if r["dtype"] == name]
        ax.scatter([r["flops"] / r["bytes"] for r in pts],
                   [r["flops"] / (r["oxijax_ms"] / 1e3) / 1e12 for r in pts], label=name)
        for r in pts:
            ax.annotate(r["op"], (r["flops"] / r["bytes"], r["flops"] / r["oxijax_ms"] / 1e9),
                        fontsize=6)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("arithmetic intensity (FLOP/byte)")
    ax.set_ylabel("achieved TFLOP/s")
    ax.legend(fontsize=7)
