"""Hypothesis strategies shared by the test suite: random expressions over a
small fixed schema, and random events that leave attributes out and carry
values no predicate mentions.

A property test is only as good as its generator, so the pools hold what
real users send -- and what broke bexmatch before (NumPy's StringDType
``searchsorted`` was wrong for strings of 16 bytes or more and for embedded
NULs, numpy issue 31533, and the old pools held nothing longer than two
characters):

* short strings, and long ones sharing long prefixes: URLs that differ in
  their last character or only in a query string, UUIDs that differ in the
  last hex digits (all well past 16 bytes);
* non-ASCII: two- to four-byte UTF-8 (``é``, ``日本``, ``😀``, U+10FFFF), a
  combining character on its own and after a letter (``e`` + U+0301 is not
  ``é``), a character that case-folds oddly (``ﬀ``);
* NUL inside, at the start and at the end of a string; the empty string;
  the characters LIKE treats specially (``%``, ``_``) and a backslash (LIKE
  has no escape character) inside values;
* numbers on every bound: events take the literals' own values (ints and
  the floats equal to them, ``-0.0`` next to ``0`` and ``0.0``, ±2**53, the
  smallest subnormal, 1e300, float64's largest finite values) most of the
  time, and values between and outside them otherwise.

The pools stay small so that predicates and events *collide*: most event
values are literal values, so equality, IN, BETWEEN bounds and LIKE / regex
hits happen in nearly every example.  :func:`strings` is the wide
generator (arbitrary Unicode text, long values built on the pool's
prefixes) for events and for tests that want more than the pools.

No literal, pattern or name contains a parenthesis (tests/test_parse.py's
parenthesis test relies on it) or a lone surrogate (not valid Unicode: the
engine refuses it, tests/test_hostile_input.py checks that).
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import re2
from hypothesis import strategies as st

from engine.expr import And, Not, Op, Or, Pred, Xnor, Xor

NUMERIC_ATTRS = ("n0", "n1", "n2")
STRING_ATTRS = ("s0", "s1")
BOOLEAN_ATTRS = ("b0",)
#: list attributes (docs/language.md#list-attributes): of numbers, of strings
NUMERIC_LIST_ATTRS = ("l0",)
STRING_LIST_ATTRS = ("l1",)
LIST_ATTRS = NUMERIC_LIST_ATTRS + STRING_LIST_ATTRS
ATTRS = NUMERIC_ATTRS + STRING_ATTRS + BOOLEAN_ATTRS + LIST_ATTRS
#: the families of the attributes above, as ``Index(schema=...)`` takes them
SCHEMA = {**{a: "numeric" for a in NUMERIC_ATTRS}, **{a: "string" for a in STRING_ATTRS},
          **{a: "boolean" for a in BOOLEAN_ATTRS}, **{a: "list<numeric>" for a in NUMERIC_LIST_ATTRS},
          **{a: "list<string>" for a in STRING_LIST_ATTRS}}

# ------------------------------------------------------------------ string pools

SHORT_STRINGS = ("", "a", "ab", "b", "ba", "c", "é", "z")
#: long values sharing long prefixes (> 16 bytes), ordered neighbours
URL_STRINGS = (
    "https://example.com",
    "https://example.com/",
    "https://example.com/a",
    "https://example.com/b",
    "https://example.com/a/b",
    "https://example.com/a/b/c?x=1",
    "https://example.com/a/b/c?x=2",
    "https://example.org/a",
)
#: UUIDs differing only in their last characters
UUID_STRINGS = (
    "123e4567-e89b-12d3-a456-426614174000",
    "123e4567-e89b-12d3-a456-426614174001",
    "123e4567-e89b-12d3-a456-42661417400f",
    "123e4567-e89b-12d3-a456-426614174010",
)
UNICODE_STRINGS = ("日本", "日本語", "😀", "e\u0301", "\u0301", "Ω", "\U0010ffff")
NUL_STRINGS = ("a\x00b", "a\x00c", "\x00", "a\x00")
#: characters with a meaning elsewhere: LIKE wildcards, a backslash, a quote, a space
SPECIAL_STRINGS = ("a_b", "100%", "a\\b", "it's", "a b")

STRING_POOL = SHORT_STRINGS + URL_STRINGS + UUID_STRINGS + UNICODE_STRINGS + NUL_STRINGS + SPECIAL_STRINGS

#: event-only strings: between and beside the pool's values (a prefix of a
#: literal, a literal plus one character, the next UUID, a longer NUL run...)
STRING_EVENT_EXTRAS = (
    "aa", "abc", "bb", "cab", "y", "zz", "~",
    "https://example.co", "https://example.com/a/", "https://example.com/a/b/c?x=10", "https://example.com/c",
    "https://example.com/a\x00", "https://example.com/é",
    "123e4567-e89b-12d3-a456-426614174002", "123e4567-e89b-12d3-a456-4266141740",
    "日本人", "😀😀", "é\u0301", "ﬀ", "\uffff",
    "a\x00a", "a\x00bb", "\x00\x00", "ab\x00", "a\x00b\x00",
    "a_bc", "a%b", "a\\bc",
)

#: characters for the random tails of :func:`strings`
_TAIL_ALPHABET = st.sampled_from(["a", "b", "/", "?", "=", "-", "0", "f", "\x00", "é", "日", "😀", "\u0301", "%", "_"])

#: code points 0..0x10FFFF without surrogates
_ANY_CHARACTER = st.characters(codec="utf-8")

string_literals = st.sampled_from(STRING_POOL)


# ------------------------------------------- plain generators (NumPy's rng)
def realistic_strings(rng, n: int) -> list[str]:
    """``n`` strings as users send them, for tests that grow a dictionary
    round after round: URLs and UUID-like ids sharing long prefixes,
    non-ASCII, NUL, prefixes of one another."""
    base = "https://example.com/catalogue/" + "ä/" * 40
    out = []
    for _ in range(n):
        kind = int(rng.integers(5))
        k = int(rng.integers(10 ** 6))
        out.append([base + f"{k:06d}", f"{k:08x}-0000-4000-8000-{k:012x}", "naïve-✓-" + str(k % 97),
                    base[:int(rng.integers(1, len(base)))], f"z\x00{k % 13}"][kind])
    return out


def string_subscription(rng, words: list[str]) -> str:
    """A subscription on string attributes ``s`` and ``t`` (and numeric
    ``n``) over two of ``words``: every operator that holds string codes
    (comparisons, BETWEEN, IN, their negations), a DNF, a LIKE."""
    w1, w2 = sorted(rng.choice(words, 2, replace=False))
    q1, q2 = (w.replace("'", "''") for w in (w1, w2))
    return str(rng.choice([f"s = '{q1}'", f"s < '{q1}' AND n > 2", f"s >= '{q2}'", f"s BETWEEN '{q1}' AND '{q2}'",
                           f"s IN ('{q1}', '{q2}') AND n < 5", f"s NOT IN ('{q1}')", f"s != '{q2}' AND t = '{q1}'",
                           f"t BETWEEN '{q1}' AND '{q2}' AND s NOT BETWEEN '{q1}' AND '{q2}'",
                           f"(s = '{q1}' AND n = 1) OR t > '{q2}'", f"s LIKE 'https%' AND t <= '{q2}'"]))


def strings(max_size: int = 24):
    """The wide string generator: arbitrary Unicode text (NUL, astral,
    combining characters; never a lone surrogate) and long values made of
    a pool value plus a random tail (shared prefixes)."""
    return st.one_of(
        st.text(_ANY_CHARACTER, max_size=max_size),
        st.builds(lambda head, tail: head + tail, st.sampled_from(STRING_POOL + STRING_EVENT_EXTRAS),
                  st.text(_TAIL_ALPHABET, min_size=1, max_size=max(1, max_size // 3))),
    )


# Event values are the literals themselves most of the time (on every
# bound), else values between or outside them, else anything.
string_event_values = st.one_of(string_literals, string_literals, string_literals,
                                st.sampled_from(STRING_EVENT_EXTRAS), strings())

# ------------------------------------------------------------------ numeric pools

#: the numeric literals besides the small ints: halves, -0.0 next to 0,
#: the ends of the exact int range, the smallest subnormal, a huge float,
#: float64's largest finite values (a strict bound past them is infinity)
NUMERIC_LITERAL_FLOATS = (-1.5, 0.5, 2.5, 0.0, -0.0, 5e-324, 1e300, 1.7976931348623157e308, -1.7976931348623157e308)
NUMERIC_LITERAL_INTS = (2 ** 53, -(2 ** 53))
#: event-only numbers: between and beside the literals, and floats equal to int literals
NUMERIC_EVENT_EXTRAS = (-2.5, 1.25, 7.75, -3.0, 2.0, 3.0, 1.0, 0.49999999999999994, 2.5000000000000004,
                        2 ** 53 - 1, float(2 ** 53), -1e300, 1e-300, 1e301)

numeric_literals = st.one_of(st.integers(-3, 3), st.sampled_from(NUMERIC_LITERAL_FLOATS),
                             st.sampled_from(NUMERIC_LITERAL_INTS))
numeric_event_values = st.one_of(numeric_literals, numeric_literals, numeric_literals,
                                 st.integers(-5, 5), st.sampled_from(NUMERIC_EVENT_EXTRAS))

# ------------------------------------------------------------------ patterns

LIKE_POOL = (
    "a%", "%b", "_", "%", "", "a_", "%a%", "_b%", "c",
    "https://example.com/%", "%/b", "https://example.com/_", "https://example.com/a%", "%?x=_",
    "https://example.%/a", "123e4567-e89b-12d3-a456-42661417400_", "%-426614174000",
    "%\x00%", "a\x00_", "_\x00%", "\x00", "é%", "%本", "日_", "😀", "_\u0301", "e%", "%\u0301",
    "a\\%", "%\\b", "__", "_%_",
)
#: LIKE patterns: the pool, and patterns made from the literals (the
#: literal itself, as a prefix, as a suffix, its last character a wildcard)
like_patterns = st.one_of(
    st.sampled_from(LIKE_POOL),
    string_literals,
    string_literals.map(lambda s: s + "%"),
    string_literals.map(lambda s: "%" + s),
    string_literals.map(lambda s: s[:-1] + "_"),
)

#: RE2 patterns (search semantics), none with a parenthesis.  Each is
#: checked to mean the same in google-re2 and in DuckDB (tests/sql_oracle.py).
REGEX_POOL = (
    "^a", "b$", "a|c", "^$", "[ab]+", "a.b", "é",
    "^https://example\\.com/a", "example\\.com/[ab]$", "\\?x=\\d$", "^[0-9a-f]{8}-", "[0-9a-f]{12}$", "0{2}[0f]$",
    "\\x00", "a\\x00[bc]", "^\\x00", "a\x00b", "日本", "^.$", "^..$", "\\p{Han}", "😀", "e\u0301", "\u0301$",
    "[Hh][Tt][Tt][Pp][Ss]:", "[^a-z]", "\\Ah", "/\\z", "%", "a_b", "\\\\",
)
regex_patterns = st.one_of(st.sampled_from(REGEX_POOL), string_literals.map(re2.escape))

COMPARISONS = (Op.EQ, Op.NE, Op.LT, Op.LE, Op.GT, Op.GE)


def _predicate_on(attr: str, literals, ops_extra):
    comparison = st.builds(lambda op, v: Pred(attr, op, (v,)), st.sampled_from(COMPARISONS), literals)
    in_list = st.builds(lambda op, vs: Pred(attr, op, tuple(vs)), st.sampled_from([Op.IN, Op.NOT_IN]),
                        st.lists(literals, min_size=1, max_size=4))
    between = st.builds(lambda op, lo, hi: Pred(attr, op, (lo, hi)),
                        st.sampled_from([Op.BETWEEN, Op.NOT_BETWEEN]), literals, literals)
    null_test = st.builds(lambda op: Pred(attr, op, ()), st.sampled_from([Op.IS_NULL, Op.IS_NOT_NULL]))
    return st.one_of(comparison, in_list, between, null_test, *ops_extra)


def _string_predicate_on(attr: str, literals, likes, regexes, matches_ops=(Op.MATCHES,)):
    return _predicate_on(attr, literals, (
        st.builds(lambda op, p: Pred(attr, op, (p,)), st.sampled_from([Op.LIKE, Op.NOT_LIKE]), likes),
        st.builds(lambda op, p: Pred(attr, op, (p,)), st.sampled_from(matches_ops), regexes),
    ))


def _list_predicate_on(attr: str, literals):
    """Every list operator on a list attribute: ONE/NONE/ALL OF (the
    operand list may repeat a value), ``value IN attr`` and its negation,
    IS [NOT] EMPTY, IS [NOT] NULL."""
    of = st.builds(lambda op, vs: Pred(attr, op, tuple(vs)), st.sampled_from([Op.ONE_OF, Op.NONE_OF, Op.ALL_OF]),
                   st.lists(literals, min_size=1, max_size=4))
    contains = st.builds(lambda op, v: Pred(attr, op, (v,)), st.sampled_from([Op.CONTAINS, Op.NOT_CONTAINS]),
                         literals)
    tests = st.builds(lambda op: Pred(attr, op, ()),
                      st.sampled_from([Op.IS_EMPTY, Op.IS_NOT_EMPTY, Op.IS_NULL, Op.IS_NOT_NULL]))
    return st.one_of(of, of, contains, tests)


# Built once, per attribute (a flatmap over the attribute would build and
# validate a fresh strategy at every draw: most of a test's time).
_PREDICATES = st.one_of(
    *(_predicate_on(a, numeric_literals, ()) for a in NUMERIC_ATTRS),
    *(_string_predicate_on(a, string_literals, like_patterns, regex_patterns) for a in STRING_ATTRS),
    *(_predicate_on(a, st.booleans(), ()) for a in BOOLEAN_ATTRS),
    *(_list_predicate_on(a, numeric_literals) for a in NUMERIC_LIST_ATTRS),
    *(_list_predicate_on(a, string_literals) for a in STRING_LIST_ATTRS),
)


def predicates():
    return _PREDICATES


def string_predicates(literals):
    """Predicates on the string attributes whose operands all come from
    ``literals`` (a strategy of str): every operator, LIKE patterns made of
    a literal (itself, as a prefix or a suffix), MATCHES of an escaped
    literal or a prefix anchor -- for tests that bring their own (wide)
    values, so that their events hit the predicates."""
    like = st.one_of(literals, literals.map(lambda s: s + "%"), literals.map(lambda s: "%" + s),
                     literals.map(lambda s: s[:-1] + "_"))
    regex = st.one_of(literals.map(re2.escape), literals.map(lambda s: "^" + re2.escape(s)),
                      literals.map(lambda s: re2.escape(s) + "$"))
    return st.one_of(*(_string_predicate_on(a, literals, like, regex, (Op.MATCHES, Op.NOT_MATCHES))
                       for a in STRING_ATTRS))


_NOT_MATCHES = st.builds(lambda a, p: Pred(a, Op.NOT_MATCHES, (p,)), st.sampled_from(STRING_ATTRS), regex_patterns)


def expressions(max_leaves: int = 12, with_not_matches: bool = False, max_children: int = 4, leaves=None):
    """Random ASTs over every operator and connective, as the parser builds
    them (n-ary AND/OR with no directly nested AND in AND or OR in OR).
    ``max_leaves`` bounds the size (depth comes with it), ``max_children``
    the width of one AND/OR; ``leaves`` replaces :func:`predicates`."""
    leaves = predicates() if leaves is None else leaves
    if with_not_matches:
        leaves = st.one_of(leaves, _NOT_MATCHES)

    def extend(children):
        return st.one_of(
            st.builds(Not, children),
            st.lists(children, min_size=2, max_size=max_children).map(lambda cs: And(_flatten(And, cs))),
            st.lists(children, min_size=2, max_size=max_children).map(lambda cs: Or(_flatten(Or, cs))),
            st.builds(Xor, children, children),
            st.builds(Xnor, children, children),
        )

    return st.recursive(leaves, extend, max_leaves=max_leaves)


def deep_expressions(with_not_matches: bool = False):
    """Deep and wide expressions: large random trees (up to 48 leaves,
    AND/OR of up to 8 children), and chains nested 10 to 40 levels deep
    (alternating AND/OR/XOR under NOT), as real rule generators write them."""
    return st.one_of(expressions(max_leaves=48, with_not_matches=with_not_matches, max_children=8),
                     nested_chains())


def nested_chains(min_depth: int = 10, max_depth: int = 40):
    """``p1 AND NOT (p2 OR (p3 XOR (p4 AND ...)))``: one predicate per level,
    ``depth`` levels of alternating connectives."""
    def build(levels):
        node = levels[-1][0]
        for pred, kind in reversed(levels[:-1]):
            if kind == 0:
                node = And((pred, Not(node)))
            elif kind == 1:
                node = Or((pred,) + node.children) if isinstance(node, Or) else Or((pred, node))
            else:
                node = Xor(pred, node)
        return node

    return st.lists(st.tuples(predicates(), st.integers(0, 2)), min_size=min_depth, max_size=max_depth).map(build)


def fits_normal_form(node, limit: int = 256) -> bool:
    """Whether an AND-only algorithm (opindex) can index ``node`` within
    ``limit``: its DNF or its CNF has at most ``limit`` terms.  For tests
    that need every expression accepted, e.g.
    ``expressions().filter(fits_normal_form)``: a deep XOR/XNOR tree of a
    dozen distinct predicates exceeds 256 both ways (rare, but hypothesis
    finds it), and opindex rightly refuses it with ExpressionTooLarge."""
    from engine.errors import ExpressionTooLarge
    from engine.expr import to_cnf, to_dnf

    for rewrite in (to_dnf, to_cnf):
        try:
            rewrite(node, limit)
            return True
        except ExpressionTooLarge:
            pass
    return False


def _flatten(cls, children):
    flat = []
    for child in children:
        flat.extend(child.children if isinstance(child, cls) else (child,))
    return tuple(flat)


def event_lists(values):
    """An event list as users send them: empty, short or long (up to 12),
    with repeated values and None elements (ignored), mostly of the pools'
    literals; sometimes a tuple."""
    items = st.one_of(values, values, values, st.none())
    return st.one_of(st.lists(items, max_size=4), st.lists(items, max_size=12),
                     st.lists(values, min_size=1, max_size=3).map(lambda vs: vs + vs[:1]),     # a repeat
                     st.lists(values, max_size=3).map(tuple))


def events():
    """One event: a dict over a random subset of the schema's attributes,
    its values mostly on the literals (see the pools above)."""
    values = {a: numeric_event_values for a in NUMERIC_ATTRS}
    values.update({a: string_event_values for a in STRING_ATTRS})
    values.update({a: st.booleans() for a in BOOLEAN_ATTRS})
    values.update({a: event_lists(numeric_event_values) for a in NUMERIC_LIST_ATTRS})
    values.update({a: event_lists(string_event_values) for a in STRING_LIST_ATTRS})
    return st.fixed_dictionaries({}, optional=values)


def not_utf8_at(strings: pa.Array, draw) -> pa.Array:
    """``strings`` (an Arrow string array) with one of its non-empty values,
    drawn, no longer valid UTF-8 (its first byte made 0xFF) -- what a
    Parquet file, an IPC stream or a binary array's view can put in a
    string column, since Arrow does not check the bytes; ``strings`` as it
    is where no value is non-empty."""
    rows = [row for row, value in enumerate(strings.to_pylist()) if value]
    if not rows:
        return strings
    row = draw(st.sampled_from(rows))
    validity, offsets, data = strings.buffers()
    data = bytearray(data.to_pybytes())
    data[np.frombuffer(offsets, np.int32)[strings.offset + row]] = 0xFF
    return pa.Array.from_buffers(strings.type, len(strings), [validity, offsets, pa.py_buffer(bytes(data))],
                                 strings.null_count, strings.offset)
