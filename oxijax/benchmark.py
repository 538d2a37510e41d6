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
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp

from oxijax import _cases
from oxijax._ffi import BUILD_INFO

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
        return _median_seconds(fn, args, repeats)
    except Exception:  # e.g. XLA:CPU has no float16 dot_general; cuDNN needs a GPU
        return float("nan")


def _median_seconds(fn: Callable, args: Sequence[Any], repeats: int) -> float:
    """median_seconds, raising what fn raises."""
    calls = _calls_per_sample(fn, args)
    return statistics.median(_sample(fn, args, calls) for _ in range(repeats))


def _calls_per_sample(fn: Callable, args: Sequence[Any]) -> int:
    """Compiles and warms up fn; how many back-to-back calls last ~20 ms."""
    jax.block_until_ready(fn(*args))
    start = time.perf_counter()
    jax.block_until_ready(fn(*args))
    single = time.perf_counter() - start
    return max(1, min(1000, int(0.02 / max(single, 1e-9))))


def _sample(fn: Callable, args: Sequence[Any], calls: int, warm: bool = False) -> float:
    """Seconds per call over `calls` back-to-back calls, synchronised once; with `warm`,
    after an untimed call (caches and threads as fn leaves them, not as another fn did)."""
    if warm:
        jax.block_until_ready(fn(*args))
    start = time.perf_counter()
    for _ in range(calls):
        out = fn(*args)
    jax.block_until_ready(out)
    return (time.perf_counter() - start) / calls


def interleaved_median_seconds(fns: dict[str, Callable], args: Sequence[Any],
                               repeats: int) -> dict[str, float]:
    """median_seconds of each fn, their samples taken in turn (a, b, a, b, ...): a slow
    spell of a shared machine then hits every fn alike instead of one, which matters
    most for the ratio of calls of a few microseconds (the eager rows). Each sample
    follows an untimed call of its fn: timed right after another fn, a large op ran up
    to 2x slower (attention after XLA's, measured on a 2-core VM)."""
    times, _ = _interleaved({label: (fn, args) for label, fn in fns.items()}, repeats)
    return {label: times.get(label, float("nan")) for label in fns}


def _interleaved(calls: dict[str, tuple[Callable, Sequence[Any]]],
                 repeats: int) -> tuple[dict[str, float], dict[str, BaseException]]:
    """interleaved_median_seconds of fn(*args) for each label's (fn, args): the median
    times of those that ran, and what each of the others raised (NaN and its reason)."""
    per_sample: dict[str, int] = {}
    errors: dict[str, BaseException] = {}
    for label, (fn, args) in calls.items():
        try:
            per_sample[label] = _calls_per_sample(fn, args)
        except Exception as error:  # cannot run here
            errors[label] = error
    samples: dict[str, list[float]] = {label: [] for label in per_sample}
    for _ in range(repeats):
        for label in list(samples):
            fn, args = calls[label]
            try:
                samples[label].append(_sample(fn, args, per_sample[label], warm=True))
            except Exception as error:  # e.g. out of memory on a later call
                errors[label] = error
                del samples[label]
    return {label: statistics.median(times) for label, times in samples.items()}, errors


def copy_gbps(elements: int, dtype: Any, repeats: int) -> float:
    """Device-to-device copy bandwidth (read + write) at this size: the yardstick of the
    memory-bound ops."""
    x = _cases._normal((elements,), dtype, 0)
    seconds = median_seconds(jax.jit(jnp.copy), (x,), repeats)
    return 2 * elements * jnp.dtype(dtype).itemsize / seconds / 1e9


def host_cpu() -> dict[str, Any]:
    """The CPU the CPU rows ran on: its model, the oxijax kernel level in use (the ISA,
    which decides the figures), every level this CPU runs (what its ISA offers) and the
    threads the process may run on (the size of XLA's intra-op pool, on which oxijax's
    CPU kernels run too)."""
    model = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            model = next((line.split(":", 1)[1].strip() for line in f
                          if line.startswith(("model name", "Model"))), model)
    except OSError:
        pass
    threads = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return {"model": model, "kernels": BUILD_INFO["cpu_isa"], "threads": threads,
            "levels": list(BUILD_INFO["cpu_isa_levels"])}


def _utc_now() -> str:
    return time.strftime("%Y-%m-%d %H:%M", time.gmtime())


@dataclasses.dataclass
class Report:
    device: str
    device_kind: str
    platform: str
    sizes: str
    repeats: int
    rows: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    copy_gbps: dict[str, float] = dataclasses.field(default_factory=dict)
    notes: list[str] = dataclasses.field(default_factory=list)  # e.g. rows skipped, and why
    cpu: dict[str, Any] = dataclasses.field(default_factory=host_cpu)
    started: str = dataclasses.field(default_factory=_utc_now)  # UTC

    def to_json(self) -> dict[str, Any]:
        return {"device": self.device, "device_kind": self.device_kind,
                "platform": self.platform, "cpu": self.cpu, "jax": jax.__version__,
                "date": time.strftime("%Y-%m-%d"), "started": self.started,
                "finished": _utc_now(), "sizes": self.sizes,
                "repeats": self.repeats, "copy_gbps": self.copy_gbps, "notes": self.notes,
                "results": self.rows}


def _progress(total: int, enabled: bool):
    """A tqdm bar on stderr when tqdm is installed, else one line per step."""
    if not enabled:
        return None
    try:
        from tqdm.auto import tqdm
    except ImportError:
        return None
    return tqdm(total=total, unit="case", file=sys.stderr, leave=False)


def _selected(op: str, ops: Sequence[str] | None) -> bool:
    return not ops or any(o in op for o in ops)


def training_plan(size: str, dtypes: Sequence[str], platform: str,
                  ops: Sequence[str] | None = None
                  ) -> tuple[list[tuple[_cases.TrainingCase, str]], list[str]]:
    """The (training case, dtype) pairs that ``run`` measures, and notes on those it
    leaves out: the 'gpu' size's need a GPU (XLA's attention alone would store
    gigabytes of scores and take minutes per step on a CPU), and each case runs only in
    its own dtypes."""
    others = ", ".join(name for name, sizes in _cases.SIZES.items() if name != "gpu"
                       and (sizes.train_attention or sizes.train_conv))
    everything = _cases.training_cases(size)
    if not everything and any(_selected(c.op, ops) for c in _cases.training_cases("gpu")):
        return [], [f"train step rows: none at --size {size} (they are in --size {others}, gpu)"]
    cases = [c for c in everything if _selected(c.op, ops)]
    if not cases:
        return [], []
    if size == "gpu" and platform != "gpu":
        return [], [f"train step rows: skipped, at --size gpu they need a GPU (this is a "
                    f"{platform}); scaled-down ones are in --size {others}"]
    plan, notes = [], []
    for case in cases:
        wanted = [d for d in dtypes if d in case.dtypes]
        if not wanted:
            notes.append(f"{case.op}: skipped, it runs in {' and '.join(case.dtypes)} only "
                         f"(add --dtype {case.dtypes[0]})")
        plan += [(case, d) for d in wanted]
    return plan, notes


def run(dtypes: Sequence[str] = ("float32",), repeats: int = 10, size: str | None = None,
        json_path: str | None = None, progress: bool = True,
        ops: Sequence[str] | None = None) -> Report:
    """Times every case of ``size`` ('small', 'quick', 'large', 'gpu'; default 'gpu' on
    a GPU, else 'large') for each dtype against XLA and the case's other baselines, then
    the training-step rows (``training_plan``). ``ops``: only the rows whose op contains
    one of these strings.

    With ``json_path`` the report is rewritten after every row, so that an interrupted
    run keeps what it measured.
    """
    size = size or ("gpu" if jax.default_backend() == "gpu" else "large")
    device = jax.devices()[0]
    report = Report(str(device), device.device_kind, device.platform, size, repeats)
    cases = [c for c in _cases.cases(size) + _cases.eager_cases() if _selected(c.op, ops)]
    training, report.notes = training_plan(size, dtypes, device.platform, ops)
    for note in report.notes:
        print(f"note: {note}", file=sys.stderr)
    total = len(cases) * len(dtypes) + len(training)
    bar = _progress(total, progress and total > 0)
    step = 0
    for name in dtypes:
        todo: list[tuple[Any, Callable[..., dict[str, Any]]]] = [(c, _measure) for c in cases]
        todo += [(c, _measure_training) for c, d in training if d == name]
        if not todo:
            continue
        report.copy_gbps[name] = copy_gbps(_cases.SIZES[size].elements, DTYPES[name], repeats)
        for case, measure in todo:
            step += 1
            if bar is not None:
                bar.set_description(f"{case.op} {name}")
            elif progress:
                print(f"[{step}/{total}] {case.op} {name}", file=sys.stderr, flush=True)
            report.rows.append(measure(case, name, repeats, report.copy_gbps[name]))
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
    baselines = {"XLA": case.xla_fn, **dict(case.baselines)}
    times = interleaved_median_seconds(
        {label: wrap(fn) for label, fn in {"oxijax": case.oxijax_fn, **baselines}.items()},
        args, repeats)
    ours = times.pop("oxijax")
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


# Largest difference (relative to the largest magnitude) between two implementations'
# outputs and gradients that a training-step row accepts: a few roundings of the dtype.
TRAINING_TOLERANCE = {"float16": 1e-2, "bfloat16": 5e-2, "float32": 1e-4, "float64": 1e-10}


def _reason(error: BaseException) -> str:
    """Why an implementation cannot run here, in one line (e.g. cuDNN on a CPU)."""
    lines = str(error).strip().splitlines()
    return f"{type(error).__name__}: {lines[0] if lines else ''}".rstrip(": ")


def relative_difference(actual: Sequence[Any], expected: Sequence[Any]) -> float:
    """Largest |actual - expected| over matching arrays, each relative to the expected
    array's largest magnitude; computed where the arrays live. NaN on a NaN, a shape
    mismatch or a non-finite value."""
    worst = 0.0
    for a, e in zip(actual, expected, strict=True):
        if a.shape != e.shape:
            return math.nan
        t = jnp.promote_types(e.dtype, jnp.float32)
        a, e = jnp.asarray(a, t), jnp.asarray(e, t)
        scale = jnp.maximum(jnp.max(jnp.abs(e), initial=0.0), jnp.finfo(t).tiny)
        difference = float(jnp.max(jnp.abs(a - e), initial=0.0) / scale)
        if not math.isfinite(difference):
            return math.nan
        worst = max(worst, difference)
    return worst


def _measure_training(case: _cases.TrainingCase, dtype_name: str, repeats: int,
                      copy: float) -> dict[str, Any]:
    """Runs every implementation's training step once, compares their outputs and
    gradients with oxijax's (in oxijax's layout), then times them in turn:
    jit(value_and_grad) on inputs already in each one's native layout. One that cannot
    run here (cuDNN on a CPU, in float32, or without cuDNN) is reported with the reason
    instead of a time."""
    dtype = DTYPES[dtype_name]
    args = case.make_args(dtype)
    implementations = (case.oxijax, *case.baselines)
    runnable, results, errors = {}, {}, {}
    for impl in implementations:
        native = tuple(impl.to_native(a) for a in args)
        step = jax.jit(_cases.training_step(impl.forward))
        try:
            (_, out), grads = jax.block_until_ready(step(*native))
        except Exception as error:
            errors[impl.label] = _reason(error)
            continue
        runnable[impl.label] = (step, native)
        results[impl.label] = [impl.from_native(x) for x in (out, *grads)]
    reference = results.pop(case.oxijax.label, None)
    differences = {label: relative_difference(r, reference) if reference is not None else math.nan
                   for label, r in results.items()}
    del results, reference  # free the outputs before timing
    tolerance = TRAINING_TOLERANCE[dtype_name]
    agree = bool(differences) and all(d <= tolerance for d in differences.values())
    # Timed in turn, as the op rows are (e.g. out of memory on a later call: n/a).
    times, failed = _interleaved(runnable, repeats)
    errors.update({label: _reason(error) for label, error in failed.items()})
    nan = math.nan
    ours = times.get(case.oxijax.label, nan)
    baselines: dict[str, dict[str, Any]] = {}
    for impl in case.baselines:
        t = times.get(impl.label, nan)
        entry: dict[str, Any] = {"ms": t * 1e3, "ratio": t / ours,
                                 "max_diff": differences.get(impl.label, nan)}
        if impl.label in errors:
            entry["error"] = errors[impl.label]
        baselines[impl.label] = entry
    first = baselines[case.baselines[0].label]
    itemsize = jnp.dtype(dtype).itemsize
    row: dict[str, Any] = {
        "op": case.op, "dtype": dtype_name, "shape": case.shape, "group": case.group,
        "oxijax_ms": ours * 1e3, "xla_ms": first["ms"], "ratio": first["ratio"],
        "flops": case.flops, "bytes": case.bytes_moved * itemsize, "copy_gbps": copy,
        "baselines": baselines, "tolerance": tolerance, "agree": agree,
        "max_diff": max(differences.values(), default=nan),
    }
    if case.oxijax.label in errors:
        row["oxijax_error"] = errors[case.oxijax.label]
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


def _short(text: str, width: int = 60) -> str:
    return text if len(text) <= width else text[:width - 3] + "..."


def _table(rows: list[dict[str, Any]], versus_copy: bool, training: bool) -> list[list[str]]:
    """One row per (op, dtype), one time and one ratio per baseline; a baseline that could
    not run says "n/a" (with the reason, where one was recorded). Training-step rows add
    the largest difference from oxijax's outputs and gradients, and whether that is
    within the dtype's tolerance."""
    labels: list[str] = []
    for row in rows:
        labels += [k for k in row["baselines"] if k not in labels]
    header = ["op", "dtype", "shape", "oxijax ms", "rate"]
    header += [f"{k} ms" for k in labels] + [f"{k}/oxijax" for k in labels]
    header += ["max diff", "outputs"] if training else []
    table = [header]
    nan = {"ms": math.nan, "ratio": math.nan}
    for row in rows:
        base = row["baselines"]

        def ms(entry: dict[str, Any]) -> str:
            if "error" in entry:
                return f"n/a: {_short(entry['error'])}"
            return _fmt(entry["ms"], ".3f")

        ours = (f"n/a: {_short(row['oxijax_error'])}" if "oxijax_error" in row
                else _fmt(row["oxijax_ms"], ".3f"))
        cells = [row["op"], row["dtype"], row["shape"], ours, _rate(row, versus_copy)]
        cells += [ms(base.get(k, nan)) for k in labels]
        cells += [_fmt(base.get(k, nan)["ratio"], ".2f") for k in labels]
        if training:
            cells += [_fmt(row["max_diff"], ".1e"), "agree" if row["agree"] else "MISMATCH"]
        table.append(cells)
    return table


# What the training-step tables time, by group.
_GROUP_TITLES = {
    "attention train step": "jit(value_and_grad) of sum(out * cotangent) w.r.t. q, k, v; "
                            "oxijax in [B, H, S, D], jax.nn.dot_product_attention "
                            "(implementation 'xla', 'cudnn') in [B, S, H, D]",
    "conv2d train step": "jit(value_and_grad) of sum(out * cotangent) w.r.t. x and w, "
                         "NCHW; vs lax.conv_general_dilated (cuDNN on a GPU; float32 at "
                         "precision HIGHEST)",
}


def print_table(report: Report, file=None) -> None:
    """The report as aligned tables: the op rows, then one table per group of training-
    step rows, then the notes (rows skipped, and why)."""
    file = file or sys.stdout
    versus_copy = report.platform == "gpu"
    copy = "; copy " + ", ".join(f"{k} {v:.1f} GB/s" for k, v in report.copy_gbps.items())
    print(f"{report.device_kind} ({report.platform}), sizes '{report.sizes}', median of "
          f"{report.repeats}{copy if report.copy_gbps else ''}", file=file)
    cpu = report.cpu
    print(f"CPU: {cpu['model']}, {cpu['threads']} threads, oxijax CPU kernels {cpu['kernels']}",
          file=file)
    plain = [r for r in report.rows if not r.get("group")]
    if plain:
        print_aligned(_table(plain, versus_copy, training=False), file=file)
    elif not report.rows:
        print("no rows measured", file=file)
    groups = dict.fromkeys([*_GROUP_TITLES, *(r["group"] for r in report.rows if r.get("group"))])
    for group in (g for g in groups if any(r.get("group") == g for r in report.rows)):
        rows = [r for r in report.rows if r.get("group") == group]
        title = _GROUP_TITLES.get(group)
        print(f"\n{group}" + (f": {title}" if title else ""), file=file)
        print_aligned(_table(rows, versus_copy, training=True), file=file)
        if not all(r["agree"] for r in rows):
            print("MISMATCH: an implementation's outputs or gradients differ from oxijax's "
                  "by more than the dtype's tolerance (or none could be compared)", file=file)
    for note in report.notes:
        print(f"note: {note}", file=file)


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
