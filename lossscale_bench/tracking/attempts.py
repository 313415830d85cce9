"""A trial run's attempts: what the next attempt does to the record an earlier one left.

Why this exists: a trial keeps one MLflow run for its whole life (one child run per
``trial_id``, continued), so a trial that failed, was interrupted, or whose Ray worker
died is continued *in the same run* by its next attempt. Left alone, the finished run
carried the failed attempt's ``lsbench.error`` tag and ``error.txt`` beside its final
mAP, and the steps the failed attempt had logged after the checkpoint the next attempt
resumed from were logged a second time (470 ``loss`` points for 400 steps), so every
curve and every average over a history (``report --telemetry``) counted them twice.

So before an attempt starts, ``Tracker.begin_attempt``:

* sets the earlier attempt's error aside, never drops it: the tag ``lsbench.error``
  becomes ``lsbench.previous_error`` (the last failed attempt's), the artifact
  ``error.txt`` moves to ``failed_attempts/<n>/error.txt`` (n = 1, 2, ... counts the
  failed attempts, tag ``lsbench.failed_attempts``; the error text itself when the attempt
  left no traceback, as a Ray worker that kept dying does);
* drops the tags that describe one attempt (:data:`ATTEMPT_TAGS`); the new attempt sets
  its own;
* notes, per metric, the last step the store holds (:func:`last_steps`), and from then on
  ``Tracker.log_metrics`` keeps only the points past it (:func:`new_points`).

Why the repeated steps are not logged again, rather than replaced: MLflow has no call
that deletes metric points (a run, a tag or an artifact can be deleted; a metric history
only grows), and a new run per attempt would break "one run per trial" (the runs table,
the report and resume all key on it). The next attempt recomputes those steps from the
checkpoint (model, optimizer, lr schedule, scaler state, RNG, data position), which
gives the values the failed attempt logged (bit-identical on the same machine:
``tests/trial/test_trial_runner.py``, resumed vs uninterrupted), so keeping the first
point of such a step loses nothing but a second measurement of ``images_per_sec``.
Points are compared with the store *as the attempt began*, never with what the attempt
itself logged, so none of an attempt's own points is dropped.

Pure rules, no MLflow import: the writes are ``tracker``'s (the only MLflow writer).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

#: tags that describe one attempt of a trial: a continued run drops them before its next attempt
#: (``lsbench.error`` is first kept as ``lsbench.previous_error``)
ATTEMPT_TAGS = ("lsbench.error", "lsbench.plot_error", "lsbench.resumed_from_step", "lsbench.retries")
#: the failed attempts' tracebacks, as artifacts of the continued run
FAILED_ATTEMPTS_DIR = "failed_attempts"


def failed_attempts(tags: dict[str, Any]) -> int:
    """How many failed attempts the run has set aside so far (tag ``lsbench.failed_attempts``)."""
    try:
        return max(0, int(tags.get("lsbench.failed_attempts") or 0))
    except (TypeError, ValueError):
        return 0


def archive_dir(n: int) -> str:
    """The artifact folder of the ``n``-th failed attempt's ``error.txt``."""
    return f"{FAILED_ATTEMPTS_DIR}/{int(n)}"


def last_steps(run) -> dict[str, int]:
    """``metric key -> last step`` the store holds for ``run`` (an MLflow ``Run``).

    MLflow keeps each key's latest point (the largest step, then the latest time) with
    the run, so this needs no read of the histories.
    """
    metrics = getattr(run.data, "_metric_objs", None) or []
    return {m.key: int(m.step) for m in metrics}


def new_points(items: Iterable[tuple[str, float, int]], logged: dict[str, int]) -> list[tuple[str, float, int]]:
    """The ``(key, value, step)`` items past the step each key had reached before this attempt."""
    return [(k, v, s) for k, v, s in items if k not in logged or int(s) > logged[k]]
