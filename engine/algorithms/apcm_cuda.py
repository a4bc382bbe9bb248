"""``apcm`` on the ``cuda`` backend (docs/architecture.md#backends-and-kernels, docs/papers.md#a-pcm).

The index is built on the host exactly as on ``cpu``
(:class:`~engine.algorithms.apcm.APCMMatcher`: the BE-Tree of units, its node
table, the A-PCM leaf arrays and the bitmap layout) -- or restored from a
saved index (:meth:`APCMCudaMatcher.from_arrays`) -- and its arrays are
copied to the device once: the walked structure
(:class:`~gpu_kernels.apcm.cuda.DeviceIndex`), the layout
(:class:`~gpu_kernels.apcm.cuda.DeviceBitmap`: bits per attribute,
precomputed tables) and the extended predicate rows.  Each is copied again
only when the host matcher's array changes (a merge, a recode).  Each match
call walks the batch in chunks sized to the device memory budget
(:class:`~engine.algorithms.cuda_base.ChunkedCudaMatcher`); per chunk:

1. on the host, the entries' 64-bit keys, the clusters of the matcher's
   variant (online stream re-ordering, :mod:`engine.algorithms.osr`, with
   its adaptive cluster size; per event for ``bitmap`` and ``parallel``;
   arrival runs without ``reorder``);
2. on the device (:mod:`gpu_kernels.apcm.cuda`): the clusters' bookkeeping
   by CuPy's sorts and cumulative sums
   (:func:`gpu_kernels.apcm.cuda.cluster_entries`), the bitmap encoding (one
   thread per entry; the store's offsets by a cumulative sum), the
   compressed events' ORs (one thread per word), and the traversal with its
   leaf scans (one block per cluster), bits of the chunk's result bit
   matrix; the clusters whose frontier overflowed the shared queue run
   again with a spill region in global memory (only for a tree with more
   c-nodes than the queue holds);
3. the bit matrix compacted into (event, position) pairs, ascending in both
   (:mod:`gpu_kernels.compaction`) -- the CPU matcher's exact output.

Every variant runs the same kernels: the variants differ in the clustering
(``unroll=False`` and ``parallel_paths`` shape the CPU's work split only).

Device memory per call: per event of a chunk its bit row (``n_subs / 8``
bytes), compaction counts and offsets, and :data:`EVENT_BYTES` of cluster
lists and flags; per attribute entry :data:`ENTRY_BYTES` (its key, slice
pointers, compressed-entry and OR-job arrays, the glue's temporaries) and
room for its evaluated slices and its share of its cluster's ORs (twice the
widest attribute's main and overflow words); and, for a tree with more
c-nodes than the shared queue holds, the spill regions of the second pass's
blocks (4 bytes per c-node, per block).
"""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np

from engine.algorithms.apcm import APCMMatcher
from engine.algorithms.betree import DEFAULT_LIMIT
from engine.algorithms.cuda_base import HostStructureCudaMatcher, pattern_columns, token_attributes
from engine.algorithms.options import DEFAULT_MAX_CAP, DEFAULT_MIN_SIZE, APCMOptions
from engine.backend import device_memory_budget, resolve_backend
from gpu_kernels import cuda_support
from gpu_kernels.apcm import cuda as K
from gpu_kernels.apcm.layout import words
from gpu_kernels.betree import layout as betree_layout
from gpu_kernels.betree.layout import event_keys
from gpu_kernels.compaction import n_tiles_for

#: device bytes per attribute entry besides the entry itself and its slices' words: its key (8), slice
#: pointers (16), store offset and the glue's temporaries (32), at most one compressed entry (attribute,
#: flag, key and member offsets, key, source, OR places, pointers, member: 101) and two OR jobs (34) --
#: and, while the clusters' bookkeeping makes those, its temporaries (positions, members, entries,
#: clusters, attributes, keys, sort order and the sort's scratch, flags: under 96; freed before the
#: store is made)
ENTRY_BYTES = 288
#: device bytes per event of a chunk besides its bit row and compaction: its place in the cluster
#: permutation, cluster offsets and work list (int64 each) and an overflow flag
EVENT_BYTES = 32
#: most resident blocks on a real GPU (grid-stride beyond)
MAX_BLOCKS = 8192
#: threads per block on a real GPU -- not measured yet
GPU_THREADS = 128
#: most blocks of the second pass (clusters whose frontier overflowed the shared queue)
SPILL_BLOCKS = 64
#: share of the device memory budget the second pass's spill regions may take
SPILL_SHARE = 4


class APCMCudaMatcher(HostStructureCudaMatcher):
    """A-PCM on the device (see the module docstring).

    Takes the options of :class:`~engine.algorithms.apcm.APCMMatcher` (the
    variant, re-ordering and cluster parameters, ``max_cap``, ``min_size``;
    ``schema`` and ``dnf_limit`` from the Index) plus ``launch`` (a
    :class:`~gpu_kernels.cuda_support.LaunchConfig`: ``max_grid[0]`` caps
    the blocks, and -- given, or the simulator's -- its block's thread
    count is every kernel's block; else :data:`GPU_THREADS`),
    ``device_memory`` (bytes one match call may use) and, for tests and
    tuning, ``queue_capacity`` (entries of the shared frontier queue)."""

    name = "apcm"

    @classmethod
    def construct(cls, segment, settings) -> "APCMCudaMatcher":
        return cls(segment, cls.backend, schema=settings.schema, dnf_limit=settings.dnf_limit,
                   **settings.options.keywords(cls.backend))

    def __init__(self, segment, backend: str = "cuda", *, schema=None, dnf_limit: int = DEFAULT_LIMIT,
                 variant: str = "apcm", reorder: bool = True, unroll: bool = True, parallel_paths: bool = True,
                 batch_size: int = 1024, cluster_size: int = 8, threshold: int = 2, adaptive: bool = True,
                 max_cap: int = DEFAULT_MAX_CAP, min_size: int = DEFAULT_MIN_SIZE, launch=None,
                 device_memory: int | None = None, queue_capacity: int = K.QUEUE_CAPACITY):
        if backend != "cuda":
            raise ValueError(f"APCMCudaMatcher runs on backend 'cuda', not {backend!r}")
        resolve_backend("cuda")    # BackendUnavailable naming what is missing
        host_options = dict(variant=variant, reorder=reorder, unroll=unroll, parallel_paths=parallel_paths,
                            batch_size=batch_size, cluster_size=cluster_size, threshold=threshold,
                            adaptive=adaptive, max_cap=max_cap, min_size=min_size)
        APCMOptions(**host_options, launch=launch, device_memory=device_memory)
        self._configure(launch, device_memory, queue_capacity)
        self._attach(APCMMatcher(segment, "cpu", schema=schema, dnf_limit=dnf_limit, **host_options))

    @classmethod
    def from_arrays(cls, segment, settings, meta: dict, arrays: dict) -> "APCMCudaMatcher":
        """The host matcher restored (:meth:`APCMMatcher.from_arrays
        <engine.algorithms.apcm.APCMMatcher.from_arrays>`: every array
        checked, ValueError otherwise), then copied to the device."""
        resolve_backend("cuda")
        host = APCMMatcher.from_arrays(segment, settings, meta, arrays)
        options = settings.options.keywords(cls.backend)
        matcher = cls.__new__(cls)
        matcher._configure(options["launch"], options["device_memory"], K.QUEUE_CAPACITY)
        matcher._attach(host)
        matcher.settings = settings
        return matcher

    def _configure(self, launch, device_memory, queue_capacity) -> None:
        """The device settings (``launch`` and ``device_memory`` checked by APCMOptions)."""
        self.backend = "cuda"
        self.launch = launch or cuda_support.default_launch()
        fixed = launch is not None or cuda_support.simulated()
        self.threads = self.launch.block[0] * self.launch.block[1] if fixed else GPU_THREADS
        if isinstance(queue_capacity, (bool, np.bool_)) or not isinstance(queue_capacity, (int, np.integer)):
            raise ValueError(f"queue_capacity must be an integer (c-nodes of the shared frontier queue), not "
                             f"{queue_capacity!r}")
        K.check_match_geometry(self.threads, int(queue_capacity))
        self.device_memory = device_memory
        self.queue_capacity = int(queue_capacity)
        self.last_clusters = None
        #: (clusters, compressed events) of the last match call, all its chunks together
        self.call_clusters = None

    def _attach(self, host: APCMMatcher) -> None:
        """Serve ``host``'s index (and its segment) from the device; the
        device twins this matcher already holds are kept where the host's
        arrays are the same."""
        self.host = host
        self.segment = host.segment
        self.options = host.options
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
        rows = host.tree.units.rows
        table = host.tree.table
        sources = {"index": (table.node, table.p_top, host.tree.tree.p_attr, host.l_head, host.v_attr, host.v_slot),
                   "layout": tuple(host.layout), "rows": tuple(rows)}
        same = {part: part in made and len(src) == len(made[part]) and all(a is b for a, b in zip(src, made[part]))
                for part, src in sources.items()}
        if not same["index"]:
            self.index_d = betree_layout.to_device(K.device_index(*sources["index"]))
            n_c = len(table.node)
            # a cluster visits each c-node once: its frontier never holds more than the tree's c-nodes
            self.spill_cap = n_c if n_c > self.queue_capacity else 0
        if not same["layout"]:
            lay = host.layout
            self.bitmap_d = betree_layout.to_device(K.device_bitmap(lay))
            # an entry's evaluated slices and its share of its cluster's ORs: at most twice its attribute's
            # main and overflow words
            widest = int((words(lay.main_bits) + words(lay.over_bits)).max(initial=0))
            self._slice_bytes = 16 * widest
        if not same["rows"]:
            self.rows_d = betree_layout.to_device(rows)
        self._uploaded_from = sources

    @property
    def device_nbytes(self) -> int:
        """Device bytes held: the twins of the walked structure, the layout and the predicate rows."""
        return betree_layout.nbytes(self.index_d) + betree_layout.nbytes(self.bitmap_d) + \
            betree_layout.nbytes(self.rows_d)

    def statistics(self) -> dict:
        """The host matcher's statistics, with the clusters of this matcher's
        last match (every chunk of it: a batch is matched in several)."""
        stats = self.host.statistics()
        if self.call_clusters is not None:
            stats.update(clusters=self.call_clusters[0], compressed_events=self.call_clusters[1],
                         cluster_capacity=self.host.reorderer.capacity)
        return stats

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
        return 8 * n_words + 16 * n_tiles + EVENT_BYTES, \
            f"a result bit row of {8 * n_words} bytes, {16 * n_tiles} for compaction"

    def _item_bytes(self) -> int:
        return ENTRY_BYTES + self._slice_bytes

    # -------------------------------------------------------------- matching
    def _match_chunk(self, batch, events_d, offsets, start: int, stop: int, truth_d, list_d, alive_d,
                     result_room: int, col_dtype=np.int64):
        xp = cuda_support.array_module()
        host = self.host
        n_rows = stop - start
        a, b = int(offsets[start]), int(offsets[stop])
        ev_offsets = (offsets[start:stop + 1] - a).astype(np.int64)
        with self.phases("events-in"):
            if events_d is None:
                ev_attr, ev_value = batch.attr[a:b], batch.value[a:b]
                ev_offsets_d, ev_attr_d, ev_value_d, ev_token_d, _ = self._chunk_events(batch, None, offsets, start,
                                                                                        stop)
            else:       # a device batch: the chunk's slices in place (attributes and values read back for OSR)
                ev_offsets_d = cuda_support.to_device(ev_offsets)
                ev_attr_d, ev_value_d, ev_token_d = (x[a:b] for x in events_d[1:])
                ev_attr, ev_value = cuda_support.to_host(ev_attr_d), cuda_support.to_host(ev_value_d)
        with self.phases("clustering"):
            # the keys, the variant's clusters and their compressed entries: the host's (sequential, cheap)
            t = host.tree
            ev_key = event_keys(np.asarray(ev_value, np.float64), np.asarray(ev_attr), t.string_attr, t.str_map)
            clusters = host.clusters(SimpleNamespace(n_events=n_rows, offsets=ev_offsets, attr=ev_attr), ev_key)
            self.last_clusters = clusters
            before = (0, 0) if start == 0 else self.call_clusters
            self.call_clusters = (before[0] + clusters.n_clusters, before[1] + clusters.compressed_events())
            lay = host.layout
            bm = self.bitmap_d
            dev = cuda_support.to_device
            cl_off_d, perm_d = dev(clusters.off), dev(clusters.perm)
            # (on the device: the clusters, the keys and the layout's bits in, the compressed entries out)
            ent = K.cluster_entries(cl_off_d, perm_d, ev_offsets_d, ev_attr_d, dev(ev_key), bm.main_bits,
                                    bm.over_bits)
            n_ce = int(ent.ce_off[-1])
            n_or_words = int(ent.job_word_off[-1])
            ce_d = ent._asdict()
        threads, blocks = self.threads, self._blocks()
        with self.phases("encoding"):
            n_ent = b - a
            e_main = xp.empty(max(n_ent, 1), dtype=np.int64)
            e_over = xp.empty(max(n_ent, 1), dtype=np.int64)
            # each entry's evaluated words (its main slice unless tabled, its overflow slice), then their offsets
            n_attrs = int(lay.n_attrs)
            if n_ent:
                attr = ev_attr_d.astype(np.int64)
                known = attr < n_attrs
                at = xp.where(known, attr, 0)
                entry_words = xp.where(known, xp.where(bm.tab_off[at] < 0, (bm.main_bits[at] + 63) >> 6, 0)
                                       + ((bm.over_bits[at] + 63) >> 6), 0)
                store_at = cuda_support.exclusive_cumsum(entry_words)
                n_entry_words = int(store_at[-1])
                del attr, known, at, entry_words
            else:
                store_at = xp.zeros(1, dtype=np.int64)
                n_entry_words = 0
            store = xp.zeros(max(1, n_entry_words + n_or_words), dtype=np.uint64)
            if n_ent:       # (a chunk without entries has arrays of one padding element: not an entry)
                K.encode_entries_cuda(threads, blocks, ev_attr_d, ev_value_d, ev_token_d, store_at, bm,
                                      self.rows_d, truth_d, list_d, e_main, e_over, store)
        with self.phases("compression"):
            K.or_slices_cuda(threads, blocks, n_or_words, n_entry_words, ce_d["job_word_off"], ce_d["job_ce"],
                             ce_d["job_kind"], ce_d["mem_off"], ce_d["mem_k"], e_main, e_over, bm.table, store)
            # the compressed entries' slices: a singleton's are its entry's, a cluster's its ORs
            if n_ce:
                src = ent.ce_src
                has = src >= 0
                from_src = xp.maximum(src, 0)
                ors = ent.ce_or
                pointers = []
                for kind, e_ptr in enumerate((e_main, e_over)):
                    rel = ors[:, kind]
                    pointers.append(xp.where(has, e_ptr[from_src],
                                             xp.where(rel >= 0, -2 - (n_entry_words + rel), K.NO_SLICE)))
                ce_main, ce_over = (xp.ascontiguousarray(p) for p in pointers)
                del src, has, from_src, ors, pointers
            else:
                ce_main = ce_over = xp.full(1, K.NO_SLICE, dtype=np.int64)
        with self.phases("matching"):
            n_cl = clusters.n_clusters
            bits = xp.zeros((n_rows, -(-len(self.segment) // 64)), dtype=np.uint64)
            overflow = xp.zeros(n_cl, dtype=np.uint8)
            common = (cl_off_d, perm_d, ev_offsets_d, ev_attr_d, e_main, e_over, ce_d["ce_off"], ce_d["ce_attr"],
                      ce_main, ce_over, ce_d["ce_absent"], ce_d["ce_key_off"], ce_d["ce_keys"], self.index_d,
                      bm.table, store, alive_d)
            K.match_clusters_cuda(min(blocks, n_cl), threads, self.queue_capacity, np.int64(n_cl),
                                  xp.arange(n_cl, dtype=np.int64), *common, self._dummy_spill(), np.int64(0),
                                  overflow, bits)
            if bool(overflow.any()):
                # the clusters whose frontier outgrew the shared queue, again with a spill region each
                again = xp.flatnonzero(overflow).astype(np.int64)
                n_blocks = min(self._spill_blocks(), int(again.shape[0]))
                spill = xp.empty(max(1, n_blocks * self.spill_cap), dtype=np.int32)
                overflow = xp.zeros(int(again.shape[0]), dtype=np.uint8)
                K.match_clusters_cuda(max(1, n_blocks), threads, self.queue_capacity, np.int64(again.shape[0]),
                                      again, *common, spill, np.int64(self.spill_cap), overflow, bits)
                if bool(overflow.any()):      # cannot happen: each c-node is pushed once per cluster
                    raise RuntimeError(f"A-PCM on cuda: a cluster visited more than the tree's {self.spill_cap} "
                                       f"c-nodes")
                del spill, again
            del store, e_main, e_over, ce_main, ce_over, overflow, ce_d
        yield from self._compact(bits, n_rows, start, result_room, col_dtype)

    def _dummy_spill(self):
        spill = getattr(self, "_spill_none", None)
        if spill is None:
            spill = self._spill_none = cuda_support.to_device(np.zeros(1, np.int32))
        return spill

    def __repr__(self) -> str:
        return repr(self.host).replace("APCMMatcher", type(self).__name__, 1)


__all__ = ["APCMCudaMatcher"]
