"""The OpIndex structure as one struct of arrays (Zhang, Chan, Tan, PVLDB 2014, §4-§6).

:class:`OpIndexArrays` holds every array of a built index (built by
:mod:`engine.algorithms.opindex`); the CPU kernels (:mod:`.cpu`) take it
whole, and the CUDA kernels (:mod:`.cuda`) take its device twin -- the same
named tuple with each array copied to the device (:func:`to_device`).
:class:`Programs` is the same for the compiled segment's postfix programs
and predicate table, which the always-checked subscriptions are run with.

Layout (every structure is a flat array):

* **Level 1, pivot partitions.**  ``pivot_of_attr[attr]`` is the compact
  pivot id of an attribute (-1: no subscription has it as pivot; ids ascend
  with the attribute).  The counters of partition ``p`` are
  ``[part_counter_start[p], part_counter_start[p + 1])`` -- the paper's
  counter array ``V_{A_p}``, one counter per (conjunction | CNF copy),
  initialised to ``counter_init`` = its number of predicates (clauses for
  CNF) and decremented by each matching predicate; a counter reaching 0 is
  a match of subscription position ``counter_sub``.  CNF copies also own
  clause slots ``[part_slot_start[p], ...)``: the paper's clause bitmap, one
  flag per clause (§6.1), slot ``s`` counting for counter ``slot_counter[s]``.
* **Level 2, operator partitions.**  List ``l = p * N_LISTS + op`` holds
  entries ``[list_offsets[l], list_offsets[l + 1])``: the predicates of
  partition ``p`` with list operator ``op`` (``=``, ``!=``, ``<``, ``<=``,
  ``>``, ``>=``, VERIFY, PREFIX), sorted by (attribute, operand).  Each list
  is split into ``2**k`` segments by attribute (the segment directory:
  segment ``attr >> list_shift[l]``, bucket ``list_bucket_base[l] +
  segment``), each segment with a ``w``-bit signature ``bucket_sig`` (bit
  :func:`eq_bit_py` of (attribute, operand) for ``=``, :func:`attr_bit_py`
  of the attribute otherwise).  Inside a segment the predicates of one
  attribute form a *run* (``run_attr``, entries ``[run_start[r],
  run_start[r + 1])``, runs ``[bucket_run_start[b], bucket_run_start[b +
  1])`` of bucket ``b``); entries hold the operand ``ent_val`` (``2 * rank +
  1`` among the distinct operands ``vals`` when ``use_rank``: 16 bits) and
  the counter pointer ``ent_target``, relative to the partition (``>= 0``:
  counter ``part_counter_start[p] + t``; ``< 0``: clause slot
  ``part_slot_start[p] - t - 1``), 16 bits when partitions are small.
  ``list_shift[l] < 0`` marks an empty list.
* VERIFY lists hold the predicates no range scan decides (NOT IN, NOT
  BETWEEN, LIKE, NOT LIKE, MATCHES, NOT MATCHES, IS NOT NULL, the list
  operators ONE OF ... IS NOT EMPTY, and BETWEEN inside a CNF clause):
  found by attribute only, decided exactly by
  :func:`gpu_kernels.predicates.predicate_truth` on the event's value (its
  pattern or list result read by the entry's token) and
  the *extended predicate table* (``x_*``: the segment's predicates, then
  the negations the normal forms need).  A list operator's VERIFY entry
  carries its list key and operator in ``side_hi`` (its list code,
  :func:`gpu_kernels.list_truth.list_codes`;
  0 in the other VERIFY entries), so that the thousands an event list meets
  are decided without reading their rows of that table.  PREFIX lists hold ``LIKE 'abc%'``
  as the code range of the strings with that prefix (§6.2), checked exactly
  with the batch's pattern results.  Their side arrays (``side_pid``: the
  row of the extended table, ``side_hi``: the interval end) are indexed by
  entry + ``list_side_base[l]``.
* IS NULL cannot be found through an event's attributes: it is checked when
  its conjunction's counter reaches 0 (``counter_post_start`` /
  ``post_attr``, CSR per counter; length 1 when there is none);
  subscriptions with a conjunction made only of IS NULL tests (or too large
  for DNF and CNF) are evaluated on every event (``always_pos``).

:func:`check_arrays` checks that a structure read from a file keeps every
one of these invariants the kernels (matching and merging) rely on to stay
within bounds.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from gpu_kernels.list_truth import list_codes
from gpu_kernels.opcodes import LIKE

#: list operators (second-level partitions)
L_EQ, L_NE, L_LT, L_LE, L_GT, L_GE, L_VERIFY, L_PREFIX = range(8)
N_LISTS = 8


class OpIndexArrays(NamedTuple):
    """One OpIndex (see the module docstring); dtypes as :data:`DTYPES`."""

    # level 1: pivot partitions, counters, clause slots, IS NULL tests
    pivot_of_attr: np.ndarray
    part_counter_start: np.ndarray
    part_slot_start: np.ndarray
    counter_init: np.ndarray
    counter_sub: np.ndarray
    counter_post_start: np.ndarray
    post_attr: np.ndarray
    slot_counter: np.ndarray
    # level 2: operator lists, segment directory and signatures, runs, entries
    list_offsets: np.ndarray
    list_shift: np.ndarray
    list_bucket_base: np.ndarray
    list_side_base: np.ndarray
    bucket_run_start: np.ndarray
    bucket_sig: np.ndarray
    run_attr: np.ndarray
    run_start: np.ndarray
    ent_val: np.ndarray
    ent_target: np.ndarray
    side_pid: np.ndarray
    side_hi: np.ndarray
    vals: np.ndarray
    # the extended predicate table (VERIFY and PREFIX entries name its rows)
    x_op: np.ndarray
    x_lo: np.ndarray
    x_hi: np.ndarray
    x_set_start: np.ndarray
    x_set_stop: np.ndarray
    x_aux: np.ndarray
    set_values: np.ndarray
    # subscriptions evaluated on every event
    always_pos: np.ndarray
    # scalars: signature bits w, whether signatures are tested (not OpIndex-BS), operands as ranks
    sig_bits: int
    use_sig: bool
    use_rank: bool


class Programs(NamedTuple):
    """A compiled segment's postfix programs and predicate table, as the
    always-checked subscriptions are evaluated with
    (:func:`gpu_kernels.scan.make_run_program`)."""

    prog_offsets: np.ndarray
    prog_kind: np.ndarray
    prog_arg: np.ndarray
    p_attr: np.ndarray
    p_op: np.ndarray
    p_lo: np.ndarray
    p_hi: np.ndarray
    p_set_offsets: np.ndarray
    p_set_values: np.ndarray
    p_aux: np.ndarray
    #: the deepest operand stack a program needs
    max_depth: int

    @classmethod
    def of(cls, segment) -> "Programs":
        """The programs of a compiled segment (predicates coded), in the
        dtypes the kernels are compiled for."""
        preds = segment.predicates
        arrays = (segment.prog_offsets, segment.prog_kind, segment.prog_arg, preds.attr, preds.op, preds.lo,
                  preds.hi, preds.set_offsets, preds.set_values, preds.aux)
        return cls(*(np.ascontiguousarray(a, dtype) for a, dtype in zip(arrays, PROGRAM_DTYPES)),
                   int(segment.max_depth))


#: dtypes of the arrays of :class:`Programs`
PROGRAM_DTYPES = (np.int64, np.int8, np.int32, np.int32, np.int8, np.float64, np.float64, np.int64, np.float64,
                  np.int64)

#: the dtypes each array of :class:`OpIndexArrays` may have (the builder
#: picks the narrowest that holds its values)
DTYPES = {
    "pivot_of_attr": (np.int32,), "part_counter_start": (np.int64,), "part_slot_start": (np.int64,),
    "counter_init": (np.int8, np.int16, np.int32), "counter_sub": (np.int32, np.int64),
    "counter_post_start": (np.int64,), "post_attr": (np.int32,), "slot_counter": (np.int64,),
    "list_offsets": (np.int64,), "list_shift": (np.int8,), "list_bucket_base": (np.int64,),
    "list_side_base": (np.int64,), "bucket_run_start": (np.int64,), "bucket_sig": (np.uint64,),
    "run_attr": (np.int32,), "run_start": (np.int64,), "ent_val": (np.uint16, np.float64),
    "ent_target": (np.int16, np.int32), "side_pid": (np.int32, np.int64), "side_hi": (np.float64,),
    "vals": (np.float64,), "x_op": (np.int8,), "x_lo": (np.float64,), "x_hi": (np.float64,),
    "x_set_start": (np.int64,), "x_set_stop": (np.int64,), "x_aux": (np.int64,), "set_values": (np.float64,),
    "always_pos": (np.int64,),
}
SCALARS = ("sig_bits", "use_sig", "use_rank")
assert tuple(DTYPES) + SCALARS == OpIndexArrays._fields

# --------------------------------------------------------------------------
# signature bits (plain functions: compiled for the CPU in .cpu and as CUDA
# device functions in .cuda)
# --------------------------------------------------------------------------
_K1 = np.uint64(0x9E3779B97F4A7C15)
_K2 = np.uint64(0xC2B2AE3D27D4EB4F)
_K3 = np.uint64(0x165667B19E3779F9)


def attr_bit_py(attr, w):
    """Signature bit of a predicate on ``attr`` whose operator is not ``=``."""
    h = (np.uint64(attr) + np.uint64(1)) * _K1
    h = h ^ (h >> np.uint64(29))
    return np.int64((h >> np.uint64(32)) & np.uint64(w - 1))


def eq_bit_py(attr, value, w):
    """Signature bit of ``attr = value`` (attribute and operand)."""
    if value > 4.0e18:
        value = 4.0e18
    if value < -4.0e18:
        value = -4.0e18
    k = np.uint64(np.int64(value))
    h = (np.uint64(attr) + np.uint64(1)) * _K1
    h = (h ^ (k * _K2)) * _K3
    h = h ^ (h >> np.uint64(31))
    return np.int64((h >> np.uint64(32)) & np.uint64(w - 1))


def to_device(arrays: NamedTuple) -> NamedTuple:
    """The device twin of an :class:`OpIndexArrays` or :class:`Programs`:
    the same named tuple, each array copied to the device
    (:func:`gpu_kernels.cuda_support.to_device`), scalars as they are."""
    from gpu_kernels import cuda_support
    return type(arrays)(*(cuda_support.to_device(a) if isinstance(a, np.ndarray) else a for a in arrays))


def nbytes(arrays: NamedTuple) -> int:
    """Bytes of the arrays of a named tuple of arrays (host or device)."""
    return sum(int(a.nbytes) for a in arrays if hasattr(a, "nbytes") and not np.isscalar(a))


# --------------------------------------------------------------------------
# checks of a structure read from a file
# --------------------------------------------------------------------------
def _fail(message: str):
    raise ValueError(f"saved OpIndex structure: {message}")


def _csr(name: str, offsets: np.ndarray, n_rows: int, total: int) -> None:
    """``offsets`` is CSR over ``n_rows`` rows of ``total`` items: starts at
    0, never decreases, ends at ``total``."""
    if len(offsets) != n_rows + 1:
        _fail(f"{name} has {len(offsets)} offsets for {n_rows} rows")
    if offsets[0] != 0 or offsets[-1] != total or (n_rows and (np.diff(offsets) < 0).any()):
        _fail(f"{name} must start at 0, never decrease and end at {total}")


def _within(name: str, values: np.ndarray, low, high) -> None:
    """Every value in ``[low, high)`` (``low``, ``high``: scalars or arrays)."""
    if len(values) and ((values < low).any() or (values >= high).any()):
        _fail(f"{name} holds a value out of bounds")


def _ranges(starts: np.ndarray, stops: np.ndarray) -> np.ndarray:
    """The concatenated ``arange(starts[i], stops[i])`` (stops >= starts)."""
    lens = stops - starts
    return np.repeat(starts - np.concatenate(([0], np.cumsum(lens)[:-1])), lens) + np.arange(int(lens.sum()))


def check_arrays(arrays: OpIndexArrays, n_subs: int, x_attr: np.ndarray | None = None) -> None:
    """Raise ValueError unless ``arrays`` (read from a file) keep the
    invariants every kernel that reads them relies on: dtypes, lengths, CSR
    offsets, and every index within the array it indexes -- partitions,
    buckets, runs, entries, counters (an entry's within its own partition),
    clause slots, side arrays, extended-table rows (a PREFIX entry's a LIKE
    predicate; with ``x_attr``, the rows' attributes, a VERIFY or PREFIX
    entry's predicate on the attribute of the entry's run: the kernel tests
    it on the event's value and list token of that attribute, and a list
    predicate of another attribute read a string's token as a list row and
    crashed the process), subscription positions (``< n_subs``) -- and
    operands as ranks within ``vals``.  Vectorised: no loop over entries or
    counters."""
    a = arrays
    for name, dtypes in DTYPES.items():
        x = getattr(a, name)
        if not isinstance(x, np.ndarray) or x.ndim != 1 or x.dtype not in [np.dtype(d) for d in dtypes]:
            want = " or ".join(np.dtype(d).name for d in dtypes)
            got = f"{x.dtype.name} {x.ndim}-D" if isinstance(x, np.ndarray) else type(x).__name__
            _fail(f"{name} must be a 1-D array of {want}, not {got}")
    if not (isinstance(a.sig_bits, int) and 1 <= a.sig_bits <= 64 and not a.sig_bits & (a.sig_bits - 1)):
        _fail(f"sig_bits must be a power of two in [1, 64], not {a.sig_bits!r}")
    if not isinstance(a.use_sig, bool) or not isinstance(a.use_rank, bool):
        _fail("use_sig and use_rank must be booleans")

    # ---- level 1
    n_attrs = len(a.pivot_of_attr)
    n_parts = len(a.part_counter_start) - 1
    n_counters = len(a.counter_init)
    n_slots = len(a.slot_counter)
    if n_attrs < 1 or n_attrs >= 2 ** 31 or n_parts < 0:
        _fail("pivot_of_attr and part_counter_start must not be empty")
    pivots = a.pivot_of_attr[a.pivot_of_attr >= 0]
    if (a.pivot_of_attr < -1).any() or not np.array_equal(pivots, np.arange(n_parts)):
        _fail("pivot_of_attr must number the partitions 0, 1, ... in attribute order (-1 elsewhere)")
    _csr("part_counter_start", a.part_counter_start, n_parts, n_counters)
    _csr("part_slot_start", a.part_slot_start, n_parts, n_slots)
    if len(a.counter_sub) != n_counters:
        _fail(f"counter_sub has {len(a.counter_sub)} values for {n_counters} counters")
    _within("counter_sub", a.counter_sub, 0, n_subs)
    _within("always_pos", a.always_pos, 0, n_subs)
    if len(a.always_pos) > 1 and (np.diff(a.always_pos) <= 0).any():
        _fail("always_pos must be strictly increasing")
    if len(a.counter_post_start) <= 1:
        if len(a.counter_post_start) == 0 or a.counter_post_start[0] != 0 or len(a.post_attr):
            _fail("counter_post_start of length 1 means no IS NULL test")
    else:
        _csr("counter_post_start", a.counter_post_start, n_counters, len(a.post_attr))
    part_of_slot = np.repeat(np.arange(n_parts), np.diff(a.part_slot_start))
    _within("slot_counter", a.slot_counter, a.part_counter_start[part_of_slot],
            a.part_counter_start[part_of_slot + 1])

    # ---- level 2: lists, directory, runs
    n_lists = n_parts * N_LISTS
    n_entries = len(a.ent_val)
    n_runs = len(a.run_attr)
    n_buckets = len(a.bucket_run_start) - 1
    if len(a.ent_target) != n_entries:
        _fail(f"ent_target has {len(a.ent_target)} values for {n_entries} entries")
    _csr("list_offsets", a.list_offsets, n_lists, n_entries)
    for name in ("list_shift", "list_bucket_base", "list_side_base"):
        if len(getattr(a, name)) != n_lists:
            _fail(f"{name} has {len(getattr(a, name))} values for {n_lists} lists")
    _csr("run_start", a.run_start, n_runs, n_entries)
    _within("run_attr", a.run_attr, 0, n_attrs)
    if n_buckets < 0 or len(a.bucket_sig) != max(n_buckets, 1):
        _fail(f"bucket_sig has {len(a.bucket_sig)} signatures for {max(n_buckets, 0)} buckets")
    if n_buckets and (np.diff(a.bucket_run_start) < 0).any():
        _fail("bucket_run_start must never decrease")
    _within("bucket_run_start", a.bucket_run_start, 0, n_runs + 1)
    attr_bits = int(n_attrs - 1).bit_length()
    shift = a.list_shift.astype(np.int64)
    if (shift < -1).any() or (shift > attr_bits).any():
        _fail(f"list_shift must lie in [-1, {attr_bits}]")
    listed = np.flatnonzero(shift >= 0)
    n_segments = np.int64(1) << (attr_bits - shift[listed])
    # the lists' segments, one after the other: the buckets exactly
    starts = np.zeros(n_lists, np.int64)
    starts[listed] = np.cumsum(n_segments) - n_segments
    if not np.array_equal(a.list_bucket_base, starts) or int(n_segments.sum()) != n_buckets:
        _fail("the lists' segment directories must take the buckets in order")
    base = a.list_bucket_base[listed]
    end = base + n_segments
    # the entries a list's runs reach lie within the list
    first = a.run_start[a.bucket_run_start[base]]
    last = a.run_start[a.bucket_run_start[end]]
    if ((first < a.list_offsets[listed]) | (last > a.list_offsets[listed + 1])).any():
        _fail("a list's runs reach entries outside the list")

    # ---- entries: counter pointers within their partition
    part_start = a.list_offsets[::N_LISTS]
    filled = np.flatnonzero(np.diff(part_start) > 0)
    if len(filled):
        target = a.ent_target.astype(np.int64)
        low = np.minimum.reduceat(target, part_start[filled])
        high = np.maximum.reduceat(target, part_start[filled])
        if (high >= np.diff(a.part_counter_start)[filled]).any() or (low < -np.diff(a.part_slot_start)[filled]).any():
            _fail("an entry points outside the counters and clause slots of its partition")

    # ---- side arrays of the VERIFY and PREFIX lists, their predicate rows
    n_side = len(a.side_pid)
    n_x = len(a.x_op)
    if len(a.side_hi) != n_side:
        _fail(f"side_hi has {len(a.side_hi)} values for {n_side} side entries")
    for name in ("x_lo", "x_hi", "x_set_start", "x_set_stop", "x_aux"):
        if len(getattr(a, name)) != n_x:
            _fail(f"{name} has {len(getattr(a, name))} rows, x_op {n_x}")
    ops = np.arange(n_lists) & (N_LISTS - 1)
    sizes = np.diff(a.list_offsets)
    # the side entries of the VERIFY and PREFIX lists, one list after the other: the side arrays exactly
    side_sizes = np.where(ops >= L_VERIFY, sizes, 0)
    if not np.array_equal(a.list_side_base, np.cumsum(side_sizes) - side_sizes - a.list_offsets[:-1]) \
            or int(side_sizes.sum()) != n_side:
        _fail("the side entries of the VERIFY and PREFIX lists must take the side arrays in order")
    special = np.flatnonzero((ops >= L_VERIFY) & (sizes > 0))
    lo = a.list_offsets[special] + a.list_side_base[special]
    hi = a.list_offsets[special + 1] + a.list_side_base[special]
    _within("side_pid", a.side_pid, 0, n_x)
    prefix = ops[special] == L_PREFIX
    if prefix.any() and (a.x_op[a.side_pid[_ranges(lo[prefix], hi[prefix])]] != LIKE).any():
        _fail("a PREFIX entry names a predicate that is not a LIKE")
    if x_attr is not None:
        if len(x_attr) != n_x:
            _fail(f"x_attr has {len(x_attr)} rows, x_op {n_x}")
        entry_attr = np.repeat(a.run_attr.astype(np.int64), np.diff(a.run_start))
        entries = _ranges(a.list_offsets[special], a.list_offsets[special + 1])
        if not np.array_equal(np.asarray(x_attr, np.int64)[a.side_pid[_ranges(lo, hi)]], entry_attr[entries]):
            _fail("a VERIFY or PREFIX entry names a predicate of another attribute than its run's")
    verify = _ranges(lo[~prefix], hi[~prefix])
    code = a.side_hi[verify]
    # (0: read through the predicate row, as an index saved before the codes is)
    if ((code != 0) & (code != list_codes(a.x_op[a.side_pid[verify]], a.x_aux[a.side_pid[verify]]))).any():
        _fail("a VERIFY entry's side_hi is neither 0 nor its list operator's list code")

    # ---- operands: ranks among vals (what merges re-encode through)
    if (len(a.vals) > 1 and not (np.diff(a.vals) > 0).all()) or np.isnan(a.vals).any():
        _fail("vals must be strictly increasing")
    if a.use_rank != (a.ent_val.dtype == np.uint16):
        _fail("ent_val must be uint16 exactly when operands are ranks")
    if a.use_rank:
        if 2 * len(a.vals) + 1 > np.iinfo(np.uint16).max:
            _fail("too many operands for 16-bit ranks")
        ranked = np.repeat(ops != L_VERIFY, sizes)       # (PREFIX entries: the rank of the prefix)
        stored = a.ent_val[ranked].astype(np.int64)
        if len(stored) and ((stored % 2 != 1).any() or (stored > 2 * len(a.vals) - 1).any()):
            _fail("an operand rank lies outside vals")
