"""``atree`` on the ``cuda`` backend (docs/architecture.md#backends-and-kernels, docs/papers.md#a-tree).

The A-Tree is built and updated on the host, exactly as on ``cpu``
(:class:`~engine.algorithms.atree.ATreeMatcher`: the DAG of unique nodes,
§4, with reorganisation, self-adjustment and use counts, and its
level-ordered flat form), and its arrays are copied to the device once as
their device twins: the flattened DAG
(:class:`~gpu_kernels.atree.layout.ATreeArrays`), its leaves' predicate
index (:class:`~gpu_kernels.atree.layout.LeafIndex`) and the segment's
predicate table.  Each is copied again only when the host's arrays change:
a merge derives a new DAG (Algorithms 4 and 5 on a copy) and flattens it
again; a grown string dictionary recodes the predicates and so the leaf
index's keys (the DAG, keyed by predicate keys, stays).  A saved index rebuilds the DAG on load, as on
``cpu``.  Each match call walks the batch in chunks sized to the free
device memory (:class:`~engine.algorithms.cuda_base.ChunkedCudaMatcher`);
per chunk, on the device (:mod:`gpu_kernels.atree.cuda`):

1. predicate matching, as on ``cpu``: the keyed l-nodes of the events'
   attributes located TRUE in the leaf index by binary search (the others
   left untouched), the rest of their l-nodes and those of the absent
   list evaluated with the shared device predicate evaluator;
2. expression matching, level by level (Algorithm 6), zero suppression and
   propagation on demand exact under three-valued logic as on ``cpu`` --
   one launch per level (``kernel="levels"``, the default) or one launch
   with a block per event walking the levels (``kernel="persistent"``);
   TRUE r-nodes set their subscriptions' bits of the chunk's bit matrix;
3. the bit matrix compacted into (event, position) pairs, ascending in both
   (:mod:`gpu_kernels.compaction`) -- the CPU matcher's exact output.

Device memory held: the flattened DAG (about 30 bytes per node, 8 per link
and 4 per subscription; not its leaves by attribute, which the kernels
read through the leaf index), the leaf index (about 29 bytes per key, 4
per scanned leaf) and the predicate table.  Per call, per event of a
chunk: its node results (one byte per node, filled with NULL per chunk),
its queued bits (``nodes / 8`` bytes), its result bit row (``n_subs / 8``
bytes) and compaction counts and offsets; nothing per attribute entry
beyond the entry itself.  The node rows are dense, where the cpu kernel
reuses stamped per-task scratch: a chunk's events all run at once, each
with its own row, started by one fill instead of a stamp check at every
access (not measured against an alternative).
"""

from __future__ import annotations

import numpy as np

from engine.algorithms.atree import ATreeMatcher
from engine.algorithms.cuda_base import HostStructureCudaMatcher, pattern_columns, token_attributes
from engine.algorithms.options import ATreeOptions
from engine.backend import resolve_backend
from gpu_kernels import cuda_support
from gpu_kernels.atree import cuda as K
from gpu_kernels.atree.layout import ATreeArrays, LeafIndex
from gpu_kernels.compaction import n_tiles_for
from gpu_kernels.opcodes import NULL

#: the dtypes of the device twins of :class:`~gpu_kernels.atree.layout.ATreeArrays` (what the kernels read)
TREE_DTYPES = {"kind": np.int8, "level": np.int32, "level_start": np.int64, "child_off": np.int64,
               "child_idx": np.int32, "par_off": np.int64, "par_idx": np.int32, "needs3": np.uint8,
               "leaf_pred": np.int32, "attr_off": np.int64, "attr_leaf": np.int32, "absent_leaf": np.int32,
               "sub_off": np.int64, "sub_pos": np.int32}
#: the dtypes of the device twin of :class:`~gpu_kernels.atree.layout.LeafIndex` (the leaves' predicate index)
INDEX_DTYPES = {"scan_off": np.int64, "scan_leaf": np.int32, "key_off": np.int64, "key": np.float64,
                "key_hi": np.float64, "key_reach": np.float64, "key_leaf": np.int32, "key_quiet": np.uint8}
#: fields of ATreeArrays the kernels do not read: not copied (an empty twin stands in)
HOST_ONLY = ("level", "attr_off", "attr_leaf")
#: the predicate table's columns the kernels read, in their argument order, and their dtypes
PRED_DTYPES = (("attr", np.int32), ("op", np.int8), ("lo", np.float64), ("hi", np.float64),
               ("set_offsets", np.int64), ("set_values", np.float64), ("aux", np.int64))
#: most resident blocks of the persistent kernel on a real GPU (grid-stride beyond)
MAX_BLOCKS = 8192
#: threads per block of the persistent kernel on a real GPU -- not measured yet
GPU_THREADS = 128


class ATreeCudaMatcher(HostStructureCudaMatcher):
    """A-Tree on the device (see the module docstring).

    Takes the options of :class:`~engine.algorithms.atree.ATreeMatcher`
    (``sharing``, ``reorganize``, ``self_adjust`` and the ablations
    ``binary``, ``zero_suppression``, ``on_demand``, which shape the host's
    DAG and links only: the kernels read whatever links and exactness flags
    the host flattened; ``schema`` from the Index) plus ``kernel`` (``"levels"`` or ``"persistent"``, see
    :mod:`gpu_kernels.atree.cuda`), ``launch`` (a
    :class:`~gpu_kernels.cuda_support.LaunchConfig`: the 2-D grids of the
    ``levels`` kernels; for ``persistent`` its ``max_grid[0]`` caps the
    blocks and -- given, or the simulator's -- its block's thread count is
    the block, else :data:`GPU_THREADS`) and ``device_memory`` (bytes one
    match call may use)."""

    name = "atree"

    @classmethod
    def construct(cls, segment, settings) -> "ATreeCudaMatcher":
        return cls(segment, cls.backend, schema=settings.schema, **settings.options.keywords(cls.backend))

    def __init__(self, segment, backend: str = "cuda", *, schema=None, sharing: bool = True, reorganize: bool = True,
                 self_adjust: bool = True, binary: bool = False, zero_suppression: bool = True,
                 on_demand: bool = True, kernel: str = "levels", launch=None, device_memory: int | None = None):
        if backend != "cuda":
            raise ValueError(f"ATreeCudaMatcher runs on backend 'cuda', not {backend!r}")
        resolve_backend("cuda")    # BackendUnavailable naming what is missing
        ATreeOptions(sharing=sharing, reorganize=reorganize, self_adjust=self_adjust, binary=binary,
                     zero_suppression=zero_suppression, on_demand=on_demand, kernel=kernel, launch=launch,
                     device_memory=device_memory)
        self._configure(kernel, launch, device_memory)
        self._attach(ATreeMatcher(segment, "cpu", schema=schema, sharing=sharing, reorganize=reorganize,
                                  self_adjust=self_adjust, binary=binary, zero_suppression=zero_suppression,
                                  on_demand=on_demand))

    @classmethod
    def from_arrays(cls, segment, settings, meta: dict, arrays: dict) -> "ATreeCudaMatcher":
        """The host DAG restored (:meth:`ATreeMatcher.from_arrays
        <engine.algorithms.atree.ATreeMatcher.from_arrays>`: every array
        checked, ValueError otherwise), then copied to the device."""
        resolve_backend("cuda")
        options = settings.options.keywords(cls.backend)
        matcher = cls.__new__(cls)
        matcher._configure(options["kernel"], options["launch"], options["device_memory"])
        matcher._attach(ATreeMatcher.from_arrays(segment, settings, meta, arrays))
        return matcher

    def _configure(self, kernel: str, launch, device_memory) -> None:
        """The device settings (checked by ATreeOptions)."""
        self.backend = "cuda"
        self.kernel = kernel
        self.launch = launch or cuda_support.default_launch()
        fixed = launch is not None or cuda_support.simulated()
        self.threads = self.launch.block[0] * self.launch.block[1] if fixed else GPU_THREADS
        self.device_memory = device_memory

    def _attach(self, host: ATreeMatcher) -> None:
        """Serve ``host``'s DAG (and its segment) from the device; the device
        twins this matcher already holds are kept where the host's arrays
        are the same."""
        self.host = host
        self.segment = host.segment
        self._n_patterns = pattern_columns(host.segment)
        self._token_attrs = token_attributes(host.segment)
        self._refresh()

    # ------------------------------------------------------------ device copy
    def _refresh(self) -> None:
        """Copy over what differs from the host arrays the device twins were
        made from: compared by identity first (the host never changes an
        array in place), then by content -- a recode flattens the same DAG
        again into equal arrays, which need no new copy."""
        host = self.host
        made = getattr(self, "_uploaded_from", None)
        preds = host.segment.predicates
        sources = {"tree": tuple(host.arrays), "index": tuple(host.leaf_index),
                   "preds": tuple(getattr(preds, name) for name, _ in PRED_DTYPES)}

        def same(part):
            if made is None:
                return False
            return all(a is b or (a.dtype == b.dtype and np.array_equal(a, b))
                       for a, b in zip(sources[part], made[part]))

        if not same("tree"):
            a = host.arrays
            # (``level`` stays on the host: the kernels find a node's level by its id range, ``level_start``;
            # the leaves by attribute too: the kernels read them through the leaf index)
            self.tree_d = ATreeArrays(*(cuda_support.to_device(getattr(a, f) if f not in HOST_ONLY
                                                               else getattr(a, f)[:0], TREE_DTYPES[f])
                                        for f in ATreeArrays._fields))
            self.level_start = np.asarray(a.level_start, np.int64)
        if not same("index"):
            # keyed by the coded bounds: a recode builds it again over the same DAG
            x = host.leaf_index
            self.index_d = LeafIndex(*(cuda_support.to_device(getattr(x, f), INDEX_DTYPES[f])
                                       for f in LeafIndex._fields))
            # x of the l-node launch: the most leaves one attribute's scan list, one key group (a run of
            # TRUE keys is at most that) or the absent list has
            self.leaf_width = int(max(int(np.diff(x.scan_off).max(initial=0)), int(np.diff(x.key_off).max(initial=0)),
                                      len(host.arrays.absent_leaf), 1))
        if not same("preds"):
            self.preds_d = tuple(cuda_support.to_device(x, dtype) for x, (_, dtype) in zip(sources["preds"],
                                                                                            PRED_DTYPES))
        self._uploaded_from = sources

    @property
    def device_nbytes(self) -> int:
        """Device bytes held: the twins of the flattened DAG, its leaf index and the predicate table."""
        return sum(int(x.nbytes) for part in (self.tree_d, self.index_d, self.preds_d) for x in part)

    def statistics(self) -> dict:
        """The host DAG's shape and sharing (:meth:`ATreeMatcher.statistics
        <engine.algorithms.atree.ATreeMatcher.statistics>`)."""
        return self.host.statistics()

    # ------------------------------------------------------------- chunking
    def _event_bytes(self) -> tuple[int, str]:
        n_nodes = len(self.host.arrays.kind)
        n_words = -(-len(self.segment) // 64)
        n_tiles = n_tiles_for(n_words, self.launch, bits=True)
        node_bytes = n_nodes + 8 * -(-n_nodes // 64)
        return node_bytes + 8 * n_words + 16 * n_tiles, \
            f"{node_bytes} bytes of node results and queued bits, a result bit row of {8 * n_words} bytes, " \
            f"{16 * n_tiles} for compaction"

    # -------------------------------------------------------------- matching
    def _match_chunk(self, batch, events_d, offsets, start: int, stop: int, truth_d, list_d, alive_d,
                     result_room: int, col_dtype=np.int64):
        xp = cuda_support.array_module()
        n_rows = stop - start
        ev_offsets, ev_attr, ev_value, ev_token, event_start = self._chunk_events(batch, events_d, offsets,
                                                                                  start, stop)
        if event_start:      # a device batch in place: this chunk's offsets, events renumbered from 0
            ev_offsets = ev_offsets[event_start:stop + 1]
        n_nodes = len(self.host.arrays.kind)
        with self.phases("matching"):
            # NULL is what an untouched node means to an exact reader (and "not TRUE" to any other)
            val = xp.full((n_rows, n_nodes), NULL, dtype=np.int8)
            queued = xp.zeros((n_rows, -(-n_nodes // 64)), dtype=np.uint64)
            bits = xp.zeros((n_rows, -(-len(self.segment) // 64)), dtype=np.uint64)
            blocks = max(1, min(self.launch.max_grid[0], MAX_BLOCKS, n_rows))
            K.match_chunk_cuda(self.kernel, self.launch, self.threads, blocks, n_rows,
                               (ev_offsets, ev_attr, ev_value, ev_token, truth_d, list_d), self.tree_d, self.index_d,
                               self.level_start, self.leaf_width, self.preds_d, alive_d, val, queued, bits)
            del val, queued, ev_offsets, ev_attr, ev_value, ev_token
        yield from self._compact(bits, n_rows, start, result_room, col_dtype)

    def __repr__(self) -> str:
        return repr(self.host).replace("ATreeMatcher", type(self).__name__, 1)


__all__ = ["ATreeCudaMatcher"]
