"""Dynamic loss scaling: halve on overflow, grow after ``interval`` clean steps, in three styles.

``chainer`` (the seed study's: start at 1, grow x2 until the first overflow), ``torch``
(``GradScaler``) and ``deepspeed`` (DeepSpeed's ``DynamicLossScaler``, with hysteresis and a
floor). The style decides the defaults; only deepspeed entries carry its own options, so
chainer and torch trial ids stay as they were before deepspeed existed.
"""

from __future__ import annotations

from typing import Literal

from ...core.registry import DYNAMIC_STYLES
from ..fields import Bool, PosInt, Scale, choice_field
from .base import Fail, MethodEntry, differs, num, register_method

#: the options per style where the entry leaves them out
DEFAULTS = {
    "chainer": {"interval": 10, "init_scale": 1.0},
    "torch": {"interval": 2000, "init_scale": 65536.0},
    # DeepSpeed's engine defaults (initial_scale_power 16, loss_scale_window 1000, ...)
    "deepspeed": {
        "interval": 1000,
        "init_scale": 65536.0,
        "hysteresis": 2,
        "min_scale": 1.0,
        "consecutive_hysteresis": False,
    },
}
#: options only one style reads; given with another style they are an error
STYLE_ONLY = {"hysteresis": "deepspeed", "min_scale": "deepspeed", "consecutive_hysteresis": "deepspeed"}
_TAG_PREFIX = {"torch": "dyntorch", "deepspeed": "dynds"}


@register_method
class DynamicScaling(MethodEntry):
    method: Literal["dynamic"]
    #: Whose rule: chainer (start at 1, grow until the first overflow), torch (GradScaler) or deepspeed
    #: (DynamicLossScaler, with hysteresis and a floor).
    style: choice_field("dynamic style", DYNAMIC_STYLES) = "chainer"  # type: ignore[valid-type]
    #: Clean steps after which the scale doubles.
    interval: PosInt | None = None  # type: ignore[valid-type]
    #: The starting scale.
    init_scale: Scale | None = None  # type: ignore[valid-type]
    #: style deepspeed only (DeepSpeed's hysteresis, min_loss_scale, consecutive_hysteresis)
    hysteresis: PosInt | None = None  # type: ignore[valid-type]
    #: style deepspeed only: the scale never drops below this.
    min_scale: Scale | None = None  # type: ignore[valid-type]
    #: style deepspeed only: hysteresis counts consecutive overflows only.
    consecutive_hysteresis: Bool | None = None
    scaler = "lossscale_bench.scaling.dynamic:DynamicLossScaler"

    def options(self) -> dict:
        d = DEFAULTS[self.style]
        out = {
            "method": "dynamic",
            "style": self.style,
            "interval": self.interval if self.interval is not None else d["interval"],
            "init_scale": self.init_scale if self.init_scale is not None else d["init_scale"],
        }
        for k, style in STYLE_ONLY.items():
            if style == self.style:
                v = getattr(self, k)
                out[k] = v if v is not None else d[k]
        return out

    def check(self, fail: Fail, precision: str) -> None:
        for opt, style in STYLE_ONLY.items():
            if getattr(self, opt) is not None and self.style != style:
                fail(f".{opt}", f"only meaningful with style: {style} (this entry has style: {self.style})")
        opts = self.options()
        if self.style == "deepspeed" and opts["init_scale"] < opts["min_scale"]:
            fail(
                ".init_scale",
                f"{num(opts['init_scale'])} is below min_scale ({num(opts['min_scale'])}): "
                "the scale would start under its own floor",
                f"numbers >= {num(opts['min_scale'])}",
            )

    @classmethod
    def id_tag(cls, scaling: dict) -> str:
        return _TAG_PREFIX.get(scaling.get("style"), "dyn") + num(scaling.get("interval", 0))

    @classmethod
    def row_label(cls, scaling: dict, precision: str) -> str:
        style = scaling.get("style", "chainer")
        d = DEFAULTS.get(style, DEFAULTS["chainer"])
        interval = scaling.get("interval")
        interval = d["interval"] if interval is None else interval
        parts = ["dynamic"] + ([style] if style in ("torch", "deepspeed") else []) + [f"interval={num(interval)}"]
        if differs(scaling, "init_scale", d["init_scale"]):
            parts.append(f"init={num(scaling['init_scale'])}")
        if style == "deepspeed":
            for key, short in (("hysteresis", "hysteresis"), ("min_scale", "min")):
                if differs(scaling, key, d[key]):
                    parts.append(f"{short}={num(scaling[key])}")
            if scaling.get("consecutive_hysteresis"):
                parts.append("consecutive hysteresis")
        return f"loss scale ({', '.join(parts)})"
