"""The semantics of docs/language.md as an explicit table: every operator and connective, with
NULL (absent attributes), on the reference evaluator AND on DuckDB.

Each row is (expression, event, expected three-valued result); both
evaluators must give exactly the expected value, NULL included.
"""

from __future__ import annotations

import pytest

from engine.expr import And, Not, Op, Or, Pred, Xnor, Xor
from engine.reference import evaluate, like, matches
from tests.sql_oracle import duckdb_evaluate, duckdb_matches, duckdb_where, to_sql

T, F, N = True, False, None

SCHEMA = {"a": "DOUBLE", "s": "VARCHAR", "b": "BOOLEAN", 'we"ird.name': "DOUBLE"}


def P(attr, op, *values):
    return Pred(attr, op, tuple(values))


A5 = P("a", Op.EQ, 5)
BT = P("b", Op.EQ, True)

CASES = [
    # --- every predicate on an absent attribute is NULL, except IS [NOT] NULL
    (P("a", Op.EQ, 5), {}, N),
    (P("a", Op.NE, 5), {}, N),
    (P("a", Op.LT, 5), {}, N),
    (P("a", Op.LE, 5), {}, N),
    (P("a", Op.GT, 5), {}, N),
    (P("a", Op.GE, 5), {}, N),
    (P("a", Op.IN, 1, 2), {}, N),
    (P("a", Op.NOT_IN, 1, 2), {}, N),
    (P("a", Op.BETWEEN, 1, 2), {}, N),
    (P("a", Op.NOT_BETWEEN, 1, 2), {}, N),
    (P("s", Op.LIKE, "x%"), {}, N),
    (P("s", Op.NOT_LIKE, "x%"), {}, N),
    (P("s", Op.MATCHES, "x"), {}, N),
    (P("s", Op.NOT_MATCHES, "x"), {}, N),
    (Not(A5), {}, N),
    (Not(A5), {"a": None}, N),               # None in the dict is absent too
    (P("a", Op.NE, 5), {"s": "x"}, N),
    (P("a", Op.IS_NULL), {}, T),
    (P("a", Op.IS_NULL), {"a": None}, T),
    (P("a", Op.IS_NULL), {"a": 0}, F),
    (P("a", Op.IS_NOT_NULL), {}, F),
    (P("a", Op.IS_NOT_NULL), {"a": 0}, T),
    (Not(P("a", Op.IS_NULL)), {}, F),
    (P("b", Op.IS_NOT_NULL), {"b": False}, T),
    (P("s", Op.IS_NOT_NULL), {"s": ""}, T),   # the empty string is a value
    # --- present values
    (P("a", Op.NE, 5), {"a": 4}, T),
    (P("a", Op.NOT_IN, 1, 2), {"a": 3}, T),
    (P("a", Op.NOT_IN, 1, 2), {"a": 2}, F),
    (P("a", Op.NOT_BETWEEN, 1, 2), {"a": 3}, T),
    (P("a", Op.NOT_BETWEEN, 1, 2), {"a": 1}, F),
    (P("a", Op.BETWEEN, 2, 1), {"a": 1.5}, F),          # empty range
    (P("a", Op.NOT_BETWEEN, 2, 1), {"a": 1.5}, T),
    (P("a", Op.BETWEEN, 1, 2), {"a": 2}, T),             # both ends closed
    (Not(A5), {"a": 5}, F),
    (Not(A5), {"a": 6}, T),
    # --- Kleene NOT / AND / OR
    (And((A5, BT)), {"b": False}, F),        # NULL AND FALSE = FALSE
    (And((BT, A5)), {"b": False}, F),
    (And((A5, BT)), {"b": True}, N),         # NULL AND TRUE = NULL
    (And((A5, P("a", Op.IS_NULL))), {}, N),
    (Or((A5, BT)), {"b": True}, T),          # NULL OR TRUE = TRUE
    (Or((BT, A5)), {"b": True}, T),
    (Or((A5, BT)), {"b": False}, N),         # NULL OR FALSE = NULL
    (Not(And((A5, BT))), {"b": False}, T),
    (Not(Or((A5, BT))), {"b": False}, N),
    (And((A5, BT)), {"a": 5, "b": True}, T),
    (Or((A5, BT)), {"a": 4, "b": False}, F),
    # --- XOR / XNOR: NULL if either side is NULL
    (Xor(A5, BT), {"b": True}, N),
    (Xor(A5, BT), {"b": False}, N),
    (Xor(BT, A5), {"b": True}, N),
    (Xnor(A5, BT), {"b": True}, N),
    (Xnor(A5, BT), {"b": False}, N),
    (Xnor(BT, A5), {}, N),
    (Not(Xor(A5, BT)), {"b": True}, N),
    (Xor(A5, BT), {"a": 5, "b": True}, F),
    (Xor(A5, BT), {"a": 5, "b": False}, T),
    (Xor(A5, BT), {"a": 4, "b": True}, T),
    (Xor(A5, BT), {"a": 4, "b": False}, F),
    (Xnor(A5, BT), {"a": 5, "b": True}, T),
    (Xnor(A5, BT), {"a": 5, "b": False}, F),
    (Xnor(A5, BT), {"a": 4, "b": True}, F),
    (Xnor(A5, BT), {"a": 4, "b": False}, T),
    (Xor(P("a", Op.IS_NULL), BT), {"b": False}, T),
    # --- LIKE: % any run, _ one character, case-sensitive, no escape character
    (P("s", Op.LIKE, "%"), {"s": ""}, T),
    (P("s", Op.LIKE, ""), {"s": ""}, T),
    (P("s", Op.LIKE, "_"), {"s": ""}, F),
    (P("s", Op.LIKE, ""), {"s": "a"}, F),
    (P("s", Op.LIKE, "%%"), {"s": "xyz"}, T),
    (P("s", Op.LIKE, "_"), {"s": "é"}, T),             # one character, not one byte
    (P("s", Op.LIKE, "__"), {"s": "é"}, F),
    (P("s", Op.LIKE, "_"), {"s": "ab"}, F),
    (P("s", Op.LIKE, "a%c"), {"s": "ac"}, T),
    (P("s", Op.LIKE, "a%c"), {"s": "abbc"}, T),
    (P("s", Op.LIKE, "a%c"), {"s": "abcd"}, F),
    (P("s", Op.LIKE, "%a%"), {"s": "bab"}, T),
    (P("s", Op.LIKE, "a"), {"s": "A"}, F),              # case-sensitive
    (P("s", Op.LIKE, "a_b"), {"s": "a\nb"}, T),
    (P("s", Op.LIKE, "a%b"), {"s": "a\n\nb"}, T),
    (P("s", Op.LIKE, "a\\b"), {"s": "a\\b"}, T),       # backslash is ordinary
    (P("s", Op.LIKE, "a\\%"), {"s": "a\\xyz"}, T),
    (P("s", Op.LIKE, "a\\%"), {"s": "a%"}, F),
    (P("s", Op.LIKE, "a\\_"), {"s": "a_"}, F),
    (P("s", Op.LIKE, "a.c"), {"s": "abc"}, F),          # no regex meaning
    (P("s", Op.LIKE, "a.c"), {"s": "a.c"}, T),
    (P("s", Op.LIKE, "[ab]*"), {"s": "a"}, F),
    (P("s", Op.LIKE, "[ab]*"), {"s": "[ab]*"}, T),
    (P("s", Op.LIKE, "(%)"), {"s": "(x)"}, T),
    (P("s", Op.LIKE, "it''s"), {"s": "it''s"}, T),
    (P("s", Op.LIKE, "it's%"), {"s": "it's"}, T),
    (P("s", Op.NOT_LIKE, "%"), {"s": ""}, F),
    (P("s", Op.NOT_LIKE, "a%"), {"s": "ba"}, T),
    # --- MATCHES: RE2, search semantics (anywhere in the value)
    (P("s", Op.MATCHES, "ab"), {"s": "xaby"}, T),
    (P("s", Op.MATCHES, "^ab"), {"s": "xaby"}, F),
    (P("s", Op.MATCHES, "y$"), {"s": "xaby"}, T),
    (P("s", Op.MATCHES, "^$"), {"s": ""}, T),
    (P("s", Op.MATCHES, ""), {"s": "anything"}, T),
    (P("s", Op.MATCHES, "b"), {"s": "ABC"}, F),
    (P("s", Op.MATCHES, "(?i)b"), {"s": "ABC"}, T),
    (P("s", Op.MATCHES, "a.b"), {"s": "a\nb"}, F),      # . does not match newline
    (P("s", Op.MATCHES, "^.$"), {"s": "é"}, T),         # UTF-8 aware
    (P("s", Op.MATCHES, "a|c"), {"s": "xc"}, T),
    (P("s", Op.MATCHES, "[ab]+"), {"s": "zzz"}, F),
    (P("s", Op.NOT_MATCHES, "ab"), {"s": "xaby"}, F),
    (P("s", Op.NOT_MATCHES, "^ab"), {"s": "xaby"}, T),
    # --- strings by code point
    (P("s", Op.LT, "a"), {"s": "Z"}, T),
    (P("s", Op.GT, "a"), {"s": "é"}, T),
    (P("s", Op.LT, "é"), {"s": "z"}, T),
    (P("s", Op.LT, "\U0001F600"), {"s": "\uffff"}, T),  # code points, not UTF-16
    (P("s", Op.LT, "a"), {"s": ""}, T),
    (P("s", Op.LT, "aa"), {"s": "a"}, T),
    (P("s", Op.BETWEEN, "a", "b"), {"s": "az"}, T),
    (P("s", Op.BETWEEN, "a", "b"), {"s": "ba"}, F),
    (P("s", Op.EQ, "it's"), {"s": "it's"}, T),
    (P("s", Op.IN, "x", "it's"), {"s": "it's"}, T),
    # --- numbers: int and float compare numerically
    (P("a", Op.EQ, 1), {"a": 1.0}, T),
    (P("a", Op.EQ, 1.0), {"a": 1}, T),
    (P("a", Op.NE, 1), {"a": 1.0}, F),
    (P("a", Op.IN, 1.0, 2), {"a": 2}, T),
    (P("a", Op.NOT_IN, 1.0, 2), {"a": 1}, F),
    (P("a", Op.EQ, 0.30000000000000004), {"a": 0.1 + 0.2}, T),   # floats exactly
    (P("a", Op.EQ, 0.3), {"a": 0.1 + 0.2}, F),
    (P("a", Op.LT, 0.3), {"a": 0.1 + 0.2}, F),
    (P("a", Op.GT, 0.1), {"a": 0.1}, F),
    (P("a", Op.GE, 0.1), {"a": 0.1}, T),
    (P("a", Op.LT, -1.5), {"a": -2}, T),
    (P("a", Op.EQ, 1e300), {"a": 1e300}, T),
    (P("a", Op.LT, 5e-324), {"a": 0.0}, T),
    (P("a", Op.BETWEEN, -1, 0.5), {"a": 0}, T),
    # --- booleans: FALSE < TRUE
    (P("b", Op.EQ, True), {"b": True}, T),
    (P("b", Op.EQ, False), {"b": True}, F),
    (P("b", Op.LT, True), {"b": False}, T),
    (P("b", Op.GT, False), {"b": False}, F),
    (P("b", Op.BETWEEN, False, True), {"b": True}, T),
    (P("b", Op.NOT_IN, True), {"b": False}, T),
    (P("b", Op.NE, True), {}, N),
    # --- quoting of identifiers
    (P('we"ird.name', Op.EQ, 3), {'we"ird.name': 3}, T),
    (P('we"ird.name', Op.IS_NULL), {"a": 3}, T),
]

IDS = [f"{i}:{to_sql(e)}" for i, (e, _, _) in enumerate(CASES)]


@pytest.mark.parametrize("expr, event, expected", CASES, ids=IDS)
def test_reference(expr, event, expected):
    assert evaluate(expr, event) is expected
    assert matches(expr, event) is (expected is True)


def test_duckdb_table():
    """All rows in one DuckDB query (one column per expression)."""
    exprs = [e for e, _, _ in CASES]
    events = [ev for _, ev, _ in CASES]
    got = duckdb_evaluate(exprs, events, SCHEMA)
    wrong = [(IDS[i], CASES[i][1], got[i][i], CASES[i][2])
             for i in range(len(CASES)) if got[i][i] is not CASES[i][2]]
    assert not wrong, wrong


def test_duckdb_where_form_agrees():
    """The column form equals the literal SELECT ... WHERE <expr> form."""
    exprs = [e for e, _, _ in CASES]
    events = [ev for _, ev, _ in CASES]
    by_columns = duckdb_matches(exprs, events, SCHEMA)
    for i in range(0, len(CASES), 7):
        assert duckdb_where(exprs[i], events, SCHEMA) == by_columns[i]


def test_reference_equals_duckdb_on_all_pairs():
    """Every expression of the table on every event of the table."""
    exprs = [e for e, _, _ in CASES]
    events = [ev for _, ev, _ in CASES]
    got = duckdb_evaluate(exprs, events, SCHEMA)
    for i, e in enumerate(exprs):
        for j, ev in enumerate(events):
            want = _safe_evaluate(e, ev)
            if want is not TypeError:
                assert got[i][j] is want, (IDS[i], ev)


def _safe_evaluate(e, ev):
    try:
        return evaluate(e, ev)
    except TypeError:
        return TypeError


def test_inferred_schema():
    exprs = [P("x", Op.EQ, 1.5), P("y", Op.LIKE, "a%"), P("z", Op.EQ, True), P("w", Op.IS_NULL)]
    events = [{"x": 1.5, "y": "ab", "z": True}, {"w": "q"}, {}]
    assert duckdb_evaluate(exprs, events) == [[T, N, N], [T, N, N], [T, N, N], [T, F, T]]


@pytest.mark.parametrize("expr, event", [
    (P("a", Op.EQ, "x"), {"a": 1}),
    (P("a", Op.EQ, 1), {"a": True}),
    (P("a", Op.EQ, True), {"a": 1}),
    (P("a", Op.LIKE, "x%"), {"a": 1}),
    (P("s", Op.MATCHES, "x"), {"s": False}),
    (P("s", Op.IN, "x", 1), {"s": "x"}),
])
def test_reference_rejects_mixed_families(expr, event):
    with pytest.raises(TypeError):
        evaluate(expr, event)


def test_like_matcher_exhaustive_small():
    """The DP matcher against a brute-force definition on every value and
    pattern of length <= 3 over a tiny alphabet."""
    import itertools

    def brute(value, pattern):
        if not pattern:
            return value == ""
        head, rest = pattern[0], pattern[1:]
        if head == "%":
            return any(brute(value[k:], rest) for k in range(len(value) + 1))
        return bool(value) and (head == "_" or head == value[0]) and brute(value[1:], rest)

    values = ["".join(t) for n in range(4) for t in itertools.product("ab", repeat=n)]
    patterns = ["".join(t) for n in range(4) for t in itertools.product("a%_", repeat=n)]
    for v in values:
        for p in patterns:
            assert like(v, p) is brute(v, p), (v, p)
