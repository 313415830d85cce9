"""The mAP at every evaluation of each trial, from one or more runs folders' MLflow stores, as a markdown
table with the mean over trials per step: where a schedule reaches its plateau (FP32 on the
kangaroo photos, to size the E4M3 study). `lsbench report` shows the last (or best) evaluation only.

    python benchmarks/eval_curve.py RUNS_DIR [RUNS_DIR ...] [--metric map] [--study NAME]
                                    [--by-row] [--window STEPS] [--raw]

Each runs folder holds an ``mlflow.db`` (``lsbench run --runs-dir``); every trial run in it (the runs
tagged with a trial id) gives a column, or with ``--by-row`` every row of the study (its label: the
mean over its seeds). ``--window N`` averages each trial's values over windows of N steps first, for the
metrics logged every few steps (``loss``, ``saturate_rate_mean``, ...): how a row's training loss or
telemetry moves over a run, which the report's end-of-run summary does not show (such as why the
dynamic scalers lose less on the photos than on the synthetic shapes).
"""

from __future__ import annotations

import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from harness import Report, markdown_table, parser  # noqa: E402


def curves(
    runs_dirs: list[Path], metric: str, study: str | None = None, by_row: bool = False, window: int | None = None
) -> dict[str, dict[int, float]]:
    """{trial id: {step: value}} for every trial run in the stores (the report's own run finder:
    one study or all, the latest run of a resumed trial), in store and trial-id order.

    ``window``: each trial's values averaged over the steps ``(k-1)*window < step <= k*window``, keyed
    by ``k*window`` (so a run of 1500 steps logged every 10 ends with the window keyed 1500). ``by_row``: {row label: {step: mean over the row's trials}},
    in the order the rows first appear (a mean over seeds that have a value at that step)."""
    from mlflow.tracking import MlflowClient

    from lossscale_bench.report.runs import load_runs

    out: dict[str, dict[int, float]] = {}
    labels: dict[str, str] = {}
    for d in runs_dirs:
        uri = f"sqlite:///{Path(d).resolve() / 'mlflow.db'}"
        client = MlflowClient(tracking_uri=uri)
        runs = load_runs(uri, study)
        for tid, run_id, label in sorted(zip(runs["trial_id"], runs["run_id"], runs["label"])):
            hist = client.get_metric_history(run_id, metric)
            if hist:
                labels[tid] = str(label)
                out[tid] = _windowed({m.step: m.value for m in hist}, window)
    if not by_row:
        return out
    rows: dict[str, list[dict[int, float]]] = {}
    for tid, c in out.items():
        rows.setdefault(labels[tid], []).append(c)
    return {
        lab: {s: statistics.fmean(c[s] for c in cs if s in c) for s in sorted({s for c in cs for s in c})}
        for lab, cs in rows.items()
    }


def _windowed(values: dict[int, float], window: int | None) -> dict[int, float]:
    if not window:
        return values
    bins: dict[int, list[float]] = {}
    for step, v in values.items():
        bins.setdefault(-(-step // window) * window, []).append(v)
    return {s: statistics.fmean(vs) for s, vs in sorted(bins.items())}


def table_rows(cols: dict[str, dict[int, float]], percent: bool = True) -> tuple[list[str], list[list[str]]]:
    """The header and rows of :func:`table`."""

    def fmt(v: float) -> str:
        return f"{100 * v:.1f}" if percent else f"{v:.4g}"

    steps = sorted({s for c in cols.values() for s in c})
    names = list(cols)
    rows = []
    for s in steps:
        vals = [cols[n].get(s) for n in names]
        have = [v for v in vals if v is not None]
        mean = f"{fmt(statistics.fmean(have))} ({len(have)})" if have else ""
        rows.append([s] + ["" if v is None else fmt(v) for v in vals] + [mean])
    return ["step", *names, "mean (n)"], rows


def table(cols: dict[str, dict[int, float]], percent: bool = True) -> str:
    """Steps down, trials (or rows) across, and the mean over those with a value at the step."""
    return markdown_table(*table_rows(cols, percent))


def main(argv=None) -> int:
    ap = parser(__doc__)
    ap.add_argument("runs_dirs", nargs="+", type=Path)
    ap.add_argument("--metric", default="map", help="the MLflow metric (default: map, the evaluation's mAP)")
    ap.add_argument("--study", help="only this study's trials (its name; default: every study in the stores)")
    ap.add_argument("--by-row", action="store_true", help="a column per row of the study (mean over its seeds)")
    ap.add_argument(
        "--window", type=int, metavar="STEPS", help="average each trial's values over windows of STEPS steps"
    )
    ap.add_argument("--raw", action="store_true", help="print the values as logged (default: in percent)")
    a = ap.parse_args(argv)
    if a.window is not None and a.window < 1:
        ap.error(f"--window: {a.window}: a number of steps, 1 or more")
    for d in a.runs_dirs:
        if not (d / "mlflow.db").is_file():
            ap.error(f"{d}: no mlflow.db in it (a runs folder made by lsbench run --runs-dir)")
    cols = curves(a.runs_dirs, a.metric, a.study, by_row=a.by_row, window=a.window)
    unit = "as logged" if a.raw else "in percent"
    over = f", averaged over windows of {a.window} steps (keyed by the window's end)" if a.window else ""
    rep = Report.from_args(a)
    rep.table(*table_rows(cols, percent=not a.raw), name=a.metric)
    rep.note(
        f"\n{a.metric} {unit}{over}; the mean over the {'rows' if a.by_row else 'trials'} with a value at that step."
    )
    rep.finish()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
