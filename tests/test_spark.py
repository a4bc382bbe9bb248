"""spark_integration against a real local Spark (the session fixture
``spark`` of conftest.py: local[2,2]).  Every test compares with the
in-process engine.Index on the same events."""

from __future__ import annotations

import json
import logging
import os
import re
import zipfile

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from engine import Index
from engine.errors import IndexFileError

pytestmark = pytest.mark.spark

NUMERIC = [f"a{i}" for i in range(6)]
COLORS = ["black", "blue", "green", "red"]


# ------------------------------------------------------------------ workloads

def _predicate(rng) -> str:
    kind = rng.integers(10)
    if kind < 6:
        a = NUMERIC[rng.integers(len(NUMERIC))]
        v = int(rng.integers(10))
        choice = rng.integers(9)
        if choice < 6:
            return f"{a} {['=', '!=', '<', '<=', '>', '>='][choice]} {v}"
        if choice == 6:
            return f"{a} {'NOT ' if rng.random() < 0.3 else ''}IN ({v}, {(v + 3) % 10}, {(v + 5) % 10})"
        if choice == 7:
            return f"{a} BETWEEN {min(v, 5)} AND {max(v, 5)}"
        return f"{a} IS {'NOT ' if rng.random() < 0.5 else ''}NULL"
    if kind < 9:
        c = COLORS[rng.integers(len(COLORS))]
        return [f"color = '{c}'", f"color != '{c}'", f"color < '{c}'", "color LIKE 'b%'",
                f"color IN ('{c}', 'red')"][rng.integers(5)]
    return f"flag = {'TRUE' if rng.random() < 0.5 else 'FALSE'}"


def _expression(rng) -> str:
    conj = " AND ".join(_predicate(rng) for _ in range(rng.integers(1, 4)))
    if rng.random() < 0.3:
        conj = f"({conj}) OR ({' AND '.join(_predicate(rng) for _ in range(rng.integers(1, 3)))})"
    if rng.random() < 0.1:
        conj = f"NOT ({conj})"
    return conj


def random_workload(seed: int = 0, n_subs: int = 300, n_events: int = 400):
    """(index, events Table with event_id) -- every attribute is absent
    (null) in about 30 % of the events, plus a column no subscription uses."""
    rng = np.random.default_rng(seed)
    index = Index()
    index.add_many([int(i) for i in rng.choice(10 ** 9, n_subs, replace=False)],
                   [_expression(rng) for _ in range(n_subs)])
    cols = {"event_id": pa.array(rng.choice(10 ** 12, n_events, replace=False), pa.int64())}
    for a in NUMERIC:
        cols[a] = pa.array(rng.integers(10, size=n_events), pa.int64(), mask=rng.random(n_events) < 0.3)
    cols["color"] = pa.array(rng.choice(COLORS, n_events).tolist(), pa.string(), mask=rng.random(n_events) < 0.3)
    cols["flag"] = pa.array(rng.random(n_events) < 0.5, pa.bool_(), mask=rng.random(n_events) < 0.3)
    cols["payload"] = pa.array([f"p{i}" for i in range(n_events)])
    return index, pa.table(cols)


def expected_pairs(index: Index, events: pa.Table, event_id: str = "event_id") -> set:
    result = index.match_batch(events.drop_columns([event_id]), output="arrow")
    ids = events[event_id].to_numpy()
    return set(zip(ids[result["event"].to_numpy()].tolist(), result["sub_id"].to_pylist()))


def collected(df, event_id: str = "event_id") -> list:
    return [(row[event_id], row["sub_id"]) for row in df.collect()]


def to_spark(spark, table: pa.Table, partitions: int = 2):
    return spark.createDataFrame(table).repartition(partitions)


@pytest.fixture(scope="module")
def workload():
    return random_workload()


# ------------------------------------------------------------------ modes

def test_replicate_and_shard_equal_in_process(spark, workload):
    from spark_integration import MatchStats, match_events

    index, events = workload
    expected = expected_pairs(index, events)
    assert len(expected) > 500
    df = to_spark(spark, events)

    stats = MatchStats(spark)
    pairs = collected(match_events(df, index, stats=stats))
    assert len(pairs) == len(set(pairs)) and set(pairs) == expected
    # shipped once, loaded once per Python worker that ran a task
    assert set(stats.loads_per_index.values()) == {1}
    assert 1 <= stats.loads <= 3 and stats.events == events.num_rows

    stats = MatchStats(spark)
    pairs = collected(match_events(df, index, mode="shard", shards=3, stats=stats))
    assert len(pairs) == len(set(pairs)) and set(pairs) == expected
    assert len({digest for (_h, _p, digest) in stats.loads_per_index}) == 3
    assert stats.events == 3 * events.num_rows      # every event reached every shard


def test_grouped_output_and_batch_size(spark, workload):
    from spark_integration import MatchStats, match_events

    index, events = workload
    expected = {}
    for event, sub in expected_pairs(index, events):
        expected.setdefault(event, []).append(sub)
    df = to_spark(spark, events)
    stats = MatchStats(spark)
    try:
        rows = match_events(df, index, output="grouped", arrow_batch_size=50, stats=stats).collect()
    finally:
        spark.conf.unset("spark.sql.execution.arrow.maxRecordsPerBatch")
    assert len(rows) == events.num_rows        # one row per event, matched or not
    got = {row["event_id"]: row["sub_ids"] for row in rows}
    for event in events["event_id"].to_pylist():
        assert got[event] == sorted(expected.get(event, []))
    assert stats.batches >= events.num_rows // 50

    rows = match_events(df, index, mode="shard", shards=2, output="grouped").collect()
    assert {row["event_id"]: row["sub_ids"] for row in rows} == got


def test_map_layout_and_gpu_fallback(spark, workload):
    """attrs map<string, long>; backend='cuda' on a machine without a usable
    cuda backend falls back to cpu when asked to."""
    from engine import available_backends
    from spark_integration import MatchStats, match_events

    index, events = workload
    n = events.num_rows
    keys, items, offsets = [], [], [0]
    for row in range(n):
        for a in NUMERIC:
            value = events[a][row].as_py()
            if value is not None:
                keys.append(a)
                items.append(value)
        keys.append("unused_attribute")
        items.append(1)
        offsets.append(len(keys))
    attrs = pa.MapArray.from_arrays(pa.array(offsets, pa.int32()), pa.array(keys), pa.array(items, pa.int64()))
    table = pa.table({"event_id": events["event_id"], "attrs": attrs})
    numeric_only = events.select(["event_id"] + NUMERIC)
    expected = expected_pairs(index, numeric_only)

    stats = MatchStats(spark)
    pairs = collected(match_events(to_spark(spark, table), index, backend="cuda", gpu_fallback=True,
                                   stats=stats))
    assert set(pairs) == expected and len(pairs) == len(expected)
    if "cuda" not in available_backends():
        assert stats.backends == {"cpu": stats.loads} and stats.fallbacks == stats.loads >= 1


# ------------------------------------------------------------------ faults

def test_corrupt_or_missing_index_fails_on_the_driver(spark, workload, tmp_path, capsys):
    from spark_integration import match_events

    index, events = workload
    df = spark.createDataFrame(events.slice(0, 10))
    good = tmp_path / "index.bexidx"
    index.save(good)
    data = good.read_bytes()
    corrupt = tmp_path / "corrupt.bexidx"
    corrupt.write_bytes(data[: len(data) // 2])
    with pytest.raises(IndexFileError, match="corrupt.bexidx"):
        match_events(df, str(corrupt))
    with pytest.raises(FileNotFoundError, match="missing.bexidx"):
        match_events(df, str(tmp_path / "missing.bexidx"))
    # an array whose checksum does not match
    tampered = tmp_path / "tampered.bexidx"
    with zipfile.ZipFile(good) as src, zipfile.ZipFile(tampered, "w") as dst:
        for item in src.infolist():
            blob = src.read(item)
            if item.filename == "sub_ids.npy":
                blob = blob[:-8] + bytes(8)
            dst.writestr(item, blob)
    with pytest.raises(IndexFileError):
        match_events(df, str(tampered))

    from spark_integration.job import main

    out = tmp_path / "out"
    events_path = tmp_path / "events.parquet"
    pq.write_table(events, events_path)
    assert main(["--subs", str(corrupt), "--events", str(events_path), "--out", str(out)]) == 2
    assert not out.exists()
    error = capsys.readouterr().err
    assert "corrupt.bexidx" in error and "bexmatch index" in error


def _bad_events(events: pa.Table) -> tuple[pa.Table, set]:
    """Event 7 has a NaN (a0 as double), event 11 an integer beyond 2**53."""
    a0 = events["a0"].cast(pa.float64()).to_numpy(zero_copy_only=False).copy()
    a1 = events["a1"].to_pylist()
    ids = events["event_id"].to_pylist()
    a0[7] = np.nan
    a1[11] = 2 ** 60
    table = events.set_column(events.schema.get_field_index("a0"), "a0", pa.array(a0, mask=np.isnan(a0) & (
        np.arange(len(a0)) != 7)))
    table = table.set_column(table.schema.get_field_index("a1"), "a1", pa.array(a1, pa.int64()))
    return table, {ids[7], ids[11]}


def _quarantined(result) -> tuple[list, dict]:
    """(matched pairs, {event id: error} of the quarantined events) of one
    ``on_bad_event="quarantine"`` run, computed once."""
    result.combined.persist()
    try:
        return collected(result.matches), {row["event_id"]: row["error"] for row in result.quarantine.collect()}
    finally:
        result.combined.unpersist()


def test_bad_event_fails_naming_its_id(spark, workload):
    from spark_integration import match_events

    index, events = workload
    table, bad = _bad_events(events.slice(0, 40))
    with pytest.raises(Exception) as info:
        match_events(to_spark(spark, table, 1), index).collect()
    message = str(info.value)
    assert "BadEventError" in message
    assert any(f"event_id={b}" in message for b in bad)


def test_bad_events_quarantined(spark, workload):
    from spark_integration import MatchResult, match_events

    index, events = workload
    table, bad = _bad_events(events.slice(0, 60))
    result = match_events(to_spark(spark, table, 2), index, on_bad_event="quarantine")
    assert isinstance(result, MatchResult)
    pairs, refused = _quarantined(result)
    good = table.filter(pa.array(~np.isin(table["event_id"].to_numpy(), list(bad))))
    assert set(pairs) == expected_pairs(index, good) and len(pairs) == len(set(pairs))
    assert set(refused) == bad
    assert all("numeric" in error for error in refused.values())


def test_quarantined_rows_carry_the_attribute_and_reason_of_the_engines_error(spark, workload):
    """The quarantine is ``(event_id, attribute, error)``: the attribute and
    the reason of the engine's BadEventError, taken from its fields; the
    same in shard mode with grouped output (the shards' rows merged)."""
    from spark_integration import match_events

    index, events = workload
    table, _ = _bad_events(events.slice(0, 40))
    ids = table["event_id"].to_pylist()
    want = {ids[7]: ("a0", "attribute 'a0' is numeric, got nan: not a finite number"),
            ids[11]: ("a1", f"attribute 'a1' is numeric, got {2 ** 60}: beyond ±2**53, where float64 cannot tell "
                            f"integers apart")}
    good = table.filter(pa.array([row not in (7, 11) for row in range(40)]))
    for kwargs in ({}, {"mode": "shard", "shards": 2, "output": "grouped"}):
        result = match_events(to_spark(spark, table, 2), index, on_bad_event="quarantine", **kwargs)
        result.combined.persist()
        try:
            assert result.quarantine.columns == ["event_id", "attribute", "error"]
            rows = result.quarantine.collect()
            matched = result.matches.collect()
        finally:
            result.combined.unpersist()
        assert {row["event_id"]: (row["attribute"], row["error"]) for row in rows} == want and len(rows) == 2
        if kwargs:
            pairs = {(row["event_id"], s) for row in matched for s in row["sub_ids"]}
            assert len(matched) == 38 and pairs == expected_pairs(index, good)
        else:
            assert set(collected(result.matches)) == expected_pairs(index, good)


def test_a_refused_event_sharing_its_id_keeps_the_other_events_matches_and_odd_id_columns(spark):
    """Shard mode, grouped output, quarantine: a good event whose id a refused one also has (or both without
    id) keeps its matches -- the refused rows are set apart before the shards' rows are merged, which used to
    send the merged row to the quarantine. An id column named with a dot works in every mode; one named as an
    output column is a clear ValueError up front (it was a JVM stack trace)."""
    from spark_integration import match_events

    index = Index()
    index.add_many([1, 2, 3, 4], ["a = 5", "a IS NULL", "a >= 3", "a < 100"])
    table = pa.table({"event_id": pa.array([7, 7, 8, None, None], pa.int64()),
                      "a": pa.array([5.0, float("nan"), 1.0, 3.0, float("inf")])})
    result = match_events(to_spark(spark, table, 2), index, mode="shard", shards=2, output="grouped",
                          on_bad_event="quarantine")
    assert sorted((row["event_id"] or 0, row["sub_ids"]) for row in result.matches.collect()) == \
        [(0, [3, 4]), (7, [1, 3, 4]), (8, [4])]
    assert sorted((row["event_id"] or 0, row["attribute"]) for row in result.quarantine.collect()) == \
        [(0, "a"), (7, "a")]
    dotted = to_spark(spark, pa.table({"my.id": [1, 2], "a": [5, 1]}), 2)
    for kwargs in ({"mode": "shard", "shards": 2, "output": "grouped"}, {"on_bad_event": "quarantine"},
                   {"mode": "shard", "shards": 2, "output": "grouped", "on_bad_event": "quarantine"}):
        found = match_events(dotted, index, event_id="my.id", **kwargs)
        rows = (found.matches if kwargs.get("on_bad_event") else found).collect()
        got = sorted((row["my.id"], tuple(row["sub_ids"]) if "sub_ids" in row else row["sub_id"]) for row in rows)
        assert got == ([(1, (1, 3, 4)), (2, (4,))] if kwargs.get("output") else [(1, 1), (1, 3), (1, 4), (2, 4)])
    for name, kwargs in (("sub_id", {}), ("sub_ids", {"output": "grouped"}), ("error", {"on_bad_event": "quarantine"})):
        events = to_spark(spark, pa.table({name: [1, 2], "a": [5, 1]}), 1)
        with pytest.raises(ValueError, match=f"the event id column '{name}' has the name of an output column"):
            match_events(events, index, event_id=name, **kwargs)


def test_bad_events_in_the_map_layout_are_quarantined(spark, workload):
    """The map layout reaches the engine as a map column (no wide table in
    between) and its bad values are still named by event id: event 7's a0
    is NaN, event 11's a1 infinite, in a map<string, double>."""
    from spark_integration import match_events

    index, events = workload
    events = events.slice(0, 60)
    ids = events["event_id"].to_pylist()
    numeric = {a: events[a].to_pylist() for a in NUMERIC}
    numeric["a0"][7], numeric["a1"][11] = float("nan"), float("inf")
    maps = [[(a, float(numeric[a][row])) for a in NUMERIC if numeric[a][row] is not None] for row in range(60)]
    table = pa.table({"event_id": events["event_id"], "attrs": pa.array(maps, pa.map_(pa.string(), pa.float64()))})
    result = match_events(to_spark(spark, table, 2), index, on_bad_event="quarantine")
    pairs, refused = _quarantined(result)
    assert set(refused) == {ids[7], ids[11]}
    assert "'a0' is numeric, got nan" in refused[ids[7]] and "'a1' is numeric, got inf" in refused[ids[11]]
    good = events.select(["event_id"] + NUMERIC).filter(pa.array([row not in (7, 11) for row in range(60)]))
    assert set(pairs) == expected_pairs(index, good) and len(pairs) == len(set(pairs))


# ------------------------------------------------------------------ streaming

def test_streaming_restart_neither_loses_nor_duplicates(spark, workload, tmp_path):
    from spark_integration import start_stream

    index, events = workload
    source, out, checkpoint = tmp_path / "in", tmp_path / "out", tmp_path / "checkpoint"
    source.mkdir()
    parts = [events.slice(i * 150, 150) for i in range(3)]

    def run():
        query = start_stream(spark, str(source), index, str(out), str(checkpoint), max_files_per_trigger=1)
        query.awaitTermination(timeout=120)
        assert query.exception() is None
        return query

    pq.write_table(parts[0], source / "part-0.parquet")
    pq.write_table(parts[1], source / "part-1.parquet")
    query = run()
    assert query.lastProgress is not None
    first = spark.read.parquet(str(out)).count()
    assert first == len(expected_pairs(index, pa.concat_tables(parts[:2])))

    # new files, and a crash after the sink committed the last batch but
    # before the checkpoint did: the restarted query replays that batch
    pq.write_table(parts[2], source / "part-2.parquet")
    last = max(int(p.name) for p in (checkpoint / "commits").iterdir() if p.name.isdigit())
    for name in (str(last), f".{last}.crc"):
        if (checkpoint / "commits" / name).exists():
            os.remove(checkpoint / "commits" / name)
    run()
    table = spark.read.parquet(str(out)).collect()
    pairs = [(row["event_id"], row["sub_id"]) for row in table]
    assert len(pairs) == len(set(pairs))
    assert set(pairs) == expected_pairs(index, pa.concat_tables(parts))


# ------------------------------------------------------------------ the job

def test_job_with_paths_shard_mode_and_retries(spark, workload, tmp_path, capsys):
    """The job from saved index + events Parquet, in shard mode, with the
    first attempt of every task failing after it emitted output: the
    retried tasks write every match exactly once."""
    from spark_integration.job import main

    index, events = workload
    saved = tmp_path / "index.bexidx"
    index.save(saved)
    events_path = tmp_path / "events.parquet"
    pq.write_table(events, events_path)
    out = tmp_path / "matches.parquet"
    status = main(["--subs", str(saved), "--events", str(events_path), "--out", str(out), "--mode", "shard",
                   "--shards", "2", "--inject-failure"])
    printed = capsys.readouterr().out
    assert status == 0, printed
    table = pq.read_table(out)
    pairs = list(zip(table["event_id"].to_pylist(), table["sub_id"].to_pylist()))
    expected = expected_pairs(index, events)
    assert len(pairs) == len(set(pairs)) == len(expected) and set(pairs) == expected
    assert f"{len(expected):,}" in printed and "shard" in printed


def test_job_generates_a_workload(spark, tmp_path, capsys):
    pytest.importorskip("engine.workloads")
    from engine import workloads
    from spark_integration.job import main

    out = tmp_path / "out" / "matches.parquet"
    argv = ["--scale", "0.0005", "--data-dir", str(tmp_path / "data"), "--out", str(out)]
    assert main(argv) == 0
    printed = capsys.readouterr().out
    for word in ("subscriptions", "events", "matches", "events/s", "generate", "build index", "ship",
                 "match+write"):
        assert word in printed
    (cache,) = (tmp_path / "data").iterdir()
    workload = workloads.read_parquet(cache)
    index = Index()
    index.add_many(workload.subscriptions)
    expected = expected_pairs(index, workload.events)
    table = pq.read_table(out)
    assert set(zip(table["event_id"].to_pylist(), table["sub_id"].to_pylist())) == expected
    assert table.num_rows == len(expected)
    # a second generation reuses the cached workload
    from spark_integration.job import generate_workload
    *_, cached, n_events = generate_workload("W1", 0.0005, 500, 0, str(tmp_path / "data"))
    assert cached and n_events == 500


def test_streaming_foreach_batch_quarantine_is_idempotent(spark, workload, tmp_path):
    """sink='foreachBatch': matches and refused events per batch id; a
    replayed batch overwrites its own output (shard mode, 2 shards)."""
    from spark_integration import start_stream

    index, events = workload
    table, bad = _bad_events(events.slice(0, 80))
    source, out, refused_out, checkpoint = (tmp_path / n for n in ("in", "out", "refused", "checkpoint"))
    source.mkdir()
    pq.write_table(table, source / "part-0.parquet")

    def run():
        query = start_stream(spark, str(source), index, str(out), str(checkpoint), sink="foreachBatch",
                             quarantine_path=str(refused_out), on_bad_event="quarantine", mode="shard", shards=2)
        query.awaitTermination(timeout=120)
        assert query.exception() is None

    run()
    for name in ("0", ".0.crc"):         # crash before the checkpoint commit: batch 0 is replayed
        if (checkpoint / "commits" / name).exists():
            os.remove(checkpoint / "commits" / name)
    run()
    matches = pq.read_table(out)
    pairs = list(zip(matches["event_id"].to_pylist(), matches["sub_id"].to_pylist()))
    good = table.filter(pa.array(~np.isin(table["event_id"].to_numpy(), list(bad))))
    assert len(pairs) == len(set(pairs)) and set(pairs) == expected_pairs(index, good)
    refused = pq.read_table(refused_out)
    assert sorted(refused["event_id"].to_pylist()) == sorted(bad)


def test_a_json_stream_never_makes_an_unreadable_record_an_event_without_attributes(spark, tmp_path):
    """Spark reads JSON permissively: a line it cannot read, or a value of
    another type than the schema's, became an event with every attribute
    absent (its id too), which matched ``x IS NULL`` and lost its real
    matches -- quarantined nothing, failed nothing."""
    from spark_integration import start_stream

    index = Index(algorithm="opindex")
    index.add_many([1, 2], ["x > 5", "x IS NULL"])
    source = tmp_path / "in"
    source.mkdir()
    (source / "part-0.json").write_text('{"event_id": 0, "x": 6}\n{"event_id": 1, "x": 7.5}\n'
                                        '{"event_id": 2, "x": 9\n{"event_id": 3}\n')
    # quarantined: the two records Spark could not read, by their text; the others matched
    out, refused_out = tmp_path / "out", tmp_path / "refused"
    query = start_stream(spark, str(source), index, str(out), str(tmp_path / "checkpoint"), source_format="json",
                         schema="event_id long, x long", sink="foreachBatch", on_bad_event="quarantine",
                         quarantine_path=str(refused_out))
    query.awaitTermination(timeout=120)
    assert query.exception() is None
    matches = pq.read_table(out)
    assert sorted(zip(matches["event_id"].to_pylist(), matches["sub_id"].to_pylist())) == [(0, 1), (3, 2)]
    refused = pq.read_table(refused_out)
    errors = sorted(refused["error"].to_pylist())
    assert len(errors) == 2 and all("Spark could not read it" in error for error in errors)
    assert '"x": 7.5' in errors[0] and '"x": 9' in errors[1]
    # failing: the query stops at the first such record
    query = start_stream(spark, str(source), index, str(tmp_path / "out2"), str(tmp_path / "checkpoint2"),
                         source_format="json", schema="event_id long, x long")
    from pyspark.errors import StreamingQueryException
    with pytest.raises(StreamingQueryException) as failed:
        query.awaitTermination(timeout=120)
    assert "STREAM_FAILED" in str(failed.value)
    assert not list((tmp_path / "out2").glob("*.parquet"))        # nothing matched from the file


@pytest.mark.parametrize("algorithm", ["opindex", "betree"])
def test_strings_users_send_match_exactly_through_spark(spark, algorithm):
    """Long URLs and UUIDs sharing prefixes, non-ASCII and NUL go through
    Spark's Arrow batches to the engine and match exactly as the reference
    evaluator says (the string bug of issue 10 lived in the dictionary
    search every path shares)."""
    from engine.parse import parse
    from engine.reference import matches
    from spark_integration import match_events

    urls = [f"https://example.com/{p}" for p in ("a", "b", "a/b", "a/b/c?x=1", "")]
    uuids = [f"123e4567-e89b-12d3-a456-4266141740{i:02d}" for i in range(5)]
    odd = ["a\x00b", "a\x00c", "\x00", "é", "日本", "😀", ""]
    texts = [f"url = '{u}'" for u in urls] + [f"url > '{urls[0]}'", f"url LIKE '{urls[2]}%'"] \
        + [f"user IN ('{uuids[i]}', '{uuids[i + 1]}')" for i in range(4)] + [f"s = '{v}'" for v in odd] \
        + [f"s >= '{odd[0]}' AND s < '{odd[1]}'", "s > 'z'"]
    index = Index(algorithm=algorithm, backend="cpu")
    index.add_many(range(len(texts)), texts)
    rng = np.random.default_rng(3)
    n = 300
    events = pa.table({
        "event_id": pa.array(np.arange(n), pa.int64()),
        "url": pa.array([urls[i % 5] + ("/" if i % 7 == 0 else "") for i in range(n)], mask=rng.random(n) < 0.2),
        "user": pa.array([uuids[i % 5] for i in range(n)], mask=rng.random(n) < 0.2),
        "s": pa.array([odd[i % len(odd)] + ("\x00" if i % 11 == 0 else "") for i in range(n)]),
    })
    nodes = [parse(t) for t in texts]
    expected = {(e["event_id"], sub) for e in events.to_pylist() for sub, node in enumerate(nodes)
                if matches(node, {k: v for k, v in e.items() if v is not None})}
    assert len(expected) > n
    assert set(collected(match_events(to_spark(spark, events), index))) == expected


def test_job_takes_text_subscriptions_and_json_lines_events(spark, tmp_path, capsys):
    """`bexmatch run --subs` takes `bexmatch match`'s text form and `--events`
    JSON Lines: the same pairs as `bexmatch match` on the same files; an
    events file that is neither fails with one line naming the fix."""
    from engine.cli import main as cli_main
    from spark_integration.job import main

    subs = tmp_path / "subs.txt"
    subs.write_text("1\tprice <= 580 AND color = 'silver'\n2\tprice > 600 OR color LIKE 'g%'\n3\tbrand IS NULL\n")
    events = tmp_path / "events.jsonl"
    rows = [{"event_id": 10 + i, "price": p, "color": c} for i, (p, c) in
            enumerate([(550, "silver"), (700, None), (None, "gold"), (1, "x")])]
    events.write_text("".join(json.dumps({k: v for k, v in r.items() if v is not None}) + "\n" for r in rows))
    out = tmp_path / "matches.parquet"
    status = main(["--subs", str(subs), "--events", str(events), "--out", str(out)])
    printed = capsys.readouterr()
    assert status == 0, printed
    # each stage says so on stderr as it starts and as it ends, before the summary on stdout
    progress = [line for line in printed.err.splitlines() if line.startswith("bexmatch run: ")]
    for stage in ("building the index", "starting Spark", "shipping the index", "matching the events"):
        assert [line for line in progress if stage in line and line.endswith(" ...")], (stage, progress)
        assert [line for line in progress if stage in line and " done in " in line], (stage, progress)
    assert main(["--subs", str(subs), "--events", str(events), "--out", str(out), "--quiet"]) == 0
    assert "bexmatch run: " not in capsys.readouterr().err
    table = pq.read_table(out)
    got = sorted(zip(table["event_id"].to_pylist(), table["sub_id"].to_pylist()))
    assert cli_main(["match", "--subs", str(subs), "--events", str(events), "--id-field", "event_id",
                     "--quiet"]) == 0
    want = sorted((line["event_id"], line["sub_id"]) for line in map(json.loads, capsys.readouterr().out.splitlines()))
    assert got == want and (10, 1) in got and (11, 2) in got
    bad = tmp_path / "events.csv"
    bad.write_text("price\n1\n")
    assert main(["--subs", str(subs), "--events", str(bad), "--out", str(tmp_path / "o2.parquet")]) != 0
    assert "JSON Lines events need a name ending in .json" in capsys.readouterr().err


def test_json_lines_the_job_cannot_read_as_written(spark, tmp_path, capsys):
    """A line that is no JSON object became an event with no attributes and a
    null id, matched by every ``IS NULL`` subscription (exit 0): refused now.
    A column mixing numbers and strings is read by Spark as strings: the job
    says so.  The grouped summary counts the events of the input, not the
    grouped rows (refused events left out)."""
    from spark_integration.job import main

    subs = tmp_path / "subs.txt"
    subs.write_text("1\tx >= 1\n2\tx IS NULL\n")
    corrupt = tmp_path / "corrupt.jsonl"
    corrupt.write_text('{"event_id": 1, "x": 1}\n{"event_id": 2, "x":\n{"event_id": 3, "x": 2}\n')
    assert main(["--subs", str(subs), "--events", str(corrupt), "--out", str(tmp_path / "o1.parquet"),
                 "--quiet"]) == 2
    assert "holds lines that are not JSON objects" in capsys.readouterr().err
    mixed = tmp_path / "mixed.jsonl"
    mixed.write_text('{"event_id": 1, "x": 1}\n{"event_id": 2, "x": "7"}\n{"event_id": 3}\n')
    out = tmp_path / "o2.parquet"
    assert main(["--subs", str(subs), "--events", str(mixed), "--out", str(out), "--on-bad-event", "quarantine",
                 "--output", "grouped", "--quiet"]) == 0
    printed = capsys.readouterr()
    assert "Spark's JSON reader made column(s) 'x' strings" in printed.err
    assert re.search(r"events\s+3\n", printed.out), printed.out
    # a lone surrogate's escape: Spark's reader made it '?', which matched s = '?'; an escaped backslash before
    # "ud800" and a whole pair are no lone surrogate
    subs.write_text("1\ts = '?'\n2\ts IS NOT NULL\n")
    fine = tmp_path / "fine.jsonl"
    fine.write_text('{"event_id": 1, "s": "\\\\ud800"}\n{"event_id": 2, "s": "\\ud83d\\ude00"}\n')
    out = tmp_path / "o3.parquet"
    assert main(["--subs", str(subs), "--events", str(fine), "--out", str(out), "--quiet"]) == 0
    table = pq.read_table(out)
    assert sorted(zip(table["event_id"].to_pylist(), table["sub_id"].to_pylist())) == [(1, 2), (2, 2)]
    lone = tmp_path / "lone.jsonl"
    lone.write_text(fine.read_text() + '{"event_id": 3, "s": "\\ud800"}\n')
    assert main(["--subs", str(subs), "--events", str(lone), "--out", str(tmp_path / "o4.parquet"), "--quiet"]) == 2
    assert "is not valid Unicode (a lone surrogate)" in capsys.readouterr().err
    # an integer beyond 2**53 in a column holding a fraction elsewhere: Spark read it as 9007199254740992.0,
    # which matched x = 2**53 (`bexmatch match` refuses the line); 2**53 itself, and digits in a string, are fine
    subs.write_text("1\tx = 9007199254740992\n2\tx > 1\n3\ts = '90071992547409930'\n")
    exact = tmp_path / "exact.jsonl"
    exact.write_text('{"event_id": 1, "x": 9007199254740992, "s": "90071992547409930"}\n'
                     '{"event_id": 2, "x": 1.5}\n')
    out = tmp_path / "o5.parquet"
    assert main(["--subs", str(subs), "--events", str(exact), "--out", str(out), "--quiet"]) == 0
    table = pq.read_table(out)
    assert sorted(zip(table["event_id"].to_pylist(), table["sub_id"].to_pylist())) == [(1, 1), (1, 2), (1, 3),
                                                                                         (2, 2)]
    rounded = tmp_path / "rounded.jsonl"
    rounded.write_text(exact.read_text() + '{"event_id": 3, "x": 9007199254740993}\n')
    assert main(["--subs", str(subs), "--events", str(rounded), "--out", str(tmp_path / "o6.parquet"),
                 "--quiet"]) == 2
    assert "the integer 9007199254740993 in the line" in capsys.readouterr().err


def test_dotted_column_names_reach_the_engine(spark, caplog):
    """mapInArrow resolved each column by its name unquoted: a column named
    like a dotted attribute ("a.b", which the language allows) failed with
    Spark's AnalysisException."""
    from spark_integration import match_events

    index = Index(algorithm="opindex", backend="cpu")
    index.add_many([1, 2], ['"a.b" = 5', '"a.b" IS NULL AND c = 1'])
    frame = spark.createDataFrame([(1, 5, None), (2, None, 1), (3, 4, 1)], "`e.id` long, `a.b` long, c long")
    rows = match_events(frame, index, event_id="e.id").collect()
    assert sorted((r["e.id"], r["sub_id"]) for r in rows) == [(1, 1), (2, 2)]
    # an attribute the subscriptions read that is the id column: left out of matching, and said so
    with_id = Index(algorithm="opindex", backend="cpu")
    with_id.add_many([1, 2], ['"e.id" IS NULL', "c = 1"])
    with caplog.at_level(logging.WARNING, logger="spark_integration.matching"):
        rows = match_events(frame, with_id, event_id="e.id").collect()
    assert sorted((r["e.id"], r["sub_id"]) for r in rows) == [(1, 1), (2, 1), (2, 2), (3, 1), (3, 2)]
    assert "subscriptions read the attribute 'e.id', which is the events' id column" in caplog.text
    joined = frame.join(spark.createDataFrame([(1, 2)], "`e.id` long, c long"), "e.id", "left")
    with pytest.raises(ValueError, match="more than one column named 'c'"):
        match_events(joined, index, event_id="e.id")
