"""How a trial's end is recorded: the same four writes whichever executor ran it.

Why one place: the in-process runner and the Ray funnel both end a trial the
same way (keep its outcome for the caller, draw its plots from the store, end
its MLflow run as finished/diverged/failed, print its line), and a trial Ray
gave up on or never reported on ends the same way as a failed one. Written
twice, the two executors would drift apart in what a study's runs show.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ..tracking.tracker import Tracker
    from .progress import Progress


@dataclass
class StudyResult:
    study: str
    tracking_uri: str
    outcomes: dict[str, dict] = field(default_factory=dict)  # trial_id -> outcome dict
    skipped: list[str] = field(default_factory=list)  # already done before this run

    def counts(self) -> dict[str, int]:
        c = {"finished": 0, "diverged": 0, "failed": 0}
        for o in self.outcomes.values():
            c[o.get("status", "failed")] = c.get(o.get("status", "failed"), 0) + 1
        c["already_done"] = len(self.skipped)
        return c


def log_trial_plots(tracker: Tracker, run_id: str, out_dir: Path, draw=None) -> None:
    """Loss, loss-scale and per-layer heatmaps as artifacts of the trial's run, drawn from the
    store (so a resumed trial's plots cover all of it). A plotting error never fails a trial.

    The drawing function is handed in (``run_study(trial_plots=...)``; the CLI passes
    ``lossscale_bench.plots.run_plots``): plots belong to the reporting layer, above this one.
    """
    if draw is None:
        return
    try:
        draw(tracker.client, run_id, out_dir)
    except Exception as exc:  # noqa: BLE001
        tracker.set_tags(run_id, {"lsbench.plot_error": f"{type(exc).__name__}: {exc}"[:500]})


def begin_trial(tracker: Tracker, continued: dict[str, tuple], tid: str) -> None:
    """A trial starts: a run it already had (``continued``: trial id -> (config, stored run)) is
    taken up again now (:meth:`.Tracker.continue_trial_run`), once, and not when the study
    opened its runs, so a study that stops before this trial runs leaves its earlier result."""
    if tid in continued:
        tracker.continue_trial_run(*continued.pop(tid))


def record_end(
    tracker: Tracker,
    result: StudyResult,
    progress: Progress,
    tid: str,
    label: str,
    run_id: str,
    outcome: dict,
    plots_dir: Path | None,
    draw=None,
) -> None:
    """A trial delivered its outcome: keep it, end its run, log its plots (when it has a folder), say so.

    The run is ended first: its ``lsbench.status`` tag (written by the trial) already says the outcome,
    and a driver killed before the MLflow status follows leaves the two disagreeing (a rerun mends it,
    ``study_runner``); drawing the plots first would widen that window by seconds."""
    result.outcomes[tid] = outcome
    tracker.end_trial(run_id, outcome["status"])
    if plots_dir is not None:
        log_trial_plots(tracker, run_id, plots_dir, draw)
    if (
        plots_dir is not None
        and outcome.get("status") in ("finished", "diverged")
        and tracker.artifacts_elsewhere(run_id)
    ):
        # everything it wrote is in the tracking server's store now, and it is not run again: the runs
        # folder keeps only what unfinished trials resume from
        import shutil

        shutil.rmtree(plots_dir.parent, ignore_errors=True)
    progress.end(tid, label, outcome)


def record_failure(tracker: Tracker, result: StudyResult, tid: str, run_id: str, error: str) -> dict:
    """A trial that delivered no outcome ends failed, with ``error`` on its run; returns its outcome."""
    outcome = {"trial_id": tid, "status": "failed", "error": error}
    result.outcomes[tid] = outcome
    tracker.set_tags(run_id, {"lsbench.status": "failed", "lsbench.error": error[-5000:]})
    tracker.end_trial(run_id, "failed")
    return outcome
