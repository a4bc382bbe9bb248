"""One immutable state of an index: what a match reads.

An :class:`~engine.index.Index` holds its current :class:`Snapshot` in one
attribute.  A match reads that attribute once and works on that snapshot
alone; an update builds the next snapshot from the current one and
publishes it by assigning the attribute (one reference store: atomic).
Nothing a published snapshot holds is changed afterwards -- the main
segment, its ``alive`` flags (tombstones), the delta segments, the schema
view -- so an update never changes the answer of a match already running,
and no lock is held while matching.

What a snapshot derives lazily -- the main segment coded under its view's
string dictionary, the algorithm's matcher, the delta's concatenation -- is
computed once, by the first match that needs it (a concurrent match of the
same snapshot waits for that one computation), from immutable inputs only:
an older snapshot's matcher is read to derive the new one, never changed.

The matcher of a snapshot comes from its :class:`MatcherSource`:

* ``build``: built from scratch from the coded main segment;
* ``reuse``: the matcher of an earlier snapshot with the same main segment
  (recoded -- a new matcher -- when the string dictionary has grown since);
* ``derive``: the matcher of an earlier main segment and the position map
  of the merges since (``old_to_new``), handed to the algorithm's
  ``merged`` (the merge protocol, e.g. OpIndex's update without a rebuild).

Building and deriving are the Index's (``builder.build_matcher(segment,
view)``, ``builder.derive_matcher(matcher, segment, old_to_new, added,
view)``): it knows the algorithm, its settings and the residual split.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass

import numpy as np

from engine.compile import Segment, concat_segments
from engine.forks import renew_after_fork


@dataclass(frozen=True)
class MatcherSource:
    kind: str                          # "build", "reuse" or "derive"
    matcher: object = None
    segment: Segment | None = None     # reuse: the coded segment ``matcher`` was built on
    old_to_new: np.ndarray | None = None   # derive: old position -> new position (-1 removed)


BUILD = MatcherSource("build")


class Snapshot:
    """One state of an index (see the module docstring).

    ``view``: the schema as of this state; ``main``: the main segment, ids
    ascending; ``alive``: its flags (0: a tombstone); ``delta``: segments of
    subscriptions added since the last merge, each sorted by id."""

    __slots__ = ("view", "main", "alive", "n_dead", "delta", "source", "_lock", "_main_part", "_delta_part",
                 "_device_ids", "__weakref__")

    def __init__(self, view, main: Segment, alive: np.ndarray, n_dead: int, delta: tuple, source: MatcherSource):
        alive.setflags(write=False)
        self.view = view
        self.main = main
        self.alive = alive
        self.n_dead = n_dead
        self.delta = delta
        self.source = source
        self._lock = threading.Lock()
        renew_after_fork(self, Snapshot._after_fork)
        self._main_part = None
        self._delta_part = None
        self._device_ids = None

    def _after_fork(self) -> None:
        """In a forked child, the lock anew: one held at the fork by a thread
        making the matcher (a thread the child does not have) would block
        the child's every match of this snapshot."""
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self.main) - self.n_dead + sum(len(s) for s in self.delta)

    @property
    def delta_size(self) -> int:
        return sum(len(s) for s in self.delta)

    # ---------------------------------------------------------- matching parts
    def main_part(self, builder) -> tuple[Segment, object]:
        """(the main segment coded under the view, its matcher), computed
        once (see the module docstring for ``builder``)."""
        part = self._main_part
        if part is None:
            with self._lock:
                part = self._main_part
                if part is None:
                    part = self._main_part = self._resolve(builder)
                    # the matcher it came from is no longer needed here (successors start from this one's):
                    # holding it kept an older matcher alive, uncounted, until the next update
                    self.source = MatcherSource(self.source.kind)
        return part

    def _resolve(self, builder) -> tuple[Segment, object]:
        segment = self.main.coded(self.view)
        source = self.source
        if source.kind == "reuse":
            if source.segment is segment:
                return segment, source.matcher
            return segment, source.matcher.recoded(segment, self.view)
        if source.kind == "derive":
            old_to_new = source.old_to_new
            fresh = np.ones(len(segment), dtype=bool)
            fresh[old_to_new[old_to_new >= 0]] = False
            return segment, builder.derive_matcher(source.matcher, segment, old_to_new, np.flatnonzero(fresh),
                                                   self.view)
        return segment, builder.build_matcher(segment, self.view)

    def delta_part(self):
        """(segment, alive, matcher) of the delta, or None: the delta's
        segments concatenated, coded and matched by ``scan`` on the host
        (it is small)."""
        if not self.delta:
            return None
        part = self._delta_part
        if part is None:
            with self._lock:
                part = self._delta_part
                if part is None:
                    from engine.algorithms.scan import ScanMatcher
                    segment = concat_segments(list(self.delta)) if len(self.delta) > 1 else self.delta[0]
                    order = np.argsort(segment.sub_ids, kind="stable")
                    if len(order) > 1 and (order[1:] < order[:-1]).any():
                        segment = segment.take(order)
                    segment = segment.coded(self.view)
                    part = self._delta_part = (segment, np.ones(len(segment), np.uint8), ScanMatcher(segment, "cpu"))
        return part

    def matchers(self, builder) -> list:
        """(segment, alive, matcher) of the main segment, and of the delta if any."""
        segment, matcher = self.main_part(builder)
        out = [(segment, self.alive, matcher)]
        delta = self.delta_part()
        if delta is not None:
            out.append(delta)
        return out

    def device_ids(self, xp):
        """The main segment's ids in device memory (``output="device"``), uploaded once."""
        found = self._device_ids
        if found is None:
            found = self._device_ids = xp.asarray(self.main.sub_ids)
        return found

    # ---------------------------------------------------------- successors
    def kept_main(self) -> Segment:
        """The main segment for a successor with the same subscriptions:
        the coded one when a match has coded it (so that the successor
        codes again only when the string dictionary has grown)."""
        part = self._main_part
        return self.main if part is None else part[0]

    def kept_source(self) -> MatcherSource:
        """The matcher source of a successor with the same main segment."""
        # (the source first: a match resolving this snapshot in between sets the part before it lets go of
        # the source's matcher, so a source read first comes with a part whenever it has let go)
        source = self.source
        part = self._main_part
        if part is not None:
            return MatcherSource("reuse", part[1], part[0])
        return source

    def merged_source(self, old_to_new: np.ndarray) -> MatcherSource:
        """The matcher source of a successor whose main segment is this
        one's merged (``old_to_new``: old position -> new, -1 removed):
        derived from this one's matcher, composing the maps of merges made
        while no match built a matcher."""
        source = self.source                 # (first, as in kept_source)
        part = self._main_part
        if part is not None:
            matcher = part[1]
        elif source.kind == "reuse":
            matcher = source.matcher
        elif source.kind == "derive":
            earlier = source.old_to_new
            composed = np.full(len(earlier), -1, dtype=np.int64)
            composed[earlier >= 0] = old_to_new[earlier[earlier >= 0]]
            return MatcherSource("derive", source.matcher, old_to_new=composed)
        else:
            return BUILD
        return MatcherSource("derive", matcher, old_to_new=old_to_new)
