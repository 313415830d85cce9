"""The metrics a report can tabulate, what each is called, and its unit.

Why one place: the CLI's ``--metric`` choices, the table header, the note under
the tables and the csv's unit all have to agree; before, ``--metric loss`` was
labelled "COCO mAP" and ``--metric bogus`` printed a table of dashes.

One unit rule, everywhere (README "Units"): MLflow stores mAP as the fraction
COCOeval/VOC evaluation gives (0.512); every human-facing place (progress
lines, report tables in every format, the csv) shows percent with two
decimals (51.20).
"""

from __future__ import annotations

__all__ = ["REPORT_METRICS", "check_metric", "value_header", "is_percent", "PERCENT"]

#: metric name (the trial run's MLflow metric) -> table header; all are mAP, shown in percent
REPORT_METRICS: dict[str, str] = {
    "final_map": "Validation mAP",
    "final_map_50": "Validation mAP@0.5",
    "best_map": "Best validation mAP",
}
PERCENT = 100.0


def check_metric(metric: str) -> str:
    """``metric`` if the report knows it, else a one-line :class:`ReportError` listing the allowed ones."""
    if metric not in REPORT_METRICS:
        from .runs import ReportError

        raise ReportError(
            f"unknown report metric {metric!r}; choose one of: {', '.join(REPORT_METRICS)} "
            "(mAP of the trials' last evaluation, its IoU 0.5 variant, the best evaluation's)"
        )
    return metric


def is_percent(metric: str) -> bool:
    """mAP metrics are fractions in MLflow and percent on screen."""
    return "map" in str(metric).lower()


def value_header(metric: str) -> str:
    """The table's value column: what the number is (the note under the table says the unit)."""
    return REPORT_METRICS.get(metric, metric)
