"""Bitmap event encoding (A-PCM §IV): bit b of an event is set iff the
distinct predicate of bit b is TRUE on it -- checked against the reference
evaluator for every predicate of random workloads."""

from __future__ import annotations

import numpy as np
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
