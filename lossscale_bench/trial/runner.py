"""Run one trial from its ``TrialConfig``: build, train, evaluate, report through a ``Sink``.

No Ray and no MLflow here: the sweep wraps this function in a Tune trainable
and the in-process runner hands it an MLflow sink. Divergence and errors end
as a status (``diverged`` / ``failed``) in the returned ``TrialOutcome``,
never as an exception out of this function.

Resume: every ``checkpoint_every`` iterations the whole state (model,
optimizer, lr schedule, scaler incl. per-layer adaptive state, step, RNG,
best mAP) is written atomically to ``<trial_dir>/checkpoint.pt``; a trial
started again with the same directory continues from it, and the data
stream restarts at the saved step.
"""

from __future__ import annotations

import json
import math
import os
import time
import traceback
from pathlib import Path

from ..engine.sink import Sink
from .checkpoint import atomic_done, capture, resume
from .outcome import TrialOutcome, failure_text
from .records import write_layer_table
from .setup import TrialParts, build_parts


def _as_config(cfg):
    from ..study import TrialConfig

    return cfg if isinstance(cfg, TrialConfig) else TrialConfig.from_dict(cfg)


def shard_batches(batches, rank: int, world_size: int):
    """Each replica takes its slice of the same global batch (``batch_size`` is the global batch)."""
    for step, images, targets in batches:
        yield step, images[rank::world_size], targets[rank::world_size]


def run_trial(
    cfg,
    *,
    sink: Sink,
    trial_dir: str | Path,
    threads: int | None = None,
    checkpoint_every: int | None = None,
    rank: int = 0,
    world_size: int = 1,
    grad_sync=None,
    stop_check=None,
) -> TrialOutcome:
    """Train and evaluate one trial; always returns an outcome (errors become status ``failed``).

    For a data-parallel trial every replica calls this with its ``rank``; only rank 0
    reports to the sink and writes checkpoints, and ``grad_sync`` averages gradients.
    ``stop_check()``, if given, is called before every step and may raise to stop the trial from
    outside (the study driver's stop signal, ``engine.hooks.StopCheck``): not a failure, it propagates.
    """
    cfg = _as_config(cfg)
    t0 = time.time()
    ckpt_dir = Path(trial_dir)
    trial_dir = ckpt_dir if rank == 0 else ckpt_dir / f"rank{rank}"
    if rank != 0:
        sink = Sink()
    outcome = TrialOutcome(trial_id=cfg.trial_id, status="failed")
    sink.tags({"lsbench.status": "running"})
    try:
        # inside the try: a folder that cannot be written is this trial's failure, one line, and
        # under Ray not a dead process that is retried (the same error would come back)
        _prepare_folder(trial_dir)
        _train(
            cfg, sink, trial_dir, threads, checkpoint_every, outcome, rank, world_size, grad_sync, ckpt_dir, stop_check
        )
    except Exception as exc:  # noqa: BLE001 - a failed trial is data, the study goes on
        if getattr(exc, "stops_study", False):
            raise  # the results store itself failed (tracking.StoreError): not this trial's failure
        outcome.status = "failed"
        outcome.error = failure_text(exc)
        try:  # on a full disk this write fails too; the error still reaches the sink
            (trial_dir / "error.txt").write_text(traceback.format_exc())
            sink.artifact(str(trial_dir / "error.txt"))
        except OSError:
            pass
        sink.tags({"lsbench.status": "failed", "lsbench.error": outcome.error[:5000]})
    outcome.seconds = time.time() - t0
    try:
        (trial_dir / "outcome.json").write_text(json.dumps(outcome.to_dict(), indent=2))
    except OSError as exc:  # the outcome goes to the sink regardless; a full disk must not hide it
        if outcome.status != "failed":
            outcome.status, outcome.error = "failed", failure_text(exc)
            sink.tags({"lsbench.status": "failed", "lsbench.error": outcome.error[:5000]})
    sink.flush()
    return outcome


def _prepare_folder(trial_dir: Path) -> None:
    """The trial's folder, an earlier attempt's error set aside, and the ``pid`` file naming which
    process runs the trial right now (for operators, and the worker-fault test)."""
    trial_dir.mkdir(parents=True, exist_ok=True)
    set_aside_error(trial_dir)
    (trial_dir / "pid").write_text(str(os.getpid()))


def set_aside_error(trial_dir: Path) -> Path | None:
    """Move an earlier attempt's ``error.txt`` to ``failed_attempts/<n>/error.txt`` (n = 1, 2, ...).

    Why: a trial rerun in the same folder that then finishes would otherwise leave the
    failed attempt's traceback beside its ``outcome.json`` as if it were this attempt's;
    deleting it would lose the failure. The MLflow run does the same with its artifact
    (``tracking.attempts``). Returns where it went, or None.
    """
    err = trial_dir / "error.txt"
    if not err.is_file():
        return None
    root = trial_dir / "failed_attempts"
    n = 1 + max((int(p.name) for p in root.glob("*") if p.name.isdigit()), default=0)
    dest = root / str(n) / "error.txt"
    try:
        dest.parent.mkdir(parents=True, exist_ok=True)
        err.replace(dest)
    except OSError:  # a full disk: the old traceback stays where it is, the attempt runs all the same
        return None
    return dest


def _train(
    cfg,
    sink: Sink,
    trial_dir: Path,
    threads,
    checkpoint_every,
    outcome: TrialOutcome,
    rank: int = 0,
    world_size: int = 1,
    grad_sync=None,
    ckpt_dir: Path | None = None,
    stop_check=None,
) -> None:
    """Set up, resume if a checkpoint is there, train, and end with a final evaluation."""
    from ..data.dali import make_batches
    from ..engine import TrialDiverged

    parts = build_parts(cfg, sink, trial_dir, threads, rank)
    ckpt_path = (ckpt_dir or trial_dir) / "checkpoint.pt"  # rank 0 writes it, every rank resumes from it
    trainer = _trainer(cfg, parts, sink, trial_dir, ckpt_path, checkpoint_every, rank, grad_sync)
    if stop_check is not None:
        from ..engine import StopCheck

        trainer.hooks.insert(0, StopCheck(stop_check))
    ck = resume(trainer, ckpt_path, cfg.trial_id)
    if ck is not None:
        parts.history.truncate_after(trainer.state.step)
        sink.tags({"lsbench.resumed_from_step": trainer.state.step})
    batches = make_batches(cfg, parts.train_ds, trainer.state.step)  # DALI for `loader: dali`, else torch
    trainer.batches = iter(shard_batches(batches, rank, world_size) if world_size > 1 else batches)
    sink.tags({"lsbench.backend": parts.backend.describe()})
    try:
        trainer.run()
    except TrialDiverged as div:
        outcome.status, outcome.diverged_step, outcome.diverged_reason = "diverged", div.step, div.reason
    finally:
        outcome.steps = trainer.state.step
        outcome.skipped_steps = trainer.state.skipped_steps
        if parts.history.path.exists():
            sink.artifact(str(parts.history.path), "layers")
    if outcome.status != "diverged":  # a stopped trial has no final mAP; policy 'continue' trains on
        _final_evaluation(trainer, parts, outcome, sink)
    parts.scaler.remove()
    if rank == 0:
        atomic_done(ckpt_path)
    sink.tags({"lsbench.status": outcome.status})


def _trainer(
    cfg, parts: TrialParts, sink: Sink, trial_dir: Path, ckpt_path: Path, checkpoint_every, rank: int, grad_sync
):
    """The loop with its hooks: telemetry, metrics, divergence, periodic evaluation, checkpoints."""
    from ..engine import CheckpointHook, DivergenceHook, EvalHook, MetricsHook, TelemetryHook, Trainer

    iterations = int(cfg.schedule["iterations"])
    eval_every = cfg.eval.get("every")
    telemetry = TelemetryHook(sink, parts.probe, parts.history, cfg.log_every)

    def on_eval(step: int, res: dict) -> None:
        write_layer_table(
            trial_dir / "layers" / f"layers_step{step:07d}.csv", telemetry.last_rates, parts.scaler.layer_table(), sink
        )

    eval_hook = EvalHook(sink, parts.evaluate, eval_every, on_eval=on_eval)
    hooks = [
        telemetry,
        MetricsHook(sink, cfg.log_every),
        DivergenceHook(
            sink,
            patience=cfg.divergence.get("patience", 10),
            max_consecutive_skips=cfg.divergence.get("max_consecutive_skips", 200),
            policy=cfg.on_divergence,
            check_every=cfg.log_every,
        ),
        eval_hook,
    ]
    trainer = Trainer(
        model=parts.model,
        optimizer=parts.optimizer,
        scheduler=parts.scheduler,
        scaler=parts.scaler,
        backend=parts.backend,
        precision=parts.precision,
        iterations=iterations,
        hooks=hooks,
        grad_clip=cfg.schedule.get("grad_clip"),
        bias_grad_factor=cfg.schedule.get("bias_grad_factor", 1.0),
        grad_sync=grad_sync,
        sync_every=cfg.log_every,
    )  # losses read a window at a time
    if rank == 0:
        every = checkpoint_every or eval_every or max(1, iterations // 10)

        def state() -> dict:
            # what was logged up to the checkpoint is delivered before the checkpoint exists: a sink may hold
            # reports back (TuneSink), and a trial resumed from this checkpoint does not recompute those steps
            sink.flush()
            return capture(trainer, cfg.trial_id, eval_hook.best_map)

        trainer.hooks.append(CheckpointHook(ckpt_path, every, state))
    return trainer


def _final_evaluation(trainer, parts: TrialParts, outcome: TrialOutcome, sink: Sink) -> None:
    """The last evaluation (also after a divergence under policy 'continue'), its metrics and the
    trial's status: a divergence the hook recorded but did not stop on still ends it ``diverged``."""
    from ..engine import DivergenceHook, EvalHook

    eval_hook = next(h for h in trainer.hooks if isinstance(h, EvalHook))
    res = parts.evaluate()
    eval_hook.on_eval(trainer.state.step, res)
    eval_hook.best_map = max(eval_hook.best_map, res.get("map", float("-inf")))
    best = eval_hook.best_map
    outcome.final_map, outcome.final_map_50 = res.get("map"), res.get("map_50")
    outcome.best_map = best if math.isfinite(best) else None
    step = trainer.state.step
    final = [
        ("map", res["map"], step),
        ("map_50", res["map_50"], step),
        ("final_map", res["map"], step),
        ("final_map_50", res["map_50"], step),
        ("skipped_steps_total", float(trainer.state.skipped_steps), step),
    ]
    if outcome.best_map is not None:
        final.append(("best_map", outcome.best_map, step))
    sink.metrics(final)
    diverged = next(h for h in trainer.hooks if isinstance(h, DivergenceHook)).diverged
    if diverged is not None:
        outcome.status, outcome.diverged_step, outcome.diverged_reason = "diverged", diverged.step, diverged.reason
    else:
        outcome.status = "finished"
