"""What the GPU check's sections share: the configuration (sizes and time budgets), random batches,
models and Trainers built as a trial builds them, the torchvision-references AMP loop, and interleaved
step timing with device syncs."""

from __future__ import annotations

import copy
import os
import platform
import time

import torch
from scaler_overhead import random_batch

__all__ = [
    "IMAGE_SIZE",
    "NUM_CLASSES",
    "SCHED",
    "SYNC_EVERY",
    "PlainAMP",
    "base_model",
    "device_name",
    "free_memory",
    "interleaved",
    "make_batches",
    "make_config",
    "make_trainer",
    "optimizer_kernels",
    "random_batch",
    "reference_model",
    "sync",
]

NUM_CLASSES = 4
SCHED = {"lr": 1e-4, "momentum": 0.9, "weight_decay": 5e-4}
#: the Trainer reads losses (and waits for the device) every this many steps, as a trial with
#: log_every 10 does; throughput is timed over blocks of this many steps, each ending in a device sync
SYNC_EVERY = 10
IMAGE_SIZE = {"ssd_tiny": 128, "ssd300_vgg16": 300, "ssd512_vgg16": 512}


def make_config(smoke: bool) -> dict:
    """Every section's sizes and time budget: tiny on CPU (``smoke``), the real check on CUDA."""
    if smoke:
        return {
            "device": "cpu",
            "precision": "fp16-emulated",
            "smoke": True,
            "total_budget_s": 240,
            "a": {"model": "ssd_tiny", "batch": 2, "steps": 12, "growth_interval": 2, "budget_s": 40},
            "b": {
                "model": "ssd_tiny",
                "batch": 4,
                "steps": 4,
                "warmup": 1,
                "block": 2,
                "budget_s": 30,
                "profile_steps": 2,
                "profile_budget_s": 30,
            },
            "c": {"models": {"ssd_tiny": 2}, "steps": 2, "warmup": 1, "budget_s": 30, "profile_steps": 2},
            "d": {"model": "ssd_tiny", "batch": 1, "batches": 1, "budget_s": 40},
            "e": {
                "seeds": [0, 1],
                "iterations": 3,
                "batch": 2,
                "train_images": 8,
                "val_images": 4,
                "precision": "mixed16",
                "budget_s": 60,
            },
            "f": {"model": "ssd_tiny", "batch": 2, "steps": 2, "budget_s": 60},
            "g": {"model": "ssd_tiny", "batch": 1, "batches": 2, "budget_s": 30},
            "h": {
                "model": "ssd_tiny",
                "batch": 2,
                "steps": 12,
                "growth_interval": 2,
                "budget_s": 40,
                "optimizer": "foreach",
            },
        }
    return {
        "device": "cuda",
        "precision": "mixed16",
        "smoke": False,
        "total_budget_s": 420,
        "a": {"model": "ssd300_vgg16", "batch": 8, "steps": 40, "growth_interval": 10, "budget_s": 30},
        "b": {
            "model": "ssd300_vgg16",
            "batch": 32,
            "steps": 40,
            "warmup": 1,
            "block": SYNC_EVERY,
            "budget_s": 45,
            "profile_steps": SYNC_EVERY,
            "profile_budget_s": 20,
        },
        "c": {
            "models": {"ssd300_vgg16": 32, "ssd512_vgg16": 16},
            "steps": 12,
            "warmup": 2,
            "budget_s": 80,
            "profile_steps": SYNC_EVERY,
        },
        "d": {"model": "ssd300_vgg16", "batch": 8, "batches": 4, "budget_s": 30},
        "e": {
            "seeds": [0, 1, 2],
            "iterations": 300,
            "batch": 8,
            "train_images": 512,
            "val_images": 64,
            "precision": "mixed16",
            "budget_s": 60,
        },
        "f": {"model": "ssd300_vgg16", "batch": 32, "steps": 3, "budget_s": 30},
        # SSD512 at the published batch: does real fp16 flush its gradients at loss scale 1 (the
        # mechanism behind the published table's "no loss scale: diverged")? 20 batches: with 75 s the emulated
        # probe's third of the budget covered 1 batch on an H200 (its first call compiles; the share now starts after it)
        "g": {"model": "ssd512_vgg16", "batch": 8, "batches": 20, "budget_s": 200},
        "h": {
            "model": "ssd300_vgg16",
            "batch": 8,
            "steps": 40,
            "growth_interval": 10,
            "budget_s": 30,
            "optimizer": "foreach",
        },
    }


def make_batches(model_name: str, n: int, count: int, seed0: int = 0):
    """``count`` batches of ``n`` random images at ``model_name``'s size, seeds ``seed0`` on."""
    return [random_batch(IMAGE_SIZE[model_name], n, seed0 + i) for i in range(count)]


def base_model(model_name: str, device: str, seed: int = 0):
    """A model on the device (with the backend's memory format), weights fixed by ``seed``."""
    from lossscale_bench.backends import get_backend
    from lossscale_bench.models import build_model

    torch.manual_seed(seed)
    backend = get_backend(device)
    return backend, backend.prepare_model(
        build_model(model_name, num_classes=NUM_CLASSES, image_size=IMAGE_SIZE[model_name], batched_loss=True)
    )


def make_trainer(
    model,
    backend,
    method: dict,
    precision_name: str,
    sched: dict | None = None,
    sync_every: int = SYNC_EVERY,
    optimizer_options: dict | None = None,
):
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
    opt = build_optimizer(model, sched, backend.optimizer_options() if optimizer_options is None else optimizer_options)
    # iterations: open-ended (steps are driven one by one), so only every sync_every-th step waits
    return Trainer(
        model=model,
        optimizer=opt,
        scheduler=build_scheduler(opt, sched),
        scaler=scaler,
        backend=backend,
        precision=precision,
        batches=iter(()),
        iterations=10**9,
        sync_every=sync_every,
    )


def reference_model(model):
    """A copy of ``model`` as torchvision's references train it: torchvision's per-image SSD loss
    (not the batched one) and the default NCHW memory format."""
    from torchvision.models.detection.ssd import SSD

    ref = copy.deepcopy(model)
    ref.__class__ = SSD
    return ref.to(memory_format=torch.contiguous_format)


class PlainAMP:
    """The torchvision-references training step: model(images, targets) -> sum -> GradScaler."""

    def __init__(
        self,
        model,
        backend,
        precision_name: str,
        init_scale: float = 65536.0,
        growth_interval: int = 2000,
        optimizer_options: dict | None = None,
    ):
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


def optimizer_kernels(device: str) -> str:
    """What the backend asks of SGD, in words (without building a CUDA backend on a CPU machine)."""
    return {"cuda": "fused SGD", "cpu": "foreach SGD"}.get(device, "torch's default SGD")


def sync() -> None:
    """Wait for the GPU where one is in use."""
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.synchronize()


def interleaved(steppers: dict, batches: list, steps: int, warmup: int, deadline: float, block: int = 1) -> dict:
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
            sync()
            t0 = time.perf_counter()
            for j in range(block):
                images, targets = batches[(k + j) % len(batches)]
                st.train_step(images, targets)
            sync()
            dt = (time.perf_counter() - t0) / block
            if i >= warmup:
                times[name].append(dt)
        k += block
        if i >= warmup:
            done += 1
    return times


def free_memory():
    """Collect garbage and return cached GPU memory (between sections and runs)."""
    import gc

    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def device_name(device: str) -> str:
    """The card's name, or the CPU with its thread and core counts."""
    if device == "cuda":
        return torch.cuda.get_device_name(0)
    return (
        f"cpu: {platform.processor() or platform.machine()}, {torch.get_num_threads()} torch threads, "
        f"{os.cpu_count()} cores"
    )
