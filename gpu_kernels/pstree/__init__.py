"""PS-Tree kernels (Ji and Jacobsen, PVLDB 12(3) 2018): PSTBloom and PSTHash on the CPU.

* :mod:`gpu_kernels.pstree.cpu` -- the flat PS-Tree (predicate spaces per
  attribute as sorted boundaries), its construction helpers, and the
  matching kernels of PSTBloom (§5) and PSTHash (§6) on every core (numba).

There is no CUDA twin yet; importing the package loads no ``numba.cuda``.
"""
