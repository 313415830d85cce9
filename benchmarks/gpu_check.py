"""One-command GPU check (issue 13): what the CPU emulation claims, measured on a real card.

    PYTHONPATH=. python benchmarks/gpu_check.py              # on a CUDA machine (make gpu-check), <= 8 min on one H100
    .venv/bin/python benchmarks/gpu_check.py --cpu-smoke     # tiny sizes on CPU, a minute or two (make gpu-check-smoke)

Sections, each a function writing its numbers into the JSON (a failing section records
``{"error": ...}`` and the others still run; every section has a hard time budget):

a. ``DynamicLossScaler(style="torch")`` vs ``torch.amp.GradScaler``, step for step, same model copy and
   batches: per-step scale, skipped flags, max abs parameter difference after N steps; pass/fail.
b. SSD300-VGG16 mixed16 images/s at batch 32: lsbench's ``Trainer`` vs a plain torchvision-references
   AMP loop, interleaved, ratio.
c. adaptive (update_every 1 and 10) vs dynamic step time in real fp16 autocast, SSD300 and SSD512.
d. emulation vs reality: per-layer subnormal and flush rates (``telemetry.UnderflowProbe``) of
   fp16-emulated against real fp16 autocast on the same weights and batches, fp8-emulated alongside.
e. a short real-fp16 run of the seed-000 rows (+ fp32) on ssd_tiny with the synthetic data, several seeds.
f. peak memory per method (``torch.cuda.max_memory_allocated``; ``ru_maxrss`` of a fresh process on CPU).
g. section d for SSD512-VGG16 at batch 8 over 10 batches (on CUDA): where real fp16 flushes its gradients.
h. section a with foreach SGD on both sides instead of the backend's fused SGD (is a difference GradScaler's
   fused-optimizer path?).

``--sections`` picks the sections and their order (``gdbcaef`` runs the cheapest answers first);
``--budget`` caps the whole check in seconds (each section's own budget still holds).

Trainers are built directly (models, precision, scaling, engine), not through ``study``/``TrialConfig``,
so the check needs neither pydantic nor Ray nor MLflow; pycocotools is optional (mAP in e).
``--cpu-smoke`` forces the CPU and tiny sizes (``ssd_tiny``, ``fp16-emulated`` where the GPU runs mixed16);
its figures test the script, they are not measurements.

Writes ``OUT/gpu_check.json`` and ``OUT/gpu_check.md`` and prints the markdown.
"""

from __future__ import annotations

import argparse
import copy
import json
import math
import os
import platform
import resource
import shlex
import statistics
import subprocess
import sys
import time
import traceback
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
if str(ROOT) not in sys.path:  # `python benchmarks/gpu_check.py` without PYTHONPATH=. works too
    sys.path.insert(0, str(ROOT))

import warnings  # noqa: E402

import torch  # noqa: E402

if str(HERE) not in sys.path:  # imported as a module (tests), not run as a script
    sys.path.insert(0, str(HERE))
from scaler_overhead import METHODS  # noqa: E402
from scaler_overhead import _batch as _scaler_batch  # noqa: E402

# a skipped first step (overflow at scale 65536) makes torch warn that the lr schedule stepped first
warnings.filterwarnings("ignore", message="Detected call of `lr_scheduler.step()` before")

NUM_CLASSES = 4
SCHED = {"lr": 1e-4, "momentum": 0.9, "weight_decay": 5e-4}
#: the Trainer reads losses (and waits for the device) every this many steps, as a trial with
#: log_every 10 does; throughput is timed over blocks of this many steps, each ending in a device sync
SYNC_EVERY = 10
IMAGE_SIZE = {"ssd_tiny": 128, "ssd300_vgg16": 300, "ssd512_vgg16": 512}


# ---------------------------------------------------------------------------
# configuration
def make_config(smoke: bool) -> dict:
    if smoke:
        return {
            "device": "cpu", "precision": "fp16-emulated", "smoke": True, "total_budget_s": 240,
            "a": {"model": "ssd_tiny", "batch": 2, "steps": 12, "growth_interval": 2, "budget_s": 40},
            "b": {"model": "ssd_tiny", "batch": 4, "steps": 4, "warmup": 1, "block": 2, "budget_s": 30,
                  "profile_steps": 2, "profile_budget_s": 30},
            "c": {"models": {"ssd_tiny": 2}, "steps": 2, "warmup": 1, "budget_s": 30, "profile_steps": 2},
            "d": {"model": "ssd_tiny", "batch": 1, "batches": 1, "budget_s": 40},
            "e": {"seeds": [0, 1], "iterations": 3, "batch": 2, "train_images": 8, "val_images": 4,
                  "precision": "mixed16", "budget_s": 60},
            "f": {"model": "ssd_tiny", "batch": 2, "steps": 2, "budget_s": 60},
            "g": {"model": "ssd_tiny", "batch": 1, "batches": 2, "budget_s": 30},
            "h": {"model": "ssd_tiny", "batch": 2, "steps": 12, "growth_interval": 2, "budget_s": 40,
                  "optimizer": "foreach"},
        }
    return {
        "device": "cuda", "precision": "mixed16", "smoke": False, "total_budget_s": 420,
        "a": {"model": "ssd300_vgg16", "batch": 8, "steps": 40, "growth_interval": 10, "budget_s": 30},
        "b": {"model": "ssd300_vgg16", "batch": 32, "steps": 40, "warmup": 1, "block": SYNC_EVERY, "budget_s": 45,
              "profile_steps": SYNC_EVERY, "profile_budget_s": 20},
        "c": {"models": {"ssd300_vgg16": 32, "ssd512_vgg16": 16}, "steps": 12, "warmup": 2, "budget_s": 80,
              "profile_steps": SYNC_EVERY},
        "d": {"model": "ssd300_vgg16", "batch": 8, "batches": 4, "budget_s": 30},
        "e": {"seeds": [0, 1, 2], "iterations": 300, "batch": 8, "train_images": 512, "val_images": 64,
              "precision": "mixed16", "budget_s": 60},
        "f": {"model": "ssd300_vgg16", "batch": 32, "steps": 3, "budget_s": 30},
        # SSD512 at the published batch: does real fp16 flush its gradients at loss scale 1 (the
        # mechanism behind seed 000's "no loss scale: diverged")? 20 batches: with 75 s the emulated
        # probe's third of the budget covered 1 batch on an H200 (its first call compiles; the share now starts after it)
        "g": {"model": "ssd512_vgg16", "batch": 8, "batches": 20, "budget_s": 200},
        "h": {"model": "ssd300_vgg16", "batch": 8, "steps": 40, "growth_interval": 10, "budget_s": 30,
              "optimizer": "foreach"},
    }


# ---------------------------------------------------------------------------
# building blocks
def _batch(size: int, n: int, seed: int):
    """Random images with one box each: the helper of benchmarks/scaler_overhead.py."""
    return _scaler_batch(size, n, seed)


def _batches(model_name: str, n: int, count: int, seed0: int = 0):
    return [_batch(IMAGE_SIZE[model_name], n, seed0 + i) for i in range(count)]


def base_model(model_name: str, device: str, seed: int = 0):
    """A model on the device (with the backend's memory format), weights fixed by ``seed``."""
    from lossscale_bench.backends import get_backend
    from lossscale_bench.models import build_model

    torch.manual_seed(seed)
    backend = get_backend(device)
    return backend, backend.prepare_model(build_model(model_name, num_classes=NUM_CLASSES,
                                                      image_size=IMAGE_SIZE[model_name],
                                                      batched_loss=True))


def make_trainer(model, backend, method: dict, precision_name: str, sched: dict | None = None,
                 sync_every: int = SYNC_EVERY, optimizer_options: dict | None = None):
    """A Trainer as a trial builds it: the backend's optimizer kernels (fused SGD on CUDA, foreach on
    CPU), losses read every ``sync_every`` steps (the model's batched loss comes with the model)."""
    from lossscale_bench.engine.loop import Trainer
    from lossscale_bench.engine.schedule import build_optimizer, build_scheduler
    from lossscale_bench.precision import get_precision
    from lossscale_bench.scaling import build_scaler

    precision = get_precision(precision_name)
    precision.prepare(model)
    scaler = build_scaler(method, model, grad_format=precision.grad_format)
    sched = sched or SCHED
    opt = build_optimizer(model, sched, backend.optimizer_options() if optimizer_options is None
                          else optimizer_options)
    # iterations: open-ended (steps are driven one by one), so only every sync_every-th step waits
    return Trainer(model=model, optimizer=opt, scheduler=build_scheduler(opt, sched), scaler=scaler,
                   backend=backend, precision=precision, batches=iter(()), iterations=10**9,
                   sync_every=sync_every)


def reference_model(model):
    """A copy of ``model`` as torchvision's references train it: torchvision's per-image SSD loss
    (not the batched one) and the default NCHW memory format."""
    from torchvision.models.detection.ssd import SSD

    ref = copy.deepcopy(model)
    ref.__class__ = SSD
    return ref.to(memory_format=torch.contiguous_format)


class PlainAMP:
    """The torchvision-references training step: model(images, targets) -> sum -> GradScaler."""

    def __init__(self, model, backend, precision_name: str, init_scale: float = 65536.0, growth_interval: int = 2000,
                 optimizer_options: dict | None = None):
        from lossscale_bench.engine.schedule import build_optimizer, build_scheduler
        from lossscale_bench.precision import get_precision

        self.model, self.backend = model, backend
        self.precision = get_precision(precision_name)
        self.precision.prepare(model)  # emulated precisions (CPU smoke): the same rounding hooks
        self.device = backend.device
        # {}: torch's default SGD (foreach on CUDA), as the references
        self.optimizer = build_optimizer(model, SCHED, optimizer_options)
        self.scheduler = build_scheduler(self.optimizer, SCHED)
        self.scaler = torch.amp.GradScaler(self.device.type, init_scale=init_scale, growth_interval=growth_interval)

    def train_step(self, images, targets) -> tuple[float, bool]:
        images = [im.to(self.device, non_blocking=True) for im in images]
        targets = [{k: v.to(self.device, non_blocking=True) for k, v in t.items()} for t in targets]
        self.model.train()
        dtype = self.precision.autocast_dtype
        with torch.autocast(self.device.type, dtype=dtype or torch.float16, enabled=dtype is not None):
            loss_dict = self.model(images, targets)
            losses = sum(loss for loss in loss_dict.values())
        self.optimizer.zero_grad(set_to_none=True)
        scale = self.scaler.get_scale()
        self.scaler.scale(losses).backward()
        self.scaler.step(self.optimizer)
        self.scaler.update()
        skipped = self.scaler.get_scale() < scale  # GradScaler backs off exactly when it skipped
        self.scheduler.step()
        # the references log every step: ``loss_value = losses_reduced.item()`` (a host read)
        float(losses.detach())
        return float(scale), skipped


def _optimizer_kernels(device: str) -> str:
    """What the backend asks of SGD, in words (without building a CUDA backend on a CPU machine)."""
    return {"cuda": "fused SGD", "cpu": "foreach SGD"}.get(device, "torch's default SGD")


def _median_ms(xs):
    return statistics.median(xs) * 1000.0 if xs else None


def _sync() -> None:
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.synchronize()


def interleaved(steppers: dict, batches: list, steps: int, warmup: int, deadline: float,
                block: int = 1) -> dict:
    """Seconds per step for each stepper, interleaved round-robin, stopping at ``deadline``.

    Each stepper runs ``block`` steps in a row, then the device is waited for, and the block's
    time divided by ``block`` is one sample: a loop that does not wait every step (the Trainer
    with ``sync_every``) is timed for what it finishes, not for what it queued. ``steps`` and
    ``warmup`` count blocks."""
    times = {name: [] for name in steppers}
    done = 0
    k = 0
    for i in range(warmup + steps):
        if time.monotonic() > deadline and done >= 1:
            break
        for name, st in steppers.items():
            _sync()
            t0 = time.perf_counter()
            for j in range(block):
                images, targets = batches[(k + j) % len(batches)]
                st.train_step(images, targets)
            _sync()
            dt = (time.perf_counter() - t0) / block
            if i >= warmup:
                times[name].append(dt)
        k += block
        if i >= warmup:
            done += 1
    return times


def _free():
    import gc

    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


# ---------------------------------------------------------------------------
# a. torch-style dynamic scaler vs GradScaler
def section_a(cfg: dict, sc: dict) -> dict:
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
    ours = make_trainer(model, backend, {"method": "dynamic", "style": "torch"}, cfg["precision"],
                        optimizer_options=opt_options)
    ours.scaler = DynamicLossScaler(style="torch", interval=sc["growth_interval"])
    plain = PlainAMP(model_gs, backend, cfg["precision"], growth_interval=sc["growth_interval"],
                     optimizer_options=opt_options)
    rows = []
    for i in range(sc["steps"]):
        if time.monotonic() > deadline and rows:
            break
        images, targets = _batch(IMAGE_SIZE[sc["model"]], sc["batch"], 1000 + i)
        rec = ours.train_step(images, targets)
        gs_scale, gs_skipped = plain.train_step(images, targets)
        rows.append({"step": i + 1, "scale_lsbench": rec.result.scale, "scale_gradscaler": gs_scale,
                     "skipped_lsbench": rec.result.skipped, "skipped_gradscaler": gs_skipped})
    with torch.no_grad():
        finite = {"lsbench": all(bool(torch.isfinite(q).all()) for q in model.parameters()),
                  "gradscaler": all(bool(torch.isfinite(q).all()) for q in model_gs.parameters())}
        diffs = [(a.float() - b.float()).abs().max().item() for a, b in zip(model.parameters(), model_gs.parameters())]
        max_abs = max(diffs) if diffs else 0.0
        max_param = max(p.abs().max().item() for p in model.parameters())
    scales_equal = all(r["scale_lsbench"] == r["scale_gradscaler"] for r in rows)
    skips_equal = all(r["skipped_lsbench"] == r["skipped_gradscaler"] for r in rows)
    # CPU is bit-reproducible; cuDNN may pick non-deterministic kernels, so allow float noise there
    tol = 0.0 if cfg["device"] == "cpu" else 1e-3 * max(1.0, max_param)
    return {"model": sc["model"], "batch": sc["batch"], "precision": cfg["precision"],
            "growth_interval": sc["growth_interval"], "init_scale": 65536.0, "steps": len(rows),
            "optimizer": opt_options, "params_finite": finite,
            "per_step": rows, "scales_equal": scales_equal, "skips_equal": skips_equal,
            "skipped_steps": sum(r["skipped_lsbench"] for r in rows),
            "max_abs_param_diff": max_abs, "tolerance": tol,
            "pass": bool(scales_equal and skips_equal and max_abs <= tol)}


# ---------------------------------------------------------------------------
# b. Trainer vs plain AMP loop throughput
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
    steppers = {B_TRAINER: make_trainer(model, backend, dyn, cfg["precision"]),
                B_PLAIN: PlainAMP(reference_model(model), backend, cfg["precision"]),
                B_OLD: make_trainer(old_model, backend, dyn, cfg["precision"], sync_every=1)}
    if cfg.get("compile"):
        from lossscale_bench.backends.cuda import compile_parts

        compiled = copy.deepcopy(model)
        compile_parts(compiled)
        steppers[B_COMPILED] = make_trainer(compiled, backend, dyn, cfg["precision"])
    batches = _batches(sc["model"], sc["batch"], 3)
    block = sc.get("block", SYNC_EVERY)
    times = interleaved(steppers, batches, max(1, sc["steps"] // block), sc["warmup"], deadline, block=block)
    out = {"model": sc["model"], "batch": sc["batch"], "precision": cfg["precision"], "block": block,
           "rows": []}
    for name, ts in times.items():
        med = statistics.median(ts)
        out["rows"].append({"loop": name, "timed_steps": len(ts) * block, "median_step_ms": med * 1000.0,
                            "images_per_s": sc["batch"] / med})
    by = {r["loop"]: r for r in out["rows"]}
    out["ratio_trainer_to_plain_images_per_s"] = by[B_TRAINER]["images_per_s"] / by[B_PLAIN]["images_per_s"]
    out["ratio_trainer_to_old_step_images_per_s"] = by[B_TRAINER]["images_per_s"] / by[B_OLD]["images_per_s"]
    if sc.get("profile_steps") and time.monotonic() < deadline + sc.get("profile_budget_s", 0):
        out["profiles"] = {name: profile_steps(steppers[name], batches, sc["profile_steps"], backend)
                           for name in (B_TRAINER, B_PLAIN)}
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

    sync_names = ("cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaEventSynchronize", "cudaMemcpy ",
                  "cudaMemcpyAsync")
    syncs = {e.key: e.count / steps for e in events if e.key.startswith(sync_names)}
    ranked = sorted(events, key=dev_self, reverse=True)[:top]
    total = sum(dev_self(e) for e in events) or 1.0
    return {"steps": steps, "device_self_ms_per_step": total / 1000.0 / steps,
            "top_ops": [{"op": e.key[:80], "self_ms_per_step": dev_self(e) / 1000.0 / steps,
                         "share": dev_self(e) / total, "calls_per_step": e.count / steps} for e in ranked],
            "host_syncs_per_step": syncs}


# ---------------------------------------------------------------------------
# c. adaptive overhead vs dynamic
# scaler_overhead's methods (the benchmark these figures extend), less the unscaled ones
C_METHODS = {k: v for k, v in METHODS.items() if k.startswith(("dynamic", "adaptive"))}


def section_c(cfg: dict, sc: dict) -> dict:
    start = time.monotonic()
    out = {"precision": cfg["precision"], "rows": []}
    models = list(sc["models"].items())
    for k, (model_name, batch) in enumerate(models):
        # split what is left of the budget over the models still to do
        left = sc["budget_s"] - (time.monotonic() - start)
        deadline = time.monotonic() + left / (len(models) - k)
        backend, model = base_model(model_name, cfg["device"])
        steppers = {name: make_trainer(copy.deepcopy(model), backend, m, cfg["precision"])
                    for name, m in C_METHODS.items()}
        del model
        batches = _batches(model_name, batch, 2)
        block = sc.get("block", 1)
        times = interleaved(steppers, batches, max(1, sc["steps"] // block), sc["warmup"], deadline, block=block)
        if sc.get("profile_steps") and k == 0:  # where adaptive's extra time goes, on the first model
            out["profiles"] = {name: profile_steps(steppers[name], batches, sc["profile_steps"], backend)
                               for name in ("dynamic (interval 10)", "adaptive (update_every 10)")}
        base = statistics.median(times["dynamic (interval 10)"])
        for name, ts in times.items():
            med = statistics.median(ts)
            out["rows"].append({"model": model_name, "batch": batch, "method": name, "timed_steps": len(ts) * block,
                                "median_step_ms": med * 1000.0, "ratio_to_dynamic": med / base})
        del steppers, batches
        _free()
    return out


# ---------------------------------------------------------------------------
# d. emulation vs reality (per-layer underflow telemetry)
def _probe_rates(model, backend, precision_name: str, batches: list,
                 seconds: float | None = None) -> tuple[dict, int]:
    """Per-layer rates over ``batches`` and how many batches they cover: with ``seconds``, stopping at
    the first batch that ends more than ``seconds`` after the *first* batch ended (the first call
    compiles the emulation's kernels for every layer shape: on an H100, SSD512's first emulated batch
    took longer than a 54 s share, so a deadline counted from the start covered one batch). The caller
    compares runs over the same batches, so it passes the others the count the first one did."""
    from lossscale_bench.precision import get_precision
    from lossscale_bench.precision.telemetry import UnderflowProbe

    precision = get_precision(precision_name)
    handle = precision.prepare(model)
    probe = UnderflowProbe(model, fmt=precision.telemetry_format)
    model.train()
    probe.arm()
    done, deadline = 0, None
    for images, targets in batches:
        if deadline is not None and time.monotonic() > deadline:
            break
        images, targets = backend.to_device(images, targets)
        model.zero_grad(set_to_none=True)
        with backend.autocast(precision.autocast_dtype):
            parts = model(images, targets)
            loss = sum(parts.values())
        loss.float().backward()  # loss scale 1: the underflow a scaler would have to fix
        done += 1
        if done == 1 and seconds is not None:
            backend.synchronize()
            deadline = time.monotonic() + seconds
    backend.synchronize()
    rates = probe.read()
    probe.remove()
    if handle is not None:
        handle.remove()
    return rates, done


def section_d(cfg: dict, sc: dict) -> dict:
    deadline = time.monotonic() + sc["budget_s"]
    backend, model = base_model(sc["model"], cfg["device"])
    batches = _batches(sc["model"], sc["batch"], sc["batches"], seed0=500)
    results = {}
    names = ("fp16-emulated", "mixed16", "fp8-emulated")
    for k, name in enumerate(names):
        if time.monotonic() > deadline and results:
            results[name] = None
            continue
        # the emulated fp16 run first, on a share of the budget; the others then see the same batches
        share = (deadline - time.monotonic()) / (len(names) - k) if k == 0 else None
        results[name], done = _probe_rates(copy.deepcopy(model), backend, name, batches, share)
        if k == 0:
            batches = batches[:max(1, done)]
    real, emu, fp8 = results["mixed16"], results["fp16-emulated"], results["fp8-emulated"]
    layers = []
    for layer in emu:
        e, r = emu[layer], (real or {}).get(layer)
        f = (fp8 or {}).get(layer)
        row = {"layer": layer, "nonzero_emulated": e["nonzero"],
               "underflow_emulated": e["underflow_rate"], "flush_emulated": e["flush_rate"]}
        if r is not None:
            # real fp16 gradients arrive already rounded: flushed elements are exact zeros, which the
            # probe does not count, so its own flush rate is 0 by construction. The flush rate real
            # fp16 implies is the share of the emulation's non-zero elements that are zero there.
            implied = max(0.0, (e["nonzero"] - r["nonzero"]) / e["nonzero"]) if e["nonzero"] else 0.0
            row.update({"nonzero_real": r["nonzero"], "underflow_real": r["underflow_rate"],
                        "flush_real_probe": r["flush_rate"], "flush_real_implied": implied,
                        "abs_diff_underflow": abs(e["underflow_rate"] - r["underflow_rate"]),
                        "abs_diff_flush": abs(e["flush_rate"] - implied)})
        if f is not None:
            row.update({"underflow_fp8_emulated": f["underflow_rate"], "flush_fp8_emulated": f["flush_rate"]})
        layers.append(row)
    with_real = [r for r in layers if "abs_diff_flush" in r and r["nonzero_emulated"] > 0]
    emu_nz = sum(r["nonzero_emulated"] for r in with_real)
    # over the whole model: the share of gradient elements (non-zero before rounding) each run flushed
    overall = {"flush_real_implied": (sum(max(0, r["nonzero_emulated"] - r["nonzero_real"]) for r in with_real)
                                      / emu_nz) if emu_nz else None,
               "flush_emulated": (sum(r["flush_emulated"] * r["nonzero_emulated"] for r in with_real)
                                  / emu_nz) if emu_nz else None}
    return {"overall": overall, "model": sc["model"], "batch": sc["batch"], "batches": len(batches), "loss_scale": 1.0,
            "real": "mixed16 (fp16 autocast on %s)" % cfg["device"],
            "skipped": [k for k, v in results.items() if v is None],
            "layers": layers,
            "max_abs_diff_flush": max((r["abs_diff_flush"] for r in with_real), default=None),
            "max_abs_diff_underflow": max((r["abs_diff_underflow"] for r in with_real), default=None),
            "mean_abs_diff_flush": (sum(r["abs_diff_flush"] for r in with_real) / len(with_real)) if with_real else None}


# ---------------------------------------------------------------------------
# e. short real-fp16 run of the seed-000 rows
E_ROWS = {
    "FP32 baseline": ({"method": "none"}, "fp32"),
    "fp16: no loss scale": ({"method": "fixed", "scale": 1}, None),
    "fp16: loss scale (128)": ({"method": "fixed", "scale": 128}, None),
    "fp16: loss scale (dynamic, interval=10)": ({"method": "dynamic", "interval": 10}, None),
    "fp16: adaptive": ({"method": "adaptive"}, None),
}


def section_e(cfg: dict, sc: dict, out_dir: Path) -> dict:
    start = time.monotonic()
    from lossscale_bench.data import build_datasets, infinite_batches

    try:
        import pycocotools  # noqa: F401

        have_coco = True
    except ImportError:
        have_coco = False
    train, val, classes = build_datasets({"name": "synthetic", "root": str(out_dir / "data"), "image_size": 128,
                                          "train_images": sc["train_images"], "val_images": sc["val_images"],
                                          "seed": 0})
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
            row = {"label": label, "seed": seed, "precision": precision, "steps": steps,
                   "final_loss": losses[-1] if losses else None,
                   "final_loss_mean_last10": (sum(tail) / len(tail)) if tail else None,
                   "skipped_steps": skipped, "final_scale": tr.scaler.current_scale()}
            if have_coco:
                from lossscale_bench.evaluation import evaluate_coco

                m = evaluate_coco(model, val, device=backend.device, batch_size=sc["batch"])
                row["map"], row["map_50"] = m["map"], m["map_50"]
            runs.append(row)
            tr.scaler.remove()
            del tr, model
    return {"model": "ssd_tiny", "data": f"synthetic, {sc['train_images']} train / {sc['val_images']} val images, 128 px",
            "batch": sc["batch"], "iterations_target": iters, "fp16_precision": sc["precision"],
            "seeds": sc["seeds"], "map": "computed" if have_coco else "skipped: pycocotools is not importable",
            "runs": runs}


# ---------------------------------------------------------------------------
# f. peak memory per method
F_METHODS = METHODS  # every method of benchmarks/scaler_overhead.py


def _maxrss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def _proc_status_mb(field: str) -> float | None:
    try:
        for line in open("/proc/self/status"):
            if line.startswith(field + ":"):
                return int(line.split()[1]) / 1024.0
    except OSError:
        pass
    return None


def _reset_hwm() -> bool:
    """Reset the process's resident high-water mark (Linux >= 4.0: write 5 to clear_refs)."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return _proc_status_mb("VmHWM") is not None
    except OSError:
        return False


def _memory_one(device: str, precision: str, model_name: str, batch: int, steps: int, method_name: str) -> dict:
    batches = _batches(model_name, batch, 1)
    if device == "cuda":
        torch.cuda.synchronize()
        base = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
    else:
        hwm = _reset_hwm()
        base = (_proc_status_mb("VmRSS") if hwm else _maxrss_mb()) * 2**20
    backend, model = base_model(model_name, device)
    tr = make_trainer(model, backend, F_METHODS[method_name], precision)
    for _ in range(steps):
        tr.train_step(*batches[0])
    if device == "cuda":
        torch.cuda.synchronize()
        peak = torch.cuda.max_memory_allocated()
        measure = "torch.cuda.max_memory_allocated, minus what was allocated before the model was built"
    else:
        if hwm:
            peak = _proc_status_mb("VmHWM") * 2**20
            measure = ("resident high-water mark (VmHWM, reset after imports) of a fresh process per method, "
                       "minus its resident size then (process peak in brackets)")
        else:
            peak = _maxrss_mb() * 2**20
            measure = ("ru_maxrss of a fresh process per method, minus its value after imports "
                       "(process peak in brackets)")
    return {"peak_mb": (peak - base) / 2**20, "process_peak_mb": peak / 2**20, "measure": measure}


def section_f(cfg: dict, sc: dict) -> dict:
    deadline = time.monotonic() + sc["budget_s"]
    rows = []
    for name in F_METHODS:
        if time.monotonic() > deadline and rows:
            rows.append({"method": name, "skipped": "time budget"})
            continue
        if cfg["device"] == "cuda":
            r = _memory_one("cuda", cfg["precision"], sc["model"], sc["batch"], sc["steps"], name)
            _free()
        else:
            # ru_maxrss only grows: one fresh process per method
            cmd = [sys.executable, str(Path(__file__).resolve()), "--_memory", name, "--_memory-args",
                   json.dumps([cfg["device"], cfg["precision"], sc["model"], sc["batch"], sc["steps"]])]
            env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
            left = max(10.0, deadline - time.monotonic() + 10.0)
            p = subprocess.run(cmd, capture_output=True, text=True, timeout=left, env=env)
            if p.returncode != 0:
                raise RuntimeError(f"memory probe for {name} failed: {p.stderr.strip().splitlines()[-1:]}")
            r = json.loads(p.stdout.strip().splitlines()[-1])
        rows.append({"method": name, **r})
    return {"model": sc["model"], "batch": sc["batch"], "steps": sc["steps"], "precision": cfg["precision"],
            "rows": rows}


# ---------------------------------------------------------------------------
# markdown
def _f(x, fmt="{:.3f}"):
    if x is None:
        return "–"
    if isinstance(x, bool):
        return "yes" if x else "no"
    if isinstance(x, float):
        return fmt.format(x)
    return str(x)


def _table(header: list[str], rows: list[list]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(_f(v) for v in r) + " |" for r in rows]
    return lines


def render_markdown(res: dict) -> str:
    m = res["meta"]
    s = res["sections"]
    L = [f"### GPU check: {m['device_name']}{' (CPU smoke: tests the script, not figures)' if m['smoke'] else ''}",
         "",
         f"Device `{m['device_name']}`, torch {m['torch']}, torchvision {m['torchvision']}, Python {m['python']}, "
         f"{m['total_s']:.0f} s in all. Command: `{m['command']}`", ""]

    def head(key, title):
        L.append(f"**{key}. {title}**" + (f" ({s[key]['seconds']:.0f} s)" if "seconds" in s[key] else ""))
        L.append("")
        if "error" in s[key]:
            L.extend([f"error: `{s[key]['error']}`", ""])
            return None
        if "skipped" in s[key] and isinstance(s[key]["skipped"], str):
            L.extend([f"skipped: {s[key]['skipped']}", ""])
            return None
        return s[key]

    for key in ("a", "h"):
        _render_scaler_match(L, head(key, "torch-style DynamicLossScaler vs torch.amp.GradScaler, step for step"))
    b = head("b", "lsbench Trainer vs plain PyTorch AMP loop, images/s")
    if b:
        L += _table(["model", "loop", "timed steps", "median step (ms)", "images/s"],
                    [[f"{b['model']} (batch {b['batch']}, {b['precision']})", r["loop"], r["timed_steps"],
                      f"{r['median_step_ms']:.1f}", f"{r['images_per_s']:.1f}"] for r in b["rows"]])
        L += ["", f"Trainer / plain images/s: **{b['ratio_trainer_to_plain_images_per_s']:.3f}**; "
              f"Trainer / its old step (torchvision loss, a read per step): "
              f"{b['ratio_trainer_to_old_step_images_per_s']:.3f}. Timed over blocks of {b['block']} steps, "
              f"each ending in a device sync; lsbench step: {m['lsbench_step']}. The plain loop is "
              "torchvision's references': torchvision's SSD loss, NCHW, torch's default SGD, a loss read "
              "per step.", ""]
        _render_profiles(L, b.get("profiles"))
    c = head("c", "adaptive overhead vs dynamic")
    if c:
        L += _table(["model", "method", "timed steps", "median step (ms)", "ratio to dynamic"],
                    [[f"{r['model']} (batch {r['batch']}, {c['precision']})", r["method"], r["timed_steps"],
                      f"{r['median_step_ms']:.1f}", f"{r['ratio_to_dynamic']:.3f}"] for r in c["rows"]])
        L.append("")
        _render_profiles(L, c.get("profiles"))
    for key in ("d", "g"):
        _render_probe(L, head(key, "emulation vs reality: per-layer gradient underflow at loss scale 1"))
    e = head("e", "short fp16 run of the seed-000 rows")
    if e:
        L.append(f"{e['model']}, {e['data']}, batch {e['batch']}, up to {e['iterations_target']} iterations, "
                 f"fp16 rows in {e['fp16_precision']}; mAP: {e['map']}.")
        L.append("")
        has_map = e["map"] == "computed"
        L += _table(["row", "seed", "steps", "final loss", "mean loss (last 10)", "skipped", "final scale"]
                    + (["mAP", "mAP@.5"] if has_map else []),
                    [[r["label"], r["seed"], r["steps"], r["final_loss"], r["final_loss_mean_last10"],
                      r["skipped_steps"], f"{r['final_scale']:g}"] + ([r["map"], r["map_50"]] if has_map else [])
                     for r in e["runs"]])
        L.append("")
    f = head("f", "peak memory per method")
    if f:
        L.append(f"{f['model']} batch {f['batch']}, {f['precision']}, {f['steps']} steps; "
                 f"{f['rows'][0].get('measure', '')}.")
        L.append("")
        L += _table(["method", "peak (MiB)"],
                    [[r["method"], f"{r['peak_mb']:.0f} ({r['process_peak_mb']:.0f})" if "peak_mb" in r
                      else r.get("skipped")] for r in f["rows"]])
        L.append("")
    return "\n".join(L)


def _render_scaler_match(L: list, a: dict | None) -> None:
    """Sections a and h."""
    if not a:
        return

    L.append(f"{a['model']} batch {a['batch']}, {a['precision']}, init scale 65536, growth interval "
             f"{a['growth_interval']}, {a['steps']} steps, {a['skipped_steps']} skipped; SGD options "
             f"{a.get('optimizer')}; parameters finite at the end: {a.get('params_finite')}.")
    L.append("")
    L += _table(["scales equal", "skips equal", "max abs param diff", "tolerance", "pass"],
                [[a["scales_equal"], a["skips_equal"], f"{a['max_abs_param_diff']:.3g}", f"{a['tolerance']:.3g}",
                  "**PASS**" if a["pass"] else "**FAIL**"]])
    L += ["", "scale per step (lsbench = GradScaler where equal): "
          + ", ".join((f"{r['scale_lsbench']:g}" if r["scale_lsbench"] == r["scale_gradscaler"]
                       else f"{r['scale_lsbench']:g}≠{r['scale_gradscaler']:g}") + ("*" if r["skipped_lsbench"] else "")
                      for r in a["per_step"]) + " (* skipped)", ""]


def _render_profiles(L: list, profiles: dict | None) -> None:
    """Per loop: device time per step, host syncs per step, and the top ops (torch.profiler)."""
    for name, p in (profiles or {}).items():
        syncs = ", ".join(f"{k} {v:.1f}" for k, v in p["host_syncs_per_step"].items()) or "none"
        L.append(f"Profile of {name} ({p['steps']} steps): {p['device_self_ms_per_step']:.1f} ms of device "
                 f"time per step; host syncs per step: {syncs}.")
        L.append("")
        L += _table(["op", "self ms/step", "share", "calls/step"],
                    [[r["op"].replace("|", "/"), f"{r['self_ms_per_step']:.2f}", f"{r['share']:.1%}",
                      f"{r['calls_per_step']:.1f}"] for r in p["top_ops"][:8]])
        L.append("")


def _render_probe(L: list, d: dict | None) -> None:
    """Sections d and g: one model's per-layer rates, emulated vs real."""
    if not d:
        return
    L.append(f"{d['model']} batch {d['batch']} x {d['batches']} batch(es); rates among elements non-zero "
             "before rounding. Real fp16 gradients arrive already rounded, so flushed elements are zeros "
             "the probe cannot see: its flush column for real fp16 is the share of the emulation's non-zero "
             "elements that are zero in the real run (same weights, same batches).")
    L.append("")
    L += _table(["layer", "subnormal emu", "subnormal real", "flush emu", "flush real (implied)", "|Δ flush|",
                 "subnormal fp8-emu", "flush fp8-emu"],
                [[r["layer"]] + [_f(r.get(k), "{:.4f}") for k in
                                 ("underflow_emulated", "underflow_real", "flush_emulated", "flush_real_implied",
                                  "abs_diff_flush", "underflow_fp8_emulated", "flush_fp8_emulated")]
                 for r in d["layers"]])
    L += ["", f"Agreement: max |Δ flush| {_f(d['max_abs_diff_flush'], '{:.4f}')}, "
          f"mean {_f(d['mean_abs_diff_flush'], '{:.4f}')}; "
          f"max |Δ subnormal| {_f(d['max_abs_diff_underflow'], '{:.4f}')}. Whole model: real fp16 flushed "
          f"{_f(d['overall']['flush_real_implied'], '{:.4f}')} of the non-zero gradient elements, the "
          f"emulation {_f(d['overall']['flush_emulated'], '{:.4f}')}."
          + (f" Not run (time budget): {', '.join(d['skipped'])}." if d["skipped"] else ""), ""]


# ---------------------------------------------------------------------------
def device_name(device: str) -> str:
    if device == "cuda":
        return torch.cuda.get_device_name(0)
    return f"cpu: {platform.processor() or platform.machine()}, {torch.get_num_threads()} torch threads, " \
           f"{os.cpu_count()} cores"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="runs/gpu_check", help="output folder (default runs/gpu_check/)")
    ap.add_argument("--cpu-smoke", action="store_true", help="force the CPU and tiny sizes (tests the script)")
    ap.add_argument("--sections", default="abcdefgh",
                    help="sections to run, in this order (default abcdefgh)")
    ap.add_argument("--budget", type=float, default=None,
                    help="the whole check's time budget in seconds (default: 420 on CUDA, 240 for the smoke)")
    ap.add_argument("--compile", action="store_true",
                    help="CUDA: also time the Trainer with torch.compile'd backbone and heads in section b")
    ap.add_argument("--_memory", help=argparse.SUPPRESS)
    ap.add_argument("--_memory-args", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)

    if args._memory:  # child process of section f on CPU
        device, precision, model_name, batch, steps = json.loads(args._memory_args)
        print(json.dumps(_memory_one(device, precision, model_name, batch, steps, args._memory)))
        return 0

    if not args.cpu_smoke and not torch.cuda.is_available():
        print("gpu_check: no CUDA device is visible (torch.cuda.is_available() is False); "
              "run on a GPU machine or pass --cpu-smoke", file=sys.stderr)
        return 2

    t_start = time.monotonic()
    cfg = make_config(args.cpu_smoke)
    if args.budget is not None:
        cfg["total_budget_s"] = args.budget
    unknown = sorted(set(args.sections) - set("abcdefgh"))
    if unknown:
        print(f"gpu_check: --sections: unknown section(s) {', '.join(unknown)}; allowed: a b c d e f g h",
              file=sys.stderr)
        return 2
    cfg["compile"] = bool(args.compile) and cfg["device"] == "cuda"
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    if cfg["device"] == "cuda":
        # fp32 rows (section e's baseline) stay fp32: no TF32 in matmuls or convolutions
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
    try:
        import torchvision

        tv = torchvision.__version__
    except Exception:  # noqa: BLE001
        tv = "not importable"
    res = {"meta": {"device": cfg["device"], "device_name": device_name(cfg["device"]), "smoke": cfg["smoke"],
                    "torch": torch.__version__, "torchvision": tv, "python": platform.python_version(),
                    "cuda": torch.version.cuda, "precision": cfg["precision"],
                    "lsbench_step": (f"batched SSD loss, losses read every {SYNC_EVERY} steps, optimizer "
                                     f"{_optimizer_kernels(cfg['device'])}, "
                                     f"{'channels_last' if cfg['device'] in ('cpu', 'cuda') else 'NCHW'}"),
                    "command": "python " + " ".join(shlex.quote(a) for a in
                                                    ["benchmarks/gpu_check.py"] + sys.argv[1:]),
                    "config": cfg},
           "sections": {}}
    funcs = {"a": lambda: section_a(cfg, cfg["a"]), "b": lambda: section_b(cfg, cfg["b"]),
             "c": lambda: section_c(cfg, cfg["c"]), "d": lambda: section_d(cfg, cfg["d"]),
             "e": lambda: section_e(cfg, cfg["e"], out_dir), "f": lambda: section_f(cfg, cfg["f"]),
             "g": lambda: section_d(cfg, cfg["g"]), "h": lambda: section_a(cfg, cfg["h"])}
    json_path = out_dir / "gpu_check.json"
    for key in funcs:
        if key not in args.sections:
            res["sections"][key] = {"skipped": "not selected (--sections)"}
    for key in dict.fromkeys(args.sections):  # the order asked for, each once
        fn = funcs[key]
        t0 = time.monotonic()
        left = cfg["total_budget_s"] - (t0 - t_start)
        if left < 10:
            res["sections"][key] = {"skipped": f"the whole check's time budget ({cfg['total_budget_s']} s) is spent"}
            continue
        cfg[key]["budget_s"] = min(cfg[key]["budget_s"], left)  # each section's budget is hard; so is the total
        print(f"[gpu_check] section {key} ...", file=sys.stderr, flush=True)
        try:
            r = fn()
        except Exception as exc:  # noqa: BLE001 - one failing section must not lose the others
            r = {"error": f"{type(exc).__name__}: {exc}".splitlines()[0][:500],
                 "traceback": traceback.format_exc()[-3000:]}
        r["seconds"] = time.monotonic() - t0
        res["sections"][key] = r
        print(f"[gpu_check] section {key}: {'error' if 'error' in r else 'ok'} in {r['seconds']:.1f} s",
              file=sys.stderr, flush=True)
        _free()
        res["meta"]["total_s"] = time.monotonic() - t_start
        json_path.write_text(json.dumps(res, indent=1, default=str))  # partial results survive a kill
    res["meta"]["total_s"] = time.monotonic() - t_start
    json_path.write_text(json.dumps(res, indent=1, default=str))
    md = render_markdown(res)
    (out_dir / "gpu_check.md").write_text(md + "\n")
    print(md)
    return 0


if __name__ == "__main__":
    sys.exit(main())
