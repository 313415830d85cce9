"""Tracking URIs that name no store lsbench can keep results in (a store that forgets).

Before: ``--tracking-uri sqlite://`` (SQLite in memory) trained, reported and exited 0, and
nothing survived (a rerun trained everything again; ``report`` on it made a store and printed
MLflow INFO lines); ``file:`` URIs, plain folders and strings that are no URI at all (``%%%``)
ended in MLflow's 40-line "filesystem tracking backend is in maintenance mode" traceback. Now
each is one line, exit 4, saying what to use, before any work (no runs folder, no data), for
``run``, ``report`` and ``ui``, from ``--tracking-uri`` or ``MLFLOW_TRACKING_URI``.
"""

from __future__ import annotations

import pytest

from helpers import lsbench, study_yaml

USE = ("sqlite:///path/mlflow.db", "http://host:port", "an MLflow server")


def _refused(r, *needles) -> str:
    """Exit 4 and one ``lsbench: error:`` line naming the URI and what to use; no traceback, no MLflow chatter."""
    assert r.returncode == 4, (r.returncode, r.stdout[-1500:], r.stderr[-3000:])
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("lsbench: error: tracking URI "), r.stderr[-3000:]
    assert "Traceback" not in r.stderr + r.stdout
    for n in (*USE, *needles):
        assert n in lines[0], (n, lines[0])
    return lines[0]


def _uris(tmp_path):
    (tmp_path / "mlruns").mkdir()
    return {
        "sqlite://": "in memory",
        "sqlite:///:memory:": "in memory",
        f"file://{tmp_path}/mlruns": "MLflow's file store",
        str(tmp_path / "mlruns"): "MLflow's file store",
        "%%%": "no scheme",
        ":::x:::": "no scheme",
    }


def test_run_refuses_stores_that_keep_nothing_before_any_work(tmp_path):
    f = tmp_path / "s.yaml"
    f.write_text(study_yaml(name="s", schedule={"iterations": 4, "lr": 0.01, "warmup_iterations": 2}))
    cache = tmp_path / "cache"
    for uri, why in _uris(tmp_path).items():
        r = lsbench(
            "run",
            f,
            "--executor",
            "local",
            "--runs-dir",
            tmp_path / "runs",
            "--tracking-uri",
            uri,
            cwd=tmp_path,
            timeout=180,
            env={"LSBENCH_DATA": str(cache)},
        )
        _refused(r, repr(uri), why)
    # from the environment too
    r = lsbench(
        "run",
        f,
        "--executor",
        "local",
        "--runs-dir",
        tmp_path / "runs",
        cwd=tmp_path,
        timeout=180,
        env={"LSBENCH_DATA": str(cache), "MLFLOW_TRACKING_URI": "sqlite://"},
    )
    _refused(r, "'sqlite://'", "in memory")
    # nothing trained, no data generated, no runs folder, no file named ':memory:' or '%%%'
    assert sorted(p.name for p in tmp_path.iterdir()) == ["mlruns", "s.yaml"]
    assert list((tmp_path / "mlruns").iterdir()) == []


@pytest.mark.parametrize("command", [["report"], ["ui", "--port", "1"]])
def test_report_and_ui_refuse_them_and_create_nothing(tmp_path, command):
    for uri, why in _uris(tmp_path).items():
        r = lsbench(*command, "--tracking-uri", uri, cwd=tmp_path, timeout=120)
        _refused(r, repr(uri), why)
        assert "INFO" not in r.stdout + r.stderr  # no store was created or migrated
    r = lsbench(*command, cwd=tmp_path, timeout=120, env={"MLFLOW_TRACKING_URI": "file:///nowhere/mlruns"})
    _refused(r, "'file:///nowhere/mlruns'", "MLflow's file store")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["mlruns"]


def test_a_folder_or_file_holding_a_store_names_the_uri_to_pass(tmp_path):
    import sqlite3

    runs = tmp_path / "runs"
    runs.mkdir()
    sqlite3.connect(runs / "mlflow.db").execute("CREATE TABLE experiments (x)").connection.commit()
    for uri in (str(runs), f"file://{runs}"):
        r = lsbench("report", "--tracking-uri", uri, cwd=tmp_path, timeout=120)
        assert r.returncode == 4 and r.stderr.strip() == (
            f"lsbench: error: tracking URI {uri!r} is a folder; its store is the mlflow.db in it: "
            f"pass sqlite:///{runs}/mlflow.db"
        ), r.stderr[-2000:]


def test_unknown_scheme_lists_only_stores_that_work(tmp_path):
    for uri in ("foo://bar", "uc", "databricks-uc"):
        line = _refused(lsbench("report", "--tracking-uri", uri, cwd=tmp_path, timeout=120), repr(uri))
        assert "postgresql:" in line
        for dead in ("file:", "folder", "databricks", "uc:", "'' "):
            assert dead not in line.split(";", 1)[1], (dead, line)
