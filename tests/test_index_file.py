"""Saved index files (engine.index_file): every malformed file -- flipped
bits, truncations, crafted contents with valid checksums -- is an
IndexFileError naming the path, saves respect the umask, and a killed save
leaves nothing behind once the next save has run."""

from __future__ import annotations

import hashlib
import io
import json
import os
import random
import signal
import socket
import subprocess
import sys
import threading
import zipfile

import numpy as np
import pyarrow as pa
import pytest

from engine import Index, IndexFileError
from engine.errors import ExpressionTooLarge
from engine.index_file import ARRAY_DTYPES

SUBSCRIPTIONS = {
    1: "price <= 580 AND color = 'silver'",
    2: "name = '" + "long " * 80 + "' OR size IN (1, 2, 3)",
    3: "color IN ('red', 'blue') AND NOT (price BETWEEN 10 AND 20)",
    4: "color LIKE 'si%' OR name MATCHES '^ab+c'",
    5: "missing IS NULL AND flag = true",
    6: "other IS NOT NULL XOR price > 3.5",
    7: "NOT color LIKE '%x_' AND color NOT IN ('green') AND flag <> false",
    8: "(price > 1 OR size < 0) AND (color = 'gold' OR (name IS NULL AND size >= 2))",
}
EVENTS = [{"price": 550, "color": "silver", "flag": True, "size": 2},
          {"price": 15, "color": "red", "name": "abbbc", "other": 1},
          {"name": "long " * 80, "flag": False, "color": "greenx"},
          {"price": 3.5, "color": "gold", "size": 2}, {}]
#: events for an index loaded from a crafted file, whatever it now holds
PROBES = EVENTS + [{"price": "text", "color": 5}]


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """(path, bytes, expected matches) of a small index of every kind of predicate."""
    index = Index(algorithm="opindex", backend="cpu", options={"segments": 4})
    for sub_id, text in SUBSCRIPTIONS.items():
        index.add(sub_id, text)
    path = tmp_path_factory.mktemp("saved") / "subs.bexidx"
    index.save(path)
    return path, path.read_bytes(), matches(index)


def matches(index) -> list[list[int]]:
    return [ids.tolist() for ids in index.match_batch(EVENTS)]


def members(data: bytes) -> tuple[dict, dict[str, np.ndarray]]:
    with zipfile.ZipFile(io.BytesIO(data)) as archive:
        meta = json.loads(archive.read("meta.json"))
        arrays = {name[:-len(".npy")]: np.load(io.BytesIO(archive.read(name)))
                  for name in archive.namelist() if name.endswith(".npy")}
    return meta, arrays


def rewritten(meta: dict, arrays: dict, *, meta_text: str | None = None) -> bytes:
    """A well-formed archive of ``meta`` and ``arrays``, its checksums made to match."""
    meta = {**meta, "sha256": {name: hashlib.sha256(np.ascontiguousarray(a).tobytes()).hexdigest()
                               for name, a in arrays.items()}} if "sha256" in meta else meta
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        archive.writestr("meta.json", json.dumps(meta) if meta_text is None else meta_text)
        for name, array in arrays.items():
            npy = io.BytesIO()
            np.save(npy, array, allow_pickle=False)
            archive.writestr(f"{name}.npy", npy.getvalue())
    return buffer.getvalue()


def load_or_refuse(path, expected=None) -> str:
    """Load ``path``: it must raise IndexFileError naming the path, or load
    an index that matches (exactly ``expected`` when given) and stays
    updatable.  Returns which happened."""
    try:
        loaded = Index.load(path)
    except IndexFileError as exc:
        assert str(path) in str(exc)
        return "refused"
    if expected is not None:
        assert matches(loaded) == expected
    else:
        loaded.match_batch(PROBES, errors="null")
    loaded.add(10 ** 6, "price > 0 OR color = 'new'")
    loaded.match_batch(PROBES, errors="null")
    return "loaded"


@pytest.mark.parametrize("fill", [
    lambda index: None,
    lambda index: index.add(1, "brand IS NULL"),
    lambda index: index.add_many(pa.table({"sub_id": [1, 1, 2], "attr": ["price", "color", "price"],
                                           "op": ["<=", "=", ">"], "value": [580.0, None, 600.0],
                                           "str_value": [None, "silver", None]})),
    lambda index: [index.add(i, SUBSCRIPTIONS[i]) for i in SUBSCRIPTIONS] and index.remove(8),
], ids=["empty", "family-less attribute", "columnar", "after a removal"])
def test_round_trips(tmp_path, fill):
    index = Index(algorithm="scan", backend="cpu")
    fill(index)
    index.save(tmp_path / "subs.bexidx")
    loaded = Index.load(tmp_path / "subs.bexidx")
    assert matches(loaded) == matches(index) and len(loaded) == len(index)


# ------------------------------------------------------------------ fuzzing
FLIPS, TRUNCATIONS, CRAFTED = 300, 100, 300


def test_flipped_bits_are_refused_or_harmless(saved, tmp_path):
    path, data, expected = saved
    rng = random.Random(20240601)
    outcomes = []
    for case in range(FLIPS):
        flipped = bytearray(data)
        for _ in range(rng.choice((1, 1, 1, 2, 8))):
            flipped[rng.randrange(len(data))] ^= 1 << rng.randrange(8)
        bad = tmp_path / f"flip{case}.bexidx"
        bad.write_bytes(bytes(flipped))
        outcomes.append(load_or_refuse(bad, expected))
    assert outcomes.count("refused") > FLIPS // 2


def test_truncated_files_are_refused(saved, tmp_path):
    path, data, _ = saved
    rng = random.Random(7)
    for case, length in enumerate([0, 1, 4, 22, len(data) - 1, len(data) - 22]
                                  + [rng.randrange(len(data)) for _ in range(TRUNCATIONS - 6)]):
        bad = tmp_path / f"cut{case}.bexidx"
        bad.write_bytes(data[:length])
        assert load_or_refuse(bad) == "refused", length


WEIRD = [None, True, False, 0, -5, 1, 2 ** 63, 10 ** 12, 1.5, float("inf"), "", "x", "\ud800", "[", "numeric",
         [], [1], ["a", "b"], [["a", "numeric"]], {}, {"a": 1}, {"variant": "nope"}, {"segments": 3}]


def _paths(value, prefix=()):
    """Every (path into a JSON value) of ``value``, the value itself included."""
    yield prefix
    if isinstance(value, dict):
        for key, item in value.items():
            yield from _paths(item, prefix + (key,))
    elif isinstance(value, list):
        for i, item in enumerate(value):
            yield from _paths(item, prefix + (i,))


def _replaced(value, path, new):
    if not path:
        return new
    copy = list(value) if isinstance(value, list) else dict(value)
    copy[path[0]] = _replaced(value[path[0]], path[1:], new)
    return copy


def test_crafted_metadata_with_valid_checksums_is_refused_or_works(saved, tmp_path):
    path, data, _ = saved
    meta, arrays = members(data)
    rng = random.Random(99)
    outcomes = []
    for case in range(CRAFTED):
        crafted = meta
        for _ in range(rng.choice((1, 1, 2))):
            # (the checksums stay valid: they are the one thing left as saved)
            paths = [p for p in _paths(crafted) if p[:1] != ("sha256",)]
            crafted = _replaced(crafted, rng.choice(paths), rng.choice(WEIRD))
        bad = tmp_path / f"meta{case}.bexidx"
        bad.write_bytes(rewritten(meta, arrays, meta_text=json.dumps(crafted)))
        outcomes.append(load_or_refuse(bad))
    assert outcomes.count("refused") > CRAFTED // 2


def _with(meta: dict, **changes) -> dict:
    return {**meta, **changes}


def _schema(meta: dict, **changes) -> dict:
    return {**meta, "schema": {**meta["schema"], **changes}}


@pytest.mark.parametrize("craft", [
    lambda m, a: (_with(m, dnf_limit=-5), a),
    lambda m, a: (_with(m, dnf_limit=True), a),
    lambda m, a: (_with(m, max_depth=0), a),
    lambda m, a: (_with(m, version=True), a),
    lambda m, a: (_with(m, algorithm="nope"), a),
    lambda m, a: (_with(m, backend=3), a),
    lambda m, a: (_with(m, options=[]), a),
    lambda m, a: (_with(m, options={"nope": 1}), a),
    lambda m, a: (_with(m, options={"segments": 3}), a),
    lambda m, a: (_with(m, options={"schema": None}), a),
    lambda m, a: (_with(m, extra=1), a),
    lambda m, a: (_schema(m, attributes={"price": "numeric"}), a),
    lambda m, a: (_schema(m, attributes=[["price", "numeric", 1]]), a),
    lambda m, a: (_schema(m, attributes=[[1, "numeric"]] + m["schema"]["attributes"][1:]), a),
    lambda m, a: (_schema(m, attributes=[["price", "integer"]] + m["schema"]["attributes"][1:]), a),
    lambda m, a: (_schema(m, attributes=m["schema"]["attributes"][:1] * 2 + m["schema"]["attributes"][2:]), a),
    lambda m, a: (_schema(m, strings=[5] + m["schema"]["strings"][1:]), a),
    lambda m, a: (_schema(m, strings=["\ud800"] + m["schema"]["strings"][1:]), a),
    lambda m, a: (_schema(m, strings=m["schema"]["strings"][:1] * 2 + m["schema"]["strings"][2:]), a),
    lambda m, a: (_schema(m, strings=m["schema"]["strings"][:-1]), a),
    lambda m, a: (_schema(m, patterns=[["regex", "(unclosed"]] + m["schema"]["patterns"][1:]), a),
    lambda m, a: (_schema(m, patterns=[["like", 5]] + m["schema"]["patterns"][1:]), a),
    lambda m, a: (_schema(m, patterns=[["glob", "x"]] + m["schema"]["patterns"][1:]), a),
    lambda m, a: (_schema(m, patterns=m["schema"]["patterns"][:-1]), a),
    lambda m, a: (_schema(m, patterns="x"), a),
    lambda m, a: (_schema(m, patterns=[["regex" if kind == "like" else "like", text]
                                       for kind, text in m["schema"]["patterns"]]), a),
    lambda m, a: (m, {**a, "prog_kind": np.where(a["prog_kind"] == 1, 9, a["prog_kind"]).astype(np.int8)}),
    lambda m, a: (m, {**a, "prog_arg": a["prog_arg"] + 1000}),
    lambda m, a: (m, {**a, "prog_offsets": a["prog_offsets"][::-1].copy()}),
    lambda m, a: (m, {**a, "pred_op": np.full_like(a["pred_op"], 99)}),
    lambda m, a: (m, {**a, "pred_attr": a["pred_attr"] - 1}),
    lambda m, a: (m, {**a, "pred_aux": np.full_like(a["pred_aux"], 7)}),
    lambda m, a: (m, {**a, "pred_lo_key": np.full_like(a["pred_lo_key"], np.nan)}),
    lambda m, a: (m, {**a, "pred_lo_key": a["pred_lo_key"] - 1000.5}),
    lambda m, a: (m, {**a, "set_offsets": a["set_offsets"] + 1}),
    lambda m, a: (m, {**a, "set_keys": -a["set_keys"] - 1}),
    lambda m, a: (_schema(m, attributes=[["", "numeric"]] + m["schema"]["attributes"][1:]), a),
    # IN lists as the schema makes them: one key at least, ascending and distinct (a repeated key counted
    # twice by OpIndex's hit counts satisfied an AND alone); a boolean's operands TRUE and FALSE
    lambda m, a: (m, {**a, "set_offsets": np.concatenate(([0], a["set_offsets"][:-1], a["set_offsets"][-1:]))}),
    lambda m, a: (m, {**a, "set_keys": np.repeat(a["set_keys"][:1], len(a["set_keys"]))}),
    lambda m, a: (m, {**a, "set_keys": a["set_keys"][::-1].copy()}),
    lambda m, a: (m, {**a, "pred_lo_key": np.where(a["pred_lo_key"] == 1.0, 2.0, a["pred_lo_key"])}),
    lambda m, a: (m, {**a, "sub_ids": a["sub_ids"][::-1].copy()}),
    lambda m, a: (m, {**a, "sub_ids": a["sub_ids"].astype(np.int32)}),
    lambda m, a: (m, {**a, "sub_ids": a["sub_ids"].astype(">i8")}),
    lambda m, a: (m, {**a, "sub_ids": a["sub_ids"].reshape(1, -1)}),
    lambda m, a: (m, {**a, "pred_op": a["pred_op"][:-1]}),
])
def test_crafted_contents_are_refused_at_load(saved, tmp_path, craft):
    path, data, _ = saved
    meta, arrays = craft(*members(data))
    bad = tmp_path / "crafted.bexidx"
    bad.write_bytes(rewritten(meta, arrays))
    with pytest.raises(IndexFileError, match="crafted.bexidx"):
        Index.load(bad)


def test_an_overstated_max_depth_loads_with_the_depth_the_programs_need(saved, tmp_path):
    """Files saved before max_depth was exact could record more than the
    programs need; a crafted one, far more (10**12 stacks would not fit in
    memory): the depth used is the one the programs need."""
    path, data, _ = saved
    meta, arrays = members(data)
    bad = tmp_path / "deep.bexidx"
    bad.write_bytes(rewritten(_with(meta, max_depth=10 ** 12), arrays))
    loaded, original = Index.load(bad), Index.load(path)
    assert loaded._main.max_depth == original._main.max_depth < 100
    assert [m.tolist() for m in loaded.match_batch(EVENTS)] == \
        [m.tolist() for m in original.match_batch(EVENTS)]


@pytest.mark.parametrize("meta_text", ['{"magic": "bexmatch-index", "version": 1, "dnf_limit": NaN}',
                                       "[" * 100_000, "\"\\ud800\"", "{\"magic\": \"bexmatch-index\"}"])
def test_malformed_meta_json_is_refused(saved, tmp_path, meta_text):
    path, data, _ = saved
    meta, arrays = members(data)
    bad = tmp_path / "meta.bexidx"
    bad.write_bytes(rewritten(meta, arrays, meta_text=meta_text))
    with pytest.raises(IndexFileError, match="meta.bexidx"):
        Index.load(bad)


def test_encrypted_or_compressed_members_are_refused(saved, tmp_path):
    path, data, _ = saved
    flagged = bytearray(data)
    flagged[data.index(b"PK\x01\x02") + 8] |= 0x41    # the first member "strongly encrypted"
    (tmp_path / "encrypted.bexidx").write_bytes(bytes(flagged))
    with pytest.raises(IndexFileError, match="encrypted.bexidx"):
        Index.load(tmp_path / "encrypted.bexidx")
    with zipfile.ZipFile(io.BytesIO(data)) as src, zipfile.ZipFile(tmp_path / "deflated.bexidx", "w",
                                                                   zipfile.ZIP_DEFLATED) as dst:
        for item in src.infolist():
            dst.writestr(item.filename, src.read(item))
    with pytest.raises(IndexFileError, match="deflated.bexidx"):
        Index.load(tmp_path / "deflated.bexidx")


def test_a_save_through_a_link_replaces_the_file_it_names(tmp_path):
    """The save is atomic by renaming a temp file onto the path: onto a
    link, that replaced the link with a file and left its target stale."""
    index = Index(algorithm="scan", backend="cpu")
    index.add(1, "a = 1")
    index.save(tmp_path / "v1.bexidx")
    (tmp_path / "current.bexidx").symlink_to("v1.bexidx")
    index.add(2, "a = 2")
    index.save(tmp_path / "current.bexidx")
    assert (tmp_path / "current.bexidx").is_symlink()
    assert Index.load(tmp_path / "v1.bexidx").ids().tolist() == [1, 2]


def test_a_bytes_path_saves_and_loads_as_open_takes_it(tmp_path):
    """save mixed a bytes path with its temp file's str name (TypeError),
    and load said a file that exists was not found."""
    index = Index(algorithm="scan", backend="cpu")
    index.add(1, "a = 1")
    path = os.fsencode(tmp_path / "x.bexidx")
    index.save(path)
    assert Index.load(path).ids().tolist() == [1]
    with pytest.raises(TypeError):
        Index.load(7)


def test_a_missing_file_and_a_directory(tmp_path):
    with pytest.raises(FileNotFoundError, match="missing.bexidx"):
        Index.load(tmp_path / "missing.bexidx")
    with pytest.raises(IndexFileError, match="is a directory"):
        Index.load(tmp_path)


def test_options_saved_for_another_backend_are_file_errors(saved, tmp_path):
    path, data, _ = saved
    meta, arrays = members(data)
    bad = tmp_path / "cuda-options.bexidx"
    bad.write_bytes(rewritten({**meta, "options": {"counting": "sort"}}, arrays))
    with pytest.raises(IndexFileError, match="counting"):
        Index.load(bad, backend="cpu")
    # the caller's own options are the caller's errors, as for Index(...)
    with pytest.raises(TypeError):
        Index.load(path, options={"nope": 1})


# ------------------------------------------------------------------ writing
@pytest.mark.parametrize("umask, mode", [(0o022, 0o644), (0o077, 0o600), (0o002, 0o664)])
def test_saved_files_respect_the_umask(tmp_path, umask, mode):
    index = Index(algorithm="scan", backend="cpu")
    index.add(1, "price > 1")
    old = os.umask(umask)
    try:
        index.save(tmp_path / "subs.bexidx")
    finally:
        os.umask(old)
    assert os.stat(tmp_path / "subs.bexidx").st_mode & 0o777 == mode


@pytest.mark.parametrize("mode", [0o600, 0o640, 0o755])
def test_a_save_over_a_file_keeps_its_permissions(tmp_path, mode):
    """Saved again, an index file its owner made private stays private: the
    new file takes the old one's permission bits, not the umask's default
    (a new file still takes the umask's, above)."""
    index = Index(algorithm="scan", backend="cpu")
    index.add(1, "price > 1")
    path = tmp_path / "subs.bexidx"
    index.save(path)
    os.chmod(path, mode)
    index.add(2, "price < 0")
    index.save(path)
    assert os.stat(path).st_mode & 0o777 == mode
    assert sorted(Index.load(path).ids().tolist()) == [1, 2]


def test_an_in_list_from_the_smallest_to_the_largest_float_loads(tmp_path):
    """The load's check that IN-list keys ascend compared neighbours by
    subtracting them: -1.8e308 and 1.8e308 overflowed, and the warning
    (an error under -W error, as in this suite) refused a valid file."""
    index = Index(algorithm="scan", backend="cpu")
    index.add(1, "a IN (-1.7976931348623157e308, 1.7976931348623157e308)")
    index.save(tmp_path / "wide.bexidx")
    loaded = Index.load(tmp_path / "wide.bexidx")
    assert loaded.match({"a": 1.7976931348623157e308}).tolist() == [1] and loaded.match({"a": 1}).tolist() == []


def _dead_pid() -> int:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


def test_the_next_save_removes_a_killed_saves_temp_file(tmp_path):
    # a save that hangs once its temp file is half written, then is killed
    script = (
        "import sys, time, zipfile\n"
        "from engine import Index\n"
        "index = Index(algorithm='scan', backend='cpu')\n"
        "index.add(1, 'price > 1')\n"
        "write = zipfile.ZipFile.writestr\n"
        "def hang(self, *args, **kwargs):\n"
        "    write(self, *args, **kwargs)\n"
        "    self.fp.flush()\n"
        "    print('writing', flush=True)\n"
        "    time.sleep(600)\n"
        "zipfile.ZipFile.writestr = hang\n"
        "index.save(sys.argv[1])\n")
    child = subprocess.Popen([sys.executable, "-c", script, str(tmp_path / "subs.bexidx")],
                             stdout=subprocess.PIPE, text=True, cwd=os.path.dirname(os.path.dirname(__file__)))
    try:
        assert child.stdout.readline() == "writing\n"
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait()
        child.stdout.close()
    orphans = list(tmp_path.glob(".bexmatch-*.tmp"))
    assert len(orphans) == 1 and not (tmp_path / "subs.bexidx").exists()
    index = Index(algorithm="scan", backend="cpu")
    index.add(2, "price < 1")
    index.save(tmp_path / "other.bexidx")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["other.bexidx"]


def test_live_and_foreign_temp_files_are_left_alone(tmp_path):
    host = socket.gethostname()
    live = tmp_path / f".bexmatch-{host}-{os.getpid()}-00ff.tmp"          # a concurrent save of this process
    foreign = tmp_path / f".bexmatch-elsewhere.example-{_dead_pid()}-00ff.tmp"   # another host's
    stale = tmp_path / f".bexmatch-{host}-{_dead_pid()}-00ff.tmp"
    unrelated = tmp_path / ".bexmatch-notes.tmp"
    for path in (live, foreign, stale, unrelated):
        path.write_bytes(b"partial")
    index = Index(algorithm="scan", backend="cpu")
    index.add(1, "price > 1")
    index.save(tmp_path / "subs.bexidx")
    assert live.exists() and foreign.exists() and unrelated.exists() and not stale.exists()


def test_concurrent_saves_to_one_directory_all_succeed(tmp_path):
    index = Index(algorithm="scan", backend="cpu")
    index.add_many(range(200), [f"price > {i}" for i in range(200)])
    failures = []

    def save(k):
        try:
            for _ in range(5):
                index.save(tmp_path / f"subs{k}.bexidx")
        except Exception as exc:      # collected: a thread's exception would be lost
            failures.append(exc)

    threads = [threading.Thread(target=save, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not failures
    assert sorted(p.name for p in tmp_path.iterdir()) == [f"subs{k}.bexidx" for k in range(4)]
    assert len(Index.load(tmp_path / "subs0.bexidx")) == 200


def test_save_errors_name_the_path_asked_for(tmp_path):
    index = Index(algorithm="scan", backend="cpu")
    index.add(1, "price > 1")
    target = tmp_path / "no-such-directory" / "subs.bexidx"
    with pytest.raises(FileNotFoundError, match="no-such-directory/subs.bexidx"):
        index.save(target)


# ------------------------------------------------- the saved structure
def test_the_saved_structure_is_loaded_as_it_is(saved):
    path, data, expected = saved
    meta, arrays = members(data)
    assert meta["version"] == 2 and meta["matcher"]["algorithm"] == "opindex"
    assert any(name.startswith("matcher.") for name in arrays)
    loaded = Index.load(path)
    assert loaded._state.source.kind == "reuse"          # restored, not built
    assert matches(loaded) == expected


@pytest.mark.parametrize("craft", ["out_of_bounds", "truncated", "wrong_dtype", "missing", "foreign_name"])
def test_a_crafted_structure_is_a_file_error_never_a_kernel_read(saved, tmp_path, craft):
    path, data, expected = saved
    meta, arrays = members(data)
    arrays = dict(arrays)
    if craft == "out_of_bounds":
        arrays["matcher.ent_target"] = arrays["matcher.ent_target"] + 10_000
    elif craft == "truncated":
        arrays["matcher.list_offsets"] = arrays["matcher.list_offsets"][:-1]
    elif craft == "wrong_dtype":
        arrays["matcher.counter_sub"] = arrays["matcher.counter_sub"].astype(np.float32)
    elif craft == "missing":
        del arrays["matcher.run_start"]
    else:
        arrays["matcher.x/../y"] = np.zeros(1)
    bad = tmp_path / "crafted.bexidx"
    bad.write_bytes(rewritten(meta, arrays))
    with pytest.raises(IndexFileError, match="crafted.bexidx"):
        Index.load(bad)


def test_a_version_1_file_without_structure_still_loads(saved, tmp_path):
    path, data, expected = saved
    meta, arrays = members(data)
    old = {k: v for k, v in meta.items() if k not in ("matcher", "strict")}
    old["version"] = 1
    v1 = tmp_path / "v1.bexidx"
    v1.write_bytes(rewritten(old, {k: v for k, v in arrays.items() if not k.startswith("matcher.")}))
    loaded = Index.load(v1)
    assert loaded._state.source.kind == "build" and matches(loaded) == expected
    with pytest.raises(IndexFileError, match="fields"):
        v1.write_bytes(rewritten({**old, "strict": False}, arrays))
        Index.load(v1)


#: expressions past small limits: a DNF of 2^5 terms whose CNF is 5 clauses, one whose CNF is large, a
#: conjunction (never residual), and an XOR
_LIMITED = {1: " AND ".join(f"(c{i} = {i} OR d{i} = {i})" for i in range(5)),
            2: " OR ".join(f"(c{i} = {i} AND d{i} = {i})" for i in range(5)),
            3: "c0 = 0 AND d1 = 1",
            4: "c0 = 0 XOR (d0 = 0 AND c1 = 1)"}


@pytest.mark.parametrize("saved_as, loaded_as", [("opindex", "betree"), ("scan", "psthash"), ("atree", "apcm"),
                                                 ("betree", "opindex"), ("pstbloom", "scan"),
                                                 ("opindex", "atree")])
def test_a_file_loaded_as_another_algorithm_leaves_to_the_residual_matcher_what_that_one_would(
        tmp_path, saved_as, loaded_as):
    """The residual flags a file holds are its own algorithm's: loaded as
    another, an expression within the first's limit but past the second's
    was handed to the second's structure, and every match (and save) raised
    ExpressionTooLarge -- an index unusable.  They are decided again, as an
    index of the second algorithm decides them at ``add``."""
    index = Index(algorithm=saved_as, backend="cpu", dnf_limit=8)
    index.add_many(list(_LIMITED), list(_LIMITED.values()))
    index.save(tmp_path / "i.bexidx")
    fresh = Index(algorithm=loaded_as, backend="cpu", dnf_limit=8)
    fresh.add_many(list(_LIMITED), list(_LIMITED.values()))
    loaded = Index.load(tmp_path / "i.bexidx", algorithm=loaded_as)
    assert loaded.statistics()["residual"] == fresh.statistics()["residual"]
    events = [{"c0": 0, "c1": 1, "c2": 2, "c3": 3, "c4": 4}, {"c0": 0, "d0": 0}, {"d0": 0, "c1": 1},
              {"c0": 0, "d1": 1, "d0": 0, "c1": 1}, {}]
    want = [m.tolist() for m in fresh.match_batch(events)]
    assert [m.tolist() for m in loaded.match_batch(events)] == want
    assert any(want)
    loaded.save(tmp_path / "again.bexidx")
    assert [m.tolist() for m in Index.load(tmp_path / "again.bexidx").match_batch(events)] == want


@pytest.mark.parametrize("algorithm", ["pstbloom", "psthash", "opindex"])
def test_residual_flags_or_a_dnf_limit_the_subscriptions_contradict_are_refused(tmp_path, algorithm):
    """A file whose residual flags (or dnf_limit) say an expression past the
    limit is the algorithm's own: PS-Tree, which saves no structure to check
    them against, loaded it, and every match then raised ExpressionTooLarge
    at the build.  The flags are checked at the load for every algorithm."""
    index = Index(algorithm=algorithm, backend="cpu", dnf_limit=4)
    index.add_many([2, 3], [_LIMITED[2], _LIMITED[3]])         # a DNF of 5 conjunctions: residual here
    index.save(tmp_path / "i.bexidx")
    data = (tmp_path / "i.bexidx").read_bytes()
    meta, arrays = members(data)
    assert arrays["residual"].tolist() == [True, False] and Index.load(tmp_path / "i.bexidx").match(
        {"c0": 0, "d1": 1}).tolist() == [3]
    crafted = tmp_path / "crafted.bexidx"
    for bad_meta, bad_arrays in ((meta, {**arrays, "residual": arrays["residual"][::-1].copy()}),
                                 (meta, {**arrays, "residual": np.zeros(2, bool)}),
                                 ({**meta, "dnf_limit": 64}, arrays)):         # (within 64: native)
        crafted.write_bytes(rewritten(bad_meta, bad_arrays))
        with pytest.raises(IndexFileError, match="crafted.bexidx"):
            Index.load(crafted)


def test_a_cuda_file_s_flags_for_programs_too_deep_for_a_device_thread_load(tmp_path):
    """A cuda index leaves programs deeper than a device thread's stack to
    the residual matcher and saves those flags: the load's check of the
    flags takes them as a cuda index makes them (on cpu too), and refuses
    them in a file saved from a cpu index, which never sets them."""
    from gpu_kernels.scan import MAX_STACK_DEPTH

    wide = " AND ".join(f"w{k} = {k}" for k in range(MAX_STACK_DEPTH + 1))
    index = Index(algorithm="pstbloom", backend="cpu")
    index.add_many([1, 2], [wide, "a = 1"])
    index.save(tmp_path / "i.bexidx")
    meta, arrays = members((tmp_path / "i.bexidx").read_bytes())
    assert "residual" not in arrays
    crafted = tmp_path / "deep.bexidx"
    flags = {**arrays, "residual": np.array([1, 0], np.int8)}
    crafted.write_bytes(rewritten({**meta, "backend": "cuda"}, flags))
    loaded = Index.load(crafted, backend="cpu")
    event = {f"w{k}": k for k in range(MAX_STACK_DEPTH + 1)} | {"a": 1}
    assert loaded.statistics()["residual"] == 1 and loaded.match(event).tolist() == [1, 2]
    crafted.write_bytes(rewritten(meta, flags))
    with pytest.raises(IndexFileError, match="subscription 1 is flagged residual, but pstbloom"):
        Index.load(crafted, backend="cpu")


def test_a_strict_file_loaded_as_an_algorithm_that_refuses_one_of_its_expressions(tmp_path):
    index = Index(algorithm="opindex", backend="cpu", dnf_limit=8, strict=True)
    index.add_many([1, 3], [_LIMITED[1], _LIMITED[3]])              # CNF of 5 clauses: opindex takes it
    index.save(tmp_path / "strict.bexidx")
    with pytest.raises(ExpressionTooLarge, match="subscription 1: .*strict: betree would refuse it"):
        Index.load(tmp_path / "strict.bexidx", algorithm="betree")
    loaded = Index.load(tmp_path / "strict.bexidx", algorithm="scan")
    assert loaded.match({"c0": 0, "c1": 1, "c2": 2, "c3": 3, "c4": 4}).tolist() == [1]


def test_rebuild_builds_the_structure_from_the_subscriptions(tmp_path):
    """The saved structure is checked to be safe to run (bounds, shapes,
    cross-references, each r-node reaching only its own predicates), not to
    be the one the subscriptions build: an A-Tree whose roots were swapped
    between two expressions of the same predicates, its checksums made to
    match again, loads and answers for the wrong subscriptions (swapped
    between expressions of other predicates, it is refused).
    ``rebuild=True`` ignores the saved structure: the answers and the
    updates after are the subscriptions' own."""
    index = Index(algorithm="atree", backend="cpu")
    index.add_many([1, 2, 3], ["a = 1 AND b = 2", "a = 1 OR b = 2", "b = 2 AND c = 3"])
    path = tmp_path / "i.bexidx"
    index.save(path)
    meta, arrays = members(path.read_bytes())
    events = [{"a": 1, "b": 2}, {"c": 3, "b": 2}, {"a": 1}]
    want = [m.tolist() for m in index.match_batch(events)]
    assert want == [[1, 2], [2, 3], [2]]
    for swap, refused in (([2, 1, 0], True), ([1, 0, 2], False)):
        path.write_bytes(rewritten(meta, {**arrays, "matcher.roots": arrays["matcher.roots"][swap]}))
        if refused:
            with pytest.raises(IndexFileError, match="reaches a predicate its expression does not hold"):
                Index.load(path)
        else:
            wrong = Index.load(path)
            assert wrong._state.source.kind == "reuse" and [m.tolist() for m in wrong.match_batch(events)] == \
                [[1, 2], [1, 3], [1]]
        loaded = Index.load(path, rebuild=True)
        assert loaded._state.source.kind != "reuse"
        assert [m.tolist() for m in loaded.match_batch(events)] == want
    loaded.remove(1)
    loaded.remove(3)
    loaded.merge()
    assert [m.tolist() for m in loaded.match_batch(events)] == [[2], [2], [2]]
