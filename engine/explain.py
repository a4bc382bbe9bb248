"""Why a subscription matches an event, or does not (``Index.explain``).

The expression is the one the index holds -- rebuilt from its compiled
program, so in negation normal form (``NOT`` pushed down to the
predicates, as the index evaluates it) -- and every node carries its value
on the event under SQL's three-valued logic (docs/language.md): ``True``,
``False`` or ``None`` (NULL).  A NULL predicate names the attribute the
event lacks.  The values are the reference evaluator's
(:mod:`engine.reference`), which the test suite holds every algorithm to,
so the root's value is TRUE exactly when ``match`` reports the
subscription.

An :class:`Explanation` is data (``to_dict()``, fields) and prints as an
indented tree::

    TRUE   AND
    TRUE     price <= 580
    TRUE     color = 'silver'
    NULL     brand IN ('a', 'b')        -- brand is absent
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field

from engine.events import plain_value
from engine.expr import And, Node, Not, Or, Pred, Xnor, Xor
from engine.parse import to_text
from engine.reference import _predicate

#: how a value prints
WORDS = {True: "TRUE", False: "FALSE", None: "NULL"}


@dataclass(frozen=True)
class Explanation:
    """One node of an explained expression.

    ``kind``: ``"predicate"``, ``"AND"``, ``"OR"``, ``"XOR"``, ``"XNOR"`` or
    ``"NOT"``; ``node``: the expression node; ``text``: its expression text
    (printed when first asked for: a connective's text holds its whole
    subtree's, so printing every node's up front cost depth x size --
    20 s for a valid expression 200 levels deep); ``value``: True, False
    or None (NULL); ``absent``: for a predicate that is NULL because the
    event lacks its attribute, that attribute (else None); ``children``:
    the operands of a connective."""

    kind: str
    node: Node = field(repr=False)
    value: bool | None
    absent: str | None = None
    children: tuple["Explanation", ...] = ()

    @functools.cached_property
    def text(self) -> str:
        return to_text(self.node)

    @property
    def matches(self) -> bool:
        """Whether the subscription matches: its expression is TRUE."""
        return self.value is True

    def to_dict(self) -> dict:
        """Plain data: ``{"kind", "text", "value", "absent", "children"}``,
        ``value`` as ``"TRUE"``/``"FALSE"``/``"NULL"`` (JSON-ready)."""
        return {"kind": self.kind, "text": self.text, "value": WORDS[self.value], "absent": self.absent,
                "children": [child.to_dict() for child in self.children]}

    def lines(self, depth: int = 0) -> list[str]:
        label = self.text if self.kind == "predicate" else self.kind
        note = f"        -- {self.absent} is absent" if self.absent is not None else ""
        out = [f"{WORDS[self.value]:<6} {'  ' * depth}{label}{note}"]
        for child in self.children:
            out += child.lines(depth + 1)
        return out

    def __str__(self) -> str:
        return "\n".join(self.lines())


def explain(node: Node, event: dict) -> Explanation:
    """``node`` explained on ``event`` (a dict; a missing or None value is
    an absent attribute; NumPy and decimal values read as the encoder reads
    them, :func:`engine.events.plain_value`)."""
    if isinstance(node, Pred):
        value = plain_value(event.get(node.attr))
        truth = _predicate(node, value)
        absent = node.attr if truth is None and value is None else None
        return Explanation("predicate", node, truth, absent)
    if isinstance(node, Not):
        child = explain(node.child, event)
        return Explanation("NOT", node, None if child.value is None else not child.value, None, (child,))
    if isinstance(node, (And, Or)):
        children = tuple(explain(c, event) for c in node.children)
        values = [c.value for c in children]
        decisive = False if isinstance(node, And) else True
        if any(v is decisive for v in values):
            value = decisive
        elif any(v is None for v in values):
            value = None
        else:
            value = not decisive
        return Explanation("AND" if isinstance(node, And) else "OR", node, value, None, children)
    if isinstance(node, (Xor, Xnor)):
        left, right = explain(node.left, event), explain(node.right, event)
        if left.value is None or right.value is None:
            value = None
        else:
            value = (left.value != right.value) if isinstance(node, Xor) else (left.value == right.value)
        return Explanation("XOR" if isinstance(node, Xor) else "XNOR", node, value, None, (left, right))
    raise TypeError(f"not an expression node: {node!r}")


__all__ = ["Explanation", "explain"]
