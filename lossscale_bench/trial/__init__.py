"""Run one trial from its ``TrialConfig``: build, train, evaluate, report through a ``Sink``.

No Ray and no MLflow here: the sweep wraps :func:`run_trial` in a Tune trainable
and the in-process runner hands it an MLflow sink. Divergence and errors end
as a status (``diverged`` / ``failed``) in the returned ``TrialOutcome``,
never as an exception out of this function.

Modules: ``setup`` (every part built from the config), ``runner`` (the loop with
its hooks, resume, final evaluation), ``checkpoint`` (what a checkpoint holds,
reading and resuming it), ``outcome`` (how a trial ended), ``records`` (data-skip
tags, per-layer tables).
"""

from __future__ import annotations

from .checkpoint import CheckpointError, atomic_done, load_checkpoint
from .outcome import TrialOutcome, failure_text
from .records import data_report, write_layer_table
from .runner import run_trial, shard_batches
from .setup import make_evaluator

__all__ = [
    "run_trial",
    "TrialOutcome",
    "CheckpointError",
    "failure_text",
    "load_checkpoint",
    "atomic_done",
    "data_report",
    "write_layer_table",
    "make_evaluator",
    "shard_batches",
]
