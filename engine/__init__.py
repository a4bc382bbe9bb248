"""bexmatch: match streams of events against millions of standing Boolean
expressions (docs/README.md).  The public API (docs/architecture.md#the-public-api)::

    from engine import Index, ParseError, ALGORITHMS, available_backends
    from engine import EventStream      # single events gathered into batches (engine/streaming.py)

``import engine`` never needs a GPU: CUDA is touched only when the ``cuda``
backend is asked for.
"""

from engine._version import __version__
from engine.algorithms import ALGORITHMS
from engine.backend import available_backends
from engine.errors import (BackendUnavailable, BadEventError, BexmatchError, ExpressionTooLarge, IndexFileError,
                           ParseError, SchemaError)
from engine.index import Index
from engine.streaming import EventStream

__all__ = ["ALGORITHMS", "BackendUnavailable", "BadEventError", "BexmatchError", "EventStream", "ExpressionTooLarge",
           "Index", "IndexFileError", "ParseError", "SchemaError", "__version__", "available_backends"]
