"""The columnar subscription form, ingested vectorised (docs/architecture.md#the-compiled-index).

One row per predicate; the rows of one ``sub_id`` are ANDed:

========== ========================================================
column      meaning
========== ========================================================
sub_id      int64 subscription id
attr        attribute name
op          '=', '!=', '<>', '<', '<=', '>', '>=', 'in', 'not in',
            'between', 'not between', 'like', 'not like', 'matches',
            'is null', 'is not null' (case-insensitive)
value       numeric or boolean operand (BETWEEN: low end)
value_hi    numeric or boolean BETWEEN high end
values      list of numeric or boolean operands (IN, NOT IN)
str_value   string operand, LIKE pattern or RE2 pattern
str_value_hi  string BETWEEN high end
str_values  list of string operands (IN, NOT IN)
bool_value  boolean operand (beside numeric ``value`` in one table)
bool_values list of boolean operands (IN, NOT IN)
arity       int operands of a connective row
========== ========================================================

Only ``sub_id``, ``attr`` and ``op`` are required; operand columns may be
left out when no row needs them.  Millions of rows never pass through the
expression parser: everything but IN lists is handled with array
operations.

**Connective rows** make any expression: ``op`` 'and', 'or', 'not', 'xor'
or 'xnor', ``attr`` null, ``arity`` the number of expressions before it
that it takes (NOT 1, XOR and XNOR 2: ``arity`` may be null for them).  A
subscription with one has its rows, in the table's order, as its expression
in postfix; one numba pass checks the shape (:func:`_postfix_shape`) and
folds the NOTs into the predicates' operators and the connectives (De
Morgan, XOR/XNOR), and another writes the programs
(:func:`_postfix_programs`).  :func:`expressions_as_columns` writes ASTs
out in this form.
"""

from __future__ import annotations

import itertools
import logging
import operator
from typing import NamedTuple

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from numba import njit

from engine.compile import (OP_OF_CODE, OPCODE, PredicateTable, Segment, concat_segments, distinct_rows, mix64,
                            node_class)
from engine.errors import SchemaError
from engine.events import exact_floats
from engine.expr import (LIST_SET_OPS, MAX_NESTING, MAX_NODES, NEGATED_OP, And, Family, Not, Op, Or, Pred, Xnor, Xor,
                         pattern_error, shortened)
from engine.schema import Schema
from gpu_kernels import opcodes

logger = logging.getLogger(__name__)

OP_NAMES = {"=": Op.EQ, "==": Op.EQ, "!=": Op.NE, "<>": Op.NE, "<": Op.LT, "<=": Op.LE, ">": Op.GT,
            ">=": Op.GE, "in": Op.IN, "not in": Op.NOT_IN, "between": Op.BETWEEN,
            "not between": Op.NOT_BETWEEN, "like": Op.LIKE, "not like": Op.NOT_LIKE,
            "matches": Op.MATCHES, "not matches": Op.NOT_MATCHES, "is null": Op.IS_NULL,
            "is not null": Op.IS_NOT_NULL, "one of": Op.ONE_OF, "none of": Op.NONE_OF, "all of": Op.ALL_OF,
            "not all of": Op.NOT_ALL_OF, "contains": Op.CONTAINS, "not contains": Op.NOT_CONTAINS,
            "is empty": Op.IS_EMPTY, "is not empty": Op.IS_NOT_EMPTY}
COLUMNS = ("sub_id", "attr", "op", "value", "value_hi", "values", "str_value", "str_value_hi", "str_values",
           "bool_value", "bool_values", "arity")
#: connective rows (``attr`` null, ``arity`` operands): a subscription with
#: one has its rows in postfix order, each connective applying to the
#: ``arity`` expressions before it (AND and OR one or more, NOT one, XOR and
#: XNOR two; ``arity`` may be left null for the last three)
_PREDICATE_ROW, _AND_ROW, _OR_ROW, _NOT_ROW, _XOR_ROW, _XNOR_ROW = range(6)
CONNECTIVES = {"and": _AND_ROW, "or": _OR_ROW, "not": _NOT_ROW, "xor": _XOR_ROW, "xnor": _XNOR_ROW}
_FIXED_ARITY = {_NOT_ROW: 1, _XOR_ROW: 2, _XNOR_ROW: 2}
#: the program instruction of a connective row, and of it under a negation
#: (De Morgan; NOT (x XOR y) is x XNOR y); NOT rows fold into the predicates
_CODE_OF_ROW = np.array([opcodes.LEAF, opcodes.AND, opcodes.OR, -1, opcodes.XOR, opcodes.XNOR], np.int8)
_NEGATED_CODE_OF_ROW = np.array([opcodes.LEAF, opcodes.OR, opcodes.AND, -1, opcodes.XNOR, opcodes.XOR], np.int8)
#: each predicate operator code's negation, as engine.expr.negate folds a NOT
_NEGATED_OPCODE = np.array([OPCODE[NEGATED_OP[OP_OF_CODE[code]]] for code in range(opcodes.N_OPS)], np.int8)

_SCALAR = np.array([op in (Op.EQ, Op.NE, Op.LT, Op.LE, Op.GT, Op.GE) for op in Op])


class _Rows:
    """Validated per-row arrays of a columnar table."""

    def __init__(self, table: pa.Table, ops: tuple, row_numbers: np.ndarray | None = None,
                 sub_id: np.ndarray | None = None):
        # ops: the op column factorized (distinct names, each row's index); row_numbers: the rows' numbers in
        # the table the user gave, when these are its predicate rows only, and sub_id their ids (the table
        # then has no sub_id and op columns)
        self.row_numbers = row_numbers
        _check_not_null(table, "attr", self.number)      # (the columns themselves: _check_columns, before)
        self.table = table
        self.n = table.num_rows
        _check_utf8(table["attr"], "attr")
        self.sub_id = int64_ids(table["sub_id"], "columnar subscriptions: sub_id") if sub_id is None else sub_id
        self.attr_names, self.attr_index = _factorize(table["attr"])
        for k, name in enumerate(self.attr_names):
            if not name:
                row = int(np.flatnonzero(self.attr_index == k)[0])
                raise SchemaError(f"columnar subscriptions: row {self.number(row)} (sub_id "
                                  f"{int(self.sub_id[row])}): {'a null' if name is None else 'an empty'} "
                                  f"attribute name")
        op_names, op_index = ops
        op_codes = []
        used = np.bincount(op_index, minlength=len(op_names)) > 0
        for i, name in enumerate(op_names):
            op = OP_NAMES.get(_op_name(name))
            if op is None and not used[i]:      # (a dictionary's entry that no row uses)
                op = Op.EQ
            if op is None:
                row = int(np.flatnonzero(op_index == i)[0])
                raise SchemaError(f"columnar subscriptions: row {self.number(row)} has unknown operator {name!r}; "
                                  f"operators are {sorted(set(OP_NAMES) | set(CONNECTIVES))}")
            op_codes.append(OPCODE[op])
        self.op = np.array(op_codes, dtype=np.int8)[op_index] if self.n else np.zeros(0, np.int8)

    def number(self, row: int) -> int:
        """The number, in the table given, of row ``row`` of these rows."""
        return row if self.row_numbers is None else int(self.row_numbers[row])

    def column(self, name):
        return self.table[name] if name in self.table.column_names else None

    def fail(self, mask: np.ndarray, message: str):
        """Refuse the table for its first row in ``mask``, if any."""
        if mask.any():
            self.fail_at(int(np.argmax(mask)), message)

    def fail_at(self, row: int, message: str):
        attribute = self.attr_names[self.attr_index[row]]
        raise SchemaError(f"columnar subscriptions: row {self.number(row)} (sub_id {int(self.sub_id[row])}, "
                          f"attribute {attribute!r}): {message}")


def _op_name(name) -> str:
    """An operator's name as the tables' names are matched: lower case, single spaces."""
    return " ".join(str(name).lower().split())


def _check_not_null(table: pa.Table, name: str, number=int) -> None:
    if table[name].null_count:
        row = int(np.flatnonzero(~table[name].is_valid().to_numpy(zero_copy_only=False))[0])
        raise SchemaError(f"columnar subscriptions: row {number(row)} has a null {name}")


def _is_text(dtype: pa.DataType) -> bool:
    return pa.types.is_string(dtype) or pa.types.is_large_string(dtype) or pa.types.is_string_view(dtype)


def plain_strings(table: pa.Table, what: str = "columnar subscriptions") -> pa.Table:
    """``table`` with its strings in the types the compile reads: a
    ``string_view`` column (Polars' strings, Arrow's newest) as
    ``large_string``, lists of them likewise, and a dictionary of strings
    decoded in the operand columns (``attr`` and ``op`` keep theirs, unless
    of ``string_view``: they are factorized by it anyway)."""
    for i, field in enumerate(table.schema):
        dtype, target = field.type, None
        if pa.types.is_string_view(dtype):
            target = pa.large_string()
        elif pa.types.is_dictionary(dtype) and _is_text(dtype.value_type):
            if field.name not in ("attr", "op") or pa.types.is_string_view(dtype.value_type):
                target = pa.large_string()
        elif (pa.types.is_list(dtype) or pa.types.is_large_list(dtype)) and pa.types.is_string_view(dtype.value_type):
            target = pa.large_list(pa.large_string())
        if target is None:
            continue
        column = table.column(i)
        try:
            if pa.types.is_dictionary(dtype):       # (its strings cast first: Arrow takes no string_view)
                column = pa.chunked_array([pa.DictionaryArray.from_arrays(chunk.indices, pc.cast(
                    chunk.dictionary, pa.large_string())).dictionary_decode() for chunk in column.chunks], target)
            table = table.set_column(i, field.name, pc.cast(column, target))
        except pa.ArrowInvalid as exc:              # (the cast checks the bytes: a view's may be no UTF-8)
            raise SchemaError(f"{what}: the {field.name} column is not valid UTF-8 ({exc})") from None
    return table


def _check_columns(table: pa.Table, not_null) -> None:
    """Refuse unknown columns, a missing or mistyped ``sub_id``, ``attr`` or
    ``op``, an ``op`` that is not UTF-8, and a null in those of
    ``not_null``."""
    unknown = set(table.column_names) - set(COLUMNS)
    if unknown:
        raise SchemaError(f"columnar subscriptions: unknown column(s) {sorted(unknown)}; columns are {COLUMNS}")
    for name in ("sub_id", "attr", "op"):
        if name not in table.column_names:
            raise SchemaError(f"columnar subscriptions: missing column {name!r}")
    for name in not_null:
        _check_not_null(table, name)
    if not pa.types.is_integer(table["sub_id"].type):
        raise SchemaError(f"columnar subscriptions: sub_id must be an integer column, not {table['sub_id'].type}")
    for name in ("attr", "op"):
        dtype = table[name].type
        dtype = dtype.value_type if pa.types.is_dictionary(dtype) else dtype
        if not (pa.types.is_string(dtype) or pa.types.is_large_string(dtype)):
            raise SchemaError(f"columnar subscriptions: {name} must be a string column, not {table[name].type}")
    _check_utf8(table["op"], "op")


def _check_utf8(column, name: str) -> None:
    """Refuse a string column whose bytes are no UTF-8 (Parquet and IPC let
    them in; reading them later raised a raw UnicodeDecodeError)."""
    if column is None:
        return
    try:
        column.validate(full=True)
    except pa.ArrowInvalid as exc:
        raise SchemaError(f"columnar subscriptions: the {name} column is not valid UTF-8 ({exc})") from None


def int64_ids(column, what: str) -> np.ndarray:
    """An Arrow integer column of ids as int64, refusing unsigned ids past
    int64's range (a cast would make them negative ids without a word)."""
    ids = column.to_numpy(zero_copy_only=False)
    if ids.dtype.kind == "u" and len(ids) and ids.max() > np.iinfo(np.int64).max:
        row = int(np.flatnonzero(ids > np.iinfo(np.int64).max)[0])
        raise SchemaError(f"{what}: row {row}: id {int(ids[row])} does not fit in int64")
    return ids.astype(np.int64, copy=False)


def _factorize(column) -> tuple[list, np.ndarray]:
    """(distinct values, index of each row's value) of a string or
    dictionary column, hashed by Arrow rather than row by row in Python.
    The indices keep the dictionary's integer type (int8 for a handful of
    operators: a copy of 15 M rows as int64 is 120 MB), signed."""
    array = column.combine_chunks() if isinstance(column, pa.ChunkedArray) else column
    if not pa.types.is_dictionary(array.type):
        array = pc.dictionary_encode(array)
    indices = array.indices.to_numpy(zero_copy_only=False)
    indices = indices if indices.dtype.kind == "i" else indices.astype(np.int64)
    values = array.dictionary.to_pylist()
    used = np.bincount(indices, minlength=len(values)) > 0 if len(indices) else np.zeros(len(values), bool)
    if not used.all():
        # a dictionary keeps the entries no row uses any more (after a filter, from a Parquet file): they
        # name nothing here (an attribute registered for one would be an attribute no subscription has)
        values = [value for value, keep in zip(values, used.tolist()) if keep]
        indices = (np.cumsum(used) - 1).astype(indices.dtype)[indices]
    return values, indices


def _valid(column, n):
    return np.zeros(n, bool) if column is None else column.is_valid().to_numpy(zero_copy_only=False)


def _scalar_family(column) -> Family | None:
    if column is None:
        return None
    t = column.type
    if pa.types.is_list(t) or pa.types.is_large_list(t):
        t = t.value_type
    if pa.types.is_boolean(t):
        return Family.BOOLEAN
    if pa.types.is_integer(t) or pa.types.is_floating(t) or pa.types.is_decimal(t):
        return Family.NUMERIC
    if pa.types.is_string(t) or pa.types.is_large_string(t):
        return Family.STRING
    raise SchemaError(f"columnar subscriptions: column {column._name if hasattr(column, '_name') else ''} "
                      f"has unsupported type {column.type}")


def _numbers(rows: _Rows, name: str, mask: np.ndarray) -> np.ndarray:
    """float64 keys of a numeric/boolean column (0 where unused), refusing
    NaN, infinities and integers beyond ±2**53 on the rows that use it."""
    column = rows.column(name)
    if column is None or not mask.any():
        return np.zeros(rows.n)
    raw, refused = exact_floats(column)
    rows.fail(mask & refused, f"{name} {_NOT_EXACT[_number_kind(column.type)]}")
    return np.where(mask, raw, 0.0)


#: why the value rule refuses a number, by the kind of its column
_NOT_EXACT = {"integer": "is beyond ±2**53, where float64 cannot tell integers apart",
              "decimal": "is a decimal that float64 cannot hold as it is",
              "float": "is not a finite number"}


def _number_kind(dtype: pa.DataType) -> str:
    if pa.types.is_dictionary(dtype):
        dtype = dtype.value_type
    return "integer" if pa.types.is_integer(dtype) else "decimal" if pa.types.is_decimal(dtype) else "float"


#: each opcode's class of operand, for compile_columnar's row masks
(_SCALAR_OPERAND, _SET_OPERAND, _RANGE_OPERAND, _PATTERN_OPERAND, _NULL_TEST, _LIST_SET_OPERAND,
 _CONTAINS_OPERAND, _EMPTY_TEST) = range(8)
_OPERAND_OF = np.full(opcodes.N_OPS, _SCALAR_OPERAND, dtype=np.int8)
for _class, _codes in ((_SET_OPERAND, (opcodes.IN, opcodes.NOT_IN)),
                       (_RANGE_OPERAND, (opcodes.BETWEEN, opcodes.NOT_BETWEEN)),
                       (_PATTERN_OPERAND, (opcodes.LIKE, opcodes.NOT_LIKE, opcodes.MATCHES, opcodes.NOT_MATCHES)),
                       (_NULL_TEST, (opcodes.IS_NULL, opcodes.IS_NOT_NULL)),
                       (_LIST_SET_OPERAND, (opcodes.ONE_OF, opcodes.NONE_OF, opcodes.ALL_OF, opcodes.NOT_ALL_OF)),
                       (_CONTAINS_OPERAND, (opcodes.CONTAINS, opcodes.NOT_CONTAINS)),
                       (_EMPTY_TEST, (opcodes.IS_EMPTY, opcodes.IS_NOT_EMPTY))):
    _OPERAND_OF[list(_codes)] = _class


class _Postfix:
    """The rows of a table that has connective rows, checked one by one:
    ``row`` (per row: a predicate, or which connective) and ``arity`` (per
    row: the connective's operands, -1 for a predicate).  How they nest is
    :func:`_postfix_shape`'s to check."""

    def __init__(self, table: pa.Table, op_names: list, op_index: np.ndarray):
        n = table.num_rows
        self.sub_ids = table["sub_id"]
        codes = np.array([CONNECTIVES.get(_op_name(name), _PREDICATE_ROW) for name in op_names], np.int8)
        self.row = codes[op_index] if n else np.zeros(0, np.int8)
        used = np.bincount(op_index, minlength=len(op_names)) > 0
        for i, name in enumerate(op_names):        # (before the arity checks: 'nand' is no connective)
            if used[i] and _op_name(name) not in OP_NAMES and _op_name(name) not in CONNECTIVES:
                self._fail(op_index == i, f"unknown operator {name!r}; operators are "
                                          f"{sorted(set(OP_NAMES) | set(CONNECTIVES))}")
        connective = self.row != _PREDICATE_ROW
        arity_column = table["arity"] if "arity" in table.column_names else None
        if arity_column is not None and not pa.types.is_integer(arity_column.type):
            raise SchemaError(f"columnar subscriptions: arity must be an integer column, not {arity_column.type}")
        has_arity = _valid(arity_column, n)
        self.arity = np.full(n, -1, np.int64)
        if has_arity.any():
            # (integers as they are: with its nulls, to_numpy makes floats, and a uint64 past int64's range
            # then cast with NumPy's RuntimeWarning; one that large is past every subscription's rows anyway)
            given = pc.fill_null(arity_column, 0).to_numpy(zero_copy_only=False)[has_arity]
            if given.dtype.kind == "u":
                given = np.minimum(given, np.iinfo(np.int64).max)
            self.arity[has_arity] = given.astype(np.int64)
        self._fail(~connective & has_arity, "arity is for connective rows (and, or, not, xor, xnor) only")
        self._fail(connective & _valid(table["attr"] if "attr" in table.column_names else None, n),
                   "a connective row has no attribute (attr null)")
        for name in COLUMNS[3:-1]:
            if name in table.column_names:
                self._fail(connective & _valid(table[name], n), f"a connective row takes no operand, and {name} is set")
        for code, wanted in _FIXED_ARITY.items():
            mine = self.row == code
            self._fail(mine & has_arity & (self.arity != wanted), f"{_connective_name(code)} takes {wanted} "
                                                                   f"operand(s)")
            self.arity[mine] = wanted
        self._fail(connective & (self.arity < 1), "AND and OR need an arity of 1 or more")

    def _fail(self, mask: np.ndarray, message: str) -> None:
        if mask.any():
            row = int(np.flatnonzero(mask)[0])
            raise SchemaError(f"columnar subscriptions: row {row} (sub_id {self.sub_ids[row].as_py()}): {message}")


def _postfix_error(why: int, row: int, arity: int) -> str:
    """What :func:`_postfix_shape`'s code ``why`` means, at a row of kind ``row``."""
    if why == 1:
        return (f"{_connective_name(row)} needs {arity} operand(s) before it, and the subscription's rows "
                f"before it leave fewer (rows are in postfix order)")
    if why == 2:
        return f"the expression is nested more than {MAX_NESTING} connectives deep"
    if why == 3:
        return ("the subscription's rows leave more than one expression (rows are in postfix order: a "
                "connective must join them)")
    return f"the subscription has more than {MAX_NODES} rows"


def _connective_name(code: int) -> str:
    return next(name for name, c in CONNECTIVES.items() if c == code).upper()


def _connectives(table: pa.Table, op_names: list, op_index: np.ndarray) -> _Postfix | None:
    """The table's connective rows, checked, or None when it has none (the
    plain form: each subscription the AND of its rows); ``op_names``,
    ``op_index``: its op column factorized."""
    used = np.bincount(op_index, minlength=len(op_names)) > 0
    if "arity" not in table.column_names and not any(
            _op_name(name) in CONNECTIVES for name, u in zip(op_names, used) if u):
        return None
    postfix = _Postfix(table, op_names, op_index)
    return postfix if (postfix.row != _PREDICATE_ROW).any() else None


#: :func:`_row_at`'s order of rows already in order (an arange of 19 M rows at W5's 1 M is 150 MB)
_NO_ORDER = np.zeros(0, np.int64)


@njit(inline="always", nogil=True)
def _row_at(order, p):
    """The row at place ``p`` of a :func:`_stable_order` (empty: the rows as they are)."""
    return order[p] if len(order) else p


@njit(cache=True, nogil=True)
def _postfix_shape(order, starts, ends, row, arity, max_nesting, max_nodes):
    """Check each subscription's rows (``order[starts[s]:ends[s]]``, in the
    table's order) as a postfix expression when one is a connective row,
    and fold its NOTs: per row, whether it stands under an odd number of
    NOTs (AND and OR pass their polarity down, NOT flips it, XOR and XNOR
    take their operands as they are).  Returns (negated per row, the most
    operands any program holds at once, the first bad row or -1, why: 1
    too few operands, 2 nested too deep, 3 more than one expression left,
    4 too many rows).  The scratch is one subscription long, indexed by
    the row's place in it (19 M rows of W5 at 1 M: no table-long arrays
    but the answer)."""
    n = len(row)
    negated = np.zeros(n, np.bool_)
    longest = 0
    for s in range(len(starts)):
        longest = max(longest, ends[s] - starts[s])
    longest = min(longest, max_nodes + 1)
    parent = np.empty(longest, np.int64)      # by place in the subscription
    height = np.empty(longest, np.int64)
    stack = np.empty(longest, np.int64)
    deepest = 0
    for s in range(len(starts)):
        a0 = starts[s]
        a1 = ends[s]
        plain = True
        for p in range(a0, a1):
            if row[_row_at(order, p)] != _PREDICATE_ROW:
                plain = False
                break
        if plain:                       # the AND of its rows, as many operands as rows
            deepest = max(deepest, a1 - a0)
            continue
        if a1 - a0 > max_nodes:
            return negated, deepest, _row_at(order, a0), 4
        top = 0
        for j in range(a1 - a0):
            r = _row_at(order, a0 + j)
            parent[j] = -1
            if row[r] == _PREDICATE_ROW:
                height[j] = 0
            else:
                k = arity[r]
                if k > top:
                    return negated, deepest, r, 1
                h = 0
                for q in range(top - k, top):
                    parent[stack[q]] = j
                    h = max(h, height[stack[q]])
                height[j] = h + 1
                if h + 1 > max_nesting:
                    return negated, deepest, r, 2
                top -= k
            stack[top] = j
            top += 1
            deepest = max(deepest, top)
        if top != 1:
            return negated, deepest, _row_at(order, a1 - 1), 3
        for j in range(a1 - a0 - 2, -1, -1):      # parents after their operands: the root's polarity first
            up = _row_at(order, a0 + parent[j])
            c = row[up]
            negated[_row_at(order, a0 + j)] = (not negated[up]) if c == _NOT_ROW else (
                negated[up] if c == _AND_ROW or c == _OR_ROW else False)
    return negated, deepest, -1, 0


@njit(cache=True, nogil=True)
def _postfix_programs(order, starts, ends, row, arity, negated, pred_of_row, code_of_row, negated_code_of_row):
    """The programs of the subscriptions (as :func:`_postfix_shape` reads
    them): a plain one the LEAFs of its rows and one AND; one with
    connectives its rows in order, NOTs left out (folded into the
    predicates), AND/OR and XOR/XNOR swapped where negated."""
    n_subs = len(starts)
    offsets = np.zeros(n_subs + 1, np.int64)
    for s in range(n_subs):
        size = ends[s] - starts[s]
        plain = True
        for p in range(starts[s], ends[s]):
            r = _row_at(order, p)
            if row[r] != _PREDICATE_ROW:
                plain = False
                if row[r] == _NOT_ROW:
                    size -= 1
        offsets[s + 1] = offsets[s] + (size + 1 if plain else size)
    kinds = np.empty(offsets[-1], np.int8)
    args = np.empty(offsets[-1], np.int32)
    for s in range(n_subs):
        at = offsets[s]
        plain = True
        for p in range(starts[s], ends[s]):
            r = _row_at(order, p)
            c = row[r]
            if c == _NOT_ROW:
                continue
            if c != _PREDICATE_ROW:
                plain = False
            kinds[at] = negated_code_of_row[c] if negated[r] else code_of_row[c]
            args[at] = pred_of_row[r] if c == _PREDICATE_ROW else arity[r]
            at += 1
        if plain:
            kinds[at] = code_of_row[_AND_ROW]
            args[at] = ends[s] - starts[s]
    return offsets, kinds, args


class _Operands(NamedTuple):
    """Which rows carry which operand, validated: the masks the keys are
    read with and each row's family (the two dozen masks of the checks die
    with :func:`_operands`: at 15 M rows each is 15 MB)."""
    row_family: np.ndarray      # int8: the family a row fixes for its attribute (0 numbers, 1 string, 2 boolean,
                                # 3 list of numbers, 4 list of strings), -1 none
    num_family: Family | None   # the family of the value columns (numbers, or booleans in them)
    empty_test: np.ndarray      # IS [NOT] EMPTY rows
    number: np.ndarray          # rows keyed by value
    number_hi: np.ndarray       # BETWEEN rows keyed by value_hi
    boolean: np.ndarray         # rows keyed by bool_value
    number_lists: np.ndarray    # rows with a values list
    boolean_lists: np.ndarray   # IN rows with a bool_values list
    string_lists: np.ndarray    # rows with a str_values list
    string: np.ndarray          # rows keyed by the string str_value (not a pattern)
    string_hi: np.ndarray       # BETWEEN rows keyed by str_value_hi
    pattern: np.ndarray         # LIKE and MATCHES rows (str_value a pattern)
    contains: np.ndarray        # CONTAINS rows (`value IN attr`)


def _operands(rows: _Rows) -> _Operands:
    """Check that every row has exactly the operands its operator reads,
    of the types the columns allow, and say which rows carry which."""
    n = rows.n
    operand = _OPERAND_OF[rows.op]       # (one gather, not a pass over the rows per class)
    is_set = operand == _SET_OPERAND
    is_range = operand == _RANGE_OPERAND
    is_pattern = operand == _PATTERN_OPERAND
    is_null_test = operand == _NULL_TEST
    # list attributes: ONE/NONE/ALL OF take a list operand as IN does, CONTAINS
    # (`value IN attr`) one value, IS [NOT] EMPTY none
    is_list_set = operand == _LIST_SET_OPERAND
    is_contains = operand == _CONTAINS_OPERAND
    is_empty_test = operand == _EMPTY_TEST
    is_list_row = is_list_set | is_contains
    is_scalar = ~(is_set | is_list_set | is_range | is_pattern | is_null_test | is_empty_test)
    in_set = is_set      # IN rows only, for the checks below
    is_set = is_set | is_list_set

    num_family = _scalar_family(rows.column("value")) or _scalar_family(rows.column("values"))
    for name in ("value", "value_hi", "values"):
        family = _scalar_family(rows.column(name))
        if family is Family.STRING:
            raise SchemaError(f"columnar subscriptions: {name} holds strings; use str_{name}")
        if family is not None and num_family is not None and family is not num_family:
            raise SchemaError("columnar subscriptions: value, value_hi and values must share one type family")
    for name in ("str_value", "str_value_hi", "str_values"):
        if _scalar_family(rows.column(name)) not in (None, Family.STRING):
            raise SchemaError(f"columnar subscriptions: {name} must hold strings")
        _check_utf8(rows.column(name), name)
    for name in ("bool_value", "bool_values"):      # booleans beside numbers: one Arrow column has one type
        if _scalar_family(rows.column(name)) not in (None, Family.BOOLEAN):
            raise SchemaError(f"columnar subscriptions: {name} must hold booleans")

    has_num = _valid(rows.column("value"), n)
    has_num_hi = _valid(rows.column("value_hi"), n)
    has_str = _valid(rows.column("str_value"), n)
    has_str_hi = _valid(rows.column("str_value_hi"), n)
    has_nums = _valid(rows.column("values"), n)
    has_strs = _valid(rows.column("str_values"), n)
    has_bool = _valid(rows.column("bool_value"), n)
    has_bools = _valid(rows.column("bool_values"), n)
    rows.fail(has_num.astype(int) + has_str + has_bool > 1, "more than one of value, str_value and bool_value is set")
    rows.fail((is_scalar | is_range) & ~(has_num | has_str | has_bool),
              "the operator needs value, str_value or bool_value")
    rows.fail(is_range & ~((has_num & has_num_hi) | (has_str & has_str_hi)),
              "BETWEEN needs value and value_hi (or str_value and str_value_hi) of one type")
    rows.fail(is_pattern & ~has_str, "LIKE/MATCHES need a str_value pattern")
    rows.fail(is_set & ~(has_nums | has_strs | has_bools),
              "IN, NOT IN and the list operators need a values, str_values or bool_values list")
    rows.fail(is_set & (has_nums.astype(int) + has_strs + has_bools > 1),
              "more than one of values, str_values and bool_values is set")
    rows.fail(is_list_row & ((is_list_set & has_bools) | (is_contains & has_bool)),
              "list attributes hold numbers or strings, not booleans")
    # an operand the operator does not read is refused, not dropped (value_hi beside '=': BETWEEN meant?)
    one_operand = has_num | has_str | has_bool
    list_operand = has_nums | has_strs | has_bools
    high_operand = has_num_hi | has_str_hi
    rows.fail((is_null_test | is_empty_test) & (one_operand | list_operand | high_operand),
              "IS [NOT] NULL and IS [NOT] EMPTY take no operand, and one is set")
    rows.fail(is_set & (one_operand | high_operand), "IN, NOT IN and ONE/NONE/ALL OF take a list operand only "
                                                    "(values, str_values or bool_values), and a single one is set")
    rows.fail(~is_range & high_operand, "value_hi and str_value_hi are for BETWEEN only")
    rows.fail(~is_set & list_operand, "values, str_values and bool_values are for IN, NOT IN and ONE/NONE/ALL OF "
                                      "only")

    # the family each row fixes for its attribute: 0 value's, 1 string, 2 boolean, -1 none
    string_row = (has_str & ~is_set) | (is_set & has_strs) | is_pattern
    bool_row = ~is_pattern & ((has_bool & ~is_set) | (is_set & has_bools))
    numeric_row = ~string_row & ~bool_row & ~is_null_test & ~is_empty_test
    row_family = np.full(n, -1, np.int8)     # (the three are disjoint once the checks above pass)
    row_family[numeric_row] = 0
    row_family[bool_row] = 2
    row_family[string_row] = 1
    row_family[is_list_row] += 3     # 3, 4: lists of numbers, of strings
    return _Operands(row_family, num_family, is_empty_test, number=has_num & ~is_set, number_hi=is_range & has_num_hi,
                     boolean=has_bool & ~is_set, number_lists=is_set & has_nums, boolean_lists=in_set & has_bools,
                     string_lists=is_set & has_strs, string=has_str & ~is_pattern, string_hi=is_range & has_str_hi,
                     pattern=is_pattern, contains=is_contains)


def _attribute_families(rows: _Rows, schema: Schema, operands: _Operands) -> dict[str, Family | None]:
    """The family each attribute's rows fix, checked against one another
    and against ``schema``: the attributes the rows add to the schema, with
    their families (None: untyped, only IS [NOT] NULL tests it)."""
    row_family, num_family, is_empty_test = operands.row_family, operands.num_family, operands.empty_test
    family_of = {0: num_family or Family.NUMERIC, 1: Family.STRING, 2: Family.BOOLEAN,
                 3: Family.NUMERIC_LIST, 4: Family.STRING_LIST}
    fixed: dict[str, Family] = {}
    n_attrs = len(rows.attr_names)
    # per attribute and family code + 1, whether a row uses it with that family (one pass)
    uses = np.bincount(np.multiply(rows.attr_index, len(family_of) + 1, dtype=np.int64) + row_family + 1,
                       minlength=n_attrs * (len(family_of) + 1)).reshape(n_attrs, len(family_of) + 1) > 0
    used = {f: uses[:, f + 1] for f in family_of}
    tests_empty = np.bincount(rows.attr_index[is_empty_test], minlength=n_attrs) > 0
    for a, name in enumerate(rows.attr_names):
        codes = [f for f in family_of if used[f][a]]
        if len({family_of[f] for f in codes}) > 1:
            rows.fail((rows.attr_index == a) & (row_family >= 0) & (row_family != codes[0]),
                      f"{name!r} used with two type families")
        known = schema.families.get(name)
        if codes:
            family = family_of[codes[0]]
            if known is not None and known is not family:
                rows.fail((rows.attr_index == a) & (row_family >= 0),
                          f"{name!r} is {known.value}, not {family.value}")
            if known is None:
                fixed[name] = family
        elif name not in schema.attr_ids:
            fixed[name] = None
        family = fixed.get(name) or known
        # (the row masks are built only for an attribute that fails: a
        # table's attributes are many, each mask costs a pass over its rows)
        if tests_empty[a] and family not in (Family.NUMERIC_LIST, Family.STRING_LIST):
            rows.fail((rows.attr_index == a) & is_empty_test,
                      f"IS [NOT] EMPTY needs {name!r} to be a list attribute (it is "
                      f"{family.value if family else 'untyped'}; declare it list<numeric> or list<string>, "
                      f"or test it with ONE OF, NONE OF, ALL OF or IN)")
    return fixed


#: rows from which a columnar table is compiled in slices of whole
#: subscriptions, then joined (:func:`engine.compile.concat_segments`): the
#: compile's temporaries, about 130 bytes a row, are then a slice's, reused
#: slice after slice, and not the table's at once.  Memory touched for the
#: first time costs 1.5-2 s a GiB on the machines measured (BENCHMARKS.md,
#: "Session 43"), more than the compile's own work at 19 M rows.
SLICE_ROWS = 1 << 21


def compile_columnar(table, schema: Schema, check_ids=None, slice_rows: int | None = None
                     ) -> tuple[Segment, dict[str, Family]]:
    """Validate a columnar table against ``schema`` and compile it.

    ``check_ids(unique_sorted_ids)`` may refuse the subscription ids (it is
    called before anything is registered).  Validation happens before
    anything is registered: on error the schema is untouched.  Returns the
    segment and the schema changes it made.  A table of more than
    ``slice_rows`` rows (:data:`SLICE_ROWS`) is compiled in slices."""
    if not isinstance(table, pa.Table):
        table = pa.table(table)
    slice_rows = SLICE_ROWS if slice_rows is None else int(slice_rows)
    if slice_rows < 1:
        raise ValueError(f"slice_rows must be at least 1, not {slice_rows}")
    if table.num_rows <= slice_rows or "sub_id" not in table.column_names or table["sub_id"].null_count \
            or not pa.types.is_integer(table["sub_id"].type):
        return _compile_table(table, schema, check_ids)
    mark = schema.mark()
    try:
        return _compile_slices(table, schema, check_ids, slice_rows)
    except MemoryError:
        schema.rollback(mark)
        raise
    except Exception as error:   # noqa: BLE001 -- the table in one piece says which row of it is wrong
        schema.rollback(mark)
        logger.debug("compile_columnar: a slice refused the table (%s); compiling it in one piece", error)
        return _compile_table(table, schema, check_ids)


def _compile_slices(table: pa.Table, schema: Schema, check_ids, slice_rows: int):
    """:func:`compile_columnar` slice by slice.  The slices cut the rows in id
    order (the table's order when its ids come ascending) at subscription
    starts.  Their segments are joined with their predicates de-duplicated
    across them.  An error in a slice names a row of that slice: the caller
    then compiles the table in one piece, which names the table's row."""
    ids = int64_ids(table["sub_id"], "columnar subscriptions: sub_id")
    order = _stable_order(ids)
    sorted_ids = _in_order(ids, order)
    starts, _ = _runs(sorted_ids)
    if check_ids is not None:
        check_ids(sorted_ids[starts])
    starts = np.append(starts, len(ids))
    cuts = starts[np.searchsorted(starts, np.arange(slice_rows, len(ids), slice_rows))]
    bounds = np.unique(np.concatenate(([0], cuts, [len(ids)])))
    del ids, sorted_ids, starts, cuts
    parts, fixed = [], {}
    for a, b in zip(bounds[:-1].tolist(), bounds[1:].tolist()):
        rows = table.slice(a, b - a) if order is None else table.take(order[a:b])
        segment, changes = _compile_table(rows, schema)
        parts.append(segment)
        fixed.update(changes)
    return concat_segments(parts), fixed


def _compile_table(table: pa.Table, schema: Schema, check_ids=None) -> tuple[Segment, dict[str, Family]]:
    """:func:`compile_columnar` of a table in one piece."""
    table = plain_strings(table)
    _check_columns(table, ("sub_id", "op"))     # (attr is null on connective rows: _Rows checks the others')
    op_names, op_index = _factorize(table["op"])    # once, for the connectives and the operators both
    postfix = _connectives(table, op_names, op_index)
    if postfix is None:
        rows = _Rows(table, (op_names, op_index))
    else:       # the predicate rows go the plain way; the connectives shape the programs
        all_ids = int64_ids(table["sub_id"], "columnar subscriptions: sub_id")
        is_predicate = postfix.row == _PREDICATE_ROW
        predicate_rows = np.flatnonzero(is_predicate)
        # (the operand columns only: ids and operators are at hand as arrays)
        kept = table.drop_columns([name for name in ("sub_id", "op", "arity") if name in table.column_names])
        rows = _Rows(kept.filter(pa.array(is_predicate)), (op_names, op_index[predicate_rows]), predicate_rows,
                     all_ids[predicate_rows])
    n, op = rows.n, rows.op
    operands = _operands(rows)
    fixed = _attribute_families(rows, schema, operands)
    lo = _numbers(rows, "value", operands.number)
    hi = _numbers(rows, "value_hi", operands.number_hi)
    scalar_bool = operands.boolean
    if scalar_bool.any():   # booleans are keyed 0.0 / 1.0, as the text route keys them
        lo[scalar_bool] = pc.fill_null(rows.column("bool_value"), False).to_numpy(zero_copy_only=False)[scalar_bool]
    in_lists = _list_column(rows, operands.number_lists, "values")
    bool_lists = _list_column(rows, operands.boolean_lists, "bool_values")
    str_in_lists = _list_column(rows, operands.string_lists, "str_values")

    if postfix is not None:
        # the programs' shape is checked before anything is registered: the rows of every subscription, in
        # the table's order (a stable sort by id)
        full_order = _stable_order(all_ids)
        full_starts, full_ends = _runs(_in_order(all_ids, full_order))
        full_order = _NO_ORDER if full_order is None else full_order      # (the kernels read by _row_at)
        negated, depth, bad, why = _postfix_shape(full_order, full_starts, full_ends, postfix.row, postfix.arity,
                                                  MAX_NESTING, MAX_NODES)
        if bad >= 0:
            raise SchemaError(f"columnar subscriptions: row {bad} (sub_id {int(all_ids[bad])}): "
                              + _postfix_error(why, int(postfix.row[bad]), int(postfix.arity[bad])))
    order = _stable_order(rows.sub_id)
    sub_sorted = _in_order(rows.sub_id, order)
    starts, _ = _runs(sub_sorted)
    sub_ids = sub_sorted[starts]
    if check_ids is not None:
        check_ids(sub_ids)

    # ---- everything is valid: register in the schema
    for name, family in fixed.items():
        schema._add_attr(name, family)
        if family is not None:
            schema.fix_family(name, family)
    attr_ids = np.array([schema.attr_ids[name] for name in rows.attr_names], dtype=np.int32)
    attr = attr_ids[rows.attr_index] if n else np.zeros(0, np.int32)
    aux = np.full(n, -1, dtype=np.int64)
    for name, mask, target in (("str_value", operands.string, lo), ("str_value_hi", operands.string_hi, hi)):
        if mask.any():
            values = pc.filter(rows.column(name), pa.array(mask))
            schema.add_strings(pc.unique(values).to_pylist())
            ids = pc.index_in(values, value_set=pa.array(schema.strings, pa.string()))
            target[mask] = ids.to_numpy(zero_copy_only=False)
    is_pattern = operands.pattern
    if is_pattern.any():
        patterns = pc.filter(rows.column("str_value"), pa.array(is_pattern)).to_pylist()
        kinds = np.where(np.isin(op[is_pattern], (opcodes.LIKE, opcodes.NOT_LIKE)), "like", "regex")
        for row, kind, text in zip(np.flatnonzero(is_pattern), kinds, patterns):
            reason = pattern_error(str(kind), text)  # refused here, as the text route refuses it, not at every match
            if reason is not None:
                rows.fail_at(row, f"invalid RE2 pattern {shortened(repr(text))}: {reason}" if kind == "regex" else
                             f"LIKE pattern {shortened(repr(text))} does not compile to RE2: {reason}")
            aux[row] = schema.pattern_id(str(kind), text)
    contains_rows = np.flatnonzero(operands.contains)      # `value IN attr`: the list of its one value
    for parents, keys in (in_lists, bool_lists, _string_keys(schema, str_in_lists), (contains_rows, lo[contains_rows])):
        set_rows, set_ids = _register_sets(schema, parents, keys)
        aux[set_rows] = set_ids
    lo[contains_rows] = 0.0

    if postfix is not None:         # a NOT over a predicate is its negated operator (NOT a < 5: a >= 5)
        op = np.where(negated[predicate_rows], _NEGATED_OPCODE[op], op).astype(np.int8)
        first, inverse = distinct_rows((attr, op, lo, hi, aux))
        pred_of_row = np.full(table.num_rows, -1, np.int32)     # (program args are int32)
        pred_of_row[predicate_rows] = inverse
        offsets, kinds, args = _postfix_programs(full_order, full_starts, full_ends, postfix.row, postfix.arity,
                                                 negated, pred_of_row, _CODE_OF_ROW, _NEGATED_CODE_OF_ROW)
        table_ = PredicateTable(attr[first], op[first], lo[first], hi[first], aux[first])
        return Segment(sub_ids, offsets, kinds, args, table_, int(depth)), fixed

    # ---- distinct predicates and one AND program per subscription
    first, inverse = distinct_rows((attr, op, lo, hi, aux))
    table_ = PredicateTable(attr[first], op[first], lo[first], hi[first], aux[first])
    sizes = np.diff(np.append(starts, n))
    offsets = np.concatenate(([0], np.cumsum(sizes + 1))).astype(np.int64)
    kinds = np.full(offsets[-1], opcodes.LEAF, dtype=np.int8)
    args = np.empty(offsets[-1], dtype=np.int32)
    and_at = offsets[1:] - 1
    kinds[and_at] = opcodes.AND
    args[and_at] = sizes
    leaf_at = np.repeat(offsets[:-1] - starts, sizes) + np.arange(n)
    args[leaf_at] = _in_order(inverse, order)
    return Segment(sub_ids, offsets, kinds, args, table_, int(sizes.max()) if n else 0), fixed


def _stable_order(ids: np.ndarray) -> np.ndarray | None:
    """The rows in id order, ties in table order: a stable argsort, or None
    when they come grouped in ascending ids already (as a pipeline writes
    them: a sort of 19 M rows saved, and the copies it reorders)."""
    if len(ids) < 2 or bool((ids[1:] >= ids[:-1]).all()):
        return None
    return np.argsort(ids, kind="stable")


def _in_order(values: np.ndarray, order: np.ndarray | None) -> np.ndarray:
    """``values`` in a :func:`_stable_order`."""
    return values if order is None else values[order]


def _runs(sorted_ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(start, end) of each run of equal ids in ``sorted_ids``."""
    if not len(sorted_ids):
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    starts = np.flatnonzero(np.concatenate(([True], sorted_ids[1:] != sorted_ids[:-1])))
    return starts, np.append(starts[1:], len(sorted_ids))


def _list_column(rows: _Rows, mask: np.ndarray, name: str):
    """(row of each list element, elements) of the IN rows of one list
    column, validated: non-empty lists, no nulls, exact finite numbers."""
    strings = name == "str_values"
    if not mask.any():
        return np.zeros(0, np.int64), (pa.array([], pa.string()) if strings else np.zeros(0))
    lists = rows.column(name).combine_chunks().filter(pa.array(mask))
    row_numbers = np.flatnonzero(mask)
    lengths = pc.list_value_length(lists).to_numpy(zero_copy_only=False)
    empty = np.zeros(rows.n, bool)
    empty[row_numbers[lengths == 0]] = True
    rows.fail(empty, f"{name} must be a non-empty list")
    parents = row_numbers[pc.list_parent_indices(lists).to_numpy(zero_copy_only=False)]
    flat = pc.list_flatten(lists)
    has_null = np.zeros(rows.n, bool)
    has_null[parents[~flat.is_valid().to_numpy(zero_copy_only=False)]] = True
    rows.fail(has_null, f"{name} must not hold nulls")
    if strings:
        return parents, flat
    raw, bad = exact_floats(flat)
    bad_rows = np.zeros(rows.n, bool)
    bad_rows[parents[bad]] = True
    rows.fail(bad_rows, f"{name} holds a number that {_NOT_EXACT[_number_kind(flat.type)]}")
    return parents, raw


def _string_keys(schema: Schema, string_lists):
    """String IN-list elements -> their (stable) string-id keys, registering
    new strings."""
    parents, flat = string_lists
    if len(parents) == 0:
        return parents, np.zeros(0)
    schema.add_strings(pc.unique(flat).to_pylist())
    ids = pc.index_in(flat, value_set=pa.array(schema.strings, pa.string()))
    return parents, ids.to_numpy(zero_copy_only=False).astype(np.float64)


def _register_sets(schema: Schema, parents: np.ndarray, keys: np.ndarray):
    """Canonicalise IN lists (sorted, unique keys per row), register each
    distinct list of this call once -- or find it among the lists the
    schema holds already (from text or an earlier table: equal lists share
    an id, so equal predicates share a key whichever way they came in) --
    and return (rows, their set ids)."""
    if len(parents) == 0:
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    # list elements arrive grouped by row, rows ascending (Arrow's flatten order)
    row_starts = np.flatnonzero(np.concatenate(([True], parents[1:] != parents[:-1])))
    offsets, keys = _sort_unique_rows(np.append(row_starts, len(keys)).astype(np.int64), keys.astype(np.float64))
    first, inverse = _distinct_sequences(offsets, (keys + 0.0).view(np.int64))
    lengths = np.diff(offsets)
    kept_lengths = lengths[first]
    kept_starts = np.concatenate(([0], np.cumsum(kept_lengths)[:-1]))
    gather = np.repeat(offsets[first] - kept_starts, kept_lengths) + np.arange(kept_lengths.sum())
    ids = schema.find_or_add_sets(kept_lengths, keys[gather])
    return parents[row_starts], ids[inverse]


_INSERTION_SORT_MAX = 32


@njit(cache=True, nogil=True)
def _sort_unique_rows(offsets, keys):
    """Sort each CSR row's keys and drop repeats (most rows are short IN
    lists: insertion sort beats a global sort; a long one -- quadratic by
    insertion, 10 s for a few thousand lists of thousands -- is sorted whole)."""
    out = np.empty_like(keys)
    new_offsets = np.empty_like(offsets)
    new_offsets[0] = 0
    at = 0
    for r in range(len(offsets) - 1):
        start = at
        if offsets[r + 1] - offsets[r] > _INSERTION_SORT_MAX:
            ordered = np.sort(keys[offsets[r]:offsets[r + 1]])
            for k in range(len(ordered)):
                if k == 0 or ordered[k] != ordered[k - 1]:
                    out[at] = ordered[k]
                    at += 1
            new_offsets[r + 1] = at
            continue
        for k in range(offsets[r], offsets[r + 1]):
            value = keys[k]
            j = at
            while j > start and out[j - 1] > value:
                j -= 1
            if j > start and out[j - 1] == value:
                continue
            for m in range(at, j, -1):
                out[m] = out[m - 1]
            out[j] = value
            at += 1
        new_offsets[r + 1] = at
    return new_offsets, out[:at].copy()


@njit(cache=True, nogil=True)
def _distinct_sequences(offsets, keys):
    """Hash-based de-duplication of the CSR rows of ``keys``: (first row of
    each distinct sequence, inverse map)."""
    n = len(offsets) - 1
    capacity = 16
    while capacity < 2 * n:
        capacity *= 2
    slots = np.full(capacity, -1, dtype=np.int64)
    inverse = np.empty(n, dtype=np.int64)
    first = np.empty(n, dtype=np.int64)
    n_distinct = 0
    for i in range(n):
        h = mix64(np.uint64(0), offsets[i + 1] - offsets[i])
        for k in range(offsets[i], offsets[i + 1]):
            h = mix64(h, keys[k])
        slot = np.int64(h & np.uint64(capacity - 1))
        while True:
            row = slots[slot]
            if row == -1:
                slots[slot] = i
                inverse[i] = n_distinct
                first[n_distinct] = i
                n_distinct += 1
                break
            same = offsets[row + 1] - offsets[row] == offsets[i + 1] - offsets[i]
            if same:
                for k in range(offsets[i + 1] - offsets[i]):
                    if keys[offsets[row] + k] != keys[offsets[i] + k]:
                        same = False
                        break
            if same:
                inverse[i] = inverse[row]
                break
            slot = (slot + 1) & (capacity - 1)
    return first[:n_distinct].copy(), inverse


# ---------------------------------------------------------------- texts in the columnar form

_SET_OPS = (Op.IN, Op.NOT_IN)
_RANGE_OPS = (Op.BETWEEN, Op.NOT_BETWEEN)
#: the family code of an operand's class: 0 numeric, 1 string, 2 boolean
_CLASS_CODE = {int: 0, float: 0, str: 1, bool: 2}
#: an operand's class -> the column of a one-operand row (a pattern's
#: operand is always a string: the parser says so), of an IN list of that
#: class, of a BETWEEN's high end (booleans have none)
_SCALAR_COLUMN = {int: "value", float: "value", str: "str_value", bool: "bool_value"}
_SET_COLUMN = {int: "values", float: "values", str: "str_values", bool: "bool_values"}
_HIGH_COLUMN = {int: "value_hi", float: "value_hi", str: "str_value_hi"}
#: the op column's dictionary: the operators, then the connectives (rows of `expressions_as_columns`)
_OP_INDEX = {**{op: i for i, op in enumerate(Op)}, **{name: len(Op) + i for i, name in enumerate(CONNECTIVES)}}
_first, _second = operator.itemgetter(0), operator.itemgetter(1)
_chain = itertools.chain.from_iterable
#: what an operator's operands are: one literal (comparisons, patterns), a list, two ends, none
_ONE, _SET, _RANGE, _NONE = range(4)
_KIND_OF = {op: _SET if op in _SET_OPS or op in LIST_SET_OPS else _RANGE if op in _RANGE_OPS else
            _NONE if op in (Op.IS_NULL, Op.IS_NOT_NULL, Op.IS_EMPTY, Op.IS_NOT_EMPTY) else _ONE for op in Op}
_OP_TEXTS = pa.array([op.value for op in Op] + list(CONNECTIVES), pa.string())
_COLUMN_TYPE = {"value": pa.float64(), "value_hi": pa.float64(), "str_value": pa.string(),
                "str_value_hi": pa.string(), "bool_value": pa.bool_(), "values": pa.list_(pa.float64()),
                "str_values": pa.list_(pa.string()), "bool_values": pa.list_(pa.bool_())}


class _ColumnsByClass(dict):
    """An operand's class -> the list of its column (``column_of`` names
    it), made in ``columns`` on first use: the row loop of
    `texts_as_columns` files a literal with one lookup, and a workload
    makes only the two or three columns it uses."""

    def __init__(self, column_of: dict, columns: dict, n: int):
        super().__init__()
        self.column_of, self.columns, self.n = column_of, columns, n

    def __missing__(self, cls):
        name = self.column_of[cls]          # KeyError: a class without that column
        made = self.columns.get(name)
        if made is None:
            made = self.columns[name] = [None] * self.n
        self[cls] = made
        return made


def _operand_columns(terms: list) -> tuple[dict, list]:
    """The operand columns of rows ``(attr, op, operands, ...)`` (a predicate's
    :class:`engine.expr.Op`, or a connective's name with no operand), a
    column per operand kind and only where a row uses it; and the rows the
    form cannot hold (an IN list or BETWEEN mixing literal types, a boolean
    BETWEEN: the form has no boolean high end)."""
    n = len(terms)
    columns: dict[str, list] = {}
    scalar_of = _ColumnsByClass(_SCALAR_COLUMN, columns, n)
    set_of = _ColumnsByClass(_SET_COLUMN, columns, n)
    high_of = _ColumnsByClass(_HIGH_COLUMN, columns, n)
    class_code, kind_of = _CLASS_CODE, _KIND_OF
    unusable = []
    for row, term in enumerate(terms):
        op, values = term[1], term[2]
        kind = kind_of.get(op, _NONE)
        if kind == _ONE:
            value = values[0]
            scalar_of[value.__class__][row] = value
        elif kind == _SET:
            classes = set(map(type, values))
            if len(classes) > 1 and len(set(map(class_code.__getitem__, classes))) > 1:
                unusable.append(row)     # a mixed list: the text route refuses it
            else:
                set_of[values[0].__class__][row] = values
        elif kind == _RANGE:
            low, high = values
            cls = low.__class__
            if cls is bool or class_code[cls] != class_code[high.__class__]:
                unusable.append(row)     # boolean or mixed ends
            else:
                scalar_of[cls][row] = low
                high_of[cls][row] = high
        # _NONE, IS [NOT] NULL and the connectives: no operand
    return columns, unusable


#: a connective node's row name and arity (None: its number of children)
_CONNECTIVE_ROW = {Not: ("not", 1), And: ("and", None), Or: ("or", None), Xor: ("xor", 2), Xnor: ("xnor", 2)}


def expressions_as_columns(ids, nodes) -> pa.Table:
    """The columnar form of expressions (ASTs, `engine.expr` nodes): each
    subscription's rows in postfix order, its predicates as the plain form
    has them and a connective row (``attr`` null, ``op`` 'and', 'or',
    'not', 'xor' or 'xnor', ``arity``) after its operands; a subtree that
    several parents share is written out under each.  For storing
    arbitrary expressions without text (Parquet) and adding them with
    ``Index.add_many(table)``, which compiles them with array operations.
    ValueError for what the form cannot hold (an IN list or BETWEEN mixing
    literal types, a boolean BETWEEN): add that one as an AST or text."""
    ids = list(ids)
    nodes = list(nodes)
    if len(ids) != len(nodes):
        raise ValueError(f"{len(ids)} ids for {len(nodes)} expressions")
    terms: list = []
    sub_of_row: list = []
    connective_row = _CONNECTIVE_ROW
    for sub_id, node in zip(ids, nodes):
        start = len(terms)
        stack = [(node, False)]
        while stack:
            current, expanded = stack.pop()
            cls = current.__class__
            if cls is Pred:
                terms.append((current.attr, current.op, current.values, None))
                continue
            name, arity = connective_row.get(cls) or connective_row[node_class(current)]
            if expanded:
                terms.append((None, name, (), len(current.children) if arity is None else arity))
                continue
            stack.append((current, True))
            children = (current.child,) if name == "not" else \
                (current.left, current.right) if arity == 2 else current.children
            stack.extend((child, False) for child in reversed(children))
            if len(terms) - start + len(stack) > MAX_NODES:
                raise ValueError(f"subscription {sub_id}: more than {MAX_NODES} nodes once shared subtrees "
                                 f"are written out (or the expression contains itself)")
        sub_of_row.extend([sub_id] * (len(terms) - start))
    columns, unusable = _operand_columns(terms)
    if unusable:
        attr, op, values, _ = terms[unusable[0]]
        raise ValueError(f"subscription {sub_of_row[unusable[0]]}: the columnar form cannot hold "
                         f"{attr} {op.value} {values!r} (mixed or boolean operands): add it as an AST or text")
    arity = [term[3] for term in terms]
    # attributes dictionary-encoded (few names, many rows: a smaller table, and compile_columnar reads the codes)
    attr_code: dict = {}
    codes = [None if term[0] is None else attr_code.setdefault(term[0], len(attr_code)) for term in terms]
    return pa.table({
        "sub_id": pa.array(sub_of_row, pa.int64()),
        "attr": pa.DictionaryArray.from_arrays(pa.array(codes, pa.int32()), pa.array(list(attr_code), pa.string())),
        "op": pa.DictionaryArray.from_arrays(
            pa.array(np.fromiter(map(_OP_INDEX.__getitem__, map(_second, terms)), np.int8, len(terms))),
            _OP_TEXTS),
        **{name: pa.array(values, _COLUMN_TYPE[name]) for name, values in columns.items()},
        **({"arity": pa.array(arity, pa.int64())} if any(a is not None for a in arity) else {}),
    })


def texts_as_columns(ids, texts) -> tuple[pa.Table, list[int]]:
    """The columnar form of those ``texts`` that are plain conjunctions (one
    predicate, or predicates joined by AND: most subscriptions), and the
    positions of the others -- any other expression, an AST, a text with an
    error, a boolean BETWEEN (the form has no boolean high end), an IN list
    or BETWEEN mixing literal types -- for the text route, which compiles
    them one by one and says what is wrong with the bad ones.

    The texts are read by `engine.parse.conjunction_terms` (the parser's own
    tokens and literal checks, without building ASTs), so that bulk text
    ingestion costs a read per text and then the columnar form's array
    operations; a column per operand kind is filled only where a row uses
    it."""
    from engine.parse import conjunction_terms

    read = conjunction_terms(texts)
    others = [position for position, found in enumerate(read) if found is None]
    kept = np.arange(len(read))         # the texts read, by position
    if others:
        kept = np.array([position for position, found in enumerate(read) if found is not None], dtype=np.int64)
        read = [found for found in read if found is not None]
    counts = list(map(len, read))
    terms = list(_chain(read))

    n = len(terms)
    columns, unusable = _operand_columns(terms)
    op_index = np.fromiter(map(_OP_INDEX.__getitem__, map(_second, terms)), np.int8, n)
    usable = np.ones(n, dtype=bool)
    usable[unusable] = False

    counts_ = np.array(counts, dtype=np.int64)
    text_of_row = np.repeat(np.arange(len(kept)), counts_)
    if not usable.all():
        usable_text = np.ones(len(kept), dtype=bool)
        usable_text[text_of_row[~usable]] = False
        others = sorted(others + kept[~usable_text].tolist())
        keep_rows = usable_text[text_of_row]
    else:
        keep_rows = None
    table = pa.table({
        "sub_id": pa.array(np.asarray(ids, dtype=np.int64)[kept][text_of_row]),
        "attr": pa.array(list(map(_first, terms)), pa.string()),
        "op": pa.DictionaryArray.from_arrays(pa.array(op_index), _OP_TEXTS),
        **{name: pa.array(values, _COLUMN_TYPE[name]) for name, values in columns.items()},
    })
    if keep_rows is not None:
        table = table.filter(pa.array(keep_rows))
    return table, others
