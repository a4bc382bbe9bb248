"""The dynamic BE-Tree (Sadoghi, Jacobsen, SIGMOD 2011, §4-§6), in numba.

The tree lives in a few growable arrays (:class:`TreeArrays`: one row per
c-node, p-node, hash slot and unit, the fields of a node side by side),
changed in place by the compiled functions below -- each helper takes only
the arrays it reads, since numba pays reference counting per array argument
on every call -- and flattened into
:class:`~gpu_kernels.betree.layout.BETreeArrays` for matching
(:func:`freeze`); :func:`thaw` makes a dynamic tree of a flattened one
again, so an update starts from an immutable structure and never touches
what a match in flight reads.

**Insertion** (Algorithm 3, ``InsertBETree``): from the root c-node, among
the unit's attributes that have a p-node in the current c-node's
p-directory (a hash table over (c-node, attribute)), take the p-node of
highest score; descend its clustering directory to the smallest bucket that
encloses the unit's interval on that attribute (Algorithm 4,
``InsertCDir``: the *insertion rule*; a half the grid has but the tree
dropped when it emptied is made again on the way); repeat from that
bucket's c-node.  With no such p-node the unit joins the current c-node's
l-node.

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

# c-node fields (columns of C)
DEPTH, PREFIX, CHILD, CHILD1, PARENT, PNODE, PDEPTH, FIRST, COUNT, CAP, PFIRST, NP, ALIVE = range(13)
N_CFIELDS = 13
# p-node fields (columns of P)
P_ATTR, P_TOP, P_PARENT, P_NEXT, P_PREV, P_SCORE, P_ALIVE = range(7)
N_PFIELDS = 7
# unit fields (columns of U)
U_CNODE, U_NEXT, U_PREV = range(3)
# counts[] slots (EQUAL_KEYS: the option of DynamicTree's ``equal_keys_partition``)
N_C, N_P, H_USED, MAX_CAP, MIN_SIZE, EQUAL_KEYS = range(6)
EMPTY = -1
DELETED = -2


class TreeArrays(NamedTuple):
    """The dynamic tree (see the module docstring); ``C``, ``P`` and ``H``
    are grown by :class:`DynamicTree` between compiled calls."""

    C: np.ndarray           # int64 [c-nodes, N_CFIELDS]; PREFIX holds the uint64 prefix's bits
    P: np.ndarray           # int64 [p-nodes, N_PFIELDS]
    H: np.ndarray           # int64 [slots, 2]: p-directory hash (c-node << 32 | attribute) -> p-node
    U: np.ndarray           # int64 [units, 3]: l-node membership, doubly linked
    k_off: np.ndarray       # int64 [units + 1]: the units' key intervals, CSR by unit,
    k_attr: np.ndarray      # int64              attributes ascending
    k_lo: np.ndarray        # uint64
    k_hi: np.ndarray        # uint64
    attr_count: np.ndarray  # int64 scratch of the partitioning choice, one slot per attribute
    touched: np.ndarray     # int64
    counts: np.ndarray      # int64 [N_C, N_P, H_USED, MAX_CAP, MIN_SIZE]


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


@njit(inline="always", nogil=True)
def _encloses(C, c, lo, hi):
    depth = C[c, DEPTH]
    prefix = np.uint64(C[c, PREFIX])
    return bucket_has(depth, prefix, lo) and bucket_has(depth, prefix, hi)


# --------------------------------------------------------------------- hash
@njit(inline="always", nogil=True)
def _slot(key, mask):
    return np.int64((np.uint64(key) * np.uint64(0x9E3779B97F4A7C15)) >> np.uint64(40)) & mask


@njit(nogil=True)
def find_pnode(H, c, attr):
    """The p-node of attribute ``attr`` in c-node ``c``'s p-directory, or -1."""
    key = (c << 32) | attr
    mask = len(H) - 1
    i = _slot(key, mask)
    while True:
        k = H[i, 0]
        if k == key:
            return H[i, 1]
        if k == EMPTY:
            return -1
        i = (i + 1) & mask


@njit(nogil=True)
def _hash_put(H, counts, c, attr, p):
    key = (c << 32) | attr
    mask = len(H) - 1
    i = _slot(key, mask)
    while H[i, 0] >= 0:
        i = (i + 1) & mask
    if H[i, 0] == EMPTY:
        counts[H_USED] += 1
    H[i, 0] = key
    H[i, 1] = p


@njit(nogil=True)
def _hash_delete(H, c, attr):
    key = (c << 32) | attr
    mask = len(H) - 1
    i = _slot(key, mask)
    while True:
        k = H[i, 0]
        if k == key:
            H[i, 0] = DELETED
            return
        if k == EMPTY:
            return
        i = (i + 1) & mask


@njit(nogil=True, cache=True)
def rehash(P, H, counts):
    """Fill an empty hash table (a grown one) with the live p-nodes."""
    H[:, 0] = EMPTY
    counts[H_USED] = 0
    for p in range(counts[N_P]):
        if P[p, P_ALIVE]:
            _hash_put(H, counts, P[p, P_PARENT], P[p, P_ATTR], p)


# -------------------------------------------------------------------- nodes
@njit(nogil=True)
def _new_cnode(C, counts, depth, prefix, parent, pnode, pdepth):
    c = counts[N_C]
    counts[N_C] = c + 1
    C[c, DEPTH] = depth
    C[c, PREFIX] = np.int64(prefix)
    C[c, CHILD] = -1
    C[c, CHILD1] = -1
    C[c, PARENT] = parent
    C[c, PNODE] = pnode
    C[c, PDEPTH] = pdepth
    C[c, FIRST] = -1
    C[c, COUNT] = 0
    C[c, CAP] = counts[MAX_CAP]
    C[c, PFIRST] = -1
    C[c, NP] = 0
    C[c, ALIVE] = 1
    return c


@njit(nogil=True)
def _new_half(C, counts, c, half):
    """Bucket ``c``'s half ``half`` (0: low keys, 1: high keys), made and linked."""
    depth = C[c, DEPTH]
    base = np.uint64(C[c, PREFIX]) << np.uint64(1) if depth > 0 else np.uint64(0)
    h = _new_cnode(C, counts, depth + 1, base | np.uint64(half), c, C[c, PNODE], C[c, PDEPTH])
    C[c, CHILD + half] = h
    return h


@njit(nogil=True)
def _attach_pnode(C, P, H, counts, c, p, attr, top):
    """Make row ``p`` the p-node of ``attr`` in c-node ``c``'s p-directory
    (its sibling list and the hash), its directory's top bucket ``top``."""
    P[p, P_ATTR] = attr
    P[p, P_TOP] = top
    P[p, P_PARENT] = c
    P[p, P_SCORE] = 0
    P[p, P_ALIVE] = 1
    first = C[c, PFIRST]
    P[p, P_NEXT] = first
    P[p, P_PREV] = -1
    if first >= 0:
        P[first, P_PREV] = p
    C[c, PFIRST] = p
    C[c, NP] += 1
    _hash_put(H, counts, c, attr, p)


@njit(nogil=True)
def _new_pnode(C, P, H, counts, c, attr):
    """A p-node for ``attr`` in c-node ``c``'s p-directory, with the empty
    top bucket of its clustering directory (Algorithm 5, line 4)."""
    p = counts[N_P]
    counts[N_P] = p + 1
    _attach_pnode(C, P, H, counts, c, p, attr, _new_cnode(C, counts, 0, np.uint64(0), -1, p, C[c, PDEPTH] + 1))
    return p


@njit(nogil=True)
def _drop_pnode(C, P, H, p):
    c = P[p, P_PARENT]
    nxt = P[p, P_NEXT]
    prv = P[p, P_PREV]
    if prv >= 0:
        P[prv, P_NEXT] = nxt
    else:
        C[c, PFIRST] = nxt
    if nxt >= 0:
        P[nxt, P_PREV] = prv
    C[c, NP] -= 1
    _hash_delete(H, c, P[p, P_ATTR])
    P[p, P_ALIVE] = 0
    C[P[p, P_TOP], ALIVE] = 0


@njit(nogil=True)
def _add_score(C, P, c, delta):
    """Add ``delta`` to the score of every p-node on c-node ``c``'s path."""
    p = C[c, PNODE]
    while p >= 0:
        P[p, P_SCORE] += delta
        p = C[P[p, P_PARENT], PNODE]


@njit(nogil=True)
def _link(C, P, U, u, c):
    first = C[c, FIRST]
    U[u, U_NEXT] = first
    U[u, U_PREV] = -1
    if first >= 0:
        U[first, U_PREV] = u
    C[c, FIRST] = u
    C[c, COUNT] += 1
    U[u, U_CNODE] = c
    _add_score(C, P, c, C[c, PDEPTH])


@njit(nogil=True)
def _unlink(C, P, U, u):
    c = U[u, U_CNODE]
    nxt = U[u, U_NEXT]
    prv = U[u, U_PREV]
    if prv >= 0:
        U[prv, U_NEXT] = nxt
    else:
        C[c, FIRST] = nxt
    if nxt >= 0:
        U[nxt, U_PREV] = prv
    C[c, COUNT] -= 1
    U[u, U_CNODE] = -1
    _add_score(C, P, c, -C[c, PDEPTH])
    return c


@njit(nogil=True)
def _update_capacity(C, counts, c):
    """UpdateClusterCapacity (§4.2): ``ceil(|l| / max_cap) * max_cap``, or
    ``max_cap`` for an empty l-node."""
    m = counts[MAX_CAP]
    n = C[c, COUNT]
    C[c, CAP] = ((n + m - 1) // m) * m if n > 0 else m


@njit(nogil=True)
def _key_of(k_off, k_attr, u, attr):
    """The unit's key entry for ``attr`` (-1: it does not constrain it)."""
    for j in range(k_off[u], k_off[u + 1]):
        if k_attr[j] == attr:
            return j
    return -1


@njit(nogil=True)
def _insert_cdir(C, counts, lo, hi, top):
    """Algorithm 4 (InsertCDir): the smallest bucket below ``top`` that
    encloses ``[lo, hi]``.  In a split bucket, a half the grid has but the
    tree dropped (it emptied) is made again: the grid is fixed, whatever
    the tree holds."""
    c = top
    while C[c, CHILD] >= 0 or C[c, CHILD1] >= 0:
        depth = C[c, DEPTH]
        if depth >= ATOMIC:
            return c
        half = half_of(lo, depth)
        if half != half_of(hi, depth):
            return c
        h = C[c, CHILD + half]
        if h < 0:
            h = _new_half(C, counts, c, half)
        c = h
    return c


# ------------------------------------------------------------ space cutting
@njit(nogil=True)
def _best_new_attr(C, P, H, U, k_off, k_attr, attr_count, touched, counts, c):
    """The attribute to partition c-node ``c``'s l-node on (Algorithm 5,
    line 3): not used on its path, no p-node here yet, constrained by the
    most units (at least ``min_size``; ties: the smallest id), or -1."""
    path = np.empty(C[c, PDEPTH] + 1, np.int64)
    n_path = 0
    p = C[c, PNODE]
    while p >= 0:
        path[n_path] = P[p, P_ATTR]
        n_path += 1
        p = C[P[p, P_PARENT], PNODE]
    n_touched = 0
    u = C[c, FIRST]
    while u >= 0:
        for j in range(k_off[u], k_off[u + 1]):
            a = k_attr[j]
            used = False
            for q in range(n_path):
                if path[q] == a:
                    used = True
                    break
            if used:
                continue
            if attr_count[a] == 0:
                touched[n_touched] = a
                n_touched += 1
            attr_count[a] += 1
        u = U[u, U_NEXT]
    best = -1
    best_count = counts[MIN_SIZE] - 1
    for q in range(n_touched):
        a = touched[q]
        n = attr_count[a]
        attr_count[a] = 0
        if (n > best_count or (n == best_count and best >= 0 and a < best)) and find_pnode(H, c, a) < 0:
            best = a
            best_count = n
    return best


@njit(nogil=True)
def _push(work, n_work, c):
    if n_work == len(work):
        grown = np.empty(2 * len(work), np.int64)
        grown[:n_work] = work[:n_work]
        work = grown
    work[n_work] = c
    return work, n_work + 1


@njit(nogil=True)
def _room(C, P, H, counts, c_nodes, p_nodes):
    """Whether ``c_nodes`` more c-nodes and ``p_nodes`` more p-nodes (and
    their hash entries, the table kept at most half full) fit now."""
    return (counts[N_C] + c_nodes <= len(C) and counts[N_P] + p_nodes <= len(P)
            and 2 * (counts[H_USED] + p_nodes) <= len(H))


@njit(nogil=True)
def _one_key(C, P, U, k_off, k_attr, k_lo, k_hi, c):
    """Whether every unit of leaf bucket ``c``'s l-node has one and the
    same key interval on the bucket's attribute: halving the bucket could
    then only move them all into one half, level after level, down to the
    atomic depth."""
    attr = P[C[c, PNODE], P_ATTR]
    u = C[c, FIRST]
    j0 = _key_of(k_off, k_attr, u, attr)
    u = U[u, U_NEXT]
    while u >= 0:
        j = _key_of(k_off, k_attr, u, attr)
        if k_lo[j] != k_lo[j0] or k_hi[j] != k_hi[j0]:
            return False
        u = U[u, U_NEXT]
    return True


@njit(nogil=True, cache=True)
def resolve_overflow(T, work, n_work):
    """Resolve the overflows of the c-nodes on the work list ``work[:n_work]``
    and every overflow they cause (the two-phase space cutting of §4):

    * space partitioning (Algorithm 5) of the root, a non-leaf bucket or an
      atomic bucket: while it overflows, a new p-node for the best unused
      attribute takes the units constraining it into its top bucket (which
      is handled in turn); then the capacity is updated;
    * space clustering (Algorithm 6) of a non-atomic leaf bucket: split in
      halves (the forced split rule), the units a half encloses moved
      there; the bucket and both halves are handled again.  With
      ``equal_keys_partition`` (the events' trees of online stream
      re-ordering), a leaf bucket whose units all share one key interval is
      partitioned as an atomic one at once: the 64-bit keys would otherwise
      halve it level by level, two c-nodes a level, every unit in the same
      half each time (53,519 c-nodes for 1,024 events at capacity 8).

    How many nodes a cascade makes is not known in advance (identical units
    with many attributes partition attribute after attribute, each down a
    chain of splits), so each step checks that its nodes fit: when they
    do not, it stops, its c-node back on the list, and returns
    ``(work, n_work)`` with ``n_work > 0`` -- the caller grows the arrays
    and calls again with that list.  ``n_work == 0``: all resolved."""
    C, P, H, U = T.C, T.P, T.H, T.U
    k_off, k_attr, k_lo, k_hi, counts = T.k_off, T.k_attr, T.k_lo, T.k_hi, T.counts
    while n_work > 0:
        c = work[n_work - 1]
        if C[c, COUNT] <= C[c, CAP]:
            n_work -= 1
            continue
        leaf_bucket = C[c, CHILD] < 0 and C[c, CHILD1] < 0
        if c == 0 or not leaf_bucket or C[c, DEPTH] >= ATOMIC or (
                counts[EQUAL_KEYS] != 0 and _one_key(C, P, U, k_off, k_attr, k_lo, k_hi, c)):
            n_work -= 1
            while C[c, COUNT] > C[c, CAP]:
                attr = _best_new_attr(C, P, H, U, k_off, k_attr, T.attr_count, T.touched, counts, c)
                if attr < 0:
                    break
                if not _room(C, P, H, counts, 1, 1):
                    return _push(work, n_work, c)       # partly partitioned: goes on from here
                p = _new_pnode(C, P, H, counts, c, attr)
                top = P[p, P_TOP]
                u = C[c, FIRST]
                while u >= 0:
                    nxt = U[u, U_NEXT]
                    if _key_of(k_off, k_attr, u, attr) >= 0:
                        _unlink(C, P, U, u)
                        _link(C, P, U, u, top)
                    u = nxt
                work, n_work = _push(work, n_work, top)
            _update_capacity(C, counts, c)
        else:
            if not _room(C, P, H, counts, 2, 0):
                return work, n_work
            n_work -= 1
            depth = C[c, DEPTH]
            _new_half(C, counts, c, 0)
            _new_half(C, counts, c, 1)
            attr = P[C[c, PNODE], P_ATTR]
            u = C[c, FIRST]
            while u >= 0:
                nxt = U[u, U_NEXT]
                j = _key_of(k_off, k_attr, u, attr)
                half = half_of(k_lo[j], depth)
                if half == half_of(k_hi[j], depth):
                    _unlink(C, P, U, u)
                    _link(C, P, U, u, C[c, CHILD + half])
                u = nxt
            work, n_work = _push(work, n_work, c)
            work, n_work = _push(work, n_work, C[c, CHILD])
            work, n_work = _push(work, n_work, C[c, CHILD1])
    return work, n_work


@njit(nogil=True, cache=True)
def insert_units(T, units, start):
    """Insert ``units[start:]`` one at a time (Algorithm 3): from the root,
    the p-node of highest score among the unit's attributes found in the
    c-node's p-directory, down its clustering directory (Algorithm 4),
    until no p-node applies; the unit joins that l-node, whose overflow is
    then resolved.  Stops early when the way down might need more c-nodes
    than are free, or an overflow's cascade ran out of room: returns
    ``(next, work, n_work)`` -- the unit index to go on from and
    :func:`resolve_overflow`'s work list still to resolve (``n_work`` 0:
    none)."""
    C, P, H, U = T.C, T.P, T.H, T.U
    k_off, k_attr, k_lo, k_hi, counts = T.k_off, T.k_attr, T.k_lo, T.k_hi, T.counts
    cap_c = len(C)
    work = np.empty(64, np.int64)
    for i in range(start, len(units)):
        u = units[i]
        # the way down may make again a half per bucket level: 65 per p-node level at most
        if counts[N_C] + 65 * (k_off[u + 1] - k_off[u] + 1) > cap_c:
            return i, work, 0
        c = 0
        while True:
            best = -1
            best_score = np.int64(-1)
            best_j = np.int64(-1)
            if C[c, NP] > 0:
                for j in range(k_off[u], k_off[u + 1]):
                    p = find_pnode(H, c, k_attr[j])
                    if p >= 0 and P[p, P_SCORE] > best_score:
                        best = p
                        best_score = P[p, P_SCORE]
                        best_j = j
            if best < 0:
                break
            c = _insert_cdir(C, counts, k_lo[best_j], k_hi[best_j], P[best, P_TOP])
        _link(C, P, U, u, c)
        if C[c, COUNT] > C[c, CAP]:
            work[0] = c
            work, n_work = resolve_overflow(T, work, np.int64(1))      # (int64, as the other call: one compile)
            if n_work > 0:
                return i + 1, work, n_work
    return len(units), work, 0


@njit(nogil=True, cache=True)
def delete_units(T, units):
    """Delete ``units`` (each in the tree), with the upward clean-up and
    the merge rule (see the module docstring)."""
    C, P, U = T.C, T.P, T.U
    for i in range(len(units)):
        c = _unlink(C, P, U, units[i])
        _update_capacity(C, T.counts, c)
        _clean_up(C, P, T.H, U, c)


@njit(nogil=True)
def _clean_up(C, P, H, U, c):
    while c != 0 and C[c, ALIVE]:
        childless = C[c, CHILD] < 0 and C[c, CHILD1] < 0
        if childless and C[c, COUNT] == 0 and C[c, NP] == 0:
            b = C[c, PARENT]
            C[c, ALIVE] = 0
            if b >= 0:                          # an empty half: its parent bucket loses it
                if C[b, CHILD] == c:
                    C[b, CHILD] = -1
                else:
                    C[b, CHILD1] = -1
                c = b
            else:                               # an empty top bucket: its p-node goes
                p = C[c, PNODE]
                c = P[p, P_PARENT]
                _drop_pnode(C, P, H, p)
            continue
        b = C[c, PARENT]
        if not (childless and C[c, NP] == 0 and b >= 0 and C[b, NP] == 0):
            return
        s = C[b, CHILD] if C[b, CHILD] != c else C[b, CHILD1]
        if s >= 0 and (C[s, CHILD] >= 0 or C[s, CHILD1] >= 0 or C[s, NP] > 0):
            return
        total = C[b, COUNT] + C[c, COUNT] + (C[s, COUNT] if s >= 0 else 0)
        if 2 * total > C[b, CAP]:
            return
        for h in (c, s):                        # the merge rule: both halves back into the open parent
            if h < 0:
                continue
            u = C[h, FIRST]
            while u >= 0:
                nxt = U[u, U_NEXT]
                _unlink(C, P, U, u)
                _link(C, P, U, u, b)
                u = nxt
            C[h, ALIVE] = 0
        C[b, CHILD] = -1
        C[b, CHILD1] = -1
        c = b


# --------------------------------------------------------------- flattening
@njit(nogil=True)
def _pnodes_by_attr(C, P, c):
    k = C[c, NP]
    ps = np.empty(k, np.int64)
    attrs = np.empty(k, np.int64)
    p = C[c, PFIRST]
    q = 0
    while p >= 0:
        ps[q] = p
        attrs[q] = P[p, P_ATTR]
        q += 1
        p = P[p, P_NEXT]
    order = np.argsort(attrs)
    return ps[order], attrs[order]


@njit(nogil=True)
def _kept(C, c):
    """Whether the flattened tree keeps c-node ``c``: an empty half with
    nothing below is dropped (the grid makes it again when a unit needs it)."""
    return C[c, COUNT] > 0 or C[c, NP] > 0 or C[c, CHILD] >= 0 or C[c, CHILD1] >= 0 or C[c, PARENT] < 0


@njit(nogil=True, cache=True)
def freeze(T):
    """The tree as :class:`~gpu_kernels.betree.layout.BETreeArrays` fields:
    c-nodes renumbered in preorder from the root, p-directories sorted by
    attribute, units in leaf order."""
    C, P, U = T.C, T.P, T.U
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
        n_l += C[c, COUNT]
        # pushed in reverse, so popped: halves (low, high), then the p-nodes' tops by attribute
        if C[c, NP]:
            ps, _ = _pnodes_by_attr(C, P, c)
            n_p += len(ps)
            for q in range(len(ps) - 1, -1, -1):
                stack[sp] = P[ps[q], P_TOP]
                sp += 1
        for half in range(1, -1, -1):
            h = C[c, CHILD + half]
            if h >= 0 and _kept(C, h):
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
        c_depth[i] = C[c, DEPTH]
        c_cap[i] = C[c, CAP]
        for half in range(2):
            h = C[c, CHILD + half]
            if h >= 0 and new_id[h] >= 0:
                c_child[2 * i + half] = new_id[h]
        if C[c, NP]:
            ps, attrs = _pnodes_by_attr(C, P, c)
            for q in range(len(ps)):
                p_attr[at_p] = attrs[q]
                p_top[at_p] = new_id[P[ps[q], P_TOP]]
                at_p += 1
        c_pdir[i + 1] = at_p
        u = C[c, FIRST]
        while u >= 0:
            leaf_unit[at_l] = u
            at_l += 1
            u = U[u, U_NEXT]
        c_leaf[i + 1] = at_l
    return c_depth, c_child, c_cap, c_leaf, c_pdir, p_attr, p_top, leaf_unit


@njit(nogil=True, cache=True)
def thaw(T, c_depth, c_child, c_cap, c_leaf, c_pdir, p_attr, p_top, leaf_unit, unit_map):
    """Make the empty dynamic tree ``T`` (room for every node) the
    flattened tree given, its units renumbered by ``unit_map`` (old unit ->
    new unit, -1: deleted).  Returns the c-nodes whose l-nodes lost a
    deleted unit, for :func:`clean_up_after_thaw`."""
    C, P, H, U, counts = T.C, T.P, T.H, T.U, T.counts
    n = len(c_depth)
    counts[N_C] = n
    counts[N_P] = len(p_attr)
    for c in range(n):
        C[c, DEPTH] = c_depth[c]
        C[c, CHILD] = c_child[2 * c]
        C[c, CHILD1] = c_child[2 * c + 1]
        C[c, FIRST] = -1
        C[c, COUNT] = 0
        C[c, CAP] = c_cap[c]
        C[c, PFIRST] = -1
        C[c, NP] = 0
        C[c, ALIVE] = 1
    C[0, PARENT] = -1
    C[0, PNODE] = -1
    C[0, PDEPTH] = 0
    C[0, PREFIX] = 0
    # preorder: a c-node's parent bucket and its p-directory's owner come first
    for c in range(n):
        for half in range(2):
            h = c_child[2 * c + half]
            if h >= 0:
                C[h, PARENT] = c
                C[h, PNODE] = C[c, PNODE]
                C[h, PDEPTH] = C[c, PDEPTH]
                base = np.uint64(C[c, PREFIX]) << np.uint64(1) if C[c, DEPTH] > 0 else np.uint64(0)
                C[h, PREFIX] = np.int64(base | np.uint64(half))
        for k in range(c_pdir[c + 1] - 1, c_pdir[c] - 1, -1):
            top = p_top[k]
            _attach_pnode(C, P, H, counts, c, k, p_attr[k], top)
            C[top, PARENT] = -1
            C[top, PNODE] = k
            C[top, PDEPTH] = C[c, PDEPTH] + 1
            C[top, PREFIX] = 0
    lost = np.zeros(n, np.uint8)
    for c in range(n):
        for i in range(c_leaf[c + 1] - 1, c_leaf[c] - 1, -1):      # (linking reverses: keep the leaf order)
            u = unit_map[leaf_unit[i]]
            if u >= 0:
                _link(C, P, U, u, c)
            else:
                lost[c] = 1
    return np.flatnonzero(lost)


@njit(nogil=True, cache=True)
def clean_up_after_thaw(T, lost):
    C = T.C
    for i in range(len(lost)):
        c = lost[i]
        if C[c, ALIVE]:
            _update_capacity(C, T.counts, c)
            _clean_up(C, T.P, T.H, T.U, c)


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


@njit(nogil=True, cache=True)
def misplaced_unit(c_depth, c_child, c_leaf, c_pdir, p_attr, p_top, leaf_unit, k_off, k_attr, k_lo, k_hi):
    """The first leaf unit of a flattened tree that is not where a BE-Tree
    puts it -- every bucket on its path must enclose its interval on that
    directory's attribute -- or -1.  (A crafted tree could otherwise answer
    wrongly without reading out of bounds.)"""
    n = len(c_depth)
    parent = np.full(n, -1, np.int64)
    level_attr = np.full(n, -1, np.int64)
    top_of = np.zeros(n, np.int64)          # the top bucket of the c-node's directory
    prefix = np.zeros(n, np.uint64)
    for c in range(n):
        for half in range(2):
            h = c_child[2 * c + half]
            if h >= 0:
                parent[h] = c
                level_attr[h] = level_attr[c]
                top_of[h] = top_of[c]
                base = prefix[c] << np.uint64(1) if c_depth[c] > 0 else np.uint64(0)
                prefix[h] = base | np.uint64(half)
        for k in range(c_pdir[c], c_pdir[c + 1]):
            parent[p_top[k]] = c
            level_attr[p_top[k]] = p_attr[k]
            top_of[p_top[k]] = p_top[k]
    # buckets nest: per directory on the path, the deepest bucket (where the path leaves it) decides
    for c in range(n):
        for i in range(c_leaf[c], c_leaf[c + 1]):
            u = leaf_unit[i]
            d = c
            while d > 0:
                j = -1
                for q in range(k_off[u], k_off[u + 1]):
                    if k_attr[q] == level_attr[d]:
                        j = q
                        break
                if j < 0 or not (bucket_has(c_depth[d], prefix[d], k_lo[j])
                                 and bucket_has(c_depth[d], prefix[d], k_hi[j])):
                    return u
                d = parent[top_of[d]]
    return -1


@njit(nogil=True, cache=True)
def subtree_ends(c_child, c_pdir, p_top):
    """Per c-node of a flattened tree, one past the last c-node of its
    subtree (preorder makes every subtree a contiguous range)."""
    n = len(c_pdir) - 1
    end = np.arange(1, n + 1)
    for c in range(n - 1, -1, -1):
        for half in range(2):
            h = c_child[2 * c + half]
            if h >= 0:
                end[c] = max(end[c], end[h])
        for k in range(c_pdir[c], c_pdir[c + 1]):
            end[c] = max(end[c], end[p_top[k]])
    return end


# ------------------------------------------------------------ Python face
def _grown(a: np.ndarray, rows: int, fill) -> np.ndarray:
    out = np.full((rows,) + a.shape[1:], fill, dtype=a.dtype)
    out[:len(a)] = a
    return out


def _pow2(n: int) -> int:
    return 1 << max(6, int(n - 1).bit_length())


class DynamicTree:
    """A BE-Tree being built or updated: its :class:`TreeArrays`, grown as
    needed between calls of the compiled functions.  ``keys`` is the
    units' key intervals (CSR by unit: offsets, attributes, low and high
    keys); a unit is referred to by its index there."""

    def __init__(self, n_units: int, keys, n_attrs: int, max_cap: int, min_size: int, n_cnodes: int = 0,
                 n_pnodes: int = 0, equal_keys_partition: bool = False):
        k_off, k_attr, k_lo, k_hi = keys
        counts = np.zeros(8, np.int64)
        counts[MAX_CAP] = max_cap
        counts[MIN_SIZE] = min_size
        counts[EQUAL_KEYS] = int(bool(equal_keys_partition))
        C = np.full((max(64, 2 * n_cnodes), N_CFIELDS), -1, np.int64)
        P = np.full((max(64, 2 * n_pnodes), N_PFIELDS), -1, np.int64)
        self.T = TreeArrays(C, P, np.full((_pow2(4 * len(P)), 2), EMPTY, np.int64),
                            np.full((n_units, 3), -1, np.int64), np.asarray(k_off, np.int64),
                            np.asarray(k_attr, np.int64), np.asarray(k_lo, np.uint64), np.asarray(k_hi, np.uint64),
                            np.zeros(n_attrs + 1, np.int64), np.zeros(n_attrs + 1, np.int64), counts)
        if n_cnodes == 0:        # a new tree: the root c-node, empty
            _new_cnode(C, counts, 0, np.uint64(0), -1, -1, 0)

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
        C, P, H = T.C, T.P, T.H
        if c_need > len(C):
            C = _grown(C, max(2 * len(C), c_need), -1)
        if p_need > len(P):
            P = _grown(P, max(2 * len(P), p_need), -1)
        rehashed = 2 * (int(T.counts[H_USED]) + p_need - int(T.counts[N_P])) > len(H) or 4 * p_need > len(H)
        if rehashed:
            H = np.full((_pow2(4 * max(p_need, len(P))), 2), EMPTY, np.int64)
        self.T = T._replace(C=C, P=P, H=H)
        if rehashed:
            rehash(self.T.P, self.T.H, self.T.counts)

    def insert(self, units: np.ndarray) -> None:
        """Insert ``units`` one at a time (Algorithm 3)."""
        units = np.ascontiguousarray(units, np.int64)
        start = 0
        while start < len(units):
            start, work, n_work = insert_units(self.T, units, start)
            while n_work > 0:         # an overflow's cascade ran out of room: grow what is full, go on
                n_c, n_p = int(self.T.counts[N_C]), int(self.T.counts[N_P])
                self._grow(n_c + 2, n_p + 1)
                work, n_work = resolve_overflow(self.T, work, n_work)
            if start < len(units):
                self._grow(2 * len(self.T.C), len(self.T.P))

    def delete(self, units: np.ndarray) -> None:
        """Delete ``units`` (each in the tree)."""
        delete_units(self.T, np.ascontiguousarray(units, np.int64))

    def score(self, p: int) -> int:
        """p-node ``p``'s score (§5's gain of its subtree)."""
        return int(self.T.P[p, P_SCORE])

    def freeze(self) -> BETreeArrays:
        return BETreeArrays(*freeze(self.T))
