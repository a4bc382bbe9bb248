"""CUDA twin of A-PCM's stages (:mod:`gpu_kernels.apcm.cpu`; Sadoghi, Jacobsen,
ICDE 2014, §IV-§VI) over the very structures the CPU build makes: the BE-Tree's
node table, the A-PCM leaf arrays (``l_head``, ``v_attr``, ``v_slot``) and the
bitmap layout (:mod:`gpu_kernels.apcm.layout`), copied to the device once.

The host keeps what is sequential by nature: online stream re-ordering
(:mod:`engine.algorithms.osr`, a BE-Tree insertion per buffered batch, the
batches over the host's cores).  The clusters' bookkeeping is made on the
device by CuPy's sorts and cumulative sums (:func:`cluster_entries`: per
cluster its compressed entries -- attribute, whether a member lacks it, the
members' distinct keys, ascending -- and the member entries whose slices
each one ORs).  Everything that touches bits runs on the device:

1. **Encoding** (:func:`build_encode_kernel`, one thread per event entry):
   a tabled attribute's slice *is* a row of its precomputed table, found by
   binary search of the value in the attribute's operands -- the entry gets
   a pointer to it, nothing is copied; the slices of evaluated attributes
   and the overflow slices are computed bit by bit into the batch's *store*
   with the shared device :func:`~gpu_kernels.predicates.entry_truth`.
2. **Compression** (:func:`build_or_kernel`, one thread per output word):
   each compressed entry's slice (main and overflow) is the OR of its
   members' slices, word by word -- a thread reads the members' words at
   one offset (the members are few, at most ``MAX_MEMBERS``) and writes
   its word of the store, so no two threads write one word.
3. **Traversal and leaf scans** (:func:`build_match_kernel`, **one block per
   cluster**; a cluster of one event is that event): the BE-Tree walked
   frontier by frontier as in :mod:`gpu_kernels.betree.cuda` -- a work queue
   of c-nodes in shared memory, each round a batch of up to one c-node per
   thread, one block-wide scan flattening the batch's leaf units and
   p-directory lookups -- but along *every* key of the compressed event.
   Each c-node is visited once without a per-c-node stamp: a cluster's keys
   on one attribute are distinct and ascending, so a bucket of depth ``d``
   on the path of key ``q`` is on the path of key ``q - 1`` too exactly
   when the two share their top ``d`` bits -- key ``q`` pushes only the
   buckets below its longest common prefix with its predecessor (the
   longest it shares with any earlier key).  Traversal unrolling (§V-B)
   is the frontier itself: a round's leaves are scanned by all the block's
   threads at once.  Each leaf unit is checked against the compressed event
   (a bit lookup per predicate; ``IS NULL`` TRUE where a member lacks the
   attribute), then -- for a cluster of several members -- against each
   member's own slices; hits are bits of the member's row of the chunk's
   result bit matrix, set with an atomic OR.  (The cpu twin checks a
   cluster's members together, through member masks cached per predicate:
   :func:`gpu_kernels.apcm.cpu.scan_cluster`.  Here a thread checks its
   unit's members one by one -- the block's threads already split the
   cluster's units, and a per-cluster cache of member masks would not fit
   in shared memory.)

Bits are read through the CPU's *pointers*: ``>= 0`` a word of the layout's
table, ``<= -2`` word ``-2 - p`` of the store, ``-1`` no slice.

**Variants.**  ``bitmap``, ``parallel``, ``pcm``, ``apcm``, ``reorder`` and
the cluster size change the clustering, which is the host's; every variant
runs these same kernels.  ``unroll=False`` (the base algorithm C, leaves
scanned during a depth-first walk) and ``parallel_paths`` (the walk split
over the cores by the root's p-nodes) are CPU notions: the block's frontier
already walks every path of a cluster at once.

**Frontier overflow.**  A cluster visits each c-node at most once, so its
frontier never holds more than the tree's c-nodes.  When the tree has more
c-nodes than the shared queue holds, the first pass runs without global
scratch: a cluster whose push finds the queue full is abandoned (its bits so
far are matches all the same) and flagged, and the caller runs the flagged
clusters again with a per-block spill region in global memory of one entry
per c-node -- never a silent drop.
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import numpy as np

from gpu_kernels import cuda_support
from gpu_kernels.apcm.layout import NULL_SLOT
from gpu_kernels.betree.cuda import MAX_SHARED_BYTES, QUEUE_CAPACITY, check_geometry, shared_bytes
from gpu_kernels.betree.layout import ATOMIC, N_CHILD, N_DEPTH, N_LEAF, N_LEAF_END, N_PDIR, N_PDIR_END, N_PREFIX
from gpu_kernels.opcodes import TRUE

cuda = None   # numba.cuda once a CUDA twin is built (a module global: see cuda_support)

#: a pointer to no slice (as :data:`gpu_kernels.apcm.cpu.NO_SLICE`)
NO_SLICE = -1

# slots of the match kernel's shared control words (as in gpu_kernels.betree.cuda)
_Q_N = 0        # entries in the shared queue
_SP_N = 1       # entries in the block's spill region
_OVER = 2       # a push found no room: the cluster is abandoned (flagged for the second pass)
_N_STATE = 3


class DeviceBitmap(NamedTuple):
    """The fields of :class:`~gpu_kernels.apcm.layout.BitmapLayout` the
    encoding and compression kernels read (``pred_slot`` is folded into the
    leaf arrays' ``v_slot`` on the host)."""

    main_bits: np.ndarray   # int64 [n_attrs]
    over_bits: np.ndarray   # int64 [n_attrs]
    bit_off: np.ndarray     # int64 [n_attrs + 1]
    bit_pred: np.ndarray    # int64
    obit_off: np.ndarray    # int64 [n_attrs + 1]
    obit_pred: np.ndarray   # int64
    tab_off: np.ndarray     # int64 [n_attrs]
    bound_off: np.ndarray   # int64 [n_attrs + 1]
    bounds: np.ndarray      # float64
    table: np.ndarray       # uint64


def device_bitmap(layout) -> DeviceBitmap:
    """The kernels' view of a host :class:`~gpu_kernels.apcm.layout.BitmapLayout` (host arrays)."""
    return DeviceBitmap(*(np.ascontiguousarray(getattr(layout, f)) for f in DeviceBitmap._fields))


class DeviceIndex(NamedTuple):
    """The subscription BE-Tree as the match kernel walks it: the CPU's node
    table (:class:`~gpu_kernels.betree.layout.NodeTable`, compressed child
    pointers), the p-nodes' attributes and the A-PCM leaf arrays of
    :class:`~engine.algorithms.apcm.APCMMatcher` (every predicate of a unit
    checked at the leaf, as a slot of the bitmap)."""

    node: np.ndarray        # int64 [n_c, 8]
    p_top: np.ndarray       # int64 [n_p]
    p_attr: np.ndarray      # int32 [n_p]
    l_head: np.ndarray      # int64 [n_l + 1, 2]: (subscription position, first leaf predicate)
    v_attr: np.ndarray      # int32 [n_v]
    v_slot: np.ndarray      # int32 [n_v]


def device_index(node, p_top, p_attr, l_head, v_attr, v_slot) -> DeviceIndex:
    """A :class:`DeviceIndex` of host arrays in the kernels' dtypes."""
    return DeviceIndex(np.ascontiguousarray(node, np.int64), np.ascontiguousarray(p_top, np.int64),
                       np.ascontiguousarray(p_attr, np.int32), np.ascontiguousarray(l_head, np.int64),
                       np.ascontiguousarray(v_attr, np.int32), np.ascontiguousarray(v_slot, np.int32))


# ------------------------------------------------------------ the clusters' bookkeeping
class ClusterEntries(NamedTuple):
    """A chunk's clusters as compressed events (device arrays, see
    :func:`cluster_entries`)."""

    ce_off: np.ndarray      # int64 [n_clusters + 1]: the compressed entries of each cluster
    ce_attr: np.ndarray     # int32 [n_ce], ascending within a cluster
    ce_absent: np.ndarray   # uint8 [n_ce]: some member lacks the attribute
    ce_key_off: np.ndarray  # int64 [n_ce + 1]: the members' distinct keys of each entry (CSR) ...
    ce_keys: np.ndarray     # uint64: ... ascending
    ce_src: np.ndarray      # int64 [n_ce]: a singleton's entry (its slices are the entry's), else -1
    ce_or: np.ndarray       # int64 [n_ce, 2]: word of the OR region holding its main / overflow OR, or -1
    mem_off: np.ndarray     # int64 [n_ce + 1]: the member entries of each entry of a cluster of several (CSR) ...
    mem_k: np.ndarray       # int64: ... entry indices
    job_ce: np.ndarray      # int64 [n_jobs]: the compressed entry of each OR
    job_kind: np.ndarray    # uint8 [n_jobs]: 0 its main slice, 1 its overflow slice
    job_word_off: np.ndarray  # int64 [n_jobs + 1]: each OR's words in the OR region (the region's size last)


def _stable_order(xp, values):
    """The stable sort order of ``values`` (CuPy's argsort is always stable;
    NumPy's only when asked)."""
    return xp.argsort(values, kind="stable")


def cluster_entries(cl_off, perm, ev_offsets, ev_attr, ev_key, main_bits, over_bits) -> ClusterEntries:
    """The compressed events of clusters ``perm[cl_off[c]:cl_off[c + 1]]``
    (one chunk: events ``ev_offsets``, their entries' attributes and keys;
    the layout's bits per attribute): per cluster its compressed entries --
    per attribute a member carries, ascending: whether a member lacks it,
    the members' distinct keys ascending, and for a cluster of several the
    member entries and the OR jobs that make its slices (as
    :func:`gpu_kernels.apcm.cpu.compress_clusters` does, bits aside); a
    singleton's entries are its own, one compressed entry each.

    Made on the device with CuPy's array operations (NumPy's under the
    simulator), from arrays on the host or the device: the chunk's entries
    in cluster order, stably sorted by attribute then key within a cluster
    of several, their runs found by comparing neighbours and numbered by
    cumulative sums -- nothing goes through the host but the sizes."""
    xp = cuda_support.array_module()
    i64 = np.int64
    cl_off, perm, ev_offsets, main_bits, over_bits = (
        xp.asarray(x).astype(i64, copy=False) for x in (cl_off, perm, ev_offsets, main_bits, over_bits))
    ev_attr = xp.asarray(ev_attr).astype(np.int32, copy=False)
    ev_key = xp.asarray(ev_key).astype(np.uint64, copy=False)
    n_cl = int(cl_off.shape[0]) - 1
    size = cl_off[1:] - cl_off[:-1]                              # members of each cluster
    # the entries in cluster order: each member's (``perm``'s order) entries in their own order
    member_len = (ev_offsets[1:] - ev_offsets[:-1])[perm]
    member_first = cuda_support.exclusive_cumsum(member_len)
    n = int(member_first[-1])
    at = xp.arange(n, dtype=i64)
    member = xp.searchsorted(member_first[1:], at, side="right")
    entry = ev_offsets[perm][member] + (at - member_first[member])
    cluster = xp.searchsorted(cl_off[1:], member, side="right")
    several = size[cluster] > 1
    # within a cluster of several, by attribute then key (stable sorts, the least significant first); a
    # singleton's entries stay in their order, each its own compressed entry
    attr, key = ev_attr[entry], ev_key[entry]
    order = _stable_order(xp, xp.where(several, key, xp.zeros(1, np.uint64)))
    order = order[_stable_order(xp, xp.where(several, attr, 0)[order])]
    order = order[_stable_order(xp, cluster[order])]
    entry, cluster, several, attr, key = entry[order], cluster[order], several[order], attr[order], key[order]
    # a compressed entry starts at each singleton's entry and at each new (cluster, attribute) run
    new_ce = xp.ones(n, dtype=bool)
    if n > 1:
        new_ce[1:] = ~several[1:] | (cluster[1:] != cluster[:-1]) | (attr[1:] != attr[:-1])
    starts = xp.flatnonzero(new_ce)
    n_ce = int(starts.shape[0])
    ends = xp.concatenate((starts[1:], xp.full(1, n, dtype=i64))) if n_ce else starts
    ce_cluster = cluster[starts]
    ce_several = several[starts]
    # (offsets by binary search of the ascending owners, not bincount: CuPy's refuses an empty input)
    ce_off = xp.searchsorted(ce_cluster, xp.arange(n_cl + 1, dtype=i64), side="left").astype(i64)
    ce_attr = attr[starts]
    ce_absent = (ce_several & (ends - starts < size[ce_cluster])).astype(np.uint8)
    ce_src = xp.where(ce_several, -1, entry[starts]).astype(i64)
    # the distinct keys of each compressed entry: a key differing from its predecessor in the run
    new_key = new_ce.copy()
    if n > 1:
        new_key[1:] |= key[1:] != key[:-1]
    ce_of = xp.cumsum(new_ce) - 1                              # each sorted entry's compressed entry
    ce_keys = key[new_key]
    ce_key_off = xp.searchsorted(ce_of[new_key], xp.arange(n_ce + 1, dtype=i64), side="left").astype(i64)
    # the members of a cluster of several's compressed entries, whose slices the ORs read
    mem_k = entry[several]
    mem_off = cuda_support.exclusive_cumsum(xp.where(ce_several, ends - starts, 0).astype(i64))
    # the OR jobs: main, then overflow, of each compressed entry of several members on an attribute of the layout
    n_attrs = int(main_bits.shape[0])      # (a device copy of none holds one 0: no jobs either way)
    indexed = ce_several & (ce_attr < n_attrs)
    a = xp.where(indexed, ce_attr, 0)
    bits = xp.stack((xp.where(indexed, main_bits[a], 0), xp.where(indexed, over_bits[a], 0)), axis=1)
    wanted = (bits > 0).reshape(-1)                            # (entry, kind) pairs, in job order
    jobs = xp.flatnonzero(wanted)
    job_ce = (jobs // 2).astype(i64)
    job_kind = (jobs % 2).astype(np.uint8)
    job_word_off = cuda_support.exclusive_cumsum((bits.reshape(-1)[jobs] + 63) >> 6)
    ce_or = xp.full(2 * n_ce, -1, dtype=i64)
    ce_or[jobs] = job_word_off[:-1]
    # (an empty array gets one padding element, as cuda_support.to_device gives it: no kernel argument is a
    # null pointer)
    ce_attr, ce_absent, ce_keys, ce_src, mem_k, job_ce, job_kind = (
        x if x.shape[0] else xp.zeros(1, dtype=x.dtype) for x in (ce_attr, ce_absent, ce_keys, ce_src, mem_k,
                                                                   job_ce, job_kind))
    return ClusterEntries(ce_off, ce_attr, ce_absent, ce_key_off, ce_keys, ce_src, ce_or.reshape(n_ce, 2),
                          mem_off, mem_k, job_ce, job_kind, job_word_off)


# -------------------------------------------------------------------- kernels
@functools.cache
def build_encode_kernel():
    """Stage 1: one thread per event entry (grid-stride).  Writes the entry's
    slice pointers ``e_main``/``e_over`` and its evaluated words to
    ``store[store_at[k]:]`` (zeroed by the caller; each entry owns its
    words, so no atomics)."""
    global cuda
    cuda = cuda_support.load_cuda()
    from gpu_kernels.predicates import cuda_device_functions
    entry_truth = cuda_device_functions().entry_truth

    def encode_kernel(ev_attr, ev_value, ev_token, store_at, bitmap, rows, pattern_truth, list_truth, e_main, e_over,
                      store):
        main_bits = bitmap.main_bits
        over_bits = bitmap.over_bits
        bit_off = bitmap.bit_off
        bit_pred = bitmap.bit_pred
        obit_off = bitmap.obit_off
        obit_pred = bitmap.obit_pred
        tab_off = bitmap.tab_off
        bound_off = bitmap.bound_off
        bounds = bitmap.bounds
        n_attrs = main_bits.shape[0]
        start = cuda.grid(1)
        for k in range(start, ev_attr.shape[0], cuda.gridsize(1)):
            a = ev_attr[k]
            e_main[k] = NO_SLICE
            e_over[k] = NO_SLICE
            if a >= n_attrs:    # an attribute no subscription mentions: no bits
                continue
            at = store_at[k]
            if main_bits[a] > 0:
                if tab_off[a] >= 0:
                    # the value's elementary interval: numpy's searchsorted (left) over the attribute's
                    # operands, then the point row when it hits one (NaN sorts last, as in numpy)
                    b0 = bound_off[a]
                    b1 = bound_off[a + 1]
                    x = ev_value[k]
                    lo = b0
                    hi = b1
                    if x != x:
                        lo = b1
                    while lo < hi:
                        mid = (lo + hi) >> 1
                        if bounds[mid] < x:
                            lo = mid + 1
                        else:
                            hi = mid
                    i = lo - b0
                    row = 2 * i + 1 if lo < b1 and bounds[lo] == x else 2 * i
                    e_main[k] = tab_off[a] + row * ((main_bits[a] + 63) >> 6)
                else:
                    for j in range(main_bits[a]):
                        p = bit_pred[bit_off[a] + j]
                        if p >= 0 and entry_truth(p, k, ev_value, ev_token, rows.op, rows.lo, rows.hi,
                                                  rows.set_offsets, rows.set_values, rows.aux,
                                                  pattern_truth, list_truth) == TRUE:
                            store[at + (j >> 6)] |= np.uint64(1) << np.uint64(j & 63)
                    e_main[k] = -2 - at
                    at += (main_bits[a] + 63) >> 6
            if over_bits[a] > 0:
                for j in range(over_bits[a]):
                    p = obit_pred[obit_off[a] + j]
                    if p >= 0 and entry_truth(p, k, ev_value, ev_token, rows.op, rows.lo, rows.hi,
                                              rows.set_offsets, rows.set_values, rows.aux, pattern_truth,
                                              list_truth) == TRUE:
                        store[at + (j >> 6)] |= np.uint64(1) << np.uint64(j & 63)
                e_over[k] = -2 - at

    return cuda.jit(encode_kernel)


@functools.cache
def build_or_kernel():
    """Stage 2: one thread per word of the OR region (grid-stride): its job
    (a binary search of the jobs' word offsets), then the OR of that word
    of every member's slice, written to ``store[or_base + word]``."""
    global cuda
    cuda = cuda_support.load_cuda()

    def or_kernel(n_words, or_base, job_word_off, job_ce, job_kind, mem_off, mem_k, e_main, e_over, table, store):
        n_jobs = job_ce.shape[0]
        start = cuda.grid(1)
        for g in range(start, n_words, cuda.gridsize(1)):
            # the job holding word g: the last j with job_word_off[j] <= g
            lo = 0
            hi = n_jobs
            while hi - lo > 1:
                mid = (lo + hi) >> 1
                if job_word_off[mid] <= g:
                    lo = mid
                else:
                    hi = mid
            w = g - job_word_off[lo]
            ce = job_ce[lo]
            over = job_kind[lo] != 0
            acc = np.uint64(0)
            for q in range(mem_off[ce], mem_off[ce + 1]):
                k = mem_k[q]
                ptr = e_over[k] if over else e_main[k]
                if ptr >= 0:
                    acc |= table[ptr + w]
                elif ptr != NO_SLICE:
                    acc |= store[-2 - ptr + w]
            store[or_base + g] = acc

    return cuda.jit(or_kernel)


def check_match_geometry(threads: int, queue_capacity: int) -> None:
    """ValueError unless blocks of ``threads`` threads with a frontier queue
    of ``queue_capacity`` c-nodes fit a block's shared memory (the match
    kernel's shared arrays are the BE-Tree kernel's)."""
    check_geometry(threads, queue_capacity)


@functools.cache
def build_match_kernel(threads: int, queue_capacity: int):
    """Stages 3 and 4 for blocks of ``threads`` threads (1 to 1024) with a
    shared frontier queue of ``queue_capacity`` c-nodes: one block per
    listed cluster (grid-stride)."""
    check_match_geometry(threads, queue_capacity)
    global cuda
    cuda = cuda_support.load_cuda()
    from gpu_kernels.predicates import cuda_device_functions
    find_attribute = cuda_device_functions().find_attribute
    n_threads = int(threads)
    n_queue = int(queue_capacity)

    def block_scan2(a, b, tid):
        """Inclusive prefix sums of rows ``a[0]`` and ``b[0]`` at once
        (Hillis-Steele, ping-pong between the two rows of each: one barrier
        a step); returns the row that holds them.  Every thread of the block
        calls it, after a barrier that follows the writes of ``a[0]``, ``b[0]``."""
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

    def slot_true(slot, p_main, p_over, table, store):
        """The predicate of bitmap ``slot`` (not IS NULL) on slices
        ``p_main``/``p_over`` (:func:`gpu_kernels.apcm.cpu.slot_true`)."""
        ptr = p_main
        bit = slot
        if slot < 0:
            ptr = p_over
            bit = -2 - slot
        if ptr == NO_SLICE:
            return False
        w = bit >> 6
        word = table[ptr + w] if ptr >= 0 else store[-2 - ptr + w]
        return (word >> np.uint64(bit & 63)) & np.uint64(1) != np.uint64(0)

    block_scan2 = cuda.jit(device=True)(block_scan2)
    slot_of = cuda.jit(device=True)(slot_of)
    slot_true = cuda.jit(device=True)(slot_true)

    def match_kernel(n_items, item_cluster, cl_off, perm, ev_offsets, ev_attr, e_main, e_over, ce_off, ce_attr,
                     ce_main, ce_over, ce_absent, ce_key_off, ce_keys, index, table, store, alive, spill, spill_cap,
                     overflow, bits):
        node = index.node
        p_top = index.p_top
        p_attr = index.p_attr
        l_head = index.l_head
        v_attr = index.v_attr
        v_slot = index.v_slot
        tid = cuda.threadIdx.x
        blk = cuda.blockIdx.x
        queue = cuda.shared.array(n_queue, np.int32)            # the frontier: c-nodes still to visit
        f_node = cuda.shared.array(n_threads, np.int32)         # this round's batch, one c-node per thread
        f_leaf = cuda.shared.array((2, n_threads), np.int64)    # scan of the batch's l-node sizes
        f_look = cuda.shared.array((2, n_threads), np.int64)    # scan of the batch's p-directory lookups
        state = cuda.shared.array(_N_STATE, np.int64)
        spill_base = blk * spill_cap
        for item in range(blk, n_items, cuda.gridDim.x):
            c = item_cluster[item]
            m0 = cl_off[c]
            n_m = cl_off[c + 1] - m0
            ce0 = ce_off[c]
            ce1 = ce_off[c + 1]
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
                cn = -1
                if tid < m:
                    cn = spill[spill_base + base + tid] if from_spill else queue[base + tid]
                    f_node[tid] = cn
                f_leaf[0, tid] = node[cn, N_LEAF_END] - node[cn, N_LEAF] if cn >= 0 else 0
                f_look[0, tid] = min(node[cn, N_PDIR_END] - node[cn, N_PDIR], ce1 - ce0) if cn >= 0 else 0
                cuda.syncthreads()
                if tid == 0:    # the batch leaves its source (the scan's barriers order this before any push)
                    state[_SP_N if from_spill else _Q_N] = base
                row = block_scan2(f_leaf, f_look, tid)
                # stage 4 on this round's leaves: their units over the block's threads
                total = f_leaf[row, n_threads - 1]
                for kq in range(tid, total, n_threads):
                    j = slot_of(f_leaf, row, kq)
                    i = node[f_node[j], N_LEAF] + kq - (f_leaf[row, j - 1] if j > 0 else 0)
                    pos = l_head[i, 0]
                    if alive[pos] == 0:
                        continue
                    word = pos >> 6
                    mask = np.uint64(1) << np.uint64(pos & 63)
                    if n_m == 1 and (bits[perm[m0], word] & mask) != np.uint64(0):
                        continue        # found already (another unit of a DNF subscription)
                    # the compressed event: a necessary condition for every member (ORed bits; IS NULL
                    # TRUE where a member lacks the attribute) -- for a singleton, the answer
                    ok = True
                    for v in range(l_head[i, 1], l_head[i + 1, 1]):
                        ce = find_attribute(ce_attr, ce0, ce1, v_attr[v])
                        slot = v_slot[v]
                        if slot == NULL_SLOT:
                            t = ce < 0 or ce_absent[ce] != 0
                        else:
                            t = ce >= 0 and slot_true(slot, ce_main[ce], ce_over[ce], table, store)
                        if not t:
                            ok = False
                            break
                    if not ok:
                        continue
                    if n_m == 1:
                        cuda.atomic.or_(bits, (perm[m0], word), mask)
                        continue
                    for mm in range(n_m):
                        e = perm[m0 + mm]
                        if (bits[e, word] & mask) != np.uint64(0):
                            continue
                        s0 = ev_offsets[e]
                        s1 = ev_offsets[e + 1]
                        hit = True
                        for v in range(l_head[i, 1], l_head[i + 1, 1]):
                            k = find_attribute(ev_attr, s0, s1, v_attr[v])
                            slot = v_slot[v]
                            if slot == NULL_SLOT:
                                t = k < 0
                            else:
                                t = k >= 0 and slot_true(slot, e_main[k], e_over[k], table, store)
                            if not t:
                                hit = False
                                break
                        if hit:
                            cuda.atomic.or_(bits, (e, word), mask)
                # stage 3: the batch's p-directory lookups (per c-node the smaller side looked up in
                # the other), then each p-node's clustering directory along every key of the entry
                total = f_look[row, n_threads - 1]
                for kq in range(tid, total, n_threads):
                    j = slot_of(f_look, row, kq)
                    q = kq - (f_look[row, j - 1] if j > 0 else 0)
                    cq = f_node[j]
                    k0 = node[cq, N_PDIR]
                    k1 = node[cq, N_PDIR_END]
                    if k1 - k0 <= ce1 - ce0:
                        k = k0 + q
                        ce = find_attribute(ce_attr, ce0, ce1, p_attr[k])
                        if ce < 0:
                            continue
                    else:
                        ce = ce0 + q
                        k = find_attribute(p_attr, k0, k1, ce_attr[ce])
                        if k < 0:
                            continue
                    q0 = ce_key_off[ce]
                    prev = np.uint64(0)
                    for kk in range(q0, ce_key_off[ce + 1]):
                        key = ce_keys[kk]
                        d = p_top[k]
                        while d >= 0:
                            depth = node[d, N_DEPTH]
                            if depth > 0 and (key >> np.uint64(64 - depth)) != np.uint64(node[d, N_PREFIX]):
                                break
                            # bucket d is on an earlier key's path too unless this key leaves the
                            # predecessor's within its top `depth` bits: visited once, by the first
                            new = kk == q0 or (depth > 0
                                               and ((key ^ prev) >> np.uint64(64 - depth)) != np.uint64(0))
                            if new and (node[d, N_LEAF] != node[d, N_LEAF_END]
                                        or node[d, N_PDIR] != node[d, N_PDIR_END]):
                                slot = cuda.atomic.add(state, _Q_N, 1)
                                if slot < n_queue:
                                    queue[slot] = d
                                else:
                                    s = cuda.atomic.add(state, _SP_N, 1)
                                    if s >= spill_cap:
                                        state[_OVER] = 1
                                        break
                                    spill[spill_base + s] = d
                            if depth >= ATOMIC:
                                break
                            d = node[d, N_CHILD + np.int64((key >> np.uint64(63 - depth)) & np.uint64(1))]
                        prev = key
                cuda.syncthreads()      # the pushes are done (and the scans read) before the next batch
                if state[_OVER] != 0:
                    break
            if tid == 0 and state[_OVER] != 0:
                overflow[item] = 1
            cuda.syncthreads()      # every thread is done with the control words before the next cluster

    return cuda.jit(match_kernel)


# ---------------------------------------------------------------- signatures
def _array(dtype, ndim=1):
    from numba import types
    from numba.np.numpy_support import from_dtype
    return types.Array(from_dtype(np.dtype(dtype)), ndim, "C")


def _rows_type():
    from numba import types

    from engine.algorithms.units import PredicateRows
    return types.NamedTuple([_array(dt) for dt in (np.int32, np.int8, np.float64, np.float64, np.int64, np.int64,
                                                   np.float64)], PredicateRows)


def encode_kernel_types() -> tuple:
    """The numba argument types of the encoding kernel (for ``cuda.compile_ptx`` without a GPU)."""
    from numba import types
    bitmap = types.NamedTuple([_array(np.uint64 if f == "table" else np.float64 if f == "bounds" else np.int64)
                               for f in DeviceBitmap._fields], DeviceBitmap)
    return (_array(np.int32), _array(np.float64), _array(np.int32), _array(np.int64), bitmap, _rows_type(),
            _array(np.uint8, 2), _array(np.int64), _array(np.int64), _array(np.int64), _array(np.uint64))


def or_kernel_types() -> tuple:
    """The numba argument types of the compression kernel."""
    from numba import types
    i64 = types.int64
    return (i64, i64, _array(np.int64), _array(np.int64), _array(np.uint8), _array(np.int64), _array(np.int64),
            _array(np.int64), _array(np.int64), _array(np.uint64), _array(np.uint64))


def match_kernel_types() -> tuple:
    """The numba argument types of the traversal and leaf-scan kernel."""
    from numba import types
    index = types.NamedTuple([_array(np.int64, 2), _array(np.int64), _array(np.int32), _array(np.int64, 2),
                              _array(np.int32), _array(np.int32)], DeviceIndex)
    i64 = types.int64
    return (i64, _array(np.int64), _array(np.int64), _array(np.int64), _array(np.int64), _array(np.int32),
            _array(np.int64), _array(np.int64), _array(np.int64), _array(np.int32), _array(np.int64),
            _array(np.int64), _array(np.uint8), _array(np.int64), _array(np.uint64), index, _array(np.uint64),
            _array(np.uint64), _array(np.uint8), _array(np.int32), i64, _array(np.uint8), _array(np.uint64, 2))


def kernel_types() -> dict:
    """Each kernel's builder call and argument types, by name: what the PTX
    compile check needs (no ``numba.cuda`` needed to make the types)."""
    return {"encode": encode_kernel_types(), "or": or_kernel_types(), "match": match_kernel_types()}


# -------------------------------------------------------------------- launches
def _grid(n: int, threads: int, max_blocks: int) -> int:
    return max(1, min(max_blocks, -(-n // threads)))


def encode_entries_cuda(threads: int, max_blocks: int, ev_attr, ev_value, ev_token, store_at, bitmap, rows,
                        pattern_truth, list_truth, e_main, e_over, store) -> None:
    """Launch stage 1 over the chunk's entries (see :func:`build_encode_kernel`)."""
    n = int(ev_attr.shape[0])
    if n == 0:
        return
    build_encode_kernel()[_grid(n, threads, max_blocks), int(threads)](
        ev_attr, ev_value, ev_token, store_at, bitmap, rows, pattern_truth, list_truth, e_main, e_over, store)


def or_slices_cuda(threads: int, max_blocks: int, n_words: int, or_base: int, job_word_off, job_ce, job_kind,
                   mem_off, mem_k, e_main, e_over, table, store) -> None:
    """Launch stage 2 over the ``n_words`` words of the OR region at ``store[or_base:]``."""
    if n_words == 0:
        return
    build_or_kernel()[_grid(n_words, threads, max_blocks), int(threads)](
        np.int64(n_words), np.int64(or_base), job_word_off, job_ce, job_kind, mem_off, mem_k, e_main, e_over,
        table, store)


def match_clusters_cuda(n_blocks: int, threads: int, queue_capacity: int, *args) -> None:
    """Launch stages 3 and 4 over ``n_blocks`` blocks of ``threads`` (grid-stride
    over the listed clusters); ``args`` as the kernel takes them."""
    kernel = build_match_kernel(int(threads), int(queue_capacity))
    kernel[int(n_blocks), int(threads)](*args)


__all__ = ["MAX_SHARED_BYTES", "NO_SLICE", "QUEUE_CAPACITY", "ClusterEntries", "DeviceBitmap", "DeviceIndex",
           "build_encode_kernel", "build_match_kernel", "build_or_kernel", "check_match_geometry",
           "cluster_entries", "device_bitmap", "device_index", "encode_entries_cuda", "encode_kernel_types",
           "kernel_types", "match_clusters_cuda", "match_kernel_types", "or_kernel_types", "or_slices_cuda",
           "shared_bytes"]
