"""The bitmap event encoding of A-PCM (Sadoghi, Jacobsen, ICDE 2014, §IV) as arrays.

**Bits.**  Every distinct predicate of the index (a row of the extended
predicate table, :class:`engine.algorithms.units.PredicateRows`) is one bit
of an event's *Result Bit-array*: 1 when the predicate is TRUE on the event.
The bits of one attribute are contiguous -- the paper's re-ordering of bits
by attribute -- so an event's bitmap is a *slice per attribute it carries*;
the slices of the attributes it lacks are the paper's Ψ̄ sets, all zero,
and are never stored.  ``IS NULL`` predicates have no bit: they are TRUE
exactly where the attribute's slice is missing.

**Precomputed rows (Ψ^P).**  §IV precomputes, for each attribute and each
value of its discrete domain, the bits of the attribute's predicates
("enumerating over the discrete values of each attribute").  Here the
domain is float64 codes, but an attribute's predicates change truth only at
their operands: the sorted distinct operands ``B`` (``bounds``) cut the line
into ``2 |B| + 1`` *elementary intervals* -- each gap ``(B[i-1], B[i])`` and
each point ``B[i]`` -- on each of which every comparison, ``BETWEEN`` and
``IN`` predicate is constant.  One row of bits per elementary interval is
the attribute's *table*; encoding an event's value is a binary search for
its interval, and the event's slice *is* that row (nothing is copied).
Pattern predicates (``LIKE``, ``MATCHES``) depend on the string, not its
interval, list predicates (``ONE OF`` ... ``IS NOT EMPTY``) on the event
list (the batch's list table, read by the entry's token), and an attribute whose table would exceed :data:`TABLE_WORDS`
words is not worth one: the slices of such *evaluated* attributes are
computed per event entry by the shared
:func:`gpu_kernels.predicates.entry_truth`, each bit once.

**Maintenance** (§IV, last paragraph).  A merge keeps the layout: the bits
of predicates that are gone are *pseudo-deleted* (left in place, never
evaluated again, referenced by no subscription); predicates new since the
layout was built go to an *overflow bitmap*, a second, evaluated slice per
attribute.  When dead and overflow bits pass :data:`RECLAIM_SHARE` of the
bits, the layout is rebuilt (the paper's periodic merge of the overflow
into the main bitmap), aside, like every other structure of a merge.

Slots: ``pred_slot[p] >= 0`` is bit ``p`` of its attribute's main slice,
``<= -2`` bit ``-2 - slot`` of its overflow slice, :data:`NULL_SLOT` an
``IS NULL`` (decided by absence).
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
from numba import njit, prange

from gpu_kernels.opcodes import FIRST_LIST_OP, IS_NULL, LAST_LIST_OP, LIKE, MATCHES, NOT_LIKE, NOT_MATCHES, TRUE
from gpu_kernels.predicates import predicate_truth
from gpu_kernels.string_codes import recoded_values

#: the slot of an IS NULL predicate: TRUE where the attribute is absent
NULL_SLOT = -1
#: the largest table (words) an attribute gets; beyond it its slices are evaluated per event entry
TABLE_WORDS = 1 << 20
#: dead + overflow bits beyond this share of all bits: the next merge rebuilds the layout
RECLAIM_SHARE = 0.25
PATTERN_OPS = (LIKE, MATCHES, NOT_LIKE, NOT_MATCHES)
#: operators decided by an entry's token, not by its value -- the patterns (the string's result) and the list
#: operators (the event list's row of the batch's list table): no elementary interval decides them, so an
#: attribute with one is evaluated
TOKEN_OPS = PATTERN_OPS + tuple(range(FIRST_LIST_OP, LAST_LIST_OP + 1))


class BitmapLayout(NamedTuple):
    """Where each predicate's bit lives, and the precomputed rows (see the
    module docstring).  Per attribute ``a``: ``main_bits[a]`` bits (their
    predicates ``bit_pred[bit_off[a]:bit_off[a + 1]]``, -1 for a
    pseudo-deleted bit), ``over_bits[a]`` overflow bits (``obit_pred``
    likewise), and -- when ``tab_off[a] >= 0`` -- its table: ``2 n + 1`` rows
    of ``(main_bits[a] + 63) // 64`` words from ``table[tab_off[a]]`` over
    the ``n`` operands ``bounds[bound_off[a]:bound_off[a + 1]]``."""

    pred_slot: np.ndarray   # int64 [n_rows]
    main_bits: np.ndarray   # int64 [n_attrs]
    over_bits: np.ndarray   # int64 [n_attrs]
    bit_off: np.ndarray     # int64 [n_attrs + 1]
    bit_pred: np.ndarray    # int64
    obit_off: np.ndarray    # int64 [n_attrs + 1]
    obit_pred: np.ndarray   # int64
    tab_off: np.ndarray     # int64 [n_attrs]
    bound_off: np.ndarray   # int64 [n_attrs + 1]
    bounds: np.ndarray      # float64
    table: np.ndarray       # uint64

    @property
    def n_attrs(self) -> int:
        return len(self.main_bits)

    @property
    def dead_bits(self) -> int:
        return int((self.bit_pred < 0).sum() + (self.obit_pred < 0).sum())

    @property
    def nbytes(self) -> int:
        return sum(int(a.nbytes) for a in self)

    def statistics(self) -> dict:
        tabled = self.tab_off >= 0
        return {"bits": int(self.main_bits.sum() + self.over_bits.sum()),
                "overflow_bits": int(self.over_bits.sum()), "dead_bits": self.dead_bits,
                "tabled_attributes": int((tabled & (self.main_bits > 0)).sum()),
                "evaluated_attributes": int((~tabled & (self.main_bits > 0)).sum()),
                "table_bytes": int(self.table.nbytes)}


def words(bits):
    return (bits + 63) >> 6


# ------------------------------------------------------------------ building
def build_layout(rows, n_attrs: int, keep=None) -> BitmapLayout:
    """The layout of predicate ``rows`` (a PredicateRows) over attributes
    ``[0, n_attrs)``, every bit in a main slice.  ``keep`` (bool per row,
    default all): rows without a bit (no subscription uses them)."""
    n = len(rows.op)
    op = np.asarray(rows.op)
    attr = np.asarray(rows.attr, np.int64)
    used = np.ones(n, bool) if keep is None else np.asarray(keep, bool)
    has_bit = used & (op != IS_NULL)
    pred_slot = np.full(n, NULL_SLOT, np.int64)
    # bits: by attribute, then row id (stable)
    with_bit = np.flatnonzero(has_bit)
    order = with_bit[np.argsort(attr[with_bit], kind="stable")]
    main_bits = np.bincount(attr[order], minlength=n_attrs).astype(np.int64)
    bit_off = np.concatenate(([0], np.cumsum(main_bits))).astype(np.int64)
    local = np.arange(len(order)) - bit_off[attr[order]]
    pred_slot[order] = local
    bit_pred = order.astype(np.int64)
    over_bits = np.zeros(n_attrs, np.int64)
    obit_off = np.zeros(n_attrs + 1, np.int64)
    tab_off, bound_off, bounds, table = _tables(rows, bit_off, bit_pred, main_bits)
    return BitmapLayout(pred_slot, main_bits, over_bits, bit_off, bit_pred, obit_off, np.zeros(0, np.int64),
                        tab_off, bound_off, bounds, table)


def _operands(rows, preds: np.ndarray) -> np.ndarray:
    """The distinct operand values of ``preds`` (bounds of their elementary intervals)."""
    lo, hi = rows.lo[preds], rows.hi[preds]
    set_parts = [rows.set_values[rows.set_offsets[p]:rows.set_offsets[p + 1]] for p in preds
                 if rows.set_offsets[p + 1] > rows.set_offsets[p]]
    values = np.concatenate([lo, hi, *set_parts]) if set_parts else np.concatenate([lo, hi])
    return np.unique(values[np.isfinite(values)])


def _tables(rows, bit_off, bit_pred, main_bits):
    """Per attribute, its table when it has no pattern or list predicate
    (:data:`TOKEN_OPS`) and its table fits :data:`TABLE_WORDS` (else ``tab_off`` -1: evaluated)."""
    n_attrs = len(main_bits)
    tab_off = np.full(n_attrs, -1, np.int64)
    bound_parts, counts, sizes = [], np.zeros(n_attrs, np.int64), np.zeros(n_attrs, np.int64)
    op = np.asarray(rows.op)
    for a in np.flatnonzero(main_bits):
        preds = bit_pred[bit_off[a]:bit_off[a + 1]]
        if np.isin(op[preds], TOKEN_OPS).any():
            continue
        b = _operands(rows, preds)
        size = (2 * len(b) + 1) * int(words(main_bits[a]))
        if size > TABLE_WORDS:
            continue
        bound_parts.append(b)
        counts[a] = len(b)
        sizes[a] = size
        tab_off[a] = 0
    tabled = tab_off >= 0
    bound_off = np.concatenate(([0], np.cumsum(counts))).astype(np.int64)
    bounds = np.concatenate(bound_parts) if bound_parts else np.zeros(0, np.float64)
    starts = np.concatenate(([0], np.cumsum(sizes)))[:-1]
    tab_off[tabled] = starts[tabled]
    table = np.zeros(int(sizes.sum()), np.uint64)
    fill_tables(tab_off, bound_off, bounds, bit_off, bit_pred, main_bits, rows.op, rows.lo, rows.hi,
                rows.set_offsets, rows.set_values, table)
    return tab_off, bound_off, bounds, table


@njit(parallel=True, nogil=True, cache=True)
def fill_tables(tab_off, bound_off, bounds, bit_off, bit_pred, main_bits, op, lo, hi, set_offsets, set_values,
                table):
    """Each tabled attribute's rows: every predicate evaluated once at a
    representative of each elementary interval (the point itself, or the
    float64 just above the gap's lower end -- inside the gap whenever the
    gap holds any value)."""
    for a in prange(len(tab_off)):
        if tab_off[a] < 0:
            continue
        b0 = bound_off[a]
        n_b = bound_off[a + 1] - b0
        n_w = (main_bits[a] + 63) >> 6
        for r in range(2 * n_b + 1):
            i = r >> 1
            if r & 1:
                x = bounds[b0 + i]
            elif i == 0:
                x = np.nextafter(bounds[b0], -np.inf) if n_b else 0.0
            else:
                x = np.nextafter(bounds[b0 + i - 1], np.inf)
            base = tab_off[a] + r * n_w
            for j in range(main_bits[a]):
                p = bit_pred[bit_off[a] + j]
                if p < 0:
                    continue
                if predicate_truth(op[p], lo[p], hi[p], set_values, set_offsets[p], set_offsets[p + 1], False,
                                   True, x) == TRUE:
                    table[base + (j >> 6)] |= np.uint64(1) << np.uint64(j & 63)


# --------------------------------------------------------------- maintenance
def recoded_layout(layout: BitmapLayout, string_attr: np.ndarray, code_map: np.ndarray) -> BitmapLayout:
    """``layout`` with its string attributes' bounds in the new codes (the
    table rows unchanged: the bounds keep their order)."""
    n = layout.n_attrs
    per_attr = np.zeros(n, bool)
    per_attr[:min(n, len(string_attr))] = np.asarray(string_attr)[:n] != 0
    bound_string = np.repeat(per_attr, np.diff(layout.bound_off))
    return layout._replace(bounds=recoded_values(layout.bounds, bound_string, code_map))


def _row_keys(rows) -> list:
    """A hashable identity per row (attribute, operator, operands, pattern
    id, IN list): two rows with one key are one predicate."""
    attr, op, lo, hi, aux = (np.asarray(rows.attr).tolist(), np.asarray(rows.op).tolist(),
                             np.asarray(rows.lo).tolist(), np.asarray(rows.hi).tolist(),
                             np.asarray(rows.aux).tolist())
    so, sv = rows.set_offsets, rows.set_values
    keys = []
    for p in range(len(attr)):
        s0, s1 = int(so[p]), int(so[p + 1])
        keys.append((attr[p], op[p], lo[p], hi[p], aux[p], sv[s0:s1].tobytes() if s1 > s0 else b""))
    return keys


def carried_layout(old: BitmapLayout, old_rows, new_rows, n_attrs: int, keep=None) -> BitmapLayout | None:
    """The layout of ``new_rows`` derived from ``old`` (of ``old_rows``, coded
    under the same dictionary): predicates present in both keep their
    bits (and the tables stay as they are), the others' bits are
    pseudo-deleted, new ones go to overflow bits.  None when the result
    would be past :data:`RECLAIM_SHARE` dead or overflow bits (rebuild)."""
    n_new = len(new_rows.op)
    used = np.ones(n_new, bool) if keep is None else np.asarray(keep, bool)
    where = {}
    old_keys = _row_keys(old_rows)
    for p, key in enumerate(old_keys):
        if old.pred_slot[p] != NULL_SLOT or old_rows.op[p] == IS_NULL:
            where.setdefault(key, p)
    pred_slot = np.full(n_new, NULL_SLOT, np.int64)
    old_attrs = old.n_attrs
    n_attrs = max(n_attrs, old_attrs)
    new_keys = _row_keys(new_rows)
    kept_old = set()
    fresh = []
    new_op = np.asarray(new_rows.op)
    for p in range(n_new):
        if not used[p] or new_op[p] == IS_NULL:
            continue
        q = where.get(new_keys[p], -1)
        if q >= 0 and old.pred_slot[q] >= 0:
            pred_slot[p] = old.pred_slot[q]
            kept_old.add(q)
        elif q >= 0 and old.pred_slot[q] <= -2:
            pred_slot[p] = old.pred_slot[q]
            kept_old.add(q)
        else:
            fresh.append(p)
    # old bits now unreferenced: pseudo-deleted; survivors re-pointed at the new row ids
    remap = np.full(len(old_keys), -1, np.int64)
    for p in range(n_new):
        if pred_slot[p] != NULL_SLOT:
            q = where.get(new_keys[p], -1)
            if q >= 0:
                remap[q] = p
    bit_pred = np.where(old.bit_pred >= 0, remap[np.maximum(old.bit_pred, 0)], -1)
    obit_pred = np.where(old.obit_pred >= 0, remap[np.maximum(old.obit_pred, 0)], -1)
    main_bits = np.zeros(n_attrs, np.int64)
    main_bits[:old_attrs] = old.main_bits
    bit_off = np.concatenate(([0], np.cumsum(main_bits))).astype(np.int64)
    over_bits = np.zeros(n_attrs, np.int64)
    over_bits[:old_attrs] = old.over_bits
    # overflow bits appended per attribute
    fresh = np.asarray(fresh, np.int64)
    new_attr = np.asarray(new_rows.attr, np.int64)
    by_attr = fresh[np.argsort(new_attr[fresh], kind="stable")] if len(fresh) else fresh
    old_obit_off = np.concatenate((old.obit_off, np.full(n_attrs - old_attrs, old.obit_off[-1])))
    parts, extra = [], np.bincount(new_attr[by_attr], minlength=n_attrs) if len(by_attr) else np.zeros(n_attrs, int)
    at = 0
    for a in range(n_attrs):
        parts.append(obit_pred[old_obit_off[a]:old_obit_off[a + 1]])
        mine = by_attr[at:at + extra[a]]
        at += extra[a]
        for j, p in enumerate(mine):
            pred_slot[p] = -2 - (over_bits[a] + j)
        parts.append(mine)
        over_bits[a] += extra[a]
    obit_pred = np.concatenate(parts).astype(np.int64) if parts else np.zeros(0, np.int64)
    obit_off = np.concatenate(([0], np.cumsum(over_bits))).astype(np.int64)
    total = int(main_bits.sum() + over_bits.sum())
    dead = int((bit_pred < 0).sum() + (obit_pred < 0).sum())
    if total and (dead + int(over_bits.sum())) > RECLAIM_SHARE * total:
        return None
    tab_off = np.concatenate((old.tab_off, np.full(n_attrs - old_attrs, -1)))
    bound_off = np.concatenate((old.bound_off, np.full(n_attrs - old_attrs, old.bound_off[-1])))
    return BitmapLayout(pred_slot, main_bits, over_bits, bit_off, bit_pred, obit_off, obit_pred,
                        tab_off.astype(np.int64), bound_off.astype(np.int64), old.bounds, old.table)
