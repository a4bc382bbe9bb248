"""Workload generators of the papers (docs/architecture.md#workloads-and-benchmarks), columnar and vectorised.

Every generator returns a :class:`Workload`: subscriptions in the columnar
one-row-per-predicate form of :mod:`engine.columnar` (ready for
``Index.add_many(table)``) and events as a pyarrow Table with one row per
event and one ``int64`` column per attribute that any event uses (null =
absent), ready for ``Index.match_batch``.  Attributes are named ``a0``,
``a1``, ...; every operand and event value is an integer in
``[0, cardinality)``.  Nothing loops in Python per subscription, predicate
or event: a 1M-subscription workload takes seconds.

BE-Gen (:func:`begen`; BE-Tree §7.1, A-PCM §VII)
-------------------------------------------------

1. **Base expressions.**  ``n_base`` conjunctions of ``base_size`` equality
   predicates on distinct attributes, chosen uniformly or by a Zipf law
   (attribute ``a0`` most popular), values uniform.
2. **Derived subscriptions.**  Each subscription is derived from one base
   expression (bases dealt out evenly).  Each base predicate is kept with
   probability ``Pr_pred = sub_size / base_size`` (at least one is kept), and
   each kept predicate ``i = v*`` is transformed with probability
   ``Pr_trans = 1 - eq_share`` into one of the inferred predicates of BE-Tree
   Table 2(b) that the operator class allows, picked uniformly:
   ``i != v1`` (v1 != v*), ``i < v1`` (v1 > v*), ``i <= v1`` (v1 >= v*),
   ``i > v1`` (v1 < v*), ``i >= v1`` (v1 <= v*), ``i IN {v1..vk} ∪ {v*}``
   (2..max_set values), ``i NOT IN {v1..vk} - {v*}`` (1..max_set values) and
   ``i BETWEEN v1 AND v2`` (v1 <= v* <= v2, width on average ``range_share``
   of the cardinality).  Every derived predicate is implied by its base
   predicate, so a subscription holds on every event that contains its base
   expression.  Operator classes (Table 2(a)): Min ``=``; Low ``=, IN``;
   Med ``<, <=, =, >=, >, IN, BETWEEN``; High Med plus ``!=, NOT IN``.
   With ``sub_size_max`` the sizes instead follow a truncated geometric law
   on ``[1, sub_size_max]`` with mean ``sub_size`` (ads-like workloads);
   a subscription longer than its base keeps the whole base and adds
   predicates on attributes outside it -- such subscriptions match no event
   of their base (they model targeting conditions an event rarely carries).
3. **Events and the matching probability.**  An event is its base
   expression (``base_size`` pairs) plus ``filler`` pairs on other
   attributes with random values, so every event is distinct, yet it
   satisfies every (short enough) subscription derived from its base.  Bases
   are dealt out evenly to subscriptions and to events.  The fraction of
   matching (event, subscription) pairs is then ``own / n_base + chance``,
   where ``own`` is the share of subscriptions that hold on an event of
   their own base (1 for plain BE-Gen, the share that fits in the base with
   ``sub_size_max``) and ``chance`` the probability that a subscription of
   another base matches (all its attributes among the event's and every
   value fitting: negligible in the papers' high-dimensional settings,
   sizeable on dense or Zipf-skewed ones).  Both are measured on a small
   pilot workload of the same parameters (4,096 subscriptions, 64 bases, its
   own random stream), and ``n_base = round(own / (match_prob - chance))``.
   A target below the chance rate cannot be reached: the generator warns
   and uses the most bases (``MAX_BASES``).  ``params`` records ``n_base``,
   ``chance_match_prob`` and ``expected_match_prob``.  ``filler=0`` gives
   the paper's literal scheme (events = base expressions; "to generate 1,000
   subscriptions with matching probability 1 %, we generate 100 base
   expressions and 10 derived expressions for each"); as there, events of
   one base share ``base_size / event_size`` of their pairs.
4. **Stream similarity** (A-PCM §VII).  With ``similarity = s`` each seed
   event (built as in 3.) is replicated ``k`` times, ``k`` Gaussian with mean
   ``group_size`` (sd ``group_size/3``, at least 1); in each replica a share
   ``1 - s`` of the pairs (stochastically rounded) is replaced by new random
   pairs on attributes the replica does not otherwise carry.  ``s = 1``:
   identical replicas, ``s = 0``: unrelated ones.  As in the paper, the
   replacement lowers the matching probability below the seeds' (a replica
   keeps its base's subscriptions only when none of their predicates was
   replaced).  ``sorted_stream=True`` keeps replicas (without similarity:
   events of one base) adjacent; otherwise the stream is shuffled.  The
   order is drawn last, so the sorted and the shuffled stream of one seed
   hold the same events.

Subscriptions and events draw from two independent random streams of one
seed, so the same subscription parameters and seed give the same
subscriptions whatever the event parameters (W6 uses W1's subscriptions).

OpIndex generator (:func:`opindex_gen`; OpIndex §7.1)
------------------------------------------------------

``N`` subscriptions of ``Γ ~ U[1, Γmax]`` predicates on distinct attributes;
attributes and operands uniform, or both Zipf with exponent ``zipf``;
operator ``=`` with probability ``θ``, the rest split evenly between ``<=``
and ``>=``.  Events: ``U[1, m]`` pairs (exactly ``m`` with
``fixed_event_size``) on distinct attributes, drawn from the same
distributions.  The matching probability is not controlled (as in the paper).

A-Tree ABE-Gen (:func:`abe_gen`; A-Tree §6.1)
----------------------------------------------

Arbitrary Boolean expressions (and, or, not, xor, xnor) grown from the
root, with Zipf-shared subexpressions: see :func:`abe_gen`.  The one
generator here that is not columnar (the columnar form holds conjunctions
only: its subscriptions are texts, and the same expressions as ASTs sharing
their subexpressions, ``Workload.asts``; :func:`add_subscriptions` adds
either) and not vectorised (it grows trees node by node in Python).

Standard workloads (docs/architecture.md#workloads-and-benchmarks): :func:`standard`.
"""

from __future__ import annotations

import json
import math
import os
import warnings
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from engine.expr import And, Not, Op, Or, Pred, Xnor, Xor

__all__ = ["Workload", "begen", "opindex_gen", "abe_gen", "ads_lists", "add_subscriptions", "standard", "canonical_name",
           "STANDARD_WORKLOADS", "write_parquet", "read_parquet", "OP_CLASSES"]

ATTR_PREFIX = "a"
PARAMS_FILE = "params.json"
SUBSCRIPTIONS_FILE = "subscriptions.parquet"
EVENTS_FILE = "events.parquet"
FORMAT_VERSION = 1

# operator codes used while generating; names as engine.columnar spells them
_OPS = ("=", "!=", "<", "<=", ">", ">=", "in", "not in", "between")
EQ, NE, LT, LE, GT, GE, IN, NOT_IN, BETWEEN = range(len(_OPS))

OP_CLASSES = {
    "min": ("=",),
    "low": ("=", "in"),
    "med": ("<", "<=", "=", ">=", ">", "in", "between"),
    "high": ("<", "<=", "=", "!=", ">=", ">", "in", "not in", "between"),
}

_CHUNK = 1 << 19          # rows per chunk where a per-row random matrix is built
_FALLBACK_CELLS = 1 << 24  # cells per chunk of the exact (Gumbel top-k) fallback
_GUMBEL_MAX_DOMAIN = 4096  # beyond it, a skewed draw's fallback samples without replacement value by value


# ---------------------------------------------------------------- the workload
@dataclass
class Workload:
    """A generated workload.

    ``subscriptions``: columnar form (engine.columnar): ``sub_id`` int64,
    ``attr`` string, ``op`` string, ``value``/``value_hi`` int64 (null where
    unused), ``values`` list<int64> (IN / NOT IN).  ``events``: one row per
    event, one int64 column per attribute any event uses, null = absent.
    ``params``: the generating parameters (JSON-serialisable).  ``asts``:
    where the subscriptions are texts (ABE-Gen), the same expressions as
    ASTs in the table's order, one node object per subexpression drawn
    from ABE-Gen's shared pools, however many expressions draw it -- the
    text-free input of an application that builds its rules in code
    (``Index.add_many(ids, asts)``); not saved by :func:`write_parquet`."""

    name: str
    subscriptions: pa.Table
    events: pa.Table
    params: dict = field(default_factory=dict)
    asts: list | None = field(default=None, compare=False, repr=False)

    @property
    def n_subscriptions(self) -> int:
        if self.subscriptions.num_rows == 0:
            return 0
        return int(pc.count_distinct(self.subscriptions["sub_id"]).as_py())

    @property
    def n_events(self) -> int:
        return self.events.num_rows

    @property
    def n_predicates(self) -> int:
        return self.subscriptions.num_rows

    def __repr__(self) -> str:
        return (f"Workload({self.name!r}, subscriptions={self.n_subscriptions}, "
                f"predicates={self.n_predicates}, events={self.n_events})")


# ------------------------------------------------------------------- sampling
def _weights(dims: int, zipf) -> np.ndarray | None:
    """Zipf weights over ranks 1..dims (index 0 most popular), or None for uniform."""
    if zipf is None or zipf == 0:
        return None
    w = 1.0 / np.arange(1, dims + 1, dtype=np.float64) ** float(zipf)
    return w / w.sum()


def _draw(rng, n: int, domain: int, weights) -> np.ndarray:
    if weights is None:
        return rng.integers(0, domain, n, dtype=np.int64)
    cdf = np.cumsum(weights)
    return np.minimum(np.searchsorted(cdf, rng.random(n) * cdf[-1], side="right"), domain - 1).astype(np.int64)


def _make_distinct(rng, mat: np.ndarray, free: np.ndarray, domain: int, weights=None, max_rounds: int = 48):
    """Draw the ``free`` entries of ``mat`` (rows of values in ``[0, domain)``)
    so that no row holds a value twice.  Entries that are not free are kept
    (they must already be distinct within their row; padding is encoded as
    distinct negative numbers).  Duplicates are redrawn round by round, all
    rows at once; rows still clashing after ``max_rounds`` (heavy skew, rows
    nearly as long as the domain) are drawn exactly by weighted sampling
    without replacement (Gumbel top-k) over the values the row lacks."""
    todo = free.copy()
    longest = int((free | (mat >= 0)).sum(axis=1).max()) if len(mat) else 0
    if weights is not None and domain <= _GUMBEL_MAX_DOMAIN or 4 * longest > domain:
        max_rounds = 0      # skewed or crowded rows: straight to exact sampling
    for _ in range(max_rounds):
        count = int(todo.sum())
        if count == 0:
            return mat
        mat[todo] = _draw(rng, count, domain, weights)
        rows = np.flatnonzero(todo.any(axis=1))
        sub, fr = mat[rows], free[rows]
        order = np.argsort(sub, axis=1, kind="stable")
        s = np.take_along_axis(sub, order, axis=1)
        fs = np.take_along_axis(fr, order, axis=1)
        dup = s[:, 1:] == s[:, :-1]
        redo_sorted = np.zeros_like(fs)
        redo_sorted[:, 1:] |= dup & fs[:, 1:]      # redraw the right one of a clashing pair if it is free,
        redo_sorted[:, :-1] |= dup & ~fs[:, 1:]    # else the left one (two fixed entries never clash)
        redo = np.zeros_like(fr)
        np.put_along_axis(redo, order, redo_sorted, axis=1)
        todo = np.zeros_like(free)
        todo[rows] = redo
    stuck = np.flatnonzero(todo.any(axis=1))
    if weights is not None and domain > _GUMBEL_MAX_DOMAIN and len(stuck):
        # skewed over a wide domain (Zipf attributes over PS-Tree's 30K dimensions): a Gumbel key
        # per value of the domain per row would be billions of draws
        mat[stuck] = _weighted_without_replacement(rng, mat[stuck], free[stuck], weights)
        return mat
    logw = None if weights is None else np.log(weights)
    step = max(1, _FALLBACK_CELLS // max(domain, 1))
    for start in range(0, len(stuck), step):
        rows = stuck[start:start + step]
        sub, fr = mat[rows], free[rows]
        keys = rng.gumbel(size=(len(rows), domain))
        if logw is not None:
            keys += logw
        r, c = np.nonzero(~fr & (sub >= 0))
        keys[r, sub[r, c]] = -np.inf
        k = max(int(fr.sum(axis=1).max()), 1)
        top = np.argpartition(-keys, k - 1, axis=1)[:, :k] if k < domain else np.argsort(-keys, axis=1)
        rank = np.cumsum(fr, axis=1) - 1
        r, c = np.nonzero(fr)
        sub[r, c] = top[r, rank[r, c]]
        mat[rows] = sub
    return mat


def _weighted_without_replacement(rng, sub: np.ndarray, free: np.ndarray, weights: np.ndarray) -> np.ndarray:
    """``sub`` with its ``free`` entries drawn, column by column, each from
    ``weights`` restricted to the values its row lacks (weighted sampling
    without replacement, exact), all rows at once: a draw is a point of
    the remaining mass, found on the weights' cumulative sum by stepping
    over the row's taken values in ascending order (each adds its weight to
    the point, as if cut out of the line)."""
    domain = len(weights)
    cum = np.cumsum(weights, dtype=np.float64)
    sub = sub.copy()
    # each row's taken values, ascending, padded with ``domain`` (above every value)
    taken = np.where(~free & (sub >= 0), sub, domain)
    taken.sort(axis=1)
    weight_of = np.append(np.asarray(weights, np.float64), 0.0)        # the padding weighs nothing
    for c in range(sub.shape[1]):
        rows = np.flatnonzero(free[:, c])
        if not len(rows):
            continue
        ex = taken[rows]
        w_ex = weight_of[ex]
        point = rng.random(len(rows)) * (cum[-1] - w_ex.sum(axis=1))
        drawn = np.full(len(rows), -1, np.int64)
        for j in range(ex.shape[1]):
            at = np.searchsorted(cum, point, side="right")
            hit = (drawn < 0) & (at < ex[:, j])
            drawn[hit] = at[hit]
            point = point + np.where(drawn < 0, w_ex[:, j], 0.0)
        # rounding can leave a point at the very end of the line or on a taken value: the row's
        # largest free value then (rare; either is a draw of negligible probability)
        bad = np.flatnonzero((drawn >= domain) | (drawn < 0) | (ex == drawn[:, None]).any(axis=1))
        for i in bad.tolist():
            lacking = np.setdiff1d(np.arange(domain), ex[i])
            drawn[i] = lacking[-1]
        sub[rows, c] = drawn
        ex[:, -1] = drawn                        # a free entry remained, so the last slot was padding
        ex.sort(axis=1)
        taken[rows] = ex
    return sub


def _padding(n_rows: int, width: int) -> np.ndarray:
    """Distinct negative placeholders, one per column."""
    return np.broadcast_to(-1 - np.arange(width, dtype=np.int64), (n_rows, width)).copy()


def _distinct_rows(rng, sizes: np.ndarray, width: int, domain: int, weights=None) -> np.ndarray:
    """Rows of ``sizes[i]`` distinct values in ``[0, domain)`` (padded with
    negatives to ``width``)."""
    mat = _padding(len(sizes), width)
    free = np.arange(width)[None, :] < np.asarray(sizes)[:, None]
    return _make_distinct(rng, mat, free, domain, weights)


def _stochastic_round(rng, x: np.ndarray) -> np.ndarray:
    base = np.floor(x)
    return (base + (rng.random(x.shape) < x - base)).astype(np.int64)


def _random_positions(rng, n_rows: int, width: int, counts: np.ndarray) -> np.ndarray:
    """Boolean (n_rows, width): ``counts[i]`` random positions of row i set."""
    out = np.zeros((n_rows, width), dtype=bool)
    for start in range(0, n_rows, _CHUNK):
        stop = min(n_rows, start + _CHUNK)
        order = np.argsort(rng.random((stop - start, width), dtype=np.float32), axis=1)
        np.put_along_axis(out[start:stop], order, np.arange(width)[None, :] < counts[start:stop, None], axis=1)
    return out


def _truncated_geometric(rng, n: int, mean: float, top: int) -> np.ndarray:
    """Sizes in [1, top] with P(k) ∝ q**(k-1) and the given mean."""
    ks = np.arange(1, top + 1, dtype=np.float64)
    if not 1 <= mean < (top + 1) / 2 or top == 1:
        if mean == 1 or top == 1:
            return np.ones(n, dtype=np.int64)
        raise ValueError(f"sub_size (mean) must be in [1, (sub_size_max + 1) / 2) = [1, {(top + 1) / 2}), not {mean}")
    lo, hi = 0.0, 1.0
    for _ in range(100):
        q = (lo + hi) / 2
        pmf = q ** (ks - 1)
        if (ks * pmf).sum() / pmf.sum() < mean:
            lo = q
        else:
            hi = q
    pmf = ((lo + hi) / 2) ** (ks - 1)
    cdf = np.cumsum(pmf / pmf.sum())
    return np.minimum(np.searchsorted(cdf, rng.random(n), side="right") + 1, top).astype(np.int64)


# ------------------------------------------------------- predicates -> Arrow
def _attr_names(n: int) -> pa.Array:
    return pa.array([f"{ATTR_PREFIX}{i}" for i in range(n)], pa.string())


def _subscription_table(preds: dict, dims: int) -> pa.Table:
    """Predicate arrays -> the columnar form of engine.columnar."""
    op, lengths = preds["op"], preds["lengths"]
    n = len(op)
    is_list = lengths > 0
    offsets = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    flat = pa.array(preds["flat"], pa.int64())
    if offsets[-1] < 2 ** 31:
        values = pa.ListArray.from_arrays(pa.array(offsets.astype(np.int32)), flat, mask=pa.array(~is_list))
    else:
        values = pa.LargeListArray.from_arrays(pa.array(offsets), flat, mask=pa.array(~is_list))
    return pa.table({
        "sub_id": pa.array(preds["sub"], pa.int64()),
        "attr": _attr_names(dims).take(pa.array(preds["attr"], pa.int32())),
        "op": pa.array(_OPS, pa.string()).take(pa.array(op, pa.int8())),
        "value": pa.array(preds["value"], pa.int64(), mask=is_list),
        "value_hi": pa.array(preds["value_hi"], pa.int64(), mask=op != BETWEEN),
        "values": values,
    })


def _events_table(event_idx, attr, value, n_events: int) -> pa.Table:
    """One int64 column per attribute used (ascending attribute number),
    built from (event, attribute, value) triples without a per-event loop."""
    event_idx = np.asarray(event_idx, np.int64)
    attr = np.asarray(attr, np.int64)
    used, col = np.unique(attr, return_inverse=True)
    data = np.zeros((len(used), n_events), dtype=np.int64)
    valid = np.zeros((len(used), n_events), dtype=bool)
    data[col, event_idx] = value
    valid[col, event_idx] = True
    bits = np.packbits(valid, axis=1, bitorder="little")
    nulls = n_events - valid.sum(axis=1)
    arrays = [pa.Array.from_buffers(pa.int64(), n_events, [pa.py_buffer(bits[j]), pa.py_buffer(data[j])],
                                    null_count=int(nulls[j]))
              for j in range(len(used))]
    return pa.Table.from_arrays(arrays, names=[f"{ATTR_PREFIX}{a}" for a in used.tolist()])


#: the map column of events in the map layout
EVENTS_MAP_COLUMN = "attributes"


def _events_map(event_idx, attr, value, n_events: int, dims: int) -> pa.Table:
    """One ``map<string, int64>`` column, attribute name -> value: the
    layout for sparse events over many attributes (a dense table of 20,000
    mostly-null columns costs more to build and to read than its cells)."""
    event_idx = np.asarray(event_idx, np.int64)
    order = np.lexsort((np.asarray(attr, np.int64), event_idx))
    counts = np.bincount(event_idx, minlength=n_events)
    offsets = np.concatenate(([0], np.cumsum(counts))).astype(np.int32)
    names = pa.array([f"{ATTR_PREFIX}{a}" for a in range(dims)], pa.string())
    keys = names.take(pa.array(np.asarray(attr, np.int64)[order]))
    items = pa.array(np.asarray(value, np.int64)[order], pa.int64())
    return pa.table({EVENTS_MAP_COLUMN: pa.MapArray.from_arrays(pa.array(offsets), keys, items)})


def _dense_events(attr_mat: np.ndarray, value_mat: np.ndarray, present: np.ndarray, layout: str = "wide",
                  dims: int = 0) -> pa.Table:
    rows, cols = np.nonzero(present)
    if layout == "map":
        return _events_map(rows, attr_mat[rows, cols], value_mat[rows, cols], attr_mat.shape[0], dims)
    return _events_table(rows, attr_mat[rows, cols], value_mat[rows, cols], attr_mat.shape[0])


# ------------------------------------------------------------------ BE-Gen
#: most dimensions for which BE-Gen's events are one column per attribute by default
WIDE_EVENTS_MAX_DIMS = 1000
MAX_BASES = 1 << 16        # most base expressions (reached only when chance matches exceed the target)
PILOT_SUBS, PILOT_BASES, PILOT_EVENTS_PER_BASE = 4096, 64, 2


@dataclass
class _Spec:
    """The BE-Gen parameters shared by the generation steps."""
    dims: int
    card: int
    base_size: int
    event_size: int
    eq_share: float
    op_class: str
    range_share: float
    max_set: int
    weights: np.ndarray | None
    sub_size: float
    sub_size_max: int | None


def _sub_sizes(rng, spec: _Spec, n: int) -> np.ndarray:
    if spec.sub_size_max is None:   # keep each base predicate with Pr_pred, at least one
        return np.maximum(rng.binomial(spec.base_size, spec.sub_size / spec.base_size, n), 1).astype(np.int64)
    return _truncated_geometric(rng, n, float(spec.sub_size), spec.sub_size_max)


def _bases(rng, spec: _Spec, n_base: int):
    attr = _distinct_rows(rng, np.full(n_base, spec.base_size), spec.base_size, spec.dims, spec.weights)
    return attr, rng.integers(0, spec.card, (n_base, spec.base_size), dtype=np.int64)


def _derive(rng, spec: _Spec, sizes, base_of, base_attr, base_val) -> dict:
    """Predicate rows of the derived subscriptions ``0..len(sizes)-1``."""
    n_subs, base_size = len(sizes), spec.base_size
    offsets = np.zeros(n_subs + 1, dtype=np.int64)
    np.cumsum(sizes, out=offsets[1:])
    n_rows = int(offsets[-1])
    attr = np.empty(n_rows, dtype=np.int64)
    vstar = np.empty(n_rows, dtype=np.int64)
    fits = sizes <= base_size
    small = np.flatnonzero(fits)
    for start in range(0, len(small), _CHUNK):       # kept base predicates of the subscriptions that fit
        ids = small[start:start + _CHUNK]
        keep = _random_positions(rng, len(ids), base_size, sizes[ids])
        r, c = np.nonzero(keep)
        within = np.arange(len(r)) - np.repeat(np.cumsum(sizes[ids]) - sizes[ids], sizes[ids])
        dest = offsets[ids][r] + within
        attr[dest] = base_attr[base_of[ids][r], c]
        vstar[dest] = base_val[base_of[ids][r], c]
    large = np.flatnonzero(~fits)
    if len(large):                                   # the whole base plus attributes outside it
        width = int(sizes[large].max())
        cols = np.arange(width)[None, :]
        mat = _padding(len(large), width)
        mat[:, :base_size] = base_attr[base_of[large]]
        mat = _make_distinct(rng, mat, (cols >= base_size) & (cols < sizes[large][:, None]), spec.dims,
                             spec.weights)
        vals = rng.integers(0, spec.card, mat.shape, dtype=np.int64)
        vals[:, :base_size] = base_val[base_of[large]]
        r, c = np.nonzero(cols < sizes[large][:, None])
        dest = offsets[large][r] + c
        attr[dest] = mat[r, c]
        vstar[dest] = vals[r, c]
    transform = rng.random(n_rows) < 1 - spec.eq_share
    op, value, value_hi, lengths, flat = _inferred(rng, vstar, transform, spec.op_class, spec.card,
                                                   spec.range_share, spec.max_set)
    return dict(sub=np.repeat(np.arange(n_subs, dtype=np.int64), sizes), offsets=offsets, attr=attr, op=op,
                value=value, value_hi=value_hi, lengths=lengths, flat=flat)


def _seed_events(rng, spec: _Spec, seed_base, base_attr, base_val):
    """Events = their base expression plus filler pairs on other attributes."""
    n, base_size = len(seed_base), spec.base_size
    attr = _padding(n, spec.event_size)
    attr[:, :base_size] = base_attr[seed_base]
    free = np.zeros((n, spec.event_size), dtype=bool)
    free[:, base_size:] = True
    attr = _make_distinct(rng, attr, free, spec.dims, spec.weights)
    value = rng.integers(0, spec.card, (n, spec.event_size), dtype=np.int64)
    value[:, :base_size] = base_val[seed_base]
    return attr, value


def _groups(rng, n_events: int, group_size: float):
    """A-PCM replication: group sizes k ~ N(group_size, group_size/3), >= 1."""
    k = np.zeros(0, dtype=np.int64)
    while k.sum() < n_events:
        more = np.rint(rng.normal(group_size, group_size / 3, max(16, int(n_events / group_size) + 16)))
        k = np.concatenate([k, np.maximum(more, 1).astype(np.int64)])
    n_seed = int(np.searchsorted(np.cumsum(k), n_events) + 1) if n_events else 0
    return n_seed, np.repeat(np.arange(n_seed, dtype=np.int64), k[:n_seed])[:n_events]


def _replicate(rng, spec: _Spec, attr, value, similarity: float):
    """Replace a share ``1 - similarity`` of each replica's pairs by new random pairs."""
    n = len(attr)
    counts = _stochastic_round(rng, np.full(n, (1 - similarity) * spec.event_size))
    replaced = _random_positions(rng, n, spec.event_size, counts)
    attr = _make_distinct(rng, attr.copy(), replaced, spec.dims, spec.weights)
    value = value.copy()
    value[replaced] = rng.integers(0, spec.card, int(replaced.sum()), dtype=np.int64)
    return attr, value


def _evaluate(preds: dict, ev_attr, ev_val, card: int) -> np.ndarray:
    """(events x subscriptions) truth of generated conjunctions (the pilot's
    small evaluator; the engine is not needed to generate)."""
    n_events = len(ev_attr)
    used = np.unique(np.concatenate([ev_attr.ravel(), preds["attr"]]))     # compact attribute numbers
    dense = np.full((n_events, len(used)), -1, dtype=np.int64)
    dense[np.repeat(np.arange(n_events), ev_attr.shape[1]), np.searchsorted(used, ev_attr.ravel())] = ev_val.ravel()
    op, v = preds["op"], preds["value"]
    big = np.iinfo(np.int64).max
    lo = np.select([op == LT, op == LE, op == GT], [-big, -big, v + 1], v)     # each comparison as an interval
    hi = np.select([op == LT, op == LE, op == GT, op == GE, op == BETWEEN], [v - 1, v, big, big, preds["value_hi"]], v)
    x = dense[:, np.searchsorted(used, preds["attr"])]
    ok = ((x >= lo) & (x <= hi)) ^ (op == NE)
    s = np.flatnonzero(preds["lengths"])
    if len(s):
        member = np.zeros((len(s), card), dtype=bool)
        member[np.repeat(np.arange(len(s)), preds["lengths"][s]), preds["flat"]] = True
        inside = member[np.arange(len(s))[None, :], np.maximum(x[:, s], 0)]
        ok[:, s] = np.where(op[s] == IN, inside, ~inside)
    ok &= x >= 0
    starts = preds["offsets"][:-1]
    return np.logical_and.reduceat(ok, starts, axis=1) if len(starts) else np.zeros((n_events, 0), bool)


def _pilot(rng, spec: _Spec, similarity) -> dict:
    """Match rates of subscriptions on events of their own base ("own") and
    of other bases ("chance"), on a small workload of the same parameters;
    with ``*_similar`` the same after the stream-similarity replacement."""
    sizes = _sub_sizes(rng, spec, PILOT_SUBS)
    base_attr, base_val = _bases(rng, spec, PILOT_BASES)
    base_of = np.arange(PILOT_SUBS, dtype=np.int64) % PILOT_BASES
    preds = _derive(rng, spec, sizes, base_of, base_attr, base_val)
    seed_base = np.repeat(np.arange(PILOT_BASES, dtype=np.int64), PILOT_EVENTS_PER_BASE)
    own = seed_base[:, None] == base_of[None, :]
    ev_attr, ev_val = _seed_events(rng, spec, seed_base, base_attr, base_val)
    hit = _evaluate(preds, ev_attr, ev_val, spec.card)
    out = {"own": float(hit[own].mean()), "chance": float(hit[~own].mean())}
    if similarity is not None:
        hit = _evaluate(preds, *_replicate(rng, spec, ev_attr, ev_val, similarity), spec.card)
        out.update(own_similar=float(hit[own].mean()), chance_similar=float(hit[~own].mean()))
    return out


def _inferred(rng, vstar: np.ndarray, transform: np.ndarray, op_class: str, card: int,
              range_share: float, max_set: int):
    """Operators and operands of derived predicates (BE-Tree Table 2(b)):
    rows with ``transform`` get a random non-'=' operator of the class,
    every operand chosen so that ``attr = vstar`` implies the predicate."""
    n = len(vstar)
    op = np.full(n, EQ, dtype=np.int8)
    others = np.array([_OPS.index(o) for o in OP_CLASSES[op_class] if o != "="], dtype=np.int8)
    t = np.flatnonzero(transform)
    if len(others) and len(t):
        op[t] = others[rng.integers(0, len(others), len(t))]
    top = card - 1
    op[(op == LT) & (vstar >= top)] = LE        # no v1 > v* in the domain
    op[(op == GT) & (vstar <= 0)] = GE          # no v1 < v* in the domain
    if card < 2:
        op[np.isin(op, (NE, NOT_IN, IN))] = EQ

    value = vstar.copy()
    value_hi = np.zeros(n, dtype=np.int64)
    m = op == NE
    value[m] = (vstar[m] + rng.integers(1, card, int(m.sum()))) % card
    m = op == LT
    value[m] = vstar[m] + 1 + rng.integers(0, top - vstar[m])
    m = op == LE
    value[m] = vstar[m] + rng.integers(0, top - vstar[m] + 1)
    m = op == GT
    value[m] = rng.integers(0, vstar[m])
    m = op == GE
    value[m] = rng.integers(0, vstar[m] + 1)
    m = np.flatnonzero(op == BETWEEN)
    if len(m):
        v = vstar[m]
        width = np.clip(np.rint(rng.uniform(0, 2, len(m)) * range_share * card), 1, card).astype(np.int64)
        lo_min = np.maximum(0, v - width + 1)
        lo_max = np.minimum(v, card - width)
        value[m] = lo_min + rng.integers(0, lo_max - lo_min + 1)
        value_hi[m] = value[m] + width - 1

    # IN / NOT IN lists: column 0 holds v* (kept for IN, dropped for NOT IN)
    s = np.flatnonzero((op == IN) | (op == NOT_IN))
    lengths = np.zeros(n, dtype=np.int64)
    flat = np.zeros(0, dtype=np.int64)
    if len(s):
        is_in = op[s] == IN
        k_in_max = min(max_set, card)
        k_out_max = min(max_set, card - 1)
        k = np.where(is_in, rng.integers(min(2, k_in_max), k_in_max + 1, len(s)),
                     rng.integers(1, k_out_max + 1, len(s)))
        width = max_set + 1
        mat = _padding(len(s), width)
        mat[:, 0] = vstar[s]
        cols = np.arange(width)[None, :]
        free = (cols >= 1) & (cols < np.where(is_in, k, k + 1)[:, None])
        mat = _make_distinct(rng, mat, free, card)
        take = np.where(is_in[:, None], cols < k[:, None], (cols >= 1) & (cols <= k[:, None]))
        big = np.iinfo(np.int64).max
        ordered = np.sort(np.where(take, mat, big), axis=1)
        lengths[s] = take.sum(axis=1)
        flat = ordered[cols < lengths[s][:, None]]
    return op, value, value_hi, lengths, flat


def begen(n_subs: int = 1000, n_events: int | None = None, *, dims: int = 400, cardinality: int = 48,
          sub_size: float = 7, event_size: int = 15, eq_share: float | None = None, op_class: str = "med",
          match_prob: float = 0.01, zipf: float | None = None, similarity: float | None = None,
          sorted_stream: bool = False, range_share: float = 0.12, max_set: int = 6,
          sub_size_max: int | None = None, filler: int | None = None, group_size: float = 10,
          event_layout: str | None = None, seed: int = 0, name: str = "begen") -> Workload:
    """BE-Gen workload (BE-Tree §7.1; stream similarity of A-PCM §VII).

    Parameters
    ----------
    n_subs, n_events : subscriptions and events (default ``max(100, n_subs // 100)`` events).
    dims, cardinality : attributes ``a0..a{dims-1}``, values ``0..cardinality-1``.
    sub_size : mean subscription size (``Pr_pred = sub_size / base_size``);
        with ``sub_size_max`` the mean of a truncated geometric on ``[1, sub_size_max]``.
    event_size : pairs per event: ``base_size = event_size - filler`` from the base expression.
    eq_share : share of '=' predicates (``Pr_trans = 1 - eq_share``); default 0.3, 1 for ``op_class="min"``.
    op_class : "min", "low", "med" or "high" (BE-Tree Table 2(a)).
    match_prob : target fraction of (event, subscription) pairs that match.
    zipf : None (uniform attributes) or the Zipf exponent of the attribute choice.
    similarity : None, or the A-PCM stream similarity in [0, 1].
    sorted_stream : keep similar events adjacent instead of shuffling the stream.
    range_share : mean BETWEEN width as a share of the cardinality (paper: 12 %).
    max_set : most values of an IN / NOT IN list (paper: 6).
    filler : event pairs not taken from the base (default ``max(1, round(0.2 * event_size))``,
        0 for the paper's literal events = base expressions).
    group_size : mean number of replicas per seed event under ``similarity``.
    event_layout : "wide" (one column per attribute), "map" (one
        ``map<string, int64>`` column, as :func:`opindex_gen`'s) or None: "map"
        above :data:`WIDE_EVENTS_MAX_DIMS` dimensions (PS-Tree's sparse 30K
        dimensions: a table of thousands of mostly-null columns costs more to
        build and to read than the matching it feeds), else "wide".
    seed : everything is determined by it.
    """
    n_subs = _positive_int(n_subs, "n_subs")
    n_events = max(100, n_subs // 100) if n_events is None else _positive_int(n_events, "n_events", zero=True)
    dims = _positive_int(dims, "dims")
    card = _positive_int(cardinality, "cardinality")
    event_size = _positive_int(event_size, "event_size")
    if event_layout is None:
        event_layout = "map" if dims > WIDE_EVENTS_MAX_DIMS else "wide"
    if event_layout not in ("map", "wide"):
        raise ValueError(f"event_layout must be 'map', 'wide' or None, not {event_layout!r}")
    op_class = str(op_class).lower()
    if op_class not in OP_CLASSES:
        raise ValueError(f"op_class must be one of {sorted(OP_CLASSES)}, not {op_class!r}")
    if eq_share is None:
        eq_share = 1.0 if op_class == "min" else 0.3
    if not 0 <= eq_share <= 1:
        raise ValueError(f"eq_share must be in [0, 1], not {eq_share}")
    if op_class == "min" and eq_share != 1:
        raise ValueError("operator class 'min' has only '=': eq_share must be 1")
    if event_size > dims:
        raise ValueError(f"event_size {event_size} exceeds dims {dims}")
    if filler is None:
        filler = max(1, round(0.2 * event_size)) if event_size > 1 else 0
    elif isinstance(filler, bool) or not isinstance(filler, (int, np.integer)) or not 0 <= filler < event_size:
        raise ValueError(f"filler must be an integer in [0, event_size) = [0, {event_size}), not {filler!r}")
    filler = int(filler)
    base_size = event_size - filler
    if sub_size_max is None:
        if not 1 <= sub_size <= base_size:
            raise ValueError(f"sub_size must be in [1, base_size = event_size - filler = {base_size}], not {sub_size}")
    else:
        sub_size_max = _positive_int(sub_size_max, "sub_size_max")
        if sub_size_max > dims:
            raise ValueError(f"sub_size_max {sub_size_max} exceeds dims {dims}")
    if not 0 < match_prob <= 1:
        raise ValueError(f"match_prob must be in (0, 1], not {match_prob}")
    if similarity is not None and not 0 <= similarity <= 1:
        raise ValueError(f"similarity must be None or in [0, 1], not {similarity}")
    if zipf is not None and not zipf >= 0 or zipf == math.inf:       # (NaN fails every comparison)
        raise ValueError(f"zipf must be None or a finite number >= 0, not {zipf}")
    if not 0 < range_share <= 1:
        raise ValueError(f"range_share must be in (0, 1], not {range_share}")
    max_set = _positive_int(max_set, "max_set")
    if not 1 <= group_size < math.inf:
        raise ValueError(f"group_size must be a finite number >= 1, not {group_size}")

    spec = _Spec(dims=dims, card=card, base_size=base_size, event_size=event_size, eq_share=eq_share,
                 op_class=op_class, range_share=range_share, max_set=max_set, weights=_weights(dims, zipf),
                 sub_size=sub_size, sub_size_max=sub_size_max)
    sub_seq, event_seq, pilot_seq = np.random.SeedSequence(seed).spawn(3)

    # ---- calibration: how often a subscription matches an event of its own
    # base and of another base, measured on a small pilot workload
    pilot = _pilot(np.random.default_rng(pilot_seq), spec, similarity)
    room = match_prob - pilot["chance"]
    n_base = MAX_BASES if room <= 0 else int(np.clip(round(pilot["own"] / room), 1, MAX_BASES))
    if room <= 0:
        warnings.warn(f"begen: subscriptions match events of other base expressions with probability "
                      f"~{pilot['chance']:.4g} (dense or skewed workload), above match_prob={match_prob}; "
                      f"the workload will match at about that rate", RuntimeWarning, stacklevel=2)

    # ---- subscriptions
    rng = np.random.default_rng(sub_seq)
    sizes = _sub_sizes(rng, spec, n_subs)
    base_attr, base_val = _bases(rng, spec, n_base)
    base_of = rng.permutation(np.arange(n_subs, dtype=np.int64) % n_base)
    preds = _derive(rng, spec, sizes, base_of, base_attr, base_val)
    subscriptions = _subscription_table(preds, dims)

    # ---- events, from their own random stream
    rng = np.random.default_rng(event_seq)
    if similarity is None:
        n_seed, group = n_events, np.arange(n_events, dtype=np.int64)
    else:
        n_seed, group = _groups(rng, n_events, group_size)
    seed_base = rng.permutation(n_base)[np.arange(n_seed) % n_base]
    seed_base = seed_base[rng.permutation(n_seed)]
    ev_attr, ev_val = _seed_events(rng, spec, seed_base, base_attr, base_val)
    if similarity is not None:
        ev_attr, ev_val = _replicate(rng, spec, ev_attr[group], ev_val[group], similarity)
        stream_key = group
    else:
        stream_key = seed_base
    order = np.argsort(stream_key, kind="stable") if sorted_stream else rng.permutation(n_events)
    events = _dense_events(ev_attr[order], ev_val[order], np.ones((n_events, event_size), dtype=bool),
                           event_layout, dims)

    key = "own_similar" if similarity is not None else "own"
    chance = pilot["chance_similar"] if similarity is not None else pilot["chance"]
    params = dict(generator="begen", n_subs=n_subs, n_events=n_events, dims=dims, cardinality=card,
                  sub_size=sub_size, event_size=event_size, eq_share=eq_share, op_class=op_class,
                  match_prob=match_prob, zipf=zipf, similarity=similarity, sorted_stream=bool(sorted_stream),
                  range_share=range_share, max_set=max_set, sub_size_max=sub_size_max, filler=filler,
                  group_size=group_size, event_layout=event_layout, seed=seed, n_base=n_base, base_size=base_size,
                  chance_match_prob=pilot["chance"],
                  expected_match_prob=pilot[key] / n_base + chance * (1 - 1 / n_base))
    return Workload(name, subscriptions, events, _jsonable(params))


# --------------------------------------------------------- OpIndex generator
def opindex_gen(n_subs: int = 1000, n_events: int | None = None, *, dims: int = 20000, cardinality: int = 50,
                gamma_max: int = 8, m: int = 40, theta: float = 0.4, zipf: float | None = None,
                fixed_event_size: bool = False, event_layout: str = "map", seed: int = 0,
                name: str = "opindex") -> Workload:
    """OpIndex synthetic workload (OpIndex §7.1).

    ``n_subs`` (N) subscriptions of ``Γ ~ U[1, gamma_max]`` predicates on
    distinct attributes of ``dims`` (d); operands in ``[0, cardinality)``
    (σ values); operator '=' with probability ``theta`` (θ1), else '<=' or
    '>=' with equal probability; ``zipf`` None/0 for uniform attributes and
    operands, else the Zipf exponent of both.  Events: ``U[1, m]`` pairs
    (exactly ``m`` with ``fixed_event_size``), same distributions; as one
    ``map<string, int64>`` column (``event_layout="map"``, the default:
    events are sparse over ``dims`` attributes) or one column per attribute
    (``"wide"``)."""
    n_subs = _positive_int(n_subs, "n_subs")
    n_events = max(100, n_subs // 100) if n_events is None else _positive_int(n_events, "n_events", zero=True)
    dims = _positive_int(dims, "dims")
    card = _positive_int(cardinality, "cardinality")
    gamma_max = _positive_int(gamma_max, "gamma_max")
    m = _positive_int(m, "m")
    if gamma_max > dims or m > dims:
        raise ValueError(f"gamma_max ({gamma_max}) and m ({m}) must not exceed dims ({dims})")
    if not 0 <= theta <= 1:
        raise ValueError(f"theta must be in [0, 1], not {theta}")
    if zipf is not None and not zipf >= 0 or zipf == math.inf:       # (NaN fails every comparison)
        raise ValueError(f"zipf must be None or a finite number >= 0, not {zipf}")
    if event_layout not in ("map", "wide"):
        raise ValueError(f"event_layout must be 'map' or 'wide', not {event_layout!r}")
    sub_seq, event_seq = np.random.SeedSequence(seed).spawn(2)
    attr_w, value_w = _weights(dims, zipf), _weights(card, zipf)

    rng = np.random.default_rng(sub_seq)
    sizes = rng.integers(1, gamma_max + 1, n_subs, dtype=np.int64)
    attr_mat = _distinct_rows(rng, sizes, gamma_max, dims, attr_w)
    present = np.arange(gamma_max)[None, :] < sizes[:, None]
    attr = attr_mat[present]
    n_rows = len(attr)
    sub = np.repeat(np.arange(n_subs, dtype=np.int64), sizes)
    value = _draw(rng, n_rows, card, value_w)
    u = rng.random(n_rows)
    op = np.where(u < theta, EQ, np.where(u < theta + (1 - theta) / 2, LE, GE)).astype(np.int8)
    subscriptions = _subscription_table(dict(sub=sub, attr=attr, op=op, value=value,
                                             value_hi=np.zeros(n_rows, np.int64), lengths=np.zeros(n_rows, np.int64),
                                             flat=np.zeros(0, np.int64)), dims)

    rng = np.random.default_rng(event_seq)
    ev_sizes = np.full(n_events, m, np.int64) if fixed_event_size else rng.integers(1, m + 1, n_events, dtype=np.int64)
    ev_attr = _distinct_rows(rng, ev_sizes, m, dims, attr_w)
    ev_present = np.arange(m)[None, :] < ev_sizes[:, None]
    ev_val = _draw(rng, n_events * m, card, value_w).reshape(n_events, m)
    events = _dense_events(ev_attr, ev_val, ev_present, event_layout, dims)

    params = dict(generator="opindex", n_subs=n_subs, n_events=n_events, dims=dims, cardinality=card,
                  gamma_max=gamma_max, m=m, theta=theta, zipf=zipf, fixed_event_size=bool(fixed_event_size),
                  event_layout=event_layout, seed=seed)
    return Workload(name, subscriptions, events, _jsonable(params))


# --------------------------------------------------------- A-Tree ABE-Gen
#: ABE-Gen's predicate operators and their shares (A-Tree §3.1: relational,
#: set and BETWEEN operators; the paper gives no mix, so equality-heavy as
#: in the other generators)
ABE_PREDICATE_OPS = (("=", 0.3), ("!=", 0.1), ("<", 0.1), ("<=", 0.1), (">", 0.1), (">=", 0.1), ("IN", 0.1),
                     ("BETWEEN", 0.1))
#: the size of each height's universe of subexpression ranks, per
#: subscription: with Zipf(α) ranks over it, α = 0.6 gives the sharing the
#: paper measures on its default workload (§6.1: a predicate used ≈ 18.35
#: times, a subexpression ≈ 4.33 times), counted as use counts in an A-Tree
#: of unique nodes without reorganisation or self-adjustment (those move
#: links, not the workload's sharing); tests/test_atree.py checks it
ABE_PREDICATE_UNIVERSE = 0.065
ABE_SUBEXPRESSION_UNIVERSE = 0.3


class _ZipfRanks:
    """Ranks 0..universe-1 drawn with P(r) ∝ 1 / (r + 1)^α, in blocks."""

    def __init__(self, rng, universe: int, alpha: float):
        self.rng, self.universe = rng, max(1, int(universe))
        w = 1.0 / np.arange(1, self.universe + 1, dtype=np.float64) ** float(alpha)
        self.cdf = np.cumsum(w)
        self.block, self.at = np.zeros(0, np.int64), 0

    def __call__(self) -> int:
        if self.at == len(self.block):
            u = self.rng.random(4096) * self.cdf[-1]
            self.block = np.minimum(np.searchsorted(self.cdf, u, side="right"), self.universe - 1)
            self.at = 0
        self.at += 1
        return int(self.block[self.at - 1])


def abe_gen(n_subs: int = 1000, n_events: int | None = None, *, dims: int = 1000, cardinality: int = 100,
            depth: int = 4, fanout: tuple = (2, 6), operators: tuple = (0.4, 0.4, 0.1, 0.05, 0.05),
            alpha: float = 0.6, attr_zipf: float | None = 0.6, event_size: int = 20, seed: int = 0,
            name: str = "abe") -> Workload:
    """A-Tree's ABE-Gen (A-Tree §6.1, Table 3): arbitrary Boolean expressions.

    Each subscription is a tree grown from its root: every node draws its
    operator from ``operators`` (shares of AND, OR, NOT, XOR, XNOR; default
    40/40/10/5/5), AND and OR draw ``fanout`` (inclusive range) children,
    NOT one, XOR and XNOR two; a node at the subscription's depth is a
    predicate.  A subscription's depth is uniform in ``[1, depth]`` ("depth
    ≤ 4" of W5; the paper grows every tree to the maximum depth).
    Predicates: attribute ``a0..`` Zipf(``attr_zipf``) over ``dims`` (None:
    uniform), operator from :data:`ABE_PREDICATE_OPS`, operands uniform in
    ``[0, cardinality)``.

    **Sharing** (§6.1: "subexpressions following the Zipf distribution
    P(r) = C / r^α"): every non-root node of height ``h`` (a predicate is
    height 1) draws a rank from Zipf(``alpha``) over a universe of
    ``ABE_*_UNIVERSE × n_subs`` ranks of height ``h``; a rank drawn before
    gives the very subexpression made for it then, a new one a new
    subexpression.  ``alpha = 0``: nothing is reused (the paper: all
    subexpressions differ).  The universes grow with ``n_subs``, so the
    sharing ratios hold at any scale.

    Subscriptions are texts (the columnar form holds conjunctions only):
    ``subscriptions`` is a table of ``sub_id`` and ``expression``; the
    same expressions as ASTs, one object per subexpression drawn from
    the pools however many expressions draw it (a subscription's own root
    is made afresh), are ``Workload.asts`` (each equal to its text's
    parse).  :func:`add_subscriptions` adds either.  Events: ``event_size`` distinct
    attributes (the predicates' attribute law), values uniform, as one
    ``map<string, int64>`` column.  Built node by node in Python (not
    vectorised like the other generators): ~1 s per 10K subscriptions."""
    n_subs = _positive_int(n_subs, "n_subs")
    n_events = max(100, n_subs // 100) if n_events is None else _positive_int(n_events, "n_events", zero=True)
    dims = _positive_int(dims, "dims")
    card = _positive_int(cardinality, "cardinality")
    depth = _positive_int(depth, "depth")
    event_size = _positive_int(event_size, "event_size")
    if event_size > dims:
        raise ValueError(f"event_size ({event_size}) must not exceed dims ({dims})")
    lo, hi = _int_range(fanout, "fanout", 2)
    shares = np.asarray(operators, np.float64)
    if shares.shape != (5,) or not np.isfinite(shares).all() or (shares < 0).any() or shares.sum() <= 0:
        raise ValueError(f"operators must be five non-negative shares (and, or, not, xor, xnor), not {operators!r}")
    if not (isinstance(alpha, (int, float)) and alpha >= 0):
        raise ValueError(f"alpha must be a number >= 0, not {alpha!r}")
    if attr_zipf is not None and not 0 <= attr_zipf < math.inf:
        raise ValueError(f"attr_zipf must be None or a finite number >= 0, not {attr_zipf}")
    op_cdf = np.cumsum(shares / shares.sum())
    pred_ops = [op for op, _ in ABE_PREDICATE_OPS]
    pred_cdf = np.cumsum([w for _, w in ABE_PREDICATE_OPS])
    attr_cdf = np.cumsum(_weights(dims, attr_zipf) if attr_zipf else np.full(dims, 1.0 / dims))
    sub_seq, event_seq = np.random.SeedSequence(seed).spawn(2)
    rng = np.random.default_rng(sub_seq)
    ranks = {h: _ZipfRanks(rng, (ABE_PREDICATE_UNIVERSE if h == 1 else ABE_SUBEXPRESSION_UNIVERSE) * n_subs, alpha)
             for h in range(1, depth)} if alpha > 0 else {}
    made: dict = {h: {} for h in range(1, depth + 1)}
    uniform = rng.random

    # each node is made as its text and its AST at once ((text, node) pairs): a drawn rank gives the very
    # pair made for it, so the ASTs share one object per drawn subexpression
    def predicate() -> tuple:
        a = int(np.searchsorted(attr_cdf, uniform() * attr_cdf[-1], side="right").clip(0, dims - 1))
        attr = f"{ATTR_PREFIX}{a}"
        op = pred_ops[int(np.searchsorted(pred_cdf, uniform() * pred_cdf[-1], side="right").clip(0, 7))]
        v = int(uniform() * card)
        if op == "IN":
            values = sorted({v, int(uniform() * card), int(uniform() * card)})
            return f"{attr} IN ({', '.join(map(str, values))})", Pred(attr, Op.IN, tuple(values))
        if op == "BETWEEN":
            w = int(uniform() * card * 0.2)
            hi = min(v + w, card - 1)
            return f"{attr} BETWEEN {v} AND {hi}", Pred(attr, Op.BETWEEN, (v, hi))
        return f"{attr} {op} {v}", Pred(attr, Op(op), (v,))

    def fresh(height: int) -> tuple:
        if height == 1:
            return predicate()
        op = int(np.searchsorted(op_cdf, uniform(), side="right").clip(0, 4))
        if op == 2:
            text, child = node(height - 1)
            return f"NOT ({text})", Not(child)
        if op >= 3:
            (left, a), (right, b) = node(height - 1), node(height - 1)
            return (f"({left}) XOR ({right})", Xor(a, b)) if op == 3 else (f"({left}) XNOR ({right})", Xnor(a, b))
        k = lo + int(uniform() * (hi - lo + 1))
        parts = [node(height - 1) for _ in range(k)]
        text = f" {'AND' if op == 0 else 'OR'} ".join(f"({t})" for t, _ in parts)
        kind = And if op == 0 else Or
        # as the parser reads the text: an AND's AND operands (an OR's OR ones) are spliced in
        children = [c for _, n in parts for c in (n.children if n.__class__ is kind else (n,))]
        return text, kind(tuple(children))

    def node(height: int) -> tuple:
        draw = ranks.get(height)
        if draw is None:
            return fresh(height)
        r = draw()
        made_before = made[height].get(r)
        if made_before is None:
            made_before = made[height][r] = fresh(height)
        return made_before

    heights = rng.integers(1, depth + 1, n_subs)
    pairs = [fresh(int(h)) for h in heights]
    texts = [text for text, _ in pairs]
    asts = [ast for _, ast in pairs]
    del pairs
    subscriptions = pa.table({"sub_id": pa.array(np.arange(n_subs, dtype=np.int64)),
                              "expression": pa.array(texts, pa.string())})

    rng = np.random.default_rng(event_seq)
    ev_sizes = np.full(n_events, event_size, np.int64)
    ev_attr = _distinct_rows(rng, ev_sizes, event_size, dims, _weights(dims, attr_zipf))
    ev_val = rng.integers(0, card, (n_events, event_size), dtype=np.int64)
    events = _dense_events(ev_attr, ev_val, np.ones((n_events, event_size), bool), "map", dims)
    params = dict(generator="abe", n_subs=n_subs, n_events=n_events, dims=dims, cardinality=card, depth=depth,
                  fanout=[lo, hi], operators=[float(x) for x in shares], alpha=float(alpha), attr_zipf=attr_zipf,
                  event_size=event_size, seed=seed)
    return Workload(name, subscriptions, events, _jsonable(params), asts)


# ------------------------------------------------------- ads with list attributes
SEGMENTS_ATTR = "segments"      # the event list of audience segments
BUCKET_ATTR = "bucket"          # the scalar twin's attribute: uniform on [0, buckets)
#: list operators of the segment predicates, their shares and operand-list sizes
_LIST_OPS = ("one of", "none of", "all of", "contains")
_LIST_OP_SHARES = (0.6, 0.15, 0.1, 0.15)
_LIST_SET_SIZES = ((1, 4), (1, 2), (2, 2), (1, 1))


def ads_lists(n_subs: int = 1000, n_events: int | None = None, *, segments: int = 10_000, zipf: float = 1.0,
              per_event: tuple = (1, 200), list_share: float = 0.2, scalar: bool = False, buckets: int = 1000,
              seed: int = 0, name: str = "ads-lists", **begen_kwargs) -> Workload:
    """The ads-like workload with audience segments (docs/architecture.md#workloads-and-benchmarks).

    A BE-Gen workload (``begen_kwargs``; the standard W7 takes W4's) whose
    events also carry ``segments``, a list of ``per_event`` (uniform
    between its ends) distinct segment ids drawn Zipf(``zipf``) over
    ``segments`` ids, and ``bucket``, a number uniform on ``[0, buckets)``.
    ``list_share`` of the subscriptions get one more predicate on the list:
    ``segments ONE OF (1-4 ids)`` (60 %), ``NONE OF (1-2)`` (15 %),
    ``ALL OF (2)`` (10 %), ``id IN segments`` (15 %), the ids uniform over
    all segments (advertisers target niche audiences).

    ``scalar=True`` is the twin for measuring what lists cost: the same
    subscriptions and events, each list predicate replaced by a scalar
    ``bucket IN (...)`` (``NOT IN`` for NONE OF) of the same selectivity
    on these events, its list of ``round(rate * buckets)`` values (at
    least one)."""
    segments = _positive_int(segments, "segments")
    if segments < 4:                         # (an ALL OF draws 2 distinct ids, a ONE OF up to 4)
        raise ValueError(f"segments must be at least 4, not {segments}")
    low, high = _int_range(per_event, "per_event", 0)
    if high > segments:
        raise ValueError(f"per_event's high end ({high}) must not exceed segments ({segments}): "
                         f"an event's segments are distinct")
    if zipf is not None and (isinstance(zipf, bool) or not isinstance(zipf, (int, float, np.integer, np.floating))
                             or not math.isfinite(zipf) or zipf < 0):
        raise ValueError(f"zipf must be None (uniform) or a finite number >= 0, not {zipf!r}")
    if isinstance(list_share, bool) or not (isinstance(list_share, (int, float, np.integer, np.floating))
                                            and 0 <= list_share <= 1):
        raise ValueError(f"list_share must be a number in [0, 1], not {list_share!r}")
    buckets = _positive_int(buckets, "buckets")
    base = begen(n_subs, n_events, seed=seed, name=name, **begen_kwargs)
    rng = np.random.default_rng([seed, 0x5E6])
    n_events = base.n_events
    sizes = rng.integers(low, high + 1, n_events)
    mat = _distinct_rows(rng, sizes, high, segments, _weights(segments, zipf))
    flat = mat[mat >= 0]                                      # row by row: each event's segments
    offsets = np.concatenate(([0], np.cumsum(sizes))).astype(np.int64)
    events = base.events.append_column(SEGMENTS_ATTR, pa.LargeListArray.from_arrays(
        pa.array(offsets), pa.array(flat, pa.int64())))
    events = events.append_column(BUCKET_ATTR, pa.array(rng.integers(0, buckets, n_events), pa.int64()))

    subs = base.subscriptions
    sub_ids = np.unique(subs["sub_id"].to_numpy())
    chosen = np.sort(rng.choice(sub_ids, int(round(list_share * len(sub_ids))), replace=False))
    kind = rng.choice(len(_LIST_OPS), len(chosen), p=_LIST_OP_SHARES)
    bounds = np.array(_LIST_SET_SIZES)[kind]
    set_sizes = rng.integers(bounds[:, 0], bounds[:, 1] + 1)
    sets = _distinct_rows(rng, set_sizes, 4, segments)
    if scalar:
        rate = _list_rates(kind, sets, mat, segments)
        negative = np.array(_LIST_OPS)[kind] == "none of"
        # (NONE OF is TRUE where its ONE OF is not: NOT IN over as many buckets as ONE OF's IN)
        lengths = np.clip(np.round(rate * buckets), 1, buckets).astype(np.int64)
        # a run of consecutive buckets from a random start (modulo): distinct,
        # and of rate length / buckets on the uniform bucket
        offsets = np.concatenate(([0], np.cumsum(lengths)))
        starts = rng.integers(0, buckets, len(lengths))
        flat_values = (np.repeat(starts - offsets[:-1], lengths) + np.arange(offsets[-1])) % buckets
        values = pa.LargeListArray.from_arrays(pa.array(offsets), pa.array(flat_values, pa.int64()))
        rows = pa.table({"sub_id": pa.array(chosen, pa.int64()), "attr": pa.array([BUCKET_ATTR] * len(chosen)),
                         "op": pa.array(np.where(negative, "not in", "in").tolist()),
                         "values": values})
    else:
        contains = np.array(_LIST_OPS)[kind] == "contains"
        rows = pa.table({"sub_id": pa.array(chosen, pa.int64()), "attr": pa.array([SEGMENTS_ATTR] * len(chosen)),
                         "op": pa.array(np.array(_LIST_OPS)[kind].tolist()),
                         "value": pa.array(sets[:, 0], pa.int64(), mask=~contains),
                         "values": _list_of_rows(sets, np.where(contains, 0, set_sizes), mask=contains)})
    subscriptions = pa.concat_tables([subs, rows], promote_options="permissive")
    params = dict(base.params, generator="ads_lists", segments=segments, zipf_segments=zipf,
                  per_event=[low, high], list_share=list_share, scalar=scalar, buckets=buckets)
    return Workload(name, subscriptions, events, _jsonable(params))


def _list_of_rows(mat: np.ndarray, lengths: np.ndarray, mask=None) -> pa.Array:
    """The first ``lengths[i]`` values of each row of ``mat`` as a list<int64> column."""
    keep = np.arange(mat.shape[1])[None, :] < np.asarray(lengths)[:, None]
    offsets = np.concatenate(([0], np.cumsum(lengths))).astype(np.int32)
    return pa.ListArray.from_arrays(pa.array(offsets), pa.array(mat[keep], pa.int64()),
                                    mask=None if mask is None else pa.array(mask))


def _list_rates(kind: np.ndarray, sets: np.ndarray, event_segments: np.ndarray, segments: int,
                chunk: int = 4096) -> np.ndarray:
    """The share of events on which each list predicate is TRUE (NONE OF:
    the share on which its ONE OF is), from packed per-segment event bits."""
    n_events = event_segments.shape[0]
    rows, cols = np.nonzero(event_segments >= 0)
    member = np.zeros((segments + 1, n_events), bool)       # the last row: padding, never a member
    member[event_segments[rows, cols], rows] = True
    bits = np.packbits(member, axis=1)
    padded = np.where(sets >= 0, sets, segments)
    rate = np.empty(len(kind))
    every = np.array(_LIST_OPS)[kind] == "all of"
    for start in range(0, len(kind), chunk):
        part = padded[start:start + chunk]
        any_of = np.bitwise_or.reduce(bits[part], axis=1)
        all_of = np.bitwise_and.reduce(np.where((part == segments)[:, :, None], 255, bits[part]), axis=1)
        hit = np.where(every[start:start + chunk, None], all_of, any_of)
        rate[start:start + chunk] = np.unpackbits(hit, axis=1, count=n_events).sum(axis=1) / max(1, n_events)
    return rate


def add_subscriptions(index, subscriptions: pa.Table, asts: list | None = None) -> None:
    """Add a workload's subscriptions to ``index``: the columnar form as it
    is, ABE-Gen's texts (``sub_id``, ``expression``) through the parser --
    or, given ``asts`` (:attr:`Workload.asts`, the table's expressions in
    its order), as those ASTs, text-free."""
    if "expression" in subscriptions.column_names:
        ids = subscriptions["sub_id"].to_numpy(zero_copy_only=False).tolist()
        if asts is not None and len(asts) != len(ids):
            raise ValueError(f"{len(asts)} ASTs for {len(ids)} subscriptions")
        index.add_many(ids, subscriptions["expression"].to_pylist() if asts is None else asts)
    else:
        index.add_many(subscriptions)


# ------------------------------------------------------- standard workloads
STANDARD_WORKLOADS = {
    # name: (aliases, generator, full-scale keyword arguments); docs/architecture.md#workloads-and-benchmarks
    "W1": (("begen-uniform",), begen,
           dict(n_subs=1_000_000, dims=400, cardinality=48, sub_size=7, event_size=15, eq_share=0.3,
                op_class="med", match_prob=0.01, zipf=None)),
    "W2": (("pstree-dense",), begen,
           dict(n_subs=1_000_000, dims=100, cardinality=100, sub_size=5, event_size=30, eq_share=0.2,
                op_class="med", match_prob=0.01, zipf=None)),
    "W3": (("opindex-sparse",), opindex_gen,
           dict(n_subs=1_000_000, dims=20_000, cardinality=50, gamma_max=8, m=40, theta=0.4, zipf=None)),
    "W4": (("ads-like",), begen,
           dict(n_subs=3_000_000, dims=122, cardinality=100, sub_size=8, sub_size_max=56, event_size=20,
                eq_share=0.3, op_class="med", match_prob=0.03, zipf=1.0)),
    "W5": (("abe",), abe_gen,
           dict(n_subs=1_000_000, dims=1000, cardinality=100, depth=4, fanout=(2, 6),
                operators=(0.4, 0.4, 0.1, 0.05, 0.05), alpha=0.6, attr_zipf=0.6, event_size=20)),
    "W6": (("stream",), begen,
           dict(n_subs=1_000_000, dims=400, cardinality=48, sub_size=7, event_size=15, eq_share=0.3,
                op_class="med", match_prob=0.01, zipf=None, similarity=0.7, sorted_stream=False)),
    "W7": (("ads-lists",), ads_lists,
           dict(n_subs=1_000_000, dims=122, cardinality=100, sub_size=8, sub_size_max=56, event_size=20,
                eq_share=0.3, op_class="med", match_prob=0.03, zipf=1.0, segments=10_000, per_event=(1, 200),
                list_share=0.2)),
    "W7S": (("ads-lists-scalar",), ads_lists,
            dict(n_subs=1_000_000, dims=122, cardinality=100, sub_size=8, sub_size_max=56, event_size=20,
                 eq_share=0.3, op_class="med", match_prob=0.03, zipf=1.0, segments=10_000, per_event=(1, 200),
                 list_share=0.2, scalar=True)),
}
DEFAULT_EVENTS = 10_000
# W3's events span 20K attributes: one int64 column each makes 160 KB per
# event in the Arrow table, so its default stream is shorter.
DEFAULT_EVENTS_OF = {"W3": 1_000}


def canonical_name(name: str) -> str:
    """The standard workload ``name`` names ("W1" for "begen-uniform"...); ValueError for an unknown one."""
    key = str(name).strip().lower().replace("_", "-").replace(" ", "-")
    for canonical, (aliases, _, _) in STANDARD_WORKLOADS.items():
        names = {canonical.lower(), *aliases, *(f"{canonical.lower()}-{a}" for a in aliases)}
        if key in names:
            return canonical
    known = ", ".join(f"{c} ({'/'.join(a)})" for c, (a, _, _) in STANDARD_WORKLOADS.items())
    raise ValueError(f"unknown standard workload {name!r}; known: {known}")


def standard(name: str, scale: float = 1.0, n_events: int | None = None, seed: int = 0) -> Workload:
    """A standard workload (docs/architecture.md#workloads-and-benchmarks) by name ("W1", "begen-uniform",
    "w1-begen-uniform", ...; case-insensitive), with its subscription count
    multiplied by ``scale`` (at least 1).  Default events:
    ``max(100, round(10,000 * scale))`` (W3: 1,000 instead of 10,000, its
    event table having one column per each of up to 20K attributes).  W6 has
    exactly W1's subscriptions (same scale and seed).  W5's subscriptions
    are texts (arbitrary expressions): add them with :func:`add_subscriptions`.

    ========  ================  =========================================================
    name      alias             generator call at scale 1
    ========  ================  =========================================================
    W1        begen-uniform     begen(1M, dims=400, card=48, sub 7, event 15, eq 0.3, Med, p=1 %)
    W2        pstree-dense      begen(1M, dims=100, card=100, sub 5, event 30, eq 0.2, Med, p=1 %)
    W3        opindex-sparse    opindex_gen(1M, dims=20K, σ=50, Γmax=8, m=40, θ=0.4, uniform)
    W4        ads-like          begen(3M, dims=122, card=100, sub 1..56 mean 8, event 20, eq 0.3,
                                Med, Zipf 1.0 attributes, p=3 %: ~2 % of it are chance matches
                                that the Zipf-dense space makes unavoidable, ~1 % planted)
    W5        abe               abe_gen(1M, dims=1000, card=100, depth <= 4, fan-out 2..6,
                                40/40/10/5/5 and/or/not/xor/xnor, Zipf 0.6 sharing and
                                attributes, event 20)
    W6        stream            W1 + similarity 0.7, shuffled (match probability falls to
                                ~0.06 %, as A-PCM notes)
    W7        ads-lists         ads_lists(1M, W4's BE-Gen parameters): events carry 1-200
                                Zipf-popular audience segments, a fifth of the
                                subscriptions test them (ONE/NONE/ALL OF, IN)
    W7S       ads-lists-scalar  W7 with each list predicate replaced by a scalar
                                IN of the same selectivity (what lists cost)
    ========  ================  =========================================================
    """
    canonical = canonical_name(name)
    aliases, generator, kwargs = STANDARD_WORKLOADS[canonical]
    if not (isinstance(scale, (int, float)) and math.isfinite(scale) and scale > 0):
        raise ValueError(f"scale must be a positive number, not {scale!r}")
    kwargs = dict(kwargs)
    kwargs["n_subs"] = max(1, round(kwargs["n_subs"] * scale))
    default = DEFAULT_EVENTS_OF.get(canonical, DEFAULT_EVENTS)
    kwargs["n_events"] = max(100, round(default * scale)) if n_events is None else n_events
    workload = generator(seed=seed, name=f"{canonical} {aliases[0]}", **kwargs)
    workload.params.update(standard=canonical, scale=float(scale))
    return workload


# ------------------------------------------------------------------ parquet
def write_parquet(workload: Workload, directory) -> None:
    """Write ``subscriptions.parquet``, ``events.parquet`` and ``params.json``
    into ``directory`` (created if missing)."""
    os.makedirs(directory, exist_ok=True)
    pq.write_table(workload.subscriptions, os.path.join(directory, SUBSCRIPTIONS_FILE))
    pq.write_table(workload.events, os.path.join(directory, EVENTS_FILE))
    meta = {"format": FORMAT_VERSION, "name": workload.name, "params": _jsonable(workload.params)}
    tmp = os.path.join(directory, PARAMS_FILE + ".tmp")
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(meta, f, indent=2, sort_keys=True)
    os.replace(tmp, os.path.join(directory, PARAMS_FILE))


def read_parquet(directory) -> Workload:
    """Read a workload written by :func:`write_parquet`."""
    with open(os.path.join(directory, PARAMS_FILE), encoding="utf-8") as f:
        meta = json.load(f)
    if not isinstance(meta, dict) or meta.get("format") != FORMAT_VERSION:
        raise ValueError(f"{directory}: not a bexmatch workload (format {FORMAT_VERSION})")
    return Workload(meta["name"], pq.read_table(os.path.join(directory, SUBSCRIPTIONS_FILE)),
                    pq.read_table(os.path.join(directory, EVENTS_FILE)), meta["params"])


# ------------------------------------------------------------------ helpers
def _int_range(value, name: str, least: int) -> tuple[int, int]:
    """An inclusive range given as ``(low, high)`` or one integer (both ends), ``least <= low <= high``."""
    given = value
    if isinstance(value, (int, np.integer)) and not isinstance(value, bool):
        value = (value, value)
    if not (isinstance(value, (tuple, list)) and len(value) == 2
            and all(isinstance(v, (int, np.integer)) and not isinstance(v, bool) for v in value)
            and least <= value[0] <= value[1]):
        raise ValueError(f"{name} must be an integer or a range (low, high) of integers, "
                         f"{least} <= low <= high, not {given!r}")
    return int(value[0]), int(value[1])


def _positive_int(x, name: str, zero: bool = False) -> int:
    if isinstance(x, bool) or not isinstance(x, (int, np.integer)) or x < (0 if zero else 1):
        raise ValueError(f"{name} must be an integer >= {0 if zero else 1}, not {x!r}")
    return int(x)


def _jsonable(value):
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if isinstance(value, np.generic):
        return value.item()
    return value
