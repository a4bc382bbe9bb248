"""``opindex`` (OpIndex, opindex.txt): two-level partitioned inverted lists
with counting (DESIGN.md §6).

How the paper maps onto this module and :mod:`gpu_kernels.opindex`:

* **Pivot attribute** (§4.1, eq. 1): each conjunction's least frequent
  attribute among those an event must carry for it to be TRUE (every
  predicate but IS NULL needs its attribute present: attribute match,
  Definition 1).  Frequencies ``Δ(A)`` come from the subscriptions (number
  of predicates on ``A``) or, with ``event_log=``, from an event log
  (an :class:`~engine.events.EventBatch` or an array of per-attribute
  counts), subscription frequency breaking ties.
* **Level 1 / level 2 partitions** (§4.1-§4.2): subscriptions grouped by
  pivot, then predicates by operator into lists ``=``, ``!=``, ``<``,
  ``<=``, ``>``, ``>=`` sorted by (attribute, operand) and range-scanned
  as in §4.2; IN becomes one ``=`` entry per value (counted once: an event
  has one value per attribute), BETWEEN ``>= lo`` and ``<= hi`` (counted
  twice), as the paper rewrites them.
* **Segment directory and signatures** (§4.2, Example 3): each list is split
  into ``b`` (default 32) segments by attribute, with a ``w``-bit (default
  64) signature per segment: ``h(attribute, operand)`` for ``=``,
  ``h(attribute)`` otherwise.  ``OpIndex-BS`` (:class:`OpIndexBSMatcher`,
  or ``variant="bs"``) has one segment per list and no signatures: binary
  search only.
* **Counting** (§4.3, Algorithm 2): per-pivot counter arrays; a
  conjunction's counter starts at its number of predicates and a match is
  a counter reaching 0.  Counters live per thread; a partition's counters
  are re-initialised when an event visits it.
* **DNF** (§6.1): each conjunction of ``to_dnf`` is a simple subscription;
  the subscription matches if any does and is reported once.
  **CNF** (§6.1): a clause bitmap (one flag per clause, counter = number of
  clauses) and a *set* of pivot attributes -- those of the clause with the
  fewest predicates (ties: least total frequency) -- the subscription being
  stored once per pivot.  Per subscription the form with fewer index
  entries is used (DNF on ties); the limit is ``dnf_limit``.
* **Prefix operator** (§6.2): ``LIKE 'abc%'`` is stored in a PREFIX list as
  the code interval of the strings starting with ``abc`` (strings are
  order-preserving codes; the interval is computed from the schema's
  dictionary, so ``schema=`` is needed) and confirmed with the batch's exact
  pattern results, since strings outside the dictionary share codes with
  their neighbours.  Other patterns (suffix ``'%abc'`` included: codes carry
  no reversed order), NOT IN, NOT BETWEEN, NOT LIKE, MATCHES, NOT MATCHES
  and IS NOT NULL go to a VERIFY list found by attribute and decided by
  ``predicate_truth`` (exact three-valued semantics).
* **IS NULL** cannot be found through the event's attributes: it is checked
  when its conjunction's counter reaches 0.  A subscription with a
  conjunction of IS NULL tests only (``a IS NULL``, ``a != 5 OR b IS
  NULL``...), or with neither a DNF nor an IS-NULL-free CNF within the
  limit, is evaluated on every event (a short always-checked list).

Layout and speed: entries hold a 16-bit operand (its rank among the
distinct operands; float64 beyond 32767 of them) and a counter pointer
relative to the partition (16 bits for partitions under 32767 counters);
counters are 8 bits when conjunctions allow.  Batches are split into tasks
over all cores (``prange``), each with its own counters; single events run
on the calling thread.  Output per event is de-duplicated and ordered by a
two-level bitmap of positions.

Updates: the :class:`~engine.index.Index` matches new subscriptions in a
small delta by scan and tombstones removals through ``alive`` (copied per
counter, next to the counters, when it changes); a merge builds a new
matcher (a few linear passes and one sort per list).
:func:`check_expression` is the add-time refusal of expressions too large
for both normal forms.
"""

from __future__ import annotations

import numba
import numpy as np

from engine.compile import OP_OF_CODE, OPCODE, Segment
from engine.errors import BackendUnavailable, ExpressionTooLarge
from engine.expr import And, Node, Or, Pred, Xnor, Xor, to_cnf, to_dnf
from gpu_kernels import opcodes
from gpu_kernels import opindex as K

#: the Index's default DNF limit (engine.index.DEFAULT_DNF_LIMIT)
DEFAULT_LIMIT = 256
#: batches up to this many events are matched on the calling thread
SERIAL_EVENTS = 4
#: the paper's settings (§7.1): 32 segments per list, 64-bit signatures
DEFAULT_SEGMENTS = 32
DEFAULT_SIGNATURE_BITS = 64

_N_OPS = 16
#: list of each operator inside a conjunction (IN and BETWEEN are expanded)
_LIST_CONJ = np.full(_N_OPS, K.L_VERIFY, dtype=np.int64)
_LIST_CONJ[[opcodes.EQ, opcodes.NE, opcodes.LT, opcodes.LE, opcodes.GT, opcodes.GE, opcodes.IN, opcodes.BETWEEN]] = \
    [K.L_EQ, K.L_NE, K.L_LT, K.L_LE, K.L_GT, K.L_GE, K.L_EQ, K.L_GE]
_LIST_CONJ[opcodes.IS_NULL] = -1
#: ... and inside a CNF clause (BETWEEN is one predicate there: VERIFY)
_LIST_CNF = _LIST_CONJ.copy()
_LIST_CNF[opcodes.BETWEEN] = K.L_VERIFY


def check_expression(node: Node, limit: int = DEFAULT_LIMIT) -> None:
    """Refuse, at add time, an expression opindex cannot index within
    ``limit``: it needs a DNF of at most ``limit`` conjunctions (§6.1) or a
    CNF of at most ``limit`` clauses.  Raises
    :class:`~engine.errors.ExpressionTooLarge`; returns None otherwise."""
    try:
        to_dnf(node, limit)
        return
    except ExpressionTooLarge:
        pass
    try:
        to_cnf(node, limit)
        return
    except ExpressionTooLarge:
        raise ExpressionTooLarge(
            f"opindex indexes an expression through its DNF (one simple subscription per conjunction) or its "
            f"CNF (one bit per clause), OpIndex §6.1; this expression needs more than {limit} conjunctions and "
            f"more than {limit} clauses (dnf_limit={limit}). Raise dnf_limit or use algorithm 'scan' or "
            f"'atree'.") from None


def _attr_frequency(log, n_attrs: int) -> np.ndarray:
    """Per-attribute event frequency from an EventBatch or a count array."""
    attr = getattr(log, "attr", None)
    if attr is not None:
        counts = np.bincount(np.asarray(attr, np.int64), minlength=n_attrs)
    else:
        counts = np.asarray(log, dtype=np.int64).reshape(-1)
        if (counts < 0).any():
            raise ValueError("event_log frequencies must be non-negative")
    out = np.zeros(n_attrs, dtype=np.int64)
    m = min(n_attrs, len(counts))
    out[:m] = counts[:m]
    return out


def _like_prefix(pattern: str):
    """The literal prefix of a prefix pattern ``'abc%'`` (``%`` only at the
    end, no ``_``), else None."""
    body = pattern.rstrip("%")
    if body == pattern or "%" in body or "_" in body:
        return None
    return body


def _successor(prefix: str):
    """The least string greater than every string starting with
    ``prefix``, or None if there is none."""
    chars = list(prefix)
    while chars and ord(chars[-1]) == 0x10FFFF:
        chars.pop()
    if not chars:
        return None
    nxt = ord(chars[-1]) + 1
    if 0xD800 <= nxt <= 0xDFFF:
        nxt = 0xE000
    chars[-1] = chr(nxt)
    return "".join(chars)


class OpIndexMatcher:
    """OpIndex over one compiled segment (see the module docstring).

    ``OpIndexMatcher(segment, backend="cpu", *, schema=None, event_log=None,
    dnf_limit=256, segments=32, signature_bits=64, variant="full",
    operand_ranks=None)``; ``variant="bs"`` is OpIndex-BS.  ``schema`` (the
    Index's) enables the PREFIX lists; without it prefix patterns are
    verified like other patterns.  ``operand_ranks`` (default: when there
    are at most 32767 distinct operands) stores operands as 16-bit ranks
    instead of float64 values."""

    name = "opindex"
    variant = "full"
    #: the Index calls this at add time (DNF or CNF within dnf_limit)
    check_expression = staticmethod(check_expression)

    def __init__(self, segment: Segment, backend: str = "cpu", *, schema=None, event_log=None,
                 dnf_limit: int | None = None, segments: int = DEFAULT_SEGMENTS,
                 signature_bits: int = DEFAULT_SIGNATURE_BITS, variant: str | None = None,
                 operand_ranks: bool | None = None):
        if backend != "cpu":
            raise BackendUnavailable(f"opindex runs on 'cpu' (the CUDA twin is not there yet), not {backend!r}")
        variant = self.variant if variant is None else variant
        if variant not in ("full", "bs"):
            raise ValueError(f"variant must be 'full' or 'bs', not {variant!r}")
        if isinstance(segments, bool) or not isinstance(segments, (int, np.integer)) or segments < 1 \
                or segments & (segments - 1):
            raise ValueError(f"segments must be a power of two >= 1, not {segments!r}")
        if isinstance(signature_bits, bool) or not isinstance(signature_bits, (int, np.integer)) \
                or not 1 <= signature_bits <= 64 or signature_bits & (signature_bits - 1):
            raise ValueError(f"signature_bits must be a power of two in [1, 64], not {signature_bits!r}")
        self.segment = segment
        self.backend = backend
        self.schema = schema
        self.event_log = event_log
        self.dnf_limit = DEFAULT_LIMIT if dnf_limit is None else int(dnf_limit)
        self.variant = variant
        self.n_segments = int(segments)
        self.signature_bits = int(signature_bits)
        self.operand_ranks = operand_ranks
        self._matches_per_event = 16.0
        self._live = None
        self._build()

    # ------------------------------------------------------------------ build
    def _build(self) -> None:
        seg = self.segment
        preds = seg.predicates
        if preds.lo is None or preds.set_offsets is None:
            if self.schema is None:
                raise ValueError("the segment's predicates are not coded yet: recode them or pass schema=")
            preds.recode(self.schema)
        self._coded = (preds.coded_version, preds.lo, preds.hi, preds.set_values)
        n_subs = len(seg)
        # the distinct-predicate table, extended by negations the normal forms need
        self._x = {"attr": preds.attr.astype(np.int32, copy=False), "op": preds.op.astype(np.int8, copy=False),
                   "lo": preds.lo, "hi": preds.hi, "aux": preds.aux,
                   "set_start": preds.set_offsets[:-1], "set_stop": preds.set_offsets[1:]}
        self._extra = {k: [] for k in self._x}
        self._negated: dict[int, int] = {}
        n_attrs = int(preds.attr.max()) + 1 if len(preds) else 1
        self.n_attrs = n_attrs
        # Δ(A) from the subscriptions: predicates on A after the §4.2
        # rewrites (an IN list counts its values, BETWEEN two comparisons)
        leaves = seg.prog_arg[seg.prog_kind == opcodes.LEAF]
        rewritten = np.ones(len(preds), np.int64)
        rewritten[preds.op == opcodes.IN] = np.diff(preds.set_offsets)[preds.op == opcodes.IN]
        rewritten[preds.op == opcodes.BETWEEN] = 2
        sub_freq = np.bincount(preds.attr[leaves].astype(np.int64), weights=rewritten[leaves],
                               minlength=n_attrs)[:n_attrs].astype(np.int64)
        if self.event_log is not None:
            ev_freq = _attr_frequency(self.event_log, n_attrs)
            attr_key = ev_freq * (int(sub_freq.max(initial=0)) + 1) + sub_freq
        else:
            attr_key = sub_freq.astype(np.int64)
        self._attr_key = attr_key

        plain = K.plain_conjunctions(seg.prog_offsets, seg.prog_kind, seg.prog_arg) if n_subs else \
            np.zeros(0, bool)
        plain_pos = np.flatnonzero(plain)
        u_off, u_pids = K.plain_units(plain_pos, seg.prog_offsets, seg.prog_kind, seg.prog_arg)
        unit_sub = [plain_pos]
        unit_lists = [(u_off, u_pids)]
        # ---- general expressions: DNF or CNF (§6.1)
        always = []
        cnf_copies = []            # (sub position, pivot attr, [clause pid arrays])
        self.form_counts = {"plain": len(plain_pos), "dnf": 0, "cnf": 0, "always": 0, "never": 0}
        g_sub, g_off, g_pids = [], [0], []
        for pos in np.flatnonzero(~plain):
            form, parts = self._normal_form(int(pos))
            self.form_counts[form] += 1
            if form == "dnf":
                for conj in parts:
                    g_sub.append(pos)
                    g_pids.extend(conj)
                    g_off.append(len(g_pids))
            elif form == "cnf":
                pivots, clauses = parts
                for attr in pivots:
                    cnf_copies.append((int(pos), int(attr), clauses))
            elif form == "always":
                always.append(int(pos))
        self._finish_extension()
        x = self._x
        if g_sub:
            unit_sub.append(np.array(g_sub, np.int64))
            unit_lists.append((np.array(g_off, np.int64), np.array(g_pids, np.int64)))
        unit_sub = np.concatenate(unit_sub)
        off_parts, pid_parts, base = [np.zeros(1, np.int64)], [], 0
        for off, pids in unit_lists:
            off_parts.append(off[1:] + base)
            pid_parts.append(pids)
            base += len(pids)
        unit_off = np.concatenate(off_parts)
        unit_pids = np.concatenate(pid_parts) if pid_parts else np.zeros(0, np.int64)

        # ---- per-predicate entry counts (§4.2 rewrites) and counter weights
        op = x["op"].astype(np.int64)
        set_len = (x["set_stop"] - x["set_start"]).astype(np.int64)
        n_conj = np.ones(len(op), np.int64)
        n_conj[op == opcodes.IN] = set_len[op == opcodes.IN]
        n_conj[op == opcodes.BETWEEN] = 2
        n_conj[op == opcodes.IS_NULL] = 0
        n_cnf = n_conj.copy()
        n_cnf[op == opcodes.BETWEEN] = 1
        weight = np.ones(len(op), np.int64)
        weight[op == opcodes.BETWEEN] = 2
        weight[op == opcodes.IS_NULL] = 0
        findable = op != opcodes.IS_NULL

        # ---- pivots of the conjunctions; a subscription with a conjunction
        # no event attribute can find is checked on every event
        pivot, init = K.choose_pivots(unit_off, unit_pids, x["attr"], findable, attr_key, weight)
        if (pivot < 0).any():
            always.extend(unit_sub[pivot < 0].tolist())
        always_arr = np.unique(np.array(always, np.int64))
        if len(always_arr):
            keep = np.flatnonzero(~np.isin(unit_sub, always_arr))
            lens = np.diff(unit_off)[keep]
            gather = np.repeat(unit_off[:-1][keep] - np.concatenate(([0], np.cumsum(lens)[:-1])), lens) \
                + np.arange(int(lens.sum()))
            unit_pids = unit_pids[gather]
            unit_off = np.concatenate(([0], np.cumsum(lens))).astype(np.int64)
            unit_sub, pivot, init = unit_sub[keep], pivot[keep], init[keep]
            always_set = set(always_arr.tolist())
            cnf_copies = [c for c in cnf_copies if c[0] not in always_set]
        self.always_pos = always_arr
        self.form_counts["always"] = len(always_arr)
        n_units = len(unit_sub)

        # ---- CNF copies (one per pivot of the pivot set), clauses in CSR
        copy_clause_off = np.zeros(len(cnf_copies) + 1, np.int64)
        clause_off, clause_pids = [0], []
        for k, (_, _, clauses) in enumerate(cnf_copies):
            for clause in clauses:
                clause_pids.extend(clause)
                clause_off.append(len(clause_pids))
            copy_clause_off[k + 1] = len(clause_off) - 1
        clause_off = np.array(clause_off, np.int64)
        clause_pids = np.array(clause_pids, np.int64)

        # ---- counters (V_{A}): grouped by pivot partition
        all_pivot = np.concatenate((pivot, np.array([c[1] for c in cnf_copies], np.int64)))
        all_init = np.concatenate((init, np.diff(copy_clause_off)))
        all_sub = np.concatenate((unit_sub, np.array([c[0] for c in cnf_copies], np.int64)))
        used = np.bincount(all_pivot, minlength=n_attrs) > 0
        compact = np.cumsum(used) - 1
        n_parts = int(used.sum())
        counter_item, part_counter_start = K.counting_order(compact[all_pivot], n_parts)
        self.part_counter_start = part_counter_start
        self.pivot_of_attr = np.where(used, compact, -1).astype(np.int32)
        top = all_init.max(initial=0)     # counters as narrow as the largest conjunction allows
        dtype = np.int8 if top <= np.iinfo(np.int8).max else np.int16 if top <= np.iinfo(np.int16).max \
            else np.int32
        self.counter_init = all_init[counter_item].astype(dtype)
        self.counter_sub = all_sub[counter_item].astype(np.int32 if n_subs < 2 ** 31 else np.int64)

        # ---- operand ranks (the lists' sort key)
        prefix_ok, prefix_lo, prefix_hi = self._prefix_bounds()
        valued = np.isin(op, (opcodes.EQ, opcodes.NE, opcodes.LT, opcodes.LE, opcodes.GT, opcodes.GE,
                              opcodes.BETWEEN))
        vals = np.unique(np.concatenate((x["lo"][valued], x["hi"][op == opcodes.BETWEEN], self.set_values,
                                         prefix_lo[prefix_ok])))
        rank_lo = np.searchsorted(vals, x["lo"]).astype(np.int64)
        rank_hi = np.searchsorted(vals, x["hi"]).astype(np.int64)
        set_rank = np.searchsorted(vals, self.set_values).astype(np.int64)
        prefix_rank = np.searchsorted(vals, prefix_lo).astype(np.int64)
        self.vals = vals
        # operands as 2 * rank + 1 among the distinct operands (an event value
        # becomes 2 * #operands below it, + 1 if it is one): exact comparisons
        # in 16 bits; raw float64 operands beyond 32767 distinct ones
        use_rank = 2 * len(vals) + 1 <= np.iinfo(np.uint16).max if self.operand_ranks is None else \
            bool(self.operand_ranks) and 2 * len(vals) + 1 <= np.iinfo(np.uint16).max
        vals = np.concatenate((vals, [0.0]))        # (ranks of unused rows may point one past the end)

        # ---- entries, sorted by (list, attribute, operand)
        (e_list, e_attr, e_rank, e_target, self.counter_post_start, self.post_attr, self.slot_counter,
         self.part_slot_start) = K.emit_entries(
            counter_item, n_units, part_counter_start, unit_off, unit_pids, copy_clause_off,
            clause_off, clause_pids,
            K.pack_predicates(x["attr"], x["op"], prefix_ok, n_conj, n_cnf, rank_lo, rank_hi, x["set_start"]),
            _LIST_CONJ, _LIST_CNF, set_rank)
        n_lists = n_parts * K.N_LISTS
        order, list_offsets = K.counting_order(e_list, n_lists)
        K.sort_within_lists(list_offsets, order, e_attr, e_rank, max(len(vals), len(op)) + 1, prefix_rank)
        s_attr, s_val, self.ent_target, side_pid, self.side_hi, self.list_side_base = K.gather_sorted(
            order, list_offsets, e_list, e_attr, e_rank, e_target, vals, prefix_rank, prefix_hi, use_rank)
        del e_list, e_attr, e_rank, e_target, order
        self.side_pid = side_pid.astype(np.int32 if len(op) < 2 ** 31 else np.int64)
        # counter pointers relative to the partition: 16 bits when partitions are small
        widest = max(int(np.diff(part_counter_start).max(initial=0)), int(np.diff(self.part_slot_start).max(initial=0)))
        if widest < np.iinfo(np.int16).max:
            self.ent_target = self.ent_target.astype(np.int16)
        attr_bits = int(n_attrs - 1).bit_length()
        max_log2 = int(self.n_segments).bit_length() - 1
        (self.run_attr, self.run_start, self.list_shift, self.list_bucket_base, self.bucket_run_start,
         self.bucket_sig) = K.build_directory(list_offsets, s_attr, s_val, n_attrs, attr_bits, max_log2,
                                              self.signature_bits, self.variant == "full")
        self.use_rank = bool(use_rank)
        self.ent_val = s_val.astype(np.uint16) if use_rank else s_val
        self.n_entries = len(s_val)
        self.n_counters = len(self.counter_init)
        self.n_partitions = n_parts
        self._has_prefix = bool(prefix_ok.any())

    # ------------------------------------------------------ normal forms (§6.1)
    def _tree(self, pos: int) -> Node:
        """The subscription's NNF program as an AST whose leaves name
        predicate ids (``Pred(str(pid), op)``), for to_dnf / to_cnf."""
        seg = self.segment
        stack: list[Node] = []
        ops = self._x["op"]
        for pc in range(int(seg.prog_offsets[pos]), int(seg.prog_offsets[pos + 1])):
            kind, arg = int(seg.prog_kind[pc]), int(seg.prog_arg[pc])
            if kind == opcodes.LEAF:
                stack.append(Pred(str(arg), OP_OF_CODE[int(ops[arg])], ()))
            elif kind in (opcodes.AND, opcodes.OR):
                children = tuple(stack[len(stack) - arg:])
                del stack[len(stack) - arg:]
                stack.append(And(children) if kind == opcodes.AND else Or(children))
            else:
                right, left = stack.pop(), stack.pop()
                stack.append(Xor(left, right) if kind == opcodes.XOR else Xnor(left, right))
        return stack[0]

    def _pid(self, pred: Pred) -> int:
        """Predicate id of a normal-form leaf: the original, or its negation
        (same attribute and operands, negated operator: exact under
        three-valued logic) appended to the extended table."""
        pid = int(pred.attr)
        code = OPCODE[pred.op]
        if code == int(self._x["op"][pid]):
            return pid
        found = self._negated.get(pid)
        if found is None:
            found = len(self._x["op"]) + len(self._extra["op"])
            for key in ("attr", "lo", "hi", "aux", "set_start", "set_stop"):
                self._extra[key].append(self._x[key][pid])
            self._extra["op"].append(code)
            self._negated[pid] = found
        return found

    def _finish_extension(self) -> None:
        dtypes = {"attr": np.int32, "op": np.int8, "lo": np.float64, "hi": np.float64, "aux": np.int64,
                  "set_start": np.int64, "set_stop": np.int64}
        if self._extra["op"]:
            for key, dtype in dtypes.items():
                self._x[key] = np.concatenate((self._x[key].astype(dtype, copy=False),
                                               np.array(self._extra[key], dtype)))
            self._extended_bytes = sum(len(self._extra["op"]) * np.dtype(d).itemsize for d in dtypes.values())
        else:
            self._x = {key: np.ascontiguousarray(self._x[key], dtype) for key, dtype in dtypes.items()}
            self._extended_bytes = 0
        self.set_values = self.segment.predicates.set_values
        self._extra = None

    def _entries_of(self, pids, cnf: bool) -> int:
        n = 0
        for pid in pids:
            op = int(self._x_op_of(pid))
            if op == opcodes.IN:
                n += int(self._x_val_of("set_stop", pid) - self._x_val_of("set_start", pid))
            elif op == opcodes.BETWEEN and not cnf:
                n += 2
            elif op != opcodes.IS_NULL:
                n += 1
        return n

    def _x_op_of(self, pid):
        base = len(self._x["op"])
        return self._x["op"][pid] if pid < base else self._extra["op"][pid - base]

    def _x_val_of(self, key, pid):
        base = len(self._x["op"])
        return self._x[key][pid] if pid < base else self._extra[key][pid - base]

    def _normal_form(self, pos: int):
        """("dnf", [pid tuples]) | ("cnf", (pivot attrs, [clause pid tuples]))
        | ("always", None) | ("never", None) for one subscription."""
        tree = self._tree(pos)
        try:
            dnf = [tuple(self._pid(p) for p in conj) for conj in to_dnf(tree, self.dnf_limit)]
        except ExpressionTooLarge:
            dnf = None
        try:
            cnf = [tuple(self._pid(p) for p in clause) for clause in to_cnf(tree, self.dnf_limit)]
        except ExpressionTooLarge:
            cnf = None
        if dnf is not None and not dnf:
            return "never", None                  # constant FALSE
        if dnf is not None and any(len(c) == 0 for c in dnf):
            return "always", None                 # constant TRUE
        cnf_ok = cnf is not None and len(cnf) > 0 and all(
            len(clause) and all(int(self._x_op_of(p)) != opcodes.IS_NULL for p in clause) for clause in cnf)
        pivots = None
        if cnf_ok:
            # §6.1: the clause with the fewest predicates (ties: least total frequency)
            key = self._attr_key

            def clause_cost(clause):
                return len(clause), sum(int(key[self._x_val_of("attr", p)]) for p in clause)
            best = min(cnf, key=clause_cost)
            pivots = sorted({int(self._x_val_of("attr", p)) for p in best})
            cnf_cost = sum(self._entries_of(c, True) for c in cnf) * len(pivots)
        if dnf is not None:
            dnf_cost = sum(self._entries_of(c, False) for c in dnf)
            if not cnf_ok or dnf_cost <= cnf_cost:
                return "dnf", dnf
        if cnf_ok:
            return "cnf", (pivots, cnf)
        return "always", None

    # ---------------------------------------------------------- prefix (§6.2)
    def _prefix_bounds(self):
        """Per predicate: is it a prefix LIKE with a code interval, and the
        interval [lo, hi] of the codes of the strings with that prefix."""
        x = self._x
        n = len(x["op"])
        ok = np.zeros(n, dtype=np.bool_)
        lo = np.zeros(n)
        hi = np.zeros(n)
        schema = self.schema
        rows = np.flatnonzero(x["op"] == opcodes.LIKE)
        if schema is None or not len(rows):
            return ok, lo, hi
        for row in rows:
            kind, text = schema.patterns[int(x["aux"][row])]
            prefix = _like_prefix(text)
            if kind != "like" or prefix is None:
                continue
            succ = _successor(prefix)
            codes = schema.encode_strings([prefix] if succ is None else [prefix, succ])
            ok[row] = True
            lo[row] = codes[0]
            hi[row] = np.inf if succ is None else 2.0 * (int(codes[1]) >> 1)
        return ok, lo, hi

    # ------------------------------------------------------------------ match
    @property
    def nbytes(self) -> int:
        own = (self.vals, self.pivot_of_attr, self.part_counter_start, self.part_slot_start, self.list_shift,
               self.list_bucket_base, self.list_side_base, self.bucket_run_start, self.bucket_sig, self.run_attr,
               self.run_start, self.ent_val, self.ent_target, self.side_pid, self.side_hi, self.counter_init,
               self.counter_sub, self.counter_post_start, self.post_attr, self.slot_counter, self.always_pos)
        return self.segment.nbytes + sum(a.nbytes for a in own) + self._extended_bytes

    def _current(self) -> None:
        """Rebuild when the string dictionary grew and moved codes this
        index holds (predicate operands, or prefix intervals)."""
        preds = self.segment.predicates
        version, lo, hi, set_values = self._coded
        if preds.coded_version == version:
            return
        same = (np.array_equal(lo, preds.lo) and np.array_equal(hi, preds.hi)
                and np.array_equal(set_values, preds.set_values))
        if same and not self._has_prefix:
            self._coded = (preds.coded_version, preds.lo, preds.hi, preds.set_values)
            return
        self._live = None
        self._build()

    def _counter_live(self, alive: np.ndarray, n_events: int) -> np.ndarray:
        """``alive`` per counter (a counter's subscription position lies far
        away in ``alive``; this copy lies next to the counters), rebuilt
        only when ``alive`` changed.  Small batches read ``alive`` directly
        (an empty array says so): checking the copy costs more than they save."""
        if n_events < 64:
            return np.zeros(0, np.uint8)
        cached = self._live
        if cached is None or len(cached[0]) != len(alive) or not np.array_equal(cached[0], alive):
            self._live = cached = (alive.copy(), alive[self.counter_sub])
        return cached[1]

    def match(self, batch, pattern_truth: np.ndarray, alive: np.ndarray):
        """(event index, subscription position) of every alive subscription
        TRUE on an event of ``batch``, ascending by event then position."""
        self._current()
        n_events = batch.n_events
        n_subs = len(self.segment)
        empty = (np.zeros(0, np.int64), np.zeros(0, np.int64))
        if n_events == 0 or n_subs == 0:
            return empty
        alive = np.ascontiguousarray(alive, dtype=np.uint8)
        pattern_truth = np.ascontiguousarray(pattern_truth, dtype=np.uint8)
        seg, preds = self.segment, self.segment.predicates
        x = self._x
        threads = numba.get_num_threads()
        n_tasks = 1 if n_events <= SERIAL_EVENTS or threads == 1 else int(min(n_events, 4 * threads))
        kernel = K.opindex_match_serial if n_tasks == 1 else K.opindex_match_kernel
        bounds = np.linspace(0, n_events, n_tasks + 1).round().astype(np.int64)
        first, last = bounds[:-1].copy(), bounds[1:].copy()
        ev_count = np.zeros(n_events, np.int64)
        pieces = []          # (first event, slab, start, length)
        estimate = self._matches_per_event
        need = 0
        while len(first):
            span = int((last - first).max())
            cap = int(max(1024, need, min(span * estimate * 1.25 + 64, 1 << 31)))
            out = np.empty(len(first) * cap, np.int32)
            stop = np.empty(len(first), np.int64)
            task_need = np.empty(len(first), np.int64)
            kernel(
                first, last, out, cap, ev_count, stop, task_need, n_subs,
                batch.offsets, batch.attr, batch.value, batch.token, pattern_truth,
                self.pivot_of_attr, self.part_counter_start, self.part_slot_start,
                self.list_shift, self.list_bucket_base, self.list_side_base, self.bucket_run_start, self.bucket_sig,
                self.signature_bits, self.variant == "full", self.run_attr, self.run_start, self.ent_val,
                self.vals, self.use_rank, self.ent_target, self.side_pid, self.side_hi,
                self.counter_init, self.counter_sub, self._counter_live(alive, n_events), self.counter_post_start,
                self.post_attr, self.slot_counter,
                x["op"], x["lo"], x["hi"], x["set_start"], x["set_stop"], self.set_values, x["aux"],
                self.always_pos, seg.prog_offsets, seg.prog_kind, seg.prog_arg,
                preds.attr, preds.op, preds.lo, preds.hi, preds.set_offsets, preds.set_values, preds.aux,
                seg.max_depth, alive)
            done_events = 0
            done_matches = 0
            for t in range(len(first)):
                n = int(ev_count[first[t]:stop[t]].sum())
                pieces.append((int(first[t]), out, t * cap, n))
                done_events += int(stop[t] - first[t])
                done_matches += n
            unfinished = stop < last
            if done_events:
                estimate = max(estimate, done_matches / done_events)
            if unfinished.any():
                estimate *= 2
                need = int(task_need[unfinished].max()) + 1
            first, last = stop[unfinished], last[unfinished]
        self._matches_per_event = max(1.0, 0.5 * self._matches_per_event + 0.5 * estimate)
        pieces.sort(key=lambda piece: piece[0])
        positions = np.empty(int(ev_count.sum()), np.int64)
        at = 0
        for _, slab, start, n in pieces:
            positions[at:at + n] = slab[start:start + n]
            at += n
        events = np.repeat(np.arange(n_events, dtype=np.int64), ev_count)
        return events, positions

    # ------------------------------------------------------------ inspection
    LIST_NAMES = ("=", "!=", "<", "<=", ">", ">=", "verify", "prefix")

    def partitions(self) -> dict[int, list[int]]:
        """Level 1: pivot attribute id -> the subscription positions in its
        partition (§4.1, Figure 4)."""
        pivots = np.flatnonzero(self.pivot_of_attr >= 0)
        out = {}
        for attr in pivots:
            p = self.pivot_of_attr[attr]
            c0, c1 = self.part_counter_start[p], self.part_counter_start[p + 1]
            out[int(attr)] = sorted({int(x) for x in self.counter_sub[c0:c1]})
        return out

    def predicate_lists(self) -> dict[tuple[int, str], list[tuple[int, float, int]]]:
        """Level 2: (pivot attribute id, list operator) -> the list's
        entries in stored order, each (attribute id, operand, subscription
        position); VERIFY entries carry the predicate id as operand
        (§4.2, Figure 5)."""
        out = {}
        slots = self.slot_counter
        for attr in np.flatnonzero(self.pivot_of_attr >= 0):
            p = int(self.pivot_of_attr[attr])
            for op in range(K.N_LISTS):
                l = p * K.N_LISTS + op
                if self.list_shift[l] < 0:
                    continue
                b0 = self.list_bucket_base[l]
                b1 = b0 + (1 << (int(self.n_attrs - 1).bit_length() - int(self.list_shift[l])))
                rows = []
                for r in range(self.bucket_run_start[b0], self.bucket_run_start[b1]):
                    for k in range(self.run_start[r], self.run_start[r + 1]):
                        t = int(self.ent_target[k])
                        counter = int(self.part_counter_start[p]) + t if t >= 0 \
                            else int(slots[int(self.part_slot_start[p]) - t - 1])
                        if op == K.L_VERIFY:
                            operand = float(self.side_pid[k + self.list_side_base[l]])
                        elif self.use_rank:
                            operand = float(self.vals[(int(self.ent_val[k]) - 1) // 2])
                        else:
                            operand = float(self.ent_val[k])
                        rows.append((int(self.run_attr[r]), operand, int(self.counter_sub[counter])))
                out[(int(attr), self.LIST_NAMES[op])] = rows
        return out

    def __repr__(self) -> str:
        return (f"{type(self).__name__}(subscriptions={len(self.segment)}, partitions={self.n_partitions}, "
                f"entries={self.n_entries}, variant={self.variant!r})")


class OpIndexBSMatcher(OpIndexMatcher):
    """OpIndex-BS (opindex.txt §7): the same index without segments and
    signatures -- each predicate list searched by binary search only."""

    name = "opindex-bs"
    variant = "bs"


__all__ = ["OpIndexMatcher", "OpIndexBSMatcher", "check_expression", "DEFAULT_LIMIT"]
