"""Expressions -> the compiled columnar index (docs/architecture.md#the-compiled-index).

A :class:`Segment` is a struct of flat arrays, never a graph of Python
objects:

* the **distinct-predicate table** (:class:`PredicateTable`): every distinct
  predicate stored once, so every matcher evaluates it once per event
  (A-PCM's exactly-once evaluation, A-Tree's predicate sharing).  A
  predicate is identified by numbers only -- attribute id, operator code,
  operand keys and a set/pattern id -- where a *key* is the number itself
  for numeric and boolean operands and the schema's stable string id for
  strings.  Kernel-ready *codes* (``lo``, ``hi``, sorted IN-list codes) are
  derived from the keys by :meth:`PredicateTable.recode` whenever the string
  dictionary has grown.
* one **postfix program** per subscription in CSR form over predicate ids,
  built from negation normal form (so there is no NOT instruction), for
  ``scan`` and for every route that needs the original expression back.

Segments are built from ASTs (the text route) or vectorised from the
columnar one-row-per-predicate form, and concatenated with a vectorised
de-duplication of their predicate tables.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np
import numba
from numba import njit, prange

from engine.errors import SchemaError
from engine.expr import ELEMENT_OF, And, Family, Node, Not, Op, Or, Pred, Xnor, Xor, negate, predicates
from engine.schema import Schema
from gpu_kernels import opcodes

OPCODE = {
    Op.EQ: opcodes.EQ, Op.NE: opcodes.NE, Op.LT: opcodes.LT, Op.LE: opcodes.LE,
    Op.GT: opcodes.GT, Op.GE: opcodes.GE, Op.IN: opcodes.IN, Op.NOT_IN: opcodes.NOT_IN,
    Op.BETWEEN: opcodes.BETWEEN, Op.NOT_BETWEEN: opcodes.NOT_BETWEEN,
    Op.LIKE: opcodes.LIKE, Op.NOT_LIKE: opcodes.NOT_LIKE,
    Op.MATCHES: opcodes.MATCHES, Op.NOT_MATCHES: opcodes.NOT_MATCHES,
    Op.IS_NULL: opcodes.IS_NULL, Op.IS_NOT_NULL: opcodes.IS_NOT_NULL,
    Op.ONE_OF: opcodes.ONE_OF, Op.NONE_OF: opcodes.NONE_OF, Op.ALL_OF: opcodes.ALL_OF,
    Op.NOT_ALL_OF: opcodes.NOT_ALL_OF, Op.CONTAINS: opcodes.CONTAINS, Op.NOT_CONTAINS: opcodes.NOT_CONTAINS,
    Op.IS_EMPTY: opcodes.IS_EMPTY, Op.IS_NOT_EMPTY: opcodes.IS_NOT_EMPTY,
}
OP_OF_CODE = {code: op for op, code in OPCODE.items()}
SET_CODES = (opcodes.IN, opcodes.NOT_IN)
PATTERN_CODES = (opcodes.LIKE, opcodes.NOT_LIKE, opcodes.MATCHES, opcodes.NOT_MATCHES)
#: list operators whose truth comes from an operand list (aux = its set id;
#: CONTAINS: the list of its one value)
LIST_SET_CODES = (opcodes.ONE_OF, opcodes.NONE_OF, opcodes.ALL_OF, opcodes.NOT_ALL_OF, opcodes.CONTAINS,
                  opcodes.NOT_CONTAINS)


def _empty(dtype):
    return np.zeros(0, dtype=dtype)


@dataclass
class PredicateTable:
    """Distinct predicates as parallel arrays (one row per predicate)."""

    attr: np.ndarray      # int32 attribute id
    op: np.ndarray        # int8 operator code (gpu_kernels.opcodes)
    lo_key: np.ndarray    # float64 first operand key (value, 0/1, or string id)
    hi_key: np.ndarray    # float64 second operand key (BETWEEN)
    aux: np.ndarray       # int64 set id (IN lists) or pattern id (LIKE/MATCHES), else -1
    # kernel-ready codes, derived by recode()
    lo: np.ndarray | None = None
    hi: np.ndarray | None = None
    set_offsets: np.ndarray | None = None
    set_values: np.ndarray | None = None
    coded_version: int = -1

    @classmethod
    def empty(cls) -> "PredicateTable":
        return cls(_empty(np.int32), _empty(np.int8), _empty(np.float64), _empty(np.float64), _empty(np.int64))

    def __len__(self) -> int:
        return len(self.attr)

    def key_columns(self):
        return self.attr, self.op, self.lo_key, self.hi_key, self.aux

    def take(self, rows: np.ndarray) -> "PredicateTable":
        return PredicateTable(*(column[rows] for column in self.key_columns()))

    def pattern_pairs(self) -> np.ndarray:
        """Distinct (attribute id, pattern id) pairs of the LIKE/MATCHES
        predicates: what a batch's pattern_truth must cover.  Computed once
        (the key columns of a table never change)."""
        if getattr(self, "_pattern_pairs", None) is None:
            rows = np.isin(self.op, PATTERN_CODES)
            # (most tables have none: np.unique over rows costs a small delta's table 0.1 ms)
            self._pattern_pairs = np.unique(np.stack([self.attr[rows].astype(np.int64), self.aux[rows]], axis=1),
                                            axis=0) if rows.any() else np.zeros((0, 2), np.int64)
        return self._pattern_pairs

    def list_pairs(self) -> np.ndarray:
        """Distinct (attribute id, list key) pairs of the list predicates
        with an operand list: what a batch's list_truth must cover (the key
        as :func:`gpu_kernels.predicates.list_key_py` makes it)."""
        if getattr(self, "_list_pairs", None) is None:
            rows = np.isin(self.op, LIST_SET_CODES)
            is_all = np.isin(self.op[rows], (opcodes.ALL_OF, opcodes.NOT_ALL_OF))
            self._list_pairs = np.unique(np.stack([self.attr[rows].astype(np.int64),
                                                   self.aux[rows] * 2 + is_all], axis=1), axis=0)
        return self._list_pairs

    def list_index(self, schema):
        """The inverted index of this table's operand lists
        (:class:`engine.events.ListIndex`), built on first use: operand
        lists never change once registered, and ``schema`` (or any later
        view of it) holds them all."""
        if getattr(self, "_list_index", None) is None:
            from engine.events import list_index
            self._list_index = list_index(schema, self.list_pairs())
        return self._list_index

    @property
    def nbytes(self) -> int:
        keys = self.key_columns()
        coded = (self.lo, self.hi, self.set_offsets, self.set_values)     # (lo and hi may be the keys themselves)
        return sum(a.nbytes for a in keys) + sum(a.nbytes for a in coded
                                                 if a is not None and not any(a is k for k in keys))

    def coded(self, schema) -> "PredicateTable":
        """This table with kernel codes under ``schema``'s dictionary (a
        :class:`~engine.schema.Schema` or a view of one): itself when it is
        coded so already, else a new table sharing the key columns.  A table
        a snapshot has published is never recoded in place, since a
        concurrent match may be reading its codes."""
        if self.coded_version == schema.version and self.lo is not None:
            return self
        table = self.uncoded()
        table.recode(schema)
        return table

    def string_rows(self, schema) -> np.ndarray:
        """Per row, whether its attribute is a string one under ``schema``,
        read for the attributes the table uses only (a small delta's table
        need not look at 20 K attributes)."""
        if not len(self.attr):
            return np.zeros(0, bool)
        # (a count and a gather, not np.unique's sort and a search: a W1 table of a million rows in 3 ms, not 30)
        used = np.flatnonzero(np.bincount(self.attr))
        names = schema.attr_names
        is_string = np.zeros(int(used[-1]) + 1, bool)
        is_string[used] = [schema.families.get(names[a]) is Family.STRING for a in used.tolist()]
        return is_string[self.attr]

    def uncoded(self) -> "PredicateTable":
        """A new table, not coded yet, sharing this one's key columns and
        what is derived from them alone (pattern and list pairs, the list
        index): what is coded in place instead of a published table."""
        table = PredicateTable(*self.key_columns())
        for derived in ("_pattern_pairs", "_list_pairs", "_list_index"):
            if getattr(self, derived, None) is not None:
                setattr(table, derived, getattr(self, derived))
        return table

    def recode(self, schema: Schema) -> None:
        """Derive kernel codes from keys under the schema's current string
        dictionary (no-op when the dictionary has not changed).  In place:
        only for a table no match can see yet (see :meth:`coded`)."""
        if self.coded_version == schema.version and self.lo is not None:
            return
        is_string = self.string_rows(schema)
        plain = is_string & ~np.isin(self.op, SET_CODES + PATTERN_CODES) & (self.op != opcodes.IS_NULL) \
            & (self.op != opcodes.IS_NOT_NULL)
        ranged = plain & np.isin(self.op, (opcodes.BETWEEN, opcodes.NOT_BETWEEN))
        # codes are the keys but on string rows: a table without them shares its keys (16 MB not copied at a
        # million rows, for each new string an update brings) -- if writable, as every kernel's lo and hi are
        # typed (a read-only array would make numba compile each kernel again)
        self.lo = _coded_copy(self.lo_key, plain, schema)
        self.hi = _coded_copy(self.hi_key, ranged, schema)
        # IN lists: codes sorted per predicate, in CSR (vectorised gather)
        set_rows = np.isin(self.op, SET_CODES)
        all_offsets, all_keys = schema.set_csr()
        ids = self.aux[set_rows]
        lengths = np.zeros(len(self), dtype=np.int64)
        lengths[set_rows] = all_offsets[ids + 1] - all_offsets[ids]
        self.set_offsets = np.concatenate(([0], np.cumsum(lengths))).astype(np.int64)
        starts = all_offsets[ids]
        owner = np.repeat(np.arange(len(ids)), lengths[set_rows])
        keys = all_keys[np.repeat(starts - self.set_offsets[:-1][set_rows], lengths[set_rows])
                        + np.arange(self.set_offsets[-1])]
        string_keys = np.repeat(is_string[set_rows], lengths[set_rows])
        codes = keys.copy()
        codes[string_keys] = schema.codes_of_string_ids(keys[string_keys])
        # the schema holds every list sorted by key: only string codes (ranks
        # in the string dictionary, not ids) can be out of order in a list
        out_of_order = (codes[1:] < codes[:-1]) & (owner[1:] == owner[:-1])
        self.set_values = codes[np.lexsort((codes, owner))] if out_of_order.any() else codes
        self.coded_version = schema.version


def _coded_copy(keys: np.ndarray, string_rows: np.ndarray, schema: Schema) -> np.ndarray:
    """``keys`` with the string ids of ``string_rows`` as their codes under
    ``schema``: ``keys`` itself where there are none and it is writable."""
    if not string_rows.any() and keys.flags.writeable:
        return keys
    codes = keys.copy()
    codes[string_rows] = schema.codes_of_string_ids(keys[string_rows])
    return codes


def distinct_rows(columns) -> tuple[np.ndarray, np.ndarray]:
    """Vectorised de-duplication of predicate key rows ``(attr, op, lo_key,
    hi_key, aux)``.  Returns (index of each distinct row's first occurrence,
    in order of appearance; inverse map row -> distinct row).  Hash-based,
    O(rows)."""
    attr, op, lo_key, hi_key, aux = columns
    if len(attr) == 0:
        return _empty(np.int64), _empty(np.int64)
    # float keys compared by bit pattern (views, not copies: the kernels
    # fold -0.0 into 0.0, _key_bits)
    lo_bits = np.ascontiguousarray(lo_key, np.float64).view(np.int64)
    hi_bits = np.ascontiguousarray(hi_key, np.float64).view(np.int64)
    factorize = _factorize_predicates if len(attr) < PARALLEL_ROWS or numba.get_num_threads() <= 2 \
        else _factorize_predicates_parallel
    return factorize(np.asarray(attr, np.int32), np.asarray(op, np.int8), lo_bits, hi_bits,
                     np.asarray(aux, np.int64))


#: rows from which predicate de-duplication runs on every core, with more
#: than two: on two cores the parallel pass (hash, partition, de-duplicate
#: each partition) costs about what the one-pass serial table does at 7 M
#: rows and twice as much at 140,000 (BENCHMARKS.md, text ingestion)
PARALLEL_ROWS = 1 << 20
#: hash partitions of the parallel de-duplication: 2 ** DEDUP_BITS
DEDUP_BITS = 8


#: the bits of -0.0, which is the key 0.0
_NEGATIVE_ZERO_BITS = np.int64(-2 ** 63)


@njit(inline="always", nogil=True)
def _key_bits(bits):
    """A float64 key's bits, -0.0 read as 0.0 (``a = -0.0`` is ``a = 0``)."""
    return np.int64(0) if bits == _NEGATIVE_ZERO_BITS else bits


@njit(inline="always", nogil=True)
def _row_hash(attr, op, lo, hi, aux, i):
    h = mix64(np.uint64(0), (np.int64(attr[i]) << 8) | np.int64(op[i]))
    h = mix64(h, _key_bits(lo[i]))
    h = mix64(h, _key_bits(hi[i]))
    return mix64(h, aux[i])


@njit(parallel=True, cache=True, nogil=True)
def _factorize_predicates_parallel(attr, op, lo, hi, aux):
    """:func:`_factorize_predicates` on every core, same result: rows are
    hashed in parallel and split by the hash's top bits into partitions
    (equal rows share a hash, so a partition holds all copies of its
    rows), each partition de-duplicated by its own open-addressing table
    over its rows in ascending order, and the distinct rows numbered by
    first appearance at the end."""
    n = len(attr)
    n_parts = 1 << DEDUP_BITS
    shift = np.uint64(64 - DEDUP_BITS)
    hashes = np.empty(n, dtype=np.uint64)
    for i in prange(n):
        hashes[i] = _row_hash(attr, op, lo, hi, aux, i)
    # rows grouped by partition, ascending within each (a stable counting sort)
    bounds = np.zeros(n_parts + 1, dtype=np.int64)
    for i in range(n):
        bounds[np.int64(hashes[i] >> shift) + 1] += 1
    for p in range(n_parts):
        bounds[p + 1] += bounds[p]
    cursor = bounds[:-1].copy()
    order = np.empty(n, dtype=np.int64)
    for i in range(n):
        p = np.int64(hashes[i] >> shift)
        order[cursor[p]] = i
        cursor[p] += 1
    local = np.empty(n, dtype=np.int64)           # distinct id of each row within its partition
    firsts = np.empty(n, dtype=np.int64)          # partition p's distinct rows' first rows at bounds[p]...
    known = np.empty((n, _PACKED), dtype=np.int64)   # ...and their packed keys, likewise
    n_distinct = np.zeros(n_parts + 1, dtype=np.int64)
    for p in prange(n_parts):
        a = bounds[p]
        b = bounds[p + 1]
        capacity = 16
        while capacity < 2 * (b - a):
            capacity *= 2
        slots = np.full(capacity, -1, dtype=np.int64)
        nd = 0
        for k in range(a, b):
            i = order[k]
            row = _packed_row(hashes[i], attr, op, lo, hi, aux, i)
            slot = row[0] & (capacity - 1)
            while True:
                d = slots[slot]
                if d == -1:
                    slots[slot] = nd
                    firsts[a + nd] = i
                    _store_row(known, a + nd, row)
                    local[i] = nd
                    nd += 1
                    break
                if _is_row(known, a + d, row):
                    local[i] = d
                    break
                slot = (slot + 1) & (capacity - 1)
        n_distinct[p + 1] = nd
    for p in range(n_parts):
        n_distinct[p + 1] += n_distinct[p]
    total = n_distinct[n_parts]
    first_rows = np.empty(total, dtype=np.int64)
    for p in prange(n_parts):
        for d in range(n_distinct[p + 1] - n_distinct[p]):
            first_rows[n_distinct[p] + d] = firsts[bounds[p] + d]
    # number the distinct rows by first appearance
    by_first = np.argsort(first_rows)
    number = np.empty(total, dtype=np.int64)
    for k in prange(total):
        number[by_first[k]] = k
    inverse = np.empty(n, dtype=np.int64)
    for i in prange(n):
        p = np.int64(hashes[i] >> shift)
        inverse[i] = number[n_distinct[p] + local[i]]
    return first_rows[by_first], inverse


@njit(inline="always", nogil=True)
def mix64(h, key):
    """Fold a 64-bit key into hash ``h`` (splitmix64 finaliser), so that keys
    differing only in high bits -- small floats -- spread over all slots."""
    x = h ^ np.uint64(key)
    x ^= x >> np.uint64(30)
    x *= np.uint64(0xBF58476D1CE4E5B9)
    x ^= x >> np.uint64(27)
    x *= np.uint64(0x94D049BB133111EB)
    x ^= x >> np.uint64(31)
    return x


@njit(cache=True, nogil=True)
def _factorize_predicates(attr, op, lo, hi, aux):
    n = len(attr)
    # open addressing over distinct rows; the table grows with the distinct
    # count (not the row count) so that it stays cache-resident
    capacity = 1024
    slots = np.full(capacity, -1, dtype=np.int64)       # distinct id in each slot
    # each distinct row's hash and keys side by side (_packed_row): a probe
    # reads one cache line, not one per key column (1.2-1.7x faster)
    known = np.empty((n, _PACKED), dtype=np.int64)
    inverse = np.empty(n, dtype=np.int64)
    first = np.empty(n, dtype=np.int64)
    n_distinct = 0
    for i in range(n):
        row = _packed_row(_row_hash(attr, op, lo, hi, aux, i), attr, op, lo, hi, aux, i)
        slot = row[0] & (capacity - 1)
        while True:
            d = slots[slot]
            if d == -1:
                slots[slot] = n_distinct
                _store_row(known, n_distinct, row)
                inverse[i] = n_distinct
                first[n_distinct] = i
                n_distinct += 1
                if 2 * n_distinct > capacity:     # keep the load factor under 1/2
                    capacity *= 4
                    slots = np.full(capacity, -1, dtype=np.int64)
                    for k in range(n_distinct):
                        s = known[k, 0] & (capacity - 1)
                        while slots[s] != -1:
                            s = (s + 1) & (capacity - 1)
                        slots[s] = k
                break
            if _is_row(known, d, row):
                inverse[i] = d
                break
            slot = (slot + 1) & (capacity - 1)
    return first[:n_distinct].copy(), inverse


#: columns of a packed predicate row: hash, attr << 8 | op, lo, hi, aux
_PACKED = 5


@njit(inline="always", nogil=True)
def _packed_row(h, attr, op, lo, hi, aux, i):
    """Row ``i`` (of hash ``h``) as `_PACKED` int64s."""
    return np.int64(h), (np.int64(attr[i]) << 8) | np.int64(op[i]), _key_bits(lo[i]), _key_bits(hi[i]), aux[i]


@njit(inline="always", nogil=True)
def _is_row(known, d, row):
    """Whether distinct row ``d`` of ``known`` is the packed ``row``."""
    return known[d, 0] == row[0] and known[d, 1] == row[1] and known[d, 2] == row[2] \
        and known[d, 3] == row[3] and known[d, 4] == row[4]


@njit(inline="always", nogil=True)
def _store_row(known, d, row):
    for k in range(_PACKED):
        known[d, k] = row[k]


@dataclass
class Segment:
    """A compiled set of subscriptions: ids, postfix programs, predicates,
    and which subscriptions are *residual* -- beyond the algorithm's
    rewrite limit, matched by the residual matcher instead of the
    algorithm's structure (:mod:`engine.algorithms.residual`)."""

    sub_ids: np.ndarray        # int64 [S]
    prog_offsets: np.ndarray   # int64 [S + 1]
    prog_kind: np.ndarray      # int8 [L] LEAF/AND/OR/XOR/XNOR
    prog_arg: np.ndarray       # int32 [L] predicate id (LEAF) or arity (AND/OR)
    predicates: PredicateTable
    max_depth: int             # deepest operand stack any program needs
    residual: np.ndarray | None = None   # bool [S]; None: none is residual

    @classmethod
    def empty(cls) -> "Segment":
        return cls(_empty(np.int64), np.zeros(1, np.int64), _empty(np.int8), _empty(np.int32),
                   PredicateTable.empty(), 0)

    def __len__(self) -> int:
        return len(self.sub_ids)

    @property
    def nbytes(self) -> int:
        arrays = (self.sub_ids, self.prog_offsets, self.prog_kind, self.prog_arg)
        extra = 0 if self.residual is None else self.residual.nbytes
        return sum(a.nbytes for a in arrays) + self.predicates.nbytes + extra

    @property
    def n_residual(self) -> int:
        return 0 if self.residual is None else int(np.count_nonzero(self.residual))

    def coded(self, schema) -> "Segment":
        """This segment with its predicates coded under ``schema``
        (:meth:`PredicateTable.coded`): itself, or a new segment sharing
        the programs."""
        table = self.predicates.coded(schema)
        if table is self.predicates:
            return self
        return Segment(self.sub_ids, self.prog_offsets, self.prog_kind, self.prog_arg, table, self.max_depth,
                       self.residual)

    def take(self, positions: np.ndarray) -> "Segment":
        """The sub-segment of the given subscription positions (its
        predicate table is shared, unused predicates included)."""
        positions = np.asarray(positions, dtype=np.int64)
        starts, stops = self.prog_offsets[positions], self.prog_offsets[positions + 1]
        lengths = stops - starts
        offsets = np.concatenate(([0], np.cumsum(lengths))).astype(np.int64)
        gather = np.repeat(starts - offsets[:-1], lengths) + np.arange(offsets[-1])
        residual = None if self.residual is None else _flags(self.residual[positions])
        return Segment(self.sub_ids[positions], offsets, self.prog_kind[gather], self.prog_arg[gather],
                       self.predicates, self.max_depth, residual)

    # ----------------------------------------------------------------- reading
    def expression(self, position: int, schema: Schema) -> Node:
        """The NNF expression of one subscription, rebuilt from its program."""
        stack: list[Node] = []
        start, stop = self.prog_offsets[position], self.prog_offsets[position + 1]
        for kind, arg in zip(self.prog_kind[start:stop], self.prog_arg[start:stop]):
            if kind == opcodes.LEAF:
                stack.append(predicate_ast(self.predicates, int(arg), schema))
            elif kind in (opcodes.AND, opcodes.OR):
                children = tuple(stack[len(stack) - int(arg):])
                del stack[len(stack) - int(arg):]
                if len(children) == 1:      # the columnar form's AND of one predicate is the predicate
                    stack.append(children[0])
                else:
                    stack.append(And(children) if kind == opcodes.AND else Or(children))
            else:
                right, left = stack.pop(), stack.pop()
                stack.append(Xor(left, right) if kind == opcodes.XOR else Xnor(left, right))
        return stack[0]


def predicate_ast(table: PredicateTable, pred_id: int, schema: Schema) -> Pred:
    """The AST of one distinct predicate (the inverse of :func:`predicate_key`)."""
    attr = schema.attr_names[table.attr[pred_id]]
    family = schema.families[attr]
    family = ELEMENT_OF.get(family, family)      # a list's operands are of its elements' family
    op = OP_OF_CODE[int(table.op[pred_id])]

    def literal(key):
        if family is Family.STRING:
            return schema.strings[int(key)]
        if family is Family.BOOLEAN:
            return bool(key)
        return int(key) if float(key).is_integer() and abs(key) <= 2 ** 53 else float(key)

    code = int(table.op[pred_id])
    if code in SET_CODES or code in LIST_SET_CODES:
        # in value order: a set's keys are string ids for strings, which follow the order the strings were first
        # registered in, so the same list read back in two orders after two routes in (text, columns)
        values = tuple(sorted(literal(k) for k in schema.set_keys(int(table.aux[pred_id]))))
    elif code in PATTERN_CODES:
        values = (schema.patterns[int(table.aux[pred_id])][1],)
    elif code in (opcodes.IS_NULL, opcodes.IS_NOT_NULL, opcodes.IS_EMPTY, opcodes.IS_NOT_EMPTY):
        values = ()
    elif code in (opcodes.BETWEEN, opcodes.NOT_BETWEEN):
        values = (literal(table.lo_key[pred_id]), literal(table.hi_key[pred_id]))
    else:
        values = (literal(table.lo_key[pred_id]),)
    return Pred(attr, op, values)


_ONE_OPERAND = frozenset({Op.EQ, Op.NE, Op.LT, Op.LE, Op.GT, Op.GE})
_LIST_SET_OPS = frozenset(OP_OF_CODE[code] for code in LIST_SET_CODES)


def predicate_key(pred: Pred, schema: Schema) -> tuple:
    """(attr id, op code, lo key, hi key, aux) of a checked, registered predicate."""
    attr = schema.attr_ids[pred.attr]
    op = pred.op
    if op in _ONE_OPERAND:          # the common case first: one comparison operand
        value = pred.values[0]
        return (attr, OPCODE[op], float(schema.string_ids[value]) if isinstance(value, str) else float(value),
                0.0, -1)
    family = schema.families[pred.attr]
    family = ELEMENT_OF.get(family, family)

    def key(value):
        return float(schema.string_id(value)) if family is Family.STRING else float(value)

    if op in _LIST_SET_OPS:
        keys = tuple(sorted({key(v) for v in pred.values}))
        return attr, OPCODE[op], 0.0, 0.0, schema.set_id(keys)
    if op in (Op.IS_EMPTY, Op.IS_NOT_EMPTY):
        return attr, OPCODE[op], 0.0, 0.0, -1
    if op in (Op.IN, Op.NOT_IN):
        keys = tuple(sorted({key(v) for v in pred.values}))
        return attr, OPCODE[op], 0.0, 0.0, schema.set_id(keys)
    if op in (Op.LIKE, Op.NOT_LIKE):
        return attr, OPCODE[op], 0.0, 0.0, schema.pattern_id("like", pred.values[0])
    if op in (Op.MATCHES, Op.NOT_MATCHES):
        return attr, OPCODE[op], 0.0, 0.0, schema.pattern_id("regex", pred.values[0])
    if op in (Op.IS_NULL, Op.IS_NOT_NULL):
        return attr, OPCODE[op], 0.0, 0.0, -1
    if op in (Op.BETWEEN, Op.NOT_BETWEEN):
        return attr, OPCODE[op], key(pred.values[0]), key(pred.values[1]), -1
    return attr, OPCODE[op], key(pred.values[0]), 0.0, -1


_LEAF_CODES = [opcodes.LEAF]
_NODE_CLASSES = frozenset((Pred, Not, And, Or, Xor, Xnor))


def node_class(node) -> type:
    """The expression class ``node`` is an instance of (a subclass's base)."""
    for cls in (Pred, Not, And, Or, Xor, Xnor):
        if isinstance(node, cls):
            return cls
    raise TypeError(f"not an expression node: {node!r}")


def compile_expressions(ids, nodes, schema: Schema, shared: bool = False) -> Segment:
    """Compile checked and registered ASTs into a segment (the text route).

    Each expression's program is its negation normal form in postfix (NOT
    folded into the predicates as `engine.expr.to_nnf` folds it, without
    building the NNF tree).  ``shared``: the ASTs share nodes (the same
    object in several places: ASTs built in code; `engine.expr.AstChecks`
    tells).  Then a node is compiled once per polarity and, where it comes
    back, its program is copied from where it was first written; without
    sharing, remembering every node would only cost memory."""
    pred_index: dict[tuple, int] = {}
    keys: list[tuple] = []
    kinds: list[int] = []
    args: list[int] = []
    offsets = [0]
    max_depth = 0
    # per polarity (index: negated), the id of a node -> its leaf's predicate id, or its program's span and
    # stack depth; the ASTs are alive (``nodes``) while this runs, so an id names one node
    leaf_of: tuple[dict, dict] = ({}, {})
    span_of: tuple[dict, dict] = ({}, {})

    def leaf(pred: Pred) -> int:
        k = predicate_key(pred, schema)
        found = pred_index.get(k)
        if found is None:
            found = pred_index[k] = len(keys)
            keys.append(k)
        return found

    def emit(node, negated: bool) -> int:
        """Append the postfix code of ``node`` (of ``NOT node`` when
        ``negated``) in NNF; return the stack depth it needs.  (Called per
        node of a million ASTs: classes compared by identity, loops
        written out.)"""
        cls = node.__class__
        if cls not in _NODE_CLASSES:
            cls = node_class(node)
        if cls is Pred:
            memo = leaf_of[negated]
            pid = memo.get(id(node))
            if pid is None:
                pid = leaf(negate(node) if negated else node)
                if shared:
                    memo[id(node)] = pid
            kinds.append(opcodes.LEAF)
            args.append(pid)
            return 1
        span = span_of[negated].get(id(node))
        if span is not None:
            start, stop, depth = span
            kinds.extend(kinds[start:stop])
            args.extend(args[start:stop])
            return depth
        start = len(kinds)
        if cls is Not:
            depth = emit(node.child, not negated)
        elif cls is And or cls is Or:              # De Morgan under a negation
            depth = 0
            for i, child in enumerate(node.children):
                need = i + emit(child, negated)
                if need > depth:
                    depth = need
            kinds.append(opcodes.AND if (cls is And) != negated else opcodes.OR)
            args.append(len(node.children))
        else:                                      # NOT (x XOR y) is x XNOR y; the operands stay as they are
            depth = max(emit(node.left, False), 1 + emit(node.right, False))
            kinds.append(opcodes.XOR if (cls is Xor) != negated else opcodes.XNOR)
            args.append(2)
        if shared:
            span_of[negated][id(node)] = (start, len(kinds), depth)
        return depth

    for node in nodes:
        kind = node.__class__
        if kind is And and all(child.__class__ is Pred for child in node.children):
            # a conjunction, most subscriptions: already in NNF, its program is its leaves and one AND
            n = len(node.children)
            kinds.extend(_LEAF_CODES * n)
            kinds.append(opcodes.AND)
            args.extend([leaf(child) for child in node.children])
            args.append(n)
            depth = n
        elif kind is Pred:
            kinds.append(opcodes.LEAF)
            args.append(leaf(node))
            depth = 1
        else:
            depth = emit(node, False)
        max_depth = max(max_depth, depth)
        offsets.append(len(kinds))
    columns = list(zip(*keys)) if keys else [(), (), (), (), ()]
    table = PredicateTable(np.array(columns[0], np.int32), np.array(columns[1], np.int8),
                           np.array(columns[2], np.float64), np.array(columns[3], np.float64),
                           np.array(columns[4], np.int64))
    return Segment(np.asarray(ids, dtype=np.int64), np.array(offsets, np.int64), np.array(kinds, np.int8),
                   np.array(args, np.int32), table, max_depth)


def concat_segments(segments: list[Segment]) -> Segment:
    """One segment holding every subscription of ``segments``, predicates
    de-duplicated across them (vectorised)."""
    segments = [s for s in segments if len(s)]
    if not segments:
        return Segment.empty()
    if len(segments) == 1:
        return segments[0]
    key_columns = [np.concatenate(cols) for cols in zip(*(s.predicates.key_columns() for s in segments))]
    first, inverse = distinct_rows(key_columns)
    table = PredicateTable(*(column[first] for column in key_columns))
    pred_base = np.cumsum([0] + [len(s.predicates) for s in segments[:-1]])
    prog_base = np.cumsum([0] + [len(s.prog_kind) for s in segments[:-1]])
    kinds = np.concatenate([s.prog_kind for s in segments])
    args = np.empty(len(kinds), np.int32)
    # (segment by segment: the temporaries are one segment's, not the whole program's -- a columnar table
    # compiled in slices joins its slices here)
    inverse = inverse.astype(np.int32)
    for s, p_base, c_base in zip(segments, pred_base.tolist(), prog_base.tolist()):
        out = args[c_base:c_base + len(s.prog_kind)]
        out[:] = s.prog_arg
        leaves = s.prog_kind == opcodes.LEAF
        out[leaves] = inverse[s.prog_arg[leaves] + p_base]
    offsets = np.concatenate([[0]] + [s.prog_offsets[1:] + base for s, base in zip(segments, prog_base)])
    residual = None
    if any(s.residual is not None for s in segments):
        residual = _flags(np.concatenate([np.zeros(len(s), bool) if s.residual is None else s.residual
                                          for s in segments]))
    return Segment(np.concatenate([s.sub_ids for s in segments]), offsets.astype(np.int64), kinds, args,
                   table, max(s.max_depth for s in segments), residual)


def _flags(residual: np.ndarray) -> np.ndarray | None:
    """Residual flags, None when none is set (the common case costs nothing)."""
    return residual if residual.any() else None


def sorted_by_id(segment: Segment) -> Segment:
    order = np.argsort(segment.sub_ids, kind="stable")
    if len(order) > 1 and (order[1:] < order[:-1]).any():
        return segment.take(order)
    return segment


def without_unused_predicates(segment: Segment) -> Segment:
    """Drop predicates no program refers to any more (after removals)."""
    return compact_predicates(segment)[0]


def compact_predicates(segment: Segment) -> tuple[Segment, np.ndarray]:
    """:func:`without_unused_predicates`, and the rows of the old table the
    new one keeps."""
    n = len(segment.predicates)
    leaves = segment.prog_kind == 0
    args = segment.prog_arg.take(np.flatnonzero(leaves)) if n else segment.prog_arg[:0]
    used = np.zeros(n, dtype=bool)
    used[args] = True
    if used.all():
        return segment, np.arange(n)
    rows = np.flatnonzero(used)
    new_id = (np.cumsum(used) - 1).astype(segment.prog_arg.dtype)
    # (non-leaf arguments are arities: clipped into range, then left as they are)
    args = np.where(leaves, new_id.take(segment.prog_arg, mode="clip"), segment.prog_arg)
    return Segment(segment.sub_ids, segment.prog_offsets, segment.prog_kind, args,
                   segment.predicates.take(rows), segment.max_depth, segment.residual), rows


def shared_rows(table: PredicateTable, old: PredicateTable) -> np.ndarray:
    """Per row of ``table`` (a merge's concatenation), the row of ``old`` (the
    previous main table) it is, else -1.  The concatenation keeps the first
    segment's distinct rows first and in order; checked, not assumed."""
    source = np.full(len(table), -1, dtype=np.int64)
    n = len(old)
    if table is old or (len(table) >= n and all(np.array_equal(new[:n], before)
                                                for new, before in zip(table.key_columns(), old.key_columns()))):
        source[:n] = np.arange(n)
    return source


def carry_codes(table: PredicateTable, source: np.ndarray, old: PredicateTable, schema: Schema) -> None:
    """Give ``table`` its kernel codes (:meth:`PredicateTable.recode`) without
    recoding the rows it shares with ``old`` (``source``: the row of ``old``
    each row is, or -1): a row's codes depend only on its keys and the
    schema, so a row keeps them when ``old`` was coded under the current
    dictionary, and a row of a non-string attribute under any dictionary.
    Recoding every row of a merge costs more than merging the matcher."""
    if table is old or old.lo is None or old.set_offsets is None or not (source >= 0).any():
        return                                     # recode() codes what it must when it is needed
    if old.coded_version != schema.version:       # string codes may have moved since
        source = np.where((source >= 0) & ~table.string_rows(schema), source, -1)
    carried, fresh = np.flatnonzero(source >= 0), np.flatnonzero(source < 0)
    src = source[carried]
    recoded = table.take(fresh)
    recoded.recode(schema)
    n = len(table)
    lo, hi = np.empty(n), np.empty(n)
    lo[carried], lo[fresh] = old.lo[src], recoded.lo
    hi[carried], hi[fresh] = old.hi[src], recoded.hi
    # IN lists: each row's sorted codes, gathered from either table into one CSR
    lengths, starts = np.empty(n, np.int64), np.empty(n, np.int64)
    lengths[carried], lengths[fresh] = np.diff(old.set_offsets)[src], np.diff(recoded.set_offsets)
    starts[carried], starts[fresh] = old.set_offsets[src], recoded.set_offsets[:-1] + len(old.set_values)
    offsets = np.concatenate(([0], np.cumsum(lengths))).astype(np.int64)
    values = np.concatenate((old.set_values, recoded.set_values))
    table.lo, table.hi, table.set_offsets = lo, hi, offsets
    table.set_values = values[np.repeat(starts - offsets[:-1], lengths) + np.arange(int(offsets[-1]))]
    table.coded_version = schema.version

def merge_segments(main: Segment, alive: np.ndarray, delta: list, coded: PredicateTable, schema) -> tuple:
    """The next main segment of a merge: the live subscriptions of ``main``
    (``alive``: its flags) and those of the ``delta`` segments, ids
    ascending, unused predicates dropped, coded under ``schema`` -- the
    rows it shares with ``coded`` (the main table as last coded) keep
    their codes.  Returns it and ``old_to_new``: the new position of each
    old main position (-1: removed), what a matcher's ``merged`` needs."""
    kept = np.flatnonzero(alive)
    parts = [main.take(kept)] if len(kept) < len(main) else [main]
    merged = concat_segments(parts + list(delta))
    position = np.arange(len(merged), dtype=np.int64)     # of each concatenated row in the merged segment
    order = np.argsort(merged.sub_ids, kind="stable")
    if len(order) and (order[1:] < order[:-1]).any():
        merged = merged.take(order)
        position[order] = np.arange(len(order))
    old_to_new = np.full(len(main), -1, dtype=np.int64)
    old_to_new[kept] = position[:len(kept)]   # (the surviving main rows come first in the concatenation)
    source = shared_rows(merged.predicates, main.predicates)
    segment, rows = compact_predicates(merged)
    table = segment.predicates
    if table.coded_version == schema.version and table.lo is not None and table.set_offsets is not None:
        return segment, old_to_new          # coded under this dictionary already (shared or not): as it is
    if any(table is published for published in (main.predicates, coded, *(d.predicates for d in delta))):
        # the table of a published segment (a merge that only drops tombstones, or of a delta segment alone),
        # whose codes snapshots and subsets still read: a copy is coded, never that table in place
        segment = dataclasses.replace(segment, predicates=segment.predicates.uncoded())
    carry_codes(segment.predicates, source[rows], coded, schema)
    segment.predicates.recode(schema)     # (its own table, published by no one yet: coded in place)
    return segment, old_to_new


def check_ids(ids: np.ndarray, present) -> None:
    """Refuse duplicate ids within ``ids`` or ids already ``present``."""
    unique, counts = np.unique(ids, return_counts=True)
    if (counts > 1).any():
        raise KeyError(f"subscription id {int(unique[counts > 1][0])} given more than once")
    clash = present(unique)
    if clash is not None:
        raise KeyError(f"subscription id {clash} is already in the index")


def require_family(schema: Schema, attr: str, family: Family, fixed: dict, where: str) -> None:
    known = schema.families.get(attr)
    known = fixed.get(attr) if known is None else known
    if known is None:
        fixed[attr] = family
    elif known != family:
        raise SchemaError(f"{where}: {attr!r} is {known.value}, not {family.value}")


__all__ = ["PredicateTable", "Segment", "compile_expressions", "concat_segments", "distinct_rows",
           "predicate_ast", "predicate_key", "predicates", "OPCODE"]


@njit(cache=True, nogil=True)
def program_depths(prog_offsets, prog_kind, prog_arg):
    """Operand-stack depth each program needs, or -1 for a malformed program
    (an operator short of operands, or not exactly one result)."""
    n = len(prog_offsets) - 1
    depths = np.empty(n, dtype=np.int64)
    for s in range(n):
        top = 0
        deepest = 0
        for pc in range(prog_offsets[s], prog_offsets[s + 1]):
            kind = prog_kind[pc]
            if kind == 0:
                top += 1
            else:
                need = prog_arg[pc] if kind <= 2 else 2
                if need < 1 or need > top:
                    top = -1
                    break
                top -= need - 1
            deepest = max(deepest, top)
        depths[s] = deepest if top == 1 else -1
    return depths
