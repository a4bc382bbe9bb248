"""The matcher contract: the one seam between the Index and an algorithm.

A *matcher* answers one question about one compiled
:class:`~engine.compile.Segment`: which of its subscriptions are TRUE on
which events of a batch.  Everything else -- the delta of recent adds,
tombstones, snapshots, subscription ids, persistence, the residual
subscriptions an algorithm does not index -- belongs to the
:class:`~engine.index.Index`, which reaches every algorithm on every backend
through these members only:

``Matcher.build(segment, settings)``
    a matcher built from scratch (``settings``: :class:`BuildSettings`).
``match(batch, pattern_truth, alive, *, ids=None, output="numpy")``
    ``(event index, subscription)`` pairs, ascending by event then
    subscription: positions in the segment, or ``ids[position]`` when ``ids``
    is given (:meth:`Matcher.match` maps them; a cuda matcher maps them while
    copying back).  ``alive[p] == 0`` hides position ``p`` (a tombstone).
    ``output="device"`` (cuda only) keeps both arrays on the device.
``merged(segment, old_to_new, added, schema)``
    the matcher of the merged main segment (``old_to_new[p]``: the new
    position of old position ``p``, -1 when removed; ``added``: the new
    positions of the others).  Default: build from scratch; an algorithm
    that can update its structure (OpIndex) overrides it.
``recoded(segment, schema)``
    the same subscriptions with predicate codes under a grown string
    dictionary.  Default: this matcher when nothing changed, else a rebuild.
``nbytes`` / ``device_nbytes``
    host bytes (segment included) and device bytes held.
``to_arrays()`` / ``Matcher.from_arrays(segment, settings, meta, arrays)``
    the built structure as JSON-able ``meta`` and flat NumPy ``arrays``,
    saved in the index file so that ``Index.load`` (every Spark worker) does
    not build again what was built once.  ``from_arrays`` must check what it
    reads -- a crafted file must fail with ``ValueError``, never reach a
    kernel.  Default: nothing saved (``None``), ``from_arrays`` builds.

A matcher never changes after it is built: ``merged`` and ``recoded`` return
a new one, so that a match in flight on an older snapshot is undisturbed.
CPU matchers implement :meth:`HostMatcher.runs` (the matches where their
kernels left them) or :meth:`HostMatcher.positions`; cuda matchers derive
from :class:`engine.algorithms.cuda_base.ChunkedCudaMatcher`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from engine.algorithms.host_tasks import Runs
from engine.compile import Segment

OUTPUTS = ("numpy", "device")

#: the list table of a batch with no list attribute: zero rows (one offset)
NO_LISTS = np.ones(1, np.int64)


def list_truth_of(batch):
    """The batch's list-predicate table (``EventBatch.list_truth``, packed
    CSR: row offsets, then each row's TRUE keys) as the CPU kernels read it:
    contiguous int64.  A batch without the field (built before list
    attributes) has no event lists: zero rows.  A table of another number
    of rows than the batch has event lists -- one `Index` did not fill in,
    `encode_events` leaves it empty -- is refused: the kernels would read
    past it."""
    table = getattr(batch, "list_truth", None)
    if table is None:
        return NO_LISTS
    table = np.ascontiguousarray(table, dtype=np.int64)
    rows = len(getattr(batch, "list_offsets", NO_LISTS[:1] * 0)) - 1
    if table.ndim != 1 or len(table) == 0 or int(table[0]) - 1 != max(rows, 0) or int(table[0]) > len(table) \
            or (rows > 0 and (np.diff(table[:rows + 1]) < 0).any()) or (rows > 0 and int(table[rows]) > len(table)):
        raise ValueError(f"the batch's list_truth does not cover its {max(rows, 0)} event lists: fill it in with "
                         f"engine.events.list_truth(batch, segment.predicates.list_index(schema))")
    return table


def alive_flags(alive) -> np.ndarray:
    """A segment's ``alive`` flags as every CPU kernel takes them: uint8,
    contiguous and read-only (a read-only view: no copy).  numba compiles a
    kernel again for each new type of argument, and a read-only array is
    one: the snapshot's flags are read-only (nobody may change a published
    state), so all the others are handed over so too, and each kernel is
    compiled once."""
    flags = np.ascontiguousarray(alive, dtype=np.uint8)
    if flags.flags.writeable:
        flags = flags.view()
        flags.flags.writeable = False
    return flags


@dataclass(frozen=True)
class BuildSettings:
    """What a matcher is built with: the Index's schema view (string
    dictionary, pattern texts), its ``dnf_limit``, and the algorithm's
    options (an instance of its registered options dataclass)."""

    schema: object
    dnf_limit: int
    options: object


class Matcher:
    """Base of every matcher (see the module docstring for the contract)."""

    #: the registry name of the algorithm
    name: ClassVar[str] = ""
    #: "cpu" or "cuda"
    backend: str = "cpu"
    segment: Segment
    #: what the matcher was built with (set by :meth:`build`); None when a
    #: test or benchmark constructed it directly
    settings: BuildSettings | None = None

    # ------------------------------------------------------------- building
    @classmethod
    def build(cls, segment: Segment, settings: BuildSettings) -> "Matcher":
        matcher = cls.construct(segment, settings)
        matcher.settings = settings
        return matcher

    @classmethod
    def construct(cls, segment: Segment, settings: BuildSettings) -> "Matcher":
        """Call the constructor with what it takes of ``settings``; the
        default passes the options that apply to this backend."""
        return cls(segment, cls.backend, **settings.options.keywords(cls.backend))

    def rebuilt(self, segment: Segment, schema) -> "Matcher":
        """A matcher of ``segment`` built from scratch with this one's settings."""
        if self.settings is None:
            raise TypeError(f"{type(self).__name__} was constructed directly: build it with "
                            f"{type(self).__name__}.build(segment, settings) to derive others from it")
        settings = BuildSettings(schema, self.settings.dnf_limit, self.settings.options)
        return type(self).build(segment.coded(schema), settings)

    # ------------------------------------------------------------- updating
    def merged(self, segment: Segment, old_to_new: np.ndarray, added: np.ndarray, schema) -> "Matcher":
        return self.rebuilt(segment, schema)

    def recoded(self, segment: Segment, schema) -> "Matcher":
        return self if segment is self.segment else self.rebuilt(segment, schema)

    # ------------------------------------------------------------- matching
    def match(self, batch, pattern_truth: np.ndarray, alive: np.ndarray, *, ids=None, output: str = "numpy"):
        raise NotImplementedError

    # --------------------------------------------------------------- memory
    @property
    def nbytes(self) -> int:
        return self.segment.nbytes

    @property
    def device_nbytes(self) -> int:
        return 0

    # ---------------------------------------------------------- persistence
    def to_arrays(self) -> tuple[dict, dict[str, np.ndarray]] | None:
        return None

    @classmethod
    def from_arrays(cls, segment: Segment, settings: BuildSettings, meta: dict,
                    arrays: dict[str, np.ndarray]) -> "Matcher":
        return cls.build(segment, settings)


class HostMatcher(Matcher):
    """A matcher on the ``cpu`` backend: it implements :meth:`runs` (the
    indexes, whose kernels leave each event's positions in task slabs) or
    :meth:`positions` (``scan``), each given by the other; :meth:`match`
    maps positions to ids, the one place where that happens on the host."""

    backend = "cpu"

    def runs(self, batch, pattern_truth: np.ndarray, alive: np.ndarray) -> Runs:
        """The matches of each event of ``batch`` where the kernel left them."""
        if type(self).positions is HostMatcher.positions:
            raise NotImplementedError(f"{type(self).__name__} implements neither runs nor positions")
        events, positions = self.positions(batch, pattern_truth, alive)
        return Runs.of_pairs(events, positions, batch.n_events)

    def positions(self, batch, pattern_truth: np.ndarray, alive: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(event index, subscription position) int64 pairs, ascending by
        event then position."""
        return self.runs(batch, pattern_truth, alive).pairs()

    def match(self, batch, pattern_truth: np.ndarray, alive: np.ndarray, *, ids=None, output: str = "numpy"):
        if output != "numpy":
            raise ValueError(f"a cpu matcher answers with output='numpy' only, not {output!r}")
        if type(self).runs is HostMatcher.runs:        # (scan: its pairs as they are)
            events, positions = self.positions(batch, pattern_truth, alive)
            return (events, positions) if ids is None else (events, np.asarray(ids)[positions])
        return self.runs(batch, pattern_truth, alive).pairs(ids)
