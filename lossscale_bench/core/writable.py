"""Can files be written in a folder? Asked before a study trains, answered by trying.

Why this module exists: the synthetic data cache (``$LSBENCH_DATA``) and
``run --reports-dir`` were first written long after ``lsbench`` started, the
cache by the data step (a traceback, exit 1) and the reports folder after
every trial had trained. :func:`folder_problem` says up front what would stop
the write, so the CLI can refuse in one line before any work.

Why by trying and not ``os.access``: root ignores mode bits, yet a
capability-less root or a read-only mount does not, and only a real write
tells them apart. The check creates nothing that stays: a folder that is not
there yet is judged by the nearest folder above it that is (where it would be
created), and the probe file is deleted at once. Standard library only: the
schema layer (``lsbench validate``) uses it.
"""

from __future__ import annotations

import errno
import os
import tempfile
from pathlib import Path

__all__ = ["folder_problem"]

_READ_ONLY = (errno.EROFS, errno.EACCES, errno.EPERM)


def _exists(path: Path) -> bool:
    try:
        return path.exists() or path.is_symlink()
    except OSError:  # an unsearchable folder above it: judged where the walk stops
        return False


def folder_problem(path: str | Path) -> str | None:
    """What stops files being written in folder ``path`` (made if missing), or None when nothing does.

    The answer is a phrase to follow the path: ``"is a file, not a folder"``,
    ``"is read-only (Permission denied)"``, ``"cannot be created: /x is a file, not a folder"``.
    """
    target = Path(path).expanduser().absolute()
    here = target
    while not _exists(here) and here.parent != here:
        here = here.parent
    if here.is_symlink() and not here.exists():
        return (
            f"is a broken symbolic link ({here} -> {os.readlink(here)})"
            if here == target
            else f"cannot be created: {here} is a broken symbolic link"
        )
    if not here.is_dir():
        return "is a file, not a folder" if here == target else f"cannot be created: {here} is a file, not a folder"
    try:
        with tempfile.NamedTemporaryFile(dir=here, prefix=".lsbench-write-check-"):
            pass
    except OSError as e:
        cause = f"read-only ({e.strerror})" if e.errno in _READ_ONLY else (e.strerror or str(e))
        return f"is {cause}" if here == target else f"cannot be created: {here} is {cause}"
    return None
