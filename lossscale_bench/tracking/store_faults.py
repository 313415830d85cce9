"""A store fault that appears after the store was opened, as one :class:`~.store.StoreError` line.

:func:`store_error` reads the chain of an exception MLflow, SQLAlchemy, SQLite or the OS raised
(a disk that fills up mid-study, a read-only or corrupt file, an old schema, a missing driver)
and words what it means, naming the store; anything else is left to its caller. Checking a store
before MLflow opens it is :func:`~.store.open_store`'s job.
"""

from __future__ import annotations

import errno

from .store import StoreError, redact, sqlite_path

__all__ = ["store_error", "unreachable"]

#: what a database server or an MLflow server that is away (restarting, down) answers, in any driver's words
UNREACHABLE = (
    "connection refused",
    "could not connect to server",
    "server closed the connection unexpectedly",
    "terminating connection due to administrator command",
    "the database system is shutting down",
    "the database system is starting up",
    "max retries exceeded",
)


def _chain(exc: BaseException):
    seen = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        yield exc
        orig = getattr(exc, "orig", None)  # SQLAlchemy wraps the DB-API error
        if orig is not None and id(orig) not in seen:
            yield orig
        exc = exc.__cause__ or exc.__context__


def _refused_credentials(e: BaseException) -> bool:
    """An MLflow server (or the proxy before it) answered 401/403: MLflow's ``RestException`` code, or its text."""
    code = str(getattr(e, "error_code", ""))
    return code in ("UNAUTHENTICATED", "PERMISSION_DENIED") or any(
        f"error code {c} != 200" in str(e) for c in (401, 403)
    )


def unreachable(exc: BaseException) -> bool:
    """Whether ``exc`` says the store's server is away (restarting, down): worth trying again a while."""
    return any(any(t in str(e).lower() for t in UNREACHABLE) for e in _chain(exc))


def store_error(exc: BaseException, uri: str) -> StoreError | None:
    """The :class:`StoreError` a store fault raised by MLflow/SQLite/the OS means, or None.

    A disk that fills up mid-study reaches us as SQLite's ``database or disk is full``
    or an ``OSError`` ENOSPC; both say "disk full".
    """
    where = sqlite_path(uri) or redact(uri)
    # the DB-API/OS error says it best; SQLAlchemy's wrapper adds a paragraph of advice
    inner = next((e for e in _chain(exc) if isinstance(e, OSError) or type(e).__module__.startswith("sqlite3")), exc)
    detail = " ".join(str(inner).split())[:150]
    for e in _chain(exc):
        if isinstance(e, ImportError):
            return StoreError(f"tracking URI {redact(uri)}: the database driver is not installed ({e})")
        text = str(e).lower()
        code = getattr(e, "errno", None)
        if code == errno.ENOSPC or "database or disk is full" in text or "no space left" in text:
            return StoreError(
                f"MLflow store {where}: disk full ({detail}); "
                "what was logged before is kept: free space and re-run to resume"
            )
        if code == errno.EDQUOT or "quota exceeded" in text:
            return StoreError(f"MLflow store {where}: disk quota exceeded; what was logged before is kept")
        if code == errno.EROFS or "readonly database" in text or "read-only file system" in text:
            return StoreError(f"MLflow store {where} is read-only ({detail})")
        if "malformed" in text or "file is not a database" in text:
            return StoreError(f"MLflow store {where} is corrupt ({detail}); it was left as it is")
        if "out-of-date database schema" in text:
            return StoreError(
                f"MLflow store {where} was written by an older MLflow ({detail}); back it up, then "
                f"run `mlflow db upgrade {redact(uri)}`"
            )
        if "database is locked" in text:  # retry()'s callers tried again first: it stayed locked
            return StoreError(
                f"MLflow store {where} stayed locked: another process holds its write lock; what was logged "
                "before is kept: end that process and re-run to resume"
            )
        if "disk i/o error" in text:
            return StoreError(
                f"MLflow store {where}: disk I/O error (a full disk, a file-size limit or a failing device)"
            )
    if any(_refused_credentials(e) for e in _chain(exc)):
        return StoreError(
            f"MLflow server {where} refused this client's credentials ({detail}); set MLFLOW_TRACKING_TOKEN "
            "(a bearer token) or MLFLOW_TRACKING_USERNAME and MLFLOW_TRACKING_PASSWORD (basic auth)"
        )
    if unreachable(exc):  # retry()'s callers tried again first: it stayed away
        return StoreError(
            f"MLflow store {where} is unreachable ({' '.join(str(exc).split())[:150]}); what was logged "
            "before is kept: start it again and re-run to resume"
        )
    return None
