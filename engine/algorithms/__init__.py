"""The matching algorithms, one module per paper, behind one contract.

:mod:`engine.algorithms.base` is the contract every matcher implements,
:mod:`engine.algorithms.registry` the list of algorithms and
:mod:`engine.algorithms.options` their options.
"""

from __future__ import annotations

from engine.algorithms.registry import default_algorithm, get, matcher_class, names, register

#: the algorithms bexmatch ships (``registry.names()`` is the live list)
ALGORITHMS = names()

__all__ = ["ALGORITHMS", "default_algorithm", "get", "matcher_class", "names", "register"]
