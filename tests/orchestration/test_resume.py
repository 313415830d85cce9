"""Faults: kill -9 of the driver mid-study, then the same command again.

Finished trials are not rerun; the interrupted trial continues from its last
checkpoint; each trial keeps one MLflow child run; the report has the same shape.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from helpers import study_yaml

#: two trials long enough to be interrupted mid-run (the base study of tests/helpers.py otherwise)
RESUME = dict(
    name="resume",
    dataset={"name": "synthetic", "train_images": 16, "val_images": 8, "image_size": 64, "seed": 0},
    precision="fp16-emulated",
    scaling=["{method: fixed, scale: 128}", "{method: dynamic, interval: 10}"],
    schedule={"iterations": 400, "lr": 0.01, "warmup_iterations": 4},
    eval={"every": 20, "metric": "coco", "max_images": 4},
    log_every=10,
)
STUDY = study_yaml(**RESUME)


def _cmd(study, runs):
    return [
        sys.executable,
        "-m",
        "lossscale_bench.cli",
        "run",
        str(study),
        "--runs-dir",
        str(runs),
        "--num-cpus",
        "1",
        "--no-report",
        "--quiet",
    ]


def _checkpoints(runs: Path):
    return list((runs / "resume" / "trials").glob("*/checkpoint.pt"))


@pytest.mark.slow
def test_kill_driver_then_resume(tmp_path):
    from mlflow.tracking import MlflowClient

    study = tmp_path / "resume.yaml"
    study.write_text(STUDY)
    runs = tmp_path / "runs"
    # one CPU: the two trials run one after the other, so the kill lands mid-study
    proc = subprocess.Popen(
        _cmd(study, runs), cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True
    )
    deadline = time.time() + 240
    while time.time() < deadline and not _checkpoints(runs):
        time.sleep(0.5)
    assert _checkpoints(runs), "no checkpoint appeared"
    time.sleep(1.0)
    os.killpg(proc.pid, signal.SIGKILL)  # the driver and everything it started, at once
    proc.wait(timeout=30)
    ck = _checkpoints(runs)[0]
    interrupted = ck.parent.name

    r = subprocess.run(_cmd(study, runs), cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
    client = MlflowClient(tracking_uri=f"sqlite:///{runs / 'mlflow.db'}")
    exp = client.get_experiment_by_name("resume")
    trials = client.search_runs([exp.experiment_id], "tags.`lsbench.role` = 'trial'")
    assert len(trials) == 2, [t.data.tags.get("lsbench.trial_id") for t in trials]
    assert {t.data.tags["lsbench.status"] for t in trials} == {"finished"}
    resumed = [t for t in trials if t.data.tags["lsbench.trial_id"] == interrupted][0]
    assert int(resumed.data.tags["lsbench.resumed_from_step"]) >= 20
    steps = [m.step for m in client.get_metric_history(resumed.info.run_id, "loss")]
    assert set(steps) == set(range(1, 401))  # no gap across the kill
    assert len(steps) == 400  # and no step twice: those after the checkpoint were not logged again
    assert not _checkpoints(runs)  # finished trials drop their checkpoints
    assert len(client.search_runs([exp.experiment_id], "tags.`lsbench.role` = 'study'")) == 1
    # the report has the shape of an uninterrupted study's: one row per trial, each with a value
    rep = subprocess.run(
        [
            sys.executable,
            "-m",
            "lossscale_bench.cli",
            "report",
            "--study",
            "resume",
            "--runs-dir",
            str(runs),
            "--no-plots",
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert rep.returncode == 0, rep.stderr
    rows = [ln for ln in rep.stdout.splitlines() if ln.startswith("| SSD-tiny")]
    assert len(rows) == 2 and all(
        ln.rstrip(" |").split("|")[-1].strip()[:1].isdigit() or ln.split("|")[-2].strip().strip("*")[:1].isdigit()
        for ln in rows
    ), rows


@pytest.mark.slow
def test_killed_worker_is_retried_from_its_checkpoint(tmp_path):
    from mlflow.tracking import MlflowClient

    study = tmp_path / "resume.yaml"
    study.write_text(
        study_yaml(
            **{
                **RESUME,
                "scaling": ["{method: fixed, scale: 128}"],
                "schedule": {"iterations": 200, "lr": 0.01, "warmup_iterations": 4},
            }
        )
    )
    runs = tmp_path / "runs"
    proc = subprocess.Popen(
        _cmd(study, runs),
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        start_new_session=True,
        text=True,
    )
    deadline = time.time() + 240
    while time.time() < deadline and not _checkpoints(runs):
        time.sleep(0.3)
    assert _checkpoints(runs), "no checkpoint appeared"
    pid = int((_checkpoints(runs)[0].parent / "pid").read_text())
    os.kill(pid, signal.SIGKILL)  # the Ray worker running the trial, not the driver
    out, _ = proc.communicate(timeout=600)
    assert proc.returncode == 0, out[-3000:]
    client = MlflowClient(tracking_uri=f"sqlite:///{runs / 'mlflow.db'}")
    exp = client.get_experiment_by_name("resume")
    (run,) = client.search_runs([exp.experiment_id], "tags.`lsbench.role` = 'trial'")
    assert run.data.tags["lsbench.status"] == "finished"
    assert int(run.data.tags["lsbench.resumed_from_step"]) >= 20
    assert "lsbench.retries" in run.data.tags
    steps = [m.step for m in client.get_metric_history(run.info.run_id, "loss")]
    assert sorted(steps) == list(range(1, 201))  # the retry's recomputed steps are not logged twice
