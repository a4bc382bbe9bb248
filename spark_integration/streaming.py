"""Structured Streaming: the same matching on a streaming DataFrame.

:func:`match_events` works on a streaming DataFrame as it is (mapInArrow is
a narrow, stateless operator).  :func:`start_stream` wires up the common
case -- a file source directory in, a Parquet directory of matches out --
so that a query restarted from its checkpoint neither loses nor duplicates
matches:

* ``sink="file"`` (default): Spark's Parquet file sink.  It is exactly-once:
  each micro-batch's files are recorded in ``<out>/_spark_metadata`` under
  the batch id, a replayed batch whose id is already there is skipped, and
  ``spark.read.parquet(out)`` reads only committed files.
* ``sink="foreachBatch"``: each micro-batch is written to
  ``<out>/batch_id=<id>`` with mode "overwrite", so a batch replayed after a
  crash replaces its own earlier (partial or complete) output: idempotent by
  batch id.  Quarantined events (``on_bad_event="quarantine"``) go to
  ``<quarantine_path>/batch_id=<id>`` the same way; this is the sink the
  quarantine needs, as it writes two outputs.

The index is shipped once, before the query starts, and reused by every
micro-batch.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

from spark_integration import layout as layouts
from spark_integration.matching import ATTRIBUTE_COLUMN, ERROR_COLUMN, MatchResult, match_events
from spark_integration.shipping import DEFAULT_SHIP, ShardedIndex, ShippedIndex, ship_index

if TYPE_CHECKING:       # (hints only: importing this module does not import pyspark)
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.streaming import StreamingQuery
    from pyspark.sql.types import StructType

    from engine import Index

SINKS = ("file", "foreachBatch")


#: the formats Spark parses record by record, in a parse mode (PERMISSIVE by default: a line it cannot read,
#: or a value that does not fit the schema's type, becomes nulls -- an event whose attributes are all absent)
PARSED_FORMATS = ("json", "csv")

#: the column that keeps the text of a record Spark could not read (spark.sql.columnNameOfCorruptRecord)
CORRUPT_RECORD = "_corrupt_record"

BAD_RECORDS = ("fail", "keep")


def read_stream(spark, path, *, source_format: str = "parquet", schema=None, max_files_per_trigger: int | None = None,
                bad_records: str = "fail"):
    """A streaming DataFrame over a directory of ``source_format`` files.
    Without ``schema`` the schema is read (once) from the files already
    there; streaming file sources need a fixed schema.

    A JSON or CSV record that Spark cannot read as the schema says (not a
    JSON object, a value of another type: ``7.5`` in a ``long`` column) is
    never an event with absent attributes, as Spark's default would make it:
    ``bad_records="fail"`` fails the query at it (Spark's FAILFAST mode);
    ``"keep"`` keeps its text in a :data:`CORRUPT_RECORD` column, null on
    the records read whole (what :func:`start_stream`'s quarantine sets
    aside)."""
    from pyspark.sql.types import StringType, StructField, StructType

    if bad_records not in BAD_RECORDS:
        raise ValueError(f"bad_records must be one of {BAD_RECORDS}, not {bad_records!r}")
    parsed = source_format.lower() in PARSED_FORMATS
    if schema is None:
        inferred = spark.read.format(source_format).load(os.fspath(path)).schema
        # (a line inference could not read adds the corrupt-record column: no attribute of an event)
        schema = StructType([field for field in inferred.fields if field.name != CORRUPT_RECORD])
    reader = spark.readStream.format(source_format)
    if parsed and bad_records == "fail":
        reader = reader.option("mode", "FAILFAST")
    elif parsed:
        if isinstance(schema, str):
            schema = StructType.fromDDL(schema)
        if CORRUPT_RECORD not in schema.fieldNames():
            schema = StructType(schema.fields + [StructField(CORRUPT_RECORD, StringType(), True)])
        reader = reader.option("mode", "PERMISSIVE").option("columnNameOfCorruptRecord", CORRUPT_RECORD)
    reader = reader.schema(schema)
    if max_files_per_trigger is not None:
        reader = reader.option("maxFilesPerTrigger", int(max_files_per_trigger))
    return reader.load(os.fspath(path))


def _unreadable(batch_df, event_id: str):
    """(the records of a micro-batch with a :data:`CORRUPT_RECORD` column
    that Spark read whole, those it could not read as quarantine rows
    ``(event_id, attribute, error)``)."""
    from pyspark.sql import functions as F

    corrupt = F.col(CORRUPT_RECORD)
    bad = batch_df.filter(corrupt.isNotNull()).select(
        F.col(layouts.quote(event_id)), F.lit(None).cast("string").alias(ATTRIBUTE_COLUMN),
        F.concat(F.lit("not a record of the source's schema (Spark could not read it): "),
                 F.substring(corrupt, 1, 200)).alias(ERROR_COLUMN))
    return batch_df.filter(corrupt.isNull()).drop(CORRUPT_RECORD), bad


def start_stream(spark: SparkSession, source: str | os.PathLike | DataFrame,
                 index_or_path: Index | str | os.PathLike | ShippedIndex | ShardedIndex,
                 out_path: str | os.PathLike, checkpoint: str | os.PathLike, *, source_format: str = "parquet",
                 schema: StructType | str | None = None, max_files_per_trigger: int | None = None,
                 trigger: dict | None = None, sink: str = "file", quarantine_path: str | os.PathLike | None = None,
                 query_name: str | None = None, ship: str = DEFAULT_SHIP, **match_kwargs: Any) -> StreamingQuery:
    """Start a streaming query matching ``source`` (a directory of
    ``source_format`` files, or a streaming DataFrame) into Parquet at
    ``out_path``, checkpointed at ``checkpoint``.

    ``trigger``: keyword arguments of ``DataStreamWriter.trigger``, default
    ``{"availableNow": True}`` (process what is there, then stop; restart to
    pick up more).  ``match_kwargs`` go to :func:`match_events` (mode,
    shards, output, on_bad_event, ...).  Returns the StreamingQuery."""
    if sink not in SINKS:
        raise ValueError(f"sink must be one of {SINKS}, not {sink!r}")
    quarantine = match_kwargs.get("on_bad_event", "fail") == "quarantine"
    if quarantine and sink != "foreachBatch":
        raise ValueError("on_bad_event='quarantine' writes two outputs per micro-batch: use sink='foreachBatch' "
                         "(and quarantine_path=...)")
    if quarantine and quarantine_path is None:
        raise ValueError("on_bad_event='quarantine' needs quarantine_path")
    stream = source if not isinstance(source, (str, os.PathLike)) else read_stream(
        spark, source, source_format=source_format, schema=schema, max_files_per_trigger=max_files_per_trigger,
        bad_records="keep" if quarantine else "fail")
    # validate and ship once, on the driver, before anything runs
    shipped = ship_index(spark, index_or_path, mode=match_kwargs.get("mode", "replicate"),
                         shards=match_kwargs.get("shards"), method=ship)
    trigger = {"availableNow": True} if trigger is None else trigger
    out_path, checkpoint = os.fspath(out_path), os.fspath(checkpoint)

    if sink == "file":
        matches = match_events(stream, shipped, ship=ship, **match_kwargs)
        writer = matches.writeStream.format("parquet").option("path", out_path)
    else:
        def write_batch(batch_df, batch_id):
            if CORRUPT_RECORD not in batch_df.columns:
                write_matches(batch_df, None, batch_id)
                return
            batch_df = batch_df.persist()       # read twice: the records read whole, and those that were not
            try:
                write_matches(*_unreadable(batch_df, match_kwargs.get("event_id", "event_id")), batch_id)
            finally:
                batch_df.unpersist()

        def write_matches(batch_df, unreadable, batch_id):
            result = match_events(batch_df, shipped, ship=ship, **match_kwargs)
            target = os.path.join(out_path, f"batch_id={batch_id}")
            if isinstance(result, MatchResult):
                combined = result.combined.persist()
                try:
                    result.matches.write.mode("overwrite").parquet(target)
                    refused = result.quarantine if unreadable is None else result.quarantine.unionByName(unreadable)
                    refused.write.mode("overwrite").parquet(
                        os.path.join(os.fspath(quarantine_path), f"batch_id={batch_id}"))
                finally:
                    combined.unpersist()
            else:
                result.write.mode("overwrite").parquet(target)

        writer = stream.writeStream.foreachBatch(write_batch)
    writer = writer.option("checkpointLocation", checkpoint).trigger(**trigger)
    if query_name:
        writer = writer.queryName(query_name)
    return writer.start()
