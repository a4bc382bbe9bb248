"""What a benchmark can run: the registered algorithms
(:mod:`engine.algorithms.registry`, read when asked, so that one registered
at runtime is included), the bench's own variants of them, and the
algorithm options a run passes (``bexmatch bench --option ALG.NAME=VALUE``).

A *variant* is a registered algorithm with some options fixed, benchmarked
under its own name next to it (the papers' ablations).  It is offered only
while its algorithm is registered, so the A-PCM ones appear as soon as
``apcm`` is.

How options reach a run of bench name ``N`` (:func:`options_of`, then
:func:`new_index`), later ones winning:

1. the options given to its algorithm (``--option apcm.cluster_size=4``),
   except those the variant fixes -- they are what the variant *is*;
2. the variant's fixed options (:data:`VARIANTS`);
3. the options given to ``N`` itself (``--option apcm-cu.reorder=true``):
   asked for by name, so they override even the variant's definition.
"""

from __future__ import annotations

import dataclasses

from engine.algorithms import registry
from engine.errors import BackendUnavailable
from engine.index import Index

#: ablations measured next to the algorithms: bench name -> (algorithm, the Index options it fixes)
VARIANTS = {
    # OpIndex-BS (OpIndex §7): no segments, no signatures
    "opindex-bs": ("opindex", {"variant": "bs"}),
    # A-PCM §VII-A: the macro experiments' baselines on BE-Tree's bitmap-encoded events
    "apcm-bitmap": ("apcm", {"variant": "bitmap"}),
    "apcm-parallel": ("apcm", {"variant": "parallel"}),
    # A-PCM §VII-B, Fig. 8: the compressed-matching optimisations one by one
    "apcm-c": ("apcm", {"variant": "pcm", "reorder": False, "unroll": False, "parallel_paths": False}),
    "apcm-cu": ("apcm", {"variant": "pcm", "reorder": False, "parallel_paths": False}),
    "apcm-cupp": ("apcm", {"variant": "pcm", "reorder": False}),
    "apcm-cuppre": ("apcm", {"variant": "pcm"}),
    # A-PCM over OpIndex's lists (cpu): adaptive, every cluster compressed, per event
    "apcm-opindex": ("apcm", {"over": "opindex"}),
    "apcm-opindex-pcm": ("apcm", {"over": "opindex", "variant": "pcm"}),
    "apcm-opindex-parallel": ("apcm", {"over": "opindex", "variant": "parallel"}),
    # A-Tree §6.3: Fig. 8's design options, Fig. 9's construction options, Fig. 10's matching optimisations
    "atree-noshare": ("atree", {"sharing": False}),
    "atree-binary": ("atree", {"binary": True}),
    "atree-plain": ("atree", {"reorganize": False, "self_adjust": False}),
    "atree-reorg": ("atree", {"self_adjust": False}),
    "atree-adjust": ("atree", {"reorganize": False}),
    "atree-nozs": ("atree", {"zero_suppression": False}),
    "atree-nopod": ("atree", {"on_demand": False}),
    "atree-noopt": ("atree", {"zero_suppression": False, "on_demand": False}),
    "atree-perevent": ("atree", {"lanes": 1}),
    # A-Tree on cuda: one launch walking every level, against the default launch per level (its launches' cost)
    "atree-persistent": ("atree", {"kernel": "persistent"}),
    # PSTHash (PS-Tree §6) and PSTBloom (§5) as the paper runs them, beside the default 64 events a group
    "psthash-perevent": ("psthash", {"lanes": 1}),
    "pstbloom-perevent": ("pstbloom", {"lanes": 1}),
}
#: what each variant is, for ``bexmatch bench --help``
VARIANT_TITLES = {
    "opindex-bs": "OpIndex-BS: binary search only, no segments or signatures",
    "apcm-bitmap": "A-PCM's 'Bitmap': BE-Tree on bitmap-encoded events, one event at a time, one thread",
    "apcm-parallel": "A-PCM's 'Parallel': the same, one event per core",
    "apcm-c": "Fig. 8 'C': compressed events, clusters in arrival order, leaf scans inside the traversal",
    "apcm-cu": "Fig. 8 'C-U': + traversal unrolling",
    "apcm-cupp": "Fig. 8 'C-U-PP': + parallel path traversal (Fig. 8(a) runs it on sorted_stream=true)",
    "apcm-cuppre": "Fig. 8 'C-U-PP-RE': + online stream re-ordering, every cluster compressed",
    "apcm-opindex": "A-PCM over OpIndex's lists: re-ordered clusters counted compressed, the others per event",
    "apcm-opindex-pcm": "A-PCM over OpIndex's lists, every cluster compressed (C-U-PP-RE's counterpart)",
    "apcm-opindex-parallel": "OpIndex's counting over each event's bitmap, one event per core (no compression)",
    "atree-noshare": "A-Tree Fig. 8 'multitree not supporting sharing': every expression its own nodes",
    "atree-binary": "A-Tree Fig. 8 'binary tree index supporting sharing': two-child AND/OR nodes",
    "atree-plain": "A-Tree Fig. 9 (1): neither reorganisation nor self-adjustment",
    "atree-reorg": "A-Tree Fig. 9 (2): expression reorganisation only",
    "atree-adjust": "A-Tree Fig. 9 (3): self-adjustment only",
    "atree-nozs": "A-Tree Fig. 10: without the zero suppression filter (FALSE propagates too)",
    "atree-nopod": "A-Tree Fig. 10: without propagation on demand (an AND reached from every child)",
    "atree-noopt": "A-Tree Fig. 10: neither matching optimisation",
    "atree-perevent": "A-Tree one event at a time (Algorithm 6 as the paper runs it), not 64 events a node word",
    "atree-persistent": "A-Tree on cuda with one persistent launch a chunk, a block per event walking the levels, "
                        "not a launch per level",
    "psthash-perevent": "PSTHash one event at a time (Algorithm 7 as the paper runs it), not 64 events a group",
    "pstbloom-perevent": "PSTBloom one event at a time, its signatures probed (Algorithm 5 as the paper runs it), "
                         "not 64 events a group",
}
#: an option value chosen per workload from its generating parameters
AUTO = "auto"


def _max_cap_for_workload(params: dict) -> int:
    from engine.algorithms.options import max_cap_for
    if params.get("match_prob") is None:
        raise ValueError("max_cap=auto follows BE-Tree Table 4 from the workload's match_prob: "
                         "this workload has none (a BE-Gen workload has)")
    return max_cap_for(float(params["match_prob"]))


#: (algorithm, option) -> its value from a workload's params, for the value AUTO;
#: A-PCM sizes its BE-Tree clusters by the same guideline (A-PCM §VII-A)
AUTOMATIC = {("betree", "max_cap"): _max_cap_for_workload, ("apcm", "max_cap"): _max_cap_for_workload}


def base_of(name: str) -> str:
    """The registered algorithm behind bench name ``name``."""
    return VARIANTS.get(name, (name,))[0]


def fixed_options(name: str) -> dict:
    """The options bench name ``name`` fixes (empty for an algorithm)."""
    return dict(VARIANTS[name][1]) if name in VARIANTS else {}


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
    BackendUnavailable for an unknown name, an unimplemented backend, or a
    variant fixing an option of another backend (``atree-persistent`` on
    ``cpu``)."""
    cls = registry.get(base_of(name)).matcher_class(backend)
    reason = foreign_reason(name, backend)
    if reason is not None:
        raise BackendUnavailable(reason)
    return cls


def foreign_reason(name: str, backend: str) -> str | None:
    """Why bench name ``name`` does not run on ``backend`` although its
    algorithm may: a variant fixing an option of another backend
    (``atree-persistent`` on ``cpu``: a skipped row there); None when it
    fixes none."""
    algorithm = registry.get(base_of(name))
    fields = {f.name: f for f in dataclasses.fields(algorithm.options)}
    other = sorted(key for key in fixed_options(name) if backend not in fields[key].metadata["backends"])
    if not other:
        return None
    return (f"variant {name!r} fixes option(s) {other} of algorithm {algorithm.name!r}, which "
            f"apply to backend(s) {', '.join(fields[other[0]].metadata['backends'])}, not {backend!r}")


def runs_on(name: str, backends) -> list[str]:
    """The ``backends`` whose options bench name ``name``'s fixed ones fit
    (the others give it a skipped row); ValueError naming the variant when
    none does -- it would measure nothing."""
    backends = list(backends)
    fitting = [backend for backend in backends if foreign_reason(name, backend) is None]
    if backends and not fitting:
        raise ValueError(foreign_reason(name, backends[0])
                         + (f" (nor {', '.join(map(repr, backends[1:]))})" if len(backends) > 1 else ""))
    return fitting


def parse_option_value(text: str):
    """An option value from the command line: ``none``, ``true`` and
    ``false`` (any case), an int, a float, else the text itself."""
    raw = str(text).strip()
    low = raw.lower()
    if low in ("none", "true", "false"):
        return None if low == "none" else low == "true"
    for kind in (int, float):
        try:
            return kind(raw)
        except ValueError:
            pass
    return raw


def options_of(name: str, algorithm_options: dict | None) -> dict:
    """The options a run of bench name ``name`` passes on top of its
    variant's fixed ones, from ``{bench name: {option: value}}`` (the
    module docstring gives the order): its algorithm's options but those the
    variant fixes, then its own."""
    algorithm_options = algorithm_options or {}
    own = dict(algorithm_options.get(name) or {})
    base = base_of(name)
    if base == name:
        return own
    fixed = fixed_options(name)
    inherited = {key: value for key, value in (algorithm_options.get(base) or {}).items() if key not in fixed}
    return {**inherited, **own}


def check_options(name: str, options: dict | None, backend: str = "cpu") -> None:
    """Refuse options bench name ``name`` does not take (TypeError /
    ValueError), before any work: they are checked together with the
    variant's fixed ones, as the index will get them; an :data:`AUTO` value
    must be one of :data:`AUTOMATIC`."""
    base = base_of(name)
    concrete = {}
    for key, value in (options or {}).items():
        if value == AUTO:
            if (base, key) not in AUTOMATIC:
                automatic = ", ".join(f"{a}.{k}" for a, k in AUTOMATIC) or "none"
                raise ValueError(f"{name}.{key}={AUTO}: only {automatic} can be chosen per workload")
        else:
            concrete[key] = value
    registry.get(base).make_options({**fixed_options(name), **concrete}, backend)


def resolve_options(name: str, options: dict | None, workload=None) -> dict:
    """``options`` of bench name ``name`` with each :data:`AUTO` value
    chosen from ``workload.params`` (e.g. ``betree`` ``max_cap``: BE-Tree
    Table 4 by the workload's matching probability)."""
    base = base_of(name)
    params = getattr(workload, "params", None) or {}
    return {key: AUTOMATIC[base, key](params) if value == AUTO else value
            for key, value in (options or {}).items()}


def new_index(name: str, backend: str, options: dict | None = None) -> Index:
    """An empty index of bench name ``name`` (a variant: its algorithm with
    its options), with ``options`` (resolved: no :data:`AUTO`) on top."""
    merged = {**fixed_options(name), **(options or {})}
    return Index(algorithm=base_of(name), backend=backend, options=merged or None)
