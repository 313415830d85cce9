"""A failed trial rerun to the end starts a clean record.

Through the real CLI (``lsbench run --executor local``, in this process so that one
training step can be made to raise once): a study of two trials whose first trial
fails at step 30, after its checkpoint at step 20 and after its metrics up to step 30
reached MLflow; the second finishes. ``report --telemetry`` then names the failed
trial it leaves out. The same command again resumes the failed trial from step 20 and
finishes it. Its run must then describe the attempt that finished: no ``lsbench.error``
tag and no ``error.txt`` of the failed attempt, one metric point per step (the steps
21-30 the failed attempt logged are not logged twice), and the earlier failure kept
where a user finds it (``lsbench.previous_error``, artifact ``failed_attempts/1/error.txt``).
"""

from __future__ import annotations

from collections import Counter

import pytest

from helpers import study_yaml
from lossscale_bench.cli import main

ITERATIONS, EVAL_EVERY, CRASH_AT = 40, 20, 30  # the checkpoint follows the evaluation: step 20


@pytest.fixture(scope="module")
def rerun(tmp_path_factory):
    """The study run twice through the CLI: the first trial crashes once, at step 30."""
    from lossscale_bench.engine import loop

    tmp = tmp_path_factory.mktemp("rerun")
    study = tmp / "rerun.yaml"
    study.write_text(
        study_yaml(
            name="rerun",
            scaling=["{method: none, label: crashes}", "{method: fixed, scale: 128, label: steady}"],
            schedule={"iterations": ITERATIONS, "lr": 0.01, "warmup_iterations": 2},
            eval={"every": EVAL_EVERY, "metric": "coco", "max_images": 4},
            log_every=2,
        )
    )
    runs = tmp / "runs"
    args = ["run", str(study), "--executor", "local", "--runs-dir", str(runs), "--no-report", "--quiet"]
    real_step, crashed = loop.Trainer.train_step, []

    def crash_once(self, images, targets):
        if self.state.step == CRASH_AT and not crashed:
            crashed.append(True)
            raise RuntimeError("simulated crash")
        return real_step(self, images, targets)

    mp = pytest.MonkeyPatch()
    mp.setattr(loop.Trainer, "train_step", crash_once)
    try:
        first = main(args)
    finally:
        mp.undo()
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=f"sqlite:///{runs / 'mlflow.db'}")
    exp = client.get_experiment_by_name("rerun")
    before = {
        r.data.tags["lsbench.label"]: r
        for r in client.search_runs([exp.experiment_id], "tags.`lsbench.role` = 'trial'")
    }
    return {"runs": runs, "args": args, "first": first, "client": client, "exp": exp, "before": before}


def _trials(client, exp):
    return {
        r.data.tags["lsbench.label"]: r
        for r in client.search_runs([exp.experiment_id], "tags.`lsbench.role` = 'trial'")
    }


def test_telemetry_report_names_the_failed_trials_it_leaves_out(rerun, capsys):
    assert rerun["first"] == 3  # a trial failed
    bad = rerun["before"]["crashes"]
    assert bad.data.tags["lsbench.status"] == "failed"
    capsys.readouterr()
    assert main(["report", "--runs-dir", str(rerun["runs"]), "--study", "rerun", "--telemetry"]) == 0
    out = capsys.readouterr().out
    table = [ln for ln in out.splitlines() if ln.startswith("| ")]
    assert any(ln.startswith("| steady |") for ln in table) and not any("crashes" in ln for ln in table)
    left = [ln for ln in out.splitlines() if ln.startswith("Left out")]
    assert len(left) == 1, out
    assert "1 failed trial" in left[0] and "crashes" in left[0] and bad.data.tags["lsbench.trial_id"] in left[0]


@pytest.fixture(scope="module")
def finished(rerun):
    """The same command again: the failed trial resumes from step 20 and finishes."""
    code = main(rerun["args"])
    return code, _trials(rerun["client"], rerun["exp"])["crashes"]


def test_the_rerun_resumes_and_finishes(rerun, finished):
    code, run = finished
    assert code == 0
    assert run.info.run_id == rerun["before"]["crashes"].info.run_id  # the same run, continued
    assert run.info.status == "FINISHED" and run.data.tags["lsbench.status"] == "finished"
    assert run.data.tags["lsbench.resumed_from_step"] == str(EVAL_EVERY)


def test_a_finished_run_carries_no_error_of_an_earlier_attempt(rerun, finished):
    client, (_, run) = rerun["client"], finished
    assert "lsbench.error" not in run.data.tags
    top = {a.path for a in client.list_artifacts(run.info.run_id)}
    assert "error.txt" not in top, top
    assert "failed" not in run.info.run_name and run.data.tags["mlflow.note.content"].startswith("**finished**")
    assert run.data.tags["lsbench.status"] == "finished"


def test_the_earlier_failure_is_kept_where_a_user_finds_it(rerun, finished, tmp_path):
    client, (_, run) = rerun["client"], finished
    assert "RuntimeError: simulated crash" in run.data.tags["lsbench.previous_error"]
    assert run.data.tags["lsbench.failed_attempts"] == "1"
    kept = client.download_artifacts(run.info.run_id, "failed_attempts/1/error.txt", str(tmp_path))
    text = open(kept).read()
    assert "Traceback" in text and "simulated crash" in text
    assert "failed attempt" in run.data.tags["mlflow.note.content"]
    # the trial's own folder too: the traceback moved aside, not left as the finished trial's error
    tdir = rerun["runs"] / "rerun" / "trials" / run.data.tags["lsbench.trial_id"]
    assert not (tdir / "error.txt").exists()
    assert "simulated crash" in (tdir / "failed_attempts" / "1" / "error.txt").read_text()


@pytest.mark.parametrize("key", ["loss", "lr", "loss_scale", "overflow", "skipped_steps", "images_per_sec"])
def test_every_step_has_exactly_one_point(rerun, finished, key):
    """Steps 21-30 ran twice (the failed attempt logged them, the rerun recomputed them from the
    step-20 checkpoint); each is in the history once, as in a trial that never failed."""
    client, (_, run) = rerun["client"], finished
    steps = Counter(m.step for m in client.get_metric_history(run.info.run_id, key))
    assert sorted(steps) == list(range(1, ITERATIONS + 1)), sorted(steps)
    assert set(steps.values()) == {1}, {s: n for s, n in steps.items() if n > 1}


def test_evaluations_and_telemetry_have_one_point_per_logged_step(rerun, finished):
    client, (_, run) = rerun["client"], finished
    maps = Counter(m.step for m in client.get_metric_history(run.info.run_id, "map"))
    assert maps == Counter({EVAL_EVERY: 1, ITERATIONS: 1})
    rates = Counter(m.step for m in client.get_metric_history(run.info.run_id, "flush_rate_mean"))
    assert rates and set(rates.values()) == {1}, rates


def test_a_failure_without_a_traceback_file_keeps_its_error_text(tmp_path):
    """Ray gave up on a trial whose process kept dying (``record_failure``): an error tag, no
    ``error.txt``. Its next attempt keeps the text as ``failed_attempts/1/error.txt``; a second
    failure and rerun numbers the next one 2, and no tag of an attempt outlives it."""
    from lossscale_bench.orchestration.outcomes import StudyResult, record_failure
    from lossscale_bench.study import load_study_text
    from lossscale_bench.tracking import Tracker

    (cfg,) = load_study_text(study_yaml(name="gaveup")).trials()
    tracker = Tracker(f"sqlite:///{tmp_path / 'mlflow.db'}")
    exp_id, parent = tracker.study_run("gaveup")
    result = StudyResult("gaveup", tracker.uri)
    run_id = tracker.ensure_trial_run(exp_id, parent, cfg)
    for attempt in (1, 2):
        tracker.log_metrics(run_id, [("loss", 1.0 * attempt, s) for s in range(1, 11)])
        tracker.set_tags(run_id, {"lsbench.resumed_from_step": 4, "lsbench.retries": 3})
        record_failure(tracker, result, cfg.trial_id, run_id, f"worker died, attempt {attempt}")
        existing = tracker.trial_runs(exp_id)[cfg.trial_id]
        assert tracker.ensure_trial_run(exp_id, parent, cfg, existing) == run_id
        tags = tracker.client.get_run(run_id).data.tags
        assert tags["lsbench.previous_error"] == f"worker died, attempt {attempt}"
        assert tags["lsbench.failed_attempts"] == str(attempt) and tags["lsbench.status"] == "pending"
        assert not {"lsbench.error", "lsbench.resumed_from_step", "lsbench.retries"} & set(tags)
        kept = tracker.client.download_artifacts(run_id, f"failed_attempts/{attempt}/error.txt", str(tmp_path))
        assert open(kept).read() == f"worker died, attempt {attempt}"
    # the second attempt's steps 1-10 were the first's, recomputed: logged once, with the first values
    tracker.log_metrics(run_id, [("loss", 3.0, s) for s in range(5, 13)])
    hist = {m.step: m.value for m in tracker.client.get_metric_history(run_id, "loss")}
    assert len(tracker.client.get_metric_history(run_id, "loss")) == 12
    assert hist == {**{s: 1.0 for s in range(1, 11)}, 11: 3.0, 12: 3.0}
