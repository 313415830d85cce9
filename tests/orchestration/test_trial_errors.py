"""An error while preparing or writing a trial: one line, exit 3, every run closed, no earlier result
changed, and under Ray no retry (the same error would come back); Ctrl-C twice still counts the runs
it marked KILLED.

The error is a real one: the study's ``trials`` folder is a file, so no trial folder can be made
(root writes into read-only folders, a file in the way stops everyone).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from helpers import library_lines, lsbench, study_yaml

#: the template study of the trust round: two rows, short
TWO_ROWS = dict(
    name="prep",
    dataset={"name": "synthetic", "train_images": 16, "val_images": 8, "image_size": 64, "seed": 0},
    scaling=["{method: none}", "{method: fixed, scale: 128}"],
    schedule={"iterations": 3, "lr": 0.01},
    log_every=1,
)


def _runs(runs: Path, name: str):
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=f"sqlite:///{runs / 'mlflow.db'}")
    exp = client.get_experiment_by_name(name)
    return {r.data.tags.get("lsbench.trial_id", "study"): r for r in client.search_runs([exp.experiment_id])}


def _blocked(tmp_path: Path, name: str) -> Path:
    """A runs folder whose ``<study>/trials`` is a file."""
    runs = tmp_path / "runs"
    (runs / name).mkdir(parents=True)
    (runs / name / "trials").write_text("in the way\n")
    return runs


def _one_line_failures(r: subprocess.CompletedProcess, n: int) -> None:
    assert r.returncode == 3, (r.returncode, r.stdout[-2000:], r.stderr[-3000:])
    assert "Traceback" not in r.stderr and not library_lines(r.stderr), r.stderr[-3000:]
    failed = [ln for ln in r.stdout.splitlines() if " failed   " in ln]
    assert len(failed) == n and all("NotADirectoryError" in ln for ln in failed), r.stdout


def test_a_trial_folder_that_cannot_be_made_fails_the_trial_not_the_study(tmp_path):
    (tmp_path / "s.yaml").write_text(study_yaml(**TWO_ROWS))
    runs = _blocked(tmp_path, "prep")
    r = lsbench("run", "s.yaml", "--runs-dir", runs, "--executor", "local", "--no-report", cwd=tmp_path)
    _one_line_failures(r, 2)
    stored = _runs(runs, "prep")
    assert {(r.info.status, r.data.tags["lsbench.status"]) for r in stored.values()} == {("FAILED", "failed")}
    assert all("NotADirectoryError" in r.data.tags["lsbench.error"] for t, r in stored.items() if t != "study")


@pytest.mark.slow
def test_under_ray_the_same_error_is_not_retried(tmp_path):
    (tmp_path / "s.yaml").write_text(study_yaml(**{**TWO_ROWS, "scaling": ["{method: none}"]}))
    runs = _blocked(tmp_path, "prep")
    r = lsbench("run", "s.yaml", "--runs-dir", runs, "--num-cpus", "1", "--no-report", cwd=tmp_path)
    _one_line_failures(r, 1)
    assert "retrying" not in r.stdout, r.stdout
    (run,) = [r for t, r in _runs(runs, "prep").items() if t != "study"]
    assert run.info.status == "FAILED" and "lsbench.retries" not in run.data.tags


def _wait_for_checkpoint(proc, runs: Path, name: str) -> None:
    deadline = time.time() + 240
    while time.time() < deadline and proc.poll() is None and not list((runs / name / "trials").glob("*/checkpoint.pt")):
        time.sleep(0.2)


def test_a_rerun_stopped_before_a_failed_trial_leaves_its_result(tmp_path):
    """The first run fails both trials; the second is stopped in its first trial: the second
    trial did not run again, so its run still says failed, with its error (it read pending,
    RUNNING and then KILLED: an earlier result changed by a run that never ran it)."""
    (tmp_path / "s.yaml").write_text(
        study_yaml(
            **{
                **TWO_ROWS,
                "schedule": {"iterations": 200, "lr": 0.01},
                "eval": "{every: 20, metric: coco, max_images: 4}",
            }
        )
    )
    runs = _blocked(tmp_path, "prep")
    cmd = ["run", "s.yaml", "--runs-dir", runs, "--executor", "local", "--no-report", "--quiet"]
    assert lsbench(*cmd, cwd=tmp_path).returncode == 3
    (runs / "prep" / "trials").unlink()
    proc = subprocess.Popen(
        [sys.executable, "-m", "lossscale_bench.cli", *map(str, cmd)],
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        _wait_for_checkpoint(proc, runs, "prep")
        os.kill(proc.pid, signal.SIGINT)
        out, err = proc.communicate(timeout=180)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 130, (out[-2000:], err[-3000:])
    assert "1 unfinished trial run(s) marked KILLED" in err, err
    started = (runs / "prep" / "trials").iterdir()
    (first,) = [p.name for p in started]
    stored = _runs(runs, "prep")
    assert (stored[first].info.status, stored[first].data.tags["lsbench.status"]) == ("KILLED", "interrupted")
    (other,) = [r for t, r in stored.items() if t not in (first, "study")]
    assert (other.info.status, other.data.tags["lsbench.status"]) == ("FAILED", "failed"), other.data.tags
    assert "NotADirectoryError" in other.data.tags["lsbench.error"]


def test_a_second_signal_says_how_many_runs_the_first_marked_killed():
    """Ctrl-C twice: the second lands while Ray shuts down and raises an ``Interrupted`` of its own;
    the line it gives must count the runs the first one's handling marked KILLED (it said 0)."""
    from lossscale_bench.orchestration.signals import Interrupted, SignalsRaise

    guard = SignalsRaise()
    guard.install()
    try:
        with pytest.raises(Interrupted) as first:
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(5)
        guard.hold()
        first.value.killed = guard.killed = 4  # as _run_locked does after marking four runs
        guard.install()
        with pytest.raises(Interrupted) as second:
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(5)
    finally:
        guard.restore()
    assert second.value.killed == 4


def test_the_local_executors_eta_counts_one_trial_at_a_time(tmp_path):
    """The ETA divides the remaining trials' time by how many run at once: one under ``--executor
    local``, whatever the CPUs (it divided by them, 2-3x too low on a many-core machine)."""
    from lossscale_bench.orchestration.study_runner import _Options, _StudyRun
    from lossscale_bench.study import load_study_text

    study = load_study_text(study_yaml(**TWO_ROWS))
    for executor, cpus, want in (("local", 8, 1), ("ray", 8, 8)):
        opts = _Options(None, None, cpus, executor, True, None, None, True)
        progress = _StudyRun(study, tmp_path, "sqlite:///unused.db", opts)._progress({})
        assert progress.concurrency == want, executor
        progress.durations, progress.status = [60.0], {"a": "finished"}
        if executor == "local":  # 1 of 2 done in a minute: one more minute to go
            assert "ETA ~1.0 min" in progress._summary()


class _ReaderLeft:
    """Standard output whose reader went away after the first trial (``lsbench run | head -3``)."""

    def __init__(self) -> None:
        self.lines = 0

    def write(self, text: str) -> None:
        if "start" in text and self.lines:
            raise BrokenPipeError(32, "Broken pipe")
        self.lines += text.count("\n")

    def flush(self) -> None:
        pass


def test_a_study_stopped_by_an_error_leaves_no_run_running(tmp_path):
    """An error in the driver between two trials (here the console's reader left) ends the trial
    that ran as it ended, the one that had not started KILLED (resumable) and the parent FAILED;
    nothing stays RUNNING in the store (it did, tagged pending, forever)."""
    from lossscale_bench.orchestration import run_study
    from lossscale_bench.study import load_study_text

    study = load_study_text(study_yaml(**TWO_ROWS))
    runs = tmp_path / "runs"
    with pytest.raises(BrokenPipeError):
        run_study(study, runs_dir=runs, executor="local", stream=_ReaderLeft())
    stored = _runs(runs, "prep")
    assert sorted((r.info.status, r.data.tags["lsbench.status"]) for r in stored.values()) == [
        ("FAILED", "failed"),
        ("FINISHED", "finished"),
        ("KILLED", "interrupted"),
    ], stored
    assert "BrokenPipeError" in stored["study"].data.tags["lsbench.error"]
