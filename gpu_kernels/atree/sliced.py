"""A-Tree matching 64 events at a time: one bit an event in each node's word.

:mod:`gpu_kernels.atree.cpu` evaluates the DAG once per event, touching
only what the event reaches (zero suppression, §5.2.1).  Where an event
reaches a large part of the DAG (W5: 5 % of the expressions match, and
an event evaluates tens of thousands of operators, each a few cache
misses), the same nodes are read again for the next event.  This kernel
takes the events of a task 64 at a time -- a *group* -- and gives each
node two words, ``TRUE`` and ``FALSE`` (bit ``j``: the group's event
``j``; neither bit: NULL).  Each stage of Algorithm 6 runs once per group:

1. **Predicate matching** sets each event's bit in the leaves' words:
   the keyed leaves through the predicate index, event by event (a binary
   search a value); the evaluated ones attribute by attribute, a leaf's
   row read once for the group's events that carry its attribute;
2. **expression matching**, level by level over the union of what the
   group's events reach: a node is queued when a child's word becomes
   non-zero (TRUE for every linked parent, FALSE for ``needs3`` ones --
   the same zero suppression and propagation on demand, one word wide),
   evaluated once for the 64 events with word operations: Kleene's AND
   (TRUE: every child TRUE; FALSE: some child FALSE), OR dually, XOR and
   XNOR on the children's known bits.  Where the leaves a group wrote have
   many more parent links than level 2 has nodes, level 2 is evaluated whole
   instead (a node no child reached reads zero words: NULL), and only the
   links above it are followed;
3. a TRUE r-node gives its word to its subscription positions; each block
   of 64 positions holding one, a 64 x 64 bit matrix (position, event),
   is transposed into a word an event, and the events' positions are
   written out ascending.

The words of the nodes a group wrote are cleared after it (a list of
them), so a word read is one load, with no stamp.  Results follow the
:func:`engine.algorithms.host_tasks.match_in_tasks` protocol, as the
one-event kernel's do; the two must give the same answers.
"""

from __future__ import annotations

import numpy as np
from numba import njit, prange

from gpu_kernels.atree.cpu import BETWEEN_KEYS, N_CLASSES, _key_run, in_level
from gpu_kernels.compaction import ALL, ONE, ZERO, emit_group, group_scratch, popcount64
from gpu_kernels.opcodes import AND, FALSE, OR, TRUE, XOR
from gpu_kernels.predicates import entry_truth, find_attribute
from gpu_kernels.twins import parallel_and_serial

#: events a group: the bits of a word
LANES = 64
#: level 2 is evaluated whole when the leaves a group wrote have this many
#: times its nodes in parent links (W5, serial: at 4.7 times, a full group,
#: 1.3x at 300 K and even at 1 M; at 1.7 times, 8 events, 10 % slower at 1 M)
DENSE_LINKS = 4


@njit(inline="always", nogil=True)
def _queue_parents(node, true_now, false_now, above, par_off, par_idx, needs3, queued):
    """``node``'s linked parents from id ``above`` on (a node's parents are
    ascending), queued: all when its TRUE word is non-zero, else those
    that read FALSE too when its FALSE word is."""
    k = par_off[node + 1] - 1
    while k >= par_off[node] and par_idx[k] >= above:
        p = par_idx[k]
        if true_now or (false_now and needs3[p]):
            queued[p >> 6] |= ONE << np.uint64(p & 63)
        k -= 1


@njit(inline="always", nogil=True)
def _set_words(leaf, t, f, true_w, false_w, written, n_written):
    """TRUE bits ``t`` and FALSE bits ``f`` of some events added to
    ``leaf``'s words; returns the new count of written nodes."""
    t0 = true_w[leaf]
    f0 = false_w[leaf]
    if t0 == ZERO and f0 == ZERO and (t != ZERO or f != ZERO):
        written[n_written] = leaf
        n_written += 1
    true_w[leaf] = t0 | t
    false_w[leaf] = f0 | f
    return n_written


@njit(inline="always", nogil=True)
def _scatter(node, t, sub_off, sub_pos, alive, pos_t, pos_words):
    """A TRUE word of an r-node: given to its alive positions (``pos_t``:
    a word a position, the events it matches; ``pos_words``: a bit a
    64-position block holding one)."""
    for k in range(sub_off[node], sub_off[node + 1]):
        pos = sub_pos[k]
        if alive[pos]:
            pos_t[pos] = t
            w = pos >> 6
            pos_words[w >> 6] |= ONE << np.uint64(w & 63)


@njit(nogil=True)
def sliced_task(e_first, e_last, out, base, cap, ev_count, ev_offsets, ev_attr, ev_value, ev_token, pattern_truth,
                list_truth, alive, kind, level_start, child_off, child_idx, par_off, par_idx, needs3, leaf_pred,
                scan_off, scan_leaf, key_off, key, key_hi, key_reach, key_leaf, key_quiet, absent_leaf, sub_off,
                sub_pos, pred_attr, pred_op, pred_lo, pred_hi, set_offsets, set_values, pred_aux, true_w, false_w,
                written, queued, pos_t, pos_words, blocks, found, cursor, result):
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
        lanes = ALL if g1 - g0 == LANES else (ONE << np.uint64(g1 - g0)) - ONE
        n_written = 0
        touched = 0
        # 1. predicate matching: the keyed leaves event by event (a binary search a value), each event its bit ...
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
                                n_written = _set_words(leaf, bit, ZERO, true_w, false_w, written, n_written)
            for k in range(len(absent_leaf)):       # ... the absent list too
                leaf = absent_leaf[k]
                pid = leaf_pred[leaf]
                if find_attribute(ev_attr, s0, s1, pred_attr[pid]) >= 0:
                    continue                                 # evaluated above
                touched += 1
                v = entry_truth(pid, -1, ev_value, ev_token, pred_op, pred_lo, pred_hi, set_offsets, set_values,
                                pred_aux, pattern_truth, list_truth)
                n_written = _set_words(leaf, bit if v == TRUE else ZERO, bit if v == FALSE else ZERO, true_w,
                                       false_w, written, n_written)
        # ... and the evaluated leaves attribute by attribute: a leaf's row is read
        # once for the group's events that carry its attribute, its parents queued once
        s_lo = ev_offsets[g0]
        n_entries = ev_offsets[g1] - s_lo
        entry_attr = np.empty(n_entries, np.int64)
        entry_lane = np.empty(n_entries, np.int64)
        for e in range(g0, g1):
            for at in range(ev_offsets[e], ev_offsets[e + 1]):
                a = ev_attr[at]
                entry_attr[at - s_lo] = a if 0 <= a < n_attr else n_attr
                entry_lane[at - s_lo] = e - g0
        order = np.argsort(entry_attr, kind="mergesort")
        r0 = 0
        while r0 < n_entries:
            a = entry_attr[order[r0]]
            r1 = r0 + 1
            while r1 < n_entries and entry_attr[order[r1]] == a:
                r1 += 1
            if a < n_attr:
                touched += (scan_off[a + 1] - scan_off[a]) * (r1 - r0)
                for k in range(scan_off[a], scan_off[a + 1]):
                    leaf = scan_leaf[k]
                    pid = leaf_pred[leaf]
                    t = ZERO
                    f = ZERO
                    for r in range(r0, r1):
                        v = entry_truth(pid, s_lo + order[r], ev_value, ev_token, pred_op, pred_lo, pred_hi,
                                        set_offsets, set_values, pred_aux, pattern_truth, list_truth)
                        if v == TRUE:
                            t |= ONE << np.uint64(entry_lane[order[r]])
                        elif v == FALSE:
                            f |= ONE << np.uint64(entry_lane[order[r]])
                    n_written = _set_words(leaf, t, f, true_w, false_w, written, n_written)
            r0 = r1
        # The written leaves' parents queued -- unless their links outnumber level
        # 2's nodes DENSE_LINKS times: then level 2 is evaluated whole, and only
        # the links above it are followed (W5: 26 parents a leaf; never on
        # conjunctions, whose ANDs are reached from one access child each)
        links = 0
        for i in range(n_written):
            links += par_off[written[i] + 1] - par_off[written[i]]
        dense = n_levels > 2 and links > DENSE_LINKS * (level_start[3] - level_start[2])
        above = level_start[3] if dense else 0
        for i in range(n_written):
            leaf = written[i]
            t = true_w[leaf]
            f = false_w[leaf]
            if t != ZERO and sub_off[leaf + 1] > sub_off[leaf]:     # a TRUE leaf that is an r-node
                _scatter(leaf, t, sub_off, sub_pos, alive, pos_t, pos_words)
            _queue_parents(leaf, t != ZERO, f != ZERO, above, par_off, par_idx, needs3, queued)
        # 2. expression matching, lowest level first, once for the group
        for lv in range(2, n_levels):
            lo = level_start[lv]
            hi = level_start[lv + 1]
            for w in range(lo >> 6, (hi + 63) >> 6):
                bits = ALL if dense and lv == 2 else queued[w]
                if bits == 0:
                    continue
                first = w << 6
                bits = in_level(bits, first, lo, hi)
                queued[w] &= ~bits
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
                    _queue_parents(node, t != ZERO, f != ZERO, 0, par_off, par_idx, needs3, queued)
                    if t != ZERO and sub_off[node + 1] > sub_off[node]:
                        _scatter(node, t, sub_off, sub_pos, alive, pos_t, pos_words)
        for i in range(n_written):
            true_w[written[i]] = ZERO
            false_w[written[i]] = ZERO
        # 3. each event's positions, ascending, for the events that fit
        used = emit_group(pos_t, pos_words, g0, g1, blocks, found, cursor, out, base, used, limit, ev_count, result)
        if used < 0:
            return
        result[2] += touched


def atree_sliced_kernel_py(task_first, task_last, out, cap, ev_count, task_stop, task_need, task_leaves,
                           ev_offsets, ev_attr, ev_value, ev_token, pattern_truth, list_truth, alive,
                           kind, level_start, child_off, child_idx, par_off, par_idx, needs3,
                           leaf_pred, scan_off, scan_leaf, key_off, key, key_hi, key_reach, key_leaf, key_quiet,
                           absent_leaf, sub_off, sub_pos, pred_attr, pred_op, pred_lo, pred_hi, set_offsets,
                           set_values, pred_aux):
    """Tasks in parallel, as :func:`gpu_kernels.atree.cpu.atree_match_kernel_py`,
    each with its scratch: the nodes' two words, the list of those written,
    the queue bitmap, the positions' words and their blocks transposed."""
    n_nodes = len(kind)
    for t in prange(len(task_first)):
        true_w = np.zeros(n_nodes, np.uint64)
        false_w = np.zeros(n_nodes, np.uint64)
        written = np.empty(n_nodes, np.int32)
        queued = np.zeros((n_nodes + 63) >> 6, np.uint64)
        pos_t, pos_words, blocks, found, cursor = group_scratch(len(alive))
        result = np.empty(3, np.int64)
        sliced_task(task_first[t], task_last[t], out, t * cap, cap, ev_count, ev_offsets, ev_attr, ev_value,
                    ev_token, pattern_truth, list_truth, alive, kind, level_start, child_off, child_idx, par_off,
                    par_idx, needs3, leaf_pred, scan_off, scan_leaf, key_off, key, key_hi, key_reach, key_leaf,
                    key_quiet, absent_leaf, sub_off, sub_pos, pred_attr, pred_op, pred_lo, pred_hi, set_offsets,
                    set_values, pred_aux, true_w, false_w, written, queued, pos_t, pos_words, blocks, found, cursor,
                    result)
        task_stop[t] = result[0]
        task_need[t] = result[1]
        task_leaves[t] = result[2]


#: the CPU kernel: tasks over all cores, and on the calling thread for a few events
atree_sliced_kernel, atree_sliced_serial = parallel_and_serial(atree_sliced_kernel_py, nogil=True)
