"""Two fixes to numba's CUDA simulator, made once when a test session runs
under it (``NUMBA_ENABLE_CUDASIM=1``, see ``conftest.py``).

The simulator runs each CUDA thread of a block as a Python thread:

* its block manager polls the threads in a loop that never sleeps, so every
  handoff of the GIL to a thread released from a ``syncthreads`` waits out
  the interpreter's switch interval (5 ms by default).  At 100 us the
  simulated kernels run about ten times faster (test_bench_gpu's toy run:
  105 s -> 11 s; 1 ms: 28 s, 20 us: 14 s), and far less at the mercy of a
  second process on the machine (CI runs the whole suite beside this slice);
* ``cuda.shared.array`` looks the block's array up by the caller's line and
  makes it when missing, without a lock: two threads that both miss each
  make their own, and the block no longer shares it (a thread then reads
  what it never wrote -- seen in CI as a garbage c-node index in the A-PCM
  kernel).  The short switch interval makes that window likely enough to
  matter, so the lookup and the making are done under one lock here.
  ``test_cuda_sim.py`` pins both behaviours.
"""

from __future__ import annotations

import sys
import threading

SWITCH_INTERVAL_S = 1e-4


def shared_array_under_a_lock(shared_class) -> None:
    """Replace ``shared_class.array`` (numba's ``FakeCUDAShared.array``) by
    the same lookup with its check and its insertion under one lock.  Its
    allocations stay keyed as numba keys them, by the caller's file and line."""
    from numba.core import types
    from numba.cuda.simulator import kernelapi
    from numba.np import numpy_support

    original = shared_class.array
    lock = threading.Lock()

    def array(self, shape, dtype, alignment=None):
        if alignment is not None or shape == 0:     # an error, or the dynamic array: no lookup by line
            return original(self, shape, dtype, alignment)
        if isinstance(dtype, types.Type):
            dtype = numpy_support.as_dtype(dtype)
        frame = sys._getframe(1)
        caller = (frame.f_code.co_filename, frame.f_lineno)
        with lock:
            res = self._allocations.get(caller)
            if res is None:
                res = self._allocations[caller] = kernelapi.np.empty(shape, dtype)
        return res

    array.__wrapped__ = original
    shared_class.array = array


def install() -> None:
    """Both fixes, for this process (idempotent)."""
    sys.setswitchinterval(SWITCH_INTERVAL_S)
    from numba.cuda.simulator import kernelapi
    if not hasattr(kernelapi.FakeCUDAShared.array, "__wrapped__"):
        shared_array_under_a_lock(kernelapi.FakeCUDAShared)
