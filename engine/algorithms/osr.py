"""Online stream re-ordering, OSR (Sadoghi, Jacobsen, ICDE 2014, §VI).

A batch is cut into *buffered batches* of ``batch_size`` events, and each is
inserted into a BE-Tree of its own -- the events as units, each a
conjunction of ``attribute = value`` (one key per attribute), through the
very :class:`gpu_kernels.betree.tree.DynamicTree` that indexes the
subscriptions.  BE-Tree's space partitioning and clustering put similar
events in one l-node: the l-nodes are the *event clusters*, their size
bounded by the tree's leaf capacity (the *cluster size*), and a cluster's
*similarity* is read off its depth -- the number of p-nodes on its path,
i.e. the attributes all its events carry with values in the same bucket.
BE-Tree copes with the events' *incomplete data* (most events carry a few
of the attributes) by design, which locality-sensitive hashing does not.
The buffered batches' trees are independent, so several are built at once
on a pool of threads (:meth:`Reorderer.clusters`): on the GPU path the
re-ordering is the host's part, and was more than half of A-PCM's time.

**A-PCM** (§VI): clusters of at least ``threshold`` similarity (and two
events) are matched compressed, the others event by event.  **Adaptive
cluster size** (§VII-B: "taken as an initial value ... tuned adaptively
based on the size of the discovered clusters"): when most compressed
clusters fill the capacity, the next buffered batch's tree (the next wave
of them, with several threads) gets twice the capacity; when none is
similar enough or even the largest stays within a quarter of it, half
(never below the option's value, never above :data:`ADAPTIVE_CEILING` or
the option's value if larger; the gap between the two rules keeps a stream
of steady clusters from see-sawing).  The option itself goes up to
:data:`MAX_MEMBERS` (128, the largest of the paper's Fig. 9(b)).
"""

from __future__ import annotations

import os
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import NamedTuple

import numba
import numpy as np
from numba import njit

from engine.algorithms.options import MAX_MEMBERS
from gpu_kernels.betree.tree import DynamicTree

#: the adaptive cluster size grows no further than this on its own (the
#: ceiling measured with: BENCHMARKS.md, "A-PCM (issue 14)"), unless the
#: option starts it higher
ADAPTIVE_CEILING = 64


class Clusters(NamedTuple):
    """A batch re-ordered: cluster ``c`` is events ``perm[off[c]:off[c + 1]]``
    (its members, batch indices); ``similarity[c]`` the p-nodes above its
    l-node (-1 when not clustered by a tree)."""

    perm: np.ndarray        # int64 [n_events]
    off: np.ndarray         # int64 [n_clusters + 1]
    similarity: np.ndarray  # int64 [n_clusters]

    @property
    def n_clusters(self) -> int:
        return len(self.off) - 1

    @property
    def max_members(self) -> int:
        return int(np.diff(self.off).max(initial=1))

    def compressed_events(self) -> int:
        """Events in clusters of two or more."""
        sizes = np.diff(self.off)
        return int(sizes[sizes > 1].sum())


def per_event(n_events: int) -> Clusters:
    """Every event its own cluster (the Bitmap and Parallel algorithms)."""
    return Clusters(np.arange(n_events, dtype=np.int64), np.arange(n_events + 1, dtype=np.int64),
                    np.full(n_events, -1, np.int64))


def arrival_runs(n_events: int, size: int) -> Clusters:
    """Consecutive runs of ``size`` events in arrival order (PCM without
    re-ordering: C-U-PP)."""
    off = np.append(np.arange(0, n_events, size, dtype=np.int64), n_events)
    return Clusters(np.arange(n_events, dtype=np.int64), off, np.full(len(off) - 1, -1, np.int64))


@njit(nogil=True, cache=True)
def _p_depth(c_child, c_pdir, p_top):
    """Per c-node, the p-nodes on its path (preorder: parents first)."""
    n = len(c_pdir) - 1
    depth = np.zeros(n, np.int64)
    for c in range(n):
        for half in range(2):
            h = c_child[2 * c + half]
            if h >= 0:
                depth[h] = depth[c]
        for k in range(c_pdir[c], c_pdir[c + 1]):
            depth[p_top[k]] = depth[c] + 1
    return depth


class Reorderer:
    """OSR with its adaptive cluster size (state kept across calls: a tuning
    value, like a matcher's running estimates; a race between two calls
    only picks one of their values)."""

    def __init__(self, batch_size: int = 1024, cluster_size: int = 8, threshold: int = 2, adaptive: bool = True,
                 min_size: int = 2):
        self.batch_size = int(batch_size)
        self.cluster_size = int(cluster_size)
        self.threshold = int(threshold)
        self.adaptive = bool(adaptive)
        self.min_size = int(min_size)
        self.capacity = int(cluster_size)

    def clusters(self, offsets: np.ndarray, attr: np.ndarray, keys: np.ndarray, compress_all: bool = False,
                 threads: int | None = None) -> Clusters:
        """The batch's clusters (events of ``offsets``/``attr`` with their
        entry ``keys``), buffered batch by buffered batch.  ``compress_all``
        (PCM with re-ordering, C-U-PP-RE): every l-node compressed,
        whatever its similarity.

        Buffered batches are independent trees, so ``threads`` of them
        (default: the caller's numba thread count) are clustered at once,
        a *wave*, on a pool of threads (the tree's kernels release the
        GIL).  The adaptive cluster size then adapts once per wave, from
        the wave's clusters together: every batch of a wave is clustered at
        the capacity the wave started with.  One thread is the paper's
        sequential rule, batch by batch."""
        n_events = len(offsets) - 1
        n_attrs = int(attr.max(initial=-1)) + 1
        threads = max(1, numba.get_num_threads() if threads is None else int(threads))
        starts = list(range(0, n_events, self.batch_size))
        perms, sizes, sims = [], [], []
        for w0 in range(0, len(starts), threads):
            cap = self.capacity

            def one(b0, cap=cap):
                return self._buffered_batch(offsets, attr, keys, b0, min(n_events, b0 + self.batch_size), n_attrs,
                                            compress_all, cap)

            wave = starts[w0:w0 + threads]
            done = [one(wave[0])] if len(wave) == 1 else list(_pool().map(one, wave))
            for b0, (perm, size, sim, _) in zip(wave, done):
                perms.append(perm + b0)
                sizes.append(size)
                sims.append(sim)
            if self.adaptive:
                tallies = np.array([tally for *_, tally in done], np.int64).reshape(-1, 3)
                self._adapt(cap, int(tallies[:, 0].sum()), int(tallies[:, 1].sum()), int(tallies[:, 2].max()))
        if not perms:
            return per_event(0)
        size = np.concatenate(sizes)
        return Clusters(np.concatenate(perms), np.concatenate(([0], np.cumsum(size))).astype(np.int64),
                        np.concatenate(sims))

    def _adapt(self, cap: int, compressed: int, full: int, largest: int) -> None:
        """§VII-B: twice the capacity when most compressed clusters filled
        it, half when none was similar enough or even the largest stayed
        within a quarter of it (the module docstring)."""
        if compressed and full * 2 > compressed:
            self.capacity = min(max(ADAPTIVE_CEILING, self.cluster_size), 2 * cap)
        elif (not compressed or largest * 4 <= cap) and cap > self.cluster_size:
            self.capacity = max(self.cluster_size, cap // 2)

    def _buffered_batch(self, offsets, attr, keys, b0, b1, n_attrs, compress_all, cap):
        """One buffered batch's clusters at capacity ``cap``: the events in
        cluster order, the cluster sizes and similarities, and what the
        adaptive rule reads (``(compressed clusters, full ones, largest)``)."""
        n = b1 - b0
        if n < 2:                     # nothing to cluster (a service's lone event): no tree
            return np.arange(n, dtype=np.int64), np.ones(n, np.int64), np.full(n, -1, np.int64), (0, 0, 0)
        s0, s1 = int(offsets[b0]), int(offsets[b1])
        tree_keys = ((offsets[b0:b1 + 1] - s0).astype(np.int64), attr[s0:s1].astype(np.int64), keys[s0:s1],
                     keys[s0:s1])
        # (events' keys are points: many share one, which the forced split rule would halve down to
        # the atomic depth, two c-nodes a level -- partitioned at once instead, see resolve_overflow)
        tree = DynamicTree(n, tree_keys, max(n_attrs, 1), cap, self.min_size, equal_keys_partition=True)
        tree.insert(np.arange(n, dtype=np.int64))
        flat = tree.freeze()
        depth = _p_depth(flat.c_child, flat.c_pdir, flat.p_top)
        leaf_size = np.diff(flat.c_leaf)
        leaves = np.flatnonzero(leaf_size)
        similar = (depth[leaves] >= self.threshold) | compress_all
        perm = flat.leaf_unit.astype(np.int64)   # events in leaf order: each leaf's members together
        sizes, sims = [], []
        full = compressed = largest = 0
        chunk = min(MAX_MEMBERS, cap)
        for c, sim in zip(leaves, similar):
            m = int(leaf_size[c])
            if sim and m > 1:
                whole, rest = divmod(m, chunk)
                sizes += [chunk] * whole + ([rest] if rest else [])
                sims += [int(depth[c])] * (whole + (1 if rest else 0))
                compressed += 1
                full += m >= cap
                largest = max(largest, m)
            else:
                sizes += [1] * m
                sims += [int(depth[c])] * m
        return perm, np.asarray(sizes, np.int64), np.asarray(sims, np.int64), (compressed, full, largest)


_POOL: ThreadPoolExecutor | None = None
_POOL_LOCK = threading.Lock()


def _pool() -> ThreadPoolExecutor:
    """The threads that cluster a wave's buffered batches (made on first use, kept)."""
    global _POOL
    with _POOL_LOCK:
        if _POOL is None:
            _POOL = ThreadPoolExecutor(max_workers=max(1, numba.config.NUMBA_NUM_THREADS),
                                       thread_name_prefix="bexmatch-osr")
        return _POOL


def _forget_pool() -> None:
    """In a forked child: the pool object came over, its threads did not (a
    wave handed to it waited forever), and the lock may have been held by
    a thread that is not there either; the child makes its own."""
    global _POOL, _POOL_LOCK
    _POOL, _POOL_LOCK = None, threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_pool)


__all__ = ["ADAPTIVE_CEILING", "MAX_MEMBERS", "Clusters", "Reorderer", "arrival_runs", "per_event"]
