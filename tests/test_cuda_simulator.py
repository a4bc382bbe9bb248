"""The fixes ``tests/cuda_simulator.py`` makes to numba's CUDA simulator,
pinned: the dependency's race still there (so the fix is still needed), and
gone under the fix."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest

from tests import cuda_simulator

kernelapi = pytest.importorskip("numba.cuda.simulator.kernelapi")


class _SlowNumpy:
    """NumPy whose ``empty`` sleeps first: every thread that finds no array for
    its line yields the GIL inside the simulator's check-then-make window."""

    def __getattr__(self, name):
        return getattr(np, name)

    @staticmethod
    def empty(*args, **kwargs):
        time.sleep(0.02)
        return np.empty(*args, **kwargs)


def _arrays_from_threads(shared, n_threads: int = 8) -> list:
    got = [None] * n_threads
    start = threading.Barrier(n_threads)

    def ask(i):
        start.wait()
        got[i] = shared.array(4, np.int64)      # one line: one key for every thread, as in a kernel

    threads = [threading.Thread(target=ask, args=(i,)) for i in range(n_threads)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return got


def test_numbas_simulator_makes_a_shared_array_per_thread_that_races(monkeypatch):
    """numba's own ``FakeCUDAShared.array``: threads that miss at once each make an
    array (if numba fixes this, the lock in tests/cuda_simulator.py can go)."""
    class Shared(kernelapi.FakeCUDAShared):
        array = getattr(kernelapi.FakeCUDAShared.array, "__wrapped__", kernelapi.FakeCUDAShared.array)

    shared = Shared(0)
    monkeypatch.setattr(kernelapi, "np", _SlowNumpy())
    got = _arrays_from_threads(shared)
    assert len({id(a) for a in got}) > 1


def test_under_the_lock_every_thread_of_a_block_gets_one_shared_array(monkeypatch):
    class Shared(kernelapi.FakeCUDAShared):
        array = getattr(kernelapi.FakeCUDAShared.array, "__wrapped__", kernelapi.FakeCUDAShared.array)

    cuda_simulator.shared_array_under_a_lock(Shared)
    shared = Shared(0)
    monkeypatch.setattr(kernelapi, "np", _SlowNumpy())
    got = _arrays_from_threads(shared)
    assert len({id(a) for a in got}) == 1
    assert got[0].shape == (4,) and got[0].dtype == np.int64
    # another line, another array (the key stays numba's: file and line)
    other = shared.array(4, np.int64)
    assert other is not got[0]
