"""What a benchmark can run: the registered algorithms
(:mod:`engine.algorithms.registry`, read when asked, so that one registered
at runtime is included) and the bench's own variants of them."""

from __future__ import annotations

from engine.algorithms import registry
from engine.index import Index

#: ablations measured next to the algorithms: bench name -> (algorithm, Index options)
VARIANTS = {"opindex-bs": ("opindex", {"variant": "bs"})}   # OpIndex-BS: no segments, no signatures


def names() -> tuple[str, ...]:
    """Every name a benchmark takes: the registered algorithms, then the
    variants of registered ones."""
    registered = registry.names()
    return (*registered, *(name for name, (base, _) in VARIANTS.items() if base in registered))


def implemented_algorithms(backends=("cpu",)) -> list[str]:
    """The registered algorithms implemented on at least one of ``backends``."""
    return [a.name for a in registry.algorithms() if any(b in a.backends for b in backends)]


def matcher_class(name: str, backend: str):
    """The matcher class behind bench name ``name`` on ``backend``:
    BackendUnavailable for an unknown name or an unimplemented backend."""
    return registry.get(VARIANTS.get(name, (name,))[0]).matcher_class(backend)


def new_index(name: str, backend: str) -> Index:
    """An empty index of bench name ``name`` (a variant: its algorithm with its options)."""
    base, options = VARIANTS.get(name, (name, None))
    return Index(algorithm=base, backend=backend, options=options)
