"""Backend selection and the array namespace.

``cpu`` always runs.  ``cuda`` runs where numba-CUDA sees a GPU and CuPy
imports, or under numba's CUDA simulator (``NUMBA_ENABLE_CUDASIM=1``), where
NumPy stands in for CuPy.  Nothing here imports CUDA at module import time,
so ``import engine`` works on any machine.
"""

from __future__ import annotations

import os
from functools import lru_cache

from engine.errors import BackendUnavailable

BACKENDS = ("cpu", "cuda")


def cuda_simulated() -> bool:
    return os.environ.get("NUMBA_ENABLE_CUDASIM", "0") not in ("", "0")


@lru_cache(maxsize=1)
def _cuda_missing() -> str | None:
    """None when the cuda backend can run here, else what is missing."""
    if cuda_simulated():
        return None
    try:
        from numba import cuda
    except ImportError as exc:  # numba-cuda not installed
        return f"numba-cuda is not importable ({exc})"
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
