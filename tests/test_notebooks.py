"""The notebooks run top to bottom (nbclient, a fresh ipykernel) and are stored without
outputs."""

from __future__ import annotations

import pathlib

import pytest

# Test extras (pyproject.toml); absent on the GPU image, where only the gpu tests matter.
nbformat = pytest.importorskip("nbformat")
NotebookClient = pytest.importorskip("nbclient").NotebookClient

NOTEBOOKS = sorted((pathlib.Path(__file__).resolve().parent.parent / "notebooks").glob("*.ipynb"))


def test_every_notebook_is_found():
    assert [p.name for p in NOTEBOOKS] == [
        "01_quickstart.ipynb", "02_backend_pointers.ipynb", "03_performance.ipynb"]


@pytest.mark.slow
@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_notebook_runs(path, tmp_path):
    notebook = nbformat.read(path, as_version=4)
    assert all(not cell.get("outputs") for cell in notebook.cells if cell.cell_type == "code"), (
        f"{path.name} is stored with outputs; clear them before committing")
    # A non-interactive matplotlib backend; the working directory is a scratch folder so
    # that the installed oxijax is imported and nothing is written into the repository.
    client = NotebookClient(notebook, timeout=180, kernel_name="python3",
                            resources={"metadata": {"path": str(tmp_path)}})
    with pytest.MonkeyPatch.context() as env:
        env.setenv("MPLBACKEND", "Agg")
        client.execute()
    errors = [out for cell in notebook.cells for out in cell.get("outputs", [])
              if out.get("output_type") == "error"]
    assert not errors
