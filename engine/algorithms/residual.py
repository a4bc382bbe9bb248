"""Expressions beyond an algorithm's rewrite limit, matched exactly anyway.

An algorithm that indexes normal forms has a limit: OpIndex indexes an
expression through a DNF or a CNF of at most ``dnf_limit`` terms, and a
random mix of AND/OR/NOT/XOR exceeds both now and then.  Such an
expression is still valid, so the Index does not refuse it (unless
``strict=True``): at add time the registry's limit check marks it
*residual* (:attr:`engine.compile.Segment.residual`), and the main
segment's matcher becomes a :class:`ResidualMatcher` -- the algorithm's
matcher over the subscriptions it indexes, plus the residual matcher over
the others -- whose answers are merged into one ascending result.  The
split follows every merge: both halves are derived through their own
``merged``.

The residual matcher is A-Tree (``atree``, on the same backend): the one
algorithm that indexes every expression as it is -- AND/OR/NOT/XOR/XNOR at
any depth, shared subexpressions evaluated once -- where ``scan`` would
evaluate each residual expression whole on every event.
"""

from __future__ import annotations

import numpy as np

from engine.algorithms.base import Matcher
from engine.compile import Segment
from gpu_kernels import cuda_support
from gpu_kernels.compaction import merge_parts

#: the algorithm that matches residual subscriptions: it must index every expression (no limit check)
RESIDUAL_ALGORITHM = "atree"


def split_positions(segment: Segment) -> tuple[np.ndarray, np.ndarray]:
    """(positions the algorithm indexes, residual positions) of ``segment``."""
    flags = segment.residual
    if flags is None:
        return np.arange(len(segment), dtype=np.int64), np.zeros(0, np.int64)
    return np.flatnonzero(~flags).astype(np.int64), np.flatnonzero(flags).astype(np.int64)


def _sub_map(old_to_new: np.ndarray, old_part: np.ndarray, new_part: np.ndarray, n_new: int) -> tuple:
    """``old_to_new`` restricted to one half: old index within ``old_part``
    -> new index within ``new_part`` (-1: removed), and the half's added."""
    rank = np.full(n_new, -1, np.int64)
    rank[new_part] = np.arange(len(new_part))
    moved = old_to_new[old_part]
    part_map = np.full(len(moved), -1, np.int64)
    kept = moved >= 0
    part_map[kept] = rank[moved[kept]]          # (indexed only where kept: the merged segment may be empty)
    fresh = np.ones(len(new_part), bool)
    fresh[part_map[part_map >= 0]] = False
    return part_map, np.flatnonzero(fresh)


class ResidualMatcher(Matcher):
    """The algorithm's matcher over the indexed positions of a segment and
    the residual matcher over the rest (see the module docstring)."""

    def __init__(self, segment: Segment, native: Matcher, residual: Matcher, native_pos: np.ndarray,
                 residual_pos: np.ndarray, build_residual):
        self.segment = segment
        self.build_residual = build_residual
        self.native, self.residual = native, residual
        self.native_pos, self.residual_pos = native_pos, residual_pos
        self.name = native.name
        self.backend = native.backend
        self._device_pos = None

    # ------------------------------------------------------------ matching
    def match(self, batch, pattern_truth, alive, *, ids=None, output: str = "numpy"):
        on_device = output == "device"
        if ids is None:
            ids = np.arange(len(self.segment), dtype=np.int64)
        if cuda_support.is_device_array(ids):
            if self._device_pos is None:
                xp = cuda_support.array_module()
                self._device_pos = (xp.asarray(self.native_pos), xp.asarray(self.residual_pos))
            native_ids, residual_ids = (ids[p] for p in self._device_pos)
        else:
            native_ids, residual_ids = ids[self.native_pos], ids[self.residual_pos]
        e1, s1 = self.native.match(batch, pattern_truth, alive[self.native_pos], ids=native_ids, output=output)
        if not len(self.residual_pos):
            return e1, s1
        if self.residual.backend == "cpu":      # (on cuda: programs too deep for a device thread)
            e2, s2 = self.residual.match(batch, pattern_truth, alive[self.residual_pos],
                                         ids=cuda_support.to_host(residual_ids))
        else:
            e2, s2 = self.residual.match(batch, pattern_truth, alive[self.residual_pos], ids=residual_ids,
                                         output=output)
        xp = cuda_support.array_module() if on_device else np
        e2, s2 = xp.asarray(e2), xp.asarray(s2)
        if not len(e2):
            return e1, s1
        if not len(e1):
            return e2, s2
        if not on_device:
            return merge_parts([e1, e2], [s1, s2], batch.n_events)
        events, subs = xp.concatenate((e1, e2)), xp.concatenate((s1, s2))
        order = xp.lexsort(xp.stack([subs, events]))
        return events[order], subs[order]

    # ------------------------------------------------------------ updating
    def merged(self, segment: Segment, old_to_new: np.ndarray, added: np.ndarray, schema) -> Matcher:
        native_pos, residual_pos = split_positions(segment)
        native_map, native_added = _sub_map(old_to_new, self.native_pos, native_pos, len(segment))
        native = self.native.merged(_part(segment, native_pos), native_map, native_added, schema)
        residual_map, residual_added = _sub_map(old_to_new, self.residual_pos, residual_pos, len(segment))
        residual = self.residual.merged(segment.take(residual_pos), residual_map, residual_added, schema)
        return ResidualMatcher(segment, native, residual, native_pos, residual_pos, self.build_residual)

    def recoded(self, segment: Segment, schema) -> Matcher:
        if segment is self.segment:
            return self
        return ResidualMatcher(segment, self.native.recoded(_part(segment, self.native_pos), schema),
                               self.residual.recoded(_part(segment, self.residual_pos), schema),
                               self.native_pos, self.residual_pos, self.build_residual)

    # -------------------------------------------------------------- memory
    @property
    def nbytes(self) -> int:
        return self.native.nbytes + self.residual.nbytes + self.native_pos.nbytes + self.residual_pos.nbytes

    @property
    def device_nbytes(self) -> int:
        return self.native.device_nbytes + self.residual.device_nbytes

    # --------------------------------------------------------- persistence
    def to_arrays(self):
        """The algorithm's structure (the residual half has none)."""
        return self.native.to_arrays()


def _part(segment: Segment, positions: np.ndarray) -> Segment:
    return segment if len(positions) == len(segment) else segment.take(positions)


def build(segment: Segment, build_native, build_residual) -> Matcher:
    """The matcher of ``segment``: ``build_native(part)`` alone when no
    subscription is residual, else a :class:`ResidualMatcher` of both halves
    (``build_residual(part)`` makes the residual one)."""
    native_pos, residual_pos = split_positions(segment)
    native = build_native(_part(segment, native_pos))
    if not len(residual_pos):
        return native
    return ResidualMatcher(segment, native, build_residual(segment.take(residual_pos)), native_pos, residual_pos,
                           build_residual)


def derive(matcher: Matcher, segment: Segment, old_to_new: np.ndarray, added: np.ndarray, schema,
           build_residual) -> Matcher:
    """``matcher.merged(...)`` for the Index's merge, the residual split
    followed: a matcher without residual subscriptions gains a residual half
    when the merge brings the first ones, and sheds it when the last go."""
    if not isinstance(matcher, ResidualMatcher):
        if segment.residual is None:
            return matcher.merged(segment, old_to_new, added, schema)
        n_old = len(old_to_new)
        empty = matcher.segment.take(np.zeros(0, np.int64))
        matcher = ResidualMatcher(matcher.segment, matcher, build_residual(empty),
                                  np.arange(n_old, dtype=np.int64), np.zeros(0, np.int64), build_residual)
    result = matcher.merged(segment, old_to_new, added, schema)
    return result.native if not len(result.residual_pos) else result


__all__ = ["RESIDUAL_ALGORITHM", "ResidualMatcher", "build", "derive", "split_positions"]
