"""Saturation-aware dynamic loss scaling (scaling/saturation.py): FP8-LM's automatic scaling,
for gradient formats that saturate instead of overflowing (E4M3)."""

from __future__ import annotations

from typing import Literal

from ..fields import PosInt, Scale, number_field
from .base import MethodEntry, interval_label, num, register_method

#: FP8-LM's rule: back off past 0.001 % saturated elements, grow x2 after 1000 clean steps
DEFAULTS = {"init_scale": 1.0, "interval": 1000, "threshold": 1e-5}


@register_method
class SaturationScaling(MethodEntry):
    method: Literal["saturation"]
    #: The starting scale.
    init_scale: Scale = DEFAULTS["init_scale"]  # type: ignore[valid-type]
    #: Clean steps after which the scale doubles.
    interval: PosInt = DEFAULTS["interval"]  # type: ignore[valid-type]
    #: share of parameter-gradient elements at or past the format's max that triggers a back-off
    threshold: number_field("float", ge=0, lt=1) = DEFAULTS["threshold"]  # type: ignore[valid-type]
    scaler = "lossscale_bench.scaling.saturation:SaturationLossScaler"
    takes_grad_format = True

    @classmethod
    def id_tag(cls, scaling: dict) -> str:
        return "satdyn" + num(scaling.get("interval", DEFAULTS["interval"]))

    @classmethod
    def row_label(cls, scaling: dict, precision: str) -> str:
        return interval_label(
            "saturation-aware dynamic", scaling, DEFAULTS, (("init_scale", "init"), ("threshold", "threshold"))
        )
