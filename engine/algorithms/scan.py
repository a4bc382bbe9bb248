"""``scan`` (docs/papers.md#scan-the-baseline): every compiled expression against every event.

No index at all; the postfix programs of engine.compile are run by
gpu_kernels.scan.  Events are processed in chunks so that the dense hit
matrix (chunk × subscriptions) stays within a fixed memory budget.
"""

from __future__ import annotations

import numpy as np

from engine.algorithms.base import HostMatcher, alive_flags, list_truth_of
from engine.compile import Segment
from engine.events import EventBatch
from gpu_kernels.compaction import compact_hits
from gpu_kernels.scan import scan_kernel

HIT_MATRIX_BYTES = 32 << 20


class ScanMatcher(HostMatcher):
    """``scan`` on the host: nothing is built beyond the segment, so a
    merge or a recode is a new matcher of the new segment (the defaults)."""

    name = "scan"

    def __init__(self, segment: Segment, backend: str = "cpu"):
        if backend != "cpu":
            raise ValueError(f"ScanMatcher runs on backend 'cpu', not {backend!r}")
        self.segment = segment

    def positions(self, batch: EventBatch, pattern_truth: np.ndarray, alive: np.ndarray):
        seg, preds = self.segment, self.segment.predicates
        n_subs = len(seg)
        if n_subs == 0 or batch.n_events == 0:
            return np.zeros(0, np.int64), np.zeros(0, np.int64)
        chunk = int(max(1, min(batch.n_events, HIT_MATRIX_BYTES // n_subs)))
        hits = np.empty((chunk, n_subs), dtype=np.uint8)
        list_truth = list_truth_of(batch)
        alive = alive_flags(alive)
        events, positions = [], []
        for start in range(0, batch.n_events, chunk):
            n = min(chunk, batch.n_events - start)
            scan_kernel(start, n, batch.offsets, batch.attr, batch.value, batch.token,
                        seg.prog_offsets, seg.prog_kind, seg.prog_arg, alive,
                        preds.attr, preds.op, preds.lo, preds.hi, preds.set_offsets, preds.set_values,
                        preds.aux, pattern_truth, list_truth, seg.max_depth, hits)
            e, p = compact_hits(hits, n, start)
            events.append(e)
            positions.append(p)
        return np.concatenate(events), np.concatenate(positions)
