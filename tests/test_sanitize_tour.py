"""scripts/sanitize_gpu_ops.py, the kernel tour that gpu_check.sh runs under
compute-sanitizer on a GPU, run in-process with ``--interpret``'s code path: every case
on the CUDA interpreter (every access checked) must agree with the CPU kernels, leave no
interpreter report, and together the cases must launch every __global__ kernel of
ffi/cuda but the PTX probe."""

from __future__ import annotations

import importlib.util
import pathlib
import re

import pytest
from conftest import require_interpreter

ROOT = pathlib.Path(__file__).resolve().parents[1]

pytestmark = [pytest.mark.cuda_interpret, pytest.mark.slow]


def load_tour():
    spec = importlib.util.spec_from_file_location("sanitize_gpu_ops",
                                                  ROOT / "scripts" / "sanitize_gpu_ops.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def cuda_kernels() -> set[str]:
    kernels = set()
    for source in (ROOT / "ffi" / "cuda").glob("*.cu"):
        text = re.sub(r"__launch_bounds__\([^)]*\)", "", source.read_text())
        kernels |= set(re.findall(r"__global__[^(]*?\b(\w+)\s*\(", text))
    return kernels


def test_interpreted_tour_passes_and_reaches_every_kernel(capsys):
    interp = require_interpreter()
    interp.take_reports()
    interp.take_launched_kernels()
    failures = load_tour().tour(interpret=True)
    reports = interp.take_reports()
    launched = " ".join(interp.take_launched_kernels())
    out = capsys.readouterr().out
    assert not failures and not reports, (
        f"failed cases: {failures}\n" + "\n\n".join(reports) +
        "\n" + "\n".join(line for line in out.splitlines() if not line.startswith("ok ")))
    missing = sorted(k for k in cuda_kernels() - {"ptx_probe_kernel"}
                     if not re.search(rf"\b{k}\s*[<(]", launched))
    assert len(cuda_kernels()) >= 20 and not missing, f"kernels the tour never launched: {missing}"
