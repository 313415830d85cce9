"""Where a new study's artifacts go: :func:`artifact_location`, by store, or chosen with ``--artifacts-uri``.

Why apart from ``store``: opening a store and placing its files are two jobs. Before, every store but
SQLite got ``file://<runs-dir>/artifacts/<study>``, an MLflow server's too, so the server's artifact
store received nothing and a report away from the driver's disk drew no heatmap.
"""

from __future__ import annotations

from pathlib import Path
from urllib.parse import quote, urlparse

from .store import check_scheme, relative_artifact_location, sqlite_path

__all__ = ["artifact_location"]


def artifact_location(
    tracking_uri: str, study_name: str, artifact_root: Path | None = None, artifacts_uri: str | None = None
) -> str | None:
    """Where a new study's experiment keeps its artifacts (``None``: the tracking server decides).

    ``artifacts_uri`` (``lsbench run --artifacts-uri``), when given, is the root for every store:
    ``<artifacts_uri>/<study>``. Otherwise: a SQLite store keeps them beside ``mlflow.db``
    (:func:`relative_artifact_location`); an MLflow server (``http(s)://``) in its own artifact store
    (no location: the server's default, ``mlflow-artifacts:`` when it proxies one), so every artifact
    goes through the server and a report on another machine reads it back through the server; a
    database server (``postgresql://``, ...) in ``<artifact_root>/<study>`` on this machine's disk
    (the driver's runs folder), since a database holds no files.
    """
    if artifacts_uri:
        if len(urlparse(artifacts_uri).scheme) < 2:  # a plain folder (or a drive letter): absolute, as a file URI
            artifacts_uri = Path(artifacts_uri).expanduser().resolve().as_uri()
        return f"{artifacts_uri.rstrip('/')}/{quote(study_name, safe='')}"
    if sqlite_path(tracking_uri) is not None:
        # relative to the folder of mlflow.db: a copied or moved runs folder keeps its artifacts
        return relative_artifact_location(study_name)
    if check_scheme(tracking_uri) in ("http", "https", "databricks"):
        return None
    return (artifact_root / study_name).as_uri() if artifact_root else None
