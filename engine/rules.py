"""Subscriptions from a rules table: one row per rule, one column per
attribute (README "Subscriptions from a rules table").

A targeting or routing team usually keeps its rules as a table -- a
campaign per row, a column per targeting dimension, a list where any of
several values will do, an empty cell where the rule does not care.
:func:`rules_to_columnar` turns such a table into the columnar form
(:mod:`engine.columnar`: one row per predicate) with Arrow's compute
kernels, one pass per column -- never a Python loop over rules -- so that
``Index.add_many(rules_to_columnar(table))`` loads millions of rules
without the parser.

A rule is the AND of its non-null cells.  Each cell becomes one predicate
on the cell's attribute: by default ``attribute = value`` for a scalar and
``attribute IN (values)`` for a list.  ``columns=`` renames and picks the
operator, so that two columns can bound one attribute
(``{"min_age": ("age", ">="), "max_age": ("age", "<=")}``).  What the
table cannot mean is refused with the rule id and column named, and
nothing is added: a list cell under a scalar operator or the reverse, an
empty list (``IN ()`` is never TRUE: a null cell says "any"), a rule that
constrains nothing, a repeated or null rule id, a column of a type no
attribute family has, a pandas column label that is not a ``str`` (Arrow
would make ``0`` the attribute ``"0"``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from engine.columnar import OP_NAMES, int64_ids, plain_strings
from engine.errors import SchemaError
from engine.events import exact_floats, without_views
from engine.expr import PATTERN_OPS, Op

if TYPE_CHECKING:
    import pandas

__all__ = ["rules_to_columnar", "COLUMNAR_SCHEMA"]

#: the columnar form this module produces (every column present, null where unused)
COLUMNAR_SCHEMA = pa.schema([
    ("sub_id", pa.int64()), ("attr", pa.string()), ("op", pa.string()),
    ("value", pa.float64()), ("values", pa.list_(pa.float64())),
    ("str_value", pa.string()), ("str_values", pa.list_(pa.string())),
    ("bool_value", pa.bool_()), ("bool_values", pa.list_(pa.bool_())),
])
_SCALAR_OPS = frozenset({Op.EQ, Op.NE, Op.LT, Op.LE, Op.GT, Op.GE}) | PATTERN_OPS
_LIST_OPS = frozenset({Op.IN, Op.NOT_IN})


def rules_to_columnar(rules: pandas.DataFrame | pa.Table, *, id_column: str | None = "rule_id", columns: dict | None = None) -> pa.Table:
    """The columnar subscriptions (:data:`COLUMNAR_SCHEMA`) of a rules table.

    Parameters
    ----------
    rules : a pandas DataFrame, an Arrow Table or RecordBatch; one row per
        rule.  Numeric, string (or dictionary of strings) and boolean
        columns, and list columns of those (pandas: object columns holding
        lists, tuples or sets).  A null cell (pandas: None or NaN) puts no
        constraint on its attribute.
    id_column : the column of integer rule ids, which become subscription
        ids; None takes a pandas DataFrame's index.
    columns : which columns are attributes, and how each is tested:
        ``{column: operator}`` or ``{column: (attribute, operator)}`` or
        ``{column: None}`` (the defaults).  Operators: ``=`` ``!=`` ``<``
        ``<=`` ``>`` ``>=`` ``like`` ``not like`` ``matches`` ``not matches``
        for scalar cells, ``in`` ``not in`` for list cells.  Default: every
        column but the id, ``=`` for scalars and ``in`` for lists, the
        column's name as the attribute.

    Raises :class:`~engine.errors.SchemaError` naming the rule and column
    for a table that cannot be read as rules (see the module docstring).
    """
    table, ids = _table_and_ids(rules, id_column)
    if columns is None:
        columns = {name: None for name in table.column_names if name != id_column}
    if not columns:
        raise SchemaError("rules table: no attribute columns")
    pieces = []
    for column, how in columns.items():
        if column not in table.column_names:
            raise SchemaError(f"rules table: no column {column!r}; columns are {table.column_names}")
        attribute, op = _attribute_and_op(column, how)
        pieces.append(_predicates(table[column].combine_chunks(), ids, column, attribute, op))
    out = pa.concat_tables(pieces)
    constrained = np.isin(ids, out["sub_id"].to_numpy())
    if not constrained.all():
        raise SchemaError(f"rules table: rule {int(ids[~constrained][0])} constrains nothing (every attribute "
                          f"cell is null): a subscription needs at least one predicate")
    # rule by rule, in column order, as a person reading the table would list them
    return out.take(pa.array(np.argsort(out["sub_id"].to_numpy(), kind="stable")))


def _table_and_ids(rules, id_column):
    if isinstance(rules, pa.RecordBatch):
        rules = pa.Table.from_batches([rules])
    if not isinstance(rules, pa.Table):
        rules = _from_pandas(rules, id_column)
        if id_column is None:
            id_column = "__index__"
    rules = plain_strings(rules, "rules table")     # (string_view, dictionaries of it: as the columnar form reads)
    if id_column is None or id_column not in rules.column_names:
        raise SchemaError(f"rules table: no id column {id_column!r} (id_column= names it; None takes a pandas "
                          f"DataFrame's index)")
    ids_column = rules[id_column]
    if not pa.types.is_integer(ids_column.type):
        raise SchemaError(f"rules table: the id column {id_column!r} must hold integers, not {ids_column.type}")
    if ids_column.null_count:
        row = int(np.flatnonzero(~ids_column.is_valid().to_numpy(zero_copy_only=False))[0])
        raise SchemaError(f"rules table: row {row} has no rule id")
    ids = int64_ids(ids_column, f"rules table: the id column {id_column!r}")
    unique, counts = np.unique(ids, return_counts=True)
    if (counts > 1).any():
        raise SchemaError(f"rules table: rule id {int(unique[counts > 1][0])} appears in more than one row")
    return rules.drop_columns([id_column]) if id_column == "__index__" else rules, ids


def _from_pandas(frame, id_column):
    import pandas as pd

    if not isinstance(frame, pd.DataFrame):
        raise TypeError(f"rules must be a pandas DataFrame or an Arrow Table, not {type(frame).__name__}")
    for label in frame.columns:
        if not isinstance(label, str):      # Arrow would make 0 the attribute "0", True "True"
            raise SchemaError(f"rules table: column label {label!r} ({type(label).__name__}) is not a name: "
                              f"attribute names are str (rename the columns, e.g. "
                              f"frame.columns = frame.columns.astype(str))")
    repeated = frame.columns[frame.columns.duplicated()]
    if len(repeated):
        raise SchemaError(f"rules table: more than one column named {repeated[0]!r}")
    if id_column is None and "__index__" in frame.columns:
        raise SchemaError("rules table: a column is named '__index__', the name id_column=None gives the "
                          "DataFrame's index: rename it, or name the id column")
    frame = frame.copy(deep=False)
    for name in frame.columns:
        if frame[name].dtype == object:   # tuples and sets are lists to a rule writer; Arrow wants lists
            frame[name] = frame[name].map(_as_list_cell)
    if id_column is None:
        frame = frame.assign(__index__=frame.index.to_numpy())
    try:
        return pa.Table.from_pandas(frame, preserve_index=False)
    except (pa.ArrowException, TypeError, ValueError, UnicodeError) as exc:
        # (which column: the first that Arrow refuses alone)
        for name in frame.columns:
            try:
                pa.array(frame[name].to_numpy(dtype=object) if frame[name].dtype == object else frame[name])
            except (pa.ArrowException, TypeError, ValueError, UnicodeError) as column_exc:
                raise SchemaError(f"rules table: column {name!r} holds cells of no one type Arrow reads (each "
                                  f"column is numbers, strings, booleans, or lists of one of them): "
                                  f"{column_exc}") from None
        raise SchemaError(f"rules table: not readable as Arrow: {exc}") from None


def _as_list_cell(value):
    """A pandas cell as Arrow reads it: tuples and sets as lists (sets
    sorted, for a stable order; a set mixing types that cannot be sorted as
    it is)."""
    if isinstance(value, (set, frozenset)):
        try:
            return sorted(value)
        except TypeError:
            return list(value)
    return list(value) if isinstance(value, tuple) else value


def _attribute_and_op(column: str, how):
    if isinstance(how, tuple) and (len(how) != 2 or not isinstance(how[0], str)):
        raise SchemaError(f"rules table: column {column!r}: {how!r} is not (attribute, operator): columns= "
                          f"maps a column to an operator, to (attribute name, operator), or to None")
    attribute, op_name = (column, None) if how is None else how if isinstance(how, tuple) else (column, how)
    if op_name is None:
        return attribute, None
    op = OP_NAMES.get(" ".join(str(op_name).lower().split()))
    if op is None or op not in _SCALAR_OPS | _LIST_OPS:
        raise SchemaError(f"rules table: column {column!r}: operator {op_name!r} is not one a rules column can "
                          f"take; use =, !=, <, <=, >, >=, like, not like, matches, not matches (scalar cells) "
                          f"or in, not in (list cells)")
    return attribute, op


def _predicates(column: pa.Array, ids: np.ndarray, name: str, attribute: str, op: Op | None) -> pa.Table:
    """The predicate rows of one rules column (its non-null cells)."""
    kind = column.type
    if column.null_count == len(column):         # no rule constrains it (a column of type null, often)
        return pa.table([pa.array([], f.type) for f in COLUMNAR_SCHEMA], schema=COLUMNAR_SCHEMA)
    # list views and fixed-size lists as plain lists (what the pyarrow kernels below read), as events take them
    column = without_views(column)
    if pa.types.is_fixed_size_list(column.type):
        column = column.cast(pa.large_list(column.type.value_type))
    kind = column.type
    is_list = pa.types.is_list(kind) or pa.types.is_large_list(kind)
    element = kind.value_type if is_list else kind
    if pa.types.is_dictionary(element):
        element = element.value_type
        column = pc.cast(column, pa.list_(element) if is_list else element)
    if op is None:
        op = Op.IN if is_list else Op.EQ
    if is_list and op not in _LIST_OPS or not is_list and op not in _SCALAR_OPS:
        raise SchemaError(f"rules table: column {name!r} holds {'lists' if is_list else 'single values'}, "
                          f"which {op.value} cannot take ({'in / not in' if is_list else 'a comparison'} "
                          f"would)")
    family = _family(element, name)
    if op in PATTERN_OPS and family != "str":
        raise SchemaError(f"rules table: column {name!r}: {op.value} needs string patterns, not {element}")
    keep = column.is_valid()
    cells = column.filter(keep)
    rule_ids = ids[keep.to_numpy(zero_copy_only=False)]
    if is_list:
        empty = (pc.list_value_length(cells).to_numpy(zero_copy_only=False) == 0)
        if empty.any():
            raise SchemaError(f"rules table: rule {int(rule_ids[empty][0])}, column {name!r}: an empty list is "
                              f"never matched (IN of nothing); leave the cell null to put no constraint")
        if pc.list_flatten(cells).null_count:
            raise SchemaError(f"rules table: column {name!r} holds a list with a null in it")
    target = {"num": "value", "str": "str_value", "bool": "bool_value"}[family] + ("s" if is_list else "")
    if pa.types.is_decimal(element):
        cells = _exact_decimals(cells, is_list, rule_ids, name)
    try:
        cells = pc.cast(cells, COLUMNAR_SCHEMA.field(target).type)   # safe: an int past 2**53 is refused
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
        raise SchemaError(f"rules table: column {name!r}: {exc}") from None
    n = len(rule_ids)
    arrays = {"sub_id": pa.array(rule_ids, pa.int64()), "attr": _repeated(attribute, n),
              "op": _repeated(op.value.lower(), n)}
    return pa.table([arrays.get(f.name, cells if f.name == target else pa.nulls(n, f.type))
                     for f in COLUMNAR_SCHEMA], schema=COLUMNAR_SCHEMA)


def _exact_decimals(cells, is_list: bool, rule_ids: np.ndarray, name: str):
    """Decimal cells (or lists of them) as float64, converted exactly, or a
    SchemaError naming the first rule whose decimal float64 cannot hold as it
    is (Arrow's cast rounds them, and not always to the nearest float64)."""
    flat = pc.list_flatten(cells) if is_list else cells
    values, refused = exact_floats(flat)
    if refused.any():
        at = int(np.flatnonzero(refused)[0])
        rule = rule_ids[pc.list_parent_indices(cells).to_numpy(zero_copy_only=False)[at]] if is_list else rule_ids[at]
        raise SchemaError(f"rules table: rule {int(rule)}, column {name!r}: the decimal {flat[at].as_py()} is not a "
                          f"number float64 holds as it is")
    values = pa.array(values, pa.float64())
    if not is_list:
        return values
    offsets = pc.list_value_length(cells).to_numpy(zero_copy_only=False).cumsum()
    return pa.ListArray.from_arrays(pa.array(np.concatenate([[0], offsets]), pa.int32()), values)


def _repeated(text: str, n: int) -> pa.Array:
    """``n`` copies of one string, without a Python list of them."""
    return pa.DictionaryArray.from_arrays(pa.array(np.zeros(n, np.int32)), pa.array([text])).cast(pa.string())


def _family(element: pa.DataType, name: str) -> str:
    if pa.types.is_boolean(element):
        return "bool"
    if pa.types.is_integer(element) or pa.types.is_floating(element) or pa.types.is_decimal(element):
        return "num"
    if pa.types.is_string(element) or pa.types.is_large_string(element):
        return "str"
    if pa.types.is_null(element):
        return "num"                    # a column with no value at all: no predicate comes of it
    raise SchemaError(f"rules table: column {name!r} has type {element}, which no attribute family holds "
                      f"(numbers, strings, booleans, or lists of them)")
