"""Bitmap event encoding (A-PCM §IV): bit b of an event is set iff the
distinct predicate of bit b is TRUE on it -- checked against the reference
evaluator for every predicate of random workloads."""

from __future__ import annotations

import bisect
import uuid

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from engine import Index
from engine.compile import predicate_ast
from engine.events import encode_events, pattern_truth
from engine.reference import evaluate
from gpu_kernels.encoding import BitmapLayout, bits_of, encode_bitmaps
from tests import strategies
from tests.test_scan_differential import SCHEMA


def encode(index, events):
    index.merge()
    segment, schema = index._main, index.schema
    table = segment.predicates
    table.recode(schema)
    layout = BitmapLayout.of(table.attr, table.op, len(schema.attr_names))
    batch = encode_events(events, schema)
    truth = pattern_truth(batch, schema, table.pattern_pairs())
    return table, layout, encode_bitmaps(batch, table, layout, truth)


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(exprs=st.lists(strategies.expressions(with_not_matches=True), min_size=1, max_size=30),
       events=st.lists(strategies.events(), min_size=1, max_size=10))
def test_every_bit_is_the_truth_of_its_predicate(exprs, events):
    index = Index(algorithm="scan", backend="cpu", schema=SCHEMA)
    index.add_many(range(len(exprs)), exprs)
    table, layout, bitmaps = encode(index, events)
    bits = bits_of(bitmaps, layout)
    for p in range(len(table)):
        pred = predicate_ast(table, p, index.schema)
        assert [evaluate(pred, e) is True for e in events] == bits[:, p].tolist(), pred


def test_layout_keeps_each_attributes_predicates_contiguous():
    index = Index(algorithm="scan", backend="cpu")
    index.add_many(range(6), ["b = 1", "a = 2", "b > 4", "c IS NULL", "a IN (1, 3)", "b BETWEEN 2 AND 9"])
    table, layout, bitmaps = encode(index, [{"a": 3, "b": 5}, {}, {"c": 1}])
    attr_of_bit = table.attr[layout.bit_predicate]
    assert (np.diff(attr_of_bit) >= 0).all()
    for a in range(len(layout.attr_bit_offsets) - 1):
        assert (attr_of_bit[layout.attr_bit_offsets[a]:layout.attr_bit_offsets[a + 1]] == a).all()
    bits = bits_of(bitmaps, layout)
    names = [str(predicate_ast(table, p, index.schema).op.value) + predicate_ast(table, p, index.schema).attr
             for p in range(len(table))]
    truth = {n: bits[:, p].tolist() for p, n in enumerate(names)}
    assert truth["IS NULLc"] == [True, True, False]   # absent attribute: only IS NULL is TRUE
    assert truth[">b"] == [True, False, False]
    assert truth["INa"] == [True, False, False]


def test_more_than_one_word_of_predicates():
    index = Index(algorithm="scan", backend="cpu")
    index.add_many(range(150), [f"x = {i}" for i in range(150)])
    table, layout, bitmaps = encode(index, [{"x": v} for v in (0, 63, 64, 149, 150)])
    assert layout.n_words == 3
    bits = bits_of(bitmaps, layout)
    for row, v in enumerate((0, 63, 64, 149, 150)):
        set_preds = np.flatnonzero(bits[row])
        assert [predicate_ast(table, p, index.schema).values[0] for p in set_preds] == ([v] if v < 150 else [])


# Strings NumPy's StringDType mishandled (numpy issue 31533: 16 bytes or more,
# embedded NUL), with neighbours in code-point order, and UUIDs (36 bytes)
HARD_STRINGS = ["https://example.com/a", "https://example.com/b", "https://example.com/", "a\x00b", "a\x00c",
                "a\x00", "a", "\x00", "", "é", "e\u0301", "x" * 15, "x" * 16, "x" * 16 + "\x00", "😀", "\U0010ffff"] \
    + [str(uuid.UUID(int=(7919 * k) << 64 | k)) for k in range(100)]


@pytest.mark.parametrize("form", ["dicts", "arrow", "pandas"])
def test_event_string_codes_follow_python_string_order(form):
    """An event string's code is 2r + 1 for the predicate string of rank r
    (code-point order) and 2k between them, k = predicate strings below --
    so codes order exactly as Python orders the strings, and equal codes
    mean equal strings wherever a predicate string is involved."""
    index = Index(algorithm="scan", backend="cpu", schema={"s": "string"})
    mentioned = HARD_STRINGS[::3]
    index.add_many(range(len(mentioned)), [f"s = '{s}'" for s in mentioned])
    values = HARD_STRINGS + HARD_STRINGS[::-1]
    events = {"dicts": [{"s": v} for v in values], "arrow": pa.table({"s": values}),
              "pandas": pd.DataFrame({"s": values})}[form]
    batch = encode_events(events, index.schema)
    ranked = sorted(set(mentioned))
    want = [2 * ranked.index(v) + 1 if v in ranked else 2 * bisect.bisect_left(ranked, v) for v in values]
    assert batch.value.tolist() == want


def test_schema_string_codes_follow_python_string_order():
    """The dictionary itself: every string id's code is 2 * (its rank in
    Python's str order) + 1, through a view taken before more strings came."""
    from engine.schema import Schema

    schema = Schema()
    schema.add_strings(HARD_STRINGS[1::2])
    view = schema.view()
    schema.add_strings(HARD_STRINGS[::2])
    for seen, strings in ((view, HARD_STRINGS[1::2]), (schema, HARD_STRINGS[1::2] + HARD_STRINGS[::2])):
        ranked = sorted(strings)
        codes = seen.codes_of_string_ids(np.arange(len(strings)))
        assert codes.tolist() == [2 * ranked.index(s) + 1 for s in strings]
        assert seen.encode_strings(pa.array(HARD_STRINGS, pa.large_string())).tolist() == \
            seen.encode_strings(list(HARD_STRINGS)).tolist() == \
            [2 * ranked.index(s) + 1 if s in ranked else 2 * bisect.bisect_left(ranked, s) for s in HARD_STRINGS]


def test_numpy_stringdtype_searchsorted_is_what_bexmatch_routes_around():
    """Pins the dependency edge the engine avoids (numpy issue 31533): NumPy's
    StringDType ``searchsorted`` misplaces long and NUL-holding strings in
    the NumPy installed here, so bexmatch orders strings with Python's own
    ``str`` comparison (engine.schema.StringDictionary).  When this fails,
    the installed NumPy got it right: the workaround may be reconsidered,
    and this test updated."""
    string_dtype = getattr(getattr(np, "dtypes", None), "StringDType", None)
    if string_dtype is None:
        pytest.skip("this NumPy has no StringDType (NumPy < 2): nothing to route around")
    dictionary = sorted(["https://example.com/a", "US", "a\x00b"])
    queries = ["https://example.com/b", "US", "a\x00c", "https://example.com/a"]
    exact = [bisect.bisect_left(dictionary, q) for q in queries]
    numpy_says = np.searchsorted(np.array(dictionary, dtype=string_dtype()),
                                 np.array(queries, dtype=string_dtype())).tolist()
    assert numpy_says != exact, f"NumPy {np.__version__} now places these strings exactly"
