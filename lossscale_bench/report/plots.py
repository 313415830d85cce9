"""Plots for study reports and for single trials: matplotlib -> PNG.

Every function returns PNG bytes or writes PNG files.  The drawing itself
(matplotlib, lazily imported, no pyplot) is in :mod:`lossscale_bench.report.draw`
(curves, bars) and :mod:`lossscale_bench.report.heatmap` (layer heatmaps), with the figure
plumbing in :mod:`lossscale_bench.report.figure`; this module picks the data: from a
trial's own histories, or from the MLflow store.  Of the report it uses only
the summary layer (:mod:`lossscale_bench.report.summary`), never the table
renderers or :mod:`lossscale_bench.report.write`, which calls in here.

Study level (from the MLflow store, for :mod:`lossscale_bench.report.write`)::

    study_plots(uri, study, runs=...) -> [Plot(name, title, png), ...]

* ``loss``: loss curves per scaling method (one line per trial label: thin
  lines per seed, bold mean over seeds), one panel per (model, batch);
* ``loss_scale``: loss-scale trajectories, log2 y axis;
* ``map``: mAP per method with seed error bars (sample std), diverged,
  failed and running rows marked;
* ``underflow_<label>``: per-layer underflow-rate heatmap (layer x step) of
  one trial per method, from its ``layers/layers_history.csv`` artifact;
* ``scale_<label>``: per-layer scale heatmap (own and accumulated scale,
  log2 colour) of one trial per per-layer method (any that logs layer scales), same artifact.

Histories are read for at most ``seeds_per_label`` runs per label and
``max_curve_runs`` runs in all; layer artifacts for at most
``max_layer_runs`` runs, so a 1,000-run store stays quick to report.

Trial level (called at the end of a trial; the files go to MLflow)::

    trial_plots({"loss": [(step, value), ...], "loss_scale": [...]},
                layers_csv, out_dir) -> [Path, ...]
    run_plots(client, run_id, out_dir)   # the same from the store, logged under plots/
"""

from __future__ import annotations

import tempfile
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from .draw import Series, curves_png, label_colors, map_bars_png
from .figure import slug
from .heatmap import has_values, layer_heatmap_png, rate_columns, read_layers_csv
from .runs import load_runs, model_name
from .summary import latest_setting, summarize

__all__ = ["Plot", "metric_histories", "study_plots", "trial_plots", "run_plots"]

LAYERS_ARTIFACT = "layers/layers_history.csv"


@dataclass(frozen=True)
class Plot:
    """One study-level plot: ``name`` is a file-name slug, ``title`` the caption."""

    name: str
    title: str
    png: bytes


# --------------------------------------------------------------------------
# trial level


def trial_plots(
    metrics: Mapping[str, Sequence[tuple[int, float]]], layers_csv: str | Path | None, out_dir: str | Path
) -> list[Path]:
    """PNG files for one trial, written to ``out_dir``; returns the paths written.

    ``metrics``: metric name -> [(step, value), ...]; ``loss`` gives
    ``loss.png``, ``loss_scale`` gives ``loss_scale.png`` (log2 axis).
    ``layers_csv`` (the trial's ``layers_history.csv``; None or missing is
    fine) gives ``underflow_heatmap.png`` and, when a per-layer method filled its scales,
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
    put(
        "loss_scale.png",
        curves_png(
            {"": {"loss scale": [metrics.get("loss_scale") or []]}}, ylabel="loss scale", title="Loss scale", log2=True
        ),
    )
    if layers_csv is not None and Path(layers_csv).is_file() and Path(layers_csv).stat().st_size > 0:
        table = read_layers_csv(layers_csv)
        put(
            "underflow_heatmap.png",
            layer_heatmap_png(table, rate_columns(table), title="Per-layer gradient underflow, flush and saturation"),
        )
        put(
            "scale_heatmap.png",
            layer_heatmap_png(table, ("scale", "accum_scale"), log2=True, title="Per-layer loss scale"),
        )
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


def _layer_heatmap_plots(client, study: str, runs: pd.DataFrame, prefix: str, max_layer_runs: int) -> list[Plot]:
    """Layer heatmaps of one representative trial per (model, batch, label): finished first, lowest seed."""
    plots: list[Plot] = []
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
            png = layer_heatmap_png(
                table,
                rate_columns(table),
                title=f"{study}: per-layer underflow, flush and saturation, {label} ({where})",
            )
            if png:
                plots.append(
                    Plot(
                        f"{prefix}underflow_{tag}", f"{study}: per-layer underflow-rate heatmap, {label} ({where})", png
                    )
                )
            if has_values(table, "scale"):  # the per-layer methods log a scale per layer
                png = layer_heatmap_png(
                    table,
                    ("scale", "accum_scale"),
                    log2=True,
                    title=f"{study}: per-layer loss scale, {label} ({where})",
                )
                if png:
                    plots.append(
                        Plot(f"{prefix}scale_{tag}", f"{study}: per-layer scale heatmap, {label} ({where})", png)
                    )
    return plots


def _study_plot_list(
    client,
    study: str,
    runs: pd.DataFrame,
    metric: str,
    prefix: str,
    *,
    max_curve_runs: int,
    seeds_per_label: int,
    max_layer_runs: int,
) -> list[Plot]:
    plots: list[Plot] = []
    runs = latest_setting(runs)  # a study whose file changed: its latest configuration (the report has all)
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
    png = curves_png(
        _curve_panels(chosen, hist, "loss"), ylabel="loss", title=f"{study}: training loss per method", colors=colors
    )
    if png:
        plots.append(Plot(prefix + "loss", f"{study}: loss curves per scaling method", png))
    png = curves_png(
        _curve_panels(chosen, hist, "loss_scale"),
        ylabel="loss scale",
        log2=True,
        title=f"{study}: loss-scale trajectories",
        colors=colors,
    )
    if png:
        plots.append(Plot(prefix + "loss_scale", f"{study}: loss-scale trajectories (log2 axis)", png))

    # mAP bars
    png = map_bars_png(summary, title=f"{study}: {metric} per method (mean ± sample std over seeds)", colors=colors)
    if png:
        plots.append(Plot(prefix + "map", f"{study}: {metric} per method with seed error bars", png))

    # heatmaps: one representative trial per (model, batch, label): finished first, lowest seed
    if max_layer_runs > 0 and len(runs):
        plots += _layer_heatmap_plots(client, study, runs, prefix, max_layer_runs)
    return plots


def run_plots(
    client, run_id: str, out_dir: str | Path, *, log: bool = True, artifact_path: str = "plots"
) -> list[Path]:
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

    ``runs``: :func:`lossscale_bench.report.summary.load_runs` output (loaded when
    None).  With ``study=None`` plot names are prefixed by the study's slug.
    """
    from mlflow import MlflowClient

    if runs is None:
        runs = load_runs(tracking_uri, study)
    client = MlflowClient(tracking_uri=tracking_uri)
    out: list[Plot] = []
    for name, g in runs.groupby("study", dropna=False, sort=False):
        prefix = "" if study is not None else slug(str(name)) + "_"
        out += _study_plot_list(
            client,
            str(name),
            g,
            metric,
            prefix,
            max_curve_runs=max_curve_runs,
            seeds_per_label=seeds_per_label,
            max_layer_runs=max_layer_runs,
        )
    return out
