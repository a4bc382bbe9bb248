"""OpIndex CPU kernels (Zhang, Chan, Tan, PVLDB 2014, §4-§6): building the two-level index and
matching events against it by counting.

The structure is one :class:`~gpu_kernels.opindex.layout.OpIndexArrays`
(its layout: :mod:`gpu_kernels.opindex.layout`), built by
:mod:`engine.algorithms.opindex` and handed whole to the kernels here and
to their CUDA twins in :mod:`gpu_kernels.opindex.cuda`.

Matching (Algorithm 2) is :func:`match_task`, a function of a range of
events over the structure, the segment's :class:`~gpu_kernels.opindex.layout.Programs`
and per-thread scratch (counters, clause bits, the counters that reached 0,
and a two-level bitmap of matched subscription positions that
de-duplicates and orders the output); :func:`opindex_match_kernel` runs it
over ``prange`` tasks of events, :func:`opindex_match_serial` on the
calling thread.  Building is a few sequential passes (:func:`plain_units`,
:func:`choose_pivots`, :func:`emit_entries`, :func:`counting_order`,
:func:`sort_within_lists`, :func:`gather_sorted`, :func:`build_directory`);
a merge (docs/architecture.md#the-index-life-cycle) merges the entries of added subscriptions into an
old index's lists in one linear pass (:func:`merge_entries`, with
:func:`sort_runs` for runs whose keys moved) before
:func:`build_directory`.
"""

from __future__ import annotations

import numpy as np
from numba import njit, prange

from gpu_kernels.compaction import emit_marked
from gpu_kernels.list_truth import LIST_BITS_ROWS, LIST_CODE_MASK, LIST_CODE_SHIFT, clear_list_bits
from gpu_kernels.opcodes import FIRST_LIST_OP, IN, LAST_LIST_OP, LIKE, NOT_IN, NOT_MATCHES, TRUE
from gpu_kernels.opindex.layout import L_EQ, L_LE, L_PREFIX, L_VERIFY, N_LISTS, attr_bit_py, eq_bit_py
from gpu_kernels.predicates import find_attribute, list_hit, list_key, predicate_truth
from gpu_kernels.scan import run_program
from gpu_kernels.twins import parallel_and_serial

attr_bit = njit(inline="always", nogil=True)(attr_bit_py)
eq_bit = njit(inline="always", nogil=True)(eq_bit_py)


# --------------------------------------------------------------------------
# matching (Algorithm 2)
#
# The hot path is written out in one function: numba keeps reference-count
# updates (atomic, shared between threads) around every call that passes
# arrays, inlined helpers included, and those cost more than the work.
# --------------------------------------------------------------------------
@njit(nogil=True)
def match_task(e_first, e_last, out, base, cap, ev_count, ev_offsets, ev_attr, ev_value, ev_token, pattern_truth,
               list_truth, index, programs, counter_live, alive, counters, slots, hits, bm0, bm1, stack, list_bits,
               list_rows, result):
    """Match events ``[e_first, e_last)``: write each event's alive TRUE
    subscription positions, ascending, to ``out[base + used:]`` and
    their number to ``ev_count[e]``.  When an event's positions do not
    fit in ``cap``, stop: ``result = (that event, its count)``; else
    ``result = (e_last, 0)``."""
    # the structure's arrays, read once (no reference-count updates in the loops)
    pivot_of_attr = index.pivot_of_attr
    part_counter_start = index.part_counter_start
    part_slot_start = index.part_slot_start
    list_shift = index.list_shift
    list_bucket_base = index.list_bucket_base
    list_side_base = index.list_side_base
    bucket_run_start = index.bucket_run_start
    bucket_sig = index.bucket_sig
    sig_bits = index.sig_bits
    use_sig = index.use_sig
    run_attr = index.run_attr
    run_start = index.run_start
    ent_val = index.ent_val
    vals = index.vals
    use_rank = index.use_rank
    ent_target = index.ent_target
    side_pid = index.side_pid
    side_hi = index.side_hi
    counter_init = index.counter_init
    counter_sub = index.counter_sub
    counter_post_start = index.counter_post_start
    post_attr = index.post_attr
    slot_counter = index.slot_counter
    x_op = index.x_op
    x_lo = index.x_lo
    x_hi = index.x_hi
    x_set_start = index.x_set_start
    x_set_stop = index.x_set_stop
    set_values = index.set_values
    x_aux = index.x_aux
    always_pos = index.always_pos
    prog_offsets = programs.prog_offsets
    prog_kind = programs.prog_kind
    prog_arg = programs.prog_arg
    p_attr = programs.p_attr
    p_op = programs.p_op
    p_lo = programs.p_lo
    p_hi = programs.p_hi
    p_set_offsets = programs.p_set_offsets
    p_set_values = programs.p_set_values
    p_aux = programs.p_aux
    n_attrs = len(pivot_of_attr)
    list_words = list_bits.shape[1]
    has_post = len(counter_post_start) > 1     # (length 1: no IS NULL tests at all)
    used = 0
    result[0] = e_last
    result[1] = 0
    for e in range(e_first, e_last):
        ev_start = ev_offsets[e]
        ev_stop = ev_offsets[e + 1]
        found = 0
        n_cached = 0         # the event's list rows with a bitmap in list_bits
        # subscriptions no event attribute can find: evaluated on every event
        for k in range(len(always_pos)):
            pos = always_pos[k]
            if alive[pos] != 0:
                if run_program(prog_offsets[pos], prog_offsets[pos + 1], prog_kind, prog_arg, ev_start, ev_stop,
                               ev_attr, ev_value, ev_token, p_attr, p_op, p_lo, p_hi, p_set_offsets,
                               p_set_values, p_aux, pattern_truth, list_truth, stack) == TRUE:
                    word = pos >> 6
                    mask = np.uint64(1) << np.uint64(pos & 63)
                    if (bm0[word] & mask) == 0:
                        bm0[word] |= mask
                        bm1[word >> 6] |= np.uint64(1) << np.uint64(word & 63)
                        found += 1
        # Lemma 1: only the partitions of pivots the event carries
        for j in range(ev_start, ev_stop):
            pivot_attr = ev_attr[j]
            if pivot_attr >= n_attrs:
                continue
            p = pivot_of_attr[pivot_attr]
            if p < 0:
                continue
            # entries point at counters (>= 0) and clause slots (< 0) relative to the partition's
            c_base = part_counter_start[p]
            s_base = part_slot_start[p]
            for c in range(c_base, part_counter_start[p + 1]):   # initialise V_{A_p}
                counters[c] = counter_init[c]
            for c in range(s_base, part_slot_start[p + 1]):
                slots[c] = 0
            n_hits = 0
            for i in range(ev_start, ev_stop):
                attr = ev_attr[i]
                if attr >= n_attrs:
                    continue
                v = ev_value[i]
                vq = v           # the value in the lists' operand domain
                if use_rank:     # operands stored as 2 * rank + 1 among the distinct operands
                    lo = 0
                    n = len(vals)
                    while n > 0:
                        half = n >> 1
                        go = vals[lo + half] < v
                        lo = lo + half + 1 if go else lo
                        n = n - half - 1 if go else half
                    vq = 2.0 * lo + (1.0 if lo < len(vals) and vals[lo] == v else 0.0)
                for op in range(8):
                    l = p * 8 + op
                    shift = list_shift[l]
                    if shift < 0:
                        continue
                    # segment directory, then the segment's signature (Example 3)
                    bucket = list_bucket_base[l] + (attr >> shift)
                    if use_sig:
                        bit = eq_bit(attr, vq, sig_bits) if op == 0 else attr_bit(attr, sig_bits)
                        if ((bucket_sig[bucket] >> np.uint64(bit)) & np.uint64(1)) == 0:
                            continue
                    # the attribute's run in the segment
                    lo = find_attribute(run_attr, bucket_run_start[bucket], bucket_run_start[bucket + 1], attr)
                    if lo < 0:
                        continue
                    a = run_start[lo]
                    b = run_start[lo + 1]
                    # range scans of §4.2 (entries sorted by operand):
                    # first >= v (lower) and first > v (upper)
                    # (branch-free binary searches: the comparisons are unpredictable)
                    lower = a
                    upper = b
                    if op != 2 and op != 5 and op != 7:
                        lo = a
                        n = b - a
                        while n > 0:
                            half = n >> 1
                            go = ent_val[lo + half] < vq
                            lo = lo + half + 1 if go else lo
                            n = n - half - 1 if go else half
                        lower = lo
                    if op == 0 or op == 1 or op == 2 or op == 5 or op == 7:
                        lo = lower
                        n = b - lower
                        while n > 0:
                            half = n >> 1
                            go = ent_val[lo + half] <= vq
                            lo = lo + half + 1 if go else lo
                            n = n - half - 1 if go else half
                        upper = lo
                    lo0 = a
                    hi0 = b
                    lo1 = b
                    if op == 0:      # operand == v
                        lo0 = lower
                        hi0 = upper
                    elif op == 1:    # operand != v
                        hi0 = lower
                        lo1 = upper
                    elif op == 2:    # v < operand
                        lo0 = upper
                    elif op == 3:    # v <= operand
                        lo0 = lower
                    elif op == 4:    # v > operand
                        hi0 = lower
                    elif op == 5 or op == 7:    # v >= operand; PREFIX: interval starts at or below v
                        hi0 = upper
                    if op < 6:
                        for half in range(2):
                            k0 = lo0 if half == 0 else lo1
                            k1 = hi0 if half == 0 else b
                            for k in range(k0, k1):
                                t = np.int64(ent_target[k]) + c_base
                                if t < c_base:       # a CNF clause: its bit, once
                                    slot = s_base - 1 - (t - c_base)
                                    if slots[slot] != 0:
                                        continue
                                    slots[slot] = 1
                                    t = slot_counter[slot]
                                x = counters[t] - 1
                                counters[t] = x
                                hits[n_hits] = t         # kept when the counter reached 0 (no branch)
                                n_hits += x == 0
                        continue
                    side = list_side_base[l]
                    token = ev_token[i]
                    for k in range(lo0, hi0):
                        pid = side_pid[k + side]
                        if op == 6:      # VERIFY: exact three-valued test on the present value
                            # a list operator's key and operator are beside the entry (its list code): its
                            # row of the predicate table, a cache miss per array, is not read (layout)
                            code = np.int64(side_hi[k + side])
                            pop = np.int64(x_op[pid]) if code == 0 else code & LIST_CODE_MASK
                            hit = False
                            x_low = 0.0
                            x_high = 0.0
                            s0 = 0
                            s1 = 0
                            if pop >= FIRST_LIST_OP and pop <= LAST_LIST_OP:    # the event list's row
                                # (code 0: an index saved before the list codes)
                                key = list_key(pop, x_aux[pid]) if code == 0 else code >> LIST_CODE_SHIFT
                                # the row's bitmap (gpu_kernels.list_truth), set on the row's first test;
                                # written out here as the rest of the loop is (a helper: 1.7x slower on W7)
                                r = -1
                                for q in range(n_cached):
                                    if list_rows[q] == token:
                                        r = q
                                        break
                                if r < 0 and n_cached < LIST_BITS_ROWS and list_words > 0:
                                    r = n_cached
                                    list_rows[r] = token
                                    n_cached += 1
                                    for q in range(list_truth[token], list_truth[token + 1]):
                                        w = list_truth[q]
                                        list_bits[r, w >> 6] |= np.uint64(1) << np.uint64(w & 63)
                                if r >= 0:
                                    w = key >> 6
                                    hit = w < list_words and \
                                        ((list_bits[r, w] >> np.uint64(key & 63)) & np.uint64(1)) != 0
                                else:    # a row beyond the bitmaps: searched
                                    hit = list_hit(list_truth, token, key)
                            else:
                                x_low = x_lo[pid]
                                x_high = x_hi[pid]
                                if pop >= LIKE and pop <= NOT_MATCHES:
                                    hit = pattern_truth[token, x_aux[pid]] != 0
                                elif pop == IN or pop == NOT_IN:
                                    s0 = x_set_start[pid]
                                    s1 = x_set_stop[pid]
                            if predicate_truth(pop, x_low, x_high, set_values, s0, s1, hit, True, v) != TRUE:
                                continue
                        else:            # PREFIX: interval end, then the exact pattern result
                            if side_hi[k + side] < v or pattern_truth[token, x_aux[pid]] == 0:
                                continue
                        t = np.int64(ent_target[k]) + c_base
                        if t < c_base:
                            slot = s_base - 1 - (t - c_base)
                            if slots[slot] != 0:
                                continue
                            slots[slot] = 1
                            t = slot_counter[slot]
                        x = counters[t] - 1
                        counters[t] = x
                        if x == 0:
                            hits[n_hits] = t
                            n_hits += 1
            # counters that reached 0: their IS NULL tests, then the subscription
            for h in range(n_hits):
                t = hits[h]
                if has_post:
                    absent = True
                    for q in range(counter_post_start[t], counter_post_start[t + 1]):
                        if find_attribute(ev_attr, ev_start, ev_stop, post_attr[q]) >= 0:
                            absent = False
                            break
                    if not absent:
                        continue
                pos = counter_sub[t]
                # counter_live: alive per counter (next to the counters); empty: read alive
                if (counter_live[t] if len(counter_live) else alive[pos]) != 0:
                    word = pos >> 6
                    mask = np.uint64(1) << np.uint64(pos & 63)
                    if (bm0[word] & mask) == 0:
                        bm0[word] |= mask
                        bm1[word >> 6] |= np.uint64(1) << np.uint64(word & 63)
                        found += 1
        clear_list_bits(list_truth, list_bits, list_rows, n_cached)
        # the marked positions, ascending (and the bitmap cleared)
        write = used + found <= cap
        emit_marked(bm0, bm1, out, base + used, write)
        if not write:
            result[0] = e
            result[1] = found
            return
        used += found
        ev_count[e] = found


def opindex_match_kernel_py(task_first, task_last, out, cap, ev_count, task_stop, task_need, n_positions,
                            ev_offsets, ev_attr, ev_value, ev_token, pattern_truth, list_truth, list_words, index,
                            programs, counter_live, alive):
    """Match events ``[task_first[t], task_last[t])`` for every task ``t``
    in parallel, with per-task counters, clause bits and output bitmap,
    against ``index`` (an :class:`~gpu_kernels.opindex.layout.OpIndexArrays`)
    and ``programs`` (the segment's, for the always-checked subscriptions).
    ``counter_live``: ``alive`` per counter, or empty to read ``alive``.
    Task ``t`` writes its events' positions, ascending per event, to
    ``out[t * cap:]`` and ``ev_count[e]``; when the next event does not fit
    it stops there (``task_stop[t]``, ``task_need[t]`` = that event's match
    count) so the caller can resume with more room.  ``list_words``: the
    size of a list row's bitmap (:func:`gpu_kernels.list_truth.list_bits_words`)."""
    n_words = (n_positions + 63) >> 6
    # room for the counters that reach 0 in one visit of a partition: each of
    # its counters once -- and, were a counter decremented past its dtype's
    # range (a built index never is; a loaded one is only checked to keep its
    # entries within their partitions), once more per 2**(bits - 1) of the
    # partition's entries and clause slots
    part_counter_start = index.part_counter_start
    part_slot_start = index.part_slot_start
    list_offsets = index.list_offsets
    turn = 8 * index.counter_init.itemsize - 1
    max_hits = 0
    for p in range(len(part_counter_start) - 1):
        n_dec = list_offsets[(p + 1) * N_LISTS] - list_offsets[p * N_LISTS] + part_slot_start[p + 1] \
            - part_slot_start[p]
        max_hits = max(max_hits, part_counter_start[p + 1] - part_counter_start[p] + (n_dec >> turn))
    for t in prange(len(task_first)):
        counters = np.empty(len(index.counter_init), dtype=index.counter_init.dtype)
        slots = np.zeros(max(len(index.slot_counter), 1), dtype=np.uint8)
        bm0 = np.zeros(max(n_words, 1), dtype=np.uint64)
        bm1 = np.zeros(max((n_words + 63) >> 6, 1), dtype=np.uint64)
        stack = np.empty(max(programs.max_depth, 1), dtype=np.int8)
        hits = np.empty(max_hits + 1, dtype=np.int64)
        list_bits = np.zeros((LIST_BITS_ROWS, list_words), dtype=np.uint64)
        list_rows = np.empty(LIST_BITS_ROWS, dtype=np.int64)
        result = np.empty(2, dtype=np.int64)
        match_task(task_first[t], task_last[t], out, t * cap, cap, ev_count, ev_offsets, ev_attr, ev_value,
                   ev_token, pattern_truth, list_truth, index, programs, counter_live, alive, counters, slots, hits,
                   bm0, bm1, stack, list_bits, list_rows, result)
        task_stop[t] = result[0]
        task_need[t] = result[1]


#: the CPU kernel: tasks over all cores, and on the calling thread for single events (waking
#: the other threads for one task costs more than the task on a busy machine)
opindex_match_kernel, opindex_match_serial = parallel_and_serial(opindex_match_kernel_py, nogil=True)


# --------------------------------------------------------------------------
# building
# --------------------------------------------------------------------------
@njit(nogil=True, cache=True)
def plain_conjunctions(prog_offsets, prog_kind, prog_arg):
    """Per subscription: is its program a plain conjunction of predicates
    (one LEAF, or k LEAFs followed by AND k)?"""
    n = len(prog_offsets) - 1
    out = np.zeros(n, dtype=np.bool_)
    for s in range(n):
        a = prog_offsets[s]
        b = prog_offsets[s + 1]
        if b - a == 1:
            out[s] = prog_kind[a] == 0
            continue
        if prog_kind[b - 1] != 1 or prog_arg[b - 1] != b - a - 1:
            continue
        ok = True
        for pc in range(a, b - 1):
            if prog_kind[pc] != 0:
                ok = False
                break
        out[s] = ok
    return out


@njit(nogil=True, cache=True)
def plain_units(positions, prog_offsets, prog_kind, prog_arg):
    """CSR (unit offsets, predicate ids) of plain conjunction programs: the
    leaves of each program, duplicates removed."""
    n = len(positions)
    total = 0
    for k in range(n):
        s = positions[k]
        total += prog_offsets[s + 1] - prog_offsets[s]
    offsets = np.empty(n + 1, dtype=np.int64)
    pids = np.empty(total, dtype=np.int64)
    at = 0
    offsets[0] = 0
    for k in range(n):
        s = positions[k]
        start = at
        for pc in range(prog_offsets[s], prog_offsets[s + 1]):
            if prog_kind[pc] != 0:
                continue
            pid = prog_arg[pc]
            dup = False
            for q in range(start, at):
                if pids[q] == pid:
                    dup = True
                    break
            if not dup:
                pids[at] = pid
                at += 1
        offsets[k + 1] = at
    return offsets, pids[:at].copy()


@njit(nogil=True, cache=True)
def choose_pivots(unit_offsets, unit_pids, x_attr, findable, attr_key, weight):
    """Pivot attribute of each conjunction (eq. 1): among the attributes of
    its predicates that an event must carry (all but IS NULL), the one of
    least frequency ``attr_key``, ties to the smaller attribute id; -1 when
    there is none.  Also the counter's initial value: its number of
    predicates after the §4.2 rewrites (``weight``: BETWEEN counts 2)."""
    n = len(unit_offsets) - 1
    pivot = np.full(n, -1, dtype=np.int64)
    init = np.zeros(n, dtype=np.int64)
    for u in range(n):
        best = -1
        best_key = np.int64(0)
        total = 0
        for k in range(unit_offsets[u], unit_offsets[u + 1]):
            pid = unit_pids[k]
            total += weight[pid]
            if not findable[pid]:
                continue
            a = x_attr[pid]
            key = attr_key[a]
            if best < 0 or key < best_key or (key == best_key and a < best):
                best = a
                best_key = key
        pivot[u] = best
        init[u] = total
    return pivot, init


def pack_predicates(x_attr, x_op, prefix_ok, n_conj, n_cnf, rank_lo, rank_hi, x_set_start):
    """What building reads of a predicate, in one 32-byte row (one cache
    miss per predicate occurrence instead of six): attribute | operator <<
    32 | prefix << 40; entries in a conjunction | in a CNF clause << 32;
    operand rank; BETWEEN's high rank or the IN list's first value."""
    info = np.empty((len(x_op), 4), dtype=np.int64)
    info[:, 0] = x_attr.astype(np.int64) | (x_op.astype(np.int64) << 32) | (prefix_ok.astype(np.int64) << 40)
    info[:, 1] = n_conj | (n_cnf << 32)
    info[:, 2] = rank_lo
    info[:, 3] = np.where(x_op == 6, x_set_start, rank_hi)
    return info


@njit(parallel=True, nogil=True, cache=True)
def emit_entries(counter_item, n_units, part_counter_start, unit_offsets, unit_pids,
                 copy_clause_offsets, clause_offsets, clause_pids, info, list_conj, list_cnf, set_rank):
    """The index entries, partition by partition in counter order: one per
    (counter, predicate) and per list the predicate is stored in -- ``=``
    and the comparisons once, IN once per value (in ``=``), BETWEEN in a
    conjunction as ``>= lo`` and ``<= hi`` (§4.2), the rest once in VERIFY
    (or PREFIX).  A CNF copy's entries point at its clause slots.  Each
    entry: list id ``part * 8 + list``, attribute, rank (the operand's rank
    among all operands; the predicate id in VERIFY and PREFIX), counter
    pointer relative to the partition.  Also the IS NULL tests of each
    conjunction counter (CSR), each clause slot's counter and the
    partitions' first slots.  ``info``: :func:`pack_predicates`."""
    n_counters = len(counter_item)
    n_parts = len(part_counter_start) - 1
    low = np.int64(0xFFFFFFFF)
    # pass 1: how many entries, IS NULL tests and slots per partition
    part_entries = np.zeros(n_parts + 1, dtype=np.int64)
    part_posts = np.zeros(n_parts + 1, dtype=np.int64)
    part_slots = np.zeros(n_parts + 1, dtype=np.int64)
    for part in prange(n_parts):       # (partitions are independent: counted, then filled, in parallel)
        ne = 0
        npost = 0
        ns = 0
        for c in range(part_counter_start[part], part_counter_start[part + 1]):
            item = counter_item[c]
            if item < n_units:
                for k in range(unit_offsets[item], unit_offsets[item + 1]):
                    row = unit_pids[k]
                    ne += info[row, 1] & low
                    if list_conj[(info[row, 0] >> 32) & 255] < 0:
                        npost += 1
            else:
                copy = item - n_units
                for cl in range(copy_clause_offsets[copy], copy_clause_offsets[copy + 1]):
                    ns += 1
                    for k in range(clause_offsets[cl], clause_offsets[cl + 1]):
                        ne += info[clause_pids[k], 1] >> 32
        part_entries[part + 1] = ne
        part_posts[part + 1] = npost
        part_slots[part + 1] = ns
    for part in range(n_parts):
        part_entries[part + 1] += part_entries[part]
        part_posts[part + 1] += part_posts[part]
        part_slots[part + 1] += part_slots[part]
    n_entries = part_entries[n_parts]
    n_post = part_posts[n_parts]
    n_slots = part_slots[n_parts]
    e_list = np.empty(n_entries, dtype=np.int32)
    e_attr = np.empty(n_entries, dtype=np.int32)
    e_rank = np.empty(n_entries, dtype=np.int32)
    e_target = np.empty(n_entries, dtype=np.int32)
    post_start = np.zeros(n_counters + 1 if n_post else 1, dtype=np.int64)
    post_attr = np.empty(n_post, dtype=np.int32)
    slot_counter = np.empty(n_slots, dtype=np.int64)
    # pass 2: fill, each partition at its own offsets
    for part in prange(n_parts):
        at = part_entries[part]
        pa = part_posts[part]
        slot = part_slots[part]
        slot_base = part_slots[part]
        base = part * 8
        for c in range(part_counter_start[part], part_counter_start[part + 1]):
            item = counter_item[c]
            cnf = item >= n_units
            local = c - part_counter_start[part]
            k0 = unit_offsets[item] if not cnf else 0
            k1 = unit_offsets[item + 1] if not cnf else 0
            cl0 = 0
            cl1 = 0
            if cnf:
                cl0 = copy_clause_offsets[item - n_units]
                cl1 = copy_clause_offsets[item - n_units + 1]
                k0 = clause_offsets[cl0]
                k1 = clause_offsets[cl1]
            cl = cl0
            for k in range(k0, k1):
                if cnf:
                    while clause_offsets[cl + 1] <= k:      # the clause of occurrence k
                        cl += 1
                    pid = clause_pids[k]
                else:
                    pid = unit_pids[k]
                w0 = info[pid, 0]
                attr = np.int32(w0 & low)
                op = (w0 >> 32) & 255
                lst = list_cnf[op] if cnf else list_conj[op]
                if lst < 0:              # IS NULL (conjunctions only): checked when the counter reaches 0
                    post_attr[pa] = attr
                    pa += 1
                    continue
                if op == 10 and (w0 >> 40) & 1:
                    lst = L_PREFIX
                m = info[pid, 1] >> 32 if cnf else info[pid, 1] & low
                target = -(slot + (cl - cl0) - slot_base) - 1 if cnf else local
                for j in range(m):
                    e_attr[at] = attr
                    e_target[at] = target
                    if lst == L_VERIFY or lst == L_PREFIX:      # (sorted by the prefix's rank later)
                        e_list[at] = base + lst
                        e_rank[at] = pid
                    elif op == 6:        # IN: one '=' entry per value
                        e_list[at] = base + L_EQ
                        e_rank[at] = set_rank[info[pid, 3] + j]
                    elif op == 8 and j == 1:     # BETWEEN in a conjunction: >= lo and <= hi
                        e_list[at] = base + L_LE
                        e_rank[at] = info[pid, 3]
                    else:
                        e_list[at] = base + lst
                        e_rank[at] = info[pid, 2]
                    at += 1
            for q in range(cl1 - cl0):
                slot_counter[slot] = c
                slot += 1
            if n_post:
                post_start[c + 1] = pa
    return e_list, e_attr, e_rank, e_target, post_start, post_attr, slot_counter, part_slots


@njit(nogil=True, cache=True)
def counting_order(keys, n_keys):
    """Stable counting sort permutation of small non-negative int keys, and
    the bucket offsets."""
    counts = np.zeros(n_keys + 1, dtype=np.int64)
    for i in range(len(keys)):
        counts[keys[i] + 1] += 1
    for k in range(n_keys):
        counts[k + 1] += counts[k]
    offsets = counts.copy()
    order = np.empty(len(keys), dtype=np.int64)
    for i in range(len(keys)):
        k = keys[i]
        order[counts[k]] = i
        counts[k] += 1
    return order, offsets


@njit(parallel=True, nogil=True, cache=True)
def sort_within_lists(list_offsets, order, e_attr, e_rank, n_rank, prefix_rank):
    """Sort each list's slice of ``order`` by (attribute, operand rank),
    stably (entries arrive in counter order, which ties keep); PREFIX
    entries by their prefix's rank."""
    n_lists = len(list_offsets) - 1
    for l in prange(n_lists):
        a = list_offsets[l]
        b = list_offsets[l + 1]
        if b - a < 2:
            continue
        idx = order[a:b].copy()
        keys = np.empty(b - a, dtype=np.int64)
        prefix = (l % 8) == L_PREFIX
        for i in range(b - a):
            r = np.int64(e_rank[idx[i]])
            keys[i] = np.int64(e_attr[idx[i]]) * n_rank + (prefix_rank[r] if prefix else r)
        perm = np.argsort(keys, kind="mergesort")
        for i in range(b - a):
            order[a + i] = idx[perm[i]]


@njit(nogil=True, cache=True)
def gather_sorted(order, list_offsets, e_list, e_attr, e_rank, e_target, vals, prefix_rank, prefix_hi, use_rank):
    """The sorted entry arrays: attribute, operand (``2 * rank + 1`` with
    ``use_rank``, else ``vals[rank]``; 0 in VERIFY), counter pointer; and
    the side arrays (predicate id; ``prefix_hi`` of its row: a PREFIX
    entry's interval end, a list operator's list code) of the VERIFY and
    PREFIX entries, in entry order."""
    n = len(order)
    s_attr = np.empty(n, dtype=np.int32)
    s_val = np.empty(n, dtype=np.float64)
    s_target = np.empty(n, dtype=np.int32)
    n_side = 0
    for i in range(n):
        if e_list[i] % 8 >= L_VERIFY:
            n_side += 1
    side_pid = np.empty(n_side, dtype=np.int64)
    side_hi = np.empty(n_side, dtype=np.float64)
    n_lists = len(list_offsets) - 1
    list_side_base = np.zeros(n_lists, dtype=np.int64)
    k = 0
    for l in range(n_lists):
        list_side_base[l] = k - list_offsets[l]
        special = (l % 8) >= L_VERIFY
        for i in range(list_offsets[l], list_offsets[l + 1]):
            src = order[i]
            s_attr[i] = e_attr[src]
            s_target[i] = e_target[src]
            rank = np.int64(e_rank[src])
            if (l % 8) == L_VERIFY:
                s_val[i] = 0.0
            else:
                if (l % 8) == L_PREFIX:
                    rank = prefix_rank[rank]
                s_val[i] = 2.0 * rank + 1.0 if use_rank else vals[rank]
            if special:
                pid = e_rank[src]
                side_pid[k] = pid
                side_hi[k] = prefix_hi[pid]
                k += 1
    return s_attr, s_val, s_target, side_pid, side_hi, list_side_base


@njit(nogil=True, cache=True)
def build_directory(list_offsets, s_attr, s_val, n_attrs, attr_bits, max_seg_log2, sig_bits, use_segments):
    """Runs, segment directory and segment signatures of every list, over
    entries already sorted by (list, attribute, operand).

    A list with ``r`` distinct attributes gets ``2**k`` segments, ``k =
    min(log2 b, floor(log2 r))`` (one segment for OpIndex-BS); segment of
    attribute ``a`` is ``a >> (attr_bits - k)``, so a list sorted by
    (attribute, operand) is also sorted by segment and every attribute lies
    in one segment (§4.2)."""
    n_lists = len(list_offsets) - 1
    n = len(s_attr)
    # runs: the entries of one attribute in one list
    run_attr_all = np.empty(n, dtype=np.int32)
    run_start_all = np.empty(n + 1, dtype=np.int64)
    list_run_start = np.zeros(n_lists + 1, dtype=np.int64)
    r = 0
    for l in range(n_lists):
        list_run_start[l] = r
        for i in range(list_offsets[l], list_offsets[l + 1]):
            if i == list_offsets[l] or s_attr[i] != s_attr[i - 1]:
                run_attr_all[r] = s_attr[i]
                run_start_all[r] = i
                r += 1
    list_run_start[n_lists] = r
    n_runs = r
    run_attr = run_attr_all[:n_runs].copy()
    run_start = run_start_all[:n_runs + 1].copy()
    run_start[n_runs] = n
    # segments per list
    list_shift = np.full(n_lists, -1, dtype=np.int8)
    list_bucket_base = np.zeros(n_lists, dtype=np.int64)
    n_buckets = 0
    for l in range(n_lists):
        nr = list_run_start[l + 1] - list_run_start[l]
        if nr == 0:
            continue
        k = 0
        if use_segments:
            while k < max_seg_log2 and (2 << k) <= nr:
                k += 1
        if k > attr_bits:
            k = attr_bits
        list_shift[l] = attr_bits - k
        list_bucket_base[l] = n_buckets
        n_buckets += 1 << k
    bucket_run_start = np.zeros(n_buckets + 1, dtype=np.int64)
    bucket_sig = np.zeros(max(n_buckets, 1), dtype=np.uint64)
    for l in range(n_lists):
        if list_shift[l] < 0:
            continue
        shift = list_shift[l]
        nseg = 1 << (attr_bits - shift)
        base = list_bucket_base[l]
        r = list_run_start[l]
        r_end = list_run_start[l + 1]
        for s in range(nseg):
            bucket_run_start[base + s] = r
            while r < r_end and (run_attr[r] >> shift) == s:
                r += 1
        op = l % 8
        for rr in range(list_run_start[l], r_end):
            a = run_attr[rr]
            bucket = base + (a >> shift)
            if op == 0:
                for i in range(run_start[rr], run_start[rr + 1]):
                    bucket_sig[bucket] |= np.uint64(1) << np.uint64(eq_bit(a, s_val[i], sig_bits))
            else:
                bucket_sig[bucket] |= np.uint64(1) << np.uint64(attr_bit(a, sig_bits))
    bucket_run_start[n_buckets] = list_run_start[n_lists]
    return run_attr, run_start, list_shift, list_bucket_base, bucket_run_start, bucket_sig


# --------------------------------------------------------------------------
# updates: a merged index from an old one plus a few added subscriptions
# --------------------------------------------------------------------------
@njit(inline="always", nogil=True)
def _before(l0, a0, k0, l1, a1, k1):
    """(list, attribute, key) ``0`` sorts strictly before ``1``."""
    return l0 < l1 or (l0 == l1 and (a0 < a1 or (a0 == a1 and k0 < k1)))


@njit(nogil=True, cache=True)
def merge_entries(old_list_offsets, old_run_attr, old_run_start, old_val, old_target, old_side_pid,
                  old_list_side_base, old_part_counter_start, old_part_slot_start,
                  part_map, counter_map, slot_map, part_counter_start, part_slot_start,
                  old_use_rank, enc_plain, enc_string, string_attr, code_map, vals, use_rank,
                  x_map, prefix_val, prefix_hi,
                  add_list, add_attr, add_val, add_key, add_target, add_pid, n_lists):
    """The entries of a merged index in one linear pass: the old entries
    (already sorted by (list, attribute, operand)) with their dead counters
    dropped and everything else renumbered, merged with the added entries
    (sorted the same way) -- the merge of two sorted runs per list, added
    entries after old ones on ties.

    Old entries: partition ``part_map[p]`` (-1: gone), counter pointers
    through ``counter_map`` / ``slot_map`` (old global -> new global, -1:
    dropped) made relative to the new partition starts; operands re-encoded
    among the new distinct operands ``vals``: with ``old_use_rank`` through
    the tables ``enc_plain`` / ``enc_string`` (old rank -> new stored
    operand; ``enc_string`` for string attributes, whose codes move when
    the dictionary grows), else from the raw value (string codes through
    ``code_map``: old dictionary rank -> new code, empty when codes did not
    move); VERIFY and PREFIX entries by their predicate ``x_map[pid]``
    (PREFIX operand ``prefix_val``, side value ``prefix_hi``: interval
    end, list code).  The sort
    key is the stored operand, the predicate id in VERIFY.

    Returns the sorted attribute, operand and counter pointer arrays, the
    side arrays (predicate id, interval end) of the VERIFY and PREFIX
    entries, the list offsets, and whether some old run was no longer
    sorted under the new keys (PREFIX intervals that were tied before the
    dictionary grew, a predicate renumbering that is not monotone): then
    :func:`sort_runs` restores the order."""
    n_add = len(add_list)
    cap = len(old_target) + n_add
    s_attr = np.empty(cap, dtype=np.int32)
    s_val = np.empty(cap, dtype=np.float64)
    s_target = np.empty(cap, dtype=np.int32)
    side_pid = np.empty(len(old_side_pid) + n_add, dtype=np.int64)
    side_hi = np.empty(len(old_side_pid) + n_add, dtype=np.float64)
    counts = np.zeros(n_lists + 1, dtype=np.int64)
    at = 0
    n_side = 0
    j = 0
    r = 0
    unsorted = False
    prev_l = -1
    prev_a = -1
    prev_k = 0.0
    remap_codes = len(code_map) > 0
    for l_old in range(len(old_list_offsets) - 1):
        k0 = old_list_offsets[l_old]
        k1 = old_list_offsets[l_old + 1]
        if k0 == k1:
            continue
        p_old = l_old >> 3
        op = l_old & 7
        p = part_map[p_old]
        if p < 0:                 # every counter of the partition is gone
            continue
        l = p * 8 + op
        c_old = old_part_counter_start[p_old]
        sl_old = old_part_slot_start[p_old]
        c_new = part_counter_start[p]
        sl_new = part_slot_start[p]
        side = old_list_side_base[l_old]
        for k in range(k0, k1):
            while old_run_start[r + 1] <= k:
                r += 1
            t = np.int64(old_target[k])
            if t >= 0:
                c = counter_map[c_old + t]
                if c < 0:
                    continue
                t = c - c_new
            else:
                s = slot_map[sl_old - t - 1]
                if s < 0:
                    continue
                t = -(s - sl_new) - 1
            a = old_run_attr[r]
            pid = -1
            if op == L_VERIFY:
                pid = x_map[old_side_pid[k + side]]
                v = 0.0
                key = np.float64(pid)
            elif op == L_PREFIX:
                pid = x_map[old_side_pid[k + side]]
                v = prefix_val[pid]
                key = v
            else:
                if old_use_rank:
                    rank = (np.int64(old_val[k]) - 1) >> 1
                    v = enc_string[rank] if string_attr[a] else enc_plain[rank]
                else:
                    v = np.float64(old_val[k])
                    if remap_codes and string_attr[a]:
                        v = code_map[(np.int64(v) - 1) >> 1]
                    if use_rank:
                        lo = 0
                        n = len(vals)
                        while n > 0:
                            half = n >> 1
                            if vals[lo + half] < v:
                                lo = lo + half + 1
                                n = n - half - 1
                            else:
                                n = half
                        v = 2.0 * lo + 1.0
                key = v
            if l == prev_l and a == prev_a and key < prev_k:
                unsorted = True
            prev_l = l
            prev_a = a
            prev_k = key
            # the added entries that sort before this one
            while j < n_add and _before(add_list[j], add_attr[j], add_key[j], l, a, key):
                s_attr[at] = add_attr[j]
                s_val[at] = add_val[j]
                s_target[at] = add_target[j]
                counts[add_list[j] + 1] += 1
                if (add_list[j] & 7) >= L_VERIFY:
                    side_pid[n_side] = add_pid[j]
                    side_hi[n_side] = prefix_hi[add_pid[j]]
                    n_side += 1
                at += 1
                j += 1
            s_attr[at] = a
            s_val[at] = v
            s_target[at] = t
            counts[l + 1] += 1
            if op >= L_VERIFY:
                side_pid[n_side] = pid
                side_hi[n_side] = prefix_hi[pid]
                n_side += 1
            at += 1
    while j < n_add:
        s_attr[at] = add_attr[j]
        s_val[at] = add_val[j]
        s_target[at] = add_target[j]
        counts[add_list[j] + 1] += 1
        if (add_list[j] & 7) >= L_VERIFY:
            side_pid[n_side] = add_pid[j]
            side_hi[n_side] = prefix_hi[add_pid[j]]
            n_side += 1
        at += 1
        j += 1
    for l in range(n_lists):
        counts[l + 1] += counts[l]
    return (s_attr[:at], s_val[:at], s_target[:at], side_pid[:n_side], side_hi[:n_side], counts, unsorted)


@njit(nogil=True, cache=True)
def sort_runs(list_offsets, list_side_base, s_attr, s_val, s_target, side_pid, side_hi):
    """Restore the (attribute, operand) order inside every run that lost it
    (see :func:`merge_entries`), stably; runs already sorted are only read."""
    for l in range(len(list_offsets) - 1):
        verify = (l & 7) == L_VERIFY
        special = (l & 7) >= L_VERIFY
        side = list_side_base[l]
        a = list_offsets[l]
        end = list_offsets[l + 1]
        while a < end:
            b = a + 1
            while b < end and s_attr[b] == s_attr[a]:
                b += 1
            keys = np.empty(b - a, dtype=np.float64)
            ordered = True
            for i in range(a, b):
                keys[i - a] = np.float64(side_pid[i + side]) if verify else s_val[i]
                if i > a and keys[i - a] < keys[i - a - 1]:
                    ordered = False
            if not ordered:
                perm = np.argsort(keys, kind="mergesort")
                val = s_val[a:b].copy()
                target = s_target[a:b].copy()
                for i in range(b - a):
                    s_val[a + i] = val[perm[i]]
                    s_target[a + i] = target[perm[i]]
                if special:
                    pid = side_pid[a + side:b + side].copy()
                    hi = side_hi[a + side:b + side].copy()
                    for i in range(b - a):
                        side_pid[a + side + i] = pid[perm[i]]
                        side_hi[a + side + i] = hi[perm[i]]
            a = b
