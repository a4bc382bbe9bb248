"""engine.workloads: the papers' generators hit their controlled parameters
(docs/architecture.md#workloads-and-benchmarks), produce the columnar subscription form that Index ingests,
and are deterministic by seed."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest

from engine import Index
from engine import workloads as W

SMALL = {"W1": 0.002, "W2": 0.002, "W3": 0.002, "W4": 0.001, "W6": 0.002}
OPS = {"=", "!=", "<", "<=", ">", ">=", "in", "not in", "between"}


@pytest.fixture(scope="module")
def small():
    return {name: W.standard(name, scale=scale, n_events=120) for name, scale in SMALL.items()}


def dense_events(events: pa.Table) -> np.ndarray:
    """(events x attributes) int64, -1 = absent, columns by attribute number
    (events in the map layout are spread into columns first)."""
    if events.num_columns == 1 and pa.types.is_map(events.schema.types[0]):
        rows = events.column(0).to_pylist()
        names = sorted({k for pairs in rows for k, _ in pairs}, key=lambda k: int(k[1:]))
        events = pa.table({k: pa.array([dict(pairs).get(k) for pairs in rows], pa.int64()) for k in names})
    dims = max(int(name[1:]) for name in events.column_names) + 1
    out = np.full((events.num_rows, dims), -1, dtype=np.int64)
    for name in events.column_names:
        out[:, int(name[1:])] = pc.fill_null(events[name], -1).to_numpy()
    return out


def match_rate(workload) -> tuple[float, list]:
    index = Index(algorithm="scan")
    index.add_many(workload.subscriptions)
    result = index.match_batch(workload.events)
    return sum(len(r) for r in result) / (workload.n_events * workload.n_subscriptions), result


def op_shares(workload) -> dict:
    counts = pc.value_counts(workload.subscriptions["op"]).to_pylist()
    total = workload.subscriptions.num_rows
    return {c["values"]: c["counts"] / total for c in counts}


def consecutive_share(workload) -> float:
    """Mean share of (attribute, value) pairs an event shares with the next."""
    dense = dense_events(workload.events)
    shared = ((dense[1:] == dense[:-1]) & (dense[1:] >= 0)).sum(axis=1)
    return float(shared.mean() / workload.params["event_size"])


# ------------------------------------------------------------ shape and types
@pytest.mark.parametrize("name", sorted(SMALL))
def test_shapes_and_dtypes(small, name):
    w = small[name]
    subs, events = w.subscriptions, w.events
    expected_subs = max(1, round(W.STANDARD_WORKLOADS[name][2]["n_subs"] * SMALL[name]))
    assert w.n_subscriptions == expected_subs and w.n_events == 120
    assert subs.schema.field("sub_id").type == pa.int64()
    assert subs.schema.field("attr").type == pa.string() and subs.schema.field("op").type == pa.string()
    for column in ("value", "value_hi"):
        assert subs.schema.field(column).type == pa.int64()
    assert pa.types.is_list(subs.schema.field("values").type)
    sub_id = subs["sub_id"].to_numpy()
    assert (np.diff(sub_id) >= 0).all() and set(np.unique(sub_id)) == set(range(expected_subs))
    ops = np.array(subs["op"].to_pylist())
    assert set(ops) <= OPS
    card, dims = w.params["cardinality"], w.params["dims"]
    attrs = np.array([int(a[1:]) for a in subs["attr"].to_pylist()])
    assert all(a.startswith("a") for a in subs["attr"].to_pylist()[:50])
    assert ((attrs >= 0) & (attrs < dims)).all()
    is_set = np.isin(ops, ["in", "not in"])
    value = subs["value"]
    assert (value.is_null().to_numpy(zero_copy_only=False) == is_set).all()
    v = pc.fill_null(value, 0).to_numpy()
    assert ((v >= 0) & (v < card)).all()
    between = ops == "between"
    hi = subs["value_hi"]
    assert (hi.is_valid().to_numpy(zero_copy_only=False) == between).all()
    assert (pc.fill_null(hi, 0).to_numpy()[between] >= v[between]).all()
    lists = subs["values"]
    assert (lists.is_valid().to_numpy(zero_copy_only=False) == is_set).all()
    if is_set.any():
        flat = pc.list_flatten(lists).to_numpy()
        assert ((flat >= 0) & (flat < card)).all()
        assert (pc.list_value_length(lists).to_numpy(zero_copy_only=False)[is_set] >= 1).all()
    # no attribute twice in a subscription
    pairs = sub_id * (dims + 1) + attrs
    assert len(np.unique(pairs)) == len(pairs)

    if w.params.get("event_layout") == "map":     # sparse events: one map column, attribute name -> value
        assert events.column_names == [W.EVENTS_MAP_COLUMN]
        assert events.schema.types[0] == pa.map_(pa.string(), pa.int64())
    else:
        assert all(t == pa.int64() for t in events.schema.types)
        assert all(name.startswith("a") for name in events.column_names)
    dense = dense_events(events)
    sizes = (dense >= 0).sum(axis=1)
    if w.params["generator"] == "begen":
        assert (sizes == w.params["event_size"]).all()
    else:
        assert ((sizes >= 1) & (sizes <= w.params["m"])).all()
    assert (dense < card).all()


@pytest.mark.parametrize("name", sorted(SMALL))
def test_index_ingests_every_standard_workload(small, name):
    w = small[name]
    index = Index(algorithm="scan")
    index.add_many(w.subscriptions)
    assert len(index) == w.n_subscriptions
    assert len(index.match_batch(w.events.slice(0, 10))) == 10


def test_default_event_counts_and_scale_floor():
    w = W.standard("W1", scale=1e-9)
    assert w.n_subscriptions == 1 and w.n_events == 100
    assert W.standard("w3", scale=1e-9).n_events == 100


# ------------------------------------------------ controlled parameters: BE-Gen
def test_w1_matching_probability_hits_target():
    w = W.standard("W1", scale=0.01, n_events=200)
    rate, _ = match_rate(w)
    assert w.params["match_prob"] == 0.01
    assert abs(rate - 0.01) <= 0.2 * 0.01, rate


def test_dense_w2_matching_probability_accounts_for_chance_matches():
    w = W.standard("W2", scale=0.005, n_events=200)
    rate, _ = match_rate(w)
    assert w.params["chance_match_prob"] > 0.001        # dense: other bases' subscriptions match too
    assert abs(rate - 0.01) <= 0.2 * 0.01, rate


@pytest.mark.parametrize("op_class", ["low", "med", "high"])
def test_subscriptions_hold_on_the_events_of_their_base(op_class):
    # every inferred predicate is implied by its base predicate: an event
    # matches at least all subscriptions of its base
    w = W.begen(600, 60, dims=40, cardinality=12, sub_size=4, event_size=8, op_class=op_class, eq_share=0.1,
                match_prob=0.1, seed=3)
    _, result = match_rate(w)
    n_base = w.params["n_base"]
    assert min(len(r) for r in result) >= 600 // n_base


def test_literal_begen_events_are_base_expressions():
    # filler=0: the paper's scheme, events are copies of the base expressions
    w = W.begen(2000, 200, filler=0, match_prob=0.02, seed=9)
    dense = dense_events(w.events)
    assert len({tuple(row) for row in dense}) <= w.params["n_base"] == 50
    rate, _ = match_rate(w)
    assert abs(rate - 0.02) <= 0.2 * 0.02


def test_operator_classes_and_equality_share():
    assert set(op_shares(W.begen(300, 10, op_class="min"))) == {"="}
    assert set(op_shares(W.begen(300, 10, op_class="low"))) == {"=", "in"}
    assert set(op_shares(W.begen(3000, 10, op_class="med"))) == {"<", "<=", "=", ">=", ">", "in", "between"}
    assert set(op_shares(W.begen(3000, 10, op_class="high"))) == OPS
    for eq in (0.2, 0.6):
        shares = op_shares(W.begen(4000, 10, eq_share=eq, op_class="high", seed=1))
        assert abs(shares["="] - eq) < 0.02


def test_between_width_and_set_sizes():
    w = W.begen(6000, 10, cardinality=100, range_share=0.12, eq_share=0.0, op_class="high", seed=2)
    subs = w.subscriptions
    between = pc.equal(subs["op"], "between")
    lo = pc.filter(subs["value"], between).to_numpy()
    hi = pc.filter(subs["value_hi"], between).to_numpy()
    assert 9 <= (hi - lo + 1).mean() <= 15                 # 12 % of 100 on average
    lengths = pc.list_value_length(subs["values"]).to_numpy(zero_copy_only=False)
    assert np.nanmax(lengths) <= 6


def test_subscription_and_event_sizes():
    w = W.begen(5000, 50, sub_size=7, event_size=15, seed=4)
    sizes = np.bincount(w.subscriptions["sub_id"].to_numpy())
    assert abs(sizes.mean() - 7) < 0.2 and sizes.min() >= 1
    ads = W.begen(5000, 50, dims=122, sub_size=8, sub_size_max=56, event_size=20, zipf=1.0, match_prob=0.05, seed=4)
    sizes = np.bincount(ads.subscriptions["sub_id"].to_numpy())
    assert sizes.min() >= 1 and sizes.max() <= 56 and abs(sizes.mean() - 8) < 0.5


def test_stream_similarity_is_observable():
    shares = [consecutive_share(W.begen(200, 600, similarity=s, sorted_stream=True, seed=5))
              for s in (0.1, 0.5, 0.9)]
    assert shares[0] < shares[1] < shares[2]
    assert shares[2] > 0.6 and shares[0] < 0.2
    # identical replicas at similarity 1
    assert consecutive_share(W.begen(200, 600, similarity=1.0, sorted_stream=True, seed=5)) > 0.85


def test_shuffled_stream_holds_the_same_events():
    kw = dict(similarity=0.7, seed=6)
    ordered = dense_events(W.begen(200, 400, sorted_stream=True, **kw).events)
    shuffled_w = W.begen(200, 400, sorted_stream=False, **kw)
    shuffled = dense_events(shuffled_w.events)
    assert sorted(map(tuple, ordered)) == sorted(map(tuple, shuffled))
    assert consecutive_share(shuffled_w) < 0.3


def test_similarity_lowers_matching_probability_as_in_apcm():
    w6 = W.standard("W6", scale=0.005, n_events=200)
    rate, _ = match_rate(w6)
    assert rate < 0.005
    assert abs(rate - w6.params["expected_match_prob"]) < 0.5 * w6.params["expected_match_prob"] + 1e-4


def attribute_skew(subs: pa.Table) -> float:
    counts = np.array([c["counts"] for c in pc.value_counts(subs["attr"]).to_pylist()])
    return counts.max() / np.median(counts)


def test_zipf_skew_is_observable():
    uniform = W.begen(20000, 10, match_prob=0.001, zipf=None, seed=7)
    zipf = W.begen(20000, 10, match_prob=0.001, zipf=1.0, seed=7)
    assert attribute_skew(uniform.subscriptions) < 3
    assert attribute_skew(zipf.subscriptions) > 20
    op_uniform = W.opindex_gen(20000, 10, dims=500, seed=7)
    op_zipf = W.opindex_gen(20000, 10, dims=500, zipf=1.0, seed=7)
    assert attribute_skew(op_uniform.subscriptions) < 3 < 20 < attribute_skew(op_zipf.subscriptions)
    values = np.bincount(op_zipf.subscriptions["value"].to_numpy(), minlength=50)
    assert values[0] > 10 * np.median(values)             # operands are Zipf too


# ------------------------------------------------ controlled parameters: OpIndex
@pytest.mark.parametrize("theta", [0.4, 0.8])
def test_opindex_equality_share(theta):
    w = W.opindex_gen(20000, 50, dims=2000, cardinality=50, gamma_max=8, m=40, theta=theta, seed=8)
    shares = op_shares(w)
    assert set(shares) <= {"=", "<=", ">="}
    assert abs(shares["="] - theta) < 0.015
    assert abs(shares["<="] - shares[">="]) < 0.02
    sizes = np.bincount(w.subscriptions["sub_id"].to_numpy())
    assert sizes.min() >= 1 and sizes.max() <= 8 and abs(sizes.mean() - 4.5) < 0.1
    event_sizes = (dense_events(w.events) >= 0).sum(axis=1)
    assert event_sizes.min() >= 1 and event_sizes.max() <= 40
    fixed = W.opindex_gen(100, 20, dims=2000, m=40, fixed_event_size=True)
    assert ((dense_events(fixed.events) >= 0).sum(axis=1) == 40).all()
    # the two event layouts hold the same events and match the same subscriptions
    wide = W.opindex_gen(100, 20, dims=2000, m=40, fixed_event_size=True, event_layout="wide")
    assert fixed.events.num_columns == 1 and wide.events.num_columns > 40
    assert np.array_equal(dense_events(fixed.events), dense_events(wide.events))
    with pytest.raises(ValueError, match="event_layout"):
        W.opindex_gen(10, event_layout="long")


# ------------------------------------------------------------ determinism, IO
def test_deterministic_by_seed():
    a, b = W.begen(2000, 100, similarity=0.5, seed=11), W.begen(2000, 100, similarity=0.5, seed=11)
    assert a.subscriptions.equals(b.subscriptions) and a.events.equals(b.events) and a.params == b.params
    c = W.begen(2000, 100, similarity=0.5, seed=12)
    assert not a.subscriptions.equals(c.subscriptions)
    x, y = W.opindex_gen(2000, 50, seed=3), W.opindex_gen(2000, 50, seed=3)
    assert x.subscriptions.equals(y.subscriptions) and x.events.equals(y.events)
    assert not x.subscriptions.equals(W.opindex_gen(2000, 50, seed=4).subscriptions)


def test_w6_has_w1_subscriptions():
    w1, w6 = W.standard("W1", scale=0.002, n_events=100), W.standard("stream", scale=0.002, n_events=100)
    assert w1.subscriptions.equals(w6.subscriptions)
    assert not w1.events.equals(w6.events)


def test_parquet_round_trip(tmp_path, small):
    for name in ("W1", "W3"):
        w = small[name]
        W.write_parquet(w, tmp_path / name)
        assert {p.name for p in (tmp_path / name).iterdir()} == {"subscriptions.parquet", "events.parquet",
                                                                  "params.json"}
        back = W.read_parquet(tmp_path / name)
        assert back.name == w.name and back.params == w.params
        assert back.subscriptions.equals(w.subscriptions) and back.events.equals(w.events)
        assert back.n_subscriptions == w.n_subscriptions


# ------------------------------------------------------------ names, errors
@pytest.mark.parametrize("alias,canonical", [("w1", "W1"), ("BEGEN-UNIFORM", "W1"), ("W1 begen-uniform", "W1"),
                                             ("pstree_dense", "W2"), ("opindex-sparse", "W3"), ("Ads-Like", "W4"),
                                             ("stream", "W6"), ("abe", "W5"), ("W5", "W5")])
def test_standard_names(alias, canonical):
    w = W.standard(alias, scale=1e-6)
    assert w.params["standard"] == canonical and w.name.startswith(canonical)


def test_unknown_names_and_bad_scales_raise():
    with pytest.raises(ValueError, match="unknown standard workload"):
        W.standard("W9")
    with pytest.raises(ValueError, match="scale"):
        W.standard("W1", scale=0)


@pytest.mark.parametrize("kwargs", [dict(sub_size=20), dict(event_size=500), dict(match_prob=0), dict(match_prob=2),
                                    dict(similarity=1.5), dict(op_class="extreme"), dict(op_class="min", eq_share=0.5),
                                    dict(eq_share=-0.1), dict(zipf=-1), dict(n_subs=0), dict(filler=15),
                                    dict(filler=-1), dict(sub_size_max=10, sub_size=6), dict(event_layout="long")])
def test_begen_rejects_bad_parameters(kwargs):
    kwargs = {"n_subs": 10, **kwargs}
    with pytest.raises(ValueError):
        W.begen(**kwargs)


def test_begen_sparse_events_are_a_map_column_with_the_same_matches():
    # PS-Tree's sparse space (30K dimensions): thousands of mostly-null columns would cost more than
    # the matching they feed, so the default layout is the map column above WIDE_EVENTS_MAX_DIMS
    kwargs = dict(dims=W.WIDE_EVENTS_MAX_DIMS + 1, cardinality=100, sub_size=5, event_size=30, eq_share=0.2)
    sparse = W.begen(300, 40, **kwargs)
    wide = W.begen(300, 40, event_layout="wide", **kwargs)
    assert sparse.events.column_names == [W.EVENTS_MAP_COLUMN] and sparse.params["event_layout"] == "map"
    assert wide.params["event_layout"] == "wide" and len(wide.events.column_names) > 100
    assert W.begen(300, 40, dims=W.WIDE_EVENTS_MAX_DIMS).params["event_layout"] == "wide"
    assert sparse.subscriptions.equals(wide.subscriptions)
    index = Index(algorithm="scan")
    W.add_subscriptions(index, sparse.subscriptions)
    found = index.match_batch(sparse.events, output="arrow")
    assert found.num_rows > 0 and found.equals(index.match_batch(wide.events, output="arrow"))


@pytest.mark.parametrize("kwargs, message", [
    # raw IndexError / TypeError from NumPy, or accepted and ignored (helper-41's probe)
    (dict(segments=0), "segments"), (dict(segments=3), "segments"), (dict(per_event=(5, 1)), "per_event"),
    (dict(per_event=(1, 200), segments=100), "per_event"), (dict(per_event=(1, 2, 3)), "per_event"),
    (dict(zipf=float("nan")), "zipf"), (dict(list_share=1.5), "list_share"), (dict(buckets=0), "buckets")])
def test_ads_lists_rejects_bad_parameters(kwargs, message):
    with pytest.raises(ValueError, match=message):
        W.ads_lists(30, 10, **kwargs)


def test_ads_lists_per_event_may_be_one_number_or_start_at_zero():
    exact = W.ads_lists(30, 10, per_event=3)
    assert set(pc.list_value_length(exact.events[W.SEGMENTS_ATTR]).to_pylist()) == {3}
    assert exact.params["per_event"] == [3, 3]
    assert min(pc.list_value_length(W.ads_lists(30, 40, per_event=(0, 1)).events[W.SEGMENTS_ATTR]).to_pylist()) == 0
    # uniform segments (zipf None) and NumPy numbers, as the other generators take them
    assert W.ads_lists(30, 10, zipf=None).n_subscriptions == W.ads_lists(30, 10, zipf=np.float64(0.5)).n_subscriptions


@pytest.mark.parametrize("fanout", [(2, 3, 9), (1, 3), (3, 2), (2.5, 3), 1, "2..6"])
def test_abe_gen_rejects_a_fanout_that_is_not_a_range(fanout):
    with pytest.raises(ValueError, match="fanout"):     # (2, 3, 9) had its third element dropped silently
        W.abe_gen(10, 5, fanout=fanout)


def test_opindex_rejects_bad_parameters():
    for kwargs in (dict(theta=1.5), dict(gamma_max=0), dict(m=50, dims=10), dict(zipf=-0.5)):
        with pytest.raises(ValueError):
            W.opindex_gen(10, **kwargs)


def test_unreachable_matching_probability_warns():
    # 5 dimensions, 4-pair events: subscriptions of other bases match far more often than 0.1 %
    with pytest.warns(RuntimeWarning, match="match_prob"):
        w = W.begen(200, 20, dims=5, cardinality=3, sub_size=1, event_size=4, filler=1, match_prob=0.001)
    assert w.params["expected_match_prob"] > 0.001


def test_weighted_draw_without_replacement_is_exact():
    # the fallback of skewed draws over a wide domain (Zipf attributes over 30K dimensions): each value
    # of a row drawn from the weights of the values the row lacks -- first and second draws checked
    # against those probabilities, a fixed entry never drawn again
    rng = np.random.default_rng(1)
    weights = 1 / np.arange(1, 6) ** 2
    weights /= weights.sum()
    n = 100_000
    sub = np.broadcast_to(-1 - np.arange(3), (n, 3)).copy()
    sub[:, 2] = 1                                    # a fixed entry: value 1 is taken in every row
    free = np.ones((n, 3), bool)
    free[:, 2] = False
    out = W._weighted_without_replacement(rng, sub, free, weights)
    assert (out[:, 2] == 1).all() and (out[:, 0] != 1).all() and (out[:, 1] != 1).all()
    assert (out[:, 0] != out[:, 1]).all() and out.min() >= 0 and out.max() < 5
    first = np.bincount(out[:, 0], minlength=5) / n
    expected = weights.copy()
    expected[1] = 0
    np.testing.assert_allclose(first, expected / expected.sum(), atol=0.006)
    after_0 = out[:, 0] == 0
    second = np.bincount(out[after_0, 1], minlength=5) / after_0.sum()
    expected[0] = 0
    np.testing.assert_allclose(second, expected / expected.sum(), atol=0.01)


def test_begen_zipf_over_a_wide_domain_is_quick_and_distinct():
    with pytest.warns(RuntimeWarning, match="match_prob"):      # skewed: chance matches above 1 %
        w = W.begen(300, 30, dims=30_000, cardinality=100, sub_size=5, event_size=30, eq_share=0.2, zipf=3)
    events = w.events.column(W.EVENTS_MAP_COLUMN)
    rows = events.to_pylist()
    assert len(rows) == 30 and all(len(row) == 30 and len({k for k, _ in row}) == 30 for row in rows)


# ------------------------------------------------------------ ads with list attributes (W7, W7S)
def test_ads_lists_carries_segments_and_its_scalar_twin_matches_alike():
    lists = W.standard("W7", 0.005, n_events=400)
    twin = W.standard("W7S", 0.005, n_events=400)
    segments = lists.events[W.SEGMENTS_ATTR]
    sizes = pc.list_value_length(segments).to_numpy()
    assert sizes.min() >= 1 and sizes.max() <= 200 and 80 < sizes.mean() < 120
    counts = np.bincount(pc.list_flatten(segments).to_numpy(), minlength=10_000)
    assert counts[0] == counts.max() and counts[0] > 0.5 * lists.n_events          # Zipf: segment 0 in most events
    assert all(len(set(s)) == len(s) for s in segments.to_pylist()[:50])
    on_list = lists.subscriptions.filter(pc.equal(lists.subscriptions["attr"], W.SEGMENTS_ATTR))
    assert abs(len(on_list) / lists.n_subscriptions - 0.2) < 0.02
    assert set(on_list["op"].to_pylist()) == {"one of", "none of", "all of", "contains"}
    on_bucket = twin.subscriptions.filter(pc.equal(twin.subscriptions["attr"], W.BUCKET_ATTR))
    assert on_bucket["sub_id"].to_pylist() == on_list["sub_id"].to_pylist()
    assert set(on_bucket["op"].to_pylist()) == {"in", "not in"}
    # the same events, the same other predicates: the twin's matches per event are the lists' within chance
    rate, _ = match_rate(lists)
    twin_rate, _ = match_rate(twin)
    assert rate > 0 and abs(twin_rate - rate) < 0.15 * rate
