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
the CPU does for the one c-node it pops:

* ``MatchBETree`` (Algorithm 1), line 1 -- **the l-nodes**: a block-wide
  inclusive scan (Hillis-Steele in shared memory) of the batch's l-node
  sizes flattens their leaf entries, and the block's threads stride over
  them: each skips a subscription that is not alive or already found,
  evaluates the entry's remaining predicates (read inline:
  ``v_attr``/``v_op``/``v_lo``/``v_hi``; IN lists and pattern ids through
  ``v_pid``) with the shared device :func:`~gpu_kernels.predicates.predicate_truth`
  -- the event's attribute found by binary search in its sorted attribute
  ids, :func:`~gpu_kernels.predicates.find_attribute` -- and, when every one
  is TRUE, sets the subscription's bit in the event's row of the chunk's
  bit matrix with an atomic OR (which also de-duplicates a DNF subscription
  found through two units);
* lines 2-6 -- **the p-directories**: a second scan flattens the batch's
  p-directory lookups (per c-node the smaller of its p-directory and the
  event's attributes, searched in the other, as on the CPU); each thread
  takes one lookup and, when the event carries the p-node's attribute,
  runs ``SearchCDir`` (Algorithm 2): down the clustering directory from the
  p-node's top bucket along the halves holding the event's key (bit
  ``63 - depth``), pushing every bucket on the way -- to depth 64 (an
  atomic bucket) or a missing half.

Pushes take a slot of the queue with a shared-memory atomic add.  A
c-node is reached through one path only, so an event visits each c-node at
most once and the queue never holds more than the c-nodes one event can
visit: :func:`frontier_bound` computes that bound on the host, per tree.
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

import numpy as np
from numba import njit

from gpu_kernels import cuda_support
from gpu_kernels.betree.layout import ATOMIC, BETreeArrays, LeafArrays
from gpu_kernels.opcodes import IN, LIKE, NOT_IN, NOT_MATCHES, TRUE

cuda = None   # numba.cuda once the CUDA twin is built (a module global: see cuda_support)

#: entries of the shared-memory frontier queue (int32 c-node ids: 4 KiB)
QUEUE_CAPACITY = 1024

# slots of the block's shared control words
_Q_N = 0        # entries in the shared queue
_SP_N = 1       # entries in the block's spill region
_OVER = 2       # a push found no room: the event is abandoned (flagged for the second pass)
_M = 3          # c-nodes in this round's batch
_BASE = 4       # where the batch starts in its source
_FROM_SPILL = 5  # the batch's source: 0 the queue, 1 the spill
_N_STATE = 6


@njit(nogil=True, cache=True)
def frontier_bound(c_depth, c_child, c_pdir, p_top) -> int:
    """The most c-nodes one event can visit in this tree -- a bound on the
    frontier (queue plus spill) of any event, whatever order it is walked
    in, since no c-node is visited twice: ``visits[c] = 1 + sum, over the
    p-nodes of c, of the largest sum of visits along one root-to-leaf path
    of their clustering directory`` (one path per directory and event,
    Algorithm 2).  c-nodes are numbered in preorder, so one pass from the
    last to the first sees every c-node's halves and top buckets first."""
    n_c = len(c_depth)
    visits = np.zeros(n_c, np.int64)
    path = np.zeros(n_c, np.int64)      # the largest visits along one path down from this bucket
    for c in range(n_c - 1, -1, -1):
        v = 1
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


@functools.cache
def build_betree_kernel_cuda(threads: int, queue_capacity: int):
    """The raw BE-Tree kernel for blocks of ``threads`` threads (1 to 1024)
    and a shared frontier queue of ``queue_capacity`` c-nodes."""
    if not 1 <= threads <= 1024:
        raise ValueError(f"the BE-Tree kernel needs 1 to 1024 threads per block, not {threads}")
    if queue_capacity < 1:
        raise ValueError(f"the BE-Tree kernel's frontier queue needs a capacity >= 1, not {queue_capacity}")
    global cuda
    cuda = cuda_support.load_cuda()
    from gpu_kernels.predicates import cuda_device_functions
    device = cuda_device_functions()
    find_attribute = device.find_attribute
    predicate_truth = device.predicate_truth
    n_threads = int(threads)
    n_queue = int(queue_capacity)

    def block_scan(incl, tid):
        """Inclusive prefix sum of ``incl[0:n_threads]`` in place (Hillis-Steele;
        every thread of the block calls it, after writing its own slot)."""
        cuda.syncthreads()
        d = 1
        while d < n_threads:
            add = incl[tid - d] if tid >= d else np.int64(0)
            cuda.syncthreads()
            incl[tid] += add
            cuda.syncthreads()
            d *= 2

    def slot_of(incl, k):
        """The batch slot whose work holds flattened item ``k``: the first
        ``j`` with ``incl[j] > k``."""
        lo = 0
        n = n_threads
        while n > 0:
            half = n >> 1
            if incl[lo + half] <= k:
                lo = lo + half + 1
                n = n - half - 1
            else:
                n = half
        return lo

    block_scan = cuda.jit(device=True)(block_scan)
    slot_of = cuda.jit(device=True)(slot_of)

    def betree_kernel(n_items, item_event, ev_offsets, ev_attr, ev_value, ev_token, ev_key, key_base, pattern_truth,
                      tree, leaf, rows, alive, spill, spill_cap, overflow, bits):
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
        queue = cuda.shared.array(n_queue, np.int32)        # the frontier: c-nodes still to visit
        f_node = cuda.shared.array(n_threads, np.int32)     # this round's batch, one c-node per thread
        f_incl = cuda.shared.array(n_threads, np.int64)     # inclusive scan of the batch's work
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
            while True:
                # the batch: up to one c-node per thread from the top of the queue, else of the spill
                if tid == 0:
                    q_n = state[_Q_N]
                    if q_n > 0:
                        m = min(q_n, n_threads)
                        state[_Q_N] = q_n - m
                        state[_BASE] = q_n - m
                        state[_FROM_SPILL] = 0
                    else:
                        sp_n = state[_SP_N]
                        m = min(sp_n, n_threads)
                        state[_SP_N] = sp_n - m
                        state[_BASE] = sp_n - m
                        state[_FROM_SPILL] = 1
                    state[_M] = m
                cuda.syncthreads()
                m = state[_M]
                if m == 0:
                    break
                c = -1
                if tid < m:
                    if state[_FROM_SPILL] == 0:
                        c = queue[state[_BASE] + tid]
                    else:
                        c = spill[spill_base + state[_BASE] + tid]
                    f_node[tid] = c
                # Algorithm 1, line 1: the l-nodes' units, over the flattened leaf entries
                f_incl[tid] = c_leaf[c + 1] - c_leaf[c] if c >= 0 else 0
                block_scan(f_incl, tid)
                total = f_incl[n_threads - 1]
                for k in range(tid, total, n_threads):
                    j = slot_of(f_incl, k)
                    i = c_leaf[f_node[j]] + k - (f_incl[j - 1] if j > 0 else 0)
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
                cuda.syncthreads()      # f_incl is rewritten below
                # lines 2-6: the p-directory lookups of the batch (per c-node the smaller side
                # looked up in the other), and Algorithm 2 for each p-node the event has
                n_look = 0
                if c >= 0:
                    n_look = min(c_pdir[c + 1] - c_pdir[c], s1 - s0)
                f_incl[tid] = n_look
                block_scan(f_incl, tid)
                total = f_incl[n_threads - 1]
                for kq in range(tid, total, n_threads):
                    j = slot_of(f_incl, kq)
                    q = kq - (f_incl[j - 1] if j > 0 else 0)
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
                        attr = ev_attr[at]
                        lo = k0
                        hi = k1
                        while lo < hi:
                            mid = (lo + hi) >> 1
                            if p_attr[mid] < attr:
                                lo = mid + 1
                            else:
                                hi = mid
                        if lo >= k1 or p_attr[lo] != attr:
                            continue
                        k = lo
                    key = ev_key[at - key_base]
                    d = np.int64(p_top[k])
                    while d >= 0:
                        # push bucket d: a slot of the shared queue, else of the block's spill
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
                cuda.syncthreads()
                if state[_OVER] != 0:
                    break
                if tid == 0 and state[_Q_N] > n_queue:      # the pushes that went to the spill
                    state[_Q_N] = n_queue
            if tid == 0 and state[_OVER] != 0:
                overflow[item] = 1
            cuda.syncthreads()      # the control words are reset for the next event

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
                                                        np.float64, np.float64)], LeafArrays)
    rows = types.NamedTuple([array(dtype) for dtype in (np.int32, np.int8, np.float64, np.float64, np.int64,
                                                        np.int64, np.float64)], PredicateRows)
    i64 = types.int64
    return (i64, array(np.int64), array(np.int64), array(np.int32), array(np.float64), array(np.int32),
            array(np.uint64), i64, array(np.uint8, 2), tree, leaf, rows, array(np.uint8), array(np.int32), i64,
            array(np.uint8), array(np.uint64, 2))


def betree_kernel_cuda(n_blocks: int, threads: int, queue_capacity: int, *args):
    """Launch the BE-Tree kernel over ``n_blocks`` blocks of ``threads``
    (grid-stride over the listed events); ``args`` as the kernel takes them."""
    kernel = build_betree_kernel_cuda(int(threads), int(queue_capacity))
    kernel[int(n_blocks), int(threads)](*args)


__all__ = ["QUEUE_CAPACITY", "betree_kernel_cuda", "build_betree_kernel_cuda", "frontier_bound", "kernel_types"]
