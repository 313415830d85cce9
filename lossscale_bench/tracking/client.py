"""The MLflow client on a store: each call made whole before a stop signal raises, and retried while locked.

:func:`store_client` is the client every writer of a study's runs uses (:class:`.tracker.Tracker`);
:func:`retry` calls one of its methods again while SQLite says "database is locked" and turns a store
fault into one :class:`~.store.StoreError` line.
"""

from __future__ import annotations

import time

from ..core.uninterrupted import WholeCalls
from .store import DATABASE_SCHEMES, check_scheme
from .store_faults import store_error, unreachable

__all__ = ["retry", "store_client"]


def store_client(uri: str):
    """An ``MlflowClient`` on ``uri`` whose every call ends at a safe point for a stop signal; on a
    database store each call is also made whole before the stop is raised.

    A call into a database store (SQLite, or a database server through SQLAlchemy) cut in half by the
    driver's SIGINT/SIGTERM can leave its connection holding a lock, and every later write waits on it
    (:mod:`lossscale_bench.core.uninterrupted`). An MLflow server's request cut in half harms nothing, and
    one that hangs must stay interruptible: its calls are not made whole.
    """
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=uri)
    return WholeCalls(client, whole=check_scheme(uri) in DATABASE_SCHEMES)


def retry(fn, *args, attempts: int = 8, **kwargs):
    """Call an MlflowClient method, retrying "database is locked" and a store server that is away (restarting:
    1, 2, 4, 8, 10, 10, 10 s apart); a store fault becomes a :class:`StoreError`."""
    delay = 0.05
    for i in range(attempts):
        try:
            return fn(*args, **kwargs)
        except Exception as exc:  # noqa: BLE001
            away = unreachable(exc)  # a database or MLflow server restarting: about a minute's tries
            if ("locked" not in str(exc).lower() and not away) or i == attempts - 1:
                fault = store_error(exc, str(getattr(getattr(fn, "__self__", None), "tracking_uri", "") or ""))
                if fault is not None:
                    raise fault from exc
                raise
            time.sleep(min(2.0**i, 10.0) if away else delay)
            delay = min(delay * 2, 2.0)
