"""CSV renderer: the summary itself, one line per table cell (columns: ``SUMMARY_COLUMNS``)."""

from __future__ import annotations

import pandas as pd

__all__ = ["render_csv"]


def render_csv(summary: pd.DataFrame) -> str:
    """Every summary column (statistics and verdicts included), no markup; an empty summary gives the header."""
    return summary.to_csv(index=False, lineterminator="\n")
