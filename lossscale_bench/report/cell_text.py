"""What one table cell says: its text from a row's seed values and run counts, and how a metric is shown.

:mod:`lossscale_bench.report.summary` computes a row's values and writes its cells with these; the tables,
renderers and comparisons read the metric helpers (which way is better, the scale a metric is shown at).
"""

from __future__ import annotations

import pandas as pd

__all__ = [
    "NOT_VALUE",
    "RUNNING_TEXT",
    "format_cell",
    "format_value",
    "higher_is_better",
    "is_map_metric",
    "metric_scale",
]

RUNNING_TEXT = "–"  # en dash: still running, or no value for the metric yet
#: what a cell counts beside its values; ``interrupted``: stopped by a signal (SIGINT/SIGTERM), resumed by
#: the next ``lsbench run`` of a study file that lists it (it used to read as "running")
NOT_VALUE = ("diverged", "failed", "running", "pending", "interrupted")


def is_map_metric(metric: str) -> bool:
    """Whether ``metric`` is an mAP (a fraction, shown in percent)."""
    return "map" in metric.lower()


def higher_is_better(metric: str) -> bool:
    """Whether a larger value of ``metric`` is the better one (not for losses, skips, overflows)."""
    return "loss" not in metric.lower() and "skipped" not in metric.lower() and "overflow" not in metric.lower()


def metric_scale(metric: str) -> float:
    """mAP values are fractions; tables show percent."""
    return 100.0 if is_map_metric(metric) else 1.0


def format_value(value: float, metric: str) -> str:
    """``value`` as a table shows it: percent for mAP, two decimals."""
    return f"{value * metric_scale(metric):.2f}"


def format_cell(values: list[float], counts: dict[str, int], n_runs: int, table_n_runs: int, metric: str) -> str:
    """Display text of one cell: ``mean ± std (n=k, j/m diverged)``.

    ``n=k`` (the seeds that finished with a value, what mean and std are over)
    is shown whenever the cell has several seeds, so a reader never has to
    guess how many runs a ± stands on; a one-seed cell stays a bare number
    unless the table's usual runs per cell (``table_n_runs``) differ.
    ``pending`` (created, not started) is counted apart from ``running``, as in
    the study's ``Trials:`` line.
    """
    notes = [f"{counts[s]}/{n_runs} {s}" for s in NOT_VALUE if counts[s]]
    if values:
        text = format_value(pd.Series(values).mean(), metric)
        if len(values) > 1:
            text += f" ± {format_value(pd.Series(values).std(ddof=1), metric)}"
        if len(values) > 1 or n_runs > 1 or len(values) != table_n_runs:
            notes.insert(0, f"n={len(values)}")
        if notes:
            text += f" ({', '.join(notes)})"
        return text
    waiting = counts["running"] + counts["pending"]
    if waiting:
        if waiting == n_runs:
            return RUNNING_TEXT
        notes = [n for n in notes if not n.endswith(" running")]  # the dash says it
        return f"{RUNNING_TEXT} ({', '.join(notes)})" if notes else RUNNING_TEXT
    if counts["interrupted"] == n_runs:
        return "interrupted"
    if counts["diverged"] == n_runs:
        return "diverged"
    if counts["failed"] == n_runs:
        return "failed"
    if counts["diverged"]:
        return f"diverged ({counts['failed']}/{n_runs} failed)"
    return RUNNING_TEXT
