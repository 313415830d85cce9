"""Section e: a short real-fp16 run of the published SSD512 table's rows (and FP32) on ssd_tiny with synthetic data, several
seeds; mAP where pycocotools imports."""

from __future__ import annotations

import math
import time
from pathlib import Path

from .common import base_model, make_trainer

__all__ = ["E_ROWS", "section_e"]


E_ROWS = {
    "FP32 baseline": ({"method": "none"}, "fp32"),
    "fp16: no loss scale": ({"method": "fixed", "scale": 1}, None),
    "fp16: loss scale (128)": ({"method": "fixed", "scale": 128}, None),
    "fp16: loss scale (dynamic, interval=10)": ({"method": "dynamic", "interval": 10}, None),
    "fp16: adaptive": ({"method": "adaptive"}, None),
}


def section_e(cfg: dict, sc: dict, out_dir: Path) -> dict:
    """Each row and seed: steps run, final loss, skipped steps, final scale (and mAP)."""
    start = time.monotonic()
    from lossscale_bench.data import build_datasets, infinite_batches

    try:
        import pycocotools  # noqa: F401

        have_coco = True
    except ImportError:
        have_coco = False
    train, val, classes = build_datasets(
        {
            "name": "synthetic",
            "root": str(out_dir / "data"),
            "image_size": 128,
            "train_images": sc["train_images"],
            "val_images": sc["val_images"],
            "seed": 0,
        }
    )
    n_runs = len(E_ROWS) * len(sc["seeds"])
    iters = sc["iterations"]
    sched = {"lr": 0.01, "momentum": 0.9, "weight_decay": 5e-4, "warmup_iterations": max(1, iters // 7)}
    runs = []
    k = 0
    for seed in sc["seeds"]:
        for label, (method, prec) in E_ROWS.items():
            precision = prec or sc["precision"]
            left = sc["budget_s"] - (time.monotonic() - start)
            deadline = time.monotonic() + left / (n_runs - k)
            k += 1
            backend, model = base_model("ssd_tiny", cfg["device"], seed=seed)
            tr = make_trainer(model, backend, method, precision, sched)
            losses, skipped, steps = [], 0, 0
            for _, images, targets in infinite_batches(train, sc["batch"], seed=seed):
                if steps >= iters or (time.monotonic() > deadline and steps >= 1):
                    break
                rec = tr.train_step(images, targets)
                losses.append(rec.loss)
                skipped += int(rec.result.skipped)
                steps += 1
            tail = [x for x in losses[-10:] if math.isfinite(x)]
            row = {
                "label": label,
                "seed": seed,
                "precision": precision,
                "steps": steps,
                "final_loss": losses[-1] if losses else None,
                "final_loss_mean_last10": (sum(tail) / len(tail)) if tail else None,
                "skipped_steps": skipped,
                "final_scale": tr.scaler.current_scale(),
            }
            if have_coco:
                from lossscale_bench.evaluation import evaluate_coco

                m = evaluate_coco(model, val, device=backend.device, batch_size=sc["batch"])
                row["map"], row["map_50"] = m["map"], m["map_50"]
            runs.append(row)
            tr.scaler.remove()
            del tr, model
    return {
        "model": "ssd_tiny",
        "data": f"synthetic, {sc['train_images']} train / {sc['val_images']} val images, 128 px",
        "batch": sc["batch"],
        "iterations_target": iters,
        "fp16_precision": sc["precision"],
        "seeds": sc["seeds"],
        "map": "computed" if have_coco else "skipped: pycocotools is not importable",
        "runs": runs,
    }
