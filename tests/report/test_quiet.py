"""No library line on the terminal during ``lsbench report``: MLflow's "Downloading
artifacts" progress bars (one per layer history read for the heatmaps) and numpy/matplotlib overflow
warnings (a scale of 1e300 in the store) used to appear. Through the real CLI on a real store."""

from __future__ import annotations

import warnings

from plot_store import _trial

from helpers import lsbench


def test_report_prints_no_library_lines(tmp_path):
    from mlflow import MlflowClient

    uri = f"sqlite:///{tmp_path.resolve()}/mlflow.db"
    client = MlflowClient(tracking_uri=uri)
    from lossscale_bench.tracking import relative_artifact_location

    # the artifact location real studies get (resolved against the store's folder on read)
    exp = client.create_experiment("quiet", artifact_location=relative_artifact_location("quiet"))
    parent = client.create_run(exp, tags={"lsbench.role": "study", "lsbench.study": "quiet"}).info.run_id
    for seed in (0, 1):
        _trial(
            client,
            exp,
            parent,
            "quiet",
            tmp_path / "csv",
            trial_id=f"a-s{seed}",
            row=0,
            label="FP32 baseline",
            status="finished",
            seed=seed,
            method="none",
            precision="fp32",
            final_map=0.3,
            layers="fixed",
        )
        _trial(
            client,
            exp,
            parent,
            "quiet",
            tmp_path / "csv",
            trial_id=f"b-s{seed}",
            row=1,
            label="huge",
            status="finished",
            seed=seed,
            final_map=0.2,
            layers="adaptive",
            scale_path=lambda s: 1e300 if s > 3 else 2.0**s,
        )
    p = lsbench("report", "--tracking-uri", uri, "--reports-dir", tmp_path / "reports", cwd=tmp_path)
    assert p.returncode == 0, p.stderr
    assert list((tmp_path / "reports").glob("*underflow*.png")), "the heatmaps (which read artifacts) were drawn"
    noise = [ln for ln in p.stderr.splitlines() if not ln.startswith("(written to")]
    assert noise == [], noise


def test_plots_of_a_scale_past_float_range_warn_nothing():
    from lossscale_bench.report.draw import curves_png

    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        png = curves_png(
            {"p": {"huge": [[(0, 1.0), (1, 1e300), (2, 1e308)]], "b": [[(0, 1.0), (1, 2.0)]]}},
            ylabel="scale",
            log2=True,
        )
    assert png and [str(w.message) for w in seen] == []
