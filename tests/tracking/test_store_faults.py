"""Store faults (runs and their artifacts), each on a real SQLite MLflow store.

Corrupt, truncated, foreign, read-only, full and unreachable stores and bad URIs end in one
line naming the store and the cause (exit 4; a store that is not there: exit 2), never a
traceback, and leave the store byte for byte as it was. ``report`` never creates a store.
A copied runs folder keeps its artifacts (they are stored relative to ``mlflow.db``).
"""

from __future__ import annotations

import hashlib
import os
import shutil
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from helpers import AS_USER, lsbench, study_yaml


def _study(name: str) -> str:
    return study_yaml(name=name, schedule={"iterations": 4, "lr": 0.01, "warmup_iterations": 2})


def _lsbench(*args, cwd, as_user=False, timeout=300, env=None):
    return lsbench(*args, cwd=cwd, timeout=timeout, env=env, prefix=AS_USER if as_user else ())


def _one_line(r, *needles):
    """stderr is exactly one ``lsbench: error:`` line holding every needle; no traceback anywhere."""
    lines = [ln for ln in r.stderr.splitlines() if ln.strip() and " INFO mlflow" not in ln]
    assert len(lines) == 1 and lines[0].startswith("lsbench: error: "), r.stderr[-3000:]
    assert "Traceback" not in r.stderr + r.stdout
    for n in needles:
        assert str(n) in lines[0], (n, lines[0])
    return lines[0]


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture(scope="module")
def study_store(tmp_path_factory):
    """A runs folder with one real finished trial (local executor: no Ray), plots and telemetry artifacts."""
    root = tmp_path_factory.mktemp("store")
    f = root / "tiny.yaml"
    f.write_text(_study("tiny"))
    r = _lsbench("run", f, "--runs-dir", root / "runs", "--executor", "local", "--no-report", cwd=root)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
    return root / "runs"


def _copy(runs: Path, dst: Path) -> Path:
    shutil.copytree(runs, dst)
    return dst


# -- bad URIs and missing stores -------------------------------------------------------------
def test_unknown_scheme_is_one_line_for_report_and_run(tmp_path):
    f = tmp_path / "s.yaml"
    f.write_text(_study("s"))
    for cmd in (["report"], ["run", f]):
        r = _lsbench(*cmd, "--tracking-uri", "foo://bar", cwd=tmp_path, timeout=120)
        assert r.returncode == 4, (cmd, r.stderr[-2000:])
        _one_line(r, "foo://bar", "sqlite:", "http:", "postgresql:")
    assert list(tmp_path.iterdir()) == [f]  # nothing created, no data prepared


def test_database_uri_without_its_driver_is_one_line_without_the_password(tmp_path):
    import importlib.util

    if importlib.util.find_spec("pymssql") is not None:
        pytest.skip("pymssql is installed here")
    r = _lsbench("report", "--tracking-uri", "mssql+pymssql://me:s3cret@127.0.0.1:1/db", cwd=tmp_path, timeout=120)
    assert r.returncode == 4
    _one_line(r, "mssql+pymssql://me:***@127.0.0.1:1/db", "driver is not installed", "pymssql")
    assert "s3cret" not in r.stderr


def test_report_on_a_missing_path_creates_nothing(tmp_path):
    """Before: `report` created an empty runs/mlflow.db there and printed 'no trial runs'."""
    for args, path in (
        (["--runs-dir", tmp_path / "nowhere"], tmp_path / "nowhere" / "mlflow.db"),
        (["--tracking-uri", f"sqlite:///{tmp_path}/sub/x.db"], tmp_path / "sub" / "x.db"),
    ):
        r = _lsbench("report", *args, cwd=tmp_path, timeout=120)
        assert r.returncode == 2, r.stderr[-2000:]
        _one_line(r, f"no MLflow store at {path}", "run a study first or pass --tracking-uri")
    assert list(tmp_path.iterdir()) == []


# -- damaged stores ----------------------------------------------------------------------------
def _truncate(db: Path) -> None:
    data = db.read_bytes()
    db.write_bytes(data[: len(data) // 3])


def _scribble(db: Path) -> None:
    data = bytearray(db.read_bytes())
    data[4096 * 2 : 4096 * 6] = b"\xa5" * (4096 * 4)  # pages of the schema and tables, not the header
    db.write_bytes(bytes(data))


def _text(db: Path) -> None:
    db.write_text("not a database\n")


@pytest.mark.parametrize(
    "damage, cause",
    [(_truncate, "is truncated"), (_scribble, "corrupt or truncated"), (_text, "not a SQLite database")],
)
def test_damaged_store_is_one_line_and_left_as_it_is(study_store, tmp_path, damage, cause):
    runs = _copy(study_store, tmp_path / "runs")
    db = runs / "mlflow.db"
    damage(db)
    before = _sha(db)
    f = tmp_path / "tiny.yaml"
    f.write_text(_study("tiny"))
    cmds = [["report", "--runs-dir", runs]]
    if damage is _truncate:  # run and ui open the store the same way (store.open_store); once is enough
        cmds += [["run", f, "--runs-dir", runs, "--executor", "local"], ["ui", "--runs-dir", runs, "--port", "1"]]
    for cmd in cmds:
        r = _lsbench(*cmd, cwd=tmp_path, timeout=120)
        assert r.returncode == 4, (cmd, r.stdout[-1000:], r.stderr[-2000:])
        _one_line(r, db, cause)
        assert _sha(db) == before  # never repaired, recreated or migrated
    assert not (runs / "tiny" / "ray").exists()


def test_large_store_skips_the_full_check_and_still_names_damage(study_store, tmp_path, monkeypatch):
    """Over QUICK_CHECK_MAX_BYTES the page-by-page check is skipped; MLflow's own error is then named."""
    from lossscale_bench.tracking import StoreError, Tracker, store

    runs = _copy(study_store, tmp_path / "runs")
    db = runs / "mlflow.db"
    data = db.read_bytes()
    db.write_bytes(data[:4096] + b"\xa5" * (len(data) - 4096))  # every page but the schema's first
    before = _sha(db)
    monkeypatch.setattr(store, "QUICK_CHECK_MAX_BYTES", 0)
    with pytest.raises(StoreError, match=r"is corrupt|corrupt or truncated") as info:
        Tracker(f"sqlite:///{db}").trial_runs(Tracker(f"sqlite:///{db}").experiment_id("tiny", create=False))
    assert str(db) in str(info.value) and "\n" not in str(info.value)
    assert _sha(db) == before


def test_foreign_sqlite_file_is_not_turned_into_a_store(tmp_path):
    import sqlite3

    db = tmp_path / "app.db"
    with sqlite3.connect(db) as c:
        c.execute("CREATE TABLE notes (t TEXT)")
    before = _sha(db)
    r = _lsbench("report", "--tracking-uri", f"sqlite:///{db}", cwd=tmp_path, timeout=120)
    assert r.returncode == 4
    _one_line(r, db, "not an MLflow store", "notes")
    assert _sha(db) == before


# -- read-only, full, unreachable ------------------------------------------------------------
@pytest.mark.skipif(os.geteuid() == 0 and not AS_USER, reason="root without setpriv ignores file modes")
def test_read_only_store_refuses_a_run_and_still_reports(study_store, tmp_path):
    runs = _copy(study_store, tmp_path / "runs")
    db = runs / "mlflow.db"
    before = _sha(db)
    f = tmp_path / "tiny2.yaml"
    f.write_text(_study("tiny2"))
    for p in [runs, *runs.rglob("*")]:
        p.chmod(p.stat().st_mode & ~0o222)
    try:
        r = _lsbench("run", f, "--runs-dir", runs, "--executor", "local", cwd=tmp_path, as_user=True)
        assert r.returncode == 4, r.stderr[-2000:]
        _one_line(r, db, "read-only")
        # reading needs no write access: the report of what is there still works
        r = _lsbench(
            "report", "--runs-dir", runs, "--no-plots", "--reports-dir", tmp_path / "rep", cwd=tmp_path, as_user=True
        )
        assert r.returncode == 0, r.stderr[-2000:]
        assert "FP32 baseline" in r.stdout
    finally:
        for p in [runs, *runs.rglob("*")]:
            p.chmod(p.stat().st_mode | 0o200)
    assert _sha(db) == before


FULL = textwrap.dedent("""\
    import sqlite3, sys
    import sqlalchemy
    db = sys.argv[1]
    pages = sqlite3.connect(db).execute("PRAGMA page_count").fetchone()[0]

    # The store's disk fills up a little after the study starts: SQLite answers SQLITE_FULL
    # ("database or disk is full"), exactly as on a full file system, once the file reaches this size.
    @sqlalchemy.event.listens_for(sqlalchemy.engine.Engine, "connect")
    def _cap(dbapi_conn, record):
        dbapi_conn.execute(f"PRAGMA max_page_count = {pages + 8}")

    from lossscale_bench.cli import main
    sys.exit(main(sys.argv[2:]))
    """)


def test_full_store_disk_says_disk_full_and_keeps_what_was_logged(study_store, tmp_path):
    from mlflow import MlflowClient

    runs = _copy(study_store, tmp_path / "runs")
    db = runs / "mlflow.db"
    uri = f"sqlite:///{db}"
    old = MlflowClient(uri).search_runs([e.experiment_id for e in MlflowClient(uri).search_experiments()])
    f = tmp_path / "tiny2.yaml"
    f.write_text(_study("tiny2"))
    r = subprocess.run(
        [
            sys.executable,
            "-c",
            FULL,
            str(db),
            "run",
            str(f),
            "--runs-dir",
            str(runs),
            "--executor",
            "local",
            "--no-report",
            "--quiet",
        ],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=300,
    )
    assert r.returncode == 4, r.stdout[-2000:] + r.stderr[-3000:]
    _one_line(r, db, "disk full", "database or disk is full")
    # nothing logged before is lost: the store is intact and holds every earlier run and metric
    import sqlite3

    assert sqlite3.connect(db).execute("PRAGMA integrity_check").fetchone()[0] == "ok"
    client = MlflowClient(uri)
    for run in old:
        again = client.get_run(run.info.run_id)
        assert again.data.metrics == run.data.metrics and again.data.tags == run.data.tags


def test_trial_on_a_full_disk_says_disk_full(tmp_path):
    """A real ENOSPC: the trial's telemetry table is written through /dev/full, as on a full disk."""
    from lossscale_bench.engine.sink import MemorySink
    from lossscale_bench.study import load_study_text
    from lossscale_bench.trial import failure_text, run_trial

    with pytest.raises(OSError) as info, open("/dev/full", "w") as fh:
        fh.write("x")
    assert failure_text(info.value).startswith("disk full: OSError: [Errno 28]")

    cfg = load_study_text(_study("full")).trials()[0]
    (tmp_path / "layers").mkdir()
    for step in range(0, 5):
        (tmp_path / "layers" / f"layers_step{step:07d}.csv").symlink_to("/dev/full")
    sink = MemorySink()
    out = run_trial(cfg, sink=sink, trial_dir=tmp_path)
    assert out.status == "failed"
    assert out.error.startswith("disk full: ") and "No space left on device" in out.error
    assert sink.tag_values["lsbench.error"].startswith("disk full: ")


def test_unreachable_server_ends_in_seconds(tmp_path):
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    t0 = time.time()
    r = _lsbench("report", "--tracking-uri", f"http://127.0.0.1:{port}", cwd=tmp_path, timeout=120)
    assert r.returncode == 4
    _one_line(r, f"http://127.0.0.1:{port}", "unreachable")
    assert time.time() - t0 < 30


def test_report_on_a_store_another_process_holds_locked_is_one_line_exit_4(study_store, tmp_path, monkeypatch, capsys):
    """A writer holding the SQLite lock: ``report`` was a SQLAlchemy traceback after MLflow's minute of retries,
    exit 1. Now one line after a bounded wait (``store.LOCK_WAIT_S``, shortened here), exit 4 as for ``run``;
    a writer that has only begun (``BEGIN IMMEDIATE``: readers may still read) does not stop the report."""
    import sqlite3

    from lossscale_bench.cli import main
    from lossscale_bench.tracking import store

    runs = _copy(study_store, tmp_path / "runs")
    db = runs / "mlflow.db"
    monkeypatch.setattr(store, "LOCK_WAIT_S", 1.0, raising=False)
    args = ["report", "--tracking-uri", f"sqlite:///{db}", "--out", "-", "--no-plots"]
    holder = sqlite3.connect(db, isolation_level=None)
    try:
        holder.execute("BEGIN IMMEDIATE")
        assert main(args) == 0 and "tiny" in capsys.readouterr().out
        holder.execute("ROLLBACK")
        holder.execute("BEGIN EXCLUSIVE")
        t0 = time.time()
        assert main(args) == 4
        assert time.time() - t0 < 30
    finally:
        holder.close()
    err = capsys.readouterr().err.strip()
    assert err.splitlines() == [err] and err.startswith(f"lsbench: error: MLflow store {db} is locked"), err


def _not_mlflow_server(folder: Path):
    """A plain ``http.server`` serving an empty ``folder`` on a free port: every path is 404."""
    import functools
    import http.server
    import threading

    folder.mkdir()
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(folder))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def test_a_server_that_is_not_mlflow_is_one_line_exit_4_for_run_and_report(tmp_path):
    """``run`` was an MlflowException traceback, exit 1; ``report`` one line but exit 2."""
    (tmp_path / "s.yaml").write_text(_study("s"))
    server = _not_mlflow_server(tmp_path / "www")
    url = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        for cmd in (
            ["run", "s.yaml", "--executor", "local", "--no-report", "--tracking-uri", url, "--runs-dir", "runs"],
            ["report", "--tracking-uri", url],
        ):
            r = _lsbench(*cmd, cwd=tmp_path, timeout=120)
            assert r.returncode == 4, (cmd[0], r.returncode, r.stderr[-3000:])
            _one_line(r, url, "not an MLflow tracking server", "HTTP 404")
    finally:
        server.shutdown()
        server.server_close()


# -- artifacts relative to the store ---------------------------------------------------------
def test_copied_store_reads_its_own_artifacts(study_store, tmp_path):
    """Before: experiments had absolute artifact locations, so a copy read (or missed) the old folder."""
    from mlflow import MlflowClient

    moved = _copy(study_store, tmp_path / "a" / "runs")
    moved = Path(shutil.move(str(moved), str(tmp_path / "elsewhere" / "runs")))  # the old folder is gone
    assert not (tmp_path / "a" / "runs").exists()
    client = MlflowClient(f"sqlite:///{moved / 'mlflow.db'}")
    exps = [e for e in client.search_experiments() if e.name == "tiny"]
    assert exps and not exps[0].artifact_location.startswith(("file:", "/"))
    trial = [r for r in client.search_runs([exps[0].experiment_id]) if r.data.tags.get("lsbench.role") == "trial"][0]
    # the copy's own file is what the copy reads (not the folder the study ran in)
    mine = [p for p in moved.rglob("plots/loss.png") if trial.info.run_id in p.parts]
    assert len(mine) == 1
    assert mine[0].read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    mine[0].write_bytes(mine[0].read_bytes() + b"this copy")
    got = Path(client.download_artifacts(trial.info.run_id, "plots/loss.png", str(tmp_path)))
    assert got.read_bytes().endswith(b"this copy")
    # the report of the copy draws its plots (layer heatmaps come from the layers artifact)
    r = _lsbench("report", "--runs-dir", moved, "--reports-dir", tmp_path / "rep", cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-2000:]
    assert (tmp_path / "rep" / "all_tiny_underflow_fp32_baseline.png").stat().st_size > 1000


def test_ui_of_a_moved_store_serves_its_own_artifacts(study_store, tmp_path):
    """The MLflow UI (`lsbench ui` = mlflow server) reads a moved store's plots from the moved folder."""
    import signal
    import urllib.request

    from mlflow import MlflowClient

    moved = Path(shutil.move(str(_copy(study_store, tmp_path / "a")), str(tmp_path / "b")))
    client = MlflowClient(f"sqlite:///{moved / 'mlflow.db'}")
    exp = client.get_experiment_by_name("tiny")
    rid = [r for r in client.search_runs([exp.experiment_id]) if r.data.tags.get("lsbench.role") == "trial"][
        0
    ].info.run_id
    png = [p for p in moved.rglob("plots/loss.png") if rid in p.parts][0].read_bytes()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen(
        [sys.executable, "-m", "lossscale_bench.cli", "ui", "--runs-dir", str(moved), "--port", str(port)],
        cwd=tmp_path,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        url = f"http://127.0.0.1:{port}"
        deadline = time.time() + 120
        while True:
            try:
                urllib.request.urlopen(f"{url}/health", timeout=2).read()
                break
            except OSError:
                assert proc.poll() is None and time.time() < deadline, "the UI did not start"
                time.sleep(1)
        got = urllib.request.urlopen(f"{url}/get-artifact?run_uuid={rid}&path=plots/loss.png", timeout=30).read()
        assert got == png
        from lossscale_bench.tracking.server_probe import server_problem

        assert server_problem(url, 30, url) is None  # an MLflow server passes the check that refuses others
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
