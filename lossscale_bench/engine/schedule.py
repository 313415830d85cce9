"""Learning-rate schedule of the seed recipes: linear warmup, then step decay."""

from __future__ import annotations

import bisect

import torch


def lr_lambda(warmup_iterations: int, warmup_factor: float, lr_steps: list[int], lr_gamma: float):
    """Multiplier of the base lr at iteration ``it`` (0-based, the step about to run)."""
    steps = sorted(lr_steps)

    def f(it: int) -> float:
        decay = lr_gamma ** bisect.bisect_right(steps, it)
        if warmup_iterations and it < warmup_iterations:
            alpha = it / warmup_iterations
            return decay * (warmup_factor * (1 - alpha) + alpha)
        return decay

    return f


def build_scheduler(optimizer: torch.optim.Optimizer, schedule: dict) -> torch.optim.lr_scheduler.LambdaLR:
    return torch.optim.lr_scheduler.LambdaLR(
        optimizer, lr_lambda(int(schedule.get("warmup_iterations", 0)), float(schedule.get("warmup_factor", 0.1)),
                             list(schedule.get("lr_steps", [])), float(schedule.get("lr_gamma", 0.1))))


def build_optimizer(model: torch.nn.Module, schedule: dict) -> torch.optim.Optimizer:
    """Momentum SGD with weight decay over trainable parameters (the seeds' recipe)."""
    params = [p for p in model.parameters() if p.requires_grad]
    return torch.optim.SGD(params, lr=float(schedule["lr"]), momentum=float(schedule.get("momentum", 0.9)),
                           weight_decay=float(schedule.get("weight_decay", 5e-4)))
