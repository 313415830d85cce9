"""An ``http(s)://`` tracking URI checked before MLflow opens it: unreachable, or not an MLflow server, in one line.

Why: MLflow's client retries an unreachable server for minutes; and where something other than an MLflow
tracking server answers (another web service on the port, a proxy's error page, a plain file server), its
first call fails with an ``MlflowException`` traceback (``run``) or a message that does not say what is
wrong (``report``). So :func:`server_problem` asks the server what an MLflow client asks first (a search of
one experiment) and checks that the answer is MLflow's; ``store.open_store`` raises what it says as a
:class:`~.store.StoreError` (exit 4, "the store cannot be used"). No import of ``store``: it imports this. A server that asks for credentials (401, 403) is left to MLflow, which sends
the ones its environment holds (``MLFLOW_TRACKING_TOKEN``, ...).
"""

from __future__ import annotations

import json

__all__ = ["server_problem"]

#: what the MLflow client's first call of a study asks; an MLflow server answers with JSON
SEARCH_PATH = "/api/2.0/mlflow/experiments/search?max_results=1"
#: answers of a server that wants credentials (MLflow's client sends them, this probe does not)
AUTH_STATUSES = (401, 403)


def server_problem(uri: str, timeout: float, where: str) -> str | None:
    """Why no MLflow tracking server answers at ``uri`` within ``timeout`` s, in one line naming it ``where``
    (the URI without its password); None when one does."""
    import urllib.error
    import urllib.request

    url = uri.rstrip("/") + SEARCH_PATH
    path = SEARCH_PATH.split("?")[0]
    try:
        with urllib.request.urlopen(url, timeout=timeout) as answer:  # noqa: S310 - http(s) only
            body = answer.read(1 << 16)
    except urllib.error.HTTPError as e:
        if e.code in AUTH_STATUSES:
            return None
        return (
            f"tracking URI {where}: something answers there, but not an MLflow tracking server (HTTP {e.code} "
            f"{e.reason} for {path}); pass the MLflow server's address (mlflow server / lsbench ui print it)"
        )
    except (urllib.error.URLError, OSError, ValueError) as e:
        reason = getattr(e, "reason", e)
        return (
            f"MLflow server {where} is unreachable ({reason}, {timeout:g} s timeout); "
            "start it (lsbench ui / mlflow server) or pass another --tracking-uri"
        )
    try:
        reply = json.loads(body or b"{}")
    except ValueError:
        reply = None
    if not isinstance(reply, dict) or not set(reply) <= {"experiments", "next_page_token"}:
        return (
            f"tracking URI {where}: something answers there, but not an MLflow tracking server (its answer to "
            f"{path} is not MLflow's); pass the MLflow server's address"
        )
    return None
