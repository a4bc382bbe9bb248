"""The attribute catalogue: type families, attribute ids, and the value
dictionaries that turn every operand and event value into a number.

* Each attribute has one :class:`~engine.expr.Family`, fixed by a declaration
  or by the first predicate that uses it (DESIGN.md §2).
* Strings become order-preserving codes.  The dictionary holds every string
  a predicate mentions, sorted by code point; a dictionary string of rank r
  gets code ``2r + 1`` and any other string gets ``2k`` where k is the number
  of dictionary strings below it -- so an event value no predicate mentions
  lands between its neighbours and ``<``, ``=``, ``BETWEEN`` stay exact on
  codes.  Codes move when the dictionary grows (``version`` says so), so
  compiled structures keep stable *string ids* and recode from them.
* IN lists and LIKE/MATCHES patterns get stable ids too, so a distinct
  predicate is identified by plain numbers: (attribute, operator, operand
  keys, set id, pattern id).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import re2

from engine.errors import SchemaError
from engine.expr import Family, Op, PATTERN_OPS, Pred, literal_family

StringArray = np.dtypes.StringDType()

#: integers beyond this magnitude are not exact in float64, the kernels' type
MAX_EXACT_INT = 2 ** 53

_FAMILY_NAMES = {"numeric": Family.NUMERIC, "string": Family.STRING, "boolean": Family.BOOLEAN,
                 "bool": Family.BOOLEAN, "number": Family.NUMERIC, "str": Family.STRING}


def parse_family(value) -> Family:
    if isinstance(value, Family):
        return value
    try:
        return _FAMILY_NAMES[str(value).lower()]
    except KeyError:
        raise SchemaError(f"unknown type family {value!r}; use 'numeric', 'string' or 'boolean'") from None


def check_number(value, where: str) -> float:
    """A numeric literal or event value as float64, refusing what float64
    cannot hold exactly (NaN, infinities, integers beyond 2**53)."""
    if isinstance(value, (int, np.integer)):
        if abs(int(value)) > MAX_EXACT_INT:
            raise SchemaError(f"{where}: integer {value} is beyond ±2**53 and cannot be compared exactly")
        return float(value)
    number = float(value)
    if number != number or number in (float("inf"), float("-inf")):
        raise SchemaError(f"{where}: {value!r} is not a finite number")
    return number


def like_to_regex(pattern: str) -> str:
    """SQL LIKE as an RE2 pattern for ``fullmatch``: ``%`` any run, ``_`` one
    character, no escape character, case-sensitive."""
    parts = [".*" if c == "%" else "." if c == "_" else re2.escape(c) for c in pattern]
    return "(?s)" + "".join(parts)


@dataclass
class Schema:
    """Attributes, their families and the value dictionaries of one index."""

    families: dict[str, Family | None] = field(default_factory=dict)
    attr_ids: dict[str, int] = field(default_factory=dict)
    attr_names: list[str] = field(default_factory=list)
    strings: list[str] = field(default_factory=list)
    string_ids: dict[str, int] = field(default_factory=dict)
    set_ids: dict[tuple, int] = field(default_factory=dict)   # the text route's IN lists, for sharing
    patterns: list[tuple[str, str]] = field(default_factory=list)   # (kind, text), kind in like/regex
    pattern_ids: dict[tuple[str, str], int] = field(default_factory=dict)
    version: int = 0
    _sorted: np.ndarray | None = field(default=None, repr=False)
    _rank: np.ndarray | None = field(default=None, repr=False)
    _compiled_patterns: list = field(default_factory=list, repr=False)
    # IN lists as CSR chunks (lengths, keys), consolidated on demand
    _set_chunks: list = field(default_factory=list, repr=False)
    _set_csr: tuple | None = field(default=None, repr=False)
    n_sets: int = 0
    # bumped whenever an attribute or its family is added (attribute_arrays' cache key)
    _attr_version: int = field(default=0, repr=False)
    _attr_arrays: tuple | None = field(default=None, repr=False)

    # ---------------------------------------------------------------- attributes
    def declare(self, attr: str, family) -> None:
        family = parse_family(family)
        known = self.families.get(attr)
        if known is not None and known != family:
            raise SchemaError(f"attribute {attr!r} is already {known.name.lower()}, cannot declare it {family.name.lower()}")
        self._add_attr(attr, family)
        self.families[attr] = family
        self._attr_version += 1

    def attribute_arrays(self) -> tuple:
        """(attribute names as a pyarrow string array, family of each as a
        NumPy array of ``Family`` members or None) in attribute-id order,
        cached until an attribute or a family is added: vectorised event
        encoding looks names up in bulk."""
        cached = self._attr_arrays
        if cached is None or cached[0] != self._attr_version:
            import pyarrow as pa
            families = np.empty(len(self.attr_names), dtype=object)
            families[:] = [self.families[name] for name in self.attr_names]
            cached = self._attr_arrays = (self._attr_version, pa.array(self.attr_names, pa.string()), families)
        return cached[1], cached[2]

    def _add_attr(self, attr: str, family: Family | None) -> int:
        # family None: only IS [NOT] NULL has used the attribute so far, which
        # tests presence and fixes no family.
        if attr not in self.attr_ids:
            self.attr_ids[attr] = len(self.attr_names)
            self.attr_names.append(attr)
            self.families[attr] = family
            self._attr_version += 1
        return self.attr_ids[attr]

    def check_predicates(self, preds, where: str = "expression") -> dict[str, Family]:
        """Check every literal against its attribute's family, without
        changing anything.  Returns the families the predicates would fix
        for attributes not seen before; raises :class:`SchemaError`."""
        fixed: dict[str, Family] = {}
        for pred in preds:
            family = self._pred_family(pred, where)
            if family is None:
                continue
            known = self.families.get(pred.attr)
            known = fixed.get(pred.attr) if known is None else known
            if known is None:
                fixed[pred.attr] = family
            elif known != family:
                raise SchemaError(f"{where}: {pred.attr!r} is {known.name.lower()}, but {pred.op.value} "
                                  f"compares it with a {family.name.lower()} literal {_show(pred.values)}")
        return fixed

    @staticmethod
    def _pred_family(pred: Pred, where: str) -> Family | None:
        if pred.op in PATTERN_OPS:
            if len(pred.values) != 1 or not isinstance(pred.values[0], str):
                raise SchemaError(f"{where}: {pred.op.value} on {pred.attr!r} needs one string pattern")
            return Family.STRING
        if pred.op in (Op.IS_NULL, Op.IS_NOT_NULL):
            return None
        if not pred.values:
            raise SchemaError(f"{where}: {pred.op.value} on {pred.attr!r} has no operand")
        families = {literal_family(v) for v in pred.values}
        if len(families) > 1:
            raise SchemaError(f"{where}: {pred.attr!r} {pred.op.value} mixes literal types {_show(pred.values)}")
        family = families.pop()
        if family is Family.NUMERIC:
            for v in pred.values:
                check_number(v, f"{where}: {pred.attr!r}")
        return family

    def register(self, preds) -> None:
        """Record attributes, strings, IN lists and patterns of already
        checked predicates.  Cannot fail on checked input."""
        for pred in preds:
            family = self._pred_family(pred, "expression")
            self._add_attr(pred.attr, family)
            if family is not None and self.families[pred.attr] is None:
                self.families[pred.attr] = family
                self._attr_version += 1
            if pred.op in PATTERN_OPS:
                kind = "like" if pred.op in (Op.LIKE, Op.NOT_LIKE) else "regex"
                self.pattern_id(kind, pred.values[0])
            elif family is Family.STRING:
                self.add_strings(pred.values)

    # ------------------------------------------------------------------- strings
    def add_strings(self, values) -> None:
        grew = False
        for value in values:
            if value not in self.string_ids:
                self.string_ids[value] = len(self.strings)
                self.strings.append(value)
                grew = True
        if grew:
            self.version += 1
            self._sorted = self._rank = None

    def string_id(self, value: str) -> int:
        return self.string_ids[value]

    def _dictionary(self):
        if self._sorted is None:
            all_strings = np.array(self.strings, dtype=StringArray)
            order = np.argsort(all_strings, kind="stable")
            self._sorted = all_strings[order]
            self._rank = np.empty(len(order), dtype=np.int64)
            self._rank[order] = np.arange(len(order))
        return self._sorted, self._rank

    def codes_of_string_ids(self, ids: np.ndarray) -> np.ndarray:
        """Codes of dictionary strings given their stable ids."""
        _, rank = self._dictionary()
        return (2 * rank[np.asarray(ids, dtype=np.int64)] + 1).astype(np.float64)

    def encode_strings(self, values) -> np.ndarray:
        """Codes of arbitrary strings (vectorised): dictionary strings get odd
        codes, others the even code between their neighbours."""
        sorted_strings, _ = self._dictionary()
        values = np.asarray(values, dtype=StringArray)
        pos = np.searchsorted(sorted_strings, values, side="left")
        found = pos < len(sorted_strings)
        found[found] = sorted_strings[pos[found]] == values[found]
        return (2 * pos + found).astype(np.float64)

    # -------------------------------------------------------------- sets, patterns
    def set_id(self, keys: tuple) -> int:
        """Stable id of one IN list given its canonical (sorted, unique)
        operand keys; equal lists added this way share an id."""
        found = self.set_ids.get(keys)
        if found is None:
            found = self.set_ids[keys] = self.add_sets(np.array([len(keys)]), np.asarray(keys, np.float64))[0]
        return int(found)

    def add_sets(self, lengths: np.ndarray, keys: np.ndarray) -> np.ndarray:
        """Register many canonical IN lists at once (CSR: ``lengths`` and
        the concatenated ``keys``); returns their new ids."""
        ids = np.arange(self.n_sets, self.n_sets + len(lengths), dtype=np.int64)
        self._set_chunks.append((np.asarray(lengths, np.int64), np.asarray(keys, np.float64)))
        self.n_sets += len(lengths)
        self._set_csr = None
        return ids

    def set_csr(self) -> tuple[np.ndarray, np.ndarray]:
        """(offsets, keys) of every IN list, in id order."""
        if self._set_csr is None:
            lengths = np.concatenate([c[0] for c in self._set_chunks]) if self._set_chunks else np.zeros(0, np.int64)
            keys = np.concatenate([c[1] for c in self._set_chunks]) if self._set_chunks else np.zeros(0)
            self._set_chunks = [(lengths, keys)] if len(lengths) else []
            self._set_csr = (np.concatenate(([0], np.cumsum(lengths))).astype(np.int64), keys)
        return self._set_csr

    def set_keys(self, set_id: int) -> np.ndarray:
        offsets, keys = self.set_csr()
        return keys[offsets[set_id]:offsets[set_id + 1]]

    def pattern_id(self, kind: str, text: str) -> int:
        key = (kind, text)
        found = self.pattern_ids.get(key)
        if found is None:
            found = self.pattern_ids[key] = len(self.patterns)
            self.patterns.append(key)
        return found

    def pattern_matcher(self, pattern_id: int):
        """``str -> bool`` for one pattern: LIKE by full match of its RE2
        translation, MATCHES by RE2 search (DESIGN.md §2)."""
        while len(self._compiled_patterns) < len(self.patterns):
            kind, text = self.patterns[len(self._compiled_patterns)]
            if kind == "like":
                self._compiled_patterns.append(re2.compile(like_to_regex(text)).fullmatch)
            else:
                self._compiled_patterns.append(re2.compile(text).search)
        matcher = self._compiled_patterns[pattern_id]
        return lambda value: matcher(value) is not None

    # --------------------------------------------------------------- persistence
    def to_json(self) -> dict:
        return {
            "attributes": [[name, None if self.families[name] is None else self.families[name].value]
                           for name in self.attr_names],
            "strings": self.strings,
            "patterns": [list(p) for p in self.patterns],
        }

    def restore_sets(self, offsets: np.ndarray, keys: np.ndarray) -> None:
        """Re-register saved IN lists under their ids (Index.load)."""
        if len(offsets) < 1 or offsets[0] != 0 or (np.diff(offsets) < 0).any() or offsets[-1] != len(keys):
            raise ValueError("IN-list offsets do not describe the IN-list keys")
        self.add_sets(np.diff(offsets), keys)
        for set_id in range(self.n_sets):
            self.set_ids.setdefault(tuple(self.set_keys(set_id).tolist()), set_id)

    @classmethod
    def from_json(cls, data: dict) -> "Schema":
        schema = cls()
        for name, family in data["attributes"]:
            schema._add_attr(name, None if family is None else parse_family(family))
        schema.add_strings(data["strings"])
        for kind, text in data["patterns"]:
            schema.pattern_id(kind, text)
        return schema


def _show(values) -> str:
    return ", ".join(repr(v) for v in values)
