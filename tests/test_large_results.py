"""Large results: the memory a match holds is bounded by its output plus
:data:`engine.index.MATCH_MEMORY_BUDGET`, whatever the output form, and
:meth:`Index.match_stream` yields outputs larger than memory piece by piece.

Peak memory is read from Linux's ``VmHWM`` (the resident high-water mark),
reset before the match through ``/proc/self/clear_refs``, so that it counts
every allocator (NumPy's, numba's, Arrow's) and nothing from before.
"""

from __future__ import annotations

import gc

import numpy as np
import pyarrow as pa
import pytest

import engine.index as index_module
from engine import Index
from engine.errors import BadEventError

N_SUBS = 1000
N_EVENTS = 20_000


def _status(field: str) -> int:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith(field):
                return int(line.split()[1]) * 1024
    raise RuntimeError(f"no {field} in /proc/self/status")


def peak_growth(run):
    """(result of ``run()``, bytes the resident set grew to at its peak)."""
    gc.collect()
    try:
        with open("/proc/self/clear_refs", "w") as clear:
            clear.write("5")             # VmHWM := VmRSS
    except OSError:                       # pragma: no cover - every Linux since 4.0 has it
        pytest.skip("cannot reset the resident high-water mark here")
    before = _status("VmRSS")
    result = run()
    return result, _status("VmHWM") - before


@pytest.fixture(scope="module", params=["scan", "opindex"])
def everyone_matches(request):
    index = Index(algorithm=request.param, backend="cpu")
    index.add_many(range(N_SUBS - 10), ["n >= 0 AND (s IS NULL OR s != 'x')"] * (N_SUBS - 10))
    index.merge()
    index.add_many(range(N_SUBS - 10, N_SUBS), ["n >= 0"] * 10)     # a delta: both parts match, then merge
    events = pa.table({"n": pa.array(np.arange(N_EVENTS) % 7, pa.int64())})
    index.match_batch(events.slice(0, 10))       # compile the kernels first
    return index, events


BUDGET = 32 << 20


@pytest.fixture
def small_budget(monkeypatch):
    monkeypatch.setattr(index_module, "MATCH_MEMORY_BUDGET", BUDGET)


def within_bound(grown: int, output: int) -> bool:
    """The stated bound: the output, plus a slice's working memory (the
    budget, with room for the allocator's slack); so at most twice the
    output once it is larger than the budget.  Matching the whole batch at
    once held 29 bytes a pair here (1.8x the Arrow output, 3.6x the lists)."""
    return grown <= output + 3 * BUDGET and grown <= 2 * output


def test_arrow_output_peak_is_within_twice_the_output(everyone_matches, small_budget):
    index, events = everyone_matches
    table, grown = peak_growth(lambda: index.match_batch(events, output="arrow"))
    assert table.num_rows == N_SUBS * N_EVENTS
    assert table["event"].to_numpy()[::N_SUBS].tolist() == list(range(N_EVENTS))
    assert table["sub_id"].to_numpy()[:N_SUBS].tolist() == list(range(N_SUBS))
    output = table.nbytes
    assert within_bound(grown, output), f"peak {grown / 2**20:.0f} MiB for a {output / 2**20:.0f} MiB output"


@pytest.mark.parametrize("algorithm", ["scan", "opindex", "psthash"])
def test_one_part_takes_wider_slices_and_keeps_within_the_bound(algorithm, small_budget):
    """A merged index without residual subscriptions holds fewer bytes a
    pair than one merging parts (engine.index._BYTES_PER_PAIR_WORKING), so
    the budget gives it wider slices -- and its peak stays within the same
    bound.  A delta beside it brings the narrower slices back."""
    index = Index(algorithm=algorithm, backend="cpu")
    index.add_many(range(N_SUBS), ["n >= 0 AND (s IS NULL OR s != 'x')"] * N_SUBS)
    index.merge()
    events = pa.table({"n": pa.array(np.arange(N_EVENTS) % 7, pa.int64())})
    index.match_batch(events.slice(0, 10))
    table, grown = peak_growth(lambda: index.match_batch(events, output="arrow"))
    assert table.num_rows == N_SUBS * N_EVENTS
    assert within_bound(grown, table.nbytes), f"peak {grown / 2**20:.0f} MiB for {table.nbytes / 2**20:.0f} MiB"
    one_part = max(width for width, _ in _slice_widths(index, events, None))
    index.add_many([N_SUBS], ["n >= 0"])
    with_delta = max(width for width, _ in _slice_widths(index, events, None))
    budget_pairs = {parts: BUDGET // index_module._BYTES_PER_PAIR_WORKING[parts] for parts in (False, True)}
    assert one_part == budget_pairs[False] // N_SUBS and with_delta == budget_pairs[True] // (N_SUBS + 1)


def test_list_output_peak_is_within_twice_the_output(everyone_matches, small_budget):
    index, events = everyone_matches
    lists, grown = peak_growth(lambda: index.match_batch(events))
    assert len(lists) == N_EVENTS and all(len(m) == N_SUBS for m in lists[::997])
    assert lists[-1].tolist() == list(range(N_SUBS))
    output = sum(m.nbytes for m in lists) + 112 * len(lists)       # the ids and one array object per event
    assert within_bound(grown, output), f"peak {grown / 2**20:.0f} MiB for a {output / 2**20:.0f} MiB output"


def test_match_stream_yields_bounded_pieces_equal_to_the_whole(everyone_matches):
    index, events = everyone_matches
    part = events.slice(0, 3000)
    pieces = list(index.match_stream(part, max_pairs=250_000))
    assert len(pieces) > 5
    assert all(isinstance(p, pa.RecordBatch) and p.num_rows <= 250_000 for p in pieces)
    assert pa.Table.from_batches(pieces).equals(index.match_batch(part, output="arrow"))


def test_empty_batches_give_no_results():
    index = Index(algorithm="opindex", backend="cpu")
    index.add(1, "n = 1")
    assert index.match_batch([]) == []
    assert index.match_batch(pa.table({"n": pa.array([], pa.int64())})) == []
    empty = index.match_batch([], output="arrow")
    assert empty.num_rows == 0 and empty.column_names == ["event", "sub_id"]
    nothing = list(index.match_stream([]))
    assert [p.num_rows for p in nothing] == [0] and nothing[0].schema == empty.schema.remove_metadata()


def test_arrow_lists_output_is_the_lists_in_one_list_array_within_the_bound(everyone_matches, small_budget):
    index, events = everyone_matches
    table, grown = peak_growth(lambda: index.match_batch(events, output="arrow_lists"))
    assert table.column_names == ["event", "sub_ids"] and table.num_rows == N_EVENTS
    lists = table.column("sub_ids").combine_chunks()
    assert lists.type == pa.list_(pa.int64())
    assert np.diff(lists.offsets.to_numpy()).tolist() == [N_SUBS] * N_EVENTS
    assert lists.values.to_numpy()[-N_SUBS:].tolist() == list(range(N_SUBS))
    output = table.nbytes                       # 8 bytes a match, 12 an event
    assert output <= 8 * N_SUBS * N_EVENTS + 12 * N_EVENTS + 1024
    assert within_bound(grown, output), f"peak {grown / 2**20:.0f} MiB for a {output / 2**20:.0f} MiB output"


def test_arrow_lists_keep_event_ids_empty_events_and_reported_ones():
    index = Index(algorithm="opindex", backend="cpu")
    index.add_many([1, 2], ["n >= 1", "n >= 2"])
    events = [{"id": "a", "n": 2}, {"id": "b"}, {"id": "c", "n": "bad"}, {"id": "d", "n": 1}]
    (table, rejected) = index.match_batch(events, output="arrow_lists", errors="report", id_column="id")
    assert [r.event for r in rejected] == [2]
    assert table.to_pydict() == {"id": ["a", "b", "c", "d"], "sub_ids": [[1, 2], [], [], [1]]}
    assert index.match_batch([], output="arrow_lists").num_rows == 0
    with pytest.raises(ValueError, match="'arrow_lists'"):
        index.match_batch(events[:1], output="lists")


@pytest.mark.parametrize("algorithm", ["scan", "opindex", "atree"])
def test_a_quiet_start_does_not_size_a_skewed_batch_as_one_slice(algorithm):
    """The first slices of a batch measure its matches an event, and the next
    slices are sized by it.  A batch whose first events match nothing and
    whose later ones match every subscription made the rest of the batch one
    slice: here 100x ``max_pairs`` in one piece.  A slice now grows at most
    SLICE_GROWTH times over the one before, so the overshoot is bounded
    (what match_batch holds at once), and match_stream cuts a slice that
    overshoots at event boundaries (pieces of max_pairs rows at most)."""
    from engine.events import encode_events
    from engine.index import SLICE_GROWTH
    n_subs, max_pairs = 200, 1000
    index = Index(algorithm=algorithm, backend="cpu")
    index.add_many(range(n_subs), [f"x = 1 OR y = {i}" for i in range(n_subs)])
    events = pa.table({"x": pa.array([0] * 100 + [1] * 500)})
    state = index._state
    slices = index._match_slices(state, encode_events(events, state.view, "raise"), max_pairs)
    assert max(len(sub_ids) for *_, sub_ids in slices) <= SLICE_GROWTH * max_pairs
    pieces = list(index.match_stream(events, max_pairs=max_pairs))
    assert max(p.num_rows for p in pieces) <= max_pairs
    table = pa.Table.from_batches(pieces)
    assert table.num_rows == 500 * n_subs
    assert table.equals(index.match_batch(events, output="arrow"))


def _slice_widths(index, events, max_pairs):
    from engine.events import encode_events
    state = index._state
    batch = encode_events(events, state.view, "raise")
    return [(stop - first, len(sub_ids)) for first, stop, _, sub_ids in index._match_slices(state, batch, max_pairs)]


def test_slices_the_budget_sets_are_equal_not_a_short_last_one():
    """W5 at 1 M cut 200 events into 6, 24, 85, 82 and 3: the last 3 cost the
    64-lane A-Tree a group of their own.  Where the budget sets the width,
    the events left now go in slices one event apart at most."""
    n_subs, max_pairs = 200, 1000                      # 5 events a slice when all 200 match
    index = Index(algorithm="scan", backend="cpu")
    index.add_many(range(n_subs), ["n >= 0"] * n_subs)
    widths = [width for width, _ in _slice_widths(index, pa.table({"n": pa.array([1] * 47)}), max_pairs)]
    assert widths[0] == 5 and sum(widths) == 47
    assert max(widths[1:]) <= 5 and max(widths[1:]) - min(widths[1:]) <= 1, widths


def test_a_batch_starts_from_the_matches_the_batch_before_measured():
    """A service's batches each began with a probe that fits if every
    subscription matches (6 events on W5 at 1 M).  Once a batch has been
    matched, the next starts as wide as its measure allows, up to
    SLICE_GROWTH times the probe: the bound the growth after a probe sets,
    so a batch matching everything after a quiet one still holds at most
    SLICE_GROWTH x max_pairs in its first slice."""
    from engine.index import SLICE_GROWTH
    n_subs, max_pairs = 200, 1000
    index = Index(algorithm="scan", backend="cpu")
    index.add_many(range(n_subs), [f"x = 1 OR y = {i}" for i in range(n_subs)])
    quiet = pa.table({"x": pa.array([0] * 600), "y": pa.array(np.arange(600) % n_subs)})     # one match each
    first = _slice_widths(index, quiet, max_pairs)
    assert first[0] == (max_pairs // n_subs, 5)
    again = _slice_widths(index, quiet, max_pairs)
    assert again[0] == (SLICE_GROWTH * max_pairs // n_subs, 20)
    loud = pa.table({"x": pa.array([1] * 600)})
    after_quiet = _slice_widths(index, loud, max_pairs)
    assert after_quiet[0] == (SLICE_GROWTH * max_pairs // n_subs, SLICE_GROWTH * max_pairs)
    assert max(pairs for _, pairs in after_quiet) <= SLICE_GROWTH * max_pairs
    assert sum(width for width, _ in after_quiet) == 600
    table = index.match_batch(loud, output="arrow")
    assert table.num_rows == 600 * n_subs


def test_match_stream_takes_its_snapshot_and_checks_at_the_call():
    """``match_stream`` was a generator function: nothing ran until the first
    ``next()``, so updates made in between changed its answer, and a bad
    event or errors mode was refused only then."""
    index = Index(algorithm="opindex", backend="cpu")
    index.add(1, "x = 1")
    pieces = index.match_stream([{"x": 1}])
    index.add(2, "x >= 1")
    index.remove(1)
    assert pa.Table.from_batches(list(pieces)).to_pydict() == {"event": [0], "sub_id": [1]}
    with pytest.raises(ValueError, match="match_stream takes errors='raise' or 'null'"):
        index.match_stream([{"x": 1}], errors="report")
    with pytest.raises(BadEventError, match="event 1"):
        index.match_stream([{"x": 1}, {"x": "one"}])
    with pytest.raises(KeyError, match="id_column 'eid'"):
        index.match_stream([{"x": 1}], id_column="eid")


def test_match_stream_max_pairs_holds_for_small_batches_too():
    """A batch of at most 64 events was one slice whatever ``max_pairs`` said
    (50 events matching 200 subscriptions each: one piece of 10,000 rows);
    ``match_batch`` without a budget of its own still takes it whole."""
    index = Index(algorithm="scan", backend="cpu")
    index.add_many(range(200), [f"x = 1 OR y = {i}" for i in range(200)])
    events = [{"x": 1}] * 50
    pieces = list(index.match_stream(events, max_pairs=200))
    assert [p.num_rows for p in pieces] == [200] * 50
    assert pa.Table.from_batches(pieces).equals(index.match_batch(events, output="arrow"))
    assert [p.num_rows for p in index.match_stream(events)] == [10_000]


def test_match_stream_cuts_an_overshooting_slice_at_event_boundaries():
    """After a run of events matching one subscription, a slice of events
    matching 200 each came out as one piece of 2,000 rows against
    ``max_pairs=10``: 200x the bound, 10x one event's matches.  A piece is
    now at most ``max_pairs`` rows, or one event's matches when they are
    more (never split)."""
    index = Index(algorithm="scan", backend="cpu")
    index.add(0, "x >= 0")
    index.add_many(range(1, 200), ["x >= 1"] * 199)
    events = [{"x": 0}] * 35 + [{"x": 1}] * 64
    pieces = list(index.match_stream(events, max_pairs=10))
    for piece in pieces:
        assert piece.num_rows <= 10 or len(set(piece["event"].to_pylist())) == 1, piece.num_rows
    assert [p.num_rows for p in pieces][-64:] == [200] * 64
    assert pa.Table.from_batches(pieces).equals(index.match_batch(events, output="arrow"))


def test_match_stream_yields_no_empty_piece_but_one_when_nothing_matched():
    """Slices without a match came out as empty batches, as many as the
    slicing made (``[0, 0, 0, 0, 0, 0, 3000]`` for 2,000 quiet events and a
    loud one); now a piece holds matches, and one empty batch says the
    types when nothing matched (empty input included), so
    ``pa.Table.from_batches`` always works."""
    index = Index(algorithm="scan", backend="cpu")
    index.add_many(range(3000), ["x = 1"] * 3000)
    events = [{"x": 0}] * 2000 + [{"x": 1}]
    pieces = list(index.match_stream(events, max_pairs=5000))
    assert [p.num_rows for p in pieces] == [3000] and set(pieces[0]["event"].to_pylist()) == {2000}
    assert [p.num_rows for p in index.match_stream([{"x": 0}] * 30, max_pairs=1)] == [0]
    ids = pa.table({"eid": pa.array(["a", "b"]), "x": pa.array([0, 0])})
    (only,) = index.match_stream(ids, id_column="eid")
    assert only.num_rows == 0 and only.schema.field("eid").type == pa.string()


@pytest.mark.parametrize("bad", [0, -1, 2.7, True, "10"])
def test_match_stream_refuses_a_max_pairs_that_is_not_a_count(bad):
    """0, 2.7 and True were read as 1 or 2; -1 raised IndexError on a slice without matches."""
    index = Index(algorithm="scan", backend="cpu")
    index.add(1, "x = 1")
    with pytest.raises(ValueError, match="max_pairs must be None or an integer >= 1"):
        index.match_stream([{"x": 0}, {"x": 1}], max_pairs=bad)
    assert [p.num_rows for p in index.match_stream([{"x": 1}], max_pairs=np.int64(1))] == [1]
