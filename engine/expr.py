"""The expression AST and its normal forms.

This module owns the in-memory shape of a subscription (docs/language.md#grammar):
predicates over one attribute, combined by NOT, AND, OR, XOR and XNOR, and
the rewrites every algorithm relies on:

* negation normal form (NNF), with every negation folded into a predicate
  (A-Tree's zero-suppression, Ji and Jacobsen, SIGMOD 2021, §5.2.1);
* disjunctive and conjunctive normal forms with an explicit size limit
  (OpIndex §6.1, BE-Tree's DNF route).

Literals are Python values: ``int``/``float`` (numeric family), ``str``
(string family) and ``bool`` (boolean family).  ``bool`` is checked before
``int`` everywhere because ``True == 1`` in Python.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Union

import re2

#: the options every RE2 compile here uses: RE2 logs to stderr (through absl) a pattern it refuses -- which
#: the caller's error reports instead -- and each search that outgrows its DFA's memory and falls back to
#: the NFA (a long pattern on long values: a line an event, on every batch, for the same answer)
QUIET_RE2 = re2.Options()
QUIET_RE2.log_errors = False

#: a LIKE pattern up to this many characters always compiles (its RE2 translation is a literal, ``.`` or
#: ``.*`` a character: far below RE2's program budget); a longer one is compiled when it is added, since
#: RE2 refuses one of about 100,000 characters ("pattern too large"), which every match would then meet
LIKE_ALWAYS_COMPILES = 4096


def like_to_regex(pattern: str) -> str:
    """SQL LIKE as an RE2 pattern for ``fullmatch``: ``%`` any run, ``_`` one
    character, no escape character, case-sensitive."""
    parts = [".*" if c == "%" else "." if c == "_" else re2.escape(c) for c in pattern]
    return "(?s)" + "".join(parts)


def shortened(text: str, limit: int = 40) -> str:
    """``text`` cut to ``limit`` characters and ``...`` for an error message
    (a pattern may be 100,000 characters long)."""
    return text if len(text) <= limit else text[:limit] + "..."


def pattern_error(kind: str, text: str) -> str | None:
    """Why RE2 cannot compile the ``kind`` ("like" or "regex") pattern
    ``text`` (a LIKE pattern as :func:`like_to_regex` translates it), or
    None: what every route that adds a pattern asks, so that a pattern the
    matchers could not compile is refused when it is added."""
    if kind == "like" and len(text) <= LIKE_ALWAYS_COMPILES:
        return None
    try:
        re2.compile(like_to_regex(text) if kind == "like" else text, QUIET_RE2)
    except re2.error as error:
        reason = error.args[0] if error.args else error
        return reason.decode("utf-8", "replace") if isinstance(reason, bytes) else str(reason)
    return None

Literal = Union[int, float, str, bool]


class Op(enum.Enum):
    """Predicate operators (docs/language.md#operators); each negated form
    is also what ``NOT`` of its positive form becomes in NNF."""

    EQ = "="
    NE = "!="
    LT = "<"
    LE = "<="
    GT = ">"
    GE = ">="
    IN = "IN"
    NOT_IN = "NOT IN"
    BETWEEN = "BETWEEN"
    NOT_BETWEEN = "NOT BETWEEN"
    LIKE = "LIKE"
    NOT_LIKE = "NOT LIKE"
    MATCHES = "MATCHES"
    NOT_MATCHES = "NOT MATCHES"
    IS_NULL = "IS NULL"
    IS_NOT_NULL = "IS NOT NULL"
    # list attributes (docs/language.md#list-attributes): DuckDB's
    # list_has_any, NOT list_has_any, list_has_all, NOT list_has_all,
    # list_contains (`value IN attr`), its negation, len(attr) = 0 and > 0
    ONE_OF = "ONE OF"
    NONE_OF = "NONE OF"
    ALL_OF = "ALL OF"
    NOT_ALL_OF = "NOT ALL OF"
    CONTAINS = "CONTAINS"
    NOT_CONTAINS = "NOT CONTAINS"
    IS_EMPTY = "IS EMPTY"
    IS_NOT_EMPTY = "IS NOT EMPTY"

    # Members are singletons, so identity hashing is exact; Enum's own
    # __hash__ (of the name) is a Python call, about a million of them per
    # 20,000 texts added (every Pred hash, every set lookup of an operator).
    __hash__ = object.__hash__


#: the operator that is TRUE exactly where the key is FALSE, and NULL where it
#: is NULL (SQL three-valued logic: negating a predicate keeps NULL as NULL).
NEGATED_OP = {
    Op.EQ: Op.NE, Op.NE: Op.EQ,
    Op.LT: Op.GE, Op.GE: Op.LT,
    Op.GT: Op.LE, Op.LE: Op.GT,
    Op.IN: Op.NOT_IN, Op.NOT_IN: Op.IN,
    Op.BETWEEN: Op.NOT_BETWEEN, Op.NOT_BETWEEN: Op.BETWEEN,
    Op.LIKE: Op.NOT_LIKE, Op.NOT_LIKE: Op.LIKE,
    Op.MATCHES: Op.NOT_MATCHES, Op.NOT_MATCHES: Op.MATCHES,
    Op.IS_NULL: Op.IS_NOT_NULL, Op.IS_NOT_NULL: Op.IS_NULL,
    Op.ONE_OF: Op.NONE_OF, Op.NONE_OF: Op.ONE_OF,
    Op.ALL_OF: Op.NOT_ALL_OF, Op.NOT_ALL_OF: Op.ALL_OF,
    Op.CONTAINS: Op.NOT_CONTAINS, Op.NOT_CONTAINS: Op.CONTAINS,
    Op.IS_EMPTY: Op.IS_NOT_EMPTY, Op.IS_NOT_EMPTY: Op.IS_EMPTY,
}

COMPARISON_OPS = frozenset({Op.EQ, Op.NE, Op.LT, Op.LE, Op.GT, Op.GE})
SET_OPS = frozenset({Op.IN, Op.NOT_IN})
RANGE_OPS = frozenset({Op.BETWEEN, Op.NOT_BETWEEN})
PATTERN_OPS = frozenset({Op.LIKE, Op.NOT_LIKE, Op.MATCHES, Op.NOT_MATCHES})
NULL_OPS = frozenset({Op.IS_NULL, Op.IS_NOT_NULL})
#: operators of list attributes; the ones with an operand list, and every
#: other operator (IS [NOT] NULL apart) is refused on a list attribute
LIST_OPS = frozenset({Op.ONE_OF, Op.NONE_OF, Op.ALL_OF, Op.NOT_ALL_OF, Op.CONTAINS, Op.NOT_CONTAINS,
                      Op.IS_EMPTY, Op.IS_NOT_EMPTY})
LIST_SET_OPS = frozenset({Op.ONE_OF, Op.NONE_OF, Op.ALL_OF, Op.NOT_ALL_OF})


class Family(enum.Enum):
    """Type families (docs/language.md#types-and-type-families); an attribute has exactly one."""

    NUMERIC = "numeric"
    STRING = "string"
    BOOLEAN = "boolean"
    NUMERIC_LIST = "list<numeric>"
    STRING_LIST = "list<string>"

    __hash__ = object.__hash__      # as Op's: members are singletons


#: the family of a list attribute whose elements are of the key's family
LIST_OF = {Family.NUMERIC: Family.NUMERIC_LIST, Family.STRING: Family.STRING_LIST}
#: the family of a list attribute's elements
ELEMENT_OF = {lst: element for element, lst in LIST_OF.items()}


def literal_family(value: Literal) -> Family:
    if isinstance(value, bool):
        return Family.BOOLEAN
    if isinstance(value, (int, float)):
        return Family.NUMERIC
    if isinstance(value, str):
        return Family.STRING
    raise TypeError(f"not a literal: {value!r} ({type(value).__name__})")


@dataclass(frozen=True, slots=True)
class Pred:
    """One predicate on one attribute.

    ``values`` holds the operands: one for a comparison, LIKE, MATCHES or
    CONTAINS (``value IN attr``), the list for IN and ONE/NONE/ALL OF,
    ``(low, high)`` for BETWEEN, nothing for IS [NOT] NULL and IS [NOT]
    EMPTY.
    """

    attr: str
    op: Op
    values: tuple = ()

    def __eq__(self, other):
        # Compare literals with their family so that ``a = 1`` and ``a = TRUE``
        # (and ``1 == True`` in Python) stay different predicates.
        if not isinstance(other, Pred):
            return NotImplemented
        return (self.attr, self.op, _typed(self.values)) == (other.attr, other.op, _typed(other.values))

    def __hash__(self):
        # Equal predicates have equal values (``1 == 1.0`` hash alike), so
        # the values need no family here; ``a = 1`` and ``a = TRUE`` merely
        # share a hash.  Hashing is the bulk of the normal-form rewrites.
        return hash((self.attr, self.op, self.values))


def _typed(values: tuple) -> tuple:
    return tuple((literal_family(v), v) for v in values)


@dataclass(frozen=True, slots=True)
class Not:
    child: "Node"


@dataclass(frozen=True, slots=True)
class And:
    """n-ary conjunction (the parser flattens ``a AND b AND c``)."""

    children: tuple


@dataclass(frozen=True, slots=True)
class Or:
    """n-ary disjunction."""

    children: tuple


@dataclass(frozen=True, slots=True)
class Xor:
    left: "Node"
    right: "Node"


@dataclass(frozen=True, slots=True)
class Xnor:
    left: "Node"
    right: "Node"


Node = Union[Pred, Not, And, Or, Xor, Xnor]


def negate(pred: Pred) -> Pred:
    """The predicate equal to ``NOT pred`` under three-valued logic."""
    return Pred(pred.attr, NEGATED_OP[pred.op], pred.values)


def to_nnf(node: Node, negated: bool = False) -> Node:
    """Negation normal form: no ``Not`` nodes left, negations folded into
    predicates (De Morgan for AND/OR; ``NOT (x XOR y)`` is ``x XNOR y``, which
    keeps NULL as NULL exactly like XOR does)."""
    if isinstance(node, Pred):
        return negate(node) if negated else node
    if isinstance(node, Not):
        return to_nnf(node.child, not negated)
    if isinstance(node, And):
        children = tuple(to_nnf(c, negated) for c in node.children)
        return Or(children) if negated else And(children)
    if isinstance(node, Or):
        children = tuple(to_nnf(c, negated) for c in node.children)
        return And(children) if negated else Or(children)
    if isinstance(node, Xor):
        cls = Xnor if negated else Xor
        return cls(to_nnf(node.left), to_nnf(node.right))
    if isinstance(node, Xnor):
        cls = Xor if negated else Xnor
        return cls(to_nnf(node.left), to_nnf(node.right))
    raise TypeError(f"not an expression node: {node!r}")


def predicates(node: Node):
    """Every predicate of ``node``, left to right (with repetitions)."""
    if isinstance(node, Pred):
        yield node
    elif isinstance(node, Not):
        yield from predicates(node.child)
    elif isinstance(node, (And, Or)):
        for child in node.children:
            yield from predicates(child)
    else:
        yield from predicates(node.left)
        yield from predicates(node.right)


# ---------------------------------------------------------------------------
# What every expression must satisfy before the recursive code above and
# below (and the dataclasses' own __eq__, __hash__ and __repr__) sees it
# ---------------------------------------------------------------------------

#: deepest nesting accepted: the number of NOT, AND, OR, XOR and XNOR nodes
#: on the longest path from the root to a predicate (a lone predicate is 0;
#: parentheses alone add nothing).  The code that walks an AST recurses once
#: per level, taking up to 3 Python frames a level (the normal forms,
#: `engine.parse.to_text`, the compiler; `to_nnf` 2, `predicates` 1) and 4
#: for the dataclasses' own ``==`` and ``repr`` of alternating AND/OR.  At
#: 200 levels that is about 600 frames (800 for ``==`` and ``repr``) of
#: Python's default recursion limit of 1000, leaving the rest to the
#: caller's stack.
#: `engine.parse.parse`, `to_dnf`, `to_cnf` and `engine.parse.to_text`
#: refuse anything deeper (`errors.ExpressionTooLarge`); an AST built in
#: code is checked with `check_nesting`.  A left-deep XOR chain nests one
#: level per XOR, so it holds at most 201 terms.
MAX_NESTING = 200


def _children(node: Node) -> tuple:
    if isinstance(node, Pred):
        return ()
    if isinstance(node, Not):
        return (node.child,)
    if isinstance(node, (And, Or)):
        return tuple(node.children)
    if isinstance(node, (Xor, Xnor)):
        return (node.left, node.right)
    raise TypeError(f"not an expression node: {type(node).__name__}")


def _distinct_nodes(node: Node, known=frozenset()) -> list:
    """Every node of ``node`` whose id is not in ``known``, each once,
    children before their parent and left before right (predicates in
    the order the text reads them), with an explicit stack instead of
    recursion.  A node shared by several parents is visited once, so an
    AST that is a DAG costs its number of distinct nodes, not its number of
    paths; a cycle is a ValueError.  ``known``: the ids of nodes visited
    before (in other ASTs of a batch), whose subtrees are not entered."""
    out: list = []
    if id(node) in known:
        return out
    finished: set[int] = set()
    open_ancestors: set[int] = set()     # expanded, their children not all listed yet
    stack = [(node, False)]
    while stack:
        current, expanded = stack.pop()
        key = id(current)
        if expanded:
            open_ancestors.discard(key)
            finished.add(key)
            out.append(current)
        elif key not in finished and key not in known:
            if key in open_ancestors:
                raise ValueError("an expression cannot contain itself")
            if isinstance(current, Pred):
                finished.add(key)
                out.append(current)
                continue
            open_ancestors.add(key)
            stack.append((current, True))
            stack.extend((child, False) for child in reversed(_children(current)))   # first child on top
    return out


#: the most nodes an expression may have, counting a subtree shared by
#: several parents once per parent (a text of a few megabytes)
MAX_NODES = 2_000_000


def check_nesting(node: Node) -> None:
    """Raise `errors.ExpressionTooLarge` when ``node`` is nested deeper than
    `MAX_NESTING`, or has more than `MAX_NODES` nodes once shared subtrees
    are repeated.  Computed without recursion, so that this can run before
    any recursive code sees the expression."""
    _check_nesting(node, _distinct_nodes(node), {}, {})


def _check_nesting(node: Node, nodes: list, depths: dict, sizes: dict) -> None:
    """`check_nesting` of ``node``, whose nodes not measured yet are
    ``nodes`` (children first); ``depths`` and ``sizes`` hold, by id, those
    of the connectives measured before (a predicate's are 0 and 1) and
    gain these."""
    from engine.errors import ExpressionTooLarge

    for current in nodes:
        if not isinstance(current, Pred):
            depth, size = 0, 1
            for child in _children(current):
                if isinstance(child, Pred):
                    size += 1
                    continue
                key = id(child)
                depth = max(depth, depths.get(key, 0))
                size += sizes.get(key, 1)
            depths[id(current)] = depth + 1
            sizes[id(current)] = size
    depth = depths.get(id(node), 0)
    if depth > MAX_NESTING:
        raise ExpressionTooLarge(f"expression is nested {depth} levels deep, deeper than the limit of "
                                 f"{MAX_NESTING} levels (NOT, AND, OR, XOR and XNOR nodes on one path)")
    # an AST may share a subtree between parents (text never does): every
    # rewrite walks each path, so the count with repetitions is what costs
    size = sizes.get(id(node), 1)
    if size > MAX_NODES:
        raise ExpressionTooLarge(f"expression has {size} nodes once its shared subtrees are repeated, more "
                                 f"than the limit of {MAX_NODES}")


def lone_surrogate(text) -> int | None:
    """The index of the first lone surrogate in ``text`` (the only
    characters that UTF-8 cannot encode, so text holding one is not valid
    Unicode), or None when there is none or ``text`` is not a str."""
    if not isinstance(text, str) or text.isascii():
        return None
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as error:
        return error.start
    return None


def check_text(node: Node) -> None:
    """Raise `errors.ParseError` when an attribute name or a string literal
    or pattern of ``node`` is not valid Unicode: a lone surrogate must never
    reach an index.  Without recursion, like `check_nesting`."""
    _check_text(_distinct_nodes(node))


def _check_text(nodes: list) -> None:
    from engine.errors import ParseError

    for current in nodes:
        if not isinstance(current, Pred):
            continue
        attr = current.attr
        at = lone_surrogate(attr)
        if at is not None:
            raise ParseError(f"attribute name {attr!r} is not valid Unicode: lone surrogate at index {at}")
        for value in current.values:
            at = lone_surrogate(value)
            if at is not None:
                raise ParseError(f"string on attribute {attr!r} is not valid Unicode: lone surrogate "
                                 f"{value[at]!r} at index {at}")


# ---------------------------------------------------------------------------
# Disjunctive and conjunctive normal forms (OpIndex §6.1, BE-Tree's DNF route)
# ---------------------------------------------------------------------------
#
# Both rewrites start from the negation normal form, so every negation is
# folded into a predicate with `negate` (exact under three-valued logic:
# NOT keeps NULL as NULL).  XOR and XNOR are expanded by their definitions in
# docs/language.md#xor-and-xnor,
#
#     x XOR y  = (x AND NOT y) OR (NOT x AND y)
#     x XNOR y = (x AND y) OR (NOT x AND NOT y)
#
# and AND/OR are distributed over each other.  Kleene's AND and OR form a
# distributive lattice, so distribution and the idempotence used for
# de-duplication are exact: the normal form has the same three-valued value
# as the original on every event, and in particular it is TRUE exactly when
# the original is.  What is *not* valid under three-valued logic is dropping
# a "tautological" clause ``p OR NOT p`` from a CNF (it is NULL where ``p`` is
# NULL), so no such simplification is made.

#: default cap on the number of DNF conjunctions / CNF clauses of one
#: expression; a rewrite that would exceed it raises ExpressionTooLarge.
NORMAL_FORM_LIMIT = 1024


def to_dnf(node: Node, limit: int = NORMAL_FORM_LIMIT) -> list[tuple[Pred, ...]]:
    """Disjunctive normal form: a list of conjunctions, each a tuple of
    predicates, such that ``node`` is TRUE on an event iff some conjunction
    has every predicate TRUE (OpIndex §6.1: each conjunction is then indexed
    as a simple subscription; BE-Tree indexes DNF the same way).

    Predicates are de-duplicated inside a conjunction (first occurrence
    kept) and conjunctions holding the same set of predicates are kept once.
    An empty list is the constant FALSE (an empty ``Or``); a list holding the
    empty tuple is the constant TRUE (an empty ``And``).

    Raises `errors.ExpressionTooLarge` as soon as an intermediate or final
    result would hold more than ``limit`` conjunctions; nothing larger than
    ``limit`` is ever built.
    """
    check_nesting(node)
    return _NormalForm(True, _check_limit(limit)).of(to_nnf(node), False)


def to_cnf(node: Node, limit: int = NORMAL_FORM_LIMIT) -> list[tuple[Pred, ...]]:
    """Conjunctive normal form: a list of clauses (disjunctions), each a
    tuple of predicates, such that ``node`` is TRUE on an event iff every
    clause has a TRUE predicate (OpIndex §6.1: one bit per clause in the
    subscription's bitmap, cleared when a predicate of the clause matches).

    Predicates are de-duplicated inside a clause and clauses holding the same
    set of predicates are kept once.  An empty list is the constant TRUE; a
    list holding the empty tuple is the constant FALSE.  Same ``limit`` and
    `errors.ExpressionTooLarge` as `to_dnf`.
    """
    check_nesting(node)
    return _NormalForm(False, _check_limit(limit)).of(to_nnf(node), False)


def _check_limit(limit: int) -> int:
    if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
        raise ValueError(f"normal-form limit must be a positive int, got {limit!r}")
    return limit


class _NormalForm:
    """DNF (``dnf=True``) or CNF builder.  In DNF, OR concatenates and AND
    distributes (cross product); in CNF the other way round.  Results are
    memoised per (node, negated) so that the operands of XOR/XNOR, each used
    twice by the expansion, are rewritten once."""

    def __init__(self, dnf: bool, limit: int):
        self.dnf = dnf
        self.limit = limit
        self.memo: dict = {}

    def of(self, node: Node, negated: bool) -> list[tuple[Pred, ...]]:
        """The normal form of ``NOT node`` if ``negated`` else of ``node``."""
        key = (id(node), negated)
        hit = self.memo.get(key)
        if hit is None:
            hit = self.memo[key] = self._build(node, negated)
        return hit

    def _build(self, node: Node, negated: bool) -> list[tuple[Pred, ...]]:
        if isinstance(node, Pred):
            return [(negate(node) if negated else node,)]
        if isinstance(node, Not):
            return self.of(node.child, not negated)
        if isinstance(node, (And, Or)):
            parts = [self.of(c, negated) for c in node.children]
            if isinstance(node, And) != negated:          # De Morgan
                return self.conj(parts)
            return self.disj(parts)
        if isinstance(node, (Xor, Xnor)):
            x, y = node.left, node.right
            if isinstance(node, Xor) != negated:          # NOT (x XOR y) = x XNOR y
                # x XOR y = (x AND NOT y) OR (NOT x AND y)
                return self.disj([self.conj([self.of(x, False), self.of(y, True)]),
                                  self.conj([self.of(x, True), self.of(y, False)])])
            # x XNOR y = (x AND y) OR (NOT x AND NOT y)
            return self.disj([self.conj([self.of(x, False), self.of(y, False)]),
                              self.conj([self.of(x, True), self.of(y, True)])])
        raise TypeError(f"not an expression node: {node!r}")

    def conj(self, parts):
        return _cross(parts, self.dnf, self.limit) if self.dnf else _concat(parts, self.dnf, self.limit)

    def disj(self, parts):
        return _concat(parts, self.dnf, self.limit) if self.dnf else _cross(parts, self.dnf, self.limit)


def _too_large(dnf: bool, limit: int, reached: int) -> Exception:
    from engine.errors import ExpressionTooLarge

    what = "DNF" if dnf else "CNF"
    unit = "conjunctions" if dnf else "clauses"
    return ExpressionTooLarge(
        f"{what} rewrite exceeds the limit of {limit} {unit} "
        f"(reached at least {reached} before stopping)")


def _concat(parts, dnf: bool, limit: int) -> list[tuple[Pred, ...]]:
    out: dict[frozenset, tuple[Pred, ...]] = {}
    for part in parts:
        for term in part:
            out.setdefault(frozenset(term), term)
            if len(out) > limit:
                raise _too_large(dnf, limit, len(out))
    return list(out.values())


def _cross(parts, dnf: bool, limit: int) -> list[tuple[Pred, ...]]:
    """Every way of joining one term of each part (the terms of a part hold
    each predicate once), the first part's term varying slowest; the
    predicates of a joined term once each, in order of first appearance,
    and terms holding the same set of predicates once, the first kept.

    A run of single-term parts (an AND chain in DNF, an OR chain in CNF) is
    joined into one term first, so a chain of n predicates costs O(n)
    rather than copying an ever longer term n times."""
    acc: dict[frozenset, tuple[Pred, ...]] = {frozenset(): ()}
    for part in _single_term_runs_joined(parts):
        if not part:            # a constant that absorbs the whole product
            return []
        nxt: dict[frozenset, tuple[Pred, ...]] = {}
        for a_set, a in acc.items():
            for b in part:
                union = a_set.union(b)
                if union not in nxt:
                    nxt[union] = a + tuple(p for p in b if p not in a_set) if a else b
                    if len(nxt) > limit:
                        raise _too_large(dnf, limit, len(nxt))
        acc = nxt
    return list(acc.values())


def _single_term_runs_joined(parts):
    """``parts`` with each run of consecutive single-term parts replaced by
    one single-term part, their predicates once each in order.  `_cross`
    gives the same result either way: joining terms is associative, and
    terms with the same set of predicates before a join still have the
    same set after it, so de-duplicating once after the run keeps the
    same first terms as de-duplicating after each of its parts."""
    run: dict[Pred, None] = {}
    for part in parts:
        if len(part) == 1:
            run.update(dict.fromkeys(part[0]))
            continue
        if run:
            yield [tuple(run)]
            run = {}
        yield part
    if run:
        yield [tuple(run)]


_ARITY = {Op.IS_NULL: 0, Op.IS_NOT_NULL: 0, Op.BETWEEN: 2, Op.NOT_BETWEEN: 2, Op.IS_EMPTY: 0, Op.IS_NOT_EMPTY: 0}


def check_shape(node: Node) -> None:
    """Refuse an AST the parser could not have built, before anything reads
    it (an index must not guess what it means): ``TypeError`` for what is
    not a node, an operator or a literal; `errors.ParseError` for a
    predicate with an empty attribute name, the wrong number of operands or
    an invalid RE2 pattern, and for an AND/OR without operands.  Without
    recursion, like `check_nesting` (which also refuses cycles)."""
    _check_shape(_distinct_nodes(node))


def _check_shape(nodes: list) -> None:
    """`check_shape` of the nodes ``nodes`` (of one or more ASTs)."""
    from engine.errors import ParseError

    _check_text(nodes)          # first: RE2 cannot even read a pattern that is not valid Unicode
    for current in nodes:
        if isinstance(current, (And, Or)):
            if not isinstance(current.children, tuple) or not current.children:
                raise ParseError(f"{type(current).__name__} needs a non-empty tuple of operands, "
                                 f"not {current.children!r}")
            continue
        if not isinstance(current, Pred):
            continue
        if not isinstance(current.attr, str):
            raise TypeError(f"an attribute name is a str, not {type(current.attr).__name__} {current.attr!r}")
        if not current.attr:
            raise ParseError("empty attribute name")
        if not isinstance(current.op, Op):
            raise TypeError(f"a predicate's operator is an engine.expr.Op, not {current.op!r}")
        if not isinstance(current.values, tuple):
            raise TypeError(f"a predicate's operands are a tuple, not {type(current.values).__name__}")
        for value in current.values:
            if not isinstance(value, (bool, int, float, str)):
                raise TypeError(f"operand {value!r} of {current.attr!r} is a {type(value).__name__}, "
                                f"not a number, string or boolean")
        n = len(current.values)
        wanted = _ARITY.get(current.op, None if current.op in SET_OPS or current.op in LIST_SET_OPS else 1)
        if (wanted is None and n == 0) or (wanted is not None and n != wanted):
            raise ParseError(f"{current.op.value} on {current.attr!r} takes "
                             f"{'one or more' if wanted is None else wanted} operand(s), not {n}")
        if current.op in PATTERN_OPS and isinstance(current.values[0], str):
            like = current.op in (Op.LIKE, Op.NOT_LIKE)
            reason = pattern_error("like" if like else "regex", current.values[0])
            if reason is not None:
                raise ParseError(f"{'LIKE pattern' if like else 'invalid RE2 pattern'} "
                                 f"{shortened(repr(current.values[0]))} on {current.attr!r}"
                                 f"{' does not compile to RE2' if like else ''}: {reason}")


class AstChecks:
    """`check_nesting` and `check_shape` over a batch of ASTs that may share
    nodes (an application that builds its rules in code reuses one object
    for a segment many rules name): each distinct node -- by identity -- is
    checked and measured once per batch, so a batch costs its distinct
    nodes, not its expressions' sizes.  ``checks(node)`` raises as the two
    checks would, and returns the predicates of ``node`` that no earlier
    call of this batch met (each once), the ones the schema must see."""

    def __init__(self):
        # the nodes of ASTs that passed, by id; held, so that no id of theirs is given to a new object
        self.done: dict[int, Node] = {}
        self.depths: dict[int, int] = {}
        self.sizes: dict[int, int] = {}
        #: whether a node of the batch came more than once (in one AST or in several)
        self.shared = False

    def __call__(self, node: Node) -> list:
        if not isinstance(node, (Pred, Not, And, Or, Xor, Xnor)):
            raise TypeError(f"an expression is text or an engine.expr node, not {type(node).__name__}")
        done = self.done
        if id(node) not in done and (node.__class__ is And or node.__class__ is Or) \
                and isinstance(node.children, tuple) and all(id(child) in done for child in node.children):
            nodes = [node]              # the common case of shared ASTs: a new root over known nodes
        else:
            nodes = _distinct_nodes(node, done)
        try:
            _check_nesting(node, nodes, self.depths, self.sizes)
            _check_shape(nodes)
        except BaseException:
            for current in nodes:    # (measures of nodes not kept: their ids may name other objects later)
                self.depths.pop(id(current), None)
                self.sizes.pop(id(current), None)
            raise
        # (only now: the nodes of an AST that fails are checked again where they come back)
        self.done.update(zip(map(id, nodes), nodes))
        # its size counts a node once per path to it: more than the nodes met means some came again
        self.shared = self.shared or self.sizes.get(id(node), 1) > len(nodes)
        return [current for current in nodes if isinstance(current, Pred)]

