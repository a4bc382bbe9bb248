"""The A-Tree flattened for matching: level-ordered CSR arrays.

:func:`flatten` turns the host DAG (:mod:`gpu_kernels.atree.dag`) and
the r-node of each subscription position into :class:`ATreeArrays`, what
:mod:`gpu_kernels.atree.cpu` reads.  Node ids are renumbered by (level,
creation order), so each level is one id range (``level_start``) and
parents come after their children.

:func:`leaf_index` adds the predicate index of the l-nodes (§5: "A-Tree is
compatible with all of these [predicate matching] algorithms"):
:class:`LeafIndex`, per attribute, the non-exact ``=``, ``IN``, ``<``,
``<=``, ``>``, ``>=`` and ``BETWEEN`` leaves sorted by key, so that the
CPU kernel finds the TRUE ones by binary search instead of evaluating
every leaf of the event's attributes; the other leaves stay in a list
evaluated one by one.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
from numba import njit

from gpu_kernels import opcodes
from gpu_kernels.atree.cpu import (BETWEEN_KEYS, EQ_KEYS, GE_KEYS, GT_KEYS, IN_KEYS, LE_KEYS, LT_KEYS, N_CLASSES,
                                   exact_nodes, node_levels)
from gpu_kernels.opcodes import AND, LEAF, OR, XNOR, XOR


class ATreeArrays(NamedTuple):
    kind: np.ndarray         # int8 [N] LEAF/AND/OR/XOR/XNOR
    level: np.ndarray        # int32 [N] (§4.1), ascending
    level_start: np.ndarray  # int64 [M + 2]: nodes of level L are [level_start[L], level_start[L + 1])
    child_off: np.ndarray    # int32 [N + 1] (int64 past 2**31 links: _offsets) children CSR (evaluation)
    child_idx: np.ndarray    # int32
    par_off: np.ndarray      # int32 [N + 1] (as child_off) propagation links CSR (child -> parents it reaches)
    par_idx: np.ndarray      # int32
    needs3: np.ndarray       # uint8 [N]: reads its children in three values (XOR/XNOR or below one)
    leaf_pred: np.ndarray    # int32 [N]: a leaf's predicate id in the segment, -1 otherwise
    attr_off: np.ndarray     # int64 [A + 1]: leaves by attribute (CSR)
    attr_leaf: np.ndarray    # int32
    absent_leaf: np.ndarray  # int32: leaves not NULL on an absent attribute (IS NULL; exact IS NOT NULL)
    sub_off: np.ndarray      # int32 [N + 1] (as child_off): subscription positions per r-node (CSR)
    sub_pos: np.ndarray      # int32

    @property
    def nbytes(self) -> int:
        return sum(int(a.nbytes) for a in self)


#: a leaf's rough chance of being TRUE, by operator: picks the access
#: child of an AND (§5.2.2: the child least often TRUE is linked, so the
#: AND is visited least often); the paper picks one at random.  The list
#: operators are rated as the patterns: a list holding one of some values
#: (or being empty) is rare like a string matching a pattern, the negations
#: common like NOT LIKE
_LEAF_ESTIMATE = np.full(opcodes.N_OPS, 0.5)
_LEAF_ESTIMATE[[opcodes.EQ]] = 0.02
_LEAF_ESTIMATE[[opcodes.IN, opcodes.LIKE, opcodes.MATCHES, opcodes.ONE_OF, opcodes.ALL_OF, opcodes.CONTAINS,
                opcodes.IS_EMPTY]] = 0.05
_LEAF_ESTIMATE[[opcodes.BETWEEN]] = 0.2
_LEAF_ESTIMATE[[opcodes.LT, opcodes.LE, opcodes.GT, opcodes.GE]] = 0.4
_LEAF_ESTIMATE[[opcodes.NE, opcodes.NOT_IN, opcodes.NOT_BETWEEN, opcodes.NOT_LIKE, opcodes.NOT_MATCHES,
                opcodes.IS_NOT_NULL, opcodes.NONE_OF, opcodes.NOT_ALL_OF, opcodes.NOT_CONTAINS,
                opcodes.IS_NOT_EMPTY]] = 0.6
_LEAF_ESTIMATE[[opcodes.IS_NULL]] = 0.9


@njit(nogil=True, cache=True)
def _links(kind, child_off, child_idx, needs3, leaf_estimate, on_demand):
    """Propagation links (child -> parent) and their count per child: every
    child of an OR, an XOR/XNOR or an exact AND; only the access child of
    a non-exact AND (propagation on demand, §5.2.2; every child without
    ``on_demand``)."""
    n = len(kind)
    estimate = np.empty(n, np.float64)
    link_parent = np.empty(len(child_idx), np.int64)
    link_child = np.empty(len(child_idx), np.int64)
    n_links = 0
    for node in range(n):
        op = kind[node]
        c0 = child_off[node]
        c1 = child_off[node + 1]
        if op == LEAF:
            estimate[node] = leaf_estimate[node]
            continue
        if op == AND:
            p = 1.0
            best = c0
            for k in range(c0, c1):
                p *= estimate[child_idx[k]]
                if estimate[child_idx[k]] < estimate[child_idx[best]]:
                    best = k
            estimate[node] = p
            if on_demand and not needs3[node]:
                link_parent[n_links] = node
                link_child[n_links] = child_idx[best]
                n_links += 1
                continue
        elif op == OR:
            q = 1.0
            for k in range(c0, c1):
                q *= 1.0 - estimate[child_idx[k]]
            estimate[node] = 1.0 - q
        else:
            estimate[node] = 0.5
        for k in range(c0, c1):
            link_parent[n_links] = node
            link_child[n_links] = child_idx[k]
            n_links += 1
    return link_parent[:n_links], link_child[:n_links]


def flatten(dag, roots: np.ndarray, pred_attr: np.ndarray, pred_op: np.ndarray, keys, *,
            zero_suppression: bool = True, on_demand: bool = True, pred_lo: np.ndarray | None = None) -> ATreeArrays:
    """The level-ordered arrays of ``dag`` (an :class:`~gpu_kernels.atree.dag.ATreeDag` or
    :class:`~gpu_kernels.atree.build.ArrayDag`: what its ``csr`` gives) whose subscription at position
    ``p`` is r-node ``roots[p]`` (a host node id); ``keys`` (the segment's
    :class:`~gpu_kernels.atree.build.PredicateKeys`) give a leaf's
    predicate id in the segment.  With
    ``pred_lo`` (the coded bounds) the leaves are numbered by (attribute,
    operator, bound): the TRUE leaves :func:`leaf_index` finds in one run
    of keys then have neighbouring ids, and their results neighbouring
    slots.

    The paper's matching optimisations as ablations (Figure 10):
    ``zero_suppression=False`` makes every node exact (``needs3``), so
    FALSE propagates as TRUE does -- every evaluated node reaches all its
    parents; ``on_demand=False`` links every child of an AND, not its
    access child alone.  Neither changes a result."""
    kinds, counts, child_idx, host_pid = dag.csr(keys)
    n_all = len(kinds)
    child_off = np.zeros(n_all + 1, np.int64)
    np.cumsum(counts, out=child_off[1:])
    level, settled = node_levels(child_off, child_idx)
    if not settled:
        raise AssertionError("A-Tree: the DAG has a cycle")
    live = np.flatnonzero(kinds >= 0)
    host_leaves = np.flatnonzero(kinds == LEAF)
    if (host_pid[host_leaves] < 0).any():
        raise AssertionError("A-Tree: a leaf's predicate is not in the segment")
    by = [level[live]]                                                 # (level, creation order) ...
    if pred_lo is not None:                                            # ... leaves by attribute, operator, bound
        attr_of, op_of, lo_of = np.zeros(n_all, np.int64), np.zeros(n_all, np.int64), np.zeros(n_all, np.float64)
        pids = host_pid[host_leaves]
        attr_of[host_leaves], op_of[host_leaves], lo_of[host_leaves] = pred_attr[pids], pred_op[pids], pred_lo[pids]
        by = [lo_of[live], op_of[live], attr_of[live]] + by
    order = live[np.lexsort(by)]
    new_id = np.full(n_all, -1, np.int64)
    new_id[order] = np.arange(len(order))
    n = len(order)
    kind = kinds[order]
    lv = level[order]
    c_counts = counts[order]
    c_off = np.zeros(n + 1, np.int64)
    np.cumsum(c_counts, out=c_off[1:])
    gather = np.repeat(child_off[:-1][order] - c_off[:-1], c_counts) + np.arange(int(c_off[-1]))
    c_idx = new_id[child_idx[gather]]
    if n and (c_idx < 0).any():
        raise AssertionError("A-Tree: a node links to a removed node")
    top = int(lv.max(initial=1))
    level_start = np.searchsorted(lv, np.arange(top + 2), side="left").astype(np.int64)
    needs3 = exact_nodes(kind, c_off, c_idx) if zero_suppression else np.ones(n, np.uint8)
    leaf_pred = np.full(n, -1, np.int64)
    leaves = np.flatnonzero(kind == LEAF)
    leaf_pred[leaves] = host_pid[order[leaves]]
    leaf_estimate = np.full(n, 0.5)
    leaf_estimate[leaves] = _LEAF_ESTIMATE[pred_op[leaf_pred[leaves]]]
    link_parent, link_child = _links(kind, c_off, c_idx, needs3, leaf_estimate, bool(on_demand))
    par_off = np.zeros(n + 1, np.int64)
    np.cumsum(np.bincount(link_child, minlength=n), out=par_off[1:])
    # each child's parents ascending: one int64 sort of (child, parent) packed (node ids < 2**31), numpy's SIMD
    # sort, not a lexsort of two columns (0.5 s for W5's 4.6 M links at 1 M)
    par_idx = np.sort((link_child.astype(np.int64) << 32) | link_parent.astype(np.int64)) & 0xFFFFFFFF
    leaf_attr = pred_attr[leaf_pred[leaves]].astype(np.int64)
    n_attrs = int(leaf_attr.max(initial=-1)) + 1
    by_attr = np.argsort(leaf_attr, kind="stable")
    attr_off = np.zeros(n_attrs + 1, np.int64)
    np.cumsum(np.bincount(leaf_attr, minlength=n_attrs), out=attr_off[1:])
    attr_leaf = leaves[by_attr]
    leaf_op = pred_op[leaf_pred[leaves]]
    absent = leaves[(leaf_op == opcodes.IS_NULL) | ((leaf_op == opcodes.IS_NOT_NULL) & (needs3[leaves] != 0))]
    root = new_id[np.asarray(roots, np.int64)]
    if len(root) and (root < 0).any():
        raise AssertionError("A-Tree: a subscription's r-node was removed")
    sub_pos = np.argsort(root, kind="stable")
    sub_off = np.zeros(n + 1, np.int64)
    np.cumsum(np.bincount(root, minlength=n), out=sub_off[1:])
    return ATreeArrays(kind, lv.astype(np.int32), level_start, _offsets(c_off), c_idx.astype(np.int32),
                       _offsets(par_off), par_idx.astype(np.int32), needs3, leaf_pred.astype(np.int32), attr_off,
                       attr_leaf.astype(np.int32), absent.astype(np.int32), _offsets(sub_off),
                       sub_pos.astype(np.int32))


def _offsets(offsets: np.ndarray) -> np.ndarray:
    """A per-node CSR offset array as int32 where its total fits, which is
    always but past 2**31 links (W5 at 1 M: 1.43 M nodes, 11 MiB an array
    fewer).  The kernels read either; the cuda twin casts to its dtypes."""
    return offsets.astype(np.int32) if int(offsets[-1]) <= np.iinfo(np.int32).max else offsets


#: the key class (:class:`LeafIndex`) of each operator, -1 for those evaluated one by one -- the list
#: operators among them: the event list decides them (the batch's list table, read by the entry's token),
#: not a value that keys could be searched by
_CLASS_OF_OP = np.full(opcodes.N_OPS, -1, np.int64)
_CLASS_OF_OP[[opcodes.EQ, opcodes.IN, opcodes.LT, opcodes.LE, opcodes.GT, opcodes.GE, opcodes.BETWEEN]] = \
    [EQ_KEYS, IN_KEYS, LT_KEYS, LE_KEYS, GT_KEYS, GE_KEYS, BETWEEN_KEYS]


class LeafIndex(NamedTuple):
    """The predicate index of the l-nodes (what :func:`leaf_index` makes).

    Only a leaf whose FALSE and NULL nothing tells apart -- not exact
    (``needs3``), so only its TRUE propagates (zero suppression, §5.2.1)
    -- can be left untouched when it is not TRUE; those with ``=``,
    ``IN``, ``<``, ``<=``, ``>``, ``>=`` or ``BETWEEN`` and bounds that are
    numbers (not NaN) are *keyed*: on event value ``v`` the TRUE ones of a
    group are one run of its sorted keys (``=``, ``IN``: the keys equal to
    ``v``; ``<``: those above ``v``, a suffix; ``<=``: a suffix from the
    first key not below ``v``; ``>``, ``>=``: the matching prefixes;
    ``BETWEEN``: among the lows not above ``v``, those whose high is not
    below it -- a stabbing query; its scan starts at the first key whose
    ``key_reach``, the running maximum of the highs, is not below ``v``:
    every high before it is below ``v``).  An ``IN`` leaf has one key per
    distinct list value.  Every other leaf (exact ones, ``!=``, NOT IN, NOT
    BETWEEN, LIKE, MATCHES and their negations, IS [NOT] NULL, the list
    operators ONE OF ... IS NOT EMPTY) is in
    ``scan_leaf``, evaluated as before; without zero suppression every
    leaf is exact, so all are."""

    scan_off: np.ndarray     # int64 [A + 1]: leaves evaluated one by one, by attribute (CSR)
    scan_leaf: np.ndarray    # int32
    key_off: np.ndarray      # int64 [A * N_CLASSES + 1]: keyed leaves by (attribute, class) (CSR)
    key: np.ndarray          # float64: the bound (``BETWEEN``: the low one; ``IN``: a list value), ascending per group
    key_hi: np.ndarray       # float64: ``BETWEEN``'s high bound (the key again for the other classes)
    key_reach: np.ndarray    # float64: ``BETWEEN``: the highest high bound up to this key in its group (ascending)
    key_leaf: np.ndarray     # int32: the leaf of each key
    key_quiet: np.ndarray    # uint8: the leaf is no r-node and links no parent: TRUE is a stamp and a value to it

    @property
    def nbytes(self) -> int:
        return sum(int(a.nbytes) for a in self)


def leaf_index(arrays: ATreeArrays, pred_op: np.ndarray, pred_lo: np.ndarray, pred_hi: np.ndarray,
               set_offsets: np.ndarray, set_values: np.ndarray) -> LeafIndex:
    """The :class:`LeafIndex` of the flattened tree ``arrays`` over the
    segment's coded predicate table (bounds and IN lists as the float
    codes :func:`gpu_kernels.predicates.entry_truth` compares)."""
    n_attrs = len(arrays.attr_off) - 1
    leaf = arrays.attr_leaf.astype(np.int64)
    attr = np.repeat(np.arange(n_attrs, dtype=np.int64), np.diff(arrays.attr_off))
    pid = arrays.leaf_pred[leaf].astype(np.int64)
    op = pred_op[pid].astype(np.int64)
    cls = _CLASS_OF_OP[op]
    lo = pred_lo[pid].astype(np.float64)
    hi = pred_hi[pid].astype(np.float64)
    set_len = (set_offsets[pid + 1] - set_offsets[pid]).astype(np.int64)
    set_start = set_offsets[pid].astype(np.int64)
    is_in = cls == IN_KEYS
    # an IN list with a NaN code is not sorted as set_contains' binary search assumes: left to it
    in_rows = np.flatnonzero(is_in)
    members = np.repeat(set_start[in_rows] - np.concatenate(([0], np.cumsum(set_len[in_rows])[:-1])),
                        set_len[in_rows]) + np.arange(int(set_len[in_rows].sum()))
    member_row = np.repeat(in_rows, set_len[in_rows])
    member_value = set_values[members].astype(np.float64)
    nan_list = np.zeros(len(leaf), bool)
    nan_list[member_row[np.isnan(member_value)]] = True
    bounded = ~np.isnan(lo) & (~np.isnan(hi) | (cls != BETWEEN_KEYS)) & ~nan_list
    keyed = (arrays.needs3[leaf] == 0) & (cls >= 0) & bounded
    scan = ~keyed
    scan_off = np.zeros(n_attrs + 1, np.int64)
    np.cumsum(np.bincount(attr[scan], minlength=n_attrs), out=scan_off[1:])
    # one key per keyed leaf, an IN leaf one per list value (a value listed twice, or -0.0 beside 0.0, once)
    single = keyed & ~is_in
    listed = keyed[member_row]
    k_leaf = np.concatenate((leaf[single], leaf[member_row[listed]]))
    k_group = np.concatenate((attr[single] * N_CLASSES + cls[single], attr[member_row[listed]] * N_CLASSES + IN_KEYS))
    k_key = np.concatenate((lo[single], member_value[listed]))
    k_hi = np.concatenate((np.where(cls[single] == BETWEEN_KEYS, hi[single], lo[single]), member_value[listed]))
    order = np.lexsort((k_leaf, k_key, k_group))
    k_leaf, k_group, k_key, k_hi = k_leaf[order], k_group[order], k_key[order], k_hi[order]
    repeat = np.zeros(len(order), bool)
    repeat[1:] = (k_leaf[1:] == k_leaf[:-1]) & (k_key[1:] == k_key[:-1]) & (k_group[1:] == k_group[:-1])
    keep = ~repeat
    k_leaf, k_group, k_key, k_hi = k_leaf[keep], k_group[keep], k_key[keep], k_hi[keep]
    key_off = np.zeros(n_attrs * N_CLASSES + 1, np.int64)
    np.cumsum(np.bincount(k_group, minlength=n_attrs * N_CLASSES), out=key_off[1:])
    # most leaves of conjunctions are read by their AND (not its access child) and do nothing else
    quiet = (np.diff(arrays.sub_off)[k_leaf] == 0) & (np.diff(arrays.par_off)[k_leaf] == 0)
    return LeafIndex(scan_off, arrays.attr_leaf[scan].astype(np.int32), key_off, k_key, k_hi,
                     _running_max(key_off, k_hi), k_leaf.astype(np.int32), quiet.astype(np.uint8))


@njit(nogil=True, cache=True)
def _running_max(key_off, key_hi):
    """``key_hi``'s running maximum within each group of ``key_off``."""
    reach = key_hi.copy()
    for g in range(len(key_off) - 1):
        for k in range(key_off[g] + 1, key_off[g + 1]):
            if reach[k - 1] > reach[k]:
                reach[k] = reach[k - 1]
    return reach


__all__ = ["ATreeArrays", "LeafIndex", "flatten", "leaf_index", "AND", "OR", "XOR", "XNOR"]
