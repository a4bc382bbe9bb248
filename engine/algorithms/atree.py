"""``atree`` (A-Tree, Ji and Jacobsen, SIGMOD 2021): arbitrary Boolean
expressions in one DAG of shared subexpressions (docs/papers.md#a-tree).

How the paper maps onto this module and :mod:`gpu_kernels.atree`:

* **Expressions** (§3): every expression is native -- the compiler's
  postfix programs (negation normal form: NOT folded into predicates, as
  the zero suppression filter of §5.2.1 wants) are read back as n-ary
  trees (:meth:`gpu_kernels.atree.build.ArrayDag.insert_programs`), AND in
  AND and OR in OR flattened.
* **The A-Tree** (§4.1-§4.2): unique l-, i- and r-nodes through
  order-insensitive expression ids, expression reorganisation by greedy
  set cover, self-adjustment, use counts, insertion and deletion --
  :class:`gpu_kernels.atree.build.ArrayDag`, arrays changed by compiled
  code on the host; :class:`gpu_kernels.atree.dag.ATreeDag`, the same in
  Python, is its reference and makes the ablations ``sharing=False`` and
  ``binary``.
* **Levels and flattening** (§4.1, §5): :func:`gpu_kernels.atree.layout.flatten`.
* **Predicate matching** (§5: any predicate index will do): the
  non-exact l-nodes with ``=``, ``IN``, ``<``, ``<=``, ``>``, ``>=``,
  ``BETWEEN`` sorted by key per attribute
  (:func:`gpu_kernels.atree.layout.leaf_index`), so only their TRUE ones
  are touched; the other l-nodes are evaluated one by one.
* **Matching** (§5, Algorithm 6 with §5.2's zero suppression and
  propagation on demand, exact under SQL's three-valued logic):
  :mod:`gpu_kernels.atree.cpu`, events over all cores; by default a
  batch's events 64 at a time, a bit each in every node's word
  (:mod:`gpu_kernels.atree.sliced`: each node read once for 64 events,
  not once for each).

Updates (docs/architecture.md#the-index-life-cycle): a merge derives the
next matcher from this one (:meth:`ATreeMatcher.merged`): a copy of the
DAG loses the removed subscriptions' uses (nodes reaching a useCount of
zero go, Algorithm 5, spliced into the parents that adopted them, §4.2.4)
and gains the added ones (Algorithm 4, sharing the nodes
that exist), and is flattened again.  Leaves are keyed by their
predicate's key, not its id, so the renumbered predicate table of a merged
segment and a grown string dictionary change no node.
"""

from __future__ import annotations

import sys

import numpy as np

from engine.algorithms.base import HostMatcher, alive_flags, list_truth_of
from engine.algorithms.host_tasks import Runs, match_in_tasks
from engine.compile import Segment
from gpu_kernels.atree import cpu as K
from gpu_kernels.atree import sliced as S
from gpu_kernels.atree.build import ArrayDag, PredicateKeys, first_foreign_leaf
from gpu_kernels.atree.dag import ATreeDag
from gpu_kernels.atree.layout import flatten, leaf_index
from gpu_kernels.opcodes import AND, LEAF, OR, XNOR, XOR


#: batches of fewer events go one event at a time even with ``lanes=64``:
#: at 4 events the two kernels were even (W5 at 300 K, machine C3), at
#: one the words' scratch made the batch kernel 1.7x slower
SLICED_FROM = 4


def _predicate_keys(segment: Segment) -> PredicateKeys:
    """Each predicate id's key (stable across segments and dictionary versions)."""
    table = segment.predicates
    return PredicateKeys.of(table.attr, table.op, table.lo_key, table.hi_key, table.aux)


class ATreeMatcher(HostMatcher):
    """A-Tree on the host (see the module docstring).  Options
    (:class:`engine.algorithms.options.ATreeOptions`): ``sharing`` (unique
    nodes for shared predicates and subexpressions), ``reorganize``
    (Algorithm 2), ``self_adjust`` (Algorithm 3), and the paper's
    ablations ``binary`` (Figure 8's binary tree), ``zero_suppression`` and
    ``on_demand`` (Figure 10's matching optimisations); ``lanes``: 64
    events matched together (:mod:`gpu_kernels.atree.sliced`) or 1 (the
    paper's one event at a time, :mod:`gpu_kernels.atree.cpu`)."""

    name = "atree"

    @classmethod
    def construct(cls, segment: Segment, settings) -> "ATreeMatcher":
        return cls(segment, cls.backend, schema=settings.schema, **settings.options.keywords(cls.backend))

    def __init__(self, segment: Segment, backend: str = "cpu", *, schema=None, sharing: bool = True,
                 reorganize: bool = True, self_adjust: bool = True, binary: bool = False,
                 zero_suppression: bool = True, on_demand: bool = True, lanes: int = 64):
        if backend != "cpu":
            raise ValueError(f"ATreeMatcher runs on backend 'cpu', not {backend!r}")
        from engine.algorithms.options import ATreeOptions
        ATreeOptions(sharing=sharing, reorganize=reorganize, self_adjust=self_adjust, binary=binary,
                     zero_suppression=zero_suppression, on_demand=on_demand, lanes=lanes)   # the values' checks
        self.schema = schema
        self.lanes = lanes
        self.segment = self._coded(segment)
        self.zero_suppression, self.on_demand = zero_suppression, on_demand
        # the compiled DAG makes what the Python one does; the Python one also makes the ablations
        self.dag = ArrayDag(reorganize, self_adjust) if sharing and not binary else \
            ATreeDag(sharing, reorganize, self_adjust, binary)
        keys = _predicate_keys(self.segment)
        self.roots = np.array(self._insert(self.segment, np.arange(len(self.segment)), keys), np.int64)
        self.merges = 0
        self._flatten(keys)

    def _coded(self, segment: Segment) -> Segment:
        if segment.predicates.lo is None:
            if self.schema is None:
                raise ValueError("the segment's predicates are not coded yet: recode them or pass schema=")
            segment = segment.coded(self.schema)
        return segment

    def _insert(self, segment: Segment, positions, keys: PredicateKeys) -> list:
        """Algorithm 4 for the subscriptions at ``positions``: their r-nodes."""
        program = (segment.prog_offsets, segment.prog_kind, segment.prog_arg, keys)
        if isinstance(self.dag, ATreeDag):
            return self.dag.insert_programs(_progress(positions.tolist()), *program)
        with _progress(None, total=len(positions)) as bar:
            return self.dag.insert_programs(positions, *program, progress=bar.update)

    def _flatten(self, keys: PredicateKeys) -> None:
        table = self.segment.predicates
        self.arrays = flatten(self.dag, self.roots, table.attr, table.op, keys,
                              zero_suppression=self.zero_suppression, on_demand=self.on_demand, pred_lo=table.lo)
        # keyed by the coded bounds: a recode (a grown string dictionary) builds both again
        self.leaf_index = leaf_index(self.arrays, table.op, table.lo, table.hi, table.set_offsets, table.set_values)
        self._matches_per_event = 16.0
        #: leaves the last match call touched (evaluated, or located in the index), and its events
        self.leaf_work = (0, 0)

    # -------------------------------------------------------------- updates
    def merged(self, segment: Segment, old_to_new, added, schema=None) -> "ATreeMatcher":
        """The matcher of the merged segment, derived (the DAG copied, then
        Algorithm 5 for the removed subscriptions, Algorithm 4 for the added
        ones); this matcher is unchanged."""
        old_to_new = np.asarray(old_to_new, np.int64)
        added = np.asarray(added, np.int64)
        if len(old_to_new) != len(self.segment):
            raise ValueError(f"old_to_new has {len(old_to_new)} positions, the segment {len(self.segment)}")
        new = object.__new__(type(self))
        new.__dict__.update(self.__dict__)
        new.schema = schema if schema is not None else self.schema
        new.segment = new._coded(segment)
        dag = self.dag.copy()
        dag.release_all(self.roots[old_to_new < 0].tolist())
        roots = np.full(len(segment), -1, np.int64)
        kept = old_to_new >= 0
        roots[old_to_new[kept]] = self.roots[kept]
        new.dag = dag
        keys = _predicate_keys(new.segment)
        roots[added] = new._insert(new.segment, added, keys)
        if (roots < 0).any():
            raise ValueError("merged: a position of the new segment is neither kept nor added")
        if dag.n_removed > len(dag):           # ids of removed nodes outnumber the live ones: renumber
            dag, compact_roots = dag.compacted(roots.tolist())
            roots = np.array(compact_roots, np.int64)
            new.dag = dag
        new.roots = roots
        new.merges = self.merges + 1
        new._flatten(keys)
        return new

    def recoded(self, segment: Segment, schema) -> "ATreeMatcher":
        """The same DAG under a grown string dictionary.  Nodes hold
        predicate keys, and the flattened arrays order the leaves by
        (attribute, operator, code): new strings move the codes of one
        attribute and operator all in the same order (codes of dictionary
        strings; the other operands are numbers or 0, untouched), so the
        arrays stay as they are and only the leaf index, which holds the
        codes, is made again."""
        if segment is self.segment:
            return self
        new = object.__new__(type(self))
        new.__dict__.update(self.__dict__)
        new.schema = schema
        new.segment = new._coded(segment)
        table, old = new.segment.predicates, self.segment.predicates
        if not (np.array_equal(table.lo, old.lo) and np.array_equal(table.hi, old.hi)
                and np.array_equal(table.set_values, old.set_values)):      # (else no code of its leaves moved)
            new.leaf_index = leaf_index(self.arrays, table.op, table.lo, table.hi, table.set_offsets,
                                        table.set_values)
        new.leaf_work = (0, 0)
        return new

    # ------------------------------------------------------------- matching
    def runs(self, batch, pattern_truth: np.ndarray, alive: np.ndarray) -> Runs:
        n_events = batch.n_events
        if n_events == 0 or len(self.segment) == 0:
            return Runs.empty(n_events)
        alive = alive_flags(alive)
        pattern_truth = np.ascontiguousarray(pattern_truth, dtype=np.uint8)
        list_truth = list_truth_of(batch)
        a, x, preds = self.arrays, self.leaf_index, self.segment.predicates
        touched = [0]
        # a few events: one at a time (the words' scratch costs more than it saves below SLICED_FROM)
        sliced = self.lanes > 1 and n_events >= SLICED_FROM
        if sliced:
            serial_kernel, parallel_kernel = S.atree_sliced_serial, S.atree_sliced_kernel
        else:
            serial_kernel, parallel_kernel = K.atree_match_serial, K.atree_match_kernel

        def launch(first, last, out, cap, ev_count, stop, need, serial):
            kernel = serial_kernel if serial else parallel_kernel
            task_leaves = np.zeros(len(first), np.int64)
            kernel(first, last, out, cap, ev_count, stop, need, task_leaves, batch.offsets, batch.attr, batch.value,
                   batch.token, pattern_truth, list_truth, alive, a.kind, a.level_start, a.child_off,
                   a.child_idx, a.par_off, a.par_idx, a.needs3, a.leaf_pred, x.scan_off, x.scan_leaf, x.key_off, x.key,
                   x.key_hi, x.key_reach, x.key_leaf, x.key_quiet, a.absent_leaf, a.sub_off, a.sub_pos,
                   preds.attr, preds.op, preds.lo, preds.hi, preds.set_offsets, preds.set_values, preds.aux)
            touched[0] += int(task_leaves.sum())       # finished events only: a resumed task counts the rest
        runs, self._matches_per_event = match_in_tasks(n_events, launch, self._matches_per_event,
                                                       per_task=S.LANES if sliced else 1)
        self.leaf_work = (touched[0], n_events)
        return runs

    # ---------------------------------------------------------- persistence
    #: version of the saved DAG (:meth:`to_arrays`); format 1 (without useCounts and the children nodes were
    #: made with) is read too, as a DAG whose nodes have the children they were made with
    SAVED_FORMAT = 2
    _READ_FORMATS = (1, 2)
    #: the options a saved DAG was built with: another value asks for another DAG
    _SHAPE = ("sharing", "reorganize", "self_adjust", "binary")

    def to_arrays(self):
        """The host DAG as arrays (removed nodes left out): per node its
        kind, uses, leaf predicate (id in the segment, -1 for an operator),
        children (CSR), useCount and the children it was made with (CSR,
        ``born_len`` -1 when they are its children); per node with an expression id its key's
        children (CSR, ``key_len`` -1 without a key; a leaf's key is its
        predicate's) -- a reorganised or self-adjusted node is keyed by its
        flat child set, not by the children it links; and each
        subscription's r-node.  Saving keeps the DAG its insertion order
        made, which a rebuild might not reproduce."""
        dag, roots = self.dag.compacted(self.roots.tolist())
        meta = {"format": self.SAVED_FORMAT, "merges": self.merges,
                **{name: getattr(self.dag, name) for name in self._SHAPE}}
        return meta, {**dag.saved(_predicate_keys(self.segment)), "roots": np.array(roots, np.int64)}

    @classmethod
    def from_arrays(cls, segment: Segment, settings, meta: dict, arrays: dict) -> "ATreeMatcher":
        """The saved DAG, checked (ValueError for anything an insertion
        could not have made), then flattened -- no insertion replayed.  A
        file saved with other construction options is built again."""
        options = settings.options.keywords("cpu")
        if meta.get("format") not in cls._READ_FORMATS:
            raise ValueError(f"saved A-Tree: format {meta.get('format')!r} (this version reads {cls.SAVED_FORMAT})")
        if not isinstance(meta.get("merges"), int) or any(not isinstance(meta.get(n), bool) for n in cls._SHAPE):
            raise ValueError("saved A-Tree: meta 'merges' or a construction option missing")
        if any(meta[name] != options[name] for name in cls._SHAPE):
            return cls.build(segment, settings)
        wanted = SAVED_ARRAYS + (BORN_ARRAYS if meta["format"] >= 2 else ())
        missing = sorted(set(wanted) - set(arrays))
        if missing:
            raise ValueError(f"saved A-Tree: arrays {missing} missing")
        if any(np.asarray(arrays[name]).dtype.kind not in "iu" or np.ndim(arrays[name]) != 1 for name in wanted):
            raise ValueError("saved A-Tree: an array is not 1-d integers")
        new = object.__new__(cls)
        new.schema = settings.schema
        new.segment = new._coded(segment)
        new.zero_suppression, new.on_demand = options["zero_suppression"], options["on_demand"]
        new.lanes = options["lanes"]
        new.dag = _restored_dag(meta, arrays, _predicate_keys(new.segment))
        roots = np.asarray(arrays["roots"], np.int64)
        if len(roots) != len(new.segment) or (len(roots) and (roots.min() < 0 or roots.max() >= len(new.dag.kind))):
            raise ValueError("saved A-Tree: the r-nodes do not fit the segment's subscriptions")
        child_len = np.asarray(arrays["child_len"], np.int64)
        child_off = np.concatenate(([0], np.cumsum(child_len))).astype(np.int64)
        seg = new.segment
        foreign = first_foreign_leaf(roots, child_off, np.asarray(arrays["child_idx"], np.int64),
                                     np.asarray(arrays["leaf_pid"], np.int64), seg.prog_offsets.astype(np.int64),
                                     seg.prog_kind.astype(np.int64), seg.prog_arg.astype(np.int64),
                                     len(seg.predicates))
        if foreign >= 0:
            raise ValueError(f"saved A-Tree: subscription {int(seg.sub_ids[foreign])}'s r-node reaches a predicate "
                             f"its expression does not hold")
        new.roots = roots
        new.merges = meta["merges"]
        new._flatten(_predicate_keys(new.segment))
        return new

    # --------------------------------------------------------------- memory
    #: host bytes of the Python DAG kept for merges, per node (list slots,
    #: the children tuple, the table entry and key, the parent set, the
    #: sub-set lookup's member sets) and per link (a tuple slot, a
    #: parent-set entry): fitted to tracemalloc's count of what a matcher
    #: keeps on W1 and W5 (2026-11-29; tests/test_atree.py holds the
    #: estimate to it), since sys.getsizeof over millions of objects would
    #: cost more than a merge
    DAG_BYTES_PER_NODE = 560
    DAG_BYTES_PER_LINK = 40
    @property
    def nbytes(self) -> int:
        """The segment, the flat arrays and the leaves' index, and the host DAG (the compiled one's arrays,
        its leaf classes' keys among them; an estimate of the Python one's objects)."""
        if isinstance(self.dag, ArrayDag):
            dag = self.dag.nbytes
        else:
            dag = len(self.dag) * self.DAG_BYTES_PER_NODE + len(self.arrays.child_idx) * self.DAG_BYTES_PER_LINK
        return self.segment.nbytes + self.arrays.nbytes + self.leaf_index.nbytes + int(self.roots.nbytes) + dag

    def statistics(self) -> dict:
        """The A-Tree's shape and sharing (§6.1's measure): nodes per kind,
        levels, and how many times, on average, a predicate (l-node) and
        a subexpression (i-node) are used -- parent links plus
        subscriptions (§4.2.3's use count) -- and ``keyed_leaves``, the
        l-nodes in the predicate index (only their TRUE ones are touched)."""
        return {**sharing_statistics(self.dag, self.arrays, self.roots),
                "keyed_leaves": int(len(self.arrays.attr_leaf) - len(self.leaf_index.scan_leaf))}

    def __repr__(self) -> str:
        s = self.statistics()
        return (f"ATreeMatcher({len(self.segment)} subscriptions, {s['l_nodes']} l-nodes, {s['i_nodes']} i-nodes, "
                f"{s['r_nodes']} r-nodes, "
                f"{s['levels']} levels, sharing={self.dag.sharing}, reorganize={self.dag.reorganize}, "
                f"self_adjust={self.dag.self_adjust}, binary={self.dag.binary}, "
                f"zero_suppression={self.zero_suppression}, on_demand={self.on_demand})")


def _progress(positions, total=None):
    """``positions``, with a progress bar on a terminal once inserting has
    taken a second (a million expressions take seconds compiled, minutes
    in the Python DAG of the ablations); or, with ``positions`` None, a
    bar of ``total`` to update."""
    from tqdm import tqdm

    from engine.index import PROGRESS_AFTER_S
    return tqdm(positions, total=total, desc="A-Tree insert", unit="expression", file=sys.stderr,
                delay=PROGRESS_AFTER_S, disable=None, leave=False)


#: the arrays of a saved A-Tree (:meth:`ATreeMatcher.to_arrays`), and those format 2 added: the useCounts and the
#: children a node was made with (CSR, ``born_len`` -1 where they are its children)
SAVED_ARRAYS = ("kind", "uses", "leaf_pid", "child_len", "child_idx", "key_len", "key_idx", "roots")
BORN_ARRAYS = ("refs", "born_len", "born_idx")


def _restored_dag(meta: dict, arrays: dict, keys: PredicateKeys):
    """:meth:`ATreeMatcher.from_arrays`'s DAG, every array checked (ranges,
    one expression id a node, use counts against what the links and
    r-nodes give): an :class:`ArrayDag` for the shapes it makes, else the
    Python DAG, its lists rebuilt from the arrays, the expression table and
    the parent sets derived."""
    kind = np.asarray(arrays["kind"], np.int64)
    n = len(kind)
    sizes = {name: len(arrays[name]) for name in ("uses", "leaf_pid", "child_len", "key_len")}
    if any(size != n for size in sizes.values()):
        raise ValueError(f"saved A-Tree: per-node arrays of different lengths {sizes}, {n} nodes")
    child_len, key_len = np.asarray(arrays["child_len"], np.int64), np.asarray(arrays["key_len"], np.int64)
    child_idx, key_idx = np.asarray(arrays["child_idx"], np.int64), np.asarray(arrays["key_idx"], np.int64)
    leaf_pid = np.asarray(arrays["leaf_pid"], np.int64)
    leaf = kind == LEAF
    if ((kind != LEAF) & ~np.isin(kind, (AND, OR, XOR, XNOR))).any() or (child_len < 0).any() \
            or child_len.sum() != len(child_idx) or key_len[key_len > 0].sum() != len(key_idx) \
            or (child_idx.size and (child_idx.min() < 0 or child_idx.max() >= n)) \
            or (key_idx.size and (key_idx.min() < 0 or key_idx.max() >= n)) \
            or (leaf != (child_len == 0)).any() or (leaf != (leaf_pid >= 0)).any() \
            or (leaf_pid.size and leaf_pid.max() >= len(keys)) or (leaf & (key_len > 0)).any():
        raise ValueError("saved A-Tree: a node's kind, children, key or predicate is out of range")
    if "refs" in arrays:
        refs, born_len = np.asarray(arrays["refs"], np.int64), np.asarray(arrays["born_len"], np.int64)
        born_idx = np.asarray(arrays["born_idx"], np.int64)
        if len(refs) != n or len(born_len) != n or (born_len < -1).any() \
                or born_len[born_len > 0].sum() != len(born_idx) \
                or (born_idx.size and (born_idx.min() < 0 or born_idx.max() >= n)):
            raise ValueError("saved A-Tree: a node's useCount or the children it was made with are out of range")
    else:                                    # (format 1: every node has the children it was made with)
        refs, born_len, born_idx = np.asarray(arrays["uses"], np.int64), np.full(n, -1, np.int64), np.zeros(0, np.int64)
    if n:
        roots = np.asarray(arrays["roots"], np.int64).clip(0, n - 1)
        uses = np.bincount(child_idx, minlength=n) + np.bincount(roots, minlength=n)
        if not np.array_equal(uses, np.asarray(arrays["uses"], np.int64)):
            raise ValueError("saved A-Tree: use counts differ from the links and r-nodes")
        # the useCounts: the r-nodes and the children nodes were made with (their own where born_len is -1)
        made_with = np.concatenate([child_idx[np.repeat(born_len < 0, child_len)], born_idx])
        if not np.array_equal(np.bincount(made_with, minlength=n) + np.bincount(roots, minlength=n), refs):
            raise ValueError("saved A-Tree: useCounts differ from the children nodes were made with and r-nodes")
    if meta["sharing"] and not meta["binary"]:
        return ArrayDag.restored(meta["reorganize"], meta["self_adjust"], kind, np.asarray(arrays["uses"], np.int64),
                                 leaf_pid, keys, child_len, child_idx, key_len, key_idx, refs, born_len, born_idx)
    dag = ATreeDag(meta["sharing"], meta["reorganize"], meta["self_adjust"], meta["binary"])
    c_at = np.concatenate(([0], np.cumsum(child_len))).tolist()
    k_at = np.concatenate(([0], np.cumsum(np.maximum(key_len, 0)))).tolist()
    children, key_children = child_idx.tolist(), key_idx.tolist()
    dag.kind = kind.astype(np.int64).tolist()
    dag.children = [tuple(children[c_at[i]:c_at[i + 1]]) for i in range(n)]
    dag.pred = [keys(p) if p >= 0 else None for p in leaf_pid.tolist()]
    dag.uses = np.asarray(arrays["uses"], np.int64).tolist()
    dag.refs = refs.tolist()
    b_at = np.concatenate(([0], np.cumsum(np.maximum(born_len, 0)))).tolist()
    born = born_idx.tolist()
    dag.born = {node: tuple(born[b_at[node]:b_at[node + 1]]) for node in np.flatnonzero(born_len >= 0).tolist()}
    dag.key = [None if kl < 0 else ("L", dag.pred[i]) if kl == 0 else
               (dag.kind[i], tuple(key_children[k_at[i]:k_at[i + 1]])) for i, kl in enumerate(key_len.tolist())]
    dag.table = {key: i for i, key in enumerate(dag.key) if key is not None}
    if len(dag.table) != int((key_len >= 0).sum()):
        raise ValueError("saved A-Tree: two nodes with one expression id")
    if dag.self_adjust:
        for parent, kids in enumerate(dag.children):
            for child in set(kids):
                dag._parent_set(child).add(parent)
    return dag


def sharing_statistics(dag: ATreeDag, arrays, roots) -> dict:
    """Node counts, and the sharing §6.1 measures: the average number of
    uses of a node -- parents linking to it now plus subscriptions that
    are it (``uses``; not the useCount ``refs``, whose parents are those
    made with the node, before self-adjustment relinked any) -- over the
    l-nodes (a predicate's sharing) and over the i-nodes, operator nodes
    that are no subscription's whole expression (a subexpression's);
    r-nodes are the subscriptions' distinct expressions."""
    kind = dag.kinds()
    uses = dag.use_counts()
    is_root = np.zeros(len(kind), bool)
    is_root[np.asarray(roots, np.int64)] = True
    leaf = kind == 0
    inner = (kind > 0) & ~is_root
    return {"nodes": int((kind >= 0).sum()), "l_nodes": int(leaf.sum()), "i_nodes": int(inner.sum()),
            "r_nodes": int(is_root.sum()), "levels": int(len(arrays.level_start) - 2),
            "links": int(len(arrays.child_idx)), "propagation_links": int(len(arrays.par_idx)),
            "absent_list": int(len(arrays.absent_leaf)),
            "predicate_sharing": float(uses[leaf].mean()) if leaf.any() else 0.0,
            "subexpression_sharing": float(uses[inner].mean()) if inner.any() else 0.0}


__all__ = ["ATreeMatcher", "sharing_statistics"]
