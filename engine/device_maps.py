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
* values are numbers (an attribute of another family refuses them) or
  booleans; numbers must be finite and, integers, within +-2**53; an
  attribute that only IS [NOT] NULL reads takes any value;
* a key code outside ``names`` is refused like a value, by the errors mode.

What leaves the device is one small vector of flags, and the refused
values' positions when there are any.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from engine.errors import BadEventError, SchemaError
from engine.events import _FAMILY_CODE, _family_codes, _value_error
from engine.expr import Family
from engine.schema import MAX_EXACT_INT
from gpu_kernels import cuda_support

__all__ = ["DeviceMap", "map_entries"]


class DeviceMap:
    """A ``map<string, V>`` column whose arrays are on the device: event
    ``i``'s entries are positions ``offsets[i]`` to ``offsets[i + 1]`` of
    ``keys`` (integer codes into ``names``, the attribute names, a host
    list or Arrow string array) and of ``values`` (numbers or booleans, one
    per entry).  ``valid`` (one boolean per event) is False for a null map,
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

    @classmethod
    def from_arrow(cls, column: pa.Array | pa.ChunkedArray) -> tuple[DeviceMap, list[np.ndarray]]:
        """A host Arrow map column as the host arrays of a DeviceMap: the map
        (its fields still host arrays, to be replaced by their device
        copies in the order of the list) and that list.  TypeError for
        values of a type the device form has no place for (strings,
        decimals, nested values): the host encoder takes those."""
        if isinstance(column, pa.ChunkedArray):
            column = column.combine_chunks()
        items_type = column.type.item_type
        if pa.types.is_dictionary(items_type):
            items_type = items_type.value_type
        if not (pa.types.is_boolean(items_type) or pa.types.is_integer(items_type)
                or pa.types.is_floating(items_type)):
            raise TypeError(f"a map of {column.type.item_type} values has no device-column form")
        offsets = column.offsets.to_numpy()
        lo, hi = int(offsets[0]), int(offsets[-1])
        keys = pc.cast(column.keys.slice(lo, hi - lo), pa.string())
        items = column.items.slice(lo, hi - lo)
        if pa.types.is_dictionary(items.type):
            items = items.dictionary_decode()
        coded = pc.dictionary_encode(keys)
        default = False if pa.types.is_boolean(items.type) else 0
        host = [(offsets - lo).astype(np.int64),
                coded.indices.to_numpy(zero_copy_only=False).astype(np.int32),
                pc.fill_null(items, default).to_numpy(zero_copy_only=False),
                column.is_valid().to_numpy(zero_copy_only=False),
                items.is_valid().to_numpy(zero_copy_only=False)]
        return cls(*host[:3], coded.dictionary, valid=host[3], value_valid=host[4]), host


def map_entries(name: str, column: DeviceMap, schema, errors: str, device, xp
                ) -> tuple[int, tuple, dict[int, BadEventError]]:
    """``(n_events, (rows, attr, values), refused)``: the entries of the map
    the index reads, on the device, ordered by (event, attribute) with one
    entry per attribute of an event -- and, with ``errors="report"``, the
    first refusal of each event holding one (those events' entries left
    out).  ``device(x, label)`` puts a given array on the device (in place
    when it is there already); ``name`` is the map's column, for errors."""
    offsets = device(column.offsets, f"{name}.offsets")
    keys = device(column.keys, f"{name}.keys")
    values = device(column.values, f"{name}.values")
    if offsets.dtype.kind not in "iu" or keys.dtype.kind not in "iu":
        raise ValueError(f"map {name!r}: offsets and keys are integer arrays, not {offsets.dtype} and {keys.dtype}")
    if len(offsets) == 0:
        raise ValueError(f"map {name!r}: offsets hold one entry per event and one more (0 for no events)")
    kind = values.dtype.kind
    if kind not in "biuf":
        raise SchemaError(f"map {name!r}: values of {values.dtype} have no device form (numbers or booleans; "
                          f"a map of strings goes as an Arrow table)")
    n_events = len(offsets) - 1
    bounds = cuda_support.to_host(offsets[xp.asarray([0, n_events])])
    lo, hi = int(bounds[0]), int(bounds[1])
    if hi < lo or lo < 0 or len(keys) < hi or len(values) < hi:
        raise ValueError(f"map {name!r}: offsets run from {lo} to {hi}, over {len(keys)} keys and "
                         f"{len(values)} values")
    keys, values = keys[lo:hi], values[lo:hi]
    position = xp.arange(lo, hi, dtype=np.int64)
    rows = xp.searchsorted(offsets[1:], position, side="right").astype(np.int64)
    present = xp.ones(hi - lo, dtype=bool)
    for label, mask, size, at in (("valid", column.valid, n_events, rows),
                                  ("value_valid", column.value_valid, None, None)):
        if mask is None:
            continue
        mask = device(mask, f"{name}.{label}")
        if mask.dtype != np.bool_ or (size is not None and len(mask) != size):
            raise ValueError(f"map {name!r}: {label} is a boolean array of "
                             f"{'one per event' if size is not None else 'one per entry'}")
        if size is None:
            if len(mask) < hi:
                raise ValueError(f"map {name!r}: value_valid has {len(mask)} entries for {hi}")
            mask = mask[lo:hi]
        present &= mask if at is None else mask[at]
    names = _names(name, column.names)
    attr_of_key = xp.asarray(_attribute_ids(names, schema))          # name code -> attribute id (-1: unread)
    inside = (keys >= 0) & (keys < len(names))
    attr = attr_of_key[xp.where(inside, keys, 0)] if len(names) else xp.full(hi - lo, -1, np.int32)
    outside = present & ~inside
    read = present & inside & (attr >= 0)
    # entries ordered by (event, attribute), stable: a repeated key's last entry is its last in map order
    n_attrs = max(len(schema.attr_names), 1)
    at = xp.flatnonzero(read)
    at = at[xp.argsort(rows[at] * n_attrs + attr[at], kind="stable")]
    if len(at):
        last = xp.ones(len(at), dtype=bool)
        last[:-1] = (rows[at[1:]] != rows[at[:-1]]) | (attr[at[1:]] != attr[at[:-1]])
        at = at[last]
    family = xp.asarray(_family_codes(schema.attribute_arrays()[1]))[attr[at]]      # per entry kept
    own = _FAMILY_CODE[Family.BOOLEAN if kind == "b" else Family.NUMERIC]
    problem = (family != 0) & (family != own)              # the attribute is of another family
    kept = values[at]
    if kind in "iuf":
        as_float = kept.astype(np.float64)
        bad = ~xp.isfinite(as_float)
        if kind == "i":         # exact as float64 only within +-2**53 (compared as integers)
            bad |= (kept > MAX_EXACT_INT) | (kept < -MAX_EXACT_INT)
        elif kind == "u":
            bad |= kept > MAX_EXACT_INT
        problem |= bad & (family != 0)
    flags = cuda_support.to_host(xp.stack([(offsets[1:] < offsets[:-1]).any(), outside.any(), problem.any()]))
    if flags[0]:
        raise ValueError(f"map {name!r}: its offsets decrease")
    refused: dict[int, BadEventError] = {}
    if flags[1] or flags[2]:
        refused = _refusals(name, names, schema, errors, kind, rows, keys, values, attr, outside, at, problem,
                            xp)
        keep = ~problem
        if refused:                                         # errors="report": the event is set aside whole
            keep &= ~xp.isin(rows[at], xp.asarray(np.fromiter(refused, np.int64, len(refused))))
        at, family = at[keep], family[keep]
    # (an attribute only IS [NOT] NULL reads: presence is all, as the host encoder has it)
    value = xp.where(family == 0, 0.0, values[at].astype(np.float64))
    return n_events, (rows[at], attr[at].astype(np.int32), value), refused


def _names(name: str, names) -> pa.Array:
    """The key dictionary as an Arrow string array."""
    if isinstance(names, pa.ChunkedArray):
        names = names.combine_chunks()
    if isinstance(names, pa.Array) and pa.types.is_dictionary(names.type):
        names = names.dictionary_decode()
    if isinstance(names, pa.Array) and not (pa.types.is_string(names.type) or pa.types.is_large_string(names.type)
                                            or pa.types.is_string_view(names.type)):
        # (a cast would make numbers names: the key 1 would be the attribute "1")
        raise SchemaError(f"map {name!r}: its key names are not strings: they are {names.type}")
    try:
        names = pa.array(names, pa.string()) if not isinstance(names, pa.Array) else names.cast(pa.string())
    except (pa.ArrowException, TypeError, UnicodeEncodeError) as error:       # a lone surrogate, a number
        raise SchemaError(f"map {name!r}: its key names are not strings: {error}") from None
    if names.null_count:
        raise SchemaError(f"map {name!r}: its key names hold a null")
    return names


def _attribute_ids(names: pa.Array, schema) -> np.ndarray:
    """Each key name's attribute id, -1 for a name no subscription reads."""
    attr_names = schema.attribute_arrays()[0]
    return pc.fill_null(pc.index_in(names, value_set=attr_names), -1).to_numpy(
        zero_copy_only=False).astype(np.int32)


def _refusals(name, names, schema, errors, kind, rows, keys, values, attr, outside, at, problem, xp
              ) -> dict[int, BadEventError]:
    """The refused entries, by the errors mode: raise the first event's
    first one, forget them (``"null"``: they are absent), or return each
    event's first (``"report"``).  Only the refused positions leave the
    device."""
    if errors == "null":
        return {}
    host = cuda_support.to_host
    found = []              # (event, map position, error): a key outside the names, or a refused value
    where = xp.flatnonzero(outside)
    for k, event, code in zip(host(where).tolist(), host(rows[where]).tolist(), host(keys[where]).tolist()):
        found.append((event, k, BadEventError(event, None, code, f"map {name!r} has key code {code}, outside its "
                                                                 f"{len(names)} names",
                                              " (pass errors='null' to treat such entries as absent)")))
    where = at[problem]
    for k, event, attribute, value in zip(host(where).tolist(), host(rows[where]).tolist(),
                                          host(attr[where]).tolist(), host(values[where]).tolist()):
        attribute = schema.attr_names[attribute]
        family = schema.families.get(attribute)
        found.append((event, k, _value_error(event, attribute, family, bool(value) if kind == "b" else value)))
    found.sort(key=lambda entry: entry[:2])
    if errors == "raise":
        raise found[0][2]
    first: dict[int, BadEventError] = {}
    for event, _, error in found:
        first.setdefault(event, error)
    return first
