"""Event layouts of an events DataFrame.

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

Bad events (docs/language.md#events-and-the-event-value-rule: a value whose type family is not its
attribute's, a NaN or infinity, an integer beyond ±2**53) are not looked
for here: the worker matches each batch with ``errors="report"``, and the
engine returns the refused events beside the matches, each an
:class:`engine.errors.BadEventError` with its row, attribute and reason
(spark_integration/matching.py).
"""

from __future__ import annotations

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
