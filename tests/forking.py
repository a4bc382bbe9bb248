"""Running a piece of a test in a forked child (what multiprocessing's
default start method does on Linux), for the tests of what survives a fork."""

from __future__ import annotations

import faulthandler
import os
import warnings
from collections.abc import Callable


def in_forked_child(work: Callable[[], str], timeout_s: int = 120) -> tuple[int, str]:
    """Fork; the child runs ``work`` and writes the text it returns back;
    the parent waits for it.  ``(the child's exit code, that text)``: 0 and
    the text when ``work`` returned, 1 and nothing when it raised, 1 and a
    traceback on stderr when it ran past ``timeout_s`` (a hang fails the
    test instead of stopping the suite)."""
    read, write = os.pipe()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)      # (3.12+: fork with threads running)
        pid = os.fork()
    if pid == 0:
        status = 1
        try:
            os.close(read)
            faulthandler.dump_traceback_later(timeout_s, exit=True)
            os.write(write, work().encode())
            status = 0
        finally:
            os._exit(status)
    os.close(write)
    with os.fdopen(read, "rb") as pipe:
        text = pipe.read().decode()
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status), text
