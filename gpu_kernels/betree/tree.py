"""The dynamic BE-Tree (Sadoghi, Jacobsen, SIGMOD 2011, §4-§6), in numba.

The tree lives in growable arrays (:class:`TreeArrays`), changed in place by
the compiled functions below and flattened into
:class:`~gpu_kernels.betree.layout.BETreeArrays` for matching
(:func:`freeze`); :func:`thaw` makes a dynamic tree of a flattened one
again, so an update starts from an immutable structure and never touches
what a match in flight reads.

**Insertion** (Algorithm 3, ``InsertBETree``): from the root c-node, among
the unit's attributes that have a p-node in the current c-node's
p-directory (a hash table over (c-node, attribute)), take the p-node of
highest score; descend its clustering directory to the smallest bucket that
encloses the unit's interval on that attribute (Algorithm 4,
``InsertCDir``: the *insertion rule*); repeat from that bucket's c-node.
With no such p-node the unit joins the current c-node's l-node.

**Overflow** (Algorithms 5 and 6) of an l-node beyond its capacity
``max_cap^j`` is resolved by a work list of c-nodes:

* *space clustering* -- a c-node whose bucket is a non-atomic leaf bucket
  is split in halves (the *forced split rule*: a divisible bucket is always
  split before its c-node is partitioned); the units enclosed by a half move
  to it; the c-node and both halves are then handled again;
* *space partitioning* -- the root, a non-leaf bucket or an atomic bucket
  chooses the attribute, not yet used on its path, that most of its units
  constrain (the paper's rank with its optimistic loss of 0: gain = the
  attribute's popularity, §5), if at least ``min_size`` units do; a new
  p-node is made for it, those units move to the top bucket of its new
  clustering directory, which is handled in turn; repeated while the l-node
  overflows.  Finally the capacity becomes ``ceil(|l| / max_cap) * max_cap``
  (an *extended* l-node, §4.2, when no attribute qualified).

**Scores** of p-nodes (the choice in Algorithm 3) follow §5's rank with
``alpha = beta = gamma = 1`` and the loss 0: a p-node's score is the sum,
over the units below it, of their covered and subsumed predicates -- one per
p-node on the unit's path -- kept up to date as units are linked and
unlinked.

**Deletion** unlinks the unit; then, going up: an empty c-node with no
p-node and no halves is removed (and an empty p-node with it: the removal
propagates upward, §4.2), and a leaf bucket is merged back into its parent
bucket with its sibling -- the *merge rule*: only when the parent is an open
bucket (no p-node) and the three l-nodes together fill at most half the
parent's capacity (the paper leaves the underflow threshold open; half
avoids a split/merge cycle on one unit).
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
from numba import njit

from gpu_kernels.betree.layout import ATOMIC, BETreeArrays
from gpu_kernels.opcodes import EQ

# counts[] slots
N_C, N_P, H_USED, MAX_CAP, MIN_SIZE = range(5)
EMPTY = -1
DELETED = -2


class TreeArrays(NamedTuple):
    """The dynamic tree (see the module docstring); every array is grown by
    :class:`engine.algorithms.betree.DynamicTree` between compiled calls."""

    # c-nodes (capacity: len(c_depth))
    c_depth: np.ndarray      # int64 bucket depth
    c_prefix: np.ndarray     # uint64 the bucket's top c_depth key bits
    c_child: np.ndarray      # int64 [2 cap] halves (-1)
    c_parent: np.ndarray     # int64 parent bucket in the same directory (-1: top bucket or root)
    c_pnode: np.ndarray      # int64 p-node owning the directory (-1: root)
    c_pdepth: np.ndarray     # int64 p-nodes on the path from the root
    c_first: np.ndarray      # int64 first unit of the l-node (-1)
    c_count: np.ndarray      # int64 units in the l-node
    c_cap: np.ndarray        # int64 l-node capacity max_cap^j
    c_pfirst: np.ndarray     # int64 first p-node of the p-directory (-1)
    c_np: np.ndarray         # int64 p-nodes in the p-directory
    c_alive: np.ndarray      # uint8
    # p-nodes (capacity: len(p_attr))
    p_attr: np.ndarray       # int64
    p_top: np.ndarray        # int64 top bucket (c-node)
    p_parent: np.ndarray     # int64 c-node whose p-directory holds it
    p_next: np.ndarray       # int64 sibling list of the p-directory
    p_prev: np.ndarray       # int64
    p_score: np.ndarray      # int64 (see the module docstring)
    p_alive: np.ndarray      # uint8
    # p-directory hash: (c-node << 32 | attribute) -> p-node, open addressing
    h_key: np.ndarray        # int64 (EMPTY, DELETED or a key)
    h_val: np.ndarray        # int64
    # units: l-node membership (doubly linked) and key intervals (CSR, by attribute)
    u_cnode: np.ndarray      # int64 (-1: not in the tree)
    u_next: np.ndarray       # int64
    u_prev: np.ndarray       # int64
    k_off: np.ndarray        # int64 [n_units + 1]
    k_attr: np.ndarray       # int64
    k_lo: np.ndarray         # uint64
    k_hi: np.ndarray         # uint64
    # scratch of the partitioning choice, one slot per attribute
    attr_count: np.ndarray   # int64
    touched: np.ndarray      # int64
    counts: np.ndarray       # int64 [N_C, N_P, H_USED, MAX_CAP, MIN_SIZE]


# ------------------------------------------------------------------ buckets
@njit(inline="always", nogil=True)
def bucket_has(depth, prefix, key):
    """Whether the bucket (depth, prefix) holds ``key``."""
    if depth == 0:
        return True
    return (key >> np.uint64(64 - depth)) == prefix


@njit(inline="always", nogil=True)
def half_of(key, depth):
    """Which half (0 or 1) of a bucket of depth ``depth`` holds ``key``."""
    return np.int64((key >> np.uint64(63 - depth)) & np.uint64(1))


# --------------------------------------------------------------------- hash
@njit(inline="always", nogil=True)
def _slot(key, mask):
    return np.int64((np.uint64(key) * np.uint64(0x9E3779B97F4A7C15)) >> np.uint64(40)) & mask


@njit(nogil=True)
def find_pnode(T, c, attr):
    """The p-node of attribute ``attr`` in c-node ``c``'s p-directory, or -1."""
    key = (c << 32) | attr
    mask = len(T.h_key) - 1
    i = _slot(key, mask)
    while True:
        k = T.h_key[i]
        if k == key:
            return T.h_val[i]
        if k == EMPTY:
            return -1
        i = (i + 1) & mask


@njit(nogil=True)
def _hash_put(T, c, attr, p):
    key = (c << 32) | attr
    mask = len(T.h_key) - 1
    i = _slot(key, mask)
    while T.h_key[i] >= 0:
        i = (i + 1) & mask
    if T.h_key[i] == EMPTY:
        T.counts[H_USED] += 1
    T.h_key[i] = key
    T.h_val[i] = p


@njit(nogil=True)
def _hash_delete(T, c, attr):
    key = (c << 32) | attr
    mask = len(T.h_key) - 1
    i = _slot(key, mask)
    while True:
        k = T.h_key[i]
        if k == key:
            T.h_key[i] = DELETED
            return
        if k == EMPTY:
            return
        i = (i + 1) & mask


@njit(nogil=True, cache=True)
def rehash(T):
    """Fill an empty hash table (a grown one) with the live p-nodes."""
    T.h_key[:] = EMPTY
    T.counts[H_USED] = 0
    for p in range(T.counts[N_P]):
        if T.p_alive[p]:
            _hash_put(T, T.p_parent[p], T.p_attr[p], p)


# -------------------------------------------------------------------- nodes
@njit(nogil=True)
def _new_cnode(T, depth, prefix, parent, pnode, pdepth):
    c = T.counts[N_C]
    T.counts[N_C] = c + 1
    T.c_depth[c] = depth
    T.c_prefix[c] = prefix
    T.c_child[2 * c] = -1
    T.c_child[2 * c + 1] = -1
    T.c_parent[c] = parent
    T.c_pnode[c] = pnode
    T.c_pdepth[c] = pdepth
    T.c_first[c] = -1
    T.c_count[c] = 0
    T.c_cap[c] = T.counts[MAX_CAP]
    T.c_pfirst[c] = -1
    T.c_np[c] = 0
    T.c_alive[c] = 1
    return c


@njit(nogil=True)
def _new_pnode(T, c, attr):
    """A p-node for ``attr`` in c-node ``c``'s p-directory, with the empty
    top bucket of its clustering directory (Algorithm 5, line 4)."""
    p = T.counts[N_P]
    T.counts[N_P] = p + 1
    T.p_attr[p] = attr
    T.p_parent[p] = c
    T.p_score[p] = 0
    T.p_alive[p] = 1
    first = T.c_pfirst[c]
    T.p_next[p] = first
    T.p_prev[p] = -1
    if first >= 0:
        T.p_prev[first] = p
    T.c_pfirst[c] = p
    T.c_np[c] += 1
    T.p_top[p] = _new_cnode(T, 0, np.uint64(0), -1, p, T.c_pdepth[c] + 1)
    _hash_put(T, c, attr, p)
    return p


@njit(nogil=True)
def _drop_pnode(T, p):
    c = T.p_parent[p]
    nxt = T.p_next[p]
    prv = T.p_prev[p]
    if prv >= 0:
        T.p_next[prv] = nxt
    else:
        T.c_pfirst[c] = nxt
    if nxt >= 0:
        T.p_prev[nxt] = prv
    T.c_np[c] -= 1
    _hash_delete(T, c, T.p_attr[p])
    T.p_alive[p] = 0
    T.c_alive[T.p_top[p]] = 0


@njit(nogil=True)
def _add_score(T, c, delta):
    """Add ``delta`` to the score of every p-node on c-node ``c``'s path."""
    p = T.c_pnode[c]
    while p >= 0:
        T.p_score[p] += delta
        p = T.c_pnode[T.p_parent[p]]


@njit(nogil=True)
def _link(T, u, c):
    first = T.c_first[c]
    T.u_next[u] = first
    T.u_prev[u] = -1
    if first >= 0:
        T.u_prev[first] = u
    T.c_first[c] = u
    T.c_count[c] += 1
    T.u_cnode[u] = c
    _add_score(T, c, T.c_pdepth[c])


@njit(nogil=True)
def _unlink(T, u):
    c = T.u_cnode[u]
    nxt = T.u_next[u]
    prv = T.u_prev[u]
    if prv >= 0:
        T.u_next[prv] = nxt
    else:
        T.c_first[c] = nxt
    if nxt >= 0:
        T.u_prev[nxt] = prv
    T.c_count[c] -= 1
    T.u_cnode[u] = -1
    _add_score(T, c, -T.c_pdepth[c])
    return c


@njit(nogil=True)
def _update_capacity(T, c):
    """UpdateClusterCapacity (§4.2): ``ceil(|l| / max_cap) * max_cap``, or
    ``max_cap`` for an empty l-node."""
    m = T.counts[MAX_CAP]
    n = T.c_count[c]
    T.c_cap[c] = ((n + m - 1) // m) * m if n > 0 else m


@njit(nogil=True)
def _key_of(T, u, attr):
    """The unit's key entry for ``attr`` (-1: it does not constrain it)."""
    for j in range(T.k_off[u], T.k_off[u + 1]):
        if T.k_attr[j] == attr:
            return j
    return -1


@njit(nogil=True)
def _encloses(T, c, j):
    return bucket_has(T.c_depth[c], T.c_prefix[c], T.k_lo[j]) and bucket_has(T.c_depth[c], T.c_prefix[c],
                                                                             T.k_hi[j])


@njit(nogil=True)
def _insert_cdir(T, u, top, attr):
    """Algorithm 4 (InsertCDir): the smallest bucket below ``top`` that
    encloses the unit's interval on ``attr``."""
    j = _key_of(T, u, attr)
    c = top
    while True:
        moved = False
        for half in range(2):
            h = T.c_child[2 * c + half]
            if h >= 0 and _encloses(T, h, j):
                c = h
                moved = True
                break
        if not moved:
            return c


# ------------------------------------------------------------ space cutting
@njit(nogil=True)
def _best_new_attr(T, c):
    """The attribute to partition c-node ``c``'s l-node on (Algorithm 5,
    line 3): not used on its path, no p-node here yet, constrained by the
    most units (at least ``min_size``; ties: the smallest id), or -1."""
    path = np.empty(T.c_pdepth[c] + 1, np.int64)
    n_path = 0
    p = T.c_pnode[c]
    while p >= 0:
        path[n_path] = T.p_attr[p]
        n_path += 1
        p = T.c_pnode[T.p_parent[p]]
    n_touched = 0
    u = T.c_first[c]
    while u >= 0:
        for j in range(T.k_off[u], T.k_off[u + 1]):
            a = T.k_attr[j]
            used = False
            for q in range(n_path):
                if path[q] == a:
                    used = True
                    break
            if used:
                continue
            if T.attr_count[a] == 0:
                T.touched[n_touched] = a
                n_touched += 1
            T.attr_count[a] += 1
        u = T.u_next[u]
    best = -1
    best_count = T.counts[MIN_SIZE] - 1
    for q in range(n_touched):
        a = T.touched[q]
        n = T.attr_count[a]
        T.attr_count[a] = 0
        if (n > best_count or (n == best_count and best >= 0 and a < best)) and find_pnode(T, c, a) < 0:
            best = a
            best_count = n
    return best


@njit(nogil=True)
def _partition(T, c, work, n_work):
    """Space partitioning of c-node ``c`` (Algorithm 5); pushes the top
    buckets it fills onto ``work``.  Returns (work, n_work)."""
    while T.c_count[c] > T.c_cap[c]:
        attr = _best_new_attr(T, c)
        if attr < 0:
            break
        p = _new_pnode(T, c, attr)
        top = T.p_top[p]
        u = T.c_first[c]
        while u >= 0:
            nxt = T.u_next[u]
            if _key_of(T, u, attr) >= 0:
                _unlink(T, u)
                _link(T, u, top)
            u = nxt
        work, n_work = _push(work, n_work, top)
    _update_capacity(T, c)
    return work, n_work


@njit(nogil=True)
def _split(T, c, work, n_work):
    """Space clustering of c-node ``c`` (Algorithm 6): its bucket split in
    halves, the units a half encloses moved there; ``c`` and the halves are
    handled again."""
    depth = T.c_depth[c]
    prefix = T.c_prefix[c] << np.uint64(1) if depth > 0 else np.uint64(0)
    for half in range(2):
        T.c_child[2 * c + half] = _new_cnode(T, depth + 1, prefix | np.uint64(half), c, T.c_pnode[c], T.c_pdepth[c])
    attr = T.p_attr[T.c_pnode[c]]
    u = T.c_first[c]
    while u >= 0:
        nxt = T.u_next[u]
        j = _key_of(T, u, attr)
        for half in range(2):
            h = T.c_child[2 * c + half]
            if _encloses(T, h, j):
                _unlink(T, u)
                _link(T, u, h)
                break
        u = nxt
    work, n_work = _push(work, n_work, c)
    work, n_work = _push(work, n_work, T.c_child[2 * c])
    work, n_work = _push(work, n_work, T.c_child[2 * c + 1])
    return work, n_work


@njit(nogil=True)
def _push(work, n_work, c):
    if n_work == len(work):
        grown = np.empty(2 * len(work), np.int64)
        grown[:n_work] = work[:n_work]
        work = grown
    work[n_work] = c
    return work, n_work + 1


@njit(nogil=True, cache=True)
def resolve_overflow(T, c0):
    """Resolve the overflow of c-node ``c0``'s l-node and every overflow
    that causes (the two-phase space cutting of §4)."""
    work = np.empty(64, np.int64)
    work[0] = c0
    n_work = 1
    while n_work > 0:
        n_work -= 1
        c = work[n_work]
        if T.c_count[c] <= T.c_cap[c]:
            continue
        leaf_bucket = T.c_child[2 * c] < 0 and T.c_child[2 * c + 1] < 0
        if c == 0 or not leaf_bucket or T.c_depth[c] >= ATOMIC:
            work, n_work = _partition(T, c, work, n_work)
        else:
            work, n_work = _split(T, c, work, n_work)


@njit(nogil=True)
def _descend(T, u):
    """Algorithm 3 without its overflow handling: the c-node whose l-node
    takes unit ``u``."""
    c = 0
    while True:
        best = -1
        best_score = np.int64(-1)
        best_attr = np.int64(-1)
        if T.c_np[c] > 0:
            for j in range(T.k_off[u], T.k_off[u + 1]):
                p = find_pnode(T, c, T.k_attr[j])
                if p >= 0 and T.p_score[p] > best_score:
                    best = p
                    best_score = T.p_score[p]
                    best_attr = T.k_attr[j]
        if best < 0:
            return c
        c = _insert_cdir(T, u, T.p_top[best], best_attr)


@njit(nogil=True, cache=True)
def insert_units(T, units, start, reserve_per_unit):
    """Insert ``units[start:]`` one at a time (Algorithm 3).  Stops early
    when an overflow might need more nodes than are free: returns
    ``(next, pending)`` -- the unit index to go on from and the c-node
    whose overflow is still to resolve (-1: none); ``next == len(units)``
    when all are in."""
    cap_c = len(T.c_depth)
    cap_p = len(T.p_attr)
    cap_h = len(T.h_key)
    for i in range(start, len(units)):
        u = units[i]
        c = _descend(T, u)
        _link(T, u, c)
        if T.c_count[c] > T.c_cap[c]:
            room = reserve_per_unit * (T.c_count[c] + 1)
            if T.counts[N_C] + room > cap_c or T.counts[N_P] + T.c_count[c] + 1 > cap_p \
                    or 2 * (T.counts[H_USED] + T.c_count[c] + 1) > cap_h:
                return i + 1, c
            resolve_overflow(T, c)
    return len(units), -1


@njit(nogil=True, cache=True)
def delete_units(T, units):
    """Delete ``units`` (each in the tree), with the upward clean-up and
    the merge rule (see the module docstring)."""
    for i in range(len(units)):
        c = _unlink(T, units[i])
        _update_capacity(T, c)
        _clean_up(T, c)


@njit(nogil=True)
def _clean_up(T, c):
    while c != 0 and T.c_alive[c]:
        lo = T.c_child[2 * c]
        hi = T.c_child[2 * c + 1]
        childless = lo < 0 and hi < 0
        if childless and T.c_count[c] == 0 and T.c_np[c] == 0:
            b = T.c_parent[c]
            T.c_alive[c] = 0
            if b >= 0:                          # an empty half: its parent bucket loses it
                if T.c_child[2 * b] == c:
                    T.c_child[2 * b] = -1
                else:
                    T.c_child[2 * b + 1] = -1
                c = b
            else:                               # an empty top bucket: its p-node goes
                p = T.c_pnode[c]
                c = T.p_parent[p]
                _drop_pnode(T, p)
            continue
        b = T.c_parent[c]
        if not (childless and T.c_np[c] == 0 and b >= 0 and T.c_np[b] == 0):
            return
        s = T.c_child[2 * b] if T.c_child[2 * b] != c else T.c_child[2 * b + 1]
        if s >= 0 and (T.c_child[2 * s] >= 0 or T.c_child[2 * s + 1] >= 0 or T.c_np[s] > 0):
            return
        total = T.c_count[b] + T.c_count[c] + (T.c_count[s] if s >= 0 else 0)
        if 2 * total > T.c_cap[b]:
            return
        for h in (c, s):                        # the merge rule: both halves back into the open parent
            if h < 0:
                continue
            u = T.c_first[h]
            while u >= 0:
                nxt = T.u_next[u]
                _unlink(T, u)
                _link(T, u, b)
                u = nxt
            T.c_alive[h] = 0
        T.c_child[2 * b] = -1
        T.c_child[2 * b + 1] = -1
        c = b


# --------------------------------------------------------------- flattening
@njit(nogil=True, cache=True)
def freeze(T):
    """The tree as :class:`~gpu_kernels.betree.layout.BETreeArrays` fields:
    live c-nodes renumbered in preorder from the root, p-directories
    sorted by attribute, units in leaf order."""
    n_c = T.counts[N_C]
    new_id = np.full(n_c, -1, np.int64)
    order = np.empty(n_c, np.int64)
    stack = np.empty(n_c + 1, np.int64)
    stack[0] = 0
    sp = 1
    n = 0
    n_p = 0
    n_l = 0
    while sp > 0:
        sp -= 1
        c = stack[sp]
        new_id[c] = n
        order[n] = c
        n += 1
        n_l += T.c_count[c]
        # pushed in reverse, so popped: halves (low, high), then the p-nodes' tops by attribute
        k = T.c_np[c]
        n_p += k
        if k:
            ps = np.empty(k, np.int64)
            attrs = np.empty(k, np.int64)
            p = T.c_pfirst[c]
            q = 0
            while p >= 0:
                ps[q] = p
                attrs[q] = T.p_attr[p]
                q += 1
                p = T.p_next[p]
            by_attr = ps[np.argsort(attrs)]
            for q in range(k - 1, -1, -1):
                stack[sp] = T.p_top[by_attr[q]]
                sp += 1
        for half in range(1, -1, -1):
            h = T.c_child[2 * c + half]
            if h >= 0:
                stack[sp] = h
                sp += 1
    c_depth = np.empty(n, np.int16)
    c_child = np.full(2 * n, -1, np.int32)
    c_cap = np.empty(n, np.int64)
    c_leaf = np.zeros(n + 1, np.int64)
    c_pdir = np.zeros(n + 1, np.int64)
    p_attr = np.empty(n_p, np.int32)
    p_top = np.empty(n_p, np.int32)
    leaf_unit = np.empty(n_l, np.int64)
    at_p = 0
    at_l = 0
    for i in range(n):
        c = order[i]
        c_depth[i] = T.c_depth[c]
        c_cap[i] = T.c_cap[c]
        for half in range(2):
            h = T.c_child[2 * c + half]
            if h >= 0:
                c_child[2 * i + half] = new_id[h]
        k = T.c_np[c]
        if k:
            ps = np.empty(k, np.int64)
            attrs = np.empty(k, np.int64)
            p = T.c_pfirst[c]
            q = 0
            while p >= 0:
                ps[q] = p
                attrs[q] = T.p_attr[p]
                q += 1
                p = T.p_next[p]
            by_attr = np.argsort(attrs)
            for q in range(k):
                p_attr[at_p] = attrs[by_attr[q]]
                p_top[at_p] = new_id[T.p_top[ps[by_attr[q]]]]
                at_p += 1
        c_pdir[i + 1] = at_p
        u = T.c_first[c]
        while u >= 0:
            leaf_unit[at_l] = u
            at_l += 1
            u = T.u_next[u]
        c_leaf[i + 1] = at_l
    return c_depth, c_child, c_cap, c_leaf, c_pdir, p_attr, p_top, leaf_unit


@njit(nogil=True, cache=True)
def thaw(T, c_depth, c_child, c_cap, c_leaf, c_pdir, p_attr, p_top, leaf_unit, unit_map):
    """Make the empty dynamic tree ``T`` (room for every node) the
    flattened tree given, its units renumbered by ``unit_map`` (old unit ->
    new unit, -1: deleted).  Returns the c-nodes (new numbering = the
    flattened one) whose l-nodes lost a deleted unit, for
    :func:`clean_up_after_thaw`."""
    n = len(c_depth)
    T.counts[N_C] = n
    T.counts[N_P] = len(p_attr)
    for c in range(n):
        T.c_depth[c] = c_depth[c]
        T.c_child[2 * c] = c_child[2 * c]
        T.c_child[2 * c + 1] = c_child[2 * c + 1]
        T.c_first[c] = -1
        T.c_count[c] = 0
        T.c_cap[c] = c_cap[c]
        T.c_pfirst[c] = -1
        T.c_np[c] = 0
        T.c_alive[c] = 1
    T.c_parent[0] = -1
    T.c_pnode[0] = -1
    T.c_pdepth[0] = 0
    T.c_prefix[0] = 0
    # preorder: a c-node's parent bucket and its p-directory's owner come first
    for c in range(n):
        for half in range(2):
            h = c_child[2 * c + half]
            if h >= 0:
                T.c_parent[h] = c
                T.c_pnode[h] = T.c_pnode[c]
                T.c_pdepth[h] = T.c_pdepth[c]
                base = T.c_prefix[c] << np.uint64(1) if T.c_depth[c] > 0 else np.uint64(0)
                T.c_prefix[h] = base | np.uint64(half)
        for k in range(c_pdir[c + 1] - 1, c_pdir[c] - 1, -1):
            top = p_top[k]
            T.p_attr[k] = p_attr[k]
            T.p_top[k] = top
            T.p_parent[k] = c
            T.p_score[k] = 0
            T.p_alive[k] = 1
            first = T.c_pfirst[c]
            T.p_next[k] = first
            T.p_prev[k] = -1
            if first >= 0:
                T.p_prev[first] = k
            T.c_pfirst[c] = k
            T.c_np[c] += 1
            _hash_put(T, c, p_attr[k], k)
            T.c_parent[top] = -1
            T.c_pnode[top] = k
            T.c_pdepth[top] = T.c_pdepth[c] + 1
            T.c_prefix[top] = 0
    lost = np.zeros(n, np.uint8)
    for c in range(n):
        for i in range(c_leaf[c + 1] - 1, c_leaf[c] - 1, -1):      # (linking reverses: keep the leaf order)
            u = unit_map[leaf_unit[i]]
            if u >= 0:
                _link(T, u, c)
            else:
                lost[c] = 1
    return np.flatnonzero(lost)


@njit(nogil=True, cache=True)
def clean_up_after_thaw(T, lost):
    for i in range(len(lost)):
        c = lost[i]
        if T.c_alive[c]:
            _update_capacity(T, c)
            _clean_up(T, c)


@njit(nogil=True, cache=True)
def leaf_arrays(c_depth, c_child, c_leaf, c_pdir, p_attr, p_top, leaf_unit, unit_sub, unit_off, unit_pids,
                x_attr, x_op, exact_eq):
    """The kernels' leaf arrays: per leaf entry its subscription and the
    predicates to evaluate -- all of its unit's but those subsumed by an
    atomic bucket on its path (an ``=`` whose key is the bucket's one key,
    ``exact_eq``: a number, or a string of the base dictionary)."""
    n = len(c_depth)
    n_l = len(leaf_unit)
    # per c-node, the attributes whose bucket on its path is atomic (CSR over a preorder walk)
    atomic_attr = np.full(n, -1, np.int64)     # this c-node's own p-level, when atomic
    parent = np.full(n, -1, np.int64)
    level_attr = np.full(n, -1, np.int64)      # attribute of the directory the c-node belongs to
    for c in range(n):
        for half in range(2):
            h = c_child[2 * c + half]
            if h >= 0:
                parent[h] = c
                level_attr[h] = level_attr[c]
        for k in range(c_pdir[c], c_pdir[c + 1]):
            parent[p_top[k]] = c
            level_attr[p_top[k]] = p_attr[k]
        if c_depth[c] >= ATOMIC:
            atomic_attr[c] = level_attr[c]
    l_sub = np.empty(n_l, np.int64)
    l_verify = np.zeros(n_l + 1, np.int64)
    total = 0
    for i in range(n_l):
        u = leaf_unit[i]
        total += unit_off[u + 1] - unit_off[u]
    v_pid = np.empty(total, np.int32)
    path = np.empty(128, np.int64)
    at = 0
    for c in range(n):
        # atomic attributes on the path: the c-node itself and each c-node a p-node hangs from
        n_path = 0
        d = c
        while d >= 0:
            if atomic_attr[d] >= 0:
                if n_path == len(path):
                    grown = np.empty(2 * len(path), np.int64)
                    grown[:n_path] = path[:n_path]
                    path = grown
                path[n_path] = atomic_attr[d]
                n_path += 1
            d = parent[d]
        for i in range(c_leaf[c], c_leaf[c + 1]):
            u = leaf_unit[i]
            l_sub[i] = unit_sub[u]
            for j in range(unit_off[u], unit_off[u + 1]):
                pid = unit_pids[j]
                skip = False
                if x_op[pid] == EQ and exact_eq[pid]:
                    for q in range(n_path):
                        if path[q] == x_attr[pid]:
                            skip = True
                            break
                if not skip:
                    v_pid[at] = pid
                    at += 1
            l_verify[i + 1] = at
    return l_sub, l_verify, v_pid[:at].copy()


# ------------------------------------------------------------ Python face
#: c-nodes an overflow may need per unit of the overflowing l-node (a split
#: makes two, a chain of splits at most 64 levels, a partition one per unit)
RESERVE_PER_UNIT = 132

_C_FIELDS = {"c_depth": (np.int64, 0), "c_prefix": (np.uint64, 0), "c_parent": (np.int64, -1),
             "c_pnode": (np.int64, -1), "c_pdepth": (np.int64, 0), "c_first": (np.int64, -1),
             "c_count": (np.int64, 0), "c_cap": (np.int64, 0), "c_pfirst": (np.int64, -1), "c_np": (np.int64, 0),
             "c_alive": (np.uint8, 0)}
_P_FIELDS = {"p_attr": (np.int64, -1), "p_top": (np.int64, -1), "p_parent": (np.int64, -1),
             "p_next": (np.int64, -1), "p_prev": (np.int64, -1), "p_score": (np.int64, 0), "p_alive": (np.uint8, 0)}


def _grown(a: np.ndarray, size: int, fill) -> np.ndarray:
    out = np.full(size, fill, dtype=a.dtype)
    out[:len(a)] = a
    return out


class DynamicTree:
    """A BE-Tree being built or updated: its :class:`TreeArrays`, grown as
    needed between calls of the compiled functions.  ``keys`` is the
    units' key intervals (CSR by unit: offsets, attributes, low and high
    keys); a unit is referred to by its index there."""

    def __init__(self, n_units: int, keys, n_attrs: int, max_cap: int, min_size: int, n_cnodes: int = 1,
                 n_pnodes: int = 0):
        k_off, k_attr, k_lo, k_hi = keys
        c_room = max(64, 2 * n_cnodes)
        p_room = max(64, 2 * n_pnodes)
        arrays = {name: np.full(c_room, fill, dtype) for name, (dtype, fill) in _C_FIELDS.items()}
        arrays["c_child"] = np.full(2 * c_room, -1, np.int64)
        arrays.update({name: np.full(p_room, fill, dtype) for name, (dtype, fill) in _P_FIELDS.items()})
        arrays["h_key"] = np.full(_pow2(4 * p_room), EMPTY, np.int64)
        arrays["h_val"] = np.full(len(arrays["h_key"]), -1, np.int64)
        arrays.update(u_cnode=np.full(n_units, -1, np.int64), u_next=np.full(n_units, -1, np.int64),
                      u_prev=np.full(n_units, -1, np.int64), k_off=np.asarray(k_off, np.int64),
                      k_attr=np.asarray(k_attr, np.int64), k_lo=np.asarray(k_lo, np.uint64),
                      k_hi=np.asarray(k_hi, np.uint64))
        arrays["attr_count"] = np.zeros(n_attrs + 1, np.int64)
        arrays["touched"] = np.zeros(n_attrs + 1, np.int64)
        counts = np.zeros(8, np.int64)
        counts[MAX_CAP] = max_cap
        counts[MIN_SIZE] = min_size
        arrays["counts"] = counts
        self.T = TreeArrays(**arrays)
        if n_cnodes == 1:        # a new tree: the root c-node, empty
            counts[N_C] = 1
            self._root()

    def _root(self) -> None:
        T = self.T
        T.c_depth[0] = 0
        T.c_first[0] = -1
        T.c_count[0] = 0
        T.c_cap[0] = T.counts[MAX_CAP]
        T.c_alive[0] = 1
        T.c_pnode[0] = -1
        T.c_parent[0] = -1

    @classmethod
    def thawed(cls, flat: BETreeArrays, unit_map: np.ndarray, n_units: int, keys, n_attrs: int, max_cap: int,
               min_size: int) -> "DynamicTree":
        """The dynamic tree of a flattened one, units renumbered by
        ``unit_map`` (-1: deleted, and the l-nodes that lose them cleaned up)."""
        n_attrs = max(n_attrs, int(flat.p_attr.max(initial=-1)) + 1)
        tree = cls(n_units, keys, n_attrs, max_cap, min_size, n_cnodes=len(flat.c_depth),
                   n_pnodes=len(flat.p_attr))
        lost = thaw(tree.T, *flat, np.asarray(unit_map, np.int64))
        clean_up_after_thaw(tree.T, lost)
        return tree

    def _grow(self, c_need: int, p_need: int) -> None:
        T = self.T
        arrays = T._asdict()
        c_room = len(T.c_depth)
        if c_need > c_room:
            size = max(2 * c_room, c_need)
            for name, (_, fill) in _C_FIELDS.items():
                arrays[name] = _grown(arrays[name], size, fill)
            arrays["c_child"] = _grown(arrays["c_child"], 2 * size, -1)
        p_room = len(T.p_attr)
        if p_need > p_room:
            size = max(2 * p_room, p_need)
            for name, (_, fill) in _P_FIELDS.items():
                arrays[name] = _grown(arrays[name], size, fill)
        if 2 * (int(T.counts[H_USED]) + p_need - int(T.counts[N_P])) > len(T.h_key) or 4 * p_need > len(T.h_key):
            size = _pow2(4 * max(p_need, len(arrays["p_attr"])))
            arrays["h_key"] = np.full(size, EMPTY, np.int64)
            arrays["h_val"] = np.full(size, -1, np.int64)
            self.T = TreeArrays(**arrays)
            rehash(self.T)
            return
        self.T = TreeArrays(**arrays)

    def insert(self, units: np.ndarray) -> None:
        """Insert ``units`` one at a time (Algorithm 3)."""
        units = np.ascontiguousarray(units, np.int64)
        start = 0
        while start < len(units):
            start, pending = insert_units(self.T, units, start, RESERVE_PER_UNIT)
            if pending >= 0:
                T = self.T
                n = int(T.c_count[pending]) + 1
                self._grow(int(T.counts[N_C]) + RESERVE_PER_UNIT * n, int(T.counts[N_P]) + n)
                resolve_overflow(self.T, pending)

    def delete(self, units: np.ndarray) -> None:
        """Delete ``units`` (each in the tree)."""
        delete_units(self.T, np.ascontiguousarray(units, np.int64))

    def freeze(self) -> BETreeArrays:
        return BETreeArrays(*freeze(self.T))


def _pow2(n: int) -> int:
    return 1 << max(6, int(n - 1).bit_length())
