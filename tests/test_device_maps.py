"""Sparse events on the device (engine/device_maps.py): a map column's CSR
arrays on the device, encoded there entry for entry as the host encoder
encodes the same map column -- unknown keys, null maps and values, keys
repeated in one map, values on the predicates' bounds, refused values under
every errors mode -- and matched with the same answers.

Runs on a GPU (CuPy) or under numba's CUDA simulator::

    NUMBA_ENABLE_CUDASIM=1 pytest -m cuda tests/test_device_maps.py
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from engine import Index, workloads
from engine.device_events import arrow_columns, encode_device_columns, is_device_columns
from engine.device_maps import DeviceMap
from engine.errors import BadEventError, SchemaError
from engine.events import encode_events
from tests import strategies
from tests.test_cuda_sim import _to_device_input, host, needs_cuda

pytestmark = [pytest.mark.cuda, needs_cuda]

#: attribute names as sparse real-world events carry them: long shared prefixes, non-ASCII
PREFIX = "https://example.com/catalogue/feature/"
NAMES = [f"{PREFIX}{k:03d}" for k in range(12)] + [f"{PREFIX}é{k}" for k in range(4)] + ["flag", "only_null"]


def _index(algorithm: str = "opindex", backend: str = "cuda") -> Index:
    idx = Index(algorithm=algorithm, backend=backend)
    expressions = [f'"{name}" BETWEEN {k} AND {k + 3}' for k, name in enumerate(NAMES[:16])]
    expressions += [f'"{NAMES[0]}" = 2 AND "{NAMES[1]}" > 1 OR "{NAMES[13]}" < 2',
                    '"flag" = TRUE', '"only_null" IS NULL', f'"{NAMES[3]}" IS NOT NULL AND NOT "flag" = TRUE',
                    '"word" = \'x\'',       # a string attribute: a number in a map is refused for it
                    '"word" LIKE \'ab%\' OR "word" > \'b\'', '"label" = \'x\' AND "word" = \'x\'']
    idx.add_many(list(range(1, len(expressions) + 1)), expressions)
    return idx


def _map_table(rng, n_events: int, value_type=pa.int64()) -> pa.Table:
    """Sparse events: a few dozen keys of a larger name space (unknown ones
    too), a key repeated in a map, null maps and null values, values on and
    around the predicates' bounds; strings long, sharing long prefixes,
    non-ASCII, with a NUL."""
    keys = NAMES[:16] + ["only_null", f"{PREFIX}unread", "not/an/attribute", "ü" * 40]
    if pa.types.is_string(value_type):      # mostly the string attributes' keys, a few numeric ones refusing
        keys = ["word", "label"] * 20 + keys[:3] + keys[-4:]
    rows = []
    for _ in range(n_events):
        if rng.random() < 0.08:
            rows.append(None)
            continue
        size = int(rng.integers(0, 9))
        entry = []
        for key in rng.choice(keys, size=size):
            low = 0 if pa.types.is_unsigned_integer(value_type) else -1
            value = None if rng.random() < 0.1 else int(rng.integers(low, 20))
            if value is not None and pa.types.is_string(value_type):       # long shared prefixes, non-ASCII, NUL
                value = ["x", "ab", "abc\x00", "b", "abé" * 30, "x" * 300 + str(value)][value % 6]
            entry.append((str(key), value))
        rows.append(entry)
    return pa.table({"attributes": pa.array(rows, pa.map_(pa.string(), value_type))})


def _arrays(batch):
    """The batch's entries; a string entry's token as its string (the device
    batch's strings are its dictionaries', the host's the distinct ones)."""
    return [host(batch.offsets).tolist(), host(batch.attr).tolist(), host(batch.value).tolist(),
            [batch.strings[t].as_py() if t >= 0 else -1 for t in host(batch.token).tolist()]]


@pytest.mark.parametrize("value_type", [pa.int64(), pa.float32(), pa.uint8(), pa.string()])
def test_a_map_encodes_on_the_device_entry_for_entry_as_on_the_host(value_type):
    idx = _index()
    view = idx._state.view
    table = _map_table(np.random.default_rng(5), 3000, value_type)
    columns, valid = arrow_columns(table)
    assert isinstance(columns["attributes"], DeviceMap) and is_device_columns(columns)
    batch, strings = encode_device_columns(columns, valid, view, "report")
    expected = encode_events(table, view, "report")
    assert _arrays(batch) == _arrays(expected)
    assert [str(e) for e in batch.rejected] == [str(e) for e in expected.rejected]
    if value_type == pa.string():       # strings for the numeric attributes are refused; word's and label's read
        assert len(batch.rejected) > 200 and sum(t >= 0 for t in host(batch.token).tolist()) > 2500
        assert {(a, batch.strings[t].as_py()) for a, t in zip(strings.attr.tolist(), strings.token.tolist())} == \
            {(a, batch.strings[t].as_py()) for a, t in zip(host(batch.attr).tolist(), host(batch.token).tolist())
             if t >= 0}         # the pattern results are computed for exactly the pairs the entries hold
    else:
        assert len(host(batch.attr)) > 5000 and len(strings.attr) == 0 and not batch.rejected
    head = table.slice(0, 150)          # (matched under the simulator: a short batch)
    columns, valid = arrow_columns(head)
    got, rejected = idx.match_batch(columns, valid=valid, errors="report")
    want, want_rejected = idx.match_batch(head, errors="report")
    assert [m.tolist() for m in got] == [m.tolist() for m in want]
    assert [str(e) for e in rejected] == [str(e) for e in want_rejected]
    # a batch of no events, and a slice of a map column (its offsets past 0) as arrow_columns takes it
    empty = encode_device_columns(arrow_columns(table.slice(0, 0))[0], {}, view)[0]
    assert _arrays(empty) == [[0], [], [], []]
    tail = table.slice(2990)
    assert _arrays(encode_device_columns(*arrow_columns(tail), view, "report")[0]) == \
        _arrays(encode_events(tail, view, "report"))


def test_a_hand_built_map_with_int32_offsets_that_start_past_zero():
    """The arrays as a GPU pipeline holds a slice of a map column: offsets
    that do not start at 0, keys as codes into a name dictionary with
    names no subscription reads and a name twice, a key repeated in a map
    (the last counts), a null map and a null value."""
    idx = _index()
    names = ["junk", NAMES[0], NAMES[1], "flag", NAMES[0], NAMES[13]]
    #                 event 0            event 1        event 2 (null)  event 3
    keys = np.array([9, 1, 2, 1, 0,      3, 5,          2,              4, 2, 1], np.int16)
    values = np.array([7, 5, 2, 2, 1,    1, 1,          3,              0, 2, 9], np.int64)
    offsets = np.array([1, 5, 7, 8, 11], np.int32)        # entry 0 belongs to no event
    value_valid = np.ones(11, bool)
    value_valid[10] = False                                # event 3's last NAMES[0] is null: absent, its 0 before
    #                                                        does not stand (the last entry counts, null or not)
    mapped = DeviceMap(*(_to_device_input(a) for a in (offsets, keys, values)), names,
                       valid=_to_device_input(np.array([True, True, False, True])),
                       value_valid=_to_device_input(value_valid))
    # event 1's flag is the number 1: refused, as a host map column refuses it for a boolean attribute
    with pytest.raises(BadEventError, match="^event 1: attribute 'flag' is boolean, got 1"):
        idx.match_batch(mapped)
    events = [{NAMES[0]: 2, NAMES[1]: 2}, {NAMES[13]: 1}, {}, {NAMES[1]: 2}]
    expected = [m.tolist() for m in idx.match_batch(events)]
    assert expected[0] and expected[1] and expected[3]
    assert [m.tolist() for m in idx.match_batch(mapped, errors="null")] == expected
    found, rejected = idx.match_batch(mapped, errors="report")
    assert [m.tolist() for m in found] == [expected[0], [], expected[2], expected[3]]
    assert [(e.event, e.attribute) for e in rejected] == [(1, "flag")]
    flags = DeviceMap(_to_device_input(np.array([0, 1], np.int64)), _to_device_input(np.array([0], np.int8)),
                      _to_device_input(np.array([True])), ["flag"])
    assert [m.tolist() for m in idx.match_batch(flags)] == [m.tolist() for m in idx.match_batch([{"flag": True}])]


@pytest.mark.parametrize("errors", ["raise", "null", "report"])
def test_refused_values_act_as_the_host_encoder_acts(errors):
    idx = _index()
    view = idx._state.view
    rows = [[(NAMES[0], 1.0), (NAMES[1], float("nan"))], [("word", 4.0)], [(NAMES[2], 3.0)],
            [(NAMES[2], float("inf")), (NAMES[2], 2.0)],            # the refused value is repeated over
            [(NAMES[5], -float("inf")), ("only_null", float("nan"))]]   # IS NULL alone reads any value
    table = pa.table({"m": pa.array(rows, pa.map_(pa.string(), pa.float64()))})
    columns, valid = arrow_columns(table)
    if errors == "raise":
        with pytest.raises(BadEventError) as on_host:
            encode_events(table, view, errors)
        with pytest.raises(BadEventError) as on_device:
            encode_device_columns(columns, valid, view, errors)
        assert str(on_device.value) == str(on_host.value)
        assert on_device.value.event == 0 and on_device.value.attribute == NAMES[1]
        return
    expected = encode_events(table, view, errors)
    batch, _ = encode_device_columns(columns, valid, view, errors)
    assert _arrays(batch) == _arrays(expected)
    assert [(e.event, e.attribute, str(e)) for e in batch.rejected] == \
        [(e.event, e.attribute, str(e)) for e in expected.rejected]
    assert len(batch.rejected) == (3 if errors == "report" else 0)
    result = idx.match_batch(columns, valid=valid, errors=errors)
    assert [m.tolist() for m in (result[0] if errors == "report" else result)] == \
        [m.tolist() for m in (idx.match_batch(table, errors=errors)[0] if errors == "report"
                              else idx.match_batch(table, errors=errors))]


@pytest.mark.parametrize("errors", ["raise", "null", "report"])
def test_a_key_code_outside_the_names_is_refused_by_the_errors_mode(errors):
    idx = _index()
    mapped = DeviceMap(*(_to_device_input(a) for a in (np.array([0, 1, 3]), np.array([0, 7, 0]),
                                                        np.array([2, 2, 2]))), [NAMES[0]])
    if errors == "raise":
        with pytest.raises(BadEventError, match=r"^event 1: map 'map' has key code 7, outside its 1 names"):
            idx.match_batch(mapped)
        return
    result = idx.match_batch(mapped, errors=errors)
    found = result[0] if errors == "report" else result
    dicts = idx.match_batch([{NAMES[0]: 2}, {NAMES[0]: 2}])
    assert [m.tolist() for m in found] == [dicts[0].tolist(), dicts[1].tolist() if errors == "null" else []]
    if errors == "report":
        assert [(e.event, e.value) for e in result[1]] == [(1, 7)]


def test_a_uint64_code_past_int64_is_refused_as_given():
    """Codes are compared as int64: a uint64 key or string code of 2**63 or
    more wrapped negative there, and its refusal showed -1."""
    idx = _index()
    idx.add(99, "word = 'a'")
    big = _to_device_input(np.array([0, 2 ** 64 - 1], np.uint64))
    offsets = _to_device_input(np.array([0, 1, 2]))
    maps = {"key": DeviceMap(offsets, big, _to_device_input(np.array([2.0, 2.0])), [NAMES[0]]),
            "string code": DeviceMap(offsets, _to_device_input(np.array([0, 0], np.int32)),
                                     (big, ["a"]), ["word"])}
    for what, mapped in maps.items():
        with pytest.raises(BadEventError, match=rf"^event 1: .* code {2 ** 64 - 1}, outside its"):
            idx.match_batch(mapped)
        found, rejected = idx.match_batch(mapped, errors="report")
        assert [(e.event, e.value) for e in rejected] == [(1, 2 ** 64 - 1)], what


def test_a_map_beside_columns_merges_and_an_attribute_given_twice_is_an_error():
    idx = _index()
    view = idx._state.view
    table = pa.table({"flag": pa.array([True, None, False]),
                      "m": pa.array([[(NAMES[0], 2)], [(NAMES[1], 4), ("flag", 1)], [(NAMES[13], 0)]],
                                    pa.map_(pa.string(), pa.int64()))})
    columns, valid = arrow_columns(table)
    batch, _ = encode_device_columns(columns, valid, view, "report")
    expected = encode_events(table, view, "report")
    assert _arrays(batch) == _arrays(expected)
    assert [(e.event, e.attribute) for e in batch.rejected] == [(1, "flag")]       # a number for a boolean
    twice = pa.table({"flag": pa.array([True, True]),
                      "m": pa.array([[(NAMES[0], True)], [("flag", True)]], pa.map_(pa.string(), pa.bool_()))})
    columns, valid = arrow_columns(twice)
    with pytest.raises(BadEventError, match="^event 0: attribute 'https"):      # a boolean for a number first
        encode_device_columns(columns, valid, view)
    twice = twice.set_column(1, "m", pa.array([[], [("flag", True)]], pa.map_(pa.string(), pa.bool_())))
    columns, valid = arrow_columns(twice)
    for errors in ("raise", "null"):        # "null" is about values: a repeated attribute is an error still
        with pytest.raises(BadEventError, match="^event 1: attribute 'flag' is given twice"):
            encode_device_columns(columns, valid, view, errors)
    batch, _ = encode_device_columns(columns, valid, view, "report")
    expected = encode_events(twice, view, "report")
    assert _arrays(batch) == _arrays(expected) == [[0, 1, 1], [view.attr_ids["flag"]], [1.0], [-1]]
    assert [(e.event, e.attribute) for e in batch.rejected] == [(e.event, e.attribute) for e in expected.rejected] \
        == [(1, "flag")]


def test_malformed_maps_are_clear_errors_and_change_nothing():
    idx = _index()
    before = [m.tolist() for m in idx.match_batch([{NAMES[0]: 1}])]
    d = _to_device_input
    bad = [
        (DeviceMap(d(np.array([0, 2, 1])), d(np.zeros(2, np.int32)), d(np.ones(2)), [NAMES[0]]), ValueError,
         "offsets decrease"),
        (DeviceMap(d(np.array([0, 3])), d(np.zeros(2, np.int32)), d(np.ones(2)), [NAMES[0]]), ValueError,
         "offsets run from 0 to 3, over 2 keys"),
        (DeviceMap(d(np.array([0.0, 1.0])), d(np.zeros(1, np.int32)), d(np.ones(1)), [NAMES[0]]), ValueError,
         "integer arrays"),
        (DeviceMap(d(np.array([0, 1])), d(np.zeros(1, np.int32)), d(np.ones(1)), [None]), SchemaError,
         "its key dictionary holds a null"),
        (DeviceMap(d(np.array([0, 1])), d(np.zeros(1, np.int32)), d(np.ones(1)), [NAMES[0]],
                   valid=d(np.ones(3, bool))), ValueError, "valid is a boolean array of one per event"),
        (DeviceMap(d(np.array([0, 1])), d(np.zeros(1, np.int32)), d(np.ones(1)), pa.array([1])), SchemaError,
         "its key dictionary is not a list of strings: it is int64"),
        (DeviceMap(d(np.array([0, 1])), d(np.zeros(1, np.int32)), d(np.ones(1)), ["\ud800"]), SchemaError,
         "its key dictionary is not a list of strings"),
        (DeviceMap(d(np.array([0, 1])), d(np.zeros(1, np.int32)), d(np.array([1j])), [NAMES[0]]), SchemaError,
         "values of complex128 have no device form"),
    ]
    for mapped, error, message in bad:
        with pytest.raises(error, match=message):
            idx.match_batch(mapped)
    with pytest.raises(ValueError, match="a map's null maps are its own valid"):
        idx.match_batch({"m": bad[0][0]}, valid={"m": d(np.ones(2, bool))})
    with pytest.raises(ValueError, match="device columns need backend='cuda'"):
        cpu = Index(algorithm="scan", backend="cpu")
        cpu.add(1, "x > 0")
        cpu.match_batch(bad[0][0])
    assert [m.tolist() for m in idx.match_batch([{NAMES[0]: 1}])] == before


@pytest.mark.parametrize("bad", ["surrogate", "bad-utf8"])
def test_a_dictionary_entry_the_host_refuses_is_refused_in_the_entries_coded_to_it(bad):
    """A map's value dictionary holding a lone surrogate, or a string that
    is not valid UTF-8: the entries coded to it are refused as the host
    refuses the same map's values, in every errors mode -- for a string
    attribute, and (not valid UTF-8 only) for one only IS NULL reads; for a
    numeric one the value's family is refused first, as on the host."""
    from tests.test_device_events import invalid_utf8, refused_as_on_the_host
    view = _index()._state.view
    if bad == "surrogate":
        dictionary = ["ab", "x\ud800", "b"]
    else:
        dictionary = invalid_utf8([b"ab", b"x\xff", b"b"])
    names = ["word", "label", "only_null", NAMES[0], "unread"]
    # event 0: word "ab", label <bad>; 1: word <bad>; 2: only_null <bad>, word "b"; 3: NAMES[0] <bad>; 4: unread <bad>
    keys = np.array([0, 1, 0, 2, 0, 3, 4], np.int32)
    codes = np.array([0, 1, 1, 1, 2, 1, 1], np.int32)
    offsets = np.array([0, 2, 3, 5, 6, 7])
    d = _to_device_input
    mapped = {"attributes": DeviceMap(d(offsets), d(keys), (d(codes), dictionary), names)}
    rows = [[(names[k], c) for k, c in zip(keys[a:b], codes[a:b])] for a, b in zip(offsets[:-1], offsets[1:])]
    if bad == "surrogate":
        host_events = [{key: dictionary[c] for key, c in row} for row in rows]
        host_encode = lambda errors: encode_events(host_events, view, errors)        # noqa: E731
    else:
        flat = dictionary.take(pa.array(codes))
        maps = pa.MapArray.from_arrays(pa.array(offsets, pa.int32()), pa.array(names).take(pa.array(keys)), flat)
        table = pa.table({"attributes": maps})
        host_encode = lambda errors: encode_events(table, view, errors)             # noqa: E731
    set_aside = refused_as_on_the_host(mapped, view, host_encode, _arrays)
    assert set_aside == ([0, 1, 3] if bad == "surrogate" else [0, 1, 2, 3])


def test_a_string_not_valid_utf8_is_raised_before_an_earlier_events_other_problem():
    """The host reads a map column's strings for valid UTF-8 before
    anything else, so ``errors="raise"`` names event 1's bad string, not
    event 0's number for a numeric attribute -- and so does the device."""
    from tests.test_device_events import invalid_utf8, refused_as_on_the_host
    view = _index()._state.view
    dictionary = invalid_utf8([b"2", b"x\xff"])
    names = [NAMES[0], "word"]
    keys, codes, offsets = np.array([0, 1], np.int32), np.array([0, 1], np.int32), np.array([0, 1, 2])
    d = _to_device_input
    mapped = {"attributes": DeviceMap(d(offsets), d(keys), (d(codes), dictionary), names)}
    table = pa.table({"attributes": pa.MapArray.from_arrays(pa.array(offsets, pa.int32()), pa.array(names),
                                                            dictionary)})
    assert refused_as_on_the_host(mapped, view, lambda errors: encode_events(table, view, errors), _arrays) == [0, 1]
    with pytest.raises(BadEventError, match="event 1: attribute 'word' holds a string that is not valid UTF-8"):
        encode_device_columns(mapped, None, view, "raise")


@pytest.mark.parametrize("algorithm", ["opindex", "scan"])
def test_w3_like_sparse_events_match_on_the_device_as_on_the_host(algorithm):
    """The generator of W3 (one map column over many attributes): its
    events, with no dense device form, go in as a DeviceMap."""
    workload = workloads.opindex_gen(20, 12, dims=200, cardinality=4, gamma_max=3, m=12)
    assert workload.events.column_names == ["attributes"]
    idx = Index(algorithm=algorithm, backend="cuda")
    workloads.add_subscriptions(idx, workload.subscriptions, workload.asts)
    columns, valid = arrow_columns(workload.events)
    on_device = idx.match_batch(columns, valid=valid, output="arrow")
    assert on_device.equals(idx.match_batch(workload.events, output="arrow"))
    assert on_device.num_rows > 0


def test_a_spark_worker_on_a_gpu_executor_sends_the_map_layout_to_the_device(monkeypatch):
    """The map layout's batches (one map column) went to the host encoder
    on a GPU executor; a map of numbers now goes as a DeviceMap -- with the
    same rows out as on cpu, bad events quarantined alike -- and a map of
    strings still takes the host encoder."""
    from engine import device_maps
    from spark_integration.matching import _BatchMatcher

    worker = _BatchMatcher.__new__(_BatchMatcher)
    worker.event_id, worker.layout, worker.attrs_column, worker.output = "event_id", "map", "attrs", "pairs"
    worker.on_bad_event, worker.report_bad = "quarantine", True
    rows = [[(NAMES[0], 2.0), (NAMES[1], 3.0)], None, [("flag", 1.0), (NAMES[13], 1.0)], [(NAMES[4], np.nan)],
            [(NAMES[2], 3.0), ("nobody", 1.0)]]
    batch = pa.RecordBatch.from_pydict({"event_id": [f"e{k}" for k in range(len(rows))],
                                        "attrs": pa.array(rows, pa.map_(pa.string(), pa.float64()))})
    gpu, cpu = _index(), _index(backend="cpu")
    encoded = []
    real = device_maps.map_entries
    monkeypatch.setattr(device_maps, "map_entries", lambda *a, **k: encoded.append(1) or real(*a, **k))
    on_gpu = worker.match(gpu, batch).to_pylist()
    assert encoded              # the device route was taken
    assert on_gpu == worker.match(cpu, batch).to_pylist()
    assert {row["event_id"] for row in on_gpu if row["sub_id"] is not None} == {"e0", "e1", "e4"}
    assert [(row["event_id"], row["attribute"]) for row in on_gpu if row["sub_id"] is None] == \
        [("e2", "flag"), ("e3", NAMES[4])]
    strings = pa.RecordBatch.from_pydict({"event_id": ["a", "b", "c"], "attrs": pa.array(
        [[("word", "x")], [("word", "abc")], [("word", "abc"), (NAMES[0], "2")]], pa.map_(pa.string(), pa.string()))})
    encoded.clear()
    on_gpu = worker.match(gpu, strings).to_pylist()
    assert encoded and on_gpu == worker.match(cpu, strings).to_pylist()
    assert [(row["event_id"], row["sub_id"], row["attribute"]) for row in on_gpu] == \
        [("a", 19, None), ("a", 21, None), ("a", 22, None), ("b", 19, None), ("b", 22, None),   # (LIKE 'ab%')
         ("c", None, NAMES[0])]
    lists = pa.RecordBatch.from_pydict({"event_id": ["a"], "attrs": pa.array(
        [[("nobody", [1])]], pa.map_(pa.string(), pa.list_(pa.int64())))})
    encoded.clear()
    assert worker.match(gpu, lists).to_pylist() == worker.match(cpu, lists).to_pylist()
    assert not encoded          # a map of lists has no device form: the host encoder took it


def test_a_map_of_strings_beside_a_string_column_keeps_each_dictionary():
    """The batch's strings are the column's dictionary, then the map's:
    each entry's token points into its own, and the LIKE results are
    computed for each (attribute, string) pair the entries hold."""
    idx = _index()
    view = idx._state.view
    table = pa.table({"label": pa.array(["x", None, "y"]).dictionary_encode(),
                      "m": pa.array([[("word", "abc")], [("word", "x"), ("label", "x")], [("word", "zz")]],
                                    pa.map_(pa.string(), pa.string()))})
    columns, valid = arrow_columns(table)
    batch, _ = encode_device_columns(columns, valid, view)
    assert _arrays(batch) == _arrays(encode_events(table, view))
    want = [m.tolist() for m in idx.match_batch(table)]
    assert [m.tolist() for m in idx.match_batch(columns, valid=valid)] == want
    assert want == [[19, 22], [19, 21, 22, 23], [19, 22]]
    # a code outside the map's dictionary is refused as a string column's is
    coded = DeviceMap(*(_to_device_input(a) for a in (np.array([0, 1, 2]), np.array([0, 0]))),
                      (_to_device_input(np.array([0, 5])), ["abc"]), ["word"])
    with pytest.raises(BadEventError, match="^event 1: attribute 'word' has code 5, outside its dictionary of 1"):
        idx.match_batch(coded)
    assert [m.tolist() for m in idx.match_batch(coded, errors="null")] == [[19, 22], [19]]
    # an index no string attribute of which reads the map: strings for a number are refused, the rest unread
    numbers = Index(algorithm="scan", backend="cuda")
    numbers.add_many([1, 2], ["n > 1", "n IS NULL"])
    mapped = DeviceMap(*(_to_device_input(a) for a in (np.array([0, 1, 2]), np.array([0, 1]))),
                       (_to_device_input(np.array([0, 1])), ["a", "b"]), ["n", "other"])
    with pytest.raises(BadEventError, match="^event 0: attribute 'n' is numeric, got 'a'"):
        numbers.match_batch(mapped)
    assert [m.tolist() for m in numbers.match_batch(mapped, errors="null")] == [[2], [2]]


@pytest.mark.parametrize("errors", ["raise", "report"])
def test_refusals_rank_by_the_columns_order_as_on_the_host(errors):
    """A map before a column: the map's refusal is the event's, as the host
    encoder ranks a table's columns (the columns had come first, whatever
    the order)."""
    idx = _index()
    view = idx._state.view
    rows = [[(NAMES[0], float("nan"))], [(NAMES[1], 1.0)]]
    table = pa.table({"m": pa.array(rows, pa.map_(pa.string(), pa.float64())),
                      NAMES[2]: pa.array([True, True])})           # a boolean for a numeric attribute: refused too
    columns, valid = arrow_columns(table)
    assert list(columns) == ["m", NAMES[2]]
    if errors == "raise":
        with pytest.raises(BadEventError) as on_host:
            encode_events(table, view)
        with pytest.raises(BadEventError) as on_device:
            encode_device_columns(columns, valid, view)
        assert str(on_device.value) == str(on_host.value) and on_host.value.attribute == NAMES[0]
        return
    batch, _ = encode_device_columns(columns, valid, view, errors)
    assert [str(e) for e in batch.rejected] == [str(e) for e in encode_events(table, view, errors).rejected]
    assert [e.attribute for e in batch.rejected] == [NAMES[0], NAMES[2]]


def test_a_table_with_two_columns_of_one_name_takes_the_host_encoder():
    twice = pa.Table.from_arrays([pa.array([[("a", 3.0)]], pa.map_(pa.string(), pa.float64())),
                                  pa.array([[("c", 1.0)]], pa.map_(pa.string(), pa.float64()))], names=["m", "m"])
    with pytest.raises(TypeError, match="two columns of one name"):
        arrow_columns(twice)


@pytest.mark.parametrize("key_type", [pa.int64(), pa.binary()], ids=str)
def test_a_map_whose_keys_are_not_strings_takes_the_host_encoder_which_refuses_it(key_type):
    """No int key becomes the name "0" on the device either: the table goes to the host encoder (TypeError from
    arrow_columns, as for any type the device form lacks), whose SchemaError the batch then gets."""
    key = b"a" if key_type == pa.binary() else 0
    table = pa.table({"m": pa.array([[(key, 3.0)]], pa.map_(key_type, pa.float64()))})
    with pytest.raises(TypeError, match="keys has no device-column form"):
        arrow_columns(table)
    index = Index(algorithm="scan", backend="cuda")
    index.add(1, '"0" > 1 OR a > 1')
    with pytest.raises(SchemaError, match="map column 'm': its keys are attribute names"):
        index.match_batch(table)


def test_dictionaries_given_as_objects_with_to_arrow_are_read():
    """cuDF's Index and Series refuse pyarrow's implicit conversion; their
    ``to_arrow()`` gives the strings."""
    class Categories:
        def __init__(self, strings):
            self._strings = strings

        def __arrow_array__(self, type=None):
            raise TypeError("Implicit conversion to a host PyArrow object via __arrow_array__ is not allowed")

        def to_arrow(self):
            return pa.array(self._strings)

    idx = _index()
    mapped = DeviceMap(*(_to_device_input(a) for a in (np.array([0, 2]), np.array([0, 1]))),
                       (_to_device_input(np.array([0, 0])), Categories(["abc"])), Categories(["word", "label"]))
    assert [m.tolist() for m in idx.match_batch(mapped)] == \
        [m.tolist() for m in idx.match_batch([{"word": "abc", "label": "abc"}])]


def _as_maps(events: list[dict], draw) -> pa.Table:
    """The events as three map columns, one a value type (numbers, strings,
    booleans), as a sparse producer holds them -- with what such producers
    send beside: a null map, an unknown key, a key given twice in one map
    (a first value the last one overrides), a null value, now and then a
    string that is not valid UTF-8."""
    columns = {"numbers": (pa.float64(), strategies.NUMERIC_ATTRS), "strings": (pa.string(), strategies.STRING_ATTRS),
               "flags": (pa.bool_(), strategies.BOOLEAN_ATTRS)}
    table = {}
    for name, (kind, attrs) in columns.items():
        rows = []
        for event in events:
            if draw(st.integers(0, 19)) == 0:
                rows.append(None)                                   # a null map
                continue
            entries = [(a, event[a]) for a in attrs if a in event]
            if entries and draw(st.booleans()):                     # given twice: the last one counts
                a, value = entries[0]
                entries.insert(0, (a, {pa.float64(): -7.5, pa.string(): "overridden", pa.bool_(): False}[kind]))
            if draw(st.integers(0, 4)) == 0:
                entries.append(("unread/attribute", {pa.float64(): 1.0, pa.string(): "x", pa.bool_(): True}[kind]))
            if draw(st.integers(0, 9)) == 0:
                entries.append((attrs[0] if draw(st.booleans()) else "only_null", None))      # a null value
            if draw(st.integers(0, 14)) == 0:       # another family's attribute: refused, or given twice
                other = draw(st.sampled_from(strategies.NUMERIC_ATTRS + strategies.STRING_ATTRS
                                             + strategies.BOOLEAN_ATTRS))
                entries.append((other, {pa.float64(): 2.0, pa.string(): "2", pa.bool_(): True}[kind]))
            rows.append(entries)
        table[name] = pa.array(rows, pa.map_(pa.string(), kind))
        if kind == pa.string() and draw(st.integers(0, 3)) == 0:        # a value that is not valid UTF-8
            column = table[name]
            table[name] = pa.MapArray.from_arrays(column.offsets, column.keys,
                                                  strategies.not_utf8_at(column.items, draw), mask=column.is_null())
    return pa.table(table)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(events=st.lists(strategies.events(), max_size=24),
       asts=st.lists(strategies.expressions(max_leaves=6), min_size=1, max_size=6), data=st.data())
def test_random_events_as_maps_encode_and_match_as_on_the_host(events, asts, data):
    """Random events over the conformance schema -- values on and beside
    the literals, URLs, UUIDs, non-ASCII, NUL -- as map columns: the device
    batch equals the host's entry for entry (strings as strings), refusals
    alike, and ``scan`` on cuda matches them as the host table."""
    idx = Index(algorithm="scan", backend="cuda", schema=strategies.SCHEMA)
    idx.add_many(list(range(len(asts))), asts)
    view = idx._state.view
    table = _as_maps(events, data.draw)
    columns, valid = arrow_columns(table)
    for errors in ("raise", "null", "report"):
        try:
            expected = encode_events(table, view, errors)
        except BadEventError as error:          # a refused value; an attribute given twice even with "null"
            with pytest.raises(BadEventError) as caught:
                encode_device_columns(columns, valid, view, errors)
            assert str(caught.value) == str(error)
            continue
        batch, _ = encode_device_columns(columns, valid, view, errors)
        assert _arrays(batch) == _arrays(expected)
        assert [str(e) for e in batch.rejected] == [str(e) for e in expected.rejected]
    got = idx.match_batch(columns, valid=valid, errors="report")
    want = idx.match_batch(table, errors="report")
    assert [m.tolist() for m in got[0]] == [m.tolist() for m in want[0]]


def test_concurrent_callers_encode_maps_for_indexes_of_other_schemas():
    """Threads encoding device maps at once, for two indexes whose schemas
    give one attribute different families (numeric in one, string in the
    other): each gets its own index's answer, as one caller alone does --
    the encoder shares no state between calls but its caches, which must
    never pair one schema's families with the other's codes."""
    import threading

    numbers, strings = Index(algorithm="scan", backend="cuda"), Index(algorithm="scan", backend="cuda")
    numbers.add_many([1, 2], ["a > 1", "b IS NULL"])
    strings.add_many([1, 2], ["b = 'x'", "a = 'y'"])
    table = pa.table({"m": pa.array([[("a", 2.0), ("b", 1.0)], [("a", 0.5)], None, [("b", 3.0)]] * 16,
                                    pa.map_(pa.string(), pa.float64()))})
    columns, valid = arrow_columns(table)
    cases = [(idx, idx._state.view) for idx in (numbers, strings)]
    expected = [(_arrays(encode_events(table, view, "report")),
                 [str(e) for e in encode_events(table, view, "report").rejected]) for _, view in cases]
    assert expected[0] != expected[1] and expected[1][1]        # the schemas disagree: strings refuse numbers
    failures = []

    def work(k: int) -> None:
        for round_ in range(40):
            which = (k + round_) % 2
            batch, _ = encode_device_columns(columns, valid, cases[which][1], "report")
            if (_arrays(batch), [str(e) for e in batch.rejected]) != expected[which]:
                failures.append((k, round_))

    threads = [threading.Thread(target=work, args=(k,)) for k in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert failures == []
