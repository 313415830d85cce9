"""Section b: the lsbench Trainer against a plain torchvision-references AMP loop, images/s, interleaved;
and the ``torch.profiler`` summary sections b and c record."""

from __future__ import annotations

import copy
import statistics
import time

import torch

from .common import SYNC_EVERY, PlainAMP, base_model, interleaved, make_batches, make_trainer, reference_model

__all__ = ["B_COMPILED", "B_OLD", "B_PLAIN", "B_TRAINER", "profile_steps", "section_b"]


B_TRAINER = "lsbench Trainer (dynamic, torch style)"
B_PLAIN = "plain AMP loop (GradScaler)"
B_OLD = "lsbench Trainer, torchvision loss, read every step"
B_COMPILED = "lsbench Trainer + torch.compile"


def section_b(cfg: dict, sc: dict) -> dict:
    """Trainer as trials run it (batched loss, losses read every SYNC_EVERY steps, the backend's
    optimizer kernels and memory format) vs the references' loop (torchvision's loss, NCHW, default
    SGD, a loss read per step); also the Trainer with the old step (torchvision's loss, a read per
    step), and, with ``--compile`` on CUDA, compiled backbone and heads."""
    deadline = time.monotonic() + sc["budget_s"]
    backend, model = base_model(sc["model"], cfg["device"])
    dyn = {"method": "dynamic", "style": "torch"}
    from torchvision.models.detection.ssd import SSD

    old_model = copy.deepcopy(model)
    old_model.__class__ = SSD  # torchvision's loss; the backend's memory format and optimizer kernels
    steppers = {
        B_TRAINER: make_trainer(model, backend, dyn, cfg["precision"]),
        B_PLAIN: PlainAMP(reference_model(model), backend, cfg["precision"]),
        B_OLD: make_trainer(old_model, backend, dyn, cfg["precision"], sync_every=1),
    }
    if cfg.get("compile"):
        from lossscale_bench.backends.cuda import compile_parts

        compiled = copy.deepcopy(model)
        compile_parts(compiled)
        steppers[B_COMPILED] = make_trainer(compiled, backend, dyn, cfg["precision"])
    batches = make_batches(sc["model"], sc["batch"], 3)
    block = sc.get("block", SYNC_EVERY)
    times = interleaved(steppers, batches, max(1, sc["steps"] // block), sc["warmup"], deadline, block=block)
    out = {"model": sc["model"], "batch": sc["batch"], "precision": cfg["precision"], "block": block, "rows": []}
    for name, ts in times.items():
        med = statistics.median(ts)
        out["rows"].append(
            {
                "loop": name,
                "timed_steps": len(ts) * block,
                "median_step_ms": med * 1000.0,
                "images_per_s": sc["batch"] / med,
            }
        )
    by = {r["loop"]: r for r in out["rows"]}
    out["ratio_trainer_to_plain_images_per_s"] = by[B_TRAINER]["images_per_s"] / by[B_PLAIN]["images_per_s"]
    out["ratio_trainer_to_old_step_images_per_s"] = by[B_TRAINER]["images_per_s"] / by[B_OLD]["images_per_s"]
    if sc.get("profile_steps") and time.monotonic() < deadline + sc.get("profile_budget_s", 0):
        out["profiles"] = {
            name: profile_steps(steppers[name], batches, sc["profile_steps"], backend) for name in (B_TRAINER, B_PLAIN)
        }
    return out


def profile_steps(stepper, batches: list, steps: int, backend, top: int = 12) -> dict:
    """``torch.profiler`` over ``steps`` train steps of ``stepper``: the ops with the most self time on
    the device, and the host syncs per step (the calls that make the CPU wait for the GPU). Why: a
    missed throughput target is explained by where the time goes, not by a second timing."""
    from torch.profiler import ProfilerActivity, profile

    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if torch.cuda.is_available() else [])
    for images, targets in batches[:1]:  # warm the allocator and autotuner outside the trace
        stepper.train_step(images, targets)
    backend.synchronize()
    with profile(activities=acts) as prof:
        for i in range(steps):
            images, targets = batches[i % len(batches)]
            stepper.train_step(images, targets)
        backend.synchronize()
    events = prof.key_averages()

    def dev_self(e):
        return float(getattr(e, "self_device_time_total", 0.0) or getattr(e, "self_cuda_time_total", 0.0) or 0.0)

    sync_names = (
        "cudaStreamSynchronize",
        "cudaDeviceSynchronize",
        "cudaEventSynchronize",
        "cudaMemcpy ",
        "cudaMemcpyAsync",
    )
    syncs = {e.key: e.count / steps for e in events if e.key.startswith(sync_names)}
    ranked = sorted(events, key=dev_self, reverse=True)[:top]
    total = sum(dev_self(e) for e in events) or 1.0
    return {
        "steps": steps,
        "device_self_ms_per_step": total / 1000.0 / steps,
        "top_ops": [
            {
                "op": e.key[:80],
                "self_ms_per_step": dev_self(e) / 1000.0 / steps,
                "share": dev_self(e) / total,
                "calls_per_step": e.count / steps,
            }
            for e in ranked
        ],
        "host_syncs_per_step": syncs,
    }
