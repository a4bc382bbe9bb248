"""``apcm`` on the ``cuda`` backend: each kernel against its CPU twin (the
encoding's pointers and bits, the compressed events' ORs, the matches), the
matcher against the cpu A-PCM and ``scan`` on similar event streams under
several variants and cluster sizes, merges reaching the device (overflow
bits included), the frontier queue's spill path, and the cuda path's errors
(the kernels' PTX for a real GPU: tests/test_cuda_sim.py's PTX check).

Runs on a GPU, or without one under numba's CUDA simulator::

    NUMBA_ENABLE_CUDASIM=1 pytest -m cuda tests/test_apcm_cuda.py

Sizes are tiny (the simulator runs every thread in Python); the Index on
cuda through every life cycle is tests/test_conformance.py's.
"""

from __future__ import annotations

import numpy as np
import pytest

from engine import Index
from engine import events as event_batches
from engine.algorithms.apcm import APCMMatcher
from engine.algorithms.scan import ScanMatcher
from engine.parse import parse
from engine.reference import matches
from engine.workloads import begen
from gpu_kernels import cuda_support
from gpu_kernels.apcm import cpu as C
from gpu_kernels.apcm.layout import words
from gpu_kernels.cuda_support import LaunchConfig
from tests.test_apcm import DEEP_PCM, SIMILAR_EVENTS, cpu_stages, slice_words_at
from tests.test_betree_cuda import LEAF_CHECKS
from tests.test_cuda_sim import EVENTS, EXPRESSIONS, SCHEMA, _on_device, _to_device_input, compiled, host, needs_cuda

pytestmark = [pytest.mark.cuda, needs_cuda]

#: a block of two threads over a grid of three blocks: batches of two c-nodes, many rounds per cluster
TINY = LaunchConfig(block=(2, 1), max_grid=(3, 1), compaction_tile=64)


def cuda_matcher(segment, **options):
    from engine.algorithms.apcm_cuda import APCMCudaMatcher
    return APCMCudaMatcher(segment, "cuda", **options)


def pairs(matcher, batch, truth, alive):
    e, p = matcher.match(batch, truth, alive)
    return e.tolist(), p.tolist()


def host_pairs(segment, batch, truth, alive, **options):
    """(cpu A-PCM's pairs, scan's pairs): what the cuda matcher must give."""
    return pairs(APCMMatcher(segment, "cpu", **options), batch, truth, alive), \
        pairs(ScanMatcher(segment, "cpu"), batch, truth, alive)


def recorded_launches(monkeypatch):
    """Every launch of the match kernel: (blocks, clusters listed, spill entries per block)."""
    from gpu_kernels.apcm import cuda as K
    calls = []
    real = K.match_clusters_cuda

    def launch(*args):
        calls.append((args[0], int(args[3]), int(args[-3])))
        return real(*args)
    monkeypatch.setattr(K, "match_clusters_cuda", launch)
    return calls


# ================================================================= kernels
def _check_stages(m: APCMMatcher, batch, truth):
    """Stages 1 and 2 on the device against the cpu's: the same pointers
    into the table, the same evaluated words, the same compressed entries
    (attributes, absence, keys) and ORed slices, cluster by cluster."""
    from engine.algorithms.apcm_cuda import APCMCudaMatcher
    from gpu_kernels.apcm import cuda as K
    lay = m.layout
    clusters, ev_key, n_entry, store_at, e_main, e_over, store, cpu_ce = cpu_stages(m, batch, truth)
    dev = cuda_support.to_device
    matcher = APCMCudaMatcher.__new__(APCMCudaMatcher)
    matcher._configure(TINY, None, K.QUEUE_CAPACITY)
    matcher._attach(m)
    n = len(batch.attr)
    d_main, d_over = dev(np.zeros(n, np.int64)), dev(np.zeros(n, np.int64))
    ent = K.ClusterEntries(*map(host, K.cluster_entries(clusters.off, clusters.perm, batch.offsets, batch.attr,
                                                        ev_key, lay.main_bits, lay.over_bits)))
    n_or = int(ent.job_word_off[-1])
    d_store = dev(np.zeros(n_entry + n_or + 1, np.uint64))
    K.encode_entries_cuda(2, 3, dev(batch.attr), dev(batch.value), dev(batch.token), dev(store_at),
                          matcher.bitmap_d, matcher.rows_d, dev(truth), dev(batch.list_truth), d_main, d_over, d_store)
    d_main, d_over = host(d_main), host(d_over)
    assert d_main.tolist() == e_main.tolist() and d_over.tolist() == e_over.tolist()
    assert host(d_store)[:n_entry].tolist() == store[:n_entry].tolist()
    K.or_slices_cuda(2, 3, n_or, n_entry, *(dev(getattr(ent, f)) for f in ("job_word_off", "job_ce", "job_kind",
                                                                           "mem_off", "mem_k")),
                     dev(d_main), dev(d_over), matcher.bitmap_d.table, d_store)
    d_store = host(d_store)
    ce_start, ce_end, ce_attr, ce_main, ce_over, ce_absent, ce_key_end, ce_keys = cpu_ce
    compared = 0
    for c in range(clusters.n_clusters):
        mine = range(ent.ce_off[c], ent.ce_off[c + 1])
        theirs = range(ce_start[c], ce_end[c])
        assert ent.ce_attr[mine.start:mine.stop].tolist() == ce_attr[theirs.start:theirs.stop].tolist()
        assert ent.ce_absent[mine.start:mine.stop].tolist() == ce_absent[theirs.start:theirs.stop].tolist()
        for q, r in zip(mine, theirs):
            key0 = ce_start[c] if r == ce_start[c] else ce_key_end[r - 1]
            assert ent.ce_keys[ent.ce_key_off[q]:ent.ce_key_off[q + 1]].tolist() == ce_keys[key0:ce_key_end[r]].tolist()
            a = int(ce_attr[r])
            if a >= lay.n_attrs:
                continue
            for kind, cpu_ptr in enumerate((ce_main[r], ce_over[r])):
                n_w = int(words((lay.main_bits if kind == 0 else lay.over_bits)[a]))
                if ent.ce_src[q] >= 0:
                    ptr = (d_main if kind == 0 else d_over)[ent.ce_src[q]]
                else:
                    rel = ent.ce_or[q, kind]
                    ptr = C.NO_SLICE if rel < 0 else -2 - (n_entry + rel)
                    compared += rel >= 0
                assert slice_words_at(ptr, n_w, lay.table, d_store) == slice_words_at(cpu_ptr, n_w, lay.table, store)
    return compared, clusters


def reference_cluster_entries(cl_off, perm, ev_offsets, ev_attr, ev_key, main_bits, over_bits) -> dict:
    """:func:`gpu_kernels.apcm.cuda.cluster_entries` one cluster at a time,
    in plain Python: a singleton's entries each its own compressed entry;
    a cluster of several's entries by attribute, then key (ties in member
    order), one compressed entry per attribute with its distinct keys and
    its members, and an OR job per slice the layout gives the attribute."""
    out = {name: [] for name in ("ce_attr", "ce_absent", "ce_keys", "ce_src", "ce_or", "mem_k", "job_ce",
                                 "job_kind")}
    ce_off, key_off, mem_off, word_off = [0], [0], [0], [0]
    for c in range(len(cl_off) - 1):
        members = [int(e) for e in perm[cl_off[c]:cl_off[c + 1]]]
        entries = [k for e in members for k in range(ev_offsets[e], ev_offsets[e + 1])]
        if len(members) == 1:
            runs = [[k] for k in entries]
        else:
            entries.sort(key=lambda k: (int(ev_attr[k]), int(ev_key[k])))      # (a stable sort)
            runs = []
            for k in entries:
                if runs and ev_attr[runs[-1][-1]] == ev_attr[k]:
                    runs[-1].append(k)
                else:
                    runs.append([k])
        for run in runs:
            n_ce = len(out["ce_attr"])
            a = int(ev_attr[run[0]])
            out["ce_attr"].append(a)
            out["ce_absent"].append(int(len(members) > 1 and len(run) < len(members)))
            out["ce_keys"] += sorted({int(ev_key[k]) for k in run})
            key_off.append(len(out["ce_keys"]))
            out["ce_src"].append(run[0] if len(members) == 1 else -1)
            ors = [-1, -1]
            if len(members) > 1:
                out["mem_k"] += run
                for kind, bits in enumerate((main_bits, over_bits)):
                    if a < len(bits) and bits[a] > 0:
                        ors[kind] = word_off[-1]
                        out["job_ce"].append(n_ce)
                        out["job_kind"].append(kind)
                        word_off.append(word_off[-1] + (int(bits[a]) + 63) // 64)
            mem_off.append(len(out["mem_k"]))
            out["ce_or"].append(ors)
        ce_off.append(len(out["ce_attr"]))
    out.update(ce_off=ce_off, ce_key_off=key_off, mem_off=mem_off, job_word_off=word_off)
    return out


@pytest.mark.parametrize("seed", range(6))
def test_cluster_bookkeeping_on_the_device_is_the_clusters_one_by_one(seed):
    """The compressed entries made by array operations on the device (CuPy's
    stable sorts and cumulative sums) against a cluster-by-cluster Python
    reference: singletons and clusters of several, members without entries,
    an attribute repeated in an event (a list's), keys equal across members,
    attributes beyond the layout's, attributes without an overflow slice --
    and a chunk with no entries at all."""
    from gpu_kernels.apcm import cuda as K
    rng = np.random.default_rng(seed)
    n_events, n_attrs = int(rng.integers(1, 40)), 5
    lengths = rng.integers(0, 5, n_events) if seed else np.zeros(n_events, np.int64)
    ev_offsets = np.concatenate(([0], np.cumsum(lengths))).astype(np.int64)
    ev_attr = rng.integers(0, n_attrs + 2, int(ev_offsets[-1])).astype(np.int32)
    ev_key = rng.integers(0, 4, int(ev_offsets[-1])).astype(np.uint64) << np.uint64(61)
    main_bits = rng.choice([0, 3, 64, 130], n_attrs).astype(np.int64)
    over_bits = rng.choice([0, 0, 1, 65], n_attrs).astype(np.int64)
    perm = rng.permutation(n_events).astype(np.int64)
    sizes = []
    while sum(sizes) < n_events:
        sizes.append(int(min(rng.choice([1, 1, 2, 3, 8]), n_events - sum(sizes))))
    cl_off = np.concatenate(([0], np.cumsum(sizes))).astype(np.int64)
    want = reference_cluster_entries(cl_off, perm, ev_offsets, ev_attr, ev_key, main_bits, over_bits)
    got = K.cluster_entries(*(cuda_support.to_device(x) for x in (cl_off, perm, ev_offsets, ev_attr, ev_key,
                                                                   main_bits, over_bits)))
    n_ce = len(want["ce_attr"])
    assert int(host(got.ce_off)[-1]) == n_ce
    for name, values in want.items():
        have = host(getattr(got, name))
        if name == "ce_or":
            have = have.reshape(-1, 2)
        assert have[:len(values)].tolist() == values, name       # (an empty array: one padding element)
    if seed:
        assert any(want["ce_absent"]) and len(want["job_ce"]) and min(want["ce_src"], default=0) == -1


def test_encoding_and_compression_kernels_match_cpu():
    """Tabled attributes (pointers into the table rows), evaluated ones
    (LIKE/MATCHES: bits in the store), clusters of several members (their
    ORs, absent members, distinct keys) -- the cpu stages' exact slices."""
    seg, batch, truth = compiled(EXPRESSIONS + LEAF_CHECKS, SIMILAR_EVENTS)
    m = APCMMatcher(seg, "cpu", **DEEP_PCM)
    st = m.layout.statistics()
    assert st["tabled_attributes"] and st["evaluated_attributes"]
    compared, clusters = _check_stages(m, batch, truth)
    assert compared > 3 and clusters.compressed_events() >= 6


def test_encoding_of_overflow_bits_after_a_merge():
    """A merge that adds a few predicates keeps the layout and puts them in
    overflow bits: the device encodes and ORs them as the cpu does, and
    the matches (reference evaluator's) use them."""
    exprs = [f"n0 BETWEEN {i} AND {i + 2} AND s0 != 'x{i}'" for i in range(8)] + \
        [f"n1 = {i} OR n2 > {i}" for i in range(8)]
    index = Index(algorithm="apcm", backend="cuda", schema=SCHEMA, options=DEEP_PCM)
    index.add_many(list(range(len(exprs))), exprs)
    index.merge()
    events = [{"n0": 3, "s0": "x3", "n1": 2, "n2": 1}, {"n0": 4, "s0": "x1", "n1": 2}, {"n0": 9, "n2": 9},
              {"n0": 3, "s0": "x2", "n1": 5, "n2": 1}, {"n1": 0}, {"n0": 1.5, "s0": "x0"}, {"n0": 6, "n1": 2}]
    index.match_batch(events)
    first = index._matcher
    added = ["n0 > 5 AND n1 = 2", "n2 < 3"]
    index.add_many([100, 101], added)
    index.merge()
    texts = dict(zip(list(range(len(exprs))) + [100, 101], exprs + added))
    got = [m.tolist() for m in index.match_batch(events)]
    assert got == [sorted(i for i, t in texts.items() if matches(parse(t), e)) for e in events]
    merged = index._matcher
    assert merged.host.layout_rebuilt is False and int(merged.host.layout.over_bits.sum()) >= 2
    assert merged.index_d is not first.index_d and merged.bitmap_d is not first.bitmap_d
    # the kernels on their own against the cpu stages, overflow bits included
    batch = event_batches.encode_events(events, index._schema, "raise")
    pairs_ = merged.segment.predicates.pattern_pairs()
    truth = event_batches.pattern_truth(batch, index._state.view, pairs_)
    assert _check_stages(merged.host, batch, truth)[0] > 0


@pytest.mark.parametrize("options,launch", [({}, None), (DEEP_PCM, None), (DEEP_PCM, TINY)],
                         ids=["default", "deep-pcm", "deep-pcm-tiny-blocks"])
def test_matches_cpu_apcm_and_scan(options, launch):
    """The pairs of the cpu A-PCM and of scan: the default tree (everything
    in the root's l-node, default clustering) and the deepest one with
    every cluster compressed, blocks of the simulator's 8 threads and of 2;
    tombstones hide their subscriptions."""
    seg, batch, truth = compiled(EXPRESSIONS + LEAF_CHECKS, SIMILAR_EVENTS)
    alive = np.ones(len(seg), np.uint8)
    matcher = cuda_matcher(seg, **options, **({} if launch is None else {"launch": launch}))
    want, scanned = host_pairs(seg, batch, truth, alive, **options)
    assert want == scanned and len(want[0]) > 20
    assert pairs(matcher, batch, truth, alive) == want
    if options:
        assert matcher.last_clusters.compressed_events() >= 6
        assert matcher.statistics()["compressed_events"] >= 6
    alive[[0, 3, 7, 12]] = 0
    got = pairs(matcher, batch, truth, alive)
    assert got == host_pairs(seg, batch, truth, alive, **options)[1]
    assert not set(got[1]) & {0, 3, 7, 12}


def _begen_index(options, backend, w):
    index = Index(algorithm="apcm", backend=backend, options=options)
    index.add_many(w.subscriptions)
    index.merge()
    return index


@pytest.mark.parametrize("options", [
    {"variant": "apcm", "threshold": 1, "cluster_size": 4, "batch_size": 16},
    {"variant": "pcm", "cluster_size": 3, "max_cap": 2, "min_size": 1},
    {"variant": "pcm", "reorder": False, "unroll": False, "cluster_size": 5},
    {"variant": "parallel", "parallel_paths": False},
], ids=["apcm", "pcm", "pcm-arrival-runs", "parallel"])
def test_similar_streams_match_cpu_and_scan(options):
    """BE-Gen streams with similarity (replicas of seed events): the cuda
    matcher's answers are the cpu A-PCM's and scan's, whatever the variant
    and cluster size."""
    w = begen(30, 12, dims=6, cardinality=6, sub_size=2, event_size=4, similarity=0.8, sorted_stream=True,
              match_prob=0.3, seed=3)
    cuda_index = _begen_index(options, "cuda", w)
    got = [m.tolist() for m in cuda_index.match_batch(w.events)]
    assert got == [m.tolist() for m in _begen_index(options, "cpu", w).match_batch(w.events)]
    scan = Index(algorithm="scan")
    scan.add_many(w.subscriptions)
    assert got == [m.tolist() for m in scan.match_batch(w.events)]
    assert sum(map(len, got)) > 10
    if options["variant"] != "parallel":
        assert cuda_index._matcher.last_clusters.compressed_events() > 0


def test_statistics_count_the_clusters_of_every_chunk(monkeypatch):
    """A batch matched in several chunks (here the pipeline's: chunks of 4
    events, the re-ordering's batches of 4 too) reports the clusters of all
    of them, as the cpu matcher does for the whole batch, not the last
    chunk's alone."""
    from engine.algorithms import cuda_base
    monkeypatch.setattr(cuda_base.ChunkedCudaMatcher, "pipeline_min_events", 4)
    w = begen(30, 16, dims=6, cardinality=6, sub_size=2, event_size=4, similarity=0.8, sorted_stream=True,
              match_prob=0.3, seed=3)
    options = {"variant": "pcm", "cluster_size": 2, "adaptive": False, "batch_size": 4}
    cuda_index, cpu_index = _begen_index(options, "cuda", w), _begen_index(options, "cpu", w)
    assert [m.tolist() for m in cuda_index.match_batch(w.events)] == [m.tolist() for m in
                                                                     cpu_index.match_batch(w.events)]
    on_cuda, on_cpu = cuda_index._matcher.statistics(), cpu_index._matcher.statistics()
    assert on_cuda["clusters"] == on_cpu["clusters"] > cuda_index._matcher.last_clusters.n_clusters
    assert on_cuda["compressed_events"] == on_cpu["compressed_events"]


def test_clusters_beyond_64_members_match_cpu_and_scan():
    """A cluster of more than 64 members (Fig. 9(b) goes to 128): one block
    ORs and checks them all, the answers the cpu A-PCM's and scan's."""
    w = begen(30, 90, dims=6, cardinality=6, sub_size=2, event_size=4, similarity=1.0, group_size=90,
              sorted_stream=True, match_prob=0.3, seed=5)
    options = {"variant": "pcm", "cluster_size": 80, "threshold": 0, "adaptive": False, "batch_size": 90}
    cuda_index = _begen_index(options, "cuda", w)
    got = [m.tolist() for m in cuda_index.match_batch(w.events)]
    assert np.diff(cuda_index._matcher.last_clusters.off).max() == 80
    assert got == [m.tolist() for m in _begen_index(options, "cpu", w).match_batch(w.events)]
    scan = Index(algorithm="scan")
    scan.add_many(w.subscriptions)
    assert got == [m.tolist() for m in scan.match_batch(w.events)]
    assert sum(map(len, got)) > 100


def test_frontier_overflow_spills_to_global_memory(monkeypatch):
    """A shared queue of one c-node under the deepest tree: every cluster
    that reaches more than one c-node overflows it, is abandoned and runs
    again with a spill region in global memory -- the same pairs as the cpu
    A-PCM and scan (a queue that fits needs one pass)."""
    seg, batch, truth = compiled(EXPRESSIONS + LEAF_CHECKS, SIMILAR_EVENTS)
    alive = np.ones(len(seg), np.uint8)
    want, scanned = host_pairs(seg, batch, truth, alive, **DEEP_PCM)
    assert want == scanned
    launches = recorded_launches(monkeypatch)
    matcher = cuda_matcher(seg, **DEEP_PCM, queue_capacity=1)
    assert matcher.spill_cap == len(matcher.host.tree.table.node) > 1
    assert pairs(matcher, batch, truth, alive) == want
    assert len(launches) == 2 and launches[0][2] == 0
    assert 0 < launches[1][1] <= matcher.last_clusters.n_clusters and launches[1][2] == matcher.spill_cap
    launches.clear()
    assert pairs(cuda_matcher(seg, **DEEP_PCM), batch, truth, alive) == want
    assert len(launches) == 1


# ================================================================= matcher
def test_device_output_device_batches_and_chunks(monkeypatch):
    """``output="device"`` keeps the pairs on the device; a batch already on
    the device is matched in place, also one event per chunk."""
    seg, batch, truth = compiled(EXPRESSIONS, EVENTS)
    alive = np.ones(len(seg), np.uint8)
    want = host_pairs(seg, batch, truth, alive, **DEEP_PCM)[0]
    e, p = cuda_matcher(seg, **DEEP_PCM).match(_on_device(batch), _to_device_input(truth), _to_device_input(alive),
                                              output="device")
    assert type(e) is type(cuda_support.array_module().zeros(0))   # CuPy on a GPU
    assert (host(e).tolist(), host(p).tolist()) == want
    matcher = cuda_matcher(seg, **DEEP_PCM)
    row = matcher._event_bytes()[0] + matcher._item_bytes() * int(np.diff(batch.offsets).max())
    budget = matcher._fixed_bytes() + truth.nbytes + alive.nbytes + 16 * len(seg) + row
    launches = recorded_launches(monkeypatch)
    assert pairs(cuda_matcher(seg, **DEEP_PCM, device_memory=budget), _on_device(batch), truth, alive) == want
    assert len(launches) >= batch.n_events - 1        # (the event with no attribute may share a chunk)


def test_merges_reach_the_device(monkeypatch):
    """Removals and adds merged on the host (the tree derived, not rebuilt),
    the new arrays copied over; answers are the reference evaluator's."""
    exprs = ["n0 = 1 AND s0 = 'm'", "s0 > 'k' AND s0 < 'p'", "n1 IN (1, 2) AND s1 LIKE 'a%'", "n0 >= 1",
             "s0 = 'm' OR n1 = 2", "n0 IS NULL AND n1 = 1"]
    ids = list(range(len(exprs)))
    index = Index(algorithm="apcm", backend="cuda", schema=SCHEMA, options={"max_cap": 1, "min_size": 1,
                                                                           "variant": "pcm", "threshold": 0})
    index.add_many(ids, exprs)
    index.merge()
    events = [{"n0": 1, "s0": "m", "n1": 2, "s1": "ab"}, {"s0": "n"}, {"s0": "l", "n0": 3}, {"n1": 1, "s1": "a"},
              {"n0": 1, "s0": "m", "n1": 1}]

    def check():
        texts = dict(zip(ids, exprs))
        assert [m.tolist() for m in index.match_batch(events)] == \
            [sorted(i for i, t in texts.items() if matches(parse(t), e)) for e in events]
    check()
    first = index._matcher
    assert first.device_nbytes > 0

    def no_build(*args, **kwargs):
        pytest.fail("the tree was built from scratch")
    from engine.algorithms.betree import BETreeMatcher
    monkeypatch.setattr(BETreeMatcher, "__init__", no_build)
    index.remove(3)
    del ids[3], exprs[3]
    index.add_many([7, 8], ["s0 >= 'l' AND n0 = 3", "s1 LIKE 'a%' AND n1 = 1"])
    ids += [7, 8]
    exprs += ["s0 >= 'l' AND n0 = 3", "s1 LIKE 'a%' AND n1 = 1"]
    index.merge()
    check()
    merged = index._matcher
    assert merged.host.tree.merges == 1 and merged.index_d is not first.index_d
    assert first.host is not merged.host


def test_cuda_path_errors():
    from engine.algorithms.apcm_cuda import APCMCudaMatcher
    from engine.backend import DeviceMemoryError
    seg, batch, truth = compiled()
    alive = np.ones(len(seg), np.uint8)
    with pytest.raises(ValueError, match="runs on backend 'cuda'"):
        APCMCudaMatcher(seg, "cpu")
    with pytest.raises(ValueError, match=r"queue_capacity must be an integer in \[1, \d+\] for blocks of \d+ threads"):
        cuda_matcher(seg, queue_capacity=0)
    with pytest.raises(ValueError, match="queue_capacity must be an integer"):
        cuda_matcher(seg, queue_capacity=2.5)
    with pytest.raises(ValueError, match="variant must be one of"):
        cuda_matcher(seg, variant="fast")
    with pytest.raises(ValueError, match=r"cluster_size must be an integer in \[1, 128\]"):
        cuda_matcher(seg, cluster_size=0)
    with pytest.raises(ValueError, match="device_memory"):
        cuda_matcher(seg, device_memory=-1)
    with pytest.raises(ValueError, match="alive has 3 flags for a segment of 11 subscriptions"):
        cuda_matcher(seg).match(batch, truth, alive[:3])
    with pytest.raises(DeviceMemoryError, match=r"event \d+ of the batch cannot fit.*result bit row of 8 bytes"):
        cuda_matcher(seg, device_memory=300).match(batch, truth, alive)
    assert repr(cuda_matcher(seg)).startswith("APCMCudaMatcher(11 subscriptions")
