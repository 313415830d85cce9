"""Plots for study reports and for single trials: matplotlib -> PNG.

Every function returns PNG bytes or writes PNG files.  matplotlib is
imported lazily (``lsbench --help`` and the table-only report do not pay for
it) and never through ``pyplot``: figures are plain
:class:`matplotlib.figure.Figure` objects on their own Agg canvas, so no
global pyplot state, backend switch or open-figure list is touched.

Study level (from the MLflow store, for :mod:`lossscale_bench.report`)::

    study_plots(uri, study, runs=...) -> [Plot(name, title, png), ...]

* ``loss``: loss curves per scaling method (one line per trial label: thin
  lines per seed, bold mean over seeds), one panel per (model, batch);
* ``loss_scale``: loss-scale trajectories, log2 y axis;
* ``map``: mAP per method with seed error bars (sample std), diverged,
  failed and running rows marked;
* ``underflow_<label>``: per-layer underflow-rate heatmap (layer x step) of
  one trial per method, from its ``layers/layers_history.csv`` artifact;
* ``scale_<label>``: per-layer scale heatmap (own and accumulated scale,
  log2 colour) of one trial per adaptive method, same artifact.

Histories are read for at most ``seeds_per_label`` runs per label and
``max_curve_runs`` runs in all; layer artifacts for at most
``max_layer_runs`` runs, so a 1,000-run store stays quick to report.

Trial level (called at the end of a trial; the files go to MLflow)::

    trial_plots({"loss": [(step, value), ...], "loss_scale": [...]},
                layers_csv, out_dir) -> [Path, ...]
    run_plots(client, run_id, out_dir)   # the same from the store, logged under plots/
"""

from __future__ import annotations

import io
import math
import re
import tempfile
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

__all__ = [
    "Plot",
    "PlotError",
    "curves_png",
    "map_bars_png",
    "layer_heatmap_png",
    "label_colors",
    "read_layers_csv",
    "metric_histories",
    "study_plots",
    "trial_plots",
    "run_plots",
    "slug",
]

DPI = 100
MAX_POINTS = 2000  # per line: longer histories are subsampled evenly
MAX_STEPS = 1500  # heatmap columns
LAYERS_ARTIFACT = "layers/layers_history.csv"

Series = Sequence[tuple[int, float]]


class PlotError(Exception):
    """Plots cannot be produced (e.g. matplotlib missing); one line for the user."""


@dataclass(frozen=True)
class Plot:
    """One study-level plot: ``name`` is a file-name slug, ``title`` the caption."""

    name: str
    title: str
    png: bytes


# --------------------------------------------------------------------------
# matplotlib plumbing (no pyplot)


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


def _draw_curves(ax, curves: Mapping[str, Sequence[Series]], *, log2: bool, positive: bool,
                 colors: Mapping[str, str] | None) -> int:
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
            ax.plot(c.index, c.values, color=color, lw=1.4, label=label, drawstyle=style,
                    marker="o" if len(c) < 3 else None, ms=4)  # a trial that diverged at once: a dot
            continue
        for c in cleaned:
            ax.plot(c.index, c.values, color=color, lw=0.6, alpha=0.35, drawstyle=style)
        table = pd.concat(cleaned, axis=1).sort_index()
        mean = np.exp2(np.log2(table).mean(axis=1)) if log2 else table.mean(axis=1)  # geometric mean for scales
        ax.plot(mean.index, mean.values, color=color, lw=1.6, label=f"{label} (mean of {len(cleaned)})",
                drawstyle=style)
    return drawn


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


def map_bars_png(
    summary: pd.DataFrame,
    *,
    title: str = "",
    ylabel: str | None = None,
    colors: Mapping[str, str] | None = None,
) -> bytes | None:
    """Bar chart of the mean metric per method, error bars = sample std over seeds.

    ``summary``: :func:`lossscale_bench.report.summarize` rows (one study or
    several); one panel per (model, batch size); mAP metrics in percent.
    Rows without a value are marked on the axis: ``diverged`` (red x),
    ``failed``, ``running``; rows where some seeds diverged say ``k/n div.``
    above the bar.  Returns None for an empty summary.
    """
    from .report import model_name

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
        ax.bar(x, heights, yerr=np.where(np.isnan(means), 0.0, stds), color=bar_colors, alpha=0.85,
               capsize=4, error_kw={"lw": 1.0})
        top = np.nanmax(np.concatenate([means + stds, [1e-9]]))
        top = top if top > 0 else 1.0
        for i, r in g.iterrows():
            n_runs, n_div = int(r["n_runs"]), int(r["n_diverged"])
            if not np.isnan(means[i]):
                note = f"{means[i]:.1f}" if unit == 100.0 else f"{means[i]:.3g}"
                if n_div:
                    note += f"\n{n_div}/{n_runs} div."
                ax.text(i, means[i] + stds[i] + 0.01 * top, note, ha="center", va="bottom", fontsize=7,
                        color="crimson" if n_div else "black")
            elif n_div:
                ax.plot([i], [0], marker="x", color="crimson", ms=10, mew=2.5, clip_on=False)
                ax.text(i, 0.06 * top, "diverged", ha="center", va="bottom", fontsize=8, color="crimson",
                        rotation=90)
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


def _has_values(df: pd.DataFrame | None, column: str) -> bool:
    return df is not None and column in df.columns and bool(df[column].notna().any())


def _edges(centers: np.ndarray) -> np.ndarray:
    c = centers.astype(float)
    if len(c) == 1:
        return np.array([c[0] - 0.5, c[0] + 0.5])
    mid = (c[1:] + c[:-1]) / 2
    return np.concatenate([[c[0] - (mid[0] - c[0])], mid, [c[-1] + (c[-1] - mid[-1])]])


_HEATMAP_LABELS = {
    "underflow_rate": "underflow rate (|g| < 2^-14)",
    "flush_rate": "flush rate (|g| < 2^-25)",
    "scale": "log2 layer scale",
    "accum_scale": "log2 accumulated scale",
}


def layer_heatmap_png(
    table: pd.DataFrame,
    values: Sequence[str] = ("underflow_rate",),
    *,
    title: str = "",
    log2: bool = False,
) -> bytes | None:
    """Heatmap(s) layer x step, one panel per column in ``values``.

    ``table``: rows (step, layer, <value columns>) as in ``layers_history.csv``.
    Rates are drawn on a fixed 0..1 colour scale (power norm, gamma 0.4, so
    small rates show); ``log2`` colours log2 of the value (scales).  Layers
    in forward order (the reverse of the file's, which is backward order);
    missing cells blank.
    Returns None when no column has a value.
    """
    values = [v for v in values if _has_values(table, v)]
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
        mesh = ax.pcolormesh(_edges(steps), np.arange(n_layers + 1) - 0.5, np.ma.masked_invalid(data),
                             cmap=cmap, norm=norm, shading="flat")
        ax.set_ylim(n_layers - 0.5, -0.5)
        ax.set_xlabel("step")
        ax.set_title(_HEATMAP_LABELS.get(col, col), fontsize=9)
        fig.colorbar(mesh, ax=ax, label=("log2 " + col) if log2 else col, shrink=0.9)
    axes[0].set_yticks(np.arange(n_layers))
    axes[0].set_yticklabels(layers, fontsize=max(4, min(8, int(200 / max(n_layers, 1)))))
    axes[0].set_ylabel("layer")
    if title:
        fig.suptitle(title, fontsize=11)
    return _png(fig)


# --------------------------------------------------------------------------
# trial level


def trial_plots(
    metrics: Mapping[str, Sequence[tuple[int, float]]],
    layers_csv: str | Path | None,
    out_dir: str | Path,
) -> list[Path]:
    """PNG files for one trial, written to ``out_dir``; returns the paths written.

    ``metrics``: metric name -> [(step, value), ...]; ``loss`` gives
    ``loss.png``, ``loss_scale`` gives ``loss_scale.png`` (log2 axis).
    ``layers_csv`` (the trial's ``layers_history.csv``; None or missing is
    fine) gives ``underflow_heatmap.png`` and, when it has adaptive scales,
    ``scale_heatmap.png``.  Plots without data are not written.
    """
    out_dir = Path(out_dir)
    written: list[Path] = []

    def put(name: str, png: bytes | None) -> None:
        if png is None:
            return
        out_dir.mkdir(parents=True, exist_ok=True)
        path = out_dir / name
        path.write_bytes(png)
        written.append(path)

    put("loss.png", curves_png({"": {"loss": [metrics.get("loss") or []]}}, ylabel="loss", title="Training loss"))
    put("loss_scale.png", curves_png({"": {"loss scale": [metrics.get("loss_scale") or []]}},
                                     ylabel="loss scale", title="Loss scale", log2=True))
    if layers_csv is not None and Path(layers_csv).is_file() and Path(layers_csv).stat().st_size > 0:
        table = read_layers_csv(layers_csv)
        put("underflow_heatmap.png", layer_heatmap_png(table, ("underflow_rate",),
                                                       title="Per-layer gradient underflow rate"))
        put("scale_heatmap.png", layer_heatmap_png(table, ("scale", "accum_scale"), log2=True,
                                                   title="Per-layer loss scale (adaptive)"))
    return written


# --------------------------------------------------------------------------
# study level (MLflow)


def metric_histories(client, run_ids: Iterable[str], keys: Sequence[str]) -> dict[str, dict[str, list]]:
    """run_id -> metric key -> [(step, value), ...] (one ``get_metric_history`` per run and key)."""
    out: dict[str, dict[str, list[tuple[int, float]]]] = {}
    for rid in run_ids:
        out[rid] = {}
        for key in keys:
            out[rid][key] = [(m.step, m.value) for m in client.get_metric_history(rid, key)]
    return out


def _label_of(r) -> str:
    return str(r["label"]) if "label" in r and not pd.isna(r["label"]) else "?"


def _display_labels(df: pd.DataFrame) -> pd.DataFrame:
    """A copy whose ``label`` says ``label [precision]`` where one label has several precisions
    (as the report's tables do), so such rows are neither averaged together nor confused."""
    df = df.copy()
    labels = df["label"].astype(object).where(df["label"].notna(), "?").astype(str)
    if "precision" in df.columns:
        prec = df["precision"].astype(object).where(df["precision"].notna(), "?").astype(str)
        several = prec.groupby(labels).transform("nunique") > 1
        labels = labels.where(~several, labels + " [" + prec + "]")
    df["label"] = labels
    return df


def _pick(runs: pd.DataFrame, per_label: int, cap: int) -> pd.DataFrame:
    """Up to ``per_label`` runs (lowest seeds) per (model, batch, row, label), ``cap`` in all.

    When the cap cannot give every line ``per_label`` seeds, every line gets
    fewer (at least one), so that no method drops out of the plot first.
    """
    if len(runs) == 0 or cap <= 0:
        return runs.iloc[0:0]
    df = runs.copy()
    df["_seed"] = pd.to_numeric(df.get("seed"), errors="coerce").fillna(1e9)
    df = df.sort_values(["row", "_seed", "trial_id"], kind="stable", na_position="last")
    lines = df.groupby(["model", "batch_size", "row", "label"], dropna=False, sort=False)
    per_label = max(1, min(per_label, cap // max(1, lines.ngroups)))
    picked = lines.head(per_label)
    picked = picked.assign(_nth=picked.groupby(["model", "batch_size", "row", "label"], dropna=False).cumcount())
    picked = picked.sort_values(["_nth", "row"], kind="stable").head(cap)  # first seeds of every line first
    return picked.sort_index().drop(columns=["_seed", "_nth"])


def _group_title(model, bs) -> str:
    from .report import model_name

    return f"{model_name(model)} batch {'?' if pd.isna(bs) else bs}"


def _curve_panels(runs: pd.DataFrame, hist: Mapping[str, Mapping[str, Series]], key: str) -> dict:
    """{'<model> batch <bs>': {label: [series per seed]}} for the runs that logged ``key``."""
    panels: dict[str, dict[str, list]] = {}
    for (model, bs), g in runs.groupby(["model", "batch_size"], dropna=False, sort=True):  # as summarize()
        lines: dict[str, list] = {}
        for _, r in g.iterrows():
            series = hist.get(r["run_id"], {}).get(key)
            if series:
                lines.setdefault(_label_of(r), []).append(series)
        if lines:
            panels[_group_title(model, bs)] = lines
    return panels


def _download_layers(client, run_id: str, dst: Path) -> Path | None:
    try:
        p = Path(client.download_artifacts(run_id, LAYERS_ARTIFACT, str(dst)))
    except Exception:  # no such artifact (trial failed early, telemetry off): no heatmap for it
        return None
    return p if p.is_file() and p.stat().st_size > 0 else None


def _study_plot_list(client, study: str, runs: pd.DataFrame, metric: str, prefix: str, *,
                     max_curve_runs: int, seeds_per_label: int, max_layer_runs: int) -> list[Plot]:
    from .report import summarize

    plots: list[Plot] = []
    summary = _display_labels(summarize(runs, metric))
    runs = _display_labels(runs)
    colors = label_colors(summary["label"])

    # curves: loss and loss scale
    chosen = _pick(runs, seeds_per_label, max_curve_runs)
    keys = [k for k in ("loss", "loss_scale") if k in chosen.columns]
    hist: dict = {}
    if keys and len(chosen):
        # every chosen run (a diverged run's latest loss may be NaN, its history still matters)
        hist = metric_histories(client, chosen["run_id"].tolist(), keys)
    png = curves_png(_curve_panels(chosen, hist, "loss"), ylabel="loss", title=f"{study}: training loss per method",
                     colors=colors)
    if png:
        plots.append(Plot(prefix + "loss", f"{study}: loss curves per scaling method", png))
    png = curves_png(_curve_panels(chosen, hist, "loss_scale"), ylabel="loss scale", log2=True,
                     title=f"{study}: loss-scale trajectories", colors=colors)
    if png:
        plots.append(Plot(prefix + "loss_scale", f"{study}: loss-scale trajectories (log2 axis)", png))

    # mAP bars
    png = map_bars_png(summary, title=f"{study}: {metric} per method (mean ± sample std over seeds)", colors=colors)
    if png:
        plots.append(Plot(prefix + "map", f"{study}: {metric} per method with seed error bars", png))

    # heatmaps: one representative trial per (model, batch, label): finished first, lowest seed
    if max_layer_runs > 0 and len(runs):
        df = runs.copy()
        df["_rank"] = df["status"].map({"finished": 0, "diverged": 1}).fillna(2)
        df["_seed"] = pd.to_numeric(df.get("seed"), errors="coerce").fillna(1e9)
        df = df[df["_rank"] < 2].sort_values(["row", "_rank", "_seed", "trial_id"], kind="stable", na_position="last")
        reps = df.groupby(["model", "batch_size", "row", "label"], dropna=False, sort=False).head(1)
        several_groups = runs.groupby(["model", "batch_size"], dropna=False).ngroups > 1
        with tempfile.TemporaryDirectory(prefix="lsbench-plots-") as tmp:
            for i, (_, r) in enumerate(reps.head(max_layer_runs).iterrows()):
                path = _download_layers(client, r["run_id"], Path(tmp) / str(i))
                if path is None:
                    continue
                try:
                    table = read_layers_csv(path)
                except (ValueError, pd.errors.ParserError, pd.errors.EmptyDataError):
                    continue
                label = _label_of(r)
                seed = "?" if pd.isna(r.get("seed")) else r["seed"]
                where = f"{_group_title(r['model'], r['batch_size'])}, seed {seed}"
                tag = slug(label) + (f"_{slug(r['model'])}_b{r['batch_size']}" if several_groups else "")
                png = layer_heatmap_png(table, ("underflow_rate",),
                                        title=f"{study}: per-layer underflow rate, {label} ({where})")
                if png:
                    plots.append(Plot(f"{prefix}underflow_{tag}",
                                      f"{study}: per-layer underflow-rate heatmap, {label} ({where})", png))
                if str(r.get("method") or "").lower() == "adaptive" or _has_values(table, "scale"):
                    png = layer_heatmap_png(table, ("scale", "accum_scale"), log2=True,
                                            title=f"{study}: per-layer loss scale, {label} ({where})")
                    if png:
                        plots.append(Plot(f"{prefix}scale_{tag}",
                                          f"{study}: per-layer scale heatmap, {label} ({where})", png))
    return plots


def run_plots(client, run_id: str, out_dir: str | Path, *, log: bool = True,
              artifact_path: str = "plots") -> list[Path]:
    """:func:`trial_plots` for one MLflow run, from the store alone.

    Reads the run's ``loss`` and ``loss_scale`` histories (the whole trial,
    across resumes) and its ``layers/layers_history.csv`` artifact, writes the
    PNGs to ``out_dir`` and, with ``log``, logs them to the run under
    ``artifact_path``.  ``client``: an ``MlflowClient`` or a tracking URI.
    """
    if isinstance(client, str):
        from mlflow import MlflowClient

        client = MlflowClient(tracking_uri=client)
    metrics = metric_histories(client, [run_id], ("loss", "loss_scale"))[run_id]
    with tempfile.TemporaryDirectory(prefix="lsbench-plots-") as tmp:
        layers = _download_layers(client, run_id, Path(tmp))
        paths = trial_plots(metrics, layers, out_dir)
    if log:
        for path in paths:
            client.log_artifact(run_id, str(path), artifact_path)
    return paths


def study_plots(
    tracking_uri: str,
    study: str | None = None,
    *,
    runs: pd.DataFrame | None = None,
    metric: str = "final_map",
    max_curve_runs: int = 48,
    seeds_per_label: int = 3,
    max_layer_runs: int = 8,
) -> list[Plot]:
    """The study-level plots of ``study`` (every study in ``runs`` when None).

    ``runs``: :func:`lossscale_bench.report.load_runs` output (loaded when
    None).  With ``study=None`` plot names are prefixed by the study's slug.
    """
    from mlflow import MlflowClient

    from .report import load_runs

    if runs is None:
        runs = load_runs(tracking_uri, study)
    client = MlflowClient(tracking_uri=tracking_uri)
    out: list[Plot] = []
    for name, g in runs.groupby("study", dropna=False, sort=False):
        prefix = "" if study is not None else slug(str(name)) + "_"
        out += _study_plot_list(client, str(name), g, metric, prefix, max_curve_runs=max_curve_runs,
                                seeds_per_label=seeds_per_label, max_layer_runs=max_layer_runs)
    return out
