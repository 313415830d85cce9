"""Build what a trial trains with, from its ``TrialConfig``: backend, data, model, precision,
scaler, telemetry, optimizer and schedule, and the evaluator. Nothing here trains; the runner
(:mod:`.runner`) puts these parts into a ``Trainer`` with its hooks.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ..engine.sink import Sink
from .records import data_report


@dataclass
class TrialParts:
    backend: Any
    model: Any
    precision: Any
    scaler: Any
    probe: Any
    history: Any
    optimizer: Any
    scheduler: Any
    train_ds: Any
    val_ds: Any
    evaluate: Callable[[], dict]


def make_evaluator(metric: str, model, val_ds, backend, precision, max_images=None, class_names=None):
    """Return a zero-argument function computing ``{"map", "map_50"}`` on the validation set (``class_names``:
    its labels' names, where the data set does not carry them)."""

    def autocast():
        return backend.autocast(precision.autocast_dtype)

    if metric == "coco":
        from ..evaluation.coco import evaluate_coco

        return lambda: evaluate_coco(
            model, val_ds, device=backend.device, max_images=max_images, autocast=autocast, class_names=class_names
        )
    if metric in ("voc07", "voc"):
        from ..evaluation.voc import evaluate_voc

        return lambda: evaluate_voc(
            model,
            val_ds,
            device=backend.device,
            max_images=max_images,
            autocast=autocast,
            use_07_metric=(metric == "voc07"),
        )
    raise ValueError(f"unknown eval metric {metric!r}")


def seeded_backend(cfg, threads):
    """The trial's backend, with every RNG (torch, Python, numpy) seeded from the trial's seed (its
    ``init`` stream: the initial weights are drawn from these right after). A ``repeatable`` trial
    first checks that its process runs the pinned CPU kernels (core/portable.py)."""
    from ..backends import get_backend

    if cfg.resources.get("repeatable"):  # before any kernel runs: a trial that cannot keep the promise fails now
        from ..core.portable import require_pinned

        require_pinned()
    backend = get_backend(
        cfg.resources.get("backend", "cpu"),
        threads=threads,
        **({"compile": True} if cfg.resources.get("compile") else {}),
    )  # cuda only (schema)
    seed = cfg.stream_seed("init")
    backend.seed(seed)
    random.seed(seed)
    np.random.seed(seed % 2**32)
    return backend


def build_parts(cfg, sink: Sink, trial_dir: Path, threads, rank: int = 0) -> TrialParts:
    """Every part of the trial, in the order their RNG use and hooks require."""
    from ..data import build_datasets
    from ..engine.schedule import build_optimizer, build_scheduler
    from ..models import build_model
    from ..precision import get_precision
    from ..precision.telemetry import LayerHistory, UnderflowProbe
    from ..scaling import build_scaler
    from ..study.models.signature import on_path
    from ..study.precisions import PRECISION_OPTIONS

    backend = seeded_backend(cfg, threads)
    opts = dict(cfg.model_options)
    if "image_size" not in opts and cfg.dataset.get("name") == "synthetic" and cfg.model == "ssd_tiny":
        opts["image_size"] = int(cfg.dataset.get("image_size", 128))
    val_seed = cfg.stream_seed("val")  # seed_streams.val: a validation set of the trial's own
    dataset = cfg.dataset if val_seed is None else {**cfg.dataset, "val_seed": val_seed}
    with on_path(cfg.plugin_dir):  # an import-path plug-in is found in the study file's folder first
        train_ds, val_ds, classes = build_datasets(
            dataset, image_size=opts.get("image_size"), max_val_images=cfg.eval.get("max_images")
        )
        sink.tags(data_report(train_ds, val_ds))
        model = backend.prepare_model(build_model(cfg.model, num_classes=len(classes) + 1, **opts))
    precision = get_precision(
        cfg.precision,
        seed=cfg.seed,
        **{
            k: cfg.scaling.get(k)
            for k in (  # entry options (schema)
                "grad_rounding",
                "grad_overflow",
                "grad_blocks",
                "block_rounding",
                *PRECISION_OPTIONS,
            )
        },
    )
    emulation = precision.prepare(model)
    scaler = build_scaler(cfg.scaling, model, grad_format=precision.grad_format)
    # after the emulation hooks: it sees activation gradients before they are rounded, and the
    # emulation hands it the parameter gradients before it rounds those
    probe = UnderflowProbe(
        model, fmt=precision.telemetry_format, emulation=emulation, param_grads=not precision.rounds_after_unscale
    )
    optimizer = build_optimizer(model, cfg.schedule, backend.optimizer_options())
    evaluate = make_evaluator(
        cfg.eval.get("metric", "coco"), model, val_ds, backend, precision, cfg.eval.get("max_images"), classes
    )
    if rank != 0:  # replicas hold identical weights: rank 0's evaluation is the trial's
        evaluate = lambda: {"map": float("nan"), "map_50": float("nan")}  # noqa: E731
    return TrialParts(
        backend=backend,
        model=model,
        precision=precision,
        scaler=scaler,
        probe=probe,
        history=LayerHistory(trial_dir / "layers_history.csv", precision.telemetry_format),
        optimizer=optimizer,
        scheduler=build_scheduler(optimizer, cfg.schedule),
        train_ds=train_ds,
        val_ds=val_ds,
        evaluate=evaluate,
    )
