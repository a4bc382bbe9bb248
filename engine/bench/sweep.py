"""Sweeps: one generator parameter varied, everything else fixed, each
workload benchmarked -- the shape of OpIndex Fig. 10 (throughput and memory
against N, Γmax, m, θ1, σ, Zipf)."""

from __future__ import annotations

import inspect
import sys

from tqdm import tqdm

from engine.bench.measure import DEFAULT_SCALE, run_benchmark

#: generator -> {alias: keyword argument}; the OpIndex paper's symbols (N, Γmax, m, θ, σ) included
SWEEP_ALIASES = {
    "opindex": {"N": "n_subs", "n": "n_subs", "subs": "n_subs", "d": "dims", "Γmax": "gamma_max",
                "gmax": "gamma_max", "Γ": "gamma_max", "θ": "theta", "θ1": "theta", "theta1": "theta",
                "σ": "cardinality", "sigma": "cardinality", "card": "cardinality", "events": "n_events"},
    "begen": {"N": "n_subs", "n": "n_subs", "subs": "n_subs", "d": "dims", "σ": "cardinality",
              "sigma": "cardinality", "card": "cardinality", "θ": "eq_share", "theta": "eq_share",
              "m": "event_size", "p": "match_prob", "s": "similarity", "events": "n_events"},
}
#: the standard workload whose full-scale parameters are a sweep's defaults
SWEEP_BASE = {"opindex": "W3", "begen": "W1"}
#: int parameters whose default is None
_INT_PARAMS = {"n_events", "sub_size_max", "filler"}


def _generator(name: str):
    from engine import workloads as generators
    if name not in SWEEP_BASE:
        raise ValueError(f"unknown generator {name!r}; generators are {', '.join(SWEEP_BASE)}")
    return generators.opindex_gen if name == "opindex" else generators.begen


def sweep_parameters(generator: str) -> list[str]:
    """The keyword arguments of ``generator`` a sweep may vary."""
    return [p for p in inspect.signature(_generator(generator)).parameters if p not in ("seed", "name")]


def resolve_sweep_param(generator: str, param: str) -> str:
    """The generator keyword behind ``param`` (``N`` -> ``n_subs``, ``θ`` -> ``theta``...)."""
    valid = sweep_parameters(generator)
    aliases = SWEEP_ALIASES[generator]
    for candidate in (param, aliases.get(param), aliases.get(str(param).lower()), str(param).lower()):
        if candidate in valid:
            return candidate
    raise ValueError(f"{generator} has no parameter {param!r}; parameters: {', '.join(valid)}; "
                     f"aliases: {', '.join(f'{a}={k}' for a, k in aliases.items())}")


def coerce_value(generator: str, param: str, value):
    """A swept value as the generator wants it: text from the command line
    becomes int, float, None or bool; integral floats become ints for int
    parameters."""
    if isinstance(value, str):
        text = value.strip()
        low = text.lower()
        if low in ("none", "null", "uniform"):
            value = None
        elif low in ("true", "false"):
            value = low == "true"
        else:
            try:
                value = int(text)
            except ValueError:
                try:
                    value = float(text)
                except ValueError:
                    value = text
    default = inspect.signature(_generator(generator)).parameters[param].default
    integer = isinstance(default, int) and not isinstance(default, bool) or param in _INT_PARAMS
    if integer and isinstance(value, float) and value.is_integer():
        value = int(value)
    return value


def sweep_base(generator: str, scale: float = DEFAULT_SCALE, base_params: dict | None = None,
               n_events: int | None = None) -> dict:
    """The generator keywords of a sweep: the standard workload's
    (:data:`SWEEP_BASE`) with its subscriptions times ``scale``, overridden
    by ``base_params`` (aliases allowed)."""
    from engine import workloads as generators
    standard = SWEEP_BASE[generator]
    base = dict(generators.STANDARD_WORKLOADS[standard][2])
    base["n_subs"] = max(1, round(base["n_subs"] * scale))
    default_events = generators.DEFAULT_EVENTS_OF.get(standard, generators.DEFAULT_EVENTS)
    base["n_events"] = max(100, round(default_events * scale)) if n_events is None else int(n_events)
    for key, value in (base_params or {}).items():
        key = resolve_sweep_param(generator, key)
        base[key] = coerce_value(generator, key, value)
    return base


def sweep(param: str, values, generator: str = "opindex", base_params: dict | None = None, algorithms=None,
          backends=("cpu",), *, scale: float = DEFAULT_SCALE, events_limit=None, seed: int = 0,
          progress: bool = True, **options) -> list[dict]:
    """Vary one generator parameter (``N``/``n_subs``, ``dims``, ``Γmax``,
    ``m``, ``θ``, ``σ``, ``zipf``...; see :data:`SWEEP_ALIASES`) over
    ``values``, everything else as in :func:`sweep_base`, and benchmark each
    workload with :func:`~engine.bench.measure.run_benchmark` (``options``:
    its keywords).  Rows carry ``sweep_param`` (the generator keyword) and
    ``sweep_value``."""
    generate = _generator(generator)
    key = resolve_sweep_param(generator, param)
    base = sweep_base(generator, scale, base_params, events_limit)
    values = [coerce_value(generator, key, v) for v in values]
    if not values:
        raise ValueError("a sweep needs at least one value")
    rows = []
    for value in tqdm(values, desc=f"sweep {key}", unit="value", disable=not progress, file=sys.stderr):
        kwargs = dict(base, **{key: value})
        workload = generate(**kwargs, seed=seed, name=f"{generator} {key}={value}")
        rows += run_benchmark([workload], algorithms, backends, events_limit=events_limit, progress=progress,
                              extra=dict(sweep_param=key, sweep_value=value), **options)
    return rows
