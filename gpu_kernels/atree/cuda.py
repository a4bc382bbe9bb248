"""CUDA twin of A-Tree event matching (:mod:`gpu_kernels.atree.cpu`; Ji and
Jacobsen, SIGMOD 2021, §5, Algorithm 6 with §5.2's zero suppression and
propagation on demand) over the very arrays the host flattens
(:class:`~gpu_kernels.atree.layout.ATreeArrays`: nodes numbered by level,
so each level is one id range, and the leaves' predicate index
:class:`~gpu_kernels.atree.layout.LeafIndex`), copied to the device once.

The CPU kernel keeps, per event, stamped node results and one queue per
level.  On the device a chunk of events keeps, per (event, node):

* ``val`` -- int8, the node's three-valued result, **initialised to NULL**:
  an untouched node *is* NULL for an exact (``needs3``) reader and "not
  TRUE" for any other, exactly what the CPU's stale stamps mean, so no
  stamp and no clearing is needed;
* ``queued`` -- one bit (uint64 words): the node was reached by a
  propagating child (§5.2.1: TRUE, or TRUE/FALSE into an exact parent), set
  with an atomic OR.  The level's bits *are* the CPU's per-level queue: a
  thread takes a word of them and evaluates the set bits of its level.

Two kernels walk the levels bottom-up (Algorithm 6), one level per launch:

1. **Predicate matching** (:func:`build_kernels`' ``leaf_kernel``; 2-D grid,
   y along events, x along an attribute's l-nodes): the cpu kernel's step
   1 over the device twin of the predicate index
   (:class:`~gpu_kernels.atree.layout.LeafIndex`).  Per attribute the
   event carries, its *keyed* l-nodes (non-exact ``=``, ``IN``, ``<``,
   ``<=``, ``>``, ``>=``, ``BETWEEN``) are located by binary search --
   the cpu's own ``_first_not_below``/``_first_above`` compiled as device
   functions, the same runs of keys and comparisons, the threads then
   striding over the run -- and only the TRUE ones touched; its other
   l-nodes (``scan_leaf``), and every l-node of the *absent list* (``IS
   NULL``; ``IS NOT NULL`` below XOR/XNOR) whose attribute the event
   lacks, are evaluated with the shared device
   :func:`~gpu_kernels.predicates.entry_truth` -- the one definition of a
   predicate's semantics.  TRUE ones set their subscriptions' result bits,
   and each propagates (sets its parents' ``queued`` bits); an untouched
   keyed l-node stays NULL, "not TRUE" to its readers (none is exact).
2. **Expression matching** (``level_kernel``, one launch per level 2, 3,
   ...; y along events, x along the level's ``queued`` words): each queued
   node is evaluated from its children's ``val`` (all on lower levels, so
   final), then finishes and propagates as a leaf does.  A non-exact AND is
   linked from its access child only (propagation on demand, §5.2.2) and
   reads its other children's results when reached.

A node's parents lie on higher levels, so a launch only ever sets bits its
own level does not read: the launch boundary is the only synchronisation.
A word straddling two levels is read by both launches, each keeping its
own level's bits (those are final when its launch starts).

``kernel="persistent"`` (``persistent_kernel``) runs the same steps in one
launch: **one block per event** (grid-stride over the chunk), its threads
striding over the event's l-nodes, then over each level's words in turn,
with a block barrier between levels instead of a launch.  Fewer launches
(one instead of one per level) against one block per event however few
nodes it reaches.  Which wins is **not measured yet**: neither mode has run
on a GPU (only under numba's simulator, and compiled to PTX); measuring
waits for a GPU session (``bexmatch bench --backend cuda --algorithm
atree``, with ``--option atree.kernel=persistent`` for the other mode).  The default, ``levels``, is what
the issue asked for first.

Results are bits of the chunk's ``[events, positions]`` bit matrix, set
with an atomic OR (r-nodes of one word may be TRUE in different threads);
:mod:`gpu_kernels.compaction` turns it into (event, position) pairs,
ascending in both -- the CPU matcher's exact output.
"""

from __future__ import annotations

import functools

import numpy as np

from gpu_kernels import cuda_support
from gpu_kernels.atree.cpu import BETWEEN_KEYS, N_CLASSES, _first_above, _first_not_below, make_key_run
from gpu_kernels.opcodes import AND, FALSE, NULL, OR, TRUE, XOR

cuda = None   # numba.cuda once a CUDA twin is built (a module global: see cuda_support)

#: the kernel modes: one level per launch (default), or one launch, a block per event
KERNELS = ("levels", "persistent")


@functools.cache
def build_kernels():
    """``(leaf_kernel, level_kernel, persistent_kernel)``, compiled on first
    use (importing this module never touches CUDA).  The leaf index's
    binary searches are the cpu kernel's (their plain-Python bodies,
    ``py_func``, compiled here as device functions)."""
    global cuda
    cuda = cuda_support.load_cuda()
    from gpu_kernels.predicates import cuda_device_functions
    device = cuda_device_functions()
    entry_truth = device.entry_truth
    find_attribute = device.find_attribute

    def settle(e, node, v, val, queued, bits, alive, par_off, par_idx, needs3, sub_off, sub_pos):
        """Node ``node`` of event ``e`` is ``v``: record it, report its
        subscriptions when TRUE, and propagate (the CPU's ``_finish`` and
        ``_propagate``): TRUE to every linked parent, FALSE to exact ones."""
        val[e, node] = v
        if v == NULL:
            return
        if v == TRUE:
            for k in range(sub_off[node], sub_off[node + 1]):
                pos = sub_pos[k]
                if alive[pos] != 0:
                    cuda.atomic.or_(bits, (e, pos >> 6), np.uint64(1) << np.uint64(pos & 63))
        for k in range(par_off[node], par_off[node + 1]):
            p = par_idx[k]
            if v == TRUE or needs3[p] != 0:
                word = p >> 6
                mask = np.uint64(1) << np.uint64(p & 63)
                if (queued[e, word] & mask) == 0:          # (reached before: no atomic needed)
                    cuda.atomic.or_(queued, (e, word), mask)

    def evaluate(e, node, kind, needs3, child_off, child_idx, val):
        """The CPU's ``_evaluate`` over this event's row of ``val`` (an
        untouched child reads NULL: the row starts NULL)."""
        op = kind[node]
        c0 = child_off[node]
        c1 = child_off[node + 1]
        if needs3[node] == 0:
            # TRUE is all that counts here; an OR is only reached by a TRUE child
            if op == OR:
                return TRUE
            for k in range(c0, c1):
                if val[e, child_idx[k]] != TRUE:
                    return FALSE
            return TRUE
        if op == AND or op == OR:
            decisive = FALSE if op == AND else TRUE
            result = TRUE if op == AND else FALSE
            for k in range(c0, c1):
                v = val[e, child_idx[k]]
                if v == decisive:
                    return decisive
                if v == NULL:
                    result = NULL
            return result
        va = val[e, child_idx[c0]]
        vb = val[e, child_idx[c0 + 1]]
        if va == NULL or vb == NULL:
            return NULL
        if op == XOR:
            return TRUE if va != vb else FALSE
        return TRUE if va == vb else FALSE

    settle = cuda.jit(device=True)(settle)
    evaluate = cuda.jit(device=True)(evaluate)

    first_not_below = cuda.jit(device=True)(_first_not_below.py_func)
    first_above = cuda.jit(device=True)(_first_above.py_func)
    key_run = cuda.jit(device=True)(make_key_run(first_not_below, first_above))

    def keyed(e, x, sx, g, v, key_off, key, key_hi, key_reach, key_leaf, key_quiet, val, queued, bits, alive,
              par_off, par_idx, needs3, sub_off, sub_pos):
        """The TRUE keyed leaves of group ``g`` (attribute ``g // N_CLASSES``,
        key class ``g % N_CLASSES``) on value ``v`` (not NaN), by threads
        ``x, x + sx, ...``: the cpu's ``_keyed_leaves`` -- the same binary
        searches (the very functions), the same comparisons.  Each thread
        finds the run, then takes every ``sx``-th key of it."""
        c = g % N_CLASSES
        k0 = key_off[g]
        k1 = key_off[g + 1]
        if k0 == k1:
            return
        a, b = key_run(c, k0, k1, key, key_reach, v)     # the cpu kernel's very run (make_key_run)
        for k in range(a + x, b, sx):
            if c == BETWEEN_KEYS and not v <= key_hi[k]:
                continue
            leaf = key_leaf[k]
            if key_quiet[k] != 0:                    # no r-node, no parent: TRUE is a value to it
                val[e, leaf] = TRUE
            elif val[e, leaf] != TRUE:               # finished once per event (the cpu's stamp check)
                settle(e, leaf, TRUE, val, queued, bits, alive, par_off, par_idx, needs3, sub_off, sub_pos)

    keyed = cuda.jit(device=True)(keyed)

    def leaves(e, x, sx, ev_offsets, ev_attr, ev_value, ev_token, pattern_truth, list_truth, alive, scan_off,
               scan_leaf, key_off, key, key_hi, key_reach, key_leaf, key_quiet, absent_leaf, leaf_pred, par_off,
               par_idx, needs3, sub_off, sub_pos, pred_attr, pred_op, pred_lo, pred_hi, set_offsets, set_values,
               pred_aux, val, queued, bits):
        """Predicate matching of event ``e`` by threads ``x, x + sx, ...``
        (the cpu's step 1): per attribute of the event, its keyed leaves
        located in the predicate index (only the TRUE ones touched) and its
        other leaves evaluated one by one; then the absent list's."""
        n_attr = scan_off.shape[0] - 1
        s0 = ev_offsets[e]
        s1 = ev_offsets[e + 1]
        for at in range(s0, s1):
            a = ev_attr[at]
            if a < 0 or a >= n_attr:
                continue                                     # no l-node on this attribute
            value = ev_value[at]
            if value == value:                   # NaN: no comparison holds, no keyed leaf is TRUE
                for g in range(a * N_CLASSES, (a + 1) * N_CLASSES):
                    keyed(e, x, sx, g, value, key_off, key, key_hi, key_reach, key_leaf, key_quiet, val, queued,
                          bits, alive, par_off, par_idx, needs3, sub_off, sub_pos)
            for k in range(scan_off[a] + x, scan_off[a + 1], sx):
                leaf = scan_leaf[k]
                v = entry_truth(leaf_pred[leaf], at, ev_value, ev_token, pred_op, pred_lo, pred_hi, set_offsets,
                                set_values, pred_aux, pattern_truth, list_truth)
                settle(e, leaf, v, val, queued, bits, alive, par_off, par_idx, needs3, sub_off, sub_pos)
        for k in range(x, absent_leaf.shape[0], sx):
            leaf = absent_leaf[k]
            pid = leaf_pred[leaf]
            if find_attribute(ev_attr, s0, s1, pred_attr[pid]) >= 0:
                continue                                     # present: evaluated above
            v = entry_truth(pid, -1, ev_value, ev_token, pred_op, pred_lo, pred_hi, set_offsets, set_values,
                            pred_aux, pattern_truth, list_truth)
            settle(e, leaf, v, val, queued, bits, alive, par_off, par_idx, needs3, sub_off, sub_pos)

    def level(e, x, sx, n0, n1, kind, child_off, child_idx, par_off, par_idx, needs3, sub_off, sub_pos, alive,
              val, queued, bits):
        """Expression matching of event ``e``'s queued nodes in ``[n0, n1)``
        (one level) by threads ``x, x + sx, ...``, a word of bits each."""
        for w in range((n0 >> 6) + x, ((n1 - 1) >> 6) + 1, sx):
            word = queued[e, w]
            while word != 0:
                low = word & (~word + np.uint64(1))
                word ^= low
                node = w * 64 + cuda.popc(low - np.uint64(1))
                if node < n0 or node >= n1:
                    continue                                 # another level's bit of a shared word
                v = evaluate(e, node, kind, needs3, child_off, child_idx, val)
                settle(e, node, v, val, queued, bits, alive, par_off, par_idx, needs3, sub_off, sub_pos)

    leaves = cuda.jit(device=True)(leaves)
    level = cuda.jit(device=True)(level)

    def leaf_kernel(n_rows, ev_offsets, ev_attr, ev_value, ev_token, pattern_truth, list_truth, alive, scan_off,
                    scan_leaf, key_off, key, key_hi, key_reach, key_leaf, key_quiet, absent_leaf, leaf_pred, par_off,
                    par_idx, needs3, sub_off, sub_pos, pred_attr, pred_op, pred_lo, pred_hi, set_offsets, set_values,
                    pred_aux, val, queued, bits):
        x, y = cuda.grid(2)
        sx, sy = cuda.gridsize(2)
        for e in range(y, n_rows, sy):
            leaves(e, x, sx, ev_offsets, ev_attr, ev_value, ev_token, pattern_truth, list_truth, alive, scan_off,
                   scan_leaf, key_off, key, key_hi, key_reach, key_leaf, key_quiet, absent_leaf, leaf_pred, par_off,
                   par_idx, needs3, sub_off, sub_pos, pred_attr, pred_op, pred_lo, pred_hi, set_offsets, set_values,
                   pred_aux, val, queued, bits)

    def level_kernel(n_rows, n0, n1, kind, child_off, child_idx, par_off, par_idx, needs3, sub_off, sub_pos, alive,
                     val, queued, bits):
        x, y = cuda.grid(2)
        sx, sy = cuda.gridsize(2)
        for e in range(y, n_rows, sy):
            level(e, x, sx, n0, n1, kind, child_off, child_idx, par_off, par_idx, needs3, sub_off, sub_pos, alive,
                  val, queued, bits)

    def persistent_kernel(n_rows, ev_offsets, ev_attr, ev_value, ev_token, pattern_truth, list_truth, alive, kind,
                          level_start, child_off, child_idx, par_off, par_idx, needs3, scan_off, scan_leaf, key_off,
                          key, key_hi, key_reach, key_leaf, key_quiet, absent_leaf, leaf_pred, sub_off, sub_pos,
                          pred_attr, pred_op, pred_lo, pred_hi, set_offsets, set_values, pred_aux, val, queued, bits):
        x = cuda.threadIdx.x
        sx = cuda.blockDim.x
        n_levels = level_start.shape[0] - 1
        # e and the level loop are the same for every thread of a block: the barriers are reached by all
        for e in range(cuda.blockIdx.x, n_rows, cuda.gridDim.x):
            leaves(e, x, sx, ev_offsets, ev_attr, ev_value, ev_token, pattern_truth, list_truth, alive, scan_off,
                   scan_leaf, key_off, key, key_hi, key_reach, key_leaf, key_quiet, absent_leaf, leaf_pred, par_off,
                   par_idx, needs3, sub_off, sub_pos, pred_attr, pred_op, pred_lo, pred_hi, set_offsets, set_values,
                   pred_aux, val, queued, bits)
            cuda.syncthreads()
            for lv in range(2, n_levels):
                n0 = level_start[lv]
                n1 = level_start[lv + 1]
                if n1 > n0:
                    level(e, x, sx, n0, n1, kind, child_off, child_idx, par_off, par_idx, needs3, sub_off, sub_pos,
                          alive, val, queued, bits)
                cuda.syncthreads()     # the level's results and its pushes are seen by the next level's threads

    return cuda.jit(leaf_kernel), cuda.jit(level_kernel), cuda.jit(persistent_kernel)


def kernel_types() -> dict:
    """The numba argument types of the three kernels over the device twins
    as :mod:`engine.algorithms.atree_cuda` makes them: what
    ``cuda.compile_ptx`` needs to compile them without a GPU.  Needs no
    ``numba.cuda``."""
    from numba import types
    from numba.np.numpy_support import from_dtype

    def array(dtype, ndim=1):
        return types.Array(from_dtype(np.dtype(dtype)), ndim, "C")

    i64 = types.int64
    events = (array(np.int64), array(np.int32), array(np.float64), array(np.int32), array(np.uint8, 2),
              array(np.int64), array(np.uint8))
    preds = (array(np.int32), array(np.int8), array(np.float64), array(np.float64), array(np.int64),
             array(np.float64), array(np.int64))
    state = (array(np.int8, 2), array(np.uint64, 2), array(np.uint64, 2))
    i32, u8, f64 = array(np.int32), array(np.uint8), array(np.float64)
    offs = array(np.int64)
    # the LeafIndex twin: scan_off, scan_leaf, key_off, key, key_hi, key_reach, key_leaf, key_quiet
    index = (offs, i32, offs, f64, f64, f64, i32, u8)
    return {
        "leaf": (i64, *events, *index, i32, i32, offs, i32, u8, offs, i32, *preds, *state),
        "level": (i64, i64, i64, array(np.int8), offs, i32, offs, i32, u8, offs, i32, u8, *state),
        "persistent": (i64, *events, array(np.int8), offs, offs, i32, offs, i32, u8, *index, i32, i32, offs, i32,
                       *preds, *state),
    }


def match_chunk_cuda(mode: str, launch, threads: int, blocks: int, n_rows: int, events, tree, index, level_start,
                     leaf_width: int, preds, alive, val, queued, bits) -> None:
    """Match a chunk of ``n_rows`` events (device arrays throughout).

    ``events``: ``(ev_offsets, ev_attr, ev_value, ev_token, pattern_truth, list_truth)``,
    event ``e``'s entries ``ev_offsets[e]:ev_offsets[e + 1]``; ``tree``: the
    device :class:`~gpu_kernels.atree.layout.ATreeArrays` (``attr_off``
    and ``attr_leaf`` unread), its ``level_start`` also given on the host
    (the launches' bounds); ``index``: the device
    :class:`~gpu_kernels.atree.layout.LeafIndex`; ``leaf_width`` the most
    leaves one attribute's scan list, one key group (or the absent list)
    has; ``preds``: the predicate table (``attr, op, lo, hi, set_offsets,
    set_values, aux``); ``val`` (int8, all NULL), ``queued`` and ``bits``
    (uint64, zero) the chunk's state and result rows.  ``mode``
    ``"levels"``: one launch for the l-nodes and one per level, over
    ``launch``'s 2-D grid; ``"persistent"``: one launch of ``blocks``
    blocks of ``threads``."""
    leaf_kernel, level_kernel, persistent_kernel = build_kernels()
    ev_offsets, ev_attr, ev_value, ev_token, truth, list_truth = events
    common = (ev_offsets, ev_attr, ev_value, ev_token, truth, list_truth, alive)
    n = np.int64(n_rows)
    if mode == "persistent":
        persistent_kernel[int(blocks), int(threads)](
            n, *common, tree.kind, tree.level_start, tree.child_off, tree.child_idx, tree.par_off, tree.par_idx,
            tree.needs3, *index, tree.absent_leaf, tree.leaf_pred, tree.sub_off, tree.sub_pos, *preds, val, queued,
            bits)
        return
    grid, block = launch.grid(max(1, int(leaf_width)), n_rows)
    leaf_kernel[grid, block](n, *common, *index, tree.absent_leaf, tree.leaf_pred, tree.par_off, tree.par_idx,
                             tree.needs3, tree.sub_off, tree.sub_pos, *preds, val, queued, bits)
    for lv in range(2, len(level_start) - 1):
        n0, n1 = int(level_start[lv]), int(level_start[lv + 1])
        if n1 <= n0:
            continue
        # x along the level's words of queued bits
        grid, block = launch.grid(((n1 - 1) >> 6) - (n0 >> 6) + 1, n_rows)
        level_kernel[grid, block](n, np.int64(n0), np.int64(n1), tree.kind, tree.child_off, tree.child_idx,
                                  tree.par_off, tree.par_idx, tree.needs3, tree.sub_off, tree.sub_pos, alive, val,
                                  queued, bits)


__all__ = ["KERNELS", "build_kernels", "kernel_types", "match_chunk_cuda"]
