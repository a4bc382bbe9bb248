"""Result compaction: a dense hit matrix (events × subscriptions of one
chunk) -> (event index, subscription position) pairs, ascending in both.

Two passes, both parallel over events: count hits per event, then fill each
event's slice of the output at its prefix-sum offset.  Deterministic: the
output order does not depend on thread scheduling.

The CUDA twins split each row further into *tiles* of columns (one thread
per (row, tile), so a row of millions of subscriptions is not one thread's
work): ``counts`` and ``offsets`` are ``[n_rows, n_tiles]``, and the
exclusive prefix sum of the row-major counts gives every tile its output
slice -- the same order as the CPU kernels.  With one tile per row the
arrays are exactly the CPU ones.
"""

from __future__ import annotations

import functools

import numpy as np
from numba import njit, prange

from gpu_kernels import cuda_support


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


# ---------------------------------------------------------------- CUDA twins
cuda = None   # numba.cuda once a CUDA twin is built (a module global: see cuda_support)


@functools.cache
def _compaction_kernels():
    global cuda
    cuda = cuda_support.load_cuda()

    def count_kernel(hits, n_rows, counts):
        n_cols = hits.shape[1]
        n_tiles = counts.shape[1]
        tile = (n_cols + n_tiles - 1) // n_tiles
        x, y = cuda.grid(2)
        sx, sy = cuda.gridsize(2)
        for row in range(y, n_rows, sy):
            for t in range(x, n_tiles, sx):
                total = 0
                for col in range(t * tile, min(t * tile + tile, n_cols)):
                    total += hits[row, col]
                counts[row, t] = total

    def fill_kernel(hits, n_rows, row_base, offsets, out_row, out_col):
        n_cols = hits.shape[1]
        n_tiles = offsets.shape[1]
        tile = (n_cols + n_tiles - 1) // n_tiles
        x, y = cuda.grid(2)
        sx, sy = cuda.gridsize(2)
        for row in range(y, n_rows, sy):
            for t in range(x, n_tiles, sx):
                at = offsets[row, t]
                for col in range(t * tile, min(t * tile + tile, n_cols)):
                    if hits[row, col] != 0:
                        out_row[at] = row_base + row
                        out_col[at] = col
                        at += 1

    return cuda.jit(count_kernel), cuda.jit(fill_kernel)


def n_tiles_for(n_cols: int, launch=None) -> int:
    """Tiles per hit row under ``launch``'s ``compaction_tile`` width."""
    tile = (launch or cuda_support.default_launch()).compaction_tile
    return max(1, -(-int(n_cols) // tile))


def count_hits_cuda(hits, n_rows, counts, *, launch=None):
    """CUDA twin of :func:`count_hits`; a kernel returns nothing, so the
    counts go to ``counts`` (device int64 ``[n_rows, n_tiles]``, the tile
    width being ``ceil(n_cols / n_tiles)``)."""
    if n_rows <= 0:
        return
    grid, block = (launch or cuda_support.default_launch()).grid(counts.shape[1], n_rows)
    _compaction_kernels()[0][grid, block](hits, np.int64(n_rows), counts)


def fill_hits_cuda(hits, n_rows, row_base, offsets, out_row, out_col, *, launch=None):
    """CUDA twin of :func:`fill_hits`, same arguments; ``offsets`` is the
    device int64 ``[n_rows, n_tiles]`` exclusive prefix sum of the tile
    counts (row-major)."""
    if n_rows <= 0:
        return
    grid, block = (launch or cuda_support.default_launch()).grid(offsets.shape[1], n_rows)
    _compaction_kernels()[1][grid, block](hits, np.int64(n_rows), np.int64(row_base), offsets, out_row, out_col)


def hit_offsets_cuda(hits, n_rows: int, *, launch=None):
    """Count pass + exclusive scan on the device: ``(offsets, n_tiles)``
    with ``offsets`` int64 of length ``n_rows * n_tiles + 1``; row ``r``'s
    hits go to ``offsets[r * n_tiles] : offsets[(r + 1) * n_tiles]`` and
    ``offsets[-1]`` is the total."""
    xp = cuda_support.array_module()
    n_tiles = n_tiles_for(hits.shape[1], launch)
    counts = xp.empty((max(n_rows, 1), n_tiles), dtype=np.int64)
    count_hits_cuda(hits, n_rows, counts, launch=launch)
    offsets = cuda_support.exclusive_cumsum(counts[:n_rows])
    return offsets, n_tiles


def fill_rows_cuda(hits, first: int, stop: int, row_base: int, offsets, n_tiles: int, *, launch=None):
    """Pairs of rows ``[first, stop)`` of ``hits`` (device arrays), given
    :func:`hit_offsets_cuda`'s offsets; rows are reported as ``row_base + row``."""
    xp = cuda_support.array_module()
    begin = int(offsets[first * n_tiles])
    end = int(offsets[stop * n_tiles])
    out_row = xp.empty(max(end - begin, 1), dtype=np.int64)
    out_col = xp.empty(max(end - begin, 1), dtype=np.int64)
    if end > begin:
        local = offsets[first * n_tiles: stop * n_tiles].reshape(stop - first, n_tiles)
        if begin:
            local = local - begin
        fill_hits_cuda(hits[first:stop], stop - first, row_base + first, local, out_row, out_col, launch=launch)
    return out_row[:end - begin], out_col[:end - begin]


def compact_hits_cuda(hits, n_rows: int, row_base: int, *, launch=None):
    """CUDA twin of :func:`compact_hits`: count kernel, exclusive scan
    (CuPy; NumPy in the simulator), fill kernel.  Returns device arrays."""
    offsets, n_tiles = hit_offsets_cuda(hits, n_rows, launch=launch)
    return fill_rows_cuda(hits, 0, n_rows, row_base, offsets, n_tiles, launch=launch)
