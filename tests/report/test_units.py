"""One unit everywhere: mAP in percent, two decimals, in every human-facing
place (progress line, tables in every format, csv), fractions in MLflow; ``--metric`` validated
and labelled by what it is. Checked on one real trial (local executor) in a real SQLite store.
"""

from __future__ import annotations

import io
import re

import pandas as pd
import pytest

from helpers import lsbench, study_yaml

STUDY = study_yaml(
    name="units", dataset={"name": "synthetic", "train_images": 16, "val_images": 8, "image_size": 64, "seed": 0}
)


@pytest.fixture(scope="module")
def studied(tmp_path_factory):
    """(runs dir, tracking URI, the progress lines, the trial's MLflow metrics)."""
    from mlflow import MlflowClient

    from lossscale_bench.orchestration.study_runner import run_study
    from lossscale_bench.study import load_study_text

    root = tmp_path_factory.mktemp("units")
    out = io.StringIO()
    res = run_study(load_study_text(STUDY), runs_dir=root / "runs", executor="local", stream=out)
    assert res.counts()["finished"] == 1, out.getvalue()
    client = MlflowClient(res.tracking_uri)
    exp = client.get_experiment_by_name("units")
    trial = [r for r in client.search_runs([exp.experiment_id]) if r.data.tags.get("lsbench.role") == "trial"][0]
    return root / "runs", res.tracking_uri, out.getvalue(), trial.data.metrics


def _lsbench(*args, cwd):
    return lsbench(*args, cwd=cwd)


def test_progress_line_table_and_mlflow_agree(studied, tmp_path):
    """Before: progress 'mAP 0.0005', table '0.05', MLflow 0.0005: three numbers for one value."""
    from lossscale_bench.report import render
    from lossscale_bench.report.runs import load_runs

    runs, uri, progress, metrics = studied
    frac, frac50 = metrics["final_map"], metrics["final_map_50"]
    assert 0 <= frac <= 1 and 0 <= frac50 <= 1  # MLflow: the fraction COCOeval gives
    m = re.search(r"finished .* mAP (\S+)% mAP@0\.5 (\S+)%", progress)
    assert m, progress
    assert m.group(1) == f"{frac * 100:.2f}" and m.group(2) == f"{frac50 * 100:.2f}"
    df = load_runs(uri, "units")
    for fmt in ("markdown", "html", "latex"):
        assert f"{frac * 100:.2f}" in render(df, fmt)
    assert f"{frac50 * 100:.2f}" in render(df, "markdown", metric="final_map_50")


def test_csv_numbers_are_percent_and_say_so(studied):
    """Before: csv `mean` 0.0005 beside `cell` '0.05'."""
    from lossscale_bench.report import render
    from lossscale_bench.report.runs import load_runs

    runs, uri, _, metrics = studied
    df = load_runs(uri, "units")
    back = pd.read_csv(io.StringIO(render(df, "csv")), dtype={"cell": str})
    assert "mean" not in back.columns and "std" not in back.columns
    assert {"mean_pct", "std_pct", "diff_pct", "diff_ci_low_pct", "diff_ci_high_pct"} <= set(back.columns)
    row = back.iloc[0]
    assert row["mean_pct"] == pytest.approx(metrics["final_map"] * 100)
    assert row["cell"] == f"{row['mean_pct']:.2f}"

    # a csv read back renders the same tables as the store it came from (the csv has no trial counts)
    def tables(text):
        return [ln for ln in text.splitlines() if ln and not ln.startswith("Trials:")]

    assert tables(render(back, "markdown")) == tables(render(df, "markdown"))


@pytest.mark.parametrize(
    "metric, header, note",
    [
        ("final_map", "Validation mAP", "Metric: COCO mAP@[.5:.95] (`final_map`, %)"),
        ("final_map_50", "Validation mAP@0.5", "Metric: COCO mAP@0.5 (`final_map_50`, %)"),
        ("best_map", "Best validation mAP", "(`best_map`, %)"),
    ],
)
def test_metric_is_labelled_by_what_it_is(studied, tmp_path, metric, header, note):
    runs, *_ = studied
    r = _lsbench(
        "report", "--runs-dir", runs, "--metric", metric, "--no-plots", "--reports-dir", tmp_path, cwd=tmp_path
    )
    assert r.returncode == 0, r.stderr[-2000:]
    head = next(ln for ln in r.stdout.splitlines() if ln.startswith("| Model"))
    assert [c.strip() for c in head.strip("|").split("|")][3] == header
    assert note in r.stdout


@pytest.mark.parametrize("metric", ["bogus", "loss", "map"])
def test_unknown_metric_is_one_line_listing_the_choices(studied, tmp_path, metric):
    """Before: `--metric bogus` exited 0 with a table of dashes; `--metric loss` was labelled COCO mAP."""
    runs, *_ = studied
    r = _lsbench("report", "--runs-dir", runs, "--metric", metric, cwd=tmp_path)
    assert r.returncode == 2
    err = [ln for ln in r.stderr.splitlines() if "error" in ln]
    assert len(err) == 1 and metric in err[0]
    assert all(m in err[0] for m in ("final_map", "final_map_50", "best_map"))
    assert "Traceback" not in r.stderr and not list(tmp_path.glob("reports/*"))


def test_render_refuses_an_unknown_metric(studied):
    from lossscale_bench.report import ReportError, render
    from lossscale_bench.report.runs import load_runs

    with pytest.raises(ReportError, match="final_map, final_map_50, best_map"):
        render(load_runs(studied[1], "units"), "markdown", metric="loss")
