"""CUDA twin of OpIndex matching (:mod:`gpu_kernels.opindex.cpu`, Algorithm 2
of Zhang, Chan, Tan, PVLDB 2014) over the very structure the CPU build makes: the device twin
of its :class:`~gpu_kernels.opindex.layout.OpIndexArrays`
(:func:`gpu_kernels.opindex.layout.to_device`), handed whole to the kernel.

The CPU kernel gives each thread a range of events and walks, per event,
the pivot partitions the event carries (Lemma 1) with private counters.  A
GPU thread cannot hold a partition's counters, so the unit of GPU work is
one **(event, pivot partition)** pair -- a *work item* -- handled by one
thread block:

1. **Counters** ``V_{A_p}`` (and the CNF clause bits) live in the block's
   shared memory when the partition's fit (dynamic shared memory sized to
   the widest such partition), else in the block's slice of a scratch
   matrix in global memory; the block's threads initialise them.  The
   caller launches the two kinds of items separately.
2. **Range scans and signature tests, in parallel.**  Each of the event's
   attributes meets each of the partition's eight operator lists: a *unit*.
   Per round, every thread takes half a unit (a unit yields at most two
   entry ranges: ``!=`` is everything but the ``=`` run): segment directory,
   the segment's w-bit signature (Example 3), the attribute's run, then the
   two binary searches of §4.2 -- exactly the CPU's ranges.
3. **Counting, load-balanced.**  A block-wide inclusive scan (Hillis-Steele
   in shared memory) of the range lengths flattens them, and the block's
   threads stride over the flattened entries: each decrements its entry's
   counter with an atomic subtraction (a CNF clause's first satisfied
   predicate -- an atomic max on its clause bit -- decrements the copy's
   counter once).  VERIFY and PREFIX entries are first decided exactly
   (``predicate_truth``; prefix interval end and pattern result).
4. **Results.**  The thread whose decrement takes a counter to 0 checks the
   conjunction's IS NULL tests and ``alive``, and sets the subscription's
   bit in the event's row of a bit matrix (atomic OR).  The bit matrix
   de-duplicates (a DNF subscription found through two conjunctions, a CNF
   subscription through two pivots) and orders: its compaction
   (:mod:`gpu_kernels.compaction`) gives pairs ascending by event then
   position -- the CPU matcher's exact output.

Subscriptions no event attribute can find (``always_pos``) are one more
work item per event whose threads run their postfix programs
(:func:`gpu_kernels.scan.make_run_program`).

**Counting: atomics, or sort-and-segment.**  The kernel is built in one of
three modes (a compile-time constant, so each is its own machine code):

- ``"atomic"`` -- steps 1-4 above: the default, chosen by measurement
  (BENCHMARKS.md, "CUDA backend (issue 4)": a sort moves every satisfied
  entry through global memory several times, an atomic touches one
  shared-memory word);
- ``"count"`` and ``"emit"`` -- the two passes of the *sort-and-segment*
  count: ``count`` only runs the range scans and writes each item's number
  of entries; ``emit`` writes, at the item's offset, one int64 key per
  entry -- ``item * key_stride + counter`` (``counter_width + slot`` for a
  CNF clause; -1 for a VERIFY/PREFIX entry whose exact test fails).  The
  keys are then sorted and segmented on the device
  (:func:`sort_and_segment`): a counter whose run of keys is as long as
  its initial value is satisfied (a clause's repeated keys collapse to one
  decrement first), and :func:`finish_kernel` applies the IS NULL tests and
  ``alive`` and sets the result bits.  Every hit of a counter comes from
  the one item of its (event, partition), so groups of items can be sorted
  independently -- the keys of one group at a time fit device memory.
"""

from __future__ import annotations

import functools

import numba
import numpy as np

from gpu_kernels import cuda_support
from gpu_kernels.opcodes import FIRST_LIST_OP, IN, LAST_LIST_OP, LIKE, NOT_IN, NOT_MATCHES, TRUE
from gpu_kernels.opindex.layout import DTYPES, PROGRAM_DTYPES, OpIndexArrays, Programs, attr_bit_py, eq_bit_py
from gpu_kernels.predicates import cuda_device_functions
from gpu_kernels.scan import cuda_run_program

cuda = None   # numba.cuda once the CUDA twin is built (a module global: see cuda_support)


def make_list_ranges(find, attr_bit_fn, eq_bit_fn):
    """The entry ranges of one list for one event attribute (§4.2): the
    segment directory and signature test, the attribute's run, then
    ``[lo0, hi0)`` and ``[lo1, hi1)`` of the entries whose predicate the
    value satisfies (``=``: the run of equal operands; ``!=``: the run's
    entries before and after it; comparisons: a prefix or suffix of the
    run; VERIFY: the whole run; PREFIX: the intervals starting at or below
    the value).  Same ranges as the CPU kernel's inline code."""

    def list_ranges(l, op, attr, vq, list_shift, list_bucket_base, bucket_run_start, bucket_sig, sig_bits,
                    use_sig, run_attr, run_start, ent_val):
        none = np.int64(0)
        shift = list_shift[l]
        if shift < 0:
            return none, none, none, none
        bucket = list_bucket_base[l] + (attr >> shift)
        if use_sig:
            bit = eq_bit_fn(attr, vq, sig_bits) if op == 0 else attr_bit_fn(attr, sig_bits)
            if ((bucket_sig[bucket] >> np.uint64(bit)) & np.uint64(1)) == 0:
                return none, none, none, none
        r = find(run_attr, bucket_run_start[bucket], bucket_run_start[bucket + 1], attr)
        if r < 0:
            return none, none, none, none
        a = np.int64(run_start[r])
        b = np.int64(run_start[r + 1])
        lower = a
        upper = b
        if op != 2 and op != 5 and op != 7:      # first operand >= v
            lo = a
            n = b - a
            while n > 0:
                half = n >> 1
                if ent_val[lo + half] < vq:
                    lo = lo + half + 1
                    n = n - half - 1
                else:
                    n = half
            lower = lo
        if op == 0 or op == 1 or op == 2 or op == 5 or op == 7:     # first operand > v
            lo = lower
            n = b - lower
            while n > 0:
                half = n >> 1
                if ent_val[lo + half] <= vq:
                    lo = lo + half + 1
                    n = n - half - 1
                else:
                    n = half
            upper = lo
        lo0 = a
        hi0 = b
        lo1 = b
        if op == 0:      # operand == v
            lo0 = lower
            hi0 = upper
        elif op == 1:    # operand != v
            hi0 = lower
            lo1 = upper
        elif op == 2:    # v < operand
            lo0 = upper
        elif op == 3:    # v <= operand
            lo0 = lower
        elif op == 4:    # v > operand
            hi0 = lower
        elif op == 5 or op == 7:     # v >= operand; PREFIX: interval starts at or below v
            hi0 = upper
        return lo0, hi0, lo1, b

    return list_ranges


def _wrapping(fn):
    """``fn`` with NumPy's overflow warnings off (simulator only)."""
    @functools.wraps(fn)
    def quiet(*args):
        with np.errstate(over="ignore"):
            return fn(*args)
    return quiet


#: the kernel's counting modes (see the module docstring)
MODES = ("atomic", "count", "emit")


@functools.cache
def _result_bit():
    """The device function that ends a satisfied conjunction (its counter
    reached 0), for both counting strategies: its IS NULL tests (none of
    their attributes in the event), ``alive``, then the subscription's bit
    in the event's row (an atomic OR: several threads write one word)."""
    global cuda
    cuda = cuda_support.load_cuda()
    find = cuda_device_functions().find_attribute

    def result_bit(c, e, ev_start, ev_stop, ev_attr, counter_post_start, post_attr, counter_sub, alive, bits):
        if counter_post_start.shape[0] > 1:        # some conjunction has IS NULL tests
            for q in range(counter_post_start[c], counter_post_start[c + 1]):
                if find(ev_attr, ev_start, ev_stop, post_attr[q]) >= 0:
                    return
        pos = counter_sub[c]
        if alive[pos] != 0:
            cuda.atomic.or_(bits, (e, pos >> 6), np.uint64(1) << np.uint64(pos & 63))

    return cuda.jit(device=True)(result_bit)


@functools.cache
def build_opindex_kernel_cuda(threads: int, stack_depth: int, mode: str = "atomic"):
    """The raw OpIndex kernel for blocks of ``threads`` threads (a power of
    two >= 2), a ``stack_depth``-slot stack for the always-checked
    programs, counting in ``mode`` (one of :data:`MODES`)."""
    if threads < 2 or threads & (threads - 1):
        raise ValueError(f"the OpIndex kernel needs a power-of-two block of at least 2 threads, not {threads}")
    if mode not in MODES:
        raise ValueError(f"the OpIndex kernel's counting mode is one of {MODES}, not {mode!r}")
    global cuda
    cuda = cuda_support.load_cuda()
    device = cuda_device_functions()
    find = device.find_attribute
    truth = device.predicate_truth
    list_hit = device.list_hit
    list_key = device.list_key
    run = cuda_run_program()
    hashes = (attr_bit_py, eq_bit_py)
    if cuda_support.simulated():     # plain Python there: NumPy warns where uint64 hashing wraps around on purpose
        hashes = tuple(_wrapping(fn) for fn in hashes)
    ranges = cuda.jit(device=True)(make_list_ranges(find, cuda.jit(device=True)(hashes[0]),
                                                    cuda.jit(device=True)(hashes[1])))
    result_bit = _result_bit()
    n_threads = int(threads)
    depth = int(stack_depth)
    atomic = mode == "atomic"     # constants of the closure: numba compiles the other modes' code away
    emit = mode == "emit"
    scans_only = mode == "count"

    def kernel(n_items, item_event, item_part, ev_offsets, ev_attr, ev_value, ev_token, pattern_truth, list_truth,
               index, programs, alive, scratch, counter_width, block_width, in_shared, bits, item_hits, item_first,
               keys, key_stride):
        # the structure's arrays (``index``: OpIndexArrays; ``programs``: the segment's Programs)
        n_attrs = index.pivot_of_attr.shape[0]
        part_counter_start = index.part_counter_start
        part_slot_start = index.part_slot_start
        list_shift = index.list_shift
        list_bucket_base = index.list_bucket_base
        list_side_base = index.list_side_base
        bucket_run_start = index.bucket_run_start
        bucket_sig = index.bucket_sig
        sig_bits = index.sig_bits
        use_sig = index.use_sig
        run_attr = index.run_attr
        run_start = index.run_start
        ent_val = index.ent_val
        vals = index.vals
        use_rank = index.use_rank
        ent_target = index.ent_target
        side_pid = index.side_pid
        side_hi = index.side_hi
        counter_init = index.counter_init
        counter_sub = index.counter_sub
        counter_post_start = index.counter_post_start
        post_attr = index.post_attr
        slot_counter = index.slot_counter
        x_op = index.x_op
        x_lo = index.x_lo
        x_hi = index.x_hi
        x_set_start = index.x_set_start
        x_set_stop = index.x_set_stop
        set_values = index.set_values
        x_aux = index.x_aux
        always_pos = index.always_pos
        prog_offsets = programs.prog_offsets
        prog_kind = programs.prog_kind
        prog_arg = programs.prog_arg
        p_attr = programs.p_attr
        p_op = programs.p_op
        p_lo = programs.p_lo
        p_hi = programs.p_hi
        p_set_offsets = programs.p_set_offsets
        p_set_values = programs.p_set_values
        p_aux = programs.p_aux
        tid = cuda.threadIdx.x
        blk = cuda.blockIdx.x
        # counters at [0, counter_width) of the block's scratch, clause bits after them
        shared = cuda.shared.array(0, numba.int32)     # (a numba type: the simulator needs one here)
        if in_shared:
            area = shared
            c_off = 0
        else:
            area = scratch
            c_off = blk * block_width
        s_off = c_off + counter_width
        r_begin = cuda.shared.array(n_threads, np.int64)   # a range's first entry
        r_incl = cuda.shared.array(n_threads, np.int64)    # inclusive scan of the range lengths
        stack = cuda.local.array(depth, np.int8)
        half_block = n_threads >> 1
        for item in range(blk, n_items, cuda.gridDim.x):
            e = item_event[item]
            p = item_part[item]
            ev_start = ev_offsets[e]
            ev_stop = ev_offsets[e + 1]
            if p < 0:
                # the always-checked subscriptions: their programs, one per thread
                for k in range(tid, always_pos.shape[0], n_threads):
                    pos = always_pos[k]
                    if alive[pos] != 0:
                        if run(prog_offsets[pos], prog_offsets[pos + 1], prog_kind, prog_arg, ev_start, ev_stop,
                               ev_attr, ev_value, ev_token, p_attr, p_op, p_lo, p_hi, p_set_offsets,
                               p_set_values, p_aux, pattern_truth, list_truth, stack) == TRUE:
                            cuda.atomic.or_(bits, (e, pos >> 6), np.uint64(1) << np.uint64(pos & 63))
                continue
            c_base = part_counter_start[p]
            s_base = part_slot_start[p]
            if atomic:
                for c in range(tid, part_counter_start[p + 1] - c_base, n_threads):     # initialise V_{A_p}
                    area[c_off + c] = counter_init[c_base + c]
                for c in range(tid, part_slot_start[p + 1] - s_base, n_threads):
                    area[s_off + c] = 0
            emitted = np.int64(0)     # sort-and-segment: the item's entries of earlier rounds
            key_base = np.int64(0)
            if emit:
                key_base = item_first[item]
            n_units = (ev_stop - ev_start) * 8
            for u0 in range(0, n_units, half_block):
                # range scans: thread tid takes half tid & 1 of unit u0 + tid / 2
                u = u0 + (tid >> 1)
                begin = np.int64(0)
                length = np.int64(0)
                if u < n_units:
                    i = ev_start + (u >> 3)
                    op = u & 7
                    attr = ev_attr[i]
                    if attr < n_attrs:
                        v = ev_value[i]
                        vq = v       # the value in the lists' operand domain (2 * rank [+ 1])
                        if use_rank:
                            lo = 0
                            n = vals.shape[0]
                            while n > 0:
                                half = n >> 1
                                if vals[lo + half] < v:
                                    lo = lo + half + 1
                                    n = n - half - 1
                                else:
                                    n = half
                            vq = 2.0 * lo + (1.0 if lo < vals.shape[0] and vals[lo] == v else 0.0)
                        lo0, hi0, lo1, hi1 = ranges(p * 8 + op, op, attr, vq, list_shift, list_bucket_base,
                                                    bucket_run_start, bucket_sig, sig_bits, use_sig, run_attr,
                                                    run_start, ent_val)
                        if tid & 1 == 0:
                            begin = lo0
                            length = hi0 - lo0
                        else:
                            begin = lo1
                            length = hi1 - lo1
                r_begin[tid] = begin
                r_incl[tid] = length
                cuda.syncthreads()
                d = 1
                while d < n_threads:     # Hillis-Steele inclusive scan
                    add = r_incl[tid - d] if tid >= d else np.int64(0)
                    cuda.syncthreads()
                    r_incl[tid] += add
                    cuda.syncthreads()
                    d *= 2
                total = r_incl[n_threads - 1]
                if scans_only:
                    emitted += total
                    cuda.syncthreads()      # the shared ranges are rewritten by the next round
                    continue
                for k in range(tid, total, n_threads):
                    # the range holding flattened entry k: first j with r_incl[j] > k
                    lo = 0
                    n = n_threads
                    while n > 0:
                        half = n >> 1
                        if r_incl[lo + half] <= k:
                            lo = lo + half + 1
                            n = n - half - 1
                        else:
                            n = half
                    j = lo
                    before = r_incl[j - 1] if j > 0 else np.int64(0)
                    ent = r_begin[j] + (k - before)
                    unit = u0 + (j >> 1)
                    i = ev_start + (unit >> 3)
                    op = unit & 7
                    if op >= 6:
                        side = list_side_base[p * 8 + op]
                        pid = side_pid[ent + side]
                        v = ev_value[i]
                        if op == 6:      # VERIFY: exact three-valued test on the present value
                            if emit:
                                keys[key_base + emitted + k] = -1
                            pop = x_op[pid]
                            hit = False
                            if pop >= LIKE and pop <= NOT_MATCHES:
                                hit = pattern_truth[ev_token[i], x_aux[pid]] != 0
                            elif pop >= FIRST_LIST_OP and pop <= LAST_LIST_OP:    # the event list's row
                                hit = list_hit(list_truth, ev_token[i], list_key(pop, x_aux[pid]))
                            s0 = np.int64(0)
                            s1 = np.int64(0)
                            if pop == IN or pop == NOT_IN:
                                s0 = x_set_start[pid]
                                s1 = x_set_stop[pid]
                            if truth(pop, x_lo[pid], x_hi[pid], set_values, s0, s1, hit, True, v) != TRUE:
                                continue
                        else:            # PREFIX: interval end, then the exact pattern result
                            if emit:
                                keys[key_base + emitted + k] = -1
                            if side_hi[ent + side] < v or pattern_truth[ev_token[i], x_aux[pid]] == 0:
                                continue
                    t = np.int64(ent_target[ent])
                    if emit:             # the entry's counter, or its clause after every counter
                        keys[key_base + emitted + k] = item * key_stride + (t if t >= 0 else counter_width - 1 - t)
                        continue
                    if t < 0:            # a CNF clause: its bit, once
                        slot = -1 - t
                        if cuda.atomic.max(area, s_off + slot, 1) != 0:
                            continue
                        t = slot_counter[s_base + slot] - c_base
                    if cuda.atomic.sub(area, c_off + t, 1) != 1:
                        continue
                    # this decrement took the counter to 0
                    result_bit(c_base + t, e, ev_start, ev_stop, ev_attr, counter_post_start, post_attr,
                               counter_sub, alive, bits)
                emitted += total
                cuda.syncthreads()      # the shared ranges are rewritten by the next round
            if scans_only and tid == 0:
                item_hits[item] = emitted

    return cuda.jit(kernel)


def kernel_types(ent_val=np.uint16, ent_target=np.int16, counter_init=np.int8) -> tuple:
    """The numba argument types of the OpIndex kernel for an index with
    these entry and counter dtypes (the rest as the builder makes them when
    positions and predicate rows fit 32 bits): what ``cuda.compile_ptx``
    needs to compile it without a GPU.  Needs no ``numba.cuda``."""
    from numba import types
    from numba.np.numpy_support import from_dtype

    def array(dtype, ndim=1):
        return types.Array(from_dtype(np.dtype(dtype)), ndim, "C")

    picked = {"ent_val": ent_val, "ent_target": ent_target, "counter_init": counter_init, "counter_sub": np.int32,
              "side_pid": np.int32}
    index = types.NamedTuple([array(picked.get(name, DTYPES[name][0])) for name in OpIndexArrays._fields
                              if name in DTYPES] + [types.int64, types.boolean, types.boolean], OpIndexArrays)
    programs = types.NamedTuple([array(dtype) for dtype in PROGRAM_DTYPES] + [types.int64], Programs)
    i64 = types.int64
    return (i64, array(np.int64), array(np.int32), array(np.int64), array(np.int32), array(np.float64), array(np.int32),
            array(np.uint8, 2), array(np.int64), index, programs, array(np.uint8), array(np.int32), i64, i64,
            types.boolean, array(np.uint64, 2), array(np.int64), array(np.int64), array(np.int64), i64)


def opindex_kernel_cuda(n_blocks: int, threads: int, stack_depth: int, shared_bytes: int, *args,
                        mode: str = "atomic"):
    """Launch the OpIndex kernel over ``n_blocks`` blocks of ``threads``
    (grid-stride over the work items) with ``shared_bytes`` of dynamic
    shared memory; ``args`` as the kernel takes them."""
    kernel = build_opindex_kernel_cuda(int(threads), int(stack_depth), mode)
    kernel[int(n_blocks), int(threads), 0, int(shared_bytes)](*args)


# ------------------------------------------------------- sort-and-segment
def sort_and_segment(keys, key_stride: int, counter_width: int, item_part, part_counter_start, part_slot_start,
                     slot_counter, counter_init):
    """The satisfied counters of a group of work items from the ``emit``
    pass's keys (device arrays; CuPy's radix sort on a GPU): ``(item,
    global counter)`` of every counter whose run of keys is exactly as
    long as its initial value.  A CNF clause's keys collapse to one key of
    the clause's counter first (a clause counts once, however many of its
    predicates hold)."""
    xp = cuda_support.array_module()
    keys = xp.sort(keys[keys >= 0])
    first = xp.ones(keys.shape[0], dtype=np.bool_)
    if keys.shape[0] > 1:
        first[1:] = keys[1:] != keys[:-1]
    is_slot = keys % key_stride >= counter_width
    if bool(is_slot.any()):
        clauses = keys[is_slot & first]
        item = clauses // key_stride
        part = item_part[item]
        slot = clauses - item * key_stride - counter_width
        local = slot_counter[part_slot_start[part] + slot] - part_counter_start[part]
        keys = xp.sort(xp.concatenate((keys[~is_slot], item * key_stride + local)))
        first = xp.ones(keys.shape[0], dtype=np.bool_)
        if keys.shape[0] > 1:
            first[1:] = keys[1:] != keys[:-1]
    starts = xp.flatnonzero(first)
    lengths = xp.diff(xp.concatenate((starts, xp.full(1, keys.shape[0], dtype=starts.dtype))))
    run_keys = keys[starts]
    item = run_keys // key_stride
    counter = part_counter_start[item_part[item]] + (run_keys - item * key_stride)
    done = lengths == counter_init[counter]
    return item[done], counter[done]


@functools.cache
def _finish_kernel():
    global cuda
    cuda = cuda_support.load_cuda()
    result_bit = _result_bit()

    def finish_kernel(n, sat_event, sat_counter, ev_offsets, ev_attr, counter_post_start, post_attr, counter_sub,
                      alive, bits):
        x, y = cuda.grid(2)
        sx, sy = cuda.gridsize(2)
        for k in range(y * sx + x, n, sx * sy):
            e = sat_event[k]
            result_bit(sat_counter[k], e, ev_offsets[e], ev_offsets[e + 1], ev_attr, counter_post_start, post_attr,
                       counter_sub, alive, bits)

    return cuda.jit(finish_kernel)


def finish_cuda(sat_event, sat_counter, ev_offsets, ev_attr, counter_post_start, post_attr, counter_sub, alive,
                bits, *, launch=None):
    """Result bits of the satisfied counters (``sat_event``, ``sat_counter``:
    device int64): their IS NULL tests, ``alive``, an atomic OR."""
    n = int(sat_event.shape[0])
    if n == 0:
        return
    grid, block = (launch or cuda_support.default_launch()).grid(n, 1)
    _finish_kernel()[grid, block](np.int64(n), sat_event, sat_counter, ev_offsets, ev_attr, counter_post_start,
                                  post_attr, counter_sub, alive, bits)
