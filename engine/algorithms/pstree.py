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
  LIKE, MATCHES, their negations, IS [NOT] NULL and the list operators
  (ONE OF ... IS NOT EMPTY: the event list decides them, through the
  batch's list table) cover none (what they decide is not a code range)
  and are never access predicates.  Codes are
  exact for every covered operator (docs/adding-an-algorithm.md §1).
* **Predicate selectivity** (§3.3): each unit's access predicate(s) are its
  most selective ones: with an ``event_log`` (an EventBatch), the fewest
  logged events in the spaces the predicate covers (the leaves' event
  counters); then -- and alone without a log -- the operator ranking ``=`` >
  IN > BETWEEN > ``<``/``<=``/``>``/``>=`` > NOT IN > NOT BETWEEN > ``!=``;
  then the narrower share of its attribute's elementary ranges ("wider
  value sets have lower selectivity"; a share, so that attributes with
  different domains compare).  The paper puts the event history first when
  there is one ("if no historical events exist, we heuristically rank"),
  and so does this.
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
* **Probe order** (ours; the paper does not lay out memory): the kernels
  read the lists and the units renumbered in the order the lists first
  name them (:meth:`_PSTreeMatcher._lay_out`), so that an event, visiting
  its spaces and keys in ascending order, reads its candidates' units
  front to back; :meth:`_PSTreeMatcher.unit_structure` gives the
  structure in the units' own numbers, from which merges derive.
* **64 events a group** (ours; ``lanes=64``, the default on cpu, for
  both): a batch's events are taken 64 at a time
  (:func:`gpu_kernels.pstree.cpu.lanes_task`).  Each event probes its keys
  as Algorithm 7 does (PSTHash) or reads its located spaces (PSTBloom),
  but a group or list it finds only gets the event's bit; then the lists
  reached are read once, ascending, and each of their units is verified
  once for the events that reached it, from its checks in probe order
  (:class:`gpu_kernels.pstree.cpu.UnitChecks`: attribute and
  :func:`~gpu_kernels.predicates.interval_form`, beside ``pids``; a
  comparison is two bounds, every other operator ``entry_truth``).  The
  same candidates, the same truth, each unit read once for up to 64 events
  instead of once for each: on W2 at 1 M, 2.6x the one-event kernel for
  PSTHash and 2.7x for PSTBloom (BENCHMARKS.md).  PSTBloom's signatures
  are not probed there: a lane's probe costs what its exact check does.
  ``lanes=1`` keeps the paper's one event at a time.
* **Units with no indexable predicate** (only LIKE, MATCHES, their
  negations, IS [NOT] NULL and list operators; or no predicate at all:
  constant TRUE) are candidates for every event (an *always* list): no
  subscription is dropped.
* **Exactness**: a space decides its access predicate (its value lies in a
  covered space), so the exact check skips it -- but for a NaN value,
  placed in the leftmost space; every other predicate is evaluated by
  :func:`gpu_kernels.predicates.entry_truth` under three-valued logic (an
  absent attribute makes it NULL, the unit not TRUE).
* **Dynamic adjustment** (§4.4; insertion and deletion of §5-§6): a
  merge derives the next structure from this one (:meth:`merged`) instead
  of building it.  The paper's leaf *predicate counters* are kept at the
  cuts: per elementary range, how many cutting predicates (PSTBloom: every
  indexable one; PSTHash: the access predicates) start there or end just
  before, and per attribute how many cut its tree.  The removed units'
  cuts are subtracted; the added units' endpoints are merged into the
  boundaries -- the *split*: each new elementary range lies in one old
  space, whose list, signature and keys the pieces inherit -- and their
  cuts added; spaces then start where a counter is positive, so adjacent
  spaces no surviving predicate separates any more are one again (the
  *merge* of §4.4's example) and endpoints that stopped being boundaries
  are dropped.  The result is the PS-Trees a build cuts from the same
  predicates.  Survivors (a subscription kept with one unit of the same
  predicates) keep their access predicates; added units are ranked by
  §3.3 against the spaces they meet (widths over the old boundaries and
  their own endpoints, the event log if one was given).  PSTBloom: each
  space's list is its source's without the removed units, plus the added
  units whose access predicate covers it; its signature is its source's
  words with the added units' bits -- a Bloom filter cannot forget, so a
  removed unit's stale bits stay, costing candidates that the exact check
  rejects; a space's signature is sized and filled afresh when more than
  :attr:`PSTBloomMatcher.STALE_SHARE` of the units it holds are gone or
  copying would put twice the units it was sized for in it.  Units keep
  their Bloom key across merges (``BloomArrays.key``: unit ids are
  renumbered, the copied bits are of the old ids).  PSTHash (§6.2: "the
  records associated with the old space ID ... are copied to new records
  using the new space ID"): every old key goes to the combinations of its
  spaces' pieces with its surviving units, then the added units' keys;
  when no space split or merged, the table itself is kept and only its
  groups refilled.  A survivor's unit is kept when the unit of the same
  rank in its new DNF has the same predicates (the DNF of an unchanged
  expression comes in the same order); one whose codes moved (a grown
  string dictionary) is re-inserted like an added one.
  Past :attr:`REBUILD_SHARE` of the built units added and removed (the
  survivors' ranking ages, and removed units leave stale bits and empty
  keys), the merge rebuilds.  A grown string dictionary (a subscription
  added with a new string) moves codes but not their order:
  :meth:`recoded` maps the boundaries and the rows to the new codes and
  keeps everything else.  Saving the structure (``to_arrays``): the
  default, a rebuild on load.  (The cuda matchers, :mod:`engine.algorithms.pstree_cuda`,
  serve this very structure from the device, derived on the host.)
"""

from __future__ import annotations

import copy

import numba
import numpy as np

from engine.algorithms.base import HostMatcher, alive_flags, list_truth_of
from engine.algorithms.host_tasks import SERIAL_EVENTS, Runs, match_in_tasks, sort_on_every_core
from engine.algorithms.units import check_dnf, dnf_units, recoded_units
from engine.compile import Segment
from engine.expr import Node
from gpu_kernels import opcodes
from gpu_kernels.pstree import cpu as K
from gpu_kernels.string_codes import recoded_values

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
def grouped_keys(keys: np.ndarray, owner: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """PSTHash's N-dim keys (components >= -1, -1 padding) and their units,
    grouped: ``(group_keys, group_off, owner)`` -- the distinct keys
    ascending, and per group its units ``owner[group_off[g]:group_off[g + 1]]``
    ascending (int32).  When a key and its unit pack into 62 bits (W2: two
    space ids of ~10^4 and a unit id), one sort of the packed int64 does it
    (:func:`_grouped_packed`); else ``np.lexsort``."""
    width = keys.shape[1]
    key_bits = (int(keys.max(initial=-1)) + 1).bit_length()   # components + 1 in [0, 2^key_bits)
    owner_bits = max(int(owner.max(initial=0)).bit_length(), 1)
    if width * key_bits + owner_bits <= 62:
        return _grouped_packed(K.pack_keys(keys, owner, key_bits, owner_bits), width, key_bits, owner_bits)
    order = np.lexsort((owner,) + tuple(keys[:, q] for q in range(width - 1, -1, -1)))
    keys, out_owner = keys[order], owner[order].astype(np.int32, copy=False)
    first = np.ones(len(keys), bool)
    first[1:] = (keys[1:] != keys[:-1]).any(axis=1)
    starts = np.flatnonzero(first)
    return keys[starts], np.append(starts, len(first)).astype(np.int64), out_owner


def _grouped_packed(packed: np.ndarray, width: int, key_bits: int, owner_bits: int):
    """:func:`grouped_keys` of keys packed by :func:`~gpu_kernels.pstree.cpu.pack_keys`
    (sorted here, in place, a slice per core then merged): numpy sorts int64
    values with SIMD, 25x faster than ``np.lexsort`` of the three columns on
    7 M random keys (0.09 s against 2.2 s); unpacking is kernels over every
    core, and only the distinct keys are unpacked."""
    sort_on_every_core(packed)
    out_owner = np.empty(len(packed), np.int32)
    first = np.empty(len(packed), np.bool_)
    K.unpack_owners(packed, owner_bits, out_owner, first)
    starts = np.flatnonzero(first)
    # (components below 2**31: int32 straight away, as the matcher keeps them -- :func:`_narrowed`)
    group_keys = np.empty((len(starts), width), np.int32 if key_bits <= 31 else np.int64)
    K.unpack_group_keys(packed, starts, key_bits, owner_bits, group_keys)
    group_off = np.empty(len(starts) + 1, np.int64)
    group_off[:-1] = starts
    group_off[-1] = len(first)
    return group_keys, group_off, out_owner


def grouped_space_combinations(unit_off, pids, acc, arity, row_attr, cov_off, cov_first, cov_last, width: int,
                               n_spaces: int):
    """:func:`~gpu_kernels.pstree.cpu.space_combinations` grouped as
    :func:`grouped_keys` groups them -- when a key (components below
    ``n_spaces``) and its unit fit in 62 bits, packed by the kernel as it
    enumerates them (at W2's 1 M, 35 M keys: no 560 MB key matrix to fill,
    then pack)."""
    key_bits = max(int(n_spaces).bit_length(), 1)           # components + 1 in [0, n_spaces]; > 0: packed
    owner_bits = max((len(unit_off) - 2).bit_length(), 1)   # units below len(unit_off) - 1
    if width * key_bits + owner_bits <= 62:
        packed = K.space_combinations(unit_off, pids, acc, arity, row_attr, cov_off, cov_first, cov_last, width,
                                      key_bits, owner_bits)[2]
        return _grouped_packed(packed, width, key_bits, owner_bits)
    # (0, 0: unpacked; passed, not left to the defaults, which numba would compile a kernel apart for)
    keys, owner, _ = K.space_combinations(unit_off, pids, acc, arity, row_attr, cov_off, cov_first, cov_last, width,
                                          0, 0)
    return grouped_keys(keys, owner)


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
    # distinct (attribute, value) pairs, sorted: the values ranked, then one int64 sort of attribute << 32 | rank
    # (numpy sorts int64 with SIMD; np.lexsort of the two columns took 0.25 s a call on W2 at 200 K)
    distinct, rank = np.unique(value, return_inverse=True)
    pairs = np.unique((attr << 32) | rank.astype(np.int64))
    attr, value = pairs >> 32, distinct[pairs & 0xFFFFFFFF]
    val_off = np.searchsorted(attr, np.arange(n_attrs + 1)).astype(np.int64)
    return val_off, value


def predicate_spaces(rows, use: np.ndarray, defining: np.ndarray, n_attrs: int, elem=None):
    """The PS-Trees whose spaces the ``defining`` rows cut (endpoints from
    every ``use`` row, so that shares of elementary ranges compare across
    builds).  Returns ``(table, cov, elem)``: the
    :class:`~gpu_kernels.pstree.cpu.SpaceTable`; per defining row the global
    space ranges it covers (``cov_off``, ``cov_first``, ``cov_last``: CSR,
    inclusive); and ``elem`` -- the elementary view (global elementary
    index of each interval, for the ranking): ``(iv_off, g_first, g_last,
    eoff, val_off, vals)``.  Given the ``elem`` of a call on the same
    ``rows`` and ``use`` (PSTHash cuts its PS-Trees on the grid of the full
    ones), the endpoints and intervals are not computed again."""
    n_rows = len(rows.op)
    if elem is None:
        val_off, vals = endpoints(rows, use, n_attrs)
        iv_off, iv_first, iv_last = K.row_intervals(rows.op, rows.attr, rows.lo, rows.hi, rows.set_offsets,
                                                    rows.set_values, use.astype(np.uint8), val_off, vals)
        eoff = 2 * val_off[:-1] + np.arange(n_attrs)
        row_of_iv = np.repeat(np.arange(n_rows), np.diff(iv_off))
        iv_attr = rows.attr[row_of_iv].astype(np.int64)
        g_first = eoff[iv_attr] + iv_first
        g_last = eoff[iv_attr] + iv_last
    else:
        iv_off, g_first, g_last, eoff, val_off, vals = elem
        row_of_iv = np.repeat(np.arange(n_rows), np.diff(iv_off))
        iv_attr = rows.attr[row_of_iv].astype(np.int64)
    m = np.diff(val_off)
    n_elem = 2 * len(vals) + n_attrs
    elem_attr = np.repeat(np.arange(n_attrs), 2 * m + 1)
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



def limit_combinations(acc: np.ndarray, arity: np.ndarray, n_cov: np.ndarray, max_combinations: int) -> None:
    """PSTHash's departure (module docstring), in place: while a unit's
    access predicates would make more than ``max_combinations`` keys (the
    product of the spaces each covers, ``n_cov`` per access slot), drop its
    least selective one -- down to one.  ``acc``: per unit the access
    predicates' positions, best first, -1 padded; ``arity``: how many."""
    while True:
        prod = np.where(acc >= 0, n_cov, 1.0).prod(axis=1) if acc.shape[1] else np.ones(len(arity))
        over = (prod > max_combinations) & (arity > 1)
        if not over.any():
            return
        acc[over, arity[over] - 1] = -1
        arity[over] -= 1


# ------------------------------------------------------ dynamic adjustment (§4.4)
def weighted_intervals(rows, weight: np.ndarray, table) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """The elementary ranges (global, inclusive, on ``table``'s grid) where
    each row of ``weight > 0`` is TRUE, with its attribute and weight (how
    many unit positions hold the row).  Every endpoint of such a row must be
    on the grid."""
    n_attrs = len(table.val_off) - 1
    iv_off, first, last = K.row_intervals(rows.op, rows.attr, rows.lo, rows.hi, rows.set_offsets, rows.set_values,
                                          (weight > 0).astype(np.uint8), table.val_off, table.vals)
    row_of_iv = np.repeat(np.arange(len(rows.op)), np.diff(iv_off))
    attr = rows.attr[row_of_iv].astype(np.int64)
    eoff = 2 * table.val_off + np.arange(n_attrs + 1)
    return eoff[attr] + first, eoff[attr] + last, attr, weight[row_of_iv].astype(np.int64)


def cut_counters(first, last, attr, weight, n_elem: int, n_attrs: int) -> tuple[np.ndarray, np.ndarray]:
    """§4.1's predicate counters, at the cuts: per elementary range, how
    many cutting predicates start there or end just before (a space starts
    where this is positive), and per attribute how many cut its tree (it has
    one while this is positive)."""
    cuts = np.bincount(first, weights=weight, minlength=n_elem + 1) + \
        np.bincount(last + 1, weights=weight, minlength=n_elem + 1)
    trees = np.bincount(attr, weights=weight, minlength=n_attrs)
    return np.rint(cuts).astype(np.int64), np.rint(trees).astype(np.int64)


def union_grid(table, add_off: np.ndarray, add_vals: np.ndarray, n_attrs: int):
    """The old boundaries and the added endpoints, per attribute
    (``n_attrs`` >= the old count): ``(val_off, vals, first_u,
    parent_elem)``, where old elementary range ``g`` became the new ranges
    ``first_u[g]:first_u[g + 1]`` (the split: each piece lies in the old
    range's space) and ``parent_elem`` is the inverse (-1 on attributes the
    old table did not have)."""
    n_old = len(table.val_off) - 1
    a_old = np.repeat(np.arange(n_old), np.diff(table.val_off))
    attr = np.concatenate((a_old, np.repeat(np.arange(len(add_off) - 1), np.diff(add_off))))
    value = np.concatenate((table.vals, add_vals))
    order = np.lexsort((value, attr))
    s_attr, s_value = attr[order], value[order]
    first = np.ones(len(order), bool)
    first[1:] = (s_attr[1:] != s_attr[:-1]) | (s_value[1:] != s_value[:-1])
    rank = np.empty(len(order), np.int64)
    rank[order] = np.cumsum(first) - 1
    vals = s_value[first]
    val_off = np.searchsorted(s_attr[first], np.arange(n_attrs + 1)).astype(np.int64)
    eo = 2 * table.val_off + np.arange(n_old + 1)
    eu = 2 * val_off + np.arange(n_attrs + 1)
    first_u = np.empty(eo[-1] + 1, np.int64)
    first_u[eo] = eu[:n_old + 1]
    k = np.arange(len(table.vals))
    point_old = eo[a_old] + 2 * (k - table.val_off[a_old]) + 1
    point_new = eu[a_old] + 2 * (rank[:len(table.vals)] - val_off[a_old]) + 1
    first_u[point_old] = point_new              # [v] stays [v] ...
    first_u[point_old + 1] = point_new + 1      # ... and the gap after it starts after it
    parent_elem = np.full(eu[-1], -1, np.int64)
    parent_elem[:eu[n_old]] = np.repeat(np.arange(eo[-1]), np.diff(first_u))
    return val_off, vals, first_u, parent_elem


def cut_spaces(val_off: np.ndarray, vals: np.ndarray, cuts: np.ndarray, trees: np.ndarray):
    """The PS-Trees the counters give on a grid: a space starts where a
    cutting predicate starts or after one ends (as :func:`predicate_spaces`
    cuts them, so adjacent ranges covered by the same predicates are one
    space: §4.4's merge), and endpoints that stop being boundaries (no
    predicate starts at ``[v]`` nor after it) are dropped.  Returns the
    :class:`~gpu_kernels.pstree.cpu.SpaceTable`, the counters on its grid,
    and per range of the given grid its space and whether a space starts
    there."""
    n_attrs = len(val_off) - 1
    eoff = 2 * val_off + np.arange(n_attrs + 1)
    n_elem = int(eoff[-1])
    has_tree = trees > 0
    elem_attr = np.repeat(np.arange(n_attrs), np.diff(eoff))
    start = cuts[:n_elem] > 0
    start[eoff[:-1]] = True
    start &= has_tree[elem_attr]
    space = np.cumsum(start) - 1
    space[~has_tree[elem_attr]] = -1
    space_off = np.concatenate(([0], np.cumsum(np.bincount(elem_attr[start], minlength=n_attrs)))).astype(np.int64)
    val_attr = np.repeat(np.arange(n_attrs), np.diff(val_off))
    eg = eoff[val_attr] + 2 * (np.arange(len(vals)) - val_off[val_attr])
    keep = ((cuts[eg + 1] > 0) | (cuts[eg + 2] > 0)) & has_tree[val_attr]
    keep_elem = np.ones(n_elem + 1, bool)
    keep_elem[eg[~keep] + 1] = False            # [v] and the gap after it join the gap before
    keep_elem[eg[~keep] + 2] = False
    new_off = np.concatenate(([0], np.cumsum(np.bincount(val_attr[keep], minlength=n_attrs)))).astype(np.int64)
    table = K.SpaceTable(new_off, vals[keep].astype(np.float64), space[keep_elem[:n_elem]].astype(np.int64), space_off)
    return table, cuts[keep_elem], space, start


def _positions(offsets: np.ndarray, units: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The positions (into ``pids``) of the given units, and their CSR."""
    lens = np.diff(offsets)[units]
    off = np.concatenate(([0], np.cumsum(lens))).astype(np.int64)
    return np.repeat(offsets[units] - off[:-1], lens) + np.arange(off[-1]), off


def _moved(acc: np.ndarray, old_off: np.ndarray, new_off: np.ndarray) -> np.ndarray:
    """Access positions of kept units (rows of ``acc``) in the new ``pids``."""
    shift = (new_off - old_off).reshape((-1,) + (1,) * (acc.ndim - 1))
    return np.where(acc >= 0, acc + shift, -1)


def _covered(iv_off, first, last, space, rows_of):
    """Per position (its row in ``rows_of``): one record per interval of
    the row -- ``(position index, first space, last space)`` -- with the
    intervals' elementary ranges mapped to spaces by ``space``."""
    n = np.diff(iv_off)[rows_of]
    idx = np.repeat(np.arange(len(rows_of)), n)
    iv = np.repeat(iv_off[rows_of] - np.concatenate(([0], np.cumsum(n)))[:-1], n) + np.arange(int(n.sum()))
    return idx, space[first[iv]], space[last[iv]]

def _space_counts(s_first: np.ndarray, s_last: np.ndarray, weight: np.ndarray, n_spaces: int) -> np.ndarray:
    """Per space, the summed weight of the ranges ``[s_first, s_last]`` holding it."""
    diff = np.bincount(s_first, weights=weight, minlength=n_spaces + 1) - \
        np.bincount(s_last + 1, weights=weight, minlength=n_spaces + 1)
    return np.rint(np.cumsum(diff)[:n_spaces]).astype(np.int64)


def _narrowed(group_key: np.ndarray, group_off: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """PSTHash's group keys (space ids) and group offsets as int32 where
    they fit, which is always but past 2**31 spaces or key entries: 12
    bytes a group fewer than int64 (W2 at 1 M: 15.8 M groups, 181 MiB of
    the index's 1.0 GiB).  The kernels read either."""
    limit = np.iinfo(np.int32).max
    if not len(group_key) or int(group_key.max()) < limit:
        group_key = np.ascontiguousarray(group_key, np.int32)
    if int(group_off[-1]) < limit:
        group_off = group_off.astype(np.int32)
    return group_key, group_off


# ----------------------------------------------------------------- matchers
class _PSTreeMatcher(HostMatcher):
    """What PSTBloom and PSTHash share: units, PS-Trees, access predicates."""

    #: the units' checks in probe order that the batch kernel reads (UnitChecks), once made
    _checks: tuple = ()
    #: events verified together on cpu (option ``lanes``: 64, or 1 for the paper's one at a time)
    lanes: int = K.LANES

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
        self._event_log = event_log
        self.merges = 0                           # derivations (§4.4) since the last build
        self._cuts = None                         # (cut counters, tree counters): see _cut_state
        self.units = units = dnf_units(seg, self.dnf_limit)
        rows = units.rows
        self.n_attrs = int(rows.attr.max(initial=-1)) + 1
        used = np.zeros(len(rows.op), bool)
        used[units.pids] = True
        self.indexable = used & (K.OPERATOR_CLASS[rows.op.astype(np.int64)] != K.NOT_INDEXABLE)
        # the full PS-Trees (every indexable predicate) and the ranking they give
        self._full = predicate_spaces(rows, self.indexable, self.indexable, self.n_attrs)
        self.row_class, self.row_width, self.row_events = selectivity(rows, self._full[2], self.n_attrs, event_log)
        self._churn, self._built_units = 0, len(units)

    def _select(self, n_access: int):
        u = self.units
        return K.select_access(u.offsets, u.pids.astype(np.int64), u.rows.attr.astype(np.int64), self.row_class,
                               self.row_width, self.row_events, n_access)

    # ---------------------------------------------------- updates (§4.4)
    #: a merge rebuilds once the units added and removed since the last
    #: build exceed this share of the index's units: the survivors keep the
    #: access predicates of their ranking (§3.3's widths and event counts of
    #: that time), as the paper's inserts keep those of the index they met
    REBUILD_SHARE = 0.5

    def merged(self, segment: Segment, old_to_new, added, schema=None):
        """The matcher of ``segment``, the Index's next main segment, derived
        from this one (§4.4's dynamic adjustment; the merge protocol of
        :mod:`engine.algorithms.base`): the removed units leave the lists,
        keys and predicate counters, the spaces no surviving predicate
        separates any more merge, the added units' endpoints split the
        spaces they fall in (their lists, signatures and keys copied to the
        pieces) and the added units go where their access predicates --
        ranked as a build ranks them, against these spaces -- cover.
        Survivors keep their access predicates (a survivor's unit whose codes
        moved is re-inserted).  Rebuilt instead when the
        churn since the last build passes :attr:`REBUILD_SHARE`.  This
        matcher is unchanged; ``merges`` counts derivations since the build."""
        schema = self.schema if schema is None else schema
        derived = self._derived(segment, np.asarray(old_to_new, np.int64), schema)
        if derived is None:
            return self.rebuilt(segment, schema)
        return derived

    def recoded(self, segment: Segment, schema) -> "_PSTreeMatcher":
        """The same PS-Trees under a grown string dictionary.  A space is a
        range of codes, and new strings move the codes above them without
        changing their order; so the boundaries and the predicate rows take
        the new codes (:mod:`gpu_kernels.string_codes`), the same spaces cut
        the same strings apart, and the lists, signatures and keys -- over
        spaces and units, not codes -- are kept.  The exact checks are made
        again at the next match.  Rebuilt when the map does not give
        ``segment``'s own codes (a matcher not coded under ``self.schema``'s
        dictionary).  This matcher is unchanged."""
        if segment is self.segment:
            return self
        recoded = recoded_units(self.units, self.schema, segment, schema)
        if recoded is None:
            return self.rebuilt(segment, schema)
        new = copy.copy(self)
        new.segment, new.schema = recoded.segment, schema
        if recoded.units is self.units:
            return new                            # (no code of its predicates moved: boundaries and checks hold)
        spaces = self.spaces
        n_attrs = len(spaces.val_off) - 1
        string_attr = np.zeros(n_attrs, bool)
        string_attr[:min(n_attrs, len(recoded.string_attr))] = recoded.string_attr[:n_attrs]
        val_attr = np.repeat(np.arange(n_attrs), np.diff(spaces.val_off))
        new.units = recoded.units
        new.spaces = spaces._replace(vals=recoded_values(spaces.vals, string_attr[val_attr], recoded.code_map))
        new._checks = ()                          # (they hold the rows' codes: made again at the next match)
        return new

    def _cutting(self) -> np.ndarray:
        """The positions (into ``pids``) of the predicates that cut the PS-Trees."""
        raise NotImplementedError

    def _cut_state(self) -> tuple[np.ndarray, np.ndarray]:
        """The predicate counters at the cuts (:func:`cut_counters`) on this
        matcher's grid: carried by a derived matcher, counted once for a
        built one."""
        if self._cuts is None:
            rows = self.units.rows
            weight = np.bincount(self._pids[self._cutting()], minlength=len(rows.op))
            first, last, attr, w = weighted_intervals(rows, weight, self.spaces)
            self._cuts = cut_counters(first, last, attr, w, len(self.spaces.elem_space), self.n_attrs)
        return self._cuts

    def _derived(self, segment: Segment, old_to_new: np.ndarray, schema):
        if len(old_to_new) != len(self.segment):
            raise ValueError(f"old_to_new has {len(old_to_new)} positions, the segment {len(self.segment)}")
        if segment.predicates.lo is None:
            if schema is None:
                return None
            segment = segment.coded(schema)
        old, old_rows = self.units, self.units.rows
        units = dnf_units(segment, self.dnf_limit)
        rows = units.rows
        # ---- survivors: a subscription kept with as many units keeps the places of each unit whose
        # predicates are the same as the unit's in the same rank (a DNF's conjunctions come in to_dnf's
        # order, the same for the same expression; a unit that differs is re-inserted like an added one)
        new_sub = old_to_new[old.sub] if len(old) else np.zeros(0, np.int64)
        paired = new_sub >= 0
        paired[paired] = np.diff(units.first)[new_sub[paired]] == np.diff(old.first)[old.sub[paired]]
        cand_old = np.flatnonzero(paired)
        cand_new = (units.first[new_sub[cand_old]] + cand_old - old.first[old.sub[cand_old]]).astype(np.int64)
        same = K.same_units(old.offsets, old.pids, old_rows.attr, old_rows.op, old_rows.lo, old_rows.hi,
                            old_rows.set_offsets, old_rows.set_values, units.offsets, units.pids, rows.attr, rows.op,
                            rows.lo, rows.hi, rows.set_offsets, rows.set_values, cand_old, cand_new)
        kept_old, kept_new = cand_old[same], cand_new[same]
        unit_map = np.full(len(old), -1, np.int64)
        unit_map[kept_old] = kept_new
        is_fresh = np.ones(len(units), bool)
        is_fresh[kept_new] = False
        fresh = np.flatnonzero(is_fresh)
        gone = np.flatnonzero(unit_map < 0)
        churn = self._churn + len(fresh) + len(gone)
        if churn > self.REBUILD_SHARE * max(self._built_units, 1) or len(self.segment) == 0 or len(segment) == 0:
            return None

        new = copy.copy(self)
        new.segment, new.schema, new.units = segment, schema, units
        new._churn = churn
        new.merges = self.merges + 1
        new._pids = units.pids
        n_rows = len(rows.op)
        new.n_attrs = n_attrs = max(self.n_attrs, int(rows.attr.max(initial=-1)) + 1)
        used = np.zeros(n_rows, bool)
        used[units.pids] = True
        indexable_row = K.OPERATOR_CLASS[rows.op.astype(np.int64)] != K.NOT_INDEXABLE
        new.indexable = used & indexable_row
        # ---- the added units' positions and their endpoints: the union grid (§4.4's split)
        f_pos, f_off = _positions(units.offsets, fresh)
        f_rows = new._pids[f_pos]
        use_add = np.zeros(n_rows, bool)
        use_add[f_rows[indexable_row[f_rows]]] = True
        add_off, add_vals = endpoints(rows, use_add, n_attrs)
        val_off, vals, first_u, parent_elem = union_grid(self.spaces, add_off, add_vals, n_attrs)
        eu = 2 * val_off + np.arange(n_attrs + 1)
        iv_off, iv_first, iv_last = K.row_intervals(rows.op, rows.attr, rows.lo, rows.hi, rows.set_offsets,
                                                    rows.set_values, use_add.astype(np.uint8), val_off, vals)
        row_of_iv = np.repeat(np.arange(n_rows), np.diff(iv_off))
        g_first = eu[rows.attr[row_of_iv].astype(np.int64)] + iv_first
        g_last = eu[rows.attr[row_of_iv].astype(np.int64)] + iv_last
        # ---- §3.3's ranking for the added units only, against the spaces they meet
        new.row_class, new.row_width, new.row_events = selectivity(
            rows, (iv_off, g_first, g_last, eu[:-1], val_off, vals), n_attrs, self._event_log)
        acc_f, arity_f = K.select_access(f_off, f_rows, rows.attr.astype(np.int64), new.row_class, new.row_width,
                                         new.row_events, self._width())
        acc_f = np.where(acc_f >= 0, f_pos[np.maximum(acc_f, 0)], -1)        # positions into pids
        fx = dict(fresh=fresh, f_pos=f_pos, f_off=f_off, f_rows=f_rows, acc=acc_f, arity=arity_f,
                  f_indexable=indexable_row[f_rows],
                  kept_old=kept_old, kept_new=kept_new, gone=gone, unit_map=unit_map)
        # ---- the predicate counters: the old ones on the union grid, less the removed units' cuts, plus the
        # added ones' (§4.4: a space whose counters fall to zero at its start merges with its left neighbour)
        cut_old = self._gone_cutting(gone)
        weight = np.bincount(old.pids[cut_old].astype(np.int64), minlength=len(old_rows.op))
        r_first, r_last, r_attr, r_w = weighted_intervals(old_rows, weight, self.spaces)
        cuts_old, trees_old = self._cut_state()
        n_elem = int(eu[-1])
        cuts = np.zeros(n_elem + 1, np.int64)
        cuts[first_u] = cuts_old
        trees = np.zeros(n_attrs, np.int64)
        trees[:len(trees_old)] = trees_old
        rm_cuts, rm_trees = cut_counters(first_u[r_first], first_u[r_last + 1] - 1, r_attr, r_w, n_elem, n_attrs)
        fx["cut_new"] = cut_new = self._fresh_cutting(fx)
        add_w = np.bincount(new._pids[cut_new], minlength=n_rows)[row_of_iv]
        add_cuts, add_trees = cut_counters(g_first, g_last, rows.attr[row_of_iv].astype(np.int64), add_w, n_elem,
                                           n_attrs)
        cuts += add_cuts - rm_cuts
        trees += add_trees - rm_trees
        new.spaces, cuts_f, space_u, start_u = cut_spaces(val_off, vals, cuts, trees)
        new._cuts = (cuts_f, trees)
        # per new space, the old one it lies in (the split's source; the first of a merge's)
        pe = parent_elem[np.flatnonzero(start_u)]
        fx["parent"] = np.where(pe >= 0, self.spaces.elem_space[np.maximum(pe, 0)], -1)
        if len(fx["parent"]) and not len(self.spaces.elem_space):
            fx["parent"][:] = -1
        fx["space_u"], fx["parent_elem"] = space_u, parent_elem
        fx["iv"] = (iv_off, g_first, g_last)
        new._finish_derived(self, fx)
        return new

    def _launch(self, batch, kernel, serial, extra):
        n_subs = len(self.segment)
        locate = K.locate_spaces_serial if batch.n_events <= SERIAL_EVENTS else K.locate_spaces
        ev_space = locate(batch.offsets, batch.attr, batch.value, self.spaces.val_off, self.spaces.vals,
                          self.spaces.elem_space)

        def launch(first, last, out, cap, ev_count, stop, need, one):
            (serial if one else kernel)(first, last, out, cap, ev_count, stop, need, n_subs, self.n_attrs,
                                        *extra(ev_space))
        return launch

    def runs(self, batch, pattern_truth: np.ndarray, alive: np.ndarray) -> Runs:
        if batch.n_events == 0 or len(self.segment) == 0:
            return Runs.empty(batch.n_events)
        launch = self._launcher(batch, np.ascontiguousarray(pattern_truth, np.uint8),
                                alive_flags(alive), np.zeros(0, np.int64))
        # (64 events a group from one event on: one event alone went no slower that way, W2 at 300 K)
        runs, self._matches_per_event = match_in_tasks(batch.n_events, launch, self._matches_per_event,
                                                       K.LANES if self.lanes > 1 else 1)
        return runs

    def unit_checks(self) -> K.UnitChecks:
        """The checks the batch kernel reads, made at its first match: a cuda
        matcher's host twin never runs it (W2 at 1 M: about 100 MB), nor
        does ``lanes=1``.  (Two first matches at once may both make them:
        the same arrays, one kept.)"""
        if not self._checks:
            self._checks = K.unit_checks(self._probe_units[2], self.units.rows, self.structure.access)
        return self._checks

    def _lanes_launcher(self, batch, pattern_truth, alive, lists, by_key, table):
        """The batch kernel (:func:`gpu_kernels.pstree.cpu.lanes_task`) over
        ``lists`` (``(offsets, units)`` in probe order)."""
        max_event = int(np.diff(batch.offsets).max(initial=0))
        list_truth = list_truth_of(batch)
        sub, offsets, pids = self._probe_units
        s = self.structure

        def extra(ev_space):
            return (max_event, batch.offsets, batch.attr, batch.value, batch.token, ev_space, pattern_truth,
                    list_truth, sub, offsets, pids, self.units.rows, self.unit_checks(), *lists, s.always, by_key,
                    table, alive)
        return self._launch(batch, K.lanes_kernel, K.lanes_serial, extra)

    def candidate_statistics(self, batch, pattern_truth: np.ndarray, alive: np.ndarray) -> dict:
        """Counters of one serial match of ``batch`` (see the kernels'
        ``stats``), for tests and tuning."""
        stats = np.zeros(3, np.int64)
        launch = self._launcher(batch, np.ascontiguousarray(pattern_truth, np.uint8),
                                alive_flags(alive), stats)
        n = batch.n_events
        cap = 1 << 20
        out = np.empty(cap, np.int32)
        launch(np.array([0]), np.array([n]), out, cap, np.zeros(n, np.int64), np.empty(1, np.int64),
               np.empty(1, np.int64), True)
        return dict(zip(self.STATS, (int(x) for x in stats)))

    # ------------------------------------------------------ probe order
    #: the structure's per-unit fields besides ``access`` (only permuted with the units)
    _UNIT_FIELDS: tuple = ()

    def _lay_out(self, by_unit) -> None:
        """Keep ``by_unit`` (PSTBloom's lists or PSTHash's table, with the
        units' own numbers) as the kernels read it: **in probe order**.  An
        event visits its located spaces in ascending order -- PSTBloom their
        lists; PSTHash their combinations' keys, enumerated in lexicographic
        order, whose groups are numbered by key -- so renumbering the units
        in the order the lists first name them
        (:func:`~gpu_kernels.pstree.cpu.first_listed_order`) makes an event's
        candidates -- their subscription, offsets, predicate ids, access
        predicate(s) -- be read front to back instead of at random (1.6x for
        PSTHash on W2 at 1 M: BENCHMARKS.md).  ``structure`` holds the lists,
        the per-unit fields and the always list renumbered,
        ``probe_order[new] = unit``, ``_probe_units`` the units' subscription,
        offsets and predicate ids in that order; :meth:`unit_structure` gives
        the structure back in the units' own numbers (merges, tests)."""
        units = self.units
        order = K.first_listed_order(by_unit.units, len(units))
        rank = np.empty_like(order)
        rank[order] = np.arange(len(order))
        positions, offsets = _positions(units.offsets, order)
        pids = self._pids[positions]
        # an access predicate is a position in the predicate ids: the same place in its unit's new run
        shift = offsets[:-1] - units.offsets[order]
        access = by_unit.access[order]
        access = np.where(access >= 0, access + (shift[:, None] if access.ndim == 2 else shift), -1)
        self.probe_order = order
        self._by_unit = {name: getattr(by_unit, name) for name in ("access", *self._UNIT_FIELDS)}
        self._probe_units = (units.sub[order], offsets, pids)
        self._checks = ()          # (made again from these at the first batch match: unit_checks)
        self.structure = by_unit._replace(units=K.renumber(by_unit.units, rank), access=access,
                                          always=rank[by_unit.always].astype(np.int32),
                                          **{name: getattr(by_unit, name)[order] for name in self._UNIT_FIELDS})

    def unit_structure(self):
        """The PSTBloom or PSTHash structure with the units' own numbers
        (``units.sub`` order): what a merge derives the next one from."""
        s = self.structure
        return s._replace(units=K.renumber(s.units, self.probe_order),
                          always=self.probe_order[s.always].astype(np.int32), **self._by_unit)

    def _unit_args(self):
        """The units as the kernels read them (probe order): subscription, offsets, predicate ids, rows."""
        return (*self._probe_units, self.units.rows)

    @property
    def nbytes(self) -> int:
        arrays = list(self.spaces) + list(self.structure) + list(self.units[:4]) + list(self.units.rows) + \
            [self._pids, self.probe_order, *self._by_unit.values(), *self._probe_units, *self._checks]
        return self.segment.nbytes + sum(int(a.nbytes) for a in arrays)


class PSTBloomMatcher(_PSTreeMatcher):
    """PSTBloom on the host (see the module docstring).  Options:
    ``bloom_bits`` (signature bits per unit inserted), ``bloom_hashes``
    (probes per unit), ``event_log`` (an EventBatch ranking predicates by
    the events they cover)."""

    name = "pstbloom"
    STATS = ("list_candidates", "signature_candidates", "matches")
    _UNIT_FIELDS = ("key",)

    def __init__(self, segment: Segment, backend: str = "cpu", *, schema=None, dnf_limit: int = DEFAULT_LIMIT,
                 bloom_bits: int = 8, bloom_hashes: int = 3, event_log=None, lanes: int = K.LANES):
        if backend != "cpu":
            raise ValueError(f"PSTBloomMatcher runs on backend 'cpu', not {backend!r}")
        from engine.algorithms.options import PSTBloomOptions
        PSTBloomOptions(bloom_bits=bloom_bits, bloom_hashes=bloom_hashes, event_log=event_log,
                        lanes=lanes)   # the checks
        self.lanes = int(lanes)
        self.segment = segment
        self.schema = schema
        self.bloom_bits, self.bloom_hashes = int(bloom_bits), int(bloom_hashes)
        self._read_segment(schema, dnf_limit, event_log)
        units = self.units
        self._pids = units.pids
        acc, arity = self._select(1)
        self.spaces, (cov_off, cov_first, cov_last), _ = self._full
        self.defining = self.indexable            # the rows that cut the PS-Trees: every indexable one
        unit_of = np.repeat(np.arange(len(units), dtype=np.int64), np.diff(units.offsets))
        list_off, list_units, sig_off, sig = K.build_pstbloom(
            unit_of, self._pids, acc, self.indexable.astype(np.uint8), cov_off, cov_first, cov_last,
            self.spaces.space_off, self.bloom_bits, self.bloom_hashes, numba.get_num_threads())
        self._lay_out(K.BloomArrays(list_off, list_units, sig_off, sig, acc[:, 0].copy(),
                                    np.flatnonzero(arity == 0).astype(np.int32), self.indexable.astype(np.uint8),
                                    np.arange(len(units), dtype=np.int64)))
        del self._full
        self._matches_per_event = 16.0

    # ---------------------------------------------------- updates (§4.4)
    #: a space's signature is refilled once more than this share of the units it holds are gone
    STALE_SHARE = 0.5

    def _width(self) -> int:
        return 1

    def _cutting(self) -> np.ndarray:
        return np.flatnonzero(self.indexable[self._pids])          # every indexable predicate cuts PS-Tree_B

    def _gone_cutting(self, gone: np.ndarray) -> np.ndarray:
        pos, _ = _positions(self.units.offsets, gone)
        return pos[self.indexable[self._pids[pos]]]

    def _fresh_cutting(self, fx: dict) -> np.ndarray:
        return fx["f_pos"][fx["f_indexable"]]

    def _signature_positions(self, units: np.ndarray | None = None) -> np.ndarray:
        """The positions whose units are in signatures: indexable, not access (of ``units``; all by default)."""
        offsets = self.units.offsets
        if units is None:
            pos = np.arange(int(offsets[-1]))
            owner = np.repeat(np.arange(len(self.units)), np.diff(offsets))
        else:
            pos, _ = _positions(offsets, units)
            owner = np.repeat(units, np.diff(offsets)[units])
        return pos[self.indexable[self._pids[pos]] & (pos != self._by_unit["access"][owner])]

    def _signature_counts(self, positions: np.ndarray) -> np.ndarray:
        """Per space, the units of ``positions`` in its signature."""
        rows = self.units.rows
        weight = np.bincount(self._pids[positions], minlength=len(rows.op))
        first, last, _, w = weighted_intervals(rows, weight, self.spaces)
        es = self.spaces.elem_space
        return _space_counts(es[first], es[last], w, int(self.spaces.space_off[-1]))

    def _finish_derived(self, old: "PSTBloomMatcher", fx: dict) -> None:
        units, rows = self.units, self.units.rows
        fresh, kept_old, kept_new = fx["fresh"], fx["kept_old"], fx["kept_new"]
        ob = old.unit_structure()
        access = np.full(len(units), -1, np.int64)
        access[kept_new] = _moved(ob.access[kept_old], old.units.offsets[kept_old], units.offsets[kept_new])
        access[fresh] = fx["acc"][:, 0]
        # survivors keep their Bloom keys (the copied signatures hold those), the added units take new ones
        key = np.empty(len(units), np.int64)
        key[kept_new] = ob.key[kept_old]
        key[fresh] = int(ob.key.max(initial=-1)) + 1 + np.arange(len(fresh))
        # per old space: units inserted in its signature, and those still there
        if getattr(old, "_sig_counts", None) is None:
            counts = old._signature_counts(old._signature_positions())
            old._sig_counts = (counts, counts)
        total, live = old._sig_counts
        live = live - old._signature_counts(old._signature_positions(fx["gone"]))
        # the added units' records: each covered range of spaces, list (access) or signature
        sel = fx["f_indexable"]
        pos = fx["f_pos"][sel]
        owner = np.repeat(fresh, np.diff(fx["f_off"]))[sel]
        iv_off, g_first, g_last = fx["iv"]
        idx, s_first, s_last = _covered(iv_off, g_first, g_last, fx["space_u"], fx["f_rows"][sel])
        rec_unit = owner[idx]
        list_off, list_units, sig_off, sig, total, live, refresh = K.derive_pstbloom(
            fx["parent"], ob.list_off, ob.units, fx["unit_map"], ob.sig_off, ob.sig, total, live,
            rec_unit.astype(np.int32), key[rec_unit], pos[idx] == access[rec_unit], s_first, s_last,
            self.bloom_bits, self.bloom_hashes, self.STALE_SHARE)
        self._lay_out(K.BloomArrays(list_off, list_units, sig_off, sig, access,
                                    np.flatnonzero(access < 0).astype(np.int32), self.indexable.astype(np.uint8),
                                    key))
        if refresh.any():
            # refill the refreshed signatures from every unit whose predicates cover them
            space_attr = np.repeat(np.arange(self.n_attrs), np.diff(self.spaces.space_off))
            touched = np.zeros(self.n_attrs, bool)
            touched[space_attr[refresh]] = True
            pos = self._signature_positions()
            pos = pos[touched[rows.attr[self._pids[pos]]]]
            weight = np.bincount(self._pids[pos], minlength=len(rows.op))
            iv_off2, first2, last2 = K.row_intervals(rows.op, rows.attr, rows.lo, rows.hi, rows.set_offsets,
                                                     rows.set_values, (weight > 0).astype(np.uint8),
                                                     self.spaces.val_off, self.spaces.vals)
            eoff = 2 * self.spaces.val_off + np.arange(self.n_attrs + 1)
            row_of_iv = np.repeat(np.arange(len(rows.op)), np.diff(iv_off2))
            at = eoff[rows.attr[row_of_iv].astype(np.int64)]
            idx, s_first, s_last = _covered(iv_off2, at + first2, at + last2, self.spaces.elem_space, self._pids[pos])
            owner = np.repeat(np.arange(len(units)), np.diff(units.offsets))[pos[idx]]
            K.refill_signatures(refresh, sig_off, sig, key[owner], s_first, s_last, self.bloom_hashes)
        self.defining = self.indexable
        self._sig_counts = (total, live)

    def access_predicates(self) -> np.ndarray:
        """Per unit, the extended-table row of its access predicate (-1: none)."""
        acc = self._by_unit["access"]
        return np.where(acc >= 0, self._pids[np.maximum(acc, 0)], -1)

    def _launcher(self, batch, pattern_truth, alive, stats):
        if len(stats) == 0 and self.lanes > 1:      # (the counters: one event at a time)
            s = self.structure
            return self._lanes_launcher(batch, pattern_truth, alive, (s.list_off, s.units), False, K.no_hash_table())
        list_truth = list_truth_of(batch)

        def extra(ev_space):
            return (batch.offsets, batch.attr, batch.value, batch.token, ev_space, pattern_truth, list_truth,
                    *self._unit_args(), self.structure, self.bloom_hashes, alive, stats)
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
                 n_access: int = 2, max_combinations: int = 256, event_log=None, lanes: int = K.LANES):
        if backend != "cpu":
            raise ValueError(f"PSTHashMatcher runs on backend 'cpu', not {backend!r}")
        from engine.algorithms.options import PSTHashOptions
        PSTHashOptions(n_access=n_access, max_combinations=max_combinations, event_log=event_log,
                       lanes=lanes)   # the checks
        self.lanes = int(lanes)
        self.segment = segment
        self.schema = schema
        self.n_access, self.max_combinations = int(n_access), int(max_combinations)
        self._read_segment(schema, dnf_limit, event_log)
        units, rows = self.units, self.units.rows
        self._pids = units.pids
        width = self.n_access
        acc, arity = self._select(width)
        self._cut_acc = acc.copy()                # the access predicates that cut PS-Tree_H (before the departure)
        full_elem = self._full[2]
        del self._full
        # PS-Tree_H: spaces cut by the access predicates only (§6.1), on the full PS-Trees' grid
        defining = np.zeros(len(rows.op), bool)
        defining[self._pids[acc[acc >= 0]]] = True
        self.spaces, (cov_off, cov_first, cov_last), _ = predicate_spaces(rows, self.indexable, defining,
                                                                          self.n_attrs, elem=full_elem)
        del full_elem
        self.defining = defining                  # (those an access predicate dropped below keep their cuts)
        n_cov = np.bincount(np.repeat(np.arange(len(rows.op)), np.diff(cov_off)),
                            weights=(cov_last - cov_first + 1).astype(np.float64), minlength=len(rows.op))
        # the departure: too many keys -> drop the least selective access predicate (module docstring)
        limit_combinations(acc, arity, n_cov[self._pids[np.maximum(acc, 0)]], self.max_combinations)
        group_key, group_off, owner = grouped_space_combinations(units.offsets, self._pids, acc, arity,
                                                                 rows.attr.astype(np.int64), cov_off, cov_first,
                                                                 cov_last, width, int(self.spaces.space_off[-1]))
        group_key = np.ascontiguousarray(group_key)
        slot_group = K.build_hash_table(group_key, K.table_slots(len(group_key)))
        arities = np.zeros(width + 1, np.uint8)
        arities[arity[arity > 0]] = 1
        group_key, group_off = _narrowed(group_key, group_off)
        self._lay_out(K.HashArrays(slot_group, group_key, group_off, owner.astype(np.int32, copy=False), acc,
                                   arities, np.flatnonzero(arity == 0).astype(np.int32)))
        self.arity = arity
        self._matches_per_event = 16.0

    # ---------------------------------------------------- updates (§4.4)
    def _width(self) -> int:
        return self.n_access

    def _cutting(self) -> np.ndarray:
        return self._cut_acc[self._cut_acc >= 0]

    def _gone_cutting(self, gone: np.ndarray) -> np.ndarray:
        acc = self._cut_acc[gone]
        return acc[acc >= 0]

    def _fresh_cutting(self, fx: dict) -> np.ndarray:
        return fx["acc"][fx["acc"] >= 0]

    def _finish_derived(self, old: "PSTHashMatcher", fx: dict) -> None:
        units, rows = self.units, self.units.rows
        n_rows, width = len(rows.op), self.n_access
        fresh, kept_old, kept_new = fx["fresh"], fx["kept_old"], fx["kept_new"]
        ot = old.unit_structure()
        cut_acc = np.full((len(units), width), -1, np.int64)
        cut_acc[kept_new] = _moved(old._cut_acc[kept_old], old.units.offsets[kept_old], units.offsets[kept_new])
        cut_acc[fresh] = fx["acc"]
        self._cut_acc = cut_acc
        self.defining = np.zeros(n_rows, bool)
        self.defining[self._pids[cut_acc[cut_acc >= 0]]] = True
        # the added units: the departure (module docstring) on the spaces they cover, then their keys
        iv_off, g_first, g_last = fx["iv"]
        cov_first, cov_last = fx["space_u"][g_first], fx["space_u"][g_last]
        n_cov = np.bincount(np.repeat(np.arange(n_rows), np.diff(iv_off)),
                            weights=(cov_last - cov_first + 1).astype(np.float64), minlength=n_rows)
        acc, arity = fx["acc"].copy(), fx["arity"].copy()
        limit_combinations(acc, arity, n_cov[self._pids[np.maximum(acc, 0)]], self.max_combinations)
        keys, owner, _ = K.space_combinations(fx["f_off"], self._pids, acc, arity, rows.attr.astype(np.int64),
                                              iv_off, cov_first, cov_last, width, 0, 0)
        # the old keys: each old space became the new spaces lo..hi (one when kept or merged, several when split)
        n_old = int(old.spaces.space_off[-1])
        pe = fx["parent_elem"]
        inside = pe >= 0
        ps, ns = old.spaces.elem_space[pe[inside]], fx["space_u"][inside]
        ok = (ps >= 0) & (ns >= 0)
        lo = np.full(n_old, np.iinfo(np.int64).max, np.int64)
        hi = np.full(n_old, -1, np.int64)
        np.minimum.at(lo, ps[ok], ns[ok])
        np.maximum.at(hi, ps[ok], ns[ok])
        add_owner = fresh[owner].astype(np.int32)
        n_groups = len(ot.group_off) - 1
        same_spaces = int(self.spaces.space_off[-1]) == n_old and np.array_equal(lo, np.arange(n_old)) and \
            np.array_equal(hi, lo)
        table = None
        if same_spaces:
            # no space split or merged: every old key stands; the table is kept (copied only when the added
            # units bring keys it lacks -- it is the old matcher's too), its groups refilled
            slot_group, group_key = ot.slot_group, ot.group_key
            add_group = K.lookup_groups(slot_group, group_key, keys)
            missing = add_group < 0
            if missing.any():
                n_new = len(np.unique(keys[missing], axis=0))
                if 2 * (n_groups + n_new) <= len(slot_group):
                    slot_group = slot_group.copy()
                    group_key = np.concatenate((group_key, np.full((n_new, width), -1, np.int64)))
                    add_group[missing], n_groups = K.find_groups(slot_group, group_key, keys[missing], n_groups)
                    missing[:] = False
            if not missing.any():
                group_off, key_units = K.regroup(ot.group_off, ot.units, fx["unit_map"], n_groups, add_group,
                                                 add_owner)
                table = slot_group, group_key, group_off, key_units
        if table is None:
            table = K.derive_psthash(ot.group_key, ot.group_off, ot.units, fx["unit_map"], lo, hi, keys, add_owner,
                                     width)
        slot_group, group_key, group_off, key_units = table
        access = np.full((len(units), width), -1, np.int64)
        access[kept_new] = _moved(ot.access[kept_old], old.units.offsets[kept_old], units.offsets[kept_new])
        access[fresh] = acc
        all_arity = np.zeros(len(units), np.int64)
        all_arity[kept_new] = old.arity[kept_old]
        all_arity[fresh] = arity
        arities = np.zeros(width + 1, np.uint8)
        arities[all_arity[all_arity > 0]] = 1
        group_key, group_off = _narrowed(group_key, group_off)
        self._lay_out(K.HashArrays(slot_group, group_key, group_off, key_units, access, arities,
                                   np.flatnonzero(all_arity == 0).astype(np.int32)))
        self.arity = all_arity

    def access_predicates(self) -> np.ndarray:
        """Per unit, the extended-table rows of its access predicates, best
        first (-1 padded)."""
        acc = self._by_unit["access"]
        return np.where(acc >= 0, self._pids[np.maximum(acc, 0)], -1)

    def _launcher(self, batch, pattern_truth, alive, stats):
        if len(stats) == 0 and self.lanes > 1:      # (the counters: one event at a time)
            s = self.structure
            return self._lanes_launcher(batch, pattern_truth, alive, (s.group_off, s.units), True, s)
        max_event = int(np.diff(batch.offsets).max(initial=0))
        list_truth = list_truth_of(batch)

        def extra(ev_space):
            return (max_event, batch.offsets, batch.attr, batch.value, batch.token, ev_space, pattern_truth,
                    list_truth, *self._unit_args(), self.structure, alive, stats)
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
