"""Through the CLI: a stochastic-FP4 study interrupted and run again logs what an uninterrupted run logs.

Three rows, one per kind of FP4 gradient (plain E2M1, NVFP4, MXFP4), stochastic rounding (the default).
The reference runs straight through; one copy is stopped with Ctrl-C under ``--executor local``, another
with kill -9 of the whole driver under Ray; each is then run again with the same command and resumes its
unfinished trials from their checkpoints. Every logged value (less time and memory) of every trial must
equal the reference's, step for step.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import pytest
from test_resume import _cmd as resume_cmd

from helpers import study_yaml

ROWS = [
    f"{{method: fixed, scale: 1024, precision: e4m3fwd-{g}grad-emulated, label: {g}}}"
    for g in ("e2m1", "nvfp4", "mxfp4")
]
STUDY = study_yaml(
    name="fp4resume",
    precision="e4m3fwd-nvfp4grad-emulated",
    scaling=ROWS,
    schedule={"iterations": 40, "lr": 0.01, "warmup_iterations": 4},
    eval={"every": 20, "metric": "coco", "max_images": 4},
    log_every=1,
)


def _cmd(study: Path, runs: Path, executor: str) -> list[str]:
    return [*resume_cmd(study, runs), "--executor", executor]


def _histories(runs: Path) -> dict[str, dict[str, list[tuple[int, float]]]]:
    """trial id -> metric -> [(step, value)], every metric but those that measure the machine."""
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=f"sqlite:///{runs / 'mlflow.db'}")
    exp = client.get_experiment_by_name("fp4resume")
    out = {}
    for run in client.search_runs([exp.experiment_id], "tags.`lsbench.role` = 'trial'"):
        assert run.data.tags["lsbench.status"] == "finished", run.data.tags
        keys = [k for k in run.data.metrics if k != "images_per_sec" and not k.startswith(("host_", "device_"))]
        out[run.data.tags["lsbench.trial_id"]] = {
            k: sorted((m.step, m.value) for m in client.get_metric_history(run.info.run_id, k)) for k in keys
        }
    return out


def _interrupt_and_resume(tmp_path: Path, executor: str, stop) -> tuple[dict, set[str]]:
    study = tmp_path / "fp4resume.yaml"
    study.write_text(STUDY)
    runs = tmp_path / f"runs_{executor}"
    proc = subprocess.Popen(
        _cmd(study, runs, executor),
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        deadline = time.time() + 300
        while (
            time.time() < deadline and proc.poll() is None and not list(runs.glob("fp4resume/trials/*/checkpoint.pt"))
        ):
            time.sleep(0.2)
        interrupted = {p.parent.name for p in runs.glob("fp4resume/trials/*/checkpoint.pt")}
        assert interrupted, "no checkpoint appeared"
        stop(proc)
        proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    r = subprocess.run(_cmd(study, runs, executor), cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
    return _histories(runs), interrupted


@pytest.fixture(scope="module")
def reference(tmp_path_factory) -> dict:
    tmp = tmp_path_factory.mktemp("fp4ref")
    study = tmp / "fp4resume.yaml"
    study.write_text(STUDY)
    r = subprocess.run(_cmd(study, tmp / "runs", "local"), cwd=tmp, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
    hist = _histories(tmp / "runs")
    assert len(hist) == 3 and all(len(h["loss"]) == 40 for h in hist.values())
    return hist


def _same_as(reference: dict, got: dict, interrupted: set[str]) -> None:
    assert set(got) == set(reference) and interrupted <= set(got)
    for tid in got:  # the trials resumed from a checkpoint and the others alike
        assert got[tid].keys() == reference[tid].keys(), tid
        for key, values in reference[tid].items():
            assert got[tid][key] == values, (tid, key)


@pytest.mark.slow
def test_ctrl_c_then_resume_local_equals_the_uninterrupted_study(tmp_path, reference):
    got, interrupted = _interrupt_and_resume(tmp_path, "local", lambda p: os.kill(p.pid, signal.SIGINT))
    _same_as(reference, got, interrupted)


@pytest.mark.slow
def test_kill_9_then_resume_under_ray_equals_the_uninterrupted_study(tmp_path, reference):
    got, interrupted = _interrupt_and_resume(tmp_path, "ray", lambda p: os.killpg(p.pid, signal.SIGKILL))
    _same_as(reference, got, interrupted)
