"""The training loop and the hooks around it (metrics, evaluation, checkpoints, divergence).

:mod:`.sink` is the interface a trial reports through; the tracking and Ray packages subclass it,
so this package's own names are loaded on first use (``Trainer`` imports torch; the sink does not,
and ``lsbench report`` imports the tracking package without torch).
"""

from __future__ import annotations

import importlib

_WHERE = {
    "Trainer": "loop",
    "StepRecord": "loop",
    "Hook": "hooks",
    "MetricsHook": "hooks",
    "EvalHook": "hooks",
    "CheckpointHook": "hooks",
    "DivergenceHook": "hooks",
    "TrialDiverged": "hooks",
    "TelemetryHook": "hooks",
    "StopCheck": "hooks",
}

__all__ = [
    "Trainer",
    "StepRecord",
    "Hook",
    "MetricsHook",
    "EvalHook",
    "CheckpointHook",
    "DivergenceHook",
    "TrialDiverged",
    "TelemetryHook",
    "StopCheck",
]


def __getattr__(name: str):
    """``lossscale_bench.engine.Trainer`` and the hooks, imported from their module when first asked for."""
    if name in _WHERE:
        return getattr(importlib.import_module(f".{_WHERE[name]}", __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
