"""The attribute catalogue: type families, attribute ids, and the value
dictionaries that turn every operand and event value into a number.

* Each attribute has one :class:`~engine.expr.Family`, fixed by a declaration
  or by the first predicate that uses it (docs/language.md#types-and-type-families).
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
* String order is Python's ``str`` order (code points), computed by
  ``sorted``/``bisect`` on Python strings: exact for every Unicode string,
  NUL included.  NumPy's ``StringDType`` is *not* used: its ``searchsorted``
  is wrong for strings of 16 bytes or more and for embedded NULs in the
  NumPy this project installs (numpy issue 31533; pinned by
  tests/test_encoding.py).
* The schema only grows (append-only lists, a family fixed once), so a
  match can read it through a :class:`SchemaView` -- the schema as it was
  when the view was taken -- while an update appends to it
  (engine.index's snapshots).  An update that fails rolls the schema back
  to its :meth:`Schema.mark` (only what no view can see is removed).
"""

from __future__ import annotations

import bisect
import functools
import threading
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import re2

from engine.errors import SchemaError
from engine.expr import (ELEMENT_OF, LIST_OF, LIST_OPS, PATTERN_OPS, QUIET_RE2, Family, Op, Pred, like_to_regex,
                         literal_family, lone_surrogate)

def check_attribute_name(name, where: str) -> None:
    """A SchemaError unless ``name`` is a name an expression can use: a
    non-empty str that is valid Unicode (no lone surrogate)."""
    if not isinstance(name, str) or not name:
        raise SchemaError(f"{where}: an attribute name is a non-empty str, not {name!r}")
    at = lone_surrogate(name)
    if at is not None:
        raise SchemaError(f"{where}: attribute name {name!r} is not valid Unicode: lone surrogate at index {at}")


#: integers beyond this magnitude are not exact in float64, the kernels' type
MAX_EXACT_INT = 2 ** 53

_FAMILY_NAMES = {"numeric": Family.NUMERIC, "string": Family.STRING, "boolean": Family.BOOLEAN,
                 "bool": Family.BOOLEAN, "number": Family.NUMERIC, "str": Family.STRING,
                 "list<numeric>": Family.NUMERIC_LIST, "list<number>": Family.NUMERIC_LIST,
                 "list<string>": Family.STRING_LIST, "list<str>": Family.STRING_LIST}


def parse_family(value) -> Family:
    if isinstance(value, Family):
        return value
    try:
        return _FAMILY_NAMES[str(value).lower()]
    except KeyError:
        raise SchemaError(f"unknown type family {value!r}; use 'numeric', 'string', 'boolean', "
                          f"'list<numeric>' or 'list<string>'") from None


def is_integer(value) -> bool:
    """An int or NumPy integer -- not a ``numpy.timedelta64``, which NumPy
    makes an integer subclass: a duration is not a number here, as an
    Arrow duration column is not."""
    return isinstance(value, (int, np.integer)) and not isinstance(value, np.timedelta64)


def check_number(value, where: str) -> float:
    """A numeric literal or event value as float64, refusing what float64
    cannot hold exactly (NaN, infinities, integers beyond 2**53)."""
    if is_integer(value):
        if abs(int(value)) > MAX_EXACT_INT:
            raise SchemaError(f"{where}: integer {value} is beyond ±2**53 and cannot be compared exactly")
        return float(value)
    number = float(value)
    if number != number or number in (float("inf"), float("-inf")):
        raise SchemaError(f"{where}: {value!r} is not a finite number")
    return number


def _op_words(pred: Pred) -> str:
    """A predicate's operator as the user wrote it: CONTAINS is the AST's
    name for ``value IN attr`` (and the columnar form's), which the text
    language spells with IN."""
    if pred.op is Op.CONTAINS or pred.op is Op.NOT_CONTAINS:
        return f"'value {'IN' if pred.op is Op.CONTAINS else 'NOT IN'} {pred.attr}'"
    return pred.op.value


def _family_error(where: str, pred: Pred, known: Family, family: Family) -> SchemaError:
    if known in ELEMENT_OF and pred.op not in LIST_OPS:
        return SchemaError(f"{where}: {pred.attr!r} is a list attribute ({known.value}): {pred.op.value} does not "
                           f"apply to it (use ONE OF, NONE OF, ALL OF, 'value IN {pred.attr}' or IS [NOT] EMPTY)")
    if family in ELEMENT_OF and known not in ELEMENT_OF:
        return SchemaError(f"{where}: {pred.attr!r} is {known.value}, not a list: {_op_words(pred)} applies to list "
                           f"attributes only")
    # CONTAINS is the AST's name for 'value IN attr': the text's words, since that is what the user wrote
    op = {Op.CONTAINS: "IN", Op.NOT_CONTAINS: "NOT IN"}.get(pred.op, pred.op.value)
    return SchemaError(f"{where}: {pred.attr!r} is {known.value}, but {op} "
                       f"compares it with a {ELEMENT_OF.get(family, family).value} literal {_show(pred.values)}")


class StringDictionary:
    """The sorted dictionary of the first ``n`` strings of a schema: the
    strings in code-point order and the rank of each string id.  Immutable
    once built.  Built from a smaller one (``base``), the new strings are
    sorted alone and merged in: each found by binary search, the base's
    lists spliced around them, the base ranks shifted by the new strings
    below them -- one add with a new string into a dictionary of a million
    costs a few copies of it, not a million comparisons and Python steps."""

    __slots__ = ("n", "order", "sorted_strings", "rank")

    def __init__(self, strings: list, n: int, base: "StringDictionary | None" = None):
        self.n = n
        if base is None or base.n > n or base.n == 0:
            order = sorted(range(n), key=strings.__getitem__)
            self.order, self.sorted_strings = order, [strings[i] for i in order]
            self.rank = np.empty(n, dtype=np.int64)
            self.rank[np.asarray(order, dtype=np.int64)] = np.arange(n, dtype=np.int64)
            return
        added = sorted(range(base.n, n), key=strings.__getitem__)
        found = base.sorted_strings
        at = [bisect.bisect_left(found, strings[i]) for i in added]     # (distinct strings: never found)
        order, sorted_strings, start = [], [], 0
        for i, place in zip(added, at):
            order += base.order[start:place]
            order.append(i)
            sorted_strings += found[start:place]
            sorted_strings.append(strings[i])
            start = place
        self.order = order + base.order[start:]
        self.sorted_strings = sorted_strings + found[start:]
        places = np.asarray(at, dtype=np.int64)
        self.rank = np.empty(n, dtype=np.int64)
        self.rank[:base.n] = base.rank + np.searchsorted(places, base.rank, side="right")
        self.rank[np.asarray(added, dtype=np.int64)] = places + np.arange(len(added), dtype=np.int64)

    def codes_of_string_ids(self, ids) -> np.ndarray:
        return (2 * self.rank[np.asarray(ids, dtype=np.int64)] + 1).astype(np.float64)

    def encode(self, values) -> np.ndarray:
        """Codes of arbitrary strings: ``2r + 1`` for the dictionary string
        of rank r, ``2k`` for any other string, k = dictionary strings
        below it.  ``values``: a sequence of str or a pyarrow string array;
        each distinct value is searched once."""
        if isinstance(values, (pa.Array, pa.ChunkedArray)):
            encoded = pc.dictionary_encode(values)
            if isinstance(encoded, pa.ChunkedArray):
                encoded = encoded.combine_chunks()
            distinct = encoded.dictionary.to_pylist()
            codes = self._codes(distinct)
            return codes[encoded.indices.to_numpy(zero_copy_only=False)] if len(values) else codes[:0]
        values = list(values)
        distinct = dict.fromkeys(values)
        codes = self._codes(distinct)
        at = dict(zip(distinct, range(len(distinct))))
        return codes[np.fromiter((at[v] for v in values), np.int64, len(values))]

    def _codes(self, distinct) -> np.ndarray:
        found = self.sorted_strings
        n = len(found)
        out = np.empty(len(distinct), dtype=np.float64)
        for i, value in enumerate(distinct):
            if not isinstance(value, str):
                raise TypeError(f"not a string: {value!r}")
            k = bisect.bisect_left(found, value)
            out[i] = 2 * k + 1 if k < n and found[k] == value else 2 * k
        return out


def _check_emptiness_test(where: str, pred: Pred, known: Family | None) -> None:
    """IS [NOT] EMPTY on an attribute of family ``known`` (None: untyped)."""
    if known is None:
        raise SchemaError(f"{where}: {pred.op.value} needs {pred.attr!r} to be a list attribute: declare "
                          f"it (schema={{{pred.attr!r}: 'list<string>'}} or 'list<numeric>') or test it "
                          f"with ONE OF, NONE OF, ALL OF or IN first")
    if known not in ELEMENT_OF:
        raise SchemaError(f"{where}: {pred.attr!r} is {known.value}, not a list: {_op_words(pred)} "
                          f"applies to list attributes only")


@dataclass
class Schema:
    """Attributes, their families and the value dictionaries of one index.

    Everything here only grows (between a :meth:`mark` and a
    :meth:`rollback`, what was added is taken back); :meth:`view` freezes
    what a match reads."""

    families: dict[str, Family | None] = field(default_factory=dict)
    attr_ids: dict[str, int] = field(default_factory=dict)
    attr_names: list[str] = field(default_factory=list)
    strings: list[str] = field(default_factory=list)
    string_ids: dict[str, int] = field(default_factory=dict)
    set_ids: dict[tuple, int] = field(default_factory=dict)   # IN lists by their keys, for sharing
    # set ids below this are all in set_ids (the rest are indexed when a lookup needs them)
    _sets_indexed: int = field(default=0, repr=False)
    patterns: list[tuple[str, str]] = field(default_factory=list)   # (kind, text), kind in like/regex
    pattern_ids: dict[tuple[str, str], int] = field(default_factory=dict)
    #: bumped whenever strings are added or taken back: string codes move with it
    version: int = 0
    # IN lists as CSR chunks (lengths, keys); consolidations cached by count
    _set_chunks: list = field(default_factory=list, repr=False)
    _set_csr: tuple | None = field(default=None, repr=False)
    _set_generation: int = field(default=0, repr=False)     # bumped when a rollback takes IN lists back
    n_sets: int = 0
    # bumped whenever an attribute or its family is added (attribute_arrays' cache key)
    _attr_version: int = field(default=0, repr=False)
    _attr_arrays: tuple | None = field(default=None, repr=False)
    # attribute -> the _attr_version at which its family was fixed after the
    # attribute existed (IS NULL first, a comparison later), for views taken before
    _fixed_at: dict = field(default_factory=dict, repr=False)
    _fix_log: list = field(default_factory=list, repr=False)
    # sorted dictionaries by version (a few recent ones), compiled patterns by (kind, text)
    _dictionaries: dict = field(default_factory=dict, repr=False)
    _compiled_patterns: dict = field(default_factory=dict, repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def __deepcopy__(self, memo):
        # the caches and the lock are not state: a copy starts without them
        import copy
        clone = Schema()
        for name in ("families", "attr_ids", "attr_names", "strings", "string_ids", "set_ids", "patterns",
                     "pattern_ids", "_set_chunks", "_fixed_at", "_fix_log"):
            setattr(clone, name, copy.deepcopy(getattr(self, name), memo))
        clone.version, clone.n_sets, clone._attr_version = self.version, self.n_sets, self._attr_version
        clone._sets_indexed = self._sets_indexed
        return clone

    # -------------------------------------------- read as {attribute: family}
    # ``idx.schema["price"]`` -> "numeric"; ``dict(idx.schema)``; None for an
    # attribute whose family nothing has fixed yet (only IS NULL tests seen).
    # (No __len__: a Schema stays truthy however few attributes it has.)
    def __getitem__(self, attr: str) -> str | None:
        family = self.families[attr]
        return None if family is None else family.value

    def __contains__(self, attr) -> bool:
        return attr in self.families

    def __iter__(self):
        return iter(list(self.attr_names))

    def keys(self) -> list[str]:
        """The attributes, in id order (first use first)."""
        return list(self.attr_names)

    def items(self) -> list[tuple[str, str | None]]:
        """``(attribute, family)`` pairs, family as ``"numeric"``, ``"string"``,
        ``"boolean"`` or None."""
        return [(name, self[name]) for name in self.attr_names]

    @property
    def n_strings(self) -> int:
        return len(self.strings)

    # ---------------------------------------------------------------- attributes
    def declare(self, attr: str, family) -> None:
        """Declare ``attr`` of ``family`` -- or, for None, an attribute of no
        family yet (as ``dict(index.schema)`` lists one that only IS [NOT]
        NULL has used), which the first predicate with a literal fixes."""
        check_attribute_name(attr, "a declared attribute")
        if family is None:
            self._add_attr(attr, None)
            return
        family = parse_family(family)
        known = self.families.get(attr)
        if known is not None and known != family:
            raise SchemaError(f"attribute {attr!r} is already {known.value}, cannot declare it {family.value}")
        self._add_attr(attr, family)
        self.fix_family(attr, family)

    def fix_family(self, attr: str, family: Family) -> None:
        """Give an attribute that only IS [NOT] NULL used so far its family."""
        if self.families[attr] is not None:
            return
        self._attr_version += 1
        # the log first: a view reading the family concurrently sees it with its log entry
        self._fixed_at[attr] = self._attr_version
        self._fix_log.append(attr)
        self.families[attr] = family

    def attribute_arrays(self) -> tuple:
        """(attribute names as a pyarrow string array, family of each as a
        NumPy array of ``Family`` members or None) in attribute-id order,
        cached until an attribute or a family is added: vectorised event
        encoding looks names up in bulk."""
        cached = self._attr_arrays
        if cached is None or cached[0] != self._attr_version:
            cached = self._attr_arrays = (self._attr_version, *_attribute_arrays(
                self.attr_names, [self.families[name] for name in self.attr_names]))
        return cached[1], cached[2]

    def _add_attr(self, attr: str, family: Family | None) -> int:
        # family None: only IS [NOT] NULL has used the attribute so far, which
        # tests presence and fixes no family.
        if attr not in self.attr_ids:
            self._attr_version += 1
            self.families[attr] = family
            self.attr_names.append(attr)
            self.attr_ids[attr] = len(self.attr_names) - 1   # last: a view finds a name only once it is whole
        return self.attr_ids[attr]

    def check_predicates(self, preds, where: str = "expression", families: list | None = None,
                         earlier: dict | None = None, pending: list | None = None) -> dict[str, Family]:
        """Check every literal against its attribute's family, without
        changing anything.  Returns the families the predicates would fix
        for attributes not seen before; raises :class:`SchemaError`.
        ``families``: a list to append each predicate's literal family to
        (None for IS [NOT] NULL), for :meth:`register`.  ``earlier``: the
        families earlier expressions of the same call fix (not registered
        yet), read as the registered ones are, so that one call accepts and
        words a clash as two calls would.  ``pending``: a list to append
        ``(where, pred)`` to for an IS [NOT] EMPTY on an attribute nothing has
        typed yet, instead of refusing it -- a later expression of the same
        call may type it (:meth:`check_pending`)."""
        earlier = earlier or {}
        fixed: dict[str, Family] = {}
        for pred in preds:
            family = self._pred_family(pred, where)
            if families is not None:
                families.append(family)
            if family is None:
                continue
            known = self.families.get(pred.attr) or earlier.get(pred.attr) or fixed.get(pred.attr)
            if known is None:
                fixed[pred.attr] = family
            elif known != family:
                raise _family_error(where, pred, known, family)
        for pred in preds:      # IS [NOT] EMPTY fixes no element family: the attribute must be a list already
            if pred.op is Op.IS_EMPTY or pred.op is Op.IS_NOT_EMPTY:
                known = self.families.get(pred.attr) or earlier.get(pred.attr) or fixed.get(pred.attr)
                if known is None and pending is not None:
                    pending.append((where, pred))
                else:
                    _check_emptiness_test(where, pred, known)
        return fixed

    def check_pending(self, pending: list, fixed: dict) -> None:
        """Refuse the IS [NOT] EMPTY tests :meth:`check_predicates` set aside
        whose attribute neither the schema nor ``fixed`` (the call's other
        expressions) makes a list."""
        for where, pred in pending:
            _check_emptiness_test(where, pred, self.families.get(pred.attr) or fixed.get(pred.attr))

    @staticmethod
    def _pred_family(pred: Pred, where: str) -> Family | None:
        if pred.op in LIST_OPS:
            if pred.op is Op.IS_EMPTY or pred.op is Op.IS_NOT_EMPTY:
                return None
            element = Schema._literals_family(pred, where)
            if element not in LIST_OF:
                contains = pred.op in (Op.CONTAINS, Op.NOT_CONTAINS)
                shown = _op_words(pred) if contains else f"{pred.attr!r} {pred.op.value}"
                raise SchemaError(f"{where}: list attributes hold numbers or strings; {shown} has {element.value} "
                                  f"literals {_show(pred.values)}")
            return LIST_OF[element]
        return Schema._literals_family(pred, where)

    @staticmethod
    def _literals_family(pred: Pred, where: str) -> Family | None:
        if pred.op in PATTERN_OPS:
            if len(pred.values) != 1 or not isinstance(pred.values[0], str):
                raise SchemaError(f"{where}: {pred.op.value} on {pred.attr!r} needs one string pattern")
            return Family.STRING
        if pred.op in (Op.IS_NULL, Op.IS_NOT_NULL):
            return None
        if not pred.values:
            raise SchemaError(f"{where}: {pred.op.value} on {pred.attr!r} has no operand")
        if len(pred.values) == 1:          # the common cases first, without a set
            value = pred.values[0]
            kind = type(value)
            if kind is str:
                return Family.STRING
            if (kind is int and -MAX_EXACT_INT <= value <= MAX_EXACT_INT) or (kind is float and value - value == 0.0):
                return Family.NUMERIC       # (x - x is NaN for NaN and the infinities)
            family = literal_family(value)
            if family is Family.NUMERIC:
                check_number(value, f"{where}: {pred.attr!r}")
            return family
        families = {literal_family(v) for v in pred.values}
        if len(families) > 1:
            raise SchemaError(f"{where}: {pred.attr!r} {pred.op.value} mixes literal types {_show(pred.values)}")
        family = families.pop()
        if family is Family.NUMERIC:
            for v in pred.values:
                check_number(v, f"{where}: {pred.attr!r}")
        return family

    def register(self, preds, families: list | None = None) -> None:
        """Record attributes, strings, IN lists and patterns of already
        checked predicates (``families``: their literal families as
        :meth:`check_predicates` listed them; found again when None).
        Cannot fail on checked input."""
        if families is None:
            families = [self._pred_family(pred, "expression") for pred in preds]
        for pred, family in zip(preds, families):
            self._add_attr(pred.attr, family)
            if family is not None:
                self.fix_family(pred.attr, family)
            if pred.op in PATTERN_OPS:
                kind = "like" if pred.op in (Op.LIKE, Op.NOT_LIKE) else "regex"
                self.pattern_id(kind, pred.values[0])
            elif family is Family.STRING or family is Family.STRING_LIST:
                self.add_strings(pred.values)

    # ------------------------------------------------------------------- strings
    def string_id_of(self, value: str) -> int:
        """The stable id of a dictionary string, -1 for any other string."""
        return self.string_ids.get(value, -1)

    def add_strings(self, values) -> None:
        grew = False
        for value in values:
            if value not in self.string_ids:
                self.string_ids[value] = len(self.strings)
                self.strings.append(value)
                grew = True
        if grew:
            self.version += 1

    def string_id(self, value: str) -> int:
        return self.string_ids[value]

    def dictionary(self, version: int | None = None, n_strings: int | None = None) -> StringDictionary:
        """The sorted dictionary of the first ``n_strings`` strings (all by
        default), which ``version`` names; cached, and built from the
        largest cached one below it."""
        if version is None:
            version, n_strings = self.version, len(self.strings)
        found = self._dictionaries.get(version)
        if found is None:
            base = max((d for d in list(self._dictionaries.values()) if d.n <= n_strings), key=lambda d: d.n,
                       default=None)
            found = StringDictionary(self.strings, n_strings, base)
            with self._lock:
                self._dictionaries[version] = found
                for old in sorted(self._dictionaries)[:-4]:     # a few recent versions are enough
                    del self._dictionaries[old]
        return found

    def codes_of_string_ids(self, ids: np.ndarray) -> np.ndarray:
        """Codes of dictionary strings given their stable ids."""
        return self.dictionary().codes_of_string_ids(ids)

    def encode_strings(self, values) -> np.ndarray:
        """Codes of arbitrary strings (a sequence of str or a pyarrow string
        array): dictionary strings get odd codes, others the even code
        between their neighbours.  Exact for every Unicode string."""
        return self.dictionary().encode(values)

    # -------------------------------------------------------------- sets, patterns
    def set_id(self, keys: tuple) -> int:
        """Stable id of one IN list given its canonical (sorted, unique)
        operand keys; equal lists share an id, however they were added."""
        found = self.set_ids.get(keys)
        if found is None and self._sets_indexed < self.n_sets:
            self._index_sets()
            found = self.set_ids.get(keys)
        if found is None:
            found = self.set_ids[keys] = self.add_sets(np.array([len(keys)]), np.asarray(keys, np.float64))[0]
            self._sets_indexed = self.n_sets
        return int(found)

    def find_or_add_sets(self, lengths: np.ndarray, keys: np.ndarray) -> np.ndarray:
        """Ids of many distinct canonical IN lists (CSR: ``lengths`` and the
        concatenated ``keys``): a list the schema holds already keeps its id,
        the others are added.  Into a schema without lists (a first bulk
        load) they are added without a lookup, and indexed for sharing only
        when a later lookup needs them."""
        if self.n_sets == 0:
            return self.add_sets(lengths, keys)
        self._index_sets()
        # one pass over Python lists (as restore_sets): the lookup is by key tuple
        bounds, values = np.concatenate(([0], np.cumsum(lengths))).astype(np.int64).tolist(), keys.tolist()
        lists = [tuple(values[bounds[k]:bounds[k + 1]]) for k in range(len(lengths))]
        ids = np.array([self.set_ids.get(found, -1) for found in lists], dtype=np.int64)
        new = np.flatnonzero(ids < 0)
        if len(new):
            ids[new] = self.add_sets(np.asarray(lengths)[new],
                                     np.concatenate([keys[bounds[k]:bounds[k + 1]] for k in new.tolist()]))
            for k, set_id in zip(new.tolist(), ids[new].tolist()):
                self.set_ids[lists[k]] = set_id
            self._sets_indexed = self.n_sets
        return ids

    def _index_sets(self) -> None:
        """Put the lists not yet in ``set_ids`` there (equal lists keep the
        first id)."""
        if self._sets_indexed >= self.n_sets:
            return
        offsets, keys = self.set_csr()
        first = self._sets_indexed
        bounds, values = offsets[first:].tolist(), keys[offsets[first]:].tolist()
        base = bounds[0]
        for k in range(len(bounds) - 1):
            self.set_ids.setdefault(tuple(values[bounds[k] - base:bounds[k + 1] - base]), first + k)
        self._sets_indexed = self.n_sets

    def add_sets(self, lengths: np.ndarray, keys: np.ndarray) -> np.ndarray:
        """Register many canonical IN lists at once (CSR: ``lengths`` and
        the concatenated ``keys``); returns their new ids."""
        ids = np.arange(self.n_sets, self.n_sets + len(lengths), dtype=np.int64)
        self._set_chunks.append((np.asarray(lengths, np.int64), np.asarray(keys, np.float64)))
        self.n_sets += len(lengths)
        return ids

    def set_csr(self, n_sets: int | None = None) -> tuple[np.ndarray, np.ndarray]:
        """(offsets, keys) of the first ``n_sets`` IN lists (all by
        default), in id order."""
        n_sets = self.n_sets if n_sets is None else n_sets
        cached = self._set_csr
        if cached is None or cached[0] != self._set_generation or cached[1] < n_sets:
            # (a view may consolidate while an update appends or rolls back: the
            # generation read first makes a consolidation raced by a rollback stale)
            generation = self._set_generation
            chunks = list(self._set_chunks)
            lengths = np.concatenate([c[0] for c in chunks]) if chunks else np.zeros(0, np.int64)
            keys = np.concatenate([c[1] for c in chunks]) if chunks else np.zeros(0)
            cached = (generation, len(lengths), np.concatenate(([0], np.cumsum(lengths))).astype(np.int64), keys)
            self._set_csr = cached
        offsets = cached[2][:n_sets + 1]
        return offsets, cached[3][:offsets[-1]]

    def set_keys(self, set_id: int) -> np.ndarray:
        offsets, keys = self.set_csr()
        return keys[offsets[set_id]:offsets[set_id + 1]]

    def pattern_id(self, kind: str, text: str) -> int:
        key = (kind, text)
        found = self.pattern_ids.get(key)
        if found is None:
            self.patterns.append(key)
            found = self.pattern_ids[key] = len(self.patterns) - 1
        return found

    def pattern_matcher(self, pattern_id: int):
        """``str -> bool`` for one pattern: LIKE by full match of its RE2
        translation, MATCHES by RE2 search (docs/language.md#like-and-matches)."""
        return compiled_pattern(self._compiled_patterns, self.patterns[pattern_id])

    # ------------------------------------------------------ snapshots, rollback
    def view(self) -> "SchemaView":
        """The schema as it is now, for a match to read while updates go on."""
        return SchemaView(self)

    def mark(self) -> tuple:
        """What :meth:`rollback` returns to."""
        return (len(self.attr_names), len(self.strings), len(self.patterns), self.n_sets, len(self._set_chunks),
                len(self._fix_log))

    def rollback(self, mark: tuple) -> None:
        """Take back everything added since ``mark`` (a failed update).  Only
        the tails beyond the mark are removed, which no view taken before
        can see."""
        n_attrs, n_strings, n_patterns, n_sets, n_chunks, n_fixes = mark
        for attr in reversed(self._fix_log[n_fixes:]):
            self.families[attr] = None
            del self._fixed_at[attr]
        del self._fix_log[n_fixes:]
        for attr in self.attr_names[n_attrs:]:
            del self.attr_ids[attr]
            del self.families[attr]
            self._fixed_at.pop(attr, None)
        del self.attr_names[n_attrs:]
        if len(self.strings) > n_strings:
            for value in self.strings[n_strings:]:
                del self.string_ids[value]
            del self.strings[n_strings:]
            self.version += 1          # a fresh number: the codes of the dropped strings are gone
            with self._lock:
                for version, found in list(self._dictionaries.items()):
                    if found.n > n_strings:
                        del self._dictionaries[version]
        for key in self.patterns[n_patterns:]:
            del self.pattern_ids[key]
        del self.patterns[n_patterns:]
        if self.n_sets > n_sets:
            self.set_ids = {keys: i for keys, i in self.set_ids.items() if i < n_sets}
            self._sets_indexed = min(self._sets_indexed, n_sets)
            self._set_generation += 1
            del self._set_chunks[n_chunks:]
            self.n_sets = n_sets
            self._set_csr = None
        self._attr_version += 1

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
        self.add_sets(np.diff(offsets), keys)      # (indexed for sharing when a lookup needs them)

    @classmethod
    def from_json(cls, data: dict) -> "Schema":
        schema = cls()
        for name, family in data["attributes"]:
            schema._add_attr(name, None if family is None else parse_family(family))
        schema.add_strings(data["strings"])
        for kind, text in data["patterns"]:
            schema.pattern_id(kind, text)
        return schema


class SchemaView:
    """A :class:`Schema` frozen at one moment: what one snapshot of an index
    matches with.  Reads the schema's append-only lists up to the lengths
    they had, so the schema may grow meanwhile; offers the reading half of
    the Schema API (names, families, dictionary, IN lists, patterns)."""

    def __init__(self, schema: Schema):
        self._schema = schema
        self.n_attrs = len(schema.attr_names)
        self.n_strings = len(schema.strings)
        self.n_patterns = len(schema.patterns)
        self.n_sets = schema.n_sets
        self.version = schema.version
        self._attr_version = schema._attr_version
        self.attr_ids = _AttrIdsAt(schema.attr_ids, self.n_attrs)
        self.families = _FamiliesAt(self)

    # (cached once per view: computed from prefixes that never change)
    @functools.cached_property
    def attr_names(self) -> list[str]:
        return self._schema.attr_names[:self.n_attrs]

    @functools.cached_property
    def strings(self) -> list[str]:
        return self._schema.strings[:self.n_strings]

    @property
    def patterns(self) -> list[tuple[str, str]]:
        return self._schema.patterns[:self.n_patterns]

    def family_of(self, name: str) -> Family | None:
        """The family ``name`` had when the view was taken; KeyError if it
        was not an attribute then."""
        if self.attr_ids.get(name) is None:
            raise KeyError(name)
        family = self._schema.families.get(name)
        if family is not None and self._schema._fixed_at.get(name, -1) > self._attr_version:
            return None
        return family

    def attribute_arrays(self) -> tuple:
        return self._attribute_arrays

    @functools.cached_property
    def _attribute_arrays(self) -> tuple:
        names = self.attr_names
        return _attribute_arrays(names, [self.family_of(n) for n in names])

    def dictionary(self) -> StringDictionary:
        return self._dictionary

    @functools.cached_property
    def _dictionary(self) -> StringDictionary:
        return self._schema.dictionary(self.version, self.n_strings)

    def codes_of_string_ids(self, ids: np.ndarray) -> np.ndarray:
        return self.dictionary().codes_of_string_ids(ids)

    def encode_strings(self, values) -> np.ndarray:
        return self.dictionary().encode(values)

    def string_id_of(self, value: str) -> int:
        found = self._schema.string_ids.get(value, -1)
        return found if found < self.n_strings else -1

    def set_csr(self, n_sets: int | None = None) -> tuple[np.ndarray, np.ndarray]:
        return self._schema.set_csr(self.n_sets if n_sets is None else min(n_sets, self.n_sets))

    def set_keys(self, set_id: int) -> np.ndarray:
        offsets, keys = self.set_csr()
        return keys[offsets[set_id]:offsets[set_id + 1]]

    def pattern_matcher(self, pattern_id: int):
        if not 0 <= pattern_id < self.n_patterns:
            raise IndexError(f"pattern id {pattern_id} out of range")
        return compiled_pattern(self._schema._compiled_patterns, self._schema.patterns[pattern_id])

    def view(self) -> "SchemaView":
        return self


class _AttrIdsAt:
    """``attr_ids`` restricted to the attributes a view knows."""

    __slots__ = ("_ids", "_n")

    def __init__(self, ids: dict, n: int):
        self._ids, self._n = ids, n

    def get(self, name, default=None):
        found = self._ids.get(name)
        return found if found is not None and found < self._n else default

    def __getitem__(self, name):
        found = self.get(name)
        if found is None:
            raise KeyError(name)
        return found

    def __contains__(self, name) -> bool:
        return self.get(name) is not None

    def __len__(self) -> int:
        return self._n


class _FamiliesAt:
    """``families`` as a view saw them."""

    __slots__ = ("_view",)

    def __init__(self, view: SchemaView):
        self._view = view

    def __getitem__(self, name):
        return self._view.family_of(name)

    def get(self, name, default=None):
        try:
            return self._view.family_of(name)
        except KeyError:
            return default

    def __contains__(self, name) -> bool:
        return name in self._view.attr_ids

    def items(self):
        return [(name, self._view.family_of(name)) for name in self._view.attr_names]


def _attribute_arrays(names: list, families: list) -> tuple:
    array = np.empty(len(names), dtype=object)
    array[:] = families
    return pa.array(names, pa.string()), array


def compiled_pattern(cache: dict, key: tuple[str, str]):
    """The ``str -> bool`` test of one (kind, text) pattern, compiled once
    into ``cache`` (keyed by the pattern itself, so that concurrent callers
    and a rollback cannot misplace one)."""
    found = cache.get(key)
    if found is None:
        kind, text = key
        regex = re2.compile(like_to_regex(text) if kind == "like" else text, QUIET_RE2)
        test = regex.fullmatch if kind == "like" else regex.search
        found = cache.setdefault(key, lambda value: test(value) is not None)
    return found


def _show(values) -> str:
    return ", ".join(repr(v) for v in values)

