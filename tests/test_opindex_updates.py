"""OpIndex updates without a full rebuild (docs/architecture.md#the-index-life-cycle, Zhang, Chan, Tan, PVLDB 2014, §4.3):
a merge derives the next matcher from the last one (``OpIndexMatcher.merged``,
the Index's merge protocol) -- removed subscriptions' counters and entries
dropped, survivors renumbered, added subscriptions' entries merged into the
sorted lists -- and a batch's result never depends on whether a
subscription sits in the delta, in the main lists since the last full
build, or in lists it was merged into.  Differential tests against the
reference evaluator and against freshly built indexes, over interleaved
inserts, removals, re-adds, merges and matches; the paths that keep old
runs sorted when codes or predicate ids move; the fallback to a full
rebuild; and that the incremental path is the one taken."""

from __future__ import annotations

import math
from contextlib import contextmanager
from unittest import mock

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from engine import Index
from engine import events as event_batches
from engine.algorithms.opindex import OpIndexMatcher
from engine.compile import PATTERN_CODES, Segment
from engine.parse import parse
from engine.reference import matches
from engine.workloads import standard
from gpu_kernels.opindex import cpu as K
from gpu_kernels.opindex.layout import L_VERIFY
from tests import strategies

SCHEMA = strategies.SCHEMA
HYPOTHESIS = dict(deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


# ----------------------------------------------------------------- helpers
@contextmanager
def incremental_only():
    """Every merge derives (no churn limit); yields the list of
    (old size, new size, merges of the result) of each ``merged`` call."""
    calls = []
    merged = OpIndexMatcher.merged

    def spy(self, segment, old_to_new, added, schema=None):
        out = merged(self, segment, old_to_new, added, schema)
        calls.append((len(self.segment), len(segment), out.merges))
        return out

    with mock.patch.object(OpIndexMatcher, "REBUILD_SHARE", math.inf), \
            mock.patch.object(OpIndexMatcher, "merged", spy):
        yield calls


def new_index(**options):
    return Index(algorithm="opindex", backend="cpu", schema=SCHEMA, options=options or None)


def listed(index, events):
    return [m.tolist() for m in index.match_batch(events)]


def expected(live: dict, events) -> list[list[int]]:
    return [[i for i in sorted(live) if matches(live[i], e)] for e in events]


def assert_lists_sorted(m: OpIndexMatcher) -> None:
    """Every list sorted by (attribute, operand) -- VERIFY by predicate id --
    and every entry pointing at a counter of its own partition."""
    for l in range(len(m.list_offsets) - 1):
        a, b = m.list_offsets[l], m.list_offsets[l + 1]
        if a == b:
            continue
        attr = np.repeat(m.run_attr, np.diff(m.run_start))[a:b]
        key = m.side_pid[a + m.list_side_base[l]:b + m.list_side_base[l]] if l % 8 == L_VERIFY else m.ent_val[a:b]
        order = np.lexsort((key, attr))
        assert np.array_equal(order, np.arange(b - a)), f"list {l} is not sorted"
        p = l // 8
        t = m.ent_target[a:b].astype(np.int64)
        assert (t < m.part_counter_start[p + 1] - m.part_counter_start[p]).all()
        assert (-t - 1 < m.part_slot_start[p + 1] - m.part_slot_start[p]).all()


def run_matcher(matcher, schema, events):
    seg = matcher.segment
    batch = event_batches.encode_events(events, schema)
    preds = seg.predicates
    pairs = np.unique(np.stack([preds.attr, preds.aux], axis=1)[np.isin(preds.op, PATTERN_CODES)], axis=0)
    truth = event_batches.pattern_truth(batch, schema, pairs)
    batch.list_truth = event_batches.list_truth(batch, preds.list_index(schema))
    e, pos = matcher.match(batch, truth, np.ones(len(seg), np.uint8))
    ids = seg.sub_ids[pos]
    return [ids[e == j].tolist() for j in range(batch.n_events)]


# ------------------------------------------------------- differential tests
@pytest.mark.parametrize("options", [{}, {"operand_ranks": False, "segments": 1, "signature_bits": 2},
                                     {"variant": "bs"}])
@settings(max_examples=20, **HYPOTHESIS)
@given(first=st.lists(strategies.expressions(max_leaves=8).filter(strategies.fits_normal_form), min_size=1, max_size=12),
       events=st.lists(strategies.events(), min_size=1, max_size=10),
       data=st.data())
def test_interleaved_updates_agree_with_reference_and_a_fresh_build(options, first, events, data):
    """Adds (DNF/CNF, IS NULL, LIKE, IN, BETWEEN, strings that grow the
    dictionary), removals, re-adds of the same id, merges and matches in any
    order: every batch equals the reference evaluator, and the final index
    equals a freshly built one."""
    with incremental_only() as calls:
        index = new_index(**options)
        live = dict(enumerate(first))
        index.add_many(list(live), list(live.values()))
        index.merge()
        assert listed(index, events) == expected(live, events)     # (builds the first matcher)
        next_id = len(first)
        for _ in range(data.draw(st.integers(1, 6), label="steps")):
            action = data.draw(st.sampled_from(["add", "remove", "readd", "merge", "match"]), label="action")
            if action == "add":
                exprs = data.draw(st.lists(strategies.expressions(max_leaves=8).filter(strategies.fits_normal_form), min_size=1, max_size=6))
                ids = list(range(next_id, next_id + len(exprs)))
                next_id += len(exprs)
                index.add_many(ids, exprs)
                live.update(zip(ids, exprs))
            elif action == "remove" and live:
                for sub_id in data.draw(st.sets(st.sampled_from(sorted(live)), max_size=4)):
                    index.remove(sub_id)
                    del live[sub_id]
            elif action == "readd" and live:
                sub_id = data.draw(st.sampled_from(sorted(live)))
                index.remove(sub_id)
                live[sub_id] = data.draw(strategies.expressions(max_leaves=8).filter(strategies.fits_normal_form))
                index.add(sub_id, live[sub_id])
            elif action == "merge":
                index.merge()
            else:
                assert listed(index, events) == expected(live, events)
        index.merge()
        assert listed(index, events) == expected(live, events)
        assert [index.match(e).tolist() for e in events] == expected(live, events)
        fresh = new_index(**options)
        fresh.add_many(list(live), list(live.values()))
        assert fresh.match_batch(events, output="arrow").equals(index.match_batch(events, output="arrow"))
    if index._matcher is not None and index._matcher.merges:
        assert_lists_sorted(index._matcher)
    # every merge of two non-empty segments was derived, not rebuilt
    assert all(merges > 0 for old, new, merges in calls if old and new)


def test_columnar_chunks_and_removals_follow_scan():
    """W1 added chunk by chunk in the columnar form (each chunk merges at
    once), with removals: the derived matcher answers as scan does, and as
    a fresh build."""
    w = standard("W1", scale=0.002, n_events=120)
    ids = np.unique(w.subscriptions["sub_id"].to_numpy())
    chunks = np.array_split(ids, 4)
    with incremental_only() as calls:
        indexes = {a: Index(algorithm=a, backend="cpu") for a in ("scan", "opindex")}
        for k, chunk in enumerate(chunks):
            table = w.subscriptions.filter(pc.is_in(w.subscriptions["sub_id"], value_set=pa.array(chunk)))
            for index in indexes.values():
                index.add_many(table)
                for sub_id in chunk[:: 5 + k]:          # removals: tombstones until the next merge
                    index.remove(int(sub_id))
            want = indexes["scan"].match_batch(w.events, output="arrow")
            assert indexes["opindex"].match_batch(w.events, output="arrow").equals(want)
        indexes["opindex"].merge()
        assert indexes["opindex"].match_batch(w.events, output="arrow").equals(want)
    assert len(calls) >= 3 and all(merges > 0 for _, _, merges in calls)
    m = indexes["opindex"]._matcher
    assert m.merges >= 3
    assert_lists_sorted(m)
    fresh = Index(algorithm="opindex", backend="cpu")
    fresh.add_many(w.subscriptions.filter(pc.is_in(w.subscriptions["sub_id"],
                                                   value_set=pa.array(indexes["opindex"].ids()))))
    assert fresh.match_batch(w.events, output="arrow").equals(want)


# ------------------------------------------------------ the paths in between
FIRST = ["n0 = 1", "n0 > 2 AND s0 = 'b'", "s0 LIKE 'a%'", "n1 IN (1, 2)",
         "(n0 = 1 OR n1 = 1) AND (n2 = 1 OR s1 = 'a') AND (b0 = TRUE OR s0 = 'b')",     # CNF
         "n2 IS NULL"]


def test_the_incremental_path_is_taken(monkeypatch):
    """After the first build, merges never build: ``_build`` raises."""
    index = new_index()
    index.add_many(range(len(FIRST)), FIRST)
    index.merge()
    events = [{"n0": 1}, {"n0": 3, "s0": "b"}, {"s0": "abc", "n1": 2}, {"n2": 1, "n1": 1, "s1": "a", "b0": True}]
    index.match_batch(events)
    monkeypatch.setattr(OpIndexMatcher, "REBUILD_SHARE", math.inf)

    def no_build(self):
        raise AssertionError("a full build")

    monkeypatch.setattr(OpIndexMatcher, "_build", no_build)
    live = {i: parse(t) for i, t in enumerate(FIRST)}
    for sub_id, text in {6: "s0 LIKE 'ab%' AND n0 = 1", 7: "n1 BETWEEN 0 AND 5", 8: "s0 = 'a' OR n2 = 4"}.items():
        index.add(sub_id, text)
        live[sub_id] = parse(text)
    for sub_id in (1, 5):
        index.remove(sub_id)
        del live[sub_id]
    index.merge()
    assert listed(index, events) == expected(live, events)
    assert index._matcher.merges == 1
    index.remove(6)
    del live[6]
    index.add(1, "n0 = 3")          # a removed id again
    live[1] = parse("n0 = 3")
    index.merge()
    index.add(9, "s1 = 'zz'")       # two merges before the next match: one derivation
    live[9] = parse("s1 = 'zz'")
    index.merge()
    events.append({"s1": "zz", "n0": 3})
    assert listed(index, events) == expected(live, events)
    assert index._matcher.merges == 2
    assert index._matcher.form_counts["cnf"] == 1 and index._matcher.form_counts["always"] == 0


def test_rebuild_rule():
    """Churn since the last full build beyond REBUILD_SHARE of its
    subscriptions (or no schema to follow the dictionary with): a full
    build; below it: derived."""
    index = new_index()
    index.add_many(range(20), [f"n0 = {i}" for i in range(20)])
    index.merge()
    index.match({})
    index.add_many(range(20, 25), [f"n1 = {i}" for i in range(5)])
    index.merge()
    index.match({})
    assert index._matcher.merges == 1
    index.add_many(range(25, 31), [f"n1 = {i}" for i in range(6)])     # 11 > 0.5 * 20
    index.merge()
    assert index.match({"n1": 3}).tolist() == [23, 28]
    assert index._matcher.merges == 0 and index._matcher._built_subs == 31
    m = OpIndexMatcher(index._main)                                     # no schema
    out = m.merged(index._main.take(np.arange(30)), np.r_[np.arange(30), -1], np.zeros(0, np.int64))
    assert out.merges == 0


def test_strings_that_move_codes_and_tied_prefix_intervals():
    """New strings move the codes of old operands (string attributes only,
    in every list and rank table) and split PREFIX intervals that were tied
    before: the old runs are re-sorted where that broke their order."""
    base = {1: "s0 LIKE 'bb%'", 2: "s0 LIKE 'b%'", 3: "s0 = 'c' OR s0 > 'a'", 4: "s1 IN ('a', 'c') AND n0 = 2",
            5: "s0 BETWEEN 'a' AND 'c'", 6: "n0 = 1.5 AND s1 != 'c'", 7: "s0 LIKE 'c%' AND s1 < 'c'"}
    events = [{"s0": v, "s1": w, "n0": n} for v in ("", "a", "aa", "b", "ba", "bb", "bbc", "c", "ca", "d")
              for w, n in (("a", 2), ("b", 1.5), ("c", 2), ("bb", 1.5))]
    for ranks in (None, False):
        index = new_index(operand_ranks=ranks)
        index.add_many(list(base), list(base.values()))
        index.merge()
        live = {k: parse(v) for k, v in base.items()}
        assert listed(index, events) == expected(live, events)
        calls = []
        sort_runs = K.sort_runs

        def spy(*args):
            calls.append(1)
            return sort_runs(*args)

        with mock.patch.object(K, "sort_runs", spy), mock.patch.object(OpIndexMatcher, "REBUILD_SHARE", math.inf):
            more = {8: "s0 = 'b' AND s1 = 'b'", 9: "s1 IN ('bb', 'ab') OR s0 >= 'ba'", 10: "s0 LIKE 'ba%'"}
            index.remove(6)
            del live[6]
            index.add_many(list(more), list(more.values()))
            live.update((k, parse(v)) for k, v in more.items())
            index.merge()
            assert listed(index, events) == expected(live, events)
        assert index._matcher.merges == 1 and calls, "the tied PREFIX run was re-sorted"
        assert_lists_sorted(index._matcher)


def test_predicate_ids_renumbered_out_of_order():
    """The protocol does not assume the merged segment keeps the order of
    predicate ids: VERIFY entries (sorted by id) are re-sorted, and the
    result equals a matcher built on the renumbered segment."""
    index = new_index()
    texts = ["s0 NOT LIKE '%a' AND n0 = 1", "s0 MATCHES 'b$' AND n0 = 1", "s1 NOT IN ('a', 'b') AND n0 = 1",
             "n0 NOT BETWEEN 1 AND 2 AND n1 = 1", "NOT (n0 = 1 XOR s0 NOT LIKE 'a%')"]
    index.add_many(range(len(texts)), texts)
    index.merge()
    index.match({})
    seg, m = index._main, index._matcher
    n = len(seg.predicates)
    perm = np.arange(n)[::-1].copy()                          # new id of each old predicate
    args = seg.prog_arg.copy()
    leaves = seg.prog_kind == 0
    args[leaves] = perm[args[leaves]]
    renumbered = Segment(seg.sub_ids, seg.prog_offsets, seg.prog_kind, args,
                         seg.predicates.take(np.argsort(perm)), seg.max_depth)
    renumbered.predicates.recode(index.schema)
    with mock.patch.object(OpIndexMatcher, "REBUILD_SHARE", math.inf):
        derived = m.merged(renumbered, np.arange(len(seg)), np.zeros(0, np.int64))
    assert derived.merges == 1
    assert_lists_sorted(derived)
    events = [{"s0": v, "s1": w, "n0": k, "n1": 1} for v in ("a", "ab", "b", "ba") for w in ("a", "c")
              for k in (0, 1, 3)]
    want = run_matcher(OpIndexMatcher(renumbered, schema=index.schema), index.schema, events)
    assert run_matcher(derived, index.schema, events) == want
    assert want == expected({i: parse(t) for i, t in enumerate(texts)}, events)


def test_operand_ranks_overflow_to_float_operands():
    """New operands beyond 32767 distinct ones: the merged index stores
    float64 operands (old ranks decoded), as a full build would."""
    values = np.arange(32767)
    index = new_index()
    texts = [f"n0 IN ({', '.join(map(str, chunk))})" for chunk in np.array_split(values, 33)]
    index.add_many(range(len(texts)), texts)
    index.merge()
    index.match({})
    assert index._matcher.use_rank
    with mock.patch.object(OpIndexMatcher, "REBUILD_SHARE", math.inf):
        index.add_many([100, 101], ["n0 = 40000.5 OR n1 = 2", "n0 BETWEEN 7 AND 7.5"])
        index.remove(3)
        index.merge()
        events = [{"n0": v} for v in (0, 7, 40000.5, 32766, 40000, 5000)] + [{"n1": 2}]
        got = listed(index, events)
    assert index._matcher.merges == 1 and not index._matcher.use_rank
    live = {i: parse(t) for i, t in enumerate(texts) if i != 3}
    live.update({100: parse("n0 = 40000.5 OR n1 = 2"), 101: parse("n0 BETWEEN 7 AND 7.5")})
    assert got == expected(live, events)
    assert_lists_sorted(index._matcher)


def test_event_log_pivots_stay_frozen_between_rebuilds():
    """With an event log, added subscriptions are pivoted by the frequencies
    of the last full build (attributes it never saw: the added ones'), and
    answers are unchanged."""
    log = np.array([100, 1, 50, 50, 50, 50])          # n0 common, n1 rare
    index = Index(algorithm="opindex", backend="cpu", schema=SCHEMA, options={"event_log": log})
    index.add_many(range(3), ["n0 = 1 AND n1 = 1", "n0 = 2 AND n2 = 2", "n1 > 0"])
    index.merge()
    index.match({})
    with mock.patch.object(OpIndexMatcher, "REBUILD_SHARE", math.inf):
        index.add_many(range(3, 6), ["n0 = 1 AND n1 = 2", "n2 = 1 AND s0 = 'a'", "b0 = TRUE AND n0 = 1"])
        index.merge()
        events = [{"n0": 1, "n1": 1}, {"n0": 1, "n1": 2}, {"n2": 1, "s0": "a"}, {"b0": True, "n0": 1}]
        assert listed(index, events) == [[0, 2], [2, 3], [4], [5]]
    m = index._matcher
    attr = index.schema.attr_ids
    parts = {a: sorted(int(m.segment.sub_ids[p]) for p in ps) for a, ps in m.partitions().items()}
    assert m.merges == 1 and parts[attr["n1"]] == [0, 2, 3]


def test_merges_through_an_empty_index():
    """Every subscription removed, merged, then new ones added and merged
    before the next match: the position maps compose through the empty
    segment (and a merge with nothing to fold keeps the matcher)."""
    with incremental_only():
        index = new_index()
        index.add_many([1, 2], ["n0 = 1", "s0 = 'a'"])
        index.merge()
        assert listed(index, [{"n0": 1}]) == [[1]]
        built = index._matcher
        index.merge()
        assert index._matcher is built
        index.remove(1)
        index.remove(2)
        index.merge()
        index.add_many([2, 3], ["n0 = 1 AND s0 = 'b'", "n1 > 0"])
        index.merge()
        assert listed(index, [{"n0": 1, "s0": "b"}, {"n1": 1}, {"n0": 1}]) == [[2], [3], []]


def test_dictionary_growth_in_the_delta_re_encodes_without_a_build(monkeypatch):
    """New strings in delta subscriptions move the codes the main lists
    hold: the matcher re-encodes its operands and PREFIX intervals (the
    derivation with nothing added or removed), no full build."""
    base = {1: "s0 LIKE 'bb%'", 2: "s0 LIKE 'b%' AND s1 > 'a'", 3: "s0 IN ('a', 'c') OR s1 = 'c'",
            4: "s0 BETWEEN 'a' AND 'c' AND n0 = 1", 5: "(s0 = 'c' OR n0 = 2) AND (s1 = 'a' OR n1 = 2)"}
    index = new_index()
    index.add_many(list(base), list(base.values()))
    index.merge()
    live = {k: parse(v) for k, v in base.items()}
    events = [{"s0": v, "s1": w, "n0": n, "n1": 2} for v in ("a", "b", "ba", "bb", "bbc", "c", "d")
              for w in ("a", "b", "c") for n in (1, 2)]
    assert listed(index, events) == expected(live, events)
    matcher = index._matcher

    def no_build(self):
        raise AssertionError("a full build")

    monkeypatch.setattr(OpIndexMatcher, "_build", no_build)
    index.add(6, "s0 = 'b' OR s1 IN ('ab', 'bb')")      # stays in the delta; moves 'c' and splits the tie
    live[6] = parse("s0 = 'b' OR s1 IN ('ab', 'bb')")
    assert listed(index, events) == expected(live, events)
    # a new matcher, derived (no build); the old one, which a concurrent match
    # of the earlier snapshot may be using, still holds the old codes
    n_before = matcher._n_strings
    assert index._matcher is not matcher and index._matcher._n_strings == len(index.schema.strings) > n_before
    assert_lists_sorted(matcher)
