"""``bexmatch match``: text and Parquet subscriptions, JSON Lines and
Parquet events and output, clear errors, help for every command."""

from __future__ import annotations

import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from engine import Index
from engine.cli import main

SUBS = "1\tprice <= 580 AND color = 'silver'\n2\tprice > 600 OR color LIKE 'g%'\n\n# a comment\n3\tbrand IS NULL\n"
EVENTS = [{"price": 550, "color": "silver", "brand": "x"}, {"price": 700}, {"color": "gold", "brand": "y"}, {}]
EXPECTED = [(0, 1), (1, 2), (1, 3), (2, 2), (3, 3)]


@pytest.fixture
def files(tmp_path):
    subs = tmp_path / "subs.tsv"
    subs.write_text(SUBS)
    events = tmp_path / "events.jsonl"
    events.write_text("".join(json.dumps(e) + "\n" for e in EVENTS))
    return tmp_path, subs, events


def read_jsonl(path):
    return [(row["event"], row["sub_id"]) for row in map(json.loads, path.read_text().splitlines())]


def test_match_text_subscriptions_and_jsonl_events(files, capsys):
    tmp, subs, events = files
    assert main(["match", "--subs", str(subs), "--events", str(events), "--quiet"]) == 0
    out = capsys.readouterr().out
    assert [(r["event"], r["sub_id"]) for r in map(json.loads, out.splitlines())] == EXPECTED


def test_match_parquet_in_and_out_with_small_batches(files):
    tmp, subs, events = files
    index = Index(algorithm="scan")
    index.add_many([1, 2, 3], ["price <= 580 AND color = 'silver'", "price > 600 OR color LIKE 'g%'", "brand IS NULL"])
    columnar = pa.table({"sub_id": [1, 1, 2, 3], "attr": ["price", "color", "price", "brand"],
                         "op": ["<=", "=", ">", "is null"], "value": [580.0, None, 600.0, None],
                         "str_value": [None, "silver", None, None]})
    pq.write_table(columnar, tmp / "subs.parquet")
    pq.write_table(pa.Table.from_pylist(EVENTS), tmp / "events.parquet")
    out = tmp / "matches.parquet"
    assert main(["match", "--subs", str(tmp / "subs.parquet"), "--events", str(tmp / "events.parquet"),
                 "--out", str(out), "--batch-size", "3", "--quiet"]) == 0
    table = pq.read_table(out)
    # the columnar sub 2 has no LIKE branch: only price > 600
    assert list(zip(table["event"].to_pylist(), table["sub_id"].to_pylist())) == [(0, 1), (1, 2), (1, 3), (3, 3)]


def test_match_jsonl_output_file_and_empty_result(files):
    tmp, subs, events = files
    out = tmp / "m.jsonl"
    assert main(["match", "--subs", str(subs), "--events", str(events), "--out", str(out), "--quiet"]) == 0
    assert read_jsonl(out) == EXPECTED
    nothing = tmp / "none.jsonl"
    nothing.write_text('{"price": 590, "brand": "q"}\n')
    empty = tmp / "empty.parquet"
    assert main(["match", "--subs", str(subs), "--events", str(nothing), "--out", str(empty), "--quiet"]) == 0
    assert pq.read_table(empty).num_rows == 0


@pytest.mark.parametrize("subs_text, message", [
    ("1\tprice = \n", "subscription 1"),
    ("x\tprice = 1\n", "not an integer"),
    ("1 price = 1\n", "expected 'id<TAB>expression'"),
    ("1\tprice = 1\n1\tprice = 2\n", "more than once"),
])
def test_bad_subscription_files_fail_with_a_clear_message(files, capsys, subs_text, message):
    tmp, _, events = files
    bad = tmp / "bad.tsv"
    bad.write_text(subs_text)
    code = main(["match", "--subs", str(bad), "--events", str(events), "--quiet"])
    assert code == 2 or code is None
    assert message in capsys.readouterr().err


def test_bad_event_fails_naming_it_unless_errors_null(files, capsys):
    tmp, subs, _ = files
    events = tmp / "bad.jsonl"
    events.write_text('{"price": 1}\n{"price": "cheap"}\n')
    assert main(["match", "--subs", str(subs), "--events", str(events), "--quiet"]) == 2
    assert "attribute 'price'" in capsys.readouterr().err
    events.write_text('{"price": 1}\n{"price": "cheap"}\n')
    out = tmp / "m.jsonl"
    assert main(["match", "--subs", str(subs), "--events", str(events), "--errors", "null", "--out", str(out),
                 "--quiet"]) == 0
    assert read_jsonl(out) == [(0, 3), (1, 3)]
    events.write_text('{"price": 1}\nnot json\n')
    assert main(["match", "--subs", str(subs), "--events", str(events), "--quiet"]) == 2
    assert "bad.jsonl:2: not valid JSON" in capsys.readouterr().err


@pytest.mark.parametrize("argv", [["--help"], ["match", "--help"]])
def test_help(argv, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    assert exit_info.value.code == 0
    assert "usage: bexmatch" in capsys.readouterr().out
