"""Which backend a Spark task matches with (docs/architecture.md#spark).

A task that holds a GPU matches on the ``cuda`` backend.  "Holds a GPU"
means, in this order:

1. Spark's resource scheduling gave the task GPU addresses
   (``TaskContext.get().resources()["gpu"].addresses``, set by
   ``spark.task.resource.gpu.amount`` together with
   ``spark.executor.resource.gpu.amount`` and a discovery script, as on a
   Spark-RAPIDS cluster).  The address is a CUDA device ordinal, exactly as
   the RAPIDS Accelerator treats it, and the worker selects that device
   before loading the index.
2. Otherwise the Python worker's ``CUDA_VISIBLE_DEVICES`` names devices
   (a cluster manager that isolates GPUs per container); the worker then
   uses the default device, which is the first one named there.

``backend="auto"`` (the default of :func:`spark_integration.match_events`)
picks ``cuda`` when the task holds a GPU and ``cpu`` otherwise;
``"cuda"`` and ``"cpu"`` force a backend.  When ``cuda`` is chosen but
cannot run (``engine.Index.load(..., backend="cuda")`` raises
:class:`engine.errors.BackendUnavailable`: no CuPy, no driver, no cuda
matcher for the index's algorithm), the task falls back to ``cpu`` only if
``gpu_fallback=True``; otherwise it fails with :class:`GpuUnavailable`,
which says which GPU the task held and why ``cuda`` could not run.

Everything here takes the task context and the environment as arguments,
so it is unit-tested without a GPU by faking them.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from engine.errors import BackendUnavailable

BACKEND_CHOICES = ("auto", "cpu", "cuda")

#: CUDA_VISIBLE_DEVICES values that mean "no device"
_NO_DEVICES = {"", "-1", "none", "nodevfiles", "void"}


class GpuUnavailable(BackendUnavailable):
    """A task that holds a GPU (or was told to use ``cuda``) cannot run the
    ``cuda`` backend, and ``gpu_fallback`` was not set."""


@dataclass(frozen=True)
class TaskGpus:
    """The GPUs a task holds and where that came from."""

    addresses: tuple[str, ...] = ()
    source: str = "none"   # "spark-resources", "CUDA_VISIBLE_DEVICES" or "none"

    def __bool__(self) -> bool:
        return bool(self.addresses)


def task_gpus(task_context=None, environ: Mapping[str, str] | None = None) -> TaskGpus:
    """The GPUs the current task holds (see the module docstring).

    ``task_context`` defaults to ``pyspark.TaskContext.get()`` (None on the
    driver), ``environ`` to ``os.environ``."""
    if task_context is None:
        try:
            from pyspark import TaskContext
            task_context = TaskContext.get()
        except ImportError:     # pragma: no cover - pyspark is there whenever Spark runs us
            task_context = None
    if task_context is not None:
        try:
            resources = task_context.resources() or {}
        except Exception:      # an old or partial TaskContext: no resource information
            resources = {}
        gpu = resources.get("gpu")
        addresses = tuple(str(a).strip() for a in (getattr(gpu, "addresses", None) or ()) if str(a).strip())
        if addresses:
            return TaskGpus(addresses, "spark-resources")
    environ = os.environ if environ is None else environ
    visible = environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None and visible.strip().lower() not in _NO_DEVICES:
        addresses = tuple(a.strip() for a in visible.split(",") if a.strip())
        if addresses:
            return TaskGpus(addresses, "CUDA_VISIBLE_DEVICES")
    return TaskGpus()


def choose_backend(requested: str, gpus: TaskGpus) -> str:
    """``auto`` -> ``cuda`` when the task holds a GPU, else ``cpu``."""
    if requested not in BACKEND_CHOICES:
        raise ValueError(f"backend must be one of {BACKEND_CHOICES}, not {requested!r}")
    if requested == "auto":
        return "cuda" if gpus else "cpu"
    return requested


def select_gpu(gpus: TaskGpus) -> int | None:
    """Make the task's GPU the current CUDA device of this process; returns
    the ordinal, or None when the default device is the right one (no Spark
    resources: ``CUDA_VISIBLE_DEVICES`` already narrowed the view).

    Best effort on the CUDA libraries present (CuPy, numba-cuda); a failure
    here surfaces as BackendUnavailable from the load that follows."""
    if gpus.source != "spark-resources":
        return None
    try:
        ordinal = int(gpus.addresses[0])
    except ValueError:
        raise GpuUnavailable(f"Spark gave this task GPU address {gpus.addresses[0]!r}, which is not a CUDA "
                             f"device ordinal; fix the GPU discovery script") from None
    try:
        import cupy
        cupy.cuda.runtime.setDevice(ordinal)
    except Exception:   # no CuPy or no driver: Index.load(backend="cuda") will say what is missing
        pass
    try:
        from numba import cuda
        if cuda.is_available():
            cuda.select_device(ordinal)
    except Exception:
        pass
    return ordinal


@dataclass(frozen=True)
class DeviceChoice:
    """What a worker decided: the backend it loaded, the device and why."""

    backend: str
    device: int | None
    gpus: TaskGpus
    fell_back: str | None = None    # the BackendUnavailable message when cuda fell back to cpu


def load_for_task(loader: Callable[[str], object], requested: str = "auto", *, gpu_fallback: bool = False,
                  gpus: TaskGpus | None = None, select: Callable[[TaskGpus], int | None] = select_gpu):
    """Load an index on the backend this task should use.

    ``loader(backend)`` loads the index (``engine.Index.load(path,
    backend=backend)``).  Returns ``(index, DeviceChoice)``."""
    gpus = task_gpus() if gpus is None else gpus
    backend = choose_backend(requested, gpus)
    if backend == "cpu":
        return loader("cpu"), DeviceChoice("cpu", None, gpus)
    device = None
    try:
        device = select(gpus)
        return loader("cuda"), DeviceChoice("cuda", device, gpus)
    except BackendUnavailable as exc:
        held = (f"the task holds GPU {', '.join(gpus.addresses)} (from {gpus.source})" if gpus
                else "backend='cuda' was requested")
        if gpu_fallback:
            return loader("cpu"), DeviceChoice("cpu", device, gpus, fell_back=str(exc))
        raise GpuUnavailable(f"{held}, but the cuda backend cannot run: {exc}. Pass gpu_fallback=True "
                             f"(bexmatch run --gpu-fallback) to match on the CPU instead, or backend='cpu'.") \
            from exc
