"""Event input (engine.events): exact string tokens, the one value rule of
every input form (dicts, Arrow tables and map columns, pandas DataFrames),
and LIKE/MATCHES evaluated per distinct value of the pattern's attribute."""

from __future__ import annotations

import time
import uuid
from decimal import Decimal

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from engine import Index, SchemaError
from engine import events as event_batches
from engine.errors import BadEventError
from engine.parse import parse
from engine.reference import like
from engine.reference import matches as reference_matches
from engine.schema import Schema

# Strings NumPy's StringDType got wrong (numpy issue 31533: 16 bytes or
# more, embedded NUL) and their neighbours in code-point order.
HARD_STRINGS = (["https://example.com/a", "https://example.com/b", "https://example.com/", "https://example.com/aa",
                 "a\x00b", "a\x00c", "a\x00", "a", "\x00", "", "é", "e\u0301", "日本語のテキスト、十六バイトより長い",
                 "x" * 15, "x" * 16, "x" * 17, "x" * 16 + "\x00", "😀", "\U0010ffff"]
                + [str(uuid.UUID(int=(7919 * k) << 64 | k)) for k in range(100)])


def _events(form: str, column: str, values: list, arrow_type=None):
    """One event per value (None = absent) as dicts, an Arrow table, a
    pandas DataFrame (an object column) or a ``map<string, V>`` column."""
    if form == "dicts":
        return [{} if v is None else {column: v} for v in values]
    if form == "pandas":
        return pd.DataFrame({column: pd.Series(values, dtype=object)})
    array = pa.array(values, arrow_type)
    if form == "arrow":
        return pa.table({column: array})
    assert form == "map"
    return pa.table({"attrs": pa.array([[] if v is None else [(column, v)] for v in values],
                                       pa.map_(pa.string(), array.type))})


def _plain(value):
    """``value`` as the reference evaluator takes it (Python scalars)."""
    if isinstance(value, Decimal):
        return float(value)
    return value.item() if isinstance(value, np.generic) else value


# ------------------------------------------------------------------ strings
@pytest.mark.parametrize("form", ["dicts", "arrow", "pandas", "map"])
def test_every_distinct_string_gets_its_own_token(form):
    """Tokens index the batch's distinct strings exactly: long strings,
    long shared prefixes, embedded NULs, the empty string, non-ASCII."""
    schema = Schema()
    schema.declare("s", "string")
    values = HARD_STRINGS + HARD_STRINGS[::-1]
    batch = event_batches.encode_events(_events(form, "s", values), schema)
    assert batch.strings.type == pa.large_string()
    assert sorted(batch.strings.to_pylist()) == sorted(set(HARD_STRINGS))
    assert batch.token.dtype == np.int32
    assert [batch.strings[int(t)].as_py() for t in batch.token] == values


@pytest.mark.parametrize("form", ["dicts", "arrow", "pandas", "map"])
def test_hard_strings_match_as_the_reference_says(form):
    """Equality, order and LIKE on the hard strings, through every input
    form, give the reference evaluator's answers."""
    texts = ["s = 'https://example.com/a'", "s < 'https://example.com/b'", "s LIKE '%/b'", "s = 'a\x00b'",
             "s > 'a\x00b' AND s < 'a\x00d'", "s = ''", "s LIKE 'x_______________'", "s >= 'x' AND s < 'y'",
             f"s = '{HARD_STRINGS[-1]}'", f"s BETWEEN '{HARD_STRINGS[-40]}' AND '{HARD_STRINGS[-20]}'",
             "s MATCHES '^a\\x00[bc]$'", "s LIKE '%c'", "s = 'é'", "s LIKE '_'"]
    idx = Index(algorithm="scan", backend="cpu", schema={"s": "string"})
    idx.add_many(range(len(texts)), texts)
    want = [[i for i, t in enumerate(texts) if reference_matches(parse(t), {"s": v})] for v in HARD_STRINGS]
    got = [m.tolist() for m in idx.match_batch(_events(form, "s", HARD_STRINGS))]
    assert got == want


def test_every_arrow_string_layout_reads_the_same_strings():
    """string, large_string and string_view columns, dictionaries of each
    (chunked, unused entries, null indices) and map values of each: the
    same answers.  (Dictionaries and maps of string views raised pyarrow's
    ArrowNotImplementedError: no take kernel reads string views.)"""
    values = ["a", None, "b", "https://example.com/" + "x" * 300, "a"]
    index = Index(algorithm="scan")
    index.add_many([1, 2, 3], ["s = 'a'", "s IS NULL", "s > 'https://example.com/'"])
    want = [[1], [2], [], [3], [1]]
    for strings in (pa.string(), pa.large_string(), pa.string_view()):
        dictionary = pa.array(["unused", "b", "a", "https://example.com/" + "x" * 300], strings)
        indices = [2, None, 1, 3, 2]
        coded = pa.DictionaryArray.from_arrays(pa.array(indices, pa.int32()), dictionary)
        chunked = pa.chunked_array([coded[:2], coded[2:]])
        maps = pa.array([[] if v is None else [("s", v)] for v in values], pa.map_(pa.string(), strings))
        for table in (pa.table({"s": pa.array(values, strings)}), pa.table({"s": coded}), pa.table({"s": chunked}),
                      pa.table({"m": maps})):
            assert [m.tolist() for m in index.match_batch(table)] == want, (strings, table.schema)


def test_lone_surrogates_are_schema_errors_naming_event_and_attribute():
    """A str with a lone surrogate has no UTF-8 form: a SchemaError naming
    the event and the attribute (dicts, pandas object columns), or absent
    with errors="null" -- never a UnicodeEncodeError or ArrowInvalid."""
    idx = Index(algorithm="scan", backend="cpu")
    idx.add_many([1, 2, 3], ["s = 'a'", "s IS NULL", "t IS NOT NULL"])
    values = ["a", "ok", "x\ud800y", "\udfff"]
    for events in (_events("dicts", "s", values), _events("pandas", "s", values)):
        with pytest.raises(SchemaError, match=r"^event 2: attribute 's' .*surrogate"):
            idx.match_batch(events)
        assert [m.tolist() for m in idx.match_batch(events, errors="null")] == [[1], [], [2], [2]]
    # an attribute only IS [NOT] NULL reads is present whatever its value; an unused one is ignored
    assert [m.tolist() for m in idx.match_batch([{"t": "\ud800", "u": "\ud800"}])] == [[2, 3]]
    assert [m.tolist() for m in idx.match_batch(pd.DataFrame({"t": ["\ud800"], "u": ["\ud800"]}))] == [[2, 3]]


# ------------------------------------------------------------ one value rule
DECIMALS = [Decimal("19.99"), Decimal("0.1000000000000000001"), Decimal(2 ** 53), Decimal(2 ** 53 + 1),
            Decimal("-7.5"), None, Decimal("-0.00"), Decimal("1E-300")]
#: float64 would change them (a neighbour shares their float64), or beyond ±2**53
DECIMAL_REFUSED = (Decimal("0.1000000000000000001"), Decimal(2 ** 53 + 1))


@pytest.mark.parametrize("form", ["dicts", "arrow", "arrow256", "pandas", "map"])
@pytest.mark.parametrize("errors", ["raise", "null"])
def test_decimals_follow_one_rule_in_every_form(form, errors):
    """A decimal is a number when float64 holds it as it is (it reads back
    unchanged from its float64, within ±2**53; 1E-300 does, 0.1 plus
    1E-19 does not): then it compares like the float literal with the same
    digits; any other decimal is a wrong value, never rounded silently."""
    texts = ["x = 19.99", "x > 0", "x IS NULL", "x < 0", "x = 9007199254740992", "x = 0"]
    idx = Index(algorithm="scan", backend="cpu")
    idx.add_many(range(len(texts)), texts)
    arrow_types = {"arrow": pa.decimal128(38, 19), "map": pa.decimal128(38, 19), "arrow256": pa.decimal256(76, 40)}
    values = DECIMALS[:-1] if form in arrow_types else DECIMALS    # 1E-300: beyond these Arrow scales
    events = _events("arrow" if form == "arrow256" else form, "x", values, arrow_types.get(form))
    if errors == "raise":
        with pytest.raises(SchemaError, match=r"^event 1: attribute 'x' is numeric, got Decimal\('0\.10*1"):
            idx.match_batch(events)
        return
    kept = [None if v in DECIMAL_REFUSED else v for v in values]
    want = [[i for i, t in enumerate(texts) if reference_matches(parse(t), {} if v is None else {"x": float(v)})]
            for v in kept]
    assert [m.tolist() for m in idx.match_batch(events, errors="null")] == want


@pytest.mark.parametrize("arrow_type", [pa.decimal32(9, 2), pa.decimal64(18, 2)], ids=str)
def test_narrow_arrow_decimals_read_as_wide_ones(arrow_type):
    """decimal32 and decimal64 columns, map values and list elements
    match as decimal128 ones (Arrow's dictionary_encode has no kernel for
    them, which the encoder used to call as it is)."""
    idx = Index(algorithm="scan", backend="cpu", schema={"x": "numeric", "l": "list<numeric>"})
    idx.add_many([1, 2, 3], ["x = 0.1", "x IS NULL", "0.1 IN l"])
    values = [Decimal("0.10"), Decimal("-7.25"), None]
    want = [[1], [], [2]]
    column = pa.array(values, arrow_type)
    forms = {"column": pa.table({"x": column}),
             "map": pa.table({"attrs": pa.array([[] if v is None else [("x", v)] for v in values],
                                                pa.map_(pa.string(), arrow_type))})}
    for name, events in forms.items():
        assert [m.tolist() for m in idx.match_batch(events)] == want, name
    lists = pa.table({"l": pa.array([[v] for v in values], pa.list_(arrow_type))})
    assert [m.tolist() for m in idx.match_batch(lists)] == [[2, 3], [2], [2]]


def test_pandas_arrow_backed_columns_read_as_arrow():
    """A DataFrame column pandas holds as Arrow (``pd.ArrowDtype``) reads as
    the Arrow column: a list keeps its null elements (dropped) and its exact
    integers (2**53 + 1 refused, not rounded to 2**53), and a map column's
    keys are attributes."""
    idx = Index(algorithm="scan", backend="cpu", schema={"ln": "list<numeric>", "price": "numeric"})
    idx.add_many([1, 2, 3, 4], ["1 IN ln", "9007199254740992 IN ln", "price > 10", "price IS NULL"])
    table = pa.table({"ln": pa.array([[None, 1], [2 ** 53 + 1], None], pa.list_(pa.int64())),
                      "attrs": pa.array([[("price", 12.5)], [], None], pa.map_(pa.string(), pa.float64()))})
    frame = table.to_pandas(types_mapper=pd.ArrowDtype)
    for events in (table, frame):
        found, rejected = idx.match_batch(events, errors="report")
        assert [m.tolist() for m in found] == [[1, 3], [], [4]]
        assert [(bad.event, bad.attribute) for bad in rejected] == [(1, "ln")]


def test_run_end_encoded_columns_read_as_their_values():
    idx = Index(algorithm="scan", backend="cpu", schema={"s": "string", "x": "numeric"})
    idx.add_many([1, 2, 3], ["s = 'a'", "x >= 2", "s IS NULL"])
    table = pa.table({"s": pa.RunEndEncodedArray.from_arrays(pa.array([2, 3], pa.int32()), pa.array(["a", None])),
                      "x": pa.RunEndEncodedArray.from_arrays(pa.array([1, 3], pa.int32()), pa.array([1.0, 2.0]))})
    assert [m.tolist() for m in idx.match_batch(table)] == [[1], [1, 2], [2, 3]]


def test_a_longdouble_among_floats_in_an_object_column_follows_the_dict_rule():
    """pyarrow would round ``np.longdouble('0.1')`` to 0.1 in an object
    column of floats; the dict rule refuses what float64 cannot hold."""
    idx = Index(algorithm="scan", backend="cpu", schema={"x": "numeric"})
    idx.add_many([1, 2], ["x = 0.1", "x = 0.5"])
    frame = pd.DataFrame({"x": pd.Series([np.longdouble("0.1"), 0.5], dtype=object)})
    found, rejected = idx.match_batch(frame, errors="report")
    exact = np.longdouble("0.1") == np.float64(0.1)        # (a platform whose longdouble is float64)
    assert [m.tolist() for m in found] == [[1] if exact else [], [2]]
    assert [bad.event for bad in rejected] == ([] if exact else [0])


def test_non_finite_decimals_are_wrong_values():
    idx = Index(algorithm="scan", backend="cpu")
    idx.add_many([1, 2], ["x > 0", "x IS NULL"])
    for bad in (Decimal("NaN"), Decimal("Infinity"), Decimal("-Infinity"), Decimal("sNaN")):
        with pytest.raises(SchemaError, match="event 1: attribute 'x'.*not a finite number"):
            idx.match_batch([{"x": 1}, {"x": bad}])
        assert [m.tolist() for m in idx.match_batch([{"x": 1}, {"x": bad}], errors="null")] == [[1], [2]]


# (value, accepted) for a numeric, a string and a boolean attribute
MIXED = {
    "n": [(1, True), ("two", False), (True, False), (2.5, True), (Decimal("1.5"), True), (None, None),
          (np.int64(3), True), (2 ** 60, False), (np.float32(0.5), True), (np.True_, False), (float("inf"), False),
          (b"7", False), (10 ** 400, False), (np.longdouble(1) / 3, False)],
    "s": [("a", True), (1, False), ("x\ud800", False), (None, None), (b"b", False), ("b", True), (True, False)],
    "b": [(True, True), (1, False), (np.False_, True), ("true", False), (None, None), (0.0, False)],
}


@pytest.mark.parametrize("attr", sorted(MIXED))
@pytest.mark.parametrize("errors", ["raise", "null"])
def test_mixed_pandas_object_columns_follow_the_dict_rule(attr, errors):
    """An object column mixing kinds of values is read value by value
    under the dict rule (pyarrow would refuse it, or turn True into 1.0):
    errors="raise" names the first bad event and the attribute, and
    errors="null" drops the bad values alone."""
    idx = Index(algorithm="scan", backend="cpu", schema={"n": "numeric", "s": "string", "b": "boolean"})
    texts = {"n": ["n > 0", "n IS NULL", "n = 2.5"], "s": ["s = 'a'", "s IS NULL", "s >= 'b'"],
             "b": ["b = TRUE", "b IS NULL", "b = FALSE"]}[attr]
    idx.add_many(range(3), texts)
    values = [v for v, _ in MIXED[attr]]
    first_bad = next(k for k, (_, ok) in enumerate(MIXED[attr]) if ok is False)
    for events in (_events("dicts", attr, values), _events("pandas", attr, values)):
        if errors == "raise":
            with pytest.raises(SchemaError, match=rf"^event {first_bad}: attribute '{attr}'"):
                idx.match_batch(events)
            continue
        want = [[i for i, t in enumerate(texts) if reference_matches(parse(t), {attr: _plain(v)} if ok else {})]
                for v, ok in MIXED[attr]]
        assert [m.tolist() for m in idx.match_batch(events, errors="null")] == want


def test_pandas_missing_markers_are_absent():
    """In a DataFrame, pandas' own missing markers (None, NaN, NA) are
    absent -- a float column has no other way to leave a cell empty --
    typed and object columns alike; an infinite float is a wrong value."""
    idx = Index(algorithm="scan", backend="cpu", schema={"n": "numeric", "s": "string"})
    idx.add_many([1, 2, 3], ["n IS NULL", "s IS NULL", "n >= 1"])
    frame = pd.DataFrame({"n": [np.nan, 1.0, np.nan], "s": pd.Series([None, pd.NA, "a"], dtype=object)})
    assert [m.tolist() for m in idx.match_batch(frame)] == [[1, 2], [2, 3], [1]]
    mixed = pd.DataFrame({"n": pd.Series([np.nan, 1, "x"], dtype=object)})
    assert [m.tolist() for m in idx.match_batch(mixed, errors="null")] == [[1, 2], [2, 3], [1, 2]]
    with pytest.raises(SchemaError, match="^event 1: attribute 'n'"):
        idx.match_batch(pd.DataFrame({"n": [0.5, np.inf]}))


def test_arrow_columns_of_another_family_are_wrong_values():
    idx = Index(algorithm="scan", backend="cpu", schema={"n": "numeric", "s": "string"})
    idx.add_many([1, 2], ["n IS NULL", "s IS NULL"])
    table = pa.table({"n": pa.array([None, True]), "s": pa.array([None, 5])})
    with pytest.raises(SchemaError, match="^event 1: attribute 'n' is numeric, got True"):
        idx.match_batch(table)
    assert [m.tolist() for m in idx.match_batch(table, errors="null")] == [[1, 2], [1, 2]]


def test_an_attribute_in_two_columns_is_an_error():
    idx = Index(algorithm="scan", backend="cpu")
    idx.add(1, "x > 0")
    twice = pa.Table.from_arrays([pa.array([None, 1]), pa.array([None, 2.0])], names=["x", "x"])
    with pytest.raises(ValueError, match="attribute 'x' is given twice"):
        idx.match_batch(twice)
    with pytest.raises(ValueError, match="attribute 'x' is given twice"):
        idx.match_batch(pd.DataFrame([[1, 2]], columns=["x", "x"]))


@pytest.mark.parametrize("form", ["dicts", "arrow", "pandas", "map"])
@pytest.mark.parametrize("arrow_type", [pa.int64(), pa.uint64()])
def test_integers_beyond_2_53_are_wrong_values_in_every_form(form, arrow_type):
    """2**53 + 1 is refused as an integer, not rounded to 2**53 as float64
    would (the Arrow buffers used to be checked as float64)."""
    idx = Index(algorithm="scan", backend="cpu")
    idx.add_many([1, 2], ["x = 9007199254740992", "x IS NULL"])
    events = _events(form, "x", [2 ** 53, 2 ** 53 + 1, 2 ** 64 - 1 if arrow_type == pa.uint64() else -2 ** 53 - 1],
                     arrow_type)
    with pytest.raises(SchemaError, match=r"^event 1: attribute 'x' is numeric, got 9007199254740993: beyond"):
        idx.match_batch(events)
    assert [m.tolist() for m in idx.match_batch(events, errors="null")] == [[1], [2], [2]]


class _NoRepr:
    def __repr__(self):
        raise RuntimeError("no repr")


@pytest.mark.parametrize("value, shown", [(10 ** 5000, "got a value of type int: beyond"),
                                          (_NoRepr(), "got a value of type _NoRepr "),
                                          ("x" * 1000, "got 'xxxx"), (1.5, "got 1.5 ")],
                         ids=["huge int", "no repr", "long string", "float for a boolean"])
def test_errors_show_any_refused_value(value, shown):
    """The SchemaError is raised whatever the value: an int with no repr
    (more than 4300 digits), a class whose repr raises; long reprs are
    shortened."""
    idx = Index(algorithm="scan", backend="cpu", schema={"x": "numeric", "b": "boolean"})
    idx.add_many([1, 2], ["x > 0", "b = TRUE"])
    with pytest.raises(SchemaError, match=f"^event 0: attribute '(x|b)' is [a-z]+, {shown}") as caught:
        idx.match_batch([{"b" if isinstance(value, float) else "x": value}])
    assert len(str(caught.value)) < 250
    # the error's fields hold the value itself, however it is shown
    assert isinstance(caught.value, BadEventError) and caught.value.value is value
    assert caught.value.event == 0 and caught.value.attribute == ("b" if isinstance(value, float) else "x")


# -------------------------------------------------------------- pattern truth
def test_pattern_truth_is_each_patterns_answer_on_its_own_attributes_strings():
    """``truth[token, pattern]`` is the pattern's answer for every distinct
    string its attribute takes in the batch and 0 elsewhere, whatever
    other attributes hold the same strings."""
    idx = Index(algorithm="scan", backend="cpu", schema={"a": "string", "b": "string", "c": "string"})
    texts = ["a LIKE '%/b'", "a LIKE 'a_b'", "b LIKE '%/b'", "b MATCHES '\\x00'", "c LIKE '%'", "a MATCHES '^x{16}'"]
    idx.add_many(range(len(texts)), texts)
    idx.merge()
    rng = np.random.default_rng(5)
    events = [{k: HARD_STRINGS[rng.integers(len(HARD_STRINGS))] for k in "ab" if rng.random() < 0.7}
              for _ in range(300)]
    schema = idx.schema
    batch = event_batches.encode_events(events, schema)
    pairs = idx._main.predicates.pattern_pairs()
    truth = event_batches.pattern_truth(batch, schema, pairs)
    assert truth.dtype == np.uint8 and truth.shape == (len(batch.strings), len(schema.patterns))
    want = np.zeros_like(truth)
    for attr, pattern in pairs:
        name = schema.attr_names[attr]
        matcher = schema.pattern_matcher(int(pattern))
        for event in events:
            if name in event:
                token = batch.strings.to_pylist().index(event[name])
                want[token, pattern] = matcher(event[name])
    assert np.array_equal(truth, want)
    assert not truth[:, schema.pattern_id("like", "%")].any()      # attribute c is in no event


def test_pattern_truth_does_not_scan_the_batch_once_per_pattern():
    """Patterns are evaluated per distinct value of their attribute, from
    one grouping of the batch: with the same distinct values, 400 patterns
    cost about as much over 50,000 events as over 500 (a pass over the
    batch per pattern made it about 30 times as much)."""
    idx = Index(algorithm="scan", backend="cpu")
    idx.add_many(range(400), [f"s{k % 4} LIKE '%/{k}'" for k in range(400)])
    idx.merge()
    pairs = idx._main.predicates.pattern_pairs()

    def timed(n_events: int) -> float:
        table = pa.table({f"s{j}": pa.array([f"https://example.com/{j}/{k % 10}" for k in range(n_events)])
                          for j in range(4)})
        batch = event_batches.encode_events(table, idx.schema)
        best = float("inf")
        for _ in range(3):
            start = time.perf_counter()
            event_batches.pattern_truth(batch, idx.schema, pairs)
            best = min(best, time.perf_counter() - start)
        return best

    assert timed(50_000) < 5 * timed(500)



def test_a_batch_matched_in_slices_evaluates_its_patterns_once(monkeypatch):
    """A batch whose output outgrows the working-memory budget is matched
    in event slices; the slices share the batch's strings, so the
    LIKE/MATCHES table is made once for the batch, not once a slice (which
    evaluated a value recurring in several slices again, and allocated a
    strings x patterns table each time) -- with the answers unchanged, in
    every output form and through match_stream."""
    import engine.index as index_module

    idx = Index(algorithm="opindex", backend="cpu")
    idx.add_many(range(300), [f"url LIKE 'https://example.com/{k % 3}/%' OR n = {k % 5}" for k in range(300)])
    idx.merge()
    idx.add(1000, "url LIKE '%/7'")                     # a delta too: the table covers every segment's patterns
    events = [{"url": f"https://example.com/{k % 4}/{k % 11}", "n": k % 6} for k in range(600)]
    want = []
    for event in events:
        hits = {k for k in range(300) if event["url"].startswith(f"https://example.com/{k % 3}/")
                or event["n"] == k % 5}
        if event["url"].endswith("/7"):
            hits.add(1000)
        want.append(sorted(hits))
    calls = []
    real = event_batches.pattern_truth
    monkeypatch.setattr(event_batches, "pattern_truth", lambda *a: calls.append(1) or real(*a))
    monkeypatch.setattr(index_module, "MATCH_MEMORY_BUDGET", 40_000)     # slices of a few events
    assert [m.tolist() for m in idx.match_batch(events)] == want
    assert len(calls) == 1
    table = idx.match_batch(events, output="arrow")
    assert len(calls) == 2 and table.num_rows == sum(map(len, want))
    pieces = list(idx.match_stream(events, max_pairs=500))
    assert len(pieces) > 10 and len(calls) == 3
    assert pa.Table.from_batches(pieces).num_rows == sum(map(len, want))


_LIKE_ALPHABET = "ab%_\\\x00\n.*+?()[]{}|^$é😀"


@settings(max_examples=200, deadline=None)
@given(patterns=st.lists(st.text(_LIKE_ALPHABET, max_size=6), min_size=1, max_size=5, unique=True),
       values=st.lists(st.text(_LIKE_ALPHABET, max_size=8), max_size=8))
def test_like_through_arrow_is_the_reference_like(patterns, values):
    """LIKE runs on Arrow's kernel (over a batch's distinct values of the
    attribute, if there are enough of them), whose escape character ours
    does not have: ``%`` and ``_`` are the only special characters,
    whatever else the pattern holds (backslashes, regex syntax, NUL,
    newlines) -- the same answers as value by value."""
    # and a value each pattern matches: `%` as nothing, `_` as one character
    values = values + [p.replace("%", "").replace("_", "é") for p in patterns]
    filler = [f"filler {k}" for k in range(event_batches._LIKE_KERNEL_MIN_VALUES)]
    idx = Index(algorithm="scan", backend="cpu", schema={"s": "string"})
    idx.add_many(range(len(patterns)), [f"s LIKE '{p}'" for p in patterns])
    idx.merge()
    pairs = idx._main.predicates.pattern_pairs()
    for batch_values in (values + filler, values[-2:]):         # through Arrow, value by value
        batch = event_batches.encode_events([{"s": v} for v in batch_values], idx.schema)
        truth = event_batches.pattern_truth(batch, idx.schema, pairs)
        for value, token in zip(batch_values, batch.token.tolist()):
            for p in patterns:
                assert truth[token, idx.schema.pattern_id("like", p)] == like(value, p), (value, p)


class DLPackOnly:
    """An array reached through DLPack alone (no NumPy array, no CUDA Array
    Interface): on a NumPy array, a CPU tensor's shape; on a CuPy array
    (tests/test_device_events.py), a PyTorch or JAX tensor on the GPU."""

    def __init__(self, array):
        self._array = array

    def __dlpack__(self, *args, **kwargs):
        return self._array.__dlpack__(*args, **kwargs)

    def __dlpack_device__(self):
        return self._array.__dlpack_device__()


@pytest.mark.parametrize("column", [pa.array([1.0, 700.0]), DLPackOnly(np.array([1.0, 700.0]))],
                         ids=["pyarrow", "host-dlpack"])
def test_host_dlpack_producers_are_not_device_columns(column):
    """PyArrow arrays (since pyarrow 15) and CPU tensors export DLPack too:
    a mapping of them is host data, named as such -- not taken for device
    columns (which only a cuda index matches) -- and nothing changes."""
    from engine.device_events import is_device_column, is_device_columns
    assert column.__dlpack_device__()[0] == 1           # kDLCPU
    assert not is_device_column(column) and not is_device_columns({"price": column})
    idx = Index()
    idx.add(1, "price > 600")
    with pytest.raises(TypeError, match=r"pyarrow\.table\(columns\)"):
        idx.match_batch({"price": column})
    assert [m.tolist() for m in idx.match_batch(pa.table({"price": [1.0, 700.0]}))] == [[], [1]]


def test_a_nul_is_an_ordinary_character_in_every_dataframe_column_but_a_pandas_categorical():
    """'a\\x00' is not 'a' from an object, a pandas string or an Arrow-backed column. A pandas Categorical has
    merged them before bexmatch reads it (pandas hashes such strings up to the NUL): pinned here, since
    docs/language.md says so -- when pandas fixes it, this fails and the docs change."""
    index = Index(algorithm="scan", backend="cpu")
    index.add_many([1, 2], ["s = 'a\x00'", "s = 'a'"])
    values = ["a", "a\x00", "b\x00c", None]
    for dtype in (object, "string", pd.ArrowDtype(pa.string())):
        frame = pd.DataFrame({"s": pd.Series(values, dtype=dtype)})
        assert [m.tolist() for m in index.match_batch(frame)] == [[2], [1], [], []], dtype
    merged = pd.Categorical(["a", "a\x00"])
    assert list(merged.categories) == ["a"]
    assert [m.tolist() for m in index.match_batch(pd.DataFrame({"s": merged}))] == [[2], [2]]


def test_a_pandas_object_column_of_dicts_is_a_map_column():
    """A DataFrame column of dicts (attribute -> value; how a JSON source
    or ``to_pandas`` of a map of mixed values arrives) holds attributes by
    key, as an Arrow map column does, each value read by the dict rule:
    before, the column was passed over as no attribute's, and every event
    matched as if empty."""
    idx = Index(algorithm="scan", backend="cpu", schema={"price": "numeric", "color": "string",
                                                         "sizes": "list<numeric>", "ok": "boolean"})
    idx.add_many([1, 2, 3, 4, 5], ["price < 5", "color = 'red'", "2 IN sizes", "ok = TRUE", "price IS NULL"])
    cells = [{"price": 1, "color": "red"}, {"sizes": [1, 2], "ok": True, "unknown": object()}, None, np.nan, {},
             {"price": None, "color": "blue"}, {"price": Decimal("4.5")}]
    frame = pd.DataFrame({"attributes": pd.Series(cells, dtype=object)})
    assert [m.tolist() for m in idx.match_batch(frame)] == [[1, 2], [3, 4, 5], [5], [5], [5], [5], [1]]
    # beside flat columns: an attribute in both, for one event, is given twice
    mixed = pd.DataFrame({"color": ["red", None], "attributes": [{"price": 9}, {"color": "red", "price": 1}]})
    assert [m.tolist() for m in idx.match_batch(mixed)] == [[2], [1, 2]]
    twice = pd.DataFrame({"price": [1.0, np.nan], "attributes": [{"color": "red"}, {"price": 1}]})
    assert [m.tolist() for m in idx.match_batch(twice)] == [[1, 2], [1]]
    with pytest.raises(SchemaError, match=r"^event 0: attribute 'price' is given twice"):
        idx.match_batch(pd.DataFrame({"price": [1.0], "attributes": [{"price": 2}]}))


def test_the_bad_cells_of_a_pandas_column_of_dicts_are_its_events_errors():
    idx = Index(algorithm="scan", backend="cpu", schema={"price": "numeric", "color": "string"})
    idx.add_many([1, 2], ["price < 5", "color IS NULL"])
    frame = pd.DataFrame({"attributes": pd.Series([{"price": "cheap"}, {"price": 1}, "price=1", {7: 1},
                                                   {"price": float("nan"), "color": 5}], dtype=object)})
    with pytest.raises(SchemaError, match=r"^event 0: attribute 'price' is numeric, got 'cheap'"):
        idx.match_batch(frame)
    found, rejected = idx.match_batch(frame, errors="report")
    assert [m.tolist() for m in found] == [[], [1, 2], [], [], []]     # set aside: no matches
    assert [(bad.event, bad.attribute) for bad in rejected] == [(0, "price"), (2, None), (3, None), (4, "price")]
    assert isinstance(rejected[1], TypeError) and "holds mappings" in str(rejected[1])
    # errors="null": a bad value is absent, a key that names no attribute passed over, but a cell that is
    # not a mapping is still an error (as a dict event that is not a mapping is)
    with pytest.raises(TypeError, match=r"^event 2: column 'attributes' holds mappings"):
        idx.match_batch(frame, errors="null")
    assert [m.tolist() for m in idx.match_batch(frame.drop(index=2), errors="null")] == [[2], [1, 2], [2], [2]]
