"""fairscale's LayerwiseGradientScaler rule per scaling point (scaling/layerwise_dynamic.py):
a dynamic scale per layer, backed off where that layer's gradients overflow."""

from __future__ import annotations

from typing import Literal

from ..fields import PosInt, Scale
from .base import Fail, MethodEntry, interval_label, num, register_method

#: fairscale's growth_interval; GradScaler's start
DEFAULTS = {"init_scale": 65536.0, "interval": 10000}


@register_method
class LayerwiseDynamicScaling(MethodEntry):
    method: Literal["layerwise_dynamic"]
    #: Every scaling point's starting scale.
    init_scale: Scale = DEFAULTS["init_scale"]  # type: ignore[valid-type]
    #: Clean steps after which a point's scale doubles.
    interval: PosInt = DEFAULTS["interval"]  # type: ignore[valid-type]
    #: A point's scale never drops below this (not given: no floor).
    min_scale: Scale | None = None  # type: ignore[valid-type]
    #: A point's scale never grows past this (not given: no ceiling).
    max_scale: Scale | None = None  # type: ignore[valid-type]
    scaler = "lossscale_bench.scaling.layerwise_dynamic:LayerwiseDynamicLossScaler"
    per_layer = True

    def check(self, fail: Fail, precision: str) -> None:
        lo, hi, init = self.min_scale, self.max_scale, self.init_scale
        if lo is not None and hi is not None and lo > hi:
            fail(".min_scale", f"{num(lo)} is above max_scale ({num(hi)})", f"numbers <= {num(hi)}")
        if lo is not None and init < lo:
            fail(".init_scale", f"{num(init)} is below min_scale ({num(lo)})", f"numbers >= {num(lo)}")
        if hi is not None and init > hi:
            fail(".init_scale", f"{num(init)} is above max_scale ({num(hi)})", f"numbers <= {num(hi)}")

    @classmethod
    def id_tag(cls, scaling: dict) -> str:
        return "lwdyn" + num(scaling.get("interval", DEFAULTS["interval"]))

    @classmethod
    def row_label(cls, scaling: dict, precision: str) -> str:
        return interval_label(
            "layer-wise dynamic",
            scaling,
            DEFAULTS,
            (("init_scale", "init"), ("min_scale", "min"), ("max_scale", "max")),
        )
