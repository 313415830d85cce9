"""One training step, and the loop that repeats it.

A step is: autocast forward -> ``scaler.scale(loss).backward()`` -> backend
hook -> optional unscale for clipping -> ``scaler.step`` (backend's optimizer
step) -> ``scaler.update`` -> lr schedule. The loop knows no scaler type, no
device type and no tracking system: those live behind ``LossScaler``,
``Backend`` and the hooks.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Any, Iterable, Iterator

import torch

from ..backends.base import Backend
from ..precision import Precision
from ..scaling.base import LossScaler, StepResult


@dataclass
class StepRecord:
    step: int                      # iterations completed after this one (1-based)
    loss: float                    # unscaled total loss (may be nan/inf)
    parts: dict[str, float]
    result: StepResult
    lr: float
    images_per_sec: float
    seconds: float


@dataclass
class TrainState:
    step: int = 0
    skipped_steps: int = 0
    overflow_steps: int = 0
    images_seen: int = 0
    extra: dict[str, Any] = field(default_factory=dict)


class StopTraining(Exception):
    """Raised by a hook to end the loop early (reason in ``args``)."""


class Trainer:
    def __init__(self, *, model: torch.nn.Module, optimizer: torch.optim.Optimizer, scheduler, scaler: LossScaler,
                 backend: Backend, precision: Precision, batches: Iterable, iterations: int, hooks=(),
                 grad_clip: float | None = None, bias_grad_factor: float = 1.0, state: TrainState | None = None,
                 grad_sync=None):
        self.model = model
        self.optimizer = optimizer
        self.scheduler = scheduler
        self.scaler = scaler
        self.backend = backend
        self.precision = precision
        self.batches: Iterator = iter(batches)
        self.iterations = int(iterations)
        self.hooks = list(hooks)
        self.grad_clip = grad_clip
        self.bias_grad_factor = float(bias_grad_factor)
        self.state = state or TrainState()
        # Data parallelism without DDP: every replica unscales its own gradients (each
        # scaler knows the scales its gradients carry, per layer for adaptive), then
        # ``grad_sync(params)`` averages the true gradients across replicas, and
        # ``grad_sync.mean(t)`` (if it has one) the step's loss values, so that every replica
        # logs the same loss and takes the same divergence decisions. The object comes from
        # the launcher (``distributed.GradSync``); the loop knows only this interface.
        self.grad_sync = grad_sync
        self._bias_params = [p for n, p in model.named_parameters() if n.endswith(".bias") and p.requires_grad]

    # -- one step ---------------------------------------------------------------
    def train_step(self, images: list[torch.Tensor], targets: list[dict]) -> StepRecord:
        t0 = time.perf_counter()
        images, targets = self.backend.to_device(images, targets)
        self.model.train()
        self.optimizer.zero_grad(set_to_none=True)
        with self.backend.autocast(self.precision.autocast_dtype):
            parts = self.model(images, targets)
            loss = sum(parts.values())
        self.scaler.scale(loss.float()).backward()
        self.backend.after_backward()
        if self.grad_clip or self.bias_grad_factor != 1.0 or self.grad_sync is not None \
                or self.precision.rounds_after_unscale:
            # These act on true gradient values, so unscale first (idempotent in step()).
            self.scaler.unscale_(self.optimizer)
            if self.precision.rounds_after_unscale:  # Chainer's order: unscale, then store in fp16
                self.scaler.mark_overflow(self.precision.round_unscaled_grads(
                    [p for g in self.optimizer.param_groups for p in g["params"]]))
            if self.grad_sync is not None:
                self.grad_sync([p for g in self.optimizer.param_groups for p in g["params"]])
            if self.bias_grad_factor != 1.0:
                for p in self._bias_params:
                    if p.grad is not None:
                        p.grad.mul_(self.bias_grad_factor)
            if self.grad_clip:
                torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.grad_clip)
        lr = self.optimizer.param_groups[0]["lr"]
        result = self.scaler.step(self.optimizer, step_fn=self.backend.optimizer_step)
        self.scaler.update()
        self.scheduler.step()
        self.backend.after_step()
        self.backend.synchronize()
        seconds = time.perf_counter() - t0
        vals = torch.stack([loss.detach().float()] + [v.detach().float() for v in parts.values()])
        if self.grad_sync is not None and hasattr(self.grad_sync, "mean"):
            # replicas log the mean loss and take the same divergence decisions
            vals = self.grad_sync.mean(vals)
        loss_value, *part_values = vals.tolist()
        st = self.state
        st.step += 1
        st.images_seen += len(images)
        st.skipped_steps += int(result.skipped)
        st.overflow_steps += int(result.overflow)
        return StepRecord(step=st.step, loss=loss_value,
                          parts=dict(zip(parts, part_values)), result=result, lr=lr,
                          images_per_sec=len(images) / seconds if seconds > 0 else math.inf, seconds=seconds)

    # -- the loop ---------------------------------------------------------------
    def run(self) -> TrainState:
        for h in self.hooks:
            h.before_train(self)
        reason = None
        try:
            while self.state.step < self.iterations:
                _, images, targets = next(self.batches)
                for h in self.hooks:
                    h.before_step(self, self.state.step + 1)
                record = self.train_step(images, targets)
                for h in self.hooks:
                    h.after_step(self, record)
        except StopTraining as stop:
            reason = stop
        for h in self.hooks:
            h.after_train(self)
        if reason is not None:
            raise reason
        return self.state
