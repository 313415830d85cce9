"""Each row's cost per image relative to FP32, as the study's own trials measured it.

``trial_cost.py`` times a row's parts in a process of its own; this script reads what the trials of a
finished study logged while ``lsbench run`` ran them (two at a time, telemetry at the study's
``log_every``, the row's own scaler): MLflow's ``images_per_sec``, one value per logged window. Per
trial, the median over its windows; per row, the mean over its seeds; the cost is the baseline row's
images/s over the row's. Rows ran side by side with the baseline in the same run, so machine speed
cancels in the ratio (not the load: run the study alone).

    .venv/bin/python benchmarks/row_cost.py runs/mlflow.db smoke

Prints a markdown table for docs/records/index.md.
"""

from __future__ import annotations

import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from harness import Report, parser  # noqa: E402


def row_rates(db: Path, study: str) -> list[tuple[str, int, float]]:
    """``(row label, trials, mean over trials of the median images/s)`` in the study's row order."""
    from mlflow import MlflowClient

    from lossscale_bench.report.runs import load_runs

    uri = f"sqlite:///{db.resolve()}"
    runs = load_runs(uri, study)
    client = MlflowClient(tracking_uri=uri)
    out = []
    for label, group in runs.groupby("label", sort=False):
        medians = []
        for run_id in group["run_id"]:
            values = [m.value for m in client.get_metric_history(run_id, "images_per_sec")]
            if values:
                medians.append(statistics.median(values))
        if medians:
            out.append((label, len(medians), statistics.mean(medians)))
    return out


def main(argv=None) -> int:
    ap = parser(__doc__)
    ap.add_argument("db", type=Path, help="the study's MLflow SQLite file (runs/mlflow.db)")
    ap.add_argument("study", help="the study's name")
    ap.add_argument("--baseline", default="FP32 baseline", help="the baseline row's label")
    args = ap.parse_args(argv)
    rates = row_rates(args.db, args.study)
    base = dict((label, rate) for label, _, rate in rates).get(args.baseline)
    if base is None:
        print(f"row_cost: no row labelled {args.baseline!r} in study {args.study!r}", file=sys.stderr)
        return 2
    rep = Report.from_args(args)
    rep.table(
        ["row", "trials", "images/s (median per trial, mean)", "cost per image vs FP32"],
        [[label, n, f"{rate:.1f}", f"{base / rate:.2f}x"] for label, n, rate in rates],
        name="rows",
    )
    rep.finish()
    return 0


if __name__ == "__main__":
    sys.exit(main())
