"""Where a trial sends what it measures, without knowing MLflow or Ray.

In a Ray study the sink forwards batches to the driver through ``tune.report``
and the driver is the single MLflow writer (SQLite allows one writer at a
time). Run in-process, the sink writes to MLflow directly. Tests use
``MemorySink``.

Why only the interface (and ``MemorySink``) is here, in the engine package: the
engine and the trial report through it and may import nothing above them. The
sinks that write somewhere live with what they write to, a floor up:
``orchestration.tune_sink.TuneSink`` (Ray) and ``tracking.mlflow_sink.MlflowSink``.
"""

from __future__ import annotations

from typing import Any


class Sink:
    def metrics(self, items: list[tuple[str, float, int]]) -> None:
        """Record ``(key, value, step)`` triples."""

    def tags(self, tags: dict[str, Any]) -> None:
        """Set run tags (status, diverged_step, ...)."""

    def artifact(self, path: str, artifact_path: str | None = None) -> None:
        """Attach a file that the trial wrote (absolute path)."""

    def flush(self) -> None:
        """Deliver whatever is buffered."""

    def flush_when_due(self) -> None:
        """A point where what is buffered may be delivered (the metrics hook's every ``log_every`` steps, an
        evaluation); a sink whose deliveries cost the trial time may wait for a later one
        (``orchestration.tune_sink.TuneSink``). Here: :meth:`flush`."""
        self.flush()


class MemorySink(Sink):
    """Keeps everything in lists; for tests and for reading back a trial's history."""

    def __init__(self) -> None:
        self.items: list[tuple[str, float, int]] = []
        self.tag_values: dict[str, Any] = {}
        self.artifacts: list[tuple[str, str | None]] = []
        self.flushes = 0

    def metrics(self, items):
        self.items.extend(items)

    def tags(self, tags):
        self.tag_values.update(tags)

    def artifact(self, path, artifact_path=None):
        self.artifacts.append((path, artifact_path))

    def flush(self):
        self.flushes += 1

    def history(self, key: str) -> list[tuple[int, float]]:
        return [(s, v) for k, v, s in self.items if k == key]
