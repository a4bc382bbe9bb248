"""A streaming front for a service that matches events one at a time.

Matching a batch costs far less per event than matching events alone (the
kernels amortise the index traversal, and A-PCM compresses similar events
of a batch together), but a service receives events one by one.
:class:`EventStream` sits between the two: callers, from any number of
threads, :meth:`~EventStream.submit` single events and get a
:class:`concurrent.futures.Future` each; one background thread gathers the
events into batches for :meth:`engine.Index.match_batch` and resolves every
future with that event's matches::

    from engine.streaming import EventStream

    with EventStream(index, batch_size=1024, max_wait=0.005) as stream:
        future = stream.submit({"price": 550, "color": "silver"})
        ids = future.result()          # ascending int64 numpy array, as index.match gives

A batch is matched as soon as one of these holds:

* it is full: ``batch_size`` events are waiting;
* its oldest event has waited ``max_wait`` seconds (so a lone event waits
  at most about ``max_wait`` plus its matching) -- ``0`` matches whatever
  has gathered as soon as the thread is free, ``None`` waits for a full
  batch (or :meth:`~EventStream.flush`);
* :meth:`~EventStream.flush` or :meth:`~EventStream.close` is called.

One batch is matched at a time; events submitted meanwhile gather for the
next, so under load the batches fill up by themselves.  What this costs in
latency at a given event rate is what ``bexmatch bench --arrival-delays``
measures (:mod:`engine.bench.latency`).

Each batch is matched against one snapshot of the index
(:meth:`engine.index.Index.pinned`), its events matched alone too when they
are: updates made while the stream runs are seen by the batches that start
after them.  The stream needs nothing of the index but
``match_batch(events, errors=...)`` (and ``pinned()`` where it has one),
so it works with every algorithm and backend.

Errors reach the futures, never the thread: an event the index refuses (a
value of the wrong type, not a mapping: :class:`engine.errors.BadEventError`)
fails its own future only, with the error it raises matched alone
(``index.match_batch([event])``: "event 0", not its place in a batch); if
``match_batch`` raises anything else, the batch's events are matched one by
one so that only the events that fail get the exception.  Nothing submitted
is dropped: :meth:`~EventStream.close` (or leaving the ``with`` block)
matches every waiting event before the thread ends.  A cancelled future's
event is skipped.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections import deque
from collections.abc import Mapping
from concurrent.futures import Future, InvalidStateError
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from engine.forks import renew_after_fork

if TYPE_CHECKING:
    from engine.index import Index

logger = logging.getLogger(__name__)

#: why a batch was matched (the keys of :meth:`EventStream.stats`)
REASONS = ("size", "time", "flush", "close")


@dataclass
class _Waiting:
    event: object
    future: Future
    arrived: float      # time.monotonic() at submit
    number: int         # 1-based position in the stream


#: what a copy of a stream in a forked child says
_FORKED = ("this EventStream was made before a fork and its matching thread stayed in the parent process: "
           "make a new EventStream in this process")


class EventStream:
    """Batches events submitted one at a time for ``index.match_batch``
    (the module docstring says when a batch goes and what errors do).

    Parameters
    ----------
    index : an :class:`engine.Index` (anything with ``match_batch(events,
        errors=...)`` returning one id array per event).
    batch_size : the most events matched in one call; a full batch goes at once.
    max_wait : seconds the oldest waiting event may wait before its batch
        goes however small; ``0``: at once; ``None``: no limit.
    errors : ``"raise"``: a bad event's future raises its
        :class:`~engine.errors.BadEventError`; ``"null"``: its bad values are
        taken as absent (``match_batch(errors="null")``).
    name : the background thread's name.
    """

    def __init__(self, index: Index, batch_size: int = 1024, max_wait: float | None = 0.005, *, errors: str = "raise",
                 name: str = "bexmatch-event-stream"):
        if not callable(getattr(index, "match_batch", None)):
            raise TypeError(f"EventStream matches through an Index (anything with match_batch), "
                            f"not {type(index).__name__} {index!r}")
        if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
            raise ValueError(f"batch_size must be an int >= 1, not {batch_size!r}")
        if max_wait is not None and (isinstance(max_wait, bool) or not isinstance(max_wait, (int, float))
                                     or not math.isfinite(max_wait) or max_wait < 0):
            raise ValueError(f"max_wait must be None or a number of seconds >= 0, not {max_wait!r}")
        if errors not in ("raise", "null"):
            raise ValueError(f"errors must be 'raise' or 'null', not {errors!r}")
        self.index = index
        self.batch_size = batch_size
        self.max_wait = None if max_wait is None else float(max_wait)
        self.errors = errors
        # guards everything below; notified when a first or a batch_size-th
        # event waits, when flush() or close() asks, and when a batch is done
        self._lock = threading.Condition()
        self._waiting: deque[_Waiting] = deque()
        self._submitted = 0         # events submitted so far
        self._finished = 0          # of them, resolved (always a prefix of the stream: batches go in order)
        self._flush_to = 0          # flush() asked for every event up to this number to go at once
        self._closed = False
        self._forked = False        # a copy in a forked child, whose thread stayed in the parent
        self._stats = dict.fromkeys(REASONS, 0) | {"events": 0, "batches": 0}
        # a daemon, so that a stream nobody closed does not keep the interpreter alive
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()
        renew_after_fork(self, EventStream._after_fork)

    def _after_fork(self) -> None:
        """In a forked child, refuse work with a clear error: the thread did
        not come over, so an event submitted (or flushed) there would wait
        for ever; the lock, maybe held at the fork, is made anew."""
        self._lock = threading.Condition()
        self._forked = self._closed = True

    # ------------------------------------------------------------ callers
    def submit(self, event: Mapping[str, Any]) -> Future:
        """Queue ``event`` (a dict of attribute values) for matching: a
        Future of its matches, an ascending int64 array of subscription
        ids.  RuntimeError once the stream is closed."""
        future = Future()
        with self._lock:
            if self._forked:
                raise RuntimeError(_FORKED)
            if self._closed:
                raise RuntimeError("submit to a closed EventStream")
            self._submitted += 1
            self._waiting.append(_Waiting(event, future, time.monotonic(), self._submitted))
            # the first waiting event starts the max_wait clock; a full batch is due at once
            if len(self._waiting) == 1 or len(self._waiting) >= self.batch_size:
                self._lock.notify_all()
        return future

    def flush(self) -> None:
        """Match every event submitted so far without waiting for its batch
        to fill, and return once all of them are resolved.  (Called from
        the stream's own thread -- a future's done-callback -- it only asks,
        as waiting there would wait for itself.)"""
        with self._lock:
            if self._forked and self._finished < self._submitted:
                raise RuntimeError(_FORKED)          # (nothing would ever resolve them here)
            target = self._submitted
            self._flush_to = max(self._flush_to, target)
            self._lock.notify_all()
            if threading.current_thread() is not self._thread:
                self._lock.wait_for(lambda: self._finished >= target)

    def close(self, wait: bool = True) -> None:
        """Refuse further events, match every waiting one, and (``wait``)
        return once all are resolved and the thread has ended.  Calling it
        again does nothing more."""
        with self._lock:
            self._closed = True
            self._lock.notify_all()
        if wait and threading.current_thread() is not self._thread:
            self._thread.join()

    def __enter__(self) -> "EventStream":
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()

    @property
    def closed(self) -> bool:
        return self._closed

    def pending(self) -> int:
        """Events submitted and not yet resolved."""
        with self._lock:
            return self._submitted - self._finished

    def stats(self) -> dict:
        """Counts so far: ``events`` and ``batches`` matched (an event
        cancelled before its batch went is not; nor a batch of only such
        events), and batches by why they went: ``size`` (full), ``time``
        (``max_wait``), ``flush``, ``close``."""
        with self._lock:
            return dict(self._stats)

    def __repr__(self) -> str:
        state = "closed" if self._closed else "open"
        return (f"EventStream({state}, batch_size={self.batch_size}, max_wait={self.max_wait}, "
                f"pending={self.pending()})")

    # ------------------------------------------------------------- thread
    def _due(self, now: float) -> str | None:
        """Why the waiting events should go now, or None (lock held)."""
        if not self._waiting:
            return None
        if len(self._waiting) >= self.batch_size:
            return "size"
        if self._closed:
            return "close"
        if self._flush_to >= self._waiting[0].number:
            return "flush"
        if self.max_wait is not None and now - self._waiting[0].arrived >= self.max_wait:
            return "time"
        return None

    def _next_batch(self) -> tuple[list[_Waiting], str] | None:
        """Wait until a batch is due and take it; None once closed and drained."""
        with self._lock:
            while True:
                now = time.monotonic()
                reason = self._due(now)
                if reason is not None:
                    count = min(self.batch_size, len(self._waiting))
                    return [self._waiting.popleft() for _ in range(count)], reason
                if self._closed:
                    return None
                timeout = None
                if self._waiting and self.max_wait is not None:
                    # (a wait longer than the platform's longest raises OverflowError: capped, and woken again)
                    timeout = min(self._waiting[0].arrived + self.max_wait - now, threading.TIMEOUT_MAX)
                self._lock.wait(timeout)

    def _run(self) -> None:
        batch: list[_Waiting] = []
        try:
            while (taken := self._next_batch()) is not None:
                batch, reason = taken
                matched = self._match(batch)
                with self._lock:
                    self._finished += len(batch)
                    if matched:             # (a batch whose events were all cancelled was not matched)
                        self._stats[reason] += 1
                        self._stats["batches"] += 1
                        self._stats["events"] += matched
                    self._lock.notify_all()         # flush() waits on _finished
        except BaseException as exc:                # a bug here must not leave futures waiting forever
            logger.exception("EventStream thread failed; failing the events still waiting")
            with self._lock:
                self._closed = True
                left, self._waiting = list(self._waiting), deque()
                self._finished = self._submitted
                self._lock.notify_all()
            failure = RuntimeError(f"the EventStream thread failed: {exc!r}")
            # the batch in flight (those not resolved yet: they are running), then those waiting; a callback
            # that raises again must not stop the others being failed
            for waiting in batch + [w for w in left if _claim(w.future)]:
                try:
                    _resolve(waiting.future, error=failure)
                except BaseException:       # noqa: BLE001 -- a caller's done-callback
                    logger.exception("a done-callback raised while the EventStream failed its events")

    def _match(self, batch: list[_Waiting]) -> int:
        """Resolve the futures of ``batch`` (cancelled ones skipped); the
        number of events matched."""
        live = [w for w in batch if _claim(w.future)]
        if not live:
            return 0
        events = [w.event for w in live]
        # one state for the batch and for its events matched alone (an update between them must not show)
        index = self.index.pinned() if callable(getattr(self.index, "pinned", None)) else self.index
        try:
            if self.errors == "raise":
                found, rejected = index.match_batch(events, errors="report")
            else:
                found, rejected = index.match_batch(events, errors="null"), ()
            if len(found) != len(live):
                raise RuntimeError(f"match_batch returned {len(found)} answers for {len(live)} events")
        except Exception as exc:
            logger.warning("match_batch failed on a batch of %d events (%r): matching them one at a time",
                           len(live), exc)
            for waiting in live:
                self._match_alone(index, waiting)
            return len(live)
        refused = {error.event for error in rejected}
        logger.debug("matched a batch of %d events (%d refused)", len(live), len(refused))
        for position, (waiting, ids) in enumerate(zip(live, found)):
            if position in refused:
                # matched alone it raises its error as index.match would,
                # naming it event 0 rather than its place in this batch
                self._match_alone(index, waiting)
            else:
                _resolve(waiting.future, ids)
        return len(live)

    def _match_alone(self, index, waiting: _Waiting) -> None:
        try:
            ids = index.match_batch([waiting.event], errors=self.errors)[0]
        except Exception as exc:
            _resolve(waiting.future, error=exc)
        else:
            _resolve(waiting.future, ids)


def _claim(future: Future) -> bool:
    """Mark ``future`` running: False when it was cancelled, or resolved by
    its caller (nothing for the stream to do then)."""
    try:
        return future.set_running_or_notify_cancel()
    except RuntimeError:            # already finished: its caller set it
        return False


def _resolve(future: Future, result=None, error: BaseException | None = None) -> None:
    """Set ``future``'s result or exception, unless its caller set one
    first.  An exception a done-callback raises past Future (a
    BaseException) reaches the stream's thread, which fails the rest."""
    try:
        if error is not None:
            future.set_exception(error)
        else:
            future.set_result(result)
    except InvalidStateError:
        pass
