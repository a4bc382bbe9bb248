"""``bexmatch bench``: algorithms x backends over the papers' workloads (docs/architecture.md#workloads-and-benchmarks).

Every algorithm of the registry (:mod:`engine.algorithms.registry`), and
the bench's variants of them, is built and timed on each workload, and its
answers are checked against ``scan``'s -- a row never reports speed without
saying whether the answers were right.  The modules:

* :mod:`engine.bench.algorithms` -- what can run: the registered algorithms,
  the bench variants (``opindex-bs``; A-PCM's ablations ``apcm-bitmap`` ...
  ``apcm-cuppre`` once ``apcm`` is registered) and the options a run passes
  them (``--option betree.max_cap=auto``: BE-Tree Table 4 per workload);
* :mod:`engine.bench.measure` -- one row per (workload, algorithm, backend):
  :func:`run_benchmark` and the columns (:data:`COLUMNS`, documented there);
* :mod:`engine.bench.sweep` -- one generator parameter or algorithm option
  varied, optionally along a second axis (OpIndex Fig. 10, BE-Tree Fig.
  5/6/11 and A-PCM Fig. 8/9 with ``generator="begen"``);
* :mod:`engine.bench.latency` -- batch times by batch size and the latency
  of a stream at each delay between events, simulated over them (A-PCM Fig. 12);
* :mod:`engine.bench.costs` -- ingestion rates, opindex's merge costs, adds and
  removals one at a time (through ``Index``, and BE-Tree's tree itself);
* :mod:`engine.bench.report` -- text table, CSV and plot;
* :mod:`engine.bench.cli` -- ``bexmatch bench`` (also ``python -m engine.bench``);
* :mod:`engine.bench.gpu` -- ``make bench-gpu`` (``python -m engine.bench.gpu``):
  cpu against cuda, host-device copies, phases, counting strategies.

The API::

    rows = run_benchmark(["W1"], ["scan", "opindex"], ["cpu"], scale=0.01)
    rows = sweep("N", [10_000, 100_000], generator="opindex", algorithms=["scan", "opindex"])
    rows = sweep("betree.max_cap", [5, 20], generator="begen", series=("similarity", [0.3, 0.9]))
    print(format_table(rows)); write_csv(rows, "bench.csv"); plot(rows, "bench.png")
    rows = latency_sweep(standard("W6", 0.01, n_events=5000), ["betree"], batch_sizes=[1, 128], delays_ms=[1, 0.1])
    print(format_latency(rows)); write_records(rows, "latency.csv"); plot_latency(rows, "latency.png")
"""

from __future__ import annotations

from engine.bench.algorithms import VARIANTS, implemented_algorithms
from engine.bench.cli import build_parser, main
from engine.bench.costs import ingest_rates, update_costs, update_rates
from engine.bench.latency import LATENCY_COLUMNS, format_latency, latency_sweep, plot_latency, simulate
from engine.bench.measure import COLUMNS, run_benchmark, scan_sample_size
from engine.bench.report import format_table, plot, write_csv, write_records
from engine.bench.sweep import SWEEP_ALIASES, coerce_value, resolve_sweep_param, sweep, sweep_base

__all__ = ["COLUMNS", "LATENCY_COLUMNS", "SWEEP_ALIASES", "VARIANTS", "build_parser", "coerce_value", "format_latency",
           "format_table", "implemented_algorithms", "ingest_rates", "latency_sweep", "main", "plot", "plot_latency",
           "resolve_sweep_param", "run_benchmark", "scan_sample_size", "simulate", "sweep", "sweep_base",
           "update_costs", "update_rates", "write_csv", "write_records"]
