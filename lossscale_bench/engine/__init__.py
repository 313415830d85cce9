"""The training loop and the hooks around it (metrics, evaluation, checkpoints, divergence)."""

from .hooks import CheckpointHook, DivergenceHook, EvalHook, Hook, MetricsHook, TelemetryHook, TrialDiverged
from .loop import StepRecord, Trainer

__all__ = ["Trainer", "StepRecord", "Hook", "MetricsHook", "EvalHook", "CheckpointHook", "DivergenceHook",
           "TrialDiverged", "TelemetryHook"]
