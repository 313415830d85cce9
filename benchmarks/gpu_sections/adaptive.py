"""Section c: the adaptive scaler's step time against dynamic's in real fp16 autocast, per model."""

from __future__ import annotations

import copy
import statistics
import time

from scaler_overhead import METHODS

from .common import base_model, free_memory, interleaved, make_batches, make_trainer
from .throughput import profile_steps

__all__ = ["C_METHODS", "section_c"]


# scaler_overhead's methods (the benchmark these figures extend), less the unscaled ones
C_METHODS = {k: v for k, v in METHODS.items() if k.startswith(("dynamic", "adaptive"))}


def section_c(cfg: dict, sc: dict) -> dict:
    """Median step time of each method in :data:`C_METHODS` and its ratio to dynamic's, per model."""
    start = time.monotonic()
    out = {"precision": cfg["precision"], "rows": []}
    models = list(sc["models"].items())
    for k, (model_name, batch) in enumerate(models):
        # split what is left of the budget over the models still to do
        left = sc["budget_s"] - (time.monotonic() - start)
        deadline = time.monotonic() + left / (len(models) - k)
        backend, model = base_model(model_name, cfg["device"])
        steppers = {
            name: make_trainer(copy.deepcopy(model), backend, m, cfg["precision"]) for name, m in C_METHODS.items()
        }
        del model
        batches = make_batches(model_name, batch, 2)
        block = sc.get("block", 1)
        times = interleaved(steppers, batches, max(1, sc["steps"] // block), sc["warmup"], deadline, block=block)
        if sc.get("profile_steps") and k == 0:  # where adaptive's extra time goes, on the first model
            out["profiles"] = {
                name: profile_steps(steppers[name], batches, sc["profile_steps"], backend)
                for name in ("dynamic (interval 10)", "adaptive (update_every 10)")
            }
        base = statistics.median(times["dynamic (interval 10)"])
        for name, ts in times.items():
            med = statistics.median(ts)
            out["rows"].append(
                {
                    "model": model_name,
                    "batch": batch,
                    "method": name,
                    "timed_steps": len(ts) * block,
                    "median_step_ms": med * 1000.0,
                    "ratio_to_dynamic": med / base,
                }
            )
        del steppers, batches
        free_memory()
    return out
