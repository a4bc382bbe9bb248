"""Arbitrary expressions in the columnar form: connective rows (``attr``
null, ``op`` 'and', 'or', 'not', 'xor' or 'xnor', ``arity``) after their
operands, a subscription's rows in postfix order
(``engine.columnar``).  They are compiled with array operations and give
what the same expressions give as ASTs or texts: the same texts read
back, the same matches, the same refusals."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import engine.columnar as columnar
from engine import ExpressionTooLarge, Index
from engine.columnar import expressions_as_columns
from engine.errors import SchemaError
from engine.expr import MAX_NESTING, And, Not, Op, Or, Pred, Xnor, Xor
from engine.parse import parse
from tests.strategies import SCHEMA, deep_expressions, events


def rows_table(rows, **types) -> pa.Table:
    """A columnar table from ``(sub_id, attr, op, value, values, arity)`` rows."""
    return pa.table({
        "sub_id": pa.array([r[0] for r in rows], pa.int64()),
        "attr": pa.array([r[1] for r in rows], pa.string()),
        "op": pa.array([r[2] for r in rows], pa.string()),
        "value": pa.array([r[3] for r in rows], types.get("value", pa.int64())),
        "values": pa.array([r[4] for r in rows], pa.list_(pa.int64())),
        "arity": pa.array([r[5] for r in rows], types.get("arity", pa.int64())),
    })


def as_texts(index: Index, ids) -> list[str]:
    return [index.expression(i) for i in ids]


def matches(index: Index, batch) -> list[list[int]]:
    return [sorted(found.tolist()) for found in index.match_batch(batch)]


#: (a < 5 OR NOT (b = 1 AND c IN (1, 2))) XOR d IS NULL; a >= 3 AND b != 2 (plain); NOT a > 1; rows interleaved
ROWS = [
    (1, "a", "<", 5, None, None), (1, "b", "=", 1, None, None), (2, "a", ">=", 3, None, None),
    (1, "c", "in", None, [1, 2], None), (1, None, "and", None, None, 2), (3, "a", ">", 1, None, None),
    (1, None, "not", None, None, None), (2, "b", "!=", 2, None, None), (1, None, "OR", None, None, 2),
    (1, "d", "is null", None, None, None), (3, None, "Not", None, None, 1), (1, None, "xor", None, None, None),
]
TEXTS = {1: "(a < 5 OR NOT (b = 1 AND c IN (1, 2))) XOR d IS NULL", 2: "a >= 3 AND b != 2", 3: "NOT a > 1"}
EVENTS = [{"a": a, "b": b, "c": c, "d": d} for a in (0, 1, 3, 5, 7, None) for b in (1, 2, None)
          for c in (1, 3, None) for d in (None, 1)]


@pytest.mark.parametrize("algorithm", ["scan", "opindex", "betree", "atree", "psthash"])
def test_postfix_rows_read_back_and_match_as_their_texts(algorithm):
    index = Index(algorithm=algorithm, backend="cpu")
    index.add_many(rows_table(ROWS))
    texts = Index(algorithm="scan", backend="cpu")
    texts.add_many(list(TEXTS), list(TEXTS.values()))
    assert as_texts(index, TEXTS) == as_texts(texts, TEXTS)
    assert index.expression(1) == "(a < 5 OR (b != 1 OR c NOT IN (1, 2))) XOR d IS NULL"     # NOT folded
    assert index.expression(3) == "a <= 1"
    assert matches(index, EVENTS) == matches(texts, EVENTS)
    assert sum(map(len, matches(index, EVENTS))) > 20


def test_not_folds_into_every_operator_and_through_every_connective():
    """NOT over each predicate kind is its negated operator; over AND/OR,
    De Morgan; over XOR, XNOR (and back); two NOTs cancel."""
    cases = [
        ("NOT x IN (1, 2)", [("x", "in", None, [1, 2], None), (None, "not", None, None, None)]),
        ("NOT x BETWEEN 1 AND 3", None),
        ("NOT s LIKE 'a%'", None),
        ("NOT x IS NULL", [("x", "is null", None, None, None), (None, "not", None, None, 1)]),
        ("NOT NOT x = 1", [("x", "=", 1, None, None), (None, "not", None, None, None),
                           (None, "not", None, None, None)]),
        ("NOT (x = 1 XOR y = 2)", [("x", "=", 1, None, None), ("y", "=", 2, None, None),
                                   (None, "xor", None, None, 2), (None, "not", None, None, None)]),
        ("NOT (x = 1 XNOR NOT y = 2)", [("x", "=", 1, None, None), ("y", "=", 2, None, None),
                                        (None, "not", None, None, None), (None, "xnor", None, None, None),
                                        (None, "not", None, None, None)]),
        ("NOT (x = 1 OR NOT (y = 2 AND x < 0))", [
            ("x", "=", 1, None, None), ("y", "=", 2, None, None), ("x", "<", 0, None, None),
            (None, "and", None, None, 2), (None, "not", None, None, None), (None, "or", None, None, 2),
            (None, "not", None, None, None)]),
    ]
    for text, rows in cases:
        node = parse(text)
        table = expressions_as_columns([7], [node]) if rows is None else \
            rows_table([(7,) + row for row in rows])
        got = Index(algorithm="scan", backend="cpu")
        got.add_many(table)
        want = Index(algorithm="scan", backend="cpu")
        want.add(7, text)
        assert got.expression(7) == want.expression(7), text
        batch = [{"x": x, "y": y, "s": s} for x in (-1, 1, 2, 3, None) for y in (2, 5, None) for s in ("ab", "b")]
        assert matches(got, batch) == matches(want, batch), text


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(st.lists(deep_expressions(with_not_matches=True), min_size=1, max_size=8), st.lists(events(), max_size=6))
def test_random_expressions_as_columns_equal_their_asts(nodes, batch):
    """Deep and wide random ASTs (every operator and connective), written
    out as postfix rows, read back and match as the ASTs do -- on `scan`,
    on the A-Tree (no limit) and on OpIndex (residual past its DNF limit)."""
    ids = list(range(100, 100 + len(nodes)))
    try:
        table = expressions_as_columns(ids, nodes)
    except ValueError as error:         # what the form cannot hold: a boolean BETWEEN
        assert "cannot hold" in str(error)
        return
    for algorithm in ("scan", "atree", "opindex"):
        from_columns = Index(algorithm=algorithm, backend="cpu", dnf_limit=8, schema=SCHEMA)
        from_columns.add_many(table)
        from_asts = Index(algorithm=algorithm, backend="cpu", dnf_limit=8, schema=SCHEMA)
        from_asts.add_many(ids, nodes)
        assert as_texts(from_columns, ids) == as_texts(from_asts, ids)
        assert from_columns.statistics()["residual"] == from_asts.statistics()["residual"]
        assert matches(from_columns, batch) == matches(from_asts, batch)


def test_a_shared_subtree_is_written_out_under_each_parent():
    shared = Or((Pred("x", Op.EQ, (1,)), Pred("y", Op.GT, (2,))))
    nodes = [And((shared, Pred("z", Op.LT, (3,)))), Not(shared), Xor(shared, shared)]
    table = expressions_as_columns([1, 2, 3], nodes)
    assert table["sub_id"].to_pylist() == [1] * 5 + [2] * 4 + [3] * 7
    assert table["op"].to_pylist()[:5] == ["=", ">", "or", "<", "and"]
    index = Index(algorithm="atree", backend="cpu")
    index.add_many(table)
    assert as_texts(index, [1, 2, 3]) == ["(x = 1 OR y > 2) AND z < 3", "x != 1 AND y <= 2",
                                          "(x = 1 OR y > 2) XOR (x = 1 OR y > 2)"]


def test_what_the_form_cannot_hold_is_refused_by_name():
    with pytest.raises(ValueError, match="subscription 5: the columnar form cannot hold"):
        expressions_as_columns([4, 5], [parse("x = 1"), Not(Pred("x", Op.IN, (1, "a")))])
    with pytest.raises(ValueError, match="2 ids for 1 expressions"):
        expressions_as_columns([1, 2], [parse("x = 1")])


BAD = [
    ([(1, "a", "=", 1, None, None), (1, None, "and", None, None, 2)],
     "row 1 .*AND needs 2 operand\\(s\\) before it"),
    ([(1, "a", "=", 1, None, None), (1, "b", "=", 1, None, None), (1, None, "not", None, None, None)],
     "row 2 .*leave more than one expression"),
    ([(1, None, "not", None, None, None), (1, "a", "=", 1, None, None)], "row 0 .*NOT needs 1 operand"),
    ([(1, "a", "=", 1, None, 1)], "row 0 .*arity is for connective rows"),
    ([(1, "a", "=", 1, None, None), (1, "b", "=", 1, None, None), (1, "a", "and", None, None, 2)],
     "row 2 .*a connective row has no attribute"),
    ([(1, "a", "=", 1, None, None), (1, None, "not", 3, None, None)], "row 1 .*takes no operand, and value"),
    ([(1, "a", "=", 1, None, None), (1, None, "not", None, None, 2)], "row 1 .*NOT takes 1 operand"),
    ([(1, "a", "=", 1, None, None), (1, "b", "=", 1, None, None), (1, None, "xor", None, None, 3)],
     "row 2 .*XOR takes 2 operand"),
    ([(1, "a", "=", 1, None, None), (1, None, "or", None, None, None)], "row 1 .*arity of 1 or more"),
    ([(1, "a", "=", 1, None, None), (1, None, "and", None, None, 0)], "row 1 .*arity of 1 or more"),
    ([(1, "a", "=", 1, None, None), (2, None, "nand", None, None, 2)], "row 1 .*unknown operator .nand.*xnor"),
    ([(1, "a", "=", 1, None, None), (1, "b", "=", None, None, None), (1, None, "and", None, None, 2)],
     "row 1 .*attribute 'b'.*needs value"),          # a predicate row's own checks name its row in the table
    ([(1, "a", "=", 1, None, None), (1, "a", "=", "x", None, None), (1, None, "or", None, None, 2)], None),
]


@pytest.mark.parametrize("rows, message", BAD)
def test_bad_connective_rows_are_refused_and_change_nothing(rows, message):
    index = Index(algorithm="atree", backend="cpu")
    index.add(9, "keep = 1")
    types = {"value": pa.string()} if any(isinstance(r[3], str) for r in rows) else {}
    if types:       # one column holds one type: a string where a number was expected is a family clash
        rows = [r if isinstance(r[3], str) or r[3] is None else r[:3] + (str(r[3]),) + r[4:] for r in rows]
    with pytest.raises(SchemaError, match=message or "columnar subscriptions"):
        index.add_many(rows_table(rows, **types))
    assert len(index) == 1 and dict(index.schema.items()) == {"keep": "numeric"}
    assert index.match({"keep": 1, "a": 1, "b": 1}).tolist() == [9]


def test_an_id_past_int64_is_named_by_its_row_in_the_table():
    """With connective rows, the id check names the row in the table the
    user gave (it once counted the predicate rows only: row 2 here)."""
    table = rows_table([(1, "a", "=", 1, None, None), (1, "b", "=", 1, None, None), (1, None, "and", None, None, 2),
                        (2, "a", "=", 1, None, None)])
    table = table.set_column(0, "sub_id", pa.array([1, 1, 1, 2 ** 63], pa.uint64()))
    index = Index(algorithm="atree", backend="cpu")
    with pytest.raises(SchemaError, match=r"sub_id: row 3: id 9223372036854775808 does not fit in int64"):
        index.add_many(table)
    assert len(index) == 0


def test_an_arity_column_must_hold_integers():
    table = rows_table([(1, "a", "=", 1, None, None), (1, None, "not", None, None, None)]).set_column(
        5, "arity", pa.array([None, 1.0], pa.float64()))
    with pytest.raises(SchemaError, match="arity must be an integer column"):
        Index(algorithm="scan", backend="cpu").add_many(table)


def test_nesting_past_the_limit_is_refused_as_an_ast_is(monkeypatch):
    deep = [(1, "a", "=", 1, None, None)] + [(1, None, "not", None, None, None)] * (MAX_NESTING + 1)
    with pytest.raises(SchemaError, match=f"nested more than {MAX_NESTING} connectives deep"):
        Index(algorithm="scan", backend="cpu").add_many(rows_table(deep))
    index = Index(algorithm="scan", backend="cpu")
    index.add_many(rows_table(deep[:-1]))           # exactly at the limit: 200 NOTs, an even number
    assert index.expression(1) == "a = 1"
    monkeypatch.setattr(columnar, "MAX_NODES", 5)
    with pytest.raises(SchemaError, match="more than 5 rows"):
        Index(algorithm="scan", backend="cpu").add_many(rows_table(deep[:7]))


def test_a_limited_algorithm_flags_or_refuses_what_it_would_flag_or_refuse_as_an_ast():
    """OpIndex indexes an expression through its DNF/CNF: past ``dnf_limit``
    it is residual (matched beside), or refused with ``strict=True`` --
    the same whether it came as an AST or as rows; a refusal changes
    nothing."""
    wide = And(tuple(Or((Pred(f"a{i}", Op.EQ, (1,)), Pred(f"b{i}", Op.EQ, (1,)))) for i in range(5)))  # 32 x 5
    table = expressions_as_columns([1, 2], [wide, parse("x = 1 OR y = 2")])
    flagged = Index(algorithm="opindex", backend="cpu", dnf_limit=4)
    flagged.add_many(table)
    assert flagged.statistics()["residual"] == 1
    event = {**{f"a{i}": 1 for i in range(5)}, "x": 1}
    assert flagged.match(event).tolist() == [1, 2]
    strict = Index(algorithm="opindex", backend="cpu", dnf_limit=4, strict=True)
    strict.add(3, "z = 1")
    with pytest.raises(ExpressionTooLarge):
        strict.add_many(table)
    assert len(strict) == 1 and dict(strict.schema.items()) == {"z": "numeric"}


def test_plain_tables_and_unused_dictionary_entries_keep_the_plain_form():
    """A table without connective rows is the AND of each subscription's
    rows, as before -- also when its op column is a dictionary that holds
    connective names no row uses, or it has an arity column all null."""
    table = expressions_as_columns([1, 2], [parse("a = 1 AND b < 2"), parse("a = 2")])
    assert "and" in table["op"].combine_chunks().dictionary.to_pylist()
    plain = table.filter(pa.compute.is_valid(table["attr"])).drop_columns(["arity"])
    for given in (plain, plain.append_column("arity", pa.array([None] * plain.num_rows, pa.int64()))):
        index = Index(algorithm="scan", backend="cpu")
        index.add_many(given)
        assert as_texts(index, [1, 2]) == ["a = 1 AND b < 2", "a = 2"]
        assert index._state.main.prog_kind.tolist()[-2:] == [0, 1]       # a plain one-row subscription: LEAF, AND


def test_attribute_dictionary_entries_no_row_uses_name_nothing():
    """An ``attr`` dictionary keeps the entries a filter took away: an empty
    or null one made the table an IndexError, and an unused name became an
    attribute of no family in the schema."""
    full = pa.table({"sub_id": pa.array([1, 2, 3], pa.int64()),
                     "attr": pa.array(["", "price", "color"]).dictionary_encode(),
                     "op": ["=", "<", "="], "value": [1.0, 5.0, 2.0]})
    table = full.filter(pa.array([False, True, False]))
    assert table["attr"].combine_chunks().dictionary.to_pylist() == ["", "price", "color"]
    nulls = pa.table({"sub_id": pa.array([2], pa.int64()), "op": ["<"], "value": [5.0],
                      "attr": pa.DictionaryArray.from_arrays(pa.array([1], pa.int8()), pa.array([None, "price"]))})
    for given in (table, nulls):
        index = Index(algorithm="scan", backend="cpu")
        index.add_many(given)
        assert dict(index) == {2: "price < 5"} and dict(index.schema) == {"price": "numeric"}
        assert index.match({"price": 1}).tolist() == [2]
    used_null = pa.table({"sub_id": pa.array([2], pa.int64()), "op": ["<"], "value": [5.0],
                          "attr": pa.DictionaryArray.from_arrays(pa.array([0], pa.int8()), pa.array([None, "x"]))})
    index = Index(algorithm="scan", backend="cpu")
    with pytest.raises(SchemaError, match=r"row 0 \(sub_id 2\): a null attribute name"):
        index.add_many(used_null)
    assert len(index) == 0 and dict(index.schema) == {}


def test_abe_gen_as_columns_matches_its_asts():
    """ABE-Gen's shared ASTs (W5's generator) written out as rows."""
    from engine.workloads import abe_gen
    w = abe_gen(400, 30, seed=3)
    ids = w.subscriptions["sub_id"].to_pylist()
    table = expressions_as_columns(ids, w.asts)
    assert set(pa.compute.unique(table["op"]).to_pylist()) >= {"and", "or", "not", "xor", "xnor"}
    from_columns = Index(algorithm="atree", backend="cpu")
    from_columns.add_many(table)
    from_asts = Index(algorithm="atree", backend="cpu")
    from_asts.add_many(ids, w.asts)
    assert as_texts(from_columns, ids) == as_texts(from_asts, ids)
    from_columns.merge()
    from_asts.merge()
    got, want = matches(from_columns, w.events), matches(from_asts, w.events)
    assert got == want and sum(map(len, got)) > 100
    np.testing.assert_array_equal(from_columns._state.main.sub_ids, from_asts._state.main.sub_ids)


def test_edge_tables_with_connectives():
    """An empty table with an arity column adds nothing; a subscription of
    connective rows only, or with a huge or negative arity, is refused by
    its row; one of a thousand subscriptions being bad changes nothing."""
    index = Index(algorithm="atree", backend="cpu")
    index.add_many(rows_table([]))
    assert len(index) == 0
    for rows, message in (([(1, None, "and", None, None, 2)], "row 0 .*AND needs 2"),
                          ([(1, "a", "=", 1, None, None), (1, None, "or", None, None, 1 << 40)], "row 1 .*OR needs"),
                          ([(1, "a", "=", 1, None, None), (1, None, "not", None, None, -1)], "row 1 .*NOT takes 1")):
        with pytest.raises(SchemaError, match=message):
            index.add_many(rows_table(rows))
    good = [(i, "a", "=", i, None, None) for i in range(1000)] + [(i, None, "not", None, None, None)
                                                                  for i in range(1000)]
    with pytest.raises(SchemaError, match="row 2000 .*leave more than one expression"):
        index.add_many(rows_table(good + [(5, "b", "=", 1, None, None)]))
    assert len(index) == 0 and dict(index.schema.items()) == {}
    index.add_many(rows_table(good))
    assert len(index) == 1000 and index.match({"a": 3}).size == 999


def test_in_lists_read_back_in_value_order_whatever_order_their_strings_came_in():
    """A set's keys are string ids, which follow the order strings were
    first registered in: the same list read back as ('b', 'a') after one
    route and ('a', 'b') after another (the random test above found it)."""
    index = Index(algorithm="scan", backend="cpu")
    index.add(1, "s = 'b'")
    index.add(2, "s IN ('a', 'b') AND t NOT IN ('z', 'y', 'x')")
    assert index.expression(2) == "s IN ('a', 'b') AND t NOT IN ('x', 'y', 'z')"
    other = Index(algorithm="scan", backend="cpu")
    other.add_many(expressions_as_columns([2], [parse("t NOT IN ('y', 'x', 'z') AND s IN ('b', 'a')")]))
    assert other.expression(2) == "t NOT IN ('x', 'y', 'z') AND s IN ('a', 'b')"


def test_a_missing_attr_column_or_a_null_attr_on_a_predicate_row_is_a_schema_error():
    """A table with connective rows and no attr column raised a KeyError
    from Arrow, not the SchemaError a plain table gets."""
    no_attr = pa.table({"sub_id": pa.array([1, 1], pa.int64()), "op": ["=", "not"],
                        "value": pa.array([1, None], pa.int64())})
    with pytest.raises(SchemaError, match="missing column 'attr'"):
        Index(algorithm="scan", backend="cpu").add_many(no_attr)
    null_attr = rows_table([(1, "a", "=", 1, None, None), (1, None, "=", 2, None, None),
                            (1, None, "and", None, None, 2)])
    with pytest.raises(SchemaError, match="row 1 has a null attr"):   # its number in the table given
        Index(algorithm="scan", backend="cpu").add_many(null_attr)


def test_an_arity_past_int64_is_refused_without_a_numpy_warning():
    """A nullable uint64 arity column went through floats: 2**63 + 1 cast
    back to int64 with NumPy's RuntimeWarning before the refusal."""
    table = pa.table({"sub_id": pa.array([1, 1, 1], pa.int64()), "attr": ["a", "b", None], "op": ["=", "=", "and"],
                      "value": [1.0, 2.0, None], "arity": pa.array([None, None, 2 ** 63 + 1], pa.uint64())})
    index = Index(algorithm="scan", backend="cpu")
    with pytest.raises(SchemaError, match=r"row 2 \(sub_id 1\): AND needs \d+ operand\(s\) before it"):
        index.add_many(table)
    index.add_many(table.set_column(4, "arity", pa.array([None, None, 2], pa.uint64())))
    assert as_texts(index, [1]) == ["a = 1 AND b = 2"]


def _string_forms(strings: pa.Array) -> dict:
    """A string column as Polars, Parquet and Arrow's newest hand it over."""
    view = pc.cast(strings, pa.string_view())
    codes, values = pc.index_in(strings, pc.unique(strings)), pc.unique(strings)
    return {"string_view": view, "dictionary": strings.dictionary_encode(),
            "dictionary of string_view": pa.DictionaryArray.from_arrays(codes, pc.cast(values, pa.string_view()))}


@pytest.mark.parametrize("column", ["attr", "op", "str_value", "str_values"])
def test_string_view_and_dictionary_columns_read_as_strings(column):
    """string_view columns (and dictionaries of strings among the operands)
    were refused as of an unsupported type."""
    plain = pa.table({"sub_id": pa.array([1, 1, 2], pa.int64()), "attr": ["a", "c", "b"], "op": ["=", "like", "in"],
                      "str_value": ["x", "y%", None], "str_values": pa.array([None, None, ["p", "q"]])})
    reference = Index(algorithm="scan", backend="cpu")
    reference.add_many(plain)
    if column == "str_values":
        forms = {"list<string_view>": pa.array([None, None, ["p", "q"]], pa.list_(pa.string_view())),
                 "large_list<string_view>": pa.array([None, None, ["p", "q"]], pa.large_list(pa.string_view()))}
    else:
        forms = _string_forms(plain[column].combine_chunks())
    for name, array in forms.items():
        index = Index(algorithm="scan", backend="cpu")
        index.add_many(plain.set_column(plain.schema.get_field_index(column), column, array))
        assert dict(index) == dict(reference) == {1: "a = 'x' AND c LIKE 'y%'", 2: "b IN ('p', 'q')"}, name
    # one view: its length (1, int32) and its bytes inline (0xff: no UTF-8)
    bad = pa.Array.from_buffers(pa.string_view(), 1, [None, pa.py_buffer(b"\x01\x00\x00\x00\xff" + bytes(11))])
    with pytest.raises(SchemaError, match="the str_value column is not valid UTF-8"):
        Index(algorithm="scan", backend="cpu").add_many(plain.slice(0, 1).set_column(3, "str_value", bad))
