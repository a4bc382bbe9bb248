"""The caller's event ids through matching (``id_column=``): a key of the
dicts, a column of an Arrow table or batch or of a DataFrame, a
DataFrame's index -- left out of matching, naming the events of
``output="arrow"`` and ``match_stream``; ``bexmatch match --id-field`` for
JSON Lines and Parquet."""

from __future__ import annotations

import json

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from engine import Index
from engine.events import NotAnEventError
from engine.cli import main

SUBS = ["price < 600", "color = 'red'", "id IS NULL"]     # an attribute named like the id: never matched
EVENTS = [{"eid": "e-1", "price": 5, "id": 1}, {"eid": "e-2", "color": "red", "price": 1}, {"eid": "e-3"}]
#: (pyarrow's from_pylist infers the columns from the first row alone)
SCHEMA = pa.schema([("eid", pa.string()), ("price", pa.int64()), ("id", pa.int64()), ("color", pa.string())])


@pytest.fixture
def idx():
    index = Index()
    index.add_many([1, 2, 3], SUBS)
    return index


def expected(ids):
    pairs = [(ids[0], 1), (ids[1], 1), (ids[1], 2), (ids[1], 3), (ids[2], 3)]
    return {"eid": [p[0] for p in pairs], "sub_id": [p[1] for p in pairs]}


def test_every_event_form_keeps_its_ids(idx):
    table = pa.Table.from_pylist(EVENTS, schema=SCHEMA)
    frame = pd.DataFrame(EVENTS)
    forms = {"dicts": EVENTS, "table": table, "batch": table.to_batches()[0], "frame": frame,
             "index": frame.set_index("eid")}
    for name, events in forms.items():
        got = idx.match_batch(events, output="arrow", id_column="eid")
        assert got.column_names == ["eid", "sub_id"] and got.schema.field("eid").type == pa.string(), name
        assert got.to_pydict() == expected(["e-1", "e-2", "e-3"]), name
        # the id is not an attribute: list output matches the events without it
        assert [m.tolist() for m in idx.match_batch(events, id_column="eid")] == [[1], [1, 2, 3], [3]], name
    # integer ids keep their type; match_stream names its batches' events by them too
    ints = pa.table({"eid": pa.array([10, 20, 30], pa.int32()), "price": [5.0, 1.0, None],
                     "color": [None, "red", None]})
    got = idx.match_batch(ints, output="arrow", id_column="eid")
    assert got.schema.field("eid").type == pa.int32() and got["eid"].to_pylist() == [10, 10, 20, 20, 20, 30]
    streamed = pa.Table.from_batches(list(idx.match_stream(ints, id_column="eid", max_pairs=2)))
    assert streamed.to_pydict() == got.to_pydict()


def test_id_column_errors(idx):
    with pytest.raises(KeyError, match="event 2 has no such key"):
        idx.match_batch(EVENTS[:2] + [{"price": 1}], output="arrow", id_column="eid")
    with pytest.raises(KeyError, match="no such column"):
        idx.match_batch(pa.Table.from_pylist(EVENTS, schema=SCHEMA), output="arrow", id_column="nope")
    with pytest.raises(KeyError, match="nor an index of that name"):
        idx.match_batch(pd.DataFrame(EVENTS), output="arrow", id_column="nope")
    with pytest.raises(ValueError, match="output='device' keeps event positions"):
        Index(backend="cpu").match_batch(EVENTS, output="device", id_column="eid")
    with pytest.raises(TypeError, match="id_column is a column name"):
        idx.match_batch(EVENTS, output="arrow", id_column=0)
    # ids that make no one Arrow column: a ValueError naming the column, not pyarrow's error
    for ids in ([1, 2 ** 64], [1, "x"], [1, [2]]):
        with pytest.raises(ValueError, match="id_column 'eid': the events' ids do not make one Arrow column"):
            idx.match_batch([{**e, "eid": i} for e, i in zip(EVENTS, ids)], output="arrow", id_column="eid")
    # bad events reported with their positions, the others named by their ids
    found, rejected = idx.match_batch(EVENTS + [{"eid": "e-4", "price": "cheap"}], output="arrow",
                                      id_column="eid", errors="report")
    assert [bad.event for bad in rejected] == [3] and "e-4" not in found["eid"].to_pylist()
    # an event that is no dict has no id: it is that event's error, as without id_column
    found, rejected = idx.match_batch(EVENTS + ["oops"], output="arrow", id_column="eid", errors="report")
    assert [(bad.event, type(bad).__name__) for bad in rejected] == [(3, "NotAnEventError")]
    assert found.to_pydict() == expected(["e-1", "e-2", "e-3"])
    with pytest.raises(NotAnEventError, match="^event 3: not a mapping"):
        idx.match_batch(EVENTS + ["oops"], output="arrow", id_column="eid")


def test_cli_id_field(tmp_path, capsys):
    subs = tmp_path / "subs.txt"
    subs.write_text("".join(f"{i}\t{text}\n" for i, text in zip([1, 2, 3], SUBS)))
    events = tmp_path / "events.jsonl"
    events.write_text("".join(json.dumps(e) + "\n" for e in EVENTS))
    assert main(["match", "--subs", str(subs), "--events", str(events), "--id-field", "eid", "--quiet"]) == 0
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert lines == [{"eid": e, "sub_id": s} for e, s in zip(*expected(["e-1", "e-2", "e-3"]).values())]
    parquet_events = tmp_path / "events.parquet"
    pq.write_table(pa.Table.from_pylist(EVENTS, schema=SCHEMA), parquet_events)
    out = tmp_path / "out.parquet"
    assert main(["match", "--subs", str(subs), "--events", str(parquet_events), "--id-field", "eid",
                 "--out", str(out), "--quiet"]) == 0
    assert pq.read_table(out).to_pydict() == expected(["e-1", "e-2", "e-3"])
    assert main(["match", "--subs", str(subs), "--events", str(events), "--id-field", "nope", "--quiet"]) == 2
    assert f"{events}:1: --id-field nope: the event has no such key" in capsys.readouterr().err
    # the line of the event without it, past blank lines and the first batch (it named "event 0 ... in batch
    # from event 2")
    gaps = tmp_path / "gaps.jsonl"
    gaps.write_text('{"eid": 1, "price": 6}\n\n{"eid": 2}\n\n{"price": 7}\n')
    assert main(["match", "--subs", str(subs), "--events", str(gaps), "--id-field", "eid", "--batch-size", "2",
                 "--quiet"]) == 2
    assert capsys.readouterr().err.endswith(f"{gaps}:5: --id-field eid: the event has no such key\n")


def test_cli_id_field_of_any_type_or_changing_type(tmp_path, capsys):
    """Ids with no JSON form are written as their text; ids whose type
    changes between Parquet batches are one line on stderr, exit 2 (not a
    traceback), and an id that a batch lacks is null."""
    import datetime
    subs = tmp_path / "subs.txt"
    subs.write_text("1\tprice > 0\n")
    stamps = tmp_path / "stamps.parquet"
    pq.write_table(pa.table({"ts": [datetime.datetime(2026, 1, 2)], "price": [1.0]}), stamps)
    assert main(["match", "--subs", str(subs), "--events", str(stamps), "--id-field", "ts", "--quiet"]) == 0
    assert json.loads(capsys.readouterr().out) == {"ts": "2026-01-02 00:00:00", "sub_id": 1}
    mixed = tmp_path / "mixed.jsonl"
    mixed.write_text('{"eid": 1, "price": 1}\n{"eid": null, "price": 1}\n{"eid": "5", "price": 1}\n')
    out = tmp_path / "out.parquet"
    assert main(["match", "--subs", str(subs), "--events", str(mixed), "--id-field", "eid", "--batch-size", "1",
                 "--out", str(out), "--quiet"]) == 2
    assert "--id-field 'eid': the ids of one batch are string, an earlier batch's int64" in capsys.readouterr().err
    assert not out.exists()
    mixed.write_text('{"eid": 1, "price": 1}\n{"eid": null, "price": 1}\n')
    assert main(["match", "--subs", str(subs), "--events", str(mixed), "--id-field", "eid", "--batch-size", "1",
                 "--out", str(out), "--quiet"]) == 0
    assert pq.read_table(out).to_pydict() == {"eid": [1, None], "sub_id": [1, 1]}
    # the first batches' ids all null: the ids' type is the first typed batch's (it was null, and then the
    # typed batch was refused as changing the type); null ids only: int64, as with no batch
    mixed.write_text('{"eid": null, "price": 1}\n{"eid": null, "price": 2}\n{"eid": "e3", "price": 1}\n')
    assert main(["match", "--subs", str(subs), "--events", str(mixed), "--id-field", "eid", "--batch-size", "1",
                 "--out", str(out), "--quiet"]) == 0
    written = pq.read_table(out)
    assert written.schema.field("eid").type == pa.string()
    assert written.to_pydict() == {"eid": [None, None, "e3"], "sub_id": [1, 1, 1]}
    mixed.write_text('{"eid": null, "price": 1}\n')
    assert main(["match", "--subs", str(subs), "--events", str(mixed), "--id-field", "eid", "--batch-size", "1",
                 "--out", str(out), "--quiet"]) == 0
    written = pq.read_table(out)
    assert written.schema.field("eid").type == pa.int64() and written.to_pydict() == {"eid": [None], "sub_id": [1]}
