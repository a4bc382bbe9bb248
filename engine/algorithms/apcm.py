"""``apcm`` (A-PCM, Sadoghi and Jacobsen, ICDE 2014): adaptive parallel compressed
event matching over BE-Tree, with online stream re-ordering (docs/papers.md#a-pcm).

How the paper maps onto this module:

* **The index** (§III) is the BE-Tree of :mod:`engine.algorithms.betree`
  -- the same units, insertion, deletion, merges and saved arrays -- with
  leaf arrays of its own: every predicate of a unit is checked at the leaf
  (BE-Tree skips an ``=`` decided by an atomic bucket on the path, but a
  compressed event reaches that bucket when *any* member has the key, so
  each member must still be checked).
* **Bitmap event encoding** (§IV): :mod:`gpu_kernels.apcm.layout`, the
  live first stage of every variant -- one bit per distinct predicate,
  attribute-contiguous, precomputed rows per elementary interval, overflow
  bits for predicates added after the layout was built, pseudo-deletion.
* **PCM** (§V) and **A-PCM** (§VI): :mod:`gpu_kernels.apcm.cpu` (the five
  stages, traversal unrolling, parallel path traversal) over the clusters
  of :mod:`engine.algorithms.osr` (online stream re-ordering).
* **Over OpIndex's lists** (option ``over="opindex"``, not in the paper):
  the traversal and leaf scans replaced by OpIndex's counting over the
  compressed event's bits (:mod:`gpu_kernels.apcm.counting`).
* **Ablations** (§VII, option ``variant``): ``bitmap`` (the bitmap-encoded
  BE-Tree, one event at a time on one core), ``parallel`` (the same, events
  over every core), ``pcm`` (every cluster compressed; with ``reorder=False``
  clusters are arrival-order runs: C-U-PP; ``parallel_paths=False``: C-U;
  ``unroll=False``: C), ``apcm`` (the default).

Results are the exact per-event answers whatever the clustering: a
compressed event only decides which units to check per member.
"""

from __future__ import annotations

import numba
import numpy as np

from engine.algorithms.base import BuildSettings, HostMatcher, alive_flags, list_truth_of
from engine.algorithms.betree import DEFAULT_LIMIT, BETreeMatcher
from engine.algorithms.betree import check_expression as _betree_check
from engine.algorithms.host_tasks import SERIAL_EVENTS, Runs, match_in_tasks, one_thread
from engine.algorithms.options import DEFAULT_MAX_CAP, DEFAULT_MIN_SIZE, APCMOptions, BETreeOptions
from engine.algorithms.osr import Clusters, Reorderer, arrival_runs, per_event
from engine.compile import Segment
from gpu_kernels.apcm import counting
from gpu_kernels.apcm import cpu as K
from gpu_kernels.apcm.counting import build_counting_lists
from gpu_kernels.apcm.layout import BitmapLayout, build_layout, carried_layout, recoded_layout, words
from gpu_kernels.betree.layout import event_keys
from gpu_kernels.betree.tree import leaf_arrays
from gpu_kernels.list_truth import list_bits_words, list_codes
from gpu_kernels.string_codes import recoded_rows, string_code_map

PAPER = "A-PCM, Sadoghi and Jacobsen, ICDE 2014 (over BE-Tree, SIGMOD 2011, §3)"


def check_expression(node, limit: int = DEFAULT_LIMIT) -> None:
    """A-PCM indexes BE-Tree's units: the same DNF limit."""
    _betree_check(node, limit)


class APCMMatcher(HostMatcher):
    """A-PCM on the host (see the module docstring)."""

    name = "apcm"

    @classmethod
    def construct(cls, segment: Segment, settings) -> "APCMMatcher":
        return cls(segment, cls.backend, schema=settings.schema, dnf_limit=settings.dnf_limit,
                   **settings.options.keywords(cls.backend))

    def __init__(self, segment: Segment, backend: str = "cpu", *, schema=None, dnf_limit: int = DEFAULT_LIMIT,
                 variant: str = "apcm", reorder: bool = True, unroll: bool = True, parallel_paths: bool = True,
                 batch_size: int = 1024, cluster_size: int = 8, threshold: int = 2, adaptive: bool = True,
                 over: str = "betree", max_cap: int = DEFAULT_MAX_CAP, min_size: int = DEFAULT_MIN_SIZE,
                 _tree: BETreeMatcher | None = None):
        if backend != "cpu":
            raise ValueError(f"APCMMatcher runs on backend 'cpu', not {backend!r}")
        self.options = APCMOptions(variant=variant, reorder=reorder, unroll=unroll, parallel_paths=parallel_paths,
                                   batch_size=batch_size, cluster_size=cluster_size, threshold=threshold,
                                   adaptive=adaptive, over=over, max_cap=max_cap, min_size=min_size)
        self.segment = segment
        self.schema = schema
        self.tree = _tree if _tree is not None else BETreeMatcher(segment, schema=schema, dnf_limit=dnf_limit,
                                                                  max_cap=max_cap, min_size=min_size, theta=None)
        self.reorderer = Reorderer(batch_size, cluster_size, threshold, adaptive)
        self._set_layout(None)
        self.last_clusters: Clusters | None = None

    # --------------------------------------------------------------- parts
    def _used_rows(self) -> np.ndarray:
        units = self.tree.units
        used = np.zeros(len(units.rows.op), bool)
        used[units.pids] = True
        return used

    def _n_attrs(self) -> int:
        rows = self.tree.units.rows
        return max(int(rows.attr.max(initial=-1)), int(self.tree.tree.p_attr.max(initial=-1))) + 1

    def _set_layout(self, carried_from: "APCMMatcher | None") -> None:
        """The bitmap layout (carried over from an older matcher under the
        same dictionary when worthwhile) and the leaf arrays reading it."""
        units = self.tree.units
        rows = units.rows
        layout = None
        if carried_from is not None and carried_from.layout_strings <= self._strings():
            old_layout, old_rows = carried_from.layout, carried_from.tree.units.rows
            if carried_from.layout_strings < self._strings():
                # the dictionary grew: the old bits' operands, and the tables' bounds, in the new codes
                old_order = carried_from.schema.dictionary().order if carried_from.schema is not None else []
                code_map = string_code_map(old_order, self.schema.dictionary().rank)
                string_attr = self.tree.string_attr
                old_rows = recoded_rows(old_rows, string_attr, code_map)
                old_layout = recoded_layout(old_layout, string_attr, code_map)
            layout = carried_layout(old_layout, old_rows, rows, self._n_attrs(), self._used_rows())
        self.layout_rebuilt = layout is None
        if layout is None:
            layout = build_layout(rows, self._n_attrs(), self._used_rows())
        self.layout: BitmapLayout = layout
        self.layout_strings = self._strings()
        tree = self.tree.tree
        no_subsumption = np.zeros(len(rows.op), np.uint8)
        l_sub, l_verify, v_pid = leaf_arrays(tree.c_depth, tree.c_child, tree.c_leaf, tree.c_pdir, tree.p_attr,
                                             tree.p_top, tree.leaf_unit, units.sub, units.offsets, units.pids,
                                             rows.attr, rows.op, no_subsumption)
        self.l_head = np.stack([np.append(l_sub, -1), l_verify], axis=1)
        self.v_attr = rows.attr[v_pid].astype(np.int64)
        self.v_slot = layout.pred_slot[v_pid]
        # A-PCM over OpIndex: the units' pivot lists over this layout's bits
        self.counting = build_counting_lists(units, layout) if self.options.over == "opindex" else None

    def _strings(self) -> int:
        return self.schema.n_strings if self.schema is not None else 0

    def _derived(self, segment: Segment, schema, tree: BETreeMatcher) -> "APCMMatcher":
        new = object.__new__(type(self))
        new.__dict__.update(self.__dict__)
        new.segment, new.schema, new.tree = segment, schema, tree
        new.settings = self.settings
        new._set_layout(self)
        return new

    # -------------------------------------------------------------- updates
    def merged(self, segment: Segment, old_to_new, added, schema=None) -> "APCMMatcher":
        schema = schema if schema is not None else self.schema
        return self._derived(segment, schema, self.tree.merged(segment, old_to_new, added, schema))

    def recoded(self, segment: Segment, schema) -> "APCMMatcher":
        """The same index under a grown string dictionary: BE-Tree's recode
        (its units' rows mapped to the new codes), and the same bitmap
        layout with its tables' bounds mapped (every bit, slot and table row
        stays: a recode moves codes, not predicates).  Where the tree was
        read again instead, the layout is carried over as a merge carries it."""
        if segment is self.segment:
            return self
        tree = self.tree.recoded(segment, schema)
        if tree.units.pids is not self.tree.units.pids or tree.tree is not self.tree.tree:
            return self._derived(segment, schema, tree)
        new = object.__new__(type(self))
        new.__dict__.update(self.__dict__)
        new.segment, new.schema, new.tree = segment, schema, tree
        if tree.units is not self.tree.units:    # (else no code of its predicates moved: nor did the bounds)
            code_map = string_code_map(self.schema.dictionary().order, schema.dictionary().rank)
            new.layout = recoded_layout(self.layout, tree.string_attr, code_map)
        new.layout_rebuilt = False
        new.layout_strings = new._strings()
        return new

    # ------------------------------------------------------------- matching
    def clusters(self, batch, ev_key) -> Clusters:
        """The batch's clusters under this matcher's variant."""
        o = self.options
        n = batch.n_events
        if o.variant in ("parallel", "bitmap"):
            return per_event(n)
        if not o.reorder:
            return arrival_runs(n, o.cluster_size)
        return self.reorderer.clusters(batch.offsets, batch.attr, ev_key, compress_all=o.variant == "pcm")

    def runs(self, batch, pattern_truth: np.ndarray, alive: np.ndarray) -> Runs:
        n_events = batch.n_events
        n_subs = len(self.segment)
        if n_events == 0 or n_subs == 0:
            return Runs.empty(n_events)
        if self.options.variant == "bitmap":
            with one_thread():                 # the sequential baseline (this thread's setting only)
                return self._runs(batch, pattern_truth, alive)
        return self._runs(batch, pattern_truth, alive)

    def _bit_codes(self) -> tuple[np.ndarray, np.ndarray]:
        """The list code of each main bit's predicate (gpu_kernels.list_truth;
        0 for other operators and pseudo-deleted bits) and, per attribute,
        whether it has such bits: made once per layout (main bits only lose
        predicates, to pseudo-deletion, which the kernel reads first)."""
        lay = self.layout
        cached = getattr(self, "_bit_codes_of", None)
        if cached is None or cached[0] is not lay:
            rows = self.tree.units.rows
            pred = np.maximum(lay.bit_pred, 0)
            codes = np.where(lay.bit_pred >= 0, list_codes(rows.op[pred], rows.aux[pred]), 0.0)
            bit_attr = np.repeat(np.arange(len(lay.main_bits)), lay.main_bits)
            list_attr = np.zeros(len(lay.main_bits), np.uint8)
            list_attr[bit_attr[codes > 0]] = 1
            cached = self._bit_codes_of = (lay, codes, list_attr)
        return cached[1], cached[2]

    def _runs(self, batch, pattern_truth, alive):
        n_subs = len(self.segment)
        alive = alive_flags(alive)
        pattern_truth = np.ascontiguousarray(pattern_truth, dtype=np.uint8)
        list_truth = list_truth_of(batch)
        t = self.tree
        ev_key = event_keys(batch.value, batch.attr, t.string_attr, t.str_map)
        clusters = self.clusters(batch, ev_key)
        self.last_clusters = clusters
        lay = self.layout
        rows = t.units.rows
        n_attrs = lay.n_attrs
        ev_attr = batch.attr
        # stage 1: the entries' slices; evaluated ones (and the clusters' ORs) in the store
        a = ev_attr.astype(np.int64)
        known = a < n_attrs
        a_known = np.where(known, a, 0)
        entry_words = np.where(known, np.where(lay.tab_off[a_known] < 0, words(lay.main_bits[a_known]), 0)
                               + words(lay.over_bits[a_known]), 0)
        cl_off, perm = clusters.off, clusters.perm
        sizes = np.diff(cl_off)
        slice_words = np.where(known, words(lay.main_bits[a_known]) + words(lay.over_bits[a_known]), 0)
        # room for a cluster's ORs: at most its members' slices
        cluster_words = _segment_sums(_segment_sums(slice_words, batch.offsets)[perm], cl_off)
        cluster_words = np.where(sizes > 1, cluster_words, 0)
        n_entry_words = int(entry_words.sum())
        store_at = np.concatenate(([0], np.cumsum(entry_words)[:-1])).astype(np.int64)
        c_store_at = (n_entry_words + np.concatenate(([0], np.cumsum(cluster_words)[:-1]))).astype(np.int64)
        store = np.zeros(n_entry_words + int(cluster_words.sum()), np.uint64)
        e_main = np.empty(len(ev_attr), np.int64)
        e_over = np.empty(len(ev_attr), np.int64)
        K.encode_entries(ev_attr, batch.value, batch.token, store_at, lay.main_bits, lay.over_bits, lay.bit_off,
                         lay.bit_pred, *self._bit_codes(), lay.obit_off, lay.obit_pred, lay.tab_off, lay.bound_off,
                         lay.bounds, rows.op, rows.lo, rows.hi, rows.aux, rows.set_offsets, rows.set_values,
                         pattern_truth, list_truth, list_bits_words(list_truth), e_main, e_over, store)
        # stage 2: compressed events
        cluster_entries = _segment_sums(np.diff(batch.offsets)[perm], cl_off)
        ce_start = np.concatenate(([0], np.cumsum(cluster_entries)[:-1])).astype(np.int64)
        n_ce = int(cluster_entries.sum())
        n_cl = clusters.n_clusters
        ce_end = np.empty(n_cl, np.int64)
        ce_attr = np.empty(n_ce, np.int64)
        ce_main = np.empty(n_ce, np.int64)
        ce_over = np.empty(n_ce, np.int64)
        ce_absent = np.empty(n_ce, np.uint8)
        ce_key_end = np.empty(n_ce, np.int64)
        ce_keys = np.empty(n_ce, np.uint64)
        K.compress_clusters(cl_off, perm, batch.offsets, ev_attr, ev_key, e_main, e_over, lay.main_bits,
                            lay.over_bits, lay.table, store, ce_start, c_store_at, ce_end, ce_attr, ce_main, ce_over,
                            ce_absent, ce_key_end, ce_keys)
        node, p_top, p_attr = t.table.node, t.table.p_top, t.tree.p_attr
        n_attrs_walk = max(n_attrs, t.table.n_attrs)
        o = self.options
        max_members = clusters.max_members
        max_entries, cache_len = K.member_scratch(cl_off, ce_start, ce_end, ce_attr, lay.main_bits, lay.over_bits)
        if self.counting is not None:
            # stages 3 and 4 over OpIndex's lists: each compressed event counted, its candidates checked per member
            def count(first, last, out, cap, cl_count, stop, need, serial):
                kernel = counting.count_kernel_serial if serial else counting.count_kernel
                kernel(first, last, out, cap, cl_count, stop, need, n_subs, max_members, n_attrs_walk, max_entries,
                       cache_len, ev_count, self.counting, alive, cl_off, perm, batch.offsets, ev_attr, e_main,
                       e_over, ce_start, ce_end, ce_attr, ce_main, ce_over, ce_absent, lay.main_bits, lay.over_bits,
                       lay.table, store, counting.MAX_MARK)
            ev_count = np.zeros(len(perm), np.int64)
            estimate = getattr(self, "_matches_per_cluster", 16.0)
            runs, self._matches_per_cluster = match_in_tasks(n_cl, count, estimate, members=cl_off,
                                                             member_counts=ev_count)
            return runs.permuted(perm)
        if not o.unroll:
            out_off = np.zeros(len(perm) + 1, np.int64)
            out = np.empty(1024, np.int32)
            out = K.match_interleaved(n_subs, max_members, n_attrs_walk, node, p_top, p_attr, self.l_head,
                                      self.v_attr, self.v_slot, alive, cl_off, perm, batch.offsets, ev_attr, e_main,
                                      e_over, ce_start, ce_end, ce_attr, ce_key_end, ce_keys, lay.table, store,
                                      out_off, out)
            return Runs(np.diff(out_off), out_off[:-1].copy(), np.zeros(len(perm), np.int64), (out,)).permuted(perm)
        # stage 3: the walk of each compressed event, unrolled into candidate c-nodes
        item_cluster, item_pnode = K.path_items(n_cl, ce_start, ce_end, ce_attr, node, p_attr, o.parallel_paths)
        cand_off, cand = self._traverse(item_cluster, item_pnode, ce_start, ce_end, ce_attr, ce_key_end, ce_keys,
                                        node, p_top, p_attr, n_attrs_walk, n_cl, o.parallel_paths)
        # stage 4: leaf scans, clusters over the cores
        ev_count = np.zeros(len(perm), np.int64)
        l_head, v_attr, v_slot = self.l_head, self.v_attr, self.v_slot

        def launch(first, last, out, cap, cl_count, stop, need, serial):
            kernel = K.scan_kernel_serial if serial else K.scan_kernel
            kernel(first, last, out, cap, cl_count, stop, need, n_subs, max_members, n_attrs_walk, max_entries,
                   cache_len, ev_count, cand_off, cand, node, l_head, v_attr, v_slot, alive, cl_off, perm,
                   batch.offsets, ev_attr, e_main, e_over, ce_start, ce_end, ce_attr, ce_main, ce_over, ce_absent,
                   lay.main_bits, lay.over_bits, lay.table, store)
        estimate = getattr(self, "_matches_per_cluster", 16.0)
        runs, self._matches_per_cluster = match_in_tasks(n_cl, launch, estimate, members=cl_off,
                                                         member_counts=ev_count)
        return runs.permuted(perm)     # (listed cluster by cluster: back in batch order)

    def _traverse(self, item_cluster, item_pnode, ce_start, ce_end, ce_attr, ce_key_end, ce_keys, node, p_top, p_attr,
                  n_attrs, n_clusters, parallel):
        """Stage 3 over the work items, walked again with more room where
        their candidates overflowed; the candidates per cluster (CSR)."""
        n_items = len(item_cluster)
        threads = numba.get_num_threads()
        parallel = parallel and threads > 1 and n_items > SERIAL_EVENTS
        n_tasks = int(min(n_items, 4 * threads)) if parallel else 1
        bounds = np.linspace(0, n_items, n_tasks + 1).round().astype(np.int64)
        cap = int(max(16, getattr(self, "_candidates_per_item", 16.0) * 2))
        cand = np.empty(n_items * cap, np.int64)
        found = np.zeros(n_items, np.int64)
        kernel = K.traverse_items if parallel else K.traverse_items_serial
        kernel(bounds[:-1].copy(), bounds[1:].copy(), item_cluster, item_pnode, ce_start, ce_end, ce_attr,
               ce_key_end, ce_keys, node, p_top, p_attr, n_attrs, cand, cap, found)
        redo_at = np.full(n_items, -1, np.int64)
        over = np.flatnonzero(found > cap)
        redo_cap = int(found.max(initial=0))
        redo_cand = np.empty(max(1, len(over) * redo_cap), np.int64)
        if len(over):
            redo_at[over] = np.arange(len(over))
            redo_found = np.zeros(n_items, np.int64)
            sub_cluster, sub_pnode = item_cluster[over], item_pnode[over]
            K.traverse_items_serial(np.zeros(1, np.int64), np.full(1, len(over), np.int64), sub_cluster, sub_pnode,
                                    ce_start, ce_end, ce_attr, ce_key_end, ce_keys, node, p_top, p_attr, n_attrs,
                                    redo_cand, redo_cap, redo_found)
        if n_items:
            self._candidates_per_item = max(1.0, float(np.percentile(found, 90)))
        return K.gather_candidates(n_clusters, item_cluster, cand, cap, found, redo_at, redo_cand, redo_cap)

    # --------------------------------------------------------------- memory
    @property
    def nbytes(self) -> int:
        counting_bytes = self.counting.nbytes if self.counting is not None else 0
        return self.tree.nbytes + self.layout.nbytes + int(self.l_head.nbytes + self.v_attr.nbytes
                                                           + self.v_slot.nbytes) + counting_bytes

    def statistics(self) -> dict:
        stats = self.tree.statistics()
        stats.update({f"bitmap_{k}": v for k, v in self.layout.statistics().items()})
        if self.counting is not None:
            lists = self.counting
            stats.update(counting_lists=len(lists.pa_attr), counting_entries=len(lists.entry_unit),
                         counting_always=len(lists.always), counting_bytes=lists.nbytes)
        if self.last_clusters is not None:
            c = self.last_clusters
            stats.update(clusters=c.n_clusters, compressed_events=c.compressed_events(),
                         cluster_capacity=self.reorderer.capacity)
        return stats

    # ---------------------------------------------------------- persistence
    def to_arrays(self):
        """The BE-Tree's arrays (the bitmap layout is derived again on load)."""
        return self.tree.to_arrays()

    @classmethod
    def from_arrays(cls, segment: Segment, settings, meta: dict, arrays: dict) -> "APCMMatcher":
        options = settings.options.keywords("cpu")
        inner = BuildSettings(settings.schema, settings.dnf_limit,
                              BETreeOptions(max_cap=options["max_cap"], min_size=options["min_size"], theta=None))
        tree = BETreeMatcher.from_arrays(segment, inner, meta, arrays)
        matcher = cls(segment, cls.backend, schema=settings.schema, dnf_limit=settings.dnf_limit, _tree=tree,
                      **options)
        matcher.settings = settings
        return matcher

    def __repr__(self) -> str:
        o = self.options
        return (f"APCMMatcher({len(self.segment)} subscriptions, variant={o.variant}, over={o.over}, "
                f"batch_size={o.batch_size}, "
                f"cluster_size={o.cluster_size}, threshold={o.threshold}; {self.tree!r})")


def _segment_sums(values: np.ndarray, offsets: np.ndarray) -> np.ndarray:
    """Sums of ``values[offsets[i]:offsets[i + 1]]`` (empty segments: 0)."""
    total = np.concatenate(([0], np.cumsum(values, dtype=np.int64)))
    return total[offsets[1:]] - total[offsets[:-1]]


__all__ = ["APCMMatcher", "check_expression"]
