"""End to end: a micro study through lsbench run -> Ray Tune -> MLflow (SQLite) -> report.

One trial trains normally; one is built to diverge (a 1e30 loss scale that
does not skip non-finite steps), and must end as ``diverged`` while the study
goes on. A second run of the same study trains nothing and adds no runs.
No command prints a library's line (a warning, a log record, a Ray worker's
forwarded output: ``helpers.LIBRARY_LINE``), diverging trial included.
"""

from __future__ import annotations

import subprocess
import sys

import pytest

from helpers import library_lines, study_yaml

MICRO = study_yaml(
    name="micro",
    dataset={"name": "synthetic", "train_images": 16, "val_images": 8, "image_size": 64, "seed": 0},
    precision="fp16-emulated",
    scaling=[
        "{method: fixed, scale: 128}",
        "{method: fixed, scale: 1.0e+30, skip_nonfinite: false, label: blow-up}",
        "{method: adaptive, update_every: 2, init_scale: 16}",
    ],
    schedule={"iterations": 12, "lr": 0.01, "warmup_iterations": 4},
    eval={"every": 6, "metric": "coco"},
    divergence={"patience": 3},
    log_every=4,
)


def _lsbench(*args, cwd):
    return subprocess.run(
        [sys.executable, "-m", "lossscale_bench.cli", *args], cwd=cwd, capture_output=True, text=True, timeout=300
    )


@pytest.mark.slow
def test_micro_study_through_ray_mlflow_and_report(tmp_path):
    from mlflow.tracking import MlflowClient

    study = tmp_path / "micro.yaml"
    study.write_text(MICRO)
    runs = tmp_path / "runs"
    r = _lsbench("run", str(study), "--runs-dir", str(runs), "--num-cpus", "2", cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    assert library_lines(r.stdout + r.stderr) == [] and r.stderr == "", r.stderr[-3000:]
    out = r.stdout
    assert "2 finished, 1 diverged, 0 failed" in out, out
    assert (
        "| Model    | Loss scale       | Batch size | Validation mAP |" in out.replace("  ", " ")
        or "Validation mAP" in out
    )
    assert "| blow-up" in out and "diverged" in out.split("| blow-up", 1)[1].splitlines()[0]
    assert (tmp_path / "reports" / "micro.md").is_file()

    uri = f"sqlite:///{runs / 'mlflow.db'}"
    client = MlflowClient(tracking_uri=uri)
    exp = client.get_experiment_by_name("micro")
    trial_runs = client.search_runs([exp.experiment_id], "tags.`lsbench.role` = 'trial'")
    assert len(trial_runs) == 3
    by_label = {r.data.tags["lsbench.label"]: r for r in trial_runs}
    ok, bad = by_label["loss scale (128)"], by_label["blow-up"]
    assert ok.data.tags["lsbench.status"] == "finished"
    assert bad.data.tags["lsbench.status"] == "diverged"
    assert int(bad.data.tags["lsbench.diverged_step"]) >= 1
    # through the Ray funnel too: the runs table tells them apart (status icon, run name)
    assert (ok.info.status, bad.info.status) == ("FINISHED", "FAILED")
    assert bad.info.run_name.startswith("[diverged] blow-up | ")
    parent = client.search_runs([exp.experiment_id], "tags.`lsbench.role` = 'study'")
    assert len(parent) == 1 and ok.data.tags["mlflow.parentRunId"] == parent[0].info.run_id
    # every step logged: loss and loss_scale histories are complete
    loss = client.get_metric_history(ok.info.run_id, "loss")
    assert sorted(m.step for m in loss) == list(range(1, 13))
    scale = client.get_metric_history(ok.info.run_id, "loss_scale")
    assert {m.value for m in scale} == {128.0}
    assert "final_map" in ok.data.metrics and 0.0 <= ok.data.metrics["final_map"] <= 1.0
    assert ok.data.params["scaling.method"] == "fixed"
    ada = [r for r in trial_runs if r.data.params["scaling.method"] == "adaptive"][0]
    assert ada.data.tags["lsbench.status"] == "finished"
    assert ada.data.tags["lsbench.label"].startswith("adaptive (freq=2")
    assert "ada_scale_log2_max" in ada.data.metrics and "final_map" in ada.data.metrics
    arts = {a.path for a in client.list_artifacts(ada.info.run_id, "layers")}
    assert "layers/layers_history.csv" in arts
    assert {a.path for a in client.list_artifacts(ada.info.run_id, "plots")} >= {
        "plots/loss.png",
        "plots/scale_heatmap.png",
    }

    # second run: nothing trained, no new runs
    r2 = _lsbench("run", str(study), "--runs-dir", str(runs), "--num-cpus", "2", "--no-report", cwd=tmp_path)
    assert r2.returncode == 0, r2.stderr[-3000:]
    assert library_lines(r2.stdout + r2.stderr) == [] and r2.stderr == "", r2.stderr[-3000:]
    assert "3 of 3 trials already finished or diverged" in r2.stdout
    assert "0 finished" in r2.stdout
    again = client.search_runs([exp.experiment_id], "tags.`lsbench.role` = 'trial'")
    assert len(again) == 3
    assert len(client.search_runs([exp.experiment_id], "")) == 4
    # the parent counts the study from the store, not this invocation's (empty) outcomes
    parent = client.search_runs([exp.experiment_id], "tags.`lsbench.role` = 'study'")[0]
    assert (parent.data.metrics["trials_finished"], parent.data.metrics["trials_diverged"]) == (2, 1)

    # report from the store alone
    r3 = _lsbench("report", "--runs-dir", str(runs), "--study", "micro", cwd=tmp_path)
    assert r3.returncode == 0, r3.stderr
    assert library_lines(r3.stdout + r3.stderr) == [], r3.stderr
    assert "diverged" in r3.stdout and "loss scale (128)" in r3.stdout
