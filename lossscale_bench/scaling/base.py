"""The one interface the training loop sees for every loss-scaling method.

The loop calls ``scale(loss).backward()``, then ``step(optimizer)``, then
``update()``, and never asks which scaler it holds (as with
``torch.amp.GradScaler``). A skipped step is reported in the returned
``StepResult``, so the loop can count and log it instead of losing it.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import torch

from ..core.host_path import host_shortcuts
from .host_fp32 import recip

__all__ = [
    "all_reduce_flag",
    "distributed",
    "LossScaler",
    "optimizer_grads",
    "StepResult",
    "unscale_and_check",
    "unscale_group_",
    "unscale_groups_",
]


@dataclass(frozen=True)
class StepResult:
    """What happened to one optimizer step.

    ``scale`` is the loss scale the step's gradients carried (for layer-wise
    methods: the scale at the loss, i.e. ``init_scale``); ``overflow`` says a
    non-finite gradient was found; ``skipped`` says the optimizer did not run.
    """

    skipped: bool
    scale: float
    overflow: bool


def optimizer_grads(optimizer: torch.optim.Optimizer) -> list[torch.Tensor]:
    """The gradients of ``optimizer``'s parameters that have one."""
    return [p.grad for group in optimizer.param_groups for p in group["params"] if p.grad is not None]


def unscale_group_(grads: list, scale, found: torch.Tensor) -> None:
    """Divide ``grads`` (one device and dtype) by ``scale`` in place and add to ``found`` when any
    is non-finite, with the fused kernel GradScaler uses; ``scale`` None means 1. A scale whose
    reciprocal is not finite counts as an overflow too. Shared by the per-layer scalers, whose
    gradients come in groups that carry one scale each."""
    device = found.device
    if scale is None:
        inv = torch.ones(1, dtype=torch.float32, device=device)
    elif host_shortcuts() and device.type == "cpu" and scale.device.type == "cpu" and scale.dtype == torch.float32:
        # the same fp32 reciprocal and flag on the host: 2 dispatches instead of 6 per group
        v = recip(scale.item())
        if not math.isfinite(v):
            found.add_(1.0)
        inv = torch.full((1,), v, dtype=torch.float32)
    else:
        inv = torch.reciprocal(scale.to(device=device, dtype=torch.float32)).reshape(1)
        found.add_((~torch.isfinite(inv)).to(torch.float32))
    torch._amp_foreach_non_finite_check_and_unscale_(grads, found, inv)


def unscale_groups_(groups: list[tuple[torch.Tensor | None, list]], founds: list[torch.Tensor]) -> None:
    """:func:`unscale_group_` for several groups at once: group ``k`` is ``(scale, grads)`` and flags ``founds[k]``
    (groups may share a flag). Off the CPU's host shortcuts, the scales of one device are inverted together (one
    reciprocal, one finiteness check per flag) and each group costs one fused kernel, instead of ~10 operations
    on 0-d tensors a group; the values and flags are the same."""
    if not groups:
        return
    if host_shortcuts() and all(f.device.type == "cpu" for f in founds):
        for (scale, grads), found in zip(groups, founds):
            unscale_group_(grads, scale, found)
        return
    by_device: dict[torch.device, list[int]] = {}
    for k, found in enumerate(founds):
        by_device.setdefault(found.device, []).append(k)
    for device, ks in by_device.items():
        scaled = [k for k in ks if groups[k][0] is not None]
        inv: dict[int, torch.Tensor] = {}
        if scaled:
            vals = [groups[k][0].to(device=device, dtype=torch.float32) for k in scaled]
            recips = torch.reciprocal(torch.stack([v if v.dim() == 0 else v.reshape(()) for v in vals]))
            bad = (~torch.isfinite(recips)).to(torch.float32)
            flagged: dict[int, tuple[torch.Tensor, list[int]]] = {}
            for i, k in enumerate(scaled):
                flagged.setdefault(id(founds[k]), (founds[k], []))[1].append(i)
            for found, rows in flagged.values():  # a flag of its own takes its row, a shared one the rows' max
                if len(rows) == 1:
                    found.add_(bad[rows[0]])
                else:  # all rows (the per-layer scalers' one flag a device): no gather
                    found.add_(bad.amax() if len(rows) == len(scaled) else bad[rows].amax())
            inv = dict(zip(scaled, recips.reshape(-1, 1).unbind(0)))
        one = None
        for k in ks:
            if k not in inv:
                one = torch.ones(1, dtype=torch.float32, device=device) if one is None else one
            torch._amp_foreach_non_finite_check_and_unscale_(groups[k][1], founds[k], inv.get(k, one))


def distributed() -> bool:
    """True when torch.distributed is initialised with more than one worker (flags are then all-reduced)."""
    import torch.distributed as dist

    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


def all_reduce_flag(flag: torch.Tensor) -> torch.Tensor:
    """Agree on an overflow flag across data-parallel workers (max-reduce).

    Replicas that decided differently would drift apart: one would step while
    another skipped. A no-op when torch.distributed is not initialised.
    """
    import torch.distributed as dist

    if distributed():
        dist.all_reduce(flag, op=dist.ReduceOp.MAX)
    return flag


def unscale_and_check(grads: Iterable[torch.Tensor], inv_scale: float | torch.Tensor) -> torch.Tensor:
    """Multiply ``grads`` in place by ``inv_scale``; return a 0-d float flag, 1.0 if any is non-finite.

    One fused kernel per device and dtype (the same one GradScaler uses), so
    there is a single host synchronisation per step, when the flag is read.
    """
    grads = list(grads)
    if not grads:
        return torch.zeros(())
    by_key: dict[tuple, list[torch.Tensor]] = {}
    for g in grads:
        by_key.setdefault((g.device, g.dtype), []).append(g)
    flags = []
    for (device, _), group in by_key.items():
        found = torch.zeros(1, device=device, dtype=torch.float32)
        inv = torch.as_tensor(inv_scale, device=device, dtype=torch.float32).reshape(1)
        torch._amp_foreach_non_finite_check_and_unscale_(group, found, inv)
        flags.append(found.to(grads[0].device))
    return torch.stack(flags).max()


class LossScaler(ABC):
    """Base of every method: fixed, dynamic, adaptive, none."""

    #: short name used in metrics and labels
    method: str = "base"

    def __init__(self) -> None:
        self._unscaled = False
        self._found_inf: torch.Tensor | None = None

    # -- the loop's interface ------------------------------------------------
    @abstractmethod
    def scale(self, loss: torch.Tensor) -> torch.Tensor:
        """Return the loss multiplied by the current (global) scale."""

    def unscale_(self, optimizer: torch.optim.Optimizer) -> None:
        """Divide gradients by the scale they carry and record overflow (idempotent per step)."""
        if self._unscaled:
            return
        found = unscale_and_check(optimizer_grads(optimizer), 1.0 / self.current_scale())
        self._found_inf = all_reduce_flag(found)
        self._unscaled = True

    def step(
        self, optimizer: torch.optim.Optimizer, step_fn: Callable[[torch.optim.Optimizer], Any] | None = None
    ) -> StepResult:
        """Unscale if not done yet, then run ``step_fn(optimizer)`` unless a gradient overflowed.

        ``step_fn`` lets a backend substitute its own optimizer step
        (``xm.optimizer_step`` on XLA) without the scaler knowing about it.
        """
        self.unscale_(optimizer)
        overflow = self.read_overflow()
        skip = overflow and self.skips_on_overflow
        if not skip:
            (step_fn or (lambda opt: opt.step()))(optimizer)
        result = StepResult(skipped=skip, scale=float(self.current_scale()), overflow=overflow)
        self._last_overflow = overflow
        # The next unscale_ belongs to the next iteration's gradients.
        self._unscaled = False
        self._found_inf = None
        return result

    def read_overflow(self) -> bool:
        """Whether this step's gradients overflowed: the one host read of a step (a scaler with more to read
        brings it along here)."""
        return bool(self._found_inf.item()) if self._found_inf is not None else False

    def mark_overflow(self, flag: torch.Tensor | None) -> None:
        """Add a non-finite flag found after ``unscale_`` to this step's (a precision that rounds
        unscaled gradients may overflow them: ``Precision.round_unscaled_grads``)."""
        if flag is None:
            return
        flag = all_reduce_flag(flag.float().reshape(()))
        self._found_inf = (
            flag
            if self._found_inf is None
            else torch.maximum(self._found_inf.reshape(()), flag.to(self._found_inf.device))
        )

    def update(self) -> None:
        """Adjust the scale for the next step (after ``step``)."""
        self._unscaled = False
        self._found_inf = None

    # -- introspection -------------------------------------------------------
    #: whether a step with non-finite gradients is skipped
    skips_on_overflow: bool = True

    @abstractmethod
    def current_scale(self) -> float:
        """The global loss scale for the coming (or current) step."""

    def metrics(self) -> dict[str, float]:
        """Scalar metrics to log each step (``loss_scale`` at least)."""
        return {"loss_scale": float(self.current_scale())}

    def layer_table(self) -> list[dict[str, Any]]:
        """Per-layer state for the telemetry artifact; empty for global methods."""
        return []

    def state_dict(self) -> dict[str, Any]:
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        pass

    def remove(self) -> None:
        """Detach from the model; global methods hold nothing."""
