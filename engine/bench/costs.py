"""Costs beside matching: the two ways in (``bexmatch bench --ingest``),
what a merge costs opindex and the rates of adds and removals one at a time
(``bexmatch bench --updates``)."""

from __future__ import annotations

import statistics
import time

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from engine.bench import algorithms as bench_algorithms
from engine.bench.measure import first_subscriptions
from engine.index import Index


def conjunction_asts(segment, schema, positions=None) -> list:
    """The ASTs of a compiled segment's conjunctions (the columnar form's
    subscriptions), at ``positions`` (default all): each an ``And`` of its
    predicates, or the predicate alone."""
    from engine.compile import predicate_ast
    from engine.expr import And

    nodes = []
    for position in range(len(segment)) if positions is None else positions:
        start, stop = segment.prog_offsets[position], segment.prog_offsets[position + 1]
        leaves = segment.prog_arg[start:stop - 1]
        preds = tuple(predicate_ast(segment.predicates, int(p), schema) for p in leaves)
        nodes.append(And(preds) if len(preds) > 1 else preds[0])
    return nodes


def ingest_rates(workload, n_texts: int = 20_000, repeats: int = 3) -> dict:
    """The two ways in: text parse rate (7-predicate conjunctions, the
    workload's first subscriptions printed as text), ``Index.add_many`` of
    the same texts (its rate, and that as a share of the parse rate), and
    columnar ingestion
    rate (``Index.add_many`` of the whole columnar table, build of the
    compiled segment included).  Medians of ``repeats``."""
    from engine.parse import parse, to_text

    sample = Index(algorithm="scan")
    sample.add_many(first_subscriptions(workload.subscriptions, n_texts))
    texts = [to_text(node) for node in conjunction_asts(sample._main, sample.schema)]
    parse_s, texts_s, ingest_s = [], [], []
    ids = list(range(len(texts)))
    for _ in range(repeats):
        started = time.perf_counter()
        for text in texts:
            parse(text)
        parse_s.append(time.perf_counter() - started)
        index = Index()             # the default algorithm (its add-time checks included)
        started = time.perf_counter()
        index.add_many(ids, texts, progress=False)
        texts_s.append(time.perf_counter() - started)
        index = Index(algorithm="scan")
        started = time.perf_counter()
        index.add_many(workload.subscriptions)
        ingest_s.append(time.perf_counter() - started)
    return {"workload": workload.name, "n_texts": len(texts),
            "mean_predicates_per_text": float(np.mean([t.count(" AND ") + 1 for t in texts])),
            "parse_per_s": len(texts) / statistics.median(parse_s),
            "add_texts_per_s": len(texts) / statistics.median(texts_s),
            "add_texts_share_of_parse": statistics.median(parse_s) / statistics.median(texts_s),
            "n_subscriptions": workload.n_subscriptions, "ingest_s": statistics.median(ingest_s),
            "ingest_per_s": workload.n_subscriptions / statistics.median(ingest_s)}


def sampled_answers_agree(index: Index, events, n_subs: int = 300, seed: int = 0) -> bool:
    """Whether ``index`` answers ``events`` as ``scan`` does for a random
    sample of its subscriptions, their texts read back from it
    (``Index.expression``): the check after a run of updates, at the cost
    of a few hundred subscriptions' scan instead of a second index of the
    workload.  Both directions: a sampled subscription the index misses,
    and one it reports wrongly, fail it."""
    ids = index.ids()
    rng = np.random.default_rng(seed)
    sample = np.sort(rng.choice(ids, min(n_subs, len(ids)), replace=False))
    oracle = Index(algorithm="scan", backend="cpu", schema=dict(index.schema.families))
    oracle.add_many(sample.tolist(), [index.expression(int(i)) for i in sample])
    return all(np.array_equal(np.intersect1d(got, sample), want)
               for got, want in zip(index.match_batch(events), oracle.match_batch(events)))


def update_costs(workload, n: int = 1000, repeats: int = 3, algorithm: str = "opindex") -> dict:
    """What a merge costs an algorithm that derives its matcher at a merge
    (``opindex``: docs/architecture.md#the-index-life-cycle; ``pstbloom``,
    ``psthash``: PS-Tree's §4.4): ``n`` removals and ``n``
    new subscriptions (columnar, new ids; their rows copied from random
    subscriptions of the workload) folded into the main index, up to the
    first match after it -- with the matcher derived from the last one, and
    with a full rebuild forced (the matcher class's ``REBUILD_SHARE = 0``).
    Alternating runs, medians of ``repeats`` each."""
    from engine.algorithms.residual import ResidualMatcher

    def native(matcher):
        return matcher.native if isinstance(matcher, ResidualMatcher) else matcher

    subs = workload.subscriptions
    index = Index(algorithm=algorithm, backend="cpu")
    index.add_many(subs)
    index.merge()
    index.match({})
    matcher_class = type(native(index._matcher))
    rng = np.random.default_rng(0)
    source_ids = np.unique(subs["sub_id"].to_numpy())
    next_id = int(source_ids.max()) + 1
    share = matcher_class.REBUILD_SHARE
    times = {"incremental": [], "full": []}
    try:
        for k in range(2 * repeats):
            mode = "incremental" if k % 2 == 0 else "full"
            matcher_class.REBUILD_SHARE = share if mode == "incremental" else 0.0
            gone = rng.choice(index.ids(), n, replace=False)
            copied = np.sort(rng.choice(source_ids, n, replace=False))
            rows = subs.filter(pc.is_in(subs["sub_id"], value_set=pa.array(copied)))
            new_ids = next_id + np.searchsorted(copied, rows["sub_id"].to_numpy())
            next_id += n
            rows = rows.set_column(rows.schema.get_field_index("sub_id"), "sub_id", pa.array(new_ids, pa.int64()))
            started = time.perf_counter()
            for sub_id in gone:
                index.remove(int(sub_id))
            index.add_many(rows)            # a columnar add merges at once
            index.match({})                 # derives (or rebuilds) the matcher
            times[mode].append(time.perf_counter() - started)
            assert (native(index._matcher).merges > 0) == (mode == "incremental")
    finally:
        matcher_class.REBUILD_SHARE = share
    return {"workload": workload.name, "algorithm": algorithm, "n_subscriptions": len(index), "n": n,
            "incremental_s": statistics.median(times["incremental"]), "full_s": statistics.median(times["full"]),
            "same_answers": sampled_answers_agree(index, workload.events.slice(0, 100))}


def load_costs(workload, algorithm: str = "opindex", backend: str = "cpu", repeats: int = 3,
               directory=None, options: dict | None = None) -> dict:
    """What a saved index spares a reader (every Spark worker loads one):
    the build -- ``add_many`` of the columnar subscriptions, merge, first
    match (which builds the matcher) -- against ``Index.load`` of the saved
    file up to its first match, which uses the saved structure as it is.
    Also the save itself and the file's size; answers of the first events
    compared.  Medians of ``repeats``.  ``algorithm``: a bench name (a
    variant too), with ``options`` on top."""
    import os
    import tempfile

    events = workload.events.slice(0, 100)
    first = workload.events.slice(0, 1)
    build_s, save_s, load_s, first_s = [], [], [], []
    with tempfile.TemporaryDirectory(dir=directory) as tmp:
        path = os.path.join(tmp, "bench.bexidx")
        warm = bench_algorithms.new_index(algorithm, backend, options)      # kernels compiled before any timing
        warm.add_many(first_subscriptions(workload.subscriptions, 1000))
        warm.match_batch(first)
        warm.save(path)
        Index.load(path, backend=backend).match_batch(first)
        for _ in range(repeats):
            started = time.perf_counter()
            index = bench_algorithms.new_index(algorithm, backend, options)
            index.add_many(workload.subscriptions)
            index.match_batch(first)
            build_s.append(time.perf_counter() - started)
            started = time.perf_counter()
            index.save(path)
            save_s.append(time.perf_counter() - started)
            started = time.perf_counter()
            loaded = Index.load(path, backend=backend)
            load_s.append(time.perf_counter() - started)
            loaded.match_batch(first)
            first_s.append(time.perf_counter() - started)
        restored = loaded._state.source.kind == "reuse"
        same = [a.tolist() for a in loaded.match_batch(events)] == [a.tolist() for a in index.match_batch(events)]
        size = os.path.getsize(path)
    return {"workload": workload.name, "algorithm": algorithm, "backend": backend,
            "n_subscriptions": len(index), "build_s": statistics.median(build_s),
            "save_s": statistics.median(save_s), "load_s": statistics.median(load_s),
            "load_first_match_s": statistics.median(first_s), "file_bytes": size,
            "structure_restored": restored, "same_answers": same}


def update_rates(workload, algorithm: str = "betree", n: int = 1000, repeats: int = 3, options=None,
                 seed: int = 0) -> dict:
    """Adds and removals one subscription at a time, in subscriptions/s, on
    an index of ``algorithm`` (a bench name, with ``options``) holding the
    workload.  Medians of ``repeats``.

    * Through the public API: ``Index.add(id, ast)`` of ``n`` new
      subscriptions (copies of random ones under new ids; their ASTs made
      beforehand from the compiled rows -- text parsing is counted apart,
      ``--ingest``), then ``Index.remove(id)`` of ``n`` random ones.  The
      Index's delta and tombstones keep every match exact meanwhile; its
      merge policy may fold them in during the calls.  ``api_add_calls_per_s``
      / ``api_remove_calls_per_s``: the calls alone; ``api_add_per_s`` /
      ``api_remove_per_s``: with the merge and the first match after it,
      which fold them into the algorithm's structure.
    * The structure itself, where the matcher has a dynamic one (``betree``:
      :class:`gpu_kernels.betree.tree.DynamicTree`), one unit per call of
      ``insert`` / ``delete``, the units' keys computed beforehand from the
      compiled rows: every unit into an empty tree (``tree_insert_per_s``),
      the units of ``n`` random subscriptions deleted from the full tree
      (``tree_delete_per_s``) and inserted back (``tree_reinsert_per_s``);
      ``tree_build_per_s``: the build's single call inserting every unit
      (one at a time inside it), which shows what the per-call cost adds.
    * ``new_string_match_s`` against ``plain_match_s``: the first match of
      200 events after an add that brings a new string (the structure
      recoded), and a plain one.
    * ``same_answers``: the updated index against scan for a sample of its
      subscriptions (:func:`sampled_answers_agree`)."""
    from engine.bench import algorithms as bench_algorithms

    rng = np.random.default_rng(seed)
    first = workload.events.slice(0, 1)
    warm = bench_algorithms.new_index(algorithm, "cpu", options)   # compilation outside the timings
    warm.add_many(first_subscriptions(workload.subscriptions, 64))
    warm.match_batch(first)
    for sub_id, node in zip((-1, -2), conjunction_asts(warm._main, warm.schema, [0, 1])):
        warm.add(sub_id, node)
    warm.merge()
    warm.remove(-1)
    warm.merge()
    warm.match_batch(first)

    index = bench_algorithms.new_index(algorithm, "cpu", options)
    index.add_many(workload.subscriptions)
    index.merge()
    index.match_batch(first)
    size = len(index)
    out = {"workload": workload.name, "algorithm": algorithm, "n_subscriptions": size, "n": n}
    if hasattr(index._matcher, "_dynamic_tree"):
        out.update(_tree_rates(index._matcher, n, repeats, rng))

    segment, schema = index._main, index.schema
    next_id = int(index.ids().max()) + 1
    times = {key: [] for key in ("add_calls", "add", "remove_calls", "remove")}
    for _ in range(repeats):
        nodes = conjunction_asts(segment, schema, rng.choice(len(segment), n, replace=False))
        started = time.perf_counter()
        for sub_id, node in zip(range(next_id, next_id + n), nodes):
            index.add(sub_id, node)
        times["add_calls"].append(time.perf_counter() - started)
        index.merge()
        index.match_batch(first)
        times["add"].append(time.perf_counter() - started)
        next_id += n
        gone = rng.choice(index.ids(), n, replace=False)
        started = time.perf_counter()
        for sub_id in gone:
            index.remove(int(sub_id))
        times["remove_calls"].append(time.perf_counter() - started)
        index.merge()
        index.match_batch(first)
        times["remove"].append(time.perf_counter() - started)
        assert len(index) == size
    for key, values in times.items():
        out[f"api_{key}_per_s"] = n / statistics.median(values)
    out.update(_new_string_match(index, workload.events.slice(0, 200), next_id, repeats))
    out["same_answers"] = sampled_answers_agree(index, workload.events.slice(0, 100), seed=seed)
    return out


def _new_string_match(index: Index, events, next_id: int, repeats: int) -> dict:
    """The first match after an add that brings a string new to the
    dictionary (on an attribute of its own: the subscription goes to the
    delta, and the main structure is recoded under the grown dictionary,
    ``Matcher.recoded``), against a plain match of the same ``events``;
    medians of ``repeats``, each add removed again before the next."""
    index.match_batch(events)
    plain, after = [], []
    for k in range(repeats):
        started = time.perf_counter()
        index.match_batch(events)
        plain.append(time.perf_counter() - started)
        index.add(next_id + k, f"bench_new_string = 'bexmatch-bench-{next_id + k}'")
        started = time.perf_counter()
        index.match_batch(events)
        after.append(time.perf_counter() - started)
        index.remove(next_id + k)
    return {"plain_match_s": statistics.median(plain), "new_string_match_s": statistics.median(after)}


def _tree_rates(matcher, n: int, repeats: int, rng) -> dict:
    """The ``tree_*`` rates of :func:`update_rates` on ``matcher``'s units."""
    units = np.flatnonzero(matcher._possible)
    subs = matcher.units.sub[units]
    n_subs = len(np.unique(subs))
    victims = units[np.isin(subs, rng.choice(np.unique(subs), min(n, n_subs), replace=False))]
    victims = rng.permutation(victims)
    warm = matcher._dynamic_tree(None, None)
    for i in range(min(8, len(units))):
        warm.insert(units[i:i + 1])
    for i in range(min(8, len(units))):
        warm.delete(units[i:i + 1])
    times = {key: [] for key in ("insert", "delete", "reinsert", "build")}
    for repeat in range(repeats):
        dyn = matcher._dynamic_tree(None, None)
        started = time.perf_counter()
        for i in range(len(units)):
            dyn.insert(units[i:i + 1])
        times["insert"].append(time.perf_counter() - started)
        if repeat == 0:
            assert np.array_equal(np.sort(dyn.freeze().leaf_unit), units), "the tree lost or duplicated units"
        started = time.perf_counter()
        for i in range(len(victims)):
            dyn.delete(victims[i:i + 1])
        times["delete"].append(time.perf_counter() - started)
        started = time.perf_counter()
        for i in range(len(victims)):
            dyn.insert(victims[i:i + 1])
        times["reinsert"].append(time.perf_counter() - started)
        if repeat == 0:
            assert np.array_equal(np.sort(dyn.freeze().leaf_unit), units), "the tree lost or duplicated units"
        dyn = matcher._dynamic_tree(None, None)
        started = time.perf_counter()
        dyn.insert(units)
        times["build"].append(time.perf_counter() - started)
    n_victims = len(np.unique(matcher.units.sub[victims]))
    median = {key: statistics.median(values) for key, values in times.items()}
    return {"n_units": len(units), "tree_insert_per_s": n_subs / median["insert"],
            "tree_delete_per_s": n_victims / median["delete"], "tree_reinsert_per_s": n_victims / median["reinsert"],
            "tree_build_per_s": n_subs / median["build"], "tree_build_s": median["build"]}
