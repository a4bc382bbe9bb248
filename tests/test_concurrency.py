"""Matching while another thread updates (docs/architecture.md#concurrency).

Reader threads match in a loop while a writer adds, removes and merges.
Every answer must be the reference answer of ONE state of the index that
was current at some moment during the call: the writer records the live
subscriptions after each update, and a batch's results are checked, after
all threads have stopped, against the states recorded between the moment
the call started and the moment it returned.  Any exception in any thread
fails the test.  The same subscriptions' strings keep growing the string
dictionary, so that string codes move under the readers (the recode path),
and merges fold the delta and tombstones into new main segments (the
derivations of every indexing algorithm).  Every registered algorithm runs
it.
"""

from __future__ import annotations

import os
import platform
import random
import subprocess
import sys
import threading
import time

import numpy as np
import pyarrow as pa
import pytest

from engine import Index
from engine.algorithms import registry
from engine.parse import parse
from engine.reference import matches
from tests.forking import held_by_another_thread, in_forked_child
from tests.test_cuda_sim import SIMULATED, needs_cuda

URLS = [f"https://example.com/{path}" for path in ("a", "b", "a/b", "a/b/c?x=1", "b/a", "c")]
UUIDS = [f"123e4567-e89b-12d3-a456-4266141740{i:02d}" for i in range(6)]


def expression(rng: random.Random) -> str:
    """A subscription over numbers and strings that share long prefixes."""
    forms = [
        lambda: f"url = '{rng.choice(URLS)}'",
        lambda: f"url > '{rng.choice(URLS)}' AND n <= {rng.randint(0, 9)}",
        lambda: f"user IN ('{rng.choice(UUIDS)}', '{rng.choice(UUIDS)}') OR n = {rng.randint(0, 9)}",
        lambda: f"url LIKE 'https://example.com/{rng.choice('abc')}%' AND NOT n > {rng.randint(0, 9)}",
        lambda: f"(n BETWEEN {rng.randint(0, 4)} AND {rng.randint(4, 9)}) XOR user = '{rng.choice(UUIDS)}'",
        lambda: f"tag = 'new-{rng.randint(0, 10 ** 6)}' OR n != {rng.randint(0, 9)}",   # a new string each time
        lambda: "user IS NULL AND n >= 5",
    ]
    return rng.choice(forms)()


def events(rng: random.Random, n: int) -> list[dict]:
    out = []
    for _ in range(n):
        event = {}
        if rng.random() < 0.8:
            event["url"] = rng.choice(URLS + ["https://example.com/", "https://example.com/a/"])
        if rng.random() < 0.7:
            event["user"] = rng.choice(UUIDS)
        if rng.random() < 0.9:
            event["n"] = rng.randint(0, 9)
        out.append(event)
    return out


class Writer:
    """Updates the index and records the live subscriptions after each
    update: ``history[k]`` is the state after the k-th update."""

    def __init__(self, index: Index, rng: random.Random):
        self.index, self.rng = index, rng
        self.live: dict[int, str] = {}
        self.history: list[dict[int, str]] = [{}]
        self.next_id = 0
        self.ops = {"add": 0, "add_many": 0, "remove": 0, "merge": 0}

    def step(self) -> None:
        rng, index = self.rng, self.index
        action = rng.choices(["add", "add_many", "remove", "merge"], weights=[5, 2, 4, 1])[0]
        if action == "remove" and not self.live:
            action = "add"
        if action == "add":
            text = expression(rng)
            index.add(self.next_id, text)
            self.live[self.next_id] = text
            self.next_id += 1
        elif action == "add_many":
            texts = [expression(rng) for _ in range(rng.randint(2, 40))]
            ids = list(range(self.next_id, self.next_id + len(texts)))
            index.add_many(ids, texts)
            self.live.update(zip(ids, texts))
            self.next_id += len(texts)
        elif action == "remove":
            sub_id = rng.choice(sorted(self.live))
            index.remove(sub_id)
            del self.live[sub_id]
        else:
            index.merge()
        self.ops[action] += 1
        self.history.append(dict(self.live))


#: the batches the readers match, again and again
BATCHES = [events(random.Random(seed), 12) for seed in range(8)]


def race(index: Index, match, seconds: float = 40.0) -> None:
    """Reader threads call ``match(k, rng)`` -- the answer for ``BATCHES[k]``
    as a list of ids per event -- in a loop while this thread updates
    ``index``; asserts that every answer is the reference answer of one
    state of the index current during the call, and that no thread raised."""
    rng = random.Random(20261126)
    writer = Writer(index, rng)
    for _ in range(200):                  # a main segment, a delta and tombstones to start from
        writer.step()
    match(0, random.Random(0))      # (kernels compiled before the clock starts: a cold cache took the time limit)
    observed = []               # (history length before, after, batch number, results)
    failures = []
    stop = threading.Event()

    def read(seed: int) -> None:
        local = random.Random(seed)
        try:
            while not stop.is_set() and len(observed) < 600:
                k = local.randrange(len(BATCHES))
                before = len(writer.history)
                result = match(k, local)
                observed.append((before, len(writer.history), k, result))
        except BaseException as exc:          # any exception in a reader fails the test
            failures.append(exc)

    readers = [threading.Thread(target=read, args=(seed,)) for seed in range(3)]
    for thread in readers:
        thread.start()
    # until the readers have seen many states (and at most `seconds`)
    deadline = time.monotonic() + seconds
    try:
        while time.monotonic() < deadline and not failures and (len(observed) < 60 or writer.ops["add"] < 100):
            writer.step()
            time.sleep(0.002)           # let the readers interleave with every kind of update
    finally:
        stop.set()
        for thread in readers:
            thread.join()
    assert not failures, failures[0]
    # (the loop aims at 60 batches; a slow machine may reach the time limit first)
    assert len(observed) >= 20 and writer.ops["merge"] > 0 and writer.ops["remove"] > 0

    truth: dict = {}          # (text, batch) -> is the subscription TRUE on each event, by the reference

    def expected(state: int, k: int) -> list[list[int]]:
        out = [[] for _ in BATCHES[k]]
        for sub_id, text in sorted(writer.history[state].items()):
            found = truth.get((text, k))
            if found is None:
                node = parse(text)
                found = truth[(text, k)] = [matches(node, event) for event in BATCHES[k]]
            for e, hit in enumerate(found):
                if hit:
                    out[e].append(sub_id)
        return out

    cache: dict = {}
    for before, after, k, result in observed:
        # the snapshot read was published after state before-1 was recorded, and
        # no later than state `after` (published, perhaps not yet recorded)
        candidates = range(max(0, before - 1), min(after, len(writer.history) - 1) + 1)
        assert any(result == cache.setdefault((state, k), expected(state, k)) for state in candidates), \
            f"a match saw no single state of the index between updates {before - 1} and {after}"
    # the final state, once more, without concurrency
    assert match(0, random.Random(0)) == expected(len(writer.history) - 1, 0)


@pytest.mark.parametrize("algorithm", registry.names("cpu"))
def test_matches_see_one_state_while_another_thread_updates(algorithm):
    index = Index(algorithm=algorithm, backend="cpu")

    def match(k: int, local: random.Random) -> list[list[int]]:
        if local.random() < 0.5:
            return [m.tolist() for m in index.match_batch(BATCHES[k])]
        table = index.match_batch(BATCHES[k], output="arrow")
        result = [[] for _ in BATCHES[k]]
        for e, s in zip(table["event"].to_pylist(), table["sub_id"].to_pylist()):
            result[e].append(s)
        return result

    race(index, match)


@pytest.mark.cuda
@needs_cuda
@pytest.mark.skipif(SIMULATED, reason="numba's CUDA simulator is not thread-safe: simulated kernels launched from "
                                      "several threads share its fake thread state; this runs on a GPU")
@pytest.mark.parametrize("algorithm", registry.names("cuda"))
def test_device_columns_match_one_state_while_another_thread_updates(algorithm):
    """Readers match events already on the device (strings as codes plus
    their dictionary, absent values as ``valid``), read-only and shared by
    every thread, while the writer grows the string dictionary and merges."""
    from engine.device_events import arrow_columns
    index = Index(algorithm=algorithm, backend="cuda")
    kinds = pa.schema([("url", pa.string()), ("user", pa.string()), ("n", pa.int64())])
    on_device = [arrow_columns(pa.Table.from_pylist(batch, schema=kinds)) for batch in BATCHES]

    def match(k: int, local: random.Random) -> list[list[int]]:
        columns, valid = on_device[k]
        if local.random() < 0.5:
            return [m.tolist() for m in index.match_batch(columns, valid=valid)]
        return index.match_batch(columns, valid=valid, output="arrow_lists")["sub_ids"].to_pylist()

    race(index, match, seconds=8.0)


def test_failed_update_changes_nothing_a_reader_can_see(monkeypatch):
    """An add_many that fails after it registered its strings and attributes
    (here: compiling runs out of memory) takes them back, and publishes
    nothing; a refused one (a family clash) never registered anything."""
    import engine.index as index_module

    index = Index(algorithm="opindex", backend="cpu")
    index.add(1, "url = 'https://example.com/a'")
    before = (list(index.schema.strings), list(index.schema.attr_names), index.schema.n_sets)
    with pytest.raises(Exception):
        index.add_many([2, 3], ["url = 'https://example.com/zzz' AND extra = 'x'", "url = 5"])

    def out_of_memory(*args, **kwargs):
        raise MemoryError("compiling")

    with monkeypatch.context() as patch:
        patch.setattr(index_module, "compile_expressions", out_of_memory)
        with pytest.raises(MemoryError):
            index.add_many([2, 3], ["url = 'https://example.com/zzz' AND extra = 'x'", "tag IN ('p', 'q')"])
    assert (list(index.schema.strings), list(index.schema.attr_names), index.schema.n_sets) == before
    assert index.match({"url": "https://example.com/a"}).tolist() == [1]
    assert 2 not in index and len(index) == 1
    index.add(2, "url >= 'https://example.com/a'")
    assert index.match({"url": "https://example.com/b"}).tolist() == [2]


def test_published_alive_flags_are_not_changed_by_a_remove():
    index = Index(algorithm="scan", backend="cpu")
    index.add_many(range(2000), [f"n = {i % 7}" for i in range(2000)])
    index.merge()
    before = index._state
    alive = before.alive.copy()
    index.remove(5)
    assert np.array_equal(before.alive, alive)        # the old snapshot is untouched
    assert 5 not in index


def test_ids_and_items_read_one_state_while_another_thread_updates():
    """``ids()`` merged, then read the main segment of whatever state came
    next: a remove and an add landing between the two made it answer a set
    of ids the index never held.  ``items()`` read its state at the first
    ``next()``, not at the call."""
    idx = Index(algorithm="scan", backend="cpu")
    idx.add_many([1, 2, 3], ["a = 1", "a = 2", "a = 3"])
    idx.merge()
    it = idx.items()
    idx.add(4, "a = 4")
    idx.remove(1)
    assert [sub_id for sub_id, _ in it] == [1, 2, 3]
    # the states a writer goes through, over and over: {1,2,3} -> +5 -> -1 -> +1 -> -5
    idx.add(1, "a = 1")
    idx.remove(4)
    stop, seen = threading.Event(), []

    def writer():
        while not stop.is_set():
            for step in (lambda: idx.add(5, "a = 5"), lambda: idx.remove(1), lambda: idx.add(1, "a = 1"),
                         lambda: idx.remove(5)):
                step()

    thread = threading.Thread(target=writer)
    thread.start()
    try:
        deadline = time.monotonic() + 1.0
        while time.monotonic() < deadline:
            seen.append(tuple(idx.ids().tolist()))
            seen.append(tuple(sub_id for sub_id, _ in idx.items()))
    finally:
        stop.set()
        thread.join()
    states = {(1, 2, 3), (1, 2, 3, 5), (2, 3, 5)}
    assert set(seen) <= states, set(seen) - states
    assert len(set(seen)) > 1          # the writer was seen at work
    # the interleaving that broke it, made certain: another thread's updates right after any merge ids() does
    idx.merge()
    merge = idx.merge

    def merge_then_another_thread_updates():
        merge()
        other = threading.Thread(target=lambda: (idx.add(5, "a = 5"), idx.remove(1)))
        other.start()
        other.join()

    idx.merge = merge_then_another_thread_updates
    assert tuple(idx.ids().tolist()) in states


def test_schema_rollback_takes_back_only_what_no_view_saw():
    from engine.expr import Family
    from engine.schema import Schema

    schema = Schema()
    schema.declare("s", "string")
    schema.add_strings(["https://example.com/a"])
    schema.set_id((1.0, 2.0))
    before = schema.view()
    before.set_csr()                                   # consolidated, then grown and rolled back
    mark = schema.mark()
    schema._add_attr("later", None)
    schema.fix_family("later", Family.NUMERIC)
    schema.add_strings(["https://example.com/b"])
    schema.set_id((3.0,))
    schema.pattern_id("like", "x%")
    during = schema.view()
    assert during.set_csr()[1].tolist() == [1.0, 2.0, 3.0] and during.families["later"] is Family.NUMERIC
    schema.rollback(mark)
    assert (schema.attr_names, schema.strings, schema.patterns, schema.n_sets) == \
        (["s"], ["https://example.com/a"], [], 1)
    schema.set_id((7.0, 8.0))                          # the same id as the list taken back
    assert schema.set_csr()[1].tolist() == [1.0, 2.0, 7.0, 8.0]
    assert before.set_csr()[1].tolist() == [1.0, 2.0] and before.families.get("later") is None
    assert before.encode_strings(["https://example.com/a", "https://example.com/b"]).tolist() == [1.0, 2.0]


def test_a_small_batch_runs_on_the_calling_thread_and_a_large_one_on_every_core(monkeypatch):
    """A parallel kernel waits at its end for every worker; on busy cores a
    worker off its core made each kernel of a one-event match take
    milliseconds (the conformance suite's A-PCM life cycles ran 5x slower).
    A batch this small (events x subscriptions) now runs on the calling
    thread, and only that thread's numba setting changes, for the match
    only; one event against many subscriptions keeps every core."""
    import numba

    from engine.algorithms import host_tasks
    from engine.algorithms.opindex import OpIndexMatcher

    seen = []
    real = OpIndexMatcher.match

    def recording(self, *args, **kwargs):
        seen.append(numba.get_num_threads())
        return real(self, *args, **kwargs)

    monkeypatch.setattr(OpIndexMatcher, "match", recording)
    cores = numba.get_num_threads()
    index = Index(algorithm="opindex", backend="cpu")
    index.add_many(range(100), [f"x >= {i}" for i in range(100)])
    index.merge()
    events = [{"x": i} for i in range(1000)]
    assert index.match({"x": 5}).tolist() == list(range(6))
    assert seen.pop() == 1 and numba.get_num_threads() == cores
    found = index.match_batch(events)          # 1,000 events x 100 subscriptions: on every core
    assert seen.pop() == cores and [len(ids) for ids in found] == [min(i + 1, 100) for i in range(1000)]
    # per thread: another thread's matches keep every core while this one runs on one
    others = []
    with host_tasks.threads_for(1, 1):
        assert numba.get_num_threads() == 1
        thread = threading.Thread(target=lambda: others.append(numba.get_num_threads()))
        thread.start()
        thread.join()
    assert others == [cores] and numba.get_num_threads() == cores
    monkeypatch.setattr(host_tasks, "SERIAL_WORK", 0)       # (how the conformance suite's large batch runs)
    index.match_batch(events[:10])
    assert seen.pop() == cores
    monkeypatch.undo()
    monkeypatch.setattr(OpIndexMatcher, "match", recording)
    # one event against more subscriptions than SERIAL_WORK keeps every core (A-PCM's parallel paths)
    index.add_many(range(100, 100 + host_tasks.SERIAL_WORK), ["x = -1"] * host_tasks.SERIAL_WORK)
    index.merge()
    assert index.match({"x": -1}).tolist() == list(range(100, 100 + host_tasks.SERIAL_WORK))
    assert seen.pop() == cores


@pytest.mark.parametrize("where", ["after the change", "in the restore"])
def test_an_interrupt_never_leaves_a_thread_on_one_core(where, monkeypatch):
    """Ctrl-C landing just after the count went to 1 (before the ``try``) or
    inside the ``finally`` (before the restore) left the thread on one
    numba thread for good (helper-43's probe: 10-25 real SIGINTs); the next
    match now restores it first.  The interrupt is placed deterministically
    by a ``set_num_threads`` that raises it."""
    import numba

    cores = numba.config.NUMBA_NUM_THREADS
    if cores == 1:
        pytest.skip("NUMBA_NUM_THREADS=1: numba runs one thread, there is nothing to restore")
    assert numba.get_num_threads() == cores          # (no test before this one left the thread on fewer)
    real = numba.set_num_threads
    calls = []

    def interrupted(n):
        calls.append(n)
        if where == "after the change" and n == 1:
            real(n)
            raise KeyboardInterrupt
        if where == "in the restore" and n != 1:
            raise KeyboardInterrupt
        real(n)

    index = Index(algorithm="apcm", backend="cpu", options={"variant": "bitmap"})
    index.add_many(range(20), [f"x >= {i}" for i in range(20)])
    index.merge()
    index.match({"x": 3})
    monkeypatch.setattr(numba, "set_num_threads", interrupted)
    with pytest.raises(KeyboardInterrupt):
        index.match({"x": 3})
    assert calls[0] == 1 and numba.get_num_threads() == 1           # stuck, as before the fix
    monkeypatch.setattr(numba, "set_num_threads", real)
    assert index.match({"x": 3}).tolist() == [0, 1, 2, 3]
    assert numba.get_num_threads() == cores
    assert len(index.match_batch([{"x": i} for i in range(400)])) == 400 and numba.get_num_threads() == cores
    # A-PCM's sequential baseline inside a large batch's match: its own one-thread block, restored alike
    from engine.algorithms import host_tasks
    with host_tasks.one_thread():
        assert numba.get_num_threads() == 1
        with host_tasks.one_thread():                                   # nested: nothing to change
            assert numba.get_num_threads() == 1
        assert numba.get_num_threads() == 1
    assert numba.get_num_threads() == cores


@pytest.mark.skipif(not (sys.platform.startswith("linux") and platform.machine() == "x86_64"),
                    reason="the tbb wheel is a dependency on Linux x86_64 only (pyproject.toml)")
def test_kernels_run_on_numba_tbb_layer_from_the_wheel():
    """numba finds the ``tbb`` wheel's library only once gpu_kernels has
    loaded it (its extension has no run path); without it, numba took
    OpenMP, whose kernels wait a scheduler quantum for a worker on a busy
    core (gpu_kernels/threading_layer.py).  A fresh interpreter, as a user's:
    importing engine and matching is all it takes, and the variable that
    chooses a layer still wins."""
    script = ("import numba; from engine import Index; i = Index(algorithm='opindex'); "
              "i.add_many(range(50), [f'x >= {k}' for k in range(50)]); i.merge(); "
              "assert len(i.match_batch([{'x': k} for k in range(200)])) == 200; "
              "from gpu_kernels import threading_layer; print(numba.threading_layer(), threading_layer.LOADED)")
    env = {key: value for key, value in os.environ.items() if key != "NUMBA_THREADING_LAYER"}
    found = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=300)
    assert found.returncode == 0, found.stderr
    layer, loaded = found.stdout.split()
    assert layer == "tbb", found.stdout
    assert loaded.endswith("/lib/libtbb.so.12"), loaded            # the wheel's, loaded before numba looked
    chosen = subprocess.run([sys.executable, "-c", script], env=dict(env, NUMBA_THREADING_LAYER="omp"),
                            capture_output=True, text=True, timeout=300)
    assert chosen.returncode == 0 and chosen.stdout.split()[0] == "omp", chosen.stderr


@pytest.mark.skipif(not hasattr(os, "fork") or not (sys.platform.startswith("linux") and platform.machine() == "x86_64"),
                    reason="fork after parallel kernels is safe on numba's TBB layer, a dependency on Linux x86_64")
@pytest.mark.parametrize("algorithm", registry.names("cpu"))
def test_a_forked_child_matches_with_the_parents_index(algorithm):
    """A process forked after matching (multiprocessing's default start
    method on Linux) gets the parent's index and must match with it: A-PCM's
    clustering pool came over without its threads and the child's first
    batch waited forever.  (Under numba's OpenMP layer no child may run a
    parallel kernel at all: numba terminates it.)"""
    index = Index(algorithm=algorithm, backend="cpu")
    index.add_many(range(1500), [f"x >= {k} AND y < {k + 40}" for k in range(1500)])
    index.merge()
    events = [{"x": k, "y": k} for k in range(3000)]           # (A-PCM: three buffered batches, a wave)
    want = [ids.tolist() for ids in index.match_batch(events)]
    status, answer = in_forked_child(
        lambda: "same" if [ids.tolist() for ids in index.match_batch(events)] == want else "different")
    assert status == 0 and answer == "same", (status, answer)
    assert [ids.tolist() for ids in index.match_batch(events)] == want      # and the parent still matches


@pytest.mark.parametrize("algorithm", registry.names("cpu"))
def test_a_snapshot_lets_go_of_the_matcher_it_was_derived_from(algorithm):
    """Once a snapshot's matcher is made (derived, reused or recoded from an
    older one), the older one is not held: a quiet service kept a second
    matcher alive, counted nowhere, until its next update (helper-43)."""
    import gc
    import weakref

    index = Index(algorithm=algorithm, backend="cpu")
    index.add_many(range(300), [f"x >= {i} AND s = 'k{i % 7}'" for i in range(300)])
    index.merge()
    index.match({"x": 5, "s": "k5"})
    for step in ("derive", "reuse"):
        old = weakref.ref(index._state.main_part(index)[1])
        if step == "derive":
            index.add_many(range(300, 320), [f"x < {i}" for i in range(20)])
            index.remove(3)
            index.merge()
        else:
            index.add(999, "s = 'a brand new string'")          # (delta only: the main matcher is reused)
        assert index.match({"x": 5, "s": "k5"}).tolist() == [5, *range(306, 320)]
        gc.collect()
        if step == "derive" or index._state.main_part(index)[1] is not old():
            assert old() is None, f"{step}: the older matcher is still alive"


@pytest.mark.parametrize("update", ["add", "merge"])
def test_an_update_racing_the_first_match_of_a_snapshot_keeps_its_matcher_source(update, monkeypatch):
    """The writer read a snapshot's unresolved part, a match then resolved
    it and let go of the source's matcher, and the writer handed the empty
    source on: every later match of the index failed (helper-44's review).
    The race is placed deterministically: the first read of the source
    runs the match's resolution first."""
    from engine.snapshot import Snapshot

    index = Index(algorithm="opindex", backend="cpu")
    index.add_many(range(50), [f"x >= {i}" for i in range(50)])
    index.merge()
    index.match({"x": 1})
    index.add(100, "s = 'new'")                # a snapshot whose main part is unresolved: source "reuse"
    index.remove(0)
    if update == "merge":
        index.merge()
    state = index._state
    assert state._main_part is None and state.source.matcher is not None
    slot = Snapshot.__dict__["source"]
    raced = []

    def read(self):
        if self is state and not raced:
            raced.append(True)
            self.main_part(index)               # the match, between the writer's reads
        return slot.__get__(self)

    monkeypatch.setattr(Snapshot, "source", property(read, slot.__set__))
    if update == "add":
        index.add(101, "x >= 7")
    else:
        index.remove(1)
        index.merge()
    monkeypatch.undo()
    assert raced
    want = [*range(1, 31), 101] if update == "add" else list(range(2, 31))
    assert index.match({"x": 30}).tolist() == want


@pytest.mark.skipif(not hasattr(os, "fork"), reason="os.fork is POSIX-only")
def test_a_child_forked_while_another_thread_holds_a_lock_can_update_and_match():
    """A lock held at the fork by another thread (an update in progress, a
    match resolving a new snapshot's matcher) stays held in the child,
    where that thread does not exist: the child's next update, or match of
    that snapshot, blocked for ever.  The child makes them anew."""
    index = Index(algorithm="opindex", backend="cpu")
    index.add_many(range(20), [f"x >= {i}" for i in range(20)])
    index.merge()
    index.add(50, "x >= 100")                          # a new snapshot, its matcher not made yet
    index.merge()

    def child() -> str:
        found = index.match({"x": 3}).tolist()               # resolves the snapshot: its lock
        index.add(60, "x = 3")                               # the update lock
        return repr((found, index.match({"x": 3}).tolist()))

    with held_by_another_thread(index._write_lock, index._state._lock):
        status, answer = in_forked_child(child, timeout_s=60)
    assert status == 0 and answer == repr(([0, 1, 2, 3], [0, 1, 2, 3, 60])), answer
