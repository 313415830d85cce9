"""A fixed loss scale (the seed tables' 1, 8, 128, 256)."""

from __future__ import annotations

from typing import Literal

from ..fields import Bool, Scale
from .base import MethodEntry, num, register_method


@register_method
class FixedScaling(MethodEntry):
    method: Literal["fixed"]
    #: The loss scale, applied at every step.
    scale: Scale = 1.0  # type: ignore[valid-type]
    #: skip a step whose gradients are not finite (Chainer's and AMP's behaviour)
    skip_nonfinite: Bool = True
    scaler = "lossscale_bench.scaling.fixed:FixedLossScaler"

    @classmethod
    def id_tag(cls, scaling: dict) -> str:
        return f"fixed{num(scaling.get('scale', 1.0))}"

    @classmethod
    def row_label(cls, scaling: dict, precision: str) -> str:
        scale = float(scaling.get("scale", 1.0))
        extra = "" if scaling.get("skip_nonfinite", True) else "no skip"
        if scale == 1.0:
            return "no loss scale" + (f" ({extra})" if extra else "")
        return f"loss scale ({num(scale)}{', ' + extra if extra else ''})"
