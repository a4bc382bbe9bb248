"""``scan`` on ``cpu`` against the two independent oracles -- the reference
evaluator and DuckDB -- on random expressions over every operator and
connective, and random events with absent attributes and values outside
every dictionary.

The values are what users send (tests/strategies.py): long strings sharing
long prefixes (URLs, UUIDs), non-ASCII, embedded NULs, the empty string,
numbers exactly on the predicates' bounds (-0.0 next to 0), deep and wide
expressions, and a large batch.  Every event container is checked: one
event at a time (``match``), a list of dicts, Arrow tables (string,
large_string and dictionary columns), a pandas DataFrame, and
``output="arrow"``.  The issue's reproducers (NumPy's StringDType
``searchsorted``, numpy issue 31533) are pinned deterministically at the
end, for ``scan`` and ``opindex``."""

from __future__ import annotations

import random
import uuid

import pandas as pd
import pyarrow as pa
import pytest
import re2
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from engine import Index
from engine.reference import matches
from tests import strategies
from tests.sql_oracle import OracleCannotRepresent, _check_stored, duckdb_matches, semantics_mismatches

SCHEMA = {**{a: "numeric" for a in strategies.NUMERIC_ATTRS}, **{a: "string" for a in strategies.STRING_ATTRS},
          **{a: "boolean" for a in strategies.BOOLEAN_ATTRS}}
DUCK_TYPES = {"numeric": "DOUBLE", "string": "VARCHAR", "boolean": "BOOLEAN"}
ARROW_TYPES = {"numeric": pa.float64(), "string": pa.string(), "boolean": pa.bool_()}

_SLOW_OK = [HealthCheck.too_slow, HealthCheck.data_too_large]


def arrow_events(events, string_type=pa.string(), dictionary=False):
    columns = {}
    for a, f in SCHEMA.items():
        column = pa.array([e.get(a) for e in events], string_type if f == "string" else ARROW_TYPES[f])
        if dictionary and f == "string":
            column = column.dictionary_encode()
        columns[a] = column
    return pa.table(columns)


def expected_matches(exprs, events):
    """Per event, the sorted ids of the expressions TRUE on it -- by the
    reference evaluator, checked against DuckDB."""
    by_reference = [[i for i, expr in enumerate(exprs) if matches(expr, event)] for event in events]
    duck = duckdb_matches(exprs, events, {a: DUCK_TYPES[f] for a, f in SCHEMA.items()})
    by_duckdb = [[i for i in range(len(exprs)) if j in duck[i]] for j in range(len(events))]
    assert by_reference == by_duckdb, "the oracles disagree"
    return by_reference


def pairs_to_lists(table, n_events):
    """``output="arrow"`` -> one sorted id list per event (checking the order)."""
    event, sub_id = table.column("event").to_pylist(), table.column("sub_id").to_pylist()
    assert list(zip(event, sub_id)) == sorted(zip(event, sub_id)), "pairs not ordered by (event, sub_id)"
    out = [[] for _ in range(n_events)]
    for e, s in zip(event, sub_id):
        out[e].append(s)
    return out


def every_route(index, events):
    """The index's answer on ``events`` through every container and output,
    each as one sorted id list per event; all must be equal."""
    routes = {
        "match": [index.match(e).tolist() for e in events],
        "dicts": [m.tolist() for m in index.match_batch(events)],
        "arrow": [m.tolist() for m in index.match_batch(arrow_events(events))],
        "arrow large_string, dictionary": [m.tolist() for m in index.match_batch(
            arrow_events(events, pa.large_string(), dictionary=True))],
        "output=arrow": pairs_to_lists(index.match_batch(events, output="arrow"), len(events)),
    }
    first = routes["dicts"]
    for name, got in routes.items():
        assert got == first, f"{name} differs from the list of dicts"
    return first


# ---------------------------------------------------------------- random workloads


def delta_then_main_agree(exprs, events, expected) -> Index:
    """``scan`` with the expressions in its delta, then merged into its main
    segment (every route), gives ``expected``; returns the index."""
    index = Index(algorithm="scan", backend="cpu", schema=SCHEMA)
    index.add_many(range(len(exprs)), exprs)
    assert [m.tolist() for m in index.match_batch(events)] == expected          # delta (not yet merged)
    index.merge()
    assert every_route(index, events) == expected                               # main segment
    return index


@settings(max_examples=40, deadline=None, suppress_health_check=_SLOW_OK)
@given(exprs=st.lists(strategies.expressions(with_not_matches=True), min_size=1, max_size=25),
       events=st.lists(strategies.events(), min_size=1, max_size=15))
def test_scan_agrees_with_reference_and_duckdb(exprs, events):
    expected = expected_matches(exprs, events)
    index = delta_then_main_agree(exprs, events, expected)
    frame = pd.DataFrame({a: pd.Series([e.get(a) for e in events], dtype=object) for a in SCHEMA})
    assert [m.tolist() for m in index.match_batch(frame)] == expected


@settings(max_examples=25, deadline=None, suppress_health_check=_SLOW_OK)
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


@settings(max_examples=12, deadline=None, suppress_health_check=_SLOW_OK)
@given(exprs=st.lists(strategies.deep_expressions(with_not_matches=True), min_size=1, max_size=6),
       events=st.lists(strategies.events(), min_size=1, max_size=10))
def test_deep_and_wide_expressions_agree(exprs, events):
    """Trees of up to 48 leaves with AND/OR of up to 8 children, and chains
    nested 10 to 40 levels deep."""
    expected = expected_matches(exprs, events)
    index = Index(algorithm="scan", backend="cpu", schema=SCHEMA)
    index.add_many(range(len(exprs)), exprs)
    index.merge()
    assert every_route(index, events) == expected


@st.composite
def _own_strings_workload(draw):
    """Arbitrary Unicode values (strategies.strings: NUL, astral and
    combining characters, long values on the pools' prefixes) used both as
    the predicates' operands and as the events' values, so that they meet."""
    values = draw(st.lists(strategies.strings(max_size=40), min_size=1, max_size=6, unique=True))
    literals = st.one_of(st.sampled_from(values), strategies.string_literals)
    leaves = strategies.string_predicates(literals)
    exprs = draw(st.lists(strategies.expressions(max_leaves=6, leaves=leaves), min_size=1, max_size=12))
    value = st.one_of(st.sampled_from(values), st.sampled_from(values), literals, strategies.strings())
    events = draw(st.lists(st.fixed_dictionaries({}, optional={a: value for a in strategies.STRING_ATTRS}),
                           min_size=1, max_size=10))
    return exprs, events


@settings(max_examples=30, deadline=None, suppress_health_check=_SLOW_OK)
@given(workload=_own_strings_workload())
def test_arbitrary_strings_agree(workload):
    exprs, events = workload
    expected = expected_matches(exprs, events)
    delta_then_main_agree(exprs, events, expected)


def _pool_event(rng: random.Random) -> dict:
    event = {}
    for a in strategies.NUMERIC_ATTRS:
        if rng.random() < 0.8:
            pool = rng.choice([strategies.NUMERIC_LITERAL_FLOATS, strategies.NUMERIC_LITERAL_INTS,
                               strategies.NUMERIC_EVENT_EXTRAS, range(-3, 4)])
            event[a] = rng.choice(list(pool))
    for a in strategies.STRING_ATTRS:
        if rng.random() < 0.8:
            event[a] = rng.choice(strategies.STRING_POOL if rng.random() < 0.75 else strategies.STRING_EVENT_EXTRAS)
    if rng.random() < 0.8:
        event["b0"] = rng.random() < 0.5
    return event


@settings(max_examples=2, deadline=None, suppress_health_check=_SLOW_OK)
@given(exprs=st.lists(strategies.expressions(max_leaves=8, with_not_matches=True), min_size=60, max_size=60),
       seed=st.integers(0, 2 ** 32 - 1))
def test_large_batch_agrees(exprs, seed):
    """1,500 events in one batch (DuckDB takes them through Arrow), drawn
    from the pools with a seeded RNG (a hypothesis list that long would
    overrun its buffer)."""
    rng = random.Random(seed)
    events = [_pool_event(rng) for _ in range(1500)]
    expected = expected_matches(exprs, events)
    assert sum(map(len, expected)) > 0
    index = Index(algorithm="scan", backend="cpu", schema=SCHEMA)
    index.add_many(range(len(exprs)), exprs)
    index.merge()
    assert [m.tolist() for m in index.match_batch(events)] == expected
    assert [m.tolist() for m in index.match_batch(arrow_events(events))] == expected
    assert pairs_to_lists(index.match_batch(arrow_events(events), output="arrow"), len(events)) == expected


def test_the_pools_collide():
    """Most event values are literal values: the generator makes matches,
    equalities and bounds happen (a generator whose events never equal a
    literal would not have caught numpy issue 31533)."""
    rng = random.Random(1)
    events = [_pool_event(rng) for _ in range(400)]
    literal_strings = set(strategies.STRING_POOL)
    hits = sum(v in literal_strings for e in events for a, v in e.items() if a in strategies.STRING_ATTRS)
    assert hits > 0.6 * sum(a in e for e in events for a in strategies.STRING_ATTRS)
    assert sum(len(s) >= 16 for s in strategies.STRING_POOL) >= 10
    assert sum("\x00" in s for s in strategies.STRING_POOL) >= 3
    assert any(ord(c) > 0xFFFF for s in strategies.STRING_POOL for c in s)


# ---------------------------------------------------------------- the oracle itself


def test_duckdb_is_exact_on_every_pool_value_and_pattern():
    """DuckDB's string semantics (stored and literal NULs, code-point order,
    LIKE, RE2) equal Python's and the reference evaluator's on every value
    and pattern the strategies can produce from their pools."""
    values = strategies.STRING_POOL + strategies.STRING_EVENT_EXTRAS
    pool = strategies.STRING_POOL
    likes = (list(strategies.LIKE_POOL) + list(pool) + [v + "%" for v in pool] + ["%" + v for v in pool]
             + [v[:-1] + "_" for v in pool])
    regexes = list(strategies.REGEX_POOL) + [re2.escape(v) for v in pool] + [
        "^" + re2.escape(v) for v in pool] + [re2.escape(v) + "$" for v in pool]
    assert semantics_mismatches(values, likes, regexes) == []


@settings(max_examples=30, deadline=None, suppress_health_check=_SLOW_OK)
@given(values=st.lists(strategies.strings(max_size=40), min_size=1, max_size=8))
def test_duckdb_is_exact_on_arbitrary_strings(values):
    patterns = [v + "%" for v in values] + ["%" + v for v in values] + [v[:-1] + "_" for v in values]
    regexes = [re2.escape(v) for v in values] + ["^" + re2.escape(v) + "$" for v in values]
    assert semantics_mismatches(values + list(strategies.STRING_POOL[:8]), patterns, regexes) == []


def test_xor_translation_equals_the_definition():
    """``x <> y`` / ``x = y`` (the oracle's XOR / XNOR) equal the
    definitions on every TRUE / FALSE / NULL pair."""
    import duckdb

    from engine.expr import Op, Pred, Xnor, Xor
    from tests.sql_oracle import duckdb_evaluate, to_sql

    sides = [Pred("n0", Op.EQ, (1,)), Pred("n1", Op.EQ, (1,))]
    events = [{a: v for a, v in zip(("n0", "n1"), pair) if v is not None}
              for pair in [(x, y) for x in (1, 0, None) for y in (1, 0, None)]]
    exprs = [Xor(*sides), Xnor(*sides), Xor(Xnor(*sides), sides[0])]
    schema = {"n0": "DOUBLE", "n1": "DOUBLE"}
    assert all("<>" in to_sql(e) or "=" in to_sql(e) for e in exprs)
    by_definition = [[row[0] for row in duckdb.execute(
        f"SELECT {to_sql(e, xor_by_definition=True)} FROM (SELECT ?::DOUBLE AS n0, ?::DOUBLE AS n1)",
        [ev.get("n0"), ev.get("n1")]).fetchall()] for e in exprs for ev in events]
    got = duckdb_evaluate(exprs, events, schema)
    assert [[v] for row in got for v in row] == by_definition
    assert got[0] == [False, True, None, True, False, None, None, None, None]


def test_oracle_refuses_what_duckdb_cannot_hold():
    import duckdb

    from engine.expr import Op, Pred

    with pytest.raises(OracleCannotRepresent):
        duckdb_matches([Pred("s0", Op.EQ, ("\ud800",))], [{}], {"s0": "VARCHAR"})
    with pytest.raises(OracleCannotRepresent):
        duckdb_matches([Pred("s0", Op.IS_NULL, ())], [{"s0": "a\udfff"}], {"s0": "VARCHAR"})
    con = duckdb.connect(":memory:")     # a value that came back changed is caught, not compared
    con.execute("CREATE TABLE t (__bexmatch_event_idx BIGINT, s VARCHAR, n DOUBLE)")
    con.execute("INSERT INTO t VALUES (0, 'a', 9007199254740992)")
    _check_stored(con, "t", {"s": "VARCHAR", "n": "DOUBLE"}, [{"s": "a", "n": 2 ** 53}])
    with pytest.raises(OracleCannotRepresent):
        _check_stored(con, "t", {"s": "VARCHAR"}, [{"s": "a\x00"}])
    with pytest.raises(OracleCannotRepresent):
        _check_stored(con, "t", {"n": "DOUBLE"}, [{"n": 2 ** 53 + 1}])


# ---------------------------------------------------------------- the issue's reproducers

ALGORITHMS = ("scan", "opindex")
ROUTES = ("match", "dicts", "arrow")
#: 100 UUIDs sharing their first 30 characters
UUIDS = [str(uuid.UUID(int=0x123E4567E89B12D3A456426614174000 + 7 * i)) for i in range(100)]


def _answers(index, events, route):
    if route == "match":
        return [index.match(e).tolist() for e in events]
    if route == "dicts":
        return [m.tolist() for m in index.match_batch(events)]
    table = pa.Table.from_pylist(events, schema=pa.schema(
        [(name, pa.string()) for name in dict.fromkeys(k for e in events for k in e)]))
    return [m.tolist() for m in index.match_batch(table)]


@pytest.mark.parametrize("route", ROUTES)
@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_issue_long_string_bounds(algorithm, route):
    idx = Index(algorithm=algorithm, backend="cpu")
    idx.add(1, "url > 'https://example.com/a'")
    idx.add(2, "country = 'US'")
    for _ in range(2):                     # in the delta, then merged into the main segment
        assert _answers(idx, [{"url": "https://example.com/b"}], route) == [[1]]
        assert _answers(idx, [{"country": "US"}], route) == [[2]]
        assert _answers(idx, [{"url": "https://example.com/a"}, {"url": "https://example.com/a/b"},
                              {"url": "https://example.com/", "country": "US"}], route) == [[], [1], [2]]
        idx.merge()


@pytest.mark.parametrize("route", ROUTES)
@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_issue_uuids(algorithm, route):
    idx = Index(algorithm=algorithm, backend="cpu")
    idx.add_many(range(100), [f"user = '{u}'" for u in UUIDS])
    events = [{"user": u} for u in UUIDS]
    for _ in range(2):
        got = _answers(idx, events, route)
        assert got == [[i] for i in range(100)], f"{sum(map(len, got))} matches of 100"
        idx.merge()
    # one by one into the delta as well
    idx = Index(algorithm=algorithm, backend="cpu")
    for i, u in enumerate(UUIDS):
        idx.add(i, f"user = '{u}'")
    assert _answers(idx, events, route) == [[i] for i in range(100)]


@pytest.mark.parametrize("route", ROUTES)
@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_issue_embedded_nul(algorithm, route):
    idx = Index(algorithm=algorithm, backend="cpu")
    idx.add(1, "s = 'a\x00b'")
    idx.add(2, "s < 'a\x00c'")
    idx.add(3, "s > 'a'")
    for _ in range(2):
        assert _answers(idx, [{"s": "a\x00c"}], route) == [[3]]
        assert _answers(idx, [{"s": "a\x00b"}, {"s": "a"}, {"s": "a\x00"}], route) == [[1, 2, 3], [2], [2, 3]]
        idx.merge()
