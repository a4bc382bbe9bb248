"""Shipping a compiled index to the executors, and the per-worker cache.

The driver serialises the index once (``Index.save``'s bytes), names it by
a SHA-256 of their content (:func:`content_digest`), and ships it once per
executor:

* ``"broadcast"`` (the default): ``SparkContext.broadcast(bytes)``.  The
  JVM moves it with the torrent broadcast, once per executor; each Python
  worker receives it once (PySpark tracks which broadcasts a worker has).
* ``"files"``: ``SparkContext.addFile`` of the saved index; each executor
  fetches the file once into its SparkFiles directory and workers load it
  from there.

README.md ("Shipping the index") has the measurement behind the default.

On the executors each Python worker keeps the loaded :class:`engine.Index`
in the module-level :data:`_CACHE`, keyed by (digest, requested backend,
GPU); a task whose index is cached touches neither the broadcast nor the
file, so an index is deserialised once per worker, never per batch or per
task.  Loads are counted in :class:`MatchStats` (an accumulator) and in
:data:`LOADS` (this process only).
"""

from __future__ import annotations

import atexit
import hashlib
import io
import os
import shutil
import socket
import sys
import tempfile
import threading
import time
import zipfile
from collections import Counter, OrderedDict
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from engine import Index
from engine.errors import IndexFileError
from engine.forks import renew_after_fork

if TYPE_CHECKING:       # (hints only: importing this module does not import pyspark)
    from pyspark.sql import SparkSession

SHIP_METHODS = ("broadcast", "files")
DEFAULT_SHIP = "broadcast"

# ---------------------------------------------------------------- driver side


@dataclass
class ShippedIndex:
    """An index serialised on the driver and shipped to the executors.

    Picklable: it travels inside the mapInArrow closure; ``handle`` is the
    Broadcast (pickled as its id) or the SparkFiles name."""

    digest: str
    nbytes: int
    method: str
    handle: object
    n_subscriptions: int
    algorithm: str
    attributes: dict            # attribute name -> "numeric" | "string" | "boolean" | None
    serialise_s: float = 0.0
    ship_s: float = 0.0
    shard: int | None = None    # shard number in shard mode
    sub_id_range: tuple | None = None   # (first id, last id) of a shard

    def __repr__(self) -> str:
        where = f", shard={self.shard}" if self.shard is not None else ""
        return (f"ShippedIndex(digest={self.digest[:12]}…, {self.n_subscriptions} subscriptions, "
                f"{self.nbytes} bytes, method={self.method!r}{where})")


@dataclass
class ShardedIndex:
    """K shipped shards of one index; shard s holds the s-th contiguous run
    of the sorted subscription ids (balanced by count)."""

    shards: list[ShippedIndex]

    @property
    def n_subscriptions(self) -> int:
        return sum(s.n_subscriptions for s in self.shards)

    @property
    def attributes(self) -> dict:
        return self.shards[0].attributes if self.shards else {}

    def __len__(self) -> int:
        return len(self.shards)


def _files_dir() -> str:
    """Driver-side directory holding indexes shipped with ``addFile``; the
    files must outlive the jobs that fetch them, so it lives as long as this
    process (removed at exit)."""
    global _FILES_DIR
    if _FILES_DIR is None:
        _FILES_DIR = tempfile.mkdtemp(prefix="bexmatch-ship-")
        atexit.register(shutil.rmtree, _FILES_DIR, True)
    return _FILES_DIR


_FILES_DIR = None
_SHIPPED: dict = {}     # (application id, digest, method) -> (handle, ship seconds)
_SHIP_LOCK = threading.Lock()


def index_bytes(index: Index) -> bytes:
    """``index.save`` as bytes."""
    with tempfile.TemporaryDirectory(prefix="bexmatch-save-") as tmp:
        path = os.path.join(tmp, "index.bexidx")
        index.save(path)
        with open(path, "rb") as f:
            return f.read()


def load_bytes(data: bytes, *, backend: str | None = "cpu", name: str = "index") -> Index:
    """An index from ``index.save`` bytes (validated: IndexFileError when
    corrupt)."""
    with tempfile.TemporaryDirectory(prefix="bexmatch-load-") as tmp:
        path = os.path.join(tmp, f"{name}.bexidx")
        with open(path, "wb") as f:
            f.write(data)
        return Index.load(path, backend=backend)


def load_validated(path) -> tuple[Index, bytes]:
    """Read and validate a saved index on the driver: a missing file raises
    FileNotFoundError, a corrupt one IndexFileError, both naming the path."""
    path = os.fspath(path)
    if not os.path.exists(path):
        raise FileNotFoundError(f"index file {path!r} does not exist")
    if os.path.isdir(path):
        raise IndexFileError(f"{path}: is a directory, not a saved bexmatch index")
    index = Index.load(path, backend="cpu")    # IndexFileError names the path
    with open(path, "rb") as f:
        data = f.read()
    return index, data


def content_digest(data: bytes) -> str:
    """SHA-256 naming a saved index by its content: over every archive
    member's name and bytes, not the archive's timestamps, so that the same
    index saved twice gets the same digest (and is shipped and loaded once).
    Bytes that are not an archive are named by their plain SHA-256."""
    try:
        with zipfile.ZipFile(io.BytesIO(data)) as archive:
            h = hashlib.sha256(b"bexmatch-index-content\0")
            for name in sorted(archive.namelist()):
                blob = archive.read(name)
                h.update(f"{name}\0{len(blob)}\0".encode())
                h.update(blob)
            return h.hexdigest()
    except (zipfile.BadZipFile, OSError, ValueError, EOFError):
        return hashlib.sha256(data).hexdigest()


def _families(index: Index) -> dict:
    return {name: (None if family is None else family.value) for name, family in index.schema.families.items()}


def ship_bytes(spark, data: bytes, *, index: Index, method: str = DEFAULT_SHIP,
               serialise_s: float = 0.0) -> ShippedIndex:
    """Ship serialised index bytes (already validated) with ``method``.  The
    same bytes shipped twice in one application reuse the first shipment."""
    if method not in SHIP_METHODS:
        raise ValueError(f"ship must be one of {SHIP_METHODS}, not {method!r}")
    sc = spark.sparkContext
    digest = content_digest(data)
    key = (sc.applicationId, digest, method)
    start = time.perf_counter()
    with _SHIP_LOCK:
        if key not in _SHIPPED:
            if method == "broadcast":
                handle = sc.broadcast(data)
            else:
                name = f"bexmatch-{digest}.bexidx"
                path = os.path.join(_files_dir(), name)
                if not os.path.exists(path):
                    with open(path + ".tmp", "wb") as f:
                        f.write(data)
                    os.replace(path + ".tmp", path)
                sc.addFile(path)
                handle = name
            _SHIPPED[key] = (handle, time.perf_counter() - start)
        handle, ship_s = _SHIPPED[key]
    return ShippedIndex(digest=digest, nbytes=len(data), method=method, handle=handle,
                        n_subscriptions=len(index), algorithm=index.algorithm, attributes=_families(index),
                        serialise_s=serialise_s, ship_s=ship_s)


def resolve_index(index_or_path) -> tuple[Index, bytes | None]:
    """(Index, its saved bytes if they were read from a file) for an Index
    or a path to a saved index, validated on the driver."""
    if isinstance(index_or_path, Index):
        return index_or_path, None
    if isinstance(index_or_path, (str, bytes, os.PathLike)):
        return load_validated(index_or_path)
    raise TypeError(f"expected an engine.Index, a path to a saved index, or a shipped index "
                    f"(spark_integration.ship_index), not {type(index_or_path).__name__}")


def ship_index(spark: SparkSession, index_or_path: Index | str | os.PathLike, *, mode: str = "replicate",
               shards: int | None = None, method: str = DEFAULT_SHIP) -> ShippedIndex | ShardedIndex:
    """Validate, serialise and ship an index for :func:`match_events`.

    Returns a :class:`ShippedIndex` (``mode="replicate"``) or a
    :class:`ShardedIndex` of ``shards`` shards (``mode="shard"``).  Shipping
    first and passing the result to several ``match_events`` calls (or
    streaming micro-batches) ships the index once."""
    if mode not in ("replicate", "shard"):
        raise ValueError(f"mode must be 'replicate' or 'shard', not {mode!r}")
    if isinstance(index_or_path, ShippedIndex):
        if mode == "shard":
            raise ValueError("mode='shard' needs the unsharded index (or a ShardedIndex), not one ShippedIndex")
        return index_or_path
    if isinstance(index_or_path, ShardedIndex):
        if mode != "shard":
            raise ValueError("a ShardedIndex is for mode='shard'")
        if shards is not None and shards != len(index_or_path):
            raise ValueError(f"the ShardedIndex has {len(index_or_path)} shards, not {shards}")
        return index_or_path
    start = time.perf_counter()
    index, data = resolve_index(index_or_path)
    if mode == "replicate":
        if data is None:
            data = index_bytes(index)
        return ship_bytes(spark, data, index=index, method=method, serialise_s=time.perf_counter() - start)
    if shards is None or int(shards) < 1:
        raise ValueError(f"mode='shard' needs shards >= 1, not {shards!r}")
    pieces = split_index(index, int(shards))
    split_s = time.perf_counter() - start
    parts = []
    for s, shard in enumerate(pieces):
        t = time.perf_counter()
        data = index_bytes(shard)
        shipped = ship_bytes(spark, data, index=shard, method=method,
                             serialise_s=time.perf_counter() - t + split_s / len(pieces))
        shipped.shard = s
        ids = shard_ids(shard)
        shipped.sub_id_range = (int(ids[0]), int(ids[-1])) if len(ids) else None
        parts.append(shipped)
    return ShardedIndex(parts)


def shard_ids(index: Index) -> np.ndarray:
    return index.ids()


def split_index(index: Index, k: int) -> list[Index]:
    """Split ``index`` into ``k`` indexes by subscription id: shard s holds
    the s-th of ``k`` contiguous, equally sized runs of the sorted ids.
    Every shard keeps the whole schema (attributes, families, dictionaries),
    so all shards encode and judge an event identically.

    Uses ``Index.split``: the compiled form is copied, no expression is
    re-parsed, and every shard is of one state of ``index`` (an update in
    another thread lands before all or after all of them)."""
    return index.split(k)


# ---------------------------------------------------------------- statistics


class _DictSum:
    """AccumulatorParam summing dicts of numbers key by key."""

    def zero(self, value):
        return {}

    def addInPlace(self, a, b):
        for key, value in b.items():
            a[key] = a.get(key, 0) + value
        return a


class MatchStats:
    """Counts what the workers did, through one accumulator: index loads per
    worker process (host, pid), seconds spent loading, batches and events
    matched, and cuda->cpu fallbacks.  Read it after an action.

    Accumulator updates of failed task attempts are dropped by Spark, so a
    load done by an attempt that then failed is not counted."""

    def __init__(self, spark: SparkSession):
        from pyspark import AccumulatorParam

        param = type("DictSumParam", (_DictSum, AccumulatorParam), {})()
        self._acc = spark.sparkContext.accumulator({}, param)

    @property
    def accumulator(self):
        return self._acc

    @property
    def raw(self) -> dict:
        return dict(self._acc.value)

    def _select(self, kind):
        return {key[1:]: value for key, value in self.raw.items() if key[0] == kind}

    @property
    def loads(self) -> int:
        """Index loads (deserialisations) on all workers."""
        return int(sum(self._select("load").values()))

    @property
    def loads_per_worker(self) -> dict:
        """{(host, pid): number of index loads}; one per index per worker
        when the cache works."""
        out: Counter = Counter()
        for (host, pid, _digest, _backend), n in self._select("load").items():
            out[(host, pid)] += n
        return dict(out)

    @property
    def loads_per_index(self) -> dict:
        """{(host, pid, digest): loads}; 1 everywhere when every worker
        loaded each index it used exactly once."""
        return {(h, p, d): n for (h, p, d, _b), n in self._select("load").items()}

    @property
    def load_seconds(self) -> float:
        return float(sum(self._select("load_s").values()))

    @property
    def backends(self) -> dict:
        """{backend: loads}"""
        out: Counter = Counter()
        for (_h, _p, _d, backend), n in self._select("load").items():
            out[backend] += n
        return dict(out)

    @property
    def fallbacks(self) -> int:
        return int(sum(self._select("fallback").values()))

    @property
    def batches(self) -> int:
        return int(sum(self._select("batches").values()))

    @property
    def events(self) -> int:
        return int(sum(self._select("events").values()))

    def __repr__(self) -> str:
        return (f"MatchStats(loads={self.loads}, workers={len(self.loads_per_worker)}, "
                f"load_seconds={self.load_seconds:.3f}, batches={self.batches}, events={self.events}, "
                f"fallbacks={self.fallbacks})")


# ---------------------------------------------------------------- worker side

#: (digest, requested backend, GPU) -> (Index, DeviceChoice); this process's cache
_CACHE: "OrderedDict[tuple, tuple]" = OrderedDict()
#: (digest, backend) -> loads done by this process
LOADS: Counter = Counter()
_CACHE_LOCK = threading.Lock()


def _renew_locks(module) -> None:
    """A forked child starts with fresh locks (PySpark's daemon forks its
    workers; a lock a thread held at the fork would stay held for ever)."""
    module._SHIP_LOCK = threading.Lock()
    module._CACHE_LOCK = threading.Lock()


renew_after_fork(sys.modules[__name__], _renew_locks)


def _fetch_path(shipped: ShippedIndex, tmp: str) -> str:
    if shipped.method == "files":
        from pyspark import SparkFiles
        return SparkFiles.get(shipped.handle)
    data = shipped.handle.value
    path = os.path.join(tmp, f"bexmatch-{shipped.digest}.bexidx")
    with open(path, "wb") as f:
        f.write(data)
    # PySpark keeps a broadcast's value in the worker for the worker's life;
    # once the index is loaded the raw bytes are dead weight (as large as the
    # index), so drop them -- the property reloads them from its file should
    # they ever be needed again (a cache eviction).
    if getattr(shipped.handle, "_path", None) is not None:
        try:
            del shipped.handle._value
        except AttributeError:
            pass
    return path


def worker_index(shipped: ShippedIndex, *, backend: str = "auto", gpu_fallback: bool = False,
                 capacity: int = 2, stats=None, gpus=None):
    """The index for this task, from this worker's cache or loaded once.

    ``capacity`` bounds the indexes one worker keeps (least recently used
    evicted first): 1 in shard mode, so that a worker holds one shard."""
    from spark_integration import devices

    gpus = devices.task_gpus() if gpus is None else gpus
    key = (shipped.digest, backend, gpus.addresses if gpus.source == "spark-resources" else ())
    with _CACHE_LOCK:
        hit = _CACHE.get(key)
        if hit is not None:
            _CACHE.move_to_end(key)
            return hit
        while len(_CACHE) >= max(1, capacity):
            _CACHE.popitem(last=False)
        start = time.perf_counter()
        with tempfile.TemporaryDirectory(prefix="bexmatch-worker-") as tmp:
            path = _fetch_path(shipped, tmp)

            def loader(name):
                try:
                    return Index.load(path, backend=name)
                except IndexFileError as exc:
                    raise IndexFileError(f"the shipped index {shipped.digest[:12]} ({shipped.method}) did not load "
                                         f"on this executor: {exc}") from exc

            index, choice = devices.load_for_task(loader, backend, gpu_fallback=gpu_fallback, gpus=gpus)
        seconds = time.perf_counter() - start
        _CACHE[key] = (index, choice)
        LOADS[(shipped.digest, choice.backend)] += 1
    if stats is not None:
        where = (socket.gethostname(), os.getpid())
        update = {("load", *where, shipped.digest, choice.backend): 1, ("load_s", *where, shipped.digest): seconds}
        if choice.fell_back:
            update[("fallback", *where)] = 1
        stats.add(update)
    return index, choice


def clear_cache() -> None:
    """Forget this process's loaded indexes (tests)."""
    with _CACHE_LOCK:
        _CACHE.clear()


__all__ = ["DEFAULT_SHIP", "SHIP_METHODS", "MatchStats", "ShardedIndex", "ShippedIndex", "index_bytes",
           "load_bytes", "load_validated", "ship_index", "split_index", "worker_index"]
