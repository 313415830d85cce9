"""Loss-scaling methods behind one interface (``LossScaler``).

``build_scaler`` turns a study's scaling entry into a scaler; the per-layer
methods (``adaptive``, ``layerwise_dynamic``, ``amax``) need the model because
they scale per layer during backward. A new method is one module here, one
branch below, its names in :mod:`lossscale_bench.registry` and its entry in
:mod:`lossscale_bench.study.schema`.
"""

from __future__ import annotations

from typing import Any

from .base import LossScaler, StepResult
from .dynamic import DynamicLossScaler
from .fixed import FixedLossScaler, NoLossScaler

__all__ = ["LossScaler", "StepResult", "FixedLossScaler", "NoLossScaler", "DynamicLossScaler",
           "AdaptiveLossScaler", "LayerwiseDynamicLossScaler", "AmaxLossScaler", "build_scaler"]


def __getattr__(name: str):
    if name == "AdaptiveLossScaler":
        from .adaptive import AdaptiveLossScaler

        return AdaptiveLossScaler
    if name == "LayerwiseDynamicLossScaler":
        from .layerwise_dynamic import LayerwiseDynamicLossScaler

        return LayerwiseDynamicLossScaler
    if name == "AmaxLossScaler":
        from .amax import AmaxLossScaler

        return AmaxLossScaler
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
        extra = {k: entry[k] for k in ("hysteresis", "min_scale", "consecutive_hysteresis")
                 if k in entry and entry[k] is not None}
        return DynamicLossScaler(style=entry.get("style", "chainer"), init_scale=entry.get("init_scale"),
                                 interval=entry.get("interval"), **extra)
    if method == "layerwise_dynamic":
        from .layerwise_dynamic import LayerwiseDynamicLossScaler

        opts = {k: entry[k] for k in ("init_scale", "interval", "growth_factor", "backoff_factor",
                                      "min_scale", "max_scale") if k in entry and entry[k] is not None}
        if grad_format is not None:
            opts["grad_format"] = grad_format  # the range merges of branches keep gradients in
        return LayerwiseDynamicLossScaler(model, **opts)
    if method == "amax":
        from .amax import AmaxLossScaler

        opts = {k: entry[k] for k in ("recipe", "history", "margin", "power_of_two", "init_scale")
                if k in entry and entry[k] is not None}
        if grad_format is not None:
            opts["grad_format"] = grad_format
        return AmaxLossScaler(model, **opts)
    if method == "adaptive":
        from .adaptive import AdaptiveLossScaler

        opts = {k: entry[k] for k in ("update_every", "n_uf_threshold", "scale_upper_bound", "accum_upper_bound",
                                      "power_of_two", "init_scale", "output_scaling", "update_count") if k in entry}
        if grad_format is not None:
            opts["grad_format"] = grad_format
        return AdaptiveLossScaler(model, **opts)
    raise ValueError(f"unknown scaling method {method!r}")
