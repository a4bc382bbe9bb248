"""The exceptions bexmatch raises for bad input.

Every error a caller can provoke with bad data is one of these, so that a
service can tell "your input is wrong" from "bexmatch is broken".
"""

from __future__ import annotations


class BexmatchError(Exception):
    """Base class of every error bexmatch raises on bad input."""


class ParseError(BexmatchError, ValueError):
    """A malformed expression.

    ``line`` and ``column`` are 1-based and point at the offending character;
    ``expected`` names what the grammar would have accepted there.
    """

    def __init__(self, message: str, *, text: str = "", line: int = 0, column: int = 0,
                 expected: tuple[str, ...] = ()):
        self.text = text
        self.line = line
        self.column = column
        self.expected = tuple(expected)
        where = f" at line {line}, column {column}" if line else ""
        wanted = f"; expected one of: {', '.join(self.expected)}" if self.expected else ""
        super().__init__(f"{message}{where}{wanted}")


class SchemaError(BexmatchError, ValueError):
    """A value whose type family does not fit its attribute (docs/language.md#types-and-type-families),
    or a literal that bexmatch cannot represent exactly."""


class BadEventError(SchemaError):
    """One event of a batch that its attributes cannot take: a value of the
    wrong type family, a lone surrogate, a number float64 cannot hold as it
    is (engine/events.py), an event that is not a mapping, an attribute
    given twice.

    Fields, for code that acts on the error instead of reading its text:

    * ``event``: the event's 0-based position in the batch;
    * ``attribute``: the attribute's name, or None when the problem is the
      event itself (not a mapping);
    * ``value``: the refused value (None when there is no one value);
    * ``reason``: what is wrong, in words, without the position (it names
      the attribute: ``"attribute 'price' is numeric, got 'cheap'"``).

    ``str(error)`` is ``"event 3: " + reason``, and a hint on what to do.
    """

    def __init__(self, event: int, attribute: str | None, value: object, reason: str, hint: str = ""):
        self.event = int(event)
        self.attribute = attribute
        self.value = value
        self.reason = reason
        self.hint = hint
        super().__init__(f"event {self.event}: {reason}{hint}")

    def __reduce__(self):
        return type(self), (self.event, self.attribute, self.value, self.reason, self.hint)


class ExpressionTooLarge(BexmatchError, ValueError):
    """A normal-form rewrite (DNF, CNF) would exceed its stated size limit."""


class IndexFileError(BexmatchError, ValueError):
    """A saved index that is truncated, corrupt or not a bexmatch index."""


class BackendUnavailable(BexmatchError, RuntimeError):
    """A backend or algorithm that cannot run here; the message says what is missing."""
