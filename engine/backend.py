"""Backend selection and the array namespace.

``cpu`` always runs.  ``cuda`` runs where numba-CUDA sees a GPU and CuPy
imports, or under numba's CUDA simulator (``NUMBA_ENABLE_CUDASIM=1``), where
NumPy stands in for CuPy.  Nothing here imports CUDA at module import time,
so ``import engine`` works on any machine.
"""

from __future__ import annotations

from functools import lru_cache

from engine.errors import BackendUnavailable, BexmatchError
from gpu_kernels import cuda_support

BACKENDS = ("cpu", "cuda")

#: share of the free device memory one match call may use for its scratch
#: (hit matrix, compaction arrays, the batch's event slices, results)
DEVICE_MEMORY_FRACTION = 0.8


class DeviceMemoryError(BexmatchError, MemoryError):
    """A batch (or index) that cannot fit the device memory budget even one
    event at a time; the message says how much it needs and what is free."""


def cuda_simulated() -> bool:
    """True under numba's CUDA simulator (``NUMBA_ENABLE_CUDASIM=1`` when
    ``numba.cuda`` was first imported)."""
    return cuda_support.simulated()


def device_memory_budget(limit: int | None = None) -> int:
    """Bytes of device memory one match call may use: ``limit`` if given
    (capped by what is free on a GPU), else :data:`DEVICE_MEMORY_FRACTION`
    of the free memory -- under the simulator, of
    ``gpu_kernels.cuda_support.SIMULATED_FREE_MEMORY``."""
    free = cuda_support.free_device_memory()
    if free is None:
        free = cuda_support.SIMULATED_FREE_MEMORY
        return int(limit) if limit is not None else int(free * DEVICE_MEMORY_FRACTION)
    budget = int(free * DEVICE_MEMORY_FRACTION)
    return min(budget, int(limit)) if limit is not None else budget


@lru_cache(maxsize=1)
def _cuda_missing() -> str | None:
    """None when the cuda backend can run here, else what is missing."""
    try:
        cuda = cuda_support.load_cuda()
    except ImportError as exc:  # numba-cuda or the CUDA Python bindings not installed
        return f"numba-cuda is not importable ({exc})"
    if cuda_simulated():
        return None   # numba's simulator: NumPy stands in for CuPy
    try:
        if not cuda.is_available():
            return "no CUDA GPU is visible to numba-cuda (set NUMBA_ENABLE_CUDASIM=1 to use the simulator)"
    except Exception as exc:  # driver problems surface here
        return f"the CUDA driver failed: {exc}"
    try:
        import cupy  # noqa: F401
    except ImportError:
        return "CuPy is not installed (pip install 'bexmatch[gpu]')"
    return None


def available_backends() -> list[str]:
    """The backends that can run on this machine, best first."""
    return ["cuda", "cpu"] if _cuda_missing() is None else ["cpu"]


def resolve_backend(name: str | None) -> str:
    if name is None:
        return available_backends()[0]
    if name not in BACKENDS:
        raise BackendUnavailable(f"unknown backend {name!r}; backends are {', '.join(BACKENDS)}")
    if name == "cuda":
        missing = _cuda_missing()
        if missing is not None:
            raise BackendUnavailable(f"backend 'cuda' is not available here: {missing}")
    return name


def array_namespace(backend: str):
    """NumPy for ``cpu`` and for the simulated ``cuda``; CuPy on a GPU."""
    if backend == "cuda" and not cuda_simulated():
        import cupy
        return cupy
    import numpy
    return numpy
