"""The public API contract of engine.Index (docs/architecture.md#the-public-api): results, bad
input that changes nothing, ids, persistence."""

from __future__ import annotations

from decimal import Decimal

import numpy as np
import pyarrow as pa
import pytest

import engine
from engine import ALGORITHMS, Index, IndexFileError, ParseError, SchemaError, available_backends
from engine.errors import BackendUnavailable, BadEventError

EVENTS = [
    {"price": 550, "color": "silver", "brand": "a"},
    {"price": 700, "color": "gold"},
    {"color": "silver"},
    {"price": 100.5, "brand": "zz", "flag": True},
    {},
]


@pytest.fixture
def index():
    idx = Index(algorithm="scan", backend="cpu")
    idx.add(7, "price <= 580 AND color = 'silver' AND brand IN ('a', 'b')")
    idx.add(8, "price > 600 OR color LIKE 'sil%'")
    idx.add(9, "NOT (price = 550) AND brand IS NOT NULL")
    idx.add(10, "flag = TRUE XOR price IS NULL")
    return idx


def matches(idx, events=EVENTS):
    return [m.tolist() for m in idx.match_batch(events)]


def test_match_returns_ascending_unique_int64_ids(index):
    result = index.match({"price": 550, "color": "silver", "brand": "a"})
    assert result.dtype == np.int64
    assert result.tolist() == [7, 8]
    assert matches(index) == [[7, 8], [8], [8], [9, 10], []]


def test_arrow_output_lists_event_and_sub_id_pairs(index):
    table = index.match_batch(EVENTS, output="arrow")
    assert table.schema.names == ["event", "sub_id"]
    assert list(zip(table["event"].to_pylist(), table["sub_id"].to_pylist())) == [
        (0, 7), (0, 8), (1, 8), (2, 8), (3, 9), (3, 10)]


def test_arrow_pandas_and_dict_events_agree(index):
    table = pa.table({"price": pa.array([550, 700, None, 100.5, None], pa.float64()),
                      "color": ["silver", "gold", "silver", None, None],
                      "brand": ["a", None, None, "zz", None],
                      "flag": pa.array([None, None, None, True, None], pa.bool_()),
                      "unused": [1, 2, 3, 4, 5]})
    assert matches(index, table) == matches(index)
    assert matches(index, table.to_batches()[0]) == matches(index)
    assert matches(index, table.to_pandas()) == matches(index)


def test_len_contains_remove(index):
    assert len(index) == 4 and 7 in index and 11 not in index and "7" not in index
    index.remove(8)
    assert len(index) == 3 and 8 not in index
    assert matches(index) == [[7], [], [], [9, 10], []]
    with pytest.raises(KeyError):
        index.remove(8)
    with pytest.raises(KeyError):
        index.add(7, "price = 1")
    index.add(8, "color = 'gold'")
    assert matches(index) == [[7], [8], [], [9, 10], []]


@pytest.mark.parametrize("bad", [
    "price = 'cheap'",            # wrong literal family for a known attribute
    "color < 5",
    "price IN (1, 'a')",          # mixed literal types
    "price LIKE 'a%'",            # LIKE on a numeric attribute
    "price = ",                   # syntax
    "price IN ()",
    "price = NaN",
    "price = 1e999",
    "price = 9007199254740993",   # beyond 2**53
    "color MATCHES '('",          # invalid RE2
])
def test_bad_expression_raises_and_leaves_index_unchanged(index, bad):
    before = (len(index), matches(index), dict(index.schema.families), list(index.schema.strings))
    with pytest.raises((ParseError, SchemaError)):
        index.add(99, bad)
    with pytest.raises((ParseError, SchemaError)):
        index.add_many([100, 101], ["color = 'new'", bad])   # the good one is not added either
    assert (len(index), matches(index), dict(index.schema.families), list(index.schema.strings)) == before
    assert 99 not in index and 100 not in index


def test_add_many_refuses_duplicate_ids_and_adds_nothing(index):
    with pytest.raises(KeyError):
        index.add_many([20, 20], ["price = 1", "price = 2"])
    with pytest.raises(KeyError):
        index.add_many([21, 7], ["price = 1", "price = 2"])
    assert 20 not in index and 21 not in index and len(index) == 4


@pytest.mark.parametrize("algorithm", ["scan", "opindex"])
def test_an_id_added_one_by_one_is_refused_again_after_the_delta_is_joined(algorithm):
    """More than 32 single adds join the delta's segments into one; ids
    added in descending order must still be found there: adding one again
    is a KeyError, and removing it removes the subscription."""
    index = Index(algorithm=algorithm, backend="cpu")
    for i in range(40, 0, -1):
        index.add(i, f"x = {i}")
    assert len(index._state.delta) < 40             # (the segments were joined)
    with pytest.raises(KeyError, match="subscription id 30 is already in the index"):
        index.add(30, "x = 1000")
    assert len(index) == 40 and index.match({"x": 1000}).tolist() == []
    index.remove(30)
    assert 30 not in index and index.match({"x": 30}).tolist() == [] and index.match({"x": 29}).tolist() == [29]
    index.add(30, "x = 1000")
    index.merge()
    assert index.ids().tolist() == list(range(1, 41)) and index.match({"x": 1000}).tolist() == [30]


_SHARED_TEXTS = ["x = 'a'", "x = 'a' AND x < 'b'", "x < 'b'"]
_SHARED_EVENTS = [{"x": "a"}, {"x": "B"}]
_SHARED_WANT = [[1, 2, 3], [3]]


def _recoding_merge(index):
    """A merge whose predicate table is the published one (it only drops a
    tombstone, and every predicate is still used), after a string that
    sorts first moved every string code."""
    index.add(4, "x = 'A'")
    index.remove(4)
    index.remove(2)
    index.merge()


@pytest.mark.parametrize("algorithm", ["scan", "opindex", "betree", "apcm", "pstbloom", "psthash", "atree"])
def test_a_merge_never_recodes_a_table_that_other_states_read(algorithm):
    """What a pinned state, and an index made by ``subset``, answer does not
    change when the index they came from merges: a merged segment's table
    is coded as a copy when it is a published one (the main one, or the
    delta's), never in place."""
    index = Index(algorithm=algorithm, backend="cpu")
    index.add_many([1, 2, 3], _SHARED_TEXTS)        # in the delta
    in_delta = index.pinned()
    index.merge()                                   # that segment becomes the main one
    merged = index.pinned()
    subset = index.subset([1, 2, 3])
    _recoding_merge(index)
    subset.add(5, "x = 'zzz'")                      # the subset's own string: its codes move too
    for name, state in (("pinned in the delta", in_delta), ("pinned after the merge", merged),
                        ("subset", subset)):
        assert [m.tolist() for m in state.match_batch(_SHARED_EVENTS)] == _SHARED_WANT, name
    assert [m.tolist() for m in index.match_batch(_SHARED_EVENTS)] == [[1, 3], [3]]


def test_bad_ids_are_type_errors(index):
    with pytest.raises(TypeError):
        index.add("x", "price = 1")
    with pytest.raises(TypeError):
        index.add(1.5, "price = 1")
    with pytest.raises(OverflowError):
        index.add(2 ** 63, "price = 1")


def test_event_of_wrong_family_is_an_error_naming_event_and_attribute(index):
    with pytest.raises(SchemaError, match=r"event 1: attribute 'price'"):
        index.match_batch([{"price": 1}, {"price": "cheap"}])
    with pytest.raises(SchemaError, match="event 0"):
        index.match_batch([{"price": float("nan")}])
    with pytest.raises(SchemaError, match="event 0: attribute 'color'"):
        index.match_batch(pa.table({"color": [1]}))
    # errors="null" treats them as absent: price absent -> `price IS NULL` side of 10 is TRUE
    assert [m.tolist() for m in index.match_batch([{"price": "cheap", "flag": False}], errors="null")] == [[10]]
    with pytest.raises(TypeError):
        index.match_batch({"price": 1})
    with pytest.raises(TypeError):
        index.match([{"price": 1}])


def test_strings_outside_the_dictionary_compare_between_neighbours():
    idx = Index(algorithm="scan", backend="cpu")
    idx.add(1, "s > 'b' AND s < 'd'")
    idx.add(2, "s BETWEEN 'a' AND 'b'")
    idx.add(3, "s >= 'b'")
    got = [m.tolist() for m in idx.match_batch([{"s": v} for v in ["a", "aa", "b", "ba", "c", "d", "é", "", "B"]])]
    assert got == [[2], [2], [2, 3], [1, 3], [1, 3], [3], [3], [], []]


def test_columnar_form_matches_text_form():
    table = pa.table({
        "sub_id": pa.array([1, 1, 2, 3, 3, 4, 5, 6], pa.int64()),
        "attr": ["price", "color", "price", "brand", "price", "color", "flag", "price"],
        "op": ["<=", "=", "between", "in", "is not null", "like", "=", "not in"],
        "value": [580.0, None, 100.0, None, None, None, None, None],
        "value_hi": [None, None, 600.0, None, None, None, None, None],
        "values": pa.array([None, None, None, None, None, None, None, [550.0, 700.0]], pa.list_(pa.float64())),
        "str_value": [None, "silver", None, None, None, "g%", None, None],
        "str_values": pa.array([None, None, None, ["a", "zz"], None, None, None, None], pa.list_(pa.string())),
    })
    # a boolean operand needs a boolean-typed column: give sub 5 its own table
    flags = pa.table({"sub_id": [5], "attr": ["flag"], "op": ["="], "value": [True]})
    table = table.filter(pa.compute.not_equal(table["sub_id"], 5))
    columnar = Index(algorithm="scan", backend="cpu")
    columnar.add_many(table)
    columnar.add_many(flags)
    text = Index(algorithm="scan", backend="cpu")
    text.add_many([1, 2, 3, 4, 5, 6], [
        "price <= 580 AND color = 'silver'", "price BETWEEN 100 AND 600", "brand IN ('a', 'zz') AND price IS NOT NULL",
        "color LIKE 'g%'", "flag = TRUE", "price NOT IN (550, 700)"])
    assert matches(columnar) == matches(text)
    assert matches(text) == [[1, 2, 3], [4], [], [2, 3, 5, 6], []]


@pytest.mark.parametrize("bad_table, message", [
    (pa.table({"sub_id": [1], "attr": ["price"], "op": ["=="], "value": [1.0]}), None),
    (pa.table({"sub_id": [1], "attr": ["price"], "op": ["~"], "value": [1.0]}), "unknown operator"),
    (pa.table({"sub_id": [1], "attr": ["price"], "op": ["="], "str_value": ["x"]}), "'price' is numeric"),
    (pa.table({"sub_id": [1], "attr": ["price"], "op": ["="], "value": [float("nan")]}), "finite"),
    (pa.table({"sub_id": [1], "attr": ["price"], "op": ["between"], "value": [1.0]}), "BETWEEN"),
    (pa.table({"sub_id": [1], "attr": ["price"], "op": ["<"]}), "needs value"),
    (pa.table({"sub_id": [7], "attr": ["price"], "op": ["<"], "value": [1.0]}), "already"),
    # numbers float64 cannot hold as they are: refused, never rounded (2**53 + 1 passed a float64 check)
    (pa.table({"sub_id": [1], "attr": ["price"], "op": ["="], "value": pa.array([2 ** 53 + 1], pa.int64())}),
     "beyond ±2\\*\\*53"),
    (pa.table({"sub_id": [1], "attr": ["price"], "op": ["between"], "value": pa.array([0], pa.int64()),
               "value_hi": pa.array([-(2 ** 53 + 1)], pa.int64())}), "value_hi is beyond"),
    (pa.table({"sub_id": [1], "attr": ["price"], "op": ["in"],
               "values": pa.array([[1, -(2 ** 53 + 1)]], pa.list_(pa.int64()))}), "values holds a number that is beyond"),
    (pa.table({"sub_id": [1], "attr": ["price"], "op": ["="],
               "value": pa.array([Decimal("0.1000000000000000001")], pa.decimal128(38, 19))}), "decimal"),
    (pa.table({"sub_id": [1], "attr": ["price"], "op": ["in"],
               "values": pa.array([[Decimal("9007199254740993")]], pa.list_(pa.decimal128(20, 0)))}), "decimal"),
    # ids past int64 (a cast made them negative) and attribute names that are no strings
    (pa.table({"sub_id": pa.array([2 ** 63], pa.uint64()), "attr": ["price"], "op": ["="], "value": [1.0]}),
     "id 9223372036854775808 does not fit in int64"),
    (pa.table({"sub_id": [1], "attr": pa.array([5], pa.int64()), "op": ["="], "value": [1.0]}),
     "attr must be a string column"),
    # operands the operator does not read were dropped without a word
    (pa.table({"sub_id": [1], "attr": ["price"], "op": ["is null"], "value": [5.0]}), "take no operand"),
    (pa.table({"sub_id": [1], "attr": ["price"], "op": ["in"], "value": [5.0],
               "values": pa.array([[1.0]], pa.list_(pa.float64()))}), "take a list operand only"),
    (pa.table({"sub_id": [1], "attr": ["price"], "op": ["="], "value": [5.0], "value_hi": [9.0]}),
     "value_hi and str_value_hi are for BETWEEN only"),
    (pa.table({"sub_id": [1], "attr": ["color"], "op": ["like"], "str_value": ["x%"], "str_value_hi": ["zz"]}),
     "for BETWEEN only"),
    (pa.table({"sub_id": [1], "attr": ["price"], "op": ["<"], "value": [5.0],
               "values": pa.array([[1.0]], pa.list_(pa.float64()))}), "are for IN, NOT IN"),
])
def test_bad_columnar_rows_raise_and_change_nothing(index, bad_table, message):
    before = (len(index), matches(index), dict(index.schema.families))
    if message is None:   # '==' is accepted as '=' in the columnar form
        index.add_many(bad_table)
        assert 1 in index
        return
    with pytest.raises((SchemaError, KeyError), match=message):
        index.add_many(bad_table)
    assert (len(index), matches(index), dict(index.schema.families)) == before


def test_save_load_round_trip_gives_identical_matches(index, tmp_path):
    index.remove(9)
    path = tmp_path / "subs.bexidx"
    index.save(path)
    loaded = Index.load(path)
    assert matches(loaded) == matches(index)
    assert len(loaded) == len(index) and 9 not in loaded and 7 in loaded
    loaded.add(11, "color = 'gold' AND price > 5")   # a loaded index stays updatable
    assert matches(loaded) == [[7, 8], [8, 11], [8], [10], []]
    assert not list(tmp_path.glob(".bexmatch-*")), "no temp file left behind"


def test_truncated_corrupt_and_foreign_files_are_refused(index, tmp_path):
    path = tmp_path / "subs.bexidx"
    index.save(path)
    data = path.read_bytes()
    for name, content in [("truncated", data[: len(data) // 2]), ("empty", b""), ("foreign", b"PK\x03\x04hello"),
                          ("text", b"not an index at all\n")]:
        bad = tmp_path / name
        bad.write_bytes(content)
        with pytest.raises(IndexFileError):
            Index.load(bad)
    # one flipped byte inside an array is caught by the checksums
    flipped = bytearray(data)
    at = data.index(b"NUMPY", data.index(b"sub_ids.npy")) + 120
    flipped[at] ^= 0xFF
    (tmp_path / "flipped").write_bytes(bytes(flipped))
    with pytest.raises(IndexFileError):
        Index.load(tmp_path / "flipped")
    with pytest.raises(FileNotFoundError):
        Index.load(tmp_path / "missing")


def test_save_is_atomic_when_writing_fails(index, tmp_path, monkeypatch):
    path = tmp_path / "subs.bexidx"
    index.save(path)
    before = path.read_bytes()

    def broken(*args, **kwargs):
        raise OSError("disk full")

    monkeypatch.setattr(np, "save", broken)
    with pytest.raises(OSError):
        index.save(path)
    assert path.read_bytes() == before
    assert not list(tmp_path.glob(".bexmatch-*"))


def test_algorithms_and_backends_are_named_and_refused_clearly():
    # only what exists is listed: a planned algorithm is an unknown one until it is registered
    assert set(ALGORITHMS) == {"scan", "opindex", "betree", "apcm", "pstbloom", "psthash", "atree"}
    assert "cpu" in available_backends()
    for planned in ("nope", "pst-tree"):
        with pytest.raises(BackendUnavailable, match=f"unknown algorithm '{planned}'; algorithms are ") as caught:
            Index(algorithm=planned)
        listed = str(caught.value).split("algorithms are ", 1)[1]
        assert {name.strip() for name in listed.split(",")} == set(ALGORITHMS)
    with pytest.raises(BackendUnavailable, match="unknown backend"):
        Index(backend="tpu")
    for algorithm in ALGORITHMS:
        idx = Index(algorithm=algorithm, backend="cpu")
        idx.add(1, "a = 1")
        assert idx.match({"a": 1}).tolist() == [1]


def test_cuda_backend_without_gpu_or_simulator_names_what_is_missing(monkeypatch):
    monkeypatch.delenv("NUMBA_ENABLE_CUDASIM", raising=False)
    engine.backend._cuda_missing.cache_clear()
    try:
        if "cuda" in available_backends():
            pytest.skip("this machine has a usable GPU")   # the error path cannot be provoked here
        with pytest.raises(BackendUnavailable, match="backend 'cuda' is not available here: .+"):
            Index(backend="cuda")
    finally:
        engine.backend._cuda_missing.cache_clear()


def test_dnf_limit_and_schema_declarations():
    idx = Index(algorithm="scan", backend="cpu", schema={"price": "numeric", "tag": "string"})
    with pytest.raises(SchemaError):
        idx.add(1, "tag = 5")
    with pytest.raises(SchemaError):
        Index(schema={"x": "colour"})


def test_ids_and_subset_split_an_index_without_changing_answers(index):
    index.remove(9)
    assert index.ids().tolist() == [7, 8, 10]
    part = index.subset([10, 7])
    assert part.ids().tolist() == [7, 10] and 8 not in part
    full = matches(index)
    assert matches(part) == [[i for i in row if i in (7, 10)] for row in full]
    with pytest.raises(KeyError):
        index.subset([9])
    part.add(8, "price > 0")   # a subset is an independent index
    assert 8 in part and matches(index) == full


@pytest.mark.parametrize("ids, error", [([7.9], TypeError), ([True], TypeError), (["7"], TypeError),
                                        ([np.float64(7)], TypeError), ([2 ** 64], OverflowError),
                                        ([np.uint64(2 ** 64 - 1)], OverflowError),
                                        (np.array([2 ** 64 - 1], np.uint64), OverflowError)],
                         ids=["float", "bool", "str", "np.float64", "2**64", "np.uint64", "uint64 array"])
def test_subset_takes_ids_as_add_does(index, ids, error):
    """An id subset() is given is checked as add() checks it: 7.9 is not taken for 7, True for 1."""
    before = index.ids().tolist()
    with pytest.raises(error):
        index.subset(ids)
    assert index.ids().tolist() == before
    assert index.subset(np.array([7, 10], np.uint32)).ids().tolist() == [7, 10]
    assert index.subset(iter([np.int64(10)])).ids().tolist() == [10]


def test_split_takes_an_int_number_of_shards(index):
    for shards in (2.5, True, "2"):
        with pytest.raises(TypeError, match="shards must be an int"):
            index.split(shards)
    assert [part.ids().tolist() for part in index.split(np.int64(2))] == [[7, 8], [9, 10]]


def test_constructor_arguments_of_the_wrong_type_say_what_is_taken():
    with pytest.raises(TypeError, match="schema is a mapping of attribute name to type family"):
        Index(schema=[("price", "numeric")])
    with pytest.raises(TypeError, match="options of algorithm 'opindex' are a mapping of option name to value"):
        Index(algorithm="opindex", backend="cpu", options=[1])


def test_unknown_algorithm_options_are_refused():
    with pytest.raises(TypeError, match="takes no option"):
        Index(algorithm="scan", backend="cpu", options={"segments": 4})


def test_arrow_numbers_read_from_buffers_equal_the_dict_path():
    """Numeric columns are read straight from their Arrow buffers: sliced
    arrays (offsets inside a bitmap byte), several chunks, narrow int and
    float types, all-null columns -- the same batch as from dicts; bad
    numbers raise or (errors="null") become absent, as on the dict path."""
    from engine import events as event_batches
    from engine.schema import Schema

    rng = np.random.default_rng(3)
    n = 45
    cols = {"i64": pa.array([int(v) if rng.random() < 0.3 else None for v in rng.integers(-9, 9, n)], pa.int64()),
            "i8": pa.array([int(v) if rng.random() < 0.6 else None for v in rng.integers(-9, 9, n)], pa.int8()),
            "f32": pa.array([float(v) if rng.random() < 0.5 else None for v in rng.random(n)], pa.float32()),
            "f64": pa.array([None] * n, pa.float64()),
            "dense": pa.array(rng.random(n), pa.float64())}
    table = pa.table(cols).slice(3, 40)                      # offsets that are not byte-aligned
    chunked = pa.concat_tables([table.slice(0, 13), table.slice(13)])
    schema = Schema()
    for name in cols:
        schema.declare(name, "numeric")
    dicts = [{k: v for k, v in row.items() if v is not None} for row in table.to_pylist()]
    want = event_batches.from_dicts(dicts, schema)
    for t in (table, chunked):
        got = event_batches.from_arrow(t, schema)
        assert got.offsets.tolist() == want.offsets.tolist() and got.attr.tolist() == want.attr.tolist()
        assert np.array_equal(got.value, want.value)
    bad = pa.table({"i64": pa.array([1, 2 ** 60, None], pa.int64()), "f64": pa.array([0.5, None, float("nan")])})
    with pytest.raises(SchemaError, match="i64"):
        event_batches.from_arrow(bad, schema)
    kept = event_batches.from_arrow(bad, schema, errors="null")
    assert kept.offsets.tolist() == [0, 2, 2, 2] and kept.value.tolist() == [1.0, 0.5]


def test_event_attribute_order_is_lexsorts_stable_order():
    """The one-key stable sort that orders event entries gives exactly
    ``np.lexsort((attr, event))`` -- repeated (event, attribute) pairs kept
    in their input order, which is how a map's last repeated key wins --
    for entries arriving event by event (maps) and column by column (wide)."""
    from engine.events import _event_attr_order
    rng = np.random.default_rng(3)
    for n, by_event in ((0, True), (1, True), (500, True), (500, False), (5000, False)):
        event = rng.integers(0, 40, n)
        if by_event:
            event.sort()
        attr = rng.integers(0, 7, n).astype(np.int32)
        assert _event_attr_order(event, attr).tolist() == np.lexsort((attr, event)).tolist()


def test_map_columns_hold_sparse_events_by_attribute_name():
    """A ``map<string, V>`` column gives attributes by name (Spark's map
    layout): the same answers as dicts; null maps, null values and unknown
    keys are absent; a key repeated in one map: the last one wins; sliced
    and chunked map columns; wrong families raise or (errors="null") drop."""
    idx = Index(algorithm="opindex", backend="cpu", schema={"s": "string", "flag": "boolean"})
    idx.add_many([1, 2, 3, 4, 5], ["a > 1 AND s = 'x'", "a IS NULL OR s LIKE 'y%'", "flag = TRUE",
                                   "z IS NOT NULL", "a BETWEEN 0 AND 2 AND flag = FALSE"])
    idx.merge()
    dicts = [{"a": 5, "s": "x"}, {"s": "yes"}, {"a": 0, "flag": True}, {"z": 3}, {"a": 2, "flag": False}, {}]
    want = [m.tolist() for m in idx.match_batch(dicts)]
    nums = pa.array([[("a", 5)], [], [("a", 9), ("a", 0)], [("z", 3), ("unknown", 1)], [("a", 2)], None],
                    pa.map_(pa.string(), pa.int64()))
    strs = pa.array([[("s", "x")], [("s", "yes")], None, [], [("s", None)], []], pa.map_(pa.string(), pa.string()))
    bools = pa.array([[], [], [("flag", True)], [], [("flag", False)], []], pa.map_(pa.string(), pa.bool_()))
    table = pa.table({"n": nums, "s_map": strs, "b": bools})
    assert [m.tolist() for m in idx.match_batch(table)] == want
    chunked = pa.concat_tables([table.slice(0, 3), table.slice(3)])
    assert [m.tolist() for m in idx.match_batch(chunked)] == want
    assert [m.tolist() for m in idx.match_batch(table.slice(2, 3))] == want[2:5]
    # wrong families and bad numbers
    wrong = pa.table({"m": pa.array([[("a", "text")]], pa.map_(pa.string(), pa.string()))})
    with pytest.raises(SchemaError, match="event 0: attribute 'a' is numeric"):
        idx.match_batch(wrong)
    assert [m.tolist() for m in idx.match_batch(wrong, errors="null")] == [[2]]
    huge = pa.table({"m": pa.array([[("a", 2 ** 60)]], pa.map_(pa.string(), pa.int64()))})
    with pytest.raises(SchemaError, match="attribute 'a'"):
        idx.match_batch(huge)
    twice = pa.table({"a": pa.array([1.0]), "m": pa.array([[("a", 2.0)]], pa.map_(pa.string(), pa.float64()))})
    with pytest.raises(ValueError, match="attribute 'a' is given twice"):
        idx.match_batch(twice)
    listed = pa.table({"m": pa.array([[("a", [1])]], pa.map_(pa.string(), pa.list_(pa.int64())))})
    with pytest.raises(BadEventError, match="event 0: attribute 'a' is numeric, got \\[1\\]"):
        idx.match_batch(listed)          # (a list in a map is a list attribute's value: not a's)
    # values of a type no family takes: wrong for an attribute of a family (as in a column of their own),
    # present for one whose family is not fixed, and nothing to the keys that are no attributes
    structs = pa.array([[("a", {"x": 1})], [("z", {"x": 2}), ("unknown", {"x": 3})], [("a", {"x": 4})]],
                       pa.map_(pa.string(), pa.struct([("x", pa.int64())])))
    nested = pa.table({"m": structs})
    with pytest.raises(BadEventError, match="event 0: attribute 'a' is numeric, got \\{'x': 1\\}"):
        idx.match_batch(nested)
    assert [m.tolist() for m in idx.match_batch(nested, errors="null")] == [[2], [2, 4], [2]]
    results, rejected = idx.match_batch(nested, errors="report")
    assert [m.tolist() for m in results] == [[], [2, 4], []] and [e.event for e in rejected] == [0, 2]
    assert [m.tolist() for m in idx.match_batch(nested.slice(1, 1))] == [[2, 4]]


def test_a_repeated_key_whose_last_value_is_null_leaves_its_attribute_absent():
    """The last entry of a key repeated in one map counts even when its value is null (Spark's LAST_WIN
    keeps the null): the attribute is absent, the earlier value does not stand. So too when the last value is
    refused (a string that is not valid UTF-8, errors="null")."""
    idx = Index(algorithm="scan", backend="cpu")
    idx.add_many([1, 2, 3], ["n0 IS NULL", "n0 = 3", "s = 'x'"])
    nums = pa.array([[("n0", 3.0), ("n0", None)], [("n0", None), ("n0", 3.0)], [("n0", 3.0)]],
                    pa.map_(pa.string(), pa.float64()))
    assert [m.tolist() for m in idx.match_batch(pa.table({"m": nums}))] == [[1], [2], [2]]
    strs = pa.array([[("s", "x"), ("s", "y")], [("s", "x"), ("s", "y")]], pa.map_(pa.string(), pa.string()))
    items = pa.array(["x", "y", "x", "y"], pa.binary()).to_pylist()
    items[3] = b"\xff"                                      # event 1's last s: not valid UTF-8
    bad = pa.MapArray.from_arrays(strs.offsets, strs.keys, pa.array(items, pa.binary()).view(pa.string()))
    with pytest.raises(BadEventError, match="event 1: attribute 's' holds a string that is not valid UTF-8"):
        idx.match_batch(pa.table({"m": bad}))
    assert [m.tolist() for m in idx.match_batch(pa.table({"m": bad}), errors="null")] == [[1], [1]]


def test_map_columns_follow_families_fixed_later():
    """An attribute first seen in IS NULL (no family yet) takes any value in
    a map; once a predicate fixes its family, a value of another family is
    refused (the schema's cached attribute arrays follow the change)."""
    idx = Index(algorithm="scan", backend="cpu")
    idx.add(1, "a IS NOT NULL")
    event = pa.table({"m": pa.array([[("a", "text")]], pa.map_(pa.string(), pa.string()))})
    assert [m.tolist() for m in idx.match_batch(event)] == [[1]]
    idx.add(2, "a > 1")
    with pytest.raises(SchemaError, match="attribute 'a' is numeric"):
        idx.match_batch(event)
    idx.add(3, "b = 'x'")                      # a new attribute reaches the map lookup too
    both = pa.table({"m": pa.array([[("a", "5"), ("b", "x")]], pa.map_(pa.string(), pa.string()))})
    assert [m.tolist() for m in idx.match_batch(both, errors="null")] == [[3]]


def test_columnar_form_refuses_an_invalid_regex_as_the_text_route_does():
    # accepted once, it made every later match of an event with that attribute raise re2's own error
    idx = Index(algorithm="scan", backend="cpu")
    bad = pa.table({"sub_id": [1, 2], "attr": ["a", "b"], "op": ["=", "matches"], "str_value": ["x", "a(b"]})
    with pytest.raises(SchemaError, match=r"row 1 \(sub_id 2, attribute 'b'\): invalid RE2 pattern 'a\(b'"):
        idx.add_many(bad)
    with pytest.raises(ParseError, match="invalid RE2 pattern"):
        idx.add(2, "b MATCHES 'a(b'")
    assert len(idx) == 0 and idx.match({"b": "a(b"}).tolist() == []
    idx.add_many(pa.table({"sub_id": [2], "attr": ["b"], "op": ["matches"], "str_value": ["a.b"]}))
    assert idx.match({"b": "zaxbz"}).tolist() == [2]


def test_a_like_pattern_re2_cannot_compile_is_refused_by_every_route():
    """A LIKE pattern of 120,000 characters is past RE2's program budget:
    accepted once, every later match of an event carrying the attribute
    raised re2's own error (for every subscription), and the saved index
    could not be loaded.  Text, AST, columnar and rules routes refuse it;
    the index is unchanged and still matches."""
    from engine import rules_to_columnar
    from engine.expr import Op, Pred

    pattern = "a%" * 60000
    idx = Index(algorithm="opindex", backend="cpu")
    idx.add(1, "s = 'x'")
    with pytest.raises(ParseError, match="LIKE pattern 'a%a%a%.*does not compile to RE2: pattern too large"):
        idx.add(2, f"s LIKE '{pattern}'")
    with pytest.raises(ParseError, match="LIKE pattern 'a%a%a%.* on 's' does not compile to RE2"):
        idx.add(2, Pred("s", Op.NOT_LIKE, (pattern,)))
    with pytest.raises(SchemaError, match=r"row 0 \(sub_id 2, attribute 's'\): LIKE pattern 'a%a%.*does not compile"):
        idx.add_many(pa.table({"sub_id": [2], "attr": ["s"], "op": ["like"], "str_value": [pattern]}))
    with pytest.raises(SchemaError, match="does not compile to RE2"):
        idx.add_many(rules_to_columnar(pa.table({"rule": [2], "s": [pattern]}), id_column="rule",
                                       columns={"s": "like"}))
    assert len(idx) == 1 and idx.match({"s": "x"}).tolist() == [1]
    idx.add(3, "s LIKE '" + "a%" * 2000 + "'")          # long, within the budget: taken
    assert idx.match({"s": "a" * 2000}).tolist() == [3]


@pytest.mark.parametrize("unit", ["%", "_", "a%", "%_", "\U0010ffff", "\\", ".", "(", "é%"])
def test_a_like_pattern_short_enough_to_go_unchecked_always_compiles(unit):
    """The dependency edge ``pattern_error`` relies on: RE2 compiles the
    translation of any LIKE pattern of ``LIKE_ALWAYS_COMPILES`` characters
    (so patterns that short are not compiled when added); a LIKE pattern
    matches its own text."""
    import re2

    from engine.expr import LIKE_ALWAYS_COMPILES, QUIET_RE2, like_to_regex

    pattern = (unit * LIKE_ALWAYS_COMPILES)[:LIKE_ALWAYS_COMPILES]
    assert re2.compile(like_to_regex(pattern), QUIET_RE2).fullmatch(pattern) is not None    # (it matches itself)


def test_columnar_decimals_are_converted_exactly():
    """Arrow's decimal -> float64 cast made Decimal('0.1') 0.09999999999999999
    in a decimal128(38, 19) column, so ``price = 0.1`` never matched 0.1; the
    columnar form and the rules table convert decimals as events do."""
    from engine import rules_to_columnar
    table = pa.table({"sub_id": [1, 2], "attr": ["price", "price"], "op": ["=", "in"],
                      "value": pa.array([Decimal("0.1"), None], pa.decimal128(38, 19)),
                      "values": pa.array([None, [Decimal("0.3"), Decimal("2.675")]], pa.list_(pa.decimal128(38, 19)))})
    index = Index(algorithm="scan", backend="cpu")
    index.add_many(table)
    assert [index[1], index[2]] == ["price = 0.1", "price IN (0.3, 2.675)"]
    assert [m.tolist() for m in index.match_batch([{"price": 0.1}, {"price": 0.3}, {"price": 2.675}])] == \
        [[1], [2], [2]]
    rules = pa.table({"rule_id": [1, 2], "price": pa.array([Decimal("0.1"), Decimal("2.675")], pa.decimal128(38, 19))})
    index = Index(algorithm="scan", backend="cpu")
    index.add_many(rules_to_columnar(rules))
    assert index.match({"price": 0.1}).tolist() == [1] and index.match({"price": 2.675}).tolist() == [2]
    with pytest.raises(SchemaError, match="rule 4, column 'price': the decimal 0.1000000000000000001"):
        rules_to_columnar(pa.table({"rule_id": [4], "price": pa.array([Decimal("0.1000000000000000001")],
                                                                       pa.decimal128(38, 19))}))
    with pytest.raises(SchemaError, match="rule id 9223372036854775815 does not fit|does not fit in int64"):
        rules_to_columnar(pa.table({"rule_id": pa.array([2 ** 63 + 7], pa.uint64()), "price": [1]}))


def test_names_no_expression_can_use_are_refused_in_tables_and_declarations():
    """An empty attribute name in the columnar form was taken (and the index
    could not print its subscription); declarations took '', 5 and a lone
    surrogate."""
    index = Index(algorithm="scan", backend="cpu")
    with pytest.raises(SchemaError, match="row 0 \\(sub_id 1\\): an empty attribute name"):
        index.add_many(pa.table({"sub_id": [1], "attr": [""], "op": ["="], "value": [1.0]}))
    bad = pa.array([b"\xff"], pa.binary()).view(pa.string())
    with pytest.raises(SchemaError, match="the attr column is not valid UTF-8"):
        index.add_many(pa.table({"sub_id": [1], "attr": bad, "op": ["="], "value": [1.0]}))
    # string operands too (they raised a raw UnicodeDecodeError)
    for column, op, operand in (("str_value", "=", bad), ("str_value", "like", bad),
                                ("str_values", "in", pa.ListArray.from_arrays([0, 1], bad))):
        with pytest.raises(SchemaError, match=f"the {column} column is not valid UTF-8"):
            index.add_many(pa.table({"sub_id": [1], "attr": ["s"], "op": [op], column: operand}))
    assert len(index) == 0
    for name in ("", 5, "\ud800"):
        with pytest.raises(SchemaError, match="a declared attribute"):
            Index(schema={name: "numeric"})


def test_numpy_literals_in_an_ast_print_and_evaluate_as_their_values():
    """``to_text`` wrote a NumPy float64 literal as ``np.float64(1.5)``, which
    does not parse, and the reference evaluator gave NumPy booleans."""
    from engine.expr import Op, Pred
    from engine.parse import parse, to_text
    from engine.reference import evaluate
    node = Pred("a", Op.EQ, (np.float64(1.5),))
    assert to_text(node) == "a = 1.5" and parse(to_text(node)) == Pred("a", Op.EQ, (1.5,))
    assert to_text(Pred("s", Op.EQ, (np.str_("x'y"),))) == "s = 'x''y'"
    assert evaluate(node, {"a": 1.5}) is True and evaluate(node, {"a": np.float64(2.5)}) is False


def test_add_many_without_expressions_takes_a_table_and_says_so():
    idx = Index(algorithm="scan", backend="cpu")
    with pytest.raises(TypeError, match=r"takes the columnar form .* not list; texts and ASTs go as "
                                        r"add_many\(ids, expressions\)"):
        idx.add_many([2, 3])
    assert len(idx) == 0


def test_load_refuses_an_empty_algorithm_or_backend_name(tmp_path):
    """``""`` is no algorithm's name: it was taken as "the saved one"."""
    idx = Index(algorithm="scan", backend="cpu")
    idx.add(1, "a = 1")
    idx.save(tmp_path / "x.bexidx")
    with pytest.raises(BackendUnavailable, match="unknown algorithm ''"):
        Index.load(tmp_path / "x.bexidx", algorithm="")
    with pytest.raises(BackendUnavailable, match="unknown backend ''"):
        Index.load(tmp_path / "x.bexidx", backend="")


def test_a_schema_read_from_an_index_declares_another():
    """``dict(index.schema)`` lists an attribute only IS [NOT] NULL used as
    None, which ``Index(schema=...)`` refused as an unknown family."""
    idx = Index(algorithm="scan", backend="cpu")
    idx.add_many([1, 2], ["a IS NULL", "b = 'x'"])
    assert dict(idx.schema) == {"a": None, "b": "string"}
    copy = Index(algorithm="scan", backend="cpu", schema=dict(idx.schema))
    assert dict(copy.schema) == dict(idx.schema)
    copy.add(1, "a > 5")                    # the first literal fixes the family, as in the original
    assert dict(copy.schema) == {"a": "numeric", "b": "string"}
    with pytest.raises(SchemaError, match="unknown type family 'none'"):
        Index(schema={"a": "none"})


@pytest.mark.parametrize("algorithm", [name for name in ALGORITHMS if name != "scan"])
def test_a_new_string_recodes_the_built_structure_never_builds_it_again(algorithm, monkeypatch):
    """An add that brings strings new to the dictionary -- before, between
    and after the indexed ones: the codes of every main predicate above
    them move -- is matched from the delta, and the main structure is
    recoded for the next match, never built again (a build costs 10-100x a
    match; PS-Tree's was) -- and the units of the AND-only indexes are not
    rewritten again, only their codes mapped; answers are scan's, on events holding the old
    strings, the new ones and strings of neither, round after round."""
    from engine.algorithms import registry
    from tests.strategies import realistic_strings, string_subscription

    rng = np.random.default_rng(len(algorithm))
    words = realistic_strings(rng, 50)
    subs = {i: string_subscription(rng, words) for i in range(300)}
    index, scan = Index(algorithm=algorithm, backend="cpu"), Index(algorithm="scan", backend="cpu")
    for target in (index, scan):
        target.add_many(list(subs), list(subs.values()))
        target.merge()
    index.match({})                                   # built
    cls = registry.get(algorithm).matcher_class("cpu")
    monkeypatch.setattr(cls, "build", classmethod(lambda *a: pytest.fail("built again")))
    if algorithm in ("betree", "apcm", "pstbloom", "psthash"):     # nor rewritten to units again: mapped
        from engine.algorithms import betree, pstree
        for module in (betree, pstree):
            monkeypatch.setattr(module, "dnf_units", lambda *a: pytest.fail("units read again"))
    if algorithm == "atree":                                         # the DAG's arrays kept, not flattened again
        from engine.algorithms import atree
        monkeypatch.setattr(atree, "flatten", lambda *a, **k: pytest.fail("flattened again"))
    if algorithm == "apcm":                                          # the bitmap layout mapped, not carried over
        from engine.algorithms import apcm
        monkeypatch.setattr(apcm, "carried_layout", lambda *a: pytest.fail("layout carried over"))

    def event(ws):
        return {"s": str(rng.choice(ws)), "t": str(rng.choice(ws)), "n": int(rng.integers(7))}
    events = [event(words) for _ in range(60)] + [{}]
    for round_ in range(3):
        fresh = realistic_strings(rng, 10)
        added = {1000 * (round_ + 1) + k: string_subscription(rng, fresh + words[:4]) for k in range(8)}
        for target in (index, scan):
            target.add_many(list(added), list(added.values()))
        events += [event(fresh) for _ in range(20)] + [{"s": w + "\x00", "t": w[:-1]} for w in fresh[:4]]
        got = [m.tolist() for m in index.match_batch(events)]
        assert got == [m.tolist() for m in scan.match_batch(events)]
        words += fresh
    assert sum(map(len, got)) > 50 and [] in got
