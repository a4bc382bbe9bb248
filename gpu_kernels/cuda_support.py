"""Plumbing shared by every numba-CUDA twin (docs/architecture.md#backends-and-kernels): lazy access to
``numba.cuda``, launch geometry, device arrays and free device memory.

Nothing here touches CUDA at import time.  ``numba.cuda`` is imported on
first use only -- so ``import engine`` costs nothing on a machine without a
GPU (or without the CUDA Python bindings), and ``NUMBA_ENABLE_CUDASIM`` is
read as late as possible.

**How a kernel module uses this.**  numba's CUDA simulator runs a kernel as
plain Python after swapping every *module global* bound to ``numba.cuda``
for its fake module; a kernel that reaches ``cuda`` through a local name
would see the real module and fail.  So each kernel module keeps a module
global ``cuda = None`` and binds it in its (cached) kernel builder::

    cuda = None

    @functools.cache
    def _kernels():
        global cuda
        cuda = cuda_support.load_cuda()

        def kernel(...):
            x, y = cuda.grid(2)          # the module global: swappable
            ...
        return cuda.jit(kernel)

**Device arrays.**  On a GPU they are CuPy arrays (CuPy is the array glue:
allocation, cumsum, concatenation); numba kernels take them through the CUDA
Array Interface.  Under the simulator NumPy arrays stand in for them (the
simulated kernels take NumPy arrays and copy them in and out).
"""

from __future__ import annotations

import contextlib
import functools
import os
import sys
import time
from dataclasses import dataclass

import numpy as np

#: bytes of device memory the simulator pretends to have free (a matcher's
#: ``device_memory`` option overrides it); small, so that chunking is real
SIMULATED_FREE_MEMORY = 64 << 20


def load_cuda():
    """``numba.cuda`` (the simulator's under ``NUMBA_ENABLE_CUDASIM=1``);
    imported on first call.  Raises ImportError where numba-cuda or the CUDA
    Python bindings are missing.

    numba warns about every launch of fewer blocks than the GPU has SMs;
    small batches and single events launch small grids on purpose, so the
    warning is turned off unless ``NUMBA_CUDA_LOW_OCCUPANCY_WARNINGS`` says
    otherwise."""
    from numba import config, cuda
    if "NUMBA_CUDA_LOW_OCCUPANCY_WARNINGS" not in os.environ:
        config.CUDA_LOW_OCCUPANCY_WARNINGS = 0
    return cuda


def simulated() -> bool:
    """True when numba's CUDA simulator is (or, once imported, will be) in use."""
    module = sys.modules.get("numba.cuda")
    if module is not None and hasattr(module, "is_available"):
        return module.is_available.__module__.endswith("simulator_init")
    return os.environ.get("NUMBA_ENABLE_CUDASIM", "0") not in ("", "0")


def array_module():
    """The namespace of device arrays: CuPy on a GPU, NumPy in the simulator."""
    if simulated():
        return np
    import cupy
    return cupy


# ------------------------------------------------------------------ launches
@dataclass(frozen=True)
class LaunchConfig:
    """Launch geometry of the 2-D grid-stride kernels.

    ``block``: threads per block (x, y).  ``max_grid``: the most blocks per
    dimension; work beyond block × grid is covered by each thread's
    grid-stride loop, so any grid is correct and a tiny one keeps the
    simulator (about a millisecond per simulated thread) fast.
    ``compaction_tile``: hit-matrix columns one compaction thread owns."""

    block: tuple[int, int] = (256, 1)
    max_grid: tuple[int, int] = (1 << 16, 65535)
    compaction_tile: int = 1024

    def __post_init__(self):
        if len(self.block) != 2 or len(self.max_grid) != 2 or min(*self.block, *self.max_grid) < 1 \
                or self.block[0] * self.block[1] > 1024 or self.compaction_tile < 1:
            raise ValueError(f"bad launch configuration {self}: block and max_grid are two positive ints, "
                             f"at most 1024 threads per block, compaction_tile >= 1")

    def grid(self, n_x: int, n_y: int) -> tuple[tuple[int, int], tuple[int, int]]:
        """(grid, block) covering ``n_x`` × ``n_y`` work items (at least one
        block).  Where ``n_x`` is narrower than the block, threads move from
        x to y (same threads per block), so narrow rows leave none idle."""
        bx, by = self.block
        while bx > 1 and 2 * n_x <= bx:
            bx //= 2
            by *= 2
        gx = min(max(1, -(-n_x // bx)), self.max_grid[0])
        gy = min(max(1, -(-n_y // by)), self.max_grid[1])
        return (gx, gy), (bx, by)


#: real GPU: wide blocks along subscriptions (coalesced hit-row writes)
GPU_LAUNCH = LaunchConfig()
#: simulator: 4 blocks of 8 threads; the grid-stride loops do the rest
SIMULATOR_LAUNCH = LaunchConfig(block=(4, 2), max_grid=(2, 2), compaction_tile=4)


def default_launch() -> LaunchConfig:
    return SIMULATOR_LAUNCH if simulated() else GPU_LAUNCH


# ------------------------------------------------------------- device arrays
def is_device_array(x) -> bool:
    """An array the caller already placed on the device: anything with the
    CUDA Array Interface (CuPy, numba device arrays); under the simulator,
    what its ``cuda.to_device`` returns.  NumPy arrays are host arrays."""
    if simulated():
        return _is_fake_device_array(x) or interface_of(x) is not None
    return hasattr(x, "__cuda_array_interface__")


def _is_fake_device_array(x) -> bool:
    return type(x).__name__ == "FakeCUDAArray" and hasattr(x, "copy_to_host")


def interface_of(x) -> dict | None:
    """``x``'s CUDA Array Interface (a dict), None where it has none --
    or where reading it raises: cuDF's raises for a column it cannot
    export (strings, and in its later versions a column with nulls)."""
    if not hasattr(type(x), "__cuda_array_interface__") and "__cuda_array_interface__" not in getattr(
            x, "__dict__", {}):
        return None
    try:
        interface = x.__cuda_array_interface__
    except Exception:       # noqa: BLE001 -- the producer's own "cannot export this"
        return None
    return interface if isinstance(interface, dict) else None


class _Interface:
    """An object exposing a given CUDA Array Interface, so that CuPy reads a
    producer's memory as that dict describes it (without its ``mask``,
    which CuPy refuses); ``owner``, the producer, lives as long as it."""

    def __init__(self, interface: dict, owner):
        self.__cuda_array_interface__ = interface
        self.owner = owner


def interface_array(interface: dict, owner):
    """A device array over the memory that ``interface`` (a CUDA Array
    Interface dict; its ``mask`` is not read) describes, without a copy on
    a GPU; ``owner`` is the producer, kept alive with the array.  Under the
    simulator a producer's memory is host memory (the simulator has no
    other): it is copied out through its address."""
    interface = {key: value for key, value in interface.items() if key != "mask"}
    if not simulated():
        import cupy
        return cupy.asarray(_Interface(interface, owner))
    import ctypes
    dtype, shape = np.dtype(interface["typestr"]), tuple(interface["shape"])
    strides = interface.get("strides") or None
    pointer = interface["data"][0]
    if 0 in shape:
        return np.zeros(shape, dtype)
    if strides is not None and min(strides) < 0:
        raise ValueError("the simulator reads an interface with positive strides only")
    if strides is None:
        extent = int(np.prod(shape)) * dtype.itemsize
    else:
        extent = sum((n - 1) * stride for n, stride in zip(shape, strides)) + dtype.itemsize
    memory = (ctypes.c_char * extent).from_address(pointer)
    return np.ndarray(shape, dtype, buffer=memory, strides=strides).copy()


def to_device(x, dtype=None):
    """A device copy of host array ``x`` (contiguous, optionally cast);
    zero-length arrays get one padding element so that no kernel argument
    is a null pointer (kernels never read past their logical bounds)."""
    host = np.ascontiguousarray(x, dtype=dtype)
    if host.size == 0 and host.ndim == 1:
        host = np.zeros(1, dtype=host.dtype)
    if simulated():
        return host.copy()
    import cupy
    return cupy.asarray(host)


def as_device(x):
    """``x`` as a device array without copying where it already is one
    (CuPy, numba device arrays, anything with the CUDA Array Interface);
    host arrays are copied over."""
    if simulated():
        if _is_fake_device_array(x):
            return x.copy_to_host()
        interface = interface_of(x)
        if interface is not None:
            if interface.get("mask") is not None:       # as CuPy does
                raise ValueError("a masked array (CUDA Array Interface mask) is not an array of values")
            return interface_array(interface, x)
        return np.asarray(x)
    import cupy
    return cupy.asarray(x)


def to_host(x) -> np.ndarray:
    """A NumPy array from a device (or host) array."""
    if isinstance(x, np.ndarray):
        return x
    if _is_fake_device_array(x) or (hasattr(x, "copy_to_host") and not hasattr(x, "get")):
        return x.copy_to_host()
    if hasattr(x, "get"):       # CuPy
        return x.get()
    return np.asarray(x)


def synchronize() -> None:
    """Wait for the device's queued work (nothing to wait for under the simulator)."""
    if not simulated():
        load_cuda().synchronize()


class PhaseTimer:
    """Seconds spent per named phase of device work, each phase bracketed
    by device synchronisations -- for benchmarks only: the
    synchronisations cost overlap.  ``with timer("kernel"): ...``; a
    disabled timer (``None`` times) does nothing."""

    def __init__(self, enabled: bool = True):
        self.times: dict[str, float] | None = {} if enabled else None

    @contextlib.contextmanager
    def __call__(self, name: str):
        if self.times is None:
            yield
            return
        synchronize()
        start = time.perf_counter()
        yield
        synchronize()
        self.times[name] = self.times.get(name, 0.0) + time.perf_counter() - start


def exclusive_cumsum(counts):
    """Device ``[0, c0, c0 + c1, ...]`` (int64, one longer than ``counts``)."""
    xp = array_module()
    flat = counts.reshape(-1)
    out = xp.zeros(flat.shape[0] + 1, dtype=np.int64)
    if flat.shape[0]:
        xp.cumsum(flat, out=out[1:])
    return out


def free_device_memory() -> int | None:
    """Bytes of device memory free for new allocations (the driver's free
    memory plus what CuPy's pool holds unused); None under the simulator."""
    if simulated():
        return None
    free, _total = load_cuda().current_context().get_memory_info()
    try:
        import cupy
        free += cupy.get_default_memory_pool().free_bytes()
    except ImportError:
        pass
    return int(free)


@functools.cache
def device_name() -> str:
    if simulated():
        return "numba CUDA simulator"
    device = load_cuda().get_current_device()
    name = device.name
    return name.decode() if isinstance(name, bytes) else str(name)
