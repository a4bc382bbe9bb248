"""``pstbloom`` and ``psthash`` (PS-Tree, Ji and Jacobsen, PVLDB 12(3) 2018) on the ``cuda`` backend
(docs/architecture.md#backends-and-kernels, docs/papers.md#ps-tree).

What runs where:

* **on the host**, exactly as on ``cpu``
  (:class:`~engine.algorithms.pstree.PSTBloomMatcher`,
  :class:`~engine.algorithms.pstree.PSTHashMatcher`): the units (a
  subscription's DNF within ``dnf_limit`` conjunctions; beyond it the
  Index's residual matcher takes the subscription, on cuda as on cpu), the
  predicate selectivity ranking (§3.3), the flat PS-Trees (§4), PSTBloom's
  subscription lists and signatures (§5.1), PSTHash's N-dim keys and hash
  table (§6.1).  A merge derives them there (the cpu matcher's own path:
  §4.4's space split and merge), a recode rebuilds them;
* **copied to the device once**, as their device twins
  (:mod:`gpu_kernels.pstree.layout`): the space table, the PSTBloom or
  PSTHash arrays, the units (subscription, CSR of predicate positions) and
  the extended predicate rows -- again only for the arrays a merge or a
  recode replaced (compared by identity: the host never changes an array
  in place);
* **per chunk of a match call**, on the device
  (:class:`~engine.algorithms.cuda_base.ChunkedCudaMatcher` sizes the
  chunks to the free device memory):

  1. every attribute entry's predicate space (Algorithm 3: a binary search
     over its attribute's boundaries, :func:`gpu_kernels.pstree.cuda.locate_spaces_cuda`);
  2. PSTHash only: the chunk's located spaces listed per event (CuPy: a
     mask, a prefix sum, a gather);
  3. the PSTBloom or PSTHash kernel (:mod:`gpu_kernels.pstree.cuda`), one
     block per event: list and signature probing, or the C(|E|, r) keys
     and hash probes, then the exact verification; result bits set in the
     chunk's bit matrix with an atomic OR;
  4. the bit matrix compacted into (event, position) pairs, ascending in
     both (:mod:`gpu_kernels.compaction`) -- the cpu matcher's exact output.

Device memory per call: per event of a chunk its bit row (``n_subs / 8``
bytes) and compaction counts and offsets (and 8 bytes for its located
spaces' offset on PSTHash); per attribute entry its space id (8 bytes on
PSTBloom; :data:`HASH_ITEM_BYTES` with PSTHash's listing of the located
spaces).  The structure itself is held for the matcher's life
(:attr:`device_nbytes`).
"""

from __future__ import annotations

import numpy as np

from engine.algorithms.cuda_base import HostStructureCudaMatcher, pattern_columns, token_attributes
from engine.algorithms.options import PSTBloomOptions, PSTHashOptions
from engine.algorithms.pstree import DEFAULT_LIMIT, PSTBloomMatcher, PSTHashMatcher
from engine.backend import resolve_backend
from gpu_kernels import cuda_support
from gpu_kernels.compaction import n_tiles_for
from gpu_kernels.pstree import layout
from gpu_kernels.pstree.cuda import locate_spaces_cuda, pstbloom_kernel_cuda, psthash_kernel_cuda

#: device bytes per attribute entry on PSTBloom: its space id (int64)
BLOOM_ITEM_BYTES = 8
#: ... on PSTHash: its space id, the located mask and its prefix sum, the
#: located spaces and the gather's index
HASH_ITEM_BYTES = 40
#: most resident blocks on a real GPU (grid-stride beyond)
MAX_BLOCKS = 8192
#: threads per block on a real GPU (the threads of a block share one event's
#: lists or key combinations) -- not measured yet
GPU_THREADS = 128


class _PSTreeCudaMatcher(HostStructureCudaMatcher):
    """What both PS-Tree matchers share on the device: the host matcher
    attached, its arrays' device twins, locating, chunk sizes."""

    #: device scratch bytes per attribute entry, and per event besides its bit row
    item_bytes: int
    _event_extra = 0

    @classmethod
    def construct(cls, segment, settings):
        return cls(segment, cls.backend, schema=settings.schema, dnf_limit=settings.dnf_limit,
                   **settings.options.keywords(cls.backend))

    @classmethod
    def build(cls, segment, settings):
        matcher = super().build(segment, settings)
        # the host matcher derives the merged and recoded structures (a rebuild with these settings; it
        # takes only the cpu options of them)
        matcher.host.settings = settings
        return matcher

    def _configure(self, launch, device_memory) -> None:
        """The device settings (``launch`` and ``device_memory`` checked by the options)."""
        self.backend = "cuda"
        self.launch = launch or cuda_support.default_launch()
        fixed = launch is not None or cuda_support.simulated()
        self.threads = self.launch.block[0] * self.launch.block[1] if fixed else GPU_THREADS
        self.device_memory = device_memory

    def _attach(self, host) -> None:
        """Serve ``host``'s structure (and its segment) from the device; the
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
        made from (compared by identity)."""
        host = self.host
        made = getattr(self, "_uploaded_from", {})
        units = host.units
        sources = {"spaces": tuple(host.spaces), "structure": tuple(host.structure), "rows": tuple(units.rows),
                   "units": host._unit_args()[:3]}
        same = {part: part in made and len(src) == len(made[part]) and all(a is b for a, b in zip(src, made[part]))
                for part, src in sources.items()}
        if not same["spaces"]:
            self.spaces_d = layout.to_device(host.spaces)
        if not same["structure"]:
            self.structure_d = layout.to_device(host.structure)
        if not same["rows"]:
            self.rows_d = layout.to_device(units.rows)
        if not same["units"]:
            dev = cuda_support.to_device
            self.units_d = tuple(dev(a, np.int64) for a in sources["units"])
        self.n_always = len(host.structure.always)
        self._uploaded_from = sources

    @property
    def device_nbytes(self) -> int:
        """Device bytes held: the twins of the space table, the PSTBloom or
        PSTHash arrays, the units and the predicate rows."""
        return layout.nbytes(self.spaces_d) + layout.nbytes(self.structure_d) + layout.nbytes(self.rows_d) + \
            sum(int(a.nbytes) for a in self.units_d)

    def statistics(self) -> dict:
        return self.host.statistics()

    def access_predicates(self) -> np.ndarray:
        return self.host.access_predicates()

    # ------------------------------------------------------------- chunking
    def _blocks(self, n_rows: int) -> int:
        return max(1, min(self.launch.max_grid[0], MAX_BLOCKS, n_rows))

    def _event_bytes(self) -> tuple[int, str]:
        n_words = -(-len(self.segment) // 64)
        n_tiles = n_tiles_for(n_words, self.launch, bits=True)
        return 8 * n_words + 16 * n_tiles + self._event_extra, \
            f"a result bit row of {8 * n_words} bytes, {16 * n_tiles} for compaction"

    def _item_bytes(self) -> int:
        return self.item_bytes

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
        base = 0 if events_d is None else int(offsets[start])
        n_entries = int(offsets[stop] - offsets[start])
        with self.phases("locating"):
            ev_space = xp.empty(max(n_entries, 1), dtype=np.int64)
            locate_spaces_cuda(n_entries, base, ev_attr, ev_value, self.spaces_d, ev_space, launch=self.launch)
        with self.phases("matching"):
            bits = xp.zeros((n_rows, -(-len(self.segment) // 64)), dtype=np.uint64)
            self._run((ev_offsets, ev_attr, ev_value, ev_token), ev_space, base, n_entries, n_rows, truth_d,
                      list_d, alive_d, bits)
            del ev_space
        yield from self._compact(bits, n_rows, start, result_room, col_dtype)

    def _run(self, events, ev_space, base: int, n_entries: int, n_rows: int, truth_d, list_d, alive_d,
             bits) -> None:
        raise NotImplementedError

    def __repr__(self) -> str:
        return repr(self.host).replace(type(self.host).__name__, type(self).__name__, 1)


class PSTBloomCudaMatcher(_PSTreeCudaMatcher):
    """PSTBloom on the device (see the module docstring).  Takes the options
    of :class:`~engine.algorithms.pstree.PSTBloomMatcher` (``bloom_bits``,
    ``bloom_hashes``, ``event_log``; ``schema`` and ``dnf_limit`` from the
    Index) plus ``launch`` (a
    :class:`~gpu_kernels.cuda_support.LaunchConfig`: its ``max_grid[0]``
    caps the blocks, and -- given, or the simulator's -- its block's thread
    count is the kernel's block; else :data:`GPU_THREADS`) and
    ``device_memory`` (bytes one match call may use)."""

    name = "pstbloom"
    item_bytes = BLOOM_ITEM_BYTES

    def __init__(self, segment, backend: str = "cuda", *, schema=None, dnf_limit: int = DEFAULT_LIMIT,
                 bloom_bits: int = 8, bloom_hashes: int = 3, event_log=None, launch=None,
                 device_memory: int | None = None):
        if backend != "cuda":
            raise ValueError(f"PSTBloomCudaMatcher runs on backend 'cuda', not {backend!r}")
        resolve_backend("cuda")    # BackendUnavailable naming what is missing
        PSTBloomOptions(bloom_bits=bloom_bits, bloom_hashes=bloom_hashes, event_log=event_log, launch=launch,
                        device_memory=device_memory)
        self._configure(launch, device_memory)
        self._attach(PSTBloomMatcher(segment, "cpu", schema=schema, dnf_limit=dnf_limit, bloom_bits=bloom_bits,
                                     bloom_hashes=bloom_hashes, event_log=event_log))

    def _run(self, events, ev_space, base, n_entries, n_rows, truth_d, list_d, alive_d, bits) -> None:
        unit_sub, unit_off, pids = self.units_d
        pstbloom_kernel_cuda(self._blocks(n_rows), self.threads, np.int64(n_rows), *events, ev_space,
                             np.int64(base), truth_d, list_d, unit_sub, unit_off, pids, self.rows_d, self.structure_d,
                             np.int64(self.host.bloom_hashes), np.int64(self.n_always), alive_d, bits)


class PSTHashCudaMatcher(_PSTreeCudaMatcher):
    """PSTHash on the device (see the module docstring).  Takes the options
    of :class:`~engine.algorithms.pstree.PSTHashMatcher` (``n_access``,
    ``max_combinations``, ``event_log``; ``schema`` and ``dnf_limit`` from
    the Index) plus ``launch`` and ``device_memory`` (as
    :class:`PSTBloomCudaMatcher`)."""

    name = "psthash"
    item_bytes = HASH_ITEM_BYTES
    _event_extra = 8

    def __init__(self, segment, backend: str = "cuda", *, schema=None, dnf_limit: int = DEFAULT_LIMIT,
                 n_access: int = 2, max_combinations: int = 256, event_log=None, launch=None,
                 device_memory: int | None = None):
        if backend != "cuda":
            raise ValueError(f"PSTHashCudaMatcher runs on backend 'cuda', not {backend!r}")
        resolve_backend("cuda")
        PSTHashOptions(n_access=n_access, max_combinations=max_combinations, event_log=event_log, launch=launch,
                       device_memory=device_memory)
        self._configure(launch, device_memory)
        self._attach(PSTHashMatcher(segment, "cpu", schema=schema, dnf_limit=dnf_limit, n_access=n_access,
                                    max_combinations=max_combinations, event_log=event_log))

    def _run(self, events, ev_space, base, n_entries, n_rows, truth_d, list_d, alive_d, bits) -> None:
        xp = cuda_support.array_module()
        ev_offsets = events[0]
        # each event's located spaces, ascending (entries ascend by attribute, global space ids with it):
        # loc[loc_off[e]:loc_off[e + 1]] -- what the kernel's combinations index
        spaces = ev_space[:n_entries]
        located = spaces >= 0
        before = xp.zeros(n_entries + 1, dtype=np.int64)
        before[1:] = xp.cumsum(located)
        loc_off = before[ev_offsets[:n_rows + 1] - base]
        loc = spaces[xp.flatnonzero(located)]
        if loc.shape[0] == 0:
            loc = xp.full(1, -1, dtype=np.int64)      # (no null pointer; never read)
        del located, before
        unit_sub, unit_off, pids = self.units_d
        psthash_kernel_cuda(self._blocks(n_rows), self.threads, np.int64(n_rows), *events, loc_off, loc, truth_d,
                            list_d, unit_sub, unit_off, pids, self.rows_d, self.structure_d, np.int64(self.n_always),
                            alive_d, bits)


__all__ = ["PSTBloomCudaMatcher", "PSTHashCudaMatcher"]
