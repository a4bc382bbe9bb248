"""Reading an index back and explaining its answers: ``idx.expression`` /
``idx[id]`` / iteration give each subscription's text (parsing it gives
the same answers), ``idx.explain(id, event)`` agrees with ``match`` on
random workloads for every algorithm, NULL predicates name the absent
attribute, ``engine.validate`` checks without adding, ``idx.schema`` reads
as ``{attribute: family}``, ``bexmatch explain`` prints the same."""

from __future__ import annotations

import json

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import engine
from engine import ALGORITHMS, Index
from engine.cli import main
from engine.errors import ExpressionTooLarge, ParseError
from engine.explain import Explanation
from engine.parse import to_text
from engine.reference import evaluate
from tests import strategies


def _index(algorithm, texts, merged):
    idx = Index(algorithm=algorithm, backend="cpu", schema=strategies.SCHEMA)     # (IS EMPTY needs list families)
    idx.add_many(list(range(len(texts))), texts)
    if merged:
        idx.merge()
    return idx


def _walk(explanation: Explanation):
    yield explanation
    for child in explanation.children:
        yield from _walk(child)


@pytest.mark.parametrize("algorithm", ALGORITHMS)
@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(nodes=st.lists(strategies.expressions(max_leaves=8), min_size=1, max_size=8),
       events=st.lists(strategies.events(), min_size=1, max_size=6), merged=st.booleans())
def test_explain_agrees_with_match_and_the_read_back_text(algorithm, nodes, events, merged):
    """On random expressions (long strings, NUL, non-ASCII, values on
    bounds, absent attributes) and events: the root's value is TRUE exactly
    for the ids ``match`` reports, each node's value is the reference
    evaluator's on that node, NULL predicates name an absent attribute,
    and the read-back text parses to an expression with the same answers."""
    texts = [to_text(n) for n in nodes]
    idx = _index(algorithm, texts, merged)
    read_back = dict(idx)
    assert sorted(read_back) == list(range(len(texts)))
    for event in events:
        got = idx.match(event).tolist()
        for sub_id in range(len(texts)):
            explanation = idx.explain(sub_id, event)
            assert explanation.matches == (sub_id in got), (texts[sub_id], event, str(explanation))
            assert explanation.value == evaluate(nodes[sub_id], event)
            assert evaluate(engine.validate(read_back[sub_id]), event) == explanation.value
            for node in _walk(explanation):
                assert node.value == evaluate(engine.validate(node.text), event), node.text
                if node.absent is not None:
                    assert node.kind == "predicate" and node.value is None and event.get(node.absent) is None


def test_read_back_from_main_and_delta_after_updates():
    idx = Index(algorithm="opindex")
    idx.add(7, "price <= 580 AND color = 'silver' AND brand IN ('a', 'b')")
    idx.add_many([8, 9], ["color = 'red' OR price > 1000", "NOT (brand LIKE 'x%') AND price IS NOT NULL"])
    assert idx[9] == idx.expression(9) == "brand NOT LIKE 'x%' AND price IS NOT NULL"    # NOT pushed down
    idx.merge()
    idx.add(3, "price BETWEEN 1 AND 2 XOR color MATCHES '^r'")
    idx.remove(8)
    assert list(idx) == [(3, "price BETWEEN 1 AND 2 XOR color MATCHES '^r'"),
                         (7, "price <= 580 AND color = 'silver' AND brand IN ('a', 'b')"),
                         (9, "brand NOT LIKE 'x%' AND price IS NOT NULL")]
    for missing in (8, 100):
        with pytest.raises(KeyError, match=f"subscription id {missing} is not in the index"):
            idx.expression(missing)
        with pytest.raises(KeyError):
            idx.explain(missing, {})
    with pytest.raises(TypeError, match="explain takes one event as a dict"):
        idx.explain(7, [{"price": 1}])
    # any mapping is an event, as in match_batch's lists (a read-only view was refused by match and explain)
    from types import MappingProxyType
    view = MappingProxyType({"price": 1})
    assert idx.match(view).tolist() == idx.match({"price": 1}).tolist()
    assert str(idx.explain(7, view)) == str(idx.explain(7, {"price": 1}))
    with pytest.raises(engine.BadEventError):          # the event checked as match checks it
        idx.explain(7, {"price": "cheap"})


def test_explanation_as_text_and_data():
    idx = Index()
    idx.add(1, "price <= 580 AND (color = 'silver' OR brand IS NULL)")
    explanation = idx.explain(1, {"price": 550, "brand": "x"})
    assert str(explanation).splitlines() == [
        "NULL   AND",
        "TRUE     price <= 580",
        "NULL     OR",
        "NULL       color = 'silver'        -- color is absent",
        "FALSE      brand IS NULL",
    ]
    data = explanation.to_dict()
    assert data["value"] == "NULL" and data["kind"] == "AND" and not explanation.matches
    assert [c["value"] for c in data["children"]] == ["TRUE", "NULL"]
    assert data["children"][1]["children"][0]["absent"] == "color"
    assert json.loads(json.dumps(data)) == data
    assert idx.explain(1, {"price": 550, "color": "silver"}).matches


def test_validate_checks_without_adding():
    node = engine.validate("a = 1 AND b IN (1, 2)")
    assert to_text(node) == "a = 1 AND b IN (1, 2)"
    with pytest.raises(ParseError, match="line 1, column 5"):
        engine.validate("a = ")
    deep = "a = 0"
    for k in range(1, 300):                       # AND and OR alternating: 300 levels, past the limit of 200
        deep = f"a = {k} {'AND' if k % 2 else 'OR'} ({deep})"
    with pytest.raises(ExpressionTooLarge):
        engine.validate(deep)
    with pytest.raises(TypeError):
        engine.validate(42)
    assert engine.validate(node) is node


def test_schema_reads_as_attribute_families():
    idx = Index(schema={"price": "numeric"})
    idx.add(1, "color = 'red' AND z IS NULL AND ok = TRUE")
    assert dict(idx.schema) == {"price": "numeric", "color": "string", "z": None, "ok": "boolean"}
    assert "color" in idx.schema and "nope" not in idx.schema and idx.schema["color"] == "string"
    assert bool(Index().schema)                                   # an empty schema is still an object, not falsy


def test_cli_explain(tmp_path, capsys):
    subs = tmp_path / "subs.txt"
    subs.write_text("1\tprice <= 580 AND color = 'silver'\n2\tprice > 600 OR color LIKE 'g%'\n")
    assert main(["explain", "--subs", str(subs), "--id", "1", "--event", '{"price": 550}']) == 0
    assert capsys.readouterr().out.splitlines() == [
        "subscription 1 does not match:", "NULL   AND", "TRUE     price <= 580",
        "NULL     color = 'silver'        -- color is absent"]
    assert main(["explain", "--subs", str(subs), "--id", "2", "--event", '{"price": 700}', "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["matches"] is True and out["explanation"]["value"] == "TRUE"
    assert main(["explain", "--subs", str(subs), "--id", "5", "--event", "{}"]) == 2
    assert "--id 5: no such subscription" in capsys.readouterr().err
    assert main(["explain", "--subs", str(subs), "--id", "1", "--event", "[1]"]) == 2
    assert "--event must be a JSON object" in capsys.readouterr().err
    # a value of the wrong family: the reason, without the errors= modes match_batch takes (explain has none)
    assert main(["explain", "--subs", str(subs), "--id", "1", "--event", '{"price": "x"}']) == 2
    err = capsys.readouterr().err
    assert err == "bexmatch: error: --event: attribute 'price' is numeric, got 'x'\n"
    # a saved index is read as it was saved
    index = Index(algorithm="opindex", backend="cpu")
    index.add_many([1, 2], ["price <= 580 AND color = 'silver'", "price > 600 OR color LIKE 'g%'"])
    index.save(tmp_path / "subs.bexidx")
    assert main(["explain", "--subs", str(tmp_path / "subs.bexidx"), "--id", "2", "--event", '{"price": 700}']) == 0
    assert capsys.readouterr().out.startswith("subscription 2 matches:")


def test_numpy_and_decimal_values_are_explained_as_match_reads_them():
    """The reference evaluator compared NumPy values in NumPy's precision (a
    float32 0.1 equal to 0.1, which the index, reading its float64, does not
    match) and gave NumPy booleans, which ``matches`` did not take for TRUE;
    ``numpy.bool_`` and ``Decimal`` values, which ``match`` takes, raised a
    TypeError.  Every subscription's explanation now says what ``match``
    says, on each of these values."""
    from decimal import Decimal

    import numpy as np

    index = Index(algorithm="scan", backend="cpu", schema={"segs": "list<numeric>"})
    texts = ["x = 5", "x > 4 OR y = 1", "b = TRUE", "x = 0.1", "NOT (x = 0.1) AND b IS NOT NULL",
             "x IN (0.1, 5) XOR b = FALSE", "segs ONE OF (2, 3)", "segs ALL OF (0.5)"]
    index.add_many(range(len(texts)), texts)
    events = [{"x": np.int64(5)}, {"x": np.uint8(5), "b": np.bool_(False)}, {"x": np.float32(0.1)},
              {"x": np.float64(0.1), "b": np.bool_(True)}, {"x": Decimal("5")}, {"x": Decimal("0.1")},
              {"x": np.float16(5), "segs": np.array([2, 7], np.int32)}, {"segs": [Decimal("0.5"), np.int8(3)]},
              {"segs": (np.float32(0.5),)}]
    found = []
    for event in events:
        matched = set(index.match(event).tolist())
        assert {sub for sub in range(len(texts)) if index.explain(sub, event).matches} == matched, event
        found.append(matched)
    assert found[2] == set() and 3 in found[3] and all(found[:2]) and all(found[4:])


def test_a_masked_array_is_explained_as_match_reads_it():
    """``match`` drops a masked array's masked elements (as None); ``explain``
    iterated the array and met ``numpy.ma.masked``, a 0-d array: TypeError."""
    import numpy as np

    index = Index(algorithm="scan", backend="cpu", schema={"N": "list<numeric>"})
    index.add_many([1, 2, 3], ["N ONE OF (5)", "N IS EMPTY", "N ONE OF (6)"])
    event = {"N": np.ma.array([5, 6], mask=[True, False])}
    assert index.match(event).tolist() == [3]
    assert [index.explain(sub, event).matches for sub in (1, 2, 3)] == [False, False, True]


def test_an_explanation_prints_a_node_s_text_when_asked_for():
    """A connective's text holds its whole subtree's: printed for every node
    up front, explaining a valid expression 200 levels deep took 20 s (depth
    x size).  The texts are printed when asked for, each as to_text prints
    its node; the tree's lines print predicates only."""
    from engine.parse import to_text

    text = ""
    for depth in range(60):
        op = " OR " if depth % 2 else " AND "
        text = op.join(f"a{depth}_{k} = {k}" for k in range(20)) + (f"{op}({text})" if text else "")
    idx = Index(algorithm="scan", backend="cpu")
    idx.add(1, text)
    explanation = idx.explain(1, {"a59_3": 3})
    nodes, stack = [], [explanation]
    while stack:
        node = stack.pop()
        nodes.append(node)
        stack.extend(node.children)
    assert len(nodes) > 1200 and not any("text" in vars(n) for n in nodes)      # nothing printed yet
    assert str(explanation).count("\n") + 1 == len(nodes)
    assert not any("text" in vars(n) for n in nodes if n.kind != "predicate")   # the tree printed predicates only
    inner = explanation.children[-1]
    assert inner.text == to_text(inner.node) and idx.match({"a59_3": 3}).tolist() == [1] and explanation.matches
