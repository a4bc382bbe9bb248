"""Result compaction: a dense hit matrix (events × subscriptions of one
chunk) -> (event index, subscription position) pairs, ascending in both.

Two passes, both parallel over events: count hits per event, then fill each
event's slice of the output at its prefix-sum offset.  Deterministic: the
output order does not depend on thread scheduling.
"""

from __future__ import annotations

import numpy as np
from numba import njit, prange


@njit(parallel=True, nogil=True, cache=True)
def count_hits(hits, n_rows):
    counts = np.zeros(n_rows, dtype=np.int64)
    n_cols = hits.shape[1]
    for row in prange(n_rows):
        total = 0
        for col in range(n_cols):
            total += hits[row, col]
        counts[row] = total
    return counts


@njit(parallel=True, nogil=True, cache=True)
def fill_hits(hits, n_rows, row_base, offsets, out_row, out_col):
    n_cols = hits.shape[1]
    for row in prange(n_rows):
        at = offsets[row]
        for col in range(n_cols):
            if hits[row, col]:
                out_row[at] = row_base + row
                out_col[at] = col
                at += 1


#: below this many cells a serial np.nonzero beats starting parallel threads
PARALLEL_CELLS = 1 << 20


def compact_hits(hits: np.ndarray, n_rows: int, row_base: int) -> tuple[np.ndarray, np.ndarray]:
    """(row_base + row, col) for every nonzero ``hits[row, col]``, row < n_rows."""
    if n_rows * hits.shape[1] < PARALLEL_CELLS:
        rows, cols = np.nonzero(hits[:n_rows])   # row-major: the same order as the kernels
        return rows.astype(np.int64) + row_base, cols.astype(np.int64)
    counts = count_hits(hits, n_rows)
    offsets = np.zeros(n_rows + 1, dtype=np.int64)
    np.cumsum(counts, out=offsets[1:])
    out_row = np.empty(offsets[-1], dtype=np.int64)
    out_col = np.empty(offsets[-1], dtype=np.int64)
    fill_hits(hits, n_rows, row_base, offsets, out_row, out_col)
    return out_row, out_col
