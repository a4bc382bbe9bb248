"""A-PCM's five stages on every core (Sadoghi, Jacobsen, ICDE 2014, §V, Fig. 5).

A batch arrives re-ordered into *clusters* (online stream re-ordering,
:mod:`engine.algorithms.osr`); a cluster of one event is matched per event,
a larger one as one *compressed event*.

1. **Bitmap encoding** (:func:`encode_entries`, parallel over event
   entries): each entry's slice of its event's Result Bit-array -- a row of
   the attribute's precomputed table, found by binary search, or evaluated
   bits in the batch's *store* (:mod:`gpu_kernels.apcm.layout`).
2. **Compression** (:func:`compress_clusters`, parallel over clusters):
   per attribute of a cluster, the bitwise OR of its members' slices (in
   the store), whether some member lacks the attribute (its ``IS NULL``
   predicates are TRUE there), and the members' distinct keys on it.  The
   paper splits one OR over threads by cache-line chunks (Stage 3); a batch
   holds many clusters, so here the clusters are split over the cores, each
   OR one core's, which shares nothing either.
3. **Traversal** (:func:`traverse_items`): the BE-Tree walked once per
   compressed event, every c-node enclosing any member's key visited once
   (a stamp per c-node), the c-nodes with units collected into a list --
   *traversal unrolling* (§V-B): leaves are not scanned during the walk.
   *Parallel path traversal* (§V-C): one work item per (cluster, p-node of
   the root's p-directory the cluster has the attribute of), items spread
   round-robin over the cores; without it, one item per cluster walked on
   one core.
4. **Leaf scanning** (:func:`scan_task`, parallel over clusters): each
   candidate unit checked once against the compressed event, then -- when
   the cluster has several members -- against each member's own slices,
   all members at once: per predicate a mask of the members it is TRUE
   on, read once per cluster and cached, the unit's members the AND of
   its predicates' masks (:func:`scan_cluster`).  Every predicate is a bit
   lookup; nothing is evaluated again.

Bits are read through *pointers*: ``>= 0`` a word of the layout's table,
``<= -2`` word ``-2 - p`` of the batch's store, :data:`NO_SLICE` none.

:func:`match_interleaved` is the paper's base algorithm "C": the walk and
the leaf scans interleaved, each leaf's members scanned by a parallel loop
of its own -- the per-leaf fork and join that §V-B's unrolling removes.
"""

from __future__ import annotations

import numpy as np
from numba import njit, prange

from gpu_kernels.apcm.layout import NULL_SLOT
from gpu_kernels.betree.layout import ATOMIC, N_CHILD, N_DEPTH, N_LEAF, N_LEAF_END, N_PDIR, N_PDIR_END, N_PREFIX
from gpu_kernels.compaction import ctz, emit_marked
from gpu_kernels.list_truth import LIST_CODE_MASK, LIST_CODE_SHIFT
from gpu_kernels.opcodes import TRUE
from gpu_kernels.predicates import entry_truth, find_attribute, predicate_truth
from gpu_kernels.twins import parallel_and_serial

#: a pointer to no slice (an attribute without bits of that kind)
NO_SLICE = -1


@njit(inline="always", nogil=True)
def slice_bit(ptr, bit, table, store):
    """Bit ``bit`` of the slice at pointer ``ptr``."""
    if ptr == NO_SLICE:
        return False
    w = bit >> 6
    word = table[ptr + w] if ptr >= 0 else store[-2 - ptr + w]
    return (word >> np.uint64(bit & 63)) & np.uint64(1) != 0


@njit(inline="always", nogil=True)
def slot_true(slot, present, p_main, p_over, table, store):
    """Is the predicate of ``slot`` TRUE on an event (or a compressed event)
    whose slices of its attribute are ``p_main``/``p_over`` (``present``: it
    carries the attribute; for IS NULL the caller passes "lacks it")?"""
    if slot == NULL_SLOT:
        return present
    if not present:
        return False
    if slot >= 0:
        return slice_bit(p_main, slot, table, store)
    return slice_bit(p_over, -2 - slot, table, store)


# ------------------------------------------------------------ stage 1: encode
@njit(parallel=True, nogil=True, cache=True)
def encode_entries(ev_attr, ev_value, ev_token, store_at, main_bits, over_bits, bit_off, bit_pred, bit_code,
                   list_attr, obit_off, obit_pred, tab_off, bound_off, bounds, op, lo, hi, aux, set_offsets,
                   set_values, pattern_truth, list_truth, list_words, e_main, e_over, store):
    """``e_main[k]``, ``e_over[k]``: the slices of entry ``k``; evaluated
    slices written to ``store[store_at[k]:]`` (zeroed by the caller).

    A main bit of a list operator (``bit_code``: its list code,
    gpu_kernels.list_truth) is decided by its key's bit in a bitmap of the
    event list's TRUE keys (``list_words`` words), made once for an entry
    of a list attribute (``list_attr``: per attribute, has it such bits):
    a list attribute has a bit per list predicate -- hundreds of thousands
    on W7 -- and each evaluated alone would search the row's keys."""
    n_attrs = len(main_bits)
    for k in prange(len(ev_attr)):
        a = ev_attr[k]
        e_main[k] = NO_SLICE
        e_over[k] = NO_SLICE
        if a >= n_attrs:
            continue
        at = store_at[k]
        if main_bits[a] > 0:
            if tab_off[a] >= 0:
                b0 = bound_off[a]
                b1 = bound_off[a + 1]
                x = ev_value[k]
                i = np.searchsorted(bounds[b0:b1], x)
                row = 2 * i + 1 if i < b1 - b0 and bounds[b0 + i] == x else 2 * i
                e_main[k] = tab_off[a] + row * ((main_bits[a] + 63) >> 6)
            else:
                # a list attribute's bits: the event list's TRUE keys as a bitmap, made once
                keys = np.zeros(max(list_words, 1) if list_attr[a] else 0, dtype=np.uint64)
                if list_attr[a]:
                    row = ev_token[k]
                    for q in range(list_truth[row], list_truth[row + 1]):
                        w = list_truth[q]
                        keys[w >> 6] |= np.uint64(1) << np.uint64(w & 63)
                for j in range(main_bits[a]):
                    p = bit_pred[bit_off[a] + j]
                    if p < 0:
                        continue
                    code = np.int64(bit_code[bit_off[a] + j])
                    if code > 0:
                        key = code >> LIST_CODE_SHIFT
                        hit = (key >> 6) < list_words and \
                            ((keys[key >> 6] >> np.uint64(key & 63)) & np.uint64(1)) != 0
                        true = predicate_truth(code & LIST_CODE_MASK, 0.0, 0.0, set_values, 0, 0, hit, True,
                                               ev_value[k]) == TRUE
                    else:
                        true = entry_truth(p, k, ev_value, ev_token, op, lo, hi, set_offsets, set_values, aux,
                                           pattern_truth, list_truth) == TRUE
                    if true:
                        store[at + (j >> 6)] |= np.uint64(1) << np.uint64(j & 63)
                e_main[k] = -2 - at
                at += (main_bits[a] + 63) >> 6
        if over_bits[a] > 0:
            for j in range(over_bits[a]):
                p = obit_pred[obit_off[a] + j]
                if p >= 0 and entry_truth(p, k, ev_value, ev_token, op, lo, hi, set_offsets, set_values, aux,
                                          pattern_truth, list_truth) == TRUE:
                    store[at + (j >> 6)] |= np.uint64(1) << np.uint64(j & 63)
            e_over[k] = -2 - at


# ---------------------------------------------------------- stage 2: compress
@njit(parallel=True, nogil=True, cache=True)
def compress_clusters(cl_off, perm, ev_offsets, ev_attr, ev_key, e_main, e_over, main_bits, over_bits, table, store,
                      ce_start, c_store_at, ce_end, ce_attr, ce_main, ce_over, ce_absent, ce_key_end, ce_keys):
    """Cluster ``c``'s compressed entries ``[ce_start[c], ce_end[c])``: per
    attribute some member carries, ascending, the OR of the members'
    slices (a singleton's are its own: nothing copied), whether a member
    lacks it, and the members' distinct keys ``ce_keys[ce_start..]`` up to
    ``ce_key_end``.  ``ce_start``/``c_store_at``: room reserved by the
    caller (each cluster's total member entries and their slice words)."""
    n_attrs = len(main_bits)
    for c in prange(len(cl_off) - 1):
        m0 = cl_off[c]
        m1 = cl_off[c + 1]
        out = ce_start[c]
        if m1 - m0 == 1:
            e = perm[m0]
            for k in range(ev_offsets[e], ev_offsets[e + 1]):
                ce_attr[out] = ev_attr[k]
                ce_main[out] = e_main[k]
                ce_over[out] = e_over[k]
                ce_absent[out] = 0
                ce_keys[out] = ev_key[k]
                ce_key_end[out] = out + 1
                out += 1
            ce_end[c] = out
            continue
        # the members' entries, by (attribute, key)
        n = 0
        for m in range(m0, m1):
            e = perm[m]
            n += ev_offsets[e + 1] - ev_offsets[e]
        ks = np.empty(n, np.int64)
        n = 0
        for m in range(m0, m1):
            e = perm[m]
            for k in range(ev_offsets[e], ev_offsets[e + 1]):
                ks[n] = k
                n += 1
        by_key = np.argsort(ev_key[ks], kind="mergesort")
        ks = ks[by_key]
        ks = ks[np.argsort(ev_attr[ks], kind="mergesort")]
        at = c_store_at[c]
        key_at = ce_start[c]
        i = 0
        while i < n:
            a = ev_attr[ks[i]]
            j = i
            while j < n and ev_attr[ks[j]] == a:
                j += 1
            ce_attr[out] = a
            ce_absent[out] = 1 if j - i < m1 - m0 else 0
            # distinct keys
            for q in range(i, j):
                if q == i or ev_key[ks[q]] != ev_key[ks[q - 1]]:
                    ce_keys[key_at] = ev_key[ks[q]]
                    key_at += 1
            ce_key_end[out] = key_at
            ce_main[out] = NO_SLICE
            ce_over[out] = NO_SLICE
            if a < n_attrs:
                for kind in range(2):
                    bits = main_bits[a] if kind == 0 else over_bits[a]
                    if bits == 0:
                        continue
                    n_w = (bits + 63) >> 6
                    for q in range(i, j):
                        ptr = e_main[ks[q]] if kind == 0 else e_over[ks[q]]
                        for w in range(n_w):
                            store[at + w] |= table[ptr + w] if ptr >= 0 else store[-2 - ptr + w]
                    if kind == 0:
                        ce_main[out] = -2 - at
                    else:
                        ce_over[out] = -2 - at
                    at += n_w
            out += 1
            i = j
        ce_end[c] = out


# --------------------------------------------------------- stage 3: traverse
@njit(nogil=True)
def walk(c_from, k_only, ce0, ce1, ce_attr, ce_key_end, ce_keys, ce_start_keys, node, p_top, p_attr, cpos, seen,
         stamp, stack, cand, cand_at, cap):
    """Walk the subtree of c-node ``c_from`` (``k_only >= 0``: only the
    clustering directory of p-node ``k_only``, from its top; -2: only
    ``c_from``'s own l-node) along every
    key of the compressed event, each c-node once; the c-nodes holding units
    go to ``cand[cand_at:]`` while they fit ``cap``.  Returns the number
    found (written or not)."""
    found = 0
    sp = 0
    if k_only == -2:            # the root's l-node alone (its p-directory is walked by other items)
        if node[c_from, N_LEAF] != node[c_from, N_LEAF_END]:
            if cap > 0:
                cand[cand_at] = c_from
            found = 1
        return found
    if k_only < 0:
        stack[0] = c_from
        sp = 1
    else:
        ce = cpos[p_attr[k_only]]
        q0 = ce_start_keys if ce == ce0 else ce_key_end[ce - 1]
        for q in range(q0, ce_key_end[ce]):
            key = ce_keys[q]
            d = p_top[k_only]
            while d >= 0:
                depth = node[d, N_DEPTH]
                if depth > 0 and (key >> np.uint64(64 - depth)) != np.uint64(node[d, N_PREFIX]):
                    break
                if seen[d] != stamp and (node[d, N_LEAF] != node[d, N_LEAF_END] or node[d, N_PDIR] != node[d, N_PDIR_END]):
                    seen[d] = stamp
                    stack[sp] = d
                    sp += 1
                if depth >= ATOMIC:
                    break
                d = node[d, N_CHILD + np.int64((key >> np.uint64(63 - depth)) & np.uint64(1))]
    while sp > 0:
        sp -= 1
        c = stack[sp]
        if node[c, N_LEAF] != node[c, N_LEAF_END]:
            if found < cap:
                cand[cand_at + found] = c
            found += 1
        for k in range(node[c, N_PDIR], node[c, N_PDIR_END]):
            a = p_attr[k]
            if a >= len(cpos):
                continue
            ce = cpos[a]
            if ce < 0:
                continue
            q0 = ce_start_keys if ce == ce0 else ce_key_end[ce - 1]
            for q in range(q0, ce_key_end[ce]):
                key = ce_keys[q]
                d = p_top[k]
                while d >= 0:
                    depth = node[d, N_DEPTH]
                    if depth > 0 and (key >> np.uint64(64 - depth)) != np.uint64(node[d, N_PREFIX]):
                        break
                    if seen[d] != stamp and (node[d, N_LEAF] != node[d, N_LEAF_END]
                                             or node[d, N_PDIR] != node[d, N_PDIR_END]):
                        seen[d] = stamp
                        stack[sp] = d
                        sp += 1
                    if depth >= ATOMIC:
                        break
                    d = node[d, N_CHILD + np.int64((key >> np.uint64(63 - depth)) & np.uint64(1))]
    return found


@njit(nogil=True)
def _walk_items(i0, i1, item_cluster, item_pnode, ce_start, ce_end, ce_attr, ce_key_end, ce_keys, node, p_top,
                p_attr, cand, cap, found, seen, stack, cpos):
    for it in range(i0, i1):
        c = item_cluster[it]
        ce0 = ce_start[c]
        ce1 = ce_end[c]
        for ce in range(ce0, ce1):
            if ce_attr[ce] < len(cpos):
                cpos[ce_attr[ce]] = ce
        found[it] = walk(0, item_pnode[it], ce0, ce1, ce_attr, ce_key_end, ce_keys, ce0, node, p_top, p_attr, cpos,
                         seen, it + 1, stack, cand, it * cap, cap)
        for ce in range(ce0, ce1):
            if ce_attr[ce] < len(cpos):
                cpos[ce_attr[ce]] = -1


def traverse_items_py(task_first, task_last, item_cluster, item_pnode, ce_start, ce_end, ce_attr, ce_key_end,
                      ce_keys, node, p_top, p_attr, n_attrs, cand, cap, found):
    """Stage 3 over work items ``(item_cluster[i], item_pnode[i])`` (p-node
    -1: the whole tree from the root), items ``[task_first[t],
    task_last[t])`` per task; item ``i``'s candidate c-nodes to
    ``cand[i * cap:]``, their number to ``found[i]`` (more than ``cap``:
    walk it again with more room)."""
    n_c = len(node)
    for t in prange(len(task_first)):
        seen = np.zeros(n_c, np.int64)
        stack = np.empty(n_c + 1, np.int64)
        cpos = np.full(n_attrs, -1, np.int64)
        _walk_items(task_first[t], task_last[t], item_cluster, item_pnode, ce_start, ce_end, ce_attr, ce_key_end,
                    ce_keys, node, p_top, p_attr, cand, cap, found, seen, stack, cpos)


#: stage 3 with parallel path traversal (tasks over the cores), and without (one core walks every item)
traverse_items, traverse_items_serial = parallel_and_serial(traverse_items_py, nogil=True)


@njit(nogil=True, cache=True)
def path_items(n_clusters, ce_start, ce_end, ce_attr, node, p_attr, parallel_paths):
    """The work items of stage 3: with parallel paths, per cluster one item
    for the root (its l-node) and one per p-node of the root's p-directory
    whose attribute the cluster carries; else one item per cluster."""
    k0 = node[0, N_PDIR]
    k1 = node[0, N_PDIR_END]
    n = 0
    for c in range(n_clusters):
        n += 1
        if parallel_paths:
            for ce in range(ce_start[c], ce_end[c]):
                if find_attribute(p_attr, k0, k1, ce_attr[ce]) >= 0:
                    n += 1
    item_cluster = np.empty(n, np.int64)
    item_pnode = np.empty(n, np.int64)
    i = 0
    for c in range(n_clusters):
        item_cluster[i] = c
        item_pnode[i] = -1 if not parallel_paths else -2      # -2: the root's l-node only
        i += 1
        if parallel_paths:
            for ce in range(ce_start[c], ce_end[c]):
                k = find_attribute(p_attr, k0, k1, ce_attr[ce])
                if k >= 0:
                    item_cluster[i] = c
                    item_pnode[i] = k
                    i += 1
    return item_cluster, item_pnode


@njit(parallel=True, nogil=True, cache=True)
def gather_candidates(n_clusters, item_cluster, cand, cap, found, redo_at, redo_cand, redo_cap):
    """The candidate c-nodes per cluster (CSR), items in order (the items
    of a cluster are consecutive); an item that overflowed reads its second
    walk (``redo_at[i] >= 0``)."""
    counts = np.zeros(n_clusters, np.int64)
    for i in range(len(item_cluster)):
        counts[item_cluster[i]] += found[i]
    off = np.zeros(n_clusters + 1, np.int64)
    for c in range(n_clusters):
        off[c + 1] = off[c] + counts[c]
    first_item = np.full(n_clusters + 1, len(item_cluster), np.int64)
    for i in range(len(item_cluster) - 1, -1, -1):
        first_item[item_cluster[i]] = i
    out = np.empty(off[n_clusters], np.int64)
    for c in prange(n_clusters):
        at = off[c]
        i = first_item[c]
        while i < len(item_cluster) and item_cluster[i] == c:
            for j in range(found[i]):
                out[at + j] = cand[i * cap + j] if redo_at[i] < 0 else redo_cand[redo_at[i] * redo_cap + j]
            at += found[i]
            i += 1
    return off, out


# ------------------------------------------------------ stage 4: leaf scans
#: 64-bit words of a member mask (bit ``m`` of word ``m >> 6``: member ``m``
#: of a cluster, at most :data:`engine.algorithms.options.MAX_MEMBERS`)
MEMBER_WORDS = 2


@njit(nogil=True)
def member_table(c, cl_off, perm, ev_offsets, ev_attr, ce_start, ce_end, ce_attr, cpos, main_bits, over_bits, mk,
                 m_absent, q_base):
    """A cluster of several members, set up for checking them together:
    ``mk[q * n_m + m]`` member ``m``'s entry of compressed entry ``q``
    (local, in ``[0, ce_end[c] - ce_start[c])``) or -1, ``m_absent[q]``
    the members lacking its attribute (a member mask), ``q_base[q]`` where
    its predicates' member masks start in the cluster's cache (main bits,
    then overflow bits).  The cache needs no clearing: an entry is the
    cluster's when its stamp is ``c + 1``, which no other cluster writes."""
    m0 = cl_off[c]
    n_m = cl_off[c + 1] - m0
    ce0 = ce_start[c]
    n_q = ce_end[c] - ce0
    n_bits = len(main_bits)
    at = 0
    for q in range(n_q):
        a = ce_attr[ce0 + q]
        q_base[q] = at
        if a < n_bits:
            at += main_bits[a] + over_bits[a]
        for m in range(n_m):
            mk[q * n_m + m] = -1
        for w in range(MEMBER_WORDS):
            m_absent[q, w] = 0
    for m in range(n_m):
        e = perm[m0 + m]
        for k in range(ev_offsets[e], ev_offsets[e + 1]):
            a = ev_attr[k]
            if a < len(cpos) and cpos[a] >= 0:
                mk[(cpos[a] - ce0) * n_m + m] = k
    for q in range(n_q):
        for m in range(n_m):
            if mk[q * n_m + m] < 0:
                m_absent[q, m >> 6] |= np.uint64(1) << np.uint64(m & 63)


@njit(nogil=True)
def scan_cluster(c, cand_off, cand, node, l_head, v_attr, v_slot, alive, cl_off, perm, ev_offsets, ev_attr, e_main,
                 e_over, ce_start, ce_end, ce_attr, ce_main, ce_over, ce_absent, main_bits, over_bits, table, store,
                 cpos, bm0, bm1, found, mk, m_absent, q_base, stamp, cache, need):
    """The candidate units of cluster ``c``: each checked against the
    compressed event, then -- several members -- against all the members
    at once; member ``m``'s TRUE positions marked in ``bm0[m]``/``bm1[m]``,
    counted in ``found[m]``.

    The members are checked together (bit-sliced): a predicate's *member
    mask* -- which members it is TRUE on, one bit each -- is read from the
    members' slices once per cluster, on its first use, and cached
    (``cache``, its ``stamp``); a unit's members are the AND of its
    predicates' masks.  A predicate shared by several candidate units (a
    BE-Tree leaf's units share attributes, the workloads' operands repeat)
    is thus read once for the cluster instead of once per unit and member,
    and a unit costs one AND per predicate however many members the
    cluster has."""
    m0 = cl_off[c]
    n_m = cl_off[c + 1] - m0
    ce0 = ce_start[c]
    for ce in range(ce0, ce_end[c]):
        if ce_attr[ce] < len(cpos):
            cpos[ce_attr[ce]] = ce
    for m in range(n_m):
        found[m] = 0
    if n_m > 1:
        member_table(c, cl_off, perm, ev_offsets, ev_attr, ce_start, ce_end, ce_attr, cpos, main_bits, over_bits,
                     mk, m_absent, q_base)
    n_w = (n_m + 63) >> 6
    for ci in range(cand_off[c], cand_off[c + 1]):
        cn = cand[ci]
        for i in range(node[cn, N_LEAF], node[cn, N_LEAF_END]):
            pos = l_head[i, 0]
            if alive[pos] == 0:
                continue
            word = pos >> 6
            mask = np.uint64(1) << np.uint64(pos & 63)
            if n_m == 1 and (bm0[0, word] & mask) != 0:
                continue
            ok = True
            for v in range(l_head[i, 1], l_head[i + 1, 1]):
                a = v_attr[v]
                ce = cpos[a] if a < len(cpos) else -1
                slot = v_slot[v]
                if slot == NULL_SLOT:
                    t = ce < 0 or ce_absent[ce] != 0
                else:
                    t = ce >= 0 and slot_true(slot, True, ce_main[ce], ce_over[ce], table, store)
                if not t:
                    ok = False
                    break
            if not ok:
                continue
            if n_m == 1:
                bm0[0, word] |= mask
                bm1[0, word >> 6] |= np.uint64(1) << np.uint64(word & 63)
                found[0] += 1
                continue
            # every member at once: the AND of the predicates' member masks
            for w in range(n_w):
                need[w] = ~np.uint64(0)
            if n_m & 63:
                need[n_w - 1] = (np.uint64(1) << np.uint64(n_m & 63)) - np.uint64(1)
            for v in range(l_head[i, 1], l_head[i + 1, 1]):
                a = v_attr[v]
                q = cpos[a] - ce0 if a < len(cpos) and cpos[a] >= 0 else -1
                slot = v_slot[v]
                any_left = False
                if slot == NULL_SLOT:       # TRUE where the member lacks the attribute
                    for w in range(n_w):
                        if q >= 0:
                            need[w] &= m_absent[q, w]
                        any_left |= need[w] != 0
                else:                       # q >= 0: the compressed check found the attribute
                    at = q_base[q] + (slot if slot >= 0 else main_bits[a] + (-2 - slot))
                    if stamp[at] != c + 1:  # its member mask, read from the members' slices once
                        stamp[at] = c + 1
                        for w in range(n_w):
                            cache[at, w] = 0
                        for m in range(n_m):
                            k = mk[q * n_m + m]
                            if k >= 0 and slot_true(slot, True, e_main[k], e_over[k], table, store):
                                cache[at, m >> 6] |= np.uint64(1) << np.uint64(m & 63)
                    for w in range(n_w):
                        need[w] &= cache[at, w]
                        any_left |= need[w] != 0
                if not any_left:
                    break
            for w in range(n_w):
                bits = need[w]
                while bits != 0:
                    low = bits & (~bits + np.uint64(1))
                    m = w * 64 + ctz(low)
                    bits ^= low
                    if (bm0[m, word] & mask) == 0:
                        bm0[m, word] |= mask
                        bm1[m, word >> 6] |= np.uint64(1) << np.uint64(word & 63)
                        found[m] += 1
    for ce in range(ce0, ce_end[c]):
        if ce_attr[ce] < len(cpos):
            cpos[ce_attr[ce]] = -1


@njit(nogil=True)
def scan_task(c_first, c_last, out, base, cap, cl_count, ev_count, cand_off, cand, node, l_head, v_attr, v_slot, alive,
              cl_off, perm, ev_offsets, ev_attr, e_main, e_over, ce_start, ce_end, ce_attr, ce_main, ce_over,
              ce_absent, main_bits, over_bits, table, store, cpos, bm0, bm1, found, mk, m_absent, q_base, stamp, cache,
              need, result):
    """Clusters ``[c_first, c_last)`` (the protocol of
    :func:`engine.algorithms.host_tasks.match_in_tasks`, a cluster standing
    for an event): each member's positions, ascending, in cluster order."""
    used = 0
    result[0] = c_last
    result[1] = 0
    for c in range(c_first, c_last):
        scan_cluster(c, cand_off, cand, node, l_head, v_attr, v_slot, alive, cl_off, perm, ev_offsets, ev_attr,
                     e_main, e_over, ce_start, ce_end, ce_attr, ce_main, ce_over, ce_absent, main_bits, over_bits,
                     table, store, cpos, bm0, bm1, found, mk, m_absent, q_base, stamp, cache, need)
        wrote = emit_cluster(c, cl_off, found, bm0, bm1, out, base + used, cap - used, cl_count, ev_count)
        if wrote < 0:
            result[0] = c
            result[1] = -1 - wrote
            return
        used += wrote


@njit(nogil=True)
def emit_cluster(c, cl_off, found, bm0, bm1, out, at, room, cl_count, ev_count):
    """Cluster ``c``'s marked positions, member by member (each ascending),
    written to ``out[at:]`` if they fit in ``room``, the marks cleared
    either way; returns their number, or ``-1 - number`` when they did not
    fit (nothing counted)."""
    n_m = cl_off[c + 1] - cl_off[c]
    total = 0
    for m in range(n_m):
        total += found[m]
    write = total <= room
    for m in range(n_m):
        at = emit_marked(bm0[m], bm1[m], out, at, write)
    if not write:
        return -1 - total
    for m in range(n_m):
        ev_count[cl_off[c] + m] = found[m]
    cl_count[c] = total
    return total


def scan_kernel_py(task_first, task_last, out, cap, cl_count, task_stop, task_need, n_positions, max_members, n_attrs,
                   max_entries, cache_len, ev_count, cand_off, cand, node, l_head, v_attr, v_slot, alive, cl_off, perm,
                   ev_offsets, ev_attr, e_main, e_over, ce_start, ce_end, ce_attr, ce_main, ce_over, ce_absent,
                   main_bits, over_bits, table, store):
    """Stage 4 over tasks of clusters.  Scratch per task: a bit per
    subscription and member (the marks), and for checking members together
    the member table (``max_entries``: the most compressed entries of a
    cluster of several) and the member-mask cache (``cache_len``: the most
    predicate bits of such a cluster's attributes)."""
    n_words = (n_positions + 63) >> 6
    for t in prange(len(task_first)):
        cpos = np.full(n_attrs, -1, np.int64)
        bm0 = np.zeros((max_members, max(n_words, 1)), np.uint64)
        bm1 = np.zeros((max_members, max((n_words + 63) >> 6, 1)), np.uint64)
        found = np.zeros(max_members, np.int64)
        mk = np.empty(max(max_entries * max_members, 1), np.int64)
        m_absent = np.empty((max(max_entries, 1), MEMBER_WORDS), np.uint64)
        q_base = np.empty(max(max_entries, 1), np.int64)
        stamp = np.zeros(max(cache_len, 1), np.int64)
        cache = np.empty((max(cache_len, 1), MEMBER_WORDS), np.uint64)
        need = np.empty(MEMBER_WORDS, np.uint64)
        result = np.empty(2, np.int64)
        scan_task(task_first[t], task_last[t], out, t * cap, cap, cl_count, ev_count, cand_off, cand, node, l_head,
                  v_attr, v_slot, alive, cl_off, perm, ev_offsets, ev_attr, e_main, e_over, ce_start, ce_end, ce_attr,
                  ce_main, ce_over, ce_absent, main_bits, over_bits, table, store, cpos, bm0, bm1, found, mk,
                  m_absent, q_base, stamp, cache, need, result)
        task_stop[t] = result[0]
        task_need[t] = result[1]


@njit(nogil=True, cache=True)
def member_scratch(cl_off, ce_start, ce_end, ce_attr, main_bits, over_bits):
    """``(max_entries, cache_len)`` of :func:`scan_kernel_py`'s scratch:
    over the clusters of several members, the most compressed entries and
    the most predicate bits of their attributes."""
    max_entries = 0
    cache_len = 0
    for c in range(len(cl_off) - 1):
        if cl_off[c + 1] - cl_off[c] < 2:
            continue
        max_entries = max(max_entries, ce_end[c] - ce_start[c])
        bits = 0
        for ce in range(ce_start[c], ce_end[c]):
            a = ce_attr[ce]
            if a < len(main_bits):
                bits += main_bits[a] + over_bits[a]
        cache_len = max(cache_len, bits)
    return max_entries, cache_len


#: stage 4: clusters over all cores, and on the calling thread (a few clusters, the Bitmap baseline)
scan_kernel, scan_kernel_serial = parallel_and_serial(scan_kernel_py, nogil=True)


# ----------------------------------------------- the base algorithm "C"
@njit(parallel=True, nogil=True, cache=True)
def _scan_leaf_members(cn, c, node, l_head, v_attr, v_slot, alive, cl_off, perm, ev_offsets, ev_attr, e_main, e_over,
                       table, store, bm0, bm1, found):
    """One leaf scanned for every member of cluster ``c`` in parallel (C's
    per-leaf parallel loop)."""
    m0 = cl_off[c]
    for m in prange(cl_off[c + 1] - m0):
        e = perm[m0 + m]
        s0 = ev_offsets[e]
        s1 = ev_offsets[e + 1]
        for i in range(node[cn, N_LEAF], node[cn, N_LEAF_END]):
            pos = l_head[i, 0]
            word = pos >> 6
            mask = np.uint64(1) << np.uint64(pos & 63)
            if alive[pos] == 0 or (bm0[m, word] & mask) != 0:
                continue
            hit = True
            for v in range(l_head[i, 1], l_head[i + 1, 1]):
                k = find_attribute(ev_attr, s0, s1, v_attr[v])
                slot = v_slot[v]
                if slot == NULL_SLOT:
                    t = k < 0
                else:
                    t = k >= 0 and slot_true(slot, True, e_main[k], e_over[k], table, store)
                if not t:
                    hit = False
                    break
            if hit:
                bm0[m, word] |= mask
                bm1[m, word >> 6] |= np.uint64(1) << np.uint64(word & 63)
                found[m] += 1


@njit(nogil=True, cache=True)
def match_interleaved(n_positions, max_members, n_attrs, node, p_top, p_attr, l_head, v_attr, v_slot, alive, cl_off,
                      perm, ev_offsets, ev_attr, e_main, e_over, ce_start, ce_end, ce_attr, ce_key_end, ce_keys,
                      table, store, out_off, out):
    """The base algorithm C: per cluster, walk and scan each leaf found at
    once (members in parallel per leaf).  ``out_off`` (per cluster member
    in cluster order, length members + 1) is filled with the counts'
    prefix sums and ``out`` grown as needed; returns ``out``."""
    n_words = (n_positions + 63) >> 6
    n_c = len(node)
    seen = np.zeros(n_c, np.int64)
    stack = np.empty(n_c + 1, np.int64)
    cpos = np.full(n_attrs, -1, np.int64)
    bm0 = np.zeros((max_members, max(n_words, 1)), np.uint64)
    bm1 = np.zeros((max_members, max((n_words + 63) >> 6, 1)), np.uint64)
    found = np.zeros(max_members, np.int64)
    used = 0
    for c in range(len(cl_off) - 1):
        ce0 = ce_start[c]
        ce1 = ce_end[c]
        for ce in range(ce0, ce1):
            if ce_attr[ce] < n_attrs:
                cpos[ce_attr[ce]] = ce
        found[:] = 0
        # the walk, one c-node at a time: walk() with room for one candidate, then that leaf scanned
        stack[0] = 0
        sp = 1
        seen[0] = c + 1
        while sp > 0:
            sp -= 1
            cn = stack[sp]
            if node[cn, N_LEAF] != node[cn, N_LEAF_END]:
                _scan_leaf_members(cn, c, node, l_head, v_attr, v_slot, alive, cl_off, perm, ev_offsets, ev_attr,
                                   e_main, e_over, table, store, bm0, bm1, found)
            for k in range(node[cn, N_PDIR], node[cn, N_PDIR_END]):
                a = p_attr[k]
                if a >= n_attrs or cpos[a] < 0:
                    continue
                ce = cpos[a]
                q0 = ce0 if ce == ce0 else ce_key_end[ce - 1]
                for q in range(q0, ce_key_end[ce]):
                    key = ce_keys[q]
                    d = p_top[k]
                    while d >= 0:
                        depth = node[d, N_DEPTH]
                        if depth > 0 and (key >> np.uint64(64 - depth)) != np.uint64(node[d, N_PREFIX]):
                            break
                        if seen[d] != c + 1 and (node[d, N_LEAF] != node[d, N_LEAF_END]
                                                 or node[d, N_PDIR] != node[d, N_PDIR_END]):
                            seen[d] = c + 1
                            stack[sp] = d
                            sp += 1
                        if depth >= ATOMIC:
                            break
                        d = node[d, N_CHILD + np.int64((key >> np.uint64(63 - depth)) & np.uint64(1))]
        for ce in range(ce0, ce1):
            if ce_attr[ce] < n_attrs:
                cpos[ce_attr[ce]] = -1
        m0 = cl_off[c]
        total = 0
        for m in range(cl_off[c + 1] - m0):
            total += found[m]
        while used + total > len(out):
            grown = np.empty(2 * len(out) + total, out.dtype)
            grown[:used] = out[:used]
            out = grown
        for m in range(cl_off[c + 1] - m0):
            used = emit_marked(bm0[m], bm1[m], out, used, True)
            out_off[m0 + m + 1] = used
    return out[:used]
