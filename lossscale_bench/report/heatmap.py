"""Layer x step heatmaps of a trial's ``layers_history.csv``: underflow, flush and saturation rates, scales.

:func:`read_layers_csv` reads the history; :func:`layer_heatmap_png` draws one panel per column
(rates on a fixed 0..1 colour scale, scales as log2), titled by :func:`heatmap_label` with the
threshold each rate was counted against.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pandas as pd

from .figure import new_figure, png_bytes, quiet_numerics

__all__ = ["MAX_STEPS", "read_layers_csv", "rate_columns", "has_values", "heatmap_label", "layer_heatmap_png"]

MAX_STEPS = 1500  # heatmap columns


def read_layers_csv(path: str | Path) -> pd.DataFrame:
    """``layers_history.csv`` -> DataFrame (step int, rates/scales float, blanks NaN)."""
    df = pd.read_csv(path)
    if "step" not in df.columns or "layer" not in df.columns:
        raise ValueError(f"{path}: not a layers history (needs step and layer columns)")
    df["step"] = pd.to_numeric(df["step"], errors="coerce")
    df = df.dropna(subset=["step"])
    df["step"] = df["step"].astype(np.int64)
    df["layer"] = df["layer"].astype(str)
    for c in df.columns:
        if c not in ("step", "layer"):
            df[c] = pd.to_numeric(df[c], errors="coerce")
    return df


def rate_columns(table) -> tuple[str, ...]:
    """The rate panels a layer history can fill: underflow (where the format has a subnormal
    threshold), flush, and saturation of activation gradients, and saturation of parameter
    gradients (histories written since each was counted)."""
    cols = tuple(
        c for c in ("underflow_rate", "flush_rate", "saturate_rate", "param_saturate_rate") if has_values(table, c)
    )
    return cols or ("underflow_rate",)


def has_values(df: pd.DataFrame | None, column: str) -> bool:
    """Whether ``df`` has a ``column`` with at least one value."""
    return df is not None and column in df.columns and bool(df[column].notna().any())


def _edges(centers: np.ndarray) -> np.ndarray:
    c = centers.astype(float)
    if len(c) == 1:
        return np.array([c[0] - 0.5, c[0] + 0.5])
    mid = (c[1:] + c[:-1]) / 2
    return np.concatenate([[c[0] - (mid[0] - c[0])], mid, [c[-1] + (c[-1] - mid[-1])]])


_HEATMAP_LABELS = {
    "underflow_rate": "underflow rate (subnormal)",
    "flush_rate": "flush rate (to zero)",
    "saturate_rate": "saturation rate (past the max)",
    "param_saturate_rate": "parameter-gradient saturation rate",
    "scale": "log2 layer scale",
    "accum_scale": "log2 accumulated scale",
}
#: the layer history's threshold column behind each rate (telemetry.LayerHistory)
_THRESHOLD_OF = {
    "underflow_rate": ("subnormal_below", "|g| < "),
    "flush_rate": ("flush_at_or_below", "|g| <= "),
    "saturate_rate": ("saturate_above", "|g| > "),
    "param_saturate_rate": ("saturate_above", "|g| > "),
}


def _pow2(x: float) -> str:
    e = math.log2(x)
    return f"2^{int(e)}" if e == int(e) else f"{x:.3g}"


def heatmap_label(table: pd.DataFrame, col: str) -> str:
    """A rate's panel title with the threshold it was counted against, read from the gradient
    format the trial logged (older histories without it: no threshold, rather than fp16's)."""
    base = _HEATMAP_LABELS.get(col, col)
    key, words = _THRESHOLD_OF.get(col, (None, ""))
    if key is None or key not in table.columns or "grad_format" not in table.columns:
        return base
    vals = pd.to_numeric(table[key], errors="coerce").dropna().unique()
    fmt = table["grad_format"].dropna().astype(str).unique()
    if len(vals) != 1 or len(fmt) != 1:
        return f"{base}, {fmt[0]}" if len(fmt) == 1 else base
    return f"{base} ({words}{_pow2(float(vals[0]))}, {fmt[0]})"


@quiet_numerics
def layer_heatmap_png(
    table: pd.DataFrame, values: Sequence[str] = ("underflow_rate",), *, title: str = "", log2: bool = False
) -> bytes | None:
    """Heatmap(s) layer x step, one panel per column in ``values``.

    ``table``: rows (step, layer, <value columns>) as in ``layers_history.csv``.
    Rates are drawn on a fixed 0..1 colour scale (power norm, gamma 0.4, so
    small rates show); ``log2`` colours log2 of the value (scales).  Layers
    in forward order (the reverse of the file's, which is backward order);
    missing cells blank.
    Returns None when no column has a value.
    """
    values = [v for v in values if has_values(table, v)]
    if not values:
        return None
    from matplotlib.colors import Normalize, PowerNorm

    # the probe writes a step's layers in the order their gradients arrive (backward): reversed,
    # the input side is at the top and the heads at the bottom
    layers = list(reversed(pd.unique(table["layer"]).tolist()))
    steps = np.array(sorted(table["step"].unique()), dtype=np.int64)
    if len(steps) > MAX_STEPS:
        steps = steps[np.unique(np.linspace(0, len(steps) - 1, MAX_STEPS).round().astype(int))]
    n_layers = len(layers)
    height = min(16.0, max(3.2, 0.2 * n_layers + 1.6))
    width = 7.0 * len(values) + 1.5
    fig = new_figure(width, height)
    axes = fig.subplots(1, len(values), squeeze=False, sharey=True).ravel()
    for ax, col in zip(axes, values):
        grid = (
            table.drop_duplicates(subset=["layer", "step"], keep="last")
            .pivot(index="layer", columns="step", values=col)
            .reindex(index=layers, columns=steps)
        )
        data = grid.to_numpy(dtype=float)
        if log2:
            with np.errstate(divide="ignore", invalid="ignore"):
                data = np.where(data > 0, np.log2(data), np.nan)
            lo, hi = np.nanmin(data), np.nanmax(data)
            if lo == hi:
                lo, hi = lo - 0.5, hi + 0.5
            norm, cmap = Normalize(vmin=lo, vmax=hi), "viridis"
        else:  # rates: the same 0..1 scale for every trial, stretched so that a few percent shows
            norm, cmap = PowerNorm(gamma=0.4, vmin=0.0, vmax=1.0), "magma"
        mesh = ax.pcolormesh(
            _edges(steps),
            np.arange(n_layers + 1) - 0.5,
            np.ma.masked_invalid(data),
            cmap=cmap,
            norm=norm,
            shading="flat",
        )
        ax.set_ylim(n_layers - 0.5, -0.5)
        ax.set_xlabel("step")
        ax.set_title(heatmap_label(table, col), fontsize=9)
        fig.colorbar(mesh, ax=ax, label=("log2 " + col) if log2 else col, shrink=0.9)
    axes[0].set_yticks(np.arange(n_layers))
    axes[0].set_yticklabels(layers, fontsize=max(4, min(8, int(200 / max(n_layers, 1)))))
    axes[0].set_ylabel("layer")
    if title:
        fig.suptitle(title, fontsize=11)
    return png_bytes(fig)
