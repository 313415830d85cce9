"""How a trial's end shows in the MLflow UI: run status, run name, description, default columns.

Why this exists: the MLflow runs table shows a run's *name* and its *status icon*
without any configuration, and nothing else of lsbench's tags. A diverged trial
ended FINISHED showed the same green tick as a healthy one. So the end of a
trial is written where the table shows it without a click:

=============  ==============  ==========================  =======================
lsbench.status MLflow status   run name                    why
=============  ==============  ==========================  =======================
finished       FINISHED (tick) ``label | trial_id``        trained and evaluated
diverged       FAILED (cross)  ``[diverged] label | ...``  no usable model; the
                                                           study goes on
failed         FAILED (cross)  ``[failed] label | ...``    an error; exit code 3
interrupted    KILLED          unchanged                   SIGINT/SIGTERM; resumed
=============  ==============  ==========================  =======================

Diverged and failed share MLflow's FAILED (MLflow has no third end state that
is not KILLED, and KILLED means "stopped from outside, will resume"); the run
name's prefix (first, so a narrow name column still shows it) and
``lsbench.status`` tell them apart. The run description
(``mlflow.note.content``, the run page's first box) says why it ended and at
which metric step. No mlflow import here: pure text, used by ``tracker``.
"""

from __future__ import annotations

import json
import math

#: lsbench.status -> MLflow RunStatus at the end of a trial
MLFLOW_STATUS = {"finished": "FINISHED", "diverged": "FAILED", "failed": "FAILED", "interrupted": "KILLED"}
#: lsbench.status values whose run name carries a ``[status]`` prefix
_MARKED = ("diverged", "failed")

#: The columns a researcher needs on a study's trial runs, as MLflow UI column keys.
VIEW_COLUMNS = (
    "tags.`lsbench.label`",
    "tags.`lsbench.status`",
    "metrics.`final_map`",
    "metrics.`skipped_steps`",
    "tags.`lsbench.diverged_step`",
    "tags.`lsbench.precision`",
)
#: Experiment tag ``mlflow.sharedViewState.<key>`` holds a saved runs-table view; the UI applies it
#: when the experiment is opened with ``?viewStateShareKey=<key>`` (MLflow 3.17 has no per-experiment
#: default view, so this link is how the columns come pre-selected).
VIEW_KEY = "lsbench"
VIEW_TAG = f"mlflow.sharedViewState.{VIEW_KEY}"


def base_run_name(label: str, trial_id: str) -> str:
    return f"{label} | {trial_id}"


def run_name(label: str, trial_id: str, status: str) -> str:
    """``label | trial_id``, after ``[diverged] ``/``[failed] `` when the trial ended so."""
    base = base_run_name(label, trial_id)
    return f"[{status}] {base}" if status in _MARKED else base


def mlflow_status(status: str) -> str:
    return MLFLOW_STATUS.get(status, "KILLED")


def _num(value) -> float | None:
    try:
        v = float(value)
    except (TypeError, ValueError):
        return None
    return v if math.isfinite(v) else None


def note(status: str, tags: dict, metrics: dict) -> str:
    """The run description (markdown): why the trial ended, and where."""
    if status == "diverged":
        step = tags.get("lsbench.diverged_step")
        text = f"**diverged** at step {step}" if step else "**diverged**"
        if tags.get("lsbench.diverged_reason"):
            text += f": {tags['lsbench.diverged_reason']}"
        loss = _num(tags.get("lsbench.last_finite_loss"))
        if loss is not None:
            text += f". Last finite loss {loss:.4g}"
            scale = _num(tags.get("lsbench.diverged_scale"))
            text += f" at loss scale {scale:.4g}" if scale is not None else ""
        text += (
            ". The step is the one under which the `loss`, `overflow` and `skipped` metrics are "
            "logged. MLflow status FAILED: no usable model (`lsbench.status` = diverged)."
        )
        return text
    if status == "failed":
        err = str(tags.get("lsbench.error") or "no error message").strip().splitlines()
        return (
            f"**failed**: {err[-1][:500] if err else ''}. Traceback: artifact `error.txt` (when the "
            "trial got as far as writing it). A re-run of the study runs this trial again."
        )
    if status == "finished":
        fm = _num(metrics.get("final_map"))
        skipped = _num(metrics.get("skipped_steps"))
        text = "**finished**"
        if fm is not None:
            text += f": final mAP {100 * fm:.2f} % (metric `final_map` {fm:.4f})"
        if skipped is not None:
            text += f", {int(skipped)} skipped steps"
        failures = tags.get("lsbench.failed_attempts")
        if failures and failures != "0":
            text += (
                f", after {failures} failed attempt(s) (the last one's error: tag `lsbench.previous_error`; "
                "tracebacks: artifacts `failed_attempts/<n>/error.txt`)"
            )
        return text + "."
    return f"**{status}**"


def view_state() -> str:
    """The saved runs-table view (JSON): trial runs grouped by ``lsbench.status`` (failed, diverged,
    finished: each its own block), lsbench's columns, newest first.

    Grouped because the UI folds child runs under their collapsed parent run and a shared
    view cannot expand it (``runsExpanded`` is not shared); inside groups runs are listed
    flat. The group rows show MLflow's *average* over the group's runs, which mixes
    configurations: a status count, not a result (``lsbench report`` pools seeds correctly).
    """
    return json.dumps(
        {
            "searchFilter": "tags.`lsbench.role` = 'trial'",
            "selectedColumns": list(VIEW_COLUMNS),
            "orderByKey": "attributes.start_time",
            "orderByAsc": False,
            "groupBy": {
                "aggregateFunction": "average",
                "groupByKeys": [{"mode": "tag", "groupByData": "lsbench.status"}],
            },
        }
    )


def view_url(base_url: str, experiment_id: str) -> str:
    """The experiment page with lsbench's columns selected (``lsbench ui`` prints it)."""
    return (
        f"{base_url.rstrip('/')}/#/experiments/{experiment_id}/runs?workflowType=machine_learning"
        f"&viewStateShareKey={VIEW_KEY}"
    )
