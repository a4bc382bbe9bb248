"""``scan``: every subscription's postfix program against every event.

The baseline every other matcher is measured against (docs/papers.md#scan-the-baseline): no
index, each program evaluated in full under three-valued logic.  The CPU
kernel splits (event, block of subscriptions) tasks over all cores with
``prange`` so that a single event is parallel too.
"""

from __future__ import annotations

import functools

import numpy as np
from numba import njit, prange

from gpu_kernels import cuda_support
from gpu_kernels.opcodes import AND, FALSE, LEAF, NULL, OR, TRUE, XOR
from gpu_kernels.predicates import cuda_device_functions, entry_truth, find_attribute

#: subscriptions per parallel task: large enough to amortise the task, small
#: enough to balance one event over all cores
SUBSCRIPTION_BLOCK = 256


def make_run_program(find, entry_truth):
    """Evaluate one postfix program for one event; shared by the CPU and CUDA
    kernels (``find``/``entry_truth`` are the target's compiled helpers)."""

    def run_program(start, stop, prog_kind, prog_arg, ev_start, ev_stop, ev_attr, ev_value, ev_token,
                    pred_attr, pred_op, pred_lo, pred_hi, set_offsets, set_values, pred_aux,
                    pattern_truth, list_truth, stack):
        top = 0
        for pc in range(start, stop):
            kind = prog_kind[pc]
            arg = prog_arg[pc]
            if kind == LEAF:
                pos = find(ev_attr, ev_start, ev_stop, pred_attr[arg])
                stack[top] = entry_truth(arg, pos, ev_value, ev_token, pred_op, pred_lo, pred_hi, set_offsets,
                                         set_values, pred_aux, pattern_truth, list_truth)
                top += 1
            elif kind == AND or kind == OR:
                # Kleene: AND is FALSE if any FALSE, else NULL if any NULL;
                # OR is TRUE if any TRUE, else NULL if any NULL
                decisive = FALSE if kind == AND else TRUE
                result = TRUE if kind == AND else FALSE
                for i in range(top - arg, top):
                    if stack[i] == decisive:
                        result = decisive
                        break
                    if stack[i] == NULL:
                        result = NULL
                top -= arg
                stack[top] = result
                top += 1
            else:
                right = stack[top - 1]
                left = stack[top - 2]
                top -= 1
                if left == NULL or right == NULL:
                    stack[top - 1] = NULL
                elif kind == XOR:
                    stack[top - 1] = TRUE if left != right else FALSE
                else:  # XNOR
                    stack[top - 1] = TRUE if left == right else FALSE
        return stack[0]

    return run_program


run_program = njit(inline="always", nogil=True)(make_run_program(find_attribute, entry_truth))


@njit(parallel=True, nogil=True, cache=True)
def scan_kernel(event_start, n_chunk, ev_offsets, ev_attr, ev_value, ev_token,
                prog_offsets, prog_kind, prog_arg, alive,
                pred_attr, pred_op, pred_lo, pred_hi, set_offsets, set_values, pred_aux,
                pattern_truth, list_truth, max_depth, out):
    """``out[e, s] = 1`` iff subscription ``s`` is alive and TRUE on event
    ``event_start + e``, for ``e < n_chunk``."""
    n_subs = len(prog_offsets) - 1
    n_blocks = (n_subs + SUBSCRIPTION_BLOCK - 1) // SUBSCRIPTION_BLOCK
    for task in prange(n_chunk * n_blocks):
        e = task // n_blocks
        first = (task % n_blocks) * SUBSCRIPTION_BLOCK
        last = min(first + SUBSCRIPTION_BLOCK, n_subs)
        event = event_start + e
        ev_start = ev_offsets[event]
        ev_stop = ev_offsets[event + 1]
        stack = np.empty(max(max_depth, 1), dtype=np.int8)
        for s in range(first, last):
            hit = 0
            if alive[s]:
                truth = run_program(prog_offsets[s], prog_offsets[s + 1], prog_kind, prog_arg,
                                    ev_start, ev_stop, ev_attr, ev_value, ev_token,
                                    pred_attr, pred_op, pred_lo, pred_hi, set_offsets, set_values,
                                    pred_aux, pattern_truth, list_truth, stack)
                hit = 1 if truth == TRUE else 0
            out[e, s] = hit


# ---------------------------------------------------------------- CUDA twin
#: operand-stack sizes of the CUDA scan kernel: a per-thread
#: ``cuda.local.array`` needs a compile-time size, so one kernel is built
#: (on demand) per tier and a segment runs on the smallest tier that holds
#: its deepest program.  Depth = the widest n-ary AND/OR plus nesting, so
#: the tiers cover AND-only subscriptions of up to MAX_STACK_DEPTH predicates.
STACK_DEPTH_TIERS = (64, 256, 1024)
MAX_STACK_DEPTH = STACK_DEPTH_TIERS[-1]

cuda = None   # numba.cuda once the CUDA twin is built (a module global: see cuda_support)


def cuda_stack_depth(max_depth: int) -> int:
    """The stack tier for programs needing ``max_depth`` slots; ValueError
    past :data:`MAX_STACK_DEPTH` (read at call time, so tests may lower it)."""
    limit = MAX_STACK_DEPTH
    if max_depth > limit:
        raise ValueError(f"a program needs an operand stack of {max_depth} entries; the CUDA scan kernel "
                         f"holds at most {limit} per thread")
    for tier in STACK_DEPTH_TIERS:
        if max_depth <= tier and tier <= limit:
            return tier
    return limit


@functools.cache
def cuda_run_program():
    """``run_program`` as a CUDA device function (same source as the CPU one)."""
    device = cuda_device_functions()
    return cuda_support.load_cuda().jit(device=True)(
        make_run_program(device.find_attribute, device.entry_truth))


@functools.cache
def build_scan_kernel_cuda(stack_depth: int):
    """The raw CUDA scan kernel with a ``stack_depth``-slot per-thread stack.

    One thread per (event, subscription) over a 2-D grid-stride loop: x runs
    along subscriptions (neighbouring threads write neighbouring bytes of a
    hit row and read neighbouring program offsets), y along events (all
    threads of a block read the same event's attributes: cache hits)."""
    global cuda
    cuda = cuda_support.load_cuda()
    run = cuda_run_program()
    depth = int(stack_depth)

    def kernel(event_start, n_chunk, ev_offsets, ev_attr, ev_value, ev_token,
               prog_offsets, prog_kind, prog_arg, alive,
               pred_attr, pred_op, pred_lo, pred_hi, set_offsets, set_values, pred_aux,
               pattern_truth, list_truth, max_depth, out):
        n_subs = prog_offsets.shape[0] - 1
        x, y = cuda.grid(2)
        sx, sy = cuda.gridsize(2)
        stack = cuda.local.array(depth, np.int8)
        for e in range(y, n_chunk, sy):
            event = event_start + e
            ev_start = ev_offsets[event]
            ev_stop = ev_offsets[event + 1]
            for s in range(x, n_subs, sx):
                hit = 0
                if alive[s] != 0:
                    truth = run(prog_offsets[s], prog_offsets[s + 1], prog_kind, prog_arg,
                                ev_start, ev_stop, ev_attr, ev_value, ev_token,
                                pred_attr, pred_op, pred_lo, pred_hi, set_offsets, set_values,
                                pred_aux, pattern_truth, list_truth, stack)
                    if truth == TRUE:
                        hit = 1
                out[e, s] = hit

    return cuda.jit(kernel)


def scan_kernel_cuda(event_start, n_chunk, ev_offsets, ev_attr, ev_value, ev_token,
                     prog_offsets, prog_kind, prog_arg, alive,
                     pred_attr, pred_op, pred_lo, pred_hi, set_offsets, set_values, pred_aux,
                     pattern_truth, list_truth, max_depth, out, *, launch=None):
    """CUDA twin of :func:`scan_kernel`: same arguments (device arrays),
    ``out[e, s]`` written on the device.  ``launch`` (a
    :class:`~gpu_kernels.cuda_support.LaunchConfig`) sets the grid; the
    kernel for ``max_depth``'s stack tier is compiled on first use."""
    kernel = build_scan_kernel_cuda(cuda_stack_depth(int(max_depth)))
    n_subs = len(prog_offsets) - 1
    if n_chunk <= 0 or n_subs <= 0:
        return
    grid, block = (launch or cuda_support.default_launch()).grid(n_subs, n_chunk)
    kernel[grid, block](np.int64(event_start), np.int64(n_chunk), ev_offsets, ev_attr, ev_value, ev_token,
                        prog_offsets, prog_kind, prog_arg, alive,
                        pred_attr, pred_op, pred_lo, pred_hi, set_offsets, set_values, pred_aux,
                        pattern_truth, list_truth, np.int64(max_depth), out)
