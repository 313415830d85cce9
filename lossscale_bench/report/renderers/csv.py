"""CSV renderer: the summary itself, one line per table cell (columns: ``SUMMARY_COLUMNS``).

One unit per file, named in the header: for mAP metrics the numbers (``mean``,
``std``, ``diff`` and its interval) are written in percent, like the ``cell``
text beside them, under ``<name>_pct`` (``mean_pct``, ...); a reader never has
to guess whether 0.79 and "79.27" are the same kind of number.
:func:`from_csv` turns a csv read back into the summary's own units.
"""

from __future__ import annotations

import csv

import pandas as pd

from ..metric_names import PERCENT, is_percent

__all__ = ["render_csv", "from_csv", "to_csv", "PERCENT_COLUMNS"]

#: summary columns in the metric's unit; percent (``_pct``) in the csv for mAP metrics
PERCENT_COLUMNS = (
    "mean",
    "std",
    "diff",
    "diff_ci_low",
    "diff_ci_high",
    "half_width",
    "tost_ci_low",
    "tost_ci_high",
    "margin",
)


def _percent(summary: pd.DataFrame) -> bool:
    metrics = summary["metric"].dropna().astype(str).unique() if "metric" in summary.columns else []
    return len(metrics) > 0 and all(is_percent(m) for m in metrics)


def to_csv(frame: pd.DataFrame, percent_columns) -> str:
    """``frame`` as csv text, ``percent_columns`` in percent as ``<name>_pct`` when its metric is mAP.

    pandas writes through the csv module: a field holding a comma, a quote or a
    line break (a label may hold any of them) is quoted and its quotes doubled,
    so ``csv.reader`` and spreadsheets read the label back as written.
    """
    out = frame.copy()
    if _percent(out):
        present = [c for c in percent_columns if c in out.columns]
        for c in present:
            out[c] = pd.to_numeric(out[c], errors="coerce") * PERCENT
        out = out.rename(columns={c: f"{c}_pct" for c in present})
    return out.to_csv(index=False, lineterminator="\n", quoting=csv.QUOTE_MINIMAL)


def render_csv(summary: pd.DataFrame) -> str:
    """Every summary column (statistics and verdicts included), no markup; an empty summary gives the header."""
    return to_csv(summary, PERCENT_COLUMNS)


def from_csv(df: pd.DataFrame) -> pd.DataFrame:
    """A summary read back from :func:`render_csv`: ``*_pct`` columns back to fractions, under their names."""
    if not any(f"{c}_pct" in df.columns for c in PERCENT_COLUMNS):
        return df
    df = df.copy()
    for c in PERCENT_COLUMNS:
        if f"{c}_pct" in df.columns:
            df[c] = pd.to_numeric(df.pop(f"{c}_pct"), errors="coerce") / PERCENT
    return df
