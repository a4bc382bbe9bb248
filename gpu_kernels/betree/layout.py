"""The BE-Tree as one struct of arrays (Sadoghi, Jacobsen, SIGMOD 2011, §4, §6).

The dynamic tree (:mod:`gpu_kernels.betree.tree`) is matched through this
*flattened* form, rebuilt from it after every batch of inserts and deletes
(never patched in place: a match in flight keeps reading the arrays of its
snapshot).

**Keys.**  BE-Tree clusters a discrete, finite domain by cutting it in
halves (§4.3).  Every value here -- a number, a string's order-preserving
code, a boolean's 0/1 -- is a float64; its IEEE bits, with the sign bit
flipped for positives and every bit flipped for negatives, form an
unsigned 64-bit *key* whose order is the values' order (``-0.0`` is taken
as ``0.0`` first).  The domain of every attribute is thus the 64-bit keys:
finite, discrete, the same for every attribute, so the clustering grid is
fixed in advance and independent of the insertion order, as §4.3 requires.
A *bucket* of depth ``d`` holds the keys whose top ``d`` bits equal its
prefix; the top-level bucket (depth 0) spans the whole domain, a bucket
splits into the two halves of depth ``d + 1``, and a bucket of depth 64
holds one key: an *atomic* bucket.  An interval's *home bucket* is the
bucket of depth = the length of the common prefix of its two end keys.

Table 1's interval for each predicate (``[v_min, v - 1]`` for ``< v``, the
whole domain for ``!=`` and ``NOT IN``, ``[v_1, v_k]`` for ``IN``, ...)
is computed on keys: ``v - 1`` is the key just below ``v``'s (exact for
numbers).  String codes change when the dictionary grows; the tree keys
strings by their code under the dictionary it was built with (*base
codes*): ``str_map`` maps a code of the current dictionary to its base
code (a string new since then shares the base code of the gap it fell
in), so a key interval stays a necessary condition, and a string's strict
bounds are taken closed.

**Nodes.**  c-nodes are numbered in preorder from the root (c-node 0);
each has

* ``c_depth``: its bucket's depth (0 for the root and for the top bucket
  of a p-node's clustering directory);
* ``c_child[2c], c_child[2c + 1]``: the buckets of its two halves in the
  same clustering directory (-1: none);
* its l-node: leaf units ``[c_leaf[c], c_leaf[c + 1])`` of the
  leaf-ordered arrays; ``c_cap[c]``: the l-node's capacity
  (``max_cap^j``, §4.2);
* its p-directory: p-nodes ``[c_pdir[c], c_pdir[c + 1])``, sorted by
  ``p_attr``; ``p_top[k]``: the top bucket (a c-node) of p-node ``k``'s
  clustering directory.

Leaf-ordered arrays: ``leaf_unit`` (the unit -- one conjunction, see
:mod:`engine.algorithms.units` -- held there), and for the kernels
``l_sub`` (its subscription position) and ``l_verify`` (CSR into
``v_pid``): the predicates still to evaluate at the leaf, that is all of
the unit's but the *subsumed* ones (§5): an ``=`` on an attribute whose
bucket on the unit's path is atomic, decided by the path itself.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from gpu_kernels.opcodes import BETWEEN, EQ, GE, GT, LE, LT

#: depth of an atomic bucket (one key)
ATOMIC = 64
#: the smallest and the largest key
KEY_MIN = np.uint64(0)
KEY_MAX = np.uint64(0xFFFFFFFFFFFFFFFF)
_SIGN = np.uint64(1) << np.uint64(63)


class BETreeArrays(NamedTuple):
    """The structure of one flattened BE-Tree (see the module docstring):
    what is saved with an index."""

    c_depth: np.ndarray     # int16 [n_c]
    c_child: np.ndarray     # int32 [2 n_c]
    c_cap: np.ndarray       # int64 [n_c]
    c_leaf: np.ndarray      # int64 [n_c + 1]
    c_pdir: np.ndarray      # int64 [n_c + 1]
    p_attr: np.ndarray      # int32 [n_p]
    p_top: np.ndarray       # int32 [n_p]
    leaf_unit: np.ndarray   # int64 [n_l]


class LeafArrays(NamedTuple):
    """What the kernels read per leaf entry, derived from the structure and
    the units (:func:`gpu_kernels.betree.tree.leaf_arrays`), laid out so that
    checking one entry reads consecutive memory -- at a million
    subscriptions most leaves hold two or three units, so an array per field
    would cost a cache miss per field per candidate:

    * ``l_head[i] = (subscription position, first predicate)`` (row ``n_l``:
      the end of the last entry's predicates);
    * ``v_pred[v] = (attribute * 32 + operator, a, b)``: the predicates to
      evaluate, inline -- an interval operator's closed bounds (see
      :func:`interval_bounds`), an IN list's first and last value, the
      operands of any other operator;
    * ``v_set`` / ``v_sets``: the IN and NOT IN lists inline (CSR);
      ``v_pid``: the predicate's row of the extended table (pattern ids, and
      the cuda kernel's operands)."""

    l_head: np.ndarray      # int64 [n_l + 1, 2]
    v_pid: np.ndarray       # int32 [n_v]
    v_pred: np.ndarray      # float64 [n_v, 3]
    v_set: np.ndarray       # int32 (int64 past 2**31 values) [n_v + 1]
    v_sets: np.ndarray      # float64

    @property
    def l_sub(self) -> np.ndarray:
        return self.l_head[:-1, 0]

    @property
    def l_verify(self) -> np.ndarray:
        return self.l_head[:, 1]


#: operators decided by one closed interval test ``v_min <= x <= v_max``
#: (a strict bound is the adjacent float64, exact for every float64 value)
INTERVAL_OPS = (EQ, LT, LE, GT, GE, BETWEEN)


def interval_bounds(op, lo, hi):
    """``(v_min, v_max, is_interval)`` per predicate: the closed bounds of
    ``=``, ``<``, ``<=``, ``>``, ``>=``, ``BETWEEN`` -- which the leaf check
    then decides with two comparisons instead of the general operator
    switch (a strict bound is the neighbouring float64: ``x < v`` iff
    ``x <= nextafter(v, -inf)``) -- and the operands ``lo``, ``hi`` as they
    are for every other operator."""
    op = np.asarray(op)
    lo = np.asarray(lo, np.float64)
    hi = np.asarray(hi, np.float64)
    interval = np.isin(op, INTERVAL_OPS)
    v_min = np.where(interval, -np.inf, lo)
    v_max = np.where(interval, np.inf, hi)
    v_min = np.where((op == EQ) | (op == GE) | (op == BETWEEN), lo, v_min)
    # Past the largest finite float64 the neighbour is +-inf, the right
    # bound (``x > max`` iff ``x >= inf``); NumPy reports that step as an
    # overflow, which is no error here.
    with np.errstate(over="ignore"):
        above = np.nextafter(lo, np.inf)
        below = np.nextafter(lo, -np.inf)
    v_min = np.where(op == GT, above, v_min)
    v_max = np.where((op == EQ) | (op == LE), lo, v_max)
    v_max = np.where(op == BETWEEN, hi, v_max)
    v_max = np.where(op == LT, below, v_max)
    return v_min, v_max, interval


class NodeTable(NamedTuple):
    """The c-nodes as the CPU kernel walks them (derived from
    :class:`BETreeArrays` by :func:`gpu_kernels.betree.cpu.node_table`):
    one row of :data:`NODE_FIELDS` per c-node, so that a visit reads one
    cache line, and *compressed* child pointers -- a chain of buckets with
    nothing to match (empty l-node, no p-node, one half) is jumped over, the
    landing bucket's prefix telling whether the key really goes there (a
    chain of single halves down to an atomic bucket is 64 levels long)."""

    node: np.ndarray        # int64 [n_c, len(NODE_FIELDS)]
    p_top: np.ndarray       # int64 [n_p]: the first bucket worth visiting of each p-node's directory
    n_attrs: int            # 1 + the largest attribute id of a p-node or a leaf predicate


#: columns of :attr:`NodeTable.node`
N_LEAF, N_LEAF_END, N_PDIR, N_PDIR_END, N_DEPTH, N_CHILD, N_CHILD1, N_PREFIX = range(8)
NODE_FIELDS = ("leaf", "leaf_end", "pdir", "pdir_end", "depth", "child", "child1", "prefix")


DTYPES = {"c_depth": np.int16, "c_child": np.int32, "c_cap": np.int64, "c_leaf": np.int64, "c_pdir": np.int64,
          "p_attr": np.int32, "p_top": np.int32, "leaf_unit": np.int64}


def float_keys(values, xp=np):
    """The order-preserving 64-bit key of each float64 value (``xp``: NumPy
    or CuPy)."""
    values = xp.asarray(values, dtype=np.float64) + 0.0        # -0.0 -> 0.0
    bits = values.view(np.uint64)
    negative = (bits & _SIGN) != 0
    return xp.where(negative, ~bits, bits | _SIGN)


def base_codes(values, attr, string_attr, str_map, xp=np):
    """``values`` of attributes ``attr`` with string codes mapped to the
    tree's base codes (``str_map`` empty: the identity)."""
    if len(str_map) == 0 or len(string_attr) == 0:
        return values
    known = attr < len(string_attr)
    is_string = xp.zeros(len(attr), dtype=bool)
    is_string[known] = string_attr[attr[known]] != 0
    out = values.copy()
    codes = values[is_string].astype(np.int64)
    out[is_string] = str_map[xp.clip(codes, 0, len(str_map) - 1)]
    return out


def event_keys(batch_value, batch_attr, string_attr, str_map, xp=np):
    """The key of every attribute entry of an event batch."""
    return float_keys(base_codes(batch_value, batch_attr, string_attr, str_map, xp), xp)


def to_device(arrays: NamedTuple) -> NamedTuple:
    from gpu_kernels import cuda_support
    return type(arrays)(*(cuda_support.to_device(np.ascontiguousarray(a)) for a in arrays))


def nbytes(arrays: NamedTuple) -> int:
    return sum(int(a.nbytes) for a in arrays)


# ------------------------------------------------------------------ checks
def _fail(message: str):
    raise ValueError(f"saved BE-Tree: {message}")


def _csr(name: str, offsets: np.ndarray, n_rows: int, total: int) -> None:
    if len(offsets) != n_rows + 1 or offsets[0] != 0 or offsets[-1] != total or (np.diff(offsets) < 0).any():
        _fail(f"{name} is not a CSR of {n_rows} rows over {total} entries")


def check_arrays(tree: BETreeArrays, n_units: int) -> None:
    """Check a structure read from a file against everything the tree code
    and the kernels rely on (ValueError otherwise): dtypes, CSR offsets,
    ids within bounds, a tree (every c-node but the root reached exactly
    once, from a c-node numbered before it), bucket depths, p-directories
    sorted, each unit in exactly one leaf."""
    for name, dtype in DTYPES.items():
        a = getattr(tree, name)
        if not isinstance(a, np.ndarray) or a.dtype != dtype or a.ndim != 1:
            _fail(f"{name} must be a 1-D {np.dtype(dtype).name} array")
    n_c = len(tree.c_depth)
    n_p = len(tree.p_attr)
    if n_c < 1:
        _fail("no root c-node")
    if len(tree.c_child) != 2 * n_c or len(tree.c_cap) != n_c or len(tree.p_top) != n_p:
        _fail("array lengths disagree")
    _csr("c_leaf", tree.c_leaf, n_c, len(tree.leaf_unit))
    _csr("c_pdir", tree.c_pdir, n_c, n_p)
    depth = tree.c_depth.astype(np.int64)
    if (depth < 0).any() or (depth > ATOMIC).any() or depth[0] != 0:
        _fail("bucket depths must lie in [0, 64], the root's 0")
    if (tree.c_cap < 1).any():
        _fail("leaf capacities must be positive")
    child = tree.c_child.astype(np.int64).reshape(n_c, 2)
    if ((child < -1) | (child >= n_c)).any() or (tree.p_top < 1).any() or (tree.p_top >= n_c).any():
        _fail("a child or top bucket is out of range")
    owner_of_p = np.repeat(np.arange(n_c), np.diff(tree.c_pdir))
    parent = np.full(n_c, -1, np.int64)
    refs = np.zeros(n_c, np.int64)
    has = child >= 0
    kids = child[has]
    np.add.at(refs, kids, 1)
    np.add.at(refs, tree.p_top.astype(np.int64), 1)
    if refs[0] != 0 or (refs[1:] != 1).any():
        _fail("every c-node but the root must be reached exactly once")
    parent[kids] = np.nonzero(has)[0]
    parent[tree.p_top.astype(np.int64)] = owner_of_p
    if (parent[1:] >= np.arange(1, n_c)).any():
        _fail("c-nodes are not in preorder")
    if (depth[kids] != depth[np.nonzero(has)[0]] + 1).any() or (depth[tree.p_top.astype(np.int64)] != 0).any():
        _fail("a bucket's depth must be its parent's plus one, a top bucket's 0")
    if (depth[np.nonzero(has)[0]] >= ATOMIC).any():
        _fail("an atomic bucket cannot have halves")
    attr = tree.p_attr.astype(np.int64)
    if (attr < 0).any():
        _fail("negative p-node attribute")
    same = owner_of_p[1:] == owner_of_p[:-1]
    if (attr[1:][same] <= attr[:-1][same]).any():
        _fail("a p-directory is not sorted by attribute (or repeats one)")
    units = tree.leaf_unit
    if len(units) and (units.min() < 0 or units.max() >= n_units or len(np.unique(units)) != len(units)):
        _fail("leaf units must be distinct units of the segment")
