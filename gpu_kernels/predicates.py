"""Evaluating one distinct predicate against one event (the leaf of every
matcher).

The functions are written once in plain Python over scalars and arrays and
compiled twice: as numba CPU functions here, and as CUDA device functions by
the CUDA twins (``cuda.jit(device=True)`` over the same source).  Values are
already codes (docs/architecture.md#the-compiled-index): numbers as float64, strings as order-preserving
codes, booleans as 0/1, so every comparison is a float comparison.
"""

from __future__ import annotations

import functools
from types import SimpleNamespace

import numpy as np
from numba import njit, prange

from gpu_kernels import cuda_support
from gpu_kernels.opcodes import (ALL_OF, BETWEEN, CONTAINS, EQ, FALSE, FIRST_LIST_OP, GE, GT, IN, IS_EMPTY,
                                 IS_NOT_EMPTY, IS_NOT_NULL, IS_NULL, LAST_LIST_OP, LE, LIKE, LT, MATCHES, NE,
                                 NONE_OF, NOT_ALL_OF, NOT_BETWEEN, NOT_CONTAINS, NOT_IN, NOT_LIKE, NOT_MATCHES,
                                 NULL, ONE_OF, TRUE)


def find_attribute_py(event_attr, start, stop, attr):
    """Position of ``attr`` in the event's attribute ids (sorted ascending
    within ``[start, stop)``), or -1 when the event does not carry it."""
    lo = start
    hi = stop
    while lo < hi:
        mid = (lo + hi) >> 1
        if event_attr[mid] < attr:
            lo = mid + 1
        else:
            hi = mid
    if lo < stop and event_attr[lo] == attr:
        return lo
    return -1


def set_contains_py(set_values, start, stop, value):
    """Binary search in one predicate's sorted IN-list codes."""
    lo = start
    hi = stop
    while lo < hi:
        mid = (lo + hi) >> 1
        if set_values[mid] < value:
            lo = mid + 1
        else:
            hi = mid
    return lo < stop and set_values[lo] == value


def list_key_py(op, aux):
    """The key under which `engine.events.list_truth` stores the truth of a
    list predicate: its operand list's id (``aux``) twice, plus one for ALL
    OF (ONE OF, NONE OF, ``v IN attr`` and its negation share "some element
    is in the list"; ALL OF and its negation "every element is")."""
    return aux * 2 + (1 if op == ALL_OF or op == NOT_ALL_OF else 0)


def make_list_hit(contains):
    """Build, around a compiled ``set_contains``, whether the event list of
    batch row ``row`` holds ``key`` among its TRUE keys.  ``list_truth``
    is packed CSR in one int64 array: entries ``[0, n_rows]`` are the
    rows' offsets (positions in the same array), then each row's TRUE keys
    ascending -- a row is searched as an IN list is."""

    def list_hit(list_truth, row, key):
        return contains(list_truth, list_truth[row], list_truth[row + 1], key)
    return list_hit


list_hit_py = make_list_hit(set_contains_py)


def make_predicate_truth(contains):
    """Build the predicate evaluator around a compiled ``set_contains`` (the
    CPU or the CUDA one), so both targets share this one source.

    Returns the three-valued truth of one predicate.  ``pattern_hit`` is the
    precomputed LIKE/MATCHES result for the event's string, or the
    precomputed list result for a list operator (ignored for other
    operators); ``present`` says whether the event carries the attribute at
    all (an empty list is present).  For a list attribute ``value`` is the
    number of distinct non-null elements."""

    def predicate_truth(op, lo, hi, set_values, set_start, set_stop, pattern_hit, present, value):
        if op == IS_NULL:
            return FALSE if present else TRUE
        if op == IS_NOT_NULL:
            return TRUE if present else FALSE
        if not present:
            return NULL  # every other predicate on an absent attribute is NULL
        hit = False
        if op == EQ:
            hit = value == lo
        elif op == NE:
            hit = value != lo
        elif op == LT:
            hit = value < lo
        elif op == LE:
            hit = value <= lo
        elif op == GT:
            hit = value > lo
        elif op == GE:
            hit = value >= lo
        elif op == BETWEEN:
            hit = lo <= value and value <= hi
        elif op == NOT_BETWEEN:
            hit = value < lo or value > hi
        elif op == IN:
            hit = contains(set_values, set_start, set_stop, value)
        elif op == NOT_IN:
            hit = not contains(set_values, set_start, set_stop, value)
        elif op == LIKE or op == MATCHES:
            hit = pattern_hit
        elif op == NOT_LIKE or op == NOT_MATCHES:
            hit = not pattern_hit
        elif op == ONE_OF or op == ALL_OF or op == CONTAINS:
            hit = pattern_hit
        elif op == NONE_OF or op == NOT_ALL_OF or op == NOT_CONTAINS:
            hit = not pattern_hit
        elif op == IS_EMPTY:
            hit = value == 0.0
        elif op == IS_NOT_EMPTY:
            hit = value != 0.0
        return TRUE if hit else FALSE
    return predicate_truth


def make_entry_truth(truth, list_hit, list_key):
    """Build the evaluator of distinct predicate ``p`` (a row of the
    compiled predicate table) on the event entry at ``pos`` (-1 when the
    event lacks the attribute) around the target's ``predicate_truth``:
    the one place that reads a predicate row, its IN list, the batch's
    LIKE/MATCHES table and its list table."""

    def entry_truth(p, pos, ev_value, ev_token, pred_op, pred_lo, pred_hi, set_offsets, set_values, pred_aux,
                    pattern_truth, list_truth):
        op = pred_op[p]
        present = pos >= 0
        value = ev_value[pos] if present else 0.0
        pattern_hit = False
        if present and op >= LIKE and op <= NOT_MATCHES:
            pattern_hit = pattern_truth[ev_token[pos], pred_aux[p]] != 0
        elif present and op >= FIRST_LIST_OP and op <= LAST_LIST_OP:
            pattern_hit = list_hit(list_truth, ev_token[pos], list_key(op, pred_aux[p]))
        set_start = 0
        set_stop = 0
        if op == IN or op == NOT_IN:
            set_start = set_offsets[p]
            set_stop = set_offsets[p + 1]
        return truth(op, pred_lo[p], pred_hi[p], set_values, set_start, set_stop, pattern_hit, present, value)
    return entry_truth


find_attribute = njit(inline="always", nogil=True)(find_attribute_py)
set_contains = njit(inline="always", nogil=True)(set_contains_py)
list_key = njit(inline="always", nogil=True)(list_key_py)
list_hit = njit(inline="always", nogil=True)(make_list_hit(set_contains))
predicate_truth = njit(inline="always", nogil=True)(make_predicate_truth(set_contains))
entry_truth = njit(inline="always", nogil=True)(make_entry_truth(predicate_truth, list_hit, list_key))



# ------------------------------------------------------------ interval form
#: How a row's two *interval bounds* (:func:`interval_form`) decide it on a
#: present value ``x``: TRUE where ``lo <= x <= hi`` (INSIDE), where ``x < lo
#: or x > hi`` (OUTSIDE: a NaN is neither), where not ``lo <= x <= hi``
#: (NOT_INSIDE: a NaN is not in it).  EVALUATED rows need
#: :func:`entry_truth` (IN lists, patterns, the list operators, the NULL
#: tests, a NaN operand).  Every kind is NULL, so not TRUE, on an absent
#: attribute.
INSIDE, OUTSIDE, NOT_INSIDE, EVALUATED = 0, 1, 2, 3


def interval_form(op: np.ndarray, lo: np.ndarray, hi: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per predicate row (kernel opcodes, float64 operands), its kind and
    its interval bounds ``[n, 2]``: one comparison pair instead of the
    operator's branch, with the same truth as :func:`predicate_truth` on
    every present value -- NaN, the infinities and -0.0 included (pinned by
    ``tests/test_kernels_cpu.py``).  ``x < v`` is ``x <= v'`` with ``v'`` the
    float64 just below ``v`` (``nextafter``), nothing below -inf; ``x > v``
    dually; ``=`` is ``[v, v]`` and ``!=`` its NOT_INSIDE.  A matcher that
    verifies many candidates (PSTHash's lanes) reads these instead of the
    operator, bounds and set of each row."""
    op = np.asarray(op)
    lo = np.asarray(lo, np.float64)
    hi = np.asarray(hi, np.float64)
    kind = np.full(len(op), EVALUATED, np.int8)
    bounds = np.empty((len(op), 2), np.float64)
    bounds[:, 0] = np.inf                      # (EVALUATED rows: the empty interval, never read)
    bounds[:, 1] = -np.inf
    operands = ~np.isnan(lo) & ~np.isnan(hi)   # a NaN operand: left to entry_truth
    with np.errstate(invalid="ignore", over="ignore"):      # (NaN operands; nextafter past the largest float)
        below = np.nextafter(lo, -np.inf)      # the largest float64 < lo (-inf for -inf: handled below)
        above = np.nextafter(lo, np.inf)
        cases = (   # (rows, kind, lo, hi); the list tests read no operand
            (op == EQ, INSIDE, lo, lo),
            (op == NE, NOT_INSIDE, lo, lo),
            (op == LE, INSIDE, -np.inf, lo),
            (op == GE, INSIDE, lo, np.inf),
            (op == LT, INSIDE, np.where(lo == -np.inf, np.inf, -np.inf), below),   # < -inf: empty
            (op == GT, INSIDE, above, np.where(lo == np.inf, -np.inf, np.inf)),    # > +inf: empty
            (op == BETWEEN, INSIDE, lo, hi),
            (op == NOT_BETWEEN, OUTSIDE, lo, hi),
        )
    for where, k, first, last in cases:
        where &= operands
        kind[where] = k
        bounds[where, 0] = np.broadcast_to(first, lo.shape)[where]
        bounds[where, 1] = np.broadcast_to(last, lo.shape)[where]
    for code, k in ((IS_EMPTY, INSIDE), (IS_NOT_EMPTY, NOT_INSIDE)):     # a list's distinct elements: 0 or not
        kind[op == code] = k
        bounds[op == code] = 0.0
    return kind, bounds


@njit(parallel=True, nogil=True, cache=True)
def predicate_truth_many(op, lo, hi, set_offsets, set_values, pattern_hit, present, value, out):
    """``out[i]`` = truth of case ``i``: predicate ``(op[i], lo[i], hi[i],
    IN list set_values[set_offsets[i]:set_offsets[i + 1]])`` on one event
    value (``present[i]``, ``value[i]``, ``pattern_hit[i]``).  The CPU twin
    of :func:`predicate_truth_kernel_cuda`; the building block of bitmap
    event encodings (one case per distinct predicate)."""
    for i in prange(len(op)):
        out[i] = predicate_truth(op[i], lo[i], hi[i], set_values, set_offsets[i], set_offsets[i + 1],
                                 pattern_hit[i] != 0, present[i] != 0, value[i])


# ---------------------------------------------------------------- CUDA twins
cuda = None   # numba.cuda once a CUDA twin is built (a module global: see cuda_support)


@functools.cache
def cuda_device_functions() -> SimpleNamespace:
    """``find_attribute``, ``set_contains`` and ``predicate_truth`` as CUDA
    device functions, compiled from the very Python sources of the CPU
    ones.  Built on first use (importing this module never touches CUDA)."""
    global cuda
    cuda = cuda_support.load_cuda()
    find = cuda.jit(device=True)(find_attribute_py)
    contains = cuda.jit(device=True)(set_contains_py)
    hit = cuda.jit(device=True)(make_list_hit(contains))
    key = cuda.jit(device=True)(list_key_py)
    truth = cuda.jit(device=True)(make_predicate_truth(contains))
    entry = cuda.jit(device=True)(make_entry_truth(truth, hit, key))
    return SimpleNamespace(find_attribute=find, set_contains=contains, predicate_truth=truth, entry_truth=entry,
                           list_hit=hit, list_key=key)


@functools.cache
def _predicate_truth_kernel():
    truth = cuda_device_functions().predicate_truth

    def kernel(op, lo, hi, set_offsets, set_values, pattern_hit, present, value, out):
        x, y = cuda.grid(2)
        sx, sy = cuda.gridsize(2)
        for i in range(y * sx + x, op.shape[0], sx * sy):
            out[i] = truth(op[i], lo[i], hi[i], set_values, set_offsets[i], set_offsets[i + 1],
                           pattern_hit[i] != 0, present[i] != 0, value[i])
    return cuda.jit(kernel)


def predicate_truth_kernel_cuda(op, lo, hi, set_offsets, set_values, pattern_hit, present, value, out, *,
                                launch=None):
    """CUDA twin of :func:`predicate_truth_many` (same arguments, device
    arrays in, ``out`` written on the device), one thread per case."""
    n = len(op)
    if n == 0:
        return
    grid, block = (launch or cuda_support.default_launch()).grid(n, 1)
    _predicate_truth_kernel()[grid, block](op, lo, hi, set_offsets, set_values, pattern_hit, present, value, out)
