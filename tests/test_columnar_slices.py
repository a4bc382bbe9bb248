"""A large columnar table is compiled in slices of whole subscriptions
(``engine.columnar.SLICE_ROWS``) and the slices joined: the index is the one
the table in one piece makes (the same expressions, the same matches), and a
bad table is refused with the one-piece message, naming its row in the table
given, and changes nothing."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import engine.columnar as columnar
from engine import Index
from engine.columnar import compile_columnar, expressions_as_columns
from engine.errors import SchemaError
from engine.parse import to_text
from engine.schema import Schema
from tests.strategies import SCHEMA, deep_expressions, events
from tests.test_columnar_expressions import BAD, EVENTS, ROWS, TEXTS, as_texts, matches, rows_table

#: one piece, whatever the table
WHOLE = 10 ** 9


@pytest.fixture
def slices_counted(monkeypatch):
    """How many pieces each compile_columnar call compiled (so that a test
    can tell that the table was sliced indeed)."""
    calls = []
    compile_table = columnar._compile_table
    monkeypatch.setattr(columnar, "_compile_table",
                        lambda *a, **k: calls.append(a[0].num_rows) or compile_table(*a, **k))
    return calls


def _index(table, slice_rows, monkeypatch, algorithm="scan", **options) -> Index:
    monkeypatch.setattr(columnar, "SLICE_ROWS", slice_rows)
    index = Index(algorithm=algorithm, backend="cpu", **options)
    index.add_many(table)
    return index


@pytest.mark.parametrize("slice_rows", [1, 2, 3, 5, 9])
def test_interleaved_rows_sliced_make_the_index_the_whole_table_makes(slice_rows, monkeypatch, slices_counted):
    """ROWS interleaves three subscriptions' rows (postfix, in the table's
    order): a slice takes every row of its subscriptions, wherever they are."""
    table = rows_table(ROWS)
    sliced = _index(table, slice_rows, monkeypatch, "atree")
    assert len(slices_counted) > 1
    whole = _index(table, WHOLE, monkeypatch, "atree")
    assert as_texts(sliced, TEXTS) == as_texts(whole, TEXTS)
    assert matches(sliced, EVENTS) == matches(whole, EVENTS)


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                                                  HealthCheck.function_scoped_fixture])
@given(nodes=st.lists(deep_expressions(with_not_matches=True), min_size=2, max_size=10),
       batch=st.lists(events(), max_size=6), slice_rows=st.integers(1, 40), rng=st.randoms(use_true_random=False),
       algorithm=st.sampled_from(["scan", "atree", "opindex"]))
def test_random_tables_sliced_make_the_index_the_whole_table_makes(nodes, batch, slice_rows, rng, algorithm,
                                                                   monkeypatch):
    """Random deep expressions, their subscriptions in a random id order (a
    table in ascending ids is sliced in place, any other through the id
    order), sliced anywhere from one row a slice."""
    ids = rng.sample(range(-50, 1000), len(nodes))
    try:
        table = expressions_as_columns(ids, nodes)
    except ValueError as error:         # what the form cannot hold: a boolean BETWEEN
        assert "cannot hold" in str(error)
        return
    options = dict(dnf_limit=8, schema=SCHEMA)
    sliced = _index(table, slice_rows, monkeypatch, algorithm, **options)
    whole = _index(table, WHOLE, monkeypatch, algorithm, **options)
    assert as_texts(sliced, ids) == as_texts(whole, ids)
    assert sliced.statistics()["residual"] == whole.statistics()["residual"]
    assert matches(sliced, batch) == matches(whole, batch)


def test_slices_share_their_predicates_once(slices_counted):
    """The slices' predicate tables are joined with duplicates dropped: 400
    subscriptions over 3 distinct predicates hold 3, not 3 a slice."""
    n = 400
    table = pa.table({"sub_id": np.repeat(np.arange(n), 2), "attr": ["a", "b"] * n, "op": ["=", "<"] * n,
                      "value": np.tile([1.0, 2.0], n) + np.tile([0.0, 1.0], n) * np.repeat(np.arange(n) % 2, 2)})
    schemas = Schema(), Schema()
    segment, _ = compile_columnar(table, schemas[0], slice_rows=50)
    whole, _ = compile_columnar(table, schemas[1], slice_rows=WHOLE)
    assert len(slices_counted) == 16 + 1
    assert len(segment.predicates) == len(whole.predicates) == 3
    assert segment.sub_ids.tolist() == whole.sub_ids.tolist() == list(range(n))
    texts = [[to_text(s.expression(p, schema.view())) for p in range(n)]
             for s, schema in zip((segment, whole), schemas)]
    assert texts[0] == texts[1]
    assert texts[0][:2] == ["a = 1 AND b < 2", "a = 1 AND b < 3"]


def _refusal(table, slice_rows, monkeypatch):
    """The error adding ``table`` raises, sliced so, on an index holding one
    subscription, and what the index holds and answers afterwards."""
    monkeypatch.setattr(columnar, "SLICE_ROWS", slice_rows)
    index = Index(algorithm="atree", backend="cpu")
    index.add(9, "keep = 1")
    with pytest.raises(Exception) as caught:
        index.add_many(table)
    after = len(index), dict(index.schema.items()), index.match({"keep": 1, "a": 1, "b": 1}).tolist()
    return type(caught.value), str(caught.value), after


#: ids below every id of BAD: first in id order, so in the first slices
_GOOD = [(k, "a", "=", k, None, None) for k in range(-130, -100)]


@pytest.mark.parametrize("rows", [rows for rows, _ in BAD])
def test_a_bad_row_after_good_slices_is_refused_as_in_one_piece_and_changes_nothing(rows, monkeypatch,
                                                                                   slices_counted):
    """Thirty good subscriptions first, compiled slice by slice (registering
    their attribute), then the bad rows: the error is the one-piece error,
    with the bad row's number in the table given, and nothing is kept."""
    rows = _GOOD + rows
    types = {"value": pa.string()} if any(isinstance(r[3], str) for r in rows) else {}
    if types:
        rows = [r if isinstance(r[3], str) or r[3] is None else r[:3] + (str(r[3]),) + r[4:] for r in rows]
    table = rows_table(rows, **types)
    sliced = _refusal(table, 4, monkeypatch)
    assert len(slices_counted) >= 2 and slices_counted[-1] == table.num_rows     # slice(s), then one piece
    assert sliced[0] is SchemaError
    assert sliced == _refusal(table, WHOLE, monkeypatch)
    assert sliced[2] == (1, {"keep": "numeric"}, [9])


@pytest.mark.parametrize("late", [
    (500, "a", "=", "x"),               # a string for a, which the earlier slices made numeric
    (500, "s", "matches", "("),         # a bad RE2 pattern
    (9, "a", "=", 1.0),                 # an id the index holds
])
def test_what_only_a_later_slice_shows_is_refused_as_in_one_piece(late, monkeypatch):
    rows = [(k, "a", "=", float(k)) for k in range(100, 140)] + [late]
    table = pa.table({"sub_id": pa.array([r[0] for r in rows], pa.int64()), "attr": [r[1] for r in rows],
                      "op": [r[2] for r in rows],
                      "value": pa.array([r[3] if isinstance(r[3], float) else None for r in rows], pa.float64()),
                      "str_value": pa.array([r[3] if isinstance(r[3], str) else None for r in rows], pa.string())})
    sliced = _refusal(table, 3, monkeypatch)
    assert sliced == _refusal(table, WHOLE, monkeypatch)
    assert sliced[2] == (1, {"keep": "numeric"}, [9])


def test_ids_held_apart_in_an_unordered_table_are_one_subscription(monkeypatch, slices_counted):
    """Rows of one id far apart in a table out of id order are ANDed, as in
    one piece: the slices follow the id order, not the rows'."""
    rows = [(7, "a", ">", 1, None, None)] + [(k, "b", "=", k, None, None) for k in range(20, 0, -1)] + \
        [(7, "b", "<", 5, None, None)]
    table = rows_table(rows)
    sliced = _index(table, 2, monkeypatch)
    assert len(slices_counted) > 5
    assert sliced.expression(7) == "a > 1 AND b = 7 AND b < 5"
    whole = _index(table, WHOLE, monkeypatch)
    assert sliced.expression(7) == whole.expression(7)
    batch = [{"a": a, "b": b} for a in (0, 2, None) for b in range(0, 22)]
    assert matches(sliced, batch) == matches(whole, batch)


def test_slice_rows_must_be_positive():
    with pytest.raises(ValueError, match="slice_rows must be at least 1"):
        compile_columnar(rows_table(ROWS), Schema(), slice_rows=0)
