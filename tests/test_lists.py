"""List-valued attributes (docs/language.md#list-attributes): the
language, the families, every event container, the columnar form,
read-back, explain and Spark.  Matching by every algorithm on every
backend against the reference evaluator and DuckDB is the conformance
suite's (tests/conformance.py: random lists in every workload, and the
pinned ad-serving example `check_list_attributes`)."""

from __future__ import annotations

import itertools
import random

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest

from engine import Index, ParseError
from engine.columnar import expressions_as_columns
from engine.errors import BadEventError, SchemaError
from engine.events import EventBatch, encode_events, list_index, list_truth
from engine.expr import Op, Pred
from engine.parse import parse, to_text
from engine.reference import evaluate, matches
from engine.schema import Schema
from gpu_kernels.list_truth import list_bits_words
from tests.sql_oracle import duckdb_evaluate

SCHEMA = {"segs": "list<string>", "deals": "list<numeric>", "price": "numeric", "color": "string"}

TEXTS = ["segs ONE OF ('a', 'b')", "segs NONE OF ('a')", "segs ALL OF ('a', 'b')", "'c' IN segs",
         "'c' NOT IN segs", "segs IS EMPTY", "segs IS NOT EMPTY", "deals ONE OF (1, 2.5)", "3 IN deals",
         "NOT deals ALL OF (1, 2)", "deals IS EMPTY AND price > 1", "segs IS NULL OR color = 'red'"]


def _ids(index, events, **kwargs):
    return [m.tolist() for m in index.match_batch(events, **kwargs)]


def _want(texts, events):
    return [[i for i, t in enumerate(texts) if matches(parse(t), e)] for e in events]


# ------------------------------------------------------------------ the language
@pytest.mark.parametrize("text,pred", [
    ("segs ONE OF ('a', 'b')", Pred("segs", Op.ONE_OF, ("a", "b"))),
    ("segs none of (1)", Pred("segs", Op.NONE_OF, (1,))),
    ("segs All Of (1, 2.5)", Pred("segs", Op.ALL_OF, (1, 2.5))),
    ("'x' IN segs", Pred("segs", Op.CONTAINS, ("x",))),
    ("-3 NOT IN segs", Pred("segs", Op.NOT_CONTAINS, (-3,))),
    ("segs IS EMPTY", Pred("segs", Op.IS_EMPTY, ())),
    ("segs is not empty", Pred("segs", Op.IS_NOT_EMPTY, ())),
])
def test_list_predicates_parse_and_print_back(text, pred):
    assert parse(text) == pred
    assert parse(to_text(pred)) == pred


def test_negated_all_of_prints_as_not():
    node = Pred("segs", Op.NOT_ALL_OF, ("a",))
    assert to_text(node) == "NOT segs ALL OF ('a')"
    assert evaluate(parse(to_text(node)), {"segs": ["b"]}) is evaluate(node, {"segs": ["b"]}) is True


@pytest.mark.parametrize("word", ["one", "none", "all", "of", "empty"])
def test_the_new_keywords_are_reserved_and_quoted_names_still_work(word):
    with pytest.raises(ParseError):
        parse(f"{word} = 1")
    assert parse(f'"{word}" = 1') == Pred(word, Op.EQ, (1,))
    assert to_text(Pred(word, Op.EQ, (1,))) == f'"{word}" = 1'


@pytest.mark.parametrize("text", ["segs ONE OF ()", "segs ONE OF 'a'", "segs ALL ('a')", "IN segs",
                                  "'a' IN", "segs IS EMPTY NULL", "segs ONE OF ('a',)"])
def test_malformed_list_predicates_are_parse_errors(text):
    with pytest.raises(ParseError):
        parse(text)


# ------------------------------------------------------------------ families
@pytest.mark.parametrize("text,message", [
    ("segs = 'a'", "list attribute"),
    ("segs IN ('a')", "list attribute"),
    ("segs LIKE 'a%'", "list attribute"),
    ("price ONE OF (1)", "not a list"),
    ("1 IN price", "not a list"),
    ("price IS EMPTY", "not a list"),
    ("segs ONE OF (1)", "compares it with a numeric literal"),
    ("deals ALL OF ('a')", "compares it with a string literal"),
    ("fresh IS EMPTY", "declare it"),
    ("flags ONE OF (TRUE)", "numbers or strings"),
])
def test_a_scalar_operator_on_a_list_and_vice_versa_is_refused_and_changes_nothing(text, message):
    index = Index(algorithm="scan", schema=SCHEMA)
    index.add(1, "segs ONE OF ('a')")
    before = dict(index.schema)
    with pytest.raises((SchemaError, ParseError), match=message):
        index.add(2, text)
    assert dict(index.schema) == before and index.ids().tolist() == [1]
    assert _ids(index, [{"segs": ["a"]}]) == [[1]]


@pytest.mark.parametrize("n_filler", [0, 70])     # the row route, and the bulk texts' columnar shortcut
def test_is_empty_after_an_earlier_expression_of_the_same_add_many_typed_the_list(n_filler):
    # as two adds do: "test it with ONE OF ... first" holds within one call too
    filler = [f"price = {i}" for i in range(n_filler)]
    for first in ("segs ONE OF ('a')", "3 IN segs", "segs IS NULL AND segs NONE OF (1)"):
        index = Index(algorithm="scan")
        index.add_many(range(2 + n_filler), [first, "segs IS EMPTY", *filler])
        assert index.schema["segs"].startswith("list<")
        assert _ids(index, [{"segs": []}])[0][-1:] == [1]
    # an IS EMPTY before the typing expression of the same call: taken too, as the columnar form (which sees
    # the whole table) takes it -- one batch, one answer, whatever its order; as texts, ASTs and a table
    texts = ["segs IS EMPTY", "segs ONE OF ('a')", *filler]
    for expressions in (texts, [parse(text) for text in texts]):
        index = Index(algorithm="scan")
        index.add_many(range(2 + n_filler), expressions)
        assert index.schema["segs"] == "list<string>"
        assert _ids(index, [{"segs": []}, {"segs": ["a"]}]) == [[0], [1]]
    table = expressions_as_columns([0, 1], [parse(text) for text in texts[:2]])
    index = Index(algorithm="scan")
    index.add_many(table)
    assert _ids(index, [{"segs": []}, {"segs": ["a"]}]) == [[0], [1]]
    for untyped in (["segs IS EMPTY", *filler], ["segs IS EMPTY", "segs = 'a'", *filler]):   # nothing, or a scalar
        index = Index(algorithm="scan")
        with pytest.raises(SchemaError, match="declare it|not a list"):
            index.add_many(range(len(untyped)), untyped)
        assert len(index) == 0 and "segs" not in index.schema


def test_list_families_are_fixed_by_first_use_and_can_be_declared():
    index = Index(algorithm="scan")
    index.add(1, "segs ONE OF ('a') AND segs IS NOT EMPTY")     # the same expression types it first
    index.add(2, "3 IN deals")
    assert index.schema["segs"] == "list<string>" and index.schema["deals"] == "list<numeric>"
    with pytest.raises(SchemaError, match="already list<string>"):
        Index(schema={"segs": "list<string>"}).schema.declare("segs", "string")
    with pytest.raises(SchemaError, match="list<numeric>"):
        Index(schema={"segs": "list<bool>"})


# ------------------------------------------------------------------ events
EVENTS = [{"segs": ["a", "b", "a", None], "deals": [1, 1, None], "price": 2, "color": "red"},
          {"segs": [], "deals": [], "price": 0},
          {"segs": [None], "deals": (3, 2.5)},
          {"segs": {"c"}, "deals": np.array([2.0, 3.0])},
          {"color": "blue"},
          {"segs": ["zz-not-in-any-predicate", "b"], "deals": [9007199254740992]}]


@pytest.mark.parametrize("algorithm", ["scan", "opindex", "atree"])
def test_every_event_container_gives_the_same_answer(algorithm):
    index = Index(algorithm=algorithm, schema=SCHEMA)
    index.add_many(range(len(TEXTS)), TEXTS)
    plain = [{k: (sorted(v) if isinstance(v, set) else list(v) if isinstance(v, (tuple, np.ndarray)) else v)
              for k, v in e.items()} for e in EVENTS]
    want = _want(TEXTS, plain)
    assert sum(map(len, want)) >= 12
    assert _ids(index, EVENTS) == want
    assert [index.match(e).tolist() for e in EVENTS] == want
    cells = {a: [e.get(a) for e in plain] for a in SCHEMA}
    for list_type, strings in itertools.product((pa.list_, pa.large_list, pa.list_view, pa.large_list_view),
                                                (pa.string(), pa.string_view())):
        table = pa.table({"segs": pa.array(cells["segs"], list_type(strings)),
                          "deals": pa.array(cells["deals"], list_type(pa.float64())),
                          "price": pa.array(cells["price"], pa.float64()), "color": pa.array(cells["color"])})
        assert _ids(index, table) == want, (list_type, strings)
    ints = pa.table({"deals": pa.array([[1, 2], [3], None], pa.list_(pa.int64())),
                     "segs": pa.array([["a", "b"], [], None], pa.list_(pa.string()))})
    assert _ids(index, ints) == _want(TEXTS, [{"deals": [1, 2], "segs": ["a", "b"]}, {"deals": [3], "segs": []}, {}])
    frame = pd.DataFrame({a: pd.Series(cells[a], dtype=object) for a in SCHEMA})
    assert _ids(index, frame) == want
    # a map column whose values are lists: one attribute per key
    maps = pa.array([[("segs", e["segs"])] if e.get("segs") is not None else [] for e in plain],
                    pa.map_(pa.string(), pa.list_(pa.string())))
    assert _ids(index, pa.table({"m": maps})) == _want(TEXTS, [{"segs": e["segs"]} if "segs" in e else {}
                                                              for e in plain])


@pytest.mark.parametrize("algorithm", ["scan", "opindex"])
def test_list_views_in_any_order_read_as_their_lists(algorithm):
    """A list view's cells may sit anywhere in its values, overlap, and
    be empty at offset 0 -- where pyarrow's own cast to a list makes an
    invalid array that reads wrong without an error (seen with pyarrow
    26): the views must read as the lists they show."""
    index = Index(algorithm=algorithm, schema=SCHEMA)
    index.add_many(range(len(TEXTS)), TEXTS)
    offsets, sizes = [1, 0, 0, 2, 0, 3], [2, 1, 0, 1, 3, 0]
    null = pa.array([False, False, False, False, False, True])
    for view in (pa.ListViewArray, pa.LargeListViewArray):
        segs = view.from_arrays(offsets, sizes, pa.array(["b", "a", "c", "zz"]), mask=null)
        deals = view.from_arrays(offsets, sizes, pa.array([2.0, 1.0, 3.0, 9.0]), mask=null)
        lists = segs.to_pylist()
        assert lists == [["a", "c"], ["b"], [], ["c"], ["b", "a", "c"], None]
        want = _want(TEXTS, [{"segs": s, "deals": d} if s is not None else {}
                             for s, d in zip(lists, deals.to_pylist())])
        assert sum(map(len, want)) >= 3
        assert _ids(index, pa.table({"segs": segs, "deals": deals})) == want
        # the same views as a map's values (one key an event)
        maps = pa.MapArray.from_arrays(list(range(len(lists) + 1)), pa.array(["segs"] * len(lists)), segs)
        assert _ids(index, pa.table({"m": maps})) == _want(TEXTS, [{"segs": s} if s is not None else {}
                                                                   for s in lists])


def test_empty_lists_of_null_type_fit_any_list_attribute():
    index = Index(algorithm="scan", schema=SCHEMA)
    index.add_many([1, 2], ["segs IS EMPTY", "deals IS NOT EMPTY"])
    table = pa.table({"segs": pa.array([[], None]), "deals": pa.array([[], [None]])})
    assert table["segs"].type == pa.list_(pa.null())
    assert _ids(index, table) == [[1], []]


@pytest.mark.parametrize("event,reason", [
    ({"deals": [1, "x"]}, "list<numeric>"),
    ({"deals": [1, float("nan")]}, "list<numeric>"),
    ({"deals": [True]}, "list<numeric>"),
    ({"deals": [2 ** 60]}, "list<numeric>"),
    ({"deals": [np.timedelta64(5, "ns")]}, "list<numeric>"),      # NumPy makes durations integers
    ({"deals": np.array([5], "m8[ns]")}, "list<numeric>"),
    ({"deals": 1}, "takes a list"),
    ({"segs": "a"}, "takes a list"),
    ({"segs": ["a", 1]}, "list<string>"),
    ({"price": [1]}, "numeric"),
])
def test_a_bad_list_is_refused_clearly_or_treated_as_absent(event, reason):
    index = Index(algorithm="scan", schema=SCHEMA)
    index.add_many([1, 2], ["deals IS NULL", "segs IS NULL"])
    with pytest.raises(BadEventError, match=reason):
        index.match_batch([{}, event])
    (name,) = event
    absent = _ids(index, [{}])[0]
    assert _ids(index, [event], errors="null") == [absent]
    results, rejected = index.match_batch([{}, event, {}], errors="report")
    assert [r.event for r in rejected] == [1] and rejected[0].attribute == name
    assert [m.tolist() for m in results] == [absent, [], absent]


def test_bad_arrow_list_columns_are_refused_by_cell():
    index = Index(algorithm="scan", schema=SCHEMA)
    index.add(1, "deals IS NOT NULL")
    table = pa.table({"deals": pa.array([[1.0], [float("inf")], None])})
    with pytest.raises(BadEventError, match="event 1"):
        index.match_batch(table)
    assert _ids(index, table, errors="null") == [[1], [], []]
    wrong = pa.table({"deals": pa.array([["a"], ["b"]])})
    with pytest.raises(BadEventError, match="list<numeric>"):
        index.match_batch(wrong)
    # single values, or structs, where lists belong: refused by cell as a dict's are
    for column in (pa.array([None, 1.0]), pa.array([None, "a"]), pa.array([None, {"a": 1}])):
        with pytest.raises(BadEventError, match="event 1: attribute 'deals' is list<numeric>, got"):
            index.match_batch(pa.table({"deals": column}))
        assert _ids(index, pa.table({"deals": column}), errors="null") == [[], []]


# ------------------------------------------------------------------ the list truth
@pytest.mark.parametrize("seed, wanted_share, n_indexes", [(5, 1.0, 1), (6, 0.5, 1), (7, 0.7, 2), (8, 1.0, 3)])
def test_list_truth_equals_brute_force_on_random_lists(seed, wanted_share, n_indexes):
    """The inverted-index join of engine.events.list_truth against
    evaluating every (list, operand list) pair directly: with every key
    wanted or some (a key no predicate uses is never reported), over one
    list index or several (a snapshot's segments, sharing operand lists);
    each row's keys ascending (the kernels search them)."""
    rng = random.Random(seed)
    schema = Schema()
    schema.declare("l", "list<numeric>")
    schema.declare("m", "list<string>")
    words = [f"https://example.com/{i}" for i in range(30)]
    schema.add_strings(words)
    sets = {}
    for _ in range(60):
        attr = rng.choice("lm")
        values = tuple(sorted({rng.randrange(20) for _ in range(rng.randint(1, 5))}))
        keys = tuple(float(v) if attr == "l" else float(schema.string_id(words[v])) for v in values)
        sets[(attr, schema.set_id(tuple(sorted(keys))))] = values
    events = [{"l": [rng.randrange(25) if rng.random() < 0.9 else None for _ in range(rng.randint(0, 30))],
               "m": [words[rng.randrange(25)] for _ in range(rng.randint(0, 30))] + ["not a word"]}
              for _ in range(40)]
    batch = encode_events(events, schema)
    pairs = [(schema.attr_ids[a], s * 2 + k) for a, s in sets for k in (0, 1) if rng.random() < wanted_share]
    parts = [[pair for pair in pairs if rng.randrange(n_indexes) == i or rng.random() < 0.3]
             for i in range(n_indexes)]
    wanted = {pair for part in parts for pair in part}      # (attribute id, key)
    truth = list_truth(batch, [list_index(schema, part) for part in parts] if n_indexes > 1
                       else list_index(schema, parts[0]))
    for row in range(len(batch.list_offsets) - 1):
        row_keys = truth[truth[row]:truth[row + 1]].tolist()
        assert row_keys == sorted(set(row_keys))
        true = set(row_keys)
        attr_id = int(batch.list_attr[row])
        assert {(attr_id, key) for key in true} <= wanted
        event = int(np.searchsorted(batch.offsets, np.flatnonzero(batch.token == row)[0], side="right") - 1)
        attr = schema.attr_names[attr_id]
        elements = {v for v in events[event][attr] if v is not None}
        for (a, s), values in sets.items():
            if a != attr:
                continue
            members = {v if a == "l" else words[v] for v in values}
            if (attr_id, 2 * s) in wanted:
                assert ((2 * s) in true) == bool(members & elements)
            if (attr_id, 2 * s + 1) in wanted:
                assert ((2 * s + 1) in true) == (members <= elements)


# ------------------------------------------------------------------ list codes (OpIndex, A-PCM)
def test_list_codes_hold_the_list_key_and_operator():
    """A list code (gpu_kernels.list_truth: beside OpIndex's VERIFY entries and A-PCM's bits) decodes to
    the key engine.events.list_truth reports the operator under and to the
    operator itself; any other operator has none."""
    from gpu_kernels import opcodes
    from gpu_kernels.list_truth import LIST_CODE_SHIFT, list_codes
    from gpu_kernels.predicates import list_key_py

    ops = np.arange(opcodes.N_OPS)
    aux = np.arange(opcodes.N_OPS) * 7919 + 3
    codes = list_codes(ops, aux).astype(np.int64)
    for op, a, code in zip(ops.tolist(), aux.tolist(), codes.tolist()):
        if opcodes.FIRST_LIST_OP <= op <= opcodes.LAST_LIST_OP:
            assert code > 0 and code & ((1 << LIST_CODE_SHIFT) - 1) == op
            assert code >> LIST_CODE_SHIFT == list_key_py(op, a)
            # IS [NOT] EMPTY: no operand list (aux -1), still a positive code
            assert list_codes(np.array([op]), np.array([-1]))[0] == op
        else:
            assert code == 0


def _many_lists_workload(seed, n_attrs=6, n_subs=300, n_events=60):
    """Subscriptions on ``n_attrs`` list attributes (string and numeric)
    and one scalar, and events carrying most of the lists: more lists an
    event than the OpIndex kernel keeps bitmaps for (LIST_BITS_ROWS)."""
    rng = random.Random(seed)
    attrs = [f"l{k}" for k in range(n_attrs)]
    schema = {a: ("list<string>" if k % 2 else "list<numeric>") for k, a in enumerate(attrs)}
    schema["x"] = "numeric"

    def literal(attr):
        v = rng.randrange(12)
        return f"'u{v}'" if schema[attr] == "list<string>" else str(v)

    texts = []
    for _ in range(n_subs):
        preds = []
        for _ in range(rng.randint(1, 3)):
            a = rng.choice(attrs)
            form = rng.randrange(8)
            values = ", ".join(literal(a) for _ in range(rng.randint(1, 3)))
            preds.append([f"{a} ONE OF ({values})", f"{a} NONE OF ({values})", f"{a} ALL OF ({values})",
                          f"{literal(a)} IN {a}", f"{literal(a)} NOT IN {a}", f"NOT {a} ALL OF ({values})",
                          f"{a} IS EMPTY", f"{a} IS NOT EMPTY"][form])
        if rng.random() < 0.5:
            preds.append(f"x {rng.choice(['<', '>=', '='])} {rng.randrange(5)}")
        texts.append(" AND ".join(preds) if rng.random() < 0.8 else " OR ".join(preds))
    events = []
    for _ in range(n_events):
        event = {"x": rng.randrange(5)}
        for a in attrs:
            if rng.random() < 0.85:
                event[a] = [(f"u{rng.randrange(12)}" if schema[a] == "list<string>" else rng.randrange(12))
                            for _ in range(rng.randint(0, 8))]
        events.append(event)
    return schema, texts, events


@pytest.mark.parametrize("seed", [1, 2])
def test_opindex_on_many_lists_an_event_and_after_merges(seed):
    """OpIndex decides a list operator's VERIFY entry from its list code and
    the event list's bitmap (a row beyond the kernel's bitmaps searched):
    its answers equal the reference evaluator's on events with more lists
    than bitmaps, after merges of added and removed subscriptions, and with
    the list codes zeroed (an index saved before them reads the predicate
    rows instead)."""
    from gpu_kernels.list_truth import LIST_BITS_ROWS
    from gpu_kernels.opindex import cpu
    from gpu_kernels.list_truth import list_codes
    from gpu_kernels.opindex.layout import L_VERIFY, Programs, check_arrays

    schema, texts, events = _many_lists_workload(seed)
    assert sum(len([a for a in e if a.startswith("l")]) > LIST_BITS_ROWS for e in events) > 10
    index = Index(algorithm="opindex", backend="cpu", schema=schema)
    index.add_many(range(len(texts)), texts, progress=False)
    index.merge()
    assert _ids(index, events) == _want(texts, events)
    for k in range(0, len(texts), 29):
        index.remove(k)
    extra = _many_lists_workload(seed + 100, n_subs=8)[1]
    index.add_many(range(1000, 1000 + len(extra)), extra, progress=False)
    index.merge()
    live = {k: t for k, t in enumerate(texts) if k % 29} | {1000 + k: t for k, t in enumerate(extra)}
    ids = sorted(live)
    want = [[ids[i] for i, t in enumerate(live[k] for k in ids) if matches(parse(t), e)] for e in events]
    assert _ids(index, events) == want
    matcher = index._matcher
    matcher = getattr(matcher, "native", matcher)
    assert matcher.merges > 0          # derived from the last index, not rebuilt
    a = matcher.arrays
    check_arrays(a, len(matcher.segment))
    verify = np.concatenate([np.arange(a.list_offsets[l], a.list_offsets[l + 1]) + a.list_side_base[l]
                             for l in range(len(a.list_offsets) - 1) if l % 8 == L_VERIFY])
    codes = list_codes(a.x_op[a.side_pid[verify]], a.x_aux[a.side_pid[verify]])
    assert (codes > 0).sum() > 50 and np.array_equal(a.side_hi[verify], codes)
    # the same kernel, the list codes zeroed: the same answers
    batch = encode_events(events, index.schema)
    seg = matcher.segment
    truth = list_truth(batch, seg.predicates.list_index(index.schema))
    uncoded = a.side_hi.copy()
    uncoded[verify] = 0.0
    results = []
    for arrays in (a, a._replace(side_hi=uncoded)):
        cap = len(seg) * batch.n_events
        out = np.empty(cap, np.int32)
        ev_count = np.zeros(batch.n_events, np.int64)
        stop, need = np.empty(1, np.int64), np.empty(1, np.int64)
        alive = np.ones(len(seg), np.uint8)
        cpu.opindex_match_serial(np.zeros(1, np.int64), np.array([batch.n_events]), out, cap, ev_count, stop, need,
                                 len(seg), batch.offsets, batch.attr, batch.value, batch.token,
                                 np.zeros((1, 1), np.uint8), truth, list_bits_words(truth), arrays, Programs.of(seg),
                                 np.zeros(0, np.uint8), alive)
        assert stop[0] == batch.n_events
        results.append(out[:ev_count.sum()].tolist())
    assert results[0] == results[1] and len(results[0]) > 50


def test_a_list_entry_carries_its_distinct_elements_as_its_value():
    schema = Schema()
    schema.declare("m", "list<string>")
    batch = encode_events([{"m": ["a", "a", None, "b", "never mentioned"]}, {"m": []}], schema)
    assert isinstance(batch, EventBatch)
    assert batch.value.tolist() == [3.0, 0.0] and batch.token.tolist() == [0, 1]
    assert batch.list_offsets.tolist() == [0, 0, 0]      # no string a predicate mentions: no key


# ------------------------------------------------------------------ the columnar form, read-back, explain
def test_the_columnar_form_equals_the_text_route():
    rows = {"sub_id": [1, 2, 3, 4, 4, 5, 6], "attr": ["segs", "segs", "deals", "segs", "deals", "segs", "deals"],
            "op": ["one of", "none of", "all of", "contains", "not contains", "is not empty", "is empty"],
            "str_values": [["a", "b"], ["a"], None, None, None, None, None],
            "values": [None, None, [1.0, 2.5], None, None, None, None],
            "str_value": [None, None, None, "c", None, None, None],
            "value": [None, None, None, None, 3.0, None, None]}
    texts = ["segs ONE OF ('a', 'b')", "segs NONE OF ('a')", "deals ALL OF (1, 2.5)",
             "'c' IN segs AND 3 NOT IN deals", "segs IS NOT EMPTY", "deals IS EMPTY"]
    by_table = Index(algorithm="opindex", schema=SCHEMA)
    by_table.add_many(pa.table(rows))
    by_text = Index(algorithm="opindex", schema=SCHEMA)
    by_text.add_many([1, 2, 3, 4, 5, 6], texts)
    for index in (by_table, by_text):
        assert [index.expression(i) for i in range(1, 7)] == [to_text(parse(t)) for t in texts]
        want = _want(texts, [{k: list(v) if isinstance(v, (tuple, set, np.ndarray)) else v for k, v in e.items()}
                             for e in EVENTS])
        assert _ids(index, EVENTS) == [[i + 1 for i in ids] for ids in want]
    with pytest.raises(SchemaError, match="booleans"):
        Index(schema=SCHEMA).add_many(pa.table({"sub_id": [1], "attr": ["segs"], "op": ["one of"],
                                                "bool_values": [[True]]}))
    with pytest.raises(SchemaError, match="list attribute"):
        Index().add_many(pa.table({"sub_id": [1], "attr": ["fresh"], "op": ["is empty"]}))


def test_explain_shows_list_predicates_and_the_absent_list():
    index = Index(algorithm="atree", schema=SCHEMA)
    index.add(1, "segs ONE OF ('a') AND NOT 3 IN deals")
    explained = index.explain(1, {"segs": ["a"], "deals": [3]})
    assert explained.value is False and "ONE OF" in str(explained) and "IN deals" in str(explained)
    explained = index.explain(1, {"segs": ["a"]})
    assert explained.value is None and "deals" in str(explained)


def test_the_oracles_agree_on_list_semantics():
    """DuckDB's list_has_any / list_has_all / list_contains (NULL elements
    ignored, repeats counted once, an empty list not NULL) against the
    reference evaluator."""
    exprs = [parse(t) for t in TEXTS]
    events = [{k: list(v) if isinstance(v, (tuple, set, np.ndarray)) else v for k, v in e.items()} for e in EVENTS]
    events = [{k: sorted(v, key=str) if isinstance(v, list) and k == "segs" and None not in v else v
               for k, v in e.items()} for e in events]
    schema = {"segs": "VARCHAR[]", "deals": "DOUBLE[]", "price": "DOUBLE", "color": "VARCHAR"}
    assert duckdb_evaluate(exprs, events, schema) == [[evaluate(e, ev) for ev in events] for e in exprs]


# ------------------------------------------------------------------ Spark
@pytest.mark.spark
def test_spark_array_columns_are_list_attributes(spark):
    from spark_integration import match_events

    rng = random.Random(3)
    index = Index(schema=SCHEMA)
    texts = [f"segs ONE OF ('s{rng.randrange(20)}', 's{rng.randrange(20)}')" if k % 3 else
             f"{rng.randrange(10)} IN deals AND segs IS NOT EMPTY" for k in range(60)]
    index.add_many(range(60), texts)
    events = [{"segs": [f"s{rng.randrange(30)}" for _ in range(rng.randrange(6))] if rng.random() < 0.8 else None,
               "deals": [rng.randrange(12) for _ in range(rng.randrange(4))] if rng.random() < 0.8 else None}
              for _ in range(200)]
    table = pa.table({"event_id": pa.array(range(200), pa.int64()),
                      "segs": pa.array([e["segs"] for e in events], pa.list_(pa.string())),
                      "deals": pa.array([e["deals"] for e in events], pa.list_(pa.int64()))})
    df = spark.createDataFrame(table).repartition(2)
    assert "array" in df.schema["segs"].dataType.simpleString()
    got = sorted((row["event_id"], row["sub_id"]) for row in match_events(df, index).collect())
    want = sorted((j, i) for j, e in enumerate(events) for i, t in enumerate(texts)
                  if matches(parse(t), {k: v for k, v in e.items() if v is not None}))
    assert got == want and len(want) > 50


def test_event_lists_in_slices_match_as_one_batch():
    """match_stream cuts a batch into event slices sharing its lists (their
    truth computed once for them all)."""
    index = Index(algorithm="opindex", schema=SCHEMA)
    index.add_many(range(len(TEXTS)), TEXTS)
    events = EVENTS * 30
    whole = _ids(index, events)
    pairs = [(e, s) for part in index.match_stream(events, max_pairs=5)
             for e, s in zip(part.column("event").to_pylist(), part.column("sub_id").to_pylist())]
    assert sum(map(len, whole)) > 100
    assert pairs == [(e, s) for e, ids in enumerate(whole) for s in ids]


def test_a_missing_list_in_a_dataframe_is_absent_whatever_pandas_marks_it_with():
    """pandas' missing markers mean absent in every column, but a list column
    took only None and NaN: ``pd.NA`` (and a null of a pyarrow list column,
    which pandas hands over as ``pd.NA``) was refused as a wrong value."""
    index = Index(algorithm="scan", backend="cpu", schema={"L": "list<string>", "x": "numeric"})
    index.add_many([1, 2], ["L IS NULL", "L ONE OF ('a')"])
    frames = [pd.DataFrame({"L": pd.Series([["a"], pd.NA, None, float("nan")], dtype=object)}),
              pd.DataFrame({"L": pd.Series([["a"], None, None, None], dtype=pd.ArrowDtype(pa.list_(pa.string())))})]
    for frame in frames:
        assert [ids.tolist() for ids in index.match_batch(frame)] == [[2], [1], [1], [1]]


def test_a_dictionary_of_lists_reads_as_its_lists():
    """A dictionary-encoded list column (each cell an entry's list) was
    refused cell by cell: "got ['a']: a list of string values ... is
    expected".  Plain, chunked, with null cells and null elements."""
    index = Index(algorithm="scan", backend="cpu", schema={"L": "list<string>"})
    index.add_many([1, 2], ["L IS NULL", "L ONE OF ('a')"])
    first = pa.DictionaryArray.from_arrays(pa.array([0, 0]), pa.array([["a"]], pa.list_(pa.string())))
    second = pa.DictionaryArray.from_arrays(pa.array([1, None, 0]),
                                            pa.array([["b"], ["a", None]], pa.large_list(pa.string())).cast(
                                                pa.list_(pa.string())))
    want = [[2], [2], [2], [1], []]
    assert [ids.tolist() for ids in index.match_batch(pa.table({"L": pa.chunked_array([first, second])}))] == want
    assert [ids.tolist() for ids in index.match_batch(pa.table({"L": second}))] == want[2:]


def test_missing_elements_are_dropped_and_explained_as_match_reads_them():
    """pandas' NA and NaT elements refused a list (``None`` was dropped), and
    ``explain`` raised a TypeError on a string list holding a NaN (pandas'
    missing string), which ``match`` drops.  A NaN in a list of numbers is
    still a bad number."""
    index = Index(algorithm="scan", backend="cpu", schema={"L": "list<string>", "N": "list<numeric>"})
    index.add_many([1, 2, 3, 4], ["L IS EMPTY", "L ONE OF ('a')", "N IS EMPTY", "N ALL OF (1)"])
    for event, want in (({"L": [float("nan")]}, [1]), ({"L": [pd.NA, "a"]}, [2]), ({"N": [pd.NA, 1]}, [4]),
                        ({"N": [pd.NaT]}, [3]), ({"N": np.array([None, 1], dtype=object)}, [4])):
        assert index.match(event).tolist() == want, event
        assert [sub for sub in (1, 2, 3, 4) if index.explain(sub, event).matches] == want, event
    frame = pd.DataFrame({"L": pd.Series([[pd.NA, "a"], [float("nan")]], dtype=object)})
    assert [ids.tolist() for ids in index.match_batch(frame)] == [[2], [1]]
    with pytest.raises(BadEventError, match="attribute 'N' is list<numeric>"):
        index.match({"N": [1, float("nan")]})


@pytest.mark.parametrize("text, words", [
    ("1 IN price", "'price' is numeric, not a list: 'value IN price' applies to list attributes only"),
    ("1 NOT IN price", "'value NOT IN price' applies"),
    ("TRUE IN y", "'value IN y' has boolean literals True"),
    ("FALSE NOT IN y", "'value NOT IN y' has boolean literals False"),
    ("y ONE OF (TRUE)", "'y' ONE OF has boolean literals"),
])
def test_errors_name_the_operator_as_the_text_spells_it(text, words):
    """``value IN attr`` is CONTAINS in the AST; an error names it as written."""
    index = Index(algorithm="scan", schema={"price": "numeric"})
    with pytest.raises(SchemaError) as caught:
        index.add(1, text)
    assert words in str(caught.value) and "CONTAINS" not in str(caught.value)
