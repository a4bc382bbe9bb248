"""What a benchmark can run: the registered algorithms
(:mod:`engine.algorithms.registry`, read when asked, so that one registered
at runtime is included), the bench's own variants of them, and the
algorithm options a run passes (``bexmatch bench --option ALG.NAME=VALUE``)."""

from __future__ import annotations

from engine.algorithms import registry
from engine.index import Index

#: ablations measured next to the algorithms: bench name -> (algorithm, Index options)
VARIANTS = {"opindex-bs": ("opindex", {"variant": "bs"})}   # OpIndex-BS: no segments, no signatures
#: an option value chosen per workload from its generating parameters
AUTO = "auto"


def _max_cap_for_workload(params: dict) -> int:
    from engine.algorithms.options import max_cap_for
    if params.get("match_prob") is None:
        raise ValueError("max_cap=auto follows BE-Tree Table 4 from the workload's match_prob: "
                         "this workload has none (a BE-Gen workload has)")
    return max_cap_for(float(params["match_prob"]))


#: (algorithm, option) -> its value from a workload's params, for the value AUTO
AUTOMATIC = {("betree", "max_cap"): _max_cap_for_workload}


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


def check_options(name: str, options: dict | None, backend: str = "cpu") -> None:
    """Refuse options bench name ``name`` does not take (TypeError /
    ValueError), before any work; an :data:`AUTO` value must be one of
    :data:`AUTOMATIC`."""
    base = VARIANTS.get(name, (name,))[0]
    concrete = {}
    for key, value in (options or {}).items():
        if value == AUTO:
            if (base, key) not in AUTOMATIC:
                automatic = ", ".join(f"{a}.{k}" for a, k in AUTOMATIC) or "none"
                raise ValueError(f"{name}.{key}={AUTO}: only {automatic} can be chosen per workload")
        else:
            concrete[key] = value
    registry.get(base).make_options(concrete, backend)


def resolve_options(name: str, options: dict | None, workload=None) -> dict:
    """``options`` of bench name ``name`` with each :data:`AUTO` value
    chosen from ``workload.params`` (e.g. ``betree`` ``max_cap``: BE-Tree
    Table 4 by the workload's matching probability)."""
    base = VARIANTS.get(name, (name,))[0]
    params = getattr(workload, "params", None) or {}
    return {key: AUTOMATIC[base, key](params) if value == AUTO else value
            for key, value in (options or {}).items()}


def new_index(name: str, backend: str, options: dict | None = None) -> Index:
    """An empty index of bench name ``name`` (a variant: its algorithm with
    its options), with ``options`` (resolved: no :data:`AUTO`) on top."""
    base, fixed = VARIANTS.get(name, (name, None))
    merged = {**(fixed or {}), **(options or {})}
    return Index(algorithm=base, backend=backend, options=merged or None)
