"""The notebooks are executed, top to bottom, at a tiny scale."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import nbformat
import pandas as pd
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
    figures = tmp_path / "out" / "figures"          # (a folder whose parent is not there yet either)
    monkeypatch.setenv("BEXMATCH_NOTEBOOK_FIGURES", str(figures))
    NotebookClient(notebook, timeout=600, kernel_name="python3",
                   resources={"metadata": {"path": str(tmp_path)}}).execute()
    outputs = [o for cell in notebook.cells if cell.cell_type == "code" for o in cell.get("outputs", [])]
    assert not [o for o in outputs if o.get("output_type") == "error"]
    assert (figures / "benchmarks.png").stat().st_size > 1000
    assert (figures / "sweep.png").stat().st_size > 1000
    assert (figures / "recorded.png").stat().st_size > 1000      # the recorded full-scale runs beside
    html_tables = [o for o in outputs if "text/html" in o.get("data", {})]
    assert any("events_per_s" in o["data"]["text/html"] for o in html_tables)
    assert sum("image/png" in o.get("data", {}) for o in outputs) == 3
    recorded = [o["data"]["text/html"] for o in html_tables if "median" in o["data"]["text/html"]]
    assert recorded and all(name in recorded[-1] for name in ("opindex", "betree", "apcm"))


def run_paper_notebook(name: str, tmp_path, monkeypatch, scale: str = "0.001", events: str = "60",
                       one_repeat: bool = False) -> list:
    """Execute a paper notebook at test scale (default 0.001, 60 events) in
    ``tmp_path``, beside the repository's recorded full-scale data, asking
    it to write its rows to ``tmp_path / "rows.csv"`` (the notebooks that
    record their runs) -- with ``one_repeat``, one timed run a point; its
    code cells' outputs, none an error."""
    notebook = nbformat.read(ROOT / "notebooks" / name, as_version=4)
    monkeypatch.setenv("PATH", os.path.dirname(sys.executable) + os.pathsep + os.environ.get("PATH", ""))
    monkeypatch.setenv("PYTHONPATH", str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    monkeypatch.setenv("BEXMATCH_NOTEBOOK_SCALE", scale)
    monkeypatch.setenv("BEXMATCH_NOTEBOOK_EVENTS", events)
    monkeypatch.setenv("BEXMATCH_NOTEBOOK_RECORD", str(tmp_path / "rows.csv"))
    if one_repeat:
        monkeypatch.setenv("BEXMATCH_NOTEBOOK_REPEATS", "1")
    monkeypatch.delenv("BEXMATCH_NOTEBOOK_DATA", raising=False)       # the recorded data of the repository
    NotebookClient(notebook, timeout=600, kernel_name="python3",
                   resources={"metadata": {"path": str(tmp_path)}}).execute()
    outputs = [o for cell in notebook.cells if cell.cell_type == "code" for o in cell.get("outputs", [])]
    assert not [o for o in outputs if o.get("output_type") == "error"]
    return outputs


@pytest.mark.slow
def test_betree_notebook_reproduces_the_papers_figures(tmp_path, monkeypatch):
    """notebooks/betree.ipynb: BE-Tree Fig. 5, 6, 11 and Table 5 for scan,
    opindex and betree at a tiny scale, beside the full-scale run recorded
    in notebooks/data (BENCHMARKS.md, "BE-Tree (issue 13)")."""
    outputs = run_paper_notebook("betree.ipynb", tmp_path, monkeypatch)
    for name in ("fig5.png", "fig6.png", "fig11.png", "table5.png"):
        assert (tmp_path / "figures" / name).stat().st_size > 10_000, name
    assert sum("image/png" in o.get("data", {}) for o in outputs) == 4
    html = [o["data"]["text/html"] for o in outputs if "text/html" in o.get("data", {})]
    ratio_tables = [t for t in html if "betree / opindex" in t and "full scale (C2)" in t and "this run" in t]
    assert len(ratio_tables) == 3                                   # Fig. 5, 6, 11: this run beside C2's
    assert any("max_cap=5" in t and "max_cap=20" in t for t in html)  # Table 4 per Fig. 11 point
    table5 = next(t for t in html if "paper Table 5" in t)
    assert all(name in table5 for name in ("scan", "opindex", "betree", "full scale, machine C2", "4.75"))
    assert any("tree_insert_per_s" in t and "api_add_per_s" in t for t in html)


@pytest.mark.slow
def test_apcm_notebook_reproduces_the_papers_figures(tmp_path, monkeypatch):
    """notebooks/apcm.ipynb: A-PCM Fig. 8, 9(a-c), 12 and W1/W6 with the
    paper's ablations, opindex and betree, and the compression over
    OpIndex's lists, at a tiny scale, beside the
    full-scale run recorded in notebooks/data (BENCHMARKS.md, "A-PCM (issue 14)")."""
    outputs = run_paper_notebook("apcm.ipynb", tmp_path, monkeypatch)
    for name in ("fig8.png", "over_opindex.png", "fig9_a.png", "fig9_b.png", "fig9_c.png", "fig12.png"):
        assert (tmp_path / "figures" / name).stat().st_size > 10_000, name
    assert sum("image/png" in o.get("data", {}) for o in outputs) == 6
    html = [o["data"]["text/html"] for o in outputs if "text/html" in o.get("data", {})]
    fig8 = [t for t in html if "apcm / apcm-parallel" in t and "full scale (C2)" in t and "this run" in t]
    assert len(fig8) == 1 and all(name in fig8[0] for name in ("opindex", "betree", "apcm-bitmap", "apcm-cuppre"))
    over = [t for t in html if "OpIndex lists: compressed / per event" in t]
    assert len(over) == 1 and "full scale (C2)" in over[0] and "this run" in over[0]
    # Fig. 8, over OpIndex, Fig. 9(a-c), Fig. 12 (its table with W1's recording too)
    assert sum("full scale (C2)" in t and "this run" in t for t in html) == 1 + 1 + 3 + 1
    assert sum("W1 (C4)" in t and "apcm-bitmap" in t for t in html) == 1
    standard = html[-1]
    assert all(name in standard for name in ("W1", "W6", "full scale, machine C2", "apcm-parallel"))



@pytest.mark.slow
def test_pstree_notebook_reproduces_the_papers_figures(tmp_path, monkeypatch):
    """notebooks/pstree.ipynb: PS-Tree Fig. 6, 7, 12, 13 and 5(a)/14(a) on a dense and a sparse space for
    scan, opindex, pstbloom and psthash at a tiny scale, beside the run recorded in notebooks/data
    (BENCHMARKS.md, "PS-Tree (issue 12)"); its rows written where BEXMATCH_NOTEBOOK_RECORD says."""
    outputs = run_paper_notebook("pstree.ipynb", tmp_path, monkeypatch, "0.0005", "40", one_repeat=True)
    for name in ("fig6.png", "fig5a.png", "fig14a.png", "fig7.png", "fig12.png", "fig13.png"):
        assert (tmp_path / "figures" / name).stat().st_size > 10_000, name
    assert sum("image/png" in o.get("data", {}) for o in outputs) == 6
    html = [o["data"]["text/html"] for o in outputs if "text/html" in o.get("data", {})]
    orderings = [t for t in html if "fastest first" in t and "this run" in t and "recorded (C3)" in t]
    assert len(orderings) == 4                                        # Fig. 6, 7, 12, 13 beside the recording
    assert all("psthash / opindex" in t and "30000" in t for t in orderings)
    rows = pd.read_csv(tmp_path / "rows.csv")
    assert set(rows["figure"]) == {"Fig. 6", "Fig. 7", "Fig. 12", "Fig. 13"} and rows["correct"].all()
    assert set(rows["algorithm"]) == {"scan", "opindex", "pstbloom", "psthash"}
    assert set(rows["series_value"]) == {100, 30_000}
    recorded = pd.read_csv(ROOT / "notebooks" / "data" / "pstree_c3.csv")
    assert set(recorded["figure"]) == set(rows["figure"]) and recorded["n_subscriptions"].max() >= 30_000


@pytest.mark.slow
def test_atree_notebook_reproduces_the_papers_figures(tmp_path, monkeypatch):
    """notebooks/atree.ipynb: A-Tree Fig. 8-10 (every ablation), 11-13 (a-c) with scan, opindex and
    pstbloom through DNF, and the conjunctive workloads at a tiny scale, beside the run recorded in
    notebooks/data (BENCHMARKS.md, "A-Tree experiments again")."""
    outputs = run_paper_notebook("atree.ipynb", tmp_path, monkeypatch, "0.0005", "40", one_repeat=True)
    names = ["fig8.png", "fig9.png", "fig10.png"] + [f"fig{n}{t}.png" for t in "abc" for n in (12, 11, 13)]
    for name in names:
        assert (tmp_path / "figures" / name).stat().st_size > 10_000, name
    assert sum("image/png" in o.get("data", {}) for o in outputs) == len(names)
    html = [o["data"]["text/html"] for o in outputs if "text/html" in o.get("data", {})]
    assert sum("this run" in t and "recorded (C4)" in t for t in html) == 3 + 3 + 1
    assert any("atree / best other" in t and "abe-near-conjunctive" in t for t in html)
    rows = pd.read_csv(tmp_path / "rows.csv")
    assert rows["correct"].all() and {"atree-binary", "atree-noopt", "atree-reorg", "pstbloom"} <= set(rows["algorithm"])
    recorded = pd.read_csv(ROOT / "notebooks" / "data" / "atree_c4.csv")
    assert set(recorded["figure"]) == set(rows["figure"]) and recorded["n_subscriptions"].max() >= 20_000
