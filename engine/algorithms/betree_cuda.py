"""``betree`` on the ``cuda`` backend (docs/architecture.md#backends-and-kernels, docs/papers.md#be-tree).

The tree is built on the host, exactly as on ``cpu``
(:class:`~engine.algorithms.betree.BETreeMatcher`: units, Table 1 keys, the
dynamic tree, its flattened form) -- or restored from a saved index
(:meth:`BETreeCudaMatcher.from_arrays`) -- and its arrays are copied to the
device once as their device twins: the structure
(:class:`~gpu_kernels.betree.layout.BETreeArrays`), the leaf entries
(:class:`~gpu_kernels.betree.layout.LeafArrays`), the extended predicate
rows, the string attributes and the base-code map.  Each is copied again
only when the host matcher's array changes: a merge derives a new tree (and
leaves), a grown string dictionary new predicate codes and a new base-code
map but the same tree.  Each match call walks the batch in chunks sized to
the free device memory
(:class:`~engine.algorithms.cuda_base.ChunkedCudaMatcher`); per chunk:

1. the events' 64-bit keys (:func:`gpu_kernels.betree.layout.event_keys`,
   with CuPy) -- the clustering directories' coordinates;
2. the BE-Tree kernel (:mod:`gpu_kernels.betree.cuda`), one block per
   event: Algorithms 1 and 2 over a frontier queue in shared memory, the
   result bits of the chunk's bit matrix set with an atomic OR; the events
   whose frontier overflowed the shared queue run again with a spill
   region in global memory (only for a tree where that can happen);
3. the bit matrix compacted into (event, position) pairs, ascending in both
   (:mod:`gpu_kernels.compaction`) -- the CPU matcher's exact output.

Device memory per call: per event of a chunk its bit row (``n_subs / 8``
bytes), compaction counts and offsets, and 9 bytes of event list and
overflow flag; per attribute entry its key and the key computation's
temporaries (:data:`KEY_BYTES`); and, for a tree whose frontier can exceed
the shared queue, the spill regions of the second pass's blocks (4 bytes
per c-node one event can visit, per block).
"""

from __future__ import annotations


import numpy as np

from engine.algorithms.betree import DEFAULT_LIMIT, BETreeMatcher
from engine.algorithms.cuda_base import HostStructureCudaMatcher, pattern_columns, token_attributes
from engine.algorithms.options import DEFAULT_MAX_CAP, DEFAULT_MIN_SIZE, BETreeOptions
from engine.backend import device_memory_budget, resolve_backend
from gpu_kernels import cuda_support
from gpu_kernels.betree import layout
from gpu_kernels.betree.cuda import (QUEUE_CAPACITY, betree_kernel_cuda, check_geometry, device_leaf_arrays,
                                     frontier_bound)
from gpu_kernels.betree.layout import event_keys
from gpu_kernels.compaction import n_tiles_for

#: device bytes per attribute entry: its uint64 key and the temporaries of
#: computing it (the value copy, sign mask, flipped bits, base codes)
KEY_BYTES = 48
#: device bytes per event of a chunk besides its bit row and compaction: its
#: place in the event list (int64) and its overflow flag (uint8)
EVENT_LIST_BYTES = 9
#: most resident blocks on a real GPU (grid-stride beyond)
MAX_BLOCKS = 8192
#: threads per block on a real GPU (a batch of up to that many c-nodes per
#: round; l-nodes hold ``max_cap`` units, 20 by default) -- not measured yet
GPU_THREADS = 128
#: most blocks of the second pass (events whose frontier overflowed the
#: shared queue), each with its own spill region
SPILL_BLOCKS = 64
#: share of the device memory budget the second pass's spill regions may take
SPILL_SHARE = 4


class BETreeCudaMatcher(HostStructureCudaMatcher):
    """BE-Tree on the device (see the module docstring).

    Takes the options of :class:`~engine.algorithms.betree.BETreeMatcher`
    (``max_cap``, ``min_size``; ``schema`` and ``dnf_limit`` from the
    Index) plus ``launch`` (a :class:`~gpu_kernels.cuda_support.LaunchConfig`:
    its ``max_grid[0]`` caps the blocks, and -- given, or the simulator's --
    its block's thread count is the kernel's block; else
    :data:`GPU_THREADS`), ``device_memory`` (bytes one match call may use)
    and, for tests and tuning, ``queue_capacity`` (entries of the shared
    frontier queue, :data:`~gpu_kernels.betree.cuda.QUEUE_CAPACITY`)."""

    name = "betree"

    @classmethod
    def construct(cls, segment, settings) -> "BETreeCudaMatcher":
        return cls(segment, cls.backend, schema=settings.schema, dnf_limit=settings.dnf_limit,
                   **settings.options.keywords(cls.backend))

    def __init__(self, segment, backend: str = "cuda", *, schema=None, dnf_limit: int = DEFAULT_LIMIT,
                 max_cap: int = DEFAULT_MAX_CAP, min_size: int = DEFAULT_MIN_SIZE, theta: float | None = 0.0,
                 launch=None, device_memory: int | None = None, queue_capacity: int = QUEUE_CAPACITY):
        if backend != "cuda":
            raise ValueError(f"BETreeCudaMatcher runs on backend 'cuda', not {backend!r}")
        resolve_backend("cuda")    # BackendUnavailable naming what is missing
        BETreeOptions(max_cap=max_cap, min_size=min_size, launch=launch, device_memory=device_memory)
        self._configure(launch, device_memory, queue_capacity)
        # (theta: recycling needs the loss measured by the cpu kernel's matches, which the device does not
        # run -- the host tree is kept for merges and the device matches, so nothing is recycled on cuda)
        self._attach(BETreeMatcher(segment, "cpu", schema=schema, dnf_limit=dnf_limit, max_cap=max_cap,
                                   min_size=min_size, theta=theta))

    @classmethod
    def from_arrays(cls, segment, settings, meta: dict, arrays: dict) -> "BETreeCudaMatcher":
        """The host tree restored (:meth:`BETreeMatcher.from_arrays
        <engine.algorithms.betree.BETreeMatcher.from_arrays>`: every array
        checked, ValueError otherwise), then copied to the device."""
        resolve_backend("cuda")
        host = BETreeMatcher.from_arrays(segment, settings, meta, arrays)
        options = settings.options.keywords(cls.backend)
        matcher = cls.__new__(cls)
        matcher._configure(options["launch"], options["device_memory"], QUEUE_CAPACITY)
        matcher._attach(host)
        matcher.settings = settings
        return matcher


    def _configure(self, launch, device_memory, queue_capacity) -> None:
        """The device settings (``launch`` and ``device_memory`` checked by BETreeOptions)."""
        self.backend = "cuda"
        self.launch = launch or cuda_support.default_launch()
        fixed = launch is not None or cuda_support.simulated()
        self.threads = self.launch.block[0] * self.launch.block[1] if fixed else GPU_THREADS
        if isinstance(queue_capacity, (bool, np.bool_)) or not isinstance(queue_capacity, (int, np.integer)):
            raise ValueError(f"queue_capacity must be an integer (c-nodes of the shared frontier queue), not "
                             f"{queue_capacity!r}")
        check_geometry(self.threads, int(queue_capacity))
        self.device_memory = device_memory
        self.queue_capacity = int(queue_capacity)

    def _attach(self, host: BETreeMatcher) -> None:
        """Serve ``host``'s tree (and its segment) from the device; the
        device twins this matcher already holds are kept where the host's
        arrays are the same."""
        self.host = host
        self.segment = host.segment
        self._n_patterns = pattern_columns(host.segment)
        self._token_attrs = token_attributes(host.segment)
        self._refresh()

    # ------------------------------------------------------------ device copy
    def _refresh(self) -> None:
        """Copy over what differs from the host arrays the device twins were
        made from (compared by identity: the host matcher never changes an
        array in place, it derives new ones)."""
        host = self.host
        made = getattr(self, "_uploaded_from", {})
        rows = host.units.rows
        sources = {"tree": tuple(host.tree), "rows": tuple(rows), "strings": (host.string_attr, host.str_map),
                   "leaf": (host.leaf.l_head, host.leaf.v_pid, rows.attr, rows.op, rows.lo, rows.hi)}
        same = {part: part in made and len(src) == len(made[part]) and all(a is b for a, b in zip(src, made[part]))
                for part, src in sources.items()}
        if not same["tree"]:
            tree = host.tree
            self.tree_d = layout.to_device(tree)
            # the most c-nodes one event visits: when the shared queue may be too small, the spill's size
            bound = int(frontier_bound(tree.c_depth, tree.c_child, tree.c_leaf, tree.c_pdir, tree.p_top))
            self.spill_cap = bound if bound > self.queue_capacity else 0
        if not same["leaf"]:
            # the inline predicates from the current rows: a recode changes their codes, not the leaves
            self.leaf_d = layout.to_device(device_leaf_arrays(host.leaf, rows))
        if not same["rows"]:
            self.rows_d = layout.to_device(rows)
        if not same["strings"]:
            # empty arrays stay host arrays: event_keys reads neither then (a device copy would be padded)
            self.string_attr_d = cuda_support.to_device(host.string_attr) if len(host.string_attr) else \
                host.string_attr
            self.str_map_d = cuda_support.to_device(host.str_map) if len(host.str_map) else host.str_map
        if not made:
            self._dummy_i32 = cuda_support.to_device(np.zeros(1, np.int32))
        self._uploaded_from = sources

    @property
    def device_nbytes(self) -> int:
        """Device bytes held: the twins of the structure, the leaves, the
        predicate rows and the string maps."""
        strings = sum(int(a.nbytes) for a in (self.string_attr_d, self.str_map_d))     # (empty ones: 0)
        return layout.nbytes(self.tree_d) + layout.nbytes(self.leaf_d) + layout.nbytes(self.rows_d) + strings + \
            int(self._dummy_i32.nbytes)

    # ------------------------------------------------------------- chunking
    def _blocks(self) -> int:
        return max(1, min(self.launch.max_grid[0], MAX_BLOCKS))

    def _spill_blocks(self) -> int:
        """Blocks of the second pass: each holds a spill region of
        ``spill_cap`` c-nodes, all of them together at most a
        :data:`SPILL_SHARE`-th of the budget (one block at least)."""
        if not self.spill_cap:
            return 0
        budget = device_memory_budget(self.device_memory)
        fit = budget // SPILL_SHARE // (4 * self.spill_cap)
        return max(1, min(SPILL_BLOCKS, self.launch.max_grid[0], fit))

    def _fixed_bytes(self) -> int:
        return 4 * self.spill_cap * self._spill_blocks()

    def _event_bytes(self) -> tuple[int, str]:
        n_words = -(-len(self.segment) // 64)
        n_tiles = n_tiles_for(n_words, self.launch, bits=True)
        return 8 * n_words + 16 * n_tiles + EVENT_LIST_BYTES, \
            f"a result bit row of {8 * n_words} bytes, {16 * n_tiles} for compaction"

    def _item_bytes(self) -> int:
        return KEY_BYTES

    # -------------------------------------------------------------- matching
    def _match_chunk(self, batch, events_d, offsets, start: int, stop: int, truth_d, list_d, alive_d,
                     result_room: int, col_dtype=np.int64):
        xp = cuda_support.array_module()
        n_rows = stop - start
        ev_offsets, ev_attr, ev_value, ev_token, event_start = self._chunk_events(batch, events_d, offsets,
                                                                                  start, stop)
        if event_start:      # a device batch in place: this chunk's offsets, events renumbered from 0
            ev_offsets = ev_offsets[event_start:stop + 1]
        # the chunk's attribute entries: a host batch's slice starts at 0, a device batch is whole
        key_base = 0 if events_d is None else int(offsets[start])
        key_end = key_base + int(offsets[stop] - offsets[start])
        with self.phases("event keys"):
            if key_end > key_base:
                ev_key = event_keys(ev_value[key_base:key_end], ev_attr[key_base:key_end], self.string_attr_d,
                                    self.str_map_d, xp=xp)
            else:
                ev_key = xp.zeros(1, dtype=np.uint64)
        with self.phases("matching"):
            bits = xp.zeros((n_rows, -(-len(self.segment) // 64)), dtype=np.uint64)
            overflow = xp.zeros(n_rows, dtype=np.uint8)
            events = (ev_offsets, ev_attr, ev_value, ev_token, ev_key, np.int64(key_base), truth_d, list_d)
            self._launch(xp.arange(n_rows, dtype=np.int64), events, alive_d, self._dummy_i32, 0, overflow, bits,
                         min(self._blocks(), n_rows))
            if bool(overflow.any()):
                # the events whose frontier outgrew the shared queue, again with a spill region each
                again = xp.flatnonzero(overflow).astype(np.int64)
                n_blocks = min(self._spill_blocks(), int(again.shape[0]))
                spill = xp.empty(max(1, n_blocks * self.spill_cap), dtype=np.int32)
                overflow = xp.zeros(int(again.shape[0]), dtype=np.uint8)
                self._launch(again, events, alive_d, spill, self.spill_cap, overflow, bits, max(1, n_blocks))
                if bool(overflow.any()):
                    event = start + int(cuda_support.to_host(again)[int(xp.argmax(overflow))])
                    raise RuntimeError(f"BE-Tree on cuda: event {event} visits more c-nodes than the tree's bound "
                                       f"({self.spill_cap}); does it carry an attribute twice?")
                del spill, again
            del ev_key, overflow
        yield from self._compact(bits, n_rows, start, result_room, col_dtype)

    def _launch(self, item_event, events, alive_d, spill, spill_cap: int, overflow, bits, n_blocks: int) -> None:
        """One launch of the BE-Tree kernel over the events ``item_event``."""
        ev_offsets, ev_attr, ev_value, ev_token, ev_key, key_base, truth_d, list_d = events
        betree_kernel_cuda(n_blocks, self.threads, self.queue_capacity, np.int64(item_event.shape[0]), item_event,
                           ev_offsets, ev_attr, ev_value, ev_token, ev_key, key_base, truth_d, list_d, self.tree_d,
                           self.leaf_d, self.rows_d, alive_d, spill, np.int64(spill_cap), overflow, bits)

    def __repr__(self) -> str:
        return repr(self.host).replace("BETreeMatcher", type(self).__name__, 1)


__all__ = ["BETreeCudaMatcher"]
