"""Sweeps: one parameter varied, everything else fixed, each point
benchmarked -- the shape of OpIndex Fig. 10 (throughput and memory against
N, Γmax, m, θ1, σ, Zipf), BE-Tree Fig. 5-11 and A-PCM Fig. 8-9.

An *axis* of a sweep is either a generator parameter (``N``, ``dims``,
``similarity``...: a workload generated per value) or an algorithm option
written ``algorithm.option`` (``apcm.cluster_size``, ``betree.max_cap``:
one workload, the option set per value on that algorithm's index -- and on
its bench variants that do not fix it, see
:func:`engine.bench.algorithms.options_of`).  A sweep may have a second
axis, the *series* (``series=("similarity", [0.1, 0.7])``): every point of
the first axis is measured at each of its values, and the plot draws one
line per algorithm and series value (A-PCM Fig. 9: a parameter against
throughput, one line per stream similarity)."""

from __future__ import annotations

import inspect
import sys
from dataclasses import dataclass

from tqdm import tqdm

from engine.algorithms import registry
from engine.bench import algorithms as bench_algorithms
from engine.bench.measure import DEFAULT_SCALE, check_fits, run_benchmark

#: generator -> {alias: keyword argument}; the OpIndex paper's symbols (N, Γmax, m, θ, σ) included
SWEEP_ALIASES = {
    "opindex": {"N": "n_subs", "n": "n_subs", "subs": "n_subs", "d": "dims", "Γmax": "gamma_max",
                "gmax": "gamma_max", "Γ": "gamma_max", "θ": "theta", "θ1": "theta", "theta1": "theta",
                "σ": "cardinality", "sigma": "cardinality", "card": "cardinality", "events": "n_events"},
    "begen": {"N": "n_subs", "n": "n_subs", "subs": "n_subs", "d": "dims", "σ": "cardinality",
              "sigma": "cardinality", "card": "cardinality", "θ": "eq_share", "theta": "eq_share",
              "m": "event_size", "p": "match_prob", "s": "similarity", "events": "n_events"},
    # A-Tree §6.1 (Table 3): α is the subexpressions' Zipf exponent, the attributes' is attr_zipf
    "abe": {"N": "n_subs", "n": "n_subs", "subs": "n_subs", "d": "dims", "σ": "cardinality", "sigma": "cardinality",
            "card": "cardinality", "α": "alpha", "children": "fanout", "fan-out": "fanout", "m": "event_size",
            "events": "n_events"},
}
#: the standard workload whose full-scale parameters are a sweep's defaults
SWEEP_BASE = {"opindex": "W3", "begen": "W1", "abe": "W5"}
#: int parameters whose default is None
_INT_PARAMS = {"n_events", "sub_size_max", "filler"}


def _generator(name: str):
    from engine import workloads as generators
    if name not in SWEEP_BASE:
        raise ValueError(f"unknown generator {name!r}; generators are {', '.join(SWEEP_BASE)}")
    return {"opindex": generators.opindex_gen, "begen": generators.begen, "abe": generators.abe_gen}[name]


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
                     f"aliases: {', '.join(f'{a}={k}' for a, k in aliases.items())}; "
                     f"an algorithm option is written ALGORITHM.OPTION, e.g. betree.max_cap")


_BOOLEANS = {"true": True, "yes": True, "on": True, "1": True, True: True,
             "false": False, "no": False, "off": False, "0": False, False: False}


def coerce_value(generator: str, param: str, value):
    """A swept value as the generator wants it: text from the command line
    becomes int, float, None or bool (``"2..6"`` a range, for ABE-Gen's
    ``fanout``); integral floats become ints for int parameters."""
    default = inspect.signature(_generator(generator)).parameters[param].default
    if isinstance(value, str) and isinstance(default, tuple) and ".." in value:
        return tuple(coerce_value(generator, "n_subs", part) for part in value.split(".."))
    if isinstance(default, bool):       # a yes/no parameter: any other text would be a truthy string
        low = str(value).strip().lower() if not isinstance(value, bool) else value
        if low not in _BOOLEANS:
            raise ValueError(f"{param} is true or false, not {value!r}")
        return _BOOLEANS[low]
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


# -------------------------------------------------------------------- axes
@dataclass(frozen=True)
class Axis:
    """One axis of a sweep: a generator parameter (``algorithm`` None) or
    option ``key`` of bench name ``algorithm``, and its values."""

    #: what rows, tables and plots call it: the generator keyword, or "algorithm.option"
    label: str
    key: str
    values: tuple
    algorithm: str | None = None

    @property
    def is_option(self) -> bool:
        return self.algorithm is not None


def _backends(backend) -> list[str]:
    """``backend``: one backend, or the run's backends."""
    return [backend] if isinstance(backend, str) else list(backend)


def resolve_axis(generator: str, param: str, values, backend="cpu") -> Axis:
    """The axis ``param`` names with its ``values`` (text from the command
    line parsed): ``algorithm.option`` for an option of a bench name
    (each value checked by the algorithm's options class, before any work,
    on each of ``backend`` -- one or several -- that the bench name runs
    on), else a parameter of ``generator`` (:func:`resolve_sweep_param`).
    ValueError for an unknown name or a bad value."""
    values = list(values)
    if not values:
        raise ValueError(f"a sweep over {param} needs at least one value")
    name, dot, key = str(param).partition(".")
    if not dot:
        key = resolve_sweep_param(generator, param)
        return Axis(key, key, tuple(coerce_value(generator, key, v) for v in values))
    if name not in bench_algorithms.names():
        raise ValueError(f"{param}: no algorithm {name!r}; algorithms: {', '.join(bench_algorithms.names())}")
    fields = registry.get(bench_algorithms.base_of(name)).options.__dataclass_fields__
    if key not in fields:
        raise ValueError(f"{param}: {name} has no option {key!r}; its options: {', '.join(fields) or 'none'}")
    values = tuple(bench_algorithms.parse_option_value(v) if isinstance(v, str) else v for v in values)
    for each in bench_algorithms.runs_on(name, _backends(backend)):     # (a variant: where it is not skipped)
        for value in values:
            try:
                bench_algorithms.check_options(name, {key: value}, each)
            except TypeError as exc:      # an option of another backend, or a value of the wrong type
                raise ValueError(str(exc)) from None
    return Axis(f"{name}.{key}", key, values, name)


def _with_axis(algorithm_options: dict, axis: Axis, value) -> dict:
    """``algorithm_options`` with ``axis`` (an option axis) set to ``value``."""
    out = {name: dict(chosen) for name, chosen in algorithm_options.items()}
    out.setdefault(axis.algorithm, {})[axis.key] = value
    return out


@dataclass(frozen=True)
class SweepPlan:
    """A checked sweep: its axes, the generator keywords and what runs."""

    generator: str
    base: dict
    x: Axis
    series: Axis | None
    algorithms: list | None
    algorithm_options: dict


def plan_sweep(param: str, values, generator: str = "opindex", base_params: dict | None = None, algorithms=None,
               *, series: tuple | None = None, scale: float = DEFAULT_SCALE, n_events: int | None = None,
               algorithm_options: dict | None = None, backend="cpu", overridden_params: bool = True) -> SweepPlan:
    """Check a sweep before any work (the command line turns the ValueError
    into a usage error): the axes and their values, that no base parameter
    sets what an axis varies (it would be dropped), that no point needs more
    memory than the machine has (:func:`~engine.bench.measure.check_fits`),
    and that each option axis varies something -- at least one of
    ``algorithms`` takes the option (default: the algorithms of the option
    axes), none of them fixes it (a variant's definition would silently win
    over the swept value), and ``--option`` does not set it too; option
    values are checked on each of ``backend`` (one, or the run's) that an
    algorithm runs on.  ``series``: ``(param, values)``."""
    _generator(generator)
    base = sweep_base(generator, scale, base_params, n_events)
    x = resolve_axis(generator, param, values, backend)
    second = resolve_axis(generator, series[0], series[1], backend) if series is not None else None
    if second is not None and second.label == x.label:
        raise ValueError(f"the sweep and its series are both {x.label}")
    algorithm_options = {name: dict(chosen) for name, chosen in (algorithm_options or {}).items()}
    axes = [a for a in (x, second) if a is not None]
    if n_events is not None and any(a.key == "n_events" for a in axes):
        raise ValueError("the sweep varies the number of events: leave out --events (it would cut every point to it)")
    for key, value in (base_params or {}).items():     # (an axis's value wins at every point)
        resolved = resolve_sweep_param(generator, key)
        # (the command line refuses a --param the sweep overrides, which its user would think applied;
        # ``overridden_params``: the Python API keeps a notebook's base parameters, each point's axis value wins)
        if not overridden_params and any(a.key == resolved for a in axes if not a.is_option):
            raise ValueError(f"base parameter (--param) {key}={value}: the sweep varies {resolved}; leave it out")
        if resolved == "n_events" and n_events is not None:
            raise ValueError(f"base parameter (--param) {key}={value} and --events both set the number of events")
    generator_axes = [a for a in axes if not a.is_option]
    for key, what in (("n_subs", "subscriptions"), ("n_events", "events")):
        counts = [v for a in generator_axes if a.key == key for v in a.values] or [base.get(key)]
        for count in counts:
            if isinstance(count, int) and not isinstance(count, bool):
                check_fits(count, f"{what} (a point of the sweep)")
    _check_points(generator, base, generator_axes)
    option_axes = [a for a in axes if a.is_option]
    if algorithms is None and option_axes:
        algorithms = list(dict.fromkeys(a.algorithm for a in option_axes))
    algorithms = None if algorithms is None else list(algorithms)
    for axis in option_axes:
        if axis.key in algorithm_options.get(axis.algorithm, {}):
            raise ValueError(f"{axis.label} is swept: leave it out of --option")
        takes = [name for name in algorithms if name == axis.algorithm or
                 (bench_algorithms.base_of(name) == axis.algorithm and axis.key not in
                  bench_algorithms.fixed_options(name))]
        fixing = [name for name in algorithms if name != axis.algorithm and
                  bench_algorithms.base_of(name) == axis.algorithm and axis.key in bench_algorithms.fixed_options(name)]
        if fixing:
            name = fixing[0]
            raise ValueError(f"{name} fixes {axis.key}={bench_algorithms.fixed_options(name)[axis.key]!r}, so "
                             f"sweeping {axis.label} would not vary it: leave {name} out, or sweep {name}.{axis.key}")
        if not takes:
            raise ValueError(f"sweeping {axis.label} varies no algorithm of this run ({', '.join(algorithms)}): "
                             f"run {axis.algorithm} too")
        for value in axis.values:             # each value together with the other options of the run
            chosen = _with_axis(algorithm_options, axis, value)
            for name in takes:
                for each in bench_algorithms.runs_on(name, _backends(backend)):
                    try:
                        bench_algorithms.check_options(name, bench_algorithms.options_of(name, chosen), each)
                    except TypeError as exc:
                        raise ValueError(str(exc)) from None
    return SweepPlan(generator, base, x, second, algorithms, algorithm_options)


#: the sizes :func:`_check_points` generates each point at
_CHECK_SUBS, _CHECK_EVENTS = 16, 4


def _check_points(generator: str, base: dict, axes: list) -> None:
    """Every point of the generator ``axes`` generated small (at most
    :data:`_CHECK_SUBS` subscriptions and :data:`_CHECK_EVENTS` events), so
    that a value the generator refuses is an error before the first point
    is measured, not after (the points before it would be lost)."""
    generate = _generator(generator)
    points = [{}]
    for axis in axes:
        points = [dict(point, **{axis.key: value}) for point in points for value in axis.values]
    for point in points:
        kwargs = dict(base, **point)
        for key, small in (("n_subs", _CHECK_SUBS), ("n_events", _CHECK_EVENTS)):
            value = kwargs.get(key)
            if isinstance(value, int) and not isinstance(value, bool) and value > small:
                kwargs[key] = small
        try:
            generate(**kwargs, seed=0, name="check")
        except (TypeError, ValueError) as exc:
            where = ", ".join(f"{key}={value!r}" for key, value in point.items())
            raise ValueError(f"{generator} refuses the point {where}: {exc}") from None


def sweep(param: str, values, generator: str = "opindex", base_params: dict | None = None, algorithms=None,
          backends=("cpu",), *, series: tuple | None = None, scale: float = DEFAULT_SCALE, events_limit=None,
          seed: int = 0, progress: bool = True, algorithm_options: dict | None = None, **options) -> list[dict]:
    """Vary one parameter over ``values`` and benchmark each point with
    :func:`~engine.bench.measure.run_benchmark` (``options``: its keywords),
    everything else as in :func:`sweep_base`.

    ``param``: a generator parameter (``N``/``n_subs``, ``dims``, ``Γmax``,
    ``m``, ``θ``, ``σ``, ``zipf``, ``similarity``...; see
    :data:`SWEEP_ALIASES`), or an algorithm option ``"algorithm.option"``
    (``"apcm.cluster_size"``: the default ``algorithms`` are then the
    option's algorithm alone).  ``series``: ``(param, values)``, a second
    axis of either kind; each of its values gives a line.  Rows carry
    ``sweep_param`` / ``sweep_value`` (the generator keyword or
    ``algorithm.option``, and its value) and ``series_param`` /
    ``series_value``.  A workload is generated once per distinct set of
    generator parameters, so an option sweep measures every value on the
    same events."""
    plan = plan_sweep(param, values, generator, base_params, algorithms, series=series, scale=scale,
                      n_events=events_limit, algorithm_options=algorithm_options, backend=list(backends))
    generate = _generator(generator)
    x, second = plan.x, plan.series
    points = [(sv, xv) for sv in (second.values if second else (None,)) for xv in x.values]
    generator_axes = [a for a in (x, second) if a is not None and not a.is_option]
    rows = []
    workload, made_from = None, None
    bar = tqdm(points, desc=f"sweep {x.label}", unit="point", disable=not progress, file=sys.stderr)
    for series_value, value in bar:
        at = {x: value, **({second: series_value} if second else {})}
        kwargs = dict(plan.base, **{a.key: at[a] for a in generator_axes})
        if kwargs != made_from:               # an option axis keeps the workload
            # named by what varies; with nothing varying, by what differs from the sweep's base
            settings = [(a.key, at[a]) for a in generator_axes] or list((base_params or {}).items())
            name = " ".join([generator, *(f"{key}={v}" for key, v in settings)])
            workload, made_from = generate(**kwargs, seed=seed, name=name), kwargs
        chosen = plan.algorithm_options
        for axis in (x, second):
            if axis is not None and axis.is_option:
                chosen = _with_axis(chosen, axis, at[axis])
        extra = dict(sweep_param=x.label, sweep_value=value)
        if second is not None:
            extra.update(series_param=second.label, series_value=series_value)
        rows += run_benchmark([workload], plan.algorithms, backends, events_limit=events_limit, progress=progress,
                              extra=extra, algorithm_options=chosen, **options)
    return rows
