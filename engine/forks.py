"""What a forked child makes anew.

A process forked after threads ran (multiprocessing's default start method
on Linux) copies every lock and object but only the forking thread.  A
lock another thread held at the fork stays held in the child for ever, and
a thread an object relies on is not there.  An object whose state must be
renewed in a child registers here with the method that renews it; the
child calls it for every such object still alive (weakly held: registering
keeps nothing alive)."""

from __future__ import annotations

import os
import weakref
from collections.abc import Callable

#: object -> what renews it in a forked child
_RENEW: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def renew_after_fork(obj: object, renew: Callable[[object], None]) -> None:
    """Have ``renew(obj)`` run in every process forked from this one while
    ``obj`` is alive."""
    _RENEW[obj] = renew


def _after_fork() -> None:
    for obj, renew in list(_RENEW.items()):
        renew(obj)


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork)

__all__ = ["renew_after_fork"]
