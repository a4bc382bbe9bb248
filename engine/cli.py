"""The ``bexmatch`` command line.

    bexmatch match --subs SUBS --events EVENTS [--out OUT]
    bexmatch run   [...]        the Spark main job (spark_integration.job)
    bexmatch bench [...]        benchmarks (engine.bench)

Only ``run`` imports Spark (pyspark, spark_integration): the other commands
work without it.

Subscriptions are ``id<TAB>expression`` text lines or Parquet in the
columnar form (engine.columnar); events are JSON Lines or Parquet (one row
per event); matches are written as JSON Lines (default, to stdout) or
Parquet, one ``(event, sub_id)`` row per match.

Bad input ends a run with one line on stderr, naming the file and the line
(1-based; the row for Parquet events), and exit status 2 -- never a
traceback.  An ``--out`` file appears only when the run succeeds; ``--out``
may not name an input.  A symlink is written through (its target gets the
matches), and a FIFO, a device or ``/dev/stdout`` is written into directly.
"""

from __future__ import annotations

import argparse
import contextlib
import errno
import io
import json
import os
import re
import secrets
import stat
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
from tqdm import tqdm

from engine._version import __version__
from engine.algorithms import registry
from engine.errors import BadEventError, BexmatchError
from engine.files import replace_keeping_mode

EVENT_BATCH = 8192
INT64_MIN, INT64_MAX = -2 ** 63, 2 ** 63 - 1
#: how the engine names an event of a batch it refuses ("event 3: ...")
_ENGINE_EVENT = re.compile(r"^event (\d+): (.*)$", re.S)


def _is_parquet(path: str) -> bool:
    p = Path(path)
    return p.suffix == ".parquet" or (p.is_dir() and any(p.glob("*.parquet")))


def _lines(path: str):
    """(1-based line number, text without its line ending) of a UTF-8 text
    file, without the byte order mark Windows editors start one with; a
    line that is not UTF-8 is an error naming it."""
    with open(path, "rb") as f:
        for number, raw in enumerate(f, start=1):
            try:
                yield number, raw.decode("utf-8-sig" if number == 1 else "utf-8").rstrip("\r\n")
            except UnicodeDecodeError as exc:
                raise BexmatchError(f"{path}:{number}: not valid UTF-8 (byte {exc.start + 1} of the line)") from None


@contextlib.contextmanager
def _parquet_errors(path: str):
    """A Parquet file pyarrow cannot read is the input's fault: say so, naming it."""
    try:
        yield
    except pa.ArrowException as exc:
        raise BexmatchError(f"{path}: not a readable Parquet file ({exc})") from None


#: a subscription id in a text file: ASCII digits, an optional minus sign
_DECIMAL_ID = re.compile(r"-?[0-9]+")


def open_subscriptions(path: str, algorithm: str | None = None, backend: str | None = None,
                       progress: bool = True):
    """The index ``--subs`` names: a saved index as it was saved (another
    algorithm or backend only where asked for), or a new one filled by
    :func:`load_subscriptions` from text or Parquet."""
    from engine import Index
    from engine.index_file import is_index_file

    if is_index_file(path):
        return Index.load(path, algorithm=algorithm, backend=backend)    # IndexFileError names the path
    index = Index(algorithm=algorithm, backend=backend)
    load_subscriptions(index, path, progress=progress)
    return index


def load_subscriptions(index, path: str, progress: bool = True) -> None:
    """Fill ``index`` from a Parquet columnar file (or a directory of them,
    added file by file) or ``id<TAB>expr`` text; an error names its file, and
    in the text its line."""
    if _is_parquet(path):
        # file by file, each with its own columns (one table of a directory takes the first file's schema:
        # a column only later files hold is dropped, one typed otherwise is cast)
        for part in _parquet_parts(path):
            with _parquet_errors(part):
                table = pq.read_table(part)
            try:
                index.add_many(table)
            except (BexmatchError, KeyError) as exc:   # KeyError: an id given twice
                raise BexmatchError(f"{part}: {_message(exc)}") from None
        return
    ids, texts, lines = [], [], []
    for number, line in _lines(path):
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        sub_id, sep, text = line.partition("\t")
        if not sep:
            raise BexmatchError(f"{path}:{number}: expected 'id<TAB>expression'")
        if not _DECIMAL_ID.fullmatch(sub_id):     # (int() also reads ' 3', '+3', '3_000' and other scripts' digits)
            raise BexmatchError(f"{path}:{number}: subscription id {sub_id!r} is not an integer")
        sub_id = int(sub_id)
        if not INT64_MIN <= sub_id <= INT64_MAX:
            raise BexmatchError(f"{path}:{number}: subscription id {sub_id} does not fit in int64")
        ids.append(sub_id)
        texts.append(text)
        lines.append(number)
    from engine.parse import parse
    nodes = []
    for sub_id, text, number in tqdm(list(zip(ids, texts, lines)), desc="parse", unit="sub",
                                     disable=not progress or None):
        try:
            nodes.append(parse(text))
        except BexmatchError as exc:
            raise BexmatchError(f"{path}:{number}: subscription {sub_id}: {exc}") from None
    try:
        index.add_many(ids, nodes)
    except (BexmatchError, KeyError) as exc:   # KeyError: an id given twice
        row, error = _first_refused(index, ids, nodes, exc)
        raise BexmatchError(f"{path}:{lines[row]}: {_message(error)}") from None


def _first_refused(index, ids, nodes, error) -> tuple[int, Exception]:
    """The first row whose subscription ``add_many`` refuses, and the error:
    the shortest refused prefix, by bisection on fresh indexes.  (add_many
    is all or nothing, and a row can clash with an earlier one -- a
    repeated id, another type family -- so a prefix, not the row alone, is
    what is refused.)  Only on the error path: about log2(rows) adds."""
    def refused(n):
        try:
            type(index)(algorithm=index.algorithm, backend=index.backend).add_many(ids[:n], nodes[:n])
        except (BexmatchError, KeyError) as exc:
            return exc
        return None

    low, high = 0, len(ids)          # the prefix of `low` rows is accepted, that of `high` refused
    while high - low > 1:
        middle = (low + high) // 2
        found = refused(middle)
        if found is None:
            low = middle
        else:
            high, error = middle, found
    return high - 1, error


def _message(exc: Exception) -> str:
    return exc.args[0] if isinstance(exc, KeyError) else str(exc)


def event_batches(path: str, batch_size: int = EVENT_BATCH):
    """Yield ``(events, lines)``: pyarrow Tables (Parquet) or lists of dicts
    (JSON Lines), with the 1-based line number of each event of a JSON
    Lines batch (None for Parquet, whose events are rows)."""
    if _is_parquet(path):
        for part in _parquet_parts(path):
            with _parquet_errors(part):
                for batch in pq.ParquetFile(part).iter_batches(batch_size=batch_size):
                    yield pa.Table.from_batches([batch]), None
        return
    batch, lines = [], []
    for number, line in _lines(path):
        if not line.strip():
            continue
        try:
            event = json.loads(line)
        except json.JSONDecodeError as exc:
            raise BexmatchError(f"{path}:{number}: not valid JSON ({exc.msg})") from None
        except RecursionError:
            raise BexmatchError(f"{path}:{number}: not valid JSON (nested too deeply)") from None
        if not isinstance(event, dict):
            raise BexmatchError(f"{path}:{number}: an event must be a JSON object")
        batch.append(event)
        lines.append(number)
        if len(batch) == batch_size:
            yield batch, lines
            batch, lines = [], []
    if batch:
        yield batch, lines


def _parquet_parts(path: str) -> list:
    """The Parquet file, or a directory's files in name order (those not
    hidden as ``_*`` or ``.*``, as pyarrow's discovery skips them), each
    read with its own columns: one table of the directory would take the
    first file's schema and drop a column only later files hold."""
    p = Path(path)
    if p.is_file():
        return [str(p)]
    parts = [f for f in sorted(p.iterdir()) if not f.name.startswith(("_", "."))]
    nested = [f for f in parts if not f.is_file()]
    if nested:
        raise BexmatchError(f"{path}: {nested[0].name} is a directory; a directory of Parquet files is read "
                            f"file by file, not into its subdirectories (partitioned datasets): give the "
                            f"files' directory")
    return [str(f) for f in parts]


def _count_events(path: str) -> int | None:
    if _is_parquet(path) and Path(path).is_file():
        with _parquet_errors(path):
            return pq.ParquetFile(path).metadata.num_rows
    return None


#: the engine's hint names Python keywords; on the command line they are flags
_API_HINT = re.compile(r" \(pass errors='null' .*?\)")
_CLI_HINT = " (pass --errors null to treat such values as absent)"


def _refused_event(path: str, lines, seen: int, n: int, exc: Exception) -> BexmatchError:
    """A batch's refusal as an error naming the line (JSON Lines) or the
    1-based row (Parquet) of the event the engine names, its hint in the
    command line's terms."""
    message = _API_HINT.sub(_CLI_HINT, str(exc))
    found = _ENGINE_EVENT.match(message)
    if found is None:
        where = f"{path}:{lines[0]}-{lines[-1]}" if lines else f"{path}: rows {seen + 1}-{seen + n}"
        return BexmatchError(f"{where}: {message}")
    k, problem = int(found.group(1)), found.group(2)
    return BexmatchError(f"{path}:{lines[k]}: {problem}" if lines else f"{path}: row {seen + k + 1}: {problem}")


def _event_without_id(path: str, lines, seen: int, n: int, id_field: str, exc: KeyError) -> BexmatchError:
    """An event without its ``--id-field`` as an error naming its line, as
    :func:`_refused_event` names a refused event's."""
    found = re.search(r"event (\d+) has no such key", str(exc.args[0]))
    if found is None:
        return _refused_event(path, lines, seen, n, ValueError(f"--id-field {id_field}: {exc.args[0]}"))
    return _refused_event(path, lines, seen, n, ValueError(f"event {found.group(1)}: --id-field {id_field}: "
                                                           f"the event has no such key"))


#: the most symlinks followed from an --out path (Linux's own limit)
_MAX_LINKS = 40


def _out_target(out: str) -> tuple[str, bool]:
    """The file ``--out`` names, and whether to write into it directly.

    A symlink is followed to the file it names (``current.jsonl ->
    v3.jsonl``: v3.jsonl gets the matches, the link stays), as
    ``engine.index_file`` does for a saved index.  Directly: a target that
    exists and is not a regular file (a FIFO, a device), and a link through
    /proc (``/dev/stdout -> /proc/self/fd/1``, ``/dev/fd/N``), which names
    an open file rather than a path -- a temp file renamed over any of them
    would replace the node itself and its reader would get nothing."""
    path = os.path.abspath(out)
    for _ in range(_MAX_LINKS):
        if not os.path.islink(path):
            break
        folder = os.path.realpath(os.path.dirname(path))
        if folder == "/proc" or folder.startswith("/proc/"):
            return os.path.join(folder, os.path.basename(path)), True
        path = os.path.normpath(os.path.join(folder, os.readlink(path)))
    else:
        if os.path.islink(path):         # (renaming over it would replace a link of the loop by a file)
            raise OSError(errno.ELOOP, os.strerror(errno.ELOOP), out)
    try:
        mode = os.stat(path).st_mode
    except OSError:              # not there yet (it is created), or no access (refused when written)
        return path, False
    return path, not stat.S_ISREG(mode)


#: a link to an open file of a process (of a thread): /proc/PID/fd/N, what /dev/stdout and /dev/fd/N name
_FD_LINK = re.compile(r"/proc/(\d+)/(?:task/\d+/)?fd/(\d+)")


def _open_directly(target: str):
    """A binary stream into a special file: for one of this process's own
    file descriptors a duplicate of it (the shell's ``>>`` appends, and its
    next writes follow the matches, as they follow anything written to
    stdout), else the file opened (a FIFO blocks until its reader opens it)."""
    link = _FD_LINK.fullmatch(target)
    if link is not None and int(link.group(1)) == os.getpid():
        return os.fdopen(os.dup(int(link.group(2))), "wb")
    return open(target, "wb")


def _refuse_an_input_as_out(out: str, target: str, inputs: dict[str, str]) -> None:
    """A usage error when ``--out`` names one of ``inputs`` (flag: path) --
    the same file, through a symlink or a hard link too -- or a file of an
    input directory's that it reads: the matches would replace the input
    (the run succeeded, exit 0, and the events or subscriptions were gone)."""
    for flag, path in inputs.items():
        if not os.path.exists(path):
            continue                          # (a missing input is refused, naming it, when it is read)
        if os.path.exists(target) and os.path.samefile(target, path):
            raise BexmatchError(f"--out {out}: is {flag} {path}; the matches would replace it")
        folder, name = os.path.split(target)
        if os.path.isdir(path) and os.path.isdir(folder) and os.path.samefile(folder, path) \
                and not name.startswith(("_", ".")):      # (the files of a directory that _parquet_parts reads)
            raise BexmatchError(f"--out {out}: is in the directory {flag} {path}, whose files are read as "
                                f"its input")


class MatchWriter:
    """Matches to Parquet or JSON Lines: to stdout, or to a file that
    appears only once the run succeeds (written beside it under a temp
    name, renamed at :meth:`commit`, removed at :meth:`discard`).  A FIFO,
    a device or /dev/stdout (see :func:`_out_target`) is written into
    directly: a partial output there cannot be taken back."""

    SCHEMA = pa.schema([("event", pa.int64()), ("sub_id", pa.int64())])

    def __init__(self, out: str | None, id_field: str | None = None, inputs: dict[str, str] | None = None):
        self.out = out
        self.id_field = id_field              # the events' own ids name them instead of their numbers
        self.parquet = out is not None and out.endswith(".parquet")
        self.writer = None
        self.file = None                      # a special file's binary stream, which Parquet is written to
        self.untyped: list[pa.Table] = []     # Parquet with --id-field: the first batches', all their ids null
        if out is None:
            self.tmp, self.stream = None, sys.stdout
            return
        if os.path.isdir(out):
            raise BexmatchError(f"{out}: is a directory; --out takes a file name")
        try:
            self.target, direct = _out_target(out)
        except OSError as exc:
            raise BexmatchError(f"{out}: cannot be written ({exc.strerror or exc})") from None
        _refuse_an_input_as_out(out, self.target, inputs or {})   # before anything is opened or truncated
        try:
            if direct:
                self.tmp = None
                self.file = _open_directly(self.target)
                if self.parquet and id_field is None:
                    self.writer = pq.ParquetWriter(self.file, self.SCHEMA)
                elif not self.parquet:
                    self.stream = io.TextIOWrapper(self.file, encoding="utf-8")
                return
            self.tmp = os.path.join(os.path.dirname(self.target),
                                    f".{os.path.basename(self.target)}.{secrets.token_hex(6)}.tmp")
            if self.parquet and id_field is None:
                self.writer = pq.ParquetWriter(self.tmp, self.SCHEMA)
            elif self.parquet:
                open(self.tmp, "x").close()          # the ids' type is known at the first batch
            else:
                self.stream = open(self.tmp, "x", encoding="utf-8")
        except (OSError, pa.ArrowException) as exc:
            if self.file is not None:
                self.file.close()
            raise BexmatchError(f"{out}: cannot be written ({getattr(exc, 'strerror', None) or exc})") from None

    def write(self, table: pa.Table) -> None:
        if self.parquet:
            if self.writer is None:
                if self.id_field is not None and pa.types.is_null(table.schema.field(self.id_field).type):
                    self.untyped.append(table)    # (a batch of null ids only: the ids' type is not known yet)
                    return
                self._open(table.schema)
            if self.id_field is not None and table.schema != self.writer.schema:
                ids, earlier = table.schema.field(self.id_field).type, self.writer.schema.field(self.id_field).type
                if not pa.types.is_null(ids):       # (a batch of null ids only is of type null: it fits)
                    raise BexmatchError(f"--id-field {self.id_field!r}: the ids of one batch are {ids}, an "
                                        f"earlier batch's {earlier}: a Parquet column holds one type")
                table = table.cast(self.writer.schema)
            self.writer.write_table(table if self.id_field is not None else table.cast(self.SCHEMA))
        elif self.id_field is None:
            for event, sub_id in zip(table["event"].to_pylist(), table["sub_id"].to_pylist()):
                self.stream.write(f'{{"event": {event}, "sub_id": {sub_id}}}\n')
        else:
            name = json.dumps(self.id_field)
            for event, sub_id in zip(table[self.id_field].to_pylist(), table["sub_id"].to_pylist()):
                # (dates, decimals and bytes have no JSON form: written as their text)
                self.stream.write(f'{{{name}: {json.dumps(event, default=str)}, "sub_id": {sub_id}}}\n')

    def commit(self) -> None:
        if self.out is None:
            self.stream.flush()
            return
        self._close()
        if self.tmp is not None:
            replace_keeping_mode(self.tmp, self.target)   # the link's target, not the link (see _out_target)

    def discard(self) -> None:
        if self.out is None:
            return
        if self.tmp is None:                      # written into directly: closed, what was written stays
            with contextlib.suppress(Exception):
                self._close()
            return
        with contextlib.suppress(Exception):     # the run's own error is the one to report
            self._close()
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.tmp)

    def _open(self, schema: pa.Schema) -> None:
        """The Parquet writer, once the ids' type is known: the batches held
        back for want of it (null ids only) written first, in its type."""
        self.writer = pq.ParquetWriter(self.file if self.tmp is None else self.tmp, schema)
        for untyped in self.untyped:
            self.writer.write_table(untyped.cast(schema))
        self.untyped = []

    def _close(self) -> None:
        if self.parquet:
            if self.writer is None:          # --id-field and no batch, or null ids only: int64 said
                self._open(pa.schema([(self.id_field, pa.int64()), ("sub_id", pa.int64())]))
            self.writer.close()
            if self.file is not None:             # (ParquetWriter leaves a stream it was given open)
                self.file.close()
        else:
            self.stream.close()


def command_match(args) -> int:
    if args.batch_size < 1:
        raise BexmatchError(f"--batch-size must be at least 1, not {args.batch_size}")
    # first: a bad --out fails before any work
    writer = MatchWriter(args.out, args.id_field, inputs={"--subs": args.subs, "--events": args.events})
    seen = matched = 0
    bar = None
    try:
        index = open_subscriptions(args.subs, args.algorithm, args.backend, progress=not args.quiet)
        index.merge()
        bar = tqdm(total=_count_events(args.events), desc="match", unit="event", disable=args.quiet or None)
        for batch, lines in event_batches(args.events, args.batch_size):
            n = batch.num_rows if isinstance(batch, pa.Table) else len(batch)
            try:
                result = index.match_batch(batch, output="arrow", errors=args.errors, id_column=args.id_field)
            except KeyError as exc:                  # an event without its --id-field
                raise _event_without_id(args.events, lines, seen, n, args.id_field, exc) from None
            except (ValueError, TypeError) as exc:   # the engine's refusals of bad events (BexmatchError too)
                raise _refused_event(args.events, lines, seen, n, exc) from None
            if args.id_field is None:
                result = result.set_column(0, "event", pa.compute.add(result["event"], seen))
            writer.write(result)
            seen += n
            matched += result.num_rows
            bar.update(n)
        writer.commit()
    except BaseException:
        writer.discard()
        raise
    finally:
        if bar is not None:
            bar.close()
    if not args.quiet:
        print(f"{len(index)} subscriptions, {seen} events, {matched} matches", file=sys.stderr)
    return 0


def command_explain(args) -> int:
    """Print why subscription ``--id`` matches ``--event`` or not."""
    try:
        event = json.loads(args.event)
    except json.JSONDecodeError as exc:
        raise BexmatchError(f"--event is not JSON: {exc}") from None
    if not isinstance(event, dict):
        raise BexmatchError(f"--event must be a JSON object (one event), not {type(event).__name__}")
    index = open_subscriptions(args.subs, progress=False)
    if args.id not in index:
        raise BexmatchError(f"--id {args.id}: no such subscription in {args.subs}")
    try:
        explanation = index.explain(args.id, event)
    except BadEventError as exc:        # its hint names errors= modes, which explain has not: one event, judged
        raise BexmatchError(f"--event: {exc.reason}") from None
    if args.json:
        print(json.dumps({"id": args.id, "matches": explanation.matches, "explanation": explanation.to_dict()}))
    else:
        print(f"subscription {args.id} {'matches' if explanation.matches else 'does not match'}:")
        print(explanation)
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="bexmatch", description="Match events against Boolean-expression "
                                     "subscriptions on CPU cores, GPUs and Spark.")
    parser.add_argument("--version", action="version", version=f"bexmatch {__version__}")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    match = commands.add_parser("match", help="match a file of events against a file of subscriptions",
                                description="Match events against subscriptions and write (event, sub_id) "
                                "pairs; event numbers count from 0 in input order.")
    match.add_argument("--subs", required=True, help="id<TAB>expression text ('#' lines are comments), Parquet in "
                       "the columnar form, or a saved index (Index.save)")
    match.add_argument("--events", required=True, help="JSON Lines or Parquet, one event per line/row")
    match.add_argument("--out", help="output file: .parquet for Parquet, anything else for JSON Lines "
                       "(default: JSON Lines on stdout); not an input; a symlink is written through, a FIFO or "
                       "device directly")
    match.add_argument("--algorithm", choices=registry.names(), help="matching algorithm (default: best available)")
    match.add_argument("--backend", choices=("cpu", "cuda"), help="backend (default: best available)")
    match.add_argument("--batch-size", type=int, default=EVENT_BATCH, help="events per batch (default %(default)s)")
    match.add_argument("--errors", choices=("raise", "null"), default="raise",
                       help="an event value of the wrong type: fail (raise) or treat it as absent (null)")
    match.add_argument("--id-field", metavar="NAME",
                       help="the events' own id (a JSON key or Parquet column, not an attribute): the output "
                            "names each match's event by it instead of its number")
    match.add_argument("--quiet", action="store_true", help="no progress bar or summary")
    match.set_defaults(handler=command_match)

    explain = commands.add_parser("explain", help="why one subscription matches one event, or not",
                                  description="Print subscription --id of --subs as the index holds it, each "
                                  "predicate and connective with its value on --event (TRUE, FALSE, or NULL "
                                  "with the absent attribute).")
    explain.add_argument("--subs", required=True, help="id<TAB>expression text ('#' lines are comments), Parquet "
                         "in the columnar form, or a saved index (Index.save)")
    explain.add_argument("--id", required=True, type=int, help="the subscription id")
    explain.add_argument("--event", required=True, help="the event as a JSON object, e.g. '{\"price\": 550}'")
    explain.add_argument("--json", action="store_true", help="print the explanation as JSON instead of a tree")
    explain.set_defaults(handler=command_explain)

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
    from engine.bench.cli import main as bench_main
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
    except (BexmatchError, KeyError) as exc:    # KeyError: duplicate or unknown subscription ids
        print(f"bexmatch: error: {_message(exc)}", file=sys.stderr)
        return 2
    except OSError as exc:                       # a missing or unreadable input, a directory
        print(f"bexmatch: error: {exc.filename}: {exc.strerror}" if exc.filename else f"bexmatch: error: {exc}",
              file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
