"""The registry of matching algorithms: what exists, where its paper says
it, and how to build it on each backend.

One :class:`Algorithm` entry per algorithm: its name, the paper and sections
it implements, its matcher class per backend (as ``"module:Class"``,
imported on first use so that ``import engine`` loads no kernel), its
options dataclass (:mod:`engine.algorithms.options`), the expression forms
it indexes natively, and -- for an algorithm with a rewrite limit -- the
add-time test that sends an expression beyond it to the residual matcher
(:mod:`engine.algorithms.residual`).  Adding an algorithm is its modules
plus one :func:`register` call here; the Index, the CLI, the benchmarks and
the conformance suite (``tests/test_conformance.py``) take it from the
registry.
"""

from __future__ import annotations

import dataclasses

import importlib
from dataclasses import dataclass, field

from engine.algorithms.options import APCMOptions, BETreeOptions, OpIndexOptions, Options, ScanOptions
from engine.errors import BackendUnavailable, ExpressionTooLarge
from engine.expr import And, Pred


def _load(target: str):
    module, _, name = target.partition(":")
    return getattr(importlib.import_module(module), name)


@dataclass(frozen=True)
class Algorithm:
    """One registered algorithm (see the module docstring)."""

    name: str
    #: the paper's name for it, the paper (a citation) and the sections implemented
    title: str
    paper: str
    sections: str
    #: backend -> "module:Class" of its matcher
    implementations: dict = field(default_factory=dict)
    options: type = Options
    #: the expression forms matched by the algorithm's own structure
    native_forms: tuple = ()
    #: "module:function" raising ExpressionTooLarge for an expression beyond
    #: the algorithm's rewrite limit (``f(node, dnf_limit)``); None: every
    #: expression is native
    limit_check: str | None = None
    #: extra option mappings (each a dict of the algorithm's options) under
    #: which the shared conformance suite (tests/conformance.py) also runs the
    #: algorithm, besides its defaults: parameters whose paths only small
    #: workloads with small values reach (a tree that splits at all); a
    #: mapping with an option of one backend only runs on that backend
    conformance_options: tuple = ()

    @property
    def backends(self) -> tuple[str, ...]:
        return tuple(self.implementations)

    def option_backends(self, options: dict | None) -> tuple[str, ...]:
        """The backends of the algorithm that take every option named in
        ``options`` (None or empty: all of them)."""
        fields = {f.name: f for f in dataclasses.fields(self.options)}
        return tuple(b for b in self.backends
                     if all(name in fields and b in fields[name].metadata["backends"] for name in options or ()))

    def matcher_class(self, backend: str):
        target = self.implementations.get(backend)
        if target is None:
            runs = ", ".join(self.implementations) or "no backend"
            raise BackendUnavailable(f"algorithm {self.name!r} is not implemented for backend {backend!r}; "
                                     f"it runs on {runs}")
        return target if isinstance(target, type) else _load(target)

    def make_options(self, mapping: dict | None, backend: str) -> Options:
        return self.options.from_mapping(mapping, backend)

    def indexes(self, node, dnf_limit: int) -> bool:
        """Whether the algorithm's own structure takes ``node`` (else the
        residual matcher does)."""
        return self.limit_error(node, dnf_limit) is None

    def limit_error(self, node, dnf_limit: int) -> ExpressionTooLarge | None:
        """The algorithm's refusal of ``node`` (for ``strict=True``), or None."""
        if self.limit_check is None or _is_conjunction(node):
            return None     # a conjunction is one unit of every normal form: native to every algorithm
        try:
            _load(self.limit_check)(node, dnf_limit)
        except ExpressionTooLarge as exc:
            return exc
        return None


def _is_conjunction(node) -> bool:
    """A predicate or an AND of predicates: the common case, decided
    without building a normal form."""
    return isinstance(node, Pred) or (isinstance(node, And) and all(isinstance(c, Pred) for c in node.children))


_REGISTRY: dict[str, Algorithm] = {}


def register(algorithm: Algorithm, *, replace: bool = False) -> Algorithm:
    """Add ``algorithm`` to the registry (``replace=True`` to redefine one)."""
    if not algorithm.name or not algorithm.name.replace("-", "_").isidentifier():
        raise ValueError(f"an algorithm name is a word, not {algorithm.name!r}")
    if algorithm.name in _REGISTRY and not replace:
        raise ValueError(f"algorithm {algorithm.name!r} is registered already")
    if not algorithm.implementations:
        raise ValueError(f"algorithm {algorithm.name!r} names no implementation")
    known = {f.name for f in dataclasses.fields(algorithm.options)}
    for options in algorithm.conformance_options:     # else the suite would skip that variant without a word
        unknown = sorted(set(options) - known)
        if unknown:
            raise ValueError(f"algorithm {algorithm.name!r}: conformance_options {dict(options)} name "
                             f"{', '.join(map(repr, unknown))}, not an option of {algorithm.options.__name__} "
                             f"(its options: {', '.join(sorted(known)) or 'none'})")
    _REGISTRY[algorithm.name] = algorithm
    return algorithm


def unregister(name: str) -> None:
    _REGISTRY.pop(name, None)


def algorithms() -> tuple[Algorithm, ...]:
    return tuple(_REGISTRY.values())


def names(backend: str | None = None) -> tuple[str, ...]:
    """The registered algorithms (those implemented on ``backend``)."""
    return tuple(a.name for a in _REGISTRY.values() if backend is None or backend in a.implementations)


def get(name: str) -> Algorithm:
    found = _REGISTRY.get(name)
    if found is None:
        raise BackendUnavailable(f"unknown algorithm {name!r}; algorithms are {', '.join(_REGISTRY)}")
    return found


def matcher_class(name: str, backend: str):
    """The matcher class of algorithm ``name`` on ``backend``, or a clear error."""
    return get(name).matcher_class(backend)


def default_algorithm(backend: str) -> str:
    """The best registered algorithm on ``backend``."""
    for name in ("opindex", "scan"):
        if name in _REGISTRY and backend in _REGISTRY[name].implementations:
            return name
    found = names(backend)
    if not found:
        raise BackendUnavailable(f"no algorithm is implemented for backend {backend!r}")
    return found[0]


register(Algorithm(
    name="scan", title="scan", paper="(none: the baseline)", sections="",
    implementations={"cpu": "engine.algorithms.scan:ScanMatcher",
                     "cuda": "engine.algorithms.scan_cuda:ScanCudaMatcher"},
    options=ScanOptions,
    native_forms=("every expression: its postfix program evaluated on every event",)))

register(Algorithm(
    name="opindex", title="OpIndex",
    paper="Zhang, Chan, Tan. An Efficient Publish/Subscribe Index for E-Commerce Databases. PVLDB 7(8), 2014",
    sections="§4 (index and matching), §6 (DNF/CNF, prefix)",
    implementations={"cpu": "engine.algorithms.opindex:OpIndexMatcher",
                     "cuda": "engine.algorithms.opindex_cuda:OpIndexCudaMatcher"},
    options=OpIndexOptions,
    native_forms=("conjunctions", "DNF within dnf_limit conjunctions", "CNF within dnf_limit clauses",
                  "prefix LIKE 'abc%' (PREFIX lists)"),
    limit_check="engine.algorithms.opindex:check_expression",
    conformance_options=({"segments": 1, "signature_bits": 1},)))

register(Algorithm(
    name="betree", title="BE-Tree",
    paper="Sadoghi, Jacobsen. BE-Tree: An Index Structure to Efficiently Match Boolean Expressions over "
          "High-dimensional Discrete Space. SIGMOD 2011",
    sections="§3 (expressions), §4 (space partitioning and clustering), §5 (ranking), §6 (matching)",
    implementations={"cpu": "engine.algorithms.betree:BETreeMatcher",
                     "cuda": "engine.algorithms.betree_cuda:BETreeCudaMatcher"},
    options=BETreeOptions,
    native_forms=("conjunctions", "DNF within dnf_limit conjunctions"),
    limit_check="engine.algorithms.betree:check_expression",
    conformance_options=({"max_cap": 1, "min_size": 1},)))

register(Algorithm(
    name="apcm", title="A-PCM",
    paper="Sadoghi, Jacobsen. Adaptive Parallel Compressed Event Matching. ICDE 2014",
    sections="§IV (bitmap encoding), §V (PCM: compression, unrolling, parallel paths), §VI (OSR, A-PCM)",
    implementations={"cpu": "engine.algorithms.apcm:APCMMatcher",
                     "cuda": "engine.algorithms.apcm_cuda:APCMCudaMatcher"},
    options=APCMOptions,
    native_forms=("conjunctions (BE-Tree's units)", "DNF within dnf_limit conjunctions"),
    limit_check="engine.algorithms.apcm:check_expression",
    conformance_options=({"max_cap": 1, "min_size": 1, "batch_size": 4, "cluster_size": 2, "threshold": 0,
                          "variant": "pcm"},
                         # C (no unrolling) over arrival-order runs; A-PCM's adaptive split of re-ordered
                         # clusters is the default case's (tests/test_apcm.py runs every variant besides)
                         {"variant": "pcm", "unroll": False, "cluster_size": 3, "reorder": False},
                         {"variant": "bitmap"},
                         # A-PCM over OpIndex's lists (cpu only): every cluster of two counted compressed
                         {"over": "opindex", "variant": "pcm", "batch_size": 4, "cluster_size": 2, "threshold": 0})))

# (imported here, next to their registrations, so that concurrent additions to the import above do not collide)
from engine.algorithms.options import PSTBloomOptions, PSTHashOptions  # noqa: E402

register(Algorithm(
    name="pstbloom", title="PSTBloom (PS-Tree)",
    paper="Ji, Jacobsen. PS-Tree-Based Efficient Boolean Expression Matching for High-Dimensional and Dense "
          "Workloads. PVLDB 12(3), 2018",
    sections="§3.3 (selectivity), §4 (PS-Tree), §5 (PSTBloom)",
    implementations={"cpu": "engine.algorithms.pstree:PSTBloomMatcher",
                     "cuda": "engine.algorithms.pstree_cuda:PSTBloomCudaMatcher"},
    options=PSTBloomOptions,
    native_forms=("conjunctions", "DNF within dnf_limit conjunctions"),
    # the paper's Algorithm 5, signatures probed, one event at a time (the cpu default takes 64 and probes none)
    conformance_options=({"lanes": 1},),
    limit_check="engine.algorithms.pstree:check_expression"))

register(Algorithm(
    name="psthash", title="PSTHash (PS-Tree)",
    paper="Ji, Jacobsen. PS-Tree-Based Efficient Boolean Expression Matching for High-Dimensional and Dense "
          "Workloads. PVLDB 12(3), 2018",
    sections="§3.3 (selectivity), §4 (PS-Tree), §6 (PSTHash)",
    implementations={"cpu": "engine.algorithms.pstree:PSTHashMatcher",
                     "cuda": "engine.algorithms.pstree_cuda:PSTHashCudaMatcher"},
    options=PSTHashOptions,
    native_forms=("conjunctions", "DNF within dnf_limit conjunctions"),
    # (no option variant: CI time; n_access 1 and 3 and the key bound's fallback are checked against scan
    # in tests/test_pstree.py)
    limit_check="engine.algorithms.pstree:check_expression"))

from engine.algorithms.options import ATreeOptions  # noqa: E402

register(Algorithm(
    name="atree", title="A-Tree",
    paper="Ji, Jacobsen. A-Tree: A Dynamic Data Structure for Efficiently Indexing Arbitrary Boolean "
          "Expressions. SIGMOD 2021",
    sections="§4.1-§4.2 (unique nodes, expression ids, reorganisation, self-adjustment, use counts, deletion), "
             "§5 (level-ordered matching, zero suppression, propagation on demand)",
    implementations={"cpu": "engine.algorithms.atree:ATreeMatcher",
                     "cuda": "engine.algorithms.atree_cuda:ATreeCudaMatcher"},
    options=ATreeOptions,
    native_forms=("every expression: AND, OR, NOT (folded into predicates), XOR, XNOR, as shared n-ary nodes",)))
# (no conformance variant: the defaults' cases already cost the suite ~40 s; the ablations, sharing=False and
# reorganize=False and self_adjust=False, are held to scan through every update path in tests/test_atree.py)
