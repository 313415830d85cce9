"""Saturation-aware dynamic loss scaling: back off when too many gradient elements sit at the
format's maximum, grow after ``interval`` clean steps (FP8-LM's automatic scaling, MS-AMP).

Why a scaler of its own: an overflow-driven scaler (GradScaler, DeepSpeed, fairscale's
layer-wise one) waits for a non-finite gradient, and a saturating format never produces one:
torch's E4M3 cast and Transformer Engine's casts clip to +-448. Under E4M3 gradients such a
scaler keeps its large initial scale and trains on clipped gradients. This one watches the
share of parameter-gradient elements at or past the gradient format's maximum, measured while
they still carry the loss scale (the domain the cast saw), and halves the scale when that
share passes ``threshold`` (FP8-LM: 0.001 %); a non-finite gradient also backs off and skips
the step, as with GradScaler. The count is one fused pass per step over the gradients and is
read on the host with the overflow flag.
"""

from __future__ import annotations

from typing import Any

import torch

from ..numerics.census import census
from ..numerics.layout import memory_order_flat
from ..precision.formats import FP16, FloatFormat
from .base import LossScaler, optimizer_grads

__all__ = ["SaturationLossScaler", "saturation_counts"]


class SaturationLossScaler(LossScaler):
    method = "saturation"

    def __init__(
        self,
        init_scale: float = 1.0,
        interval: int = 1000,
        threshold: float = 1e-5,
        growth_factor: float = 2.0,
        backoff_factor: float = 0.5,
        min_scale: float | None = None,
        max_scale: float | None = None,
        *,
        grad_format: FloatFormat = FP16,
    ) -> None:
        super().__init__()
        if not init_scale > 0:
            raise ValueError(f"init_scale must be > 0, got {init_scale}")
        if int(interval) != interval or interval < 1:
            raise ValueError(f"interval must be a positive integer, got {interval}")
        if not 0 <= threshold < 1:
            raise ValueError(f"threshold must be in [0, 1), got {threshold}")
        if not growth_factor > 1.0 or not 0.0 < backoff_factor < 1.0:
            raise ValueError("growth_factor must be > 1 and backoff_factor in (0, 1)")
        self._scale = float(init_scale)
        self.interval = int(interval)
        self.threshold = float(threshold)
        self.growth_factor = float(growth_factor)
        self.backoff_factor = float(backoff_factor)
        self.min_scale = 0.0 if min_scale is None else float(min_scale)
        self.max_scale = float("inf") if max_scale is None else float(max_scale)
        self.grad_format = grad_format
        self._growth_tracker = 0
        self._counts: torch.Tensor | None = None  # [saturated, total] of this step, on the device
        self.last_share = 0.0

    def scale_loss(self, loss: torch.Tensor) -> torch.Tensor:
        return loss * self._scale

    def current_scale(self) -> float:
        return self._scale

    def unscale_grads(self, optimizer: torch.optim.Optimizer) -> None:
        if not self._unscaled:  # several optimizers in a step: their counts add up
            counts = saturation_counts(optimizer_grads(optimizer), self.grad_format.max)
            self._counts = counts if self._counts is None else self._counts + counts.to(self._counts.device)
        super().unscale_grads(optimizer)

    def update_scale(self) -> None:
        counts = self._counts.tolist() if self._counts is not None else [0, 0]
        self.last_share = counts[0] / counts[1] if counts[1] else 0.0
        if self.overflowed or self.last_share > self.threshold:
            self._scale *= self.backoff_factor
            self._growth_tracker = 0
        else:
            self._growth_tracker += 1
            if self._growth_tracker >= self.interval:
                self._scale *= self.growth_factor
                self._growth_tracker = 0
        self._scale = min(max(self._scale, self.min_scale), self.max_scale)
        self._counts = None
        super().update_scale()

    def set_scale(self, value: float) -> None:
        """``update(new_scale=value)``: the scale becomes ``value``; the growth tracker is kept."""
        self._scale = float(value)
        self._counts = None
        LossScaler.update_scale(self)

    def metrics(self) -> dict[str, float]:
        return {**super().metrics(), "saturated_share": float(self.last_share)}

    def state_dict(self) -> dict[str, Any]:
        return {"scale": self._scale, "growth_tracker": self._growth_tracker, "last_share": self.last_share}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._scale = float(state["scale"])
        self._growth_tracker = int(state["growth_tracker"])
        self.last_share = float(state.get("last_share", 0.0))


@torch.no_grad()
def saturation_counts(grads: list[torch.Tensor], limit: float) -> torch.Tensor:
    """``[elements with |g| >= limit or non-finite, all elements]`` of ``grads``, as one device tensor.

    fp32 gradients are counted by the telemetry's census kernel (:mod:`lossscale_bench.numerics.census`:
    one C loop over the gradients concatenated on the CPU), whose "past the maximum" count is ``!(|g| <= edge)``: with ``edge``
    the fp32 value just below ``limit`` that is exactly ``|g| >= limit`` or NaN, as below. Four eager ops
    per parameter cost ~3 ms a step on ssd_tiny's 48 (cProfile). Other dtypes keep the eager
    expression: a Python scalar compared with an fp16 tensor is rounded to fp16, and ``edge`` with it."""
    if not grads:
        return torch.zeros(2)
    edge = torch.nextafter(torch.tensor(float(limit)), torch.tensor(0.0)).item()  # fp32's, not float64's
    # the fp32 gradients of a device in one census call (a count does not care which tensor an element is
    # in; a call per parameter cost ~30 us each, 48 on ssd_tiny), each read in memory order
    by_device: dict[torch.device, list[torch.Tensor]] = {}
    parts = []
    for g in grads:
        if g.dtype == torch.float32:
            by_device.setdefault(g.device, []).append(memory_order_flat(g)[0])
        else:
            parts.append((~(g.abs() < limit)).sum())
    for flats in by_device.values():
        parts.append(census(flats[0] if len(flats) == 1 else torch.cat(flats), 0.0, 0.0, edge)[3])
    sat = torch.stack(parts).sum()
    total = sum(g.numel() for g in grads)
    return torch.stack([sat.double(), torch.tensor(float(total), dtype=torch.float64, device=sat.device)])
