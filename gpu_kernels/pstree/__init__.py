"""PS-Tree kernels (Ji and Jacobsen, PVLDB 12(3) 2018): PSTBloom and PSTHash, CPU and CUDA twins side by side.

* :mod:`gpu_kernels.pstree.layout` -- the structures both twins read (the
  flat PS-Trees, PSTBloom's lists and signatures, PSTHash's hash table) and
  the functions both compile from one source (the binary search over a
  PS-Tree's boundaries, the Bloom and key hashes);
* :mod:`gpu_kernels.pstree.cpu` -- the construction helpers, and the
  matching kernels of PSTBloom (§5) and PSTHash (§6) on every core (numba);
* :mod:`gpu_kernels.pstree.cuda` -- locating, PSTBloom and PSTHash matching
  on the device (numba-cuda).

Importing the package (or any of its modules) loads no ``numba.cuda``.
"""
