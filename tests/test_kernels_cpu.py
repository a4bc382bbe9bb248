"""Kernel-level tests of the CPU kernels against plain NumPy."""

from __future__ import annotations

import numpy as np
import pytest

from engine.algorithms.base import alive_flags
from gpu_kernels import compaction
from gpu_kernels.list_truth import list_bits_words


def test_parallel_and_serial_compaction_agree_with_nonzero():
    rng = np.random.default_rng(5)
    hits = (rng.random((700, 3000)) < 0.01).astype(np.uint8)   # above PARALLEL_CELLS
    assert hits.size >= compaction.PARALLEL_CELLS
    want_rows, want_cols = np.nonzero(hits[:650])
    rows, cols = compaction.compact_hits(hits, 650, 10)
    assert rows.tolist() == (want_rows + 10).tolist() and cols.tolist() == want_cols.tolist()
    small_rows, small_cols = compaction.compact_hits(hits[:3], 3, 0)
    want_rows, want_cols = np.nonzero(hits[:3])
    assert small_rows.tolist() == want_rows.tolist() and small_cols.tolist() == want_cols.tolist()


def test_transpose64_is_the_bit_matrix_transpose():
    from numba import njit

    transposed = njit(lambda a: compaction.transpose64(a))
    rng = np.random.default_rng(7)
    for density in (0.0, 0.03, 0.5, 1.0):
        bits = rng.random((64, 64)) < density          # bits[r, c]: row r, column c
        words = np.packbits(bits[:, ::-1], axis=1).view(">u8").astype(np.uint64).ravel()
        transposed(words)
        got = np.unpackbits(words.astype(">u8").view(np.uint8).reshape(64, 8), axis=1)[:, ::-1].astype(bool)
        assert (got == bits.T).all(), density


def test_parallel_predicate_dedup_equals_the_serial_one():
    """Predicate de-duplication on every core (hash partitions) gives the
    serial table's exact answer: distinct rows numbered by first
    appearance, every row mapped to its distinct row, -0.0 equal to 0.0."""
    from engine.compile import _factorize_predicates, _factorize_predicates_parallel, distinct_rows

    rng = np.random.default_rng(1)
    n = 150_000
    attr = rng.integers(0, 60, n).astype(np.int32)
    op = rng.integers(0, 5, n).astype(np.int8)
    lo = rng.integers(-3, 40, n).astype(np.float64)
    lo[lo == 0] = np.where(rng.random(int((lo == 0).sum())) < 0.5, -0.0, 0.0)
    hi = np.where(op == 4, lo + rng.integers(0, 3, n), 0.0)
    hi[(hi == 0) & (rng.random(n) < 0.5)] = -0.0
    aux = rng.integers(0, 3, n).astype(np.int64)
    columns = [attr, op, lo.view(np.int64), hi.view(np.int64), aux]     # (the kernels fold -0.0's bits)
    first_s, inverse_s = _factorize_predicates(*columns)
    first_p, inverse_p = _factorize_predicates_parallel(*columns)
    assert np.array_equal(first_s, first_p) and np.array_equal(inverse_s, inverse_p)
    assert np.all(np.diff(first_p) > 0) and len(first_p) < n // 2
    keys = np.stack([attr, op, lo + 0.0, hi + 0.0, aux], axis=1)
    assert np.array_equal(keys[first_p[inverse_p]], keys)           # each row maps to an equal row
    assert len(np.unique(keys[first_p], axis=0)) == len(first_p)    # and distinct rows differ
    first_d, inverse_d = distinct_rows((attr, op, lo, hi, aux))     # the public entry point, whichever it takes
    assert np.array_equal(first_d, first_s) and np.array_equal(inverse_d, inverse_s)


def test_opindex_kernels_take_the_struct_whole():
    """The OpIndex match kernels (parallel and serial) take the index as one
    OpIndexArrays and the segment's Programs: called directly, they give the
    matcher's pairs; every built or derived structure passes the checks a
    loaded one must pass."""
    from engine import Index
    from engine import events as event_batches
    from engine.compile import PATTERN_CODES
    from gpu_kernels.opindex import cpu
    from gpu_kernels.opindex.layout import OpIndexArrays, Programs, check_arrays

    schema = {"n0": "numeric", "n1": "numeric", "s0": "string"}
    index = Index(algorithm="opindex", backend="cpu", schema=schema, dnf_limit=4)
    exprs = ["n0 = 1 AND s0 = 'ab'", "n1 IN (1, 2) OR s0 LIKE 'a%'", "n0 IS NULL", "n0 BETWEEN 0 AND 2",
             "(n0 = 1 XOR s0 = 'b') AND n1 > 0", "s0 NOT LIKE '%z' AND n1 IS NULL"]
    index.add_many(range(len(exprs)), exprs)
    index.merge()
    index.match({})
    events = [{"n0": 1, "s0": "ab", "n1": 2}, {}, {"n0": 0.5, "s0": "b", "n1": 1}, {"s0": "abz"}]
    matcher = index._matcher
    seg, a = matcher.segment, matcher.arrays
    assert isinstance(a, OpIndexArrays) and a.counter_init is matcher.counter_init
    check_arrays(a, len(seg))
    batch = event_batches.encode_events(events, matcher.schema)
    preds = seg.predicates
    pairs = np.unique(np.stack([preds.attr, preds.aux], axis=1)[np.isin(preds.op, PATTERN_CODES)], axis=0)
    truth = event_batches.pattern_truth(batch, matcher.schema, pairs)
    alive = alive_flags(np.ones(len(seg), np.uint8))      # (read-only, as a matcher hands the kernels)
    want_e, want_p = matcher.positions(batch, truth, alive)
    assert len(want_p)
    for kernel, n_tasks in ((cpu.opindex_match_kernel, 2), (cpu.opindex_match_serial, 1)):
        bounds = np.linspace(0, batch.n_events, n_tasks + 1).round().astype(np.int64)
        cap = 64
        out = np.empty(n_tasks * cap, np.int32)
        ev_count = np.zeros(batch.n_events, np.int64)
        stop, need = np.empty(n_tasks, np.int64), np.empty(n_tasks, np.int64)
        kernel(bounds[:-1].copy(), bounds[1:].copy(), out, cap, ev_count, stop, need, len(seg), batch.offsets,
               batch.attr, batch.value, batch.token, truth, batch.list_truth, list_bits_words(batch.list_truth), a,
               Programs.of(seg), np.zeros(0, np.uint8), alive)
        assert stop.tolist() == bounds[1:].tolist()
        got = np.concatenate([out[t * cap:t * cap + ev_count[bounds[t]:bounds[t + 1]].sum()] for t in range(n_tasks)])
        assert got.tolist() == want_p.tolist()
        assert np.repeat(np.arange(batch.n_events), ev_count).tolist() == want_e.tolist()
    index.remove(0)
    index.add(9, "n1 < 5 AND s0 >= 'aa'")
    index.merge()
    index.match({})
    check_arrays(index._matcher.arrays, len(index._matcher.segment))


def test_every_cached_kernel_has_its_own_cache_entry():
    """numba keys its on-disk cache by module, name and line, not by the
    compile options (numba issue 6845): a kernel compiled both over every
    core and on the calling thread from one function would load whichever
    twin was cached first for both -- a "parallel" kernel on one thread.
    Every cached CPU dispatcher of the kernel modules has a cache file base
    of its own, and each parallel/serial pair is what it says."""
    import importlib

    from numba.core.registry import CPUDispatcher

    from gpu_kernels import twins

    bases: dict = {}
    pairs = 0
    for name in ("gpu_kernels.opindex.cpu", "gpu_kernels.betree.cpu", "gpu_kernels.apcm.cpu",
                 "gpu_kernels.pstree.cpu", "gpu_kernels.atree.cpu", "gpu_kernels.list_truth", "gpu_kernels.scan",
                 "gpu_kernels.predicates", "gpu_kernels.compaction", "engine.compile", "engine.columnar"):
        module = importlib.import_module(name)
        for attr, value in vars(module).items():
            if isinstance(value, CPUDispatcher) and type(value._cache).__name__ == "FunctionCache":
                base = value._cache._impl.filename_base
                assert bases.setdefault(base, value) is value, f"{name}.{attr} shares the cache of another kernel"
                if attr.endswith("_serial"):
                    parallel = getattr(module, attr[:-len("_serial")], None) or \
                        getattr(module, attr[:-len("_serial")] + "_kernel", None)
                    assert value.py_func.__name__.endswith(twins.SERIAL_SUFFIX)
                    assert not value.targetoptions.get("parallel")
                    if parallel is not None:
                        assert parallel.targetoptions.get("parallel") and parallel.py_func.__code__.co_code == \
                            value.py_func.__code__.co_code
                        pairs += 1
    assert pairs >= 6


@pytest.mark.parametrize("threads", [1, 2, 3])
def test_sort_on_every_core_is_numpys_sort(threads, monkeypatch):
    """Slices sorted at once, then merged: equal to ``np.sort`` for keys with
    repeats, sorted and reversed runs, around the size it starts at."""
    import numba

    from engine.algorithms import host_tasks

    monkeypatch.setattr(host_tasks, "PARALLEL_SORT_FROM", 1000)
    rng = np.random.default_rng(threads)
    previous = numba.get_num_threads()
    numba.set_num_threads(min(threads, numba.config.NUMBA_NUM_THREADS))
    try:
        for values in (rng.integers(0, 50, 999), rng.integers(-(1 << 62), 1 << 62, 5003),
                       np.arange(4000)[::-1].copy(), np.repeat(rng.integers(0, 9, 40), 100), rng.random(3001)):
            got = values.copy()
            host_tasks.sort_on_every_core(got)
            np.testing.assert_array_equal(got, np.sort(values))
    finally:
        numba.set_num_threads(previous)


def test_tasks_take_per_task_events_but_never_leave_a_thread_idle():
    import numba

    from engine.algorithms.host_tasks import match_in_tasks

    threads = numba.get_num_threads()
    for n_events in (3, 24, 200, 1000):
        spans = []

        def launch(first, last, out, cap, ev_count, stop, need, serial):
            spans.append((last - first).tolist())
            stop[:] = last

        match_in_tasks(n_events, launch, 1.0, per_task=64)
        (tasks,) = spans
        assert sum(tasks) == n_events and min(tasks) >= 1
        if n_events <= 4 or threads == 1:
            assert len(tasks) == 1
        else:
            assert min(threads, n_events) <= len(tasks) <= 4 * threads
            assert len(tasks) <= max(threads, -(-n_events // 64))      # as few as 64 events a task allows


def test_interval_form_has_predicate_truths_on_every_edge_value():
    """Each operator's interval form (kind, two bounds) is TRUE on exactly
    the present values the operator is: over operands and values at the
    float64 edges -- the infinities and the largest finite floats, NaN, both zeros, the subnormals next to
    them, and the neighbours of an ordinary value -- every pair, every
    comparison operator; a NaN operand leaves the row EVALUATED."""
    from gpu_kernels import opcodes as O
    from gpu_kernels.predicates import EVALUATED, INSIDE, OUTSIDE, interval_form, predicate_truth_many
    tiny = np.nextafter(0.0, 1.0)
    big = np.finfo(np.float64).max
    edges = np.array([-np.inf, -big, -1e308, -2.0, np.nextafter(-1.0, -2.0), -1.0, np.nextafter(-1.0, 0.0), -tiny, -0.0,
                      0.0, tiny, 1.0, np.nextafter(1.0, 2.0), 3.5, 1e308, big, np.inf, np.nan])
    ops = [O.EQ, O.NE, O.LT, O.LE, O.GT, O.GE, O.BETWEEN, O.NOT_BETWEEN, O.IS_EMPTY, O.IS_NOT_EMPTY]
    op, lo, hi, x = (a.ravel() for a in np.meshgrid(ops, edges, edges, edges, indexing="ij"))
    op = op.astype(np.int8)
    want = np.empty(len(op), np.uint8)
    predicate_truth_many(op, lo, hi, np.zeros(len(op) + 1, np.int64), np.zeros(0), np.zeros(len(op), np.uint8),
                         np.ones(len(op), np.uint8), x, want)
    kind, bounds = interval_form(op, lo, hi)
    operand_nan = np.isnan(lo) | np.isnan(hi)
    list_test = (op == O.IS_EMPTY) | (op == O.IS_NOT_EMPTY)
    assert ((kind == EVALUATED) == (operand_nan & ~list_test)).all()
    first, last = bounds[:, 0], bounds[:, 1]
    inside = (first <= x) & (x <= last)
    got = np.where(kind == INSIDE, inside, np.where(kind == OUTSIDE, (x < first) | (x > last), ~inside))
    checked = kind != EVALUATED
    assert (got[checked] == (want[checked] == O.TRUE)).all()
    assert checked.sum() > 30_000


@pytest.mark.parametrize("clusters", [False, True])
@pytest.mark.parametrize("parallel_from", [0, 1 << 40])
def test_runs_left_in_resumed_slabs_come_out_as_the_pairs(clusters, parallel_from, monkeypatch):
    """The host_tasks protocol end to end with a kernel that writes known
    matches: tasks that run out of room are resumed into new slabs (several
    slabs in one answer), events without matches, A-PCM's clusters (a unit
    is several events, listed in cluster order and put back in batch order
    by ``permuted``); the pairs equal the matches, as positions and as ids,
    written over every core and on the calling thread."""
    from engine.algorithms import host_tasks
    from engine.algorithms.host_tasks import Runs, match_in_tasks

    monkeypatch.setattr(host_tasks, "PARALLEL_PAIRS", parallel_from)

    rng = np.random.default_rng(7)
    n_events = 300
    matches = [np.sort(rng.choice(5000, size=int(rng.choice([0, 1, 5, 40, 900])), replace=False))
               for _ in range(n_events)]
    perm = rng.permutation(n_events) if clusters else np.arange(n_events)
    members = np.unique(np.concatenate(([0, n_events], rng.choice(n_events, 60)))) if clusters else None
    units = len(members) - 1 if clusters else n_events
    member_counts = np.zeros(n_events, np.int64)
    slabs = []

    def launch(first, last, out, cap, unit_count, stop, need, serial):
        slabs.append(cap)
        for t in range(len(first)):
            at, stop[t] = t * cap, last[t]
            for u in range(first[t], last[t]):
                lo, hi = (members[u], members[u + 1]) if clusters else (u, u + 1)
                size = sum(len(matches[perm[m]]) for m in range(lo, hi))
                if at + size > (t + 1) * cap:
                    stop[t], need[t] = u, size
                    break
                for m in range(lo, hi):
                    found = matches[perm[m]]
                    out[at:at + len(found)] = found
                    at += len(found)
                    member_counts[m] = len(found)
                unit_count[u] = size

    runs, _ = match_in_tasks(units, launch, 1.0, members=members if clusters else None,
                             member_counts=member_counts if clusters else None)
    assert len(slabs) > 1 and len(runs.slabs) == len(slabs)         # resumed: more than one slab
    if clusters:
        runs = runs.permuted(perm)
    want_events = np.repeat(np.arange(n_events), [len(m) for m in matches])
    want = np.concatenate(matches)
    ids = rng.permutation(10_000)[:5000].astype(np.int64)
    for given, values in ((None, want), (ids, ids[want])):
        events, got = runs.pairs(given)
        assert events.dtype == got.dtype == np.int64
        np.testing.assert_array_equal(events, want_events)
        np.testing.assert_array_equal(got, values)
    assert runs.n_matches == len(want)
    for empty in (Runs.empty(5), Runs.of_pairs(np.zeros(0, np.int64), np.zeros(0, np.int64), 5)):
        assert [len(a) for a in empty.pairs(ids)] == [0, 0]


@pytest.mark.parametrize("parallel_from", [0, 1 << 40])
def test_parts_merged_by_event_equal_a_lexsort(parallel_from, monkeypatch):
    """Several parts' (event, id) pairs -- each ordered by event, ids in
    order within an event or not (a delta's are in insertion order), parts
    without pairs, events without any -- merged into one answer: equal to
    concatenating and lexsorting them, over every core and on one thread."""
    monkeypatch.setattr(compaction, "PARALLEL_PAIRS", parallel_from)
    rng = np.random.default_rng(3)
    n_events = 50
    for n_parts in (2, 3):
        for ordered in (True, False):
            events, ids = [], []
            for p in range(n_parts):
                counts = rng.choice([0, 0, 1, 3, 60], size=n_events) if p != 1 else np.zeros(n_events, np.int64)
                e = np.repeat(np.arange(n_events), counts)
                i = np.concatenate([np.sort(rng.choice(10**6, size=c, replace=False)) for c in counts])
                if not ordered and p == n_parts - 1:
                    i = rng.permutation(i)        # (events stay ordered: only the ids within an event move)
                    i = np.concatenate([np.asarray(i[e == k]) for k in range(n_events)])
                events.append(e.astype(np.int64))
                ids.append(i.astype(np.int64))
            want_e, want_i = np.concatenate(events), np.concatenate(ids)
            order = np.lexsort((want_i, want_e))
            got_e, got_i = compaction.merge_parts(events, ids, n_events)
            np.testing.assert_array_equal(got_e, want_e[order])
            np.testing.assert_array_equal(got_i, want_i[order])
