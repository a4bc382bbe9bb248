"""What every cuda matcher shares: chunked matching within a device memory budget.

:class:`ChunkedCudaMatcher` is the cuda half of the matcher contract
(:mod:`engine.algorithms.base`): it checks a match call's inputs before any
reaches a kernel (:func:`check_batch` -- a kernel reading out of bounds does
not raise), copies the batch's pattern and list tables and ``alive`` flags
over (or takes them in place), and walks the batch in *chunks* sized to the device
memory budget (:func:`plan_chunk`): a subclass says what one event of a
chunk costs and matches one chunk into a hit matrix (bytes or bit words),
which :meth:`ChunkedCudaMatcher._compact` turns into (event, position)
pairs, ascending in both.  Results wanted as NumPy come back through
:mod:`gpu_kernels.transfer`: int32 positions through pinned staging, the
event column rebuilt from per-event counts, subscription ids mapped on the
way (the cuda side's one place where positions become ids) -- each piece
by a worker thread while the device matches the next chunk
(:class:`gpu_kernels.transfer.HostResults`); such a batch is cut into
``pipeline_chunks`` chunks at least (:func:`pipeline_events`) so that there
is a next chunk to overlap.

:class:`DeviceSegment` is a compiled segment's arrays on the device,
uploaded once (the predicate codes again when a grown string dictionary
recodes them).

Memory: a chunk of ``r`` events needs the subclass's per-event scratch plus
its attribute entries (:data:`ENTRY_BYTES` each) and offsets, and ``16 * S``
bytes (``S`` subscriptions) are always kept free for the results of one
event.  A batch with an event that cannot fit even alone raises
:class:`~engine.backend.DeviceMemoryError` before any work.
"""

from __future__ import annotations

import copy
import logging

import numpy as np

from engine.algorithms.base import NO_LISTS, OUTPUTS, Matcher
from engine.backend import DeviceMemoryError, cuda_simulated, device_memory_budget
from engine.compile import PATTERN_CODES, Segment, program_depths
from engine.errors import ExpressionTooLarge
from gpu_kernels import cuda_support, transfer
from gpu_kernels import scan as scan_kernels
from gpu_kernels.compaction import fill_rows_cuda, hit_offsets_cuda
from gpu_kernels.opcodes import FIRST_LIST_OP, LAST_LIST_OP

logger = logging.getLogger(__name__)

#: bytes of one result pair (event index and subscription position, int64 each)
PAIR_BYTES = 16
#: bytes of one event attribute entry on the device (attr int32, value float64, token int32)
ENTRY_BYTES = 16
#: bytes per event of the CSR offsets
OFFSET_BYTES = 8

#: dtype of every EventBatch field the kernels read
BATCH_DTYPES = {"offsets": np.int64, "attr": np.int32, "value": np.float64, "token": np.int32}



# ------------------------------------------------------------------ helpers
def check_program_depths(segment: Segment) -> int:
    """The stack tier the CUDA scan kernel needs for ``segment``, or
    :class:`~engine.errors.ExpressionTooLarge` naming the deepest
    subscription when a program needs more than
    ``gpu_kernels.scan.MAX_STACK_DEPTH`` operand slots (an n-ary AND/OR of
    that many operands, or nesting as deep)."""
    try:
        return scan_kernels.cuda_stack_depth(int(segment.max_depth))
    except ValueError:
        # max_depth bounds the programs from above (a part of a segment keeps the whole's): the exact depths
        depths = program_depths(segment.prog_offsets, segment.prog_kind, segment.prog_arg)
        if not len(depths):                 # no program at all (every one residual)
            return scan_kernels.STACK_DEPTH_TIERS[0]
        worst = int(np.argmax(depths))
        if depths[worst] <= scan_kernels.MAX_STACK_DEPTH:
            return scan_kernels.cuda_stack_depth(int(depths[worst]))
        raise ExpressionTooLarge(
            f"subscription {int(segment.sub_ids[worst])} needs an operand stack of {int(depths[worst])} entries "
            f"(an AND/OR that wide, or nesting that deep); the cuda backend's scan kernel holds at most "
            f"{scan_kernels.MAX_STACK_DEPTH} per thread -- use backend='cpu' for it or split the expression"
        ) from None


def _check_array(where: str, x, dtype, ndim: int):
    kind = getattr(x, "dtype", None)
    shape = getattr(x, "shape", None)
    if kind is None or shape is None:
        raise TypeError(f"{where} must be an array of {np.dtype(dtype).name}, not {type(x).__name__}")
    if np.dtype(kind) != np.dtype(dtype):
        raise TypeError(f"{where} must have dtype {np.dtype(dtype).name}, got {np.dtype(kind).name}")
    if len(shape) != ndim:
        raise ValueError(f"{where} must be {ndim}-dimensional, got shape {tuple(shape)}")


def _searchable(x):
    """``(x, xp)``: a device array in place with CuPy on a GPU, else on the
    host with NumPy -- for a check that reduces a batch field to one number."""
    if cuda_support.is_device_array(x) and not cuda_support.simulated():
        import cupy
        return cupy.asarray(x), cupy
    return cuda_support.to_host(x), np


def check_list_truth(batch, list_attrs) -> None:
    """Validate the batch's list table (``EventBatch.list_truth``): 1-D
    int64 whose row offsets -- entries ``[0, n_rows]``, the first one
    ``n_rows + 1`` -- never decrease and stay within the array, and a row
    for the token of every entry of a list attribute (``list_attrs``: the
    attributes the segment's list predicates read).  The kernels read a
    row's keys by binary search between its offsets, so this is all that
    keeps them in bounds; keys out of order only give wrong answers.  A
    segment without list predicates never reads the table: only its type
    is checked then."""
    table = getattr(batch, "list_truth", None)
    if table is None:
        return
    _check_array("event batch field 'list_truth'", table, np.int64, 1)
    if not len(list_attrs):
        return
    size = int(table.shape[0])
    head = cuda_support.to_host(table[:1]) if size else np.zeros(0, np.int64)
    n_rows = int(head[0]) - 1 if size else -1
    if n_rows < 0 or n_rows >= size:
        raise ValueError(f"event batch list_truth ({size} entries) does not start with its rows' offsets "
                         f"(the first offset, n_rows + 1, must lie in [1, {size}])")
    offsets = cuda_support.to_host(table[:n_rows + 1])
    if (np.diff(offsets) < 0).any() or offsets[-1] > size:
        raise ValueError(f"event batch list_truth offsets must never decrease and end within its {size} entries")
    if batch.attr.shape[0]:
        attr, xp = _searchable(batch.attr)
        token, _ = _searchable(batch.token)
        mine = xp.isin(attr, xp.asarray(np.asarray(list_attrs, np.int32)))
        if bool(mine.any()):
            top = int(token[mine].max())
            low = int(token[mine].min())
            if low < 0 or top >= n_rows:
                raise ValueError(f"event batch list token {top if top >= n_rows else low} has no row in "
                                 f"list_truth ({n_rows} rows)")


def _max_token(batch, attrs) -> int | None:
    """The largest token of the batch's entries of ``attrs`` (every entry
    when None); None when there is no such entry."""
    if attrs is None:
        return int(cuda_support.to_host(batch.token.max()))
    if not len(attrs):
        return None
    attr, xp = _searchable(batch.attr)
    token, _ = _searchable(batch.token)
    mine = xp.isin(attr, xp.asarray(np.asarray(attrs, np.int32)))
    return int(token[mine].max()) if bool(mine.any()) else None


def check_batch(batch, pattern_truth, alive, n_subs: int, n_patterns: int, list_attrs=(),
                pattern_attrs=None) -> np.ndarray:
    """Validate a match call's inputs (host or device arrays) before any of
    them reaches a kernel -- a kernel reading out of bounds does not raise.
    ``pattern_attrs``, ``list_attrs``: the attributes of the segment's
    pattern and list predicates (:func:`token_attributes`), whose entries'
    tokens index the pattern table (every entry's when None) and the
    batch's list table.  Returns the batch's event offsets on the host."""
    for field, dtype in BATCH_DTYPES.items():
        if not hasattr(batch, field):
            raise TypeError(f"the event batch must be an engine.events.EventBatch (no {field!r} field), "
                            f"not {type(batch).__name__}")
        _check_array(f"event batch field {field!r}", getattr(batch, field), dtype, 1)
    _check_array("pattern_truth", pattern_truth, np.uint8, 2)
    _check_array("alive", alive, np.uint8, 1)
    if alive.shape[0] != n_subs:
        raise ValueError(f"alive has {alive.shape[0]} flags for a segment of {n_subs} subscriptions")
    offsets = cuda_support.to_host(batch.offsets)
    nnz = batch.attr.shape[0]
    if len(offsets) == 0 or offsets[0] != 0 or offsets[-1] != nnz or (np.diff(offsets) < 0).any():
        raise ValueError(f"event batch offsets do not describe {nnz} attribute entries "
                         f"(they must start at 0, never decrease and end at {nnz})")
    if batch.value.shape[0] != nnz or batch.token.shape[0] != nnz:
        raise ValueError(f"event batch fields differ in length: attr {nnz}, value {batch.value.shape[0]}, "
                         f"token {batch.token.shape[0]}")
    if pattern_truth.shape[1] < n_patterns:
        raise ValueError(f"pattern_truth has {pattern_truth.shape[1]} pattern columns; the segment uses "
                         f"{n_patterns}")
    # (a list attribute's token is its list's row, not a string: only the pattern attributes' are checked here)
    top = _max_token(batch, pattern_attrs) if nnz else None
    if top is not None:
        if top >= pattern_truth.shape[0]:
            raise ValueError(f"event batch token {top} has no row in pattern_truth "
                             f"({pattern_truth.shape[0]} rows)")
    check_list_truth(batch, list_attrs)
    return offsets


def pipeline_events(n_events: int, chunks: int, min_events: int) -> int:
    """The most events of one chunk of a batch whose results go to the
    host: the batch cut into about ``chunks`` (so the host copies one
    chunk's results back while the device matches the next), each a whole
    multiple of ``min_events`` (a chunk must keep the device busy on its
    own; A-PCM's re-ordering batches, 1,024 events by default, stay whole);
    a batch of fewer than ``2 * min_events`` events is not cut.  (The
    caller joins a last chunk under ``min_events`` to the one before.)"""
    min_events = max(1, int(min_events))
    if chunks <= 1 or n_events < 2 * min_events:
        return n_events
    return -(-n_events // (chunks * min_events)) * min_events


def plan_chunk(cost: np.ndarray, start: int, room: int) -> int:
    """End of the chunk starting at event ``start``: the most events whose
    cumulative scratch ``cost[stop] - cost[start]`` fits ``room`` bytes (at
    least one; the caller checked that one fits)."""
    stop = int(np.searchsorted(cost, cost[start] + room, side="right")) - 1
    return min(max(stop, start + 1), len(cost) - 1)


class DeviceSegment:
    """A compiled segment's arrays on the device: programs and predicate
    table, uploaded once; the predicate *codes* (``lo``, ``hi``, IN lists)
    again whenever :meth:`refresh` sees that a recode replaced them."""

    def __init__(self, segment: Segment):
        self.segment = segment
        preds = segment.predicates
        dev = cuda_support.to_device
        self.prog_offsets = dev(segment.prog_offsets, np.int64)
        self.prog_kind = dev(segment.prog_kind, np.int8)
        self.prog_arg = dev(segment.prog_arg, np.int32)
        self.pred_attr = dev(preds.attr, np.int32)
        self.pred_op = dev(preds.op, np.int8)
        self.pred_aux = dev(preds.aux, np.int64)
        self._coded_from = None
        self.refresh()

    def with_codes(self, segment: Segment) -> "DeviceSegment":
        """The device copy of ``segment``, the same programs with other
        predicate codes: the programs and keys are shared, only the codes
        are uploaded (this copy is unchanged)."""
        derived = copy.copy(self)
        derived.segment = segment
        derived._coded_from = None
        derived.refresh()
        return derived

    def refresh(self) -> None:
        preds = self.segment.predicates
        if preds.lo is None or preds.set_offsets is None:
            raise ValueError("the segment's predicates carry no codes yet: call "
                             "segment.predicates.recode(schema) before matching")
        host = (preds.lo, preds.hi, preds.set_offsets, preds.set_values)
        if self._coded_from is not None and all(a is b for a, b in zip(host, self._coded_from)):
            return
        dev = cuda_support.to_device
        self.pred_lo = dev(preds.lo, np.float64)
        self.pred_hi = dev(preds.hi, np.float64)
        self.set_offsets = dev(preds.set_offsets, np.int64)
        self.set_values = dev(preds.set_values, np.float64)
        self._coded_from = host

    @property
    def nbytes(self) -> int:
        return sum(int(a.nbytes) for a in (self.prog_offsets, self.prog_kind, self.prog_arg, self.pred_attr,
                                           self.pred_op, self.pred_aux, self.pred_lo, self.pred_hi,
                                           self.set_offsets, self.set_values))


def pattern_columns(segment: Segment) -> int:
    """Columns of the pattern table a segment reads (its largest pattern id + 1)."""
    patterns = segment.predicates.aux[np.isin(segment.predicates.op, PATTERN_CODES)]
    return int(patterns.max()) + 1 if len(patterns) else 0


def token_attributes(segment: Segment) -> tuple[np.ndarray, np.ndarray]:
    """``(pattern_attrs, list_attrs)``: the attributes a segment's pattern
    predicates (LIKE, MATCHES and negations) and list predicates (ONE OF
    ... IS NOT EMPTY) read -- the entries whose tokens the kernels use, as
    rows of the pattern table (distinct strings) and of the batch's list
    table (event lists) respectively."""
    preds = segment.predicates
    lists = (preds.op >= FIRST_LIST_OP) & (preds.op <= LAST_LIST_OP)
    patterns = np.isin(preds.op, PATTERN_CODES)
    return np.unique(preds.attr[patterns]).astype(np.int32), np.unique(preds.attr[lists]).astype(np.int32)


def _empty_result(output: str):
    if output == "device":
        xp = cuda_support.array_module()
        return xp.zeros(0, dtype=np.int64), xp.zeros(0, dtype=np.int64)
    return np.zeros(0, np.int64), np.zeros(0, np.int64)


# ------------------------------------------------------------------ matcher
class ChunkedCudaMatcher(Matcher):
    """What every cuda matcher shares: input checks, the pattern table and
    ``alive`` flags copied over (or taken in place), and the walk over the
    batch in chunks sized to the device memory budget, results copied back
    chunk by chunk or kept on the device.  A subclass says what one event
    of a chunk costs (:meth:`_event_bytes`), what a call holds besides
    (:meth:`_fixed_bytes`), and matches one chunk (:meth:`_match_chunk`)."""

    backend = "cuda"
    #: per-phase device times when a benchmark sets an enabled
    #: :class:`~gpu_kernels.cuda_support.PhaseTimer` here (off by default: it synchronises)
    phases = cuda_support.PhaseTimer(enabled=False)
    segment: Segment
    launch: cuda_support.LaunchConfig
    device_memory: int | None
    _n_patterns: int
    #: the attributes of the segment's pattern and list predicates (:func:`token_attributes`; None: every
    #: entry's token is checked against the pattern table)
    _token_attrs: tuple | None = None
    #: a batch whose results go to the host is matched in this many chunks at least (:func:`pipeline_events`;
    #: 1: one chunk, as the memory budget allows), none under ``pipeline_min_events`` events
    pipeline_chunks: int = 4
    pipeline_min_events: int = 1024

    def _refresh(self) -> None:
        """Bring the device copy of the index up to date (recoded strings)."""

    def _event_bytes(self) -> tuple[int, str]:
        """Device scratch bytes of one event of a chunk besides its
        attributes, and what they are (for the error message)."""
        raise NotImplementedError

    def _fixed_bytes(self) -> int:
        """Device scratch bytes a match call holds whatever the chunk size."""
        return 0

    def _match_chunk(self, batch, events_d, offsets, start: int, stop: int, truth_d, list_d, alive_d,
                     result_room: int, col_dtype=np.int64):
        """Match events ``[start, stop)`` (``truth_d``, ``list_d``: the
        batch's pattern and list tables on the device); yields
        :meth:`_compact`'s pieces."""
        raise NotImplementedError

    def match(self, batch, pattern_truth, alive, *, output: str = "numpy", ids=None):
        """(event index, subscription position) pairs, ascending by event
        then position -- NumPy int64 arrays, or device arrays (CuPy; NumPy
        under the simulator) with ``output="device"``.  The batch's arrays
        may be host arrays or already on the device.  With ``ids`` (int64,
        one per subscription position; host or device) the second array
        holds ``ids[position]`` instead, mapped on the way back."""
        if output not in OUTPUTS:
            raise ValueError(f"output must be one of {', '.join(map(repr, OUTPUTS))}, not {output!r}")
        seg = self.segment
        n_subs = len(seg)
        if ids is not None and (getattr(ids, "shape", None) != (n_subs,) or np.dtype(ids.dtype) != np.int64):
            raise ValueError(f"ids must be an int64 array of the segment's {n_subs} subscription ids")
        pattern_attrs, list_attrs = self._token_attrs or (None, ())
        offsets = check_batch(batch, pattern_truth, alive, n_subs, self._n_patterns, list_attrs, pattern_attrs)
        n_events = len(offsets) - 1
        if n_subs == 0 or n_events == 0:
            return _empty_result(output)
        self._refresh()

        # a batch with any field on the device is used in place (its host fields copied over whole);
        # a host batch is sliced per chunk
        on_device = any(cuda_support.is_device_array(getattr(batch, f)) for f in BATCH_DTYPES)
        fixed = self._fixed_bytes()
        if cuda_support.is_device_array(pattern_truth):
            truth_d = cuda_support.as_device(pattern_truth)
        else:
            truth_d = cuda_support.to_device(pattern_truth)
            fixed += truth_d.nbytes
        # the list table, copied once per call like the pattern table (a batch without event lists ships
        # the 8-byte empty one, left out of the budget)
        list_truth = getattr(batch, "list_truth", None)
        list_truth = NO_LISTS if list_truth is None else list_truth
        if cuda_support.is_device_array(list_truth):
            list_d = cuda_support.as_device(list_truth)
        else:
            list_d = cuda_support.to_device(np.ascontiguousarray(list_truth, np.int64))
            if list_d.shape[0] > 1:
                fixed += list_d.nbytes
        if cuda_support.is_device_array(alive):
            alive_d = cuda_support.as_device(alive)
        else:
            alive_d = cuda_support.to_device(alive)
            fixed += alive_d.nbytes
        if on_device:
            events_d = tuple(cuda_support.as_device(getattr(batch, f)) for f in BATCH_DTYPES)
            row_bytes, entry_bytes = 0, self._item_bytes()
        else:
            events_d = None
            row_bytes, entry_bytes = OFFSET_BYTES, ENTRY_BYTES + self._item_bytes()
        event_bytes, what = self._event_bytes()
        row_bytes += event_bytes
        cost = np.arange(n_events + 1, dtype=np.int64) * row_bytes + offsets * entry_bytes
        single = np.diff(cost)
        reserve = PAIR_BYTES * n_subs
        fixed_budget = self.device_memory is not None or cuda_simulated()

        def room(held: int) -> tuple[int, int]:
            budget = device_memory_budget(self.device_memory)
            return budget - fixed - reserve - (held if fixed_budget else 0), budget

        free, budget = room(0)
        worst = int(np.argmax(single))
        if single[worst] > free:
            raise DeviceMemoryError(
                f"event {worst} of the batch cannot fit the device memory budget: matching it against "
                f"{n_subs} subscriptions needs {int(single[worst]) + reserve} bytes on the device ({what}, "
                f"{int(single[worst]) - event_bytes} for its attributes, up to {reserve} for its results), but the "
                f"budget of {budget} bytes leaves {free + reserve} after {fixed} for the batch's pattern and list "
                f"tables, alive flags and the matcher's scratch. Free device memory, raise device_memory, or shard "
                f"the subscriptions over several indexes")

        # positions travel to the host as int32 when they fit (see gpu_kernels.transfer)
        col_dtype = np.int64 if output == "device" or n_subs > np.iinfo(np.int32).max else np.int32
        host_ids = None if ids is None or output == "device" else cuda_support.to_host(ids)
        results_row, results_col = [], []
        # host results: each piece copied back by a worker while the next chunk runs (a phase timer wants
        # the phases apart); the batch cut into pipeline chunks so there is a next chunk to overlap
        to_host = None if output == "device" else transfer.HostResults(
            n_events, host_ids, overlap=self.phases.times is None, max_per_event=n_subs)
        most = n_events if to_host is None else pipeline_events(n_events, self.pipeline_chunks,
                                                                 self.pipeline_min_events)
        held = 0
        start = 0
        n_chunks = 0
        outgrew = False
        try:
            while start < n_events:
                in_flight = to_host.pending_bytes if to_host is not None else 0
                free, budget = room(held + (in_flight if fixed_budget else 0))
                if single[start] > free and in_flight:
                    to_host.wait()              # the piece being copied back holds the room this event needs
                    free, budget = room(held)
                if single[start] > free:
                    raise DeviceMemoryError(
                        f"device results of earlier chunks hold {held} bytes and leave too little of the "
                        f"{budget}-byte budget for event {start}; use output='numpy' (results copied back chunk "
                        f"by chunk)")
                fits = plan_chunk(cost, start, free)
                outgrew |= fits < min(start + most, n_events)
                stop = min(fits, start + most)
                if fits == n_events and n_events - stop < self.pipeline_min_events:
                    stop = n_events             # no tail chunk under the pipeline's minimum
                n_chunks += 1
                logger.debug("%s/cuda: chunk %d, events %d-%d of %d (%d bytes free of the %d-byte budget)",
                             self.name, n_chunks, start, stop - 1, n_events, free, budget)
                pieces = self._match_chunk(batch, events_d, offsets, start, stop, truth_d, list_d, alive_d,
                                           free + reserve - int(cost[stop] - cost[start]), col_dtype)
                for first_row, row_ends, rows, cols in pieces:
                    if to_host is None:
                        held += PAIR_BYTES * int(rows.shape[0])
                        results_row.append(rows)
                        results_col.append(cols)
                        continue
                    with self.phases("copy-back"):
                        to_host.add(first_row, row_ends, cols)
                    del rows, cols      # (the worker holds the positions; the device rows are not read)
                    if first_row + len(row_ends) - 1 < stop:
                        to_host.wait()      # more pieces of this chunk follow, each sized to the chunk's room
                start = stop
            host_pairs = None if to_host is None else to_host.result()
        except BaseException:
            if to_host is not None:
                to_host.abandon()
            raise
        if outgrew:         # the batch outgrew the device memory budget: say so once per call
            logger.info("%s/cuda: %d events against %d subscriptions matched in %d chunks (device memory budget "
                        "%d bytes)", self.name, n_events, n_subs, n_chunks, budget)
        if host_pairs is not None:
            return host_pairs
        if not results_row:
            return _empty_result(output)
        xp = cuda_support.array_module()
        rows, cols = (results_row[0], results_col[0]) if len(results_row) == 1 else \
            (xp.concatenate(results_row), xp.concatenate(results_col))
        if ids is not None:
            cols = cuda_support.as_device(ids)[cols]
        return rows, cols

    def _item_bytes(self) -> int:
        """Device scratch bytes per attribute entry besides the entry itself."""
        return 0

    def _chunk_events(self, batch, events_d, offsets, start: int, stop: int):
        """The chunk's events on the device: (offsets, attr, value, token,
        first event) -- a host batch's slice, or the device batch in place."""
        if events_d is None:
            a, b = int(offsets[start]), int(offsets[stop])
            with self.phases("events-in"):
                return (cuda_support.to_device(offsets[start:stop + 1] - a), cuda_support.to_device(batch.attr[a:b]),
                        cuda_support.to_device(batch.value[a:b]), cuda_support.to_device(batch.token[a:b]), 0)
        return (*events_d, start)

    def _compact(self, hits, n_rows: int, start: int, result_room: int, col_dtype=np.int64):
        """Pieces of the chunk's hit matrix (bytes or bit words), split so
        that each piece's results fit ``result_room`` bytes: (first event
        index, the piece's row ends on the host -- ascending from 0, one
        more than its rows --, event indices, positions as ``col_dtype``)."""
        with self.phases("compaction"):
            hit_offsets, n_tiles = hit_offsets_cuda(hits, n_rows, launch=self.launch)
            row_ends = cuda_support.to_host(hit_offsets[::n_tiles])
        total = int(row_ends[-1])
        if PAIR_BYTES * total <= result_room:
            bounds = [0, n_rows]
        else:   # too many results for the room left: fill (and hand back) a few rows at a time
            bounds = [0]
            while bounds[-1] < n_rows:
                first = bounds[-1]
                limit = row_ends[first] + result_room // PAIR_BYTES
                bounds.append(min(max(int(np.searchsorted(row_ends, limit, side="right")) - 1, first + 1), n_rows))
        for first, last in zip(bounds[:-1], bounds[1:]):
            with self.phases("compaction"):
                rows, cols = fill_rows_cuda(hits, first, last, start, hit_offsets, n_tiles, launch=self.launch,
                                            col_dtype=col_dtype)
            yield start + first, row_ends[first:last + 1] - row_ends[first], rows, cols
            del rows, cols          # not held while the next piece is filled


class HostStructureCudaMatcher(ChunkedCudaMatcher):
    """A cuda matcher serving a structure built and updated on the host (the
    indexing algorithms: OpIndex, BE-Tree): ``self.host`` is the algorithm's
    host matcher, and ``_attach(host)`` takes one and copies to the device
    what changed.  Merges and recodes are the host's, the result attached to
    a copy of this matcher (which itself stays as it is, for the matches in
    flight); the saved structure is the host's."""

    host: Matcher

    def _attach(self, host) -> None:
        raise NotImplementedError

    def merged(self, segment, old_to_new, added, schema=None):
        derived = copy.copy(self)
        derived._attach(self.host.merged(segment, old_to_new, added, schema))
        return derived

    def recoded(self, segment, schema):
        host = self.host.recoded(segment, schema)
        if host is self.host:
            return self
        derived = copy.copy(self)
        derived._attach(host)
        return derived

    def to_arrays(self):
        return self.host.to_arrays()

    @property
    def nbytes(self) -> int:
        """Host bytes of the structure; see :attr:`device_nbytes` for the device copy."""
        return self.host.nbytes
