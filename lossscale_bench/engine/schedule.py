"""Learning-rate schedule and optimizer of the published recipes: warmup, step decay, momentum SGD.

Each option exists because a published study's code does it that way (the study files cite them):

* ``warmup_mode: linear`` (default): the factor ramps from ``warmup_factor`` to 1 over
  ``warmup_iterations``; ``warmup_factor: 0`` is NVIDIA's / MLPerf's SSD warm-up
  (``lr = base_lr * iteration / warmup_iters``, DeepLearningExamples ``ssd/train.py:warmup``).
* ``warmup_mode: constant``: the factor *stays* at ``warmup_factor`` for ``warmup_iterations``
  steps, then jumps to 1: the authors' chainer SSD script (kumasento/gradient-scaling
  ``examples/adaptive_loss_scaling/ssd/train_multi.py``: for batch != 32,
  ``chainerlp.extensions.ExponentialShift(init=lr * 0.1, warmup_n_epoch=1000)``, which holds
  1e-4 for updates 1..1000 and sets 1e-3 after the 1000th).
* ``weight_decay_exclude``: parameters without weight decay. ``bias``: parameters named
  ``*.bias`` (chainercv / the authors' script: ``WeightDecay`` on every parameter except those
  named ``b``, so the L2Norm scale *is* decayed); ``1d``: every 1-D parameter (BatchNorm and
  L2Norm scales, biases): NVIDIA's ``tencent_trick`` (``len(param.shape) == 1 or
  name.endswith(".bias")``). Both together give NVIDIA's groups.

* ``momentum_style: chainer``: Chainer's ``MomentumSGD`` update (``v <- momentum * v - lr *
  grad; param <- param + v``, with ``WeightDecay``'s ``grad += rate * param`` first), which the
  chainer SSD scripts use. PyTorch's SGD (``buf <- momentum * buf + grad; param -= lr * buf``,
  the default ``torch``) takes the same steps at constant lr, but when lr changes (the 1e-4 ->
  1e-3 jump after the warm-up, the decays) it rescales the whole accumulated momentum at once,
  where Chainer's velocity keeps the old lr's steps and moves to the new lr over ~1/(1 - momentum)
  iterations.

Bias gradients x2 (chainercv's ``GradientScaling(2)``) is ``bias_grad_factor``, applied by
the training loop to unscaled gradients (``engine.loop.Trainer``).
"""

from __future__ import annotations

import bisect

import torch

#: warm-up shapes (the schema's ``schedule.warmup_mode``)
WARMUP_MODES = ("linear", "constant")
#: parameter classes that ``schedule.weight_decay_exclude`` may name
WEIGHT_DECAY_EXCLUDES = ("bias", "1d")


def lr_lambda(
    warmup_iterations: int, warmup_factor: float, lr_steps: list[int], lr_gamma: float, warmup_mode: str = "linear"
):
    """Multiplier of the base lr at iteration ``it`` (0-based, the step about to run)."""
    if warmup_mode not in WARMUP_MODES:
        raise ValueError(f"unknown warmup_mode {warmup_mode!r}; allowed: {', '.join(WARMUP_MODES)}")
    steps = sorted(lr_steps)

    def f(it: int) -> float:
        decay = lr_gamma ** bisect.bisect_right(steps, it)
        if warmup_iterations and it < warmup_iterations:
            if warmup_mode == "constant":
                return decay * warmup_factor
            alpha = it / warmup_iterations
            return decay * (warmup_factor * (1 - alpha) + alpha)
        return decay

    return f


def build_scheduler(optimizer: torch.optim.Optimizer, schedule: dict) -> torch.optim.lr_scheduler.LambdaLR:
    return torch.optim.lr_scheduler.LambdaLR(
        optimizer,
        lr_lambda(
            int(schedule.get("warmup_iterations", 0)),
            float(schedule.get("warmup_factor", 0.1)),
            list(schedule.get("lr_steps", [])),
            float(schedule.get("lr_gamma", 0.1)),
            str(schedule.get("warmup_mode", "linear")),
        ),
    )


def _excluded(name: str, p: torch.Tensor, exclude: tuple[str, ...]) -> bool:
    return ("bias" in exclude and name.endswith(".bias")) or ("1d" in exclude and p.dim() == 1)


def param_groups(model: torch.nn.Module, weight_decay: float, exclude=()) -> list[dict]:
    """Trainable parameters in (at most) two groups: decayed, and those ``exclude`` names (decay 0)."""
    exclude = tuple(exclude or ())
    bad = [e for e in exclude if e not in WEIGHT_DECAY_EXCLUDES]
    if bad:
        raise ValueError(f"unknown weight_decay_exclude {bad[0]!r}; allowed: {', '.join(WEIGHT_DECAY_EXCLUDES)}")
    decay, no_decay = [], []
    for name, p in model.named_parameters():
        if p.requires_grad:
            (no_decay if _excluded(name, p, exclude) else decay).append(p)
    groups = [{"params": decay, "weight_decay": float(weight_decay)}, {"params": no_decay, "weight_decay": 0.0}]
    return [g for g in groups if g["params"]] or [groups[0]]


class ChainerMomentumSGD(torch.optim.Optimizer):
    """``chainer.optimizers.MomentumSGD`` with ``WeightDecay`` (module doc): per parameter,
    ``v <- momentum * v - lr * (grad + weight_decay * param)``, ``param <- param + v``; ``v``
    starts at zero (Chainer's ``MomentumSGDRule.init_state``)."""

    def __init__(self, params, lr: float, momentum: float = 0.9, weight_decay: float = 0.0) -> None:
        super().__init__(params, {"lr": lr, "momentum": momentum, "weight_decay": weight_decay})

    @torch.no_grad()
    def step(self, closure=None):  # type: ignore[override]
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            lr, mom, wd = group["lr"], group["momentum"], group["weight_decay"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                d = p.grad if wd == 0 else p.grad.add(p, alpha=wd)
                state = self.state[p]
                if "velocity" not in state:
                    state["velocity"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                v = state["velocity"]
                v.mul_(mom).add_(d, alpha=-lr)
                p.add_(v)
        return loss


MOMENTUM_STYLES = ("torch", "chainer")


def build_optimizer(model: torch.nn.Module, schedule: dict, impl: dict | None = None) -> torch.optim.Optimizer:
    """Momentum SGD with weight decay over trainable parameters (the published studies' recipe).

    Without ``weight_decay_exclude`` there is one group, as before (checkpoints of earlier
    trials load unchanged). ``impl``: the backend's ``optimizer_options()`` (``foreach``/``fused``
    kernels for torch's SGD; the same update, and on CPU bit for bit); Chainer-style momentum
    has its own step and ignores it.
    """
    wd = float(schedule.get("weight_decay", 5e-4))
    groups = param_groups(model, wd, schedule.get("weight_decay_exclude") or ())
    style = schedule.get("momentum_style", "torch")
    if style not in MOMENTUM_STYLES:
        raise ValueError(f"unknown momentum_style {style!r}; allowed: {', '.join(MOMENTUM_STYLES)}")
    cls = ChainerMomentumSGD if style == "chainer" else torch.optim.SGD
    extra = dict(impl or {}) if cls is torch.optim.SGD else {}
    return cls(
        groups, lr=float(schedule["lr"]), momentum=float(schedule.get("momentum", 0.9)), weight_decay=wd, **extra
    )
