"""PS-Tree on the CPU: predicate spaces, access predicates, PSTBloom and PSTHash (numba).

The paper's PS-Tree (§4.1) is a digit trie whose leaves are *predicate
spaces*: disjoint value ranges of one attribute, each with the
subscriptions whose predicates cover it.  Locating an event value's leaf
(Algorithm 3, MatchPair) is a walk down the digits.  Here the same leaves
are kept flat (module docstring of :mod:`engine.algorithms.pstree`):

* per attribute ``a``, the sorted distinct endpoint codes
  ``vals[val_off[a]:val_off[a + 1]]`` (``m`` of them) cut the domain into
  ``2m + 1`` *elementary* ranges -- ``(-inf, v0)``, ``[v0]``,
  ``(v0, v1)``, ``[v1]``, ... ``(v_{m-1}, +inf)``; elementary range ``e``
  of ``a`` belongs to the predicate space ``elem_space[2 * val_off[a] + a + e]``
  (global ids, ascending by attribute then value; -1 where ``a`` has no
  PS-Tree).  Adjacent elementary ranges covered by exactly the same
  predicates are one space (the merged spaces of §4.4's example), and an
  endpoint whose three ranges fall in one space is dropped;
* locating a value is a binary search (the trie walk's job) plus one read.

The structures and the few functions the CUDA twin (:mod:`gpu_kernels.pstree.cuda`)
compiles as well -- the binary search, the Bloom and key hashes -- live in
:mod:`gpu_kernels.pstree.layout`, one source for both.

Every kernel here reads predicate semantics from
:func:`gpu_kernels.predicates.entry_truth` only: spaces decide which units
are *candidates*; a candidate is accepted when every predicate of its unit
is TRUE under three-valued logic.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
from numba import njit, prange

from gpu_kernels.combinations import first_combination, next_combination
from gpu_kernels.compaction import ALL, ONE, ZERO, ctz, emit_group, emit_marked, group_scratch, popcount64
from gpu_kernels.opcodes import BETWEEN, EQ, GE, GT, IN, LE, LT, NE, NOT_BETWEEN, NOT_IN, TRUE
from gpu_kernels.predicates import EVALUATED, INSIDE, OUTSIDE, entry_truth, interval_form
# the structures and the functions the CUDA twin compiles too (one source, so both see the same spaces and bits)
from gpu_kernels.open_addressing import find_slot, key_hash
from gpu_kernels.pstree.layout import (NOT_INDEXABLE, OPERATOR_CLASS, BloomArrays, HashArrays,  # noqa: F401
                                       SpaceTable, bloom_key_py, bloom_probe_py, elementary_py)
from gpu_kernels.twins import parallel_and_serial


# ------------------------------------------------------------------ locating
#: elementary range of ``x`` among ``vals[v0:v1]`` (:func:`~gpu_kernels.pstree.layout.elementary_py`)
elementary = njit(inline="always", nogil=True)(elementary_py)


def locate_spaces_py(ev_offsets, ev_attr, ev_value, val_off, vals, elem_space):
    """Per event entry, the global id of the predicate space its value lies
    in (-1 when its attribute has no PS-Tree): Algorithm 3 for every
    attribute-value pair, events over all cores."""
    n_attrs = len(val_off) - 1
    out = np.full(len(ev_attr), -1, np.int64)
    for e in prange(len(ev_offsets) - 1):
        for at in range(ev_offsets[e], ev_offsets[e + 1]):
            a = ev_attr[at]
            if a >= n_attrs:
                continue
            v0 = val_off[a]
            v1 = val_off[a + 1]
            out[at] = elem_space[2 * v0 + a + elementary(vals, v0, v1, ev_value[at])]
    return out


#: over every core, and on the calling thread for a few events (waking every core costs more than they do)
locate_spaces, locate_spaces_serial = parallel_and_serial(locate_spaces_py, nogil=True)


# ------------------------------------------------------------- construction
@njit(nogil=True, cache=True)
def _position(vals, v0, v1, x):
    """Index of endpoint ``x`` in ``vals[v0:v1]`` (it is there)."""
    return (elementary(vals, v0, v1, x) - 1) >> 1


@njit(nogil=True, cache=True)
def row_intervals(row_op, row_attr, row_lo, row_hi, set_offsets, set_values, use, val_off, vals):
    """Per predicate row (``use[r]`` set and indexable), the elementary
    ranges of its attribute where it is TRUE, as inclusive local
    ``(first, last)`` pairs in CSR by row -- InsertPredicate's (Algorithm 1)
    'leaf nodes covered by the predicate', for every operator."""
    n = len(row_op)
    bound = 0
    for r in range(n):
        bound += 2 + set_offsets[r + 1] - set_offsets[r]
    iv_first = np.empty(bound, np.int64)
    iv_last = np.empty(bound, np.int64)
    iv_off = np.zeros(n + 1, np.int64)
    k = 0
    for r in range(n):
        op = row_op[r]
        if use[r] and op <= NOT_BETWEEN:
            a = row_attr[r]
            v0 = val_off[a]
            v1 = val_off[a + 1]
            last = 2 * (v1 - v0)
            if op == IN or op == NOT_IN:
                start = 0
                prev = -1
                for q in range(set_offsets[r], set_offsets[r + 1]):
                    p = 2 * _position(vals, v0, v1, set_values[q]) + 1
                    if p == prev:
                        continue            # a repeated value
                    prev = p
                    if op == IN:
                        iv_first[k] = p
                        iv_last[k] = p
                        k += 1
                    else:
                        if p - 1 >= start:
                            iv_first[k] = start
                            iv_last[k] = p - 1
                            k += 1
                        start = p + 1
                if op == NOT_IN and start <= last:
                    iv_first[k] = start
                    iv_last[k] = last
                    k += 1
            else:
                p = 2 * _position(vals, v0, v1, row_lo[r]) + 1
                if op == EQ:
                    iv_first[k] = p
                    iv_last[k] = p
                    k += 1
                elif op == NE:
                    iv_first[k] = 0
                    iv_last[k] = p - 1
                    iv_first[k + 1] = p + 1
                    iv_last[k + 1] = last
                    k += 2
                elif op == LT or op == LE:
                    iv_first[k] = 0
                    iv_last[k] = p - 1 if op == LT else p
                    k += 1
                elif op == GT or op == GE:
                    iv_first[k] = p + 1 if op == GT else p
                    iv_last[k] = last
                    k += 1
                else:               # BETWEEN, NOT BETWEEN
                    ph = 2 * _position(vals, v0, v1, row_hi[r]) + 1
                    if row_lo[r] <= row_hi[r]:
                        if op == BETWEEN:
                            iv_first[k] = p
                            iv_last[k] = ph
                            k += 1
                        else:
                            iv_first[k] = 0
                            iv_last[k] = p - 1
                            iv_first[k + 1] = ph + 1
                            iv_last[k + 1] = last
                            k += 2
                    elif op == NOT_BETWEEN:         # lo > hi: x < lo or x > hi holds for every x
                        iv_first[k] = 0
                        iv_last[k] = last
                        k += 1
        iv_off[r + 1] = k
    return iv_off, iv_first[:k].copy(), iv_last[:k].copy()


@njit(inline="always", nogil=True)
def _ranks_before(r, o, row_events, row_class, row_width):
    """Whether row ``r`` is strictly more selective than row ``o`` (§3.3)."""
    if row_events[r] != row_events[o]:
        return row_events[r] < row_events[o]
    if row_class[r] != row_class[o]:
        return row_class[r] < row_class[o]
    return row_width[r] < row_width[o]


@njit(nogil=True, cache=True)
def select_access(unit_off, pids, row_attr, row_class, row_width, row_events, n_access):
    """Per unit, up to ``n_access`` access predicates (positions into
    ``pids``, -1 padded) on distinct attributes, best first, and how many:
    the paper's selectivity ranking (§3.3) -- fewest matching logged events
    (``row_events``; all 0 without a log), then the operator class, then the
    narrowest covered share of the attribute's PS-Tree (``row_width``).
    Non-indexable predicates are never chosen."""
    n_units = len(unit_off) - 1
    acc = np.full((n_units, max(n_access, 1)), -1, np.int64)
    arity = np.zeros(n_units, np.int64)
    for u in range(n_units):
        for j in range(unit_off[u], unit_off[u + 1]):
            r = pids[j]
            if row_class[r] == NOT_INDEXABLE:
                continue
            # insert j into the unit's ranked list (one per attribute: the better of two on one attribute)
            dup = -1
            for q in range(arity[u]):
                if row_attr[pids[acc[u, q]]] == row_attr[r]:
                    dup = q
            if dup >= 0:
                o = pids[acc[u, dup]]
                if not _ranks_before(r, o, row_events, row_class, row_width):
                    continue
                for q in range(dup, arity[u] - 1):      # remove the worse one, then insert below
                    acc[u, q] = acc[u, q + 1]
                arity[u] -= 1
            q = arity[u]
            while q > 0:
                o = pids[acc[u, q - 1]]
                if not _ranks_before(r, o, row_events, row_class, row_width):
                    break
                q -= 1
            if q >= n_access:
                continue
            top = min(arity[u], n_access - 1)
            for s in range(top, q, -1):
                acc[u, s] = acc[u, s - 1]
            acc[u, q] = j
            arity[u] = min(arity[u] + 1, n_access)
    return acc, arity


#: unit ``u``'s two Bloom hashes (:func:`~gpu_kernels.pstree.layout.bloom_key_py`)
bloom_key = njit(inline="always", nogil=True)(bloom_key_py)


#: whether a signature may hold a unit (:func:`~gpu_kernels.pstree.layout.bloom_probe_py`)
bloom_probe = njit(inline="always", nogil=True)(bloom_probe_py)


@njit(nogil=True, cache=True)
def bloom_contains(sig_words, w0, w1, u, n_hashes):
    """Whether the signature in ``sig_words[w0:w1]`` may hold unit ``u``."""
    h1, h2 = bloom_key(u)
    return bloom_probe(sig_words, w0, w1, h1, h2, n_hashes)


@njit(nogil=True, cache=True)
def balanced_bins(work, n_bins):
    """Items of ``work`` (their costs) into ``n_bins`` bins, each item in
    turn, heaviest first, to the lightest bin so far (LPT): the bins' items
    as CSR ``(bin_off, items)``.  A ``prange`` over the bins then gives each
    thread about as much work: over W4's attributes, Zipf-popular, a
    ``prange`` over the attributes themselves gave one of two threads 77 %
    of the signature inserts."""
    load = np.zeros(n_bins, np.int64)
    bin_of = np.empty(len(work), np.int64)
    for i in np.argsort(-work):
        b = np.argmin(load)
        bin_of[i] = b
        load[b] += work[i]
    bin_off = np.zeros(n_bins + 1, np.int64)
    for i in range(len(work)):
        bin_off[bin_of[i] + 1] += 1
    bin_off = np.cumsum(bin_off)
    items = np.empty(len(work), np.int64)
    fill = bin_off[:-1].copy()
    for i in range(len(work)):
        items[fill[bin_of[i]]] = i
        fill[bin_of[i]] += 1
    return bin_off, items


@njit(parallel=True, nogil=True, cache=True)
def build_pstbloom(unit_of, pids, acc, row_indexable, cov_off, cov_first, cov_last, space_off, bits_per_unit,
                   n_hashes, n_bins):
    """Algorithm 4 for every unit at once: each unit goes to the
    subscription list of every space its access predicate covers, and into
    the signature of every space its other (indexable) predicates cover.
    Returns the lists (CSR by space, units ascending) and the signatures
    (CSR of uint64 words by space; a power of two of words, at least
    ``bits_per_unit`` bits per unit inserted, none for an empty one).
    ``unit_of[j]``: the unit of position ``j`` of ``pids``; ``space_off``:
    each attribute's spaces (:class:`SpaceTable`).

    The signatures are filled space by space: each attribute's covered
    ranges, bucketed by their first space, are swept across its spaces
    with the ranges still open kept beside one another, so that the writes
    at a time fall in one space's signature (a few hundred KiB at most,
    in cache), where range by range each of the range's spaces was a new
    signature (W4 at 900 K: 531 M inserts, about 35 ns each).  The
    attributes own their spaces, so they go over the cores in
    :func:`balanced_bins` with nothing shared."""
    n_spaces = space_off[-1]
    n_attrs = len(space_off) - 1
    # the sizes: each covered range a difference array's two entries
    d_list = np.zeros(n_spaces + 1, np.int64)
    d_sig = np.zeros(n_spaces + 1, np.int64)
    starts = np.zeros(n_spaces + 1, np.int64)        # signature ranges by first space
    for j in range(len(pids)):
        r = pids[j]
        if not row_indexable[r]:
            continue
        access = j == acc[unit_of[j], 0]
        for c in range(cov_off[r], cov_off[r + 1]):
            if access:
                d_list[cov_first[c]] += 1
                d_list[cov_last[c] + 1] -= 1
            else:
                d_sig[cov_first[c]] += 1
                d_sig[cov_last[c] + 1] -= 1
                starts[cov_first[c] + 1] += 1
    n_list = np.cumsum(d_list)
    n_sig = np.cumsum(d_sig)
    list_off = np.zeros(n_spaces + 1, np.int64)
    list_off[1:] = np.cumsum(n_list[:n_spaces])
    sig_off = np.zeros(n_spaces + 1, np.int64)
    for g in range(n_spaces):
        words = 0
        if n_sig[g] > 0:
            words = 1
            while words * 64 < n_sig[g] * bits_per_unit:
                words *= 2
        sig_off[g + 1] = sig_off[g] + words
    # the lists, positions ascending (so units ascending); the signature ranges bucketed by first space
    starts = np.cumsum(starts)
    iv_last = np.empty(starts[-1], np.int64)
    iv_unit = np.empty(starts[-1], np.int64)
    units = np.empty(list_off[-1], np.int32)
    fill = list_off[:-1].copy()
    place = starts[:-1].copy()
    for j in range(len(pids)):
        r = pids[j]
        if not row_indexable[r]:
            continue
        u = unit_of[j]
        access = j == acc[u, 0]
        for c in range(cov_off[r], cov_off[r + 1]):
            if access:
                for g in range(cov_first[c], cov_last[c] + 1):
                    units[fill[g]] = u
                    fill[g] += 1
            else:
                k = place[cov_first[c]]
                iv_last[k] = cov_last[c]
                iv_unit[k] = u
                place[cov_first[c]] = k + 1
    work = np.zeros(n_attrs, np.int64)
    for a in range(n_attrs):
        for g in range(space_off[a], space_off[a + 1]):
            work[a] += n_sig[g]
    bin_off, attrs = balanced_bins(work, n_bins)
    sig = np.zeros(sig_off[-1], np.uint64)
    for b in prange(n_bins):
        most = 0
        for i in range(bin_off[b], bin_off[b + 1]):
            a = attrs[i]
            most = max(most, starts[space_off[a + 1]] - starts[space_off[a]])
        open_last = np.empty(most, np.int64)
        open_h1 = np.empty(most, np.uint64)
        open_h2 = np.empty(most, np.uint64)
        for i in range(bin_off[b], bin_off[b + 1]):
            a = attrs[i]
            n_open = 0
            for g in range(space_off[a], space_off[a + 1]):
                for k in range(starts[g], starts[g + 1]):
                    open_last[n_open] = iv_last[k]
                    open_h1[n_open], open_h2[n_open] = bloom_key(iv_unit[k])
                    n_open += 1
                if n_open == 0:
                    continue
                base = sig_off[g]
                mask = np.uint64((sig_off[g + 1] - base) * 64 - 1)
                kept = 0
                for q in range(n_open):
                    h1 = open_h1[q]
                    h2 = open_h2[q]
                    for h in range(n_hashes):
                        bit = np.int64((h1 + np.uint64(h) * h2) & mask)
                        sig[base + (bit >> 6)] |= np.uint64(1) << np.uint64(bit & 63)
                    if open_last[q] > g:
                        open_last[kept] = open_last[q]
                        open_h1[kept] = h1
                        open_h2[kept] = h2
                        kept += 1
                n_open = kept
    return list_off, units, sig_off, sig


@njit(parallel=True, nogil=True, cache=True)
def space_combinations(unit_off, pids, acc, arity, row_attr, cov_off, cov_first, cov_last, width, key_bits=0,
                       owner_bits=0):
    """Algorithm 6 for every unit at once: the N-dim predicate space ids of
    each unit's access predicates -- every combination of one covered space
    per access predicate, components ascending (by attribute: global space
    ids ascend with the attribute), padded with -1 to ``width`` -- and the
    unit of each.  Units over every core: each unit's number of keys first
    (0 when an access predicate covers no space: it is never TRUE, so the
    unit is never a candidate), then each writes its own.  Returns
    ``(keys, owner, packed)``: with ``key_bits`` > 0 each key and its unit
    are written as :func:`pack_keys` packs them instead (one int64 a key:
    what a build sorts, without the key matrix and the pass that packs
    it), and ``keys``, ``owner`` are empty; else ``packed`` is."""
    n_units = len(unit_off) - 1
    count = np.zeros(n_units, np.int64)
    for u in prange(n_units):
        if arity[u] == 0:
            continue
        prod = 1
        for q in range(arity[u]):
            r = pids[acc[u, q]]
            n = 0
            for c in range(cov_off[r], cov_off[r + 1]):
                n += cov_last[c] - cov_first[c] + 1
            prod *= n
        count[u] = prod
    start = np.zeros(n_units + 1, np.int64)
    for u in range(n_units):
        start[u + 1] = start[u] + count[u]
    n_keys = start[n_units]
    packing = key_bits > 0
    keys = np.full((0 if packing else n_keys, width), -1, np.int64)
    owner = np.empty(0 if packing else n_keys, np.int32)
    packed = np.empty(n_keys if packing else 0, np.int64)
    n_tasks = min(n_units, 256)
    for t in prange(n_tasks):
        order = np.empty(width, np.int64)
        idx = np.empty(width, np.int64)          # per access predicate: its current covered interval ...
        cur = np.empty(width, np.int64)          # ... and space in it
        for u in range(t * n_units // n_tasks, (t + 1) * n_units // n_tasks):
            if count[u] == 0:
                continue
            n_acc = arity[u]
            # the access predicates ascending by attribute
            for q in range(n_acc):
                order[q] = pids[acc[u, q]]
            for q in range(1, n_acc):
                x = order[q]
                s = q
                while s > 0 and row_attr[order[s - 1]] > row_attr[x]:
                    order[s] = order[s - 1]
                    s -= 1
                order[s] = x
            for q in range(n_acc):
                idx[q] = cov_off[order[q]]
                cur[q] = cov_first[idx[q]]
            k = start[u]
            while True:
                if packing:
                    v = np.int64(0)
                    for q in range(width):
                        v = (v << key_bits) | ((cur[q] if q < n_acc else -1) + 1)
                    packed[k] = (v << owner_bits) | u
                else:
                    for q in range(n_acc):
                        keys[k, q] = cur[q]
                    owner[k] = u
                k += 1
                # odometer over the covered spaces, last component fastest
                q = n_acc - 1
                while q >= 0:
                    r = order[q]
                    if cur[q] < cov_last[idx[q]]:
                        cur[q] += 1
                        break
                    if idx[q] + 1 < cov_off[r + 1]:
                        idx[q] += 1
                        cur[q] = cov_first[idx[q]]
                        break
                    idx[q] = cov_off[r]
                    cur[q] = cov_first[idx[q]]
                    q -= 1
                if q < 0:
                    break
    return keys, owner, packed


@njit(parallel=True, nogil=True, cache=True)
def pack_keys(keys, owner, key_bits, owner_bits):
    """Each N-dim key (components + 1, ``key_bits`` each, first component
    highest) and its unit (low ``owner_bits``) as one int64 that sorts as
    (key, unit) does."""
    n, width = keys.shape
    out = np.empty(n, np.int64)
    for i in prange(n):
        v = np.int64(0)
        for q in range(width):
            v = (v << key_bits) | (keys[i, q] + 1)
        out[i] = (v << owner_bits) | owner[i]
    return out


@njit(parallel=True, nogil=True, cache=True)
def unpack_owners(packed, owner_bits, owner, first):
    """The units of :func:`pack_keys`'s sorted codes, and ``first[i]``: code
    ``i`` starts a new key (differs from code ``i - 1`` in its key part)."""
    owner_mask = (np.int64(1) << owner_bits) - 1
    for i in prange(len(packed)):
        owner[i] = packed[i] & owner_mask
        first[i] = i == 0 or (packed[i - 1] >> owner_bits) != (packed[i] >> owner_bits)


@njit(parallel=True, nogil=True, cache=True)
def unpack_group_keys(packed, starts, key_bits, owner_bits, keys):
    """``keys[g]``: the N-dim key of code ``starts[g]`` (:func:`pack_keys` undone)."""
    width = keys.shape[1]
    key_mask = (np.int64(1) << key_bits) - 1
    for g in prange(len(starts)):
        v = packed[starts[g]] >> owner_bits
        for q in range(width - 1, -1, -1):
            keys[g, q] = (v & key_mask) - 1
            v >>= key_bits


@njit(nogil=True, cache=True)
def table_slots(n_groups):
    """Slots for a table of ``n_groups`` keys: a power of two, at most half
    of them used (linear probing's probes stay short)."""
    if n_groups >= 1 << 30:
        raise ValueError("PSTHash's hash table numbers its groups in int32: too many N-dim keys; lower n_access or "
                         "max_combinations, or shard the subscriptions over several indexes")
    n_slots = 2
    while n_slots < 2 * n_groups:
        n_slots *= 2
    return n_slots


#: slots of one region of a table build (32 KiB of int32: a region's probes stay in the core's cache)
REGION_SLOTS = 8192


@njit(parallel=True, nogil=True, cache=True)
def build_hash_table(group_key, n_slots):
    """The hash table of §6.1: open addressing (linear probing) from an
    N-dim space id (a row of ``group_key``; the rows are distinct) to its
    group.  Any insertion order gives a valid table (slots only fill, so
    every slot a probe passed stays full), so the build takes the one that
    is fast: the groups ordered by the region of :data:`REGION_SLOTS`
    slots their home slot is in (a counting sort), the regions over every
    core, each probing its own slots only -- in cache, no two tasks on one
    slot -- and a group whose probe runs past its region's end put in
    afterwards, one at a time.  (At W2's 1 M, 15.8 M groups into 2^25
    slots one at a time in group order: 0.9 s, each probe a cache miss.)
    Keys are not compared: they are distinct."""
    width = group_key.shape[1]
    n = len(group_key)
    mask = np.uint64(n_slots - 1)
    slot_group = np.full(n_slots, -1, np.int32)
    region_slots = min(n_slots, REGION_SLOTS)
    n_regions = n_slots // region_slots
    home = np.empty(n, np.int64)
    for g in prange(n):
        home[g] = np.int64(key_hash(group_key, g, width) & mask)
    start = np.zeros(n_regions + 1, np.int64)
    for g in range(n):
        start[home[g] // region_slots + 1] += 1
    for r in range(n_regions):
        start[r + 1] += start[r]
    order = np.empty(n, np.int32)
    fill = start[:-1].copy()
    for g in range(n):
        r = home[g] // region_slots
        order[fill[r]] = g
        fill[r] += 1
    spilled = np.zeros(n, np.bool_)
    for r in prange(n_regions):
        end = (r + 1) * region_slots
        for i in range(start[r], start[r + 1]):
            g = order[i]
            s = home[g]
            while s < end and slot_group[s] >= 0:
                s += 1
            if s < end:
                slot_group[s] = g
            else:
                spilled[i] = True
    for i in range(n):                         # past a region's end: into the next regions, wrapping round
        if spilled[i]:
            g = order[i]
            s = home[g]
            while slot_group[s] >= 0:
                s = (s + 1) & (n_slots - 1)
            slot_group[s] = g
    return slot_group


# ------------------------------------------------------------ probe order
@njit(nogil=True, cache=True)
def first_listed_order(listed, n_units):
    """The units renumbered in the order ``listed`` (the hash table's group
    lists, group after group) first names them, the units it never names
    after them in their own order: ``order[new] = old``.  (A serial pass:
    which listing comes first is the point.)"""
    seen = np.zeros(n_units, np.uint8)
    order = np.empty(n_units, np.int64)
    k = 0
    for i in range(len(listed)):
        u = listed[i]
        if seen[u] == 0:
            seen[u] = 1
            order[k] = u
            k += 1
    for u in range(n_units):
        if seen[u] == 0:
            order[k] = u
            k += 1
    return order


@njit(parallel=True, nogil=True, cache=True)
def renumber(ids, rank):
    """``rank[ids]`` as int32, over every core (the group lists hold tens of millions of entries)."""
    out = np.empty(len(ids), np.int32)
    for i in prange(len(ids)):
        out[i] = rank[ids[i]]
    return out


# ------------------------------------------------------------------ matching
@njit(inline="always", nogil=True)
def unit_true(u, skip0, skip1, unit_off, pids, ev_pos, ev_value, ev_token, rows, pattern_truth, list_truth):
    """Whether every predicate of unit ``u`` is TRUE on the event (``ev_pos``:
    attribute -> entry, -1 absent), the positions ``skip0``/``skip1`` of
    ``pids`` excepted (access predicates already decided by their space)."""
    n_pos = len(ev_pos)
    for j in range(unit_off[u], unit_off[u + 1]):
        if j == skip0 or j == skip1:
            continue
        r = pids[j]
        a = rows.attr[r]
        at = ev_pos[a] if a < n_pos else -1
        if entry_truth(r, at, ev_value, ev_token, rows.op, rows.lo, rows.hi, rows.set_offsets, rows.set_values,
                       rows.aux, pattern_truth, list_truth) != TRUE:
            return False
    return True


@njit(inline="always", nogil=True)
def decided_by_space(j, pids, rows, ev_pos, ev_value):
    """Whether access predicate ``pids[j]`` (whose space holds the event's
    value) needs no evaluation: always, but for a NaN (placed in the
    leftmost space, which predicates FALSE on it may cover)."""
    if j < 0:
        return -1
    at = ev_pos[rows.attr[pids[j]]]
    x = ev_value[at]
    return j if x == x else -1


@njit(nogil=True)
def _event_done(e, s0, s1, found, always, unit_sub, unit_off, pids, rows, ev_attr, ev_pos, ev_value, ev_token,
                pattern_truth, list_truth, alive, bm0, bm1, out, base, used, cap, ev_count, result, stats):
    """The end of event ``e`` in a one-event-at-a-time task (``found`` of
    its matches marked in ``bm0``/``bm1``): the units without an access
    predicate (``always``) verified, its attributes' places in ``ev_pos``
    cleared, its positions written out (the
    :func:`engine.algorithms.host_tasks.match_in_tasks` protocol).  Returns
    the task's output used after it, or -1 when they did not fit
    (``result``: where to resume)."""
    for i in range(len(always)):
        u = always[i]
        pos = unit_sub[u]
        word = pos >> 6
        mask = np.uint64(1) << np.uint64(pos & 63)
        if alive[pos] == 0 or (bm0[word] & mask) != 0:
            continue
        if unit_true(u, -1, -1, unit_off, pids, ev_pos, ev_value, ev_token, rows, pattern_truth, list_truth):
            bm0[word] |= mask
            bm1[word >> 6] |= np.uint64(1) << np.uint64(word & 63)
            found += 1
    for at in range(s0, s1):
        if ev_attr[at] < len(ev_pos):
            ev_pos[ev_attr[at]] = -1
    if len(stats) > 0:
        stats[2] += found
    write = used + found <= cap
    emit_marked(bm0, bm1, out, base + used, write)
    if not write:
        result[0] = e
        result[1] = found
        return -1
    ev_count[e] = found
    return used + found


@njit(nogil=True)
def pstbloom_task(e_first, e_last, out, base, cap, ev_count, ev_offsets, ev_attr, ev_value, ev_token, ev_space,
                  pattern_truth, list_truth, unit_sub, unit_off, pids, rows, bloom, n_hashes, alive, ev_pos, bm0, bm1,
                  result, stats):
    """Algorithm 5 for events ``[e_first, e_last)`` (the
    :func:`engine.algorithms.host_tasks.match_in_tasks` protocol); ``stats``
    (empty, or 3 slots) counts list candidates, those the signatures keep,
    and matches."""
    n_pos = len(ev_pos)
    count = len(stats) > 0
    used = 0
    result[0] = e_last
    result[1] = 0
    for e in range(e_first, e_last):
        s0 = ev_offsets[e]
        s1 = ev_offsets[e + 1]
        for at in range(s0, s1):
            if ev_attr[at] < n_pos:
                ev_pos[ev_attr[at]] = at
        found = 0
        for at in range(s0, s1):
            g = ev_space[at]
            if g < 0:
                continue
            # lines 5-6: the subscription list of the pair's leaf
            for i in range(bloom.list_off[g], bloom.list_off[g + 1]):
                u = bloom.units[i]
                pos = unit_sub[u]
                word = pos >> 6
                mask = np.uint64(1) << np.uint64(pos & 63)
                if alive[pos] == 0 or (bm0[word] & mask) != 0:
                    continue
                if count:
                    stats[0] += 1
                # lines 7-13: each other predicate's leaf signature must hold the unit
                keep = True
                acc = bloom.access[u]
                h1, h2 = bloom_key(bloom.key[u])
                for j in range(unit_off[u], unit_off[u + 1]):
                    r = pids[j]
                    if j == acc or not bloom.indexable[r]:
                        continue
                    a = rows.attr[r]
                    at2 = ev_pos[a] if a < n_pos else -1
                    if at2 < 0:         # absent: the predicate is NULL, the unit cannot be TRUE
                        keep = False
                        break
                    g2 = ev_space[at2]
                    if g2 < 0:          # no PS-Tree on the attribute: the predicate covers nothing, is never TRUE
                        keep = False
                        break
                    if not bloom_probe(bloom.sig, bloom.sig_off[g2], bloom.sig_off[g2 + 1], h1, h2, n_hashes):
                        keep = False
                        break
                if not keep:
                    continue
                if count:
                    stats[1] += 1
                # line 15: the exact check, the access predicate decided by its space
                skip = decided_by_space(acc, pids, rows, ev_pos, ev_value)
                if unit_true(u, skip, -1, unit_off, pids, ev_pos, ev_value, ev_token, rows, pattern_truth, list_truth):
                    bm0[word] |= mask
                    bm1[word >> 6] |= np.uint64(1) << np.uint64(word & 63)
                    found += 1
        used = _event_done(e, s0, s1, found, bloom.always, unit_sub, unit_off, pids, rows, ev_attr, ev_pos, ev_value,
                           ev_token, pattern_truth, list_truth, alive, bm0, bm1, out, base, used, cap, ev_count,
                           result, stats)
        if used < 0:
            return


def pstbloom_kernel_py(task_first, task_last, out, cap, ev_count, task_stop, task_need, n_positions, n_attrs,
                       ev_offsets, ev_attr, ev_value, ev_token, ev_space, pattern_truth, list_truth, unit_sub,
                       unit_off, pids, rows, bloom, n_hashes, alive, stats):
    """Tasks of events over all cores (``stats``: see :func:`pstbloom_task`;
    only on the serial twin)."""
    n_words = (n_positions + 63) >> 6
    for t in prange(len(task_first)):
        ev_pos = np.full(max(n_attrs, 1), -1, np.int64)
        bm0 = np.zeros(max(n_words, 1), np.uint64)
        bm1 = np.zeros(max((n_words + 63) >> 6, 1), np.uint64)
        result = np.empty(2, np.int64)
        pstbloom_task(task_first[t], task_last[t], out, t * cap, cap, ev_count, ev_offsets, ev_attr, ev_value,
                      ev_token, ev_space, pattern_truth, list_truth, unit_sub, unit_off, pids, rows, bloom, n_hashes,
                      alive, ev_pos, bm0, bm1, result, stats)
        task_stop[t] = result[0]
        task_need[t] = result[1]


pstbloom_kernel, pstbloom_serial = parallel_and_serial(pstbloom_kernel_py, nogil=True)


@njit(nogil=True)
def psthash_task(e_first, e_last, out, base, cap, ev_count, ev_offsets, ev_attr, ev_value, ev_token, ev_space,
                 pattern_truth, list_truth, unit_sub, unit_off, pids, rows, table, alive, ev_pos, loc, idx, key, bm0,
                 bm1, result, stats):
    """Algorithm 7 for events ``[e_first, e_last)``: the event's located
    spaces ``loc`` (ascending), every combination of ``r`` of them for each
    arity ``r`` some unit has (C(|E|, r) keys), its units from the hash table
    verified.  ``stats`` (empty, or 3 slots): keys probed, candidates,
    matches."""
    n_pos = len(ev_pos)
    width = table.group_key.shape[1]
    count = len(stats) > 0
    used = 0
    result[0] = e_last
    result[1] = 0
    for e in range(e_first, e_last):
        s0 = ev_offsets[e]
        s1 = ev_offsets[e + 1]
        k = 0
        for at in range(s0, s1):
            if ev_attr[at] < n_pos:
                ev_pos[ev_attr[at]] = at
            if ev_space[at] >= 0:
                loc[k] = ev_space[at]
                k += 1
        found = 0
        for r in range(1, width + 1):
            if table.arities[r] == 0 or r > k:
                continue
            first_combination(idx, r)
            while True:
                for q in range(width):
                    key[0, q] = loc[idx[q]] if q < r else -1
                if count:
                    stats[0] += 1
                s = find_slot(table.slot_group, table.group_key, key, 0, width)
                grp = table.slot_group[s]
                if grp >= 0:
                    for i in range(table.group_off[grp], table.group_off[grp + 1]):
                        u = table.units[i]
                        pos = unit_sub[u]
                        word = pos >> 6
                        mask = np.uint64(1) << np.uint64(pos & 63)
                        if alive[pos] == 0 or (bm0[word] & mask) != 0:
                            continue
                        if count:
                            stats[1] += 1
                        skip0 = decided_by_space(table.access[u, 0], pids, rows, ev_pos, ev_value)
                        skip1 = decided_by_space(table.access[u, 1], pids, rows, ev_pos, ev_value) \
                            if width > 1 else -1
                        if unit_true(u, skip0, skip1, unit_off, pids, ev_pos, ev_value, ev_token, rows,
                                     pattern_truth, list_truth):
                            bm0[word] |= mask
                            bm1[word >> 6] |= np.uint64(1) << np.uint64(word & 63)
                            found += 1
                if not next_combination(idx, r, k):    # (of r of the k located spaces)
                    break
        used = _event_done(e, s0, s1, found, table.always, unit_sub, unit_off, pids, rows, ev_attr, ev_pos, ev_value,
                           ev_token, pattern_truth, list_truth, alive, bm0, bm1, out, base, used, cap, ev_count,
                           result, stats)
        if used < 0:
            return


def psthash_kernel_py(task_first, task_last, out, cap, ev_count, task_stop, task_need, n_positions, n_attrs,
                      max_event, ev_offsets, ev_attr, ev_value, ev_token, ev_space, pattern_truth, list_truth,
                      unit_sub, unit_off, pids, rows, table, alive, stats):
    n_words = (n_positions + 63) >> 6
    width = table.group_key.shape[1]
    for t in prange(len(task_first)):
        ev_pos = np.full(max(n_attrs, 1), -1, np.int64)
        loc = np.empty(max(max_event, 1), np.int64)
        idx = np.empty(width, np.int64)
        key = np.empty((1, width), np.int64)
        bm0 = np.zeros(max(n_words, 1), np.uint64)
        bm1 = np.zeros(max((n_words + 63) >> 6, 1), np.uint64)
        result = np.empty(2, np.int64)
        psthash_task(task_first[t], task_last[t], out, t * cap, cap, ev_count, ev_offsets, ev_attr, ev_value,
                     ev_token, ev_space, pattern_truth, list_truth, unit_sub, unit_off, pids, rows, table, alive,
                     ev_pos, loc, idx, key, bm0, bm1, result, stats)
        task_stop[t] = result[0]
        task_need[t] = result[1]


psthash_kernel, psthash_serial = parallel_and_serial(psthash_kernel_py, nogil=True)



# ------------------------------------------------- both PS-Trees, 64 events a group
#: events a group: the bits of a word
LANES = 64
#: added to a check's kind where it is its unit's access predicate: decided by the list's space (but on a NaN)
ACCESS = 8


class UnitChecks(NamedTuple):
    """Each unit predicate's check at its place in the probe-order ``pids``:
    the predicate's attribute and its
    :func:`~gpu_kernels.predicates.interval_form` (kind, bounds), the kind
    plus :data:`ACCESS` for the unit's access predicates.  A unit's checks
    are read front to back, with no read of the predicate rows but for
    EVALUATED predicates, nor of the unit's access predicates (a random
    read a candidate: 5-9 % of PSTHash's batch kernel on W2 at 1 M)."""

    attr: np.ndarray     # int32
    kind: np.ndarray     # int8
    bounds: np.ndarray   # float64 [n, 2]


def unit_checks(pids: np.ndarray, rows, access: np.ndarray) -> UnitChecks:
    """The checks of the predicates ``pids`` (rows of ``rows``), in that
    order; ``access``: the places of access predicates (-1: none)."""
    kind, bounds = interval_form(rows.op, rows.lo, rows.hi)
    kind = kind[pids]
    kind[access[access >= 0]] += ACCESS
    return UnitChecks(rows.attr[pids], kind, bounds[pids])


@njit(inline="always", nogil=True)
def _compared(kind, x, lo, hi):
    """The truth of a comparison check (kind INSIDE, OUTSIDE or NOT_INSIDE) on a present value ``x``."""
    if kind == INSIDE:
        return lo <= x and x <= hi
    if kind == OUTSIDE:
        return x < lo or x > hi
    return not (lo <= x and x <= hi)


@njit(inline="always", nogil=True)
def _mark(pos, lanes, pos_t, pos_words):
    """Lanes ``lanes`` match position ``pos`` (:mod:`gpu_kernels.compaction`'s group words)."""
    if pos_t[pos] == ZERO:
        w = pos >> 6
        pos_words[w >> 6] |= ONE << np.uint64(w & 63)
    pos_t[pos] |= lanes


@njit(inline="always", nogil=True)
def _reached(grp, bit, group_lanes, group_marks):
    """List ``grp`` is reached by the lane ``bit`` (its word started at the first lane, its mark set)."""
    mark = ONE << np.uint64(grp & 63)
    if group_marks[grp >> 6] & mark:
        group_lanes[grp] |= bit
    else:
        group_marks[grp >> 6] |= mark
        group_lanes[grp] = bit


@njit(nogil=True)
def lanes_task(e_first, e_last, out, base, cap, ev_count, ev_offsets, ev_attr, ev_value, ev_token, ev_space,
               pattern_truth, list_truth, unit_sub, unit_off, pids, rows, checks, list_off, list_units, always, by_key,
               table, alive, lane_pos, lane_val, lane_present, loc, idx, key, group_lanes, group_marks, pos_t,
               pos_words, blocks, found, cursor, result):
    """Events ``[e_first, e_last)`` in groups of :data:`LANES`,
    verification turned around (``result``: as :func:`psthash_task`'s), for
    both PS-Trees: a *list* is PSTHash's group of an N-dim space (``by_key``:
    the event probes its keys in ``table`` as Algorithm 7 does) or
    PSTBloom's list of a predicate space (the event's located spaces, as
    Algorithm 5 reads them); ``list_off``/``list_units`` their CSR.  A list
    an event reaches only gets the event's bit
    (``group_lanes``, ``group_marks``); then the lists reached are read in
    ascending order -- their units front to back, as the probe order lays
    them out -- and each unit verified once for the lanes that reached it,
    against the group's values (``lane_val``).  A unit's checks are read
    once for up to 64 events, where one event at a time read them for each:
    W2 at 1 M meets 23 K candidates an event, random reads one at a time, a
    few hundred nanoseconds each (BENCHMARKS.md).  A unit reached by one
    lane (most: 1.1 lanes a unit read on W2) is checked without the loop
    over lanes.  An access predicate (:data:`ACCESS` in its check) is
    decided by its space as in :func:`psthash_task`, but for a lane whose
    event holds a NaN: such a group evaluates them too.  (PSTBloom's
    signatures are not probed here: a lane's signature probe costs what the
    exact check of the lane it might save does.)"""
    n_attrs = len(lane_present)
    width = table.group_key.shape[1]
    check_attr, check_kind, check_bounds = checks
    used = 0
    limit = base + cap
    result[0] = e_last
    result[1] = 0
    for g0 in range(e_first, e_last, LANES):
        g1 = min(g0 + LANES, e_last)
        lanes = ALL if g1 - g0 == LANES else (ONE << np.uint64(g1 - g0)) - ONE
        nan_lanes = ZERO
        for e in range(g0, g1):
            bit = ONE << np.uint64(e - g0)
            k = 0
            for at in range(ev_offsets[e], ev_offsets[e + 1]):
                a = ev_attr[at]
                if 0 <= a < n_attrs:
                    lane_pos[a, e - g0] = at
                    lane_val[a, e - g0] = ev_value[at]
                    lane_present[a] |= bit
                if ev_value[at] != ev_value[at]:
                    nan_lanes |= bit
                if ev_space[at] >= 0:
                    loc[k] = ev_space[at]
                    k += 1
            if not by_key:                  # PSTBloom: the lists of the located spaces
                for q in range(k):
                    _reached(loc[q], bit, group_lanes, group_marks)
                continue
            for r in range(1, width + 1):
                if table.arities[r] == 0 or r > k:
                    continue
                first_combination(idx, r)
                while True:
                    for q in range(width):
                        key[0, q] = loc[idx[q]] if q < r else -1
                    grp = table.slot_group[find_slot(table.slot_group, table.group_key, key, 0, width)]
                    if grp >= 0:
                        _reached(grp, bit, group_lanes, group_marks)
                    if not next_combination(idx, r, k):
                        break
        # the lists reached, ascending, then the always list as one more: each unit
        # verified once for the lanes that reached it, its checks read front to back.
        # (Written out here, once: the same loop as an inline="always" function ran
        # 1.7-2x slower on W2 at 1 M -- numba inlines at its IR level, measured.)
        n_marks = len(group_marks)
        for w in range(n_marks + 1):
            y = group_marks[w] if w < n_marks else ONE
            if w < n_marks:
                group_marks[w] = ZERO
            while y != ZERO:
                low = y & (~y + ONE)
                y ^= low
                if w < n_marks:
                    grp = (w << 6) + ctz(low)
                    probed = group_lanes[grp]
                    units, i0, i1 = list_units, list_off[grp], list_off[grp + 1]
                else:
                    probed = lanes
                    units, i0, i1 = always, 0, len(always)
                # (the same for every unit of the list)
                decided = w < n_marks and (probed & nan_lanes) == ZERO   # the access predicates, by the space
                one = (probed & (probed - ONE)) == ZERO        # one lane (most units): no loop over lanes
                lone = ctz(probed) if one else 0
                for i in range(i0, i1):
                    u = units[i]
                    m = probed
                    for j in range(unit_off[u], unit_off[u + 1]):
                        a = check_attr[j]
                        kind = check_kind[j]
                        if kind >= ACCESS:
                            if decided:
                                continue
                            kind -= ACCESS
                        if one:
                            here1 = a < n_attrs and (lane_present[a] & m) != ZERO    # absent: NULL, not TRUE
                            if kind == EVALUATED:
                                true = entry_truth(pids[j], lane_pos[a, lone] if here1 else -1, ev_value, ev_token,
                                                   rows.op, rows.lo, rows.hi, rows.set_offsets, rows.set_values,
                                                   rows.aux, pattern_truth, list_truth) == TRUE
                            else:
                                true = here1 and _compared(kind, lane_val[a, lone], check_bounds[j, 0],
                                                           check_bounds[j, 1])
                            if not true:
                                m = ZERO
                                break
                            continue
                        here = lane_present[a] if a < n_attrs else ZERO     # absent: NULL, not TRUE
                        t = ZERO
                        lanes_left = m & here if kind != EVALUATED else m
                        while lanes_left != ZERO:
                            bit = lanes_left & (~lanes_left + ONE)
                            lanes_left ^= bit
                            lane = popcount64(bit - ONE)
                            if kind == EVALUATED:
                                at = lane_pos[a, lane] if (here & bit) != ZERO else -1
                                if entry_truth(pids[j], at, ev_value, ev_token, rows.op, rows.lo, rows.hi,
                                               rows.set_offsets, rows.set_values, rows.aux, pattern_truth,
                                               list_truth) == TRUE:
                                    t |= bit
                                continue
                            if _compared(kind, lane_val[a, lane], check_bounds[j, 0], check_bounds[j, 1]):
                                t |= bit
                        m = t
                        if m == ZERO:
                            break
                    if m != ZERO and alive[unit_sub[u]] != 0:
                        _mark(unit_sub[u], m, pos_t, pos_words)
        for e in range(g0, g1):
            for at in range(ev_offsets[e], ev_offsets[e + 1]):
                if 0 <= ev_attr[at] < n_attrs:
                    lane_present[ev_attr[at]] = ZERO
        used = emit_group(pos_t, pos_words, g0, g1, blocks, found, cursor, out, base, used, limit, ev_count, result)
        if used < 0:
            return


def lanes_kernel_py(task_first, task_last, out, cap, ev_count, task_stop, task_need, n_positions, n_attrs,
                    max_event, ev_offsets, ev_attr, ev_value, ev_token, ev_space, pattern_truth, list_truth,
                    unit_sub, unit_off, pids, rows, checks, list_off, list_units, always, by_key, table, alive):
    """Tasks of events over all cores, each with its scratch: the lanes'
    values, the lists' lane words and marks, the positions' words and
    their blocks transposed (only the marks and the positions' words need
    zeros: the rest is written before it is read)."""
    n_lists = len(list_off) - 1
    width = table.group_key.shape[1]
    for t in prange(len(task_first)):
        lane_pos = np.empty((max(n_attrs, 1), LANES), np.int64)
        lane_val = np.empty((max(n_attrs, 1), LANES), np.float64)
        lane_present = np.zeros(max(n_attrs, 1), np.uint64)
        loc = np.empty(max(max_event, 1), np.int64)
        idx = np.empty(width, np.int64)
        key = np.empty((1, width), np.int64)
        group_lanes = np.empty(max(n_lists, 1), np.uint64)
        group_marks = np.zeros(max((n_lists + 63) >> 6, 1), np.uint64)
        pos_t, pos_words, blocks, found, cursor = group_scratch(n_positions)
        result = np.empty(2, np.int64)
        lanes_task(task_first[t], task_last[t], out, t * cap, cap, ev_count, ev_offsets, ev_attr, ev_value, ev_token,
                   ev_space, pattern_truth, list_truth, unit_sub, unit_off, pids, rows, checks, list_off, list_units,
                   always, by_key, table, alive, lane_pos, lane_val, lane_present, loc, idx, key,
                   group_lanes, group_marks, pos_t, pos_words, blocks, found, cursor, result)
        task_stop[t] = result[0]
        task_need[t] = result[1]


lanes_kernel, lanes_serial = parallel_and_serial(lanes_kernel_py, nogil=True)


def no_hash_table() -> HashArrays:
    """The ``table`` argument of :func:`lanes_task` for PSTBloom (``by_key``
    False: never read, but typed like PSTHash's, so the one kernel serves both)."""
    return HashArrays(np.zeros(1, np.int32), np.zeros((1, 1), np.int64), np.zeros(2, np.int64), np.zeros(1, np.int32),
                      np.zeros((1, 1), np.int64), np.zeros(2, np.uint8), np.zeros(1, np.int32))


# ------------------------------------------------- dynamic adjustment (§4.4)
@njit(inline="always", nogil=True)
def _same_code(x, y):
    return x == y or (x != x and y != y)


@njit(nogil=True, cache=True)
def same_units(old_off, old_pids, old_attr, old_op, old_lo, old_hi, old_set_off, old_set_val, new_off, new_pids,
               new_attr, new_op, new_lo, new_hi, new_set_off, new_set_val, cand_old, cand_new):
    """Per candidate pair (old unit ``cand_old[k]``, new unit
    ``cand_new[k]``), whether both are the same predicates position by
    position (attribute, operator, codes, IN list): then the old unit's
    places in the structure (its access predicates, its list entries and
    Bloom bits) stand for the new one.  A merge's survivors are the same
    programs but for predicate ids; codes moved by a grown string
    dictionary show here."""
    ok = np.zeros(len(cand_old), np.bool_)
    for k in range(len(cand_old)):
        a = cand_old[k]
        b = cand_new[k]
        n = old_off[a + 1] - old_off[a]
        if n != new_off[b + 1] - new_off[b]:
            continue
        same = True
        for i in range(n):
            r = old_pids[old_off[a] + i]
            s = new_pids[new_off[b] + i]
            if old_attr[r] != new_attr[s] or old_op[r] != new_op[s] or not _same_code(old_lo[r], new_lo[s]) \
                    or not _same_code(old_hi[r], new_hi[s]):
                same = False
                break
            n_set = old_set_off[r + 1] - old_set_off[r]
            if n_set != new_set_off[s + 1] - new_set_off[s]:
                same = False
                break
            for q in range(n_set):
                if not _same_code(old_set_val[old_set_off[r] + q], new_set_val[new_set_off[s] + q]):
                    same = False
                    break
            if not same:
                break
        ok[k] = same
    return ok


@njit(nogil=True, cache=True)
def derive_pstbloom(parent, old_list_off, old_units, unit_map, old_sig_off, old_sig, sig_total, sig_live, add_unit,
                    add_key, add_access, add_first, add_last, bits_per_unit, n_hashes, stale_share):
    """§4.4's split and merge for PSTBloom's lists and signatures.  Space
    ``s`` of the new PS-Trees lies inside old space ``parent[s]`` (-1: none,
    a new tree) -- split off it, or the first of the old spaces merged into
    it, which all hold the same surviving units (no surviving predicate
    ends between them).  Its list is the parent's, the removed units
    dropped (``unit_map``: old unit -> new, -1 removed), then the added
    units whose access predicate covers it; its signature the parent's
    words copied (a Bloom filter cannot forget a removed unit: its stale
    bits only let a few more candidates through to the exact check) with
    the added units' bits set.  A space is *refreshed* -- its signature
    sized afresh and refilled by :func:`refill_signatures` -- when it has no
    parent, when copying would put more than twice the bits per unit it was
    sized for in it, or when more than ``stale_share`` of the units it holds
    are gone.  Added records: unit, Bloom key, access or not, and the range
    of new spaces covered.  Returns the lists, the signatures, the per-space
    counters (units inserted, units live) and the refreshed flags."""
    n_sp = len(parent)
    n_old = len(old_list_off) - 1
    live_list = np.zeros(n_old, np.int64)
    for p in range(n_old):
        for i in range(old_list_off[p], old_list_off[p + 1]):
            if unit_map[old_units[i]] >= 0:
                live_list[p] += 1
    n_list = np.zeros(n_sp + 1, np.int64)
    n_sig_add = np.zeros(n_sp, np.int64)
    for k in range(len(add_unit)):
        for s in range(add_first[k], add_last[k] + 1):
            if add_access[k]:
                n_list[s + 1] += 1
            else:
                n_sig_add[s] += 1
    for s in range(n_sp):
        if parent[s] >= 0:
            n_list[s + 1] += live_list[parent[s]]
    list_off = np.cumsum(n_list)
    units = np.empty(list_off[-1], np.int32)
    fill = list_off[:-1].copy()
    for s in range(n_sp):
        p = parent[s]
        if p < 0:
            continue
        for i in range(old_list_off[p], old_list_off[p + 1]):
            v = unit_map[old_units[i]]
            if v >= 0:
                units[fill[s]] = v
                fill[s] += 1
    total = np.zeros(n_sp, np.int64)
    live = np.zeros(n_sp, np.int64)
    refresh = np.zeros(n_sp, np.bool_)
    sig_off = np.zeros(n_sp + 1, np.int64)
    for s in range(n_sp):
        p = parent[s]
        have = 0
        t = 0
        n = 0
        if p >= 0:
            have = old_sig_off[p + 1] - old_sig_off[p]
            t = sig_total[p]
            n = sig_live[p]
        t += n_sig_add[s]
        n += n_sig_add[s]
        words = have
        if p < 0 or (have == 0 and n > 0) or t * bits_per_unit > 2 * have * 64 or t - n > stale_share * t:
            refresh[s] = True
            words = 0
            if n > 0:
                words = 1
                while words * 64 < n * bits_per_unit:
                    words *= 2
            t = n
        total[s] = t
        live[s] = n
        sig_off[s + 1] = sig_off[s] + words
    sig = np.zeros(sig_off[-1], np.uint64)
    for s in range(n_sp):
        if not refresh[s]:
            w0 = old_sig_off[parent[s]]
            for w in range(sig_off[s + 1] - sig_off[s]):
                sig[sig_off[s] + w] = old_sig[w0 + w]
    for k in range(len(add_unit)):
        h1, h2 = bloom_key(add_key[k])
        for s in range(add_first[k], add_last[k] + 1):
            if add_access[k]:
                units[fill[s]] = add_unit[k]
                fill[s] += 1
            elif not refresh[s]:
                mask = np.uint64((sig_off[s + 1] - sig_off[s]) * 64 - 1)
                for i in range(n_hashes):
                    b = np.int64((h1 + np.uint64(i) * h2) & mask)
                    sig[sig_off[s] + (b >> 6)] |= np.uint64(1) << np.uint64(b & 63)
    return list_off, units, sig_off, sig, total, live, refresh


@njit(nogil=True, cache=True)
def refill_signatures(refresh, sig_off, sig, rec_key, rec_first, rec_last, n_hashes):
    """The bits of every live unit (record: Bloom key, range of spaces one
    of its non-access predicates covers) in the refreshed spaces'
    signatures."""
    for k in range(len(rec_key)):
        h1, h2 = bloom_key(rec_key[k])
        for s in range(rec_first[k], rec_last[k] + 1):
            if not refresh[s] or sig_off[s + 1] == sig_off[s]:
                continue
            mask = np.uint64((sig_off[s + 1] - sig_off[s]) * 64 - 1)
            for i in range(n_hashes):
                b = np.int64((h1 + np.uint64(i) * h2) & mask)
                sig[sig_off[s] + (b >> 6)] |= np.uint64(1) << np.uint64(b & 63)


@njit(inline="always", nogil=True)
def _group_of(slot_group, group_key, key, width, n_groups):
    """The group of N-dim space id ``key[0]`` in the table, inserted as group
    ``n_groups`` (its row of ``group_key`` written; the caller made room)
    when new; returns it and the groups now held."""
    s = find_slot(slot_group, group_key, key, 0, width)
    if slot_group[s] >= 0:
        return np.int64(slot_group[s]), n_groups
    slot_group[s] = n_groups
    for q in range(width):
        group_key[n_groups, q] = key[0, q]
    return n_groups, n_groups + 1


@njit(nogil=True, cache=True)
def derive_psthash(old_keys, old_group_off, old_units, unit_map, lo, hi, add_keys, add_owner, width):
    """§4.4's split and merge for PSTHash's table (§6.2: "the records
    associated with the old space ID in the hash table are copied to new
    records using the new space ID as the key").  Old space ``p`` became
    the new spaces ``lo[p]..hi[p]`` (none when ``lo > hi``): each old key
    goes to every combination of them, with its surviving units
    (``unit_map``); the added units' keys are inserted next.  Old keys
    whose spaces merged land in one group: their surviving units are the
    same (no surviving access predicate ends between merged spaces), so
    such a group is deduplicated.  Returns the table (``slot_group``,
    ``group_key``) and the groups' CSR of units."""
    n_g = len(old_group_off) - 1
    live = np.zeros(n_g, np.int64)
    n_exp = np.zeros(n_g, np.int64)
    total = 0
    for g in range(n_g):
        for i in range(old_group_off[g], old_group_off[g + 1]):
            if unit_map[old_units[i]] >= 0:
                live[g] += 1
        if live[g] == 0:
            continue
        prod = 1
        for q in range(width):
            p = old_keys[g, q]
            if p < 0:
                break
            if lo[p] > hi[p]:
                prod = 0
                break
            prod *= hi[p] - lo[p] + 1
        n_exp[g] = prod
        total += prod
    bound = total + len(add_keys)
    slot_group = np.full(table_slots(bound), -1, np.int32)
    group_key = np.full((bound, width), -1, np.int64)
    key = np.full((1, width), -1, np.int64)
    size = np.zeros(bound + 1, np.int64)
    sources = np.zeros(bound, np.int64)
    exp_group = np.empty(total, np.int64)
    n_groups = 0
    k = 0
    for g in range(n_g):
        if n_exp[g] == 0:
            continue
        for q in range(width):
            p = old_keys[g, q]
            key[0, q] = lo[p] if p >= 0 else -1
        while True:
            grp, n_groups = _group_of(slot_group, group_key, key, width, n_groups)
            size[grp + 1] += live[g]
            sources[grp] += 1
            exp_group[k] = grp
            k += 1
            # odometer over the new spaces of each component, last fastest
            q = width - 1
            while q >= 0:
                p = old_keys[g, q]
                if p < 0:
                    q -= 1
                    continue
                if key[0, q] < hi[p]:
                    key[0, q] += 1
                    break
                key[0, q] = lo[p]
                q -= 1
            if q < 0:
                break
    add_group = np.empty(len(add_keys), np.int64)
    for i in range(len(add_keys)):
        for q in range(width):
            key[0, q] = add_keys[i, q]
        grp, n_groups = _group_of(slot_group, group_key, key, width, n_groups)
        size[grp + 1] += 1
        add_group[i] = grp
    group_off = np.cumsum(size[:n_groups + 1])
    units = np.empty(group_off[-1], np.int32)
    fill = group_off[:-1].copy()
    k = 0
    for g in range(n_g):
        for _ in range(n_exp[g]):
            grp = exp_group[k]
            k += 1
            for i in range(old_group_off[g], old_group_off[g + 1]):
                v = unit_map[old_units[i]]
                if v >= 0:
                    units[fill[grp]] = v
                    fill[grp] += 1
    for i in range(len(add_keys)):
        units[fill[add_group[i]]] = add_owner[i]
        fill[add_group[i]] += 1
    if n_groups < bound:        # (keys met again: fewer groups than the room made)
        group_key = group_key[:n_groups].copy()
    merged_any = False
    for grp in range(n_groups):
        if sources[grp] > 1:
            merged_any = True
    if not merged_any:
        return slot_group, group_key, group_off, units
    # groups of merged old keys: each unit once
    out_off = np.zeros(n_groups + 1, np.int64)
    out = np.empty(len(units), np.int32)
    n = 0
    for grp in range(n_groups):
        part = units[group_off[grp]:group_off[grp + 1]]
        if sources[grp] > 1:
            part = np.unique(part)
        for i in range(len(part)):
            out[n] = part[i]
            n += 1
        out_off[grp + 1] = n
    return slot_group, group_key, out_off, out[:n].copy()


@njit(nogil=True, cache=True)
def find_groups(slot_group, group_key, keys, n_groups):
    """Per row of ``keys``, its group in the table, inserted (groups
    ``n_groups``, ...; ``group_key`` has their rows) when new -- into the
    given arrays: the caller hands copies when the table is another
    matcher's."""
    width = group_key.shape[1]
    out = np.empty(len(keys), np.int64)
    key = np.empty((1, width), np.int64)
    for i in range(len(keys)):
        for q in range(width):
            key[0, q] = keys[i, q]
        out[i], n_groups = _group_of(slot_group, group_key, key, width, n_groups)
    return out, n_groups


@njit(nogil=True, cache=True)
def lookup_groups(slot_group, group_key, keys):
    """Per row of ``keys``, its group in the table, -1 when absent (read only)."""
    width = group_key.shape[1]
    out = np.empty(len(keys), np.int64)
    for i in range(len(keys)):
        out[i] = slot_group[find_slot(slot_group, group_key, keys, i, width)]
    return out


@njit(nogil=True, cache=True)
def regroup(group_off, old_units, unit_map, n_groups, add_group, add_owner):
    """The groups' units when no space changed: each old group's survivors
    (``unit_map``), then the added units keyed there (``add_group``)."""
    n_old = len(group_off) - 1
    size = np.zeros(n_groups + 1, np.int64)
    for g in range(n_old):
        for i in range(group_off[g], group_off[g + 1]):
            if unit_map[old_units[i]] >= 0:
                size[g + 1] += 1
    for i in range(len(add_group)):
        size[add_group[i] + 1] += 1
    new_off = np.cumsum(size)
    units = np.empty(new_off[-1], np.int32)
    fill = new_off[:-1].copy()
    for g in range(n_old):
        for i in range(group_off[g], group_off[g + 1]):
            v = unit_map[old_units[i]]
            if v >= 0:
                units[fill[g]] = v
                fill[g] += 1
    for i in range(len(add_group)):
        units[fill[add_group[i]]] = add_owner[i]
        fill[add_group[i]] += 1
    return new_off, units
