"""The slow, obviously correct evaluator of the language in docs/language.md (the tests, and Index.explain).

Every matching algorithm is checked against this module, and this module is
checked against DuckDB (`tests/sql_oracle.py`).  It walks the AST directly,
with no normal form, no compilation and no shared code with the engine's
matching path: LIKE is a dynamic-programming matcher written here (not a
regex translation), MATCHES is ``re2.search``.

Three-valued logic: ``True``, ``False`` and ``None`` (SQL NULL).  An
attribute that is missing from the event, or whose value is ``None``, is
NULL.
"""

from __future__ import annotations

import numbers

import re2

from engine.expr import LIST_OPS, QUIET_RE2, And, Node, Not, Op, Or, Pred, Xnor, Xor

__all__ = ["evaluate", "matches", "like"]


def matches(node: Node, event: dict) -> bool:
    """Does ``node`` match ``event``, i.e. evaluate to TRUE?"""
    return evaluate(node, event) is True


def evaluate(node: Node, event: dict):
    """``True``, ``False`` or ``None`` (NULL) under SQL three-valued logic."""
    if isinstance(node, Pred):
        truth = _predicate(node, event.get(node.attr))
        return None if truth is None else bool(truth)      # (NumPy operands give NumPy booleans)
    if isinstance(node, Not):
        value = evaluate(node.child, event)
        return None if value is None else not value
    if isinstance(node, And):
        values = [evaluate(c, event) for c in node.children]
        if any(v is False for v in values):
            return False
        if any(v is None for v in values):
            return None
        return True
    if isinstance(node, Or):
        values = [evaluate(c, event) for c in node.children]
        if any(v is True for v in values):
            return True
        if any(v is None for v in values):
            return None
        return False
    if isinstance(node, (Xor, Xnor)):
        left = evaluate(node.left, event)
        right = evaluate(node.right, event)
        if left is None or right is None:
            return None
        return (left != right) if isinstance(node, Xor) else (left == right)
    raise TypeError(f"not an expression node: {node!r}")


def _family(value) -> str:
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, numbers.Real):
        return "numeric"
    if isinstance(value, str):
        return "string"
    raise TypeError(f"not a value of any type family: {value!r} ({type(value).__name__})")


def _same_family(attr: str, value, literals) -> None:
    got = _family(value)
    for lit in literals:
        if _family(lit) != got:
            raise TypeError(f"attribute {attr!r}: value {value!r} ({got}) compared with "
                            f"{lit!r} ({_family(lit)})")


def _list_predicate(pred: Pred, value):
    """A list predicate on an event list (any iterable; None elements are
    ignored, repeated ones count once): DuckDB's list_has_any,
    list_has_all, list_contains and len, negated where the operator is."""
    if isinstance(value, (str, bytes)) or not hasattr(value, "__iter__"):
        raise TypeError(f"attribute {pred.attr!r}: {value!r} is not a list")
    elements = [v for v in value if v is not None]
    for v in elements:
        _same_family(pred.attr, v, pred.values)
    op = pred.op
    if op in (Op.IS_EMPTY, Op.IS_NOT_EMPTY):
        return (not elements) == (op is Op.IS_EMPTY)
    found = [any(v == element for element in elements) for v in pred.values]
    if op in (Op.ONE_OF, Op.CONTAINS):
        return any(found)
    if op in (Op.NONE_OF, Op.NOT_CONTAINS):
        return not any(found)
    if op is Op.ALL_OF:
        return all(found)
    if op is Op.NOT_ALL_OF:
        return not all(found)
    raise ValueError(f"unknown list operator {op!r}")


def _predicate(pred: Pred, value):
    op, vs = pred.op, pred.values
    if op is Op.IS_NULL:
        return value is None
    if op is Op.IS_NOT_NULL:
        return value is not None
    if value is None:
        return None
    if op in LIST_OPS:
        return _list_predicate(pred, value)
    if isinstance(value, (list, tuple, set, frozenset)):
        raise TypeError(f"attribute {pred.attr!r}: {op.value} does not apply to a list {value!r}")
    _same_family(pred.attr, value, vs)
    if op is Op.EQ:
        return value == vs[0]
    if op is Op.NE:
        return value != vs[0]
    if op is Op.LT:
        return value < vs[0]
    if op is Op.LE:
        return value <= vs[0]
    if op is Op.GT:
        return value > vs[0]
    if op is Op.GE:
        return value >= vs[0]
    if op is Op.IN:
        return any(value == v for v in vs)
    if op is Op.NOT_IN:
        return not any(value == v for v in vs)
    if op is Op.BETWEEN:
        return vs[0] <= value and value <= vs[1]
    if op is Op.NOT_BETWEEN:
        return not (vs[0] <= value and value <= vs[1])
    if op is Op.LIKE:
        return like(value, vs[0])
    if op is Op.NOT_LIKE:
        return not like(value, vs[0])
    if op is Op.MATCHES:
        return re2.search(vs[0], value, QUIET_RE2) is not None      # (explain() reads it: no stderr noise)
    if op is Op.NOT_MATCHES:
        return re2.search(vs[0], value, QUIET_RE2) is None
    raise ValueError(f"unknown operator {op!r}")


def like(value: str, pattern: str) -> bool:
    """SQL LIKE: ``%`` matches any run of characters (also none), ``_``
    exactly one character, every other character itself (case-sensitive);
    there is no escape character.

    Dynamic programming over prefixes: ``row[j]`` is whether
    ``value[:i]`` matches ``pattern[:j]`` for the current ``i``.
    """
    m = len(pattern)
    # i = 0: the empty value matches a pattern prefix made of '%' only.
    row = [True] + [False] * m
    for j in range(1, m + 1):
        row[j] = row[j - 1] and pattern[j - 1] == "%"
    for ch in value:
        new = [False] * (m + 1)
        for j in range(1, m + 1):
            p = pattern[j - 1]
            if p == "%":
                # '%' matches nothing (new[j-1]) or one more character (row[j]).
                new[j] = new[j - 1] or row[j]
            elif p == "_" or p == ch:
                new[j] = row[j - 1]
        row = new
    return row[m]
