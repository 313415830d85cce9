"""No loss scaling: the FP32 baseline, or a low-precision row left unscaled."""

from __future__ import annotations

from typing import Literal

from .base import MethodEntry, register_method


@register_method
class NoneScaling(MethodEntry):
    method: Literal["none"]
    scaler = "lossscale_bench.scaling.fixed:NoLossScaler"

    @classmethod
    def row_label(cls, scaling: dict, precision: str) -> str:
        return "FP32 baseline" if precision == "fp32" else "no loss scale"
