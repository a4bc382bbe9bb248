"""The ``cuda`` backend: every CUDA kernel against its CPU twin, the scan
matcher's chunking, device input and output and id mapping, and the cuda
path's errors.  The Index on cuda against the reference evaluator and
DuckDB, every algorithm and life cycle, is tests/test_conformance.py's.

Runs on a GPU, or without one under numba's CUDA simulator::

    NUMBA_ENABLE_CUDASIM=1 pytest -m cuda tests/test_cuda_sim.py

(the variable must be set before ``numba.cuda`` is first imported, so it is
never set here).  Sizes are tiny because the simulator runs every thread in
Python; :class:`TestFullSize` runs real sizes on real hardware only.  Two
tests need neither: ``import engine`` never touches CUDA, and the PTX
compile check (skipped where no libNVVM is installed) proves the kernels
compile for a real GPU, which the simulator cannot.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

from engine import Index, available_backends
from engine import events as event_batches
from engine.compile import PATTERN_CODES, compile_expressions
from engine.errors import ExpressionTooLarge
from engine.expr import predicates
from engine.parse import parse
from engine.schema import Schema
from gpu_kernels import cuda_support, opcodes
from tests import strategies

pytestmark = pytest.mark.cuda

ROOT = Path(__file__).resolve().parents[1]
HAVE_CUDA = "cuda" in available_backends()
needs_cuda = pytest.mark.skipif(not HAVE_CUDA, reason="needs a CUDA GPU with CuPy, or numba's simulator "
                                                      "(NUMBA_ENABLE_CUDASIM=1 set before the run)")
SIMULATED = HAVE_CUDA and cuda_support.simulated()
#: a check that needs no GPU but belongs to the cuda slice (CI runs it there,
#: beside the whole suite): the whole suite without a CUDA backend leaves it
#: to that slice rather than run it twice
in_cuda_slice = pytest.mark.skipif(not HAVE_CUDA, reason="runs in the cuda slice (pytest -m cuda, with a GPU or "
                                                         "NUMBA_ENABLE_CUDASIM=1), not twice")

SCHEMA = strategies.SCHEMA

#: expressions over every operator and connective, absent attributes included
EXPRESSIONS = [
    "n0 = 1 AND n1 != 2",
    "n0 < 0 OR n1 <= -1 OR n2 > 2.5",
    "n2 >= 2 XOR s0 = 'ab'",
    "n1 IN (1, 2, 3) XNOR b0 = TRUE",
    "n0 NOT IN (0, 1) AND s1 IN ('a', 'z')",
    "n1 BETWEEN -1 AND 1 OR n2 NOT BETWEEN 0 AND 2",
    "s0 LIKE 'a%' AND NOT s1 LIKE '_b'",
    "s0 MATCHES '^a|c' OR s1 NOT LIKE '%z%'",
    "NOT (s0 MATCHES 'b$') AND n0 IS NULL",
    "b0 IS NOT NULL AND (s0 < 'b' OR s1 >= 'ba')",
    "NOT (n0 > 1 AND (n1 < 0 XOR s0 = 'a'))",
]
EVENTS = [
    {"n0": 1, "n1": 1, "s0": "ab", "s1": "zb", "b0": True},
    {"n0": 3, "n2": 2.5, "s0": "cab"},
    {},
    {"n1": -1, "s1": "a", "b0": False, "n2": 0.5},
    {"n0": 0, "s0": "b", "s1": "ba", "n1": 7.75},
    {"n2": 7.75, "s0": "a", "b0": True},
]


def launches():
    """Default geometry, and a skewed tiny one whose grid-stride loops wrap."""
    from gpu_kernels.cuda_support import LaunchConfig
    return [cuda_support.default_launch(), LaunchConfig(block=(2, 1), max_grid=(1, 3), compaction_tile=3)]


def dev(x, dtype=None):
    return cuda_support.to_device(x, dtype)


def host(x):
    return cuda_support.to_host(x)


def compiled(expressions=EXPRESSIONS, events=EVENTS):
    """(segment, batch, pattern truth) of expressions and events, as the Index builds them."""
    schema = Schema()
    for attr, family in SCHEMA.items():
        schema.declare(attr, family)
    nodes = [parse(text) if isinstance(text, str) else text for text in expressions]
    for node in nodes:
        schema.register(list(predicates(node)))
    segment = compile_expressions(list(range(len(nodes))), nodes, schema)
    segment.predicates.recode(schema)
    batch = event_batches.encode_events(events, schema, "raise")
    preds = segment.predicates
    pairs = np.stack([preds.attr, preds.aux], axis=1)[np.isin(preds.op, PATTERN_CODES)]
    truth = event_batches.pattern_truth(batch, schema, np.unique(pairs, axis=0) if len(pairs) else pairs)
    batch.list_truth = event_batches.list_truth(batch, preds.list_index(schema))
    return segment, batch, truth


# ============================================================ import hygiene
def test_import_engine_never_touches_cuda():
    """``import engine`` and every kernel module import without numba.cuda
    (so without a GPU, CUDA bindings or driver, and at no import cost)."""
    code = ("import sys, engine, engine.algorithms.scan_cuda, engine.algorithms.opindex_cuda, "
            "engine.algorithms.cuda_base, engine.algorithms.residual, gpu_kernels.scan, gpu_kernels.compaction, "
            "gpu_kernels.predicates, gpu_kernels.opindex.cuda, gpu_kernels.cuda_support, "
            "engine.algorithms.betree_cuda, gpu_kernels.betree.cuda, engine.algorithms.apcm_cuda, "
            "gpu_kernels.apcm.cuda; "
            "assert 'numba.cuda' not in sys.modules, 'numba.cuda was imported'; print('ok')")
    env = {k: v for k, v in os.environ.items() if k != "NUMBA_ENABLE_CUDASIM"}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0 and "ok" in done.stdout, done.stderr[-2000:]


def test_cuda_backend_without_gpu_or_simulator_says_what_is_missing():
    code = textwrap.dedent("""
        from engine import Index, available_backends, BackendUnavailable
        if "cuda" in available_backends():
            print("has-gpu")
        else:
            try:
                Index(algorithm="scan", backend="cuda")
            except BackendUnavailable as exc:
                print("refused:", exc)
    """)
    env = {k: v for k, v in os.environ.items() if k != "NUMBA_ENABLE_CUDASIM"}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    if "has-gpu" in done.stdout:
        pytest.skip("a real GPU is present: the cuda backend is available")
    assert "refused: backend 'cuda' is not available here:" in done.stdout
    assert any(word in done.stdout for word in ("GPU", "CuPy", "numba-cuda", "driver")), done.stdout


PTX_CHECK = textwrap.dedent("""
    import sys, types
    from numba import cuda, types as T
    import numba.cuda.dispatcher as dispatcher
    # no GPU here: device functions compile for a stated compute capability
    dispatcher.get_current_device = lambda: types.SimpleNamespace(compute_capability=(9, 0))
    from gpu_kernels import compaction, predicates, scan
    from gpu_kernels.opindex import cuda as opindex_cuda
    from gpu_kernels.betree import cuda as betree_cuda
    import numpy as np
    A = lambda dt, nd=1, layout="C": T.Array(dt, nd, layout)
    i64, i32, i16, i8, u8, u16, u64, f64 = T.int64, T.int32, T.int16, T.int8, T.uint8, T.uint16, T.uint64, T.float64
    scan_sig = (i64, i64, A(i64), A(i32), A(f64), A(i32), A(i64), A(i8), A(i32), A(u8), A(i32), A(i8), A(f64),
                A(f64), A(i64), A(f64), A(i64), A(u8, 2), A(i64), i64, A(u8, 2))
    count, fill, count_bits, fill_bits = compaction._compaction_kernels()
    jobs = [(scan.build_scan_kernel_cuda(d), scan_sig) for d in scan.STACK_DEPTH_TIERS]
    # OpIndex: 16-bit operand ranks and counter pointers, and their wide forms; every counting mode
    modes = ("atomic", "atomic", "count", "emit")
    narrow, wide = (np.uint16, np.int16, np.int8), (np.float64, np.int32, np.int32)
    for mode, dtypes in zip(modes, (narrow, wide, narrow, wide)):
        jobs.append((opindex_cuda.build_opindex_kernel_cuda(256, scan.STACK_DEPTH_TIERS[0], mode),
                     opindex_cuda.kernel_types(*dtypes)))
    jobs.append((opindex_cuda._finish_kernel(), (i64, A(i64), A(i64), A(i64), A(i32), A(i64), A(i32), A(i32),
                                                 A(u8), A(u64, 2))))
    jobs += [(count, (A(u8, 2), i64, A(i64, 2))), (fill, (A(u8, 2, "A"), i64, i64, A(i64, 2, "A"), A(i64), A(i64))),
             (count_bits, (A(u64, 2), i64, A(i64, 2))),
             (fill_bits, (A(u64, 2, "A"), i64, i64, A(i64, 2, "A"), A(i64), A(i64))),
             (predicates._predicate_truth_kernel(),
              (A(i8), A(f64), A(f64), A(i64), A(f64), A(u8), A(u8), A(f64), A(i8)))]
    # BE-Tree: the default block and frontier queue, and the widest block with the largest queue it fits
    widest = (betree_cuda.MAX_SHARED_BYTES - betree_cuda.shared_bytes(1024, 0)) // 4
    jobs += [(betree_cuda.build_betree_kernel_cuda(t, q), betree_cuda.kernel_types())
             for t, q in ((128, betree_cuda.QUEUE_CAPACITY), (1024, widest))]
    # A-PCM: encoding, compression, and the cluster walk with its leaf scans (the BE-Tree kernel's geometry)
    from gpu_kernels.apcm import cuda as apcm_cuda
    apcm_types = apcm_cuda.kernel_types()
    jobs += [(apcm_cuda.build_encode_kernel(), apcm_types["encode"]), (apcm_cuda.build_or_kernel(), apcm_types["or"])]
    jobs += [(apcm_cuda.build_match_kernel(t, q), apcm_types["match"])
             for t, q in ((128, apcm_cuda.QUEUE_CAPACITY), (1024, widest))]
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


@in_cuda_slice
def test_cuda_kernels_compile_to_ptx():
    """The simulator runs kernels as Python and so cannot catch what the
    real compiler rejects: compile every CUDA kernel to sm_90 PTX (needs
    libNVVM, e.g. pip's nvidia-cuda-nvcc-cu12, but no GPU)."""
    env = {k: v for k, v in os.environ.items() if k != "NUMBA_ENABLE_CUDASIM"}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])
    done = subprocess.run([sys.executable, "-c", PTX_CHECK], env=env, capture_output=True, text=True, timeout=600)
    if done.returncode == 0 and "no-nvvm" in done.stdout:
        pytest.skip(f"libNVVM not installed: {done.stdout.strip()[:200]}")
    assert done.returncode == 0 and "compiled" in done.stdout, (done.stdout + done.stderr)[-3000:]


# ================================================================= kernels

@needs_cuda
def test_backend_selection():
    from engine.backend import array_namespace, resolve_backend
    assert available_backends() == ["cuda", "cpu"]
    assert resolve_backend("cuda") == "cuda"
    if SIMULATED:
        assert array_namespace("cuda") is np
    assert Index(backend="cuda").algorithm == "opindex"


@needs_cuda
@pytest.mark.parametrize("launch", launches(), ids=["default", "tiny"])
def test_predicate_truth_kernel_matches_cpu_on_every_opcode(launch):
    from gpu_kernels.predicates import predicate_truth_kernel_cuda, predicate_truth_many
    set_values = np.array([0.5, 1.0, 3.0])
    rows = []
    for op in range(opcodes.IS_NOT_NULL + 1):
        for value in (0.0, 0.5, 1.0, 2.0, 3.0, 4.0):
            for present in (0, 1):
                for pattern_hit in ((0, 1) if op in PATTERN_CODES else (0,)):
                    rows.append((op, 1.0, 3.0, value, present, pattern_hit))
    op, lo, hi, value, present, pattern_hit = (np.array(c) for c in zip(*rows))
    op = op.astype(np.int8)
    present, pattern_hit = present.astype(np.uint8), pattern_hit.astype(np.uint8)
    n = len(op)
    is_set = np.isin(op, (opcodes.IN, opcodes.NOT_IN))
    set_offsets = np.concatenate(([0], np.cumsum(np.where(is_set, 3, 0)))).astype(np.int64)
    all_sets = np.tile(set_values, int(is_set.sum()))
    want = np.full(n, -1, np.int8)
    predicate_truth_many(op, lo, hi, set_offsets, all_sets, pattern_hit, present, value, want)
    out = dev(np.full(n, -1, np.int8))
    predicate_truth_kernel_cuda(dev(op), dev(lo), dev(hi), dev(set_offsets), dev(all_sets), dev(pattern_hit),
                                dev(present), dev(value), out, launch=launch)
    got = host(out)
    assert got.tolist() == want.tolist()
    # and the CPU twin itself is right about absent attributes and presence tests
    absent = present == 0
    assert (want[absent & (op == opcodes.IS_NULL)] == opcodes.TRUE).all()
    assert (want[absent & (op == opcodes.IS_NOT_NULL)] == opcodes.FALSE).all()
    assert (want[absent & (op < opcodes.IS_NULL)] == opcodes.NULL).all()
    assert set(want[~absent & (op < opcodes.IS_NULL)].tolist()) == {opcodes.TRUE, opcodes.FALSE}


@needs_cuda
@pytest.mark.parametrize("launch", launches(), ids=["default", "tiny"])
def test_scan_kernel_matches_cpu_twin(launch):
    from gpu_kernels.scan import scan_kernel, scan_kernel_cuda
    seg, batch, truth = compiled()
    preds = seg.predicates
    alive = np.ones(len(seg), np.uint8)
    alive[[2, 7]] = 0
    alive.setflags(write=False)          # (as a matcher hands them: the cpu kernel compiled once, for the suite)
    event_start, n_chunk = 1, 4
    want = np.full((n_chunk, len(seg)), 9, np.uint8)
    args = [batch.offsets, batch.attr, batch.value, batch.token, seg.prog_offsets, seg.prog_kind, seg.prog_arg,
            alive, preds.attr, preds.op, preds.lo, preds.hi, preds.set_offsets, preds.set_values, preds.aux, truth,
            batch.list_truth]
    scan_kernel(event_start, n_chunk, *args, seg.max_depth, want)
    out = dev(np.full((n_chunk, len(seg)), 9, np.uint8))
    scan_kernel_cuda(event_start, n_chunk, *(dev(a) for a in args), seg.max_depth, out, launch=launch)
    assert host(out).tolist() == want.tolist()
    assert want.any() and not want.all()    # a meaningful segment
    assert not want[:, [2, 7]].any()


@needs_cuda
@pytest.mark.parametrize("launch", launches(), ids=["default", "tiny"])
def test_compaction_kernels_match_cpu_twins(launch):
    from gpu_kernels import compaction
    rng = np.random.default_rng(3)
    hits = (rng.random((6, 11)) < 0.3).astype(np.uint8)
    hits[2] = 0
    hits[4] = 1
    n_rows, row_base = 5, 40
    cpu_counts = compaction.count_hits(hits, n_rows)
    for n_tiles in (1, 3, 11):
        counts = dev(np.full((n_rows, n_tiles), -1, np.int64))
        compaction.count_hits_cuda(dev(hits), n_rows, counts, launch=launch)
        assert host(counts).sum(axis=1).tolist() == cpu_counts.tolist()
    # one tile per row: exactly the CPU arrays
    offsets = np.zeros(n_rows + 1, np.int64)
    np.cumsum(cpu_counts, out=offsets[1:])
    want_row, want_col = np.empty(offsets[-1], np.int64), np.empty(offsets[-1], np.int64)
    compaction.fill_hits(hits, n_rows, row_base, offsets, want_row, want_col)
    got_row, got_col = dev(np.full(offsets[-1], -1, np.int64)), dev(np.full(offsets[-1], -1, np.int64))
    compaction.fill_hits_cuda(dev(hits), n_rows, row_base, dev(offsets[:-1].reshape(n_rows, 1)), got_row, got_col,
                              launch=launch)
    assert host(got_row).tolist() == want_row.tolist() and host(got_col).tolist() == want_col.tolist()
    # the whole count + exclusive scan + fill pipeline, tiled by the launch config
    rows, cols = compaction.compact_hits_cuda(dev(hits), n_rows, row_base, launch=launch)
    want_rows, want_cols = compaction.compact_hits(hits, n_rows, row_base)
    assert host(rows).tolist() == want_rows.tolist() and host(cols).tolist() == want_cols.tolist()
    rows, cols = compaction.compact_hits_cuda(dev(np.zeros((3, 5), np.uint8)), 3, 0, launch=launch)
    assert len(host(rows)) == 0 and len(host(cols)) == 0


# ============================================================ the Index on cuda
# scan and opindex on cuda against the reference evaluator and DuckDB, every
# life cycle and output (output="device" included): tests/test_conformance.py
def _merged_index(backend, exprs):
    index = Index(algorithm="scan", backend=backend, schema=SCHEMA)
    index.add_many(range(len(exprs)), exprs)
    index.merge()     # the main segment is the backend's matcher (the delta is always matched on cpu)
    return index


def test_device_output_needs_the_cuda_backend():
    with pytest.raises(ValueError, match="backend='cuda'"):
        Index(algorithm="scan", backend="cpu").match_batch([{"a": 1}], output="device")


# ================================================================= matcher
def _matcher(segment, **options):
    from engine.algorithms.scan_cuda import ScanCudaMatcher
    return ScanCudaMatcher(segment, "cuda", **options)


def _cpu_pairs(segment, batch, truth, alive):
    from engine.algorithms.scan import ScanMatcher
    e, p = ScanMatcher(segment, "cpu").match(batch, truth, alive)
    return e.tolist(), p.tolist()


def _event_costs(batch, n_subs):
    """Device scratch bytes of each event of a host batch (as ScanCudaMatcher plans chunks)."""
    from engine.algorithms.cuda_base import ENTRY_BYTES, OFFSET_BYTES
    n_tiles = -(-n_subs // cuda_support.default_launch().compaction_tile)
    return n_subs + 16 * n_tiles + OFFSET_BYTES + ENTRY_BYTES * np.diff(batch.offsets)


@needs_cuda
def test_matcher_chunks_small_budgets_and_returns_device_arrays(monkeypatch):
    from engine.algorithms import cuda_base, scan_cuda
    seg, batch, truth = compiled()
    n_subs = len(seg)
    alive = np.ones(n_subs, np.uint8)
    want = _cpu_pairs(seg, batch, truth, alive)
    assert len(want[0]) > 3
    costs = _event_costs(batch, n_subs)
    fixed = truth.nbytes + n_subs + 16 * n_subs    # pattern table, alive flags, one event's results
    tight = fixed + int(costs.max())               # the smallest budget that fits the widest event
    for budget in (tight, fixed + int(costs[:3].sum()), None):
        e, p = _matcher(seg, device_memory=budget).match(batch, truth, alive)
        assert (e.tolist(), p.tolist()) == want
    with pytest.raises(cuda_base.DeviceMemoryError):
        _matcher(seg, device_memory=tight - 1).match(batch, truth, alive)

    # chunks of several events whose results overflow the room left are filled a row at a time
    scans, fills = [], []
    real_scan, real_fill = scan_cuda.scan_kernels.scan_kernel_cuda, cuda_base.fill_rows_cuda
    monkeypatch.setattr(scan_cuda.scan_kernels, "scan_kernel_cuda", lambda *a, **k: scans.append(a[1]) or
                        real_scan(*a, **k))
    monkeypatch.setattr(cuda_base, "fill_rows_cuda", lambda *a, **k: fills.append(a[2] - a[1]) or
                        real_fill(*a, **k))
    always, always_batch, always_truth = compiled(["n0 IS NULL OR n0 IS NOT NULL"] * 5)
    ones = np.ones(5, np.uint8)
    budget = always_truth.nbytes + 5 + 16 * 5 + int(_event_costs(always_batch, 5)[:3].sum())
    e, p = _matcher(always, device_memory=budget).match(always_batch, always_truth, ones)
    assert (e.tolist(), p.tolist()) == _cpu_pairs(always, always_batch, always_truth, ones)
    assert len(e) == 5 * len(EVENTS)
    assert max(scans) > 1 and len(scans) < len(EVENTS)      # chunks of several events ...
    assert fills == [1] * len(EVENTS)                       # ... whose results came back one event at a time
    monkeypatch.undo()

    # output="device": device arrays (NumPy under the simulator, CuPy on a GPU)
    e, p = _matcher(seg).match(batch, truth, alive, output="device")
    assert type(e) is type(cuda_support.array_module().zeros(0))
    assert (host(e).tolist(), host(p).tolist()) == want
    # device results stay on the device and count against the budget
    with pytest.raises(cuda_base.DeviceMemoryError, match="device results of earlier chunks hold .* output='numpy'"):
        _matcher(seg, device_memory=tight).match(batch, truth, alive, output="device")
    # a batch already on the device is used in place
    e, p = _matcher(seg).match(_on_device(batch), _to_device_input(truth), _to_device_input(alive))
    assert (e.tolist(), p.tolist()) == want
    mixed = event_batches.EventBatch(_to_device_input(batch.offsets), batch.attr, _to_device_input(batch.value),
                                     batch.token, batch.strings)
    e, p = _matcher(seg).match(mixed, truth, _to_device_input(alive))
    assert (e.tolist(), p.tolist()) == want


@needs_cuda
@pytest.mark.parametrize("dtype", [np.int32, np.int64])
def test_positions_cross_to_the_host_through_double_buffered_staging(dtype):
    """``transfer.positions_to_host`` in slices of a few elements (so the
    two staging buffers alternate many times) gives the positions, or the
    ids they index, as int64; ``expand_rows`` rebuilds the event column."""
    from gpu_kernels import transfer
    rng = np.random.default_rng(7)
    positions = rng.integers(0, 50, size=37).astype(dtype)
    ids = rng.integers(-10**12, 10**12, size=50).astype(np.int64)
    for staging in (4 * np.dtype(dtype).itemsize, 3, 1 << 20):     # many slices, sub-element, one slice
        out = np.full(37, -1, np.int64)
        transfer.positions_to_host(dev(positions), out, staging_bytes=staging)
        assert out.tolist() == positions.tolist()
        transfer.positions_to_host(dev(positions), out, ids, staging_bytes=staging)
        assert out.tolist() == ids[positions].tolist()
    with pytest.raises(ValueError, match="out must be int64 of length 37"):
        transfer.positions_to_host(dev(positions), np.empty(36, np.int64))
    row_ends = np.array([0, 2, 2, 5, 6], np.int64)
    rows = np.empty(6, np.int64)
    transfer.expand_rows(row_ends, np.int64(10), rows)
    assert rows.tolist() == [10, 10, 12, 12, 12, 13]



@needs_cuda
def test_two_callers_never_share_a_staging_buffer(monkeypatch):
    """Each thread copies results back through pinned buffers of its own: a
    second caller's whole copy-back, run while the first is between its
    copy and its widening (the window a shared buffer left open), leaves
    the first one's positions as they were."""
    import threading

    from gpu_kernels import transfer
    first, second = np.arange(40, dtype=np.int32), np.arange(100, 140, dtype=np.int32)
    real_widen = transfer.widen_positions
    other = {}

    def widen_after_the_other_caller(positions, table, use_ids, out):
        if threading.current_thread() is threading.main_thread() and not other:
            def run():
                other["out"] = np.empty(40, np.int64)
                transfer.positions_to_host(dev(second), other["out"])
            thread = threading.Thread(target=run)
            thread.start()
            thread.join()
        real_widen(positions, table, use_ids, out)

    monkeypatch.setattr(transfer, "widen_positions", widen_after_the_other_caller)
    out = np.empty(40, np.int64)
    transfer.positions_to_host(dev(first), out)
    assert other["out"].tolist() == second.tolist()
    assert out.tolist() == first.tolist()


@needs_cuda
def test_host_columns_cross_in_one_packed_copy():
    """``transfer.columns_to_device``: columns of every width (bool, int32
    codes, int64, float64, empty) packed into one staging buffer and moved
    together come out as they went in, each a device array of its own; a
    larger second batch grows the buffer and leaves the first batch's
    device arrays as they were."""
    from gpu_kernels import transfer
    rng = np.random.default_rng(3)

    def batch(n):
        return [rng.random(n) < 0.5, rng.integers(0, 9, n).astype(np.int32), rng.integers(-2**62, 2**62, n),
                rng.standard_normal(n), np.zeros(0, np.float64), rng.standard_normal(n).astype(np.float32)]

    small = batch(7)
    small_d = transfer.columns_to_device(small)
    assert all(cuda_support.is_device_array(d) for d in small_d)
    large = batch(5000)                               # beyond the first buffer: it grows
    large_d = transfer.columns_to_device(large)
    for host_cols, device_cols in ((small, small_d), (large, large_d)):
        for h, d in zip(host_cols, device_cols):
            back = cuda_support.to_host(d)
            assert back.dtype == h.dtype and back.shape == h.shape and np.array_equal(back, h)
    assert transfer.columns_to_device([]) == []


@needs_cuda
def test_matcher_maps_ids_and_copies_int32_positions_back(monkeypatch):
    """Host results: positions cross as int32 through the staging buffers
    (tiny here) and come out int64; ``ids`` maps them on the way, on both
    outputs; several result pieces are concatenated in order."""
    from engine.algorithms import cuda_base
    from gpu_kernels import transfer
    seg, batch, truth = compiled()
    n_subs = len(seg)
    alive = np.ones(n_subs, np.uint8)
    want_e, want_p = _cpu_pairs(seg, batch, truth, alive)
    ids = (np.arange(n_subs, dtype=np.int64) * 7 - 3)[::-1].copy()
    crossed = []
    real = transfer.positions_to_host
    monkeypatch.setattr(cuda_base.transfer, "positions_to_host",
                        lambda d, out, table=None, **kw: crossed.append(np.dtype(d.dtype)) or
                        real(d, out, table, staging_bytes=8))
    e, p = _matcher(seg).match(batch, truth, alive)
    assert (e.dtype, p.dtype) == (np.int64, np.int64)
    assert (e.tolist(), p.tolist()) == (want_e, want_p)
    assert crossed and set(crossed) == {np.dtype(np.int32)}
    e, sub = _matcher(seg).match(batch, truth, alive, ids=ids)
    assert (e.tolist(), sub.tolist()) == (want_e, ids[want_p].tolist())
    # a budget that splits the results into one piece per event
    costs = _event_costs(batch, n_subs)
    budget = truth.nbytes + n_subs + 16 * n_subs + int(costs.max())
    e, sub = _matcher(seg, device_memory=budget).match(batch, truth, alive, ids=ids)
    assert (e.tolist(), sub.tolist()) == (want_e, ids[want_p].tolist())
    e, sub = _matcher(seg).match(batch, truth, alive, output="device", ids=_to_device_input(ids))
    assert (host(e).tolist(), host(sub).tolist()) == (want_e, ids[want_p].tolist())
    with pytest.raises(ValueError, match=f"ids must be an int64 array of the segment's {n_subs}"):
        _matcher(seg).match(batch, truth, alive, ids=ids[:-1])
    with pytest.raises(ValueError, match="ids must be an int64 array"):
        _matcher(seg).match(batch, truth, alive, ids=ids.astype(np.int32))


def test_pipeline_cuts_a_host_bound_batch_into_whole_multiples_of_the_minimum():
    from engine.algorithms.cuda_base import pipeline_events
    assert pipeline_events(10_000, 4, 1024) == 3072      # whole multiples of the minimum
    assert pipeline_events(8_192, 4, 1024) == 2048
    assert pipeline_events(3_000, 4, 1024) == 1024       # no chunk under the minimum
    assert pipeline_events(2_047, 4, 1024) == 2047       # too few events for two chunks: one
    assert pipeline_events(10, 3, 1) == 4
    assert pipeline_events(10, 1, 1) == 10               # pipelining off
    assert pipeline_events(1, 4, 1) == 1
    assert pipeline_events(10, 4, 0) == 3                # a minimum under one event is one


@needs_cuda
def test_host_results_are_written_in_place_by_a_worker_while_the_caller_goes_on(monkeypatch):
    """``transfer.HostResults``: :meth:`add` hands a piece's copy-back to a
    worker thread and returns before it is done (the caller would launch
    the next chunk then); pieces land in order in arrays sized from the
    density seen so far and grown when a denser piece comes (here: sized
    for 5 pairs after the first piece, grown to 24 by the second); ids are
    mapped; a worker's error reaches :meth:`result`; ``overlap=False``
    copies in the caller's thread."""
    import threading

    from gpu_kernels import transfer
    rng = np.random.default_rng(11)
    ids = rng.integers(-10**12, 10**12, size=40).astype(np.int64)
    pieces = [(0, [0, 1, 1]), (2, [0, 3, 3, 10]), (5, [0, 0, 0]), (7, [0, 2, 2, 4])]
    positions = [rng.integers(0, 40, size=ends[-1]).astype(np.int32) for _, ends in pieces]
    want_rows = [first + r for first, ends in pieces for r in range(len(ends) - 1)
                 for _ in range(ends[r + 1] - ends[r])]
    want_ids = ids[np.concatenate(positions)].tolist()

    real = transfer.positions_to_host
    go, threads, stagings = threading.Event(), [], []

    def held_back(positions_d, out, table=None, **kw):
        threads.append(threading.current_thread())
        stagings.append(kw["staging"])
        assert go.wait(10), "the caller never let the worker go on"
        real(positions_d, out, table, **kw)

    monkeypatch.setattr(transfer, "positions_to_host", held_back)
    results = transfer.HostResults(10, ids, staging_bytes=8)
    results.add(pieces[0][0], np.array(pieces[0][1], np.int64), dev(positions[0]))
    assert not go.is_set() and results.pending_bytes == positions[0].nbytes     # add returned, the copy waits
    assert len(results.rows) == 5                        # 1 pair in 2 of 10 events, a tenth more
    go.set()
    for (first, ends), pos in zip(pieces[1:], positions[1:]):
        results.add(first, np.array(ends, np.int64), dev(pos))
    assert len(results.rows) == 24                       # 11 pairs in 5 events: 22, a tenth more
    rows, sub = results.result()
    assert (rows.tolist(), sub.tolist()) == (want_rows, want_ids)
    assert results.pending_bytes == 0
    # the first two pieces by the worker; the last, with nothing left to overlap, in the caller's thread
    assert len(threads) == 3 and threads[2] is threading.main_thread()
    assert all(t is not threading.main_thread() and t.name.startswith("bexmatch-copy-back") for t in threads[:2])
    # the worker copies through its caller's pinned buffers (a second set would pin as much again)
    assert all(staging is transfer.thread_staging() for staging in stagings)

    threads.clear()
    inline = transfer.HostResults(10, None, overlap=False)
    for (first, ends), pos in zip(pieces, positions):
        inline.add(first, np.array(ends, np.int64), dev(pos))
    assert inline.result()[1].tolist() == np.concatenate(positions).tolist()
    assert threads and all(t is threading.main_thread() for t in threads)

    # two callers at once: each its own worker (and so its own staging buffers), each its own answer
    answers = {}

    def caller(k):
        mine = transfer.HostResults(10, ids + k)
        for (first, ends), pos in zip(pieces, positions):
            mine.add(first, np.array(ends, np.int64), dev(pos))
        answers[k] = mine.result()[1].tolist()

    threads.clear()
    callers = [threading.Thread(target=caller, args=(k,)) for k in (1, 2)]
    for thread in callers:
        thread.start()
    for thread in callers:
        thread.join()
    assert answers == {k: (np.array(want_ids) + k).tolist() for k in (1, 2)}
    workers = {t for t in threads if t not in callers}
    assert len(workers) == 2 and threading.main_thread() not in workers

    # sized by density, never past every later event matching all subscriptions; a result that used
    # less than half of its arrays comes back as copies (the views would hold the whole arrays)
    dense_first = transfer.HostResults(100, None, max_per_event=3)
    dense_first.add(0, np.array([0, 3], np.int64), dev(positions[1][:3]))
    assert len(dense_first.rows) == 3 + 99 * 3              # not 3 pairs x 100 events x 1.1
    dense_first.add(1, np.array([0] * 99 + [1], np.int64), dev(positions[1][3:4]))
    rows, sub = dense_first.result()
    assert rows.tolist() == [0, 0, 0, 99] and sub.tolist() == positions[1][:4].tolist()
    assert rows.base is None and sub.base is None
    # a projection beyond memory falls back to what the pairs need
    huge = transfer.HostResults(1 << 40, None)
    huge.add(0, np.array([0, 5], np.int64), dev(positions[1][:5]))
    assert huge.result()[1].tolist() == positions[1][:5].tolist()

    import numba                                         # a layer that takes one thread at a time: no worker
    monkeypatch.setattr(numba, "threading_layer", lambda: "workqueue")
    assert not transfer.HostResults(10, None).overlap
    monkeypatch.setattr(numba, "threading_layer", lambda: "omp")
    assert transfer.HostResults(10, None).overlap

    def broken(*a, **k):
        raise RuntimeError("copy failed")

    monkeypatch.setattr(transfer, "positions_to_host", broken)
    failing = transfer.HostResults(10, None)
    failing.add(0, np.array([0, 2], np.int64), dev(positions[1][:2]))
    with pytest.raises(RuntimeError, match="copy failed"):
        failing.result()
    failing.add(0, np.array([0, 2], np.int64), dev(positions[1][:2]))
    failing.abandon()                                    # the caller's error wins: the worker's is dropped
    assert failing.pending_bytes == 0


@needs_cuda
@pytest.mark.parametrize("budget", ["unlimited", "tight"])
def test_next_chunk_runs_while_the_last_ones_results_are_copied_back(monkeypatch, budget):
    """A batch whose results go to the host is cut into pipeline chunks,
    and chunk k + 1 is matched while chunk k's results are still being
    copied back: each copy-back waits (up to 10 s) for a later chunk to
    start, which a serial loop would never do.  Results equal the cpu
    matcher's, with ids too, under an unlimited and the tightest budget
    (the piece in flight counted against it); device output is not cut."""
    import threading

    from engine.algorithms import cuda_base
    from gpu_kernels import transfer
    seg, batch, truth = compiled()
    n_subs = len(seg)
    alive = np.ones(n_subs, np.uint8)
    want = _cpu_pairs(seg, batch, truth, alive)
    ids = np.arange(n_subs, dtype=np.int64) * 3 + 5
    memory = None if budget == "unlimited" else \
        truth.nbytes + n_subs + 16 * n_subs + int(_event_costs(batch, n_subs).max())
    matcher = _matcher(seg, device_memory=memory)
    matcher.pipeline_chunks, matcher.pipeline_min_events = 3, 1       # 6 events: chunks of 2

    started, overlapped = [], []
    moved = threading.Condition()
    real_chunk, real_copy = matcher._match_chunk, transfer.HostResults._copy_back

    def chunk(batch, events_d, offsets, start, stop, *rest):
        with moved:
            started.append((start, stop))
            moved.notify_all()
        yield from real_chunk(batch, events_d, offsets, start, stop, *rest)

    def copy_back(self, row_ends, first_row, *rest):
        last = first_row + len(row_ends) - 1
        if last < len(EVENTS) and budget == "unlimited":
            with moved:
                overlapped.append(moved.wait_for(lambda: any(s >= last for s, _ in started), timeout=10))
        real_copy(self, row_ends, first_row, *rest)

    monkeypatch.setattr(matcher, "_match_chunk", chunk)
    monkeypatch.setattr(transfer.HostResults, "_copy_back", copy_back)
    e, p = matcher.match(batch, truth, alive)
    assert (e.tolist(), p.tolist()) == want
    if budget == "unlimited":
        assert started == [(0, 2), (2, 4), (4, 6)]
        assert overlapped and all(overlapped)
    else:
        assert all(stop - start <= 2 for start, stop in started)
    started.clear()
    e, sub = matcher.match(batch, truth, alive, ids=ids)
    assert (e.tolist(), sub.tolist()) == (want[0], ids[want[1]].tolist())
    if budget == "unlimited":       # (device results are held on the device: the tight budget cannot take them)
        started.clear()
        e, p = matcher.match(batch, truth, alive, output="device")
        assert (host(e).tolist(), host(p).tolist()) == want
        assert started == [(0, 6)]


@needs_cuda
def test_a_last_pipeline_chunk_under_the_minimum_joins_the_one_before(monkeypatch):
    seg, batch, truth = compiled(events=EVENTS + EVENTS[:1])          # 7 events
    alive = np.ones(len(seg), np.uint8)
    matcher = _matcher(seg)
    matcher.pipeline_chunks, matcher.pipeline_min_events = 4, 2       # chunks of 2 ...
    started, real_chunk = [], matcher._match_chunk

    def chunk(batch, events_d, offsets, start, stop, *rest):
        started.append((start, stop))
        yield from real_chunk(batch, events_d, offsets, start, stop, *rest)

    monkeypatch.setattr(matcher, "_match_chunk", chunk)
    e, p = matcher.match(batch, truth, alive)
    assert (e.tolist(), p.tolist()) == _cpu_pairs(seg, batch, truth, alive)
    assert started == [(0, 2), (2, 4), (4, 7)]                       # ... and no last one of 1


@needs_cuda
def test_a_call_waits_for_a_piece_an_interrupted_call_left_in_flight(monkeypatch):
    """A call cut by an interrupt (Ctrl-C) while its piece was being copied
    back leaves the worker copying through this thread's staging buffers:
    the thread's next call waits for that piece before it copies anything
    (else the two copies shared the buffers and the next call's positions
    came out wrong).  A piece whose copy is done holds no device bytes."""
    import threading

    from gpu_kernels import transfer
    go = threading.Event()
    real = transfer.positions_to_host

    def held_back(positions_d, out, table=None, **kw):
        assert go.wait(10)
        real(positions_d, out, table, **kw)

    monkeypatch.setattr(transfer, "positions_to_host", held_back)
    interrupted = transfer.HostResults(10, None)
    interrupted.add(0, np.array([0, 2], np.int64), dev(np.arange(2, dtype=np.int32)))
    left = interrupted._pending                  # the call ends here, its piece still in flight
    assert not left.done() and interrupted.pending_bytes == 8
    threading.Timer(0.2, go.set).start()
    following = transfer.HostResults(10, None)   # waits for the piece the interrupted call left
    assert left.done()
    following.add(0, np.array([0, 3], np.int64), dev(np.arange(5, 8, dtype=np.int32)))
    assert following._pending.result() is None and following.pending_bytes == 0    # done: nothing held
    following.add(9, np.array([0, 1], np.int64), dev(np.array([9], np.int32)))
    assert following.result()[1].tolist() == [5, 6, 7, 9]


@needs_cuda
def test_the_copy_back_worker_keeps_the_callers_numba_threads(monkeypatch):
    """numba's thread count is per thread: a caller that limits its own
    (a Spark or Dask task slot) limits its copy-back worker too."""
    import threading

    import numba

    from gpu_kernels import transfer
    seen = []
    real = transfer.positions_to_host

    def watched(positions_d, out, table=None, **kw):
        seen.append((threading.current_thread(), numba.get_num_threads()))
        real(positions_d, out, table, **kw)

    monkeypatch.setattr(transfer, "positions_to_host", watched)
    before = numba.get_num_threads()
    numba.set_num_threads(1)
    try:
        results = transfer.HostResults(4, None)
        results.add(0, np.array([0, 2], np.int64), dev(np.arange(2, dtype=np.int32)))
        results.add(1, np.array([0, 1, 1, 3], np.int64), dev(np.arange(3, dtype=np.int32)))
        assert results.result()[0].tolist() == [0, 0, 1, 3, 3]
    finally:
        numba.set_num_threads(before)
    assert seen[0][0] is not threading.main_thread() and seen[0][1] == 1


@needs_cuda
def test_a_copied_back_piece_leaves_the_device_before_the_next_is_filled(monkeypatch):
    """A piece's device arrays (event rows, never read on the host path, and
    positions, once copied back) are freed before the next piece of the
    chunk is filled: the room a chunk planned for its results holds one
    piece at a time."""
    import weakref

    from engine.algorithms import cuda_base
    always, batch, truth = compiled(["n0 IS NULL OR n0 IS NOT NULL"] * 5)
    ones = np.ones(5, np.uint8)
    budget = truth.nbytes + 5 + 16 * 5 + int(_event_costs(batch, 5)[:3].sum())
    made, alive_then = [], []
    real_fill = cuda_base.fill_rows_cuda

    def fill(*a, **k):
        alive_then.append(sum(ref() is not None for ref in made))
        rows, cols = real_fill(*a, **k)
        made.extend((weakref.ref(rows), weakref.ref(cols)))
        return rows, cols

    monkeypatch.setattr(cuda_base, "fill_rows_cuda", fill)
    e, p = _matcher(always, device_memory=budget).match(batch, truth, ones)
    assert (e.tolist(), p.tolist()) == _cpu_pairs(always, batch, truth, ones)
    assert len(alive_then) == len(EVENTS) and alive_then == [0] * len(EVENTS)


@needs_cuda
def test_a_match_after_the_main_thread_returned_still_copies_back(tmp_path):
    """A thread that matches after the main thread has returned (a server's
    pattern) still gets its results: the interpreter takes no new worker
    tasks then, so the pieces are copied back in the caller's thread."""
    script = tmp_path / "late.py"
    script.write_text(textwrap.dedent(f"""
        import sys, threading
        sys.path.insert(0, {str(ROOT)!r})
        import numpy as np
        from tests.test_cuda_sim import compiled, _matcher, _cpu_pairs

        seg, batch, truth = compiled()
        alive = np.ones(len(seg), np.uint8)
        matcher = _matcher(seg)
        matcher.pipeline_chunks, matcher.pipeline_min_events = 3, 1

        def late():
            threading.main_thread().join()
            e, p = matcher.match(batch, truth, alive)
            print("same" if (e.tolist(), p.tolist()) == _cpu_pairs(seg, batch, truth, alive) else "different")

        threading.Thread(target=late).start()
    """))
    env = dict(os.environ, NUMBA_ENABLE_CUDASIM="1")
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "same"


@needs_cuda
@pytest.mark.parametrize("algorithm", ["scan", "opindex", "betree", "apcm", "pstbloom", "psthash", "atree"])
def test_a_batch_of_events_without_attributes_reads_no_padding(algorithm):
    """A chunk without one attribute entry has device arrays of one padding
    element (zeros: attribute 0, token 0), which no kernel may take for an
    entry -- A-PCM's encoding did, and with a list attribute as attribute 0
    read the list table out of bounds (found by the conformance suite)."""
    answers = []
    for backend in ("cpu", "cuda"):
        index = Index(algorithm=algorithm, backend=backend)
        index.add_many([0, 1, 2], ["l1 ONE OF ('a') AND n0 = 0", "n0 = 0", "l1 IS NULL"])
        index.merge()
        answers.append(([m.tolist() for m in index.match_batch([{}, {}])], index.match({}).tolist(),
                        index.match({"n0": 0}).tolist()))
    assert answers[1] == answers[0] == ([[2], [2]], [2], [1, 2])


@needs_cuda
@pytest.mark.parametrize("algorithm", ["scan", "opindex", "betree", "apcm", "pstbloom", "psthash", "atree"])
def test_every_cuda_algorithm_answers_the_same_through_pipeline_chunks(monkeypatch, algorithm):
    """Every cuda matcher through the pipelined host path (chunks of 3
    events, results copied back by the worker) answers as on cpu."""
    from engine.algorithms import cuda_base, registry
    assert algorithm in registry.names("cuda")
    monkeypatch.setattr(cuda_base.ChunkedCudaMatcher, "pipeline_min_events", 1)
    monkeypatch.setattr(cuda_base.ChunkedCudaMatcher, "pipeline_chunks", 4)
    events = EVENTS * 2
    answers = []
    for backend in ("cpu", "cuda"):
        index = Index(algorithm=algorithm, backend=backend, schema=SCHEMA)
        index.add_many(range(len(EXPRESSIONS)), EXPRESSIONS)
        index.merge()
        answers.append([sorted(ids.tolist()) for ids in index.match_batch(events)])
    assert answers[0] == answers[1] and sum(map(len, answers[0])) > 0


def _to_device_input(x):
    """How a caller hands over a device array: CuPy on a GPU, the
    simulator's cuda.to_device under it."""
    if SIMULATED:
        return cuda_support.load_cuda().to_device(x)
    # CuPy's own copy, as a caller makes it: cuda_support.to_device pads a
    # zero-length array to one element (for kernel arguments), which made a
    # zero-row column a one-row one on an H100
    import cupy
    return cupy.asarray(x)


def _on_device(batch):
    return event_batches.EventBatch(*(_to_device_input(getattr(batch, f)) for f in ("offsets", "attr", "value",
                                                                                    "token")), batch.strings)


@needs_cuda
def test_batch_that_can_never_fit_is_refused_clearly():
    from engine.backend import DeviceMemoryError
    seg, batch, truth = compiled()
    alive = np.ones(len(seg), np.uint8)
    with pytest.raises(DeviceMemoryError, match=r"event \d+ of the batch cannot fit the device memory budget.*"
                                                r"hit row of 11 bytes"):
        _matcher(seg, device_memory=200).match(batch, truth, alive)
    with pytest.raises(ValueError, match="device_memory must be a positive"):
        _matcher(seg, device_memory=0)


@needs_cuda
def test_bad_inputs_on_the_cuda_path_raise_clear_errors(monkeypatch, tmp_path):
    seg, batch, truth = compiled()
    alive = np.ones(len(seg), np.uint8)
    matcher = _matcher(seg)
    wrong_attr = event_batches.EventBatch(batch.offsets, batch.attr.astype(np.int64), batch.value, batch.token,
                                          batch.strings)
    with pytest.raises(TypeError, match="'attr' must have dtype int32, got int64"):
        matcher.match(wrong_attr, truth, alive)
    wrong_value = event_batches.EventBatch(batch.offsets, batch.attr, batch.value.astype(np.float32), batch.token,
                                           batch.strings)
    with pytest.raises(TypeError, match="'value' must have dtype float64, got float32"):
        matcher.match(wrong_value, truth, alive)
    with pytest.raises(TypeError, match="pattern_truth must have dtype uint8, got int64"):
        matcher.match(batch, truth.astype(np.int64), alive)
    with pytest.raises(TypeError, match="alive must have dtype uint8, got bool"):
        matcher.match(batch, truth, alive.astype(bool))
    with pytest.raises(ValueError, match="alive has 3 flags for a segment of 11 subscriptions"):
        matcher.match(batch, truth, alive[:3])
    with pytest.raises(TypeError, match="must be an engine.events.EventBatch"):
        matcher.match({"n0": 1}, truth, alive)
    with pytest.raises(TypeError, match="pattern_truth must be an array"):
        matcher.match(batch, [[1]], alive)
    broken = event_batches.EventBatch(batch.offsets + 1, batch.attr, batch.value, batch.token, batch.strings)
    with pytest.raises(ValueError, match="offsets do not describe"):
        matcher.match(broken, truth, alive)
    with pytest.raises(ValueError, match="pattern_truth has 1 pattern columns"):
        matcher.match(batch, truth[:, :1].copy(), alive)
    with pytest.raises(ValueError, match="output must be one of 'numpy', 'device'"):
        matcher.match(batch, truth, alive, output="arrow")
    from engine.algorithms.scan_cuda import ScanCudaMatcher
    with pytest.raises(ValueError, match="runs on backend 'cuda'"):
        ScanCudaMatcher(seg, "cpu")
    uncoded = compiled()[0]
    uncoded.predicates.lo = None
    with pytest.raises(ValueError, match="recode"):
        _matcher(uncoded)
    # a program deeper than the kernel's per-thread stack: refused when the matcher is built
    from gpu_kernels import scan as scan_kernels
    monkeypatch.setattr(scan_kernels, "MAX_STACK_DEPTH", 3)
    with pytest.raises(ExpressionTooLarge, match=r"subscription 1 needs an operand stack of 4 entries.*at most 3"):
        _matcher(compiled(["n0 = 1", "n0 = 1 AND n1 = 2 AND n2 = 3 AND s0 = 'a'"])[0])
    # ... and the Index matches it on the host as a residual subscription, or refuses it with strict=True
    deep = "n0 = 1 AND n1 = 2 AND n2 = 3 AND s0 = 'a'"
    with pytest.raises(ExpressionTooLarge):
        Index(algorithm="scan", backend="cuda", strict=True).add(1, deep)
    for exprs in ([deep], [deep, "n0 = 1"]):
        index = _merged_index("cuda", exprs)
        assert index.statistics()["residual"] == 1
        assert index.match({"n0": 1, "n1": 2, "n2": 3, "s0": "a"}).tolist() == list(range(len(exprs)))
        assert index.match({"n0": 1}).tolist() == [1][:len(exprs) - 1]
    # ... and so does a cpu index's file loaded on cuda (its own flags are the cpu's: none)
    saved = _merged_index("cpu", [deep, "n0 = 1"])
    path = tmp_path / "cpu.bexidx"
    saved.save(path)
    for algorithm in ("scan", "opindex"):
        loaded = Index.load(path, backend="cuda", algorithm=algorithm)
        assert loaded.statistics()["residual"] == 1
        assert loaded.match({"n0": 1, "n1": 2, "n2": 3, "s0": "a"}).tolist() == [0, 1]


# ============================================================ real hardware
@needs_cuda
@pytest.mark.skipif(SIMULATED, reason="full-size runs need real GPU hardware (the simulator runs each thread "
                                      "in Python)")
class TestFullSize:
    """scan on cuda against scan on cpu at sizes only a GPU runs quickly."""

    n_subs, n_events = 6000, 500

    @pytest.mark.parametrize("name,scale", [("W1", 0.02), ("W2", 0.02), ("W4", 0.005)])
    def test_standard_workloads_agree_with_cpu(self, name, scale):
        from engine.workloads import standard
        workload = standard(name, scale=scale, n_events=2000)
        results = {}
        for backend in ("cpu", "cuda"):
            index = Index(algorithm="scan", backend=backend)
            index.add_many(workload.subscriptions)
            index.merge()
            results[backend] = index.match_batch(workload.events, output="arrow")
        assert results["cuda"].equals(results["cpu"])
        assert results["cpu"].num_rows > 0

    def test_random_expressions_chunked_device_io(self):
        rng = np.random.default_rng(11)
        joins = (" AND ", " OR ", " XOR ", " XNOR ", " AND NOT ")
        exprs = [f"({EXPRESSIONS[a]}){joins[j]}({EXPRESSIONS[b]})"
                 for a, j, b in zip(rng.integers(0, len(EXPRESSIONS), self.n_subs),
                                    rng.integers(0, len(joins), self.n_subs),
                                    rng.integers(0, len(EXPRESSIONS), self.n_subs))]
        numbers, strings = [-2.5, -1, 0, 0.5, 1, 2, 2.5, 3, 7.75], ["", "a", "ab", "abc", "b", "ba", "c", "cab", "z"]
        events = []
        for _ in range(self.n_events):
            event = {a: float(rng.choice(numbers)) for a in strategies.NUMERIC_ATTRS if rng.random() < 0.7}
            event.update({a: str(rng.choice(strings)) for a in strategies.STRING_ATTRS if rng.random() < 0.7})
            if rng.random() < 0.7:
                event["b0"] = bool(rng.random() < 0.5)
            events.append(event)
        seg, batch, truth = compiled(exprs, events)
        alive = (rng.random(len(seg)) < 0.9).astype(np.uint8)
        want = _cpu_pairs(seg, batch, truth, alive)
        assert len(want[0]) > self.n_events
        for budget in (None, 4 << 20, 256 << 10):
            e, p = _matcher(seg, device_memory=budget).match(batch, truth, alive)
            assert (e.tolist(), p.tolist()) == want
        e, p = _matcher(seg).match(_on_device(batch), _to_device_input(truth), _to_device_input(alive),
                                   output="device")
        assert type(e) is type(cuda_support.array_module().zeros(0))   # CuPy on a GPU
        assert (host(e).tolist(), host(p).tolist()) == want

    def test_deep_programs_use_a_larger_stack_tier(self):
        wide = " AND ".join(f"n{i % 3} != {i}" for i in range(200))
        seg, batch, truth = compiled([wide, "n0 = 1"], EVENTS)
        matcher = _matcher(seg)
        assert matcher.stack_depth == 256
        e, p = matcher.match(batch, truth, np.ones(2, np.uint8))
        assert (e.tolist(), p.tolist()) == _cpu_pairs(seg, batch, truth, np.ones(2, np.uint8))
