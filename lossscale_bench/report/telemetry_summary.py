"""Per-row telemetry of a study: what the gradients went through, beside the mAP table.

Why: a row's mAP says *that* a method helped or hurt; its telemetry says *why*:
the share of gradient elements the format flushed or saturated (activation
gradients at each conv/linear output, and those layers' parameter gradients),
the loss scale it ran at, and how many steps it skipped. ``lsbench report
--telemetry`` prints one line per table row, the means over the run's logged
steps, then over seeds (min–max across seeds where they differ by much), read
from the metric histories in the store (one call per metric and run).
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

# the ending of every per-layer scaler's layer-scale metric (written by scaling/per_layer/scaler.py): the
# layer-scale column finds it by the ending, so no method is named here
from ..core.registry import LAYER_SCALE_SUFFIX
from .runs import ReportError, load_runs

if TYPE_CHECKING:
    import pandas as pd

__all__ = ["TELEMETRY_COLUMNS", "telemetry_rows", "render_telemetry_markdown"]

#: column -> (metric, how a run's history becomes one number)
TELEMETRY_COLUMNS: dict[str, tuple[str, str]] = {
    "flushed (act. grads)": ("flush_rate_mean", "mean"),
    "saturated (act. grads)": ("saturate_rate_mean", "mean"),
    "saturated, worst layer": ("saturate_rate_max", "mean"),
    "flushed (param. grads)": ("param_flush_rate_mean", "mean"),
    "saturated (param. grads)": ("param_saturate_rate_mean", "mean"),
    "saturated (param.), worst layer": ("param_saturate_rate_max", "mean"),
    "loss scale, first": ("loss_scale", "first"),
    "loss scale, last": ("loss_scale", "last"),
    "layer scale log2, median (last)": ("", "layer_scale"),
    "skipped steps": ("skipped_steps_total", "last"),
}
_RATES = {c for c, (m, _) in TELEMETRY_COLUMNS.items() if m.endswith(("_mean", "_max")) and "rate" in m}


def _one_per_step(history: list) -> list:
    """The history with one point per step, the last logged (by time) where a step has several.

    Stores written before a rerun's repeated steps were kept out (``tracking.attempts``) hold
    the steps a failed attempt logged after its checkpoint twice; averaged as they are, those
    steps would count double.
    """
    last: dict = {}
    for m in sorted(history, key=lambda m: (m.step, m.timestamp)):
        last[m.step] = m
    return list(last.values())


def _reduce(history: list, how: str) -> float:
    vals = [m.value for m in _one_per_step(history) if m.value == m.value]
    if not vals:
        return math.nan
    if how == "first":
        return vals[0]
    if how == "last":
        return vals[-1]
    return sum(vals) / len(vals)


def _run_values(client, run_id: str) -> dict[str, float]:
    out = {}
    for col, (metric, how) in TELEMETRY_COLUMNS.items():
        if how == "layer_scale":
            names = sorted(k for k in client.get_run(run_id).data.metrics if k.endswith(LAYER_SCALE_SUFFIX))
            out[col] = next(
                (v for v in (_reduce(client.get_metric_history(run_id, m), "last") for m in names) if v == v), math.nan
            )
        else:
            out[col] = _reduce(client.get_metric_history(run_id, metric), how)
    return out


def telemetry_rows(tracking_uri: str, study: str | None = None) -> pd.DataFrame:
    """One row per (model, batch size, label, precision) with the telemetry means over its seeds.

    Columns: ``label``, ``precision``, ``n`` (seeds), then :data:`TELEMETRY_COLUMNS`, each
    a mean over seeds, with ``<column> min`` and ``<column> max`` across seeds beside it.
    """
    import pandas as pd
    from mlflow import MlflowClient

    runs = load_runs(tracking_uri, study)
    kept = runs["status"].isin(["finished", "diverged"])
    left_out = _left_out(runs[~kept])
    runs = runs[kept]
    if not len(runs):
        raise ReportError(
            f"no finished or diverged trial runs for {study or 'any study'} in {tracking_uri}"
            + (f" ({left_out})" if left_out else "")
        )
    client = MlflowClient(tracking_uri=tracking_uri)
    records = [
        {
            "model": r.model,
            "batch_size": r.batch_size,
            "row": r.row,
            "label": r.label,
            "precision": r.precision,
            **_run_values(client, r.run_id),
        }
        for r in runs.itertuples()
    ]
    df = pd.DataFrame(records)
    keys = ["model", "batch_size", "row", "label", "precision"]
    cols = list(TELEMETRY_COLUMNS)
    grouped = df.groupby(keys, dropna=False, sort=True)
    out = grouped[cols].mean()
    lo, hi = grouped[cols].min(), grouped[cols].max()
    for c in cols:
        out[f"{c} min"], out[f"{c} max"] = lo[c], hi[c]
    out["n"] = grouped.size()
    out = out.reset_index()
    out.attrs["left_out"] = left_out
    return out


def _left_out(runs: pd.DataFrame) -> str:
    """Which trials the table leaves out (failed, running, ...), in words; '' when none.

    Only finished and diverged trials have a whole history to average; the others are
    named under the table, so that a row's ``n`` short of the study's seeds is explained.
    """
    if not len(runs):
        return ""
    import pandas as pd

    from .renderers.markdown import md_cell

    parts = []
    for status, group in runs.groupby("status", sort=True):
        names = ", ".join(
            f"{md_cell(r.label)} ({'' if pd.isna(r.seed) else f'seed {int(r.seed)}, '}{r.trial_id})"
            for r in group.itertuples()
        )
        parts.append(f"{len(group)} {status} trial{'s' if len(group) > 1 else ''}: {names}")
    return "Left out (only finished and diverged trials are summed up): " + "; ".join(parts) + "."


def _cell(col: str, mean: float, lo: float, hi: float) -> str:
    if mean != mean:
        return "–"
    if col in _RATES:
        text = f"{100 * mean:.3g} %"
        return text + (f" ({100 * lo:.3g}–{100 * hi:.3g})" if hi - lo > max(0.02, 0.5 * abs(mean)) else "")
    if col.startswith("loss scale"):
        return f"{mean:g}" if lo == hi else f"{mean:g} ({lo:g}–{hi:g})"
    return f"{mean:.3g}" if lo == hi else f"{mean:.3g} ({lo:.3g}–{hi:.3g})"


def render_telemetry_markdown(df: pd.DataFrame) -> str:
    """The rows as one markdown table (rates in % of non-zero elements; seeds' range in brackets)."""
    from .renderers.markdown import md_text

    cols = list(TELEMETRY_COLUMNS)
    head = ["row", "precision", "n", *cols]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in df.to_dict("records"):
        cells = [md_text(r["label"]), str(r["precision"]), str(r["n"])]
        cells += [_cell(c, r[c], r[f"{c} min"], r[f"{c} max"]) for c in cols]
        lines.append("| " + " | ".join(cells) + " |")
    if df.attrs.get("left_out"):
        lines += ["", df.attrs["left_out"]]
    lines += [
        "",
        "Rates: share of the non-zero gradient elements the row's gradient format flushes to zero or "
        "saturates (past its maximum), per logged step, averaged over layers, steps and seeds (range over "
        "seeds in brackets where it is wide); rows without an emulated format are counted against fp16's "
        "thresholds (what fp16 would lose). Activation gradients are seen arriving at each conv/linear "
        "output, parameter gradients before they are rounded, both carrying the loss scale.",
    ]
    return "\n".join(lines) + "\n"
