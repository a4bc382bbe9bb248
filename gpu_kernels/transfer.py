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


class _Staging:
    """The two pinned host buffers and the copy stream, made on first use."""

    def __init__(self):
        self.nbytes = 0
        self.buffers = None
        self.stream = None

    def get(self, nbytes: int):
        if self.buffers is None or self.nbytes < nbytes:
            if cuda_support.simulated():
                self.buffers = [np.empty(nbytes, np.uint8) for _ in range(2)]
            else:
                import cupy
                import cupyx
                self.buffers = [cupyx.empty_pinned(nbytes, np.uint8) for _ in range(2)]
                self.stream = cupy.cuda.Stream(non_blocking=True)
            self.nbytes = nbytes
        return self.buffers, self.stream


_staging = _Staging()


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
