"""``betree`` on the ``cuda`` backend: the kernel against the CPU twin and
``scan``, deep trees and the frontier queue's overflow path, the leaf
checks (IN lists, LIKE/MATCHES, absent attributes), device input and
output, merges and recodes reaching the device (the kernel's PTX for a
real GPU: tests/test_cuda_sim.py's PTX check).

Runs on a GPU, or without one under numba's CUDA simulator::

    NUMBA_ENABLE_CUDASIM=1 pytest -m cuda tests/test_betree_cuda.py

Sizes are tiny (the simulator runs every thread in Python); the Index on
cuda through every life cycle is tests/test_conformance.py's.
"""

from __future__ import annotations

import numpy as np
import pytest

from engine import Index
from engine.algorithms.betree import BETreeMatcher
from engine.algorithms.scan import ScanMatcher
from engine.parse import parse
from engine.reference import matches
from gpu_kernels import cuda_support
from gpu_kernels.cuda_support import LaunchConfig
from tests.test_cuda_sim import (EVENTS, EXPRESSIONS, SCHEMA, _on_device, _to_device_input, compiled, host,
                                 needs_cuda)

pytestmark = [pytest.mark.cuda, needs_cuda]

#: a block of two threads over a grid of three blocks: batches of two c-nodes, many rounds per event
TINY = LaunchConfig(block=(2, 1), max_grid=(3, 1), compaction_tile=64)
#: a tree as deep as BE-Tree gets: one unit per l-node, every attribute worth partitioning on
DEEP = {"max_cap": 1, "min_size": 1}

#: conjunctions (and one DNF) whose leaf checks take every path of the kernel's predicate evaluation
LEAF_CHECKS = [
    "n0 IN (1, 2, 3) AND s0 LIKE 'a%'",
    "n1 NOT IN (0, 1) AND s1 NOT LIKE '%z%'",
    "s0 MATCHES '^c' AND n2 BETWEEN 0 AND 3",
    "s1 IN ('a', 'ba', 'zb') AND n0 IS NULL",
    "n2 NOT BETWEEN 0 AND 1 AND b0 IS NOT NULL",
    "s0 IN ('ab', 'b') AND NOT (s1 MATCHES 'b$')",
    "n0 != 1 AND s0 LIKE '_a%'",
    "(n0 IN (1, 3) AND s0 LIKE 'c%') OR (n1 IN (-1, 7.75) AND s1 IS NOT NULL)",
]


def cuda_matcher(segment, **options):
    from engine.algorithms.betree_cuda import BETreeCudaMatcher
    return BETreeCudaMatcher(segment, "cuda", **options)


def pairs(matcher, batch, truth, alive):
    e, p = matcher.match(batch, truth, alive)
    return e.tolist(), p.tolist()


def host_pairs(segment, batch, truth, alive, **options):
    """(cpu betree's pairs, scan's pairs): what the cuda matcher must give."""
    tree = {k: v for k, v in options.items() if k in ("max_cap", "min_size")}
    return pairs(BETreeMatcher(segment, "cpu", **tree), batch, truth, alive), \
        pairs(ScanMatcher(segment, "cpu"), batch, truth, alive)


def chain_workload():
    """Equalities on values one float64 apart (their keys differ in the
    last bit only): with one unit per l-node the clustering directories
    split down to atomic buckets -- 64-deep bucket chains -- and the atomic
    buckets partition again."""
    a = repr(float(np.nextafter(1.0, 2.0)))
    b = repr(float(np.nextafter(2.0, 3.0)))
    exprs = [f"n0 = {x} AND n1 = {y}" for x in ("1", a) for y in ("2", b)] + [f"n2 = {x}" for x in ("1", a)]
    events = [{"n0": 1.0, "n1": 2.0, "n2": 1.0}, {"n0": float(a), "n1": float(b), "n2": float(a)}]
    return compiled(exprs, events)


def recorded_launches(monkeypatch):
    """Every kernel launch of the cuda matcher: (blocks, events listed, spill entries per block)."""
    from engine.algorithms import betree_cuda
    calls = []
    real = betree_cuda.betree_kernel_cuda

    def launch(*args):
        calls.append((args[0], int(args[3]), int(args[-3])))
        return real(*args)
    monkeypatch.setattr(betree_cuda, "betree_kernel_cuda", launch)
    return calls


# ================================================================= kernel
@pytest.mark.parametrize("options,launch", [({}, None), (DEEP, None), (DEEP, TINY)],
                         ids=["default", "deep", "deep-tiny-blocks"])
def test_betree_cuda_matches_cpu_betree_and_scan(options, launch):
    """The pairs of the cpu BE-Tree and of scan, with the default tree
    (everything in the root's l-node) and the deepest one (one unit per
    l-node: p-directories, clustering directories, DNF subscriptions found
    through several units), blocks of the simulator's 8 threads and of 2;
    tombstones hide their subscriptions."""
    seg, batch, truth = compiled()
    alive = np.ones(len(seg), np.uint8)
    extra = {} if launch is None else {"launch": launch}
    matcher = cuda_matcher(seg, **options, **extra)
    want, scanned = host_pairs(seg, batch, truth, alive, **options)
    assert want == scanned and len(want[0]) > 10
    assert pairs(matcher, batch, truth, alive) == want
    if options:
        stats = matcher.host.statistics()
        assert stats["p_nodes"] > 5 and stats["c_nodes"] > 10
    alive[[0, 3, 7]] = 0
    got = pairs(matcher, batch, truth, alive)
    assert got == host_pairs(seg, batch, truth, alive, **options)[1]
    assert not set(got[1]) & {0, 3, 7}


def test_frontier_overflow_spills_to_global_memory(monkeypatch):
    """64-deep bucket chains; a shared queue of one c-node: every event's
    frontier overflows it, the first pass abandons the event, the second
    runs it again with a spill region in global memory -- the same pairs
    as the cpu BE-Tree and scan (a queue that fits needs one pass)."""
    seg, batch, truth = chain_workload()
    alive = np.ones(len(seg), np.uint8)
    want, scanned = host_pairs(seg, batch, truth, alive, **DEEP)
    assert want == scanned and len(want[0]) >= 4
    launches = recorded_launches(monkeypatch)
    matcher = cuda_matcher(seg, **DEEP, queue_capacity=1)
    assert matcher.host.statistics()["deepest_bucket"] == 64
    assert matcher.spill_cap > 1
    assert pairs(matcher, batch, truth, alive) == want
    assert len(launches) == 2 and launches[0][2] == 0
    assert launches[1][1] == batch.n_events and launches[1][2] == matcher.spill_cap
    launches.clear()
    assert pairs(cuda_matcher(seg, **DEEP), batch, truth, alive) == want
    assert len(launches) == 1


def test_frontier_bound_covers_every_walk():
    """:func:`frontier_bound` bounds the c-nodes an event visits (the
    frontier's size in any order): a walk of the CPU's steps in Python
    counts them, event by event, on the deep tree of every operator."""
    from gpu_kernels.betree.cuda import frontier_bound
    from gpu_kernels.betree.layout import ATOMIC, event_keys
    seg, batch, truth = compiled(EXPRESSIONS + LEAF_CHECKS, EVENTS)
    for options in (DEEP, {"max_cap": 2, "min_size": 1}):
        host_tree = BETreeMatcher(seg, "cpu", **options)
        t = host_tree.tree
        bound = frontier_bound(t.c_depth, t.c_child, t.c_leaf, t.c_pdir, t.p_top)
        keys = event_keys(batch.value, batch.attr, host_tree.string_attr, host_tree.str_map)
        most = 0
        for e in range(batch.n_events):
            attrs = dict(zip(batch.attr[batch.offsets[e]:batch.offsets[e + 1]].tolist(),
                             keys[batch.offsets[e]:batch.offsets[e + 1]].tolist()))
            stack, visited = [0], 0
            while stack:
                c = stack.pop()
                visited += 1
                for k in range(t.c_pdir[c], t.c_pdir[c + 1]):
                    if int(t.p_attr[k]) not in attrs:
                        continue
                    key, d = attrs[int(t.p_attr[k])], int(t.p_top[k])
                    while d >= 0:
                        if t.c_leaf[d + 1] > t.c_leaf[d] or t.c_pdir[d + 1] > t.c_pdir[d]:
                            stack.append(d)
                        if t.c_depth[d] >= ATOMIC:
                            break
                        d = int(t.c_child[2 * d + ((key >> (63 - int(t.c_depth[d]))) & 1)])
            most = max(most, visited)
        assert 1 < most <= bound <= len(t.c_depth)


def test_leaf_checks_in_lists_patterns_and_absent_attributes():
    """IN / NOT IN (the IN list through ``v_pid``), LIKE / NOT LIKE /
    MATCHES (the pattern table through the row's pattern id), BETWEEN,
    IS [NOT] NULL and absent attributes, evaluated at the leaves of both
    trees, with blocks of 2 threads too."""
    from gpu_kernels import opcodes
    events = EVENTS + [{"n0": 2, "s0": "abc", "n1": 5, "s1": "q"}, {"s0": "cz", "n2": 1.5, "s1": "zb", "n1": 7.75}]
    seg, batch, truth = compiled(LEAF_CHECKS, events)
    alive = np.ones(len(seg), np.uint8)
    for options, launch in (({}, None), (DEEP, TINY)):
        matcher = cuda_matcher(seg, **options, **({} if launch is None else {"launch": launch}))
        checked = set(matcher.host.units.rows.op[matcher.host.leaf.v_pid].tolist())
        assert {opcodes.IN, opcodes.NOT_IN, opcodes.LIKE, opcodes.NOT_LIKE, opcodes.MATCHES} <= checked
        want, scanned = host_pairs(seg, batch, truth, alive, **options)
        assert want == scanned and len(set(want[1])) >= 5
        assert pairs(matcher, batch, truth, alive) == want


# ================================================================= matcher
def test_device_output_device_batches_and_chunks(monkeypatch):
    """``output="device"`` keeps the pairs on the device; a batch already on
    the device is matched in place, also one event per chunk (its keys
    computed from the chunk's slice of the whole batch)."""
    seg, batch, truth = compiled(EXPRESSIONS, EVENTS)
    alive = np.ones(len(seg), np.uint8)
    want = host_pairs(seg, batch, truth, alive, **DEEP)[0]
    e, p = cuda_matcher(seg, **DEEP).match(_on_device(batch), _to_device_input(truth), _to_device_input(alive),
                                          output="device")
    assert type(e) is type(cuda_support.array_module().zeros(0))   # CuPy on a GPU
    assert (host(e).tolist(), host(p).tolist()) == want
    matcher = cuda_matcher(seg, **DEEP)
    row = matcher._event_bytes()[0] + matcher._item_bytes() * int(np.diff(batch.offsets).max())
    budget = matcher._fixed_bytes() + truth.nbytes + alive.nbytes + 16 * len(seg) + row
    launches = recorded_launches(monkeypatch)
    assert pairs(cuda_matcher(seg, **DEEP, device_memory=budget), _on_device(batch), truth, alive) == want
    assert len(launches) >= batch.n_events - 1        # (the event with no attribute may share a chunk)


def test_merges_and_recodes_reach_the_device(monkeypatch):
    """A merge (removals, adds) derives the tree on the host from the last
    one -- no build from scratch -- and copies the new arrays over; a
    grown string dictionary recodes: the same tree on the device, new
    predicate codes and base-code map.  Answers are the reference
    evaluator's throughout."""
    exprs = ["n0 = 1 AND s0 = 'm'", "s0 > 'k' AND s0 < 'p'", "n1 IN (1, 2) AND s1 LIKE 'a%'", "n0 >= 1",
             "s0 = 'm' OR n1 = 2"]
    ids = list(range(len(exprs)))
    index = Index(algorithm="betree", backend="cuda", schema=SCHEMA, options=DEEP)
    index.add_many(ids, exprs)
    index.merge()
    events = [{"n0": 1, "s0": "m", "n1": 2, "s1": "ab"}, {"s0": "n"}, {"s0": "l", "n0": 3}, {"n1": 1, "s1": "a"}]

    def check():
        texts = dict(zip(ids, exprs))
        assert [m.tolist() for m in index.match_batch(events)] == \
            [sorted(i for i, t in texts.items() if matches(parse(t), e)) for e in events]
    check()
    first = index._matcher
    assert first.host.merges == 0 and first.device_nbytes > 0

    def no_build(*args, **kwargs):
        pytest.fail("the tree was built from scratch")
    monkeypatch.setattr(BETreeMatcher, "__init__", no_build)
    index.remove(3)
    del ids[3], exprs[3]
    index.add_many([7, 8], ["s0 >= 'l' AND n0 = 3", "s1 LIKE 'a%' AND n1 = 1"])
    ids += [7, 8]
    exprs += ["s0 >= 'l' AND n0 = 3", "s1 LIKE 'a%' AND n1 = 1"]
    index.merge()
    check()
    merged = index._matcher
    assert merged.host.merges == 1 and merged.tree_d is not first.tree_d
    # 'kz', 'mm' and 'ab' enter the dictionary between operands of main's predicates: a recode, the same
    # tree; codes above them move up ('n' no longer falls below the code 'p' had)
    index.add_many([9], ["s0 IN ('kz', 'mm') OR s1 = 'ab'"])
    ids.append(9)
    exprs.append("s0 IN ('kz', 'mm') OR s1 = 'ab'")
    events.append({"s0": "o", "s1": "ab"})
    check()
    recoded = index._matcher
    assert recoded is not merged and recoded.tree_d is merged.tree_d
    assert recoded.leaf_d is not merged.leaf_d and len(recoded.host.str_map)
    index.merge()
    check()


def test_cuda_path_errors():
    from engine.algorithms.betree_cuda import BETreeCudaMatcher
    from engine.backend import DeviceMemoryError
    seg, batch, truth = compiled()
    alive = np.ones(len(seg), np.uint8)
    with pytest.raises(ValueError, match="runs on backend 'cuda'"):
        BETreeCudaMatcher(seg, "cpu")
    with pytest.raises(ValueError, match=r"queue_capacity must be an integer in \[1, \d+\] for blocks of \d+ threads"):
        cuda_matcher(seg, queue_capacity=0)
    with pytest.raises(ValueError, match="max_cap must be an integer >= 1"):
        cuda_matcher(seg, max_cap=0)
    with pytest.raises(ValueError, match="alive has 3 flags for a segment of 11 subscriptions"):
        cuda_matcher(seg).match(batch, truth, alive[:3])
    with pytest.raises(DeviceMemoryError, match=r"event \d+ of the batch cannot fit.*result bit row of 8 bytes"):
        cuda_matcher(seg, device_memory=300).match(batch, truth, alive)
    assert repr(cuda_matcher(seg, **DEEP)).startswith("BETreeCudaMatcher(11 subscriptions")
