"""The text route's shortcuts (issue 16 item 5) keep its answers: a
conjunction skips the normal-form check, the schema check and registration
share one family per predicate, the garbage collector is paused only while
texts are compiled."""

import gc

import numpy as np
import pyarrow as pa

import pytest

from engine import Index
from engine.algorithms import registry
from engine.compile import OPCODE
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


# ------------------------------------------------- bulk texts through the columnar form
#
# add_many of at least _COLUMNAR_TEXTS_FROM expressions reads its plain
# conjunctions straight into the columnar form (engine.columnar.texts_as_columns)
# and compiles the rest one by one; with the threshold out of reach every
# expression takes the text route.  Both must give the same index and, for a
# bad batch, the same error.

from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

import engine.index as index_module  # noqa: E402
from engine.columnar import texts_as_columns  # noqa: E402
from engine.expr import And, Not, Or  # noqa: E402
from engine.parse import to_text  # noqa: E402
from tests import strategies  # noqa: E402

_conjunctions = st.lists(strategies.predicates(), min_size=1, max_size=9).map(
    lambda preds: preds[0] if len(preds) == 1 else And(tuple(preds)))
#: what a bulk load holds: mostly conjunctions as text (whitespace and AND's
#: spelling varied), some other expressions, some ASTs
_bulk_expressions = st.one_of(
    _conjunctions.map(to_text), _conjunctions.map(to_text), _conjunctions.map(to_text),
    _conjunctions.map(lambda node: to_text(node).replace(" AND ", " and\n ")),
    strategies.expressions(max_leaves=6).map(to_text), _conjunctions)


def _in_lists_sorted(node):
    """``node`` with its IN lists in one order: a read-back list is in the
    order of its values' codes, and the two routes register strings in
    different orders."""
    if isinstance(node, Pred):
        if node.op in (Op.IN, Op.NOT_IN, Op.ONE_OF, Op.NONE_OF, Op.ALL_OF, Op.NOT_ALL_OF):
            return Pred(node.attr, node.op, tuple(sorted(node.values, key=repr)))
        return node
    if isinstance(node, (And, Or)):
        return type(node)(tuple(map(_in_lists_sorted, node.children)))
    if isinstance(node, Not):
        return Not(_in_lists_sorted(node.child))
    return type(node)(_in_lists_sorted(node.left), _in_lists_sorted(node.right))


LIST_SCHEMA = {a: strategies.SCHEMA[a] for a in strategies.LIST_ATTRS}


def _text_route(monkeypatch):
    monkeypatch.setattr(index_module, "_COLUMNAR_TEXTS_FROM", 10 ** 9)


def _built(algorithm, expressions, monkeypatch=None, text_route=False):
    if text_route:
        _text_route(monkeypatch)
    try:
        # (the list attributes declared: IS [NOT] EMPTY fixes no element type; the rest inferred)
        idx = Index(algorithm=algorithm, backend="cpu", schema=LIST_SCHEMA)
        idx.add_many(range(len(expressions)), expressions, progress=False)
    finally:
        if text_route:
            monkeypatch.undo()
    return idx


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                                                  HealthCheck.function_scoped_fixture])
@given(expressions=st.lists(_bulk_expressions, min_size=index_module._COLUMNAR_TEXTS_FROM, max_size=110),
       events=st.lists(strategies.events(), min_size=1, max_size=12),
       algorithm=st.sampled_from(["scan", "opindex"]))
def test_bulk_texts_build_the_index_the_text_route_builds(expressions, events, algorithm, monkeypatch):
    table, others = texts_as_columns(range(len(expressions)), expressions)
    assert table.num_rows > 0           # the columnar way is taken
    bulk = _built(algorithm, expressions)
    one_by_one = _built(algorithm, expressions, monkeypatch, text_route=True)
    assert dict(bulk.schema.items()) == dict(one_by_one.schema.items())
    assert bulk.statistics()["residual"] == one_by_one.statistics()["residual"]
    for sub_id in range(len(expressions)):
        assert _in_lists_sorted(parse(bulk.expression(sub_id))) == \
            _in_lists_sorted(parse(one_by_one.expression(sub_id))), sub_id
    assert [m.tolist() for m in bulk.match_batch(events)] == [m.tolist() for m in one_by_one.match_batch(events)]


def test_what_the_columnar_form_cannot_hold_takes_the_text_route():
    texts = ["a = 1 AND s = 'x'", "a = 1 OR s = 'x'", "b BETWEEN TRUE AND FALSE AND a = 2", "c IN (1, 'x')",
             "s LIKE 'x%' AND t IS NULL AND b = TRUE", "a = 1 AND", Pred("a", Op.EQ, (3,)), "d BETWEEN 1 AND 'z'",
             "s IN ('x', 'y') AND a BETWEEN 1 AND 2.5 AND u NOT IN (TRUE)"]
    table, others = texts_as_columns(range(10, 10 + len(texts)), texts)
    assert others == [1, 2, 3, 5, 6, 7]
    assert sorted(set(table["sub_id"].to_pylist())) == [10, 14, 18]
    rows = table.to_pylist()
    assert [(r["sub_id"], r["attr"], r["op"]) for r in rows] == [
        (10, "a", "="), (10, "s", "="), (14, "s", "LIKE"), (14, "t", "IS NULL"), (14, "b", "="),
        (18, "s", "IN"), (18, "a", "BETWEEN"), (18, "u", "NOT IN")]
    assert [rows[0]["value"], rows[1]["str_value"], rows[4]["bool_value"], rows[5]["str_values"],
            (rows[6]["value"], rows[6]["value_hi"]), rows[7]["bool_values"]] == [
        1.0, "x", True, ["x", "y"], (1.0, 2.5), [True]]


@pytest.mark.parametrize("bad", [
    "x = 'a'",                        # x is numeric in the earlier texts of the batch
    "x = ",                           # a syntax error
    "s IN (1, 'a')",                  # mixed literal types
    "x = 9007199254740993",           # beyond 2**53
    "s MATCHES '('",                  # a bad RE2 pattern
    "y = 1 AND y = 'b'",              # two families in one text
])
def test_a_bad_text_in_a_bulk_batch_fails_as_on_the_text_route_and_changes_nothing(bad, monkeypatch):
    texts = [f"x = {k} AND s = 'v{k % 7}'" for k in range(80)] + [bad] + ["z = 1"] * 10

    def failure(idx):
        with pytest.raises(Exception) as caught:
            idx.add_many(range(100, 100 + len(texts)), texts, progress=False)
        return type(caught.value), str(caught.value), getattr(caught.value, "__notes__", None)

    bulk = Index(algorithm="opindex", backend="cpu")
    bulk.add(1, "x = 1")
    got = failure(bulk)
    assert len(bulk) == 1 and set(bulk.schema) == {"x"}        # all or nothing
    _text_route(monkeypatch)
    reference = Index(algorithm="opindex", backend="cpu")
    reference.add(1, "x = 1")
    assert got == failure(reference)
    bulk.add_many(range(200, 300), [f"x = {k}" for k in range(100)], progress=False)     # still usable
    assert bulk.match({"x": 5}).tolist() == [205]


def test_equal_in_lists_share_one_id_whichever_way_they_came_in():
    # from text one by one, from many texts (the columnar way), from a table: one IN list, one predicate
    idx = Index(algorithm="scan", backend="cpu")
    idx.add(1, "n IN (3, 1, 2) AND s IN ('b', 'a')")
    many = [f"n IN (1, 2, 3, 3) AND s IN ('a', 'b') AND k = {k}" for k in range(index_module._COLUMNAR_TEXTS_FROM)]
    idx.add_many(range(100, 100 + len(many)), many, progress=False)
    idx.add_many(pa.table({"sub_id": [7, 7], "attr": ["n", "s"], "op": ["in", "not in"],
                           "values": [[2.0, 1.0, 3.0], None], "str_values": [None, ["b", "a"]]}))
    idx.add(8, "s NOT IN ('a', 'b')")
    idx.merge()
    table = idx._state.main.predicates
    in_rows = np.isin(table.op, [OPCODE[Op.IN], OPCODE[Op.NOT_IN]])
    assert in_rows.sum() == 3                        # n IN (1, 2, 3); s IN ('a', 'b'); s NOT IN ('a', 'b')
    assert len(set(table.aux[in_rows].tolist())) == 2     # ... over two lists


def test_lists_of_a_loaded_index_and_of_a_failed_add_are_shared_and_taken_back(tmp_path):
    idx = Index(algorithm="scan", backend="cpu")
    idx.add_many(pa.table({"sub_id": [1, 2], "attr": ["n", "n"], "op": ["in", "in"],
                           "values": [[1.0, 2.0], [5.0, 6.0]]}))
    idx.save(tmp_path / "idx.bex")
    loaded = Index.load(tmp_path / "idx.bex")
    with pytest.raises(SchemaError):          # a new list, then a family clash: all taken back
        loaded.add_many([3, 4], ["n IN (8, 9)", "n = 'x'"])
    loaded.add_many([5, 6], ["n IN (2, 1)", "n IN (9, 8)"])
    loaded.merge()
    table = loaded._state.main.predicates
    assert sorted(table.aux[table.op == OPCODE[Op.IN]].tolist()) == [0, 1, 2]   # (1, 2) shared; (8, 9) a third
    assert [m.tolist() for m in loaded.match_batch([{"n": 1}, {"n": 9}, {"n": 6}])] == [[1, 5], [6], [2]]
