"""numba's TBB threading layer, found where ``pip install tbb`` puts it.

Why TBB and not OpenMP: a numba parallel kernel under the ``omp`` layer
ends at a barrier that waits for every worker thread, and each worker owns
its share of the iterations.  When another process holds a core, the
worker on it runs a scheduler quantum late, and so does the whole call:
one event against 10,000 subscriptions took 56-64 ms at the 99th
percentile with A-PCM on two busy cores, 1.4-1.6 ms under TBB and about
1 ms idle (BENCHMARKS.md, "numba's TBB threading layer").  TBB hands out
work by stealing: the calling thread does what a
descheduled worker has not started, and waits only for what was started.
It is also the one layer numba documents as both thread- and fork-safe
(Spark forks its Python workers).

numba picks ``tbb`` first when it can load ``libtbb.so.12``, but its
extension has no run path, and the ``tbb`` wheel puts the library in the
environment's ``lib/`` folder, which the loader does not search (conda puts
it where it does).  Loading it once, globally, before the first parallel
kernel runs satisfies the extension's dependency.  Nothing is forced:
``NUMBA_THREADING_LAYER`` (or ``numba.config.THREADING_LAYER``) still
chooses, and without the wheel numba falls back to ``omp`` as before.
"""

from __future__ import annotations

import ctypes
import os
import site
import sys
import sysconfig

#: the soname numba's TBB extension links against (TBB 2021 and later)
TBB_SONAME = "libtbb.so.12"


def _candidates() -> list[str]:
    """The ``lib/`` folders a ``tbb`` wheel may have been installed into:
    this environment's data folder (a virtual environment's prefix), the
    interpreter's prefix, and the user scheme's (``pip install --user``)."""
    folders = [sysconfig.get_paths()["data"], sys.prefix, getattr(site, "USER_BASE", None) or ""]
    return [os.path.join(folder, "lib", TBB_SONAME) for folder in dict.fromkeys(folders) if folder]


def load_tbb() -> str | None:
    """Load the ``tbb`` wheel's library globally if one is installed; the
    path loaded, else None (not installed, or not Linux: numba then finds a
    TBB on the loader's path by itself, or takes OpenMP).

    The wheel's comes first, before anything on the loader's path: a system
    ``libtbb.so.12`` older than numba's minimum (Ubuntu 22.04's 2021.5),
    once loaded, is the one numba's extension binds to, and numba would
    refuse it and take OpenMP although the wheel is there."""
    if not sys.platform.startswith("linux"):
        return None                          # (wheels for Windows and macOS put it where it is found)
    for path in _candidates():
        if os.path.exists(path):
            try:
                ctypes.CDLL(path, mode=ctypes.RTLD_GLOBAL)
            except OSError:                   # a broken install: numba looks for itself, as without it
                return None
            return path
    return None


LOADED = load_tbb()

__all__ = ["LOADED", "TBB_SONAME", "load_tbb"]
