"""``bexmatch bench``: algorithms x backends over the papers' workloads (DESIGN.md §7).

Per (workload, algorithm, backend) one row of measurements:

=================  ============================================================
column             meaning
=================  ============================================================
workload           the workload's name (sweeps: ``generator param=value``)
sweep_param        the swept generator parameter (empty outside sweeps)
sweep_value        its value in this row (empty outside sweeps)
algorithm          one of :data:`engine.ALGORITHMS`
backend            ``cpu`` or ``cuda``
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
correct            whether the algorithm's matches on the scan sample -- batch
                   and single-event -- equal ``scan``'s on ``cpu``; a row never
                   reports speed without saying whether the answers were right
note               why a row was skipped or failed, or what was wrong
=================  ============================================================

The API::

    rows = run_benchmark(["W1"], ["scan", "opindex"], ["cpu"], scale=0.01)
    rows = sweep("N", [10_000, 100_000], generator="opindex", algorithms=["scan", "opindex"])
    print(format_table(rows)); write_csv(rows, "bench.csv"); plot(rows, "bench.png")

and the command line ``bexmatch bench --help``.
"""

from __future__ import annotations

import argparse
import csv
import inspect
import math
import statistics
import sys
import time
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from tqdm import tqdm

from engine.algorithms import ALGORITHMS, matcher_class
from engine.errors import BackendUnavailable
from engine.index import Index

__all__ = ["COLUMNS", "run_benchmark", "sweep", "format_table", "write_csv", "plot", "main",
           "implemented_algorithms", "SWEEP_ALIASES"]

COLUMNS = ("workload", "sweep_param", "sweep_value", "algorithm", "backend", "status", "n_subscriptions",
           "n_predicates", "n_events", "build_s", "index_bytes", "events_per_s", "latency_p50_us",
           "latency_p99_us", "matches_per_event", "scan_events_per_s", "scan_sample", "ratio_to_scan", "correct",
           "note")

#: scan runs on the whole event table when subscriptions x events is at most this
SCAN_BUDGET = 20_000_000
#: otherwise on the first SCAN_BUDGET // subscriptions events, clamped to these bounds
SCAN_SAMPLE_MAX = 200
SCAN_SAMPLE_MIN = 20
#: subscriptions and events of the untimed warm-up build (numba compilation)
WARMUP_SUBS = 64
WARMUP_EVENTS = 8
DEFAULT_SCALE = 0.01


# ------------------------------------------------------------------ helpers
#: ablations measured next to the algorithms: bench name -> (algorithm, Index options)
VARIANTS = {"opindex-bs": ("opindex", {"variant": "bs"})}   # OpIndex-BS: no segments, no signatures


def _new_index(algorithm: str, backend: str) -> Index:
    base, options = VARIANTS.get(algorithm, (algorithm, None))
    return Index(algorithm=base, backend=backend, options=options)


def _matcher_class(algorithm: str, backend: str):
    return matcher_class(VARIANTS.get(algorithm, (algorithm,))[0], backend)


def implemented_algorithms(backends=("cpu",)) -> list[str]:
    """The algorithms of :data:`ALGORITHMS` implemented on at least one of ``backends``."""
    found = []
    for algorithm in ALGORITHMS:
        for backend in backends:
            try:
                matcher_class(algorithm, backend)
            except BackendUnavailable:
                continue
            found.append(algorithm)
            break
    return found


def _index_bytes(index) -> int | None:
    nbytes = getattr(index, "nbytes", None)
    if callable(nbytes):
        nbytes = nbytes()
    if nbytes is None:
        main = getattr(index, "_main", None)
        nbytes = getattr(main, "nbytes", None)
    return None if nbytes is None else int(nbytes)


def _event_dicts(events: pa.Table, n: int) -> list[dict]:
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


def _first_subscriptions(subscriptions: pa.Table, n: int) -> pa.Table:
    """The rows of the first ``n`` distinct subscription ids."""
    ids = pc.unique(subscriptions["sub_id"]).slice(0, n)
    return subscriptions.filter(pc.is_in(subscriptions["sub_id"], value_set=ids))


def _n_subscriptions(workload) -> int:
    n = getattr(workload, "n_subscriptions", None)
    if n is None:
        table = workload.subscriptions
        n = int(pc.count_distinct(table["sub_id"]).as_py()) if table.num_rows else 0
    return int(n)


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


def _empty_row(**fields) -> dict:
    row = dict.fromkeys(COLUMNS)
    row.update(fields)
    return row


@dataclass
class _Measurement:
    build_s: float
    index_bytes: int | None
    n_events: int
    events_per_s: float | None
    n_matches: int
    pairs: tuple            # (event index, sub id) arrays of the first run
    latency_p50_us: float | None
    latency_p99_us: float | None
    singles: list           # index.match results of the latency events


def _warm_up(algorithm, backend, subscriptions, events, dicts) -> None:
    """A small untimed build and match, so that numba compiles outside the timings."""
    index = _new_index(algorithm, backend)
    index.add_many(_first_subscriptions(subscriptions, WARMUP_SUBS))
    index.merge()
    index.match_batch(events.slice(0, WARMUP_EVENTS), output="arrow")
    if dicts:
        index.match(dicts[0])


def _measure(algorithm, backend, subscriptions, events, dicts, repeats, *, latency=True, warm_up=True,
             status=None) -> _Measurement:
    say = status or (lambda phase: None)
    if warm_up:
        say("warm-up")
        _warm_up(algorithm, backend, subscriptions, events, dicts)
    say("build")
    start = time.perf_counter()
    index = _new_index(algorithm, backend)
    index.add_many(subscriptions)
    index.merge()
    index.match_batch(events.slice(0, 1), output="arrow")   # builds what the index builds lazily
    build_s = time.perf_counter() - start
    index_bytes = _index_bytes(index)

    n = events.num_rows
    say("match")
    first = index.match_batch(events, output="arrow")       # warm-up (and the answers)
    pairs = (first["event"].to_numpy(zero_copy_only=False), first["sub_id"].to_numpy(zero_copy_only=False))
    times = []
    for _ in range(max(repeats, 1)):
        start = time.perf_counter()
        index.match_batch(events, output="arrow")
        times.append(time.perf_counter() - start)
    events_per_s = n / max(statistics.median(times), 1e-9) if n else None

    p50 = p99 = None
    singles = []
    if latency and dicts:
        say("latency")
        index.match(dicts[0])
        elapsed = []
        for event in dicts:
            start = time.perf_counter_ns()
            singles.append(index.match(event))
            elapsed.append(time.perf_counter_ns() - start)
        p50, p99 = (float(v) / 1e3 for v in np.percentile(np.asarray(elapsed, dtype=np.float64), [50, 99]))
    return _Measurement(build_s, index_bytes, n, events_per_s, first.num_rows, pairs, p50, p99, singles)


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
                  extra: dict | None = None) -> list[dict]:
    """Benchmark ``algorithms`` x ``backends`` on each workload; one row per
    combination with the columns of :data:`COLUMNS`.

    ``workloads``: :class:`engine.workloads.Workload` objects, or standard
    workload names (``"W1"``...) generated at ``scale`` with ``seed`` (and
    ``events_limit`` events).  ``algorithms``: default every algorithm
    implemented on one of ``backends``; a combination that does not run here
    gives a ``skipped`` row with the reason.  ``events_limit``: time only the
    first that many events.  ``scan_sample``: see :func:`scan_sample_size`.
    ``strict``: re-raise an algorithm's exception instead of reporting an
    ``error`` row.  ``extra``: columns to set on every row (sweeps)."""
    backends = list(backends)
    algorithms = implemented_algorithms(backends) if algorithms is None else list(algorithms)
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
                                    scan_budget=scan_budget, strict=strict, extra=extra or {})
    finally:
        bar.close()
    return rows


def _bench_workload(workload, algorithms, backends, bar, *, events_limit, repeats, latency_samples, scan_sample,
                    scan_budget, strict, extra) -> list[dict]:
    subscriptions, events = workload.subscriptions, workload.events
    if events_limit is not None:
        events = events.slice(0, int(events_limit))
    n_events, n_subs = events.num_rows, _n_subscriptions(workload)
    k = scan_sample_size(n_subs, n_events, scan_sample, scan_budget)
    sample = events.slice(0, k)
    dicts = _event_dicts(events, min(latency_samples, n_events)) if latency_samples > 0 else []
    base = dict(workload=workload.name, n_subscriptions=n_subs, n_predicates=subscriptions.num_rows, **extra)

    def status(algorithm, backend):
        return lambda phase: bar.set_postfix_str(f"{workload.name}: {algorithm}/{backend} {phase}")

    # scan, timed on the sample on every backend; scan on cpu is the reference answer
    scans: dict[str, _Measurement | BaseException] = {}
    for backend in sorted(backends, key=lambda b: b != "cpu"):
        try:
            matcher_class("scan", backend)
            scans[backend] = _measure("scan", backend, subscriptions, sample, dicts, repeats,
                                      latency="scan" in algorithms, status=status("scan", backend))
        except BackendUnavailable as exc:
            scans[backend] = exc
        except Exception as exc:
            if strict:
                raise
            scans[backend] = exc
    if isinstance(scans.get("cpu"), _Measurement):
        reference = _sorted_pairs(*scans["cpu"].pairs, k)
    else:
        bar.set_postfix_str(f"{workload.name}: scan/cpu reference")
        ref_index = Index(algorithm="scan", backend="cpu")
        ref_index.add_many(subscriptions)
        ref_index.merge()
        found = ref_index.match_batch(sample, output="arrow")
        reference = _sorted_pairs(found["event"].to_numpy(zero_copy_only=False),
                                  found["sub_id"].to_numpy(zero_copy_only=False), k)
        del ref_index

    rows = []
    for backend in backends:
        scan = scans[backend]
        for algorithm in algorithms:
            row = _empty_row(**base, algorithm=algorithm, backend=backend, n_events=n_events, scan_sample=k)
            if isinstance(scan, _Measurement):
                row["scan_events_per_s"] = scan.events_per_s
            try:
                if algorithm == "scan":
                    if isinstance(scan, BaseException):
                        raise scan
                    measured = scan
                else:
                    _matcher_class(algorithm, backend)   # BackendUnavailable before any work
                    measured = _measure(algorithm, backend, subscriptions, events, dicts, repeats,
                                        status=status(algorithm, backend))
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


# ---------------------------------------------------------------------- sweeps
#: generator -> {alias: keyword argument}; the OpIndex paper's symbols (N, Γmax, m, θ, σ) included
SWEEP_ALIASES = {
    "opindex": {"N": "n_subs", "n": "n_subs", "subs": "n_subs", "d": "dims", "Γmax": "gamma_max",
                "gmax": "gamma_max", "Γ": "gamma_max", "θ": "theta", "θ1": "theta", "theta1": "theta",
                "σ": "cardinality", "sigma": "cardinality", "card": "cardinality", "events": "n_events"},
    "begen": {"N": "n_subs", "n": "n_subs", "subs": "n_subs", "d": "dims", "σ": "cardinality",
              "sigma": "cardinality", "card": "cardinality", "θ": "eq_share", "theta": "eq_share",
              "m": "event_size", "p": "match_prob", "s": "similarity", "events": "n_events"},
}
#: the standard workload whose full-scale parameters are a sweep's defaults
SWEEP_BASE = {"opindex": "W3", "begen": "W1"}


def _generator(name: str):
    from engine import workloads as generators
    if name not in SWEEP_BASE:
        raise ValueError(f"unknown generator {name!r}; generators are {', '.join(SWEEP_BASE)}")
    return generators.opindex_gen if name == "opindex" else generators.begen


def sweep_parameters(generator: str) -> list[str]:
    """The keyword arguments of ``generator`` a sweep may vary."""
    return [p for p in inspect.signature(_generator(generator)).parameters if p not in ("seed", "name")]


def resolve_sweep_param(generator: str, param: str) -> str:
    """The generator keyword behind ``param`` (``N`` -> ``n_subs``, ``θ`` -> ``theta``...)."""
    valid = sweep_parameters(generator)
    aliases = SWEEP_ALIASES[generator]
    for candidate in (param, aliases.get(param), aliases.get(str(param).lower()), str(param).lower()):
        if candidate in valid:
            return candidate
    raise ValueError(f"{generator} has no parameter {param!r}; parameters: {', '.join(valid)}; "
                     f"aliases: {', '.join(f'{a}={k}' for a, k in aliases.items())}")


_INT_PARAMS = {"n_events", "sub_size_max", "filler"}   # int parameters whose default is None


def coerce_value(generator: str, param: str, value):
    """A swept value as the generator wants it: text from the command line
    becomes int, float, None or bool; integral floats become ints for int
    parameters."""
    if isinstance(value, str):
        text = value.strip()
        low = text.lower()
        if low in ("none", "null", "uniform"):
            value = None
        elif low in ("true", "false"):
            value = low == "true"
        else:
            try:
                value = int(text)
            except ValueError:
                try:
                    value = float(text)
                except ValueError:
                    value = text
    default = inspect.signature(_generator(generator)).parameters[param].default
    integer = isinstance(default, int) and not isinstance(default, bool) or param in _INT_PARAMS
    if integer and isinstance(value, float) and value.is_integer():
        value = int(value)
    return value


def sweep_base(generator: str, scale: float = DEFAULT_SCALE, base_params: dict | None = None,
               n_events: int | None = None) -> dict:
    """The generator keywords of a sweep: the standard workload's
    (:data:`SWEEP_BASE`) with its subscriptions times ``scale``, overridden
    by ``base_params`` (aliases allowed)."""
    from engine import workloads as generators
    standard = SWEEP_BASE[generator]
    base = dict(generators.STANDARD_WORKLOADS[standard][2])
    base["n_subs"] = max(1, round(base["n_subs"] * scale))
    default_events = getattr(generators, "DEFAULT_EVENTS_OF", {}).get(standard,
                                                                      getattr(generators, "DEFAULT_EVENTS", 10_000))
    base["n_events"] = max(100, round(default_events * scale)) if n_events is None else int(n_events)
    for key, value in (base_params or {}).items():
        key = resolve_sweep_param(generator, key)
        base[key] = coerce_value(generator, key, value)
    return base


def sweep(param: str, values, generator: str = "opindex", base_params: dict | None = None, algorithms=None,
          backends=("cpu",), *, scale: float = DEFAULT_SCALE, events_limit=None, seed: int = 0,
          progress: bool = True, **options) -> list[dict]:
    """Vary one generator parameter (``N``/``n_subs``, ``dims``, ``Γmax``,
    ``m``, ``θ``, ``σ``, ``zipf``...; see :data:`SWEEP_ALIASES`) over
    ``values``, everything else as in :func:`sweep_base`, and benchmark each
    workload with :func:`run_benchmark` (``options``: its keywords).  Rows
    carry ``sweep_param`` (the generator keyword) and ``sweep_value`` --
    the shape of OpIndex Fig. 10 (throughput and memory against N, Γmax, m,
    θ1, σ, Zipf)."""
    generate = _generator(generator)
    key = resolve_sweep_param(generator, param)
    base = sweep_base(generator, scale, base_params, events_limit)
    values = [coerce_value(generator, key, v) for v in values]
    if not values:
        raise ValueError("a sweep needs at least one value")
    rows = []
    for value in tqdm(values, desc=f"sweep {key}", unit="value", disable=not progress, file=sys.stderr):
        kwargs = dict(base, **{key: value})
        workload = generate(**kwargs, seed=seed, name=f"{generator} {key}={value}")
        rows += run_benchmark([workload], algorithms, backends, events_limit=events_limit, progress=progress,
                              extra=dict(sweep_param=key, sweep_value=value), **options)
    return rows


# --------------------------------------------------------------------- output
def _human_bytes(n) -> str:
    if n is None:
        return "-"
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return str(n)


def _num(x, digits=3) -> str:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "-"
    if abs(x) >= 1000:
        return f"{x:,.0f}"
    return f"{x:.{digits}g}"


_TABLE = (
    ("workload", "workload", str),
    ("sweep_value", "value", str),
    ("algorithm", "algorithm", str),
    ("backend", "backend", str),
    ("n_subscriptions", "subs", lambda v: f"{v:,}"),
    ("n_events", "events", lambda v: f"{v:,}"),
    ("build_s", "build s", _num),
    ("index_bytes", "index", _human_bytes),
    ("events_per_s", "events/s", _num),
    ("latency_p50_us", "p50 us", _num),
    ("latency_p99_us", "p99 us", _num),
    ("matches_per_event", "matches/ev", _num),
    ("ratio_to_scan", "x scan", lambda v: "-" if v is None else f"{v:.2f}"),
    ("scan_sample", "scan ev", lambda v: f"{v:,}"),
    ("correct", "correct", lambda v: "-" if v is None else ("yes" if v else "NO")),
    ("note", "note", lambda v: v or ""),
)


def format_table(rows) -> str:
    """The rows as a plain aligned text table."""
    swept = any(r.get("sweep_param") for r in rows)
    columns = [c for c in _TABLE if c[0] != "sweep_value" or swept]
    if swept:
        params = sorted({str(r["sweep_param"]) for r in rows if r.get("sweep_param")})
        columns = [(c[0], "/".join(params), c[2]) if c[0] == "sweep_value" else c for c in columns]
    cells = [[title for _, title, _ in columns]]
    for row in rows:
        line = []
        for key, _, fmt in columns:
            value = row.get(key)
            if row.get("status") != "ok" and key == "correct":
                line.append(row.get("status") or "")
            elif key == "sweep_value":
                line.append(str(value) if row.get("sweep_param") else "-")
            else:
                line.append("-" if value is None and key != "note" else fmt(value))
        cells.append(line)
    widths = [max(len(r[i]) for r in cells) for i in range(len(columns))]
    numeric = {"n_subscriptions", "n_events", "build_s", "index_bytes", "events_per_s", "latency_p50_us",
               "latency_p99_us", "matches_per_event", "ratio_to_scan", "scan_sample"}
    lines = []
    for n, line in enumerate(cells):
        parts = [cell.rjust(w) if key in numeric else cell.ljust(w)
                 for (key, _, _), cell, w in zip(columns, line, widths)]
        lines.append("  ".join(parts).rstrip())
        if n == 0:
            lines.append("  ".join("-" * w for w in widths))
    sampled = [r for r in rows if r.get("status") == "ok" and r.get("scan_sample") is not None
               and r.get("algorithm") != "scan" and r["scan_sample"] < r["n_events"]]
    if sampled:
        lines.append("")
        lines.append("scan ev < events: scan was timed, and answers checked, on the first 'scan ev' events only.")
    return "\n".join(lines)


def _csv_value(value):
    if value is None:
        return ""
    if isinstance(value, float):
        return repr(value)
    return value


def write_csv(rows, path) -> None:
    """Write the rows to ``path``; every column of :data:`COLUMNS` is always present."""
    with open(path, "w", newline="", encoding="utf-8") as f:
        writer = csv.DictWriter(f, fieldnames=COLUMNS, extrasaction="ignore")
        writer.writeheader()
        for row in rows:
            out = {c: _csv_value(row.get(c)) for c in COLUMNS}
            if row.get("sweep_param") and row.get("sweep_value") is None:
                out["sweep_value"] = "None"      # a swept None (e.g. zipf: uniform), not a missing value
            writer.writerow(out)


def plot(rows, path=None):
    """Events/s and index bytes, against the swept parameter (sweeps) or per
    workload (bars), one series per algorithm x backend; written to ``path``
    as PNG when given.  Uses matplotlib's Agg canvas directly (no pyplot, no
    change to the caller's matplotlib backend).  Returns the Figure."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    ok = [r for r in rows if r.get("status") == "ok"]
    fig = Figure(figsize=(12, 4.5), layout="constrained")
    FigureCanvasAgg(fig)
    ax_speed, ax_bytes = fig.subplots(1, 2)
    series = list(dict.fromkeys((r["algorithm"], r["backend"]) for r in ok))
    swept = [r for r in ok if r.get("sweep_param")]
    if not ok:
        for ax in (ax_speed, ax_bytes):
            ax.text(0.5, 0.5, "no results", ha="center", va="center", transform=ax.transAxes)
    elif swept:
        param = "/".join(sorted({str(r["sweep_param"]) for r in swept}))
        values = list(dict.fromkeys(r["sweep_value"] for r in swept))
        numeric = all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values)
        position = {v: (v if numeric else i) for i, v in enumerate(values)}
        for algorithm, backend in series:
            mine = [r for r in swept if (r["algorithm"], r["backend"]) == (algorithm, backend)]
            mine.sort(key=lambda r: values.index(r["sweep_value"]))
            label = f"{algorithm} ({backend})"
            if any(r["correct"] is False for r in mine):
                label += " WRONG ANSWERS"
            xs = [position[r["sweep_value"]] for r in mine]
            ax_speed.plot(xs, [r["events_per_s"] or np.nan for r in mine], marker="o", label=label)
            ax_bytes.plot(xs, [(r["index_bytes"] or np.nan) / 2 ** 20 for r in mine], marker="o", label=label)
        for ax in (ax_speed, ax_bytes):
            ax.set_xlabel(param)
            if numeric and min(values) > 0 and max(values) / min(values) >= 20:
                ax.set_xscale("log")
            if not numeric:
                ax.set_xticks(range(len(values)), [str(v) for v in values])
    else:
        names = list(dict.fromkeys(r["workload"] for r in ok))
        width = 0.8 / max(len(series), 1)
        for i, (algorithm, backend) in enumerate(series):
            label = f"{algorithm} ({backend})"
            mine = {r["workload"]: r for r in ok if (r["algorithm"], r["backend"]) == (algorithm, backend)}
            if any(r["correct"] is False for r in mine.values()):
                label += " WRONG ANSWERS"
            xs = np.arange(len(names)) + (i - (len(series) - 1) / 2) * width
            speed = [mine[n]["events_per_s"] or np.nan if n in mine else np.nan for n in names]
            size = [(mine[n]["index_bytes"] or np.nan) / 2 ** 20 if n in mine else np.nan for n in names]
            ax_speed.bar(xs, speed, width, label=label)
            ax_bytes.bar(xs, size, width, label=label)
        for ax in (ax_speed, ax_bytes):
            ax.set_xticks(range(len(names)), names)
            ax.set_xlabel("workload")
    ax_speed.set_ylabel("events / s")
    ax_bytes.set_ylabel("index MiB")
    if ok and all((r["events_per_s"] or 0) > 0 for r in ok):
        ax_speed.set_yscale("log")
    ax_speed.set_title("throughput (match_batch)")
    ax_bytes.set_title("index memory")
    if series:
        ax_speed.legend(fontsize="small")
    if path is not None:
        fig.savefig(path, dpi=110)
    return fig


# ------------------------------------------------------------ command line
def _csv_list(text: str) -> list[str]:
    return [v for v in (p.strip() for p in text.split(",")) if v]


def _scan_sample_arg(text: str):
    if text in ("auto", "all"):
        return text
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected 'auto', 'all' or a positive integer, not {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, not {value}")
    return value


def _positive(kind):
    def parse(text):
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
        if not value > 0 or (isinstance(value, float) and not math.isfinite(value)):
            raise argparse.ArgumentTypeError(f"must be positive, not {text}")
        return value
    return parse


def ingest_rates(workload, n_texts: int = 20_000, repeats: int = 3) -> dict:
    """The two ways in: text parse rate (7-predicate conjunctions, the
    workload's first subscriptions printed as text) and columnar ingestion
    rate (``Index.add_many`` of the whole columnar table, build of the
    compiled segment included).  Medians of ``repeats``."""
    from engine.compile import predicate_ast
    from engine.expr import And
    from engine.parse import parse, to_text

    sample = Index(algorithm="scan")
    sample.add_many(_first_subscriptions(workload.subscriptions, n_texts))
    segment = sample._main
    texts = []
    for position in range(len(segment)):
        start, stop = segment.prog_offsets[position], segment.prog_offsets[position + 1]
        leaves = segment.prog_arg[start:stop - 1]
        preds = tuple(predicate_ast(segment.predicates, int(p), sample.schema) for p in leaves)
        texts.append(to_text(And(preds) if len(preds) > 1 else preds[0]))
    parse_s, ingest_s = [], []
    for _ in range(repeats):
        started = time.perf_counter()
        for text in texts:
            parse(text)
        parse_s.append(time.perf_counter() - started)
        index = Index(algorithm="scan")
        started = time.perf_counter()
        index.add_many(workload.subscriptions)
        ingest_s.append(time.perf_counter() - started)
    return {"workload": workload.name, "n_texts": len(texts),
            "mean_predicates_per_text": float(np.mean([t.count(" AND ") + 1 for t in texts])),
            "parse_per_s": len(texts) / statistics.median(parse_s),
            "n_subscriptions": _n_subscriptions(workload), "ingest_s": statistics.median(ingest_s),
            "ingest_per_s": _n_subscriptions(workload) / statistics.median(ingest_s)}


def update_costs(workload, n: int = 1000, repeats: int = 3) -> dict:
    """What a merge costs opindex (DESIGN.md §4): ``n`` removals and ``n``
    new subscriptions (columnar, new ids; their rows copied from random
    subscriptions of the workload) folded into the main index, up to the
    first match after it -- with the matcher derived from the last one, and
    with a full rebuild forced (``REBUILD_SHARE = 0``).  Alternating runs,
    medians of ``repeats`` each."""
    from engine.algorithms.opindex import OpIndexMatcher

    subs = workload.subscriptions
    index = Index(algorithm="opindex", backend="cpu")
    index.add_many(subs)
    index.merge()
    index.match({})
    rng = np.random.default_rng(0)
    source_ids = np.unique(subs["sub_id"].to_numpy())
    next_id = int(source_ids.max()) + 1
    share = OpIndexMatcher.REBUILD_SHARE
    times = {"incremental": [], "full": []}
    try:
        for k in range(2 * repeats):
            mode = "incremental" if k % 2 == 0 else "full"
            OpIndexMatcher.REBUILD_SHARE = share if mode == "incremental" else 0.0
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
            assert (index._matcher.merges > 0) == (mode == "incremental")
    finally:
        OpIndexMatcher.REBUILD_SHARE = share
    return {"workload": workload.name, "n_subscriptions": len(index), "n": n,
            "incremental_s": statistics.median(times["incremental"]), "full_s": statistics.median(times["full"])}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="bexmatch bench",
        description="Benchmark algorithms x backends on the papers' workloads: build time, index bytes, "
                    "events/s, latency percentiles, matches/event and the ratio to scan measured in the same "
                    "run, with every algorithm's answers checked against scan's.",
        epilog="Examples:\n"
               "  bexmatch bench --workload W1 --workload W3 --scale 0.01 --csv out.csv --plot out.png\n"
               "  bexmatch bench --algorithm all --backend cpu --backend cuda\n"
               "  bexmatch bench --sweep N --values 1000,10000,100000 --generator opindex --plot fig10a.png\n"
               "  bexmatch bench --sweep theta --values 0.2,0.4,0.6,0.8 --param N=20000\n"
               "Exit status: 0 when every run that ran gave scan's answers, 1 when one was wrong or failed.",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    what = parser.add_argument_group("what to run")
    what.add_argument("--workload", action="append", metavar="W",
                      help="standard workload W1..W4, W6 or an alias such as begen-uniform (repeatable; "
                           "default W1 unless --parquet or --sweep is given)")
    what.add_argument("--parquet", action="append", metavar="DIR",
                      help="a workload directory written by engine.workloads.write_parquet (repeatable)")
    what.add_argument("--scale", type=_positive(float), default=DEFAULT_SCALE,
                      help="subscriptions as a share of the full-scale workload (default %(default)s)")
    what.add_argument("--events", type=_positive(int), metavar="N",
                      help="events per workload (generated workloads: generate N; Parquet: the first N)")
    what.add_argument("--seed", type=int, default=0, help="generator seed (default %(default)s)")
    what.add_argument("--algorithm", action="append", choices=(*ALGORITHMS, *VARIANTS, "all"),
                      help="algorithm (repeatable; 'all' for every name, unimplemented ones reported as "
                           "skipped; default every implemented algorithm)")
    what.add_argument("--backend", action="append", choices=("cpu", "cuda"),
                      help="backend (repeatable; default cpu)")
    how = parser.add_argument_group("how to measure")
    how.add_argument("--repeats", type=_positive(int), default=3,
                     help="timed match_batch runs after one warm-up; the median counts (default %(default)s)")
    how.add_argument("--latency-samples", type=int, default=200, metavar="N",
                     help="events matched one at a time for the latency percentiles (default %(default)s)")
    how.add_argument("--scan-sample", type=_scan_sample_arg, default="auto", metavar="auto|all|N",
                     help="events scan is timed and answers are checked on: 'auto' (all of them when "
                          f"subscriptions x events <= {SCAN_BUDGET:,}, else the first "
                          f"{SCAN_SAMPLE_MIN}..{SCAN_SAMPLE_MAX}), 'all', or the first N (default %(default)s)")
    swp = parser.add_argument_group("sweeps (OpIndex Fig. 10)")
    swp.add_argument("--sweep", metavar="PARAM",
                     help="vary one generator parameter: N, dims, Γmax/gamma_max, m, θ/theta, σ/cardinality, "
                          "zipf, ... (any keyword of engine.workloads.opindex_gen or begen)")
    swp.add_argument("--values", type=_csv_list, metavar="V1,V2,...", help="the values of the swept parameter "
                     "('none' for None)")
    swp.add_argument("--generator", choices=tuple(SWEEP_BASE), default="opindex",
                     help="generator of the sweep (default %(default)s; base parameters: W3 for opindex, "
                          "W1 for begen, subscriptions times --scale)")
    swp.add_argument("--param", action="append", default=[], metavar="KEY=VALUE",
                     help="override a base parameter of the sweep's generator (repeatable)")
    what.add_argument("--updates", type=_positive(int), metavar="N",
                      help="time N removals + N adds merged into opindex, derived vs fully rebuilt")
    what.add_argument("--ingest", action="store_true",
                      help="measure the ways in instead: text parse rate and columnar ingestion rate")
    out = parser.add_argument_group("output")
    out.add_argument("--csv", metavar="PATH", help="write every row, every column, as CSV")
    out.add_argument("--plot", metavar="PATH", help="write events/s and index bytes as a PNG")
    out.add_argument("--strict", action="store_true", help="stop at the first algorithm that raises")
    out.add_argument("--quiet", action="store_true", help="no progress bars")
    return parser


def main(argv=None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    backends = args.backend or ["cpu"]
    algorithms = None
    if args.algorithm:
        algorithms = list(ALGORITHMS) if "all" in args.algorithm else list(dict.fromkeys(args.algorithm))
    options = dict(repeats=args.repeats, latency_samples=max(args.latency_samples, 0),
                   scan_sample=args.scan_sample, progress=not args.quiet, strict=args.strict)

    if args.sweep is not None:
        if args.workload or args.parquet:
            parser.error("--sweep generates its own workloads: leave out --workload and --parquet")
        if not args.values:
            parser.error("--sweep needs --values v1,v2,...")
        params = {}
        for item in args.param:
            key, sep, value = item.partition("=")
            if not sep or not key.strip():
                parser.error(f"--param expects KEY=VALUE, not {item!r}")
            params[key.strip()] = value
        try:   # bad names and values are usage errors, found before any work
            key = resolve_sweep_param(args.generator, args.sweep)
            sweep_base(args.generator, args.scale, params, args.events)
            [coerce_value(args.generator, key, v) for v in args.values]
        except ValueError as exc:
            parser.error(str(exc))
        rows = sweep(args.sweep, args.values, args.generator, params, algorithms, backends, scale=args.scale,
                     events_limit=args.events, seed=args.seed, **options)
    else:
        if args.values or args.param:
            parser.error("--values and --param go with --sweep")
        if args.updates:
            from engine.workloads import standard
            for name in args.workload or ["W1"]:
                cost = update_costs(standard(name, scale=args.scale, n_events=10, seed=args.seed), args.updates,
                                    repeats=args.repeats)
                print(f"{cost['workload']} ({cost['n_subscriptions']:,} subscriptions): {cost['n']:,} removals + "
                      f"{cost['n']:,} adds, merged and matched: {cost['incremental_s']:.3f} s with opindex's "
                      f"derived matcher, {cost['full_s']:.3f} s with a full rebuild "
                      f"({cost['full_s'] / cost['incremental_s']:.1f}x)")
            return 0
        if args.ingest:
            from engine.workloads import standard
            for name in args.workload or ["W1"]:
                rates = ingest_rates(standard(name, scale=args.scale, n_events=100, seed=args.seed),
                                     repeats=args.repeats)
                print(f"{rates['workload']}: parse {rates['parse_per_s']:,.0f} expressions/s "
                      f"({rates['n_texts']:,} texts, {rates['mean_predicates_per_text']:.1f} predicates each); "
                      f"columnar ingestion {rates['ingest_per_s']:,.0f} subscriptions/s "
                      f"({rates['n_subscriptions']:,} in {rates['ingest_s']:.2f} s)")
            return 0
        workloads = []
        if args.parquet:
            from engine.workloads import read_parquet
            workloads += [read_parquet(d) for d in args.parquet]
        if args.workload or not args.parquet:
            from engine.workloads import standard
            for name in args.workload or ["W1"]:
                try:
                    workloads.append(standard(name, scale=args.scale, n_events=args.events, seed=args.seed))
                except ValueError as exc:
                    parser.error(str(exc))
        rows = run_benchmark(workloads, algorithms, backends, events_limit=args.events, **options)

    print(format_table(rows))
    if args.csv:
        write_csv(rows, args.csv)
    if args.plot:
        plot(rows, args.plot)
    failed = [r for r in rows if r["status"] == "error" or r["correct"] is False]
    for row in failed:
        print(f"bexmatch bench: {row['workload']} {row['algorithm']}/{row['backend']}: {row['note']}",
              file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
