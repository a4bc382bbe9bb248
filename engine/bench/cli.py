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
from engine.bench.measure import DEFAULT_SCALE, SCAN_BUDGET, SCAN_SAMPLE_MAX, SCAN_SAMPLE_MIN, check_fits, \
    run_benchmark
from engine.bench.report import format_table, plot, write_csv, write_records
from engine.bench.sweep import SWEEP_BASE, plan_sweep, sweep
from engine.errors import BackendUnavailable
from engine.workloads import DEFAULT_EVENTS, DEFAULT_EVENTS_OF, STANDARD_WORKLOADS, canonical_name, read_parquet, \
    standard

#: defaults of the flags whose default is None in the parser (see build_parser)
LATENCY_SAMPLES = 200
SCAN_SAMPLE = "auto"
DEFAULT_GENERATOR = "opindex"


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
        why = _unwritable(path)
        if why is not None:
            parser.error(f"{flag} {path}: cannot be written ({why})")
    if args.plot is not None and not args.plot.lower().endswith(".png"):
        parser.error(f"--plot {args.plot}: the plot is a PNG (a path ending in .png)")


def _unwritable(path) -> str | None:
    """Why ``path`` cannot be written, or None.  A regular file (or none
    yet) is opened for append and closed, which changes nothing in it, and
    removed again when the probe created it; a FIFO or device only asks
    for write permission, as opening one may block or disturb its reader
    (a device that fails later, /dev/full, fails in :func:`_write`)."""
    target = os.path.realpath(path)      # (a symlink's target: removing the probe must not remove the link)
    try:
        if os.path.exists(target) and not os.path.isfile(target):
            return None if os.access(target, os.W_OK) else "permission denied"
        existed = os.path.exists(target)
        with open(target, "a", encoding="utf-8"):
            pass
        if not existed:
            os.remove(target)
    except OSError as exc:
        return exc.strerror or str(exc)
    return None


def _write(flag: str, path: str, write, *args) -> int:
    """``write(*args, path)``; an output that fails after the run (a full
    disk, /dev/full) is one line on standard error and exit status 1, not
    a traceback."""
    try:
        write(*args, path)
    except OSError as exc:
        print(f"bexmatch bench: error: {flag} {path}: cannot be written ({exc.strerror or exc})", file=sys.stderr)
        return 1
    return 0


def _workloads(names, parser, mode: str | None = None, **kwargs) -> list:
    """The standard workloads ``names``; an unknown name or bad scale is a
    usage error, and so is a size beyond this machine's memory (before it
    is generated: a MemoryError from inside NumPy otherwise) and an
    expression workload (W5) in a ``mode`` that times the columnar form
    (--updates, --load, --ingest)."""
    found = []
    for name in _distinct_workloads(names, parser):
        _check_standard_size(name, parser, **kwargs)
        try:
            workload = standard(name, **kwargs)
        except ValueError as exc:
            parser.error(str(exc))
        _columnar_only(workload, name, mode, parser)
        found.append(workload)
    return found


def _check_standard_size(name, parser, scale=1.0, n_events=None, **_) -> None:
    """A usage error when standard workload ``name`` at ``scale`` with
    ``n_events`` (None: its default) cannot fit in memory
    (:func:`~engine.bench.measure.check_fits`)."""
    canonical = canonical_name(name)
    if isinstance(scale, bool) or not (isinstance(scale, (int, float)) and math.isfinite(scale) and scale > 0):
        return          # (standard() says what is wrong with it)
    n_subs = max(1, round(STANDARD_WORKLOADS[canonical][2]["n_subs"] * scale))
    try:
        check_fits(n_subs, f"subscriptions ({name} at --scale {scale:g})")
        if n_events is not None:
            check_fits(n_events, "events (--events)")
        else:
            check_fits(max(100, round(DEFAULT_EVENTS_OF.get(canonical, DEFAULT_EVENTS) * scale)),
                       f"events ({name}'s default at --scale {scale:g})")
    except ValueError as exc:
        parser.error(str(exc))


def _columnar_only(workload, name, mode, parser) -> None:
    if mode is not None and "expression" in workload.subscriptions.column_names:
        parser.error(f"{mode} times the columnar form of a workload's subscriptions; {name}'s are "
                     f"expressions (ABE-Gen)")


def _distinct_workloads(names, parser) -> list:
    """``names`` with a workload named twice (``W1`` and its alias ``begen-uniform``) kept once."""
    seen = {}
    for name in names:
        try:
            seen.setdefault(canonical_name(name), name)
        except ValueError as exc:
            parser.error(str(exc))
    return list(seen.values())


def _parquet_workloads(paths, parser, mode: str | None = None) -> list:
    """The workload directories ``paths`` (write_parquet's), each once however it is spelt (a repeated one
    ran twice: duplicate rows); one that cannot be read is a usage error, and so is one without events
    (but for --ingest, which matches none) or, in a ``mode`` timing the columnar form, of expressions."""
    found, seen = [], set()
    for path in paths or ():
        if os.path.realpath(path) in seen:
            continue
        seen.add(os.path.realpath(path))
        try:
            workload = read_parquet(path)
        except (OSError, ValueError, KeyError, TypeError, pa.ArrowException) as exc:
            parser.error(f"--parquet {path}: not a workload directory written by write_parquet ({exc})")
        if workload.n_events == 0 and mode != "--ingest":
            parser.error(f"--parquet {path}: the workload has no events to match")
        _columnar_only(workload, f"--parquet {path}", mode, parser)
        found.append(workload)
    return found


def _rates_line(rates: dict) -> str:
    line = (f"{rates['workload']} {rates['algorithm']} ({rates['n_subscriptions']:,} subscriptions), one at a "
            f"time: Index.add {rates['api_add_per_s']:,.0f}/s ({rates['api_add_calls_per_s']:,.0f}/s the calls "
            f"alone), Index.remove {rates['api_remove_per_s']:,.0f}/s ({rates['api_remove_calls_per_s']:,.0f}/s "
            f"the calls alone), {rates['n']:,} each, merge and first match included; the first match after "
            f"an add with a new string {rates['new_string_match_s'] * 1e3:.1f} ms, a plain one "
            f"{rates['plain_match_s'] * 1e3:.1f} ms (200 events)")
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
               + "Exit status: 0 when every run that ran gave scan's answers, 1 when one was wrong or failed "
                 "(or an output could not be\nwritten after the run, or memory ran out), 2 for a usage error "
                 "(a flag the mode does not use, an output\npath that cannot be written, a size beyond this "
                 "machine's memory included).",
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
    # (defaults None, filled in by main: a mode that does not use the flag can tell it was given)
    how.add_argument("--latency-samples", type=_positive(int, zero=True), metavar="N",
                     help=f"events matched one at a time for the latency percentiles (default {LATENCY_SAMPLES})")
    how.add_argument("--scan-sample", type=_scan_sample_arg, metavar="auto|all|N",
                     help="events scan is timed and answers are checked on: 'auto' (all of them when "
                          f"subscriptions x events <= {SCAN_BUDGET:,}, else the first "
                          f"{SCAN_SAMPLE_MIN}..{SCAN_SAMPLE_MAX}), 'all', or the first N (default auto)")
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
                          "keyword of engine.workloads.opindex_gen, begen or abe_gen; a workload per value) -- "
                          "or one algorithm option ALG.NAME, e.g. "
                          "apcm.cluster_size or betree.max_cap (one workload, the option set per value on ALG and "
                          "its variants; default --algorithm: ALG alone)")
    swp.add_argument("--values", type=_csv_list, metavar="V1,V2,...", help="the values of the swept parameter "
                     "('none' for None)")
    swp.add_argument("--series", type=_series_arg, metavar="PARAM=V1,V2,...",
                     help="a second axis, of either kind: every --values point is measured at each of these "
                          "values, one line each in the table and plot (column series_param/series_value), e.g. "
                          "--sweep apcm.threshold --values 1,2,3,4 --series similarity=0.1,0.4,0.7,1.0 for "
                          "A-PCM Fig. 9(c); one stream similarity alone: --param similarity=0.7")
    swp.add_argument("--generator", choices=tuple(SWEEP_BASE),
                     help=f"generator of the sweep (default {DEFAULT_GENERATOR}; base parameters: W3 for opindex, "
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
    sizes = args.batch_sizes or list(latency.DEFAULT_BATCH_SIZES)
    try:     # a batch is a list of that many events, the simulated stream an array of its length
        check_fits(max(sizes), "events in one batch (--batch-sizes)")
        check_fits(args.simulated_events or 0, "simulated events (--simulated-events)")
    except ValueError as exc:
        parser.error(str(exc))
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
    unwritten = 0
    if args.csv:
        unwritten |= _write("--csv", args.csv, write_records, rows)
    if args.plot:
        unwritten |= _write("--plot", args.plot, latency.plot_latency, rows)
    return _report_failures([r for r in rows if r["status"] == "error" or r["correct"] is False],
                            lambda r: f"{r['workload']} {r['algorithm']}/{r['backend']} batch {r['batch_size']}") \
        | unwritten


def _report_failures(failed, where) -> int:
    """Name each failed row on standard error; the exit status."""
    for row in failed:
        print(f"bexmatch bench: {where(row)}: {row['note']}", file=sys.stderr)
    return 1 if failed else 0


#: the flags each mode of its own does not use: given, they would be dropped without a word
UNUSED_BY_MODE = {
    "--updates": ("--events", "--latency-samples", "--scan-sample", "--texts", "--columns", "--plot"),
    "--load": ("--events", "--latency-samples", "--scan-sample", "--texts", "--columns", "--plot"),
    "--ingest": ("--events", "--latency-samples", "--scan-sample", "--texts", "--columns", "--plot", "--algorithm",
                 "--option"),
    "--arrival-delays": ("--latency-samples", "--texts", "--columns"),
}


def _check_flags(args, parser, mode: str | None) -> None:
    """Flags given where they change nothing are usage errors: a mode's
    unused ones (:data:`UNUSED_BY_MODE`), a sweep's flags without --sweep,
    a backend other than cpu for the modes that run on cpu only."""
    given = {"--events": args.events is not None, "--latency-samples": args.latency_samples is not None,
             "--scan-sample": args.scan_sample is not None, "--texts": args.texts, "--columns": args.columns,
             "--plot": args.plot is not None, "--algorithm": bool(args.algorithm), "--option": bool(args.option)}
    for flag in UNUSED_BY_MODE.get(mode, ()):
        if given[flag]:
            parser.error(f"{flag} does not apply to {mode}, which would ignore it: leave it out")
    if mode in ("--updates", "--ingest") and any(b != "cpu" for b in args.backend or ()):
        parser.error(f"--backend {', '.join(args.backend)}: {mode} runs on cpu only")
    if mode != "--sweep":
        for flag, value in (("--series", args.series), ("--values", args.values), ("--generator", args.generator),
                            ("--param", args.param)):
            if value:
                parser.error(f"{flag} goes with --sweep")
    if mode != "--arrival-delays" and (args.batch_sizes or args.simulated_events):
        parser.error("--batch-sizes and --simulated-events go with --arrival-delays")
    if args.texts and args.columns:
        parser.error("--texts and --columns are two ways in: give one")


def _check_algorithm_options(parser, algorithms, algorithm_options, backends) -> None:
    """Each algorithm's options as its index will get them (a variant's
    fixed ones, its algorithm's and its own together), checked on each of
    ``backends`` it runs on, whatever their order: a variant fixing an
    option of another backend gives a skipped row there, as an algorithm a
    backend lacks does, and is a usage error only when it runs on none."""
    for algorithm in dict.fromkeys([*algorithm_options, *(algorithms or ())]):
        flag = f"--algorithm {algorithm}" if algorithm in (algorithms or ()) else f"--option {algorithm}.*"
        try:
            runs_on = bench_algorithms.runs_on(algorithm, backends)
        except ValueError as exc:
            parser.error(f"{flag}: {exc}")
        chosen = bench_algorithms.options_of(algorithm, algorithm_options)
        for backend in runs_on:
            try:
                bench_algorithms.check_options(algorithm, chosen, backend)
            except (TypeError, ValueError) as exc:
                parser.error(f"--option: {exc}" + (f" (--backend {backend})" if len(backends) > 1 else ""))


def _mode_workloads(args, parser, mode: str, n_events: int) -> list:
    """The workloads of --updates, --load and --ingest: the --parquet ones,
    and the standard ones (default W1 unless --parquet is given) generated
    with ``n_events`` events."""
    workloads = _parquet_workloads(args.parquet, parser, mode)
    if args.workload or not args.parquet:
        workloads += _workloads(args.workload or ["W1"], parser, mode, scale=args.scale, n_events=n_events,
                                seed=args.seed)
    return workloads


def _attempt(args, where: str, measure):
    """One measurement of --updates, --load or --ingest: its result, or
    None with its exception named on standard error (a workload the engine
    refuses, an option that does not fit it) -- the run then fails, as an
    error row does; --strict raises it."""
    try:
        return measure()
    except Exception as exc:
        if args.strict:
            raise
        print(f"bexmatch bench: {where}: {type(exc).__name__}: {exc}", file=sys.stderr)
        return None


def _updates(args, parser, algorithms, algorithm_options) -> int:
    records, failed = [], 0
    for workload in _mode_workloads(args, parser, "--updates", 10):
        if args.updates > workload.n_subscriptions:
            parser.error(f"--updates {args.updates}: {workload.name} has {workload.n_subscriptions:,} subscriptions"
                         + ("" if args.parquet else f" at --scale {args.scale:g}"))
        for algorithm in algorithms or ["opindex"]:
            chosen = bench_algorithms.options_of(algorithm, algorithm_options)
            if algorithm in ("opindex", "pstbloom", "psthash") and not chosen:
                cost = _attempt(args, f"{workload.name} {algorithm}", lambda: update_costs(
                    workload, args.updates, repeats=args.repeats, algorithm=algorithm))
                if cost is None:
                    failed = 1
                    continue
                print(f"{cost['workload']} ({cost['n_subscriptions']:,} subscriptions): {cost['n']:,} "
                      f"removals + {cost['n']:,} adds, merged and matched: {cost['incremental_s']:.3f} s "
                      f"with {algorithm}'s derived matcher, {cost['full_s']:.3f} s with a full rebuild "
                      f"({cost['full_s'] / cost['incremental_s']:.1f}x); same answers: {cost['same_answers']}")
                records.append(cost)
                failed |= _wrong(cost, f"{workload.name} {algorithm}", _AFTER_UPDATES)
            rates = _attempt(args, f"{workload.name} {algorithm}", lambda: update_rates(
                workload, algorithm, args.updates, repeats=args.repeats, seed=args.seed,
                options=bench_algorithms.resolve_options(algorithm, chosen, workload)))
            if rates is None:
                failed = 1
                continue
            print(_rates_line(rates) + f"; same answers: {rates['same_answers']}")
            records.append(rates)
            failed |= _wrong(rates, f"{workload.name} {algorithm}", _AFTER_UPDATES)
    return failed | (_write("--csv", args.csv, write_records, records) if args.csv else 0)


_AFTER_UPDATES = ("after the updates, the index's answers differ from scan's for the same subscriptions "
                  "(a sample of them: engine.bench.costs.sampled_answers_agree)")
_AFTER_LOAD = "the loaded index's answers differ from those of the index it was saved from"


def _wrong(record: dict, where: str, what: str) -> int:
    """The epilog's exit status 1, and ``what`` went wrong on stderr, when
    a record's answers were not the ones checked against; else 0."""
    if record["same_answers"]:
        return 0
    print(f"bexmatch bench: {where}: WRONG: {what}", file=sys.stderr)
    return 1


def _load(args, parser, algorithms, backend, algorithm_options) -> int:
    records, failed = [], 0
    for algorithm in algorithms or ["opindex"]:      # (a backend missing here: before any work)
        try:
            bench_algorithms.matcher_class(algorithm, backend)
        except BackendUnavailable as exc:
            parser.error(f"--load: {exc}")
    for workload in _mode_workloads(args, parser, "--load", 100):
        for algorithm in algorithms or ["opindex"]:
            where = f"{workload.name} {algorithm}/{backend}"
            cost = _attempt(args, where, lambda: load_costs(
                workload, algorithm, backend, repeats=args.repeats, options=bench_algorithms.resolve_options(
                    algorithm, bench_algorithms.options_of(algorithm, algorithm_options), workload)))
            if cost is None:
                failed = 1
                continue
            gain = cost['build_s'] / cost['load_first_match_s']
            print(f"{cost['workload']} {algorithm}/{cost['backend']} ({cost['n_subscriptions']:,} "
                  f"subscriptions): build + first match {cost['build_s']:.2f} s; save {cost['save_s']:.2f} s "
                  f"({cost['file_bytes'] / 2 ** 20:.1f} MiB); load {cost['load_s']:.2f} s, + first match "
                  f"{cost['load_first_match_s']:.2f} s ("
                  + (f"{gain:.1f}x faster" if gain >= 1 else f"{1 / gain:.1f}x slower")
                  + f" than the build); structure restored: {cost['structure_restored']}; "
                  f"same answers: {cost['same_answers']}")
            records.append(cost)
            failed |= _wrong(cost, where, _AFTER_LOAD)
    return failed | (_write("--csv", args.csv, write_records, records) if args.csv else 0)


def _ingest(args, parser) -> int:
    records, failed = [], 0
    for workload in _mode_workloads(args, parser, "--ingest", 100):
        rates = _attempt(args, workload.name, lambda: ingest_rates(workload, repeats=args.repeats))
        if rates is None:
            failed = 1
            continue
        print(f"{rates['workload']}: parse {rates['parse_per_s']:,.0f} expressions/s "
              f"({rates['n_texts']:,} texts, {rates['mean_predicates_per_text']:.1f} predicates each); "
              f"add_many of those texts {rates['add_texts_per_s']:,.0f}/s "
              f"({rates['add_texts_share_of_parse']:.0%} of the parse rate); "
              f"columnar ingestion {rates['ingest_per_s']:,.0f} subscriptions/s "
              f"({rates['n_subscriptions']:,} in {rates['ingest_s']:.2f} s)")
        records.append(rates)
    return failed | (_write("--csv", args.csv, write_records, records) if args.csv else 0)


def main(argv=None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return _main(args, parser)
    except MemoryError as exc:
        # a size the up-front estimate let through (it is a lower bound): one line, not NumPy's traceback
        print(f"bexmatch bench: error: out of memory ({type(exc).__name__}: {exc}); try a smaller --scale, "
              f"--events, --values or --batch-sizes", file=sys.stderr)
        return 1


def _main(args, parser) -> int:
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
    modes = [flag for flag, given in (("--sweep", args.sweep is not None), ("--updates", args.updates),
                                      ("--load", args.load), ("--ingest", args.ingest),
                                      ("--arrival-delays", args.arrival_delays is not None)) if given]
    if len(modes) > 1:
        parser.error(f"{' and '.join(modes)}: each is a mode of its own; give one")
    mode = modes[0] if modes else None
    _check_flags(args, parser, mode)
    # the backends the mode runs on: --load the first, --updates and --ingest cpu alone
    _check_algorithm_options(parser, algorithms, algorithm_options,
                             backends[:1] if mode == "--load" else ["cpu"] if mode in ("--updates", "--ingest")
                             else backends)
    _check_outputs(args, parser)
    args.latency_samples = LATENCY_SAMPLES if args.latency_samples is None else args.latency_samples
    args.scan_sample = SCAN_SAMPLE if args.scan_sample is None else args.scan_sample
    if mode == "--arrival-delays":
        return _latency(args, parser, algorithms, backends, algorithm_options)
    if mode == "--updates":
        return _updates(args, parser, algorithms, algorithm_options)
    if mode == "--load":
        return _load(args, parser, algorithms, backends[0], algorithm_options)
    if mode == "--ingest":
        return _ingest(args, parser)
    options = dict(repeats=args.repeats, latency_samples=args.latency_samples,
                   scan_sample=args.scan_sample, progress=not args.quiet, strict=args.strict,
                   algorithm_options=algorithm_options, texts=args.texts, columns=args.columns)
    if mode == "--sweep":
        if args.workload or args.parquet:
            parser.error("--sweep generates its own workloads: leave out --workload and --parquet")
        if not args.values:
            parser.error("--sweep needs --values v1,v2,...")
        generator = args.generator or DEFAULT_GENERATOR
        params = {}
        for item in args.param:
            key, sep, value = item.partition("=")
            if not sep or not key.strip():
                parser.error(f"--param expects KEY=VALUE, not {item!r}")
            params[key.strip()] = value
        try:   # bad names and values, sizes beyond memory, and sweeps that would drop or vary nothing
            plan_sweep(args.sweep, args.values, generator, params, algorithms, overridden_params=False,
                       series=args.series,
                       scale=args.scale, n_events=args.events, algorithm_options=algorithm_options,
                       backend=backends)
        except ValueError as exc:
            parser.error(str(exc))
        rows = sweep(args.sweep, args.values, generator, params, algorithms, backends, series=args.series,
                     scale=args.scale, events_limit=args.events, seed=args.seed, **options)
    else:
        workloads = _parquet_workloads(args.parquet, parser)
        if args.workload or not args.parquet:
            workloads += _workloads(args.workload or ["W1"], parser, scale=args.scale, n_events=args.events,
                                    seed=args.seed)
        rows = run_benchmark(workloads, algorithms, backends, events_limit=args.events, **options)

    print(format_table(rows))
    unwritten = 0
    if args.csv:
        unwritten |= _write("--csv", args.csv, write_csv, rows)
    if args.plot:
        unwritten |= _write("--plot", args.plot, plot, rows)
    return _report_failures([r for r in rows if r["status"] == "error" or r["correct"] is False],
                            lambda r: f"{r['workload']} {r['algorithm']}/{r['backend']}") | unwritten
