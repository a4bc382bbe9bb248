"""The A-Tree built by compiled code: :class:`ArrayDag`, the DAG of
:mod:`gpu_kernels.atree.dag` held in arrays and changed by numba kernels.

:class:`gpu_kernels.atree.dag.ATreeDag` builds the DAG in Python, a
dictionary lookup and a tuple per node: W5's million expressions took over
a minute there (BENCHMARKS.md, "W5's build from ASTs").  ``ArrayDag``
makes the same DAG, node for node and id for id (tests/test_atree.py
compares the two and the paper's one-by-one insertion), with the same
algorithms run by :func:`insert_programs_kernel`:

* **nodes** are rows of one int32 matrix (kind, use count, children and
  expression id as slices of two int32 pools, leaf class, the paper's
  useCount and the slice of a third pool holding the children a node was
  made with once Algorithm 3 or a splice changed them): 40 bytes a node
  (node ids and pool offsets stay below 2**31: checked before an
  insertion).  What only an insertion reads -- the sizes of the
  expression ids a node is a child in, the heads and lengths of its AND
  and its OR parent lists -- is a second matrix, ``ins``, made before an
  insertion and dropped after it;
* **expression ids** (§4.2.1) live in an open-addressing hash table of
  node ids, hashed and compared by (operator, sorted child ids); a leaf's
  id is its *leaf class* (one per distinct predicate key, numbered here,
  so that a merged segment's renumbered predicates find their leaves;
  the classes' keys are rows of a matrix, found through a second table:
  :class:`PredicateKeys`);
* **Algorithm 2** (reorganisation) enumerates the sub-sets of a new
  AND/OR's children as bitmasks over them, asking a Bloom filter of the
  expression ids before the table (most sub-sets are in neither), **Algorithm 3**
  (self-adjustment) walks the parents of the new node's operator of the
  child with the fewest such parents (only AND and OR parents are listed,
  each operator's apart), each entry with a signature of its parent's
  children that lets most parents be passed unread (:func:`_signature`);
  a parent list is only ever appended to, an entry that no longer holds
  (the parent let the child go) being skipped by the check that a parent
  still links all the children, which the paper makes anyway.  The lists
  are dropped after an insertion (matching never reads them) and made
  again from the links before the next;
* **Algorithms 4 and 5** (use counts, insertion, deletion and its splice)
  as in the Python DAG.  A deletion finds the parents of a node to splice
  through an index of all the links, made when the first splice of a
  :func:`release_all` call needs it (there are no parent lists between
  insertions).

The Python DAG stays the reference, and makes the ablations this one does
not (``sharing=False`` and ``binary``).  :meth:`ArrayDag.python` gives an
``ArrayDag``'s Python twin (for tests and inspection; slow at a million
nodes).
"""

from __future__ import annotations

import numpy as np
from numba import njit

from gpu_kernels.atree.dag import PAIR_ENUMERATION, REMOVED, SUBSET_ENUMERATION, ATreeDag, subexpression_starts
from gpu_kernels.combinations import first_combination, next_combination
from gpu_kernels.opcodes import AND, LEAF, OR
from gpu_kernels.open_addressing import find_slot

# the columns of a node's row
# (REFS: the paper's useCount; B_START, B_LEN: the children a node was made with, in ``born_pool``, once they
# changed; B_START -1 while they are its children)
KIND, USES, C_START, C_LEN, LEAF_CLASS, K_START, K_LEN, REFS, B_START, B_LEN = range(10)
N_COLUMNS = 10
# the columns of a node's row in ``ins``, what only an insertion reads (made for one, dropped after it): the
# sizes of the expression ids the node is a child in (Algorithm 2), and its AND parents and its OR parents
# as two lists (Algorithm 3 walks one operator's): P_HEAD and P_COUNT for AND, the two after them for OR
MEMBERS, P_HEAD, P_COUNT = range(3)
N_INS_COLUMNS = 5
# the counters (``ctr``)
N_NODES, C_USED, K_USED, P_USED, T_FILLED, N_REMOVED, B_USED = range(7)
N_COUNTERS = 7
EMPTY, TOMBSTONE = -1, -2
_MIX = -7046029254386353131          # 0x9E3779B97F4A7C15 as an int64 (Fibonacci hashing)
# a table slot holds a node id in its low 32 bits and 31 more bits of its key's hash above them, so that
# a probe passes other keys without reading their nodes (a cache miss each at a million nodes); a parent
# list entry holds the parent's id, the next entry, and a signature of the parent's children (``_signature``)
PAR_COLUMNS = 3
LOW = (1 << 32) - 1
TAG = (1 << 31) - 1
#: node ids and pool offsets are int32 (the nodes' rows and the pools)
_ID_LIMIT = (1 << 31) - 1


#: the columns of a predicate key (:class:`PredicateKeys`)
KEY_COLUMNS = 5


class PredicateKeys:
    """Each predicate id's key, a row of ``KEY_COLUMNS`` int64s: attribute,
    operator, the low and the high bound's float64 bits (-0.0 as 0.0: ``a =
    -0.0`` is ``a = 0``) and the set or pattern id.  A key names a
    predicate across segments, whose ids a merge or a recode renumbers.
    Called with an id, the key as a tuple (the Python DAG's leaf key)."""

    def __init__(self, rows: np.ndarray):
        self.rows = np.ascontiguousarray(rows, np.int64).reshape(-1, KEY_COLUMNS)

    @classmethod
    def of(cls, attr, op, lo_key, hi_key, aux) -> "PredicateKeys":
        rows = np.empty((len(attr), KEY_COLUMNS), np.int64)
        rows[:, 0], rows[:, 1], rows[:, 4] = attr, op, aux
        rows[:, 2] = (np.asarray(lo_key, np.float64) + 0.0).view(np.int64)
        rows[:, 3] = (np.asarray(hi_key, np.float64) + 0.0).view(np.int64)
        return cls(rows)

    def __len__(self) -> int:
        return len(self.rows)

    def __call__(self, pid: int) -> tuple:
        return tuple(self.rows[pid].tolist())

    def pid_of_key(self) -> dict:
        """Each key (a tuple) to its predicate id."""
        return {key: pid for pid, key in enumerate(map(tuple, self.rows.tolist()))}


@njit(cache=True, inline="always")
def _hash(op, keys, start, n):
    h = op * _MIX + n
    for i in range(start, start + n):
        h = (h ^ keys[i]) * _MIX
        h ^= h >> 29
    return h


@njit(cache=True)
def _find(op, buf, n, nodes, key_pool, slots):
    """The node whose expression id is (``op``, ``buf[:n]``), or -1."""
    mask = len(slots) - 1
    h = _hash(op, buf, 0, n)
    tag = (h >> 32) & TAG
    at = h & mask
    while True:
        s = slots[at]
        if s == EMPTY:
            return -1
        if s >= 0 and (s >> 32) == tag:
            node = s & LOW
            if nodes[node, KIND] == op and nodes[node, K_LEN] == n:
                k0 = nodes[node, K_START]
                same = True
                for i in range(n):
                    if key_pool[k0 + i] != buf[i]:
                        same = False
                        break
                if same:
                    return node
        at = (at + 1) & mask


@njit(cache=True)
def _table_put(node, nodes, key_pool, slots, ctr):
    mask = len(slots) - 1
    h = _hash(nodes[node, KIND], key_pool, nodes[node, K_START], nodes[node, K_LEN])
    at = h & mask
    while slots[at] >= 0:
        at = (at + 1) & mask
    if slots[at] == EMPTY:
        ctr[T_FILLED] += 1
    slots[at] = ((h >> 32) & TAG) << 32 | node


@njit(cache=True)
def _table_drop(node, nodes, key_pool, slots):
    mask = len(slots) - 1
    at = _hash(nodes[node, KIND], key_pool, nodes[node, K_START], nodes[node, K_LEN]) & mask
    while slots[at] != EMPTY:
        if slots[at] >= 0 and slots[at] & LOW == node:
            slots[at] = TOMBSTONE
            return
        at = (at + 1) & mask


@njit(cache=True, inline="always")
def _bloom_bits(h, n_bits):
    """The two bits of a key's hash in a Bloom filter of ``n_bits`` (a power of two)."""
    return (h >> 13) & (n_bits - 1), ((h >> 41) ^ (h >> 3)) & (n_bits - 1)


@njit(cache=True, inline="always")
def _bloom_set(bloom, h):
    b1, b2 = _bloom_bits(h, 64 * len(bloom))
    bloom[b1 >> 6] |= 1 << (b1 & 63)
    bloom[b2 >> 6] |= 1 << (b2 & 63)


@njit(cache=True)
def rehashed(nodes, key_pool, n_nodes, size):
    """A table of ``size`` slots (a power of two) holding every operator
    node of the first ``n_nodes`` with an expression id; its fill; and
    the Bloom filter of those ids, two bits a slot.  Algorithm 2 asks the
    filter before the table, since most of its sub-sets are in neither
    (the table does not fit a cache at a million nodes, the filter does).
    A removed node's bits stay: a false positive only costs the table's
    lookup."""
    slots = np.full(size, EMPTY, np.int64)
    bloom = np.zeros(max(1, size // 32), np.int64)
    mask = size - 1
    filled = 0
    for node in range(n_nodes):
        if nodes[node, KIND] > LEAF and nodes[node, K_LEN] >= 0:
            h = _hash(nodes[node, KIND], key_pool, nodes[node, K_START], nodes[node, K_LEN])
            at = h & mask
            while slots[at] >= 0:
                at = (at + 1) & mask
            slots[at] = ((h >> 32) & TAG) << 32 | node
            filled += 1
            _bloom_set(bloom, h)
    return slots, filled, bloom


@njit(cache=True, inline="always")
def _holds(buf, start, n, value):
    """Whether ``value`` is among ``buf[start:start + n]`` (a node's children: a few)."""
    for k in range(start, start + n):
        if buf[k] == value:
            return True
    return False


@njit(cache=True, inline="always")
def _member_bit(op, size):
    return (1 << size) << (0 if op == AND else 16)


@njit(cache=True, inline="always")
def _signature_bit(node):
    return np.int64(1) << (((node * _MIX) >> 58) & 63)


@njit(cache=True, inline="always")
def _signature(buf, start, n):
    """A node's children ``buf[start:start + n]`` as a 64-bit signature, a bit
    each.  A parent list entry keeps its parent's signature from when it
    was written, and Algorithm 3 passes a parent whose signature lacks the
    bit of a child it looks for without reading the parent's row (a cache
    miss at a million nodes; on W5 four in five parents of the operator
    are passed so).  Only the children older than the parent are asked
    for: the parent was made after them, and the only child linked to it
    since is a node Algorithm 3 put in its place -- newer than the parent,
    and not in the signatures written before (an AND reached through a
    one-child OR is such a node in another AND's flat children).  A child
    let go only leaves its bit set."""
    sig = np.int64(0)
    for i in range(start, start + n):
        sig |= _signature_bit(buf[i])
    return sig


@njit(cache=True, inline="always")
def _side(op):
    """Where the parent list of operator ``op`` (AND or OR) lies in a node's ``ins`` row, from P_HEAD and
    P_COUNT: only these two operators' parents are listed, since Algorithm 3 only reorganises them."""
    return 0 if op == AND else 2


@njit(cache=True)
def _add_parent(child, parent, kind, signature, ins, par_pool, ctr):
    side = _side(kind)
    e = ctr[P_USED]
    ctr[P_USED] = e + 1
    par_pool[e, 0] = parent
    par_pool[e, 1] = ins[child, P_HEAD + side]
    par_pool[e, 2] = signature
    ins[child, P_HEAD + side] = e
    ins[child, P_COUNT + side] += 1


@njit(cache=True, inline="always")
def _no_parents(node, ins):
    for side in (0, 2):
        ins[node, P_HEAD + side] = -1
        ins[node, P_COUNT + side] = 0


@njit(cache=True)
def _new(op, children, nc, key, nk, leaf_class, self_adjust, nodes, ins, child_pool, key_pool, par_pool, slots,
         ctr, leaf_node):
    """A new node (``_new`` of the Python DAG): ``children[:nc]`` linked,
    keyed by ``key[:nk]`` (a leaf by its class)."""
    node = ctr[N_NODES]
    ctr[N_NODES] = node + 1
    nodes[node, KIND] = op
    nodes[node, USES] = 0
    nodes[node, REFS] = 0
    nodes[node, B_START] = -1
    nodes[node, B_LEN] = 0
    c0 = ctr[C_USED]
    for i in range(nc):
        child_pool[c0 + i] = children[i]
    ctr[C_USED] = c0 + nc
    nodes[node, C_START] = c0
    nodes[node, C_LEN] = nc
    nodes[node, LEAF_CLASS] = leaf_class
    ins[node, MEMBERS] = 0
    _no_parents(node, ins)
    if op == LEAF:
        nodes[node, K_START] = 0
        nodes[node, K_LEN] = 0
        leaf_node[leaf_class] = node
    else:
        k0 = ctr[K_USED]
        for i in range(nk):
            key_pool[k0 + i] = key[i]
        ctr[K_USED] = k0 + nk
        nodes[node, K_START] = k0
        nodes[node, K_LEN] = nk
        _table_put(node, nodes, key_pool, slots, ctr)
        if (op == AND or op == OR) and 2 <= nk < SUBSET_ENUMERATION:
            bit = _member_bit(op, nk)
            for i in range(nk):
                ins[key[i], MEMBERS] |= bit
    for i in range(nc):
        nodes[children[i], USES] += 1
        nodes[children[i], REFS] += 1
    if self_adjust and (op == AND or op == OR):
        signature = _signature(children, 0, nc)
        for i in range(nc):
            if not _holds(children, 0, i, children[i]):     # (a child listed twice: one parent entry)
                _add_parent(children[i], node, op, signature, ins, par_pool, ctr)
    return node


@njit(cache=True)
def _forget(node, self_adjust, nodes, ins, child_pool, key_pool, slots, ctr, leaf_node):
    """The node removed (``_forget``): out of the table, its links to its
    children gone (in the parent lists too while an insertion has them:
    ``ins`` is empty between insertions)."""
    c0, nc = nodes[node, C_START], nodes[node, C_LEN]
    op = nodes[node, KIND]
    if len(ins) and self_adjust and (op == AND or op == OR):
        for i in range(nc):
            if not _holds(child_pool, c0, i, child_pool[c0 + i]):
                # (its entry stays in the list: see the module doc)
                ins[child_pool[c0 + i], P_COUNT + _side(op)] -= 1
    if nodes[node, K_LEN] >= 0:
        if nodes[node, KIND] == LEAF:
            if leaf_node[nodes[node, LEAF_CLASS]] == node:
                leaf_node[nodes[node, LEAF_CLASS]] = -1
        else:
            _table_drop(node, nodes, key_pool, slots)
    nodes[node, KIND] = REMOVED
    nodes[node, C_LEN] = 0
    nodes[node, B_START] = -1
    nodes[node, B_LEN] = 0
    nodes[node, K_LEN] = -1
    nodes[node, LEAF_CLASS] = -1
    if len(ins):
        _no_parents(node, ins)
    ctr[N_REMOVED] += 1


@njit(cache=True)
def _push(stack, depth, value):
    """``value`` on the ``stack`` (grown when full); the stack and its new depth."""
    if depth == len(stack):
        grown = np.empty(2 * len(stack), np.int64)
        grown[:depth] = stack
        stack = grown
    stack[depth] = value
    return stack, depth + 1


@njit(cache=True)
def _drop(n, self_adjust, nodes, ins, child_pool, born_pool, key_pool, slots, ctr, leaf_node, stack, depth):
    """A node nothing uses removed (``ATreeDag._settle``): one use less of
    each child it links, one useCount less of each it was made with, all
    of them pushed; the stack and its depth."""
    c0, nc = nodes[n, C_START], nodes[n, C_LEN]
    b0, nb = nodes[n, B_START], nodes[n, B_LEN]
    for i in range(c0, c0 + nc):
        nodes[child_pool[i], USES] -= 1
        stack, depth = _push(stack, depth, child_pool[i])
    if b0 < 0:
        for i in range(c0, c0 + nc):
            nodes[child_pool[i], REFS] -= 1
    else:
        for i in range(b0, b0 + nb):
            nodes[born_pool[i], REFS] -= 1
            stack, depth = _push(stack, depth, born_pool[i])
    _forget(n, self_adjust, nodes, ins, child_pool, key_pool, slots, ctr, leaf_node)
    return stack, depth


@njit(cache=True)
def _remove(node, self_adjust, nodes, ins, child_pool, born_pool, key_pool, slots, ctr, leaf_node):
    """``ATreeDag._remove``: a node an insertion made and nothing links
    removed, and what it was made with released, without a splice."""
    stack = np.empty(64, np.int64)
    stack[0] = node
    depth = 1
    while depth:
        depth -= 1
        n = stack[depth]
        if nodes[n, KIND] == REMOVED or nodes[n, REFS] > 0 or nodes[n, USES] > 0:
            continue
        stack, depth = _drop(n, self_adjust, nodes, ins, child_pool, born_pool, key_pool, slots, ctr, leaf_node,
                             stack, depth)


@njit(cache=True)
def _keep_born(node, nodes, child_pool, born_pool, ctr):
    """The children ``node`` was made with copied to ``born_pool`` (grown when
    full) before they first change; the pool."""
    if nodes[node, B_START] >= 0:
        return born_pool
    c0, nc = nodes[node, C_START], nodes[node, C_LEN]
    at = ctr[B_USED]
    if at + nc > len(born_pool):
        grown = np.empty(2 * len(born_pool) + nc, born_pool.dtype)
        grown[:at] = born_pool[:at]
        born_pool = grown
    born_pool[at:at + nc] = child_pool[c0:c0 + nc]
    nodes[node, B_START] = at
    nodes[node, B_LEN] = nc
    ctr[B_USED] = at + nc
    return born_pool


@njit(cache=True)
def _parent_index(nodes, child_pool, n_nodes):
    """Every live node's parents (CSR: starts per node, parents), from the links."""
    start = np.zeros(n_nodes + 1, np.int64)
    for p in range(n_nodes):
        if nodes[p, KIND] != REMOVED:
            for i in range(nodes[p, C_START], nodes[p, C_START] + nodes[p, C_LEN]):
                start[child_pool[i] + 1] += 1
    for n in range(n_nodes):
        start[n + 1] += start[n]
    fill = start[:-1].copy()
    parents = np.empty(start[n_nodes], np.int64)
    for p in range(n_nodes):
        if nodes[p, KIND] != REMOVED:
            for i in range(nodes[p, C_START], nodes[p, C_START] + nodes[p, C_LEN]):
                parents[fill[child_pool[i]]] = p
                fill[child_pool[i]] += 1
    return start, parents


@njit(cache=True)
def _linking(p, n, nodes, child_pool, found, count):
    """``found[:count]`` with ``p`` added when it is live, links ``n`` and is not there yet."""
    if nodes[p, KIND] == REMOVED or not _holds(child_pool, nodes[p, C_START], nodes[p, C_LEN], n) \
            or _holds(found, 0, count, p):
        return found, count
    return _push(found, count, p)


@njit(cache=True)
def _adopters(n, nodes, child_pool, p_start, p_list, added, n_added, found):
    """The live parents linking ``n``: those the parent index lists and those
    splices linked since it was made (``added``, pairs); into ``found``, and
    their number."""
    count = 0
    for k in range(p_start[n], p_start[n + 1]):
        found, count = _linking(p_list[k], n, nodes, child_pool, found, count)
    for k in range(0, n_added, 2):
        if added[k + 1] == n:
            found, count = _linking(added[k], n, nodes, child_pool, found, count)
    return found, count


@njit(cache=True)
def _splice(n, adopters, count, nodes, child_pool, born_pool, ctr, buf, added, n_added):
    """§4.2.4's splice: each of ``adopters[:count]`` (sorted) links the
    children of ``n`` in its place, those it does not link already
    (``a op (b op c)`` = ``a op b op c`` for AND and OR); each new link is
    recorded in ``added``.  A parent keeps the children it was made with
    first (``_keep_born``).  Returns the pools, the buffer and ``added``
    (each grown when full) and the number of entries in ``added``."""
    m0, mc = nodes[n, C_START], nodes[n, C_LEN]
    for k in range(count):
        p = adopters[k]
        born_pool = _keep_born(p, nodes, child_pool, born_pool, ctr)
        c0, nc = nodes[p, C_START], nodes[p, C_LEN]
        if len(buf) < nc + mc:
            buf = np.empty(2 * (nc + mc), np.int64)
        m = 0
        for i in range(c0, c0 + nc):
            if child_pool[i] != n:
                buf[m] = child_pool[i]
                m += 1
        for i in range(m0, m0 + mc):
            c = child_pool[i]
            if not _holds(child_pool, c0, nc, c):
                buf[m] = c
                m += 1
                nodes[c, USES] += 1
                added, n_added = _push(added, n_added, p)
                added, n_added = _push(added, n_added, c)
        nodes[n, USES] -= 1
        _sort(buf, 0, m)
        if m > nc:                  # wider: written anew at the pool's end
            c0 = ctr[C_USED]
            if c0 + m > len(child_pool):
                grown = np.empty(2 * len(child_pool) + m, child_pool.dtype)
                grown[:c0] = child_pool[:c0]
                child_pool = grown
            ctr[C_USED] = c0 + m
            nodes[p, C_START] = c0
        child_pool[c0:c0 + m] = buf[:m]
        nodes[p, C_LEN] = m
    return child_pool, born_pool, buf, added, n_added


@njit(cache=True)
def release_all(roots, self_adjust, nodes, ins, child_pool, born_pool, key_pool, slots, ctr, leaf_node):
    """Algorithm 5 for each of ``roots`` (``ATreeDag.release``), with the
    splice of §4.2.4; returns the child and born pools (a splice that
    widens a parent writes its children anew at the pool's end).

    A node whose useCount (``REFS``) reaches zero goes, releasing its
    children in cascade, unless parents still link it (``USES``): those
    adopted it through self-adjustment.  When every one of them has its
    operator, it is spliced into them and then goes; otherwise it stays.
    Parents are found through an index of every link, made at the first
    node that needs it (there are no parent lists between insertions)."""
    stack = np.empty(64, np.int64)
    found = np.empty(16, np.int64)
    buf = np.empty(16, np.int64)
    p_start, p_list = np.zeros(1, np.int64), np.zeros(0, np.int64)
    indexed = False
    added = np.empty(16, np.int64)      # links splices made since the index: (parent, child) pairs
    n_added = 0
    for root in roots:
        nodes[root, USES] -= 1
        nodes[root, REFS] -= 1
        stack[0] = root
        depth = 1
        while depth:
            depth -= 1
            n = stack[depth]
            if nodes[n, KIND] == REMOVED or nodes[n, REFS] > 0:
                continue
            if nodes[n, USES] > 0:
                op = nodes[n, KIND]
                if not self_adjust or (op != AND and op != OR):
                    continue
                if not indexed:
                    p_start, p_list = _parent_index(nodes, child_pool, ctr[N_NODES])
                    indexed = True
                found, count = _adopters(n, nodes, child_pool, p_start, p_list, added, n_added, found)
                if count != nodes[n, USES]:
                    continue
                same = True
                for k in range(count):
                    if nodes[found[k], KIND] != op:
                        same = False
                if not same:
                    continue
                _sort(found, 0, count)
                child_pool, born_pool, buf, added, n_added = _splice(n, found, count, nodes, child_pool, born_pool,
                                                                     ctr, buf, added, n_added)
            stack, depth = _drop(n, self_adjust, nodes, ins, child_pool, born_pool, key_pool, slots, ctr, leaf_node,
                                 stack, depth)
    return child_pool, born_pool


@njit(cache=True)
def _sort(buf, start, n):
    """``buf[start:start + n]`` sorted in place (insertion sort: a node has few children)."""
    for i in range(start + 1, start + n):
        v = buf[i]
        j = i - 1
        while j >= start and buf[j] > v:
            buf[j + 1] = buf[j]
            j -= 1
        buf[j + 1] = v


@njit(cache=True)
def _popcount(x):
    count = 0
    while x:
        x &= x - 1
        count += 1
    return count


@njit(cache=True)
def _reorganized(op, flat, n, out, nodes, ins, key_pool, slots, bloom, elig, idx, sub, cand_node, cand_mask):
    """Algorithm 2 (``ATreeDag._reorganized``): existing ``op`` nodes over
    sub-sets of ``flat[:n]`` (sorted) picked greedily, most children still
    uncovered first, the first found among equals; the new children into
    ``out`` (the chosen nodes sorted, then the uncovered children sorted)
    and their number, or -1 when nothing is reused."""
    if n <= SUBSET_ENUMERATION:
        largest = n - 1
    elif n <= PAIR_ENUMERATION:
        largest = 2
    else:
        return -1
    n_cand = 0
    n_bits = 64 * len(bloom)
    for size in range(largest, 1, -1):
        bit = _member_bit(op, size)
        n_elig = 0
        for i in range(n):              # only children in some expression id of this size can be found
            if ins[flat[i], MEMBERS] & bit:
                elig[n_elig] = i
                n_elig += 1
        if n_elig < size:
            continue
        first_combination(idx, size)    # the combinations in itertools' order
        while True:
            for j in range(size):
                sub[j] = flat[elig[idx[j]]]
            b1, b2 = _bloom_bits(_hash(op, sub, 0, size), n_bits)
            if (bloom[b1 >> 6] >> (b1 & 63)) & 1 == 0 or (bloom[b2 >> 6] >> (b2 & 63)) & 1 == 0:
                found = -1
            else:
                found = _find(op, sub, size, nodes, key_pool, slots)
            if found >= 0:
                mask = 0
                for j in range(size):
                    mask |= 1 << elig[idx[j]]
                cand_node[n_cand] = found
                cand_mask[n_cand] = mask
                n_cand += 1
            if not next_combination(idx, size, n_elig):
                break
    if n_cand == 0:
        return -1
    uncovered = (1 << n) - 1
    n_out = 0
    while uncovered:
        best, best_gain = -1, 0
        for c in range(n_cand):
            gain = _popcount(cand_mask[c] & uncovered)
            if gain > best_gain:
                best, best_gain = c, gain
        if best < 0:
            break
        out[n_out] = cand_node[best]
        n_out += 1
        uncovered &= ~cand_mask[best]
    _sort(out, 0, n_out)
    for i in range(n):
        if (uncovered >> i) & 1:
            out[n_out] = flat[i]
            n_out += 1
    return n_out


@njit(cache=True)
def _take_place(parent, node, op, flat, n, nodes, ins, child_pool, par_pool, ctr, born_pool):
    """Algorithm 3 at one node (``ATreeDag._take_place``): ``parent``, an
    ``op`` node linking all of ``flat[:n]`` and more, links ``node`` in
    their place; returns ``born_pool`` (the children ``parent`` was made
    with kept there first)."""
    if parent == node or nodes[parent, KIND] != op:
        return born_pool
    c0, nc = nodes[parent, C_START], nodes[parent, C_LEN]
    if nc <= n:
        return born_pool
    for i in range(n):
        if not _holds(child_pool, c0, nc, flat[i]):
            return born_pool
    born_pool = _keep_born(parent, nodes, child_pool, born_pool, ctr)
    m = 0                               # (fewer than before: the new children fit where the old ones were)
    for k in range(c0, c0 + nc):
        c = child_pool[k]
        if not _holds(flat, 0, n, c):
            child_pool[c0 + m] = c
            m += 1
    child_pool[c0 + m] = node
    m += 1
    _sort(child_pool, c0, m)
    nodes[parent, C_LEN] = m
    nodes[node, USES] += 1
    _add_parent(node, parent, op, _signature(child_pool, c0, m), ins, par_pool, ctr)
    for i in range(n):
        ins[flat[i], P_COUNT + _side(op)] -= 1
        nodes[flat[i], USES] -= 1
    return born_pool


@njit(cache=True)
def _adjusted(node, op, flat, n, nodes, ins, child_pool, par_pool, ctr, reserve, born_pool):
    """Algorithm 3 (``ATreeDag._adjusted``): the ``op`` parents of the child
    of ``flat[:n]`` with the fewest, each checked to link all of ``flat``.
    Returns the parent lists' pool, grown so that ``reserve`` entries stay
    free, and the born pool."""
    if n == 0:
        return par_pool, born_pool
    side = _side(op)
    pivot = flat[0]
    for i in range(1, n):
        if ins[flat[i], P_COUNT + side] < ins[pivot, P_COUNT + side]:
            pivot = flat[i]
    e = ins[pivot, P_HEAD + side]
    while e >= 0:
        if ctr[P_USED] + reserve + 1 > len(par_pool):
            grown = np.empty((2 * len(par_pool) + reserve, PAR_COLUMNS), np.int64)
            grown[:len(par_pool)] = par_pool
            par_pool = grown
        parent = par_pool[e, 0]
        older = np.int64(0)             # the bits of the children older than the parent (flat is sorted)
        for i in range(n):
            if flat[i] >= parent:
                break
            older |= _signature_bit(flat[i])
        if par_pool[e, 2] & older == older:
            born_pool = _take_place(parent, node, op, flat, n, nodes, ins, child_pool, par_pool, ctr, born_pool)
        e = par_pool[e, 1]
    return par_pool, born_pool


@njit(cache=True)
def insert_programs_kernel(positions, begin, end, offsets, kinds, args, leaf_class_of_pid, reorganize, self_adjust,
                           nodes, ins, child_pool, key_pool, par_pool, slots, bloom, ctr, leaf_node, roots, born_pool):
    """Algorithm 4 for the postfix program of each of ``positions[begin:end]``
    (well formed: :func:`subexpression_starts` checked them): its r-node
    into ``roots``.  Stops before a program the arrays might not hold
    (nodes, pools, the table at half full); returns how far it got and
    the parent lists' and the born pools (grown here when they fill)."""
    longest = 1
    for i in range(begin, end):
        longest = max(longest, offsets[positions[i] + 1] - offsets[positions[i]])
    width = max(longest, PAIR_ENUMERATION) + 2
    parent_op = np.empty(longest, np.int64)
    operands = np.empty(longest + 1, np.int64)    # instruction ids, to find each one's parent
    vals = np.empty(longest + 1, np.int64)        # nodes of the operands not consumed yet (flattened runs kept)
    entry = np.empty(longest + 1, np.int64)       # where each operand's nodes start in ``vals``
    flat = np.empty(width, np.int64)
    out = np.empty(width, np.int64)
    elig = np.empty(width, np.int64)
    idx = np.empty(width, np.int64)
    sub = np.empty(width, np.int64)
    cand_node = np.empty(2048, np.int64)
    cand_mask = np.empty(2048, np.int64)
    for i in range(begin, end):
        p = positions[i]
        start, stop = offsets[p], offsets[p + 1]
        length = stop - start
        if ctr[N_NODES] + length > min(len(nodes), len(ins)) or ctr[C_USED] + length > len(child_pool) \
                or ctr[K_USED] + length > len(key_pool) or ctr[P_USED] + length > len(par_pool) \
                or 2 * (ctr[T_FILLED] + length) > len(slots):
            return i, par_pool, born_pool
        # each instruction's parent operator: an AND in an AND (OR in OR) is flattened, not interned
        depth = 0
        for at in range(length):
            kind = kinds[start + at]
            parent_op[at] = -1
            if kind != LEAF:
                arity = args[start + at] if kind == AND or kind == OR else 2
                for k in range(depth - arity, depth):
                    parent_op[operands[k]] = kind
                depth -= arity
            operands[depth] = at
            depth += 1
        depth = 0
        top = 0
        for at in range(length):
            kind = kinds[start + at]
            if kind == LEAF:
                cls = leaf_class_of_pid[args[start + at]]
                node = leaf_node[cls]
                if node < 0:
                    node = _new(LEAF, flat, 0, flat, 0, cls, self_adjust, nodes, ins, child_pool, key_pool,
                                par_pool, slots, ctr, leaf_node)
                entry[depth] = top
                vals[top] = node
                top += 1
                depth += 1
                continue
            arity = args[start + at] if kind == AND or kind == OR else 2
            s = entry[depth - arity] if arity > 0 else top
            depth -= arity
            if (kind == AND or kind == OR) and parent_op[at] == kind:
                entry[depth] = s                      # its operands become its parent's
                depth += 1
                continue
            # _combined: the children sorted (AND/OR: once each; a lone one is the node itself)
            n = 0
            for k in range(s, top):
                flat[n] = vals[k]
                n += 1
            _sort(flat, 0, n)
            if kind == AND or kind == OR:
                m = 0
                for k in range(n):
                    if m == 0 or flat[k] != flat[m - 1]:
                        flat[m] = flat[k]
                        m += 1
                n = m
            if (kind == AND or kind == OR) and n == 1:
                node = flat[0]
            else:
                # _operator
                node = _find(kind, flat, n, nodes, key_pool, slots)
                if node < 0:
                    n_out = -1
                    if reorganize and (kind == AND or kind == OR) and n > 2:
                        n_out = _reorganized(kind, flat, n, out, nodes, ins, key_pool, slots, bloom, elig, idx,
                                             sub, cand_node, cand_mask)
                    if n_out < 0:
                        node = _new(kind, flat, n, flat, n, -1, self_adjust, nodes, ins, child_pool, key_pool,
                                    par_pool, slots, ctr, leaf_node)
                    else:
                        node = _new(kind, out, n_out, flat, n, -1, self_adjust, nodes, ins, child_pool, key_pool,
                                    par_pool, slots, ctr, leaf_node)
                        for k in range(n):      # _drop_unused: children covered and used by nothing else
                            c = flat[k]
                            if not _holds(out, 0, n_out, c) and nodes[c, USES] == 0:
                                _remove(c, self_adjust, nodes, ins, child_pool, born_pool, key_pool, slots, ctr,
                                        leaf_node)
                    _bloom_set(bloom, _hash(kind, flat, 0, n))
                    if self_adjust and (kind == AND or kind == OR):
                        par_pool, born_pool = _adjusted(node, kind, flat, n, nodes, ins, child_pool, par_pool, ctr,
                                                        length, born_pool)
            top = s
            entry[depth] = top
            vals[top] = node
            top += 1
            depth += 1
        root = vals[0]
        nodes[root, USES] += 1
        nodes[root, REFS] += 1
        roots[i] = root
    return end, par_pool, born_pool


@njit(cache=True)
def insertion_rows(nodes, child_pool, key_pool, n_nodes, self_adjust, ins, par_pool, ctr):
    """``ins`` made again before an insertion: each node's MEMBERS bits from
    the expression ids, and with ``self_adjust`` its parent lists from the
    links into ``par_pool`` (its fill in ``ctr[P_USED]``)."""
    ctr[P_USED] = 0
    for node in range(n_nodes):
        ins[node, MEMBERS] = 0
        _no_parents(node, ins)
    for node in range(n_nodes):
        op = nodes[node, KIND]
        if op != AND and op != OR:
            continue
        nk = nodes[node, K_LEN]
        if 2 <= nk < SUBSET_ENUMERATION:
            bit = _member_bit(op, nk)
            k0 = nodes[node, K_START]
            for i in range(nk):
                ins[key_pool[k0 + i], MEMBERS] |= bit
        if self_adjust:
            c0, nc = nodes[node, C_START], nodes[node, C_LEN]
            signature = _signature(child_pool, c0, nc)
            for i in range(nc):
                child = child_pool[c0 + i]
                if not _holds(child_pool, c0, i, child):
                    _add_parent(child, node, op, signature, ins, par_pool, ctr)


@njit(cache=True)
def duplicate_keys(nodes, key_pool, n_nodes, slots):
    """How many keyed operator nodes a lookup of their own key does not find (another node has it)."""
    buf = np.empty(16, np.int64)
    count = 0
    for node in range(n_nodes):
        op, nk = nodes[node, KIND], nodes[node, K_LEN]
        if op > LEAF and nk >= 0:
            if nk > len(buf):
                buf = np.empty(2 * nk, np.int64)
            k0 = nodes[node, K_START]
            for i in range(nk):
                buf[i] = key_pool[k0 + i]
            if _find(op, buf, nk, nodes, key_pool, slots) != node:
                count += 1
    return count


@njit(cache=True)
def leaf_pids_used(positions, offsets, kinds, args):
    """Per predicate id (up to the largest met), whether a leaf of the programs at ``positions`` reads it."""
    top = -1
    for p in positions:
        for at in range(offsets[p], offsets[p + 1]):
            if kinds[at] == LEAF and args[at] > top:
                top = args[at]
    used = np.zeros(top + 1, np.bool_)
    for p in positions:
        for at in range(offsets[p], offsets[p + 1]):
            if kinds[at] == LEAF:
                used[args[at]] = True
    return used


@njit(cache=True)
def leaf_classes_of(keys, pids, class_rows, n_classes, class_slots, classes, add):
    """Per predicate ``pids[j]``, the leaf class of its key ``keys[pids[j]]``
    into ``classes[pids[j]]``: the class whose row in ``class_rows`` is that
    key, found through ``class_slots`` (open addressing over class ids); or,
    for a key no class has, with ``add`` a new class (its row written at
    ``n_classes``, room for it left by the caller), without it -1.  Returns
    the number of classes (the probe PSTHash's table uses too)."""
    for j in range(len(pids)):
        p = pids[j]
        at = find_slot(class_slots, class_rows, keys, p, KEY_COLUMNS)
        c = class_slots[at]
        if c < 0 and add:
            for k in range(KEY_COLUMNS):
                class_rows[n_classes, k] = keys[p, k]
            class_slots[at] = n_classes
            c = n_classes
            n_classes += 1
        classes[p] = c
    return n_classes


def _pow2(n: int) -> int:
    return 1 << max(4, int(n - 1).bit_length())


def _grown(array: np.ndarray, needed: int, fill=None) -> np.ndarray:
    """``array`` with room for ``needed`` rows (doubled until it fits)."""
    size = max(len(array), 16)
    while size < needed:
        size *= 2
    if size == len(array):
        return array
    new = np.empty((size,) + array.shape[1:], array.dtype) if fill is None else \
        np.full((size,) + array.shape[1:], fill, array.dtype)
    new[:len(array)] = array
    return new


#: an ArrayDag's arrays (what a copy copies and ``nbytes`` counts)
_ARRAYS = ("nodes", "ins", "child_pool", "key_pool", "par_pool", "slots", "bloom", "ctr", "leaf_node", "class_rows",
           "class_slots", "born_pool")


class ArrayDag:
    """The A-Tree DAG in arrays (see the module docstring): the same
    interface as :class:`gpu_kernels.atree.dag.ATreeDag` for what a
    matcher does with it -- :meth:`insert_programs`, :meth:`release_all`,
    :meth:`copy`, :meth:`compacted`, ``n_removed`` and ``len`` -- and its
    Python twin by :meth:`python` (or the same attributes: ``kind``,
    ``children``, ``pred``, ``uses``, ``refs``, ``born``, ``key``, ``table``,
    ``parents``).
    Always shares nodes and never makes binary chains."""

    sharing = True
    binary = False

    def __init__(self, reorganize: bool = True, self_adjust: bool = True, capacity: int = 1024):
        """``capacity``: nodes to start with (the arrays grow as needed)."""
        self.reorganize = bool(reorganize)
        self.self_adjust = bool(self_adjust)
        self.nodes = np.zeros((capacity, N_COLUMNS), np.int32)
        self.child_pool = np.zeros(4 * capacity, np.int32)
        self.key_pool = np.zeros(4 * capacity, np.int32)
        #: the children of the nodes whose children changed, as they were made with them (B_START, B_LEN)
        self.born_pool = np.zeros(16, np.int32)
        self.par_pool = np.zeros((4 * capacity, PAR_COLUMNS), np.int64)
        #: what only an insertion reads, a row a node (MEMBERS and the parent lists' heads and counts); dropped
        #: after each insertion (no rows), made again before the next (:func:`insertion_rows`)
        self.ins = np.zeros((capacity, N_INS_COLUMNS), np.int32)
        #: the expression ids' table and its Bloom filter (:func:`rehashed`)
        self.slots, _, self.bloom = rehashed(self.nodes, self.key_pool, 0, _pow2(2 * capacity))
        self.ctr = np.zeros(N_COUNTERS, np.int64)
        self.leaf_node = np.full(0, -1, np.int32)
        #: leaf classes: each class's predicate key (a row), and the open-addressing table of class ids that
        #: finds a key's class (:func:`leaf_classes_of`)
        self.class_rows = np.zeros((0, KEY_COLUMNS), np.int64)
        self.class_slots = np.full(16, -1, np.int32)
        self._python: ATreeDag | None = None

    def copy(self) -> "ArrayDag":
        new = object.__new__(type(self))
        new.reorganize, new.self_adjust = self.reorganize, self.self_adjust
        for name in _ARRAYS:
            setattr(new, name, getattr(self, name).copy())
        new._python = None
        return new

    @property
    def n_nodes(self) -> int:
        return int(self.ctr[N_NODES])

    @property
    def n_removed(self) -> int:
        return int(self.ctr[N_REMOVED])

    def __len__(self) -> int:
        return self.n_nodes - self.n_removed

    @property
    def nbytes(self) -> int:
        return sum(int(getattr(self, name).nbytes) for name in _ARRAYS)

    # ------------------------------------------------------------ insertion
    def _leaf_classes(self, pids: np.ndarray, keys: PredicateKeys) -> np.ndarray:
        """Per predicate id (up to the largest of ``pids``), its leaf class
        (-1 where not asked for); a key without one gets a new class."""
        pids = np.asarray(pids, np.int64)
        classes = np.full(int(pids.max(initial=-1)) + 1, -1, np.int64)
        n_classes = len(self.class_rows)
        most = n_classes + len(pids)
        rows = _grown(self.class_rows, most)
        if 2 * most > len(self.class_slots):        # (load factor under 1/2: the table made again, larger)
            self.class_slots = np.full(_pow2(2 * most), -1, np.int32)
            leaf_classes_of(rows, np.arange(n_classes), rows, 0, self.class_slots, np.empty(n_classes, np.int64),
                            True)
        n_classes = leaf_classes_of(keys.rows, pids, rows, n_classes, self.class_slots, classes, True)
        self.class_rows = rows[:n_classes].copy()
        self.leaf_node = _grown(self.leaf_node, n_classes, fill=-1)
        return classes

    #: programs inserted by one kernel call (between two calls of ``progress``)
    CHUNK = 1 << 16

    def insert_programs(self, positions, offsets, kinds, args, keys: PredicateKeys, progress=None) -> list:
        """:meth:`ATreeDag.insert_programs`, compiled (``keys``, the
        predicates' :class:`PredicateKeys`, in place of its ``leaf_key``):
        each position's postfix program inserted in order; their r-nodes.
        ``progress(k)`` is told each time k more are in."""
        positions = np.asarray(list(positions) if not isinstance(positions, np.ndarray) else positions, np.int64)
        offsets, kinds, args = np.asarray(offsets, np.int64), _as(kinds, np.int8), _as(args, np.int32)
        if len(positions) == 0:
            return []
        starts = subexpression_starts(offsets, kinds, args)
        first, last = offsets[positions], offsets[positions + 1]
        if (last <= first).any() or (starts[np.minimum(first, len(starts) - 1)] < 0).any():
            raise ValueError("malformed postfix program")
        rows = int((last - first).sum())          # at most a node, a child link and a key entry each
        if max(self.n_nodes, int(self.ctr[C_USED]), int(self.ctr[K_USED])) + rows > _ID_LIMIT:
            raise ValueError(f"A-Tree: {rows:,} more program rows could pass the DAG's int32 node and link ids")
        classes = self._leaf_classes(np.flatnonzero(leaf_pids_used(positions, offsets, kinds, args)), keys)
        roots = np.empty(len(positions), np.int64)
        self._python = None
        if not len(self.ins):           # (dropped after the last insertion)
            self.ins = np.zeros((len(self.nodes), N_INS_COLUMNS), np.int32)
            if self.self_adjust:
                self.par_pool = np.zeros((2 * int(self.ctr[C_USED]) + 16, PAR_COLUMNS), np.int64)
            insertion_rows(self.nodes, self.child_pool, self.key_pool, self.n_nodes, self.self_adjust, self.ins,
                           self.par_pool, self.ctr)
        done = 0
        while done < len(positions):
            end = min(done + self.CHUNK, len(positions))
            reached, self.par_pool, self.born_pool = insert_programs_kernel(
                positions, done, end, offsets, kinds, args, classes, self.reorganize, self.self_adjust, self.nodes,
                self.ins, self.child_pool, self.key_pool, self.par_pool, self.slots, self.bloom, self.ctr,
                self.leaf_node, roots, self.born_pool)
            if progress is not None and reached > done:
                progress(reached - done)
            done = reached
            if done == end:
                continue
            need = int(last[done] - first[done])
            self.nodes = _grown(self.nodes, self.n_nodes + need)
            self.ins = _grown(self.ins, len(self.nodes))
            self.child_pool = _grown(self.child_pool, int(self.ctr[C_USED]) + need)
            self.key_pool = _grown(self.key_pool, int(self.ctr[K_USED]) + need)
            self.par_pool = _grown(self.par_pool, int(self.ctr[P_USED]) + need)
            if 2 * (int(self.ctr[T_FILLED]) + need) > len(self.slots):
                live = len(self) + need
                self.slots, self.ctr[T_FILLED], self.bloom = rehashed(self.nodes, self.key_pool, self.n_nodes,
                                                                      _pow2(4 * live))
        self._trim()
        return roots.tolist()

    def _trim(self) -> None:
        """The arrays cut to what they hold (they doubled as they grew),
        and what only an insertion reads dropped (the parent lists and
        ``ins``): matching never reads the DAG, and the next insertion makes
        them again from the links and the expression ids
        (:func:`insertion_rows`, one pass).  At a million expressions the
        lists are the DAG's largest array."""
        self.nodes = self.nodes[:self.n_nodes + 1].copy()
        self.child_pool = self.child_pool[:int(self.ctr[C_USED]) + 1].copy()
        self.key_pool = self.key_pool[:int(self.ctr[K_USED]) + 1].copy()
        self.born_pool = self.born_pool[:int(self.ctr[B_USED]) + 1].copy()
        self.par_pool = np.zeros((0, PAR_COLUMNS), np.int64)
        self.ctr[P_USED] = 0
        self.ins = np.zeros((0, N_INS_COLUMNS), np.int32)

    # ------------------------------------------------------------- deletion
    def release_all(self, roots) -> None:
        """Algorithm 5 for each of ``roots``, splices included."""
        self._python = None
        self.child_pool, self.born_pool = release_all(
            np.asarray(roots, np.int64), self.self_adjust, self.nodes, self.ins, self.child_pool, self.born_pool,
            self.key_pool, self.slots, self.ctr, self.leaf_node)
        self._trim()                    # (a splice that widened a parent may have doubled a pool)

    # ------------------------------------------------------------ compaction
    def compacted(self, roots):
        """Node ids renumbered without the removed ones (in their order),
        as :meth:`ATreeDag.compacted`; returns ``(dag, new root ids)``."""
        n = self.n_nodes
        nodes = self.nodes[:n]
        live = np.flatnonzero(nodes[:, KIND] != REMOVED)
        old_to_new = np.full(n, -1, np.int64)
        old_to_new[live] = np.arange(len(live))
        new = object.__new__(type(self))
        new.reorganize, new.self_adjust = self.reorganize, self.self_adjust
        new.class_rows, new.class_slots = self.class_rows.copy(), self.class_slots.copy()
        new._python = None
        rows = nodes[live].copy()
        c_len, k_len = rows[:, C_LEN], rows[:, K_LEN]
        child_idx = old_to_new[_gathered(self.child_pool, rows[:, C_START], c_len)]
        key_idx = old_to_new[_gathered(self.key_pool, rows[:, K_START], np.maximum(k_len, 0))]
        # a reorganised node is keyed by its flat child set, whose unlinked members may be gone: such a key
        # names nodes no insertion can produce again, so it is dropped (as the Python DAG does)
        k_off = np.concatenate(([0], np.cumsum(np.maximum(k_len, 0))))
        gone = members_gone(key_idx, k_off)
        rows[:, C_START] = np.concatenate(([0], np.cumsum(c_len)))[:-1]
        rows[:, K_START] = k_off[:-1]
        changed = rows[:, B_START] >= 0
        b_len = np.where(changed, rows[:, B_LEN], 0)
        born_idx = old_to_new[_gathered(self.born_pool, rows[:, B_START], b_len)]
        rows[:, B_START] = np.where(changed, np.concatenate(([0], np.cumsum(b_len)))[:-1], -1)
        new.born_pool = _grown(born_idx.astype(np.int32), len(born_idx) + 1)
        rows[gone > 0, K_LEN] = -1
        new.nodes = _grown(rows, len(rows) + 1)
        new.child_pool = _grown(child_idx.astype(np.int32), len(child_idx) + 1)
        new.key_pool = _grown(np.where(key_idx < 0, 0, key_idx).astype(np.int32), len(key_idx) + 1)
        new.ctr = np.zeros(N_COUNTERS, np.int64)
        new.ctr[N_NODES], new.ctr[C_USED], new.ctr[K_USED] = len(rows), len(child_idx), len(key_idx)
        new.ctr[B_USED] = len(born_idx)
        new.leaf_node = np.full(len(self.leaf_node), -1, np.int32)
        leaves = np.flatnonzero((rows[:, KIND] == LEAF) & (rows[:, K_LEN] >= 0))
        new.leaf_node[rows[leaves, LEAF_CLASS]] = leaves
        new.slots, filled, new.bloom = rehashed(new.nodes, new.key_pool, len(rows), _pow2(4 * len(rows)))
        new.ctr[T_FILLED] = filled
        # (made by the next insertion)
        new.par_pool, new.ins = np.zeros((0, PAR_COLUMNS), np.int64), np.zeros((0, N_INS_COLUMNS), np.int32)
        return new, old_to_new[np.asarray(roots, np.int64)].tolist()

    @classmethod
    def restored(cls, reorganize: bool, self_adjust: bool, kind, uses, leaf_pid, keys, child_len, child_idx,
                 key_len, key_idx, refs=None, born_len=None, born_idx=None) -> "ArrayDag":
        """A saved DAG (:meth:`saved`'s arrays, ``leaf_pid`` read through
        ``keys``, the :class:`PredicateKeys`), its ranges and use counts
        checked by the caller: the table and its filter and the leaf
        classes made again (``ins`` and the parent lists by the next
        insertion).  Without ``refs``, ``born_len`` and ``born_idx`` (a
        file of format 1) each node was made with the children it has.
        ValueError when two nodes have one expression id."""
        n = len(kind)
        if n + len(child_idx) + len(key_idx) > _ID_LIMIT:
            raise ValueError("saved A-Tree: more nodes and links than int32 ids hold")
        new = cls(reorganize, self_adjust, capacity=n + 1)
        nodes = new.nodes
        nodes[:n, KIND], nodes[:n, USES] = kind, uses
        nodes[:n, REFS] = uses if refs is None else refs
        born_len = np.full(n, -1, np.int64) if born_len is None else np.asarray(born_len, np.int64)
        born_idx = np.zeros(0, np.int64) if born_idx is None else np.asarray(born_idx, np.int64)
        nodes[:n, B_LEN] = np.maximum(born_len, 0)
        nodes[:n, B_START] = np.where(born_len >= 0, np.concatenate(([0], np.cumsum(nodes[:n, B_LEN])))[:-1], -1)
        new.born_pool = _grown(born_idx.astype(np.int32), len(born_idx) + 1)
        new.ctr[B_USED] = len(born_idx)
        nodes[:n, C_LEN], nodes[:n, K_LEN] = child_len, key_len
        nodes[:n, C_START] = np.concatenate(([0], np.cumsum(child_len)))[:-1]
        nodes[:n, K_START] = np.concatenate(([0], np.cumsum(np.maximum(key_len, 0))))[:-1]
        leaf = np.flatnonzero(np.asarray(kind) == LEAF)
        classes = new._leaf_classes(np.unique(leaf_pid[leaf]), keys)
        nodes[:n, LEAF_CLASS] = -1
        nodes[leaf, LEAF_CLASS] = classes[leaf_pid[leaf]]
        keyed = leaf[np.asarray(key_len)[leaf] >= 0]
        if len(np.unique(nodes[keyed, LEAF_CLASS])) != len(keyed):
            raise ValueError("saved A-Tree: two nodes with one expression id")
        new.leaf_node[nodes[keyed, LEAF_CLASS]] = keyed
        new.child_pool = _grown(np.asarray(child_idx, np.int32), len(child_idx) + 1)
        new.key_pool = _grown(np.asarray(key_idx, np.int32), len(key_idx) + 1)
        new.ctr[N_NODES], new.ctr[C_USED], new.ctr[K_USED] = n, len(child_idx), len(key_idx)
        new.ctr[N_REMOVED] = int((np.asarray(kind) == REMOVED).sum())
        new.slots, new.ctr[T_FILLED], new.bloom = rehashed(new.nodes, new.key_pool, n, _pow2(4 * n))
        if duplicate_keys(new.nodes, new.key_pool, n, new.slots):
            raise ValueError("saved A-Tree: two nodes with one expression id")
        # (made by the next insertion)
        new.par_pool, new.ins = np.zeros((0, PAR_COLUMNS), np.int64), np.zeros((0, N_INS_COLUMNS), np.int32)
        return new

    # ----------------------------------------------------------- reading it
    def csr(self, keys: PredicateKeys | None = None):
        """Per node (removed ones included): kind (int8), number of
        children, the children concatenated, and a leaf's predicate id by
        ``keys`` (-1 for an operator, or a predicate not among them; the
        leaf class without ``keys``)."""
        nodes = self.nodes[:self.n_nodes]
        counts = nodes[:, C_LEN].copy()
        leaf = nodes[:, LEAF_CLASS].copy()
        if keys is not None:
            pids = np.arange(len(keys))
            class_of_pid = np.full(len(keys), -1, np.int64)
            leaf_classes_of(keys.rows, pids, self.class_rows, len(self.class_rows), self.class_slots, class_of_pid,
                            False)
            pid_of_class = np.full(len(self.class_rows), -1, np.int64)
            found = class_of_pid >= 0
            pid_of_class[class_of_pid[found]] = pids[found]
            leaf = np.where(leaf >= 0, pid_of_class[leaf.clip(min=0)] if len(pid_of_class) else -1, -1)
        return (nodes[:, KIND].astype(np.int8), counts, _gathered(self.child_pool, nodes[:, C_START], counts), leaf)

    def kinds(self) -> np.ndarray:
        return self.nodes[:self.n_nodes, KIND].astype(np.int8)

    def use_counts(self) -> np.ndarray:
        return self.nodes[:self.n_nodes, USES].copy()

    def saved(self, keys: PredicateKeys) -> dict:
        """The arrays :meth:`engine.algorithms.atree.ATreeMatcher.to_arrays`
        saves (of a compacted DAG: no removed node): per node its kind,
        uses, leaf predicate id, children (CSR), expression id's children
        (CSR; ``key_len`` -1 without one, 0 for a leaf), useCount and the
        children it was made with (CSR; ``born_len`` -1 when they are its
        children)."""
        kind, child_len, child_idx, leaf_pid = self.csr(keys)
        nodes = self.nodes[:self.n_nodes]
        key_len = nodes[:, K_LEN].copy()
        changed = nodes[:, B_START] >= 0
        return {"kind": kind, "uses": self.use_counts(), "leaf_pid": leaf_pid, "child_len": child_len,
                "child_idx": child_idx, "key_len": key_len,
                "key_idx": _gathered(self.key_pool, nodes[:, K_START], np.maximum(key_len, 0)),
                "refs": nodes[:, REFS].astype(np.int64), "born_len": np.where(changed, nodes[:, B_LEN], -1),
                "born_idx": _gathered(self.born_pool, nodes[:, B_START], np.where(changed, nodes[:, B_LEN], 0))}

    def python(self) -> ATreeDag:
        """The Python twin of this DAG: the same nodes, ids, children,
        keys, use counts and parent sets (made on first use, and again
        after a change)."""
        if self._python is not None:
            return self._python
        kind, counts, child_idx, leaf_class = self.csr()
        nodes = self.nodes[:self.n_nodes]
        dag = ATreeDag(True, self.reorganize, self.self_adjust, False)
        at = np.concatenate(([0], np.cumsum(counts))).tolist()
        kids = child_idx.tolist()
        k_len = nodes[:, K_LEN]
        keys = _gathered(self.key_pool, nodes[:, K_START], np.maximum(k_len, 0)).tolist()
        k_at = np.concatenate(([0], np.cumsum(np.maximum(k_len, 0)))).tolist()
        dag.kind = kind.astype(np.int64).tolist()
        dag.children = [tuple(kids[at[i]:at[i + 1]]) for i in range(len(kind))]
        class_keys = list(map(tuple, self.class_rows.tolist()))
        dag.pred = [class_keys[c] if c >= 0 else None for c in leaf_class.tolist()]
        dag.uses = self.use_counts().tolist()
        dag.refs = nodes[:, REFS].astype(np.int64).tolist()
        changed = np.flatnonzero(nodes[:, B_START] >= 0)
        born = _gathered(self.born_pool, nodes[changed, B_START], nodes[changed, B_LEN]).tolist()
        b_at = np.concatenate(([0], np.cumsum(nodes[changed, B_LEN]))).tolist()
        dag.born = {int(node): tuple(born[b_at[i]:b_at[i + 1]]) for i, node in enumerate(changed.tolist())}
        dag.key = [None if kl < 0 else ("L", dag.pred[i]) if dag.kind[i] == LEAF else
                   (dag.kind[i], tuple(keys[k_at[i]:k_at[i + 1]])) for i, kl in enumerate(k_len.tolist())]
        dag.table = {key: i for i, key in enumerate(dag.key) if key is not None}
        dag.n_removed = self.n_removed
        if self.self_adjust:
            for parent, children in enumerate(dag.children):
                for child in set(children):
                    dag._parent_set(child).add(parent)
        self._python = dag
        return dag

    kind = property(lambda self: self.python().kind)
    children = property(lambda self: self.python().children)
    pred = property(lambda self: self.python().pred)
    uses = property(lambda self: self.python().uses)
    refs = property(lambda self: self.python().refs)
    born = property(lambda self: self.python().born)
    key = property(lambda self: self.python().key)
    table = property(lambda self: self.python().table)
    parents = property(lambda self: self.python().parents)


def _as(values, dtype) -> np.ndarray:
    """``values`` in a segment's dtype for them (int8 kinds, int32 arguments), so that the kernels are
    compiled for those only; ValueError for a value that dtype does not hold."""
    values = np.asarray(values)
    if values.dtype != dtype:
        info = np.iinfo(dtype)
        if values.size and (values.min() < info.min or values.max() > info.max):
            raise ValueError(f"malformed postfix program: a value beyond {np.dtype(dtype).name}")
        values = values.astype(dtype)
    return values


def members_gone(key_idx: np.ndarray, k_off: np.ndarray) -> np.ndarray:
    """Per node, how many of its key members ``key_idx[k_off[i]:k_off[i + 1]]``
    are gone (-1), as a difference of running counts (``np.add.reduceat``
    over offsets clipped to the pool missed the last member of the last
    keyed node when only nodes without a key came after it)."""
    removed = np.concatenate(([0], np.cumsum(key_idx < 0)))
    return removed[k_off[1:]] - removed[k_off[:-1]]


def _gathered(pool: np.ndarray, start: np.ndarray, length: np.ndarray) -> np.ndarray:
    """``pool[start[i]:start[i] + length[i]]`` for every i, concatenated."""
    length = np.asarray(length, np.int64)
    total = int(length.sum())
    if total == 0:
        return np.zeros(0, pool.dtype)
    offsets = np.concatenate(([0], np.cumsum(length)))[:-1]
    return pool[np.repeat(np.asarray(start, np.int64) - offsets, length) + np.arange(total)]


@njit(cache=True)
def first_foreign_leaf(roots, child_off, child_idx, leaf_pid, prog_offsets, prog_kind, prog_arg, n_preds):
    """The first subscription position whose r-node (``roots``) reaches a
    leaf of a predicate its program (postfix, ``LEAF`` instructions naming
    predicate ids) does not hold, or -1: a saved DAG checked against its
    segment -- a leaf re-pointed at another subscription's predicate
    answered for the wrong one, and the first merge removing that one
    found a leaf of a predicate gone.  One depth-first walk per r-node
    over the nodes it reaches (each once: a cycle ends the walk too)."""
    n = len(leaf_pid)
    node_seen = np.full(n, -1, np.int64)
    pred_held = np.full(n_preds, -1, np.int64)
    stack = np.empty(max(n, 1), np.int64)
    for p in range(len(roots)):
        for at in range(prog_offsets[p], prog_offsets[p + 1]):
            if prog_kind[at] == LEAF:
                pred_held[prog_arg[at]] = p
        stack[0] = roots[p]
        node_seen[roots[p]] = p
        top = 1
        while top > 0:
            top -= 1
            node = stack[top]
            pid = leaf_pid[node]
            if pid >= 0 and (pid >= n_preds or pred_held[pid] != p):
                return p
            for c in range(child_off[node], child_off[node + 1]):
                child = child_idx[c]
                if node_seen[child] != p:
                    node_seen[child] = p
                    stack[top] = child
                    top += 1
    return -1


__all__ = ["ArrayDag", "first_foreign_leaf"]
