"""``make bench-gpu`` (:mod:`engine.bench_gpu`) end to end under numba's
CUDA simulator (or on a GPU): every row correct, the ratio, copy-share,
phase and counting tables printed with measured values.  The simulator
runs each thread in Python, so the standard workload is swapped for a toy
BE-Gen one (the workloads themselves are tested elsewhere)."""

from __future__ import annotations

import pytest

from tests.test_cuda_sim import needs_cuda

pytestmark = [pytest.mark.cuda, needs_cuda]


def test_bench_gpu_prints_ratios_copy_share_phases_and_counting(capsys, monkeypatch):
    from engine import bench_gpu, workloads

    def toy(name, scale=1.0, n_events=None):
        assert name == "W1"
        return workloads.begen(12, n_events, dims=4, cardinality=4, sub_size=2, event_size=3, eq_share=0.5,
                               match_prob=0.3, name="W1-toy")

    monkeypatch.setattr(workloads, "standard", toy)
    rc = bench_gpu.main(["--workload", "W1", "--events", "2", "--cpu-events", "2", "--repeats", "1",
                         "--latency-samples", "0", "--block-sizes", "2,8", "--quiet"])
    out = capsys.readouterr().out
    assert rc == 0, out
    ratios = out.split("== cuda / cpu")[1].split("==")[0].splitlines()
    assert sorted(line.split()[1] for line in ratios[2:] if line.split()) == ["opindex", "scan"]
    phases = out.split("phases synchronised, seconds)")[1].splitlines()[1]
    assert phases.startswith("W1-toy: events-in ") and "counting" in phases and "copy-back" in phases
    counting = out.split("atomic decrements vs sort-and-segment")[1].splitlines()
    header, row = counting[1].split(), counting[2].split()
    assert header == ["workload", "events", "device_io_s", "sort_counting_s", "atomic_over_sort", "sort_agrees"]
    assert row[0] == "W1-toy" and row[1] == "2" and row[-1] == "True"
    assert float(row[2]) > 0 and float(row[3]) > 0
    blocks = out.split("by threads per block")[1].splitlines()[1]
    assert blocks.startswith("W1-toy: chosen ") and ", 2 " in blocks and ", 8 " in blocks
