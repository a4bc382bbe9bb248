"""Matching kernels.  Each module holds one kernel family: the numba
CPU-parallel kernel and its numba-CUDA twin, side by side, with the same
arguments.  Nothing here imports CUDA at module import time.

Importing the package makes numba's TBB threading layer loadable before any
parallel kernel runs (:mod:`gpu_kernels.threading_layer` says why)."""

from gpu_kernels import threading_layer  # noqa: F401  (before numba picks a threading layer)
