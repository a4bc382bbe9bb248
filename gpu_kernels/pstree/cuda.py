"""CUDA twin of PS-Tree matching (:mod:`gpu_kernels.pstree.cpu`; Ji and Jacobsen, PVLDB 12(3) 2018,
§4-§6) over the very structures the CPU build makes: the device twins of
:class:`~gpu_kernels.pstree.layout.SpaceTable`,
:class:`~gpu_kernels.pstree.layout.BloomArrays`,
:class:`~gpu_kernels.pstree.layout.HashArrays` and the extended predicate
rows (:class:`~engine.algorithms.units.PredicateRows`), handed whole to the
kernels.  The binary search, the Bloom and key hashes are compiled from
the same Python sources as the CPU's (:mod:`gpu_kernels.pstree.layout`),
predicate semantics from :func:`gpu_kernels.predicates.entry_truth`'s.

The CPU kernels give each core a range of events and, per event, fill an
attribute -> entry table and a private result bitmap.  Here:

* **locating** (Algorithm 3, MatchPair): one thread per attribute entry of
  the chunk -- a binary search over its attribute's boundaries, one read of
  ``elem_space`` -- writes the entry's global space id (-1: no PS-Tree);
* **PSTBloom** (Algorithm 5): **one block per event** (grid-stride over the
  chunk's events); for each of the event's located pairs the block's
  threads stride over the space's subscription list (lines 5-6), each
  testing its unit's other indexable predicates against the signatures of
  the spaces the event's values lie in (lines 7-13: the attribute found by
  binary search in the event's sorted attribute ids,
  :func:`~gpu_kernels.predicates.find_attribute`, in place of the CPU's
  table), then verifying the survivor exactly (line 15);
* **PSTHash** (Algorithm 7): one block per event; for each arity ``r`` some
  unit has, the block's threads stride over the C(k, r) combinations of the
  event's ``k`` located spaces -- each thread *unranks* its combination
  (combinatorial number system: no enumeration state shared between
  threads), hashes the N-dim key, probes the open-addressing table and
  verifies the units of the key found;
* the units without an indexable predicate (the *always* lists) are
  verified by the block's threads after the lists, per event.

A unit found true sets its subscription's bit in the event's row of the
chunk's bit matrix with an atomic OR, which also de-duplicates (a DNF
subscription found through two units, one unit through two lists); a
thread skips a subscription whose bit is set already or that is not
alive.  The bit matrix is compacted by :mod:`gpu_kernels.compaction` into
the CPU matcher's exact output.
"""

from __future__ import annotations

import functools
from types import SimpleNamespace

import numpy as np

from gpu_kernels import cuda_support
from gpu_kernels.opcodes import TRUE
from gpu_kernels.pstree import layout as L

cuda = None   # numba.cuda once the CUDA twin is built (a module global: see cuda_support)


def _wrapping(fn):
    """``fn`` with NumPy's overflow warnings off (simulator only: the
    hashes wrap around 64 bits on purpose)."""
    @functools.wraps(fn)
    def quiet(*args):
        with np.errstate(over="ignore"):
            return fn(*args)
    return quiet


def binomial_py(n, m):
    """C(n, m) (0 when ``m > n``); exact: after step ``i`` the product is
    C(n - m + i, i)."""
    if m < 0 or m > n:
        return np.int64(0)
    c = np.int64(1)
    for i in range(1, m + 1):
        c = c * (n - m + i) // i
    return c


@functools.cache
def device_functions() -> SimpleNamespace:
    """The device functions the kernels share: the layout's search and
    hashes, and the verification of a unit (the CPU's ``unit_true`` and
    ``decided_by_space``, the event's attributes found by binary search)."""
    global cuda
    cuda = cuda_support.load_cuda()
    from gpu_kernels.predicates import cuda_device_functions
    shared = cuda_device_functions()
    find = shared.find_attribute
    entry_truth = shared.entry_truth
    hashes = (L.bloom_key_py, L.bloom_probe_py, L.key_hash_py)
    if cuda_support.simulated():
        hashes = tuple(_wrapping(fn) for fn in hashes)
    device = functools.partial(cuda.jit, device=True)

    def unit_true(u, skip0, skip1, unit_off, pids, s0, s1, ev_attr, ev_value, ev_token, rows, pattern_truth,
                  list_truth):
        """Whether every predicate of unit ``u`` is TRUE on the event of
        entries ``[s0, s1)``, the positions ``skip0``/``skip1`` of ``pids``
        excepted (access predicates decided by their space)."""
        for j in range(unit_off[u], unit_off[u + 1]):
            if j == skip0 or j == skip1:
                continue
            r = pids[j]
            at = find(ev_attr, s0, s1, rows.attr[r])
            if entry_truth(r, at, ev_value, ev_token, rows.op, rows.lo, rows.hi, rows.set_offsets, rows.set_values,
                           rows.aux, pattern_truth, list_truth) != TRUE:
                return False
        return True

    def decided_by_space(j, pids, rows, s0, s1, ev_attr, ev_value):
        """``j`` when access predicate ``pids[j]`` needs no evaluation (its
        space holds the event's value), -1 otherwise: for a NaN (placed in
        the leftmost space, which predicates FALSE on it may cover) or no
        access predicate."""
        if j < 0:
            return np.int64(-1)
        at = find(ev_attr, s0, s1, rows.attr[pids[j]])
        if at < 0:
            return np.int64(-1)
        x = ev_value[at]
        return j if x == x else np.int64(-1)

    unit_true = device(unit_true)

    def always_candidates(e, always, n_always, tid, n_threads, unit_sub, alive, bits, unit_off, pids, s0, s1,
                          ev_attr, ev_value, ev_token, rows, pattern_truth, list_truth):
        """Event ``e``'s check of the units without an indexable predicate
        (candidates for every event), a thread each (both kernels' last
        step)."""
        for k in range(tid, n_always, n_threads):
            u = always[k]
            pos = unit_sub[u]
            word = pos >> 6
            mask = np.uint64(1) << np.uint64(pos & 63)
            if alive[pos] == 0 or (bits[e, word] & mask) != 0:
                continue
            if unit_true(u, -1, -1, unit_off, pids, s0, s1, ev_attr, ev_value, ev_token, rows, pattern_truth,
                         list_truth):
                cuda.atomic.or_(bits, (e, word), mask)

    return SimpleNamespace(find=find, elementary=device(L.elementary_py), bloom_key=device(hashes[0]),
                           bloom_probe=device(hashes[1]), key_hash=device(hashes[2]),
                           binomial=device(binomial_py), unit_true=unit_true,
                           decided_by_space=device(decided_by_space), always_candidates=device(always_candidates))


# ------------------------------------------------------------------ locating
@functools.cache
def build_locate_kernel():
    """Algorithm 3 for every attribute entry ``base + i`` (``i < n``) of a
    chunk: its global space id into ``ev_space[i]`` (-1 when its attribute
    has no PS-Tree)."""
    f = device_functions()
    elementary = f.elementary

    def locate_kernel(n, base, ev_attr, ev_value, spaces, ev_space):
        val_off = spaces.val_off
        vals = spaces.vals
        elem_space = spaces.elem_space
        n_attrs = val_off.shape[0] - 1
        x, y = cuda.grid(2)
        sx, sy = cuda.gridsize(2)
        for i in range(y * sx + x, n, sx * sy):
            at = base + i
            a = ev_attr[at]
            g = np.int64(-1)
            if a < n_attrs:
                v0 = val_off[a]
                v1 = val_off[a + 1]
                g = elem_space[2 * v0 + a + elementary(vals, v0, v1, ev_value[at])]
            ev_space[i] = g

    return cuda.jit(locate_kernel)


def locate_spaces_cuda(n: int, base: int, ev_attr, ev_value, spaces, ev_space, *, launch=None) -> None:
    """Launch the locating kernel over ``n`` attribute entries from ``base``."""
    if n == 0:
        return
    grid, block = (launch or cuda_support.default_launch()).grid(n, 1)
    build_locate_kernel()[grid, block](np.int64(n), np.int64(base), ev_attr, ev_value, spaces, ev_space)


# ------------------------------------------------------------------ PSTBloom
@functools.cache
def build_pstbloom_kernel():
    """Algorithm 5, one block per event (see the module docstring)."""
    f = device_functions()
    find = f.find
    bloom_key = f.bloom_key
    bloom_probe = f.bloom_probe
    unit_true = f.unit_true
    always_candidates = f.always_candidates

    def pstbloom_kernel(n_events, ev_offsets, ev_attr, ev_value, ev_token, ev_space, space_base, pattern_truth,
                        list_truth, unit_sub, unit_off, pids, rows, bloom, n_hashes, n_always, alive, bits):
        list_off = bloom.list_off
        list_units = bloom.units
        sig_off = bloom.sig_off
        sig = bloom.sig
        access = bloom.access
        indexable = bloom.indexable
        tid = cuda.threadIdx.x
        n_threads = cuda.blockDim.x
        for e in range(cuda.blockIdx.x, n_events, cuda.gridDim.x):
            s0 = ev_offsets[e]
            s1 = ev_offsets[e + 1]
            for at in range(s0, s1):
                g = ev_space[at - space_base]
                if g < 0:
                    continue
                x = ev_value[at]
                # lines 5-6: the subscription list of the pair's leaf, a unit per thread
                for i in range(list_off[g] + tid, list_off[g + 1], n_threads):
                    u = list_units[i]
                    pos = unit_sub[u]
                    word = pos >> 6
                    mask = np.uint64(1) << np.uint64(pos & 63)
                    if alive[pos] == 0 or (bits[e, word] & mask) != 0:
                        continue
                    # lines 7-13: each other indexable predicate's leaf signature must hold the unit
                    acc = access[u]
                    h1, h2 = bloom_key(bloom.key[u])
                    keep = True
                    for j in range(unit_off[u], unit_off[u + 1]):
                        r = pids[j]
                        if j == acc or indexable[r] == 0:
                            continue
                        at2 = find(ev_attr, s0, s1, rows.attr[r])
                        if at2 < 0:         # absent: the predicate is NULL, the unit cannot be TRUE
                            keep = False
                            break
                        g2 = ev_space[at2 - space_base]
                        if g2 < 0 or not bloom_probe(sig, sig_off[g2], sig_off[g2 + 1], h1, h2, n_hashes):
                            keep = False
                            break
                    if not keep:
                        continue
                    # line 15: the exact check, the access predicate decided by its space (this pair's)
                    skip = acc if x == x else np.int64(-1)
                    if unit_true(u, skip, -1, unit_off, pids, s0, s1, ev_attr, ev_value, ev_token, rows,
                                 pattern_truth, list_truth):
                        cuda.atomic.or_(bits, (e, word), mask)
            always_candidates(e, bloom.always, n_always, tid, n_threads, unit_sub, alive, bits, unit_off, pids, s0, s1,
                              ev_attr, ev_value, ev_token, rows, pattern_truth, list_truth)

    return cuda.jit(pstbloom_kernel)


# ------------------------------------------------------------------ PSTHash
@functools.cache
def build_psthash_kernel():
    """Algorithm 7, one block per event (see the module docstring)."""
    f = device_functions()
    key_hash = f.key_hash
    binomial = f.binomial
    unit_true = f.unit_true
    decided_by_space = f.decided_by_space
    always_candidates = f.always_candidates
    n_key = L.MAX_ACCESS

    def psthash_kernel(n_events, ev_offsets, ev_attr, ev_value, ev_token, loc_off, loc, pattern_truth, list_truth,
                       unit_sub, unit_off, pids, rows, table, n_always, alive, bits):
        slot_group = table.slot_group
        group_key = table.group_key
        group_off = table.group_off
        group_units = table.units
        access = table.access
        arities = table.arities
        width = group_key.shape[1]
        slot_mask = slot_group.shape[0] - 1       # a power of two of slots
        key = cuda.local.array((1, n_key), np.int64)
        idx = cuda.local.array(n_key, np.int64)
        tid = cuda.threadIdx.x
        n_threads = cuda.blockDim.x
        for e in range(cuda.blockIdx.x, n_events, cuda.gridDim.x):
            s0 = ev_offsets[e]
            s1 = ev_offsets[e + 1]
            k0 = loc_off[e]
            k = loc_off[e + 1] - k0           # the event's located spaces, ascending: loc[k0:k0 + k]
            for r in range(1, width + 1):
                if arities[r] == 0 or r > k:
                    continue
                for c in range(tid, binomial(k, r), n_threads):
                    # combination c of r of the k spaces, in lexicographic order (Lemma 2's keys)
                    rest = c
                    x = np.int64(0)
                    for q in range(r):
                        while True:
                            b = binomial(k - x - 1, r - q - 1)
                            if rest < b:
                                break
                            rest -= b
                            x += 1
                        idx[q] = x
                        x += 1
                    for q in range(width):
                        key[0, q] = loc[k0 + idx[q]] if q < r else np.int64(-1)
                    s = np.int64(key_hash(key, 0, width) & np.uint64(slot_mask))
                    while slot_group[s] >= 0:
                        grp = slot_group[s]
                        same = True
                        for q in range(width):
                            if group_key[grp, q] != key[0, q]:
                                same = False
                                break
                        if same:
                            for i in range(group_off[grp], group_off[grp + 1]):
                                u = group_units[i]
                                pos = unit_sub[u]
                                word = pos >> 6
                                mask = np.uint64(1) << np.uint64(pos & 63)
                                if alive[pos] == 0 or (bits[e, word] & mask) != 0:
                                    continue
                                skip0 = decided_by_space(access[u, 0], pids, rows, s0, s1, ev_attr, ev_value)
                                skip1 = np.int64(-1)
                                if width > 1:
                                    skip1 = decided_by_space(access[u, 1], pids, rows, s0, s1, ev_attr, ev_value)
                                if unit_true(u, skip0, skip1, unit_off, pids, s0, s1, ev_attr, ev_value, ev_token,
                                             rows, pattern_truth, list_truth):
                                    cuda.atomic.or_(bits, (e, word), mask)
                            break
                        s = (s + 1) & slot_mask
            always_candidates(e, table.always, n_always, tid, n_threads, unit_sub, alive, bits, unit_off, pids, s0, s1,
                              ev_attr, ev_value, ev_token, rows, pattern_truth, list_truth)

    return cuda.jit(psthash_kernel)


def pstbloom_kernel_cuda(n_blocks: int, threads: int, *args) -> None:
    """Launch the PSTBloom kernel over ``n_blocks`` blocks of ``threads``
    (grid-stride over the chunk's events); ``args`` as the kernel takes them."""
    build_pstbloom_kernel()[int(n_blocks), int(threads)](*args)


def psthash_kernel_cuda(n_blocks: int, threads: int, *args) -> None:
    """Launch the PSTHash kernel (as :func:`pstbloom_kernel_cuda`)."""
    build_psthash_kernel()[int(n_blocks), int(threads)](*args)


def kernel_types() -> dict:
    """The numba argument types of the three kernels (device twins of the
    structures as :mod:`engine.algorithms.pstree` makes them): what
    ``cuda.compile_ptx`` needs to compile them without a GPU.  Needs no
    ``numba.cuda``."""
    from numba import types
    from numba.np.numpy_support import from_dtype

    from engine.algorithms.units import PredicateRows

    def array(dtype, ndim=1):
        return types.Array(from_dtype(np.dtype(dtype)), ndim, "C")

    i64 = types.int64
    spaces = types.NamedTuple([array(np.int64), array(np.float64), array(np.int64), array(np.int64)], L.SpaceTable)
    rows = types.NamedTuple([array(dtype) for dtype in (np.int32, np.int8, np.float64, np.float64, np.int64,
                                                        np.int64, np.float64)], PredicateRows)
    bloom = types.NamedTuple([array(np.int64), array(np.int32), array(np.int64), array(np.uint64), array(np.int64),
                              array(np.int32), array(np.uint8), array(np.int64)], L.BloomArrays)
    table = types.NamedTuple([array(np.int32), array(np.int32, 2), array(np.int32), array(np.int32),
                              array(np.int64, 2), array(np.uint8), array(np.int32)], L.HashArrays)
    events = (array(np.int64), array(np.int32), array(np.float64), array(np.int32))
    units = (array(np.int64), array(np.int64), array(np.int64), rows)
    return {"locate": (i64, i64, array(np.int32), array(np.float64), spaces, array(np.int64)),
            "pstbloom": (i64, *events, array(np.int64), i64, array(np.uint8, 2), array(np.int64), *units, bloom, i64,
                         i64, array(np.uint8), array(np.uint64, 2)),
            "psthash": (i64, *events, array(np.int64), array(np.int64), array(np.uint8, 2), array(np.int64), *units,
                        table, i64, array(np.uint8), array(np.uint64, 2))}


__all__ = ["binomial_py", "build_locate_kernel", "build_pstbloom_kernel", "build_psthash_kernel", "device_functions",
           "kernel_types", "locate_spaces_cuda", "pstbloom_kernel_cuda", "psthash_kernel_cuda"]
