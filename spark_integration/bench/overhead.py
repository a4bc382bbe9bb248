"""Spark's overhead over the in-process engine, measured in one run.

    python -m spark_integration.bench.overhead [--workload W1] [--scale 0.01] [--events N]
        [--algorithm ALG] [--repeats 3] [--master 'local[2]'] [--layout map|wide|both]
        [--output pairs|grouped] [--partitions P] [--arrow-batch-size N]
        [--action count|noop] [--profile]

One workload, generated once (default W1 x 0.01: 10,000 subscriptions,
40,000 events, ~4M matches), and one ``engine.Index``, built once from its
columnar subscriptions (the engine's best algorithm, or ``--algorithm``),
matched two ways:

* **in-process**: ``index.match_batch(events, output="arrow")`` on the
  whole wide events table, in this process (numba threads = all cores), one
  warm-up first;
* **Spark** (``--master``, default ``local[2]``): the events as a DataFrame
  created, repartitioned to ``--partitions`` (default: the session's
  parallelism), cached and counted first -- creating and serialising the
  input is not matching --, in one or both layouts of ``match_events``:
  *map* (``event_id`` + ``attrs map<string,long>``, each event's present
  attributes) and *wide* (one column per attribute, null = absent: W1 has
  400, ~15 present per event).  The index is shipped once
  (:func:`spark_integration.ship_index`); per layout one warm-up
  ``match_events`` (it loads the index in each Python worker) whose result
  is written to a temporary Parquet directory, read back and compared with
  the in-process result as the set of ``(event_id, sub_id)`` pairs; then
  timed runs of ``match_events(...)`` followed by an action that
  materialises every match (``count()`` by default, or a ``noop`` write).

The timed runs alternate -- in-process, then Spark in each layout, ``--repeats``
times -- so that a change in a shared machine's load hits both sides alike;
medians are reported, with the CPU seconds of this process tree (driver,
JVM, Python workers, from /proc) beside the wall seconds.  The report:
ratio ``spark_s / in_process_s`` (the target is <= 1.5 once the session is
warm; the headline is the first layout's, map's for ``both``), events/s
both ways, the index loads per Python worker and per executor from
:class:`MatchStats` (the index is shipped once per executor and loaded once
per worker however many runs), the machine (cores, CPU model, load
average), the versions and the date.

``--profile`` splits each layout's Spark time with two more ``mapInArrow``
runs over the same cached events: *input only* (every Arrow batch reaches
the worker, one row per batch comes back: cache -> rows -> Arrow -> Python)
and *match, no output* (the worker also does all match_events does per
batch -- its layout's events table, the bad-event check, match_batch on one
numba thread per task, the output batch -- but sends back one count per
batch); full ``match_events`` adds moving the matches to the JVM and
through Spark's rows, and building and planning a new DataFrame each run
("match_events() call" times the call alone, without an action).
"empty job" is a two-task ``range().count()``: the scheduling floor.

``run(spark=None, ...)`` does the same from Python and returns the figures as
a dict (keys :data:`FIELDS`); given a session it uses it and leaves it
running (restoring its Arrow batch size), otherwise it starts ``--master``
and stops it at the end.
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import statistics
import sys
import tempfile
import time

DEFAULT_WORKLOAD = "W1"
DEFAULT_SCALE = 0.01
#: events by default: enough that a warm Spark job's fixed cost (scheduling
#: its tasks) is small next to the matching, yet few enough for a quick run on
#: 2 cores (BENCHMARKS.md, "Spark", has the timings)
DEFAULT_EVENTS = 40_000
DEFAULT_REPEATS = 3
DEFAULT_MASTER = "local[2]"
TARGET_RATIO = 1.5
ACTIONS = ("count", "noop")
OUTPUTS = ("pairs", "grouped")
ARROW_BATCH_CONF = "spark.sql.execution.arrow.maxRecordsPerBatch"

LAYOUTS = ("map", "wide", "both")
DEFAULT_LAYOUT = "both"

#: every key of the dict :func:`run` returns
FIELDS = ("workload", "scale", "subscriptions", "events", "matches", "algorithm", "repeats", "action",
          "master", "partitions", "arrow_batch_size", "layout", "generate_s", "to_map_s", "to_wide_s", "build_s",
          "output", "in_process_s", "in_process_runs", "in_process_cpu_s", "in_process_events_per_s",
          "in_process_threads",
          "spark_start_s", "ship_s", "spark_s", "spark_runs", "spark_events_per_s", "ratio", "target_ratio",
          "within_target", "spark_layouts", "verified", "verified_pairs", "index_bytes", "shipments",
          "broadcast_id", "executors", "loads", "loads_per_worker", "loads_per_executor", "loads_per_worker_index",
          "load_s", "spark_batches", "profile", "machine")


# ------------------------------------------------------------------ machine

def machine_facts() -> dict:
    """nproc, CPU model, load average, date, versions."""
    model = None
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                if line.lower().startswith("model name"):
                    model = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    try:
        nproc = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        nproc = os.cpu_count()
    try:
        load = tuple(round(x, 2) for x in os.getloadavg())
    except OSError:
        load = None
    facts = {"nproc": nproc, "cpu_count": os.cpu_count(), "cpu_model": model or platform.processor() or "?",
             "loadavg": load, "date": datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
             "python": platform.python_version()}
    for name in ("pyspark", "pyarrow", "numba", "numpy"):
        try:
            facts[name] = __import__(name).__version__
        except Exception:       # not installed / no version: leave it out
            pass
    try:
        import numba
        facts["numba_threads"] = numba.get_num_threads()
    except Exception:
        pass
    home = os.environ.get("JAVA_HOME")
    if home:
        from spark_integration.job import _java_major
        facts["java"] = _java_major(home)
    return facts


# ------------------------------------------------------------------ events in map form

def wide_to_map(table, attrs_column: str = "attrs"):
    """The events of a wide table (one column per attribute, null = absent)
    as one ``map<string, V>`` column holding each event's present
    attributes, in column order (the "map" layout of match_events).  The
    attribute columns must share one type (W1: int64)."""
    import numpy as np
    import pyarrow as pa

    names = table.column_names
    types = {table.schema.field(name).type for name in names}
    if len(types) != 1:
        raise ValueError(f"the map layout needs attribute columns of one type, not {sorted(map(str, types))}")
    value_type = types.pop()
    n = table.num_rows
    if not names:
        return pa.MapArray.from_arrays(pa.array(np.zeros(n + 1, np.int32)), pa.array([], pa.string()),
                                       pa.array([], value_type))
    valid = np.column_stack([table[c].is_valid().to_numpy(zero_copy_only=False) for c in names])
    rows, cols = np.nonzero(valid)                        # row-major: each event's attributes in column order
    offsets = np.zeros(n + 1, np.int64)
    np.cumsum(np.bincount(rows, minlength=n), out=offsets[1:])
    # the values, gathered column by column in (row, col) order
    flat = np.ravel_multi_index((cols, rows), (len(names), n))
    values = pa.concat_arrays([table[c].combine_chunks() for c in names])
    keys = pa.DictionaryArray.from_arrays(pa.array(cols, pa.int32()), pa.array(names, pa.string())).cast(pa.string())
    return pa.MapArray.from_arrays(pa.array(offsets, pa.int32()), keys, values.take(pa.array(flat)))


# ------------------------------------------------------------------ worker functions (--profile)

class _InputOnly:
    """Receives every Arrow batch, returns one row per batch (its size):
    what reaching the Python worker costs, without matching."""

    def __init__(self, matcher):
        self.matcher = matcher

    def __call__(self, batches):
        import pyarrow as pa

        for batch in batches:
            yield pa.RecordBatch.from_pydict({"n": pa.array([batch.num_rows], pa.int64())})


class _MatchNoOutput(_InputOnly):
    """What match_events' worker does -- the worker's cached index, one numba
    thread per task core, and per batch the matcher's whole ``match`` (the
    layout's events table, the bad-event check, match_batch, the output
    batch) -- but returns only the number of rows of each output batch."""

    def __call__(self, batches):
        import pyarrow as pa
        from pyspark import TaskContext

        from spark_integration.matching import _limit_threads
        from spark_integration.shipping import worker_index

        m = self.matcher
        index, _ = worker_index(m.shipped, backend=m.backend, gpu_fallback=m.gpu_fallback, capacity=m.capacity,
                                stats=m.stats_acc)
        _limit_threads(TaskContext.get())
        for batch in batches:
            yield pa.RecordBatch.from_pydict({"n": pa.array([m.match(index, batch).num_rows], pa.int64())})


# ------------------------------------------------------------------ verification

def batch_pairs(table, grouped: bool):
    """(event ids, sub ids) as arrays, from match_events' output read back as a pyarrow Table."""
    import pyarrow.compute as pc

    if not grouped:
        return table["event_id"].to_numpy(), table["sub_id"].to_numpy()
    lists = table["sub_ids"].combine_chunks()
    ids = table["event_id"].combine_chunks().to_numpy(zero_copy_only=False)
    return ids[pc.list_parent_indices(lists).to_numpy()], pc.list_flatten(lists).to_numpy()


def spark_pairs(matches_df, grouped: bool):
    """Every (event_id, sub_id) of a match_events DataFrame, sorted: written
    to a temporary Parquet directory by the JVM and read back here (no
    driver-heap limit on the result's size, and no extra Python workers)."""
    import pyarrow.parquet as pq

    with tempfile.TemporaryDirectory(prefix="bexmatch-bench-verify-") as tmp:
        path = os.path.join(tmp, "matches.parquet")
        matches_df.write.parquet(path)
        return _pairs(*batch_pairs(pq.read_table(path), grouped))


# ------------------------------------------------------------------ helpers

def _pairs(event_ids, sub_ids):
    """(event_id, sub_id) pairs as two int64 arrays sorted lexicographically."""
    import numpy as np

    e = np.asarray(event_ids, dtype=np.int64)
    s = np.asarray(sub_ids, dtype=np.int64)
    order = np.lexsort((s, e))
    return e[order], s[order]


def _materialise(df, action: str) -> int | None:
    if action == "count":
        return df.count()
    df.write.format("noop").mode("overwrite").save()
    return None


def _timed(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def _medians(runs) -> dict:
    """{"s": median wall seconds, "cpu_s": median CPU seconds} of (wall, cpu) pairs."""
    cpus = [cpu for _, cpu in runs]
    return {"s": statistics.median(wall for wall, _ in runs),
            "cpu_s": None if None in cpus else statistics.median(cpus)}


def tree_cpu_seconds(root: int | None = None) -> float | None:
    """CPU seconds (user + system) used so far by process ``root`` (this
    one by default) and all its descendants -- the live ones, and those
    already reaped through their parents' cutime/cstime -- from /proc: the
    driver, its JVM, the PySpark daemon and Python workers.  None without
    /proc."""
    root = os.getpid() if root is None else root
    ticks: dict = {}
    children: dict = {}
    try:
        hz = os.sysconf("SC_CLK_TCK")
        entries = os.listdir("/proc")
    except (OSError, ValueError, AttributeError):
        return None
    for entry in entries:
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as f:
                data = f.read()
        except OSError:         # the process ended meanwhile
            continue
        fields = data[data.rindex(b")") + 2:].split()
        ticks[int(entry)] = sum(int(x) for x in fields[11:15])     # utime stime cutime cstime
        children.setdefault(int(fields[1]), []).append(int(entry))
    if root not in ticks:
        return None
    total, todo = 0, [root]
    while todo:
        pid = todo.pop()
        total += ticks.get(pid, 0)
        todo.extend(children.get(pid, ()))
    return total / hz


def _timed_cpu(fn) -> tuple[float, float | None]:
    """(wall seconds, CPU seconds of this process tree) of fn()."""
    cpu = tree_cpu_seconds()
    wall = _timed(fn)
    after = tree_cpu_seconds()
    return wall, (None if cpu is None or after is None else after - cpu)


def _start_session(master: str, partitions: int | None):
    from spark_integration.job import prepare_environment

    prepare_environment(master)
    from pyspark.sql import SparkSession

    builder = (SparkSession.builder.master(master).appName("bexmatch-bench-overhead")
               .config("spark.sql.execution.arrow.pyspark.enabled", "true")
               .config("spark.ui.enabled", "false")
               .config("spark.ui.showConsoleProgress", "false")
               .config("spark.driver.memory", "2g"))
    if partitions:
        builder = builder.config("spark.sql.shuffle.partitions", str(partitions))
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    return spark


# ------------------------------------------------------------------ the benchmark

def run(spark=None, *, workload: str = DEFAULT_WORKLOAD, scale: float = DEFAULT_SCALE, n_events: int | None = None,
        algorithm: str | None = None, repeats: int = DEFAULT_REPEATS, master: str = DEFAULT_MASTER,
        layout: str = DEFAULT_LAYOUT, partitions: int | None = None, arrow_batch_size: int | None = None,
        output: str = "pairs", action: str = "count", profile: bool = False, seed: int = 0,
        verbose: bool = False) -> dict:
    """Measure in-process ``match_batch`` and the Spark job on the same
    workload and index; returns the figures (:data:`FIELDS`).

    ``spark``: an existing session to use (left running; its Arrow batch
    size is restored afterwards), else one is started on ``master`` and
    stopped at the end.  ``n_events``: events to generate (default
    :data:`DEFAULT_EVENTS`).  ``layout``: how the events DataFrame holds
    the events -- "map", "wide" or "both" (each measured; the top-level
    ``spark_s``/``ratio`` are the first one's, map's for "both").
    ``partitions``: partitions of the cached events (default: the session's
    parallelism).  ``output``: match_events' output, "pairs" (one row per
    match) or "grouped" (one row per event, a list of ids).  The in-process
    and Spark runs alternate, so that a change in the machine's load hits
    both alike."""
    import numpy as np
    import pyarrow as pa

    from engine import Index, workloads

    if repeats < 1:
        raise ValueError(f"repeats must be >= 1, not {repeats!r}")
    if action not in ACTIONS:
        raise ValueError(f"action must be one of {ACTIONS}, not {action!r}")
    if output not in OUTPUTS:
        raise ValueError(f"output must be one of {OUTPUTS}, not {output!r}")
    if layout not in LAYOUTS:
        raise ValueError(f"layout must be one of {LAYOUTS}, not {layout!r}")
    layouts = ("map", "wide") if layout == "both" else (layout,)

    def say(text):
        if verbose:
            print(f"[bench_overhead] {text}", file=sys.stderr, flush=True)

    out: dict = {"workload": workload, "scale": float(scale), "repeats": int(repeats), "action": action,
                 "output": output, "arrow_batch_size": arrow_batch_size, "layout": layouts[0]}
    try:
        load_at_start = tuple(round(x, 2) for x in os.getloadavg())
    except OSError:
        load_at_start = None
    n_events = DEFAULT_EVENTS if n_events is None else int(n_events)

    # 1. the workload, once (and its events in each layout)
    start = time.perf_counter()
    generated = workloads.standard(workload, scale=scale, n_events=n_events, seed=seed)
    events = generated.events
    if "event_id" in events.column_names:
        events = events.drop_columns(["event_id"])
    ids = pa.array(np.arange(events.num_rows), pa.int64())
    out["generate_s"] = time.perf_counter() - start
    out["events"] = events.num_rows
    # a workload whose events already are one map column (W3) has no wide table to send
    native_map = events.num_columns == 1 and pa.types.is_map(events.schema.field(0).type)
    if native_map and "wide" in layouts:
        raise ValueError(f"{workload}'s events come as one map column: use layout='map'")
    tables = {}
    for name in layouts:
        start = time.perf_counter()
        tables[name] = events.add_column(0, "event_id", ids) if name == "wide" else \
            pa.table({"event_id": ids, "attrs": events.column(0) if native_map else wide_to_map(events)})
        out["to_map_s" if name == "map" else "to_wide_s"] = time.perf_counter() - start
    say(f"generated {generated!r} in {out['generate_s']:.1f}s")

    # 2. the index, once
    start = time.perf_counter()
    index = Index(algorithm=algorithm) if algorithm else Index()
    index.add_many(generated.subscriptions)
    index.merge()
    out["build_s"] = time.perf_counter() - start
    out["subscriptions"] = len(index)
    out["algorithm"] = index.algorithm
    say(f"built {index!r} in {out['build_s']:.1f}s")

    # 3. in-process warm-up (numba compilation); the timed runs alternate with Spark's below
    expected = index.match_batch(events, output="arrow")
    out["matches"] = expected.num_rows
    try:
        import numba
        out["in_process_threads"] = numba.get_num_threads()
    except Exception:
        out["in_process_threads"] = None

    # 4. Spark
    owned = spark is None
    start = time.perf_counter()
    if owned:
        spark = _start_session(master, partitions)
    out["spark_start_s"] = time.perf_counter() - start
    previous_batch = spark.conf.get(ARROW_BATCH_CONF, None)
    try:
        _run_spark(spark, out, index, events, tables, expected, layouts=layouts, partitions=partitions,
                   arrow_batch_size=arrow_batch_size, action=action, repeats=repeats, profile=profile, say=say)
    finally:
        if owned:
            spark.stop()
        elif arrow_batch_size is not None:
            if previous_batch is None:
                spark.conf.unset(ARROW_BATCH_CONF)
            else:
                spark.conf.set(ARROW_BATCH_CONF, previous_batch)
    out["in_process_events_per_s"] = out["events"] / out["in_process_s"] if out["in_process_s"] > 0 else 0.0
    for figures in out["spark_layouts"].values():
        figures["events_per_s"] = out["events"] / figures["spark_s"] if figures["spark_s"] > 0 else 0.0
        figures["ratio"] = figures["spark_s"] / out["in_process_s"] if out["in_process_s"] > 0 else float("inf")
        figures["cpu_ratio"] = figures["cpu_s"] / out["in_process_cpu_s"] \
            if figures["cpu_s"] is not None and out["in_process_cpu_s"] else None
    primary = out["spark_layouts"][layouts[0]]
    out.update(spark_s=primary["spark_s"], spark_runs=primary["runs"], spark_events_per_s=primary["events_per_s"],
               ratio=primary["ratio"], verified=all(f["verified"] for f in out["spark_layouts"].values()),
               verified_pairs=primary["verified_pairs"])
    out["target_ratio"] = TARGET_RATIO
    out["within_target"] = out["ratio"] <= TARGET_RATIO
    out["machine"] = dict(machine_facts(), loadavg_start=load_at_start)
    return {key: out.get(key) for key in FIELDS}


def _run_spark(spark, out, index, events, tables, expected, *, layouts, partitions, arrow_batch_size, action,
               repeats, profile, say) -> None:
    import numpy as np

    from spark_integration import matching
    from spark_integration.matching import match_events
    from spark_integration.shipping import MatchStats, ship_index

    sc = spark.sparkContext
    out["master"] = sc.master
    partitions = partitions or sc.defaultParallelism
    out["partitions"] = partitions
    figures = out["spark_layouts"] = {name: {} for name in layouts}

    # the events, cached: creating and serialising them is not matching
    frames = {}
    try:
        for name in layouts:
            start = time.perf_counter()
            frames[name] = spark.createDataFrame(tables[name]).repartition(partitions).cache()
            cached = frames[name].count()
            figures[name]["cache_s"] = time.perf_counter() - start
            if cached != out["events"]:
                raise AssertionError(f"the cached {name} events DataFrame has {cached} rows, not {out['events']}")
            say(f"{name} events cached in {figures[name]['cache_s']:.1f}s ({partitions} partitions)")

        stats = MatchStats(spark)
        start = time.perf_counter()
        shipped = ship_index(spark, index)
        out["ship_s"] = time.perf_counter() - start
        out["index_bytes"] = shipped.nbytes
        jbroadcast = getattr(shipped.handle, "_jbroadcast", None)
        out["broadcast_id"] = int(jbroadcast.id()) if jbroadcast is not None else None

        def matches(name):
            return match_events(frames[name], shipped, layout=name, arrow_batch_size=arrow_batch_size,
                                output=out["output"], stats=stats)

        # warm-up: loads the index in every Python worker; its result is the one verified
        want_e, want_s = _pairs(expected["event"].to_numpy(), expected["sub_id"].to_numpy())
        for name in layouts:
            start = time.perf_counter()
            got_e, got_s = spark_pairs(matches(name), out["output"] == "grouped")
            figures[name]["warmup_s"] = time.perf_counter() - start
            figures[name]["verified"] = bool(np.array_equal(want_e, got_e) and np.array_equal(want_s, got_s))
            figures[name]["verified_pairs"] = int(len(got_e))
            if not figures[name]["verified"]:
                raise AssertionError(f"Spark's matches ({name} layout) differ from the in-process ones: "
                                     f"{len(got_e)} vs {len(want_e)} pairs")
            say(f"{name}: warm-up + verification {figures[name]['warmup_s']:.1f}s: "
                f"{figures[name]['verified_pairs']:,} pairs agree")
        del got_e, got_s, want_e, want_s

        # the timed runs: in-process, then each layout on Spark, alternating
        in_process, in_cpu, counts = [], [], []
        spark_runs, spark_cpu = {name: [] for name in layouts}, {name: [] for name in layouts}
        for rep in range(repeats):
            wall, cpu = _timed_cpu(lambda: index.match_batch(events, output="arrow"))
            in_process.append(wall)
            in_cpu.append(cpu)
            for name in layouts:
                wall, cpu = _timed_cpu(lambda: counts.append(_materialise(matches(name), action)))
                spark_runs[name].append(wall)
                spark_cpu[name].append(cpu)
            say(f"repeat {rep + 1}/{repeats}: in-process {in_process[-1]:.3f}s, "
                + ", ".join(f"spark {name} {spark_runs[name][-1]:.3f}s" for name in layouts))
        want = out["matches"] if out["output"] == "pairs" else out["events"]
        if action == "count" and any(c != want for c in counts):
            raise AssertionError(f"Spark counted {counts} rows, not {want}")
        out["in_process_s"], out["in_process_runs"] = statistics.median(in_process), in_process
        out["in_process_cpu_s"] = None if None in in_cpu else statistics.median(in_cpu)
        for name in layouts:
            figures[name]["spark_s"], figures[name]["runs"] = statistics.median(spark_runs[name]), spark_runs[name]
            figures[name]["cpu_s"] = None if None in spark_cpu[name] else statistics.median(spark_cpu[name])

        if profile:
            out["profile"] = {}
            for name in layouts:
                template = matching._BatchMatcher(
                    shipped, event_id="event_id", layout=name, attrs_column="attrs", output=out["output"],
                    on_bad_event="fail", report_bad=True, batch_size=arrow_batch_size, backend="auto",
                    gpu_fallback=False, capacity=2, stats_acc=stats.accumulator, inject_failure=False)
                source = frames[name].select(*(["event_id", "attrs"] if name == "map" else frames[name].columns))
                stages = out["profile"][name] = {}
                for stage, cls in (("input only", _InputOnly), ("match, no output", _MatchNoOutput)):
                    df = source.mapInArrow(cls(template), "n long")
                    _materialise(df, action)        # warm-up
                    stages[stage] = _medians([_timed_cpu(lambda: _materialise(df, action)) for _ in range(repeats)])
                    say(f"profile {name} {stage}: {stages[stage]}")
                stages["match_events() call"] = _medians([_timed_cpu(lambda: matches(name)) for _ in range(repeats)])
                stages["full match_events"] = {"s": figures[name]["spark_s"], "cpu_s": figures[name]["cpu_s"]}
            out["profile"]["empty job"] = _medians(
                [_timed_cpu(lambda: spark.range(0, partitions, 1, partitions).count()) for _ in range(repeats)])

        per_worker = stats.loads_per_worker
        per_executor: dict = {}
        for (host, _pid), n in per_worker.items():
            per_executor[host] = per_executor.get(host, 0) + n
        out["loads"] = stats.loads
        out["loads_per_worker"] = {f"{host}:{pid}": n for (host, pid), n in sorted(per_worker.items())}
        out["loads_per_executor"] = per_executor
        out["loads_per_worker_index"] = sorted(set(stats.loads_per_index.values()))
        out["load_s"] = stats.load_seconds
        out["spark_batches"] = stats.batches
        # executors: local mode runs one (the driver's JVM); on a cluster, the registered ones less the driver
        infos = sc._jsc.sc().statusTracker().getExecutorInfos()
        out["executors"] = max(1, len(infos) - (0 if sc.master.startswith("local") else 1))
        from spark_integration import shipping
        out["shipments"] = sum(1 for (app, digest, _method) in shipping._SHIPPED
                               if app == sc.applicationId and digest == shipped.digest)
    finally:
        for frame in frames.values():
            frame.unpersist()


# ------------------------------------------------------------------ report

def format_report(r: dict, command: str | None = None) -> str:
    m = r["machine"]

    def loadavg(values):
        return "/".join(f"{x:g}" for x in values) if values else "?"

    load = f"{loadavg(m.get('loadavg_start'))} at start, {loadavg(m.get('loadavg'))} at end"

    def runs(values):
        return " ".join(f"{x:.2f}" for x in values)

    def cpu(value):
        return "-" if value is None else f"{value:.2f}"

    width = max(16, 5 * len(r["in_process_runs"]) - 1)
    lines = [f"$ {command}"] if command else []
    lines += [
        f"bexmatch bench_overhead: {r['workload']} scale {r['scale']:g}: {r['subscriptions']:,} subscriptions, "
        f"{r['events']:,} events, {r['matches']:,} matches; algorithm {r['algorithm']}",
        f"machine: nproc {m['nproc']}, {m['cpu_model']}; load average (1 min) {load}; {m['date']}",
        f"         python {m['python']}, "
        f"pyspark {m.get('pyspark', '?')}, java {m.get('java', '?')}, numba {m.get('numba', '?')}",
        "",
        f"  {'':<44} {'median s':>8}  {'runs s':<{width}} {'events/s':>9} {'ratio':>6} {'cpu s':>6} {'cpu ratio':>9}",
        f"  {'in-process match_batch':<44} {r['in_process_s']:>8.3f}  {runs(r['in_process_runs']):<{width}} "
        f"{r['in_process_events_per_s']:>9,.0f} {1:>6.2f} {cpu(r['in_process_cpu_s']):>6} {1:>9.2f}",
    ]
    for name, f in r["spark_layouts"].items():
        label = f"spark {r['master']} {name} match_events+{r['action']}"
        if r["output"] != "pairs":
            label = f"spark {r['master']} {name} {r['output']}+{r['action']}"
        lines.append(f"  {label:<44} {f['spark_s']:>8.3f}  {runs(f['runs']):<{width}} {f['events_per_s']:>9,.0f} "
                     f"{f['ratio']:>6.2f} {cpu(f['cpu_s']):>6} "
                     f"{'-' if f['cpu_ratio'] is None else format(f['cpu_ratio'], '.2f'):>9}")
    lines.append(f"  ratio spark ({r['layout']}) / in-process: {r['ratio']:.2f} -- target <= {r['target_ratio']:g}: "
                 f"{'met' if r['within_target'] else 'NOT met'}")
    if r.get("profile"):
        def stage(figures):
            return f"{figures['s']:.3f} s / {cpu(figures['cpu_s'])} cpu s"

        lines.append(f"  profile (spark medians, wall / cpu): empty job {stage(r['profile']['empty job'])}")
        for name, stages in r["profile"].items():
            if name != "empty job":
                lines.append(f"    {name + ':':<6} " + " | ".join(f"{key} {stage(v)}" for key, v in stages.items()))
    caches = " | ".join(f"{name} events create+cache+count {f['cache_s']:.1f}"
                        for name, f in r["spark_layouts"].items())
    warmups = " | ".join(f"{name} warm-up+verify {f['warmup_s']:.1f}" for name, f in r["spark_layouts"].items())
    lines += [
        "",
        f"  in-process: {r['in_process_threads']} numba threads, one batch; spark: {r['partitions']} partitions of "
        f"cached events, arrow batch {r['arrow_batch_size'] or 'default'}, 1 numba thread per task, "
        f"{r['spark_batches']} batches matched in all",
        f"  setup s: generate {r['generate_s']:.1f}"
        + (f" | to map {r['to_map_s']:.1f}" if r.get("to_map_s") is not None else "")
        + f" | build index {r['build_s']:.1f} | start spark {r['spark_start_s']:.1f} | {caches} | "
        f"ship {r['ship_s']:.2f} | {warmups}",
        f"  verified: {'yes' if r['verified'] else 'NO'} -- Spark's (event_id, sub_id) pairs == in-process "
        f"({r['verified_pairs']:,} pairs, every layout)",
        f"  index: {r['index_bytes']:,} bytes, shipped {r['shipments']} time(s) (broadcast id {r['broadcast_id']}) to "
        f"{r['executors']} executor(s); loaded {r['loads']} time(s) in all ({r['load_s']:.2f} s) over "
        f"{len(r['spark_layouts'])} warm-up(s) + {r['repeats'] * len(r['spark_layouts'])} timed runs"
        + (" + profile runs" if r.get("profile") else ""),
        f"  loads per worker:   {r['loads_per_worker']}",
        f"  loads per executor: {r['loads_per_executor']}  (= its Python workers, each loaded once; "
        f"loads per (worker, index): {r['loads_per_worker_index']})",
    ]
    return "\n".join(lines)


def main(argv=None) -> int:
    from spark_integration.job import JAVA_INT_MAX, int_in, positive_float

    p = argparse.ArgumentParser(prog="python -m spark_integration.bench.overhead",
                                description=__doc__.splitlines()[0])
    p.add_argument("--workload", default=DEFAULT_WORKLOAD)
    p.add_argument("--scale", type=positive_float, default=DEFAULT_SCALE)
    p.add_argument("--events", type=int_in(1), default=None, help=f"events (default {DEFAULT_EVENTS:,})")
    p.add_argument("--algorithm", default=None, help="matching algorithm (default: the engine's best)")
    p.add_argument("--repeats", type=int_in(1), default=DEFAULT_REPEATS)
    p.add_argument("--master", default=DEFAULT_MASTER)
    p.add_argument("--layout", choices=LAYOUTS, default=DEFAULT_LAYOUT,
                   help="events DataFrame layout: map<string,long> column, one column per attribute, or both "
                        f"(default {DEFAULT_LAYOUT})")
    p.add_argument("--partitions", type=int_in(1, JAVA_INT_MAX), default=None,
                   help="partitions of the events (default: parallelism)")
    p.add_argument("--arrow-batch-size", type=int_in(1, JAVA_INT_MAX), default=None,
                   help="rows per Arrow batch (default: Spark's)")
    p.add_argument("--output", choices=OUTPUTS, default="pairs",
                   help="match_events output: a row per match, or a row per event with a list (default pairs)")
    p.add_argument("--action", choices=ACTIONS, default="count", help="what materialises the matches")
    p.add_argument("--profile", action="store_true", help="split the Spark time (input, matching, output)")
    p.add_argument("--seed", type=int_in(0), default=0)
    p.add_argument("--quiet", action="store_true", help="no progress lines on stderr")
    args = p.parse_args(argv)
    result = run(workload=args.workload, scale=args.scale, n_events=args.events, algorithm=args.algorithm,
                 repeats=args.repeats, master=args.master, layout=args.layout, partitions=args.partitions,
                 arrow_batch_size=args.arrow_batch_size, output=args.output, action=args.action,
                 profile=args.profile, seed=args.seed, verbose=not args.quiet)
    command = " ".join(["python -m spark_integration.bench.overhead", *(argv if argv is not None else sys.argv[1:])])
    print(format_report(result, command))
    return 0


if __name__ == "__main__":
    sys.exit(main())
