"""A-Tree event matching (A-Tree §5) on every core: level-ordered,
bottom-up, with zero suppression and propagation on demand.

The flattened A-Tree (:class:`gpu_kernels.atree.layout.ATreeArrays`)
numbers nodes by *level* (§4.1: a leaf is level 1, an operator one more
than its highest child), so the nodes of one level are one id range and
the per-level queues of Algorithm 6 are one bitmap over the ids, read a
level's range at a time.  Per event:

1. **Predicate matching.**  On an attribute the event carries, the
   TRUE l-nodes among the *keyed* ones (not exact, with ``=``, ``IN``,
   ``<``, ``<=``, ``>``, ``>=`` or ``BETWEEN``) are located by binary
   search in the predicate index
   (:class:`~gpu_kernels.atree.layout.LeafIndex`; §5 leaves predicate
   matching to any predicate index) -- the others of them are FALSE or
   NULL, which no reader tells apart from "not TRUE", so they stay
   untouched -- and every other l-node is evaluated (``entry_truth``, the
   one definition of predicate semantics; the index's comparisons are
   the same float comparisons).  So is every l-node of the *absent list*
   whose attribute the event lacks: ``IS NULL`` ones (TRUE on an absent
   attribute, which no event entry reaches) and, below XOR/XNOR, ``IS NOT
   NULL`` ones (FALSE there, and an XOR must tell FALSE from NULL).  Every
   other predicate on an absent attribute is NULL and is never touched.
2. **Expression matching**, level by level: a node is queued when a child
   *propagates* to it, evaluated once, and propagates in turn.

Three-valued logic under zero suppression (§5.2.1).  Expressions are in
negation normal form: NOT is folded into the predicates, so only AND, OR,
XOR and XNOR remain.  A node is *exact* when it lies below an XOR or XNOR
(``needs3`` of its parent): there FALSE and NULL differ.  Elsewhere only
TRUE counts, and Kleene's AND and OR are monotone, so treating NULL as
FALSE there changes no TRUE result:

* an exact node propagates TRUE and FALSE to its ``needs3`` parents
  (XOR/XNOR, exact AND/OR); a node that is not touched is NULL for them
  (exactly: every exact leaf of a present attribute and the absent list
  are evaluated, so an untouched exact leaf is NULL, and a node none of
  whose children propagated has only NULL children); a keyed leaf is
  never exact, and an exact node's children are all exact;
* every other propagation carries TRUE only (the zero suppression
  filter): an untouched node is "not TRUE" for a non-exact AND/OR;
* propagation on demand (§5.2.2): a non-exact AND is linked from one
  *access child* only; when that child is TRUE the AND is evaluated by
  reading its other children's results of this event (the lazy cleaning
  of the paper: results carry the event's stamp and are stale otherwise).

So an XNOR whose two children are FALSE -- TRUE with no TRUE below it --
is reached: in its exact subtree FALSE propagates.  Results go out per
event as ascending positions (those with ``alive``), in the
:func:`engine.algorithms.host_tasks.match_in_tasks` protocol.
"""

from __future__ import annotations

import numpy as np
from numba import njit, prange

from gpu_kernels.compaction import emit_marked, popcount64
from gpu_kernels.opcodes import AND, FALSE, NULL, OR, TRUE, XOR
from gpu_kernels.predicates import entry_truth, find_attribute
from gpu_kernels.twins import parallel_and_serial

#: the key classes of the predicate index (:class:`~gpu_kernels.atree.layout.LeafIndex`):
#: its group ``attr * N_CLASSES + class`` holds one attribute's keyed leaves of one class
EQ_KEYS, IN_KEYS, LT_KEYS, LE_KEYS, GT_KEYS, GE_KEYS, BETWEEN_KEYS = range(7)
N_CLASSES = 7


@njit(nogil=True, cache=True)
def node_levels(child_off, child_idx):
    """Level of each node (§4.1): 1 for a leaf, one more than its highest
    child otherwise.  Ids are mostly topological (children made first;
    self-adjustment links older parents to newer nodes), so a few passes
    settle it; returns (levels, whether they settled: False on a cycle)."""
    n = len(child_off) - 1
    level = np.ones(n, np.int32)
    for _ in range(n + 1):
        changed = False
        for node in range(n):
            if child_off[node + 1] == child_off[node]:
                continue
            top = 0
            for k in range(child_off[node], child_off[node + 1]):
                lv = level[child_idx[k]]
                if lv > top:
                    top = lv
            if level[node] != top + 1:
                level[node] = top + 1
                changed = True
        if not changed:
            return level, True
    return level, False


@njit(nogil=True, cache=True)
def exact_nodes(kind, child_off, child_idx):
    """``needs3[n]``: node ``n`` reads its children in three values (it is
    an XOR/XNOR, or lies below one); nodes in level order, parents last."""
    n = len(kind)
    needs3 = np.zeros(n, np.uint8)
    for node in range(n - 1, -1, -1):
        if kind[node] >= XOR:
            needs3[node] = 1
        if needs3[node]:
            for k in range(child_off[node], child_off[node + 1]):
                needs3[child_idx[k]] = 1
    return needs3


#: A node's result this event is one int32, ``state[node] = cur << 2 | value``
#: (``cur`` the event's stamp): a result and the stamp that says it is this
#: event's are read in one load, not one from each of two arrays (with the
#: bitmap output of :func:`_finish`, the serial kernel 1.16x on W5 at 300 K,
#: BENCHMARKS.md).  Stamps wrap below 2**29.
STAMP_LIMIT = (1 << 29) - 1


@njit(inline="always", nogil=True)
def _result(state, node, cur):
    """``node``'s result this event, NULL when it was not touched."""
    s = state[node]
    return s & 3 if (s >> 2) == cur else NULL


# _propagate, _evaluate and _finish run for every node an event reaches: inlined, not called (a numba call
# passes each array argument with its reference counting; the serial kernel 1.2-1.5x faster, BENCHMARKS.md)
@njit(inline="always", nogil=True)
def _propagate(node, value, par_off, par_idx, needs3, state, queued, cur):
    """``node``'s result to the parents it reaches: each, the first time
    this event, is stamped NULL (not evaluated yet) and queued -- a bit
    in ``queued``, which stage 2 reads level by level in id order."""
    for k in range(par_off[node], par_off[node + 1]):
        p = par_idx[k]
        if value == TRUE or (needs3[p] and value != NULL):
            if (state[p] >> 2) != cur:
                state[p] = (cur << 2) | NULL
                queued[p >> 6] |= np.uint64(1) << np.uint64(p & 63)


@njit(inline="always", nogil=True)
def _evaluate(node, kind, needs3, child_off, child_idx, state, cur):
    op = kind[node]
    c0 = child_off[node]
    c1 = child_off[node + 1]
    if not needs3[node]:
        # TRUE is all that counts here; an OR is only reached by a TRUE child
        if op == OR:
            return TRUE
        true_now = (cur << 2) | TRUE
        for k in range(c0, c1):
            if state[child_idx[k]] != true_now:
                return FALSE
        return TRUE
    if op == AND or op == OR:
        decisive = FALSE if op == AND else TRUE
        result = TRUE if op == AND else FALSE
        for k in range(c0, c1):
            v = _result(state, child_idx[k], cur)      # an untouched exact child is NULL
            if v == decisive:
                return decisive
            if v == NULL:
                result = NULL
        return result
    a = child_idx[c0]
    b = child_idx[c0 + 1]
    va = _result(state, a, cur)
    vb = _result(state, b, cur)
    if va == NULL or vb == NULL:
        return NULL
    if op == XOR:
        return TRUE if va != vb else FALSE
    return TRUE if va == vb else FALSE


@njit(inline="always", nogil=True)
def _finish(node, sub_off, sub_pos, alive, bm0, bm1, found):
    """A TRUE r-node's subscription positions (alive ones) marked in the
    event's two-level bitmap (``bm0`` a bit a position, ``bm1`` a bit a
    non-zero word of it; :func:`~gpu_kernels.compaction.emit_marked`
    writes them out ascending); returns how many there were.  (Written out
    as they came, level by level, the positions were sorted per event
    after: 48 K of them an event on W5 at 1 M.)"""
    for k in range(sub_off[node], sub_off[node + 1]):
        pos = sub_pos[k]
        if alive[pos]:
            w = pos >> 6
            bm0[w] |= np.uint64(1) << np.uint64(pos & 63)
            bm1[w >> 6] |= np.uint64(1) << np.uint64(w & 63)
            found += 1
    return found


@njit(inline="always", nogil=True)
def in_level(bits, first, lo, hi):
    """The bits of a queue word (node ids from ``first``) that lie in the
    level ``[lo, hi)``: a word at a level's edge holds its neighbours' bits too."""
    if first < lo:
        bits &= ~((np.uint64(1) << np.uint64(lo - first)) - np.uint64(1))
    if hi - first < 64:
        bits &= (np.uint64(1) << np.uint64(hi - first)) - np.uint64(1)
    return bits


@njit(nogil=True)
def _first_not_below(key, lo, hi, v):
    """First ``k`` in ``[lo, hi)`` with ``not key[k] < v`` (keys ascending)."""
    while lo < hi:
        mid = (lo + hi) >> 1
        if key[mid] < v:
            lo = mid + 1
        else:
            hi = mid
    return lo


@njit(nogil=True)
def _first_above(key, lo, hi, v):
    """First ``k`` in ``[lo, hi)`` with ``v < key[k]`` (keys ascending)."""
    while lo < hi:
        mid = (lo + hi) >> 1
        if v < key[mid]:
            hi = mid
        else:
            lo = mid + 1
    return lo


def make_key_run(first_not_below, first_above):
    """The one definition of a key class's TRUE run, ``key_run(c, k0, k1,
    key, key_reach, v) -> (a, b)`` (keys ``[a, b)`` of group ``[k0, k1)``;
    ``BETWEEN``'s still need their high checked), over the given binary
    searches: this module compiles it with ``njit``, the CUDA twin as a
    device function over the same searches' device builds.  Comparisons
    as ``predicate_truth``'s (``v == lo``, ``v < lo``, ...: -0.0 equals
    0.0, a bound equal to ``v`` in or out as the operator says); keys are
    never NaN, so the run of keys equal to ``v`` ends at the first above."""
    def key_run(c, k0, k1, key, key_reach, v):
        if c == EQ_KEYS or c == IN_KEYS:             # v == lo: the run of equal keys
            a = first_not_below(key, k0, k1, v)
            return a, first_above(key, a, k1, v)
        if c == LT_KEYS:                             # v < lo: the keys above v
            return first_above(key, k0, k1, v), k1
        if c == LE_KEYS:                             # v <= lo: the keys not below v
            return first_not_below(key, k0, k1, v), k1
        if c == GT_KEYS:                             # v > lo: the keys below v
            return k0, first_not_below(key, k0, k1, v)
        if c == GE_KEYS:                             # v >= lo: the keys not above v
            return k0, first_above(key, k0, k1, v)
        b = first_above(key, k0, k1, v)              # lo <= v <= hi: the lows not above v ...
        return first_not_below(key_reach, k0, b, v), b     # ... every high before a is below v
    return key_run


_key_run = njit(nogil=True)(make_key_run(_first_not_below, _first_above))


@njit(nogil=True)
def _true_leaf(leaf, quiet, sub_off, sub_pos, alive, bm0, bm1, found, par_off, par_idx, needs3, state,
               queued, cur):
    """A keyed leaf located TRUE: what evaluating it to TRUE does (a
    ``quiet`` one, no r-node and linking no parent, only records it).  A
    leaf is finished once per event (an IN leaf has a key per list value,
    never two equal ones, but an attribute twice in one event meets it
    twice)."""
    if quiet:
        state[leaf] = (cur << 2) | TRUE
        return found
    if (state[leaf] >> 2) == cur:
        return found
    state[leaf] = (cur << 2) | TRUE
    found = _finish(leaf, sub_off, sub_pos, alive, bm0, bm1, found)
    _propagate(leaf, TRUE, par_off, par_idx, needs3, state, queued, cur)
    return found


@njit(nogil=True)
def _keyed_leaves(g, v, key_off, key, key_hi, key_reach, key_leaf, key_quiet, sub_off, sub_pos, alive, bm0, bm1,
                  found, par_off, par_idx, needs3, state, queued, cur):
    """The TRUE leaves of attribute ``g // N_CLASSES`` and key class ``g %
    N_CLASSES`` on value ``v`` (not NaN): the class's run of keys
    (:func:`make_key_run`); returns (found, leaves located)."""
    c = g % N_CLASSES
    k0 = key_off[g]
    k1 = key_off[g + 1]
    if k0 == k1:
        return found, 0
    a, b = _key_run(c, k0, k1, key, key_reach, v)
    if c == BETWEEN_KEYS:                        # each high checked
        for k in range(a, b):
            if v <= key_hi[k]:
                found = _true_leaf(key_leaf[k], key_quiet[k], sub_off, sub_pos, alive, bm0, bm1, found,
                                   par_off, par_idx, needs3, state, queued, cur)
        return found, b - a
    for k in range(a, b):
        found = _true_leaf(key_leaf[k], key_quiet[k], sub_off, sub_pos, alive, bm0, bm1, found, par_off,
                           par_idx, needs3, state, queued, cur)
    return found, b - a


@njit(nogil=True)
def match_task(e_first, e_last, out, base, cap, ev_count, ev_offsets, ev_attr, ev_value, ev_token, pattern_truth,
               list_truth, alive, kind, level_start, child_off, child_idx, par_off, par_idx, needs3, leaf_pred,
               scan_off, scan_leaf, key_off, key, key_hi, key_reach, key_leaf, key_quiet, absent_leaf, sub_off, sub_pos,
               pred_attr, pred_op, pred_lo, pred_hi, set_offsets, set_values, pred_aux, state, queued, bm0, bm1,
               result):
    """Events ``[e_first, e_last)``; ``result``: the first event that did
    not fit (``e_last`` when all did), its count, and the leaves touched
    by the events that fit (evaluated, or located in the index)."""
    n_levels = len(level_start) - 1
    n_attr = len(scan_off) - 1
    used = 0
    limit = base + cap
    result[0] = e_last
    result[1] = 0
    result[2] = 0
    cur = 0
    for e in range(e_first, e_last):
        cur += 1
        if cur == STAMP_LIMIT:             # stamps wrap: start afresh
            state[:] = 0
            cur = 1
        s0 = ev_offsets[e]
        s1 = ev_offsets[e + 1]
        found = 0
        touched = 0
        # 1. predicate matching: the leaves of the event's attributes, the
        # keyed ones through the index (only their TRUE ones are touched) ...
        for at in range(s0, s1):
            a = ev_attr[at]
            if a < 0 or a >= n_attr:
                continue
            value = ev_value[at]
            if value == value:                   # NaN: no comparison holds, no keyed leaf is TRUE
                for g in range(a * N_CLASSES, (a + 1) * N_CLASSES):
                    found, n = _keyed_leaves(g, value, key_off, key, key_hi, key_reach, key_leaf, key_quiet, sub_off,
                                             sub_pos, alive, bm0, bm1, found, par_off, par_idx, needs3,
                                             state, queued, cur)
                    touched += n
            touched += scan_off[a + 1] - scan_off[a]
            for k in range(scan_off[a], scan_off[a + 1]):
                leaf = scan_leaf[k]
                v = entry_truth(leaf_pred[leaf], at, ev_value, ev_token, pred_op, pred_lo, pred_hi,
                                set_offsets, set_values, pred_aux, pattern_truth, list_truth)
                state[leaf] = (cur << 2) | v
                if v == TRUE:
                    found = _finish(leaf, sub_off, sub_pos, alive, bm0, bm1, found)
                _propagate(leaf, v, par_off, par_idx, needs3, state, queued, cur)
        # ... and those that are not NULL on an absent attribute
        for k in range(len(absent_leaf)):
            leaf = absent_leaf[k]
            pid = leaf_pred[leaf]
            if find_attribute(ev_attr, s0, s1, pred_attr[pid]) >= 0:
                continue                                 # evaluated above
            touched += 1
            v = entry_truth(pid, -1, ev_value, ev_token, pred_op, pred_lo, pred_hi, set_offsets, set_values,
                            pred_aux, pattern_truth, list_truth)
            state[leaf] = (cur << 2) | v
            if v == TRUE:
                found = _finish(leaf, sub_off, sub_pos, alive, bm0, bm1, found)
            _propagate(leaf, v, par_off, par_idx, needs3, state, queued, cur)
        # 2. expression matching, lowest level first (Algorithm 6)
        # A level's queued nodes are taken in id order from the bitmap: they
        # are neighbours in every node array, so they are read in few cache
        # lines, not one each (W5: 1.7x the kernel against a queue in arrival
        # order, BENCHMARKS.md).  A level's nodes do not read each other, and
        # evaluating them queues higher levels only.
        for lv in range(2, n_levels):
            lo = level_start[lv]
            hi = level_start[lv + 1]
            for w in range(lo >> 6, (hi + 63) >> 6):
                bits = queued[w]
                if bits == 0:
                    continue
                first = w << 6
                bits = in_level(bits, first, lo, hi)
                queued[w] ^= bits
                while bits:
                    low = bits & (~bits + np.uint64(1))
                    bits ^= low
                    node = first + popcount64(low - np.uint64(1))
                    v = _evaluate(node, kind, needs3, child_off, child_idx, state, cur)
                    state[node] = (cur << 2) | v
                    if v == TRUE:
                        found = _finish(node, sub_off, sub_pos, alive, bm0, bm1, found)
                    if v != NULL:
                        _propagate(node, v, par_off, par_idx, needs3, state, queued, cur)
        write = base + used + found <= limit
        emit_marked(bm0, bm1, out, base + used, write)
        if not write:
            result[0] = e
            result[1] = found
            return
        used += found
        ev_count[e] = found
        result[2] += touched


def atree_match_kernel_py(task_first, task_last, out, cap, ev_count, task_stop, task_need, task_leaves,
                          ev_offsets, ev_attr, ev_value, ev_token, pattern_truth, list_truth, alive,
                          kind, level_start, child_off, child_idx, par_off, par_idx, needs3,
                          leaf_pred, scan_off, scan_leaf, key_off, key, key_hi, key_reach, key_leaf, key_quiet,
                          absent_leaf, sub_off, sub_pos, pred_attr, pred_op, pred_lo, pred_hi, set_offsets, set_values,
                          pred_aux):
    """Events ``[task_first[t], task_last[t])`` of every task ``t`` in
    parallel, each with its own scratch (results, the queue bitmap, the matches' bitmap);
    ``task_leaves[t]``: the leaves its finished events touched."""
    n_nodes = len(kind)
    n_words = (len(alive) + 63) >> 6
    for t in prange(len(task_first)):
        state = np.zeros(n_nodes, np.int32)
        queued = np.zeros((n_nodes + 63) >> 6, np.uint64)
        bm0 = np.zeros(max(n_words, 1), np.uint64)
        bm1 = np.zeros(max((n_words + 63) >> 6, 1), np.uint64)
        result = np.empty(3, np.int64)
        match_task(task_first[t], task_last[t], out, t * cap, cap, ev_count, ev_offsets, ev_attr, ev_value, ev_token,
                   pattern_truth, list_truth, alive, kind, level_start, child_off, child_idx, par_off, par_idx,
                   needs3, leaf_pred, scan_off, scan_leaf, key_off, key, key_hi, key_reach, key_leaf, key_quiet,
                   absent_leaf, sub_off, sub_pos, pred_attr, pred_op, pred_lo, pred_hi, set_offsets, set_values,
                   pred_aux, state, queued, bm0, bm1, result)
        task_stop[t] = result[0]
        task_need[t] = result[1]
        task_leaves[t] = result[2]


#: the CPU kernel: tasks over all cores, and on the calling thread for a few events
atree_match_kernel, atree_match_serial = parallel_and_serial(atree_match_kernel_py, nogil=True)
