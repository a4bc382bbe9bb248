"""Events already on the device (engine/device_events.py): device columns in,
encoded on the device, matched there -- the same answers as the same events
given as dicts, for every output form, with absent values, dictionary-coded
strings, LIKE, a delta matched on the host, and every refusal named.

Runs on a GPU (CuPy arrays) or under numba's CUDA simulator (its device
arrays; NumPy stands in for CuPy)::

    NUMBA_ENABLE_CUDASIM=1 pytest -m cuda tests/test_device_events.py
"""

from __future__ import annotations

import types

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from engine import Index
from engine.device_events import encode_device_columns, is_device_columns
from engine.errors import BadEventError, SchemaError
from tests import strategies
from tests.test_cuda_sim import SIMULATED, _to_device_input, host, needs_cuda
from tests.test_event_input import DLPackOnly

pytestmark = [pytest.mark.cuda, needs_cuda]

SUBSCRIPTIONS = {
    1: "price <= 580 AND color = 'silver'",
    2: "color LIKE 'sil%' OR in_stock = TRUE",
    3: "price BETWEEN 100 AND 600 AND NOT (color IN ('red', 'blue'))",
    4: "price IS NULL",
    5: "weight > 2.5 AND in_stock = FALSE",
    6: "color >= 'b' AND color < 'r' AND price > 0",
}
#: the events as dicts (None: absent)
PRICE = [550.0, None, 700.0, 120.0, -3.0, 600.0]
COLOR = ["silver", "red", None, "blue", "green", "silver"]
IN_STOCK = [True, False, None, False, True, False]
WEIGHT = [3, 1, 2, 7, None, 2 ** 53]


def _events():
    rows = []
    for k in range(len(PRICE)):
        event = {name: values[k] for name, values in
                 (("price", PRICE), ("color", COLOR), ("in_stock", IN_STOCK), ("weight", WEIGHT))
                 if values[k] is not None}
        rows.append(event)
    return rows


def _columns():
    dictionary = ["blue", "green", "red", "silver"]
    codes = np.array([dictionary.index(c) if c is not None else 0 for c in COLOR], np.int32)
    present = lambda values: _to_device_input(np.array([v is not None for v in values]))   # noqa: E731
    columns = {
        "price": _to_device_input(np.array([p if p is not None else np.nan for p in PRICE])),
        "color": (_to_device_input(codes), dictionary),
        "in_stock": _to_device_input(np.array([bool(v) for v in IN_STOCK])),
        "weight": _to_device_input(np.array([w if w is not None else 0 for w in WEIGHT], np.int64)),
        "unknown": _to_device_input(np.arange(len(PRICE), dtype=np.float32)),   # no subscription reads it
    }
    valid = {"price": present(PRICE), "color": present(COLOR), "in_stock": present(IN_STOCK),
             "weight": present(WEIGHT)}
    return columns, valid


def _index(merged: bool = True) -> Index:
    idx = Index(algorithm="opindex", backend="cuda")
    idx.add_many(list(SUBSCRIPTIONS), list(SUBSCRIPTIONS.values()))
    if merged:
        idx.merge()
    return idx


@pytest.mark.parametrize("merged", [True, False], ids=["main", "delta-on-host"])
def test_device_columns_match_as_the_same_events_as_dicts(merged):
    idx = _index(merged)
    columns, valid = _columns()
    assert is_device_columns(columns)
    want = [m.tolist() for m in idx.match_batch(_events())]
    assert [m.tolist() for m in idx.match_batch(columns, valid=valid)] == want
    assert (want[0], want[1], want[3], want[5]) == ([1, 2, 3], [4], [5, 6], [2, 3, 5])   # not a vacuous example
    table = idx.match_batch(columns, valid=valid, output="arrow")
    assert table.column_names == ["event", "sub_id"]
    assert [table["sub_id"].to_numpy()[table["event"].to_numpy() == e].tolist() for e in range(len(PRICE))] == want
    lists = idx.match_batch(columns, valid=valid, output="arrow_lists")
    assert lists["sub_ids"].to_pylist() == want
    events, ids = idx.match_batch(columns, valid=valid, output="device")
    pairs = list(zip(host(events).tolist(), host(ids).tolist()))
    assert pairs == [(e, s) for e, subs in enumerate(want) for s in subs]


@pytest.mark.skipif(SIMULATED, reason="a DLPack producer in CUDA memory needs a GPU: the simulator's device "
                                      "arrays are NumPy's, which export host DLPack")
def test_dlpack_only_producers_match_as_the_interface_does():
    """Columns and valid masks that only speak DLPack (kDLCUDA) are device
    columns, read in place, with the same answers as the dicts'."""
    idx = _index()
    columns, valid = _columns()
    dl_columns = {name: (DLPackOnly(c[0]), c[1]) if isinstance(c, tuple) else DLPackOnly(c)
                  for name, c in columns.items()}
    dl_valid = {name: DLPackOnly(v) for name, v in valid.items()}
    assert not hasattr(dl_columns["price"], "__cuda_array_interface__")
    assert dl_columns["price"].__dlpack_device__()[0] == 2           # kDLCUDA
    assert is_device_columns(dl_columns)
    want = [m.tolist() for m in idx.match_batch(_events())]
    assert [m.tolist() for m in idx.match_batch(dl_columns, valid=dl_valid)] == want
    assert sum(map(len, want)) > 5


def test_the_batch_is_encoded_in_csr_form_attributes_ascending():
    idx = _index()
    columns, valid = _columns()
    batch, strings = encode_device_columns(columns, valid, idx._state.view)
    reference = __import__("engine.events", fromlist=["x"]).encode_events(_events(), idx._state.view)
    assert host(batch.offsets).tolist() == reference.offsets.tolist()
    assert host(batch.attr).tolist() == reference.attr.tolist()
    assert host(batch.value).tolist() == reference.value.tolist()        # string codes as the host encoder's
    tokens = host(batch.token)
    assert [batch.strings[t].as_py() if t >= 0 else None for t in tokens.tolist()] == \
        [reference.strings[t].as_py() if t >= 0 else None for t in reference.token.tolist()]
    assert strings.strings.to_pylist() == ["blue", "green", "red", "silver"]   # the pattern results' domain


def test_without_valid_every_value_is_present_and_errors_null_drops_refused_ones():
    idx = _index()
    price = _to_device_input(np.array([550.0, np.nan, np.inf, 90.0]))
    with pytest.raises(BadEventError,
                       match=r"event 1: attribute 'price' is numeric, got nan: not a finite number") as caught:
        idx.match_batch({"price": price})
    assert caught.value.event == 1 and caught.value.attribute == "price"
    found = idx.match_batch({"price": price}, errors="null")
    assert [m.tolist() for m in found] == [m.tolist() for m in idx.match_batch(
        [{"price": 550.0}, {}, {}, {"price": 90.0}])]
    big = _to_device_input(np.array([1, 2 ** 53 + 1], np.int64))
    with pytest.raises(BadEventError, match=r"event 1: attribute 'weight'.*2\*\*53"):
        idx.match_batch({"weight": big})


def test_errors_report_sets_the_refused_events_aside_as_the_host_encoder_does():
    idx = _index()
    price = np.array([550.0, np.nan, 120.0, np.inf])
    codes = np.array([3, 0, 9, 1], np.int32)         # 9: outside the dictionary
    dictionary = ["blue", "green", "red", "silver"]
    columns = {"color": (_to_device_input(codes), dictionary), "price": _to_device_input(price)}
    found, rejected = idx.match_batch(columns, errors="report")
    assert [(bad.event, bad.attribute) for bad in rejected] == [(1, "price"), (2, "color"), (3, "price")]
    assert "outside its dictionary of 4" in rejected[1].reason and rejected[0].value != rejected[0].value   # NaN
    assert [m.tolist() for m in found] == [[1, 2, 3], [], [], []]   # refused events match nothing, IS NULL included
    host_found, host_rejected = idx.match_batch(
        [{"color": "silver", "price": 550.0}, {"color": "blue", "price": float("nan")}, {"color": 5, "price": 120.0},
         {"color": "green", "price": float("inf")}], errors="report")
    assert [m.tolist() for m in host_found] == [m.tolist() for m in found]
    assert [bad.event for bad in host_rejected] == [bad.event for bad in rejected]
    # a number is refused in the host encoder's words (a quarantine reads the same on any executor)
    assert [str(bad) for bad in host_rejected if bad.attribute == "price"] == \
        [str(bad) for bad in rejected if bad.attribute == "price"]


def test_refusals_are_clear_and_change_nothing():
    idx = _index()
    n = _to_device_input(np.arange(3, dtype=np.float64))
    with pytest.raises(ValueError, match="has 2 values where the others have 3"):
        idx.match_batch({"price": n, "weight": _to_device_input(np.arange(2.0))})
    with pytest.raises(SchemaError, match=r"strings arrive on the device as \(codes, dictionary\)"):
        idx.match_batch({"color": n})
    with pytest.raises(BadEventError, match="event 0: attribute 'in_stock' is boolean, got 0.0"):
        idx.match_batch({"in_stock": n})
    with pytest.raises(BadEventError, match="outside its dictionary of 2"):
        idx.match_batch({"color": (_to_device_input(np.array([0, 2, 1], np.int32)), ["red", "silver"])})
    with pytest.raises(ValueError, match="valid= names"):
        idx.match_batch({"price": n}, valid={"colour": n})
    with pytest.raises(ValueError, match="errors must be 'raise', 'null' or 'report'"):
        idx.match_batch({"price": n}, errors="skip")
    with pytest.raises(SchemaError, match="its dictionary is not a list of strings"):
        idx.match_batch({"color": (_to_device_input(np.array([0, 1, 0], np.int32)), ["red", 5])})
    with pytest.raises(SchemaError, match="its dictionary is not a list of strings: it holds bytes b'a'"):
        idx.match_batch({"color": (_to_device_input(np.array([0, 1, 0], np.int32)), ["red", b"a"])})
    idx.add(99, "7 IN deals")
    with pytest.raises(SchemaError, match="'deals' is a list attribute .list<numeric>., which device columns cannot"):
        idx.match_batch({"deals": n})
    idx.remove(99)
    assert [m.tolist() for m in idx.match_batch({"price": n})] == [[], [], []]   # still usable
    cpu = Index(algorithm="opindex", backend="cpu")
    cpu.add(1, "price > 1")
    with pytest.raises(ValueError, match="device columns need backend='cuda'"):
        cpu.match_batch({"price": n})


def invalid_utf8(strings: list[bytes]) -> pa.Array:
    """An Arrow string array holding ``strings`` as they are -- pyarrow
    validates nothing when an array is made from its buffers."""
    offsets = np.concatenate([[0], np.cumsum([len(b) for b in strings])]).astype(np.int32)
    return pa.Array.from_buffers(pa.string(), len(strings), [None, pa.py_buffer(offsets.tobytes()),
                                                             pa.py_buffer(b"".join(strings))])


def refused_as_on_the_host(columns, view, host_encode, entries) -> list[int]:
    """Asserts that device columns are refused as the host encoder refuses
    the same events (``host_encode(errors)``) in every errors mode: the
    same first error, the same entries (``entries(batch)``), the same
    events set aside -- whose positions it returns."""
    with pytest.raises(BadEventError) as on_host:
        host_encode("raise")
    with pytest.raises(BadEventError) as on_device:
        encode_device_columns(columns, None, view, "raise")
    assert str(on_device.value) == str(on_host.value)
    for errors in ("null", "report"):
        batch, _ = encode_device_columns(columns, None, view, errors)
        expected = host_encode(errors)
        assert entries(batch) == entries(expected), errors
        assert [str(e) for e in getattr(batch, "rejected", ())] == [str(e) for e in getattr(expected, "rejected", ())]
    return [e.event for e in batch.rejected]


@pytest.mark.parametrize("dictionary", [["silver", "a\ud800", "red"],
                                        invalid_utf8([b"silver", b"a\xff", b"red"])], ids=["surrogate", "bad-utf8"])
def test_a_dictionary_entry_the_host_refuses_is_refused_in_the_events_coded_to_it(dictionary):
    """A lone surrogate in a dictionary, or a string that is not valid
    UTF-8, is not an error of the batch: the events whose value is coded to
    it have that value refused, in the host encoder's words, by the errors
    mode -- as the host refuses it in those events.  An entry no event is
    coded to refuses nothing."""
    from engine.events import encode_events, from_arrow
    view = _index()._state.view
    codes = np.array([0, 1, 2, 1, 0], np.int32)
    columns = {"price": _to_device_input(np.array([550.0, 600, 90, 120, 10])),
               "color": (_to_device_input(codes), dictionary)}
    if isinstance(dictionary, list):
        host_events = [{"price": p, "color": dictionary[c]} for p, c in zip([550.0, 600, 90, 120, 10], codes)]
        host_encode = lambda errors: encode_events(host_events, view, errors)          # noqa: E731
    else:
        table = pa.table({"price": [550.0, 600, 90, 120, 10], "color": dictionary.take(pa.array(codes))})
        host_encode = lambda errors: from_arrow(table, view, errors)                 # noqa: E731
    assert refused_as_on_the_host(columns, view, host_encode, _encoded) == [1, 3]
    strings = encode_device_columns(columns, None, view, "null")[1]
    assert "" in strings.strings.to_pylist()        # the entry stands as "" where patterns are read
    unused = {"color": (_to_device_input(np.array([0, 2, 2], np.int32)), dictionary)}
    batch, _ = encode_device_columns(unused, None, view, "raise")
    assert _encoded(batch)[3] == ["silver", "red", "red"]


def test_a_host_array_among_device_columns_is_copied_over_in_any_order():
    """With the host array first, the batch was taken for host columns and refused
    ("match_batch takes a sequence of events"); with it second, it was matched."""
    idx = _index()
    prices, weights = np.array([550.0, 700.0, 120.0, -3.0]), np.array([3, 1, 7, 2 ** 53], np.int64)
    stock = np.array([False, False, True, False])
    want = [[5], [], [2], [5]]      # weight > 2.5 AND in_stock = FALSE; in_stock = TRUE; colour absent
    assert [m.tolist() for m in idx.match_batch(pa.table({"price": prices, "weight": weights,
                                                           "in_stock": stock}))] == want
    price, in_stock = _to_device_input(prices), _to_device_input(stock)
    for columns in ({"price": price, "weight": weights, "in_stock": in_stock},
                    {"weight": weights, "price": price, "in_stock": in_stock},
                    {"weight": weights, "in_stock": stock, "price": price}):
        assert [m.tolist() for m in idx.match_batch(columns)] == want, list(columns)
    with pytest.raises(TypeError, match="takes a sequence of events"):          # host arrays alone: not a batch
        idx.match_batch({"weight": weights, "price": prices})
    # a host Arrow column (DLPack from host memory) is copied over too; one with nulls is refused, unchanged
    assert [m.tolist() for m in idx.match_batch({"price": price, "weight": pa.array(weights),
                                                 "in_stock": in_stock})] == want
    with pytest.raises(ValueError, match="host Arrow column with nulls among device columns"):
        idx.match_batch({"price": price, "weight": pa.array([3, None, 7, 1])})


def test_an_empty_batch_and_columns_no_subscription_reads():
    idx = _index()
    assert idx.match_batch({"price": _to_device_input(np.zeros(0))}) == []
    assert [m.tolist() for m in idx.match_batch({"nobody": _to_device_input(np.zeros(2))})] == [[4], [4]]


class InterfaceColumn:
    """A producer that speaks the CUDA Array Interface (v3) alone, over
    memory it owns, with an optional ``mask`` -- a device array, or a bare
    dict as XGBoost gives one -- as other producers (cuDF's columns, Arrow
    on the GPU) export their nulls.  On a GPU the memory is CuPy's; under
    the simulator it is host memory, which is the simulator's device
    memory."""

    def __init__(self, values, mask=None, mask_typestr: str | None = None, mask_as_dict: bool = False):
        self._values = _backing(np.asarray(values))
        self._mask = None if mask is None else _backing(np.asarray(mask))
        self._mask_typestr, self._mask_as_dict = mask_typestr, mask_as_dict
        self._length = len(values)

    @property
    def __cuda_array_interface__(self):
        interface = _interface(self._values)
        if self._mask is not None:
            mask = _interface(self._mask)
            if self._mask_typestr is not None:      # one bit an event: the shape counts events, not bytes
                mask.update(typestr=self._mask_typestr, shape=(self._length,))
            interface["mask"] = mask if self._mask_as_dict else types.SimpleNamespace(__cuda_array_interface__=mask)
        return interface


def _backing(host_array):
    if SIMULATED:
        return np.ascontiguousarray(host_array)
    import cupy
    return cupy.asarray(host_array)


def _interface(array) -> dict:
    if SIMULATED:
        return {"shape": array.shape, "typestr": array.dtype.str, "data": (array.ctypes.data, False),
                "strides": None, "version": 3}
    return dict(array.__cuda_array_interface__)


def _bits(present) -> np.ndarray:
    """One bit an event, Arrow's order, padded to 64 bytes as cuDF pads its masks."""
    packed = np.packbits(np.asarray(present, bool), bitorder="little")
    return np.concatenate([packed, np.zeros(64 - len(packed), np.uint8)])


MASK_FORMS = {      # name -> InterfaceColumn arguments for the presence flags
    "bits": lambda present: {"mask": _bits(present), "mask_typestr": "<t1"},
    "bits-as-dict": lambda present: {"mask": _bits(present), "mask_typestr": "|t1", "mask_as_dict": True},
    "booleans": lambda present: {"mask": np.asarray(present, bool)},
    "bytes": lambda present: {"mask": np.asarray(present, np.uint8) * np.uint8(7)},
}


def _masked_columns(form: str) -> dict:
    """The module's events as masked interface columns, with what is under
    each mask chosen to be refused were it read: NaN, infinity, 2**60, a
    code outside the dictionary."""
    present = lambda values: [v is not None for v in values]        # noqa: E731
    dictionary = ["blue", "green", "red", "silver"]
    return {
        "price": InterfaceColumn([np.nan if p is None else p for p in PRICE], **MASK_FORMS[form](present(PRICE))),
        "color": (InterfaceColumn(np.array([99 if c is None else dictionary.index(c) for c in COLOR], np.int32),
                                  **MASK_FORMS[form](present(COLOR))), dictionary),
        "in_stock": InterfaceColumn([bool(v) for v in IN_STOCK], **MASK_FORMS[form](present(IN_STOCK))),
        "weight": InterfaceColumn(np.array([2 ** 60 if w is None else w for w in WEIGHT], np.int64),
                                  **MASK_FORMS[form](present(WEIGHT))),
    }


def _encoded(batch) -> tuple:
    """A batch's entries as host lists, string tokens as their strings."""
    tokens = host(batch.token).tolist()
    return (host(batch.offsets).tolist(), host(batch.attr).tolist(), host(batch.value).tolist(),
            [batch.strings[t].as_py() if t >= 0 else None for t in tokens])


@pytest.mark.parametrize("form", list(MASK_FORMS))
def test_an_interface_mask_marks_the_absent_values(form):
    """A column whose interface carries a mask -- a bit an event as cuDF
    exports it, or a boolean or byte an event -- is encoded as the same
    events as dicts, in every errors mode: an event is absent where the
    mask is not set, whatever lies beneath (here values that would be
    refused).  ``valid=`` still applies on top of the mask."""
    from engine.events import encode_events
    view = _index()._state.view
    columns = _masked_columns(form)
    assert is_device_columns(columns)
    want = _encoded(encode_events(_events(), view))
    for errors in ("raise", "null", "report"):
        batch, _ = encode_device_columns(columns, None, view, errors)
        assert _encoded(batch) == want, errors
        assert list(getattr(batch, "rejected", ())) == []
    events = _events()
    del events[0]["price"]
    fewer = {"price": _to_device_input(np.array([False, True, True, True, True, True]))}
    assert _encoded(encode_device_columns(columns, fewer, view)[0]) == _encoded(encode_events(events, view))


def test_masked_interface_columns_match_as_the_same_events_as_dicts():
    idx = _index()
    columns = _masked_columns("bits")
    want = [m.tolist() for m in idx.match_batch(_events())]
    assert (want[0], want[1], want[3], want[5]) == ([1, 2, 3], [4], [5, 6], [2, 3, 5])   # not a vacuous example
    assert idx.match_batch(columns, output="arrow_lists")["sub_ids"].to_pylist() == want


def test_interface_columns_without_a_mask_are_read_in_place():
    """The interface alone (no NumPy array, no DLPack) is a device column."""
    from engine.events import encode_events
    view = _index()._state.view
    columns, valid = _columns()
    plain = {"price": InterfaceColumn([0.0 if p is None else p for p in PRICE]), "color": columns["color"],
             "in_stock": InterfaceColumn([bool(v) for v in IN_STOCK]),
             "weight": InterfaceColumn(np.array([0 if w is None else w for w in WEIGHT], np.int64))}
    assert is_device_columns({"price": plain["price"]})
    assert _encoded(encode_device_columns(plain, valid, view)[0]) == _encoded(encode_events(_events(), view))


def test_a_bit_mask_reads_every_bit_of_a_long_column():
    """Events beyond the first byte and a length that is not a multiple of
    eight: bit ``i % 8`` of byte ``i // 8`` is event ``i``'s."""
    idx = Index(algorithm="opindex", backend="cuda")
    idx.add(1, "price > 10")
    idx.add(2, "price IS NULL")
    idx.merge()
    rng = np.random.default_rng(3)
    present = rng.random(77) < 0.6
    price = rng.uniform(0, 20, 77)
    column = InterfaceColumn(np.where(present, price, np.nan), mask=_bits(present), mask_typestr="<t1")
    got = [m.tolist() for m in idx.match_batch({"price": column})]
    assert got == [([1] if p > 10 else []) if ok else [2] for p, ok in zip(price, present)]
    assert 10 < sum(not ok for ok in present) < 67


def test_a_mask_that_cannot_be_read_is_refused_and_changes_nothing():
    idx = _index()
    refusals = [({"mask": np.ones(5, bool)}, r"one entry per event \(shape \(6,\)\)"),
                ({"mask": np.ones(6, np.float32)}, "neither one bit"),
                ({"mask": _bits([True] * 6), "mask_typestr": "<t2"}, "neither one bit")]
    for mask, message in refusals:
        with pytest.raises(ValueError, match=message):
            idx.match_batch({"price": InterfaceColumn([1.0] * 6, **mask)})
    interface = InterfaceColumn([1.0] * 6, mask=np.ones(6, bool)).__cuda_array_interface__
    interface["mask"] = object()
    with pytest.raises(ValueError, match="exposes no CUDA Array Interface"):
        idx.match_batch({"price": types.SimpleNamespace(__cuda_array_interface__=interface)})
    with pytest.raises(ValueError, match=r"valid\['price'\] carries a CUDA Array Interface mask"):
        idx.match_batch({"price": InterfaceColumn([1.0] * 6)},
                        valid={"price": InterfaceColumn(np.ones(6, bool), mask=np.ones(6, bool))})
    # valid= beside a mask is checked as without one: a short one was broadcast to every event
    for short in (np.array([False]), np.ones(5, bool), np.ones(6, np.uint8)):
        with pytest.raises(ValueError, match=r"valid\['price'\] must be a boolean column of 6 values"):
            idx.match_batch({"price": InterfaceColumn([1.0] * 6, mask=np.ones(6, bool))},
                            valid={"price": _to_device_input(short)})
    assert [m.tolist() for m in idx.match_batch(_events())][3] == [5, 6]


def test_match_stream_says_device_columns_go_to_match_batch():
    """match_stream has no device route: it took device columns for host
    ones, and told the caller to make a host table of them."""
    from engine.device_events import arrow_columns
    from engine.device_maps import DeviceMap

    idx = _index()
    table = pa.table({"price": PRICE, "color": COLOR})
    columns, valid = arrow_columns(table)
    maps = DeviceMap.from_arrow(pa.array([[("price", 1.0)]] * 6, pa.map_(pa.string(), pa.float64())))
    for events in (columns, {"price": InterfaceColumn([1.0] * 6, mask=np.ones(6, bool))}, maps):
        with pytest.raises(TypeError, match="match_stream takes events on the host; events on the device go to "
                                            "match_batch"):
            idx.match_stream(events)
    assert [m.tolist() for m in idx.match_batch(columns, valid=valid)] == [m.tolist() for m in idx.match_batch(table)]


def test_the_gpu_benchmarks_device_columns_are_the_tables_events():
    from engine.bench.gpu import device_columns

    idx = _index()
    table = pa.table({"price": PRICE, "color": COLOR, "in_stock": IN_STOCK, "weight": WEIGHT})
    columns, valid = device_columns(table)
    assert [m.tolist() for m in idx.match_batch(columns, valid=valid)] == [m.tolist() for m in idx.match_batch(table)]


@pytest.mark.parametrize("output", ["pairs", "grouped"])
def test_a_spark_worker_on_a_gpu_executor_matches_through_device_columns(output, monkeypatch):
    # the mapInArrow function's batch step, on an index on cuda, against the same step on cpu
    from engine import device_events
    from spark_integration.matching import _BatchMatcher

    worker = _BatchMatcher.__new__(_BatchMatcher)
    worker.event_id, worker.layout, worker.attrs_column, worker.output = "event_id", "wide", "attrs", output
    worker.on_bad_event, worker.report_bad = "quarantine", True
    batch = pa.RecordBatch.from_pydict({
        "event_id": ["e0", "e1", "e2", "e3", "e4", "e5"], "price": PRICE,
        "color": pa.array(COLOR).dictionary_encode(), "in_stock": IN_STOCK, "weight": WEIGHT})
    cpu = Index(algorithm="opindex", backend="cpu")
    cpu.add_many(list(SUBSCRIPTIONS), list(SUBSCRIPTIONS.values()))
    encoded = []
    real = device_events.encode_device_columns
    monkeypatch.setattr(device_events, "encode_device_columns",
                        lambda *a, **k: encoded.append(1) or real(*a, **k))
    assert worker.match(_index(), batch).to_pylist() == worker.match(cpu, batch).to_pylist()
    assert encoded             # the device route was taken
    # a string column for a numeric attribute: the host encoder names each event (quarantined here)
    bad = pa.RecordBatch.from_pydict({"event_id": ["a", "b"], "price": ["cheap", "dear"]})
    assert worker.match(_index(), bad).to_pylist() == worker.match(cpu, bad).to_pylist()


def test_an_attribute_of_no_family_takes_any_device_value():
    """An attribute only IS [NOT] NULL reads takes any value, and only its
    presence counts (as on the host): a device column for it was checked as
    numbers, so NaN or 2**60 was refused (the event set aside, or its value
    taken as absent: ``u IS NULL`` matched) and a complex column was a
    SchemaError."""
    index = Index(algorithm="scan", backend="cuda")
    index.add_many([1, 2], ["u IS NULL", "u IS NOT NULL"])
    for column in (np.array([np.nan, 1.0]), np.array([2 ** 60, 3], np.int64), np.array([1j, 2j]),
                   np.array([True, False])):
        for errors in ("raise", "null", "report"):
            got = index.match_batch({"u": _to_device_input(column)}, errors=errors)
            found, rejected = got if errors == "report" else (got, [])
            assert [m.tolist() for m in found] == [[2], [2]] and not rejected, (column, errors)


def test_a_dictionary_of_no_strings_is_refused_not_cast():
    """A pyarrow dictionary of numbers, booleans or bytes was cast to strings:
    codes into ``pa.array([1])`` matched ``s = '1'`` (a dict event with 1 is
    refused).  A chunked dictionary of strings is read."""
    index = Index(algorithm="scan", backend="cuda")
    index.add_many([1, 2], ["s = '1'", "s = 'b'"])
    codes = _to_device_input(np.array([0, 1], np.int32))
    for dictionary in (pa.array([1, 2]), pa.array([True, False]), pa.array([b"1", b"2"])):
        with pytest.raises(SchemaError, match="its dictionary is not a list of strings"):
            index.match_batch({"s": (codes, dictionary)})
    chunked = pa.chunked_array([pa.array(["1"]), pa.array(["b"])])
    assert [m.tolist() for m in index.match_batch({"s": (codes, chunked)})] == [[1], [2]]
    assert [m.tolist() for m in index.match_batch({"s": (codes, pa.array(["1", "b"]).dictionary_encode())})] \
        == [[1], [2]]


def test_a_column_of_the_wrong_kind_is_refused_value_by_value_as_on_the_host():
    """Numbers for a boolean attribute, booleans or complex numbers for a
    numeric one: each present value is refused as the host encoder refuses
    it -- raised for the first, absent with errors='null', the event set
    aside with errors='report', in the host's words -- not the whole batch
    refused whatever ``errors`` said (a SchemaError before)."""
    idx = Index(algorithm="scan", backend="cuda")
    idx.add_many([1, 2, 3], ["flag = TRUE OR n > 1", "n IS NULL", "flag IS NULL AND m < 0"])
    cases = [("flag", np.array([1.0, 0.0, 1.0]), [True, False, True]),
             ("n", np.array([True, False, True]), [True, False, True]),
             ("n", np.array([1j, 2j, 3j]), [True, False, True])]
    for name, values, valid in cases:
        m = np.array([-1.0, 5.0, -2.0])
        columns = {name: _to_device_input(values), "m": _to_device_input(m)}
        host_events = [{**({name: values[k].item()} if valid[k] else {}), "m": m[k].item()} for k in range(3)]
        given = {name: _to_device_input(np.array(valid))}
        with pytest.raises(BadEventError) as on_device:
            idx.match_batch(columns, valid=given)
        with pytest.raises(BadEventError) as on_host:
            idx.match_batch(host_events)
        assert str(on_device.value) == str(on_host.value) and on_device.value.event == 0
        found = idx.match_batch(columns, valid=given, errors="null")
        assert [ids.tolist() for ids in found] == [ids.tolist() for ids in idx.match_batch(host_events, errors="null")]
        found, rejected = idx.match_batch(columns, valid=given, errors="report")
        host_found, host_rejected = idx.match_batch(host_events, errors="report")
        assert [ids.tolist() for ids in found] == [ids.tolist() for ids in host_found]
        assert [str(bad) for bad in rejected] == [str(bad) for bad in host_rejected]
        assert [bad.event for bad in rejected] == [0, 2]


def _batch_arrays(encoded):
    batch, strings = encoded
    return ([host(getattr(batch, f)).tolist() for f in ("offsets", "attr", "value", "token")],
            batch.strings.to_pylist(), batch.rejected, [np.asarray(getattr(strings, f)).tolist()
                                                        for f in ("offsets", "attr", "value", "token")])


@pytest.mark.parametrize("with_valid", [True, False], ids=["valid", "no-valid"])
def test_a_clean_batch_is_encoded_all_columns_at_once_as_one_column_at_a_time(monkeypatch, with_valid):
    """The clean batch's path (a matrix per dtype, one flag back from the
    device) gives the same batch, entry for entry, as the careful one (a
    column at a time), which it hands a batch with anything to refuse: the
    numbers of several dtypes (uint and float32 among them), a boolean, two
    dictionary-coded strings, an attribute only IS NULL reads, one no
    subscription reads, columns given out of the attributes' order."""
    from engine import device_events

    idx = Index(algorithm="opindex", backend="cuda")
    idx.add_many([1, 2, 3], ["a > 1 AND s = 'x' AND u < 5", "f >= 0.5 OR b = TRUE OR t LIKE 'q%'", "z IS NULL"])
    view = idx._state.view
    n = 5
    rng = np.random.default_rng(3)
    columns = {
        "t": (_to_device_input(np.array([0, 1, 1, 0, 2], np.int32)), ["q1", "r", "qq"]),
        "f": _to_device_input(np.array([0.25, 0.5, 1.5, -2.0, 0.5], np.float32)),
        "nobody": _to_device_input(np.arange(n, dtype=np.int64)),
        "a": _to_device_input(np.array([0, 2, 3, -(2 ** 53), 2 ** 53], np.int64)),
        "u": _to_device_input(np.array([1, 7, 4, 0, 9], np.uint16)),
        "b": _to_device_input(np.array([True, False, True, True, False])),
        "s": (_to_device_input(np.array([1, 0, 1, 1, 0], np.int64)), ["y", "x"]),
        "z": _to_device_input(np.zeros(n)),
    }
    valid = {name: _to_device_input(rng.random(n) < 0.7) for name in columns} if with_valid else {}
    clean = encode_device_columns(columns, valid, view)
    assert device_events._encode_clean(columns, valid, view, device_events.cuda_support.array_module()) is not None
    monkeypatch.setattr(device_events, "_encode_clean", lambda *args: None)
    careful = encode_device_columns(columns, valid, view)
    assert _batch_arrays(clean) == _batch_arrays(careful)
    assert len(_batch_arrays(clean)[0][1]) >= (10 if with_valid else 35)      # entries, not an empty batch


def test_a_batch_with_a_value_to_refuse_takes_the_careful_path():
    from engine import device_events

    idx = _index()
    xp = device_events.cuda_support.array_module()
    for bad in ({"price": _to_device_input(np.array([1.0, np.inf]))},
                {"weight": _to_device_input(np.array([1, 2 ** 53 + 1], np.int64))},
                {"color": (_to_device_input(np.array([0, 4], np.int32)), ["a", "b"])},
                {"price": _to_device_input(np.array([True, False]))}):
        assert device_events._encode_clean(bad, {}, idx._state.view, xp) is None
        with pytest.raises(BadEventError):
            encode_device_columns(bad, {}, idx._state.view)
    # the same values where they are absent are not refused: the clean path takes them
    present = {"price": _to_device_input(np.array([True, False]))}
    assert device_events._encode_clean({"price": _to_device_input(np.array([1.0, np.inf]))}, present,
                                       idx._state.view, xp) is not None


class _CudfLikeSeries:
    """The part of cuDF's ``Series`` that the DataFrame route reads, holding
    its values on the device as cuDF does: ``values`` (a device array; it
    raises for strings, categoricals and nulls, as cuDF's does), ``dtype``,
    ``null_count``, ``notna``, ``fillna``, ``astype("category")`` and
    ``cat.codes`` / ``cat.categories``, and the CUDA Array Interface (which
    raises where ``values`` does)."""

    def __init__(self, data: np.ndarray, valid: np.ndarray | None = None, categories=None):
        self._data, self._valid, self._categories = data, valid, categories

    @property
    def dtype(self):
        return "category" if self._categories is not None else self._data.dtype

    @property
    def null_count(self) -> int:
        return 0 if self._valid is None else int((~self._valid).sum())

    @property
    def values(self):
        if self._categories is not None or self._data.dtype == object:
            raise NotImplementedError("no array of strings or categories")
        if self.null_count:
            raise ValueError("column has nulls")
        return _to_device_input(self._data)

    @property
    def __cuda_array_interface__(self):
        return self.values.__cuda_array_interface__

    def notna(self) -> _CudfLikeSeries:
        return _CudfLikeSeries(np.ones(len(self._data), bool) if self._valid is None else self._valid.copy())

    def fillna(self, value) -> _CudfLikeSeries:
        return _CudfLikeSeries(np.where(self._valid, self._data, value).astype(self._data.dtype),
                               categories=self._categories)

    def astype(self, kind) -> _CudfLikeSeries:
        if self._categories is not None:        # a categorical decoded to its categories' type
            return _CudfLikeSeries(np.asarray(self._categories.to_pylist(), kind)[self._data], self._valid)
        assert kind == "category" and self._data.dtype == object
        categories = sorted({v for v, ok in zip(self._data, self._valid) if ok})
        codes = np.array([categories.index(v) if ok else -1 for v, ok in zip(self._data, self._valid)], np.int32)
        return _CudfLikeSeries(codes, self._valid, pa.array(categories))

    @property
    def cat(self):
        series = self

        class Accessor:
            codes = _CudfLikeSeries(series._data, series._valid)
            categories = series._categories
        return Accessor


class DataFrame:
    """A frame of device columns, as cuDF's ``DataFrame`` offers them
    (``columns``, ``frame[name]``): the protocol route reads nothing else."""

    def __init__(self, **columns):
        self._columns = columns

    @property
    def columns(self):
        return list(self._columns)

    def __getitem__(self, name):
        return self._columns[name]


def _frame() -> DataFrame:
    present = lambda values: np.array([v is not None for v in values])   # noqa: E731
    categories = ["blue", "green", "red", "silver"]
    return DataFrame(
        price=_CudfLikeSeries(np.array([p if p is not None else 0.0 for p in PRICE]), present(PRICE)),
        color=_CudfLikeSeries(np.array(COLOR, dtype=object), present(COLOR)),            # strings: made categorical
        in_stock=_CudfLikeSeries(np.array([bool(v) for v in IN_STOCK]), present(IN_STOCK)),
        weight=_CudfLikeSeries(np.array([w if w is not None else 0 for w in WEIGHT], np.int64), present(WEIGHT)),
        shade=_CudfLikeSeries(np.array([3, 0, 2, 2, 1, 3], np.int8), None, pa.array(categories)))     # categorical


def test_a_cudf_like_dataframe_is_read_through_the_protocol():
    """A DataFrame of device columns (cuDF's, by duck typing: cuDF is not
    imported) matches as the same events as dicts: nulls absent, a string
    column dictionary-encoded on the device, a categorical column as its
    codes and categories."""
    import pandas as pd

    from engine import device_events

    idx = _index()
    idx.add(7, "shade = 'silver' AND price > 500")
    frame = _frame()
    assert device_events.is_device_frame(frame) and not device_events.is_device_frame(pd.DataFrame({"x": [1]}))
    events = _events()
    for event, shade in zip(events, ["silver", "blue", "red", "red", "green", "silver"]):
        event["shade"] = shade
    want = [m.tolist() for m in idx.match_batch(events)]
    assert [m.tolist() for m in idx.match_batch(frame)] == want
    assert [7 in m for m in want] == [True, False, False, False, False, True]
    with pytest.raises(ValueError, match="a DataFrame's nulls are its absent values"):
        idx.match_batch(frame, valid={})
    # a categorical of numbers is its values, decoded on the device (a dictionary of numbers is no string column)
    numbers = DataFrame(price=_CudfLikeSeries(np.array([1, 0, 1], np.int8), np.array([True, True, False]),
                                              pa.array([90.0, 560.0])))
    assert [m.tolist() for m in idx.match_batch(numbers)] == \
        [m.tolist() for m in idx.match_batch([{"price": 560.0}, {"price": 90.0}, {}])]
    with pytest.raises(TypeError, match="column 'tags' of dtype complex128 has no device-column form"):
        device_events.frame_columns(DataFrame(tags=_CudfLikeSeries(np.zeros(6, np.complex128))))
    cpu = Index(algorithm="scan", backend="cpu")
    cpu.add(1, "price > 0")
    with pytest.raises(ValueError, match="device columns need backend='cuda'"):
        cpu.match_batch(_frame())


def test_cudf_like_series_among_the_columns_bring_their_nulls():
    """A cuDF ``Series`` in the mapping of columns is read as a frame's
    column is: its nulls are absent values (its interface's ``mask`` is a
    bitmask; the Series' own ``notna`` says where the values are), ANDed
    with ``valid=`` where that names it too; strings become categorical."""
    from engine import device_events

    idx = _index()
    frame = _frame()
    columns = {name: frame[name] for name in ("price", "color", "in_stock")}
    columns["weight"] = _to_device_input(np.array([w if w is not None else 0 for w in WEIGHT], np.int64))
    assert all(device_events.is_device_series(frame[name]) for name in ("price", "color", "shade"))
    assert not device_events.is_device_series(columns["weight"])
    weight_present = _to_device_input(np.array([w is not None for w in WEIGHT]))
    got = idx.match_batch(columns, valid={"weight": weight_present})
    assert [m.tolist() for m in got] == [m.tolist() for m in idx.match_batch(_events())]
    # valid= for a Series is ANDed with its nulls: price absent in event 0 as well
    only = np.ones(len(PRICE), bool)
    only[0] = False
    events = _events()
    del events[0]["price"]
    got = idx.match_batch(columns, valid={"weight": weight_present, "price": _to_device_input(only)})
    assert [m.tolist() for m in got] == [m.tolist() for m in idx.match_batch(events)]


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(events=st.lists(strategies.events(), max_size=24),
       asts=st.lists(strategies.expressions(max_leaves=6), min_size=1, max_size=6),
       form=st.sampled_from(list(MASK_FORMS)), data=st.data())
def test_random_events_as_device_columns_encode_and_match_as_on_the_host(events, asts, form, data):
    """Random events over the conformance schema -- values on and beside
    the literals, URLs, UUIDs, non-ASCII, NUL, absent attributes, now and
    then a string that is not valid UTF-8 -- as the wide table a GPU
    pipeline holds, put on the device by ``arrow_columns`` (strings
    dictionary-coded, nulls as ``valid``): the device batch equals the
    host's entry for entry, strings as strings, refusals alike in every
    errors mode, and ``scan`` on cuda matches them as the host table.  So
    does the batch with each column's nulls as its interface's ``mask`` (in
    one of its forms) instead."""
    from engine.device_events import arrow_columns
    from engine.events import encode_events

    idx = Index(algorithm="scan", backend="cuda", schema=strategies.SCHEMA)
    idx.add_many(list(range(len(asts))), asts)
    view = idx._state.view
    kinds = {**{a: pa.float64() for a in strategies.NUMERIC_ATTRS}, **{a: pa.string() for a in strategies.STRING_ATTRS},
             **{a: pa.bool_() for a in strategies.BOOLEAN_ATTRS}}
    table = pa.table({a: pa.array([event.get(a) for event in events], kind) for a, kind in kinds.items()})
    if data.draw(st.integers(0, 3)) == 0:
        name = data.draw(st.sampled_from(strategies.STRING_ATTRS))
        table = table.set_column(table.schema.get_field_index(name), name,
                                 strategies.not_utf8_at(table[name].combine_chunks(), data.draw))
    columns, valid = arrow_columns(table)
    for errors in ("raise", "null", "report"):
        try:
            expected = encode_events(table, view, errors)
        except BadEventError as error:
            with pytest.raises(BadEventError) as caught:
                encode_device_columns(columns, valid, view, errors)
            assert str(caught.value) == str(error)
            continue
        batch, _ = encode_device_columns(columns, valid, view, errors)
        assert _encoded(batch) == _encoded(expected), errors
        assert [str(e) for e in getattr(batch, "rejected", ())] == [str(e) for e in getattr(expected, "rejected", ())]
    masked = {}
    for name, column in columns.items():
        values = host(column[0] if isinstance(column, tuple) else column)
        present = host(valid[name]) if name in valid else np.ones(len(values), bool)
        as_interface = InterfaceColumn(values, **MASK_FORMS[form](present))
        masked[name] = (as_interface, column[1]) if isinstance(column, tuple) else as_interface
    assert _encoded(encode_device_columns(masked, None, view, "null")[0]) == \
        _encoded(encode_device_columns(columns, valid, view, "null")[0])
    got, rejected = idx.match_batch(columns, valid=valid, errors="report")
    want, want_rejected = idx.match_batch(table, errors="report")
    assert [m.tolist() for m in got] == [m.tolist() for m in want]
    assert [str(e) for e in rejected] == [str(e) for e in want_rejected]
