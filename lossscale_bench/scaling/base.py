"""The one interface a training loop sees for every loss-scaling method: ``torch.amp.GradScaler``'s.

The loop calls ``scale(loss).backward()``, then ``step(optimizer)``, then
``update()``, and never asks which scaler it holds. A skipped step is reported in
``scaler.last_step`` (a :class:`StepResult`), so the loop can count and log it instead
of losing it; ``step`` itself returns what the optimizer's step returned, as GradScaler's.
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
    "DisabledLossScaler",
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


#: an optimizer's place in the current step (GradScaler's ``OptState``)
_UNSCALED, _STEPPED = "unscaled", "stepped"


class LossScaler(ABC):
    """Base of every method, with ``torch.amp.GradScaler``'s interface.

    A loop written for GradScaler runs unchanged: ``scale(outputs)`` (a tensor or an iterable of
    tensors), ``unscale_(optimizer)`` (at most once per optimizer and step), ``step(optimizer, *args,
    **kwargs)`` (the optimizer's return value, None when the step is skipped), ``update(new_scale=None)``,
    ``get_scale()``, ``is_enabled()``, ``state_dict()`` / ``load_state_dict()``; several optimizers
    may share one step. What GradScaler does not tell is here too: :attr:`last_step` (a
    :class:`StepResult`: skipped, overflow, scale), :meth:`metrics` and :meth:`layer_table` (per layer).
    A scaler is also a context manager whose exit calls :meth:`remove` (per-layer scalers patch the model).

    A method implements :meth:`scale_loss`, :meth:`current_scale` and, where its scale moves,
    :meth:`update_scale`; :meth:`unscale_grads` where its gradients carry more than one scale;
    :meth:`after_step` to react to a step's outcome.
    """

    #: short name used in metrics and labels
    method: str = "base"
    #: whether one step may unscale and step several optimizers (GradScaler allows it); a method whose
    #: per-step state is computed from all gradients at once says False and refuses a second optimizer
    several_optimizers: bool = True

    def __init__(self) -> None:
        self._unscaled = False
        self._found_inf: torch.Tensor | None = None
        self._last_overflow = False
        #: id(optimizer) -> its place in this step, and its non-finite flag once unscaled
        self._stages: dict[int, str] = {}
        self._founds: dict[int, torch.Tensor | None] = {}
        self._last_unscaled: int | None = None
        #: what happened to the last optimizer step (None before the first)
        self.last_step: StepResult | None = None

    # -- GradScaler's interface ------------------------------------------------------
    def is_enabled(self) -> bool:
        """True: a scaler made with ``enabled=False`` is a :class:`DisabledLossScaler`."""
        return True

    def get_scale(self) -> float:
        """The loss scale of the coming step, as a Python float (``GradScaler.get_scale``)."""
        return float(self.current_scale())

    def scale(self, outputs):
        """Multiply ``outputs`` (a tensor, or an iterable of tensors, nested as GradScaler allows) by the loss
        scale. A per-layer scaler takes one loss per backward (its scales follow that loss's graph): a list of
        several is refused (sum the losses first)."""
        if isinstance(outputs, torch.Tensor):
            return self.scale_loss(outputs)
        if not isinstance(outputs, Iterable):
            raise ValueError("outputs must be a Tensor or an iterable of Tensors")
        if not self.several_outputs:
            raise ValueError(
                f"the {self.method} scaler scales one loss per backward: pass one tensor (sum the losses first)"
            )
        scaled = map(self.scale, outputs)
        return type(outputs)(scaled) if isinstance(outputs, (list, tuple)) else scaled

    #: whether :meth:`scale` takes an iterable of several outputs (not the per-layer scalers: :meth:`scale`)
    several_outputs: bool = True

    def unscale_(self, optimizer: torch.optim.Optimizer) -> None:
        """Divide ``optimizer``'s gradients by the scale they carry and record whether any is non-finite.

        At most once per optimizer between two :meth:`update` calls, and not after :meth:`step`: both raise
        GradScaler's RuntimeError. :meth:`step` unscales the optimizers not unscaled yet."""
        key = id(optimizer)
        stage = self._stages.get(key)
        if stage == _UNSCALED:
            raise RuntimeError("unscale_() has already been called on this optimizer since the last update().")
        if stage == _STEPPED:
            raise RuntimeError("unscale_() is being called after step().")
        if self._stages and not self.several_optimizers:
            raise RuntimeError(
                f"the {self.method} scaler keeps one set of per-layer flags a step: it steps one optimizer a step"
            )
        self._unscaled = False
        self.unscale_grads(optimizer)
        self._stages[key] = _UNSCALED
        self._founds[key] = self._found_inf
        self._last_unscaled = key

    def step(self, optimizer: torch.optim.Optimizer, *args: Any, step_fn: Callable | None = None, **kwargs: Any):
        """Unscale ``optimizer`` if not done yet, then run ``optimizer.step(*args, **kwargs)`` unless a gradient
        overflowed (and the method skips on overflow). Returns what the optimizer's step returned, None when
        skipped; :attr:`last_step` says what happened. ``step_fn(optimizer)`` (keyword only, not passed to the
        optimizer) replaces ``optimizer.step`` (a backend's own step, ``xm.optimizer_step`` on XLA)."""
        if "closure" in kwargs:
            raise RuntimeError("Closure use is not currently supported if GradScaler is enabled.")
        key = id(optimizer)
        if self._stages.get(key) == _STEPPED:
            raise RuntimeError("step() has already been called since the last update().")
        if key not in self._stages:
            self.unscale_(optimizer)
        self._found_inf = self._founds.get(key)
        overflow = self.read_overflow()
        skip = overflow and self.skips_on_overflow
        out = None
        if not skip:
            out = step_fn(optimizer) if step_fn is not None else optimizer.step(*args, **kwargs)
        self.last_step = StepResult(skipped=skip, scale=float(self.current_scale()), overflow=overflow)
        self._last_overflow = self._last_overflow or overflow
        self._stages[key] = _STEPPED
        # the next unscale_ belongs to the next optimizer or iteration
        self._unscaled = False
        self._found_inf = None
        self.after_step(self.last_step)
        return out

    def update(self, new_scale: float | torch.Tensor | None = None) -> None:
        """Adjust the scale for the next step (after :meth:`step`); ``new_scale`` sets the loss scale instead
        (GradScaler's ``update(new_scale)``: the method's rule does not run; :meth:`set_scale`)."""
        if new_scale is None:
            self.update_scale()
        else:
            value = float(new_scale.item() if isinstance(new_scale, torch.Tensor) else new_scale)
            self.set_scale(value)
        self._stages.clear()
        self._founds.clear()
        self._last_unscaled = None

    # -- what a method implements ------------------------------------------------------
    def scale_loss(self, loss: torch.Tensor) -> torch.Tensor:
        """``loss`` multiplied by the current (global) scale (one tensor: :meth:`scale` handles iterables)."""
        s = self.current_scale()
        return loss * s if s != 1.0 else loss

    def unscale_grads(self, optimizer: torch.optim.Optimizer) -> None:
        """Unscale ``optimizer``'s gradients and leave this step's non-finite flag in ``_found_inf``
        (idempotent until the next :meth:`update`, through ``_unscaled``)."""
        if self._unscaled:
            return
        found = unscale_and_check(optimizer_grads(optimizer), 1.0 / self.current_scale())
        self._found_inf = all_reduce_flag(found)
        self._unscaled = True

    def update_scale(self) -> None:
        """The method's rule for the next step's scale (:meth:`update` calls it; a subclass calls super's last)."""
        self._unscaled = False
        self._found_inf = None
        self._last_overflow = False

    def set_scale(self, value: float) -> None:
        """``update(new_scale=value)``: the loss scale becomes ``value``. A method whose scale is not one
        settable number refuses."""
        raise TypeError(f"the {self.method} scaler has no loss scale to set: update(new_scale) is not supported")

    def after_step(self, result: StepResult) -> None:
        """Called at the end of every :meth:`step` with its outcome (``result.skipped``, ``result.overflow``):
        the hook a method's rule uses to learn that a step was skipped (:attr:`last_step` holds the same)."""

    @property
    def overflowed(self) -> bool:
        """Whether a step since the last :meth:`update` found a non-finite gradient (what the rules read)."""
        return self._last_overflow

    def read_overflow(self) -> bool:
        """Whether this step's gradients overflowed: the one host read of a step (a scaler with more to read
        brings it along here)."""
        return bool(self._found_inf.item()) if self._found_inf is not None else False

    def mark_overflow(self, flag: torch.Tensor | None) -> None:
        """Add a non-finite flag found after ``unscale_`` to this step's, for the optimizer unscaled last (a
        precision that rounds unscaled gradients may overflow them: ``Precision.unscale_grads``)."""
        if flag is None:
            return
        flag = all_reduce_flag(flag.float().reshape(()))
        found = self._founds.get(self._last_unscaled, self._found_inf)
        found = flag if found is None else torch.maximum(found.reshape(()), flag.to(found.device))
        self._found_inf = found
        if self._last_unscaled is not None:
            self._founds[self._last_unscaled] = found

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
        """What a resume needs to continue the scales exactly (the method's own keys: not GradScaler's)."""
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore what :meth:`state_dict` gave."""

    def remove(self) -> None:
        """Detach from the model; global methods hold nothing."""

    def __enter__(self) -> LossScaler:
        return self

    def __exit__(self, *exc: object) -> None:
        self.remove()


class DisabledLossScaler(LossScaler):
    """What ``enabled=False`` gives (GradScaler's disabled scaler): ``scale`` returns its input, ``step`` runs the
    optimizer's step, ``unscale_`` and ``update`` do nothing, ``get_scale()`` is 1.0, ``state_dict()`` empty;
    no gradient is checked and the model is not touched."""

    method = "disabled"

    def is_enabled(self) -> bool:
        return False

    def scale(self, outputs):
        return outputs

    def unscale_(self, optimizer: torch.optim.Optimizer) -> None:
        return None

    def step(self, optimizer: torch.optim.Optimizer, *args: Any, step_fn: Callable | None = None, **kwargs: Any):
        out = step_fn(optimizer) if step_fn is not None else optimizer.step(*args, **kwargs)
        self.last_step = StepResult(skipped=False, scale=1.0, overflow=False)
        return out

    def update(self, new_scale: float | torch.Tensor | None = None) -> None:
        return None

    def current_scale(self) -> float:
        return 1.0
