"""Per-layer underflow telemetry: what makes a loss-scaling study explain itself.

At every Conv2d/Linear output we look at the activation gradient arriving
there (with whatever scale it carries) and count, among its elements that are
non-zero in fp32, those that would be subnormal in the precision's gradient
format (fp16: |g| < 2**-14, losing precision; E5M2 the same; E4M3 2**-6), those that
would flush to zero (fp16: |g| <= 2**-25; E5M2: |g| <= 2**-17; E4M3 2**-10) and
those past the format's maximum (saturated to it, or overflowed to inf/NaN), the
thresholds read from the format (:mod:`lossscale_bench.precision.formats`; a block-scaled
format counts from its own round trip, per block). Exact zeros are
not counted: SSD heads' gradients are mostly exact zeros from hard-negative
mining (FIELD-NOTES). The gradient is seen before fp16-emulated rounding (the
probe's hook sits on the tensor the emulation returns), so flushed elements
are still visible.

Parameter gradients of the same layers (weight and bias) are counted too, as
``param_*`` rates: a weight gradient is a sum over the batch and every spatial
position, so it can saturate where no activation gradient does (a per-layer scale
that puts the largest activation gradient near the format's maximum). An emulated
precision hands them over just before it rounds them
(:meth:`lossscale_bench.precision.layers.EmulationHandle.observe_param_grads`), so they
carry the loss scale, as the rounding sees them; without an emulation the probe hooks
the accumulated gradients itself. With ``grad_rounding: after_unscale`` they are
rounded later, unscaled, and are not counted.

The probe is armed only on logged steps and keeps its counts on the device;
``read()`` is the one host synchronisation.
"""

from __future__ import annotations

import csv
from pathlib import Path
from typing import Any

import torch
from torch import nn

from .formats import FP16, FloatFormat
from .layers import EMULATED_LAYERS

FP16_MIN_NORMAL = FP16.min_normal
FP16_FLUSH = FP16.flush_threshold  # at or below half the smallest subnormal, fp16 rounding gives 0


#: per-layer rates of the layer's parameter gradients (module doc), beside the activation-gradient ones
PARAM_RATES = ("param_flush_rate", "param_saturate_rate")


class UnderflowProbe:
    def __init__(
        self,
        model: nn.Module,
        layer_types=EMULATED_LAYERS,
        fmt: FloatFormat = FP16,
        emulation=None,
        param_grads: bool = True,
    ) -> None:
        """``emulation``: the precision's :class:`~lossscale_bench.precision.layers.EmulationHandle`, if any;
        ``param_grads=False`` counts activation gradients only."""
        #: the format whose thresholds are counted against (the precision's gradient format)
        self.format = fmt
        self.names: list[str] = []
        self._handles = []
        self._armed = False
        self._counts: dict[str, torch.Tensor] = {}
        self._param_counts: dict[str, torch.Tensor] = {}
        self._param_layer: dict[torch.Tensor, str] = {}
        for name, m in model.named_modules():
            if isinstance(m, layer_types):
                self.names.append(name)
                self._handles.append(m.register_forward_hook(self._make_hook(name)))
                self._param_layer.update({p: name for p in m.parameters(recurse=False) if p.requires_grad})
        if not param_grads or (emulation is not None and not emulation.rounds_param_grads):
            self._param_layer = {}
        elif emulation is not None:
            emulation.observe_param_grads(self._record_param)
        else:
            for p in self._param_layer:
                self._handles.append(p.register_post_accumulate_grad_hook(lambda p: self._record_param(p, p.grad)))

    def _make_hook(self, name: str):
        def fwd_hook(module, inputs, output):
            if self._armed and isinstance(output, torch.Tensor) and output.requires_grad:
                output.register_hook(lambda g: self._record(name, g))
            return None

        return fwd_hook

    @torch.no_grad()
    def _record(self, name: str, g: torch.Tensor) -> None:
        counts = self.format.census(g)  # [non-zero, subnormal, flushed, saturated], thresholds of the format
        prev = self._counts.get(name)
        self._counts[name] = counts if prev is None else prev + counts
        return None

    @torch.no_grad()
    def _record_param(self, p: torch.Tensor, g: torch.Tensor | None) -> None:
        name = self._param_layer.get(p)
        if not self._armed or name is None or g is None:
            return
        counts = self.format.census(g)
        prev = self._param_counts.get(name)
        self._param_counts[name] = counts if prev is None else prev + counts

    def arm(self) -> None:
        self._armed = True
        self._counts = {}
        self._param_counts = {}

    def disarm(self) -> None:
        self._armed = False

    @property
    def armed(self) -> bool:
        return self._armed

    def read(self) -> dict[str, dict[str, float]]:
        """``layer -> {"nonzero", "underflow_rate", "flush_rate", "saturate_rate"}`` for the last
        armed step (``underflow_rate`` NaN where the format has no per-element subnormal threshold:
        block-scaled gradients), with ``param_flush_rate`` and ``param_saturate_rate`` where the
        layer's parameter gradients were counted."""
        if not self._counts:
            return {}
        names = list(self._counts)
        pnames = [n for n in self._param_counts if n in self._counts]
        allc = torch.stack([self._counts[n] for n in names] + [self._param_counts[n] for n in pnames])
        allc = allc.double().cpu().tolist()  # the one host synchronisation
        out = {}
        for n, (nz, sub, flush, sat) in zip(names, allc):
            out[n] = {
                "nonzero": nz,
                "underflow_rate": (sub / nz if nz else 0.0) if sub >= 0 else float("nan"),
                "flush_rate": flush / nz if nz else 0.0,
                "saturate_rate": sat / nz if nz else 0.0,
            }
        for n, (nz, _, flush, sat) in zip(pnames, allc[len(names) :]):
            out[n].update(
                {"param_flush_rate": flush / nz if nz else 0.0, "param_saturate_rate": sat / nz if nz else 0.0}
            )
        return out

    def remove(self) -> None:
        for h in self._handles:
            h.remove()
        self._handles = []


def summarize(rates: dict[str, dict[str, float]]) -> dict[str, float]:
    """Step metrics from per-layer rates (only layers that received non-zero gradients)."""
    vals = [r for r in rates.values() if r["nonzero"] > 0]
    if not vals:
        return {}
    out = {}
    for key in ("underflow_rate", "flush_rate", "saturate_rate", *PARAM_RATES):
        v = [r[key] for r in vals if key in r and r[key] == r[key]]  # NaN: not measured for this format
        if v:
            out[f"{key}_mean"], out[f"{key}_max"] = sum(v) / len(v), max(v)
    out["layers_mostly_flushed"] = float(sum(r["flush_rate"] > 0.5 for r in vals))
    return out


class LayerHistory:
    """Appends one row per layer per logged step to a CSV in the trial directory (for heatmaps)."""

    FIELDS = [
        "step",
        "layer",
        "underflow_rate",
        "flush_rate",
        "saturate_rate",
        *PARAM_RATES,
        "nonzero",
        "scale",
        "accum_scale",
        "grad_format",
        "subnormal_below",
        "flush_at_or_below",
        "saturate_above",
    ]

    def __init__(self, path: Path, fmt: FloatFormat | None = None) -> None:
        self.path = Path(path)
        #: the gradient format the rates were counted in: its name and thresholds go in every row, so
        #: the heatmaps label what was counted (E4M3's 2^-6, not fp16's 2^-14)
        self.format_columns = {"grad_format": fmt.name, **fmt.thresholds} if fmt is not None else {}

    def append(self, step: int, rates: dict[str, dict[str, float]], scaler_rows: list[dict[str, Any]]) -> None:
        scales = {r.get("layer"): r for r in scaler_rows}
        new = not self.path.exists()
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with self.path.open("a", newline="") as f:
            w = csv.DictWriter(f, fieldnames=self.FIELDS, extrasaction="ignore")
            if new:
                w.writeheader()
            for layer in list(rates) + [n for n in scales if n not in rates]:
                r = rates.get(layer, {})
                s = scales.get(layer, {})
                w.writerow(
                    {
                        "step": step,
                        "layer": layer,
                        "underflow_rate": r.get("underflow_rate", ""),
                        "flush_rate": r.get("flush_rate", ""),
                        "saturate_rate": r.get("saturate_rate", ""),
                        **{k: r.get(k, "") for k in PARAM_RATES},
                        "nonzero": r.get("nonzero", ""),
                        "scale": s.get("scale", ""),
                        "accum_scale": s.get("accum_scale", ""),
                        **self.format_columns,
                    }
                )

    def truncate_after(self, step: int) -> None:
        """On resume, drop rows newer than the checkpoint so the history has no duplicates."""
        if not self.path.exists():
            return
        with self.path.open() as f:
            rows = [r for r in csv.DictReader(f) if int(r["step"]) <= step]
        with self.path.open("w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=self.FIELDS, extrasaction="ignore")
            w.writeheader()
            w.writerows(rows)
