"""spark_integration pieces that need no running Spark: GPU selection (with
faked task resources), event layouts and validation, index sharding, the
job's environment set-up."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest

from engine import Index
from engine.errors import BackendUnavailable, SchemaError
from spark_integration import devices, layout
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

def test_bad_rows_of_a_map_column_are_the_rows_the_engine_refuses():
    """A map column's bad rows, found vectorised: a value of the wrong
    family, NaN/infinity, an integer beyond 2**53 -- of a key the index
    knows, in a non-null map, the last of a repeated key only (the one the
    engine reads); unknown keys, null values and IS NULL-only attributes
    are never bad.  Each row is refused by the engine exactly when flagged,
    map columns sliced included."""
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
    for table, base in ((pa.table({"attrs": column}), 0), (pa.table({"attrs": column.slice(2)}), 2)):
        problems = layout.bad_rows(table, families)
        assert sorted(r + base for r in problems) == [r for r in (1, 3, 5) if r >= base]
        _engine_refuses_exactly(index, table, problems)
    assert "'s' is string, got 4.0" in layout.bad_rows(pa.table({"attrs": column}), families)[3]
    ints = pa.table({"attrs": pa.array([[("y", 2 ** 60)], [("y", 3)]], pa.map_(pa.string(), pa.int64()))})
    assert sorted(layout.bad_rows(ints, families)) == [0]
    assert layout.bad_rows(pa.table({"attrs": column.slice(0, 0)}), families) == {}


def test_bad_rows_finds_every_refused_value():
    table = pa.table({"x": pa.array([1.0, float("nan"), None, float("inf")]),
                      "y": pa.array([1, 2 ** 60, 3, None], pa.int64()),
                      "s": pa.array([1, 2, None, 4], pa.int64()),
                      "unused": pa.array(["a", "b", "c", "d"]),
                      "p": pa.array(["a", "b", "c", "d"])})
    families = {"x": "numeric", "y": "numeric", "s": "string", "p": None}
    problems = layout.bad_rows(table, families)
    assert sorted(problems) == [0, 1, 3]     # s is numeric where a string is wanted; y beyond 2**53
    assert "'s' is string, got 1" in problems[0]
    # the engine refuses exactly these rows
    index = Index()
    index.add_many([1, 2, 3], ["x > 0", "y > 0", "s = 'q'"])
    index.add(4, "p IS NULL")
    _engine_refuses_exactly(index, table, problems)


def _engine_refuses_exactly(index, table, problems) -> None:
    """Matching each row of ``table`` alone raises exactly for the rows in ``problems``."""
    for row in range(table.num_rows):
        one = table.slice(row, 1)
        if row in problems:
            with pytest.raises(SchemaError):
                index.match_batch(one)
        else:
            index.match_batch(one)


def test_batches_reach_the_engine_first_and_bad_ones_are_checked_once(monkeypatch):
    """A clean batch never pays for the bad-event check; a batch the engine
    refuses has all its bad events found in one vectorised check, then is
    matched without them (quarantine) or fails naming the first (fail)."""
    from spark_integration import matching
    from spark_integration.shipping import ShippedIndex

    index = Index()
    index.add_many([1, 2], ["x > 0", "x < 5"])
    attributes = {"x": "numeric"}
    shipped = ShippedIndex("0" * 64, 0, "broadcast", None, 2, index.algorithm, attributes)
    calls = []
    real = layout.bad_rows
    monkeypatch.setattr(matching.layouts, "bad_rows", lambda *a: calls.append(1) or real(*a))

    def matcher(on_bad_event):
        return matching._BatchMatcher(shipped, event_id="id", layout="wide", attrs_column="attrs", output="pairs",
                                      on_bad_event=on_bad_event, report_bad=True, batch_size=None, backend="cpu",
                                      gpu_fallback=False, capacity=1, stats_acc=None, inject_failure=None)

    clean = pa.RecordBatch.from_pydict({"id": [10, 11], "x": [1.0, 7.0]})
    out = matcher("quarantine").match(index, clean)
    assert calls == [] and sorted(zip(out["id"].to_pylist(), out["sub_id"].to_pylist())) == [(10, 1), (10, 2),
                                                                                                (11, 1)]
    bad = pa.RecordBatch.from_pydict({"id": [20, 21, 22, 23], "x": [float("nan"), 3.0, float("inf"), -1.0]})
    out = matcher("quarantine").match(index, bad)
    assert calls == [1]
    pairs = [(i, sub) for i, sub in zip(out["id"].to_pylist(), out["sub_id"].to_pylist()) if sub is not None]
    assert sorted(pairs) == [(21, 1), (21, 2), (23, 2)]
    assert sorted(i for i, sub in zip(out["id"].to_pylist(), out["sub_id"].to_pylist()) if sub is None) == [20, 22]
    with pytest.raises(matching.BadEventError, match=r"bad event id=20: attribute 'x' is numeric, got nan"):
        matcher("fail").match(index, bad)


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
