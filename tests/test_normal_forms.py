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
from engine.expr import (And, Interval, Not, Op, Or, Pred, Xnor, Xor, _too_large, merge_conjunction, negate,
                         to_cnf, to_dnf, to_interval, to_nnf)
from engine.reference import evaluate, matches
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


@settings(max_examples=150, deadline=None)
@given(S.expressions(max_leaves=8, with_not_matches=True), any_events)
def test_merged_dnf_keeps_truth(expr, events):
    """merge_conjunction on every DNF conjunction (the BE-Tree / OpIndex
    route) keeps the TRUE-ness of the whole expression."""
    merged = [m for m in (merge_conjunction(c) for c in to_dnf(expr, limit=BIG)) if m is not None]
    for ev in events:
        assert any(all(evaluate(p, ev) is True for p in c) for c in merged) is matches(expr, ev)


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


# ---------------------------------------------------------------- intervals (BE-Tree Table 1)


def _values_for(attr):
    if attr in S.NUMERIC_ATTRS:
        return _numeric
    if attr in S.STRING_ATTRS:
        return _string
    return st.booleans()


pred_and_value = st.one_of(
    S.predicates(),
    st.sampled_from(S.STRING_ATTRS).flatmap(lambda a: S.regex_patterns.map(lambda r: P(a, Op.NOT_MATCHES, r))),
).flatmap(lambda p: st.tuples(st.just(p), _values_for(p.attr)))

EXACT_OPS = {Op.LT, Op.LE, Op.EQ, Op.GT, Op.GE, Op.BETWEEN}


@settings(max_examples=500, deadline=None)
@given(pred_and_value)
def test_interval_is_superset(pv):
    pred, value = pv
    iv = to_interval(pred)
    truth = evaluate(pred, {pred.attr: value})
    if pred.op is Op.IS_NULL:
        assert iv is None
        return
    assert isinstance(iv, Interval)
    if truth is True:
        assert not iv.is_empty and iv.contains(value)
    if pred.op in EXACT_OPS:
        assert iv.contains(value) is truth
    assert evaluate(pred, {}) is not True          # only IS NULL is TRUE on absence


def test_interval_table():
    W = Interval(None, None, False, False)
    assert to_interval(P("a", Op.LT, 3)) == Interval(None, 3, False, False)
    assert to_interval(P("a", Op.LE, 3)) == Interval(None, 3, False, True)
    assert to_interval(P("a", Op.GT, 3)) == Interval(3, None, False, False)
    assert to_interval(P("a", Op.GE, 3)) == Interval(3, None, True, False)
    assert to_interval(P("a", Op.EQ, 3)) == Interval(3, 3, True, True)
    assert to_interval(P("a", Op.IN, 5, 1, 3)) == Interval(1, 5, True, True)
    assert to_interval(P("a", Op.BETWEEN, 1, 5)) == Interval(1, 5, True, True)
    assert to_interval(P("a", Op.BETWEEN, 5, 1)).is_empty
    for op, vs in [(Op.NE, (3,)), (Op.NOT_IN, (1, 2)), (Op.NOT_BETWEEN, (1, 2)), (Op.LIKE, ("a%",)),
                   (Op.NOT_LIKE, ("a%",)), (Op.MATCHES, ("a",)), (Op.NOT_MATCHES, ("a",)),
                   (Op.IS_NOT_NULL, ())]:
        assert to_interval(Pred("a", op, vs)) == W
    assert to_interval(P("a", Op.IS_NULL)) is None
    assert Interval(3, 3, True, False).is_empty and not Interval(3, 3, True, True).is_empty
    assert to_interval(P("s", Op.IN, "b", "é", "Z")) == Interval("Z", "é", True, True)
    with pytest.raises(TypeError):
        to_interval(P("a", Op.IN, 1, True))


# ---------------------------------------------------------------- merge_conjunction


def test_merge_examples():
    m = merge_conjunction
    assert m([P("a", Op.GE, 3), P("a", Op.LE, 7)]) == (P("a", Op.BETWEEN, 3, 7),)
    assert m([P("a", Op.GT, 3), P("a", Op.LT, 7)]) == (P("a", Op.GT, 3), P("a", Op.LT, 7))
    assert m([P("a", Op.GT, 3), P("a", Op.GE, 3), P("a", Op.GT, 1), P("a", Op.LT, 9), P("a", Op.LE, 7)]) == \
        (P("a", Op.GT, 3), P("a", Op.LE, 7))
    assert m([P("a", Op.IN, 1, 2, 3), P("a", Op.NE, 2), P("a", Op.LE, 2)]) == (P("a", Op.EQ, 1),)
    assert m([P("a", Op.IN, 3, 1, 2), P("a", Op.NE, 2)]) == (P("a", Op.IN, 1, 3),)
    assert m([P("a", Op.EQ, 5), P("a", Op.IN, 5, 6)]) == (P("a", Op.EQ, 5),)
    assert m([P("a", Op.EQ, 5), P("a", Op.GT, 7)]) is None
    assert m([P("a", Op.IS_NULL), P("a", Op.EQ, 1)]) is None
    assert m([P("a", Op.IS_NULL), P("a", Op.NE, 1)]) is None
    assert m([P("a", Op.IS_NULL), P("a", Op.IS_NOT_NULL)]) is None
    assert m([P("a", Op.IS_NULL), P("a", Op.IS_NULL)]) == (P("a", Op.IS_NULL),)
    assert m([P("a", Op.BETWEEN, 5, 1)]) is None
    assert m([P("a", Op.GT, 5), P("a", Op.LT, 5)]) is None
    assert m([P("a", Op.GE, 5), P("a", Op.LT, 5)]) is None
    assert m([P("a", Op.GE, 5), P("a", Op.LE, 5)]) == (P("a", Op.EQ, 5),)
    assert m([P("a", Op.GE, 5), P("a", Op.LE, 5), P("a", Op.NE, 5)]) is None
    assert m([P("a", Op.IN, 1, 2), P("a", Op.IN, 3)]) is None
    assert m([P("a", Op.IN, 1, 2), P("a", Op.NOT_IN, 1, 2)]) is None
    # IS NOT NULL is implied by any other predicate on the attribute
    assert m([P("a", Op.IS_NOT_NULL), P("a", Op.NE, 1)]) == (P("a", Op.NE, 1),)
    assert m([P("a", Op.IS_NOT_NULL), P("a", Op.IS_NOT_NULL)]) == (P("a", Op.IS_NOT_NULL),)
    # != on a closed end opens it; outside the interval it is dropped
    assert m([P("a", Op.GE, 3), P("a", Op.NE, 3), P("a", Op.NE, 10), P("a", Op.LE, 7)]) == \
        (P("a", Op.GT, 3), P("a", Op.LE, 7))
    assert m([P("a", Op.GE, 3), P("a", Op.NE, 3), P("a", Op.NE, 10)]) == (P("a", Op.GT, 3), P("a", Op.NE, 10))
    assert m([P("a", Op.BETWEEN, 1, 9), P("a", Op.NOT_IN, 0, 5, 9)]) == \
        (P("a", Op.GE, 1), P("a", Op.LT, 9), P("a", Op.NE, 5))
    assert m([P("a", Op.NE, 1), P("a", Op.NE, 3), P("a", Op.NOT_IN, 2, 1)]) == (P("a", Op.NOT_IN, 1, 2, 3),)
    # NOT BETWEEN: disjoint -> dropped, covering an end -> cuts it, inside -> kept, empty -> presence
    assert m([P("a", Op.LT, 0), P("a", Op.NOT_BETWEEN, 1, 2)]) == (P("a", Op.LT, 0),)
    assert m([P("a", Op.BETWEEN, 0, 10), P("a", Op.NOT_BETWEEN, -5, 2)]) == (P("a", Op.GT, 2), P("a", Op.LE, 10))
    assert m([P("a", Op.BETWEEN, 0, 10), P("a", Op.NOT_BETWEEN, 4, 5)]) == \
        (P("a", Op.BETWEEN, 0, 10), P("a", Op.NOT_BETWEEN, 4, 5))
    assert m([P("a", Op.BETWEEN, 0, 10), P("a", Op.NOT_BETWEEN, -1, 11)]) is None
    assert m([P("a", Op.NOT_BETWEEN, 5, 1)]) == (P("a", Op.IS_NOT_NULL),)
    assert m([P("a", Op.NOT_BETWEEN, 1, 5)]) == (P("a", Op.NOT_BETWEEN, 1, 5),)
    # patterns are kept, but a finite set is filtered by them
    assert m([P("s", Op.LIKE, "a%"), P("s", Op.GT, "b")]) == (P("s", Op.GT, "b"), P("s", Op.LIKE, "a%"))
    assert m([P("s", Op.IN, "ab", "ba", "ax"), P("s", Op.LIKE, "a%"), P("s", Op.NOT_MATCHES, "x")]) == \
        (P("s", Op.EQ, "ab"),)
    assert m([P("s", Op.EQ, "b"), P("s", Op.MATCHES, "^a")]) is None
    # booleans: a finite domain
    assert m([P("b", Op.NE, True)]) == (P("b", Op.EQ, False),)
    assert m([P("b", Op.GT, False), P("b", Op.NE, True)]) is None
    assert m([P("b", Op.NOT_IN, True, False)]) is None
    assert m([P("b", Op.LE, True)]) == (P("b", Op.IS_NOT_NULL),)
    # numbers: int and float are one family; the domain is continuous
    assert m([P("a", Op.EQ, 1), P("a", Op.IN, 1.0, 2)]) == (P("a", Op.EQ, 1),)
    assert m([P("a", Op.GT, 3), P("a", Op.LT, 4)]) == (P("a", Op.GT, 3), P("a", Op.LT, 4))
    # several attributes: order of first appearance, each merged on its own
    assert m([P("a", Op.GE, 1), P("b", Op.EQ, True), P("a", Op.LE, 2), P("c", Op.LIKE, "x")]) == \
        (P("a", Op.BETWEEN, 1, 2), P("b", Op.EQ, True), P("c", Op.LIKE, "x"))
    assert m([P("a", Op.GE, 1), P("b", Op.IS_NULL), P("b", Op.EQ, True)]) is None
    assert m([]) == ()


@pytest.mark.parametrize("preds", [
    [P("a", Op.EQ, 1), P("a", Op.EQ, "x")],
    [P("a", Op.EQ, 1), P("a", Op.EQ, True)],
    [P("a", Op.GT, 1), P("a", Op.LIKE, "x%")],
    [P("a", Op.IN, 1, "x")],
])
def test_merge_rejects_mixed_families(preds):
    with pytest.raises(TypeError):
        merge_conjunction(preds)


def _basic_preds(attr, literals):
    return st.one_of(
        st.builds(lambda op, v: P(attr, op, v), st.sampled_from(S.COMPARISONS), literals),
        st.builds(lambda op, vs: Pred(attr, op, tuple(vs)), st.sampled_from([Op.IN, Op.NOT_IN]),
                  st.lists(literals, min_size=1, max_size=4)),
        st.builds(lambda op, lo, hi: P(attr, op, lo, hi), st.sampled_from([Op.BETWEEN, Op.NOT_BETWEEN]),
                  literals, literals),
        st.builds(lambda op: P(attr, op), st.sampled_from([Op.IS_NULL, Op.IS_NOT_NULL])),
    )


def _preds_on(attr):
    if attr in S.NUMERIC_ATTRS:
        return _basic_preds(attr, S.numeric_literals)
    if attr in S.STRING_ATTRS:
        return st.one_of(
            _basic_preds(attr, S.string_literals),
            st.builds(lambda op, p: P(attr, op, p), st.sampled_from([Op.LIKE, Op.NOT_LIKE]), S.like_patterns),
            st.builds(lambda op, p: P(attr, op, p), st.sampled_from([Op.MATCHES, Op.NOT_MATCHES]),
                      S.regex_patterns))
    return _basic_preds(attr, st.booleans())


conjunctions = st.sampled_from([("n0",), ("s0",), ("b0",), ("n0", "n1"), ("n0", "s0"), ("s0", "b0")]).flatmap(
    lambda attrs: st.lists(st.sampled_from(attrs).flatmap(_preds_on), min_size=1, max_size=7))


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(conjunctions, any_events)
def test_merge_keeps_truth(preds, events):
    merged = merge_conjunction(preds)
    for ev in events:
        want = all(evaluate(p, ev) is True for p in preds)
        got = merged is not None and all(evaluate(p, ev) is True for p in merged)
        assert got is want, (preds, merged, ev)
    if merged is not None:
        assert {p.attr for p in merged} == {p.attr for p in preds}
        assert len({p.attr for p in merged if p.op in (Op.EQ, Op.IN)}) == \
            sum(1 for p in merged if p.op in (Op.EQ, Op.IN))        # one set per attribute


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
