"""Sections a and h: the torch-style ``DynamicLossScaler`` against ``torch.amp.GradScaler``, step for step
(h: with foreach SGD on both sides instead of the backend's fused SGD)."""

from __future__ import annotations

import copy
import time

import torch

from .common import IMAGE_SIZE, PlainAMP, base_model, make_trainer, random_batch

__all__ = ["section_a"]


def section_a(cfg: dict, sc: dict) -> dict:
    """Section a (or h, by its config): per-step scales and skips of both scalers and the largest
    parameter difference after the steps; pass when they agree (bit for bit on CPU)."""
    deadline = time.monotonic() + sc["budget_s"]
    backend, model = base_model(sc["model"], cfg["device"])
    # step for step: deterministic kernels on the card (CUDABackend turns cudnn.benchmark on)
    old = (torch.backends.cudnn.benchmark, torch.backends.cudnn.deterministic)
    torch.backends.cudnn.benchmark, torch.backends.cudnn.deterministic = False, True
    try:
        return _section_a(cfg, sc, backend, model, deadline)
    finally:
        torch.backends.cudnn.benchmark, torch.backends.cudnn.deterministic = old


def _section_a(cfg, sc, backend, model, deadline) -> dict:
    from lossscale_bench.scaling import DynamicLossScaler

    # the same model class (loss) and optimizer kernels on both sides: this compares the scalers
    model_gs = copy.deepcopy(model)
    # the same SGD kernels on both sides: the backend's (fused on CUDA), or foreach (section h: whether a
    # difference comes from GradScaler's fused-optimizer path)
    opt_options = {"foreach": True} if sc.get("optimizer") == "foreach" else backend.optimizer_options()
    ours = make_trainer(
        model, backend, {"method": "dynamic", "style": "torch"}, cfg["precision"], optimizer_options=opt_options
    )
    ours.scaler = DynamicLossScaler(style="torch", interval=sc["growth_interval"])
    plain = PlainAMP(
        model_gs, backend, cfg["precision"], growth_interval=sc["growth_interval"], optimizer_options=opt_options
    )
    rows = []
    for i in range(sc["steps"]):
        if time.monotonic() > deadline and rows:
            break
        images, targets = random_batch(IMAGE_SIZE[sc["model"]], sc["batch"], 1000 + i)
        rec = ours.train_step(images, targets)
        gs_scale, gs_skipped = plain.train_step(images, targets)
        rows.append(
            {
                "step": i + 1,
                "scale_lsbench": rec.result.scale,
                "scale_gradscaler": gs_scale,
                "skipped_lsbench": rec.result.skipped,
                "skipped_gradscaler": gs_skipped,
            }
        )
    with torch.no_grad():
        finite = {
            "lsbench": all(bool(torch.isfinite(q).all()) for q in model.parameters()),
            "gradscaler": all(bool(torch.isfinite(q).all()) for q in model_gs.parameters()),
        }
        diffs = [(a.float() - b.float()).abs().max().item() for a, b in zip(model.parameters(), model_gs.parameters())]
        max_abs = max(diffs) if diffs else 0.0
        max_param = max(p.abs().max().item() for p in model.parameters())
    scales_equal = all(r["scale_lsbench"] == r["scale_gradscaler"] for r in rows)
    skips_equal = all(r["skipped_lsbench"] == r["skipped_gradscaler"] for r in rows)
    # CPU is bit-reproducible; cuDNN may pick non-deterministic kernels, so allow float noise there
    tol = 0.0 if cfg["device"] == "cpu" else 1e-3 * max(1.0, max_param)
    return {
        "model": sc["model"],
        "batch": sc["batch"],
        "precision": cfg["precision"],
        "growth_interval": sc["growth_interval"],
        "init_scale": 65536.0,
        "steps": len(rows),
        "optimizer": opt_options,
        "params_finite": finite,
        "per_step": rows,
        "scales_equal": scales_equal,
        "skips_equal": skips_equal,
        "skipped_steps": sum(r["skipped_lsbench"] for r in rows),
        "max_abs_param_diff": max_abs,
        "tolerance": tol,
        "pass": bool(scales_equal and skips_equal and max_abs <= tol),
    }
