"""A-PCM over OpIndex's lists: compressed events matched by counting (cpu).

The A-PCM paper compresses events over BE-Tree; the idea -- one index
traversal per compressed event (the OR of a cluster's bitmaps), then the
exact per-event check of the candidates it yields -- fits any index whose
traversal reads only *which predicates are TRUE*.  OpIndex's is such a
traversal (Zhang, Chan, Tan, PVLDB 2014, §4): a subscription (here a
unit, one conjunction) lives in the lists of one *pivot attribute* (the
least frequent of its attributes), the lists of a pivot are split by
attribute and operand, and an event's matching is counting: every
satisfied list entry decrements its unit's counter; a counter reaching
zero is a match.  Only the pivots the event carries are visited.

Over the bitmap encoding no list needs a search by value: an entry is
(predicate slot, unit), and whether it is satisfied is one bit of the
event's slice of the list's attribute.  :class:`CountingLists` holds the
two levels as CSR arrays: per pivot its lists, one per attribute, each
its entries.  A cluster visits the lists (p, b) of the pivots p and
attributes b it carries, tests each entry's bit, and counts.  A
compressed event's bits are the OR of its members', so an entry TRUE on
*some* member is counted once for the whole cluster; a unit whose counter
reaches zero has every predicate TRUE on some member -- a candidate,
checked against each member at once with the member masks of
:func:`gpu_kernels.apcm.cpu.scan_cluster`.  A cluster of one event is
plain OpIndex counting over its bitmap (exact: no member check).  Every
(pivot, attribute) list the event carries is read whole -- OpIndex's
value-sorted lists read only the satisfied part -- but an entry costs a
bit test in a slice already in cache.

Units whose predicates all lack a bit (``IS NULL`` only, or none: a
constant TRUE) have no pivot and no entry, and units with more predicates
than a counter counts (:data:`NEED_MASK`) have no entry either: these are
checked against every cluster's compressed event (:func:`compressed_true`).

The clusters come from online stream re-ordering (BE-Tree's clustering of
events, :mod:`engine.algorithms.osr`) exactly as for A-PCM over BE-Tree;
stages 1 and 2 (encoding, compression) are shared
(:mod:`gpu_kernels.apcm.cpu`); this module replaces stages 3 and 4.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
from numba import njit, prange

from gpu_kernels.apcm.cpu import MEMBER_WORDS, NO_SLICE, emit_cluster, member_table, slice_bit, slot_true
from gpu_kernels.apcm.layout import NULL_SLOT
from gpu_kernels.compaction import ctz
from gpu_kernels.opindex.cpu import choose_pivots
from gpu_kernels.predicates import find_attribute
from gpu_kernels.twins import parallel_and_serial

#: a counter (int32) is ``mark << NEED_BITS | entries left``: the mark names
#: the cluster it counts for (a task's clusters numbered from 1, no clearing
#: between them), the low bits the unit's entries not yet seen TRUE
NEED_BITS = 8
NEED_MASK = (1 << NEED_BITS) - 1
MAX_MARK = (1 << (31 - NEED_BITS)) - 1


class CountingLists(NamedTuple):
    """OpIndex's two-level partition of the units, over the bitmap layout:
    pivot attribute ``p``'s lists are rows ``pivot_off[p] .. pivot_off[p + 1]``,
    one per attribute ``pa_attr[r]`` (ascending), each the entries
    ``pa_off[r] .. pa_off[r + 1]``: (predicate slot, unit), by unit."""

    pivot_off: np.ndarray     # int64 [n_pivots + 1]: CSR, pivot attribute -> its attribute lists
    pa_attr: np.ndarray       # int64 [n_lists]: a list's attribute
    pa_off: np.ndarray        # int64 [n_lists + 1]: CSR, list -> its entries
    entry_slot: np.ndarray    # int32 [n_entries]: the predicate's slot (gpu_kernels.apcm.layout)
    entry_unit: np.ndarray    # int64 [n_entries]: unit << NEED_BITS | the unit's entries (its counter's start)
    has_null: np.ndarray      # uint8 [n_units]: the unit has an IS NULL predicate (no bit)
    always: np.ndarray        # int64: units counting cannot decide (no entry, or too many), checked every cluster
    u_off: np.ndarray         # int64 [n_units + 1]: the unit's predicates, for the member check
    u_attr: np.ndarray        # int64
    u_slot: np.ndarray        # int64
    u_sub: np.ndarray         # int64 [n_units]: the unit's subscription position

    @property
    def nbytes(self) -> int:
        return int(sum(a.nbytes for a in self))


def build_counting_lists(units, layout) -> CountingLists:
    """The lists of ``units`` (:class:`engine.algorithms.units.Units`) over
    ``layout`` (:class:`gpu_kernels.apcm.layout.BitmapLayout`)."""
    rows = units.rows
    n_units = len(units.sub)
    offsets = np.asarray(units.offsets, np.int64)
    pids = np.asarray(units.pids, np.int64)
    attr = np.asarray(rows.attr, np.int64)
    slot = np.asarray(layout.pred_slot, np.int64)
    u_attr = attr[pids]
    u_slot = slot[pids]
    unit_of = np.repeat(np.arange(n_units, dtype=np.int64), np.diff(offsets))
    has_bit = u_slot != NULL_SLOT
    n_attrs = int(attr.max(initial=-1)) + 1
    # the pivot (OpIndex eq. 1): of the attributes the unit's bits are on, the least frequent among the units
    frequency = np.bincount(u_attr[has_bit], minlength=n_attrs).astype(np.int64)
    pivot, _ = choose_pivots(offsets, pids, attr, slot != NULL_SLOT, frequency, np.ones(len(attr), np.int64))
    need = np.bincount(unit_of[has_bit], minlength=n_units)
    always = (need == 0) | (need > NEED_MASK)
    counted = has_bit & ~always[unit_of]
    e_attr, e_slot, e_unit = u_attr[counted], u_slot[counted], unit_of[counted]
    # entries by (pivot, attribute), then unit (stable: they come in unit order), so that a list's counters
    # are visited in address order
    list_key = pivot[e_unit] * max(n_attrs, 1) + e_attr
    order = np.argsort(list_key, kind="stable")
    list_key, e_slot, e_unit = list_key[order], e_slot[order], e_unit[order]
    starts = np.flatnonzero(np.concatenate(([True], list_key[1:] != list_key[:-1]))) if len(order) \
        else np.zeros(0, np.int64)
    pa_key = list_key[starts]
    pa_off = np.append(starts, len(order)).astype(np.int64)
    pivot_off = np.zeros(n_attrs + 1, np.int64)
    np.cumsum(np.bincount(pa_key // max(n_attrs, 1), minlength=n_attrs), out=pivot_off[1:])
    has_null = np.zeros(n_units, np.uint8)
    has_null[unit_of[~has_bit]] = 1
    return CountingLists(pivot_off, pa_key % max(n_attrs, 1), pa_off, e_slot.astype(np.int32),
                         e_unit << NEED_BITS | need[e_unit], has_null, np.flatnonzero(always).astype(np.int64),
                         offsets, u_attr, u_slot, np.asarray(units.sub, np.int64))


@njit(nogil=True)
def compressed_true(u, lists, cpos, ce_main, ce_over, ce_absent, table, store):
    """Is every predicate of unit ``u`` TRUE on the compressed event (for
    the units counting does not decide)?"""
    for v in range(lists.u_off[u], lists.u_off[u + 1]):
        a = lists.u_attr[v]
        ce = cpos[a] if a < len(cpos) else -1
        slot = lists.u_slot[v]
        if slot == NULL_SLOT:
            if ce >= 0 and ce_absent[ce] == 0:
                return False
        elif ce < 0 or not slot_true(slot, True, ce_main[ce], ce_over[ce], table, store):
            return False
    return True


@njit(nogil=True)
def count_cluster(c, mark, lists, alive, cl_off, perm, ev_offsets, ev_attr, e_main, e_over, ce_start, ce_end,
                  ce_attr, ce_main, ce_over, ce_absent, main_bits, over_bits, table, store, cpos, counter, cands, bm0,
                  bm1, found, mk, m_absent, q_base, stamp, cache, need):
    """Cluster ``c`` matched by counting over its compressed event's set
    bits (``mark``: its mark in the counters, :data:`NEED_BITS`), then its
    candidates checked per member: member ``m``'s TRUE positions marked in
    ``bm0[m]``/``bm1[m]``, counted in ``found[m]``.

    Written out in one function, as :func:`gpu_kernels.opindex.cpu.match_task`
    and :func:`gpu_kernels.apcm.cpu.scan_cluster` are: a helper taking
    arrays costs atomic reference-count updates per call, shared between
    the threads -- measured here: a helper per candidate made the kernel
    3x slower, and moving scan_cluster's member check into one made A-PCM
    15-20 % slower."""
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
    pivot_off = lists.pivot_off
    pa_attr = lists.pa_attr
    pa_off = lists.pa_off
    entry_slot = lists.entry_slot
    entry_unit = lists.entry_unit
    has_null = lists.has_null
    u_off = lists.u_off
    u_attr = lists.u_attr
    u_slot = lists.u_slot
    u_sub = lists.u_sub
    n_pivots = len(pivot_off) - 1
    # counting: the candidates, units whose every predicate with a bit is TRUE on the compressed event
    n_cands = 0
    for j in range(len(lists.always)):
        u = lists.always[j]
        if compressed_true(u, lists, cpos, ce_main, ce_over, ce_absent, table, store):
            cands[n_cands] = u
            n_cands += 1
    for cp in range(ce0, ce_end[c]):                 # the pivots the cluster carries
        p = ce_attr[cp]
        if p >= n_pivots or pivot_off[p] == pivot_off[p + 1]:
            continue
        for cb in range(ce0, ce_end[c]):             # their lists of the attributes it carries
            r = find_attribute(pa_attr, pivot_off[p], pivot_off[p + 1], ce_attr[cb])
            if r < 0:
                continue
            p_main = ce_main[cb]
            p_over = ce_over[cb]
            # the main slice's words, read without a branch on where they are
            words = table if p_main >= 0 else store
            at = p_main if p_main >= 0 else -2 - p_main
            for k in range(pa_off[r], pa_off[r + 1]):
                s = entry_slot[k]
                if s >= 0:
                    if p_main == NO_SLICE or (words[at + (s >> 6)] >> np.uint64(s & 63)) & np.uint64(1) == 0:
                        continue
                elif not slice_bit(p_over, -2 - s, table, store):
                    continue
                code = entry_unit[k]
                u = code >> NEED_BITS
                held = counter[u]
                left = ((held & NEED_MASK) if (held >> NEED_BITS) == mark else code & NEED_MASK) - 1
                counter[u] = (mark << NEED_BITS) | left
                if left == 0:
                    cands[n_cands] = u
                    n_cands += 1
    # the candidates per member (one member: exact but for IS NULL)
    n_w = (n_m + 63) >> 6
    for i in range(n_cands):
        u = cands[i]
        pos = u_sub[u]
        if alive[pos] == 0:
            continue
        word = pos >> 6
        mask = np.uint64(1) << np.uint64(pos & 63)
        if n_m == 1:
            if (bm0[0, word] & mask) != 0:
                continue
            ok = True
            if has_null[u]:
                for v in range(u_off[u], u_off[u + 1]):
                    a = u_attr[v]
                    if u_slot[v] == NULL_SLOT and a < len(cpos) and cpos[a] >= 0 and ce_absent[cpos[a]] == 0:
                        ok = False
                        break
            if ok:
                bm0[0, word] |= mask
                bm1[0, word >> 6] |= np.uint64(1) << np.uint64(word & 63)
                found[0] += 1
            continue
        # every member at once: the AND of the predicates' member masks (as scan_cluster)
        for w in range(n_w):
            need[w] = ~np.uint64(0)
        if n_m & 63:
            need[n_w - 1] = (np.uint64(1) << np.uint64(n_m & 63)) - np.uint64(1)
        for v in range(u_off[u], u_off[u + 1]):
            a = u_attr[v]
            q = cpos[a] - ce0 if a < len(cpos) and cpos[a] >= 0 else -1
            slot = u_slot[v]
            any_left = False
            if slot == NULL_SLOT:       # TRUE where the member lacks the attribute
                for w in range(n_w):
                    if q >= 0:
                        need[w] &= m_absent[q, w]
                    any_left |= need[w] != 0
            else:                       # q >= 0: the unit is TRUE on the compressed event
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


def count_kernel_py(task_first, task_last, out, cap, cl_count, task_stop, task_need, n_positions, max_members,
                    n_attrs, max_entries, cache_len, ev_count, lists, alive, cl_off, perm, ev_offsets, ev_attr, e_main,
                    e_over, ce_start, ce_end, ce_attr, ce_main, ce_over, ce_absent, main_bits, over_bits, table,
                    store, max_mark):
    """Counting over tasks of clusters (the protocol of
    :func:`engine.algorithms.host_tasks.match_in_tasks`, a cluster standing
    for an event).  Scratch per task: :func:`gpu_kernels.apcm.cpu.scan_kernel_py`'s,
    a counter per unit and the candidates of a cluster.  ``max_mark``: the
    marks a task uses before clearing its counters (:data:`MAX_MARK`; a
    test lowers it)."""
    n_words = (n_positions + 63) >> 6
    n_units = len(lists.has_null)
    for t in prange(len(task_first)):
        cpos = np.full(n_attrs, -1, np.int64)
        counter = np.zeros(max(n_units, 1), np.int32)
        cands = np.empty(max(n_units, 1), np.int64)
        mark = 0
        bm0 = np.zeros((max_members, max(n_words, 1)), np.uint64)
        bm1 = np.zeros((max_members, max((n_words + 63) >> 6, 1)), np.uint64)
        found = np.zeros(max_members, np.int64)
        mk = np.empty(max(max_entries * max_members, 1), np.int64)
        m_absent = np.empty((max(max_entries, 1), MEMBER_WORDS), np.uint64)
        q_base = np.empty(max(max_entries, 1), np.int64)
        stamp = np.zeros(max(cache_len, 1), np.int64)
        cache = np.empty((max(cache_len, 1), MEMBER_WORDS), np.uint64)
        need = np.empty(MEMBER_WORDS, np.uint64)
        used = 0
        stop = task_last[t]
        missing = 0
        for c in range(task_first[t], task_last[t]):
            mark += 1
            if mark > max_mark:                  # every mark used: the counters start afresh
                counter[:] = 0
                mark = 1
            count_cluster(c, np.int32(mark), lists, alive, cl_off, perm, ev_offsets, ev_attr, e_main, e_over, ce_start, ce_end,
                          ce_attr, ce_main, ce_over, ce_absent, main_bits, over_bits, table, store, cpos, counter, cands,
                          bm0, bm1, found, mk, m_absent, q_base, stamp, cache, need)
            wrote = emit_cluster(c, cl_off, found, bm0, bm1, out, t * cap + used, cap - used, cl_count, ev_count)
            if wrote < 0:
                stop = c
                missing = -1 - wrote
                break
            used += wrote
        task_stop[t] = stop
        task_need[t] = missing


#: clusters over all cores, and on the calling thread (a few clusters, the Bitmap baseline)
count_kernel, count_kernel_serial = parallel_and_serial(count_kernel_py, nogil=True)
