"""The eight list operators (ONE OF ... IS NOT EMPTY) at the kernel level,
independent of the language layer: predicate rows built by hand, an
EventBatch built by hand with its list table (``list_truth``: packed CSR,
the rows' offsets then each row's TRUE keys), checked through
``entry_truth`` / ``predicate_truth`` on the CPU and through the CUDA
device functions (simulator or GPU), through the scan kernels, against
every algorithm's operator tables, and through the cuda input checks.
A short end-to-end check runs every algorithm on list subscriptions.

The expected truth is computed here from the keys alone: a list operator
is NULL on an absent attribute, and otherwise its key's membership in the
event list's row (negated for NONE OF, NOT ALL OF, NOT CONTAINS); IS EMPTY
and IS NOT EMPTY read the entry's value (its distinct non-null elements).
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest

from engine import available_backends
from engine.algorithms.base import alive_flags
from engine.events import EventBatch
from gpu_kernels import cuda_support, opcodes
from gpu_kernels import predicates as P

FIRST_LIST_OP = opcodes.FIRST_LIST_OP
LIST_OPS = tuple(range(opcodes.FIRST_LIST_OP, opcodes.LAST_LIST_OP + 1))
NEGATED = (opcodes.NONE_OF, opcodes.NOT_ALL_OF, opcodes.NOT_CONTAINS)
HAVE_CUDA = "cuda" in available_backends()
needs_cuda = pytest.mark.skipif(not HAVE_CUDA, reason="needs a CUDA GPU with CuPy, or numba's simulator "
                                                      "(NUMBA_ENABLE_CUDASIM=1 set before the run)")
cuda = None   # numba.cuda once a test kernel is built (a module global: the simulator swaps it in kernels)

# ---------------------------------------------------------------- the batch
#: attribute 0: a list; attribute 1: a number (a non-list predicate beside the list ones)
LIST_ATTR, NUM_ATTR = 0, 1
#: the TRUE keys of each event list (row): row 0 the empty list, rows 1-2 two lists with elements
ROW_KEYS = [[], [0, 3], [1, 2, 5]]
#: (list row or None for an absent list, the list's distinct non-null elements, the number or None)
EVENTS = [(None, 0, 4.0), (0, 0, None), (1, 2, 1.0), (2, 3, None), (None, 0, None), (1, 1, 2.0)]


def list_table(row_keys=ROW_KEYS) -> np.ndarray:
    """``EventBatch.list_truth`` of the rows' TRUE keys."""
    n = len(row_keys)
    sizes = [len(k) for k in row_keys]
    offsets = n + 1 + np.concatenate(([0], np.cumsum(sizes)))
    keys = [sorted(k) for k in row_keys]
    return np.concatenate((offsets, *[np.asarray(k, np.int64) for k in keys])).astype(np.int64)


def batch() -> EventBatch:
    offsets, attr, value, token = [0], [], [], []
    for row, count, number in EVENTS:
        if row is not None:
            attr.append(LIST_ATTR)
            value.append(float(count))
            token.append(row)
        if number is not None:
            attr.append(NUM_ATTR)
            value.append(number)
            token.append(-1)
        offsets.append(len(attr))
    return EventBatch(np.array(offsets, np.int64), np.array(attr, np.int32), np.array(value, np.float64),
                      np.array(token, np.int32), pa.array([], pa.large_string()), list_truth=list_table())


# ------------------------------------------------------------ the predicates
def predicate_rows():
    """Every list operator on operand lists 0-2 (aux), then ``number >= 2``
    and the NULL tests of the list: ``(attr, op, lo, hi, set_offsets,
    set_values, aux)`` as the compiled table holds them."""
    rows = [(LIST_ATTR, op, aux) for op in LIST_OPS for aux in (0, 1, 2)]
    rows += [(NUM_ATTR, opcodes.GE, -1), (LIST_ATTR, opcodes.IS_NULL, -1), (LIST_ATTR, opcodes.IS_NOT_NULL, -1)]
    attr = np.array([r[0] for r in rows], np.int32)
    op = np.array([r[1] for r in rows], np.int8)
    aux = np.array([r[2] for r in rows], np.int64)
    lo = np.where(op == opcodes.GE, 2.0, 0.0)
    hi = np.zeros(len(rows))
    return attr, op, lo, hi, np.zeros(len(rows) + 1, np.int64), np.zeros(0, np.float64), aux


def expected(op: int, aux: int, event) -> int:
    row, count, number = event
    if op == opcodes.GE:
        return opcodes.NULL if number is None else opcodes.TRUE if number >= 2.0 else opcodes.FALSE
    if op == opcodes.IS_NULL:
        return opcodes.TRUE if row is None else opcodes.FALSE
    if op == opcodes.IS_NOT_NULL:
        return opcodes.FALSE if row is None else opcodes.TRUE
    if row is None:
        return opcodes.NULL
    if op == opcodes.IS_EMPTY:
        hit = count == 0
    elif op == opcodes.IS_NOT_EMPTY:
        hit = count != 0
    else:
        key = 2 * aux + (1 if op in (opcodes.ALL_OF, opcodes.NOT_ALL_OF) else 0)
        hit = (key in ROW_KEYS[row]) != (op in NEGATED)
    return opcodes.TRUE if hit else opcodes.FALSE


def want_matrix() -> np.ndarray:
    _, op, *_, aux = predicate_rows()
    return np.array([[expected(int(o), int(a), ev) for o, a in zip(op, aux)] for ev in EVENTS], np.int8)


def entry_truth_matrix(entry_truth, find) -> np.ndarray:
    b = batch()
    attr, op, lo, hi, set_offsets, set_values, aux = predicate_rows()
    pattern_truth = np.zeros((1, 1), np.uint8)
    got = np.empty((len(EVENTS), len(op)), np.int8)
    for e in range(len(EVENTS)):
        for p in range(len(op)):
            pos = find(b.attr, b.offsets[e], b.offsets[e + 1], attr[p])
            got[e, p] = entry_truth(p, pos, b.value, b.token, op, lo, hi, set_offsets, set_values, aux,
                                    pattern_truth, b.list_truth)
    return got


# ---------------------------------------------------------------------- CPU
def test_the_expectations_cover_every_case():
    """Absent -> NULL; the empty list -> IS EMPTY TRUE, ONE OF FALSE, NONE
    OF TRUE; and each operator both TRUE and FALSE on present lists."""
    want = want_matrix()
    _, op, *_ = predicate_rows()
    listed = np.isin(op, LIST_OPS)
    absent = np.array([ev[0] is None for ev in EVENTS])
    assert (want[np.ix_(absent, listed)] == opcodes.NULL).all()
    empty = EVENTS.index((0, 0, None))
    assert (want[empty, op == opcodes.IS_EMPTY] == opcodes.TRUE).all()
    assert (want[empty, op == opcodes.IS_NOT_EMPTY] == opcodes.FALSE).all()
    assert (want[empty, op == opcodes.ONE_OF] == opcodes.FALSE).all()
    assert (want[empty, op == opcodes.NONE_OF] == opcodes.TRUE).all()
    for code in LIST_OPS:
        assert set(want[np.ix_(~absent, op == code)].ravel().tolist()) == {opcodes.TRUE, opcodes.FALSE}, code


def test_list_key_and_list_hit():
    table = list_table()
    for fn_key, fn_hit in ((P.list_key_py, P.list_hit_py), (P.list_key, P.list_hit)):
        assert [fn_key(op, 3) for op in LIST_OPS] == [6, 6, 7, 7, 6, 6, 6, 6]
        for row, keys in enumerate(ROW_KEYS):
            for key in range(-2, 8):
                assert bool(fn_hit(table, row, key)) == (key in keys), (row, key)
    # a batch without lists: zero rows
    assert EventBatch(np.zeros(1, np.int64), np.zeros(0, np.int32), np.zeros(0), np.zeros(0, np.int32),
                      pa.array([], pa.large_string())).list_truth.tolist() == [1]


def test_entry_truth_on_every_list_operator():
    assert entry_truth_matrix(P.entry_truth, P.find_attribute).tolist() == want_matrix().tolist()


def test_predicate_truth_takes_the_list_result_as_its_hit():
    for op in LIST_OPS:
        for hit in (False, True):
            for value in (0.0, 2.0):
                got = P.predicate_truth(op, 0.0, 0.0, np.zeros(0), 0, 0, hit, True, value)
                if op == opcodes.IS_EMPTY:
                    want = value == 0.0
                elif op == opcodes.IS_NOT_EMPTY:
                    want = value != 0.0
                else:
                    want = hit != (op in NEGATED)
                assert got == (opcodes.TRUE if want else opcodes.FALSE), (op, hit, value)
                assert P.predicate_truth(op, 0.0, 0.0, np.zeros(0), 0, 0, hit, False, value) == opcodes.NULL


def test_predicate_truth_many_on_list_operators():
    cases = [(op, hit, present, value) for op in LIST_OPS for hit in (0, 1) for present in (0, 1)
             for value in (0.0, 3.0)]
    op, hit, present, value = (np.array(c) for c in zip(*cases))
    out = np.full(len(cases), -1, np.int8)
    P.predicate_truth_many(op.astype(np.int8), np.zeros(len(cases)), np.zeros(len(cases)),
                           np.zeros(len(cases) + 1, np.int64), np.zeros(0), hit.astype(np.uint8),
                           present.astype(np.uint8), value.astype(np.float64), out)
    for i, (o, h, pr, v) in enumerate(cases):
        want = P.predicate_truth(int(o), 0.0, 0.0, np.zeros(0), 0, 0, bool(h), bool(pr), float(v))
        assert out[i] == want


def scan_arguments():
    """One single-LEAF program per predicate row, the batch, and the expected hits."""
    b = batch()
    attr, op, lo, hi, set_offsets, set_values, aux = predicate_rows()
    n = len(op)
    prog_offsets = np.arange(n + 1, dtype=np.int64)
    prog_kind = np.full(n, opcodes.LEAF, np.int8)
    prog_arg = np.arange(n, dtype=np.int32)
    args = [b.offsets, b.attr, b.value, b.token, prog_offsets, prog_kind, prog_arg, alive_flags(np.ones(n, np.uint8)),
            attr, op, lo, hi, set_offsets, set_values, aux, np.zeros((1, 1), np.uint8), b.list_truth]
    return args, (want_matrix() == opcodes.TRUE).astype(np.uint8)


def test_scan_kernel_reads_the_list_table():
    from gpu_kernels.scan import scan_kernel
    args, want = scan_arguments()
    out = np.full(want.shape, 9, np.uint8)
    scan_kernel(0, len(EVENTS), *args, 1, out)
    assert out.tolist() == want.tolist()


# ------------------------------------------------------- operator tables
def test_every_algorithm_treats_list_operators_as_not_indexable():
    """As LIKE / MATCHES: never searched by value, always verified by the entry's token."""
    from engine.algorithms import opindex
    from gpu_kernels.apcm import layout as apcm_layout
    from gpu_kernels.atree import layout as atree_layout
    from gpu_kernels.betree.layout import INTERVAL_OPS
    from gpu_kernels.opindex.layout import L_VERIFY
    from gpu_kernels.pstree import layout as pstree_layout
    ops = np.array(LIST_OPS)
    assert len(pstree_layout.OPERATOR_CLASS) == opcodes.N_OPS
    assert (pstree_layout.OPERATOR_CLASS[ops] == pstree_layout.NOT_INDEXABLE).all()
    assert len(atree_layout._CLASS_OF_OP) == len(atree_layout._LEAF_ESTIMATE) == opcodes.N_OPS
    assert (atree_layout._CLASS_OF_OP[ops] == -1).all()
    assert set(LIST_OPS) <= set(apcm_layout.TOKEN_OPS)
    assert not set(LIST_OPS) & set(INTERVAL_OPS)
    assert len(opindex._LIST_CONJ) == len(opindex._LIST_CNF) == opcodes.N_OPS
    assert (opindex._LIST_CONJ[ops] == L_VERIFY).all() and (opindex._LIST_CNF[ops] == L_VERIFY).all()
    assert not set(LIST_OPS) & set(opindex._VALUED)


def test_betree_gives_list_operators_the_whole_domain():
    from engine.algorithms.betree import interval_keys
    from engine.algorithms.units import PredicateRows
    from gpu_kernels.betree.layout import KEY_MAX, KEY_MIN
    attr, op, lo, hi, set_offsets, set_values, aux = predicate_rows()
    rows = PredicateRows(attr, op, lo, hi, aux, set_offsets, set_values)
    low, high, has = interval_keys(rows, np.zeros(2, np.uint8), np.zeros(1, np.float64))
    listed = np.isin(op, LIST_OPS)
    assert (low[listed] == KEY_MIN).all() and (high[listed] == KEY_MAX).all() and has[listed].all()


# -------------------------------------------------------- cuda input checks
def test_cuda_checks_the_list_table():
    from engine.algorithms.cuda_base import check_batch
    b = batch()
    args = (np.zeros((1, 1), np.uint8), np.ones(2, np.uint8), 2, 0)
    attrs = dict(list_attrs=np.array([LIST_ATTR], np.int32), pattern_attrs=np.zeros(0, np.int32))
    assert check_batch(b, *args, **attrs).tolist() == b.offsets.tolist()
    # (list tokens are rows of the list table, not of the pattern table)
    bad = [(np.array([1.0]), TypeError, "dtype int64"),
           (np.zeros((1, 1), np.int64), ValueError, "1-dimensional"),
           (np.zeros(0, np.int64), ValueError, "does not start"),
           (np.array([5, 5], np.int64), ValueError, "does not start"),
           (np.array([3, 4, 3, 7], np.int64), ValueError, "never decrease"),
           (np.array([3, 4, 9, 7], np.int64), ValueError, "never decrease"),
           (list_table(ROW_KEYS[:2]), ValueError, "list token 2 has no row")]
    for table, error, message in bad:
        b.list_truth = table
        with pytest.raises(error, match=message):
            check_batch(b, *args, **attrs)
    b.list_truth = np.ones(1, np.int64)       # no lists at all, but list entries: refused
    with pytest.raises(ValueError, match="list token .* has no row in list_truth \\(0 rows\\)"):
        check_batch(b, *args, **attrs)
    check_batch(b, *args, list_attrs=np.zeros(0, np.int32), pattern_attrs=np.zeros(0, np.int32))


# --------------------------------------------------------------------- CUDA
@pytest.mark.cuda
@needs_cuda
def test_cuda_device_functions_agree():
    """entry_truth, list_hit and list_key as CUDA device functions, one
    thread per (event, predicate)."""
    global cuda
    device = P.cuda_device_functions()
    cuda = cuda_support.load_cuda()
    entry, find, hit, key = device.entry_truth, device.find_attribute, device.list_hit, device.list_key

    def kernel(ev_offsets, ev_attr, ev_value, ev_token, attr, op, lo, hi, set_offsets, set_values, aux,
               pattern_truth, list_truth, out, hits):
        e, p = cuda.grid(2)
        if e < out.shape[0] and p < out.shape[1]:
            pos = find(ev_attr, ev_offsets[e], ev_offsets[e + 1], attr[p])
            out[e, p] = entry(p, pos, ev_value, ev_token, op, lo, hi, set_offsets, set_values, aux, pattern_truth,
                              list_truth)
            if pos >= 0 and op[p] >= FIRST_LIST_OP:
                hits[e, p] = 1 if hit(list_truth, ev_token[pos], key(op[p], aux[p])) else 0

    b = batch()
    rows = predicate_rows()
    want = want_matrix()
    dev = cuda_support.to_device
    out = dev(np.full(want.shape, -1, np.int8))
    hits = dev(np.full(want.shape, -1, np.int8))
    cuda.jit(kernel)[(len(EVENTS), len(rows[1])), (1, 1)](
        dev(b.offsets), dev(b.attr), dev(b.value), dev(b.token), *(dev(a) for a in rows),
        dev(np.zeros((1, 1), np.uint8)), dev(b.list_truth), out, hits)
    assert cuda_support.to_host(out).tolist() == want.tolist()
    got_hits = cuda_support.to_host(hits)
    cpu = entry_truth_matrix(P.entry_truth, P.find_attribute)
    assert cpu.tolist() == want.tolist()
    for e, ev in enumerate(EVENTS):
        for p, (o, a) in enumerate(zip(rows[1], rows[6])):
            if ev[0] is not None and o >= opcodes.FIRST_LIST_OP:
                assert got_hits[e, p] == (P.list_key_py(int(o), int(a)) in ROW_KEYS[ev[0]])


@pytest.mark.cuda
@needs_cuda
def test_cuda_scan_kernel_reads_the_list_table():
    from gpu_kernels.scan import scan_kernel_cuda
    args, want = scan_arguments()
    out = cuda_support.to_device(np.full(want.shape, 9, np.uint8))
    scan_kernel_cuda(0, len(EVENTS), *(cuda_support.to_device(a) for a in args), 1, out)
    assert cuda_support.to_host(out).tolist() == want.tolist()


# --------------------------------------------------------------- end to end
ALGORITHMS = ["scan", "opindex", "betree", "apcm", "pstbloom", "psthash", "atree"]
SUBSCRIPTIONS = {1: "tags ONE OF ('a', 'b')", 2: "tags IS EMPTY", 3: "NOT tags ONE OF ('a')",
                 4: "tags ALL OF ('a', 'c') AND n > 1", 5: "'c' IN tags", 6: "tags IS NOT EMPTY OR n = 7",
                 7: "NOT 'a' IN tags AND s LIKE 'x%'", 8: "tags NONE OF ('c') OR tags IS NULL"}
MATCH_EVENTS = [{"tags": ["a", "c"], "n": 2}, {"tags": []}, {}, {"tags": ["c"], "s": "xy"}, {"n": 7, "s": "xz"},
                {"tags": ["b", None], "s": "x"}]


def _every_algorithm(backend: str):
    from engine import Index
    results = {}
    for algorithm in ALGORITHMS:
        index = Index(algorithm, backend, schema={"tags": "list<string>", "n": "numeric", "s": "string"})
        for sub_id, text in SUBSCRIPTIONS.items():
            index.add(sub_id, text)
        results[algorithm] = [r.tolist() for r in index.match_batch(MATCH_EVENTS)]
    return results


def test_every_algorithm_agrees_on_list_subscriptions():
    results = _every_algorithm("cpu")
    assert all(r == results["scan"] for r in results.values()), results
    # absent lists are NULL, an empty list is present
    assert results["scan"][2] == [8]
    assert 2 in results["scan"][1] and 3 in results["scan"][1]


@pytest.mark.cuda
@needs_cuda
def test_every_cuda_algorithm_agrees_on_list_subscriptions():
    assert _every_algorithm("cuda") == _every_algorithm("cpu")
