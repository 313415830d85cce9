"""The sink of a trial running inside Ray Tune: one module that both Ray paths import.

A single-device Tune trial (``tune_runner``) and rank 0 of a multi-device trial
(``distributed``) hand their metrics, tags and artifacts to the driver the
same way, through ``tune.report``; the driver's MLflow funnel (``funnel``) is the only
MLflow writer (SQLite takes one writer at a time).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable

from ..engine.sink import Sink

#: the least time between two reports made at :meth:`TuneSink.flush_when_due` points. Why: Ray's function
#: trainable reports synchronously (the training thread waits until the driver has run the result's callbacks,
#: the MLflow funnel included, and asked for the next): ~20 ms a report, up to a second while the driver draws
#: another trial's plots; every ``log_every`` = 10 steps that stalled a default-study trial 1-2.5 s in 500 steps
#: (docs/records/index.md "Training waits for the driver"). Explicit flushes (a checkpoint, the trial's end) report
#: at once.
REPORT_INTERVAL_S = 2.0


class TuneSink(Sink):
    """Inside a Tune trial: forward buffered metrics/tags/artifacts to the driver via ``tune.report``.

    ``report`` and ``clock`` default to ``ray.tune.report`` and ``time.monotonic`` (tests pass their own)."""

    def __init__(
        self,
        report: Callable[[dict], None] | None = None,
        clock: Callable[[], float] = time.monotonic,
        interval: float = REPORT_INTERVAL_S,
    ) -> None:
        self._metrics: list = []
        self._tags: dict = {}
        self._artifacts: list = []
        self.reports = 0
        self._report = report
        self._clock = clock
        self._interval = interval
        self._last: float | None = None  # when the last report returned; None: none yet (the first is not held)

    def metrics(self, items):
        self._metrics.extend((k, float(v), int(s)) for k, v, s in items)

    def tags(self, tags):
        self._tags.update(
            {k: (None if v is None else v if isinstance(v, (int, float, str)) else str(v)) for k, v in tags.items()}
        )

    def artifact(self, path, artifact_path=None):
        self._artifacts.append((str(path), artifact_path))

    def take_report(self, outcome: dict | None = None) -> dict | None:
        """What ``tune.report`` gets (and empties the buffers), or None when there is nothing to send."""
        if not (self._metrics or self._tags or self._artifacts or outcome):
            return None
        payload = {"metrics": self._metrics, "tags": self._tags, "artifacts": self._artifacts}
        if outcome is not None:
            payload["outcome"] = outcome
        self._metrics, self._tags, self._artifacts = [], {}, []
        self.reports += 1
        return {"lsbench": json.dumps(payload), "lsbench_reports": self.reports}

    def flush(self, outcome: dict | None = None):
        report = self.take_report(outcome)
        if report is not None:
            if self._report is None:
                from ray import tune

                self._report = tune.report
            self._report(report)
            self._last = self._clock()

    def flush_when_due(self) -> None:
        """Report unless the last report returned less than ``interval`` seconds ago (module doc)."""
        if self._last is None or self._clock() - self._last >= self._interval:
            self.flush()
