"""The GPU benchmark (``make bench-gpu``, ``python -m engine.bench.gpu``).

Runs the standard workloads (default W1-W4 at full scale) for every
algorithm registered on ``cuda`` (``--algorithm`` to choose) on ``cpu`` and
on ``cuda`` in one run with :func:`engine.bench.measure.run_benchmark`
(answers checked against ``scan`` on cpu), then prints, per workload and
algorithm, events/s on each backend and their ratio -- the ``cpu`` rows
with ``--cpu-threads`` numba threads (2: the project's 2-core reference
machine) -- and the share of the cuda time spent in host<->device copies:
one batch matched from host arrays with results copied back, against the
same batch already on the device with results left there (both after the
host-side event encoding, which is the same on every backend) -- and, for
``opindex``, the device-resident batch once more with sort-and-segment
counting, the alternative to atomic decrements -- and, for ``--end-to-end``
algorithms (default opindex), ``Index.match_batch`` over the whole batch by
route: device columns in and device arrays out, a host table in and device
arrays out, a host table in and Arrow out, beside the kernels alone, with
the host encoder's share and the Arrow output against the measured
device-to-host bandwidth -- and the Arrow route once more with the batch in
one chunk (``pipeline_chunks = 1``: no copy-back overlapping the next
chunk), so the overlap's gain is measured in the same run.  Each result is printed as soon as it is
measured (a run that a time limit cuts short keeps what it finished), and
all of them together at the end.
"""

from __future__ import annotations

import argparse
import copy
import statistics
import sys
import time

import numba
import numpy as np

from engine import events as event_batches
from engine.algorithms import registry
from engine.backend import available_backends
from engine.bench import algorithms as bench_algorithms
from engine.bench.measure import run_benchmark
from engine.bench.report import format_table, write_csv
from engine.index import Index
from engine.workloads import add_subscriptions
from gpu_kernels import cuda_support


def cuda_algorithms() -> tuple[str, ...]:
    """The names ``--algorithm`` takes: the algorithms registered on cuda
    and the bench variants of them."""
    on_cuda = registry.names("cuda")
    return tuple(name for name in bench_algorithms.names()
                 if name in on_cuda or bench_algorithms.VARIANTS.get(name, ("",))[0] in on_cuda)


def _timed(repeats: int, run) -> float:
    """Median seconds of ``run()`` over ``repeats`` runs after a warm-up one,
    the device synchronised after each."""
    run()
    cuda_support.synchronize()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        run()
        cuda_support.synchronize()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def copy_share(workload, algorithm: str = "opindex", repeats: int = 3, counting: bool = True,
               block_sizes=()) -> dict:
    """Median seconds of one batch on cuda from host arrays (events copied
    in, results copied out) and from device arrays (neither), and the share
    of the first spent in the copies.  With ``counting`` (opindex), the
    device-resident batch again with sort-and-segment counting instead of
    atomic decrements (results checked equal), and at each of
    ``block_sizes`` threads per block instead of the per-chunk choice."""
    index = _built(workload, algorithm)
    segment, alive, matcher = index._matchers()[0]
    batch = event_batches.encode_events(workload.events, index.schema)
    truth = event_batches.pattern_truth(batch, index.schema, segment.predicates.pattern_pairs())
    device_batch = event_batches.EventBatch(*(cuda_support.to_device(getattr(batch, f))
                                              for f in ("offsets", "attr", "value", "token")), batch.strings)
    device_truth, device_alive = cuda_support.to_device(truth), cuda_support.to_device(alive)

    with_copies = _timed(repeats, lambda: matcher.match(batch, truth, alive))
    on_device = _timed(repeats, lambda: matcher.match(device_batch, device_truth, device_alive, output="device"))
    reference = [cuda_support.to_host(a) for a in matcher.match(device_batch, device_truth, device_alive,
                                                                output="device")]

    def agrees(variant) -> bool:
        got = variant.match(device_batch, device_truth, device_alive, output="device")
        return all(np.array_equal(a, cuda_support.to_host(b)) for a, b in zip(reference, got))

    row = {"workload": workload.name, "algorithm": algorithm, "events": batch.n_events,
           "pairs": int(reference[0].shape[0]),
           "host_io_s": with_copies, "device_io_s": on_device,
           "copy_share": max(0.0, 1.0 - on_device / with_copies) if with_copies else None,
           "device_events_per_s": batch.n_events / on_device if on_device else None}
    matcher.phases = cuda_support.PhaseTimer()      # one more host-array run, each phase synchronised
    matcher.match(batch, truth, alive)
    row["phases"] = matcher.phases.times
    del matcher.phases                               # back to the class's disabled timer
    if counting and getattr(matcher, "counting", None) == "atomic":
        sorter = copy.copy(matcher)       # the same device index, counted by sort-and-segment
        sorter.counting = "sort"
        sort_agrees = agrees(sorter)
        sorted_s = _timed(repeats, lambda: sorter.match(device_batch, device_truth, device_alive, output="device"))
        row.update(sort_counting_s=sorted_s, atomic_over_sort=sorted_s / on_device if on_device else None,
                   sort_agrees=sort_agrees)
    if block_sizes and hasattr(matcher, "thread_range"):
        row["block_sizes"] = {}
        for threads in block_sizes:
            fixed = copy.copy(matcher)       # the same device index, one block size for every chunk
            fixed.thread_range = (threads, threads)
            if not agrees(fixed):
                raise AssertionError(f"{workload.name}: {threads} threads a block changed the results")
            row["block_sizes"][threads] = _timed(
                repeats, lambda: fixed.match(device_batch, device_truth, device_alive, output="device"))
    return row


def _built(workload, algorithm: str) -> Index:
    """A cuda index of the workload's subscriptions, its matcher built."""
    index = Index(algorithm=algorithm, backend="cuda")
    add_subscriptions(index, workload.subscriptions, workload.asts)
    index.merge()
    index.match_batch(workload.events.slice(0, 1), output="arrow")      # builds the matcher
    return index


def device_columns(table):
    """A wide event table as device columns for ``Index.match_batch``
    (:func:`engine.device_events.arrow_columns`): what a GPU pipeline
    (CuPy, cuDF) holds already."""
    from engine.device_events import arrow_columns
    return arrow_columns(table)


def end_to_end(workload, algorithm: str = "opindex", repeats: int = 3, device_resident_s: float | None = None
               ) -> dict:
    """Events/s of ``Index.match_batch`` over the workload's whole batch on
    cuda, by where the events come from and the matches go: device columns
    in and device arrays out, a host table in and device arrays out, a host
    table in and an Arrow table out -- beside ``device_resident_s`` (the
    kernels alone, :func:`copy_share`) -- with the host encoder's share of
    the host-in time, the bytes per match an Arrow output writes on the host
    and the measured device-to-host copy bandwidth (so the Arrow-out figure
    reads as a share of the bus) -- and the Arrow route with the batch in one
    chunk, so with no copy-back overlapping a next chunk (``arrow_out_serial``;
    ``overlap_gain``: its time over the default's, which is the overlap's
    gain net of the cost of cutting the batch), and the list form
    (``output="arrow_lists"``, 8 bytes a match: ``host_in_lists_out``).
    The routes' matches are compared.  A map column of sparse attributes
    (W3's, ABE-Gen's events) goes in as a
    :class:`engine.device_maps.DeviceMap`; a table with no device-column
    form (a list, a map of lists) has no device-in route (None)."""
    index = _built(workload, algorithm)
    table = workload.events
    n_events = table.num_rows
    try:
        columns, valid = device_columns(table)
    except TypeError:       # a column of no device form (a list, a map of lists): no device-in route
        columns = valid = None
    device_in = _timed(repeats, lambda: index.match_batch(columns, valid=valid, output="device")) \
        if columns is not None else None
    host_device = _timed(repeats, lambda: index.match_batch(table, output="device"))
    host_arrow = _timed(repeats, lambda: index.match_batch(table, output="arrow"))
    matcher = index._matchers()[0][2]
    matcher.pipeline_chunks = 1         # one chunk: no copy-back overlapping a next one
    try:
        serial = _timed(repeats, lambda: index.match_batch(table, output="arrow"))
        serial_pairs = index.match_batch(table, output="arrow")
    finally:
        del matcher.pipeline_chunks     # back to the class's
    # the list form (issue 17): offsets and ids, 8 bytes a match on the host instead of the table's 16
    lists_s = _timed(repeats, lambda: index.match_batch(table, output="arrow_lists"))
    lists = index.match_batch(table, output="arrow_lists")["sub_ids"].combine_chunks()
    encode = _timed(repeats, lambda: event_batches.encode_events(table, index._state.view))
    pairs = index.match_batch(table, output="arrow")
    # compared as arrays: W1 at 1 M gives 100 M pairs, which as Python lists would take minutes and gigabytes
    routes = [tuple(cuda_support.to_host(a) for a in index.match_batch(columns, valid=valid, output="device"))
              if columns is not None else None,
              tuple(cuda_support.to_host(a) for a in index.match_batch(table, output="device")),
              (pairs["event"].to_numpy(), pairs["sub_id"].to_numpy()),
              (serial_pairs["event"].to_numpy(), serial_pairs["sub_id"].to_numpy()),
              (np.repeat(np.arange(n_events), np.diff(lists.offsets.to_numpy())), lists.values.to_numpy())]
    xp = cuda_support.array_module()
    probe = xp.zeros(8 << 20, dtype=np.int64)                        # 64 MiB device -> host
    copy_s = _timed(repeats, lambda: cuda_support.to_host(probe))
    row = {"workload": workload.name, "algorithm": algorithm, "events": n_events, "pairs": pairs.num_rows,
           "device_resident": n_events / device_resident_s if device_resident_s else None,
           "device_in_device_out": n_events / device_in if device_in else None,
           "host_in_device_out": n_events / host_device,
           "host_in_arrow_out": n_events / host_arrow, "arrow_out_serial": n_events / serial,
           "overlap_gain": serial / host_arrow, "host_in_lists_out": n_events / lists_s,
           "encode_share": encode / host_arrow,
           "bytes_per_match": 16, "copy_gb_per_s": probe.nbytes / copy_s / 1e9,
           "routes_agree": all(len(route) == 2 and all(np.array_equal(a, b) for a, b in zip(route, routes[1]))
                               for route in routes if route is not None)}
    # the Arrow output's bytes against what the bus carries in that time
    row["arrow_out_bus_share"] = (16 * pairs.num_rows / host_arrow) / (probe.nbytes / copy_s) if pairs.num_rows \
        else 0.0
    return row


def ratios(rows) -> list[dict]:
    """Per (workload, algorithm): cpu and cuda events/s and cuda / cpu."""
    out = []
    by_key = {(r["workload"], r["algorithm"], r["backend"]): r for r in rows if r.get("status") == "ok"}
    for workload, algorithm in dict.fromkeys((r["workload"], r["algorithm"]) for r in rows):
        cpu, gpu = by_key.get((workload, algorithm, "cpu")), by_key.get((workload, algorithm, "cuda"))
        out.append({"workload": workload, "algorithm": algorithm,
                    "cpu_events_per_s": cpu and cpu["events_per_s"], "cuda_events_per_s": gpu and gpu["events_per_s"],
                    "cuda_over_cpu": gpu["events_per_s"] / cpu["events_per_s"]
                    if cpu and gpu and cpu["events_per_s"] else None})
    return out


def _fmt(v) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:,.0f}" if abs(v) >= 100 else f"{v:.3g}"
    return str(v)


def _table(dicts, keys) -> str:
    cells = [list(keys)] + [[_fmt(d.get(k)) for k in keys] for d in dicts]
    widths = [max(len(row[i]) for row in cells) for i in range(len(keys))]
    return "\n".join("  ".join(c.rjust(w) for c, w in zip(row, widths)) for row in cells)


def _print_ratios(rows, device: str, cpu_threads: int) -> None:
    print(f"\n== cuda / cpu ({device}; cpu = {cpu_threads} numba threads)")
    print(_table(ratios(rows), ("workload", "algorithm", "cpu_events_per_s", "cuda_events_per_s", "cuda_over_cpu")),
          flush=True)


def _print_shares(shares) -> None:
    print("\n== host<->device copies (on cuda, one batch, after event encoding)")
    print(_table(shares, ("workload", "algorithm", "events", "pairs", "host_io_s", "device_io_s", "copy_share",
                          "device_events_per_s")))
    print("\n== where the host-array batch's time goes (on cuda; phases synchronised, seconds)")
    for r in shares:
        print(f"{r['workload']} {r['algorithm']}: " + ", ".join(f"{name} {t:.4g}" for name, t in r["phases"].items()))
    if any(r.get("block_sizes") for r in shares):
        print("\n== opindex on cuda, device-resident, by threads per block (seconds; 'chosen' = per chunk)")
        for r in (r for r in shares if r.get("block_sizes")):
            print(f"{r['workload']}: chosen {r['device_io_s']:.4g}, " +
                  ", ".join(f"{t} {sec:.4g}" for t, sec in r.get("block_sizes", {}).items()))
    if any("sort_counting_s" in r for r in shares):
        print("\n== opindex counting on cuda, device-resident: atomic decrements vs sort-and-segment")
        print(_table([r for r in shares if "sort_counting_s" in r],
                     ("workload", "events", "device_io_s", "sort_counting_s", "atomic_over_sort", "sort_agrees")))
    sys.stdout.flush()


def _print_routes(routes) -> None:
    print("\n== end to end, Index.match_batch of the whole batch on cuda (events/s; Arrow out: 16 bytes a match "
          "on the host, its share of the measured device->host bandwidth; lists out: arrow_lists, 8 bytes a match)")
    print(_table(routes, ("workload", "algorithm", "events", "pairs", "device_resident", "device_in_device_out",
                          "host_in_device_out", "host_in_arrow_out", "arrow_out_serial", "overlap_gain",
                          "host_in_lists_out", "encode_share", "copy_gb_per_s",
                          "arrow_out_bus_share", "routes_agree")), flush=True)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m engine.bench.gpu", description=__doc__.split("\n\n")[0])
    parser.add_argument("--workload", action="append", help="standard workload (repeatable; default W1-W4)")
    parser.add_argument("--scale", type=float, default=1.0, help="workload scale (default 1.0: full)")
    parser.add_argument("--events", type=int, default=None, help="events per workload (default: the workload's)")
    parser.add_argument("--algorithm", action="append", choices=cuda_algorithms(),
                        help="repeatable; default every algorithm registered on cuda")
    parser.add_argument("--cpu-events", type=int, default=None,
                        help="time the cpu rows on the first N events only (default: all)")
    parser.add_argument("--cpu-threads", type=int, default=2, help="numba threads for the cpu rows (default 2)")
    parser.add_argument("--no-copy-share", action="store_true", help="skip the host<->device copy measurement")
    parser.add_argument("--block-sizes", default="",
                        help="comma-separated threads per block to time opindex's device-resident batch at "
                             "(e.g. 128,256,512; default: none)")
    parser.add_argument("--no-counting", action="store_true",
                        help="skip timing opindex's sort-and-segment counting against its atomic counting")
    parser.add_argument("--end-to-end", default="opindex", metavar="ALGORITHMS",
                        help="comma-separated algorithms whose Index.match_batch is timed end to end by route "
                             "(device columns in / host table in; device arrays / Arrow out); default opindex, "
                             "'' for none")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--latency-samples", type=int, default=50)
    parser.add_argument("--csv", help="write the bench rows as CSV")
    parser.add_argument("--quiet", action="store_true")
    args = parser.parse_args(argv)
    if "cuda" not in available_backends():
        print("bench-gpu: the cuda backend is not available here (no GPU with CuPy, no simulator)", file=sys.stderr)
        return 2
    from engine.workloads import standard

    algorithms = args.algorithm or list(registry.names("cuda"))
    try:
        block_sizes = [int(t) for t in args.block_sizes.split(",") if t.strip()]
    except ValueError:
        parser.error(f"--block-sizes takes comma-separated integers, not {args.block_sizes!r}")
    rows, shares, routes = [], [], []
    all_threads = numba.get_num_threads()
    device = cuda_support.device_name()
    for name in args.workload or ["W1", "W2", "W3", "W4"]:
        workload = standard(name, scale=args.scale, n_events=args.events)
        for backend in ("cpu", "cuda"):
            numba.set_num_threads(min(args.cpu_threads, all_threads) if backend == "cpu" else all_threads)
            rows += run_benchmark([workload], algorithms, [backend], repeats=args.repeats,
                                  events_limit=args.cpu_events if backend == "cpu" else None,
                                  latency_samples=args.latency_samples, progress=not args.quiet)
        numba.set_num_threads(all_threads)
        # each result printed as soon as it exists: a run cut short by a time limit keeps what it measured
        mine = [r for r in rows if r["workload"] == workload.name]
        print(f"\n== {name} (scale {args.scale:g}) on {device}; cpu rows with {args.cpu_threads} numba threads "
              f"of {all_threads}", flush=True)
        print(format_table(mine), flush=True)
        _print_ratios(mine, device, args.cpu_threads)
        if args.csv:
            write_csv(rows, args.csv)
        if not args.no_copy_share:
            for algorithm in algorithms:
                if algorithm in registry.names("cuda") and algorithm != "scan":
                    shares.append(copy_share(workload, algorithm, args.repeats,
                                             counting=not args.no_counting and algorithm == "opindex",
                                             block_sizes=block_sizes if algorithm == "opindex" else ()))
                    _print_shares(shares[-1:])
                    if algorithm in args.end_to_end.split(","):
                        routes.append(end_to_end(workload, algorithm, args.repeats, shares[-1]["device_io_s"]))
                        _print_routes(routes[-1:])
    print("\n==== every workload", flush=True)
    _print_ratios(rows, device, args.cpu_threads)
    if shares:
        _print_shares(shares)
    if routes:
        _print_routes(routes)
    # a run that failed counts as bexmatch bench counts it: a wrong answer or an error, not a skip
    bad = [r for r in rows if r.get("status") == "error" or (r.get("status") == "ok" and r.get("correct") is False)]
    bad += [r for r in shares if r.get("sort_agrees") is False]
    bad += [r for r in routes if not r["routes_agree"]]
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
