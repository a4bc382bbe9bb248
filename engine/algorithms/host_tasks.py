"""Matching a batch on every core: events split into tasks, results gathered.

The CPU kernels of the indexing algorithms (OpIndex, BE-Tree) share one
calling protocol: task ``t`` matches events ``[first[t], last[t])`` on its
own core, writes each event's subscription positions, ascending, to its
slab ``out[t * cap:]`` and their number to ``ev_count[e]``, and stops at
the first event whose positions do not fit (``stop[t]``, with that event's
count in ``need[t]``).  :func:`match_in_tasks` sizes the slabs from a running
estimate of matches per event, launches, resumes the unfinished tasks with
more room, and gathers the slabs into (event, position) pairs ascending by
event then position.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator

import numba
import numpy as np

#: batches of at most this many events run on the calling thread: waking
#: the other threads for a handful of events costs more than the events
SERIAL_EVENTS = 4
#: a batch whose events times subscriptions is at most this runs every
#: kernel (the helpers too: encoding, compaction, the delta's scan) on the
#: calling thread: see :func:`threads_for`.  Not more: one event against
#: 10,000 subscriptions already gains from A-PCM's parallel path traversal
#: (0.69 ms on two cores, 1.1 ms on one, W1 at 10 K on machine C2)
SERIAL_WORK = 4096


@contextlib.contextmanager
def threads_for(n_events: int, n_subs: int) -> Iterator[None]:
    """numba's threads, for this thread, while a batch of ``n_events``
    against ``n_subs`` subscriptions is matched: one when ``n_events *
    n_subs`` is at most :data:`SERIAL_WORK`.

    A parallel kernel ends at a barrier that waits for every worker.  When
    another process holds the other cores, a worker may be off its core for
    a scheduler quantum, and a kernel of microseconds takes milliseconds
    (20 ms a call measured on two busy cores, 5 µs on one thread).  A small
    batch runs a dozen such kernels; matching one event at a time, a service
    would pay that on each.  ``numba.set_num_threads`` is per thread, so
    other threads' matches are not affected.

    Entered once per match, never nested (it first restores a count an
    interrupt left behind: :func:`one_thread`)."""
    owed = getattr(_owed, "count", None)
    if owed is not None:
        numba.set_num_threads(owed)          # (then forgotten: an interrupt in between leaves it owed still)
        _owed.count = None
    if numba.get_num_threads() == 1 or n_events * max(n_subs, 1) > SERIAL_WORK:
        yield
        return
    with one_thread():
        yield


#: arrays shorter than this are sorted on the calling thread (the threads cost more than they save)
PARALLEL_SORT_FROM = 1 << 20


def sort_on_every_core(values: np.ndarray) -> None:
    """Sort a 1-D numeric array in place, a slice per numba thread at
    once (NumPy's sort releases the GIL), then the sorted slices merged by
    NumPy's stable sort, which finds the runs and merges them in linear
    time.  PSTHash's 35 M packed keys of W2 at 1 M: 2.6-2.8 s with
    ``ndarray.sort``, 1.6-1.7 s this way on two cores."""
    threads = numba.get_num_threads()
    if threads == 1 or len(values) < PARALLEL_SORT_FROM:
        values.sort()
        return
    from concurrent.futures import ThreadPoolExecutor

    bounds = np.linspace(0, len(values), threads + 1).astype(np.int64)
    with ThreadPoolExecutor(threads) as pool:
        list(pool.map(lambda k: values[bounds[k]:bounds[k + 1]].sort(), range(threads)))
    values.sort(kind="stable")


#: per thread, the numba thread count :func:`one_thread` is to restore
_owed = threading.local()


@contextlib.contextmanager
def one_thread() -> Iterator[None]:
    """This thread's numba kernels on one thread for the block; the count
    before is restored after it, whatever ends it.  A KeyboardInterrupt
    (Ctrl-C in a notebook) may land between any two bytecodes, also just
    before the ``try`` or inside the ``finally``, and then the restore never
    runs: every later match of the thread ran on one core.  So the count to
    restore is recorded before it is changed and forgotten only once it is
    restored, and :func:`threads_for` restores a recorded one first."""
    previous = numba.get_num_threads()
    if previous == 1:
        yield
        return
    _owed.count = previous
    numba.set_num_threads(1)
    try:
        yield
    finally:
        numba.set_num_threads(previous)
        _owed.count = None


def match_in_tasks(n_events: int, launch, estimate: float, per_task: int = 1) -> tuple[np.ndarray, np.ndarray, float]:
    """``launch(first, last, out, cap, ev_count, stop, need, serial)`` runs
    the kernel (``serial``: one task, on the calling thread); tasks of at
    least ``per_task`` events where there are enough (a kernel that takes
    its events that many at a time), but never fewer tasks than threads
    (an event slice of 24 ran on one core).  Returns (events, positions,
    the updated matches-per-event estimate)."""
    threads = numba.get_num_threads()
    n_tasks = 1 if n_events <= SERIAL_EVENTS or threads == 1 else \
        int(min(n_events, max(threads, min(-(-n_events // per_task), 4 * threads))))
    bounds = np.linspace(0, n_events, n_tasks + 1).round().astype(np.int64)
    first, last = bounds[:-1].copy(), bounds[1:].copy()
    ev_count = np.zeros(n_events, np.int64)
    pieces = []          # (first event, slab, start, length)
    running = estimate
    need = 0
    while len(first):
        span = int((last - first).max())
        cap = int(max(1024, need, min(span * running * 1.25 + 64, 1 << 31)))
        out = np.empty(len(first) * cap, np.int32)
        stop = np.empty(len(first), np.int64)
        task_need = np.empty(len(first), np.int64)
        launch(first, last, out, cap, ev_count, stop, task_need, n_tasks == 1)
        done_events = 0
        done_matches = 0
        for t in range(len(first)):
            n = int(ev_count[first[t]:stop[t]].sum())
            pieces.append((int(first[t]), out, t * cap, n))
            done_events += int(stop[t] - first[t])
            done_matches += n
        unfinished = stop < last
        if done_events:
            running = max(running, done_matches / done_events)
        if unfinished.any():
            running *= 2
            need = int(task_need[unfinished].max()) + 1
        first, last = stop[unfinished], last[unfinished]
    pieces.sort(key=lambda piece: piece[0])
    positions = np.empty(int(ev_count.sum()), np.int64)
    at = 0
    for _, slab, start, n in pieces:
        positions[at:at + n] = slab[start:start + n]
        at += n
    events = np.repeat(np.arange(n_events, dtype=np.int64), ev_count)
    return events, positions, max(1.0, 0.5 * estimate + 0.5 * running)
