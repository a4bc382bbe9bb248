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
- the output arrays are written once, by all cores, in their final place;
- a match call's pieces are copied back by a worker thread
  (:class:`HostResults`) while the caller launches the next chunk's kernels.

BENCHMARKS.md ("CUDA backend (issue 4), second GPU run") has what this
saves on W1's 200 M pairs.

Under numba's CUDA simulator the device arrays are NumPy arrays and the
"copy" of each slice is a plain one; the slicing, double buffering and the
host kernels are the same code, so the simulator tests cover them (with a
tiny ``staging_bytes``).
"""

from __future__ import annotations

import os
import threading

import numba
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
    """Pinned host buffers and a copy stream, made on first use and grown on
    demand -- one set per calling thread (:func:`thread_staging`): two
    callers matching at once must not copy into the buffer the other is
    reading (the buffers were shared before, and a concurrent caller's
    slice could land under another's widening).  A caller's copy-back
    worker (:class:`HostResults`) uses its caller's set: the two never copy
    at once (the caller waits for the worker's piece before it copies one
    itself), and a second set would pin as much memory again."""

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


class _ThreadStaging(threading.local):
    def __init__(self):
        self.staging = _Staging()


_per_thread = _ThreadStaging()


def thread_staging() -> _Staging:
    """The calling thread's staging buffers."""
    return _per_thread.staging

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
    buffer = thread_staging().upload_buffer(total)
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
                      staging_bytes: int | None = None, ready=None, staging: _Staging | None = None) -> None:
    """Copy device ``positions_d`` (int32 or int64) into host int64 ``out``,
    mapped through ``ids`` when given, slice by slice through the pinned
    staging buffers with the next slice's copy in flight while the host
    widens the current one.  The copies wait for ``ready`` (a CuPy event),
    or else for the work already queued on the default stream (the kernels
    that wrote ``positions_d``) -- a copy-back worker passes the event
    recorded when the piece was made, so that it does not also wait for the
    next chunk's kernels queued since.  ``staging``: the buffers to copy
    through (default: the calling thread's)."""
    n = int(positions_d.shape[0])
    if out.shape[0] != n or out.dtype != np.int64:
        raise ValueError(f"out must be int64 of length {n}, got {out.dtype} of length {out.shape[0]}")
    if n == 0:
        return
    dtype = np.dtype(positions_d.dtype)
    step = max(1, (staging_bytes or STAGING_BYTES) // dtype.itemsize)
    buffers, stream = (staging if staging is not None else thread_staging()).get(min(step, n) * dtype.itemsize)
    views = [b[:min(step, n) * dtype.itemsize].view(dtype) for b in buffers]
    use_ids = ids is not None
    table = ids if use_ids else np.zeros(1, np.int64)
    slices = [(a, min(a + step, n)) for a in range(0, n, step)]
    done = [None, None]
    if stream is not None:      # a stream of its own does not wait for the default one unasked
        import cupy
        stream.wait_event(ready if ready is not None else cupy.cuda.Stream.null.record())

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


# ------------------------------------------------------- results of a call
class _Worker(threading.local):
    """This thread's copy-back worker: one thread of its own (made on first
    use), so the pieces of one call are widened in order, one at a time, and
    two callers never share a worker (it copies through its caller's staging
    buffers).  The worker's thread ends when its owner's does (the executor
    is collected with the owner's thread-local state)."""

    def __init__(self):
        self.executor = None
        #: the last piece handed to the worker from this thread (an interrupted call may have left it running)
        self.last = None

    def get(self):
        if self.executor is None:
            from concurrent.futures import ThreadPoolExecutor
            self.executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="bexmatch-copy-back")
        return self.executor

    def reset(self) -> None:
        self.executor = None
        self.last = None


_worker = _Worker()
if hasattr(os, "register_at_fork"):     # a forked child has the executor but not its thread: make another
    os.register_at_fork(after_in_child=_worker.reset)


def _threadsafe_layer() -> bool:
    """Whether numba's threading layer takes parallel kernels from two
    threads at once (``omp``, ``tbb``); ``workqueue`` does not (it aborts the
    process), and then a call's pieces are copied back in its own thread.
    The layer is chosen by the first parallel kernel run: one is run here
    when none has been."""
    try:
        layer = numba.threading_layer()
    except ValueError:
        expand_rows(np.zeros(1, np.int64), np.int64(0), np.empty(0, np.int64))
        layer = numba.threading_layer()
    return layer != "workqueue"


def _ready_event():
    """(the current device, an event on its default stream after the work
    queued so far -- the kernels that wrote a result piece); (None, None)
    under the simulator."""
    if cuda_support.simulated():
        return None, None
    import cupy
    return cupy.cuda.runtime.getDevice(), cupy.cuda.Stream.null.record()


class HostResults:
    """The host (event, position-or-id) pairs of one match call, assembled
    while the device goes on with the next chunk.

    :meth:`add` takes a result piece (its first event, its row ends on the
    host, its positions on the device), reserves its place in the output
    arrays and hands its copy-back (:func:`expand_rows`,
    :func:`positions_to_host`) to this thread's worker, then returns: the
    caller launches the next chunk's kernels while the worker widens this
    piece -- the overlap of host and device work across chunks.  One piece
    is in flight at a time (the next :meth:`add` waits for it), so the
    device holds at most one piece's positions beyond the chunk it works on
    (:attr:`pending_bytes`).  The batch's last piece, with nothing left to
    overlap, is copied in the caller's thread, and so is every piece with
    ``overlap=False`` (as a phase timer wants), under numba's ``workqueue``
    threading layer (which takes parallel kernels from one thread at a time)
    and once the interpreter is shutting down (no new worker tasks then).
    The worker runs with the caller's number of numba threads (numba's
    setting is per thread).

    The output arrays are written once, in place: sized from the pieces'
    density so far (pairs per event, over the batch's events, plus a tenth,
    but never more than every later event matching all ``max_per_event``
    subscriptions) and grown when a piece does not fit (the worker drained
    first, the filled part copied once).  :meth:`result` gives views of the
    filled part (copies when it is less than half)."""

    #: headroom over the projected total when the arrays are sized from the density seen so far
    HEADROOM = 1.1

    def __init__(self, n_events: int, ids: np.ndarray | None = None, *, overlap: bool = True,
                 staging_bytes: int | None = None, max_per_event: int | None = None):
        self.n_events = int(n_events)
        self.ids = ids
        self.overlap = bool(overlap) and _threadsafe_layer()
        self.staging_bytes = staging_bytes
        self.max_per_event = max_per_event
        self.staging = thread_staging()      # the caller's, whichever thread copies a piece
        if _worker.last is not None:
            # a call interrupted while its piece was in flight (Ctrl-C) left the worker copying through these
            # buffers: this call must not copy through them at the same time
            from concurrent.futures import wait
            wait([_worker.last])
            _worker.last = None
        self.rows = np.empty(0, np.int64)
        self.cols = np.empty(0, np.int64)
        self.filled = 0
        self._pending = None
        self._pending_bytes = 0

    @property
    def pending_bytes(self) -> int:
        """Device bytes of the piece still being copied back (0 when none)."""
        return self._pending_bytes if self._pending is not None and not self._pending.done() else 0

    def wait(self) -> None:
        """Until the piece in flight is on the host (its error raised here)."""
        if self._pending is None:
            return
        try:
            self._pending.result()
        finally:
            if self._pending.done():        # (not when the wait itself was interrupted)
                self._pending = None

    def abandon(self) -> None:
        """Wait for the piece in flight, dropping its error (the call is
        failing already); the arrays are no longer written after this
        (unless a second interrupt cuts the wait: the next call in this
        thread then waits for the piece before it touches the buffers)."""
        try:
            self.wait()
        except Exception:       # the caller's own error is the one to raise
            pass

    def add(self, first_row: int, row_ends: np.ndarray, positions_d) -> None:
        """Queue a piece: events ``first_row, first_row + 1, ...`` whose
        pairs end at ``row_ends[1:]`` (ascending from 0), their positions
        ``positions_d`` on the device (int32 or int64).  The caller drops its
        own references to ``positions_d`` (the device memory goes with the
        last one)."""
        n = int(row_ends[-1])
        if n == 0:
            return
        rows_done = first_row + len(row_ends) - 1
        if self.filled + n > len(self.rows):
            self._grow(n, rows_done)
        rows = self.rows[self.filled:self.filled + n]
        cols = self.cols[self.filled:self.filled + n]
        self.filled += n
        # (the positions in a box the task empties: its last reference goes when the copy is done, not
        # when the executor gets round to dropping the task's arguments)
        args = (row_ends, first_row, [positions_d], *_ready_event(), rows, cols, numba.get_num_threads())
        nbytes = int(positions_d.nbytes)
        del positions_d
        self.wait()
        if self.overlap and rows_done < self.n_events:
            try:
                self._pending = _worker.last = _worker.get().submit(self._copy_back, *args)
                self._pending_bytes = nbytes
                return
            except RuntimeError:        # the interpreter is shutting down: no new tasks for a worker
                self.overlap = False
        self._copy_back(*args)

    def _copy_back(self, row_ends, first_row, box, device, ready, rows, cols, n_threads) -> None:
        positions_d = box.pop()
        numba.set_num_threads(n_threads)
        expand_rows(row_ends, np.int64(first_row), rows)
        if device is None:
            positions_to_host(positions_d, cols, self.ids, staging_bytes=self.staging_bytes, staging=self.staging)
            return
        import cupy
        with cupy.cuda.Device(device):       # the caller's device (a worker thread starts on device 0)
            positions_to_host(positions_d, cols, self.ids, staging_bytes=self.staging_bytes, ready=ready,
                              staging=self.staging)

    def _grow(self, n: int, rows_done: int) -> None:
        """Room for ``n`` more pairs, the events before ``rows_done`` seen."""
        self.wait()                 # the worker writes into the arrays being replaced
        need = self.filled + n
        size = need
        if rows_done < self.n_events:
            size = max(int(need / max(rows_done, 1) * self.n_events * self.HEADROOM), int(len(self.rows) * 1.5))
            if self.max_per_event is not None:       # never past every later event matching everything
                size = min(size, need + (self.n_events - rows_done) * self.max_per_event)
            size = max(size, need)
        try:
            rows, cols = np.empty(size, np.int64), np.empty(size, np.int64)
        except MemoryError:         # the projection is too big, not (yet) the pairs: only what they need
            rows, cols = np.empty(need, np.int64), np.empty(need, np.int64)
        rows[:self.filled] = self.rows[:self.filled]
        cols[:self.filled] = self.cols[:self.filled]
        self.rows, self.cols = rows, cols

    def result(self) -> tuple[np.ndarray, np.ndarray]:
        """The pairs, once every piece is on the host: (events, positions or ids), int64
        -- views of the output arrays, or copies when more than half of them
        went unused (a denser start than the rest: the views would hold it)."""
        self.wait()
        if 2 * self.filled < len(self.rows):
            return self.rows[:self.filled].copy(), self.cols[:self.filled].copy()
        return self.rows[:self.filled], self.cols[:self.filled]
