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
from gpu_kernels.betree.tree import half_of
from gpu_kernels.opcodes import TRUE
from gpu_kernels.predicates import entry_truth, find_attribute


@njit(inline="always", nogil=True)
def ctz(bit):
    """Index of the single set bit of ``bit`` (a power of two)."""
    n = 0
    while bit > np.uint64(1):
        bit >>= np.uint64(1)
        n += 1
    return n


@njit(nogil=True)
def _find_pnode(p_attr, k0, k1, attr):
    lo = k0
    hi = k1
    while lo < hi:
        mid = (lo + hi) >> 1
        if p_attr[mid] < attr:
            lo = mid + 1
        else:
            hi = mid
    if lo < k1 and p_attr[lo] == attr:
        return lo
    return -1


@njit(inline="always", nogil=True)
def _search_cdir(top, key, c_depth, c_child, stack, sp):
    """Algorithm 2: push every bucket from ``top`` down that holds ``key``."""
    d = top
    while d >= 0:
        stack[sp] = d
        sp += 1
        depth = c_depth[d]
        if depth >= ATOMIC:
            break
        d = c_child[2 * d + half_of(key, depth)]
    return sp


@njit(nogil=True)
def match_task(e_first, e_last, out, base, cap, ev_count, ev_offsets, ev_attr, ev_value, ev_token, ev_key,
               pattern_truth, tree, leaf, rows, alive, stack, bm0, bm1, result):
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
    x_attr = rows.attr
    x_op = rows.op
    x_lo = rows.lo
    x_hi = rows.hi
    x_aux = rows.aux
    x_set_offsets = rows.set_offsets
    set_values = rows.set_values
    used = 0
    result[0] = e_last
    result[1] = 0
    for e in range(e_first, e_last):
        s0 = ev_offsets[e]
        s1 = ev_offsets[e + 1]
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
                ok = True
                for v in range(l_verify[i], l_verify[i + 1]):
                    p = v_pid[v]
                    at = find_attribute(ev_attr, s0, s1, x_attr[p])
                    if entry_truth(p, at, ev_value, ev_token, x_op, x_lo, x_hi, x_set_offsets, set_values, x_aux,
                                   pattern_truth) != TRUE:
                        ok = False
                        break
                if ok:
                    bm0[word] |= mask
                    bm1[word >> 6] |= np.uint64(1) << np.uint64(word & 63)
                    found += 1
            # lines 2-6: the p-directory entries of the event's attributes
            k0 = c_pdir[c]
            k1 = c_pdir[c + 1]
            if k1 - k0 <= s1 - s0:
                for k in range(k0, k1):
                    at = find_attribute(ev_attr, s0, s1, p_attr[k])
                    if at >= 0:
                        sp = _search_cdir(p_top[k], ev_key[at], c_depth, c_child, stack, sp)
            else:
                for at in range(s0, s1):
                    k = _find_pnode(p_attr, k0, k1, ev_attr[at])
                    if k >= 0:
                        sp = _search_cdir(p_top[k], ev_key[at], c_depth, c_child, stack, sp)
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
    for t in prange(len(task_first)):
        stack = np.empty(n_c + 1, dtype=np.int64)
        bm0 = np.zeros(max(n_words, 1), dtype=np.uint64)
        bm1 = np.zeros(max((n_words + 63) >> 6, 1), dtype=np.uint64)
        result = np.empty(2, dtype=np.int64)
        match_task(task_first[t], task_last[t], out, t * cap, cap, ev_count, ev_offsets, ev_attr, ev_value,
                   ev_token, ev_key, pattern_truth, tree, leaf, rows, alive, stack, bm0, bm1, result)
        task_stop[t] = result[0]
        task_need[t] = result[1]


#: the CPU kernel: tasks over all cores
betree_match_kernel = njit(parallel=True, nogil=True, cache=True)(betree_match_kernel_py)
#: the same on the calling thread, for a few events
betree_match_serial = njit(nogil=True, cache=True)(betree_match_kernel_py)
