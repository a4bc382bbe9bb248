"""bexmatch: match streams of events against millions of standing Boolean
expressions (docs/README.md).  The public API (docs/architecture.md#the-public-api)::

    from engine import Index, ParseError, ALGORITHMS, available_backends
    from engine import EventStream      # single events gathered into batches (engine/streaming.py)
    from engine import validate         # check an expression without adding it
    from engine import rules_to_columnar  # a rules table (one row per rule) as columnar subscriptions
    from engine import DeviceMap        # sparse events on the GPU: a map column in CSR form (engine/device_maps.py)

``import engine`` never needs a GPU: CUDA is touched only when the ``cuda``
backend is asked for.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from engine._version import __version__
from engine.algorithms import ALGORITHMS
from engine.backend import available_backends
from engine.device_maps import DeviceMap
from engine.errors import (BackendUnavailable, BadEventError, BexmatchError, ExpressionTooLarge, IndexFileError,
                           ParseError, SchemaError)
from engine.index import Index
from engine.rules import rules_to_columnar
from engine.streaming import EventStream

if TYPE_CHECKING:
    from collections.abc import Iterable

    from engine.expr import Node


def warmup(algorithms: Iterable[str] | None = None, backend: str | None = None) -> dict[str, float]:
    """Compile (or load from numba's cache) the kernels of every algorithm
    on ``backend`` -- or of those named -- up front, so that the first real
    ``match_batch`` does not pay for it; ``{algorithm: seconds}``
    (:mod:`engine.warm_up`)."""
    from engine.warm_up import warmup as run
    return run(algorithms, backend)


def validate(expression: str | Node) -> Node:
    """Check an expression without adding it anywhere: its AST (an
    :mod:`engine.expr` node) when it is valid, else the error ``add`` would
    raise for it -- :class:`ParseError` (with the position and what was
    expected), :class:`ExpressionTooLarge` past the nesting and size
    limits, ``TypeError`` for what is neither text nor an expression node.
    What depends on an index -- an attribute used with another type family
    there, an algorithm's rewrite limit under ``strict`` -- is checked by
    that index's ``add``.  ``engine.parse.to_text`` prints an AST back."""
    if isinstance(expression, str):
        from engine.parse import parse        # (the grammar's tables are built on first use)
        return parse(expression)
    from engine.index import _checked_ast
    return _checked_ast(expression)


__all__ = ["ALGORITHMS", "BackendUnavailable", "BadEventError", "BexmatchError", "DeviceMap", "EventStream",
           "ExpressionTooLarge", "Index", "IndexFileError", "ParseError", "SchemaError", "__version__",
           "available_backends", "rules_to_columnar", "validate", "warmup"]
