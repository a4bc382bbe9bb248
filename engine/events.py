"""Events -> columnar event batches (CSR: event offsets, attribute ids,
value codes), from a list of dicts, a pyarrow Table/RecordBatch (one row per
event, null = absent; a ``map<string, V>`` column holds attributes by name,
for sparse events over many attributes) or a pandas DataFrame.

Values are coded exactly like predicate operands (engine.schema): numbers as
float64, booleans as 0/1, strings as order-preserving codes.  Strings also
keep a per-batch *token* (index into the batch's distinct strings, found by
Arrow's hash kernels: exact for every string, NULs included) so that LIKE
and MATCHES are evaluated once per distinct string of the pattern's
attribute in a batch, not once per event.

Attributes that no subscription uses are ignored (docs/language.md#events-and-the-event-value-rule).  What an
attribute takes is one rule, the same for every input form:

* Absent: a missing key or None in a dict, a null in Arrow; in a DataFrame,
  pandas' missing markers (None, NaN, NaT, NA) -- a float column has no
  other way to leave a cell empty.
* Numeric: integers (Python int, NumPy integer, Arrow integer; not bool)
  within ±2**53; finite floats that float64 holds (Python float, NumPy
  floating, Arrow floating); decimals (``decimal.Decimal``, Arrow
  decimal32/64/128/256) that float64 holds as they are: finite, within
  ±2**53, and read back unchanged from the shortest form of their float64
  (19.99 does, 0.1000000000000000001 does not).  Such a decimal compares
  exactly like the float literal written with its digits; no decimal is
  rounded silently.
* String: ``str`` (Arrow string, large_string, string_view, or a dictionary
  of them) that is valid Unicode: a lone surrogate such as ``'\\ud800'``
  has no UTF-8 form.
* Boolean: ``bool``, ``numpy.bool_``, Arrow bool.
* An attribute that only IS [NOT] NULL reads (no family yet): any value,
  since presence is all that counts.

Any other value is wrong.  What happens then is the ``errors`` mode:

* ``"raise"`` (default): a :class:`engine.errors.BadEventError` (a
  SchemaError) naming the event (its position in the batch) and the
  attribute, in fields (``event``, ``attribute``, ``value``, ``reason``)
  and in its text;
* ``"null"``: the value is treated as absent;
* ``"report"``: nothing is raised; every bad event is encoded with no
  attributes at all, and the batch's ``rejected`` lists one BadEventError
  per bad event, ascending by event: its first problem, the columns taken
  in their order (a dict's keys in theirs; in a map column, its keys in
  the schema's attribute order).

An event that is not a mapping (dicts input) is a BadEventError with
``attribute`` None that is also a TypeError, and an attribute given twice
in one event (a column and a map key, or two columns of one name) a
BadEventError: raised with ``"raise"`` and ``"null"``, rejected with
``"report"``.  A DataFrame column goes through Arrow when pyarrow converts it
faithfully (one kind of value); an object column that mixes kinds, or that
pyarrow refuses, is read value by value under the dict rule.  A column
pandas holds as Arrow (``pd.ArrowDtype``) is that Arrow column, a map
column's keys included; an object column of dicts is a map column too,
each dict read as a dict event's attributes.  Run-end encoded Arrow columns are read as their
values.
"""

from __future__ import annotations

import math
import re
import sys
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from decimal import Decimal, InvalidOperation

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from engine.errors import BadEventError, SchemaError
from engine.expr import ELEMENT_OF, Family
from engine.schema import MAX_EXACT_INT, Schema, is_integer


@dataclass
class EventBatch:
    """A batch of events in CSR form; attribute ids ascending within each event."""

    offsets: np.ndarray   # int64 [n_events + 1]
    attr: np.ndarray      # int32 [nnz]
    value: np.ndarray     # float64 [nnz] codes
    token: np.ndarray     # int32 [nnz] index into `strings`, -1 for non-strings
    strings: pa.Array     # large_string: the batch's distinct strings, in order of first use
    #: errors="report": one BadEventError per refused event (encoded with no
    #: attributes), ascending by event; () otherwise
    rejected: tuple = ()
    #: the list predicates' truth per event list (`list_truth`): int64,
    #: packed CSR -- entries ``[0, n_rows]`` are offsets into this same
    #: array, then each row's TRUE keys ascending.  A list attribute's entry
    #: has ``token`` = its row and ``value`` = its distinct non-null elements.
    list_truth: np.ndarray = field(default_factory=lambda: np.ones(1, np.int64))
    #: the event lists (rows), CSR: each row's element keys ascending and
    #: distinct (numbers as themselves, strings as the schema's stable string
    #: id; a string no predicate mentions has no key), and each row's attribute
    list_offsets: np.ndarray = field(default_factory=lambda: np.zeros(1, np.int64))
    list_keys: np.ndarray = field(default_factory=lambda: np.zeros(0, np.float64))
    list_attr: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int32))

    @property
    def n_events(self) -> int:
        return len(self.offsets) - 1


_NO_STRINGS = pa.array([], pa.large_string())

_LONE_SURROGATE = re.compile("[\ud800-\udfff]")


_HINT = " (pass errors='null' to treat such values as absent, or errors='report' to set such events aside)"


def _value_error(event: int, attr: str, expected: Family, value) -> BadEventError:
    return BadEventError(event, attr, value, f"attribute {attr!r} is {expected.value}, got {_shown(value)}"
                                             f"{_why_refused(value, expected)}", _HINT)


class NotAnEventError(BadEventError, TypeError):
    """An event of a list that is not a mapping of attribute to value (a
    TypeError as well, as it always was)."""


class _Refusals:
    """The bad events of one batch being encoded, by the ``errors`` mode:
    ``"raise"`` raises the first one found, ``"null"`` forgets them, and
    ``"report"`` keeps one error per event -- the one of the lowest *rank*
    (the column's position; the first found among equals)."""

    def __init__(self, errors: str):
        self.errors = errors
        self.found: dict[int, tuple[int, BadEventError]] = {}

    def add(self, error: BadEventError, rank: int = 0) -> None:
        if self.errors == "raise":
            raise error
        if self.errors == "report":
            known = self.found.get(error.event)
            if known is None or known[0] > rank:
                self.found[error.event] = (rank, error)

    def wanted(self, rows, rank: int) -> list[int]:
        """Of the bad ``rows`` (ascending) of a column of rank ``rank``,
        those whose error would be kept: all with "report" (but events
        refused already for a column before), the first with "raise", none
        with "null"."""
        if self.errors == "null" or len(rows) == 0:
            return []
        if self.errors == "raise":
            return [int(rows[0])]
        found = self.found
        return [r for r in np.asarray(rows).tolist() if r not in found or found[r][0] > rank]

    def value(self, event: int, name: str, family: Family, value, rank: int = 0) -> None:
        """Refuse ``value`` (a Python object) as attribute ``name`` of event
        ``event`` (no error is even made with "null")."""
        if self.errors != "null":
            self.add(_value_error(event, name, family, value), rank)

    def values(self, rows, name: str, family: Family, values, rank: int) -> None:
        """Refuse the values ``values`` (Python objects) of attribute
        ``name`` at ``rows``."""
        for row, value in zip(rows, values):
            self.value(int(row), name, family, value, rank)

    def events(self) -> list[int]:
        return list(self.found)

    def rejected(self) -> tuple:
        return tuple(self.found[e][1] for e in sorted(self.found))


def _shown(value) -> str:
    """A refused value as its error shows it: its repr, shortened; only its
    type when it has no repr (an int of more than 4300 digits, a caller's
    class whose __repr__ raises)."""
    try:
        text = repr(value)
    except Exception:           # noqa: BLE001 -- whatever a caller's __repr__ raises, the error is ours to raise
        return f"a value of type {type(value).__name__}"
    return text if len(text) <= 100 else f"{text[:80]}... ({len(text)} characters)"


def _why_refused(value, family: Family) -> str:
    """Why a value of a kind the family takes is refused all the same ('' for
    a value of another kind: its type says it)."""
    if family in ELEMENT_OF:
        if isinstance(value, _LIST_TYPES) or isinstance(value, np.ndarray):
            return f": a list of {ELEMENT_OF[family].value} values (or None) is expected"
        return ": a list attribute takes a list (or tuple, set, array) of values"
    if family is Family.STRING and isinstance(value, str):
        return ": a lone surrogate is not valid Unicode"
    if family is not Family.NUMERIC or isinstance(value, (bool, np.bool_)):
        return ""
    if is_integer(value):
        return _BEYOND_2_53
    if isinstance(value, Decimal):
        finite = value.is_finite()
        if finite and value.copy_abs() > MAX_EXACT_INT:
            return _BEYOND_2_53
    elif isinstance(value, (float, np.floating)):
        finite = bool(np.isfinite(value))
    else:
        return ""
    return ": float64 cannot hold it as it is" if finite else ": not a finite number"


_BEYOND_2_53 = ": beyond ±2**53, where float64 cannot tell integers apart"


ERRORS_MODES = ("raise", "null", "report")


def _check_errors_mode(errors: str) -> None:
    if errors not in ERRORS_MODES:
        raise ValueError(f"errors must be 'raise', 'null' or 'report', not {errors!r}")


def _event_attr_order(event_idx: np.ndarray, attr: np.ndarray) -> np.ndarray:
    """The stable order by (event, attribute) -- ``np.lexsort((attr,
    event_idx))`` -- as one stable sort of a composite int64 key: many
    times faster where the entries already come event by event (map
    columns; BENCHMARKS.md, "Event encoding")."""
    if len(attr) == 0:
        return np.zeros(0, np.int64)
    width = int(attr.max()) + 1
    return np.argsort(event_idx.astype(np.int64) * width + attr, kind="stable")


_LIST_TYPES = (list, tuple, set, frozenset)


def _missing_element(item, element_family: Family) -> bool:
    """Whether a list element is a missing one, dropped: None, pandas' NA
    and NaT, and a float NaN in a list of strings (pandas' missing string;
    in a list of numbers a NaN is a bad number, which refuses the list)."""
    if item is None:
        return True
    if isinstance(item, float):
        return item != item and element_family is Family.STRING
    pandas = sys.modules.get("pandas")      # (never imported here: an NA exists only if pandas is)
    return pandas is not None and (item is pandas.NA or item is pandas.NaT)


def list_elements(raw, family: Family) -> list | None:
    """The elements of one event list under the dict rule (missing elements
    dropped: :func:`_missing_element`), or None when the value is not a
    list of the family's elements: a list, tuple, set or 1-D array of
    numbers (not booleans) or of valid strings."""
    if isinstance(raw, np.ndarray) and raw.ndim == 1:
        if raw.dtype.kind in "mM":      # durations and dates: tolist() would make some of them ints
            return None
        raw = raw.tolist()
    if not isinstance(raw, _LIST_TYPES):
        return None
    element_family = ELEMENT_OF[family]
    elements = []
    for item in raw:
        if _missing_element(item, element_family):
            continue
        code = _code(item, element_family)
        if code is None:
            return None
        elements.append(item if element_family is Family.STRING else code)
    return elements


class _ListCells:
    """The list values of a batch being encoded: each one's entry position
    among the batch's entries and its elements, numbers and strings apart
    (``parent``: the list each element belongs to, in order of addition)."""

    def __init__(self):
        self.positions: list = []
        self.numbers: list = []     # (parent, float64 values)
        self.strings: list = []     # (parent, large_string array)
        self.n = 0

    def add(self, positions, parents, elements, element_family: Family) -> None:
        """Lists at entry ``positions``; ``elements`` (float64 array or
        Arrow string array, no nulls) of list ``parents[k]`` (0-based among
        these)."""
        positions = np.asarray(positions, np.int64)
        parents = np.asarray(parents, np.int64) + self.n
        if element_family is Family.STRING:
            self.strings.append((parents, pc.cast(elements, pa.large_string())))
        else:
            self.numbers.append((parents, np.asarray(elements, np.float64)))
        self.positions.append(positions)
        self.n += len(positions)

    def add_arrow(self, positions, lists, element_family: Family) -> None:
        """Lists at entry ``positions`` from an Arrow list array (no null
        lists) whose elements passed the family's checks; null elements are
        dropped."""
        parents = pc.list_parent_indices(lists).to_numpy(zero_copy_only=False)
        flat = pc.list_flatten(lists)
        if pa.types.is_dictionary(flat.type):
            flat = flat.dictionary_decode()
        if flat.null_count:
            valid = flat.is_valid()
            parents, flat = parents[valid.to_numpy(zero_copy_only=False)], flat.filter(valid)
        if element_family is not Family.STRING:
            flat = decimal_codes(flat) if pa.types.is_decimal(flat.type) else \
                pc.cast(flat, pa.float64()).to_numpy(zero_copy_only=False)
        self.add(positions, parents, flat, element_family)

    def rows(self, schema: Schema, keep: np.ndarray | None):
        """(entry positions, distinct element counts, list offsets, keys):
        the lists of the entries ``keep`` keeps (all when None), renumbered
        in order, positions among the kept entries."""
        positions = np.concatenate(self.positions) if self.positions else np.zeros(0, np.int64)
        cell_keep = np.ones(self.n, bool) if keep is None else keep[positions]
        new_cell = np.cumsum(cell_keep) - 1
        if keep is not None:
            positions = (np.cumsum(keep) - 1)[positions[cell_keep]]
        n_rows = len(positions)
        counts = np.zeros(n_rows, np.int64)
        parents, keys = [], []
        if self.numbers:
            parent = np.concatenate([p for p, _ in self.numbers])
            key = np.concatenate([v for _, v in self.numbers])
            kept = cell_keep[parent]
            parent, key = _distinct_pairs(new_cell[parent[kept]], key[kept])
            counts += np.bincount(parent, minlength=n_rows)
            parents.append(parent)
            keys.append(key)
        if self.strings:
            parent = np.concatenate([p for p, _ in self.strings])
            strings = pa.chunked_array([a for _, a in self.strings], pa.large_string()).combine_chunks()
            kept = cell_keep[parent]
            encoded = pc.dictionary_encode(strings.filter(pa.array(kept)))
            token = encoded.indices.to_numpy(zero_copy_only=False).astype(np.int64)
            parent, token = _distinct_pairs(new_cell[parent[kept]], token)
            counts += np.bincount(parent, minlength=n_rows)      # every distinct string counts
            ids = np.array([schema.string_id_of(v) for v in encoded.dictionary.to_pylist()] or [-1], np.int64)
            known = ids[token] >= 0                 # a string no predicate mentions has no key
            parents.append(parent[known])
            keys.append(ids[token[known]].astype(np.float64))
        parent = np.concatenate(parents) if parents else np.zeros(0, np.int64)
        key = np.concatenate(keys) if keys else np.zeros(0, np.float64)
        order = np.lexsort((key, parent))       # (a list is of one family: its keys are all of one part)
        parent, key = parent[order], key[order]
        offsets = np.concatenate(([0], np.cumsum(np.bincount(parent, minlength=n_rows)))).astype(np.int64)
        return positions, counts.astype(np.float64), offsets, key


def _distinct_pairs(parent: np.ndarray, key: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The distinct (parent, key) pairs, ordered by both."""
    order = np.lexsort((key, parent))
    parent, key = parent[order], key[order]
    first = np.ones(len(key), bool)
    first[1:] = (parent[1:] != parent[:-1]) | (key[1:] != key[:-1])
    return parent[first], key[first]


def _assemble(schema: Schema, n_events: int, event_idx, attr, value, string_positions, strings: pa.Array,
              check_repeats: bool = False, refusals: _Refusals | None = None,
              lists: _ListCells | None = None) -> EventBatch:
    """The batch of entries given in any order; ``strings`` (large_string)
    holds the values of the entries at ``string_positions``, ``lists`` the
    list values.  The entries of the events ``refusals`` rejected are left
    out."""
    event_idx = np.asarray(event_idx, dtype=np.int64)
    attr = np.asarray(attr, dtype=np.int32)
    value = np.asarray(value, dtype=np.float64)
    string_positions = np.asarray(string_positions, dtype=np.int64)
    order = None
    if check_repeats and len(attr) > 1:
        order = _event_attr_order(event_idx, attr)
        _refuse_repeats(schema, event_idx[order], attr[order], refusals or _Refusals("raise"))
    keep = None
    if refusals is not None and refusals.found:
        keep = ~np.isin(event_idx, np.array(refusals.events(), np.int64))
        if not keep.all():
            order = None
            kept_strings = keep[string_positions]
            strings = strings.filter(pa.array(kept_strings))
            string_positions = (np.cumsum(keep) - 1)[string_positions[kept_strings]]
            event_idx, attr, value = event_idx[keep], attr[keep], value[keep]
    token = np.full(len(attr), -1, dtype=np.int32)
    distinct = _NO_STRINGS
    if len(string_positions):
        encoded = pc.dictionary_encode(strings)     # hashes the UTF-8 bytes: exact, NULs and all
        distinct = encoded.dictionary
        tokens = encoded.indices.to_numpy()
        value[string_positions] = schema.encode_strings(distinct)[tokens]
        token[string_positions] = tokens
    list_fields = {}
    if lists is not None and lists.n:
        # a list entry: value = its distinct elements, token = its row
        positions, counts, list_offsets, list_keys = lists.rows(schema, None if keep is None or keep.all() else keep)
        value[positions] = counts
        token[positions] = np.arange(len(positions), dtype=np.int32)
        list_fields = dict(list_offsets=list_offsets, list_keys=list_keys, list_attr=attr[positions].copy())
    if n_events == 1:           # (one event: its attributes' order, without the batch's composite key)
        order = np.argsort(attr, kind="stable") if order is None else order
        offsets = np.array([0, len(attr)], np.int64)
    else:
        if order is None:
            order = _event_attr_order(event_idx, attr)
        counts = np.bincount(event_idx, minlength=n_events) if len(event_idx) else np.zeros(n_events, np.int64)
        offsets = np.concatenate(([0], np.cumsum(counts))).astype(np.int64)
    rejected = refusals.rejected() if refusals is not None else ()
    return EventBatch(offsets, attr[order], value[order], token[order], distinct, rejected, **list_fields)


def given_twice(event: int, name: str) -> BadEventError:
    """The error of an event that gives attribute ``name`` twice, in every
    encoder's words."""
    return BadEventError(event, name, None, f"attribute {name!r} is given twice (a column and a map key, two "
                                            f"columns of one name, or keys of two maps)")


def _refuse_repeats(schema: Schema, e: np.ndarray, a: np.ndarray, refusals: _Refusals) -> None:
    """An attribute given twice in one event (a column and a map key, or
    two columns of one name) is an error of that event: the first one of
    each event (by attribute id), or of the first event with "raise".
    ``e``, ``a``: the entries' events and attributes, ordered by both."""
    twice = np.flatnonzero((e[1:] == e[:-1]) & (a[1:] == a[:-1]))
    if len(twice) == 0:
        return
    _, first = np.unique(e[twice], return_index=True)
    if refusals.errors != "report":
        first = first[:1]           # "null" is about values: a repeated attribute is an error still
    for k in twice[first].tolist():
        name = schema.attr_names[int(a[k])]
        error = given_twice(int(e[k]), name)
        if refusals.errors != "report":
            raise error
        refusals.add(error, rank=_AFTER_VALUES)


#: the rank of a repeated attribute among an event's problems: after its
#: values, which "raise" finds first
_AFTER_VALUES = 1 << 62


def _one_string_array(parts) -> pa.Array:
    """The large_string arrays and chunked arrays ``parts`` end to end, as one array."""
    chunks = [chunk for part in parts for chunk in (part.chunks if isinstance(part, pa.ChunkedArray) else [part])]
    return pa.chunked_array(chunks, pa.large_string()).combine_chunks()


def from_dicts(events, schema: Schema, errors: str = "raise") -> EventBatch:
    """Encode a sequence of ``{attribute: value}`` dicts (None = absent)."""
    _check_errors_mode(errors)
    events = list(events)
    attr_ids, families = schema.attr_ids, schema.families
    refusals = _Refusals(errors)
    event_idx, attrs, values, string_positions, strings = [], [], [], [], []
    list_at, list_parents, list_items = {}, {}, {}      # per element family
    for i, event in enumerate(events):
        if not isinstance(event, Mapping):
            error = NotAnEventError(i, None, event, f"not a mapping of attribute to value "
                                                    f"(type {type(event).__name__})")
            if errors != "report":
                raise error
            refusals.add(error)
            continue
        for name, raw in event.items():
            attr = attr_ids.get(name)
            if attr is None and not isinstance(name, str):
                # an attribute is named by a str: such a key is no attribute's, and is not passed over unsaid
                refusals.add(BadEventError(i, None, name, f"key {_shown(name)} ({type(name).__name__}) is not an "
                                           f"attribute name: attribute names are str"))
                if errors == "report":
                    break
                continue
            if attr is None or raw is None:
                continue
            family = families[name]
            if family in ELEMENT_OF:
                elements = list_elements(raw, family)
                if elements is None:
                    refusals.value(i, name, family, raw)
                    if errors == "report":
                        break
                    continue
                element_family = ELEMENT_OF[family]
                at = list_at.setdefault(element_family, [])
                list_parents.setdefault(element_family, []).extend([len(at)] * len(elements))
                list_items.setdefault(element_family, []).extend(elements)
                at.append(len(values))
                event_idx.append(i)
                attrs.append(attr)
                values.append(0.0)
                continue
            code = _code(raw, family)
            if code is None:
                refusals.value(i, name, family, raw)
                if errors == "report":
                    break           # the event is refused: its first problem is the one reported
                continue
            if family is Family.STRING:
                string_positions.append(len(values))
                strings.append(raw)
            event_idx.append(i)
            attrs.append(attr)
            values.append(code)
    lists = _ListCells()
    for element_family, at in list_at.items():
        items = list_items[element_family]
        lists.add(at, list_parents[element_family],
                  pa.array(items, pa.large_string()) if element_family is Family.STRING else np.array(items, np.float64),
                  element_family)
    return _assemble(schema, len(events), event_idx, attrs, values, np.array(string_positions, np.int64),
                     pa.array(strings, pa.large_string()) if strings else _NO_STRINGS, refusals=refusals,
                     lists=lists)


def _code(raw, family: Family | None) -> float | None:
    """The numeric code of one event value, or None if the attribute does
    not take it (the module's rule).  Strings get their code later,
    vectorised."""
    kind = type(raw)        # the common cases first: a single event pays for each attribute's checks
    if family is Family.NUMERIC and (kind is float or kind is int):
        if kind is int:
            return float(raw) if -MAX_EXACT_INT <= raw <= MAX_EXACT_INT else None
        return raw if math.isfinite(raw) else None
    if family is None:      # only IS [NOT] NULL uses the attribute: presence is all that counts
        return 0.0
    if family is Family.BOOLEAN:
        return float(raw) if isinstance(raw, (bool, np.bool_)) else None
    if family is Family.STRING:
        valid = isinstance(raw, str) and (raw.isascii() or _LONE_SURROGATE.search(raw) is None)
        return 0.0 if valid else None
    if isinstance(raw, (bool, np.bool_)):
        return None
    if is_integer(raw):
        return float(raw) if abs(int(raw)) <= MAX_EXACT_INT else None
    if isinstance(raw, (float, np.floating)):
        number = float(raw)
        return number if math.isfinite(number) and number == raw else None    # a longdouble may not fit
    if isinstance(raw, Decimal):
        return _decimal_code(raw)
    return None


def _decimal_code(value: Decimal) -> float | None:
    """The float64 of a decimal that float64 holds as it is (finite, within
    ±2**53, and the shortest form of its float64 is the same number), else
    None."""
    if not value.is_finite() or value.copy_abs() > MAX_EXACT_INT:
        return None
    number = float(value)       # the nearest float64
    return number if Decimal(repr(number)) == value else None


def plain_value(value):
    """An event value as the Python value the encoder reads it as: NumPy
    booleans, integers and floats as ``bool``, ``int`` and ``float`` (a
    float32 as its float64, not its shortest text), a decimal as its
    float64 where the value rule takes it, a list's elements alike; for
    :func:`engine.explain.explain`, whose reference evaluator compares
    Python values (NumPy's would compare a float32 in float32)."""
    if isinstance(value, (bool, np.bool_)):
        return bool(value)
    if is_integer(value):
        return int(value)
    if isinstance(value, np.floating):
        return float(value)
    if isinstance(value, Decimal):
        code = _decimal_code(value)
        return value if code is None else code
    if isinstance(value, np.ndarray) and value.ndim == 1 and value.dtype.kind not in "mM":
        value = value.tolist()      # as list_elements reads it: a masked array's masked elements are None
    if isinstance(value, (list, tuple, set, frozenset, np.ndarray)):
        # the missing elements the encoder drops (a list it refuses never gets here: explain checks first)
        return [plain_value(element) for element in value if not _missing_element(element, Family.STRING)]
    return value


def decimal_codes(values) -> np.ndarray:
    """:func:`_decimal_code` of each value of an Arrow decimal array (or
    chunked array), NaN where it refuses the value and for nulls.  Each
    distinct value is converted once, by Python's exact Decimal: Arrow's
    decimal -> float64 cast is not always the nearest float64."""
    if isinstance(values, pa.ChunkedArray):
        values = values.combine_chunks()
    if values.type.bit_width < 128:         # decimal32/64: Arrow has no dictionary_encode kernel for them
        values = values.cast(pa.decimal128(values.type.precision, values.type.scale))
    encoded = pc.dictionary_encode(values)
    codes = [_decimal_code(d) for d in encoded.dictionary.to_pylist()]
    codes = np.array([math.nan if c is None else c for c in codes] + [math.nan])    # the last: nulls
    return codes[pc.fill_null(encoded.indices, len(codes) - 1).to_numpy()]


def exact_floats(values) -> tuple[np.ndarray, np.ndarray]:
    """``(float64 values, refused)`` of an Arrow integer, float, decimal or
    boolean array (nulls: 0, not refused), by the value rule that events and
    subscription operands share: integers beyond ±2**53 compared as
    integers (as float64, 2**53 + 1 would pass), decimals converted exactly
    and refused unless float64 holds them as they are, floats refused when
    not finite."""
    if isinstance(values, pa.ChunkedArray):
        values = values.combine_chunks()
    if pa.types.is_dictionary(values.type):
        values = values.dictionary_decode()
    if pa.types.is_decimal(values.type):
        codes = decimal_codes(values)
        refused = np.isnan(codes) & values.is_valid().to_numpy(zero_copy_only=False)
        return np.where(np.isnan(codes), 0.0, codes), refused
    if pa.types.is_integer(values.type):
        raw = pc.fill_null(values, 0).to_numpy(zero_copy_only=False)
        return raw.astype(np.float64), _bad_numbers(raw)
    raw = pc.fill_null(pc.cast(values, pa.float64()), 0.0).to_numpy(zero_copy_only=False)
    return raw, _bad_numbers(raw)


def _arrow_family(dtype: pa.DataType) -> Family | None:
    if pa.types.is_dictionary(dtype):
        dtype = dtype.value_type
    if pa.types.is_boolean(dtype):
        return Family.BOOLEAN
    if pa.types.is_integer(dtype) or pa.types.is_floating(dtype) or pa.types.is_decimal(dtype):
        return Family.NUMERIC
    if pa.types.is_string(dtype) or pa.types.is_large_string(dtype) or pa.types.is_string_view(dtype):
        return Family.STRING
    return None


def from_arrow(table, schema: Schema, errors: str = "raise") -> EventBatch:
    """Encode a pyarrow Table or RecordBatch: one row per event, one column
    per attribute, null = absent."""
    _check_errors_mode(errors)
    return _from_columns(zip(table.schema.names, table.columns), table.num_rows, schema, _Refusals(errors))


def _refuse_cells(refusals: _Refusals, rows, name: str, family: Family, column, rank: int) -> None:
    """Refuse the cells of ``column`` (an Arrow array or chunked array of
    attribute ``name``) at ``rows``, those the errors mode asks for."""
    rows = refusals.wanted(rows, rank)
    if rows:
        try:
            values = column.take(pa.array(rows, pa.int64())).to_pylist()
        except pa.ArrowNotImplementedError:     # no take kernel for the type (string_view in pyarrow 2x)
            values = [column[row].as_py() for row in rows]
        refusals.values(rows, name, family, values, rank)


def _from_columns(columns, n_events: int, schema: Schema, refusals: _Refusals) -> EventBatch:
    """Encode ``(name, Arrow array or chunked array)`` columns of
    ``n_events`` rows each: attributes by column name, or by key in
    ``map<string, V>`` columns.  ``refusals`` may hold errors of the
    columns already (pandas values read by the dict rule)."""
    event_idx, attrs, values, string_positions, string_parts = [], [], [], [], []
    size = 0
    names = []
    has_map = False
    lists = _ListCells()
    for rank, (name, column) in enumerate(columns):
        names.append(name)
        if not pa.types.is_map(column.type):
            attr = schema.attr_ids.get(name)
            if attr is None or column.null_count == len(column):
                continue                # unknown, or absent from every event (wide, sparse tables: most columns)
        column = without_views(column)
        if pa.types.is_map(column.type):
            _check_map_keys(column.type, name)
            column = _with_valid_utf8(column, name, schema, refusals, rank)
        if pa.types.is_map(column.type) and _is_list_type(column.type.item_type):
            rows, attr = _map_list_cells(column, schema, refusals, rank, lists, size)
            event_idx.append(rows)
            attrs.append(attr)
            values.append(np.zeros(len(rows)))
            size += len(rows)
            has_map = True
            continue
        if pa.types.is_map(column.type):
            rows, attr, codes, string_at, strings = _map_cells(column, schema, refusals, rank)
            event_idx.append(rows)
            attrs.append(attr)
            values.append(codes)
            string_positions.append(size + string_at)
            string_parts.append(strings)
            size += len(rows)
            has_map = True
            continue
        column = _with_valid_utf8(column, name, schema, refusals, rank)
        family = schema.families[name]
        if family in ELEMENT_OF or _is_list_type(column.type):
            rows = _list_column(column, name, family, refusals, rank, lists, size)
            event_idx.append(rows)
            attrs.append(np.full(len(rows), attr, np.int32))
            values.append(np.zeros(len(rows)))
            size += len(rows)
            continue
        if family is Family.NUMERIC and _plain_number_type(column.type):
            rows, codes = _numbers_of(column)      # straight from the Arrow buffers
        else:
            valid = column.is_valid().to_numpy(zero_copy_only=False)
            rows = np.flatnonzero(valid)
            if family is None:
                codes = np.zeros(len(rows))
            elif _arrow_family(column.type) is not family:
                _refuse_cells(refusals, rows, name, family, column, rank)
                continue
            elif family is Family.STRING:
                codes = np.zeros(len(rows))
                string_positions.append(size + np.arange(len(rows)))
                string_parts.append(pc.drop_null(pc.cast(column, pa.large_string())))
            else:
                if pa.types.is_dictionary(column.type):
                    column = column.cast(column.type.value_type)
                if pa.types.is_decimal(column.type):
                    codes = decimal_codes(column)[rows]        # NaN where the decimal rule refuses
                elif pa.types.is_integer(column.type):   # keep int64 exact until the ±2**53 check
                    codes = pc.fill_null(column, 0).to_numpy(zero_copy_only=False)[rows]
                else:
                    codes = pc.cast(column, pa.float64()).to_numpy(zero_copy_only=False)[rows]
        if family is Family.NUMERIC:
            bad = _bad_numbers(codes)
            if bad.any():
                _refuse_cells(refusals, rows[bad], name, family, column, rank)
                rows, codes = rows[~bad], codes[~bad]
        event_idx.append(rows)
        attrs.append(np.full(len(rows), attr, np.int32))
        values.append(codes.astype(np.float64, copy=False))
        size += len(rows)
    if not attrs:
        return _assemble(schema, n_events, [], [], [], np.zeros(0, np.int64), _NO_STRINGS, refusals=refusals)
    positions = np.concatenate(string_positions) if string_positions else np.zeros(0, np.int64)
    return _assemble(schema, n_events, np.concatenate(event_idx), np.concatenate(attrs), np.concatenate(values),
                     positions, _one_string_array(string_parts),
                     check_repeats=has_map or len(set(names)) < len(names), refusals=refusals, lists=lists)


def _is_list_type(dtype: pa.DataType) -> bool:
    return pa.types.is_list(dtype) or pa.types.is_large_list(dtype) or pa.types.is_fixed_size_list(dtype) \
        or pa.types.is_list_view(dtype) or pa.types.is_large_list_view(dtype)


#: the element "family" of ``list<null>``: lists with no element but nulls, which fit any list attribute
_NULL_ELEMENTS = object()


def _list_element_family(dtype: pa.DataType) -> Family | None:
    """The element family of an Arrow list type (None for another type);
    a list of nulls only (``list<null>``: empty lists) fits any list family."""
    if not _is_list_type(dtype):
        return None
    value_type = dtype.value_type
    if pa.types.is_null(value_type):
        return _NULL_ELEMENTS
    family = _arrow_family(value_type)
    return family if family in (Family.NUMERIC, Family.STRING) else None


def _list_column(column, name: str, family: Family | None, refusals: _Refusals, rank: int, lists: _ListCells,
                 size: int) -> np.ndarray:
    """The valid cells of an Arrow list column of list attribute ``name``
    added to ``lists`` (entries at ``size`` on); returns their rows.  A
    column of another type, or a cell with a number float64 cannot hold,
    is refused cell by cell as any wrong value is."""
    if isinstance(column, pa.ChunkedArray):
        column = column.combine_chunks()
    valid = column.is_valid().to_numpy(zero_copy_only=False)
    rows = np.flatnonzero(valid)
    element = _list_element_family(column.type)
    if family is None or family not in ELEMENT_OF:
        if family is None:           # only IS [NOT] NULL reads it: presence is all
            return rows
        _refuse_cells(refusals, rows, name, family, column, rank)
        return np.zeros(0, np.int64)
    if element is None or (element is not _NULL_ELEMENTS and element is not ELEMENT_OF[family]):
        _refuse_cells(refusals, rows, name, family, column, rank)
        return np.zeros(0, np.int64)
    cells = column.filter(pa.array(valid))
    if element is _NULL_ELEMENTS:
        lists.add(size + np.arange(len(rows)), np.zeros(0, np.int64), np.zeros(0), Family.NUMERIC)
        return rows
    if element is Family.NUMERIC:
        bad_cells = _lists_with_bad_numbers(cells)
        if len(bad_cells):
            _refuse_cells(refusals, rows[bad_cells], name, family, column, rank)
            keep = np.ones(len(rows), bool)
            keep[bad_cells] = False
            rows, cells = rows[keep], cells.filter(pa.array(keep))
    lists.add_arrow(size + np.arange(len(rows)), cells, ELEMENT_OF[family])
    return rows


def _is_view(dtype: pa.DataType) -> bool:
    return pa.types.is_string_view(dtype) or pa.types.is_list_view(dtype) or pa.types.is_large_list_view(dtype)


def without_views(column):
    """An event column (or a map's values) in the layouts this module's
    pyarrow kernels read: run-end encoded ones decoded, a dictionary of lists as its lists, string views
    as large strings (no take or filter kernel reads them, so neither a
    dictionary of them nor a map's values could be decoded), and list
    views rebuilt as large lists from their views' lengths and values
    (pyarrow's cast makes non-monotonic offsets when an empty view sits at
    offset 0 -- an invalid array that reads wrong without an error;
    tests/test_lists.py's views in any order)."""
    dtype = column.type
    if pa.types.is_run_end_encoded(dtype):          # runs of one value: the values, one a row
        return without_views(pc.run_end_decode(column))
    if pa.types.is_dictionary(dtype) and pa.types.is_string_view(dtype.value_type):
        if isinstance(column, pa.ChunkedArray):
            return pa.chunked_array([without_views(chunk) for chunk in column.chunks], pa.large_string())
        return column.dictionary.cast(pa.large_string()).take(column.indices)
    if pa.types.is_dictionary(dtype) and _is_list_type(dtype.value_type):
        # a dictionary of lists (each cell its dictionary entry's list): the lists themselves
        chunks = column.chunks if isinstance(column, pa.ChunkedArray) else [column]
        lists = [without_views(chunk.dictionary.take(chunk.indices)) for chunk in chunks]
        return pa.chunked_array(lists) if isinstance(column, pa.ChunkedArray) else lists[0]
    if pa.types.is_string_view(dtype):
        return column.cast(pa.large_string())
    if not (_is_list_type(dtype) and (_is_view(dtype) or _is_view(dtype.value_type))):
        return column
    if isinstance(column, pa.ChunkedArray):
        column = column.combine_chunks()
    values = without_views(pc.list_flatten(column))     # the cells' values in order, null cells skipped
    lengths = pc.list_value_length(column).fill_null(0).to_numpy(zero_copy_only=False)
    offsets = np.zeros(len(column) + 1, np.int64)
    np.cumsum(lengths, out=offsets[1:])
    return pa.LargeListArray.from_arrays(pa.array(offsets), values, mask=pc.invert(column.is_valid()))


def _holds_strings(dtype: pa.DataType) -> bool:
    """Whether values of ``dtype`` hold Arrow strings anywhere (views are gone by now)."""
    if pa.types.is_string(dtype) or pa.types.is_large_string(dtype):
        return True
    if pa.types.is_dictionary(dtype):
        return _holds_strings(dtype.value_type)
    if pa.types.is_map(dtype):
        return _holds_strings(dtype.key_type) or _holds_strings(dtype.item_type)
    return _is_list_type(dtype) and _holds_strings(dtype.value_type)


def _bad_utf8(array) -> np.ndarray:
    """Per position of an Arrow array (views gone), whether its value holds a
    string that is not valid UTF-8 (anywhere inside a list or map).  Arrow
    lets such bytes into a string array from Parquet, IPC or a binary
    array's view, and pyarrow raises a UnicodeDecodeError only when one is
    read into Python -- deep inside the encoding, or never, where a string
    is compared by its bytes."""
    dtype = array.type
    none = np.zeros(len(array), bool)
    if pa.types.is_dictionary(dtype):
        entries = _bad_utf8(array.dictionary)
        if not entries.any():
            return none
        return entries[pc.fill_null(array.indices, 0).to_numpy(zero_copy_only=False)] \
            & array.is_valid().to_numpy(zero_copy_only=False)
    if pa.types.is_string(dtype) or pa.types.is_large_string(dtype):
        try:
            array.validate(full=True)
            return none
        except pa.ArrowInvalid:
            pass                             # found one: which cells (the slow way, on this rare path only)
        raw = pc.cast(array, pa.large_binary()).to_pylist()
        return np.array([value is not None and not _decodes(value) for value in raw], bool)
    if pa.types.is_map(dtype) or _is_list_type(dtype):
        if pa.types.is_fixed_size_list(dtype):
            array = array.cast(pa.large_list(dtype.value_type))
        offsets = array.offsets.to_numpy()
        lo, hi = int(offsets[0]), int(offsets[-1])
        if pa.types.is_map(dtype):
            inner = _bad_utf8(array.keys.slice(lo, hi - lo)) | _bad_utf8(array.items.slice(lo, hi - lo))
        else:
            inner = _bad_utf8(array.values.slice(lo, hi - lo))
        parents = np.repeat(np.arange(len(array)), np.diff(offsets))
        none[parents[inner]] = True
        return none
    return none


def _decodes(value: bytes) -> bool:
    try:
        value.decode("utf-8")
        return True
    except UnicodeDecodeError:
        return False


_NOT_UTF8 = "holds a string that is not valid UTF-8"


def _with_valid_utf8(column, name: str, schema: Schema, refusals: _Refusals, rank: int):
    """``column`` (attribute ``name``, or a ``map<string, V>`` column of
    attributes) with each value holding a string that is not valid UTF-8
    refused by the errors mode and then made null (a map: that entry
    removed) -- as a lone surrogate is refused in a Python string."""
    if not _holds_strings(column.type):
        return column
    try:
        column.validate(full=True)           # one pass in C++: the common case ends here
        return column
    except pa.ArrowInvalid:
        pass
    if isinstance(column, pa.ChunkedArray):
        column = column.combine_chunks()
    if not pa.types.is_map(column.type):
        bad = _bad_utf8(column)
        for row in refusals.wanted(np.flatnonzero(bad), rank):
            refusals.add(BadEventError(row, name, None, f"attribute {name!r} {_NOT_UTF8}", _HINT), rank)
        return column.take(pa.array(np.arange(len(column)), mask=bad))
    offsets = column.offsets.to_numpy()
    lo, hi = int(offsets[0]), int(offsets[-1])
    keys, items = column.keys.slice(lo, hi - lo), column.items.slice(lo, hi - lo)
    rows = np.repeat(np.arange(len(column)), np.diff(offsets))
    bad_key = _bad_utf8(keys)                # no attribute's name: such an entry is not read anyway
    bad_value = _bad_utf8(items) & ~bad_key
    if column.null_count:
        bad_value &= column.is_valid().to_numpy(zero_copy_only=False)[rows]
    at = np.flatnonzero(bad_value)
    at = at[[schema.attr_ids.get(key) is not None for key in keys.take(pa.array(at, pa.int64())).to_pylist()]]
    wanted = set(refusals.wanted(rows[at], rank))
    for k in at.tolist():
        if int(rows[k]) in wanted:
            wanted.discard(int(rows[k]))      # (one error an event)
            key = keys[k].as_py()
            refusals.add(BadEventError(int(rows[k]), key, None, f"attribute {key!r} {_NOT_UTF8}", _HINT), rank)
    # a refused value is made null, not its entry removed: a repeated key's last entry is still the one that
    # counts (map_entries), and a null one leaves the attribute absent
    items = items.take(pa.array(np.arange(len(items)), mask=bad_value))
    keep = ~bad_key
    kept = np.zeros(len(column) + 1, np.int64)
    np.cumsum(np.bincount(rows[keep], minlength=len(column)), out=kept[1:])
    mask = pc.invert(column.is_valid()) if column.null_count else None
    return pa.MapArray.from_arrays(pa.array(kept, pa.int32()), keys.filter(pa.array(keep)),
                                   items.filter(pa.array(keep)), type=column.type, mask=mask)


def _lists_with_bad_numbers(lists) -> np.ndarray:
    """The lists (positions in an Arrow list array of numbers) holding a
    number float64 cannot hold as it is: the event value rule, per element
    (integers compared as integers, decimals by :func:`decimal_codes`)."""
    flat = pc.list_flatten(lists)
    parents = pc.list_parent_indices(lists).to_numpy(zero_copy_only=False)
    return np.unique(parents[exact_floats(flat)[1]])


def _map_list_cells(column, schema: Schema, refusals: _Refusals, rank: int, lists: _ListCells, size: int):
    """The cells of a ``map<string, list<V>>`` column (attribute name ->
    event list), added to ``lists``: (event rows, attribute ids).  A key
    naming an attribute that is not a list of V's family is a wrong value."""
    element = _list_element_family(column.type.item_type)
    names, families = schema.attribute_arrays()
    rows, attr, entry, items = map_entries(column, names)
    cells = without_views(items).take(pa.array(entry, pa.int64()))
    fits = np.array([families[a] is None or (families[a] in ELEMENT_OF and element in (_NULL_ELEMENTS,
                                                                                       ELEMENT_OF[families[a]]))
                     for a in attr.tolist()], bool)
    problem = ~fits
    if element is Family.NUMERIC and len(cells):
        problem[_lists_with_bad_numbers(cells)] = True
    for k in np.flatnonzero(problem).tolist():
        if int(rows[k]) in set(refusals.wanted(rows[k:k + 1], rank)):
            name = schema.attr_names[int(attr[k])]
            refusals.value(int(rows[k]), name, schema.families[name], cells[k].as_py(), rank)
    ok = ~problem
    rows, attr, cells = rows[ok], attr[ok], cells.filter(pa.array(ok))
    listed = np.array([families[a] is not None for a in attr.tolist()], bool)
    at = np.flatnonzero(listed)
    if len(at):
        element_family = ELEMENT_OF[families[attr[at[0]]]] if element is _NULL_ELEMENTS else element
        if element is _NULL_ELEMENTS:
            lists.add(size + at, np.zeros(0, np.int64), np.zeros(0), Family.NUMERIC)
        else:
            lists.add_arrow(size + at, cells.take(pa.array(at, pa.int64())), element_family)
    return rows, attr.astype(np.int32)


#: what pandas' ``infer_dtype`` calls an object column of one kind of value,
#: which pyarrow converts as the dict rule reads it.  Not the mixes: pyarrow
#: would turn True into 1.0 next to floats, or an int beyond ±2**53 into a
#: float next to floats ("mixed-integer-float").
_ONE_KIND = frozenset({"string", "integer", "floating", "boolean", "decimal", "empty"})


def from_pandas(frame, schema: Schema, errors: str = "raise") -> EventBatch:
    """Encode a pandas DataFrame: one row per event, one column per
    attribute, pandas' missing markers = absent.  A column that pyarrow
    converts faithfully goes through Arrow; an object column mixing kinds of
    values, or one pyarrow refuses (a lone surrogate, an int beyond int64),
    is read value by value under the dict rule, so that each bad value is
    named or (``errors="null"``) dropped alone."""
    import pandas as pd                          # pandas is optional: a DataFrame brings it
    from pandas.api.types import infer_dtype

    _check_errors_mode(errors)
    refusals = _Refusals(errors)
    columns = []
    for label, series in frame.items():
        if not isinstance(label, str):
            raise SchemaError(f"DataFrame column label {label!r} ({type(label).__name__}) is not an attribute "
                              f"name: attribute names are str (rename the columns, e.g. "
                              f"frame.columns = frame.columns.astype(str))")
        name = str(label)
        # a column pandas holds as Arrow (pd.ArrowDtype) is read as that Arrow column: a map column's keys
        # are attributes, and lists keep their nulls and exact integers (to_numpy would make floats of them)
        arrow = isinstance(series.dtype, pd.ArrowDtype)
        if arrow and pa.types.is_map(series.dtype.pyarrow_dtype):
            columns.append((name, pa.array(series)))
            continue
        if name not in schema.attr_ids:
            if series.dtype == object and infer_dtype(series, skipna=True) == "mixed":
                # an object column of dicts is a map column: its keys are attributes, as in an Arrow map
                columns.extend(_mapping_cells(series.to_numpy(dtype=object).tolist(), name, schema, refusals,
                                              len(columns)))
            continue
        array = None
        if arrow:
            array = pa.array(series)
        elif schema.families[name] in ELEMENT_OF:
            pass            # lists: read by the dict rule below (pyarrow would guess element types)
        elif series.dtype != object or _one_kind(series, infer_dtype):
            try:
                array = pa.array(series, from_pandas=True)
            except (pa.ArrowException, UnicodeEncodeError, OverflowError, TypeError, ValueError):
                pass        # read value by value below (TypeError: a column of non-finite decimals)
        if array is None:
            array = _by_dict_rule(series, name, schema.families[name], refusals, len(columns))
        columns.append((name, array))
    return _from_columns(columns, len(frame), schema, refusals)


def _one_kind(series, infer_dtype) -> bool:
    """Whether an object column holds one kind of value that pyarrow
    converts as the dict rule reads it (:data:`_ONE_KIND`) -- not floats
    among which a ``numpy.longdouble`` hides: pyarrow rounds it to float64,
    where the dict rule refuses a value float64 cannot hold."""
    kind = infer_dtype(series, skipna=True)
    if kind == "floating" and np.longdouble is not np.float64:
        return not any(type(value) is np.longdouble for value in series.tolist())
    return kind in _ONE_KIND


def _pandas_missing(value) -> bool:
    """pandas' missing markers, for one value (``isna`` of a column holding a
    signalling-NaN decimal raises): a quiet NaN decimal is one, as pandas
    says; a signalling one is a value, which the value rule refuses."""
    import pandas as pd
    if isinstance(value, Decimal):
        return value.is_qnan()
    missing = pd.isna(value)
    return bool(missing) if isinstance(missing, (bool, np.bool_)) else False


def _by_dict_rule(series, name: str, family: Family | None, refusals: _Refusals, rank: int) -> pa.Array:
    """A DataFrame column read value by value under the dict rule, as an
    Arrow column that :func:`_from_columns` takes as it is: strings, booleans,
    or float64 codes; null where absent or wrong (refused: ``refusals``).
    pandas' missing markers (None, NaN, NA, NaT, a quiet NaN decimal) are
    absent, as in other columns; a null of a pyarrow list column arrives as
    pd.NA."""
    raw = series.to_numpy(dtype=object).tolist()
    if family in ELEMENT_OF:
        present = np.array([not (value is None or _pandas_missing(value)) for value in raw], bool)
    else:
        try:
            present = ~series.isna().to_numpy(dtype=bool)
        except InvalidOperation:    # pandas compares a signalling-NaN decimal, which raises: value by value
            present = np.array([not _pandas_missing(value) for value in raw], bool)
    return _dict_rule_column(raw, present, name, family, refusals, rank)


def _dict_rule_column(raw: list, present: np.ndarray, name: str, family: Family | None, refusals: _Refusals,
                      rank: int) -> pa.Array:
    """The values ``raw`` (a list, one an event) of attribute ``name``
    coded by the dict rule where ``present``, as an Arrow column (see
    :func:`_by_dict_rule`); the values the attribute does not take are
    refused and null."""
    if family in ELEMENT_OF:
        cells = []
        for row, value in enumerate(raw):
            elements = list_elements(value, family) if present[row] else None
            if elements is None and present[row]:
                refusals.value(row, name, family, value, rank)
            cells.append(elements)
        element = pa.large_string() if ELEMENT_OF[family] is Family.STRING else pa.float64()
        return pa.array(cells, pa.large_list(element))
    present = present.copy()
    codes = np.zeros(len(raw))
    for row in np.flatnonzero(present).tolist():
        code = _code(raw[row], family)
        if code is None:
            refusals.value(row, name, family, raw[row], rank)
            present[row] = False
        else:
            codes[row] = code
    if family is Family.STRING:
        return pa.array([value if keep else None for value, keep in zip(raw, present.tolist())], pa.large_string())
    if family is Family.BOOLEAN:
        return pa.array(codes.astype(bool), mask=~present)
    return pa.array(codes, mask=~present)


def _mapping_cells(cells: list, name: str, schema: Schema, refusals: _Refusals, rank: int) -> list:
    """A DataFrame's object column ``name`` of dicts (attribute -> value,
    one an event; missing cells are events without its attributes) as
    ``(attribute, Arrow column)`` pairs, the attributes in the schema's
    order, each value read by the dict rule: a key or a None value as in a
    dict event, ``errors`` as for its attributes' columns.  A cell that is
    neither a mapping nor missing is that event's error, as a dict event
    that is not a mapping is."""
    if not any(isinstance(cell, Mapping) for cell in cells):
        return []           # not a map column: an object column no subscription reads
    attr_ids = schema.attr_ids
    by_attribute: dict[str, list] = {}
    pending = None          # the error to raise, once the events before it are read: the first event's is raised
    for row, cell in enumerate(cells):
        if not isinstance(cell, Mapping):
            if cell is None or _pandas_missing(cell):
                continue
            pending = NotAnEventError(row, None, cell, f"column {name!r} holds mappings of attribute to value, "
                                                       f"this event's is a {type(cell).__name__}")
        else:
            for key, value in cell.items():
                if isinstance(key, str):
                    if value is not None and key in attr_ids:
                        by_attribute.setdefault(key, [None] * len(cells))[row] = value
                    continue
                error = BadEventError(row, None, key, f"key {_shown(key)} ({type(key).__name__}) in column "
                                                      f"{name!r} is not an attribute name: attribute names are str")
                if refusals.errors == "raise":
                    pending = error
                    break
                refusals.add(error, rank)       # kept by "report", passed over by "null"
        if pending is not None:
            if refusals.errors != "report":
                break
            refusals.add(pending, rank)
            pending = None
    columns = []
    for key in sorted(by_attribute, key=attr_ids.__getitem__):
        values = by_attribute[key]
        present = np.array([value is not None for value in values], bool)
        columns.append((key, _dict_rule_column(values, present, key, schema.families[key], refusals,
                                               rank + len(columns))))
    if pending is not None:
        raise pending
    return columns


#: Family -> small int, for vectorised family checks of map entries
_FAMILY_CODE = {None: 0, Family.NUMERIC: 1, Family.STRING: 2, Family.BOOLEAN: 3, Family.NUMERIC_LIST: 4,
                Family.STRING_LIST: 5}


#: the last (families array, its codes) pair: the schema caches the array until it changes.  One tuple,
#: replaced whole and read once: two threads encoding for indexes of different schemas never see one's
#: families beside the other's codes (a list read twice, element by element, could)
_last_codes: list = [(None, None)]


def _family_codes(families: np.ndarray) -> np.ndarray:
    """:data:`_FAMILY_CODE` of each attribute (``families`` from
    :meth:`Schema.attribute_arrays`)."""
    last_families, last_codes = _last_codes[0]
    if last_families is families:
        return last_codes
    codes = np.zeros(len(families), np.int8)
    for family, code in _FAMILY_CODE.items():
        if family is not None:
            codes[families == family] = code
    _last_codes[0] = (families, codes)
    return codes


def string_keyed(dtype: pa.DataType) -> bool:
    """Whether a map type's keys are Arrow strings (string, large_string, a
    dictionary of them) -- the only keys that name attributes."""
    key = dtype.key_type.value_type if pa.types.is_dictionary(dtype.key_type) else dtype.key_type
    return pa.types.is_string(key) or pa.types.is_large_string(key)


def _check_map_keys(dtype: pa.DataType, name: str) -> None:
    """A map column's keys name attributes: SchemaError unless they are
    Arrow strings (views are gone by now) -- an int, a binary or a struct
    key would otherwise be cast to some text, or fail deep in the cast."""
    if not string_keyed(dtype):
        raise SchemaError(f"map column {name!r}: its keys are attribute names, so they must be strings, "
                          f"not {dtype.key_type}")


def map_entries(column, names):
    """The entries of a ``map<string, V>`` column that the engine reads:
    keys found in ``names`` (a string array), in a non-null map, of a key
    repeated within one map only the last (as in Spark's map layout, whose
    duplicate keys keep the last value), and of those the ones whose value
    is not null -- a last entry with a null value leaves its attribute
    absent, whatever came before it.  Returns ``(rows, key index into names,
    entry positions into items, items)``, entries ordered by (row, key);
    ``items`` is the column's value array for its slice (dictionaries
    decoded)."""
    if isinstance(column, pa.ChunkedArray):
        column = column.combine_chunks()
    offsets = column.offsets.to_numpy()
    lo, hi = int(offsets[0]), int(offsets[-1])
    rows = np.repeat(np.arange(len(column), dtype=np.int64), np.diff(offsets))
    keys = column.keys.slice(lo, hi - lo)
    items = column.items.slice(lo, hi - lo)
    if pa.types.is_dictionary(items.type):
        items = items.dictionary_decode()
    key = pc.fill_null(pc.index_in(pc.cast(keys, pa.string()), value_set=names), -1).to_numpy(
        zero_copy_only=False).astype(np.int64)
    keep = key >= 0
    if column.null_count:
        keep &= column.is_valid().to_numpy(zero_copy_only=False)[rows]
    entry = np.flatnonzero(keep)
    entry = entry[_event_attr_order(rows[entry], key[entry])]     # stable: repeats stay in map order
    last = np.ones(len(entry), bool)
    last[:-1] = (rows[entry[1:]] != rows[entry[:-1]]) | (key[entry[1:]] != key[entry[:-1]])
    entry = entry[last]
    if items.null_count:
        entry = entry[items.is_valid().to_numpy(zero_copy_only=False)[entry]]
    return rows[entry], key[entry], entry, items


def _map_cells(column, schema: Schema, refusals: _Refusals, rank: int):
    """The cells of a ``map<string, V>`` column (key = attribute name, null
    map or value = absent; a key repeated in one map: the last one wins,
    null or not, as in Spark's map layout): (event rows, attribute ids,
    codes, string positions among the cells, their strings) -- vectorised
    over all entries, whatever the number of distinct keys."""
    value_family = _arrow_family(column.type.item_type)
    names, families = schema.attribute_arrays()
    rows, attr, entry, items = map_entries(column, names)
    items = without_views(items)
    family = _family_codes(families)[attr]
    # values of a type no family takes (structs, binary...) are wrong for any attribute of a family, as in a
    # column of their own; an attribute whose family is not fixed yet only reads their presence
    wrong = (family != 0) & (family != (-1 if value_family is None else _FAMILY_CODE[value_family]))
    values = items.take(pa.array(entry))
    if value_family is None:
        codes, strings, bad = np.zeros(len(entry)), _NO_STRINGS, np.zeros(len(entry), bool)
    elif value_family is Family.STRING:
        codes = np.zeros(len(entry))
        strings = pc.cast(values, pa.large_string())
        bad = np.zeros(len(entry), bool)
    else:
        if pa.types.is_decimal(values.type):
            raw = decimal_codes(values)          # NaN where the decimal rule refuses
        elif value_family is Family.BOOLEAN or not pa.types.is_integer(values.type):
            raw = pc.cast(values, pa.float64()).to_numpy(zero_copy_only=False)
        else:
            raw = values.to_numpy(zero_copy_only=False)        # int64 exact until the ±2**53 check
        bad = _bad_numbers(raw) & (family != 0) if value_family is Family.NUMERIC else np.zeros(len(entry), bool)
        codes = raw.astype(np.float64)
        strings = _NO_STRINGS
    problem = wrong | bad
    if problem.any() and refusals.errors != "null":
        at = np.flatnonzero(problem)
        _, first = np.unique(rows[at], return_index=True)      # each row's first problem (entries by row)
        at = at[first]
        wanted = set(refusals.wanted(rows[at], rank))
        at = np.array([k for k in at.tolist() if int(rows[k]) in wanted], np.int64)
        for k, value in zip(at.tolist(), values.take(pa.array(at, pa.int64())).to_pylist()):
            name = schema.attr_names[int(attr[k])]
            refusals.value(int(rows[k]), name, schema.families[name], value, rank)
    if problem.any():
        ok = ~problem
        rows, attr, family, codes = rows[ok], attr[ok], family[ok], codes[ok]
        if value_family is Family.STRING:
            strings = strings.filter(pa.array(ok))
    codes[family == 0] = 0.0                 # attributes only IS [NOT] NULL reads: presence is all
    string_at = np.flatnonzero(family == _FAMILY_CODE[Family.STRING]) if value_family is Family.STRING \
        else np.zeros(0, np.int64)
    return rows, attr.astype(np.int32), codes, string_at, strings.take(pa.array(string_at, pa.int64()))


_BIT_INDEX = np.arange(8, dtype=np.int64)


def _plain_number_type(dtype: pa.DataType) -> bool:
    """int64, int32... and float64/float32: columns read straight from their buffers."""
    return (pa.types.is_integer(dtype) or pa.types.is_float32(dtype) or pa.types.is_float64(dtype)) \
        and dtype.bit_width in (8, 16, 32, 64)


def _numbers_of(column) -> tuple[np.ndarray, np.ndarray]:
    """(rows, values) of the valid cells of a plain numeric column, read
    from its Arrow buffers (validity bitmap, values) without compute
    kernels: a wide table has thousands of mostly-null columns, and a
    kernel call per column costs more than the cells."""
    chunks = column.chunks if isinstance(column, pa.ChunkedArray) else [column]
    dtype = column.type.to_pandas_dtype()
    rows, values, base = [], [], 0
    for chunk in chunks:
        n, offset = len(chunk), chunk.offset
        validity, data = chunk.buffers()[:2]
        cells = np.frombuffer(data, dtype=dtype, count=offset + n)[offset:] if n else np.zeros(0, dtype)
        if chunk.null_count == 0:
            at = np.arange(n, dtype=np.int64)
        else:   # the set bits of the validity bitmap, found a byte at a time (mostly-null columns)
            packed = np.frombuffer(validity, np.uint8, count=(offset + n + 7) // 8)
            full = np.flatnonzero(packed)
            bits = np.unpackbits(packed[full][:, None], axis=1, bitorder="little").astype(bool)
            at = (full[:, None] * 8 + _BIT_INDEX)[bits] - offset
            at = at[(at >= 0) & (at < n)]
        rows.append(at + base)
        values.append(cells[at])
        base += n
    if len(rows) == 1:
        return rows[0], values[0]
    return np.concatenate(rows), np.concatenate(values)


def _bad_numbers(values: np.ndarray) -> np.ndarray:
    """Integers beyond ±2**53 (compared as integers: as float64, 2**53 + 1
    would pass) and non-finite floats."""
    if values.dtype.kind == "u":
        return values > MAX_EXACT_INT
    if values.dtype.kind == "i":
        return (values > MAX_EXACT_INT) | (values < -MAX_EXACT_INT)
    return ~np.isfinite(values)


def encode_events(events, schema: Schema, errors: str = "raise") -> EventBatch:
    """Any supported event container -> :class:`EventBatch`; ``errors``:
    "raise", "null" or "report" (the module's docstring)."""
    if isinstance(events, (pa.Table, pa.RecordBatch)):
        return from_arrow(events, schema, errors)
    if type(events).__name__ == "DataFrame" and hasattr(events, "to_dict"):
        return from_pandas(events, schema, errors)
    if isinstance(events, Mapping):
        raise TypeError("match_batch takes a sequence of events; use match() for a single event (host columns "
                        "by attribute go in as a table: pyarrow.table(columns))")
    if isinstance(events, (str, bytes, bytearray)) or not isinstance(events, Iterable):
        raise TypeError(f"match_batch takes a sequence of events (dicts), a pyarrow Table or RecordBatch or a "
                        f"pandas DataFrame, not {type(events).__name__}")
    return from_dicts(list(events), schema, errors)


#: LIKE over fewer distinct values than this goes value by value: a call of
#: Arrow's kernel costs about as much as 4 to 8 values through the schema's
#: matcher (~20 us against ~5 us a value), which single events would pay
#: once per pattern
_LIKE_KERNEL_MIN_VALUES = 8


def pattern_truth(batch: EventBatch, schema: Schema, pattern_pairs) -> np.ndarray:
    """LIKE/MATCHES results for the batch: ``[token, pattern id]`` is 1 when
    the batch's distinct string ``token`` is a value of the pattern's
    attribute in the batch and matches the pattern.  ``pattern_pairs``
    lists the (attribute id, pattern id) pairs in use.

    The batch's string entries are grouped by attribute once (one sort of
    their distinct (attribute, token) keys); each pattern is then evaluated
    once per distinct value of its own attribute, without a pass over the
    batch per pattern: LIKE by Arrow's kernel over those values at once
    (when they are many enough to pay for the call), MATCHES value by value
    with the schema's matcher (the RE2 library its patterns were checked
    with; Arrow bundles another RE2 release)."""
    n_strings = len(batch.strings)
    patterns = schema.patterns
    truth = np.zeros((max(1, n_strings), max(1, len(patterns))), dtype=np.uint8)
    pairs = np.asarray(pattern_pairs, dtype=np.int64).reshape(-1, 2)
    if n_strings == 0 or len(pairs) == 0:
        return truth
    pairs = pairs[np.argsort(pairs[:, 0], kind="stable")]
    pattern_attrs, first_pair, n_pairs = np.unique(pairs[:, 0], return_index=True, return_counts=True)
    entries = (batch.token >= 0) & np.isin(batch.attr, pattern_attrs)
    keys = np.unique(batch.attr[entries].astype(np.int64) * n_strings + batch.token[entries])
    key_attr, key_token = np.divmod(keys, n_strings)       # sorted by attribute: one run of tokens each
    starts = np.searchsorted(key_attr, pattern_attrs, side="left")
    ends = np.searchsorted(key_attr, pattern_attrs, side="right")
    for start, end, first, count in zip(starts.tolist(), ends.tolist(), first_pair.tolist(), n_pairs.tolist()):
        if start == end:
            continue                            # the attribute has no value in the batch
        tokens = key_token[start:end]
        values = batch.strings.take(pa.array(tokens))
        texts = None                            # the values as str, for the schema's matcher
        kernel = len(tokens) >= _LIKE_KERNEL_MIN_VALUES
        for pattern in pairs[first:first + count, 1].tolist():
            kind, text = patterns[pattern]
            # Arrow's LIKE escapes with a backslash, ours has no escape
            # character: a pattern holding one goes to the schema's matcher
            # (escaping it would not do: in pyarrow 26 the escaped pattern
            # '%\\', "ends with a backslash", matches only values ending in two)
            if kind == "like" and kernel and "\\" not in text:
                hits = pc.match_like(values, pattern=text).to_numpy(zero_copy_only=False)
            else:
                texts = values.to_pylist() if texts is None else texts
                hits = np.fromiter(map(schema.pattern_matcher(pattern), texts), dtype=bool, count=len(texts))
            truth[tokens, pattern] = hits
    return truth


@dataclass(frozen=True)
class ListIndex:
    """The inverted index of the operand lists that list predicates use,
    per attribute: the lists' element keys sorted, each with its list, and
    the list keys wanted (``2s``: some element of the event list is in
    list s; ``2s + 1``: all of list s is).  Built once per predicate table
    (:meth:`engine.compile.PredicateTable.list_index`): operand lists never
    change once registered."""

    attrs: tuple          # attribute ids
    keys: tuple           # per attribute: float64 element keys, ascending
    owner: tuple          # per attribute: int64 the operand list of each key
    lengths: tuple        # per attribute: int64 list id -> its length (0 where unused)
    wanted: tuple         # per attribute: int64 list keys in use, ascending


def list_index(schema: Schema, list_pairs) -> ListIndex:
    """The :class:`ListIndex` of the (attribute id, list key) pairs in use
    (:meth:`engine.compile.PredicateTable.list_pairs`)."""
    pairs = np.asarray(list_pairs, dtype=np.int64).reshape(-1, 2)
    set_offsets, set_keys = schema.set_csr()
    attrs, keys, owners, lengths, wanted = [], [], [], [], []
    for attr in np.unique(pairs[:, 0]).tolist():
        want = np.unique(pairs[pairs[:, 0] == attr, 1])
        lists = np.unique(want >> 1)
        size = set_offsets[lists + 1] - set_offsets[lists]
        owner = np.repeat(lists, size)
        key = set_keys[_ranges(set_offsets[lists], size)]
        order = np.argsort(key, kind="stable")
        length = np.zeros(int(lists.max()) + 1, np.int64)
        length[lists] = size
        attrs.append(attr)
        keys.append(key[order])
        owners.append(owner[order])
        lengths.append(length)
        wanted.append(want)
    return ListIndex(tuple(attrs), tuple(keys), tuple(owners), tuple(lengths), tuple(wanted))


def list_truth(batch: EventBatch, indexes) -> np.ndarray:
    """The list predicates' truth for the batch's event lists, as
    ``EventBatch.list_truth`` holds it (packed CSR of TRUE keys per row),
    over one :class:`ListIndex` or several (a snapshot's segments).

    Each row's distinct element keys are joined with the inverted index of
    its attribute (`gpu_kernels.list_truth.list_hits`, rows in parallel):
    the work is the number of (element, operand list) hits, not rows times
    lists.  A hit count per (row, list) equal to the list's length is ALL
    OF."""
    import numba

    from gpu_kernels.list_truth import list_hits

    indexes = [indexes] if isinstance(indexes, ListIndex) else list(indexes)
    n_rows = len(batch.list_offsets) - 1
    if n_rows == 0 or len(batch.list_keys) == 0 or not any(index.attrs for index in indexes):
        return np.full(n_rows + 1, n_rows + 1, np.int64)
    list_offsets = np.ascontiguousarray(batch.list_offsets, np.int64)
    list_keys = np.ascontiguousarray(batch.list_keys, np.float64)
    found_rows, found_keys = [], []
    for index in indexes:
        for attr, keys, owner, length, wanted in zip(index.attrs, index.keys, index.owner, index.lengths,
                                                     index.wanted):
            rows = np.flatnonzero(batch.list_attr == attr)
            if len(rows) == 0:
                continue
            wanted_key = np.zeros(2 * len(length), np.bool_)
            wanted_key[wanted] = True
            per_row, key = list_hits(list_offsets, list_keys, rows.astype(np.int64), keys, owner, length, wanted_key,
                                     4 * numba.get_num_threads())
            found_rows.append(np.repeat(rows, per_row))
            found_keys.append(key)
    if not found_rows:
        return np.full(n_rows + 1, n_rows + 1, np.int64)
    row = np.concatenate(found_rows)
    key = np.concatenate(found_keys)
    if len(found_rows) > 1:     # rows of several attributes, or segments that may share operand lists
        row, key = _distinct_pairs(row, key)        # (ordered by row, then key)
    offsets = np.concatenate(([0], np.cumsum(np.bincount(row, minlength=n_rows)))) + n_rows + 1
    return np.concatenate((offsets, key)).astype(np.int64)


def _ranges(starts: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """``concatenate([arange(s, s + n) for s, n in zip(starts, lengths)])``, vectorised."""
    starts = np.asarray(starts, np.int64)
    lengths = np.asarray(lengths, np.int64)
    total = int(lengths.sum())
    if total == 0:
        return np.zeros(0, np.int64)
    bases = np.cumsum(lengths) - lengths
    return np.repeat(starts - bases, lengths) + np.arange(total, dtype=np.int64)
