"""A kernel compiled twice: over every core, and on the calling thread.

Each matcher runs its CPU kernel as ``prange`` tasks over all cores for a
batch and on the calling thread for a few events (waking the other threads
costs more than a small task).  Both are compiled from one Python function
with ``cache=True`` -- and numba keys its on-disk cache by the function's
module, qualified name and first line, not by the compile options
(numba issue 6845, open): the two compilations share one cache index, and
whichever was saved first is loaded for both.  A process that found the
serial one cached ran its "parallel" kernel on one thread (measured on
A-PCM's stage 4: 3.9x slower on two cores, answers unchanged).

:func:`parallel_and_serial` compiles the serial twin from a copy of the
function under its own name, so that each has its own cache entry
(tests/test_kernels_cpu.py checks that every cached kernel has an entry
of its own, and that each pair shares its code and differs only in
``parallel=``).
"""

from __future__ import annotations

import types

from numba import njit

#: what the serial twin's name adds to the function's
SERIAL_SUFFIX = "_serial"


def renamed(py_func, suffix: str):
    """A copy of ``py_func`` (same code, globals, defaults, closure) whose
    name and qualified name end in ``suffix``."""
    name = py_func.__name__ + suffix
    qualname = py_func.__qualname__ + suffix
    code = py_func.__code__.replace(co_name=name, co_qualname=qualname)
    twin = types.FunctionType(code, py_func.__globals__, name, py_func.__defaults__, py_func.__closure__)
    twin.__qualname__ = qualname
    twin.__module__ = py_func.__module__
    twin.__doc__ = py_func.__doc__
    twin.__kwdefaults__ = py_func.__kwdefaults__
    return twin


def parallel_and_serial(py_func, **options):
    """``(njit(parallel=True, cache=True, **options)(py_func),
    njit(cache=True, **options)`` of a renamed copy), cached apart."""
    parallel = njit(parallel=True, cache=True, **options)(py_func)
    serial = njit(cache=True, **options)(renamed(py_func, SERIAL_SUFFIX))
    return parallel, serial
