"""``pstbloom`` and ``psthash`` (PS-Tree, Ji and Jacobsen, PVLDB 12(3) 2018) on the cpu backend
(docs/papers.md#ps-tree).

How the paper maps onto this module and :mod:`gpu_kernels.pstree.cpu`:

* **Expressions** (§3.1): PS-Tree indexes conjunctions.  Each subscription's
  conjunctions -- itself when it is one, its DNF otherwise -- are its
  *units* (:mod:`engine.algorithms.units`, as for BE-Tree); beyond
  ``dnf_limit`` conjunctions the Index's residual matcher takes the
  subscription.  A subscription matches when one of its units does,
  reported once.  Unlike §3.1, a unit may hold two predicates on one
  attribute; both are kept and checked.
* **PS-Tree** (§4.1-§4.3): one per attribute.  Its leaves, the *predicate
  spaces*, are disjoint code ranges; a predicate *covers* the spaces where
  it is TRUE.  The paper's digit trie is replaced by its flat equivalent
  (:class:`gpu_kernels.pstree.cpu.SpaceTable`): the sorted endpoint codes of
  the attribute's predicates cut the domain into elementary ranges
  (``(-inf, v0)``, ``[v0]``, ``(v0, v1)``, ...), adjacent ranges covered by
  the same predicates form one space -- exactly the merged spaces of §4.4's
  example (``[1, 20)``, ``[20, 60]``, ``(60, 100]``) -- and MatchPair
  (Algorithm 3) is a binary search over the endpoints that are still
  boundaries.  ``!=``, NOT IN and NOT BETWEEN cover two or more ranges;
  LIKE, MATCHES, their negations and IS [NOT] NULL cover none (what they
  decide is not a code range) and are never access predicates.  Codes are
  exact for every covered operator (docs/adding-an-algorithm.md §1).
* **Predicate selectivity** (§3.3): each unit's access predicate(s) are its
  most selective ones: with an ``event_log`` (an EventBatch), the fewest
  logged events in the spaces the predicate covers (the leaves' event
  counters); then -- and alone without a log -- the operator ranking ``=`` >
  IN > BETWEEN > ``<``/``<=``/``>``/``>=`` > NOT IN > NOT BETWEEN > ``!=``;
  then the narrower share of its attribute's elementary ranges ("wider
  value sets have lower selectivity"; a share, so that attributes with
  different domains compare).  The paper puts the event history first when
  there is one ("if no historical events exist, we heuristically rank");
  DESIGN.md's wording lists it last -- this follows the paper.
* **PSTBloom** (§5, Algorithms 4-5): PS-Trees over every indexable
  predicate; each space holds the *subscription list* of the units whose
  access predicate covers it and a Bloom *signature* of the units whose
  other predicates cover it (``bloom_bits`` bits per unit inserted, rounded
  up to a power of two of 64-bit words; ``bloom_hashes`` probes; the paper
  gives no sizes).  An event's candidates are the lists of its pairs'
  spaces (Lemma 1); a candidate survives when, for each of its other
  indexable predicates, the event carries the attribute and the signature
  of that pair's space holds the unit; survivors are checked exactly.
* **PSTHash** (§6, Algorithms 6-7): PS-Trees over the access predicates
  only (PS-Tree_H); ``n_access`` access predicates per unit on distinct
  attributes; a hash table (open addressing) from N-dim space ids -- the
  ascending global ids of one covered space per access predicate -- to
  units.  An event's located spaces give C(|E|, r) keys for each arity
  ``r`` in use (Lemma 2); the candidates are checked exactly.  A unit with
  fewer indexable attributes than ``n_access`` is keyed by fewer spaces
  (footnote 2 handles such units "by the method of PSTBloom"; a key of
  fewer spaces is that with the hash table instead of a list).  Departure:
  a unit whose access predicates would make more than ``max_combinations``
  keys (wide ranges multiply) drops its least selective access predicate
  until it makes at most that many or has one left -- the paper bounds
  nothing, and a few wide ranges could otherwise fill memory.
* **Units with no indexable predicate** (only LIKE, MATCHES, their
  negations and IS [NOT] NULL; or no predicate at all: constant TRUE) are
  candidates for every event (an *always* list): no subscription is
  dropped.
* **Exactness**: a space decides its access predicate (its value lies in a
  covered space), so the exact check skips it -- but for a NaN value,
  placed in the leftmost space; every other predicate is evaluated by
  :func:`gpu_kernels.predicates.entry_truth` under three-valued logic (an
  absent attribute makes it NULL, the unit not TRUE).

Not implemented in this round, and said so: the dynamic adjustment of §4.4
(space split on insert, merge on delete) -- :meth:`merged` is the default
rebuild, and :meth:`recoded` (string codes moved) rebuilds as well, both
exact.  (In this flat form any change rewrites the CSR lists and
signatures whole, and a Bloom signature cannot forget a deleted unit, so a
derived structure would save little over the rebuild: the ranking and the
endpoint sort.)  Saving the structure (``to_arrays``): the default, a
rebuild on load.  (The cuda matchers, :mod:`engine.algorithms.pstree_cuda`,
serve this very structure from the device.)
"""

from __future__ import annotations

import numpy as np

from engine.algorithms.base import HostMatcher
from engine.algorithms.host_tasks import SERIAL_EVENTS, match_in_tasks
from engine.algorithms.units import check_dnf, dnf_units
from engine.compile import Segment
from engine.expr import Node
from gpu_kernels import opcodes
from gpu_kernels.pstree import cpu as K

#: the Index's default DNF limit (engine.index.DEFAULT_DNF_LIMIT)
DEFAULT_LIMIT = 256
PAPER = "PS-Tree, Ji and Jacobsen, PVLDB 2018, §3.1"

_SINGLE = (opcodes.EQ, opcodes.NE, opcodes.LT, opcodes.LE, opcodes.GT, opcodes.GE, opcodes.BETWEEN,
           opcodes.NOT_BETWEEN)
_RANGE = (opcodes.BETWEEN, opcodes.NOT_BETWEEN)
_SETS = (opcodes.IN, opcodes.NOT_IN)


def check_expression(node: Node, limit: int = DEFAULT_LIMIT) -> None:
    """Refuse, at add time, an expression whose DNF exceeds ``limit``
    conjunctions (ExpressionTooLarge); None otherwise."""
    check_dnf(node, limit, "pstbloom/psthash", PAPER)


# --------------------------------------------------------------- PS-Trees
def endpoints(rows, use: np.ndarray, n_attrs: int) -> tuple[np.ndarray, np.ndarray]:
    """The sorted distinct endpoint codes of the rows ``use`` marks, per
    attribute: ``(val_off, vals)``."""
    op = rows.op
    single = use & np.isin(op, _SINGLE)
    both = use & np.isin(op, _RANGE)
    sets = use & np.isin(op, _SETS)
    set_len = np.diff(rows.set_offsets)
    rows_of_sets = np.flatnonzero(sets)
    lens = set_len[rows_of_sets]
    starts = np.concatenate(([0], np.cumsum(lens))).astype(np.int64)
    gather = np.repeat(rows.set_offsets[:-1][rows_of_sets] - starts[:-1], lens) + np.arange(int(starts[-1]))
    attr = np.concatenate((rows.attr[single], rows.attr[both],
                           np.repeat(rows.attr[rows_of_sets], lens))).astype(np.int64)
    value = np.concatenate((rows.lo[single], rows.hi[both], rows.set_values[gather])).astype(np.float64)
    order = np.lexsort((value, attr))
    attr, value = attr[order], value[order]
    keep = np.ones(len(attr), bool)
    keep[1:] = (attr[1:] != attr[:-1]) | (value[1:] != value[:-1])
    attr, value = attr[keep], value[keep]
    val_off = np.searchsorted(attr, np.arange(n_attrs + 1)).astype(np.int64)
    return val_off, value


def predicate_spaces(rows, use: np.ndarray, defining: np.ndarray, n_attrs: int):
    """The PS-Trees whose spaces the ``defining`` rows cut (endpoints from
    every ``use`` row, so that shares of elementary ranges compare across
    builds).  Returns ``(table, cov, elem)``: the
    :class:`~gpu_kernels.pstree.cpu.SpaceTable`; per defining row the global
    space ranges it covers (``cov_off``, ``cov_first``, ``cov_last``: CSR,
    inclusive); and ``elem`` -- the elementary view (global elementary
    index of each interval, for the ranking): ``(iv_off, g_first, g_last,
    eoff, val_off, vals)``."""
    val_off, vals = endpoints(rows, use, n_attrs)
    iv_off, iv_first, iv_last = K.row_intervals(rows.op, rows.attr, rows.lo, rows.hi, rows.set_offsets,
                                                rows.set_values, use.astype(np.uint8), val_off, vals)
    n_rows = len(rows.op)
    m = np.diff(val_off)
    eoff = 2 * val_off[:-1] + np.arange(n_attrs)
    n_elem = 2 * len(vals) + n_attrs
    elem_attr = np.repeat(np.arange(n_attrs), 2 * m + 1)
    row_of_iv = np.repeat(np.arange(n_rows), np.diff(iv_off))
    iv_attr = rows.attr[row_of_iv].astype(np.int64)
    g_first = eoff[iv_attr] + iv_first
    g_last = eoff[iv_attr] + iv_last
    d = defining[row_of_iv]
    has_tree = np.zeros(n_attrs, bool)
    has_tree[iv_attr[d]] = True
    # a space starts where a defining predicate's range starts or after one ends (§4.2's partitioning,
    # which also makes adjacent ranges covered by the same predicates one space, as §4.4 merges them)
    start = np.zeros(n_elem + 1, bool)
    start[g_first[d]] = True
    start[g_last[d] + 1] = True
    start[eoff[has_tree]] = True
    start = start[:n_elem] & has_tree[elem_attr]
    space = np.cumsum(start) - 1
    space[~has_tree[elem_attr]] = -1
    space_off = np.concatenate(([0], np.cumsum(np.bincount(elem_attr[start], minlength=n_attrs)))).astype(np.int64)
    # endpoints that are no boundary any more (their three ranges in one space) are dropped
    val_attr = np.repeat(np.arange(n_attrs), m)
    eg = eoff[val_attr] + 2 * (np.arange(len(vals)) - val_off[:-1][val_attr])
    keep = ~((space[eg] == space[eg + 1]) & (space[eg + 1] == space[eg + 2])) if len(vals) else np.zeros(0, bool)
    new_vals = vals[keep]
    new_off = np.concatenate(([0], np.cumsum(np.bincount(val_attr[keep], minlength=n_attrs)))).astype(np.int64)
    new_eoff = 2 * new_off[:-1] + np.arange(n_attrs)
    elem_space = np.empty(2 * len(new_vals) + n_attrs, np.int64)
    kept = np.flatnonzero(keep)
    k_attr = val_attr[kept]
    local = np.arange(len(kept)) - new_off[:-1][k_attr]
    elem_space[new_eoff[k_attr] + 2 * local] = space[eg[kept]]
    elem_space[new_eoff[k_attr] + 2 * local + 1] = space[eg[kept] + 1]
    elem_space[new_eoff + 2 * np.diff(new_off)] = space[eoff + 2 * m]
    table = K.SpaceTable(new_off, new_vals.astype(np.float64), elem_space, space_off)
    cov_off = np.concatenate(([0], np.cumsum(np.bincount(row_of_iv[d], minlength=n_rows)))).astype(np.int64)
    cov = (cov_off, space[g_first[d]].astype(np.int64), space[g_last[d]].astype(np.int64))
    elem = (iv_off, g_first, g_last, eoff, val_off, vals)
    return table, cov, elem


def selectivity(rows, elem, n_attrs: int, event_log) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per row, §3.3's three criteria: its operator class, the share of its
    attribute's elementary ranges it covers, and (with an ``event_log``)
    the logged events whose value it covers -- the sum of the leaf event
    counters over its ranges."""
    iv_off, g_first, g_last, eoff, val_off, vals = elem
    n_rows = len(rows.op)
    row_of_iv = np.repeat(np.arange(n_rows), np.diff(iv_off))
    cls = K.OPERATOR_CLASS[rows.op.astype(np.int64)]
    n_elem_attr = 2 * np.diff(val_off) + 1
    covered = np.bincount(row_of_iv, weights=(g_last - g_first + 1).astype(np.float64), minlength=n_rows)
    width = covered / n_elem_attr[rows.attr.astype(np.int64)] if n_rows else np.zeros(0)
    events = np.zeros(n_rows, np.int64)
    if event_log is not None:
        n_elem = 2 * len(vals) + n_attrs
        ev_elem = K.locate_spaces(np.asarray(event_log.offsets, np.int64), np.asarray(event_log.attr, np.int64),
                                  np.asarray(event_log.value, np.float64), val_off, vals,
                                  np.arange(n_elem, dtype=np.int64))
        counter = np.bincount(ev_elem[ev_elem >= 0], minlength=n_elem)
        prefix = np.concatenate(([0], np.cumsum(counter)))
        events = np.bincount(row_of_iv, weights=(prefix[g_last + 1] - prefix[g_first]).astype(np.float64),
                             minlength=n_rows).astype(np.int64)
    return cls.astype(np.int64), width.astype(np.float64), events


# ----------------------------------------------------------------- matchers
class _PSTreeMatcher(HostMatcher):
    """What PSTBloom and PSTHash share: units, PS-Trees, access predicates."""

    @classmethod
    def construct(cls, segment: Segment, settings):
        return cls(segment, cls.backend, schema=settings.schema, dnf_limit=settings.dnf_limit,
                   **settings.options.keywords(cls.backend))

    def _read_segment(self, schema, dnf_limit: int, event_log) -> None:
        seg = self.segment
        if seg.predicates.lo is None:
            if schema is None:
                raise ValueError("the segment's predicates are not coded yet: recode them or pass schema=")
            seg.predicates.recode(schema)
        self.dnf_limit = int(dnf_limit)
        self.units = units = dnf_units(seg, self.dnf_limit)
        rows = units.rows
        self.n_attrs = int(rows.attr.max(initial=-1)) + 1
        used = np.zeros(len(rows.op), bool)
        used[units.pids] = True
        self.indexable = used & (K.OPERATOR_CLASS[rows.op.astype(np.int64)] != K.NOT_INDEXABLE)
        # the full PS-Trees (every indexable predicate) and the ranking they give
        self._full = predicate_spaces(rows, self.indexable, self.indexable, self.n_attrs)
        self.row_class, self.row_width, self.row_events = selectivity(rows, self._full[2], self.n_attrs, event_log)

    def _select(self, n_access: int):
        u = self.units
        return K.select_access(u.offsets, u.pids.astype(np.int64), u.rows.attr.astype(np.int64), self.row_class,
                               self.row_width, self.row_events, n_access)

    def _launch(self, batch, kernel, serial, extra):
        n_subs = len(self.segment)
        locate = K.locate_spaces_serial if batch.n_events <= SERIAL_EVENTS else K.locate_spaces
        ev_space = locate(batch.offsets, batch.attr, batch.value, self.spaces.val_off, self.spaces.vals,
                          self.spaces.elem_space)

        def launch(first, last, out, cap, ev_count, stop, need, one):
            (serial if one else kernel)(first, last, out, cap, ev_count, stop, need, n_subs, self.n_attrs,
                                        *extra(ev_space))
        return launch

    def positions(self, batch, pattern_truth: np.ndarray, alive: np.ndarray):
        if batch.n_events == 0 or len(self.segment) == 0:
            return np.zeros(0, np.int64), np.zeros(0, np.int64)
        launch = self._launcher(batch, np.ascontiguousarray(pattern_truth, np.uint8),
                                np.ascontiguousarray(alive, np.uint8), np.zeros(0, np.int64))
        events, positions, self._matches_per_event = match_in_tasks(batch.n_events, launch,
                                                                    self._matches_per_event)
        return events, positions

    def candidate_statistics(self, batch, pattern_truth: np.ndarray, alive: np.ndarray) -> dict:
        """Counters of one serial match of ``batch`` (see the kernels'
        ``stats``), for tests and tuning."""
        stats = np.zeros(3, np.int64)
        launch = self._launcher(batch, np.ascontiguousarray(pattern_truth, np.uint8),
                                np.ascontiguousarray(alive, np.uint8), stats)
        n = batch.n_events
        cap = 1 << 20
        out = np.empty(cap, np.int32)
        launch(np.array([0]), np.array([n]), out, cap, np.zeros(n, np.int64), np.empty(1, np.int64),
               np.empty(1, np.int64), True)
        return dict(zip(self.STATS, (int(x) for x in stats)))

    def _unit_args(self):
        u = self.units
        return u.sub, u.offsets, self._pids, u.rows

    @property
    def nbytes(self) -> int:
        arrays = list(self.spaces) + list(self.structure) + list(self.units[:4]) + list(self.units.rows) + [self._pids]
        return self.segment.nbytes + sum(int(a.nbytes) for a in arrays)


class PSTBloomMatcher(_PSTreeMatcher):
    """PSTBloom on the host (see the module docstring).  Options:
    ``bloom_bits`` (signature bits per unit inserted), ``bloom_hashes``
    (probes per unit), ``event_log`` (an EventBatch ranking predicates by
    the events they cover)."""

    name = "pstbloom"
    STATS = ("list_candidates", "signature_candidates", "matches")

    def __init__(self, segment: Segment, backend: str = "cpu", *, schema=None, dnf_limit: int = DEFAULT_LIMIT,
                 bloom_bits: int = 8, bloom_hashes: int = 3, event_log=None):
        if backend != "cpu":
            raise ValueError(f"PSTBloomMatcher runs on backend 'cpu', not {backend!r}")
        from engine.algorithms.options import PSTBloomOptions
        PSTBloomOptions(bloom_bits=bloom_bits, bloom_hashes=bloom_hashes, event_log=event_log)   # the checks
        self.segment = segment
        self.schema = schema
        self.bloom_bits, self.bloom_hashes = int(bloom_bits), int(bloom_hashes)
        self._read_segment(schema, dnf_limit, event_log)
        units = self.units
        self._pids = units.pids.astype(np.int64)
        acc, arity = self._select(1)
        self.spaces, (cov_off, cov_first, cov_last), _ = self._full
        self.defining = self.indexable            # the rows that cut the PS-Trees: every indexable one
        unit_of = np.repeat(np.arange(len(units), dtype=np.int64), np.diff(units.offsets))
        by_attr = np.argsort(units.rows.attr[self._pids], kind="stable").astype(np.int64)
        list_off, list_units, sig_off, sig = K.build_pstbloom(
            unit_of, by_attr, self._pids, acc, self.indexable.astype(np.uint8), cov_off, cov_first, cov_last,
            int(self.spaces.space_off[-1]), self.bloom_bits, self.bloom_hashes)
        self.structure = K.BloomArrays(list_off, list_units, sig_off, sig, acc[:, 0].copy(),
                                       np.flatnonzero(arity == 0).astype(np.int32), self.indexable.astype(np.uint8))
        del self._full
        self._matches_per_event = 16.0

    def access_predicates(self) -> np.ndarray:
        """Per unit, the extended-table row of its access predicate (-1: none)."""
        acc = self.structure.access
        return np.where(acc >= 0, self._pids[np.maximum(acc, 0)], -1)

    def _launcher(self, batch, pattern_truth, alive, stats):
        def extra(ev_space):
            return (batch.offsets, batch.attr, batch.value, batch.token, ev_space, pattern_truth, *self._unit_args(),
                    self.structure, self.bloom_hashes, alive, stats)
        return self._launch(batch, K.pstbloom_kernel, K.pstbloom_serial, extra)

    def statistics(self) -> dict:
        s = self.structure
        return {"units": len(self.units), "spaces": int(self.spaces.space_off[-1]),
                "boundaries": len(self.spaces.vals), "list_entries": len(s.units),
                "signature_words": len(s.sig), "always_candidates": len(s.always)}

    def __repr__(self) -> str:
        s = self.statistics()
        return (f"PSTBloomMatcher({len(self.segment)} subscriptions, {s['units']} units, {s['spaces']} spaces, "
                f"bloom_bits={self.bloom_bits}, bloom_hashes={self.bloom_hashes})")


class PSTHashMatcher(_PSTreeMatcher):
    """PSTHash on the host (see the module docstring).  Options:
    ``n_access`` (access predicates per unit, the paper's N),
    ``max_combinations`` (most N-dim keys per unit), ``event_log``."""

    name = "psthash"
    STATS = ("keys_probed", "candidates", "matches")

    def __init__(self, segment: Segment, backend: str = "cpu", *, schema=None, dnf_limit: int = DEFAULT_LIMIT,
                 n_access: int = 2, max_combinations: int = 256, event_log=None):
        if backend != "cpu":
            raise ValueError(f"PSTHashMatcher runs on backend 'cpu', not {backend!r}")
        from engine.algorithms.options import PSTHashOptions
        PSTHashOptions(n_access=n_access, max_combinations=max_combinations, event_log=event_log)   # the checks
        self.segment = segment
        self.schema = schema
        self.n_access, self.max_combinations = int(n_access), int(max_combinations)
        self._read_segment(schema, dnf_limit, event_log)
        units, rows = self.units, self.units.rows
        self._pids = units.pids.astype(np.int64)
        width = self.n_access
        acc, arity = self._select(width)
        del self._full
        # PS-Tree_H: spaces cut by the access predicates only (§6.1)
        defining = np.zeros(len(rows.op), bool)
        defining[self._pids[acc[acc >= 0]]] = True
        self.spaces, (cov_off, cov_first, cov_last), _ = predicate_spaces(rows, self.indexable, defining,
                                                                          self.n_attrs)
        self.defining = defining                  # (those an access predicate dropped below keep their cuts)
        n_cov = np.bincount(np.repeat(np.arange(len(rows.op)), np.diff(cov_off)),
                            weights=(cov_last - cov_first + 1).astype(np.float64), minlength=len(rows.op))
        # the departure: too many keys -> drop the least selective access predicate (module docstring)
        while True:
            prod = np.ones(len(arity))
            for q in range(width):
                on = acc[:, q] >= 0
                prod[on] *= n_cov[self._pids[acc[on, q]]]
            over = (prod > self.max_combinations) & (arity > 1)
            if not over.any():
                break
            acc[over, arity[over] - 1] = -1
            arity[over] -= 1
        keys, owner = K.space_combinations(units.offsets, self._pids, acc, arity, rows.attr.astype(np.int64),
                                           cov_off, cov_first, cov_last, width)
        order = np.lexsort((owner,) + tuple(keys[:, q] for q in range(width - 1, -1, -1)))
        keys, owner = keys[order], owner[order]
        new = np.ones(len(keys), bool)
        new[1:] = (keys[1:] != keys[:-1]).any(axis=1)
        group_keys = keys[new]
        group_off = np.concatenate((np.flatnonzero(new), [len(keys)])).astype(np.int64)
        n_slots = 2
        while n_slots < 2 * len(group_keys):
            n_slots *= 2
        slot_key, slot_group = K.build_hash_table(np.ascontiguousarray(group_keys), n_slots)
        arities = np.zeros(width + 1, np.uint8)
        arities[arity[arity > 0]] = 1
        self.structure = K.HashArrays(slot_key, slot_group, group_off, owner.astype(np.int32), acc, arities,
                                      np.flatnonzero(arity == 0).astype(np.int32))
        self.arity = arity
        self._matches_per_event = 16.0

    def access_predicates(self) -> np.ndarray:
        """Per unit, the extended-table rows of its access predicates, best
        first (-1 padded)."""
        acc = self.structure.access
        return np.where(acc >= 0, self._pids[np.maximum(acc, 0)], -1)

    def _launcher(self, batch, pattern_truth, alive, stats):
        max_event = int(np.diff(batch.offsets).max(initial=0))

        def extra(ev_space):
            return (max_event, batch.offsets, batch.attr, batch.value, batch.token, ev_space, pattern_truth,
                    *self._unit_args(), self.structure, alive, stats)
        return self._launch(batch, K.psthash_kernel, K.psthash_serial, extra)

    def statistics(self) -> dict:
        s = self.structure
        return {"units": len(self.units), "spaces": int(self.spaces.space_off[-1]),
                "boundaries": len(self.spaces.vals), "keys": len(s.group_off) - 1, "key_entries": len(s.units),
                "slots": len(s.slot_group), "always_candidates": len(s.always),
                "arity_counts": np.bincount(self.arity, minlength=self.n_access + 1).tolist()}

    def __repr__(self) -> str:
        s = self.statistics()
        return (f"PSTHashMatcher({len(self.segment)} subscriptions, {s['units']} units, {s['spaces']} spaces, "
                f"{s['keys']} keys, n_access={self.n_access})")


__all__ = ["PSTBloomMatcher", "PSTHashMatcher", "check_expression", "predicate_spaces", "endpoints"]
