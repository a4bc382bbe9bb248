"""Each algorithm's options: one frozen dataclass shared by both backends.

``Index(algorithm=..., options={...})`` turns the mapping into the
algorithm's options dataclass at once (:meth:`Options.from_mapping`), so an
unknown name, an option of the other backend or a bad value fails when the
index is made -- not at its first match.  A field's metadata says which
backends it applies to and whether ``Index.save`` keeps it; the matchers
receive the fields of their backend as keyword arguments
(:meth:`Options.keywords`).  This module imports nothing heavy: the
registry validates options without loading an algorithm's kernels.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np

BOTH = ("cpu", "cuda")
CPU = ("cpu",)
CUDA = ("cuda",)


def option(default, *, backends: tuple[str, ...] = BOTH, saved: bool = True, structural: bool = True,
           doc: str = ""):
    """A dataclass field of an options class: its default, the backends it
    applies to, whether a saved index keeps it, whether it shapes the built
    structure (a saved structure is reused only under the same structural
    options), and what it does."""
    return field(default=default, metadata={"backends": backends, "saved": saved, "structural": structural,
                                            "doc": doc})


def _is_int(value) -> bool:
    return isinstance(value, (int, np.integer)) and not isinstance(value, (bool, np.bool_))


def _power_of_two(value, low: int, high: int) -> bool:
    return _is_int(value) and low <= value <= high and not value & (value - 1)


@dataclass(frozen=True)
class Options:
    """Base of the options dataclasses (no options)."""

    #: the algorithm these options belong to (for messages)
    algorithm = ""

    @classmethod
    def from_mapping(cls, mapping: dict | None, backend: str) -> "Options":
        """The options named in ``mapping`` for ``backend``, every other
        field at its default: TypeError for a name the algorithm does not
        take or one of another backend, ValueError/TypeError for a bad value."""
        if mapping is not None and not isinstance(mapping, Mapping):
            raise TypeError(f"options of algorithm {cls.algorithm!r} are a mapping of option name to value, "
                            f"not {type(mapping).__name__} {mapping!r}")
        mapping = dict(mapping or {})
        fields = {f.name: f for f in dataclasses.fields(cls)}
        unknown = sorted(set(mapping) - set(fields))
        if unknown:
            takes = ", ".join(sorted(fields)) or "none"
            raise TypeError(f"algorithm {cls.algorithm!r} takes no option(s) {unknown}; its options are: {takes}")
        for name in mapping:
            backends = fields[name].metadata["backends"]
            if backend not in backends:
                raise TypeError(f"option {name!r} of algorithm {cls.algorithm!r} applies to backend "
                                f"{' and '.join(map(repr, backends))}, not {backend!r}")
        return cls(**mapping)

    def keywords(self, backend: str) -> dict:
        """The fields that apply to ``backend``, as constructor keywords."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)
                if backend in f.metadata["backends"]}

    def saved(self) -> dict:
        """The fields ``Index.save`` keeps: those marked saved whose value is
        not the default and survives JSON (strings valid Unicode)."""
        out = {}
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if f.metadata["saved"] and value != f.default and _json_safe(value):
                out[f.name] = value
        return out

    def same_structure(self, saved: dict, backend: str) -> bool:
        """Whether these options build the structure that options ``saved``
        (a saved index's) built: the structural fields of both backends
        shape it; the device-only ones (launch, memory) and those that only
        steer matching (A-PCM's variant, batch, clusters) do not."""
        for f in dataclasses.fields(self):
            if f.metadata["backends"] == BOTH and f.metadata["structural"]:
                value = getattr(self, f.name)
                before = saved.get(f.name, f.default)
                if value is not before and (not _json_safe(value) or value != before):
                    return False
        return True


def _json_safe(value) -> bool:
    try:
        json.dumps(value, allow_nan=False, ensure_ascii=False).encode("utf-8")
        return True
    except (TypeError, ValueError):
        return False


def check_device_memory(value) -> None:
    if value is not None and (not _is_int(value) or value <= 0):
        raise ValueError(f"device_memory must be a positive number of bytes, not {value!r}")


def check_launch(value) -> None:
    if value is not None:
        from gpu_kernels.cuda_support import LaunchConfig
        if not isinstance(value, LaunchConfig):
            raise TypeError(f"launch must be a gpu_kernels.cuda_support.LaunchConfig, not {type(value).__name__}")


@dataclass(frozen=True)
class ScanOptions(Options):
    """``scan``: no index, so only the cuda launch settings."""

    algorithm = "scan"
    launch: object = option(None, backends=CUDA, saved=False,
                            doc="a gpu_kernels.cuda_support.LaunchConfig (default: one fit for the device)")
    device_memory: int | None = option(None, backends=CUDA,
                                       doc="bytes of device memory one match call may use "
                                           "(default: a share of the free memory)")

    def __post_init__(self):
        check_launch(self.launch)
        check_device_memory(self.device_memory)


#: OpIndex's counting strategies on the device: atomic decrements, or sort-and-segment
COUNTINGS = ("atomic", "sort")
#: a partition's counters and clause bits go to shared memory when they fit
#: this many bytes (48 KiB per block without an opt-in, less the kernel's static 4 KiB)
SHARED_MEMORY = 40 << 10


@dataclass(frozen=True)
class OpIndexOptions(Options):
    """``opindex`` (OpIndex §4-§7): the paper's parameters and the device's."""

    algorithm = "opindex"
    variant: str = option("full", doc="'full' (segments and signatures) or 'bs' (OpIndex-BS: binary search only)")
    segments: int = option(32, doc="segments per operator list (§4.2; the paper's b), a power of two")
    signature_bits: int = option(64, doc="bits of a segment signature (§4.2; the paper's w), a power of two <= 64")
    operand_ranks: bool | None = option(None, doc="store operands as 16-bit ranks (default: when at most "
                                                   "32767 distinct operands)")
    event_log: object = option(None, saved=False,
                               doc="an EventBatch or per-attribute counts: pivots from event frequencies (§4.1)")
    launch: object = option(None, backends=CUDA, saved=False, doc="a gpu_kernels.cuda_support.LaunchConfig")
    threads: object = option(None, backends=CUDA,
                             doc="threads per block: a power of two in [2, 1024] or a (low, high) range")
    device_memory: int | None = option(None, backends=CUDA, doc="bytes of device memory one match call may use")
    shared_memory: int = option(SHARED_MEMORY, backends=CUDA,
                                doc="largest partition (bytes of counters) kept in shared memory")
    counting: str = option("atomic", backends=CUDA, doc="'atomic' or 'sort' (sort-and-segment)")

    def __post_init__(self):
        if self.variant not in ("full", "bs"):
            raise ValueError(f"variant must be 'full' or 'bs', not {self.variant!r}")
        if not _power_of_two(self.segments, 1, 1 << 30):
            raise ValueError(f"segments must be a power of two >= 1, not {self.segments!r}")
        if not _power_of_two(self.signature_bits, 1, 64):
            raise ValueError(f"signature_bits must be a power of two in [1, 64], not {self.signature_bits!r}")
        if self.operand_ranks not in (None, True, False):
            raise TypeError(f"operand_ranks must be None, True or False, not {self.operand_ranks!r}")
        log = self.event_log
        if log is not None and not hasattr(log, "attr"):
            counts = np.asarray(log)
            if counts.size == 0 and counts.ndim == 1:
                counts = counts.astype(np.int64)        # ([] is float64 to NumPy: no counts, as np.zeros(0, int))
            if counts.dtype.kind not in "iu" or counts.ndim != 1 or (counts < 0).any():
                raise ValueError("event_log must be an EventBatch or a 1-D array of non-negative "
                                 "per-attribute event counts")
        elif log is not None:
            _check_event_batch(log)
        check_launch(self.launch)
        threads = self.threads
        if threads is not None:
            low, high = (threads, threads) if _is_int(threads) else \
                (tuple(threads) if isinstance(threads, (tuple, list)) and len(threads) == 2 else (0, 0))
            if not (_power_of_two(low, 2, 1024) and _power_of_two(high, 2, 1024) and low <= high):
                raise ValueError(f"threads must be a power of two in [2, 1024] or a (low, high) range of them, "
                                 f"not {threads!r}")
        check_device_memory(self.device_memory)
        if not _is_int(self.shared_memory) or self.shared_memory < 0:
            raise ValueError(f"shared_memory must be a number of bytes >= 0, not {self.shared_memory!r}")
        if self.counting not in COUNTINGS:
            raise ValueError(f"counting must be one of {', '.join(map(repr, COUNTINGS))}, not {self.counting!r}")


#: BE-Tree's leaf capacity by the workload's matching probability (Table 4):
#: below 1 %, from 1 % to 10 %, from 10 %
MAX_CAP_BY_MATCH_PROBABILITY = ((0.01, 5), (0.10, 20), (float("inf"), 160))
#: the l-node capacity for the paper's standard workloads (1 % matching probability)
DEFAULT_MAX_CAP = 20
#: the paper's minimum partition size (§7: min_size = 3)
DEFAULT_MIN_SIZE = 3


def max_cap_for(match_probability: float) -> int:
    """Table 4's ``max_cap`` for a workload's matching probability (a fraction)."""
    if not 0 <= match_probability <= 1:
        raise ValueError(f"a matching probability is a fraction in [0, 1], not {match_probability!r}")
    for below, cap in MAX_CAP_BY_MATCH_PROBABILITY:
        if match_probability < below:
            return cap
    return MAX_CAP_BY_MATCH_PROBABILITY[-1][1]


@dataclass(frozen=True)
class BETreeOptions(Options):
    """``betree`` (BE-Tree §4-§7): the paper's parameters and the device's."""

    algorithm = "betree"
    max_cap: int = option(DEFAULT_MAX_CAP, doc="l-node capacity max_cap (§4.2); Table 4: 5 below 1 % matching "
                                               "probability, 20 up to 10 %, 160 beyond (max_cap_for)")
    min_size: int = option(DEFAULT_MIN_SIZE, doc="fewest units an attribute must constrain to partition on it "
                                                 "(§4.2, min_size)")
    theta: float | None = option(0.0, doc="l-node recycling threshold θ (§5): at a merge, a p-node whose rank "
                                          "(gain - loss measured on recently matched events) is below θ has its "
                                          "units re-inserted; None: no recycling")
    launch: object = option(None, backends=CUDA, saved=False, doc="a gpu_kernels.cuda_support.LaunchConfig")
    device_memory: int | None = option(None, backends=CUDA, doc="bytes of device memory one match call may use")

    def __post_init__(self):
        if not _is_int(self.max_cap) or self.max_cap < 1:
            raise ValueError(f"max_cap must be an integer >= 1, not {self.max_cap!r}")
        if not _is_int(self.min_size) or self.min_size < 1:
            raise ValueError(f"min_size must be an integer >= 1, not {self.min_size!r}")
        if self.theta is not None and (isinstance(self.theta, bool) or not isinstance(self.theta, (int, float))
                                       or self.theta != self.theta):
            raise ValueError(f"theta must be a number or None, not {self.theta!r}")
        check_launch(self.launch)
        check_device_memory(self.device_memory)


#: A-PCM's matching strategies: the paper's flagship and its ablations (§VII)
APCM_VARIANTS = ("apcm", "pcm", "parallel", "bitmap")

#: the indexes A-PCM compresses events over: BE-Tree (the paper's), OpIndex's lists (cpu)
APCM_INDEXES = ("betree", "opindex")


#: the most events one compressed cluster holds (larger l-nodes are cut):
#: the largest cluster size of the paper's Fig. 9(b).  The leaf scans keep
#: a bit per subscription per member (``gpu_kernels.apcm.cpu.scan_kernel``),
#: so a task's scratch is members x subscriptions / 8 bytes -- 16 MiB a task
#: at 128 members and 1 M subscriptions -- which is what bounds it.
MAX_MEMBERS = 128


@dataclass(frozen=True)
class APCMOptions(Options):
    """``apcm`` (A-PCM §IV-§VI over BE-Tree): the paper's parameters, its
    ablations, and the BE-Tree's."""

    algorithm = "apcm"
    variant: str = option("apcm", structural=False,
                          doc="'apcm': adaptive -- clusters of at least `threshold` similarity compressed, the "
                              "others per event; 'pcm': every cluster compressed (C-U-PP-RE, or C-U-PP without "
                              "reorder); 'parallel': per event on every core; 'bitmap': per event on one core")
    reorder: bool = option(True, structural=False, doc="online stream re-ordering (OSR, §VI); False: clusters are "
                                                       "consecutive runs of `cluster_size` events in arrival order")
    unroll: bool = option(True, structural=False,
                          doc="traversal unrolling (§V-B); False: the base algorithm C, leaves scanned during "
                              "the walk, members in parallel per leaf")
    parallel_paths: bool = option(True, structural=False,
                                  doc="parallel path traversal (§V-C): the walk of a compressed event split by "
                                      "the root's p-nodes over the cores")
    batch_size: int = option(1024, structural=False, doc="events buffered and re-ordered together (§VI)")
    cluster_size: int = option(8, structural=False, doc="initial event cluster size: the re-ordering tree's leaf "
                                                        "capacity (§VII-B), 1 to 128")
    threshold: int = option(2, structural=False, doc="similarity threshold: a cluster's p-nodes on its path needed "
                                                     "to match it compressed (§VI)")
    adaptive: bool = option(True, structural=False, doc="adapt the cluster size to the clusters found (§VII-B)")
    over: str = option("betree", backends=("cpu",), structural=False,
                       doc="the index traversed once per compressed event: 'betree' (the paper's) or 'opindex' "
                           "(OpIndex's pivot lists, counted over the compressed event's bits; `unroll` and "
                           "`parallel_paths` are BE-Tree's and do not apply)")
    max_cap: int = option(DEFAULT_MAX_CAP, doc="the subscription BE-Tree's l-node capacity (BE-Tree §4.2)")
    min_size: int = option(DEFAULT_MIN_SIZE, doc="the subscription BE-Tree's min_size (BE-Tree §4.2)")
    launch: object = option(None, backends=CUDA, saved=False, doc="a gpu_kernels.cuda_support.LaunchConfig")
    device_memory: int | None = option(None, backends=CUDA, doc="bytes of device memory one match call may use")

    def __post_init__(self):
        if self.variant not in APCM_VARIANTS:
            raise ValueError(f"variant must be one of {', '.join(APCM_VARIANTS)}, not {self.variant!r}")
        if self.over not in APCM_INDEXES:
            raise ValueError(f"over must be one of {', '.join(APCM_INDEXES)}, not {self.over!r}")
        for name in ("reorder", "unroll", "parallel_paths", "adaptive"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"{name} must be True or False, not {getattr(self, name)!r}")
        for name, low, high in (("batch_size", 1, 1 << 24), ("cluster_size", 1, MAX_MEMBERS), ("threshold", 0, 64),
                                ("max_cap", 1, 1 << 30), ("min_size", 1, 1 << 30)):
            value = getattr(self, name)
            if not _is_int(value) or not low <= value <= high:
                raise ValueError(f"{name} must be an integer in [{low}, {high}], not {value!r}")
        check_launch(self.launch)
        check_device_memory(self.device_memory)


def _check_lanes(lanes) -> None:
    """The cpu batch kernels' ``lanes``: 64 events a group (a word's bits) or 1, one at a time."""
    if not _is_int(lanes) or lanes not in (1, 64):
        raise ValueError(f"lanes must be 1 or 64, not {lanes!r}")


def _check_event_batch(log) -> None:
    """PS-Tree's event log: an EventBatch (its values locate the leaves
    whose event counters rank predicates, §3.3), or None."""
    if log is not None and not all(hasattr(log, name) for name in ("offsets", "attr", "value")):
        raise ValueError("event_log must be an EventBatch (engine.events.encode_events) or None")
    if log is not None:
        _check_csr(log)


def _check_csr(log) -> None:
    """An EventBatch given as an event log is read by kernels that trust its
    CSR form (an offset past its arrays read memory out of bounds): its
    arrays are checked as the encoder makes them -- offsets from 0, not
    decreasing, ending at the entries' count; attribute ids not negative."""
    offsets, attr, value = (np.asarray(getattr(log, name)) for name in ("offsets", "attr", "value"))
    shaped = offsets.ndim == attr.ndim == value.ndim == 1 and offsets.dtype.kind in "iu" and \
        attr.dtype.kind in "iu" and value.dtype.kind == "f" and len(offsets) >= 1 and len(attr) == len(value)
    if not shaped or offsets[0] != 0 or offsets[-1] != len(attr) or (np.diff(offsets) < 0).any() \
            or (len(attr) and attr.min() < 0):
        raise ValueError("event_log: not an EventBatch as engine.events.encode_events makes it (its offsets must "
                         "run from 0 to the number of entries without decreasing, its attribute ids be "
                         "non-negative)")


@dataclass(frozen=True)
class PSTBloomOptions(Options):
    """``pstbloom`` (PS-Tree §4-§5): the Bloom signatures and the ranking's event log."""

    algorithm = "pstbloom"
    bloom_bits: int = option(8, doc="bits of a predicate space's Bloom signature per unit inserted (§5.1; "
                                    "rounded up to a power of two of 64-bit words)")
    bloom_hashes: int = option(3, doc="hash probes per unit in a Bloom signature (§5.1)")
    event_log: object = option(None, saved=False,
                               doc="an EventBatch: access predicates ranked by the logged events they cover (§3.3)")
    lanes: int = option(64, backends=CPU, structural=False,
                        doc="cpu matching: events verified together (64: a batch's events 64 at a time, each "
                            "unit of a space's list read once for the events located in the space, "
                            "gpu_kernels.pstree.cpu.lanes_task, no signature probed); 1: one event at a time, "
                            "Algorithm 5 as the paper runs it")
    launch: object = option(None, backends=CUDA, saved=False, doc="a gpu_kernels.cuda_support.LaunchConfig")
    device_memory: int | None = option(None, backends=CUDA, doc="bytes of device memory one match call may use")

    def __post_init__(self):
        for name, low, high in (("bloom_bits", 1, 1024), ("bloom_hashes", 1, 16)):
            value = getattr(self, name)
            if not _is_int(value) or not low <= value <= high:
                raise ValueError(f"{name} must be an integer in [{low}, {high}], not {value!r}")
        _check_lanes(self.lanes)
        _check_event_batch(self.event_log)
        check_launch(self.launch)
        check_device_memory(self.device_memory)


@dataclass(frozen=True)
class PSTHashOptions(Options):
    """``psthash`` (PS-Tree §4, §6): access predicates per unit and the ranking's event log."""

    algorithm = "psthash"
    n_access: int = option(2, doc="access predicates per unit, the paper's N (§6; N-dim predicate spaces)")
    max_combinations: int = option(256, doc="most N-dim space keys one unit may make; past it the unit drops "
                                            "its least selective access predicate (a bound the paper lacks: "
                                            "W2 at 10,000 subscriptions takes 63 MiB with 4096, 14 with 256)")
    event_log: object = option(None, saved=False,
                               doc="an EventBatch: access predicates ranked by the logged events they cover (§3.3)")
    lanes: int = option(64, backends=CPU, structural=False,
                        doc="cpu matching: events verified together (64: a batch's events 64 at a time, each "
                            "candidate unit read once for the events that probed it, gpu_kernels.pstree.cpu."
                            "lanes_task); 1: one event at a time, Algorithm 7 as the paper runs it")
    launch: object = option(None, backends=CUDA, saved=False, doc="a gpu_kernels.cuda_support.LaunchConfig")
    device_memory: int | None = option(None, backends=CUDA, doc="bytes of device memory one match call may use")

    def __post_init__(self):
        for name, low, high in (("n_access", 1, 4), ("max_combinations", 1, 1 << 24)):
            value = getattr(self, name)
            if not _is_int(value) or not low <= value <= high:
                raise ValueError(f"{name} must be an integer in [{low}, {high}], not {value!r}")
        _check_lanes(self.lanes)
        _check_event_batch(self.event_log)
        check_launch(self.launch)
        check_device_memory(self.device_memory)


#: A-Tree's cuda kernel modes (gpu_kernels.atree.cuda.KERNELS)
ATREE_KERNELS = ("levels", "persistent")


@dataclass(frozen=True)
class ATreeOptions(Options):
    """``atree`` (A-Tree §4-§5): the paper's design options, as ablations
    (Figures 8 and 9)."""

    algorithm = "atree"
    sharing: bool = option(True, doc="one node per distinct predicate and subexpression (§4.2.1); False: the "
                                     "paper's multitree without sharing, every expression its own nodes")
    reorganize: bool = option(True, doc="expression reorganisation (§4.2.2, Algorithm 2): an AND/OR reuses "
                                        "existing nodes over subsets of its children (greedy set cover)")
    self_adjust: bool = option(True, doc="index self-adjustment (§4.2.3, Algorithm 3): a new AND/OR node becomes "
                                         "a child of the existing nodes whose children include all of its own")
    binary: bool = option(False, doc="the paper's 'binary tree index supporting sharing' (Figure 8): an AND/OR of "
                                     "more than two children becomes a chain of two-child nodes")
    zero_suppression: bool = option(True, doc="the zero suppression filter (§5.2.1): only TRUE propagates outside "
                                              "XOR/XNOR subtrees; False (the Figure 10 ablation): FALSE too")
    on_demand: bool = option(True, doc="propagation on demand (§5.2.2): an AND is reached from one access child "
                                       "and reads the others; False (the Figure 10 ablation): from every child")
    lanes: int = option(64, backends=CPU, structural=False,
                        doc="cpu matching: events evaluated together, one bit each in a node's word (64: a "
                            "batch's events 64 at a time, gpu_kernels.atree.sliced); 1: one event at a time, "
                            "Algorithm 6 as the paper runs it")
    kernel: str = option("levels", backends=CUDA, structural=False,
                         doc="cuda matching: 'levels' (one launch per level of the DAG) or 'persistent' (one "
                             "launch, a block per event walking the levels); not measured on a GPU yet")
    launch: object = option(None, backends=CUDA, saved=False, doc="a gpu_kernels.cuda_support.LaunchConfig")
    device_memory: int | None = option(None, backends=CUDA, doc="bytes of device memory one match call may use")

    def __post_init__(self):
        for name in ("sharing", "reorganize", "self_adjust", "binary", "zero_suppression", "on_demand"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"{name} must be True or False, not {getattr(self, name)!r}")
        _check_lanes(self.lanes)
        if self.kernel not in ATREE_KERNELS:
            raise ValueError(f"kernel must be one of {', '.join(map(repr, ATREE_KERNELS))}, not {self.kernel!r}")
        check_launch(self.launch)
        check_device_memory(self.device_memory)
