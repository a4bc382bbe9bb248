"""Events that are already on the device: one column per attribute in,
an :class:`engine.events.EventBatch` on the device out (docs/architecture.md, "Device-resident events").

Users on GPU workstations and Spark-RAPIDS hold their events on the GPU
(CuPy arrays, numba device arrays, PyTorch tensors, cuDF columns); copying
them to the host only to encode them and copy them back is what this module
avoids.  ``Index.match_batch(columns)`` with a mapping of attribute name to
device column comes here when the index runs on ``cuda``:

* a column is anything exposing the CUDA Array Interface
  (``__cuda_array_interface__``: CuPy, numba device arrays, cuDF numeric
  columns) or DLPack from CUDA memory (``__dlpack__`` with a
  ``__dlpack_device__`` of kDLCUDA: PyTorch, JAX), one value per event --
  a host producer (a NumPy or PyArrow array, a CPU tensor) is not a
  device column (host events come as a table), but one among device
  columns is copied over;
* a string attribute arrives as its dictionary codes plus the dictionary
  (a pair ``(codes, dictionary)``; a cuDF categorical column's ``codes``
  and ``categories``): the dictionary is small and goes through the host
  encoder once (each entry's code under the index's string dictionary, and
  the LIKE/MATCHES results per entry), the codes stay on the device;
* absent values are given by ``valid={attribute: device boolean column}``
  (True where the event carries the attribute); a cuDF ``Series`` among
  the columns, or a cuDF ``DataFrame`` as the batch, brings its own nulls
  (read through its ``notna``, :func:`series_column`; cuDF is not
  imported), and so does a column whose CUDA Array Interface carries a
  ``mask`` (:func:`interface_column`: a bit an event as cuDF and XGBoost
  export it, or a boolean an event; set where the value is there, as the
  interface defines it).

Encoding is array operations on the device (CuPy; NumPy stands in under
numba's CUDA simulator): the columns are stacked as ``[attribute, event]``
values, validity and string tokens, an event's entry count is a column
sum, the offsets its running sum, and the entries the stacked arrays read
event-major through the validity mask -- attributes ascending within each
event, as every matcher expects.  Nothing of the batch visits the host
but one flag: whether any value is refused.  A clean batch -- the common
case -- is checked a matrix per dtype, with a handful of launches for all
its columns; a batch with a value to refuse is encoded again a column at a
time, which finds the first refused value's position and acts on it.
Values follow the host encoder's rules: numbers must be finite and, for
integer columns, within +-2**53 (float64 holds them exactly); a boolean
attribute takes a boolean column, a numeric one a column of numbers (a column of another kind has each of its
values refused, as the host encoder refuses such a value); an attribute
the index has never seen is left out (no subscription reads it).
``errors="raise"`` names the first refused value's event and attribute,
``errors="null"`` treats refused values as absent, ``errors="report"``
sets the events holding one aside (the batch's ``rejected``: one
:class:`engine.errors.BadEventError` per event, of its first column in the
order given; only the refused rows' positions and values come back).

:func:`arrow_columns` copies a host Arrow table's columns over in one
copy, through a pinned staging buffer -- the Spark workers' route on GPU
executors.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from engine import device_maps
from engine.device_maps import DeviceMap
from engine.errors import BadEventError, SchemaError
from engine.events import EventBatch, _value_error, encode_events, from_arrow, given_twice
from engine.expr import Family, lone_surrogate
from engine.schema import MAX_EXACT_INT
from gpu_kernels import cuda_support

__all__ = ["DeviceMap", "arrow_columns", "encode_device_columns", "frame_columns", "is_device_column",
           "is_device_columns", "is_device_frame", "is_device_series", "interface_column", "lift_nulls",
           "series_column"]


#: DLPack device types a CUDA kernel reads in place: kDLCUDA and
#: kDLCUDAManaged (kDLCUDAHost, 3, is pinned *host* memory)
DLPACK_CUDA_DEVICES = (2, 13)


def _dlpack_on_device(x) -> bool:
    """A DLPack producer whose memory is on a CUDA device.  Host producers
    export DLPack too -- NumPy, PyArrow arrays (since pyarrow 15), CPU
    tensors -- so ``__dlpack__`` alone says nothing about where the data is;
    ``__dlpack_device__`` does."""
    device = getattr(x, "__dlpack_device__", None)
    if device is None or not hasattr(x, "__dlpack__"):
        return False
    try:
        kind = int(device()[0])
    except (TypeError, ValueError, IndexError, RuntimeError):
        return False
    return kind in DLPACK_CUDA_DEVICES


def is_device_column(x) -> bool:
    """A device array as a caller hands it over (CUDA Array Interface, or
    DLPack from CUDA memory; under the simulator, what its
    ``cuda.to_device`` returns)."""
    if cuda_support.is_device_array(x):
        return True
    return not cuda_support.simulated() and _dlpack_on_device(x)


def is_device_columns(events) -> bool:
    """Whether ``events`` is a mapping of attribute to columns of which at
    least one is a device column (or a ``(codes, dictionary)`` pair with
    device codes): the batch is on the device, and a host array among its
    columns is copied over -- whatever the order of the columns.  A
    :class:`engine.device_maps.DeviceMap`, alone or among the columns, is
    the device form whatever its arrays are."""
    if isinstance(events, DeviceMap):
        return True
    if not isinstance(events, Mapping) or not events:
        return False
    for column in events.values():
        if isinstance(column, DeviceMap):
            return True
        if isinstance(column, tuple) and len(column) == 2:
            column = column[0]
        if is_device_column(column):
            return True
    return False


def _column_values(series):
    """A DataFrame column's values as an array (``.values``: CuPy for a
    cuDF column, NumPy for pandas), None where the frame library has no
    such array for it (cuDF strings and categoricals raise)."""
    try:
        return series.values
    except Exception:       # noqa: BLE001 -- a frame library's own "not implemented" for this dtype
        return None


def is_device_frame(events) -> bool:
    """A DataFrame whose columns are on the device -- a cuDF ``DataFrame``,
    recognised by the protocol, not by importing cuDF: a frame (``columns``,
    ``frame[name]``) of which a column's class exposes the CUDA Array
    Interface (read off the class: cuDF's raises for a column of strings or
    with nulls) or whose ``.values`` is a device array.  A pandas frame's
    are NumPy arrays."""
    if isinstance(events, Mapping) or type(events).__name__ != "DataFrame" or not hasattr(events, "columns") \
            or type(events).__module__.startswith("pandas"):      # (pandas: host columns, without a look)
        return False
    for name in list(events.columns):
        series = events[name]
        if hasattr(type(series), "__cuda_array_interface__"):
            return True
        values = _column_values(series)
        if values is not None and is_device_column(values):
            return True
    return False


def frame_columns(frame) -> tuple[dict, dict]:
    """A device DataFrame (:func:`is_device_frame`) as the columns and
    ``valid`` that :func:`encode_device_columns` takes, a column at a time
    by :func:`series_column`."""
    columns, valid = {}, {}
    for name in list(frame.columns):
        columns[name], present = series_column(name, frame[name])
        if present is not None:
            valid[name] = present
    return columns, valid


def is_device_series(x) -> bool:
    """A cuDF ``Series`` (or one of its columns), by the protocol: its class
    exposes the CUDA Array Interface, and it has the pandas API's
    ``notna``/``fillna`` and a ``null_count`` -- where a null is."""
    return not isinstance(x, (tuple, np.ndarray)) and hasattr(type(x), "__cuda_array_interface__") and all(
        hasattr(type(x), member) for member in ("notna", "fillna", "null_count"))


def series_column(name: str, series) -> tuple:
    """A cuDF-like ``Series`` as ``(column, valid or None)`` in the form
    :func:`encode_device_columns` takes, through the pandas API that cuDF
    implements, each step on the device: a null is an absent value
    (``notna()``, then ``fillna``), a categorical column is its codes plus
    its categories, and a column of strings is made one
    (``astype("category")``, cuDF's dictionary encoding).  TypeError for a
    column of another kind (lists, structs, decimals), which the frame's
    ``to_arrow()`` takes to the host encoder.  (The interface's own
    ``mask`` is a bitmask in cuDF; this reads the nulls without it.)"""
    kind = str(series.dtype)
    if kind in ("object", "str", "string"):
        series, kind = series.astype("category"), "category"
    nulls = getattr(series, "null_count", None)
    if nulls is None:
        nulls = int(series.isna().sum())
    present = _column_values(series.notna()) if nulls else None
    if kind == "category":
        categories = series.cat.categories
        categories = categories.to_arrow() if hasattr(categories, "to_arrow") else pa.array(list(categories))
        if pa.types.is_string(categories.type) or pa.types.is_large_string(categories.type):
            codes = series.cat.codes
            return (_column_values(codes.fillna(0) if nulls else codes), categories), present
        try:        # categories of numbers or booleans: the values themselves, decoded on the device
            series, kind = series.astype(categories.type.to_pandas_dtype()), str(categories.type)
        except (NotImplementedError, TypeError, ValueError, pa.ArrowException):
            raise TypeError(f"column {name!r}: a categorical of {categories.type} has no device-column form; "
                            f"pass frame.to_arrow()") from None
    try:
        number_kind = np.dtype(series.dtype).kind
    except TypeError:           # a dtype of the frame library's own (lists, structs, decimals)
        number_kind = None
    if number_kind is None or number_kind not in "biuf":
        raise TypeError(f"column {name!r} of dtype {kind} has no device-column form; pass frame.to_arrow()")
    values = _column_values(series.fillna(False if number_kind == "b" else 0) if nulls else series)
    if values is None:
        raise TypeError(f"column {name!r} of dtype {kind} gives no array of its values")
    return values, present


def interface_column(name: str, column) -> tuple:
    """A column whose CUDA Array Interface carries a ``mask`` as ``(values,
    valid)``: the values read in place without the mask (CuPy and numba
    refuse masked arrays), and the mask as a device boolean column, True
    where the value is there -- the interface's definition of ``mask``.
    Two forms of mask are read: one bit an event in Arrow's order (typestr
    ``t1``: bit ``i % 8`` of byte ``i // 8``, cuDF's and XGBoost's form),
    or one boolean or integer an event (nonzero: there).  ValueError for
    any other, or for a mask not one per event.  ``(column, None)`` for a
    column without a mask."""
    interface = cuda_support.interface_of(column)
    mask = None if interface is None else interface.get("mask")
    if mask is None:
        return column, None
    n_events = interface["shape"][0] if len(interface.get("shape", ())) == 1 else None
    described = mask if isinstance(mask, dict) else cuda_support.interface_of(mask)
    if described is None:
        raise ValueError(f"column {name!r}: its interface mask exposes no CUDA Array Interface")
    if n_events is None or tuple(described.get("shape", ())) != (n_events,):
        raise ValueError(f"column {name!r}: its interface mask must hold one entry per event "
                         f"(shape {(n_events,)}), not shape {described.get('shape')}")
    typestr = str(described.get("typestr", ""))
    xp = cuda_support.array_module()
    if typestr[1:] == "t1":
        if described.get("strides") not in (None, (1,)):
            raise ValueError(f"column {name!r}: a bit mask (typestr {typestr!r}) must be contiguous")
        octets = cuda_support.interface_array(
            {**described, "typestr": "|u1", "shape": (-(-n_events // 8),), "strides": None}, mask)
        position = xp.arange(n_events)
        present = ((octets[position >> 3].astype(np.int32) >> (position & 7)) & 1).astype(bool)
    else:
        try:
            kind = np.dtype(typestr).kind
        except TypeError:
            kind = None
        if kind is None or kind not in "biu":
            raise ValueError(f"column {name!r}: an interface mask of typestr {typestr!r} is neither one bit "
                             f"('<t1') nor one boolean or integer an event")
        present = cuda_support.interface_array(described, mask) != 0
    return cuda_support.interface_array(interface, column), present


def lift_nulls(columns: Mapping, valid: Mapping | None) -> tuple[Mapping, Mapping | None]:
    """``(columns, valid)`` with each column that brings its own nulls as
    its values plus ``valid``: a cuDF-like ``Series`` (:func:`series_column`)
    or a column -- or a string pair's codes -- whose interface carries a
    ``mask`` (:func:`interface_column`).  An event is absent there where
    the column says so, as well as where ``valid`` says so.  Anything else
    is left as it is."""
    if not isinstance(columns, Mapping) or valid is not None and not isinstance(valid, Mapping):
        return columns, valid       # (refused by the encoder)

    def codes(column):
        return column[0] if isinstance(column, tuple) and len(column) == 2 else column

    def masked(column) -> bool:
        column = codes(column)
        if type(column).__module__.partition(".")[0] in ("cupy", "numba", "numba_cuda", "numpy"):
            return False        # arrays that never carry a mask: their interface is not built (392 columns in W1)
        interface = cuda_support.interface_of(column)
        return interface is not None and interface.get("mask") is not None

    if not any(is_device_series(c) or masked(c) for c in columns.values()):
        return columns, valid
    columns, valid = dict(columns), dict(valid or {})
    for name, column in columns.items():
        if is_device_series(column):
            columns[name], present = series_column(name, column)
        elif masked(column):
            values, present = interface_column(name, codes(column))
            columns[name] = (values, column[1]) if isinstance(column, tuple) else values
        else:
            continue
        if present is not None and name in valid:
            given = _device(valid[name], f"valid[{name!r}]")
            if given.dtype != np.bool_ or given.shape != present.shape:     # (& would broadcast a short one)
                raise ValueError(f"valid[{name!r}] must be a boolean column of {len(present)} values")
            present = given & present
        if present is not None:
            valid[name] = present
    return columns, valid


def _device(x, name: str):
    """``x`` as an array of the device's array module, without a copy."""
    interface = getattr(x, "__cuda_array_interface__", None)
    if isinstance(interface, dict) and interface.get("mask") is not None:       # (a column's is lifted first)
        raise ValueError(f"{name} carries a CUDA Array Interface mask, which is read on a column only (as its "
                         f"absent values): pass it unmasked")
    if not cuda_support.simulated() and not hasattr(x, "__cuda_array_interface__") and _dlpack_on_device(x):
        import cupy
        return cupy.from_dlpack(x)
    if isinstance(x, (pa.Array, pa.ChunkedArray)):      # a host column among device ones: copied over
        if x.null_count:
            raise ValueError(f"column {name!r} is a host Arrow column with nulls among device columns: put it on "
                             f"the device with valid={{{name!r}: ...}} for its absent values, or match the "
                             f"events as a table")
        x = x.to_numpy(zero_copy_only=False)
    array = cuda_support.as_device(x)
    if array.ndim != 1:
        raise ValueError(f"column {name!r} must be one-dimensional (one value per event), not of shape {array.shape}")
    return array


def _first_bad(xp, bad, valid) -> int | None:
    """Position of the first refused value (only one scalar leaves the device)."""
    bad = bad & valid
    if not bool(bad.any()):
        return None
    return int(xp.argmax(bad))


def _refuse(name: str, column, row: int, reason: str | None, family: Family = Family.NUMERIC) -> BadEventError:
    """The error for the value at ``row``: in the host encoder's words for a
    value of the attribute's ``family`` (``reason`` None), so that a
    quarantine reads the same whichever executor matched."""
    value = cuda_support.to_host(column[row:row + 1])[0]
    value = value.item() if hasattr(value, "item") else value
    if reason is None:
        return _value_error(row, name, family, value)
    return BadEventError(row, name, value, f"attribute {name!r} {reason}",
                         " (pass errors='null' to treat such values as absent)")


def string_array(label: str, strings) -> pa.Array:
    """``strings`` (a list, an Arrow string or dictionary array) as an Arrow
    large_string array; SchemaError, beginning with ``label``, for anything
    else -- numbers, booleans, bytes (a cast would make 1 the string '1'),
    a lone surrogate, a null."""
    if not isinstance(strings, (pa.Array, pa.ChunkedArray)) and hasattr(strings, "to_arrow"):
        strings = strings.to_arrow()        # a cuDF Index or Series (which refuses an implicit conversion)
    if isinstance(strings, pa.ChunkedArray):
        strings = strings.combine_chunks()
    if isinstance(strings, pa.Array) and pa.types.is_dictionary(strings.type):
        strings = strings.dictionary_decode()
    if isinstance(strings, pa.Array) and not (pa.types.is_string(strings.type) or pa.types.is_large_string(
            strings.type) or pa.types.is_string_view(strings.type) or pa.types.is_null(strings.type)):
        raise SchemaError(f"{label} is not a list of strings: it is {strings.type}")
    if isinstance(strings, (str, bytes)):
        raise SchemaError(f"{label} is not a list of strings: it is one {type(strings).__name__}")
    if not isinstance(strings, pa.Array):
        strings = list(strings) if hasattr(strings, "__iter__") else strings
        other = next((s for s in strings if s is not None and not isinstance(s, str)), None) \
            if isinstance(strings, list) else None
        if other is not None:       # (pyarrow would take bytes as their UTF-8 text)
            raise SchemaError(f"{label} is not a list of strings: it holds {type(other).__name__} {other!r}")
    try:
        strings = pa.array(strings, pa.large_string()) if not isinstance(strings, pa.Array) \
            else strings.cast(pa.large_string())
    except (pa.ArrowException, UnicodeEncodeError, TypeError) as error:     # a lone surrogate, a non-string
        raise SchemaError(f"{label} is not a list of strings: {error}") from None
    if strings.null_count:
        raise SchemaError(f"{label} holds a null")
    return strings


def _dictionary_codes(name: str, dictionary, schema, attribute: str | None = ""
                      ) -> tuple[pa.Array, np.ndarray, dict]:
    """The dictionary as an Arrow string array, each entry's code under the
    index's string dictionary (through the host encoder, so that the rules
    are the same), read as values of ``attribute`` (``name`` by default;
    the codes are the schema's whichever string attribute reads them; None:
    none does, and the codes are 0), and the entries the host encoder
    refuses as such values -- a lone surrogate, a string that is not valid
    UTF-8 -- as ``{entry: the entry as given}``.  Such an entry is no error
    of the batch: it stands as "" in the array, and an event whose value is
    coded to it has that value refused, by the errors mode, as the host
    refuses it in an event (:func:`_entry_refusal`)."""
    if isinstance(dictionary, np.ndarray) and dictionary.dtype.kind in "UO":
        dictionary = dictionary.tolist()
    unencodable = {}
    if isinstance(dictionary, (list, tuple)):
        unencodable = {i: text for i, text in enumerate(dictionary) if lone_surrogate(text) is not None}
        if unencodable:
            dictionary = ["" if i in unencodable else text for i, text in enumerate(dictionary)]
    strings = string_array(f"column {name!r}: its dictionary", dictionary)
    attribute = name if attribute == "" else attribute
    if attribute is None:
        return strings, np.zeros(len(strings)), {}
    coded = from_arrow(pa.table({attribute: strings}), schema, "report")
    not_utf8 = [bad.event for bad in coded.rejected]        # (the only value a string attribute refuses in Arrow)
    refused = {entry: strings.slice(entry, 1) for entry in not_utf8}
    refused.update((i, text) for i, text in unencodable.items() if _entry_refusal(text, attribute, schema, i))
    if not_utf8:            # kept out of the strings read further on (the patterns' results)
        mask = np.zeros(len(strings), bool)
        mask[not_utf8] = True
        strings = pc.replace_with_mask(strings, pa.array(mask), pa.array([""] * len(not_utf8), strings.type))
    codes = np.zeros(len(strings))      # (a refused entry has no entry in the batch: one a row for the others)
    codes[np.diff(coded.offsets) > 0] = coded.value
    return strings, codes, refused


def _entry_refusal(value, attribute: str, schema, event: int) -> BadEventError | None:
    """The host encoder's error for ``value`` (a Python string, or one
    entry of an Arrow string array) as ``attribute``'s value in event
    ``event``, in its words; None where it takes the value."""
    if isinstance(value, pa.Array):
        batch = from_arrow(pa.table({attribute: value}), schema, "report")
    else:
        batch = encode_events([{attribute: value}], schema, "report")
    rejected = list(getattr(batch, "rejected", ()))
    if not rejected:
        return None
    error = rejected[0]
    return BadEventError(event, error.attribute, error.value, error.reason, error.hint)


def encode_device_columns(columns: Mapping, valid: Mapping | None, schema, errors: str = "raise"
                          ) -> tuple[EventBatch, EventBatch]:
    """Device columns -> ``(batch, strings)``: the batch in CSR form with its
    arrays on the device, and a small host batch holding one entry per
    dictionary string (attribute, token), for the LIKE/MATCHES results
    (:func:`engine.events.pattern_truth`)."""
    if errors not in ("raise", "null", "report"):
        raise ValueError(f"errors must be 'raise', 'null' or 'report', not {errors!r}")
    if isinstance(columns, DeviceMap):
        columns = {"map": columns}
    columns, valid = lift_nulls(columns, valid)
    if any(isinstance(column, DeviceMap) for column in columns.values()):
        return _with_maps(columns, valid, schema, errors)
    rejected: dict[int, BadEventError] = {}

    def refused(name: str, data, bad, present, reason, family: Family = Family.NUMERIC, error=None) -> object:
        """``present`` without the refused values, after raising (errors=
        "raise") or recording them (errors="report": first column first);
        ``error(row)``, where given, makes a row's error."""
        error = error or (lambda row: _refuse(name, data, row, reason(row), family))
        row = _first_bad(xp, bad, present)
        if row is None:
            return present
        if errors == "raise":
            raise error(row)
        if errors == "report":
            rows = cuda_support.to_host(xp.flatnonzero(bad & present)).tolist()
            for r in rows:
                if r not in rejected:
                    rejected[r] = error(r)
        return present & ~bad

    if valid is not None and not isinstance(valid, Mapping):
        raise TypeError(f"valid is a mapping of attribute -> device boolean array, not {type(valid).__name__}")
    valid = dict(valid or {})
    unknown = set(valid) - set(columns)
    if unknown:
        raise ValueError(f"valid= names {sorted(unknown)}, which are not among the columns")
    xp = cuda_support.array_module()
    clean = _encode_clean(columns, valid, schema, xp)
    if clean is not None:
        return clean
    # the careful path: one column at a time, each check as it comes, so that errors name the first refused
    # value in the columns' order and errors="null"/"report" act on exactly the refused values
    n_events = None
    stacked = []      # (attribute id, values float64, valid bool, tokens int32 or None)
    dictionaries: list[tuple[int, pa.Array]] = []
    n_strings = 0
    for name, column in columns.items():
        if not isinstance(name, str):
            raise TypeError(f"column names are attribute names (str), not {type(name).__name__}")
        pair = isinstance(column, tuple)
        if pair and len(column) != 2:
            raise ValueError(f"column {name!r}: a string column is a pair (codes, dictionary)")
        data = _device(column[0] if pair else column, name)
        if n_events is None:
            n_events = len(data)
        elif len(data) != n_events:
            raise ValueError(f"column {name!r} has {len(data)} values where the others have {n_events}")
        present = xp.ones(n_events, dtype=bool)
        if name in valid:
            present = _device(valid[name], f"valid[{name!r}]")
            if present.dtype != np.bool_ or len(present) != n_events:
                raise ValueError(f"valid[{name!r}] must be a boolean column of {n_events} values")
        if name not in schema.attr_ids:
            continue                    # no subscription reads it (as the host encoder does)
        family = schema.families.get(name)
        kind = data.dtype.kind
        tokens = None
        if pair:
            if family not in (Family.STRING, None) or kind not in "iu":
                raise SchemaError(f"column {name!r}: (codes, dictionary) is for a string attribute, with integer "
                                  f"codes; {name!r} is {family.value if family else 'untyped'} and the codes are "
                                  f"{data.dtype}")
            strings, table, unread = _dictionary_codes(name, column[1], schema)
            out_of_range = (data < 0) | (data >= len(strings))
            # or coded to an entry the host refuses (a lone surrogate, invalid UTF-8)
            bad = out_of_range | device_maps.coded_to(data, unread, len(strings), xp) if unread else out_of_range

            def code_error(row, name=name, data=data, strings=strings, unread=unread):
                code = int(cuda_support.to_host(data[row:row + 1])[0])
                if code in unread:
                    return _entry_refusal(unread[code], name, schema, row)
                return _refuse(name, data, row, f"has code {code}, outside its dictionary of {len(strings)}")
            present = refused(name, data, bad, present, None, error=code_error)
            codes = xp.where(present, data, 0).astype(np.int64)
            values = xp.asarray(table)[codes] if len(strings) else xp.zeros(n_events)
            tokens = (codes + n_strings).astype(np.int32)
            dictionaries.append((schema.attr_ids[name], strings))
            n_strings += len(strings)
        elif family is Family.STRING:
            raise SchemaError(f"column {name!r}: strings arrive on the device as (codes, dictionary)")
        elif family in (Family.NUMERIC_LIST, Family.STRING_LIST):
            raise SchemaError(f"column {name!r}: {name!r} is a list attribute ({family.value}), which device "
                              f"columns cannot carry; pass its events as an Arrow table or dicts")
        elif family is None:        # only IS [NOT] NULL reads it: any value is taken, presence is all
            values = xp.zeros(n_events)
        elif kind not in ("b" if family is Family.BOOLEAN else "iuf"):
            # a column of the wrong kind (numbers for a boolean attribute, booleans for a numeric one): each
            # value is refused as the host encoder refuses it -- per event, by the errors mode -- not the batch
            present = refused(name, data, xp.ones(n_events, dtype=bool), present, lambda row: None, family)
            values = xp.zeros(n_events)
        elif family is Family.BOOLEAN:
            values = data.astype(np.float64)
        else:
            values = data.astype(np.float64)
            bad = ~xp.isfinite(values)
            if kind == "i":             # exact as float64 only within +-2**53 (compared as integers:
                bad = bad | (data > MAX_EXACT_INT) | (data < -MAX_EXACT_INT)      # 2**53 + 1 rounds to 2**53)
            elif kind == "u":
                bad = bad | (data > MAX_EXACT_INT)
            present = refused(name, data, bad, present, lambda row: None)
        stacked.append((schema.attr_ids[name], values, present, tokens))
    n_events = n_events or 0
    if rejected:          # a refused event is encoded with no attributes (its matches are dropped)
        keep = np.ones(n_events, dtype=bool)
        keep[list(rejected)] = False
        keep = xp.asarray(keep)
        stacked = [(a, values, present & keep, tokens) for a, values, present, tokens in stacked]
    if not stacked:
        return _assemble(xp, n_events, [], None, None, None, dictionaries, rejected)
    return _assemble(xp, n_events, [entry[0] for entry in stacked], xp.stack([entry[1] for entry in stacked]),
                     xp.stack([entry[2] for entry in stacked]),
                     xp.stack([xp.full(n_events, -1, dtype=np.int32) if entry[3] is None else entry[3]
                               for entry in stacked]), dictionaries, rejected)


def _with_maps(columns: Mapping, valid: Mapping | None, schema, errors: str) -> tuple[EventBatch, EventBatch]:
    """:func:`encode_device_columns` of a batch holding map columns
    (:class:`engine.device_maps.DeviceMap`): the other columns encoded as
    always, each map's entries beside theirs, merged event by event.  The
    refusals rank as a host table's: ``errors="raise"`` raises the first
    refused value of the first column (in the order given) holding one,
    ``errors="report"`` keeps each event's refusal of its first such
    column.  An attribute given twice in an event (a column and a map key,
    or keys of two maps) is an error of that event after its values, as
    in a host table, whatever the errors mode."""
    xp = cuda_support.array_module()
    maps = {name: column for name, column in columns.items() if isinstance(column, DeviceMap)}
    if valid and set(valid) & set(maps):
        raise ValueError(f"valid= names the map {sorted(set(valid) & set(maps))[0]!r}: a map's null maps are its "
                         f"own valid (DeviceMap(..., valid=...))")
    if valid and set(valid) - set(columns):
        raise ValueError(f"valid= names {sorted(set(valid) - set(columns))}, which are not among the columns")
    rank = {name: k for k, name in enumerate(columns)}
    collect = "report" if errors == "raise" else errors       # every column's refusals first, then rank them
    dense = {name: column for name, column in columns.items() if name not in maps}
    if dense:
        batch, strings = encode_device_columns(dense, valid, schema, collect)
    else:
        batch, strings = _assemble(xp, 0, [], None, None, None, [], {})
    # event -> (its column's rank, the error's place in the order its column's refusals are found, the error)
    found = {error.event: (rank.get(error.attribute, -1), error.event, error) for error in batch.rejected}
    dictionaries = [batch.strings]          # the batch's strings: the columns', then each map's dictionary
    pair_attrs, pair_tokens = [strings.attr], [strings.token]
    parts, n_events = [], batch.n_events if dense else None
    for name, column in maps.items():
        n, part, refused, coded = device_maps.map_entries(name, column, schema, collect, _device, xp,
                                                          sum(map(len, dictionaries)))
        if n_events is not None and n != n_events:
            raise ValueError(f"map {name!r} has {n} events where the other columns have {n_events}")
        n_events = n
        parts.append(part)
        for place, (event, error) in enumerate(refused.items()):
            if event not in found or found[event][0] > rank[name]:
                found[event] = (rank[name], place, error)
        if coded is not None:
            dictionaries.append(coded[0])
            pair_attrs.append(coded[1])
            pair_tokens.append(coded[2])
    if found and errors == "raise":         # the first column holding a refused value, its first one found
        raise min(found.values(), key=lambda ranked: ranked[:2])[2]
    rejected = {event: error for event, (_, _, error) in found.items()}
    if not dense:
        batch = _assemble(xp, n_events, [], None, None, None, [], {})[0]
    nnz = len(batch.attr)
    rows = device_maps.entry_rows(xp, batch.offsets, 0, nnz)
    rows, attr, value, token = (xp.concatenate([rows] + [p[0] for p in parts]),
                                xp.concatenate([batch.attr] + [p[1] for p in parts]),
                                xp.concatenate([batch.value] + [p[2] for p in parts]),
                                xp.concatenate([batch.token] + [p[3] for p in parts]))
    all_strings = pa.concat_arrays([d.cast(pa.large_string()) for d in dictionaries])
    strings = EventBatch(np.array([0, sum(map(len, pair_attrs))], np.int64), np.concatenate(pair_attrs),
                         np.zeros(sum(map(len, pair_attrs))), np.concatenate(pair_tokens), all_strings)
    order = xp.argsort(rows * max(len(schema.attr_names), 1) + attr, kind="stable")
    rows, attr, value, token = rows[order], attr[order], value[order], token[order]
    twice = xp.flatnonzero((rows[1:] == rows[:-1]) & (attr[1:] == attr[:-1]))
    if len(twice):
        for event, attribute in zip(cuda_support.to_host(rows[twice]).tolist(),
                                    cuda_support.to_host(attr[twice]).tolist()):
            error = given_twice(event, schema.attr_names[attribute])
            if errors != "report":          # "null" is about values: a repeated attribute is an error still
                raise error
            rejected.setdefault(event, error)
    if rejected:            # a refused event is encoded with no attributes (its matches are dropped)
        keep = ~xp.isin(rows, xp.asarray(np.fromiter(rejected, np.int64, len(rejected))))
        rows, attr, value, token = rows[keep], attr[keep], value[keep], token[keep]
    offsets = device_maps.run_offsets(xp, rows, n_events)
    merged = EventBatch(offsets, attr.astype(np.int32), value, token.astype(np.int32), all_strings)
    merged.rejected = tuple(rejected[event] for event in sorted(rejected))
    return merged, strings


def _assemble(xp, n_events: int, attr_ids: list[int], values, present, tokens, dictionaries, rejected
              ) -> tuple[EventBatch, EventBatch]:
    """``(batch, strings)`` from ``[attribute, event]`` matrices -- values
    (float64), presence (bool) and string tokens (int32, -1 for none) --
    one row per attribute of ``attr_ids`` in any order: the CSR batch on
    the device, attributes ascending within each event, and the host batch
    of the dictionaries' entries."""
    k = len(attr_ids)
    if k == 0:
        batch = EventBatch(xp.zeros(n_events + 1, dtype=np.int64), xp.zeros(0, dtype=np.int32),
                           xp.zeros(0, dtype=np.float64), xp.zeros(0, dtype=np.int32), pa.array([], pa.large_string()))
    else:
        attr_ids = np.asarray(attr_ids, dtype=np.int32)
        order = np.argsort(attr_ids, kind="stable")
        if np.any(order != np.arange(k)):     # (one gather each: attributes ascending within each event)
            rows = xp.asarray(order)
            values, present, tokens = values[rows], present[rows], tokens[rows]
        attr_ids = xp.asarray(attr_ids[order])
        offsets = xp.zeros(n_events + 1, dtype=np.int64)
        offsets[1:] = xp.cumsum(present.sum(axis=0))
        keep = present.T.ravel()                         # event-major: the CSR order
        batch = EventBatch(offsets, xp.broadcast_to(attr_ids, (n_events, k)).ravel()[keep],
                           values.T.ravel()[keep], tokens.T.ravel()[keep],
                           pa.concat_arrays([s for _, s in dictionaries]) if dictionaries
                           else pa.array([], pa.large_string()))
    batch.rejected = tuple(rejected[r] for r in sorted(rejected))
    # the dictionaries' entries, one host entry each: what the pattern results are computed over
    attrs = np.concatenate([np.full(len(s), a, np.int32) for a, s in dictionaries]) if dictionaries \
        else np.zeros(0, np.int32)
    strings = EventBatch(np.array([0, len(attrs)], np.int64), attrs, np.zeros(len(attrs)),
                         np.arange(len(attrs), dtype=np.int32), batch.strings)
    return batch, strings


def _encode_clean(columns: Mapping, valid: dict, schema, xp) -> tuple[EventBatch, EventBatch] | None:
    """The batch as :func:`encode_device_columns` encodes it, for the
    common case -- numbers, booleans and dictionary-coded strings of the
    attributes' own kinds, no value refused -- with a handful of launches
    for all the columns together and one flag back from the device, instead
    of a few launches and a synchronisation per column (W1's 392 columns,
    10,000 events, on an H200: 8.7 ms against 105 ms).
    The numeric columns are checked a matrix per dtype.  None when the
    batch needs the careful path: a column it cannot place, a value to
    refuse, anything to raise -- which that path then does, in the
    columns' order, as it always has."""
    n_events = None
    groups: dict[np.dtype, list] = {}       # dtype -> [(attribute id, data, present or None)]
    others = []                             # (attribute id, values, present or None, tokens or None)
    dictionaries: list[tuple[int, pa.Array]] = []
    flags = []                              # device booleans: any value to refuse
    n_strings = 0
    try:
        for name, column in columns.items():
            if not isinstance(name, str):
                return None
            pair = isinstance(column, tuple)
            if pair and len(column) != 2:
                return None
            data = _device(column[0] if pair else column, name)
            n_events = len(data) if n_events is None else n_events
            if len(data) != n_events:
                return None
            present = None
            if name in valid:
                present = _device(valid[name], f"valid[{name!r}]")
                if present.dtype != np.bool_ or len(present) != n_events:
                    return None
            if name not in schema.attr_ids:
                continue                # no subscription reads it
            family, kind, attr = schema.families.get(name), data.dtype.kind, schema.attr_ids[name]
            if pair:
                if family not in (Family.STRING, None) or kind not in "iu":
                    return None
                strings, table, unread = _dictionary_codes(name, column[1], schema)
                if unread:
                    return None         # (values to refuse)
                inside = (data >= 0) & (data < len(strings))
                flags.append(~inside if present is None else ~inside & present)
                # (absent events' codes may be anything: read code 0 for them, as for a refused one)
                codes = xp.where(inside if present is None else inside & present, data, 0).astype(np.int64)
                values = xp.asarray(table)[codes] if len(strings) else xp.zeros(n_events)
                others.append((attr, values, present, (codes + n_strings).astype(np.int32)))
                dictionaries.append((attr, strings))
                n_strings += len(strings)
            elif family is None:
                others.append((attr, xp.zeros(n_events), present, None))
            elif family is Family.NUMERIC and kind in "iuf" or family is Family.BOOLEAN and kind == "b":
                groups.setdefault(data.dtype, []).append((attr, data, present))
            else:
                return None
    except (SchemaError, ValueError, TypeError):
        return None
    n_events = n_events or 0
    attr_ids, values, presence, tokens = [], [], [], []
    ones = xp.ones(n_events, dtype=bool)
    for dtype, members in groups.items():
        data = xp.stack([m[1] for m in members])
        present = xp.stack([ones if m[2] is None else m[2] for m in members])
        as_float = data.astype(np.float64)
        if dtype.kind == "f":
            flags.append(~xp.isfinite(as_float) & present)
        elif dtype.kind == "i":     # exact as float64 only within +-2**53 (compared as integers)
            flags.append(((data > MAX_EXACT_INT) | (data < -MAX_EXACT_INT)) & present)
        elif dtype.kind == "u":
            flags.append((data > MAX_EXACT_INT) & present)
        attr_ids += [m[0] for m in members]
        values.append(as_float)
        presence.append(present)
        tokens.append(xp.full((len(members), n_events), -1, dtype=np.int32))
    for attr, column_values, present, column_tokens in others:
        attr_ids.append(attr)
        values.append(column_values[None, :])
        presence.append((ones if present is None else present)[None, :])
        tokens.append(xp.full((1, n_events), -1, dtype=np.int32) if column_tokens is None
                      else column_tokens[None, :])
    if flags and bool(xp.stack([f.any() for f in flags]).any()):      # the one flag back from the device
        return None
    if not attr_ids:
        return _assemble(xp, n_events, [], None, None, None, dictionaries, {})
    stack = xp.concatenate if len(values) > 1 else (lambda parts: parts[0])
    return _assemble(xp, n_events, attr_ids, stack(values), stack(presence), stack(tokens), dictionaries, {})


def arrow_columns(table: pa.Table | pa.RecordBatch) -> tuple[dict, dict]:
    """A host Arrow table's columns on the device, as
    :func:`encode_device_columns` takes them: numbers and booleans as they
    are, strings as dictionary codes plus the dictionary, nulls as
    ``valid``, a map as a :class:`engine.device_maps.DeviceMap` (its keys
    dictionary-coded, and its values if they are strings).  They cross
    together: packed into a pinned staging buffer and moved by one DMA
    (:func:`gpu_kernels.transfer.columns_to_device`).  TypeError for a
    column this form has no place for (a list, a decimal, a map of them):
    the host encoder takes those."""
    import pyarrow.compute as pc

    from gpu_kernels import transfer

    if len(set(table.schema.names)) < table.num_columns:       # (a mapping holds each name once)
        raise TypeError("a table with two columns of one name has no device-column form")
    names, host, dictionaries, maps = [], [], {}, {}
    for name, column in zip(table.schema.names, table.columns):
        if isinstance(column, pa.ChunkedArray):
            column = column.combine_chunks()
        kind = column.type
        if pa.types.is_map(kind):           # sparse events: CSR arrays
            maps[name] = DeviceMap.from_arrow(column)
            continue
        if pa.types.is_dictionary(kind) or pa.types.is_string(kind) or pa.types.is_large_string(kind):
            coded = column if pa.types.is_dictionary(kind) else pc.dictionary_encode(column)
            if not (pa.types.is_string(coded.dictionary.type) or pa.types.is_large_string(coded.dictionary.type)):
                raise TypeError(f"column {name!r}: a dictionary of {coded.dictionary.type}")
            values = pc.fill_null(coded.indices, 0).to_numpy(zero_copy_only=False).astype(np.int32)
            dictionaries[name] = coded.dictionary
        elif pa.types.is_boolean(kind) or pa.types.is_integer(kind) or pa.types.is_floating(kind):
            default = False if pa.types.is_boolean(kind) else 0
            values = pc.fill_null(column, default).to_numpy(zero_copy_only=False)
        elif pa.types.is_null(kind):
            values = np.zeros(len(column))
        else:
            raise TypeError(f"column {name!r} of type {kind} has no device-column form")
        names.append(name)
        host += [values, column.is_valid().to_numpy(zero_copy_only=False)]
    for column in maps.values():
        host += column.arrays()
    device = transfer.columns_to_device(host)
    placed, valid = {}, {}
    for k, name in enumerate(names):
        values = device[2 * k]
        placed[name] = (values, dictionaries[name]) if name in dictionaries else values
        valid[name] = device[2 * k + 1]
    at = 2 * len(names)
    for name, column in maps.items():               # (packed after the columns)
        placed[name] = column.with_arrays(device[at:at + 5])
        at += 5
    # in the table's order: a refusal ranks by its column's position, as the host encoder's does
    return {name: placed[name] for name in table.schema.names}, valid
