"""A driver killed with SIGKILL as a trial ends: the trial's tag says finished, its MLflow status stays RUNNING.

No handler runs on SIGKILL, so the store is left as the kill found it. A rerun of the study holds the runs
folder's lock, so no other driver runs those runs: it closes each as what it is (``study_runner._reconcile``).
The states are built as the kill leaves them (the tag written, the status not), then the study is run again.
"""

from __future__ import annotations

from helpers import lsbench, study_yaml


def _runs(db):
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=f"sqlite:///{db}")
    exp = client.get_experiment_by_name("mend")
    return client, {
        r.data.tags["lsbench.trial_id"]: r
        for r in client.search_runs([exp.experiment_id], "tags.`lsbench.role` = 'trial'")
    }


def test_a_rerun_closes_the_runs_a_killed_driver_left_running(tmp_path):
    (tmp_path / "s.yaml").write_text(study_yaml(name="mend", seeds=[0, 1, 2]))
    cmd = ["run", "s.yaml", "--runs-dir", "runs", "--executor", "local", "--no-report"]
    r = lsbench(*cmd, cwd=tmp_path, timeout=900)
    assert r.returncode == 0, r.stderr[-3000:]
    db = tmp_path / "runs" / "mlflow.db"
    client, runs = _runs(db)
    done, mid, failed = sorted(runs)
    # killed as `done` ended: its outcome's tag arrived, its status did not
    client.update_run(runs[done].info.run_id, status="RUNNING")
    # killed while `mid` trained: tag running, status RUNNING
    client.update_run(runs[mid].info.run_id, status="RUNNING")
    client.set_tag(runs[mid].info.run_id, "lsbench.status", "running")
    # a failure recorded, its status not
    client.update_run(runs[failed].info.run_id, status="RUNNING")
    client.set_tag(runs[failed].info.run_id, "lsbench.status", "failed")
    client.set_tag(runs[failed].info.run_id, "lsbench.error", "RuntimeError: boom")
    # the study file now asks for seed 0 only: the others are not run by this invocation, and still closed
    (tmp_path / "s.yaml").write_text(study_yaml(name="mend", seeds=[0]))
    r = lsbench(*cmd, cwd=tmp_path, timeout=900)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "already finished or diverged: not run again" in r.stdout
    _, runs = _runs(db)
    got = {tid: (run.info.status, run.data.tags["lsbench.status"]) for tid, run in runs.items()}
    assert got == {
        done: ("FINISHED", "finished"),
        mid: ("KILLED", "interrupted"),  # resumed when the study asks for it again
        failed: ("FAILED", "failed"),
    }, got
