"""``bexmatch match``: text and Parquet subscriptions, JSON Lines and
Parquet events and output, clear errors, help for every command."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from pathlib import Path

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


@pytest.mark.parametrize("algorithm", [None, "scan"], ids=["its own", "another"])
def test_match_a_saved_index(files, capsys, algorithm):
    """--subs takes an index saved by Index.save (as `bexmatch run --subs` does): its own algorithm, or the one
    --algorithm asks for; a truncated file is refused naming it."""
    tmp, subs, events = files
    index = Index(algorithm="opindex", backend="cpu")
    index.add_many([1, 2, 3], ["price <= 580 AND color = 'silver'", "price > 600 OR color LIKE 'g%'",
                               "brand IS NULL"])
    index.save(tmp / "subs.bexidx")
    argv = ["match", "--subs", str(tmp / "subs.bexidx"), "--events", str(events), "--quiet"]
    assert main(argv + (["--algorithm", algorithm] if algorithm else [])) == 0
    assert [(r["event"], r["sub_id"]) for r in map(json.loads, capsys.readouterr().out.splitlines())] == EXPECTED
    (tmp / "cut.bexidx").write_bytes((tmp / "subs.bexidx").read_bytes()[:200])
    assert main(["match", "--subs", str(tmp / "cut.bexidx"), "--events", str(events), "--quiet"]) == 2
    assert "cut.bexidx" in capsys.readouterr().err


def test_match_parquet_subscriptions_with_connective_rows(files):
    """The SUBS texts as Parquet, sub 2's OR a connective row: the same
    matches as the texts."""
    tmp, subs, events = files
    from engine.columnar import expressions_as_columns
    from engine.parse import parse
    texts = [line.split("\t") for line in SUBS.splitlines() if "\t" in line]
    table = expressions_as_columns([int(i) for i, _ in texts], [parse(text) for _, text in texts])
    assert "or" in table["op"].to_pylist()
    pq.write_table(table, tmp / "subs.parquet")
    out = tmp / "matches.jsonl"
    assert main(["match", "--subs", str(tmp / "subs.parquet"), "--events", str(events), "--out", str(out),
                 "--quiet"]) == 0
    assert read_jsonl(out) == EXPECTED


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
    err = capsys.readouterr().err
    assert "bad.jsonl:2: attribute 'price'" in err
    assert "(pass --errors null to treat such values as absent)" in err and "errors='null'" not in err  # flags
    events.write_text('{"price": 1}\n{"price": "cheap"}\n')
    out = tmp / "m.jsonl"
    assert main(["match", "--subs", str(subs), "--events", str(events), "--errors", "null", "--out", str(out),
                 "--quiet"]) == 0
    assert read_jsonl(out) == [(0, 3), (1, 3)]
    events.write_text('{"price": 1}\nnot json\n')
    assert main(["match", "--subs", str(subs), "--events", str(events), "--quiet"]) == 2
    assert "bad.jsonl:2: not valid JSON" in capsys.readouterr().err


def test_algorithm_choices_are_the_registry(files, capsys):
    """``--algorithm`` takes what the registry holds when the command runs,
    an algorithm registered at runtime included."""
    from engine.algorithms import registry
    from engine.algorithms.options import ScanOptions

    tmp, subs, events = files
    argv = ["match", "--subs", str(subs), "--events", str(events), "--quiet", "--algorithm", "scan_copy"]
    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    assert exit_info.value.code == 2 and "invalid choice: 'scan_copy'" in capsys.readouterr().err
    registry.register(registry.Algorithm(name="scan_copy", title="scan_copy", paper="(test)", sections="",
                                         implementations={"cpu": "engine.algorithms.scan:ScanMatcher"},
                                         options=ScanOptions))
    try:
        assert main([*argv, "--backend", "cpu"]) == 0
    finally:
        registry.unregister("scan_copy")
    out = capsys.readouterr().out
    assert [(r["event"], r["sub_id"]) for r in map(json.loads, out.splitlines())] == EXPECTED


@pytest.mark.parametrize("argv", [["--help"], ["match", "--help"]])
def test_help(argv, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    assert exit_info.value.code == 0
    assert "usage: bexmatch" in capsys.readouterr().out


# ------------------------------------------------------------- bad input
def run_failing(argv, capsys) -> str:
    """Run the CLI expecting a clean refusal: exit status 2 and one line on stderr."""
    assert main([*argv, "--quiet"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("bexmatch: error: ") and err.count("\n") == 1, err
    return err


def test_directories_as_inputs_or_output_are_refused(files, capsys):
    tmp, subs, events = files
    folder = tmp / "folder"
    folder.mkdir()
    assert str(folder) in run_failing(["match", "--subs", str(folder), "--events", str(events)], capsys)
    assert str(folder) in run_failing(["match", "--subs", str(subs), "--events", str(folder)], capsys)
    assert "is a directory" in run_failing(["match", "--subs", str(subs), "--events", str(events),
                                            "--out", str(folder)], capsys)
    assert "cannot be written" in run_failing(["match", "--subs", str(subs), "--events", str(events),
                                               "--out", str(tmp / "no-such-dir" / "m.jsonl")], capsys)


@pytest.mark.parametrize("subs_bytes, message", [
    (b"1\tprice > 1\n\n# comment\n99999999999999999999\tprice > 2\n", "bad.tsv:4: subscription id 99999999999999999999"
                                                                      " does not fit in int64"),
    (b"1\tprice > 1\n-9223372036854775809\tprice > 2\n", "bad.tsv:2: subscription id"),
    (b"1\tprice > 1\n2\tcolor = '\xff'\n", "bad.tsv:2: not valid UTF-8"),
    (b"1\tprice > 1\n\n2\tcolor = 'a'\n# comment\n3\tcolor > 5\n", "bad.tsv:5: subscription 3: 'color' is string"),
    (b"1\tprice > 1\n2\tprice > 2\n\n1\tprice > 3\n", "bad.tsv:4: subscription id 1 given more than once"),
    (b"1\tprice > 1\n2\tprice = \n", "bad.tsv:2: subscription 2"),
    # ids are ASCII digits: int() would read these as 3000, 3, 3 and 3
    (b"1\tprice > 1\n3_000\tprice > 2\n", "bad.tsv:2: subscription id '3_000' is not an integer"),
    ("1\tprice > 1\n\u0663\tprice > 2\n".encode(), "bad.tsv:2: subscription id '\u0663' is not an integer"),
    (b"1\tprice > 1\n 3\tprice > 2\n", "bad.tsv:2: subscription id ' 3' is not an integer"),
    (b"1\tprice > 1\n+3\tprice > 2\n", "bad.tsv:2: subscription id '+3' is not an integer"),
])
def test_subscription_errors_name_the_line(files, capsys, subs_bytes, message):
    tmp, _, events = files
    bad = tmp / "bad.tsv"
    bad.write_bytes(subs_bytes)
    assert message in run_failing(["match", "--subs", str(bad), "--events", str(events)], capsys)


def test_event_errors_name_the_line_not_the_batch_position(files, capsys):
    tmp, subs, _ = files
    events = tmp / "bad.jsonl"
    events.write_text('{"price": 1}\n\n{"price": 2}\n{"color": "a"}\n\n{"price": "cheap"}\n')
    err = run_failing(["match", "--subs", str(subs), "--events", str(events), "--batch-size", "2"], capsys)
    assert "bad.jsonl:6: attribute 'price'" in err
    events.write_bytes(b'{"price": 1}\n{"color": "\xfe"}\n')
    assert "bad.jsonl:2: not valid UTF-8" in run_failing(["match", "--subs", str(subs), "--events", str(events)],
                                                         capsys)
    events.write_text('{"price": 1}\n' + "[" * 100_000 + "\n")
    assert "bad.jsonl:2: not valid JSON" in run_failing(["match", "--subs", str(subs), "--events", str(events)],
                                                        capsys)
    parquet = tmp / "bad.parquet"
    pq.write_table(pa.table({"price": [1.0, 2.0, 3.0, float("nan"), 5.0]}), parquet)
    err = run_failing(["match", "--subs", str(subs), "--events", str(parquet), "--batch-size", "2"], capsys)
    assert "bad.parquet: row 4: attribute 'price'" in err


def test_corrupt_parquet_inputs_are_refused(files, capsys):
    tmp, subs, events = files
    corrupt = tmp / "corrupt.parquet"
    corrupt.write_bytes(b"PAR1 certainly not parquet")
    for argv in (["--subs", str(corrupt), "--events", str(events)], ["--subs", str(subs), "--events", str(corrupt)]):
        assert "corrupt.parquet: not a readable Parquet file" in run_failing(["match", *argv], capsys)
    foreign = tmp / "foreign.parquet"
    pq.write_table(pa.table({"x": [1]}), foreign)
    assert "foreign.parquet: columnar subscriptions: unknown column" in run_failing(
        ["match", "--subs", str(foreign), "--events", str(events)], capsys)


def test_batch_size_must_be_positive(files, capsys):
    tmp, subs, events = files
    for size in ("0", "-3"):
        assert "--batch-size must be at least 1" in run_failing(
            ["match", "--subs", str(subs), "--events", str(events), "--batch-size", size], capsys)


@pytest.mark.parametrize("name", ["m.jsonl", "m.parquet"])
def test_a_failed_run_leaves_no_partial_output(files, capsys, name):
    tmp, subs, _ = files
    events = tmp / "late.jsonl"
    events.write_text("".join(json.dumps(e) + "\n" for e in EVENTS * 3) + '{"price": "cheap"}\n')
    out = tmp / name
    run_failing(["match", "--subs", str(subs), "--events", str(events), "--batch-size", "2", "--out", str(out)],
                capsys)
    assert not out.exists()
    # an earlier result is left as it was, and no temp file is left beside it
    out.write_bytes(b"earlier")
    run_failing(["match", "--subs", str(subs), "--events", str(events), "--batch-size", "2", "--out", str(out)],
                capsys)
    assert out.read_bytes() == b"earlier"
    assert sorted(p.name for p in tmp.iterdir()) == sorted(["subs.tsv", "events.jsonl", "late.jsonl", name])


def test_out_naming_an_input_is_refused_before_anything_is_written(files, capsys):
    """--out renamed the matches over the input it names: exit 0, and the
    events (or subscriptions) were gone.  The same file through a symlink
    or a hard link, and a file of a Parquet events directory, too."""
    tmp, subs, events = files
    (tmp / "events-link").symlink_to(events)
    (tmp / "subs-hard").hardlink_to(subs)
    parts = tmp / "parts"
    parts.mkdir()
    pq.write_table(pa.Table.from_pylist(EVENTS), parts / "0.parquet")
    before = {path: path.read_bytes() for path in (subs, events, parts / "0.parquet")}
    for inputs, out, flag in [((subs, events), events, "--events"), ((subs, events), subs, "--subs"),
                              ((subs, events), tmp / "events-link", "--events"),
                              ((subs, events), tmp / "subs-hard", "--subs"),
                              ((subs, parts), parts / "0.parquet", "--events"),
                              ((subs, parts), parts / "1.jsonl", "--events")]:
        err = run_failing(["match", "--subs", str(inputs[0]), "--events", str(inputs[1]), "--out", str(out)], capsys)
        assert f"--out {out}: is" in err and flag in err
    assert {path: path.read_bytes() for path in before} == before
    assert not (parts / "1.jsonl").exists()
    # a hidden name is no file of the directory's (_parquet_parts skips it)
    assert main(["match", "--subs", str(subs), "--events", str(parts), "--out", str(parts / "_m.jsonl"),
                 "--quiet"]) == 0
    assert read_jsonl(parts / "_m.jsonl") == EXPECTED


def test_out_through_a_symlink_writes_its_target(files):
    """The link stays a link and the file it names gets the matches (the
    link was replaced by a regular file, its target left as it was)."""
    tmp, subs, events = files
    real, link = tmp / "real.jsonl", tmp / "link.jsonl"
    real.write_text("stale\n")
    link.symlink_to(real.name)                    # relative, as `ln -s real.jsonl link.jsonl` makes it
    assert main(["match", "--subs", str(subs), "--events", str(events), "--out", str(link), "--quiet"]) == 0
    assert link.is_symlink() and read_jsonl(real) == EXPECTED
    assert sorted(p.name for p in tmp.iterdir()) == sorted(["subs.tsv", "events.jsonl", "real.jsonl", "link.jsonl"])


@pytest.mark.parametrize("name", ["m.jsonl", "m.parquet"])
def test_out_over_a_file_keeps_its_permissions(files, name):
    """A private --out file (0600) written again stays private: the matches
    replace it with its permission bits."""
    tmp, subs, events = files
    out = tmp / name
    out.write_text("stale\n")
    os.chmod(out, 0o600)
    assert main(["match", "--subs", str(subs), "--events", str(events), "--out", str(out), "--quiet"]) == 0
    assert os.stat(out).st_mode & 0o777 == 0o600 and out.read_bytes() != b"stale\n"


@pytest.mark.parametrize("name", ["pipe", "pipe.parquet"])
def test_out_into_a_fifo_is_written_into_not_replaced(files, name):
    """A FIFO was replaced by a regular file (a temp file renamed over it)
    and its reader got nothing.  The read end is opened non-blocking, so
    that the writer's open does not wait and the test cannot hang: the few
    matches fit in the pipe's buffer."""
    tmp, subs, events = files
    fifo = tmp / name
    os.mkfifo(fifo)
    reader = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)
    try:
        assert main(["match", "--subs", str(subs), "--events", str(events), "--out", str(fifo), "--quiet"]) == 0
        try:
            data = os.read(reader, 1 << 16)
        except BlockingIOError:                   # nothing written into the FIFO
            data = b""
    finally:
        os.close(reader)
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode)
    if name.endswith(".parquet"):
        table = pq.read_table(pa.BufferReader(data))
        assert list(zip(table["event"].to_pylist(), table["sub_id"].to_pylist())) == EXPECTED
    else:
        assert [(r["event"], r["sub_id"]) for r in map(json.loads, data.decode().splitlines())] == EXPECTED


@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="needs Linux's /proc/self/fd")
def test_out_through_a_link_to_an_open_file_descriptor(files):
    """``/dev/stdout`` is a link to /proc/self/fd/1; here a link in tmp_path
    to a pipe's write end stands for it (the test leaves /dev alone).  The
    link was replaced by a regular file and nothing reached the pipe."""
    tmp, subs, events = files
    read_end, write_end = os.pipe()
    link = tmp / "stdout"
    link.symlink_to(f"/proc/self/fd/{write_end}")
    try:
        assert main(["match", "--subs", str(subs), "--events", str(events), "--out", str(link), "--quiet"]) == 0
        os.close(write_end)
        write_end = None
        with os.fdopen(read_end, "rb") as pipe:
            read_end = None
            data = pipe.read()
    finally:
        for fd in (read_end, write_end):
            if fd is not None:
                os.close(fd)
    assert link.is_symlink()
    assert [(r["event"], r["sub_id"]) for r in map(json.loads, data.decode().splitlines())] == EXPECTED


@pytest.mark.parametrize("argv, flag", [
    (["--workload", "W0"], "--workload"),
    (["--n-events", "-5", "--scale", "0.0001"], "--n-events"),
    (["--scale", "nan"], "--scale"),
    (["--seed", "-1", "--scale", "0.0001"], "--seed"),
    # (--subs and --events that do not exist: the old code refused them, exit 2, before Spark could start)
    (["--arrow-batch-size", "0", "--subs", "none.tsv", "--events", "none.jsonl"], "--arrow-batch-size"),
    (["--partitions", "0", "--subs", "none.tsv", "--events", "none.jsonl"], "--partitions"),
    (["--partitions", "-3", "--subs", "none.tsv", "--events", "none.jsonl"], "--partitions"),
], ids=["workload", "n-events", "scale", "seed", "arrow-batch-size", "partitions-0", "partitions"])
def test_run_refuses_bad_arguments_before_spark(tmp_path, capsys, monkeypatch, argv, flag):
    """A usage error naming the flag (exit 2), not a NumPy or Spark
    traceback (exit 1) from the generator or after Spark started."""
    monkeypatch.chdir(tmp_path)          # (the relative none.* inputs, and anything the old code wrote, land here)
    with pytest.raises(SystemExit) as exit_info:
        main(["run", *argv, "--quiet", "--data-dir", str(tmp_path / "data"), "--out", str(tmp_path / "out")])
    assert exit_info.value.code == 2
    assert flag in capsys.readouterr().err.splitlines()[-1]
    assert sorted(p.name for p in tmp_path.iterdir()) == []


@pytest.mark.parametrize("case", ["out is --subs", "out holds --events", "quarantine is out"])
def test_run_refuses_an_output_that_would_delete_an_input(tmp_path, capsys, case):
    """Spark's overwrite deletes the path it writes: an --out that is an
    input, or holds one, lost it (the index already built, the run could
    succeed).  One input of each case is missing, so that the old code
    refused that instead (exit 2 without SystemExit) before Spark started."""
    inputs = tmp_path / "in"
    inputs.mkdir()
    subs, events = inputs / "subs.tsv", inputs / "events.jsonl"
    subs.write_text(SUBS)
    events.write_text("".join(json.dumps(e) + "\n" for e in EVENTS))
    argv, flag = {
        "out is --subs": (["--subs", str(subs), "--events", str(tmp_path / "none.jsonl"), "--out", str(subs)],
                          "--out"),
        "out holds --events": (["--subs", str(tmp_path / "none.tsv"), "--events", str(events), "--out", str(inputs)],
                               "--out"),
        "quarantine is out": (["--subs", str(tmp_path / "none.tsv"), "--events", str(tmp_path / "none.jsonl"),
                               "--on-bad-event", "quarantine", "--out", str(tmp_path / "m"),
                               "--quarantine", str(tmp_path / "m")], "--quarantine"),
    }[case]
    with pytest.raises(SystemExit) as exit_info:
        main(["run", *argv, "--quiet"])
    assert exit_info.value.code == 2
    assert capsys.readouterr().err.splitlines()[-1].startswith(f"bexmatch run: error: {flag} ")
    assert subs.read_text() == SUBS and sorted(p.name for p in tmp_path.iterdir()) == ["in"]


@pytest.mark.parametrize("case", ["a directory of other files", "a file", "the quarantine's directory"])
def test_run_refuses_to_overwrite_what_is_not_a_spark_output(tmp_path, capsys, case):
    """Spark's overwrite deletes the whole path it writes: ``--out ~`` would
    have deleted the home directory, and ``--out m.parquet`` a file that
    ``bexmatch match`` wrote.  An earlier run's output (part files,
    ``_SUCCESS`` and their checksums) may still be replaced, as may an empty
    directory.  The inputs are missing, so that the old code refused that
    instead (exit 2 without SystemExit) before Spark started."""
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("keep me")
    kept = tmp_path / "m.parquet"
    kept.write_bytes(b"PAR1")
    out, flag = {"a directory of other files": (["--out", str(mine)], "--out"),
                 "a file": (["--out", str(kept)], "--out"),
                 "the quarantine's directory": (["--out", str(tmp_path / "o"), "--on-bad-event", "quarantine",
                                                 "--quarantine", str(mine)], "--quarantine")}[case]
    with pytest.raises(SystemExit) as exit_info:
        main(["run", "--subs", str(tmp_path / "none.tsv"), "--events", str(tmp_path / "none.jsonl"), *out, "--quiet"])
    assert exit_info.value.code == 2
    last = capsys.readouterr().err.splitlines()[-1]
    assert last.startswith(f"bexmatch run: error: {flag} ") and "is not a Spark output" in last
    assert (mine / "notes.txt").read_text() == "keep me" and kept.read_bytes() == b"PAR1"
    from spark_integration.job import _not_spark_output

    earlier = tmp_path / "earlier"
    earlier.mkdir()
    for name in ("part-00000-1.snappy.parquet", ".part-00000-1.snappy.parquet.crc", "_SUCCESS", "._SUCCESS.crc"):
        (earlier / name).write_bytes(b"")
    (tmp_path / "empty").mkdir()
    assert [_not_spark_output(str(tmp_path / name)) for name in ("earlier", "empty", "none")] == [None] * 3
    assert _not_spark_output(str(mine)) == "it holds 'notes.txt'"


def test_the_console_script_prints_no_traceback(files):
    tmp, subs, events = files
    bad = tmp / "bad.tsv"
    bad.write_bytes(b"1\tprice > 1\n99999999999999999999\tprice > 2\n")
    done = subprocess.run([sys.executable, "-m", "engine.cli", "match", "--subs", str(bad), "--events", str(events),
                           "--quiet"], capture_output=True, text=True, cwd=Path(__file__).resolve().parents[1])
    assert done.returncode == 2
    assert done.stderr == f"bexmatch: error: {bad}:2: subscription id 99999999999999999999 does not fit in int64\n"


def test_only_run_imports_spark(files, tmp_path):
    """``bexmatch match``, ``bench`` and ``--help`` work without Spark: none
    of them imports pyspark or spark_integration (a fresh interpreter, the
    modules loaded listed at exit)."""
    tmp, subs, events = files
    commands = [["--help"], ["bench", "--help"],
                ["match", "--subs", str(subs), "--events", str(events), "--out", str(tmp / "m.jsonl"), "--quiet"],
                ["bench", "--scale", "0.0002", "--events", "5", "--repeats", "1", "--latency-samples", "1",
                 "--algorithm", "scan", "--quiet"]]
    script = (
        "import json, sys\n"
        "from engine.cli import main\n"
        "codes = []\n"
        f"for argv in {commands!r}:\n"
        "    try:\n"
        "        codes.append(main(argv))\n"
        "    except SystemExit as exc:\n"
        "        codes.append(exc.code)\n"
        "spark = sorted(m for m in sys.modules if m.split('.')[0] in ('pyspark', 'py4j', 'spark_integration'))\n"
        "print(json.dumps({'codes': codes, 'spark': spark}))\n")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          cwd=Path(__file__).resolve().parents[1])
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout.splitlines()[-1])
    assert result == {"codes": [0, 0, 0, 0], "spark": []}, done.stderr[-3000:]
    assert read_jsonl(tmp / "m.jsonl") == EXPECTED


def test_version_is_one_value_everywhere(capsys):
    """``bexmatch --version``, ``engine.__version__`` and the installed
    distribution's metadata agree (pyproject.toml reads engine/_version.py);
    the package says it carries type hints (PEP 561)."""
    import importlib.metadata

    import engine

    with pytest.raises(SystemExit) as exit_:
        main(["--version"])
    assert exit_.value.code == 0
    assert capsys.readouterr().out.strip() == f"bexmatch {engine.__version__}"
    assert importlib.metadata.version("bexmatch") == engine.__version__
    assert (Path(engine.__file__).parent / "py.typed").exists()


def test_every_option_of_every_command_has_help():
    import argparse

    from engine.bench.cli import build_parser as bench_parser
    from engine.cli import build_parser
    from spark_integration.job import build_parser as run_parser

    missing = []

    def walk(parser, path):
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                for name, sub in action.choices.items():
                    walk(sub, f"{path} {name}")
            elif not action.help and not isinstance(action, argparse._HelpAction):
                missing.append(f"{path} {'/'.join(action.option_strings) or action.dest}")

    for parser, path in ((build_parser(), "bexmatch"), (bench_parser(), "bexmatch bench"),
                         (run_parser(), "bexmatch run")):
        walk(parser, path)
    assert missing == []


def test_a_parquet_directory_is_read_file_by_file_with_each_files_columns(tmp_path, capsys):
    """A column that only a later file of the directory holds is read (one
    table of the directory took the first file's schema and dropped it,
    unseen); files are read in name order, hidden ones (``_SUCCESS``) not."""
    subs = tmp_path / "subs.txt"
    subs.write_text("1\tn = 1\n2\ts = 'a'\n3\ts IS NULL\n")
    events = tmp_path / "events"
    events.mkdir()
    pq.write_table(pa.table({"n": [1, 2]}), events / "part-0.parquet")
    pq.write_table(pa.table({"n": [3], "s": ["a"]}), events / "part-1.parquet")
    (events / "_SUCCESS").write_bytes(b"")
    assert main(["match", "--subs", str(subs), "--events", str(events), "--quiet"]) == 0
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert sorted((m["event"], m["sub_id"]) for m in lines) == [(0, 1), (0, 3), (1, 3), (2, 2)]


def test_a_parquet_directory_of_subscriptions_is_read_file_by_file(tmp_path, capsys):
    """Subscriptions as events: each file with its own columns.  One table of
    the directory cast the second file's boolean operand to the first's
    float (``flag = TRUE`` became ``flag = 1``: exit 0, wrong answers) and
    dropped the third file's ``str_value`` column (a valid file refused)."""
    subs = tmp_path / "subs"
    subs.mkdir()
    pq.write_table(pa.table({"sub_id": [1], "attr": ["price"], "op": ["<="], "value": [5.0]}), subs / "0.parquet")
    pq.write_table(pa.table({"sub_id": [2], "attr": ["flag"], "op": ["="], "value": [True]}), subs / "1.parquet")
    pq.write_table(pa.table({"sub_id": [3], "attr": ["color"], "op": ["="], "str_value": ["red"]}),
                   subs / "2.parquet")
    (subs / "_SUCCESS").write_bytes(b"")
    events = tmp_path / "events.jsonl"
    events.write_text('{"flag": true, "price": 5}\n{"color": "red", "price": 6}\n')
    assert main(["match", "--subs", str(subs), "--events", str(events), "--quiet"]) == 0
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert sorted((m["event"], m["sub_id"]) for m in lines) == [(0, 1), (0, 2), (1, 3)]
    pq.write_table(pa.table({"sub_id": [1], "attr": ["price"], "op": ["<="], "value": [9.0]}), subs / "3.parquet")
    message = run_failing(["match", "--subs", str(subs), "--events", str(events)], capsys)
    assert "3.parquet: subscription id 1 is already in the index" in message
    (subs / "3.parquet").unlink()
    (subs / "day=1").mkdir()
    assert "day=1 is a directory" in run_failing(["match", "--subs", str(subs), "--events", str(events)], capsys)


def test_a_byte_order_mark_starts_a_text_file_and_is_no_part_of_it(tmp_path, capsys):
    subs = tmp_path / "subs.txt"
    subs.write_bytes("\ufeff1\tprice > 1\n2\tprice > 5\n".encode())
    events = tmp_path / "events.jsonl"
    events.write_bytes("\ufeff{\"price\": 3}\n".encode())
    assert main(["match", "--subs", str(subs), "--events", str(events), "--quiet"]) == 0
    assert [json.loads(line) for line in capsys.readouterr().out.splitlines()] == [{"event": 0, "sub_id": 1}]
