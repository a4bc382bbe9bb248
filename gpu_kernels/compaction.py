"""Result compaction: a dense hit matrix (events × subscriptions of one
chunk) -> (event index, subscription position) pairs, ascending in both;
on the host also the indexes' task slabs -> the answer's two columns
(:func:`pairs_from_runs`), and several parts' answers -> one
(:func:`merge_parts`).
The hit matrix holds one byte per cell (``scan``), or one *bit* per cell
in uint64 words (``opindex`` on cuda, whose threads set hits with an atomic
OR: eight times less memory to clear and read per event, and duplicates --
a subscription found through two conjunctions -- collapse for free).

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
from gpu_kernels.twins import parallel_and_serial


# ------------------------------------------------ two-level position bitmap (cpu)
#: de Bruijn multiplier and table: the index of a lone set bit in one multiply
_DEBRUIJN_MUL = np.uint64(0x03F79D71B4CB0A89)
_DEBRUIJN = np.zeros(64, dtype=np.int64)
for _i in range(64):
    _DEBRUIJN[((1 << _i) * 0x03F79D71B4CB0A89 & 0xFFFFFFFFFFFFFFFF) >> 58] = _i


@njit(inline="always", nogil=True)
def ctz(bit):
    """Index of the single set bit of ``bit`` (de Bruijn)."""
    return _DEBRUIJN[np.int64((bit * _DEBRUIJN_MUL) >> np.uint64(58))]


@njit(nogil=True)
def emit_marked(bm0, bm1, out, at, write):
    """The CPU matchers' per-event output: the positions marked in a
    two-level bitmap (``bm0``: one bit per position; ``bm1``: one bit per
    non-zero word of ``bm0``), ascending, written to ``out[at:]`` when
    ``write``; the bitmap is cleared either way.  Returns the end."""
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
    return at


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


def popcount64_py(y):
    """Set bits of a uint64 (SWAR; ``cuda.popc`` on the device)."""
    y = y - ((y >> np.uint64(1)) & np.uint64(0x5555555555555555))
    y = (y & np.uint64(0x3333333333333333)) + ((y >> np.uint64(2)) & np.uint64(0x3333333333333333))
    y = (y + (y >> np.uint64(4))) & np.uint64(0x0F0F0F0F0F0F0F0F)
    return np.int64((y * np.uint64(0x0101010101010101)) >> np.uint64(56))


popcount64 = njit(inline="always", nogil=True)(popcount64_py)


@njit(inline="always", nogil=True)
def transpose64(a):
    """The 64 x 64 bit matrix ``a`` (64 uint64: bit ``c`` of ``a[r]`` is
    row ``r``, column ``c``) transposed in place: six rounds of masked
    block swaps, halving the block each round (Hacker's Delight, 7-3, with
    the least significant bit as column 0)."""
    j = 32
    m = np.uint64(0x00000000FFFFFFFF)
    while j != 0:
        k = 0
        while k < 64:
            t = ((a[k] >> np.uint64(j)) ^ a[k + j]) & m
            a[k + j] ^= t
            a[k] ^= t << np.uint64(j)
            k = (k + j + 1) & ~j
        j >>= 1
        m ^= m << np.uint64(j)


# ------------------------------------------------ 64 events a group (cpu)
# The batch kernels that take a task's events 64 at a time (A-Tree's sliced
# kernel, PSTHash's lanes) mark their matches as a word a position (``pos_t``:
# bit ``j``, the group's event ``j``) with a bit a 64-position block holding
# one (``pos_words``), and write them out here.
ONE = np.uint64(1)
ZERO = np.uint64(0)
ALL = np.uint64(0xFFFFFFFFFFFFFFFF)      # every lane of a group


@njit(inline="always", nogil=True)
def positions_to_events(pos_t, pos_words, n_lanes, blocks, found):
    """Each 64-position block of ``pos_t`` that holds a match (a word a
    position, a bit an event) transposed into ``blocks[w]`` (a word an
    event, a bit a position), the events' counts added up; ``pos_t`` left
    zero.  A block costs the same whatever its matches, where marking them
    one by one cost each a write into one of 64 bitmaps (W5 at 300 K:
    14 K matches an event, 40 % of the kernel)."""
    for w1 in range(len(pos_words)):
        y1 = pos_words[w1]
        while y1 != 0:
            low = y1 & (~y1 + ONE)
            y1 ^= low
            w = w1 * 64 + popcount64(low - ONE)
            for p in range(64):
                blocks[w, p] = pos_t[w * 64 + p]
                pos_t[w * 64 + p] = ZERO
            transpose64(blocks[w])
            for j in range(n_lanes):
                found[j] += popcount64(blocks[w, j])


@njit(inline="always", nogil=True)
def write_positions(pos_words, n_lanes, blocks, cursor, out):
    """The positions of the first ``n_lanes`` events, ascending, from the
    blocks :func:`positions_to_events` made: event ``j``'s from
    ``out[cursor[j]]`` on; ``pos_words`` left zero."""
    for w1 in range(len(pos_words)):
        y1 = pos_words[w1]
        pos_words[w1] = ZERO
        while y1 != 0:
            low = y1 & (~y1 + ONE)
            y1 ^= low
            w = w1 * 64 + popcount64(low - ONE)
            for j in range(n_lanes):
                row = blocks[w, j]
                at = cursor[j]
                while row != ZERO:
                    lb = row & (~row + ONE)
                    row ^= lb
                    out[at] = w * 64 + popcount64(lb - ONE)
                    at += 1
                cursor[j] = at


@njit(nogil=True)
def group_scratch(n_positions):
    """A task's scratch for :func:`emit_group` over ``n_positions``
    positions: ``pos_t`` and ``pos_words`` zero, the blocks (each read only
    once written), the events' counts zero and their cursors."""
    n_words = max((n_positions + 63) >> 6, 1)
    return (np.zeros(n_words * 64, np.uint64), np.zeros(max((n_words + 63) >> 6, 1), np.uint64),
            np.empty((n_words, 64), np.uint64), np.zeros(64, np.int64), np.empty(64, np.int64))


@njit(inline="always", nogil=True)
def emit_group(pos_t, pos_words, g0, g1, blocks, found, cursor, out, base, used, limit, ev_count, result):
    """The positions of the group of events ``[g0, g1)``, each event's
    ascending, written to a task's slab (the
    :func:`engine.algorithms.host_tasks.match_in_tasks` protocol) for the
    events that fit below ``limit``; ``pos_t`` and ``pos_words`` left zero.
    Returns the slab's new fill, or -1 when an event did not fit
    (``result[0]``: that event, ``result[1]``: its count)."""
    positions_to_events(pos_t, pos_words, g1 - g0, blocks, found)
    n_fit = 0
    while n_fit < g1 - g0 and base + used + found[n_fit] <= limit:
        cursor[n_fit] = base + used
        used += found[n_fit]
        ev_count[g0 + n_fit] = found[n_fit]
        n_fit += 1
    write_positions(pos_words, n_fit, blocks, cursor, out)
    if n_fit < g1 - g0:
        result[0] = g0 + n_fit
        result[1] = found[n_fit]
        return -1
    found[:] = 0
    return used


@njit(parallel=True, nogil=True, cache=True)
def count_bits(bits, n_rows):
    """Twin of :func:`count_hits` over a bit matrix (uint64 words)."""
    counts = np.zeros(n_rows, dtype=np.int64)
    for row in prange(n_rows):
        total = 0
        for w in range(bits.shape[1]):
            total += popcount64(bits[row, w])
        counts[row] = total
    return counts


@njit(parallel=True, nogil=True, cache=True)
def fill_bits(bits, n_rows, row_base, offsets, out_row, out_col):
    """Twin of :func:`fill_hits` over a bit matrix: column ``64 * w + b``
    for bit ``b`` of word ``w``, ascending."""
    for row in prange(n_rows):
        at = offsets[row]
        for w in range(bits.shape[1]):
            y = bits[row, w]
            while y != 0:
                low = y & (~y + np.uint64(1))
                y ^= low
                out_row[at] = row_base + row
                out_col[at] = w * 64 + popcount64(low - np.uint64(1))
                at += 1


def compact_bits(bits: np.ndarray, n_rows: int, row_base: int) -> tuple[np.ndarray, np.ndarray]:
    """(row_base + row, col) for every set bit of ``bits[row]``, row < n_rows."""
    counts = count_bits(bits, n_rows)
    offsets = np.zeros(n_rows + 1, dtype=np.int64)
    np.cumsum(counts, out=offsets[1:])
    out_row = np.empty(offsets[-1], dtype=np.int64)
    out_col = np.empty(offsets[-1], dtype=np.int64)
    fill_bits(bits, n_rows, row_base, offsets, out_row, out_col)
    return out_row, out_col


# ------------------------------------------------------- runs -> pairs (cpu)
def pairs_from_runs_py(slab, runs, src, counts, dest, ids, widen, events_out, values_out):
    """The output pairs of the runs ``runs`` of one slab, in one pass over
    the cores: run ``r`` (an event) holds ``counts[r]`` positions at
    ``slab[src[r]:]`` and goes to ``[dest[r], dest[r] + counts[r])`` of
    ``events_out`` (``r``) and ``values_out`` (the positions widened when
    ``widen``, else ``ids`` at them).  The kernels' slabs go straight to
    the matcher's answer, each match read once and its two columns written
    once (before: a copy to int64, ``np.repeat``, and a gather, each a
    pass of its own, on one core)."""
    for k in prange(len(runs)):
        r = runs[k]
        d = dest[r]
        s = src[r]
        c = counts[r]
        for j in range(c):
            events_out[d + j] = r
        if widen:
            for j in range(c):
                values_out[d + j] = slab[s + j]
        else:
            for j in range(c):
                values_out[d + j] = ids[slab[s + j]]


#: the serial twin for small answers (waking the threads cost 30 µs, a
#: lone event's whole answer then: :data:`PARALLEL_PAIRS`)
pairs_from_runs, pairs_from_runs_serial = parallel_and_serial(pairs_from_runs_py, nogil=True)
#: answers of fewer pairs than this are written on the calling thread
PARALLEL_PAIRS = 1 << 16


# ------------------------------------------- parts' pairs merged by event (cpu)
def merge_part_runs_py(part_ids, part_off, dest, events_out, ids_out):
    """The pairs of several parts (an index's segments; an algorithm's
    indexed and residual subscriptions) as one answer ordered by event then
    id, in one pass over the cores: part ``p``'s ids of event ``e`` are
    ``part_ids[p][part_off[p, e]:part_off[p, e + 1]]`` (concatenated:
    ``part_ids`` one array, ``part_off`` absolute), written to
    ``[dest[e], ...)``.  Each part's run is merged into the runs before it
    from the back, in place (a part's ids ascend within an event when its
    positions are in id order; a run that does not is sorted instead).
    Before: the parts concatenated and ``np.lexsort``-ed, 5x the time of a
    W1 match with ten subscriptions in the delta."""
    n_parts = part_off.shape[0]
    for e in prange(len(dest)):
        d = dest[e]
        n = 0
        ordered = True
        for p in range(n_parts):
            b0 = part_off[p, e]
            b = part_off[p, e + 1] - b0
            for j in range(1, b):
                if part_ids[b0 + j] < part_ids[b0 + j - 1]:
                    ordered = False
            # merge from the back: out[d:d+n] (merged so far) with this run, into out[d:d+n+b]
            i = n - 1
            j = b - 1
            k = n + b - 1
            while j >= 0:
                if i >= 0 and ids_out[d + i] > part_ids[b0 + j]:
                    ids_out[d + k] = ids_out[d + i]
                    i -= 1
                else:
                    ids_out[d + k] = part_ids[b0 + j]
                    j -= 1
                k -= 1
            n += b
        if not ordered:
            ids_out[d:d + n] = np.sort(ids_out[d:d + n])
        for k in range(n):
            events_out[d + k] = e


merge_part_runs, merge_part_runs_serial = parallel_and_serial(merge_part_runs_py, nogil=True)


@njit(parallel=True, nogil=True, cache=True)
def shift_rows(rows, base):
    """``rows += base`` on every core: an event slice's pair rows made the
    whole batch's."""
    for i in prange(len(rows)):
        rows[i] += base


def merge_parts(events: list[np.ndarray], ids: list[np.ndarray], n: int) -> tuple[np.ndarray, np.ndarray]:
    """(event, id) pairs of several parts, each ordered by event (events
    below ``n``), as one answer ordered by event then id
    (:func:`merge_part_runs`)."""
    bounds = np.arange(n + 1, dtype=np.int64)
    part_off = np.empty((len(events), n + 1), np.int64)
    base = 0
    for p, e in enumerate(events):
        part_off[p] = base + np.searchsorted(e, bounds)
        base += len(e)
    counts = (part_off[:, 1:] - part_off[:, :-1]).sum(axis=0)
    dest = np.zeros(n, np.int64)
    if n > 1:
        np.cumsum(counts[:-1], out=dest[1:])
    total = base
    events_out = np.empty(total, np.int64)
    ids_out = np.empty(total, np.int64)
    if total:
        kernel = merge_part_runs if total >= PARALLEL_PAIRS else merge_part_runs_serial
        kernel(np.concatenate([np.asarray(i, np.int64) for i in ids]), part_off, dest, events_out, ids_out)
    return events_out, ids_out


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

    def count_bits_kernel(bits, n_rows, counts):
        n_words = bits.shape[1]
        n_tiles = counts.shape[1]
        tile = (n_words + n_tiles - 1) // n_tiles
        x, y = cuda.grid(2)
        sx, sy = cuda.gridsize(2)
        for row in range(y, n_rows, sy):
            for t in range(x, n_tiles, sx):
                total = 0
                for w in range(t * tile, min(t * tile + tile, n_words)):
                    total += cuda.popc(bits[row, w])
                counts[row, t] = total

    def fill_bits_kernel(bits, n_rows, row_base, offsets, out_row, out_col):
        n_words = bits.shape[1]
        n_tiles = offsets.shape[1]
        tile = (n_words + n_tiles - 1) // n_tiles
        x, y = cuda.grid(2)
        sx, sy = cuda.gridsize(2)
        for row in range(y, n_rows, sy):
            for t in range(x, n_tiles, sx):
                at = offsets[row, t]
                for w in range(t * tile, min(t * tile + tile, n_words)):
                    word = bits[row, w]
                    while word != 0:
                        low = word & (~word + np.uint64(1))
                        word ^= low
                        out_row[at] = row_base + row
                        out_col[at] = w * 64 + cuda.popc(low - np.uint64(1))
                        at += 1

    return (cuda.jit(count_kernel), cuda.jit(fill_kernel), cuda.jit(count_bits_kernel),
            cuda.jit(fill_bits_kernel))


def n_tiles_for(n_cols: int, launch=None, bits: bool = False) -> int:
    """Tiles per hit row under ``launch``'s ``compaction_tile`` width (in
    cells; a bit matrix's ``n_cols`` are words of 64 cells)."""
    tile = (launch or cuda_support.default_launch()).compaction_tile
    if bits:
        tile = max(1, tile // 64)
    return max(1, -(-int(n_cols) // tile))


def _is_bits(hits) -> bool:
    return np.dtype(hits.dtype) == np.uint64


def count_hits_cuda(hits, n_rows, counts, *, launch=None):
    """CUDA twin of :func:`count_hits` (of :func:`count_bits` for a uint64
    bit matrix); a kernel returns nothing, so the counts go to ``counts``
    (device int64 ``[n_rows, n_tiles]``, the tile width being
    ``ceil(n_cols / n_tiles)`` bytes or words)."""
    if n_rows <= 0:
        return
    grid, block = (launch or cuda_support.default_launch()).grid(counts.shape[1], n_rows)
    _compaction_kernels()[2 if _is_bits(hits) else 0][grid, block](hits, np.int64(n_rows), counts)


def fill_hits_cuda(hits, n_rows, row_base, offsets, out_row, out_col, *, launch=None):
    """CUDA twin of :func:`fill_hits` (of :func:`fill_bits` for a bit
    matrix), same arguments; ``offsets`` is the device int64 ``[n_rows,
    n_tiles]`` exclusive prefix sum of the tile counts (row-major)."""
    if n_rows <= 0:
        return
    grid, block = (launch or cuda_support.default_launch()).grid(offsets.shape[1], n_rows)
    _compaction_kernels()[3 if _is_bits(hits) else 1][grid, block](
        hits, np.int64(n_rows), np.int64(row_base), offsets, out_row, out_col)


def hit_offsets_cuda(hits, n_rows: int, *, launch=None):
    """Count pass + exclusive scan on the device: ``(offsets, n_tiles)``
    with ``offsets`` int64 of length ``n_rows * n_tiles + 1``; row ``r``'s
    hits go to ``offsets[r * n_tiles] : offsets[(r + 1) * n_tiles]`` and
    ``offsets[-1]`` is the total.  ``hits``: bytes, or uint64 bit words."""
    xp = cuda_support.array_module()
    n_tiles = n_tiles_for(hits.shape[1], launch, _is_bits(hits))
    counts = xp.empty((max(n_rows, 1), n_tiles), dtype=np.int64)
    count_hits_cuda(hits, n_rows, counts, launch=launch)
    offsets = cuda_support.exclusive_cumsum(counts[:n_rows])
    return offsets, n_tiles


def fill_rows_cuda(hits, first: int, stop: int, row_base: int, offsets, n_tiles: int, *, launch=None,
                   col_dtype=np.int64):
    """Pairs of rows ``[first, stop)`` of ``hits`` (device arrays), given
    :func:`hit_offsets_cuda`'s offsets; rows are reported as ``row_base + row``,
    columns as ``col_dtype`` (int32 halves what a copy to the host moves)."""
    xp = cuda_support.array_module()
    begin = int(offsets[first * n_tiles])
    end = int(offsets[stop * n_tiles])
    out_row = xp.empty(max(end - begin, 1), dtype=np.int64)
    out_col = xp.empty(max(end - begin, 1), dtype=col_dtype)
    if end > begin:
        local = offsets[first * n_tiles: stop * n_tiles].reshape(stop - first, n_tiles)
        if begin:
            local = local - begin
        fill_hits_cuda(hits[first:stop], stop - first, row_base + first, local, out_row, out_col, launch=launch)
    return out_row[:end - begin], out_col[:end - begin]


def compact_hits_cuda(hits, n_rows: int, row_base: int, *, launch=None):
    """CUDA twin of :func:`compact_hits` (and :func:`compact_bits`): count
    kernel, exclusive scan (CuPy; NumPy in the simulator), fill kernel.
    Returns device arrays."""
    offsets, n_tiles = hit_offsets_cuda(hits, n_rows, launch=launch)
    return fill_rows_cuda(hits, 0, n_rows, row_base, offsets, n_tiles, launch=launch)
