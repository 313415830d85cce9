"""Ray retried a trial whose process died: the driver's funnel writes what the
retried process reports into the same run, and the steps the dead process had logged after its
checkpoint, recomputed by the retry, must not be logged twice (the 470 ``loss`` points of a
400-step trial). No Ray cluster: the funnel's callbacks are called as Tune calls them."""

from __future__ import annotations

import io
import json
from collections import Counter
from types import SimpleNamespace

from helpers import study_yaml


def test_a_retried_trial_logs_each_step_once(tmp_path):
    from lossscale_bench.orchestration.funnel import MlflowFunnel
    from lossscale_bench.orchestration.outcomes import StudyResult
    from lossscale_bench.orchestration.progress import Progress
    from lossscale_bench.study import load_study_text
    from lossscale_bench.tracking import Tracker

    (cfg,) = load_study_text(study_yaml(name="retry")).trials()
    tracker = Tracker(f"sqlite:///{tmp_path / 'mlflow.db'}")
    exp_id, parent = tracker.study_run("retry")
    run_id = tracker.ensure_trial_run(exp_id, parent, cfg)
    funnel = MlflowFunnel(
        tracker,
        {cfg.trial_id: run_id},
        {cfg.trial_id: cfg.label},
        StudyResult("retry", tracker.uri),
        Progress(1, 0, 1, quiet=True, stream=io.StringIO()),
        {cfg.trial_id: 40},
    )
    trial = SimpleNamespace(config={"trial": {"cfg": {"trial_id": cfg.trial_id}}}, num_failures=1)

    def report(steps, value):
        items = [[key, value, s] for s in steps for key in ("loss", "lr")]
        funnel.on_trial_result(0, [], trial, {"lsbench": json.dumps({"metrics": items})})

    report(range(1, 31), 1.0)  # the first process: steps 1-30, then it dies (checkpoint at 20)
    funnel.on_trial_recover(0, [], trial)
    report(range(21, 41), 2.0)  # the retry resumes at 20
    for key in ("loss", "lr"):
        hist = tracker.client.get_metric_history(run_id, key)
        assert Counter(m.step for m in hist) == Counter(range(1, 41)), key
    assert tracker.client.get_run(run_id).data.tags["lsbench.retries"] == "1"
