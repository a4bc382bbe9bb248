"""``scan`` on the ``cuda`` backend (docs/architecture.md#backends-and-kernels, docs/papers.md#scan-the-baseline).

The compiled segment is copied to the device once (:class:`DeviceSegment`;
the predicate codes again only when a grown string dictionary recodes them).
Each match call copies the batch's pattern and list tables and ``alive`` flags over,
then walks the events in *chunks* sized to the free device memory: per
chunk the CUDA scan kernel fills a dense hit matrix (chunk × subscriptions,
one byte a cell), the count kernel and an exclusive scan give every
(event, tile of subscriptions) its output slice, and the fill kernel writes
the (event index, subscription position) pairs, ascending in both -- the
CPU matcher's exact output.  Host event batches are sliced per chunk (only
a chunk's events are on the device at a time); batches already on the
device are used in place.  Results wanted as NumPy come back through
:mod:`gpu_kernels.transfer`: int32 positions through pinned staging, the
event column rebuilt from per-event counts, subscription ids mapped on the
way when the caller passes them.

Memory: a chunk of ``r`` events over ``S`` subscriptions needs
``r * (S + 16 * tiles + 8) + 16 * entries`` bytes of scratch (hit rows,
tile counts and offsets, the chunk's event offsets and its attribute
entries), and ``16 * S`` more are always kept free for the results of one
event (16 bytes a pair).  A batch with an event that cannot fit even alone
raises :class:`~engine.backend.DeviceMemoryError` before any work.

The chunk walk, the input checks and the copy back are
:class:`~engine.algorithms.cuda_base.ChunkedCudaMatcher`'s, shared by every
cuda matcher.
"""

from __future__ import annotations

import copy

import numpy as np

from engine.algorithms.cuda_base import (ChunkedCudaMatcher, DeviceSegment, check_program_depths, pattern_columns,
                                        token_attributes)
from engine.algorithms.options import ScanOptions
from engine.backend import resolve_backend
from engine.compile import Segment
from gpu_kernels import cuda_support
from gpu_kernels import scan as scan_kernels
from gpu_kernels.compaction import n_tiles_for


class ScanCudaMatcher(ChunkedCudaMatcher):
    """``scan`` on the device.

    Parameters
    ----------
    segment : the compiled segment (its predicates recoded).
    backend : ``"cuda"``.
    launch : a :class:`gpu_kernels.cuda_support.LaunchConfig`; default
        ``cuda_support.default_launch()`` (tiny under the simulator).
    device_memory : bytes one match call may use on the device; default
        ``engine.backend.DEVICE_MEMORY_FRACTION`` of the free memory (of
        ``cuda_support.SIMULATED_FREE_MEMORY`` under the simulator).
    """

    name = "scan"

    backend = "cuda"

    def __init__(self, segment: Segment, backend: str = "cuda", *, launch=None, device_memory: int | None = None):
        if backend != "cuda":
            raise ValueError(f"ScanCudaMatcher runs on backend 'cuda', not {backend!r}")
        resolve_backend("cuda")    # BackendUnavailable naming what is missing
        ScanOptions(launch=launch, device_memory=device_memory)     # the registry's checks, for direct callers
        self.segment = segment
        self.launch = launch or cuda_support.default_launch()
        self.device_memory = device_memory
        self.stack_depth = check_program_depths(segment)
        self._n_patterns = pattern_columns(segment)
        self._token_attrs = token_attributes(segment)
        self.device = DeviceSegment(segment)

    @property
    def nbytes(self) -> int:
        """Host bytes (the segment); see :attr:`device_nbytes` for the device copy."""
        return self.segment.nbytes

    @property
    def device_nbytes(self) -> int:
        return self.device.nbytes

    def _refresh(self) -> None:
        self.device.refresh()

    def recoded(self, segment: Segment, schema) -> "ScanCudaMatcher":
        """The same programs with predicates coded under a grown string
        dictionary (``segment``); this matcher is unchanged."""
        if segment is self.segment:
            return self
        derived = copy.copy(self)
        derived.segment = segment
        derived.device = self.device.with_codes(segment)
        return derived

    def _event_bytes(self) -> tuple[int, str]:
        n_subs = len(self.segment)
        n_tiles = n_tiles_for(n_subs, self.launch)
        return n_subs + 16 * n_tiles, f"a hit row of {n_subs} bytes, {16 * n_tiles} for compaction"

    def _match_chunk(self, batch, events_d, offsets, start: int, stop: int, truth_d, list_d, alive_d,
                     result_room: int, col_dtype=np.int64):
        """Scan, count, scan-offsets and fill one chunk of events; yields
        :meth:`_compact`'s pieces, each one's results fitting ``result_room`` bytes."""
        xp = cuda_support.array_module()
        dev, seg = self.device, self.segment
        n_rows = stop - start
        ev_offsets, ev_attr, ev_value, ev_token, event_start = self._chunk_events(batch, events_d, offsets,
                                                                                  start, stop)
        hits = xp.empty((n_rows, len(seg)), dtype=np.uint8)
        with self.phases("scan kernel"):
            scan_kernels.scan_kernel_cuda(event_start, n_rows, ev_offsets, ev_attr, ev_value, ev_token,
                                          dev.prog_offsets, dev.prog_kind, dev.prog_arg, alive_d,
                                          dev.pred_attr, dev.pred_op, dev.pred_lo, dev.pred_hi, dev.set_offsets,
                                          dev.set_values, dev.pred_aux, truth_d, list_d, self.stack_depth, hits,
                                          launch=self.launch)
        del ev_offsets, ev_attr, ev_value, ev_token
        yield from self._compact(hits, n_rows, start, result_room, col_dtype)
