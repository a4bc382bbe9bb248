"""``atree`` on the ``cuda`` backend: the level-wise kernels (one level per
launch, and the persistent kernel) against the cpu A-Tree and ``scan`` --
every operator and connective, Table 2's three-valued cases under NOT,
XOR and XNOR, deep expressions (many levels), the paper's ablations,
ABE-Gen workloads through inserts and deletes between matches (merges
derived on the host, reaching the device), recodes, device input and
output, chunking under a tiny device memory budget -- and the kernels'
PTX for a real GPU.

Runs on a GPU, or without one under numba's CUDA simulator::

    NUMBA_ENABLE_CUDASIM=1 pytest -m cuda tests/test_atree_cuda.py

(the PTX check needs neither: it runs wherever libNVVM is installed, and
is skipped where it is not).

Sizes are tiny (the simulator runs every thread in Python); the Index on
cuda through every life cycle is tests/test_conformance.py's.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

from engine import Index
from engine.algorithms.atree import ATreeMatcher
from engine.algorithms.scan import ScanMatcher
from engine.parse import parse
from engine.reference import matches
from engine.workloads import abe_gen, add_subscriptions
from gpu_kernels import cuda_support
from gpu_kernels.cuda_support import LaunchConfig
from tests.test_atree import THREE_VALUED
from tests.test_cuda_sim import (EVENTS, EXPRESSIONS, _on_device, _to_device_input, compiled, host, in_cuda_slice,
                                needs_cuda)

pytestmark = pytest.mark.cuda

ROOT = Path(__file__).resolve().parents[1]
KERNELS = ("levels", "persistent")
#: two threads a block over three blocks: the grid-stride loops over words, l-nodes and events wrap
TINY = LaunchConfig(block=(2, 1), max_grid=(3, 1), compaction_tile=64)


def cuda_matcher(segment, **options):
    from engine.algorithms.atree_cuda import ATreeCudaMatcher
    return ATreeCudaMatcher(segment, "cuda", **options)


def pairs(matcher, batch, truth, alive):
    e, p = matcher.match(batch, truth, alive)
    return e.tolist(), p.tolist()


def host_pairs(segment, batch, truth, alive):
    """(cpu A-Tree's pairs, scan's pairs): what the cuda matcher must give."""
    return pairs(ATreeMatcher(segment, "cpu"), batch, truth, alive), pairs(ScanMatcher(segment, "cpu"), batch,
                                                                          truth, alive)


def chunk_calls(monkeypatch):
    """The kernel mode and event count of every chunk matched."""
    from gpu_kernels.atree import cuda as K
    calls = []
    real = K.match_chunk_cuda

    def launch(mode, launch, threads, blocks, n_rows, *args):
        calls.append((mode, n_rows))
        return real(mode, launch, threads, blocks, n_rows, *args)
    monkeypatch.setattr(K, "match_chunk_cuda", launch)
    return calls


# ================================================================= kernels
@needs_cuda
@pytest.mark.parametrize("kernel", KERNELS)
@pytest.mark.parametrize("launch", [None, TINY], ids=["default-launch", "tiny-launch"])
def test_atree_cuda_matches_cpu_atree_and_scan(kernel, launch):
    """Every operator and connective, absent attributes, dead subscriptions."""
    seg, batch, truth = compiled(EXPRESSIONS, EVENTS)
    alive = np.ones(len(seg), np.uint8)
    alive[[3, 8]] = 0
    want, scanned = host_pairs(seg, batch, truth, alive)
    assert want == scanned and len(want[0]) >= 10
    assert pairs(cuda_matcher(seg, kernel=kernel, launch=launch), batch, truth, alive) == want


@needs_cuda
@pytest.mark.parametrize("kernel", KERNELS)
def test_three_valued_cases_under_not_xor_xnor(kernel):
    """Table 2 and SQL's three-valued logic (tests/test_atree.py's cases):
    FALSE propagates inside XOR/XNOR subtrees (an XNOR of two FALSE
    children is TRUE with no TRUE below it), an untouched exact node is
    NULL, IS [NOT] NULL on absent attributes."""
    exprs = [text for text, _, _ in THREE_VALUED]
    events = [event for _, event, _ in THREE_VALUED]
    seg, batch, truth = compiled(exprs, events)
    alive = np.ones(len(seg), np.uint8)
    e, p = cuda_matcher(seg, kernel=kernel, launch=TINY).match(batch, truth, alive)
    hits = set(zip(e.tolist(), p.tolist()))
    for i, (text, event, expected) in enumerate(THREE_VALUED):
        assert ((i, i) in hits) == expected, (text, event)
    assert (e.tolist(), p.tolist()) == host_pairs(seg, batch, truth, alive)[1]


@needs_cuda
@pytest.mark.parametrize("kernel", KERNELS)
def test_deep_expressions_many_levels(kernel):
    """Random expressions over shared subtrees (tests/test_atree.py's
    generator: strings with long shared prefixes, NUL, non-ASCII) and a
    chain nested 24 deep: many levels, words of queued bits shared by two
    levels -- no per-thread stack, so no depth limit on the device."""
    from tests.test_atree import random_event, random_expression
    rng = np.random.default_rng(5)
    exprs = [random_expression(rng, int(rng.integers(2, 5))) for _ in range(24)]
    chain = "n0 = 1"
    for k in range(24):
        chain = f"({chain}) {('AND', 'OR', 'XOR', 'XNOR')[k % 4]} (n{k % 3} {'<' if k % 2 else '>='} {k % 5})"
    exprs.append(chain)
    events = [random_event(rng) for _ in range(12)]
    seg, batch, truth = compiled(exprs, events)
    alive = np.ones(len(seg), np.uint8)
    want, scanned = host_pairs(seg, batch, truth, alive)
    matcher = cuda_matcher(seg, kernel=kernel, launch=TINY)
    assert want == scanned and len(want[0]) >= 20 and matcher.host.statistics()["levels"] >= 24
    assert pairs(matcher, batch, truth, alive) == want


#: the paper's ablations (tests/test_atree.py runs them on cpu): other DAGs and links, the same kernels
ABLATIONS = [{"sharing": False}, {"binary": True}, {"zero_suppression": False, "on_demand": False}]


@needs_cuda
@pytest.mark.parametrize("options", ABLATIONS, ids=["no-sharing", "binary", "no-zero-suppression-no-on-demand"])
def test_ablations_on_cuda(options):
    """Without zero suppression every node is exact (FALSE propagates
    everywhere), without propagation on demand an AND is linked from every
    child, a binary DAG is deeper: the kernels read whatever the host
    flattened, and answer as ``scan`` does."""
    exprs = EXPRESSIONS + [text for text, _, _ in THREE_VALUED]
    seg, batch, truth = compiled(exprs, EVENTS + [event for _, event, _ in THREE_VALUED])
    alive = np.ones(len(seg), np.uint8)
    want = host_pairs(seg, batch, truth, alive)[1]
    assert len(want[0]) >= 20
    assert pairs(ATreeMatcher(seg, "cpu", **options), batch, truth, alive) == want
    assert pairs(cuda_matcher(seg, launch=TINY, **options), batch, truth, alive) == want


@needs_cuda
@pytest.mark.parametrize("kernel", KERNELS)
def test_the_leaf_index_on_cuda_equals_cpu_on_bounds_strings_and_lists(kernel):
    """The device twin of the leaf predicate index (tests/test_atree.py's
    generator, shrunk): every keyed operator (=, IN, <, <=, >, >=,
    BETWEEN) located by binary search, the other leaves (exact ones below
    XOR/XNOR; !=, NOT IN, NOT BETWEEN, IS NULL) evaluated -- values
    exactly on every bound, -0.0 against 0, BETWEEN with lo > hi, IN lists
    with repeated values, strings with shared prefixes and non-ASCII,
    absent attributes; and after a merge that grows the string dictionary
    (the index, keyed by codes, is copied over again, the DAG derived)."""
    from tests.test_atree import KEY_STRINGS, keyed_event, keyed_expression
    from gpu_kernels.atree.cpu import N_CLASSES
    rng = np.random.default_rng(1516)
    texts = [keyed_expression(rng, int(rng.integers(0, 3)), KEY_STRINGS[:5]) for _ in range(60)]
    texts += [keyed_expression(rng, int(rng.integers(0, 3)), KEY_STRINGS) for _ in range(20)]
    events = [keyed_event(rng, KEY_STRINGS) for _ in range(24)]
    indexes = [abe_index("cuda", kernel=kernel, launch=TINY), abe_index("cpu"),
               Index(algorithm="scan", backend="cpu")]

    def check(least: int):
        got, cpu, scan = ([r.tolist() for r in index.match_batch(events)] for index in indexes)
        assert got == cpu == scan and sum(map(len, got)) >= least
        m = native(indexes[0]._matcher)
        x = m.host.leaf_index
        ops = m.segment.predicates.op[m.host.arrays.leaf_pred[x.key_leaf]]
        assert len(set(ops.tolist())) == 7 and len(x.scan_leaf) > 10     # every keyed operator, and evaluated ones
        assert all(np.array_equal(host(d)[:len(h)], h) for d, h in zip(m.index_d, x))   # the device twin
        assert m.leaf_width >= int(np.diff(x.key_off).max()) and len(x.key_off) - 1 == \
            N_CLASSES * (len(x.scan_off) - 1)
        return m

    for index in indexes:
        index.add_many(range(60), texts[:60])
        index.merge()
    first = check(40)
    for index in indexes:
        for i in range(0, 60, 4):
            index.remove(i)
        index.add_many(range(60, 80), texts[60:])    # new strings: the dictionary grows, codes move
        index.merge()
    merged = check(30)
    assert merged.host.merges == 1 and merged.index_d is not first.index_d


# ================================================================= matcher
def native(matcher):
    """The A-Tree matcher itself (an Index may wrap it with a residual matcher)."""
    return getattr(matcher, "native", matcher)


def abe_index(backend: str, **options) -> Index:
    return Index(algorithm="atree", backend=backend, options=options or None)


@needs_cuda
@pytest.mark.parametrize("kernel", KERNELS)
def test_abe_gen_through_inserts_and_deletes(kernel, monkeypatch):
    """ABE-Gen workloads (shared subexpressions, NOT/XOR/XNOR, events that
    lack most attributes) on cuda against the cpu A-Tree and ``scan``:
    after a merge, with removals and adds pending (tombstones and the
    delta), after the merge that derives the next DAG on the host (no
    build from scratch) and copies it over, and after another."""
    w = abe_gen(120, 24, dims=12, cardinality=4, depth=3, event_size=6, seed=7)
    more = abe_gen(60, 0, dims=12, cardinality=4, depth=3, event_size=6, seed=8)
    indexes = [abe_index("cuda", kernel=kernel, launch=TINY), abe_index("cpu"),
               Index(algorithm="scan", backend="cpu")]
    for index in indexes:
        add_subscriptions(index, w.subscriptions)
        index.merge()

    def check(least: int) -> None:
        got, cpu, scan = (index.match_batch(w.events, output="arrow") for index in indexes)
        assert got.equals(cpu) and got.equals(scan)
        assert got.num_rows >= least            # the events do match: the comparison proves something

    check(40)
    first = native(indexes[0]._matcher)
    assert first.host.merges == 0 and first.device_nbytes > 0

    def no_build(*args, **kwargs):
        pytest.fail("the DAG was built from scratch")
    removed = [int(i) for i in w.subscriptions["sub_id"].to_numpy()[::3]]
    ids = more.subscriptions["sub_id"].to_numpy() + 1000
    texts = more.subscriptions["expression"].to_pylist()
    for index in indexes:
        for i in removed:
            index.remove(i)
        index.add_many(ids.tolist(), texts)
    check(20)                                   # tombstones in main, adds in the delta
    monkeypatch.setattr(ATreeMatcher, "__init__", no_build)
    for index in indexes:
        index.merge()
    check(20)
    merged = native(indexes[0]._matcher)
    assert merged is not first and merged.host.merges == 1 and merged.tree_d is not first.tree_d
    for index in indexes:
        index.remove(int(ids[0]))
        index.add(int(ids[0]), texts[1])          # removed and added again with another expression
        index.merge()
    check(20)
    assert native(indexes[0]._matcher).host.merges == 2


@needs_cuda
def test_recodes_keep_the_dag_on_the_device():
    """A grown string dictionary recodes the predicates: the host flattens
    the same DAG again (equal arrays: no new copy), the predicate codes
    are copied over."""
    exprs = ["s0 = 'm' AND n0 = 1", "s0 > 'k' XOR n1 IS NULL", "NOT (s0 < 'p' AND s1 LIKE 'a%')"]
    index = Index(algorithm="atree", backend="cuda", schema={"s0": "string", "s1": "string", "n0": "numeric",
                                                              "n1": "numeric"}, options={"launch": TINY})
    index.add_many([0, 1, 2], exprs)
    index.merge()
    events = [{"s0": "m", "n0": 1}, {"s0": "n", "s1": "ab", "n1": 2}, {"s0": "l"}, {"s1": "b"}, {"s0": "q"}]

    def check(least):
        texts = dict(enumerate(exprs))
        want = [sorted(i for i, t in texts.items() if matches(parse(t), e)) for e in events]
        assert [m.tolist() for m in index.match_batch(events)] == want and sum(map(len, want)) >= least
    check(4)
    before = native(index._matcher)
    # 'kz' and 'mm' enter the dictionary between main's operands: codes above them move
    index.add(3, "s0 IN ('kz', 'mm')")
    exprs.append("s0 IN ('kz', 'mm')")
    events.append({"s0": "mm"})
    check(5)
    recoded = native(index._matcher)
    assert recoded is not before and recoded.tree_d is before.tree_d and recoded.preds_d is not before.preds_d


@needs_cuda
@pytest.mark.parametrize("kernel", KERNELS)
def test_device_output_device_batches_and_chunks(kernel, monkeypatch):
    """``output="device"`` keeps the pairs on the device; a batch already
    on the device is matched in place; a device memory budget of one event
    matches one event per chunk (each chunk's offsets a slice of the whole
    batch's)."""
    seg, batch, truth = compiled(EXPRESSIONS, EVENTS)
    alive = np.ones(len(seg), np.uint8)
    want = host_pairs(seg, batch, truth, alive)[0]
    e, p = cuda_matcher(seg, kernel=kernel).match(_on_device(batch), _to_device_input(truth),
                                                  _to_device_input(alive), output="device")
    assert type(e) is type(cuda_support.array_module().zeros(0))   # CuPy on a GPU
    assert (host(e).tolist(), host(p).tolist()) == want
    matcher = cuda_matcher(seg, kernel=kernel)
    fixed = truth.nbytes + alive.nbytes + 16 * len(seg)
    # the widest event alone: its scratch, and -- from a host batch -- its entries and offset
    host_row = matcher._event_bytes()[0] + 16 * int(np.diff(batch.offsets).max()) + 8
    calls = chunk_calls(monkeypatch)
    for events, row in ((batch, host_row), (_on_device(batch), matcher._event_bytes()[0])):
        calls.clear()
        assert pairs(cuda_matcher(seg, kernel=kernel, device_memory=fixed + row), events, truth, alive) == want
        assert len(calls) >= batch.n_events - 1 and {mode for mode, _ in calls} == {kernel}
    calls.clear()
    assert pairs(matcher, batch, truth, alive) == want and calls == [(kernel, batch.n_events)]


@needs_cuda
def test_cuda_path_errors():
    from engine.algorithms.atree_cuda import ATreeCudaMatcher
    from engine.algorithms.options import ATREE_KERNELS
    from engine.backend import DeviceMemoryError
    from gpu_kernels.atree import cuda as K
    seg, batch, truth = compiled()
    alive = np.ones(len(seg), np.uint8)
    with pytest.raises(ValueError, match="runs on backend 'cuda'"):
        ATreeCudaMatcher(seg, "cpu")
    assert K.KERNELS == ATREE_KERNELS == KERNELS
    with pytest.raises(ValueError, match="kernel must be one of 'levels', 'persistent'"):
        cuda_matcher(seg, kernel="warp")
    with pytest.raises(TypeError, match="applies to backend 'cuda', not 'cpu'"):
        Index(algorithm="atree", backend="cpu", options={"kernel": "persistent"})
    with pytest.raises(ValueError, match="alive has 3 flags for a segment of 11 subscriptions"):
        cuda_matcher(seg).match(batch, truth, alive[:3])
    with pytest.raises(DeviceMemoryError, match=r"event \d+ of the batch cannot fit.*bytes of node results"):
        cuda_matcher(seg, device_memory=300).match(batch, truth, alive)
    assert repr(cuda_matcher(seg)).startswith("ATreeCudaMatcher(11 subscriptions")


# ============================================================ without a GPU
@in_cuda_slice
def test_atree_cuda_kernels_compile_to_ptx():
    """The simulator runs kernels as Python and so cannot catch what the
    real compiler rejects: compile the three kernels to sm_90 PTX with
    the argument types the matcher passes (needs libNVVM, e.g. pip's
    nvidia-cuda-nvcc-cu12, but no GPU) -- and ``import`` of the cuda
    matcher touches no CUDA."""
    code = textwrap.dedent("""
        import sys, types
        import engine.algorithms.atree_cuda, gpu_kernels.atree.cuda
        assert 'numba.cuda' not in sys.modules, 'numba.cuda was imported'
        from numba import cuda
        import numba.cuda.dispatcher as dispatcher
        # no GPU here: device functions compile for a stated compute capability
        dispatcher.get_current_device = lambda: types.SimpleNamespace(compute_capability=(9, 0))
        from gpu_kernels.atree import cuda as K
        sigs = K.kernel_types()
        try:
            for kernel, name in zip(K.build_kernels(), ("leaf", "level", "persistent")):
                ptx, _ = cuda.compile_ptx(kernel.py_func, sigs[name], cc=(9, 0))
                assert ".entry" in ptx
        except Exception as exc:
            if "nvvm" in str(exc).lower() or "nvrtc" in str(exc).lower() or "DynamicLibNotFound" in type(exc).__name__:
                print("no-nvvm:", exc)
                sys.exit(0)
            raise
        print("compiled 3")
    """)
    env = {k: v for k, v in os.environ.items() if k != "NUMBA_ENABLE_CUDASIM"}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=600)
    if done.returncode == 0 and "no-nvvm" in done.stdout:
        pytest.skip(f"libNVVM not installed: {done.stdout.strip()[:200]}")
    assert done.returncode == 0 and "compiled 3" in done.stdout, (done.stdout + done.stderr)[-3000:]


@needs_cuda
def test_a_saved_dag_loads_onto_the_device(tmp_path):
    # saved from cpu, restored as it was built (no insertion replayed), then copied to the device
    w = abe_gen(80, 30, dims=30, cardinality=10, depth=3, seed=11)
    built = abe_index("cpu")
    add_subscriptions(built, w.subscriptions)
    built.merge()
    path = tmp_path / "abe.bexidx"
    built.save(path)
    loaded = Index.load(path, backend="cuda")
    want = [m.tolist() for m in built.match_batch(w.events)]
    assert [m.tolist() for m in loaded.match_batch(w.events)] == want and sum(map(len, want)) > 20
    assert loaded._state.source.kind == "reuse"
    assert native(loaded._matcher).host.statistics() == native(built._matcher).statistics()
