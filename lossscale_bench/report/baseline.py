"""Each row of a report table against the table's baseline row: the numbers and the verdict it shows.

A table is one study setting, model and batch size (:data:`TABLE_KEYS`). Its baseline is the row the
study marked ``baseline: true``, else its first fp32 row; a table without one gets no verdicts.
:func:`add_verdicts` compares every other row with it (:func:`~.verdicts.compare_cells`: paired by
seed where it can, else Welch) and fills the summary's comparison columns.
"""

from __future__ import annotations

import math

import pandas as pd

from .stats import ALPHA
from .verdicts import compare_cells, diverged_against

#: the numeric columns a row's comparison with the baseline fills (NaN where no test ran)
VERDICT_NUMBERS = (
    "p_value",
    "diff",
    "diff_ci_low",
    "diff_ci_high",
    "half_width",
    "tost_p",
    "tost_ci_low",
    "tost_ci_high",
    "margin",
    "seeds_needed",
    "p_better",
    "p_better_low",
    "p_better_high",
    "shapiro_p",
    "wilcoxon_p",
    "rank_tost_p",
)

__all__ = ["NO_BASELINE", "TABLE_KEYS", "add_verdicts", "VERDICT_NUMBERS"]

#: one table: a study's setting (one version of its file), model and batch size
TABLE_KEYS = ["study", "setting_id", "model", "batch_size"]


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


#: the ``outcome`` of a row whose table's baseline has no value to compare with
NO_BASELINE = "no baseline values"


def _no_baseline_text(counts: dict[str, int]) -> str:
    """``baseline has no values (2 diverged, 0 failed)``: why no row of the table could be compared; runs
    still to come (running, pending, interrupted) are named where there are any."""
    parts = [f"{counts['diverged']} diverged", f"{counts['failed']} failed"]
    parts += [f"{counts[s]} {s}" for s in ("running", "pending", "interrupted") if counts[s]]
    return f"baseline has no values ({', '.join(parts)})"


def _ended(out: pd.DataFrame, i) -> tuple[int, int]:
    """(diverged, ended) of a cell: its diverged seeds, and those that finished with a value or diverged."""
    diverged = int(out.at[i, "_counts"]["diverged"])
    return diverged, len(out.at[i, "_vals"]) + diverged


def add_verdicts(out: pd.DataFrame, higher: bool, margin: float, shown_scale: float) -> pd.DataFrame:
    """``baseline``, ``baseline_label`` and the comparison's numbers and ``verdict`` per row.

    ``margin`` is in the metric's unit, ``shown_scale`` turns it into the tables' (percent).
    Tables without a baseline row get no verdicts (empty strings, NaN numbers):
    a comparison with an arbitrary row would look like a finding.  A baseline
    row with no value (every seed diverged, failed or not yet run) cannot be
    compared with: every other row says so (:func:`_no_baseline_text`), not
    "too few seeds", which would blame the row's own seeds.
    """
    out = out.copy()
    for c in VERDICT_NUMBERS:
        out[c] = math.nan
    for c in ("baseline_label", "outcome", "test", "verdict"):
        out[c] = pd.Series("", index=out.index, dtype=object)
    out["baseline"] = False
    for _, g in out.groupby(TABLE_KEYS, dropna=False, sort=False):
        b = _baseline_index(g)
        if b is None:
            continue
        base_label = str(out.at[b, "label"])
        empty = _no_baseline_text(out.at[b, "_counts"]) if not out.at[b, "_vals"] else ""
        for i in g.index:
            out.at[i, "baseline_label"] = base_label
            if i == b:
                out.at[i, "baseline"] = True
                out.at[i, "verdict"] = "baseline"
                continue
            if empty:  # no test, but the margin the table was judged at (the verdict note names it)
                out.at[i, "outcome"], out.at[i, "verdict"], out.at[i, "margin"] = NO_BASELINE, empty, margin
                continue
            v = compare_cells(
                out.at[i, "_vals"],
                out.at[i, "_by_seed"],
                out.at[b, "_vals"],
                out.at[b, "_by_seed"],
                margin=margin,
                alpha=ALPHA,
                higher_is_better=higher,
                shown_scale=shown_scale,
            )
            v = diverged_against(v, *_ended(out, i), *_ended(out, b), who=("", "the baseline"))
            for c in (*VERDICT_NUMBERS, "outcome", "test", "verdict"):
                out.at[i, c] = v[c]
    return out
