"""``make bench-gpu`` (:mod:`engine.bench.gpu`) end to end under numba's
CUDA simulator (or on a GPU): every row correct, the ratio, copy-share,
phase and counting tables printed with measured values.  The simulator
runs each thread in Python, so the standard workload is swapped for a toy
BE-Gen one (the workloads themselves are tested elsewhere)."""

from __future__ import annotations

import pytest

from engine.algorithms import registry
from engine.algorithms.options import ScanOptions
from tests.test_cuda_sim import needs_cuda


def test_bench_gpu_runs_the_algorithms_registered_on_cuda():
    """``--algorithm`` takes the cuda algorithms of the registry (and their
    bench variants), read when the parser is built; not a cpu-only one."""
    from engine.bench import gpu

    from engine.bench.algorithms import VARIANTS
    variants = tuple(name for name, (base, *_) in VARIANTS.items() if base in registry.names("cuda"))
    assert gpu.cuda_algorithms() == (*registry.names("cuda"), *variants)
    assert {"opindex-bs", "apcm-bitmap", "apcm-cuppre"} <= set(variants)
    cpu_only = registry.Algorithm(name="cpu_only", title="cpu_only", paper="(test)", sections="",
                                  implementations={"cpu": "engine.algorithms.scan:ScanMatcher"}, options=ScanOptions)
    on_cuda = registry.Algorithm(name="on_cuda", title="on_cuda", paper="(test)", sections="",
                                 implementations={"cuda": "engine.algorithms.scan_cuda:ScanCudaMatcher"},
                                 options=ScanOptions)
    registry.register(cpu_only)
    registry.register(on_cuda)
    try:
        assert "on_cuda" in gpu.cuda_algorithms() and "cpu_only" not in gpu.cuda_algorithms()
    finally:
        registry.unregister("cpu_only")
        registry.unregister("on_cuda")


@pytest.mark.cuda
@needs_cuda
def test_bench_gpu_prints_ratios_copy_share_phases_and_counting(capsys, monkeypatch):
    from engine import workloads
    from engine.bench import gpu

    def toy(name, scale=1.0, n_events=None):
        assert name == "W1"
        return workloads.begen(12, n_events, dims=4, cardinality=4, sub_size=2, event_size=3, eq_share=0.5,
                               match_prob=0.3, name="W1-toy")

    monkeypatch.setattr(workloads, "standard", toy)
    from engine.algorithms.cuda_base import ChunkedCudaMatcher
    monkeypatch.setattr(ChunkedCudaMatcher, "pipeline_min_events", 1)     # the toy's 2 events: 2 chunks
    rc = gpu.main(["--workload", "W1", "--events", "2", "--cpu-events", "2", "--repeats", "1",
                   "--latency-samples", "0", "--block-sizes", "2,8", "--quiet"])
    out = capsys.readouterr().out
    assert rc == 0, out
    # each result is printed as soon as it is measured (a run cut short keeps them), then all together
    as_measured, out = out.split("==== every workload")
    assert as_measured.index("== cuda / cpu") < as_measured.index("one batch, after event encoding)") \
        < as_measured.index("== end to end, Index.match_batch")
    ratios = out.split("== cuda / cpu")[1].split("==")[0].splitlines()
    assert sorted(line.split()[1] for line in ratios[2:] if line.split()) == sorted(registry.names("cuda"))
    phases = out.split("phases synchronised, seconds)")[1].splitlines()[1:]
    assert phases[0].startswith("W1-toy opindex: events-in ") and "counting" in phases[0] \
        and "copy-back" in phases[0]
    # every cuda algorithm but scan gets its host-array and device-resident batch timed
    copies = out.split("one batch, after event encoding)")[1].split("==")[0].splitlines()
    assert sorted(line.split()[1] for line in copies[2:] if line.split()) \
        == sorted(set(registry.names("cuda")) - {"scan"})
    counting = out.split("atomic decrements vs sort-and-segment")[1].splitlines()
    header, row = counting[1].split(), counting[2].split()
    assert header == ["workload", "events", "device_io_s", "sort_counting_s", "atomic_over_sort", "sort_agrees"]
    assert row[0] == "W1-toy" and row[1] == "2" and row[-1] == "True"
    assert float(row[2]) > 0 and float(row[3]) > 0
    blocks = out.split("by threads per block")[1].splitlines()[1]
    assert blocks.startswith("W1-toy: chosen ") and ", 2 " in blocks and ", 8 " in blocks
    # end to end by route (opindex by default): the routes (and the Arrow one without the copy-back overlap)
    # agree, every rate is measured
    routes = out.split("== end to end, Index.match_batch")[1].splitlines()
    header, row = routes[1].split(), routes[2].split()
    assert header[:8] == ["workload", "algorithm", "events", "pairs", "device_resident", "device_in_device_out",
                          "host_in_device_out", "host_in_arrow_out"] and header[-1] == "routes_agree"
    assert row[:3] == ["W1-toy", "opindex", "2"] and row[-1] == "True"
    assert all(float(v.replace(",", "")) > 0 for v in row[4:8])
    assert header[8:11] == ["arrow_out_serial", "overlap_gain", "host_in_lists_out"]
    assert float(row[8].replace(",", "")) > 0 and float(row[9]) > 0 and float(row[10].replace(",", "")) > 0


@pytest.mark.cuda
@needs_cuda
def test_the_gpu_bench_exits_1_when_a_run_failed(monkeypatch, capsys):
    """It counted only wrong answers: a run that raised left the exit status 0."""
    from engine import workloads
    from engine.bench import gpu, measure

    def failing(workload_list, algorithms, backends, **kwargs):
        return [measure.empty_row(workload=workload_list[0].name, algorithm="opindex", backend=backends[0],
                                  status="error", n_subscriptions=1, n_events=1, scan_sample=1,
                                  note="RuntimeError: boom")]
    monkeypatch.setattr(gpu, "run_benchmark", failing)
    monkeypatch.setattr(workloads, "standard", lambda name, scale=1.0, n_events=None: workloads.begen(
        12, n_events, dims=4, cardinality=4, sub_size=2, event_size=3, eq_share=0.5, match_prob=0.3, name="W1-toy"))
    assert gpu.main(["--workload", "W1", "--events", "2", "--algorithm", "opindex", "--no-copy-share",
                     "--quiet"]) == 1


@pytest.mark.cuda
@needs_cuda
@pytest.mark.parametrize("make, algorithm", [
    # ABE-Gen's subscriptions are expression texts and ASTs, not the columnar table (the device session's W5
    # run raised SchemaError in copy_share)
    (lambda workloads: workloads.abe_gen(6, 3, dims=4, cardinality=4, depth=2, fanout=(2, 3), event_size=3),
     "atree"),
    # the sparse generator's events are one map column: the device-in route takes it as a DeviceMap (W3's run
    # had raised TypeError, then had no device-in route)
    (lambda workloads: workloads.opindex_gen(6, 3, dims=6, cardinality=4, gamma_max=2, m=3), "opindex"),
])
def test_copy_share_and_end_to_end_take_every_workload_form(make, algorithm):
    from engine import workloads
    from engine.bench import gpu

    workload = make(workloads)
    share = gpu.copy_share(workload, algorithm, repeats=1, counting=False)
    assert share["events"] == 3 and share["device_io_s"] > 0
    row = gpu.end_to_end(workload, algorithm, repeats=1, device_resident_s=share["device_io_s"])
    assert row["routes_agree"] is True and row["pairs"] == share["pairs"]
    assert row["host_in_arrow_out"] > 0 and row["host_in_device_out"] > 0 and row["host_in_lists_out"] > 0
    assert row["device_in_device_out"] > 0
