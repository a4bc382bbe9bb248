"""``engine.Index``: the public API (docs/architecture.md#the-public-api).

An index is a *main* compiled segment, matched by the chosen algorithm, plus
a small *delta* of subscriptions added since the last merge (A-PCM's update
scheme, docs/architecture.md#the-index-life-cycle): the delta is compiled at ``add`` time and matched
alongside the main segment, removals are tombstones (a cleared ``alive``
flag) until the next merge, and a merge rebuilds the main segment when the
delta or the tombstones grow.  The algorithm's structures need not be
rebuilt with it: a matcher with a ``merged(segment, old_to_new, added,
schema)`` method (every indexing algorithm: opindex, betree, apcm,
pstbloom, psthash, atree) is derived from the last one (see
:meth:`Index.merge`).  A batch's result never depends on where a
subscription sits.

**Concurrency.**  The whole state lives in one immutable
:class:`~engine.snapshot.Snapshot`.  A match reads the current snapshot
once and sees exactly the subscriptions added and not removed before it
started -- every update completed before it, none that completes after --
whatever other threads do meanwhile; it holds no lock.  Updates (``add``,
``add_many``, ``remove``, ``merge``) are serialised among themselves by a
lock that matches never take; each builds the next snapshot aside and
publishes it with one reference store, so a merge never blocks a match and
never changes the answer of one in flight.  An update that fails publishes
nothing and takes back what it added to the schema.
"""

from __future__ import annotations

import copy
import dataclasses
import logging
import os
import sys
import threading
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Union

import numpy as np
import pyarrow as pa

from engine import events as event_batches
from engine.algorithms import ALGORITHMS, default_algorithm, registry
from engine.algorithms import residual as residual_split
from engine.algorithms.base import BuildSettings
from engine.algorithms.host_tasks import threads_for
from engine.algorithms.options import ScanOptions
from engine.backend import array_namespace, resolve_backend
from engine.columnar import compile_columnar, texts_as_columns
from engine.compile import (Segment, compile_expressions, concat_segments, merge_segments, program_depths,
                            sorted_by_id, without_unused_predicates)
from engine.errors import BexmatchError, IndexFileError
from engine.expr import AstChecks, Node, predicates
from engine.forks import renew_after_fork
from engine.index_file import check_saved_options, needed_depth, read_index_file, restore_contents, write_index_file
from engine.schema import Schema
from engine.snapshot import BUILD, MatcherSource, Snapshot
from gpu_kernels import cuda_support, opcodes
from gpu_kernels.compaction import merge_parts, shift_rows

if TYPE_CHECKING:
    import pandas

    from engine.algorithms.base import Matcher
    from engine.explain import Explanation
    from engine.schema import SchemaView

#: what match_batch / match_stream take: dicts (attribute -> value), an Arrow table or batch, a pandas frame
Events = Union[Sequence[Mapping[str, Any]], pa.Table, pa.RecordBatch, "pandas.DataFrame"]

logger = logging.getLogger(__name__)
#: algorithm/backend pairs built in this process so far (the first build of each may compile kernels)
_BUILT_ONCE: set = set()
#: text add_many shows a progress bar (stderr) once it has run this long
PROGRESS_AFTER_S = 1.0
#: text add_many of at least this many expressions reads the plain
#: conjunctions into the columnar form (fewer: the fixed cost of the array
#: operations is more than it saves)
_COLUMNAR_TEXTS_FROM = 64

DEFAULT_DNF_LIMIT = 256
#: working memory of one slice of a large batch (matcher scratch, pairs,
#: ids): a batch whose matches would need more is matched in event slices,
#: so that the peak stays near the output itself (8-16 bytes a pair stay
#: in the output: see _BYTES_PER_PAIR_WORKING for what a slice holds)
MATCH_MEMORY_BUDGET = 512 << 20
#: the forms match_batch returns its matches in
MATCH_OUTPUTS = ("list", "arrow", "arrow_lists", "device")
#: bytes held a pair while a slice is matched (its output included), with one
#: segment and with a delta beside it.  Measured as the resident high-water
#: mark of a whole batch of 20 M pairs (tests/test_large_results.py's
#: workload, 2026-11-30): one segment 17-20 (an index's int32 slab, then the
#: two int64 columns written once), `scan` 27; with a delta 33 (each part's
#: columns, their ids concatenated, the merged answer: merge_parts).  A
#: slice set by the budget is then 2.5x wider than with the one figure of 80
#: before (W4's, 97 K matches an event: 53-58 events, now about 170; no
#: faster for it, within the noise of three runs each: BENCHMARKS.md).
_BYTES_PER_PAIR_WORKING = {False: 32, True: 48}
#: an event slice is at most this many times as wide as the one before it,
#: however few matches the slices so far had (a slice's matches are only
#: known once it is matched: this bounds how far a skewed batch overshoots)
SLICE_GROWTH = 4


def _slice_width(left: int, max_pairs: int, per_event: float, last: int) -> int:
    """The width of the next event slice, ``left`` events to go, after a
    slice ``last`` events wide that had at most ``per_event`` matches an
    event: what the budget holds, at most SLICE_GROWTH times ``last`` (a
    quiet start, few matches an event, must not size the rest of a skewed
    batch as one slice).  Where the budget sets it, the events left go in
    equal slices: 85 and 85, not 85, 82 and 3 (a short slice costs a
    64-lane A-Tree task a whole group)."""
    fits = max(1, int(max_pairs / max(per_event, 1e-9)))
    if fits >= SLICE_GROWTH * last:
        return SLICE_GROWTH * last
    return -(-left // -(-left // fits))


def _conjunction_programs(segment: Segment) -> np.ndarray:
    """Per subscription, whether its program is one predicate or an AND of
    predicates (no other instruction)."""
    offsets, kind = segment.prog_offsets, segment.prog_kind
    if not len(segment):
        return np.zeros(0, dtype=bool)
    others = np.add.reduceat((kind != opcodes.LEAF).astype(np.int64), offsets[:-1])
    return (others == 0) | ((others == 1) & (kind[offsets[1:] - 1] == opcodes.AND))


def _as_id(sub_id) -> int:
    if isinstance(sub_id, (bool, np.bool_)) or not isinstance(sub_id, (int, np.integer)):
        raise TypeError(f"subscription ids are int64, not {type(sub_id).__name__} {sub_id!r}")
    if not -2 ** 63 <= int(sub_id) < 2 ** 63:
        raise OverflowError(f"subscription id {sub_id} does not fit in int64")
    return int(sub_id)


def _as_ids(ids) -> list[int]:
    """``[_as_id(i) for i in ids]``, with the common case (Python ints in
    range) checked by C loops."""
    ids = list(ids)
    if set(map(type, ids)) <= {int} and (not ids or (-2 ** 63 <= min(ids) and max(ids) < 2 ** 63)):
        return ids
    return [_as_id(i) for i in ids]


def _sub_id_array(ids) -> np.ndarray:
    """``ids`` as an int64 array, checked as :func:`_as_ids` checks them (an
    integer NumPy array in range goes through whole: the shards of
    :meth:`Index.split`)."""
    if isinstance(ids, np.ndarray) and ids.dtype.kind in "iu" and ids.ndim == 1:
        if ids.dtype.kind == "i" or not len(ids) or int(ids.max()) < 2 ** 63:
            return ids.astype(np.int64, copy=False)
    return np.array(_as_ids(ids), dtype=np.int64)


def _parse(text: str) -> Node:
    from engine.parse import parse   # the lark grammar is built on first use
    return parse(text)


class Index:
    """A set of subscriptions (Boolean expressions) matched against events.

    Parameters
    ----------
    algorithm : one of :data:`engine.ALGORITHMS`; default the best
        implemented on the backend.
    backend : ``"cpu"`` or ``"cuda"``; default the best available here.
    schema : optional ``{attribute: "numeric" | "string" | "boolean" |
        "list<numeric>" | "list<string>"}`` declaring type families up
        front (aliases as :mod:`engine.schema` lists them).
    dnf_limit : the most conjunctions (or clauses) a normal-form algorithm
        may make of one expression; an expression beyond it is *residual*:
        matched exactly by the residual matcher (``atree``) inside the same
        index and counted in :meth:`statistics`.
    options : the algorithm's options (its dataclass in
        :mod:`engine.algorithms.options`), e.g. ``{"variant": "bs"}`` for
        OpIndex-BS, ``{"segments": 64}``, or ``{"event_log": batch}`` for
        OpIndex's pivot frequencies; checked here (TypeError/ValueError).
    strict : refuse residual expressions at ``add`` time with
        :class:`engine.errors.ExpressionTooLarge` instead.

    Any number of threads may match while others update (see the module
    docstring for what a match sees).

    Examples
    --------
    >>> idx = Index(algorithm="scan", backend="cpu")
    >>> idx.add(7, "price <= 580 AND color = 'silver'")
    >>> idx.match({"price": 550, "color": "silver"}).tolist()
    [7]
    """

    def __init__(self, algorithm: str | None = None, backend: str | None = None, *,
                 schema: dict | None = None, dnf_limit: int = DEFAULT_DNF_LIMIT, options: dict | None = None,
                 strict: bool = False):
        self.backend = resolve_backend(backend)
        self.algorithm = default_algorithm(self.backend) if algorithm is None else algorithm
        self._algorithm = registry.get(self.algorithm)
        self._matcher_class = self._algorithm.matcher_class(self.backend)
        if isinstance(dnf_limit, (bool, np.bool_)) or not isinstance(dnf_limit, (int, np.integer)) or dnf_limit < 1:
            raise ValueError(f"dnf_limit must be a positive int, not {dnf_limit!r}")
        self.dnf_limit = int(dnf_limit)
        if not isinstance(strict, (bool, np.bool_)):
            raise TypeError(f"strict must be True or False, not {strict!r}")
        self.strict = bool(strict)
        self._options = self._algorithm.make_options(options, self.backend)
        self.options = dict(options or {})
        # the residual matcher runs on the same backend with the same device settings
        self._residual = registry.get(residual_split.RESIDUAL_ALGORITHM)
        shared = {name: value for name, value in self._options.keywords(self.backend).items()
                  if name in ScanOptions.__dataclass_fields__}
        self._residual_options = self._residual.make_options(shared, self.backend)
        if schema is not None and not isinstance(schema, Mapping):
            raise TypeError(f"schema is a mapping of attribute name to type family, e.g. {{'price': 'numeric'}}, "
                            f"not {type(schema).__name__}")
        self._schema = Schema()
        for attr, family in (schema or {}).items():
            self._schema.declare(attr, family)
        self._write_lock = threading.RLock()
        #: the most matches an event the last sliced batch measured: the next batch's first slice starts from it
        #: (None before any)
        self._per_event_hint: float | None = None
        renew_after_fork(self, Index._after_fork)
        self._state = Snapshot(self._schema.view(), Segment.empty(), np.zeros(0, np.uint8), 0, (), BUILD)

    def _after_fork(self) -> None:
        """In a forked child, the update lock anew: one held at the fork by an
        updating thread (which the child does not have) would block the
        child's every update."""
        self._write_lock = threading.RLock()

    # ------------------------------------------------------------------ contents
    @property
    def schema(self) -> Schema:
        return self._schema

    @property
    def _main(self) -> Segment:
        """The current main segment (tests and benchmarks look inside)."""
        return self._state.main

    @property
    def _matcher(self):
        """The current snapshot's matcher if a match has built it, else None."""
        return _built_matcher(self._state)

    @property
    def nbytes(self) -> int:
        """Host bytes held by the compiled index: the main segment, the
        delta, and the algorithm's structure once built -- it is built
        lazily, by the first match (or save) after a merge, so before that
        this counts the compiled segments only; ``idx.match({})`` builds it."""
        return _nbytes(self._state)

    def statistics(self) -> dict:
        """What the index holds now: ``subscriptions`` (live), ``main``
        (live in the main segment), ``delta`` (added since the last merge),
        ``tombstones`` (removed, not yet merged), ``residual`` (live ones
        beyond the algorithm's rewrite limit, matched by the residual
        matcher), ``nbytes`` and ``device_nbytes`` (0 until a match built
        the matcher on the device) -- all of one snapshot (an update in
        another thread lands wholly before or after)."""
        state = self._state
        residual = 0 if state.main.residual is None else \
            int(np.count_nonzero(state.main.residual & (state.alive != 0)))
        matcher = _built_matcher(state)
        return {"algorithm": self.algorithm, "backend": self.backend, "subscriptions": len(state),
                "main": len(state.main) - state.n_dead, "delta": state.delta_size, "tombstones": state.n_dead,
                "residual": residual + sum(s.n_residual for s in state.delta), "nbytes": _nbytes(state),
                "device_nbytes": 0 if matcher is None else matcher.device_nbytes}

    def __len__(self) -> int:
        return len(self._state)

    def __contains__(self, sub_id) -> bool:
        try:
            sub_id = _as_id(sub_id)
        except (TypeError, OverflowError):
            return False
        state = self._state
        return _main_position(state, sub_id) >= 0 or any(sub_id in s.sub_ids for s in state.delta)

    def ids(self) -> np.ndarray:
        """Every subscription id in the index, ascending, of one snapshot
        (an update in another thread lands wholly before or after)."""
        state = self._state
        alive = state.main.sub_ids[np.flatnonzero(state.alive)]
        if not state.delta:
            return alive
        return np.sort(np.concatenate([alive, *(segment.sub_ids for segment in state.delta)]))

    # ------------------------------------------------------------- reading back
    def expression(self, sub_id: int) -> str:
        """The text of subscription ``sub_id`` as the index holds it: rebuilt
        from its compiled program, so in negation normal form (``NOT``
        pushed down to the predicates), printed by the parser's printer --
        parsing it gives back the same subscription.  KeyError for an
        unknown id."""
        from engine.parse import to_text
        return to_text(self._expression_node(self._state, sub_id))

    def __getitem__(self, sub_id) -> str:
        """``idx[sub_id]``: :meth:`expression`."""
        return self.expression(sub_id)

    def items(self) -> Iterator[tuple[int, str]]:
        """``(id, text)`` for every subscription, ids ascending, all from the
        snapshot current at the call (the texts made one by one as the
        iteration goes)."""
        from engine.parse import to_text
        state = self._state         # read here, not at the first next(): updates after the call are not seen
        where = [(int(i), state.main, int(p)) for p in np.flatnonzero(state.alive)
                 for i in (state.main.sub_ids[p],)]
        for segment in state.delta:
            where += [(int(i), segment, p) for p, i in enumerate(segment.sub_ids.tolist())]
        where.sort(key=lambda item: item[0])
        return ((sub_id, to_text(segment.expression(position, state.view))) for sub_id, segment, position in where)

    def __iter__(self) -> Iterator[tuple[int, str]]:
        """Iterating over an index gives :meth:`items`: ``(id, text)`` pairs."""
        return self.items()

    def explain(self, sub_id: int, event: dict) -> "Explanation":
        """Why subscription ``sub_id`` matches ``event`` or not: its
        expression (as :meth:`expression` gives it) as a tree of
        :class:`engine.explain.Explanation` nodes, each with its value --
        True, False or None (NULL; for a predicate, the attribute the event
        lacks).  Prints as an indented tree; ``.to_dict()`` is plain data;
        ``.matches`` is what :meth:`match` says of this subscription.  The
        event is checked as :meth:`match` checks it (BadEventError for a
        value the index refuses); KeyError for an unknown id."""
        from engine.explain import explain
        if not isinstance(event, Mapping):
            raise TypeError(f"explain takes one event as a dict (a mapping), not {type(event).__name__}")
        state = self._state
        node = self._expression_node(state, sub_id)
        self._match_one(state, event)            # match's checks of the event (BadEventError)
        return explain(node, event)

    @staticmethod
    def _expression_node(state: Snapshot, sub_id) -> Node:
        sub_id = _as_id(sub_id)
        at = _main_position(state, sub_id)
        if at >= 0:
            return state.main.expression(at, state.view)
        for segment in state.delta:
            found = np.flatnonzero(segment.sub_ids == sub_id)
            if len(found):
                return segment.expression(int(found[0]), state.view)
        raise KeyError(f"subscription id {sub_id} is not in the index")

    def subset(self, ids: Iterable[int]) -> "Index":
        """A new index holding only the given subscriptions (compiled form
        copied, nothing re-parsed), with the whole schema, so that it codes
        and judges events exactly like this one -- e.g. one shard of a
        sharded Spark job.  KeyError for an id not in the index; TypeError
        for one that is not an integer (as :meth:`add` says)."""
        ids = np.unique(_sub_id_array(ids))
        with self._write_lock:
            self.merge()
            state = self._state
            positions = np.searchsorted(state.main.sub_ids, ids)
            found = positions < len(state.main.sub_ids)
            found[found] = (state.main.sub_ids[positions[found]] == ids[found]) & (state.alive[positions[found]] != 0)
            if not found.all():
                raise KeyError(f"subscription id {int(ids[~found][0])} is not in the index")
            part = Index(algorithm=self.algorithm, backend=self.backend, dnf_limit=self.dnf_limit,
                         options=self.options, strict=self.strict)
            part._schema = copy.deepcopy(self._schema)
            part._install_main(without_unused_predicates(state.main.take(positions)))
        return part

    def subsets(self, groups: Iterable[Iterable[int]]) -> list["Index"]:
        """:meth:`subset` of each group of ids, all of one state of this
        index (no update lands between them: the shards of one Spark job)."""
        with self._write_lock:
            return [self.subset(ids) for ids in groups]

    def split(self, k: int) -> list["Index"]:
        """``k`` indexes by subscription id, all of one state of this one:
        the s-th holds the s-th of ``k`` contiguous, equally sized runs of the
        sorted ids (:meth:`subset` of each)."""
        if isinstance(k, (bool, np.bool_)) or not isinstance(k, (int, np.integer)):
            raise TypeError(f"shards must be an int, not {type(k).__name__} {k!r}")
        if k < 1:
            raise ValueError(f"shards must be >= 1, not {k}")
        with self._write_lock:
            ids = self.ids()
            return self.subsets(ids[positions] for positions in np.array_split(np.arange(len(ids)), k))

    # ------------------------------------------------------------------- updates
    def add(self, sub_id: int, expression: str | Node) -> None:
        """Add one subscription.  ``expression`` is text or an AST.  A bad
        expression or a present id raises and leaves the index unchanged."""
        self.add_many([sub_id], [expression])

    def add_many(self, ids: Iterable[int] | pa.Table | pa.RecordBatch,
                 expressions: Iterable[str | Node] | None = None, *,
                 progress: bool | None = None) -> None:
        """Add many subscriptions: ``add_many(ids, expressions)`` with
        sequences of ids and texts/ASTs, or ``add_many(table)`` with the
        columnar one-row-per-predicate form (engine.columnar; connective
        rows make any expression, in postfix).  All or
        nothing: a bad row raises and leaves the index unchanged.
        ``progress``: a progress bar on stderr for texts (None: only once
        parsing has taken over :data:`PROGRESS_AFTER_S` seconds; False:
        never)."""
        with self._write_lock:
            mark = self._schema.mark()
            try:
                if expressions is None:
                    segment = self._compile_columnar(ids)
                else:
                    segment = self._compile_texts(ids, expressions, progress)
            except BaseException:
                self._schema.rollback(mark)
                raise
            if len(segment):
                self._publish(delta=self._state.delta + (segment,))
                self._changed(bulk=expressions is None)

    def _compile_texts(self, ids, expressions, progress: bool | None = None) -> Segment:
        if isinstance(expressions, (str, bytes)):
            raise TypeError("add_many takes a sequence of expressions, not one string: use add(id, text)")
        ids = _as_ids(ids)
        expressions = list(expressions)
        if len(ids) != len(expressions):
            raise ValueError(f"{len(ids)} ids but {len(expressions)} expressions")
        self._check_new_ids(np.array(ids, dtype=np.int64))
        from tqdm import tqdm

        from engine.parse import collector_paused
        # progress=None: tqdm's own rule (a terminal only), after PROGRESS_AFTER_S; True: always; False: never
        bar = dict(total=len(ids), desc="add_many", unit="subscription", file=sys.stderr,
                   delay=0 if progress else PROGRESS_AFTER_S, disable=None if progress is None else not progress,
                   leave=False)
        with collector_paused():
            if len(ids) < _COLUMNAR_TEXTS_FROM:
                return self._finish(*self._compile_rows(ids, tqdm(zip(ids, expressions), **bar)))
            # Plain conjunctions go the columnar way (read, not parsed into
            # ASTs; then array operations), the rest one by one.  Should the
            # columnar way refuse anything, the whole batch goes one by one,
            # so that errors read as the text route words them.
            progress_bar = tqdm(expressions, **bar)
            # (a disabled bar still passes every text through a generator)
            table, others = texts_as_columns(ids, expressions if progress_bar.disable else progress_bar)
            mark = self._schema.mark()
            try:
                parts = [compile_columnar(table, self._schema)[0]] if table.num_rows else []
                residual = [np.zeros(len(parts[0]), dtype=bool)] if parts else []
                if others:
                    segment, flags = self._compile_rows([ids[p] for p in others],
                                                        ((ids[p], expressions[p]) for p in others))
                    parts.append(segment)
                    residual.append(flags)
            except Exception as error:     # noqa: BLE001 -- the text route says what is wrong, or takes it
                self._schema.rollback(mark)
                logger.debug("add_many: the columnar way refused the batch (%s); compiling it text by text", error)
                return self._finish(*self._compile_rows(ids, zip(ids, expressions)))
            return self._finish(concat_segments(parts), np.concatenate(residual))

    def _compile_rows(self, ids: list, rows) -> tuple[Segment, np.ndarray]:
        """Check, register and compile ``(id, text or AST)`` rows; the
        segment and which of its subscriptions are residual."""
        nodes, all_preds, residual = [], [], []
        fixed: dict = {}
        pending: list = []
        checks = AstChecks()        # ASTs sharing nodes: each distinct node checked once in this call
        for sub_id, expression in rows:
            if isinstance(expression, str):
                node = _parse(expression)
                preds = list(predicates(node))
            else:
                node, preds = expression, checks(expression)    # the predicates not met before in this call
            # check against the schema as it would be after the previous rows
            families: list = []
            changes = self._schema.check_predicates(preds, where=f"subscription {sub_id}", families=families,
                                                    earlier=fixed, pending=pending)
            fixed.update(changes)       # (checked against ``fixed`` as against the schema: nothing clashes here)
            refusal = self._algorithm.limit_error(node, self.dnf_limit)   # e.g. opindex: DNF/CNF within dnf_limit
            if refusal is not None and self.strict:
                raise refusal
            residual.append(refusal is not None)
            nodes.append(node)
            all_preds.append((preds, families))
        # (an IS EMPTY on an attribute that a later expression of the call types: as the columnar form, which
        # sees the whole table, takes it -- one batch, one answer, whatever its order)
        self._schema.check_pending(pending, fixed)
        for preds, families in all_preds:
            self._schema.register(preds, families)
        return compile_expressions(ids, nodes, self._schema, checks.shared), np.array(residual, dtype=bool)

    def _finish(self, segment: Segment, residual: np.ndarray) -> Segment:
        """The segment sorted by id, with its residual flags: the given ones,
        and on cuda programs deeper than a device thread's stack (residual,
        for the A-Tree: no stack, no depth limit)."""
        if self.backend == "cuda" and self.algorithm != residual_split.RESIDUAL_ALGORITHM:
            residual = residual | self._too_deep_for_the_device(segment)
        if residual.any():
            segment.residual = residual
        return sorted_by_id(segment)

    def _too_deep_for_the_device(self, segment: Segment) -> np.ndarray:
        """Per subscription, whether its program needs more operand slots than
        a cuda thread holds (an AND/OR of more than
        ``gpu_kernels.scan.MAX_STACK_DEPTH`` operands): residual, matched by
        the A-Tree -- or refused with ``strict=True``."""
        from gpu_kernels.scan import MAX_STACK_DEPTH
        deep = program_depths(segment.prog_offsets, segment.prog_kind, segment.prog_arg) > MAX_STACK_DEPTH
        if deep.any() and self.strict:
            from engine.algorithms.cuda_base import check_program_depths
            check_program_depths(segment.take(np.flatnonzero(deep)[:1]))
        return deep

    def _beyond_the_limit(self, segment: Segment, path) -> np.ndarray:
        """Per subscription of a segment compiled for another algorithm (a
        saved index loaded as this one), whether this algorithm leaves it to
        the residual matcher: as :meth:`_compile_rows` decides, from each
        program's expression -- only for programs that are not a plain
        conjunction, which every algorithm takes."""
        residual = np.zeros(len(segment), bool)
        if self._algorithm.limit_check is None or not len(segment):
            return residual
        kinds, offsets = segment.prog_kind, segment.prog_offsets
        connectives = np.add.reduceat((kinds != opcodes.LEAF).astype(np.int64), offsets[:-1])
        plain = (connectives == 0) | ((connectives == 1) & (kinds[offsets[1:] - 1] == opcodes.AND))
        for position in np.flatnonzero(~plain).tolist():
            refusal = self._algorithm.limit_error(segment.expression(position, self._schema), self.dnf_limit)
            if refusal is not None and self.strict:
                raise type(refusal)(f"{path}: subscription {int(segment.sub_ids[position])}: {refusal} "
                                    f"(the index is strict: {self.algorithm} would refuse it)") from None
            residual[position] = refusal is not None
        return residual

    def _check_residual_flags(self, segment: Segment, path, saved_backend: str) -> None:
        """Refuse (IndexFileError) a file whose residual flags are not what
        its algorithm decides at its ``dnf_limit`` (and, saved from a cuda
        index, for programs too deep for a device thread), where no saved
        structure will check them: a subscription flagged native beyond the
        limit failed every match, at the build of the first (PS-Tree saves
        no structure)."""
        try:
            expected = self._beyond_the_limit(segment, path)
            if saved_backend == "cuda" and self.algorithm != residual_split.RESIDUAL_ALGORITHM and len(segment):
                expected |= self._too_deep_for_the_device(segment)
        except BexmatchError as exc:              # (a strict index: the file holds what its algorithm refuses)
            raise IndexFileError(f"{path}: {exc}") from None
        flags = np.zeros(len(segment), bool) if segment.residual is None else segment.residual
        if not np.array_equal(flags, expected):
            position = int(np.flatnonzero(flags != expected)[0])
            raise IndexFileError(f"{path}: not a valid bexmatch index file (subscription "
                                 f"{int(segment.sub_ids[position])} is flagged "
                                 f"{'residual' if flags[position] else 'native'}, but {self.algorithm} at dnf_limit "
                                 f"{self.dnf_limit} makes it {'residual' if expected[position] else 'native'})")

    def _compile_columnar(self, table) -> Segment:
        if isinstance(table, pa.RecordBatch):
            table = pa.Table.from_batches([table])
        if not isinstance(table, pa.Table):
            try:
                table = pa.table(table)         # a mapping of columns, a DataFrame
            except (TypeError, ValueError, pa.ArrowException) as exc:
                raise TypeError(f"add_many with one argument takes the columnar form (a pyarrow Table or "
                                f"RecordBatch, or a mapping of its columns), not {type(table).__name__}; texts "
                                f"and ASTs go as add_many(ids, expressions)") from exc
        segment, _ = compile_columnar(table, self._schema, check_ids=self._refuse_present)
        # conjunctions are native to every algorithm; an expression of connective rows is checked, as an
        # AST is, by an algorithm with a limit (OpIndex's DNF/CNF size...): residual, or refused when strict
        residual = np.zeros(len(segment), dtype=bool)
        if self._algorithm.limit_check is not None:
            view = self._schema.view()
            for position in np.flatnonzero(~_conjunction_programs(segment)):
                refusal = self._algorithm.limit_error(segment.expression(int(position), view), self.dnf_limit)
                if refusal is not None and self.strict:
                    raise refusal
                residual[position] = refusal is not None
        return self._finish(segment, residual)

    def _check_new_ids(self, ids: np.ndarray) -> None:
        unique, counts = np.unique(ids, return_counts=True)
        if (counts > 1).any():
            raise KeyError(f"subscription id {int(unique[counts > 1][0])} given more than once")
        self._refuse_present(unique)

    def _refuse_present(self, unique_ids: np.ndarray) -> None:
        clash = _present(self._state, unique_ids)
        if clash is not None:
            raise KeyError(f"subscription id {clash} is already in the index")

    def remove(self, sub_id: int) -> None:
        """Remove one subscription; KeyError for an unknown id."""
        sub_id = _as_id(sub_id)
        with self._write_lock:
            state = self._state
            if (pos := _main_position(state, sub_id)) >= 0:
                alive = state.alive.copy()       # the published flags stay as they are
                alive[pos] = 0                   # a tombstone until the next merge
                self._publish(alive=alive, n_dead=state.n_dead + 1)
            else:
                for i, segment in enumerate(state.delta):
                    hit = segment.sub_ids == sub_id
                    if hit.any():
                        kept = segment.take(np.flatnonzero(~hit))
                        delta = state.delta[:i] + ((kept,) if len(kept) else ()) + state.delta[i + 1:]
                        self._publish(delta=delta)
                        break
                else:
                    raise KeyError(f"subscription id {sub_id} is not in the index")
            self._changed()

    def _publish(self, *, alive=None, n_dead=None, delta=None) -> None:
        """Make the next snapshot current: this one's main segment (and
        matcher), with the given tombstones and delta."""
        state = self._state
        self._state = Snapshot(self._schema.view(), state.kept_main(), state.alive if alive is None else alive,
                               state.n_dead if n_dead is None else n_dead, state.delta if delta is None else delta,
                               state.kept_source())

    def _changed(self, bulk: bool = False) -> None:
        state = self._state
        if len(state.delta) > 32:      # many small adds: one delta segment (matches concatenate less)
            # sorted by id, as every delta segment is: the id lookups search them (unsorted, an id already
            # there could be added again)
            self._publish(delta=(sorted_by_id(concat_segments(list(state.delta))),))
            state = self._state
        main = len(state.main)
        if bulk or state.delta_size > max(1024, main // 16) or state.n_dead > max(1024, main // 4):
            self.merge()

    def merge(self) -> None:
        """Fold the delta into the main segment and drop tombstones.

        The main segment is rebuilt aside (:func:`engine.compile.merge_segments`:
        ids ascending, unused predicates dropped, codes carried) and
        published with the next snapshot; matches in flight keep the
        snapshot they started with.  The next match derives the new matcher
        from the old one through the algorithm's ``merged`` (OpIndex updates
        its structure instead of building it again)."""
        with self._write_lock:
            state = self._state
            if not (state.n_dead or state.delta):
                return                          # nothing to fold: keep the matcher
            coded = state._main_part[0].predicates if state._main_part is not None else state.main.predicates
            started = time.perf_counter()
            segment, old_to_new = merge_segments(state.main, state.alive, state.delta, coded, self._schema)
            self._state = Snapshot(self._schema.view(), segment, np.ones(len(segment), np.uint8), 0, (),
                                   state.merged_source(old_to_new))
            logger.info("merge: %d subscriptions (%d added, %d removed) in %.2f s; the %s index follows at the "
                        "next match", len(segment), state.delta_size, state.n_dead, time.perf_counter() - started,
                        self.algorithm)

    def _install_main(self, segment: Segment, saved=None) -> None:
        """Make ``segment`` the whole index (load, subset): a fresh matcher,
        or the one restored from ``saved`` (``(meta, arrays)`` of a file)."""
        with self._write_lock:
            segment = segment.coded(self._schema)     # (a subset's segment may share a published table)
            source = BUILD
            if saved is not None:
                view = self._schema.view()
                settings = BuildSettings(view, self.dnf_limit, self._options)
                meta, arrays = saved
                matcher = residual_split.build(
                    segment, lambda part: self._matcher_class.from_arrays(part, settings, meta, arrays),
                    lambda part: self._build_residual(part, view))
                source = MatcherSource("reuse", matcher, segment)
            self._state = Snapshot(self._schema.view(), segment, np.ones(len(segment), np.uint8), 0, (), source)

    # ------------------------------------------------------------------ matching
    def build_matcher(self, segment: Segment, view: SchemaView) -> Matcher:
        """The matcher of a main segment from scratch: the algorithm's, with
        the residual subscriptions split off to the residual matcher."""
        settings = BuildSettings(view, self.dnf_limit, self._options)
        started = time.perf_counter()
        matcher = residual_split.build(segment, lambda part: self._matcher_class.build(part, settings),
                                       lambda part: self._build_residual(part, view))
        self._log_built("built", len(segment), time.perf_counter() - started)
        return matcher

    def derive_matcher(self, matcher: Matcher, segment: Segment, old_to_new: np.ndarray, added: np.ndarray,
                       view: SchemaView) -> Matcher:
        """The matcher of a merged main segment, derived from the last one."""
        started = time.perf_counter()
        derived = residual_split.derive(matcher, segment, old_to_new, added, view,
                                        lambda part: self._build_residual(part, view))
        self._log_built(f"derived at a merge ({len(added)} added)", len(segment),
                        time.perf_counter() - started)
        return derived

    def _log_built(self, how: str, n: int, seconds: float) -> None:
        key = (self.algorithm, self.backend)
        first = key not in _BUILT_ONCE
        _BUILT_ONCE.add(key)
        logger.info("%s/%s index %s over %d subscriptions in %.2f s", self.algorithm, self.backend, how, n, seconds)
        if first and seconds > 2.0:
            logger.info("(the first %s/%s index of this process: that includes numba compiling or loading its "
                        "kernels; engine.warmup() does this up front)", self.algorithm, self.backend)

    def _build_residual(self, segment: Segment, view):
        """The residual matcher (A-Tree), on the index's backend: its DAG has
        no depth limit, so a program too deep for a device thread's stack
        runs on the device there too."""
        return self._residual.matcher_class(self.backend).build(
            segment, BuildSettings(view, self.dnf_limit, self._residual_options))

    def _matchers(self):
        """(segment, alive, matcher) for the main segment and the delta of
        the current snapshot."""
        return self._state.matchers(self)

    def match(self, event: Mapping[str, object]) -> np.ndarray:
        """Ids of the subscriptions TRUE on one event (dict), ascending."""
        return self._match_one(self._state, event)

    def _match_one(self, state: Snapshot, event: Mapping[str, object]) -> np.ndarray:
        """:meth:`match` against the snapshot ``state``: the batch route
        without what only a batch needs (output forms, event slices sized
        to a memory budget: one event's matches are at most the index)."""
        if not isinstance(event, Mapping):
            raise TypeError(f"match takes one event as a dict (a mapping), not {type(event).__name__}")
        return self._match_encoded(state, event_batches.encode_events([event], state.view, "raise"))[1]

    def pinned(self) -> "PinnedIndex":
        """The index as it is now, for several matches that must agree: its
        ``match``, ``match_batch`` and ``match_stream`` read this state
        whatever updates and merges come after (each call on the index
        itself reads the state current at that call)."""
        return PinnedIndex(self, self._state)

    def match_batch(self, events: Events | Mapping[str, Any], *, output: str = "list", errors: str = "raise",
                    id_column: str | None = None, valid: Mapping[str, Any] | None = None
                    ) -> list[np.ndarray] | pa.Table | tuple:
        """Match a batch: a list of dicts, a pyarrow Table/RecordBatch or a
        pandas DataFrame (one row per event, null = absent).

        ``output="list"``: one ascending int64 id array per event (none for
        an empty batch).
        ``output="arrow"``: a pyarrow Table ``(event int64, sub_id int64)``,
        ordered by event then id -- the form for large batches.
        ``output="arrow_lists"``: a pyarrow Table with one row per event,
        ``(event int64, sub_ids list<int64>)`` (ids ascending, an empty
        list when nothing matched): offsets and ids, about 8 bytes a match
        and 12 an event, the column in chunks of events as they were
        matched.
        ``output="device"`` (backend ``cuda``): the same two columns as
        device arrays (CuPy; NumPy under the simulator) that never leave
        the GPU, for GPU pipelines.
        ``errors="null"`` treats values of the wrong type as absent;
        ``errors="report"`` returns ``(results, rejected)``: the events with
        a bad value match nothing (an empty array, no rows) and ``rejected``
        lists them, one :class:`engine.errors.BadEventError` per event with
        its ``event`` position, ``attribute``, ``value`` and ``reason``.

        The whole batch is matched against one snapshot of the index.  A
        batch whose matches would need more than
        :data:`MATCH_MEMORY_BUDGET` of working memory is matched in event
        slices, so that the peak stays near the size of the output; for
        outputs larger than memory, see :meth:`match_stream`.

        ``id_column``: the events' own identity -- a column of a table or
        DataFrame, a key of the dicts, or the name of a DataFrame's index --
        which is not an attribute: it is left out of matching, and
        ``output="arrow"`` and ``"arrow_lists"`` name each match's event by
        it (a column of that name, of its type, instead of ``event``).
        KeyError when an event lacks it.

        Events already on the device (backend ``cuda``): ``events`` a
        mapping of attribute name to device column -- CuPy, numba device
        arrays, PyTorch tensors, cuDF columns: anything with the CUDA Array
        Interface or DLPack, one value per event -- and a string attribute
        as the pair ``(device codes, dictionary)``; ``valid`` maps an
        attribute to a device boolean column, True where the event carries
        it (absent otherwise).  A cuDF ``DataFrame`` goes in as it is, and
        a cuDF ``Series`` among the columns brings its nulls (absent), as
        does a column whose CUDA Array Interface carries a ``mask``.
        Sparse events (a map column of attribute -> value) come as an
        :class:`engine.DeviceMap`, alone or among the columns.  They are
        encoded on the device (:mod:`engine.device_events`) and matched
        there; ``id_column`` does not apply."""
        return self._match_batch(self._state, events, output, errors, id_column, valid)

    def _match_batch(self, state: Snapshot, events, output: str, errors: str, id_column, valid):
        """:meth:`match_batch` against the snapshot ``state``."""
        if output not in MATCH_OUTPUTS:
            raise ValueError(f"output must be one of {', '.join(map(repr, MATCH_OUTPUTS))}, not {output!r}")
        from engine import device_events
        if device_events.is_device_frame(events):           # a cuDF DataFrame, by the protocol
            if valid is not None:
                raise ValueError("valid= goes with a mapping of device columns; a DataFrame's nulls are its "
                                 "absent values")
            events, valid = device_events.frame_columns(events)
        lifted, valid = device_events.lift_nulls(events, valid)      # cuDF Series, interface masks: device columns
        if lifted is not events or device_events.is_device_columns(events):
            return self._match_device_columns(state, lifted, valid, output, errors, id_column)
        if valid is not None:
            raise ValueError("valid= goes with device columns (a mapping of attribute to device array)")
        if id_column is not None and output == "device":
            raise ValueError("id_column names the events in output='arrow' (and is left out of matching with "
                             "'list'); output='device' keeps event positions")
        if output == "device" and self.backend != "cuda":
            raise ValueError("output='device' needs backend='cuda'")
        event_ids = None
        if id_column is not None:
            events, event_ids = _split_event_ids(events, id_column)
        batch = event_batches.encode_events(events, state.view, errors)
        rejected = list(getattr(batch, "rejected", ()))
        if output == "device":
            found = self._match_encoded(state, batch, device=True)
            if rejected:
                xp = array_namespace(self.backend)
                keep = ~xp.isin(found[0], xp.asarray([bad.event for bad in rejected], dtype=np.int64))
                found = (found[0][keep], found[1][keep])
        # each slice goes into the output form as it comes, so that only the
        # output and one slice's working memory are held at once
        elif output == "arrow":
            events_out, ids_out = [], []
            for _, _, event_idx, sub_ids in self._match_slices(state, batch, rejected=rejected):
                events_out.append(event_idx)
                ids_out.append(sub_ids)
            found = pa.table({"event": pa.chunked_array(events_out, pa.int64()),
                              "sub_id": pa.chunked_array(ids_out, pa.int64())})
            if event_ids is not None:
                found = pa.table({id_column: event_ids.take(found["event"]), "sub_id": found["sub_id"]})
        elif output == "arrow_lists":
            # one list array per slice, over that slice's ids as they are: no copy of the output
            lists = [_list_array(_event_offsets(event_idx, first, stop), sub_ids)
                     for first, stop, event_idx, sub_ids in self._match_slices(state, batch, rejected=rejected)]
            found = pa.table({"event" if event_ids is None else id_column:
                              pa.array(np.arange(batch.n_events, dtype=np.int64)) if event_ids is None
                              else event_ids,
                              "sub_ids": pa.chunked_array(lists, pa.list_(pa.int64()))})
        else:
            found = []
            for first, stop, event_idx, sub_ids in self._match_slices(state, batch, rejected=rejected):
                found.extend(np.split(sub_ids, _event_offsets(event_idx, first, stop)[1:-1]))
        return (found, rejected) if errors == "report" else found

    def match_stream(self, events: Events, *, errors: str = "raise", max_pairs: int | None = None,
                     id_column: str | None = None) -> Iterator[pa.RecordBatch]:
        """Match a batch and yield its matches as pyarrow RecordBatches
        ``(event int64, sub_id int64)``, ordered by event then id, each of
        at most about ``max_pairs`` rows (default: what
        :data:`MATCH_MEMORY_BUDGET` holds; one event's matches are never
        split) -- for outputs larger than memory: no batch is empty, but
        the one batch yielded when nothing matches.  The whole batch is
        matched against the snapshot current when the call is made.
        ``id_column``: as in :meth:`match_batch` (the batches' first column
        is then the events' ids, named by it)."""
        return self._match_stream(self._state, events, errors, max_pairs, id_column)

    def _match_stream(self, state: Snapshot, events, errors: str, max_pairs, id_column):
        """:meth:`match_stream` against the snapshot ``state``."""
        # (not a generator itself: the snapshot is taken, and the events checked, at the call)
        if errors == "report":
            raise ValueError("match_stream takes errors='raise' or 'null'; use match_batch(errors='report') "
                             "to have bad events reported")
        if max_pairs is not None and (isinstance(max_pairs, bool) or not isinstance(max_pairs, (int, np.integer))
                                      or max_pairs < 1):
            raise ValueError(f"max_pairs must be None or an integer >= 1, not {max_pairs!r}")
        from engine import device_events
        if device_events.is_device_frame(events) or device_events.is_device_columns(events):
            raise TypeError("match_stream takes events on the host; events on the device go to match_batch "
                            "(output='device' keeps the matches there, output='arrow' brings them back)")
        event_ids = None
        if id_column is not None:
            events, event_ids = _split_event_ids(events, id_column)
        batch = event_batches.encode_events(events, state.view, errors)
        names = ["event" if id_column is None else id_column, "sub_id"]

        def piece(event_idx: np.ndarray, sub_ids: np.ndarray) -> pa.RecordBatch:
            first = pa.array(event_idx, pa.int64())
            if event_ids is not None:
                first = event_ids.take(first)
            return pa.RecordBatch.from_arrays([first, pa.array(sub_ids, pa.int64())], names=names)

        def pieces() -> Iterator[pa.RecordBatch]:
            # no empty piece for a slice without matches (how many there are depends on the slicing, not on
            # the answer), but one when nothing matched at all: a reader always gets the columns' types
            matched = False
            for _, _, slice_events, slice_ids in self._match_slices(state, batch, max_pairs):
                # a slice is sized by the slice before it, so a skewed batch can overshoot: cut it again
                for start, stop in _runs_of_events(slice_events, max_pairs):
                    if stop > start:
                        matched = True
                        yield piece(slice_events[start:stop], slice_ids[start:stop])
            if not matched:
                yield piece(np.zeros(0, np.int64), np.zeros(0, np.int64))
        return pieces()

    def _match_slices(self, state: Snapshot, batch, max_pairs: int | None = None, rejected=()):
        """``(first, stop, event index, sub ids)`` of each event slice
        ``[first, stop)`` of ``batch``, sized so that a slice's pairs fit
        the working-memory budget; each slice measures the most matches an
        event had, which sizes the next (growing at most SLICE_GROWTH
        times), and the events left are cut into slices of one width (no
        short last slice).  The first slice of a batch is the one that fits
        if every subscription matches, or, once a batch before measured its
        matches, as wide as that measure allows up to SLICE_GROWTH times it
        (the bound a probe before it would have set).  The pairs of
        ``rejected`` events are dropped."""
        bad = np.array([r.event for r in rejected], dtype=np.int64)
        explicit = max_pairs
        if max_pairs is None:
            max_pairs = MATCH_MEMORY_BUDGET // _BYTES_PER_PAIR_WORKING[_merges_parts(state.matchers(self))]
        max_pairs = max(1, int(max_pairs))
        n_events = batch.n_events
        whole_if_small = explicit is None      # (a stream's max_pairs holds for small batches too)
        state.matchers(self)        # (built first, on every core: a small batch then runs on one)
        with threads_for(n_events, len(state)):
            batch = self._with_list_truth(state, batch)
            # the LIKE/MATCHES table over the whole batch, once: the slices share its strings (a table per
            # slice would evaluate a value that recurs in several slices again, and each is strings x patterns)
            truth = self._pattern_truth(state, batch)
        first = 0
        per_event = None
        width = 0
        while first < n_events:
            if per_event is None:       # probe with a slice that fits even if every subscription matches
                small = n_events <= 64 and whole_if_small
                width = n_events if small else max(1, min(max_pairs // max(1, len(state)), 4096))
                if not small and self._per_event_hint is not None:
                    # a batch before measured its matches: a service's next batch starts where a probe of this
                    # one would have taken it (W5 at 1 M: 6 events, and a 64-lane A-Tree task of 3)
                    width = max(width, _slice_width(n_events - first, max_pairs, self._per_event_hint, width))
            else:
                width = _slice_width(n_events - first, max_pairs, per_event, width)
            stop = min(n_events, first + width)
            part = batch if (first, stop) == (0, n_events) else _event_slice(batch, first, stop)
            event_idx, sub_ids = self._match_encoded(state, part, truth=truth)
            if first and event_idx.flags.writeable and event_idx.dtype == np.int64:
                shift_rows(event_idx, np.int64(first))  # (a new array of the matcher's; on every core: W1's
                #                                          100 M pairs took 86 ms on one, an H200 host's)
            elif first:
                event_idx = event_idx + first
            if len(bad):
                keep = ~np.isin(event_idx, bad)
                event_idx, sub_ids = event_idx[keep], sub_ids[keep]
            # the most matches one event of the slice had, not their mean: a slice whose last events
            # match far more than its first (a skewed batch) sizes the next one by those.  The pairs are in
            # event order, so each event's run is found by a binary search (a bincount of W1's 16 M pairs a
            # slice read them all, one core, 20 ms)
            measured = float(np.diff(_event_offsets(event_idx, first, stop)).max()) if len(event_idx) else 0.0
            per_event = measured if per_event is None else max(0.5 * per_event + 0.5 * measured, measured)
            self._per_event_hint = per_event
            yield first, stop, event_idx, sub_ids
            first = stop

    def _with_list_truth(self, state: Snapshot, batch):
        """``batch`` with the list predicates' truth of its event lists
        filled in (itself when it has no list, or has it already: the event
        slices of one batch share its lists, so `_match_slices` fills it in
        once for them all)."""
        rows = len(batch.list_offsets) - 1
        if rows == 0 or int(batch.list_truth[0]) == rows + 1:
            return batch
        indexes = [seg.predicates.list_index(state.view) for seg, _, _ in state.matchers(self)]
        return dataclasses.replace(batch, list_truth=event_batches.list_truth(batch, indexes))

    def _pattern_truth(self, state: Snapshot, batch) -> np.ndarray:
        """The LIKE/MATCHES results of ``batch``'s strings for the patterns
        of the snapshot's segments (:func:`engine.events.pattern_truth`)."""
        parts = [pairs for pairs in (seg.predicates.pattern_pairs() for seg, _, _ in state.matchers(self))
                 if len(pairs)]
        pairs = parts[0] if len(parts) == 1 else np.unique(np.concatenate(parts), axis=0) if parts else \
            np.zeros((0, 2), np.int64)
        return event_batches.pattern_truth(batch, state.view, pairs)

    def _match_encoded(self, state: Snapshot, batch, device: bool = False, strings=None, truth=None):
        """Matches of an encoded batch; ``strings``: the batch whose string
        entries the LIKE/MATCHES results are computed over, when ``batch``
        lives on the device (:mod:`engine.device_events`); ``truth``: those
        results when the caller has them (a slice of a batch whose table
        was made once)."""
        matchers = state.matchers(self)
        with threads_for(batch.n_events, len(state)):   # (the matchers built first, on every core)
            if truth is None:
                truth = self._pattern_truth(state, batch if strings is None else strings)
            batch = self._with_list_truth(state, batch)
            xp = array_namespace(self.backend) if device else np
            host_batch = batch if strings is None else None
            events, ids = [], []
            for k, (segment, alive, matcher) in enumerate(matchers):
                on_device = device and k == 0        # (the small delta is matched on the host)
                given = batch
                if matcher.backend != "cuda":        # a host matcher (the delta's scan) reads a host copy
                    if host_batch is None:
                        host_batch = event_batches.EventBatch(
                            *(cuda_support.to_host(getattr(batch, f))
                              for f in ("offsets", "attr", "value", "token")), batch.strings)
                    given = host_batch
                e, sub_ids = matcher.match(given, truth, alive,
                                           ids=state.device_ids(xp) if on_device else segment.sub_ids,
                                           output="device" if on_device else "numpy")
                events.append(xp.asarray(e))
                ids.append(xp.asarray(sub_ids))
            if len(matchers) == 1:
                return events[0], ids[0]
            if xp is np:                     # each part's pairs merged into the others' by event, every core
                return merge_parts(events, ids, batch.n_events)
            event_idx, sub_ids = xp.concatenate(events), xp.concatenate(ids)
            order = xp.lexsort(xp.stack([sub_ids, event_idx]))
            return event_idx[order], sub_ids[order]

    def _match_device_columns(self, state: Snapshot, columns, valid, output: str, errors: str, id_column):
        from engine import device_events
        if self.backend != "cuda":
            raise ValueError("device columns need backend='cuda'; this index runs on "
                             f"{self.backend!r} (copy the columns to the host and pass a table)")
        if id_column is not None:
            raise ValueError("id_column does not apply to device columns: matches name events by position")
        batch, strings = device_events.encode_device_columns(columns, valid, state.view, errors)
        n_events = len(batch.offsets) - 1
        event_idx, sub_ids = self._match_encoded(state, batch, device=output == "device", strings=strings)
        rejected = list(batch.rejected)
        if rejected:         # a refused event matches nothing (not even IS NULL: it was encoded empty)
            xp = array_namespace(self.backend) if output == "device" else np
            keep = ~xp.isin(xp.asarray(event_idx), xp.asarray([bad.event for bad in rejected], dtype=np.int64))
            event_idx, sub_ids = event_idx[keep], sub_ids[keep]
        if output == "device":
            found = event_idx, sub_ids
        else:
            event_idx, sub_ids = np.asarray(event_idx, np.int64), np.asarray(sub_ids, np.int64)
            if output == "arrow":
                found = pa.table({"event": pa.array(event_idx, pa.int64()), "sub_id": pa.array(sub_ids, pa.int64())})
            elif output == "arrow_lists":
                found = pa.table({"event": pa.array(np.arange(n_events, dtype=np.int64)),
                                  "sub_ids": _list_array(_event_offsets(event_idx, 0, n_events), sub_ids)})
            else:
                found = np.split(sub_ids, _event_offsets(event_idx, 0, n_events)[1:-1]) if n_events else []
        return (found, rejected) if errors == "report" else found

    # ------------------------------------------------------------- persistence
    def save(self, path: str | os.PathLike) -> None:
        """Write the index to ``path`` atomically (temp file + rename), with
        the permissions ``open()`` would give a new file: the main segment,
        the schema, and the algorithm's built structure (``to_arrays``), so
        that :meth:`load` does not build it again -- the matcher is built
        here if no match has built it yet.  Algorithm options that are
        plain values are saved with it; an ``event_log`` (tuning only: it
        steers OpIndex's pivots, never the results) is not, and is passed
        to ``load`` again if wanted."""
        path = os.fsdecode(path)            # (a bytes path too, as open() takes one)
        with self._write_lock:           # one state: no update between the merge and the write
            self.merge()
            self._write(path)

    def _write(self, path) -> None:
        state = self._state
        seg, preds = state.main, state.main.predicates
        set_offsets, set_keys = self._schema.set_csr()
        arrays = {"sub_ids": seg.sub_ids, "prog_offsets": seg.prog_offsets, "prog_kind": seg.prog_kind,
                  "prog_arg": seg.prog_arg, "pred_attr": preds.attr, "pred_op": preds.op,
                  "pred_lo_key": preds.lo_key, "pred_hi_key": preds.hi_key, "pred_aux": preds.aux,
                  "set_offsets": set_offsets, "set_keys": set_keys}
        if seg.residual is not None:
            arrays["residual"] = seg.residual.astype(np.int8)
        meta = {"algorithm": self.algorithm, "backend": self.backend, "dnf_limit": self.dnf_limit,
                "strict": self.strict, "max_depth": needed_depth(seg), "options": self._options.saved(),
                "schema": self._schema.to_json()}
        structure = state.main_part(self)[1].to_arrays() if len(seg) else None
        if structure is not None:
            matcher_meta, matcher_arrays = structure
            meta["matcher"] = {"algorithm": self.algorithm, "meta": matcher_meta}
            arrays.update({f"matcher.{name}": array for name, array in matcher_arrays.items()})
        write_index_file(path, meta, arrays)

    @classmethod
    def load(cls, path: str | os.PathLike, *, backend: str | None = None, algorithm: str | None = None,
             options: dict | None = None, rebuild: bool = False) -> "Index":
        """Read an index written by :meth:`save`.  The saved structure of
        the algorithm is used as it is (no build) unless another algorithm
        or options changing the structure are asked for, or ``rebuild``:
        the structure is checked to be safe to run, not to be the one the
        subscriptions build, so a file from a source not trusted is loaded
        with ``rebuild=True`` (built from its subscriptions at the first
        match, as after ``add_many``).  Whatever is wrong
        with the file -- truncated, corrupt, foreign, or crafted contents,
        saved options and structure included -- raises
        :class:`engine.errors.IndexFileError` naming ``path`` (a directory
        too); a missing file raises FileNotFoundError."""
        path = os.fsdecode(path)        # (a bytes path too, as open() takes one)
        meta, arrays = read_index_file(path)
        schema, segment = restore_contents(path, meta, arrays)
        algorithm = meta["algorithm"] if algorithm is None else algorithm       # ("" is no algorithm's name)
        backend = resolve_backend(meta["backend"] if backend is None else backend)
        same = algorithm == meta["algorithm"]
        saved_options = check_saved_options(path, registry.get(meta["algorithm"]), meta["backend"], backend,
                                            meta["options"])
        saved_options = saved_options if same else {}
        index = cls(algorithm=algorithm, backend=backend, dnf_limit=meta["dnf_limit"],
                    options={**saved_options, **(options or {})}, strict=meta.get("strict", False))
        index._schema = schema
        saved = None
        if same and not rebuild and "matcher" in meta and index._options.same_structure(saved_options, backend):
            prefix = "matcher."
            saved = (meta["matcher"]["meta"], {name[len(prefix):]: array for name, array in arrays.items()
                                               if name.startswith(prefix)})
        # the file's residual flags are its algorithm's and backend's: another algorithm leaves other
        # expressions to the residual matcher, and a cuda index those too deep for a device thread
        residual = segment.residual if same else index._beyond_the_limit(segment, path)
        if same and saved is None:
            index._check_residual_flags(segment, path, meta["backend"])
        if backend == "cuda" and algorithm != residual_split.RESIDUAL_ALGORITHM and len(segment):
            residual = index._too_deep_for_the_device(segment) | (False if residual is None else residual)
        segment.residual = residual if residual is not None and residual.any() else None
        try:
            index._install_main(segment, saved)
        except (ValueError, TypeError, KeyError, IndexError) as exc:
            if saved is None:
                raise
            raise IndexFileError(f"{path}: the saved {algorithm} structure is not valid: {exc}") from exc
        return index

    def __repr__(self) -> str:
        return f"Index(algorithm={self.algorithm!r}, backend={self.backend!r}, subscriptions={len(self)})"



class PinnedIndex:
    """One state of an :class:`Index` (:meth:`Index.pinned`), matched like
    the index; it holds that state's structures alive while it is kept."""

    def __init__(self, index: Index, state: Snapshot):
        self._index = index
        self._state = state

    def __len__(self) -> int:
        return len(self._state)

    def __repr__(self) -> str:
        return f"PinnedIndex({self._index.algorithm!r}, {self._index.backend!r}, {len(self)} subscriptions)"

    def match(self, event: Mapping[str, object]) -> np.ndarray:
        """:meth:`Index.match` against this state."""
        return self._index._match_one(self._state, event)

    def match_batch(self, events: Events | Mapping[str, Any], *, output: str = "list", errors: str = "raise",
                    id_column: str | None = None, valid: Mapping[str, Any] | None = None):
        """:meth:`Index.match_batch` against this state."""
        return self._index._match_batch(self._state, events, output, errors, id_column, valid)

    def match_stream(self, events: Events, *, errors: str = "raise", max_pairs: int | None = None,
                     id_column: str | None = None) -> Iterator[pa.RecordBatch]:
        """:meth:`Index.match_stream` against this state."""
        return self._index._match_stream(self._state, events, errors, max_pairs, id_column)


def _merges_parts(matchers) -> bool:
    """Whether a match merges the pairs of several parts (segments, or an
    algorithm's indexed and residual subscriptions), which holds more
    memory a pair than one part's answer (:data:`_BYTES_PER_PAIR_WORKING`)."""
    parts = sum(2 if isinstance(m, residual_split.ResidualMatcher) and len(m.residual_pos) else 1
                for _, _, m in matchers)
    return parts > 1


def _runs_of_events(event_idx: np.ndarray, max_pairs: int | None) -> Iterator[tuple[int, int]]:
    """``[start, stop)`` row ranges of ``event_idx`` (sorted), each as many
    whole events as fit ``max_pairs`` rows, at least one event (one event's
    matches are never split); the whole when ``max_pairs`` is None."""
    n = len(event_idx)
    if max_pairs is None or n <= max_pairs:
        yield 0, n
        return
    max_pairs = max(1, int(max_pairs))
    starts = np.flatnonzero(np.diff(event_idx, prepend=event_idx[0] - 1))     # each event's first row
    bounds = np.append(starts, n)
    start = 0
    while start < n:
        # the last event boundary within max_pairs rows of start; the next one if the first event is larger
        stop = int(bounds[np.searchsorted(bounds, start + max_pairs, side="right") - 1])
        if stop <= start:
            stop = int(bounds[np.searchsorted(bounds, start, side="right")])
        yield start, stop
        start = stop


def _event_offsets(event_idx: np.ndarray, first: int, stop: int) -> np.ndarray:
    """Where each event ``first..stop-1``'s pairs start in ``event_idx``
    (the pairs in event order), and their end: ``stop - first + 1``
    offsets, by binary search -- not a count of every pair (a bincount of
    W1's 100 M pairs took 0.3 s on one core)."""
    return np.searchsorted(event_idx, np.arange(first, stop + 1, dtype=np.int64))


def _list_array(offsets: np.ndarray, ids: np.ndarray) -> pa.Array:
    """One list of ids per event from the events' offsets into the ids in
    event order (:func:`_event_offsets`; one slice: far fewer than 2**31 of
    them, which int32 offsets hold)."""
    return pa.ListArray.from_arrays(pa.array(offsets.astype(np.int32)), pa.array(ids, pa.int64()))


def _id_array(ids, id_column: str) -> pa.Array:
    """The events' ids as one Arrow array, or a ValueError saying why not
    (ids of mixed kinds, integers beyond 64 bits: pyarrow's own errors)."""
    try:
        return pa.array(ids)
    except (pa.ArrowException, OverflowError, TypeError) as exc:
        raise ValueError(f"id_column {id_column!r}: the events' ids do not make one Arrow column "
                         f"(all of one kind; integers within signed 64 bits): {exc}") from None


def _split_event_ids(events, id_column: str):
    """(the events without their id column, the ids as one Arrow array):
    a column of a pyarrow Table/RecordBatch or pandas DataFrame, a
    DataFrame's index by its name, or a key of every dict."""
    if not isinstance(id_column, str):
        raise TypeError(f"id_column is a column name, not {type(id_column).__name__}")
    if isinstance(events, (pa.Table, pa.RecordBatch)):
        if id_column not in events.schema.names:
            raise KeyError(f"id_column {id_column!r}: the events have no such column; columns are "
                           f"{events.schema.names}")
        ids = events.column(id_column)
        table = events if isinstance(events, pa.Table) else pa.Table.from_batches([events])
        rest = table.drop_columns([id_column])
        ids = ids.combine_chunks() if isinstance(ids, pa.ChunkedArray) else ids
        return rest, ids
    if isinstance(events, (list, tuple)):
        # an event that is no mapping has no id (null) and goes on as it is: the encoder refuses it, naming
        # its place, as it does without id_column (errors="report": that event alone)
        at = next((i for i, event in enumerate(events) if isinstance(event, Mapping) and id_column not in event),
                  None)
        if at is not None:
            raise KeyError(f"id_column {id_column!r}: event {at} has no such key")
        ids = [event[id_column] if isinstance(event, Mapping) else None for event in events]
        return ([{k: v for k, v in event.items() if k != id_column} if isinstance(event, Mapping) else event
                 for event in events], _id_array(ids, id_column))
    if type(events).__module__.startswith("pandas"):
        if id_column in events.columns:
            return events.drop(columns=[id_column]), _id_array(events[id_column], id_column)
        if events.index.name == id_column:
            return events, _id_array(events.index, id_column)
        raise KeyError(f"id_column {id_column!r}: the DataFrame has no such column, nor an index of that name")
    raise TypeError(f"id_column needs events as dicts, a pyarrow Table/RecordBatch or a pandas DataFrame, "
                    f"not {type(events).__name__}")


def _built_matcher(state: Snapshot):
    """``state``'s main matcher if a match has built it, else None."""
    part = state._main_part
    return None if part is None else part[1]


def _nbytes(state: Snapshot) -> int:
    """Host bytes of ``state`` (see :attr:`Index.nbytes`)."""
    matcher = _built_matcher(state)
    main = state.main.nbytes if matcher is None else max(matcher.nbytes, state.main.nbytes)
    return main + sum(s.nbytes for s in state.delta)


def _main_position(state: Snapshot, sub_id: int) -> int:
    ids = state.main.sub_ids
    at = np.searchsorted(ids, sub_id)   # main ids are kept sorted
    if at < len(ids) and ids[at] == sub_id and state.alive[at]:
        return int(at)
    return -1


def _present(state: Snapshot, ids: np.ndarray):
    """The first of ``ids`` present in the snapshot, or None."""
    ids = np.asarray(ids, dtype=np.int64)
    main = state.main.sub_ids
    if len(main):
        at = np.searchsorted(main, ids).clip(0, len(main) - 1)
        hit = (main[at] == ids) & (state.alive[at] != 0)
        if hit.any():
            return int(ids[hit][0])
    for segment in state.delta:          # (each sorted by id: a search, not np.isin's sort per call)
        found = segment.sub_ids
        if not len(found):
            continue
        at = np.minimum(np.searchsorted(found, ids), len(found) - 1)
        clash = ids[found[at] == ids]
        if len(clash):
            return int(clash[0])
    return None


def _checked_ast(node) -> Node:
    """An expression given as an AST: a node of engine.expr, within the
    nesting and size limits, shaped as the parser builds them, its text
    valid Unicode (what parse checks for text)."""
    AstChecks()(node)
    return node


def _event_slice(batch, first: int, stop: int):
    """Events ``[first, stop)`` of a batch, sharing its arrays."""
    lo, hi = int(batch.offsets[first]), int(batch.offsets[stop])
    # (strings and event lists are shared whole: entries name them by token)
    return dataclasses.replace(batch, offsets=batch.offsets[first:stop + 1] - lo, attr=batch.attr[lo:hi],
                               value=batch.value[lo:hi], token=batch.token[lo:hi], rejected=())


__all__ = ["Index", "PinnedIndex", "ALGORITHMS"]
