"""The sink of a trial running inside Ray Tune: one module that both Ray paths import.

A single-device Tune trial (``tune_runner``) and rank 0 of a multi-device trial
(``distributed``) hand their metrics, tags and artifacts to the driver the
same way, through ``tune.report``; the driver's MLflow funnel (``funnel``) is the only
MLflow writer (SQLite takes one writer at a time).
"""

from __future__ import annotations

import json

from ..sink import Sink


class TuneSink(Sink):
    """Inside a Tune trial: forward buffered metrics/tags/artifacts to the driver via ``tune.report``."""

    def __init__(self) -> None:
        self._metrics: list = []
        self._tags: dict = {}
        self._artifacts: list = []
        self.reports = 0

    def metrics(self, items):
        self._metrics.extend((k, float(v), int(s)) for k, v, s in items)

    def tags(self, tags):
        self._tags.update({k: (None if v is None else v if isinstance(v, (int, float, str)) else str(v))
                           for k, v in tags.items()})

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
            from ray import tune

            tune.report(report)
