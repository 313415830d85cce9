"""Runs -> summary: one row per table cell, with seed statistics and verdicts.

The summary layer of the report: :func:`~lossscale_bench.report.runs.load_runs` (MLflow -> runs,
in :mod:`lossscale_bench.report.runs`) and :func:`summarize` (runs -> one row per (study, model,
batch, row)).  No rendering and no plots here: the table renderers
(:mod:`lossscale_bench.report.renderers`) and
:mod:`lossscale_bench.report.plots` build on this module, and
:mod:`lossscale_bench.report.write` sits above them all.

Seeds and statistics.  A cell with several seeds shows ``mean ± sample std
(n=k)``, k the number of seeds that finished with a value.  Each table
(study, model, batch size) has a baseline row: the scaling entry marked
``baseline: true`` in the study (tag ``lsbench.baseline``), else the first
``fp32`` row, else none (and no verdicts).  Every other row is compared with
it, alpha 0.05: by a paired t-test of the per-seed differences when both rows
finished the same seeds (a seed fixes initial weights and batches, so the
pairs differ only by the method), else by Welch's t-test on the seed values;
with the difference of means and its 95% confidence interval
(:mod:`lossscale_bench.report.stats`):
``worse than baseline (p=0.003)``, ``better than baseline (p=0.01)``; where no
difference is shown, ``equivalent (±1.0, paired TOST p=0.02)`` when two
one-sided tests put the difference inside the study's equivalence margin (mAP
points, ``report.equivalence_margin``, default 1.0), else ``inconclusive
(p=0.42)`` with the seeds it would take to resolve; or ``too few seeds`` when
either side has fewer than two values.  Every tested row also gets P(row >
baseline), paired with an exact binomial interval.  Diverged, failed and running seeds are left out of
the test (the cell says ``k/n diverged``): a diverged seed has no mAP to
compare, and inventing one (0, say) would turn "diverges sometimes" into a
p-value about accuracy.  A row with no value at all says ``no values``; when the
baseline has none, every other row says ``baseline has no values (2 diverged, 0
failed)``.

Configurations.  Seeds are pooled only within one configuration (a run's
``config_id``: its trial identity without the seed, :mod:`lossscale_bench.study.configs`).
A study whose file changed under the same name keeps the trials of each
version in the store; each study-level setting (``setting_id``: dataset and
its fingerprint, schedule, eval, model options, ...) gets its own tables,
named by the fields that differ (``setting``), the one whose newest trial
started last first and called latest.  Two configurations of one row within
one setting (an entry's own option changed, its label not) are two rows,
told apart by ``variant``.  Failed, running and pending counts are per cell,
so per configuration.
"""

from __future__ import annotations

import math

import pandas as pd

from ..study.configs import describe, differing_fields, study_setting
from .baseline import TABLE_KEYS, VERDICT_NUMBERS, add_verdicts
from .cell_text import NOT_VALUE, format_cell, higher_is_better, metric_scale
from .runs import is_true, isna, model_name, to_int
from .stats import DEFAULT_MARGIN

__all__ = ["SUMMARY_COLUMNS", "VALUE_COLUMNS", "latest_setting", "summarize", "table_labels"]

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
    "n_pending",
    "mean",
    "std",
    "n",
    "cell",
    "best",
    "baseline_label",
    *VERDICT_NUMBERS,
    "outcome",
    "test",
    "verdict",
    "setting",
    "setting_id",
    "variant",
    "config_id",
]


def summarize(
    df: pd.DataFrame, metric: str = "final_map", margin: float = DEFAULT_MARGIN, *, values: bool = False
) -> pd.DataFrame:
    """One row per table cell: (study, setting, model, batch_size, row, label, precision, configuration).

    Columns: see ``SUMMARY_COLUMNS``.  ``mean``/``std`` are in the metric's
    own unit (fractions for mAP), over finished runs that logged the metric;
    ``std`` is the sample std (NaN for one value), ``n`` the number of
    values they are over.  ``cell`` is the display text (percent for mAP
    metrics), ``best`` marks the best value per table (only when a table has
    at least two values to compare).  A run that is finished but has not
    logged ``metric`` counts as running (``–``).

    ``baseline`` marks each table's baseline row (see the module docstring);
    ``verdict`` is ``baseline`` there and the verdict on the other rows
    (empty in tables without a baseline), with ``outcome`` (``worse``,
    ``better``, ``equivalent``, ``inconclusive``, ``too few``, ...),
    ``p_value``, ``diff`` (row mean − baseline mean, the metric's unit),
    ``diff_ci_low``/``_high`` (95% CI) and its ``half_width``, ``tost_p`` at
    ``margin`` (the metric's unit; the argument ``margin`` is in the unit the
    tables show, mAP points) with the 90% interval it decides on
    (``tost_ci_low``/``_high``), ``seeds_needed`` for a half-width of
    ``margin`` and ``p_better`` (P(row better than baseline)) with its interval, from
    :func:`lossscale_bench.report.verdicts.compare_cells`.

    ``setting`` names the table's study setting when the study has several
    (``configuration 2 of 2 (earlier): schedule.lr = 0.01``), else is empty;
    ``variant`` tells apart two configurations of one row in one table;
    ``config_id`` is the cell's configuration (see the module docstring).

    ``values=True`` adds ``values`` (the cell's finished values) and
    ``values_by_seed`` (seed -> value): what :mod:`lossscale_bench.report.compare`
    tests rows on.
    """
    columns = SUMMARY_COLUMNS + (VALUE_COLUMNS if values else [])
    if df is None or len(df) == 0:
        return pd.DataFrame({c: [] for c in columns})
    df, status = _classify_runs(df, metric)
    out = _order_cells(df, _cell_rows(df, status, metric))
    higher = higher_is_better(metric)
    out = _add_cells_and_best(out, metric, higher)
    out = add_verdicts(out, higher, margin / metric_scale(metric), metric_scale(metric))
    out["values"], out["values_by_seed"] = out["_vals"], out["_by_seed"]
    return out[columns].reset_index(drop=True)


#: what ``summarize(values=True)`` adds: the seed values each cell's statistics are over
VALUE_COLUMNS = ["values", "values_by_seed"]


def _classify_runs(df: pd.DataFrame, metric: str) -> tuple[pd.DataFrame, pd.Series]:
    """A copy of the runs with every column :func:`summarize` reads, ``_value`` and ``_kind``; and the status.

    Hand-made frames (tests, a csv read back) may lack columns the store always
    has; they read as unknown (None) rather than failing.  ``_kind`` is what a
    run adds to its cell: a value (finished with a finite metric) or one of the
    counts (``NOT_VALUE``); a finished run without the metric counts as running.
    """
    df = df.copy()
    for c in (
        "study",
        "model",
        "batch_size",
        "row",
        "label",
        "precision",
        "eval_metric",
        "seed",
        "status",
        "baseline",
        "config_id",
        "setting_id",
        "config_params",
        "start_time",
    ):
        if c not in df.columns:
            df[c] = None
    df["baseline"] = [is_true(v) for v in df["baseline"]]
    # runs without a configuration (hand-made frames) are one configuration per cell, as before
    df["config_id"] = df["config_id"].map(lambda v: "" if v is None or isna(v) else str(v))
    df["setting_id"] = df["setting_id"].map(lambda v: "" if v is None or isna(v) else str(v))
    df["config_params"] = df["config_params"].map(lambda v: v if isinstance(v, dict) else {})
    df["start_time"] = pd.to_numeric(df["start_time"], errors="coerce")
    values = pd.to_numeric(df[metric], errors="coerce") if metric in df.columns else pd.Series(math.nan, index=df.index)
    df["_value"] = values.astype("float64")
    status = df["status"].fillna("running").astype(str).str.lower()
    has_value = df["_value"].notna() & ~df["_value"].isin([math.inf, -math.inf])
    df["_kind"] = "running"
    df.loc[status == "pending", "_kind"] = "pending"
    df.loc[status == "interrupted", "_kind"] = "interrupted"
    df.loc[status == "diverged", "_kind"] = "diverged"
    df.loc[status == "failed", "_kind"] = "failed"
    df.loc[(status == "finished") & has_value, "_kind"] = "value"
    return df, status


def _cell_rows(df: pd.DataFrame, status: pd.Series, metric: str) -> pd.DataFrame:
    """One row per cell (study, setting, model, batch, row, label, precision, configuration): counts and statistics.

    The ``_``-prefixed columns carry what later steps need and the summary does
    not show: the values (``_vals``, and ``_by_seed`` for pairing seeds), the
    counts for the cell text, whether the study marked the row as baseline,
    the configuration's params (to name variants) and its newest start (to
    order configurations of one row newest first).
    """
    keys = ["study", "setting_id", "model", "batch_size", "row", "label", "precision", "config_id"]
    rows = []
    for key, g in df.groupby(keys, dropna=False, sort=False):
        k = dict(zip(keys, key))
        vals = g.loc[g["_kind"] == "value", "_value"].tolist()
        by_seed = {int(s): v for s, v in zip(g.loc[g["_kind"] == "value", "seed"], vals) if not isna(s)}
        counts = {s: int((g["_kind"] == s).sum()) for s in NOT_VALUE}
        evals = [e for e in pd.unique(g["eval_metric"].dropna()) if e]
        latest = g["start_time"].max()
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
                "n_pending": counts["pending"],
                "mean": float(pd.Series(vals).mean()) if vals else math.nan,
                "std": float(pd.Series(vals).std(ddof=1)) if len(vals) > 1 else math.nan,
                "n": len(vals),
                "_marked": bool(g["baseline"].any()),
                "_vals": vals,
                "_by_seed": by_seed,
                "_counts": counts,
                "_params": g["config_params"].iloc[0],
                "_newest": -(latest if not isna(latest) else 0.0),
            }
        )
    return pd.DataFrame(rows)


def _order_cells(runs: pd.DataFrame, out: pd.DataFrame) -> pd.DataFrame:
    """Whole-number batch and row, each cell's setting and variant, and the table order.

    Tables come by study, its latest setting first, then model and batch; rows
    in the study file's order.  The order decides which row is "first" for the
    baseline rule and the row order every renderer prints.
    """
    for c in ("batch_size", "row"):
        out[c] = pd.array([to_int(v) if not isna(v) else None for v in out[c]], dtype="Int64")
    out["setting"], out["_setting_rank"] = _settings(runs, out)
    out["variant"] = _variants(out)
    return out.sort_values(
        ["study", "_setting_rank", "model", "batch_size", "row", "label", "precision", "_newest"],
        kind="stable",
        na_position="last",
    ).reset_index(drop=True)


def _add_cells_and_best(out: pd.DataFrame, metric: str, higher: bool) -> pd.DataFrame:
    """``cell`` (the display text) and ``best`` per row, table by table.

    Best is judged on the numbers as shown (rounded to two decimals), so two
    rows that print the same are both bold; a table with fewer than two values
    has nothing to compare and no best.
    """
    cells, best = [], []
    for _, g in out.groupby(TABLE_KEYS, dropna=False, sort=False):
        usual_runs = int(g["n_runs"].mode().max())  # most common; ties -> the larger
        shown = g["mean"].map(lambda m: round(m * metric_scale(metric), 2) if not math.isnan(m) else math.nan)
        n_with = int(shown.notna().sum())
        target = (shown.max() if higher else shown.min()) if n_with else math.nan
        for i, r in g.iterrows():
            cells.append((i, format_cell(r["_vals"], r["_counts"], int(r["n_runs"]), usual_runs, metric)))
            best.append((i, bool(n_with >= 2 and not math.isnan(shown[i]) and shown[i] == target)))
    out["cell"] = pd.Series(dict(cells))
    out["best"] = pd.Series(dict(best)).astype(bool)
    return out


def latest_setting(runs: pd.DataFrame) -> pd.DataFrame:
    """The runs of each study's latest setting (see :func:`summarize`): what the study plots draw.

    Plots draw one line per row label; two versions of a study file drawn
    together would overlay other settings' curves under one label.
    """
    if runs is None or len(runs) == 0 or "setting_id" not in runs.columns:
        return runs
    start = pd.to_numeric(runs.get("start_time"), errors="coerce").fillna(0.0)
    keep: dict = {}  # study -> (newest start, setting)
    for (study, sid), t in start.groupby([runs["study"], runs["setting_id"]], dropna=False).max().items():
        if study not in keep or t > keep[study][0]:
            keep[study] = (t, sid)
    return runs[[keep.get(st, (0, None))[1] == sid for st, sid in zip(runs["study"], runs["setting_id"])]]


def _settings(runs: pd.DataFrame, cells: pd.DataFrame) -> tuple[list[str], list[int]]:
    """Per cell: its study setting's wording and rank (0: latest), for studies with several settings.

    The setting whose newest trial started last comes first ("latest": the
    study file as last run); each is named by the study-level fields in which
    the settings differ (:func:`lossscale_bench.study.configs.differing_fields`).
    """
    text: dict[tuple, str] = {}
    rank: dict[tuple, int] = {}
    for study, g in runs.groupby("study", dropna=False, sort=False):
        newest = g.groupby("setting_id", sort=False)["start_time"].max().fillna(0.0)
        order = sorted(newest.index, key=lambda sid: -newest[sid])
        for n, sid in enumerate(order):
            rank[(study, sid)] = n
        if len(order) < 2:
            continue
        params = {sid: study_setting(g.loc[g["setting_id"] == sid, "config_params"].iloc[0]) for sid in order}
        fields = differing_fields(params.values())
        for n, sid in enumerate(order):
            what = describe(params[sid], fields) if fields else f"setting {sid[:8]}"
            text[(study, sid)] = f"configuration {n + 1} of {len(order)} ({'latest' if n == 0 else 'earlier'}): {what}"
    keys = list(zip(cells["study"], cells["setting_id"]))
    return [text.get(k, "") for k in keys], [rank.get(k, 0) for k in keys]


def _variants(cells: pd.DataFrame) -> list[str]:
    """Per cell: what tells it from another configuration of the same row in the same table, else ``""``."""
    out = pd.Series("", index=cells.index, dtype=object)
    same_row = ["study", "setting_id", "model", "batch_size", "row", "label", "precision"]
    for _, g in cells.groupby(same_row, dropna=False, sort=False):
        if g["config_id"].nunique() < 2:
            continue
        fields = differing_fields(g["_params"].tolist())
        for i, r in g.iterrows():
            out[i] = describe(r["_params"], fields) if fields else f"configuration {str(r['config_id'])[:8]}"
    return out.tolist()


def table_labels(table: pd.DataFrame) -> list[str]:
    """The row names one table prints, in its order: the label, ``label [variant]`` for a row with two
    configurations in the table, and ``[precision]`` after a name two rows would share."""

    def text(v) -> str:
        return "" if v is None or isna(v) else str(v)

    labels = [
        str(r["label"]) + (f" [{text(r.get('variant'))}]" if text(r.get("variant")) else "")
        for _, r in table.iterrows()
    ]
    dup = {lab for lab in labels if labels.count(lab) > 1}
    return [f"{lab} [{p}]" if lab in dup and not isna(p) else lab for lab, p in zip(labels, table["precision"])]
