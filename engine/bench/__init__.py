"""``bexmatch bench``: algorithms x backends over the papers' workloads (docs/architecture.md#workloads-and-benchmarks).

Every algorithm of the registry (:mod:`engine.algorithms.registry`), and
the bench's variants of them, is built and timed on each workload, and its
answers are checked against ``scan``'s -- a row never reports speed without
saying whether the answers were right.  The modules:

* :mod:`engine.bench.algorithms` -- what can run: the registered algorithms,
  the bench variants (``opindex-bs``) and the options a run passes them
  (``--option betree.max_cap=auto``: BE-Tree Table 4 per workload);
* :mod:`engine.bench.measure` -- one row per (workload, algorithm, backend):
  :func:`run_benchmark` and the columns (:data:`COLUMNS`, documented there);
* :mod:`engine.bench.sweep` -- one generator parameter varied (OpIndex Fig. 10,
  BE-Tree Fig. 5/6/11 with ``generator="begen"``);
* :mod:`engine.bench.costs` -- ingestion rates, opindex's merge costs, adds and
  removals one at a time (through ``Index``, and BE-Tree's tree itself);
* :mod:`engine.bench.report` -- text table, CSV and plot;
* :mod:`engine.bench.cli` -- ``bexmatch bench`` (also ``python -m engine.bench``);
* :mod:`engine.bench.gpu` -- ``make bench-gpu`` (``python -m engine.bench.gpu``):
  cpu against cuda, host-device copies, phases, counting strategies.

The API::

    rows = run_benchmark(["W1"], ["scan", "opindex"], ["cpu"], scale=0.01)
    rows = sweep("N", [10_000, 100_000], generator="opindex", algorithms=["scan", "opindex"])
    print(format_table(rows)); write_csv(rows, "bench.csv"); plot(rows, "bench.png")
"""

from __future__ import annotations

from engine.bench.algorithms import VARIANTS, implemented_algorithms
from engine.bench.cli import build_parser, main
from engine.bench.costs import ingest_rates, update_costs, update_rates
from engine.bench.measure import COLUMNS, run_benchmark, scan_sample_size
from engine.bench.report import format_table, plot, write_csv, write_records
from engine.bench.sweep import SWEEP_ALIASES, coerce_value, resolve_sweep_param, sweep, sweep_base

__all__ = ["COLUMNS", "SWEEP_ALIASES", "VARIANTS", "build_parser", "coerce_value", "format_table",
           "implemented_algorithms", "ingest_rates", "main", "plot", "resolve_sweep_param", "run_benchmark",
           "scan_sample_size", "sweep", "sweep_base", "update_costs", "update_rates", "write_csv", "write_records"]
