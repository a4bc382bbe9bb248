"""The notebooks are executed, top to bottom, at a tiny scale."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_benchmarks_notebook_runs_and_shows_table_and_plots(tmp_path, monkeypatch):
    notebook = nbformat.read(ROOT / "notebooks" / "benchmarks.ipynb", as_version=4)
    # the kernel must be this interpreter (the venv's), with the repository importable
    monkeypatch.setenv("PATH", os.path.dirname(sys.executable) + os.pathsep + os.environ.get("PATH", ""))
    monkeypatch.setenv("PYTHONPATH", str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    monkeypatch.setenv("BEXMATCH_NOTEBOOK_SCALE", "0.0005")
    monkeypatch.setenv("BEXMATCH_NOTEBOOK_EVENTS", "60")
    NotebookClient(notebook, timeout=600, kernel_name="python3",
                   resources={"metadata": {"path": str(tmp_path)}}).execute()
    outputs = [o for cell in notebook.cells if cell.cell_type == "code" for o in cell.get("outputs", [])]
    assert not [o for o in outputs if o.get("output_type") == "error"]
    assert (tmp_path / "benchmarks.png").stat().st_size > 1000
    assert (tmp_path / "sweep.png").stat().st_size > 1000
    html_tables = [o for o in outputs if "text/html" in o.get("data", {})]
    assert any("events_per_s" in o["data"]["text/html"] for o in html_tables)
    assert sum("image/png" in o.get("data", {}) for o in outputs) == 2
