"""Sparse events on the device: a map column of attribute -> value, the
device twin of a host ``map<string, V>`` column (docs/architecture.md,
"Device-resident events").

Events over many attributes -- W3's events each carry a few dozen of
20,000 -- have no dense device form: one column per attribute would be
20,000 columns.  A GPU pipeline holds them as a map column, which cuDF and
Arrow lay out in CSR: per event an offset, then each entry's key and value.
:class:`DeviceMap` is that layout with the keys dictionary-coded (the
codes on the device, the attribute names on the host), and
:func:`map_entries` encodes it on the device, in array operations (CuPy;
NumPy under numba's CUDA simulator), by the host encoder's rules for a map
column (``engine.events._map_cells``):

* a key no subscription reads is left out, a null map (``valid``) or a
  null value (``value_valid``) is absent, and of a key repeated within one
  map only the last entry counts (Spark's map layout);
* values are numbers, booleans or strings (an attribute of another family
  refuses them); numbers must be finite and, integers, within +-2**53; a
  string arrives as its code into the map's dictionary, which goes through
  the host encoder once, as a string column's does; an attribute that only
  IS [NOT] NULL reads takes any value;
* a key code outside ``names`` is refused like a value, by the errors mode.

What leaves the device is one small vector of flags, the refused values'
positions when there are any, and for a map of strings the distinct
(attribute, string) pairs its entries hold (the LIKE/MATCHES results are
computed for those).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from engine.errors import BadEventError, SchemaError
from engine.events import _FAMILY_CODE, _family_codes, _value_error, string_keyed
from engine.expr import Family
from engine.schema import MAX_EXACT_INT
from gpu_kernels import cuda_support

__all__ = ["DeviceMap", "coded_to", "entry_rows", "map_entries", "run_offsets"]


def entry_rows(xp, offsets, lo: int, hi: int):
    """The event (row) of each entry ``lo..hi-1`` of a CSR layout whose
    event ``i`` holds entries ``offsets[i]`` to ``offsets[i + 1]``: a binary
    search, empty events included."""
    return xp.searchsorted(offsets[1:], xp.arange(lo, hi, dtype=np.int64), side="right").astype(np.int64)


def run_offsets(xp, rows, n_events: int):
    """The inverse: the offsets of ``n_events`` events from the sorted rows
    of their entries (a binary search: CuPy's ``bincount`` fails on no
    entries at all)."""
    return xp.searchsorted(rows, xp.arange(n_events + 1, dtype=np.int64), side="left").astype(np.int64)


class DeviceMap:
    """A ``map<string, V>`` column whose arrays are on the device: event
    ``i``'s entries are positions ``offsets[i]`` to ``offsets[i + 1]`` of
    ``keys`` (integer codes into ``names``, the attribute names, a host
    list or Arrow string array) and of ``values`` (numbers or booleans, one
    per entry; strings as the pair ``(codes, dictionary)``, as for a string
    column).  ``valid`` (one boolean per event) is False for a null map,
    ``value_valid`` (one per entry) False for a null value.  The arrays are
    anything :func:`engine.device_events.is_device_column` takes; a host
    array among them is copied over.  A cuDF map column (a list of
    key/value structs) gives ``offsets`` and its children, its string keys
    dictionary-encoded (``keys.codes``, ``keys.categories``)."""

    __slots__ = ("offsets", "keys", "values", "names", "valid", "value_valid")

    def __init__(self, offsets: object, keys: object, values: object, names: Sequence[str] | pa.Array,
                 valid: object | None = None, value_valid: object | None = None) -> None:
        self.offsets, self.keys, self.values, self.names = offsets, keys, values, names
        self.valid, self.value_valid = valid, value_valid

    def arrays(self) -> list:
        """Its five arrays -- offsets, keys, values (a string map's codes),
        valid, value_valid -- in the order :meth:`with_arrays` takes them
        (None for a mask not given; :meth:`from_arrow` gives all five)."""
        values = self.values[0] if isinstance(self.values, tuple) else self.values
        return [self.offsets, self.keys, values, self.valid, self.value_valid]

    def with_arrays(self, arrays: Sequence) -> DeviceMap:
        """The same map over other copies of :meth:`arrays` (the device
        copies of host ones): names and a string dictionary kept."""
        offsets, keys, values, valid, value_valid = arrays
        if isinstance(self.values, tuple):
            values = (values, self.values[1])
        return DeviceMap(offsets, keys, values, self.names, valid=valid, value_valid=value_valid)

    @classmethod
    def from_arrow(cls, column: pa.Array | pa.ChunkedArray) -> DeviceMap:
        """A host Arrow map column as a DeviceMap of host arrays (to be put
        on the device by :meth:`arrays` and :meth:`with_arrays`); strings are
        dictionary-encoded.  TypeError for values of a type the device form
        has no place for (decimals, nested values): the host encoder takes
        those."""
        if isinstance(column, pa.ChunkedArray):
            column = column.combine_chunks()
        items_type = column.type.item_type
        if pa.types.is_dictionary(items_type):
            items_type = items_type.value_type
        strings = pa.types.is_string(items_type) or pa.types.is_large_string(items_type)
        if not (strings or pa.types.is_boolean(items_type) or pa.types.is_integer(items_type)
                or pa.types.is_floating(items_type)):
            raise TypeError(f"a map of {column.type.item_type} values has no device-column form")
        if not string_keyed(column.type):
            raise TypeError(f"a map with {column.type.key_type} keys has no device-column form (keys are "
                            f"attribute names)")
        offsets = column.offsets.to_numpy()
        lo, hi = int(offsets[0]), int(offsets[-1])
        keys = pc.cast(column.keys.slice(lo, hi - lo), pa.string())
        items = column.items.slice(lo, hi - lo)
        if pa.types.is_dictionary(items.type):
            items = items.dictionary_decode()
        coded = pc.dictionary_encode(keys)
        valid = items.is_valid().to_numpy(zero_copy_only=False)
        dictionary = None
        if strings:
            coded_items = pc.dictionary_encode(items)
            items, dictionary = pc.fill_null(coded_items.indices, 0), coded_items.dictionary
        default = False if pa.types.is_boolean(items.type) else 0
        values = pc.fill_null(items, default).to_numpy(zero_copy_only=False)
        return cls((offsets - lo).astype(np.int64), coded.indices.to_numpy(zero_copy_only=False).astype(np.int32),
                   values if dictionary is None else (values, dictionary), coded.dictionary,
                   valid=column.is_valid().to_numpy(zero_copy_only=False), value_valid=valid)


def map_entries(name: str, column: DeviceMap, schema, errors: str, device, xp, token_base: int = 0
                ) -> tuple[int, tuple, dict[int, BadEventError], tuple]:
    """``(n_events, (rows, attr, values, tokens), refused, strings)``: the
    entries of the map the index reads, on the device, ordered by (event,
    attribute) with one entry per attribute of an event -- with,
    ``errors="report"``, the first refusal of each event holding one (those
    events' entries left out; in the order the host encoder finds them,
    which is the order it raises in) -- and, for a map of strings, ``(dictionary,
    attributes, tokens)``: its dictionary and, on the host, each (attribute,
    token) pair of its entries, which the LIKE/MATCHES results are computed
    for.  A string entry's token is its code plus ``token_base`` (the
    strings before this dictionary in the batch's).  ``device(x, label)``
    puts a given array on the device (in place when it is there already);
    ``name`` is the map's column, for errors."""
    offsets = device(column.offsets, f"{name}.offsets")
    keys = device(column.keys, f"{name}.keys")
    pair = isinstance(column.values, tuple)
    if pair and len(column.values) != 2:
        raise ValueError(f"map {name!r}: string values are a pair (codes, dictionary)")
    values = device(column.values[0] if pair else column.values, f"{name}.values")
    if offsets.dtype.kind not in "iu" or keys.dtype.kind not in "iu":
        raise ValueError(f"map {name!r}: offsets and keys are integer arrays, not {offsets.dtype} and {keys.dtype}")
    if len(offsets) == 0:
        raise ValueError(f"map {name!r}: offsets hold one entry per event and one more (0 for no events)")
    kind = "s" if pair else values.dtype.kind
    if pair and values.dtype.kind not in "iu":
        raise SchemaError(f"map {name!r}: string values are (integer codes, dictionary), not codes of "
                          f"{values.dtype}")
    if kind not in "biufs":
        raise SchemaError(f"map {name!r}: values of {values.dtype} have no device form (numbers, booleans, or "
                          f"strings as (codes, dictionary))")
    dictionary, table, unread = _string_dictionary(name, column.values[1], schema) if pair else (None, None, {})
    n_events = len(offsets) - 1
    bounds = cuda_support.to_host(offsets[xp.asarray([0, n_events])])
    lo, hi = int(bounds[0]), int(bounds[1])
    if hi < lo or lo < 0 or len(keys) < hi or len(values) < hi:
        raise ValueError(f"map {name!r}: offsets run from {lo} to {hi}, over {len(keys)} keys and "
                         f"{len(values)} values")
    # (keys and string codes compared as int64: a narrow dtype beside a Python int past its range is an
    # OverflowError under NumPy 2's promotion rules, which CuPy follows)
    given_keys, given_values = keys[lo:hi], values[lo:hi]          # (as given: what a refusal shows)
    keys, values = given_keys.astype(np.int64, copy=False), given_values
    if kind == "s":
        values = values.astype(np.int64, copy=False)    # (a uint64 code past 2**63 wraps negative: refused too)
    rows = entry_rows(xp, offsets, lo, hi)
    in_map, has_value = _present(name, column, rows, lo, hi, n_events, device, xp)
    present = in_map & has_value
    names = _names(name, column.names)
    attr_of_key = xp.asarray(_attribute_ids(names, schema))          # name code -> attribute id (-1: unread)
    inside = (keys >= 0) & (keys < len(names))
    attr = attr_of_key[xp.where(inside, keys, 0)] if len(names) else xp.full(hi - lo, -1, np.int32)
    outside = present & ~inside
    keyed = in_map & inside & (attr >= 0)
    # an entry whose string is not valid UTF-8 is refused, then read as a null value, as the host encoder reads a
    # map column (events._with_valid_utf8)
    not_utf8 = _not_utf8(values, dictionary, unread, xp) if kind == "s" else None
    if not_utf8 is not None:
        not_utf8 &= keyed & has_value
        has_value = has_value & ~not_utf8
    # entries ordered by (event, attribute), stable: a repeated key's last entry is its last in map order, and
    # the one that counts (events.map_entries): a null value there leaves the attribute absent
    n_attrs = max(len(schema.attr_names), 1)
    at = xp.flatnonzero(keyed)
    at = at[xp.argsort(rows[at] * n_attrs + attr[at], kind="stable")]
    if len(at):
        last = xp.ones(len(at), dtype=bool)
        last[:-1] = (rows[at[1:]] != rows[at[:-1]]) | (attr[at[1:]] != attr[at[:-1]])
        at = at[last]
        at = at[has_value[at]]
    family = xp.asarray(_family_codes(schema.attribute_arrays()[1]))[attr[at]]      # per entry kept
    problem = _refused_values(kind, values[at], family, dictionary, xp, unread)
    flags = cuda_support.to_host(xp.stack([(offsets[1:] < offsets[:-1]).any(), outside.any(), problem.any(),
                                           xp.zeros((), bool) if not_utf8 is None else not_utf8.any()]))
    if flags[0]:
        raise ValueError(f"map {name!r}: its offsets decrease")
    refused: dict[int, BadEventError] = {}
    if flags[1] or flags[2] or flags[3]:
        refused = _refusals(name, names, schema, errors, kind, rows, given_keys, given_values, attr, outside, at,
                            problem, xp, dictionary, unread, not_utf8)
        keep = ~problem
        if refused:                                         # errors="report": the event is set aside whole
            keep &= ~xp.isin(rows[at], xp.asarray(np.fromiter(refused, np.int64, len(refused))))
        at, family = at[keep], family[keep]
    # (an attribute only IS [NOT] NULL reads: presence is all, as the host encoder has it)
    if kind != "s":
        value = xp.where(family == 0, 0.0, values[at].astype(np.float64))
        token = xp.full(len(at), -1, dtype=np.int32)
        return n_events, (rows[at], attr[at].astype(np.int32), value, token), refused, None
    string = family == _FAMILY_CODE[Family.STRING]
    codes = xp.where(string, values[at], 0).astype(np.int64)
    value = xp.where(string, xp.asarray(table)[codes] if len(dictionary) else 0.0, 0.0)
    token = xp.where(string, codes + token_base, -1).astype(np.int32)
    # the (attribute, token) pairs of the string entries: what the pattern results are computed over
    pairs = cuda_support.to_host(xp.unique(attr[at][string].astype(np.int64) * max(len(dictionary), 1)
                                           + codes[string]))
    pair_attr, pair_code = np.divmod(pairs, max(len(dictionary), 1))
    return n_events, (rows[at], attr[at].astype(np.int32), value, token), refused, \
        (dictionary, pair_attr.astype(np.int32), (pair_code + token_base).astype(np.int32))


def _present(name: str, column: DeviceMap, rows, lo: int, hi: int, n_events: int, device, xp):
    """Per entry ``lo:hi``: whether its map is not null, and whether its value is not."""
    in_map = xp.ones(hi - lo, dtype=bool)
    has_value = xp.ones(hi - lo, dtype=bool)
    if column.valid is not None:
        valid = device(column.valid, f"{name}.valid")
        if valid.dtype != np.bool_ or len(valid) != n_events:
            raise ValueError(f"map {name!r}: valid is a boolean array of one per event")
        in_map = valid[rows]
    if column.value_valid is not None:
        value_valid = device(column.value_valid, f"{name}.value_valid")
        if value_valid.dtype != np.bool_:
            raise ValueError(f"map {name!r}: value_valid is a boolean array of one per entry")
        if len(value_valid) < hi:
            raise ValueError(f"map {name!r}: value_valid has {len(value_valid)} entries for {hi}")
        has_value = value_valid[lo:hi]
    return in_map, has_value


def coded_to(codes, entries, size: int, xp):
    """Per code into a dictionary of ``size`` entries, whether it is one of
    ``entries`` (False for a code outside the dictionary)."""
    inside = (codes >= 0) & (codes < size)
    if not len(entries):
        return xp.zeros(len(codes), dtype=bool)
    flags = np.zeros(size, bool)
    flags[list(entries)] = True
    return xp.asarray(flags)[xp.where(inside, codes, 0)] & inside


def _not_utf8(values, dictionary, unread: dict, xp):
    """Per entry, whether its value is coded to a dictionary string that is
    not valid UTF-8 (an Arrow entry of ``unread``); None where there is none."""
    refused = [entry for entry, given in unread.items() if isinstance(given, pa.Array)]
    return coded_to(values, refused, len(dictionary), xp) if refused else None


def _refused_values(kind: str, kept, family, dictionary, xp, unread=None):
    """Per entry kept (its value ``kept``, its attribute's ``family`` code),
    whether the host encoder refuses it: an attribute of another family, a
    string code outside the dictionary or, for a string attribute, coded to
    an entry the host refuses as its value (``unread``: a lone surrogate),
    a number not finite or an integer beyond ±2**53 (an attribute only IS
    [NOT] NULL reads takes any)."""
    own = _FAMILY_CODE[Family.BOOLEAN if kind == "b" else Family.STRING if kind == "s" else Family.NUMERIC]
    problem = (family != 0) & (family != own)
    if kind == "s":
        problem |= (kept < 0) | (kept >= len(dictionary))
        if unread:
            problem |= coded_to(kept, unread, len(dictionary), xp) & (family == own)
    elif kind in "iuf":
        bad = ~xp.isfinite(kept.astype(np.float64))
        if kind == "i":         # exact as float64 only within +-2**53 (compared as integers)
            bad |= (kept > MAX_EXACT_INT) | (kept < -MAX_EXACT_INT)
        elif kind == "u":
            bad |= kept > MAX_EXACT_INT
        problem |= bad & (family != 0)
    return problem


def _string_dictionary(name: str, dictionary, schema) -> tuple[pa.Array, np.ndarray, dict]:
    """A map's value dictionary as an Arrow string array, each entry's code
    under the index's string dictionary and the entries the host refuses as
    a string attribute's value, by the rules of a string column's
    dictionary (``device_events._dictionary_codes``)."""
    from engine.device_events import _dictionary_codes
    reader = next((a for a, f in schema.families.items() if f is Family.STRING), None)
    return _dictionary_codes(name, dictionary, schema, reader)


def _names(name: str, names) -> pa.Array:
    """The key dictionary as an Arrow string array."""
    from engine.device_events import string_array
    return string_array(f"map {name!r}: its key dictionary", names).cast(pa.string())


def _attribute_ids(names: pa.Array, schema) -> np.ndarray:
    """Each key name's attribute id, -1 for a name no subscription reads."""
    attr_names = schema.attribute_arrays()[0]
    return pc.fill_null(pc.index_in(names, value_set=attr_names), -1).to_numpy(
        zero_copy_only=False).astype(np.int32)


def _refusals(name, names, schema, errors, kind, rows, keys, values, attr, outside, at, problem, xp, dictionary,
              unread, not_utf8) -> dict[int, BadEventError]:
    """The refused entries, by the errors mode: raise the first event's
    first one, forget them (``"null"``: they are absent), or return each
    event's first (``"report"``: in the host encoder's order of finding
    them).  A string that is not valid UTF-8 comes before any other
    problem, as the host reads the whole map for those first (the first
    such entry in map order).  Only the refused positions leave the device."""
    if errors == "null":
        return {}
    host = cuda_support.to_host
    from engine.device_events import _entry_refusal
    first: dict[int, BadEventError] = {}
    if not_utf8 is not None:
        where = xp.flatnonzero(not_utf8)
        for event, attr_id, value in zip(host(rows[where]).tolist(), host(attr[where]).tolist(),
                                         host(values[where]).tolist()):
            if errors == "raise":
                raise _entry_refusal(unread[value], schema.attr_names[attr_id], schema, event)
            if event not in first:
                first[event] = _entry_refusal(unread[value], schema.attr_names[attr_id], schema, event)
    found = []              # (event, attribute id, error): a key outside the names (-1), or a refused value
    where = xp.flatnonzero(outside)
    for event, code in zip(host(rows[where]).tolist(), host(keys[where]).tolist()):
        found.append((event, -1, BadEventError(event, None, code, f"map {name!r} has key code {code}, outside its "
                                                                 f"{len(names)} names",
                                              " (pass errors='null' to treat such entries as absent)")))
    where = at[problem]
    for event, attr_id, value in zip(host(rows[where]).tolist(), host(attr[where]).tolist(),
                                     host(values[where]).tolist()):
        attribute = schema.attr_names[attr_id]
        family = schema.families.get(attribute)
        if kind == "s" and not 0 <= value < len(dictionary):
            error = BadEventError(event, attribute, value, f"attribute {attribute!r} has code {value}, outside its "
                                                           f"dictionary of {len(dictionary)}",
                                  " (pass errors='null' to treat such values as absent)")
        elif kind == "s" and value in unread:       # the host's words for the value as given, in any family
            error = _entry_refusal(unread[value], attribute, schema, event)
        else:
            shown = bool(value) if kind == "b" else dictionary[value].as_py() if kind == "s" else value
            error = _value_error(event, attribute, family, shown)
        found.append((event, attr_id, error))
    found.sort(key=lambda entry: entry[:2])         # an event's first problem by attribute, as the host's
    if errors == "raise":
        raise found[0][2]
    for event, _, error in found:
        first.setdefault(event, error)
    return first
