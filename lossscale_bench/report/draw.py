"""Line plots and bar charts: data in, PNG bytes out (matplotlib, no MLflow).

* :func:`curves_png`: line plots (loss, loss scale), thin line per seed,
  bold mean;
* :func:`map_bars_png`: mean metric per method with seed error bars, from
  :func:`lossscale_bench.report.summary.summarize` rows.

The figure plumbing (no pyplot, lazy matplotlib) is in :mod:`.figure`; the layer x step
heatmaps in :mod:`.heatmap`.  :mod:`lossscale_bench.report.plots` builds the trial and
study plots from these.  The only report module used here is the
summary layer (:mod:`lossscale_bench.report.summary`, for model names).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence

import numpy as np
import pandas as pd

from .figure import panel_grid, png_bytes, quiet_numerics
from .runs import model_name

__all__ = ["curves_png", "map_bars_png", "label_colors"]

MAX_POINTS = 2000  # per line: longer histories are subsampled evenly

Series = Sequence[tuple[int, float]]


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


@quiet_numerics
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
    fig, axes = panel_grid(len(panels))
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
    return png_bytes(fig)


@quiet_numerics
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
    fig, axes = panel_grid(len(groups), panel_w=max(5.0, 0.9 * widest + 2.0), panel_h=4.2)
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
    return png_bytes(fig)
