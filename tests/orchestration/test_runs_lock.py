"""One ``lsbench run`` per runs folder and store: a second one exits 2 naming the first, or waits.

The case behind it (measured before the lock): two runs started together on a new
runs folder both migrated the new MLflow store, crashed, and in 2 of 3 tries left it
half-migrated (``_alembic_tmp_*`` tables), after which every command there was a traceback.
"""

from __future__ import annotations

import os
import sqlite3
import subprocess
import sys
import textwrap
import time

import pytest

from helpers import lsbench, write_study
from lossscale_bench.orchestration.runs_lock import LOCK_NAME, RunsFolderBusy, lock_paths, runs_lock

HOLD = textwrap.dedent("""\
    import sys, time
    from pathlib import Path
    from lossscale_bench.orchestration.runs_lock import runs_lock
    db = Path(sys.argv[2]) if len(sys.argv) > 2 and sys.argv[2] else None  # "" is no store, not Path(".")
    with runs_lock(Path(sys.argv[1]), db, "holder-study"):
        print("held", flush=True)
        time.sleep(float(sys.argv[3]) if len(sys.argv) > 3 else 60)
    """)


def _hold(runs, db=None, seconds=60):
    """A separate process holding the lock (flock is per open file: a real second holder)."""
    p = subprocess.Popen(
        [sys.executable, "-c", HOLD, str(runs), str(db or ""), str(seconds)], stdout=subprocess.PIPE, text=True
    )
    assert p.stdout.readline().strip() == "held"
    return p


def test_second_holder_is_refused_naming_the_first(tmp_path):
    runs = tmp_path / "runs"
    holder = _hold(runs)
    try:
        with pytest.raises(RunsFolderBusy) as err, runs_lock(runs, None, "mine"):
            pass
        msg = str(err.value)
        assert str(runs) in msg and "'holder-study'" in msg and f"pid {holder.pid}" in msg and "--wait" in msg
    finally:
        holder.kill()
        holder.wait()
    with runs_lock(runs, None, "mine"):  # a killed holder leaves nothing that blocks
        pass


def test_a_store_in_another_folder_is_locked_too(tmp_path):
    db = tmp_path / "shared" / "mlflow.db"
    assert [p.name for p in lock_paths(tmp_path / "runs", tmp_path / "runs" / "mlflow.db")] == [LOCK_NAME]
    assert len(lock_paths(tmp_path / "runs", db)) == 2
    holder = _hold(tmp_path / "other_runs", db)
    try:  # another runs folder, the same store: refused, naming the store
        with pytest.raises(RunsFolderBusy, match="MLflow store .*shared/mlflow.db"):
            with runs_lock(tmp_path / "runs", db, "mine"):
                pass
    finally:
        holder.kill()
        holder.wait()


def test_wait_queues_behind_the_holder(tmp_path, capsys):
    import io

    runs = tmp_path / "runs"
    holder = _hold(runs, seconds=2)
    said = io.StringIO()
    t0 = time.monotonic()
    with runs_lock(runs, None, "mine", wait=True, stream=said):
        waited = time.monotonic() - t0
    holder.wait()
    assert "waiting for lsbench run of study 'holder-study'" in said.getvalue()
    assert waited > 0.5


def test_run_on_a_busy_runs_folder_exits_2_and_touches_nothing(tmp_path):
    runs = tmp_path / "runs"
    holder = _hold(runs)
    try:
        r = lsbench("run", write_study(tmp_path), "--runs-dir", runs, "--executor", "local", cwd=tmp_path)
    finally:
        holder.kill()
        holder.wait()
    assert r.returncode == 2, r.stderr[-2000:]
    assert "Traceback" not in r.stderr
    assert "is in use by lsbench run of study 'holder-study'" in r.stderr
    assert not (runs / "mlflow.db").exists()


@pytest.mark.slow
def test_two_runs_started_together_on_a_new_folder(tmp_path):
    """One trains, the other exits 2 at once; with --wait it then finds the trial finished."""
    study = write_study(tmp_path)
    runs = tmp_path / "runs"
    cmd = [
        sys.executable,
        "-m",
        "lossscale_bench.cli",
        "run",
        str(study),
        "--runs-dir",
        str(runs),
        "--executor",
        "local",
        "--no-report",
    ]
    procs = [
        subprocess.Popen(cmd + extra, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for extra in ([], [])
    ]
    outs = [p.communicate(timeout=300) for p in procs]
    codes = sorted(p.returncode for p in procs)
    assert codes == [0, 2], [o[1][-1500:] for o in outs]
    refused = outs[[p.returncode for p in procs].index(2)][1]
    assert "is in use by lsbench run of study 't'" in refused and "Traceback" not in refused
    con = sqlite3.connect(runs / "mlflow.db")
    tables = {r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type='table'")}
    assert not [t for t in tables if t.startswith("_alembic_tmp_")]
    # both with --wait: each runs in turn, the second finds the trial done; one run per trial id
    procs = [
        subprocess.Popen(cmd + ["--wait"], cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for _ in range(2)
    ]
    outs = [p.communicate(timeout=300) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], [o[1][-1500:] for o in outs]
    trial_runs = con.execute("SELECT count(*) FROM tags WHERE key='lsbench.role' AND value='trial'").fetchone()[0]
    assert trial_runs == 1


def test_half_migrated_store_is_exit_4_with_what_to_do(tmp_path):
    """The state two racing migrations left behind (a table ``_alembic_tmp_metrics``): one line, exit 4."""
    from lossscale_bench.tracking import Tracker

    runs = tmp_path / "runs"
    Tracker(f"sqlite:///{runs / 'mlflow.db'}")
    con = sqlite3.connect(runs / "mlflow.db")
    con.execute("CREATE TABLE _alembic_tmp_metrics (x INTEGER)")
    con.commit()
    con.close()
    before = (runs / "mlflow.db").read_bytes()
    for args in (["run", write_study(tmp_path), "--executor", "local"], ["report", "--no-plots"]):
        r = lsbench(*args, "--runs-dir", runs, cwd=tmp_path)
        assert r.returncode == 4, r.stderr[-2000:]
        lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
        assert len(lines) == 1 and "half-migrated" in lines[0] and "_alembic_tmp_metrics" in lines[0]
        assert "mlflow db upgrade" in lines[0]
    assert (runs / "mlflow.db").read_bytes() == before
    assert os.environ.get("MLFLOW_TRACKING_URI") is None
