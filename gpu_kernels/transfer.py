"""Results from the device to NumPy, at the speed of the bus.

A cuda matcher's results are (event, subscription position) pairs; on W1
(10,000 matches per event) they are 200 M pairs per 20,000 events, and
copying them back as two int64 arrays into fresh pageable memory, then
concatenating, took 98 % of the matcher's time (BENCHMARKS.md, machine G1).
So the copy-back here moves as little as it can and overlaps the rest:

- the event column never crosses the bus: a result piece's rows are
  contiguous runs, so the host rebuilds them from the per-event counts
  (:func:`expand_rows`, parallel over events);
- subscription positions cross as int32 (4 bytes a pair instead of 16),
  through two reusable *pinned* staging buffers: while the host widens one
  slice (:func:`widen_positions` -- optionally mapping positions to the
  caller's subscription ids in the same pass), the DMA engine fills the
  other on a stream of its own;
- the output arrays are written once, by all cores, in their final place.

BENCHMARKS.md ("CUDA backend (issue 4), second GPU run") has what this
saves on W1's 200 M pairs.

Under numba's CUDA simulator the device arrays are NumPy arrays and the
"copy" of each slice is a plain one; the slicing, double buffering and the
host kernels are the same code, so the simulator tests cover them (with a
tiny ``staging_bytes``).
"""

from __future__ import annotations

import threading

import numpy as np
from numba import njit, prange

from gpu_kernels import cuda_support

#: bytes of each of the two pinned staging buffers (allocated once, kept):
#: large enough that a slice's copy (~1 ms at PCIe 5 rates) dwarfs its
#: launch cost, small enough to pin cheaply
STAGING_BYTES = 64 << 20


@njit(parallel=True, nogil=True, cache=True)
def expand_rows(row_ends, row_base, out):
    """``out[row_ends[r]:row_ends[r + 1]] = row_base + r`` for every row
    ``r`` (``row_ends`` ascending from 0)."""
    for r in prange(len(row_ends) - 1):
        for k in range(row_ends[r], row_ends[r + 1]):
            out[k] = row_base + r


@njit(parallel=True, nogil=True, cache=True)
def widen_positions(positions, ids, use_ids, out):
    """``out[i] = ids[positions[i]]`` (``use_ids``) or ``positions[i]``, as int64."""
    for i in prange(len(positions)):
        p = positions[i]
        out[i] = ids[p] if use_ids else p


class _Staging(threading.local):
    """Pinned host buffers and a copy stream, made on first use and grown on
    demand -- one set per thread: two callers matching at once must not
    copy into the buffer the other is reading (the buffers were shared
    before, and a concurrent caller's slice could land under another's
    widening)."""

    def __init__(self):
        self.nbytes = 0
        self.buffers = None
        self.stream = None
        self.upload = None

    def get(self, nbytes: int):
        """The two download buffers (``nbytes`` at least each) and the stream."""
        if self.buffers is None or self.nbytes < nbytes:
            if cuda_support.simulated():
                self.buffers = [np.empty(nbytes, np.uint8) for _ in range(2)]
            else:
                import cupy
                self.buffers = [_pinned(nbytes) for _ in range(2)]
                self.stream = cupy.cuda.Stream(non_blocking=True)
            self.nbytes = nbytes
        return self.buffers, self.stream

    def upload_buffer(self, nbytes: int) -> np.ndarray:
        """The upload buffer, ``nbytes`` at least (grown by doubling)."""
        if self.upload is None or len(self.upload) < nbytes:
            size = max(nbytes, 2 * (0 if self.upload is None else len(self.upload)), 1 << 16)
            self.upload = np.empty(size, np.uint8) if cuda_support.simulated() else _pinned(size)
        return self.upload


def _pinned(nbytes: int) -> np.ndarray:
    import cupyx
    return cupyx.empty_pinned(nbytes, np.uint8)


_staging = _Staging()

#: where each column starts in the upload buffer and on the device: a
#: multiple of this (any dtype's alignment, whole memory transactions)
COLUMN_ALIGN = 256


def columns_to_device(columns) -> list:
    """Host arrays on the device in one copy: each packed into this thread's
    pinned upload buffer (one host pass, at ``COLUMN_ALIGN`` offsets), the
    whole buffer moved by one DMA into one device allocation, each column a
    view of it -- instead of a copy per column from pageable memory, which
    the driver stages through a pinned buffer of its own, chunk by chunk.
    Returns the device arrays (CuPy; under the simulator, its device arrays,
    each copied alone from its packed place).  The copy is complete when
    this returns, so the buffer can take the next batch."""
    columns = [np.ascontiguousarray(c) for c in columns]
    starts, total = [], 0
    for c in columns:
        starts.append(total)
        total += -(-c.nbytes // COLUMN_ALIGN) * COLUMN_ALIGN
    buffer = _staging.upload_buffer(total)
    for c, at in zip(columns, starts):
        buffer[at:at + c.nbytes] = c.reshape(-1).view(np.uint8)
    packed = [buffer[at:at + c.nbytes].view(c.dtype).reshape(c.shape) for c, at in zip(columns, starts)]
    if cuda_support.simulated():
        cuda = cuda_support.load_cuda()
        return [cuda.to_device(view.copy()) for view in packed]
    import cupy
    device = cupy.empty(max(total, 1), np.uint8)
    stream = cupy.cuda.get_current_stream()
    device[:total].set(buffer[:total], stream=stream)
    stream.synchronize()
    return [device[at:at + c.nbytes].view(c.dtype).reshape(c.shape) for c, at in zip(columns, starts)]


def positions_to_host(positions_d, out: np.ndarray, ids: np.ndarray | None = None, *,
                      staging_bytes: int | None = None) -> None:
    """Copy device ``positions_d`` (int32 or int64) into host int64 ``out``,
    mapped through ``ids`` when given, slice by slice through the pinned
    staging buffers with the next slice's copy in flight while the host
    widens the current one.  The copies wait for the work already queued on
    the default stream (the kernels that wrote ``positions_d``)."""
    n = int(positions_d.shape[0])
    if out.shape[0] != n or out.dtype != np.int64:
        raise ValueError(f"out must be int64 of length {n}, got {out.dtype} of length {out.shape[0]}")
    if n == 0:
        return
    dtype = np.dtype(positions_d.dtype)
    step = max(1, (staging_bytes or STAGING_BYTES) // dtype.itemsize)
    buffers, stream = _staging.get(min(step, n) * dtype.itemsize)
    views = [b[:min(step, n) * dtype.itemsize].view(dtype) for b in buffers]
    use_ids = ids is not None
    table = ids if use_ids else np.zeros(1, np.int64)
    slices = [(a, min(a + step, n)) for a in range(0, n, step)]
    done = [None, None]
    if stream is not None:      # a stream of its own does not wait for the default one unasked
        import cupy
        stream.wait_event(cupy.cuda.Stream.null.record())

    def issue(k: int) -> None:
        a, b = slices[k]
        view = views[k % 2][:b - a]
        if stream is None:      # the simulator: device arrays are NumPy arrays
            view[...] = cuda_support.to_host(positions_d[a:b])
        else:
            import cupy
            cupy.asnumpy(positions_d[a:b], stream=stream, out=view, blocking=False)
            done[k % 2] = stream.record()

    issue(0)
    for k, (a, b) in enumerate(slices):
        if k + 1 < len(slices):
            issue(k + 1)          # its buffer's previous slice (k - 1) was widened already
        if done[k % 2] is not None:
            done[k % 2].synchronize()
        widen_positions(views[k % 2][:b - a], table, use_ids, out[a:b])
