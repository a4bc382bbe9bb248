"""The bexmatch Spark job (``bexmatch run``; ``python -m spark_integration.job``).

With no arguments: generate (or reuse the copy cached under
``./bexmatch-data/``) the standard workload W1 at scale 0.01 -- 10,000
subscriptions and 10,000 events --, start a local Spark (``local[*]``),
match the events, write the matches to ``./bexmatch-out/matches.parquet``
and print a summary (subscriptions, events, matches, events/s, seconds per
stage).

Arguments (all optional)::

    --subs PATH       subscriptions: Parquet in the columnar form of
                      engine.columnar, an index saved with Index.save, or
                      `bexmatch match`'s text (one id<TAB>expression a line)
    --events PATH     events: Parquet, or JSON Lines in a file named *.json,
                      *.jsonl or *.ndjson; one row per event, one column per
                      attribute (or a map column "attrs"); an "event_id"
                      column is used when present, else one is made up
    --out PATH        where the matches go (Parquet directory)
    --master URL      local[*] (default), local[N], spark://host:7077, yarn, ...
    --mode            replicate (default) or shard;  --shards K
    --workload NAME   standard workload to generate (default W1)
    --scale X         its scale (default 0.01);  --n-events N;  --seed S

``main`` sets PYSPARK_PYTHON / PYSPARK_DRIVER_PYTHON to this interpreter and
finds a Java 17 (or 21) for JAVA_HOME when it is unset, so that it runs on a
fresh machine with only ``pip install 'bexmatch[spark]'`` and a JDK.  On a
cluster, bexmatch must be installed in the executors' Python (see
spark_integration/README.md).
"""

from __future__ import annotations

import argparse
import contextlib
import glob
import json
import math
import os
import re
import shutil
import subprocess
import sys
import time

DEFAULT_WORKLOAD = "W1"
DEFAULT_SCALE = 0.01
DATA_DIR = "bexmatch-data"
OUT_PATH = os.path.join("bexmatch-out", "matches.parquet")
SUPPORTED_JAVA = (17, 21)      # Spark 4 runs on Java 17 and 21
#: Spark reads --partitions and --arrow-batch-size as Java ints
JAVA_INT_MAX = 2 ** 31 - 1


class JobError(Exception):
    """A problem with the job's input or environment, reported without a
    traceback."""


# ------------------------------------------------------------------ environment

def _java_major(home: str) -> int | None:
    """The major version of the JDK/JRE at ``home`` (from its ``release``
    file, else from ``java -version``)."""
    release = os.path.join(home, "release")
    try:
        with open(release, encoding="utf-8", errors="replace") as f:
            found = re.search(r'^JAVA_VERSION="(\d+)(?:\.(\d+))?', f.read(), re.M)
        if found:
            major = int(found.group(1))
            return int(found.group(2)) if major == 1 and found.group(2) else major
    except OSError:
        pass
    java = os.path.join(home, "bin", "java")
    if not os.access(java, os.X_OK):
        return None
    try:
        text = subprocess.run([java, "-version"], capture_output=True, text=True, timeout=30).stderr
    except (OSError, subprocess.SubprocessError):
        return None
    found = re.search(r'version "(\d+)(?:\.(\d+))?', text)
    if not found:
        return None
    major = int(found.group(1))
    return int(found.group(2)) if major == 1 and found.group(2) else major


def find_java_home(environ=None) -> str | None:
    """A JAVA_HOME Spark can use: the one set, else the JDK behind ``java``
    on PATH when it is Java 17/21, else the first Java 17 (then 21) among
    the usual install locations.  None when there is none."""
    environ = os.environ if environ is None else environ
    if environ.get("JAVA_HOME"):
        return environ["JAVA_HOME"]
    candidates = []
    java = shutil.which("java", path=environ.get("PATH"))
    if java:
        candidates.append(os.path.dirname(os.path.dirname(os.path.realpath(java))))
    for pattern in ("/usr/lib/jvm/*", "/usr/java/*", "/opt/java/*", "/opt/jdk*",
                    "/Library/Java/JavaVirtualMachines/*/Contents/Home",
                    os.path.expanduser("~/.sdkman/candidates/java/*")):
        candidates.extend(sorted(glob.glob(pattern)))
    seen, majors = set(), {}
    for home in candidates:
        real = os.path.realpath(home)
        if real in seen or not os.path.isfile(os.path.join(real, "bin", "java")):
            continue
        seen.add(real)
        majors.setdefault(_java_major(real), home)
    for wanted in SUPPORTED_JAVA:
        if wanted in majors:
            return majors[wanted]
    return None


def prepare_environment(master: str) -> None:
    """Python and Java for Spark, before the JVM starts (``master`` is the
    Spark master URL it will get)."""
    local = master.startswith("local")
    if local:
        # local executors run on this machine: they must run this interpreter
        os.environ["PYSPARK_PYTHON"] = sys.executable
        os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
        # and import bexmatch from where this process does
        root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
        paths = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
        if root not in paths:
            os.environ["PYTHONPATH"] = os.pathsep.join([root] + paths)
        # a local Spark talks only to itself: keep driver and executors on
        # loopback instead of the address the host name resolves to
        os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    else:
        os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
        os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    if not os.environ.get("JAVA_HOME"):
        home = find_java_home()
        if home is None:
            raise JobError("Spark needs Java 17 (or 21) and none was found: install one (e.g. apt-get install "
                           "openjdk-17-jre-headless) or set JAVA_HOME")
        os.environ["JAVA_HOME"] = home


# ------------------------------------------------------------------ inputs

def _fmt_scale(scale: float) -> str:
    return f"{scale:g}".replace(".", "p")


def generate_workload(name: str, scale: float, n_events: int, seed: int, data_dir: str):
    """(subscriptions Table, events parquet path, seconds, cached?, number
    of events) for a standard workload, cached under ``data_dir``; the
    events get an ``event_id`` column (their row number)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        from engine import workloads
    except ImportError as exc:
        raise JobError(f"engine.workloads is not available ({exc}); pass --subs and --events") from exc
    directory = os.path.join(data_dir, f"{name}-scale{_fmt_scale(scale)}-events{n_events}-seed{seed}")
    start = time.perf_counter()
    events_path = os.path.join(directory, "events.parquet")
    try:
        workload = workloads.read_parquet(directory)
        cached = "event_id" in workload.events.column_names
    except (OSError, ValueError, KeyError):
        cached = False
    if not cached:
        workload = workloads.standard(name, scale=scale, n_events=n_events, seed=seed)
        events = workload.events
        if "event_id" not in events.column_names:
            events = events.add_column(0, "event_id", pa.array(range(events.num_rows), pa.int64()))
        workload.events = events
        tmp = directory + f".tmp-{os.getpid()}"
        shutil.rmtree(tmp, ignore_errors=True)
        workloads.write_parquet(workload, tmp)
        shutil.rmtree(directory, ignore_errors=True)
        os.makedirs(os.path.dirname(os.path.abspath(directory)), exist_ok=True)
        os.replace(tmp, directory)
    if not os.path.exists(events_path):    # the workload module names its files
        events_path = next(iter(sorted(glob.glob(os.path.join(directory, "*event*")))), events_path)
    n_events_found = pq.ParquetFile(events_path).metadata.num_rows if os.path.isfile(events_path) else None
    return workload.subscriptions, events_path, time.perf_counter() - start, cached, n_events_found


def build_index(subs, algorithm: str | None):
    """An engine.Index from a columnar table, or a saved index's path
    (validated here, on the driver)."""
    from engine import Index
    from engine.index_file import is_index_file

    if isinstance(subs, str):
        if not os.path.exists(subs):
            raise JobError(f"--subs {subs!r} does not exist")
        if is_index_file(subs):
            from spark_integration.shipping import load_validated
            index, _ = load_validated(subs)
            return index
        # Parquet in the columnar form, or `bexmatch match`'s text: one id<TAB>expression per line
        from engine.cli import load_subscriptions
        from engine.errors import BexmatchError
        index = Index(algorithm=algorithm) if algorithm else Index()
        try:
            load_subscriptions(index, subs, progress=False)
        except (BexmatchError, KeyError, ValueError) as exc:
            raise JobError(f"--subs {subs!r}: {exc.args[0] if isinstance(exc, KeyError) else exc} (--subs takes "
                           f"a saved bexmatch index, a Parquet table in the columnar form, or id<TAB>expression "
                           f"lines)") from exc
        return index
    index = Index(algorithm=algorithm) if algorithm else Index()
    index.add_many(subs)
    return index


#: event files read as JSON Lines (one object per line) rather than Parquet
JSON_SUFFIXES = (".json", ".jsonl", ".ndjson")


def read_events(spark, path: str):
    """The events DataFrame: JSON Lines when ``path`` ends in one of
    :data:`JSON_SUFFIXES` (Spark infers the columns over the whole file),
    else Parquet."""
    if _is_json(path):
        events = spark.read.json(path)
        if _CORRUPT_RECORD in events.columns:       # (PERMISSIVE reading: a line that is no JSON object)
            raise JobError(f"--events {path!r}: holds lines that are not JSON objects (Spark's reader would "
                           f"make each an event with no attributes); `bexmatch match --events {path}` names "
                           f"the first one")
        _refuse_values_spark_would_change(spark, path, events)
        return events
    try:
        return spark.read.parquet(path)
    except Exception as exc:          # Spark's AnalysisException and the like: not Parquet
        raise JobError(f"--events {path!r}: not readable as Parquet ({str(exc).splitlines()[0]}); JSON Lines "
                       f"events need a name ending in {', '.join(JSON_SUFFIXES)}") from exc


def _is_json(path: str) -> bool:
    return path.lower().rstrip("/").endswith(JSON_SUFFIXES)


#: the column Spark's JSON reader adds for lines it cannot read (spark.sql.columnNameOfCorruptRecord)
_CORRUPT_RECORD = "_corrupt_record"


#: a JSON escape of a lone surrogate, as a Java regex: a high one not followed by a low one's escape, or a
#: low one not preceded by a high one's (a candidate only: the backslash may itself be escaped)
_LONE_SURROGATE_ESCAPE = (r"\\u[dD][89abAB][0-9a-fA-F]{2}(?!\\u[dD][c-fC-F][0-9a-fA-F]{2})"
                          r"|(?<!\\u[dD][89abAB][0-9a-fA-F]{2})\\u[dD][c-fC-F][0-9a-fA-F]{2}")
#: a JSON integer of 16 digits or more (2**53 has 16), as a Java regex (a candidate only: it may be in a string)
_LONG_INTEGER = r"[0-9]{16,}(?![0-9.eE])"


def _refuse_values_spark_would_change(spark, path: str, events) -> None:
    """Two JSON values that Spark's reader changes without a word, which
    ``bexmatch match`` (Python's JSON, value by value) refuses:

    * a lone surrogate escaped in a string (``"\\ud800"``), not Unicode,
      which Spark's reader makes ``'?'`` -- and the engine would match as that;
    * an integer beyond ±2**53 where Spark reads floating point (its column
      holds a fraction somewhere): ``9007199254740993`` becomes
      ``9007199254740992.0``, and would match ``x = 9007199254740992``.  (In
      an integer column it stays exact, and the engine refuses it event by
      event, as ``--on-bad-event`` says.)

    The lines holding a candidate (a regex over the text) are read by
    Python's JSON on the executors, to be sure; the first is named."""
    from pyspark.sql import functions as F

    changing, floating = _value_spark_would_change, _floating(events.schema)
    candidates = spark.read.text(path).filter(F.col("value").rlike(_LONE_SURROGATE_ESCAPE)
                                              | F.col("value").rlike(_LONG_INTEGER))
    found = candidates.rdd.map(lambda row: (row["value"], changing(row["value"], floating))) \
        .filter(lambda pair: pair[1] is not None).take(1)
    if not found:
        return
    line, (what, value) = found[0]
    if what == "surrogate":
        raise JobError(f"--events {path!r}: the string {value[:80]!r} in the line {line[:200]!r} is not valid "
                       f"Unicode (a lone surrogate), which Spark's JSON reader would make '?'; `bexmatch match "
                       f"--events {path}` names the line")
    raise JobError(f"--events {path!r}: the integer {value} in the line {line[:200]!r} is beyond ±2**53, and "
                   f"Spark's JSON reader would round it to {float(value):.17g} (it reads the column as floating "
                   f"point: a fraction is in it elsewhere); `bexmatch match --events {path}` names the line")


def _floating(data_type):
    """Where a Spark type reads JSON numbers as floating point, as plain
    data for the executors: True for a float or double, a dict of the
    fields' (a struct; ``None`` the key for a map's values), a one-item
    list for an array's elements, False for anything else."""
    from pyspark.sql.types import ArrayType, DoubleType, FloatType, MapType, StructType

    if isinstance(data_type, (DoubleType, FloatType)):
        return True
    if isinstance(data_type, StructType):
        return {field.name: _floating(field.dataType) for field in data_type.fields}
    if isinstance(data_type, MapType):
        return {None: _floating(data_type.valueType)}
    if isinstance(data_type, ArrayType):
        return [_floating(data_type.elementType)]
    return False


def _value_spark_would_change(line: str, floating):
    """``("surrogate", the string)`` or ``("integer", the int)``: the first
    value of a JSON Lines ``line`` that Spark's reader would change
    (:func:`_refuse_values_spark_would_change`), ``floating`` saying where
    it reads floating point (:func:`_floating` of its schema); else None."""
    from engine.expr import lone_surrogate
    from engine.schema import MAX_EXACT_INT

    try:
        event = json.loads(line)
    except (ValueError, RecursionError):
        return None         # (not one JSON value: not an event line Spark read either)

    def first(value, where):
        if isinstance(value, str):
            return ("surrogate", value) if lone_surrogate(value) is not None else None
        if type(value) is int:
            return ("integer", value) if where is True and abs(value) > MAX_EXACT_INT else None
        if isinstance(value, dict):
            fields = where if isinstance(where, dict) else {}
            items = ((key, item, fields.get(key, fields.get(None, False))) for key, item in value.items())
        elif isinstance(value, list):
            inner = where[0] if isinstance(where, list) else False
            items = ((None, item, inner) for item in value)
        else:
            return None
        for key, item, inner in items:
            found = (first(key, False) if key is not None else None) or first(item, inner)
            if found is not None:
                return found
        return None

    return first(event, floating)


def _string_columns_of_other_families(events, index) -> list[str]:
    """The columns Spark's JSON reader made strings whose attributes are
    numeric or boolean: it gives a column one type for the whole file, so a
    file mixing numbers and strings in one column reads every value of it
    as a string, and each is refused as a string."""
    from pyspark.sql.types import StringType
    families = dict(index.schema)
    return [f.name for f in events.schema.fields
            if isinstance(f.dataType, StringType) and families.get(f.name) in ("numeric", "boolean")]


def _has_scheme(path: str) -> bool:
    return bool(re.match(r"^[a-zA-Z][a-zA-Z0-9+.-]*://", path))


# ------------------------------------------------------------------ the job

def parse_args(argv=None) -> argparse.Namespace:
    p = build_parser()
    args = p.parse_args(argv)
    return _checked_args(p, args)


def build_parser() -> argparse.ArgumentParser:
    """The options of ``bexmatch run``."""
    p = argparse.ArgumentParser(prog="bexmatch run", description="Match events against subscriptions on Spark.")
    p.add_argument("--subs", help="subscriptions: a saved index, columnar Parquet, or id<TAB>expression lines "
                                  "(as bexmatch match takes)")
    p.add_argument("--events", help="events: Parquet (one row per event), or JSON Lines (one object per line) "
                                    "in a file named *.json, *.jsonl or *.ndjson")
    p.add_argument("--out", default=OUT_PATH, help=f"output Parquet directory (default {OUT_PATH})")
    p.add_argument("--master", default=None,
                   help="Spark master (default local[*]; under spark-submit, the one spark-submit was given)")
    p.add_argument("--mode", choices=("replicate", "shard"), default="replicate",
                   help="replicate: every executor holds the whole index; shard: the subscriptions split into "
                        "--shards shards, every event matched against each (default %(default)s)")
    p.add_argument("--shards", type=int, default=None, help="shards in --mode shard (default: the parallelism)")
    p.add_argument("--workload", default=DEFAULT_WORKLOAD, help="standard workload to generate (default W1)")
    p.add_argument("--scale", type=positive_float, default=DEFAULT_SCALE, help="its scale (default 0.01)")
    p.add_argument("--n-events", type=int_in(1), default=None,
                   help="events to generate (default 1,000,000 x scale)")
    p.add_argument("--seed", type=int_in(0), default=0, help="seed of the generated workload (default 0)")
    p.add_argument("--data-dir", default=DATA_DIR, help=f"workload cache (default ./{DATA_DIR})")
    p.add_argument("--event-id", default="event_id", help="event id column (default event_id)")
    p.add_argument("--output", choices=("pairs", "grouped"), default="pairs",
                   help="pairs: one (event_id, sub_id) row per match; grouped: one row per event with an array "
                        "of ids (default %(default)s)")
    p.add_argument("--partitions", type=int_in(1, JAVA_INT_MAX), default=None,
                   help="event partitions (default: at least the parallelism)")
    p.add_argument("--arrow-batch-size", type=int_in(1, JAVA_INT_MAX), default=None, help="rows per Arrow batch")
    p.add_argument("--ship", choices=("broadcast", "files"), default=None, help="how the index is shipped")
    p.add_argument("--algorithm", default=None, help="matching algorithm (default: the engine's best)")
    p.add_argument("--backend", choices=("auto", "cpu", "cuda"), default="auto",
                   help="auto: cuda in tasks that hold a GPU, cpu elsewhere (default %(default)s)")
    p.add_argument("--gpu-fallback", action="store_true", help="match on CPU when a GPU task cannot use cuda")
    p.add_argument("--on-bad-event", choices=("fail", "quarantine"), default="fail",
                   help="an event the engine refuses: fail the job naming its id, or set it aside in --quarantine "
                        "(default %(default)s)")
    p.add_argument("--quarantine", default=None,
                   help="where quarantined events go (default: quarantine.parquet next to --out)")
    p.add_argument("--conf", action="append", default=[], metavar="KEY=VALUE", help="extra Spark configuration")
    p.add_argument("--quiet", action="store_true",
                   help="no progress lines on stderr as stages start and end (the summary is still printed)")
    p.add_argument("--inject-failure", action="store_true", help=argparse.SUPPRESS)
    return p


def int_in(least: int, most: int | None = None):
    """An argparse type: an integer from ``least`` to ``most`` (argparse's
    error names the flag; exit status 2 before Spark starts, where a
    negative --seed or --partitions was a traceback from NumPy or Spark)."""
    def parse(text):
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
        if value < least or (most is not None and value > most):
            raise argparse.ArgumentTypeError(f"must be {f'>= {least}' if most is None else f'{least} to {most}'}, "
                                             f"not {text}")
        return value
    return parse


def positive_float(text: str) -> float:
    """An argparse type: a finite number above 0 (NaN passed ``<= 0``)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not (math.isfinite(value) and value > 0):
        raise argparse.ArgumentTypeError(f"must be a positive number, not {text}")
    return value


def _checked_args(p: argparse.ArgumentParser, args: argparse.Namespace) -> argparse.Namespace:
    if args.master is None and not under_spark_submit():
        args.master = "local[*]"
    if (args.subs is None) != (args.events is None):
        p.error("--subs and --events go together (without both, a workload is generated)")
    if args.shards is not None and args.shards < 1:
        p.error("--shards must be >= 1")
    if args.subs is None:               # (a workload is generated: its name is checked before it is)
        try:
            from engine.workloads import canonical_name
        except ImportError:
            pass                        # generate_workload says so, naming --subs and --events
        else:
            try:
                canonical_name(args.workload)
            except ValueError as exc:
                p.error(f"--workload: {exc}")
    for item in args.conf:              # (_start_spark reads them after the index is built)
        if "=" not in item:
            p.error(f"--conf {item!r}: expected KEY=VALUE")
    clash = _output_clash(args)
    if clash:
        p.error(clash)
    return args


def _quarantine_path(args: argparse.Namespace) -> str:
    return args.quarantine or os.path.join(os.path.dirname(os.path.abspath(args.out)), "quarantine.parquet")


def _output_clash(args: argparse.Namespace) -> str | None:
    """Why an output would destroy an input, or None.  Spark's overwrite
    deletes the path it writes (all of a directory): an --out (or
    quarantine) that is an input or holds one would lose it -- after the
    index was built from it, so the run itself might succeed -- and one
    inside an input directory would become part of that input.  Paths with
    a scheme (hdfs://...) are not checked."""
    inputs = [("--subs", args.subs), ("--events", args.events)]
    outputs = [("--out", args.out)]
    if args.on_bad_event == "quarantine":
        outputs.append(("--quarantine" if args.quarantine else "the quarantine (next to --out)",
                        _quarantine_path(args)))
    for k, (flag, path) in enumerate(outputs):
        # (against the earlier output too: the quarantine would overwrite the matches, or be written into them)
        for other_flag, other_path in inputs + outputs[:k]:
            if other_path is None or _has_scheme(path) or _has_scheme(other_path):
                continue
            mine, other = os.path.realpath(path), os.path.realpath(other_path)
            if mine == other or (os.path.exists(mine) and os.path.exists(other) and os.path.samefile(mine, other)):
                return f"{flag} {path}: is {other_flag} {other_path}; writing it would delete it"
            if os.path.commonpath([mine, other]) == mine:
                return f"{flag} {path}: holds {other_flag} {other_path}; writing it would delete it"
            if os.path.commonpath([mine, other]) == other:
                return f"{flag} {path}: is inside {other_flag} {other_path}; it would be written into it"
    for flag, path in outputs:
        foreign = None if _has_scheme(path) else _not_spark_output(path)
        if foreign:
            return (f"{flag} {path}: exists and is not a Spark output ({foreign}); writing it would delete it -- "
                    f"remove it or name another path")
    if args.subs is None:       # the generated workload is read from its cache, which an output must not delete
        data_dir = os.path.realpath(args.data_dir)
        for flag, path in outputs:
            if not _has_scheme(path) and os.path.commonpath([os.path.realpath(path), data_dir]) == \
                    os.path.realpath(path):
                return f"{flag} {path}: holds --data-dir {args.data_dir}; writing it would delete the workload"
    return None


#: the names Spark's Parquet writer (and its committers) put in an output directory: overwriting one that
#: holds only these replaces an earlier run's output
_SPARK_OUTPUT_NAMES = ("part-", ".part-", "_SUCCESS", "._SUCCESS", "_temporary", "_committed_", "_started_",
                       ".metadata", "_metadata", "._metadata", "_common_metadata", "._common_metadata")


def _not_spark_output(path: str) -> str | None:
    """What makes an existing ``path`` something other than a Spark output
    directory (which Spark's overwrite may replace), or None: a file, or a
    directory holding another name (``--out ~`` deleted the home
    directory).  An empty directory, or no such path, is fine."""
    if not os.path.lexists(path):
        return None
    if not os.path.isdir(path):
        return "a file"
    for name in sorted(os.listdir(path)):
        if not name.startswith(_SPARK_OUTPUT_NAMES):
            return f"it holds {name!r}"
    return None


def under_spark_submit() -> bool:
    """True when spark-submit started this process (its JVM is already up
    and knows the master)."""
    return "PYSPARK_GATEWAY_PORT" in os.environ


def _start_spark(args):
    from pyspark.sql import SparkSession

    active = SparkSession.getActiveSession()
    if active is not None:
        return active, False
    builder = SparkSession.builder.master(args.master) if args.master else SparkSession.builder
    builder = (builder.appName("bexmatch")
               .config("spark.sql.execution.arrow.pyspark.enabled", "true")
               # Spark's own stage progress bar where a person watches (a terminal), between our stage lines
               .config("spark.ui.showConsoleProgress",
                       "true" if sys.stderr.isatty() and not getattr(args, "quiet", False) else "false"))
    for item in args.conf:
        key, sep, value = item.partition("=")
        if not sep:
            raise JobError(f"--conf {item!r}: expected KEY=VALUE")
        builder = builder.config(key.strip(), value.strip())
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    return spark, True


class _Warmup:
    """Loads the shipped index in the workers (the "ship" stage)."""

    def __init__(self, shipped, backend, gpu_fallback, stats_acc):
        self.shipped, self.backend, self.gpu_fallback, self.stats_acc = shipped, backend, gpu_fallback, stats_acc

    def __call__(self, batches):
        import pyarrow as pa

        from spark_integration.shipping import worker_index

        worker_index(self.shipped, backend=self.backend, gpu_fallback=self.gpu_fallback, capacity=2,
                     stats=self.stats_acc)
        for batch in batches:
            yield pa.RecordBatch.from_pydict({"n": pa.array([batch.num_rows], pa.int64())})


@contextlib.contextmanager
def _stage(args, what: str):
    """One line on stderr as a stage starts and one as it ends (``--quiet``:
    none), so that a long run is never silent until its summary."""
    quiet = getattr(args, "quiet", False)
    if not quiet:
        print(f"bexmatch run: {what} ...", file=sys.stderr, flush=True)
    started = time.perf_counter()
    yield
    if not quiet:
        print(f"bexmatch run: {what}: done in {time.perf_counter() - started:.1f} s", file=sys.stderr, flush=True)


def run(args: argparse.Namespace) -> dict:
    """Run the job; returns the summary (also printed)."""
    import pyarrow.parquet as pq

    summary = {"stages": {}}
    stages = summary["stages"]

    # 1. inputs (validated before Spark starts: a bad index fails before any output)
    if args.subs is None:
        n_events = args.n_events if args.n_events is not None else max(100, round(1_000_000 * args.scale))
        with _stage(args, f"workload {args.workload} at scale {args.scale:g} ({n_events:,} events, "
                          f"generated or reused from {args.data_dir})"):
            subs, events_path, seconds, cached, n_found = generate_workload(args.workload, args.scale, n_events,
                                                                             args.seed, args.data_dir)
        stages["generate"] = seconds
        summary["workload"] = f"{args.workload} scale {args.scale:g}" + (" (cached)" if cached else "")
        summary["events_expected"] = n_found
    else:
        subs, events_path = args.subs, args.events
        stages["generate"] = 0.0
        summary["workload"] = f"{args.subs} x {args.events}"
        if not _has_scheme(events_path) and not os.path.exists(events_path):
            raise JobError(f"--events {events_path!r} does not exist")
    start = time.perf_counter()
    with _stage(args, "building the index"):
        index = build_index(subs, args.algorithm)
    stages["build index"] = time.perf_counter() - start
    summary["subscriptions"] = len(index)

    # 2. Spark
    if args.master:
        prepare_environment(args.master)
    start = time.perf_counter()
    with _stage(args, f"starting Spark ({args.master or 'the spark-submit master'})"):
        spark, owned = _start_spark(args)
    stages["start spark"] = time.perf_counter() - start
    try:
        return _run_spark(spark, args, index, events_path, summary, pq)
    finally:
        if owned:
            spark.stop()


def _run_spark(spark, args, index, events_path, summary, pq):
    from pyspark.sql import functions as F

    from spark_integration.matching import MatchResult, match_events
    from spark_integration.shipping import DEFAULT_SHIP, MatchStats, ship_index

    stages = summary["stages"]
    sc = spark.sparkContext
    parallelism = sc.defaultParallelism
    shards = args.shards or (max(2, parallelism) if args.mode == "shard" else None)
    ship = args.ship or DEFAULT_SHIP
    stats = MatchStats(spark)

    # 3. ship: serialise, broadcast / addFile, and load on the workers
    start = time.perf_counter()
    with _stage(args, f"shipping the index ({len(index):,} subscriptions, {ship}) and loading it on the workers"):
        shipped = ship_index(spark, index, mode=args.mode, shards=shards, method=ship)
        if args.mode == "replicate":
            warm = _Warmup(shipped, args.backend, args.gpu_fallback, stats.accumulator)
            spark.range(0, parallelism, 1, parallelism).mapInArrow(warm, "n long").collect()
            summary["index_bytes"] = shipped.nbytes
        else:
            summary["index_bytes"] = sum(s.nbytes for s in shipped.shards)
    stages["ship"] = time.perf_counter() - start

    # 4. match + write
    start = time.perf_counter()
    events = read_events(spark, events_path)
    mixed = _string_columns_of_other_families(events, index) if _is_json(events_path) else []
    if mixed:
        print(f"bexmatch run: warning: --events {events_path!r}: Spark's JSON reader made column(s) "
              f"{', '.join(map(repr, mixed))} strings (one type a column for the whole file: a column mixing "
              f"numbers or booleans and strings reads as strings), and their attributes are numeric or "
              f"boolean: such events are refused as holding strings. Give mixed-type events as Parquet, or "
              f"to `bexmatch match`, which reads JSON Lines value by value.", file=sys.stderr)
    if args.event_id not in events.columns:
        events = events.withColumn(args.event_id, F.monotonically_increasing_id())
        summary["note"] = f"the events have no {args.event_id!r} column: ids were made up " \
                          f"(monotonically_increasing_id)"
    partitions = args.partitions or (parallelism if events.rdd.getNumPartitions() < parallelism else None)
    if partitions:
        events = events.repartition(partitions)
    result = match_events(events, shipped, event_id=args.event_id, mode=args.mode, shards=shards,
                          arrow_batch_size=args.arrow_batch_size, output=args.output,
                          on_bad_event=args.on_bad_event, ship=ship, backend=args.backend,
                          gpu_fallback=args.gpu_fallback, stats=stats, inject_failure=args.inject_failure)
    with _stage(args, f"matching the events and writing {args.out}"):
        if isinstance(result, MatchResult):
            combined = result.combined.persist()
            try:
                result.matches.write.mode("overwrite").parquet(args.out)
                quarantine = _quarantine_path(args)
                result.quarantine.write.mode("overwrite").parquet(quarantine)
            finally:
                combined.unpersist()
            summary["quarantine"] = quarantine
            summary["quarantined"] = spark.read.parquet(quarantine).count()
        else:
            result.write.mode("overwrite").parquet(args.out)
    stages["match+write"] = time.perf_counter() - start

    written = spark.read.parquet(args.out)
    # the input's events (grouped rows leave out refused events and merge repeated ids)
    summary["events"] = summary.get("events_expected") or read_events(spark, events_path).count()
    if args.output == "pairs":
        summary["matches"] = written.count()
    else:
        summary["matches"] = written.select(F.sum(F.size("sub_ids"))).first()[0] or 0
    summary.update(out=args.out, mode=args.mode, shards=shards, ship=ship, master=sc.master,
                   loads=stats.loads, workers=len(stats.loads_per_worker), backends=stats.backends,
                   fallbacks=stats.fallbacks)
    summary["events_per_s"] = summary["events"] / stages["match+write"] if stages["match+write"] > 0 else 0.0
    return summary


def format_summary(s: dict) -> str:
    mode = s["mode"] + (f" ({s['shards']} shards)" if s["mode"] == "shard" else "")
    stages = " | ".join(f"{name} {sec:.1f}" for name, sec in s["stages"].items())
    lines = [f"bexmatch run: {s['workload']}; {mode}; master {s['master']}",
             f"  subscriptions  {s['subscriptions']:>12,}",
             f"  events         {s['events']:>12,}",
             f"  matches        {s['matches']:>12,}",
             f"  events/s       {s['events_per_s']:>12,.0f}   (match+write)",
             f"  seconds        {stages}",
             f"  index          {s['index_bytes']:,} bytes shipped by {s['ship']}; loaded {s['loads']} times by "
             f"{s['workers']} Python workers ({', '.join(f'{b}: {n}' for b, n in s['backends'].items()) or '-'})",
             f"  output         {s['out']}"]
    if s.get("quarantine"):
        lines.append(f"  quarantined    {s['quarantined']:>12,}   -> {s['quarantine']}")
    if s.get("fallbacks"):
        lines.append(f"  note: {s['fallbacks']} worker(s) fell back from cuda to cpu")
    if s.get("note"):
        lines.append(f"  note: {s['note']}")
    return "\n".join(lines)


_OUR_ERRORS = re.compile(r"\b(BadEventError|GpuUnavailable|BackendUnavailable|IndexFileError|SchemaError|"
                         r"InjectedFailure|MemoryError): ([^\n]*)")


def spark_error_message(exc: BaseException) -> str:
    """The line that says what went wrong in a failed Spark job (the
    bexmatch error raised in a Python worker), else the exception's first
    line."""
    text = str(exc)
    found = _OUR_ERRORS.findall(text)
    if found:
        name, message = found[-1]
        return f"{name}: {message.strip()}"
    return f"{type(exc).__name__}: {text.strip().splitlines()[0] if text.strip() else ''}"


def main(argv=None) -> int:
    """Entry point of ``bexmatch run``; returns the exit status: 0 done,
    2 bad input found before any output was written, 1 the Spark job
    failed."""
    args = parse_args(argv)
    from engine.errors import BexmatchError

    try:
        summary = run(args)
    except (JobError, BexmatchError, FileNotFoundError) as exc:
        print(f"bexmatch run: error: {exc}", file=sys.stderr)
        return 2
    except Exception as exc:
        module = type(exc).__module__ or ""
        if not (module.startswith("pyspark") or module.startswith("py4j")):
            raise
        print(f"bexmatch run: the Spark job failed: {spark_error_message(exc)}", file=sys.stderr)
        return 1
    print(format_summary(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
