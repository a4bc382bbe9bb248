"""Bad events as errors with fields (engine.errors.BadEventError) and
``errors="report"``: every input form names the bad event's position,
attribute and value in fields; "report" encodes a bad event with no
attributes, lists it in the batch's ``rejected`` and encodes every good
event exactly as "raise" would; ``Index.match_batch(..., errors="report")``
returns the rejected events beside results in which they match nothing."""

from __future__ import annotations

import math
import pickle
from decimal import Decimal

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest

from engine import Index, SchemaError
from engine import events as event_batches
from engine.errors import BadEventError
from engine.schema import Schema

FAMILIES = {"n": "numeric", "s": "string", "b": "boolean", "m": "numeric"}
#: a good value of each attribute, by event position (None = absent)
GOOD = {"n": [1, 2.5, None, -3, 7], "s": ["a", None, "b", "zz", "a"], "b": [True, False, None, True, False],
        "m": [None, 4, 5, None, 6]}
ARROW_GOOD = {"n": pa.float64(), "s": pa.string(), "b": pa.bool_(), "m": pa.int64()}
N = 5


def _schema() -> Schema:
    schema = Schema()
    for name, family in FAMILIES.items():
        schema.declare(name, family)
    return schema


#: (attribute, bad value, Arrow type of its column, the forms that can hold it)
#: -- a column of another family holds the bad value alone (the rest null),
#: a column of the attribute's family holds the good values too
ALL_FORMS = ("dicts", "arrow", "record_batch", "pandas", "map")
CASES = [
    ("n", "cheap", pa.string(), ALL_FORMS),
    ("n", True, pa.bool_(), ALL_FORMS),
    ("n", math.nan, pa.float64(), ("dicts", "arrow", "record_batch", "map")),   # pandas: NaN is absent
    ("n", math.inf, pa.float64(), ALL_FORMS),
    ("n", -math.inf, pa.float64(), ALL_FORMS),
    ("m", 2 ** 53 + 1, pa.int64(), ALL_FORMS),
    ("m", -(2 ** 60), pa.int64(), ALL_FORMS),
    ("m", np.timedelta64(5, "ns"), None, ("dicts",)),        # NumPy makes durations integers: not numbers here
    ("n", Decimal("0.1000000000000000001"), pa.decimal128(38, 19), ALL_FORMS),
    ("n", Decimal("NaN"), None, ("dicts",)),                 # pandas: a missing marker
    ("n", Decimal("-Infinity"), None, ("dicts", "pandas")),
    ("s", 5, pa.int64(), ALL_FORMS),
    ("s", "x\ud800y", None, ("dicts", "pandas")),           # no UTF-8 form: Arrow cannot hold it
    ("s", b"bytes", pa.binary(), ("dicts", "pandas")),
    ("b", 1, pa.int64(), ALL_FORMS),
    ("b", "true", pa.string(), ALL_FORMS),
]
#: (form, case) for the forms that can hold each case's bad value
FORM_CASES = [pytest.param(form, *case, id=f"{form}-{case[0]}={case[1]!r}")
              for case in CASES for form in ALL_FORMS if form in case[3]]


def _same_value(got, want) -> bool:
    if isinstance(want, float) and math.isnan(want):
        return isinstance(got, float) and math.isnan(got)
    if isinstance(want, Decimal) and want.is_nan():
        return isinstance(got, Decimal) and got.is_nan()
    return type(got) is type(want) and got == want


def _build(form: str, cells: dict, arrow_types: dict | None = None, map_attr: str | None = None):
    """The events ``cells`` (attribute -> list of values by position, None
    = absent) in one input form.  ``arrow_types`` overrides a column's
    Arrow type; ``map_attr`` goes into a ``map<string, V>`` column."""
    n = len(next(iter(cells.values())))
    if form == "dicts":
        return [{a: v[i] for a, v in cells.items() if v[i] is not None} for i in range(n)]
    if form == "pandas":
        return pd.DataFrame({a: pd.Series(v, dtype=object) for a, v in cells.items()})
    types = {**ARROW_GOOD, **(arrow_types or {})}
    columns = {a: pa.array(v, types[a]) for a, v in cells.items() if form != "map" or a != map_attr}
    if form == "map":
        values = cells[map_attr]
        columns["attrs"] = pa.array([[] if v is None else [(map_attr, v)] for v in values],
                                    pa.map_(pa.string(), types[map_attr]))
    if form == "record_batch":
        return pa.RecordBatch.from_pydict(columns)
    return pa.table(columns)


def _cells_with(attr: str, bad, arrow_type, at) -> tuple[dict, dict]:
    """GOOD with ``bad`` as ``attr`` of the events at positions ``at``;
    where the bad value's type is of another family, ``attr`` is absent
    from the other events (one Arrow column holds one type)."""
    cells = {a: list(v) for a, v in GOOD.items()}
    if arrow_type is not None and arrow_type != ARROW_GOOD[attr] and not (
            pa.types.is_decimal(arrow_type) or pa.types.is_integer(arrow_type) and FAMILIES[attr] == "numeric"):
        cells[attr] = [None] * N
    elif arrow_type is not None and pa.types.is_decimal(arrow_type):
        cells[attr] = [None if v is None else Decimal(str(v)) for v in cells[attr]]
    for k in at:
        cells[attr][k] = bad
    return cells, ({attr: arrow_type} if arrow_type is not None else {})


def _good_only(cells: dict, bad_positions) -> dict:
    keep = [i for i in range(len(next(iter(cells.values())))) if i not in set(bad_positions)]
    return {a: [v[i] for i in keep] for a, v in cells.items()}


def assert_encoded_as_without(batch, good_batch, bad_positions) -> None:
    """``batch`` (errors="report") holds the bad events empty and every
    other event exactly as ``good_batch`` (the good events alone, "raise")."""
    counts = np.diff(batch.offsets)
    bad = sorted(set(bad_positions))
    assert (counts[bad] == 0).all()
    assert np.array_equal(np.delete(counts, bad), np.diff(good_batch.offsets))
    for field in ("attr", "value", "token"):
        got, want = getattr(batch, field), getattr(good_batch, field)
        assert got.dtype == want.dtype and np.array_equal(got, want), field
    assert batch.strings.type == good_batch.strings.type
    assert batch.strings.to_pylist() == good_batch.strings.to_pylist()
    assert good_batch.rejected == ()


# ------------------------------------------------------------------ errors="raise"

@pytest.mark.parametrize("form, attr, bad, arrow_type, forms", FORM_CASES)
def test_a_bad_value_raises_a_bad_event_error_with_its_fields(form, attr, bad, arrow_type, forms):
    schema = _schema()
    cells, types = _cells_with(attr, bad, arrow_type, [3])
    events = _build(form, cells, types, map_attr=attr)
    with pytest.raises(BadEventError) as caught:
        event_batches.encode_events(events, schema)
    error = caught.value
    assert isinstance(error, SchemaError) and isinstance(error, ValueError)
    assert (error.event, error.attribute) == (3, attr)
    assert _same_value(error.value, bad), (error.value, bad)
    assert error.reason.startswith(f"attribute {attr!r} is {FAMILIES[attr]}, got ")
    assert str(error).startswith(f"event 3: {error.reason}")
    again = pickle.loads(pickle.dumps(error))
    assert type(again) is type(error) and str(again) == str(error)
    assert (again.event, again.attribute, again.reason) == (error.event, error.attribute, error.reason)


def test_an_event_that_is_not_a_mapping_is_a_bad_event_and_a_type_error():
    schema = _schema()
    events = [{"n": 1}, ["n", 1], {"s": "a"}]
    for errors in ("raise", "null"):
        with pytest.raises(TypeError) as caught:
            event_batches.encode_events(events, schema, errors)
        error = caught.value
        assert isinstance(error, BadEventError)
        assert (error.event, error.attribute, error.value) == (1, None, ["n", 1])
        assert str(error).startswith("event 1: not a mapping")
    batch = event_batches.encode_events(events, schema, "report")
    assert [(e.event, e.attribute) for e in batch.rejected] == [(1, None)]
    assert_encoded_as_without(batch, event_batches.encode_events([events[0], events[2]], schema), [1])
    # a string is not a batch of events, whatever the mode
    with pytest.raises(TypeError):
        event_batches.encode_events("abc", schema, "report")


@pytest.mark.parametrize("key", [0, 1.5, b"n", ("n",), None], ids=["int", "float", "bytes", "tuple", "None"])
def test_a_key_that_is_no_str_is_refused_not_passed_over(key):
    """Attributes are named by str: a dict key of another type names none, and
    is refused by the errors mode like a bad value (not skipped unsaid, as
    an unknown attribute's name is)."""
    schema = _schema()
    events = [{"n": 1}, {"s": "a", key: 5}, {"s": "b", "zz_unknown": 5}]
    with pytest.raises(BadEventError, match=r"^event 1: key .* is not an attribute name: attribute names are str"):
        event_batches.encode_events(events, schema)
    # "null" forgets the key as it forgets a bad value: the event keeps its other attributes
    assert_encoded_as_without(event_batches.encode_events(events, schema, "null"),
                              event_batches.encode_events([events[0], {"s": "a"}, events[2]], schema), [])
    batch = event_batches.encode_events(events, schema, "report")
    assert [(e.event, e.attribute, e.value) for e in batch.rejected] == [(1, None, key)]
    assert_encoded_as_without(batch, event_batches.encode_events([events[0], events[2]], schema), [1])


def test_a_dataframe_column_label_that_is_no_str_is_a_schema_error():
    schema = _schema()
    for frame in (pd.DataFrame({0: [1.0], "n": [2.0]}), pd.DataFrame([[1.0, 2.0]], columns=pd.MultiIndex.from_tuples(
            [("n", "x"), ("s", "y")]))):
        for errors in ("raise", "null", "report"):
            with pytest.raises(SchemaError, match="is not an attribute name: attribute names are str"):
                event_batches.encode_events(frame, schema, errors)
    frame = pd.DataFrame({0: [1.0]})
    frame.columns = frame.columns.astype(str)       # the fix the error suggests
    assert event_batches.encode_events(frame, schema).n_events == 1


@pytest.mark.parametrize("key_type", [pa.int64(), pa.float64(), pa.bool_(), pa.binary(), pa.list_(pa.string())],
                         ids=str)
def test_a_map_column_whose_keys_are_not_strings_is_a_schema_error(key_type):
    """Arrow would cast an int key 0 to the name "0" and a bool one to "true", and fail on a binary key that is
    not UTF-8 or on a nested one; a map's keys name attributes, so they are strings or the batch is refused."""
    schema = _schema()
    key = {"int64": 0, "double": 0.0, "bool": True, "binary": b"\xff", "list<item: string>": ["n"]}[str(key_type)]
    table = pa.table({"n": [1.0], "attrs": pa.array([[(key, 2.0)]], pa.map_(key_type, pa.float64()))})
    for errors in ("raise", "null", "report"):
        with pytest.raises(SchemaError, match="map column 'attrs': its keys are attribute names, so they must be "
                                              "strings"):
            event_batches.encode_events(table, schema, errors)
    for key_type in (pa.string(), pa.large_string(), pa.dictionary(pa.int32(), pa.string())):
        good = pa.table({"attrs": pa.array([[("n", 2.0)]], pa.map_(pa.string(), pa.float64())).cast(
            pa.map_(key_type, pa.float64()))})
        assert event_batches.encode_events(good, schema).n_events == 1


@pytest.mark.parametrize("events", [None, 5, object()], ids=["None", "int", "object"])
def test_a_batch_that_is_no_container_of_events_is_a_type_error_saying_what_is_taken(events):
    with pytest.raises(TypeError, match="match_batch takes a sequence of events \\(dicts\\), a pyarrow Table"):
        event_batches.encode_events(events, _schema())


def test_an_attribute_given_twice_in_an_event_is_a_bad_event():
    """A column and a map key of the same attribute, in some events only."""
    schema = _schema()
    table = pa.table({"n": pa.array([1.0, None, 3.0, None]),
                      "attrs": pa.array([[("n", 2.0)], [("n", 2.0)], [], None], pa.map_(pa.string(), pa.float64())),
                      "s": pa.array(["a", "b", "c", "d"])})
    for errors in ("raise", "null"):
        with pytest.raises(BadEventError, match="^event 0: attribute 'n' is given twice") as caught:
            event_batches.encode_events(table, schema, errors)
        assert (caught.value.event, caught.value.attribute, caught.value.value) == (0, "n", None)
    batch = event_batches.encode_events(table, schema, "report")
    assert [(e.event, e.attribute) for e in batch.rejected] == [(0, "n")]
    assert_encoded_as_without(batch, event_batches.encode_events(table.slice(1), schema), [0])


# ------------------------------------------------------------------ errors="report"

@pytest.mark.parametrize("form, attr, bad, arrow_type, forms", FORM_CASES)
@pytest.mark.parametrize("at", [[0], [4], [1, 3], list(range(N))], ids=["first", "last", "two", "all"])
def test_report_rejects_bad_events_and_encodes_the_rest_as_raise_does(form, attr, bad, arrow_type, forms, at):
    schema = _schema()
    cells, types = _cells_with(attr, bad, arrow_type, at)
    batch = event_batches.encode_events(_build(form, cells, types, map_attr=attr), schema, "report")
    assert [e.event for e in batch.rejected] == at
    for error in batch.rejected:
        assert isinstance(error, BadEventError) and error.attribute == attr and _same_value(error.value, bad)
    good = _build(form, _good_only(cells, at), types, map_attr=attr) if len(at) < N else None
    if good is None:
        assert batch.n_events == N and batch.offsets.tolist() == [0] * (N + 1) and len(batch.strings) == 0
        return
    assert_encoded_as_without(batch, event_batches.encode_events(good, schema), at)
    # "raise" and "null" never report
    assert event_batches.encode_events(good, schema, "null").rejected == ()


@pytest.mark.parametrize("form", ALL_FORMS)
def test_report_without_bad_events_is_raise(form):
    schema = _schema()
    events = _build(form, GOOD, map_attr="m")
    batch = event_batches.encode_events(events, schema, "report")
    assert batch.rejected == ()
    assert_encoded_as_without(batch, event_batches.encode_events(events, schema), [])


@pytest.mark.parametrize("column, attr, bad_rows, value", [
    (pa.array(["a", None, "b"], pa.string_view()), "n", [0, 2], "b"),
    (pa.array(["a", None, "b"], pa.large_string()), "b", [0, 2], "b"),
    (pa.array(["a", None, "a"]).dictionary_encode(), "n", [0, 2], "a"),
    (pa.array([1, None, 2], pa.int8()).dictionary_encode(), "s", [0, 2], 2),
    (pa.chunked_array([pa.array([1, None], pa.int64()), pa.array([2 ** 60], pa.int64())]), "n", [2], 2 ** 60),
    (pa.chunked_array([pa.array([1.0], pa.float32()), pa.array([None, math.nan], pa.float32())]), "n", [2],
     math.nan),
    (pa.array([2 ** 64 - 1, 3, None], pa.uint64()), "m", [0], 2 ** 64 - 1),
    (pa.array([Decimal("1.5"), Decimal("1E+20"), None], pa.decimal256(40, 1)), "n", [1], Decimal("1E+20")),
    (pa.array([True, None, False]), "s", [0, 2], False),
], ids=["string_view", "large_string", "dictionary", "int dictionary", "chunked int64", "chunked float32",
        "uint64", "decimal256", "bool for a string"])
def test_report_over_arrow_column_types(column, attr, bad_rows, value):
    """Every Arrow type a column may have: the refused cells' rows, their
    values as Python objects (``value``: the last one's), the other rows
    as without the column."""
    schema = _schema()
    table = pa.table({"s": pa.array(["x", "y", "z"]), attr + "_": pa.array([1, 2, 3])}).append_column(attr, column)
    batch = event_batches.encode_events(table, schema, "report")
    assert [(e.event, e.attribute) for e in batch.rejected] == [(r, attr) for r in bad_rows]
    assert _same_value(batch.rejected[-1].value, value)
    with pytest.raises(BadEventError) as caught:
        event_batches.encode_events(table, schema)
    assert (caught.value.event, caught.value.attribute) == (bad_rows[0], attr)
    good = pa.concat_tables([table.slice(r, 1) for r in range(3) if r not in bad_rows])     # no take: string_view
    assert_encoded_as_without(batch, event_batches.encode_events(good, schema), bad_rows)


def test_one_error_per_event_the_first_column_in_order():
    """An event with several bad values is reported once, for its first
    bad attribute in the input's order (a dict's keys, the columns)."""
    schema = _schema()
    events = [{"n": 1, "s": "a"}, {"s": 1, "n": "x", "b": 2}, {"b": "no", "n": math.inf}]
    batch = event_batches.encode_events(events, schema, "report")
    assert [(e.event, e.attribute, e.value) for e in batch.rejected] == [(1, "s", 1), (2, "b", "no")]
    frame = pd.DataFrame({"s": pd.Series(["a", 1, "\ud800"], dtype=object), "n": [1.0, math.inf, math.inf],
                          "b": pd.Series([True, 2, "no"], dtype=object)})
    batch = event_batches.encode_events(frame, schema, "report")
    assert [(e.event, e.attribute) for e in batch.rejected] == [(1, "s"), (2, "s")]
    table = pa.table({"b": pa.array([None, 1, None]), "n": pa.array([1.0, math.nan, math.inf]),
                      "s": pa.array(["a", "b", "c"])})
    batch = event_batches.encode_events(table, schema, "report")
    assert [(e.event, e.attribute) for e in batch.rejected] == [(1, "b"), (2, "n")]
    assert_encoded_as_without(batch, event_batches.encode_events(table.slice(0, 1), schema), [1, 2])


def _mixed_batch(seed: int, n_events: int, n_columns: int, bad_share: float):
    """Many float, integer, string and boolean columns: good values in
    most cells, absent in some, and bad values of the column's own Arrow
    type (NaN and infinities in float columns, integers beyond 2**53 in
    integer ones) in about ``bad_share`` of the numeric cells; plus one
    string column for a numeric attribute, set in a few events only.
    Returns (schema, {column: values}, {column: Arrow type}, {event: its
    first bad column})."""
    rng = np.random.default_rng(seed)
    schema = Schema()
    cells, types, first_bad = {}, {}, {}
    for c in range(n_columns):
        kind = "fsbi"[c % 4]
        name = f"{kind}{c}"
        schema.declare(name, {"f": "numeric", "s": "string", "b": "boolean", "i": "numeric"}[kind])
        values = []
        for e in range(n_events):
            r = rng.random()
            if r < 0.2:
                values.append(None)
            elif kind in "fi" and r > 1 - bad_share:
                values.append([math.nan, math.inf, -math.inf][rng.integers(3)] if kind == "f"
                              else [2 ** 60, -(2 ** 53) - 1][rng.integers(2)])
                first_bad.setdefault(e, name)
            else:
                values.append({"f": float(rng.integers(-5, 5)) / 2, "s": f"v{rng.integers(8)}",
                               "b": bool(rng.integers(2)), "i": int(rng.integers(-5, 5))}[kind])
        cells[name] = values
        types[name] = {"f": pa.float64(), "s": pa.string(), "b": pa.bool_(), "i": pa.int64()}[kind]
    schema.declare("wrong", "numeric")
    wrong = [None] * n_events
    for e in sorted(rng.choice(n_events, max(1, int(n_events * bad_share / 4)), replace=False).tolist()):
        wrong[e] = "text"
        first_bad.setdefault(e, "wrong")
    cells["wrong"] = wrong
    types["wrong"] = pa.string()
    return schema, cells, types, first_bad


@pytest.mark.parametrize("form", ["dicts", "arrow", "pandas"])
@pytest.mark.parametrize("seed, n_events, n_columns, bad_share",
                         [(0, 300, 12, 0.05), (1, 50, 30, 0.3), (2, 1000, 6, 0.001)])
def test_realistic_mixes(form, seed, n_events, n_columns, bad_share):
    schema, cells, types, first_bad = _mixed_batch(seed, n_events, n_columns, bad_share)
    if form == "pandas":        # NaN is pandas' missing marker: absent, not bad
        for name, values in cells.items():
            if name.startswith("f"):
                cells[name] = [math.inf if isinstance(v, float) and math.isnan(v) else v for v in values]
    if form == "dicts":
        events = [{a: v[i] for a, v in cells.items() if v[i] is not None} for i in range(n_events)]
    elif form == "pandas":
        events = pd.DataFrame({a: pd.Series(v, dtype=object) for a, v in cells.items()})
    else:
        events = pa.table({a: pa.array(v, types[a]) for a, v in cells.items()})
    batch = event_batches.encode_events(events, schema, "report")
    assert [e.event for e in batch.rejected] == sorted(first_bad)
    assert {e.event: e.attribute for e in batch.rejected} == first_bad
    bad = sorted(first_bad)
    good_cells = _good_only(cells, bad)
    if form == "dicts":
        good = [{a: v[i] for a, v in good_cells.items() if v[i] is not None} for i in range(n_events - len(bad))]
    elif form == "pandas":
        good = pd.DataFrame({a: pd.Series(v, dtype=object) for a, v in good_cells.items()})
    else:
        good = pa.table({a: pa.array(v, types[a]) for a, v in good_cells.items()})
    assert_encoded_as_without(batch, event_batches.encode_events(good, schema), bad)
    # "null" drops the bad values alone; "raise" names the first bad one found
    assert event_batches.encode_events(events, schema, "null").rejected == ()
    if bad:
        with pytest.raises(BadEventError) as caught:
            event_batches.encode_events(events, schema)
        assert caught.value.event in first_bad


def test_a_bad_errors_mode_is_a_value_error():
    with pytest.raises(ValueError, match="'raise', 'null' or 'report'"):
        event_batches.encode_events([{"n": 1}], _schema(), "ignore")


def test_event_batch_takes_its_old_positional_fields():
    batch = event_batches.encode_events([{"n": 1}], _schema())
    again = event_batches.EventBatch(batch.offsets, batch.attr, batch.value, batch.token, batch.strings)
    assert again.rejected == () and again.n_events == 1


# ------------------------------------------------------------------ Index.match_batch(errors="report")

def _subscriptions(schema: Schema) -> list[str]:
    """Predicates of every kind on every attribute of ``schema``, IS NULL
    and NOT among them (TRUE on an event with no attributes)."""
    texts = []
    for name in schema.attr_names:
        family = schema.families[name].value
        texts += [f"{name} IS NULL", f"{name} IS NOT NULL", f"NOT ({name} IS NOT NULL)"]
        texts += {"numeric": [f"{name} > 0", f"NOT ({name} <= 0)", f"{name} != 1"],
                  "string": [f"{name} = 'v1'", f"{name} LIKE 'v%'", f"NOT ({name} = 'v2')"],
                  "boolean": [f"{name} = TRUE", f"NOT ({name} = FALSE)"]}[family]
    names = list(schema.attr_names)
    texts += [f"{a} IS NULL AND {b} IS NULL" for a, b in zip(names, names[1:])]
    return texts


def _events_in(form: str, cells: dict, types: dict):
    n = len(next(iter(cells.values())))
    if form == "dicts":
        return [{a: v[i] for a, v in cells.items() if v[i] is not None} for i in range(n)]
    if form == "pandas":
        return pd.DataFrame({a: pd.Series(v, dtype=object) for a, v in cells.items()})
    return pa.table({a: pa.array(v, types[a]) for a, v in cells.items()})


@pytest.mark.parametrize("algorithm", ["scan", "opindex"])
@pytest.mark.parametrize("form", ["dicts", "arrow", "pandas"])
@pytest.mark.parametrize("seed, n_events, n_columns, bad_share", [(3, 200, 8, 0.05), (4, 40, 5, 0.5)])
def test_match_batch_report_matches_the_good_events_as_alone(algorithm, form, seed, n_events, n_columns,
                                                            bad_share):
    """Good events get what matching them alone gives; rejected events
    match nothing, not even ``x IS NULL`` (they are not events with no
    attributes); ``rejected`` is the batch's list, with its fields."""
    schema, cells, types, first_bad = _mixed_batch(seed, n_events, n_columns, bad_share)
    if form == "pandas":
        for name, values in cells.items():
            if name.startswith("f"):
                cells[name] = [math.inf if isinstance(v, float) and math.isnan(v) else v for v in values]
    texts = _subscriptions(schema)
    index = Index(algorithm=algorithm, backend="cpu",
                  schema={name: schema.families[name].value for name in schema.attr_names})
    index.add_many(range(len(texts)), texts)
    events = _events_in(form, cells, types)
    bad = sorted(first_bad)
    good_positions = [i for i in range(n_events) if i not in first_bad]
    alone = index.match_batch(_events_in(form, _good_only(cells, bad), types))

    results, rejected = index.match_batch(events, errors="report")
    assert [(e.event, e.attribute) for e in rejected] == [(e, first_bad[e]) for e in bad]
    assert all(isinstance(e, BadEventError) for e in rejected)
    assert len(results) == n_events
    assert all(len(results[e]) == 0 for e in bad)
    assert [results[e].tolist() for e in good_positions] == [m.tolist() for m in alone]
    assert any(len(m) for m in alone)

    table, rejected_again = index.match_batch(events, errors="report", output="arrow")
    assert [e.event for e in rejected_again] == bad
    pairs = list(zip(table["event"].to_pylist(), table["sub_id"].to_pylist()))
    assert pairs == [(e, int(s)) for e in good_positions for s in results[e]]
    assert not set(table["event"].to_pylist()) & set(bad)


@pytest.mark.parametrize("algorithm", ["scan", "opindex"])
def test_rejected_events_match_nothing_even_is_null(algorithm):
    index = Index(algorithm=algorithm, backend="cpu", schema={"x": "numeric", "s": "string"})
    index.add_many([1, 2, 3, 4], ["x IS NULL", "s IS NULL", "NOT (x > 0)", "x IS NULL AND s IS NULL"])
    events = [{"x": "bad"}, {}, {"s": 5, "x": 1}, {"x": 2, "s": "a"}, {"x": math.nan}]
    results, rejected = index.match_batch(events, errors="report")
    assert [m.tolist() for m in results] == [[], [1, 2, 4], [], [], []]     # NOT (NULL) is NULL
    assert [(e.event, e.attribute, e.reason) for e in rejected] == [
        (0, "x", "attribute 'x' is numeric, got 'bad'"), (2, "s", "attribute 's' is string, got 5"),
        (4, "x", "attribute 'x' is numeric, got nan: not a finite number")]
    # every event bad; none bad; an empty batch
    results, rejected = index.match_batch(events[:1] * 3, errors="report")
    assert [m.tolist() for m in results] == [[], [], []] and [e.event for e in rejected] == [0, 1, 2]
    results, rejected = index.match_batch(events[1:2], errors="report")
    assert [m.tolist() for m in results] == [[1, 2, 4]] and rejected == []
    results, rejected = index.match_batch([], errors="report")
    assert results == [] and rejected == []
    # "raise": the first bad event, as a BadEventError with its fields
    with pytest.raises(BadEventError) as caught:
        index.match_batch(events)
    assert (caught.value.event, caught.value.attribute, caught.value.value) == (0, "x", "bad")


def _not_utf8(values: list, arrow_type=pa.large_string()):
    """An Arrow string array of ``values`` (bytes, or None) as Parquet, IPC or
    a binary array's view can hold them: Arrow does not check UTF-8 there."""
    binary = pa.large_binary() if pa.types.is_large_string(arrow_type) else pa.binary()
    return pa.array(values, binary).view(arrow_type)


BAD_BYTES = b"caf\xe9"                      # Latin-1 'café': no UTF-8 sequence


def _utf8_layouts():
    """(name, events with a string that is not UTF-8 at events 1 and 3, the
    same events with those values absent): every Arrow layout a string
    attribute can arrive in."""
    plain = _not_utf8([b"a", BAD_BYTES, b"b", b"\xff" + b"b" * 40, None])
    plain_ok = pa.array(["a", None, "b", None, None], pa.large_string())
    yield "string", pa.table({"s": _not_utf8([b"a", BAD_BYTES, b"b", b"\xffb", None], pa.string())}), \
        pa.table({"s": pa.array(["a", None, "b", None, None])})
    yield "large_string", pa.table({"s": plain}), pa.table({"s": plain_ok})
    yield "chunked", pa.table({"s": pa.chunked_array([plain.slice(0, 2), plain.slice(2)])}), \
        pa.table({"s": plain_ok})
    dictionary = pa.DictionaryArray.from_arrays(pa.array([0, 1, 0, 2, None], pa.int32()),
                                                _not_utf8([b"a", BAD_BYTES, b"\xff\xfe", b"\x80unused"]))
    yield "dictionary", pa.table({"s": dictionary}), pa.table({"s": pa.array(["a", None, "a", None, None])})
    sliced = pa.concat_arrays([_not_utf8([BAD_BYTES]), plain])
    yield "sliced", pa.table({"s": sliced.slice(1)}), pa.table({"s": plain_ok})
    keys = pa.array(["s", "s", "s", "t", "s", "u"], pa.string())
    items = _not_utf8([b"a", BAD_BYTES, b"b", b"x", b"\xff", b"z"], pa.string())
    maps = pa.MapArray.from_arrays(pa.array([0, 1, 2, 4, 5, 6], pa.int32()), keys, items)
    ok = pa.MapArray.from_arrays(pa.array([0, 1, 1, 3, 3, 4], pa.int32()),
                                 pa.array(["s", "s", "t", "u"]), pa.array(["a", "b", "x", "z"]))
    yield "map", pa.table({"attrs": maps}), pa.table({"attrs": ok})


@pytest.mark.parametrize("layout", [case[0] for case in _utf8_layouts()])
def test_a_string_that_is_not_utf8_is_a_bad_value_in_every_layout(layout):
    """pyarrow holds any bytes in a string array it did not make itself
    (Parquet, IPC, a binary array's view) and raised a UnicodeDecodeError
    from deep inside the encoding.  It is a bad value like a lone
    surrogate: each errors mode does what it does, and the good values of
    the batch (the other entries of a map too) are read as they are."""
    _, events, without = next(case for case in _utf8_layouts() if case[0] == layout)
    index = Index(algorithm="opindex", schema={"s": "string", "t": "string", "u": "string"})
    index.add_many([1, 2, 3, 4], ["s = 'a'", "s IS NULL", "s = 'b' OR t = 'x'", "u = 'z'"])
    want = [m.tolist() for m in index.match_batch(without)]
    assert want[0] == [1] and 2 in want[1]
    with pytest.raises(BadEventError, match="not valid UTF-8") as caught:
        index.match_batch(events)
    assert (caught.value.event, caught.value.attribute) == (1, "s")
    assert [m.tolist() for m in index.match_batch(events, errors="null")] == want
    results, rejected = index.match_batch(events, errors="report")
    assert [(e.event, e.attribute) for e in rejected] == [(1, "s"), (3, "s")]
    assert [m.tolist() for m in results] == [want[0], [], want[2], [], want[4]]


def test_a_list_holding_a_string_that_is_not_utf8_is_a_bad_value():
    """In a list, as in a map's list values: the whole list is refused (as a
    list holding a bad number is), and the others are read."""
    elements = _not_utf8([b"a", b"b", BAD_BYTES, b"a", b"c"], pa.string())
    lists = pa.ListArray.from_arrays(pa.array([0, 2, 3, 3, 5], pa.int32()), elements)     # [a b] [bad] [] [a c]
    maps = pa.MapArray.from_arrays(pa.array([0, 1, 2, 3, 4], pa.int32()), pa.array(["segs"] * 4), lists)
    index = Index(algorithm="scan", schema={"segs": "list<string>"})
    index.add_many([1, 2, 3], ["segs ONE OF ('a')", "segs IS NULL", "segs IS EMPTY"])
    for events in (pa.table({"segs": lists}), pa.table({"attrs": maps})):
        with pytest.raises(BadEventError, match="not valid UTF-8"):
            index.match_batch(events)
        assert [m.tolist() for m in index.match_batch(events, errors="null")] == [[1], [2], [3], [1]]
        results, rejected = index.match_batch(events, errors="report")
        assert [m.tolist() for m in results] == [[1], [], [3], [1]]
        assert [(e.event, e.attribute) for e in rejected] == [(1, "segs")]


def test_a_signalling_nan_decimal_in_a_dataframe_is_a_bad_value():
    """pandas' ``isna`` raises ``decimal.InvalidOperation`` on a column holding
    ``Decimal('sNaN')`` (read value by value once Arrow refuses the column,
    here for the infinity): it is a bad value, as in a dict; a quiet NaN
    stays pandas' missing marker."""
    index = Index(algorithm="scan", schema={"x": "numeric"})
    index.add_many([1, 2], ["x = 0.1", "x IS NULL"])
    frame = pd.DataFrame({"x": [Decimal("0.1"), Decimal("sNaN"), Decimal("Infinity"), Decimal("NaN"), None]})
    with pytest.raises(BadEventError, match="event 1: attribute 'x' is numeric, got Decimal\\('sNaN'\\)"):
        index.match_batch(frame)
    assert [m.tolist() for m in index.match_batch(frame, errors="null")] == [[1], [2], [2], [2], [2]]
    results, rejected = index.match_batch(frame, errors="report")
    assert [m.tolist() for m in results] == [[1], [], [], [2], [2]] and [e.event for e in rejected] == [1, 2]
