"""``opindex`` on the ``cuda`` backend (docs/architecture.md#backends-and-kernels, docs/papers.md#opindex).

The index is built on the host, exactly as on ``cpu``
(:class:`~engine.algorithms.opindex.OpIndexMatcher`: pivots, operator
lists, segment directory, signatures, counters) -- or restored from a saved
index (:meth:`OpIndexCudaMatcher.from_arrays`) -- and its one struct of
arrays (:class:`~gpu_kernels.opindex.layout.OpIndexArrays`) is copied to
the device once as its device twin, again only when a grown string
dictionary makes the host matcher derive a new index.  Each match call
walks the batch in chunks sized to the free device memory
(:class:`~engine.algorithms.cuda_base.ChunkedCudaMatcher`); per chunk:

1. the *work items* -- one per (event, pivot partition the event carries),
   Lemma 1 -- are listed with CuPy (a gather of ``pivot_of_attr`` over the
   chunk's attribute entries, the nonzero ones, their events by
   ``searchsorted``), plus one item per event for the always-checked
   subscriptions when there are any;
2. the OpIndex kernel (:mod:`gpu_kernels.opindex.cuda`) runs one block per
   item: range scans, signature tests, counting, verification, and the
   result bits of the chunk's bit matrix;
3. the bit matrix is compacted into (event, position) pairs, ascending in
   both (:mod:`gpu_kernels.compaction`).

Counters live in shared memory for partitions whose counters and clause
bits fit ``shared_memory`` bytes (40 KiB by default), in a global scratch
otherwise (then the items of the two kinds are launched separately).
Device memory per call: the global counter and clause-bit scratch of the
resident blocks (``blocks × widest large partition × 4`` bytes), and per
event of a chunk its bit row (``n_subs / 8`` bytes), compaction counts and offsets,
and 16 bytes per attribute entry for its work item.

With ``counting="sort"`` the chunk's items are counted by a scans-only
pass, then emitted, sorted and segmented in groups whose keys take at most
the room left for results (``SORT_BYTES_PER_KEY`` bytes a key); the
always-checked items still run their programs in the atomic kernel.
"""

from __future__ import annotations


import numpy as np

from engine.algorithms.cuda_base import (HostStructureCudaMatcher, check_program_depths, pattern_columns,
                                        token_attributes)
from engine.algorithms.opindex import DEFAULT_SEGMENTS, DEFAULT_SIGNATURE_BITS, OpIndexMatcher
from engine.algorithms.options import SHARED_MEMORY, OpIndexOptions
from engine.backend import resolve_backend
from gpu_kernels import cuda_support
from gpu_kernels.compaction import n_tiles_for
from gpu_kernels.opindex import layout
from gpu_kernels.opindex.cuda import finish_cuda, opindex_kernel_cuda, sort_and_segment
from gpu_kernels.scan import cuda_stack_depth

#: device bytes per attribute entry for its work item (event int64, partition int32, the gather's temporaries)
ITEM_BYTES = 16
#: most resident blocks on a real GPU (grid-stride beyond): enough to fill an H100's 132 SMs several times over
MAX_BLOCKS = 8192
#: threads per block on a real GPU, chosen per chunk within these bounds by
#: :func:`block_threads` (the measurements behind them: BENCHMARKS.md,
#: "Tuning the atomic kernel")
GPU_THREADS = (256, 512)
#: threads per event attribute: its eight operator lists, two halves each
THREADS_PER_ATTRIBUTE = 16


def block_threads(widths: np.ndarray, low: int, high: int) -> int:
    """Threads per block for a chunk whose events carry ``widths``
    attributes: the power of two from ``low`` up to ``high`` that lets the
    90th-percentile event's units all be scanned in one round (wider
    events take several rounds; with more threads than units, the rest
    idle through the range scans)."""
    threads = low
    if high > low and len(widths):
        want = THREADS_PER_ATTRIBUTE * int(np.percentile(widths, 90))
        while threads < want and threads < high:
            threads *= 2
    return threads


#: device bytes per key of sort-and-segment counting: the key, the sort's
#: output and temporaries, the run starts and lengths
SORT_BYTES_PER_KEY = 48
#: most keys sorted at once: CuPy's boolean-mask indexing counts in 32-bit integers
MAX_SORT_KEYS = 1 << 30


class OpIndexCudaMatcher(HostStructureCudaMatcher):
    """OpIndex on the device (see the module docstring).

    Takes the options of :class:`~engine.algorithms.opindex.OpIndexMatcher`
    (``variant="bs"`` is OpIndex-BS) plus ``launch`` (a
    :class:`~gpu_kernels.cuda_support.LaunchConfig`: its ``max_grid[0]``
    caps the blocks, and its block's thread count is the kernel's block),
    ``threads`` (overrides that: a power of two, or a ``(low, high)`` range
    chosen from per chunk by :func:`block_threads`; a real GPU's default is
    :data:`GPU_THREADS`), ``device_memory`` (bytes one match call may use),
    ``shared_memory`` (see the module docstring) and ``counting``:
    ``"atomic"`` (the default; BENCHMARKS.md has the measurement that
    chose it) or ``"sort"`` (sort-and-segment, same results)."""

    name = "opindex"

    @classmethod
    def construct(cls, segment, settings) -> "OpIndexCudaMatcher":
        return cls(segment, cls.backend, schema=settings.schema, dnf_limit=settings.dnf_limit,
                   **settings.options.keywords(cls.backend))

    def __init__(self, segment, backend: str = "cuda", *, schema=None, event_log=None, dnf_limit: int | None = None,
                 segments: int = DEFAULT_SEGMENTS, signature_bits: int = DEFAULT_SIGNATURE_BITS,
                 variant: str | None = None, operand_ranks: bool | None = None, launch=None,
                 device_memory: int | None = None, shared_memory: int = SHARED_MEMORY, counting: str = "atomic",
                 threads=None):
        if backend != "cuda":
            raise ValueError(f"OpIndexCudaMatcher runs on backend 'cuda', not {backend!r}")
        resolve_backend("cuda")    # BackendUnavailable naming what is missing
        OpIndexOptions(variant=OpIndexMatcher.variant if variant is None else variant, segments=segments,
                       signature_bits=signature_bits, operand_ranks=operand_ranks, event_log=event_log,
                       launch=launch, threads=threads, device_memory=device_memory, shared_memory=shared_memory,
                       counting=counting)
        self._configure(launch, threads, device_memory, shared_memory, counting)
        self._attach(OpIndexMatcher(segment, "cpu", schema=schema, event_log=event_log, dnf_limit=dnf_limit,
                                    segments=segments, signature_bits=signature_bits, variant=variant,
                                    operand_ranks=operand_ranks))

    @classmethod
    def from_arrays(cls, segment, settings, meta: dict, arrays: dict) -> "OpIndexCudaMatcher":
        """The host index restored (:meth:`OpIndexMatcher.from_arrays
        <engine.algorithms.opindex.OpIndexMatcher.from_arrays>`: every
        array checked, ValueError otherwise), then copied to the device."""
        resolve_backend("cuda")
        host = OpIndexMatcher.from_arrays(segment, settings, meta, arrays)
        options = settings.options.keywords(cls.backend)
        matcher = cls.__new__(cls)
        matcher._configure(options["launch"], options["threads"], options["device_memory"], options["shared_memory"],
                           options["counting"])
        matcher._attach(host)
        matcher.settings = settings
        return matcher


    def _configure(self, launch, threads, device_memory, shared_memory, counting) -> None:
        """The device settings (values checked by OpIndexOptions)."""
        self.backend = "cuda"
        self.launch = launch or cuda_support.default_launch()
        if threads is None:     # a given launch (or the simulator's tiny default) sets the block
            fixed = launch is not None or cuda_support.simulated()
            threads = self.launch.block[0] * self.launch.block[1] if fixed else GPU_THREADS
        low, high = (threads, threads) if isinstance(threads, (int, np.integer)) else tuple(threads)
        if any(t < 2 or t > 1024 or t & (t - 1) for t in (low, high)) or low > high:
            raise ValueError(f"the OpIndex kernel needs a power-of-two number of threads per block in [2, 1024] "
                             f"(or a (low, high) range of them), not {threads!r}")
        self.thread_range = (int(low), int(high))
        self.device_memory = device_memory
        self.shared_memory = int(shared_memory)
        self.counting = counting

    def _attach(self, host: OpIndexMatcher) -> None:
        """Serve ``host``'s index (and its segment) from the device."""
        self.host = host
        self.segment = host.segment
        self.variant = host.variant
        self._n_patterns = pattern_columns(host.segment)
        self._token_attrs = token_attributes(host.segment)
        self._uploaded_from = None
        self._refresh()

    # ------------------------------------------------------------ device copy
    def _refresh(self) -> None:
        host = self.host
        preds = self.segment.predicates
        source = (host.arrays, preds.lo, preds.hi, preds.set_values)
        if self._uploaded_from is not None and all(a is b for a, b in zip(source, self._uploaded_from)):
            return
        # the device twins of the index and of the segment's programs
        self.index_d = layout.to_device(host.arrays)
        self.programs_d = layout.to_device(layout.Programs.of(self.segment))
        index = host.arrays
        self.n_always = len(index.always_pos)
        # the always-checked programs run on a per-thread stack (only they need one)
        self.stack_depth = check_program_depths(self.segment) if self.n_always else cuda_stack_depth(1)
        # partitions whose counters and clause bits fit shared memory, and the
        # widths of the two scratch layouts (shared; global, per block)
        n_counters = np.diff(index.part_counter_start)
        n_slots = np.diff(index.part_slot_start)
        in_shared = 4 * (n_counters + n_slots) <= self.shared_memory
        self.layouts = {True: (int(n_counters[in_shared].max(initial=0)), int(n_slots[in_shared].max(initial=0))),
                        False: (int(n_counters[~in_shared].max(initial=0)), int(n_slots[~in_shared].max(initial=0)))}
        self.all_shared = bool(in_shared.all())
        # sort-and-segment keys: item * key_stride + (counter, or counter_width + clause slot)
        widest_counters = int(n_counters.max(initial=0))
        self.sort_widths = (widest_counters, max(widest_counters + int(n_slots.max(initial=0)), 1))
        self._dummy = cuda_support.to_device(np.zeros(1, np.int64))
        self._dummy_i32 = cuda_support.to_device(np.zeros(1, np.int32))
        self.part_in_shared = cuda_support.to_device(in_shared, np.bool_)
        self._uploaded_from = source

    @property
    def device_nbytes(self) -> int:
        """Device bytes held: the index's and the programs' twins and the
        per-partition flags."""
        return layout.nbytes(self.index_d) + layout.nbytes(self.programs_d) + sum(
            int(a.nbytes) for a in (self.part_in_shared, self._dummy, self._dummy_i32))

    # ------------------------------------------------------------- chunking
    def _blocks(self) -> int:
        return max(1, min(self.launch.max_grid[0], MAX_BLOCKS))

    def _fixed_bytes(self) -> int:
        return 0 if self.all_shared else self._blocks() * 4 * (sum(self.layouts[False]) or 1)

    def _event_bytes(self) -> tuple[int, str]:
        n_words = -(-len(self.segment) // 64)
        n_tiles = n_tiles_for(n_words, self.launch, bits=True)
        return 8 * n_words + 16 * n_tiles + ITEM_BYTES, \
            f"a result bit row of {8 * n_words} bytes, {16 * n_tiles} for compaction"

    def _item_bytes(self) -> int:
        return ITEM_BYTES

    # -------------------------------------------------------------- matching
    def _work_items(self, ev_offsets, ev_attr, n_rows: int):
        """(event, partition) of every work item of a chunk: each attribute
        entry whose attribute is a pivot, and (partition -1) one per event
        for the always-checked subscriptions."""
        xp = cuda_support.array_module()
        pivot_of_attr = self.index_d.pivot_of_attr
        n_attrs = len(self.host.arrays.pivot_of_attr)
        first = int(ev_offsets[0])
        attr = ev_attr[first:int(ev_offsets[n_rows])]
        part = pivot_of_attr[xp.minimum(attr, n_attrs - 1)]
        part = xp.where(attr < n_attrs, part, -1)
        entries = xp.flatnonzero(part >= 0)
        events = xp.searchsorted(ev_offsets[1:n_rows + 1], entries + first, side="right")
        item_event, item_part = events.astype(np.int64), part[entries].astype(np.int32)
        if self.n_always:
            item_event = xp.concatenate((item_event, xp.arange(n_rows, dtype=np.int64)))
            item_part = xp.concatenate((item_part, xp.full(n_rows, -1, dtype=np.int32)))
        return item_event, item_part

    def _match_chunk(self, batch, events_d, offsets, start: int, stop: int, truth_d, list_d, alive_d,
                     result_room: int, col_dtype=np.int64):
        xp = cuda_support.array_module()
        n_rows = stop - start
        ev_offsets, ev_attr, ev_value, ev_token, event_start = self._chunk_events(batch, events_d, offsets,
                                                                                  start, stop)
        if event_start:      # a device batch in place: this chunk's offsets, events renumbered from 0
            ev_offsets = ev_offsets[event_start:stop + 1]
        events = (ev_offsets, ev_attr, ev_value, ev_token, truth_d, alive_d, list_d)
        threads = block_threads(np.diff(offsets[start:stop + 1]), *self.thread_range)
        with self.phases("work items"):
            item_event, item_part = self._work_items(ev_offsets, ev_attr, n_rows)
            bits = xp.zeros((n_rows, -(-len(self.segment) // 64)), dtype=np.uint64)
        with self.phases("counting"):
            if self.counting == "sort":
                always = item_part < 0
                if self.n_always:
                    self._count_atomic(item_event[always], item_part[always], events, bits, threads)
                self._count_sorted(item_event[~always], item_part[~always], events, bits, result_room, threads)
            else:
                self._count_atomic(item_event, item_part, events, bits, threads)
        del item_event, item_part
        yield from self._compact(bits, n_rows, start, result_room, col_dtype)

    def _launch(self, mode: str, in_shared: bool, events, parts, chunk_events, bits, n_blocks: int, threads: int,
                scratch, counter_width: int, block_width: int, sorting=None):
        """One launch of the OpIndex kernel over items (``events``, ``parts``)."""
        ev_offsets, ev_attr, ev_value, ev_token, truth_d, alive_d, list_d = chunk_events
        item_hits, item_first, keys, key_stride = sorting or (self._dummy, self._dummy, self._dummy, 0)
        opindex_kernel_cuda(
            n_blocks, threads, self.stack_depth, 4 * block_width if in_shared and mode == "atomic" else 0,
            np.int64(events.shape[0]), events, parts, ev_offsets, ev_attr, ev_value, ev_token, truth_d, list_d,
            self.index_d, self.programs_d, alive_d, scratch, np.int64(counter_width), np.int64(block_width),
            in_shared, bits, item_hits, item_first, keys, np.int64(key_stride), mode=mode)

    def _count_atomic(self, item_event, item_part, chunk_events, bits, threads: int) -> None:
        """Counting with atomic decrements; items of partitions whose
        counters fit shared memory and the others in separate launches."""
        xp = cuda_support.array_module()
        if not item_event.shape[0]:
            return
        if not self.all_shared:     # items of large partitions: counters in global memory
            shared = self.part_in_shared[xp.maximum(item_part, 0)] | (item_part < 0)
            groups = [(True, xp.flatnonzero(shared)), (False, xp.flatnonzero(~shared))]
            groups = [(mode, item_event[k], item_part[k]) for mode, k in groups if k.shape[0]]
        else:
            groups = [(True, item_event, item_part)]
        for in_shared, events, parts in groups:
            counter_width, slot_width = self.layouts[in_shared]
            block_width = counter_width + slot_width
            n_blocks = min(self._blocks(), int(events.shape[0]))
            scratch = xp.empty(1 if in_shared else n_blocks * max(block_width, 1), dtype=np.int32)
            self._launch("atomic", in_shared, events, parts, chunk_events, bits, n_blocks, threads, scratch,
                         counter_width, block_width)

    def _count_sorted(self, item_event, item_part, chunk_events, bits, room: int, threads: int) -> None:
        """Sort-and-segment counting: the ``count`` pass sizes each item's
        keys, then groups of items whose keys (and the sort's copies) fit
        ``room`` bytes are emitted, sorted and segmented in turn."""
        xp = cuda_support.array_module()
        n_items = int(item_event.shape[0])
        if not n_items:
            return
        index = self.index_d
        n_blocks = min(self._blocks(), n_items)
        item_hits = xp.zeros(n_items, dtype=np.int64)
        self._launch("count", True, item_event, item_part, chunk_events, bits, n_blocks, threads, self._dummy_i32,
                     0, 0, (item_hits, self._dummy, self._dummy, 0))
        item_first = cuda_support.exclusive_cumsum(item_hits)
        ends = cuda_support.to_host(item_first)
        per_group = max(1, min(room // SORT_BYTES_PER_KEY, MAX_SORT_KEYS))
        counter_width, key_stride = self.sort_widths
        ev_offsets, ev_attr = chunk_events[0], chunk_events[1]
        lo = 0
        while lo < n_items:
            hi = min(max(int(np.searchsorted(ends, ends[lo] + per_group, side="right")) - 1, lo + 1), n_items)
            events, parts = item_event[lo:hi], item_part[lo:hi]
            # every slot is written: the emit pass walks exactly the entries the count pass counted
            keys = xp.full(1, -1, dtype=np.int64) if ends[hi] == ends[lo] else \
                xp.empty(int(ends[hi] - ends[lo]), dtype=np.int64)
            first = item_first[lo:hi] - int(ends[lo])
            self._launch("emit", True, events, parts, chunk_events, bits, min(n_blocks, hi - lo), threads,
                         self._dummy_i32, counter_width, 0, (self._dummy, first, keys, key_stride))
            sat_item, sat_counter = sort_and_segment(keys, key_stride, counter_width, parts,
                                                     index.part_counter_start, index.part_slot_start,
                                                     index.slot_counter, index.counter_init)
            del keys
            finish_cuda(events[sat_item], sat_counter, ev_offsets, ev_attr, index.counter_post_start,
                        index.post_attr, index.counter_sub, chunk_events[5], bits, launch=self.launch)
            lo = hi

    def __repr__(self) -> str:
        return repr(self.host).replace("OpIndexMatcher", type(self).__name__, 1)


__all__ = ["OpIndexCudaMatcher", "block_threads"]
