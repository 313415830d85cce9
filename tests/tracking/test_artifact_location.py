"""Where a new study's artifacts go, by store (``tracking.artifacts.artifact_location``, ``lsbench run --artifacts-uri``).

Before: every store but SQLite got ``file://<runs-dir>/artifacts/<study>``, an MLflow server's too, so the
server's artifact store received nothing (tests/tracking/test_team_servers.py runs the real server).
"""

from __future__ import annotations

from pathlib import Path

from lossscale_bench.tracking.artifacts import artifact_location
from lossscale_bench.tracking.store import relative_artifact_location


def test_a_server_decides_a_database_gets_the_runs_folder_sqlite_keeps_them_beside_it(tmp_path):
    root = tmp_path / "runs" / "artifacts"
    assert artifact_location("http://host:5000", "s", root) is None
    assert artifact_location("https://mlflow.lab.example", "s", root) is None
    assert artifact_location("postgresql://u@db:5432/mlflow", "s", root) == (root / "s").as_uri()
    assert artifact_location(f"sqlite:///{tmp_path}/mlflow.db", "s", root) == relative_artifact_location("s")


def test_artifacts_uri_chooses_for_every_store(tmp_path, monkeypatch):
    for uri in ("http://host:5000", "postgresql://u@db/mlflow", f"sqlite:///{tmp_path}/mlflow.db"):
        assert artifact_location(uri, "my study", None, "s3://bucket/lsbench/") == "s3://bucket/lsbench/my%20study"
    monkeypatch.chdir(tmp_path)
    assert artifact_location("http://h:1", "s", None, "shared/art") == (Path(tmp_path) / "shared/art/s").as_uri()
