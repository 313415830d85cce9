"""The mAP at every evaluation of each trial, from one or more runs folders' MLflow stores, as a markdown
table with the mean over trials per step: where a schedule reaches its plateau (issue 31: FP32 on the
kangaroo photos before sizing the E4M3 study). `lsbench report` shows the last (or best) evaluation only.

    python benchmarks/eval_curve.py RUNS_DIR [RUNS_DIR ...] [--metric map] [--study NAME]

Each runs folder holds an ``mlflow.db`` (``lsbench run --runs-dir``); every trial run in it (the runs
tagged with a trial id) gives a column.
"""

from __future__ import annotations

import argparse
import statistics
from pathlib import Path


def curves(runs_dirs: list[Path], metric: str, study: str | None = None) -> dict[str, dict[int, float]]:
    """{trial id: {step: value}} for every trial run in the stores (the report's own run finder:
    one study or all, the latest run of a resumed trial), in store and trial-id order."""
    from mlflow.tracking import MlflowClient

    from lossscale_bench.report.runs import load_runs

    out: dict[str, dict[int, float]] = {}
    for d in runs_dirs:
        uri = f"sqlite:///{Path(d).resolve() / 'mlflow.db'}"
        client = MlflowClient(tracking_uri=uri)
        runs = load_runs(uri, study)
        for tid, run_id in sorted(zip(runs["trial_id"], runs["run_id"])):
            hist = client.get_metric_history(run_id, metric)
            if hist:
                out[tid] = {m.step: m.value for m in hist}
    return out


def table(cols: dict[str, dict[int, float]]) -> str:
    steps = sorted({s for c in cols.values() for s in c})
    names = list(cols)
    lines = ["| step | " + " | ".join(names) + " | mean (n) |", "|---" * (len(names) + 2) + "|"]
    for s in steps:
        vals = [cols[n].get(s) for n in names]
        have = [v for v in vals if v is not None]
        cells = ["" if v is None else f"{100 * v:.1f}" for v in vals]
        mean = f"{100 * statistics.fmean(have):.1f} ({len(have)})" if have else ""
        lines.append(f"| {s} | " + " | ".join(cells) + f" | {mean} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("runs_dirs", nargs="+", type=Path)
    ap.add_argument("--metric", default="map", help="the MLflow metric (default: map, the evaluation's mAP)")
    ap.add_argument("--study", help="only this study's trials (its name; default: every study in the stores)")
    a = ap.parse_args(argv)
    for d in a.runs_dirs:
        if not (d / "mlflow.db").is_file():
            ap.error(f"{d}: no mlflow.db in it (a runs folder made by lsbench run --runs-dir)")
    print(table(curves(a.runs_dirs, a.metric, a.study)) + f"\n\n{a.metric} in percent; the mean over the trials with a value at that step.")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
