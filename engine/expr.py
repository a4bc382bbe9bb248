"""The expression AST and its normal forms.

This module owns the in-memory shape of a subscription (DESIGN.md §2):
predicates over one attribute, combined by NOT, AND, OR, XOR and XNOR, and
the rewrites every algorithm relies on:

* negation normal form (NNF), with every negation folded into a predicate
  (A-Tree's zero-suppression, `atree.txt` §3);
* disjunctive and conjunctive normal forms with an explicit size limit
  (OpIndex §6.1, BE-Tree's DNF route);
* predicate -> one-dimensional interval (BE-Tree Table 1) and the merge of
  several predicates on one attribute inside a conjunction.

Literals are Python values: ``int``/``float`` (numeric family), ``str``
(string family) and ``bool`` (boolean family).  ``bool`` is checked before
``int`` everywhere because ``True == 1`` in Python.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Union

Literal = Union[int, float, str, bool]


class Op(enum.Enum):
    """Predicate operators.  ``NOT_MATCHES`` has no text syntax of its own:
    it is what ``NOT (a MATCHES r)`` becomes in NNF."""

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
}

COMPARISON_OPS = frozenset({Op.EQ, Op.NE, Op.LT, Op.LE, Op.GT, Op.GE})
SET_OPS = frozenset({Op.IN, Op.NOT_IN})
RANGE_OPS = frozenset({Op.BETWEEN, Op.NOT_BETWEEN})
PATTERN_OPS = frozenset({Op.LIKE, Op.NOT_LIKE, Op.MATCHES, Op.NOT_MATCHES})
NULL_OPS = frozenset({Op.IS_NULL, Op.IS_NOT_NULL})


class Family(enum.Enum):
    """Type families of DESIGN.md §2; an attribute has exactly one."""

    NUMERIC = "numeric"
    STRING = "string"
    BOOLEAN = "boolean"


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

    ``values`` holds the operands: one for a comparison, LIKE or MATCHES, the
    list for IN, ``(low, high)`` for BETWEEN, nothing for IS [NOT] NULL.
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


def _distinct_nodes(node: Node):
    """Every node of ``node``, children before their parent, with an
    explicit stack instead of recursion.  A connective shared by several
    parents is visited once, so an AST that is a DAG costs its number of
    distinct connectives, not its number of paths (a predicate comes once
    per parent); a cycle is a ValueError."""
    if isinstance(node, Pred):
        yield node
        return
    finished: set[int] = set()
    open_ancestors: set[int] = set()     # expanded, their children not all yielded yet
    stack = [(node, False)]
    while stack:
        current, expanded = stack.pop()
        key = id(current)
        if expanded:
            open_ancestors.discard(key)
            finished.add(key)
            yield current
        elif key not in finished:
            if key in open_ancestors:
                raise ValueError("an expression cannot contain itself")
            open_ancestors.add(key)
            stack.append((current, True))
            for child in _children(current):
                if isinstance(child, Pred):
                    yield child
                else:
                    stack.append((child, False))


#: the most nodes an expression may have, counting a subtree shared by
#: several parents once per parent (a text of a few megabytes)
MAX_NODES = 2_000_000


def check_nesting(node: Node) -> None:
    """Raise `errors.ExpressionTooLarge` when ``node`` is nested deeper than
    `MAX_NESTING`, or has more than `MAX_NODES` nodes once shared subtrees
    are repeated.  Computed without recursion, so that this can run before
    any recursive code sees the expression."""
    from engine.errors import ExpressionTooLarge

    depths: dict[int, int] = {}     # id of a connective -> its depth; a predicate's is 0
    sizes: dict[int, int] = {}      # id of a connective -> its node count with shared subtrees repeated
    for current in _distinct_nodes(node):
        if not isinstance(current, Pred):
            children = _children(current)
            depths[id(current)] = 1 + max((depths.get(id(child), 0) for child in children), default=0)
            sizes[id(current)] = 1 + sum(sizes.get(id(child), 1) for child in children)
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
    from engine.errors import ParseError

    for current in _distinct_nodes(node):
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
# DESIGN.md §2,
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


# ---------------------------------------------------------------------------
# Intervals (BE-Tree Table 1) and the merge of a conjunction's predicates
# ---------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Interval:
    """A one-dimensional interval of an ordered domain (numbers, strings by
    code point, booleans with FALSE < TRUE).  ``None`` for an unbounded end;
    the ``*_closed`` flag of an unbounded end is False.  ``lo > hi`` (or
    ``lo == hi`` with an open end) is the empty interval."""

    lo: Literal | None
    hi: Literal | None
    lo_closed: bool = False
    hi_closed: bool = False

    @property
    def is_empty(self) -> bool:
        if self.lo is None or self.hi is None:
            return False
        if self.lo > self.hi:
            return True
        return self.lo == self.hi and not (self.lo_closed and self.hi_closed)

    @property
    def is_whole(self) -> bool:
        return self.lo is None and self.hi is None

    def contains(self, value: Literal) -> bool:
        if self.lo is not None and not (value >= self.lo if self.lo_closed else value > self.lo):
            return False
        if self.hi is not None and not (value <= self.hi if self.hi_closed else value < self.hi):
            return False
        return True


#: the whole domain, (v_min, v_max) in BE-Tree Table 1.
WHOLE_DOMAIN = Interval(None, None, False, False)

_WHOLE_DOMAIN_OPS = frozenset({Op.NE, Op.NOT_IN, Op.NOT_BETWEEN, Op.LIKE, Op.NOT_LIKE,
                               Op.MATCHES, Op.NOT_MATCHES, Op.IS_NOT_NULL})


def to_interval(pred: Pred) -> Interval | None:
    """The one-dimensional interval of a predicate, after BE-Tree Table 1.

    The interval is a *superset* of the values that make the predicate TRUE,
    so it is a filter: a present value outside it never satisfies the
    predicate.  It is exact for the range operators (``<``, ``<=``, ``=``,
    ``>``, ``>=``, BETWEEN).  As in Table 1, ``!=`` and NOT IN span the whole
    domain (v_min, v_max) and IN spans [v_1, v_k] (smallest to largest
    value); NOT BETWEEN, LIKE, NOT LIKE, MATCHES, NOT MATCHES and IS NOT NULL
    also span the whole domain.  Unlike Table 1's integer domain
    (``< v`` as [v_min, v - 1]) the domain here is continuous, so strict
    bounds are open ends.  ``BETWEEN lo AND hi`` with ``lo > hi`` is the
    empty interval ``[lo, hi]``.

    IS NULL has no interval (``None``): it is satisfied only by an absent
    attribute, never by a value.
    """
    op, vs = pred.op, pred.values
    if op is Op.IS_NULL:
        return None
    if op in _WHOLE_DOMAIN_OPS:
        return WHOLE_DOMAIN
    if op is Op.LT:
        return Interval(None, vs[0], False, False)
    if op is Op.LE:
        return Interval(None, vs[0], False, True)
    if op is Op.GT:
        return Interval(vs[0], None, False, False)
    if op is Op.GE:
        return Interval(vs[0], None, True, False)
    if op is Op.EQ:
        return Interval(vs[0], vs[0], True, True)
    if op is Op.IN:
        _one_family(pred.attr, vs)
        return Interval(min(vs), max(vs), True, True)
    if op is Op.BETWEEN:
        _one_family(pred.attr, vs)
        return Interval(vs[0], vs[1], True, True)
    raise ValueError(f"unknown operator {op!r}")


def _one_family(attr: str, values) -> Family | None:
    families = {literal_family(v) for v in values}
    if len(families) > 1:
        names = ", ".join(sorted(f.name.lower() for f in families))
        raise TypeError(f"attribute {attr!r} compared with values of several type families ({names})")
    return next(iter(families), None)


_LIKE_CACHE: dict = {}


def _like_regex(pattern: str):
    """LIKE pattern as a compiled Python regex (``%`` any run, ``_`` one
    character, case-sensitive, no escape character)."""
    rx = _LIKE_CACHE.get(pattern)
    if rx is None:
        import re

        body = "".join(".*" if c == "%" else "." if c == "_" else re.escape(c) for c in pattern)
        rx = _LIKE_CACHE[pattern] = re.compile(body, re.DOTALL)
    return rx


def _holds(pred: Pred, v: Literal) -> bool | None:
    """Is ``pred`` TRUE for the present value ``v``?  ``None`` when that
    cannot be decided here (MATCHES without the re2 module)."""
    op, vs = pred.op, pred.values
    if op is Op.EQ:
        return v == vs[0]
    if op is Op.NE:
        return v != vs[0]
    if op is Op.LT:
        return v < vs[0]
    if op is Op.LE:
        return v <= vs[0]
    if op is Op.GT:
        return v > vs[0]
    if op is Op.GE:
        return v >= vs[0]
    if op is Op.IN:
        return any(v == x for x in vs)
    if op is Op.NOT_IN:
        return all(v != x for x in vs)
    if op is Op.BETWEEN:
        return vs[0] <= v <= vs[1]
    if op is Op.NOT_BETWEEN:
        return not (vs[0] <= v <= vs[1])
    if op is Op.LIKE:
        return _like_regex(vs[0]).fullmatch(v) is not None
    if op is Op.NOT_LIKE:
        return _like_regex(vs[0]).fullmatch(v) is None
    if op in (Op.MATCHES, Op.NOT_MATCHES):
        try:
            import re2
        except ImportError:          # pragma: no cover - re2 is a dependency
            return None
        found = re2.search(vs[0], v) is not None
        return found if op is Op.MATCHES else not found
    if op is Op.IS_NOT_NULL:
        return True
    if op is Op.IS_NULL:
        return False
    raise ValueError(f"unknown operator {op!r}")


def merge_conjunction(preds) -> tuple[Pred, ...] | None:
    """Merge the predicates of one conjunction attribute by attribute.

    The result is TRUE on an event iff the original conjunction is (exactly,
    under three-valued logic); ``None`` when the conjunction can never be
    TRUE (``a = 5 AND a > 7``, ``a IS NULL AND a = 1``, an empty interval or
    an empty set).  Attributes keep the order of their first appearance.

    Per attribute:

    * IS NULL with any other predicate on the attribute is a contradiction
      (every other operator is NULL or FALSE on an absent attribute).
    * IS NOT NULL is implied by any other predicate and dropped then.
    * EQ and IN give a finite candidate set (BE-Tree Table 1's [v_1, v_k]
      is its hull); for a boolean attribute the domain {FALSE, TRUE} is the
      candidate set.  The set is filtered by every other predicate on the
      attribute and becomes one ``=`` or ``IN`` predicate (or ``None`` when
      empty): ``a IN (1,2,3) AND a != 2 AND a <= 2`` -> ``a IN (1)`` ... which
      is emitted as ``a = 1``.
    * Otherwise the range operators (``<``, ``<=``, ``>``, ``>=``, BETWEEN)
      intersect into the tightest lower and upper bound, emitted as
      ``BETWEEN`` when both ends are closed and as one or two comparisons
      otherwise (open ends cannot be a BETWEEN).  ``!=`` / NOT IN values
      outside the interval are dropped and those on a closed end open it;
      NOT BETWEEN ranges disjoint from the interval are dropped and those
      covering an end cut it.  A single-point interval becomes a set.
    * Predicates that cannot be merged exactly (LIKE, NOT LIKE, MATCHES,
      NOT MATCHES, NOT BETWEEN strictly inside the interval) are kept as
      they are, de-duplicated.

    The domain is treated as continuous (numbers are reals, not integers),
    so ``a > 3 AND a < 4`` is kept.  Raises ``TypeError`` when one attribute
    is compared with values of different type families in the conjunction.
    """
    groups: dict[str, list[Pred]] = {}
    for p in preds:
        groups.setdefault(p.attr, []).append(p)
    out: list[Pred] = []
    for attr, group in groups.items():
        merged = _merge_attr(attr, list(dict.fromkeys(group)))
        if merged is None:
            return None
        out.extend(merged)
    return tuple(out)


def _unique_values(values) -> list:
    """Values with numeric duplicates (1 and 1.0) removed, first kept."""
    out = []
    for v in values:
        if not any(v == w for w in out):
            out.append(v)
    return out


def _emit_set(attr: str, candidates, preds) -> list[Pred] | None:
    kept: list = []
    undecided: list[Pred] = []
    for v in candidates:
        ok = True
        for p in preds:
            r = _holds(p, v)
            if r is None:
                if p not in undecided:
                    undecided.append(p)
            elif not r:
                ok = False
                break
        if ok:
            kept.append(v)
    if not kept:
        return None
    kept = sorted(_unique_values(kept))
    head = Pred(attr, Op.EQ, (kept[0],)) if len(kept) == 1 else Pred(attr, Op.IN, tuple(kept))
    return [head] + undecided


def _merge_attr(attr: str, preds: list[Pred]) -> list[Pred] | None:
    ops = {p.op for p in preds}
    if Op.IS_NULL in ops:
        return None if len(preds) > 1 else preds
    family = _one_family(attr, [v for p in preds for v in p.values])
    if family is not None and family is not Family.STRING and ops & PATTERN_OPS:
        raise TypeError(f"pattern operator on non-string attribute {attr!r}")
    if ops & PATTERN_OPS:
        family = Family.STRING
    preds = [p for p in preds if p.op is not Op.IS_NOT_NULL]
    if not preds:
        return [Pred(attr, Op.IS_NOT_NULL, ())]

    # Finite candidate set: the boolean domain, EQ and IN.
    candidates = [False, True] if family is Family.BOOLEAN else None
    for p in preds:
        if p.op in (Op.EQ, Op.IN):
            vals = _unique_values(p.values)
            candidates = vals if candidates is None else [v for v in candidates if any(v == w for w in vals)]
    if candidates is not None:
        out = _emit_set(attr, candidates, preds)
        if out is not None and family is Family.BOOLEAN and out[0].op is Op.IN:
            return [Pred(attr, Op.IS_NOT_NULL, ())]    # both values allowed: presence only
        return out

    # Interval from the range operators.
    lo = hi = None
    lc = hc = False
    excluded: list = []
    not_between: list[Pred] = []
    residual: list[Pred] = []

    def lower(v, closed):
        nonlocal lo, lc
        if lo is None or v > lo or (v == lo and not closed):
            lo, lc = v, closed

    def upper(v, closed):
        nonlocal hi, hc
        if hi is None or v < hi or (v == hi and not closed):
            hi, hc = v, closed

    for p in preds:
        op, vs = p.op, p.values
        if op is Op.LT:
            upper(vs[0], False)
        elif op is Op.LE:
            upper(vs[0], True)
        elif op is Op.GT:
            lower(vs[0], False)
        elif op is Op.GE:
            lower(vs[0], True)
        elif op is Op.BETWEEN:
            lower(vs[0], True)
            upper(vs[1], True)
        elif op in (Op.NE, Op.NOT_IN):
            excluded.extend(vs)
        elif op is Op.NOT_BETWEEN:
            if not vs[0] > vs[1]:          # an empty range excludes nothing
                not_between.append(p)
        else:
            residual.append(p)
    excluded = _unique_values(excluded)

    def empty():
        return Interval(lo, hi, lc, hc).is_empty

    changed = True
    while changed and not empty():
        changed = False
        iv = Interval(lo, hi, lc, hc)
        kept_ex = []
        for v in excluded:
            if not iv.contains(v):
                changed = True                       # outside: irrelevant
            elif v == lo and lc:
                lc, changed = False, True           # closed end opened
            elif v == hi and hc:
                hc, changed = False, True
            else:
                kept_ex.append(v)
        excluded = kept_ex
        if changed:
            continue
        kept_nb = []
        for p in not_between:
            x, y = p.values
            covers_lo = lo is not None and x <= lo   # [x, y] reaches below the interval
            covers_hi = hi is not None and y >= hi
            disjoint = ((hi is not None and (x > hi or (x == hi and not hc)))
                        or (lo is not None and (y < lo or (y == lo and not lc))))
            if disjoint:
                changed = True
            elif covers_lo and covers_hi:
                return None
            elif covers_lo:
                lo, lc, changed = y, False, True
            elif covers_hi:
                hi, hc, changed = x, False, True
            else:
                kept_nb.append(p)
        not_between = kept_nb
    if empty():
        return None
    if lo is not None and hi is not None and lo == hi:     # a single point
        return _emit_set(attr, [lo], preds)

    out: list[Pred] = []
    if lo is not None and hi is not None and lc and hc:
        out.append(Pred(attr, Op.BETWEEN, (lo, hi)))
    else:
        if lo is not None:
            out.append(Pred(attr, Op.GE if lc else Op.GT, (lo,)))
        if hi is not None:
            out.append(Pred(attr, Op.LE if hc else Op.LT, (hi,)))
    if len(excluded) == 1:
        out.append(Pred(attr, Op.NE, (excluded[0],)))
    elif excluded:
        out.append(Pred(attr, Op.NOT_IN, tuple(sorted(excluded))))
    out.extend(not_between)
    out.extend(residual)
    return out or [Pred(attr, Op.IS_NOT_NULL, ())]


_ARITY = {Op.IS_NULL: 0, Op.IS_NOT_NULL: 0, Op.BETWEEN: 2, Op.NOT_BETWEEN: 2}


def check_shape(node: Node) -> None:
    """Refuse an AST the parser could not have built, before anything reads
    it (an index must not guess what it means): ``TypeError`` for what is
    not a node, an operator or a literal; `errors.ParseError` for a
    predicate with an empty attribute name, the wrong number of operands or
    an invalid RE2 pattern, and for an AND/OR without operands.  Without
    recursion, like `check_nesting` (which also refuses cycles)."""
    import re2

    from engine.errors import ParseError

    check_text(node)            # first: RE2 cannot even read a pattern that is not valid Unicode
    for current in _distinct_nodes(node):
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
        wanted = _ARITY.get(current.op, None if current.op in SET_OPS else 1)
        if (wanted is None and n == 0) or (wanted is not None and n != wanted):
            raise ParseError(f"{current.op.value} on {current.attr!r} takes "
                             f"{'one or more' if wanted is None else wanted} operand(s), not {n}")
        if current.op in (Op.MATCHES, Op.NOT_MATCHES) and isinstance(current.values[0], str):
            options = re2.Options()
            options.log_errors = False
            try:
                re2.compile(current.values[0], options)
            except re2.error as error:
                raise ParseError(f"invalid RE2 pattern {current.values[0]!r} on {current.attr!r}: {error}") \
                    from None
