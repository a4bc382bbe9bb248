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

from gpu_kernels.betree.layout import ATOMIC
from gpu_kernels.opcodes import IN, LIKE, NOT_IN, NOT_MATCHES, TRUE
from gpu_kernels.predicates import predicate_truth


@njit(inline="always", nogil=True)
def ctz(bit):
    """Index of the single set bit of ``bit`` (a power of two)."""
    n = 0
    while bit > np.uint64(1):
        bit >>= np.uint64(1)
        n += 1
    return n


@njit(nogil=True)
def match_task(e_first, e_last, out, base, cap, ev_count, ev_offsets, ev_attr, ev_value, ev_token, ev_key,
               pattern_truth, tree, leaf, rows, alive, stack, ev_pos, bm0, bm1, result):
    """Match events ``[e_first, e_last)``: each event's alive TRUE
    positions, ascending, to ``out[base + used:]`` and their number to
    ``ev_count[e]``; stop at an event whose positions do not fit ``cap``:
    ``result = (that event, its count)``, else ``(e_last, 0)``."""
    c_depth = tree.c_depth
    c_child = tree.c_child
    c_leaf = tree.c_leaf
    c_pdir = tree.c_pdir
    p_attr = tree.p_attr
    p_top = tree.p_top
    l_sub = leaf.l_sub
    l_verify = leaf.l_verify
    v_pid = leaf.v_pid
    v_attr = leaf.v_attr
    v_op = leaf.v_op
    v_lo = leaf.v_lo
    v_hi = leaf.v_hi
    x_aux = rows.aux
    x_set_offsets = rows.set_offsets
    set_values = rows.set_values
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
            for i in range(c_leaf[c], c_leaf[c + 1]):
                pos = l_sub[i]
                if alive[pos] == 0:
                    continue
                word = pos >> 6
                mask = np.uint64(1) << np.uint64(pos & 63)
                if (bm0[word] & mask) != 0:
                    continue
                # its predicates, read inline; the shared three-valued predicate_truth decides
                # (written out here: a helper taking these arrays costs reference counting per call)
                ok = True
                for v in range(l_verify[i], l_verify[i + 1]):
                    op = v_op[v]
                    at = ev_pos[v_attr[v]]
                    present = at >= 0
                    value = ev_value[at] if present else 0.0
                    hit = False
                    if present and op >= LIKE and op <= NOT_MATCHES:
                        hit = pattern_truth[ev_token[at], x_aux[v_pid[v]]] != 0
                    set_start = 0
                    set_stop = 0
                    if op == IN or op == NOT_IN:
                        set_start = x_set_offsets[v_pid[v]]
                        set_stop = x_set_offsets[v_pid[v] + 1]
                    if predicate_truth(op, v_lo[v], v_hi[v], set_values, set_start, set_stop, hit, present,
                                       value) != TRUE:
                        ok = False
                        break
                if ok:
                    bm0[word] |= mask
                    bm1[word >> 6] |= np.uint64(1) << np.uint64(word & 63)
                    found += 1
            # lines 2-6: the p-directory entries of the event's attributes (the smaller
            # side looked up in the other), and Algorithm 2 for each: down the clustering
            # directory along the halves holding the event's key (helpers written out, see above)
            k0 = c_pdir[c]
            k1 = c_pdir[c + 1]
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
                    attr = ev_attr[at]
                    lo = k0
                    hi = k1
                    while lo < hi:
                        mid = (lo + hi) >> 1
                        if p_attr[mid] < attr:
                            lo = mid + 1
                        else:
                            hi = mid
                    if lo >= k1 or p_attr[lo] != attr:
                        continue
                    k = lo
                key = ev_key[at]
                d = p_top[k]
                while d >= 0:
                    stack[sp] = d
                    sp += 1
                    depth = c_depth[d]
                    if depth >= ATOMIC:
                        break
                    d = c_child[2 * d + ((key >> np.uint64(63 - depth)) & np.uint64(1))]
        for at in range(s0, s1):
            if ev_attr[at] < len(ev_pos):
                ev_pos[ev_attr[at]] = -1
        # the marked positions, ascending (and the bitmap cleared)
        write = used + found <= cap
        at = base + used
        for w1 in range(len(bm1)):
            y1 = bm1[w1]
            if y1 == 0:
                continue
            bm1[w1] = np.uint64(0)
            while y1 != 0:
                low = y1 & (~y1 + np.uint64(1))
                y1 ^= low
                w = w1 * 64 + ctz(low)
                y = bm0[w]
                bm0[w] = np.uint64(0)
                while y != 0:
                    lb = y & (~y + np.uint64(1))
                    y ^= lb
                    if write:
                        out[at] = w * 64 + ctz(lb)
                        at += 1
        if not write:
            result[0] = e
            result[1] = found
            return
        used += found
        ev_count[e] = found


def betree_match_kernel_py(task_first, task_last, out, cap, ev_count, task_stop, task_need, n_positions,
                           ev_offsets, ev_attr, ev_value, ev_token, ev_key, pattern_truth, tree, leaf, rows, alive):
    """Match events ``[task_first[t], task_last[t])`` for every task ``t``
    in parallel (the protocol of
    :func:`engine.algorithms.host_tasks.match_in_tasks`), against ``tree``
    (:class:`~gpu_kernels.betree.layout.BETreeArrays`), its ``leaf``
    arrays and the extended predicate ``rows``."""
    n_words = (n_positions + 63) >> 6
    n_c = len(tree.c_depth)
    n_attrs = 1
    for v in range(len(leaf.v_attr)):
        n_attrs = max(n_attrs, leaf.v_attr[v] + 1)
    for k in range(len(tree.p_attr)):
        n_attrs = max(n_attrs, tree.p_attr[k] + 1)
    for t in prange(len(task_first)):
        stack = np.empty(n_c + 1, dtype=np.int64)
        ev_pos = np.full(n_attrs, -1, dtype=np.int64)
        bm0 = np.zeros(max(n_words, 1), dtype=np.uint64)
        bm1 = np.zeros(max((n_words + 63) >> 6, 1), dtype=np.uint64)
        result = np.empty(2, dtype=np.int64)
        match_task(task_first[t], task_last[t], out, t * cap, cap, ev_count, ev_offsets, ev_attr, ev_value,
                   ev_token, ev_key, pattern_truth, tree, leaf, rows, alive, stack, ev_pos, bm0, bm1, result)
        task_stop[t] = result[0]
        task_need[t] = result[1]


#: the CPU kernel: tasks over all cores
betree_match_kernel = njit(parallel=True, nogil=True, cache=True)(betree_match_kernel_py)
#: the same on the calling thread, for a few events
betree_match_serial = njit(nogil=True, cache=True)(betree_match_kernel_py)
