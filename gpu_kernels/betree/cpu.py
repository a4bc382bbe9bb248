"""BE-Tree matching on every core (Sadoghi, Jacobsen, SIGMOD 2011, §6, Algorithms 1-2).

Per event, a depth-first walk of the flattened tree
(:class:`~gpu_kernels.betree.layout.BETreeArrays`) from the root with an
explicit stack of c-nodes:

* ``MatchBETree`` (Algorithm 1): the c-node's l-node is checked -- each
  unit's remaining predicates evaluated by the shared
  :func:`~gpu_kernels.predicates.entry_truth` (the verification every
  algorithm uses), its subscription marked when all are TRUE and it is
  alive -- then each of the event's attributes is looked up in the
  c-node's p-directory (sorted by attribute: the smaller of the two sides
  is searched in the other);
* ``SearchCDir`` (Algorithm 2): for each p-node found, its clustering
  directory is descended from the top bucket along the halves that enclose
  the event's key on that attribute -- one half per level, the buckets being
  dyadic -- and every bucket on the way is pushed to be matched in turn.

A c-node is reached through one path only, so the stack never holds more
than the tree's c-nodes.  Marked positions go to a two-level bitmap, which
de-duplicates (a DNF subscription matched through two units) and emits them
ascending.  Batches are split into tasks over all cores
(:func:`engine.algorithms.host_tasks.match_in_tasks`).
"""

from __future__ import annotations

import numpy as np
from numba import njit, prange

from gpu_kernels.betree.layout import (ATOMIC, N_CHILD, N_DEPTH, N_LEAF, N_LEAF_END, N_PDIR, N_PDIR_END, N_PREFIX,
                                       NODE_FIELDS)
from gpu_kernels.compaction import emit_marked
from gpu_kernels.opcodes import BETWEEN, FIRST_LIST_OP, GE, IN, LAST_LIST_OP, LIKE, NE, NOT_MATCHES, TRUE
from gpu_kernels.predicates import find_attribute, list_hit, list_key, predicate_truth
from gpu_kernels.twins import parallel_and_serial


@njit(nogil=True, cache=True)
def node_table(c_depth, c_child, c_leaf, c_pdir, p_top):
    """The :class:`~gpu_kernels.betree.layout.NodeTable` fields of a
    flattened tree: per c-node its leaf and p-directory ranges, depth,
    prefix (computed top-down: preorder puts parents first) and halves, each
    half pointer moved past the chain of empty single-half buckets below it."""
    n = len(c_depth)
    node = np.empty((n, len(NODE_FIELDS)), np.int64)
    for c in range(n):
        node[c, N_LEAF] = c_leaf[c]
        node[c, N_LEAF_END] = c_leaf[c + 1]
        node[c, N_PDIR] = c_pdir[c]
        node[c, N_PDIR_END] = c_pdir[c + 1]
        node[c, N_DEPTH] = c_depth[c]
    node[0, N_PREFIX] = 0
    for k in range(len(p_top)):
        node[p_top[k], N_PREFIX] = 0
    for c in range(n):
        for half in range(2):
            h = c_child[2 * c + half]
            if h >= 0:
                base = np.uint64(node[c, N_PREFIX]) << np.uint64(1) if c_depth[c] > 0 else np.uint64(0)
                node[h, N_PREFIX] = np.int64(base | np.uint64(half))
    # compress, bottom-up (children come after their parent in preorder)
    skip = np.arange(n)
    for c in range(n - 1, -1, -1):
        lo = c_child[2 * c]
        hi = c_child[2 * c + 1]
        node[c, N_CHILD] = skip[lo] if lo >= 0 else -1
        node[c, N_CHILD + 1] = skip[hi] if hi >= 0 else -1
        empty = c_leaf[c + 1] == c_leaf[c] and c_pdir[c + 1] == c_pdir[c]
        if empty and (lo < 0) != (hi < 0):
            skip[c] = node[c, N_CHILD] if lo >= 0 else node[c, N_CHILD + 1]
    tops = np.empty(len(p_top), np.int64)
    for k in range(len(p_top)):
        tops[k] = skip[p_top[k]]
    return node, tops


@njit(nogil=True)
def match_task(e_first, e_last, out, base, cap, ev_count, ev_offsets, ev_attr, ev_value, ev_token, ev_key,
               pattern_truth, list_truth, table, p_attr, leaf, rows, alive, stack, ev_pos, bm0, bm1, result, loss):
    """Match events ``[e_first, e_last)``: each event's alive TRUE
    positions, ascending, to ``out[base + used:]`` and their number to
    ``ev_count[e]``; stop at an event whose positions do not fit ``cap``:
    ``result = (that event, its count)``, else ``(e_last, 0)``.  With a
    non-empty ``loss`` (one slot per c-node), the predicates evaluated for
    units that fail -- §5's discarded predicate evaluations -- are added to
    their c-node's slot."""
    node = table.node
    p_top = table.p_top
    l_head = leaf.l_head
    v_pred = leaf.v_pred
    v_pid = leaf.v_pid
    v_set = leaf.v_set
    v_sets = leaf.v_sets
    x_aux = rows.aux
    n_pos = len(ev_pos)
    used = 0
    result[0] = e_last
    result[1] = 0
    for e in range(e_first, e_last):
        s0 = ev_offsets[e]
        s1 = ev_offsets[e + 1]
        for at in range(s0, s1):           # attribute -> entry, for the leaf checks (-1: absent)
            if ev_attr[at] < len(ev_pos):
                ev_pos[ev_attr[at]] = at
        found = 0
        stack[0] = 0
        sp = 1
        while sp > 0:
            sp -= 1
            c = stack[sp]
            # Algorithm 1, line 1: the l-node's units
            for i in range(node[c, N_LEAF], node[c, N_LEAF_END]):
                pos = l_head[i, 0]
                if alive[pos] == 0:
                    continue
                word = pos >> 6
                mask = np.uint64(1) << np.uint64(pos & 63)
                if (bm0[word] & mask) != 0:
                    continue
                # its predicates, read inline: an interval operator by two comparisons, the
                # others by the shared three-valued predicate_truth (written out here: a helper
                # taking these arrays costs reference counting per call)
                ok = True
                failed_at = 0
                for v in range(l_head[i, 1], l_head[i + 1, 1]):
                    code = np.int64(v_pred[v, 0])
                    op = code & 31
                    at = ev_pos[code >> 5]
                    present = at >= 0
                    if (op <= GE and op != NE) or op == BETWEEN:     # layout.INTERVAL_OPS
                        if not present:
                            ok = False
                            failed_at = v
                            break
                        x = ev_value[at]
                        if x < v_pred[v, 1] or x > v_pred[v, 2]:
                            ok = False
                            failed_at = v
                            break
                        continue
                    value = ev_value[at] if present else 0.0
                    hit = False
                    if present and op >= LIKE and op <= NOT_MATCHES:
                        hit = pattern_truth[ev_token[at], x_aux[v_pid[v]]] != 0
                    elif present and op >= FIRST_LIST_OP and op <= LAST_LIST_OP:    # the event list's row
                        hit = list_hit(list_truth, ev_token[at], list_key(op, x_aux[v_pid[v]]))
                    if op == IN:            # short sorted lists: a scan, after the first-to-last test
                        if not present or value < v_pred[v, 1] or value > v_pred[v, 2]:
                            ok = False
                            failed_at = v
                            break
                        inside = False
                        for q in range(v_set[v], v_set[v + 1]):
                            if v_sets[q] >= value:
                                inside = v_sets[q] == value
                                break
                        if not inside:
                            ok = False
                            failed_at = v
                            break
                        continue
                    if predicate_truth(op, v_pred[v, 1], v_pred[v, 2], v_sets, v_set[v], v_set[v + 1], hit,
                                       present, value) != TRUE:
                        ok = False
                        failed_at = v
                        break
                if not ok and len(loss):
                    loss[c] += failed_at - l_head[i, 1] + 1
                if ok:
                    bm0[word] |= mask
                    bm1[word >> 6] |= np.uint64(1) << np.uint64(word & 63)
                    found += 1
            # lines 2-6: the p-directory entries of the event's attributes (the smaller
            # side looked up in the other), and Algorithm 2 for each: down the clustering
            # directory along the halves holding the event's key (helpers written out, see above)
            k0 = node[c, N_PDIR]
            k1 = node[c, N_PDIR_END]
            small = k1 - k0 <= s1 - s0
            n_look = k1 - k0 if small else s1 - s0
            for q in range(n_look):
                if small:
                    k = k0 + q
                    at = ev_pos[p_attr[k]] if p_attr[k] < n_pos else -1
                    if at < 0:
                        continue
                else:
                    at = s0 + q
                    k = find_attribute(p_attr, k0, k1, ev_attr[at])     # (a binary search of sorted ids)
                    if k < 0:
                        continue
                key = ev_key[at]
                d = p_top[k]
                while d >= 0:
                    depth = node[d, N_DEPTH]
                    if depth > 0 and (key >> np.uint64(64 - depth)) != np.uint64(node[d, N_PREFIX]):
                        break           # a jumped chain leads elsewhere: the key's half is not in the tree
                    if node[d, N_LEAF] != node[d, N_LEAF_END] or node[d, N_PDIR] != node[d, N_PDIR_END]:
                        stack[sp] = d
                        sp += 1
                    if depth >= ATOMIC:
                        break
                    d = node[d, N_CHILD + np.int64((key >> np.uint64(63 - depth)) & np.uint64(1))]
        for at in range(s0, s1):
            if ev_attr[at] < len(ev_pos):
                ev_pos[ev_attr[at]] = -1
        # the marked positions, ascending (and the bitmap cleared)
        write = used + found <= cap
        emit_marked(bm0, bm1, out, base + used, write)
        if not write:
            result[0] = e
            result[1] = found
            return
        used += found
        ev_count[e] = found


def betree_match_kernel_py(task_first, task_last, out, cap, ev_count, task_stop, task_need, n_positions,
                           ev_offsets, ev_attr, ev_value, ev_token, ev_key, pattern_truth, list_truth, table, p_attr,
                           leaf, rows, alive, loss):
    """Match events ``[task_first[t], task_last[t])`` for every task ``t``
    in parallel (the protocol of
    :func:`engine.algorithms.host_tasks.match_in_tasks`), against the
    tree's :class:`~gpu_kernels.betree.layout.NodeTable` and p-node
    attributes, its ``leaf`` arrays and the extended predicate ``rows``
    (``loss``: see :func:`match_task`; empty but on the calling thread)."""
    n_words = (n_positions + 63) >> 6
    n_c = len(table.node)
    for t in prange(len(task_first)):
        stack = np.empty(n_c + 1, dtype=np.int64)
        ev_pos = np.full(table.n_attrs, -1, dtype=np.int64)
        bm0 = np.zeros(max(n_words, 1), dtype=np.uint64)
        bm1 = np.zeros(max((n_words + 63) >> 6, 1), dtype=np.uint64)
        result = np.empty(2, dtype=np.int64)
        match_task(task_first[t], task_last[t], out, t * cap, cap, ev_count, ev_offsets, ev_attr, ev_value, ev_token,
                   ev_key, pattern_truth, list_truth, table, p_attr, leaf, rows, alive, stack, ev_pos, bm0, bm1, result,
                   loss)
        task_stop[t] = result[0]
        task_need[t] = result[1]


#: the CPU kernel: tasks over all cores, and on the calling thread for a few events
betree_match_kernel, betree_match_serial = parallel_and_serial(betree_match_kernel_py, nogil=True)
