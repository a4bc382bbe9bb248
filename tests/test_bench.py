"""``bexmatch bench`` (engine.bench): end to end at a tiny scale -- rows, CSV,
PNG, sweeps, skipped and failing combinations, that wrong answers are never
reported as plain speed, and that what it runs comes from the algorithm
registry (an algorithm registered at runtime included)."""

from __future__ import annotations

import csv
import math
import os
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest

from engine import Index, bench
from engine.algorithms import registry
from engine.algorithms.options import Options, ScanOptions, option
from engine.algorithms.scan import ScanMatcher
from engine.bench import algorithms as bench_algorithms
from engine.bench import cli, measure, report
from engine.workloads import standard

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
N_EVENTS = 200
FAST = dict(repeats=1, latency_samples=20, progress=False)


@pytest.fixture(scope="module")
def workload():
    return standard("W1", scale=0.001, n_events=N_EVENTS)


@pytest.fixture(scope="module")
def scan_matches_per_event(workload):
    index = Index(algorithm="scan", backend="cpu")
    index.add_many(workload.subscriptions)
    index.merge()
    found = index.match_batch(workload.events)
    return sum(len(ids) for ids in found) / len(found)


@pytest.fixture
def registered():
    """``registered(name, implementations)``: an algorithm registered for one
    test with scan's options (a registered name is replaced, and restored
    in its place afterwards)."""
    previous = {}

    def register(name, implementations):
        if name not in previous:
            previous[name] = registry.get(name) if name in registry.names() else None
        return registry.register(registry.Algorithm(name=name, title=name, paper="(test)", sections="",
                                                    implementations=implementations, options=ScanOptions),
                                 replace=True)

    yield register
    for name, algorithm in previous.items():
        if algorithm is None:
            registry.unregister(name)
        else:
            registry.register(algorithm, replace=True)


SCAN_CPU = {"cpu": "engine.algorithms.scan:ScanMatcher"}


@pytest.fixture
def unimplemented(registered):
    """A registered algorithm that does not run on cpu."""
    registered("cuda_only", {"cuda": "engine.algorithms.scan_cuda:ScanCudaMatcher"})
    return "cuda_only"


def read_csv(path):
    with open(path, newline="", encoding="utf-8") as f:
        reader = csv.DictReader(f)
        return reader.fieldnames, list(reader)


def assert_png(path):
    with open(path, "rb") as f:
        assert f.read(8) == PNG_MAGIC
    from matplotlib.image import imread
    image = imread(path)
    assert image.ndim == 3 and image.shape[0] > 100 and image.shape[1] > 100


def test_cli_end_to_end(tmp_path, workload, scan_matches_per_event, unimplemented, capsys):
    csv_path, png_path = tmp_path / "bench.csv", tmp_path / "bench.png"
    implemented = bench.implemented_algorithms(["cpu"])
    argv = ["--workload", "W1", "--scale", "0.001", "--events", str(N_EVENTS), "--repeats", "1",
            "--latency-samples", "20", "--csv", str(csv_path), "--plot", str(png_path), "--quiet"]
    for algorithm in [*implemented, unimplemented]:
        argv += ["--algorithm", algorithm]
    assert bench.main(argv) == 0

    out = capsys.readouterr().out
    assert "events/s" in out and "W1 begen-uniform" in out and "skipped" in out

    columns, rows = read_csv(csv_path)
    assert tuple(columns) == bench.COLUMNS
    assert [r["algorithm"] for r in rows] == [*implemented, unimplemented]
    for row in rows:
        assert row["workload"] == workload.name
        assert row["backend"] == "cpu"
        assert int(row["n_subscriptions"]) == workload.n_subscriptions
        assert int(row["n_predicates"]) == workload.n_predicates
    ran = [r for r in rows if r["algorithm"] != unimplemented]
    for row in ran:
        assert row["status"] == "ok", row["note"]
        assert row["correct"] == "True", row["note"]
        assert int(row["n_events"]) == N_EVENTS == int(row["scan_sample"])
        for column in ("build_s", "events_per_s", "scan_events_per_s", "ratio_to_scan", "latency_p50_us",
                       "latency_p99_us"):
            value = float(row[column])
            assert math.isfinite(value) and value > 0, column
        assert float(row["latency_p50_us"]) <= float(row["latency_p99_us"])
        assert int(row["index_bytes"]) > 0
        assert float(row["matches_per_event"]) == pytest.approx(scan_matches_per_event)
    scan = rows[implemented.index("scan")]
    assert float(scan["ratio_to_scan"]) == 1.0
    assert float(scan["scan_events_per_s"]) == float(scan["events_per_s"])
    assert scan_matches_per_event > 0          # W1 plants matches (1 % of the subscriptions)

    skipped = rows[-1]
    assert skipped["status"] == "skipped"
    assert unimplemented in skipped["note"]
    assert skipped["events_per_s"] == "" and skipped["correct"] == ""

    assert_png(png_path)


def test_help_exits_zero_with_usage(capsys):
    with pytest.raises(SystemExit) as exc:
        bench.main(["--help"])
    assert exc.value.code == 0
    out = capsys.readouterr().out
    assert "usage: bexmatch bench" in out
    for flag in ("--workload", "--algorithm", "--backend", "--csv", "--plot", "--sweep", "--values",
                 "--generator", "--parquet", "--repeats", "--events", "--scale", "--series", "--arrival-delays",
                 "--batch-sizes", "--simulated-events"):
        assert flag in out


@pytest.mark.parametrize("argv", [["--sweep", "no_such_param", "--values", "1,2"],
                                  ["--sweep", "N"],
                                  ["--values", "1,2"],
                                  ["--workload", "W99", "--quiet"],
                                  ["--algorithm", "nope"],
                                  ["--option", "betree.max_cap"],
                                  ["--option", "nope.max_cap=5"],
                                  ["--option", "betree.bogus=5"],
                                  ["--option", "betree.max_cap=0"],
                                  ["--option", "opindex.segments=auto"],
                                  # these ran (part of) the benchmark first, then raised a raw traceback, or ran
                                  # with the option ignored (helper-41's probe)
                                  ["--updates", "5", "--load"],
                                  ["--sweep", "N", "--values", "100", "--ingest"],
                                  ["--csv", "/no/such/dir/out.csv"],
                                  ["--plot", "out.pdf"],
                                  ["--seed", "-1"],
                                  ["--latency-samples", "-5"],
                                  ["--parquet", "/no/such/workload"],
                                  ["--workload", "W9", "--updates", "10"],
                                  ["--workload", "W9", "--load"],
                                  ["--updates", "1000", "--scale", "0.0005"],
                                  ["--workload", "W5", "--scale", "0.0005", "--load"],
                                  ["--sweep", "fixed_event_size", "--values", "maybe"],
                                  # an option that changes nothing, or fails on the second backend only
                                  ["--algorithm", "scan", "--option", "betree.max_cap=3"],
                                  ["--backend", "cpu", "--backend", "cuda", "--algorithm", "apcm",
                                   "--option", "apcm.over=opindex"],
                                  # the first point was measured, then the second's value raised a traceback
                                  ["--sweep", "similarity", "--values", "0.1,7", "--generator", "begen"],
                                  ["--sweep", "fanout", "--values", "2..4,1", "--generator", "abe"],
                                  # --events cut every point of an events sweep to itself
                                  ["--sweep", "events", "--values", "50,100", "--events", "60",
                                   "--generator", "begen"]])
def test_usage_errors_exit_2(argv, capsys):
    with pytest.raises(SystemExit) as exc:
        bench.main(argv)
    assert exc.value.code == 2
    assert "usage:" in capsys.readouterr().err


def test_a_workload_named_twice_runs_once():
    """``--workload W1 --workload begen-uniform`` measured W1 twice."""
    parser = cli.build_parser()
    assert cli._distinct_workloads(["W1", "begen-uniform", "w1-begen-uniform", "W6", "w1"], parser) == ["W1", "W6"]
    rows = cli._workloads(["W1", "begen_uniform"], parser, scale=0.0005, n_events=5)
    assert [w.name for w in rows] == ["W1 begen-uniform"]


def test_a_parquet_workload_named_twice_runs_once(tmp_path):
    """``--parquet DIR --parquet DIR/`` measured it twice."""
    from engine.workloads import write_parquet
    write_parquet(standard("W1", scale=0.0005, n_events=5), tmp_path / "w1")
    parser = cli.build_parser()
    same = [str(tmp_path / "w1"), str(tmp_path / "w1") + "/", str(tmp_path / "." / "w1")]
    assert len(cli._parquet_workloads(same, parser)) == 1
    write_parquet(standard("W1", scale=0.0005, n_events=5, seed=1), tmp_path / "other")
    assert len(cli._parquet_workloads([*same, str(tmp_path / "other")], parser)) == 2


def test_a_workload_without_events_is_refused_not_reported_correct(tmp_path, capsys):
    """Every row said "correct yes" having compared nothing."""
    from engine.workloads import write_parquet
    write_parquet(standard("W1", scale=0.0005, n_events=0), tmp_path / "empty")
    with pytest.raises(SystemExit) as exc:
        bench.main(["--parquet", str(tmp_path / "empty"), "--quiet"])
    assert exc.value.code == 2 and "has no events to match" in capsys.readouterr().err
    with pytest.raises(ValueError, match="has no events to match"):
        measure.run_benchmark([standard("W1", scale=0.0005, n_events=0)], ["scan"], ["cpu"], progress=False)


def test_yes_no_sweep_values_and_non_finite_generator_parameters():
    """"no" and "off" were truthy strings to a yes/no parameter; NaN passed
    every range check (a degenerate workload), and group_size=inf hung."""
    from engine import workloads
    from engine.bench.sweep import coerce_value
    assert [coerce_value("opindex", "fixed_event_size", v) for v in ("no", "off", "0", "False", "yes", "on")] == \
        [False, False, False, False, True, True]
    with pytest.raises(ValueError, match="fixed_event_size is true or false"):
        coerce_value("opindex", "fixed_event_size", "maybe")
    for call in (lambda: workloads.opindex_gen(50, 5, zipf=math.nan), lambda: workloads.begen(50, 5, zipf=math.inf),
                 lambda: workloads.begen(50, 5, similarity=0.5, group_size=math.inf),
                 lambda: workloads.begen(50, 5, similarity=0.5, group_size=math.nan),
                 lambda: workloads.abe_gen(50, 5, operators=(math.nan, 1, 1, 1, 1)),
                 lambda: workloads.abe_gen(50, 5, attr_zipf=math.nan)):
        with pytest.raises(ValueError, match="finite|non-negative"):
            call()



# -------------------------------------------------- scan under another name
FAKE = "scan_alias"


class ScanAlias(Index):
    """``scan`` under the name FAKE: wrong (drops a match of the batch) when
    ``broken``, raising when ``boom``."""

    broken = False
    boom = False

    def __init__(self, algorithm=None, backend=None, **kwargs):
        self.fake = algorithm == FAKE
        super().__init__(algorithm="scan" if self.fake else algorithm, backend=backend, **kwargs)

    def add_many(self, *args, **kwargs):
        if self.fake and self.boom:
            raise RuntimeError("kernel exploded")
        return super().add_many(*args, **kwargs)

    def match_batch(self, events, *, output="list", errors="raise"):
        result = super().match_batch(events, output=output, errors=errors)
        if self.fake and self.broken and output == "arrow" and result.num_rows:
            result = result.slice(1)
        return result


@pytest.fixture
def scan_alias(registered, monkeypatch):
    registered(FAKE, SCAN_CPU)
    monkeypatch.setattr(bench_algorithms, "Index", ScanAlias)
    monkeypatch.setattr(ScanAlias, "broken", False)
    monkeypatch.setattr(ScanAlias, "boom", False)
    return ScanAlias


def test_scan_sample_and_ratio(workload, scan_alias):
    rows = bench.run_benchmark([workload], ["scan", FAKE], ["cpu"], scan_sample=50, **FAST)
    scan, alias = rows
    assert scan["n_events"] == 50 and alias["n_events"] == N_EVENTS
    assert scan["scan_sample"] == alias["scan_sample"] == 50
    assert scan["ratio_to_scan"] == 1.0 and scan["correct"] is True
    assert alias["correct"] is True and alias["note"] is None
    assert alias["scan_events_per_s"] == scan["events_per_s"]
    assert alias["ratio_to_scan"] == pytest.approx(alias["events_per_s"] / scan["events_per_s"])
    assert "first 'scan ev' events" in bench.format_table(rows)


def test_auto_scan_sample_size():
    assert bench.scan_sample_size(1000, 200) == 200
    assert bench.scan_sample_size(10 ** 6, 10_000) == measure.SCAN_SAMPLE_MIN
    assert bench.scan_sample_size(10 ** 5, 10_000) == measure.SCAN_SAMPLE_MAX
    assert bench.scan_sample_size(10 ** 6, 10_000, "all") == 10_000
    assert bench.scan_sample_size(10 ** 6, 10_000, 7) == 7


def test_wrong_answers_are_flagged(workload, scan_alias, tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(ScanAlias, "broken", True)
    rows = bench.run_benchmark([workload], ["scan", FAKE], ["cpu"], **FAST)
    alias = rows[1]
    assert alias["status"] == "ok" and alias["correct"] is False
    assert alias["note"].startswith("WRONG") and "1 matches missing" in alias["note"]
    assert "NO" in bench.format_table(rows)
    # the command line reports it and fails
    argv = ["--scale", "0.001", "--events", "50", "--repeats", "1", "--latency-samples", "5", "--quiet",
            "--algorithm", "scan", "--algorithm", FAKE]
    assert bench.main(argv) == 1
    captured = capsys.readouterr()
    assert "NO" in captured.out and "WRONG" in captured.err


def test_failing_algorithm_is_an_error_row(workload, scan_alias, monkeypatch):
    monkeypatch.setattr(ScanAlias, "boom", True)
    rows = bench.run_benchmark([workload], [FAKE, "scan"], ["cpu"], **FAST)
    assert rows[0]["status"] == "error" and "kernel exploded" in rows[0]["note"]
    assert rows[0]["events_per_s"] is None and rows[0]["correct"] is None
    assert rows[1]["status"] == "ok" and rows[1]["correct"] is True
    with pytest.raises(RuntimeError, match="kernel exploded"):
        bench.run_benchmark([workload], [FAKE], ["cpu"], strict=True, **FAST)


def test_unavailable_backend_is_skipped(workload, registered):
    registered("scan", SCAN_CPU)       # scan without its cuda matcher, whether or not this machine has a GPU
    rows = bench.run_benchmark([workload], ["scan"], ["cpu", "cuda"], **FAST)
    assert [r["backend"] for r in rows] == ["cpu", "cuda"]
    assert rows[0]["status"] == "ok" and rows[0]["correct"] is True
    assert rows[1]["status"] == "skipped" and "backend 'cuda'" in rows[1]["note"]


def test_a_variant_of_another_backends_option_is_skipped_there(workload):
    """``atree-persistent`` fixes a cuda option (``kernel``): on cpu its row
    is skipped with the reason -- not an error row that fails the run --
    and the cpu variants beside it run."""
    rows = bench.run_benchmark([workload], ["atree-persistent", "atree-perevent"], ["cpu"], **FAST)
    assert rows[0]["status"] == "skipped" and "fixes option(s) ['kernel']" in rows[0]["note"] \
        and "not 'cpu'" in rows[0]["note"]
    assert rows[1]["status"] == "ok" and rows[1]["correct"] is True


def test_what_runs_comes_from_the_registry(registered, tmp_path, capsys):
    """The algorithm choices, ``--algorithm all`` and the default are the
    registry's, read when asked: an algorithm registered at runtime is
    benchmarked (and checked against scan) like any other."""
    registered_now = registry.names()
    variants = [name for name, (base, _) in bench_algorithms.VARIANTS.items() if base in registered_now]
    assert bench_algorithms.names() == (*registered_now, *variants) and "opindex-bs" in variants
    assert bench.implemented_algorithms(["cpu"]) == list(registry.names("cpu"))
    with pytest.raises(SystemExit):
        bench.main(["--algorithm", "scan_again"])
    assert "invalid choice: 'scan_again'" in capsys.readouterr().err

    registered("scan_again", SCAN_CPU)
    assert "scan_again" in bench_algorithms.names()
    assert "scan_again" in bench.implemented_algorithms(["cpu"])
    assert "scan_again" not in bench.implemented_algorithms(["cuda"])
    csv_path = tmp_path / "all.csv"
    argv = ["--scale", "0.0005", "--events", "40", "--repeats", "1", "--latency-samples", "5", "--quiet",
            "--csv", str(csv_path)]
    assert bench.main([*argv, "--algorithm", "all"]) == 0
    _, rows = read_csv(csv_path)
    assert [r["algorithm"] for r in rows] == list(registry.names())
    assert all(r["status"] == "ok" and r["correct"] == "True" for r in rows), rows
    assert bench.main([*argv, "--algorithm", "scan_again", "--backend", "cuda", "--backend", "cuda",
                       "--workload", "W1", "--workload", "W1"]) == 0        # (repeats gave duplicate rows)
    _, rows = read_csv(csv_path)
    assert [(r["algorithm"], r["backend"], r["status"]) for r in rows] == [("scan_again", "cuda", "skipped")]
    assert "it runs on cpu" in rows[0]["note"]


# ------------------------------------------------------------------ sweeps
def test_sweep_rows_csv_and_plot(tmp_path):
    rows = bench.sweep("N", ["200", "400"], generator="opindex",
                       base_params={"d": 60, "Γmax": 4, "m": 12, "σ": 20}, algorithms=["scan"],
                       events_limit=100, **FAST)
    assert [(r["sweep_param"], r["sweep_value"]) for r in rows] == [("n_subs", 200), ("n_subs", 400)]
    assert [r["n_subscriptions"] for r in rows] == [200, 400]
    assert all(r["status"] == "ok" and r["correct"] is True and r["n_events"] == 100 for r in rows)
    assert rows[1]["index_bytes"] > rows[0]["index_bytes"]
    table = bench.format_table(rows)
    assert "n_subs" in table.splitlines()[0]
    bench.write_csv(rows, tmp_path / "sweep.csv")
    columns, written = read_csv(tmp_path / "sweep.csv")
    assert tuple(columns) == bench.COLUMNS
    assert [r["sweep_value"] for r in written] == ["200", "400"]
    bench.plot(rows, tmp_path / "sweep.png")
    assert_png(tmp_path / "sweep.png")


def test_sweep_categorical_values_on_the_command_line(tmp_path, capsys):
    png = tmp_path / "zipf.png"
    argv = ["--sweep", "zipf", "--values", "none,1", "--generator", "begen", "--param", "N=300",
            "--param", "dims=60", "--events", "60", "--repeats", "1", "--latency-samples", "5",
            "--algorithm", "scan", "--plot", str(png), "--quiet"]
    assert bench.main(argv) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split()[1] == "zipf"
    assert lines[2].split()[2] == "None"
    assert_png(png)


def test_sweep_aliases():
    assert bench.resolve_sweep_param("opindex", "Γmax") == "gamma_max"
    assert bench.resolve_sweep_param("opindex", "θ") == "theta"
    assert bench.resolve_sweep_param("opindex", "sigma") == "cardinality"
    assert bench.resolve_sweep_param("begen", "θ") == "eq_share"
    assert bench.coerce_value("opindex", "n_subs", "1e3") == 1000
    assert bench.coerce_value("opindex", "zipf", "None") is None
    with pytest.raises(ValueError, match="no parameter"):
        bench.resolve_sweep_param("opindex", "bogus")


def test_plot_without_results(tmp_path):
    rows = [measure.empty_row(workload="w", algorithm="toy", backend="cpu", status="skipped", note="n/a")]
    bench.plot(rows, tmp_path / "empty.png")
    assert_png(tmp_path / "empty.png")


def test_event_dicts_drop_nulls():
    import pyarrow as pa
    table = pa.table({"a": pa.array([1, None, 3]), "b": pa.array([None, None, None], pa.int64()),
                      "c": pa.array(["x", "y", None])})
    assert measure.event_dicts(table, 3) == [{"a": 1, "c": "x"}, {"c": "y"}, {"a": 3}]
    assert measure.event_dicts(table, 1) == [{"a": 1, "c": "x"}]


def test_ingest_mode_reports_parse_and_ingestion_rates(capsys):
    from engine.bench import ingest_rates, main

    workload = standard("W1", scale=0.0005, n_events=100)
    rates = ingest_rates(workload, n_texts=100, repeats=1)
    assert rates["n_texts"] == min(100, workload.n_subscriptions)
    assert rates["parse_per_s"] > 0 and rates["ingest_per_s"] > 0 and rates["add_texts_per_s"] > 0
    assert rates["add_texts_share_of_parse"] == pytest.approx(rates["add_texts_per_s"] / rates["parse_per_s"])
    assert rates["n_subscriptions"] == workload.n_subscriptions
    assert main(["--ingest", "--scale", "0.0005", "--repeats", "1"]) == 0
    out = capsys.readouterr().out
    assert "expressions/s" in out and "of the parse rate" in out


def test_opindex_bs_ablation_is_benchmarked_next_to_opindex():
    from engine.bench import run_benchmark
    from engine.workloads import opindex_gen

    workload = opindex_gen(300, 50, dims=50, cardinality=20, gamma_max=5, m=20, theta=0.4, zipf=None, seed=1)
    rows = run_benchmark([workload], ["opindex", "opindex-bs"], ["cpu"], repeats=1, latency_samples=5,
                         progress=False)
    by_name = {r["algorithm"]: r for r in rows}
    assert by_name["opindex-bs"]["status"] == "ok" and by_name["opindex-bs"]["correct"] is True
    assert by_name["opindex"]["matches_per_event"] == by_name["opindex-bs"]["matches_per_event"]


def test_update_costs_time_both_merge_paths():
    """``bench --updates``: removals and adds folded by a derived matcher and
    by a forced full rebuild (the function asserts which path each run took),
    the rebuild share restored afterwards."""
    from engine.algorithms.opindex import OpIndexMatcher
    from engine.bench import update_costs

    share = OpIndexMatcher.REBUILD_SHARE
    cost = update_costs(standard("W1", scale=0.003, n_events=5), n=20, repeats=1)
    assert cost["n"] == 20 and cost["n_subscriptions"] == 3000
    assert cost["incremental_s"] > 0 and cost["full_s"] > 0
    assert OpIndexMatcher.REBUILD_SHARE == share
    assert cost["same_answers"] is True


def test_updates_check_the_answers_after_them(capsys, monkeypatch):
    """``bench --updates`` ends by checking the updated index against scan on
    a sample of its subscriptions: an index that lost one (here: its
    matches dropped for one subscription) is reported WRONG, exit status 1."""
    from engine.bench.costs import sampled_answers_agree

    workload = standard("W1", scale=0.0005, n_events=100)
    index = Index(algorithm="opindex", backend="cpu")
    index.add_many(workload.subscriptions)
    events = workload.events.slice(0, 100)
    assert sampled_answers_agree(index, events, n_subs=500)
    lost = int(next(a[0] for a in index.match_batch(events) if len(a)))
    real = Index.match_batch

    def drop_one(self, batch, **kw):
        return [a[a != lost] for a in real(self, batch, **kw)] if self.algorithm != "scan" else real(self, batch, **kw)
    monkeypatch.setattr(Index, "match_batch", drop_one)
    assert not sampled_answers_agree(index, events, n_subs=500)
    monkeypatch.undo()
    monkeypatch.setattr("engine.bench.costs.sampled_answers_agree", lambda *a, **k: False)
    assert bench.main(["--updates", "10", "--algorithm", "betree", "--scale", "0.0005", "--repeats", "1",
                       "--quiet"]) == 1
    captured = capsys.readouterr()
    assert "same answers: False" in captured.out and "WRONG: after the updates" in captured.err


def test_load_costs_restore_the_saved_structure(capsys, monkeypatch):
    from engine.bench.costs import load_costs
    cost = load_costs(standard("W1", scale=0.001, n_events=100), repeats=1)
    assert cost["structure_restored"] and cost["same_answers"]
    assert cost["n_subscriptions"] == 1000 and cost["file_bytes"] > 0
    assert 0 < cost["load_s"] <= cost["load_first_match_s"]
    assert bench.main(["--load", "--workload", "W1", "--scale", "0.001", "--repeats", "1", "--quiet"]) == 0
    out = capsys.readouterr().out
    assert "W1 begen-uniform opindex/cpu (1,000 subscriptions)" in out
    assert "structure restored: True; same answers: True" in out
    # a bench variant, and options (it said "unknown algorithm 'opindex-bs'", and dropped --option)
    made = []
    real = bench_algorithms.new_index
    monkeypatch.setattr(bench_algorithms, "new_index", lambda name, backend, options=None: made.append(
        (name, options)) or real(name, backend, options))
    assert bench.main(["--load", "--workload", "W1", "--scale", "0.001", "--repeats", "1", "--quiet",
                       "--algorithm", "opindex-bs", "--algorithm", "betree", "--option", "betree.max_cap=5"]) == 0
    out = capsys.readouterr().out
    assert "opindex-bs/cpu (1,000 subscriptions)" in out and "betree/cpu (1,000" in out
    assert out.count("same answers: True") == 2
    assert ("betree", {"max_cap": 5}) in made and any(name == "opindex-bs" for name, _ in made)
    assert "x faster than the build" in out or "x slower than the build" in out


# ------------------------------------------- algorithm options (BE-Tree Table 4)
def test_max_cap_auto_follows_table_4_per_sweep_point(monkeypatch):
    """``betree.max_cap=auto``: each sweep point's index gets Table 4's
    capacity for its match_prob (5 below 1 %, 20 below 10 %, 160 beyond),
    the row says which, and the answers are still scan's."""
    made = []
    new_index = bench_algorithms.new_index
    monkeypatch.setattr(bench_algorithms, "new_index",
                        lambda name, backend, options=None: made.append((name, options)) or
                        new_index(name, backend, options))
    rows = bench.sweep("p", ["0.002", "0.05", "0.2"], generator="begen", base_params={"N": 400, "dims": 100},
                       algorithms=["scan", "betree"], events_limit=60,
                       algorithm_options={"betree": {"max_cap": "auto"}}, **FAST)
    betree = [r for r in rows if r["algorithm"] == "betree"]
    assert [r["options"] for r in betree] == ["max_cap=5", "max_cap=20", "max_cap=160"]
    assert all(r["status"] == "ok" and r["correct"] is True for r in rows), rows
    assert [r["options"] for r in rows if r["algorithm"] == "scan"] == [None] * 3
    assert {options["max_cap"] for name, options in made if name == "betree"} == {5, 20, 160}
    assert "max_cap=160" in bench.format_table(rows)


def test_fixed_option_on_the_command_line_and_auto_without_match_prob(tmp_path, capsys):
    from engine.workloads import opindex_gen

    csv_path = tmp_path / "opt.csv"
    argv = ["--scale", "0.0005", "--events", "40", "--repeats", "1", "--latency-samples", "5", "--quiet",
            "--algorithm", "scan", "--algorithm", "betree", "--option", "betree.max_cap=7", "--csv", str(csv_path)]
    assert bench.main(argv) == 0
    assert "max_cap=7" in capsys.readouterr().out
    _, rows = read_csv(csv_path)
    assert [(r["algorithm"], r["options"], r["correct"]) for r in rows] == [("scan", "", "True"),
                                                                          ("betree", "max_cap=7", "True")]
    workload = opindex_gen(200, 20, dims=50, cardinality=20, gamma_max=4, m=10, seed=1)
    rows = bench.run_benchmark([workload], ["scan", "betree"], algorithm_options={"betree": {"max_cap": "auto"}},
                               **FAST)
    assert rows[1]["status"] == "error" and "match_prob" in rows[1]["note"]


# ------------------------------------------------- one at a time (--updates)
def test_update_rates_one_at_a_time_through_the_api_and_the_tree(tmp_path, capsys):
    from engine.bench import update_rates

    workload = standard("W1", scale=0.001, n_events=5)
    rates = update_rates(workload, "betree", n=40, repeats=1)
    assert rates["n_subscriptions"] == 1000 == rates["n_units"]     # W1: one conjunction each
    for key in ("api_add_calls_per_s", "api_add_per_s", "api_remove_calls_per_s", "api_remove_per_s",
                "tree_insert_per_s", "tree_delete_per_s", "tree_reinsert_per_s", "tree_build_per_s",
                "plain_match_s", "new_string_match_s"):
        assert math.isfinite(rates[key]) and rates[key] > 0, key
    assert rates["api_add_per_s"] <= rates["api_add_calls_per_s"]
    assert "tree_insert_per_s" not in update_rates(workload, "opindex", n=20, repeats=1)

    csv_path = tmp_path / "updates.csv"
    assert bench.main(["--updates", "20", "--algorithm", "betree", "--option", "betree.max_cap=5", "--scale",
                       "0.0005", "--repeats", "1", "--quiet", "--csv", str(csv_path)]) == 0
    out = capsys.readouterr().out
    assert "betree (500 subscriptions), one at a time: Index.add" in out and "one unit per call" in out
    assert "the first match after an add with a new string" in out and "same answers: True" in out
    columns, rows = read_csv(csv_path)
    assert "tree_delete_per_s" in columns and [r["algorithm"] for r in rows] == ["betree"]


# ------------------------------------------------ A-PCM's ablations (variants)
#: the paper's ablations (Fig. 8), then A-PCM over OpIndex's lists
APCM_ABLATIONS = ("apcm-bitmap", "apcm-parallel", "apcm-c", "apcm-cu", "apcm-cupp", "apcm-cuppre")
APCM_VARIANTS = APCM_ABLATIONS + ("apcm-opindex", "apcm-opindex-pcm", "apcm-opindex-parallel")


@dataclass(frozen=True)
class FakeAPCMOptions(Options):
    """The options the A-PCM implementation exposes (engine.algorithms.options.APCMOptions)."""

    algorithm = "apcm"
    variant: str = option("apcm")
    reorder: bool = option(True)
    unroll: bool = option(True)
    parallel_paths: bool = option(True)
    batch_size: int = option(1024)
    cluster_size: int = option(8)
    threshold: int = option(2)
    adaptive: bool = option(True)
    over: str = option("betree", backends=("cpu",))
    max_cap: int = option(20)
    min_size: int = option(3)

    def __post_init__(self):
        if self.variant not in ("apcm", "pcm", "parallel", "bitmap"):
            raise ValueError(f"variant must be apcm, pcm, parallel or bitmap, not {self.variant!r}")
        if self.cluster_size < 1:
            raise ValueError(f"cluster_size must be >= 1, not {self.cluster_size!r}")


class FakeAPCMMatcher(ScanMatcher):
    """scan standing in for A-PCM, recording the options each build got."""

    name = "apcm"
    built: list = []

    @classmethod
    def construct(cls, segment, settings):
        cls.built.append(settings.options)
        return cls(segment, cls.backend)


def _swap_apcm(algorithm):
    """Put ``algorithm`` (None: nothing) under the name apcm; what was there before."""
    before = registry.get("apcm") if "apcm" in registry.names() else None
    registry.unregister("apcm")
    if algorithm is not None:
        registry.register(algorithm)
    return before


@pytest.fixture
def fake_apcm():
    """``apcm`` registered as scan with A-PCM's options, for one test (the
    real one, once there, is put back afterwards)."""
    FakeAPCMMatcher.built = []
    before = _swap_apcm(registry.Algorithm(name="apcm", title="A-PCM (test stand-in)", paper="(test)", sections="",
                                           implementations={"cpu": FakeAPCMMatcher}, options=FakeAPCMOptions))
    yield FakeAPCMMatcher
    _swap_apcm(before)


@pytest.fixture
def no_apcm():
    before = _swap_apcm(None)
    yield
    _swap_apcm(before)


def test_apcm_variants_exist_while_apcm_is_registered(no_apcm, capsys):
    assert not set(APCM_VARIANTS) & set(bench_algorithms.names())
    with pytest.raises(SystemExit):
        bench.main(["--algorithm", "apcm-cu"])
    assert "invalid choice: 'apcm-cu'" in capsys.readouterr().err
    before = _swap_apcm(registry.Algorithm(name="apcm", title="t", paper="(test)", sections="",
                                           implementations={"cpu": FakeAPCMMatcher}, options=FakeAPCMOptions))
    try:
        names = bench_algorithms.names()
        assert tuple(n for n in names if n.startswith("apcm-")) == APCM_VARIANTS
        assert names.index("apcm-bitmap") == names.index("opindex-bs") + 1      # in VARIANTS' order
        assert all(bench_algorithms.base_of(name) == "apcm" for name in APCM_VARIANTS)
        help_text = bench.build_parser().format_help()
        assert "apcm-cuppre" in help_text and "C-U-PP-RE" in help_text
    finally:
        _swap_apcm(before)


def test_variant_options_merge_with_the_algorithms_and_their_own(workload, fake_apcm):
    """What reaches each index: the algorithm's options but those the
    variant fixes, the variant's fixed ones, then the variant's own."""
    names = ["apcm", *APCM_ABLATIONS]
    rows = bench.run_benchmark([workload], names, ["cpu"], algorithm_options={
        "apcm": {"cluster_size": 4, "reorder": True}, "apcm-cu": {"threshold": 3}}, **FAST)
    assert [r["algorithm"] for r in rows] == names
    assert all(r["status"] == "ok" and r["correct"] is True for r in rows), rows
    # the options column: what the run passed beyond the variant's definition
    assert {r["algorithm"]: r["options"] for r in rows} == {
        "apcm": "cluster_size=4; reorder=True", "apcm-bitmap": "cluster_size=4; reorder=True",
        "apcm-parallel": "cluster_size=4; reorder=True", "apcm-c": "cluster_size=4",
        "apcm-cu": "cluster_size=4; threshold=3", "apcm-cupp": "cluster_size=4",
        "apcm-cuppre": "cluster_size=4; reorder=True"}
    built = {(o.variant, o.reorder, o.unroll, o.parallel_paths, o.threshold) for o in fake_apcm.built}
    assert {o.cluster_size for o in fake_apcm.built} == {4}
    assert built == {("apcm", True, True, True, 2),         # apcm
                     ("bitmap", True, True, True, 2),       # apcm-bitmap
                     ("parallel", True, True, True, 2),     # apcm-parallel
                     ("pcm", False, False, False, 2),       # apcm-c: reorder=True of apcm does not reach it
                     ("pcm", False, True, False, 3),        # apcm-cu, with its own threshold
                     ("pcm", False, True, True, 2),         # apcm-cupp
                     ("pcm", True, True, True, 2)}          # apcm-cuppre


def test_variant_options_on_the_command_line(tmp_path, fake_apcm, capsys):
    csv_path = tmp_path / "variants.csv"
    argv = ["--scale", "0.0005", "--events", "40", "--repeats", "1", "--latency-samples", "5", "--quiet",
            "--algorithm", "apcm-cu", "--algorithm", "apcm-bitmap", "--option", "apcm.cluster_size=16",
            "--option", "apcm-cu.reorder=true", "--csv", str(csv_path)]
    assert bench.main(argv) == 0
    _, rows = read_csv(csv_path)
    assert [(r["algorithm"], r["options"], r["correct"]) for r in rows] == [
        ("apcm-cu", "cluster_size=16; reorder=True", "True"), ("apcm-bitmap", "cluster_size=16", "True")]
    built = {(o.variant, o.reorder, o.parallel_paths, o.cluster_size) for o in fake_apcm.built}
    assert built == {("pcm", True, False, 16), ("bitmap", True, True, 16)}
    for bad in (["--option", "apcm.cluster_size=0", "--algorithm", "apcm-c"],     # checked for the variant too
                ["--option", "apcm-bitmap.variant=nope"],
                ["--sweep", "apcm.reorder", "--values", "true,false", "--algorithm", "apcm-cu"]):  # apcm-cu fixes it
        with pytest.raises(SystemExit) as exc:
            bench.main(bad)
        assert exc.value.code == 2
    assert "apcm-cu fixes reorder=False" in capsys.readouterr().err


# ------------------------------------------ sweeps over an algorithm option
def test_option_sweep_measures_every_value_on_one_workload(monkeypatch):
    made = []
    new_index = bench_algorithms.new_index
    monkeypatch.setattr(bench_algorithms, "new_index",
                        lambda name, backend, options=None: made.append((name, options)) or
                        new_index(name, backend, options))
    rows = bench.sweep("betree.max_cap", ["2", "5", "20"], generator="begen", base_params={"N": 400, "dims": 60},
                       events_limit=60, **FAST)
    assert [r["algorithm"] for r in rows] == ["betree"] * 3        # default: the option's algorithm alone
    assert [(r["sweep_param"], r["sweep_value"]) for r in rows] == [("betree.max_cap", v) for v in (2, 5, 20)]
    assert [r["options"] for r in rows] == ["max_cap=2", "max_cap=5", "max_cap=20"]
    assert {options["max_cap"] for name, options in made if name == "betree"} == {2, 5, 20}
    assert all(r["status"] == "ok" and r["correct"] is True for r in rows), rows
    # one workload for every value: the same subscriptions, events and answers
    assert len({r["workload"] for r in rows}) == 1 and rows[0]["workload"] == "begen N=400 dims=60"
    assert len({(r["n_subscriptions"], r["n_events"], r["matches_per_event"]) for r in rows}) == 1
    assert rows[0]["index_bytes"] > rows[-1]["index_bytes"]        # smaller leaves: more nodes
    assert bench.format_table(rows).splitlines()[0].split()[:2] == ["workload", "betree.max_cap"]


def test_option_sweep_with_a_similarity_series_on_the_command_line(tmp_path, capsys):
    """A-PCM Fig. 9's shape: an option on the x axis, one line per stream similarity."""
    csv_path, png_path = tmp_path / "fig9.csv", tmp_path / "fig9.png"
    argv = ["--generator", "begen", "--sweep", "betree.max_cap", "--values", "2,8", "--series",
            "similarity=0.2,0.9", "--param", "N=300", "--param", "dims=60", "--events", "60", "--repeats", "1",
            "--latency-samples", "5", "--quiet", "--csv", str(csv_path), "--plot", str(png_path)]
    assert bench.main(argv) == 0
    header = capsys.readouterr().out.splitlines()[0].split()
    assert header[:3] == ["workload", "betree.max_cap", "similarity"]
    columns, rows = read_csv(csv_path)
    assert tuple(columns) == bench.COLUMNS
    assert [(r["series_param"], r["series_value"], r["sweep_param"], r["sweep_value"]) for r in rows] == [
        ("similarity", s, "betree.max_cap", v) for s in ("0.2", "0.9") for v in ("2", "8")]
    assert [r["workload"] for r in rows] == ["begen similarity=0.2"] * 2 + ["begen similarity=0.9"] * 2
    assert all(r["status"] == "ok" and r["correct"] == "True" for r in rows)
    # a workload per series value: the option leaves the answers alone, the similarity does not
    assert rows[0]["matches_per_event"] == rows[1]["matches_per_event"]
    assert rows[2]["matches_per_event"] == rows[3]["matches_per_event"]
    assert rows[0]["matches_per_event"] != rows[2]["matches_per_event"]
    assert_png(png_path)


def test_generator_sweep_with_an_option_series():
    rows = bench.sweep("similarity", [0.3, 0.9], generator="begen", base_params={"N": 300, "dims": 60},
                       algorithms=["betree"], series=("betree.max_cap", ["3", "30"]), events_limit=50, **FAST)
    assert [(r["series_value"], r["sweep_value"], r["options"]) for r in rows] == [
        (3, 0.3, "max_cap=3"), (3, 0.9, "max_cap=3"), (30, 0.3, "max_cap=30"), (30, 0.9, "max_cap=30")]
    assert {r["series_param"] for r in rows} == {"betree.max_cap"}
    assert [r["workload"] for r in rows] == ["begen similarity=0.3", "begen similarity=0.9"] * 2
    assert all(r["correct"] is True for r in rows)


@pytest.mark.parametrize("argv", [["--sweep", "betree.nope", "--values", "1"],
                                  ["--sweep", "betree.max_cap", "--values", "0"],
                                  ["--sweep", "nope.max_cap", "--values", "1"],
                                  ["--sweep", "betree.max_cap", "--values", "5", "--algorithm", "scan"],
                                  ["--sweep", "betree.max_cap", "--values", "5", "--option", "betree.max_cap=3"],
                                  ["--sweep", "N", "--values", "100", "--series", "n_subs=200"],
                                  ["--sweep", "N", "--values", "100", "--series", "similarity"],
                                  ["--series", "similarity=0.1"]])
def test_option_sweep_usage_errors(argv, capsys):
    with pytest.raises(SystemExit) as exc:
        bench.main([*argv, "--generator", "begen", "--quiet"])
    assert exc.value.code == 2
    assert "usage:" in capsys.readouterr().err


# ------------------------------------------ latency against batch size (Fig. 12)
def test_simulate_by_hand():
    from engine.bench.latency import simulate

    ms = 1e-3
    alone = simulate(1 * ms, 1, 10 * ms, 100)                   # matched before the next event comes
    assert alone["mean"] == pytest.approx(1 * ms) and alone["queue"] == 0 and not alone["overloaded"]
    assert alone["utilization"] == pytest.approx(0.1)
    # batches of 4 every 4 ms, 2 ms each: waits of 3, 2, 1, 0 ms to fill, then 2 ms of matching
    batched = simulate(2 * ms, 4, 1 * ms, 8)
    assert batched["mean"] == pytest.approx(3.5 * ms) and batched["fill"] == pytest.approx(1.5 * ms)
    assert batched["queue"] == 0 and batched["utilization"] == pytest.approx(0.5) and batched["n_events"] == 8
    # batches of 2 every 2 ms taking 3 ms: ready at 1, 3, 5; finished at 4, 7, 10
    behind = simulate(3 * ms, 2, 1 * ms, 6)
    assert behind["mean"] == pytest.approx(4.5 * ms) and behind["queue"] == pytest.approx(1 * ms)
    assert behind["overloaded"] and behind["p99"] == pytest.approx(6 * ms, rel=0.01)
    # no gaps: batch k waits for the k before it
    assert simulate(2 * ms, 4, 0, 40)["mean"] == pytest.approx(2 * ms * (10 + 1) / 2)
    # an overloaded stream's average grows with its length, a stable one's does not
    assert simulate(3 * ms, 2, 1 * ms, 600)["mean"] > 10 * behind["mean"]
    assert simulate(2 * ms, 4, 1 * ms, 800)["mean"] == pytest.approx(batched["mean"])
    assert simulate(1 * ms, 4, 1 * ms, 10)["n_events"] == 8     # whole batches
    with pytest.raises(ValueError):
        simulate(1 * ms, 0, 1 * ms)


def test_latency_rows_from_measured_batch_times():
    from engine.bench import latency

    workload = standard("W6", scale=0.0005, n_events=120)
    sizes, delays = [1, 8, 32], [10.0, 1.0, 0.0]
    rows = latency.latency_sweep(workload, ["opindex", "betree"], ["cpu"], sizes, delays, simulated_events=256,
                                 repeats=2, min_events=32, time_budget=None, progress=False)
    assert len(rows) == 2 * len(sizes) * len(delays)
    assert [(r["algorithm"], r["batch_size"], r["arrival_delay_ms"]) for r in rows] == [
        (a, b, d) for a in ("opindex", "betree") for b in sizes for d in delays]
    for row in rows:
        b, d = row["batch_size"], row["arrival_delay_ms"]
        assert row["status"] == "ok" and row["correct"] is True, row
        assert row["checked_events"] > 0 and row["n_subscriptions"] == workload.n_subscriptions
        assert row["batches_timed"] == latency.timed_batches(b, 2, 32)
        assert row["batch_ms"] > 0 and row["batch_events_per_s"] == pytest.approx(b / (row["batch_ms"] / 1e3))
        assert row["fill_mean_ms"] == pytest.approx((b - 1) / 2 * d)
        assert row["latency_mean_ms"] >= row["batch_ms"]            # every event waits for its batch's matching
        assert row["overloaded"] == (row["utilization"] > 1)
        expected = latency.simulate(row["batch_ms"] / 1e3, b, d / 1e3, 256)
        assert row["latency_mean_ms"] == pytest.approx(expected["mean"] * 1e3)
        assert row["simulated_events"] == 256 // b * b
        if d == 0:
            assert row["overloaded"] and row["latency_mean_ms"] == pytest.approx(
                row["batch_ms"] * (256 // b + 1) / 2)
    # one measured time per algorithm and size, shared by its delays
    assert len({(r["algorithm"], r["batch_size"], r["batch_ms"]) for r in rows}) == 2 * len(sizes)
    text = latency.format_latency(rows)
    assert "discrete-event simulation of 256 events" in text
    assert "opindex@1" in text and "betree@32" in text
    # past the time budget, only `repeats` batches of each size are timed
    rows = latency.latency_sweep(workload, ["opindex"], ["cpu"], sizes, [1.0], repeats=2, min_events=32,
                                 time_budget=0, progress=False)
    assert [r["batches_timed"] for r in rows] == [2, 2, 2] and all(r["correct"] for r in rows)


def test_latency_batches_longer_than_the_stream_are_checked_and_say_they_repeat(monkeypatch):
    """A batch larger than the stream repeats its events: such batches were
    not checked at all, and the note blamed the scan sample."""
    from engine.bench import latency

    workload = standard("W6", scale=0.0005, n_events=10)
    rows = latency.time_batches(workload, ["opindex"], ["cpu"], [4, 25], repeats=1, min_events=4,
                                time_budget=None, progress=False)
    assert [(r.batch_size, r.correct) for r in rows] == [(4, True), (25, True)]
    assert rows[0].note is None and rows[1].note == "a batch of 25 repeats the stream's 10 events"
    assert rows[1].checked_events == 2 * 25         # the untimed batch and the timed one, every event
    # a wrong answer on a repeated event is found
    real = latency._reference
    monkeypatch.setattr(latency, "_reference",
                        lambda *args: [np.append(ids, -1) for ids in real(*args)])
    bad = latency.time_batches(workload, ["opindex"], ["cpu"], [25], repeats=1, min_events=4, time_budget=None,
                               progress=False)
    assert bad[0].correct is False and bad[0].note.startswith("WRONG")


def test_latency_on_the_command_line(tmp_path, capsys):
    from engine.bench.latency import LATENCY_COLUMNS

    csv_path, png_path = tmp_path / "latency.csv", tmp_path / "latency.png"
    argv = ["--arrival-delays", "5,0.5,0", "--batch-sizes", "16,1", "--scale", "0.0005", "--repeats", "2",
            "--algorithm", "opindex", "--simulated-events", "512", "--csv", str(csv_path), "--plot", str(png_path),
            "--quiet"]
    assert bench.main(argv) == 0
    out = capsys.readouterr().out
    assert out.startswith("W6 stream (500 subscriptions)")         # the default workload: A-PCM's stream
    assert "discrete-event simulation of 512 events" in out
    table = out.split("delay ms")[1].splitlines()
    assert table[0].split() == ["opindex@1", "opindex@16"]
    assert [line.split()[0] for line in table[2:5]] == ["5", "0.5", "0"]
    assert table[4].split()[1].endswith("*")                         # no gaps: overloaded
    columns, rows = read_csv(csv_path)
    assert tuple(columns) == LATENCY_COLUMNS
    assert [(r["batch_size"], r["arrival_delay_ms"]) for r in rows] == [
        (b, d) for b in ("1", "16") for d in ("5.0", "0.5", "0.0")]
    assert all(r["status"] == "ok" and r["correct"] == "True" for r in rows)
    # 1,024 events' worth of batches per size (fewer only if a slow machine spends the time budget first)
    timed = [int(r["batches_timed"]) for r in rows[::3]]
    assert all(2 <= t <= n for t, n in zip(timed, (1024, 64))), timed
    assert_png(png_path)


def test_latency_reports_failures(workload, scan_alias, monkeypatch, capsys):
    from engine.bench import latency

    monkeypatch.setattr(ScanAlias, "boom", True)
    rows = latency.latency_sweep(workload, [FAKE, "scan"], ["cpu"], [4], [1.0], repeats=1, min_events=4,
                                 progress=False)
    assert [(r["algorithm"], r["status"]) for r in rows] == [(FAKE, "error"), ("scan", "ok")]
    assert "kernel exploded" in rows[0]["note"] and rows[0]["latency_mean_ms"] is None
    assert "error (RuntimeError: kernel exploded)" in latency.format_latency(rows)
    argv = ["--arrival-delays", "1", "--batch-sizes", "4", "--scale", "0.001", "--events", "50", "--repeats", "1",
            "--algorithm", FAKE, "--quiet"]
    assert bench.main(argv) == 1
    assert "kernel exploded" in capsys.readouterr().err


@pytest.mark.parametrize("argv", [["--arrival-delays", "-1"],
                                  ["--arrival-delays", "x"],
                                  ["--arrival-delays", ""],
                                  ["--batch-sizes", "8"],
                                  ["--simulated-events", "100"],
                                  ["--arrival-delays", "1", "--batch-sizes", "0"],
                                  ["--arrival-delays", "1", "--sweep", "N", "--values", "100"],
                                  ["--arrival-delays", "1", "--ingest"]])
def test_latency_usage_errors(argv, capsys):
    with pytest.raises(SystemExit) as exc:
        bench.main([*argv, "--quiet"])
    assert exc.value.code == 2
    assert "usage:" in capsys.readouterr().err


# --------------------------------------------- the real A-PCM, once registered
needs_apcm = pytest.mark.skipif("apcm" not in registry.names(), reason="apcm is not registered")


@needs_apcm
def test_apcm_and_its_ablations_give_scans_answers():
    workload = standard("W6", scale=0.0005, n_events=60)
    rows = bench.run_benchmark([workload], ["apcm", *APCM_VARIANTS], ["cpu"], repeats=1, latency_samples=2,
                               algorithm_options={"apcm": {"cluster_size": 4}}, progress=False)
    assert [r["algorithm"] for r in rows] == ["apcm", *APCM_VARIANTS]
    assert all(r["status"] == "ok" and r["correct"] is True for r in rows), [r["note"] for r in rows]
    assert {r["options"] for r in rows} == {"cluster_size=4"}
    assert len({r["matches_per_event"] for r in rows}) == 1


@needs_apcm
def test_apcm_fig_9_and_fig_12_at_test_scale():
    from engine.bench import latency

    # cluster size 2 on a 90 %-similar stream: the OSR tree's overflow cascade outgrows its arrays
    rows = bench.sweep("apcm.cluster_size", ["2", "8"], generator="begen", base_params={"N": 300, "dims": 60},
                       series=("similarity", ["0.3", "0.9"]), events_limit=64, repeats=1, latency_samples=0,
                       progress=False)
    assert [(r["algorithm"], r["series_value"], r["sweep_value"], r["options"]) for r in rows] == [
        ("apcm", s, v, f"cluster_size={v}") for s in (0.3, 0.9) for v in (2, 8)]
    assert all(r["status"] == "ok" and r["correct"] is True for r in rows), [r["note"] for r in rows]

    workload = standard("W6", scale=0.0005, n_events=100)
    rows = latency.latency_sweep(workload, ["apcm-bitmap", "apcm"], ["cpu"], [1, 32], [1.0, 0.0], repeats=2,
                                 min_events=4, progress=False)
    assert [(r["algorithm"], r["batch_size"]) for r in rows[::2]] == [
        ("apcm-bitmap", 1), ("apcm-bitmap", 32), ("apcm", 1), ("apcm", 32)]
    assert all(r["status"] == "ok" and r["correct"] is True and r["latency_mean_ms"] > 0 for r in rows), rows


def test_rows_carry_the_spread_of_the_repeats_and_the_plot_draws_four_panels(tmp_path):
    rows = bench.run_benchmark([standard("W1", scale=0.0003, n_events=80)], ["scan", "opindex"], repeats=3,
                               latency_samples=10, progress=False)
    for row in rows:
        assert row["status"] == "ok"
        assert row["events_per_s_min"] <= row["events_per_s"] <= row["events_per_s_max"]
    fig = bench.plot(rows, tmp_path / "bars.png")
    assert [ax.get_title() for ax in fig.axes][:4] == [title for _, title, _, _ in report.PANELS]
    assert all(ax.get_yscale() == "linear" and ax.get_ylim()[0] == 0 for ax in fig.axes[:4])   # bars: linear, from 0
    assert_png(tmp_path / "bars.png")


def test_atree_ablations_are_bench_variants_and_abe_sweeps(tmp_path):
    # A-Tree Fig. 8-10's ablations by name; ABE-Gen as a sweep generator, a fan-out range from the command line
    names = bench_algorithms.names()
    assert {"atree-noshare", "atree-binary", "atree-plain", "atree-nozs", "atree-noopt"} <= set(names)
    assert bench_algorithms.fixed_options("atree-noopt") == {"zero_suppression": False, "on_demand": False}
    csv = tmp_path / "abe.csv"
    bench.main(["--generator", "abe", "--sweep", "fanout", "--values", "2..3,4..5", "--scale", "0.0002",
                "--events", "30", "--algorithm", "scan", "--algorithm", "atree-binary", "--repeats", "1",
                "--latency-samples", "0", "--quiet", "--csv", str(csv)])
    _, rows = read_csv(csv)
    assert [(r["sweep_value"], r["algorithm"]) for r in rows] == [
        ("(2, 3)", "scan"), ("(2, 3)", "atree-binary"), ("(4, 5)", "scan"), ("(4, 5)", "atree-binary")]
    assert all(r["status"] == "ok" and r["correct"] == "True" for r in rows)


@pytest.mark.parametrize("texts", [False, True])
def test_abe_workloads_are_built_from_their_asts_unless_texts_are_asked_for(texts, monkeypatch):
    # issue 15's build target is "from text-free columnar or AST input": ABE-Gen's ASTs by default
    added = []
    add_many = Index.add_many

    def recording(self, ids, expressions=None, **kwargs):
        added.append({type(e).__name__ for e in expressions})
        return add_many(self, ids, expressions, **kwargs)

    monkeypatch.setattr(Index, "add_many", recording)
    rows = measure.run_benchmark(["W5"], ["scan", "atree"], scale=0.0003, events_limit=40, repeats=1,
                                 latency_samples=0, progress=False, texts=texts)
    assert all(r["status"] == "ok" and r["correct"] for r in rows), rows
    assert rows[1]["matches_per_event"] > 0
    warm_ups, timed = added[0::2], added[1::2]      # each build is preceded by its untimed warm-up (texts)
    assert all(kinds == {"str"} for kinds in warm_ups)
    assert all(("str" in kinds) == texts and len(kinds) >= 1 for kinds in timed), added


def test_abe_workloads_are_built_from_connective_rows_when_columns_are_asked_for(monkeypatch):
    added = []
    add_many = Index.add_many

    def recording(self, ids, expressions=None, **kwargs):
        added.append(ids if expressions is None else None)
        return add_many(self, ids, expressions, **kwargs)

    monkeypatch.setattr(Index, "add_many", recording)
    rows = measure.run_benchmark(["W5"], ["scan", "atree"], scale=0.0003, events_limit=40, repeats=1,
                                 latency_samples=0, progress=False, columns=True)
    assert all(r["status"] == "ok" and r["correct"] for r in rows), rows
    assert rows[1]["matches_per_event"] > 0 and rows[0]["n_predicates"] == rows[1]["n_predicates"]
    assert len(added) == 4 and all(isinstance(table, pa.Table) for table in added)     # warm-ups and builds
    assert {"and", "or", "not"} <= set(pc.unique(added[1]["op"]).to_pylist())
    with pytest.raises(ValueError, match="two ways in"):
        measure.run_benchmark(["W5"], ["scan"], scale=0.0003, texts=True, columns=True, progress=False)


# ---------------------------------------- the command line's edges (helper-43's probe, D1-D6)
TINY = ["--scale", "0.0003", "--repeats", "1", "--quiet"]


def _tiny_parquet(tmp_path, name="w1", **kwargs):
    from engine.workloads import write_parquet
    workload = standard("W1", scale=0.0003, n_events=10, **kwargs)
    write_parquet(workload, tmp_path / name)
    return workload, str(tmp_path / name)


def test_the_modes_measure_the_parquet_workload(tmp_path, capsys):
    """D4: --ingest, --load and --updates measured a generated W1 (10,000
    subscriptions at the default scale), not the --parquet one."""
    workload, directory = _tiny_parquet(tmp_path)
    assert workload.n_subscriptions == 300
    argv = ["--parquet", directory, "--scale", "0.0005", "--repeats", "1", "--quiet"]     # (generated: 500)
    assert bench.main([*argv, "--ingest"]) == 0
    assert "(300 in " in capsys.readouterr().out
    assert bench.main([*argv, "--load"]) == 0
    assert "opindex/cpu (300 subscriptions)" in capsys.readouterr().out
    assert bench.main([*argv, "--updates", "5", "--algorithm", "betree"]) == 0
    assert "betree (300 subscriptions), one at a time" in capsys.readouterr().out
    with pytest.raises(SystemExit) as exc:      # more updates than the Parquet workload has subscriptions
        bench.main([*argv, "--updates", "301"])
    assert exc.value.code == 2 and "has 300 subscriptions" in capsys.readouterr().err


def test_a_parquet_workload_the_engine_refuses_gives_error_rows(tmp_path, capsys):
    """D5: an unknown operator, or an event column of the wrong type, raised
    a traceback from the fallback reference build of scan."""
    import pyarrow.parquet as pq

    workload, bad_op = _tiny_parquet(tmp_path, "bad_op")
    table = workload.subscriptions
    ops = table["op"].to_pylist()
    ops[0] = "~~"
    pq.write_table(table.set_column(table.schema.get_field_index("op"), "op", pa.array(ops)),
                   tmp_path / "bad_op" / "subscriptions.parquet")
    _, bad_type = _tiny_parquet(tmp_path, "bad_type")
    events = workload.events
    pq.write_table(events.set_column(0, events.column_names[0], pa.array(["x"] * events.num_rows)),
                   tmp_path / "bad_type" / "events.parquet")
    csv_path = tmp_path / "rows.csv"
    for directory, error in ((bad_op, "SchemaError"), (bad_type, "BadEventError")):
        assert bench.main(["--parquet", directory, "--algorithm", "scan", "--algorithm", "opindex", "--repeats", "1",
                           "--latency-samples", "2", "--quiet", "--csv", str(csv_path)]) == 1
        _, rows = read_csv(csv_path)
        assert [(r["algorithm"], r["status"]) for r in rows] == [("scan", "error"), ("opindex", "error")]
        assert error in rows[0]["note"] and rows[1]["note"].startswith("no answers to check against")
        assert rows[1]["events_per_s"] == ""          # nothing timed that could not be checked
        assert error in capsys.readouterr().err
    # the other modes: a line on standard error and exit status 1 too
    assert bench.main(["--parquet", bad_op, "--arrival-delays", "1", "--batch-sizes", "2", "--algorithm", "scan",
                       "--repeats", "1", "--quiet"]) == 1
    assert "no answers to check against" in capsys.readouterr().err
    assert bench.main(["--parquet", bad_op, "--load", "--repeats", "1", "--quiet"]) == 1
    assert "opindex/cpu: SchemaError" in capsys.readouterr().err


@pytest.mark.skipif(not (os.path.isdir("/proc/self") and os.path.exists("/dev/full")), reason="Linux's /proc, /dev")
def test_outputs_that_cannot_be_written(tmp_path, monkeypatch, capsys):
    """D1: --csv /proc/x.csv (no file can be made there) and /dev/full ended
    in tracebacks after the whole run."""
    for flag in ("--csv", "--plot"):
        monkeypatch.setattr(cli, "run_benchmark", lambda *a, **k: pytest.fail("ran before refusing the output"))
        with pytest.raises(SystemExit) as exc:
            bench.main([*TINY, "--algorithm", "scan", flag, "/proc/x.png"])
        assert exc.value.code == 2 and f"{flag} /proc/x.png: cannot be written" in capsys.readouterr().err
        monkeypatch.undo()
    argv = [*TINY, "--events", "5", "--latency-samples", "2", "--algorithm", "scan", "--csv", "/dev/full"]
    assert bench.main(argv) == 1
    captured = capsys.readouterr()
    assert "scan" in captured.out           # the table came before
    assert captured.err.strip() == "bexmatch bench: error: --csv /dev/full: cannot be written (No space left on device)"
    assert bench.main(["--updates", "5", "--algorithm", "betree", *TINY, "--csv", "/dev/full"]) == 1
    assert "--csv /dev/full: cannot be written" in capsys.readouterr().err
    # the probe leaves nothing behind, an existing file unchanged, and a symlink a symlink
    new, kept, link = tmp_path / "new.csv", tmp_path / "kept.csv", tmp_path / "link.csv"
    kept.write_text("x")
    link.symlink_to(tmp_path / "target.csv")
    assert cli._unwritable(str(new)) is None and not new.exists()
    assert cli._unwritable(str(kept)) is None and kept.read_text() == "x"
    assert cli._unwritable(str(link)) is None and link.is_symlink() and not (tmp_path / "target.csv").exists()


@pytest.mark.parametrize("argv", [["--scale", "1e9"],
                                  ["--scale", "0.0003", "--events", "1000000000000"],
                                  ["--sweep", "N", "--values", "1e12"],
                                  ["--sweep", "N", "--values", "100", "--events", "1000000000000"],
                                  ["--arrival-delays", "1", "--batch-sizes", "100000000000"],
                                  ["--updates", "5", "--scale", "1e9"]])
def test_sizes_beyond_memory_are_usage_errors(argv, capsys):
    """D2: NumPy's MemoryError traceback from inside the generators."""
    with pytest.raises(SystemExit) as exc:
        bench.main([*argv, "--algorithm", "scan" if "--updates" not in argv else "opindex", "--quiet"])
    assert exc.value.code == 2 and "GiB of memory; this machine has" in capsys.readouterr().err


def test_running_out_of_memory_is_one_line(monkeypatch, capsys):
    """D2: what the up-front estimate (a lower bound) lets through."""
    def exhausted(*args, **kwargs):
        raise MemoryError("Unable to allocate 7 PiB")
    monkeypatch.setattr(cli, "run_benchmark", exhausted)
    assert bench.main([*TINY, "--algorithm", "scan"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("bexmatch bench: error: out of memory") and len(err.strip().splitlines()) == 1


def _no_cuda(monkeypatch):
    """cuda absent on any machine, nothing run there: a variant of a cpu
    option is skipped for its own reason, anything else for the GPU's."""
    from engine.errors import BackendUnavailable
    real = bench_algorithms.matcher_class

    def matcher_class(name, backend):
        if backend == "cuda":
            raise BackendUnavailable(bench_algorithms.foreign_reason(name, backend) or "no cuda in this test")
        return real(name, backend)
    monkeypatch.setattr(bench_algorithms, "matcher_class", matcher_class)


@pytest.mark.parametrize("backends", [["cpu", "cuda"], ["cuda", "cpu"]])
def test_a_variant_of_one_backend_is_skipped_on_the_other_in_either_order(backends, fake_apcm, monkeypatch,
                                                                           tmp_path, capsys):
    """D3: a usage error with one order of --backend, a skipped row with the other."""
    _no_cuda(monkeypatch)
    csv_path = tmp_path / "rows.csv"
    argv = [*TINY, "--events", "5", "--latency-samples", "2", "--csv", str(csv_path),
            *(arg for backend in backends for arg in ("--backend", backend))]
    for variant, runs, skipped, reason in (("apcm-opindex", "cpu", "cuda", "fixes option(s) ['over']"),
                                           ("atree-persistent", "cuda", "cpu", "fixes option(s) ['kernel']")):
        assert bench.main([*argv, "--algorithm", "scan", "--algorithm", variant]) == 0
        _, rows = read_csv(csv_path)
        row = {r["backend"]: r for r in rows if r["algorithm"] == variant}
        assert row[skipped]["status"] == "skipped" and reason in row[skipped]["note"]
        if runs == "cpu":
            assert row["cpu"]["status"] == "ok" and row["cpu"]["correct"] == "True"
    # on none of the backends given: a usage error naming the variant, not --option
    with pytest.raises(SystemExit) as exc:
        bench.main([*TINY, "--algorithm", "atree-persistent"])
    err = capsys.readouterr().err
    assert exc.value.code == 2 and "--algorithm atree-persistent: variant 'atree-persistent'" in err
    assert "--option" not in err.splitlines()[-1]


@pytest.mark.parametrize("argv, flag", [(["--updates", "5", "--plot", "/tmp/never.png"], "--plot"),
                                        (["--ingest", "--plot", "/tmp/never.png"], "--plot"),
                                        (["--load", "--plot", "/tmp/never.png"], "--plot"),
                                        (["--ingest", "--algorithm", "betree"], "--algorithm"),
                                        (["--ingest", "--option", "betree.max_cap=3"], "--option"),
                                        (["--updates", "5", "--events", "5"], "--events"),
                                        (["--load", "--latency-samples", "3"], "--latency-samples"),
                                        (["--ingest", "--scan-sample", "7"], "--scan-sample"),
                                        (["--load", "--texts"], "--texts"),
                                        (["--updates", "5", "--columns"], "--columns"),
                                        (["--updates", "5", "--backend", "cuda"], "--backend"),
                                        (["--arrival-delays", "1", "--batch-sizes", "2", "--latency-samples", "3"],
                                         "--latency-samples"),
                                        (["--generator", "begen", "--algorithm", "scan"], "--generator"),
                                        (["--sweep", "N", "--values", "100", "--param", "N=300",
                                          "--algorithm", "scan"], "N=300")])
def test_flags_a_mode_would_drop_are_usage_errors(argv, flag, capsys):
    """D6: accepted, then silently dropped."""
    with pytest.raises(SystemExit) as exc:
        bench.main([*argv, *TINY])
    err = capsys.readouterr().err
    assert exc.value.code == 2 and flag in err.splitlines()[-1]


def test_load_with_wrong_answers_fails(monkeypatch, capsys):
    """D6: --load printed "same answers: False" and exited 0."""
    real = cli.load_costs
    monkeypatch.setattr(cli, "load_costs", lambda *args, **kwargs: {**real(*args, **kwargs), "same_answers": False})
    assert bench.main(["--load", *TINY]) == 1
    captured = capsys.readouterr()
    assert "same answers: False" in captured.out and "WRONG" in captured.err
