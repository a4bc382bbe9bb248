"""``opindex`` (OpIndex, Zhang, Chan, Tan, PVLDB 2014) and OpIndex-BS on ``cpu``: the paper's
running example (Tables 1, Figures 4-5, Examples 2 and 5), differential
tests against the reference evaluator and DuckDB on random expressions over
every operator and connective (DNF and CNF routes, prefix lists, absent
attributes, values outside the dictionaries, inserts and removals), the
OpIndex generator and W1 at small scale against ``scan``, and the refusal of
expressions too large for both normal forms."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from engine import Index
from engine import events as event_batches
from engine.algorithms.opindex import OpIndexBSMatcher, OpIndexMatcher, check_expression
from engine.algorithms.scan import ScanMatcher
from engine.compile import PATTERN_CODES
from engine.errors import ExpressionTooLarge
from engine.expr import And, Op, Or, Pred, Xor
from engine.parse import parse
from engine.reference import matches
from engine.workloads import opindex_gen, standard
from tests import strategies
from tests.sql_oracle import duckdb_matches

SCHEMA = strategies.SCHEMA
DUCK_TYPES = {"numeric": "DOUBLE", "string": "VARCHAR", "boolean": "BOOLEAN", "list<numeric>": "DOUBLE[]",
              "list<string>": "VARCHAR[]"}
ARROW_TYPES = {"numeric": pa.float64(), "string": pa.string(), "boolean": pa.bool_(),
               "list<numeric>": pa.list_(pa.float64()), "list<string>": pa.list_(pa.string())}
HYPOTHESIS = dict(deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


# ----------------------------------------------------------------- helpers
def reference_matches(exprs, events, ids=None):
    ids = list(range(len(exprs))) if ids is None else ids
    return [[i for i, e in zip(ids, exprs) if matches(e, event)] for event in events]


def oracle_matches(exprs, events):
    """Per event, the ids of the expressions TRUE on it, by the reference
    evaluator -- checked against DuckDB."""
    expected = reference_matches(exprs, events)
    duck = duckdb_matches(exprs, events, {a: DUCK_TYPES[f] for a, f in SCHEMA.items()})
    assert expected == [[i for i in range(len(exprs)) if j in duck[i]] for j in range(len(events))], \
        "the oracles disagree"
    return expected


def run_matcher(matcher, index, events, alive=None):
    """Match ``events`` with a matcher built on ``index``'s main segment, the
    way Index does (pattern results per batch, tombstones through alive)."""
    seg = matcher.segment
    batch = event_batches.encode_events(events, index.schema)
    preds = seg.predicates
    pairs = np.unique(np.stack([preds.attr, preds.aux], axis=1)[np.isin(preds.op, PATTERN_CODES)], axis=0)
    truth = event_batches.pattern_truth(batch, index.schema, pairs)
    batch.list_truth = event_batches.list_truth(batch, preds.list_index(index.schema))
    alive = np.ones(len(seg), np.uint8) if alive is None else alive
    e, pos = matcher.match(batch, truth, alive)
    assert np.all(np.diff(e) >= 0)
    ids = seg.sub_ids[pos]
    out = [ids[e == j].tolist() for j in range(batch.n_events)]
    assert all(row == sorted(set(row)) for row in out), "positions must be ascending and unique per event"
    return out


def main_index(exprs, ids=None, **kw):
    index = Index(algorithm="opindex", backend="cpu", schema=SCHEMA, **kw)
    index.add_many(list(range(len(exprs))) if ids is None else ids, exprs)
    index.merge()
    index.match({})             # builds the matcher (and recodes the predicates)
    return index


# --------------------------------------------------- the paper's example
PAPER_SUBS = {  # Table 1
    1: "A = 2 AND B IN (3, 6, 9)",
    2: "A <= 8 AND C >= 2",
    3: "C = 6 AND B <= 4 AND E BETWEEN 3 AND 12",
    4: "A = 2",
    5: "D >= 12 AND E <= 9",
    6: "B IN (3, 6) AND C <= 4 AND D >= 10 AND E <= 7",
}
PAPER_SCHEMA = {a: "numeric" for a in "ABCDE"}     # the global attribute order A < B < C < D < E


def paper_index():
    index = Index(algorithm="opindex", backend="cpu", schema=PAPER_SCHEMA)
    index.add_many(list(PAPER_SUBS), list(PAPER_SUBS.values()))
    index.merge()
    index.match({})
    return index


@pytest.mark.parametrize("cls", [OpIndexMatcher, OpIndexBSMatcher])
def test_paper_running_example(cls):
    index = paper_index()
    m = cls(index._main)
    ids = index._main.sub_ids
    attr = index.schema.attr_ids
    # Example 2 / Figure 4: Δ from the subscriptions gives the pivots A, C, D
    parts = {a: sorted(int(ids[p]) for p in positions) for a, positions in m.partitions().items()}
    assert parts == {attr["A"]: [1, 2, 4], attr["C"]: [3], attr["D"]: [5, 6]}
    # Figure 5: predicate lists by pivot and operator, sorted by (attribute, operand),
    # IN rewritten to '=' entries and BETWEEN to '>=' and '<=' (§4.2)
    lists = {(k[0], k[1]): [(a, v, int(ids[p])) for a, v, p in rows] for k, rows in m.predicate_lists().items()}
    A, B, C, D, E = (attr[x] for x in "ABCDE")
    assert lists == {
        (A, "="): [(A, 2, 1), (A, 2, 4), (B, 3, 1), (B, 6, 1), (B, 9, 1)],
        (A, "<="): [(A, 8, 2)],
        (A, ">="): [(C, 2, 2)],
        (C, "="): [(C, 6, 3)],
        (C, "<="): [(B, 4, 3), (E, 12, 3)],
        (C, ">="): [(E, 3, 3)],
        (D, "="): [(B, 3, 6), (B, 6, 6)],
        (D, "<="): [(C, 4, 6), (E, 7, 6), (E, 9, 5)],
        (D, ">="): [(D, 10, 6), (D, 12, 5)],
    }
    assert m.n_counters == 6 and m.counter_init.tolist() == [2, 2, 1, 4, 2, 4]   # V_A, V_C, V_D
    events = [
        {"B": 6, "C": 3, "E": 9},                    # Example 5: only L_C is searched; S2, S5 not accessed
        {"A": 2, "B": 6},                            # Example 2: L_C and L_D are never accessed
        {"A": 2, "B": 3, "C": 2, "D": 12, "E": 7},
        {"A": 9, "B": 4, "C": 6, "E": 12},
        {"A": 8, "C": 2},
        {"B": 3, "C": 4, "D": 10, "E": 7},
    ]
    expected = [[], [1, 4], [1, 2, 4, 5, 6], [3], [2], [6]]
    exprs = [parse(text) for text in PAPER_SUBS.values()]
    assert reference_matches(exprs, events, list(PAPER_SUBS)) == expected
    assert run_matcher(m, index, events) == expected
    assert [r.tolist() for r in index.match_batch(events)] == expected


def test_paper_pivots_follow_an_event_log():
    """§4.1: Δ(A) may come from an event log instead of the subscriptions; the
    pivot moves to the attribute the events carry least, results do not."""
    index = paper_index()
    attr = index.schema.attr_ids
    log = event_batches.encode_events([{"A": 1, "B": 1, "C": 1, "D": 1}] * 5 + [{"E": 1, "A": 1}], index.schema)
    m = OpIndexMatcher(index._main, event_log=log)
    counts = np.full(len(attr), 5, np.int64)
    counts[attr["B"]] = 1
    m2 = OpIndexMatcher(index._main, event_log=counts)
    ids = index._main.sub_ids
    parts = {a: sorted(int(ids[p]) for p in ps) for a, ps in m.partitions().items()}
    assert parts[attr["E"]] == [3, 5, 6]          # E is the rarest attribute of the log
    assert sorted(int(ids[p]) for p in m2.partitions()[attr["B"]]) == [1, 3, 6]
    events = [{"A": 2, "B": 3, "C": 2, "D": 12, "E": 7}, {"B": 4, "C": 6, "E": 12}, {"A": 2}]
    for matcher in (m, m2):
        assert run_matcher(matcher, index, events) == [[1, 2, 4, 5, 6], [3], [4]]


# ------------------------------------------------------- differential tests
@settings(max_examples=40, **HYPOTHESIS)
@given(exprs=st.lists(strategies.expressions(with_not_matches=True).filter(strategies.fits_normal_form), min_size=1, max_size=25),
       events=st.lists(strategies.events(), min_size=1, max_size=12))
def test_opindex_agrees_with_reference_and_duckdb(exprs, events):
    expected = oracle_matches(exprs, events)
    index = main_index(exprs)
    assert [m.tolist() for m in index.match_batch(events)] == expected
    arrow = pa.table({a: pa.array([e.get(a) for e in events], ARROW_TYPES[f]) for a, f in SCHEMA.items()})
    assert [m.tolist() for m in index.match_batch(arrow)] == expected
    assert [index.match(e).tolist() for e in events] == expected
    seg = index._main
    # OpIndex-BS; the prefix lists (schema given); a tiny normal-form limit (CNF and
    # the always-checked route); one segment, 2-bit signatures (collisions), float64 operands
    for matcher in (OpIndexBSMatcher(seg), OpIndexMatcher(seg, schema=index.schema),
                    OpIndexMatcher(seg, schema=index.schema, dnf_limit=2),
                    OpIndexMatcher(seg, segments=1, signature_bits=2, operand_ranks=False)):
        assert run_matcher(matcher, index, events) == expected, matcher


# ------------------------------------------------------------ §6.1, §6.2
def test_dnf_and_cnf_routes():
    exprs = [
        "(n0 = 1 OR n1 = 1) AND (n2 = 1 OR s0 = 'a') AND (b0 = TRUE OR s1 = 'b')",   # CNF: 6 entries x 2 pivots
        "(n0 = 1 AND n1 = 2) OR (n2 > 0 AND s0 LIKE 'a%')",                          # DNF: 2 conjunctions
        "n0 = 1 XOR n1 = 1",                                                          # DNF with negations
        "NOT (n0 = 1 OR s0 IS NULL)",
        "n0 IS NULL AND n1 = 2",                                                      # IS NULL checked at 0
        "n0 IS NULL",                                                                 # always checked
        "n0 != 5 OR n1 IS NULL",                                                      # a conjunction of IS NULL
        "n0 BETWEEN 1 AND 3 OR n1 BETWEEN 2 AND 1",                                   # empty BETWEEN
        "(n0 BETWEEN 1 AND 2 OR n1 NOT IN (1, 2)) AND (n2 BETWEEN 0 AND 1 OR s1 MATCHES 'b$')",
    ]
    nodes = [parse(t) for t in exprs]
    index = main_index(nodes)
    m = index._matcher
    assert m.form_counts["cnf"] >= 1 and m.form_counts["dnf"] >= 3 and m.form_counts["always"] == 2
    events = [{}, {"n0": 1}, {"n1": 1}, {"n0": 1, "n1": 1}, {"n0": 1, "n2": 1, "b0": True},
              {"n1": 1, "s0": "a", "s1": "b"}, {"n0": 1, "n1": 2}, {"n2": 3, "s0": "ab"}, {"n1": 2},
              {"n0": 5}, {"n0": 6}, {"n0": 2, "n2": 0.5}, {"n1": 3, "s1": "ab"}, {"n0": 1.5, "n1": 1, "s1": "b"}]
    expected = reference_matches(nodes, events)
    assert [r.tolist() for r in index.match_batch(events)] == expected
    for matcher in (OpIndexBSMatcher(index._main), OpIndexMatcher(index._main, dnf_limit=1)):
        assert run_matcher(matcher, index, events) == expected


def test_prefix_lists_on_string_codes():
    """§6.2: LIKE 'p%' as a code interval (with the schema); strings outside
    the dictionary share codes with their neighbours, so the interval is
    only a filter and the exact pattern result decides."""
    subs = ["s0 LIKE 'ab%'", "s0 LIKE 'a%' AND s1 = 'x'", "s0 LIKE '%'", "s0 LIKE 'b%' OR s0 = 'abd'",
            "s0 LIKE 'ab'", "s0 LIKE '%b'", "s0 >= 'ab' AND s0 < 'ac'", "s0 LIKE '\U0010ffff%'",
            "s0 IN ('aa', 'abc', 'ac')"]
    nodes = [parse(t) for t in subs]
    index = main_index(nodes)
    m = OpIndexMatcher(index._main, schema=index.schema)
    assert m._has_prefix
    values = ["", "a", "aa", "ab", "aba", "abc", "abcd", "abd", "abz", "ac", "b", "ba", "\U0010ffff", "\U0010ffffz",
              "zz", "é"]
    events = [{"s0": v, "s1": "x"} for v in values] + [{"s1": "x"}, {"s0": "ab"}]
    expected = reference_matches(nodes, events)
    assert run_matcher(m, index, events) == expected
    assert [r.tolist() for r in index.match_batch(events)] == expected
    # the string dictionary grows (a delta subscription): codes move under the built matchers
    index.add(100, "s0 = 'abb' OR s1 = 'abcc'")
    events.append({"s0": "abb"})
    nodes.append(parse("s0 = 'abb' OR s1 = 'abcc'"))
    expected = reference_matches(nodes, events, list(range(len(subs))) + [100])
    assert [r.tolist() for r in index.match_batch(events)] == expected
    # a matcher serves one dictionary; recoded() follows its growth with a new one
    followed = m.recoded(m.segment.coded(index.schema), index.schema)
    assert followed is not m
    assert run_matcher(followed, index, events) == [[i for i in row if i != 100] for row in expected]


def test_float_operands_and_many_predicates():
    """Operands as 16-bit ranks and as float64 values; long conjunctions take
    wider counters."""
    nodes = [parse("n0 = 0.1"), parse("n0 < 16777217 AND n0 > 16777216"), parse("n0 >= 0.1"),
             parse("n0 BETWEEN -1e300 AND -1e299 OR n1 = 0.30000000000000004")]
    events = [{"n0": 0.1}, {"n0": 16777216.5}, {"n0": 0.1000000001}, {"n0": 5, "n1": 0.1}, {"n0": 1.5},
              {"n0": -1e300}, {"n0": 16777217}, {"n1": 0.1 + 0.2}, {"n1": 0.3}, {"n0": -1e299 - 1e285}]
    index = main_index(nodes)
    expected = reference_matches(nodes, events)
    assert index._matcher.ent_val.dtype == np.uint16
    assert [r.tolist() for r in index.match_batch(events)] == expected
    raw = OpIndexMatcher(index._main, operand_ranks=False)
    assert raw.ent_val.dtype == np.float64
    assert run_matcher(raw, index, events) == expected
    wide = [parse(" AND ".join(f"n0 != {k}" for k in range(200)) + " AND n1 = 0.1"), parse("n0 = 3")]
    index = main_index(wide)
    assert index._matcher.counter_init.dtype == np.int16
    events = [{"n0": 300, "n1": 0.1}, {"n0": 5, "n1": 0.1}, {"n0": 3}, {"n1": 0.1}]
    assert [r.tolist() for r in index.match_batch(events)] == reference_matches(wide, events)


def test_too_large_expressions_are_refused():
    """Beyond the limit in both DNF and CNF: ExpressionTooLarge at add time
    (check_expression); the matcher itself never fails on one."""
    xor = Xor(Xor(Pred("n0", Op.EQ, (1,)), Pred("n1", Op.EQ, (1,))),
              Xor(Pred("n2", Op.EQ, (1,)), Pred("s0", Op.EQ, ("a",))))      # 8 conjunctions, 8 clauses
    with pytest.raises(ExpressionTooLarge, match="more than 4 conjunctions and more than 4 clauses"):
        check_expression(xor, 4)
    check_expression(xor, 8)
    # DNF too large but CNF small (and the other way round): accepted
    cnf_shaped = And(tuple(Or((Pred(f"n{k}", Op.EQ, (j,)), Pred(f"n{k}", Op.GT, (j + 5,)))) for k in range(2)
                           for j in range(2)))
    check_expression(cnf_shaped, 4)
    check_expression(Or(tuple(And((Pred("n0", Op.EQ, (k,)), Pred("n1", Op.EQ, (k,)))) for k in range(4))), 4)
    index = main_index([xor, cnf_shaped])
    m = OpIndexMatcher(index._main, dnf_limit=4)
    assert m.form_counts["always"] == 1 and m.form_counts["cnf"] == 1
    events = [{"n0": 1}, {"n0": 1, "n1": 1}, {"n0": 0, "n1": 1, "n2": 0}, {"n0": 7, "n1": 1, "n2": 8, "s0": "a"}]
    assert run_matcher(m, index, events) == reference_matches([xor, cnf_shaped], events)


# ------------------------------------------------ workloads against scan
def _against_scan(workload, **matcher_options):
    index = Index(algorithm="scan", backend="cpu")
    index.add_many(workload.subscriptions)
    index.merge()
    index.match({})
    seg = index._main
    batch = event_batches.encode_events(workload.events, index.schema)
    truth = np.zeros((1, 1), np.uint8)
    alive = np.ones(len(seg), np.uint8)
    alive[::7] = 0                                   # tombstones
    want = ScanMatcher(seg).match(batch, truth, alive)
    for cls in (OpIndexMatcher, OpIndexBSMatcher):
        m = cls(seg, **matcher_options)
        m._matches_per_event = 1.0                   # force the resume path (output overflow)
        got = m.match(batch, truth, alive)
        assert np.array_equal(got[0], want[0]) and np.array_equal(got[1], want[1]), cls
    return len(want[0]) / batch.n_events


def test_opindex_generator_equals_scan():
    w = opindex_gen(3000, 200, dims=300, cardinality=20, gamma_max=6, m=30, theta=0.4, seed=3)
    assert _against_scan(w) > 0


def test_w1_small_equals_scan():
    w = standard("W1", scale=0.003, n_events=150)
    assert _against_scan(w, event_log=np.arange(400)[::-1]) > 1


def test_w1_through_the_index():
    w = standard("W1", scale=0.002, n_events=100)
    indexes = {}
    for algorithm in ("scan", "opindex"):
        indexes[algorithm] = index = Index(algorithm=algorithm, backend="cpu")
        index.add_many(w.subscriptions)
    assert indexes["scan"].match_batch(w.events, output="arrow").equals(
        indexes["opindex"].match_batch(w.events, output="arrow"))
    assert indexes["opindex"].nbytes > indexes["opindex"]._main.nbytes
    # tombstones under a built matcher, batches large enough for its per-counter liveness copy
    for sub_id in np.unique(w.subscriptions["sub_id"].to_numpy())[::3]:
        for index in indexes.values():
            index.remove(int(sub_id))
    assert indexes["scan"].match_batch(w.events, output="arrow").equals(
        indexes["opindex"].match_batch(w.events, output="arrow"))


# ------------------------------------------------------------- odds and ends
def test_empty_and_options():
    index = Index(algorithm="opindex", backend="cpu", schema=SCHEMA)
    assert index.match({"n0": 1}).tolist() == []
    index.add(1, "n0 = 1")
    assert index.match({"n0": 1}).tolist() == [1]
    index.merge()
    assert index.match({"n0": 1}).tolist() == [1]
    assert index.match_batch([{}, {"zz": 1}, {"n0": 1}], output="arrow").to_pydict() == {"event": [2], "sub_id": [1]}
    seg = index._main
    with pytest.raises(ValueError, match="power of two"):
        OpIndexMatcher(seg, segments=3)
    with pytest.raises(ValueError, match="power of two"):
        OpIndexMatcher(seg, signature_bits=65)
    with pytest.raises(ValueError, match="variant"):
        OpIndexMatcher(seg, variant="fast")
    with pytest.raises(Exception, match="cpu"):
        OpIndexMatcher(seg, backend="cuda")
    m = OpIndexMatcher(seg)
    assert m.nbytes > seg.nbytes and "OpIndexMatcher" in repr(m)


def test_index_refuses_too_large_expressions_at_add_time_and_passes_options():
    from engine import ExpressionTooLarge, Index

    wide = " AND ".join(f"(a{i} = 1 OR b{i} = 2)" for i in range(6))     # DNF 64 conjunctions, CNF 6 clauses
    index = Index(algorithm="opindex", backend="cpu", dnf_limit=8, strict=True)
    index.add(1, wide)                                                  # CNF fits
    huge = " OR ".join(f"(a{i} = 1 AND b{i} = 2 AND c{i} = 3)" for i in range(4))  # DNF 4, CNF 81
    index.add(2, huge)
    too_big = " AND ".join(f"((a{i} = 1 OR b{i} = 2) XOR c{i} = 1)" for i in range(3))   # DNF 27, CNF 18
    with pytest.raises(ExpressionTooLarge):
        index.add(3, too_big)
    assert len(index) == 2 and 3 not in index
    events = [{"a0": 1, "a1": 1, "a2": 1, "a3": 1, "a4": 1, "a5": 1}, {"a2": 1, "b2": 2, "c2": 3}]
    assert [m.tolist() for m in index.match_batch(events)] == [[1], [2]]
    lenient = Index(algorithm="opindex", backend="cpu", dnf_limit=8)   # (not strict: matched as residual)
    lenient.add_many([1, 2, 3], [wide, huge, too_big])
    lenient.merge()
    events.append({"a0": 1, "a1": 1, "a2": 1, "c0": 0, "c1": 0, "c2": 0})
    assert [m.tolist() for m in lenient.match_batch(events)] == [[1], [2], [3]]
    bs = Index(algorithm="opindex", backend="cpu", dnf_limit=8, options={"variant": "bs"})
    bs.add_many([1, 2], [wide, huge])
    assert [m.tolist() for m in bs.match_batch(events)] == [[1], [2], []]
    assert bs._matchers()[0][2].variant == "bs"
