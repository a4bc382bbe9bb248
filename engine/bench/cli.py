"""``bexmatch bench``: the command line of the benchmarks (``bexmatch
bench --help``; also ``python -m engine.bench``)."""

from __future__ import annotations

import argparse
import math
import os
import sys

import pyarrow as pa

from engine.algorithms import registry
from engine.bench import algorithms as bench_algorithms
from engine.bench import latency
from engine.bench.costs import ingest_rates, load_costs, update_costs, update_rates
from engine.bench.measure import DEFAULT_SCALE, SCAN_BUDGET, SCAN_SAMPLE_MAX, SCAN_SAMPLE_MIN, run_benchmark
from engine.bench.report import format_table, plot, write_csv, write_records
from engine.bench.sweep import SWEEP_BASE, plan_sweep, sweep
from engine.errors import BackendUnavailable
from engine.workloads import canonical_name, read_parquet, standard


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


def _option_arg(text: str) -> tuple[str, str, object]:
    target, sep, raw = text.partition("=")
    algorithm, dot, key = target.strip().partition(".")
    if not sep or not dot or not algorithm or not key:
        raise argparse.ArgumentTypeError(f"expected ALGORITHM.NAME=VALUE, e.g. betree.max_cap=auto, not {text!r}")
    return algorithm, key.strip(), bench_algorithms.parse_option_value(raw)


def _series_arg(text: str) -> tuple[str, list[str]]:
    param, sep, values = text.partition("=")
    if not sep or not param.strip() or not _csv_list(values):
        raise argparse.ArgumentTypeError(f"expected PARAM=V1,V2,..., e.g. similarity=0.1,0.7, not {text!r}")
    return param.strip(), _csv_list(values)


def _number_list(kind, low):
    """A comma list of numbers, each at least ``low``."""
    def parse(text):
        values = []
        for part in _csv_list(text):
            try:
                value = kind(part)
            except ValueError:
                raise argparse.ArgumentTypeError(f"not a number: {part!r}") from None
            if not (math.isfinite(value) and value >= low):
                raise argparse.ArgumentTypeError(f"must be a finite number >= {low}, not {part}")
            values.append(value)
        if not values:
            raise argparse.ArgumentTypeError("expected at least one value")
        return values
    return parse


def _positive(kind, zero: bool = False):
    """An argparse type: a finite ``kind`` above 0 (at least 0 with ``zero``)."""
    def parse(text):
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
        if not (value >= 0 if zero else value > 0) or (isinstance(value, float) and not math.isfinite(value)):
            raise argparse.ArgumentTypeError(f"must be {'>= 0' if zero else 'positive'}, not {text}")
        return value
    return parse


def _check_outputs(args, parser) -> None:
    """--csv and --plot are written after the whole run: a path that cannot
    be written is a usage error before any work, not a traceback after it."""
    for flag, path in (("--csv", args.csv), ("--plot", args.plot)):
        if path is None:
            continue
        folder = os.path.dirname(os.path.abspath(path))
        if not os.path.isdir(folder):
            parser.error(f"{flag} {path}: no directory {folder}")
        if os.path.isdir(path):
            parser.error(f"{flag} {path}: is a directory")
    if args.plot is not None and not args.plot.lower().endswith(".png"):
        parser.error(f"--plot {args.plot}: the plot is a PNG (a path ending in .png)")


def _workloads(names, parser, mode: str | None = None, **kwargs) -> list:
    """The standard workloads ``names``; an unknown name or bad scale is a
    usage error, and so is an expression workload (W5) in a ``mode`` that
    times the columnar form (--updates, --load, --ingest)."""
    found = []
    for name in _distinct_workloads(names, parser):
        try:
            workload = standard(name, **kwargs)
        except ValueError as exc:
            parser.error(str(exc))
        if mode is not None and "expression" in workload.subscriptions.column_names:
            parser.error(f"{mode} times the columnar form of a workload's subscriptions; {name}'s are "
                         f"expressions (ABE-Gen)")
        found.append(workload)
    return found


def _distinct_workloads(names, parser) -> list:
    """``names`` with a workload named twice (``W1`` and its alias ``begen-uniform``) kept once."""
    seen = {}
    for name in names:
        try:
            seen.setdefault(canonical_name(name), name)
        except ValueError as exc:
            parser.error(str(exc))
    return list(seen.values())


def _parquet_workloads(paths, parser) -> list:
    """The workload directories ``paths`` (write_parquet's), each once however it is spelt (a repeated one
    ran twice: duplicate rows); one that cannot be read is a usage error."""
    found, seen = [], set()
    for path in paths or ():
        if os.path.realpath(path) in seen:
            continue
        seen.add(os.path.realpath(path))
        try:
            workload = read_parquet(path)
        except (OSError, ValueError, KeyError, TypeError, pa.ArrowException) as exc:
            parser.error(f"--parquet {path}: not a workload directory written by write_parquet ({exc})")
        if workload.n_events == 0:
            parser.error(f"--parquet {path}: the workload has no events to match")
        found.append(workload)
    return found


def _rates_line(rates: dict) -> str:
    line = (f"{rates['workload']} {rates['algorithm']} ({rates['n_subscriptions']:,} subscriptions), one at a "
            f"time: Index.add {rates['api_add_per_s']:,.0f}/s ({rates['api_add_calls_per_s']:,.0f}/s the calls "
            f"alone), Index.remove {rates['api_remove_per_s']:,.0f}/s ({rates['api_remove_calls_per_s']:,.0f}/s "
            f"the calls alone), {rates['n']:,} each, merge and first match included")
    if "tree_insert_per_s" in rates:
        line += (f"; the tree, one unit per call: insert {rates['tree_insert_per_s']:,.0f}/s (empty to full), "
                 f"delete {rates['tree_delete_per_s']:,.0f}/s and re-insert {rates['tree_reinsert_per_s']:,.0f}/s "
                 f"(full tree), one call for all {rates['tree_build_per_s']:,.0f}/s "
                 f"({rates['tree_build_s']:.2f} s) [subscriptions/s]")
    return line


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
               "  bexmatch bench --sweep p --values 0.001,0.01,0.05 --generator begen --option betree.max_cap=auto\n"
               "  bexmatch bench --generator begen --sweep betree.max_cap --values 5,20,160 --param p=0.05\n"
               "  bexmatch bench --generator begen --sweep apcm.cluster_size --values 2,4,8,16,32,64 \\\n"
               "      --series similarity=0.1,0.4,0.7,1.0                       (A-PCM Fig. 9(b))\n"
               "  bexmatch bench --generator begen --sweep similarity --values 0.1,0.4,0.7,1.0 \\\n"
               "      --algorithm apcm-cupp --algorithm apcm-cuppre --algorithm apcm   (A-PCM Fig. 8(b), 8(c))\n"
               "  bexmatch bench --arrival-delays 100,10,1,0.1,0.01,0 --batch-sizes 1,128,256,512,1024 \\\n"
               "      --algorithm apcm-bitmap --algorithm apcm                  (A-PCM Fig. 12)\n"
               "  bexmatch bench --updates 10000 --algorithm betree --scale 1.0\n"
               "Bench variants (offered while their algorithm is registered; --option ALG.NAME=VALUE also "
               "reaches ALG's variants,\nbut for the options a variant fixes; --option VARIANT.NAME=VALUE "
               "overrides even those):\n"
               + "".join(f"  {name:<14} {title}\n" for name, title in bench_algorithms.VARIANT_TITLES.items())
               + "Exit status: 0 when every run that ran gave scan's answers, 1 when one was wrong or failed.",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    what = parser.add_argument_group("what to run")
    what.add_argument("--workload", action="append", metavar="W",
                      help="standard workload W1..W7 (W7S: W7 with scalar IN for its lists) or an alias such as "
                           "begen-uniform (repeatable; default W1 unless --parquet or --sweep is given)")
    what.add_argument("--parquet", action="append", metavar="DIR",
                      help="a workload directory written by engine.workloads.write_parquet (repeatable)")
    what.add_argument("--scale", type=_positive(float), default=DEFAULT_SCALE,
                      help="subscriptions as a share of the full-scale workload (default %(default)s)")
    what.add_argument("--events", type=_positive(int), metavar="N",
                      help="events per workload (generated workloads: generate N; Parquet: the first N)")
    what.add_argument("--seed", type=_positive(int, zero=True), default=0, help="generator seed (default %(default)s)")
    what.add_argument("--algorithm", action="append", choices=(*bench_algorithms.names(), "all"),
                      help="a registered algorithm or a bench variant of one (repeatable; 'all' for every "
                           "registered algorithm, those not implemented on a backend reported as skipped there; "
                           "default every algorithm implemented on a --backend)")
    what.add_argument("--backend", action="append", choices=("cpu", "cuda"),
                      help="backend (repeatable; default cpu)")
    what.add_argument("--option", action="append", default=[], type=_option_arg, metavar="ALG.NAME=VALUE",
                      help="an option of one algorithm's index (repeatable), e.g. betree.max_cap=160, given to "
                           "its bench variants too unless they fix it; betree.max_cap=auto (and apcm.max_cap=auto) "
                           "takes BE-Tree Table 4's value for each workload's match_prob")
    how = parser.add_argument_group("how to measure")
    how.add_argument("--repeats", type=_positive(int), default=3,
                     help="timed match_batch runs after one warm-up; the median counts (default %(default)s)")
    how.add_argument("--latency-samples", type=_positive(int, zero=True), default=200, metavar="N",
                     help="events matched one at a time for the latency percentiles (default %(default)s)")
    how.add_argument("--scan-sample", type=_scan_sample_arg, default="auto", metavar="auto|all|N",
                     help="events scan is timed and answers are checked on: 'auto' (all of them when "
                          f"subscriptions x events <= {SCAN_BUDGET:,}, else the first "
                          f"{SCAN_SAMPLE_MIN}..{SCAN_SAMPLE_MAX}), 'all', or the first N (default %(default)s)")
    how.add_argument("--texts", action="store_true",
                     help="build ABE-Gen workloads (W5, --generator abe) from their texts, through the parser; "
                          "default: from their ASTs (text-free, as every other workload's columnar form)")
    how.add_argument("--columns", action="store_true",
                     help="build ABE-Gen workloads from the columnar form with connective rows (their ASTs "
                          "written out in it before the timings)")
    swp = parser.add_argument_group("sweeps (OpIndex Fig. 10; with --generator begen: BE-Tree Fig. 5-11, "
                                    "PS-Tree Fig. 6-13, A-PCM Fig. 8-9; with --generator abe: A-Tree Fig. 8-13)")
    swp.add_argument("--sweep", metavar="PARAM",
                     help="vary one generator parameter: N, dims, Γmax/gamma_max, m, θ/theta, σ/cardinality, "
                          "zipf, p/match_prob, s/similarity, α/alpha, depth, fanout (a range: 2..6), ... (any "
                          "keyword of engine.workloads.opindex_gen, begen or abe_gen; a workload per value) -- or one algorithm option ALG.NAME, e.g. "
                          "apcm.cluster_size or betree.max_cap (one workload, the option set per value on ALG and "
                          "its variants; default --algorithm: ALG alone)")
    swp.add_argument("--values", type=_csv_list, metavar="V1,V2,...", help="the values of the swept parameter "
                     "('none' for None)")
    swp.add_argument("--series", type=_series_arg, metavar="PARAM=V1,V2,...",
                     help="a second axis, of either kind: every --values point is measured at each of these "
                          "values, one line each in the table and plot (column series_param/series_value), e.g. "
                          "--sweep apcm.threshold --values 1,2,3,4 --series similarity=0.1,0.4,0.7,1.0 for "
                          "A-PCM Fig. 9(c); one stream similarity alone: --param similarity=0.7")
    swp.add_argument("--generator", choices=tuple(SWEEP_BASE), default="opindex",
                     help="generator of the sweep (default %(default)s; base parameters: W3 for opindex, "
                          "W1 for begen, W5 for abe (A-Tree Fig. 8-13), subscriptions times --scale)")
    swp.add_argument("--param", action="append", default=[], metavar="KEY=VALUE",
                     help="override a base parameter of the sweep's generator (repeatable)")
    lat = parser.add_argument_group(
        "latency against batch size (A-PCM Fig. 12)",
        "Measures the real time of one match_batch of each --batch-sizes events per algorithm\n"
        f"(median over several batches: at least --repeats, and {latency.MIN_TIMED_EVENTS:,} events per size "
        f"unless\nthey take over {latency.TIME_BUDGET_S:g} s), then simulates (discrete events) a stream of "
        "events arriving every d ms:\nan event waits for its batch to fill, for the batches queued before it, "
        "then for its batch's\nmatching.  Batch size 1 matches each event alone (the sequential baseline).  "
        "Default workload W6\n(70 % stream similarity); default --events: enough that no timed batch repeats "
        "an event.")
    lat.add_argument("--arrival-delays", type=_number_list(float, 0), metavar="MS,...",
                     help="measure latency instead: the delays between events, ms (e.g. 100,10,1,0.1,0.01,0)")
    lat.add_argument("--batch-sizes", type=_number_list(int, 1), metavar="N,...",
                     help="events per match_batch (default "
                          f"{','.join(map(str, latency.DEFAULT_BATCH_SIZES))})")
    lat.add_argument("--simulated-events", type=_positive(int), metavar="N",
                     help=f"length of the simulated stream (default {latency.DEFAULT_SIMULATED_EVENTS:,}); an "
                          "overloaded stream's average grows with it")
    what.add_argument("--updates", type=_positive(int), metavar="N",
                      help="adds and removals, one at a time, on each --algorithm (default opindex): N through "
                           "Index.add/remove, merge included; betree also its tree, one unit per insert/delete "
                           "call; opindex also N removals + N adds merged, derived vs fully rebuilt")
    what.add_argument("--ingest", action="store_true",
                      help="measure the ways in instead: text parse rate, add_many of texts and columnar "
                           "ingestion rate")
    what.add_argument("--load", action="store_true",
                      help="measure build vs Index.load + first match of the saved index (each --algorithm, "
                           "default opindex, on the first --backend)")
    out = parser.add_argument_group("output")
    out.add_argument("--csv", metavar="PATH", help="write every row, every column, as CSV (--updates, --ingest, "
                                                   "--load: one row per measurement; --arrival-delays: one per "
                                                   "algorithm, batch size and delay)")
    out.add_argument("--plot", metavar="PATH", help="write events/s and index bytes as a PNG (--arrival-delays: "
                                                    "latency against delay)")
    out.add_argument("--strict", action="store_true", help="stop at the first algorithm that raises")
    out.add_argument("--quiet", action="store_true", help="no progress bars")
    return parser


def _latency(args, parser, algorithms, backends, algorithm_options) -> int:
    """``--arrival-delays``: batch times and simulated latencies (engine.bench.latency)."""
    if args.sweep is not None or args.updates or args.ingest or args.load:
        parser.error("--arrival-delays is a mode of its own: leave out --sweep, --updates, --ingest and --load")
    sizes = args.batch_sizes or list(latency.DEFAULT_BATCH_SIZES)
    n_events = args.events or latency.events_needed(sizes, args.repeats)
    workloads = _parquet_workloads(args.parquet, parser)
    if args.workload or not args.parquet:
        workloads += _workloads(args.workload or ["W6"], parser, scale=args.scale, n_events=n_events, seed=args.seed)
    rows = []
    for workload in workloads:
        found = latency.latency_sweep(workload, algorithms, backends, sizes, args.arrival_delays,
                                      simulated_events=args.simulated_events or latency.DEFAULT_SIMULATED_EVENTS,
                                      events_limit=args.events, repeats=args.repeats, scan_sample=args.scan_sample,
                                      algorithm_options=algorithm_options, progress=not args.quiet,
                                      strict=args.strict)
        print(latency.format_latency(found), end="\n\n" if workload is not workloads[-1] else "\n")
        rows += found
    if args.csv:
        write_records(rows, args.csv)
    if args.plot:
        latency.plot_latency(rows, args.plot)
    return _report_failures([r for r in rows if r["status"] == "error" or r["correct"] is False],
                            lambda r: f"{r['workload']} {r['algorithm']}/{r['backend']} batch {r['batch_size']}")


def _report_failures(failed, where) -> int:
    """Name each failed row on standard error; the exit status."""
    for row in failed:
        print(f"bexmatch bench: {where(row)}: {row['note']}", file=sys.stderr)
    return 1 if failed else 0


def main(argv=None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    backends = list(dict.fromkeys(args.backend or ["cpu"]))      # (a repeated one ran twice: duplicate rows)
    if args.workload:
        args.workload = list(dict.fromkeys(args.workload))
    algorithms = None
    if args.algorithm:
        algorithms = list(registry.names()) if "all" in args.algorithm else list(dict.fromkeys(args.algorithm))
    algorithm_options: dict[str, dict] = {}
    for algorithm, key, value in args.option:
        algorithm_options.setdefault(algorithm, {})[key] = value
    for algorithm, chosen in algorithm_options.items():
        if algorithm not in bench_algorithms.names():
            parser.error(f"--option {algorithm}.*: no algorithm {algorithm!r}; "
                         f"algorithms: {', '.join(bench_algorithms.names())}")
        # an option of an algorithm that does not run (itself or through a variant of it) would change nothing
        if algorithms is not None and not any(algorithm in (name, bench_algorithms.base_of(name))
                                              for name in algorithms):
            parser.error(f"--option {algorithm}.*: {algorithm} does not run (--algorithm {', '.join(algorithms)})")
    # each algorithm's options as its index will get them: a variant's
    # fixed ones, its algorithm's and its own together; on the other
    # backends of the run, the options given here (a variant whose own
    # options fit one backend only gives a skipped or failed row elsewhere,
    # as an algorithm a backend lacks does)
    for algorithm in dict.fromkeys([*algorithm_options, *(algorithms or ())]):
        chosen = bench_algorithms.options_of(algorithm, algorithm_options)
        for backend in backends:
            try:
                if backend == backends[0]:
                    bench_algorithms.check_options(algorithm, chosen, backend)
                elif chosen:
                    bench_algorithms.check_options(bench_algorithms.base_of(algorithm), chosen, backend)
            except (TypeError, ValueError) as exc:
                parser.error(f"--option: {exc}" + (f" (--backend {backend})" if len(backends) > 1 else ""))
    modes = [flag for flag, given in (("--sweep", args.sweep is not None), ("--updates", args.updates),
                                      ("--load", args.load), ("--ingest", args.ingest)) if given]
    if len(modes) > 1:
        parser.error(f"{' and '.join(modes)}: each is a mode of its own; give one")
    _check_outputs(args, parser)
    if args.series is not None and args.sweep is None:
        parser.error("--series is the second axis of a --sweep")
    if args.arrival_delays is None and (args.batch_sizes or args.simulated_events):
        parser.error("--batch-sizes and --simulated-events go with --arrival-delays")
    if args.arrival_delays is not None:
        return _latency(args, parser, algorithms, backends, algorithm_options)
    options = dict(repeats=args.repeats, latency_samples=args.latency_samples,
                   scan_sample=args.scan_sample, progress=not args.quiet, strict=args.strict,
                   algorithm_options=algorithm_options, texts=args.texts, columns=args.columns)
    if args.texts and args.columns:
        parser.error("--texts and --columns are two ways in: give one")

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
        try:   # bad names and values, and option sweeps that would vary nothing, are usage errors
            plan_sweep(args.sweep, args.values, args.generator, params, algorithms, series=args.series,
                       scale=args.scale, n_events=args.events, algorithm_options=algorithm_options,
                       backend=backends[0])
        except ValueError as exc:
            parser.error(str(exc))
        rows = sweep(args.sweep, args.values, args.generator, params, algorithms, backends, series=args.series,
                     scale=args.scale, events_limit=args.events, seed=args.seed, **options)
    else:
        if args.values or args.param:
            parser.error("--values and --param go with --sweep")
        if args.updates:
            records = []
            for workload in _workloads(args.workload or ["W1"], parser, "--updates", scale=args.scale,
                                       n_events=10, seed=args.seed):
                if args.updates > workload.n_subscriptions:
                    parser.error(f"--updates {args.updates}: {workload.name} has {workload.n_subscriptions:,} "
                                 f"subscriptions at --scale {args.scale:g}")
                for algorithm in algorithms or ["opindex"]:
                    chosen = bench_algorithms.options_of(algorithm, algorithm_options)
                    if algorithm in ("opindex", "pstbloom", "psthash") and not chosen:
                        cost = update_costs(workload, args.updates, repeats=args.repeats, algorithm=algorithm)
                        print(f"{cost['workload']} ({cost['n_subscriptions']:,} subscriptions): {cost['n']:,} "
                              f"removals + {cost['n']:,} adds, merged and matched: {cost['incremental_s']:.3f} s "
                              f"with {algorithm}'s derived matcher, {cost['full_s']:.3f} s with a full rebuild "
                              f"({cost['full_s'] / cost['incremental_s']:.1f}x)")
                        records.append(cost)
                    chosen = bench_algorithms.resolve_options(algorithm, chosen, workload)
                    rates = update_rates(workload, algorithm, args.updates, repeats=args.repeats, options=chosen,
                                         seed=args.seed)
                    print(_rates_line(rates))
                    records.append(rates)
            if args.csv:
                write_records(records, args.csv)
            return 0
        if args.load:
            records = []
            for workload in _workloads(args.workload or ["W1"], parser, "--load", scale=args.scale,
                                       n_events=100, seed=args.seed):
                for algorithm in algorithms or ["opindex"]:
                    chosen = bench_algorithms.resolve_options(
                        algorithm, bench_algorithms.options_of(algorithm, algorithm_options), workload)
                    try:
                        cost = load_costs(workload, algorithm, backends[0], repeats=args.repeats, options=chosen)
                    except BackendUnavailable as exc:
                        parser.error(f"--load: {exc}")
                    gain = cost['build_s'] / cost['load_first_match_s']
                    print(f"{cost['workload']} {algorithm}/{cost['backend']} ({cost['n_subscriptions']:,} "
                          f"subscriptions): build + first match {cost['build_s']:.2f} s; save {cost['save_s']:.2f} s "
                          f"({cost['file_bytes'] / 2 ** 20:.1f} MiB); load {cost['load_s']:.2f} s, + first match "
                          f"{cost['load_first_match_s']:.2f} s ("
                          + (f"{gain:.1f}x faster" if gain >= 1 else f"{1 / gain:.1f}x slower")
                          + f" than the build); structure restored: {cost['structure_restored']}; "
                          f"same answers: {cost['same_answers']}")
                    records.append(cost)
            if args.csv:
                write_records(records, args.csv)
            return 0
        if args.ingest:
            records = []
            for workload in _workloads(args.workload or ["W1"], parser, "--ingest", scale=args.scale,
                                       n_events=100, seed=args.seed):
                rates = ingest_rates(workload, repeats=args.repeats)
                print(f"{rates['workload']}: parse {rates['parse_per_s']:,.0f} expressions/s "
                      f"({rates['n_texts']:,} texts, {rates['mean_predicates_per_text']:.1f} predicates each); "
                      f"add_many of those texts {rates['add_texts_per_s']:,.0f}/s "
                      f"({rates['add_texts_share_of_parse']:.0%} of the parse rate); "
                      f"columnar ingestion {rates['ingest_per_s']:,.0f} subscriptions/s "
                      f"({rates['n_subscriptions']:,} in {rates['ingest_s']:.2f} s)")
                records.append(rates)
            if args.csv:
                write_records(records, args.csv)
            return 0
        workloads = _parquet_workloads(args.parquet, parser)
        if args.workload or not args.parquet:
            workloads += _workloads(args.workload or ["W1"], parser, scale=args.scale, n_events=args.events,
                                    seed=args.seed)
        rows = run_benchmark(workloads, algorithms, backends, events_limit=args.events, **options)

    print(format_table(rows))
    if args.csv:
        write_csv(rows, args.csv)
    if args.plot:
        plot(rows, args.plot)
    return _report_failures([r for r in rows if r["status"] == "error" or r["correct"] is False],
                            lambda r: f"{r['workload']} {r['algorithm']}/{r['backend']}")
