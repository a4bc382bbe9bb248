"""Bitmap event encoding (A-PCM, ``apcm.txt`` §IV).

An event becomes a bitmap with one bit per distinct predicate: bit ``b`` is
set when predicate ``bit_predicate[b]`` is TRUE on the event.  The bits of
one attribute's predicates are contiguous (``attr_bit_offsets`` is a CSR
over attribute ids), so encoding an event touches only the predicates of the
attributes it carries, and each distinct predicate is evaluated exactly once
per event.  Pattern predicates (LIKE, MATCHES) read the batch's
``pattern_truth`` table, which evaluated each pattern once per distinct
(attribute, string) of the batch (engine.events.pattern_truth).

Absent attributes: every predicate is NULL -- not TRUE -- except IS NULL,
which is TRUE.  So the encoding starts each event from ``absent_words`` (the
IS NULL bits) and overwrites the bits of the attributes the event carries.
The three-valued truth of any predicate is recoverable: TRUE from the bit,
NULL from the attribute's absence.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import numpy as np
from numba import njit, prange

from gpu_kernels import cuda_support
from gpu_kernels.opcodes import IS_NULL, TRUE
from gpu_kernels.predicates import cuda_device_functions, entry_truth

WORD_BITS = 64


@dataclass
class BitmapLayout:
    """Where each distinct predicate's bit lives."""

    bit_predicate: np.ndarray     # int64 [P] predicate id of each bit
    predicate_bit: np.ndarray     # int64 [P] bit of each predicate id
    attr_bit_offsets: np.ndarray  # int64 [n_attrs + 1] bits of attribute a: [off[a], off[a+1])
    absent_words: np.ndarray      # uint64 [n_words] the IS NULL bits (an event with no attributes)

    @property
    def n_words(self) -> int:
        return len(self.absent_words)

    @classmethod
    def of(cls, pred_attr: np.ndarray, pred_op: np.ndarray, n_attrs: int) -> "BitmapLayout":
        bit_predicate = np.argsort(pred_attr, kind="stable").astype(np.int64)
        predicate_bit = np.empty_like(bit_predicate)
        predicate_bit[bit_predicate] = np.arange(len(bit_predicate))
        counts = np.bincount(pred_attr, minlength=n_attrs) if len(pred_attr) else np.zeros(n_attrs, np.int64)
        attr_bit_offsets = np.concatenate(([0], np.cumsum(counts))).astype(np.int64)
        n_words = max(1, (len(pred_attr) + WORD_BITS - 1) // WORD_BITS)
        absent_words = np.zeros(n_words, dtype=np.uint64)
        for bit in predicate_bit[pred_op == IS_NULL]:
            absent_words[bit // WORD_BITS] |= np.uint64(1) << np.uint64(bit % WORD_BITS)
        return cls(bit_predicate, predicate_bit, attr_bit_offsets, absent_words)


@njit(parallel=True, nogil=True, cache=True)
def encode_bitmaps_kernel(ev_offsets, ev_attr, ev_value, ev_token, attr_bit_offsets, bit_predicate,
                          pred_attr, pred_op, pred_lo, pred_hi, set_offsets, set_values, pred_aux, pattern_truth,
                          absent_words, out):
    """``out[e]`` = the bitmap of event ``e`` (CPU twin: one event per task,
    walking the event's attributes and their contiguous predicate bits)."""
    n_events = len(ev_offsets) - 1
    n_attrs = len(attr_bit_offsets) - 1
    for e in prange(n_events):
        for w in range(len(absent_words)):
            out[e, w] = absent_words[w]
        for k in range(ev_offsets[e], ev_offsets[e + 1]):
            attr = ev_attr[k]
            if attr >= n_attrs:
                continue
            for bit in range(attr_bit_offsets[attr], attr_bit_offsets[attr + 1]):
                truth = entry_truth(bit_predicate[bit], k, ev_value, ev_token, pred_op, pred_lo, pred_hi,
                                    set_offsets, set_values, pred_aux, pattern_truth)
                mask = np.uint64(1) << np.uint64(bit & (WORD_BITS - 1))
                if truth == TRUE:
                    out[e, bit >> 6] |= mask
                else:
                    out[e, bit >> 6] &= ~mask


def encode_bitmaps(batch, table, layout: BitmapLayout, pattern_truth: np.ndarray) -> np.ndarray:
    """Bitmaps ``uint64 [n_events, n_words]`` of an EventBatch under a coded
    PredicateTable."""
    out = np.empty((batch.n_events, layout.n_words), dtype=np.uint64)
    encode_bitmaps_kernel(batch.offsets, batch.attr, batch.value, batch.token, layout.attr_bit_offsets,
                          layout.bit_predicate, table.attr, table.op, table.lo, table.hi, table.set_offsets,
                          table.set_values, table.aux, pattern_truth, layout.absent_words, out)
    return out


# ---------------------------------------------------------------- CUDA twin
cuda = None   # numba.cuda once the CUDA twin is built (see gpu_kernels.cuda_support)


@functools.cache
def _encode_bitmaps_kernel_cuda():
    global cuda
    cuda = cuda_support.load_cuda()
    device = cuda_device_functions()
    find, truth = device.find_attribute, device.entry_truth

    def kernel(ev_offsets, ev_attr, ev_value, ev_token, attr_bit_offsets, bit_predicate,
               pred_attr, pred_op, pred_lo, pred_hi, set_offsets, set_values, pred_aux, pattern_truth,
               absent_words, out):
        # word-parallel: each thread assembles one 64-bit word of one event's
        # bitmap and writes it once -- no atomics, coalesced stores along x.
        # Absent attributes need no start value: entry_truth makes IS NULL
        # TRUE and everything else not TRUE there.
        n_bits = bit_predicate.shape[0]
        n_words = out.shape[1]
        x, y = cuda.grid(2)
        sx, sy = cuda.gridsize(2)
        for e in range(y, out.shape[0], sy):
            start = ev_offsets[e]
            stop = ev_offsets[e + 1]
            for w in range(x, n_words, sx):
                word = np.uint64(0)
                for bit in range(w * WORD_BITS, min((w + 1) * WORD_BITS, n_bits)):
                    p = bit_predicate[bit]
                    pos = find(ev_attr, start, stop, pred_attr[p])
                    if truth(p, pos, ev_value, ev_token, pred_op, pred_lo, pred_hi, set_offsets, set_values,
                             pred_aux, pattern_truth) == TRUE:
                        word |= np.uint64(1) << np.uint64(bit - w * WORD_BITS)
                out[e, w] = word

    return cuda.jit(kernel)


def encode_bitmaps_kernel_cuda(ev_offsets, ev_attr, ev_value, ev_token, attr_bit_offsets, bit_predicate,
                               pred_attr, pred_op, pred_lo, pred_hi, set_offsets, set_values, pred_aux,
                               pattern_truth, absent_words, out, *, launch=None):
    """CUDA twin of :func:`encode_bitmaps_kernel` (same arguments, device
    arrays in, ``out`` written on the device)."""
    n_events, n_words = out.shape
    if n_events == 0:
        return
    grid, block = (launch or cuda_support.default_launch()).grid(n_words, n_events)
    _encode_bitmaps_kernel_cuda()[grid, block](ev_offsets, ev_attr, ev_value, ev_token, attr_bit_offsets,
                                               bit_predicate, pred_attr, pred_op, pred_lo, pred_hi, set_offsets,
                                               set_values, pred_aux, pattern_truth, absent_words, out)


def bits_of(bitmaps: np.ndarray, layout: BitmapLayout) -> np.ndarray:
    """Dense bool ``[n_events, P]`` indexed by predicate id (for tests and
    small batches)."""
    n_preds = len(layout.bit_predicate)
    unpacked = np.unpackbits(bitmaps.view(np.uint8), axis=1, bitorder="little")[:, :n_preds]
    return unpacked[:, layout.predicate_bit].astype(bool)
