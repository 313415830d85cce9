"""One study runner per runs folder (and per SQLite store) at a time: an OS file lock.

Why: two ``lsbench run`` started together on a new runs folder both create and
migrate the MLflow store, and MLflow's migrations are not safe against each
other (measured: both crash, and the store is left half-migrated with
``_alembic_tmp_*`` tables). On an existing store both would find the same
pending trials and train each of them twice, writing the same trial folders.
The lock is taken before the store is opened, so creation and migration happen
once, under it, and is held until the runner has closed its runs.

``fcntl.flock`` is released by the kernel when its holder dies (kill -9
included), so a stale lock file never blocks anyone; the JSON written into it
only names the holder in the message. ``lsbench report`` and ``lsbench ui``
read the store and take no lock: they work while a study runs.
"""

from __future__ import annotations

import errno
import json
import os
import socket
import sys
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from datetime import datetime
from pathlib import Path
from typing import IO

#: the lock file inside a runs folder
LOCK_NAME = ".lsbench-run.lock"


class RunsFolderBusy(RuntimeError):
    """Another ``lsbench run`` holds the runs folder or the store: a user error (exit 2), nothing was touched."""


def lock_paths(runs_dir: Path, store_db: Path | None) -> list[Path]:
    """The lock files guarding ``runs_dir`` and, when it lives elsewhere, the SQLite store ``store_db``.

    Sorted, so that two runners taking the same pair always take them in the same order.
    """
    paths = {runs_dir / LOCK_NAME}
    if store_db is not None and store_db.parent.resolve() != runs_dir.resolve():
        paths.add(store_db.parent.resolve() / f".{store_db.name}{LOCK_NAME}")
    return sorted(paths)


def _holder(path: Path, patience: float = 1.0) -> str:
    """Who holds the lock, as its file says; a holder that has just taken it gets ``patience`` s to write it."""
    deadline = time.monotonic() + patience
    while True:
        try:
            info = json.loads(path.read_text() or "{}")
        except (OSError, ValueError):
            info = {}
        if info or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    if not info:
        return "another lsbench run"
    since = datetime.fromtimestamp(info.get("since", 0)).strftime("%Y-%m-%d %H:%M:%S")
    return (
        f"lsbench run of study {info.get('study', '?')!r} (pid {info.get('pid', '?')} on "
        f"{info.get('host', '?')}, since {since})"
    )


def _what(path: Path) -> str:
    if path.name == LOCK_NAME:
        return f"runs folder {path.parent}"
    return f"MLflow store {path.parent / path.name[1 : -len(LOCK_NAME)]}"


def _open(path: Path, store_db: Path | None) -> IO[str]:
    """The lock file, opened for writing; a folder that cannot be written is the store's fault (exit 4)."""
    from ..tracking.store import StoreError

    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        return open(path, "a+")  # noqa: SIM115 - held open for as long as the lock is
    except OSError as e:
        what = f"MLflow store {store_db}" if store_db is not None else f"runs folder {path.parent}"
        cause = "is read-only" if e.errno in (errno.EROFS, errno.EACCES, errno.EPERM) else "cannot be written"
        raise StoreError(
            f"{what} {cause} ({e.strerror}: {e.filename or path}); a study needs to write it: "
            "make it writable or pass another --runs-dir"
        ) from None


def _acquire(path: Path, store_db: Path | None, study: str, wait: bool, stream: IO[str]) -> IO[str]:
    import fcntl

    fh = _open(path, store_db)
    try:
        try:
            fcntl.flock(fh.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _holder(path)
            if not wait:
                raise RunsFolderBusy(
                    f"{_what(path)} is in use by {holder}; wait for it to end, pass --wait "
                    "to queue behind it, or use another --runs-dir"
                ) from None
            print(f"waiting for {holder} to release {_what(path)} ...", file=stream, flush=True)
            fcntl.flock(fh.fileno(), fcntl.LOCK_EX)
        fh.seek(0)
        fh.truncate()
        fh.write(json.dumps({"pid": os.getpid(), "host": socket.gethostname(), "study": study, "since": time.time()}))
        fh.flush()
        return fh
    except BaseException:
        fh.close()
        raise


@contextmanager
def runs_lock(
    runs_dir: Path, store_db: Path | None, study: str, *, wait: bool = False, stream: IO[str] | None = None
) -> Iterator[None]:
    """Hold the runs folder's (and the store's) lock for the block; raise :class:`RunsFolderBusy` if taken.

    ``wait=True`` blocks until the holder ends instead (after saying whom it waits for).
    Where ``fcntl`` does not exist (Windows) the block runs unlocked.
    """
    try:
        import fcntl  # noqa: F401
    except ImportError:
        yield
        return
    with ExitStack() as stack:
        for path in lock_paths(runs_dir, store_db):
            fh = stack.enter_context(_acquire(path, store_db, study, wait, stream or sys.stderr))
            stack.callback(_clear, fh)  # before the close that releases it: no stale holder for the next
        yield


def _clear(fh: IO[str]) -> None:
    try:
        fh.seek(0)
        fh.truncate()
    except OSError:
        pass
