"""Combinations in numba kernels, in itertools' order.

PSTHash enumerates the C(|E|, r) combinations of an event's located
predicate spaces (PS-Tree §6), and the A-Tree's reorganisation the
sub-sets of a new expression's children (A-Tree Algorithm 2): both keep
the positions of the current combination in an array and step it here.
"""

from __future__ import annotations

from numba import njit


@njit(cache=True, inline="always")
def first_combination(idx, r) -> None:
    """``idx[:r]`` the first combination of r positions: 0, 1, ..., r - 1."""
    for q in range(r):
        idx[q] = q


@njit(cache=True, inline="always")
def next_combination(idx, r, k) -> bool:
    """``idx[:r]`` (ascending positions among ``k``) stepped to the next
    combination in lexicographic order; False after the last."""
    q = r - 1
    while q >= 0 and idx[q] == k - r + q:
        q -= 1
    if q < 0:
        return False
    idx[q] += 1
    for p in range(q + 1, r):
        idx[p] = idx[p - 1] + 1
    return True
