"""Loss-scaling methods behind one interface (``LossScaler``).

``build_scaler`` turns a study's scaling entry into a scaler; the adaptive
method needs the model because it scales per layer during backward.
"""

from __future__ import annotations

from typing import Any

from .base import LossScaler, StepResult
from .dynamic import DynamicLossScaler
from .fixed import FixedLossScaler, NoLossScaler

__all__ = ["LossScaler", "StepResult", "FixedLossScaler", "NoLossScaler", "DynamicLossScaler",
           "AdaptiveLossScaler", "build_scaler"]


def __getattr__(name: str):
    if name == "AdaptiveLossScaler":
        from .adaptive import AdaptiveLossScaler

        return AdaptiveLossScaler
    raise AttributeError(name)


def build_scaler(entry: dict[str, Any], model=None, grad_format=None) -> LossScaler:
    """Build the scaler for a scaling entry (``{"method": ..., **options}``).

    ``grad_format`` is the precision's gradient format (:mod:`lossscale_bench.formats`); the
    adaptive rule keeps gradients inside its range (None: fp16, the method's own format).
    """
    method = entry["method"]
    if method == "none":
        return NoLossScaler()
    if method == "fixed":
        return FixedLossScaler(scale=entry.get("scale", 1.0), skip_nonfinite=entry.get("skip_nonfinite", True))
    if method == "dynamic":
        return DynamicLossScaler(style=entry.get("style", "chainer"), init_scale=entry.get("init_scale"),
                                 interval=entry.get("interval"))
    if method == "adaptive":
        from .adaptive import AdaptiveLossScaler

        opts = {k: entry[k] for k in ("update_every", "n_uf_threshold", "scale_upper_bound",
                                      "accum_upper_bound", "power_of_two", "init_scale") if k in entry}
        if grad_format is not None:
            opts["grad_format"] = grad_format
        return AdaptiveLossScaler(model, **opts)
    raise ValueError(f"unknown scaling method {method!r}")
