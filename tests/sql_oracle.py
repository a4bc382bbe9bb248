"""DuckDB as the test suite's oracle (docs/language.md#checking-against-sql).

An expression AST is translated into a SQL boolean expression and evaluated
by a real in-memory DuckDB over a table with one column per attribute, one
row per event, NULL where the event lacks the attribute.

Translation notes (checked by tests/test_semantics.py):

* identifiers are double-quoted (``"`` doubled), strings single-quoted
  (``'`` doubled), booleans ``TRUE``/``FALSE``, ints as integer literals and
  floats as ``CAST('<repr>' AS DOUBLE)`` (a bare ``0.1`` is a DECIMAL in
  DuckDB; the cast from the shortest repr is exact);
* ``XOR``/``XNOR`` as ``(x <> y)`` and ``(x = y)`` on the two boolean
  values: under three-valued logic these equal their definitions
  ``(x AND NOT y) OR (NOT x AND y)`` and ``(x AND y) OR (NOT x AND NOT y)``
  (NULL if either side is NULL, else the Boolean XOR / XNOR), without
  writing ``x`` and ``y`` twice -- the definitional form doubles the SQL at
  every nesting level, 2**40 times over for a chain 40 XORs deep
  (``to_sql(node, xor_by_definition=True)`` still writes it, and
  tests/test_conformance.py checks the two agree on every
  TRUE/FALSE/NULL pair);
* ``LIKE``/``NOT LIKE`` -> DuckDB ``LIKE``/``NOT LIKE`` as is: DuckDB's LIKE
  has no default escape character (a backslash in the pattern is an ordinary
  character; only an explicit ``ESCAPE`` clause sets one), ``%`` and ``_``
  are the only wildcards and ``_`` is one character (code point), not one
  byte;
* ``MATCHES`` -> ``regexp_matches(col, pattern)`` (RE2, search semantics);
  ``NOT MATCHES`` -> ``NOT regexp_matches(...)``.

String comparisons use DuckDB's default binary collation, i.e. UTF-8 byte
order, which is Unicode code-point order.

Exactness for the values users send (found by trying, with DuckDB 2.0.1,
and re-checked by `semantics_mismatches`, which tests/test_conformance.py
runs over every pool of tests/strategies.py):

* NUL: DuckDB's VARCHAR holds embedded NULs, in stored values (both the
  ``executemany`` and the Arrow insert) and in SQL string literals, and
  compares, LIKEs and regex-matches them as ordinary characters
  (``'a' < 'a\\x00' < 'a\\x00b' < 'a\\x00c'``; ``_`` matches a NUL).  So no
  value is routed around DuckDB and no BLOB column is needed.  Nothing
  is assumed: `duckdb_evaluate` and `duckdb_where` read every stored
  string and number and every string literal back, and raise
  `OracleCannotRepresent` if one comes back different, rather than
  compare against a value DuckDB did not hold.
* non-ASCII: stored as UTF-8, compared bytewise (= code points, astral
  characters included); LIKE's ``_`` and RE2's ``.`` are one code point,
  so ``e`` + U+0301 is two characters, as in the reference evaluator.
* numbers: ``-0.0`` and ``0.0`` are equal (as in Python and the engine);
  integers up to ±2**53 and any finite double (5e-324, 1e300) are exact
  in a DOUBLE column and as literals.
* a lone surrogate has no UTF-8 form: DuckDB cannot hold it, and
  `sql_literal` and the insert refuse it with `OracleCannotRepresent`
  (the engine refuses it too; tests/test_hostile_input.py checks that).
* RE2: DuckDB's ``regexp_matches`` and google-re2's ``search`` agree on
  every pattern of tests/strategies.py (``.`` does not match a newline in
  either; no ``(?i)``-style flags are added by DuckDB); a new pattern
  joins `semantics_mismatches`'s check through the strategies' pools.
"""

from __future__ import annotations

import math

import duckdb

from engine.expr import LIST_OPS, And, Family, Node, Not, Op, Or, Pred, Xnor, Xor, literal_family, predicates

from tests.strategies import BOOLEAN_ATTRS, NUMERIC_ATTRS, NUMERIC_LIST_ATTRS, STRING_ATTRS, STRING_LIST_ATTRS

#: the column types of tests/strategies.py's fixed schema.
STRATEGIES_SCHEMA: dict[str, str] = {
    **{a: "DOUBLE" for a in NUMERIC_ATTRS},
    **{a: "VARCHAR" for a in STRING_ATTRS},
    **{a: "BOOLEAN" for a in BOOLEAN_ATTRS},
    **{a: "DOUBLE[]" for a in NUMERIC_LIST_ATTRS},
    **{a: "VARCHAR[]" for a in STRING_LIST_ATTRS},
}

_FAMILY_TYPE = {Family.NUMERIC: "DOUBLE", Family.STRING: "VARCHAR", Family.BOOLEAN: "BOOLEAN",
                Family.NUMERIC_LIST: "DOUBLE[]", Family.STRING_LIST: "VARCHAR[]"}

_IDX = "__bexmatch_event_idx"


class OracleCannotRepresent(ValueError):
    """A value DuckDB cannot hold exactly (a lone surrogate), or one that
    came back from DuckDB different from what was given: the oracle refuses
    to answer rather than answer about another value."""


def _check_unicode(value: str) -> str:
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise OracleCannotRepresent(f"{value!r} has no UTF-8 form; DuckDB's VARCHAR cannot hold it") from exc
    return value


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
        return "'" + _check_unicode(value).replace("'", "''") + "'"
    raise TypeError(f"not a literal: {value!r}")


def to_sql(node: Node, xor_by_definition: bool = False) -> str:
    """A DuckDB boolean expression with the value of ``node`` (NULL kept)."""
    if isinstance(node, Pred):
        return _pred_sql(node)
    if isinstance(node, Not):
        return f"(NOT {to_sql(node.child, xor_by_definition)})"
    if isinstance(node, And):
        return "(" + " AND ".join(to_sql(c, xor_by_definition) for c in node.children) + ")" \
            if node.children else "TRUE"
    if isinstance(node, Or):
        return "(" + " OR ".join(to_sql(c, xor_by_definition) for c in node.children) + ")" \
            if node.children else "FALSE"
    if isinstance(node, (Xor, Xnor)):
        x, y = to_sql(node.left, xor_by_definition), to_sql(node.right, xor_by_definition)
        if not xor_by_definition:
            return f"({x} {'<>' if isinstance(node, Xor) else '='} {y})"
        if isinstance(node, Xor):
            return f"(({x} AND NOT {y}) OR (NOT {x} AND {y}))"
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
    if op in _LIST_SQL:
        function, negated = _LIST_SQL[op]
        operand = sql_literal(vs[0]) if op in (Op.CONTAINS, Op.NOT_CONTAINS) else _list_literal(vs)
        return f"({'NOT ' if negated else ''}{function}({col}, {operand}))"
    if op in (Op.IS_EMPTY, Op.IS_NOT_EMPTY):
        # NULL elements are ignored (docs/language.md#list-attributes): DuckDB's len counts them
        return f"(len(list_filter({col}, lambda x: x IS NOT NULL)) {'=' if op is Op.IS_EMPTY else '>'} 0)"
    raise ValueError(f"unknown operator {op!r}")


#: list operator -> (DuckDB list function, negated)
_LIST_SQL = {Op.ONE_OF: ("list_has_any", False), Op.NONE_OF: ("list_has_any", True),
             Op.ALL_OF: ("list_has_all", False), Op.NOT_ALL_OF: ("list_has_all", True),
             Op.CONTAINS: ("list_contains", False), Op.NOT_CONTAINS: ("list_contains", True)}


def _list_literal(values) -> str:
    """A list literal of one element type: numbers as DOUBLE (``[1, 2.5]``
    would be a DECIMAL list)."""
    if all(isinstance(v, str) for v in values):
        return "[" + ", ".join(sql_literal(v) for v in values) + "]"
    return "[" + ", ".join(f"CAST({sql_literal(v)} AS DOUBLE)" for v in values) + "]"


def infer_schema(exprs, events) -> dict[str, str]:
    """Column types from the literals of ``exprs`` and the values of
    ``events`` (numeric -> DOUBLE, string -> VARCHAR, boolean -> BOOLEAN;
    an attribute seen only in IS [NOT] NULL is VARCHAR)."""
    families: dict[str, set] = {}
    lists = {Family.NUMERIC: Family.NUMERIC_LIST, Family.STRING: Family.STRING_LIST}
    for e in exprs:
        for p in predicates(e):
            fams = families.setdefault(p.attr, set())
            fams.update(lists[literal_family(v)] if p.op in LIST_OPS else literal_family(v) for v in p.values)
    for ev in events:
        for a, v in ev.items():
            if isinstance(v, (list, tuple)):
                families.setdefault(a, set()).update(lists[literal_family(x)] for x in v if x is not None)
            elif v is not None:
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
    for event in events:
        for value in event.values():
            if isinstance(value, str):
                _check_unicode(value)
            elif isinstance(value, (list, tuple)):
                for item in value:
                    if isinstance(item, str):
                        _check_unicode(item)
    events = [{a: list(v) if isinstance(v, tuple) else v for a, v in event.items()} for event in events]
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


def _check_stored(con, table: str, schema: dict[str, str], events: list[dict]) -> None:
    """Every string and number of the events, read back from DuckDB, is
    the value given (NULs, astral characters and all); else
    `OracleCannotRepresent`."""
    attrs = [a for a in schema if schema[a].upper() in ("VARCHAR", "DOUBLE", "VARCHAR[]", "DOUBLE[]")]
    if not attrs or not events:
        return
    select = ", ".join(quote_ident(a) for a in attrs)
    rows = con.execute(f"SELECT {select} FROM {table} ORDER BY {quote_ident(_IDX)}").fetchall()
    for j, (event, row) in enumerate(zip(events, rows)):
        for a, stored in zip(attrs, row):
            given = event.get(a)
            if schema[a].endswith("[]"):
                if isinstance(given, (list, tuple)) and list(stored) != list(given):
                    raise OracleCannotRepresent(f"event {j}: {a!r} = {given!r} came back from DuckDB as {stored!r}")
                continue
            same_kind = isinstance(given, str) if schema[a].upper() == "VARCHAR" else \
                isinstance(given, (int, float)) and not isinstance(given, bool)
            if not same_kind or stored == given:     # (another kind: DuckDB's own cast, as before)
                continue
            raise OracleCannotRepresent(f"event {j}: {a!r} = {given!r} came back from DuckDB as {stored!r}")


def _check_literals(con, exprs) -> None:
    """Every string literal and pattern of ``exprs``, as DuckDB reads it
    from the SQL text, is the value of the AST; else `OracleCannotRepresent`."""
    texts = list(dict.fromkeys(v for e in exprs for p in predicates(e) for v in p.values
                               if isinstance(v, str)))
    for start in range(0, len(texts), 200):
        part = texts[start:start + 200]
        row = con.execute("SELECT " + ", ".join(sql_literal(v) for v in part)).fetchone()
        for given, read in zip(part, row):
            if read != given:
                raise OracleCannotRepresent(f"string literal {given!r} reads back from DuckDB as {read!r}")


def semantics_mismatches(values, like_patterns=(), regexes=(), con: duckdb.DuckDBPyConnection | None = None):
    """Where DuckDB's string semantics differ from Python's code-point order,
    the reference evaluator's LIKE and google-re2's search, over ``values``
    (each pair compared with ``<``, ``=``; each value against each pattern):
    a list of ``(what, value, operand, duckdb's answer)``, empty when the
    oracle is exact on them.  Values are stored in a table (the column
    path) and operands written as SQL literals (the literal path), as
    `duckdb_evaluate` does."""
    import re2

    from engine.reference import like

    values = list(dict.fromkeys(values))
    own = con is None
    if own:
        con = duckdb.connect(":memory:")
    out = []
    try:
        con.execute("CREATE OR REPLACE TEMP TABLE bexmatch_semantics (i BIGINT, s VARCHAR)")
        con.executemany("INSERT INTO bexmatch_semantics VALUES (?, ?)",
                        [[i, _check_unicode(v)] for i, v in enumerate(values)])

        checks = [("stored", None, "s", lambda v, _: v)]
        checks += [(kind, operand, f"s {kind} {sql_literal(operand)}", test) for operand in values
                   for kind, test in (("<", lambda v, o: v < o), ("=", lambda v, o: v == o))]
        checks += [("LIKE", p, f"s LIKE {sql_literal(p)}", like) for p in like_patterns]
        checks += [("MATCHES", p, f"regexp_matches(s, {sql_literal(p)})",
                    lambda v, p: re2.search(p, v) is not None) for p in regexes]
        for start in range(0, len(checks), 200):
            part = checks[start:start + 200]
            select = ", ".join(sql for _, _, sql, _ in part)
            rows = con.execute(f"SELECT {select} FROM bexmatch_semantics ORDER BY i").fetchall()
            for v, row in zip(values, rows):
                for (kind, operand, _, want), got in zip(part, row):
                    if got != want(v, operand):
                        out.append((kind, v, operand, got))
        con.execute("DROP TABLE bexmatch_semantics")
    finally:
        if own:
            con.close()
    return out


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
        _check_stored(con, table, schema, events)
        _check_literals(con, exprs)
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
        _check_stored(con, "events", schema, events)
        _check_literals(con, [expr])
        rows = con.execute(f"SELECT {quote_ident(_IDX)} FROM events WHERE {to_sql(expr)}").fetchall()
        return {r[0] for r in rows}
    finally:
        con.close()
