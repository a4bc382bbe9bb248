"""Conjunctions ("units") of a segment's subscriptions, through DNF (OpIndex §6.1, BE-Tree §3).

An AND-only index (BE-Tree) indexes *conjunctions*: a subscription whose
program is a plain AND of predicates is one unit; any other expression is
rewritten to DNF (:func:`engine.expr.to_dnf`), one unit per conjunction,
and matches when any of its units does (reported once).  Expressions whose
DNF would exceed ``dnf_limit`` conjunctions never reach here: the Index
gives them to the residual matcher (:mod:`engine.algorithms.residual`).

A DNF of an XOR/XNOR holds negated predicates; a negation is appended to an
*extended predicate table* (same attribute and operands, negated operator:
exact under three-valued logic, since the NNF program already folded every
NOT into its predicates).  The table keeps the segment's rows first, so a
unit's predicate ids are rows of the segment's table or of the appended
negations; its IN lists are a CSR of their own (negated rows repeat their
list), which is what :func:`gpu_kernels.predicates.entry_truth` reads.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from engine.compile import OP_OF_CODE, OPCODE, Segment, distinct_rows
from engine.expr import NEGATED_OP, And, Node, Or, Pred, Xnor, Xor, to_dnf
from gpu_kernels import opcodes
from gpu_kernels.opindex.cpu import plain_conjunctions, plain_units
from gpu_kernels.string_codes import recoded_rows, string_code_map


class PredicateRows(NamedTuple):
    """The extended predicate table (kernel codes): the segment's rows, then
    the negations the DNFs need."""

    attr: np.ndarray         # int32
    op: np.ndarray           # int8
    lo: np.ndarray           # float64
    hi: np.ndarray           # float64
    aux: np.ndarray          # int64 (pattern id for LIKE/MATCHES, set id for IN and the list operators)
    set_offsets: np.ndarray  # int64 CSR into set_values (IN / NOT IN lists, sorted)
    set_values: np.ndarray   # float64
    # (no __len__: a NamedTuple handed to a CUDA kernel must have len() ==
    # its number of fields, which numba-cuda's launch asserts on a real GPU)


class Units(NamedTuple):
    """Every subscription's conjunctions: unit ``u`` belongs to subscription
    position ``sub[u]`` and is the AND of rows ``pids[offsets[u]:offsets[u + 1]]``
    of ``rows``.  Units are ordered by subscription, so ``first[s]`` (length
    n_subs + 1) is the first unit of subscription ``s``.  A subscription
    that is constant FALSE has no unit; a constant TRUE one has a unit with
    no predicate."""

    sub: np.ndarray          # int64
    offsets: np.ndarray      # int64
    pids: np.ndarray         # int32
    first: np.ndarray        # int64
    rows: PredicateRows

    def __len__(self) -> int:
        return len(self.sub)


#: opcode -> the smaller of it and its negation's: one id per operator and negation pair
_NEGATION_PAIR = np.zeros(max(OPCODE.values()) + 1, np.int8)
for _op, _code in OPCODE.items():
    _NEGATION_PAIR[_code] = min(_code, OPCODE[NEGATED_OP[_op]])


def operand_classes(preds) -> np.ndarray:
    """Per predicate row, the first row with the same attribute, operands
    (``lo``, ``hi``, ``aux``) and operator up to negation: a predicate and
    its negation -- ``a IN s`` and ``a NOT IN s`` -- share a class.  (The
    pair is part of the key because ``aux`` means a set for IN and a
    pattern for LIKE: ``a IN`` set 0 and ``a LIKE`` pattern 0 are not one
    operand.)"""
    if len(preds) == 0:
        return np.zeros(0, np.int64)
    first, inverse = distinct_rows((preds.attr, _NEGATION_PAIR[preds.op], preds.lo, preds.hi, preds.aux))
    return np.asarray(first, np.int64)[inverse]


def program_tree(segment: Segment, pos: int, classes: np.ndarray | None = None) -> Node:
    """Subscription ``pos``'s NNF program as an AST whose leaves name
    predicate rows (``Pred(str(row), op)``), for :func:`to_dnf`.  With
    ``classes`` (:func:`operand_classes`) a leaf names its row's class
    instead, so that a predicate and its negation elsewhere in the program
    are one predicate and its negation to :func:`to_dnf` too -- as they are
    in the expression's own AST, whose normal form the add-time limit check
    counted: without it a build could count more conjunctions than the check
    allowed."""
    ops = segment.predicates.op
    stack: list[Node] = []
    for pc in range(int(segment.prog_offsets[pos]), int(segment.prog_offsets[pos + 1])):
        kind, arg = int(segment.prog_kind[pc]), int(segment.prog_arg[pc])
        if kind == opcodes.LEAF:
            stack.append(Pred(str(arg if classes is None else classes[arg]), OP_OF_CODE[int(ops[arg])], ()))
        elif kind in (opcodes.AND, opcodes.OR):
            children = tuple(stack[len(stack) - arg:])
            del stack[len(stack) - arg:]
            stack.append(And(children) if kind == opcodes.AND else Or(children))
        else:
            right, left = stack.pop(), stack.pop()
            stack.append(Xor(left, right) if kind == opcodes.XOR else Xnor(left, right))
    return stack[0]


def dnf_units(segment: Segment, dnf_limit: int) -> Units:
    """The units of every subscription of ``segment`` (its predicates coded).
    Plain conjunctions are read off the programs in one compiled pass; only
    the other expressions go through :func:`to_dnf`."""
    preds = segment.predicates
    if preds.lo is None or preds.set_offsets is None:
        raise ValueError("the segment's predicates are not coded yet")
    n_subs = len(segment)
    n_rows = len(preds)
    plain = plain_conjunctions(segment.prog_offsets, segment.prog_kind, segment.prog_arg) if n_subs else \
        np.zeros(0, bool)
    plain_pos = np.flatnonzero(plain).astype(np.int64)
    p_off, p_pids = plain_units(plain_pos, segment.prog_offsets, segment.prog_kind, segment.prog_arg)
    negated: dict[tuple[int, int], int] = {}      # (row, negated opcode) -> extended row
    other = np.flatnonzero(~plain)
    classes = operand_classes(preds) if len(other) else None
    # (class, opcode) -> the row of that operator on the class's operands, where there is one
    by_operator = {(int(c), int(o)): r for r, (c, o) in enumerate(zip(classes, preds.op))} if len(other) else {}

    def row_of(pred: Pred) -> int:
        row = int(pred.attr)                       # the class
        code = OPCODE[pred.op]
        found = by_operator.get((row, code))
        if found is not None:
            return found
        return negated.setdefault((row, code), n_rows + len(negated))

    other_sub, other_len, other_pids = [], [], []
    for pos in other:
        for conj in to_dnf(program_tree(segment, int(pos), classes), dnf_limit):
            other_sub.append(int(pos))
            other_len.append(len(conj))
            other_pids.extend(row_of(p) for p in conj)
    # merge the two unit lists in subscription order
    sub = np.concatenate((plain_pos, np.array(other_sub, np.int64)))
    lens = np.concatenate((np.diff(p_off), np.array(other_len, np.int64)))
    pids_all = np.concatenate((p_pids, np.array(other_pids, np.int64)))
    starts = np.concatenate((p_off[:-1], len(p_pids) + np.concatenate(([0], np.cumsum(other_len)[:-1]))
                             .astype(np.int64)))[:len(sub)]
    order = np.argsort(sub, kind="stable")
    sub, lens, starts = sub[order], lens[order], starts[order]
    offsets = np.concatenate(([0], np.cumsum(lens))).astype(np.int64)
    pids = pids_all[np.repeat(starts - offsets[:-1], lens) + np.arange(int(offsets[-1]))] if len(sub) else \
        np.zeros(0, np.int64)
    first = np.searchsorted(sub, np.arange(n_subs + 1)).astype(np.int64)
    return Units(sub, offsets, pids.astype(np.int32), first, _extended_rows(preds, negated))


def _extended_rows(preds, negated: dict) -> PredicateRows:
    base = np.array([row for row, _ in negated], np.int64)
    codes = np.array([code for _, code in negated], np.int8)
    rows = np.concatenate((np.arange(len(preds)), base)).astype(np.int64)
    set_len = np.diff(preds.set_offsets)[rows] if len(rows) else np.zeros(0, np.int64)
    set_offsets = np.concatenate(([0], np.cumsum(set_len))).astype(np.int64)
    gather = np.repeat(preds.set_offsets[:-1][rows] - set_offsets[:-1], set_len) + np.arange(int(set_offsets[-1]))
    return PredicateRows(
        attr=preds.attr[rows].astype(np.int32), op=np.concatenate((preds.op, codes)).astype(np.int8),
        lo=preds.lo[rows].astype(np.float64), hi=preds.hi[rows].astype(np.float64),
        aux=preds.aux[rows].astype(np.int64), set_offsets=set_offsets,
        set_values=preds.set_values[gather].astype(np.float64))


class Recoded(NamedTuple):
    """Units whose rows were mapped to a grown dictionary's codes (:func:`recoded_units`)."""

    segment: Segment         # the segment, coded under the grown dictionary
    units: Units
    code_map: np.ndarray     # old string code 2r + 1 -> new code, by r (gpu_kernels.string_codes)
    string_attr: np.ndarray  # bool per attribute id: a string attribute


def recoded_units(units: Units, old_schema, segment: Segment, schema) -> Recoded | None:
    """``units`` -- read from a segment coded under ``old_schema``'s string
    dictionary -- with their rows in the codes of ``schema``'s, a grown
    one; ``segment``: the same subscriptions (coded here under ``schema``
    where they are not yet).  The
    units themselves do not change (a recode moves codes, not predicates),
    so nothing is rewritten to DNF again; where no code of theirs moved,
    the result holds ``units`` itself (what was derived from them still
    holds).  None when ``segment`` is not the same rows or the mapped rows
    are not its own codes (``old_schema`` not the dictionary the units were
    coded under): the caller builds instead."""
    if old_schema is None or schema is None:
        return None
    segment = segment.coded(schema) if segment.predicates.lo is None else segment
    preds = segment.predicates
    rows = units.rows
    if len(preds.op) > len(rows.op):
        return None
    n, n_values = len(preds.op), int(preds.set_offsets[-1])
    if not (np.array_equal(rows.op[:n], preds.op) and np.array_equal(rows.attr[:n], preds.attr)
            and int(rows.set_offsets[n]) == n_values):
        return None
    code_map = string_code_map(old_schema.dictionary().order, schema.dictionary().rank)
    string_attr = np.zeros(int(rows.attr.max(initial=-1)) + 1, bool)
    string_attr[preds.attr[preds.string_rows(schema)]] = True
    mapped = recoded_rows(rows, string_attr, code_map)
    if not (np.array_equal(mapped.lo[:n], preds.lo) and np.array_equal(mapped.hi[:n], preds.hi)
            and np.array_equal(mapped.set_values[:n_values], preds.set_values)):
        return None
    if np.array_equal(mapped.lo, rows.lo) and np.array_equal(mapped.hi, rows.hi) \
            and np.array_equal(mapped.set_values, rows.set_values):
        return Recoded(segment, units, code_map, string_attr)     # (no code of these rows moved: the same units)
    return Recoded(segment, Units(units.sub, units.offsets, units.pids, units.first, mapped), code_map, string_attr)


def check_dnf(node: Node, limit: int, algorithm: str, paper: str) -> None:
    """Refuse (ExpressionTooLarge) an expression whose DNF exceeds ``limit``
    conjunctions, for an algorithm that indexes conjunctions only."""
    from engine.errors import ExpressionTooLarge
    try:
        to_dnf(node, limit)
    except ExpressionTooLarge:
        raise ExpressionTooLarge(
            f"{algorithm} indexes an expression through its DNF, one conjunction at a time ({paper}); this "
            f"expression needs more than {limit} conjunctions (dnf_limit={limit}). Without strict=True the "
            f"Index matches it with the residual matcher; or raise dnf_limit.") from None
