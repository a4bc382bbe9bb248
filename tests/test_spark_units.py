"""spark_integration pieces that need no running Spark: GPU selection (with
faked task resources), the worker's matcher on Arrow batches (bad events
failed or quarantined from the engine's report), index sharding, the job's
environment set-up."""

from __future__ import annotations

import pickle

import numpy as np
import pyarrow as pa
import pytest

from engine import Index
from engine.errors import BackendUnavailable, SchemaError
from spark_integration import devices
from spark_integration.shipping import index_bytes, load_bytes, split_index


# ------------------------------------------------------------------ devices

class _Resource:
    def __init__(self, addresses):
        self.name = "gpu"
        self.addresses = addresses


class _FakeTask:
    def __init__(self, resources):
        self._resources = resources

    def resources(self):
        return self._resources


def _loader(cuda_works: bool, calls: list):
    def load(backend):
        calls.append(backend)
        if backend == "cuda" and not cuda_works:
            raise BackendUnavailable("backend 'cuda' is not available here: no CUDA GPU is visible")
        return f"index on {backend}"
    return load


def test_task_gpus_from_spark_resources_then_environment():
    task = _FakeTask({"gpu": _Resource(["1"])})
    assert devices.task_gpus(task, {}) == devices.TaskGpus(("1",), "spark-resources")
    # Spark resources win over the environment
    assert devices.task_gpus(task, {"CUDA_VISIBLE_DEVICES": "3"}).source == "spark-resources"
    assert devices.task_gpus(_FakeTask({}), {"CUDA_VISIBLE_DEVICES": "2,3"}) == \
        devices.TaskGpus(("2", "3"), "CUDA_VISIBLE_DEVICES")
    for none in ("", "-1", "NoDevFiles"):
        assert not devices.task_gpus(_FakeTask({}), {"CUDA_VISIBLE_DEVICES": none})
    assert not devices.task_gpus(_FakeTask({"gpu": _Resource([])}), {})
    assert not devices.task_gpus(_FakeTask({}), {})


def test_choose_backend():
    gpu = devices.TaskGpus(("0",), "spark-resources")
    assert devices.choose_backend("auto", gpu) == "cuda"
    assert devices.choose_backend("auto", devices.TaskGpus()) == "cpu"
    assert devices.choose_backend("cpu", gpu) == "cpu"
    assert devices.choose_backend("cuda", devices.TaskGpus()) == "cuda"
    with pytest.raises(ValueError):
        devices.choose_backend("tpu", gpu)


def test_gpu_task_uses_cuda_and_selects_its_device():
    gpu = devices.TaskGpus(("1",), "spark-resources")
    calls, selected = [], []
    index, choice = devices.load_for_task(_loader(True, calls), "auto", gpus=gpu,
                                          select=lambda g: selected.append(g) or int(g.addresses[0]))
    assert index == "index on cuda" and choice.backend == "cuda" and choice.device == 1
    assert calls == ["cuda"] and selected == [gpu]


def test_gpu_task_without_cuda_fails_clearly_unless_fallback():
    gpu = devices.TaskGpus(("0",), "spark-resources")
    with pytest.raises(devices.GpuUnavailable, match=r"holds GPU 0 .*gpu_fallback=True"):
        devices.load_for_task(_loader(False, []), "auto", gpus=gpu, select=lambda g: 0)
    calls = []
    index, choice = devices.load_for_task(_loader(False, calls), "auto", gpus=gpu, gpu_fallback=True,
                                          select=lambda g: 0)
    assert index == "index on cpu" and choice.backend == "cpu" and "no CUDA GPU" in choice.fell_back
    assert calls == ["cuda", "cpu"]


def test_cpu_task_never_touches_cuda():
    calls = []
    _, choice = devices.load_for_task(_loader(False, calls), "auto", gpus=devices.TaskGpus(),
                                      select=lambda g: pytest.fail("selected a GPU"))
    assert calls == ["cpu"] and choice.backend == "cpu" and choice.fell_back is None


def test_real_index_on_a_faked_gpu_task():
    """engine.Index.load(backend='cuda') on this machine: a real load or a real BackendUnavailable."""
    from engine import available_backends

    index = Index()
    index.add(1, "a = 1")
    data = index_bytes(index)
    gpu = devices.TaskGpus(("0",), "spark-resources")
    if "cuda" in available_backends():
        pytest.skip("a cuda backend is present: the fallback path is not reachable here")
    with pytest.raises(devices.GpuUnavailable, match="cuda"):
        devices.load_for_task(lambda b: load_bytes(data, backend=b), "auto", gpus=gpu, select=lambda g: 0)
    loaded, choice = devices.load_for_task(lambda b: load_bytes(data, backend=b), "auto", gpus=gpu,
                                           gpu_fallback=True, select=lambda g: 0)
    assert choice.backend == "cpu" and loaded.match({"a": 1}).tolist() == [1]


def test_bad_gpu_address_is_reported():
    with pytest.raises(devices.GpuUnavailable, match="discovery script"):
        devices.select_gpu(devices.TaskGpus(("GPU-abc",), "spark-resources"))
    assert devices.select_gpu(devices.TaskGpus(("3",), "CUDA_VISIBLE_DEVICES")) is None


# ------------------------------------------------------------------ layouts

def _matcher(attributes: dict, *, layout: str = "wide", on_bad_event: str = "quarantine", output: str = "pairs",
             report_bad: bool = True):
    from spark_integration import matching
    from spark_integration.shipping import ShippedIndex

    shipped = ShippedIndex("0" * 64, 0, "broadcast", None, 2, "scan", attributes)
    return matching._BatchMatcher(shipped, event_id="id", layout=layout, attrs_column="attrs", output=output,
                                  on_bad_event=on_bad_event, report_bad=report_bad, batch_size=None, backend="cpu",
                                  gpu_fallback=False, capacity=1, stats_acc=None, inject_failure=None)


def _split(out) -> tuple[list, dict]:
    """(sorted (id, sub_id) pairs, {id: (attribute, error)}) of a pairs output batch with quarantine."""
    rows = out.to_pylist()
    pairs = sorted((r["id"], r["sub_id"]) for r in rows if r["error"] is None)
    refused = {r["id"]: (r["attribute"], r["error"]) for r in rows if r["error"] is not None}
    return pairs, refused


def _engine_refuses_exactly(index, table, rows) -> None:
    """Matching each row of ``table`` alone raises exactly for ``rows``."""
    for row in range(table.num_rows):
        one = table.slice(row, 1)
        if row in rows:
            with pytest.raises(SchemaError):
                index.match_batch(one)
        else:
            index.match_batch(one)


def test_a_map_column_quarantines_the_rows_the_engine_refuses():
    """A map column's bad rows: a value of the wrong family, NaN/infinity,
    an integer beyond 2**53 -- of a key the index knows, in a non-null map,
    the last of a repeated key only (the one the engine reads); unknown
    keys, null values and IS NULL-only attributes are never bad.  The
    quarantined rows are those the engine refuses alone, each with the
    attribute and the reason of the engine's error, and the other rows
    match as they would alone, map columns sliced included."""
    index = Index()
    index.add_many([1, 2, 3], ["x > 0", "y > 0", "s = 'q'"])
    index.add(4, "p IS NULL")
    families = {"x": "numeric", "y": "numeric", "s": "string", "p": None}
    maps = [[("x", 1.0)],                          # fine
            [("x", float("nan"))],                 # NaN
            [("y", 2.0 ** 60)],                    # a float beyond 2**53 is still finite: fine
            [("s", 4.0)],                          # a number for a string attribute
            [("x", float("inf")), ("x", 2.0)],     # repeated: the last (fine) wins
            [("x", 2.0), ("x", float("inf"))],     # repeated: the last (bad) wins
            [("zz", float("nan")), ("p", float("nan"))],   # unknown key; IS NULL-only attribute
            None,                                  # null map
            [("x", None)]]                         # null value
    column = pa.array(maps, pa.map_(pa.string(), pa.float64()))
    for base in (0, 2):
        attrs = column.slice(base)
        ids = pa.array(range(100 + base, 100 + len(maps)), pa.int64())
        out = _matcher(families, layout="map").match(index, pa.RecordBatch.from_pydict({"id": ids, "attrs": attrs}))
        pairs, refused = _split(out)
        bad = [r for r in (1, 3, 5) if r >= base]
        assert sorted(refused) == [100 + r for r in bad]
        want = {1: ("x", "attribute 'x' is numeric, got nan: not a finite number"),
                3: ("s", "attribute 's' is string, got 4.0"),
                5: ("x", "attribute 'x' is numeric, got inf: not a finite number")}
        assert refused == {100 + r: want[r] for r in bad}
        table = pa.table({"attrs": attrs})
        _engine_refuses_exactly(index, table, [r - base for r in bad])
        good = [r for r in range(len(maps) - base) if r + base not in bad]
        alone = index.match_batch(table.take(pa.array(good)))
        assert pairs == sorted((100 + base + r, int(s)) for r, m in zip(good, alone) for s in m)
    ints = pa.RecordBatch.from_pydict({"id": [0, 1], "attrs": pa.array([[("y", 2 ** 60)], [("y", 3)]],
                                                                       pa.map_(pa.string(), pa.int64()))})
    pairs, refused = _split(_matcher(families, layout="map").match(index, ints))
    assert list(refused) == [0] and refused[0][0] == "y" and "beyond ±2**53" in refused[0][1]
    assert pairs == [(1, 2), (1, 4)]


def test_a_wide_batch_quarantines_every_refused_value():
    """Every bad event of a wide batch is quarantined at once, named by the
    first attribute (in column order) the engine refused in it."""
    batch = pa.RecordBatch.from_pydict({
        "id": pa.array([10, 11, 12, 13], pa.int64()),
        "x": pa.array([1.0, float("nan"), None, float("inf")]),
        "y": pa.array([1, 2 ** 60, 3, None], pa.int64()),
        "s": pa.array([1, 2, None, 4], pa.int64()),
        "unused": pa.array(["a", "b", "c", "d"]),
        "p": pa.array(["a", "b", "c", "d"])})
    families = {"x": "numeric", "y": "numeric", "s": "string", "p": None}
    index = Index()
    index.add_many([1, 2, 3], ["x > 0", "y > 0", "s = 'q'"])
    index.add(4, "p IS NULL")
    pairs, refused = _split(_matcher(families).match(index, batch))
    assert refused == {10: ("s", "attribute 's' is string, got 1"),
                       11: ("x", "attribute 'x' is numeric, got nan: not a finite number"),
                       13: ("x", "attribute 'x' is numeric, got inf: not a finite number")}
    assert pairs == [(12, 2)]
    _engine_refuses_exactly(index, pa.Table.from_batches([batch]).drop_columns(["id"]), [0, 1, 3])


class _CountingIndex:
    """An index whose match_batch calls are recorded."""

    def __init__(self, index):
        self.index, self.calls = index, []

    def match_batch(self, events, **kwargs):
        self.calls.append((events.num_rows, kwargs))
        return self.index.match_batch(events, **kwargs)


def test_each_batch_is_matched_once_and_its_rejected_events_quarantined():
    """One match_batch call per batch, clean or not, with errors="report":
    the refused events come back beside the matches (no re-validation, no
    second match); quarantine keeps their attribute and reason, fail
    raises the first one named by its event id, with the engine's fields."""
    from spark_integration import matching

    index = Index()
    index.add_many([1, 2], ["x > 0", "x < 5"])
    counting = _CountingIndex(index)
    clean = pa.RecordBatch.from_pydict({"id": [10, 11], "x": [1.0, 7.0]})
    out = _matcher({"x": "numeric"}).match(counting, clean)
    assert _split(out) == ([(10, 1), (10, 2), (11, 1)], {})
    assert out.schema.names == ["id", "sub_id", "attribute", "error"]
    bad = pa.RecordBatch.from_pydict({"id": [20, 21, 22, 23], "x": [float("nan"), 3.0, float("inf"), -1.0]})
    pairs, refused = _split(_matcher({"x": "numeric"}).match(counting, bad))
    report = {"output": "arrow", "errors": "report"}
    assert counting.calls == [(2, report), (4, report)]
    assert pairs == [(21, 1), (21, 2), (23, 2)]
    assert refused == {20: ("x", "attribute 'x' is numeric, got nan: not a finite number"),
                       22: ("x", "attribute 'x' is numeric, got inf: not a finite number")}
    with pytest.raises(matching.BadEventError, match=r"^bad event id=20: attribute 'x' is numeric, got nan") as caught:
        _matcher({"x": "numeric"}, on_bad_event="fail").match(index, bad)
    error = caught.value
    assert isinstance(error, SchemaError)
    assert (error.event_id, error.event, error.attribute) == (20, 0, "x") and np.isnan(error.value)
    assert "on_bad_event='quarantine'" in str(error)
    again = pickle.loads(pickle.dumps(error))
    assert str(again) == str(error) and again.event_id == 20 and again.reason == error.reason
    # without quarantine, no error columns; a shard that does not report drops the refused events
    out = _matcher({"x": "numeric"}, on_bad_event="quarantine", report_bad=False).match(index, bad)
    assert _split(out) == ([(21, 1), (21, 2), (23, 2)], {})


def test_grouped_output_carries_the_attribute_and_reason_of_refused_events():
    index = Index()
    index.add_many([1, 2], ["x > 0", "s IS NULL"])
    bad = pa.RecordBatch.from_pydict({"id": [1, 2, 3], "x": [2.0, float("inf"), None],
                                      "s": pa.array([None, None, None], pa.string())})
    out = _matcher({"x": "numeric", "s": "string"}, output="grouped").match(index, bad)
    assert out.to_pylist() == [
        {"id": 1, "sub_ids": [1, 2], "attribute": None, "error": None},
        {"id": 2, "sub_ids": None, "attribute": "x", "error": "attribute 'x' is numeric, got inf: not a finite number"},
        {"id": 3, "sub_ids": [2], "attribute": None, "error": None}]
    out = _matcher({"x": "numeric", "s": "string"}, output="grouped", report_bad=False).match(index, bad)
    assert out["id"].to_pylist() == [1, 3]
    out = _matcher({"x": "numeric", "s": "string"}, output="grouped", on_bad_event="fail")
    with pytest.raises(SchemaError, match="bad event id=2: attribute 'x'"):
        out.match(index, bad)


# ------------------------------------------------------------------ sharding

def test_split_index_partitions_ids_and_matches():
    rng = np.random.default_rng(3)
    index = Index()
    ids = rng.choice(10 ** 6, 200, replace=False)
    index.add_many([int(i) for i in ids], [f"a {['<', '>=', '='][i % 3]} {i % 7} OR b = 'x{i % 3}'"
                                           for i in range(200)])
    events = [{"a": int(rng.integers(7)), "b": f"x{rng.integers(4)}"} for _ in range(50)]
    full = index.match_batch(events)
    shards = split_index(index, 3)
    assert [len(s) for s in shards] == [67, 67, 66]
    all_ids = np.concatenate([np.sort([i for i in ids if i in s]) for s in shards])
    assert sorted(all_ids.tolist()) == sorted(ids.tolist())
    assert max(max(i for i in ids if i in shards[0]), 0) < min(i for i in ids if i in shards[1])
    parts = [s.match_batch(events) for s in shards]
    for e in range(len(events)):
        merged = np.sort(np.concatenate([p[e] for p in parts]))
        assert merged.tolist() == full[e].tolist()
    # a shard survives the trip through save/load
    again = load_bytes(index_bytes(shards[1]))
    assert len(again) == len(shards[1])


# ------------------------------------------------------------------ the job's environment

def test_find_java_home_prefers_the_set_one(tmp_path):
    from spark_integration.job import find_java_home

    assert find_java_home({"JAVA_HOME": "/opt/some-jdk"}) == "/opt/some-jdk"
    home = tmp_path / "jdk17"
    (home / "bin").mkdir(parents=True)
    (home / "bin" / "java").write_text("#!/bin/sh\n")
    (home / "bin" / "java").chmod(0o755)
    (home / "release").write_text('JAVA_VERSION="17.0.9"\n')
    assert find_java_home({"PATH": str(home / "bin")}) == str(home)


def test_split_index_is_of_one_state_while_another_thread_updates(monkeypatch):
    """The shards were ``subset`` calls one after the other: a removal in
    another thread between two of them raised KeyError (or mixed states).
    The removal now lands before all of them or after."""
    import threading
    index = Index()
    index.add_many(range(30), [f"a = {i}" for i in range(30)])
    started = threading.Event()
    remover = threading.Thread(target=lambda: (started.wait(), index.remove(25)))
    subset = Index.subset

    def slow_subset(self, ids):
        started.set()                       # the remover runs now, between this shard and the next
        remover.join(timeout=0.3)
        return subset(self, ids)
    monkeypatch.setattr(Index, "subset", slow_subset)
    remover.start()
    shards = split_index(index, 3)
    remover.join()
    assert sorted(i for s in shards for i in s.ids().tolist()) == list(range(30))
    assert 25 not in index


def test_a_forked_worker_starts_with_free_shipping_locks():
    """PySpark's daemon forks its workers: a shipping or cache lock another
    thread held at the fork must not stay held in the child (its first
    task would wait for ever)."""
    from spark_integration import shipping
    from tests.forking import held_by_another_thread, in_forked_child

    def child() -> str:
        free = [lock.acquire(timeout=5) for lock in (shipping._SHIP_LOCK, shipping._CACHE_LOCK)]
        return "free" if all(free) else f"held {free}"

    with held_by_another_thread(shipping._SHIP_LOCK, shipping._CACHE_LOCK):
        status, answer = in_forked_child(child, timeout_s=60)
        assert shipping._CACHE_LOCK.locked()          # the parent's own lock is untouched
    assert status == 0 and answer == "free", (status, answer)
