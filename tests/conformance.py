"""The conformance harness: every registered algorithm, on each of its
backends, through every life cycle of an index, against the two oracles.

``tests/test_conformance.py`` parametrises these checks over
:func:`cases` -- read from :mod:`engine.algorithms.registry` when the tests
are collected, so an algorithm is covered by registering it -- and over
:data:`LIFECYCLES`.  The checks are plain functions of (algorithm name,
backend, ...) so that a test can run the whole suite on an algorithm it
registers itself (:func:`run_whole_suite`; the toy-algorithm test does).

Each algorithm runs with its default options and, as further cases, under
each of its registered ``conformance_options`` (``Algorithm`` in the
registry): small parameters that make small workloads reach paths the
defaults never take (``betree`` with ``max_cap=1, min_size=1`` builds a
real tree; with its default capacity of 20 the workloads here sit in the
root leaf).  The checks take them as ``options`` (``Index(...,
options=options)``); :data:`VARIANT_CHECKS` says which checks run them on
each backend (every life cycle but ``delta``'s, which ``scan`` matches
whatever the options; on ``cuda`` no other check: the simulator slice's
time).

A *life cycle* is where the subscriptions sit when the events are matched:

``delta``       added one at a time and in small ``add_many`` calls, below the
                merge threshold, some removed again: only the delta holds them;
``main``        ``add_many`` then ``merge``: only the main segment (every event
                container is checked here: dicts, Arrow string, large_string
                and dictionary columns, pandas, the empty batch);
``tombstones``  main, its matcher built by a match, then removals without a
                merge (cleared ``alive`` flags under a built matcher);
``merged``      main with a built matcher, more adds in the delta, removals
                from both, an id removed from main and re-added with another
                expression -- checked in that mixed state, then after
                ``merge`` (the algorithm's incremental ``merged`` path); in
                a quarter of the runs everything is removed before the
                merge, and adds follow (checked in the delta, then merged);
``saved``       the mixed state saved, loaded on the same backend and checked;
                loaded on the other backend where it runs, saved there and
                loaded back; then updated after the load (new strings and
                attributes) and checked again;
``subset``      the mixed state, ``subset`` of a random part of its ids (maybe
                none, maybe all): the part, and the original after it.

Every check compares ``match`` (one event at a time), ``match_batch`` (list
output), ``match_batch(output="arrow")`` and, on ``cuda``,
``output="device"``: all must equal the reference evaluator
(:mod:`engine.reference`), itself checked against DuckDB
(``tests/sql_oracle.py``) on every workload.

Workloads (:func:`workloads`) come from ``tests/strategies.py``: values on
the predicates' bounds (ints and the floats equal to them, -0.0, ±2**53,
subnormals), absent attributes, long strings sharing prefixes (URLs,
UUIDs), non-ASCII, NUL, LIKE and MATCHES patterns, IN lists, BETWEEN,
IS [NOT] NULL, every connective; three flavours: *mixed* (every operator),
*strings* (arbitrary Unicode values used both as operands and as event
values, so that they meet) and *deep* (trees of up to 48 leaves, AND/OR of
up to 8 children, chains nested 10-40 deep; cpu only: the CUDA simulator
runs every thread in Python).  Ids are arbitrary int64 values, int64's
ends included.  Which subscriptions a life cycle removes or keeps is
chosen so that it changes answers (a removed subscription that matched
nothing would prove nothing), and each check tallies how many events match
something: :meth:`Tally.assert_meaningful` fails a run whose oracle never
saw a match.

Switches for parts of the engine written alongside this suite (one line
each, both on): :data:`RESIDUAL_MATCHER` and :data:`REPORT_ERRORS`.
"""

from __future__ import annotations

import functools
import hashlib
import itertools
import os
import random
import tempfile
import uuid
import warnings
from dataclasses import dataclass
from decimal import Decimal

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, note, settings
from hypothesis import strategies as st

from engine import Index
from engine.algorithms import host_tasks, registry
from engine.backend import available_backends
from engine.expr import Node, Op, Pred, Xor, predicates
from engine.reference import matches
from tests import strategies
from tests.sql_oracle import duckdb_matches

# ------------------------------------------------------------------ switches
#: (a) the residual matcher: an expression beyond an algorithm's rewrite
#: limit is matched exactly inside the same index (counted in
#: ``Index.statistics()["residual"]``).  False: workloads drop what an
#: algorithm's registered ``limit_check`` refuses (opindex: ~2 % of random
#: AND/OR/NOT/XOR expressions); True: they keep it.
RESIDUAL_MATCHER = True
#: (c) ``match_batch(errors="report")``: True adds it as a route
REPORT_ERRORS = True

LIFECYCLES = ("delta", "main", "tombstones", "merged", "saved", "subset")
BACKENDS = ("cpu", "cuda")

SCHEMA = strategies.SCHEMA
DUCK_TYPES = {"numeric": "DOUBLE", "string": "VARCHAR", "boolean": "BOOLEAN", "list<numeric>": "DOUBLE[]",
              "list<string>": "VARCHAR[]"}
DUCK_SCHEMA = {a: DUCK_TYPES[f] for a, f in SCHEMA.items()}
ARROW_TYPES = {"numeric": pa.float64(), "string": pa.string(), "boolean": pa.bool_(),
               "list<numeric>": pa.list_(pa.float64()), "list<string>": pa.list_(pa.string())}

SLOW_OK = [HealthCheck.too_slow, HealthCheck.data_too_large]


@dataclass(frozen=True)
class Size:
    """How big a backend's workloads are, and how many each check draws."""

    min_exprs: int
    max_exprs: int
    max_events: int
    max_leaves: int
    flavours: tuple
    examples: int
    #: events made TRUE for that many of a workload's subscriptions
    witnesses: int


#: the simulator runs every CUDA thread in Python: a few subscriptions and
#: events per example, few examples -- but every life cycle
SIZES = {"cpu": Size(min_exprs=2, max_exprs=14, max_events=8, max_leaves=10,
                     flavours=("mixed", "mixed", "strings", "deep"), examples=8, witnesses=3),
         "cuda": Size(min_exprs=3, max_exprs=5, max_events=3, max_leaves=6,
                      flavours=("mixed", "strings"), examples=2, witnesses=2)}


# ------------------------------------------------------------------ the cases
def stops_after_the_first_group(module, index: Index, events, want, monkeypatch) -> None:
    """A batch kernel's side of the host_tasks protocol (events 64 a
    group): one task whose slab holds the first group's matches exactly
    stops at the second group's first event and asks for its count, the
    first group's events whole.  ``module`` is the matcher's, whose
    ``match_in_tasks`` is replaced; ``want`` the Arrow answers of
    ``events`` (130 or more)."""
    counts = np.bincount(np.asarray(want["event"]), minlength=len(events))
    cap = int(counts[:64].sum())

    def one_task(n, launch, estimate, per_task=1):
        out, ev_count = np.empty(cap, np.int32), np.zeros(n, np.int64)
        stop, need = np.empty(1, np.int64), np.empty(1, np.int64)
        launch(np.array([0]), np.array([n]), out, cap, ev_count, stop, need, True)
        assert (stop[0], need[0]) == (64, counts[64]) and (ev_count[:64] == counts[:64]).all()
        return host_tasks.Runs.of_pairs(np.repeat(np.arange(64), counts[:64]), out, n), estimate

    monkeypatch.setattr(module, "match_in_tasks", one_task)
    assert index.match_batch(events, output="arrow").equals(want.slice(0, cap))


def available(backend: str) -> bool:
    return backend in available_backends()


def backend_marks(backend: str) -> list:
    """``cuda`` cases are marked ``cuda`` (the simulator slice of CI) and
    skipped where the backend cannot run."""
    if backend == "cpu":
        return []
    return [pytest.mark.cuda,
            pytest.mark.skipif(not available(backend),
                               reason=f"backend {backend!r} is not available here (a CUDA GPU with CuPy, or "
                                      "numba's simulator: NUMBA_ENABLE_CUDASIM=1 set before the run)")]


#: the checks that also run an algorithm's ``conformance_options`` variants,
#: per backend (None: every check).  On ``cpu`` every check but the
#: ``delta`` life cycle: the delta is matched by ``scan`` whatever the
#: algorithm's options (engine/snapshot.py, ``delta_part``), so the
#: defaults' ``delta`` case covers it.  On ``cuda`` the same life cycles,
#: and no other check: CI's simulator slice runs every CUDA thread in
#: Python under a time limit, and the pinned examples and the limit checks
#: exercise the host's parsing and residual routing, the same whatever the
#: backend.
VARIANT_CHECKS = {"cpu": ("main", "tombstones", "merged", "saved", "subset", "pinned", "large batch", "limit"),
                  "cuda": ("main", "tombstones", "merged", "saved", "subset")}


def case_database(*case, default=...):
    """The example database of one case of a shared check (``check_lifecycle``
    and ``check_large_batch`` run one inner ``@given`` function for every
    algorithm, backend and life cycle; Hypothesis keys its saved examples
    by the function, so one case's failing example was replayed in every
    other case -- where it could fail for another reason, such as too few
    matches to prove anything -- and a single defect read as many): the
    default database's folder (``default``: Hypothesis's current one), a
    subfolder a case.  None when the default is no database."""
    base = getattr(settings.default.database if default is ... else default, "path", None)
    if base is None:
        return None
    from hypothesis.database import DirectoryBasedExampleDatabase
    digest = hashlib.sha1(repr(case).encode()).hexdigest()[:16]
    return DirectoryBasedExampleDatabase(os.path.join(base, "conformance", digest))


def options_id(options: dict | None) -> str:
    """``""`` for the defaults, ``"[max_cap=1,min_size=1]"`` for options."""
    return f"[{','.join(f'{name}={value}' for name, value in options.items())}]" if options else ""


def variants(algorithm) -> tuple:
    """``None`` (the defaults), then each of ``algorithm``'s registered
    ``conformance_options`` (a registry entry or its name)."""
    algorithm = registry.get(algorithm) if isinstance(algorithm, str) else algorithm
    return (None,) + tuple(dict(options) for options in algorithm.conformance_options)


def runs_variants(backend: str, check: str | None) -> bool:
    """Whether ``check`` (a life cycle, ``"pinned"``, ...; None: any) runs
    the option variants on ``backend`` (:data:`VARIANT_CHECKS`)."""
    checks = VARIANT_CHECKS.get(backend)
    return check is None or checks is None or check in checks


def cases(backends=BACKENDS, check: str | None = None) -> list:
    """One ``pytest.param(algorithm, backend, options)`` per registered
    algorithm, each backend it is implemented on and each of its option
    variants (:func:`variants`: ``None`` for the defaults, then its
    ``conformance_options``), read from the registry now, with ids such as
    ``betree-cpu`` and ``betree[max_cap=1,min_size=1]-cpu``.  ``check``
    (a life cycle, ``"pinned"``, ...) leaves out the variants that check
    does not run on a backend (:data:`VARIANT_CHECKS`); None: every case."""
    return [pytest.param(algorithm.name, backend, options, marks=backend_marks(backend),
                         id=f"{algorithm.name}{options_id(options)}-{backend}")
            for algorithm in registry.algorithms() for backend in algorithm.backends if backend in backends
            for options in variants(algorithm)
            if (options is None or runs_variants(backend, check)) and backend in algorithm.option_backends(options)]


def lifecycle_cases(backends=BACKENDS) -> list:
    """:func:`cases` times :data:`LIFECYCLES`: ``pytest.param(algorithm,
    backend, options, lifecycle)``, ids such as ``betree-cpu-merged``."""
    return [pytest.param(*case.values, lifecycle, marks=case.marks, id=f"{case.id}-{lifecycle}")
            for case in cases(backends) for lifecycle in LIFECYCLES
            if case.values[2] is None or runs_variants(case.values[1], lifecycle)]


def accepts_natively(algorithm: str, node: Node, dnf_limit: int = 256) -> bool:
    """Whether ``algorithm``'s own structure takes ``node`` (else the
    residual matcher does)."""
    return registry.get(algorithm).indexes(node, dnf_limit)


def accepts(algorithm: str, node: Node, dnf_limit: int = 256) -> bool:
    """Whether a workload for ``algorithm`` may hold ``node`` (see
    :data:`RESIDUAL_MATCHER`)."""
    return RESIDUAL_MATCHER or accepts_natively(algorithm, node, dnf_limit)


# ------------------------------------------------------------------ workloads
@dataclass
class Workload:
    exprs: list            # the subscriptions, ids[i] for exprs[i]
    extras: list           # more expressions: re-adds under a removed id, adds after a load
    ids: list              # len(exprs) + len(extras) distinct int64 ids (the extras' for adds after a load)
    events: list
    declare_schema: bool   # Index(schema=SCHEMA), or the families inferred from the subscriptions
    seed: int              # the life cycle's choices (what is added how, removed, kept)

    @property
    def versions(self) -> list:
        """Every expression a run may add: ``exprs`` then ``extras``."""
        return self.exprs + self.extras


#: ids: small ones, arbitrary int64, and int64's ends
_IDS = st.one_of(st.integers(-5, 60), st.integers(-2 ** 63, 2 ** 63 - 1), st.sampled_from([-2 ** 63, 2 ** 63 - 1]))


@st.composite
def _strings_flavour(draw, min_exprs, max_exprs, max_events, max_leaves):
    """Arbitrary Unicode values (strategies.strings: NUL, astral and
    combining characters, long values on the pools' prefixes) used both as
    the predicates' operands and as the events' values, so that they meet."""
    values = draw(st.lists(strategies.strings(max_size=40), min_size=1, max_size=6, unique=True))
    literals = st.one_of(st.sampled_from(values), strategies.string_literals)
    leaves = strategies.string_predicates(literals)
    exprs = draw(st.lists(strategies.expressions(max_leaves=min(6, max_leaves), leaves=leaves),
                          min_size=min_exprs, max_size=max_exprs))
    value = st.one_of(st.sampled_from(values), st.sampled_from(values), literals, strategies.strings())
    events = draw(st.lists(st.fixed_dictionaries({}, optional={a: value for a in strategies.STRING_ATTRS}),
                           min_size=1, max_size=max_events))
    return exprs, events


#: distinct comparisons on every attribute, on the pools' values
_CHAIN_LINKS = tuple(Pred(a, op, (v,)) for a, values in
                     [(a, (-1, 0, 0.5, 2.5, 2 ** 53)) for a in strategies.NUMERIC_ATTRS]
                     + [(a, ("a", "https://example.com/a", "日本", "a\x00b")) for a in strategies.STRING_ATTRS]
                     + [(a, (True,)) for a in strategies.BOOLEAN_ATTRS]
                     for v in values for op in (Op.EQ, Op.LE, Op.GT))


def xor_chains():
    """``p1 XOR p2 XOR ... XOR pk`` of 9 to 12 distinct predicates: most
    are beyond every normal-form limit (up to 2**(k-1) conjunctions both
    ways), i.e. residual for opindex."""
    return st.builds(lambda links, k: functools.reduce(Xor, links[:k]), st.permutations(_CHAIN_LINKS),
                     st.integers(9, 12))


@st.composite
def workloads(draw, algorithm: str, backend: str):
    size = SIZES[backend]
    flavour = draw(st.sampled_from(size.flavours), label="flavour")
    mixed = strategies.expressions(max_leaves=size.max_leaves, with_not_matches=True)
    if flavour == "strings":
        exprs, events = draw(_strings_flavour(size.min_exprs, size.max_exprs, size.max_events, size.max_leaves))
    else:
        exprs = draw(st.lists(mixed, min_size=size.min_exprs, max_size=size.max_exprs))
        if flavour == "deep":
            exprs = draw(st.lists(strategies.deep_expressions(with_not_matches=True), min_size=1, max_size=3)) + \
                exprs[:size.max_exprs // 2]
        events = draw(st.lists(strategies.events(), min_size=1, max_size=size.max_events))
    if RESIDUAL_MATCHER and draw(st.sampled_from([True, True, False]), label="beyond the limits"):
        chains = xor_chains()
        if registry.get(algorithm).limit_check is not None:     # one it does not index, then
            chains = chains.filter(lambda chain: not accepts_natively(algorithm, chain))
        exprs.append(draw(chains))
    extras = draw(st.lists(mixed, min_size=1, max_size=2))
    # what the algorithm refuses is dropped, not filtered (deep XOR chains
    # are refused more often than not: a filter would starve hypothesis)
    exprs = [e for e in exprs if accepts(algorithm, e)] or [draw(strategies.predicates())]
    extras = [e for e in extras if accepts(algorithm, e)] or [draw(strategies.predicates())]
    # events on which some subscriptions are TRUE: a workload that matches
    # nothing proves nothing, nor does a removal that hides nothing
    # (up to twice as many expressions tried as witnesses wanted: one may be
    # unsatisfiable, and a case with two examples of three events each must
    # rarely go without a match -- it then fails as proving nothing)
    rng = random.Random(draw(st.integers(0, 2 ** 32 - 1), label="witness seed"))
    found = []
    for e in rng.sample(exprs, min(len(exprs), 2 * size.witnesses)):
        if len(found) == size.witnesses:
            break
        if (w := witness([e], events, rng)) is not None:
            found.append(w)
    events = (events + found)[-size.max_events:] if found else events
    ids = draw(st.lists(_IDS, min_size=len(exprs) + len(extras), max_size=len(exprs) + len(extras), unique=True))
    # IS [NOT] EMPTY fixes no element type: an index that is not told the
    # schema refuses it on a list attribute nothing typed before (tests/test_lists.py)
    declare = draw(st.booleans(), label="declare_schema") or any(
        p.op in (Op.IS_EMPTY, Op.IS_NOT_EMPTY) for e in exprs + extras for p in predicates(e))
    return Workload(exprs, extras, ids, events, declare, draw(st.integers(0, 2 ** 32 - 1), label="seed"))


def witness(exprs: list, events: list, rng: random.Random, tries: int = 200) -> dict | None:
    """An event on which one of ``exprs`` is TRUE (by the reference
    evaluator), made of the workload's own event values and the pools',
    if one is found in ``tries`` attempts."""
    seen: dict = {}
    for event in events:
        for a, v in event.items():
            seen.setdefault(a, []).append(v)
    for _ in range(tries):
        candidate = pool_event(rng)
        for a, values in seen.items():
            if rng.random() < 0.6:
                candidate[a] = rng.choice(values)
        for a in list(candidate):
            if rng.random() < 0.15:
                del candidate[a]
        if any(matches(e, candidate) for e in exprs):
            return candidate
    return None


# ------------------------------------------------------------------ oracles
class Oracle:
    """Per expression version and event: TRUE or not, by the reference
    evaluator -- checked against DuckDB once per workload."""

    def __init__(self, versions: list, events: list):
        self.truth = [[matches(v, e) for e in events] for v in versions]
        duck = duckdb_matches(versions, events, DUCK_SCHEMA)
        by_duckdb = [[j in duck[i] for j in range(len(events))] for i in range(len(versions))]
        assert by_duckdb == self.truth, "the oracles disagree"
        self.n_events = len(events)

    def expected(self, live: dict) -> list[list[int]]:
        """Per event, the ascending ids of the live subscriptions (id ->
        version) TRUE on it."""
        return [sorted(i for i, v in live.items() if self.truth[v][j]) for j in range(self.n_events)]

    def hits(self, version: int) -> int:
        return sum(self.truth[version])


@dataclass
class Tally:
    """What a run's checks saw: a check whose oracle never sees a match, or
    a removal that never hides one, proves nothing."""

    events: int = 0
    matched: int = 0          # events on which at least one live subscription is TRUE
    unmatched: int = 0
    hidden: int = 0           # TRUE (removed subscription, event) pairs a removal hid
    residual: int = 0         # checks of an index holding residual subscriptions
    runs: int = 0

    def add(self, other: "Tally") -> None:
        self.events += other.events
        self.matched += other.matched
        self.unmatched += other.unmatched
        self.hidden += other.hidden
        self.residual += other.residual
        self.runs += other.runs

    def assert_meaningful(self, what: str, removals: bool = False, residual: bool = False,
                          share: float = 0.15) -> None:
        assert self.runs > 0, f"{what}: no example ran"
        if residual:
            assert self.residual > 0, f"{what}: no check saw a residual subscription"
        assert self.matched >= share * self.events, \
            f"{what}: only {self.matched} of {self.events} checked events matched anything"
        if removals:
            assert self.hidden > 0, f"{what}: no removal hid a match"


# ------------------------------------------------------------------ answers
def arrow_events(events, string_type=pa.string(), dictionary=False) -> pa.Table:
    """One column per schema attribute, null where an event lacks it."""
    columns = {}
    for a, f in SCHEMA.items():
        arrow_type = string_type if f == "string" else pa.large_list(string_type) if f == "list<string>" \
            else ARROW_TYPES[f]
        cells = [list(v) if isinstance(v, tuple) else v for v in (e.get(a) for e in events)]
        column = pa.array(cells, arrow_type)
        if dictionary and f == "string":
            column = column.dictionary_encode()
        columns[a] = column
    return pa.table(columns)


def pairs_to_lists(event, sub_id, n_events: int) -> list[list[int]]:
    """(event, sub_id) pairs -> one id list per event, checking the order."""
    event, sub_id = np.asarray(event).tolist(), np.asarray(sub_id).tolist()
    assert list(zip(event, sub_id)) == sorted(set(zip(event, sub_id))), "pairs not ascending by (event, sub_id)"
    out = [[] for _ in range(n_events)]
    for e, s in zip(event, sub_id):
        out[e].append(s)
    return out


#: not a mapping: a bad event whatever the schema
BAD_EVENT = ("n0", 1)


def _listed(arrays) -> list[list[int]]:
    out = []
    for m in arrays:
        assert isinstance(m, np.ndarray) and m.dtype == np.int64, f"not an int64 array: {m!r}"
        out.append(m.tolist())
    return out


def _wrapped(event: dict) -> dict:
    """``event`` with its values in the other types an application holds
    them in, each the very same number, string or boolean (the oracles read
    the plain values): integers as NumPy integers, floats as NumPy float64,
    float32 where it holds the value, or (within ±2**53) the decimal of
    their shortest text,
    booleans as ``numpy.bool_``, strings as ``numpy.str_``, lists of numbers
    as NumPy arrays where they hold no None."""
    def one(value, turn: int):
        if isinstance(value, bool):
            return np.bool_(value)
        if isinstance(value, int):
            return (np.int64, np.int32 if abs(value) < 2 ** 31 else np.int64, int)[turn % 3](value)
        if isinstance(value, float):
            if turn % 3 == 0 and abs(value) < 3e38 and float(np.float32(value)) == value:
                return np.float32(value)
            # (a decimal beyond ±2**53 is refused: the value rule takes decimals within it only)
            return np.float64(value) if turn % 3 == 1 or abs(value) > 2 ** 53 else Decimal(repr(value))
        if isinstance(value, str):
            return np.str_(value)
        if isinstance(value, (list, tuple)):
            elements = [one(v, turn + k) for k, v in enumerate(value)]
            if None in value or not value or not all(isinstance(v, (int, float)) for v in value) \
                    or any(isinstance(v, Decimal) for v in elements):
                return elements         # (a NumPy array of strings drops their trailing NULs)
            return np.array(value)
        return value
    return {name: one(value, len(name) + k) for k, (name, value) in enumerate(event.items())}


def answers(index: Index, events: list, backend: str, containers: bool = False) -> dict:
    """The index's answer on ``events`` by every route, as one id list per
    event each -- but ``match``'s on the first event only on ``cuda`` (one
    simulated launch per call: the per-event route is the batch route on a
    batch of one)."""
    n = len(events)
    table = index.match_batch(events, output="arrow")
    assert table.schema.names == ["event", "sub_id"] and all(t == pa.int64() for t in table.schema.types)
    routes = {
        "match": _listed(index.match(e) for e in (events if backend == "cpu" else events[:1])),
        "match_batch": _listed(index.match_batch(events)),
        'output="arrow"': pairs_to_lists(table.column("event").to_numpy(), table.column("sub_id").to_numpy(), n),
    }
    if backend == "cuda":
        from gpu_kernels import cuda_support
        event_idx, sub_ids = index.match_batch(events, output="device")
        routes['output="device"'] = pairs_to_lists(cuda_support.to_host(event_idx), cuda_support.to_host(sub_ids), n)
    # errors="report": a bad event in the middle is set aside, the others match
    # as ever (set aside on the host before any backend is reached: on cpu only)
    if REPORT_ERRORS and backend == "cpu":
        bad = len(events) // 2
        results, rejected = index.match_batch(events[:bad] + [BAD_EVENT] + events[bad:], errors="report")
        assert [r.event for r in rejected] == [bad]
        got = _listed(results)
        assert got.pop(bad) == []
        routes['errors="report"'] = got
    if containers:
        routes["Arrow table"] = _listed(index.match_batch(arrow_events(events)))
        routes["Arrow large_string, dictionary"] = _listed(index.match_batch(
            arrow_events(events, pa.large_string(), dictionary=True)))
        frame = pd.DataFrame({a: pd.Series([e.get(a) for e in events], dtype=object) for a in SCHEMA})
        routes["pandas"] = _listed(index.match_batch(frame))
        routes["NumPy and Decimal values"] = _listed(index.match_batch([_wrapped(e) for e in events]))
        lists = index.match_batch(events, output="arrow_lists")
        assert lists.column("event").to_pylist() == list(range(n))
        routes['output="arrow_lists"'] = lists.column("sub_ids").to_pylist()
        assert index.match_batch([]) == []
        assert index.match_batch([], output="arrow").num_rows == 0
        assert index.match_batch([], output="arrow_lists").num_rows == 0
    return routes


# ------------------------------------------------------------------ life cycles
def assert_options(index: Index, algorithm: str, options: dict | None, where: str = "") -> None:
    """``index`` runs with ``options`` (a saved index keeps its options
    through ``load``, a subset its original's)."""
    want = registry.get(algorithm).make_options(options, index.backend)
    assert index._options == want, f"{where}: options {index._options} instead of {want}"


def layout(index: Index) -> tuple[int, int, int]:
    """(live subscriptions in the main segment, in the delta, tombstones):
    where the subscriptions sit, so that a life cycle is known to be the
    one meant."""
    stats = index.statistics()
    return stats["main"], stats["delta"], stats["tombstones"]


class Run:
    """One index going through a life cycle, with what it must hold."""

    def __init__(self, algorithm: str, backend: str, w: Workload, oracle: Oracle, tally: Tally,
                 options: dict | None = None):
        self.algorithm, self.backend, self.w, self.oracle, self.tally = algorithm, backend, w, oracle, tally
        self.options = dict(options) if options else None
        self.rng = random.Random(w.seed)
        self.index = self.new_index()
        self.live: dict[int, int] = {}           # id -> version (index into w.versions)
        self.n = len(w.exprs)
        self._native: dict[int, bool] = {}     # version -> accepts_natively (see native)

    def new_index(self) -> Index:
        return Index(algorithm=self.algorithm, backend=self.backend,
                     schema=SCHEMA if self.w.declare_schema else None, options=self.options)

    def assert_options(self, index: Index, where: str = "") -> None:
        """``index`` (a loaded one, a subset) has the run's options."""
        assert_options(index, self.algorithm, self.options, where)

    # updates, mirrored in ``live``
    def add(self, versions, one_by_one: bool = False, ids=None) -> None:
        versions = list(versions)
        ids = [self.w.ids[v] for v in versions] if ids is None else list(ids)
        note(f"add {'one by one' if one_by_one else 'add_many'}: {list(zip(ids, versions))}")
        if one_by_one:
            for i, v in zip(ids, versions):
                self.index.add(i, self.w.versions[v])
        elif versions:
            self.index.add_many(ids, [self.w.versions[v] for v in versions])
        self.live.update(zip(ids, versions))

    def remove(self, ids) -> None:
        note(f"remove {list(ids)}")
        for i in ids:
            self.index.remove(i)
            self.tally.hidden += self.oracle.hits(self.live.pop(i))

    def pick(self, ids, most: int | None = None, least: int = 0, spare_one: bool = True) -> list[int]:
        """A random choice among ``ids`` that holds, when it can, one id whose
        subscription matches some event (so that removing it changes an
        answer), and -- ``spare_one`` -- not every such id (so that some
        match is left to find)."""
        ids = sorted(ids)
        most = len(ids) if most is None else min(most, len(ids))
        k = self.rng.randint(min(least, most), most) if most else 0
        chosen = self.rng.sample(ids, k)
        hitting = [i for i in ids if self.oracle.hits(self.live[i])]
        if k and hitting and not set(chosen) & set(hitting):
            chosen[0] = self.rng.choice(hitting)
        if spare_one and len(hitting) > 1 and set(hitting) <= set(chosen):
            chosen.remove(self.rng.choice([i for i in hitting if i != chosen[0]]))
        return sorted(set(chosen))

    def native(self, version: int) -> bool:
        """Whether the algorithm's own structure takes ``version``: a normal
        form built up to the limit, once per version (a run checks its
        index several times, and a deep expression's costs milliseconds)."""
        if version not in self._native:
            self._native[version] = accepts_natively(self.algorithm, self.w.versions[version])
        return self._native[version]

    def build_matcher(self) -> None:
        """A match, so that the main segment's matcher exists before the next
        update (tombstones and merges then work on a built structure)."""
        self.index.match({})

    def check(self, index: Index | None = None, containers: bool = False, where: str = "") -> None:
        index = self.index if index is None else index
        backend = index.backend
        want = self.oracle.expected(self.live)
        assert len(index) == len(self.live), where
        self.assert_options(index, where)
        if RESIDUAL_MATCHER:
            beyond = sum(not self.native(v) for v in self.live.values())
            residual = index.statistics()["residual"]
            # (on cuda, a program too deep for the device's stack is residual as well)
            assert residual == beyond if backend == "cpu" else residual >= beyond, where
            self.tally.residual += residual > 0
        assert all(i in index for i in self.live), where
        for route, got in answers(index, self.w.events, backend, containers).items():
            expected = want[:1] if route == "match" and backend != "cpu" else want
            assert got == expected, f"{where}: {route} differs from the reference evaluator"
        self.tally.events += len(want)
        self.tally.matched += sum(1 for m in want if m)
        self.tally.unmatched += sum(1 for m in want if not m)

    # the states the life cycles start from
    def main(self, versions) -> None:
        self.add(versions)
        self.index.merge()

    def mixed(self) -> list[int]:
        """Main (matcher built), delta, tombstones, and an id removed from
        main and re-added with another expression.  Returns the versions
        not yet used."""
        k = self.rng.randint(1, self.n)
        self.main(range(k))
        self.build_matcher()
        rest = list(range(k, self.n))
        cut = self.rng.randint(0, len(rest))
        self.add(rest[:cut], one_by_one=True)
        self.add(rest[cut:])
        removed = self.pick(self.w.ids[:k], most=max(1, k // 2), least=1)
        removed += self.pick(self.w.ids[k:self.n], most=len(rest) // 2)
        self.remove(removed)
        unused = list(range(self.n, len(self.w.versions)))
        readd = [i for i in removed if i in self.w.ids[:k]]
        if readd and self.rng.random() < 0.7:   # tombstoned in main, alive in the delta
            self.add([unused.pop(0)], ids=[readd[0]], one_by_one=True)
        return unused


def _delta(run: Run, tmp_path) -> None:
    order = list(range(run.n))
    run.rng.shuffle(order)
    cut = run.rng.randint(0, run.n)
    run.add(order[:cut], one_by_one=True)
    for first in range(cut, run.n, 3):            # small add_many calls: below the merge threshold
        run.add(order[first:first + 3])
    run.remove(run.pick(run.live, most=max(1, run.n // 3), least=1 if run.n > 1 else 0))
    assert layout(run.index) == (0, len(run.live), 0)
    run.check(where="delta only")


def _main(run: Run, tmp_path) -> None:
    run.main(range(run.n))
    assert layout(run.index) == (run.n, 0, 0)
    run.check(containers=run.backend == "cpu", where="main only")


def _tombstones(run: Run, tmp_path) -> None:
    run.main(range(run.n))
    run.build_matcher()
    removed = run.pick(run.live, most=max(1, run.n // 2), least=1)
    run.remove(removed)
    assert layout(run.index) == (run.n - len(removed), 0, len(removed))
    run.check(where="tombstones")


def _merged(run: Run, tmp_path) -> None:
    run.mixed()
    run.check(where="main, delta and tombstones")
    emptied = run.rng.random() < 0.25
    if emptied:         # every subscription removed: the merge leaves an empty main segment
        run.remove(sorted(run.live))
    run.index.merge()
    assert layout(run.index) == (len(run.live), 0, 0)
    run.check(where="after merge")
    if emptied:         # ... which the next adds, merged or not, build on
        run.add(range(run.rng.randint(1, run.n)))
        run.check(where="adds after a merge that emptied the index")
        run.index.merge()
        run.check(where="merged again")


_FILES = itertools.count()


def _saved(run: Run, tmp_path) -> None:
    unused = run.mixed()
    path = tmp_path / f"conformance-{next(_FILES)}.bexidx"
    run.index.save(path)
    run.index = Index.load(path, backend=run.backend)
    assert (run.index.algorithm, run.index.backend) == (run.algorithm, run.backend)
    run.check(where="after save and load")
    # the file loaded on the other backend, and that one's file back on this one (where the options apply
    # there: ``over`` is an option of apcm on cpu only, and loading refuses it on cuda)
    for other in registry.get(run.algorithm).option_backends(run.options):
        if other != run.backend and available(other):
            there = Index.load(path, backend=other)     # (run.check asserts the options kept)
            run.check(there, where=f"saved on {run.backend}, loaded on {other}")
            back = tmp_path / f"conformance-{next(_FILES)}.bexidx"
            there.save(back)
            run.check(Index.load(back, backend=run.backend), where=f"saved on {other}, loaded on {run.backend}")
    # the loaded index takes updates: new strings and attributes, removals
    fresh = unused or [run.n - 1]
    run.add(fresh[:1], ids=run.w.ids[-1:])
    run.remove(run.pick([i for i in run.live if i != run.w.ids[-1]], most=1))
    run.check(where="after save, load and updates")


def _subset(run: Run, tmp_path) -> None:
    run.mixed()
    keep = run.pick(run.live, spare_one=False)
    if keep and run.rng.random() < 0.2:
        keep = sorted(run.live)                   # all of them
    note(f"subset {keep}")
    part = run.index.subset(keep)
    whole = dict(run.live)
    run.live = {i: whole[i] for i in keep}
    run.tally.hidden += sum(run.oracle.hits(v) for i, v in whole.items() if i not in run.live)
    run.check(part, where="the subset")
    run.live = whole
    run.check(where="the original after subset")


LIFECYCLE_RUNS = {"delta": _delta, "main": _main, "tombstones": _tombstones, "merged": _merged, "saved": _saved,
                  "subset": _subset}
#: the life cycles whose removals (or dropped ids) must hide some match
REMOVING = ("delta", "tombstones", "merged", "saved", "subset")


def run_lifecycle(algorithm: str, backend: str, lifecycle: str, w: Workload, tmp_path,
                  options: dict | None = None) -> Tally:
    """One workload through one life cycle (every check asserted)."""
    tally = Tally(runs=1)
    oracle = Oracle(w.versions, w.events)
    note(f"{algorithm}{options_id(options)} on {backend}, {lifecycle}: declare_schema={w.declare_schema} "
         f"seed={w.seed}")
    LIFECYCLE_RUNS[lifecycle](Run(algorithm, backend, w, oracle, tally, options), tmp_path)
    return tally


def check_lifecycle(algorithm: str, backend: str, lifecycle: str, tmp_path, max_examples: int | None = None,
                    options: dict | None = None) -> Tally:
    """Random workloads through one life cycle; fails on a wrong answer, and
    when the workloads proved nothing (no match seen, no removal that hid
    one)."""
    tally = Tally()

    @settings(max_examples=max_examples or SIZES[backend].examples, deadline=None, suppress_health_check=SLOW_OK,
              database=case_database("lifecycle", algorithm, backend, lifecycle, options_id(options)))
    @given(w=workloads(algorithm, backend))
    def random_workloads(w):
        tally.add(run_lifecycle(algorithm, backend, lifecycle, w, tmp_path, options))

    random_workloads()
    # (residual subscriptions, where the algorithm has a limit and the run is long enough to meet them)
    residual = RESIDUAL_MATCHER and registry.get(algorithm).limit_check is not None and tally.runs >= 10
    tally.assert_meaningful(f"{algorithm}{options_id(options)} on {backend}, {lifecycle}",
                            removals=lifecycle in REMOVING, residual=residual)
    return tally


# ------------------------------------------------------------------ a large batch
def pool_event(rng: random.Random) -> dict:
    """An event of the pools' values (mostly literals: bounds, equalities,
    pattern hits), drawn with a seeded RNG."""
    event = {}
    for a in strategies.NUMERIC_ATTRS:
        if rng.random() < 0.8:
            pool = rng.choice([strategies.NUMERIC_LITERAL_FLOATS, strategies.NUMERIC_LITERAL_INTS,
                               strategies.NUMERIC_EVENT_EXTRAS, range(-3, 4)])
            event[a] = rng.choice(list(pool))
    for a in strategies.STRING_ATTRS:
        if rng.random() < 0.8:
            event[a] = rng.choice(strategies.STRING_POOL if rng.random() < 0.75 else strategies.STRING_EVENT_EXTRAS)
    if rng.random() < 0.8:
        event["b0"] = rng.random() < 0.5
    numbers = list(strategies.NUMERIC_LITERAL_FLOATS) + list(range(-3, 4))
    for a, pool in [(a, numbers) for a in strategies.NUMERIC_LIST_ATTRS] + \
            [(a, list(strategies.STRING_POOL)) for a in strategies.STRING_LIST_ATTRS]:
        if rng.random() < 0.8:
            event[a] = [rng.choice(pool) if rng.random() < 0.9 else None for _ in range(rng.choice([0, 1, 2, 3, 6]))]
    return event


def check_large_batch(algorithm: str, backend: str, n_events: int = 1500, max_examples: int = 1,
                      options: dict | None = None) -> None:
    """One batch of ``n_events`` pool events (DuckDB takes them through
    Arrow) against 60 subscriptions in the main segment, from dicts and
    from Arrow, list and arrow output."""
    @settings(max_examples=max_examples, deadline=None, suppress_health_check=SLOW_OK,
              database=case_database("large batch", algorithm, backend, n_events, options_id(options)))
    @given(exprs=st.lists(strategies.expressions(max_leaves=8, with_not_matches=True), min_size=60, max_size=60),
           seed=st.integers(0, 2 ** 32 - 1))
    def large_batch(exprs, seed):
        exprs = [e for e in exprs if accepts(algorithm, e)]
        rng = random.Random(seed)
        events = [pool_event(rng) for _ in range(n_events)]
        oracle = Oracle(exprs, events)
        want = oracle.expected({i: i for i in range(len(exprs))})
        assert any(want)
        index = Index(algorithm=algorithm, backend=backend, schema=SCHEMA, options=options)
        index.add_many(range(len(exprs)), exprs)
        index.merge()
        assert _listed(index.match_batch(events)) == want
        assert _listed(index.match_batch(arrow_events(events))) == want
        table = index.match_batch(arrow_events(events), output="arrow")
        assert pairs_to_lists(table.column("event").to_numpy(), table.column("sub_id").to_numpy(), n_events) == want

    # the life cycles' batches are small enough to run on the calling thread (host_tasks.threads_for):
    # this one runs on every core, its events split into tasks, whatever its size
    small_work, host_tasks.SERIAL_WORK = host_tasks.SERIAL_WORK, 0
    try:
        large_batch()
    finally:
        host_tasks.SERIAL_WORK = small_work


# ------------------------------------------------------------------ pinned examples
#: 100 UUIDs sharing their first 30 characters
UUIDS = [str(uuid.UUID(int=0x123E4567E89B12D3A456426614174000 + 7 * i)) for i in range(100)]
PINNED_ROUTES = ("match", "dicts", "arrow")


def _pinned_answers(index: Index, events: list, route: str) -> list[list[int]]:
    if route == "match":
        return _listed(index.match(e) for e in events)
    if route == "dicts":
        return _listed(index.match_batch(events))
    values = {}
    for event in events:
        for name, value in event.items():
            if isinstance(value, (list, tuple)):        # a list column: typed by its first element
                value = [next((v for e in events for v in (e.get(name) or ()) if v is not None), 0.0)]
            values.setdefault(name, value)
    types = {str: pa.string(), bool: pa.bool_()}

    def arrow_type(value):
        if isinstance(value, list):
            return pa.large_list(arrow_type(value[0]))
        return types.get(type(value), pa.float64())

    table = pa.Table.from_pylist([{name: list(v) if isinstance(v, tuple) else v for name, v in event.items()}
                                  for event in events],
                                 schema=pa.schema([(name, arrow_type(value)) for name, value in values.items()]))
    return _listed(index.match_batch(table))


def check_long_string_bounds(algorithm: str, backend: str, route: str, options: dict | None = None) -> None:
    """NumPy's StringDType ``searchsorted`` was wrong for strings of 16
    bytes or more (numpy issue 31533): bounds on long shared prefixes."""
    idx = Index(algorithm=algorithm, backend=backend, options=options)
    idx.add(1, "url > 'https://example.com/a'")
    idx.add(2, "country = 'US'")
    for _ in range(2):                     # in the delta, then merged into the main segment
        assert _pinned_answers(idx, [{"url": "https://example.com/b"}], route) == [[1]]
        assert _pinned_answers(idx, [{"country": "US"}], route) == [[2]]
        assert _pinned_answers(idx, [{"url": "https://example.com/a"}, {"url": "https://example.com/a/b"},
                                     {"url": "https://example.com/", "country": "US"}], route) == [[], [1], [2]]
        idx.merge()


def check_uuids(algorithm: str, backend: str, route: str, n: int = 100, options: dict | None = None) -> None:
    """UUIDs that differ in their last characters, each its own equality."""
    uuids = UUIDS[:n]
    events = [{"user": u} for u in uuids]
    idx = Index(algorithm=algorithm, backend=backend, options=options)
    idx.add_many(range(n), [f"user = '{u}'" for u in uuids])
    for _ in range(2):
        got = _pinned_answers(idx, events, route)
        assert got == [[i] for i in range(n)], f"{sum(map(len, got))} matches of {n}"
        idx.merge()
    idx = Index(algorithm=algorithm, backend=backend, options=options)       # one by one into the delta as well
    for i, u in enumerate(uuids):
        idx.add(i, f"user = '{u}'")
    assert _pinned_answers(idx, events, route) == [[i] for i in range(n)]


def check_embedded_nul(algorithm: str, backend: str, route: str, options: dict | None = None) -> None:
    """NUL inside a string is an ordinary character (it sorts first)."""
    idx = Index(algorithm=algorithm, backend=backend, options=options)
    idx.add(1, "s = 'a\x00b'")
    idx.add(2, "s < 'a\x00c'")
    idx.add(3, "s > 'a'")
    for _ in range(2):
        assert _pinned_answers(idx, [{"s": "a\x00c"}], route) == [[3]]
        assert _pinned_answers(idx, [{"s": "a\x00b"}, {"s": "a"}, {"s": "a\x00"}], route) == [[1, 2, 3], [2], [2, 3]]
        idx.merge()


def check_extreme_ids(algorithm: str, backend: str, route: str, options: dict | None = None) -> None:
    """int64's ends as subscription ids, in the delta, in main, after a
    save and load (whose file check once took ``np.diff`` of the ids: it
    overflowed) and in a subset."""
    ids = [-2 ** 63, 0, 1, 2 ** 63 - 1]      # (0 - (-2**63) overflows int64)
    events = [{"n0": 1, "s0": "ab"}, {}]
    idx = Index(algorithm=algorithm, backend=backend, options=options)
    for i, text in zip(ids, ["n0 = 1", "n0 >= 1", "s0 LIKE 'a%'", "n0 IS NULL"]):
        idx.add(i, text)
    want = [ids[:3], ids[3:]]
    assert _pinned_answers(idx, events, route) == want
    idx.merge()
    assert _pinned_answers(idx, events, route) == want
    with tempfile.TemporaryDirectory() as folder:
        path = os.path.join(folder, "extreme-ids.bexidx")
        idx.save(path)
        loaded = Index.load(path, backend=backend)
        assert_options(loaded, algorithm, options, "loaded")
        assert _pinned_answers(loaded, events, route) == want
    part = idx.subset([ids[0], ids[3]])
    assert_options(part, algorithm, options, "subset")
    assert _pinned_answers(part, events, route) == [ids[:1], ids[3:]]


def check_float_extremes(algorithm: str, backend: str, route: str, options: dict | None = None) -> None:
    """float64's ends as bounds and as values: a strict bound past the
    largest finite float (whose neighbour is infinity -- NumPy's
    ``nextafter`` reports that step as an overflow, which BE-Tree's interval
    bounds once raised as a warning), the smallest subnormal, and ``-0.0``
    equal to ``0.0``."""
    big, tiny = 1.7976931348623157e308, 5e-324
    texts = [f"n > {big!r}", f"n < {-big!r}", f"n >= {big!r}", f"n <= {-big!r}",
             f"n BETWEEN {tiny!r} AND {big!r}", "n = -0.0", "n >= 1"]
    events = [{"n": big}, {"n": -big}, {"n": tiny}, {"n": 0.0}, {"n": 5.0}]
    want = [[2, 4, 6], [3], [4], [5], [4, 6]]
    from engine.parse import parse
    assert want == [[i for i, text in enumerate(texts) if matches(parse(text), event)] for event in events]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        idx = Index(algorithm=algorithm, backend=backend, options=options)
        idx.add_many(range(len(texts)), texts)
        for _ in range(2):
            assert _pinned_answers(idx, events, route) == want
            idx.merge()


def check_list_attributes(algorithm: str, backend: str, route: str, options: dict | None = None) -> None:
    """The ad-serving vocabulary: audience segments as UUIDs (long strings
    sharing 30 characters), deal ids as numbers; lists of 200 elements,
    repeated elements, None elements (ignored), empty lists (not NULL) and
    absent ones (NULL); in the delta, then merged."""
    texts = [f"segments ONE OF ('{UUIDS[1]}', '{UUIDS[2]}')",
             f"segments NONE OF ('{UUIDS[1]}') AND deals IS NOT EMPTY",
             f"segments ALL OF ('{UUIDS[1]}', '{UUIDS[99]}', '{UUIDS[1]}')",
             "7 IN deals AND NOT 8 IN deals",
             "deals IS EMPTY OR segments IS NULL",
             f"NOT (segments ONE OF ('{UUIDS[3]}') OR deals ALL OF (1, 2.5))",
             "deals ONE OF (-0.0, 9007199254740992)"]
    events = [{"segments": UUIDS[:200], "deals": [7, 7, None, 1]},
              {"segments": [UUIDS[2], UUIDS[2]], "deals": []},
              {"segments": [None], "deals": [0.0, 2.5, 1]},
              {"deals": [8, 7, 9007199254740992]},
              {"segments": [], "deals": [None]},
              {"segments": [UUIDS[99], UUIDS[1]], "deals": (8,)},
              {}]
    idx = Index(algorithm=algorithm, backend=backend, options=options,
                schema={"segments": "list<string>", "deals": "list<numeric>"})
    idx.add_many(range(len(texts)), texts)
    from engine.parse import parse
    want = [[i for i, text in enumerate(texts) if matches(parse(text), event)] for event in events]
    assert sum(map(len, want)) >= 8
    for _ in range(2):
        assert _pinned_answers(idx, events, route) == want
        idx.merge()


def check_pinned(algorithm: str, backend: str, options: dict | None = None) -> None:
    """Every pinned example by every route (on ``cuda``, by the list of
    dicts only: the routes differ on the host)."""
    for route in PINNED_ROUTES if backend == "cpu" else ("dicts",):
        check_long_string_bounds(algorithm, backend, route, options)
        check_uuids(algorithm, backend, route, n=100 if backend == "cpu" else 8, options=options)
        check_embedded_nul(algorithm, backend, route, options)
        check_extreme_ids(algorithm, backend, route, options)
        check_float_extremes(algorithm, backend, route, options)
        check_list_attributes(algorithm, backend, route, options)


# ------------------------------------------------------------------ the whole suite
def run_whole_suite(algorithm: str, backend: str, tmp_path, max_examples: int | None = None,
                    options: dict | None = None) -> dict:
    """Every check of the conformance suite on one algorithm, backend and
    options (what the parametrised tests run, in one call); returns the
    tallies."""
    tallies = {lifecycle: check_lifecycle(algorithm, backend, lifecycle, tmp_path, max_examples, options)
               for lifecycle in LIFECYCLES}
    check_pinned(algorithm, backend, options)
    if backend == "cpu":
        check_large_batch(algorithm, backend, max_examples=1, options=options)
    return tallies


__all__ = ["BACKENDS", "LIFECYCLES", "SCHEMA", "VARIANT_CHECKS", "Oracle", "Tally", "Workload", "accepts", "answers",
           "assert_options", "cases", "check_large_batch", "check_lifecycle", "check_pinned", "lifecycle_cases",
           "options_id", "run_lifecycle", "run_whole_suite", "variants", "workloads"]
