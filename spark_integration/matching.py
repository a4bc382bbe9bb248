"""``match_events``: a DataFrame of events in, a DataFrame of matches out,
through ``mapInArrow`` (docs/architecture.md#spark)."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any, NamedTuple

import numpy as np
import pyarrow as pa

from engine import errors as engine_errors
from spark_integration import layout as layouts
from spark_integration.session import check_workers
from spark_integration.shipping import DEFAULT_SHIP, ShardedIndex, ShippedIndex, ship_index, worker_index

logger = logging.getLogger(__name__)

if TYPE_CHECKING:       # (hints only: importing this module does not import pyspark)
    import os

    from pyspark.sql import DataFrame

    from engine import Index
    from spark_integration.shipping import MatchStats

MODES = ("replicate", "shard")
OUTPUTS = ("pairs", "grouped")
ON_BAD_EVENT = ("fail", "quarantine")
ARROW_BATCH_CONF = "spark.sql.execution.arrow.maxRecordsPerBatch"
ERROR_COLUMN = "error"
ATTRIBUTE_COLUMN = "attribute"


class BadEventError(engine_errors.BadEventError):
    """An event the engine refuses (a value of the wrong type family, NaN,
    an integer beyond ±2**53), named by its event id.

    The engine's fields (``event``: the row in the Arrow batch the worker
    matched, ``attribute``, ``value``, ``reason``) and ``event_id``, the
    value of the event id column ``id_column``."""

    def __init__(self, event: int, attribute: str | None, value: object, reason: str, hint: str = "", *,
                 event_id: object = None, id_column: str = "event_id"):
        super().__init__(event, attribute, value, reason, hint)
        self.event_id = event_id
        self.id_column = id_column
        self.args = (f"bad event {id_column}={event_id!r}: {reason}{hint}",)

    @classmethod
    def of(cls, error: engine_errors.BadEventError, event_id, id_column: str) -> BadEventError:
        """The engine's ``error``, named by the event's id."""
        return cls(error.event, error.attribute, error.value, error.reason,
                   " (on_bad_event='quarantine' sets such events aside instead of failing)",
                   event_id=event_id, id_column=id_column)

    def __reduce__(self):
        return _rebuild_bad_event, (type(self), self.event, self.attribute, self.value, self.reason, self.hint,
                                    self.event_id, self.id_column)


def _rebuild_bad_event(cls, event, attribute, value, reason, hint, event_id, id_column):
    return cls(event, attribute, value, reason, hint, event_id=event_id, id_column=id_column)


class InjectedFailure(RuntimeError):
    """The failure ``inject_failure`` asks for (fault-tolerance tests)."""


class MatchResult(NamedTuple):
    """What ``match_events(..., on_bad_event="quarantine")`` returns.

    ``matches``: as without quarantine.  ``quarantine``: one row per refused
    event, ``(event_id, attribute, error)``: the attribute whose value the
    engine refused (null when the event itself is wrong) and why, from the
    engine's :class:`engine.errors.BadEventError` (its ``attribute`` and
    ``reason``).  Both are views of ``combined`` (matches and refusals in
    one DataFrame, with a null ``attribute`` and ``error`` on matches):
    persist ``combined`` before using both, or every action matches again."""

    matches: object
    quarantine: object
    combined: object


# ------------------------------------------------------------------ worker

def _limit_threads(context) -> None:
    """Run the engine's numba-parallel kernels on the cores Spark gave the
    task (``spark.task.cpus``), not on every core of the machine: an
    executor runs one task per core, each in its own Python worker, and
    each would otherwise start a thread per core."""
    if context is None:
        return
    try:
        cpus = int(context.cpus())
    except Exception:      # an older TaskContext without cpus()
        return
    try:
        import numba
        numba.set_num_threads(max(1, min(cpus, numba.config.NUMBA_NUM_THREADS)))
    except Exception:      # no numba threading layer here: nothing to limit
        pass


class _BatchMatcher:
    """The function mapInArrow runs: one per (shipped index or shard).

    Picklable; holds no index, only the shipped handle.  On a worker the
    index comes from :func:`spark_integration.shipping.worker_index`'s
    cache, so a worker deserialises it once however many tasks and batches
    it runs."""

    def __init__(self, shipped: ShippedIndex, *, event_id: str, layout: str, attrs_column: str, output: str,
                 on_bad_event: str, report_bad: bool, batch_size: int | None, backend: str, gpu_fallback: bool,
                 capacity: int, stats_acc, inject_failure, names: list | None = None):
        self.shipped = shipped
        self.names = names               # the batches' column names (they travel under plain ones)
        self.event_id = event_id
        self.layout = layout
        self.attrs_column = attrs_column
        self.output = output
        self.on_bad_event = on_bad_event
        self.report_bad = report_bad     # in shard mode only shard 0 reports refused events
        self.batch_size = batch_size
        self.backend = backend
        self.gpu_fallback = gpu_fallback
        self.capacity = capacity
        self.stats_acc = stats_acc
        self.inject_failure = inject_failure

    # -- the mapInArrow function
    def __call__(self, batches):
        from pyspark import TaskContext

        index, _choice = worker_index(self.shipped, backend=self.backend, gpu_fallback=self.gpu_fallback,
                                      capacity=self.capacity, stats=self.stats_acc)
        context = TaskContext.get()
        _limit_threads(context)
        fail_now = self._should_fail(context)
        n_batches = n_events = 0
        for batch in batches:
            if self.names is not None:
                batch = pa.RecordBatch.from_arrays(batch.columns, names=self.names)
            pieces = [batch] if not self.batch_size or batch.num_rows <= self.batch_size else \
                [batch.slice(at, self.batch_size) for at in range(0, batch.num_rows, self.batch_size)]
            for piece in pieces:
                n_batches += 1
                n_events += piece.num_rows
                yield self.match(index, piece)
                if fail_now:
                    raise InjectedFailure(f"injected failure in partition {context.partitionId()}, attempt "
                                          f"{context.attemptNumber()} (inject_failure)")
        if fail_now:
            raise InjectedFailure(f"injected failure in partition {context.partitionId()}, attempt "
                                  f"{context.attemptNumber()} (inject_failure)")
        if self.stats_acc is not None:
            self.stats_acc.add({("batches",): n_batches, ("events",): n_events})

    def _should_fail(self, context) -> bool:
        if not self.inject_failure or context is None or context.attemptNumber() != 0:
            return False
        return self.inject_failure is True or context.partitionId() in self.inject_failure

    # -- one Arrow batch
    def events_table(self, batch) -> pa.Table:
        if self.layout == "map":      # the engine reads the map column itself
            return pa.table({self.attrs_column: batch.column(self.attrs_column)})
        names = [n for n in batch.schema.names if n != self.event_id]
        return pa.Table.from_batches([batch]).select(names)

    def match(self, index, batch: pa.RecordBatch) -> pa.RecordBatch:
        """The output rows of one Arrow batch.  The engine reports the bad
        events of the batch beside its matches (``errors="report"``: it
        matches the good events only); they fail the task, naming the
        first one by its event id, or are quarantined, with the attribute
        and the reason the engine gives."""
        ids = batch.column(self.event_id)
        events = self.events_table(batch)
        result, rejected = self.match_events_table(index, events)
        if rejected and self.on_bad_event == "fail":
            first = rejected[0]
            raise BadEventError.of(first, ids[first.event].as_py(), self.event_id) from first
        sub_ids = result["sub_id"].combine_chunks() if isinstance(result["sub_id"], pa.ChunkedArray) \
            else result["sub_id"]
        return self._output(ids, batch.num_rows, result["event"].to_numpy(), sub_ids,
                            {error.event: error for error in rejected})

    def match_events_table(self, index, events: pa.Table) -> tuple:
        """``(matches, refused events)`` of one batch's events.  On a GPU
        executor (an index on cuda) the columns go to the device in one
        copy and are encoded there (:mod:`engine.device_events`), the map
        layout's map as a sparse :class:`engine.device_maps.DeviceMap`; a
        column type the device form lacks (a list, a map of lists) and a
        column of another family than its attribute take the host encoder,
        which names each bad event."""
        if getattr(index, "backend", "cpu") == "cuda":
            from engine import device_events
            try:
                columns, valid = device_events.arrow_columns(events)
            except TypeError:
                columns = None
            if columns:
                try:
                    return index.match_batch(columns, valid=valid, output="arrow", errors="report")
                except engine_errors.SchemaError as error:
                    if isinstance(error, engine_errors.BadEventError):
                        raise
        return index.match_batch(events, output="arrow", errors="report")

    def _output(self, ids, n: int, event_pos: np.ndarray, sub_ids, problems: dict) -> pa.RecordBatch:
        """``problems``: {row: the engine's BadEventError} of the batch's
        refused events (which have no pairs in ``event_pos``)."""
        quarantine = self.on_bad_event == "quarantine"
        bad = sorted(problems) if (quarantine and self.report_bad) else []
        if self.output == "pairs":
            columns = {self.event_id: ids.take(pa.array(event_pos, pa.int64())),
                       "sub_id": sub_ids.cast(pa.int64())}
            if quarantine:
                columns[ATTRIBUTE_COLUMN] = pa.nulls(len(event_pos), pa.string())
                columns[ERROR_COLUMN] = pa.nulls(len(event_pos), pa.string())
                out = pa.RecordBatch.from_pydict(columns)
                if bad:
                    extra = pa.RecordBatch.from_pydict({
                        self.event_id: ids.take(pa.array(bad, pa.int64())),
                        "sub_id": pa.nulls(len(bad), pa.int64()),
                        ATTRIBUTE_COLUMN: pa.array([problems[r].attribute for r in bad], pa.string()),
                        ERROR_COLUMN: pa.array([problems[r].reason for r in bad], pa.string())})
                    out = pa.Table.from_batches([out, extra]).combine_chunks().to_batches()[0]
                return out
            return pa.RecordBatch.from_pydict(columns)
        # grouped: one row per event, the ids of its matches ascending
        counts = np.bincount(event_pos, minlength=n) if len(event_pos) else np.zeros(n, np.int64)
        offsets = np.concatenate(([0], np.cumsum(counts))).astype(np.int32)
        refused = np.zeros(n, bool)
        refused[list(problems)] = True
        # refused events: no list (null) -- reported once, or dropped (other shards)
        lists = pa.ListArray.from_arrays(pa.array(offsets), sub_ids.cast(pa.int64()),
                                         mask=pa.array(refused) if problems else None)
        columns = {self.event_id: ids, "sub_ids": lists}
        if quarantine:
            attributes, errors = [None] * n, [None] * n
            for r, error in problems.items():
                attributes[r], errors[r] = error.attribute, error.reason
            columns[ATTRIBUTE_COLUMN] = pa.array(attributes, pa.string())
            columns[ERROR_COLUMN] = pa.array(errors, pa.string())
        out = pa.RecordBatch.from_pydict(columns)
        if problems and not (quarantine and self.report_bad):
            out = out.filter(pa.array(~refused))
        return out


# ------------------------------------------------------------------ driver

def _output_schema(df, event_id: str, output: str, quarantine: bool):
    from pyspark.sql.types import ArrayType, LongType, StringType, StructField, StructType

    id_field = df.schema[event_id]
    fields = [StructField(event_id, id_field.dataType, True)]
    if output == "pairs":
        fields.append(StructField("sub_id", LongType(), True))
    else:
        fields.append(StructField("sub_ids", ArrayType(LongType(), False), True))
    if quarantine:
        fields.append(StructField(ATTRIBUTE_COLUMN, StringType(), True))
        fields.append(StructField(ERROR_COLUMN, StringType(), True))
    return StructType(fields)


def match_events(events_df: DataFrame, index_or_path: Index | str | os.PathLike | ShippedIndex | ShardedIndex, *,
                 event_id: str = "event_id", mode: str = "replicate",
                 shards: int | None = None, layout: str = "auto", attrs_column: str = "attrs",
                 arrow_batch_size: int | None = None, output: str = "pairs", on_bad_event: str = "fail",
                 ship: str = DEFAULT_SHIP, backend: str = "auto", gpu_fallback: bool = False,
                 stats: MatchStats | None = None, cache_size: int | None = None, resource_profile: Any = None,
                 inject_failure: Any = False) -> DataFrame | MatchResult:
    """Match a DataFrame of events against an index, on the executors.

    Parameters
    ----------
    events_df : a (batch or streaming) DataFrame, one row per event, with an
        event id column and either one column per attribute ("wide") or a
        ``map<string, V>`` column ``attrs_column`` ("map"); null or a
        missing key = absent.  ``layout="auto"`` picks "map" when that
        column exists and is a map.
    index_or_path : an :class:`engine.Index`, the path of a saved index, or
        what :func:`spark_integration.ship_index` returned (to ship once and
        match many times).  A path is loaded and validated on the driver
        first: a missing or corrupt file raises (FileNotFoundError,
        :class:`engine.errors.IndexFileError`) before any job runs.
    mode : "replicate" -- every executor holds the whole index, events stay
        partitioned as they are; "shard" -- the subscriptions are split into
        ``shards`` shards by id, one task holds one shard, and every event
        partition is matched against every shard (a union of one mapInArrow
        per shard over the same events; no shuffle of the events).
    arrow_batch_size : rows per Arrow batch; sets the session's
        ``spark.sql.execution.arrow.maxRecordsPerBatch`` (read when the query
        runs) and caps the batches the matcher sees.
    output : "pairs" -- ``(event_id, sub_id long)``, one row per match;
        "grouped" -- ``(event_id, sub_ids array<long>)``, one row per event,
        ids ascending, an empty array when nothing matched.
    on_bad_event : "fail" -- an event the engine refuses (value of the wrong
        type, NaN, integer beyond ±2**53) fails the job with
        :class:`BadEventError` naming its event id; "quarantine" -- such
        events are set aside: returns a :class:`MatchResult` whose
        ``quarantine`` DataFrame lists them ``(event_id, attribute, error)``.
    ship : "broadcast" or "files" (SparkFiles); see README.md.
    backend, gpu_fallback : "auto" matches on cuda in tasks that hold a GPU
        (spark_integration.devices), "cpu"/"cuda" force one; when cuda cannot
        run, fall back to cpu only with ``gpu_fallback=True``.
    stats : a :class:`spark_integration.MatchStats` that counts index loads
        per worker, batches and events.
    cache_size : indexes one Python worker keeps loaded (default 1 in shard
        mode, so a worker holds one shard; 2 otherwise).
    resource_profile : a ``pyspark.resource.ResourceProfile`` for the
        matching stage (stage-level scheduling, e.g. GPUs for matching only).
    inject_failure : testing aid: True (or a set of partition ids) makes the
        first attempt of those tasks fail after emitting their first batch.

    Returns a DataFrame (or a :class:`MatchResult` with quarantine).
    """
    from pyspark.sql import functions as F

    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, not {mode!r}")
    if output not in OUTPUTS:
        raise ValueError(f"output must be one of {OUTPUTS}, not {output!r}")
    if on_bad_event not in ON_BAD_EVENT:
        raise ValueError(f"on_bad_event must be one of {ON_BAD_EVENT}, not {on_bad_event!r}")
    if arrow_batch_size is not None and int(arrow_batch_size) < 1:
        raise ValueError(f"arrow_batch_size must be >= 1, not {arrow_batch_size!r}")
    if inject_failure and inject_failure is not True:
        inject_failure = frozenset(int(p) for p in inject_failure)
    if mode == "shard" and output == "grouped" and events_df.isStreaming:
        raise ValueError("mode='shard' with output='grouped' merges the shards' lists with an aggregation, which a "
                         "streaming query cannot append: use output='pairs', or match each micro-batch in "
                         "foreachBatch (start_stream(..., sink='foreachBatch'))")
    spark = events_df.sparkSession
    check_workers(spark)        # one clear error, not a JVM stack, when the executors' Python cannot match
    if mode == "shard" and isinstance(index_or_path, ShardedIndex) and shards is None:
        shards = len(index_or_path)
    shipped = ship_index(spark, index_or_path, mode=mode, shards=shards, method=ship)
    parts = shipped.shards if isinstance(shipped, ShardedIndex) else [shipped]
    repeated = sorted({c for c in events_df.columns if events_df.columns.count(c) > 1})
    if repeated:                # (Spark's own error is an AMBIGUOUS_REFERENCE stack trace)
        raise ValueError(f"the events have more than one column named {repeated[0]!r} (a join?): each "
                         f"attribute is one column; rename or drop the others")
    quarantine = on_bad_event == "quarantine"
    outputs = ["sub_id" if output == "pairs" else "sub_ids"] + ([ATTRIBUTE_COLUMN, ERROR_COLUMN] if quarantine else [])
    if event_id in outputs:     # (the batches' columns would collapse into one: a JVM stack trace at the first)
        raise ValueError(f"the event id column {event_id!r} has the name of an output column ({', '.join(outputs)}): "
                         f"rename it, e.g. events_df.withColumnRenamed({event_id!r}, 'event_id')")
    if event_id in parts[0].attributes:
        logger.warning("subscriptions read the attribute %r, which is the events' id column (event_id=): it is "
                       "left out of matching, so there it is absent (IS NULL is true); rename the id column to "
                       "match on it", event_id)
    chosen, columns = layouts.detect_layout(events_df, layout=layout, attrs_column=attrs_column,
                                            event_id=event_id, attributes=parts[0].attributes)
    if arrow_batch_size is not None:
        spark.conf.set(ARROW_BATCH_CONF, str(int(arrow_batch_size)))
    # the columns travel under plain names, given back on the worker: mapInArrow resolves each column by
    # its name unquoted, so a name with a dot ("a.b", an attribute the language allows) failed to resolve
    source = events_df.select(*[F.col(layouts.quote(c)).alias(f"_bexmatch_{k}") for k, c in enumerate(columns)])
    schema = _output_schema(events_df, event_id, output, quarantine)
    capacity = cache_size or (1 if mode == "shard" else 2)
    stats_acc = None if stats is None else stats.accumulator
    frames = []
    for s, part in enumerate(parts):
        func = _BatchMatcher(part, event_id=event_id, layout=chosen, attrs_column=attrs_column, output=output,
                             on_bad_event=on_bad_event, report_bad=(s == 0),
                             batch_size=None if arrow_batch_size is None else int(arrow_batch_size),
                             backend=backend, gpu_fallback=gpu_fallback, capacity=capacity, stats_acc=stats_acc,
                             inject_failure=inject_failure, names=list(columns))
        if resource_profile is None:
            frames.append(source.mapInArrow(func, schema))
        else:
            frames.append(source.mapInArrow(func, schema, profile=resource_profile))
    combined = frames[0]
    for frame in frames[1:]:
        combined = combined.unionAll(frame)
    id_column = F.col(layouts.quote(event_id))      # (a name with a dot is one column, not a field of one)

    def merged(rows):
        """Shard mode's grouped rows: each id's lists from every shard as one set, ascending."""
        return rows.groupBy(id_column).agg(F.array_sort(F.array_distinct(F.flatten(F.collect_list("sub_ids"))))
                                           .alias("sub_ids"))

    if not quarantine:
        return merged(combined) if output == "grouped" and len(frames) > 1 else combined
    # refused events (only shard 0 reports them, one row each) apart from the matched ones before any merge: an
    # event with the id of a refused one (or both without id) keeps its matches
    matches = combined.filter(F.col(ERROR_COLUMN).isNull()).drop(ATTRIBUTE_COLUMN, ERROR_COLUMN)
    if output == "pairs":
        matches = matches.filter(F.col("sub_id").isNotNull())
    elif len(frames) > 1:
        matches = merged(matches)
    refused = combined.filter(F.col(ERROR_COLUMN).isNotNull()).select(id_column, ATTRIBUTE_COLUMN, ERROR_COLUMN)
    return MatchResult(matches, refused, combined)


__all__ = ["BadEventError", "InjectedFailure", "MatchResult", "match_events"]
