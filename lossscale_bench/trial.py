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

import errno
import json
import math
import os
import random
import time
import traceback
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from .sink import Sink


class CheckpointError(RuntimeError):
    """A checkpoint exists but cannot be read (truncated, corrupt, foreign)."""


@dataclass
class TrialOutcome:
    trial_id: str
    status: str  # finished | diverged | failed
    steps: int = 0
    final_map: float | None = None
    final_map_50: float | None = None
    best_map: float | None = None
    diverged_step: int | None = None   # metric-history step that broke training (DivergenceHook)
    diverged_reason: str | None = None
    skipped_steps: int = 0
    seconds: float = 0.0
    error: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _rng_state() -> dict[str, Any]:
    st = np.random.get_state()
    return {"torch": torch.get_rng_state(), "python": random.getstate(),
            "numpy": [st[0], st[1].tolist(), int(st[2]), int(st[3]), float(st[4])]}


def _set_rng_state(state: dict[str, Any]) -> None:
    torch.set_rng_state(state["torch"])
    random.setstate(tuple(state["python"]) if not isinstance(state["python"], tuple) else state["python"])
    n = state["numpy"]
    np.random.set_state((n[0], np.asarray(n[1], dtype=np.uint32), n[2], n[3], n[4]))


def load_checkpoint(path: Path) -> dict[str, Any]:
    """Load with ``weights_only=True`` (no code execution from a checkpoint file)."""
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # noqa: BLE001 - truncated zip, pickle error, foreign file
        raise CheckpointError(f"checkpoint {path} cannot be read ({type(exc).__name__}: "
                              f"{str(exc).splitlines()[0][:200] if str(exc) else ''}); delete it to restart "
                              "this trial from scratch") from None


def _as_config(cfg):
    from .study import TrialConfig

    return cfg if isinstance(cfg, TrialConfig) else TrialConfig.from_dict(cfg)


def make_evaluator(metric: str, model, val_ds, backend, precision, max_images=None):
    """Return a zero-argument function computing ``{"map", "map_50"}`` on the validation set."""
    autocast = (lambda: backend.autocast(precision.autocast_dtype))
    if metric == "coco":
        from .evaluation.coco import evaluate_coco

        return lambda: evaluate_coco(model, val_ds, device=backend.device, max_images=max_images, autocast=autocast)
    if metric in ("voc07", "voc"):
        from .evaluation.voc import evaluate_voc

        return lambda: evaluate_voc(model, val_ds, device=backend.device, max_images=max_images, autocast=autocast,
                                    use_07_metric=(metric == "voc07"))
    raise ValueError(f"unknown eval metric {metric!r}")


#: errno -> what a researcher reads first in a failed trial's error (the OS text follows)
_DISK_ERRORS = {errno.ENOSPC: "disk full", errno.EDQUOT: "disk quota exceeded",
                errno.EFBIG: "file size limit reached (disk full, quota or ulimit -f)"}


def failure_text(exc: BaseException) -> str:
    """A failed trial's error line: ``Type: message``, led by "disk full" when that is the cause.

    "OSError: [Errno 28] No space left on device" buried in a traceback is easy to read as a
    bug; the cause may also sit under a wrapping error (``__cause__``/``__context__``).
    """
    text = f"{type(exc).__name__}: {exc}"
    seen, e = set(), exc
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        what = _DISK_ERRORS.get(getattr(e, "errno", None))
        if what is None and "no space left on device" in str(e).lower():
            what = "disk full"
        if what:
            return f"{what}: {text}"
        e = e.__cause__ or e.__context__
    return text


def shard_batches(batches, rank: int, world_size: int):
    """Each replica takes its slice of the same global batch (``batch_size`` is the global batch)."""
    for step, images, targets in batches:
        yield step, images[rank::world_size], targets[rank::world_size]


def run_trial(cfg, *, sink: Sink, trial_dir: str | Path, threads: int | None = None,
              checkpoint_every: int | None = None, rank: int = 0, world_size: int = 1,
              grad_sync=None) -> TrialOutcome:
    """Train and evaluate one trial; always returns an outcome (errors become status ``failed``).

    For a data-parallel trial every replica calls this with its ``rank``; only rank 0
    reports to the sink and writes checkpoints, and ``grad_sync`` averages gradients.
    """
    cfg = _as_config(cfg)
    t0 = time.time()
    ckpt_dir = Path(trial_dir)
    trial_dir = ckpt_dir if rank == 0 else ckpt_dir / f"rank{rank}"
    if rank != 0:
        sink = Sink()
    trial_dir.mkdir(parents=True, exist_ok=True)
    # Which process runs the trial right now (for operators, and the worker-fault test).
    (trial_dir / "pid").write_text(str(os.getpid()))
    outcome = TrialOutcome(trial_id=cfg.trial_id, status="failed")
    sink.tags({"lsbench.status": "running"})
    try:
        _train(cfg, sink, trial_dir, threads, checkpoint_every, outcome, rank, world_size, grad_sync, ckpt_dir)
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


def _train(cfg, sink: Sink, trial_dir: Path, threads, checkpoint_every, outcome: TrialOutcome,
           rank: int = 0, world_size: int = 1, grad_sync=None, ckpt_dir: Path | None = None) -> None:
    from .backends import get_backend
    from .data import build_datasets
    from .data.dali import make_batches
    from .engine import CheckpointHook, DivergenceHook, EvalHook, MetricsHook, TelemetryHook, Trainer, TrialDiverged
    from .engine.loop import TrainState
    from .engine.schedule import build_optimizer, build_scheduler
    from .models import build_model
    from .precision import get_precision
    from .scaling import build_scaler
    from .telemetry import LayerHistory, UnderflowProbe

    backend = get_backend(cfg.resources.get("backend", "cpu"), threads=threads,
                          **({"compile": True} if cfg.resources.get("compile") else {}))  # cuda only (schema)
    backend.seed(cfg.seed)
    random.seed(cfg.seed)
    np.random.seed(cfg.seed % 2**32)

    opts = dict(cfg.model_options)
    if "image_size" not in opts and cfg.dataset.get("name") == "synthetic" and cfg.model == "ssd_tiny":
        opts["image_size"] = int(cfg.dataset.get("image_size", 128))
    train_ds, val_ds, classes = build_datasets(cfg.dataset, image_size=opts.get("image_size"),
                                               max_val_images=cfg.eval.get("max_images"))
    sink.tags(data_report(train_ds, val_ds))
    model = backend.prepare_model(build_model(cfg.model, num_classes=len(classes) + 1, **opts))
    precision = get_precision(cfg.precision, cfg.scaling.get("grad_rounding"))  # an entry option (schema)
    precision.prepare(model)
    scaler = build_scaler(cfg.scaling, model, grad_format=precision.grad_format)
    # after the emulation hooks: it sees gradients before they are rounded
    probe = UnderflowProbe(model, fmt=precision.telemetry_format)
    history = LayerHistory(trial_dir / "layers_history.csv")
    optimizer = build_optimizer(model, cfg.schedule, backend.optimizer_options())
    scheduler = build_scheduler(optimizer, cfg.schedule)
    state = TrainState()

    iterations = int(cfg.schedule["iterations"])
    eval_every = cfg.eval.get("every")
    ckpt_every = checkpoint_every or eval_every or max(1, iterations // 10)
    ckpt_path = (ckpt_dir or trial_dir) / "checkpoint.pt"  # rank 0 writes it, every rank resumes from it
    best = {"map": float("-inf")}
    diverged_hook = DivergenceHook(sink, patience=cfg.divergence.get("patience", 10),
                                   max_consecutive_skips=cfg.divergence.get("max_consecutive_skips", 200),
                                   policy=cfg.on_divergence, check_every=cfg.log_every)

    if ckpt_path.exists():
        ck = load_checkpoint(ckpt_path)
        if ck.get("trial_id") != cfg.trial_id:
            raise CheckpointError(f"checkpoint {ckpt_path} belongs to trial {ck.get('trial_id')}, not {cfg.trial_id}")
        model.load_state_dict(ck["model"])
        optimizer.load_state_dict(ck["optimizer"])
        scheduler.load_state_dict(ck["scheduler"])
        scaler.load_state_dict(ck["scaler"])
        state.step, state.skipped_steps, state.overflow_steps, state.images_seen = (
            ck["step"], ck["skipped_steps"], ck["overflow_steps"], ck["images_seen"])
        best["map"] = ck.get("best_map", float("-inf"))
        _set_rng_state(ck["rng"])
        history.truncate_after(state.step)
        sink.tags({"lsbench.resumed_from_step": state.step})

    def checkpoint_state() -> dict[str, Any]:
        return {"trial_id": cfg.trial_id, "model": model.state_dict(), "optimizer": optimizer.state_dict(),
                "scheduler": scheduler.state_dict(), "scaler": scaler.state_dict(), "step": state.step,
                "skipped_steps": state.skipped_steps, "overflow_steps": state.overflow_steps,
                "images_seen": state.images_seen, "best_map": best["map"], "rng": _rng_state()}

    evaluate = make_evaluator(cfg.eval.get("metric", "coco"), model, val_ds, backend, precision,
                              cfg.eval.get("max_images"))
    if rank != 0:  # replicas hold identical weights: rank 0's evaluation is the trial's
        evaluate = lambda: {"map": float("nan"), "map_50": float("nan")}  # noqa: E731

    telemetry = TelemetryHook(sink, probe, history, cfg.log_every)

    def on_eval(step: int, res: dict) -> None:
        best["map"] = max(best["map"], res.get("map", float("-inf")))
        write_layer_table(trial_dir / "layers" / f"layers_step{step:07d}.csv", telemetry.last_rates,
                          scaler.layer_table(), sink)

    metrics_hook = MetricsHook(sink, cfg.log_every)
    eval_hook = EvalHook(sink, evaluate, eval_every, on_eval=on_eval)
    hooks = [telemetry, metrics_hook, diverged_hook, eval_hook]
    if rank == 0:
        hooks.append(CheckpointHook(ckpt_path, ckpt_every, checkpoint_state))
    batches = make_batches(cfg, train_ds, state.step)  # DALI for `loader: dali`, else infinite_batches
    if world_size > 1:
        batches = shard_batches(batches, rank, world_size)
    trainer = Trainer(model=model, optimizer=optimizer, scheduler=scheduler, scaler=scaler, backend=backend,
                      precision=precision, batches=batches, iterations=iterations, hooks=hooks,
                      grad_clip=cfg.schedule.get("grad_clip"),
                      bias_grad_factor=cfg.schedule.get("bias_grad_factor", 1.0), state=state,
                      grad_sync=grad_sync, sync_every=cfg.log_every)  # losses read a window at a time
    sink.tags({"lsbench.backend": backend.describe()})
    try:
        trainer.run()
    except TrialDiverged as div:
        outcome.status = "diverged"
        outcome.diverged_step = div.step
        outcome.diverged_reason = div.reason
    finally:
        outcome.steps = state.step
        outcome.skipped_steps = state.skipped_steps
        if history.path.exists():
            sink.artifact(str(history.path), "layers")
    if outcome.status == "diverged":
        scaler.remove()
        if rank == 0:
            atomic_done(ckpt_path)
        sink.tags({"lsbench.status": "diverged"})
        return
    # final evaluation (also for policy 'continue' after a divergence)
    res = evaluate()
    on_eval(state.step, res)
    scaler.remove()
    best["map"] = max(best["map"], res.get("map", float("-inf")))
    outcome.final_map, outcome.final_map_50 = res.get("map"), res.get("map_50")
    outcome.best_map = best["map"] if math.isfinite(best["map"]) else None
    step = state.step
    final = [("map", res["map"], step), ("map_50", res["map_50"], step), ("final_map", res["map"], step),
             ("final_map_50", res["map_50"], step), ("skipped_steps_total", float(state.skipped_steps), step)]
    if outcome.best_map is not None:
        final.append(("best_map", outcome.best_map, step))
    sink.metrics(final)
    if diverged_hook.diverged is not None:
        outcome.status = "diverged"
        outcome.diverged_step = diverged_hook.diverged.step
        outcome.diverged_reason = diverged_hook.diverged.reason
    else:
        outcome.status = "finished"
    if rank == 0:
        atomic_done(ckpt_path)
    sink.tags({"lsbench.status": outcome.status})


def data_report(train_ds, val_ds) -> dict[str, Any]:
    """What the loaders skipped, as run tags: boxes outside their image or with x2 < x1 (dropped),
    crowd boxes, objects of classes outside the class list (by name), difficult objects dropped.
    Skips are counted and logged, never silent."""
    tags: dict[str, Any] = {}
    for split, ds in (("train", train_ds), ("val", val_ds)):
        tags[f"lsbench.data.{split}.images"] = len(ds)
        for attr in ("skipped_boxes", "crowd_boxes", "dropped_difficult"):
            v = getattr(ds, attr, None)
            if v:
                tags[f"lsbench.data.{split}.{attr}"] = int(v)
        unknown = getattr(ds, "unknown_objects", None)
        if unknown:
            tags[f"lsbench.data.{split}.unknown_objects"] = json.dumps(dict(unknown), sort_keys=True)
    return tags


def write_layer_table(path: Path, rates: dict, scaler_rows: list[dict], sink: Sink) -> None:
    """The per-layer table at an evaluation: underflow rates (every method) and adaptive scales."""
    import csv

    by_layer: dict[str, dict] = {name: {"layer": name, **r} for name, r in rates.items()}
    for row in scaler_rows:
        by_layer.setdefault(row["layer"], {"layer": row["layer"]}).update(row)
    if not by_layer:
        return
    fields: list[str] = []
    for row in by_layer.values():
        fields += [k for k in row if k not in fields]
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=fields)
        w.writeheader()
        w.writerows(by_layer.values())
    sink.artifact(str(path), "layers")


def atomic_done(ckpt_path: Path) -> None:
    """A finished trial needs no checkpoint to resume from; drop it to save disk."""
    try:
        ckpt_path.unlink()
    except FileNotFoundError:
        pass
