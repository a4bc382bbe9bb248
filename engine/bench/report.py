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


def plot(rows, path=None):
    """Events/s and index bytes, against the swept parameter (sweeps) or per
    workload (bars), one series per algorithm x backend (x series value,
    for a sweep with a second axis); written to ``path``
    as PNG when given.  Uses matplotlib's Agg canvas directly (no pyplot, no
    change to the caller's matplotlib backend).  Returns the Figure."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    ok = [r for r in rows if r.get("status") == "ok"]
    fig = Figure(figsize=(12, 4.5), layout="constrained")
    FigureCanvasAgg(fig)
    ax_speed, ax_bytes = fig.subplots(1, 2)
    series = list(dict.fromkeys((r["algorithm"], r["backend"]) for r in ok))
    swept = [r for r in ok if r.get("sweep_param")]
    if not ok:
        for ax in (ax_speed, ax_bytes):
            ax.text(0.5, 0.5, "no results", ha="center", va="center", transform=ax.transAxes)
    elif swept:
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
            label = f"{algorithm} ({backend})" + (f" {series_param}={series_value}" if series_param else "")
            if any(r["correct"] is False for r in mine):
                label += " WRONG ANSWERS"
            xs = [position[r["sweep_value"]] for r in mine]
            ax_speed.plot(xs, [r["events_per_s"] or np.nan for r in mine], marker="o", label=label)
            ax_bytes.plot(xs, [(r["index_bytes"] or np.nan) / 2 ** 20 for r in mine], marker="o", label=label)
        for ax in (ax_speed, ax_bytes):
            ax.set_xlabel(param)
            if numeric and min(values) > 0 and max(values) / min(values) >= 20:
                ax.set_xscale("log")
            if not numeric:
                ax.set_xticks(range(len(values)), [str(v) for v in values])
    else:
        names = list(dict.fromkeys(r["workload"] for r in ok))
        width = 0.8 / max(len(series), 1)
        for i, (algorithm, backend) in enumerate(series):
            label = f"{algorithm} ({backend})"
            mine = {r["workload"]: r for r in ok if (r["algorithm"], r["backend"]) == (algorithm, backend)}
            if any(r["correct"] is False for r in mine.values()):
                label += " WRONG ANSWERS"
            xs = np.arange(len(names)) + (i - (len(series) - 1) / 2) * width
            speed = [mine[n]["events_per_s"] or np.nan if n in mine else np.nan for n in names]
            size = [(mine[n]["index_bytes"] or np.nan) / 2 ** 20 if n in mine else np.nan for n in names]
            ax_speed.bar(xs, speed, width, label=label)
            ax_bytes.bar(xs, size, width, label=label)
        for ax in (ax_speed, ax_bytes):
            ax.set_xticks(range(len(names)), names)
            ax.set_xlabel("workload")
    ax_speed.set_ylabel("events / s")
    ax_bytes.set_ylabel("index MiB")
    if ok and all((r["events_per_s"] or 0) > 0 for r in ok):
        ax_speed.set_yscale("log")
    ax_speed.set_title("throughput (match_batch)")
    ax_bytes.set_title("index memory")
    if series:
        ax_speed.legend(fontsize="small")
    if path is not None:
        fig.savefig(path, dpi=110)
    return fig
