"""``scan`` on ``cpu`` against the two independent oracles -- the reference
evaluator and DuckDB -- on random expressions over every operator and
connective, and random events with absent attributes and values outside
every dictionary."""

from __future__ import annotations

import pyarrow as pa
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from engine import Index
from engine.reference import matches
from tests import strategies
from tests.sql_oracle import duckdb_matches

SCHEMA = {**{a: "numeric" for a in strategies.NUMERIC_ATTRS}, **{a: "string" for a in strategies.STRING_ATTRS},
          **{a: "boolean" for a in strategies.BOOLEAN_ATTRS}}
DUCK_TYPES = {"numeric": "DOUBLE", "string": "VARCHAR", "boolean": "BOOLEAN"}
ARROW_TYPES = {"numeric": pa.float64(), "string": pa.string(), "boolean": pa.bool_()}


def arrow_events(events):
    return pa.table({a: pa.array([e.get(a) for e in events], ARROW_TYPES[f]) for a, f in SCHEMA.items()})


def expected_matches(exprs, events):
    """Per event, the sorted ids of the expressions TRUE on it -- by the
    reference evaluator, checked against DuckDB."""
    by_reference = [[i for i, expr in enumerate(exprs) if matches(expr, event)] for event in events]
    duck = duckdb_matches(exprs, events, {a: DUCK_TYPES[f] for a, f in SCHEMA.items()})
    by_duckdb = [[i for i in range(len(exprs)) if j in duck[i]] for j in range(len(events))]
    assert by_reference == by_duckdb, "the oracles disagree"
    return by_reference


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(exprs=st.lists(strategies.expressions(with_not_matches=True), min_size=1, max_size=25),
       events=st.lists(strategies.events(), min_size=1, max_size=15))
def test_scan_agrees_with_reference_and_duckdb(exprs, events):
    expected = expected_matches(exprs, events)
    index = Index(algorithm="scan", backend="cpu", schema=SCHEMA)
    index.add_many(range(len(exprs)), exprs)
    assert [m.tolist() for m in index.match_batch(events)] == expected          # delta (not yet merged)
    index.merge()
    assert [m.tolist() for m in index.match_batch(events)] == expected          # main segment
    assert [m.tolist() for m in index.match_batch(arrow_events(events))] == expected
    assert [index.match(e).tolist() for e in events] == expected


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(exprs=st.lists(strategies.expressions(), min_size=2, max_size=20),
       events=st.lists(strategies.events(), min_size=1, max_size=10),
       data=st.data())
def test_interleaved_adds_and_removes_agree_with_reference(exprs, events, data):
    """Subscriptions spread over main segment, delta and tombstones give the
    same result as a fresh index of the survivors."""
    index = Index(algorithm="scan", backend="cpu", schema=SCHEMA)
    half = len(exprs) // 2
    index.add_many(range(half), exprs[:half])
    index.merge()
    for i in range(half, len(exprs)):
        index.add(i, exprs[i])
    removed = data.draw(st.sets(st.integers(0, len(exprs) - 1), max_size=len(exprs)))
    for i in sorted(removed):
        index.remove(i)
    alive = [i for i in range(len(exprs)) if i not in removed]
    assert len(index) == len(alive)
    assert all((i in index) == (i not in removed) for i in range(len(exprs)))
    expected = [[i for i in alive if matches(exprs[i], e)] for e in events]
    assert [m.tolist() for m in index.match_batch(events)] == expected
    index.merge()
    assert [m.tolist() for m in index.match_batch(events)] == expected
