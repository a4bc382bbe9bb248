"""The saved-index file format: what ``Index.save`` writes and ``Index.load``
reads, and the checks that make every malformed file an
:class:`~engine.errors.IndexFileError`.

A file is a zip archive of uncompressed members: ``meta.json`` (format
magic and version, algorithm, backend, settings, schema, and the SHA-256 of
every array) and one ``.npy`` per array of the main segment (its residual
flags when any), the IN lists, and -- version 2 -- the algorithm's built
structure (``matcher.<name>.npy``, what its matcher's ``to_arrays`` gave,
checked by its ``from_arrays``).  Version 1 files (no structure: it is
built at the first match) are read too.  Nothing in a file is trusted: a file that opens is checked member by
member, field by field and array by array -- types, ranges and the
cross-references between them -- before any of it reaches a kernel, so that
a crafted file with valid checksums fails at ``load`` rather than at the
first match (or by reading out of bounds).  Errors opening the path itself
(missing, a directory, no permission) stay the ``OSError`` that ``open``
raises; everything after that is an ``IndexFileError`` naming the path.

Saving writes a temp file beside the target and renames it over the target,
so a reader sees the old file or the new one, never a mix.  The temp file is
created the way ``open()`` creates a file (mode 0o666 less the umask), and
its name carries the host and pid of the saving process, so that a later
save can remove the orphans of a killed one without touching a live save's.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import os
import re
import secrets
import socket
import zipfile

import numpy as np

from engine.algorithms import registry
from engine.backend import BACKENDS
from engine.compile import LIST_SET_CODES, PATTERN_CODES, SET_CODES, PredicateTable, Segment, program_depths
from engine.errors import IndexFileError
from engine.expr import Family, pattern_error, shortened
from engine.files import replace_keeping_mode
from engine.schema import Schema, check_attribute_name
from gpu_kernels import opcodes

FILE_MAGIC = "bexmatch-index"
FILE_VERSION = 2
READS_VERSIONS = (1, 2)
#: every array of a file and its dtype (native byte order, one dimension)
ARRAY_DTYPES = {"sub_ids": np.int64, "prog_offsets": np.int64, "prog_kind": np.int8, "prog_arg": np.int32,
                "pred_attr": np.int32, "pred_op": np.int8, "pred_lo_key": np.float64, "pred_hi_key": np.float64,
                "pred_aux": np.int64, "set_offsets": np.int64, "set_keys": np.float64}
#: the optional arrays (written when there is something to write)
OPTIONAL_ARRAYS = {"residual": np.int8}
#: the prefix of the members holding the algorithm's structure
STRUCTURE_PREFIX = "matcher."
#: dtype kinds a structure array may have (bool, ints, floats), one or two dimensions
STRUCTURE_KINDS = "biuf"
META_FIELDS = {"magic", "version", "algorithm", "backend", "dnf_limit", "max_depth", "options", "schema", "sha256"}
#: fields of version 2 files, optional
OPTIONAL_META_FIELDS = {"strict", "matcher"}
SCHEMA_FIELDS = {"attributes", "strings", "patterns"}
PATTERN_KINDS = ("like", "regex")
INT64_MAX = 2 ** 63 - 1
COMPARISONS = (opcodes.EQ, opcodes.NE, opcodes.LT, opcodes.LE, opcodes.GT, opcodes.GE)
RANGES = (opcodes.BETWEEN, opcodes.NOT_BETWEEN)
NULL_TESTS = (opcodes.IS_NULL, opcodes.IS_NOT_NULL)
N_OPS = opcodes.N_OPS
#: the list operators (ONE OF ... IS NOT EMPTY): they test list attributes only
LIST_OPS = tuple(range(opcodes.FIRST_LIST_OP, opcodes.LAST_LIST_OP + 1))
N_INSTRUCTIONS = opcodes.XNOR + 1
TEMP_PREFIX, TEMP_SUFFIX = ".bexmatch-", ".tmp"
# .bexmatch-<host>-<pid>-<random hex>.tmp (a host name may hold '-' itself)
_TEMP_NAME = re.compile(r"\.bexmatch-(?P<host>.+)-(?P<pid>\d+)-[0-9a-f]+\.tmp")


# ------------------------------------------------------------------- writing
def write_index_file(path, meta: dict, arrays: dict[str, np.ndarray]) -> None:
    """Write ``meta`` (the fields of :data:`META_FIELDS` other than magic,
    version and checksums) and ``arrays`` (those of :data:`ARRAY_DTYPES`) to
    ``path`` atomically, first removing temp files that killed saves left in
    that directory."""
    meta = {"magic": FILE_MAGIC, "version": FILE_VERSION, **meta,
            "sha256": {name: _digest(array) for name, array in arrays.items()}}
    asked = path
    # a link (current.bexidx -> v3.bexidx) stays a link: the file it names is the one replaced
    path = os.path.realpath(path) if os.path.islink(path) else path
    directory = os.path.dirname(os.path.abspath(path))
    _remove_orphaned_temp_files(directory)
    tmp = os.path.join(directory, f"{TEMP_PREFIX}{_host()}-{os.getpid()}-{secrets.token_hex(8)}{TEMP_SUFFIX}")
    try:
        # os.open applies the umask to 0o666 as open() would; mkstemp's 0o600
        # would hide the file from the readers that share the directory
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
    except OSError as exc:
        raise _about(asked, exc) from exc
    try:
        with os.fdopen(fd, "wb") as f:
            with zipfile.ZipFile(f, "w") as archive:
                archive.writestr("meta.json", json.dumps(meta))
                for name, array in arrays.items():
                    buffer = io.BytesIO()
                    np.save(buffer, array, allow_pickle=False)
                    archive.writestr(f"{name}.npy", buffer.getvalue())
            f.flush()
            os.fsync(f.fileno())     # the rename must not publish a file whose data is still in flight
        replace_keeping_mode(tmp, path)
    except BaseException as exc:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        if isinstance(exc, OSError) and exc.errno is not None:
            raise _about(asked, exc) from exc
        raise


def _about(path, exc: OSError) -> OSError:
    """``exc`` naming ``path`` rather than the temp file, whose name means
    nothing to the caller (OSError picks the subclass of the errno)."""
    return OSError(exc.errno, exc.strerror, os.fspath(path))


def _remove_orphaned_temp_files(directory: str) -> None:
    """Remove the temp files of saves on this host whose process is gone
    (killed mid-save).  A live process's temp file -- a concurrent save,
    here or in another process -- is left alone, and so is another host's,
    whose processes cannot be checked from here."""
    try:
        names = os.listdir(directory)
    except OSError:
        return                      # the save itself reports an unusable directory
    for name in names:
        found = _TEMP_NAME.fullmatch(name)
        if found and found["host"] == _host() and not _alive(int(found["pid"])):
            with contextlib.suppress(FileNotFoundError):   # another save removed it first
                os.unlink(os.path.join(directory, name))


def _host() -> str:
    return socket.gethostname().replace(os.sep, "_")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:          # another user's process
        return True
    except OverflowError:            # not a pid at all
        return False
    return True


def _digest(array: np.ndarray) -> str:
    return hashlib.sha256(np.ascontiguousarray(array).tobytes()).hexdigest()


# ------------------------------------------------------------------- reading
def is_index_file(path) -> bool:
    """Whether ``path`` is a file that starts as a saved index does (a zip
    archive's local header) -- a truncated or corrupt one too, which
    :func:`read_index_file` then reports: for callers choosing how to read
    a path that may also hold text or Parquet."""
    if not os.path.isfile(path):
        return False
    with open(path, "rb") as f:
        return f.read(4) == b"PK\x03\x04"


def read_index_file(path) -> tuple[dict, dict[str, np.ndarray]]:
    """``(meta, arrays)`` of the file at ``path``: meta.json with every field
    checked for type and range, and the arrays checked against their
    checksums, dtypes and each other's lengths.  :func:`restore_contents`
    checks what the arrays refer to."""
    try:
        f = open(path, "rb")
    except IsADirectoryError:
        raise IndexFileError(f"{path}: is a directory, not a saved bexmatch index file") from None
    with f, _file_errors(path):
        with zipfile.ZipFile(f) as archive:
            members = {info.filename: info for info in archive.infolist()}
            if "meta.json" not in members:
                raise ValueError("no meta.json: not a bexmatch index file")
            meta = _parse_meta(_member(archive, members, "meta.json"))
            names = set(meta["sha256"])
            expected = {"meta.json"} | {f"{name}.npy" for name in names}
            if set(members) != expected or len(members) != len(archive.infolist()):
                raise ValueError(f"members {sorted(members)} are not those of an index file")
            arrays = {name: _parse_array(name, _member(archive, members, f"{name}.npy")) for name in names}
        for name, array in arrays.items():
            if _digest(array) != meta["sha256"][name]:
                raise ValueError(f"array {name!r} is corrupt (checksum mismatch)")
        _check_lengths(arrays)
    return meta, arrays


@contextlib.contextmanager
def _file_errors(path):
    """Turn whatever goes wrong while reading ``path`` into an
    IndexFileError naming it: a corrupt file can make zipfile, json, numpy
    or the checks here raise almost anything."""
    try:
        yield
    except IndexFileError:
        raise
    except Exception as exc:
        raise IndexFileError(f"{path}: not a valid bexmatch index file ({type(exc).__name__}: {exc})") from exc


def _member(archive: zipfile.ZipFile, members: dict, name: str) -> bytes:
    info = members[name]
    # save stores members uncompressed: a member's size is then bounded by
    # the file's, and a crafted one cannot inflate without limit
    if info.compress_type != zipfile.ZIP_STORED or info.flag_bits & 0x1:
        raise ValueError(f"member {name} is compressed or encrypted, which save never writes")
    return archive.read(info)


def _parse_meta(raw: bytes) -> dict:
    def no_constant(name):
        raise ValueError(f"meta.json holds {name}, which is not JSON")

    meta = json.loads(raw.decode("utf-8"), parse_constant=no_constant)
    if not isinstance(meta, dict) or meta.get("magic") != FILE_MAGIC:
        raise ValueError("not a bexmatch index file")
    if not _is_int(meta.get("version")) or meta["version"] not in READS_VERSIONS:
        raise ValueError(f"index format version {meta.get('version')!r} is not supported "
                         f"(this bexmatch reads versions {', '.join(map(str, READS_VERSIONS))})")
    optional = OPTIONAL_META_FIELDS if meta["version"] >= 2 else set()
    if not META_FIELDS <= set(meta) <= META_FIELDS | optional:
        raise ValueError(f"meta.json has fields {sorted(meta)}, not {sorted(META_FIELDS)} "
                         f"(and optionally {sorted(optional)})")
    _check_text(meta)
    if meta["algorithm"] not in registry.names():
        raise ValueError(f"unknown algorithm {meta['algorithm']!r}")
    if not isinstance(meta.get("strict", False), bool):
        raise ValueError(f"strict {meta['strict']!r} is not true or false")
    structure = meta.get("matcher")
    if structure is not None and not (isinstance(structure, dict) and set(structure) == {"algorithm", "meta"}
                                      and structure["algorithm"] == meta["algorithm"]
                                      and isinstance(structure["meta"], dict)):
        raise ValueError("the saved structure is not {algorithm, meta} of the file's algorithm")
    if meta["backend"] not in BACKENDS:
        raise ValueError(f"unknown backend {meta['backend']!r}")
    for name, least in (("dnf_limit", 1), ("max_depth", 0)):
        if not _is_int(meta[name]) or not least <= meta[name] <= INT64_MAX:
            raise ValueError(f"{name} {meta[name]!r} is not a valid setting")
    options = meta["options"]
    if not isinstance(options, dict):
        raise ValueError(f"options {options!r} are not a dict of algorithm parameters")
    digests = meta["sha256"]
    allowed = set(OPTIONAL_ARRAYS) if meta["version"] >= 2 else set()
    if not isinstance(digests, dict) or not set(ARRAY_DTYPES) <= set(digests) \
            or not all(isinstance(d, str) and re.fullmatch(r"[0-9a-f]{64}", d) for d in digests.values()):
        raise ValueError("the checksums do not name every array")
    for name in set(digests) - set(ARRAY_DTYPES):
        if name not in allowed and not (structure is not None and name.startswith(STRUCTURE_PREFIX)
                                        and re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]{0,63}", name[len(STRUCTURE_PREFIX):])):
            raise ValueError(f"array {name!r} is not one an index file holds")
    _check_schema(meta["schema"])
    return meta


def _check_text(value) -> None:
    """Every string in a JSON value is valid Unicode (JSON escapes can spell
    lone surrogates, which no event string can equal)."""
    if isinstance(value, str):
        value.encode("utf-8")
    elif isinstance(value, dict):
        for key, item in value.items():
            _check_text(key)
            _check_text(item)
    elif isinstance(value, list):
        for item in value:
            _check_text(item)


def _check_schema(schema) -> None:
    if not isinstance(schema, dict) or set(schema) != SCHEMA_FIELDS \
            or not all(isinstance(schema[name], list) for name in SCHEMA_FIELDS):
        raise ValueError("the schema is not {attributes, strings, patterns} lists")
    families = {family.value for family in Family}
    for entry in schema["attributes"]:
        if not (isinstance(entry, list) and len(entry) == 2 and isinstance(entry[0], str)
                and (entry[1] is None or entry[1] in families)):
            raise ValueError(f"schema attribute {entry!r} is not [name, family]")
    for name, _ in schema["attributes"]:
        check_attribute_name(name, "schema")        # a name no expression could use would not read back
    # ids are positions: a repeated name, string or pattern would shift them
    _check_unique([name for name, _ in schema["attributes"]], "attribute")
    if not all(isinstance(s, str) for s in schema["strings"]):
        raise ValueError("a dictionary string is not a string")
    _check_unique(schema["strings"], "dictionary string")
    for entry in schema["patterns"]:
        if not (isinstance(entry, list) and len(entry) == 2 and entry[0] in PATTERN_KINDS
                and isinstance(entry[1], str)):
            raise ValueError(f"schema pattern {entry!r} is not [like|regex, text]")
        reason = pattern_error(entry[0], entry[1])
        if reason is not None:
            raise ValueError(f"schema pattern [{entry[0]!r}, {shortened(repr(entry[1]))}] does not compile: {reason}")
    _check_unique([tuple(p) for p in schema["patterns"]], "pattern")


def _check_unique(values: list, what: str) -> None:
    if len(set(values)) != len(values):
        raise ValueError(f"a {what} appears twice in the schema")


def _is_int(value) -> bool:
    return type(value) is int      # JSON true/false are ints to isinstance


def _parse_array(name: str, raw: bytes) -> np.ndarray:
    """One .npy member, its header checked before any allocation (a crafted
    shape must not make numpy reserve terabytes)."""
    f = io.BytesIO(raw)
    version = np.lib.format.read_magic(f)
    reader = {(1, 0): np.lib.format.read_array_header_1_0, (2, 0): np.lib.format.read_array_header_2_0}[version]
    shape, fortran_order, dtype = reader(f)
    if name.startswith(STRUCTURE_PREFIX):
        if dtype.kind not in STRUCTURE_KINDS or not dtype.isnative or dtype.hasobject or len(shape) not in (1, 2) \
                or fortran_order:
            raise ValueError(f"array {name!r} is {dtype} of shape {shape}, not a 1-d or 2-d array of numbers")
    else:
        want = np.dtype(ARRAY_DTYPES.get(name) or OPTIONAL_ARRAYS[name])
        if dtype != want or len(shape) != 1 or fortran_order:
            raise ValueError(f"array {name!r} is {dtype} of shape {shape}, not a 1-d {want}")
    count = int(np.prod(shape, dtype=np.int64)) if len(shape) else 1
    if count * dtype.itemsize != len(raw) - f.tell():
        raise ValueError(f"array {name!r} holds {len(raw) - f.tell()} bytes, not the {count} items it declares")
    return np.frombuffer(raw, dtype=dtype, count=count, offset=f.tell()).reshape(shape).copy()


def _check_lengths(arrays: dict[str, np.ndarray]) -> None:
    groups = ((len(arrays["sub_ids"]) + 1, "prog_offsets"), (len(arrays["prog_kind"]), "prog_arg"),
              (len(arrays["pred_attr"]), "pred_op", "pred_lo_key", "pred_hi_key", "pred_aux"))
    for length, *names in groups:
        if any(len(arrays[name]) != length for name in names):
            raise ValueError(f"arrays {', '.join(names)} do not have {length} items each")
    if "residual" in arrays and (len(arrays["residual"]) != len(arrays["sub_ids"])
                                 or not np.isin(arrays["residual"], (0, 1)).all()):
        raise ValueError("the residual flags are not one 0/1 per subscription")


# ----------------------------------------------------------------- restoring
def restore_contents(path, meta: dict, arrays: dict[str, np.ndarray]) -> tuple[Schema, Segment]:
    """The schema and main segment of a file :func:`read_index_file` read,
    with every cross-reference checked: programs, predicates, attributes,
    dictionary strings, patterns and IN lists."""
    with _file_errors(path):
        schema = Schema.from_json(meta["schema"])
        schema.restore_sets(arrays["set_offsets"], arrays["set_keys"])     # checks the offsets
        if not np.isfinite(arrays["set_keys"]).all():
            raise ValueError("an IN list holds a key that is not a finite number")
        table = PredicateTable(arrays["pred_attr"], arrays["pred_op"], arrays["pred_lo_key"],
                               arrays["pred_hi_key"], arrays["pred_aux"])
        depth = _check_programs(arrays, len(table), meta["max_depth"])
        residual = arrays.get("residual")
        segment = Segment(arrays["sub_ids"], arrays["prog_offsets"], arrays["prog_kind"], arrays["prog_arg"],
                          table, depth, None if residual is None or not residual.any() else residual.astype(bool))
        _check_predicates(table, schema)
        table.recode(schema)
    return schema, segment


def needed_depth(segment: Segment) -> int:
    """The deepest operand stack the segment's programs need: what a file
    records as ``max_depth``."""
    depths = program_depths(segment.prog_offsets, segment.prog_kind, segment.prog_arg)
    return int(depths.max()) if len(depths) else 0


def _check_programs(arrays: dict[str, np.ndarray], n_preds: int, recorded_depth: int) -> int:
    """Check the postfix programs and the stack depth recorded for them;
    returns that depth."""
    offsets, kind, arg = arrays["prog_offsets"], arrays["prog_kind"], arrays["prog_arg"]
    if offsets[0] != 0 or offsets[-1] != len(kind) or (np.diff(offsets) <= 0).any():
        raise ValueError("program offsets do not describe the programs")
    if ((kind < 0) | (kind >= N_INSTRUCTIONS)).any():
        raise ValueError("unknown program instruction")
    leaves = kind == opcodes.LEAF
    if ((arg[leaves] < 0) | (arg[leaves] >= n_preds)).any():
        raise ValueError("a program refers to a predicate that does not exist")
    if (arg[(kind == opcodes.XOR) | (kind == opcodes.XNOR)] != 2).any():
        raise ValueError("an XOR/XNOR instruction does not take two operands")
    depths = program_depths(offsets, kind, arg)
    if (depths < 0).any():
        raise ValueError(f"program of subscription {int(arrays['sub_ids'][np.argmin(depths)])} is malformed")
    if (arrays["sub_ids"][1:] <= arrays["sub_ids"][:-1]).any():     # (np.diff overflows at int64's ends)
        raise ValueError("subscription ids are not unique and sorted")
    depth = int(depths.max()) if len(depths) else 0
    # the depth sizes every kernel's operand stack, so the one the programs
    # need is used, whatever was recorded (files before 2026-11-26 could
    # record more after removals; a crafted one, far more); a recorded depth
    # below it is a file that does not describe its programs
    if recorded_depth < depth:
        raise ValueError(f"max_depth {recorded_depth} is less than the {depth} the programs need")
    return depth


def _check_predicates(table: PredicateTable, schema: Schema) -> None:
    """Every predicate's operator, attribute and operands fit each other."""
    attr, op, lo, hi, aux = table.key_columns()
    if ((op < 0) | (op >= N_OPS)).any():
        raise ValueError("a predicate has an unknown operator")
    if ((attr < 0) | (attr >= len(schema.attr_names))).any():
        raise ValueError("a predicate refers to an unknown attribute")
    families = [schema.families[name] for name in schema.attr_names]
    # (the trailing entry keeps an empty attribute list indexable by an empty attr)
    string = np.array([f is Family.STRING for f in families] + [False])[attr]
    no_family = np.array([f is None for f in families] + [False])[attr]
    listed = np.array([f in (Family.NUMERIC_LIST, Family.STRING_LIST) for f in families] + [False])[attr]
    # a list operator's operand list is an IN list too (its keys: the elements' codes)
    string_keys = string | np.array([f is Family.STRING_LIST for f in families] + [False])[attr]
    is_pattern, is_set = np.isin(op, PATTERN_CODES), np.isin(op, SET_CODES + LIST_SET_CODES)
    is_range, compares = np.isin(op, RANGES), np.isin(op, COMPARISONS + RANGES)
    if ((aux[is_pattern] < 0) | (aux[is_pattern] >= len(schema.patterns))).any() \
            or ((aux[is_set] < 0) | (aux[is_set] >= schema.n_sets)).any() \
            or (aux[~is_pattern & ~is_set] != -1).any():
        raise ValueError("a predicate refers to an unknown pattern or IN list")
    like = np.array([kind == "like" for kind, _ in schema.patterns] + [False])
    if (like[aux[is_pattern]] != np.isin(op[is_pattern], (opcodes.LIKE, opcodes.NOT_LIKE))).any():
        raise ValueError("a LIKE predicate refers to a MATCHES pattern, or the other way round")
    # only IS [NOT] NULL may test an attribute of no family yet; patterns test strings
    # list operators test list attributes, and list attributes take only them and the NULL tests
    if (no_family & ~np.isin(op, NULL_TESTS)).any() or (is_pattern & ~string).any() \
            or (np.isin(op, LIST_OPS) != (listed & ~np.isin(op, NULL_TESTS))).any():
        raise ValueError("a predicate does not fit its attribute's type family")
    operands = np.concatenate((lo[compares], hi[is_range]))
    string_operands = np.concatenate((lo[compares & string], hi[is_range & string]))
    if not np.isfinite(operands).all() or not _string_ids(string_operands, schema).all():
        raise ValueError("a predicate's operand is not a finite number or a dictionary string")
    set_offsets, set_keys = schema.set_csr()
    list_of_key = np.repeat(np.arange(len(set_offsets) - 1), np.diff(set_offsets))
    _check_in_lists(set_offsets, set_keys, list_of_key, aux[is_set])
    # a boolean's operands are 0 and 1, its IN lists' keys too
    boolean = np.array([f is Family.BOOLEAN for f in families] + [False])[attr]
    booleans = np.concatenate((lo[compares & boolean], hi[is_range & boolean]))
    in_boolean = np.isin(list_of_key, aux[is_set & boolean])
    if not np.isin(booleans, (0.0, 1.0)).all() or not np.isin(set_keys[in_boolean], (0.0, 1.0)).all():
        raise ValueError("a predicate of a boolean attribute has an operand that is not TRUE or FALSE")
    # IN lists of string attributes hold string ids: count the other keys per list
    others = np.concatenate(([0], np.cumsum(~_string_ids(set_keys, schema))))
    if (others[set_offsets[1:]] - others[set_offsets[:-1]])[aux[is_set & string_keys]].any():
        raise ValueError("an IN list of a string attribute holds a key that is not a dictionary string")


def _check_in_lists(offsets: np.ndarray, keys: np.ndarray, list_of_key: np.ndarray, used: np.ndarray) -> None:
    """The IN lists ``used`` (ids) are as the schema registers them:
    canonical, their keys ascending and distinct, at least one.  (A
    repeated key would count twice where a kernel counts the list's hits.)"""
    lengths = np.diff(offsets)
    if (lengths[used] == 0).any():
        raise ValueError("an IN list holds no value")
    in_used = np.isin(list_of_key, used)
    follows = np.ones(len(keys), bool)
    follows[offsets[:-1][lengths > 0]] = False      # a list's first key follows none of its own
    # (compared, not subtracted: np.diff of -1.8e308 and 1.8e308 overflows, and its warning failed the load)
    if (keys[1:] <= keys[:-1])[(follows & in_used)[1:]].any():
        raise ValueError("an IN list's keys are not ascending and distinct")


def _string_ids(keys: np.ndarray, schema: Schema) -> np.ndarray:
    """Per key, whether it is the id of a dictionary string."""
    return (keys >= 0) & (keys < len(schema.strings)) & (keys == np.floor(keys))


def check_saved_options(path, algorithm, saved_backend: str, backend: str, options: dict) -> dict:
    """The saved algorithm options to load with: they must be options of
    ``algorithm`` (a registry entry) for the backend they were saved on,
    with values it accepts -- checked now, so that a bad one fails here
    rather than at the first match.  Options of another backend than the
    one loading (a cuda index's device settings, loaded on cpu) are left
    out."""
    with _file_errors(path):
        algorithm.make_options(options, saved_backend)
        fields = algorithm.options.__dataclass_fields__
        return {name: value for name, value in options.items() if backend in fields[name].metadata["backends"]}
