"""Publishing a written file in one step (the index file, ``bexmatch match --out``)."""

from __future__ import annotations

import contextlib
import os
import stat


def replace_keeping_mode(tmp: str, target: str) -> None:
    """Rename ``tmp`` over ``target`` atomically.  A regular file already at
    ``target`` passes on its permission bits: a file its owner made private
    (0600) stays private when it is written again, where the new file would
    take the umask's default (0644)."""
    with contextlib.suppress(FileNotFoundError):
        old = os.stat(target)
        if stat.S_ISREG(old.st_mode):
            os.chmod(tmp, stat.S_IMODE(old.st_mode))
    os.replace(tmp, target)


__all__ = ["replace_keeping_mode"]
