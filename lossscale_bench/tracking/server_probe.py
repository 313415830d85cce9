"""An ``http(s)://`` tracking URI checked before MLflow opens it: unreachable, or not an MLflow server, in one line.

Why: MLflow's client retries an unreachable server for minutes; and where something other than an MLflow
tracking server answers (another web service on the port, a proxy's error page, a plain file server), its
first call fails with an ``MlflowException`` traceback (``run``) or a message that does not say what is
wrong (``report``). So :func:`probe_server` asks the server what an MLflow client asks first (a search of
one experiment) and checks that the answer is MLflow's: a :class:`~.store.StoreError` (exit 4, "the store
cannot be used") otherwise. A server that asks for credentials (401, 403) is left to MLflow, which sends
the ones its environment holds (``MLFLOW_TRACKING_TOKEN``, ...).
"""

from __future__ import annotations

import json

from .store import HTTP_TIMEOUT_S, StoreError, redact

__all__ = ["probe_server"]

#: what the MLflow client's first call of a study asks; an MLflow server answers with JSON
SEARCH_PATH = "/api/2.0/mlflow/experiments/search?max_results=1"
#: answers of a server that wants credentials (MLflow's client sends them, this probe does not)
AUTH_STATUSES = (401, 403)


def probe_server(uri: str) -> None:
    """Raise :class:`~.store.StoreError` unless an MLflow tracking server answers at ``uri`` within seconds."""
    import urllib.error
    import urllib.request

    url = uri.rstrip("/") + SEARCH_PATH
    where = redact(uri)
    try:
        with urllib.request.urlopen(url, timeout=HTTP_TIMEOUT_S) as answer:  # noqa: S310 - http(s) only
            body = answer.read(1 << 16)
    except urllib.error.HTTPError as e:
        if e.code in AUTH_STATUSES:
            return
        raise StoreError(
            f"tracking URI {where}: something answers there, but not an MLflow tracking server (HTTP {e.code} "
            f"{e.reason} for {SEARCH_PATH.split('?')[0]}); pass the MLflow server's address (mlflow server / "
            "lsbench ui print it)"
        ) from None
    except (urllib.error.URLError, OSError, ValueError) as e:
        reason = getattr(e, "reason", e)
        raise StoreError(
            f"MLflow server {where} is unreachable ({reason}, {HTTP_TIMEOUT_S:g} s timeout); "
            "start it (lsbench ui / mlflow server) or pass another --tracking-uri"
        ) from None
    try:
        reply = json.loads(body or b"{}")
    except ValueError:
        reply = None
    if not isinstance(reply, dict) or not set(reply) <= {"experiments", "next_page_token"}:
        raise StoreError(
            f"tracking URI {where}: something answers there, but not an MLflow tracking server (its answer to "
            f"{SEARCH_PATH.split('?')[0]} is not MLflow's); pass the MLflow server's address"
        )
