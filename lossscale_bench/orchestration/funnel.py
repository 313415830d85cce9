"""The driver's Tune callback: the single MLflow writer for every Ray trial's reports.

Why a funnel: trials run in Ray worker processes, and SQLite (MLflow's default
store) takes one writer at a time; several trials logging every step hit
"database is locked". So a trial never touches MLflow: its ``TuneSink`` hands
batches of metrics/tags/artifacts to ``tune.report`` (as JSON under the
``lsbench`` key), and :class:`MlflowFunnel`, running in the driver, writes them,
batched, into the trial's child run. Any store works the same way.

This module imports Ray when it is imported (the callback must subclass Tune's
``Callback``), so only the Ray path imports it, inside the function that runs Tune.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING

from ray.tune import Callback

from .outcomes import StudyResult, begin_trial, record_end, record_failure
from .progress import Progress

if TYPE_CHECKING:
    from ..tracking.tracker import Tracker


def _error_text(trial) -> str:
    """The end of the failed trial's error file (Tune's traceback), "disk full: " first when it was that."""
    err = str(getattr(trial, "error_file", "") or "")
    msg = "trial process failed repeatedly"
    try:
        if err and Path(err).exists():
            msg = Path(err).read_text()[-2000:]
    except OSError:
        pass
    if "No space left on device" in msg or "[Errno 28]" in msg:
        msg = "disk full: " + msg  # the process died writing; say so before its traceback
    return msg


class MlflowFunnel(Callback):
    """Driver-side: the single writer to MLflow for every trial's reports.

    ``run_ids``, ``labels`` and ``iterations`` are keyed by trial id; outcomes go
    into ``study_result``, lines to ``progress``; ``trial_plots`` draws a finished
    trial's plots (see :func:`.outcomes.log_trial_plots`); ``continued``: the trials whose stored runs are
    taken up again as each starts (:func:`.outcomes.begin_trial`).
    """

    def __init__(
        self,
        tracker: Tracker,
        run_ids: dict[str, str],
        labels: dict[str, str],
        study_result: StudyResult,
        progress: Progress,
        iterations: dict[str, int],
        trial_plots=None,
        continued: dict[str, tuple] | None = None,
    ) -> None:
        super().__init__()
        self.continued = {} if continued is None else continued
        self.tracker, self.run_ids, self.labels = tracker, run_ids, labels
        self.study_result, self.progress, self.iterations = study_result, progress, iterations
        self.trial_plots = trial_plots

    def _tid(self, trial) -> str:
        return trial.config["trial"]["cfg"]["trial_id"]

    def on_step_end(self, iteration, trials, **info):
        """Tune's loop waits at most 0.1 s a step: a safe point for a stop signal (``signals.SignalsRaise``)."""
        from ..core.uninterrupted import safe_point

        safe_point()

    def on_trial_start(self, iteration, trials, trial, **info):
        tid = self._tid(trial)
        begin_trial(self.tracker, self.continued, tid)
        self.progress.start(tid, self.labels[tid])

    def on_trial_result(self, iteration, trials, trial, result, **info):
        raw = result.get("lsbench")
        if not raw:
            return
        tid = self._tid(trial)
        run_id = self.run_ids[tid]
        payload = json.loads(raw)
        if payload.get("metrics"):
            self.tracker.log_metrics(run_id, payload["metrics"])
            losses = [(s, v) for k, v, s in payload["metrics"] if k == "loss"]
            if losses:
                self.progress.step(tid, self.labels[tid], losses[-1][0], losses[-1][1], self.iterations[tid])
        if payload.get("tags"):
            self.tracker.set_tags(run_id, payload["tags"])
        for path, apath in payload.get("artifacts", []):
            self.tracker.log_artifact(run_id, path, apath)
        if "outcome" in payload:
            tdir = trial.config["trial"].get("trial_dir")
            record_end(
                self.tracker,
                self.study_result,
                self.progress,
                tid,
                self.labels[tid],
                run_id,
                payload["outcome"],
                Path(tdir) / "plots" if tdir else None,
                self.trial_plots,
            )

    def on_trial_error(self, iteration, trials, trial, **info):
        # Retries (FailureConfig.max_failures) are exhausted: the process kept dying.
        tid = self._tid(trial)
        outcome = record_failure(self.tracker, self.study_result, tid, self.run_ids[tid], _error_text(trial))
        self.progress.end(tid, self.labels[tid], outcome)

    def on_trial_recover(self, iteration, trials, trial, **info):
        tid = self._tid(trial)
        self.progress.line(f"    retrying {self.labels[tid]} ({tid}) from its last checkpoint")
        # the retry recomputes the steps the dead process logged after its checkpoint: not logged twice
        self.tracker.begin_attempt(self.run_ids[tid])
        self.tracker.set_tags(self.run_ids[tid], {"lsbench.retries": getattr(trial, "num_failures", "?")})
