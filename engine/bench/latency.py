"""Latency against batch size (A-PCM §VII-C, Fig. 12): ``bexmatch bench --arrival-delays``.

Batching buys throughput with waiting.  For each algorithm and batch size
``b`` this measures the real time of matching one batch --
``Index.match_batch`` of ``b`` consecutive events of the workload's
stream, given as event dicts as a streaming service holds them
(:class:`engine.streaming.EventStream`), after the numba warm-up; the
median over several different batches (:func:`time_batches`) -- and then
computes the latency of events that arrive one every ``d`` ms with a
discrete-event simulation over that measured time (:func:`simulate`):

* **fill**: event ``i`` arrives at ``i·d``; its batch (events ``kb`` to
  ``kb + b - 1``, count-based as in the paper) is complete when its last
  event arrives;
* **queue**: one batch is matched at a time, in arrival order, so a
  complete batch waits for the batches before it to finish;
* **match**: then it takes the measured median time of a batch of ``b``.

An event's latency is its batch's finish time less its arrival time.
Batch size 1 is matching every event alone as it comes -- A-PCM's
sequential "Bitmap" baseline when the algorithm is ``apcm-bitmap``.

The paper restarts its clock after every batch (after every 128 events for
Bitmap), which ignores the backlog.  Here the simulated stream is
``simulated_events`` long and queueing is kept: when a batch takes longer to
match than its events take to arrive (``utilization`` = batch time /
``b·d`` above 1) the backlog grows along the stream, and with it the
average; those rows are marked ``overloaded`` and their latency depends on
the stream's length.  Each row says whether the algorithm's answers on the
timed batches equal ``scan``'s (on the first ``scan_sample`` events).
"""

from __future__ import annotations

import math
import statistics
import sys
import time
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa
from tqdm import tqdm

from engine.bench import algorithms as bench_algorithms
from engine.bench.measure import _describe, _warm_up, event_dicts, scan_sample_size
from engine.errors import BackendUnavailable
from engine.index import Index
from engine.workloads import add_subscriptions

#: the paper's batch sizes, and 1: every event matched alone (the sequential baseline)
DEFAULT_BATCH_SIZES = (1, 128, 256, 512, 1024)
#: Fig. 12's delays between events, ms (100 ms down to a stream with no gaps)
DEFAULT_DELAYS_MS = (100.0, 10.0, 1.0, 0.1, 0.01, 0.0)
#: events in the simulated stream: ten batches of the paper's largest
DEFAULT_SIMULATED_EVENTS = 10_240
#: every batch size is timed on at least this many events (and at least ``repeats`` batches) ...
MIN_TIMED_EVENTS = 1024
#: ... unless its timed batches have taken this many seconds (a slow algorithm matching events one by one)
TIME_BUDGET_S = 5.0

#: the columns of a latency row (``--csv``), one row per algorithm x backend x batch size x delay
LATENCY_COLUMNS = (
    "workload", "algorithm", "backend", "options", "status", "n_subscriptions", "batch_size", "batches_timed",
    "batch_ms", "batch_events_per_s", "arrival_delay_ms", "utilization", "overloaded", "simulated_events",
    "latency_mean_ms", "latency_p99_ms", "fill_mean_ms", "queue_mean_ms", "checked_events", "correct", "note")


def timed_batches(batch_size: int, repeats: int = 3, min_events: int = MIN_TIMED_EVENTS) -> int:
    """How many batches of ``batch_size`` are timed: ``repeats``, and enough
    to cover ``min_events`` events (small batches vary more) -- fewer, but
    never below ``repeats``, once they pass :func:`time_batches`' time budget."""
    return max(int(repeats), math.ceil(min_events / batch_size))


def events_needed(batch_sizes, repeats: int = 3, min_events: int = MIN_TIMED_EVENTS) -> int:
    """Events a stream needs so that no timed batch repeats an event (one
    untimed warm-up batch per size included)."""
    return max((timed_batches(b, repeats, min_events) + 1) * b for b in batch_sizes)


# --------------------------------------------------------------- simulation
def simulate(batch_s: float, batch_size: int, delay_s: float, n_events: int = DEFAULT_SIMULATED_EVENTS) -> dict:
    """The latencies of a stream of ``n_events`` events (rounded down to
    whole batches, at least one) arriving every ``delay_s`` seconds, matched
    ``batch_size`` at a time, one batch after the other, each batch taking
    ``batch_s`` seconds (the module docstring has the model).

    Returns seconds: ``mean``, ``p99``, and the means of the ``fill`` wait
    (first arrival to batch complete) and the ``queue`` wait (batch complete
    to its matching starting; the matching itself is ``batch_s``);
    ``utilization`` (``batch_s / (batch_size * delay_s)``, inf without
    delay), ``overloaded`` (utilization above 1: the backlog grows, so the
    averages depend on ``n_events``) and ``n_events`` simulated."""
    if batch_size < 1 or batch_s < 0 or delay_s < 0:
        raise ValueError(f"need batch_size >= 1, batch_s >= 0 and delay_s >= 0, not {batch_size}, {batch_s}, "
                         f"{delay_s}")
    n_batches = max(1, n_events // batch_size)
    arrival = np.arange(n_batches * batch_size, dtype=np.float64) * delay_s
    ready = arrival[batch_size - 1::batch_size]            # a batch is complete when its last event arrives
    start = np.empty(n_batches)
    free = -math.inf                                       # when the matcher is done with the batch before
    for k, complete in enumerate(ready.tolist()):
        start[k] = max(complete, free)
        free = start[k] + batch_s
    finish = start + batch_s
    latency = np.repeat(finish, batch_size) - arrival
    fill = np.repeat(ready, batch_size) - arrival
    queue = start - ready
    utilization = batch_s / (batch_size * delay_s) if delay_s > 0 else math.inf
    return {"mean": float(latency.mean()), "p99": float(np.percentile(latency, 99)), "fill": float(fill.mean()),
            "queue": float(queue.mean()), "utilization": utilization, "overloaded": utilization > 1,
            "n_events": int(arrival.size)}


# ------------------------------------------------------------ measurement
@dataclass
class BatchTiming:
    """One algorithm x backend x batch size: the measured batch times."""

    workload: str
    n_subscriptions: int
    algorithm: str
    backend: str
    options: str | None
    batch_size: int | None = None
    seconds: list = field(default_factory=list)
    status: str = "ok"
    checked_events: int | None = None
    correct: bool | None = None
    note: str | None = None

    @property
    def batch_s(self) -> float | None:
        return statistics.median(self.seconds) if self.seconds else None


def _reference(workload, events: pa.Table, k: int) -> list:
    """scan's answers on the first ``k`` events, one id array per event."""
    index = Index(algorithm="scan", backend="cpu")
    add_subscriptions(index, workload.subscriptions, workload.asts)       # (ABE-Gen's are expressions)
    index.merge()
    return index.match_batch(events.slice(0, k))


def _check(found: list, reference: list, n: int) -> tuple[int, bool | None, str | None]:
    """Compare the answers of the batches in ``found`` (``(first event,
    answers)``: the batch's i-th event is the stream's ``(first + i) % n``-th,
    as a batch wraps around a stream of ``n`` events) on the events
    ``reference`` has (scan's first ones) with it: (events checked, equal,
    note)."""
    k = len(reference)
    checked = bad = 0
    for first, answers in found:
        for i, ids in enumerate(answers):
            position = (first + i) % n
            if position < k:
                checked += 1
                bad += not np.array_equal(ids, reference[position])
    if bad:
        return checked, False, f"WRONG: match_batch differs from scan on {bad} of {checked} events"
    return checked, True, None


def time_batches(workload, algorithms=None, backends=("cpu",), batch_sizes=DEFAULT_BATCH_SIZES, *,
                 repeats: int = 3, min_events: int = MIN_TIMED_EVENTS, time_budget: float | None = TIME_BUDGET_S,
                 scan_sample="auto", events_limit=None, algorithm_options: dict | None = None,
                 progress: bool = True, strict: bool = False) -> list[BatchTiming]:
    """The time of one ``match_batch`` of each of ``batch_sizes`` events, per
    algorithm (bench names; default every algorithm implemented on one of
    ``backends``) and backend: one index built per algorithm, then per size
    one untimed batch and :func:`timed_batches` timed ones (no more once
    they have taken ``time_budget`` seconds and there are ``repeats``), consecutive
    slices of the stream (its first ``events_limit`` events; wrapping
    around a stream too short).  A batch is what a streaming service holds
    (:class:`engine.streaming.EventStream`): a list of event dicts, matched
    with ``output="list"`` -- for a single event an Arrow table of a
    wide workload costs far more than the matching.  Answers on the first
    ``scan_sample`` events (:func:`~engine.bench.measure.scan_sample_size`)
    are checked against scan's.  ``algorithm_options`` as in
    :func:`~engine.bench.measure.run_benchmark`.  A combination that does
    not run gives one timing with status ``skipped`` or ``error`` (``strict``:
    raise instead) and no batch size."""
    backends = list(backends)
    algorithms = list(algorithms) if algorithms is not None else bench_algorithms.implemented_algorithms(backends)
    sizes = sorted({int(b) for b in batch_sizes})
    if not sizes or sizes[0] < 1:
        raise ValueError(f"batch sizes must be positive integers, not {list(batch_sizes)}")
    events = workload.events if events_limit is None else workload.events.slice(0, int(events_limit))
    if events.num_rows == 0:
        raise ValueError(f"workload {workload.name} has no events")
    stream = event_dicts(events, min(events.num_rows, events_needed(sizes, repeats, min_events)))
    try:
        reference = _reference(workload, events, scan_sample_size(workload.n_subscriptions, len(stream), scan_sample))
    except Exception as exc:
        # subscriptions or events the engine refuses (a --parquet workload's): nothing could be checked, so
        # every combination is an error row saying why, none timed unchecked
        if strict:
            raise
        return [BatchTiming(workload=workload.name, n_subscriptions=workload.n_subscriptions, algorithm=algorithm,
                            backend=backend, options=None, status="error",
                            note=f"no answers to check against: scan/cpu failed ({_describe(exc)})")
                for backend in backends for algorithm in algorithms]
    out = []
    bar = tqdm(total=len(algorithms) * len(backends) * len(sizes), desc="batch times", unit="size",
               disable=not progress, leave=False, file=sys.stderr)
    try:
        for backend in backends:
            for algorithm in algorithms:
                base = dict(workload=workload.name, n_subscriptions=workload.n_subscriptions, algorithm=algorithm,
                            backend=backend, options=None)
                try:
                    options = bench_algorithms.resolve_options(
                        algorithm, bench_algorithms.options_of(algorithm, algorithm_options), workload)
                    base["options"] = "; ".join(f"{key}={value}" for key, value in options.items()) or None
                    bench_algorithms.matcher_class(algorithm, backend)     # BackendUnavailable before any work
                    bar.set_postfix_str(f"{algorithm}/{backend} build")
                    out += _time_algorithm(workload, stream, algorithm, backend, options, sizes, base, reference,
                                           repeats=repeats, min_events=min_events, time_budget=time_budget,
                                           bar=bar)
                except BackendUnavailable as exc:
                    out.append(BatchTiming(**base, status="skipped", note=str(exc)))
                    bar.update(len(sizes))
                except Exception as exc:
                    if strict:
                        raise
                    out.append(BatchTiming(**base, status="error", note=_describe(exc)))
                    bar.update(len(sizes))
    finally:
        bar.close()
    return out


def _time_algorithm(workload, stream, algorithm, backend, options, sizes, base, reference, *, repeats,
                    min_events, time_budget, bar) -> list[BatchTiming]:
    _warm_up(algorithm, backend, workload.subscriptions, workload.events, stream, options)
    index = bench_algorithms.new_index(algorithm, backend, options)
    add_subscriptions(index, workload.subscriptions, workload.asts)
    index.merge()
    index.match_batch(stream[:1])                 # builds what the index builds lazily
    n = len(stream)
    timings = []
    for size in sizes:
        bar.set_postfix_str(f"{algorithm}/{backend} batches of {size}")
        # batch 0 is the untimed warm-up; every batch is cut before its clock starts
        batches = [(j * size, [stream[(j * size + i) % n] for i in range(size)])
                   for j in range(timed_batches(size, repeats, min_events) + 1)]
        found, seconds = [], []
        for j, (first, batch) in enumerate(batches):
            started = time.perf_counter()
            answers = index.match_batch(batch)
            elapsed = time.perf_counter() - started
            found.append((first, answers))
            if j:
                seconds.append(elapsed)
                if time_budget is not None and len(seconds) >= repeats and sum(seconds) > time_budget:
                    break
        checked, correct, note = _check(found, reference, n)
        if size > n:                              # (what a reader of the row should know: not the batch asked)
            repeats_note = f"a batch of {size} repeats the stream's {n} events"
            note = repeats_note if note is None else f"{note}; {repeats_note}"
        timings.append(BatchTiming(**base, batch_size=size, seconds=seconds, checked_events=checked,
                                   correct=correct, note=note))
        bar.update(1)
    return timings


def latency_rows(timings, delays_ms=DEFAULT_DELAYS_MS,
                 simulated_events: int = DEFAULT_SIMULATED_EVENTS) -> list[dict]:
    """One row (:data:`LATENCY_COLUMNS`) per timing and delay between
    events (ms): the measured batch time and the simulated latencies
    (:func:`simulate`), in ms; a timing that did not run gives one row, its
    status and note."""
    rows = []
    for timing in timings:
        common = dict(workload=timing.workload, algorithm=timing.algorithm, backend=timing.backend,
                      options=timing.options, status=timing.status, n_subscriptions=timing.n_subscriptions,
                      batch_size=timing.batch_size, checked_events=timing.checked_events, correct=timing.correct,
                      note=timing.note)
        if timing.status != "ok":
            rows.append({column: common.get(column) for column in LATENCY_COLUMNS})
            continue
        batch_s = timing.batch_s
        common.update(batches_timed=len(timing.seconds), batch_ms=batch_s * 1e3,
                      batch_events_per_s=timing.batch_size / batch_s if batch_s > 0 else None,
                      simulated_events=None)
        for delay_ms in delays_ms:
            sim = simulate(batch_s, timing.batch_size, delay_ms / 1e3, simulated_events)
            row = dict(common, arrival_delay_ms=float(delay_ms), utilization=sim["utilization"],
                       overloaded=sim["overloaded"], simulated_events=sim["n_events"],
                       latency_mean_ms=sim["mean"] * 1e3, latency_p99_ms=sim["p99"] * 1e3,
                       fill_mean_ms=sim["fill"] * 1e3, queue_mean_ms=sim["queue"] * 1e3)
            rows.append({column: row.get(column) for column in LATENCY_COLUMNS})
    return rows


def latency_sweep(workload, algorithms=None, backends=("cpu",), batch_sizes=DEFAULT_BATCH_SIZES,
                  delays_ms=DEFAULT_DELAYS_MS, *, simulated_events: int = DEFAULT_SIMULATED_EVENTS,
                  **options) -> list[dict]:
    """:func:`time_batches` (``options``: its keywords) then
    :func:`latency_rows`: A-PCM Fig. 12 for any algorithm."""
    delays = [float(d) for d in delays_ms]
    if not delays or any(not (math.isfinite(d) and d >= 0) for d in delays):
        raise ValueError(f"arrival delays are finite numbers of ms >= 0, not {list(delays_ms)}")
    timings = time_batches(workload, algorithms, backends, batch_sizes, **options)
    return latency_rows(timings, delays, simulated_events)


# ------------------------------------------------------------------ report
def _num(x) -> str:
    if x is None:
        return "-"
    return f"{x:,.0f}" if abs(x) >= 1000 else f"{x:.3g}"


def _aligned(cells) -> list[str]:
    widths = [max(len(row[i]) for row in cells) for i in range(len(cells[0]))]
    lines = []
    for n, row in enumerate(cells):
        lines.append("  ".join(c.ljust(w) if i == 0 else c.rjust(w)
                               for i, (c, w) in enumerate(zip(row, widths))).rstrip())
        if n == 0:
            lines.append("  ".join("-" * w for w in widths))
    return lines


def _series_namer(rows):
    """``algorithm@batch size`` -- with the backend and the workload when
    the rows have more than one of them."""
    backends = {r["backend"] for r in rows}
    workloads = {r["workload"] for r in rows}

    def name(row) -> str:
        text = row["algorithm"] if len(backends) == 1 else f"{row['algorithm']}/{row['backend']}"
        text = text if len(workloads) == 1 else f"{row['workload']}: {text}"
        return f"{text}@{row['batch_size']}"
    return name


def format_latency(rows) -> str:
    """Two tables: the measured batch times (one line per algorithm x
    backend x batch size), then the simulated average latency, one line per
    delay between events and one column per algorithm x batch size (A-PCM
    Fig. 12), ``*`` marking an overloaded stream; and what the simulation
    assumes."""
    ok = [r for r in rows if r["status"] == "ok"]
    lines = []
    if ok:
        first = ok[0]
        lines.append(f"{first['workload']} ({first['n_subscriptions']:,} subscriptions): the time to match one "
                     f"batch (match_batch of consecutive events; median of the timed batches)")
    cells = [["algorithm", "backend", "options", "batch", "timed", "batch ms", "events/s", "correct"]]
    seen = set()
    for row in rows:
        key = (row["algorithm"], row["backend"], row["batch_size"])
        if key in seen:
            continue
        seen.add(key)
        correct = row["status"] if row["status"] != "ok" else \
            {True: "yes", False: "NO", None: "-"}[row["correct"]]
        cells.append([row["algorithm"], row["backend"], row["options"] or "", str(row["batch_size"] or "-"),
                      str(row["batches_timed"] or "-"), _num(row["batch_ms"]), _num(row["batch_events_per_s"]),
                      correct + (f" ({row['note']})" if row["note"] else "")])
    lines += _aligned(cells)
    if not ok:
        return "\n".join(lines)
    series_name = _series_namer(ok)
    series = list(dict.fromkeys(series_name(r) for r in ok))
    delays = list(dict.fromkeys(r["arrival_delay_ms"] for r in ok))
    by_cell = {(series_name(r), r["arrival_delay_ms"]): r for r in ok}
    lines += ["", f"Average latency (ms) of events arriving every 'delay' ms, batches of 'algorithm@size' -- a "
                  f"discrete-event simulation of {ok[0]['simulated_events']:,} events (per batch size, whole "
                  f"batches) over the measured batch times:",
              "an event waits for its batch to fill, then for the batches queued before it, then for its "
              "batch's matching; @1 matches each event alone as it comes."]
    cells = [["delay ms", *series]]
    overloaded = False
    for delay in delays:
        line = [f"{delay:g}"]
        for name in series:
            row = by_cell.get((name, delay))
            if row is None:
                line.append("-")
                continue
            overloaded |= bool(row["overloaded"])
            line.append(_num(row["latency_mean_ms"]) + ("*" if row["overloaded"] else ""))
        cells.append(line)
    lines += _aligned(cells)
    if overloaded:
        lines.append("* overloaded: a batch takes longer to match than its events take to arrive, so the backlog, "
                     "and the average, grow with the length of the simulated stream.")
    return "\n".join(lines)


def plot_latency(rows, path=None):
    """Average latency against the delay between events (symlog x, log y),
    one line per algorithm x backend x batch size (A-PCM Fig. 12); written
    to ``path`` as PNG when given.  Returns the Figure."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    ok = [r for r in rows if r["status"] == "ok"]
    fig = Figure(figsize=(8, 5), layout="constrained")
    FigureCanvasAgg(fig)
    ax = fig.subplots()
    if not ok:
        ax.text(0.5, 0.5, "no results", ha="center", va="center", transform=ax.transAxes)
    series_name = _series_namer(ok)
    for name in dict.fromkeys(series_name(r) for r in ok):
        mine = sorted((r for r in ok if series_name(r) == name), key=lambda r: r["arrival_delay_ms"])
        label = name + (" WRONG ANSWERS" if any(r["correct"] is False for r in mine) else "")
        ax.plot([r["arrival_delay_ms"] for r in mine], [r["latency_mean_ms"] for r in mine], marker="o",
                label=label)
    positive = [r["arrival_delay_ms"] for r in ok if r["arrival_delay_ms"] > 0]
    if positive:      # a delay of 0 (no gaps) stays on the axis: linear below the smallest positive delay
        ax.set_xscale("symlog", linthresh=min(positive))
    if ok and all(r["latency_mean_ms"] > 0 for r in ok):
        ax.set_yscale("log")
    ax.invert_xaxis()          # as in the paper: the event rate rises to the right
    ax.set_xlabel("delay between events (ms)")
    ax.set_ylabel("average latency (ms)")
    ax.set_title("latency against batch size (simulated over measured batch times)")
    if ok:
        ax.legend(fontsize="small")
    if path is not None:
        fig.savefig(path, dpi=110)
    return fig
