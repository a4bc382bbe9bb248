"""A Spark session that just works for bexmatch, and a check that the
executors' Python can run it (README "Spark").

A user's own PySpark script fails in two ways that have nothing to do with
matching: the executors start another Python than the driver's (one without
pyarrow or bexmatch, or of another minor version), or a local session binds
to an address the host name resolves to but nothing listens on.  Both end
in fifty lines of Java stack.  :func:`session` sets up what ``bexmatch run``
sets up -- the workers run this interpreter and import bexmatch from where
this process does, a local Spark stays on loopback, Arrow is on -- and
:func:`check_workers` asks the executors, once per application, whether
they can import what matching needs, raising one
:class:`WorkerEnvironmentError` that names what is missing and the fix.
:func:`spark_integration.match_events` runs the check before its job.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import sys
import threading

if TYPE_CHECKING:       # (hints only: importing this module does not import pyspark)
    from pyspark.sql import SparkSession

#: the modules a Python worker imports to match (engine, and what it needs)
WORKER_MODULES = ("numpy", "pyarrow", "numba", "re2", "lark", "engine", "spark_integration")

_checked: set = set()
_checked_lock = threading.Lock()


class WorkerEnvironmentError(RuntimeError):
    """The executors' Python cannot run bexmatch (what is missing, and the fix)."""


def session(master: str = "local[*]", app_name: str = "bexmatch", conf: dict | None = None, *,
            check: bool = True) -> SparkSession:
    """A SparkSession for bexmatch: the executors run this interpreter
    (``PYSPARK_PYTHON``) with bexmatch importable, a local master stays on
    127.0.0.1, Arrow transfer is on, Java 17/21 is found when ``JAVA_HOME``
    is unset.  ``conf``: more Spark settings.  An already active session is
    returned as it is (Spark keeps one per process), checked too.
    ``check``: run :func:`check_workers` first."""
    from pyspark.sql import SparkSession

    from spark_integration.job import prepare_environment

    active = SparkSession.getActiveSession()
    if active is None:
        prepare_environment(master)       # before the JVM starts: it reads these once
        builder = (SparkSession.builder.master(master).appName(app_name)
                   .config("spark.sql.execution.arrow.pyspark.enabled", "true"))
        if master.startswith("local"):
            builder = builder.config("spark.driver.bindAddress", "127.0.0.1").config("spark.driver.host",
                                                                                     "127.0.0.1")
        for key, value in (conf or {}).items():
            builder = builder.config(key, str(value))
        active = builder.getOrCreate()
    if check:
        check_workers(active)
    return active


def _make_probe(modules: tuple):
    # Built inside a function so that cloudpickle ships the probe by value:
    # a worker that cannot import spark_integration must still run it.
    def probe(_partition):
        import importlib
        import socket
        import sys as worker_sys

        failures, versions = {}, {}
        for name in modules:
            try:
                module = importlib.import_module(name)
                versions[name] = str(getattr(module, "__version__", ""))
            except Exception as exc:       # ImportError, or a module that fails while importing
                failures[name] = f"{type(exc).__name__}: {exc}"
        yield socket.gethostname(), worker_sys.executable, worker_sys.version.split()[0], failures, versions
    return probe


def check_workers(spark: SparkSession, modules: tuple = WORKER_MODULES) -> list:
    """Ask the executors (one tiny task per default-parallelism slot)
    whether their Python imports ``modules`` and runs the driver's bexmatch
    version; raise :class:`WorkerEnvironmentError` naming what is missing
    and the fix, else return what each task saw (host, Python, version,
    failures, module versions).  Once per application and module list."""
    from engine import __version__

    context = spark.sparkContext
    key = (context.applicationId, tuple(modules))
    with _checked_lock:
        if key in _checked:
            return []
    slots = max(1, min(int(context.defaultParallelism), 8))
    try:
        seen = context.parallelize(range(slots), slots).mapPartitions(_make_probe(tuple(modules))).collect()
    except Exception as exc:          # the worker's Python did not even start, or exited at once
        raise WorkerEnvironmentError(
            f"Spark's Python workers could not start: {_worker_failure(exc)}. They run "
            f"{context.pythonExec!r} (PYSPARK_PYTHON); the driver runs {sys.executable!r}, Python "
            f"{sys.version.split()[0]}. {_FIX}") from None
    for host, python, version, failures, versions in seen:
        if failures:
            names = ", ".join(sorted(failures))
            first = next(iter(failures.values()))
            raise WorkerEnvironmentError(
                f"Spark's Python workers ({python}, Python {version}, on {host}) cannot import {names} "
                f"({first}). {_FIX}")
        if "engine" in versions and versions["engine"] != __version__:
            raise WorkerEnvironmentError(
                f"Spark's Python workers ({python} on {host}) run bexmatch {versions['engine']}, the driver "
                f"{__version__}: an index file must be read by the version that wrote it. {_FIX}")
    with _checked_lock:
        _checked.add(key)
    return seen


_FIX = ("Fix: install bexmatch and its dependencies into the workers' Python (pip install bexmatch, or the "
        "repository's environment.yml), or let them run the driver's interpreter -- make the session with "
        "spark_integration.session(), or set PYSPARK_PYTHON to it before the session starts.")


def _worker_failure(exc: BaseException) -> str:
    """The line of a failed probe job that says why the worker failed
    (Python's own error, or PySpark's version-mismatch message), not the
    JVM's stack."""
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    for marker in ("PYTHON_VERSION_MISMATCH", "Python in worker has different version", "Error:",
                   "Cannot run program"):
        for line in lines:
            if marker in line and not line.startswith("at "):
                return line[:400]
    return (lines[0] if lines else type(exc).__name__)[:400]
