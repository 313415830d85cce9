"""Transformer Engine's amax scaling per scaling point (scaling/amax.py): the scale that puts each
layer's largest gradient at the format's maximum, from this step (current) or a history (delayed)."""

from __future__ import annotations

import math
from typing import Literal

from ...core.float_ranges import FP32, RANGES
from ...core.registry import AMAX_RECIPES
from ..fields import Bool, NonNegInt, PosInt, Scale, choice_field
from ..precisions import precision_specs, scaler_grad_format
from .base import Fail, MethodEntry, differs, num, register_method

#: Transformer Engine's DelayedScaling defaults
DEFAULTS = {"recipe": "delayed", "history": 1024, "margin": 0, "power_of_two": True, "init_scale": 1.0}


def max_margin(grad_format: str, block_scaled: bool = False) -> int:
    """The largest ``margin`` that means what it says with ``grad_format`` gradients.

    The scale puts a layer's largest gradient at ``fmax / 2**margin``: below the format's smallest
    subnormal that target is nothing the format holds (every gradient flushes), and the rule
    computes ``(fmax / amax) / 2**margin`` in fp32, where ``2**margin`` past fp32's largest value
    makes every scale 0 (the scaler then keeps the scale it had: 1, "no loss scale" under an amax
    label). fp16: 39, E5M2: 31, E4M3: 17, bf16: 127, plain E2M1: 3.

    ``block_scaled``: the gradients are rounded with a scale per block (NVFP4, MXFP4), which puts each
    block's largest element at the format's maximum whatever the loss scale, so the element format's
    range does not bound the margin; fp32's does (127: a gradient of amax 1 at margin 127 still rounds
    to itself in both, tests/study/test_scale_bounds.py).
    """
    top = math.log2(FP32.max)
    return math.floor(top if block_scaled else min(RANGES[grad_format].log2_span(), top))


@register_method
class AmaxScaling(MethodEntry):
    method: Literal["amax"]
    #: current: each step's own amax; delayed: the largest over a history of steps (Transformer Engine's
    #: DelayedScaling).
    recipe: choice_field("amax recipe", AMAX_RECIPES) = DEFAULTS["recipe"]  # type: ignore[valid-type]
    #: recipe delayed only: steps of amax history (TE's amax_history_len)
    history: PosInt | None = None  # type: ignore[valid-type]
    #: Put a layer's largest gradient 2**margin below the format's maximum.
    margin: NonNegInt = DEFAULTS["margin"]  # type: ignore[valid-type]
    #: Keep the scales powers of two.
    power_of_two: Bool = DEFAULTS["power_of_two"]
    #: The starting scale.
    init_scale: Scale = DEFAULTS["init_scale"]  # type: ignore[valid-type]
    scaler = "lossscale_bench.scaling.amax:AmaxLossScaler"
    per_layer = True

    def options(self) -> dict:
        out = {
            "method": "amax",
            "recipe": self.recipe,
            "margin": self.margin,
            "power_of_two": self.power_of_two,
            "init_scale": self.init_scale,
        }
        if self.recipe == "delayed":
            out["history"] = self.history if self.history is not None else DEFAULTS["history"]
        return out

    def check(self, fail: Fail, precision: str) -> None:
        if self.history is not None and self.recipe != "delayed":
            fail(".history", f"only meaningful with recipe: delayed (this entry has recipe: {self.recipe})")
        fmt = scaler_grad_format(precision)
        blocks = precision_specs()[precision].grad_scaling  # nvfp4, mxfp4: a scale per block; None: the format alone
        top = max_margin(fmt, block_scaled=blocks is not None)
        if self.margin > top:
            if self.margin > math.log2(FP32.max):
                why = f"2**{self.margin} is past fp32's largest value, so every scale would be 0 and stay at init_scale"
            else:
                why = (
                    f"the largest gradient would be put at {num(RANGES[fmt].max)} / 2**{self.margin}, below "
                    f"{fmt}'s smallest subnormal ({num(RANGES[fmt].min_subnormal)}): every gradient would flush"
                )
            grads = f"{blocks} gradients" if blocks else f"{fmt} gradients"
            fail(
                ".margin",
                f"{self.margin} is out of range for {precision} ({grads}): {why}",
                f"integers 0 <= x <= {top}",
            )

    @classmethod
    def id_tag(cls, scaling: dict) -> str:
        margin = num(scaling.get("margin", 0))
        if scaling.get("recipe", DEFAULTS["recipe"]) == "current":
            return f"amaxcur-m{margin}"
        return f"amaxdel{num(scaling.get('history', DEFAULTS['history']))}-m{margin}"

    @classmethod
    def row_label(cls, scaling: dict, precision: str) -> str:
        recipe = scaling.get("recipe", DEFAULTS["recipe"])
        parts = [recipe]
        if recipe == "delayed":
            parts.append(f"history={num(scaling.get('history', DEFAULTS['history']))}")
        if scaling.get("margin", 0):
            parts.append(f"margin={num(scaling['margin'])}")
        if differs(scaling, "init_scale", DEFAULTS["init_scale"]):
            parts.append(f"init={num(scaling['init_scale'])}")
        if scaling.get("power_of_two", True) is False:
            parts.append("no pow2")
        return f"amax ({', '.join(parts)})"
