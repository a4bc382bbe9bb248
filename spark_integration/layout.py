"""Event layouts and event validation, on Arrow batches.

Two layouts of an events DataFrame are understood (auto-detected):

* **wide**: one column per attribute (``a0 long, color string, ...``), null
  = absent.  Columns the index does not use are not even sent to Python.
* **map**: one ``map<string, V>`` column (default name ``attrs``) holding
  ``{attribute: value}``; a missing key or a null value = absent.  ``V`` is
  any atomic type (for attributes of different families in one map use a
  string-valued map only if the attributes are strings, or the wide layout).

Worker side, a map batch goes to :meth:`engine.Index.match_batch` as it
is (the engine reads ``map<string, V>`` columns entry by entry, vectorised,
however many distinct keys there are).

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

from engine.events import map_entries

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
    None for an attribute only tested with IS [NOT] NULL).  Wide columns
    and ``map<string, V>`` columns alike."""
    problems: dict[int, str] = {}
    for name in table.column_names:
        if pa.types.is_map(table[name].type):
            for row, problem in _bad_map_rows(table[name], attributes).items():
                problems.setdefault(row, problem)
            continue
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


def _bad_map_rows(column, attributes: dict) -> dict[int, str]:
    """:func:`bad_rows` for one ``map<string, V>`` column, vectorised over
    the entries the engine reads (:func:`engine.events.map_entries`)."""
    value_type = column.type.item_type
    if pa.types.is_dictionary(value_type):
        value_type = value_type.value_type
    actual = _arrow_family(value_type)
    names = [name for name, family in attributes.items() if family is not None]
    if not names:
        return {}
    rows, key, entry, items = map_entries(column, pa.array(names, pa.string()))
    families = np.array([attributes[name] for name in names], dtype=object)[key]
    bad = families != actual
    if actual == "numeric" and len(entry):
        values = items.take(pa.array(entry))
        if pa.types.is_integer(values.type):
            out_of_range = np.abs(values.to_numpy(zero_copy_only=False).astype(np.float64)) > MAX_EXACT_INT
        else:
            with np.errstate(invalid="ignore"):
                out_of_range = ~np.isfinite(pc.cast(values, pa.float64()).to_numpy(zero_copy_only=False))
        bad |= (families == "numeric") & out_of_range
    problems: dict[int, str] = {}
    for k in np.flatnonzero(bad).tolist():
        row = int(rows[k])
        if row not in problems:
            name = names[int(key[k])]
            problems[row] = f"attribute {name!r} is {attributes[name]}, got {items[int(entry[k])].as_py()!r}"
    return problems
