"""Per-layer scaling from the gradient's amax, as FP8 training recipes scale tensors.

Transformer Engine scales every FP8 tensor by ``(fp8_max / amax) / 2**margin``
(``DelayedScaling``: margin 0, ``amax_history_len`` 1024, ``amax_compute_algo``
"max"; a zero or non-finite amax keeps the previous scale; the scale starts at
1). An amax so small that ``fp8_max / amax`` overflows fp32 (below ``fp8_max / 3.4e38``: ~1.7e-34
for E5M2, ~1.3e-36 for E4M3) sets fp32's largest value, ``2**127`` with ``power_of_two``, as TE's
``_default_sf_compute`` (transformer_engine/pytorch/quantization.py) and its CUDA
``compute_scale_from_amax`` (common/recipe/recipe_common.cuh) do; before 2026-12 this module kept the
previous scale there, as TE's older releases did. Two recipes:

* ``current``: the amax of this step's gradient (``Float8CurrentScaling``).
* ``delayed``: the largest amax of the last ``history`` steps, not including
  this one (``DelayedScaling`` with "max"); until a step has been seen the
  scale is 1, as in TE.

``fp8_max`` is the largest finite value of the precision's gradient format
(:mod:`lossscale_bench.precision.formats`: 57344 for E5M2 under ``fp8-emulated``,
65504 for fp16). ``power_of_two`` rounds each scale down to a power of two, as
TE's power-of-two scale option does, so scaling and unscaling are exact.

Where the scales sit and where amax is measured. The scaling points are
those of :class:`~.per_layer.PointLossScaler` (:mod:`.per_layer`): the loss, and the input gradient of every stock
Conv2d/Linear, produced directly at its scale (the factor is folded into the
layer's input-gradient product) and rounded to the gradient format where it
arrives at the next layer's output. The scale of the gradient layer ``j`` sends
upstream is set from the amax of the gradient *arriving at* ``j``, in true
units (``amax(g) / P``, ``P`` the scale it carries): that is the tensor the
machinery holds before the input gradient exists, so no second pass over any
gradient is needed (measuring the input gradient itself would mean producing it,
taking its amax and rescaling it: one more full pass per layer). A conv's
backward roughly keeps the gradient's magnitude (He-style initialisation), so
the arriving amax is a close proxy; ``margin`` absorbs the difference. The
loss's scale comes from the amax arriving at the layers fed by the loss (the
heads); the loss must be scaled before its backward runs, so both recipes use
earlier steps for it (``current``: the previous step's). Data-parallel replicas
record the max of their amaxes (TE's ``reduce_amax``); ``current`` layer scales
are each replica's own (agreeing during backward would cost a collective per
layer), which the unscaling per replica allows.

Overflow. As for adaptive, scales follow statistics, not a backoff schedule: a
step with a non-finite gradient is skipped and counted, and its non-finite
amaxes are not recorded (TE would record them and keep the old scales for the
whole history window). Parameter gradients carry the scale of the gradient
they were computed from and are rounded to the gradient format there, as for
every method in this tool (TE keeps weight gradients in higher precision):
sums over a batch may exceed the format's maximum, which ``margin`` prevents.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import nn

from ..core.host_path import host_shortcuts
from ..numerics.amax import max_abs, max_abs_value
from ..precision.formats import FP16, FloatFormat
from .base import all_reduce_flag, distributed
from .host_fp32 import f32, floor_pow2_log2, recip
from .per_layer import PointLossScaler

__all__ = ["AmaxLossScaler", "scale_from_amax", "scale_from_finite_amax", "scale_from_amax_host", "RECIPES"]

_F32 = torch.float32
RECIPES = ("current", "delayed")


#: the scale where ``fmax / amax`` overflows fp32 (TE: fp32's largest value; its power of two below)
_F32_MAX = torch.finfo(torch.float32).max


def _largest(power_of_two: bool) -> float:
    return 2.0**127 if power_of_two else _F32_MAX


def scale_from_amax(
    amax: torch.Tensor, prev: torch.Tensor, fmax: float, margin: float, power_of_two: bool
) -> torch.Tensor:
    """TE's default scaling factor: ``(fmax / amax) / 2**margin``; ``prev`` where amax is 0 or not finite;
    fp32's largest value (``2**127`` with ``power_of_two``) where amax is so small that the factor overflows."""
    sf = (fmax / amax) / (2.0**margin)
    if power_of_two:
        sf = torch.exp2(torch.floor(torch.log2(sf)))
    live = (amax > 0) & torch.isfinite(amax)
    sf = torch.where(live & torch.isinf(sf), sf.new_tensor(_largest(power_of_two)), sf)
    return torch.where(live & (sf > 0), sf, prev)


def scale_from_finite_amax(
    amax: torch.Tensor, prev: torch.Tensor, fmax: float, margin: float, power_of_two: bool
) -> torch.Tensor:
    """:func:`scale_from_amax` for an ``amax`` known to be finite and not negative (a recorded one): the same
    value in fewer operations. There ``sf`` is never NaN, and inf either for ``amax == 0`` (``prev``) or
    for an amax so small that the factor overflows (fp32's largest)."""
    sf = (fmax / amax) / (2.0**margin)
    if power_of_two:
        sf = torch.exp2(torch.floor(torch.log2(sf)))
    sf = torch.where((amax > 0) & (sf == math.inf), sf.new_tensor(_largest(power_of_two)), sf)
    return torch.where((sf > 0) & (sf < math.inf), sf, prev)


def scale_from_amax_host(amax: float, prev: float, fmax: float, margin: float, power_of_two: bool) -> float:
    """:func:`scale_from_amax` on fp32 values held as floats, for the CPU (:mod:`.host_fp32`): the same value,
    each tensor operation one rounded float operation (``fmax / amax`` is ``reciprocal(amax) * fmax``)."""
    if not (amax > 0.0 and math.isfinite(amax)):
        return prev
    sf = f32(f32(recip(amax) * f32(fmax)) / f32(2.0**margin))
    if math.isinf(sf):
        return _largest(power_of_two)
    if not sf > 0.0:
        return prev
    sf = floor_pow2_log2(sf) if power_of_two else sf
    return _largest(power_of_two) if math.isinf(sf) else sf


class AmaxLossScaler(PointLossScaler):
    """A scale per scaling point from the gradient's amax (see module doc)."""

    method = "amax"
    metric_prefix = "amax_"
    #: on the CPU, the rule's arithmetic on the host (:meth:`_point_scale_host`; the tests switch it off to
    #: compare it with the tensor path, which runs on every other device)
    host_rule = True

    def __init__(
        self,
        model: nn.Module,
        recipe: str = "delayed",
        history: int = 1024,
        margin: float = 0.0,
        power_of_two: bool = True,
        init_scale: float = 1.0,
        *,
        grad_format: FloatFormat = FP16,
        **kwargs: Any,
    ) -> None:
        if recipe not in RECIPES:
            raise ValueError(f"amax recipe must be one of {', '.join(RECIPES)}, got {recipe!r}")
        if int(history) != history or history < 1:
            raise ValueError(f"history must be a positive integer, got {history}")
        if not margin >= 0:
            raise ValueError(f"margin must be >= 0, got {margin}")
        super().__init__(model, init_scale=init_scale, grad_format=grad_format, **kwargs)
        self.power_of_two = bool(power_of_two)
        self.recipe = recipe
        self.history = int(history)
        self.margin = float(margin)
        self.fmax = float(grad_format.max)
        n = len(self.points)
        #: device state, created at the first backward on the gradients' device
        self._scales: torch.Tensor | None = None  # (n,) scale of every point
        self._hist: torch.Tensor | None = None  # (history, n) true amaxes, newest first; 0 = none
        self._now: torch.Tensor | None = None  # (n,) this step's true amaxes (0 = not measured)
        self._hist_max: torch.Tensor | None = None  # (n,) max over the history window, once per step
        #: on the CPU with the host rule: (scales, hist_max, now) as float lists during a backward, written back
        #: to the tensors by :meth:`_flush_host` (a write or read of one element of a tensor is a dispatch)
        self._host: tuple[list[float], list[float], list[float]] | None = None
        #: elsewhere: (scales, now, hist_max) as lists of 0-d tensors during a backward (one unbind each, where
        #: writing an element of a tensor is two dispatches), stacked back by :meth:`_flush_host` too
        self._dev: tuple[list[torch.Tensor], list[torch.Tensor], list[torch.Tensor]] | None = None
        #: :meth:`_host_view`'s floats, None once the state may have changed
        self._view: tuple[list[float], list[float]] | None = None
        #: the next loss scale (tensor, float) read with the overflow verdict, for update()
        self._next: tuple[torch.Tensor, float] | None = None
        self._n = n
        self._loss_scale = float(init_scale)
        self._pending_state: dict[str, Any] | None = None

    def _flush_host(self) -> None:
        """Write the host's or the device's lists back to the state tensors (before anything reads or writes them)."""
        if self._host is not None:
            scales, _, now = self._host
            self._host = None
            self._scales.copy_(torch.tensor(scales, dtype=_F32))
            self._now.copy_(torch.tensor(now, dtype=_F32))
        if self._dev is not None:
            scales, now, _ = self._dev
            self._dev = None
            self._scales = torch.stack(scales)
            self._now = torch.stack(now)

    def _rule_on_host(self) -> bool:
        """Whether the rule's arithmetic runs on the host: the state is on the CPU and its shortcuts are on."""
        return self.host_rule and host_shortcuts() and self._scales is not None and self._scales.device.type == "cpu"

    def _device_lists(self) -> tuple[list[torch.Tensor], list[torch.Tensor], list[torch.Tensor]]:
        if self._dev is None:
            hist = [] if self.recipe == "current" else list(self._hist_max.unbind())
            self._dev = (list(self._scales.unbind()), list(self._now.unbind()), hist)
        return self._dev

    def _ensure(self, device: torch.device) -> None:
        if self._scales is None:
            self._scales = torch.ones(self._n, dtype=_F32, device=device)
            self._scales[0] = self._loss_scale
            self._hist = torch.zeros(self.history, self._n, dtype=_F32, device=device)
            if self._pending_state is not None:
                self._restore(self._pending_state)
                self._pending_state = None
            self._hist_max = self._hist.amax(0)
        if self._now is None:
            self._now = torch.zeros(self._n, dtype=_F32, device=self._scales.device)

    # -- the rule ------------------------------------------------------------------
    def point_scale(self, k: int, grad: torch.Tensor, incoming: torch.Tensor, from_loss: bool) -> torch.Tensor:
        """TE's scale from point ``k``'s amax (this one or the history's); records the arriving amax."""
        self._view = None
        self._ensure(grad.device)
        if self._rule_on_host() and grad.device.type == incoming.device.type == "cpu":
            return self._point_scale_host(k, grad, float(incoming), from_loss)
        if self._host is not None:
            self._flush_host()
        scales, now, hist_max = self._device_lists()
        prev = incoming.to(device=self._scales.device, dtype=_F32)
        a = max_abs(grad).to(self._scales.device, _F32) / prev
        a = torch.nan_to_num(a, nan=0.0, posinf=0.0, neginf=0.0)  # a non-finite amax is not recorded
        now[k] = a
        if from_loss:
            now[0] = torch.maximum(now[0], a)
        # recorded amaxes are finite and not negative (above), so the shorter form of the rule applies
        amax = a if self.recipe == "current" else hist_max[k]
        s = scale_from_finite_amax(amax, scales[k], self.fmax, self.margin, self.power_of_two)
        scales[k] = s
        return s

    def _point_scale_host(self, k: int, grad: torch.Tensor, prev: float, from_loss: bool) -> torch.Tensor:
        """:meth:`point_scale` with its arithmetic on the host (CPU state): the same values and writes."""
        a_raw = max_abs_value(grad)
        if prev == 0.0:  # the fp32 quotient by zero (Python's raises)
            a = math.nan if a_raw == 0.0 or a_raw != a_raw else math.inf
        else:
            a = f32(a_raw / prev)
        a = a if math.isfinite(a) else 0.0  # a non-finite amax is not recorded
        if self._dev is not None:
            self._flush_host()
        if self._host is None:
            self._host = (self._scales.tolist(), self._hist_max.tolist(), self._now.tolist())
        scales, hist_max, now = self._host
        now[k] = a
        if from_loss:
            now[0] = now[0] if now[0] >= a else a  # both finite: torch.maximum
        amax = a if self.recipe == "current" else hist_max[k]
        s = scale_from_amax_host(amax, scales[k], self.fmax, self.margin, self.power_of_two)
        scales[k] = s
        return torch.tensor(s, dtype=_F32)

    def _next_loss_scale(self) -> torch.Tensor:
        """The loss's scale :meth:`update` will set, computed before it as it will (one worker: the history it
        rolls in is this step's amaxes); the maximum over the kept history rows is exact in any order."""
        now0 = self._now[0]
        if self.recipe == "current" or self.history == 1:
            amax = now0
        else:
            amax = torch.maximum(now0, self._hist[: self.history - 1, 0].amax())
        return scale_from_amax(amax, self._scales[0], self.fmax, self.margin, self.power_of_two)

    def read_overflow(self) -> bool:
        """Off the host, one worker: the verdict and the next loss scale in one read (update() needs no other)."""
        self._next = None
        if (
            self._rule_on_host()
            or distributed()
            or self._found_inf is None
            or self._now is None
            or self._scales is None
        ):
            return super().read_overflow()
        self._flush_host()
        s0 = self._next_loss_scale()
        found, scale = torch.stack([self._found_inf.reshape(()).to(s0.device, _F32), s0]).tolist()
        self._next = (s0, scale)
        return bool(found)

    def update_scale(self) -> None:
        early, self._next = self._next, None
        measured = self._now is not None and self._scales is not None
        self._flush_host()
        super().update_scale()
        if not measured:
            return
        # the newest amaxes go in front; points not measured this step record 0 (TE: no amax, no update).
        # Data-parallel replicas record the max over replicas (TE's reduce_amax), so their histories,
        # and the scales that come from them, agree; a no-op when not distributed.
        self._hist = torch.roll(self._hist, 1, dims=0)
        self._hist[0] = all_reduce_flag(self._now)
        self._now = None
        self._hist_max = self._hist.amax(0)
        amax = self._hist[0, 0] if self.recipe == "current" else self._hist_max[0]
        if early is not None:  # read with the verdict (read_overflow)
            self._scales[0] = early[0]
            self._loss_scale = early[1]
        elif self._rule_on_host():
            self._scales[0] = scale_from_amax_host(
                float(amax), float(self._scales[0]), self.fmax, self.margin, self.power_of_two
            )
            self._loss_scale = float(self._scales[0])
        else:
            self._scales[0] = scale_from_amax(amax, self._scales[0], self.fmax, self.margin, self.power_of_two)
            self._loss_scale = float(self._scales[0])
        self.init_scale = self._loss_scale
        self._view = None

    def current_scale(self) -> float:
        return self._loss_scale

    def set_scale(self, value: float) -> None:
        """``update(new_scale=value)``: the amax history is rolled as :meth:`update` does, then the loss's
        scale becomes ``value`` (the next step's rule starts from it)."""
        super().set_scale(value)
        self._loss_scale = float(value)
        if self._scales is not None:
            self._scales[0] = float(value)
        self._view = None

    # -- introspection -------------------------------------------------------------
    def _host_view(self) -> tuple[list[float], list[float]] | None:
        """The points' scales and last recorded amaxes as floats, in one read, kept until the state changes
        (a logged step's metrics and layer table share it); None before the first backward."""
        self._flush_host()
        if self._scales is None:
            return None
        if self._view is None:
            both = torch.cat([self._scales, self._hist[0].to(self._scales.device)]).tolist()
            self._view = (both[: self._n], both[self._n :])
        return self._view

    def point_scales(self) -> dict[str, float]:
        view = self._host_view()
        if view is None:
            return {p: (self._loss_scale if k == 0 else 1.0) for k, p in enumerate(self.points)}
        return dict(zip(self.points, view[0]))

    def layer_table(self) -> list[dict[str, Any]]:
        rows = super().layer_table()
        view = self._host_view()
        last = [0.0] * self._n if view is None else view[1]
        for row, k in zip(rows, range(1, self._n)):
            row["amax"] = last[k]
        return rows

    def state_dict(self) -> dict[str, Any]:
        state = {
            "method": self.method,
            "iteration": self._iter,
            "recipe": self.recipe,
            "history": self.history,
            "loss_scale": self._loss_scale,
            "points": list(self.points),
        }
        self._flush_host()
        if self._scales is not None:
            state["scales"] = self._scales.cpu().tolist()
            state["amax_history"] = self._hist.cpu().tolist()
        return state

    def _restore(self, state: dict[str, Any]) -> None:
        self._view = None
        index = {p: k for k, p in enumerate(state["points"])}
        scales = torch.tensor(state["scales"], dtype=_F32)
        hist = torch.tensor(state["amax_history"], dtype=_F32).reshape(-1, len(index))
        rows = min(self.history, hist.shape[0])
        for k, p in enumerate(self.points):
            j = index.get(p)
            if j is None:
                continue
            self._scales[k] = scales[j]
            self._hist[:rows, k] = hist[:rows, j].to(self._hist.device)
        self._hist_max = self._hist.amax(0)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._flush_host()
        self._iter = int(state.get("iteration", 0))
        self._loss_scale = float(state["loss_scale"])
        self.init_scale = self._loss_scale
        if "scales" not in state:
            return
        if self._scales is None:  # restored on the device of the first backward
            self._pending_state = state
        else:
            self._restore(state)
