"""``opindex`` on the ``cuda`` backend: its kernels against their CPU twins,
the matcher against ``opindex`` on cpu, the reference evaluator and DuckDB,
chunking, device input and output, and the cuda path's errors.

Runs on a GPU, or without one under numba's CUDA simulator::

    NUMBA_ENABLE_CUDASIM=1 pytest -m cuda tests/test_opindex_cuda.py

Sizes are tiny under the simulator (every simulated thread is a Python
thread); :class:`TestFullSize` runs the standard workloads on real hardware.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from engine import Index
from engine.algorithms.opindex import OpIndexMatcher
from engine.parse import parse
from engine.reference import matches
from gpu_kernels import cuda_support
from gpu_kernels.compaction import compact_bits, compact_hits_cuda
from gpu_kernels.cuda_support import LaunchConfig
from tests import strategies
from tests.test_cuda_sim import (EVENTS, EXPRESSIONS, SIMULATED, _on_device, _to_device_input, compiled, host,
                                 launches, needs_cuda)
from tests.test_opindex import ARROW_TYPES, HYPOTHESIS, SCHEMA, oracle_matches, run_matcher

pytestmark = [pytest.mark.cuda, needs_cuda]

#: a block of two threads: one unit (two ranges) per round, so every event takes many rounds
TINY = LaunchConfig(block=(2, 1), max_grid=(3, 1), compaction_tile=64)


def cuda_matcher(segment, **options):
    from engine.algorithms.opindex_cuda import OpIndexCudaMatcher
    return OpIndexCudaMatcher(segment, "cuda", **options)


def cpu_pairs(segment, batch, truth, alive, **options):
    e, p = OpIndexMatcher(segment, "cpu", **options).match(batch, truth, alive)
    return e.tolist(), p.tolist()


def merged_index(backend, exprs, **kw):
    index = Index(algorithm="opindex", backend=backend, schema=SCHEMA, **kw)
    index.add_many(range(len(exprs)), exprs)
    index.merge()
    index.match({})
    return index


# ================================================================= kernels
@pytest.mark.parametrize("launch", launches(), ids=["default", "tiny"])
def test_bit_compaction_matches_cpu_twin(launch):
    """The bit-matrix count and fill kernels give the CPU twin's pairs:
    every set bit, ascending by row then column, across word and tile
    boundaries, empty rows included."""
    rng = np.random.default_rng(5)
    bits = np.zeros((5, 3), np.uint64)
    for row, col in zip(rng.integers(0, 5, 40), rng.integers(0, 192, 40)):
        bits[row, col >> 6] |= np.uint64(1) << np.uint64(col & 63)
    bits[2] = 0
    bits[4, 2] = np.uint64(0xFFFFFFFFFFFFFFFF)
    want_rows, want_cols = np.nonzero(np.unpackbits(bits.view(np.uint8), axis=1, bitorder="little"))
    rows, cols = compact_bits(bits, 5, 10)
    assert rows.tolist() == (want_rows + 10).tolist() and cols.tolist() == want_cols.tolist()
    d_rows, d_cols = compact_hits_cuda(cuda_support.to_device(bits), 5, 10, launch=launch)
    assert host(d_rows).tolist() == rows.tolist() and host(d_cols).tolist() == cols.tolist()


@pytest.mark.parametrize("launch,builds", [
    (None, ({}, {"variant": "bs"}, {"dnf_limit": 2}, {"segments": 1, "signature_bits": 2, "operand_ranks": False})),
    (TINY, ({"dnf_limit": 2},))], ids=["default", "tiny"])
def test_opindex_kernel_matches_cpu_twin_on_every_route(launch, builds):
    """Plain conjunctions, DNF, CNF (dnf_limit=2), IS NULL checked at
    counter 0, the always-checked list, PREFIX and VERIFY lists, IN and
    BETWEEN rewrites: the cuda matcher's pairs equal the CPU kernel's, for
    both variants and with tombstones."""
    seg, batch, truth = compiled()
    alive = np.ones(len(seg), np.uint8)
    options = {} if launch is None else {"launch": launch}
    for build in builds:
        want = cpu_pairs(seg, batch, truth, alive, **build)
        matcher = cuda_matcher(seg, **build, **options)
        e, p = matcher.match(batch, truth, alive)
        assert (e.tolist(), p.tolist()) == want, build
    assert len(want[0]) > 10
    alive[[0, 3, 7]] = 0
    e, p = cuda_matcher(seg, **builds[-1], **options).match(batch, truth, alive)
    assert (e.tolist(), p.tolist()) == cpu_pairs(seg, batch, truth, alive, **builds[-1])
    assert not set(p.tolist()) & {0, 3, 7}


def test_counters_in_shared_or_global_memory_give_the_same_pairs():
    """Partitions whose counters fit shared memory, partitions that do not
    (counters in the global scratch: a second launch), and the mix."""
    seg, batch, truth = compiled()
    alive = np.ones(len(seg), np.uint8)
    want = cpu_pairs(seg, batch, truth, alive, dnf_limit=2)
    for limit in (0, 16):
        matcher = cuda_matcher(seg, dnf_limit=2, shared_memory=limit)
        n_parts = len(matcher.host.part_counter_start) - 1
        in_shared = int(host(matcher.part_in_shared)[:n_parts].sum())
        assert (in_shared == 0) if limit == 0 else (0 < in_shared < n_parts)
        e, p = matcher.match(batch, truth, alive)
        assert (e.tolist(), p.tolist()) == want, limit


def test_block_threads_follow_the_chunk_event_width():
    """The block size per chunk: enough threads for the 90th-percentile
    event's units in one round (16 per attribute), within the bounds."""
    from engine.algorithms.opindex_cuda import GPU_THREADS, block_threads
    assert block_threads(np.full(100, 15), *GPU_THREADS) == 256        # W1's events
    assert block_threads(np.full(100, 30), *GPU_THREADS) == 512        # W2's events
    assert block_threads(np.full(100, 200), *GPU_THREADS) == 512
    assert block_threads(np.array([1] * 95 + [40] * 5), *GPU_THREADS) == 256
    assert block_threads(np.zeros(0, np.int64), *GPU_THREADS) == 256
    assert block_threads(np.full(3, 30), 64, 64) == 64


def test_block_size_chosen_per_chunk_gives_the_same_pairs(monkeypatch):
    """With a (low, high) thread range, a batch of narrow events and one of
    wide events launch different block sizes -- the CPU's pairs either way."""
    from engine.algorithms import opindex_cuda
    sizes = []
    real = opindex_cuda.opindex_kernel_cuda
    monkeypatch.setattr(opindex_cuda, "opindex_kernel_cuda", lambda *a, **k: sizes.append(a[1]) or real(*a, **k))
    for events, threads in (([{"n0": 1}, {"s0": "ab"}], 16), (EVENTS, 32)):   # 1 attribute; p90 of 4
        seg, batch, truth = compiled(EXPRESSIONS, events)
        alive = np.ones(len(seg), np.uint8)
        sizes.clear()
        e, p = cuda_matcher(seg, dnf_limit=2, threads=(4, 32)).match(batch, truth, alive)
        assert (e.tolist(), p.tolist()) == cpu_pairs(seg, batch, truth, alive, dnf_limit=2)
        assert set(sizes) == {threads}
    for bad in (3, (8, 4), 2048, (1, 4)):      # (checked by OpIndexOptions, as Index options are)
        with pytest.raises(ValueError, match="threads must be a power of two in"):
            cuda_matcher(seg, threads=bad)


def test_opindex_cuda_runs_every_route_of_the_paper_example():
    """The routes are really taken: the segment has plain, DNF, CNF and
    always-checked subscriptions, IS NULL tests and prefix entries."""
    seg, batch, truth = compiled(EXPRESSIONS + ["n0 IS NULL", "s1 LIKE 'ab%' AND n1 IS NULL"])
    matcher = cuda_matcher(seg, dnf_limit=2)
    host_index = matcher.host
    assert host_index.form_counts["cnf"] and host_index.form_counts["always"] and host_index.form_counts["dnf"]
    assert len(host_index.post_attr) and len(host_index.always_pos)
    alive = np.ones(len(seg), np.uint8)
    e, p = matcher.match(batch, truth, alive)
    assert (e.tolist(), p.tolist()) == cpu_pairs(seg, batch, truth, alive, dnf_limit=2)


def test_sort_and_segment_counting_gives_the_atomic_pairs(monkeypatch):
    """``counting="sort"`` (count pass, emit pass, device sort, segments):
    the CPU kernel's pairs on every route -- plain, DNF, CNF clauses that
    several predicates satisfy, IS NULL, always-checked, PREFIX/VERIFY --
    with tombstones, and with a room so small that every work item is
    sorted as a group of its own."""
    from engine.algorithms import opindex_cuda
    exprs = EXPRESSIONS + ["n0 IS NULL", "s1 LIKE 'ab%' AND n1 IS NULL",
                           "(n0 = 1 OR n1 = 1) AND (s0 = 'ab' OR s1 = 'zb')"]
    seg, batch, truth = compiled(exprs)
    alive = np.ones(len(seg), np.uint8)
    for build in ({"variant": "bs"}, {"dnf_limit": 2}):
        want = cpu_pairs(seg, batch, truth, alive, **build)
        e, p = cuda_matcher(seg, counting="sort", **build).match(batch, truth, alive)
        assert (e.tolist(), p.tolist()) == want, build
    assert len(want[0]) > 10
    seg, batch, truth = compiled(exprs, EVENTS[:2])
    matcher = cuda_matcher(seg, counting="sort", dnf_limit=2)
    assert matcher.host.form_counts["cnf"] and len(matcher.host.always_pos) and len(matcher.host.post_attr)
    groups = []
    real = opindex_cuda.sort_and_segment
    monkeypatch.setattr(opindex_cuda, "sort_and_segment", lambda keys, *a: groups.append(len(a[2])) or real(keys, *a))
    monkeypatch.setattr(opindex_cuda, "SORT_BYTES_PER_KEY", 1 << 40)
    alive[[0, 3, 7]] = 0
    e, p = matcher.match(batch, truth, alive)
    assert (e.tolist(), p.tolist()) == cpu_pairs(seg, batch, truth, alive, dnf_limit=2)
    assert len(groups) > 3 and set(groups) == {1}
    with pytest.raises(ValueError, match="counting must be one of 'atomic', 'sort'"):
        cuda_matcher(seg, counting="radix")


def test_sort_and_segment_counts_runs_and_collapses_clauses():
    """The glue alone: keys of two items over counters of widths 3 (+2
    clause slots); a counter is satisfied when its run is as long as its
    initial value, a clause's repeated keys count once, -1 keys are
    dropped."""
    from gpu_kernels.opindex.cuda import sort_and_segment
    dev = cuda_support.to_device
    counter_width, stride = 3, 5
    part_counter_start = np.array([0, 3, 6], np.int64)
    part_slot_start = np.array([0, 2, 4], np.int32)
    slot_counter = np.array([1, 1, 3, 5], np.int32)       # clause slots -> global counters
    counter_init = np.array([2, 2, 1, 1, 3, 2], np.int32)
    item_part = np.array([0, 1], np.int32)
    keys = np.array([-1, 0, 0, 1, 3, 3, 4,                # item 0: counter 0 twice, counter 1 once, clause 0 x2, 1
                     5 + 0, 5 + 3, 5 + 4, 5 + 4, 5 + 2, -1], np.int64)  # item 1: counter 3 once, clauses 2 and 3
    items, counters = sort_and_segment(dev(keys), stride, counter_width, dev(item_part), dev(part_counter_start),
                                       dev(part_slot_start), dev(slot_counter), dev(counter_init))
    # item 0: counter 0 (2 of 2), counter 1 (1 direct + clause 0 + clause 1 = 3 > 2: not exactly -> no)
    # item 1: counter 3 (1 of 1), counter 5 (local 2 direct + clause 3 -> 2 of 2); clause 2 -> counter 3 again (2 != 1)
    got = sorted(zip(host(items).tolist(), host(counters).tolist()))
    assert got == [(0, 0), (1, 5)]


# ============================================================ differential
@settings(max_examples=8, **HYPOTHESIS)
@given(exprs=st.lists(strategies.expressions(max_leaves=6, with_not_matches=True).filter(strategies.fits_normal_form), min_size=1, max_size=8),
       events=st.lists(strategies.events(), min_size=1, max_size=3),
       data=st.data())
def test_opindex_cuda_agrees_with_cpu_reference_and_duckdb(exprs, events, data):
    expected = oracle_matches(exprs, events)
    on_cpu = merged_index("cpu", exprs)
    on_cuda = merged_index("cuda", exprs)
    assert [m.tolist() for m in on_cpu.match_batch(events)] == expected
    assert [m.tolist() for m in on_cuda.match_batch(events)] == expected
    table = pa.table({a: pa.array([e.get(a) for e in events], ARROW_TYPES[f]) for a, f in SCHEMA.items()})
    assert [m.tolist() for m in on_cuda.match_batch(table)] == expected
    seg = on_cuda._main
    # OpIndex-BS, the CNF and always-checked routes, collisions in 2-bit signatures
    build = data.draw(st.sampled_from([{"variant": "bs"}, {"dnf_limit": 2}, {"dnf_limit": 2, "counting": "sort"},
                                       {"segments": 1, "signature_bits": 2, "operand_ranks": False}]))
    assert run_matcher(cuda_matcher(seg, schema=on_cuda.schema, launch=TINY, **build), on_cuda, events) == expected
    removed = data.draw(st.sets(st.integers(0, len(exprs) - 1), max_size=len(exprs) - 1))
    for i in sorted(removed):      # tombstones: the cleared alive flags reach the device
        on_cuda.remove(i)
    assert [m.tolist() for m in on_cuda.match_batch(events)] == [[i for i in m if i not in removed]
                                                                  for m in expected]


# ================================================================= matcher
def test_chunks_small_budgets_device_batches_and_device_output(caplog):
    seg, batch, truth = compiled()
    alive = np.ones(len(seg), np.uint8)
    want = cpu_pairs(seg, batch, truth, alive)
    matcher = cuda_matcher(seg)
    fixed = matcher._fixed_bytes() + truth.nbytes + alive.nbytes + 16 * len(seg)
    widest = int(np.diff(batch.offsets).max())
    n_chunks = []
    for budget in (fixed + 64 + 32 * widest, fixed + 4096, None):    # one event a chunk, a few, all
        caplog.clear()
        with caplog.at_level("DEBUG", logger="engine.algorithms.cuda_base"):
            e, p = cuda_matcher(seg, device_memory=budget).match(batch, truth, alive)
        assert (e.tolist(), p.tolist()) == want, budget
        chunks = [r for r in caplog.records if r.levelname == "DEBUG" and "chunk" in r.getMessage()]
        summary = [r.getMessage() for r in caplog.records if r.levelname == "INFO"]
        # every chunk logged at DEBUG; a batch split into several said once at INFO
        assert chunks and (summary == [] if len(chunks) == 1 else
                           summary == [f"opindex/cuda: {len(batch.offsets) - 1} events against {len(seg)} "
                                       f"subscriptions matched in {len(chunks)} chunks (device memory budget "
                                       f"{budget} bytes)"]), budget
        n_chunks.append(len(chunks))
    assert n_chunks[0] > 1 == n_chunks[-1]      # the smallest budget splits the batch, the default does not
    e, p = cuda_matcher(seg).match(_on_device(batch), _to_device_input(truth), _to_device_input(alive),
                                   output="device")
    assert type(e) is type(cuda_support.array_module().zeros(0))   # CuPy on a GPU
    assert (host(e).tolist(), host(p).tolist()) == want
    # a device batch matched in chunks: each chunk's offsets taken in place
    e, p = cuda_matcher(seg, device_memory=fixed + 64 + 32 * widest).match(_on_device(batch), truth, alive)
    assert (e.tolist(), p.tolist()) == want


def test_index_on_cuda_defaults_to_opindex_and_keeps_results_on_device():
    index = Index(backend="cuda")
    assert index.algorithm == "opindex"
    index.add_many([3, 1], ["a > 1 AND b = 'x'", "a IS NULL OR b LIKE 'y%'"])
    index.merge()
    index.add(2, "a = 5")                      # stays in the delta (matched on the host)
    events = [{"a": 5, "b": "x"}, {"b": "yes"}, {"a": 0}]
    event_idx, sub_ids = index.match_batch(events, output="device")
    assert list(zip(host(event_idx).tolist(), host(sub_ids).tolist())) == [(0, 2), (0, 3), (1, 1)]
    assert [m.tolist() for m in index.match_batch(events)] == [[2, 3], [1], []]


def test_grown_dictionary_reaches_the_device(tmp_path):
    """New strings recode the operands; the device copy follows.  An index
    saved on one backend loads on the other with the same results."""
    index = Index(algorithm="opindex", backend="cuda")
    index.add_many([1, 2], ["s = 'm'", "s > 'k' AND s < 'p'"])
    index.merge()
    assert [m.tolist() for m in index.match_batch([{"s": "m"}, {"s": "n"}])] == [[1, 2], [2]]
    index.add_many([3], ["s = 'l'"])          # 'l' enters the dictionary between 'k' and 'm'
    assert [m.tolist() for m in index.match_batch([{"s": "m"}, {"s": "l"}, {"s": "z"}])] == [[1, 2], [2, 3], []]
    path = tmp_path / "idx.bex"
    index.save(path)
    on_cpu = Index.load(path, backend="cpu")
    assert on_cpu.backend == "cpu"
    assert [m.tolist() for m in on_cpu.match_batch([{"s": "l"}])] == [[2, 3]]


def test_merges_derive_the_device_index_from_the_last_one(monkeypatch):
    """Adds and removals folded by a merge reach the device through the
    host index's derivation (no full rebuild), with the reference's answers."""
    exprs = EXPRESSIONS[:8]
    index = merged_index("cuda", exprs)
    first = index._matcher
    events = EVENTS[:4]
    monkeypatch.setattr(OpIndexMatcher, "_build", lambda self: pytest.fail("full rebuild"))
    index.remove(2)
    index.add_many([20, 21], [EXPRESSIONS[9], "n0 >= 1 AND s0 LIKE 'c%'"])
    index.merge()
    got = [m.tolist() for m in index.match_batch(events)]
    assert index._matcher is not first and index._matcher.host.merges == 1
    ids = [i for i in range(8) if i != 2] + [20, 21]
    texts = [exprs[i] for i in range(8) if i != 2] + [EXPRESSIONS[9], "n0 >= 1 AND s0 LIKE 'c%'"]
    assert got == [sorted(i for i, t in zip(ids, texts) if matches(parse(t), e)) for e in events]


def test_cuda_path_errors_are_the_cpu_ones():
    from engine.algorithms.opindex_cuda import OpIndexCudaMatcher
    from engine.backend import DeviceMemoryError
    seg, batch, truth = compiled()
    alive = np.ones(len(seg), np.uint8)
    matcher = cuda_matcher(seg)
    with pytest.raises(TypeError, match="'attr' must have dtype int32, got int64"):
        wrong = type(batch)(batch.offsets, batch.attr.astype(np.int64), batch.value, batch.token, batch.strings)
        matcher.match(wrong, truth, alive)
    with pytest.raises(ValueError, match="alive has 3 flags for a segment of 11 subscriptions"):
        matcher.match(batch, truth, alive[:3])
    with pytest.raises(ValueError, match="pattern_truth has 1 pattern columns"):
        matcher.match(batch, truth[:, :1].copy(), alive)
    with pytest.raises(DeviceMemoryError, match=r"event \d+ of the batch cannot fit.*result bit row of 8 bytes"):
        cuda_matcher(seg, device_memory=300).match(batch, truth, alive)
    with pytest.raises(ValueError, match="runs on backend 'cuda'"):
        OpIndexCudaMatcher(seg, "cpu")
    with pytest.raises(ValueError, match="power-of-two number of threads"):
        cuda_matcher(seg, launch=LaunchConfig(block=(3, 1)))
    with pytest.raises(ValueError, match="shared_memory must be"):
        cuda_matcher(seg, shared_memory=-1)
    with pytest.raises(ValueError, match="variant must be 'full' or 'bs'"):
        cuda_matcher(seg, variant="fast")


# ============================================================ real hardware
@pytest.mark.skipif(SIMULATED, reason="full-size runs need real GPU hardware (the simulator runs each thread "
                                      "in Python)")
class TestFullSize:
    """opindex on cuda against opindex on cpu at sizes only a GPU runs quickly."""

    @pytest.mark.parametrize("name,scale", [("W1", 0.05), ("W2", 0.05), ("W3", 0.2), ("W4", 0.01)])
    def test_standard_workloads_agree_with_cpu(self, name, scale):
        from engine.workloads import standard
        workload = standard(name, scale=scale, n_events=3000)
        results = {}
        for backend, options in (("cpu", {}), ("cuda", {}), ("cuda-sort", {"counting": "sort"})):
            index = Index(algorithm="opindex", backend=backend.split("-")[0], options=options)
            index.add_many(workload.subscriptions)
            index.merge()
            results[backend] = index.match_batch(workload.events, output="arrow")
        assert results["cpu"].num_rows > 0
        assert results["cuda"].equals(results["cpu"])
        assert results["cuda-sort"].equals(results["cpu"])

    def test_random_expressions_in_chunks(self):
        rng = np.random.default_rng(12)
        joins = (" AND ", " OR ", " XOR ", " AND NOT ")
        n_subs, n_events = 5000, 400
        exprs = [f"({EXPRESSIONS[a]}){joins[j]}({EXPRESSIONS[b]})"
                 for a, j, b in zip(rng.integers(0, len(EXPRESSIONS), n_subs), rng.integers(0, len(joins), n_subs),
                                    rng.integers(0, len(EXPRESSIONS), n_subs))]
        events = [EVENTS[k] for k in rng.integers(0, len(EVENTS), n_events)]
        seg, batch, truth = compiled(exprs, events)
        alive = (rng.random(len(seg)) < 0.9).astype(np.uint8)
        want = cpu_pairs(seg, batch, truth, alive)
        assert len(want[0]) > n_events
        for budget in (None, 4 << 20, 1 << 20):
            e, p = cuda_matcher(seg, device_memory=budget).match(batch, truth, alive)
            assert (e.tolist(), p.tolist()) == want
            e, p = cuda_matcher(seg, device_memory=budget, counting="sort").match(batch, truth, alive)
            assert (e.tolist(), p.tolist()) == want
