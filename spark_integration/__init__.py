"""bexmatch on Spark (docs/architecture.md#spark): Arrow batches in, matches out.

    from spark_integration import match_events
    matches = match_events(events_df, index_or_path)        # (event_id, sub_id)

* :func:`match_events` -- batch or Structured Streaming, through
  ``mapInArrow``; "replicate" or "shard" mode; wide or map event layout;
  pairs or grouped output; bad events fail with their id or are quarantined.
* :func:`session` -- a SparkSession whose executors run this Python with
  bexmatch importable; :func:`check_workers` says clearly when they cannot.
* :func:`ship_index` -- validate, serialise and ship an index once (broadcast
  of its bytes, or SparkFiles), for several ``match_events`` calls.
* :class:`MatchStats` -- an accumulator counting index loads per worker.
* :func:`start_stream` -- a streaming query from a file source to an
  exactly-once Parquet sink with a checkpoint.
* :mod:`spark_integration.devices` -- GPU selection for GPU executors.
* :mod:`spark_integration.job` -- the main job (``bexmatch run``).

Importing this package does not import pyspark; the functions do.
"""

from spark_integration.devices import GpuUnavailable
from spark_integration.matching import BadEventError, InjectedFailure, MatchResult, match_events
from spark_integration.session import WorkerEnvironmentError, check_workers, session
from spark_integration.shipping import MatchStats, ShardedIndex, ShippedIndex, ship_index, split_index
from spark_integration.streaming import start_stream

__all__ = ["BadEventError", "GpuUnavailable", "InjectedFailure", "MatchResult", "MatchStats", "ShardedIndex",
           "ShippedIndex", "WorkerEnvironmentError", "check_workers", "match_events", "session", "ship_index",
           "split_index", "start_stream"]
