"""``engine.warmup()``: compile, or load from numba's on-disk cache, every
kernel an algorithm's matching needs, before the first real batch.  (The
module is not called ``warmup``: importing it would rebind
``engine.warmup`` from the function to the module.)

Without it the first ``match_batch`` of an algorithm in a process pays for
that (seconds with a warm numba cache, up to a minute or so with a cold
one -- a fresh install); a service calls this at start-up instead.  Each
algorithm gets a tiny index over every operator and connective, built,
merged with an update (the derived path) and matched one event at a time
and in a batch.
"""

from __future__ import annotations

import logging
import time

logger = logging.getLogger(__name__)

#: every operator family and connective, strings and numbers, a pattern of each kind
EXPRESSIONS = [
    "p <= 580 AND c = 'silver' AND b IN ('a', 'b')",
    "c = 'red' OR p > 1000",
    "NOT (b LIKE 'x%') AND p IS NOT NULL",
    "p BETWEEN 1 AND 2 XOR c MATCHES '^r'",
    "q IS NULL AND p NOT IN (3, 4) AND flag = TRUE",
    "c NOT BETWEEN 'a' AND 'm' XNOR p != 7",
    "p < 0 OR p >= 9 OR b NOT LIKE '%y' AND c NOT MATCHES 'e$'",
    # list attributes: their operators and the list kernels
    "segs ONE OF ('a', 'b') OR deals ALL OF (1, 2)",
    "segs NONE OF ('z') AND 3 IN deals",
    "deals IS NOT EMPTY XOR 'a' NOT IN segs",
    "NOT (deals ALL OF (1, 2)) AND 4 NOT IN deals OR segs IS EMPTY",
]
EVENTS = [{"p": 550, "c": "silver", "b": "a", "segs": ["a", "b"], "deals": [1, 2, 3]}, {"c": "red", "segs": []},
          {"p": 1.5, "c": "rose", "flag": True, "deals": [3]}, {"q": 1, "b": "xy"}, {},
          {"p": 7, "c": "z", "flag": False, "segs": ["z"]}, {"p": 3, "deals": []}, {"c": "n", "b": "b"}]


def warmup(algorithms=None, backend: str | None = None) -> dict[str, float]:
    """Warm every algorithm registered on ``backend`` (default: the best
    available here), or those named; returns the seconds each took."""
    from engine import Index
    from engine.algorithms import registry
    from engine.backend import resolve_backend

    backend = resolve_backend(backend)
    names = list(algorithms) if algorithms is not None else list(registry.names(backend))
    took = {}
    for name in names:
        started = time.perf_counter()
        index = Index(algorithm=name, backend=backend)
        index.add_many(list(range(len(EXPRESSIONS))), EXPRESSIONS)
        index.merge()
        index.match_batch(EVENTS)
        index.add(len(EXPRESSIONS), "p > 2 AND c LIKE '%e%'")
        index.remove(0)
        index.merge()                                    # the derived matcher of a merge
        for event in EVENTS[:2]:
            index.match(event)
        index.match_batch(EVENTS, output="arrow")
        took[name] = time.perf_counter() - started
        logger.info("warmed %s/%s in %.2f s", name, backend, took[name])
    return took


__all__ = ["warmup"]
