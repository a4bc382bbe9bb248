"""``pstbloom`` and ``psthash`` on the ``cuda`` backend: the kernels against the
cpu matchers and ``scan`` -- a W2-like dense workload, strings sharing long
prefixes, values on the spaces' boundaries, absent attributes, PSTHash with
one and three access predicates -- updates between matches, chunks of a
tiny device budget over a batch on the device, and the kernels' PTX for a
real GPU.

Runs on a GPU, or without one under numba's CUDA simulator::

    NUMBA_ENABLE_CUDASIM=1 pytest -m cuda tests/test_pstree_cuda.py

Sizes are tiny (the simulator runs every thread in Python); the Index on
cuda through every life cycle is tests/test_conformance.py's.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from engine import Index
from engine.algorithms.cuda_base import ENTRY_BYTES, OFFSET_BYTES, PAIR_BYTES
from engine.algorithms.pstree import PSTBloomMatcher, PSTHashMatcher
from engine.algorithms.scan import ScanMatcher
from engine.events import EventBatch
from engine.parse import parse
from engine.reference import matches
from engine.workloads import standard
from gpu_kernels import cuda_support, opcodes
from gpu_kernels.cuda_support import LaunchConfig
from tests.test_cuda_sim import (EVENTS, EXPRESSIONS, ROOT, SCHEMA, _on_device, _to_device_input, compiled, host,
                                 needs_cuda)

pytestmark = [pytest.mark.cuda, needs_cuda]

#: blocks of two threads over a grid of three: every list and combination loop strides and wraps
TINY = LaunchConfig(block=(2, 1), max_grid=(3, 1), compaction_tile=64)
CPU = {"pstbloom": PSTBloomMatcher, "psthash": PSTHashMatcher}

#: conjunctions and DNFs over every operator the PS-Trees index, and those they cannot (patterns, IS NULL)
CHECKS = [
    "n0 IN (1, 2, 3) AND s0 LIKE 'a%'",
    "n1 NOT IN (0, 1) AND s1 NOT LIKE '%z%' AND n0 >= 1",
    "s0 MATCHES '^c' AND n2 BETWEEN 0 AND 3",
    "s1 IN ('a', 'ba', 'zb') AND n0 IS NULL",
    "n2 NOT BETWEEN 0 AND 1 AND b0 IS NOT NULL AND n1 != 7.75",
    "n0 = 1 AND n1 = 1 AND n2 < 3 AND s0 = 'ab'",
    "(n0 IN (1, 3) AND s0 > 'b') OR (n1 IN (-1, 7.75) AND s1 IS NOT NULL)",
    "n0 <= 0 AND s1 >= 'a' AND s0 != 'b'",
]
MORE_EVENTS = [{"n0": 2, "s0": "abc", "n1": 5, "s1": "q", "n2": 2.0}, {"s0": "cz", "n2": 1.5, "s1": "zb", "n1": 7.75},
               {"n0": 1, "n1": 1, "n2": 2.5, "s0": "ab", "b0": True}, {"n0": 0, "s1": "a", "s0": "a"}]


def cuda_matcher(algorithm: str, segment, **options):
    from engine.algorithms.pstree_cuda import PSTBloomCudaMatcher, PSTHashCudaMatcher
    return {"pstbloom": PSTBloomCudaMatcher, "psthash": PSTHashCudaMatcher}[algorithm](segment, "cuda", **options)


def pairs(matcher, batch, truth, alive):
    e, p = matcher.match(batch, truth, alive)
    return host(e).tolist(), host(p).tolist()


def answers(index: Index, events) -> list[list[int]]:
    return [m.tolist() for m in index.match_batch(events)]


def built(algorithm: str, subs, backend: str = "cpu", options=None, **kw) -> Index:
    index = Index(algorithm=algorithm, backend=backend, options=options or {}, **kw)
    if isinstance(subs, list):
        index.add_many(list(range(len(subs))), subs)
    else:
        index.add_many(subs)          # a workload's table of ids and expressions
    index.merge()
    return index


# ================================================================= kernels
@pytest.mark.parametrize("algorithm,options,launch", [
    ("pstbloom", {}, None), ("pstbloom", {"bloom_bits": 1, "bloom_hashes": 1}, TINY),
    ("psthash", {}, None), ("psthash", {"n_access": 1}, TINY), ("psthash", {"n_access": 3}, None)],
    ids=["bloom", "bloom-tiny-signatures", "hash", "hash-n1", "hash-n3"])
def test_pstree_cuda_matches_cpu_and_scan(algorithm, options, launch):
    """Every operator and connective, IN lists, patterns, IS [NOT] NULL,
    absent attributes and empty events: the pairs of the cpu matcher and of
    scan, with the simulator's blocks and blocks of two threads; tombstones
    hide their subscriptions."""
    seg, batch, truth = compiled(EXPRESSIONS + CHECKS, EVENTS + MORE_EVENTS)
    alive = np.ones(len(seg), np.uint8)
    matcher = cuda_matcher(algorithm, seg, **options, **({} if launch is None else {"launch": launch}))
    want = pairs(CPU[algorithm](seg, "cpu", **options), batch, truth, alive)
    assert want == pairs(ScanMatcher(seg, "cpu"), batch, truth, alive) and len(want[0]) > 15
    assert pairs(matcher, batch, truth, alive) == want
    if algorithm == "psthash":
        arities = matcher.statistics()["arity_counts"]
        assert sum(arities[2:]) > 0 if options.get("n_access", 2) > 1 else arities[1] > 0
    alive[[0, 3, len(seg) - 1]] = 0
    got = pairs(matcher, batch, truth, alive)
    assert got == pairs(ScanMatcher(seg, "cpu"), batch, truth, alive)
    assert not set(got[1]) & {0, 3, len(seg) - 1}
    # NaN values (the Index refuses them in events; a batch built by hand may carry them): located in the
    # leftmost space, whose access predicates are then evaluated, not taken as decided -- as on cpu (whose
    # DNF units read NOT (x > 1) as x <= 1, FALSE on NaN where scan's program says TRUE: units' semantics)
    numeric = np.flatnonzero(np.isin(batch.attr, [seg.predicates.attr[i] for i in range(len(seg.predicates))
                                                  if seg.predicates.op[i] in (opcodes.NE, opcodes.LT)]))
    value = batch.value.copy()
    value[numeric[::2]] = np.nan
    nan_batch = EventBatch(batch.offsets, batch.attr, value, batch.token, batch.strings)
    assert pairs(matcher, nan_batch, truth, alive) == pairs(CPU[algorithm](seg, "cpu", **options), nan_batch,
                                                            truth, alive)


@pytest.mark.parametrize("algorithm,options", [("pstbloom", {}), ("psthash", {}), ("psthash", {"n_access": 1})],
                         ids=["bloom", "hash", "hash-n1"])
def test_a_w2_like_dense_workload(algorithm, options):
    """W2 (PS-Tree's dense workload: 100 attributes, events of 30) at a few
    hundred subscriptions: the Index on cuda answers as on cpu and as scan."""
    w = standard("W2", scale=0.0003, n_events=12, seed=5)
    got = answers(built(algorithm, w.subscriptions, "cuda", options), w.events)
    assert got == answers(built(algorithm, w.subscriptions, "cpu", options), w.events)
    assert got == answers(built("scan", w.subscriptions), w.events)
    assert sum(map(len, got)) >= 5


@pytest.mark.parametrize("algorithm,options", [("pstbloom", {}), ("psthash", {}), ("psthash", {"n_access": 3})],
                         ids=["bloom", "hash", "hash-n3"])
def test_long_prefixes_boundaries_and_absent_attributes(algorithm, options):
    """Strings sharing a 150-character prefix (codes a hair apart), values
    exactly on every boundary the predicates cut and between them, events
    lacking the access predicates' attributes,
    and strings new to the dictionary between known ones."""
    p = "shared-prefix/" * 11
    words = [p + f"{i:02d}" for i in range(0, 12, 2)]
    subs = [f"s = '{words[1]}' AND n >= 3", f"s BETWEEN '{words[1]}' AND '{words[3]}' AND t < '{words[2]}'",
            f"s > '{words[2]}' AND n BETWEEN 1 AND 3", f"s IN ('{words[0]}', '{words[4]}') AND n != 2",
            f"t <= '{words[3]}' AND s NOT IN ('{words[1]}')", "n > 1 AND n < 3", "n NOT BETWEEN 1 AND 3",
            f"s != '{words[5]}' AND t >= '{words[0]}' AND n <= 1", "n = 3 OR n = 1", f"t > '{p}'",
            f"s < '{words[0]}' AND n IS NULL", f"s >= '{words[5]}' AND t IS NOT NULL"]
    values = [0, 1, 1.5, 2, 3, 3.5, 0.5]
    strings = words + [p, p[:-1], p + "03", p + "99", words[5] + "\x00"]
    events = [{"s": strings[i % len(strings)], "t": strings[(3 * i + 1) % len(strings)], "n": values[i % 7]}
              for i in range(22)]
    events += [{"n": 2}, {"s": words[1]}, {"t": words[2], "n": 3}, {}]
    index = built(algorithm, subs, "cuda", options)
    got = answers(index, events)
    assert got == answers(built(algorithm, subs, "cpu", options), events)
    assert got == answers(built("scan", subs), events)
    assert sum(map(len, got)) >= 20 and [] in got


# ================================================================= matcher
@pytest.mark.parametrize("algorithm", ["pstbloom", "psthash"])
def test_updates_between_matches_reach_the_device(algorithm):
    """Adds and removals show in the next match (delta, tombstones), a merge
    makes the structure anew on the host (on five subscriptions: rebuilt,
    past the churn bound) and copies the new arrays over, a grown string
    dictionary recodes them: answers are the reference evaluator's
    throughout."""
    exprs = {0: "n0 = 1 AND s0 = 'm'", 1: "s0 > 'k' AND s0 < 'p'", 2: "n1 IN (1, 2) AND s1 LIKE 'a%'",
             3: "n0 >= 1 AND n1 < 2", 4: "s0 = 'm' OR n1 = 2"}
    index = Index(algorithm=algorithm, backend="cuda", schema=SCHEMA)
    index.add_many(list(exprs), list(exprs.values()))
    index.merge()
    events = [{"n0": 1, "s0": "m", "n1": 2, "s1": "ab"}, {"s0": "n"}, {"s0": "l", "n0": 3, "n1": 1},
              {"n1": 1, "s1": "a"}]

    def check():
        assert answers(index, events) == \
            [sorted(i for i, t in exprs.items() if matches(parse(t), e)) for e in events]
    check()
    first = index._matcher
    assert first.device_nbytes > 0
    index.remove(3)
    del exprs[3]
    check()                                          # a tombstone in main
    index.add_many([7, 8], ["s0 >= 'l' AND n0 = 3", "s1 LIKE 'a%' AND n1 = 1"])
    exprs.update({7: "s0 >= 'l' AND n0 = 3", 8: "s1 LIKE 'a%' AND n1 = 1"})
    check()                                          # the delta
    index.merge()
    check()
    merged = index._matcher
    assert merged.structure_d is not first.structure_d and merged.host is not first.host
    # 'kz', 'mm' and 'ab' enter the dictionary between operands of main's predicates: the codes move
    index.add_many([9], ["s0 IN ('kz', 'mm') OR s1 = 'ab'"])
    exprs[9] = "s0 IN ('kz', 'mm') OR s1 = 'ab'"
    events.append({"s0": "o", "s1": "ab"})
    check()
    index.merge()
    check()


@pytest.mark.parametrize("algorithm", ["pstbloom", "psthash"])
def test_merges_derive_the_host_structure_the_device_serves(algorithm, monkeypatch):
    """§4.4 on cuda: merges derive the host structure (split and merged
    spaces, lists, signatures, keys) and the device serves each derived one
    -- answers the reference evaluator's, the device arrays replaced."""
    monkeypatch.setattr(CPU[algorithm], "REBUILD_SHARE", np.inf)
    exprs = dict(enumerate(CHECKS))
    index = Index(algorithm=algorithm, backend="cuda", schema=SCHEMA)
    index.add_many(list(exprs), list(exprs.values()))
    index.merge()
    events = EVENTS + MORE_EVENTS
    answers(index, events)
    first = index._matcher
    rounds = [([0, 3], {10: "n0 = 2 AND n1 BETWEEN 4 AND 6", 11: "s0 IN ('ab', 'cz') AND n2 > 1.5"}),
              ([5, 10], {12: "n0 NOT IN (2) AND n2 <= 2.5", 13: "n1 = 7.75 OR s1 = 'q'"})]
    for k, (gone, added) in enumerate(rounds):
        for i in gone:
            index.remove(i)
            del exprs[i]
        index.add_many(list(added), list(added.values()))
        exprs.update(added)
        index.merge()
        assert answers(index, events) == \
            [sorted(i for i, t in exprs.items() if matches(parse(t), e)) for e in events]
        assert index._matcher.host.merges == k + 1
    assert index._matcher.structure_d is not first.structure_d
    assert index._matcher.host._checks == first.host._checks == ()    # (the cpu batch kernel's, never made here)


@pytest.mark.parametrize("algorithm", ["pstbloom", "psthash"])
def test_chunks_of_a_tiny_budget_device_batches_and_output(algorithm, monkeypatch):
    """A device budget of one event per chunk: a batch on the host is sliced
    per chunk, one on the device is matched in place (each chunk's entries
    located from the whole batch's offsets); ``output="device"`` keeps the
    pairs on the device."""
    from engine.algorithms import pstree_cuda
    seg, batch, truth = compiled(EXPRESSIONS + CHECKS, EVENTS + MORE_EVENTS)
    alive = np.ones(len(seg), np.uint8)
    want = pairs(CPU[algorithm](seg, "cpu"), batch, truth, alive)
    matcher = cuda_matcher(algorithm, seg)
    e, p = matcher.match(_on_device(batch), _to_device_input(truth), _to_device_input(alive), output="device")
    assert type(e) is type(cuda_support.array_module().zeros(0))   # CuPy on a GPU
    assert (host(e).tolist(), host(p).tolist()) == want
    launched = []
    name = f"{algorithm}_kernel_cuda"
    real = getattr(pstree_cuda, name)
    monkeypatch.setattr(pstree_cuda, name, lambda *args: (launched.append(int(args[2])), real(*args))[1])
    widest = int(np.diff(batch.offsets).max())
    for events, entry, offset in ((batch, ENTRY_BYTES, OFFSET_BYTES), (_on_device(batch), 0, 0)):
        # room for the widest event alone (a host batch's entries and offsets travel per chunk)
        row = matcher._event_bytes()[0] + offset + (matcher._item_bytes() + entry) * widest
        budget = matcher._fixed_bytes() + truth.nbytes + alive.nbytes + PAIR_BYTES * len(seg) + row
        launched.clear()
        assert pairs(cuda_matcher(algorithm, seg, device_memory=budget), events, truth, alive) == want
        assert len(launched) > batch.n_events // 2 and sum(launched) == batch.n_events


def test_cuda_path_errors():
    from engine.algorithms.pstree_cuda import PSTBloomCudaMatcher, PSTHashCudaMatcher
    from engine.backend import DeviceMemoryError
    seg, batch, truth = compiled()
    alive = np.ones(len(seg), np.uint8)
    with pytest.raises(ValueError, match="runs on backend 'cuda'"):
        PSTBloomCudaMatcher(seg, "cpu")
    with pytest.raises(ValueError, match="n_access must be an integer in"):
        PSTHashCudaMatcher(seg, n_access=5)
    with pytest.raises(ValueError, match="alive has 3 flags for a segment of 11 subscriptions"):
        cuda_matcher("psthash", seg).match(batch, truth, alive[:3])
    with pytest.raises(DeviceMemoryError, match=r"event \d+ of the batch cannot fit.*result bit row of 8 bytes"):
        cuda_matcher("pstbloom", seg, device_memory=300).match(batch, truth, alive)
    with pytest.raises(TypeError):
        Index(algorithm="pstbloom", backend="cpu", options={"device_memory": 1 << 20})
    assert repr(cuda_matcher("psthash", seg)).startswith("PSTHashCudaMatcher(11 subscriptions")
    assert repr(cuda_matcher("pstbloom", seg)).startswith("PSTBloomCudaMatcher(11 subscriptions")


PTX_CHECK = textwrap.dedent("""
    import sys, types
    from numba import cuda
    import numba.cuda.dispatcher as dispatcher
    # no GPU here: device functions compile for a stated compute capability
    dispatcher.get_current_device = lambda: types.SimpleNamespace(compute_capability=(9, 0))
    from gpu_kernels.pstree import cuda as pstree_cuda
    types_of = pstree_cuda.kernel_types()
    jobs = [(pstree_cuda.build_locate_kernel(), types_of["locate"]),
            (pstree_cuda.build_pstbloom_kernel(), types_of["pstbloom"]),
            (pstree_cuda.build_psthash_kernel(), types_of["psthash"])]
    try:
        for kernel, sig in jobs:
            ptx, _ = cuda.compile_ptx(kernel.py_func, sig, cc=(9, 0))
            assert ".entry" in ptx
    except Exception as exc:
        if "nvvm" in str(exc).lower() or "nvrtc" in str(exc).lower() or "DynamicLibNotFound" in type(exc).__name__:
            print("no-nvvm:", exc)
            sys.exit(0)
        raise
    print("compiled", len(jobs))
""")


def test_pstree_kernels_compile_to_ptx():
    """The simulator cannot catch what the real compiler rejects: the three
    kernels compile to sm_90 PTX with the argument types the matchers pass
    (needs libNVVM, not a GPU; the next test checks those types)."""
    env = {k: v for k, v in os.environ.items() if k != "NUMBA_ENABLE_CUDASIM"}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])
    done = subprocess.run([sys.executable, "-c", PTX_CHECK], env=env, capture_output=True, text=True, timeout=600)
    if done.returncode == 0 and "no-nvvm" in done.stdout:
        pytest.skip(f"libNVVM not installed: {done.stdout.strip()[:200]}")
    assert done.returncode == 0 and "compiled" in done.stdout, (done.stdout + done.stderr)[-3000:]


def test_kernel_types_are_the_built_structures():
    """:func:`gpu_kernels.pstree.cuda.kernel_types` (what the PTX check
    compiles) is what the host matchers build and the cuda matchers pass."""
    from numba import typeof

    from gpu_kernels.pstree.cuda import kernel_types
    types_of = kernel_types()
    seg, _, _ = compiled(EXPRESSIONS + CHECKS, EVENTS)
    bloom, hashed = PSTBloomMatcher(seg, "cpu"), PSTHashMatcher(seg, "cpu")
    assert typeof(bloom.spaces) == types_of["locate"][4]
    units = tuple(typeof(np.ascontiguousarray(a, np.int64)) for a in (bloom.units.sub, bloom.units.offsets,
                                                                      bloom._pids))
    for matcher, kernel in ((bloom, "pstbloom"), (hashed, "psthash")):
        assert units + (typeof(matcher.units.rows), typeof(matcher.structure)) == types_of[kernel][9:14]
