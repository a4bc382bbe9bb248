"""DuckDB as the test suite's oracle (DESIGN.md §2).

An expression AST is translated into a SQL boolean expression and evaluated
by a real in-memory DuckDB over a table with one column per attribute, one
row per event, NULL where the event lacks the attribute.

Translation notes (checked by tests/test_semantics.py):

* identifiers are double-quoted (``"`` doubled), strings single-quoted
  (``'`` doubled), booleans ``TRUE``/``FALSE``, ints as integer literals and
  floats as ``CAST('<repr>' AS DOUBLE)`` (a bare ``0.1`` is a DECIMAL in
  DuckDB; the cast from the shortest repr is exact);
* ``XOR``/``XNOR`` by their definitions ``(x AND NOT y) OR (NOT x AND y)`` and
  ``(x AND y) OR (NOT x AND NOT y)``;
* ``LIKE``/``NOT LIKE`` -> DuckDB ``LIKE``/``NOT LIKE`` as is: DuckDB's LIKE
  has no default escape character (a backslash in the pattern is an ordinary
  character; only an explicit ``ESCAPE`` clause sets one), ``%`` and ``_``
  are the only wildcards and ``_`` is one character (code point), not one
  byte;
* ``MATCHES`` -> ``regexp_matches(col, pattern)`` (RE2, search semantics);
  ``NOT MATCHES`` -> ``NOT regexp_matches(...)``.

String comparisons use DuckDB's default binary collation, i.e. UTF-8 byte
order, which is Unicode code-point order.
"""

from __future__ import annotations

import math

import duckdb

from engine.expr import And, Family, Node, Not, Op, Or, Pred, Xnor, Xor, literal_family, predicates

from tests.strategies import BOOLEAN_ATTRS, NUMERIC_ATTRS, STRING_ATTRS

#: the column types of tests/strategies.py's fixed schema.
STRATEGIES_SCHEMA: dict[str, str] = {
    **{a: "DOUBLE" for a in NUMERIC_ATTRS},
    **{a: "VARCHAR" for a in STRING_ATTRS},
    **{a: "BOOLEAN" for a in BOOLEAN_ATTRS},
}

_FAMILY_TYPE = {Family.NUMERIC: "DOUBLE", Family.STRING: "VARCHAR", Family.BOOLEAN: "BOOLEAN"}

_IDX = "__bexmatch_event_idx"


def quote_ident(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def sql_literal(value) -> str:
    if isinstance(value, bool):
        return "TRUE" if value else "FALSE"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if not math.isfinite(value):
            raise ValueError(f"no SQL literal for {value!r}")
        return f"CAST('{value!r}' AS DOUBLE)"
    if isinstance(value, str):
        return "'" + value.replace("'", "''") + "'"
    raise TypeError(f"not a literal: {value!r}")


def to_sql(node: Node) -> str:
    """A DuckDB boolean expression with the value of ``node`` (NULL kept)."""
    if isinstance(node, Pred):
        return _pred_sql(node)
    if isinstance(node, Not):
        return f"(NOT {to_sql(node.child)})"
    if isinstance(node, And):
        return "(" + " AND ".join(to_sql(c) for c in node.children) + ")" if node.children else "TRUE"
    if isinstance(node, Or):
        return "(" + " OR ".join(to_sql(c) for c in node.children) + ")" if node.children else "FALSE"
    if isinstance(node, Xor):
        x, y = to_sql(node.left), to_sql(node.right)
        return f"(({x} AND NOT {y}) OR (NOT {x} AND {y}))"
    if isinstance(node, Xnor):
        x, y = to_sql(node.left), to_sql(node.right)
        return f"(({x} AND {y}) OR (NOT {x} AND NOT {y}))"
    raise TypeError(f"not an expression node: {node!r}")


_CMP_SQL = {Op.EQ: "=", Op.NE: "<>", Op.LT: "<", Op.LE: "<=", Op.GT: ">", Op.GE: ">="}


def _pred_sql(p: Pred) -> str:
    col = quote_ident(p.attr)
    op, vs = p.op, p.values
    if op in _CMP_SQL:
        return f"({col} {_CMP_SQL[op]} {sql_literal(vs[0])})"
    if op in (Op.IN, Op.NOT_IN):
        items = ", ".join(sql_literal(v) for v in vs)
        return f"({col} {'IN' if op is Op.IN else 'NOT IN'} ({items}))"
    if op in (Op.BETWEEN, Op.NOT_BETWEEN):
        kw = "BETWEEN" if op is Op.BETWEEN else "NOT BETWEEN"
        return f"({col} {kw} {sql_literal(vs[0])} AND {sql_literal(vs[1])})"
    if op is Op.LIKE:
        return f"({col} LIKE {sql_literal(vs[0])})"
    if op is Op.NOT_LIKE:
        return f"({col} NOT LIKE {sql_literal(vs[0])})"
    if op is Op.MATCHES:
        return f"regexp_matches({col}, {sql_literal(vs[0])})"
    if op is Op.NOT_MATCHES:
        return f"(NOT regexp_matches({col}, {sql_literal(vs[0])}))"
    if op is Op.IS_NULL:
        return f"({col} IS NULL)"
    if op is Op.IS_NOT_NULL:
        return f"({col} IS NOT NULL)"
    raise ValueError(f"unknown operator {op!r}")


def infer_schema(exprs, events) -> dict[str, str]:
    """Column types from the literals of ``exprs`` and the values of
    ``events`` (numeric -> DOUBLE, string -> VARCHAR, boolean -> BOOLEAN;
    an attribute seen only in IS [NOT] NULL is VARCHAR)."""
    families: dict[str, set] = {}
    for e in exprs:
        for p in predicates(e):
            fams = families.setdefault(p.attr, set())
            fams.update(literal_family(v) for v in p.values)
    for ev in events:
        for a, v in ev.items():
            if v is not None:
                families.setdefault(a, set()).add(literal_family(v))
    schema = {}
    for a, fams in families.items():
        if len(fams) > 1:
            raise TypeError(f"attribute {a!r} used with several type families: {sorted(f.name for f in fams)}")
        schema[a] = _FAMILY_TYPE[next(iter(fams))] if fams else "VARCHAR"
    return schema


_ARROW_TYPES = {"DOUBLE": "float64", "VARCHAR": "string", "BOOLEAN": "bool_", "BIGINT": "int64"}


def _insert(con, table: str, schema: dict[str, str], events: list[dict]) -> None:
    """Insert one row per event: the event index, then one value per
    attribute of ``schema`` (NULL where absent).  Small batches go through
    ``executemany``; large ones through an Arrow table (pyarrow's first use
    in a process costs about a second, executemany about 4 ms per row)."""
    if not events:
        return
    attrs = list(schema)
    rows = None
    if len(events) > 200:
        try:
            import pyarrow as pa

            columns = {_IDX: pa.array(range(len(events)), type=pa.int64())}
            for k, a in enumerate(attrs):
                arrow_type = _ARROW_TYPES.get(schema[a].upper())
                columns[f"c{k}"] = pa.array([ev.get(a) for ev in events],
                                            type=getattr(pa, arrow_type)() if arrow_type else None)
            rows = pa.table(columns)
        except Exception:   # a value Arrow cannot type: let DuckDB say what is wrong
            rows = None
    if rows is None:
        marks = ", ".join("?" * (len(attrs) + 1))
        con.executemany(f"INSERT INTO {table} VALUES ({marks})",
                        [[j] + [ev.get(a) for a in attrs] for j, ev in enumerate(events)])
        return
    con.register("bexmatch_oracle_arrow", rows)
    try:
        con.execute(f"INSERT INTO {table} SELECT * FROM bexmatch_oracle_arrow")
    finally:
        con.unregister("bexmatch_oracle_arrow")


def duckdb_evaluate(exprs: list[Node], events: list[dict], schema: dict[str, str] | None = None,
                    con: duckdb.DuckDBPyConnection | None = None) -> list[list]:
    """Three-valued results: ``out[i][j]`` is True / False / None (NULL) for
    expression ``i`` on event ``j``, as computed by DuckDB.

    ``schema`` maps attribute -> DuckDB column type ("DOUBLE", "VARCHAR",
    "BOOLEAN", or any other DuckDB type); default: inferred from the
    literals and event values (`infer_schema`).  Event attributes outside
    the schema are ignored; a missing attribute or ``None`` is NULL.
    """
    exprs = list(exprs)
    events = list(events)
    if schema is None:
        schema = infer_schema(exprs, events)
    else:
        missing = {p.attr for e in exprs for p in predicates(e)} - set(schema)
        if missing:
            raise KeyError(f"attributes not in the schema: {sorted(missing)}")
    own = con is None
    if own:
        con = duckdb.connect(":memory:")
    try:
        attrs = list(schema)
        table = "bexmatch_oracle_events"
        cols = ", ".join([f"{quote_ident(_IDX)} BIGINT"] + [f"{quote_ident(a)} {schema[a]}" for a in attrs])
        con.execute(f"CREATE OR REPLACE TEMP TABLE {table} ({cols})")
        _insert(con, table, schema, events)
        out = [[None] * len(events) for _ in exprs]
        # Evaluate in chunks of columns to keep the SELECT list reasonable.
        chunk = 200
        for start in range(0, len(exprs), chunk):
            part = exprs[start:start + chunk]
            select = ", ".join([quote_ident(_IDX)] + [f"{to_sql(e)} AS e{k}" for k, e in enumerate(part)])
            for row in con.execute(f"SELECT {select} FROM {table} ORDER BY {quote_ident(_IDX)}").fetchall():
                j = row[0]
                for k, value in enumerate(row[1:]):
                    out[start + k][j] = value
        con.execute(f"DROP TABLE {table}")
        return out
    finally:
        if own:
            con.close()


def duckdb_matches(exprs: list[Node], events: list[dict], schema: dict[str, str] | None = None,
                   con: duckdb.DuckDBPyConnection | None = None) -> list[set[int]]:
    """``out[i]`` is the set of event indices on which expression ``i`` is
    TRUE (what ``SELECT idx FROM events WHERE <expr>`` returns)."""
    return [{j for j, v in enumerate(row) if v is True}
            for row in duckdb_evaluate(exprs, events, schema, con)]


def duckdb_where(expr: Node, events: list[dict], schema: dict[str, str] | None = None) -> set[int]:
    """The literal ``SELECT idx FROM events WHERE <expr>`` for one
    expression (slower than `duckdb_matches`, used to check that the
    WHERE-clause form and the column form agree)."""
    if schema is None:
        schema = infer_schema([expr], events)
    con = duckdb.connect(":memory:")
    try:
        attrs = list(schema)
        cols = ", ".join([f"{quote_ident(_IDX)} BIGINT"] + [f"{quote_ident(a)} {schema[a]}" for a in attrs])
        con.execute(f"CREATE TABLE events ({cols})")
        _insert(con, "events", schema, events)
        rows = con.execute(f"SELECT {quote_ident(_IDX)} FROM events WHERE {to_sql(expr)}").fetchall()
        return {r[0] for r in rows}
    finally:
        con.close()
