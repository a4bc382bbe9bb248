"""The reports of ``bexmatch bench``: the rows as a text table, as CSV,
and as a plot of events/s and index bytes."""

from __future__ import annotations

import csv
import math

import numpy as np

from engine.bench.measure import COLUMNS


def _human_bytes(n) -> str:
    if n is None:
        return "-"
    if abs(n) < 1024:
        return f"{n:.0f} B"
    for unit in ("KiB", "MiB"):
        n /= 1024
        if abs(n) < 1024:
            return f"{n:.1f} {unit}"
    return f"{n / 1024:.1f} GiB"


def _num(x, digits=3) -> str:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "-"
    if abs(x) >= 1000:
        return f"{x:,.0f}"
    return f"{x:.{digits}g}"


_TABLE = (
    ("workload", "workload", str),
    ("sweep_value", "value", str),
    ("series_value", "series", str),
    ("algorithm", "algorithm", str),
    ("backend", "backend", str),
    ("options", "options", lambda v: v or ""),
    ("n_subscriptions", "subs", lambda v: f"{v:,}"),
    ("n_events", "events", lambda v: f"{v:,}"),
    ("build_s", "build s", _num),
    ("index_bytes", "index", _human_bytes),
    ("events_per_s", "events/s", _num),
    ("latency_p50_us", "p50 us", _num),
    ("latency_p99_us", "p99 us", _num),
    ("matches_per_event", "matches/ev", _num),
    ("ratio_to_scan", "x scan", lambda v: "-" if v is None else f"{v:.2f}"),
    ("scan_sample", "scan ev", lambda v: f"{v:,}"),
    ("correct", "correct", lambda v: "-" if v is None else ("yes" if v else "NO")),
    ("note", "note", lambda v: v or ""),
)


def format_table(rows) -> str:
    """The rows as a plain aligned text table."""
    shown = {"sweep_value": any(r.get("sweep_param") for r in rows),
             "series_value": any(r.get("series_param") for r in rows),
             "options": any(r.get("options") for r in rows)}
    columns = [c for c in _TABLE if shown.get(c[0], True)]
    for axis in ("sweep", "series"):      # an axis column is headed by the parameter it varies
        if shown[f"{axis}_value"]:
            params = "/".join(sorted({str(r[f"{axis}_param"]) for r in rows if r.get(f"{axis}_param")}))
            columns = [(c[0], params, c[2]) if c[0] == f"{axis}_value" else c for c in columns]
    cells = [[title for _, title, _ in columns]]
    for row in rows:
        line = []
        for key, _, fmt in columns:
            value = row.get(key)
            if row.get("status") != "ok" and key == "correct":
                line.append(row.get("status") or "")
            elif key in ("sweep_value", "series_value"):
                line.append(str(value) if row.get(key.replace("_value", "_param")) else "-")
            else:
                line.append("-" if value is None and key not in ("note", "options") else fmt(value))
        cells.append(line)
    widths = [max(len(r[i]) for r in cells) for i in range(len(columns))]
    numeric = {"n_subscriptions", "n_events", "build_s", "index_bytes", "events_per_s", "latency_p50_us",
               "latency_p99_us", "matches_per_event", "ratio_to_scan", "scan_sample"}
    lines = []
    for n, line in enumerate(cells):
        parts = [cell.rjust(w) if key in numeric else cell.ljust(w)
                 for (key, _, _), cell, w in zip(columns, line, widths)]
        lines.append("  ".join(parts).rstrip())
        if n == 0:
            lines.append("  ".join("-" * w for w in widths))
    sampled = [r for r in rows if r.get("status") == "ok" and r.get("scan_sample") is not None
               and r.get("algorithm") != "scan" and r["scan_sample"] < r["n_events"]]
    if sampled:
        lines.append("")
        lines.append("scan ev < events: scan was timed, and answers checked, on the first 'scan ev' events only.")
    return "\n".join(lines)


def _csv_value(value):
    if value is None:
        return ""
    if isinstance(value, float):
        return repr(value)
    return value


def write_csv(rows, path) -> None:
    """Write the rows to ``path``; every column of :data:`COLUMNS` is always present."""
    with open(path, "w", newline="", encoding="utf-8") as f:
        writer = csv.DictWriter(f, fieldnames=COLUMNS, extrasaction="ignore")
        writer.writeheader()
        for row in rows:
            out = {c: _csv_value(row.get(c)) for c in COLUMNS}
            for axis in ("sweep", "series"):   # a swept None (e.g. zipf: uniform), not a missing value
                if row.get(f"{axis}_param") and row.get(f"{axis}_value") is None:
                    out[f"{axis}_value"] = "None"
            writer.writerow(out)


def write_records(records, path) -> None:
    """Write dicts of any keys (``--updates``, ``--ingest``, ``--load``: one
    per measurement) to ``path`` as CSV, the columns in order of appearance."""
    columns = list(dict.fromkeys(key for record in records for key in record))
    with open(path, "w", newline="", encoding="utf-8") as f:
        writer = csv.DictWriter(f, fieldnames=columns)
        writer.writeheader()
        for record in records:
            writer.writerow({c: _csv_value(record.get(c)) for c in columns})


#: the panels of :func:`plot`: (row column, title, y label, scale of the values)
PANELS = (("events_per_s", "throughput (match_batch)", "events / s", 1.0),
          ("build_s", "build time", "seconds", 1.0),
          ("index_bytes", "index memory", "MiB", 1 / 2 ** 20),
          ("latency_p50_us", "single-event latency (bar/dot: p50, whisker: p99)", "µs", 1.0))


def plot(rows, path=None):
    """Four panels -- throughput with the spread of the repeats
    (``events_per_s_min`` to ``_max``), build time, index memory, and
    single-event latency p50 with p99 -- per workload as bars on linear
    axes (bars are compared by length), or against the swept parameter as
    lines (one per algorithm x backend x series value).  Written to ``path``
    as PNG when given.  Uses matplotlib's Agg canvas directly (no pyplot, no
    change to the caller's matplotlib backend).  Returns the Figure."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    ok = [r for r in rows if r.get("status") == "ok"]
    fig = Figure(figsize=(13, 8), layout="constrained")
    FigureCanvasAgg(fig)
    axes = fig.subplots(2, 2).ravel()
    swept = [r for r in ok if r.get("sweep_param")]
    if not ok:
        for ax in axes:
            ax.text(0.5, 0.5, "no results", ha="center", va="center", transform=ax.transAxes)
    elif swept:
        _plot_sweep(axes, swept)
    else:
        _plot_bars(axes, ok)
    for ax, (_, title, ylabel, _) in zip(axes, PANELS):
        ax.set_title(title, fontsize="medium")
        ax.set_ylabel(ylabel)
    if ok:
        axes[0].legend(fontsize="small")
    if path is not None:
        fig.savefig(path, dpi=110)
    return fig


def _value(row, column, scale):
    value = row.get(column)
    return np.nan if value is None else float(value) * scale


def _label(algorithm, backend, mine, extra=""):
    label = f"{algorithm} ({backend})" + extra
    return label + (" WRONG ANSWERS" if any(r["correct"] is False for r in mine) else "")


def _plot_bars(axes, ok):
    names = list(dict.fromkeys(r["workload"] for r in ok))
    series = list(dict.fromkeys((r["algorithm"], r["backend"]) for r in ok))
    width = 0.8 / max(len(series), 1)
    for i, (algorithm, backend) in enumerate(series):
        mine = {r["workload"]: r for r in ok if (r["algorithm"], r["backend"]) == (algorithm, backend)}
        label = _label(algorithm, backend, mine.values())
        xs = np.arange(len(names)) + (i - (len(series) - 1) / 2) * width
        rows = [mine.get(n, {}) for n in names]
        for ax, (column, _, _, scale) in zip(axes, PANELS):
            heights = [_value(r, column, scale) for r in rows]
            bars = ax.bar(xs, heights, width, label=label)
            color = bars.patches[0].get_facecolor() if bars.patches else None
            if column == "events_per_s":         # the spread of the repeats
                low = [h - _value(r, "events_per_s_min", 1.0) for h, r in zip(heights, rows)]
                high = [_value(r, "events_per_s_max", 1.0) - h for h, r in zip(heights, rows)]
                ax.errorbar(xs, heights, yerr=[np.nan_to_num(low), np.nan_to_num(high)], fmt="none",
                            ecolor="black", capsize=3, linewidth=1)
            elif column == "latency_p50_us":     # p99 as a whisker above the p50 bar
                p99 = [_value(r, "latency_p99_us", 1.0) for r in rows]
                ax.errorbar(xs, heights, yerr=[np.zeros(len(xs)), np.nan_to_num(np.subtract(p99, heights))],
                            fmt="none", ecolor=color, capsize=3, linewidth=1)
    for ax in axes:
        ax.set_xticks(range(len(names)), names)
        ax.set_xlabel("workload")
        ax.set_ylim(bottom=0)


def _plot_sweep(axes, swept):
    param = "/".join(sorted({str(r["sweep_param"]) for r in swept}))
    values = list(dict.fromkeys(r["sweep_value"] for r in swept))
    numeric = all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values)
    position = {v: (v if numeric else i) for i, v in enumerate(values)}
    lines = list(dict.fromkeys((r["algorithm"], r["backend"], r.get("series_param"), r.get("series_value"))
                               for r in swept))
    for algorithm, backend, series_param, series_value in lines:
        mine = [r for r in swept if (r["algorithm"], r["backend"], r.get("series_param"),
                                     r.get("series_value")) == (algorithm, backend, series_param, series_value)]
        mine.sort(key=lambda r: values.index(r["sweep_value"]))
        label = _label(algorithm, backend, mine, f" {series_param}={series_value}" if series_param else "")
        xs = [position[r["sweep_value"]] for r in mine]
        for ax, (column, _, _, scale) in zip(axes, PANELS):
            (line,) = ax.plot(xs, [_value(r, column, scale) for r in mine], marker="o", label=label)
            if column == "events_per_s":
                ax.fill_between(xs, [_value(r, "events_per_s_min", 1.0) for r in mine],
                                [_value(r, "events_per_s_max", 1.0) for r in mine], color=line.get_color(),
                                alpha=0.2, linewidth=0)
            elif column == "latency_p50_us":
                ax.plot(xs, [_value(r, "latency_p99_us", 1.0) for r in mine], marker="^", linestyle=":",
                        color=line.get_color())
    for ax in axes:
        ax.set_xlabel(param)
        if numeric and min(values) > 0 and max(values) / min(values) >= 20:
            ax.set_xscale("log")
        if not numeric:
            ax.set_xticks(range(len(values)), [str(v) for v in values])
    speeds = [r["events_per_s"] for r in swept if r.get("events_per_s")]
    if speeds and max(speeds) / min(speeds) >= 100:      # lines spanning decades: a log axis keeps them apart
        axes[0].set_yscale("log")
