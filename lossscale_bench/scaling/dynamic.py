"""Dynamic loss scaling in two styles (ADAPTIVE.md, "Other methods").

``torch``: the decisions of ``torch.amp.GradScaler`` (start 65536, x0.5 and
skip on overflow, x2 after ``growth_interval`` clean steps in a row); tested
step for step against GradScaler itself.

``chainer``: the seed study's ``--dynamic-interval 10``: start at 1, skip and
halve on overflow, double every step until the first overflow, then grow by
``2 ** (1 / interval)`` per clean step, clamped to ``[min_scale, max_scale]``.
"""

from __future__ import annotations

from typing import Any

import torch

from .base import LossScaler


class DynamicLossScaler(LossScaler):
    method = "dynamic"

    def __init__(self, style: str = "chainer", init_scale: float | None = None, interval: int | None = None,
                 growth_factor: float = 2.0, backoff_factor: float = 0.5,
                 min_scale: float | None = None, max_scale: float | None = None) -> None:
        super().__init__()
        if style not in ("chainer", "torch"):
            raise ValueError(f"dynamic style must be 'chainer' or 'torch', got {style!r}")
        self.style = style
        if style == "torch":
            self._scale = float(65536.0 if init_scale is None else init_scale)
            self.interval = int(2000 if interval is None else interval)
            self.min_scale = 0.0 if min_scale is None else float(min_scale)
            self.max_scale = float("inf") if max_scale is None else float(max_scale)
        else:
            self._scale = float(1.0 if init_scale is None else init_scale)
            self.interval = int(10 if interval is None else interval)
            self.min_scale = 1.0 if min_scale is None else float(min_scale)
            self.max_scale = 65504.0 if max_scale is None else float(max_scale)
        if self.interval < 1:
            raise ValueError(f"dynamic interval must be >= 1, got {self.interval}")
        self.growth_factor = float(growth_factor)
        self.backoff_factor = float(backoff_factor)
        self._growth_tracker = 0
        self._seen_overflow = False
        self._last_overflow = False
        # GradScaler keeps its scale as a float32 tensor; do the same so the
        # torch style takes bit-identical decisions.
        self._dtype = torch.float32

    def scale(self, loss: torch.Tensor) -> torch.Tensor:
        return loss * self._scale

    def current_scale(self) -> float:
        return self._scale

    def update(self) -> None:
        overflow = bool(self._last_overflow)
        if self.style == "torch":
            s = torch.tensor(self._scale, dtype=self._dtype)
            if overflow:
                s = s * self.backoff_factor
                self._growth_tracker = 0
            else:
                self._growth_tracker += 1
                if self._growth_tracker == self.interval:
                    s = s * self.growth_factor
                    self._growth_tracker = 0
            self._scale = float(s)
        else:
            if overflow:
                self._scale *= self.backoff_factor
                self._seen_overflow = True
            elif not self._seen_overflow:
                self._scale *= self.growth_factor
            else:
                self._scale *= self.growth_factor ** (1.0 / self.interval)
        self._scale = min(max(self._scale, self.min_scale), self.max_scale)
        self._last_overflow = False
        super().update()

    def state_dict(self) -> dict[str, Any]:
        return {"style": self.style, "scale": self._scale, "growth_tracker": self._growth_tracker,
                "seen_overflow": self._seen_overflow, "interval": self.interval}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._scale = float(state["scale"])
        self._growth_tracker = int(state["growth_tracker"])
        self._seen_overflow = bool(state["seen_overflow"])
