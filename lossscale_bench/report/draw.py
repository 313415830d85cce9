"""Plot primitives: data in, PNG bytes out (matplotlib, no MLflow).

matplotlib is imported lazily (``lsbench --help`` and the table-only report
do not pay for it) and never through ``pyplot``: figures are plain
:class:`matplotlib.figure.Figure` objects on their own Agg canvas, so no
global pyplot state, backend switch or open-figure list is touched.

* :func:`curves_png`: line plots (loss, loss scale), thin line per seed,
  bold mean;
* :func:`map_bars_png`: mean metric per method with seed error bars, from
  :func:`lossscale_bench.report.summary.summarize` rows;
* :func:`layer_heatmap_png`: layer x step heatmaps from a
  ``layers_history.csv`` (:func:`read_layers_csv`).

:mod:`lossscale_bench.report.plots` builds the trial and study plots from these
(and re-exports them).  The only report module used here is the summary
layer (:mod:`lossscale_bench.report.summary`, for model names).
"""

from __future__ import annotations

import io
import math
import re
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

import numpy as np
import pandas as pd

from .summary import model_name

__all__ = [
    "PlotError",
    "curves_png",
    "map_bars_png",
    "layer_heatmap_png",
    "label_colors",
    "read_layers_csv",
    "slug",
    "has_values",
]

DPI = 100
MAX_POINTS = 2000  # per line: longer histories are subsampled evenly
MAX_STEPS = 1500  # heatmap columns

Series = Sequence[tuple[int, float]]


class PlotError(Exception):
    """Plots cannot be produced (e.g. matplotlib missing); one line for the user."""


# --------------------------------------------------------------------------
# matplotlib plumbing (no pyplot)


def _quiet_numerics(fn):
    """Run a plotting function with numpy's and matplotlib's overflow warnings off.

    Why: a diverged or refused run can log a scale near or past float range (1e300 seen in a store);
    ``exp2`` of a mean log2 and matplotlib's autoscaling then overflow to inf, which only means the
    line leaves the axes. The warnings were the only library lines left on the terminal after a run;
    the figure is the same with or without them."""
    import functools
    import warnings

    @functools.wraps(fn)
    def quiet(*args, **kwargs):
        with np.errstate(all="ignore"), warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            return fn(*args, **kwargs)

    return quiet


def _figure(width: float, height: float):
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError as e:  # pragma: no cover - matplotlib is a dependency
        raise PlotError(f"matplotlib is not installed ({e}); install it or turn plots off") from None
    fig = Figure(figsize=(width, height), dpi=DPI, layout="constrained")
    FigureCanvasAgg(fig)
    return fig


def _png(fig) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=DPI, metadata={"Software": None})
    fig.clear()
    return buf.getvalue()


def _grid(n: int, panel_w: float = 6.4, panel_h: float = 3.6, ncols_max: int = 2):
    ncols = max(1, min(ncols_max, n))
    nrows = max(1, math.ceil(n / ncols))
    fig = _figure(panel_w * ncols, panel_h * nrows)
    axes = fig.subplots(nrows, ncols, squeeze=False).ravel().tolist()
    for ax in axes[n:]:
        ax.set_visible(False)
    return fig, axes[:n]


def slug(text: str) -> str:
    """'loss scale (dynamic, interval=10)' -> 'loss_scale_dynamic_interval_10'."""
    s = re.sub(r"[^A-Za-z0-9]+", "_", str(text)).strip("_").lower()
    return s or "x"


# --------------------------------------------------------------------------
# data cleaning


def _clean(series: Iterable[tuple[int, float]] | None, max_points: int = MAX_POINTS) -> tuple[np.ndarray, np.ndarray]:
    """Finite points, one per step (the last one logged), by step, at most ``max_points``."""
    by_step: dict[int, float] = {}
    for step, value in series or ():
        try:
            v = float(value)
            s = int(step)
        except (TypeError, ValueError):
            continue
        if math.isfinite(v):
            by_step[s] = v
    if not by_step:
        return np.empty(0, dtype=np.int64), np.empty(0)
    steps = np.array(sorted(by_step), dtype=np.int64)
    values = np.array([by_step[s] for s in steps.tolist()], dtype=float)
    if len(steps) > max_points:
        idx = np.unique(np.linspace(0, len(steps) - 1, max_points).round().astype(int))
        steps, values = steps[idx], values[idx]
    return steps, values


SMOOTH_MIN = 200  # points: longer series are drawn smoothed (raw underneath, faint)


def _smooth(c: pd.Series) -> pd.Series:
    if len(c) <= SMOOTH_MIN:
        return c
    return c.rolling(max(2, len(c) // 50), min_periods=1, center=True).mean()


# --------------------------------------------------------------------------
# plot primitives (data in, PNG out)


def _color(label: str, i: int, colors: Mapping[str, str] | None) -> str:
    return (colors or {}).get(label) or f"C{i % 10}"


def label_colors(labels: Iterable[str]) -> dict[str, str]:
    """One colour per label, in order (the same label has the same colour in every study plot)."""
    out: dict[str, str] = {}
    for label in labels:
        if label not in out:
            out[label] = f"C{len(out) % 10}"
    return out


def _draw_curves(
    ax, curves: Mapping[str, Sequence[Series]], *, log2: bool, positive: bool, colors: Mapping[str, str] | None
) -> int:
    """Thin line per seed, bold mean per label; returns the number of labels drawn."""
    drawn = 0
    for i, (label, seeds) in enumerate(curves.items()):
        color = _color(label, i, colors)
        cleaned = []
        for series in seeds:
            s, v = _clean(series)
            if positive:
                keep = v > 0
                s, v = s[keep], v[keep]
            if len(s):
                cleaned.append(pd.Series(v, index=s))
        if not cleaned:
            continue
        drawn += 1
        style = "steps-post" if log2 else "default"
        if not log2:  # noisy losses: a centred running mean over ~2% of the points
            raw = cleaned
            cleaned = [_smooth(c) for c in cleaned]
            if len(raw) == 1 and any(len(r) > SMOOTH_MIN for r in raw):
                ax.plot(raw[0].index, raw[0].values, color=color, lw=0.5, alpha=0.3)
        if len(cleaned) == 1:
            c = cleaned[0]
            ax.plot(
                c.index,
                c.values,
                color=color,
                lw=1.4,
                label=label,
                drawstyle=style,
                marker="o" if len(c) < 3 else None,
                ms=4,
            )  # a trial that diverged at once: a dot
            continue
        for c in cleaned:
            ax.plot(c.index, c.values, color=color, lw=0.6, alpha=0.35, drawstyle=style)
        table = pd.concat(cleaned, axis=1).sort_index()
        mean = np.exp2(np.log2(table).mean(axis=1)) if log2 else table.mean(axis=1)  # geometric mean for scales
        ax.plot(
            mean.index, mean.values, color=color, lw=1.6, label=f"{label} (mean of {len(cleaned)})", drawstyle=style
        )
    return drawn


@_quiet_numerics
def curves_png(
    panels: Mapping[str, Mapping[str, Sequence[Series]]],
    *,
    ylabel: str,
    title: str = "",
    log2: bool = False,
    colors: Mapping[str, str] | None = None,
) -> bytes | None:
    """Line plot(s): ``panels`` maps panel title -> {line label -> [series per seed]}.

    A series is ``[(step, value), ...]``; non-finite values are dropped (a
    diverged run's line ends at its last finite value).  Several seeds: thin
    line each, bold mean (geometric on a log2 axis).  Series longer than
    ``SMOOTH_MIN`` points are drawn as a running mean (linear axis).
    ``log2``: log2 y axis (non-positive values dropped).  ``colors``: label
    -> matplotlib colour.  Returns None when nothing is drawable.
    """
    panels = {k: v for k, v in panels.items() if v}
    if not panels:
        return None
    fig, axes = _grid(len(panels))
    total = 0
    for ax, (ptitle, curves) in zip(axes, panels.items()):
        n = _draw_curves(ax, curves, log2=log2, positive=log2, colors=colors)
        total += n
        ax.set_xlabel("step")
        ax.set_ylabel(ylabel)
        if ptitle:
            ax.set_title(ptitle, fontsize=10)
        ax.grid(True, alpha=0.3)
        if log2 and n:
            ax.set_yscale("log", base=2)
        if n > 4:  # many methods: the legend beside the axes, not over the lines
            ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0.0)
        elif n:
            ax.legend(fontsize=7, loc="best")
        else:
            ax.text(0.5, 0.5, "no data", ha="center", va="center", transform=ax.transAxes, color="grey")
    if title:
        fig.suptitle(title, fontsize=11)
    if total == 0:
        fig.clear()
        return None
    return _png(fig)


@_quiet_numerics
def map_bars_png(
    summary: pd.DataFrame, *, title: str = "", ylabel: str | None = None, colors: Mapping[str, str] | None = None
) -> bytes | None:
    """Bar chart of the mean metric per method, error bars = sample std over seeds.

    ``summary``: :func:`lossscale_bench.report.summary.summarize` rows (one study or
    several); one panel per (model, batch size); mAP metrics in percent.
    Rows without a value are marked on the axis: ``diverged`` (red x),
    ``failed``, ``running``; rows where some seeds diverged say ``k/n div.``
    above the bar.  Returns None for an empty summary.
    """
    if summary is None or len(summary) == 0:
        return None
    metric = str(summary["metric"].iloc[0]) if "metric" in summary.columns else "map"
    unit = 100.0 if "map" in metric.lower() else 1.0
    if ylabel is None:
        ylabel = f"{metric} (%)" if unit == 100.0 else metric
    groups = list(summary.groupby(["model", "batch_size"], dropna=False, sort=False))
    widest = max(len(g) for _, g in groups)
    fig, axes = _grid(len(groups), panel_w=max(5.0, 0.9 * widest + 2.0), panel_h=4.2)
    for ax, ((model, bs), g) in zip(axes, groups):
        g = g.reset_index(drop=True)
        x = np.arange(len(g))
        means = g["mean"].astype(float).to_numpy() * unit
        stds = g["std"].astype(float).fillna(0.0).to_numpy() * unit
        heights = np.where(np.isnan(means), 0.0, means)
        bar_colors = [_color(str(lab), i, colors) for i, lab in enumerate(g["label"])]
        ax.bar(
            x,
            heights,
            yerr=np.where(np.isnan(means), 0.0, stds),
            color=bar_colors,
            alpha=0.85,
            capsize=4,
            error_kw={"lw": 1.0},
        )
        top = np.nanmax(np.concatenate([means + stds, [1e-9]]))
        top = top if top > 0 else 1.0
        for i, r in g.iterrows():
            n_runs, n_div = int(r["n_runs"]), int(r["n_diverged"])
            if not np.isnan(means[i]):
                note = f"{means[i]:.1f}" if unit == 100.0 else f"{means[i]:.3g}"
                if n_div:
                    note += f"\n{n_div}/{n_runs} div."
                ax.text(
                    i,
                    means[i] + stds[i] + 0.01 * top,
                    note,
                    ha="center",
                    va="bottom",
                    fontsize=7,
                    color="crimson" if n_div else "black",
                )
            elif n_div:
                ax.plot([i], [0], marker="x", color="crimson", ms=10, mew=2.5, clip_on=False)
                ax.text(i, 0.06 * top, "diverged", ha="center", va="bottom", fontsize=8, color="crimson", rotation=90)
            else:
                word = "failed" if int(r["n_failed"]) else "running"
                ax.text(i, 0.04 * top, word, ha="center", va="bottom", fontsize=8, color="grey", rotation=90)
        ax.set_xticks(x)
        ax.set_xticklabels([str(lab) for lab in g["label"]], rotation=30, ha="right", fontsize=8)
        ax.set_ylim(0, top * 1.18)
        ax.set_ylabel(ylabel)
        bs_text = "?" if pd.isna(bs) else str(bs)
        ax.set_title(f"{model_name(model)} batch {bs_text}", fontsize=10)
        ax.grid(True, axis="y", alpha=0.3)
    if title:
        fig.suptitle(title, fontsize=11)
    return _png(fig)


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


@_quiet_numerics
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
    fig = _figure(width, height)
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
    return _png(fig)
