"""``opindex`` saved with the index: ``to_arrays`` -> ``from_arrays``.

A restored matcher matches exactly as the built one, and its ``merged`` and
``recoded`` derive exactly the indexes the built one's do (the update
bookkeeping survives the trip); a dictionary grown since the save is
followed on restore.  Every array a file could carry is checked: truncated,
of the wrong dtype, an index out of bounds, offsets that decrease, meta or
options that do not fit -- each a ValueError, before any kernel.  The cuda
twin restores the host index and uploads it (simulator: tiny cases).

    NUMBA_ENABLE_CUDASIM=1 pytest -m cuda tests/test_opindex_saved.py
"""

from __future__ import annotations

import json
import math
from unittest import mock

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from engine import Index
from engine.algorithms.base import BuildSettings
from engine.algorithms.opindex import OpIndexBSMatcher, OpIndexMatcher
from engine.algorithms.options import OpIndexOptions
from engine.compile import PredicateTable, Segment
from engine.parse import parse
from gpu_kernels import opcodes
from gpu_kernels.opindex.layout import OpIndexArrays
from tests import strategies
from tests.test_opindex_updates import HYPOTHESIS, SCHEMA, expected, run_matcher

#: every route: plain, IN, BETWEEN, DNF, CNF (dnf_limit=4), IS NULL at counter 0,
#: always-checked, PREFIX and VERIFY lists, negations (XOR); the largest operands of both kinds
#: in '=' lists (so that dropping one from the saved operand sets shows)
EXPRESSIONS = [
    "n0 = 1 AND s0 = 'ab'", "n1 IN (1, 2, 3) AND s1 != 'zb'", "n2 BETWEEN 0 AND 3", "n0 > 2 OR s1 < 'b'",
    "(n0 = 1 OR n1 = 2) AND (s0 = 'ab' OR s1 = 'zb') AND (n2 < 5 OR b0 = TRUE)",
    "s0 LIKE 'a%' AND n1 IS NULL", "n0 IS NULL", "s1 NOT LIKE '%z%' AND n0 >= 0", "NOT (n0 > 1 AND n1 < 0)",
    "s0 LIKE 'ca%'", "n0 NOT IN (0, 1) AND s1 IN ('a', 'zb')", "(n0 = 1 XOR s0 LIKE 'a%') AND n2 > 0",
    "n2 = 1000000", "s0 = '~~~' AND n1 = 1000000",
]
EVENTS = [{"n0": 1, "n1": 1, "s0": "ab", "s1": "zb", "b0": True}, {"n0": 3, "n2": 2.5, "s0": "cab"}, {},
          {"n1": -1, "s1": "a", "b0": False, "n2": 0.5}, {"n0": 0, "s0": "b", "s1": "ba", "n1": 7.75},
          {"n2": 1000000, "s0": "~~~", "n1": 1000000}, {"s0": "abc", "n0": 4, "s1": "q"}]


# ----------------------------------------------------------------- helpers
def built(exprs, options=None, dnf_limit=None):
    """An index of ``exprs`` (ids 0..), merged and matched once: its opindex
    matcher (the native half when some expression is residual)."""
    kw = {} if dnf_limit is None else {"dnf_limit": dnf_limit}
    index = Index(algorithm="opindex", backend="cpu", schema=SCHEMA, options=options or None, **kw)
    index.add_many(list(range(len(exprs))), list(exprs))
    index.merge()
    index.match({})
    matcher = index._matcher
    return index, getattr(matcher, "native", matcher)


def parsed(texts) -> dict:
    return {i: parse(t) for i, t in enumerate(texts)}


def build_settings(matcher, schema=None, options=None) -> BuildSettings:
    options = OpIndexOptions(**(options or {}))
    return BuildSettings(matcher.schema if schema is None else schema, matcher.dnf_limit, options)


def saved(matcher):
    """What a file gives back: meta through JSON, arrays as fresh copies."""
    meta, arrays = matcher.to_arrays()
    return json.loads(json.dumps(meta)), {name: np.array(a, copy=True) for name, a in arrays.items()}


def reloaded(segment: Segment, schema) -> Segment:
    """The segment as a loaded file gives it: new arrays, predicates coded under ``schema``."""
    table = PredicateTable(*(np.array(c, copy=True) for c in segment.predicates.key_columns()))
    return Segment(segment.sub_ids.copy(), segment.prog_offsets.copy(), segment.prog_kind.copy(),
                   segment.prog_arg.copy(), table, segment.max_depth, segment.residual).coded(schema)


def restored(matcher, options=None, cls=OpIndexMatcher):
    meta, arrays = saved(matcher)
    return cls.from_arrays(reloaded(matcher.segment, matcher.schema), build_settings(matcher, options=options),
                           meta, arrays)


def same_array(a, b) -> bool:
    return a.dtype == b.dtype and a.shape == b.shape and np.array_equal(a, b, equal_nan=a.dtype.kind == "f")


def assert_same_matcher(a: OpIndexMatcher, b: OpIndexMatcher) -> None:
    """Equal indexes and equal update bookkeeping."""
    for name in OpIndexArrays._fields:
        x, y = getattr(a.arrays, name), getattr(b.arrays, name)
        assert same_array(x, y) if isinstance(x, np.ndarray) else x == y, name
    for name in ("_sub_form", "_sub_freq", "_vals_plain", "_vals_string", "_attr_key", "_string_attr"):
        assert same_array(getattr(a, name), getattr(b, name)), name
    for key in a._x:
        assert same_array(a._x[key], b._x[key]), key
    for name in ("merges", "_churn", "_built_subs", "_n_strings", "_has_prefix", "n_attrs", "form_counts",
                 "_negated", "variant", "n_segments", "signature_bits", "operand_ranks", "dnf_limit"):
        assert getattr(a, name) == getattr(b, name), name


def spying(method: str):
    """Patch ``OpIndexMatcher.<method>`` to record (self, args, result)."""
    calls = []
    real = getattr(OpIndexMatcher, method)

    def spy(self, *args):
        out = real(self, *args)
        calls.append((self, args, out))
        return out
    return calls, real, mock.patch.object(OpIndexMatcher, method, spy)


# ------------------------------------------------------------- round trips
@pytest.mark.parametrize("options", [{}, {"variant": "bs"}, {"operand_ranks": False, "segments": 1,
                                                             "signature_bits": 2}])
@settings(max_examples=12, **HYPOTHESIS)
@given(exprs=st.lists(strategies.expressions(max_leaves=8).filter(strategies.fits_normal_form), min_size=1,
                      max_size=12),
       events=st.lists(strategies.events(), min_size=1, max_size=8))
def test_round_trip_matches_as_built(options, exprs, events):
    index, matcher = built(exprs, options)
    back = restored(matcher, options)
    assert_same_matcher(back, matcher)
    assert run_matcher(back, matcher.schema, events) == run_matcher(matcher, matcher.schema, events) \
        == expected(dict(enumerate(exprs)), events)
    assert back.nbytes == matcher.nbytes and back.to_arrays()[0] == saved(matcher)[0]


def test_round_trip_of_every_route_and_of_opindex_bs():
    index, matcher = built(EXPRESSIONS, dnf_limit=4)
    assert all(matcher.form_counts[form] for form in ("plain", "dnf", "cnf", "always"))
    assert len(matcher.post_attr) and matcher.list_offsets[-1] > 0 and matcher._negated
    back = restored(matcher)
    assert_same_matcher(back, matcher)
    assert run_matcher(back, matcher.schema, EVENTS) == expected(parsed(EXPRESSIONS), EVENTS)
    bs = OpIndexBSMatcher(matcher.segment, schema=matcher.schema, dnf_limit=4)
    bs_back = restored(bs, cls=OpIndexBSMatcher)
    assert type(bs_back) is OpIndexBSMatcher and bs_back.variant == "bs" and not bs_back.arrays.use_sig
    assert_same_matcher(bs_back, bs)


@settings(max_examples=10, **HYPOTHESIS)
@given(first=st.lists(strategies.expressions(max_leaves=8).filter(strategies.fits_normal_form), min_size=2,
                      max_size=10),
       more=st.lists(strategies.expressions(max_leaves=8).filter(strategies.fits_normal_form), min_size=1,
                     max_size=6),
       events=st.lists(strategies.events(), min_size=1, max_size=6), data=st.data())
def test_merged_and_recoded_after_restore_equal_the_built_ones(first, more, events, data):
    """The Index's merges and recodes, replayed on the restored matcher,
    derive exactly what the built matcher derived."""
    index, matcher = built(first)
    back = restored(matcher)
    removed = data.draw(st.sets(st.sampled_from(range(len(first))), max_size=len(first) - 1))
    merges, real_merged, merge_spy = spying("merged")
    recodes, real_recoded, recode_spy = spying("recoded")
    with merge_spy, recode_spy, mock.patch.object(OpIndexMatcher, "REBUILD_SHARE", math.inf):
        for sub_id in removed:
            index.remove(sub_id)
        index.add_many(list(range(100, 100 + len(more))), more)     # strings may grow the dictionary
        index.merge()
        index.match({})
        calls = [(args, out) for self, args, out in merges + recodes if self is matcher]
        assert calls
        for args, out in calls:
            again = (real_merged if len(args) == 4 else real_recoded)(back, *args)
            assert_same_matcher(again, out)
            assert run_matcher(again, again.schema, events) == run_matcher(out, out.schema, events)


def test_restore_follows_a_dictionary_grown_since_the_save():
    """Saved before new strings moved the codes: restored under the grown
    dictionary, the operands and PREFIX intervals are re-encoded (as
    ``recoded`` does), and matching is exact under the new codes."""
    index, matcher = built(EXPRESSIONS, dnf_limit=4)
    meta, arrays = saved(matcher)
    index.add(500, "s0 = 'aa' OR s1 IN ('!', 'ca', 'zz')")        # strings before, between and after
    schema = index.schema.view()
    assert schema.n_strings > meta["strings"]
    back = OpIndexMatcher.from_arrays(reloaded(matcher.segment, schema), build_settings(matcher, schema), meta,
                                      arrays)
    assert back._n_strings == schema.n_strings
    assert_same_matcher(back, matcher.recoded(matcher.segment.coded(schema), schema))
    assert run_matcher(back, schema, EVENTS) == expected(parsed(EXPRESSIONS), EVENTS)


# ----------------------------------------------------------- crafted files
@pytest.fixture(scope="module")
def sample():
    index, matcher = built(EXPRESSIONS, dnf_limit=4)
    return matcher, saved(matcher)


def restore(matcher, meta, arrays, options=None, segment=None):
    segment = reloaded(matcher.segment, matcher.schema) if segment is None else segment
    return OpIndexMatcher.from_arrays(segment, build_settings(matcher, options=options), meta, arrays)


#: arrays holding indexes into others, and a value out of bounds for each
def _out_of_bounds(matcher) -> dict:
    a = matcher.arrays
    n_x = len(a.x_op)
    return {"pivot_of_attr": len(a.part_counter_start) - 1, "counter_sub": len(matcher.segment),
            "slot_counter": len(a.counter_init), "list_shift": 64, "list_bucket_base": len(a.bucket_run_start),
            "list_side_base": len(a.side_pid) + 1, "bucket_run_start": len(a.run_attr) + 1,
            "run_attr": len(a.pivot_of_attr), "ent_target": np.iinfo(a.ent_target.dtype).max,
            "side_pid": n_x, "always_pos": len(matcher.segment), "negated_pid": len(matcher.segment.predicates),
            "ent_val": 2 * len(a.vals) + 1, "part_counter_start": len(a.counter_init) + 1,
            "run_start": len(a.ent_val) + 1, "list_offsets": len(a.ent_val) + 1, "sub_form": 5,
            "counter_post_start": len(a.post_attr) + 1, "part_slot_start": len(a.slot_counter) + 1}


OFFSETS = ("part_counter_start", "part_slot_start", "counter_post_start", "list_offsets", "run_start",
           "bucket_run_start")


def test_the_sample_restores_and_uses_every_array(sample):
    matcher, (meta, arrays) = sample
    assert_same_matcher(restore(matcher, meta, arrays), matcher)
    assert all(len(a) for a in arrays.values()), [k for k, a in arrays.items() if not len(a)]
    assert set(_out_of_bounds(matcher)) <= set(arrays) and set(OFFSETS) <= set(arrays)


def test_every_truncated_array_is_refused(sample):
    matcher, (meta, arrays) = sample
    for name in arrays:
        crafted = {**arrays, name: arrays[name][:-1]}
        with pytest.raises(ValueError, match="saved OpIndex structure"):
            restore(matcher, meta, crafted)
        crafted = {**arrays, name: arrays[name][:0]}
        with pytest.raises(ValueError, match="saved OpIndex structure"):
            restore(matcher, meta, crafted)


def test_every_wrong_dtype_is_refused(sample):
    matcher, (meta, arrays) = sample
    for name, a in arrays.items():
        for dtype in (np.float32, np.int64 if a.dtype.kind == "f" else np.float64, np.uint8):
            if dtype == a.dtype or (name in ("counter_sub", "side_pid") and dtype == np.int64):
                continue
            crafted = {**arrays, name: a.astype(dtype)}
            with pytest.raises(ValueError, match="saved OpIndex structure"):
                restore(matcher, meta, crafted)
        with pytest.raises(ValueError, match="saved OpIndex structure"):
            restore(matcher, meta, {**arrays, name: np.stack([a, a])})         # 2-D


def test_every_index_out_of_bounds_is_refused(sample):
    matcher, (meta, arrays) = sample
    for name, bad in _out_of_bounds(matcher).items():
        a = arrays[name].copy()
        for at in (0, len(a) // 2, -1):
            crafted = a.copy()
            crafted[at] = bad
            if np.array_equal(crafted, a):
                continue
            with pytest.raises(ValueError, match="saved OpIndex structure"):
                restore(matcher, meta, {**arrays, name: crafted})
        if a.dtype.kind == "i" and name not in ("ent_target", "list_side_base"):
            crafted = a.copy()
            crafted[len(a) // 2] = -2
            with pytest.raises(ValueError, match="saved OpIndex structure"):
                restore(matcher, meta, {**arrays, name: crafted})


def test_offsets_that_decrease_are_refused(sample):
    matcher, (meta, arrays) = sample
    for name in OFFSETS:
        a = arrays[name]
        step = np.flatnonzero(np.diff(a) > 0)
        assert len(step), name
        crafted = a.copy()
        k = step[len(step) // 2]
        crafted[k], crafted[k + 1] = a[k + 1], a[k]         # a decrease, same ends
        if k == 0:
            crafted[0] = a[0]
            crafted[1] = a[0] - 1
        with pytest.raises(ValueError, match="saved OpIndex structure"):
            restore(matcher, meta, {**arrays, name: crafted})


def test_meta_segment_and_options_that_do_not_fit_are_refused(sample):
    matcher, (meta, arrays) = sample
    for key in meta:
        with pytest.raises(ValueError, match="saved OpIndex structure"):
            restore(matcher, {k: v for k, v in meta.items() if k != key}, arrays)
    for key, value in (("format", 99), ("subscriptions", 3), ("predicates", 1), ("attributes", 10 ** 12),
                       ("strings", 10 ** 6), ("strings", -1), ("use_rank", False), ("segments", "32"),
                       ("merges", -1), ("churn", True), ("attributes", 0)):
        with pytest.raises(ValueError, match="saved OpIndex structure"):
            restore(matcher, {**meta, key: value}, arrays)
    for options in ({"segments": 16}, {"signature_bits": 32}, {"variant": "bs"}, {"operand_ranks": False},
                    {"event_log": np.ones(6, np.int64)}):
        with pytest.raises(ValueError, match="built with other"):
            restore(matcher, meta, arrays, options)
    with pytest.raises(ValueError, match="built with other dnf_limit"):
        OpIndexMatcher.from_arrays(reloaded(matcher.segment, matcher.schema),
                                   BuildSettings(matcher.schema, 8, OpIndexOptions()), meta, arrays)
    other = built(EXPRESSIONS[:-1], dnf_limit=4)[1]
    with pytest.raises(ValueError, match="subscriptions"):
        restore(matcher, meta, arrays, segment=other.segment)
    forms = arrays["sub_form"].copy()
    forms[np.flatnonzero(forms == 0)[0]] = 1                   # a plain conjunction said to be a DNF
    with pytest.raises(ValueError, match="plain conjunctions"):
        restore(matcher, meta, {**arrays, "sub_form": forms})
    with pytest.raises(ValueError, match="unknown"):
        restore(matcher, meta, {**arrays, "extra": np.zeros(1)})


def test_a_matcher_without_a_schema_is_not_saved():
    index, matcher = built(EXPRESSIONS[:3])
    assert OpIndexMatcher(matcher.segment).to_arrays() is None


# ------------------------------------------------------------- cuda twin
@pytest.mark.cuda
def test_cuda_twin_restores_the_host_index_and_uploads_it():
    from tests.test_cuda_sim import HAVE_CUDA
    if not HAVE_CUDA:
        pytest.skip("needs a CUDA GPU with CuPy, or numba's simulator (NUMBA_ENABLE_CUDASIM=1)")
    from engine.algorithms.opindex_cuda import OpIndexCudaMatcher
    from gpu_kernels.cuda_support import LaunchConfig
    exprs = EXPRESSIONS[:6]
    index, host = built(exprs, dnf_limit=4)
    launch = LaunchConfig(block=(4, 1), max_grid=(4, 1), compaction_tile=64)
    options = OpIndexOptions(launch=launch)
    cuda_matcher = OpIndexCudaMatcher(host.segment, "cuda", schema=host.schema, dnf_limit=4, launch=launch)
    meta, arrays = saved(cuda_matcher)
    segment = reloaded(host.segment, host.schema)
    back = OpIndexCudaMatcher.from_arrays(segment, BuildSettings(host.schema, 4, options), meta, arrays)
    assert_same_matcher(back.host, host)
    assert back.device_nbytes == cuda_matcher.device_nbytes > 0
    events = EVENTS[:3]
    assert run_matcher(back, host.schema, events) == run_matcher(cuda_matcher, host.schema, events) \
        == expected(parsed(exprs), events)
    with pytest.raises(ValueError, match="saved OpIndex structure"):
        OpIndexCudaMatcher.from_arrays(segment, BuildSettings(host.schema, 4, options), meta,
                                       {**arrays, "side_pid": arrays["side_pid"][:-1]})


def test_an_index_built_with_an_event_log_loads_without_it(tmp_path):
    """The log is not saved with the index: loading without one restores the
    structure its pivots came from (it was refused as 'built with other
    event_log', by Index.load and by `bexmatch match --subs` alike)."""
    texts = ["a = 1 AND b = 2", "b > 0", "a IN (1, 3) AND c < 5", "NOT b = 2"]
    index = Index(algorithm="opindex", backend="cpu", options={"event_log": np.array([5, 1, 9], np.int64)})
    index.add_many(range(len(texts)), texts)
    path = tmp_path / "logged.bexidx"
    index.save(path)
    events = [{"a": 1, "b": 2}, {"a": 3, "b": 0, "c": 1}, {"b": 7}, {}]
    want = [m.tolist() for m in index.match_batch(events)]
    with mock.patch.object(OpIndexMatcher, "__init__", side_effect=AssertionError("rebuilt, not restored")):
        loaded = Index.load(path)
        assert [m.tolist() for m in loaded.match_batch(events)] == want
    for options in ({"event_log": np.array([1, 5, 9], np.int64)}, {"event_log": np.array([5, 1, 9], np.int64)}):
        assert [m.tolist() for m in Index.load(path, options=options).match_batch(events)] == want


def test_a_verify_entry_naming_a_predicate_of_another_attribute_is_refused():
    """A VERIFY entry is tested on the event's value and list token of its
    run's attribute: re-pointed (its checksum recomputed) at the list
    predicate of another attribute, it read a string's token as a list row
    and crashed the process at the first match.  The load refuses it; the
    entries as built pass."""
    schema = {"ln": "list<numeric>", "t": "string", "a": "numeric"}
    index = Index(algorithm="opindex", backend="cpu", schema=schema)
    index.add_many([1, 2, 3], ["t IS NOT NULL AND a > 1", "ln IS EMPTY", "t != 'q' AND t IS NOT NULL"])
    index.merge()
    index.match({})
    matcher = index._matcher
    meta, arrays = matcher.to_arrays()
    segment = reloaded(matcher.segment, matcher.schema)
    settings = build_settings(matcher)
    assert OpIndexMatcher.from_arrays(segment, settings, meta, arrays).arrays.side_pid.tolist() == \
        matcher.arrays.side_pid.tolist()
    list_pid = int(np.flatnonzero(matcher.segment.predicates.op == opcodes.IS_EMPTY)[0])
    crafted = {**arrays, "side_pid": np.full_like(arrays["side_pid"], list_pid)}
    assert len(crafted["side_pid"]) and not np.array_equal(crafted["side_pid"], arrays["side_pid"])
    with pytest.raises(ValueError, match="names a predicate of another attribute than its run's"):
        OpIndexMatcher.from_arrays(segment, settings, meta, crafted)
