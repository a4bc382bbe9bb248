"""Matching kernels.  Each module holds one kernel family: the numba
CPU-parallel kernel and its numba-CUDA twin, side by side, with the same
arguments.  Nothing here imports CUDA at module import time."""
