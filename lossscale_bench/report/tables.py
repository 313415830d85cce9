"""What every table format shows, before any markup: headings, rows, footnotes.

:func:`report_tables` turns a summary (:func:`lossscale_bench.report.summary.summarize`)
into (study, model, batch, rows, has_baseline) tuples and
:func:`study_notes` gives the footnotes under a study's tables; the
markdown, html and latex renderers only add their own markup around them.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable

import pandas as pd

from ..study.precisions import PRECISION_SPECS, is_emulated
from .cell_text import is_map_metric, metric_scale
from .runs import STATUSES, isna, model_name
from .stats import ALPHA, DEFAULT_MARGIN, MAX_SEEDS, format_margin
from .summary import table_labels

__all__ = [
    "HEADERS",
    "VS_HEADER",
    "SEEDS_NOTE",
    "verdict_note",
    "EMULATED_MARK",
    "EMULATION_NOTES",
    "TableStudy",
    "TOST_CI_NOTE",
    "P_BETTER_NOTE",
    "interval_text",
    "emulation_notes",
    "table_heading",
    "margin_text",
    "metric_description",
    "needs_text",
    "p_better_text",
    "column_text",
    "bold_split",
    "study_notes",
    "report_tables",
]

_EVAL_METRIC_NAMES = {"coco": "COCO mAP@[.5:.95]", "voc07": "VOC07 11-point mAP", "voc": "VOC area mAP"}
_EVAL_METRIC_NAMES_50 = {"coco": "COCO mAP@0.5", "voc07": "VOC07 11-point mAP", "voc": "VOC area mAP"}

EMULATED_MARK = "†"
#: what each emulation rounds; an emulation not listed here gets a generic note
EMULATION_NOTES: dict[str, str] = {n: p.note for n, p in PRECISION_SPECS.items() if p.emulated and p.note}

HEADERS = ("Model", "Loss scale", "Batch size")
VS_HEADER = "vs baseline"


def metric_description(metric: str, eval_metrics: Iterable[str], best: bool = True) -> str:
    """The note under a table saying which metric its values are (and that the best is bold)."""
    names = _EVAL_METRIC_NAMES_50 if metric.endswith("_50") else _EVAL_METRIC_NAMES
    evals = sorted({e for em in eval_metrics if em for e in str(em).split(",")})
    what = " / ".join(names.get(e, e) for e in evals) or "unknown evaluation metric"
    unit = ", %" if is_map_metric(metric) else ""
    return f"Metric: {what} (`{metric}`{unit})." + (" Best per table in bold." if best else "")


SEEDS_NOTE = (
    "Several seeds: mean ± sample std over the n seeds that finished with a value "
    "(diverged, failed and running seeds are counted beside it, not averaged)."
)


def margin_text(margin: float, metric: str) -> str:
    """``±1.0 mAP``: the equivalence margin as the tables show it."""
    return f"±{format_margin(margin)}" + (" mAP" if is_map_metric(metric) else "")


def verdict_note(metric: str, margin: float = DEFAULT_MARGIN) -> str:
    """How to read the ``vs baseline`` column; printed under tables that have one (``margin``: as shown)."""
    unit = "percentage points" if is_map_metric(metric) else "the metric's unit"
    m = margin_text(margin, metric)
    return (
        f"{VS_HEADER}: the row's seed values against the baseline row's (the scaling entry marked "
        "`baseline: true` in the study, else the first fp32 row), two-sided, "
        f"alpha {ALPHA:g}: p < {ALPHA:g} reads as worse/better than baseline. "
        f"Otherwise, equivalent: the 95% two one-sided tests (TOST) put the difference inside {m} "
        f"(its 90% interval lies inside {m}); inconclusive: neither a difference nor equivalence shown at "
        f"this n, with roughly how many seeds would bring the 95% interval to {m} if the spread stayed as "
        "observed (paired: the sd of the per-seed differences; Welch: that many seeds in each row). "
        f"The margin is the study's `report: {{equivalence_margin: {format_margin(margin)}}}` or "
        "`lsbench report --margin`. "
        "When both rows finished the same seeds (a seed fixes the initial weights and the batches), a paired "
        "t-test of the per-seed differences (marked paired); otherwise Welch's t-test (unequal variances). "
        "n is the number of seeds that finished with a value; fewer than 2 on either side: too few seeds; "
        "none in the baseline row: baseline has no values (its seeds counted by status). "
        "Diverged, failed and running seeds are left out of the test (the cell counts them); a row that "
        "diverged on more seeds than the baseline is never equivalent (diverged on k of n seeds). "
        "The paired tests' 5% assumes roughly normal per-seed differences: a paired row whose differences "
        "Shapiro–Wilk flags (p < 0.05, from 3 seeds) says so, and keeps a verdict only where the Wilcoxon "
        "signed-rank test (a difference) or the rank TOST (equivalence) agrees. "
        f"Δ: row mean − baseline mean ({unit}) with its 95% confidence interval "
        "(paired: n−1 degrees of freedom; Welch: Welch–Satterthwaite); "
        f"{TOST_CI_NOTE} "
        f"{_P_SYMBOL}: the probability that the row beats the baseline, {P_BETTER_NOTE}"
    )


#: how an equivalent row's interval reads (the main tables and ``--compare``)
TOST_CI_NOTE = (
    "on an equivalent row, the 90% interval the two one-sided tests decided on, marked 90% CI: it "
    "lies inside the margin, where the 95% interval may not."
)
#: how P(>) and its interval are computed (the main tables and ``--compare``, after "P(A > B): ")
P_BETTER_NOTE = (
    "paired: the share of seeds on which it does (ties count one half), with an exact binomial "
    "(Clopper–Pearson) 95% interval for the chance of winning on a seed (a tie counted either way); "
    "Welch: the Mann–Whitney probability U/(n·m) over all pairs of values, without an interval "
    "(the pairs share their values, and no exact interval exists)."
)


_P_SYMBOL = "P(>)"


def column_text(value) -> str:
    """A summary string column's value; a csv read back has NaN where it was empty."""
    return "" if value is None or isna(value) else str(value)


def _number(r, key: str) -> float:
    """A summary number column's value, NaN where it is missing (a csv from before the column existed)."""
    v = r.get(key)
    try:
        return float(v)
    except (TypeError, ValueError):
        return math.nan


def _seeds_text(needed: float, paired: bool) -> str:
    if math.isinf(needed):
        return f"more than {MAX_SEEDS} seeds"
    return f"~{int(needed)} seeds" + ("" if paired else " per row")


def needs_text(r, margin_shown: float, n: float) -> str:
    """``; ±1.0 needs ~12 seeds``: what an inconclusive row would take to resolve."""
    needed = _number(r, "seeds_needed")
    if math.isnan(needed):
        return ""
    m = f"±{format_margin(margin_shown)}"
    if not math.isnan(n) and needed <= n:  # the interval is already that narrow: Δ sits too close to the margin
        return f"; Δ too close to {m} to show equivalence"
    return f"; {m} needs {_seeds_text(needed, column_text(r.get('test')) == 'paired')}"


def p_better_text(p: float, lo: float, hi: float, symbol: str = _P_SYMBOL) -> str:
    """``P(>)=0.67 [0.33, 1.00]`` (no ``symbol``: ``0.67 [0.33, 1.00]``); without an interval, the number alone."""
    if math.isnan(p):
        return ""
    return (
        (f"{symbol}=" if symbol else "")
        + f"{p:.2f}"
        + (f" [{lo:.2f}, {hi:.2f}]" if not (math.isnan(lo) or math.isnan(hi)) else "")
    )


def interval_text(r, k: float) -> str:
    """``+0.30 [-0.20, +0.80]`` (the 95% interval), or on an equivalent row the interval TOST decided on,
    ``+0.30, 90% CI [-0.04, +0.64]`` (:data:`TOST_CI_NOTE`); ``k`` scales to the tables' unit."""
    diff = _number(r, "diff")
    lo, hi = _number(r, "diff_ci_low"), _number(r, "diff_ci_high")
    mark = ""
    t_lo, t_hi = _number(r, "tost_ci_low"), _number(r, "tost_ci_high")
    if column_text(r.get("outcome")) == "equivalent" and not (math.isnan(t_lo) or math.isnan(t_hi)):
        lo, hi, mark = t_lo, t_hi, ", 90% CI"
    return f"{diff * k:+.2f}" + ("" if math.isnan(lo) else f"{mark} [{lo * k:+.2f}, {hi * k:+.2f}]")


def _vs_text(r, metric: str) -> str:
    """The ``vs baseline`` cell: the verdict, Δ with its CI (:func:`interval_text`) and P(>) where a
    test was run, and for an inconclusive row the seeds it would take."""
    verdict = column_text(r.get("verdict"))
    p, diff, lo, hi = (_number(r, c) for c in ("p_value", "diff", "diff_ci_low", "diff_ci_high"))
    if not verdict or any(math.isnan(v) for v in (p, diff, lo, hi)):
        return verdict
    k = metric_scale(metric)
    text = f"{verdict}, Δ {interval_text(r, k)}"
    pb = p_better_text(*(_number(r, c) for c in ("p_better", "p_better_low", "p_better_high")))
    text += f", {pb}" if pb else ""
    margin = _number(r, "margin")
    if column_text(r.get("outcome")) == "inconclusive" and not math.isnan(margin):
        text += needs_text(r, margin * k, _number(r, "n"))
    return text


class TableStudy(str):
    """The study name a table belongs to, carrying the table's ``setting`` (empty when the study has one).

    :func:`report_tables` yields it first, so a renderer passes it to :func:`table_heading`
    and the heading says which configuration of the study the table shows.
    """

    setting: str = ""

    def __new__(cls, study, setting: str = ""):
        obj = super().__new__(cls, "" if study is None else str(study))
        obj.setting = setting
        return obj


def report_tables(summary: pd.DataFrame, metric: str = "final_map"):
    """Yield (study, model, batch_size, table_rows, has_baseline) in report order.

    One table per (study, study setting, model, batch size): a study whose file
    changed under the same name has a table per version, and ``study`` (a
    :class:`TableStudy`) carries the setting's wording for :func:`table_heading`.
    table_rows: list of (label, cell, best, emulated, vs_baseline) in row order;
    a row with two configurations in one table shows each as ``label [variant]``.
    ``has_baseline``: the table has a baseline row, so it gets a ``vs baseline`` column.
    """
    keys = [k for k in ("study", "setting_id", "model", "batch_size") if k in summary.columns]
    if "setting_id" not in summary.columns:  # a summary from before configurations (a csv read back)
        keys = ["study", "model", "batch_size"]
    for key, g in summary.groupby(keys, dropna=False, sort=False):
        k = dict(zip(keys, key))
        study, model, bs = k["study"], k["model"], k["batch_size"]
        setting = column_text(g["setting"].iloc[0]) if "setting" in g.columns else ""
        rows = [
            (label, str(r["cell"]), bool(r["best"]), is_emulated(r["precision"]), _vs_text(r, metric))
            for label, (_, r) in zip(table_labels(g), g.iterrows())
        ]
        has_baseline = "verdict" in g.columns and g["verdict"].map(column_text).eq("baseline").any()
        yield TableStudy(study, setting), model, bs, rows, bool(has_baseline)


def bold_split(cell: str) -> tuple[str, str]:
    """'79.27 ± 0.12 (n=2)' -> ('79.27', ' ± 0.12 (n=2)')."""
    m = re.match(r"^(-?[0-9.]+)(.*)$", cell)
    return (m.group(1), m.group(2)) if m else (cell, "")


def table_heading(study, model, bs) -> str:
    """``study: SSD-tiny batch 8``, and the table's configuration when its study has several."""
    bs_text = "?" if isna(bs) else str(bs)
    setting = getattr(study, "setting", "")
    return f"{study}: {model_name(model)} batch {bs_text}" + (f" — {setting}" if setting else "")


def emulation_notes(precisions: Iterable) -> list[str]:
    """One † line per emulation that appears, in registry-ish order (fp16 before fp8)."""
    found = sorted(
        {str(p) for p in precisions if is_emulated(p)},
        key=lambda p: (list(EMULATION_NOTES).index(p) if p in EMULATION_NOTES else len(EMULATION_NOTES), p),
    )
    lines = []
    for p in found:
        note = EMULATION_NOTES.get(p, "these numbers come from a CPU emulation, not real low precision.")
        lines.append(f"{EMULATED_MARK} {p}: {note}")
    return lines


def study_notes(summary: pd.DataFrame, runs_of_study: pd.DataFrame | None, metric: str) -> list[str]:
    """Footnotes under a study's tables; each says only what its tables show."""
    lines = [metric_description(metric, summary["eval_metric"].dropna().tolist())]
    if (pd.to_numeric(summary["n_values"], errors="coerce") > 1).any():
        lines.append(SEEDS_NOTE)
    if any(has for *_, has in report_tables(summary, metric)):
        lines.append(verdict_note(metric, table_margin(summary, metric)))
    n = runs_of_study
    if n is not None and len(n):
        lines += _trial_counts(summary, n)
    lines += emulation_notes(summary["precision"].dropna())
    if n is not None and "data_dropped" in n.columns:
        lines += _data_notes(n["data_dropped"])
    return lines


def table_margin(summary: pd.DataFrame, metric: str) -> float:
    """The equivalence margin the summary was tested at, as the tables show it (default: none recorded)."""
    margins = pd.to_numeric(summary.get("margin", pd.Series(dtype=float)), errors="coerce").dropna().unique()
    return float(margins[0]) * metric_scale(metric) if len(margins) else DEFAULT_MARGIN


def _data_notes(dropped: pd.Series) -> list[str]:
    """One line per distinct record of dropped annotations (``dataset.bad_annotations: drop``).

    Every trial of a study reads the same data, so the usual case is one line; trials of an
    earlier data set (a changed tree has new trial ids) add their own. The numbers in the
    tables were computed without these objects, and a reader must see that under them.
    """
    seen: list[dict] = []
    for d in dropped:
        if isinstance(d, dict) and d and d not in seen:
            seen.append(d)
    lines = []
    for d in seen:
        parts = []
        for split in ("train", "val"):
            if split in d:
                what = ", ".join(f"{k} {v}" for k, v in sorted(d[split].items()))
                parts.append(f"{split} {sum(d[split].values())} ({what})")
        lines.append("Data: annotations dropped under dataset.bad_annotations: drop: " + "; ".join(parts) + ".")
    return lines


def _count_text(runs: pd.DataFrame) -> str:
    st = runs["status"].fillna("running").astype(str).str.lower()
    parts = [f"{int((st == s).sum())} {s}" for s in ("finished", "diverged", "failed", "running")]
    parts += [f"{int((st == s).sum())} {s}" for s in sorted(set(st) - set(STATUSES))]  # e.g. pending
    return f"{len(runs)} ({', '.join(parts)})"


def _trial_counts(summary: pd.DataFrame, runs: pd.DataFrame) -> list[str]:
    """The ``Trials:`` line; with several configurations of the study, one count per configuration.

    Each configuration's counts are its own trials' (the cells count the same
    way), so failed trials of an earlier study file never read as failures of
    the current one.
    """
    lines = [f"Trials: {_count_text(runs)}."]
    if "setting_id" not in runs.columns or "setting" not in summary.columns:
        return lines
    names = {}
    for sid, text in zip(summary.get("setting_id", []), summary["setting"]):
        if column_text(text):
            names.setdefault(sid, column_text(text))
    if len(names) < 2:
        return lines
    lines.append(
        "The store holds several configurations of this study (its file changed under the same name): "
        "each has its own tables, headed by the fields in which they differ; seeds are pooled only "
        "within one configuration. Latest: the configuration whose newest trial started last."
    )
    for sid, text in sorted(names.items(), key=lambda kv: kv[1]):
        lines.append(f"Trials of {text}: {_count_text(runs[runs['setting_id'] == sid])}.")
    return lines
