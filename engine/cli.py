"""The ``bexmatch`` command line.

    bexmatch match --subs SUBS --events EVENTS [--out OUT]
    bexmatch run   [...]        the Spark main job (spark_integration.job)
    bexmatch bench [...]        benchmarks (engine.bench)

Subscriptions are ``id<TAB>expression`` text lines or Parquet in the
columnar form (engine.columnar); events are JSON Lines or Parquet (one row
per event); matches are written as JSON Lines (default, to stdout) or
Parquet, one ``(event, sub_id)`` row per match.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
from tqdm import tqdm

from engine.errors import BexmatchError

EVENT_BATCH = 8192


def _is_parquet(path: str) -> bool:
    p = Path(path)
    return p.suffix == ".parquet" or (p.is_dir() and any(p.glob("*.parquet")))


def load_subscriptions(index, path: str, progress: bool = True) -> None:
    """Fill ``index`` from a Parquet columnar file or ``id<TAB>expr`` text."""
    if _is_parquet(path):
        index.add_many(pq.read_table(path))
        return
    ids, texts = [], []
    with open(path, encoding="utf-8") as f:
        for number, line in enumerate(f, start=1):
            line = line.rstrip("\n")
            if not line.strip() or line.lstrip().startswith("#"):
                continue
            sub_id, sep, text = line.partition("\t")
            if not sep:
                raise BexmatchError(f"{path}:{number}: expected 'id<TAB>expression'")
            try:
                ids.append(int(sub_id))
            except ValueError:
                raise BexmatchError(f"{path}:{number}: subscription id {sub_id!r} is not an integer") from None
            texts.append(text)
    from engine.parse import parse
    nodes = []
    for sub_id, text in tqdm(list(zip(ids, texts)), desc="parse", unit="sub", disable=not progress or None):
        try:
            nodes.append(parse(text))
        except BexmatchError as exc:
            raise BexmatchError(f"{path}: subscription {sub_id}: {exc}") from None
    index.add_many(ids, nodes)


def event_batches(path: str, batch_size: int = EVENT_BATCH):
    """Yield events as pyarrow Tables (Parquet) or lists of dicts (JSON Lines)."""
    if _is_parquet(path):
        for batch in pq.ParquetFile(path).iter_batches(batch_size=batch_size) if Path(path).is_file() \
                else pq.read_table(path).to_batches(batch_size):
            yield pa.Table.from_batches([batch])
        return
    batch = []
    with open(path, encoding="utf-8") as f:
        for number, line in enumerate(f, start=1):
            if not line.strip():
                continue
            try:
                event = json.loads(line)
            except json.JSONDecodeError as exc:
                raise BexmatchError(f"{path}:{number}: not valid JSON ({exc.msg})") from None
            if not isinstance(event, dict):
                raise BexmatchError(f"{path}:{number}: an event must be a JSON object")
            batch.append(event)
            if len(batch) == batch_size:
                yield batch
                batch = []
    if batch:
        yield batch


def _count_events(path: str) -> int | None:
    if _is_parquet(path) and Path(path).is_file():
        return pq.ParquetFile(path).metadata.num_rows
    return None


class MatchWriter:
    """Matches to Parquet or JSON Lines (a file, or stdout)."""

    def __init__(self, out: str | None):
        self.out = out
        self.parquet = out is not None and out.endswith(".parquet")
        self.writer = None
        self.stream = None if self.parquet else (open(out, "w", encoding="utf-8") if out else sys.stdout)

    def write(self, table: pa.Table) -> None:
        if self.parquet:
            if self.writer is None:
                self.writer = pq.ParquetWriter(self.out, table.schema)
            self.writer.write_table(table)
        else:
            for event, sub_id in zip(table["event"].to_pylist(), table["sub_id"].to_pylist()):
                self.stream.write(f'{{"event": {event}, "sub_id": {sub_id}}}\n')

    def close(self) -> None:
        if self.parquet:
            if self.writer is None:   # no matches: still write a valid, empty file
                pq.write_table(pa.table({"event": pa.array([], pa.int64()), "sub_id": pa.array([], pa.int64())}),
                               self.out)
            else:
                self.writer.close()
        elif self.out:
            self.stream.close()
        else:
            self.stream.flush()


def command_match(args) -> int:
    from engine import Index

    index = Index(algorithm=args.algorithm, backend=args.backend)
    load_subscriptions(index, args.subs, progress=not args.quiet)
    index.merge()
    writer = MatchWriter(args.out)
    seen = matched = 0
    bar = tqdm(total=_count_events(args.events), desc="match", unit="event", disable=args.quiet or None)
    try:
        for batch in event_batches(args.events, args.batch_size):
            try:
                result = index.match_batch(batch, output="arrow", errors=args.errors)
            except BexmatchError as exc:
                raise BexmatchError(f"{args.events}: batch starting at event {seen}: {exc}") from None
            n = batch.num_rows if isinstance(batch, pa.Table) else len(batch)
            result = result.set_column(0, "event", pa.compute.add(result["event"], seen))
            writer.write(result)
            seen += n
            matched += result.num_rows
            bar.update(n)
    finally:
        bar.close()
        writer.close()
    if not args.quiet:
        print(f"{len(index)} subscriptions, {seen} events, {matched} matches", file=sys.stderr)
    return 0


def build_parser() -> argparse.ArgumentParser:
    from engine.algorithms import ALGORITHMS

    parser = argparse.ArgumentParser(prog="bexmatch", description="Match events against Boolean-expression "
                                     "subscriptions on CPU cores, GPUs and Spark.")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    match = commands.add_parser("match", help="match a file of events against a file of subscriptions",
                                description="Match events against subscriptions and write (event, sub_id) "
                                "pairs; event numbers count from 0 in input order.")
    match.add_argument("--subs", required=True, help="id<TAB>expression text, or Parquet in the columnar form")
    match.add_argument("--events", required=True, help="JSON Lines or Parquet, one event per line/row")
    match.add_argument("--out", help="output file: .parquet for Parquet, anything else for JSON Lines "
                       "(default: JSON Lines on stdout)")
    match.add_argument("--algorithm", choices=ALGORITHMS, help="matching algorithm (default: best available)")
    match.add_argument("--backend", choices=("cpu", "cuda"), help="backend (default: best available)")
    match.add_argument("--batch-size", type=int, default=EVENT_BATCH, help="events per batch (default %(default)s)")
    match.add_argument("--errors", choices=("raise", "null"), default="raise",
                       help="an event value of the wrong type: fail (raise) or treat it as absent (null)")
    match.add_argument("--quiet", action="store_true", help="no progress bar or summary")
    match.set_defaults(handler=command_match)

    # listed for `bexmatch --help`; main() hands their arguments to their own parsers
    commands.add_parser("run", help="the Spark main job (default: local Spark on a generated workload); "
                        "see `bexmatch run --help`", add_help=False)
    commands.add_parser("bench", help="benchmark algorithms x backends on standard workloads; "
                        "see `bexmatch bench --help`", add_help=False)
    return parser


def _spark_job(argv) -> int:
    from spark_integration.job import main as job_main
    return job_main(argv) or 0


def _bench(argv) -> int:
    from engine.bench import main as bench_main
    return bench_main(argv) or 0


#: commands whose arguments belong to another module's own parser
DELEGATED = {"run": _spark_job, "bench": _bench}


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    try:
        if argv and argv[0] in DELEGATED:
            # argparse's REMAINDER drops options that start with "--", so hand
            # the rest of the command line over untouched
            return DELEGATED[argv[0]](argv[1:])
        args = build_parser().parse_args(argv)
        return args.handler(args)
    except BexmatchError as exc:
        print(f"bexmatch: error: {exc}", file=sys.stderr)
        return 2
    except (FileNotFoundError, KeyError) as exc:   # missing files; duplicate or unknown subscription ids
        print(f"bexmatch: error: {exc.args[0] if isinstance(exc, KeyError) else exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
