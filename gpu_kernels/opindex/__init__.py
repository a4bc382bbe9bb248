"""OpIndex kernels (Zhang, Chan, Tan, PVLDB 2014, §4-§7), CPU and CUDA twins side by side.

* :mod:`gpu_kernels.opindex.layout` -- the structure as one struct of
  arrays (:class:`~gpu_kernels.opindex.layout.OpIndexArrays`), its layout,
  the signature hashes both twins share, and the checks of a structure
  read from a file;
* :mod:`gpu_kernels.opindex.cpu` -- building, merging and matching on
  every core (numba);
* :mod:`gpu_kernels.opindex.cuda` -- matching on the device (numba-cuda),
  over the device twin of the same struct.

Importing the package (or any of its modules) loads no ``numba.cuda``.
"""
