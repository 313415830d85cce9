"""Dynamic loss scaling in three styles (ADAPTIVE.md, "Other methods").

``torch``: the decisions of ``torch.amp.GradScaler`` (start 65536, x0.5 and
skip on overflow, x2 after ``growth_interval`` clean steps in a row); tested
step for step against GradScaler itself.

``chainer``: the published study's ``--dynamic-interval 10``: start at 1, skip and
halve on overflow, double every step until the first overflow, then grow by
``2 ** (1 / interval)`` per clean step, clamped to ``[min_scale, max_scale]``.

``deepspeed``: DeepSpeed's ``DynamicLossScaler.update_scale``
(``deepspeed/runtime/fp16/loss_scaler.py``) with its engine defaults (start
``2**initial_scale_power`` = 65536, ``loss_scale_window`` 1000, ``hysteresis`` 2,
``min_loss_scale`` 1, ``consecutive_hysteresis`` false). An overflow always skips
the step; it lowers the scale only once ``hysteresis`` overflows have been
tolerated (the counter is refilled when the scale grows, or on every clean
step with ``consecutive_hysteresis``); growth counts from the last overflow,
with DeepSpeed's off-by-one (``(iter - last_overflow_iter) - 1`` clean steps,
a multiple of the window). One deliberate difference: DeepSpeed raises an
exception when it must lower a scale already at ``min_scale``; here the scale
stays there and the step is skipped, so the divergence rule
(``divergence.max_consecutive_skips``) ends such a trial and the report says so.
"""

from __future__ import annotations

from typing import Any

import torch

from .base import LossScaler

__all__ = ["DynamicLossScaler"]


class DynamicLossScaler(LossScaler):
    method = "dynamic"

    def __init__(
        self,
        style: str = "chainer",
        init_scale: float | None = None,
        interval: int | None = None,
        growth_factor: float = 2.0,
        backoff_factor: float = 0.5,
        min_scale: float | None = None,
        max_scale: float | None = None,
        hysteresis: int | None = None,
        consecutive_hysteresis: bool = False,
    ) -> None:
        super().__init__()
        if style not in ("chainer", "torch", "deepspeed"):
            raise ValueError(f"dynamic style must be 'chainer', 'torch' or 'deepspeed', got {style!r}")
        if style != "deepspeed" and (hysteresis is not None or consecutive_hysteresis):
            raise ValueError("hysteresis and consecutive_hysteresis belong to style 'deepspeed'")
        self.style = style
        #: DeepSpeed's ``delayed_shift`` (overflows tolerated before the scale drops) and its counter
        self.hysteresis = 1
        self.consecutive_hysteresis = bool(consecutive_hysteresis)
        if style == "deepspeed":
            self._scale = float(2.0**16 if init_scale is None else init_scale)
            self.interval = int(1000 if interval is None else interval)
            self.min_scale = 1.0 if min_scale is None else float(min_scale)
            self.max_scale = float("inf") if max_scale is None else float(max_scale)
            self.hysteresis = int(2 if hysteresis is None else hysteresis)
            if self.hysteresis < 1:
                raise ValueError(f"hysteresis must be >= 1, got {self.hysteresis}")
            if not self.min_scale > 0:
                raise ValueError(f"min_scale must be > 0, got {self.min_scale}")
        elif style == "torch":
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
        # deepspeed: DeepSpeed's cur_iter, last_overflow_iter and cur_hysteresis
        self._iter = 0
        self._last_overflow_iter = -1
        self._cur_hysteresis = self.hysteresis
        # GradScaler keeps its scale as a float32 tensor; do the same so the
        # torch style takes bit-identical decisions.
        self._dtype = torch.float32

    def scale_loss(self, loss: torch.Tensor) -> torch.Tensor:
        return loss * self._scale

    def current_scale(self) -> float:
        return self._scale

    def update_scale(self) -> None:
        overflow = self.overflowed
        if self.style == "torch":
            s = torch.tensor(self._scale, dtype=self._dtype)
            if overflow:
                s = s * self.backoff_factor
                self._growth_tracker = 0
            else:
                self._growth_tracker += 1
                if self._growth_tracker == self.interval:
                    grown = s * self.growth_factor
                    s = grown if torch.isfinite(grown) else s  # torch._amp_update_scale_: only to a finite scale
                    self._growth_tracker = 0
            self._scale = float(s)
        elif self.style == "deepspeed":
            self._update_deepspeed(overflow)
        else:
            if overflow:
                self._scale *= self.backoff_factor
                self._seen_overflow = True
            elif not self._seen_overflow:
                self._scale *= self.growth_factor
            else:
                self._scale *= self.growth_factor ** (1.0 / self.interval)
        self._scale = min(max(self._scale, self.min_scale), self.max_scale)
        super().update_scale()

    def set_scale(self, value: float) -> None:
        """``update(new_scale=value)``: the scale becomes ``value``; the growth tracker is kept (GradScaler's)."""
        self._scale = float(value)
        LossScaler.update_scale(self)

    def _update_deepspeed(self, overflow: bool) -> None:
        """DeepSpeed's ``DynamicLossScaler.update_scale`` (scale factor 2), without its exception at
        ``min_scale`` (module doc). ``max_scale`` (inf by default) is clamped by the caller."""
        if overflow:
            if self.hysteresis == 1 or self._cur_hysteresis == 1:
                self._scale = max(self._scale / self.growth_factor, self.min_scale)
            else:
                self._cur_hysteresis -= 1
            self._last_overflow_iter = self._iter
        else:
            if self.consecutive_hysteresis:
                self._cur_hysteresis = self.hysteresis
            stable = (self._iter - self._last_overflow_iter) - 1
            if stable > 0 and stable % self.interval == 0:
                if not self.consecutive_hysteresis:
                    self._cur_hysteresis = self.hysteresis
                self._scale *= self.growth_factor
        self._iter += 1

    def metrics(self) -> dict[str, float]:
        out = super().metrics()
        if self.style == "deepspeed":
            out["dyn_hysteresis_left"] = float(self._cur_hysteresis)
        return out

    def state_dict(self) -> dict[str, Any]:
        state = {
            "style": self.style,
            "scale": self._scale,
            "growth_tracker": self._growth_tracker,
            "seen_overflow": self._seen_overflow,
            "interval": self.interval,
        }
        if self.style == "deepspeed":
            state.update(
                iteration=self._iter, last_overflow_iter=self._last_overflow_iter, cur_hysteresis=self._cur_hysteresis
            )
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._scale = float(state["scale"])
        self._growth_tracker = int(state["growth_tracker"])
        self._seen_overflow = bool(state["seen_overflow"])
        if self.style == "deepspeed":
            self._iter = int(state["iteration"])
            self._last_overflow_iter = int(state["last_overflow_iter"])
            self._cur_hysteresis = int(state["cur_hysteresis"])
