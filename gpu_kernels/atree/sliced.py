"""A-Tree matching 64 events at a time: one bit an event in each node's word.

:mod:`gpu_kernels.atree.cpu` evaluates the DAG once per event, touching
only what the event reaches (zero suppression, §5.2.1).  Where an event
reaches a large part of the DAG (W5: 5 % of the expressions match, and
an event evaluates tens of thousands of operators, each a few cache
misses), the same nodes are read again for the next event.  This kernel
takes the events of a task 64 at a time -- a *group* -- and gives each
node two words, ``TRUE`` and ``FALSE`` (bit ``j``: the group's event
``j``; neither bit: NULL).  Each stage of Algorithm 6 runs once per group:

1. **Predicate matching**, per event as in the one-event kernel (the
   keyed leaves through the predicate index, the others evaluated), sets
   the event's bit in the leaves' words;
2. **expression matching**, level by level over the union of what the
   group's events reach: a node is queued when a child's word becomes
   non-zero (TRUE for every linked parent, FALSE for ``needs3`` ones --
   the same zero suppression and propagation on demand, one word wide),
   evaluated once for the 64 events with word operations: Kleene's AND
   (TRUE: every child TRUE; FALSE: some child FALSE), OR dually, XOR and
   XNOR on the children's known bits;
3. a TRUE r-node's subscription positions are marked in the bitmaps of
   the events its word holds, written out per event ascending
   (:func:`~gpu_kernels.compaction.emit_marked`).

The words of the nodes a group wrote are cleared after it (a list of
them), so a word read is one load, with no stamp.  Results follow the
:func:`engine.algorithms.host_tasks.match_in_tasks` protocol, as the
one-event kernel's do; the two must give the same answers.
"""

from __future__ import annotations

import numpy as np
from numba import njit, prange

from gpu_kernels.atree.cpu import BETWEEN_KEYS, N_CLASSES, _key_run
from gpu_kernels.compaction import emit_marked, popcount64
from gpu_kernels.opcodes import AND, FALSE, OR, TRUE, XOR
from gpu_kernels.predicates import entry_truth, find_attribute
from gpu_kernels.twins import parallel_and_serial

#: events a group: the bits of a word
LANES = 64

ONE = np.uint64(1)
ZERO = np.uint64(0)


@njit(inline="always", nogil=True)
def _queue_parents(node, became_true, became_false, par_off, par_idx, needs3, queued):
    """``node``'s word just became non-zero: its linked parents queued
    (those that read FALSE too when only FALSE bits are new)."""
    for k in range(par_off[node], par_off[node + 1]):
        p = par_idx[k]
        if became_true or (became_false and needs3[p]):
            queued[p >> 6] |= ONE << np.uint64(p & 63)


@njit(inline="always", nogil=True)
def _set_leaf(leaf, v, bit, true_w, false_w, written, n_written, par_off, par_idx, needs3, queued):
    """Event ``bit``'s value ``v`` of ``leaf`` into its words; returns the
    new count of written nodes (NULL writes nothing)."""
    if v != TRUE and v != FALSE:
        return n_written
    t = true_w[leaf]
    f = false_w[leaf]
    if t == ZERO and f == ZERO:
        written[n_written] = leaf
        n_written += 1
    if v == TRUE:
        true_w[leaf] = t | bit
        if t == ZERO:
            _queue_parents(leaf, True, False, par_off, par_idx, needs3, queued)
    elif v == FALSE:
        false_w[leaf] = f | bit
        if f == ZERO:
            _queue_parents(leaf, False, True, par_off, par_idx, needs3, queued)
    return n_written


@njit(inline="always", nogil=True)
def _mark(node, t, sub_off, sub_pos, alive, bm0, bm1, found):
    """A TRUE word of an r-node: its alive positions marked for every event
    whose bit is set."""
    for k in range(sub_off[node], sub_off[node + 1]):
        pos = sub_pos[k]
        if not alive[pos]:
            continue
        w = pos >> 6
        b0 = ONE << np.uint64(pos & 63)
        b1 = ONE << np.uint64(w & 63)
        bits = t
        while bits:
            low = bits & (~bits + ONE)
            bits ^= low
            j = popcount64(low - ONE)
            bm0[j, w] |= b0
            bm1[j, w >> 6] |= b1
            found[j] += 1


@njit(nogil=True)
def sliced_task(e_first, e_last, out, base, cap, ev_count, ev_offsets, ev_attr, ev_value, ev_token, pattern_truth,
                list_truth, alive, kind, level_start, child_off, child_idx, par_off, par_idx, needs3, leaf_pred,
                scan_off, scan_leaf, key_off, key, key_hi, key_reach, key_leaf, key_quiet, absent_leaf, sub_off,
                sub_pos, pred_attr, pred_op, pred_lo, pred_hi, set_offsets, set_values, pred_aux, true_w, false_w,
                written, queued, bm0, bm1, found, result):
    """Events ``[e_first, e_last)`` in groups of :data:`LANES`; ``result``
    as :func:`gpu_kernels.atree.cpu.match_task`'s: the first event that
    did not fit (``e_last`` when all did), its count, and the leaves
    touched by the events that fit."""
    n_levels = len(level_start) - 1
    n_attr = len(scan_off) - 1
    used = 0
    limit = base + cap
    result[0] = e_last
    result[1] = 0
    result[2] = 0
    for g0 in range(e_first, e_last, LANES):
        g1 = min(g0 + LANES, e_last)
        lanes = np.uint64(0xFFFFFFFFFFFFFFFF) if g1 - g0 == LANES else (ONE << np.uint64(g1 - g0)) - ONE
        n_written = 0
        touched = 0
        # 1. predicate matching, event by event: each sets its bit
        for e in range(g0, g1):
            bit = ONE << np.uint64(e - g0)
            s0 = ev_offsets[e]
            s1 = ev_offsets[e + 1]
            for at in range(s0, s1):
                a = ev_attr[at]
                if a < 0 or a >= n_attr:
                    continue
                value = ev_value[at]
                if value == value:                   # NaN: no comparison holds, no keyed leaf is TRUE
                    for g in range(a * N_CLASSES, (a + 1) * N_CLASSES):
                        k0 = key_off[g]
                        k1 = key_off[g + 1]
                        if k0 == k1:
                            continue
                        c = g % N_CLASSES
                        ka, kb = _key_run(c, k0, k1, key, key_reach, value)
                        touched += kb - ka
                        for k in range(ka, kb):
                            if c == BETWEEN_KEYS and not value <= key_hi[k]:
                                continue
                            leaf = key_leaf[k]
                            if key_quiet[k]:         # no r-node, no parent: recorded only
                                if true_w[leaf] == ZERO and false_w[leaf] == ZERO:
                                    written[n_written] = leaf
                                    n_written += 1
                                true_w[leaf] |= bit
                            else:
                                n_written = _set_leaf(leaf, TRUE, bit, true_w, false_w, written, n_written,
                                                      par_off, par_idx, needs3, queued)
                touched += scan_off[a + 1] - scan_off[a]
                for k in range(scan_off[a], scan_off[a + 1]):
                    leaf = scan_leaf[k]
                    v = entry_truth(leaf_pred[leaf], at, ev_value, ev_token, pred_op, pred_lo, pred_hi,
                                    set_offsets, set_values, pred_aux, pattern_truth, list_truth)
                    n_written = _set_leaf(leaf, v, bit, true_w, false_w, written, n_written, par_off, par_idx,
                                          needs3, queued)
            for k in range(len(absent_leaf)):
                leaf = absent_leaf[k]
                pid = leaf_pred[leaf]
                if find_attribute(ev_attr, s0, s1, pred_attr[pid]) >= 0:
                    continue                                 # evaluated above
                touched += 1
                v = entry_truth(pid, -1, ev_value, ev_token, pred_op, pred_lo, pred_hi, set_offsets, set_values,
                                pred_aux, pattern_truth, list_truth)
                n_written = _set_leaf(leaf, v, bit, true_w, false_w, written, n_written, par_off, par_idx,
                                      needs3, queued)
        for i in range(n_written):                   # the TRUE leaves that are r-nodes
            leaf = written[i]
            t = true_w[leaf]
            if t != ZERO and sub_off[leaf + 1] > sub_off[leaf]:
                _mark(leaf, t, sub_off, sub_pos, alive, bm0, bm1, found)
        # 2. expression matching, lowest level first, once for the group
        for lv in range(2, n_levels):
            lo = level_start[lv]
            hi = level_start[lv + 1]
            for w in range(lo >> 6, (hi + 63) >> 6):
                bits = queued[w]
                if bits == 0:
                    continue
                first = w << 6
                if first < lo:                   # a word at a level's edge holds its neighbours' bits too
                    bits &= ~((ONE << np.uint64(lo - first)) - ONE)
                if hi - first < 64:
                    bits &= (ONE << np.uint64(hi - first)) - ONE
                queued[w] ^= bits
                while bits:
                    low = bits & (~bits + ONE)
                    bits ^= low
                    node = first + popcount64(low - ONE)
                    op = kind[node]
                    c0 = child_off[node]
                    c1 = child_off[node + 1]
                    if not needs3[node]:         # TRUE is all that counts
                        f = ZERO
                        if op == OR:
                            t = ZERO
                            for k in range(c0, c1):
                                t |= true_w[child_idx[k]]
                        else:
                            t = lanes
                            for k in range(c0, c1):
                                t &= true_w[child_idx[k]]
                                if t == ZERO:
                                    break
                    elif op == AND:
                        t = lanes
                        f = ZERO
                        for k in range(c0, c1):
                            t &= true_w[child_idx[k]]
                            f |= false_w[child_idx[k]]
                    elif op == OR:
                        t = ZERO
                        f = lanes
                        for k in range(c0, c1):
                            t |= true_w[child_idx[k]]
                            f &= false_w[child_idx[k]]
                    else:                        # XOR / XNOR: known where both children are
                        ca = child_idx[c0]
                        cb = child_idx[c0 + 1]
                        known = (true_w[ca] | false_w[ca]) & (true_w[cb] | false_w[cb])
                        differ = true_w[ca] ^ true_w[cb]
                        if op == XOR:
                            t = differ & known
                            f = ~differ & known
                        else:
                            f = differ & known
                            t = ~differ & known
                    if t == ZERO and f == ZERO:
                        continue
                    true_w[node] = t
                    false_w[node] = f
                    written[n_written] = node
                    n_written += 1
                    _queue_parents(node, t != ZERO, f != ZERO, par_off, par_idx, needs3, queued)
                    if t != ZERO and sub_off[node + 1] > sub_off[node]:
                        _mark(node, t, sub_off, sub_pos, alive, bm0, bm1, found)
        for i in range(n_written):
            true_w[written[i]] = ZERO
            false_w[written[i]] = ZERO
        # 3. each event's positions, ascending
        for j in range(g1 - g0):
            write = base + used + found[j] <= limit
            emit_marked(bm0[j], bm1[j], out, base + used, write)
            if not write:
                result[0] = g0 + j
                result[1] = found[j]
                return
            used += found[j]
            ev_count[g0 + j] = found[j]
            found[j] = 0
        result[2] += touched


def atree_sliced_kernel_py(task_first, task_last, out, cap, ev_count, task_stop, task_need, task_leaves,
                           ev_offsets, ev_attr, ev_value, ev_token, pattern_truth, list_truth, alive,
                           kind, level_start, child_off, child_idx, par_off, par_idx, needs3,
                           leaf_pred, scan_off, scan_leaf, key_off, key, key_hi, key_reach, key_leaf, key_quiet,
                           absent_leaf, sub_off, sub_pos, pred_attr, pred_op, pred_lo, pred_hi, set_offsets,
                           set_values, pred_aux):
    """Tasks in parallel, as :func:`gpu_kernels.atree.cpu.atree_match_kernel_py`,
    each with its scratch: the nodes' two words, the list of those written,
    the queue bitmap, a matches' bitmap and count per lane."""
    n_nodes = len(kind)
    n_words = max((len(alive) + 63) >> 6, 1)
    lanes = 1
    for t in range(len(task_first)):
        lanes = max(lanes, min(LANES, task_last[t] - task_first[t]))
    for t in prange(len(task_first)):
        true_w = np.zeros(n_nodes, np.uint64)
        false_w = np.zeros(n_nodes, np.uint64)
        written = np.empty(n_nodes, np.int32)
        queued = np.zeros((n_nodes + 63) >> 6, np.uint64)
        bm0 = np.zeros((lanes, n_words), np.uint64)          # (rows only for the lanes a group can fill)
        bm1 = np.zeros((lanes, max((n_words + 63) >> 6, 1)), np.uint64)
        found = np.zeros(lanes, np.int64)
        result = np.empty(3, np.int64)
        sliced_task(task_first[t], task_last[t], out, t * cap, cap, ev_count, ev_offsets, ev_attr, ev_value,
                    ev_token, pattern_truth, list_truth, alive, kind, level_start, child_off, child_idx, par_off,
                    par_idx, needs3, leaf_pred, scan_off, scan_leaf, key_off, key, key_hi, key_reach, key_leaf,
                    key_quiet, absent_leaf, sub_off, sub_pos, pred_attr, pred_op, pred_lo, pred_hi, set_offsets,
                    set_values, pred_aux, true_w, false_w, written, queued, bm0, bm1, found, result)
        task_stop[t] = result[0]
        task_need[t] = result[1]
        task_leaves[t] = result[2]


#: the CPU kernel: tasks over all cores, and on the calling thread for a few events
atree_sliced_kernel, atree_sliced_serial = parallel_and_serial(atree_sliced_kernel_py, nogil=True)
