"""spark_integration.bench.overhead at a tiny scale, on the session's local
Spark (conftest.py's ``spark`` fixture): the Spark result equals the
in-process one, each Python worker loads the index exactly once whatever the
number of runs, and the report has every field."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest

from spark_integration.bench import overhead, ship


def test_wide_to_map_round_trips_through_the_map_layout():
    """The benchmark's map form of the events is what the engine reads as
    the wide table: the same encoded batch (no Spark needed)."""
    from engine import workloads
    from engine import events as event_batches
    from engine.schema import Schema

    events = workloads.standard("W1", scale=0.001, n_events=200).events
    column = overhead.wide_to_map(events)
    assert len(column) == events.num_rows
    schema = Schema()
    for name in events.column_names:
        schema.declare(name, "numeric")
    wide = event_batches.encode_events(events, schema)
    mapped = event_batches.encode_events(pa.table({"attrs": column}), schema)
    for field in ("offsets", "attr", "value"):
        assert np.array_equal(getattr(wide, field), getattr(mapped, field)), field


@pytest.mark.parametrize("module", [overhead, ship])
def test_help_names_the_module_to_run(module, capsys):
    with pytest.raises(SystemExit) as exc:
        module.main(["--help"])
    assert exc.value.code == 0
    assert f"usage: python -m {module.__name__}" in capsys.readouterr().out


def test_pairs_helper_sorts_lexicographically():
    e, s = overhead._pairs(np.array([2, 1, 2, 1]), np.array([5, 9, 3, 4]))
    assert e.tolist() == [1, 1, 2, 2] and s.tolist() == [4, 9, 3, 5]


@pytest.mark.spark
def test_overhead_bench_tiny(spark):
    result = overhead.run(spark, workload="W1", scale=0.001, n_events=300, repeats=2, layout="map",
                                profile=True)

    assert set(result) == set(overhead.FIELDS)
    # None only: Spark's default Arrow batch size, and the wide layout's conversion (not measured here)
    assert [k for k in overhead.FIELDS if result[k] is None] == ["arrow_batch_size", "to_wide_s"]

    # the workload and both sides agree
    assert result["subscriptions"] == 1_000 and result["events"] == 300
    assert result["matches"] > 0
    assert result["verified"] is True and result["verified_pairs"] == result["matches"]
    assert list(result["spark_layouts"]) == ["map"] and result["layout"] == "map"
    figures = result["spark_layouts"]["map"]
    assert figures["verified"] is True and figures["verified_pairs"] == result["matches"]
    assert len(figures["runs"]) == 2 and figures["spark_s"] > 0 and figures["ratio"] > 0

    # shipped once, loaded exactly once per Python worker despite a warm-up, 2 timed runs and the profile's runs
    assert result["shipments"] == 1 and result["executors"] == 1
    assert result["loads"] >= 1
    assert set(result["loads_per_worker"].values()) == {1}
    assert result["loads_per_worker_index"] == [1]
    assert sum(result["loads_per_executor"].values()) == result["loads"] == len(result["loads_per_worker"])

    # timings and machine facts
    assert len(result["in_process_runs"]) == 2 and result["in_process_s"] > 0
    assert result["ratio"] == pytest.approx(result["spark_s"] / result["in_process_s"])
    assert result["spark_s"] == result["spark_layouts"]["map"]["spark_s"]
    assert result["within_target"] == (result["ratio"] <= result["target_ratio"])
    assert result["partitions"] == spark.sparkContext.defaultParallelism
    machine = result["machine"]
    assert machine["nproc"] >= 1 and machine["cpu_model"] and machine["date"]
    assert set(result["profile"]) == {"map", "empty job"}
    assert set(result["profile"]["map"]) == {"input only", "match, no output", "match_events() call",
                                             "full match_events"}

    report = overhead.format_report(result, "python -m spark_integration.bench.overhead --scale 0.001")
    assert "ratio spark (map) / in-process" in report and "loads per worker" in report
    assert "profile (spark medians" in report


@pytest.mark.spark
def test_overhead_bench_wide_grouped_noop_restores_the_batch_size(spark):
    key = overhead.ARROW_BATCH_CONF
    before = spark.conf.get(key, None)
    result = overhead.run(spark, scale=0.001, n_events=150, repeats=1, layout="wide", output="grouped",
                                action="noop", arrow_batch_size=40)
    assert spark.conf.get(key, None) == before
    assert [k for k in overhead.FIELDS if result[k] is None] == ["to_map_s", "profile"]
    assert result["verified"] is True and result["verified_pairs"] == result["matches"] > 0
    assert list(result["spark_layouts"]) == ["wide"] and result["layout"] == "wide"
    assert set(result["loads_per_worker"].values()) <= {1}      # the index may already be loaded: no new load
    assert result["loads_per_worker_index"] in ([], [1])
    assert result["spark_batches"] >= 2 * (150 // 40)           # batches of at most 40 events, warm-up + 1 run
    assert f"spark {spark.sparkContext.master} wide grouped+noop" in overhead.format_report(result)


@pytest.mark.spark
def test_overhead_bench_sends_a_map_workload_as_it_is(spark):
    """W3's events are one map column already: the map layout sends it as
    it is (both sides agree), and the wide layout is refused before any work."""
    result = overhead.run(spark, workload="W3", scale=0.001, n_events=200, repeats=1, layout="map")
    assert result["verified"] is True and result["verified_pairs"] == result["matches"] > 0
    assert list(result["spark_layouts"]) == ["map"]
    with pytest.raises(ValueError, match="come as one map column: use layout='map'"):
        overhead.run(spark, workload="W3", scale=0.0005, n_events=60, repeats=1, layout="wide")


@pytest.mark.parametrize("module,argv", [
    (overhead, ["--scale", "0"]), (overhead, ["--scale", "nan"]), (overhead, ["--events", "0"]),
    (overhead, ["--repeats", "0"]), (overhead, ["--partitions", "-1"]), (overhead, ["--partitions", str(2 ** 31)]),
    (overhead, ["--arrow-batch-size", "0"]), (overhead, ["--seed", "-3"]), (ship, ["--scale", "-1"]),
    (ship, ["--reps", "0"])])
def test_bench_flags_are_checked_before_spark_starts(module, argv, capsys, monkeypatch):
    """A size, count or seed out of range is argparse's error naming the
    flag (exit status 2), before any Spark or workload work."""
    monkeypatch.setattr(module, "run", lambda *a, **k: pytest.fail("ran"), raising=False)
    with pytest.raises(SystemExit) as exc:
        module.main(argv)
    assert exc.value.code == 2
    assert argv[0] in capsys.readouterr().err
