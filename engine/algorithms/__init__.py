"""One module per matching algorithm (DESIGN.md §6).

A matcher is built from a compiled :class:`~engine.compile.Segment` and
answers ``match(batch, pattern_truth, alive) -> (event index, subscription
position)`` pairs, ascending by event then position.
"""

from __future__ import annotations

from engine.errors import BackendUnavailable

#: every algorithm bexmatch names (DESIGN.md §3); IMPLEMENTED says which run
ALGORITHMS = ("scan", "opindex", "pstbloom", "psthash", "betree", "apcm", "atree")


def matcher_class(algorithm: str, backend: str):
    """The matcher class for ``algorithm`` on ``backend``, or a clear error."""
    from engine.algorithms.opindex import OpIndexMatcher
    from engine.algorithms.opindex_cuda import OpIndexCudaMatcher
    from engine.algorithms.scan import ScanMatcher
    from engine.algorithms.scan_cuda import ScanCudaMatcher

    implemented = {("scan", "cpu"): ScanMatcher, ("scan", "cuda"): ScanCudaMatcher,
                   ("opindex", "cpu"): OpIndexMatcher, ("opindex", "cuda"): OpIndexCudaMatcher}
    if algorithm not in ALGORITHMS:
        raise BackendUnavailable(f"unknown algorithm {algorithm!r}; algorithms are {', '.join(ALGORITHMS)}")
    found = implemented.get((algorithm, backend))
    if found is None:
        runs = sorted(a for a, b in implemented if b == backend)
        raise BackendUnavailable(f"algorithm {algorithm!r} is not implemented for backend {backend!r} yet; "
                                 f"implemented there: {', '.join(runs) or 'none'}")
    return found


def default_algorithm(backend: str) -> str:
    """The best implemented algorithm on ``backend``."""
    for algorithm in ("opindex", "scan"):
        try:
            matcher_class(algorithm, backend)
            return algorithm
        except BackendUnavailable:
            continue
    raise BackendUnavailable(f"no algorithm is implemented for backend {backend!r} yet")
