"""Normal forms (NNF, DNF, CNF), BE-Tree intervals and conjunction merging
against the reference evaluator, and the reference evaluator against DuckDB.
"""

from __future__ import annotations

import time
from unittest import mock

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from engine.errors import ExpressionTooLarge
from engine.expr import And, Not, Op, Or, Pred, Xnor, Xor, _too_large, negate, to_cnf, to_dnf, to_nnf
from engine.reference import evaluate
from engine.parse import parse
from tests import strategies as S
from tests.sql_oracle import STRATEGIES_SCHEMA, duckdb_evaluate

# Events drawn from the literal pools as well as the event pools, so that
# values on every predicate boundary occur.
_numeric = st.one_of(S.numeric_literals, S.numeric_event_values)
_string = st.one_of(S.string_literals, S.string_event_values)


def boundary_events():
    values = {a: _numeric for a in S.NUMERIC_ATTRS}
    values.update({a: _string for a in S.STRING_ATTRS})
    values.update({a: st.booleans() for a in S.BOOLEAN_ATTRS})
    return st.fixed_dictionaries({}, optional=values)


any_events = st.lists(st.one_of(S.events(), boundary_events()), min_size=1, max_size=12)
BIG = 100_000


def P(attr, op, *values):
    return Pred(attr, op, tuple(values))


def _no_not(node):
    if isinstance(node, Not):
        return False
    if isinstance(node, Pred):
        return True
    if isinstance(node, (And, Or)):
        return all(_no_not(c) for c in node.children)
    return _no_not(node.left) and _no_not(node.right)


def _dnf_value(dnf, event):
    return evaluate(Or(tuple(And(c) for c in dnf)), event)


def _cnf_value(cnf, event):
    return evaluate(And(tuple(Or(c) for c in cnf)), event)


# ---------------------------------------------------------------- NNF / DNF / CNF


@settings(max_examples=200, deadline=None)
@given(S.expressions(with_not_matches=True), any_events)
def test_nnf_is_exact(expr, events):
    nnf = to_nnf(expr)
    assert _no_not(nnf)
    for ev in events:
        assert evaluate(nnf, ev) is evaluate(expr, ev)


@settings(max_examples=200, deadline=None)
@given(S.expressions(max_leaves=8, with_not_matches=True), any_events)
def test_dnf_and_cnf_keep_truth(expr, events):
    dnf = to_dnf(expr, limit=BIG)
    cnf = to_cnf(expr, limit=BIG)
    for terms in (dnf, cnf):
        assert all(len(set(t)) == len(t) for t in terms)                 # no repeated predicate
        assert len({frozenset(t) for t in terms}) == len(terms)          # no repeated term
        assert all(isinstance(p, Pred) for t in terms for p in t)
    for ev in events:
        want = evaluate(expr, ev)
        # TRUE iff some conjunction is all TRUE / every clause has a TRUE predicate
        assert any(all(evaluate(p, ev) is True for p in c) for c in dnf) is (want is True)
        assert all(any(evaluate(p, ev) is True for p in c) for c in cnf) is (want is True)
        # Kleene AND/OR are a distributive lattice: the value itself is kept
        assert _dnf_value(dnf, ev) is want
        assert _cnf_value(cnf, ev) is want


def test_constants_and_shapes():
    a, b, c, d = (P(x, Op.EQ, 1) for x in ("n0", "n1", "n2", "n3"))
    assert to_dnf(And((a, Or((b, c))))) == [(a, b), (a, c)]
    assert to_cnf(Or((a, And((b, c))))) == [(a, b), (a, c)]
    assert to_dnf(Not(And((a, b)))) == [(P("n0", Op.NE, 1),), (P("n1", Op.NE, 1),)]
    assert to_dnf(Xor(a, b)) == [(a, P("n1", Op.NE, 1)), (P("n0", Op.NE, 1), b)]
    assert to_dnf(Xnor(a, b)) == [(a, b), (P("n0", Op.NE, 1), P("n1", Op.NE, 1))]
    assert to_dnf(Not(Xor(a, b))) == to_dnf(Xnor(a, b))
    na, nb = P("n0", Op.NE, 1), P("n1", Op.NE, 1)
    # no clause is dropped as a "tautology": a OR NOT a is NULL where a is NULL
    assert to_cnf(Xor(a, b)) == [(a, na), (a, b), (nb, na), (nb, b)]
    assert to_dnf(And((a, a, Or((a, a))))) == [(a,)]
    assert to_dnf(Or((And((a, b)), And((b, a))))) == [(a, b)]
    assert to_dnf(And(())) == [()] and to_dnf(Or(())) == []
    assert to_cnf(And(())) == [] and to_cnf(Or(())) == [()]
    assert to_dnf(And((a, Or(())))) == []
    # p OR NOT p is not a tautology under three-valued logic: the clause stays
    assert to_cnf(Or((a, Not(a)))) == [(a, P("n0", Op.NE, 1))]
    assert to_dnf(And((b, Or((a, d, c))))) == [(b, a), (b, d), (b, c)]


def _wide(outer, inner, n, k):
    return outer(tuple(inner(tuple(P(f"x{i}", Op.EQ, j) for j in range(k))) for i in range(n)))


def test_size_limit():
    # CNF of an OR of ANDs: k ** n clauses
    expr = _wide(Or, And, 10, 2)
    assert len(to_cnf(expr)) == 1024                 # exactly the default limit
    assert len(to_dnf(expr)) == 10
    with pytest.raises(ExpressionTooLarge, match=r"CNF.*limit of 1023 clauses"):
        to_cnf(expr, limit=1023)
    with pytest.raises(ExpressionTooLarge, match=r"limit of 1024 clauses.*reached at least 1025"):
        to_cnf(_wide(Or, And, 11, 2))
    with pytest.raises(ExpressionTooLarge, match=r"DNF.*limit of 1024 conjunctions"):
        to_dnf(_wide(And, Or, 11, 2))
    with pytest.raises(ExpressionTooLarge):
        to_dnf(Xor(_wide(Or, And, 6, 2), _wide(Or, And, 6, 2)), limit=50)
    with pytest.raises(ValueError):
        to_dnf(P("a", Op.EQ, 1), limit=0)


def test_size_limit_fails_fast():
    """3 ** 40 clauses are never built: the limit stops the product early."""
    t0 = time.perf_counter()
    with pytest.raises(ExpressionTooLarge):
        to_cnf(_wide(Or, And, 40, 3))
    with pytest.raises(ExpressionTooLarge):
        to_dnf(_wide(And, Or, 40, 3))
    chain = P("y0", Op.EQ, 0)
    for i in range(1, 30):                              # deep XOR chain
        chain = Xor(chain, P(f"y{i}", Op.EQ, 0))
    with pytest.raises(ExpressionTooLarge):
        to_dnf(chain)
    assert time.perf_counter() - t0 < 5


CHAIN = 8000


def test_long_chains_are_rewritten_in_linear_time():
    """An n-term chain is one CNF clause (OR) or DNF conjunction (AND) of
    all n predicates, or n single-predicate ones.  Joining the chain's
    single terms one by one copied an ever longer term n times: 8,000
    terms took minutes."""
    start = time.perf_counter()
    preds = tuple(P(f"c{i}", Op.EQ, i) for i in range(CHAIN))
    or_chain, and_chain = Or(preds), And(preds)
    assert to_cnf(or_chain, limit=1) == [preds]
    assert to_dnf(and_chain, limit=1) == [preds]
    assert to_dnf(or_chain, limit=CHAIN) == [(p,) for p in preds]
    assert to_cnf(and_chain, limit=CHAIN) == [(p,) for p in preds]
    with pytest.raises(ExpressionTooLarge, match="limit of 256 conjunctions"):
        to_dnf(or_chain, limit=256)
    with pytest.raises(ExpressionTooLarge, match="limit of 256 clauses"):
        to_cnf(and_chain, limit=256)
    # repetitions are dropped (first occurrence kept), negations folded in
    assert to_cnf(Or(preds + preds[::-1]), limit=1) == [preds]
    assert to_dnf(Not(or_chain), limit=1) == [tuple(negate(p) for p in preds)]
    # a two-term part inside the chain: two conjunctions, the chain around it kept in order
    x, y = P("x", Op.EQ, 1), P("y", Op.EQ, 1)
    half = CHAIN // 2
    split = And(preds[:half] + (Or((x, y)),) + preds[half:])
    assert to_dnf(split, limit=2) == [preds[:half] + (x,) + preds[half:], preds[:half] + (y,) + preds[half:]]
    assert time.perf_counter() - start < 5


def _cross_one_part_at_a_time(parts, dnf, limit):
    """The cross product as it was written before runs of single terms were
    joined first (quadratic on chains): the reference for `_cross`."""
    acc = [()]
    for part in parts:
        if not part:
            return []
        nxt = {}
        for a in acc:
            for b in part:
                term = tuple(dict.fromkeys(a + b))
                nxt.setdefault(frozenset(term), term)
                if len(nxt) > limit:
                    raise _too_large(dnf, limit, len(nxt))
        acc = list(nxt.values())
    return acc


def _outcome(rewrite, expr, limit):
    try:
        return rewrite(expr, limit=limit)
    except ExpressionTooLarge as error:
        return str(error)


# chains over a few predicates, so that repetitions are common, with some
# two-predicate parts and negations among the single ones
_few = st.sampled_from([P(f"n{i}", Op.EQ, 1) for i in range(4)])
_links = st.one_of(_few, _few.map(Not), st.builds(lambda a, b: And((a, b)), _few, _few),
                   st.builds(lambda a, b: Or((a, b)), _few, _few), st.builds(Xor, _few, _few))
chains_with_repeats = st.builds(lambda cls, links: cls(tuple(links)), st.sampled_from([And, Or]),
                                st.lists(_links, min_size=1, max_size=12))


@settings(max_examples=200, deadline=None)
@given(st.one_of(S.expressions(max_leaves=10, with_not_matches=True), chains_with_repeats), st.integers(1, 40))
def test_normal_forms_are_those_of_the_one_part_at_a_time_product(expr, limit):
    """Same terms, same order, same de-duplication and the same
    ExpressionTooLarge (at the same count) as the direct product."""
    with mock.patch("engine.expr._cross", _cross_one_part_at_a_time):
        want = [_outcome(rewrite, expr, limit) for rewrite in (to_dnf, to_cnf)]
    assert [_outcome(rewrite, expr, limit) for rewrite in (to_dnf, to_cnf)] == want


def test_predicates_equal_across_int_and_float_but_not_bool():
    a1, a1f, a_true = P("a", Op.EQ, 1), P("a", Op.EQ, 1.0), P("a", Op.EQ, True)
    assert a1 == a1f and hash(a1) == hash(a1f)
    assert a1 != a_true
    assert len({a1, a1f, a_true}) == 2


# ---------------------------------------------------------------- reference vs DuckDB


@settings(max_examples=8, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.large_base_example])
@given(st.lists(S.expressions(with_not_matches=True), min_size=40, max_size=40),
       st.lists(st.one_of(S.events(), boundary_events()), min_size=30, max_size=30))
def test_reference_equals_duckdb(exprs, events):
    got = duckdb_evaluate(exprs, events, STRATEGIES_SCHEMA)
    for i, e in enumerate(exprs):
        for j, ev in enumerate(events):
            assert got[i][j] is evaluate(e, ev), (e, ev)


# ------------------------------------------------- the build counts as the check did
def test_a_build_never_counts_more_conjunctions_than_the_add_time_check():
    """The add-time limit check counts the DNF of the expression's AST, where
    ``NOT p`` and ``p`` are one predicate and its negation; the build
    (engine.algorithms.units) counts it over the compiled program.  It once
    named each program row apart, so that ``a NOT IN s`` and ``a IN s`` were
    unrelated there: more conjunctions than checked, and BE-Tree's build
    raised ExpressionTooLarge on an expression the check had let in (W5)."""
    from engine import Index
    from engine.algorithms.units import operand_classes, program_tree
    from engine.workloads import abe_gen

    text = "(NOT (a IN (30, 35, 94))) XOR ((b <= 89) XNOR (a IN (30, 35, 94)))"
    assert len(to_dnf(parse(text))) == 3
    events = [{"a": 30, "b": 1}, {"a": 31, "b": 1}, {"a": 30, "b": 90}, {"a": 31, "b": 90}, {"b": 1}]
    # (NOT p) XOR (q XNOR p): TRUE where p is FALSE or q TRUE, but not both; NULL without a
    assert [evaluate(parse(text), e) for e in events] == [True, True, False, False, None]
    for algorithm in ("betree", "apcm", "pstbloom", "psthash"):
        idx = Index(algorithm=algorithm, backend="cpu", dnf_limit=3, strict=True)
        idx.add(1, text)
        idx.merge()
        assert [m.tolist() for m in idx.match_batch(events)] == [[1], [1], [], [], []], algorithm
    # a set id and a pattern id of one value on one attribute are not one operand
    text = "(s LIKE 'x%') XOR (NOT (s IN ('x'))) XOR (NOT (s LIKE 'x%'))"
    events = [{"s": "x"}, {"s": "xy"}, {"s": "y"}, {}]
    want = [[1] if evaluate(parse(text), e) else [] for e in events]
    assert want == [[1], [], [], []]
    for algorithm in ("betree", "apcm", "pstbloom", "psthash"):
        idx = Index(algorithm=algorithm, backend="cpu", dnf_limit=64)
        idx.add(1, text)
        idx.merge()
        assert [m.tolist() for m in idx.match_batch(events)] == want, algorithm
    workload = abe_gen(400, 10, seed=3)
    texts = workload.subscriptions["expression"].to_pylist()
    idx = Index(algorithm="scan", backend="cpu")
    idx.add_many(range(len(texts)), texts)
    idx.merge()
    segment = idx._main
    classes = operand_classes(segment.predicates)
    checked = 0
    for pos in range(len(segment)):
        try:
            allowed = len(to_dnf(parse(texts[int(segment.sub_ids[pos])]), 64))
        except ExpressionTooLarge:
            continue
        assert len(to_dnf(program_tree(segment, pos, classes), 64)) <= allowed
        checked += 1
    assert checked > 200
