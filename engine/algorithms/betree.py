"""``betree`` (BE-Tree, Sadoghi and Jacobsen, SIGMOD 2011): two-phase space cutting
over a high-dimensional discrete space (docs/papers.md#be-tree).

How the paper maps onto this module and :mod:`gpu_kernels.betree`:

* **Expressions** (§3): BE-Tree indexes conjunctions.  Each subscription's
  conjunctions -- itself when it is one, its DNF otherwise -- are its
  *units* (:mod:`engine.algorithms.units`); beyond ``dnf_limit``
  conjunctions the Index's residual matcher takes the subscription.  A
  subscription matches when one of its units does, reported once.
* **Table 1** (§4.3): each predicate becomes an interval of 64-bit keys
  (:func:`interval_keys`; the keys: :mod:`gpu_kernels.betree.layout`);
  ``!=``, ``NOT IN``, ``NOT BETWEEN``, ``LIKE``, ``MATCHES``, ``IS NOT
  NULL`` and the list operators (``ONE OF`` ... ``IS NOT EMPTY``: decided
  by the event list's row of the batch's list table, not by a value) span
  the whole domain (they need the attribute present), ``IN``
  spans its smallest to its largest value, ``IS NULL`` gives none (it
  needs the attribute absent).  Predicates of one unit on one attribute
  intersect; a unit whose intersection is empty is never TRUE and is not
  inserted.
* **The structure** (§4): p-nodes, c-nodes with the grid clustering
  directory, l-nodes; insertion with space partitioning and clustering,
  the forced split rule, ``max_cap`` and ``min_size``; deletion with the
  merge rule -- :mod:`gpu_kernels.betree.tree` (numba).
* **Self-adjustment** (§5): p-node scores are the rank with the paper's
  optimistic loss (see :mod:`gpu_kernels.betree.tree`); *subsumed*
  predicates -- an ``=`` decided by an atomic bucket on the unit's path --
  are not evaluated again at the leaf (:func:`gpu_kernels.betree.tree.leaf_arrays`).
* **Matching** (§6, Algorithms 1-2): :mod:`gpu_kernels.betree.cpu` over
  the flattened tree.

Updates (docs/architecture.md#the-index-life-cycle): the Index matches new
subscriptions in its delta and tombstones removals; a merge derives the
next matcher (:meth:`BETreeMatcher.merged`): the flattened tree is thawed
into a dynamic one, the removed subscriptions' units deleted, the added
ones inserted one at a time, and the result flattened again -- never a
rebuild, and nothing a match in flight reads is changed.  String keys use
the codes of the dictionary the tree was built under (*base codes*, see
:mod:`gpu_kernels.betree.layout`), so a grown dictionary changes no key: a
recode only maps the current codes to the base ones.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from engine.algorithms.base import HostMatcher, alive_flags, list_truth_of
from engine.algorithms.host_tasks import Runs, match_in_tasks
from engine.algorithms.options import DEFAULT_MAX_CAP, DEFAULT_MIN_SIZE
from engine.algorithms.units import Units, check_dnf, dnf_units, recoded_units
from engine.compile import Segment
from engine.expr import Family, Node
from gpu_kernels import opcodes
from gpu_kernels.betree import cpu as K
from gpu_kernels.betree.layout import (KEY_MAX, KEY_MIN, BETreeArrays, LeafArrays, NodeTable, base_codes,
                                       check_arrays, event_keys, float_keys, interval_bounds)
from gpu_kernels.betree.tree import DynamicTree, leaf_arrays, misplaced_unit, subtree_ends

#: the Index's default DNF limit (engine.index.DEFAULT_DNF_LIMIT)
DEFAULT_LIMIT = 256
PAPER = "BE-Tree, Sadoghi and Jacobsen, SIGMOD 2011, §3"


def check_expression(node: Node, limit: int = DEFAULT_LIMIT) -> None:
    """Refuse, at add time, an expression whose DNF exceeds ``limit``
    conjunctions (ExpressionTooLarge); None otherwise."""
    check_dnf(node, limit, "betree", PAPER)


# ------------------------------------------------------------------ strings
def string_attributes(schema, n_attrs: int) -> np.ndarray:
    """Per attribute id (at least ``n_attrs``): 1 for a string attribute."""
    names = schema.attr_names if schema is not None else []
    out = np.zeros(max(n_attrs, len(names)), np.uint8)
    for i, name in enumerate(names):
        out[i] = schema.families.get(name) is Family.STRING
    return out


def string_map(schema, base_strings: int) -> np.ndarray:
    """Current code -> base code, for a dictionary grown beyond its first
    ``base_strings`` strings (empty: nothing grew).  A current string of
    the base dictionary keeps its base code ``2r + 1``; any other current
    code becomes the base gap it falls in, ``2k`` (``k``: base strings
    below it)."""
    if schema is None or schema.n_strings <= base_strings:
        return np.zeros(0, np.float64)
    order = np.asarray(schema.dictionary().order, np.int64)
    is_base = order < base_strings
    below = np.concatenate(([0], np.cumsum(is_base))).astype(np.float64)
    out = np.empty(2 * len(order) + 1, np.float64)
    out[0::2] = 2 * below
    out[1::2] = np.where(is_base, 2 * below[:-1] + 1, 2 * below[:-1])
    return out


# ---------------------------------------------------------------- Table 1
def interval_keys(rows, string_attr: np.ndarray, str_map: np.ndarray):
    """Table 1 on keys, per row of the extended predicate table: (low key,
    high key, has an interval).  ``IS NULL`` has none; ``< v`` ends at the
    key below ``v``'s for numbers, at ``v``'s for strings (a base code may
    stand for several current strings, so a string bound stays closed)."""
    op = rows.op
    n = len(op)
    attr = rows.attr.astype(np.int64)
    lo_v = base_codes(rows.lo, attr, string_attr, str_map)
    hi_v = base_codes(rows.hi, attr, string_attr, str_map)
    # IN: its smallest and largest value (lists are sorted)
    set_len = np.diff(rows.set_offsets)
    is_in = (op == opcodes.IN) & (set_len > 0)
    first = rows.set_offsets[:-1][is_in]
    set_lo = np.zeros(n)
    set_hi = np.zeros(n)
    set_lo[is_in] = rows.set_values[first]
    set_hi[is_in] = rows.set_values[rows.set_offsets[1:][is_in] - 1]
    set_lo = base_codes(set_lo, attr, string_attr, str_map)
    set_hi = base_codes(set_hi, attr, string_attr, str_map)
    k_lo = float_keys(lo_v)
    k_hi = float_keys(hi_v)
    low = np.full(n, KEY_MIN, np.uint64)
    high = np.full(n, KEY_MAX, np.uint64)
    is_string = np.zeros(n, bool)
    known = attr < len(string_attr)
    is_string[known] = string_attr[attr[known]] != 0
    one = np.uint64(1)
    eq = op == opcodes.EQ
    low[eq] = high[eq] = k_lo[eq]
    lt = op == opcodes.LT
    high[lt] = np.where(is_string[lt], k_lo[lt], k_lo[lt] - one)
    le = op == opcodes.LE
    high[le] = k_lo[le]
    gt = op == opcodes.GT
    low[gt] = np.where(is_string[gt], k_lo[gt], k_lo[gt] + one)
    ge = op == opcodes.GE
    low[ge] = k_lo[ge]
    between = op == opcodes.BETWEEN
    low[between] = k_lo[between]
    high[between] = k_hi[between]
    low[is_in] = float_keys(set_lo[is_in])
    high[is_in] = float_keys(set_hi[is_in])
    empty_in = (op == opcodes.IN) & (set_len == 0)
    low[empty_in] = KEY_MAX
    high[empty_in] = KEY_MIN
    return low, high, op != opcodes.IS_NULL


def unit_keys(units: Units, string_attr: np.ndarray, str_map: np.ndarray):
    """Per unit, its key interval on every attribute it constrains (CSR by
    unit, attributes ascending: the intersection of its predicates' Table 1
    intervals), and whether the unit can be TRUE at all (no empty
    intersection)."""
    low, high, has = interval_keys(units.rows, string_attr, str_map)
    return _unit_key_intervals(units.offsets, units.pids, units.rows.attr.astype(np.int64), low, high,
                               has.astype(np.uint8))


@njit(nogil=True, cache=True)
def _unit_key_intervals(unit_off, unit_pids, row_attr, low, high, has):
    n = len(unit_off) - 1
    k_off = np.zeros(n + 1, np.int64)
    k_attr = np.empty(len(unit_pids), np.int64)
    k_lo = np.empty(len(unit_pids), np.uint64)
    k_hi = np.empty(len(unit_pids), np.uint64)
    possible = np.ones(n, np.bool_)
    at = 0
    for u in range(n):
        start = at
        for j in range(unit_off[u], unit_off[u + 1]):
            pid = unit_pids[j]
            if not has[pid]:
                continue
            a = row_attr[pid]
            # insertion into the unit's few (attribute-sorted) entries; one attribute: intersect
            q = start
            while q < at and k_attr[q] < a:
                q += 1
            if q < at and k_attr[q] == a:
                k_lo[q] = max(k_lo[q], low[pid])
                k_hi[q] = min(k_hi[q], high[pid])
                continue
            for r in range(at, q, -1):
                k_attr[r] = k_attr[r - 1]
                k_lo[r] = k_lo[r - 1]
                k_hi[r] = k_hi[r - 1]
            k_attr[q] = a
            k_lo[q] = low[pid]
            k_hi[q] = high[pid]
            at += 1
        for q in range(start, at):
            if k_lo[q] > k_hi[q]:
                possible[u] = False
        k_off[u + 1] = at
    return (k_off, k_attr[:at].copy(), k_lo[:at].copy(), k_hi[:at].copy()), possible


def exact_equalities(rows, string_attr: np.ndarray, str_map: np.ndarray) -> np.ndarray:
    """Per row: an ``=`` whose key stands for its value alone (a number, or
    a string of the base dictionary: an odd base code), which an atomic
    bucket therefore decides."""
    attr = rows.attr.astype(np.int64)
    is_string = np.zeros(len(attr), bool)
    known = attr < len(string_attr)
    is_string[known] = string_attr[attr[known]] != 0
    base = base_codes(rows.lo, attr, string_attr, str_map)
    odd = np.mod(base, 2) == 1
    return ((rows.op == opcodes.EQ) & (~is_string | odd)).astype(np.uint8)


# ------------------------------------------------------------------ matcher
def leaf_values(l_head: np.ndarray, v_pid: np.ndarray, rows) -> LeafArrays:
    """The leaves' entries (``l_head``) with their predicates inline, read
    from ``rows`` (codes): per leaf predicate ``v_pid``, its closed interval
    (:func:`~gpu_kernels.betree.layout.interval_bounds`) or operands, and
    the IN and NOT IN lists copied in leaf order; an IN's interval is its
    first to last value."""
    v_op = rows.op[v_pid]
    v_min, v_max, _ = interval_bounds(v_op, rows.lo[v_pid], rows.hi[v_pid])
    set_len = np.diff(rows.set_offsets)[v_pid]
    v_set = np.concatenate(([0], np.cumsum(set_len)))
    v_set = v_set.astype(np.int32 if v_set[-1] < 2 ** 31 else np.int64)     # (one per leaf predicate)
    v_sets = rows.set_values[np.repeat(rows.set_offsets[:-1][v_pid] - v_set[:-1], set_len)
                             + np.arange(int(v_set[-1]))]
    is_in = (v_op == opcodes.IN) & (set_len > 0)
    v_min[is_in] = v_sets[v_set[:-1][is_in]]
    v_max[is_in] = v_sets[v_set[1:][is_in] - 1]
    v_pred = np.stack([rows.attr[v_pid].astype(np.float64) * 32 + v_op, v_min, v_max], axis=1)
    return LeafArrays(l_head, v_pid, np.ascontiguousarray(v_pred), v_set, v_sets)


class BETreeMatcher(HostMatcher):
    """BE-Tree on the host (see the module docstring).  Options: ``max_cap``
    (the l-node capacity, Table 4: 5 / 20 / 160 by matching probability),
    ``min_size`` (the fewest units an attribute must constrain to
    partition on it); ``schema`` (the index's schema view) keys strings."""

    name = "betree"

    @classmethod
    def construct(cls, segment: Segment, settings) -> "BETreeMatcher":
        return cls(segment, cls.backend, schema=settings.schema, dnf_limit=settings.dnf_limit,
                   **settings.options.keywords(cls.backend))

    def __init__(self, segment: Segment, backend: str = "cpu", *, schema=None, dnf_limit: int = DEFAULT_LIMIT,
                 max_cap: int = DEFAULT_MAX_CAP, min_size: int = DEFAULT_MIN_SIZE, theta: float | None = 0.0):
        if backend != "cpu":
            raise ValueError(f"BETreeMatcher runs on backend 'cpu', not {backend!r}")
        from engine.algorithms.options import BETreeOptions
        BETreeOptions(max_cap=max_cap, min_size=min_size, theta=theta)       # the values' checks
        self.theta = theta
        self.recycled = (0, 0)
        self._feedback = None
        self.segment = segment
        self.schema = schema
        self.dnf_limit = int(dnf_limit)
        self.max_cap = int(max_cap)
        self.min_size = int(min_size)
        self.base_strings = schema.n_strings if schema is not None else 0
        self._read_segment()
        dyn = self._dynamic_tree(None, None)
        dyn.insert(np.flatnonzero(self._possible))
        self._set_tree(dyn.freeze())
        self.merges = 0

    # --------------------------------------------------------------- parts
    def _read_segment(self) -> None:
        """Units, string attributes, the base-code map and the units' keys
        of this matcher's segment under its schema."""
        seg = self.segment
        if seg.predicates.lo is None:
            if self.schema is None:
                raise ValueError("the segment's predicates are not coded yet: recode them or pass schema=")
            seg.predicates.recode(self.schema)
        self.units = dnf_units(seg, self.dnf_limit)
        n_attrs = int(self.units.rows.attr.max(initial=-1)) + 1
        self.string_attr = string_attributes(self.schema, n_attrs)
        self.str_map = string_map(self.schema, self.base_strings)
        self._keys, self._possible = unit_keys(self.units, self.string_attr, self.str_map)

    def _dynamic_tree(self, flat: BETreeArrays | None, unit_map) -> DynamicTree:
        n_attrs = len(self.string_attr) + 1
        if flat is None:
            return DynamicTree(len(self.units), self.keys, n_attrs, self.max_cap, self.min_size)
        return DynamicTree.thawed(flat, unit_map, len(self.units), self.keys, n_attrs, self.max_cap,
                                  self.min_size)

    @property
    def keys(self):
        """The units' key intervals (CSR by unit): made when the segment is
        read, dropped once the tree is flattened (at a million subscriptions
        they weigh as much as the leaves), made again when asked for."""
        if self._keys is None:
            self._keys, _ = unit_keys(self.units, self.string_attr, self.str_map)
        return self._keys

    def _set_tree(self, tree: BETreeArrays) -> None:
        self._keys = None
        self.tree = tree
        units = self.units
        exact = exact_equalities(units.rows, self.string_attr, self.str_map)
        l_sub, l_verify, v_pid = leaf_arrays(tree.c_depth, tree.c_child, tree.c_leaf, tree.c_pdir, tree.p_attr,
                                             tree.p_top, tree.leaf_unit, units.sub, units.offsets, units.pids,
                                             units.rows.attr, units.rows.op, exact)
        l_head = np.stack([np.append(l_sub, -1), l_verify], axis=1)
        self.leaf = leaf_values(l_head, v_pid, units.rows)
        rows = units.rows
        n_attrs = max(int(rows.attr.max(initial=-1)), int(tree.p_attr.max(initial=-1))) + 1
        self.table = NodeTable(*K.node_table(tree.c_depth, tree.c_child, tree.c_leaf, tree.c_pdir, tree.p_top),
                               max(n_attrs, 1))
        self._matches_per_event = 16.0

    def _derived(self, segment: Segment, schema) -> "BETreeMatcher":
        new = object.__new__(type(self))
        new.__dict__.update(self.__dict__)
        new.segment = segment
        new.schema = schema
        new._read_segment()
        return new

    # -------------------------------------------------------------- updates
    def merged(self, segment: Segment, old_to_new, added, schema=None) -> "BETreeMatcher":
        """The merge protocol without a rebuild: the removed subscriptions'
        units deleted from a thawed copy of the tree, the added ones
        inserted one at a time (Algorithm 3), the result flattened."""
        old = self.units
        new = self._derived(segment, schema if schema is not None else self.schema)
        old_to_new = np.asarray(old_to_new, np.int64)
        # a subscription kept with one unit keeps it; a DNF of several is
        # re-inserted (its conjunctions' order is to_dnf's, not a key)
        n_old_units = np.diff(old.first)
        new_sub = old_to_new[old.sub]
        single = (n_old_units[old.sub] == 1) & (new_sub >= 0)
        single[single] = np.diff(new.units.first)[new_sub[single]] == 1
        unit_map = np.full(len(old), -1, np.int64)
        unit_map[single] = new.units.first[new_sub[single]]
        dyn = new._dynamic_tree(self.tree, unit_map)
        new.recycled = self._recycle(dyn, unit_map)
        new._feedback = None
        kept = np.zeros(len(new.units), bool)
        kept[unit_map[single]] = True
        fresh = np.flatnonzero(~kept & new._possible)
        dyn.insert(fresh)
        new._set_tree(dyn.freeze())
        new.merges = self.merges + 1
        return new

    # ------------------------------------------------------ recycling (§5)
    #: events kept from the last match call to measure §5's loss at the next merge
    FEEDBACK_EVENTS = 256

    def _keep_feedback(self, batch, ev_key, pattern_truth, list_truth) -> None:
        """Keep (a copy of) the first events of a match call: the window of
        matching operations §5's loss is measured on at the next merge."""
        n = min(batch.n_events, self.FEEDBACK_EVENTS)
        stop = int(batch.offsets[n])
        self._feedback = (n, batch.offsets[:n + 1].copy(), batch.attr[:stop].copy(), batch.value[:stop].copy(),
                          batch.token[:stop].copy(), ev_key[:stop].copy(), pattern_truth, list_truth)

    def _loss(self) -> np.ndarray | None:
        """§5's Loss per c-node of this tree: the predicate evaluations its
        l-node discarded (units that failed), averaged over the kept events."""
        if self._feedback is None:
            return None
        n, offsets, attr, value, token, ev_key, truth, list_truth = self._feedback
        loss = np.zeros(len(self.tree.c_depth), np.int64)
        out = np.empty(1, np.int32)
        ev_count = np.zeros(n, np.int64)
        stop, need = np.empty(1, np.int64), np.empty(1, np.int64)
        # (cap 0: nothing is written, each event stops the task; resumed one event at a time)
        for e in range(n):
            K.betree_match_serial(np.array([e]), np.array([e + 1]), out, 0, ev_count, stop, need, len(self.segment),
                                  offsets, attr, value, token, ev_key, truth, list_truth, self.table, self.tree.p_attr,
                                  self.leaf, self.units.rows, alive_flags(np.ones(len(self.segment), np.uint8)), loss)
        return loss / max(n, 1)

    def _recycle(self, dyn: DynamicTree, unit_map: np.ndarray) -> tuple[int, int]:
        """l-node recycling (§5): each p-node's rank -- its gain (the score:
        covered and subsumed predicates below it) minus its loss on the kept
        events -- below ``theta`` gets the units of its subtree removed and
        inserted again (outermost p-nodes first; nested ones go with them).
        Returns (p-nodes, units) recycled."""
        loss = self._loss() if self.theta is not None else None
        if loss is None or not len(self.tree.p_attr):
            return 0, 0
        tree = self.tree
        end = subtree_ends(tree.c_child, tree.c_pdir, tree.p_top)
        cum = np.concatenate(([0.0], np.cumsum(loss)))
        tops = tree.p_top.astype(np.int64)
        rank = np.array([dyn.score(k) for k in range(len(tops))], np.float64) - (cum[end[tops]] - cum[tops])
        chosen, covered_to = [], -1
        for k in np.argsort(tops, kind="stable"):
            if rank[k] < self.theta and tops[k] >= covered_to:
                chosen.append(k)
                covered_to = end[tops[k]]
        if not chosen:
            return 0, 0
        units = np.concatenate([unit_map[tree.leaf_unit[tree.c_leaf[tops[k]]:tree.c_leaf[end[tops[k]]]]]
                                for k in chosen])
        units = units[units >= 0]
        dyn.delete(units)
        dyn.insert(units)
        return len(chosen), len(units)

    def recoded(self, segment: Segment, schema) -> "BETreeMatcher":
        """The same tree under a grown string dictionary: keys are base
        codes, so the tree, its node table and which unit sits where do not
        change; the units' rows are mapped to the new codes
        (:func:`~engine.algorithms.units.recoded_units`), the leaves' inline
        predicates taken from them again, and the base-code map made anew.
        (Where the mapped rows are not ``segment``'s own codes, the segment
        is read again, as a merge reads it.)"""
        if segment is self.segment:
            return self
        recoded = recoded_units(self.units, self.schema, segment, schema)
        if recoded is None:
            new = self._derived(segment if segment.predicates.lo is not None else segment.coded(schema), schema)
            new._set_tree(self.tree)         # the leaf arrays hold the predicates' codes inline
            return new
        new = object.__new__(type(self))
        new.__dict__.update(self.__dict__)
        new.segment, new.schema, new.units = recoded.segment, schema, recoded.units
        new.str_map = string_map(schema, self.base_strings)
        if recoded.units is not self.units:       # (else no code of its predicates moved)
            new.leaf = leaf_values(self.leaf.l_head, self.leaf.v_pid, recoded.units.rows)
        return new

    # ------------------------------------------------------------- matching
    def runs(self, batch, pattern_truth: np.ndarray, alive: np.ndarray) -> Runs:
        n_events = batch.n_events
        n_subs = len(self.segment)
        if n_events == 0 or n_subs == 0:
            return Runs.empty(n_events)
        alive = alive_flags(alive)
        pattern_truth = np.ascontiguousarray(pattern_truth, dtype=np.uint8)
        list_truth = list_truth_of(batch)
        ev_key = event_keys(batch.value, batch.attr, self.string_attr, self.str_map)
        table, p_attr, leaf, rows = self.table, self.tree.p_attr, self.leaf, self.units.rows

        def launch(first, last, out, cap, ev_count, stop, need, serial):
            kernel = K.betree_match_serial if serial else K.betree_match_kernel
            kernel(first, last, out, cap, ev_count, stop, need, n_subs, batch.offsets, batch.attr, batch.value,
                   batch.token, ev_key, pattern_truth, list_truth, table, p_attr, leaf, rows, alive, no_loss)
        no_loss = np.zeros(0, np.int64)
        runs, self._matches_per_event = match_in_tasks(n_events, launch, self._matches_per_event)
        if self.theta is not None:
            self._keep_feedback(batch, ev_key, pattern_truth, list_truth)
        return runs

    # --------------------------------------------------------------- memory
    @property
    def nbytes(self) -> int:
        arrays = list(self.tree) + list(self.leaf) + list(self.table[:2]) + list(self.units[:4]) + list(self.units.rows)
        return self.segment.nbytes + sum(int(a.nbytes) for a in arrays)

    def statistics(self) -> dict:
        """The tree's shape: node counts, depths, l-node sizes."""
        tree = self.tree
        sizes = np.diff(tree.c_leaf)
        return {"units": len(self.units), "indexed_units": len(tree.leaf_unit), "c_nodes": len(tree.c_depth),
                "p_nodes": len(tree.p_attr), "root_units": int(sizes[0]),
                "largest_leaf": int(sizes.max(initial=0)), "atomic_buckets": int((tree.c_depth == 64).sum()),
                "deepest_bucket": int(tree.c_depth.max(initial=0)),
                "verified_predicates": len(self.leaf.v_pid), "unit_predicates": len(self.units.pids),
                "recycled_p_nodes": self.recycled[0], "recycled_units": self.recycled[1]}

    # ---------------------------------------------------------- persistence
    SAVED_FORMAT = 1
    _META = {"format": int, "max_cap": int, "min_size": int, "dnf_limit": int, "base_strings": int, "units": int,
             "merges": int}

    def to_arrays(self):
        meta = {"format": self.SAVED_FORMAT, "max_cap": self.max_cap, "min_size": self.min_size,
                "dnf_limit": self.dnf_limit, "base_strings": self.base_strings, "units": len(self.units),
                "merges": self.merges}
        return meta, dict(self.tree._asdict())

    @classmethod
    def from_arrays(cls, segment: Segment, settings, meta: dict, arrays: dict) -> "BETreeMatcher":
        """The saved tree, checked (ValueError for anything a build could
        not have made), without building."""
        for key, kind in cls._META.items():
            if not isinstance(meta.get(key), kind) or isinstance(meta.get(key), bool):
                raise ValueError(f"saved BE-Tree: meta {key!r} missing or not {kind.__name__}")
        if meta["format"] != cls.SAVED_FORMAT:
            raise ValueError(f"saved BE-Tree: format {meta['format']} (this version reads {cls.SAVED_FORMAT})")
        options = settings.options.keywords("cpu")
        if meta["max_cap"] != options["max_cap"] or meta["min_size"] != options["min_size"] \
                or meta["dnf_limit"] != settings.dnf_limit:
            return cls.build(segment, settings)        # other parameters: this file's tree is not the one asked for
        schema = settings.schema
        if not 0 <= meta["base_strings"] <= (schema.n_strings if schema is not None else 0):
            raise ValueError("saved BE-Tree: base dictionary larger than the index's")
        missing = sorted(set(BETreeArrays._fields) - set(arrays))
        if missing:
            raise ValueError(f"saved BE-Tree: arrays {missing} missing")
        tree = BETreeArrays(*(arrays[name] for name in BETreeArrays._fields))
        new = object.__new__(cls)
        new.segment, new.schema, new.dnf_limit = segment, schema, settings.dnf_limit
        new.max_cap, new.min_size, new.base_strings = meta["max_cap"], meta["min_size"], meta["base_strings"]
        new.theta, new.recycled, new._feedback = options["theta"], (0, 0), None
        new.settings = settings
        new._read_segment()
        if len(new.units) != meta["units"]:
            raise ValueError(f"saved BE-Tree: {meta['units']} units, the segment has {len(new.units)}")
        check_arrays(tree, len(new.units))
        indexed = np.zeros(len(new.units), bool)
        indexed[tree.leaf_unit] = True
        if not np.array_equal(indexed, new._possible):
            raise ValueError("saved BE-Tree: its leaves do not hold exactly the segment's units")
        bad = misplaced_unit(tree.c_depth, tree.c_child, tree.c_leaf, tree.c_pdir, tree.p_attr, tree.p_top,
                             tree.leaf_unit, *new.keys)
        if bad >= 0:
            raise ValueError(f"saved BE-Tree: unit {bad} sits in a bucket that does not enclose it")
        new._set_tree(tree)
        new.merges = meta["merges"]
        return new

    def __repr__(self) -> str:
        s = self.statistics()
        return (f"BETreeMatcher({len(self.segment)} subscriptions, {s['units']} units, {s['c_nodes']} c-nodes, "
                f"{s['p_nodes']} p-nodes, max_cap={self.max_cap}, min_size={self.min_size})")


__all__ = ["BETreeMatcher", "check_expression", "interval_keys", "unit_keys", "string_map"]
