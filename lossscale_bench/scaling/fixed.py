"""Fixed loss scaling and no scaling at all.

``fixed`` with ``scale: 1`` is the published "no loss scale" row: gradients
are checked, and a step with a non-finite gradient is skipped (and counted)
unless ``skip_nonfinite: false``. ``none`` is plain training: no scale and no
skipping, so non-finite gradients reach the weights (the FP32 baseline).
"""

from __future__ import annotations

from typing import Any

import torch

from .base import LossScaler

__all__ = ["FixedLossScaler", "NoLossScaler"]


class FixedLossScaler(LossScaler):
    method = "fixed"

    def __init__(self, scale: float = 1.0, skip_nonfinite: bool = True) -> None:
        super().__init__()
        if not scale > 0:
            raise ValueError(f"fixed loss scale must be > 0, got {scale}")
        self._scale = float(scale)
        self.skips_on_overflow = bool(skip_nonfinite)

    def scale_loss(self, loss: torch.Tensor) -> torch.Tensor:
        return loss * self._scale if self._scale != 1.0 else loss

    def current_scale(self) -> float:
        return self._scale

    def set_scale(self, value: float) -> None:
        """``update(new_scale=value)``: the fixed scale becomes ``value``."""
        if not value > 0:
            raise ValueError(f"fixed loss scale must be > 0, got {value}")
        self._scale = float(value)
        self.update_scale()

    def state_dict(self) -> dict[str, Any]:
        return {"scale": self._scale}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._scale = float(state["scale"])


class NoLossScaler(FixedLossScaler):
    """No scaling and no skipping: what plain fp32 training does."""

    method = "none"

    def __init__(self) -> None:
        super().__init__(scale=1.0, skip_nonfinite=False)

    def set_scale(self, value: float) -> None:
        """Refused: ``none`` never scales."""
        LossScaler.set_scale(self, value)
