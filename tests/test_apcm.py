"""``apcm`` on the cpu: the bitmap encoding bit by bit against the
predicates' truth (precomputed rows over elementary intervals, evaluated
slices, overflow bits), compressed events as the OR of their members,
the layout kept across merges (overflow bits, pseudo-deletion, the rebuild
past the reclaim share), online stream re-ordering (clusters, similarity,
the adaptive cluster size), and every variant against ``scan`` on similar
streams.  The Index through every life cycle, against the reference and
DuckDB, is tests/test_conformance.py's; the cuda twins, test_apcm_cuda.py.
"""

from __future__ import annotations

import numpy as np
import pytest

from engine import Index
from engine.algorithms import registry
from engine.algorithms.apcm import APCMMatcher
from engine.algorithms.osr import ADAPTIVE_CEILING, MAX_MEMBERS, Reorderer, arrival_runs
from engine.algorithms.residual import ResidualMatcher
from engine.workloads import begen
from gpu_kernels.apcm import counting
from gpu_kernels.apcm import cpu as C
from gpu_kernels.apcm.layout import NULL_SLOT, RECLAIM_SHARE, _row_keys, words
from gpu_kernels.betree.layout import event_keys
from gpu_kernels.list_truth import list_bits_words
from gpu_kernels.opcodes import IS_NULL, TRUE
from gpu_kernels.predicates import entry_truth
from gpu_kernels.string_codes import recoded_rows, string_code_map
from tests.test_betree_cuda import LEAF_CHECKS
from tests.test_cuda_sim import EVENTS, EXPRESSIONS, compiled

#: a tree as deep as BE-Tree gets, every cluster compressed (pairs of events, re-ordered)
DEEP_PCM = {"max_cap": 1, "min_size": 1, "variant": "pcm", "threshold": 0, "cluster_size": 2, "batch_size": 4}
#: events sharing attributes and values, so that the clusters have members with equal keys and absent ones
SIMILAR_EVENTS = EVENTS + [
    {"n0": 1, "n1": 1, "s0": "ab", "s1": "zb"}, {"n0": 1, "n1": 2, "s0": "ab", "b0": True},
    {"n0": 2, "s0": "abc", "n1": 5, "s1": "q"}, {"s0": "cz", "n2": 1.5, "s1": "zb", "n1": 7.75},
    {"n0": 1, "n1": 1, "s0": "ab", "s1": "zb", "b0": True}, {"n0": 3, "n2": 2.5, "s0": "cab", "n1": -1}]
#: URLs sharing long prefixes, non-ASCII, NUL, values exactly on the operands (every elementary interval)
URL = "https://example.com/" + "a" * 300
BOUNDS_EXPRESSIONS = [
    f"s0 = '{URL}/x' OR s0 = '{URL}/y'", f"s0 BETWEEN '{URL}/x' AND '{URL}/y\x00'", f"s1 IN ('ünï', '{URL}')",
    "n0 BETWEEN 1 AND 3 AND n1 NOT BETWEEN -1 AND 1", "n0 != 2 OR n2 NOT IN (0.5, 2.5, 7.75)",
    "n0 > 3 AND n1 >= 7.75", "n0 < 1 OR n1 <= -1", "s1 != 'a' AND s1 > 'b'", "n2 IS NULL AND n0 = 3",
]
BOUNDS_EVENTS = [{"n0": v, "n1": w, "n2": x, "s0": s, "s1": t}
                 for v, w, x, s, t in [(0, -1, 0.5, f"{URL}/x", "ünï"), (1, 1, 2.5, f"{URL}/y", URL),
                                       (2, 7.75, 7.75, f"{URL}/y\x00", "a"), (3, 8, 3, f"{URL}/xx", "b"),
                                       (3.5, -2, 0.25, URL, "ba"), (1 - 2 ** -52, 1 + 2 ** -52, 7.5, "", "ü")]]
BOUNDS_EVENTS += [{"n0": 3, "s0": f"{URL}/x"}, {"n1": 0, "s1": "ünï"}]


def answers(index: Index, events) -> list[list[int]]:
    return [m.tolist() for m in index.match_batch(events)]


def apcm_of(index: Index) -> APCMMatcher:
    """The index's current A-PCM matcher (built by a match if none is yet)."""
    index.match({})
    matcher = index._matcher
    return matcher.native if isinstance(matcher, ResidualMatcher) else matcher


def scan_answers(subscriptions, events) -> list[list[int]]:
    """``scan``'s answers: subscriptions a columnar table or {id: text}."""
    ref = Index(algorithm="scan")
    if isinstance(subscriptions, dict):
        ref.add_many(list(subscriptions), list(subscriptions.values()))
    else:
        ref.add_many(subscriptions)
    return answers(ref, events)


# ========================================================= stages 1 and 2
def seg_sum(values, offsets):
    total = np.concatenate(([0], np.cumsum(values)))
    return total[offsets[1:]] - total[offsets[:-1]]


def cpu_stages(m: APCMMatcher, batch, truth):
    """The cpu stages 1 and 2 as :meth:`APCMMatcher._positions` runs them:
    (clusters, keys, evaluated words, store offsets, e_main, e_over, store, compressed
    entries (ce_start, ce_end, ce_attr, ce_main, ce_over, ce_absent,
    ce_key_end, ce_keys))."""
    lay, rows, t = m.layout, m.tree.units.rows, m.tree
    ev_key = event_keys(batch.value, batch.attr, t.string_attr, t.str_map)
    clusters = m.clusters(batch, ev_key)
    a = batch.attr.astype(np.int64)
    known = a < lay.n_attrs
    ak = np.where(known, a, 0)
    entry_words = np.where(known, np.where(lay.tab_off[ak] < 0, words(lay.main_bits[ak]), 0)
                           + words(lay.over_bits[ak]), 0)
    slice_words = np.where(known, words(lay.main_bits[ak]) + words(lay.over_bits[ak]), 0)
    sizes = np.diff(clusters.off)
    cluster_words = np.where(sizes > 1, seg_sum(seg_sum(slice_words, batch.offsets)[clusters.perm], clusters.off), 0)
    n_entry = int(entry_words.sum())
    store_at = np.concatenate(([0], np.cumsum(entry_words)[:-1])).astype(np.int64)
    c_store_at = (n_entry + np.concatenate(([0], np.cumsum(cluster_words)[:-1]))).astype(np.int64)
    store = np.zeros(n_entry + int(cluster_words.sum()), np.uint64)
    n = len(batch.attr)
    e_main, e_over = np.empty(n, np.int64), np.empty(n, np.int64)
    C.encode_entries(batch.attr, batch.value, batch.token, store_at, lay.main_bits, lay.over_bits, lay.bit_off,
                     lay.bit_pred, *m._bit_codes(), lay.obit_off, lay.obit_pred, lay.tab_off, lay.bound_off, lay.bounds,
                     rows.op, rows.lo, rows.hi, rows.aux, rows.set_offsets, rows.set_values, truth, batch.list_truth,
                     list_bits_words(batch.list_truth), e_main, e_over, store)
    cl_entries = seg_sum(np.diff(batch.offsets)[clusters.perm], clusters.off)
    ce_start = np.concatenate(([0], np.cumsum(cl_entries)[:-1])).astype(np.int64)
    n_ce = int(cl_entries.sum())
    ce = (np.empty(clusters.n_clusters, np.int64), np.empty(n_ce, np.int64), np.empty(n_ce, np.int64),
          np.empty(n_ce, np.int64), np.empty(n_ce, np.uint8), np.empty(n_ce, np.int64), np.empty(n_ce, np.uint64))
    C.compress_clusters(clusters.off, clusters.perm, batch.offsets, batch.attr, ev_key, e_main, e_over, lay.main_bits,
                        lay.over_bits, lay.table, store, ce_start, c_store_at, *ce)
    return clusters, ev_key, n_entry, store_at, e_main, e_over, store, (ce_start, *ce)


def slice_words_at(ptr, n_words, table, store):
    """The words of the slice at pointer ``ptr`` (None: no slice)."""
    if ptr == C.NO_SLICE:
        return None
    return (table[ptr:ptr + n_words] if ptr >= 0 else store[-2 - ptr:-2 - ptr + n_words]).tolist()


def bit_of(slot, p_main, p_over, table, store) -> bool:
    """Bit ``slot`` (main ``>= 0``, overflow ``<= -2``) of the slices at the pointers."""
    ptr, bit = (p_main, slot) if slot >= 0 else (p_over, -2 - slot)
    if ptr == C.NO_SLICE:
        return False
    word = table[ptr + (bit >> 6)] if ptr >= 0 else store[-2 - ptr + (bit >> 6)]
    return bool((int(word) >> (bit & 63)) & 1)


def check_bits(m: APCMMatcher, batch, truth) -> int:
    """Every bit of every event entry is its predicate's truth on the
    entry's value (the scan kernels' evaluation, one predicate at a time):
    a tabled attribute's row found by the entry's elementary interval, an
    evaluated one computed; bits beyond an attribute's predicates are 0.
    Returns the bits checked."""
    lay, rows = m.layout, m.tree.units.rows
    _, _, _, _, e_main, e_over, store, _ = cpu_stages(m, batch, truth)
    checked = 0
    for k in range(len(batch.attr)):
        a = int(batch.attr[k])
        if a >= lay.n_attrs:
            assert e_main[k] == e_over[k] == C.NO_SLICE
            continue
        for p in np.flatnonzero((rows.attr == a) & (lay.pred_slot != NULL_SLOT)):
            want = entry_truth.py_func(p, k, batch.value, batch.token, rows.op, rows.lo, rows.hi, rows.set_offsets,
                                       rows.set_values, rows.aux, truth, batch.list_truth) == TRUE
            assert bit_of(int(lay.pred_slot[p]), e_main[k], e_over[k], lay.table, store) == want, \
                f"entry {k} (attribute {a}, value {batch.value[k]!r}): predicate row {p}"
            checked += 1
        for ptr, n_bits in ((e_main[k], lay.main_bits[a]), (e_over[k], lay.over_bits[a])):
            got = slice_words_at(ptr, int(words(n_bits)), lay.table, store)
            if got and n_bits & 63:
                assert got[-1] >> int(n_bits & 63) == 0, "bits past the attribute's predicates are set"
    return checked


def test_every_bit_is_its_predicates_truth():
    """Comparisons, BETWEEN, IN/NOT IN, !=, strings (long URLs sharing
    prefixes, NUL, non-ASCII), LIKE/MATCHES (evaluated attributes), values
    exactly on the operands and one ulp beside them."""
    seg, batch, truth = compiled(EXPRESSIONS + LEAF_CHECKS + BOUNDS_EXPRESSIONS,
                                 SIMILAR_EVENTS + BOUNDS_EVENTS)
    m = APCMMatcher(seg, "cpu")
    stats = m.layout.statistics()
    assert stats["tabled_attributes"] >= 3 and stats["evaluated_attributes"] >= 1
    assert stats["overflow_bits"] == stats["dead_bits"] == 0
    assert check_bits(m, batch, truth) > 300
    # IS NULL has no bit: absence decides it
    null_rows = np.flatnonzero(m.tree.units.rows.op == IS_NULL)
    assert len(null_rows) and (m.layout.pred_slot[null_rows] == NULL_SLOT).all()


def test_every_bit_of_a_list_attribute_is_its_predicates_truth():
    """A list attribute's bits come from its list codes and the event list's
    bitmap (not one evaluation per bit): every operator, on lists that
    hold, miss, fully hold or are empty -- each bit equals the scan
    kernels' evaluation, one predicate at a time."""
    rng = np.random.default_rng(11)
    expressions = []
    for k in range(120):
        values = ", ".join(str(v) for v in rng.choice(8, int(rng.integers(1, 4)), replace=False))
        words = ", ".join(f"'w{v}'" for v in rng.choice(8, int(rng.integers(1, 4)), replace=False))
        expressions += [f"l0 ONE OF ({values})", f"l0 NONE OF ({values})", f"l0 ALL OF ({values})",
                        f"NOT l0 ALL OF ({values})", f"{int(rng.integers(8))} IN l0",
                        f"{int(rng.integers(8))} NOT IN l0", f"l1 ONE OF ({words})", f"l1 ALL OF ({words})",
                        f"'w{int(rng.integers(8))}' NOT IN l1"][k % 9:k % 9 + 1]
    expressions += ["l0 IS EMPTY", "l0 IS NOT EMPTY", "l1 IS EMPTY", "l1 IS NOT EMPTY"]
    events = [{"l0": [int(v) for v in rng.choice(8, int(rng.integers(0, 7)), replace=False)],
               "l1": [f"w{v}" for v in rng.choice(8, int(rng.integers(0, 7)), replace=False)]}
              for _ in range(30)] + [{"l0": list(range(8))}, {"l1": []}]
    seg, batch, truth = compiled(expressions, events)
    m = APCMMatcher(seg, "cpu")
    codes, list_attr = m._bit_codes()
    assert list_attr.sum() == 2          # l0 and l1
    assert (codes > 0).sum() > 80 and (codes >= 0).all()
    assert check_bits(m, batch, truth) > 2000


def test_a_compressed_event_is_the_or_of_its_members():
    """Stage 2: per cluster and attribute, the compressed entry's slices are
    the OR of its members' slices, it is marked absent when a member lacks
    the attribute, and it carries the members' distinct keys."""
    seg, batch, truth = compiled(EXPRESSIONS + LEAF_CHECKS + BOUNDS_EXPRESSIONS, SIMILAR_EVENTS + BOUNDS_EVENTS)
    m = APCMMatcher(seg, "cpu", **DEEP_PCM)
    lay = m.layout
    clusters, ev_key, _, _, e_main, e_over, store, ce = cpu_stages(m, batch, truth)
    ce_start, ce_end, ce_attr, ce_main, ce_over, ce_absent, ce_key_end, ce_keys = ce
    compressed = 0
    for c in range(clusters.n_clusters):
        members = clusters.perm[clusters.off[c]:clusters.off[c + 1]]
        entries = {}
        for e in members:
            for k in range(batch.offsets[e], batch.offsets[e + 1]):
                entries.setdefault(int(batch.attr[k]), []).append(k)
        assert sorted(ce_attr[ce_start[c]:ce_end[c]].tolist()) == sorted(entries)
        for r in range(ce_start[c], ce_end[c]):
            a = int(ce_attr[r])
            mine = entries[a]
            assert bool(ce_absent[r]) == (len(mine) < len(members))
            key0 = ce_start[c] if r == ce_start[c] else ce_key_end[r - 1]
            assert sorted(ce_keys[key0:ce_key_end[r]].tolist()) == sorted(set(ev_key[mine].tolist()))
            if a >= lay.n_attrs or len(members) < 2:
                continue
            for ptrs, cptr, n_bits in ((e_main, ce_main[r], lay.main_bits[a]), (e_over, ce_over[r], lay.over_bits[a])):
                n_w = int(words(n_bits))
                if n_w == 0:
                    continue
                want = np.zeros(n_w, np.uint64)
                for k in mine:
                    want |= np.array(slice_words_at(ptrs[k], n_w, lay.table, store), np.uint64)
                assert slice_words_at(cptr, n_w, lay.table, store) == want.tolist()
                compressed += 1
    assert compressed > 5 and clusters.compressed_events() >= 6


def stage3(m: APCMMatcher, batch, truth, parallel_paths: bool):
    """Stage 3 as :meth:`APCMMatcher._runs` runs it: (clusters, the work items' clusters, per cluster the
    candidate c-nodes its compressed event's walk collected, in order)."""
    clusters, _, _, _, _, _, _, ce = cpu_stages(m, batch, truth)
    ce_start, ce_end, ce_attr, _, _, _, ce_key_end, ce_keys = ce
    t = m.tree
    node, p_top, p_attr = t.table.node, t.table.p_top, t.tree.p_attr
    n = clusters.n_clusters
    item_cluster, item_pnode = C.path_items(n, ce_start, ce_end, ce_attr, node, p_attr, parallel_paths)
    off, cand = m._traverse(item_cluster, item_pnode, ce_start, ce_end, ce_attr, ce_key_end, ce_keys, node, p_top,
                            p_attr, max(m.layout.n_attrs, t.table.n_attrs), n, parallel_paths)
    return clusters, item_cluster, [cand[off[c]:off[c + 1]].tolist() for c in range(n)]


def test_one_walk_per_compressed_event_reaches_every_leaf_a_member_reaches():
    """Stage 3 (§V-A, with §V-B's unrolling and §V-C's parallel paths): the tree is walked once per compressed
    event -- one work item per cluster, or one per root path it carries -- and collects each candidate c-node
    once; what it collects holds every c-node that any member's own walk reaches (so the per-member check of
    stage 4 misses no match), and the parallel paths collect the same c-nodes as one walk from the root."""
    seg, batch, truth = compiled(EXPRESSIONS + LEAF_CHECKS + BOUNDS_EXPRESSIONS, SIMILAR_EVENTS + BOUNDS_EVENTS)
    alone = APCMMatcher(seg, "cpu", **{**DEEP_PCM, "cluster_size": 1, "adaptive": False})
    singles, _, reached = stage3(alone, batch, truth, parallel_paths=False)
    assert singles.n_clusters == batch.n_events
    of_event = {int(singles.perm[singles.off[c]]): set(reached[c]) for c in range(singles.n_clusters)}
    m = APCMMatcher(seg, "cpu", **{**DEEP_PCM, "adaptive": False})       # (the same clusters in both walks)
    clusters, items, whole = stage3(m, batch, truth, parallel_paths=False)
    assert items.tolist() == list(range(clusters.n_clusters))          # one walk per compressed event
    again, path_items, paths = stage3(m, batch, truth, parallel_paths=True)
    assert again.perm.tolist() == clusters.perm.tolist() and again.off.tolist() == clusters.off.tolist()
    assert len(path_items) > clusters.n_clusters and np.unique(path_items).tolist() == list(range(clusters.n_clusters))
    wider = 0
    for c in range(clusters.n_clusters):
        members = clusters.perm[clusters.off[c]:clusters.off[c + 1]].tolist()
        assert len(whole[c]) == len(set(whole[c])) and len(paths[c]) == len(set(paths[c]))   # each c-node once
        assert set(paths[c]) == set(whole[c])
        union = set().union(*(of_event[e] for e in members))
        assert union <= set(whole[c]), (c, members)
        wider += len(members) > 1 and all(of_event[e] < union for e in members)
    assert clusters.compressed_events() >= 6 and wider >= 2      # clusters whose walk served members reaching apart


# ============================================================ maintenance
def _layout_index(options=None):
    exprs = [f"n{i % 4} BETWEEN {i} AND {i + 3} AND s{i % 2} != 'u/{i}'" for i in range(40)]
    index = Index(algorithm="apcm", options=options)
    index.add_many(list(range(40)), exprs)
    index.merge()
    return index, dict(zip(range(40), exprs))


EVENTS_N = [{"n0": v, "n1": v + 1, "n2": v / 2, "n3": v, "s0": f"u/{v}", "s1": "u/3"} for v in range(0, 45, 3)] + \
    [{"n0": 7}, {"s1": "u/7", "n3": 8}, {}]


@pytest.mark.parametrize("options", [None, {"over": "opindex", "variant": "pcm", "cluster_size": 4, "threshold": 0}])
def test_a_merge_keeps_the_layout_new_predicates_in_overflow_removed_ones_pseudo_deleted(options):
    """§IV's maintenance: a merge adding a few predicates keeps every bit
    where it was and appends overflow bits; removed subscriptions leave
    their predicates' bits dead in place; the answers stay exact (over
    BE-Tree and over OpIndex's lists, whose entries name overflow bits);
    past the reclaim share the next merge builds the layout afresh."""
    index, texts = _layout_index(options)
    m0 = apcm_of(index)
    bits0 = int(m0.layout.main_bits.sum())
    index.add_many([100, 101], ["n0 > 41 AND s0 = 'new'", "n2 IN (4.5, 9) AND n1 != 16"])
    texts.update({100: "n0 > 41 AND s0 = 'new'", 101: "n2 IN (4.5, 9) AND n1 != 16"})
    index.merge()
    m1 = apcm_of(index)
    assert m1.layout_rebuilt is False and m1.layout.table is m0.layout.table
    assert int(m1.layout.main_bits.sum()) == bits0 and int(m1.layout.over_bits.sum()) >= 3
    assert answers(index, EVENTS_N) == scan_answers(texts, EVENTS_N)
    # the kept bits are the same predicates' (the row ids changed with the
    # merge, the string codes with the grown dictionary: 'new')
    code_map = string_code_map(m0.schema.dictionary().order, m1.schema.dictionary().rank)
    assert m1.schema.n_strings > m0.schema.n_strings
    keys0 = dict(zip(_row_keys(recoded_rows(m0.tree.units.rows, m1.tree.string_attr, code_map)),
                     m0.layout.pred_slot.tolist()))
    kept = 0
    for key, slot in zip(_row_keys(m1.tree.units.rows), m1.layout.pred_slot.tolist()):
        if slot >= 0:
            assert keys0[key] == slot
            kept += 1
    assert kept == int((m0.layout.pred_slot >= 0).sum())
    for i in (0, 1, 2):
        index.remove(i)
    for i in (0, 1, 2):
        del texts[i]
    index.merge()
    m2 = apcm_of(index)
    assert m2.layout_rebuilt is False and m2.layout.dead_bits >= 3
    assert answers(index, EVENTS_N) == scan_answers(texts, EVENTS_N)
    # overflow + dead past the reclaim share: rebuilt, every bit in a main slice again
    fresh = {200 + i: f"n3 = {100 + i} OR s1 = 'v/{i}'" for i in range(int(RECLAIM_SHARE * bits0) + 2)}
    index.add_many(list(fresh), list(fresh.values()))
    texts.update(fresh)
    index.merge()
    m3 = apcm_of(index)
    assert m3.layout_rebuilt is True
    assert m3.layout.over_bits.sum() == 0 and m3.layout.dead_bits == 0
    assert answers(index, EVENTS_N + [{"n3": 101}, {"s1": "v/3"}]) == scan_answers(texts, EVENTS_N + [{"n3": 101},
                                                                                                     {"s1": "v/3"}])


def test_two_patterns_on_one_attribute_keep_their_own_bits_across_a_merge():
    """LIKE/MATCHES rows differ only by their pattern id: a carried layout
    told them apart by attribute and operator alone once (both read one
    bit)."""
    index = Index(algorithm="apcm")
    index.add_many([1, 2], ["s0 LIKE 'a%'", "n0 = 1"])
    index.add_many(list(range(10, 30)), [f"n1 = {i}" for i in range(20)])      # so that two bits stay overflow
    index.merge()
    apcm_of(index)
    index.add_many([3, 4], ["s0 LIKE 'b%'", "s0 MATCHES 'c$' AND n0 = 1"])
    index.merge()
    assert apcm_of(index).layout_rebuilt is False
    events = [{"s0": "ab"}, {"s0": "bb"}, {"s0": "abc", "n0": 1}, {"s0": "bc", "n0": 1}]
    assert answers(index, events) == [[1], [3], [1, 2, 4], [2, 3, 4]]


def test_a_saved_index_keeps_its_matching_options_and_its_tree(tmp_path, monkeypatch):
    w = begen(400, 64, dims=20, similarity=0.8, seed=3)
    index = Index(algorithm="apcm", options={"variant": "pcm", "cluster_size": 4, "threshold": 1})
    index.add_many(w.subscriptions)
    index.merge()
    want = answers(index, w.events)
    index.save(tmp_path / "a.bexidx")
    loaded = Index.load(tmp_path / "a.bexidx")
    assert loaded.options == {"variant": "pcm", "cluster_size": 4, "threshold": 1}
    # another matching variant on load reuses the saved tree: no build
    from engine.algorithms import betree
    monkeypatch.setattr(betree.BETreeMatcher, "__init__", lambda *a, **k: pytest.fail("built the tree again"))
    other = Index.load(tmp_path / "a.bexidx", options={"variant": "bitmap"})
    assert apcm_of(other).options.variant == "bitmap"
    assert answers(loaded, w.events) == answers(other, w.events) == want


# ====================================================== stream re-ordering
def _stream(similarity, n_events=512, seed=0):
    return begen(600, n_events, dims=40, similarity=similarity, seed=seed)


def _reorder(w, reorderer, compress_all=False):
    index = Index(algorithm="apcm")
    index.add_many(w.subscriptions)
    m = apcm_of(index)
    from engine import events as event_batches
    batch = event_batches.encode_events(w.events, index._schema, "raise")
    t = m.tree
    keys = event_keys(batch.value, batch.attr, t.string_attr, t.str_map)
    return batch, reorderer.clusters(batch.offsets, batch.attr, keys, compress_all=compress_all)


def test_osr_clusters_similar_events_within_the_capacity():
    """Each buffered batch's clusters are the l-nodes of a BE-Tree over its
    events: a permutation of the batch within each buffered batch, every
    compressed cluster at most the capacity, of at least ``threshold``
    similarity, its members sharing the attributes of its p-nodes."""
    w = _stream(0.9, n_events=1536)
    r = Reorderer(batch_size=1024, cluster_size=8, threshold=2, adaptive=False)
    batch, cl = _reorder(w, r)
    n = batch.n_events
    assert sorted(cl.perm.tolist()) == list(range(n))
    for b0 in range(0, n, 1024):          # no cluster crosses a buffered batch
        assert sorted(cl.perm[b0:b0 + 1024].tolist()) == list(range(b0, min(n, b0 + 1024)))
    sizes = np.diff(cl.off)
    assert sizes.max() <= 8
    assert (cl.similarity[sizes > 1] >= 2).all()
    assert cl.compressed_events() > n // 4          # a 90 %-similar stream: many events compressed
    low = _reorder(_stream(0.1, n_events=1536), Reorderer(1024, 8, 2, adaptive=False))[1]
    assert low.compressed_events() * 2 < cl.compressed_events()
    # PCM with re-ordering compresses every l-node of two or more, whatever its depth
    every = _reorder(_stream(0.1, n_events=1536), Reorderer(1024, 8, 2, adaptive=False), compress_all=True)[1]
    assert every.compressed_events() > n // 2
    # arrival-order runs (PCM without re-ordering)
    runs = arrival_runs(10, 4)
    assert runs.off.tolist() == [0, 4, 8, 10] and runs.perm.tolist() == list(range(10))


def test_the_cluster_size_adapts_to_the_clusters_found():
    """§VII-B: clusters filling the capacity double it for the next buffered
    batch, until the clusters found stop filling it (here: groups of about
    eight identical events), never past ADAPTIVE_CEILING; clusters well under
    it halve it back, never below the option's value."""
    r = Reorderer(batch_size=256, cluster_size=2, threshold=1, adaptive=True)
    same = begen(200, 256, dims=20, similarity=1.0, seed=1)
    _reorder(same, r)
    assert r.capacity == 4
    seen = []
    for _ in range(8):
        cl = _reorder(same, r)[1]
        assert np.diff(cl.off).max() <= min(seen[-1] if seen else 4, ADAPTIVE_CEILING)
        seen.append(r.capacity)
    assert 8 <= seen[-1] <= ADAPTIVE_CEILING and seen[-1] == seen[-2] == seen[-3]     # settled
    fixed = Reorderer(batch_size=256, cluster_size=2, threshold=1, adaptive=False)
    _reorder(same, fixed)
    assert fixed.capacity == 2
    # a dissimilar stream brings it back down, not below the option
    r2 = Reorderer(batch_size=256, cluster_size=4, threshold=2, adaptive=True)
    r2.capacity = 32
    for _ in range(4):
        _reorder(_stream(0.0, n_events=256), r2)
    assert 4 <= r2.capacity < 32




def test_events_sharing_a_key_are_partitioned_without_a_chain_of_splits():
    """Events' keys are points, and many share one: the forced split rule
    halves such a bucket level by level down to the atomic depth (64), two
    c-nodes a level.  The re-ordering trees partition it at once instead
    (``equal_keys_partition``): a tree a fraction of the size, no bucket
    near the atomic depth, and the same p-nodes on the events' paths
    (the similarity), so about the same events compressed."""
    from gpu_kernels.betree.tree import DynamicTree

    w = begen(2000, 1024, seed=0)
    batch, _ = _reorder(w, Reorderer(batch_size=len(w.events)))
    t = apcm_of(Index(algorithm="apcm")).tree
    keys = event_keys(batch.value, batch.attr, t.string_attr, t.str_map)
    tree_keys = (batch.offsets.astype(np.int64), batch.attr.astype(np.int64), keys, keys)
    sizes = {}
    for shortcut in (False, True):
        tree = DynamicTree(batch.n_events, tree_keys, int(batch.attr.max()) + 1, 8, 2, equal_keys_partition=shortcut)
        tree.insert(np.arange(batch.n_events, dtype=np.int64))
        flat = tree.freeze()
        assert sorted(flat.leaf_unit.tolist()) == list(range(batch.n_events))
        sizes[shortcut] = (len(flat.c_depth), int(flat.c_depth.max()))
    assert sizes[True][0] * 10 < sizes[False][0] and sizes[True][1] < 48 <= sizes[False][1]
    clustered = Reorderer(batch_size=1024, cluster_size=8, threshold=2, adaptive=False).clusters(
        batch.offsets, batch.attr, keys)
    assert clustered.compressed_events() > batch.n_events // 4


def test_buffered_batches_are_clustered_in_waves_over_threads():
    """Buffered batches are independent trees: clustered ``threads`` at a
    time, the clusters are those of one thread, batch by batch (adaptive
    size off); with the adaptive size, a wave's batches share the capacity
    the wave started with and the size adapts once per wave."""
    def keyed(w):
        batch, _ = _reorder(w, Reorderer(batch_size=len(w.events)))
        t = apcm_of(Index(algorithm="apcm")).tree
        return batch, event_keys(batch.value, batch.attr, t.string_attr, t.str_map)

    batch, keys = keyed(_stream(0.9, n_events=1536))
    one = Reorderer(batch_size=128, cluster_size=4, threshold=2, adaptive=False).clusters(
        batch.offsets, batch.attr, keys, threads=1)
    assert one.compressed_events() > 100
    for threads in (2, 5, 16):
        many = Reorderer(batch_size=128, cluster_size=4, threshold=2, adaptive=False).clusters(
            batch.offsets, batch.attr, keys, threads=threads)
        assert all(np.array_equal(x, y) for x, y in zip(many, one)), threads
    # adaptive: 12 buffered batches of groups of about ten identical events fill their clusters; one
    # thread doubles the capacity batch after batch, twelve threads once (one wave)
    batch, keys = keyed(begen(200, 1536, dims=20, similarity=1.0, sorted_stream=True, seed=1))
    seq = Reorderer(batch_size=128, cluster_size=2, threshold=1, adaptive=True)
    wave = Reorderer(batch_size=128, cluster_size=2, threshold=1, adaptive=True)
    seq.clusters(batch.offsets, batch.attr, keys, threads=1)
    clusters = wave.clusters(batch.offsets, batch.attr, keys, threads=12)
    assert seq.capacity >= 8 and wave.capacity == 4
    assert np.diff(clusters.off).max() == 2          # every batch of the wave at the starting capacity


def test_clusters_beyond_64_members_up_to_the_option():
    """Fig. 9(b) goes to clusters of 128: a stream of two groups of 150
    identical events clustered at ``cluster_size=128`` gives clusters of
    128 members (an l-node of 150 cut at the option), matched exactly; the
    adaptive size grows on its own only to ADAPTIVE_CEILING, but from an
    option above it, up to the option; past MAX_MEMBERS the option is
    refused."""
    assert MAX_MEMBERS <= 64 * C.MEMBER_WORDS          # the leaf scans' member masks hold every member
    w = begen(300, 300, dims=6, cardinality=6, sub_size=2, event_size=4, similarity=1.0, group_size=150,
              sorted_stream=True, match_prob=0.3, seed=3)
    scan = Index(algorithm="scan")
    scan.add_many(w.subscriptions)
    want = answers(scan, w.events)
    assert sum(map(len, want)) > 1000
    for options in ({"variant": "pcm", "cluster_size": MAX_MEMBERS, "threshold": 0, "adaptive": False,
                     "batch_size": 300},
                    {"variant": "apcm", "cluster_size": 100, "threshold": 1},
                    {"variant": "pcm", "cluster_size": MAX_MEMBERS, "unroll": False, "batch_size": 300}):
        index = Index(algorithm="apcm", options=options)
        index.add_many(w.subscriptions)
        matcher = apcm_of(index)
        assert answers(index, w.events) == want, options
        sizes = np.diff(matcher.last_clusters.off)
        assert 64 < sizes.max() <= options["cluster_size"], options
    grown = Reorderer(batch_size=300, cluster_size=100, threshold=1, adaptive=True)
    batch, _ = _reorder(w, grown)
    assert grown.capacity == 100           # full clusters, but already at the option (> ADAPTIVE_CEILING)
    small = Reorderer(batch_size=300, cluster_size=32, threshold=1, adaptive=True)
    for _ in range(3):
        _reorder(w, small)
    assert small.capacity == ADAPTIVE_CEILING
    with pytest.raises(ValueError, match=rf"cluster_size must be an integer in \[1, {MAX_MEMBERS}\]"):
        Index(algorithm="apcm", options={"cluster_size": MAX_MEMBERS + 1})


# ================================================================ variants
VARIANTS = [{}, {"variant": "pcm"}, {"variant": "pcm", "reorder": False}, {"variant": "pcm", "parallel_paths": False},
            {"variant": "pcm", "unroll": False}, {"variant": "parallel"}, {"variant": "bitmap"},
            {"cluster_size": 1}, {"cluster_size": 64, "threshold": 0}, {**DEEP_PCM, "batch_size": 16},
            # over OpIndex's lists
            {"over": "opindex"}, {"over": "opindex", "variant": "pcm"}, {"over": "opindex", "variant": "parallel"},
            {"over": "opindex", "variant": "bitmap"}, {"over": "opindex", "cluster_size": 64, "threshold": 0},
            {"over": "opindex", "variant": "pcm", "reorder": False, "cluster_size": 3}]


@pytest.mark.parametrize("similarity", [0.2, 0.9])
def test_every_variant_gives_scans_answers_on_similar_streams(similarity):
    """The ablations of §VII (Bitmap, Parallel, C, C-U, C-U-PP, C-U-PP-RE,
    A-PCM), cluster sizes from 1 to 64, buffered batches smaller than the
    batch: the exact per-event answers, whatever the clustering."""
    w = begen(800, 300, dims=30, similarity=similarity, seed=7)
    want = scan_answers(w.subscriptions, w.events)
    assert sum(map(len, want)) > 50
    for options in VARIANTS:
        index = Index(algorithm="apcm", options=options)
        index.add_many(w.subscriptions)
        assert answers(index, w.events) == want, options


# ================================================ over OpIndex's lists
#: every unit kind the counting meets: IS NULL alone and beside bits (no entry for it), a tautology under
#: three-valued logic, more predicates with bits than a counter counts (checked every cluster instead)
WIDE = " AND ".join(f"n0 > {-i - 1}" for i in range(300))
OVER_EXPRESSIONS = EXPRESSIONS + LEAF_CHECKS + BOUNDS_EXPRESSIONS + [
    "n2 IS NULL", "n1 IS NULL AND s0 IS NULL", "n0 IS NULL OR n0 IS NOT NULL", WIDE, f"({WIDE}) AND n1 IS NULL"]


def test_counting_lists_are_opindex_pivot_partition():
    """Each unit's predicates with a bit are entries of the lists of one
    pivot -- the least frequent of its attributes (OpIndex eq. 1) -- one
    list per attribute, under the predicate's slot; the entry carries the
    unit's count; units without entries, or with more than a counter
    holds, are checked every cluster."""
    index = Index(algorithm="apcm", options={"over": "opindex"})
    index.add_many(list(range(len(OVER_EXPRESSIONS))), OVER_EXPRESSIONS)
    index.merge()
    m = apcm_of(index)
    lists, units = m.counting, m.tree.units
    slots = m.layout.pred_slot[units.pids]
    attrs = units.rows.attr[units.pids].astype(np.int64)
    frequency = np.bincount(attrs[slots != NULL_SLOT])
    pivot_of_list = np.repeat(np.arange(len(lists.pivot_off) - 1), np.diff(lists.pivot_off))
    entries = {}
    for r in range(len(lists.pa_attr)):
        for k in range(lists.pa_off[r], lists.pa_off[r + 1]):
            code = int(lists.entry_unit[k])
            u, count = code >> counting.NEED_BITS, code & counting.NEED_MASK
            entries.setdefault(u, []).append((int(pivot_of_list[r]), int(lists.pa_attr[r]), int(lists.entry_slot[k]),
                                              count))
        assert np.all(np.diff(lists.pa_attr[lists.pivot_off[pivot_of_list[r]]:lists.pivot_off[pivot_of_list[r] + 1]])
                      > 0)
    always = set(lists.always.tolist())
    assert len(always) >= 4
    for u in range(len(units)):
        own = [(int(a), int(s)) for a, s in zip(attrs[units.offsets[u]:units.offsets[u + 1]],
                                                slots[units.offsets[u]:units.offsets[u + 1]]) if s != NULL_SLOT]
        if not own or len(own) > counting.NEED_MASK:
            assert u in always and u not in entries
            continue
        assert u not in always
        pivots = {p for p, _, _, _ in entries[u]}
        assert len(pivots) == 1
        pivot = pivots.pop()
        least = min(frequency[a] for a, _ in own)
        assert frequency[pivot] == least and pivot == min(a for a, _ in own if frequency[a] == least)
        assert sorted((a, s) for _, a, s, _ in entries[u]) == sorted(own)
        assert {c for _, _, _, c in entries[u]} == {len(own)}


@pytest.mark.parametrize("options", [{"variant": "pcm", "cluster_size": 2, "threshold": 0},
                                     {"variant": "pcm", "cluster_size": 8, "threshold": 0, "reorder": False},
                                     {"variant": "parallel"}, {}])
def test_over_opindex_gives_scans_answers_on_every_unit_kind(options):
    """Bounds, long shared prefixes, non-ASCII, NUL, IS NULL, absent
    attributes, constant TRUE, a unit wider than a counter: the exact
    answers compressed or not."""
    events = SIMILAR_EVENTS + BOUNDS_EVENTS + [{"n0": 1}, {"n0": 1, "n1": 0}]
    ids = list(range(len(OVER_EXPRESSIONS)))
    want = scan_answers(dict(zip(ids, OVER_EXPRESSIONS)), events)
    index = Index(algorithm="apcm", options={"over": "opindex", **options})
    index.add_many(ids, OVER_EXPRESSIONS)
    index.merge()
    assert len(apcm_of(index).tree.units) >= len(ids)
    assert answers(index, events) == want
    assert any(ids[OVER_EXPRESSIONS.index(f"({WIDE}) AND n1 IS NULL")] in got for got in want)


def test_counters_start_afresh_when_a_task_has_used_every_mark(monkeypatch):
    """A counter names the cluster it counts for by a mark of 23 bits; a
    task past the last mark clears its counters and starts again (here
    after every 2 clusters) -- the answers do not change."""
    w = begen(600, 200, dims=20, similarity=0.8, seed=5)
    want = scan_answers(w.subscriptions, w.events)
    monkeypatch.setattr(counting, "MAX_MARK", 2)
    for options in ({"variant": "parallel"}, {"variant": "pcm", "cluster_size": 4, "threshold": 0}):
        index = Index(algorithm="apcm", options={"over": "opindex", **options})
        index.add_many(w.subscriptions)
        index.merge()
        assert answers(index, w.events) == want


def test_over_is_a_cpu_option_of_two_values():
    with pytest.raises(ValueError, match="over must be one of betree, opindex, not 'pstree'"):
        Index(algorithm="apcm", options={"over": "pstree"})
    with pytest.raises(TypeError, match="option 'over' of algorithm 'apcm' applies to backend 'cpu', not 'cuda'"):
        registry.get("apcm").make_options({"over": "opindex"}, "cuda")


def test_a_saved_index_keeps_over_and_loads_under_the_other_index(tmp_path):
    """``over`` is saved; loading with the other value reuses the saved
    BE-Tree and builds (or drops) the lists, the answers unchanged."""
    w = begen(400, 64, dims=20, similarity=0.8, seed=3)
    index = Index(algorithm="apcm", options={"over": "opindex", "variant": "pcm"})
    index.add_many(w.subscriptions)
    index.merge()
    want = answers(index, w.events)
    index.save(tmp_path / "o.bexidx")
    loaded = Index.load(tmp_path / "o.bexidx")
    assert loaded.options == {"variant": "pcm", "over": "opindex"} and apcm_of(loaded).counting is not None
    other = Index.load(tmp_path / "o.bexidx", options={"over": "betree"})
    assert apcm_of(other).counting is None
    assert answers(loaded, w.events) == answers(other, w.events) == want
