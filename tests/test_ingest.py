"""The text route's shortcuts (issue 16 item 5) keep its answers: a
conjunction skips the normal-form check, the schema check and registration
share one family per predicate, the garbage collector is paused only while
texts are compiled."""

import gc

import pytest

from engine import Index
from engine.algorithms import registry
from engine.errors import ParseError, SchemaError
from engine.expr import Op, Pred
from engine.parse import parse

TEXTS = [
    "a = 1",
    "a = 1 AND b < 2.5 AND c = 'x'",
    "a = 1 AND (b < 2 OR c = 'y')",
    "(a = 1 OR b = 2) AND (c = 'x' OR d = 3) AND (e = 1 OR f = 2)",
    "a = 1 XOR b = 2",
    "NOT (a = 1 AND b = 2)",
    "a IN (1, 2, 3) AND b BETWEEN 1 AND 4 AND c LIKE 'x%' AND d IS NULL",
]


@pytest.mark.parametrize("name", [a for a in registry.names() if registry.get(a).limit_check])
@pytest.mark.parametrize("limit", [1, 2, 4])
def test_the_conjunction_shortcut_gives_the_full_checks_answer(name, limit):
    algorithm = registry.get(name)
    full = registry._load(algorithm.limit_check)
    for text in TEXTS:
        node = parse(text)
        try:
            full(node, limit)
            expected = None
        except Exception as exc:            # ExpressionTooLarge
            expected = type(exc)
        got = algorithm.limit_error(node, limit)
        assert (None if got is None else type(got)) is expected, (name, limit, text)


def test_a_long_conjunction_is_native_even_at_the_smallest_limit():
    text = " AND ".join(f"a{i} >= {i}" for i in range(300))
    idx = Index(algorithm="opindex", backend="cpu", dnf_limit=1, strict=True)
    idx.add(1, text)
    assert idx.statistics()["residual"] == 0
    with pytest.raises(Exception, match="limit"):
        idx.add(2, "(a0 = 1 OR a1 = 1) AND (a2 = 1 OR a3 = 1)")
    assert idx.match({f"a{i}": i for i in range(300)}).tolist() == [1]


def test_families_are_checked_once_and_registered_the_same():
    idx = Index(algorithm="scan", backend="cpu")
    idx.add_many([1, 2, 3], ["x = 1.5 AND s = 'a'", "b = TRUE AND x < 2", "s IN ('b', 'c') AND x = 9007199254740992"])
    assert dict(idx.schema.items()) == {"x": "numeric", "s": "string", "b": "boolean"}
    # texts, and ASTs (which reach the schema's number check without the parser's)
    for bad in ["x = 9007199254740993", "s = 1", "x = 'a'", Pred("x", Op.EQ, (2 ** 53 + 1,)),
                Pred("x", Op.LT, (float("inf"),)), Pred("x", Op.EQ, (float("nan"),)), Pred("s", Op.EQ, (2.0,))]:
        before = len(idx)
        with pytest.raises((SchemaError, ParseError)):
            idx.add_many([10, 11], ["y = 1", bad])
        assert len(idx) == before and "y" not in idx.schema     # all or nothing
    assert idx.match({"x": 1.5, "s": "a"}).tolist() == [1]


def test_the_collector_runs_again_after_add_many_even_when_it_fails():
    assert gc.isenabled()
    idx = Index(algorithm="scan", backend="cpu")
    idx.add_many([1, 2], ["a = 1", "b = 2"])
    assert gc.isenabled()
    with pytest.raises(Exception):
        idx.add_many([3, 4], ["a = 1", "a = "])
    assert gc.isenabled()
    gc.disable()
    try:
        idx.add_many([5], ["c = 1"])
        assert not gc.isenabled()            # a caller's own pause is kept
    finally:
        gc.enable()
