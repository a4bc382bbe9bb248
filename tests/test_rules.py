"""Subscriptions from a rules table (engine.rules, issue 16 item 4), and the
columnar form's boolean columns it relies on: a random rules table, loaded
vectorised, answers as the same rules written as text."""

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest

from engine import Index, SchemaError, rules_to_columnar, validate
from engine.expr import And, Op

PREFIX = "https://shop.example.com/catalogue/" + "x" * 200 + "/"
COUNTRIES = ["DE", "FR", "Ünïcode", "a\x00b", PREFIX + "1", PREFIX + "2", PREFIX + "10"]
DEVICES = ["ios", "android", "desktop", "tv", PREFIX + "d"]


def _random_rules(rng, n):
    def maybe(make):
        return [make() if rng.random() < 0.6 else None for _ in range(n)]

    return pd.DataFrame({
        "rule_id": rng.permutation(np.arange(10, 10 + 3 * n, 3)),
        "country": maybe(lambda: str(rng.choice(COUNTRIES))),
        "device": maybe(lambda: [str(d) for d in rng.choice(DEVICES, rng.integers(1, 4), replace=False)]),
        "min_age": maybe(lambda: int(rng.integers(0, 60))),
        "max_floor": maybe(lambda: float(rng.integers(0, 8)) / 2),
        "premium": maybe(lambda: bool(rng.random() < 0.5)),
        "blocked": maybe(lambda: {int(x) for x in rng.integers(0, 6, 2)}),
        "url": maybe(lambda: str(rng.choice([PREFIX + "%", "%.com/%", "https://shop%"]))),
    })


COLUMNS = {"country": None, "device": None, "min_age": ("age", ">="), "max_floor": ("floor_price", "<="),
           "premium": "=", "blocked": ("site", "not in"), "url": ("url", "like")}


def _text(row) -> str | None:
    """The rule as text, written independently of engine.rules."""
    def quote(s):
        return "'" + s.replace("'", "''") + "'"
    parts = []
    if row.country is not None:
        parts.append(f"country = {quote(row.country)}")
    if row.device is not None:
        parts.append(f"device IN ({', '.join(quote(d) for d in row.device)})")
    if not pd.isna(row.min_age):
        parts.append(f"age >= {int(row.min_age)}")
    if not pd.isna(row.max_floor):
        parts.append(f"floor_price <= {row.max_floor!r}")
    if row.premium is not None:
        parts.append(f"premium = {'TRUE' if row.premium else 'FALSE'}")
    if row.blocked is not None:
        parts.append(f"site NOT IN ({', '.join(str(b) for b in sorted(row.blocked))})")
    if row.url is not None:
        parts.append(f"url LIKE {quote(row.url)}")
    return " AND ".join(parts) or None


def _random_events(rng, n):
    events = []
    for _ in range(n):
        event = {"country": str(rng.choice(COUNTRIES)), "device": str(rng.choice(DEVICES)),
                 "age": int(rng.integers(0, 62)), "floor_price": float(rng.integers(0, 9)) / 2,
                 "premium": bool(rng.random() < 0.5), "site": int(rng.integers(0, 7)),
                 "url": str(rng.choice([PREFIX + "shoes", "https://shop.example.com/", "http://x.org"]))}
        events.append({k: v for k, v in event.items() if rng.random() < 0.85})    # absent attributes too
    return events


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_a_random_rules_table_answers_as_its_rules_written_as_text(seed):
    rng = np.random.default_rng(seed)
    rules = _random_rules(rng, 120)
    texts = {int(row.rule_id): _text(row) for row in rules.itertuples()}
    rules = rules[[texts[int(i)] is not None for i in rules.rule_id]]       # (a rule must constrain something)
    table = rules_to_columnar(rules, columns=COLUMNS)
    columnar = Index(algorithm="opindex", backend="cpu")
    columnar.add_many(table)
    by_text = Index(algorithm="scan", backend="cpu")
    ids = [int(i) for i in rules.rule_id]
    by_text.add_many(ids, [texts[i] for i in ids])
    events = _random_events(rng, 300)
    got = columnar.match_batch(events)
    expected = by_text.match_batch(events)
    assert [g.tolist() for g in got] == [e.tolist() for e in expected]
    assert sum(len(e) for e in expected) > 30       # the run proves something
    for i in ids[:20]:                              # read back: the same expression (IN lists in any order)
        assert _canonical(columnar[i]) == _canonical(by_text[i])


def _canonical(text):
    node = validate(text)
    preds = node.children if isinstance(node, And) else (node,)
    return [(p.attr, p.op, tuple(sorted(p.values)) if p.op in (Op.IN, Op.NOT_IN) else p.values) for p in preds]


def test_arrow_input_dictionary_and_large_list_columns_and_the_pandas_index():
    table = pa.table({
        "id": pa.array([5, 6], pa.int32()),
        "country": pa.array(["DE", "FR"]).dictionary_encode(),
        "segments": pa.array([[1, 2], None], pa.large_list(pa.int64())),
    })
    out = rules_to_columnar(table, id_column="id")
    idx = Index(algorithm="opindex", backend="cpu")
    idx.add_many(out)
    assert dict(idx.items()) == {5: "country = 'DE' AND segments IN (1, 2)", 6: "country = 'FR'"}
    frame = pd.DataFrame({"country": ["DE", None], "age": [None, 3]}, index=[70, 71])
    idx.add_many(rules_to_columnar(frame, id_column=None))
    assert dict(idx.items())[70] == "country = 'DE'" and dict(idx.items())[71] == "age = 3"
    assert idx.match({"country": "DE", "segments": 2}).tolist() == [5, 70]


@pytest.mark.parametrize("frame, kwargs, message", [
    (pd.DataFrame({"rule_id": [1, 2], "a": [[1], []]}), {}, "rule 2, column 'a': an empty list"),
    (pd.DataFrame({"rule_id": [1, 2], "a": [1, None]}), {}, "rule 2 constrains nothing"),
    (pd.DataFrame({"rule_id": [1, 1], "a": [1, 2]}), {}, "rule id 1 appears in more than one row"),
    (pd.DataFrame({"rule_id": [1.5, 2], "a": [1, 2]}), {}, "must hold integers"),
    (pd.DataFrame({"rule_id": [1], "a": [[1, 2]]}), {"columns": {"a": "<="}},
     r"holds lists, which <= cannot take \(in / not in would\)"),
    (pd.DataFrame({"rule_id": [1], "a": [1]}), {"columns": {"a": "in"}},
     r"holds single values, which IN cannot take \(a comparison would\)"),
    (pd.DataFrame({"rule_id": [1], "a": [1]}), {"columns": {"b": None}}, "no column 'b'"),
    (pd.DataFrame({"rule_id": [1], "a": [1]}), {"columns": {"a": "between"}}, "operator 'between'"),
    (pd.DataFrame({"rule_id": [1], "a": [1]}), {"columns": {"a": "like"}}, "needs string patterns"),
    (pd.DataFrame({"rule_id": [1], "a": [2 ** 53 + 1]}), {}, "column 'a'"),
    (pd.DataFrame({"rule_id": [1], "a": [[1, None]]}), {}, "a null in it"),
    (pd.DataFrame({"a": [1]}), {}, "no id column 'rule_id'"),
    # a label that is not a str: Arrow made 0 the attribute "0" (and 0 beside "0" an Arrow KeyError)
    (pd.DataFrame({"rule_id": [1], 0: [5]}), {}, r"column label 0 \(int\) is not a name"),
    (pd.DataFrame({"rule_id": [1], True: ["x"]}), {}, r"column label True \(bool\) is not a name"),
    (pd.DataFrame({"rule_id": [1], 0: [5], "0": [6]}), {}, r"column label 0 \(int\) is not a name"),
    (pd.DataFrame({0: [1], "c": ["x"]}), {"id_column": 0}, r"column label 0 \(int\) is not a name"),
    (pd.DataFrame({"rule_id": [1], "c": ["x"]}), {"columns": {"c": ("a", "=", 1)}},
     r"column 'c': \('a', '=', 1\) is not \(attribute, operator\)"),
    (pd.DataFrame({"rule_id": [1], "c": ["x"]}), {"columns": {"c": (1, "=")}}, r"is not \(attribute, operator\)"),
])
def test_what_cannot_be_rules_is_refused_naming_rule_and_column(frame, kwargs, message):
    with pytest.raises(SchemaError, match=message):
        rules_to_columnar(frame, **kwargs)


def test_string_view_columns_are_rules_columns():
    """Polars' strings (string_view), lists of them and dictionaries of them
    were refused as of a type no attribute family holds."""
    table = pa.table({"rule_id": pa.array([1, 2], pa.int64()),
                      "country": pa.array(["DE", None], pa.string_view()),
                      "segments": pa.array([None, ["a", "b"]], pa.list_(pa.string_view())),
                      "city": pa.DictionaryArray.from_arrays(pa.array([0, 0], pa.int8()),
                                                             pa.array(["x"], pa.string_view()))})
    idx = Index(algorithm="scan", backend="cpu")
    idx.add_many(rules_to_columnar(table))
    assert dict(idx) == {1: "country = 'DE' AND city = 'x'", 2: "segments IN ('a', 'b') AND city = 'x'"}


def test_a_refused_rules_table_changes_nothing_in_the_index():
    idx = Index(algorithm="opindex", backend="cpu")
    idx.add(1, "a = 'x'")
    bad = rules_to_columnar(pd.DataFrame({"rule_id": [2, 3], "b": [1, 2], "a": [None, 4]}))
    with pytest.raises(SchemaError, match="'a' is string, not numeric"):
        idx.add_many(bad)
    assert len(idx) == 1 and "b" not in idx.schema


def test_the_columnar_form_takes_booleans_beside_numbers():
    table = pa.table({"sub_id": pa.array([1, 1, 2, 3], pa.int64()), "attr": ["price", "premium", "premium", "tag"],
                      "op": ["<=", "=", "in", "!="], "value": pa.array([5, None, None, None], pa.float64()),
                      "bool_value": pa.array([None, True, None, True]),
                      "bool_values": pa.array([None, None, [False], None], pa.list_(pa.bool_()))})
    idx = Index(algorithm="opindex", backend="cpu")
    idx.add_many(table)
    assert dict(idx.schema.items()) == {"price": "numeric", "premium": "boolean", "tag": "boolean"}
    assert dict(idx.items()) == {1: "price <= 5 AND premium = TRUE", 2: "premium IN (FALSE)", 3: "tag != TRUE"}
    assert idx.match({"price": 5, "premium": True, "tag": False}).tolist() == [1, 3]
    assert idx.match({"premium": False}).tolist() == [2]
    for bad, message in [
        ({"attr": ["price"], "op": ["="], "bool_value": pa.array([True])}, "'price' is numeric, not boolean"),
        ({"attr": ["x", "x"], "op": ["=", "="], "value": pa.array([1.0, None]), "bool_value": pa.array([None, True])},
         "'x' used with two type families"),
        ({"attr": ["y"], "op": ["="], "value": pa.array([1.0]), "bool_value": pa.array([True])}, "more than one of"),
        ({"attr": ["y"], "op": ["in"], "values": pa.array([[1.0]]), "bool_values": pa.array([[True]])},
         "more than one of values"),
        ({"attr": ["y"], "op": ["="], "bool_value": pa.array([1])}, "bool_value must hold booleans"),
        ({"attr": ["y"], "op": ["between"], "bool_value": pa.array([True])}, "BETWEEN needs"),
    ]:
        n = len(bad["attr"])
        with pytest.raises(SchemaError, match=message):
            idx.add_many(pa.table({"sub_id": pa.array([9] * n, pa.int64()), **bad}))
        assert len(idx) == 3


@pytest.mark.parametrize("frame, message", [
    (pd.DataFrame({"rule_id": [1, 2], "a": ["x", 5]}), "column 'a' holds cells of no one type"),
    (pd.DataFrame({"rule_id": [1, 2], "a": [True, 1]}), "column 'a' holds cells of no one type"),
    (pd.DataFrame({"rule_id": [1, 2], "a": [[1, 2], 3]}), "column 'a' holds cells of no one type"),
    (pd.DataFrame({"rule_id": [1], "a": [{1, "x"}]}), "column 'a' holds cells of no one type"),
    # (an object column: pandas 3 makes a str column Arrow-backed, and its constructor itself refuses the surrogate)
    (pd.DataFrame({"rule_id": [1], "a": pd.Series(["\ud800"], dtype=object)}), "column 'a' holds cells of no one type"),
    (pd.DataFrame([[1, 2, 3]], columns=["rule_id", "a", "a"]), "more than one column named 'a'"),
])
def test_pandas_tables_arrow_cannot_read_are_schema_errors(frame, message):
    """They raised Arrow's or Python's own exceptions (ArrowTypeError,
    TypeError from sorting a mixed set, AttributeError for a repeated name,
    UnicodeEncodeError)."""
    with pytest.raises(SchemaError, match=message):
        rules_to_columnar(frame)


@pytest.mark.parametrize("op", ["like", "matches", "in", "not in", "="])
def test_a_column_no_rule_fills_puts_no_constraint_whatever_its_operator(op):
    """pandas makes a column of nulls Arrow's null type, which was taken for
    numbers and single values: ``like`` and ``in`` refused a valid table."""
    frame = pd.DataFrame({"rule_id": [1, 2], "a": [1, 2], "url": [None, None]})
    index = Index()
    index.add_many(rules_to_columnar(frame, columns={"a": None, "url": op}))
    assert dict(index.items()) == {1: "a = 1", 2: "a = 2"}


def test_a_column_named_like_the_index_id_is_refused_not_replaced():
    frame = pd.DataFrame({"__index__": [5, 6], "a": [1, 2]}, index=[10, 20])
    with pytest.raises(SchemaError, match="a column is named '__index__'"):
        rules_to_columnar(frame, id_column=None)
    assert rules_to_columnar(frame, id_column="__index__")["sub_id"].to_pylist() == [5, 6]


@pytest.mark.parametrize("list_type", [pa.list_(pa.int64(), 2), pa.list_view(pa.int64()),
                                       pa.large_list_view(pa.int64()), pa.list_(pa.string(), 2),
                                       pa.list_view(pa.string())])
def test_list_cells_of_every_arrow_list_layout_are_in_lists(list_type):
    """Fixed-size lists and list views (the layouts events take) are IN
    lists as ``list<...>`` cells are; they were refused as holding "no
    attribute family" though they hold numbers or strings.  A null cell
    puts no constraint."""
    values = [["a", "b"], None, ["c", "a"]] if pa.types.is_string(list_type.value_type) else [[1, 2], None, [3, 1]]
    table = pa.table({"rule_id": [1, 2, 3], "x": pa.array(values, list_type), "y": [None, 5, None]})
    plain = table.set_column(1, "x", pa.array(values, pa.list_(list_type.value_type)))
    assert rules_to_columnar(table).to_pylist() == rules_to_columnar(plain).to_pylist()
    idx = Index(algorithm="scan")
    idx.add_many(rules_to_columnar(table))
    assert idx.match({"x": values[0][0], "y": 5}).tolist() == [1, 2, 3]     # rule 2 has no constraint on x
    assert idx.match({"x": values[0][1], "y": 4}).tolist() == [1]
