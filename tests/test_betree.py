"""BE-Tree (Sadoghi, Jacobsen, SIGMOD 2011): the structure the paper defines, not only its answers.

The shared conformance suite checks ``betree``'s answers on every life
cycle (with its default options and with one-unit leaves); this file checks
what the answers cannot show: Table 1's intervals on keys, the key order,
the tree's properties (§4.1) and the invariance (§4.3) on random workloads,
a worked insertion down to an atomic bucket, deletion back to an empty
root, updates that never rebuild, snapshot safety, and saved trees.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest

from engine import Index
from engine.algorithms.betree import BETreeMatcher, interval_keys
from engine.algorithms.options import BETreeOptions, max_cap_for
from engine.algorithms.residual import ResidualMatcher
from engine.algorithms.units import PredicateRows
from engine.errors import IndexFileError
from engine.workloads import begen
from gpu_kernels import opcodes
from gpu_kernels.betree.layout import ATOMIC, KEY_MAX, KEY_MIN, BETreeArrays, float_keys
from gpu_kernels.betree.tree import DynamicTree


def betree_of(index: Index) -> BETreeMatcher:
    """The index's current BE-Tree matcher (built by a match if none is yet)."""
    index.match({})
    matcher = index._matcher
    return matcher.native if isinstance(matcher, ResidualMatcher) else matcher


def answers(index: Index, events) -> list[list[int]]:
    return [m.tolist() for m in index.match_batch(events)]


# ------------------------------------------------------------------- keys
def test_keys_order_floats_as_their_values():
    values = np.array([-1e300, -2.0 ** 53, -2.5, -1.0, -5e-324, -0.0, 0.0, 5e-324, 1e-300, 0.5, 1.0, 2.0 ** 53,
                       1e300])
    keys = float_keys(values)
    assert keys.dtype == np.uint64
    assert keys[5] == keys[6]                          # -0.0 is 0.0
    order = np.delete(keys, 5)
    assert (order[1:] > order[:-1]).all()
    assert KEY_MIN < keys.min() and keys.max() < KEY_MAX


def _rows(op, lo, hi=None, sets=()):
    """A one-row extended predicate table on attribute 0."""
    sets = np.asarray(sets, np.float64)
    return PredicateRows(np.array([0], np.int32), np.array([op], np.int8), np.array([lo], np.float64),
                         np.array([lo if hi is None else hi], np.float64), np.array([-1], np.int64),
                         np.array([0, len(sets)], np.int64), sets)


@pytest.mark.parametrize("string", [False, True])
def test_table_1_intervals(string):
    """Table 1 on keys: ``< v`` is ``[v_min, v - 1]`` (the key below v's; a
    string bound stays closed), ``!=`` and ``NOT IN`` the whole domain,
    ``IN`` its first to last value, ``IS NULL`` no interval."""
    k = float_keys(np.array([3.0, 5.0, 8.0]))
    kind = np.array([1 if string else 0], np.uint8)
    none = np.zeros(0)
    one = np.uint64(0 if string else 1)

    def interval(rows):
        low, high, has = interval_keys(rows, kind, none)
        return int(low[0]), int(high[0]), bool(has[0])
    assert interval(_rows(opcodes.EQ, 5.0)) == (k[1], k[1], True)
    assert interval(_rows(opcodes.LT, 5.0)) == (KEY_MIN, k[1] - one, True)
    assert interval(_rows(opcodes.LE, 5.0)) == (KEY_MIN, k[1], True)
    assert interval(_rows(opcodes.GT, 5.0)) == (k[1] + one, KEY_MAX, True)
    assert interval(_rows(opcodes.GE, 5.0)) == (k[1], KEY_MAX, True)
    assert interval(_rows(opcodes.BETWEEN, 3.0, 8.0)) == (k[0], k[2], True)
    assert interval(_rows(opcodes.IN, 0.0, sets=(3.0, 5.0, 8.0))) == (k[0], k[2], True)
    for op in (opcodes.NE, opcodes.NOT_IN, opcodes.NOT_BETWEEN, opcodes.LIKE, opcodes.NOT_LIKE, opcodes.MATCHES,
               opcodes.IS_NOT_NULL):
        assert interval(_rows(op, 5.0, sets=(5.0,))) == (KEY_MIN, KEY_MAX, True)
    assert interval(_rows(opcodes.IS_NULL, 0.0))[2] is False


def test_table_4_and_the_options():
    assert [max_cap_for(p) for p in (0.0001, 0.005, 0.01, 0.05, 0.1, 0.35)] == [5, 5, 20, 20, 160, 160]
    assert (BETreeOptions().max_cap, BETreeOptions().min_size) == (20, 3)
    with pytest.raises(ValueError):
        BETreeOptions(max_cap=0)
    with pytest.raises(ValueError):
        Index(algorithm="betree", options={"min_size": -1})
    with pytest.raises(ValueError):
        max_cap_for(1.5)


# -------------------------------------------------------- the tree (§4.1, §4.3)
def _parents(tree: BETreeArrays):
    """Per c-node: (parent c-node, p-node it hangs from or -1, its directory's p-node)."""
    n = len(tree.c_depth)
    parent = np.full(n, -1)
    via_p = np.full(n, -1)
    level = np.full(n, -1)
    prefix = np.zeros(n, dtype=object)
    for c in range(n):
        for half in range(2):
            h = tree.c_child[2 * c + half]
            if h >= 0:
                parent[h], level[h], prefix[h] = c, level[c], prefix[c] * 2 + half
        for k in range(tree.c_pdir[c], tree.c_pdir[c + 1]):
            top = tree.p_top[k]
            parent[top], via_p[top], level[top], prefix[top] = c, k, k, 0
    return parent, via_p, level, prefix


def _encloses(depth, prefix, lo, hi):
    return depth == 0 or (lo >> (64 - depth) == prefix and hi >> (64 - depth) == prefix)


def check_tree(matcher: BETreeMatcher) -> None:
    """§4.1's properties and §4.3's invariance on a flattened tree."""
    tree, units = matcher.tree, matcher.units
    k_off, k_attr, k_lo, k_hi = matcher.keys
    parent, via_p, level, prefix = _parents(tree)
    n = len(tree.c_depth)
    # 1. the root is a c-node (0, in no directory); 3-4. children of c-nodes are p-nodes or halves
    assert level[0] == -1 and parent[0] == -1 and (parent[1:] >= 0).all()
    # every leaf within its capacity, extended leaves by whole multiples of max_cap (§4.2)
    sizes = np.diff(tree.c_leaf)
    assert (sizes <= tree.c_cap).all() and (tree.c_cap % matcher.max_cap == 0).all()
    for c in range(n):
        # the p-node attributes on c's path: each chosen at most once (§4.2)
        path, d = [], c
        while d > 0:
            if via_p[d] >= 0:
                path.append(int(tree.p_attr[via_p[d]]))
            d = parent[d]
        assert len(path) == len(set(path)), f"c-node {c}: attribute chosen twice on its path {path}"
        for u in tree.leaf_unit[tree.c_leaf[c]:tree.c_leaf[c + 1]]:
            keys = {int(k_attr[j]): (int(k_lo[j]), int(k_hi[j])) for j in range(k_off[u], k_off[u + 1])}
            # every unit below a p-node constrains its attribute, within every bucket on its path
            d = c
            while d > 0:
                attr = int(tree.p_attr[level[d]])
                assert attr in keys
                assert _encloses(int(tree.c_depth[d]), prefix[d], *keys[attr])
                d = parent[d]
            # the invariance: no half of its bucket encloses it (it is in the smallest one)
            if level[c] >= 0:
                lo, hi = keys[int(tree.p_attr[level[c]])]
                for half in range(2):
                    h = tree.c_child[2 * c + half]
                    assert h < 0 or not _encloses(int(tree.c_depth[h]), prefix[h], lo, hi)
            # no p-node of its own c-node applies to it (Algorithm 3 would have pushed it down)
            own = set(tree.p_attr[tree.c_pdir[c]:tree.c_pdir[c + 1]].tolist())
            assert not own & set(keys) - set(path)
    # atomic buckets have no halves
    atomic = np.flatnonzero(tree.c_depth == ATOMIC)
    assert (tree.c_child.reshape(-1, 2)[atomic] < 0).all()
    assert len(tree.leaf_unit) == int(matcher._possible.sum()) == len(units)


def _workload(n_subs=2500, seed=0, op_class="high"):
    return begen(n_subs, 150, dims=30, cardinality=40, op_class=op_class, match_prob=0.02, seed=seed)


@pytest.mark.parametrize("max_cap,min_size", [(1, 1), (5, 3), (20, 3)])
def test_the_tree_keeps_the_papers_properties(max_cap, min_size):
    w = _workload()
    idx = Index(algorithm="betree", options={"max_cap": max_cap, "min_size": min_size})
    idx.add_many(w.subscriptions)
    ref = Index(algorithm="scan")
    ref.add_many(w.subscriptions)
    assert answers(idx, w.events) == answers(ref, w.events)
    matcher = betree_of(idx)
    check_tree(matcher)
    stats = matcher.statistics()
    assert stats["p_nodes"] > 10 and stats["c_nodes"] > stats["p_nodes"]
    assert stats["verified_predicates"] <= stats["unit_predicates"]


def test_an_insertion_down_to_an_atomic_bucket():
    """Three units on ``a = 1`` overflow the root (max_cap 2): the root is
    partitioned on ``a``; the top bucket overflows and is split half by
    half down to the atomic bucket of 1's key (the forced split rule), which
    is then partitioned on ``b`` (constrained by 2 >= min_size units).  The
    atomic bucket decides ``a = 1``: it is subsumed, not checked again."""
    idx = Index(algorithm="betree", options={"max_cap": 2, "min_size": 2})
    idx.add_many([1, 2, 3], ["a = 1", "a = 1 AND b = 2", "a = 1 AND b BETWEEN 1 AND 3"])
    idx.merge()
    assert answers(idx, [{"a": 1, "b": 2}, {"a": 1}, {"a": 2, "b": 2}]) == [[1, 2, 3], [1], []]
    m = betree_of(idx)
    tree = m.tree
    assert tree.p_attr.tolist() == [0, 1]                   # a at the root, b under a's atomic bucket
    assert int(np.diff(tree.c_leaf)[0]) == 0                # the root's l-node emptied
    atomic = int(np.flatnonzero(tree.c_depth == ATOMIC)[0])
    assert tree.c_pdir[atomic + 1] - tree.c_pdir[atomic] == 1
    assert tree.leaf_unit[tree.c_leaf[atomic]:tree.c_leaf[atomic + 1]].tolist() == [0]
    assert m.statistics()["verified_predicates"] == 2        # the b's only: a = 1 is subsumed
    check_tree(m)


@pytest.mark.parametrize("max_cap", [1, 2])
def test_an_overflow_cascading_past_the_free_nodes_grows_the_arrays(max_cap):
    """Identical subscriptions over many attributes: one overflow partitions
    attribute after attribute, each down a chain of 64 splits -- thousands
    of c-nodes from one insertion, more than any fixed reserve per unit.
    The cascade stops when its nodes do not fit, the arrays grow and it
    goes on (it once wrote past them: heap corruption, then a crash)."""
    text = " AND ".join(f"a{k} = {k}" for k in range(12))
    idx = Index(algorithm="betree", options={"max_cap": max_cap, "min_size": 1})
    idx.add_many(list(range(6)), [text] * 6)
    idx.merge()
    m = betree_of(idx)
    check_tree(m)
    assert m.statistics()["c_nodes"] > 12 * 64          # past the 64 c-nodes a new tree starts with, many times
    event = {f"a{k}": k for k in range(12)}
    assert answers(idx, [event, {**event, "a11": 0}]) == [list(range(6)), []]
    # the same through the tree A-PCM's re-ordering builds over events (the crash's first witness)
    tree = DynamicTree(6, (np.arange(0, 73, 12), np.tile(np.arange(12), 6), np.ones(72, np.uint64),
                           np.ones(72, np.uint64)), 12, max_cap, 1)
    tree.insert(np.arange(6))
    flat = tree.freeze()
    assert sorted(flat.leaf_unit.tolist()) == list(range(6))


# ------------------------------------------------------------------ dynamics
def test_updates_never_rebuild_and_deleting_everything_empties_the_tree(monkeypatch):
    w = _workload(2000, seed=1)
    idx = Index(algorithm="betree", options={"max_cap": 3, "min_size": 2})
    idx.add_many(w.subscriptions)
    ref = Index(algorithm="scan")
    ref.add_many(w.subscriptions)
    before = betree_of(idx)
    monkeypatch.setattr(BETreeMatcher, "build", classmethod(lambda cls, *a: 1 / 0))
    rng = np.random.default_rng(7)
    ids = idx.ids()
    for round_ in range(3):
        gone = rng.choice(idx.ids(), 400, replace=False)
        for i in gone:
            idx.remove(int(i))
            ref.remove(int(i))
        back = w.subscriptions.filter(pc.is_in(w.subscriptions["sub_id"], pa.array(gone[:200])))
        idx.add_many(back)
        ref.add_many(back)
        idx.merge()
        ref.merge()
        assert answers(idx, w.events) == answers(ref, w.events), f"round {round_}"
        check_tree(betree_of(idx))
    assert betree_of(idx).merges == 3 and betree_of(idx) is not before
    for i in idx.ids():
        idx.remove(int(i))
    idx.merge()
    assert len(idx) == 0 and len(ids)
    idx.add(1, "a0 = 1")          # an empty segment builds nothing either: the next add derives again
    assert answers(idx, [{"a0": 1}]) == [[1]]
    stats = betree_of(idx).statistics()
    assert (stats["c_nodes"], stats["p_nodes"]) == (1, 0)


def test_deletion_merges_halves_back_and_removes_empty_nodes():
    """Removing the units that made a bucket split merges the halves back
    into it (the merge rule: up each chain of single halves, 64 deep for an
    ``=``) or removes the emptied nodes upward.  (min_size 20: the atomic
    buckets stay extended l-nodes, not partitioned on b.)"""
    texts = {i: f"a = {i % 4} AND b = {i}" for i in range(40)}
    idx = Index(algorithm="betree", options={"max_cap": 2, "min_size": 20})
    idx.add_many(list(texts), list(texts.values()))
    idx.merge()
    grown = betree_of(idx).statistics()
    for i in range(38):
        idx.remove(i)
    idx.merge()
    shrunk = betree_of(idx).statistics()
    assert shrunk["c_nodes"] < grown["c_nodes"] / 4 and shrunk["p_nodes"] == grown["p_nodes"] == 1
    assert answers(idx, [{"a": 2, "b": 38}, {"a": 3, "b": 39}, {"a": 2, "b": 2}]) == [[38], [39], []]
    check_tree(betree_of(idx))


def test_l_node_recycling_reinserts_what_ranks_below_theta():
    """§5: at a merge, p-nodes whose rank (gain minus the loss measured on
    the events of the last match) is below θ have their units re-inserted.
    θ = 0 (the paper's) recycles nothing on this workload; a θ above every
    rank recycles the outermost p-nodes -- and the answers stay exact."""
    w = _workload(2000, seed=5)
    ref = Index(algorithm="scan")
    ref.add_many(w.subscriptions)
    want = answers(ref, w.events)
    counts = {}
    for theta in (0.0, 1e18, None):
        idx = Index(algorithm="betree", options={"max_cap": 2, "min_size": 1, "theta": theta})
        idx.add_many(w.subscriptions)
        assert answers(idx, w.events) == want          # the match keeps its first events as feedback
        idx.remove(int(idx.ids()[0]))
        idx.merge()
        assert answers(idx, w.events) == [[i for i in m if i != int(ref.ids()[0])] for m in want]
        stats = betree_of(idx).statistics()
        counts[theta] = (stats["recycled_p_nodes"], stats["recycled_units"])
        check_tree(betree_of(idx))
    assert counts[0.0] == (0, 0) and counts[None] == (0, 0)
    outermost = int(np.diff(betree_of(idx).tree.c_pdir)[0])
    assert counts[1e18][0] > 0 and counts[1e18][1] > 1000, (counts, outermost)


def test_thaw_then_freeze_gives_the_same_tree():
    w = _workload(1500, seed=2)
    idx = Index(algorithm="betree", options={"max_cap": 2, "min_size": 1})
    idx.add_many(w.subscriptions)
    m = betree_of(idx)
    again = DynamicTree.thawed(m.tree, np.arange(len(m.units)), len(m.units), m.keys, len(m.string_attr) + 1,
                               m.max_cap, m.min_size).freeze()
    for name in BETreeArrays._fields:
        assert np.array_equal(getattr(again, name), getattr(m.tree, name)), name


def test_a_merge_leaves_the_old_tree_untouched():
    """Snapshot safety: a merge derives a new tree from a copy; the matcher a
    match in flight holds keeps its arrays and its answers."""
    w = _workload(1500, seed=3)
    idx = Index(algorithm="betree", options={"max_cap": 2, "min_size": 1})
    idx.add_many(w.subscriptions)
    old = betree_of(idx)
    copies = [a.copy() for a in old.tree] + [a.copy() for a in old.leaf]
    old_answers = [m.tolist() for m in idx.match_batch(w.events)]
    for i in idx.ids()[:700]:
        idx.remove(int(i))
    idx.add_many([10 ** 9], ["a0 >= 0"])
    idx.merge()
    assert betree_of(idx) is not old
    for a, b in zip(list(old.tree) + list(old.leaf), copies):
        assert np.array_equal(a, b)
    segment = old.segment
    from engine import events as event_batches
    batch = event_batches.encode_events(w.events, idx._state.view, "raise")
    truth = event_batches.pattern_truth(batch, idx._state.view, segment.predicates.pattern_pairs())
    ev, ids = old.match(batch, truth, np.ones(len(segment), np.uint8), ids=segment.sub_ids)
    again = [[] for _ in range(w.n_events)]
    for e, i in zip(ev.tolist(), ids.tolist()):
        again[e].append(i)
    assert again == old_answers


def test_strings_new_to_the_dictionary_keep_the_tree_exact():
    """String keys are base codes: strings added after the build (between,
    before and after the old ones) go through the base-code map."""
    idx = Index(algorithm="betree", options={"max_cap": 1, "min_size": 1})
    ref = Index(algorithm="scan")
    first = {i: f"s = 'm{i:02d}' AND t < 'k'" for i in range(30)}
    for index in (idx, ref):
        index.add_many(list(first), list(first.values()))
        index.merge()
    events = [{"s": f"m{i:02d}", "t": t} for i in range(0, 30, 3) for t in ("a", "k", "z", "m05x")] + \
        [{"s": "m05x", "t": "a"}, {"s": "a", "t": "a"}, {"s": "zz"}]
    assert answers(idx, events) == answers(ref, events)
    later = {100 + i: text for i, text in enumerate(["s = 'm05x'", "s > 'm05' AND s < 'm06'", "s IN ('a', 'zz')",
                                                     "s BETWEEN 'm05x' AND 'm29'", "t = 'm05x'"])}
    for index in (idx, ref):
        index.add_many(list(later), list(later.values()))
        index.merge()
    assert answers(idx, events) == answers(ref, events)
    assert betree_of(idx).base_strings < idx.schema.n_strings      # derived, not rebuilt on the new strings


# --------------------------------------------------------------- saved trees
def _swap_far(tree: BETreeArrays) -> np.ndarray:
    """The leaf units with the first unit of the root's first p-node subtree
    swapped with the last leaf unit: a well-formed tree, wrongly placed."""
    units = tree.leaf_unit.copy()
    first = int(tree.c_leaf[int(tree.p_top[0])])
    units[first], units[-1] = units[-1], units[first]
    return units



def test_a_saved_tree_loads_without_building_and_crafted_trees_fail(tmp_path, monkeypatch):
    w = _workload(1200, seed=4)
    idx = Index(algorithm="betree", options={"max_cap": 2, "min_size": 1})
    idx.add_many(w.subscriptions)
    want = answers(idx, w.events)
    idx.save(tmp_path / "t.bexidx")
    with monkeypatch.context() as patch:
        patch.setattr(BETreeMatcher, "build", classmethod(lambda cls, *a: 1 / 0))
        loaded = Index.load(tmp_path / "t.bexidx")
        assert answers(loaded, w.events) == want
    tree = betree_of(idx).tree
    crafted = {
        "a child out of range": tree._replace(c_child=np.where(tree.c_child >= 0, tree.c_child + 10 ** 6,
                                                               -1).astype(np.int32)),
        "a leaf unit twice": tree._replace(leaf_unit=np.concatenate((tree.leaf_unit[:-1], tree.leaf_unit[:1]))),
        "an unsorted p-directory": tree._replace(p_attr=tree.p_attr[::-1].copy()),
        "a depth beyond 64": tree._replace(c_depth=np.where(np.arange(len(tree.c_depth)) == 1, 65,
                                                            tree.c_depth).astype(np.int16)),
        "two units swapped between leaves": tree._replace(leaf_unit=_swap_far(tree)),
    }
    for what, bad in crafted.items():
        monkeypatch.setattr(BETreeMatcher, "to_arrays", lambda self, bad=bad: (
            {"format": 1, "max_cap": 2, "min_size": 1, "dnf_limit": 256, "base_strings": self.base_strings,
             "units": len(self.units), "merges": 0}, dict(bad._asdict())))
        path = tmp_path / f"bad-{len(what)}.bexidx"
        idx.save(path)
        with pytest.raises(IndexFileError):
            Index.load(path)


def test_structures_handed_to_cuda_kernels_have_len_of_their_fields():
    # numba-cuda's launch on a real GPU flattens a NamedTuple argument and
    # asserts len(value) == its number of fields: a __len__ meaning "rows"
    # passes the simulator and fails on the device (it did, on an H100)
    from engine.algorithms.units import PredicateRows
    from gpu_kernels.betree.cuda import DeviceLeafArrays
    from gpu_kernels.betree.layout import BETreeArrays
    for kind in (PredicateRows, DeviceLeafArrays, BETreeArrays):
        value = kind(*(np.zeros(3) for _ in kind._fields))
        assert len(value) == len(kind._fields)
