"""Open addressing with linear probing over rows of int64 keys: one hash and
one probe for every table that numbers distinct key rows -- PSTHash's
table of N-dim predicate spaces (the PS-Tree paper's §6.1) and the A-Tree's
leaf classes (a predicate's key row: attribute, operator, bounds, aux).

A table is ``slots`` (a power of two of int32 or int64 group ids, -1
empty) beside the rows the ids number.  :func:`find_slot` is the probe: the
slot holding the row equal to the key, or the empty slot where it would go
-- inserting, looking up and matching all go through it, so that they can
never disagree on where a key lives.  ``key_hash_py`` is plain Python so
that the CUDA twins compile the very same hash.
"""

from __future__ import annotations

import numpy as np
from numba import njit

__all__ = ["find_slot", "key_hash", "key_hash_py"]


def key_hash_py(keys, row, width):
    """The hash of the key row ``keys[row, :width]`` (splitmix64 steps over
    its components)."""
    h = np.uint64(0x243F6A8885A308D3)
    for q in range(width):
        x = h ^ np.uint64(keys[row, q] + 1)
        x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        h = x ^ (x >> np.uint64(31))
    return h


key_hash = njit(inline="always", nogil=True)(key_hash_py)


@njit(inline="always", nogil=True)
def find_slot(slots, rows, keys, row, width):
    """The slot whose id numbers the row ``rows[id]`` equal to
    ``keys[row, :width]``, or the empty slot its probe ends at (``slots``
    -1 there)."""
    n_slots = len(slots)
    s = np.int64(key_hash(keys, row, width) & np.uint64(n_slots - 1))
    while True:
        g = slots[s]
        if g < 0:
            return s
        same = True
        for q in range(width):
            if rows[g, q] != keys[row, q]:
                same = False
                break
        if same:
            return s
        s = (s + 1) & (n_slots - 1)
