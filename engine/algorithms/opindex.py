"""``opindex`` (OpIndex, Zhang, Chan, Tan, PVLDB 2014): two-level partitioned inverted lists
with counting (docs/papers.md#opindex).

How the paper maps onto this module and :mod:`gpu_kernels.opindex` (its
kernels, CPU and CUDA, and the structure's layout):

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
  no reversed order), NOT IN, NOT BETWEEN, NOT LIKE, MATCHES, NOT MATCHES,
  IS NOT NULL and the list operators (ONE OF ... IS NOT EMPTY: their truth
  is the event list's row of the batch's list table, not an operand) go to
  a VERIFY list found by attribute and decided by ``predicate_truth``
  (exact three-valued semantics).
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

Updates (docs/architecture.md#the-index-life-cycle): the :class:`~engine.index.Index` matches new
subscriptions in a small delta by scan and tombstones removals through
``alive`` (copied per counter, next to the counters, when it changes); a
merge derives the next matcher from this one (:meth:`OpIndexMatcher.merged`,
the Index's merge protocol) instead of building it: removed subscriptions'
counters and entries dropped, survivors renumbered (pivots, counters and
entries kept), added subscriptions built as a full build builds them --
pivots from the attribute frequencies of the last full build, as the
paper's inserts (Algorithm 1) -- and their entries merged into the sorted
lists (:func:`~gpu_kernels.opindex.cpu.merge_entries`, one linear pass), then
the segment directories and signatures rebuilt.  Operands are re-encoded
among the grown ``vals`` (float64 once beyond 16-bit ranks), string codes
followed through the grown dictionary (which is also how a matcher follows
new strings between merges).  A full build takes over once the churn since
the last one exceeds :attr:`OpIndexMatcher.REBUILD_SHARE`.

Saved with the index (:meth:`OpIndexMatcher.to_arrays`): the structure's
arrays and what merges and recodes read, so that a load restores the
matcher (:meth:`OpIndexMatcher.from_arrays`: every array checked, then
assembled without building; operands re-encoded when the dictionary grew
since).  :func:`check_expression` is the add-time refusal of expressions
too large for both normal forms.
"""

from __future__ import annotations

import copy
import hashlib

import numpy as np

from engine.algorithms.base import HostMatcher, alive_flags, list_truth_of
from engine.algorithms.host_tasks import Runs, match_in_tasks
from engine.algorithms.options import OpIndexOptions
from engine.algorithms.units import program_tree
from engine.compile import OPCODE, Segment
from engine.errors import BackendUnavailable, ExpressionTooLarge
from engine.expr import NEGATED_OP, Family, Node, Pred, to_cnf, to_dnf
from gpu_kernels import opcodes
from gpu_kernels.list_truth import list_bits_words, list_codes
from gpu_kernels.opindex import cpu as K
from gpu_kernels.opindex.layout import (L_EQ, L_GE, L_GT, L_LE, L_LT, L_NE, L_PREFIX, L_VERIFY, N_LISTS, OpIndexArrays,
                                        Programs, check_arrays)

#: the Index's default DNF limit (engine.index.DEFAULT_DNF_LIMIT)
DEFAULT_LIMIT = 256
#: the paper's settings (§7.1): 32 segments per list, 64-bit signatures
DEFAULT_SEGMENTS = 32
DEFAULT_SIGNATURE_BITS = 64

_N_OPS = opcodes.N_OPS
#: list of each operator inside a conjunction (IN and BETWEEN are expanded); every operator not searched by
#: operand -- NOT IN, NOT BETWEEN, the patterns, IS NOT NULL and the list operators (ONE OF ... IS NOT EMPTY,
#: whose truth is the event list's row of the batch's list table) -- is VERIFY, decided by predicate_truth
_LIST_CONJ = np.full(_N_OPS, L_VERIFY, dtype=np.int64)
_LIST_CONJ[[opcodes.EQ, opcodes.NE, opcodes.LT, opcodes.LE, opcodes.GT, opcodes.GE, opcodes.IN, opcodes.BETWEEN]] = \
    [L_EQ, L_NE, L_LT, L_LE, L_GT, L_GE, L_EQ, L_GE]
_LIST_CONJ[opcodes.IS_NULL] = -1
#: ... and inside a CNF clause (BETWEEN is one predicate there: VERIFY)
_LIST_CNF = _LIST_CONJ.copy()
_LIST_CNF[opcodes.BETWEEN] = L_VERIFY
#: operators whose operands are range-scanned (the lists' sort key)
_VALUED = (opcodes.EQ, opcodes.NE, opcodes.LT, opcodes.LE, opcodes.GT, opcodes.GE, opcodes.BETWEEN)
#: how each subscription is indexed (§6.1), ``_sub_form`` codes
FORMS = ("plain", "dnf", "cnf", "always", "never")
#: the fields of OpIndexArrays, and those a build makes as they are (the
#: extended table, always_pos and the scalars are packed by OpIndexMatcher._assemble)
_FIELDS = frozenset(OpIndexArrays._fields)
_INDEX_FIELDS = OpIndexArrays._fields[:OpIndexArrays._fields.index("x_op")]
#: the columns of the extended predicate table
_X_DTYPES = {"attr": np.int32, "op": np.int8, "lo": np.float64, "hi": np.float64, "aux": np.int64,
             "set_start": np.int64, "set_stop": np.int64}
#: opcode -> the opcode of its negation (the extended table's appended rows)
_NEGATED_CODE = np.full(max(OPCODE.values()) + 1, -1, np.int64)
for _op, _code in OPCODE.items():
    _NEGATED_CODE[_code] = OPCODE[NEGATED_OP[_op]]


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
            f"more than {limit} clauses (dnf_limit={limit}). Without strict=True the Index matches it with "
            f"the residual matcher; or raise dnf_limit.") from None


def _attr_frequency(log, n_attrs: int) -> np.ndarray:
    """Per-attribute event frequency from an EventBatch or a count array."""
    attr = getattr(log, "attr", None)
    if attr is not None:
        counts = np.bincount(np.asarray(attr, np.int64), minlength=n_attrs)
    else:
        counts = np.asarray(log, dtype=np.int64).reshape(-1)     # (checked by OpIndexOptions)
    out = np.zeros(n_attrs, dtype=np.int64)
    m = min(n_attrs, len(counts))
    out[:m] = counts[:m]
    return out


def _log_digest(log, n_attrs: int) -> str | None:
    """A digest of an event log's per-attribute frequencies (what pivots
    were chosen with), for a restore to compare; None without a log."""
    if log is None:
        return None
    return hashlib.sha256(_attr_frequency(log, n_attrs).tobytes()).hexdigest()


def _check_meta(meta: dict, kinds: dict) -> None:
    for key, kind in kinds.items():
        if key not in meta:
            raise ValueError(f"saved OpIndex structure: meta has no {key!r}")
        value = meta[key]
        kinds_ok = kind if isinstance(kind, tuple) else (kind,)
        ok = any(value is None if k is None else
                 isinstance(value, k) and (k is bool or not isinstance(value, bool)) for k in kinds_ok)
        if not ok:
            raise ValueError(f"saved OpIndex structure: meta {key!r} is {value!r}")


def _check_codes(name: str, values: np.ndarray, n_strings: int) -> None:
    """String operands are the codes ``2 r + 1`` of dictionary strings."""
    if len(values) and not ((values >= 1) & (values <= 2 * n_strings - 1) & (values % 2 == 1)).all():
        raise ValueError(f"saved OpIndex structure: {name} holds a string code outside the dictionary")


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


class OpIndexMatcher(HostMatcher):
    """OpIndex over one compiled segment (see the module docstring).

    ``OpIndexMatcher(segment, backend="cpu", *, schema=None, event_log=None,
    dnf_limit=256, segments=32, signature_bits=64, variant="full",
    operand_ranks=None)``; ``variant="bs"`` is OpIndex-BS.  ``schema`` (the
    Index's) enables the PREFIX lists; without it prefix patterns are
    verified like other patterns.  ``operand_ranks`` (default: when there
    are at most 32767 distinct operands) stores operands as 16-bit ranks
    instead of float64 values.  Option values are checked by
    :class:`~engine.algorithms.options.OpIndexOptions`.

    The index is :attr:`arrays`, one
    :class:`~gpu_kernels.opindex.layout.OpIndexArrays` handed whole to the
    kernels; its fields read as attributes of the matcher too
    (``matcher.counter_init``...)."""

    name = "opindex"
    variant = "full"
    #: the index: set once built (or derived, or restored), never changed after
    arrays: OpIndexArrays

    @classmethod
    def construct(cls, segment: Segment, settings) -> "OpIndexMatcher":
        return cls(segment, cls.backend, schema=settings.schema, dnf_limit=settings.dnf_limit,
                   **cls._structure_keywords(settings.options.keywords(cls.backend)))

    @classmethod
    def _structure_keywords(cls, keywords: dict) -> dict:
        """Constructor keywords of a class whose variant is its own (OpIndex-BS)."""
        if cls.variant != OpIndexMatcher.variant:
            keywords = {**keywords, "variant": cls.variant}
        return keywords

    def __init__(self, segment: Segment, backend: str = "cpu", *, schema=None, event_log=None,
                 dnf_limit: int | None = None, segments: int = DEFAULT_SEGMENTS,
                 signature_bits: int = DEFAULT_SIGNATURE_BITS, variant: str | None = None,
                 operand_ranks: bool | None = None):
        if backend != "cpu":
            raise BackendUnavailable(f"OpIndexMatcher runs on backend 'cpu' (OpIndexCudaMatcher on 'cuda'), "
                                     f"not {backend!r}")
        variant = self.variant if variant is None else variant
        OpIndexOptions(variant=variant, segments=segments, signature_bits=signature_bits,
                       operand_ranks=operand_ranks, event_log=event_log)
        self._configure(segment, schema, event_log, dnf_limit, variant, segments, signature_bits, operand_ranks)
        self._build()

    def _configure(self, segment, schema, event_log, dnf_limit, variant, segments, signature_bits,
                   operand_ranks) -> None:
        self.segment = segment
        self.backend = "cpu"
        self.schema = schema
        self.event_log = event_log
        self.dnf_limit = DEFAULT_LIMIT if dnf_limit is None else int(dnf_limit)
        self.variant = variant
        self.n_segments = int(segments)
        self.signature_bits = int(signature_bits)
        self.operand_ranks = operand_ranks
        self._matches_per_event = 16.0
        self._live = None

    def _fresh(self, segment: Segment) -> "OpIndexMatcher":
        """A matcher of ``segment`` built from scratch with this one's
        parameters and build settings."""
        fresh = type(self)(segment, "cpu", schema=self.schema, event_log=self.event_log, dnf_limit=self.dnf_limit,
                           segments=self.n_segments, signature_bits=self.signature_bits, variant=self.variant,
                           operand_ranks=self.operand_ranks)
        fresh.settings = self.settings
        return fresh

    def __getattr__(self, name: str):
        # the fields of the index read as attributes (only reached when the
        # instance has no attribute of that name: during a build, the arrays
        # made so far are attributes, then packed into ``arrays``)
        arrays = self.__dict__.get("arrays")
        if arrays is not None and name in _FIELDS:
            return getattr(arrays, name)
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")

    def _assemble(self) -> None:
        """The arrays of a build or derivation (attributes so far) as the one
        :attr:`arrays` struct; sizes the build read off them."""
        x = self._x
        made = {name: getattr(self, name) for name in _INDEX_FIELDS}
        self.arrays = OpIndexArrays(
            **made, x_op=x["op"], x_lo=x["lo"], x_hi=x["hi"], x_set_start=x["set_start"], x_set_stop=x["set_stop"],
            x_aux=x["aux"], set_values=self.set_values, always_pos=np.asarray(self.always_pos, np.int64),
            sig_bits=self.signature_bits, use_sig=self.variant == "full", use_rank=bool(self.use_rank))
        for name in _FIELDS:
            self.__dict__.pop(name, None)
        self.n_counters = len(self.arrays.counter_init)
        self.n_entries = len(self.arrays.ent_val)
        self.n_partitions = len(self.arrays.part_counter_start) - 1

    # ------------------------------------------------------------------ build
    def _build(self) -> None:
        """A whole index from the segment (§4): normal forms, pivots,
        counters, entries sorted per list, segment directories."""
        seg = self.segment
        self._code_predicates()
        preds = seg.predicates
        n_subs = len(seg)
        self._start_table()
        self.n_attrs = n_attrs = int(preds.attr.max()) + 1 if len(preds) else 1
        self._string_attr = self._string_attributes(n_attrs)
        # Δ(A) from the subscriptions: predicates on A after the §4.2
        # rewrites (an IN list counts its values, BETWEEN two comparisons)
        self._sub_freq = self._predicate_frequency(seg, np.arange(n_subs), n_attrs)
        self._attr_key = self._frequency_key(self._sub_freq)
        conj = self._conjunctions(np.arange(n_subs, dtype=np.int64), whole=True)
        self._finish_extension()
        rows = self._row_arrays(None)
        units = self._place(conj, rows)
        self.always_pos = units["always"]
        self._sub_form = conj["form"]
        self._count_forms()

        # ---- counters (V_{A}): grouped by pivot partition
        used = np.bincount(units["pivot"], minlength=n_attrs) > 0
        compact = np.cumsum(used) - 1
        n_parts = int(used.sum())
        counter_item, part_counter_start = K.counting_order(compact[units["pivot"]], n_parts)
        self.part_counter_start = part_counter_start
        self.pivot_of_attr = np.where(used, compact, -1).astype(np.int32)
        self._set_counters(units["init"][counter_item], units["sub"][counter_item])

        # ---- operand ranks (the lists' sort key)
        prefix_ok, prefix_lo, prefix_hi = self._prefix_bounds(None)
        side_values = prefix_hi + list_codes(self._x["op"], self._x["aux"])     # (each 0 where the other is not)
        self._vals_plain, self._vals_string = self._operands(None)
        vals = self._set_vals(prefix_lo[prefix_ok])
        info, set_rank, prefix_rank = self._pack(rows, vals, prefix_ok, prefix_lo)
        vals = np.concatenate((vals, [0.0]))        # (ranks of unused rows may point one past the end)

        # ---- entries, sorted by (list, attribute, operand)
        (e_list, e_attr, e_rank, e_target, self.counter_post_start, self.post_attr, self.slot_counter,
         self.part_slot_start) = K.emit_entries(
            counter_item, units["n_units"], part_counter_start, units["unit_off"], units["unit_pids"],
            units["copy_clause_off"], units["clause_off"], units["clause_pids"], info, _LIST_CONJ, _LIST_CNF,
            set_rank)
        n_lists = n_parts * N_LISTS
        order, list_offsets = K.counting_order(e_list, n_lists)
        K.sort_within_lists(list_offsets, order, e_attr, e_rank, max(len(vals), len(rows["op"])) + 1, prefix_rank)
        s_attr, s_val, s_target, side_pid, self.side_hi, self.list_side_base = K.gather_sorted(
            order, list_offsets, e_list, e_attr, e_rank, e_target, vals, prefix_rank, side_values, self.use_rank)
        del e_list, e_attr, e_rank, e_target, order
        self._set_lists(list_offsets, s_attr, s_val, s_target, side_pid)
        self._has_prefix = bool(prefix_ok.any())
        # the update bookkeeping (see merged)
        self.merges = 0
        self._built_subs = n_subs
        self._churn = 0
        self._assemble()

    def _code_predicates(self) -> None:
        preds = self.segment.predicates
        if preds.lo is None or preds.set_offsets is None:
            if self.schema is None:
                raise ValueError("the segment's predicates are not coded yet: recode them or pass schema=")
            preds.recode(self.schema)
        self._coded = (preds.coded_version, preds.lo, preds.hi, preds.set_values)
        # the dictionary the string codes of this index come from: its first
        # _n_strings strings (ids are stable, the dictionary only grows);
        # unknown (None) when the predicates were coded under another version
        schema = self.schema
        self._n_strings = schema.n_strings if schema is not None and preds.coded_version == schema.version \
            else None

    def _start_table(self) -> None:
        """The distinct-predicate table, to be extended by the negations the
        normal forms need (:meth:`_pid`)."""
        preds = self.segment.predicates
        self._x = {"attr": preds.attr.astype(np.int32, copy=False), "op": preds.op.astype(np.int8, copy=False),
                   "lo": preds.lo, "hi": preds.hi, "aux": preds.aux,
                   "set_start": preds.set_offsets[:-1], "set_stop": preds.set_offsets[1:]}
        self._extra = {k: [] for k in self._x}
        self._negated: dict[int, int] = {}

    def _string_attributes(self, n_attrs: int) -> np.ndarray:
        """Per attribute id: is it a string attribute (its codes move when the
        dictionary grows)?  All False without a schema."""
        out = np.zeros(n_attrs, dtype=np.bool_)
        schema = self.schema
        if schema is not None:
            names = schema.attr_names[:n_attrs]
            out[:len(names)] = [schema.families.get(name) is Family.STRING for name in names]
        return out

    def _predicate_frequency(self, seg: Segment, positions: np.ndarray, n_attrs: int) -> np.ndarray:
        """Predicates per attribute in the programs of ``positions``, after
        the §4.2 rewrites."""
        preds = seg.predicates
        if len(positions) == len(seg):
            leaves = seg.prog_arg[seg.prog_kind == opcodes.LEAF]
        else:
            part = seg.take(positions)
            leaves = part.prog_arg[part.prog_kind == opcodes.LEAF]
        rewritten = np.ones(len(preds), np.int64)
        is_in = preds.op == opcodes.IN
        rewritten[is_in] = np.diff(preds.set_offsets)[is_in]
        rewritten[preds.op == opcodes.BETWEEN] = 2
        return np.bincount(preds.attr[leaves].astype(np.int64), weights=rewritten[leaves],
                           minlength=n_attrs)[:n_attrs].astype(np.int64)

    def _frequency_key(self, sub_freq: np.ndarray) -> np.ndarray:
        """Δ(A) as one sortable key: the event log's frequency, subscription
        frequency breaking ties; the subscriptions' alone without a log."""
        if self.event_log is None:
            return sub_freq.astype(np.int64)
        ev_freq = _attr_frequency(self.event_log, len(sub_freq))
        return ev_freq * (int(sub_freq.max(initial=0)) + 1) + sub_freq

    def _conjunctions(self, positions: np.ndarray, whole: bool = False) -> dict:
        """The simple subscriptions of the subscriptions at ``positions``
        (§6.1): plain conjunctions as they are, other expressions through
        their DNF (one unit per conjunction) or CNF (one copy per pivot of
        the pivot set, clauses in CSR), or always checked.  Unit and clause
        predicate ids are rows of the extended table."""
        seg = self.segment
        part = seg if whole else seg.take(positions)
        plain = K.plain_conjunctions(part.prog_offsets, part.prog_kind, part.prog_arg) if len(part) else \
            np.zeros(0, bool)
        plain_local = np.flatnonzero(plain)
        u_off, u_pids = K.plain_units(plain_local, part.prog_offsets, part.prog_kind, part.prog_arg)
        form = np.zeros(len(positions), np.int8)          # FORMS index; plain = 0
        always = []
        g_sub, g_off, g_pids = [], [0], []
        copy_sub, copy_pivot, copy_clause_off, clause_off, clause_pids = [], [], [0], [0], []
        for local in np.flatnonzero(~plain):
            pos = int(positions[local])
            kind, parts = self._normal_form(pos)
            form[local] = FORMS.index(kind)
            if kind == "dnf":
                for conj in parts:
                    g_sub.append(pos)
                    g_pids.extend(conj)
                    g_off.append(len(g_pids))
            elif kind == "cnf":
                pivots, clauses = parts
                for attr in pivots:
                    copy_sub.append(pos)
                    copy_pivot.append(int(attr))
                    for clause in clauses:
                        clause_pids.extend(clause)
                        clause_off.append(len(clause_pids))
                    copy_clause_off.append(len(clause_off) - 1)
            elif kind == "always":
                always.append(pos)
        unit_sub = np.concatenate((positions[plain_local], np.array(g_sub, np.int64)))
        unit_off = np.concatenate((u_off, np.array(g_off[1:], np.int64) + len(u_pids)))
        unit_pids = np.concatenate((u_pids, np.array(g_pids, np.int64)))
        return {"form": form, "always": always, "unit_sub": unit_sub.astype(np.int64), "unit_off": unit_off,
                "unit_pids": unit_pids, "copy_sub": np.array(copy_sub, np.int64),
                "copy_pivot": np.array(copy_pivot, np.int64), "copy_clause_off": np.array(copy_clause_off, np.int64),
                "clause_off": np.array(clause_off, np.int64), "clause_pids": np.array(clause_pids, np.int64)}

    def _row_arrays(self, rows) -> dict:
        """What building reads of the extended-table rows ``rows`` (None:
        every row), indexed by their place in ``rows``: entry counts per
        predicate after the §4.2 rewrites (in a conjunction, in a CNF
        clause), counter weights, findability, and IN lists (``set_start``
        into ``set_values``)."""
        x = self._x
        if rows is None:
            r = {key: x[key] for key in ("attr", "op", "lo", "hi")}
            r["set_start"], r["set_values"] = x["set_start"], self.set_values
            set_len = (x["set_stop"] - x["set_start"]).astype(np.int64)
        else:
            r = {key: x[key][rows] for key in ("attr", "op", "lo", "hi")}
            set_len = (x["set_stop"][rows] - x["set_start"][rows]).astype(np.int64)
            # the rows' IN lists, gathered into their own CSR
            starts = x["set_start"][rows]
            r["set_start"] = np.concatenate(([0], np.cumsum(set_len)[:-1])).astype(np.int64)
            r["set_values"] = self.set_values[np.repeat(starts - r["set_start"], set_len)
                                              + np.arange(int(set_len.sum()))]
        op = r["op"].astype(np.int64)
        n_conj = np.ones(len(op), np.int64)
        n_conj[op == opcodes.IN] = set_len[op == opcodes.IN]
        n_conj[op == opcodes.BETWEEN] = 2
        n_conj[op == opcodes.IS_NULL] = 0
        n_cnf = n_conj.copy()
        n_cnf[op == opcodes.BETWEEN] = 1
        weight = np.ones(len(op), np.int64)
        weight[op == opcodes.BETWEEN] = 2
        weight[op == opcodes.IS_NULL] = 0
        r.update(n_conj=n_conj, n_cnf=n_cnf, weight=weight, findable=op != opcodes.IS_NULL)
        return r

    def _place(self, conj: dict, rows: dict) -> dict:
        """Pivots and counters of the simple subscriptions (§4.1): each
        conjunction's pivot (eq. 1) and initial count; a subscription with
        a conjunction no event attribute can find is checked on every event
        instead.  (A CNF subscription has pivots by construction: its
        clauses hold no IS NULL.)  Predicate ids in ``conj`` are indexes of
        ``rows``."""
        unit_sub, unit_off, unit_pids = conj["unit_sub"], conj["unit_off"], conj["unit_pids"]
        pivot, init = K.choose_pivots(unit_off, unit_pids, rows["attr"], rows["findable"], self._attr_key,
                                      rows["weight"])
        always = np.unique(np.concatenate((np.array(conj["always"], np.int64), unit_sub[pivot < 0])))
        if len(always):
            keep = np.flatnonzero(~np.isin(unit_sub, always))
            lens = np.diff(unit_off)[keep]
            gather = np.repeat(unit_off[:-1][keep] - np.concatenate(([0], np.cumsum(lens)[:-1])), lens) \
                + np.arange(int(lens.sum()))
            unit_pids = unit_pids[gather]
            unit_off = np.concatenate(([0], np.cumsum(lens))).astype(np.int64)
            unit_sub, pivot, init = unit_sub[keep], pivot[keep], init[keep]
        copy_clause_off = conj["copy_clause_off"]
        return {"always": always, "n_units": len(unit_sub), "unit_off": unit_off, "unit_pids": unit_pids,
                "copy_clause_off": copy_clause_off, "clause_off": conj["clause_off"],
                "clause_pids": conj["clause_pids"],
                # one counter per unit, then per CNF copy (its count: clauses)
                "pivot": np.concatenate((pivot, conj["copy_pivot"])),
                "init": np.concatenate((init, np.diff(copy_clause_off))),
                "sub": np.concatenate((unit_sub, conj["copy_sub"]))}

    def _count_forms(self) -> None:
        counts = np.bincount(self._sub_form, minlength=len(FORMS))
        self.form_counts = {name: int(n) for name, n in zip(FORMS, counts)}
        # (a conjunction of IS NULL tests puts a plain or DNF subscription there too)
        self.form_counts["always"] = len(self.always_pos)

    def _set_counters(self, init: np.ndarray, sub: np.ndarray) -> None:
        top = init.max(initial=0)     # counters as narrow as the largest conjunction allows
        dtype = np.int8 if top <= np.iinfo(np.int8).max else np.int16 if top <= np.iinfo(np.int16).max \
            else np.int32
        self.counter_init = init.astype(dtype)
        self.counter_sub = sub.astype(np.int32 if len(self.segment) < 2 ** 31 else np.int64)

    def _operands(self, rows) -> tuple[np.ndarray, np.ndarray]:
        """The distinct range-scanned operands of the extended-table rows
        ``rows`` (None: all), those of non-string and of string attributes
        apart: string codes move when the dictionary grows, values do not."""
        x = self._x
        if rows is None:
            op, attr, lo, hi = x["op"], x["attr"], x["lo"], x["hi"]
            set_values = self.set_values
            base = self.segment.predicates
            set_attr = np.repeat(base.attr, np.diff(base.set_offsets))
        else:
            op, attr, lo, hi = x["op"][rows], x["attr"][rows], x["lo"][rows], x["hi"][rows]
            is_set = np.isin(op, (opcodes.IN, opcodes.NOT_IN))
            lens = (x["set_stop"][rows] - x["set_start"][rows])[is_set]
            starts = x["set_start"][rows][is_set]
            set_values = self.set_values[np.repeat(starts - np.concatenate(([0], np.cumsum(lens)[:-1])), lens)
                                         + np.arange(int(lens.sum()))]
            set_attr = np.repeat(attr[is_set], lens)
        valued = np.isin(op, _VALUED)
        between = op == opcodes.BETWEEN
        values = np.concatenate((lo[valued], hi[between], set_values))
        string = self._string_attr[np.concatenate((attr[valued], attr[between], set_attr)).astype(np.int64)]
        return np.unique(values[~string]), np.unique(values[string])

    def _set_vals(self, prefix_lo: np.ndarray) -> np.ndarray:
        """The distinct operands ``vals`` and whether entries store them as
        ranks: operands as 2 * rank + 1 among the distinct operands (an
        event value becomes 2 * #operands below it, + 1 if it is one): exact
        comparisons in 16 bits; raw float64 operands beyond 32767 of them."""
        vals = np.unique(np.concatenate((self._vals_plain, self._vals_string, prefix_lo)))
        fits = 2 * len(vals) + 1 <= np.iinfo(np.uint16).max
        self.use_rank = fits if self.operand_ranks is None else bool(self.operand_ranks) and fits
        self.vals = vals
        return vals

    def _pack(self, rows: dict, vals: np.ndarray, prefix_ok, prefix_lo):
        """:func:`~gpu_kernels.opindex.cpu.pack_predicates` of the rows, the
        ranks of their IN-list values and of their prefix intervals."""
        rank_lo = np.searchsorted(vals, rows["lo"]).astype(np.int64)
        rank_hi = np.searchsorted(vals, rows["hi"]).astype(np.int64)
        set_rank = np.searchsorted(vals, rows["set_values"]).astype(np.int64)
        prefix_rank = np.searchsorted(vals, prefix_lo).astype(np.int64)
        info = K.pack_predicates(rows["attr"], rows["op"], prefix_ok, rows["n_conj"], rows["n_cnf"], rank_lo, rank_hi,
                                 rows["set_start"])
        return info, set_rank, prefix_rank

    def _set_lists(self, list_offsets, s_attr, s_val, s_target, side_pid) -> None:
        """The sorted entries in their final form, and the segment directory
        and signatures over them (§4.2)."""
        self.list_offsets = list_offsets
        self.side_pid = side_pid.astype(np.int32 if len(self._x["op"]) < 2 ** 31 else np.int64)
        # counter pointers relative to the partition: 16 bits when partitions are small
        widest = max(int(np.diff(self.part_counter_start).max(initial=0)),
                     int(np.diff(self.part_slot_start).max(initial=0)))
        self.ent_target = s_target.astype(np.int16) if widest < np.iinfo(np.int16).max else s_target
        attr_bits = int(self.n_attrs - 1).bit_length()
        max_log2 = int(self.n_segments).bit_length() - 1
        (self.run_attr, self.run_start, self.list_shift, self.list_bucket_base, self.bucket_run_start,
         self.bucket_sig) = K.build_directory(list_offsets, s_attr, s_val, self.n_attrs, attr_bits, max_log2,
                                              self.signature_bits, self.variant == "full")
        self.ent_val = s_val.astype(np.uint16) if self.use_rank else s_val

    # ---------------------------------------------------------------- updates
    #: a merge rebuilds the whole index once the subscriptions added and
    #: removed since the last full build exceed this share of that build's
    #: subscriptions: pivots keep the attribute frequencies of that build
    #: (§4.1, as the paper's inserts do), and dropped operands stay in ``vals``
    REBUILD_SHARE = 0.5

    def merged(self, segment: Segment, old_to_new, added, schema=None) -> "OpIndexMatcher":
        """The matcher of ``segment``, the Index's next main segment, derived
        from this one (the Index's merge protocol, docs/architecture.md#the-index-life-cycle).

        ``old_to_new[p]`` is the position in ``segment`` of the subscription
        at position ``p`` of this matcher's segment (-1: removed), whose
        program is unchanged but for predicate ids; ``added`` are the
        positions of the other subscriptions of ``segment``.  Removed
        subscriptions lose their counters and entries; survivors keep their
        pivots, renumbered; added ones are built as a full build builds them
        (pivots from the frozen frequencies) and their entries merged into
        the sorted lists, whose directories and signatures are then rebuilt
        (one linear pass).  Returns a new matcher (this one is unchanged):
        derived, or built from scratch when deriving is not worth it or not
        possible -- the churn since the last full build beyond
        :attr:`REBUILD_SHARE`, an empty side, or no schema to follow the
        string dictionary with.  ``merges`` counts the derivations since the
        last full build.  ``schema``: the (newer) schema or schema view
        ``segment`` is coded under, when it is not this matcher's."""
        this = self if schema is None or schema is self.schema else self._reading(schema)
        return this._merged(segment, old_to_new, added)

    def _merged(self, segment: Segment, old_to_new, added) -> "OpIndexMatcher":
        old_to_new = np.asarray(old_to_new, dtype=np.int64)
        added = np.asarray(added, dtype=np.int64)
        if len(old_to_new) != len(self.segment):
            raise ValueError(f"old_to_new has {len(old_to_new)} positions, the segment {len(self.segment)}")
        n_removed = int((old_to_new < 0).sum())
        churn = self._churn + len(added) + n_removed
        if self.schema is not None and self._n_strings is not None and len(self.segment) and len(segment) \
                and churn <= self.REBUILD_SHARE * self._built_subs:
            segment = segment.coded(self.schema)
            derived = self._derive(segment, old_to_new, added, churn)
            if derived is not None:
                derived.merges = self.merges + 1
                return derived
        return self._fresh(segment)

    def _derive(self, segment: Segment, old_to_new: np.ndarray, added: np.ndarray, churn: int):
        """:meth:`merged`'s derivation; None when the old index cannot be
        followed (a surviving program that changed)."""
        new = copy.copy(self)
        new.segment = segment
        new._live = None
        new._code_predicates()
        preds = segment.predicates
        n_attrs = new.n_attrs = max(self.n_attrs, int(preds.attr.max()) + 1 if len(preds) else 1)
        new._string_attr = new._string_attributes(n_attrs)
        new._start_table()
        x_map = self._x_map(new, old_to_new)
        if x_map is None:
            return None
        # ---- Δ(A) stays that of the last full build; attributes it did not see
        # get their frequency among the added subscriptions
        sub_freq = np.zeros(n_attrs, np.int64)
        sub_freq[:len(self._sub_freq)] = self._sub_freq
        new._sub_freq = np.where(sub_freq > 0, sub_freq, new._predicate_frequency(segment, added, n_attrs))
        new._attr_key = new._frequency_key(new._sub_freq)

        # ---- the added subscriptions' simple subscriptions, over the rows they use
        conj = new._conjunctions(added)
        new._finish_extension()
        pids = np.unique(np.concatenate((conj["unit_pids"], conj["clause_pids"])))
        rows = new._row_arrays(pids)
        conj["unit_pids"] = np.searchsorted(pids, conj["unit_pids"])
        conj["clause_pids"] = np.searchsorted(pids, conj["clause_pids"])
        units = new._place(conj, rows)
        old_always = old_to_new[self.always_pos]
        new.always_pos = np.unique(np.concatenate((old_always[old_always >= 0], units["always"])))
        form = np.zeros(len(segment), np.int8)
        kept = np.flatnonzero(old_to_new >= 0)
        form[old_to_new[kept]] = self._sub_form[kept]
        form[added] = conj["form"]
        new._sub_form = form
        new._count_forms()

        # ---- counters: the survivors, in their order, then the added ones,
        # per partition (so the survivors' partition-relative pointers only
        # shift by the removed counters before them); partitions in attribute order
        n_old_parts = len(self.part_counter_start) - 1
        part_attr = np.flatnonzero(self.pivot_of_attr >= 0)     # (ids ascend with the attribute)
        part_of_counter = np.repeat(np.arange(n_old_parts), np.diff(self.part_counter_start))
        keep = np.flatnonzero(old_to_new[self.counter_sub] >= 0)
        used = np.zeros(n_attrs, bool)
        used[part_attr[part_of_counter[keep]]] = True
        used[units["pivot"]] = True
        compact = np.cumsum(used) - 1
        n_parts = int(used.sum())
        part_map = np.where(used[part_attr], compact[part_attr], -1).astype(np.int64)
        key_old = part_map[part_of_counter[keep]]
        key_add = compact[units["pivot"]].astype(np.int64)
        order, new.part_counter_start = K.counting_order(np.concatenate((key_old, key_add)), n_parts)
        new_id = np.empty(len(order), np.int64)
        new_id[order] = np.arange(len(order))
        counter_map = np.full(self.n_counters, -1, np.int64)
        counter_map[keep] = new_id[:len(keep)]
        new.pivot_of_attr = np.where(used, compact, -1).astype(np.int32)
        new._set_counters(np.concatenate((self.counter_init[keep].astype(np.int64), units["init"]))[order],
                          np.concatenate((old_to_new[self.counter_sub[keep]], units["sub"]))[order])

        # ---- operands: the old ones (string codes moved to the current
        # dictionary) and the added subscriptions'; PREFIX intervals afresh
        code_map = self._code_map()
        vals_string = self._vals_string
        if len(code_map):
            vals_string = code_map[((vals_string - 1) // 2).astype(np.int64)]
        add_plain, add_string = new._operands(pids)
        new._vals_plain = np.union1d(self._vals_plain, add_plain)
        new._vals_string = np.union1d(vals_string, add_string)
        old_prefix = x_map[self._side_pids(L_PREFIX)]
        old_prefix = np.unique(old_prefix[old_prefix >= 0])
        old_ok, old_lo, old_hi = new._prefix_bounds(old_prefix)
        add_ok, add_lo, add_hi = new._prefix_bounds(pids)
        vals = new._set_vals(np.concatenate((old_lo[old_ok], add_lo[add_ok])))
        info, set_rank, _ = new._pack(rows, vals, add_ok, add_lo)
        # per row of the new table: PREFIX operands, and side values (side_hi):
        # PREFIX interval ends, list operators' list codes
        n_x = len(new._x["op"])
        prefix_val, side_values = np.zeros(n_x), list_codes(new._x["op"], new._x["aux"])
        for where, ok, lo, hi in ((old_prefix, old_ok, old_lo, old_hi), (pids, add_ok, add_lo, add_hi)):
            prefix_val[where[ok]] = new._stored(lo[ok])
            side_values[where[ok]] = hi[ok]
        new._has_prefix = bool(old_ok.any() or add_ok.any())

        # ---- the added entries, in the merged partitions
        add_item, add_part_start = K.counting_order(key_add, n_parts)
        (e_list, e_attr, e_rank, e_target, post_start, post_attr, slot_counter, part_slots) = K.emit_entries(
            add_item, units["n_units"], add_part_start, units["unit_off"], units["unit_pids"],
            units["copy_clause_off"], units["clause_off"], units["clause_pids"], info, _LIST_CONJ, _LIST_CNF,
            set_rank)
        add_counter = new_id[len(keep):][add_item]      # merged id of each emitted counter

        # ---- clause slots: as counters, survivors first per partition
        part_of_slot = np.repeat(np.arange(n_old_parts), np.diff(self.part_slot_start))
        slot_keep = np.flatnonzero(counter_map[self.slot_counter] >= 0)
        slot_key_old = part_map[part_of_slot[slot_keep]]
        slot_order, new.part_slot_start = K.counting_order(
            np.concatenate((slot_key_old, np.repeat(np.arange(n_parts), np.diff(part_slots)))), n_parts)
        slot_id = np.empty(len(slot_order), np.int64)
        slot_id[slot_order] = np.arange(len(slot_order))
        slot_map = np.full(len(self.slot_counter), -1, np.int64)
        slot_map[slot_keep] = slot_id[:len(slot_keep)]
        new.slot_counter = np.concatenate((counter_map[self.slot_counter[slot_keep]],
                                           add_counter[slot_counter]))[slot_order].astype(np.int64)
        # added pointers come after the partition's survivors
        e_part = e_list.astype(np.int64) >> 3
        e_target = np.where(e_target >= 0, e_target + np.bincount(key_old, minlength=n_parts)[e_part],
                            e_target - np.bincount(slot_key_old, minlength=n_parts)[e_part])

        # ---- IS NULL tests per counter, in the merged counter order
        self._merge_posts(new, keep, order, add_item, post_start, post_attr)

        # ---- entries: the added ones sorted, then merged into the old lists
        special = (e_list & 7) >= L_VERIFY
        add_pid = np.where(special, pids[np.where(special, e_rank, 0)] if len(pids) else -1, -1).astype(np.int64)
        stored = np.where(special, 0.0, new._stored_rank(np.where(special, 0, e_rank)))
        stored = np.where((e_list & 7) == L_PREFIX, prefix_val[np.maximum(add_pid, 0)], stored)
        add_key = np.where((e_list & 7) == L_VERIFY, add_pid.astype(np.float64), stored)
        first = np.lexsort((add_key, e_attr, e_list))
        if self.use_rank:
            old_vals = self.vals
            enc_plain = new._stored(old_vals)
            enc_string = enc_plain
            if len(code_map):
                k = (old_vals - 1) // 2
                odd = (old_vals == np.floor(old_vals)) & (k >= 0) & (k < len(code_map))
                moved = old_vals.copy()
                moved[odd] = code_map[k[odd].astype(np.int64)]
                enc_string = new._stored(moved)
        else:
            enc_plain = enc_string = np.zeros(1)
        n_lists = n_parts * N_LISTS
        s_attr, s_val, s_target, side_pid, side_hi, list_offsets, unsorted = K.merge_entries(
            self.list_offsets, self.run_attr, self.run_start, self.ent_val, self.ent_target, self.side_pid,
            self.list_side_base, self.part_counter_start, self.part_slot_start,
            part_map, counter_map, slot_map, new.part_counter_start, new.part_slot_start,
            self.use_rank, enc_plain, enc_string, new._string_attr, code_map, vals, new.use_rank,
            x_map, prefix_val, side_values,
            e_list[first].astype(np.int64), e_attr[first], stored[first], add_key[first],
            e_target[first].astype(np.int64), add_pid[first], n_lists)
        sizes = np.diff(list_offsets)
        side_sizes = np.where((np.arange(n_lists) & 7) >= L_VERIFY, sizes, 0)
        new.list_side_base = np.concatenate(([0], np.cumsum(side_sizes)[:-1])).astype(np.int64) - list_offsets[:-1] \
            if n_lists else np.zeros(0, np.int64)
        if unsorted:
            K.sort_runs(list_offsets, new.list_side_base, s_attr, s_val, s_target, side_pid, side_hi)
        new.side_hi = side_hi
        new._set_lists(list_offsets, s_attr, s_val, s_target, side_pid)
        new._churn = churn
        new._assemble()
        return new

    def _x_map(self, new: "OpIndexMatcher", old_to_new: np.ndarray):
        """Old extended-table row -> the new matcher's row (-1: not needed),
        for the rows surviving VERIFY and PREFIX entries name -- the only
        entries that name predicates.  Read off the programs of their
        subscriptions, old and new side by side (the same programs but for
        predicate ids); their negations are re-created in the new table.
        None when a program differs."""
        x_map = np.full(len(self._x["op"]), -1, np.int64)
        subs = np.unique(self.counter_sub[self._entry_counters(self._special_entries())])
        subs = subs[old_to_new[subs] >= 0]
        if not len(subs):
            return x_map
        before, after = self.segment.take(subs), new.segment.take(old_to_new[subs])
        if not (np.array_equal(before.prog_offsets, after.prog_offsets)
                and np.array_equal(before.prog_kind, after.prog_kind)):
            return None
        leaves = before.prog_kind == opcodes.LEAF
        old_pids, new_pids = before.prog_arg[leaves], after.prog_arg[leaves]
        for old_column, new_column in zip(self.segment.predicates.key_columns(), new.segment.predicates.key_columns()):
            if not np.array_equal(old_column[old_pids], new_column[new_pids]):
                return None
        x_map[old_pids] = new_pids
        for base, row in sorted(self._negated.items(), key=lambda item: item[1]):
            if x_map[base] >= 0:
                x_map[row] = new._negation(int(x_map[base]), int(self._x["op"][row]))
        return x_map

    def _special_entries(self, lst: int | None = None) -> np.ndarray:
        """Entry indexes of the VERIFY and PREFIX lists (or of list operator ``lst``)."""
        starts, stops = self.list_offsets[:-1], self.list_offsets[1:]
        ops = np.arange(len(starts)) & 7
        chosen = np.flatnonzero((ops >= L_VERIFY) if lst is None else (ops == lst))
        lens = (stops - starts)[chosen]
        return np.repeat(starts[chosen] - np.concatenate(([0], np.cumsum(lens)[:-1])), lens) \
            + np.arange(int(lens.sum()))

    def _side_pids(self, lst: int) -> np.ndarray:
        """The predicate ids of the entries of list operator ``lst`` (VERIFY or PREFIX)."""
        entries = self._special_entries(lst)
        lists = np.searchsorted(self.list_offsets, entries, side="right") - 1
        return self.side_pid[entries + self.list_side_base[lists]].astype(np.int64)

    def _entry_counters(self, entries: np.ndarray) -> np.ndarray:
        """The counter each entry decrements (a clause slot's counter for CNF)."""
        part = (np.searchsorted(self.list_offsets, entries, side="right") - 1) >> 3
        t = self.ent_target[entries].astype(np.int64)
        out = np.empty(len(entries), np.int64)
        conj = t >= 0
        out[conj] = self.part_counter_start[part[conj]] + t[conj]
        out[~conj] = self.slot_counter[self.part_slot_start[part[~conj]] - t[~conj] - 1]
        return out

    def _code_map(self) -> np.ndarray:
        """Rank of a string in the dictionary this index was coded with ->
        its code now; empty when no such code moved."""
        n_old = self._n_strings
        if n_old == self.schema.n_strings:
            return np.zeros(0)
        code_map = np.sort(self.schema.codes_of_string_ids(np.arange(n_old)))
        if np.array_equal(code_map, 2.0 * np.arange(n_old) + 1.0):
            return np.zeros(0)
        return code_map

    def _stored(self, values: np.ndarray) -> np.ndarray:
        """Operand values as the entries store them (2 * rank + 1, or raw)."""
        values = np.asarray(values, dtype=np.float64)
        return 2.0 * np.searchsorted(self.vals, values) + 1.0 if self.use_rank else values

    def _stored_rank(self, ranks: np.ndarray) -> np.ndarray:
        """Ranks among ``vals`` as the entries store them."""
        ranks = np.asarray(ranks, dtype=np.int64)
        return 2.0 * ranks + 1.0 if self.use_rank else np.concatenate((self.vals, [0.0]))[ranks]

    def _merge_posts(self, new, keep, order, add_item, post_start, post_attr) -> None:
        """The merged IS NULL tests (CSR per counter): the survivors' and the
        added counters', in the merged counter order."""
        has_old, has_add = len(self.counter_post_start) > 1, len(post_start) > 1
        if not (has_old or has_add):
            new.counter_post_start, new.post_attr = np.zeros(1, np.int64), np.zeros(0, np.int32)
            return
        old_start = self.counter_post_start if has_old else np.zeros(self.n_counters + 1, np.int64)
        add_start = post_start if has_add else np.zeros(len(add_item) + 1, np.int64)
        emitted = np.empty(len(add_item), np.int64)        # emitted index of each added counter
        emitted[add_item] = np.arange(len(add_item))
        starts = np.concatenate((old_start[keep], add_start[emitted] + len(self.post_attr)))[order]
        lens = np.concatenate((np.diff(old_start)[keep], np.diff(add_start)[emitted]))[order]
        offsets = np.concatenate(([0], np.cumsum(lens))).astype(np.int64)
        values = np.concatenate((self.post_attr, post_attr)).astype(np.int32)
        new.post_attr = values[np.repeat(starts - offsets[:-1], lens) + np.arange(int(offsets[-1]))]
        new.counter_post_start = offsets

    # ------------------------------------------------------ normal forms (§6.1)
    def _tree(self, pos: int) -> Node:
        """The subscription's NNF program as an AST whose leaves name
        predicate ids (``Pred(str(pid), op)``), for to_dnf / to_cnf."""
        return program_tree(self.segment, pos)

    def _pid(self, pred: Pred) -> int:
        """Predicate id of a normal-form leaf: the original, or its negation
        (same attribute and operands, negated operator: exact under
        three-valued logic) appended to the extended table."""
        pid = int(pred.attr)
        code = OPCODE[pred.op]
        if code == int(self._x["op"][pid]):
            return pid
        return self._negation(pid, code)

    def _negation(self, pid: int, code: int) -> int:
        """The extended-table row of predicate ``pid`` under operator ``code``
        (its negation), appended on first use."""
        found = self._negated.get(pid)
        if found is None:
            found = len(self._x["op"]) + len(self._extra["op"])
            for key in ("attr", "lo", "hi", "aux", "set_start", "set_stop"):
                self._extra[key].append(self._x[key][pid])
            self._extra["op"].append(code)
            self._negated[pid] = found
        return found

    def _finish_extension(self) -> None:
        if self._extra["op"]:
            for key, dtype in _X_DTYPES.items():
                self._x[key] = np.concatenate((self._x[key].astype(dtype, copy=False),
                                               np.array(self._extra[key], dtype)))
        else:
            self._x = {key: np.ascontiguousarray(self._x[key], dtype) for key, dtype in _X_DTYPES.items()}
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
    def _prefix_bounds(self, rows):
        """Per extended-table row of ``rows`` (None: all): is it a prefix
        LIKE with a code interval, and the interval [lo, hi] of the codes of
        the strings with that prefix (under the current dictionary)."""
        x = self._x
        op = x["op"] if rows is None else x["op"][rows]
        aux = x["aux"] if rows is None else x["aux"][rows]
        n = len(op)
        ok = np.zeros(n, dtype=np.bool_)
        lo = np.zeros(n)
        hi = np.zeros(n)
        schema = self.schema
        like = np.flatnonzero(op == opcodes.LIKE)
        if schema is None or not len(like):
            return ok, lo, hi
        patterns, inverse = np.unique(aux[like], return_inverse=True)
        p_ok = np.zeros(len(patterns), np.bool_)
        p_lo = np.zeros(len(patterns))
        p_hi = np.full(len(patterns), np.inf)
        prefixes, successors, with_successor = [], [], []
        for k, pattern_id in enumerate(patterns):
            kind, text = schema.patterns[int(pattern_id)]
            prefix = _like_prefix(text)
            if kind != "like" or prefix is None:
                continue
            p_ok[k] = True
            prefixes.append((k, prefix))
            succ = _successor(prefix)
            if succ is not None:
                successors.append(succ)
                with_successor.append(k)
        if prefixes:
            at, texts = zip(*prefixes)
            p_lo[list(at)] = schema.encode_strings(list(texts))
        if successors:
            # strings below the successor: codes up to the even code just under it
            p_hi[with_successor] = 2.0 * (schema.encode_strings(successors).astype(np.int64) >> 1)
        ok[like] = p_ok[inverse]
        lo[like] = np.where(ok[like], p_lo[inverse], 0.0)
        hi[like] = np.where(ok[like], p_hi[inverse], 0.0)
        return ok, lo, hi

    # ------------------------------------------------------------------ match
    @property
    def nbytes(self) -> int:
        """Host bytes: the segment, the index's arrays and what merges keep;
        an array shared with the segment (the extended table's rows, when
        the normal forms appended none) counts once."""
        seg = self.segment
        preds = seg.predicates
        shared = [a for a in (preds.attr, preds.op, preds.lo, preds.hi, preds.aux, preds.set_offsets,
                              preds.set_values) if a is not None]
        own = [a for a in self.arrays if isinstance(a, np.ndarray)]
        own += [self._x["attr"], self._sub_form, self._vals_plain, self._vals_string, self._sub_freq,
                self._attr_key, self._string_attr]
        return seg.nbytes + sum(a.nbytes for a in own if not any(np.may_share_memory(a, b) for b in shared))

    def _reading(self, schema) -> "OpIndexMatcher":
        """A shallow copy of this matcher that reads ``schema`` (a newer view
        of the same schema), so that a derivation maps the string codes
        that moved since; this matcher is unchanged."""
        this = copy.copy(self)
        this.schema = schema
        return this

    def recoded(self, segment: Segment, schema) -> "OpIndexMatcher":
        """This index for ``segment`` -- the same subscriptions, with
        predicates coded under ``schema``, a grown string dictionary -- as a
        new matcher (this one is unchanged: a concurrent match may be
        using it).  Re-encodes the operands and PREFIX intervals whose codes
        moved (a derivation that adds and removes nothing; old runs
        re-sorted where ties split), or keeps everything when nothing moved."""
        if segment is self.segment:
            return self
        this = self._reading(schema)
        this.segment = segment
        version, lo, hi, set_values = self._coded
        preds = segment.predicates
        same = (np.array_equal(lo, preds.lo) and np.array_equal(hi, preds.hi)
                and np.array_equal(set_values, preds.set_values))
        if same and not self._has_prefix:
            this._code_predicates()     # (nothing moved: the codes are those of the grown dictionary too)
            return this
        this._live = None
        if schema is not None and self._n_strings is not None and len(segment):
            derived = this._derive(segment, np.arange(len(segment)), np.zeros(0, np.int64), self._churn)
            if derived is not None:
                return derived
        return this._fresh(segment)

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

    def runs(self, batch, pattern_truth: np.ndarray, alive: np.ndarray) -> Runs:
        """The positions of every alive subscription TRUE on each event of
        ``batch``, ascending, where the kernel left them."""
        n_events = batch.n_events
        n_subs = len(self.segment)
        if n_events == 0 or n_subs == 0:
            return Runs.empty(n_events)
        alive = alive_flags(alive)
        pattern_truth = np.ascontiguousarray(pattern_truth, dtype=np.uint8)
        list_truth = list_truth_of(batch)
        list_words = list_bits_words(list_truth)
        index, programs = self.arrays, Programs.of(self.segment)
        counter_live = self._counter_live(alive, n_events)

        def launch(first, last, out, cap, ev_count, stop, need, serial):
            kernel = K.opindex_match_serial if serial else K.opindex_match_kernel
            kernel(first, last, out, cap, ev_count, stop, need, n_subs, batch.offsets, batch.attr, batch.value,
                   batch.token, pattern_truth, list_truth, list_words, index, programs, counter_live, alive)
        runs, self._matches_per_event = match_in_tasks(n_events, launch, self._matches_per_event)
        return runs

    # ------------------------------------------------------------ persistence
    #: the version of the saved form (meta "format")
    SAVED_FORMAT = 1
    #: what ``meta`` holds: key -> the type of its value
    _META = {"format": int, "variant": str, "segments": int, "signature_bits": int, "operand_ranks": (bool, None),
             "dnf_limit": int, "event_log": (str, None), "subscriptions": int, "predicates": int,
             "attributes": int, "strings": int, "use_rank": bool, "has_prefix": bool, "merges": int,
             "built_subs": int, "churn": int}
    #: the bookkeeping arrays saved besides the index: name -> dtype
    _SAVED_EXTRA = {"always_pos": np.int64, "negated_pid": np.int64, "negated_op": np.int8, "sub_form": np.int8,
                    "sub_freq": np.int64, "vals_plain": np.float64, "vals_string": np.float64}

    def _structure(self) -> dict:
        """The parameters that shape the index (what a restore must agree with)."""
        return {"variant": self.variant, "segments": self.n_segments, "signature_bits": self.signature_bits,
                "operand_ranks": self.operand_ranks, "dnf_limit": self.dnf_limit,
                "event_log": _log_digest(self.event_log, self.n_attrs)}

    def to_arrays(self) -> tuple[dict, dict[str, np.ndarray]] | None:
        """The built index as JSON-able ``meta`` and flat arrays: the
        :class:`~gpu_kernels.opindex.layout.OpIndexArrays` (the extended
        predicate table as the negated rows only: the others are the
        segment's) and what merges and recodes read -- forms, frequencies,
        operands by kind, the string count the codes come from, the churn
        counters.  None when the string dictionary of the codes is unknown
        (a matcher made without a schema): then the index is built on load."""
        if self._n_strings is None or self.schema is None:
            return None
        n_preds = len(self.segment.predicates)
        negated = sorted(self._negated.items(), key=lambda item: item[1])
        rows = np.array([row for _, row in negated], np.int64)
        if not np.array_equal(rows, n_preds + np.arange(len(rows))):
            raise AssertionError("the extended table's rows are not the segment's predicates then the negations")
        meta = {"format": self.SAVED_FORMAT, **self._structure(), "subscriptions": len(self.segment),
                "predicates": n_preds, "attributes": int(self.n_attrs), "strings": int(self._n_strings),
                "use_rank": bool(self.use_rank), "has_prefix": bool(self._has_prefix), "merges": int(self.merges),
                "built_subs": int(self._built_subs), "churn": int(self._churn)}
        arrays = {name: getattr(self.arrays, name) for name in _INDEX_FIELDS}
        arrays.update(always_pos=self.arrays.always_pos, negated_pid=np.array([pid for pid, _ in negated], np.int64),
                      negated_op=np.ascontiguousarray(self._x["op"][n_preds:], np.int8), sub_form=self._sub_form,
                      sub_freq=self._sub_freq, vals_plain=self._vals_plain, vals_string=self._vals_string)
        return meta, arrays

    @classmethod
    def from_arrays(cls, segment: Segment, settings, meta: dict, arrays: dict) -> "OpIndexMatcher":
        """The matcher :meth:`to_arrays` saved, restored over ``segment``
        (the same subscriptions, predicates coded under ``settings.schema``)
        without building: every array checked first
        (:func:`~gpu_kernels.opindex.layout.check_arrays` and the
        bookkeeping's own checks), then vectorised assembly.  When the
        dictionary grew past the strings the codes came from, the operands
        are re-encoded as :meth:`recoded` does.  ValueError for anything
        that does not fit: a damaged or crafted file, another segment, or
        options that shape the index differently (then build instead)."""
        if not isinstance(meta, dict) or not isinstance(arrays, dict):
            raise ValueError("saved OpIndex structure: meta must be a dict and arrays a dict of arrays")
        _check_meta(meta, cls._META)
        if meta["format"] != cls.SAVED_FORMAT:
            raise ValueError(f"saved OpIndex structure: format {meta['format']}, this version reads "
                             f"{cls.SAVED_FORMAT}")
        names = set(_INDEX_FIELDS) | set(cls._SAVED_EXTRA)
        if set(arrays) != names:
            missing, unknown = sorted(names - set(arrays)), sorted(set(arrays) - names)
            raise ValueError(f"saved OpIndex structure: arrays missing {missing}, unknown {unknown}")
        # (C order, as the kernels are compiled for; no copy of what is already)
        arrays = {name: np.ascontiguousarray(a) if isinstance(a, np.ndarray) else a for name, a in arrays.items()}
        for name, dtype in cls._SAVED_EXTRA.items():
            value = arrays[name]
            if not isinstance(value, np.ndarray) or value.ndim != 1 or value.dtype != np.dtype(dtype):
                raise ValueError(f"saved OpIndex structure: {name} must be a 1-D array of {np.dtype(dtype).name}")
        options = OpIndexOptions.from_mapping(None, "cpu") if settings.options is None else settings.options
        schema = settings.schema
        if schema is None:
            raise ValueError("saved OpIndex structure: restoring needs the schema its codes come from")
        keywords = cls._structure_keywords(options.keywords("cpu"))
        preds = segment.predicates
        n_subs, n_preds = len(segment), len(preds)
        if meta["subscriptions"] != n_subs or meta["predicates"] != n_preds:
            raise ValueError(f"saved OpIndex structure: built over {meta['subscriptions']} subscriptions and "
                             f"{meta['predicates']} predicates, the segment has {n_subs} and {n_preds}")
        n_attrs = meta["attributes"]
        seg_attrs = int(preds.attr.max()) + 1 if n_preds else 1
        if not seg_attrs <= n_attrs <= max(len(schema.attr_names), 1):
            raise ValueError(f"saved OpIndex structure: {n_attrs} attributes, the segment uses {seg_attrs} and the "
                             f"schema has {len(schema.attr_names)}")
        want = {"variant": keywords.get("variant", cls.variant), "segments": keywords["segments"],
                "signature_bits": keywords["signature_bits"], "operand_ranks": keywords["operand_ranks"],
                "dnf_limit": DEFAULT_LIMIT if settings.dnf_limit is None else int(settings.dnf_limit),
                "event_log": _log_digest(keywords["event_log"], n_attrs)}
        # a structure built with an event log is restored as it is when no log is given: its pivots are those
        # the log chose, and a log is not saved with the index (Index.save: passed to load again if wanted)
        differ = [key for key, value in want.items() if meta[key] != value
                  and not (key == "event_log" and value is None)]
        if differ:
            raise ValueError(f"saved OpIndex structure: built with other {', '.join(differ)} "
                             f"({', '.join(f'{k}={meta[k]!r}' for k in differ)})")

        # ---- the segment's predicates, coded under the schema
        if not 0 <= meta["strings"] <= schema.n_strings:
            raise ValueError(f"saved OpIndex structure: coded with {meta['strings']} strings, the schema has "
                             f"{schema.n_strings}")
        matcher = cls.__new__(cls)
        matcher._configure(segment, schema, keywords["event_log"], want["dnf_limit"], want["variant"],
                           want["segments"], want["signature_bits"], want["operand_ranks"])
        matcher._code_predicates()
        if preds.coded_version != schema.version:
            raise ValueError("saved OpIndex structure: the segment's predicates are coded under another schema")

        # ---- the extended predicate table: the segment's rows, then the negations
        neg_pid, neg_op = arrays["negated_pid"], arrays["negated_op"]
        if len(neg_op) != len(neg_pid) or (len(neg_pid) and (neg_pid.min() < 0 or neg_pid.max() >= n_preds)) \
                or len(np.unique(neg_pid)) != len(neg_pid):
            raise ValueError("saved OpIndex structure: negated_pid must be distinct predicate ids, one per negated_op")
        if len(neg_pid) and not np.array_equal(neg_op, _NEGATED_CODE[preds.op[neg_pid].astype(np.int64)]):
            raise ValueError("saved OpIndex structure: negated_op must hold the negations of its predicates")
        matcher._start_table()
        base = matcher._x
        matcher._x = {key: np.concatenate((base[key].astype(dtype, copy=False),
                                           neg_op if key == "op" else base[key][neg_pid].astype(dtype)))
                      if len(neg_pid) else np.ascontiguousarray(base[key], dtype) for key, dtype in _X_DTYPES.items()}
        matcher._negated = dict(zip(neg_pid.tolist(), range(n_preds, n_preds + len(neg_pid))))
        matcher._extra = None
        x = matcher._x
        index = OpIndexArrays(**{name: arrays[name] for name in _INDEX_FIELDS}, x_op=x["op"], x_lo=x["lo"],
                              x_hi=x["hi"], x_set_start=x["set_start"], x_set_stop=x["set_stop"], x_aux=x["aux"],
                              set_values=preds.set_values, always_pos=arrays["always_pos"],
                              sig_bits=want["signature_bits"], use_sig=want["variant"] == "full",
                              use_rank=meta["use_rank"])
        if len(index.pivot_of_attr) != n_attrs:
            raise ValueError(f"saved OpIndex structure: pivot_of_attr has {len(index.pivot_of_attr)} attributes, "
                             f"meta {n_attrs}")
        check_arrays(index, n_subs, x["attr"])

        # ---- the bookkeeping of merges and recodes
        sub_form, sub_freq = arrays["sub_form"], arrays["sub_freq"]
        if len(sub_form) != n_subs or (n_subs and (sub_form.min() < 0 or sub_form.max() >= len(FORMS))):
            raise ValueError("saved OpIndex structure: sub_form must hold one form per subscription")
        if n_subs and not np.array_equal(sub_form == 0, K.plain_conjunctions(
                segment.prog_offsets, segment.prog_kind, segment.prog_arg)):
            raise ValueError("saved OpIndex structure: its plain conjunctions are not the segment's")
        if len(sub_freq) != n_attrs or (sub_freq < 0).any():
            raise ValueError("saved OpIndex structure: sub_freq must hold a frequency >= 0 per attribute")
        matcher.n_attrs = n_attrs
        matcher._string_attr = matcher._string_attributes(n_attrs)
        n_strings = meta["strings"]
        has = np.zeros(n_subs, bool)
        has[index.counter_sub] = True
        always = np.zeros(n_subs, bool)
        always[index.always_pos] = True
        if (has & always).any() or not np.array_equal(has | always, sub_form != FORMS.index("never")):
            raise ValueError("saved OpIndex structure: every subscription but the constant FALSE ones must have "
                             "counters or be always checked, not both")
        vals_plain, vals_string = arrays["vals_plain"], arrays["vals_string"]
        for name, values in (("vals_plain", vals_plain), ("vals_string", vals_string)):
            if (len(values) > 1 and not (np.diff(values) > 0).all()) or np.isnan(values).any():
                raise ValueError(f"saved OpIndex structure: {name} must be strictly increasing")
        _check_codes("vals_string", vals_string, n_strings)
        if not np.isin(np.union1d(vals_plain, vals_string), index.vals).all():
            raise ValueError("saved OpIndex structure: vals must hold every operand")
        # the operands of the range-scanned entries: in vals_string (string attributes) or vals_plain
        ops = np.arange(len(index.list_offsets) - 1) & (N_LISTS - 1)
        ranged = np.repeat(ops < L_VERIFY, np.diff(index.list_offsets))
        string = matcher._string_attr[np.repeat(index.run_attr, np.diff(index.run_start))]
        string = string[ranged]
        if meta["use_rank"]:       # (per distinct operand, then gathered by rank)
            rank = (index.ent_val[ranged].astype(np.int64) - 1) >> 1
            fits = np.isin(index.vals, vals_string)[rank[string]].all() \
                and np.isin(index.vals, vals_plain)[rank[~string]].all()
        else:
            operand = index.ent_val[ranged]
            fits = np.isin(operand[string], vals_string).all() and np.isin(operand[~string], vals_plain).all()
        if not fits:
            raise ValueError("saved OpIndex structure: an entry's operand is not among the saved operands")
        matcher._sub_form, matcher._sub_freq = sub_form, sub_freq
        matcher._attr_key = matcher._frequency_key(sub_freq)
        matcher._vals_plain, matcher._vals_string = vals_plain, vals_string
        matcher._has_prefix = meta["has_prefix"]
        matcher.merges, matcher._built_subs, matcher._churn = meta["merges"], meta["built_subs"], meta["churn"]
        if min(matcher.merges, matcher._built_subs, matcher._churn) < 0:
            raise ValueError("saved OpIndex structure: negative merge counters")
        matcher.arrays = index
        matcher.n_counters, matcher.n_entries = len(index.counter_init), len(index.ent_val)
        matcher.n_partitions = len(index.part_counter_start) - 1
        matcher._count_forms()
        matcher.settings = settings
        matcher._n_strings = n_strings
        if n_strings == schema.n_strings:
            return matcher
        if not n_subs:
            raise ValueError("saved OpIndex structure: an empty index coded with an older dictionary")
        # the dictionary grew since: operands and PREFIX intervals follow it (as recoded does)
        derived = matcher._derive(segment, np.arange(n_subs, dtype=np.int64), np.zeros(0, np.int64), matcher._churn)
        if derived is None:
            raise ValueError("saved OpIndex structure: its predicates are not the segment's")
        return derived

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
            for op in range(N_LISTS):
                l = p * N_LISTS + op
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
                        if op == L_VERIFY:
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
    """OpIndex-BS (Zhang, Chan, Tan, PVLDB 2014, §7): the same index without segments and
    signatures -- each predicate list searched by binary search only."""

    name = "opindex-bs"
    variant = "bs"


__all__ = ["OpIndexMatcher", "OpIndexBSMatcher", "check_expression", "DEFAULT_LIMIT"]
