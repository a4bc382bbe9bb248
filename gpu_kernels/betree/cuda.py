"""CUDA twin of BE-Tree matching (:mod:`gpu_kernels.betree.cpu`; Sadoghi, Jacobsen,
SIGMOD 2011, §6, Algorithms 1-2) over the very structure the CPU build makes: the
device twins of :class:`~gpu_kernels.betree.layout.BETreeArrays`,
:class:`~gpu_kernels.betree.layout.LeafArrays` and the extended predicate rows
(:class:`~engine.algorithms.units.PredicateRows`), handed whole to the kernel.

The CPU kernel gives each core a range of events and walks, per event, the
tree depth-first with a private stack of c-nodes.  Here **one thread block
takes one event** (grid-stride over the chunk's events) and walks the tree
*frontier by frontier*: the c-nodes still to visit are a work queue in the
block's shared memory, and each round the block takes up to one c-node per
thread from its top (the *batch*) and does, for all of them at once, what
the CPU does for the one c-node it pops.  One block-wide inclusive scan
(Hillis-Steele, ping-pong in shared memory: one barrier a step) of the
batch's l-node sizes and p-directory lookups flattens both kinds of work,
and the block's threads stride over them:

* ``MatchBETree`` (Algorithm 1), line 1 -- **the l-nodes' units**: each
  thread takes a leaf entry, skips a subscription that is not alive or
  already found, evaluates the entry's remaining predicates (read inline:
  ``v_attr``/``v_op``/``v_lo``/``v_hi``; IN lists and pattern ids through
  ``v_pid``) with the shared device :func:`~gpu_kernels.predicates.predicate_truth`
  -- the event's attribute found by binary search in its sorted attribute
  ids, :func:`~gpu_kernels.predicates.find_attribute` -- and, when every one
  is TRUE, sets the subscription's bit in the event's row of the chunk's
  bit matrix with an atomic OR (which also de-duplicates a DNF subscription
  found through two units);
* lines 2-6 -- **the p-directories**: each thread takes one lookup (per
  c-node the smaller of its p-directory and the event's attributes,
  searched in the other, as on the CPU) and, when the event carries the
  p-node's attribute, runs ``SearchCDir`` (Algorithm 2): down the
  clustering directory from the p-node's top bucket along the halves
  holding the event's key (bit ``63 - depth``), to depth 64 (an atomic
  bucket) or a missing half, pushing every bucket on the way that has
  something to match (leaf units or p-nodes: the empty buckets of a chain
  down to an atomic one are passed, not visited).

A round costs ``2 + log2(threads)`` barriers.  Pushes take a slot of the
queue with a shared-memory atomic add.  A c-node is reached through one
path only, so an event visits each c-node at most once and the queue never
holds more than the c-nodes one event can visit: :func:`frontier_bound`
computes that bound on the host, per tree.
When it exceeds the queue's capacity (``queue_capacity`` entries, a
compile-time constant), an event's frontier may overflow the shared queue.
The first pass runs without any global scratch: an event whose push finds
the queue full is abandoned (the bits it set are matches all the same: an
OR is idempotent) and flagged; the caller runs the flagged events again in
a second pass with a **per-block spill region in global memory** of
:func:`frontier_bound` entries, where pushes beyond the shared queue go
(the block refills its batch from the spill when the queue runs dry).
Either pass is correct for any tree -- a chain of 64-deep buckets under
every p-node included -- and the common one touches no global scratch.
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import numpy as np
from numba import njit

from gpu_kernels import cuda_support
from gpu_kernels.betree.layout import ATOMIC, BETreeArrays
from gpu_kernels.opcodes import FIRST_LIST_OP, IN, LAST_LIST_OP, LIKE, NOT_IN, NOT_MATCHES, TRUE

cuda = None   # numba.cuda once the CUDA twin is built (a module global: see cuda_support)


class DeviceLeafArrays(NamedTuple):
    """The fields of :class:`~gpu_kernels.betree.layout.LeafArrays` the
    kernel reads, its inline predicates taken from the current predicate
    rows (:func:`device_leaf_arrays`)."""

    l_sub: np.ndarray       # int64 [n_l]
    l_verify: np.ndarray    # int64 [n_l + 1]
    v_pid: np.ndarray       # int32 [n_v]
    v_attr: np.ndarray      # int32 [n_v]
    v_op: np.ndarray        # int8 [n_v]
    v_lo: np.ndarray        # float64 [n_v]
    v_hi: np.ndarray        # float64 [n_v]


def device_leaf_arrays(leaf, rows) -> DeviceLeafArrays:
    """The kernel's leaf arrays (host arrays, to be copied over) from the
    host matcher's ``leaf`` and the extended predicate ``rows``: the inline
    operands are read from ``rows`` anew, so a recode -- new codes, the
    same leaves -- is seen."""
    v_pid = leaf.v_pid
    return DeviceLeafArrays(np.ascontiguousarray(leaf.l_sub), np.ascontiguousarray(leaf.l_verify), v_pid,
                            rows.attr[v_pid], rows.op[v_pid], rows.lo[v_pid], rows.hi[v_pid])


#: entries of the shared-memory frontier queue (int32 c-node ids: 4 KiB)
QUEUE_CAPACITY = 1024
#: static shared memory a block may hold without an opt-in
MAX_SHARED_BYTES = 48 << 10

# slots of the block's shared control words
_Q_N = 0        # entries in the shared queue
_SP_N = 1       # entries in the block's spill region
_OVER = 2       # a push found no room: the event is abandoned (flagged for the second pass)
_N_STATE = 3


@njit(nogil=True, cache=True)
def frontier_bound(c_depth, c_child, c_leaf, c_pdir, p_top) -> int:
    """The most c-nodes one event can visit in this tree -- a bound on the
    frontier (queue plus spill) of any event, whatever order it is walked
    in, since no c-node is visited twice: ``visits[c] = [c is visited] +
    sum, over the p-nodes of c, of the largest sum of visits along one
    path down their clustering directory`` (one path per directory and
    event, Algorithm 2), where a bucket is visited when it has something to
    match (leaf units or p-nodes) and the root always.  c-nodes are
    numbered in preorder, so one pass from the last to the first sees every
    c-node's halves and top buckets first."""
    n_c = len(c_depth)
    visits = np.zeros(n_c, np.int64)
    path = np.zeros(n_c, np.int64)      # the largest visits along one path down from this bucket
    for c in range(n_c - 1, -1, -1):
        v = 1 if c == 0 or c_leaf[c + 1] != c_leaf[c] or c_pdir[c + 1] != c_pdir[c] else 0
        for k in range(c_pdir[c], c_pdir[c + 1]):
            v += path[p_top[k]]
        visits[c] = v
        below = 0
        if c_depth[c] < ATOMIC:
            for h in range(2):
                d = c_child[2 * c + h]
                if d >= 0 and path[d] > below:
                    below = path[d]
        path[c] = v + below
    return min(visits[0], n_c) if n_c else 0


def shared_bytes(threads: int, queue_capacity: int) -> int:
    """Static shared memory of a block: the queue (int32), the batch (int32),
    the two ping-pong scans (2 x 2 x int64 per thread), the control words."""
    return 4 * queue_capacity + 36 * threads + 8 * _N_STATE


def check_geometry(threads: int, queue_capacity: int) -> None:
    """ValueError unless blocks of ``threads`` threads with a frontier queue
    of ``queue_capacity`` c-nodes fit a block's shared memory."""
    if not 1 <= threads <= 1024:
        raise ValueError(f"the BE-Tree kernel needs 1 to 1024 threads per block, not {threads}")
    if queue_capacity < 1 or shared_bytes(threads, queue_capacity) > MAX_SHARED_BYTES:
        most = (MAX_SHARED_BYTES - shared_bytes(threads, 0)) // 4
        raise ValueError(f"queue_capacity must be an integer in [1, {most}] for blocks of {threads} threads (the "
                         f"frontier queue shares a block's {MAX_SHARED_BYTES} bytes of shared memory), not "
                         f"{queue_capacity!r}")


@functools.cache
def build_betree_kernel_cuda(threads: int, queue_capacity: int):
    """The raw BE-Tree kernel for blocks of ``threads`` threads (1 to 1024)
    and a shared frontier queue of ``queue_capacity`` c-nodes (see
    :func:`check_geometry`)."""
    check_geometry(threads, queue_capacity)
    global cuda
    cuda = cuda_support.load_cuda()
    from gpu_kernels.predicates import cuda_device_functions
    device = cuda_device_functions()
    find_attribute = device.find_attribute
    predicate_truth = device.predicate_truth
    list_hit = device.list_hit
    list_key = device.list_key
    n_threads = int(threads)
    n_queue = int(queue_capacity)

    def block_scan2(a, b, tid):
        """Inclusive prefix sums of rows ``a[0]`` and ``b[0]`` at once
        (Hillis-Steele, ping-pong between the two rows of each: one barrier
        a step); returns the row that holds them.  Every thread of the block
        calls it, after a barrier that follows the writes of ``a[0]``,
        ``b[0]``."""
        src = 0
        d = 1
        while d < n_threads:
            dst = 1 - src
            if tid >= d:
                a[dst, tid] = a[src, tid] + a[src, tid - d]
                b[dst, tid] = b[src, tid] + b[src, tid - d]
            else:
                a[dst, tid] = a[src, tid]
                b[dst, tid] = b[src, tid]
            cuda.syncthreads()
            src = dst
            d *= 2
        return src

    def slot_of(incl, row, k):
        """The batch slot whose work holds flattened item ``k``: the first
        ``j`` with ``incl[row, j] > k``."""
        lo = 0
        n = n_threads
        while n > 0:
            half = n >> 1
            if incl[row, lo + half] <= k:
                lo = lo + half + 1
                n = n - half - 1
            else:
                n = half
        return lo

    block_scan2 = cuda.jit(device=True)(block_scan2)
    slot_of = cuda.jit(device=True)(slot_of)

    def betree_kernel(n_items, item_event, ev_offsets, ev_attr, ev_value, ev_token, ev_key, key_base, pattern_truth,
                      list_truth, tree, leaf, rows, alive, spill, spill_cap, overflow, bits):
        # the structure's arrays, named as in the CPU twin
        c_depth = tree.c_depth
        c_child = tree.c_child
        c_leaf = tree.c_leaf
        c_pdir = tree.c_pdir
        p_attr = tree.p_attr
        p_top = tree.p_top
        l_sub = leaf.l_sub
        l_verify = leaf.l_verify
        v_pid = leaf.v_pid
        v_attr = leaf.v_attr
        v_op = leaf.v_op
        v_lo = leaf.v_lo
        v_hi = leaf.v_hi
        x_aux = rows.aux
        x_set_offsets = rows.set_offsets
        set_values = rows.set_values
        tid = cuda.threadIdx.x
        blk = cuda.blockIdx.x
        queue = cuda.shared.array(n_queue, np.int32)            # the frontier: c-nodes still to visit
        f_node = cuda.shared.array(n_threads, np.int32)         # this round's batch, one c-node per thread
        f_leaf = cuda.shared.array((2, n_threads), np.int64)    # scan of the batch's l-node sizes
        f_look = cuda.shared.array((2, n_threads), np.int64)    # scan of the batch's p-directory lookups
        state = cuda.shared.array(_N_STATE, np.int64)
        spill_base = blk * spill_cap
        for item in range(blk, n_items, cuda.gridDim.x):
            e = item_event[item]
            s0 = ev_offsets[e]
            s1 = ev_offsets[e + 1]
            if tid == 0:        # the walk starts at the root (c-node 0)
                queue[0] = 0
                state[_Q_N] = 1
                state[_SP_N] = 0
                state[_OVER] = 0
            cuda.syncthreads()
            while True:
                # the batch: up to one c-node per thread from the top of the queue, else of the
                # spill (every thread reads the counts; thread 0 lowers them once all have)
                q_n = min(state[_Q_N], n_queue)         # (beyond n_queue: pushes that went to the spill)
                from_spill = q_n == 0
                avail = state[_SP_N] if from_spill else q_n
                m = min(avail, n_threads)
                if m == 0:
                    break
                base = avail - m
                c = -1
                if tid < m:
                    c = spill[spill_base + base + tid] if from_spill else queue[base + tid]
                    f_node[tid] = c
                f_leaf[0, tid] = c_leaf[c + 1] - c_leaf[c] if c >= 0 else 0
                f_look[0, tid] = min(c_pdir[c + 1] - c_pdir[c], s1 - s0) if c >= 0 else 0
                cuda.syncthreads()
                if tid == 0:    # the batch leaves its source (the scan's barriers order this before any push)
                    state[_SP_N if from_spill else _Q_N] = base
                row = block_scan2(f_leaf, f_look, tid)
                # Algorithm 1, line 1: the l-nodes' units, over the batch's flattened leaf entries
                total = f_leaf[row, n_threads - 1]
                for k in range(tid, total, n_threads):
                    j = slot_of(f_leaf, row, k)
                    i = c_leaf[f_node[j]] + k - (f_leaf[row, j - 1] if j > 0 else 0)
                    pos = l_sub[i]
                    if alive[pos] == 0:
                        continue
                    word = pos >> 6
                    mask = np.uint64(1) << np.uint64(pos & 63)
                    if (bits[e, word] & mask) != 0:     # found already (another unit of a DNF subscription)
                        continue
                    # its predicates, read inline; the shared three-valued predicate_truth decides
                    ok = True
                    for v in range(l_verify[i], l_verify[i + 1]):
                        op = v_op[v]
                        at = find_attribute(ev_attr, s0, s1, v_attr[v])
                        present = at >= 0
                        value = ev_value[at] if present else 0.0
                        hit = False
                        if present and op >= LIKE and op <= NOT_MATCHES:
                            hit = pattern_truth[ev_token[at], x_aux[v_pid[v]]] != 0
                        elif present and op >= FIRST_LIST_OP and op <= LAST_LIST_OP:    # the event list's row
                            hit = list_hit(list_truth, ev_token[at], list_key(op, x_aux[v_pid[v]]))
                        set_start = np.int64(0)
                        set_stop = np.int64(0)
                        if op == IN or op == NOT_IN:
                            set_start = x_set_offsets[v_pid[v]]
                            set_stop = x_set_offsets[v_pid[v] + 1]
                        if predicate_truth(op, v_lo[v], v_hi[v], set_values, set_start, set_stop, hit, present,
                                           value) != TRUE:
                            ok = False
                            break
                    if ok:
                        cuda.atomic.or_(bits, (e, word), mask)
                # lines 2-6: the batch's p-directory lookups (per c-node the smaller side looked
                # up in the other), and Algorithm 2 for each p-node whose attribute the event has
                total = f_look[row, n_threads - 1]
                for kq in range(tid, total, n_threads):
                    j = slot_of(f_look, row, kq)
                    q = kq - (f_look[row, j - 1] if j > 0 else 0)
                    cq = f_node[j]
                    k0 = c_pdir[cq]
                    k1 = c_pdir[cq + 1]
                    small = k1 - k0 <= s1 - s0
                    if small:
                        k = k0 + q
                        at = find_attribute(ev_attr, s0, s1, p_attr[k])
                        if at < 0:
                            continue
                    else:
                        at = s0 + q
                        k = find_attribute(p_attr, k0, k1, ev_attr[at])     # (a binary search of sorted ids)
                        if k < 0:
                            continue
                    key = ev_key[at - key_base]
                    d = np.int64(p_top[k])
                    while d >= 0:
                        # push bucket d -- unless it has nothing to match (an empty l-node, no p-node:
                        # the 63 buckets above an atomic one often) -- to a slot of the shared queue,
                        # else of the block's spill
                        if c_leaf[d + 1] != c_leaf[d] or c_pdir[d + 1] != c_pdir[d]:
                            slot = cuda.atomic.add(state, _Q_N, 1)
                            if slot < n_queue:
                                queue[slot] = d
                            else:
                                s = cuda.atomic.add(state, _SP_N, 1)
                                if s >= spill_cap:
                                    state[_OVER] = 1
                                    break
                                spill[spill_base + s] = d
                        depth = c_depth[d]
                        if depth >= ATOMIC:
                            break
                        d = np.int64(c_child[2 * d + np.int64((key >> np.uint64(63 - depth)) & np.uint64(1))])
                cuda.syncthreads()      # the pushes are done (and the scans read) before the next batch
                if state[_OVER] != 0:
                    break
            if tid == 0 and state[_OVER] != 0:
                overflow[item] = 1
            cuda.syncthreads()      # every thread is done with the control words before the next event resets them

    return cuda.jit(betree_kernel)


def kernel_types() -> tuple:
    """The numba argument types of the BE-Tree kernel (device twins of the
    structures as :mod:`engine.algorithms.betree` makes them): what
    ``cuda.compile_ptx`` needs to compile it without a GPU.  Needs no
    ``numba.cuda``."""
    from numba import types
    from numba.np.numpy_support import from_dtype

    from engine.algorithms.units import PredicateRows
    from gpu_kernels.betree.layout import DTYPES

    def array(dtype, ndim=1):
        return types.Array(from_dtype(np.dtype(dtype)), ndim, "C")

    tree = types.NamedTuple([array(DTYPES[name]) for name in BETreeArrays._fields], BETreeArrays)
    leaf = types.NamedTuple([array(dtype) for dtype in (np.int64, np.int64, np.int32, np.int32, np.int8,
                                                        np.float64, np.float64)], DeviceLeafArrays)
    rows = types.NamedTuple([array(dtype) for dtype in (np.int32, np.int8, np.float64, np.float64, np.int64,
                                                        np.int64, np.float64)], PredicateRows)
    i64 = types.int64
    return (i64, array(np.int64), array(np.int64), array(np.int32), array(np.float64), array(np.int32),
            array(np.uint64), i64, array(np.uint8, 2), array(np.int64), tree, leaf, rows, array(np.uint8),
            array(np.int32), i64, array(np.uint8), array(np.uint64, 2))


def betree_kernel_cuda(n_blocks: int, threads: int, queue_capacity: int, *args):
    """Launch the BE-Tree kernel over ``n_blocks`` blocks of ``threads``
    (grid-stride over the listed events); ``args`` as the kernel takes them."""
    kernel = build_betree_kernel_cuda(int(threads), int(queue_capacity))
    kernel[int(n_blocks), int(threads)](*args)


__all__ = ["QUEUE_CAPACITY", "DeviceLeafArrays", "betree_kernel_cuda", "build_betree_kernel_cuda", "check_geometry",
           "device_leaf_arrays", "frontier_bound", "kernel_types"]
