"""The list predicates' truth of a batch's event lists, on every core.

`engine.events.list_truth` joins each event list (a row: one event's
distinct element keys of one list attribute) with the inverted index of
the operand lists in use for that attribute (`engine.events.ListIndex`:
element keys ascending, each with its operand list).  Per row, the
operand lists some element falls in are *hit*; a list hit by as many
elements as it has is hit by all.  Each hit list ``s`` makes key ``2s``
TRUE ("some element is in s": ONE OF, NONE OF, ``v IN attr``), and
``2s + 1`` when hit by all (ALL OF) -- where a predicate in use wants the
key.

The work is the number of (element, operand list) hits, as the NumPy
version this replaced, but without its global sort of every (row, list)
pair: each thread counts hits in a dense counter over the operand lists,
row after row, and resets only what it touched.  Rows are independent,
so chunks of rows run in parallel; a first pass counts each row's TRUE
keys, a second writes them, ascending, at the row's offset.  The table is
built on the host for both backends.

The module also holds what CPU kernels use to read that table fast: the
*list code* of a list predicate (its key and operator in one number, kept
beside what a kernel scans) and the bitmap of an event list's TRUE keys
(OpIndex: per thread, up to LIST_BITS_ROWS rows an event; A-PCM: one per
entry of a list attribute).
"""

from __future__ import annotations

import numpy as np
from numba import njit, prange

from gpu_kernels.opcodes import ALL_OF, FIRST_LIST_OP, LAST_LIST_OP, NOT_ALL_OF

#: a list operator's *list code*: its list key << LIST_CODE_SHIFT | the operator
LIST_CODE_SHIFT = 5
LIST_CODE_MASK = (1 << LIST_CODE_SHIFT) - 1


def list_codes(op: np.ndarray, aux: np.ndarray) -> np.ndarray:
    """Per predicate: its list code, as float64 (exact below 2**53) -- for
    a list operator its list key (:func:`gpu_kernels.predicates.list_key_py`:
    the operand list's id twice, plus one for ALL OF; 0 for IS [NOT]
    EMPTY) shifted left by LIST_CODE_SHIFT, or'ed with the operator: > 0;
    0 for any other operator.
    Kept beside what a kernel scans (OpIndex's VERIFY entries, A-PCM's
    bits), it decides a list predicate without reading its predicate row,
    a cache miss per array."""
    op = np.asarray(op).astype(np.int64)
    aux = np.asarray(aux).astype(np.int64)
    is_list = (op >= FIRST_LIST_OP) & (op <= LAST_LIST_OP)
    # (IS [NOT] EMPTY has no operand list, aux -1: key 0, which its truth ignores)
    key = np.where(aux >= 0, 2 * aux + ((op == ALL_OF) | (op == NOT_ALL_OF)), 0)
    return np.where(is_list, (key << LIST_CODE_SHIFT) | op, 0).astype(np.float64)


@njit(inline="always", nogil=True)
def _chunk_keys(first, last, row_offsets, list_keys, rows, keys, owner, length, wanted, per_row, starts, out,
                write):
    """Rows ``rows[first:last]``, one after the other: each element's run of
    equal index keys counted per operand list in a dense counter, then the
    touched lists' TRUE keys, ascending (2s before 2s + 1) -- counted into
    ``per_row`` or, with ``write``, written at ``out[starts[i]:]`` -- and
    the counter reset where it was touched."""
    count = np.zeros(len(length), dtype=np.int64)
    touched = np.empty(len(length), dtype=np.int64)
    for i in range(first, last):
        r = rows[i]
        n = 0
        for j in range(row_offsets[r], row_offsets[r + 1]):
            k = np.searchsorted(keys, list_keys[j])
            while k < len(keys) and keys[k] == list_keys[j]:
                s = owner[k]
                if count[s] == 0:
                    touched[n] = s
                    n += 1
                count[s] += 1
                k += 1
        touched[:n].sort()
        m = 0
        for t in range(n):
            s = touched[t]
            for key in (2 * s, 2 * s + 1):
                if wanted[key] and (key == 2 * s or count[s] == length[s]):
                    if write:
                        out[starts[i] + m] = key
                    m += 1
            count[s] = 0
        if not write:
            per_row[i] = m


@njit(parallel=True, cache=True, nogil=True)
def list_hits(row_offsets, list_keys, rows, keys, owner, length, wanted, n_chunks):
    """TRUE keys of the event lists ``rows`` (batch rows, ascending) against
    one attribute's inverted index (``keys`` ascending, ``owner`` the list of
    each, ``length`` per list, ``wanted`` per key: a predicate uses it).
    Returns (TRUE keys per row of ``rows``, the keys row after row, each
    row's ascending).  Two passes over chunks of rows: count, then write at
    the prefix sums."""
    n_rows = len(rows)
    per_row = np.zeros(n_rows, dtype=np.int64)
    starts = np.zeros(n_rows + 1, dtype=np.int64)
    n_chunks = max(1, min(n_chunks, n_rows))
    out = np.empty(0, dtype=np.int64)
    for c in prange(n_chunks):
        _chunk_keys(c * n_rows // n_chunks, (c + 1) * n_rows // n_chunks, row_offsets, list_keys, rows, keys, owner,
                    length, wanted, per_row, starts, out, False)
    for i in range(n_rows):
        starts[i + 1] = starts[i] + per_row[i]
    out = np.empty(starts[n_rows], dtype=np.int64)
    for c in prange(n_chunks):
        _chunk_keys(c * n_rows // n_chunks, (c + 1) * n_rows // n_chunks, row_offsets, list_keys, rows, keys, owner,
                    length, wanted, per_row, starts, out, True)
    return per_row, out


# --------------------------------------------------------------------------
# matching: a thread's bitmaps of its event's list rows
#
# A kernel that verifies many list predicates against one event list (the
# OpIndex VERIFY runs of a list attribute: thousands an event on W7) would
# binary-search the row's TRUE keys for each -- a dozen dependent, branchy
# loads.  Instead the first test of a row sets its TRUE keys' bits in a
# thread-local bitmap (``bits[r]``, row ``rows[r]``, up to LIST_BITS_ROWS
# rows an event; rows beyond are searched), every test is then one bit,
# and the event's end clears the bits it set.  The test itself is written
# out in the kernel's hot loop (gpu_kernels.opindex.cpu.match_task), as
# the rest of that loop is: the same test in a helper taking the arrays
# made the W7 kernel 1.7x slower (2.48 s against 1.44 s, BENCHMARKS.md),
# the reference counting numba keeps around such calls being the likely
# cost.
# --------------------------------------------------------------------------

#: event lists (rows) of one event given a bitmap; further rows are searched
LIST_BITS_ROWS = 4


def list_bits_words(list_truth: np.ndarray) -> int:
    """64-bit words of a bitmap over every TRUE key of ``list_truth``
    (packed CSR: ``n_rows + 1`` offsets, then the keys); 0 when none."""
    n_rows = int(list_truth[0]) - 1 if len(list_truth) else 0
    keys = list_truth[n_rows + 1:]
    return int(keys.max()) // 64 + 1 if len(keys) else 0


@njit(inline="always", nogil=True)
def clear_list_bits(list_truth, bits, rows, n_cached):
    """Clear the bits the event's cached rows set (the bitmaps stay zero
    between events: clearing costs what setting did, not the bitmap's size)."""
    for r in range(n_cached):
        row = rows[r]
        for k in range(list_truth[row], list_truth[row + 1]):
            bits[r, list_truth[k] >> 6] = np.uint64(0)
