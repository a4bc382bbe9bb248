"""PS-Tree (Ji, Jacobsen, PVLDB 2018): the structures the paper defines, not only their answers.

The shared conformance suite checks ``pstbloom`` and ``psthash``'s answers
on every life cycle; this file checks what the answers cannot show: the
paper's worked examples (Fig. 1, §4.4, Fig. 3, Fig. 4), predicate spaces
that are disjoint, cover the domain and decide every predicate that cuts
them, values on boundaries, the access-predicate ranking (§3.3), Bloom
signatures that never drop a true match yet drop candidates, PSTHash's
C(|E|, N) keys, units with no indexable predicate, random workloads
against ``scan`` (numbers, and strings sharing long prefixes), and merges
that derive the structure -- spaces split and merged (§4.4) -- instead of
rebuilding it, checked against a fresh build and ``scan``.
"""

from __future__ import annotations

import copy

import numpy as np
import pytest

from engine import Index
from engine import events as event_batches
from engine.algorithms.options import PSTBloomOptions, PSTHashOptions
from engine.algorithms.pstree import PSTBloomMatcher, PSTHashMatcher, grouped_keys
from engine.algorithms.residual import ResidualMatcher
from engine.workloads import begen
from gpu_kernels import opcodes
from gpu_kernels.predicates import predicate_truth_many
from gpu_kernels.pstree import cpu as K
from tests.conformance import stops_after_the_first_group
from tests.strategies import realistic_strings, string_subscription


def built(algorithm: str, subs, options=None) -> Index:
    index = Index(algorithm=algorithm, options=options or {})
    if isinstance(subs, list):
        index.add_many(list(range(len(subs))), subs)
    else:
        index.add_many(subs)          # a workload's table of ids and expressions
    index.merge()
    return index


def matcher_of(index: Index):
    index.match({})
    m = index._matcher
    return m.native if isinstance(m, ResidualMatcher) else m


def answers(index: Index, events) -> list[list[int]]:
    return [m.tolist() for m in index.match_batch(events)]


def scan_answers(subs, events) -> list[list[int]]:
    return answers(built("scan", subs), events)


def located(matcher, index: Index, attr: str, values) -> list[int]:
    """The global space ids of ``values`` of ``attr`` (Algorithm 3)."""
    a = index.schema.attr_ids[attr]
    batch = event_batches.encode_events([{attr: v} for v in values], index.schema)
    assert (batch.attr == a).all()
    t = matcher.spaces
    return K.locate_spaces(batch.offsets, batch.attr, batch.value, t.val_off, t.vals, t.elem_space).tolist()


def spaces_of(matcher, index: Index, attr: str) -> range:
    a = index.schema.attr_ids[attr]
    return range(int(matcher.spaces.space_off[a]), int(matcher.spaces.space_off[a + 1]))


def no_patterns(batch) -> np.ndarray:
    return np.zeros((len(batch.strings) + 1, 1), np.uint8)


def unit_of(matcher, position: int) -> int:
    """The one unit of a plain conjunction at ``position``."""
    first = matcher.units.first
    assert first[position + 1] - first[position] == 1
    return int(first[position])


# ----------------------------------------------------------- worked examples
def test_figure_1_two_spaces_and_their_subscriptions():
    """Fig. 1: S1 price in [0, 4], S2 price in [2, 4] cut [0, 2) and [2, 4];
    <price, 3> lies in [2, 4], associated with S1 and S2."""
    index = built("pstbloom", ["price BETWEEN 0 AND 4", "price BETWEEN 2 AND 4"])
    m = matcher_of(index)
    spaces = spaces_of(m, index, "price")
    assert len(spaces) == 4                              # (-inf, 0), [0, 2), [2, 4], (4, inf)
    below, s02, s24, above = spaces
    assert located(m, index, "price", [-1, 0, 1.99, 2, 3, 4, 4.01]) == [below, s02, s02, s24, s24, s24, above]
    lists = m.unit_structure()
    assert lists.units[lists.list_off[s02]:lists.list_off[s02 + 1]].tolist() == [0]
    assert lists.units[lists.list_off[s24]:lists.list_off[s24 + 1]].tolist() == [0, 1]
    assert answers(index, [{"price": 3}, {"price": 1}, {"price": 5}]) == [[0, 1], [0], []]


def test_figure_2b_five_spaces_of_two_ranges():
    """Fig. 2(b): S1 attr in [-5, -1], S2 attr in [1, 5] divide the domain
    into [.., -5), [-5, -1], (-1, 1), [1, 5], (5, ..] with {}, {S1}, {},
    {S2}, {}; <attr, 2> lies in [1, 5]."""
    index = built("pstbloom", ["attr BETWEEN -5 AND -1", "attr BETWEEN 1 AND 5"])
    m = matcher_of(index)
    s = list(spaces_of(m, index, "attr"))
    assert len(s) == 5
    assert located(m, index, "attr", [-6, -5, -1, 0, 1, 2, 5, 6]) == [s[0], s[1], s[1], s[2], s[3], s[3], s[3], s[4]]
    b = m.unit_structure()
    assert [b.units[b.list_off[g]:b.list_off[g + 1]].tolist() for g in s] == [[], [0], [], [1], []]
    assert answers(index, [{"attr": 2}, {"attr": -1}, {"attr": 0}]) == [[1], [0], []]


def test_section_4_4_spaces_split_then_merge_on_delete():
    """§4.4: S1 age in [20, 60], S2 age in [30, 80] give [.., 20), [20, 30),
    [30, 60], (60, 80], (80, ..]; without S2, [20, 60] and (60, ..]."""
    index = built("psthash", ["age BETWEEN 20 AND 60", "age BETWEEN 30 AND 80"])
    m = matcher_of(index)
    s = list(spaces_of(m, index, "age"))
    assert len(s) == 5
    assert located(m, index, "age", [1, 19.5, 20, 29.9, 30, 45, 60, 60.5, 80, 80.5, 100]) == \
        [s[0], s[0], s[1], s[1], s[2], s[2], s[2], s[3], s[3], s[4], s[4]]
    assert m.spaces.vals.tolist() == [20, 30, 60, 80]
    index.remove(1)
    index.merge()
    m = matcher_of(index)
    s = list(spaces_of(m, index, "age"))
    assert len(s) == 3
    assert located(m, index, "age", [19.5, 20, 30, 60, 60.5, 80, 81]) == [s[0], s[1], s[1], s[1], s[2], s[2], s[2]]
    assert m.spaces.vals.tolist() == [20, 60]            # 30 and 80 are no boundary any more
    assert answers(index, [{"age": 25}, {"age": 70}]) == [[0], []]


def test_figure_3_pstbloom_lists_and_signatures():
    """Fig. 3: S1 takes {attr2 in [1, 5]} as access predicate, S2 and S3
    {attr1 in [-5, -1]}; S1 is in the signature of attr1's [.., -5), S2 in
    attr2's [.., 1), S3 in attr2's (5, ..]."""
    subs = ["attr1 < -5 AND attr2 BETWEEN 1 AND 5", "attr1 BETWEEN -5 AND -1 AND attr2 < 1",
            "attr1 BETWEEN -5 AND -1 AND attr2 > 5"]
    index = built("pstbloom", subs)
    m = matcher_of(index)
    rows = m.units.rows
    acc = m.access_predicates()
    attr = {i: name for name, i in index.schema.attr_ids.items()}
    assert [(attr[int(rows.attr[r])], int(rows.op[r])) for r in acc] == \
        [("attr2", opcodes.BETWEEN), ("attr1", opcodes.BETWEEN), ("attr1", opcodes.BETWEEN)]
    a1 = list(spaces_of(m, index, "attr1"))
    a2 = list(spaces_of(m, index, "attr2"))
    assert len(a1) == 3 and len(a2) == 3
    b = m.unit_structure()

    def listed(g):
        return b.units[b.list_off[g]:b.list_off[g + 1]].tolist()

    def signed(g, u):
        return bool(K.bloom_contains(b.sig, b.sig_off[g], b.sig_off[g + 1], u, m.bloom_hashes))

    assert [listed(g) for g in a1] == [[], [1, 2], []]
    assert [listed(g) for g in a2] == [[], [0], []]
    assert signed(a1[0], 0) and signed(a2[0], 1) and signed(a2[2], 2)
    # a signature holding nothing drops every unit: attr1's (-1, ..) and attr2's [1, 5]
    assert b.sig_off[a1[2] + 1] == b.sig_off[a1[2]] and b.sig_off[a2[1] + 1] == b.sig_off[a2[1]]
    events = [{"attr1": -6, "attr2": 3}, {"attr1": -3, "attr2": 0}, {"attr1": -3, "attr2": 3},
              {"attr1": -1, "attr2": 6}, {"attr2": 3}]
    assert answers(index, events) == [[0], [1], [], [2], []] == scan_answers(subs, events)


FIGURE_4 = ["attr1 = 1 AND attr2 = -1 AND attr3 < 0", "attr1 = 1 AND attr2 = -1 AND attr3 > 0",
            "attr1 = 1 AND attr2 < -1 AND attr3 = 0", "attr1 < 1 AND attr2 = -1 AND attr3 = 0"]


def test_figure_4_psthash_two_dim_spaces_and_candidates():
    """Fig. 4: S1, S2 under [1-2][2-2], S3 under [1-2][3-2], S4 under
    [2-2][3-2]; E = {<attr1, 1>, <attr2, -1>, <attr3, 2>} makes three 2-dim
    ids, finds S1 and S2 as candidates, and S2 matches."""
    index = built("psthash", FIGURE_4)
    m = matcher_of(index)
    ids = index.schema.attr_ids
    rows = m.units.rows
    chosen = [sorted(int(rows.attr[r]) for r in rs if r >= 0) for rs in m.access_predicates()]
    assert chosen == [sorted([ids["attr1"], ids["attr2"]])] * 2 + [sorted([ids["attr1"], ids["attr3"]]),
                                                                   sorted([ids["attr2"], ids["attr3"]])]
    # PS-Tree_H: spaces cut by the access predicates only: (-inf, v), [v], (v, inf) per attribute
    for name in ("attr1", "attr2", "attr3"):
        assert len(spaces_of(m, index, name)) == 3
    t = m.unit_structure()
    assert len(t.group_off) - 1 == 3 and t.arities.tolist() == [0, 0, 1]
    sp = {n: list(spaces_of(m, index, n)) for n in ("attr1", "attr2", "attr3")}
    keys = {tuple(t.group_key[g]): t.units[t.group_off[g]:t.group_off[g + 1]].tolist()
            for g in t.slot_group if g >= 0}
    assert keys == {(sp["attr1"][1], sp["attr2"][1]): [0, 1], (sp["attr1"][1], sp["attr3"][1]): [2],
                    (sp["attr2"][1], sp["attr3"][1]): [3]}
    event = {"attr1": 1, "attr2": -1, "attr3": 2}
    batch = event_batches.encode_events([event], index.schema)
    stats = m.candidate_statistics(batch, no_patterns(batch), np.ones(4, np.uint8))
    assert stats == {"keys_probed": 3, "candidates": 2, "matches": 1}
    assert answers(index, [event]) == [[1]]


def test_psthash_enumerates_every_combination_of_the_events_spaces():
    """C(|E|, N) keys per event for each arity in use: with N = 3, units
    keyed by 1, 2 and 3 spaces, an event of 5 located pairs probes
    5 + 10 + 10 keys; pairs on attributes without a PS-Tree make none."""
    subs = ["a = 1", "a = 1 AND b = 2", "a = 1 AND b = 2 AND c = 3", "c = 3 AND d = 4 AND e = 5"]
    index = built("psthash", subs, {"n_access": 3})
    m = matcher_of(index)
    assert m.structure.arities.tolist() == [0, 1, 1, 1]
    events = [{"a": 1, "b": 2, "c": 3, "d": 4, "e": 5, "zz": 1}, {"a": 1, "b": 9, "c": 3}]
    batch = event_batches.encode_events(events, index.schema)
    stats = m.candidate_statistics(batch, no_patterns(batch), np.ones(4, np.uint8))
    assert stats["keys_probed"] == (5 + 10 + 10) + (3 + 3 + 1)
    assert stats["candidates"] == 4 + 1 == stats["matches"]
    assert answers(index, events) == [[0, 1, 2, 3], [0]] == scan_answers(subs, events)


# --------------------------------------------------------- spaces themselves
def _workload(n_subs=1500, seed=0, op_class="high", **kw):
    return begen(n_subs, 120, dims=25, cardinality=30, op_class=op_class, match_prob=0.03, seed=seed, **kw)


@pytest.mark.parametrize("algorithm", ["pstbloom", "psthash"])
def test_spaces_are_disjoint_cover_the_domain_and_decide_their_predicates(algorithm):
    """For every attribute: located ids never decrease with the value and
    stay in the attribute's range (disjoint, covering); every value -- on
    each boundary, between and beyond -- lies in a space its cutting
    predicates cover exactly when they are TRUE on it."""
    w = _workload(op_class="high")
    index = built(algorithm, w.subscriptions)
    m = matcher_of(index)
    rows = m.units.rows
    t = m.spaces
    from engine.algorithms.pstree import predicate_spaces
    defining = m.defining
    if algorithm == "psthash":               # PS-Tree_H: cut by access predicates only
        acc = m.unit_structure().access
        assert defining[m._pids[acc[acc >= 0]]].all() and defining.sum() < m.indexable.sum()
    else:
        assert (defining == m.indexable).all()
    _, (cov_off, cov_first, cov_last), _ = predicate_spaces(rows, m.indexable, defining, m.n_attrs)
    checked = 0
    for a in range(m.n_attrs):
        own = np.flatnonzero(defining & (rows.attr == a))
        if not len(own):
            assert (t.elem_space[2 * t.val_off[a] + a:2 * t.val_off[a + 1] + a + 1] == -1).all()
            continue
        vals = t.vals[t.val_off[a]:t.val_off[a + 1]]
        assert (np.diff(vals) > 0).all()
        sets = np.concatenate([rows.set_values[rows.set_offsets[r]:rows.set_offsets[r + 1]] for r in own])
        bounds = np.unique(np.concatenate((rows.lo[own], rows.hi[own], sets, [-1e9, 1e9])))
        probe = np.unique(np.concatenate((bounds, bounds - 0.5, bounds + 0.5, bounds - 1e-9, bounds + 1e-9)))
        batch_attr = np.full(len(probe), a, np.int32)
        where = K.locate_spaces(np.arange(len(probe) + 1, dtype=np.int64), batch_attr, probe, t.val_off, t.vals,
                                t.elem_space)
        assert (np.diff(where) >= 0).all()
        assert (where >= t.space_off[a]).all() and (where < t.space_off[a + 1]).all()
        assert len(np.unique(where)) == t.space_off[a + 1] - t.space_off[a]          # every space reached
        # every (cutting predicate, probe) pair at once: covered <=> TRUE
        n_p = len(probe)
        pr = np.repeat(own, n_p)
        inside = np.zeros(len(pr), bool)
        wh = np.tile(where, len(own))
        for k, r in enumerate(own):
            part = slice(k * n_p, (k + 1) * n_p)
            for c in range(cov_off[r], cov_off[r + 1]):
                inside[part] |= (wh[part] >= cov_first[c]) & (wh[part] <= cov_last[c])
        out = np.empty(len(pr), np.int8)
        lens = np.diff(rows.set_offsets)[pr]
        case_off = np.concatenate(([0], np.cumsum(lens))).astype(np.int64)
        case_sets = rows.set_values[np.repeat(rows.set_offsets[:-1][pr] - case_off[:-1], lens)
                                    + np.arange(int(case_off[-1]))]
        predicate_truth_many(rows.op[pr], rows.lo[pr], rows.hi[pr], case_off, case_sets,
                             np.zeros(len(pr), np.bool_), np.ones(len(pr), np.bool_), np.tile(probe, len(own)), out)
        assert np.array_equal(inside, out == opcodes.TRUE), a
        checked += len(own)
    assert checked > 50


# -------------------------------------------------------- access predicates
def test_access_predicates_follow_the_operator_ranking_then_the_width():
    subs = ["a > 1 AND b = 2 AND c IN (1, 2)",                 # = before IN before ranges
            "a > 1 AND c IN (1, 2)",                           # IN before a range
            "a BETWEEN 1 AND 10 AND b > 4",                    # BETWEEN before a range
            "a != 1 AND c NOT IN (1, 2)",                      # NOT IN before !=
            "a != 1 AND b NOT BETWEEN 1 AND 3",                # NOT BETWEEN before !=
            "d BETWEEN 1 AND 10 AND e BETWEEN 1 AND 5",        # equal classes: the narrower share
            "d BETWEEN 1 AND 5 AND e BETWEEN 1 AND 10",
            "s LIKE 'x%' AND a != 7",                          # a pattern never is one
            "s LIKE 'x%' AND a IS NULL"]                       # nothing indexable: none
    want = [("b", opcodes.EQ), ("c", opcodes.IN), ("a", opcodes.BETWEEN), ("c", opcodes.NOT_IN),
            ("b", opcodes.NOT_BETWEEN), ("e", opcodes.BETWEEN), ("d", opcodes.BETWEEN), ("a", opcodes.NE), None]
    index = built("pstbloom", subs)
    m = matcher_of(index)
    name = {i: n for n, i in index.schema.attr_ids.items()}
    rows = m.units.rows
    got = [None if r < 0 else (name[int(rows.attr[r])], int(rows.op[r])) for r in m.access_predicates()]
    assert got == want
    assert m.unit_structure().always.tolist() == [unit_of(m, 8)]
    # PSTHash: the two best on distinct attributes, fewer where fewer are indexable
    h = matcher_of(built("psthash", subs))
    got2 = [[(name[int(rows.attr[r])], int(rows.op[r])) for r in rs if r >= 0] for rs in h.access_predicates()]
    assert got2[0] == [("b", opcodes.EQ), ("c", opcodes.IN)]
    assert got2[5] == [("e", opcodes.BETWEEN), ("d", opcodes.BETWEEN)]
    assert got2[7] == [("a", opcodes.NE)] and got2[8] == []


@pytest.mark.parametrize("n_access", [1, 2, 3])
def test_access_predicates_are_the_best_ranked_on_distinct_attributes(n_access):
    """On a random workload, each unit's access predicates are the
    ``n_access`` best ranked (§3.3) of its indexable predicates, at most one
    per attribute, best first: the same rank keys as a plain sort."""
    w = _workload(n_subs=600, op_class="high", seed=5)
    index = built("psthash", w.subscriptions, {"n_access": n_access, "max_combinations": 1 << 24})
    m = matcher_of(index)
    units, rows = m.units, m.units.rows
    acc = m.access_predicates()
    several = 0
    for u in range(len(units)):
        best = {}
        for r in units.pids[units.offsets[u]:units.offsets[u + 1]]:
            if m.indexable[r]:
                key = (m.row_events[r], m.row_class[r], m.row_width[r])
                a = int(rows.attr[r])
                best[a] = min(best.get(a, key), key)
        want = sorted(best.values())[:n_access]
        got = [(m.row_events[r], m.row_class[r], m.row_width[r]) for r in acc[u] if r >= 0]
        assert got == want, u
        assert len({int(rows.attr[r]) for r in acc[u] if r >= 0}) == len(got)
        several += len(got) > 1
    assert n_access == 1 or several > 100


def test_an_event_log_ranks_by_the_events_a_predicate_covers(monkeypatch):
    """§3.3: with historical events, the predicate fewer of them satisfy is
    the more selective, whatever its operator."""
    subs = ["a = 1 AND b BETWEEN 0 AND 100"]
    index = built("pstbloom", subs)
    rows_attr = {i: n for n, i in index.schema.attr_ids.items()}
    m = matcher_of(index)
    assert rows_attr[int(m.units.rows.attr[m.access_predicates()[0]])] == "a"
    log = event_batches.encode_events([{"a": 1, "b": 500}] * 9 + [{"a": 2, "b": 5}], index.schema)
    m2 = PSTBloomMatcher(index._main, event_log=log)
    assert rows_attr[int(m2.units.rows.attr[m2.access_predicates()[0]])] == "b"       # 1 logged event, not 9
    h = PSTHashMatcher(index._main, n_access=1, event_log=log)
    assert rows_attr[int(h.units.rows.attr[h.access_predicates()[0, 0]])] == "b"
    events = [{"a": 1, "b": 5}, {"a": 1, "b": 500}, {"a": 2, "b": 5}]
    batch = event_batches.encode_events(events, index.schema)
    for matcher in (m, m2, h):
        assert matcher.positions(batch, no_patterns(batch), np.ones(1, np.uint8))[0].tolist() == [0]
    # through the Index: the option reaches the matcher (and is not saved)
    via = Index(algorithm="pstbloom", options={"event_log": log})
    via.add_many([0], subs)
    via.merge()
    assert rows_attr[int(matcher_of(via).units.rows.attr[matcher_of(via).access_predicates()[0]])] == "b"
    assert answers(via, events) == [[0], [], []]
    # a merge ranks the added units by the log too (against the spaces they meet)
    monkeypatch.setattr(PSTBloomMatcher, "REBUILD_SHARE", np.inf)
    via.add_many([1], ["a = 1 AND b BETWEEN 0 AND 50"])
    via.merge()
    m3 = matcher_of(via)
    assert m3.merges == 1
    assert [rows_attr[int(m3.units.rows.attr[r])] for r in m3.access_predicates()] == ["b", "b"]
    assert answers(via, events) == [[0, 1], [], []]


# ----------------------------------------------------------- Bloom signatures
def test_signatures_hold_every_unit_their_predicates_cover_and_drop_candidates():
    """No false negative: for every unit and each of its indexable
    predicates but the access one, the signature of every space the
    predicate covers holds the unit.  And on a workload, the signatures
    drop candidates the lists gave, while the answers stay scan's."""
    w = _workload(op_class="med", seed=3)
    index = built("pstbloom", w.subscriptions, {"bloom_bits": 4, "bloom_hashes": 2})
    m = matcher_of(index)
    from engine.algorithms.pstree import predicate_spaces
    _, (cov_off, cov_first, cov_last), _ = predicate_spaces(m.units.rows, m.indexable, m.indexable, m.n_attrs)
    b = m.unit_structure()
    pairs = 0
    for u in range(len(m.units)):
        for j in range(m.units.offsets[u], m.units.offsets[u + 1]):
            r = m._pids[j]
            if j == b.access[u] or not m.indexable[r]:
                continue
            for c in range(cov_off[r], cov_off[r + 1]):
                for g in range(cov_first[c], cov_last[c] + 1):
                    assert K.bloom_contains(b.sig, b.sig_off[g], b.sig_off[g + 1], u, m.bloom_hashes)
                    pairs += 1
    assert pairs > 1000
    batch = event_batches.encode_events(w.events, index.schema)
    stats = m.candidate_statistics(batch, no_patterns(batch), np.ones(len(index._main), np.uint8))
    assert 0 < stats["matches"] <= stats["signature_candidates"] < stats["list_candidates"]
    assert answers(index, w.events) == scan_answers(w.subscriptions, w.events)


@pytest.mark.parametrize("n_bins", [1, 2, 5])
def test_signatures_are_exactly_their_units_bits_however_the_attributes_are_binned(n_bins):
    """build_pstbloom's space-by-space sweep against the definition: each
    space's list is the units whose access predicate covers it, ascending;
    its signature the smallest power of two of words holding ``bits`` bits a
    unit inserted, with exactly the bits of the units whose other
    indexable predicates cover it (ranges of one unit across several
    spaces, several ranges of one predicate: !=, NOT IN).  Zipf-skewed
    attributes, in 1, 2 and 5 bins of the cores."""
    w = begen(1200, 40, dims=20, cardinality=30, op_class="med", match_prob=0.03, seed=5, zipf=1.5)
    index = Index(algorithm="pstbloom", options={"bloom_bits": 6, "bloom_hashes": 3})
    index.add_many(w.subscriptions)
    index.add_many([10_000, 10_001], ["a0 != 3 AND a1 NOT IN (2, 9, 20)", "a1 != 4 AND a0 NOT IN (1, 2)"])
    index.merge()
    m = matcher_of(index)
    from engine.algorithms.pstree import predicate_spaces
    _, (cov_off, cov_first, cov_last), _ = predicate_spaces(m.units.rows, m.indexable, m.indexable, m.n_attrs)
    access = m._by_unit["access"]
    offsets = m.units.offsets
    unit_of = np.repeat(np.arange(len(m.units), dtype=np.int64), np.diff(offsets))
    n_spaces = int(m.spaces.space_off[-1])
    listed = [[] for _ in range(n_spaces)]
    inserted = [[] for _ in range(n_spaces)]
    for j, r in enumerate(m._pids):
        if not m.indexable[r]:
            continue
        u = int(unit_of[j])
        for c in range(cov_off[r], cov_off[r + 1]):
            for g in range(cov_first[c], cov_last[c] + 1):
                (listed if j == access[u] else inserted)[g].append(u)
    per_attr = np.bincount(np.searchsorted(m.spaces.space_off, np.arange(n_spaces), "right") - 1,
                           weights=[len(x) for x in inserted])
    assert per_attr.sum() > 2000 and per_attr.max() > 3 * per_attr.min() > 0      # skewed, every attribute used
    list_off, units, sig_off, sig = K.build_pstbloom(
        unit_of, m._pids, access[:, None], m.indexable.astype(np.uint8), cov_off, cov_first, cov_last,
        m.spaces.space_off, 6, 3, n_bins)
    for g in range(n_spaces):
        assert units[list_off[g]:list_off[g + 1]].tolist() == listed[g]
        words = 0 if not inserted[g] else 1 << max(0, int(np.ceil(np.log2(len(inserted[g]) * 6 / 64))))
        want = np.zeros(words, np.uint64)
        with np.errstate(over="ignore"):                    # (the hashes wrap modulo 2**64, as in the kernels)
            for u in inserted[g]:
                h1, h2 = K.bloom_key_py(u)
                for h in range(3):
                    bit = int((h1 + np.uint64(h) * h2) & np.uint64(words * 64 - 1))
                    want[bit >> 6] |= np.uint64(1) << np.uint64(bit & 63)
        assert np.array_equal(sig[sig_off[g]:sig_off[g + 1]], want), g


def test_balanced_bins_hold_each_item_once_and_the_heaviest_bin_within_one_item_of_the_mean():
    rng = np.random.default_rng(0)
    work = (1e6 / np.arange(1, 123) ** 1.2).astype(np.int64)[rng.permutation(122)]
    for n_bins in (1, 2, 3, 8):
        bin_off, items = K.balanced_bins(work, n_bins)
        assert sorted(items.tolist()) == list(range(len(work))) and len(bin_off) == n_bins + 1
        loads = [work[items[bin_off[b]:bin_off[b + 1]]].sum() for b in range(n_bins)]
        assert max(loads) <= work.sum() / n_bins + work.max()
    bin_off, items = K.balanced_bins(work, 2)
    assert max(work[items[bin_off[b]:bin_off[b + 1]]].sum() for b in range(2)) < 0.55 * work.sum()


# ------------------------------------------------------------- no access predicate
@pytest.mark.parametrize("algorithm", ["pstbloom", "psthash"])
def test_units_without_an_indexable_predicate_are_still_matched(algorithm):
    subs = ["s LIKE 'ab%'", "x IS NULL", "x IS NOT NULL AND s NOT LIKE 'b%'", "s MATCHES '^a.c$' OR x IS NULL",
            "a = 1 AND s LIKE 'a%'", "a = 1 AND b != 2 AND s LIKE 'a%'", "NOT (a = 1)", "a != 1 AND b != 1"]
    events = [{"s": "abc", "a": 1, "b": 3}, {"s": "bcd", "x": 1}, {"x": 2, "s": "zz", "a": 2, "b": 1}, {},
              {"a": 1, "b": 2, "s": "ac"}, {"s": "a\x00c"}]
    index = built(algorithm, subs)
    m = matcher_of(index)
    assert len(m.structure.always) >= 4
    got = answers(index, events)
    assert got == scan_answers(subs, events)
    assert sum(map(len, got)) >= 10


@pytest.mark.parametrize("algorithm", ["pstbloom", "psthash"])
def test_predicates_that_cover_no_space_are_never_true(algorithm):
    """An empty BETWEEN (lo > hi) covers no space -- alone on its attribute,
    that attribute has no PS-Tree at all: as access predicate the unit is
    never a candidate, as another predicate it drops the candidate."""
    subs = ["x BETWEEN 5 AND 1 AND y = 1", "y = 1 AND z BETWEEN 'b' AND 'a'", "y = 1", "x NOT BETWEEN 5 AND 1"]
    events = [{"x": 3, "y": 1, "z": "ab"}, {"x": 0, "y": 1}, {"y": 1, "z": "a"}, {"x": 9}]
    index = built(algorithm, subs)
    assert answers(index, events) == [[2, 3], [2, 3], [2], [3]] == scan_answers(subs, events)


# --------------------------------------------------------------- random workloads
@pytest.mark.parametrize("algorithm,options,op_class,seed", [
    ("pstbloom", {}, "high", 0), ("pstbloom", {"bloom_bits": 1, "bloom_hashes": 1}, "med", 1),
    ("psthash", {}, "high", 2), ("psthash", {"n_access": 1}, "med", 3),
    ("psthash", {"n_access": 3, "max_combinations": 8}, "high", 4)])
def test_random_workloads_answer_as_scan(algorithm, options, op_class, seed):
    w = _workload(op_class=op_class, seed=seed)
    index = built(algorithm, w.subscriptions, options)
    assert answers(index, w.events) == scan_answers(w.subscriptions, w.events)
    assert sum(map(len, answers(index, w.events))) > 0
    m = matcher_of(index)
    if algorithm == "psthash" and "max_combinations" in options:
        assert m.statistics()["arity_counts"][1] > 0          # the key bound dropped access predicates


@pytest.mark.parametrize("algorithm", ["pstbloom", "psthash"])
def test_strings_sharing_long_prefixes_and_a_growing_dictionary(algorithm):
    """Codes of strings with 200-character shared prefixes, events with
    strings new to the dictionary between them, then subscriptions adding
    strings (the codes move: the matcher is rebuilt on the new codes)."""
    p = "prefix-" * 30
    rng = np.random.default_rng(7)
    words = [p + f"{i:03d}" for i in range(40)]
    subs = []
    for i in range(300):
        w1, w2 = sorted(rng.choice(words, 2, replace=False))
        kind = i % 6
        subs.append([f"s = '{w1}' AND t < '{w2}'", f"s BETWEEN '{w1}' AND '{w2}'",
                     f"s IN ('{w1}', '{w2}') AND n > {i % 7}", f"s > '{w1}' AND t NOT IN ('{w2}')",
                     f"s != '{w1}' AND n = {i % 5}", f"t >= '{w2}' AND s LIKE '{p}01%'"][kind])
    events = [{"s": rng.choice(words) + rng.choice(["", "x", "\x00"]), "t": rng.choice(words),
               "n": int(rng.integers(8))} for _ in range(120)] + [{"s": p}, {"s": p[:-1]}, {"t": p + "zzz"}]
    index = built(algorithm, subs)
    ref = built("scan", subs)
    first = answers(index, events)
    assert first == answers(ref, events)
    assert sum(map(len, first)) > 100
    more = [f"s = '{p}0155'", f"s BETWEEN '{p}0150' AND '{p}017'", f"t < '{p}0005'"]
    for ix in (index, ref):
        ix.add_many([1000, 1001, 1002], more)
        ix.merge()
    events += [{"s": p + "0155", "t": p + "0001"}, {"s": p + "016", "t": p}]
    assert answers(index, events) == answers(ref, events)


# ------------------------------------------------------------------- options
def test_options_are_checked_when_the_index_is_made():
    for bad in ({"bloom_bits": 0}, {"bloom_hashes": 17}, {"bloom_bits": 2.5}, {"event_log": [1, 2]}):
        with pytest.raises(ValueError):
            PSTBloomOptions(**bad)
    for bad in ({"n_access": 0}, {"n_access": 5}, {"max_combinations": 0}, {"n_access": True}):
        with pytest.raises(ValueError):
            PSTHashOptions(**bad)
    with pytest.raises(TypeError):
        Index(algorithm="psthash", options={"bloom_bits": 8})
    with pytest.raises(ValueError):
        Index(algorithm="pstbloom", options={"bloom_hashes": 0})


# ------------------------------------------------- dynamic adjustment (§4.4)
_PREFIX = "shared-prefix-" * 12


def _random_predicate(rng, attr: str) -> str:
    """A predicate on ``attr`` whose operands sit on a small grid (so that
    added endpoints often equal existing ones or fall inside their spaces)."""
    if attr == "s":
        words = [f"'{_PREFIX}{i:02d}'" for i in range(12)]
        w1, w2 = sorted(rng.choice(words, 2, replace=False))
        return rng.choice([f"s = {w1}", f"s < {w1}", f"s >= {w2}", f"s BETWEEN {w1} AND {w2}",
                           f"s IN ({w1}, {w2})", f"s NOT IN ({w1})", f"s != {w2}", f"s LIKE '{_PREFIX}0%'"])
    v = [float(x) for x in rng.integers(0, 12, 3) / 2]
    lo, hi = min(v[0], v[1]), max(v[0], v[1])
    return rng.choice([f"{attr} = {v[0]}", f"{attr} != {v[0]}", f"{attr} < {v[0]}", f"{attr} <= {v[0]}",
                       f"{attr} > {v[0]}", f"{attr} >= {v[0]}", f"{attr} BETWEEN {lo} AND {hi}",
                       f"{attr} NOT BETWEEN {lo} AND {hi}", f"{attr} IN ({v[0]}, {v[1]}, {v[2]})",
                       f"{attr} NOT IN ({v[0]}, {v[2]})", f"{attr} IS NULL"])


def _random_subscription(rng) -> str:
    attrs = ["a", "b", "c", "d", "s"]
    conj = [" AND ".join(_random_predicate(rng, str(a)) for a in rng.choice(attrs, rng.integers(1, 4), replace=False))
            for _ in range(1 if rng.random() < 0.8 else 2)]
    return conj[0] if len(conj) == 1 else f"({conj[0]}) OR ({conj[1]})"


def _random_event(rng) -> dict:
    ev = {a: float(rng.integers(-1, 14)) / 2 for a in "abcde" if rng.random() < 0.8}
    if rng.random() < 0.7:
        ev["s"] = f"{_PREFIX}{int(rng.integers(0, 13)):02d}" + rng.choice(["", "x"])
    return ev


def check_structure(m) -> None:
    """The derived structure's invariants: its PS-Trees are the ones a build
    cuts from the same cutting predicates (spaces disjoint, sorted, covering;
    boundaries exactly the ends of the cutting predicates), and every unit
    is where its access predicates cover -- in PSTBloom's lists (exactly
    there) and signatures, in PSTHash's keys (exactly those)."""
    from engine.algorithms.pstree import predicate_spaces
    rows = m.units.rows
    t = m.spaces
    fresh, (cov_off, cov_first, cov_last), _ = predicate_spaces(rows, m.indexable, m.defining, m.n_attrs)
    for a, b in zip(t, fresh):
        assert np.array_equal(a, b)
    for a in range(m.n_attrs):
        assert (np.diff(t.vals[t.val_off[a]:t.val_off[a + 1]]) > 0).all()
        es = t.elem_space[2 * t.val_off[a] + a:2 * t.val_off[a + 1] + a + 1]
        if t.space_off[a] == t.space_off[a + 1]:
            assert (es == -1).all()
        else:
            assert es[0] == t.space_off[a] and es[-1] == t.space_off[a + 1] - 1 and set(np.diff(es)) <= {0, 1}

    def spaces_of_row(r):
        return {g for c in range(cov_off[r], cov_off[r + 1]) for g in range(cov_first[c], cov_last[c] + 1)}

    s = m.unit_structure()
    n_units = len(m.units)
    if isinstance(m, PSTBloomMatcher):
        where = [set() for _ in range(n_units)]
        for g in range(len(s.list_off) - 1):
            for u in s.units[s.list_off[g]:s.list_off[g + 1]]:
                assert g not in where[u]             # once per space
                where[u].add(g)
        for u in range(n_units):
            j = s.access[u]
            assert where[u] == (spaces_of_row(m._pids[j]) if j >= 0 else set())
            for k in range(m.units.offsets[u], m.units.offsets[u + 1]):
                if k != j and m.indexable[m._pids[k]]:
                    for g in spaces_of_row(m._pids[k]):
                        assert K.bloom_contains(s.sig, s.sig_off[g], s.sig_off[g + 1], s.key[u], m.bloom_hashes)
        assert len(np.unique(s.key)) == n_units
        check_probe_order(m)
    else:
        occupied = np.flatnonzero(s.slot_group >= 0)
        n_groups = len(s.group_off) - 1
        assert len(occupied) == n_groups == len(s.group_key) and s.slot_group.dtype == np.int32
        assert s.group_key.dtype == s.group_off.dtype == np.int32           # narrowed, built or derived
        assert sorted(s.slot_group[occupied]) == list(range(n_groups))     # each group in one slot
        assert len(np.unique(s.group_key, axis=0)) == n_groups             # and each key in one group
        got = {(tuple(s.group_key[g]), int(u)) for g in range(n_groups)
               for u in s.units[s.group_off[g]:s.group_off[g + 1]]}
        assert len(got) == len(s.units)                 # no unit twice under one key
        keys, owner, _ = K.space_combinations(m.units.offsets, m._pids, s.access, m.arity,
                                              rows.attr.astype(np.int64), cov_off, cov_first, cov_last, m.n_access,
                                              0, 0)
        assert got == {(tuple(k), int(u)) for k, u in zip(keys, owner)}
        for i in occupied:                              # each key is found where a probe looks
            h = int(K.key_hash(s.group_key, s.slot_group[i], m.n_access) & np.uint64(len(s.slot_group) - 1))
            while h != i:
                assert s.slot_group[h] >= 0
                h = (h + 1) % len(s.slot_group)
        check_probe_order(m)


def check_probe_order(m) -> None:
    """PSTBloom's lists and PSTHash's table, as their kernels read them,
    are the same structure with the units renumbered in the order the
    (space or group) lists first name them: each renumbered unit has the
    subscription, predicates, access predicate(s) and Bloom key of the unit
    it stands for."""
    s, by_unit, order = m.structure, m.unit_structure(), m.probe_order
    n_units = len(m.units)
    assert sorted(order.tolist()) == list(range(n_units))
    named = list(dict.fromkeys(s.units.tolist()))        # first names, in order: 0, 1, 2, ...
    assert named == list(range(len(named)))
    unnamed = order[len(named):].tolist()                # then the units no list names, in their own order
    assert unnamed == sorted(set(range(n_units)) - set(by_unit.units.tolist()))
    # the always list: the units without an access predicate, in either numbering
    no_access = np.flatnonzero((by_unit.access < 0).all(axis=-1) if by_unit.access.ndim == 2 else by_unit.access < 0)
    assert by_unit.always.tolist() == no_access.tolist() == sorted(order[s.always].tolist())
    sub, offsets, pids = m._probe_units
    assert all(a is b for a, b in zip(m._unit_args(), (sub, offsets, pids, m.units.rows)))   # what kernels read
    units = m.units
    for v, u in enumerate(order):
        assert sub[v] == units.sub[u]
        assert np.array_equal(pids[offsets[v]:offsets[v + 1]], m._pids[units.offsets[u]:units.offsets[u + 1]])
        for j, k in zip(np.atleast_1d(s.access[v]), np.atleast_1d(by_unit.access[u])):
            assert (j < 0 and k < 0) or (j >= 0 and pids[j] == m._pids[k] and j - offsets[v] == k - units.offsets[u])
        if isinstance(m, PSTBloomMatcher):
            assert s.key[v] == by_unit.key[u]


@pytest.mark.parametrize("algorithm,options,seed", [
    ("pstbloom", {}, 0), ("pstbloom", {"bloom_bits": 2, "bloom_hashes": 1}, 1),
    ("psthash", {}, 2), ("psthash", {"n_access": 1}, 3), ("psthash", {"n_access": 3, "max_combinations": 4}, 4)])
def test_merges_derive_the_structure_and_answer_as_a_rebuild_and_scan(algorithm, options, seed, monkeypatch):
    """§4.4: random rounds of removals and adds (operands on a small grid:
    added endpoints inside existing spaces and equal to existing endpoints,
    values exactly on bounds, strings sharing long prefixes, IN lists,
    BETWEEN, DNFs of two units, removals that empty spaces) each merged into
    a derived matcher -- never a rebuild -- whose structure keeps the
    invariants and whose answers are a fresh build's and scan's."""
    cls = PSTBloomMatcher if algorithm == "pstbloom" else PSTHashMatcher
    monkeypatch.setattr(cls, "REBUILD_SHARE", np.inf)
    rng = np.random.default_rng(seed)
    subs = {i: _random_subscription(rng) for i in range(240)}
    index = built(algorithm, list(subs.values()), options)
    matcher_of(index)                                   # built: the merges below derive from it
    events = [_random_event(rng) for _ in range(150)] + [{"a": 2.5, "b": 0.0, "c": 5.5, "s": _PREFIX + "03"}, {}]
    next_id = len(subs)
    for round_ in range(5):
        n_remove = [20, 120, 5, 60, 30][round_]
        for i in rng.choice(sorted(subs), n_remove, replace=False):
            index.remove(int(i))
            del subs[int(i)]
        added = {next_id + k: _random_subscription(rng) for k in range(int(rng.integers(5, 60)))}
        if round_ == 2:                                 # an attribute no PS-Tree had: a new tree
            added[next_id] = "e BETWEEN 1 AND 3 AND a >= 2.5"
        next_id += len(added)
        index.add_many(list(added), list(added.values()))
        subs.update(added)
        index.merge()
        m = matcher_of(index)
        assert m.merges == round_ + 1                   # derived, not rebuilt
        assert m.nbytes > 0 and f"{len(subs)} subscriptions" in repr(m)
        check_structure(m)
        got = answers(index, events)
        rebuilt = built(algorithm, list(subs.values()), options)
        ids = np.array(sorted(subs))
        assert got == [ids[np.asarray(a, np.int64)].tolist() for a in answers(rebuilt, events)]
        scan = Index(algorithm="scan")
        scan.add_many(list(subs), list(subs.values()))
        scan.merge()
        assert got == answers(scan, events)
    assert sum(map(len, got)) > 0


@pytest.mark.parametrize("algorithm", ["pstbloom", "psthash"])
def test_section_4_4_example_derived(algorithm, monkeypatch):
    """§4.4's example as a merge: removing S2 merges [20, 30) into [30, 60]
    and (60, 80] into (80, ..]; adding S3 age in [40, 50] splits [20, 60]
    into three, which keep S1's list, signature or keys -- without a rebuild
    (the churn bound lifted: on three subscriptions any change passes it)."""
    monkeypatch.setattr(PSTBloomMatcher if algorithm == "pstbloom" else PSTHashMatcher, "REBUILD_SHARE", np.inf)
    index = built(algorithm, ["age BETWEEN 20 AND 60 AND x = 1", "age BETWEEN 30 AND 80 AND x = 1",
                              "x = 2 AND age = 5"])
    matcher_of(index)
    index.remove(1)
    index.merge()
    m = matcher_of(index)
    assert m.merges == 1
    assert m.spaces.vals[m.spaces.val_off[0]:m.spaces.val_off[1]].tolist() == [5, 20, 60]
    index.add_many([3, 4], ["age BETWEEN 40 AND 50 AND x = 1", "age = 20 AND x = 3"])
    index.merge()
    m = matcher_of(index)
    assert m.merges == 2
    check_structure(m)
    assert m.spaces.vals[m.spaces.val_off[0]:m.spaces.val_off[1]].tolist() == [5, 20, 40, 50, 60]
    events = [{"age": a, "x": x} for a in (5, 19, 20, 30, 40, 45, 50, 55, 60, 61, 80) for x in (1, 2, 3)]
    want = [[i for i, ok in ((0, 20 <= e["age"] <= 60 and e["x"] == 1), (2, e["x"] == 2 and e["age"] == 5),
                             (3, 40 <= e["age"] <= 50 and e["x"] == 1), (4, e["age"] == 20 and e["x"] == 3)) if ok]
            for e in events]
    assert answers(index, events) == want


def test_merges_rebuild_past_the_churn_share():
    """Deriving keeps the survivors' ranking; past REBUILD_SHARE of the
    built units added and removed, the merge rebuilds (merges back to 0)."""
    index = built("psthash", [f"a = {i} AND b < {i}" for i in range(100)])
    matcher_of(index)
    index.remove(0)
    index.merge()
    assert matcher_of(index).merges == 1
    for i in range(1, 60):
        index.remove(i)
    index.merge()
    assert matcher_of(index).merges == 0


@pytest.mark.parametrize("algorithm", ["pstbloom", "psthash"])
def test_a_dnf_survivor_keeps_its_units_places(algorithm):
    """A subscription of several units (a DNF) that survives a merge keeps
    each unit whose predicates are those of the unit in the same rank: it
    is not counted as removed and added.  (It was, at every merge: with a
    sixth of the subscriptions ORs, one added subscription passed the churn
    share and every merge rebuilt -- helper-46.)  Replaced subscriptions
    go out and come in with all their units, and every answer stays the
    scan's."""
    subs = [f"a = {i % 97} OR b = {i % 89}" if i % 6 == 0 else f"a = {i % 97} AND b < {i % 89}"
            for i in range(1000)]
    index = built(algorithm, subs)
    built_units = len(matcher_of(index).units)
    index.add(5000, "a = 3 OR (b = 4 AND c > 1)")
    index.merge()
    m = matcher_of(index)
    assert m.merges == 1 and m._churn == 2 and len(m.units) == built_units + 2
    check_structure(m)
    for sub_id in (0, 6):                                 # replaced: out with their units, in with new ones
        index.remove(sub_id)
    index.add_many([0, 6], ["b = 0 OR a = 0", "a = 6 OR b = 7"])
    index.merge()
    m = matcher_of(index)
    assert m.merges == 2 and m._churn == 2 + 4 + 4
    check_structure(m)
    subs[0], subs[6] = "b = 0 OR a = 0", "a = 6 OR b = 7"
    events = [{"a": a, "b": b, "c": 2} for a in range(0, 100, 3) for b in (0, 4, 6, 7, 88)]
    want = answers(built("scan", subs), events)
    extra = [{5000} if e["a"] == 3 or (e["b"] == 4 and e["c"] > 1) else set() for e in events]
    assert answers(index, events) == [sorted(set(w) | x) for w, x in zip(want, extra)]


def test_psthash_keeps_its_table_when_no_space_changes(monkeypatch):
    """Adds whose endpoints are all boundaries already and removals that
    leave every boundary cut change no space: the hash table is the old
    one (shared while no key is new, copied when one is), its groups
    refilled -- the regime of a workload whose values are a fixed grid."""
    monkeypatch.setattr(PSTHashMatcher, "REBUILD_SHARE", np.inf)
    subs = [f"a = {i % 5} AND b < {i % 7} AND c = {(i + 1) % 5}" for i in range(60)]
    index = built("psthash", subs)
    old = matcher_of(index)
    index.remove(3)
    index.add_many([100], ["a = 2 AND b < 4 AND c = 3"])      # an existing key
    index.merge()
    m = matcher_of(index)
    assert m.merges == 1 and m.structure.slot_group is old.structure.slot_group
    assert m.structure.group_key is old.structure.group_key
    index.add_many([101], ["a = 4 AND b < 1 AND c = 1"])      # a key of existing spaces, new to the table
    index.merge()
    m2 = matcher_of(index)
    assert m2.merges == 2 and m2.structure.slot_group is not m.structure.slot_group
    assert len(m2.structure.group_key) == len(m.structure.group_key) + 1
    assert len(m2.structure.slot_group) == len(m.structure.slot_group)
    for x in (m, m2):
        check_structure(x)
    events = [{"a": a, "b": b, "c": c} for a in range(6) for b in range(-1, 8) for c in range(5)]
    want = [[i for i in range(60) if i != 3 and e["a"] == i % 5 and e["b"] < i % 7 and e["c"] == (i + 1) % 5] +
            ([100] if (e["a"], e["c"]) == (2, 3) and e["b"] < 4 else []) +
            ([101] if (e["a"], e["c"]) == (4, 1) and e["b"] < 1 else []) for e in events]
    assert answers(index, events) == want


@pytest.mark.parametrize("algorithm", ["pstbloom", "psthash"])
def test_bench_update_costs_times_the_derived_and_the_rebuilt_merge(algorithm):
    """``bexmatch bench --updates`` for PS-Tree: the function asserts which
    path each run took (derived, then a rebuild forced) and restores the
    churn bound."""
    from engine.bench import update_costs
    from engine.workloads import standard
    cls = PSTBloomMatcher if algorithm == "pstbloom" else PSTHashMatcher
    share = cls.REBUILD_SHARE
    cost = update_costs(standard("W2", scale=0.003, n_events=5), n=20, repeats=1, algorithm=algorithm)
    assert cost["algorithm"] == algorithm and cost["n_subscriptions"] == 3000
    assert cost["incremental_s"] > 0 and cost["full_s"] > 0
    assert cls.REBUILD_SHARE == share


@pytest.mark.parametrize("width,top", [(1, 50), (2, 3000), (3, 200), (2, 2 ** 40)])
def test_hash_keys_group_by_key_then_unit_packed_or_not(width, top):
    """PSTHash's keys grouped through one int64 sort of packed (key, unit)
    pairs when they fit in 62 bits, through lexsort when not (2^40 space
    ids): the distinct keys ascending and each one's units ascending, as a
    lexsort gives them, -1 padding and repeated keys included."""
    rng = np.random.default_rng(width)
    n = 5000
    keys = rng.integers(0, 40, (n, width)) * (top // 40)
    keys[rng.random(n) < 0.1, -1] = -1                # padding of units with fewer access predicates
    keys[: n // 2] = keys[n // 2:]                     # repeated keys, several units each
    owner = rng.integers(0, 100_000, n).astype(np.int32)
    order = np.lexsort((owner,) + tuple(keys[:, q] for q in range(width - 1, -1, -1)))
    want_keys, want_owner = keys[order], owner[order]
    starts = np.flatnonzero(np.concatenate(([True], (want_keys[1:] != want_keys[:-1]).any(axis=1))))
    group_keys, group_off, got_owner = grouped_keys(keys, owner)
    assert got_owner.dtype == np.int32 and len(group_keys) < n
    assert np.array_equal(got_owner, want_owner)
    assert np.array_equal(group_keys, want_keys[starts])
    assert np.array_equal(group_off, np.append(starts, n))


def test_keys_packed_as_enumerated_group_as_the_key_matrix_does():
    """A build packs each N-dim key and its unit as the kernel enumerates
    them (no key matrix); the groups equal those of the key matrix and the
    built table's, and the key matrix is enumerated instead when a key
    might not fit (2^40 spaces)."""
    from engine.algorithms.pstree import grouped_space_combinations, predicate_spaces
    from engine.workloads import standard
    for n_access in (2, 3):
        m = matcher_of(built("psthash", standard("W2", scale=0.002, n_events=1).subscriptions,
                             {"n_access": n_access}))
        rows, s = m.units.rows, m.unit_structure()
        _, (cov_off, cov_first, cov_last), _ = predicate_spaces(rows, m.indexable, m.defining, m.n_attrs)
        args = (m.units.offsets, m._pids, s.access, m.arity, rows.attr.astype(np.int64), cov_off, cov_first,
                cov_last, n_access)
        keys, owner, packed = K.space_combinations(*args, 0, 0)
        assert len(packed) == 0 and len(keys) == len(owner) > 1000
        want = grouped_keys(keys, owner)
        n_spaces = int(m.spaces.space_off[-1])
        for spaces in (n_spaces, 2 ** 40):          # packed by the kernel; through the key matrix
            got = grouped_space_combinations(*args, spaces)
            assert got[2].dtype == np.int32
            for a, b in zip(got, want):
                assert np.array_equal(a, b)
        assert np.array_equal(want[0], s.group_key) and np.array_equal(want[2], s.units)


def test_hash_table_sizes_and_its_int32_groups():
    """The table's slots are a power of two, at most half of them used,
    and its groups are numbered in int32: a table that would need more is
    refused with a clear error, not overflowed."""
    for n in (0, 1, 2, 3, 1000, 4_194_304, 4_200_000):
        slots = K.table_slots(n)
        assert slots & (slots - 1) == 0 and slots >= max(2, 2 * n) and (slots == 2 or slots < 4 * n)
    with pytest.raises(ValueError, match="int32"):
        K.table_slots(1 << 30)
    keys = np.array([[5, 9], [5, -1], [0, 3], [7, 7]], np.int64)
    slot_group = K.build_hash_table(keys, K.table_slots(len(keys)))
    assert slot_group.dtype == np.int32
    assert K.lookup_groups(slot_group, keys, keys).tolist() == [0, 1, 2, 3]
    assert K.lookup_groups(slot_group, keys, np.array([[9, 5], [5, 8], [-1, -1]], np.int64)).tolist() == [-1] * 3
    # the groups' keys kept as int32 (the matcher narrows them): the same slots, found by int64 probes
    narrow = keys.astype(np.int32)
    assert np.array_equal(K.build_hash_table(narrow, K.table_slots(len(keys))), slot_group)
    assert K.lookup_groups(slot_group, narrow, keys).tolist() == [0, 1, 2, 3]


# ------------------------------------------------- both PS-Trees, 64 events a group
@pytest.mark.parametrize("algorithm", ["psthash", "pstbloom"])
@pytest.mark.parametrize("n_events", [4, 63, 64, 65, 130, 300])
def test_64_events_a_group_equal_one_event_at_a_time(algorithm, n_events, monkeypatch):
    """The batch kernel (gpu_kernels.pstree.cpu.lanes_task: the units of a
    group (PSTHash: of an N-dim space's key; PSTBloom: of a space's list)
    verified once for the events that reached them) against each
    PS-Tree's one-event kernel and scan: groups full and partial; DNF subscriptions
    (two units, one position); units with no indexable predicate (IS NULL,
    LIKE); absent attributes and unknown ones; removed subscriptions not
    yet merged; tasks resumed in the middle of a group.  And on a batch
    holding NaN values (the API refuses them; a kernel must not trust
    that), where a space does not decide its access predicate: the two
    kernels equal."""
    import engine.algorithms.pstree as pstree_module
    from engine.algorithms.host_tasks import match_in_tasks

    rng = np.random.default_rng(n_events)
    subs = [_random_subscription(rng) for _ in range(600)] + ["s LIKE 'shared%'", "a IS NULL", "e = 1 OR s IS NULL"]
    events = [_random_event(rng) for _ in range(n_events)]
    for ev in events[1::9]:
        ev["zz"] = 1.0                                  # an attribute no subscription names
    launches = []

    def counted(n, launch, estimate, per_task=1):
        def counting(*args):
            launches.append(per_task)
            return launch(*args)
        return match_in_tasks(n, counting, estimate, per_task)

    monkeypatch.setattr(pstree_module, "match_in_tasks", counted)
    indexes = {lanes: built(algorithm, subs, {"lanes": lanes}) for lanes in (64, 1)}
    scan = built("scan", subs)
    for target in (*indexes.values(), scan):
        for i in range(0, len(subs), 7):
            target.remove(i)                           # alive = 0 in the matcher until the next merge
    want = scan.match_batch(events, output="arrow")
    assert want.num_rows > 3 * n_events
    for lanes, index in indexes.items():
        launches.clear()
        assert index.match_batch(events, output="arrow").equals(want), lanes
        assert set(launches) == {64 if lanes == 64 else 1}
    batch = event_batches.encode_events(events, indexes[64].schema)
    batch.value[::3] = np.nan
    alive = np.ones(len(subs), np.uint8)
    alive[::7] = 0
    patterns = np.zeros((len(batch.strings) + 1, 8), np.uint8)     # (no LIKE TRUE: the same for both)
    got = [matcher_of(indexes[lanes]).positions(batch, patterns, alive) for lanes in (64, 1)]
    assert all(np.array_equal(x, y) for x, y in zip(*got)) and len(got[0][0]) > n_events
    if n_events >= 64:
        launches.clear()
        matcher_of(indexes[64])._matches_per_event = 1.0
        assert indexes[64].match_batch(events, output="arrow").equals(want)
        assert len(launches) > 1                       # a task resumed for room, inside a group
    if n_events >= 130:
        stops_after_the_first_group(pstree_module, indexes[64], events, want, monkeypatch)


@pytest.mark.parametrize("options", [PSTHashOptions, PSTBloomOptions])
def test_lanes_option_is_checked(options):
    for bad in (0, 2, 32, 128, 64.0, True):
        with pytest.raises(ValueError, match="lanes must be 1 or 64"):
            options(lanes=bad)
    assert options(lanes=1).lanes == 1 and options().lanes == 64


def test_psthash_checks_are_made_by_the_first_batch_match_and_again_after_a_merge():
    """The batch kernel's checks (UnitChecks) are made when it first runs,
    counted in ``nbytes``, and made again from a merged matcher's own units
    (one unit removed, one added: not the old ones): ``lanes=1`` (and a
    cuda matcher's host twin) never make them."""
    subs = [f"a{i % 5} >= {i % 11} AND a{(i + 1) % 5} < {i % 13 + 2}" for i in range(300)]
    events = [{f"a{k}": (e * 7 + k * 3) % 15 for k in range(5)} for e in range(70)]
    scan = built("scan", subs)
    one = built("psthash", subs, {"lanes": 1})
    assert answers(one, events) == answers(scan, events)
    assert matcher_of(one)._checks == ()
    index = built("psthash", subs)
    assert answers(index, events) == answers(scan, events)
    matcher = matcher_of(index)
    checks_bytes = sum(a.nbytes for a in matcher._checks)
    assert checks_bytes > 0 and matcher.nbytes == matcher_of(one).nbytes + checks_bytes
    for target in (index, scan):
        target.add_many([1000], ["a1 BETWEEN 3 AND 9"])
        target.remove(4)
        target.merge()
    merged = matcher_of(index)            # (its first match made its own checks)
    assert merged is not matcher and merged.merges == 1
    assert answers(index, events) == answers(scan, events)
    assert len(merged._checks.attr) == len(merged._probe_units[2]) != len(matcher._checks.attr)


# ------------------------------------------------------------ grown dictionary
@pytest.mark.parametrize("algorithm,seed", [("pstbloom", 0), ("psthash", 1), ("pstbloom", 2), ("psthash", 3)])
def test_a_grown_dictionary_moves_the_codes_without_a_rebuild(algorithm, seed, monkeypatch):
    """Subscriptions naming strings new to the dictionary -- before, between
    and after the indexed ones -- move the codes of main's predicates: the
    matcher is recoded (boundaries and rows mapped, lists, signatures and
    keys kept: the PS-Trees a build cuts from the new codes), never rebuilt,
    and answers as scan on events holding the old strings, the new ones and
    strings of neither; a merge then derives from the recoded matcher."""
    from engine.algorithms.pstree import _PSTreeMatcher

    rng = np.random.default_rng(seed)
    words = realistic_strings(rng, 60)
    subs = {i: string_subscription(rng, words) for i in range(400)}
    index = built(algorithm, list(subs.values()))
    def event(ws):
        return {"s": str(rng.choice(ws)), "t": str(rng.choice(ws)), "n": int(rng.integers(7))}
    events = [event(words) for _ in range(80)] + [{"s": w} for w in words[:10]] + [{}]
    built_m = matcher_of(index)

    def no_rebuild(self, segment, schema):
        raise AssertionError("rebuilt")
    monkeypatch.setattr(_PSTreeMatcher, "rebuilt", no_rebuild)
    scan = Index(algorithm="scan")
    scan.add_many(list(subs), list(subs.values()))
    previous = built_m
    for round_ in range(3):
        fresh = realistic_strings(rng, 15)
        added = {1000 * (round_ + 1) + k: string_subscription(rng, fresh + words[:5]) for k in range(12)}
        for target in (index, scan):
            target.add_many(list(added), list(added.values()))
        subs.update(added)
        events += [event(fresh) for _ in range(30)] + [{"s": w + "\x00", "t": w[:-1]} for w in fresh[:5]]
        got = answers(index, events)
        assert got == answers(scan, events)
        m = matcher_of(index)
        assert m is not previous and m.merges == previous.merges           # recoded: not merged, not rebuilt
        assert m.structure is previous.structure and not np.array_equal(m.spaces.vals, previous.spaces.vals)
        assert np.array_equal(m.spaces.elem_space, previous.spaces.elem_space)
        check_structure(m)                                                   # the cut of the new codes
        previous = m
        words += fresh
    assert sum(map(len, got)) > 100 and [] in got
    index.merge()
    scan.merge()
    merged = matcher_of(index)
    assert merged.merges == previous.merges + 1                             # derived from the recoded one
    check_structure(merged)
    assert answers(index, events) == answers(scan, events)


@pytest.mark.parametrize("algorithm", ["pstbloom", "psthash"])
def test_a_recode_whose_codes_do_not_check_out_rebuilds(algorithm):
    """The recode maps codes through the dictionary the matcher says it was
    coded under; a matcher holding the live schema (whose dictionary has
    grown since) would map them wrongly, so the mapped rows, checked against
    the segment's own codes, send it to a rebuild -- never to wrong answers."""
    subs = ["s = 'b' AND n < 3", "s BETWEEN 'a' AND 'c'", "s IN ('d', 'b')", "s > 'c'"]
    index = built(algorithm, subs)
    m = matcher_of(index)
    for target in (index, ref := built("scan", subs)):
        target.add(9, "s = 'bb'")                     # 'bb' moves the codes of 'c' and 'd'
    view = index.schema.view()
    recoded = m.recoded(m.segment.coded(view), view)
    assert recoded.structure is m.structure           # (the right dictionary: mapped)
    stale = copy.copy(m)
    stale.schema = index.schema                        # the live schema: already holds 'bb'
    again = stale.recoded(m.segment.coded(view), view)
    assert again.structure is not m.structure          # rebuilt
    events = [{"s": v, "n": 1} for v in ("a", "b", "ba", "bb", "c", "ca", "d", "e")]
    for matcher in (recoded, again):
        batch = event_batches.encode_events(events, view)
        truth = event_batches.pattern_truth(batch, view, matcher.segment.predicates.pattern_pairs())
        ev, pos = matcher.match(batch, truth, np.ones(len(subs), np.uint8))
        got = [sorted(pos[ev == e].tolist()) for e in range(len(events))]
        assert got == [[p for p in a if p < len(subs)] for a in answers(ref, events)]
