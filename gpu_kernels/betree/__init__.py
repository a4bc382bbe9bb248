"""BE-Tree kernels (Sadoghi, Jacobsen, SIGMOD 2011), CPU and CUDA twins side by side.

* :mod:`gpu_kernels.betree.layout` -- the flattened tree matched by both
  twins (:class:`~gpu_kernels.betree.layout.BETreeArrays`), the
  order-preserving 64-bit keys of the clustering directory, and the checks
  of a structure read from a file;
* :mod:`gpu_kernels.betree.tree` -- the dynamic tree (insertion with space
  partitioning and space clustering, deletion with the merge rule, the
  flattening into :class:`~gpu_kernels.betree.layout.BETreeArrays` and
  back), numba;
* :mod:`gpu_kernels.betree.cpu` -- matching on every core (numba);
* :mod:`gpu_kernels.betree.cuda` -- matching on the device (numba-cuda).

Importing the package (or any of its modules) loads no ``numba.cuda``.
"""
