"""Hostile input through the public API: whatever a caller sends, bexmatch
either does the right thing or raises one of the errors it documents, and
an input it refuses leaves the index exactly as it was.

* ``Index.add`` with hostile expression *texts* -- token soup, huge and odd
  numbers, stray quotes, lone surrogates, NULs, very long strings, deep
  nesting, long chains, and valid expressions with random edits -- and
  hostile *ASTs* (wrong arities, operators, literal types, regexes).
* ``match`` / ``match_batch`` with hostile *events*: values of the wrong
  type, NaN, infinities, huge ints, decimals, bytes, nested containers,
  lone surrogates, None, NumPy scalars, keys that are not strings; as
  dicts and as Arrow tables of every column type.

What is documented (engine/index.py, engine/events.py, README "Semantics"):

* text: `ParseError` (malformed, NaN/infinite literal, integer beyond
  2**53, empty IN list, unknown operator, invalid RE2, invalid Unicode),
  `SchemaError` (literal of the wrong family), `ExpressionTooLarge`
  (nesting limit; opindex's DNF/CNF limit) -- all `BexmatchError`;
* an AST: the same, and `TypeError` for what is not an expression node;
* ids: `TypeError` (not an int), `OverflowError` (beyond int64, as
  ``_as_id`` says), `KeyError` (already present);
* events: `SchemaError` naming the event and the attribute for a value
  the attribute does not take (the one value rule of engine/events.py),
  nothing with ``errors="null"`` (the value is absent then); `TypeError`
  for an event that is not a mapping; `ValueError` for a bad ``errors`` or
  ``output`` argument; str keys no subscription uses are ignored, a key
  that is not a str is refused as a bad value is.

Anything else (IndexError, a bare KeyError or ValueError from inside,
RecursionError, OverflowError, re2.error...) is a defect.  Whatever is
accepted must match as the reference evaluator says, on a fixed set of
probe events, and nothing accepted may make a later match raise.

The hypothesis tests are seeded (``derandomize``) and bounded; each counts
the examples it ran in `EXAMPLES` and prints the count."""

from __future__ import annotations

import collections
import datetime
import enum
import fractions
import math
import re
from decimal import Decimal

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
import pytest
import re2
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from engine import BexmatchError, ExpressionTooLarge, Index, ParseError, SchemaError
from engine.expr import And, Not, Op, Or, Pred, Xnor, Xor
from engine.parse import parse, to_text
from engine.reference import matches as reference_matches
from engine.algorithms import registry
from tests import strategies

#: examples run per hypothesis test of this module
EXAMPLES: collections.Counter = collections.Counter()

#: every registered algorithm meets the hostile inputs
ALGORITHMS = registry.names("cpu")
DECLARED = {"price": "numeric", "color": "string", "ok": "boolean", "url": "string"}
BASE = [
    "price <= 580 AND color = 'silver'",
    "url LIKE 'https://example.com/%' OR NOT ok = TRUE",
    "color IN ('a\x00b', '日本', '😀') XOR price > 1e300",
    "url > 'https://example.com/a' AND url < 'https://example.com/b'",
    "price BETWEEN -0.0 AND 9007199254740992 AND ok IS NOT NULL",
    "color MATCHES '^[a-z]+$' OR tag IS NULL",
    "NOT (price = 550) AND url MATCHES '\\x00|example\\.com/a'",
]
#: the probe events: only declared attributes, so that no accepted
#: subscription can change what family they are
PROBES = [
    {"price": 550, "color": "silver", "ok": True, "url": "https://example.com/a"},
    {"price": 580.0, "color": "a\x00b", "url": "https://example.com/b"},
    {"price": -0.0, "color": "日本", "ok": False},
    {"price": 2 ** 53, "color": "😀", "url": "https://example.com/a/b/c?x=1"},
    {"color": "", "url": "", "ok": True},
    {},
    {"price": 1e300, "ok": True, "url": "https://example.com/a\x00"},
    {"price": 1, "color": "z", "url": "123e4567-e89b-12d3-a456-426614174000"},
]

_SETTINGS = dict(deadline=None, derandomize=True, database=None,
                 suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                        HealthCheck.filter_too_much])

ADD_ERRORS = (BexmatchError,)                 # text: ParseError, SchemaError, ExpressionTooLarge
AST_ERRORS = (BexmatchError, TypeError)       # an AST: and TypeError for what is not a node


# ------------------------------------------------------------------ the index under attack


_BASE_NODES = {i: parse(text) for i, text in enumerate(BASE)}


def _truth(node) -> tuple:
    return tuple(reference_matches(node, event) for event in PROBES)


_BASE_TRUTH = {i: _truth(node) for i, node in _BASE_NODES.items()}


class Attacked:
    """An index of `BASE` plus whatever hostile input it accepted, with the
    reference evaluator's answers on `PROBES` kept alongside."""

    def __init__(self, algorithm: str):
        self.index = Index(algorithm=algorithm, backend="cpu", schema=DECLARED)
        self.index.add_many(range(len(BASE)), BASE)
        self.accepted = dict(_BASE_NODES)
        self.truth = dict(_BASE_TRUTH)      # sub id -> TRUE on each probe event, by the reference
        self.next_id = 1000

    @property
    def expected(self):
        ids = sorted(self.truth)
        return [[i for i in ids if self.truth[i][j]] for j in range(len(PROBES))]

    def results(self):
        return [m.tolist() for m in self.index.match_batch(PROBES)]

    def fingerprint(self):
        schema = self.index.schema
        return (len(self.index), dict(schema.families), list(schema.attr_names), list(schema.strings),
                list(schema.patterns))

    def attempt(self, expression, allowed=ADD_ERRORS):
        """Add one hostile expression: refused with an allowed error and
        nothing changed, or accepted and matching as the reference says.
        Returns the exception, or None when accepted."""
        sub_id, before = self.next_id, self.fingerprint()
        self.next_id += 1
        try:
            self.index.add(sub_id, expression)
        except allowed as exc:
            assert self.fingerprint() == before, f"refused ({exc!r}) but the index changed"
            assert sub_id not in self.index
            assert self.results() == self.expected, f"refused ({exc!r}) but the answers changed"
            return exc
        node = parse(expression) if isinstance(expression, str) else expression
        if not isinstance(expression, str):
            problem = malformed(node)
            assert problem is None, f"accepted a malformed AST ({problem}): {node!r}"
        self.accepted[sub_id] = node
        self.truth[sub_id] = _truth(node)
        assert sub_id in self.index and len(self.index) == len(self.accepted)
        assert self.results() == self.expected, "accepted, but does not match as the reference says"
        return None


_SHARED: dict = {}


def shared(algorithm: str) -> Attacked:
    """One attacked index per algorithm for the event tests (matching
    changes nothing, so they can share it), with a subscription that
    reads an attribute only for presence."""
    if algorithm not in _SHARED:
        attacked = Attacked(algorithm)
        assert attacked.attempt("tag IS NOT NULL OR tag IS NULL AND ok = FALSE") is None
        _SHARED[algorithm] = attacked
    return _SHARED[algorithm]


@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_the_attacked_index_matches_the_reference(algorithm):
    attacked = Attacked(algorithm)
    assert attacked.results() == attacked.expected
    assert sum(map(len, attacked.expected)) >= len(PROBES)


def malformed(node) -> str | None:
    """Why ``node`` is not an AST the parser could have built (modulo
    one-child AND/OR, whose meaning is plain), or None.  An index must
    refuse such an AST rather than guess what it means."""
    stack = [node]
    while stack:
        n = stack.pop()
        if isinstance(n, Pred):
            if not isinstance(n.attr, str) or not n.attr:
                return f"attribute {n.attr!r} is not a non-empty str"
            if not isinstance(n.op, Op):
                return f"operator {n.op!r} is not an Op"
            if _bad_unicode(n.attr):
                return f"attribute {n.attr!r} is not valid Unicode"
            values = tuple(n.values) if isinstance(n.values, (tuple, list)) else None
            if values is None:
                return f"operands {n.values!r} are not a tuple"
            if n.op in (Op.IS_NULL, Op.IS_NOT_NULL, Op.IS_EMPTY, Op.IS_NOT_EMPTY):
                if values:
                    return f"{n.op.value} with operands {values!r}"
            elif n.op in (Op.IN, Op.NOT_IN, Op.ONE_OF, Op.NONE_OF, Op.ALL_OF, Op.NOT_ALL_OF):
                if not values:
                    return f"{n.op.value} without operands"
            elif len(values) != (2 if n.op in (Op.BETWEEN, Op.NOT_BETWEEN) else 1):
                return f"{n.op.value} with {len(values)} operands"
            for v in values:
                if not isinstance(v, (bool, int, float, str)):
                    return f"operand {v!r} of type {type(v).__name__}"
                if isinstance(v, float) and not math.isfinite(v) or isinstance(v, int) and abs(v) > 2 ** 53:
                    return f"operand {v!r} is not exact in float64"
                if isinstance(v, str) and _bad_unicode(v):
                    return f"operand {v!r} is not valid Unicode"
            if len({bool if isinstance(v, bool) else str if isinstance(v, str) else float for v in values}) > 1:
                return f"operands of several families {values!r}"
            if n.op in (Op.LIKE, Op.NOT_LIKE, Op.MATCHES, Op.NOT_MATCHES) and not isinstance(values[0], str):
                return f"{n.op.value} with a non-string pattern"
            if n.op in (Op.MATCHES, Op.NOT_MATCHES, Op.LIKE, Op.NOT_LIKE):
                like = n.op in (Op.LIKE, Op.NOT_LIKE)
                regex = "(?s)" + "".join(".*" if c == "%" else "." if c == "_" else re2.escape(c)
                                         for c in values[0]) if like else values[0]
                try:
                    re2.compile(regex, _QUIET_RE2)
                except Exception:       # noqa: BLE001 -- any refusal of RE2's
                    return f"{'LIKE' if like else 'invalid RE2'} pattern {values[0][:40]!r}"
        elif isinstance(n, Not):
            stack.append(n.child)
        elif isinstance(n, (And, Or)):
            stack.extend(n.children)
        elif isinstance(n, (Xor, Xnor)):
            stack.extend((n.left, n.right))
        else:
            return f"{n!r} is not a node"
    return None


_QUIET_RE2 = re2.Options()
_QUIET_RE2.log_errors = False


def _bad_unicode(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return True
    return False


# ------------------------------------------------------------------ hostile texts

_SURROGATES = ("\ud800", "\udbff", "\udc00", "\udfff", "\ud83d")
_WORDS = ("price", "color", "ok", "url", "tag", "PRICE", "Color", "a.b", "_", "x1", "and_", "NULLS",
          '"price"', '"we""ird"', '""', '"', '"\ud800"', '"a b"', '"\x00"', '"日本"', '"and"', "ſ", "K", "İ")
_KEYWORDS = ("AND", "and", "Or", "NOT", "not", "XOR", "XNOR", "IN", "in", "BETWEEN", "LIKE", "MATCHES",
             "IS", "NULL", "null", "TRUE", "false", "True")
_PUNCT = ("(", ")", ",", "=", "!=", "<>", "<", "<=", ">", ">=", "==", "=>", "=<", "!", "~", "%", "*", ";",
          "--", "/*", "'", '"', "''", '""', "\\", ".", "+", "-", "e")
_NUMBERS = ("0", "-0", "+0", "-0.0", "00001", "1.", ".5", "5.e3", "1e10", "1E-5", "1e308", "1e309", "-1e999",
            "1e-400", "4.9e-324", "2.5e-324", "1.7976931348623157e308", "1.7976931348623159e308",
            "9007199254740992", "-9007199254740992", "9007199254740993", "-9007199254740993",
            "9007199254740992.5", "18446744073709551616", "1_000", "0x10", "1e", "1e+", "--1", "+-1", "1..2",
            "nan", "NaN", "-inf", "Infinity", "١٢٣", "１")
_STRING_TOKENS = ("'x'", "'it''s'", "''", "'''", "'a\x00b'", "'\x00'", "'\ud800'", "'\udfff\ud800'", "'a\ud83d'",
                  "'日本'", "'😀'", "'e\u0301'", "'%'", "'_'", "'(['", "'a{1001}'", "'a{2,1}'", "'(?P<n>x)'",
                  "'\\\\'", "'\\'", "'[[:foo:]]'", "'\\pZ'", "'\\p{Foo}'", "'(a)\\1'", "'(?<=a)b'", "'a**'",
                  "'\\C'", "'(?i)HTTP'", "'https://example.com/%'", "'\n'", "'a\r\nb'")
_SEPARATORS = (" ", " ", " ", "", "\t", "\n", "\r\n", "\x0b", "\x0c", "\x1c", "\x85", "\u2028", "\u00a0",
               "\u3000", "\ufeff", "\x00")

_any_char_with_surrogates = st.one_of(st.characters(codec="utf-8"), st.sampled_from(_SURROGATES))

numbers_text = st.one_of(
    st.sampled_from(_NUMBERS),
    st.integers().map(str),
    st.floats().map(repr),                                          # nan, inf, -0.0, 5e-324...
    st.builds(lambda m, e: f"{m}e{e}", st.integers(-10 ** 6, 10 ** 6), st.integers(-10 ** 6, 10 ** 6)),
    st.integers(1, 5000).map(lambda k: "9" * k),                    # beyond int()'s 4300-digit limit too
    st.integers(1, 3000).map(lambda k: "0." + "1" * k),
)
string_literal_text = st.one_of(
    st.sampled_from(_STRING_TOKENS),
    st.text(_any_char_with_surrogates, max_size=12).map(lambda s: "'" + s.replace("'", "''") + "'"),
    st.text(_any_char_with_surrogates, max_size=12).map(lambda s: "'" + s),          # unterminated or odd quotes
    st.integers(0, 200_000).map(lambda k: "'" + "x" * k + "'"),                     # very long strings
)
token = st.one_of(st.sampled_from(_WORDS), st.sampled_from(_KEYWORDS), st.sampled_from(_PUNCT), numbers_text,
                  string_literal_text, st.text(_any_char_with_surrogates, min_size=1, max_size=3))
token_soup = st.lists(st.tuples(token, st.sampled_from(_SEPARATORS)), max_size=25).map(
    lambda pairs: "".join(t + s for t, s in pairs))


def _hostile_leaf():
    """A predicate on a probe attribute or another one, with hostile
    literals (wrong family too), written as text."""
    attr = st.sampled_from(("price", "color", "ok", "url", "tag", "other", '"we""ird"', '"\x00"', '"日本"'))
    literal = st.one_of(numbers_text, string_literal_text, st.sampled_from(("TRUE", "FALSE", "NULL")))
    op = st.sampled_from(("=", "!=", "<>", "<", "<=", ">", ">=", "==", "LIKE", "NOT LIKE", "MATCHES", "IN",
                          "NOT IN", "BETWEEN", "NOT BETWEEN", "IS NULL", "IS NOT NULL"))

    def build(a, o, lits):
        if o in ("IN", "NOT IN"):
            return f"{a} {o} ({', '.join(lits)})"
        if o in ("BETWEEN", "NOT BETWEEN"):
            return f"{a} {o} {lits[0]} AND {lits[-1]}"
        if o in ("IS NULL", "IS NOT NULL"):
            return f"{a} {o}"
        return f"{a} {o} {lits[0]}"

    return st.builds(build, attr, op, st.lists(literal, min_size=1, max_size=4))


structured_text = st.recursive(
    _hostile_leaf(),
    lambda inner: st.one_of(
        st.builds(lambda a, k, b: f"{a} {k} {b}", inner, st.sampled_from(("AND", "OR", "XOR", "XNOR", "and")), inner),
        inner.map(lambda t: f"NOT {t}"),
        inner.map(lambda t: f"({t})"),
    ),
    max_leaves=6,
)


_SMALL_EXPRESSIONS = strategies.expressions(max_leaves=6)


@st.composite
def mutated_text(draw):
    """A valid expression (the strategies' pools: long, non-ASCII, NUL)
    printed, then edited at random: a slice deleted, a token inserted, a
    slice repeated, a quote added or removed."""
    text = to_text(draw(_SMALL_EXPRESSIONS))
    for _ in range(draw(st.integers(1, 3))):
        i = draw(st.integers(0, len(text)))
        j = draw(st.integers(i, min(len(text), i + 12)))
        kind = draw(st.integers(0, 3))
        if kind == 0:
            text = text[:i] + text[j:]
        elif kind == 1:
            text = text[:i] + draw(token) + text[i:]
        elif kind == 2:
            text = text[:j] + text[i:j] * draw(st.integers(2, 50)) + text[j:]
        else:
            text = text[:i] + draw(st.sampled_from(("'", '"', "(", ")", "\ud800", "\x00"))) + text[i:]
    return text


deep_text = st.one_of(
    st.integers(0, 600).map(lambda d: "(" * d + "price = 1" + ")" * d),
    st.integers(0, 600).map(lambda d: "NOT " * d + "price = 1"),
    st.integers(0, 600).map(lambda d: "(" * d + "price = 1"),                       # unbalanced
    st.integers(0, 600).map(lambda d: "price = 1" + ")" * d),
    st.integers(0, 400).map(lambda d: "".join(f"(price = {i} {'AND' if i % 2 else 'OR'} " for i in range(d))
                            + "color = 'x'" + ")" * d),                                # alternating nesting
    st.builds(lambda n, k: f" {k} ".join(f"price = {i}" for i in range(n)), st.integers(1, 2000),
              st.sampled_from(("AND", "OR", "XOR", "XNOR"))),                        # long chains
    st.integers(1, 300).map(lambda n: "color IN (" + ", ".join(f"'{i}'" for i in range(n * 10)) + ")"),
)

hostile_texts = st.one_of(token_soup, structured_text, mutated_text(), deep_text)


def test_hostile_expression_texts():
    outcomes: collections.Counter = collections.Counter()

    @settings(max_examples=200, **_SETTINGS)
    @given(algorithm=st.sampled_from(ALGORITHMS), texts=st.lists(hostile_texts, min_size=1, max_size=4))
    def run(algorithm, texts):
        EXAMPLES["texts"] += 1
        attacked = Attacked(algorithm)
        for text in texts:
            exc = attacked.attempt(text)
            outcomes[type(exc).__name__ if exc is not None else "accepted"] += 1

    run()
    print(f"hostile expression texts: {EXAMPLES['texts']} examples, {dict(outcomes)}")
    assert EXAMPLES["texts"] >= 100
    assert outcomes["accepted"] and outcomes["ParseError"]      # the generator reaches both sides


# Extremes, each once: deep nesting far beyond Python's recursion limit,
# long chains, enormous numbers and strings, pathological regexes.
EXTREME_TEXTS = {
    "parentheses 50000 deep": "(" * 50_000 + "price = 1" + ")" * 50_000,
    "NOT 20000 deep": "NOT " * 20_000 + "price = 1",
    "alternating AND/OR 5000 deep": "".join(f"(price = {i} {'AND' if i % 2 else 'OR'} " for i in range(5000))
                                    + "price = 0" + ")" * 5000,
    "XOR chain of 3000": " XOR ".join(f"price = {i}" for i in range(3000)),
    "AND chain of 3000": " AND ".join(f"price != {i}" for i in range(3000)),
    "OR chain of 3000": " OR ".join(f"color = '{i}'" for i in range(3000)),
    "IN list of 20000": "color IN (" + ", ".join(f"'{i}'" for i in range(20_000)) + ")",
    "integer of 100000 digits": "price = " + "9" * 100_000,
    "exponent of 100000 digits": "price = 1e" + "9" * 100_000,
    "negative exponent of 100000 digits": "price = 1e-" + "9" * 100_000,
    "fraction of 100000 digits": "price = 0." + "3" * 100_000,
    "string of 2 MB": "color = '" + "é" * 1_000_000 + "'",
    "string of 1 MB of NULs": "color = '" + "\x00" * 1_000_000 + "'",
    "quotes only": "'" * 10_001,
    "regex of 100000 characters": "color MATCHES '" + "[ab]" * 25_000 + "'",
    "regex nesting 1000": "color MATCHES '" + "(" * 1000 + "a" + ")" * 1000 + "'",
    "regex repetition blowup": "color MATCHES '" + "a{1000}" * 100 + "'",
    "LIKE of 4000 wildcards": "color LIKE '" + "%_" * 2000 + "'",
    "lone surrogate at the end": "color = 'x'\ud800",
    "NUL at the start": "\x00price = 1",
    "only whitespace": " \t\n\u2028\u3000",
    "empty": "",
}


@pytest.mark.parametrize("algorithm", ALGORITHMS)
@pytest.mark.parametrize("name", list(EXTREME_TEXTS))
def test_extreme_expression_texts(algorithm, name):
    attacked = Attacked(algorithm)
    attacked.attempt(EXTREME_TEXTS[name])
    attacked.index.merge()
    assert attacked.results() == attacked.expected


# ------------------------------------------------------------------ hostile ASTs

_OPS = tuple(Op)
_literal_values = st.one_of(
    st.booleans(), st.integers(-3, 3), st.sampled_from((2 ** 53, 2 ** 53 + 1, -(2 ** 64), 10 ** 400)),
    st.floats(), st.sampled_from(("", "silver", "a\x00b", "日本", "(", "[", "a{1001}", "\\", "\ud800", "x\udfff")),
    st.text(_any_char_with_surrogates, max_size=6),
    st.sampled_from((None, b"x", [1], (1,), {"a": 1}, Decimal("1.5"), np.int64(1), np.float64(0.5), 1j)),
)
_attrs = st.one_of(st.sampled_from(("price", "color", "ok", "url", "tag", "other", "", "\ud800", "a\x00", "日本")),
                   st.sampled_from((5, None, b"price", ("price",))))
_hostile_pred = st.one_of(
    st.builds(lambda a, o, vs: Pred(a, o, tuple(vs)), _attrs, st.sampled_from(_OPS),
              st.lists(_literal_values, max_size=3)),
    st.builds(lambda a, o, v: Pred(a, o, v), _attrs, st.sampled_from(("=", "LIKE", 1, None, "IS NULL")),
              st.lists(_literal_values, max_size=2).map(tuple)),
    st.builds(lambda a, o, v: Pred(a, o, v), st.just("price"), st.sampled_from(_OPS),
              st.sampled_from((1, "x", None, [1, 2], (), frozenset([1])))),
    strategies.predicates(),                                        # well formed, for contrast
)
hostile_asts = st.recursive(
    _hostile_pred,
    lambda inner: st.one_of(
        st.builds(Not, inner),
        st.lists(inner, min_size=0, max_size=3).map(lambda cs: And(tuple(cs))),
        st.lists(inner, min_size=0, max_size=3).map(lambda cs: Or(tuple(cs))),
        st.builds(Xor, inner, inner),
        st.builds(Xnor, inner, inner),
        st.builds(Not, st.sampled_from((None, 1, "price = 1"))),
        st.builds(lambda x: And((x, "price = 1")), inner),
    ),
    max_leaves=5,
)


def test_hostile_asts():
    outcomes: collections.Counter = collections.Counter()

    @settings(max_examples=200, **_SETTINGS)
    @given(algorithm=st.sampled_from(ALGORITHMS), nodes=st.lists(hostile_asts, min_size=1, max_size=3))
    def run(algorithm, nodes):
        EXAMPLES["asts"] += 1
        attacked = Attacked(algorithm)
        for node in nodes:
            exc = attacked.attempt(node, allowed=AST_ERRORS)
            outcomes[type(exc).__name__ if exc is not None else "accepted"] += 1

    run()
    print(f"hostile ASTs: {EXAMPLES['asts']} examples, {dict(outcomes)}")
    assert EXAMPLES["asts"] >= 100


#: hostile ASTs, each checked on its own (a hypothesis run reports one
#: failure per assertion line, which would hide all but one of these)
HOSTILE_ASTS = {
    "BETWEEN with one operand": Pred("price", Op.BETWEEN, (1,)),
    "BETWEEN with three operands": Pred("price", Op.BETWEEN, (1, 2, 3)),
    "= with two operands": Pred("price", Op.EQ, (1, 2)),
    "= with no operand": Pred("price", Op.EQ, ()),
    "IS NULL with an operand": Pred("price", Op.IS_NULL, (1,)),
    "IN with no operand": Pred("price", Op.IN, ()),
    "operator given as text": Pred("price", "=", (1,)),
    "operator None": Pred("price", None, (1,)),
    "invalid RE2 pattern": Pred("color", Op.MATCHES, ("(",)),
    "invalid RE2 pattern under NOT MATCHES": Pred("color", Op.NOT_MATCHES, ("a{1001}",)),
    "LIKE pattern too large for RE2": Pred("color", Op.LIKE, ("a%" * 60000,)),
    "MATCHES a number": Pred("color", Op.MATCHES, (1,)),
    "LIKE a number": Pred("color", Op.LIKE, (1,)),
    "NaN literal": Pred("price", Op.LT, (float("nan"),)),
    "infinite literal": Pred("price", Op.GT, (float("-inf"),)),
    "integer beyond 2**53": Pred("price", Op.EQ, (2 ** 53 + 1,)),
    "integer of 400 digits": Pred("price", Op.EQ, (10 ** 400,)),
    "None literal": Pred("price", Op.EQ, (None,)),
    "bytes literal": Pred("color", Op.EQ, (b"x",)),
    "Decimal literal": Pred("price", Op.EQ, (Decimal("1.5"),)),
    "NumPy int literal": Pred("price", Op.EQ, (np.int64(1),)),
    "mixed IN list": Pred("price", Op.IN, (1, "a")),
    "lone surrogate literal": Pred("color", Op.EQ, ("a\udfff",)),
    "lone surrogate LIKE pattern": Pred("color", Op.LIKE, ("\ud800%",)),
    "lone surrogate attribute": Pred("\ud800", Op.IS_NULL, ()),
    "empty attribute name": Pred("", Op.EQ, (1,)),
    "attribute that is not a str": Pred(5, Op.EQ, (1,)),
    "attribute None": Pred(None, Op.IS_NULL, ()),
    "operands not a tuple": Pred("price", Op.EQ, 1),
    "AND of nothing": And(()),
    "OR of nothing": Or(()),
    "AND holding text": And((Pred("price", Op.EQ, (1,)), "price = 2")),
    "NOT of None": Not(None),
    "XOR of numbers": Xor(1, 2),
}


@pytest.mark.parametrize("algorithm", ALGORITHMS)
@pytest.mark.parametrize("name", list(HOSTILE_ASTS))
def test_hostile_ast_cases(algorithm, name):
    Attacked(algorithm).attempt(HOSTILE_ASTS[name], allowed=AST_ERRORS)


@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_deep_ast_is_refused_without_recursion(algorithm):
    node = Pred("price", Op.EQ, (1,))
    for i in range(20_000):                 # far beyond Python's recursion limit
        node = Not(node) if i % 3 else And((Pred("price", Op.NE, (i,)), node))
    attacked = Attacked(algorithm)
    assert isinstance(attacked.attempt(node, allowed=AST_ERRORS), ExpressionTooLarge)


@pytest.mark.parametrize("sub_id, error", [
    (True, TypeError), (1.0, TypeError), ("1", TypeError), (None, TypeError), (b"1", TypeError),
    (2 ** 63, OverflowError), (-(2 ** 63) - 1, OverflowError), (np.uint64(2 ** 64 - 1), OverflowError),
    (0, KeyError),                                                  # BASE's first id: present
])
def test_hostile_ids(sub_id, error):
    attacked = Attacked("scan")
    before = attacked.fingerprint()
    with pytest.raises(error):
        attacked.index.add(sub_id, "price = 1")
    with pytest.raises(error):
        attacked.index.add_many([sub_id], ["price = 1"])
    assert attacked.fingerprint() == before and attacked.results() == attacked.expected


@pytest.mark.parametrize("args, error", [
    (([1001, 1002], ["price = 1"]), ValueError),
    (([1001, 1001], ["price = 1", "price = 2"]), KeyError),
    (([1001, 1002], ["price = 1", "price = 'x'"]), SchemaError),       # all or nothing
    (([1001, 1002], ["price = 1", "price = = 2"]), ParseError),
    (([1001], [b"price = 1"]), TypeError),
    (([1001], [None]), TypeError),
    (([1001], "price = 1"), TypeError),                               # one text, not a sequence of them
])
def test_add_many_is_all_or_nothing(args, error):
    attacked = Attacked("scan")
    before = attacked.fingerprint()
    with pytest.raises(error):
        attacked.index.add_many(*args)
    assert attacked.fingerprint() == before and attacked.results() == attacked.expected


# ------------------------------------------------------------------ hostile events

REFUSED = object()


def documented_value(value, family):
    """What the one value rule of engine/events.py makes of ``value`` for an
    attribute of ``family`` ("numeric" / "string" / "boolean" / None): the
    plain Python value the reference evaluator compares, or `REFUSED`."""
    if family is None:
        return "present"
    if family == "boolean":
        return bool(value) if isinstance(value, (bool, np.bool_)) else REFUSED
    if family == "string":
        if not isinstance(value, str):
            return REFUSED
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            return REFUSED
        return str(value)
    if isinstance(value, (bool, np.bool_)):
        return REFUSED
    if isinstance(value, (int, np.integer)):
        return float(value) if abs(int(value)) <= 2 ** 53 else REFUSED
    if isinstance(value, (float, np.floating)):
        number = float(value)
        return number if math.isfinite(number) and number == value else REFUSED
    if isinstance(value, Decimal):
        if not value.is_finite() or abs(value) > 2 ** 53:
            return REFUSED
        number = float(value)
        return number if Decimal(repr(number)) == value else REFUSED
    return REFUSED


class _Unfriendly:
    """An object whose conversions and comparisons all raise."""

    def __float__(self):
        raise RuntimeError("no float")

    def __index__(self):
        raise RuntimeError("no index")

    def __eq__(self, other):
        raise RuntimeError("no eq")

    def __bool__(self):
        raise RuntimeError("no bool")

    __hash__ = object.__hash__

    def __repr__(self):
        return "<unfriendly>"


class _Color(enum.IntEnum):
    RED = 5


class _Text(str):
    pass


_good_values = st.one_of(
    strategies.numeric_event_values, strategies.string_event_values, st.booleans(),
)
hostile_values = st.one_of(
    _good_values, _good_values,
    st.none(),
    st.floats(),                                                    # NaN, inf, -0.0, subnormals
    st.integers(), st.sampled_from((2 ** 53, 2 ** 53 + 1, -(2 ** 53) - 1, 10 ** 400, -(10 ** 400), 2 ** 64 - 1)),
    st.decimals(allow_nan=True, allow_infinity=True),
    st.sampled_from((Decimal("19.99"), Decimal("19.990"), Decimal("0.1000000000000000001"), Decimal("-0"),
                     Decimal("sNaN"), Decimal("-Infinity"), Decimal("1e400"), Decimal("1e-999999"),
                     Decimal("9007199254740993"), Decimal("9007199254740992"))),
    st.fractions(max_denominator=10), st.complex_numbers(max_magnitude=10),
    st.binary(max_size=4), st.binary(max_size=4).map(bytearray),
    st.text(_any_char_with_surrogates, max_size=8),                 # lone surrogates
    st.sampled_from((np.int64(3), np.int8(-1), np.uint64(2 ** 64 - 1), np.float32(1.5), np.float32("nan"),
                     np.float16(2.0), np.float64("inf"), np.longdouble(1) / 3, np.longdouble("0.5"), np.bool_(True),
                     np.str_("a\x00b"), np.bytes_(b"x"), np.array(3.0), np.array([1.0]), np.datetime64("2020-01-01"),
                     np.complex128(1))),
    st.sampled_from((_Color.RED, _Text("silver"), _Unfriendly(), object(), datetime.date(2020, 1, 1),
                     float("nan"), -0.0)),
    st.lists(st.integers(), max_size=2), st.lists(st.integers(), max_size=2).map(tuple),
    st.dictionaries(st.text(max_size=2), st.integers(), max_size=2), st.frozensets(st.integers(), max_size=2),
)
hostile_keys = st.one_of(
    st.sampled_from(tuple(DECLARED) + ("tag", "other", "PRICE", "")),
    st.sampled_from(tuple(DECLARED)),
    st.sampled_from((1, 0, -1, 1.5, None, True, (1, 2), b"price", frozenset({"price"}), "\ud800", "price\x00")),
)
hostile_events = st.dictionaries(hostile_keys, hostile_values, max_size=7)

_FAMILIES = {**DECLARED, "tag": None}


def _judge(events):
    """Per event: the cleaned event the reference evaluates, and the set of
    (event, attribute) pairs whose value the rule refuses."""
    cleaned, refused = [], set()
    for j, event in enumerate(events):
        plain = {}
        for key, value in event.items():
            if not isinstance(key, str):
                refused.add((j, key))                       # names no attribute: refused, not passed over
                continue
            if key not in _FAMILIES or value is None:
                continue                                    # not an attribute of the index: ignored
            taken = documented_value(value, _FAMILIES[key])
            if taken is REFUSED:
                refused.add((j, key))
            elif key != "tag":
                plain[key] = taken
        cleaned.append(plain)
    return cleaned, refused


def _expected_for(attacked: Attacked, cleaned, events):
    nodes = sorted(attacked.accepted.items())
    out = []
    for plain, raw in zip(cleaned, events):
        if "tag" in raw and raw["tag"] is not None:         # read for presence only: any value
            plain = {**plain, "tag": "present"}
        out.append([i for i, node in nodes if reference_matches(node, plain)])
    return out


def _check_schema_error(exc, refused):
    found = re.match(r"event (\d+): (?:attribute (.+?) is |key (.+?) \(\w+\) is not an attribute name)", str(exc))
    assert found, f"the SchemaError does not name the event and the attribute (or key): {exc}"
    named = (int(found.group(1)), found.group(2) or found.group(3))
    assert any(named == (j, repr(a)) for j, a in refused), f"{exc} names no refused value {refused}"


def test_hostile_events():
    outcomes: collections.Counter = collections.Counter()

    @settings(max_examples=300, **_SETTINGS)
    @given(algorithm=st.sampled_from(ALGORITHMS), events=st.lists(hostile_events, min_size=1, max_size=5),
           single=st.booleans())
    def run(algorithm, events, single):
        EXAMPLES["events"] += 1
        attacked = shared(algorithm)
        cleaned, refused = _judge(events)
        want = _expected_for(attacked, cleaned, events)
        # errors="null": never an error; what the rule refuses is absent
        assert [m.tolist() for m in attacked.index.match_batch(events, errors="null")] == want
        # the same dicts as a DataFrame's object column: a map column, its values read by the dict rule
        frame = pd.DataFrame({"attributes": pd.Series(events, dtype=object)})
        assert [m.tolist() for m in attacked.index.match_batch(frame, errors="null")] == want
        # errors="raise": a SchemaError naming a refused (event, attribute), or the answers
        try:
            got = [attacked.index.match(e).tolist() for e in events] if single else \
                [m.tolist() for m in attacked.index.match_batch(events)]
        except SchemaError as exc:
            outcomes["SchemaError"] += 1
            if not single:
                _check_schema_error(exc, refused)
            else:
                assert re.match(r"event 0: (attribute|key) ", str(exc)) and refused, exc
            assert attacked.results() == attacked.expected      # a refused batch leaves nothing behind
        else:
            outcomes["accepted"] += 1
            assert not refused, f"accepted values the rule refuses: {refused}"
            assert got == want

    run()
    _hostile_batches_done("events", "hostile events", outcomes, 100)


def _hostile_batches_done(kind: str, label: str, outcomes, minimum: int) -> None:
    """After a hostile-batch run: the shared indexes still answer as before,
    enough examples ran, and both outcomes happened."""
    for algorithm in ALGORITHMS:
        assert shared(algorithm).results() == shared(algorithm).expected
    print(f"{label}: {EXAMPLES[kind]} examples, {dict(outcomes)}")
    assert EXAMPLES[kind] >= minimum
    assert outcomes["accepted"] and outcomes["SchemaError"]


#: hostile event values, each tried alone on every kind of attribute
HOSTILE_VALUES = {
    "nan": float("nan"), "-inf": float("-inf"), "NumPy nan": np.float64("nan"), "float32 nan": np.float32("nan"),
    "2**53": 2 ** 53, "2**53 + 1": 2 ** 53 + 1, "-2**64": -(2 ** 64), "10**400": 10 ** 400, "-10**400": -(10 ** 400),
    "uint64 max": np.uint64(2 ** 64 - 1), "int8": np.int8(-1), "float16": np.float16(2.0),
    "longdouble 1/3": np.longdouble(1) / 3, "longdouble 0.5": np.longdouble("0.5"),
    "Decimal 19.99": Decimal("19.99"), "Decimal 19.990": Decimal("19.990"), "Decimal -0": Decimal("-0"),
    "Decimal 0.1000000000000000001": Decimal("0.1000000000000000001"), "Decimal NaN": Decimal("NaN"),
    "Decimal sNaN": Decimal("sNaN"), "Decimal Infinity": Decimal("Infinity"), "Decimal 1e400": Decimal("1e400"),
    "Decimal 1e-999999": Decimal("1e-999999"), "Decimal 2**53 + 1": Decimal(2 ** 53 + 1),
    "Fraction": fractions.Fraction(1, 3), "complex": 1j, "bytes": b"x", "bytearray": bytearray(b"x"),
    "dict": {"a": 1}, "list": [1], "tuple": (1,), "set": {1}, "lone surrogate": "\ud800",
    "surrogate inside": "a\udfffb", "surrogate pair written as two": "\ud83d\ude00", "NUL": "a\x00b",
    "NumPy str": np.str_("a\x00b"), "NumPy bytes": np.bytes_(b"x"), "NumPy bool": np.bool_(True),
    "0-d array": np.array(3.0), "1-d array": np.array([1.0]), "datetime64": np.datetime64("2020-01-01"),
    "IntEnum": _Color.RED, "str subclass": _Text("silver"), "unfriendly object": _Unfriendly(),
    "date": datetime.date(2020, 1, 1), "-0.0": -0.0, "True": True,
}


@pytest.mark.parametrize("name", list(HOSTILE_VALUES))
def test_hostile_event_values(name):
    """One hostile value on each kind of attribute, alone and in a batch,
    with errors="raise" and "null", on both algorithms."""
    value, problems = HOSTILE_VALUES[name], []
    for algorithm in ALGORITHMS:
        attacked = shared(algorithm)
        for attr in ("price", "color", "ok", "tag", "other"):
            events = [PROBES[0], {**PROBES[1], attr: value}]
            cleaned, refused = _judge(events)
            want = _expected_for(attacked, cleaned, events)
            for call in ("batch", "null", "single"):
                try:
                    if call == "single":
                        got = [attacked.index.match(e).tolist() for e in events]
                    else:
                        got = [m.tolist() for m in attacked.index.match_batch(
                            events, errors="null" if call == "null" else "raise")]
                except SchemaError as exc:
                    if call == "null" or not refused:
                        problems.append(f"{algorithm} {attr} {call}: SchemaError {exc}")
                    elif call == "batch" and f"event 1: attribute {attr!r} is " not in str(exc):
                        problems.append(f"{algorithm} {attr} {call}: the error names another value: {exc}")
                    continue
                except Exception as exc:        # noqa: BLE001 -- every other error is a defect
                    problems.append(f"{algorithm} {attr} {call}: {type(exc).__name__}: {exc}")
                    continue
                if refused and call != "null":
                    problems.append(f"{algorithm} {attr} {call}: accepted a value the rule refuses")
                elif got != want:
                    problems.append(f"{algorithm} {attr} {call}: {got} instead of {want}")
        assert attacked.results() == attacked.expected
    assert not problems, "\n".join(problems)


_ARROW_COLUMNS = {
    "float64": (pa.float64(), st.one_of(st.floats(), st.none())),
    "float32": (pa.float32(), st.one_of(st.floats(width=32), st.none())),
    "int64": (pa.int64(), st.one_of(st.integers(-(2 ** 63), 2 ** 63 - 1), st.sampled_from((2 ** 53, 2 ** 53 + 1)),
                                    st.none())),
    "uint64": (pa.uint64(), st.one_of(st.integers(0, 2 ** 64 - 1), st.none())),
    "decimal128": (pa.decimal128(38, 20), st.one_of(st.decimals(min_value=-10 ** 17, max_value=10 ** 17, places=20,
                                                                allow_nan=False, allow_infinity=False), st.none())),
    "decimal256": (pa.decimal256(60, 0), st.one_of(st.integers(-(10 ** 59), 10 ** 59).map(Decimal), st.none())),
    "decimal32": (pa.decimal32(9, 2), st.one_of(st.decimals(min_value=-(10 ** 6), max_value=10 ** 6, places=2,
                                                            allow_nan=False, allow_infinity=False), st.none())),
    "decimal64": (pa.decimal64(18, 4), st.one_of(st.decimals(min_value=-(10 ** 13), max_value=10 ** 13, places=4,
                                                             allow_nan=False, allow_infinity=False), st.none())),
    "string": (pa.string(), st.one_of(strategies.string_event_values, st.none())),
    "large_string": (pa.large_string(), st.one_of(strategies.strings(), st.none())),
    "string_view": (pa.string_view(), st.one_of(strategies.string_event_values, st.none())),
    "binary": (pa.binary(), st.one_of(st.binary(max_size=4), st.none())),
    "bool": (pa.bool_(), st.one_of(st.booleans(), st.none())),
    "list": (pa.list_(pa.int64()), st.one_of(st.lists(st.integers(-5, 5), max_size=2), st.none())),
    "struct": (pa.struct([("a", pa.int64())]), st.one_of(st.fixed_dictionaries({"a": st.integers(-5, 5)}), st.none())),
    "timestamp": (pa.timestamp("s"), st.one_of(st.datetimes(min_value=datetime.datetime(2000, 1, 1),
                                                            max_value=datetime.datetime(2030, 1, 1)), st.none())),
    "null": (pa.null(), st.none()),
}


@st.composite
def hostile_tables(draw):
    n = draw(st.integers(1, 6))
    columns = {}
    for name in draw(st.lists(st.sampled_from(tuple(DECLARED) + ("other",)), unique=True, max_size=4)):
        kind = draw(st.sampled_from(sorted(_ARROW_COLUMNS)))
        arrow_type, values = _ARROW_COLUMNS[kind]
        cells = draw(st.lists(values, min_size=n, max_size=n))
        try:
            array = pa.array(cells, arrow_type)
        except (pa.ArrowException, OverflowError, ValueError, TypeError):
            assume(False)
        if kind == "string" and draw(st.booleans()):
            array = array.dictionary_encode()
        elif kind not in ("null", "struct", "list", "string_view") and draw(st.booleans()):   # Arrow's REE
            array = pc.run_end_encode(array)
        columns[name] = array
    return pa.table(columns) if columns else pa.table({"other": pa.nulls(n)})


def test_hostile_arrow_tables():
    outcomes: collections.Counter = collections.Counter()

    @settings(max_examples=150, **_SETTINGS)
    @given(algorithm=st.sampled_from(ALGORITHMS), table=hostile_tables())
    def run(algorithm, table):
        EXAMPLES["arrow"] += 1
        attacked = shared(algorithm)
        events = table.to_pylist()
        cleaned, refused = _judge(events)
        want = _expected_for(attacked, cleaned, events)
        assert [m.tolist() for m in attacked.index.match_batch(table, errors="null")] == want
        if not any(pa.types.is_run_end_encoded(t) for t in table.schema.types):     # (pandas has no such dtype)
            # the same columns held by pandas as Arrow (pd.ArrowDtype) read as the table's
            frame = table.to_pandas(types_mapper=pd.ArrowDtype)
            assert [m.tolist() for m in attacked.index.match_batch(frame, errors="null")] == want
        try:
            got = [m.tolist() for m in attacked.index.match_batch(table)]
        except SchemaError as exc:
            outcomes["SchemaError"] += 1
            _check_schema_error(exc, refused)
        else:
            outcomes["accepted"] += 1
            assert not refused, f"accepted values the rule refuses: {refused}"
            assert got == want

    run()
    _hostile_batches_done("arrow", "hostile Arrow tables", outcomes, 50)


@pytest.mark.parametrize("batch", [None, 1, "abc", b"abc", {"price": 1}, [1], [None], ["price"], [[("price", 1)]],
                                   [{"price": 1}, 5]], ids=repr)
def test_batches_that_are_not_events(batch):
    attacked = Attacked("scan")
    with pytest.raises(TypeError):
        attacked.index.match_batch(batch)
    assert attacked.results() == attacked.expected


@pytest.mark.parametrize("event", [None, [("price", 1)], "price", 1, pa.table({"price": [1]})], ids=repr)
def test_match_takes_one_dict(event):
    attacked = Attacked("scan")
    with pytest.raises(TypeError):
        attacked.index.match(event)


@pytest.mark.parametrize("kwargs", [{"errors": "ignore"}, {"errors": None}, {"output": "pandas"}, {"output": None},
                                    {"output": "device"}])
def test_bad_arguments_are_value_errors(kwargs):
    attacked = Attacked("scan")
    with pytest.raises(ValueError):
        attacked.index.match_batch(PROBES, **kwargs)
    assert attacked.results() == attacked.expected
