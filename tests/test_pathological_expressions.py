"""Hostile expressions: nesting past the stated limit, long chains, numbers
of any length, text that is not valid Unicode.  Whatever the text, `parse`
returns an AST or raises ParseError or ExpressionTooLarge -- never a
RecursionError or a raw ValueError -- and every AST it returns goes through
each recursive path of the engine."""

from __future__ import annotations

import sys
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from engine import Index
from engine.errors import ExpressionTooLarge, ParseError
from engine.expr import (MAX_NESTING, And, Not, Op, Or, Pred, Xor, check_nesting, check_text, predicates, to_cnf,
                         to_dnf, to_nnf)
from engine.parse import parse, parse_many, to_text


def P(attr, op, *values):
    return Pred(attr, op, tuple(values))


# ---------------------------------------------------------------- nesting

def nots(depth):
    return "NOT " * depth + "a0 = 0"


def alternating(depth):
    """``a0 = 0 AND (a1 = 1 OR (a2 = 2 AND (... z = 0)))``: ``depth`` AND/OR levels."""
    text = "z = 0"
    for i in reversed(range(depth)):
        text = f"a{i} = {i} {'AND' if i % 2 == 0 else 'OR'} ({text})"
    return text


def negated_alternating(depth):
    return "NOT (" + alternating(depth - 1) + ")"


def xor_chain(depth):
    """Left-deep: one level per XOR."""
    return " XOR ".join(f"a{i} = {i}" for i in range(depth + 1))


NESTINGS = [nots, alternating, negated_alternating, xor_chain]


def _with_frames_in_use(frames, call):
    """``call()`` from a stack ``frames`` calls deeper than this one."""
    return call() if frames <= 0 else _with_frames_in_use(frames - 1, call)


def _stack_depth() -> int:
    frame, depth = sys._getframe(1), 0
    while frame is not None:
        frame, depth = frame.f_back, depth + 1
    return depth


@pytest.mark.parametrize("nesting", NESTINGS)
def test_text_at_the_nesting_limit_goes_through_every_recursive_path(nesting):
    text = nesting(MAX_NESTING)
    node = parse(text)
    check_nesting(node)

    def everything():
        assert to_nnf(node) is not None
        assert len(list(predicates(node))) == text.count("=")
        for rewrite in (to_dnf, to_cnf):
            try:
                rewrite(node, limit=256)
            except ExpressionTooLarge as error:       # the XOR chain's size, not its depth
                assert "limit of 256" in str(error)
        assert parse(to_text(node)) == node
        index = Index(algorithm="scan", backend="cpu")
        index.add(1, text)
        return index

    # The limit leaves room for a caller's stack: 150 frames in all, counted from the interpreter's first
    # (pytest's own take 33 of them, 38 under pytest-xdist's workers)
    index = _with_frames_in_use(150 - _stack_depth(), everything)
    event = {f"a{i}": i for i in range(MAX_NESTING + 1)} | {"z": 0}
    # every predicate TRUE: an even number of NOTs, 201 TRUE terms XORed
    assert index.match(event).tolist() == ([] if nesting is negated_alternating else [1])
    assert hash(node) == hash(parse(text)) and repr(node).startswith(type(node).__name__)


@pytest.mark.parametrize("nesting", NESTINGS)
@pytest.mark.parametrize("depth", [MAX_NESTING + 1, 1000, 5000])
def test_text_past_the_nesting_limit_is_refused(nesting, depth):
    with pytest.raises(ExpressionTooLarge, match=rf"nested {depth} levels deep.* limit of {MAX_NESTING} levels"):
        parse(nesting(depth))
    with pytest.raises(ExpressionTooLarge, match=rf"nested {depth} levels deep"):
        parse_many([nesting(depth)])


def test_parentheses_alone_do_not_nest():
    assert parse("(" * 50_000 + "a = 1" + ")" * 50_000) == P("a", Op.EQ, 1)
    assert parse("NOT (" * MAX_NESTING + "a = 1" + ")" * MAX_NESTING) == parse(nots(MAX_NESTING).replace("a0 = 0",
                                                                                                        "a = 1"))
    # flattened chains are one level however they are parenthesised
    assert check_nesting(parse("(" * 1000 + "a = 1" + " AND b = 1)" * 1000)) is None


def _nested_ast(depth):
    node = P("a", Op.EQ, 1)
    for level in range(depth):
        node = (Not(node), And((node, P("b", Op.EQ, level))), Or((P("c", Op.EQ, level), node)),
                Xor(node, P("d", Op.EQ, level)))[level % 4]
    return node


def test_check_nesting_is_not_recursive():
    check_nesting(_nested_ast(MAX_NESTING))
    check_nesting(P("a", Op.EQ, 1))
    deep = _nested_ast(20_000)
    with pytest.raises(ExpressionTooLarge, match=f"nested 20000 levels deep, deeper than the limit of {MAX_NESTING}"):
        check_nesting(deep)
    for rewrite in (to_dnf, to_cnf, to_text):     # each refuses rather than recursing
        with pytest.raises(ExpressionTooLarge):
            rewrite(deep)


def test_check_nesting_visits_a_shared_subtree_once():
    shared = P("a", Op.EQ, 1)
    for _ in range(MAX_NESTING):                  # 2 ** 200 paths, 200 distinct nodes
        shared = Or((shared, Not(shared)))
    start = time.perf_counter()
    with pytest.raises(ExpressionTooLarge, match=f"nested {2 * MAX_NESTING} levels deep"):
        check_nesting(shared)
    check_text(shared)
    assert time.perf_counter() - start < 1


def test_check_nesting_refuses_what_is_not_a_tree():
    children = []
    loop = And(children)
    children.append(loop)
    with pytest.raises(ValueError, match="cannot contain itself"):
        check_nesting(loop)
    with pytest.raises(TypeError, match="not an expression node: str"):
        check_nesting(And((P("a", Op.EQ, 1), "b = 1")))


def test_index_refuses_too_deep_input():
    index = Index(algorithm="scan", backend="cpu")
    with pytest.raises(ExpressionTooLarge):
        index.add(1, nots(MAX_NESTING + 1))
    with pytest.raises(ExpressionTooLarge):
        index.add(1, _nested_ast(MAX_NESTING + 1))
    assert index.ids().tolist() == []


# ---------------------------------------------------------------- text that is not valid Unicode

@pytest.mark.parametrize("node, message", [
    (P("a\ud800", Op.EQ, 1), r"attribute name 'a\\ud800' is not valid Unicode: lone surrogate at index 1"),
    (P("a", Op.EQ, "x\udfff"), r"string on attribute 'a' is not valid Unicode: lone surrogate '\\udfff' at index 1"),
    (And((P("a", Op.EQ, 1), Not(P("s", Op.IN, "ok", "\udc00")))), r"'s'.*'\\udc00' at index 0"),
    (Or((P("a", Op.EQ, 1), P("s", Op.LIKE, "%\ud83d\ude00"))), r"'\\ud83d' at index 1"),
    (Xor(P("a", Op.EQ, 1), P("s", Op.MATCHES, "\udbff")), "lone surrogate"),
    (P("s", Op.NOT_BETWEEN, "a", "b\ud800"), "lone surrogate"),
])
def test_check_text_refuses_lone_surrogates(node, message):
    with pytest.raises(ParseError, match=message):
        check_text(node)
    with pytest.raises(ParseError):
        Index(algorithm="scan", backend="cpu").add(1, node)


def test_check_text_accepts_any_valid_unicode():
    check_text(And((P("é ü\x00", Op.EQ, "\x00日本😀\U0010ffff"), P("n", Op.IN, 1, 2.5, True),
                    Not(P("s", Op.IS_NULL)), Xor(P("s", Op.LIKE, "%\ufffd"), P("s", Op.MATCHES, "\x00")))))
    check_text(_nested_ast(20_000))


def test_nul_is_valid_in_strings_and_names():
    node = parse("\"a\x00b\" = 'x\x00y' AND s IN ('\x00') AND s LIKE '%\x00%'")
    assert node == And((P("a\x00b", Op.EQ, "x\x00y"), P("s", Op.IN, "\x00"), P("s", Op.LIKE, "%\x00%")))
    assert parse(to_text(node)) == node


# ---------------------------------------------------------------- any hostile text

_FRAGMENTS = ["a", "b.c", '"q t"', '"and"', "AND", "or", "XOR", "xnor", "NOT", "IN", "BETWEEN", "LIKE", "MATCHES",
              "IS", "NULL", "TRUE", "false", "(", ")", ",", "=", "!=", "<>", "<=", ">", "1", "-2.5", ".5e3", "1e999",
              "'s'", "'it''s'", "'", '"', "$", "\x00", "é"]
_surrogates = st.characters(min_codepoint=0xD800, max_codepoint=0xDFFF)
_characters = st.one_of(st.characters(), _surrogates, st.sampled_from("\x00'\"() \n"))
_strings = st.text(_characters, max_size=8).map(lambda s: "'" + s.replace("'", "''") + "'")
_names = st.text(_characters, min_size=1, max_size=8).map(lambda s: '"' + s.replace('"', '""') + '"')
_numbers = st.builds(lambda sign, zeros, digits, fraction, exponent: sign + "0" * zeros + digits + fraction + exponent,
                     st.sampled_from(["", "-", "+"]), st.integers(0, 6000), st.text("0123456789", max_size=30),
                     st.sampled_from(["", ".", ".5", "." + "9" * 400]),
                     st.sampled_from(["", "e5", "e-400", "e308", "E+309", "e" + "9" * 5000, "e-" + "9" * 5000]))
_tokens = st.one_of(st.sampled_from(_FRAGMENTS), _strings, _names, _numbers, st.text(_characters, max_size=3))
_predicates = st.builds(lambda attr, op, value: f"{attr} {op} {value}", st.sampled_from(["a", '"x"']) | _names,
                        st.sampled_from(["=", "<", "LIKE", "MATCHES", "IN", "NOT IN"]),
                        _strings | _numbers | st.sampled_from(["(1, 'x')", "TRUE"]))
_token_soups = st.lists(st.tuples(_tokens, st.sampled_from(["", " ", "\n", "\t"])), max_size=30).map(
    lambda parts: "".join(token + gap for token, gap in parts))
_nested = st.builds(lambda nesting, depth, inner: nesting(depth).replace("a0 = 0", inner, 1),
                    st.sampled_from(NESTINGS), st.integers(0, 2 * MAX_NESTING), _predicates | _token_soups)
_chains = st.builds(lambda inner, connective, n: f" {connective} ".join([inner] * n),
                    _predicates | _token_soups, st.sampled_from(["AND", "OR", "XOR", "or", "AND NOT"]),
                    st.integers(1, 1500))
_parenthesised = st.builds(lambda opening, inner, closing: "(" * opening + inner + ")" * closing,
                           st.integers(0, 3 * MAX_NESTING), _predicates, st.integers(0, 3 * MAX_NESTING))
hostile_texts = st.one_of(_token_soups, _predicates, _nested, _chains, _parenthesised, st.text(_characters))

HOSTILE_EXAMPLES = 300


@settings(max_examples=HOSTILE_EXAMPLES, deadline=None)
@given(hostile_texts)
def test_any_text_gives_an_ast_or_a_stated_error(text):
    try:
        node = parse(text)
    except (ParseError, ExpressionTooLarge):
        return
    # what parse returns is within the limits and goes everywhere an AST goes
    check_nesting(node)
    check_text(node)
    assert parse(to_text(node)) == node
    for rewrite in (to_dnf, to_cnf):
        try:
            rewrite(node, limit=64)
        except ExpressionTooLarge:
            pass


def test_an_ast_sharing_subtrees_is_refused_by_its_expanded_size():
    """Text never shares a subtree, an AST may: 100 levels of ``x = x OR x``
    are 2**100 nodes for every rewrite that walks the paths."""
    from engine.expr import MAX_NODES

    node = Pred("a", Op.EQ, (1,))
    for _ in range(100):
        node = Or((node, node))
    index = Index(algorithm="scan", backend="cpu")
    with pytest.raises(ExpressionTooLarge, match=str(MAX_NODES)):
        index.add(1, node)
    assert len(index) == 0
    small = Pred("a", Op.EQ, (1,))
    for _ in range(10):
        small = Or((small, small))
    index.add(1, small)
    assert index.match({"a": 1}).tolist() == [1]


@pytest.mark.parametrize("text", ["s MATCHES '(a|b)*a(a|b){20}c'", "s LIKE '%a____________________c%'"])
def test_a_pattern_that_outgrows_re2s_dfa_answers_without_a_word_on_stderr(text, capfd):
    """RE2 falls back from its DFA to the NFA when a search outgrows the
    DFA's memory, and logged each fallback to stderr (through absl), one
    line an event on every batch."""
    import random
    rng = random.Random(1)
    noise = "".join(rng.choice("ab") for _ in range(200_000))
    index = Index(algorithm="scan", backend="cpu")
    index.add(1, text)
    events = [{"s": noise + "d"}, {"s": noise + "a" + "b" * 20 + "c"}]
    assert [m.tolist() for m in index.match_batch(events)] == [[], [1]]
    if "MATCHES" in text:       # explain() reads the reference evaluator's RE2 (its LIKE is its own)
        assert index.explain(1, events[1]).matches
    assert "DFA out of memory" not in capfd.readouterr().err
