"""Matching a batch on every core: events split into tasks, results gathered.

The CPU kernels of the indexing algorithms (OpIndex, BE-Tree) share one
calling protocol: task ``t`` matches events ``[first[t], last[t])`` on its
own core, writes each event's subscription positions, ascending, to its
slab ``out[t * cap:]`` and their number to ``ev_count[e]``, and stops at
the first event whose positions do not fit (``stop[t]``, with that event's
count in ``need[t]``).  :func:`match_in_tasks` sizes the slabs from a running
estimate of matches per event, launches, resumes the unfinished tasks with
more room, and returns the matches where the slabs hold them (:class:`Runs`),
which :meth:`Runs.pairs` turns into (event, position or id) pairs ascending
by event then position, in one pass over every core.
"""

from __future__ import annotations

import contextlib
import dataclasses
import threading
from collections.abc import Iterator

import numba
import numpy as np

from gpu_kernels.compaction import PARALLEL_PAIRS, pairs_from_runs, pairs_from_runs_serial

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
    time.  The slices are sorted by the stable sort too (timsort for
    int64): it merges the ascending runs that are already there.  PSTHash's
    35 M packed keys of W2 at 1 M come in ascending runs of 70 on average,
    and one thread sorts them in 1.7-2.6 s so, 4.8-6.3 s with the default
    sort; on random keys the two take about the same time (BENCHMARKS.md,
    "Session 43")."""
    threads = numba.get_num_threads()
    if threads == 1 or len(values) < PARALLEL_SORT_FROM:
        values.sort(kind="stable")
        return
    from concurrent.futures import ThreadPoolExecutor

    bounds = np.linspace(0, len(values), threads + 1).astype(np.int64)
    with ThreadPoolExecutor(threads) as pool:
        list(pool.map(lambda k: values[bounds[k]:bounds[k + 1]].sort(kind="stable"), range(threads)))
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


@dataclasses.dataclass(frozen=True)
class Runs:
    """A batch's matches where the kernels left them: event ``e``'s
    ``counts[e]`` subscription positions, ascending, at
    ``slabs[slab_of[e]][src[e]:]``.  :meth:`pairs` turns them into the
    matcher's answer in one parallel pass (:func:`pairs_from_runs`), with
    the ids in place of the positions when they are given."""

    counts: np.ndarray          # int64, one per event
    src: np.ndarray             # int64, one per event
    slab_of: np.ndarray         # int64, one per event
    slabs: tuple[np.ndarray, ...]

    @classmethod
    def empty(cls, n_events: int) -> "Runs":
        zeros = np.zeros(n_events, np.int64)
        return cls(zeros, zeros, zeros, (np.zeros(0, np.int64),))

    @classmethod
    def of_pairs(cls, events: np.ndarray, positions: np.ndarray, n_events: int) -> "Runs":
        """The runs of (event, position) pairs ascending by event."""
        counts = np.bincount(events, minlength=n_events).astype(np.int64) if len(events) else \
            np.zeros(n_events, np.int64)
        return cls(counts, _starts(counts), np.zeros(n_events, np.int64), (positions,))

    @property
    def n_matches(self) -> int:
        return int(self.counts.sum())

    def permuted(self, perm: np.ndarray) -> "Runs":
        """The same runs when run ``i`` of these is event ``perm[i]`` (A-PCM
        lists its events cluster by cluster)."""
        moved = []
        for a in (self.counts, self.src, self.slab_of):
            b = np.empty_like(a)
            b[perm] = a
            moved.append(b)
        return Runs(*moved, self.slabs)

    def pairs(self, ids: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
        """(event index, position -- or ``ids`` at it) int64 pairs,
        ascending by event then position."""
        dest = _starts(self.counts)
        total = int(dest[-1] + self.counts[-1]) if len(self.counts) else 0
        events = np.empty(total, np.int64)
        values = np.empty(total, np.int64)
        if total == 0:
            return events, values
        widen = ids is None
        ids = np.zeros(0, np.int64) if widen else np.ascontiguousarray(ids, np.int64)
        n = len(self.counts)
        kernel = pairs_from_runs if total >= PARALLEL_PAIRS else pairs_from_runs_serial
        for k, slab in enumerate(self.slabs):
            runs = np.arange(n, dtype=np.int64) if len(self.slabs) == 1 else np.flatnonzero(self.slab_of == k)
            kernel(slab, runs, self.src, self.counts, dest, ids, widen, events, values)
        return events, values


def _starts(counts: np.ndarray) -> np.ndarray:
    """Exclusive prefix sums of ``counts`` (int64)."""
    starts = np.zeros(len(counts), np.int64)
    if len(counts) > 1:
        np.cumsum(counts[:-1], out=starts[1:])
    return starts


def match_in_tasks(n_units: int, launch, estimate: float, per_task: int = 1, members: np.ndarray | None = None,
                   member_counts: np.ndarray | None = None) -> tuple[Runs, float]:
    """``launch(first, last, out, cap, unit_count, stop, need, serial)``
    runs the kernel over units (events; A-PCM: clusters) ``[first[t],
    last[t])`` (``serial``: one task, on the calling thread); tasks of at
    least ``per_task`` units where there are enough (a kernel that takes
    its events that many at a time), but never fewer tasks than threads
    (an event slice of 24 ran on one core).  Returns the matches as
    :class:`Runs` (where the kernel left them: no copy) and the updated
    matches-per-unit estimate.  ``members``, ``member_counts``: a unit is
    the events ``[members[u], members[u + 1])`` of the runs, each with its
    count in ``member_counts`` (filled by the kernel), its matches after
    those of the one before it."""
    threads = numba.get_num_threads()
    n_tasks = 1 if n_units <= SERIAL_EVENTS or threads == 1 else \
        int(min(n_units, max(threads, min(-(-n_units // per_task), 4 * threads))))
    if n_tasks == 1:        # (np.linspace alone costs a single event 10 µs)
        first, last = np.zeros(1, np.int64), np.full(1, n_units, np.int64)
    else:
        bounds = np.linspace(0, n_units, n_tasks + 1).round().astype(np.int64)
        first, last = bounds[:-1].copy(), bounds[1:].copy()
    unit_count = np.zeros(n_units, np.int64)
    pieces = []          # (first unit, stop unit, slab number, start in the slab)
    slabs = []
    running = estimate
    need = 0
    while len(first):
        span = int((last - first).max())
        cap = int(max(1024, need, min(span * running * 1.25 + 64, 1 << 31)))
        out = np.empty(len(first) * cap, np.int32)
        stop = np.empty(len(first), np.int64)
        task_need = np.empty(len(first), np.int64)
        launch(first, last, out, cap, unit_count, stop, task_need, n_tasks == 1)
        slabs.append(out)
        done_units = 0
        done_matches = 0
        for t in range(len(first)):
            if stop[t] > first[t]:
                pieces.append((int(first[t]), int(stop[t]), len(slabs) - 1, t * cap))
                done_units += int(stop[t] - first[t])
                done_matches += int(unit_count[first[t]:stop[t]].sum())
        if done_units:
            running = max(running, done_matches / done_units)
        unfinished = stop < last
        if unfinished.any():
            running *= 2
            need = int(task_need[unfinished].max()) + 1
        first, last = stop[unfinished], last[unfinished]
    if members is None:
        members, member_counts = np.arange(n_units + 1, dtype=np.int64), unit_count
    counts = np.asarray(member_counts, np.int64)
    before = _starts(counts)
    src = np.zeros(len(counts), np.int64)
    slab_of = np.zeros(len(counts), np.int64)
    for f, s, k, start in pieces:
        m0, m1 = int(members[f]), int(members[s])
        src[m0:m1] = start + before[m0:m1] - before[m0]
        slab_of[m0:m1] = k
    return Runs(counts, src, slab_of, tuple(slabs)), max(1.0, 0.5 * estimate + 0.5 * running)
