"""Broadcast vs SparkFiles for shipping the index: the measurement behind
``spark_integration.shipping.DEFAULT_SHIP`` (README.md, "Shipping the index").

    python -m spark_integration.bench.ship --scale 0.1 --reps 3 --master 'local[2]'

For each method and repetition (a fresh index content each time, so nothing
is reused): seconds on the driver (serialise + broadcast/addFile), seconds
of the first job that makes every worker fetch and load it, seconds of the
same job once the workers have it cached (the job's own overhead), and the
workers' mean load time (fetch + Index.load) from :class:`MatchStats`.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time


class _Touch:
    """Make a worker load the shipped index (nothing else)."""

    def __init__(self, shipped, stats_acc):
        self.shipped, self.stats_acc = shipped, stats_acc

    def __call__(self, batches):
        import pyarrow as pa

        from spark_integration.shipping import worker_index

        index, _ = worker_index(self.shipped, backend="cpu", capacity=1, stats=self.stats_acc)
        for batch in batches:
            yield pa.RecordBatch.from_pydict({"n": pa.array([len(index)] * batch.num_rows, pa.int64())})


def main(argv=None) -> int:
    from spark_integration.job import int_in, positive_float

    p = argparse.ArgumentParser(prog="python -m spark_integration.bench.ship", description=__doc__.split("\n\n")[0])
    p.add_argument("--scale", type=positive_float, default=0.1, help="W1 scale of the index (default 0.1: 100k subs)")
    p.add_argument("--reps", type=int_in(1), default=3)
    p.add_argument("--master", default="local[2]")
    args = p.parse_args(argv)

    from spark_integration.job import prepare_environment
    prepare_environment(args.master)
    from pyspark.sql import SparkSession

    from engine import Index, workloads
    from spark_integration.shipping import MatchStats, index_bytes, ship_index

    t = time.perf_counter()
    index = Index()
    index.add_many(workloads.standard("W1", scale=args.scale, n_events=100).subscriptions)
    size = len(index_bytes(index))
    print(f"index: {len(index):,} subscriptions, {size / 1e6:.1f} MB saved, built in {time.perf_counter() - t:.1f}s")
    spark = (SparkSession.builder.master(args.master).appName("bexmatch-bench-ship")
             .config("spark.ui.enabled", "false").config("spark.ui.showConsoleProgress", "false").getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    tasks = 4 * spark.sparkContext.defaultParallelism
    spark.range(0, tasks, 1, tasks).count()     # JVM warm-up
    rows = {m: [] for m in ("broadcast", "files")}
    extra = 10 ** 15
    for rep in range(args.reps):
        order = ("broadcast", "files") if rep % 2 == 0 else ("files", "broadcast")
        for method in order:
            extra += 1
            index.add(extra, "a0 = -1")      # new content: nothing cached anywhere
            stats = MatchStats(spark)
            t0 = time.perf_counter()
            shipped = ship_index(spark, index, method=method)
            t1 = time.perf_counter()
            df = spark.range(0, tasks, 1, tasks).mapInArrow(_Touch(shipped, stats.accumulator), "n long")
            df.collect()
            t2 = time.perf_counter()
            df.collect()
            t3 = time.perf_counter()
            rows[method].append((t1 - t0, t2 - t1, t3 - t2, stats.load_seconds / max(1, stats.loads), stats.loads))
    print(f"{'method':<10} {'driver s':>9} {'1st job s':>10} {'cached job s':>13} {'load s/worker':>14} loads")
    for method, values in rows.items():
        med = [statistics.median(v[i] for v in values) for i in range(4)]
        loads = "/".join(str(v[4]) for v in values)
        print(f"{method:<10} {med[0]:>9.3f} {med[1]:>10.3f} {med[2]:>13.3f} {med[3]:>14.3f} {loads}")
    spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
