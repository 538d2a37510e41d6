"""Per-kernel resources, tensor-core instruction counts and H200 occupancy of the CUDA
kernels in oxijax's built extension (its sm_90 cubins; no GPU needed).

For every kernel: registers per thread, stack frame and local memory bytes per thread,
static shared memory (from ``cuobjdump -res-usage``), the launch bound
(``__launch_bounds__``: the cubin's EIATTR_REQNTID, else EIATTR_MAX_THREADS), counts of
SASS instructions from ``nvdisasm`` (HMMA and DMMA tensor-core instructions, LDSM =
ldmatrix, LDGSTS = cp.async, STL/LDL = local-memory stores/loads: register spills and
local arrays), and the theoretical occupancy on an H200.

ptxas's "spill stores/loads" byte counts are not kept in the cubin: the report gives what
the cubin does keep, the stack frame (where spills live), and the STL/LDL instructions.
The dynamic shared memory of a launch is not in the cubin either: DYNAMIC_SHARED below
lists what oxijax's launchers pass, by kernel name; for other kernels the occupancy
counts static shared memory only (exact for kernels launched without dynamic shared
memory, an upper bound otherwise), and the report says "static only".

Usage:
  python scripts/kernel_report.py [EXTENSION.so] [--kernel REGEX] [--json [PATH]]
                                  [--no-sass] [--arch sm_90] [--jobs N]
                                  [--dynamic-shared REGEX=BYTES] [--static-only]

EXTENSION defaults to $OXIJAX_EXTENSION, else the extension that `import oxijax` loads,
else the source tree's oxijax/_oxijax*.so. ``--json`` prints JSON instead of the table;
``--json PATH`` writes it to PATH and still prints the table. Disassembling all of
oxijax's ~1,600 kernels takes about 40 s of CPU time, spread over ``--jobs`` nvdisasm
processes (one per CPU by default); ``--kernel`` narrows it to the matching kernels and
``--no-sass`` skips it (about 1 s).

Needs ``cuobjdump`` and ``nvdisasm``: on the PATH, in $CUDA_HOME/bin or
/usr/local/cuda/bin, or from pip (``pip install nvidia-cuda-cuobjdump
nvidia-cuda-nvdisasm``; the test extra has them), and ``c++filt`` (binutils) for the
names (mangled names without it). Exit status 1, with one line on stderr, when the
extension has no cubin for the architecture or a tool is missing.
"""

from __future__ import annotations

import argparse
import collections
import concurrent.futures
import importlib.metadata
import importlib.util
import json
import math
import os
import re
import shutil
import struct
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

# ------------------------------------------------------------------ H200 (sm_90) limits
# As CUDA's occupancy calculator (cuda_occupancy.h) models compute capability 9.0.
REGS_PER_SM = 65536
REGS_PER_BLOCK = 65536
MAX_REGS_PER_THREAD = 255
REG_ALLOC_UNIT = 256  # registers, per warp
SUB_PARTITIONS = 4  # registers are allocated per sub-partition (16384 each)
MAX_THREADS_PER_SM = 2048
MAX_THREADS_PER_BLOCK = 1024
MAX_BLOCKS_PER_SM = 32
SMEM_PER_SM = 228 * 1024
SMEM_PER_BLOCK = 227 * 1024  # the opt-in maximum
SMEM_RESERVED_PER_BLOCK = 1024
SMEM_ALLOC_UNIT = 128
WARP = 32
DEVICE = ("H200 (sm_90): 65536 regs/SM (256 per warp granularity, max 255/thread), "
          "2048 threads/SM, 32 blocks/SM, 228 KiB shared/SM (227 KiB max per block, "
          "1 KiB reserved per block)")


def _attention_mma_smem(match: re.Match) -> int:
    """attention_kernels.cu, mma_smem_bytes<D>(): a [64][D] Q tile and 2 x 2 [keys][D]
    K/V tiles of 16-bit values; 64 keys per tile up to head dim 128, 32 above."""
    d = int(match.group(1))
    keys = 64 if d <= 128 else 32
    return (64 + 4 * keys) * d * 2


def _attention_backward_mma_smem(match: re.Match) -> int:
    """attention_backward_mma_kernels.cu, dkdv_smem_bytes<D>() / dq_smem_bytes<D>(): two
    [64][D] tiles kept and 2 x 2 [step][D] streamed tiles of 16-bit values (BwdConfig's
    step), plus lse and delta (2 x step floats each) for dkdv."""
    kernel, d = match.group(1), int(match.group(2))
    d_out = d if d <= 128 else d // 2
    step = 64 if d_out <= 64 else 32
    return 2 * (2 * 64 * d + 4 * step * d) + (16 * step if kernel == "dkdv" else 0)


# Dynamic shared memory bytes that oxijax's launchers pass, by regex on the short kernel
# name (the first match wins): an int, or a function of the match. Mirrors ffi/cuda/*.cu;
# it may be emptied (or ignored with --static-only): then every occupancy counts static
# shared memory only. Kernels whose launch computes it at run time (the SIMT attention
# backward kernels fit their tile to the head dimension) are left out.
DYNAMIC_SHARED: list[tuple[str, object]] = [
    (r"^attention_mma_kernel<[^,<>]+, (\d+)>$", _attention_mma_smem),
    (r"^(dkdv|dq)_mma_kernel<[^,<>]+, (\d+)>$", _attention_backward_mma_smem),
]

# SASS opcodes counted per kernel (the mnemonic before the first '.').
TENSOR_CORE = ("HMMA", "DMMA", "HGMMA", "IMMA")
COUNTED = TENSOR_CORE + ("LDSM", "LDGSTS", "STL", "LDL")
# Work (bytes of SASS) per nvdisasm call below which it is not worth another process.
CHUNK_BYTES = 1 << 20

STO_CUDA_ENTRY = 0x10  # st_other of a kernel's symbol
EIATTR_MAX_THREADS = 0x05
EIATTR_REQNTID = 0x10
EIFMT_SVAL = 0x04


class ReportError(Exception):
    """A failure the report explains in one message (exit status 1)."""


# ------------------------------------------------------------------------------ tools
PIP_PACKAGES = {"cuobjdump": "nvidia-cuda-cuobjdump", "nvdisasm": "nvidia-cuda-nvdisasm"}


def find_tool(name: str) -> str | None:
    """`name` on the PATH, in $CUDA_HOME/bin or /usr/local/cuda/bin, or in its pip
    package (nvidia-cuda-cuobjdump, nvidia-cuda-nvdisasm: nvidia/cu13/bin/...)."""
    found = shutil.which(name)
    if found:
        return found
    for home in (os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH"), "/usr/local/cuda"):
        if home and os.access(Path(home, "bin", name), os.X_OK):
            return str(Path(home, "bin", name))
    package = PIP_PACKAGES.get(name)
    if package:
        try:
            files = importlib.metadata.distribution(package).files or []
        except importlib.metadata.PackageNotFoundError:
            files = []
        for file in files:
            if file.name == name and file.parent.name == "bin":
                path = Path(str(file.locate()))
                if path.is_file():
                    if not os.access(path, os.X_OK):  # a wheel unpacked without modes
                        try:
                            path.chmod(path.stat().st_mode | 0o111)
                        except OSError:
                            continue
                    return str(path)
    return None


def require_tool(name: str, why: str = "") -> str:
    path = find_tool(name)
    if path is None:
        hint = f"pip install {PIP_PACKAGES[name]}" if name in PIP_PACKAGES else "install it"
        raise ReportError(
            f"{name} not found (looked on the PATH, in $CUDA_HOME/bin, /usr/local/cuda/bin "
            f"and the pip package {PIP_PACKAGES.get(name, name)}): {hint}{why}")
    return path


def tool_version(path: str) -> str:
    try:
        out = subprocess.run([path, "--version"], capture_output=True, text=True,
                             timeout=30).stdout
    except (OSError, subprocess.SubprocessError):
        return "?"
    match = re.search(r"release ([\d.]+), V([\d.]+)", out)
    return match.group(2) if match else "?"


def run(cmd: list[str], cwd: str | None = None) -> str:
    try:
        done = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True)
    except OSError as error:
        raise ReportError(f"cannot run {cmd[0]}: {error}") from error
    if done.returncode != 0:
        message = (done.stderr or done.stdout).strip().splitlines()
        raise ReportError(f"{Path(cmd[0]).name} failed ({done.returncode}): "
                          f"{message[-1] if message else 'no output'}")
    return done.stdout


# -------------------------------------------------------------------------- extension
def default_extension() -> Path:
    """$OXIJAX_EXTENSION; else the extension that `import oxijax` loads (importing it:
    editable installs keep the extension apart from the sources); else the source tree's
    oxijax/_oxijax*.so."""
    override = os.environ.get("OXIJAX_EXTENSION")
    if override:
        return Path(override)
    if importlib.util.find_spec("oxijax") is not None:
        try:
            from oxijax._extension import _oxijax  # noqa: PLC0415
            return Path(_oxijax.__file__)
        except Exception:  # noqa: BLE001 - fall back to the source tree
            pass
    found = sorted(p for p in (ROOT / "oxijax").glob("_oxijax.*")
                   if p.is_file() and p.suffix in (".so", ".pyd"))
    if found:
        return found[0]
    raise ReportError("no oxijax extension found: pass the path of a built _oxijax*.so "
                      "(e.g. build/<wheel tag>/_oxijax*.so)")


def extract_cubins(cuobjdump: str, extension: Path, arch: str, workdir: str) -> list[Path]:
    """The extension's cubins for `arch` (and its `a` variant, e.g. sm_90a), extracted
    into workdir."""
    if not extension.is_file():
        raise ReportError(f"{extension}: no such file")
    try:
        listing = run([cuobjdump, "-lelf", str(extension)])
    except ReportError as error:
        if "does not contain device code" in str(error):
            raise ReportError(f"{extension} has no CUDA code (a build without CUDA kernels; "
                              "oxijax.BUILD_INFO['cuda'] is False). A CUDA build's extension "
                              "is also left in build/<wheel tag>/") from error
        raise
    names = re.findall(r"ELF file\s+\d+:\s+(\S+\.cubin)", listing)
    wanted = [n for n in names if re.search(rf"\.{re.escape(arch)}a?\.cubin$", n)]
    if not wanted:
        archs = sorted({m.group(1) for n in names if (m := re.search(r"\.(sm_\w+)\.cubin$", n))})
        raise ReportError(f"{extension} has no {arch} cubin (it has: "
                          f"{', '.join(archs) or 'none'}); build with "
                          f"OXIJAX_CUDA_ARCHITECTURES including {arch[3:]}-real")
    run([cuobjdump, "-xelf", "all", str(extension.resolve())], cwd=workdir)
    paths = [Path(workdir, n) for n in wanted]
    missing = [p.name for p in paths if not p.is_file()]
    if missing:
        raise ReportError(f"cuobjdump -xelf did not extract {', '.join(missing)}")
    return paths


# -------------------------------------------------------------------------------- ELF
def parse_cubin(data: bytes) -> dict:
    """Kernels (entry symbols) of a cubin: symbol index, .text size and the launch-bound
    attributes of its .nv.info.<kernel> section."""
    if data[:4] != b"\x7fELF" or data[4] != 2 or data[5] != 1:
        raise ReportError("not a 64-bit little-endian ELF cubin")
    shoff, = struct.unpack_from("<Q", data, 0x28)
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", data, 0x3A)
    headers = [struct.unpack_from("<IIQQQQIIQQ", data, shoff + i * shentsize)
               for i in range(shnum)]

    def cstr(offset: int) -> str:
        return data[offset:data.index(b"\0", offset)].decode()

    names = [cstr(headers[shstrndx][4] + h[0]) for h in headers]
    by_name = dict(zip(names, headers))
    symtab = next(h for h in headers if h[1] == 2)  # SHT_SYMTAB
    strtab_offset = headers[symtab[6]][4]
    kernels = {}
    for index in range(symtab[5] // 24):
        name_off, info, other, shndx, _value, size = struct.unpack_from(
            "<IBBHQQ", data, symtab[4] + index * 24)
        if info & 0xF != 2 or not other & STO_CUDA_ENTRY:  # STT_FUNC, CUDA entry
            continue
        name = cstr(strtab_offset + name_off)
        text = by_name.get(f".text.{name}")
        kernels[name] = {"symbol": index, "text_bytes": text[5] if text else size,
                         "max_threads": None, "reqntid": None}
        info_section = by_name.get(f".nv.info.{name}")
        if info_section is None:
            continue
        body = data[info_section[4]:info_section[4] + info_section[5]]
        i = 0
        while i + 4 <= len(body):
            fmt, attr, value = struct.unpack_from("<BBH", body, i)
            if fmt != EIFMT_SVAL:
                i += 4
                continue
            payload = body[i + 4:i + 4 + value]
            i += 4 + value
            if attr in (EIATTR_MAX_THREADS, EIATTR_REQNTID) and len(payload) == 12:
                key = "max_threads" if attr == EIATTR_MAX_THREADS else "reqntid"
                kernels[name][key] = list(struct.unpack("<3I", payload))
    return kernels


def parse_res_usage(text: str) -> dict[str, dict[str, int]]:
    """cuobjdump -res-usage: {mangled name: {"REG": .., "STACK": .., "SHARED": .., ...}}."""
    usage: dict[str, dict[str, int]] = {}
    current = None
    for line in text.splitlines():
        match = re.match(r"\s*Function (\S+):\s*$", line)
        if match:
            current = usage.setdefault(match.group(1), {})
        elif current is not None and "REG:" in line:
            current.update({k: int(v) for k, v in re.findall(r"([A-Z]+(?:\[\d+\])?):(\d+)", line)})
    return usage


# ------------------------------------------------------------------------------- SASS
_SECTION = re.compile(r"^\s*\.section\s+\.text\.([^,\s]+)")
_INSTRUCTION = re.compile(r"^\s*/\*[0-9a-f]+\*/\s+(?:\{\s*)?(?:@!?U?P(?:T|\d+)\s+)?([A-Z][A-Z0-9_]*)")


def disassemble(nvdisasm: str, cubin: Path, symbols: list[int]) -> dict[str, collections.Counter]:
    """Opcode counts per kernel (each kernel's .text section, with the subroutines that
    live in it) for the kernels with these symbol indices."""
    counts: dict[str, collections.Counter] = {}
    current: collections.Counter | None = None
    cmd = [nvdisasm, "-c", "-fun", ",".join(map(str, symbols)), str(cubin)]
    with subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                          bufsize=1 << 20) as process:
        assert process.stdout is not None and process.stderr is not None
        for line in process.stdout:
            match = _INSTRUCTION.match(line)
            if match:
                if current is not None:
                    current[match.group(1)] += 1
                continue
            match = _SECTION.match(line)
            if match:
                current = counts.setdefault(match.group(1), collections.Counter())
        error = process.stderr.read()
    if process.returncode != 0:
        raise ReportError(f"nvdisasm failed on {cubin.name} ({process.returncode}): "
                          f"{error.strip()[-300:]}")
    return counts


def sass_counts(nvdisasm: str, work: list[tuple[Path, list[tuple[int, int]]]],
                jobs: int) -> dict[tuple[str, str], collections.Counter]:
    """{(cubin name, kernel): opcode counts}; work: (cubin, [(symbol, text bytes)]). Each
    cubin's kernels are split into up to `jobs` nvdisasm calls of similar size."""
    tasks = []
    for cubin, kernels in work:
        total = sum(size for _, size in kernels)
        parts = max(1, min(jobs, len(kernels), math.ceil(total / CHUNK_BYTES)))
        bins: list[list[int]] = [[] for _ in range(parts)]
        loads = [0] * parts
        for symbol, size in sorted(kernels, key=lambda k: -k[1]):
            lightest = loads.index(min(loads))
            bins[lightest].append(symbol)
            loads[lightest] += size
        tasks += [(loads[i], cubin, sorted(bins[i])) for i in range(parts) if bins[i]]
    tasks.sort(key=lambda t: -t[0])
    result: dict[tuple[str, str], collections.Counter] = {}
    with concurrent.futures.ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
        futures = {pool.submit(disassemble, nvdisasm, cubin, symbols): cubin
                   for _, cubin, symbols in tasks}
        for future in concurrent.futures.as_completed(futures):
            for name, counter in future.result().items():
                result[(futures[future].name, name)] = counter
    return result


# ------------------------------------------------------------------------------ names
def demangle(names: list[str]) -> dict[str, str]:
    """Mangled -> demangled via c++filt (or cu++filt); unchanged without either."""
    tool = shutil.which("c++filt") or find_tool("cu++filt")
    if not tool or not names:
        return {n: n for n in names}
    try:
        out = subprocess.run([tool], input="\n".join(names) + "\n", capture_output=True,
                             text=True, check=True).stdout.splitlines()
    except (OSError, subprocess.SubprocessError):
        return {n: n for n in names}
    return dict(zip(names, out)) if len(out) == len(names) else {n: n for n in names}


_QUALIFIER = re.compile(r"(?:\(anonymous namespace\)::|\b[A-Za-z_]\w*::)+")


def short_name(demangled: str) -> str:
    """`void ns::(anonymous namespace)::k<ns::T<(ns::E)1>, 2>(args)` -> `k<T<(E)1>, 2>`."""
    name = demangled.strip()
    if name.endswith(")"):  # drop the parameter list: the parenthesis matching the last
        depth = 0
        for i in range(len(name) - 1, -1, -1):
            depth += {")": 1, "(": -1}.get(name[i], 0)
            if depth == 0:
                name = name[:i]
                break
    name = re.sub(r"^void ", "", name)
    return _QUALIFIER.sub("", name)


# -------------------------------------------------------------------------- occupancy
def occupancy(registers: int, threads: int | None, shared: int) -> dict:
    """Theoretical occupancy of blocks of `threads` threads using `registers` registers
    per thread and `shared` bytes of shared memory (static + dynamic) per block."""
    if not threads:
        return {"blocks_per_sm": None, "active_warps": None, "occupancy": None, "limit": None}
    warps = math.ceil(threads / WARP)
    regs_per_warp = math.ceil(registers * WARP / REG_ALLOC_UNIT) * REG_ALLOC_UNIT
    if (registers > MAX_REGS_PER_THREAD or threads > MAX_THREADS_PER_BLOCK
            or regs_per_warp * math.ceil(warps / SUB_PARTITIONS) * SUB_PARTITIONS > REGS_PER_BLOCK):
        by_regs = 0
    elif regs_per_warp:
        by_regs = (REGS_PER_SM // SUB_PARTITIONS // regs_per_warp) * SUB_PARTITIONS // warps
    else:
        by_regs = MAX_BLOCKS_PER_SM
    if shared > SMEM_PER_BLOCK:
        by_smem = 0
    else:
        allocated = math.ceil((shared + SMEM_RESERVED_PER_BLOCK) / SMEM_ALLOC_UNIT) * SMEM_ALLOC_UNIT
        by_smem = SMEM_PER_SM // allocated
    limits = {"regs": by_regs, "smem": by_smem,
              "warps": MAX_THREADS_PER_SM // WARP // warps, "blocks": MAX_BLOCKS_PER_SM}
    blocks = min(limits.values())
    return {"blocks_per_sm": blocks, "active_warps": blocks * warps,
            "occupancy": blocks * warps / (MAX_THREADS_PER_SM // WARP),
            "limit": "+".join(k for k, v in limits.items() if v == blocks)}


def dynamic_shared(name: str, table: list[tuple[str, object]]) -> int | None:
    for pattern, value in table:
        match = re.search(pattern, name)
        if match:
            return int(value(match) if callable(value) else value)  # type: ignore[arg-type]
    return None


# ----------------------------------------------------------------------------- report
def build_report(extension: Path, arch: str = "sm_90", kernel: str | None = None,
                 sass: bool = True, jobs: int | None = None,
                 table: list[tuple[str, object]] | None = None) -> dict:
    cuobjdump = require_tool("cuobjdump")
    nvdisasm = require_tool("nvdisasm", " (or run with --no-sass)") if sass else None
    table = DYNAMIC_SHARED if table is None else table
    jobs = jobs or os.cpu_count() or 1
    pattern = re.compile(kernel) if kernel else None
    rows = []
    with tempfile.TemporaryDirectory(prefix="kernel_report") as workdir:
        cubins = extract_cubins(cuobjdump, extension, arch, workdir)
        found = []  # (cubin, mangled, elf info, res-usage)
        for cubin in cubins:
            usage = parse_res_usage(run([cuobjdump, "-res-usage", str(cubin)]))
            for mangled, info in parse_cubin(cubin.read_bytes()).items():
                found.append((cubin, mangled, info, usage.get(mangled, {})))
        names = demangle(sorted({f[1] for f in found}))
        selected = []
        for cubin, mangled, info, res in found:
            short = short_name(names[mangled])
            if pattern and not (pattern.search(short) or pattern.search(names[mangled])
                                or pattern.search(mangled)):
                continue
            selected.append((cubin, mangled, short, info, res))
        counts: dict = {}
        if nvdisasm and selected:
            work: dict[Path, list[tuple[int, int]]] = collections.defaultdict(list)
            for cubin, _, _, info, _ in selected:
                work[cubin].append((info["symbol"], info["text_bytes"]))
            counts = sass_counts(nvdisasm, list(work.items()), jobs)
        for cubin, mangled, short, info, res in selected:
            threads_attr = info["reqntid"] or info["max_threads"]
            threads = math.prod(threads_attr) if threads_attr else None
            registers, static = res.get("REG", 0), res.get("SHARED", 0)
            dynamic = dynamic_shared(short, table)
            row: dict = {
                "name": short,
                "demangled": names[mangled],
                "mangled": mangled,
                "cubin": cubin.name,
                "registers": registers,
                "stack_bytes": res.get("STACK", 0),
                "local_bytes": res.get("LOCAL", 0),
                "static_shared_bytes": static,
                "dynamic_shared_bytes": dynamic,
                "occupancy_basis": "static only" if dynamic is None else "static+dynamic",
                "threads_per_block": threads,
                "threads_from": ("REQNTID" if info["reqntid"] else
                                 "MAX_THREADS" if info["max_threads"] else None),
                "max_threads": info["max_threads"],
                "reqntid": info["reqntid"],
                "text_bytes": info["text_bytes"],
                "sass": None,
            }
            if sass:
                counter = counts.get((cubin.name, mangled), collections.Counter())
                row["sass"] = {op: counter.get(op, 0) for op in COUNTED}
                row["sass"]["instructions"] = sum(counter.values())
            row.update(occupancy(registers, threads, static + (dynamic or 0)))
            rows.append(row)
    rows.sort(key=lambda r: (r["name"], r["mangled"]))
    return {
        "extension": str(extension),
        "arch": arch,
        "cubins": [c.name for c in cubins],
        "tools": {"cuobjdump": cuobjdump, "nvdisasm": nvdisasm,
                  "version": tool_version(cuobjdump)},
        "device": DEVICE,
        "kernel_filter": kernel,
        "sass": sass,
        "kernels": rows,
    }


def format_table(report: dict) -> str:
    rows = report["kernels"]
    sass = report["sass"]
    columns = [("kernel", "name", "<"), ("regs", "registers", ">"), ("stack", "stack_bytes", ">")]
    if any(r["local_bytes"] for r in rows):
        columns.append(("local", "local_bytes", ">"))
    if sass:
        columns += [("STL", "STL", ">"), ("LDL", "LDL", ">")]
    columns += [("smem", "static_shared_bytes", ">"), ("dyn_smem", "dynamic_shared_bytes", ">"),
                ("threads", "threads_per_block", ">")]
    if sass:
        ops = ["HMMA", "DMMA"] + [op for op in ("HGMMA", "IMMA")
                                  if any(r["sass"][op] for r in rows)] + ["LDSM", "LDGSTS"]
        columns += [(op, op, ">") for op in ops]
    columns += [("blocks/SM", "blocks_per_sm", ">"), ("occ", "occupancy", ">"),
                ("limit", "limit", "<")]

    def cell(row: dict, key: str) -> str:
        value = row["sass"][key] if sass and key in COUNTED else row.get(key)
        if key == "dynamic_shared_bytes" and value is None:
            return "static only"
        if key == "occupancy" and value is not None:
            return f"{value:.0%}"
        return "-" if value is None else str(value)

    cells = [[cell(r, key) for _, key, _ in columns] for r in rows]
    widths = [max([len(title)] + [len(c[i]) for c in cells]) for i, (title, _, _) in enumerate(columns)]

    def line(values: list[str]) -> str:
        return "  ".join(f"{v:{align}{w}}" for v, w, (_, _, align) in
                         zip(values, widths, columns)).rstrip()

    tc = sum(1 for r in rows if sass and any(r["sass"][op] for op in TENSOR_CORE))
    header = [
        f"# {report['extension']}",
        f"# {len(rows)} kernels{' matching ' + repr(report['kernel_filter']) if report['kernel_filter'] else ''}"
        f" in {len(report['cubins'])} {report['arch']} cubin(s) (cuobjdump {report['tools']['version']})"
        + (f"; {tc} with tensor-core instructions" if sass else "; SASS not disassembled (--no-sass)"),
        "# regs: registers/thread. stack, local: stack frame and local memory bytes/thread "
        "(cuobjdump -res-usage; spills live in the stack frame: ptxas's spill byte counts are "
        "not in the cubin)" + ("; STL/LDL: local-memory store/load instructions (spills and "
                               "local arrays)" if sass else ""),
        "# smem: static shared bytes/block. dyn_smem: dynamic shared bytes of the launch from "
        "the script's DYNAMIC_SHARED table; 'static only': not known, occupancy counts static "
        "shared memory only",
        "# threads: launch bound (EIATTR_REQNTID, else EIATTR_MAX_THREADS = __launch_bounds__); "
        "'-': none, no occupancy",
    ]
    if sass:
        header.append("# HMMA/DMMA(/HGMMA/IMMA): tensor-core instructions; LDSM: ldmatrix; "
                      "LDGSTS: cp.async (nvdisasm, per kernel .text section)")
    header.append(f"# occupancy: theoretical, on an {report['device']}; blocks/SM, active "
                  "warps/64, and the limiting resource")
    titles = line([title for title, _, _ in columns])
    return "\n".join(header + [titles, "-" * len(titles)] + [line(c) for c in cells]) + "\n"


def parse_dynamic(values: list[str]) -> list[tuple[str, object]]:
    table: list[tuple[str, object]] = []
    for value in values:
        pattern, sep, size = value.rpartition("=")
        if not sep or not pattern or not size.isdigit():
            raise ReportError(f"--dynamic-shared {value!r}: expected REGEX=BYTES")
        re.compile(pattern)
        table.append((pattern, int(size)))
    return table


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description="Per-kernel registers, shared memory, tensor-core SASS counts and H200 "
                    "occupancy of oxijax's CUDA kernels (sm_90 cubins of the built extension).")
    parser.add_argument("extension", nargs="?", type=Path,
                        help="the built _oxijax*.so (default: $OXIJAX_EXTENSION, the one "
                             "`import oxijax` loads, else the source tree's)")
    parser.add_argument("--kernel", metavar="REGEX",
                        help="only kernels whose (short, demangled or mangled) name matches")
    parser.add_argument("--json", nargs="?", const="-", metavar="PATH",
                        help="print JSON instead of the table; with PATH, write it there "
                             "and print the table too")
    parser.add_argument("--no-sass", action="store_true",
                        help="skip the disassembly (no instruction counts; much faster)")
    parser.add_argument("--arch", default="sm_90",
                        help="cubin architecture (default sm_90; the occupancy model is "
                             "the H200's whatever the architecture)")
    parser.add_argument("--jobs", type=int, default=None,
                        help="parallel nvdisasm processes (default: the number of CPUs)")
    parser.add_argument("--dynamic-shared", action="append", default=[], metavar="REGEX=BYTES",
                        help="dynamic shared bytes for kernels whose short name matches "
                             "(before the built-in table; repeatable)")
    parser.add_argument("--static-only", action="store_true",
                        help="ignore the DYNAMIC_SHARED table: occupancy from static "
                             "shared memory only")
    args = parser.parse_args(argv)
    try:
        re.compile(args.kernel or "")
    except re.error as error:
        parser.error(f"--kernel {args.kernel!r}: {error}")
    try:
        table = parse_dynamic(args.dynamic_shared) + ([] if args.static_only else DYNAMIC_SHARED)
        extension = args.extension or default_extension()
        report = build_report(extension, args.arch, args.kernel, not args.no_sass, args.jobs,
                              table)
    except (ReportError, re.error) as error:
        print(f"kernel_report: {error}", file=sys.stderr)
        return 1
    if args.json == "-":
        json.dump(report, sys.stdout, indent=1)
        sys.stdout.write("\n")
        return 0
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=1) + "\n")
    sys.stdout.write(format_table(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
