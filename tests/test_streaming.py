"""engine.streaming.EventStream: events submitted one at a time, matched
in batches by a background thread -- the same answers as ``index.match``,
batches that go when full, when their oldest event has waited
``max_wait``, on flush and on close, errors that reach only the futures
they belong to, and several submitting threads at once."""

from __future__ import annotations

import os
import threading
import time
from concurrent.futures import CancelledError, wait

import numpy as np
import pyarrow as pa
import pytest

from engine import Index
from engine.bench.measure import event_dicts
from engine.errors import BadEventError
from engine.streaming import EventStream
from engine.workloads import begen
from tests.forking import in_forked_child

#: a future that should resolve at once gets this long on a slow machine
PATIENCE = 10.0


@pytest.fixture(scope="module")
def workload():
    return begen(400, 240, dims=40, event_size=8, sub_size=3, match_prob=0.05, seed=7)


@pytest.fixture(scope="module")
def events(workload):
    return event_dicts(workload.events, workload.n_events)


@pytest.fixture(scope="module")
def indexes(workload, events):
    """One index per algorithm, its kernels compiled by a first match."""
    built = {}
    for algorithm in ("scan", "opindex", "betree"):
        index = Index(algorithm=algorithm)
        index.add_many(workload.subscriptions)
        index.merge()
        index.match(events[0])
        built[algorithm] = index
    return built


@pytest.fixture
def index(indexes):
    return indexes["opindex"]


class Recording:
    """An index that records the size of every ``match_batch`` call, and
    raises for a batch holding an event with the key ``poison``."""

    def __init__(self, index):
        self.index = index
        self.sizes = []

    def match_batch(self, events, **kwargs):
        self.sizes.append(len(events))
        if any(isinstance(e, dict) and "poison" in e for e in events):
            raise RuntimeError("poisoned batch")
        return self.index.match_batch(events, **kwargs)


def results(futures):
    done, not_done = wait(futures, timeout=PATIENCE)
    assert not not_done, f"{len(not_done)} futures unresolved after {PATIENCE} s"
    return [f.result() for f in futures]


def assert_same_answers(got, expected):
    assert len(got) == len(expected)
    for ids, want in zip(got, expected):
        assert isinstance(ids, np.ndarray) and ids.dtype == np.int64
        assert np.array_equal(ids, want)
        assert np.all(np.diff(ids) > 0)


@pytest.mark.parametrize("algorithm", ["scan", "opindex", "betree"])
def test_answers_equal_index_match(indexes, events, algorithm):
    index = indexes[algorithm]
    expected = [index.match(event) for event in events]
    assert sum(len(ids) for ids in expected) > 0          # the workload plants matches
    with EventStream(index, batch_size=16, max_wait=0.01) as stream:
        futures = [stream.submit(event) for event in events]
        assert_same_answers(results(futures), expected)
    stats = stream.stats()
    assert stats["events"] == len(events)
    assert stats["batches"] >= len(events) // 16
    assert stats["batches"] == sum(stats[reason] for reason in ("size", "time", "flush", "close"))


def test_a_lone_event_waits_about_max_wait(index, events):
    max_wait = 0.05
    with EventStream(index, batch_size=1024, max_wait=max_wait) as stream:
        for event in events[:2]:              # the clock restarts with each new first event
            started = time.monotonic()
            future = stream.submit(event)
            ids = future.result(timeout=PATIENCE)
            elapsed = time.monotonic() - started
            assert np.array_equal(ids, index.match(event))
            # the batch waited for max_wait (it was not full), and not much longer
            assert 0.9 * max_wait <= elapsed < max_wait + 2.0
        assert stream.stats()["time"] == 2 and stream.stats()["size"] == 0


def test_zero_max_wait_matches_at_once(index, events):
    with EventStream(index, batch_size=1024, max_wait=0) as stream:
        started = time.monotonic()
        assert np.array_equal(stream.submit(events[0]).result(timeout=PATIENCE), index.match(events[0]))
        assert time.monotonic() - started < 2.0


def test_a_full_batch_goes_at_once_and_the_rest_on_flush(index, events):
    spy = Recording(index)
    with EventStream(spy, batch_size=8, max_wait=None) as stream:   # no clock: only size, flush, close
        full = [stream.submit(event) for event in events[:8]]
        assert_same_answers(results(full), [index.match(e) for e in events[:8]])
        rest = [stream.submit(event) for event in events[8:11]]
        time.sleep(0.2)
        assert not any(f.done() for f in rest) and stream.pending() == 3
        stream.flush()                        # returns once they are resolved
        assert all(f.done() for f in rest) and stream.pending() == 0
        assert_same_answers([f.result() for f in rest], [index.match(e) for e in events[8:11]])
        stream.flush()                        # nothing waiting: returns at once
    assert spy.sizes == [8, 3]
    stats = stream.stats()
    assert (stats["size"], stats["flush"], stats["time"], stats["close"], stats["batches"]) == (1, 1, 0, 0, 2)


def test_close_matches_everything_waiting(index, events):
    spy = Recording(index)
    stream = EventStream(spy, batch_size=100, max_wait=None)
    futures = [stream.submit(event) for event in events[:230]]
    stream.close()
    assert all(f.done() for f in futures)
    assert_same_answers([f.result() for f in futures], [index.match(e) for e in events[:230]])
    assert sorted(spy.sizes) == [30, 100, 100] and sum(spy.sizes) == 230    # never more than batch_size
    assert stream.closed and stream.pending() == 0
    with pytest.raises(RuntimeError, match="closed"):
        stream.submit(events[0])
    stream.close()                            # again: nothing more
    stream.flush()


def test_a_bad_event_fails_only_its_own_future(index, events):
    good = events[:3]
    bad_value = dict(events[3], a0="cheap")   # a0 is numeric
    submitted = [good[0], bad_value, good[1], 42, good[2]]
    with EventStream(index, batch_size=len(submitted), max_wait=None) as stream:
        futures = [stream.submit(event) for event in submitted]
        wait(futures, timeout=PATIENCE)
    with pytest.raises(BadEventError) as exc:
        futures[1].result()
    assert exc.value.attribute == "a0" and exc.value.value == "cheap"
    assert exc.value.event == 0               # as matched alone, not its place in the batch
    with pytest.raises(TypeError, match="not a mapping"):
        futures[3].result()
    assert_same_answers([futures[i].result() for i in (0, 2, 4)], [index.match(e) for e in good])

    # errors="null": the bad value is taken as absent
    with EventStream(index, batch_size=4, max_wait=0, errors="null") as stream:
        ids = stream.submit(bad_value).result(timeout=PATIENCE)
    assert np.array_equal(ids, index.match_batch([bad_value], errors="null")[0])


def test_an_exception_of_the_index_reaches_only_the_failing_events(index, events):
    """A batch that makes match_batch raise is matched event by event: the
    event that fails gets the exception, the others their answers."""
    spy = Recording(index)
    submitted = [events[0], {"poison": 1}, events[1]]
    with EventStream(spy, batch_size=3, max_wait=None) as stream:
        futures = [stream.submit(event) for event in submitted]
        wait(futures, timeout=PATIENCE)
        with pytest.raises(RuntimeError, match="poisoned batch"):
            futures[1].result()
        assert_same_answers([futures[0].result(), futures[2].result()], [index.match(events[0]),
                                                                         index.match(events[1])])
        # the stream goes on
        later = stream.submit(events[2])
        stream.flush()
        assert np.array_equal(later.result(), index.match(events[2]))
    assert spy.sizes == [3, 1, 1, 1, 1]


def test_a_cancelled_future_is_skipped(index, events):
    spy = Recording(index)
    with EventStream(spy, batch_size=8, max_wait=None) as stream:
        dropped, kept = stream.submit(events[0]), stream.submit(events[1])
        assert dropped.cancel()
        stream.flush()
    with pytest.raises(CancelledError):
        dropped.result()
    assert np.array_equal(kept.result(), index.match(events[1]))
    assert spy.sizes == [1]
    # stats count what was matched: the cancelled event was not, nor a batch of cancelled events only
    # (they counted 2 events, then 2 batches)
    assert (stream.stats()["events"], stream.stats()["batches"]) == (1, 1)
    with EventStream(spy, batch_size=8, max_wait=None) as stream:
        assert all(future.cancel() for future in [stream.submit(event) for event in events[:3]])
        stream.flush()
        assert stream.stats() == {"size": 0, "time": 0, "flush": 0, "close": 0, "events": 0, "batches": 0}


def test_flush_from_a_callback_does_not_deadlock(index, events):
    with EventStream(index, batch_size=2, max_wait=None) as stream:
        first = stream.submit(events[0])
        first.add_done_callback(lambda _: stream.flush())    # runs on the stream's own thread
        second = stream.submit(events[1])
        third = stream.submit(events[2])
        assert_same_answers(results([first, second, third]), [index.match(e) for e in events[:3]])


def test_concurrent_submitters(indexes, events):
    index = indexes["betree"]
    expected = [index.match(event) for event in events]
    n_threads = 4
    got = [None] * len(events)
    barrier = threading.Barrier(n_threads)
    with EventStream(index, batch_size=32, max_wait=0.002) as stream:
        def submit_share(k):
            barrier.wait()
            mine = range(k, len(events), n_threads)
            futures = [stream.submit(events[i]) for i in mine]
            for i, future in zip(mine, futures):
                got[i] = future.result(timeout=PATIENCE)

        threads = [threading.Thread(target=submit_share, args=(k,)) for k in range(n_threads)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(PATIENCE)
        assert not any(thread.is_alive() for thread in threads)
    assert_same_answers(got, expected)
    assert stream.stats()["events"] == len(events)


@pytest.mark.parametrize("kwargs", [dict(batch_size=0), dict(batch_size=2.5), dict(batch_size=True),
                                    dict(max_wait=-1), dict(max_wait=float("nan")), dict(errors="report")])
def test_bad_arguments(index, kwargs):
    with pytest.raises(ValueError):
        EventStream(index, **kwargs)


@pytest.mark.parametrize("index", [None, "not an index"], ids=["None", "str"])
def test_the_stream_needs_an_index(index):
    with pytest.raises(TypeError, match="EventStream matches through an Index"):
        EventStream(index)


def test_the_readme_example_runs_from_the_package():
    """``from engine import EventStream`` (the README's example): the same
    ids as ``match`` for each submitted event."""
    import engine

    assert "EventStream" in engine.__all__ and engine.EventStream is EventStream
    idx = Index()
    idx.add_many([1, 2], ["price < 600 AND color = 'silver'", "price > 1000"])
    with engine.EventStream(idx, batch_size=1024, max_wait=0.005) as stream:
        futures = [stream.submit({"price": p, "color": "silver"}) for p in (550, 1500, 700)]
    assert [f.result().tolist() for f in futures] == [[1], [2], []]


def test_a_wait_longer_than_the_platform_allows_just_waits(index):
    """A finite max_wait past threading.TIMEOUT_MAX killed the stream's thread
    (OverflowError) and closed it for everyone."""
    stream = EventStream(index, batch_size=4, max_wait=1e12)
    future = stream.submit({"a": 1})
    time.sleep(0.2)
    assert not stream.closed and not future.done()
    stream.flush()
    assert future.result(timeout=5).tolist() == index.match({"a": 1}).tolist()
    stream.close()


def test_no_future_waits_forever_when_a_callback_raises_past_future(index):
    """A done-callback raising a BaseException (SystemExit) ends the stream's
    thread: the rest of the batch in flight was never resolved (flush
    returned, pending() said 0).  They fail now; and a future its caller
    resolved first is skipped, not a crash of the stream."""
    stream = EventStream(index, batch_size=10, max_wait=None)
    futures = [stream.submit({"a": i}) for i in range(3)]
    futures[0].add_done_callback(lambda f: (_ for _ in ()).throw(SystemExit("callback exits")))
    stream.flush()
    assert stream.closed
    for future in futures[1:]:
        with pytest.raises(RuntimeError, match="the EventStream thread failed: SystemExit"):
            future.result(timeout=5)
    stream = EventStream(index, batch_size=10, max_wait=None)
    futures = [stream.submit({"a": i}) for i in range(3)]
    futures[1].set_result("mine")
    stream.flush()
    assert not stream.closed and futures[1].result() == "mine"
    assert [f.result(timeout=5).tolist() for f in (futures[0], futures[2])] == \
        [index.match({"a": 0}).tolist(), index.match({"a": 2}).tolist()]
    stream.close()


def test_events_matched_alone_after_a_failed_batch_see_the_batchs_state():
    """When ``match_batch`` failed on a batch, its events were matched one by
    one against the index as it was then: an update made in between showed
    in their answers.  They are matched against the batch's own state
    (``Index.pinned``)."""
    index = Index(algorithm="opindex", backend="cpu")
    index.add(1, "x = 1")

    class UpdatedMeanwhile:
        """An index whose batches fail after another thread's update landed."""

        def pinned(self):
            state = index.pinned()

            class Failing:
                def match_batch(self, events, **kwargs):
                    if len(events) > 1:
                        index.add(2, "x >= 1")          # lands between the batch and its events alone
                        index.remove(1)
                        raise RuntimeError("the batch failed")
                    return state.match_batch(events, **kwargs)
            return Failing()

        def match_batch(self, events, **kwargs):
            raise AssertionError("the stream matches through pinned()")

    with EventStream(UpdatedMeanwhile(), batch_size=2, max_wait=None) as stream:
        futures = [stream.submit({"x": 1}), stream.submit({"x": 2})]
    assert [f.result().tolist() for f in futures] == [[1], []]
    assert index.match({"x": 1}).tolist() == [2]


def test_a_pinned_index_keeps_matching_its_state():
    index = Index(algorithm="betree", backend="cpu")
    index.add_many([1, 2], ["x = 1", "x >= 1"])
    pinned = index.pinned()
    index.remove(2)
    index.add(3, "x = 1")
    index.merge()
    events = [{"x": 1}, {"x": 2}]
    assert [ids.tolist() for ids in pinned.match_batch(events)] == [[1, 2], [2]]
    assert pinned.match({"x": 1}).tolist() == [1, 2] and len(pinned) == 2
    assert pa.Table.from_batches(list(pinned.match_stream(events))).to_pydict() == \
        {"event": [0, 0, 1], "sub_id": [1, 2, 2]}
    assert [ids.tolist() for ids in index.match_batch(events)] == [[1, 3], []]


@pytest.mark.skipif(not hasattr(os, "fork"), reason="os.fork is POSIX-only")
def test_a_stream_copied_into_a_forked_child_refuses_work_clearly():
    """The stream's matching thread stays in the parent: in a forked child a
    submitted event waited for ever.  The child's copy now refuses submit
    and flush with a RuntimeError saying to make a stream there, and close
    returns; the parent's stream goes on."""
    index = Index(algorithm="opindex", backend="cpu")
    index.add_many(range(5), [f"x >= {i}" for i in range(5)])
    stream = EventStream(index, batch_size=8, max_wait=30)
    pending = stream.submit({"x": 2})                       # waiting in the parent's queue at the fork
    def child() -> str:
        said = []
        for call in (lambda: stream.submit({"x": 1}), stream.flush):
            try:
                call()
            except RuntimeError as exc:
                said.append("make a new EventStream in this process" in str(exc))
        stream.close()
        with EventStream(index, batch_size=1) as own:           # one made in the child works
            said.append(own.submit({"x": 1}).result(30).tolist() == [0, 1])
        return repr(said)

    status, answer = in_forked_child(child, timeout_s=60)
    assert status == 0 and answer == "[True, True, True]", answer
    stream.flush()
    assert pending.result(30).tolist() == [0, 1, 2] and not stream.closed
    stream.close()
