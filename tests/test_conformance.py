"""The conformance suite: every registered algorithm × each backend it runs
on × every life cycle of an index, against the reference evaluator and
DuckDB (the harness and what each life cycle means: tests/conformance.py).

The algorithms are read from the registry when the tests are collected: a
newly registered algorithm is covered with no edit here, and
``test_a_registered_toy_algorithm_runs_the_whole_suite`` shows it by
registering ``scan``'s matchers under another name; an algorithm's
registered ``conformance_options`` are cases of their own
(``betree[max_cap=1,min_size=1]-cpu``).  ``cuda`` cases are
marked ``cuda``: they run under numba's CUDA simulator in CI's simulator
slice (``NUMBA_ENABLE_CUDASIM=1 pytest -m cuda``) on tiny workloads, and on
a GPU where there is one.  The tests of the oracles themselves close the
module.
"""

from __future__ import annotations

import collections
import os
import random

import pytest
import re2
from hypothesis import Phase, find, given, settings
from hypothesis import strategies as st

from engine import Index
from engine.algorithms import registry
from engine.algorithms.registry import Algorithm
from engine.errors import ExpressionTooLarge
from engine.expr import Op, Pred, Xnor, Xor, predicates
from engine.reference import evaluate, matches
from tests import conformance, strategies
from tests.conformance import LIFECYCLES, RESIDUAL_MATCHER, SLOW_OK, cases, lifecycle_cases
from tests.sql_oracle import OracleCannotRepresent, _check_stored, duckdb_matches, semantics_mismatches


# ------------------------------------------------------------------ the suite
# (the option variants: every life cycle but delta's, conformance.VARIANT_CHECKS)
@pytest.mark.parametrize("algorithm,backend,options,lifecycle", lifecycle_cases())
def test_lifecycle(algorithm, backend, options, lifecycle, tmp_path):
    conformance.check_lifecycle(algorithm, backend, lifecycle, tmp_path, options=options)


@pytest.mark.parametrize("algorithm,backend,options", cases(check="pinned"))
def test_pinned_examples(algorithm, backend, options):
    """Long strings sharing prefixes, UUIDs, embedded NUL (numpy issue
    31533's reproducers), int64's ends as ids, float64's ends as bounds
    and values, in the delta and in main, by every route."""
    conformance.check_pinned(algorithm, backend, options)


@pytest.mark.parametrize("algorithm,backend,options", cases(("cpu",), check="large batch"))
def test_large_batch(algorithm, backend, options):
    conformance.check_large_batch(algorithm, backend, options=options)


@pytest.mark.cuda
def test_the_simulator_slice_runs_the_cuda_cases():
    """Under ``NUMBA_ENABLE_CUDASIM=1`` (CI's simulator slice) the cuda
    backend must be available: else every cuda case would be skipped and
    the slice would pass having checked nothing."""
    if os.environ.get("NUMBA_ENABLE_CUDASIM") != "1":
        pytest.skip("not the simulator slice (NUMBA_ENABLE_CUDASIM=1 not set)")
    assert conformance.available("cuda"), "NUMBA_ENABLE_CUDASIM=1 but the cuda backend is not available"


def _case_keys(params) -> set:
    """(algorithm, backend, options id) of each param (options are dicts)."""
    return {(*p.values[:2], conformance.options_id(p.values[2]), *p.values[3:]) for p in params}


def test_every_registered_algorithm_is_a_case():
    want = {(a.name, backend) for a in registry.algorithms() for backend in a.backends}
    assert {tuple(p.values[:2]) for p in cases()} == want
    assert {"scan", "opindex"} <= {name for name, _ in want}
    # the defaults and every conformance_options variant, on every backend
    variants = {(a.name, backend, conformance.options_id(options)) for a in registry.algorithms()
                for options in (None, *a.conformance_options) for backend in a.option_backends(options)}
    assert _case_keys(cases()) == variants and len(cases()) == len(variants)
    assert ("betree", "cpu", "[max_cap=1,min_size=1]") in variants
    assert {p.id for p in cases()} >= {"betree-cpu", "betree[max_cap=1,min_size=1]-cpu"}
    # a variant with an option of one backend runs on that backend only
    over = conformance.options_id({"over": "opindex", "variant": "pcm", "batch_size": 4, "cluster_size": 2,
                                   "threshold": 0})
    assert ("apcm", "cpu", over) in variants and ("apcm", "cuda", over) not in variants
    # every life cycle of the defaults; the variants' cases in VARIANT_CHECKS' life cycles only
    life = _case_keys(lifecycle_cases())
    for name, backend, options in variants:
        runs = set(LIFECYCLES if not options or conformance.VARIANT_CHECKS[backend] is None
                   else conformance.VARIANT_CHECKS[backend]) & set(LIFECYCLES)
        assert {lc for a, b, o, lc in life if (a, b, o) == (name, backend, options)} == runs
    # the variants run every life cycle but the delta's (matched by scan whatever the options)
    for backend in conformance.BACKENDS:
        assert set(LIFECYCLES) - set(conformance.VARIANT_CHECKS[backend]) == {"delta"}
    assert {"pinned", "large batch", "limit"} <= set(conformance.VARIANT_CHECKS["cpu"])


def test_each_case_keeps_its_own_saved_examples(tmp_path):
    """A case's failing example is saved for that case alone: the shared
    checks' one inner test function would otherwise replay it in every
    other case (a single defect once failed sixteen cases that way, most
    of them for having too few matches in the replayed example)."""
    from hypothesis.database import DirectoryBasedExampleDatabase
    base = DirectoryBasedExampleDatabase(tmp_path)

    def folder(*case):
        return conformance.case_database(*case, default=base).path

    saved = folder("lifecycle", "apcm", "cuda", "saved", "")
    assert saved == folder("lifecycle", "apcm", "cuda", "saved", "")
    others = {folder("lifecycle", "pstbloom", "cuda", "saved", ""), folder("lifecycle", "apcm", "cuda", "main", ""),
              folder("lifecycle", "apcm", "cuda", "saved", "[variant=pcm]"),
              folder("large batch", "apcm", "cuda", 1500, "")}
    assert saved not in others and len(others) == 4
    assert all(str(path).startswith(str(tmp_path)) for path in others | {saved})
    assert conformance.case_database("lifecycle", "apcm", "cuda", "saved", "", default=None) is None
    # the suite's own cases: under Hypothesis's default database when it has one
    default = getattr(settings.default.database, "path", None)
    if default is not None:
        assert str(conformance.case_database("lifecycle", "apcm", "cuda", "saved", "").path).startswith(str(default))


# ------------------------------------------------------------------ a new algorithm
@pytest.fixture
def toy_algorithm():
    """``scan``'s matchers registered as a new algorithm, for one test."""
    from engine.algorithms.options import ScanOptions
    from engine.algorithms.scan import ScanMatcher
    from engine.algorithms.scan_cuda import ScanCudaMatcher

    toy = registry.register(Algorithm(name="toy-scan", title="toy scan", paper="(a test)", sections="",
                                      implementations={"cpu": ScanMatcher, "cuda": ScanCudaMatcher},
                                      options=ScanOptions))
    try:
        yield toy.name
    finally:
        registry.unregister(toy.name)


@pytest.mark.parametrize("backend", [pytest.param(b, marks=conformance.backend_marks(b)) for b in ("cpu", "cuda")])
def test_a_registered_toy_algorithm_runs_the_whole_suite(toy_algorithm, backend, tmp_path):
    """Registering is all it takes: the toy is a case as soon as it is
    registered, and runs every check of the suite."""
    assert (toy_algorithm, backend) in {tuple(p.values[:2]) for p in cases()}
    tallies = conformance.run_whole_suite(toy_algorithm, backend, tmp_path, max_examples=3 if backend == "cpu" else 2)
    assert set(tallies) == set(LIFECYCLES)


# ------------------------------------------------------------------ beyond a rewrite limit
#: ``n0 = 0 XOR n1 = 1 XOR ... XOR s0 = 'k'``: neither its DNF nor its CNF fits 256 terms
BEYOND_LIMITS = " XOR ".join([f"n{i % 3} = {i}" for i in range(9)] + ["s0 = 'a'", "s1 = 'b'", "b0 = TRUE"])

_limited = [p for p in cases(check="limit") if registry.get(p.values[0]).limit_check is not None]


@pytest.mark.skipif(not RESIDUAL_MATCHER, reason="the residual matcher is not switched on "
                                                 "(tests/conformance.py RESIDUAL_MATCHER)")
@pytest.mark.parametrize("algorithm,backend,options", _limited)
def test_expressions_beyond_the_limit_are_residual_unless_strict(algorithm, backend, options):
    from engine.parse import parse
    node = parse(BEYOND_LIMITS)
    assert not registry.get(algorithm).indexes(node, 256)
    with pytest.raises(ExpressionTooLarge):
        Index(algorithm=algorithm, backend=backend, strict=True, options=options).add(1, node)
    index = Index(algorithm=algorithm, backend=backend, options=options)
    index.add_many([1, 2], [node, "n0 = 0"])
    events = [{"n0": 0}, {"n0": 0, "s0": "a"}, {"n0": 3, "n1": 4}, {}]
    want = [[i for i, e in ((1, node), (2, parse("n0 = 0"))) if matches(e, ev)] for ev in events]
    for merged in (False, True):
        assert [m.tolist() for m in index.match_batch(events)] == want
        index.merge()
    assert index.statistics()["residual"] == 1
    # both halves emptied by one merge (found by a probe: the merge's map of
    # the residual half indexed the empty segment's ranks), then refilled
    index.match({})
    index.remove(1)
    index.remove(2)
    index.merge()
    assert [m.tolist() for m in index.match_batch(events)] == [[], [], [], []]
    index.add(3, "n0 = 0")
    assert [m.tolist() for m in index.match_batch(events)] == [[3] if 2 in w else [] for w in want]
    index.add(4, node)
    index.merge()
    renamed = {1: 4, 2: 3}              # the same expressions under new ids
    assert [m.tolist() for m in index.match_batch(events)] == [sorted(renamed[i] for i in w) for w in want]


# ------------------------------------------------------------------ the generators
def test_the_pools_collide():
    """Most event values are literal values: the generator makes matches,
    equalities and bounds happen (a generator whose events never equal a
    literal would not have caught numpy issue 31533)."""
    rng = random.Random(1)
    events = [conformance.pool_event(rng) for _ in range(400)]
    literal_strings = set(strategies.STRING_POOL)
    hits = sum(v in literal_strings for e in events for a, v in e.items() if a in strategies.STRING_ATTRS)
    assert hits > 0.6 * sum(a in e for e in events for a in strategies.STRING_ATTRS)
    assert sum(len(s) >= 16 for s in strategies.STRING_POOL) >= 10
    assert sum("\x00" in s for s in strategies.STRING_POOL) >= 3
    assert any(ord(c) > 0xFFFF for s in strategies.STRING_POOL for c in s)


def _list_facts(w) -> set:
    """What a workload's list attributes show: list predicates TRUE,
    FALSE or NULL on its events; event lists empty, with None elements,
    with a repeat."""
    facts = set()
    for expr in w.exprs:
        for pred in predicates(expr):
            if pred.attr in strategies.LIST_ATTRS:
                facts.update({True: "true", False: "false", None: "null"}[evaluate(pred, e)] for e in w.events)
    for event in w.events:
        for a in strategies.LIST_ATTRS:
            if event.get(a) is not None:
                present = [v for v in event[a] if v is not None]
                facts.update(fact for fact, holds in (("empty", not present), ("with None", None in event[a]),
                                                      ("repeats", len(present) > len(set(present)))) if holds)
    return facts


@pytest.mark.parametrize("fact", ["true", "false", "null", "empty", "with None", "repeats"])
def test_the_workloads_carry_list_predicates_that_decide_matches(fact):
    """List attributes reach every algorithm through the conformance
    workloads: list predicates that are TRUE, FALSE and NULL on the
    events, and event lists that are empty, hold None elements, repeat a
    value."""
    found = find(conformance.workloads("scan", "cpu"), lambda w: fact in _list_facts(w),
                 settings=settings(max_examples=200, database=None, suppress_health_check=SLOW_OK,
                                   phases=[Phase.generate]))     # (no shrinking: any such workload will do)
    assert fact in _list_facts(found)


# ------------------------------------------------------------------ the oracles themselves
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


@settings(max_examples=30, deadline=None, suppress_health_check=SLOW_OK)
@given(values=st.lists(strategies.strings(max_size=40), min_size=1, max_size=8))
def test_duckdb_is_exact_on_arbitrary_strings(values):
    patterns = [v + "%" for v in values] + ["%" + v for v in values] + [v[:-1] + "_" for v in values]
    regexes = [re2.escape(v) for v in values] + ["^" + re2.escape(v) + "$" for v in values]
    assert semantics_mismatches(values + list(strategies.STRING_POOL[:8]), patterns, regexes) == []


def test_xor_translation_equals_the_definition():
    """``x <> y`` / ``x = y`` (the oracle's XOR / XNOR) equal the
    definitions on every TRUE / FALSE / NULL pair."""
    import duckdb

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
