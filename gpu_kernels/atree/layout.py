"""The A-Tree flattened for matching: level-ordered CSR arrays.

:func:`flatten` turns the host DAG (:mod:`gpu_kernels.atree.dag`) and
the r-node of each subscription position into :class:`ATreeArrays`, what
:mod:`gpu_kernels.atree.cpu` reads.  Node ids are renumbered by (level,
creation order), so each level is one id range (``level_start``) and
parents come after their children.
"""

from __future__ import annotations

from itertools import chain
from typing import NamedTuple

import numpy as np
from numba import njit

from gpu_kernels import opcodes
from gpu_kernels.atree.cpu import exact_nodes, node_levels
from gpu_kernels.opcodes import AND, LEAF, OR, XNOR, XOR


class ATreeArrays(NamedTuple):
    kind: np.ndarray         # int8 [N] LEAF/AND/OR/XOR/XNOR
    level: np.ndarray        # int32 [N] (§4.1), ascending
    level_start: np.ndarray  # int64 [M + 2]: nodes of level L are [level_start[L], level_start[L + 1])
    child_off: np.ndarray    # int64 [N + 1] children CSR (evaluation)
    child_idx: np.ndarray    # int32
    par_off: np.ndarray      # int64 [N + 1] propagation links CSR (child -> parents it reaches)
    par_idx: np.ndarray      # int32
    needs3: np.ndarray       # uint8 [N]: reads its children in three values (XOR/XNOR or below one)
    leaf_pred: np.ndarray    # int32 [N]: a leaf's predicate id in the segment, -1 otherwise
    attr_off: np.ndarray     # int64 [A + 1]: leaves by attribute (CSR)
    attr_leaf: np.ndarray    # int32
    absent_leaf: np.ndarray  # int32: leaves not NULL on an absent attribute (IS NULL; exact IS NOT NULL)
    sub_off: np.ndarray      # int64 [N + 1]: subscription positions per r-node (CSR)
    sub_pos: np.ndarray      # int32

    @property
    def nbytes(self) -> int:
        return sum(int(a.nbytes) for a in self)


#: a leaf's rough chance of being TRUE, by operator: picks the access
#: child of an AND (§5.2.2: the child least often TRUE is linked, so the
#: AND is visited least often); the paper picks one at random
_LEAF_ESTIMATE = np.full(16, 0.5)
_LEAF_ESTIMATE[[opcodes.EQ]] = 0.02
_LEAF_ESTIMATE[[opcodes.IN, opcodes.LIKE, opcodes.MATCHES]] = 0.05
_LEAF_ESTIMATE[[opcodes.BETWEEN]] = 0.2
_LEAF_ESTIMATE[[opcodes.LT, opcodes.LE, opcodes.GT, opcodes.GE]] = 0.4
_LEAF_ESTIMATE[[opcodes.NE, opcodes.NOT_IN, opcodes.NOT_BETWEEN, opcodes.NOT_LIKE, opcodes.NOT_MATCHES,
                opcodes.IS_NOT_NULL]] = 0.6
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


def flatten(dag, roots: np.ndarray, pred_attr: np.ndarray, pred_op: np.ndarray, pid_of_key: dict, *,
            zero_suppression: bool = True, on_demand: bool = True) -> ATreeArrays:
    """The level-ordered arrays of ``dag`` whose subscription at position
    ``p`` is r-node ``roots[p]`` (a host node id); ``pid_of_key`` maps a
    leaf's predicate key to its predicate id in the segment.

    The paper's matching optimisations as ablations (Figure 10):
    ``zero_suppression=False`` makes every node exact (``needs3``), so
    FALSE propagates as TRUE does -- every evaluated node reaches all its
    parents; ``on_demand=False`` links every child of an AND, not its
    access child alone.  Neither changes a result."""
    kinds = np.array(dag.kind, dtype=np.int8)
    n_all = len(kinds)
    counts = np.fromiter((len(c) for c in dag.children), np.int64, n_all)
    child_off = np.zeros(n_all + 1, np.int64)
    np.cumsum(counts, out=child_off[1:])
    child_idx = np.fromiter(chain.from_iterable(dag.children), np.int64, int(child_off[-1]))
    level, settled = node_levels(child_off, child_idx)
    if not settled:
        raise AssertionError("A-Tree: the DAG has a cycle")
    live = np.flatnonzero(kinds >= 0)
    order = live[np.argsort(level[live], kind="stable")]          # (level, creation order)
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
    leaf_pred[leaves] = [pid_of_key[dag.pred[h]] for h in order[leaves].tolist()]
    leaf_estimate = np.full(n, 0.5)
    leaf_estimate[leaves] = _LEAF_ESTIMATE[pred_op[leaf_pred[leaves]]]
    link_parent, link_child = _links(kind, c_off, c_idx, needs3, leaf_estimate, bool(on_demand))
    by_child = np.lexsort((link_parent, link_child))
    par_off = np.zeros(n + 1, np.int64)
    np.cumsum(np.bincount(link_child, minlength=n), out=par_off[1:])
    par_idx = link_parent[by_child]
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
    return ATreeArrays(kind, lv.astype(np.int32), level_start, c_off, c_idx.astype(np.int32), par_off,
                       par_idx.astype(np.int32), needs3, leaf_pred.astype(np.int32), attr_off,
                       attr_leaf.astype(np.int32), absent.astype(np.int32), sub_off, sub_pos.astype(np.int32))


__all__ = ["ATreeArrays", "flatten", "AND", "OR", "XOR", "XNOR"]
