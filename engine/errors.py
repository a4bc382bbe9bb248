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
    """A value whose type family does not fit its attribute (DESIGN.md §2),
    or a literal that bexmatch cannot represent exactly."""


class ExpressionTooLarge(BexmatchError, ValueError):
    """A normal-form rewrite (DNF, CNF) would exceed its stated size limit."""


class IndexFileError(BexmatchError, ValueError):
    """A saved index that is truncated, corrupt or not a bexmatch index."""


class BackendUnavailable(BexmatchError, RuntimeError):
    """A backend or algorithm that cannot run here; the message says what is missing."""
