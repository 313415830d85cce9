"""Study reports: MLflow runs → pandas → tables (markdown, csv, html, latex).

The report reads the MLflow store, never training logs.  The store contract
(written by the trial code, see docs/DESIGN "MLflow conventions"):

* one experiment per study, named by the study;
* one parent run per study (``lsbench.role=study``);
* one child run per trial (``lsbench.role=trial``) tagged ``lsbench.study``,
  ``lsbench.trial_id``, ``lsbench.status`` (running | finished | diverged |
  failed; any other value, e.g. pending, reads as not done yet),
  ``lsbench.diverged_step``, ``lsbench.label``, ``lsbench.row``,
  ``lsbench.precision``, ``lsbench.eval_metric``, ``lsbench.baseline``
  (``true`` on the trials of the study's ``baseline: true`` entry); params ``model``,
  ``batch_size``, ``seed``, ``precision``, ``scaling.method``, ...; metrics
  ``final_map``, ``final_map_50``, ``best_map`` (fractions), plus step and
  eval metrics.

Pipeline::

    load_runs(uri, study)  -> one row per trial (latest run per trial_id)
    summarize(runs)        -> one row per table cell (study, model, batch, row)
    render(runs, fmt)      -> markdown | csv | html | latex text
    write_report(uri, ...) -> (text, path)   (+ plots: see lossscale_bench.plots)

Only :func:`load_runs` touches MLflow, and it imports it lazily so that the
rest of the package (and ``lsbench --help``) does not pay for the import.

Seeds and statistics.  A cell with several seeds shows ``mean ± sample std
(n=k)``, k the number of seeds that finished with a value.  Each table
(study, model, batch size) has a baseline row: the scaling entry marked
``baseline: true`` in the study (tag ``lsbench.baseline``), else the first
``fp32`` row, else none (and no verdicts).  Every other row is compared with
it, alpha 0.05: by a paired t-test of the per-seed differences when both rows
finished the same seeds (a seed fixes initial weights and batches, so the
pairs differ only by the method), else by Welch's t-test on the seed values;
with the difference of means and its 95% confidence interval
(:mod:`lossscale_bench.report_stats`):
``worse than baseline (p=0.003)``, ``better than baseline (p=0.01)``,
``within seed noise (p=0.42)``, or ``too few seeds`` when either side has
fewer than two values.  Diverged, failed and running seeds are left out of
the test (the cell says ``k/n diverged``): a diverged seed has no mAP to
compare, and inventing one (0, say) would turn "diverges sometimes" into a
p-value about accuracy.  A row with no value at all says ``no values``.
"""

from __future__ import annotations

import base64
import html as _html
import math
import re
from collections.abc import Iterable, Mapping
from pathlib import Path

import pandas as pd

from .report_stats import ALPHA, noise_verdict, paired_verdict

__all__ = [
    "ReportError",
    "load_runs",
    "summarize",
    "render",
    "write_report",
    "noise_verdict",
    "MODEL_NAMES",
    "FORMATS",
]

# --------------------------------------------------------------------------
# constants

MODEL_NAMES: dict[str, str] = {
    "ssd512_vgg16": "SSD512",
    "ssd300_vgg16": "SSD300",
    "ssd_tiny": "SSD-tiny",
    "ssd300_resnet34": "SSD300-R34",
    "ssd300_resnet50": "SSD300-R50",
}

#: format name -> file extension
FORMATS: dict[str, str] = {"markdown": "md", "csv": "csv", "html": "html", "latex": "tex"}

_EVAL_METRIC_NAMES = {
    "coco": "COCO mAP@[.5:.95]",
    "voc07": "VOC07 11-point mAP",
    "voc": "VOC area mAP",
}
_EVAL_METRIC_NAMES_50 = {
    "coco": "COCO mAP@0.5",
    "voc07": "VOC07 11-point mAP",
    "voc": "VOC area mAP",
}

EMULATED_SUFFIX = "-emulated"  # any precision named so is a CPU emulation, marked † in tables
EMULATED_MARK = "†"
#: what each emulation rounds; an emulation not listed here gets a generic note
EMULATION_NOTES: dict[str, str] = {
    "fp16-emulated": "these numbers come from the CPU fp16 emulation "
    "(compute in fp32, fp16 rounding of layer outputs and gradients), not real fp16.",
    "fp8-emulated": "these numbers come from the CPU fp8 emulation "
    "(compute in fp32, conv/linear outputs rounded to float8 E4M3, gradients to E5M2), not real fp8.",
}

RUNNING_TEXT = "–"  # en dash: still running, or no value for the metric yet

STATUSES = ("running", "finished", "diverged", "failed")

TAG = "lsbench."
# the columns load_runs always returns, in this order
RUN_COLUMNS = [
    "study",
    "trial_id",
    "run_id",
    "status",
    "label",
    "row",
    "model",
    "batch_size",
    "seed",
    "precision",
    "method",
    "baseline",
    "final_map",
    "final_map_50",
    "best_map",
    "map",
    "map_50",
    "diverged_step",
    "eval_metric",
    "experiment_id",
    "run_name",
    "mlflow_status",
    "start_time",
    "end_time",
]
_INT_COLUMNS = ("row", "batch_size", "seed", "diverged_step")
_FLOAT_COLUMNS = ("final_map", "final_map_50", "best_map", "map", "map_50")

# summary columns, in this order (csv output)
SUMMARY_COLUMNS = [
    "study",
    "model",
    "model_name",
    "batch_size",
    "row",
    "label",
    "precision",
    "baseline",
    "eval_metric",
    "metric",
    "n_runs",
    "n_seeds",
    "n_values",
    "n_finished",
    "n_diverged",
    "n_failed",
    "n_running",
    "mean",
    "std",
    "n",
    "cell",
    "best",
    "baseline_label",
    "p_value",
    "diff",
    "diff_ci_low",
    "diff_ci_high",
    "test",
    "verdict",
]


class ReportError(Exception):
    """A report cannot be produced; the message is one line for the user."""


# --------------------------------------------------------------------------
# loading


def _to_int(value) -> int | None:
    if value is None:
        return None
    try:
        f = float(str(value).strip())
    except ValueError:
        return None
    if math.isnan(f) or math.isinf(f) or f != int(f):
        return None
    return int(f)


def _fmt_number(value: str | None) -> str:
    """'128.0' -> '128', '0.5' -> '0.5', None -> '?'."""
    if value is None:
        return "?"
    i = _to_int(value)
    return str(i) if i is not None else str(value)


def derive_label(params: Mapping[str, str], precision: str | None = None) -> str:
    """A row label from the scaling params, for runs without ``lsbench.label``.

    Mirrors the published wording: ``FP32 baseline``, ``adaptive``,
    ``no loss scale``, ``loss scale (128)``, ``loss scale (dynamic, interval=10)``.
    """
    method = (params.get("scaling.method") or "").lower()
    precision = (precision or params.get("precision") or "").lower()
    if method in ("", "none"):
        if precision == "fp32":
            return "FP32 baseline"
        if precision:
            return f"{precision}, no loss scale"
        return "no loss scale"
    if method == "fixed":
        scale = params.get("scaling.scale", params.get("scaling.init_scale"))
        if _to_int(scale) == 1:
            return "no loss scale"
        return f"loss scale ({_fmt_number(scale)})"
    if method == "dynamic":
        interval = params.get("scaling.interval")
        if interval is None:
            return "loss scale (dynamic)"
        return f"loss scale (dynamic, interval={_fmt_number(interval)})"
    if method == "adaptive":
        every = params.get("scaling.update_every")
        if every is None or _to_int(every) == 1:
            return "adaptive"
        return f"adaptive (freq={_fmt_number(every)})"
    return method


def _is_true(value) -> bool:
    """A tag or column value meaning yes: ``true`` (as tracking writes it), True, 1, ``yes``."""
    if value is None or _isna(value):
        return False
    if isinstance(value, str):
        return value.strip().lower() in ("true", "1", "yes")
    return bool(value)


def is_emulated(precision) -> bool:
    """Any ``*-emulated`` precision is a CPU emulation: its rows carry the † mark."""
    return isinstance(precision, str) and precision.endswith(EMULATED_SUFFIX)


def _status(tag_status: str | None, mlflow_status: str) -> str:
    mlflow_status = (mlflow_status or "").upper()
    if tag_status:
        s = tag_status.strip().lower()
        # a trial whose process died leaves the tag at "running"; MLflow knows better
        if s in ("running", "pending") and mlflow_status in ("FAILED", "KILLED"):
            return "failed"
        return s
    return {
        "FINISHED": "finished",
        "FAILED": "failed",
        "KILLED": "failed",
    }.get(mlflow_status, "running")


def _run_record(run) -> dict:
    info, data = run.info, run.data
    tags, params, metrics = data.tags, data.params, data.metrics
    precision = tags.get(TAG + "precision") or params.get("precision")
    label = tags.get(TAG + "label") or derive_label(params, precision)
    rec = {
        "study": tags.get(TAG + "study"),
        "trial_id": tags.get(TAG + "trial_id") or info.run_id,
        "run_id": info.run_id,
        "status": _status(tags.get(TAG + "status"), info.status),
        "label": label,
        "row": _to_int(tags.get(TAG + "row")),
        "model": params.get("model"),
        "batch_size": _to_int(params.get("batch_size")),
        "seed": _to_int(params.get("seed")),
        "precision": precision,
        "method": params.get("scaling.method"),
        "baseline": _is_true(tags.get(TAG + "baseline")),
        "diverged_step": _to_int(tags.get(TAG + "diverged_step")),
        "eval_metric": tags.get(TAG + "eval_metric") or params.get("eval.metric"),
        "experiment_id": info.experiment_id,
        "run_name": info.run_name,
        "mlflow_status": info.status,
        "start_time": info.start_time,
        "end_time": info.end_time,
    }
    # every metric's latest value under its own name (final_map, loss_scale, ...)
    for key, value in metrics.items():
        rec[key if key not in rec else f"metric.{key}"] = value
    return rec


def _empty_runs() -> pd.DataFrame:
    return _typed(pd.DataFrame({c: [] for c in RUN_COLUMNS}))


def _typed(df: pd.DataFrame) -> pd.DataFrame:
    for c in RUN_COLUMNS:
        if c not in df.columns:
            df[c] = None
    for c in _INT_COLUMNS:
        df[c] = pd.array([_to_int(v) if v is not None and not _isna(v) else None for v in df[c]], dtype="Int64")
    for c in _FLOAT_COLUMNS:
        df[c] = pd.to_numeric(df[c], errors="coerce").astype("float64")
    for c in ("start_time", "end_time"):
        df[c] = pd.to_numeric(df[c], errors="coerce")
    df["baseline"] = [_is_true(v) for v in df["baseline"]]  # runs logged before the tag existed: no
    df["baseline"] = df["baseline"].astype(bool)
    extra = [c for c in df.columns if c not in RUN_COLUMNS]
    return df[RUN_COLUMNS + extra]


def _isna(value) -> bool:
    try:
        return bool(pd.isna(value))
    except (TypeError, ValueError):
        return False


def _quote(value: str) -> str | None:
    """Quote a value for an MLflow filter string, or None if it cannot be."""
    if "'" not in value:
        return f"'{value}'"
    if '"' not in value:
        return f'"{value}"'
    return None


def _all_experiments(client) -> list:
    from mlflow.entities import ViewType

    out, token = [], None
    while True:
        page = client.search_experiments(view_type=ViewType.ACTIVE_ONLY, max_results=1000, page_token=token)
        out.extend(page)
        token = page.token
        if not token:
            return out


def _search_trials(client, experiment_ids: list[str], extra_filter: str = "") -> list:
    from mlflow.entities import ViewType

    flt = f"tags.`{TAG}role` = 'trial'" + (f" and {extra_filter}" if extra_filter else "")
    runs, token = [], None
    while True:
        page = client.search_runs(
            experiment_ids=experiment_ids,
            filter_string=flt,
            run_view_type=ViewType.ACTIVE_ONLY,
            max_results=5000,
            page_token=token,
        )
        runs.extend(page)
        token = page.token
        if not token:
            return runs


def load_runs(tracking_uri: str, study: str | None = None) -> pd.DataFrame:
    """One row per trial child run of ``study`` (all studies when None).

    When one ``trial_id`` has several runs (a resumed or restored trial),
    only the latest by start time is kept.  Runs are read with one paged
    ``search_runs`` pass, no per-run calls.  Columns: see ``RUN_COLUMNS``;
    every logged metric also appears with its latest value under its own name.
    Unknown study -> :class:`ReportError`.
    """
    try:
        from mlflow import MlflowClient
    except ImportError as e:  # pragma: no cover - mlflow is a dependency
        raise ReportError(f"mlflow is not installed: {e}") from None

    client = MlflowClient(tracking_uri=tracking_uri)
    try:
        if study is None:
            experiments = _all_experiments(client)
            runs = _search_trials(client, [e.experiment_id for e in experiments]) if experiments else []
        else:
            exp = client.get_experiment_by_name(study)
            if exp is not None and exp.lifecycle_stage == "active":
                runs = _search_trials(client, [exp.experiment_id])
            else:
                # the experiment may have been named differently; the tag decides
                experiments = _all_experiments(client)
                q = _quote(study)
                runs = []
                if experiments and q is not None:
                    runs = _search_trials(client, [e.experiment_id for e in experiments], f"tags.`{TAG}study` = {q}")
                if not runs:
                    names = sorted(e.name for e in experiments if e.name != "Default")
                    known = ", ".join(names) if names else "(none)"
                    raise ReportError(f"no study named {study!r} in {tracking_uri}; studies: {known}")
    except ReportError:
        raise
    except Exception as e:  # MlflowException, sqlalchemy errors, connection errors
        msg = " ".join(str(e).split())
        raise ReportError(f"cannot read MLflow store {tracking_uri}: {type(e).__name__}: {msg[:300]}") from None

    if not runs:
        return _empty_runs()
    df = pd.DataFrame.from_records([_run_record(r) for r in runs])
    if study is not None:
        # runs in the study's experiment that do not say which study they belong to are its own
        df["study"] = df["study"].fillna(study)
        df = df[df["study"] == study]
    else:
        # fall back to the experiment's name, which is the study's name by convention
        exp_names = {e.experiment_id: e.name for e in experiments}
        df["study"] = df["study"].fillna(df["experiment_id"].map(exp_names))
    df = _typed(df)
    df = df.sort_values(["start_time", "run_id"], kind="stable", na_position="first")
    df = df.drop_duplicates(subset=["study", "trial_id"], keep="last")
    df = df.sort_values(["study", "row", "trial_id"], kind="stable", na_position="last")
    return df.reset_index(drop=True)


# --------------------------------------------------------------------------
# summarizing


def _is_map_metric(metric: str) -> bool:
    return "map" in metric.lower()


def _higher_is_better(metric: str) -> bool:
    return "loss" not in metric.lower() and "skipped" not in metric.lower() and "overflow" not in metric.lower()


def _scale(metric: str) -> float:
    """mAP values are fractions; tables show percent."""
    return 100.0 if _is_map_metric(metric) else 1.0


def _fmt(value: float, metric: str) -> str:
    return f"{value * _scale(metric):.2f}"


def model_name(model: str | None) -> str:
    if model is None or _isna(model):
        return "?"
    return MODEL_NAMES.get(str(model), str(model))


def _cell_text(values: list[float], counts: dict[str, int], n_runs: int, table_n_runs: int, metric: str) -> str:
    """Display text of one cell: ``mean ± std (n=k, j/m diverged)``.

    ``n=k`` (the seeds that finished with a value, what mean and std are over)
    is shown whenever the cell has several seeds, so a reader never has to
    guess how many runs a ± stands on; a one-seed cell stays a bare number
    unless the table's usual runs per cell (``table_n_runs``) differ.
    """
    notes = [f"{counts[s]}/{n_runs} {s}" for s in ("diverged", "failed", "running") if counts[s]]
    if values:
        text = _fmt(pd.Series(values).mean(), metric)
        if len(values) > 1:
            text += f" ± {_fmt(pd.Series(values).std(ddof=1), metric)}"
        if len(values) > 1 or n_runs > 1 or len(values) != table_n_runs:
            notes.insert(0, f"n={len(values)}")
        if notes:
            text += f" ({', '.join(notes)})"
        return text
    if counts["running"]:
        head = RUNNING_TEXT
        notes = notes[:-1]  # "running" itself is what the dash says
        if counts["running"] == n_runs:
            return head
        return f"{head} ({', '.join(notes)})" if notes else head
    if counts["diverged"] == n_runs:
        return "diverged"
    if counts["failed"] == n_runs:
        return "failed"
    if counts["diverged"]:
        return f"diverged ({counts['failed']}/{n_runs} failed)"
    return RUNNING_TEXT


def summarize(df: pd.DataFrame, metric: str = "final_map") -> pd.DataFrame:
    """One row per table cell: (study, model, batch_size, row, label, precision).

    Columns: see ``SUMMARY_COLUMNS``.  ``mean``/``std`` are in the metric's
    own unit (fractions for mAP), over finished runs that logged the metric;
    ``std`` is the sample std (NaN for one value), ``n`` the number of
    values they are over.  ``cell`` is the display text (percent for mAP
    metrics), ``best`` marks the best value per table (only when a table has
    at least two values to compare).  A run that is finished but has not
    logged ``metric`` counts as running (``–``).

    ``baseline`` marks each table's baseline row (see the module docstring);
    ``verdict`` is ``baseline`` there and the noise verdict on the other rows
    (empty in tables without a baseline), with ``p_value``, ``diff`` (row
    mean − baseline mean, the metric's unit) and ``diff_ci_low``/``_high``
    (95% CI) from :func:`lossscale_bench.report_stats.noise_verdict`.
    """
    if df is None or len(df) == 0:
        return pd.DataFrame({c: [] for c in SUMMARY_COLUMNS})
    df = df.copy()
    for c in ("study", "model", "batch_size", "row", "label", "precision", "eval_metric", "seed", "status",
              "baseline"):
        if c not in df.columns:
            df[c] = None
    df["baseline"] = [_is_true(v) for v in df["baseline"]]
    values = pd.to_numeric(df[metric], errors="coerce") if metric in df.columns else pd.Series(math.nan, index=df.index)
    df["_value"] = values.astype("float64")
    status = df["status"].fillna("running").astype(str).str.lower()
    has_value = df["_value"].notna() & ~df["_value"].isin([math.inf, -math.inf])
    df["_kind"] = "running"
    df.loc[status == "diverged", "_kind"] = "diverged"
    df.loc[status == "failed", "_kind"] = "failed"
    df.loc[(status == "finished") & has_value, "_kind"] = "value"

    keys = ["study", "model", "batch_size", "row", "label", "precision"]
    rows = []
    for key, g in df.groupby(keys, dropna=False, sort=False):
        k = dict(zip(keys, key))
        vals = g.loc[g["_kind"] == "value", "_value"].tolist()
        by_seed = {int(s): v for s, v in zip(g.loc[g["_kind"] == "value", "seed"], vals) if not _isna(s)}
        counts = {s: int((g["_kind"] == s).sum()) for s in ("diverged", "failed", "running")}
        evals = [e for e in pd.unique(g["eval_metric"].dropna()) if e]
        rows.append(
            {
                **k,
                "model_name": model_name(k["model"]),
                "eval_metric": ",".join(sorted(map(str, evals))) or None,
                "metric": metric,
                "n_runs": len(g),
                "n_seeds": int(g["seed"].nunique(dropna=True)),
                "n_values": len(vals),
                "n_finished": int((status.loc[g.index] == "finished").sum()),
                "n_diverged": counts["diverged"],
                "n_failed": counts["failed"],
                "n_running": counts["running"],
                "mean": float(pd.Series(vals).mean()) if vals else math.nan,
                "std": float(pd.Series(vals).std(ddof=1)) if len(vals) > 1 else math.nan,
                "n": len(vals),
                "_marked": bool(g["baseline"].any()),
                "_vals": vals,
                "_by_seed": by_seed,
                "_counts": counts,
            }
        )
    out = pd.DataFrame(rows)
    for c in ("batch_size", "row"):
        out[c] = pd.array([_to_int(v) if not _isna(v) else None for v in out[c]], dtype="Int64")
    out = out.sort_values(
        ["study", "model", "batch_size", "row", "label", "precision"], kind="stable", na_position="last"
    ).reset_index(drop=True)

    higher = _higher_is_better(metric)
    cells, best = [], []
    for _, g in out.groupby(["study", "model", "batch_size"], dropna=False, sort=False):
        usual_runs = int(g["n_runs"].mode().max())  # most common; ties -> the larger
        shown = g["mean"].map(lambda m: round(m * _scale(metric), 2) if not math.isnan(m) else math.nan)
        n_with = int(shown.notna().sum())
        target = (shown.max() if higher else shown.min()) if n_with else math.nan
        for i, r in g.iterrows():
            cells.append((i, _cell_text(r["_vals"], r["_counts"], int(r["n_runs"]), usual_runs, metric)))
            best.append((i, bool(n_with >= 2 and not math.isnan(shown[i]) and shown[i] == target)))
    out["cell"] = pd.Series(dict(cells))
    out["best"] = pd.Series(dict(best)).astype(bool)
    out = _add_verdicts(out, higher)
    return out[SUMMARY_COLUMNS].reset_index(drop=True)


def _baseline_index(table: pd.DataFrame):
    """The index of a table's baseline row, or None.

    The study's ``baseline: true`` entry wins; studies without one keep the
    convention of the published tables, where the fp32 row is the reference.
    Rows are in row order, so "first" is the study file's order.
    """
    marked = table.index[table["_marked"]]
    if len(marked):
        return marked[0]
    fp32 = table.index[table["precision"].astype(str).str.lower() == "fp32"]
    return fp32[0] if len(fp32) else None


def _add_verdicts(out: pd.DataFrame, higher: bool) -> pd.DataFrame:
    """``baseline``, ``baseline_label``, ``p_value``, ``diff``, CI and ``verdict`` per row.

    Tables without a baseline row get no verdicts (empty strings, NaN numbers):
    a comparison with an arbitrary row would look like a finding.
    """
    out = out.copy()
    nan = math.nan
    cols = {"baseline": False, "baseline_label": "", "p_value": nan, "diff": nan,
            "diff_ci_low": nan, "diff_ci_high": nan, "test": "", "verdict": ""}
    for c, v in cols.items():
        out[c] = v
    out["baseline"] = out["baseline"].astype(bool)
    out["verdict"] = out["verdict"].astype(object)
    out["baseline_label"] = out["baseline_label"].astype(object)
    out["test"] = out["test"].astype(object)
    for _, g in out.groupby(["study", "model", "batch_size"], dropna=False, sort=False):
        b = _baseline_index(g)
        if b is None:
            continue
        base_vals = out.at[b, "_vals"]
        base_label = str(out.at[b, "label"])
        for i in g.index:
            out.at[i, "baseline_label"] = base_label
            if i == b:
                out.at[i, "baseline"] = True
                out.at[i, "verdict"] = "baseline"
                continue
            mine, base = out.at[i, "_by_seed"], out.at[b, "_by_seed"]
            # pair only when every value of both rows has its own seed (no seedless or repeated seeds)
            whole = len(mine) == len(out.at[i, "_vals"]) and len(base) == len(base_vals)
            if whole and len(set(mine) & set(base)) >= 2 and set(mine) == set(base):
                # same seeds = same initial weights and batches: compare seed by seed
                v = paired_verdict(mine, base, ALPHA, higher_is_better=higher)
            else:
                v = noise_verdict(out.at[i, "_vals"], base_vals, ALPHA, higher_is_better=higher)
            for c in ("p_value", "diff", "diff_ci_low", "diff_ci_high", "test"):
                out.at[i, c] = v[c]
            out.at[i, "verdict"] = v["verdict"]
    return out


# --------------------------------------------------------------------------
# rendering

HEADERS = ("Model", "Loss scale", "Batch size")
VS_HEADER = "vs baseline"


def _value_header(metric: str) -> str:
    return "Validation mAP" if _is_map_metric(metric) else metric


def _metric_description(metric: str, eval_metrics: Iterable[str]) -> str:
    names = _EVAL_METRIC_NAMES_50 if metric.endswith("_50") else _EVAL_METRIC_NAMES
    evals = sorted({e for em in eval_metrics if em for e in str(em).split(",")})
    what = " / ".join(names.get(e, e) for e in evals) or "unknown evaluation metric"
    unit = ", %" if _is_map_metric(metric) else ""
    return f"Metric: {what} (`{metric}`{unit}). Best per table in bold."


SEEDS_NOTE = (
    "Several seeds: mean ± sample std over the n seeds that finished with a value "
    "(diverged, failed and running seeds are counted beside it, not averaged)."
)


def _verdict_note(metric: str) -> str:
    """How to read the ``vs baseline`` column; printed under tables that have one."""
    unit = "percentage points" if _is_map_metric(metric) else "the metric's unit"
    return (
        f"{VS_HEADER}: the row's seed values against the baseline row's (the scaling entry marked "
        "`baseline: true` in the study, else the first fp32 row), two-sided, "
        f"alpha {ALPHA:g}: p < {ALPHA:g} reads as worse/better than baseline, otherwise within seed noise. "
        "When both rows finished the same seeds (a seed fixes the initial weights and the batches), a paired "
        "t-test of the per-seed differences (marked paired); otherwise Welch's t-test (unequal variances). "
        "n is the number of seeds that finished with a value; fewer than 2 on either side: too few seeds. "
        "Diverged, failed and running seeds are left out of the test (the cell counts them). "
        f"Δ: row mean − baseline mean ({unit}) with its 95% confidence interval "
        "(paired: n−1 degrees of freedom; Welch: Welch–Satterthwaite)."
    )


def _text(value) -> str:
    """A summary string column's value; a csv read back has NaN where it was empty."""
    return "" if value is None or _isna(value) else str(value)


def _vs_text(r, metric: str) -> str:
    """The ``vs baseline`` cell: the verdict, and Δ with its CI where a test was run."""
    verdict = _text(r.get("verdict"))
    p, diff = r.get("p_value"), r.get("diff")
    lo, hi = r.get("diff_ci_low"), r.get("diff_ci_high")
    if not verdict or any(v is None or _isna(v) for v in (p, diff, lo, hi)):
        return verdict
    k = _scale(metric)
    return f"{verdict}, Δ {diff * k:+.2f} [{lo * k:+.2f}, {hi * k:+.2f}]"


def _tables(summary: pd.DataFrame, metric: str = "final_map"):
    """Yield (study, model, batch_size, table_rows, has_baseline) in report order.

    table_rows: list of (label, cell, best, emulated, vs_baseline) in row order;
    ``has_baseline``: the table has a baseline row, so it gets a ``vs baseline`` column.
    """
    for (study, model, bs), g in summary.groupby(["study", "model", "batch_size"], dropna=False, sort=False):
        labels = g["label"].astype(str).tolist()
        dup = {lab for lab in labels if labels.count(lab) > 1}
        rows = []
        for _, r in g.iterrows():
            label = str(r["label"])
            if label in dup and not _isna(r["precision"]):
                label = f"{label} [{r['precision']}]"
            rows.append((label, str(r["cell"]), bool(r["best"]), is_emulated(r["precision"]), _vs_text(r, metric)))
        has_baseline = "verdict" in g.columns and g["verdict"].map(_text).eq("baseline").any()
        yield study, model, bs, rows, bool(has_baseline)


def _bold_split(cell: str) -> tuple[str, str]:
    """'79.27 ± 0.12 (n=2)' -> ('79.27', ' ± 0.12 (n=2)')."""
    m = re.match(r"^(-?[0-9.]+)(.*)$", cell)
    return (m.group(1), m.group(2)) if m else (cell, "")


def _heading(study, model, bs) -> str:
    bs_text = "?" if _isna(bs) else str(bs)
    return f"{study}: {model_name(model)} batch {bs_text}"


def _emulation_notes(precisions: Iterable) -> list[str]:
    """One † line per emulation that appears, in registry-ish order (fp16 before fp8)."""
    found = sorted({str(p) for p in precisions if is_emulated(p)},
                   key=lambda p: (list(EMULATION_NOTES).index(p) if p in EMULATION_NOTES else len(EMULATION_NOTES), p))
    lines = []
    for p in found:
        fmt = p[: -len(EMULATED_SUFFIX)]
        note = EMULATION_NOTES.get(p, f"these numbers come from a CPU emulation of {fmt}, not real {fmt}.")
        lines.append(f"{EMULATED_MARK} {p}: {note}")
    return lines


def _study_notes(summary: pd.DataFrame, runs_of_study: pd.DataFrame | None, metric: str) -> list[str]:
    """Footnotes under a study's tables; each says only what its tables show."""
    lines = [_metric_description(metric, summary["eval_metric"].dropna().tolist())]
    if (pd.to_numeric(summary["n_values"], errors="coerce") > 1).any():
        lines.append(SEEDS_NOTE)
    if any(has for *_, has in _tables(summary, metric)):
        lines.append(_verdict_note(metric))
    n = runs_of_study
    if n is not None and len(n):
        st = n["status"].fillna("running").astype(str).str.lower()
        parts = [f"{int((st == s).sum())} {s}" for s in ("finished", "diverged", "failed", "running")]
        parts += [f"{int((st == s).sum())} {s}" for s in sorted(set(st) - set(STATUSES))]  # e.g. pending
        lines.append(f"Trials: {len(n)} ({', '.join(parts)}).")
    lines += _emulation_notes(summary["precision"].dropna())
    return lines


def _md_table(header: list[str], body: list[list[str]]) -> list[str]:
    widths = [max(len(h), *(len(r[i]) for r in body)) if body else len(h) for i, h in enumerate(header)]

    def line(cells):
        return "| " + " | ".join(c.ljust(w) for c, w in zip(cells, widths)) + " |"

    return [line(header), "| " + " | ".join("-" * w for w in widths) + " |", *(line(r) for r in body)]


def _render_markdown(summary, runs, metric) -> str:
    out: list[str] = []
    for study, sg in summary.groupby("study", dropna=False, sort=False):
        out += [f"## {study}", ""]
        for _, model, bs, rows, has_vs in _tables(sg, metric):
            body = []
            for label, cell, best, emu, vs in rows:
                if best:
                    v, rest = _bold_split(cell)
                    cell = f"**{v}**{rest}"
                body.append([model_name(model), label + (f" {EMULATED_MARK}" if emu else ""), str(bs), cell]
                            + ([vs] if has_vs else []))
            out += [f"### {_heading(study, model, bs)}", ""]
            out += _md_table([*HEADERS, _value_header(metric)] + ([VS_HEADER] if has_vs else []), body)
            out.append("")
        srun = runs[runs["study"] == study] if runs is not None else None
        for note in _study_notes(sg, srun, metric):
            out += [note, ""]
    return "\n".join(out).rstrip("\n") + "\n"


_LATEX_ESCAPES = {
    "\\": r"\textbackslash{}",
    "&": r"\&",
    "%": r"\%",
    "$": r"\$",
    "#": r"\#",
    "_": r"\_",
    "{": r"\{",
    "}": r"\}",
    "~": r"\textasciitilde{}",
    "^": r"\textasciicircum{}",
    "±": r"$\pm$",
    "–": "--",
    "−": r"$-$",
    "Δ": r"$\Delta$",
    EMULATED_MARK: r"$^\dagger$",
}
_LATEX_RE = re.compile("|".join(re.escape(k) for k in _LATEX_ESCAPES))


def latex_escape(text: str) -> str:
    return _LATEX_RE.sub(lambda m: _LATEX_ESCAPES[m.group(0)], str(text))


def _md_inline_to_latex(text: str) -> str:
    # `code` -> \texttt{code}; escape everything else
    parts = re.split(r"`([^`]*)`", text)
    return "".join(latex_escape(p) if i % 2 == 0 else r"\texttt{" + latex_escape(p) + "}" for i, p in enumerate(parts))


def _render_latex(summary, runs, metric) -> str:
    out = [
        "% lossscale_bench report; needs \\usepackage{booktabs}",
    ]
    for study, sg in summary.groupby("study", dropna=False, sort=False):
        out += ["", f"% study: {latex_escape(study)}"]
        for _, model, bs, rows, has_vs in _tables(sg, metric):
            headers = [*HEADERS, _value_header(metric)] + ([VS_HEADER] if has_vs else [])
            out += [
                "",
                r"\begin{table}[ht]",
                r"\centering",
                r"\caption{" + latex_escape(_heading(study, model, bs)) + "}",
                r"\begin{tabular}{llrl" + ("l" if has_vs else "") + "}",
                r"\toprule",
                " & ".join(latex_escape(h) for h in headers) + r" \\",
                r"\midrule",
            ]
            for label, cell, best, emu, vs in rows:
                if best:
                    v, rest = _bold_split(cell)
                    cell_tex = r"\textbf{" + latex_escape(v) + "}" + latex_escape(rest)
                else:
                    cell_tex = latex_escape(cell)
                label_tex = latex_escape(label) + (latex_escape(EMULATED_MARK) if emu else "")
                vs_tex = f" & {latex_escape(vs)}" if has_vs else ""
                cells_tex = [latex_escape(model_name(model)), label_tex, latex_escape(bs), cell_tex]
                out.append(" & ".join(cells_tex) + vs_tex + r" \\")
            out += [r"\bottomrule", r"\end{tabular}", r"\end{table}"]
        srun = runs[runs["study"] == study] if runs is not None else None
        out.append("")
        for note in _study_notes(sg, srun, metric):
            out += [_md_inline_to_latex(note), ""]
    return "\n".join(out).rstrip("\n") + "\n"


_HTML_STYLE = """
body { font-family: system-ui, sans-serif; margin: 2em; color: #222; }
table { border-collapse: collapse; margin: 0.5em 0 1.5em; }
th, td { border: 1px solid #bbb; padding: 0.3em 0.8em; text-align: left; }
th { background: #f0f0f0; }
td.num { text-align: right; }
p.note { color: #555; }
figure { margin: 1em 0; } figure img { max-width: 100%; }
""".strip()


def _md_inline_to_html(text: str) -> str:
    parts = re.split(r"`([^`]*)`", text)
    return "".join(_html.escape(p) if i % 2 == 0 else "<code>" + _html.escape(p) + "</code>" for i, p in enumerate(parts))


def _render_html(summary, runs, metric, images: Mapping[str, bytes] | None, title: str) -> str:
    e = _html.escape
    out = [
        "<!DOCTYPE html>",
        '<html lang="en">',
        "<head>",
        '<meta charset="utf-8">',
        f"<title>{e(title)}</title>",
        f"<style>\n{_HTML_STYLE}\n</style>",
        "</head>",
        "<body>",
        f"<h1>{e(title)}</h1>",
    ]
    for study, sg in summary.groupby("study", dropna=False, sort=False):
        out.append(f'<section class="study" id="study-{e(str(study))}">')
        out.append(f"<h2>{e(str(study))}</h2>")
        for _, model, bs, rows, has_vs in _tables(sg, metric):
            headers = [*HEADERS, _value_header(metric)] + ([VS_HEADER] if has_vs else [])
            out.append(f"<h3>{e(_heading(study, model, bs))}</h3>")
            out.append("<table>")
            out.append("<thead><tr>" + "".join(f"<th>{e(h)}</th>" for h in headers) + "</tr></thead>")
            out.append("<tbody>")
            for label, cell, best, emu, vs in rows:
                if best:
                    v, rest = _bold_split(cell)
                    cell_html = f"<strong>{e(v)}</strong>{e(rest)}"
                else:
                    cell_html = e(cell)
                label_html = e(label) + (f" {EMULATED_MARK}" if emu else "")
                out.append(
                    f"<tr><td>{e(model_name(model))}</td><td>{label_html}</td>"
                    f'<td class="num">{e(str(bs))}</td><td class="num">{cell_html}</td>'
                    + (f"<td>{e(vs)}</td>" if has_vs else "") + "</tr>"
                )
            out.append("</tbody>")
            out.append("</table>")
        srun = runs[runs["study"] == study] if runs is not None else None
        for note in _study_notes(sg, srun, metric):
            out.append(f'<p class="note">{_md_inline_to_html(note)}</p>')
        out.append("</section>")
    # plots: name -> PNG bytes, embedded so the page stays self-contained
    out.append('<section id="plots">')
    if images:
        out.append("<h2>Plots</h2>")
    for name, png in (images or {}).items():
        data = base64.b64encode(png).decode("ascii")
        out.append(
            f'<figure><img alt="{e(name)}" src="data:image/png;base64,{data}">'
            f"<figcaption>{e(name)}</figcaption></figure>"
        )
    out.append("</section>")
    out += ["</body>", "</html>"]
    return "\n".join(out) + "\n"


def render(
    df: pd.DataFrame,
    fmt: str = "markdown",
    metric: str = "final_map",
    *,
    images: Mapping[str, bytes] | None = None,
    title: str | None = None,
) -> str:
    """Render the runs (from :func:`load_runs`) or a summary (from :func:`summarize`).

    ``fmt``: markdown | csv | html | latex.  ``images`` (html only): plot name
    -> PNG bytes, embedded as base64 in the page's ``#plots`` section.
    """
    if fmt not in FORMATS:
        raise ReportError(f"unknown report format {fmt!r}; choose one of: {', '.join(FORMATS)}")
    if "cell" in df.columns and "n_runs" in df.columns:
        summary, runs = df, None
    else:
        summary, runs = summarize(df, metric), df
    if fmt == "csv":
        return summary.to_csv(index=False, lineterminator="\n")
    if len(summary) == 0:
        raise ReportError("no trial runs to report")
    if fmt == "markdown":
        return _render_markdown(summary, runs, metric)
    if fmt == "latex":
        return _render_latex(summary, runs, metric)
    studies = [str(s) for s in pd.unique(summary["study"])]
    return _render_html(summary, runs, metric, images, title or f"Loss-scaling report: {', '.join(studies)}")


def _plot_list(tracking_uri: str, study: str | None, runs: pd.DataFrame, metric: str) -> list:
    try:
        from .plots import study_plots

        return study_plots(tracking_uri, study, runs=runs, metric=metric)
    except Exception as e:  # PlotError, matplotlib or MLflow errors: one line, and the way out
        msg = " ".join(str(e).split())
        raise ReportError(f"cannot draw the report's plots: {type(e).__name__}: {msg[:300]} "
                          f"(plots=False / --no-plots writes the tables alone)") from None


def _md_alt(text: str) -> str:
    return re.sub(r"([\\\[\]])", r"\\\1", text)


def _markdown_plots(path: Path, pictures: list[tuple[str, str, bytes]]) -> tuple[str, list[tuple[Path, bytes]]]:
    """Markdown section linking PNG files beside ``path``: ``<stem>_<name>.png``."""
    from urllib.parse import quote

    from .plots import slug

    lines, files, used = ["", "## Plots", ""], [], set()
    for name, title, png in pictures:
        base = f"{path.stem}_{slug(name)}"
        fname, k = f"{base}.png", 2
        while fname in used:
            fname, k = f"{base}_{k}.png", k + 1
        used.add(fname)
        files.append((path.parent / fname, png))
        lines += [f"![{_md_alt(title)}]({quote(fname)})", ""]
    return "\n".join(lines).rstrip("\n") + "\n", files


def write_report(
    tracking_uri: str,
    *,
    study: str | None = None,
    fmt: str = "markdown",
    out: str | Path | None = None,
    metric: str = "final_map",
    reports_dir: str | Path = "reports",
    images: Mapping[str, bytes] | None = None,
    plots: bool = True,
) -> tuple[str, Path]:
    """Load, render and write a report; returns (text, path).

    The file is ``out`` when given, else ``<reports_dir>/<study or 'all'>.<ext>``.
    ``plots`` (html and markdown only): draw the study plots
    (:func:`lossscale_bench.plots.study_plots`); html embeds them (with
    ``images``) as base64 in one self-contained page, markdown writes them as
    ``<stem>_<plot>.png`` beside the report and links them in a ``Plots``
    section.  csv and latex never have plots.
    """
    if fmt not in FORMATS:
        raise ReportError(f"unknown report format {fmt!r}; choose one of: {', '.join(FORMATS)}")
    runs = load_runs(tracking_uri, study)
    if len(runs) == 0:
        where = f"study {study!r}" if study else "any study"
        raise ReportError(f"no trial runs for {where} in {tracking_uri}")
    path = Path(out) if out is not None else Path(reports_dir) / f"{study or 'all'}.{FORMATS[fmt]}"
    pictures: list[tuple[str, str, bytes]] = []  # (name, title, png)
    if plots and fmt in ("html", "markdown"):
        pictures = [(p.name, p.title, p.png) for p in _plot_list(tracking_uri, study, runs, metric)]
    pictures += [(name, name, png) for name, png in (images or {}).items()]
    files: list[tuple[Path, bytes]] = []
    if fmt == "html":
        text = render(runs, fmt, metric, images={title: png for _, title, png in pictures})
    else:
        text = render(runs, fmt, metric)
        if fmt == "markdown" and pictures:
            section, files = _markdown_plots(path, pictures)
            text += section
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        for fpath, png in files:  # pictures first: the report never links a missing file
            fpath.write_bytes(png)
        path.write_text(text, encoding="utf-8")
    except OSError as e:
        raise ReportError(f"cannot write report to {path}: {e.strerror or e}") from None
    return text, path
