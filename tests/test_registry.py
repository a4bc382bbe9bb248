"""The algorithm registry, options checked when an index is made, the
residual matcher, statistics, and the saved structure used by load."""

from __future__ import annotations

import numpy as np
import pytest

from engine import ALGORITHMS, Index
from engine.algorithms import registry
from engine.algorithms.base import HostMatcher, Matcher
from engine.algorithms.options import OpIndexOptions
from engine.errors import BackendUnavailable, ExpressionTooLarge
from engine.reference import evaluate

#: beyond opindex's DNF and CNF limit at dnf_limit=8: a chain of XORs doubles both at every step
WIDE_XOR = " XOR ".join(f"x{k} = {k}" for k in range(6))


def reference_ids(expressions: dict, event: dict) -> list:
    from engine.parse import parse
    return sorted(i for i, text in expressions.items() if evaluate(parse(text), event) is True)


# ---------------------------------------------------------------- registry
def test_the_registry_lists_what_exists_with_its_paper():
    # (sets: a test that registers an algorithm again moves it to the end of the registry's order)
    assert set(ALGORITHMS) == set(registry.names()) == {"scan", "opindex", "betree", "apcm", "pstbloom", "psthash",
                                                        "atree"}
    for algorithm in registry.algorithms():
        assert "cpu" in algorithm.backends
        if algorithm.name in ("scan", "opindex", "betree", "apcm", "pstbloom", "psthash"):
            assert set(algorithm.backends) == {"cpu", "cuda"}
        assert algorithm.paper and algorithm.native_forms
        cpu = algorithm.matcher_class("cpu")
        assert issubclass(cpu, HostMatcher) and cpu.name == algorithm.name
    assert "PVLDB 7(8), 2014" in registry.get("opindex").paper and "§6" in registry.get("opindex").sections
    assert "SIGMOD 2011" in registry.get("betree").paper and "§4" in registry.get("betree").sections
    assert "ICDE 2014" in registry.get("apcm").paper and "§VI" in registry.get("apcm").sections
    for name in ("pstbloom", "psthash"):           # PS-Tree: both backends
        assert "PVLDB 12(3), 2018" in registry.get(name).paper
    assert "§5" in registry.get("pstbloom").sections and "§6" in registry.get("psthash").sections
    atree = registry.get("atree")                   # A-Tree: both backends, every expression native
    assert "SIGMOD 2021" in atree.paper and set(atree.backends) == {"cpu", "cuda"} and atree.limit_check is None
    with pytest.raises(BackendUnavailable, match="unknown algorithm 'nope'"):
        registry.get("nope")


def test_conformance_options_are_options_of_the_backends_they_run_on():
    """Each ``conformance_options`` entry (the conformance suite's extra
    cases, tests/conformance.py) is a non-default mapping of the
    algorithm's options, valid on each backend that takes all its names
    (at least one); the other backends refuse it by name."""
    for algorithm in registry.algorithms():
        for options in algorithm.conformance_options:
            assert isinstance(options, dict) and options
            runs_on = algorithm.option_backends(options)
            assert runs_on, (algorithm.name, options)
            for backend in algorithm.backends:
                if backend in runs_on:
                    assert algorithm.make_options(options, backend) != algorithm.make_options(None, backend)
                else:
                    with pytest.raises(TypeError, match="applies to backend"):
                        algorithm.make_options(options, backend)
    apcm = registry.get("apcm")
    assert apcm.option_backends({"over": "opindex"}) == ("cpu",)
    assert apcm.option_backends({"variant": "pcm"}) == apcm.option_backends(None) == ("cpu", "cuda")
    assert {"max_cap": 1, "min_size": 1} in registry.get("betree").conformance_options
    assert registry.get("scan").conformance_options == ()


def test_registering_an_algorithm_makes_it_usable_by_name_and_unregistering_removes_it():
    from engine.algorithms.options import ScanOptions
    from engine.algorithms.scan import ScanMatcher
    registry.register(registry.Algorithm(name="toy", title="toy", paper="-", sections="-",
                                         implementations={"cpu": ScanMatcher}, options=ScanOptions,
                                         native_forms=("all",)))
    try:
        assert "toy" in registry.names("cpu") and "toy" not in registry.names("cuda")
        idx = Index(algorithm="toy", backend="cpu")
        idx.add(1, "a = 1")
        assert idx.match({"a": 1}).tolist() == [1]
        with pytest.raises(ValueError, match="registered already"):
            registry.register(registry.get("toy"))
        with pytest.raises(BackendUnavailable, match="'toy' is not implemented for backend 'cuda'; it runs on cpu"):
            registry.get("toy").matcher_class("cuda")
    finally:
        registry.unregister("toy")
    with pytest.raises(BackendUnavailable, match="unknown algorithm 'toy'"):
        Index(algorithm="toy")


def test_conformance_options_naming_no_option_are_refused_at_registration():
    """The suite runs a variant on the backends that take all its names:
    a name that is no option would make it run nowhere, unseen."""
    from engine.algorithms.options import BETreeOptions
    from engine.algorithms.scan import ScanMatcher
    toy = registry.Algorithm(name="toy", title="toy", paper="-", sections="-", implementations={"cpu": ScanMatcher},
                             options=BETreeOptions, native_forms=("all",),
                             conformance_options=({"max_cap": 1}, {"leaf_capacity": 1}))
    with pytest.raises(ValueError, match=r"conformance_options \{'leaf_capacity': 1\} name 'leaf_capacity', "
                                         r"not an option of BETreeOptions \(its options: .*max_cap"):
        registry.register(toy)
    assert "toy" not in registry.names()


# ----------------------------------------------------------------- options
@pytest.mark.parametrize("options, error, message", [
    ({"segments": 3}, ValueError, "segments must be a power of two"),
    ({"segments": True}, ValueError, "segments must be a power of two"),
    ({"signature_bits": 128}, ValueError, "signature_bits"),
    ({"variant": "fast"}, ValueError, "variant must be 'full' or 'bs'"),
    ({"operand_ranks": "yes"}, TypeError, "operand_ranks"),
    ({"event_log": np.array([-1, 2])}, ValueError, "event_log"),
    ({"segmnets": 32}, TypeError, r"takes no option\(s\) \['segmnets'\]; its options are: .*segments"),
    ({"counting": "sort"}, TypeError, "option 'counting' of algorithm 'opindex' applies to backend 'cuda', not 'cpu'"),
    ({"device_memory": 1 << 20}, TypeError, "applies to backend 'cuda'"),
])
def test_bad_options_fail_when_the_index_is_made(options, error, message):
    with pytest.raises(error, match=message):
        Index(algorithm="opindex", backend="cpu", options=options)


def _crafted_logs():
    """Event logs in EventBatch form that the encoder never makes: offsets
    past the entries (a PS-Tree kernel read out of bounds and crashed the
    process), decreasing, not from 0; a negative attribute id (OpIndex
    failed at the first match)."""
    import dataclasses

    from engine.events import encode_events

    log = encode_events([{"a": 1, "b": 2}] * 4, Index(schema={"a": "numeric", "b": "numeric"}).schema)
    attr = log.attr.copy()
    attr[0] = -1
    return [dataclasses.replace(log, offsets=log.offsets + 10 ** 9), dataclasses.replace(log, offsets=log.offsets + 1),
            dataclasses.replace(log, offsets=log.offsets[::-1].copy()), dataclasses.replace(log, attr=attr),
            dataclasses.replace(log, offsets=log.offsets[:-1]), dataclasses.replace(log, value=log.value[:-1])]


@pytest.mark.parametrize("algorithm", ["opindex", "pstbloom", "psthash"])
def test_a_crafted_event_batch_log_fails_when_the_index_is_made(algorithm):
    for log in _crafted_logs():
        with pytest.raises(ValueError, match="event_log: not an EventBatch as engine.events.encode_events makes it"):
            Index(algorithm=algorithm, backend="cpu", options={"event_log": log})
    from engine.events import encode_events

    good = encode_events([{"a": 1, "b": 2}, {}, {"b": 0}], Index(schema={"a": "numeric", "b": "numeric"}).schema)
    index = Index(algorithm=algorithm, backend="cpu", options={"event_log": good})
    index.add_many([1, 2], ["a = 1 AND b > 0", "b = 2"])
    assert index.match({"a": 1, "b": 2}).tolist() == [1, 2]


def test_scan_takes_no_cpu_option_and_good_options_are_kept():
    with pytest.raises(TypeError, match="applies to backend 'cuda'"):
        Index(algorithm="scan", backend="cpu", options={"device_memory": 1 << 20})
    idx = Index(algorithm="opindex", backend="cpu", options={"variant": "bs", "segments": 8})
    assert idx._options == OpIndexOptions(variant="bs", segments=8)
    idx.add(1, "a = 1")
    assert idx.match({"a": 1}).tolist() == [1]


@pytest.mark.parametrize("bad", [0, -3, 2.5, True, "8"])
def test_dnf_limit_is_checked_when_the_index_is_made(bad):
    with pytest.raises(ValueError, match="dnf_limit must be a positive int"):
        Index(algorithm="opindex", backend="cpu", dnf_limit=bad)


# ---------------------------------------------------------------- residual
def _residual_index(**kwargs) -> tuple[Index, dict]:
    texts = {1: "x0 = 0 AND x1 = 1", 2: WIDE_XOR, 3: f"({WIDE_XOR}) OR y = 1", 4: "y = 1 OR x5 = 5"}
    idx = Index(algorithm="opindex", backend="cpu", dnf_limit=8, **kwargs)
    idx.add_many(list(texts), list(texts.values()))
    return idx, texts


EVENTS = [{"x0": 0, "x1": 1}, {"x0": 0}, {f"x{k}": k for k in range(6)}, {"x0": 0, "x1": 1, "x2": 2},
          {"y": 1}, {"x5": 5, "x3": 3}, {}, {f"x{k}": k for k in range(1, 6)}]


def check_exact(idx: Index, texts: dict) -> None:
    got = idx.match_batch(EVENTS)
    want = [reference_ids(texts, event) for event in EVENTS]
    assert [g.tolist() for g in got] == want
    assert any(want) and not all(want)


def test_an_expression_beyond_the_rewrite_limit_is_matched_by_the_residual_matcher():
    from engine.algorithms.opindex import check_expression
    with pytest.raises(ExpressionTooLarge):
        check_expression(__import__("engine.parse", fromlist=["parse"]).parse(WIDE_XOR), 8)
    idx, texts = _residual_index()
    assert idx.statistics()["residual"] == 2
    check_exact(idx, texts)                       # from the delta
    idx.merge()
    check_exact(idx, texts)                       # from the main segment: the residual matcher beside opindex
    from engine.algorithms.residual import ResidualMatcher
    matcher = idx._matcher
    assert isinstance(matcher, ResidualMatcher)
    assert matcher.native.segment.sub_ids.tolist() == [1, 4]
    assert matcher.residual.segment.sub_ids.tolist() == [2, 3]
    assert idx.statistics()["residual"] == 2


def test_residual_subscriptions_follow_removal_merge_save_and_subset(tmp_path):
    idx, texts = _residual_index()
    idx.merge()
    idx.match({})
    idx.remove(2)
    del texts[2]
    assert idx.statistics()["residual"] == 1 and idx.statistics()["tombstones"] == 1
    check_exact(idx, texts)
    idx.add(5, WIDE_XOR.replace("x0", "z"))
    texts[5] = WIDE_XOR.replace("x0", "z")
    idx.merge()                                   # derived: both halves through their own merged
    assert idx.statistics()["residual"] == 2
    check_exact(idx, texts)
    idx.save(tmp_path / "r.bexidx")
    loaded = Index.load(tmp_path / "r.bexidx")
    assert loaded.statistics()["residual"] == 2 and loaded.strict is False
    check_exact(loaded, texts)
    part = idx.subset([1, 3])
    assert part.statistics()["residual"] == 1
    check_exact(part, {k: texts[k] for k in (1, 3)})
    for sub_id in (3, 5):                         # the last residual ones go: the plain matcher again
        idx.remove(sub_id)
        del texts[sub_id]
    idx.merge()
    check_exact(idx, texts)
    assert idx.statistics()["residual"] == 0 and not hasattr(idx._matcher, "residual_pos")


def test_a_first_residual_subscription_merged_into_a_plain_index():
    idx = Index(algorithm="opindex", backend="cpu", dnf_limit=8)
    texts = {k: f"y = {k}" for k in range(1, 40)}
    idx.add_many(list(texts), list(texts.values()))
    idx.merge()
    idx.match({"y": 1})                           # the plain OpIndex matcher is built
    idx.add(100, WIDE_XOR)
    texts[100] = WIDE_XOR
    idx.merge()
    odd = {**{f"x{k}": k for k in range(5)}, "x5": 0}            # five TRUE, one FALSE: the XOR is TRUE
    assert [m.tolist() for m in idx.match_batch([{"y": 3}, odd])] == [[3], [100]]


def test_strict_refuses_what_the_algorithm_does_not_index_and_changes_nothing():
    idx = Index(algorithm="opindex", backend="cpu", dnf_limit=8, strict=True)
    idx.add(1, "a = 1")
    with pytest.raises(ExpressionTooLarge, match="dnf_limit=8"):
        idx.add_many([2, 3], ["b = 2", WIDE_XOR])
    assert len(idx) == 1 and 2 not in idx
    with pytest.raises(TypeError, match="strict must be True or False"):
        Index(strict="yes")
    scan = Index(algorithm="scan", backend="cpu", dnf_limit=8, strict=True)
    scan.add(1, WIDE_XOR)                         # scan has no rewrite limit
    assert scan.statistics()["residual"] == 0


def test_statistics_count_what_the_index_holds():
    idx = Index(algorithm="opindex", backend="cpu")
    stats = idx.statistics()
    assert stats == {"algorithm": "opindex", "backend": "cpu", "subscriptions": 0, "main": 0, "delta": 0,
                     "tombstones": 0, "residual": 0, "nbytes": stats["nbytes"], "device_nbytes": 0}
    idx.add_many(range(2000), [f"a = {k}" for k in range(2000)])      # past the merge threshold
    idx.add(5000, "b = 1")
    idx.remove(7)
    stats = idx.statistics()
    assert (stats["subscriptions"], stats["main"], stats["delta"], stats["tombstones"]) == (2000, 1999, 1, 1)
    assert stats["nbytes"] > 2000 * 8


# ------------------------------------------------------- saved structure
def test_load_uses_the_saved_structure_without_building(tmp_path, monkeypatch):
    idx = Index(algorithm="opindex", backend="cpu")
    texts = {k: f"a = {k % 7} AND b > {k % 5}" for k in range(300)}
    idx.add_many(list(texts), list(texts.values()))
    idx.save(tmp_path / "o.bexidx")
    matcher_class = registry.get("opindex").matcher_class("cpu")
    built = []
    monkeypatch.setattr(matcher_class, "build", classmethod(lambda cls, *a: built.append(a) or 1 / 0))
    loaded = Index.load(tmp_path / "o.bexidx")
    events = [{"a": k % 7, "b": k % 6} for k in range(40)]
    assert [m.tolist() for m in loaded.match_batch(events)] == [m.tolist() for m in idx.match_batch(events)]
    assert not built
    # options that shape the structure differently: built again, from the same subscriptions
    monkeypatch.undo()
    rebuilt = Index.load(tmp_path / "o.bexidx", options={"variant": "bs"})
    assert [m.tolist() for m in rebuilt.match_batch(events)] == [m.tolist() for m in idx.match_batch(events)]
    assert rebuilt._matcher.variant == "bs"


def test_every_matcher_follows_the_contract():
    for algorithm in registry.algorithms():
        for backend in algorithm.backends:
            cls = algorithm.matcher_class(backend) if backend == "cpu" else None
            if cls is None:
                continue
            assert issubclass(cls, Matcher)
            for member in ("build", "match", "merged", "recoded", "to_arrays", "from_arrays", "nbytes",
                           "device_nbytes"):
                assert hasattr(cls, member), (algorithm.name, member)


# ------------------------------------------------- cuda: programs too deep
@pytest.mark.cuda
@pytest.mark.parametrize("algorithm", ["scan", "opindex"])
def test_programs_too_deep_for_a_device_thread_are_residual_on_the_device(algorithm, monkeypatch):
    # residual, they go to the A-Tree, whose DAG has no depth limit: on the device as well
    from tests.test_cuda_sim import HAVE_CUDA
    if not HAVE_CUDA:
        pytest.skip("needs a CUDA GPU with CuPy, or numba's simulator (NUMBA_ENABLE_CUDASIM=1)")
    from gpu_kernels import scan
    from gpu_kernels.cuda_support import to_host
    monkeypatch.setattr(scan, "MAX_STACK_DEPTH", 3)        # (1024 on a device: a simulated thread is too slow)
    width = scan.MAX_STACK_DEPTH + 2
    wide = " AND ".join(f"a{k} >= 0" for k in range(width))     # accepted once, it broke every match
    idx = Index(algorithm=algorithm, backend="cuda")
    idx.add_many([1, 2, 3], [wide, "b = 1", "b = 1 AND a0 >= 0"])
    assert idx.statistics()["residual"] == 1
    full = {**{f"a{k}": 1 for k in range(width)}, "b": 1}
    for _ in range(2):                            # from the delta, then from the merged main segment
        assert [m.tolist() for m in idx.match_batch([{"b": 1}, full, {"a0": 1}])] == [[2], [1, 2, 3], []]
        events, ids = idx.match_batch([full, {"b": 1}], output="device")
        # to_host, not np.asarray: CuPy refuses the implicit copy (seen on an H100; the simulator's arrays are NumPy's)
        assert to_host(events).tolist() == [0, 0, 0, 1] and to_host(ids).tolist() == [1, 2, 3, 2]
        idx.merge()
    assert idx._matcher.residual.backend == "cuda" and idx._matcher.native.backend == "cuda"
    assert idx._matcher.residual.name == "atree"
    atree = Index(algorithm="atree", backend="cuda")         # the A-Tree itself: no stack, nothing residual
    atree.add_many([1, 2], [wide, "b = 1"])
    atree.merge()
    assert atree.statistics()["residual"] == 0 and [m.tolist() for m in atree.match_batch([full, {}])] == [[1, 2], []]
    with pytest.raises(ExpressionTooLarge, match="subscription 7 needs an operand stack"):
        Index(algorithm=algorithm, backend="cuda", strict=True).add(7, wide)
    # the bulk ways in: many texts (read into the columnar form) and the columnar form itself
    import pyarrow as pa

    from engine.index import _COLUMNAR_TEXTS_FROM
    bulk = Index(algorithm=algorithm, backend="cuda")
    bulk.add_many(range(_COLUMNAR_TEXTS_FROM + 1), [wide] + ["b = 1"] * _COLUMNAR_TEXTS_FROM)
    assert bulk.statistics()["residual"] == 1
    table = pa.table({"sub_id": [9] * width + [10], "attr": [f"a{k}" for k in range(width)] + ["b"],
                      "op": [">="] * width + ["="], "value": [0.0] * width + [1.0]})
    columnar = Index(algorithm=algorithm, backend="cuda")
    columnar.add_many(table)
    assert columnar.statistics()["residual"] == 1
    with pytest.raises(ExpressionTooLarge, match="subscription 9 needs an operand stack"):
        Index(algorithm=algorithm, backend="cuda", strict=True).add_many(table)


def test_statistics_are_of_one_snapshot_while_another_thread_updates(monkeypatch):
    """statistics() reads the index's state once: an update landing while it
    runs (here: at the moment it reads the delta's size) changes none of
    its fields, ``nbytes`` included."""
    from engine.snapshot import Snapshot

    idx = Index(algorithm="opindex", backend="cpu")
    idx.add_many(range(2000), [f"a = {k} AND b < {k % 7}" for k in range(2000)])
    idx.match({})
    before = idx.statistics()
    real = Snapshot.delta_size
    landed = []

    def update_meanwhile(state):
        if not landed:
            landed.append(True)
            idx.add_many(range(5000, 5600), [f"c = {k} OR d > 'x{k}'" for k in range(600)])
        return real.fget(state)
    monkeypatch.setattr(Snapshot, "delta_size", property(update_meanwhile))
    during = idx.statistics()
    assert landed and during == before
    after = idx.statistics()
    assert (after["subscriptions"], after["delta"]) == (2600, 600) and after["nbytes"] != before["nbytes"]


@pytest.mark.parametrize("empty", [[], (), np.zeros(0, np.int64)])
def test_an_empty_event_log_of_counts_is_no_counts(empty):
    """``event_log=[]`` (a float64 array to NumPy) is taken as no counts,
    as ``np.zeros(0, int)`` is; a non-empty float list is still refused."""
    index = Index(algorithm="opindex", backend="cpu", options={"event_log": empty})
    index.add_many([1, 2], ["a = 1 AND b > 0", "b = 2"])
    assert index.match({"a": 1, "b": 2}).tolist() == [1, 2]
    with pytest.raises(ValueError, match="event_log must be"):
        Index(algorithm="opindex", backend="cpu", options={"event_log": [1.0, 2.0]})
