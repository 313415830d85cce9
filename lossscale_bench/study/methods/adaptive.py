"""Adaptive layer-wise loss scaling (Zhao et al. 2019; docs/adaptive_algorithm.md): per-layer scales computed
from each layer's gradient and weight statistics, on an unmodified model (scaling/adaptive.py)."""

from __future__ import annotations

from typing import Literal

from ..fields import Bool, PosInt, Scale, choice_field, number_field
from .base import Fail, MethodEntry, num, option_parts, register_method

#: the authors' defaults (ADAPTIVE.md); options added after studies ran are left out of the trial
#: id while at their default (``LATE``), so existing ids stay
DEFAULTS = {
    "update_every": 1,
    "n_uf_threshold": 1e-3,
    "scale_upper_bound": 16.0,
    "accum_upper_bound": 1024.0,
    "power_of_two": True,
    "init_scale": 1.0,
    "output_scaling": False,
    "update_count": "steps",
}
LATE = ("output_scaling", "update_count")
_LABEL_PARTS = (
    ("n_uf_threshold", "n_uf"),
    ("scale_upper_bound", "scale_ub"),
    ("accum_upper_bound", "accum_ub"),
    ("init_scale", "init"),
)


@register_method
class AdaptiveScaling(MethodEntry):
    method: Literal["adaptive"]
    #: Recompute the layer scales every this many steps (or backward calls).
    update_every: PosInt = DEFAULTS["update_every"]  # type: ignore[valid-type]
    #: The share of gradient elements allowed to underflow when a layer's scale is chosen.
    n_uf_threshold: number_field("float", gt=0, lt=1) = DEFAULTS["n_uf_threshold"]  # type: ignore[valid-type]
    #: Largest factor of one layer.
    scale_upper_bound: Scale = DEFAULTS["scale_upper_bound"]  # type: ignore[valid-type]
    #: Largest accumulated scale (the product of the factors down to a layer).
    accum_upper_bound: Scale = DEFAULTS["accum_upper_bound"]  # type: ignore[valid-type]
    #: Keep the scales powers of two (exact to apply and to undo).
    power_of_two: Bool = DEFAULTS["power_of_two"]
    #: The starting scale.
    init_scale: Scale = DEFAULTS["init_scale"]  # type: ignore[valid-type]
    #: the authors' later head-output and L2Norm-input scaling points (scaling/adaptive.py); the
    #: published table predates them, so off by default
    output_scaling: Bool = DEFAULTS["output_scaling"]
    #: what update_every counts: optimizer steps, or each layer's backward calls (the reference)
    update_count: choice_field("update_count", ("steps", "calls")) = DEFAULTS["update_count"]  # type: ignore
    scaler = "lossscale_bench.scaling.adaptive:AdaptiveLossScaler"
    per_layer = True

    def options(self) -> dict:
        out = super().options()
        for key in LATE:
            if out.get(key) == DEFAULTS[key]:
                del out[key]
        if out.get("update_every") == 1:  # every backward recomputes: both counts train the same
            out.pop("update_count", None)
        return out

    @classmethod
    def scaler_kwargs(cls, scaling: dict) -> dict:
        return {k: scaling[k] for k in cls.option_names() if k in scaling}

    def check(self, fail: Fail, precision: str) -> None:
        if self.init_scale > self.accum_upper_bound:
            fail(
                ".init_scale",
                f"{num(self.init_scale)} is above accum_upper_bound ({num(self.accum_upper_bound)}): "
                "the rule divides the excess out of every layer's scale",
                f"numbers <= {num(self.accum_upper_bound)}",
            )

    @classmethod
    def id_tag(cls, scaling: dict) -> str:
        n = scaling.get("update_every", 1)
        return "adaptive" if n == 1 else f"adaptive-f{n}"

    @classmethod
    def row_label(cls, scaling: dict, precision: str) -> str:
        n = scaling.get("update_every", 1)
        parts = [f"freq={n}"] if n != 1 else []
        parts += option_parts(scaling, DEFAULTS, _LABEL_PARTS)
        if scaling.get("power_of_two", True) is False:
            parts.append("no pow2")
        if scaling.get("output_scaling"):
            parts.append("output scaling")
        if scaling.get("update_count", "steps") == "calls" and n != 1:
            parts.append("per-call count")
        return "adaptive" + (f" ({', '.join(parts)})" if parts else "")
