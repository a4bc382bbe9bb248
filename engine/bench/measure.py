"""The measurements of ``bexmatch bench``: per (workload, algorithm,
backend) one row, with the columns of :data:`COLUMNS`:

=================  ============================================================
column             meaning
=================  ============================================================
workload           the workload's name (sweeps: ``generator param=value``)
sweep_param        the swept generator parameter, or the swept algorithm
                   option as ``algorithm.option`` (empty outside sweeps)
sweep_value        its value in this row (empty outside sweeps)
series_param       a sweep's second axis (``--series``), one plotted line per
                   value: a generator parameter or ``algorithm.option``
                   (empty without one)
series_value       its value in this row (empty without one)
algorithm          a registered algorithm (:mod:`engine.algorithms.registry`)
                   or a bench variant of one (:data:`~engine.bench.algorithms.VARIANTS`)
backend            ``cpu`` or ``cuda``
options            the algorithm options the run passed (``name=value; ...``,
                   ``auto`` values resolved for the workload; empty: defaults)
status             ``ok``; ``skipped`` (the combination does not run here:
                   ``note`` says why); ``error`` (it raised: ``note`` has the
                   exception)
n_subscriptions    subscriptions in the workload
n_predicates       rows of the columnar subscription table
n_events           events timed (the whole event table, or its first
                   ``events_limit``; for ``scan``: the scan sample)
build_s            seconds for ``Index(...)``, ``add_many(columnar table)``,
                   ``merge()`` and the first one-event ``match_batch`` (which
                   builds the algorithm's lazily constructed structures);
                   numba compilation is excluded by an untimed warm-up build
                   on a slice of the workload
index_bytes        ``index.nbytes`` after the build (compiled segment plus the
                   algorithm's structures)
events_per_s       events / median seconds of ``repeats`` runs of
                   ``match_batch(events, output="arrow")`` after one warm-up run
events_per_s_min,  the slowest and the fastest of those runs (the spread of
events_per_s_max   the repeats, drawn as error bars by ``--plot``)
latency_p50_us,    percentiles of single-event ``index.match(dict)`` times over
latency_p99_us     the first ``latency_samples`` events (after one warm-up call)
matches_per_event  (event, subscription) matches / events
scan_events_per_s  ``scan``'s events/s on the same workload and backend, in the
                   same run
scan_sample        the number of events ``scan`` was timed on and every
                   algorithm's answers were checked on: the first
                   ``scan_sample`` events (= ``n_events`` unless scan was too
                   slow to run on all of them)
ratio_to_scan      events_per_s / scan_events_per_s
correct            whether the algorithm's matches on the scan sample equal
                   ``scan``'s on ``cpu``: those of ``match_batch``, and of
                   ``match(dict)`` on the timed single events among them (none
                   with ``latency_samples=0``); a row never reports speed
                   without saying whether the answers were right
note               why a row was skipped or failed, or what was wrong
=================  ============================================================
"""

from __future__ import annotations

import os
import statistics
import sys
import time
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from tqdm import tqdm

from engine.bench import algorithms as bench_algorithms
from engine.errors import BackendUnavailable
from engine.index import Index
from engine.workloads import add_subscriptions

COLUMNS = ("workload", "sweep_param", "sweep_value", "series_param", "series_value", "algorithm", "backend",
           "options", "status", "n_subscriptions", "n_predicates", "n_events", "build_s", "index_bytes",
           "events_per_s", "events_per_s_min", "events_per_s_max", "latency_p50_us", "latency_p99_us",
           "matches_per_event", "scan_events_per_s",
           "scan_sample", "ratio_to_scan", "correct", "note")

#: scan runs on the whole event table when subscriptions x events is at most this
SCAN_BUDGET = 20_000_000
#: otherwise on the first SCAN_BUDGET // subscriptions events, clamped to these bounds
SCAN_SAMPLE_MAX = 200
SCAN_SAMPLE_MIN = 20
#: subscriptions and events of the untimed warm-up build (numba compilation)
WARMUP_SUBS = 64
WARMUP_EVENTS = 8
DEFAULT_SCALE = 0.01
#: bytes a subscription, an event or a batch's slot takes at the very least (an int64 id, value or
#: pointer): a count needing more memory than the machine has at this rate cannot run
MIN_ITEM_BYTES = 8


# ------------------------------------------------------------------ helpers
def event_dicts(events: pa.Table, n: int) -> list[dict]:
    """The first ``n`` events as dicts without the absent (null) attributes."""
    table = events.slice(0, n)
    dicts = [{} for _ in range(table.num_rows)]
    for name in table.column_names:
        column = table[name]
        if column.null_count == len(column):
            continue
        if pa.types.is_map(column.type):      # sparse events: attribute name -> value
            for row, pairs in enumerate(column.to_pylist()):
                dicts[row].update((k, v) for k, v in pairs or () if v is not None)
            continue
        rows = np.flatnonzero(column.is_valid().to_numpy(zero_copy_only=False))
        for row, value in zip(rows.tolist(), column.take(pa.array(rows)).to_pylist()):
            dicts[row][name] = value
    return dicts


def first_subscriptions(subscriptions: pa.Table, n: int) -> pa.Table:
    """The rows of the first ``n`` distinct subscription ids."""
    ids = pc.unique(subscriptions["sub_id"]).slice(0, n)
    return subscriptions.filter(pc.is_in(subscriptions["sub_id"], value_set=ids))


def scan_sample_size(n_subscriptions: int, n_events: int, scan_sample="auto", budget: int = SCAN_BUDGET) -> int:
    """How many of the first events scan is timed and checked on.

    ``"auto"``: all of them when ``n_subscriptions * n_events <= budget``,
    else ``budget // n_subscriptions`` clamped to [SCAN_SAMPLE_MIN,
    SCAN_SAMPLE_MAX]; ``None`` or ``"all"``: all of them; an int: that many."""
    if scan_sample is None or scan_sample == "all":
        return n_events
    if scan_sample == "auto":
        if n_subscriptions * n_events <= budget:
            return n_events
        k = budget // max(n_subscriptions, 1)
        return min(n_events, max(SCAN_SAMPLE_MIN, min(SCAN_SAMPLE_MAX, k)))
    k = int(scan_sample)
    if k < 1:
        raise ValueError(f"scan_sample must be 'auto', 'all', None or a positive int, not {scan_sample!r}")
    return min(n_events, k)


def memory_bytes() -> int | None:
    """This machine's physical memory, or None where the OS does not say."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (AttributeError, ValueError, OSError):
        return None


def check_fits(count: int, what: str) -> None:
    """ValueError when ``count`` items (``what``: "subscriptions (...)",
    "events (...)") need more than this machine's memory at
    :data:`MIN_ITEM_BYTES` each -- a lower bound, so that an impossible
    size is refused before any work instead of ending in a MemoryError
    from inside a generator, and no size that might fit is."""
    memory = memory_bytes()
    if memory is not None and count * MIN_ITEM_BYTES > memory:
        raise ValueError(f"{count:,} {what} need at least {count * MIN_ITEM_BYTES / 2 ** 30:,.0f} GiB of memory; "
                         f"this machine has {memory / 2 ** 30:,.1f} GiB")


def empty_row(**fields) -> dict:
    """A row with every column of :data:`COLUMNS`, None but for ``fields``."""
    row = dict.fromkeys(COLUMNS)
    row.update(fields)
    return row


@dataclass
class _Measurement:
    build_s: float
    index_bytes: int
    n_events: int
    events_per_s: float | None
    n_matches: int
    pairs: tuple            # (event index, sub id) arrays of the first run
    latency_p50_us: float | None
    latency_p99_us: float | None
    singles: list           # index.match results of the latency events
    spread: tuple = (None, None)    # events/s of the slowest and the fastest repeat


def _warm_up(algorithm, backend, subscriptions, events, dicts, options=None) -> None:
    """A small untimed build and match, so that numba compiles outside the timings."""
    index = bench_algorithms.new_index(algorithm, backend, options)
    add_subscriptions(index, first_subscriptions(subscriptions, WARMUP_SUBS))
    index.merge()
    index.match_batch(events.slice(0, WARMUP_EVENTS), output="arrow")
    if dicts:
        index.match(dicts[0])


def _measure(algorithm, backend, subscriptions, events, dicts, repeats, *, latency=True, status,
             options=None, asts=None) -> _Measurement:
    status("warm-up")
    _warm_up(algorithm, backend, subscriptions, events, dicts, options)
    status("build")
    start = time.perf_counter()
    index = bench_algorithms.new_index(algorithm, backend, options)
    add_subscriptions(index, subscriptions, asts)   # (columnar, or ABE-Gen's ASTs or texts)
    index.merge()
    index.match_batch(events.slice(0, 1), output="arrow")   # builds what the index builds lazily
    build_s = time.perf_counter() - start
    index_bytes = int(index.nbytes)

    n = events.num_rows
    status("match")
    first = index.match_batch(events, output="arrow")       # warm-up (and the answers)
    pairs = (first["event"].to_numpy(zero_copy_only=False), first["sub_id"].to_numpy(zero_copy_only=False))
    times = []
    for _ in range(max(repeats, 1)):
        start = time.perf_counter()
        index.match_batch(events, output="arrow")
        times.append(time.perf_counter() - start)
    events_per_s = n / max(statistics.median(times), 1e-9) if n else None
    spread = (n / max(max(times), 1e-9), n / max(min(times), 1e-9)) if n else (None, None)

    p50 = p99 = None
    singles = []
    if latency and dicts:
        status("latency")
        index.match(dicts[0])
        elapsed = []
        for event in dicts:
            start = time.perf_counter_ns()
            singles.append(index.match(event))
            elapsed.append(time.perf_counter_ns() - start)
        p50, p99 = (float(v) / 1e3 for v in np.percentile(np.asarray(elapsed, dtype=np.float64), [50, 99]))
    return _Measurement(build_s, index_bytes, n, events_per_s, first.num_rows, pairs, p50, p99, singles, spread)


def _sorted_pairs(events, ids, limit):
    keep = events < limit
    events, ids = events[keep], ids[keep]
    order = np.lexsort((ids, events))
    return events[order], ids[order]


def _check(measurement: _Measurement, reference, k: int) -> tuple[bool, str | None]:
    """Compare an algorithm's answers on the first ``k`` events with scan's."""
    ref_events, ref_ids = reference
    events, ids = _sorted_pairs(*measurement.pairs, k)
    problems = []
    if not (np.array_equal(events, ref_events) and np.array_equal(ids, ref_ids)):
        got = set(zip(events.tolist(), ids.tolist()))
        want = set(zip(ref_events.tolist(), ref_ids.tolist()))
        bad_events = {e for e, _ in got ^ want}
        problems.append(f"match_batch differs from scan on {len(bad_events)} of {k} events "
                        f"({len(want - got)} matches missing, {len(got - want)} extra)")
    bounds = np.searchsorted(ref_events, np.arange(k + 1))
    bad = sum(1 for i, single in enumerate(measurement.singles[:k])
              if not np.array_equal(np.sort(np.asarray(single)), ref_ids[bounds[i]:bounds[i + 1]]))
    if bad:
        problems.append(f"match(dict) differs from scan on {bad} of {min(k, len(measurement.singles))} events")
    return (not problems), ("WRONG: " + "; ".join(problems) if problems else None)


def _reference(subscriptions, sample, k):
    """scan's answers on cpu, sorted (event, sub id) pairs of the first ``k`` events of ``sample``."""
    index = Index(algorithm="scan", backend="cpu")
    add_subscriptions(index, subscriptions)
    index.merge()
    found = index.match_batch(sample, output="arrow")
    return _sorted_pairs(found["event"].to_numpy(zero_copy_only=False),
                         found["sub_id"].to_numpy(zero_copy_only=False), k)


def _describe(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"


def _resolve_workload(workload, scale, events_limit, seed):
    if isinstance(workload, str):
        from engine import workloads as generators
        return generators.standard(workload, scale=scale, n_events=events_limit, seed=seed)
    return workload


# --------------------------------------------------------------- benchmarks
def run_benchmark(workloads, algorithms=None, backends=("cpu",), *, events_limit=None, repeats: int = 3,
                  latency_samples: int = 200, scan_sample="auto", scan_budget: int = SCAN_BUDGET,
                  scale: float = DEFAULT_SCALE, seed: int = 0, progress: bool = True, strict: bool = False,
                  extra: dict | None = None, algorithm_options: dict | None = None, texts: bool = False,
                  columns: bool = False) -> list[dict]:
    """Benchmark ``algorithms`` x ``backends`` on each workload; one row per
    combination with the columns of :data:`COLUMNS`.

    ``workloads``: :class:`engine.workloads.Workload` objects, or standard
    workload names (``"W1"``...) generated at ``scale`` with ``seed`` (and
    ``events_limit`` events).  ``algorithms``: registered algorithms or bench
    variants (:func:`engine.bench.algorithms.names`); default every
    registered algorithm implemented on one of ``backends``.  A combination
    that does not run here gives a ``skipped`` row with the reason.
    ``events_limit``: time only the first that many events.
    ``scan_sample``: see :func:`scan_sample_size`.  ``strict``: re-raise an
    algorithm's exception instead of reporting an ``error`` row.
    ``extra``: columns to set on every row (sweeps).  ``algorithm_options``:
    ``{bench name: {option: value}}`` passed to that algorithm's index (an
    algorithm's also to its variants, but for the options a variant fixes:
    :func:`engine.bench.algorithms.options_of`); the value ``"auto"`` is
    chosen per workload
    (:func:`engine.bench.algorithms.resolve_options`: ``betree`` ``max_cap``
    by BE-Tree Table 4).  ``texts``: build ABE-Gen workloads from their
    texts, through the parser, instead of from their ASTs
    (:attr:`engine.workloads.Workload.asts`; text-free, as every other
    workload's columnar form).  ``columns``: build them from the columnar
    form with connective rows instead, the ASTs written out in it
    (:func:`engine.columnar.expressions_as_columns`) before anything is
    timed."""
    if texts and columns:
        raise ValueError("texts and columns are two ways in: give one")
    backends = list(backends)
    if algorithms is None:
        algorithms = bench_algorithms.implemented_algorithms(backends)
    algorithms = list(algorithms)
    workloads = list(workloads)
    rows = []
    total = len(workloads) * len(backends) * len(algorithms)
    bar = tqdm(total=total, desc="bench", unit="run", disable=not progress, leave=False, file=sys.stderr)
    try:
        for workload in workloads:
            bar.set_postfix_str(f"{workload if isinstance(workload, str) else workload.name}: generate")
            workload = _resolve_workload(workload, scale, events_limit, seed)
            rows += _bench_workload(workload, algorithms, backends, bar, events_limit=events_limit,
                                    repeats=repeats, latency_samples=latency_samples, scan_sample=scan_sample,
                                    scan_budget=scan_budget, strict=strict, extra=extra or {},
                                    algorithm_options=algorithm_options or {}, texts=texts, columns=columns)
    finally:
        bar.close()
    return rows


def _bench_workload(workload, algorithms, backends, bar, *, events_limit, repeats, latency_samples, scan_sample,
                    scan_budget, strict, extra, algorithm_options, texts=False, columns=False) -> list[dict]:
    subscriptions, events = workload.subscriptions, workload.events
    asts = None if texts else workload.asts
    n_predicates = subscriptions.num_rows
    if columns and asts is not None:        # (written out before the timings: the data a pipeline would hold)
        from engine.columnar import expressions_as_columns
        subscriptions, asts = expressions_as_columns(subscriptions["sub_id"].to_pylist(), asts), None
    if events_limit is not None:
        events = events.slice(0, int(events_limit))
    n_events, n_subs = events.num_rows, workload.n_subscriptions
    if n_events == 0:       # (nothing would be timed or checked, and every row would read "correct")
        raise ValueError(f"workload {workload.name} has no events to match")
    k = scan_sample_size(n_subs, n_events, scan_sample, scan_budget)
    sample = events.slice(0, k)
    dicts = event_dicts(events, min(latency_samples, n_events)) if latency_samples > 0 else []
    base = dict(workload=workload.name, n_subscriptions=n_subs, n_predicates=n_predicates, **extra)

    def status(algorithm, backend):
        return lambda phase: bar.set_postfix_str(f"{workload.name}: {algorithm}/{backend} {phase}")

    # scan, timed on the sample on every backend; scan on cpu is the reference answer
    scans: dict[str, _Measurement | BaseException] = {}
    for backend in sorted(backends, key=lambda b: b != "cpu"):
        try:
            bench_algorithms.matcher_class("scan", backend)
            scans[backend] = _measure("scan", backend, subscriptions, sample, dicts, repeats,
                                      latency="scan" in algorithms, status=status("scan", backend),
                                      options=bench_algorithms.resolve_options(
                                          "scan", bench_algorithms.options_of("scan", algorithm_options), workload),
                                      asts=asts)
        except BackendUnavailable as exc:
            scans[backend] = exc
        except Exception as exc:
            if strict:
                raise
            scans[backend] = exc
    no_reference = None
    if isinstance(scans.get("cpu"), _Measurement):
        reference = _sorted_pairs(*scans["cpu"].pairs, k)
    else:
        bar.set_postfix_str(f"{workload.name}: scan/cpu reference")
        try:
            reference = _reference(subscriptions, sample, k)
        except Exception as exc:
            # subscriptions or events the engine refuses (a --parquet workload's): scan's answers are missing,
            # so nothing could be checked -- every row an error saying why, no algorithm timed unchecked
            if strict:
                raise
            no_reference = f"no answers to check against: scan/cpu failed ({_describe(exc)})"

    rows = []
    for backend in backends:
        scan = scans[backend]
        for algorithm in algorithms:
            row = empty_row(**base, algorithm=algorithm, backend=backend, n_events=n_events, scan_sample=k)
            if isinstance(scan, _Measurement):
                row["scan_events_per_s"] = scan.events_per_s
            if no_reference is not None:
                if algorithm == "scan" and isinstance(scan, BackendUnavailable):
                    row.update(status="skipped", note=str(scan))
                else:
                    own = algorithm == "scan" and isinstance(scan, BaseException)
                    row.update(status="error", note=_describe(scan) if own else no_reference)
                rows.append(row)
                bar.update(1)
                continue
            try:
                options = bench_algorithms.resolve_options(
                    algorithm, bench_algorithms.options_of(algorithm, algorithm_options), workload)
                row["options"] = "; ".join(f"{key}={value}" for key, value in options.items()) or None
                if algorithm == "scan":
                    if isinstance(scan, BaseException):
                        raise scan
                    measured = scan
                else:
                    bench_algorithms.matcher_class(algorithm, backend)   # BackendUnavailable before any work
                    measured = _measure(algorithm, backend, subscriptions, events, dicts, repeats,
                                        status=status(algorithm, backend), options=options, asts=asts)
            except BackendUnavailable as exc:
                row.update(status="skipped", note=str(exc))
            except Exception as exc:
                if strict:
                    raise
                row.update(status="error", note=_describe(exc))
            else:
                correct, note = _check(measured, reference, k)
                row.update(status="ok", n_events=measured.n_events, build_s=measured.build_s,
                           index_bytes=measured.index_bytes, events_per_s=measured.events_per_s,
                           events_per_s_min=measured.spread[0], events_per_s_max=measured.spread[1],
                           latency_p50_us=measured.latency_p50_us, latency_p99_us=measured.latency_p99_us,
                           matches_per_event=measured.n_matches / measured.n_events if measured.n_events else None,
                           correct=correct, note=note)
                if algorithm == "scan":
                    row["ratio_to_scan"] = 1.0
                elif isinstance(scan, _Measurement) and scan.events_per_s and measured.events_per_s:
                    row["ratio_to_scan"] = measured.events_per_s / scan.events_per_s
                else:
                    why = f"no scan on {backend} to compare with ({scan})" if isinstance(scan, BaseException) \
                        else "no events"
                    row["note"] = why if note is None else f"{note}; {why}"
                del measured
            rows.append(row)
            bar.update(1)
    return rows
