"""The sink of a trial run in this process (``executor="local"``): it writes straight to MLflow.

Why it is not beside ``Sink`` in ``lossscale_bench.engine.sink``: the interface sits in
the schema layer because the trial and the engine report through it, while
this implementation needs a :class:`~.tracker.Tracker`, i.e. MLflow. Each sink
lives with what it writes to: this one with the tracker, ``TuneSink`` with the
Ray paths (``orchestration.tune_sink``), ``MemorySink`` (tests) with the interface.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..engine.sink import Sink

if TYPE_CHECKING:
    from .tracker import Tracker


class MlflowSink(Sink):
    """A ``Sink`` writing straight to one child run (in-process runs; the Ray path funnels instead)."""

    def __init__(self, tracker: Tracker, run_id: str) -> None:
        self.tracker = tracker
        self.run_id = run_id
        self.count = 0

    def metrics(self, items):
        self.count += self.tracker.log_metrics(self.run_id, items)

    def tags(self, tags):
        self.tracker.set_tags(self.run_id, tags)

    def artifact(self, path, artifact_path=None):
        self.tracker.log_artifact(self.run_id, path, artifact_path)

    def flush(self):
        pass
