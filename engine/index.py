"""``engine.Index``: the public API of DESIGN.md §3.

An index is a *main* compiled segment, matched by the chosen algorithm, plus
a small *delta* of subscriptions added since the last merge (A-PCM's update
scheme, DESIGN.md §4): the delta is compiled at ``add`` time and matched
alongside the main segment, removals are tombstones (a cleared ``alive``
flag) until the next merge, and a merge rebuilds the main segment when the
delta or the tombstones grow.  The algorithm's structures need not be
rebuilt with it: a matcher with a ``merged(segment, old_to_new, added,
schema)`` method (opindex) is derived from the last one (see
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
import inspect
import json
import threading

import numpy as np
import pyarrow as pa

from engine import events as event_batches
from engine.algorithms import ALGORITHMS, default_algorithm, matcher_class
from engine.backend import array_namespace, resolve_backend
from engine.columnar import compile_columnar
from engine.compile import PredicateTable, Segment, compile_expressions, concat_segments
from engine.errors import SchemaError
from engine.expr import Family, Node, predicates
from engine.index_file import (check_saved_options, needed_depth, read_index_file, restore_contents,
                               write_index_file)
from engine.schema import Schema
from engine.snapshot import BUILD, Snapshot

DEFAULT_DNF_LIMIT = 256
#: working memory of one slice of a large batch (matcher scratch, pairs,
#: ids): a batch whose matches would need more is matched in event slices,
#: so that the peak stays near the output itself (about 80 bytes a pair
#: are held while a slice is matched, 8-16 stay in the output)
MATCH_MEMORY_BUDGET = 512 << 20
_BYTES_PER_PAIR_WORKING = 80


def _as_id(sub_id) -> int:
    if isinstance(sub_id, (bool, np.bool_)) or not isinstance(sub_id, (int, np.integer)):
        raise TypeError(f"subscription ids are int64, not {type(sub_id).__name__} {sub_id!r}")
    if not -2 ** 63 <= int(sub_id) < 2 ** 63:
        raise OverflowError(f"subscription id {sub_id} does not fit in int64")
    return int(sub_id)


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
    schema : optional ``{attribute: "numeric" | "string" | "boolean"}``
        declaring type families up front.
    dnf_limit : the most conjunctions an AND-only algorithm may make of one
        expression (DESIGN.md §3); an expression beyond it is refused at
        ``add`` time with :class:`engine.errors.ExpressionTooLarge`.
    options : algorithm parameters passed to its matcher, e.g.
        ``{"variant": "bs"}`` for OpIndex-BS, ``{"segments": 64}``, or
        ``{"event_log": batch}`` for OpIndex's pivot frequencies.

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
                 schema: dict | None = None, dnf_limit: int = DEFAULT_DNF_LIMIT, options: dict | None = None):
        self.backend = resolve_backend(backend)
        self.algorithm = default_algorithm(self.backend) if algorithm is None else algorithm
        self._matcher_class = matcher_class(self.algorithm, self.backend)
        self.dnf_limit = dnf_limit
        self.options = dict(options or {})
        self._accepted = set(inspect.signature(self._matcher_class).parameters)
        unknown = set(self.options) - self._accepted
        if unknown:
            raise TypeError(f"algorithm {self.algorithm!r} takes no option(s) {sorted(unknown)}")
        self._schema = Schema()
        for attr, family in (schema or {}).items():
            self._schema.declare(attr, family)
        self._write_lock = threading.RLock()
        self._state = Snapshot(self._schema.view(), Segment.empty(), np.zeros(0, np.uint8), 0, (), BUILD)

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
        part = self._state._main_part
        return None if part is None else part[1]

    @property
    def nbytes(self) -> int:
        """Bytes held by the compiled index (main segment and its matcher)."""
        state = self._state
        matcher = self._matcher
        extra = getattr(matcher, "nbytes", 0) - state.main.nbytes if matcher is not None else 0
        return state.main.nbytes + max(extra, 0) + sum(s.nbytes for s in state.delta)

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
        """Every subscription id in the index, ascending."""
        self.merge()
        state = self._state
        return state.main.sub_ids[np.flatnonzero(state.alive)]

    def subset(self, ids) -> "Index":
        """A new index holding only the given subscriptions (compiled form
        copied, nothing re-parsed), with the whole schema, so that it codes
        and judges events exactly like this one -- e.g. one shard of a
        sharded Spark job.  KeyError for an id not in the index."""
        with self._write_lock:
            self.merge()
            state = self._state
            ids = np.unique(np.asarray(ids, dtype=np.int64))
            positions = np.searchsorted(state.main.sub_ids, ids)
            found = positions < len(state.main.sub_ids)
            found[found] = (state.main.sub_ids[positions[found]] == ids[found]) & (state.alive[positions[found]] != 0)
            if not found.all():
                raise KeyError(f"subscription id {int(ids[~found][0])} is not in the index")
            part = Index(algorithm=self.algorithm, backend=self.backend, dnf_limit=self.dnf_limit,
                         options=self.options)
            part._schema = copy.deepcopy(self._schema)
            part._install_main(_without_unused_predicates(state.main.take(positions)))
        return part

    # ------------------------------------------------------------------- updates
    def add(self, sub_id, expression) -> None:
        """Add one subscription.  ``expression`` is text or an AST.  A bad
        expression or a present id raises and leaves the index unchanged."""
        self.add_many([sub_id], [expression])

    def add_many(self, ids, expressions=None) -> None:
        """Add many subscriptions: ``add_many(ids, expressions)`` with
        sequences of ids and texts/ASTs, or ``add_many(table)`` with the
        columnar one-row-per-predicate form (engine.columnar).  All or
        nothing: a bad row raises and leaves the index unchanged."""
        with self._write_lock:
            mark = self._schema.mark()
            try:
                if expressions is None:
                    segment = self._compile_columnar(ids)
                else:
                    segment = self._compile_texts(ids, expressions)
            except BaseException:
                self._schema.rollback(mark)
                raise
            if len(segment):
                self._publish(delta=self._state.delta + (segment,))
                self._changed(bulk=expressions is None)

    def _compile_texts(self, ids, expressions) -> Segment:
        if isinstance(expressions, (str, bytes)):
            raise TypeError("add_many takes a sequence of expressions, not one string: use add(id, text)")
        ids = [_as_id(i) for i in ids]
        expressions = list(expressions)
        if len(ids) != len(expressions):
            raise ValueError(f"{len(ids)} ids but {len(expressions)} expressions")
        self._check_new_ids(np.array(ids, dtype=np.int64))
        nodes, all_preds = [], []
        fixed: dict = {}
        check = getattr(self._matcher_class, "check_expression", None)
        for sub_id, expression in zip(ids, expressions):
            node = _parse(expression) if isinstance(expression, str) else _checked_ast(expression)
            preds = list(predicates(node))
            # check against the schema as it would be after the previous rows
            changes = self._schema.check_predicates(preds, where=f"subscription {sub_id}")
            for attr, family in changes.items():
                if fixed.setdefault(attr, family) != family:
                    raise SchemaError(f"subscription {sub_id}: {attr!r} is {fixed[attr].value} in an earlier "
                                      f"subscription of this call, not {family.value}")
            self._check_fixed(fixed, sub_id)
            if check is not None:   # e.g. opindex: DNF/CNF within dnf_limit (ExpressionTooLarge)
                check(node, self.dnf_limit)
            nodes.append(node)
            all_preds.append(preds)
        for preds in all_preds:
            self._schema.register(preds)
        segment = compile_expressions(ids, nodes, self._schema)
        return _sorted_by_id(segment)

    def _compile_columnar(self, table) -> Segment:
        if isinstance(table, pa.RecordBatch):
            table = pa.Table.from_batches([table])
        if not isinstance(table, pa.Table):
            table = pa.table(table)
        segment, _ = compile_columnar(table, self._schema, check_ids=self._refuse_present)
        return _sorted_by_id(segment)

    def _check_fixed(self, fixed: dict, sub_id) -> None:
        for attr, family in fixed.items():
            known = self._schema.families.get(attr)
            if known is not None and known != family:
                raise SchemaError(f"subscription {sub_id}: {attr!r} is {known.value}, not {family.value}")

    def _check_new_ids(self, ids: np.ndarray) -> None:
        unique, counts = np.unique(ids, return_counts=True)
        if (counts > 1).any():
            raise KeyError(f"subscription id {int(unique[counts > 1][0])} given more than once")
        self._refuse_present(unique)

    def _refuse_present(self, unique_ids: np.ndarray) -> None:
        clash = _present(self._state, unique_ids)
        if clash is not None:
            raise KeyError(f"subscription id {clash} is already in the index")

    def remove(self, sub_id) -> None:
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
            self._publish(delta=(concat_segments(list(state.delta)),))
            state = self._state
        main = len(state.main)
        if bulk or state.delta_size > max(1024, main // 16) or state.n_dead > max(1024, main // 4):
            self.merge()

    def merge(self) -> None:
        """Fold the delta into the main segment and drop tombstones.

        The main segment is rebuilt aside (ids ascending, unused predicates
        dropped) and published with the next snapshot; matches in flight
        keep the snapshot they started with.  The algorithm's structures
        need not be rebuilt: when the matcher has a ``merged(segment,
        old_to_new, added, schema)`` method (the merge protocol, e.g.
        opindex), the next match derives the new matcher from the old one
        -- ``old_to_new[p]``: the new position of the subscription at old
        position ``p`` (-1: removed), ``added``: the positions of the others
        -- instead of building it from scratch."""
        with self._write_lock:
            state = self._state
            if not (state.n_dead or state.delta):
                return                          # nothing to fold: keep the matcher
            kept = np.flatnonzero(state.alive)
            parts = [state.main.take(kept)] if state.n_dead else [state.main]
            merged = concat_segments(parts + list(state.delta))
            position = np.arange(len(merged), dtype=np.int64)     # of each concatenated row in the merged segment
            order = np.argsort(merged.sub_ids, kind="stable")
            if len(order) and (order[1:] < order[:-1]).any():
                merged = merged.take(order)
                position[order] = np.arange(len(order))
            old_to_new = np.full(len(state.main), -1, dtype=np.int64)
            old_to_new[kept] = position[:len(kept)]   # (the surviving main rows come first in the concatenation)
            source = _rows_of(merged.predicates, state.main.predicates)
            segment, rows = _compact_predicates(merged)
            coded = state._main_part[0].predicates if state._main_part is not None else state.main.predicates
            _carry_codes(segment.predicates, source[rows], coded, self._schema)
            segment.predicates.recode(self._schema)     # (not published yet: coded in place)
            self._state = Snapshot(self._schema.view(), segment, np.ones(len(segment), np.uint8), 0, (),
                                   state.merged_source(old_to_new))

    def _install_main(self, segment: Segment) -> None:
        """Make ``segment`` the whole index (load, subset): a fresh matcher."""
        with self._write_lock:
            segment = segment.coded(self._schema)     # (a subset's segment may share a published table)
            self._state = Snapshot(self._schema.view(), segment, np.ones(len(segment), np.uint8), 0, (), BUILD)

    # ------------------------------------------------------------------ matching
    def _build_matcher(self, segment: Segment, view):
        """A matcher of ``segment`` from scratch, with the Index-wide
        settings it declares it takes, plus the caller's ``options``."""
        shared = {"schema": view, "dnf_limit": self.dnf_limit}
        options = {**{k: v for k, v in shared.items() if k in self._accepted}, **self.options}
        return self._matcher_class(segment, self.backend, **options)

    def _matchers(self):
        """(segment, alive, matcher) for the main segment and the delta of
        the current snapshot."""
        return self._state.matchers(self._build_matcher)

    def match(self, event) -> np.ndarray:
        """Ids of the subscriptions TRUE on one event (dict), ascending."""
        if not isinstance(event, dict):
            raise TypeError(f"match takes one event as a dict, not {type(event).__name__}")
        return self.match_batch([event])[0]

    def match_batch(self, events, *, output: str = "list", errors: str = "raise"):
        """Match a batch: a list of dicts, a pyarrow Table/RecordBatch or a
        pandas DataFrame (one row per event, null = absent).

        ``output="list"``: one ascending int64 id array per event (none for
        an empty batch).
        ``output="arrow"``: a pyarrow Table ``(event int64, sub_id int64)``,
        ordered by event then id -- the form for large batches.
        ``output="device"`` (backend ``cuda``): the same two columns as
        device arrays (CuPy; NumPy under the simulator) that never leave
        the GPU, for GPU pipelines.
        ``errors="null"`` treats values of the wrong type as absent.

        The whole batch is matched against one snapshot of the index.  A
        batch whose matches would need more than
        :data:`MATCH_MEMORY_BUDGET` of working memory is matched in event
        slices, so that the peak stays near the size of the output; for
        outputs larger than memory, see :meth:`match_stream`."""
        if output not in ("list", "arrow", "device"):
            raise ValueError(f"output must be 'list', 'arrow' or 'device', not {output!r}")
        if output == "device" and self.backend != "cuda":
            raise ValueError("output='device' needs backend='cuda'")
        state = self._state
        batch = event_batches.encode_events(events, state.view, errors)
        if output == "device":
            return self._match_encoded(state, batch, device=True)
        # each slice goes into the output form as it comes, so that only the
        # output and one slice's working memory are held at once
        if output == "arrow":
            events_out, ids_out = [], []
            for _, _, event_idx, sub_ids in self._match_slices(state, batch):
                events_out.append(event_idx)
                ids_out.append(sub_ids)
            return pa.table({"event": pa.chunked_array(events_out, pa.int64()),
                             "sub_id": pa.chunked_array(ids_out, pa.int64())})
        out = []
        for first, stop, event_idx, sub_ids in self._match_slices(state, batch):
            out.extend(np.split(sub_ids, np.searchsorted(event_idx, np.arange(first + 1, stop))))
        return out

    def match_stream(self, events, *, errors: str = "raise", max_pairs: int | None = None):
        """Match a batch and yield its matches as pyarrow RecordBatches
        ``(event int64, sub_id int64)``, ordered by event then id, each of
        at most about ``max_pairs`` rows (default: what
        :data:`MATCH_MEMORY_BUDGET` holds; one event's matches are never
        split) -- for outputs larger than memory.  The whole batch is
        matched against the snapshot current when the call is made."""
        state = self._state
        batch = event_batches.encode_events(events, state.view, errors)
        for _, _, event_idx, sub_ids in self._match_slices(state, batch, max_pairs):
            yield pa.RecordBatch.from_arrays([pa.array(event_idx, pa.int64()), pa.array(sub_ids, pa.int64())],
                                             names=["event", "sub_id"])

    def _match_slices(self, state: Snapshot, batch, max_pairs: int | None = None):
        """``(first, stop, event index, sub ids)`` of each event slice
        ``[first, stop)`` of ``batch``, sized so that a slice's pairs fit
        the working-memory budget; the first slice measures the matches
        per event."""
        if max_pairs is None:
            max_pairs = MATCH_MEMORY_BUDGET // _BYTES_PER_PAIR_WORKING
        max_pairs = max(1, int(max_pairs))
        n_events = batch.n_events
        first = 0
        per_event = None
        while first < n_events:
            if per_event is None:       # probe with a slice that fits even if every subscription matches
                width = n_events if n_events <= 64 else max(1, min(max_pairs // max(1, len(state)), 4096))
            else:
                width = max(1, int(max_pairs / max(per_event, 1e-9)))
            stop = min(n_events, first + width)
            part = batch if (first, stop) == (0, n_events) else _event_slice(batch, first, stop)
            event_idx, sub_ids = self._match_encoded(state, part)
            if first:
                event_idx = event_idx + first
            measured = len(sub_ids) / (stop - first)
            per_event = measured if per_event is None else max(0.5 * per_event + 0.5 * measured, measured)
            yield first, stop, event_idx, sub_ids
            first = stop

    def _match_encoded(self, state: Snapshot, batch, device: bool = False):
        matchers = state.matchers(self._build_matcher)
        pairs = matchers[0][0].predicates.pattern_pairs() if len(matchers) == 1 else \
            np.unique(np.concatenate([seg.predicates.pattern_pairs() for seg, _, _ in matchers]), axis=0)
        truth = event_batches.pattern_truth(batch, state.view, pairs)
        xp = array_namespace(self.backend) if device else np
        events, ids = [], []
        main_matcher = matchers[0][2]
        for segment, alive, matcher in matchers:
            if device and matcher is main_matcher:
                e, sub_ids = matcher.match(batch, truth, alive, output="device", ids=state.device_ids(xp))
            elif getattr(matcher, "maps_ids", False):     # a cuda matcher maps positions while copying back
                e, sub_ids = matcher.match(batch, truth, alive, ids=segment.sub_ids)
            else:   # the small delta is matched on the host
                e, positions = matcher.match(batch, truth, alive)
                e, sub_ids = xp.asarray(e), xp.asarray(segment.sub_ids[positions])
            events.append(e)
            ids.append(sub_ids)
        if len(matchers) == 1:
            return events[0], ids[0]
        event_idx, sub_ids = xp.concatenate(events), xp.concatenate(ids)
        order = xp.lexsort(xp.stack([sub_ids, event_idx]))
        return event_idx[order], sub_ids[order]

    # ------------------------------------------------------------- persistence
    def save(self, path) -> None:
        """Write the index to ``path`` atomically (temp file + rename), with
        the permissions ``open()`` would give a new file.  Algorithm options
        that are plain values are saved with it; an ``event_log`` (tuning
        only: it steers OpIndex's pivots, never the results) is not, and is
        passed to ``load`` again if wanted."""
        with self._write_lock:           # one state: no update between the merge and the write
            self.merge()
            self._write(path)

    def _write(self, path) -> None:
        seg, preds = self._state.main, self._state.main.predicates
        set_offsets, set_keys = self._schema.set_csr()
        arrays = {"sub_ids": seg.sub_ids, "prog_offsets": seg.prog_offsets, "prog_kind": seg.prog_kind,
                  "prog_arg": seg.prog_arg, "pred_attr": preds.attr, "pred_op": preds.op,
                  "pred_lo_key": preds.lo_key, "pred_hi_key": preds.hi_key, "pred_aux": preds.aux,
                  "set_offsets": set_offsets, "set_keys": set_keys}
        meta = {"algorithm": self.algorithm, "backend": self.backend, "dnf_limit": self.dnf_limit,
                "max_depth": needed_depth(seg),
                "options": {k: v for k, v in self.options.items() if _json_safe(v)},
                "schema": self._schema.to_json()}
        write_index_file(path, meta, arrays)

    @classmethod
    def load(cls, path, *, backend: str | None = None, algorithm: str | None = None,
             options: dict | None = None) -> "Index":
        """Read an index written by :meth:`save`.  Whatever is wrong with the
        file -- truncated, corrupt, foreign, or crafted contents, saved
        options included -- raises :class:`engine.errors.IndexFileError`
        naming ``path`` (a directory too); a missing file raises
        FileNotFoundError."""
        meta, arrays = read_index_file(path)
        schema, segment = restore_contents(path, meta, arrays)
        algorithm = algorithm or meta["algorithm"]
        backend = resolve_backend(backend or meta["backend"])
        saved_options = meta["options"] if algorithm == meta["algorithm"] else {}
        check_saved_options(path, matcher_class(algorithm, backend), backend, saved_options,
                            schema=schema.view(), dnf_limit=meta["dnf_limit"])
        index = cls(algorithm=algorithm, backend=backend, dnf_limit=meta["dnf_limit"],
                    options={**saved_options, **(options or {})})
        index._schema = schema
        index._install_main(segment)
        return index

    def __repr__(self) -> str:
        return f"Index(algorithm={self.algorithm!r}, backend={self.backend!r}, subscriptions={len(self)})"



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
    for segment in state.delta:
        clash = ids[np.isin(ids, segment.sub_ids)]
        if len(clash):
            return int(clash[0])
    return None


def _sorted_by_id(segment: Segment) -> Segment:
    order = np.argsort(segment.sub_ids, kind="stable")
    if len(order) > 1 and (order[1:] < order[:-1]).any():
        return segment.take(order)
    return segment


def _checked_ast(node) -> Node:
    """An expression given as an AST: a node of engine.expr, within the
    nesting and size limits, shaped as the parser builds them, its text
    valid Unicode (what parse checks for text)."""
    from engine.expr import And, Not, Or, Pred, Xnor, Xor, check_nesting, check_shape
    if not isinstance(node, (Pred, Not, And, Or, Xor, Xnor)):
        raise TypeError(f"an expression is text or an engine.expr node, not {type(node).__name__}")
    check_nesting(node)
    check_shape(node)
    return node


def _event_slice(batch, first: int, stop: int):
    """Events ``[first, stop)`` of a batch, sharing its arrays."""
    lo, hi = int(batch.offsets[first]), int(batch.offsets[stop])
    return type(batch)(batch.offsets[first:stop + 1] - lo, batch.attr[lo:hi], batch.value[lo:hi],
                       batch.token[lo:hi], batch.strings)


def _json_safe(value) -> bool:
    """Whether an option value survives a save and load: JSON without NaN
    or infinities, its strings valid Unicode (what load accepts)."""
    try:
        json.dumps(value, allow_nan=False, ensure_ascii=False).encode("utf-8")
        return True
    except (TypeError, ValueError):
        return False


def _without_unused_predicates(segment: Segment) -> Segment:
    """Drop predicates no program refers to any more (after removals)."""
    return _compact_predicates(segment)[0]


def _compact_predicates(segment: Segment) -> tuple[Segment, np.ndarray]:
    """:func:`_without_unused_predicates`, and the rows of the old table the
    new one keeps."""
    n = len(segment.predicates)
    leaves = segment.prog_kind == 0
    args = segment.prog_arg.take(np.flatnonzero(leaves)) if n else segment.prog_arg[:0]
    used = np.zeros(n, dtype=bool)
    used[args] = True
    if used.all():
        return segment, np.arange(n)
    rows = np.flatnonzero(used)
    new_id = (np.cumsum(used) - 1).astype(segment.prog_arg.dtype)
    # (non-leaf arguments are arities: clipped into range, then left as they are)
    args = np.where(leaves, new_id.take(segment.prog_arg, mode="clip"), segment.prog_arg)
    return Segment(segment.sub_ids, segment.prog_offsets, segment.prog_kind, args,
                   segment.predicates.take(rows), segment.max_depth), rows


def _rows_of(table: PredicateTable, old: PredicateTable) -> np.ndarray:
    """Per row of ``table`` (a merge's concatenation), the row of ``old`` (the
    previous main table) it is, else -1.  The concatenation keeps the first
    segment's distinct rows first and in order; checked, not assumed."""
    source = np.full(len(table), -1, dtype=np.int64)
    n = len(old)
    if table is old or (len(table) >= n and all(np.array_equal(new[:n], before)
                                                for new, before in zip(table.key_columns(), old.key_columns()))):
        source[:n] = np.arange(n)
    return source


def _carry_codes(table: PredicateTable, source: np.ndarray, old: PredicateTable, schema: Schema) -> None:
    """Give ``table`` its kernel codes (:meth:`PredicateTable.recode`) without
    recoding the rows it shares with ``old`` (``source``: the row of ``old``
    each row is, or -1): a row's codes depend only on its keys and the
    schema, so a row keeps them when ``old`` was coded under the current
    dictionary, and a row of a non-string attribute under any dictionary.
    Recoding every row of a merge costs more than merging the matcher."""
    if table is old or old.lo is None or old.set_offsets is None or not (source >= 0).any():
        return                                     # recode() codes what it must when it is needed
    if old.coded_version != schema.version:       # string codes may have moved since
        string_attr = np.array([schema.families.get(name) is Family.STRING for name in schema.attr_names])
        source = np.where((source >= 0) & ~string_attr[table.attr], source, -1)
    carried, fresh = np.flatnonzero(source >= 0), np.flatnonzero(source < 0)
    src = source[carried]
    recoded = table.take(fresh)
    recoded.recode(schema)
    n = len(table)
    lo, hi = np.empty(n), np.empty(n)
    lo[carried], lo[fresh] = old.lo[src], recoded.lo
    hi[carried], hi[fresh] = old.hi[src], recoded.hi
    # IN lists: each row's sorted codes, gathered from either table into one CSR
    lengths, starts = np.empty(n, np.int64), np.empty(n, np.int64)
    lengths[carried], lengths[fresh] = np.diff(old.set_offsets)[src], np.diff(recoded.set_offsets)
    starts[carried], starts[fresh] = old.set_offsets[src], recoded.set_offsets[:-1] + len(old.set_values)
    offsets = np.concatenate(([0], np.cumsum(lengths))).astype(np.int64)
    values = np.concatenate((old.set_values, recoded.set_values))
    table.lo, table.hi, table.set_offsets = lo, hi, offsets
    table.set_values = values[np.repeat(starts - offsets[:-1], lengths) + np.arange(int(offsets[-1]))]
    table.coded_version = schema.version


__all__ = ["Index", "ALGORITHMS"]
