"""Event layouts and event validation, on Arrow batches.

Two layouts of an events DataFrame are understood (auto-detected):

* **wide**: one column per attribute (``a0 long, color string, ...``), null
  = absent.  Columns the index does not use are not even sent to Python.
* **map**: one ``map<string, V>`` column (default name ``attrs``) holding
  ``{attribute: value}``; a missing key or a null value = absent.  ``V`` is
  any atomic type (for attributes of different families in one map use a
  string-valued map only if the attributes are strings, or the wide layout).

Worker side, a map batch becomes a wide Arrow table (one column per
attribute the index knows), which :meth:`engine.Index.match_batch` takes.

Bad events: a value whose type family is not its attribute's, a NaN or
infinity, or an integer beyond ±2**53 (DESIGN.md §2) -- what the engine's
``errors="raise"`` refuses -- is found for every row of a batch at once by
:func:`bad_rows`, so that the job can name the event id (or quarantine all
such events) instead of the engine's row number.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

MAX_EXACT_INT = 2 ** 53
LAYOUTS = ("auto", "wide", "map")


# ------------------------------------------------------------------ driver

def quote(name: str) -> str:
    """A Spark column reference for any column name (dots, spaces, backticks)."""
    return "`" + name.replace("`", "``") + "`"


def detect_layout(df, *, layout: str, attrs_column: str, event_id: str, attributes) -> tuple[str, list[str]]:
    """(layout, columns to send to Python) for an events DataFrame."""
    from pyspark.sql.types import MapType, StringType

    if layout not in LAYOUTS:
        raise ValueError(f"layout must be one of {LAYOUTS}, not {layout!r}")
    fields = {f.name: f for f in df.schema.fields}
    if event_id not in fields:
        raise ValueError(f"the events DataFrame has no event id column {event_id!r} (columns: "
                         f"{', '.join(fields)}); pass event_id=... to name it")
    is_map = attrs_column in fields and isinstance(fields[attrs_column].dataType, MapType)
    if layout == "auto":
        layout = "map" if is_map else "wide"
    if layout == "map":
        if not is_map:
            found = fields[attrs_column].dataType.simpleString() if attrs_column in fields else "no such column"
            raise ValueError(f"layout='map' needs a map<string, ...> column {attrs_column!r}; the events "
                             f"DataFrame has {found}")
        key_type = fields[attrs_column].dataType.keyType
        if not isinstance(key_type, StringType):
            raise ValueError(f"the map column {attrs_column!r} must have string keys (attribute names), "
                             f"not {key_type.simpleString()}")
        return "map", [event_id, attrs_column]
    columns = [name for name in fields if name != event_id and name in attributes]
    return "wide", [event_id] + columns


# ------------------------------------------------------------------ worker

def map_to_wide(column, attributes) -> pa.Table:
    """A ``map<string, V>`` Arrow column -> a table with one column per key
    that is in ``attributes`` (null where the event lacks it)."""
    if isinstance(column, pa.ChunkedArray):
        column = column.combine_chunks()
    n = len(column)
    offsets = column.offsets.to_numpy()
    lo, hi = int(offsets[0]), int(offsets[-1])
    lengths = np.diff(offsets)
    parent = np.repeat(np.arange(n, dtype=np.int64), lengths)
    keys = column.keys.slice(lo, hi - lo)
    items = column.items.slice(lo, hi - lo)
    keep = np.ones(hi - lo, dtype=bool)
    if column.null_count:
        keep &= column.is_valid().to_numpy(zero_copy_only=False)[parent]
    if items.null_count:
        keep &= items.is_valid().to_numpy(zero_copy_only=False)
    encoded = pc.dictionary_encode(keys)
    names = encoded.dictionary.to_pylist()
    key_index = encoded.indices.to_numpy(zero_copy_only=False)
    out = {}
    for k, name in enumerate(names):
        if name not in attributes:
            continue
        rows_mask = keep & (key_index == k)
        positions = np.flatnonzero(rows_mask)
        take = np.full(n, -1, dtype=np.int64)
        take[parent[positions]] = positions            # a repeated key: the last one wins
        indices = pa.array(take, mask=take < 0)
        out[name] = pc.take(items, indices)
    if not out:
        return _empty_table(n)
    return pa.table(out)


def _empty_table(n: int) -> pa.Table:
    """A table of ``n`` rows and no columns (events without attributes)."""
    return pa.table({"_": pa.nulls(n, pa.int64())}).drop_columns(["_"])


def _arrow_family(dtype: pa.DataType) -> str | None:
    if pa.types.is_dictionary(dtype):
        dtype = dtype.value_type
    if pa.types.is_boolean(dtype):
        return "boolean"
    if pa.types.is_integer(dtype) or pa.types.is_floating(dtype) or pa.types.is_decimal(dtype):
        return "numeric"
    if pa.types.is_string(dtype) or pa.types.is_large_string(dtype) or pa.types.is_string_view(dtype):
        return "string"
    return None


def bad_rows(table: pa.Table, attributes: dict) -> dict[int, str]:
    """{row: what is wrong} for every event the engine would refuse with
    ``errors="raise"``; ``attributes`` maps attribute -> family name (or
    None for an attribute only tested with IS [NOT] NULL)."""
    problems: dict[int, str] = {}
    for name in table.column_names:
        if name not in attributes:
            continue
        family = attributes[name]
        column = table[name]
        if family is None or column.null_count == len(column):
            continue
        if isinstance(column, pa.ChunkedArray):
            column = column.combine_chunks()
        if pa.types.is_dictionary(column.type):
            column = column.dictionary_decode()
        actual = _arrow_family(column.type)
        valid = column.is_valid().to_numpy(zero_copy_only=False)
        if actual != family:
            rows = np.flatnonzero(valid)
        elif family == "numeric":
            if pa.types.is_integer(column.type):
                values = pc.fill_null(column, 0).to_numpy(zero_copy_only=False)
                bad = np.abs(values.astype(np.float64)) > MAX_EXACT_INT
            else:
                values = pc.cast(column, pa.float64()).to_numpy(zero_copy_only=False)
                with np.errstate(invalid="ignore"):
                    bad = ~np.isfinite(values)
            rows = np.flatnonzero(bad & valid)
        else:
            continue
        for row in rows.tolist():
            if row not in problems:
                problems[row] = f"attribute {name!r} is {family}, got {column[row].as_py()!r}"
    return problems
