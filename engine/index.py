"""``engine.Index``: the public API of DESIGN.md §3.

An index is a *main* compiled segment, matched by the chosen algorithm, plus
a small *delta* of subscriptions added since the last merge (A-PCM's update
scheme, DESIGN.md §4): the delta is compiled and matched alongside the main
segment, removals are tombstones (a cleared ``alive`` flag) until the next
merge, and a merge rebuilds the main segment when the delta or the
tombstones grow.  The algorithm's structures need not be rebuilt with it:
a matcher with a ``merged(segment, old_to_new, added)`` method (opindex) is
derived from the last one at the next match (see :meth:`Index.merge`).  A
batch's result never depends on where a subscription sits.
"""

from __future__ import annotations

import copy
import hashlib
import inspect
import io
import json
import os
import tempfile
import zipfile

import numpy as np
import pyarrow as pa

from engine import events as event_batches
from engine.algorithms import ALGORITHMS, default_algorithm, matcher_class
from engine.backend import array_namespace, resolve_backend
from engine.columnar import compile_columnar
from engine.compile import (PATTERN_CODES, SET_CODES, PredicateTable, Segment, compile_expressions,
                            concat_segments, program_depths)
from engine.errors import IndexFileError, SchemaError
from engine.expr import Family, Node, predicates
from engine.schema import Schema

FILE_MAGIC = "bexmatch-index"
FILE_VERSION = 1
DEFAULT_DNF_LIMIT = 256


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
        accepted = inspect.signature(self._matcher_class).parameters
        unknown = set(self.options) - set(accepted)
        if unknown:
            raise TypeError(f"algorithm {self.algorithm!r} takes no option(s) {sorted(unknown)}")
        self._schema = Schema()
        for attr, family in (schema or {}).items():
            self._schema.declare(attr, family)
        self._main = Segment.empty()
        self._main_alive = np.zeros(0, dtype=np.uint8)
        self._main_order = np.zeros(0, dtype=np.int64)   # argsort of main ids, for lookups
        self._main_dead = 0
        self._matcher = None
        self._pending = None          # (matcher, position map) to derive the next matcher from (merge)
        self._delta_ids: list[int] = []
        self._delta_nodes: dict[int, Node] = {}
        self._delta_segments: list[Segment] = []        # columnar adds waiting for the merge
        self._delta_cache = None

    # ------------------------------------------------------------------ contents
    @property
    def schema(self) -> Schema:
        return self._schema

    @property
    def nbytes(self) -> int:
        """Bytes held by the compiled index (main segment and its matcher)."""
        matcher = self._matcher
        extra = getattr(matcher, "nbytes", 0) - self._main.nbytes if matcher is not None else 0
        return self._main.nbytes + max(extra, 0) + sum(s.nbytes for s in self._delta_segments)

    def __len__(self) -> int:
        return len(self._main) - self._main_dead + len(self._delta_nodes) + sum(len(s) for s in self._delta_segments)

    def __contains__(self, sub_id) -> bool:
        try:
            sub_id = _as_id(sub_id)
        except (TypeError, OverflowError):
            return False
        return self._main_position(sub_id) >= 0 or sub_id in self._delta_nodes or any(
            sub_id in s.sub_ids for s in self._delta_segments)

    def _main_position(self, sub_id: int) -> int:
        ids = self._main.sub_ids
        at = np.searchsorted(ids, sub_id)   # main ids are kept sorted
        if at < len(ids) and ids[at] == sub_id and self._main_alive[at]:
            return int(at)
        return -1

    def _present(self, ids: np.ndarray):
        """The first of ``ids`` already in the index, or None."""
        ids = np.asarray(ids, dtype=np.int64)
        main = self._main.sub_ids
        at = np.searchsorted(main, ids).clip(0, max(len(main) - 1, 0))
        if len(main):
            hit = (main[at] == ids) & (self._main_alive[at] != 0)
            if hit.any():
                return int(ids[hit][0])
        for sub_id in ids[np.isin(ids, np.fromiter(self._delta_nodes, np.int64, len(self._delta_nodes)))]:
            return int(sub_id)
        for segment in self._delta_segments:
            clash = ids[np.isin(ids, segment.sub_ids)]
            if len(clash):
                return int(clash[0])
        return None

    def ids(self) -> np.ndarray:
        """Every subscription id in the index, ascending."""
        self.merge()
        return self._main.sub_ids[np.flatnonzero(self._main_alive)]

    def subset(self, ids) -> "Index":
        """A new index holding only the given subscriptions (compiled form
        copied, nothing re-parsed), with the whole schema, so that it codes
        and judges events exactly like this one -- e.g. one shard of a
        sharded Spark job.  KeyError for an id not in the index."""
        self.merge()
        ids = np.unique(np.asarray(ids, dtype=np.int64))
        positions = np.searchsorted(self._main.sub_ids, ids)
        found = positions < len(self._main.sub_ids)
        found[found] = (self._main.sub_ids[positions[found]] == ids[found]) & (self._main_alive[positions[found]] != 0)
        if not found.all():
            raise KeyError(f"subscription id {int(ids[~found][0])} is not in the index")
        part = Index(algorithm=self.algorithm, backend=self.backend, dnf_limit=self.dnf_limit, options=self.options)
        part._schema = copy.deepcopy(self._schema)
        part._install_main(_without_unused_predicates(self._main.take(positions)))
        return part

    # ------------------------------------------------------------------- updates
    def add(self, sub_id, expression) -> None:
        """Add one subscription.  ``expression`` is text or an AST.  A bad
        expression or a present id raises and leaves the index unchanged."""
        self.add_many([sub_id], [expression])

    def add_many(self, ids, expressions=None) -> None:
        """Add many subscriptions: ``add_many(ids, expressions)`` with
        sequences of ids and texts/ASTs, or ``add_many(table)`` with the
        columnar one-row-per-predicate form (engine.columnar)."""
        if expressions is None:
            self._add_columnar(ids)
            return
        ids = [_as_id(i) for i in ids]
        expressions = list(expressions)
        if len(ids) != len(expressions):
            raise ValueError(f"{len(ids)} ids but {len(expressions)} expressions")
        self._check_new_ids(np.array(ids, dtype=np.int64))
        nodes = []
        fixed: dict = {}
        for sub_id, expression in zip(ids, expressions):
            node = _parse(expression) if isinstance(expression, str) else expression
            preds = list(predicates(node))
            # check against the schema as it would be after the previous rows
            changes = self._schema.check_predicates(preds, where=f"subscription {sub_id}")
            for attr, family in changes.items():
                if fixed.setdefault(attr, family) != family:
                    raise SchemaError(f"subscription {sub_id}: {attr!r} is {fixed[attr].value} in an earlier "
                                      f"subscription of this call, not {family.value}")
            self._check_fixed(fixed, sub_id)
            check = getattr(self._matcher_class, "check_expression", None)
            if check is not None:   # e.g. opindex: DNF/CNF within dnf_limit (ExpressionTooLarge)
                check(node, self.dnf_limit)
            nodes.append((sub_id, node, preds))
        for sub_id, node, preds in nodes:
            self._schema.register(preds)
            self._delta_ids.append(sub_id)
            self._delta_nodes[sub_id] = node
        self._changed()

    def _check_fixed(self, fixed: dict, sub_id) -> None:
        for attr, family in fixed.items():
            known = self._schema.families.get(attr)
            if known is not None and known != family:
                raise SchemaError(f"subscription {sub_id}: {attr!r} is {known.value}, not {family.value}")

    def _check_new_ids(self, ids: np.ndarray) -> None:
        unique, counts = np.unique(ids, return_counts=True)
        if (counts > 1).any():
            raise KeyError(f"subscription id {int(unique[counts > 1][0])} given more than once")
        clash = self._present(unique)
        if clash is not None:
            raise KeyError(f"subscription id {clash} is already in the index")

    def _refuse_present(self, unique_ids: np.ndarray) -> None:
        clash = self._present(unique_ids)
        if clash is not None:
            raise KeyError(f"subscription id {clash} is already in the index")

    def _add_columnar(self, table) -> None:
        if isinstance(table, pa.RecordBatch):
            table = pa.Table.from_batches([table])
        if not isinstance(table, pa.Table):
            table = pa.table(table)
        segment, _ = compile_columnar(table, self._schema, check_ids=self._refuse_present)
        self._delta_segments.append(segment)
        self._changed()

    def remove(self, sub_id) -> None:
        """Remove one subscription; KeyError for an unknown id."""
        sub_id = _as_id(sub_id)
        if sub_id in self._delta_nodes:
            del self._delta_nodes[sub_id]
            self._delta_ids.remove(sub_id)
        elif (pos := self._main_position(sub_id)) >= 0:
            self._main_alive[pos] = 0   # tombstone until the next merge
            self._main_dead += 1
        else:
            for i, segment in enumerate(self._delta_segments):
                hit = np.flatnonzero(segment.sub_ids == sub_id)
                if len(hit):
                    keep = np.flatnonzero(segment.sub_ids != sub_id)
                    self._delta_segments[i] = segment.take(keep)
                    break
            else:
                raise KeyError(f"subscription id {sub_id} is not in the index")
        self._changed()

    def _changed(self) -> None:
        self._delta_cache = None
        delta = len(self._delta_nodes) + sum(len(s) for s in self._delta_segments)
        if delta > max(1024, len(self._main) // 16) or self._main_dead > max(1024, len(self._main) // 4) \
                or self._delta_segments:
            self.merge()

    def merge(self) -> None:
        """Fold the delta into the main segment and drop tombstones.

        The main segment is rebuilt (ids ascending, unused predicates
        dropped); the algorithm's structures need not be: when the matcher
        has a ``merged(segment, old_to_new, added)`` method (the merge
        protocol, e.g. opindex), the next match derives the new matcher
        from the old one -- ``old_to_new[p]``: the new position of the
        subscription at old position ``p`` (-1: removed), ``added``: the
        positions of the others -- instead of building it from scratch."""
        if not (self._main_dead or self._delta_nodes or self._delta_segments):
            return                          # nothing to fold: keep the matcher
        kept = np.flatnonzero(self._main_alive)
        parts = [self._main.take(kept)] if self._main_dead else [self._main]
        parts += self._delta_segments
        if self._delta_nodes:
            parts.append(compile_expressions(self._delta_ids, [self._delta_nodes[i] for i in self._delta_ids],
                                             self._schema))
        merged = concat_segments(parts)
        position = np.arange(len(merged), dtype=np.int64)     # of each concatenated row in the merged segment
        order = np.argsort(merged.sub_ids, kind="stable")
        if len(order) and (order[1:] < order[:-1]).any():
            merged = merged.take(order)
            position[order] = np.arange(len(order))
        old_to_new = np.full(len(self._main), -1, dtype=np.int64)
        old_to_new[kept] = position[:len(kept)]   # (the surviving main rows come first in the concatenation)
        source = _rows_of(merged.predicates, self._main.predicates)
        segment, rows = _compact_predicates(merged)
        _carry_codes(segment.predicates, source[rows], self._main.predicates, self._schema)
        self._install_main(segment, old_to_new)
        self._delta_ids, self._delta_nodes, self._delta_segments = [], {}, []
        self._delta_cache = None

    def _install_main(self, segment: Segment, old_to_new: np.ndarray | None = None) -> None:
        """Make ``segment`` the main segment.  With ``old_to_new`` (a merge),
        a matcher that follows the merge protocol is kept, with the position
        map from its segment, to derive the next one from."""
        follow = None
        if old_to_new is not None:
            if self._matcher is not None and callable(getattr(self._matcher, "merged", None)):
                follow = (self._matcher, old_to_new)
            elif self._pending is not None:     # merges since the matcher was last used: compose the maps
                matcher, earlier = self._pending
                composed = np.full(len(earlier), -1, dtype=np.int64)
                composed[earlier >= 0] = old_to_new[earlier[earlier >= 0]]
                follow = (matcher, composed)
        self._pending = follow
        self._main = segment
        self._main_alive = np.ones(len(segment), dtype=np.uint8)
        self._main_dead = 0
        self._matcher = None

    # ------------------------------------------------------------------ matching
    def _matchers(self):
        """(segment, alive, matcher) for the main segment and the delta."""
        self._main.predicates.recode(self._schema)
        if self._matcher is None:
            if self._pending is not None:   # derived from the matcher of the last main segment
                matcher, old_to_new = self._pending
                fresh = np.ones(len(self._main), dtype=bool)
                fresh[old_to_new[old_to_new >= 0]] = False
                self._matcher = matcher.merged(self._main, old_to_new, np.flatnonzero(fresh))
            else:
                self._matcher = self._matcher_class(self._main, self.backend, **self._matcher_options())
            self._pending = None
        out = [(self._main, self._main_alive, self._matcher)]
        if self._delta_nodes:
            if self._delta_cache is None:
                delta = compile_expressions(self._delta_ids, [self._delta_nodes[i] for i in self._delta_ids],
                                            self._schema)
                order = np.argsort(delta.sub_ids, kind="stable")
                delta = delta.take(order)
                # the delta is small: scan-style program evaluation is its matcher
                from engine.algorithms.scan import ScanMatcher
                self._delta_cache = (delta, np.ones(len(delta), np.uint8), ScanMatcher(delta, "cpu"))
            self._delta_cache[0].predicates.recode(self._schema)
            out.append(self._delta_cache)
        return out

    def _matcher_options(self) -> dict:
        """The Index-wide settings a matcher declares it takes, plus the
        caller's ``options``."""
        accepted = inspect.signature(self._matcher_class).parameters
        shared = {"schema": self._schema, "dnf_limit": self.dnf_limit}
        return {**{k: v for k, v in shared.items() if k in accepted}, **self.options}

    def match(self, event) -> np.ndarray:
        """Ids of the subscriptions TRUE on one event (dict), ascending."""
        if not isinstance(event, dict):
            raise TypeError(f"match takes one event as a dict, not {type(event).__name__}")
        return self.match_batch([event])[0]

    def match_batch(self, events, *, output: str = "list", errors: str = "raise"):
        """Match a batch: a list of dicts, a pyarrow Table/RecordBatch or a
        pandas DataFrame (one row per event, null = absent).

        ``output="list"``: one ascending int64 id array per event.
        ``output="arrow"``: a pyarrow Table ``(event int64, sub_id int64)``,
        ordered by event then id -- the form for large batches.
        ``output="device"`` (backend ``cuda``): the same two columns as
        device arrays (CuPy; NumPy under the simulator) that never leave
        the GPU, for GPU pipelines.
        ``errors="null"`` treats values of the wrong type as absent."""
        if output not in ("list", "arrow", "device"):
            raise ValueError(f"output must be 'list', 'arrow' or 'device', not {output!r}")
        if output == "device" and self.backend != "cuda":
            raise ValueError("output='device' needs backend='cuda'")
        batch = event_batches.encode_events(events, self._schema, errors)
        if output == "device":
            return self._match_encoded(batch, device=True)
        event_idx, sub_ids = self._match_encoded(batch)
        if output == "arrow":
            return pa.table({"event": pa.array(event_idx, pa.int64()), "sub_id": pa.array(sub_ids, pa.int64())})
        bounds = np.searchsorted(event_idx, np.arange(1, batch.n_events))
        return np.split(sub_ids, bounds)

    def _match_encoded(self, batch, device: bool = False) -> tuple[np.ndarray, np.ndarray]:
        matchers = self._matchers()
        pairs = matchers[0][0].predicates.pattern_pairs() if len(matchers) == 1 else \
            np.unique(np.concatenate([seg.predicates.pattern_pairs() for seg, _, _ in matchers]), axis=0)
        truth = event_batches.pattern_truth(batch, self._schema, pairs)
        xp = array_namespace(self.backend) if device else np
        events, ids = [], []
        for segment, alive, matcher in matchers:
            if device and matcher is self._matcher:
                e, sub_ids = matcher.match(batch, truth, alive, output="device", ids=self._device_sub_ids())
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
        if len(matchers) > 1:
            order = xp.lexsort(xp.stack([sub_ids, event_idx]))
            event_idx, sub_ids = event_idx[order], sub_ids[order]
        return event_idx, sub_ids

    def _device_sub_ids(self):
        """The main segment's ids in device memory, uploaded once per merge."""
        if getattr(self, "_device_ids_of", None) is not self._main:
            self._device_ids = array_namespace(self.backend).asarray(self._main.sub_ids)
            self._device_ids_of = self._main
        return self._device_ids

    # ------------------------------------------------------------- persistence
    def save(self, path) -> None:
        """Write the index to ``path`` atomically (temp file + rename).
        Algorithm options that are plain values are saved with it; an
        ``event_log`` (tuning only: it steers OpIndex's pivots, never the
        results) is not, and is passed to ``load`` again if wanted."""
        self.merge()
        seg, preds = self._main, self._main.predicates
        arrays = {"sub_ids": seg.sub_ids, "prog_offsets": seg.prog_offsets, "prog_kind": seg.prog_kind,
                  "prog_arg": seg.prog_arg, "pred_attr": preds.attr, "pred_op": preds.op,
                  "pred_lo_key": preds.lo_key, "pred_hi_key": preds.hi_key, "pred_aux": preds.aux,
                  "set_offsets": self._schema.set_csr()[0], "set_keys": self._schema.set_csr()[1]}
        meta = {"magic": FILE_MAGIC, "version": FILE_VERSION, "algorithm": self.algorithm,
                "backend": self.backend, "dnf_limit": self.dnf_limit, "max_depth": seg.max_depth,
                "options": {k: v for k, v in self.options.items() if _json_safe(v)},
                "schema": self._schema.to_json(),
                "sha256": {name: hashlib.sha256(np.ascontiguousarray(a).tobytes()).hexdigest()
                           for name, a in arrays.items()}}
        directory = os.path.dirname(os.path.abspath(path))
        fd, tmp = tempfile.mkstemp(prefix=".bexmatch-", suffix=".tmp", dir=directory)
        try:
            with os.fdopen(fd, "wb") as f, zipfile.ZipFile(f, "w") as archive:
                archive.writestr("meta.json", json.dumps(meta))
                for name, array in arrays.items():
                    buffer = io.BytesIO()
                    np.save(buffer, array, allow_pickle=False)
                    archive.writestr(f"{name}.npy", buffer.getvalue())
            os.replace(tmp, path)
        except BaseException:
            if os.path.exists(tmp):
                os.unlink(tmp)
            raise

    @classmethod
    def load(cls, path, *, backend: str | None = None, algorithm: str | None = None,
             options: dict | None = None) -> "Index":
        """Read an index written by :meth:`save`; a truncated, corrupt or
        foreign file raises :class:`engine.errors.IndexFileError`."""
        try:
            with zipfile.ZipFile(path) as archive:
                meta = json.loads(archive.read("meta.json"))
                if not isinstance(meta, dict) or meta.get("magic") != FILE_MAGIC:
                    raise IndexFileError(f"{path}: not a bexmatch index file")
                if meta.get("version") != FILE_VERSION:
                    raise IndexFileError(f"{path}: index format version {meta.get('version')} is not supported "
                                         f"(this bexmatch reads version {FILE_VERSION})")
                arrays = {}
                for name, digest in meta["sha256"].items():
                    array = np.load(io.BytesIO(archive.read(f"{name}.npy")), allow_pickle=False)
                    if hashlib.sha256(np.ascontiguousarray(array).tobytes()).hexdigest() != digest:
                        raise IndexFileError(f"{path}: array {name!r} is corrupt (checksum mismatch)")
                    arrays[name] = array
        except IndexFileError:
            raise
        except FileNotFoundError:
            raise
        except (zipfile.BadZipFile, KeyError, ValueError, EOFError, OSError, UnicodeDecodeError) as exc:
            raise IndexFileError(f"{path}: not a readable bexmatch index ({exc.__class__.__name__}: {exc})") from exc
        saved_options = meta.get("options", {}) if (algorithm or meta["algorithm"]) == meta["algorithm"] else {}
        index = cls(algorithm=algorithm or meta["algorithm"], backend=backend or meta["backend"],
                    dnf_limit=meta["dnf_limit"], options={**saved_options, **(options or {})})
        try:
            index._schema = Schema.from_json(meta["schema"])
            index._schema.restore_sets(arrays["set_offsets"], arrays["set_keys"])
            table = PredicateTable(arrays["pred_attr"], arrays["pred_op"], arrays["pred_lo_key"],
                                   arrays["pred_hi_key"], arrays["pred_aux"])
            segment = Segment(arrays["sub_ids"], arrays["prog_offsets"], arrays["prog_kind"], arrays["prog_arg"],
                              table, int(meta["max_depth"]))
            _validate_segment(segment, index._schema)
        except (KeyError, TypeError, ValueError, IndexError) as exc:
            raise IndexFileError(f"{path}: inconsistent bexmatch index ({exc})") from exc
        index._install_main(segment)
        return index

    def __repr__(self) -> str:
        return f"Index(algorithm={self.algorithm!r}, backend={self.backend!r}, subscriptions={len(self)})"


def _json_safe(value) -> bool:
    try:
        json.dumps(value)
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


def _validate_segment(segment: Segment, schema: Schema) -> None:
    """Structural checks of a loaded segment, so that a crafted file cannot
    make a kernel read out of bounds."""
    n_preds, n_code = len(segment.predicates), len(segment.prog_kind)
    offsets = segment.prog_offsets
    if len(offsets) != len(segment.sub_ids) + 1 or offsets[0] != 0 or offsets[-1] != n_code \
            or (np.diff(offsets) <= 0).any() or len(segment.prog_arg) != n_code:
        raise ValueError("program offsets do not describe the programs")
    leaves = segment.prog_kind == 0
    if ((segment.prog_arg[leaves] < 0) | (segment.prog_arg[leaves] >= n_preds)).any():
        raise ValueError("a program refers to a predicate that does not exist")
    if (segment.prog_kind > 4).any() or (segment.prog_kind < 0).any():
        raise ValueError("unknown program instruction")
    if ((segment.predicates.attr < 0) | (segment.predicates.attr >= len(schema.attr_names))).any():
        raise ValueError("a predicate refers to an unknown attribute")
    depths = program_depths(offsets, segment.prog_kind, segment.prog_arg)
    if (depths < 0).any():
        raise ValueError(f"program of subscription {int(segment.sub_ids[np.argmin(depths)])} is malformed")
    if len(depths) and depths.max() > segment.max_depth:
        raise ValueError("the recorded stack depth is smaller than the programs need")
    preds = segment.predicates
    is_pattern, is_set = np.isin(preds.op, PATTERN_CODES), np.isin(preds.op, SET_CODES)
    if ((preds.op < 0) | (preds.op > 15)).any() \
            or ((preds.aux[is_pattern] < 0) | (preds.aux[is_pattern] >= len(schema.patterns))).any() \
            or ((preds.aux[is_set] < 0) | (preds.aux[is_set] >= schema.n_sets)).any():
        raise ValueError("a predicate refers to an unknown operator, pattern or IN list")
    if (np.diff(segment.sub_ids) <= 0).any():
        raise ValueError("subscription ids are not unique and sorted")
    segment.predicates.recode(schema)


__all__ = ["Index", "ALGORITHMS"]
