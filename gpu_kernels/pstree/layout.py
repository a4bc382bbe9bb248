"""The PS-Tree structures both twins read (Ji and Jacobsen, PVLDB 12(3) 2018, §4-§6), and the
plain-Python functions on them that both compile: numba on the CPU
(:mod:`gpu_kernels.pstree.cpu`), numba-CUDA device functions on the device
(:mod:`gpu_kernels.pstree.cuda`).

* :class:`SpaceTable` -- the flat PS-Trees: per attribute the sorted
  boundary codes, the predicate space of each elementary range
  (:mod:`gpu_kernels.pstree.cpu`'s docstring has the picture);
* :class:`BloomArrays` -- PSTBloom's subscription lists and Bloom
  signatures per space (§5.1);
* :class:`HashArrays` -- PSTHash's hash table from N-dim space ids to the
  units keyed by them (§6.1).

The host matcher (:mod:`engine.algorithms.pstree`) builds them once; the
cuda matcher copies the very same arrays to the device (:func:`to_device`),
so that both backends locate, probe and verify over one layout.

The functions here are written once, as plain Python: a hash or a binary
search that differed between the twins would make the device see other
spaces or other signature bits than the host built.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from gpu_kernels.opcodes import BETWEEN, EQ, GE, GT, IN, LE, LT, N_OPS, NE, NOT_BETWEEN, NOT_IN
from gpu_kernels.open_addressing import key_hash_py     # the hash of §6.1's table (an N-dim space id), shared

#: the paper's selectivity ranking of operators (§3.3): = > ∈ > BETWEEN > ranges > ∉ > ≠
#: (NOT BETWEEN, which the paper does not list, goes between ∉ and ≠: it excludes a range, ≠ one value).
#: Index by opcode; NOT_INDEXABLE for the operators whose TRUE set is not a union of code ranges
#: decided by the value alone (LIKE, MATCHES and their negations need the string; IS [NOT] NULL
#: is about presence; the list operators ONE OF ... IS NOT EMPTY need the event list, read by the
#: entry's token from the batch's list table) -- those never serve as access predicates.
NOT_INDEXABLE = 99
OPERATOR_CLASS = np.full(N_OPS, NOT_INDEXABLE, np.int64)
OPERATOR_CLASS[EQ] = 0
OPERATOR_CLASS[IN] = 1
OPERATOR_CLASS[BETWEEN] = 2
OPERATOR_CLASS[[LT, LE, GT, GE]] = 3
OPERATOR_CLASS[NOT_IN] = 4
OPERATOR_CLASS[NOT_BETWEEN] = 5
OPERATOR_CLASS[NE] = 6

#: the most access predicates per unit (PSTHashOptions.n_access): the width of a device key
MAX_ACCESS = 4


class SpaceTable(NamedTuple):
    """One PS-Tree per attribute, flattened (see :mod:`gpu_kernels.pstree.cpu`)."""

    val_off: np.ndarray      # int64 [n_attrs + 1]
    vals: np.ndarray         # float64: sorted endpoint codes per attribute
    elem_space: np.ndarray   # int64 [2 * len(vals) + n_attrs]: elementary range -> global space id (-1: no tree)
    space_off: np.ndarray    # int64 [n_attrs + 1]: attribute a's spaces are [space_off[a], space_off[a + 1])


class BloomArrays(NamedTuple):
    """PSTBloom's structure besides the PS-Trees (§5.1).  Units are numbered
    either as the matcher's units are (``unit_structure()``: what merges
    derive from) or, in the ``structure`` the kernels read, in *probe
    order* (``engine.algorithms.pstree._PSTreeMatcher._lay_out``): then
    ``access`` is a position in the probe-ordered predicate ids the kernels
    are given beside it, and ``units``, ``always`` and ``key`` follow the
    probe numbering.  The same holds for :class:`HashArrays`."""

    list_off: np.ndarray     # int64 [n_spaces + 1]: CSR of the subscription lists (units)
    units: np.ndarray        # int32
    sig_off: np.ndarray      # int64 [n_spaces + 1]: CSR of the signatures (uint64 words)
    sig: np.ndarray          # uint64
    access: np.ndarray       # int64 [n_units]: position in pids of the access predicate, -1 none
    always: np.ndarray       # int32: units without an indexable predicate, candidates for every event
    indexable: np.ndarray    # uint8 per predicate row: its spaces are in the PS-Trees
    key: np.ndarray          # int64 [n_units]: the id a unit's Bloom bits are hashed from -- its unit id
    #                          at a build (its own number, not the probe order's); a merge renumbers
    #                          units but keeps their keys, so that the signatures it copies over still
    #                          hold them (engine.algorithms.pstree)


class HashArrays(NamedTuple):
    """PSTHash's structure besides the PS-Trees (§6.1).  The hash table is
    open addressing with linear probing over ``slot_group``; a slot holds
    only its group's number, and the key it is compared with is the
    group's row of ``group_key``.  (The slots held the keys themselves
    before: N int64 and an int64 group a slot, at most half the slots
    used -- 24 bytes a slot, two thirds of PSTHash's memory on W2.  Now 4
    a slot and 8N a group; a probe that meets an occupied slot reads one
    key either way.)"""

    slot_group: np.ndarray   # int32 [n_slots]: the group whose key probes to this slot, -1 for a free slot
    group_key: np.ndarray    # int32 [n_groups, N]: each group's N-dim space id (-1 padded below N; int64 past 2**31)
    group_off: np.ndarray    # int32 [n_groups + 1]: CSR of each N-dim space's units (int64 past 2**31 entries)
    units: np.ndarray        # int32
    access: np.ndarray       # int64 [n_units, N]: positions in pids of the access predicates, -1 padded
    arities: np.ndarray      # uint8 [N + 1]: 1 where some unit has that many access predicates
    always: np.ndarray       # int32: units without an indexable predicate


# ------------------------------------------------ functions both twins compile
def elementary_py(vals, v0, v1, x):
    """Elementary range of ``x`` among the sorted endpoints ``vals[v0:v1]``:
    ``2i + 1`` when ``x`` equals endpoint ``i``, else ``2i`` (``i``: the
    endpoints below ``x``).  A NaN lands in range 0, the leftmost gap, which
    every predicate TRUE on NaN (``!=``, NOT IN, NOT BETWEEN) covers."""
    lo = v0
    hi = v1
    while lo < hi:
        mid = (lo + hi) >> 1
        if vals[mid] < x:
            lo = mid + 1
        else:
            hi = mid
    if lo < v1 and vals[lo] == x:
        return 2 * (lo - v0) + 1
    return 2 * (lo - v0)


def bloom_key_py(u):
    """Unit ``u``'s two Bloom hashes (splitmix64; bit ``i`` of a signature
    of ``n`` bits is ``(h1 + i * h2) mod n``, double hashing)."""
    x = np.uint64(u) + np.uint64(0x9E3779B97F4A7C15)
    x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    x = x ^ (x >> np.uint64(31))
    return x, (x >> np.uint64(32)) | np.uint64(1)


def bloom_probe_py(sig_words, w0, w1, h1, h2, n_hashes):
    """Whether the signature in ``sig_words[w0:w1]`` may hold the unit of
    hashes ``(h1, h2)`` (an empty signature holds nothing)."""
    if w1 == w0:
        return False
    mask = np.uint64((w1 - w0) * 64 - 1)
    for i in range(n_hashes):
        b = np.int64((h1 + np.uint64(i) * h2) & mask)
        if (sig_words[w0 + (b >> 6)] >> np.uint64(b & 63)) & np.uint64(1) == 0:
            return False
    return True


# ------------------------------------------------------------------ device copies
def _padded(a: np.ndarray) -> np.ndarray:
    """``a``, or one row of -1 where it has none: no kernel argument may be a
    null pointer (kernels read no row past the logical counts)."""
    a = np.ascontiguousarray(a)
    if a.size == 0 and a.ndim == 2:
        return np.full((1, max(a.shape[1], 1)), -1, a.dtype)
    return a


def to_device(arrays: NamedTuple) -> NamedTuple:
    """The device twin of one of this module's structures (or of
    :class:`~engine.algorithms.units.PredicateRows`): every array copied
    over, empty ones padded to one element."""
    from gpu_kernels import cuda_support
    return type(arrays)(*(cuda_support.to_device(_padded(a)) for a in arrays))


def nbytes(arrays: NamedTuple) -> int:
    return sum(int(a.nbytes) for a in arrays)


__all__ = ["MAX_ACCESS", "NOT_INDEXABLE", "OPERATOR_CLASS", "BloomArrays", "HashArrays", "SpaceTable",
           "bloom_key_py", "bloom_probe_py", "elementary_py", "key_hash_py", "nbytes", "to_device"]
