"""Hypothesis strategies shared by the test suite: random expressions over a
small fixed schema, and random events that leave attributes out and carry
values no predicate mentions."""

from __future__ import annotations

from hypothesis import strategies as st

from engine.expr import And, Not, Op, Or, Pred, Xnor, Xor

NUMERIC_ATTRS = ("n0", "n1", "n2")
STRING_ATTRS = ("s0", "s1")
BOOLEAN_ATTRS = ("b0",)
ATTRS = NUMERIC_ATTRS + STRING_ATTRS + BOOLEAN_ATTRS

# Literals used in predicates; events draw from wider pools so that values
# outside every dictionary (and between dictionary entries) appear.
numeric_literals = st.one_of(st.integers(-3, 3), st.sampled_from([-1.5, 0.5, 2.5]))
string_literals = st.sampled_from(["", "a", "ab", "b", "ba", "c", "é", "z"])
numeric_event_values = st.one_of(st.integers(-5, 5), st.sampled_from([-2.5, 0.5, 1.25, 2.5, 7.75]))
string_event_values = st.sampled_from(["", "a", "aa", "ab", "abc", "b", "ba", "bb", "c", "cab", "é", "y", "z", "zz"])
like_patterns = st.sampled_from(["a%", "%b", "_", "%", "", "a_", "%a%", "_b%", "c"])
regex_patterns = st.sampled_from(["^a", "b$", "a|c", "^$", "[ab]+", "a.b", "é"])

COMPARISONS = (Op.EQ, Op.NE, Op.LT, Op.LE, Op.GT, Op.GE)


def _predicate_on(attr: str, literals, ops_extra):
    comparison = st.builds(lambda op, v: Pred(attr, op, (v,)), st.sampled_from(COMPARISONS), literals)
    in_list = st.builds(lambda op, vs: Pred(attr, op, tuple(vs)), st.sampled_from([Op.IN, Op.NOT_IN]),
                        st.lists(literals, min_size=1, max_size=4))
    between = st.builds(lambda op, lo, hi: Pred(attr, op, (lo, hi)),
                        st.sampled_from([Op.BETWEEN, Op.NOT_BETWEEN]), literals, literals)
    null_test = st.builds(lambda op: Pred(attr, op, ()), st.sampled_from([Op.IS_NULL, Op.IS_NOT_NULL]))
    return st.one_of(comparison, in_list, between, null_test, *ops_extra)


def predicates():
    numeric = st.sampled_from(NUMERIC_ATTRS).flatmap(lambda a: _predicate_on(a, numeric_literals, ()))
    string = st.sampled_from(STRING_ATTRS).flatmap(lambda a: _predicate_on(a, string_literals, (
        st.builds(lambda op, p: Pred(a, op, (p,)), st.sampled_from([Op.LIKE, Op.NOT_LIKE]), like_patterns),
        st.builds(lambda p: Pred(a, Op.MATCHES, (p,)), regex_patterns),
    )))
    boolean = st.sampled_from(BOOLEAN_ATTRS).flatmap(lambda a: _predicate_on(a, st.booleans(), ()))
    return st.one_of(numeric, string, boolean)


def expressions(max_leaves: int = 12, with_not_matches: bool = False):
    """Random ASTs over every operator and connective, as the parser builds
    them (n-ary AND/OR with no directly nested AND in AND or OR in OR)."""
    leaves = predicates()
    if with_not_matches:
        leaves = st.one_of(leaves, st.sampled_from(STRING_ATTRS).flatmap(
            lambda a: regex_patterns.map(lambda p: Pred(a, Op.NOT_MATCHES, (p,)))))

    def extend(children):
        return st.one_of(
            st.builds(Not, children),
            st.lists(children, min_size=2, max_size=4).map(lambda cs: And(_flatten(And, cs))),
            st.lists(children, min_size=2, max_size=4).map(lambda cs: Or(_flatten(Or, cs))),
            st.builds(Xor, children, children),
            st.builds(Xnor, children, children),
        )

    return st.recursive(leaves, extend, max_leaves=max_leaves)


def _flatten(cls, children):
    flat = []
    for child in children:
        flat.extend(child.children if isinstance(child, cls) else (child,))
    return tuple(flat)


def events():
    """One event: a dict over a random subset of the schema's attributes."""
    values = {a: numeric_event_values for a in NUMERIC_ATTRS}
    values.update({a: string_event_values for a in STRING_ATTRS})
    values.update({a: st.booleans() for a in BOOLEAN_ATTRS})
    return st.fixed_dictionaries({}, optional=values)
