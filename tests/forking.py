"""Running a piece of a test in a forked child (what multiprocessing's
default start method does on Linux), for the tests of what survives a fork."""

from __future__ import annotations

import contextlib
import faulthandler
import os
import threading
import warnings
from collections.abc import Callable, Iterator


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


@contextlib.contextmanager
def held_by_another_thread(*locks) -> Iterator[None]:
    """The block runs while another thread holds ``locks`` (entered in
    order), as when a process forks in the middle of an update; they are
    released after it."""
    held, release = threading.Event(), threading.Event()

    def holder():
        with contextlib.ExitStack() as stack:
            for lock in locks:
                stack.enter_context(lock)
            held.set()
            release.wait(60)

    thread = threading.Thread(target=holder)
    thread.start()
    try:
        assert held.wait(30), "the holding thread did not get the locks"
        yield
    finally:
        release.set()
        thread.join()
