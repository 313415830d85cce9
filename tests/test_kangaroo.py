"""The real-photo path: a few training steps on the 164 kangaroo photos through ``lsbench run``
(Ray Tune, MLflow, the report), scored with the VOC07 metric on all 32 test photos.

Every other end-to-end test trains on generated shapes: square images, three channels, no EXIF, boxes well
inside. The photos are of many sizes (277 to 1000+ px), 62 of their 266 boxes touch the border, two carry
invalid EXIF orientation tags, and 00090.jpg (a test photo) is short of its last 20 bytes, which failed the
evaluation of every trial until the loader decoded it (tests/data/test_real_photos.py has each case on its
own). Skipped, with where it looked, when the photos are not beside the checkout (CI has them).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from helpers import kangaroo_root, lsbench, study_yaml

ROOT, WHY = kangaroo_root()
REPO = Path(__file__).resolve().parents[1]
pytestmark = [pytest.mark.slow, pytest.mark.skipif(ROOT is None, reason=WHY)]


def _study() -> str:
    return study_yaml(
        name="kangaroo_e2e",
        dataset={
            "name": "voc",
            "root": str(ROOT),
            "classes": ["kangaroo"],
            "train_split": "train",
            "val_split": "test",
        },
        model_options={"width": 8, "image_size": 128},
        precision="fp16-emulated",
        scaling=[
            "{method: none, precision: fp32, label: FP32 baseline, baseline: true}",
            "{method: fixed, scale: 128}",
        ],
        schedule={"iterations": 4, "lr": "1.0e-3", "warmup_iterations": 1},
        eval="{every: 4, metric: voc07}",
        log_every=1,
    )


def test_a_few_steps_on_the_kangaroo_photos_through_lsbench_run_report_voc07_map(tmp_path):
    from mlflow.tracking import MlflowClient

    study = tmp_path / "kangaroo.yaml"
    study.write_text(_study())
    runs = tmp_path / "runs"
    r = lsbench("run", study, "--runs-dir", runs, "--num-cpus", "2", cwd=tmp_path, timeout=600)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
    assert "2 finished, 0 diverged, 0 failed" in r.stdout, r.stdout[-3000:]
    assert "Validation mAP" in r.stdout and "FP32 baseline" in r.stdout

    client = MlflowClient(tracking_uri=f"sqlite:///{runs / 'mlflow.db'}")
    exp = client.get_experiment_by_name("kangaroo_e2e")
    trials = client.search_runs([exp.experiment_id], "tags.`lsbench.role` = 'trial'")
    assert len(trials) == 2
    for run in trials:
        tags, metrics = run.data.tags, run.data.metrics
        assert tags["lsbench.status"] == "finished", tags.get("lsbench.error")
        assert tags["lsbench.data.train.images"] == "132" and tags["lsbench.data.val.images"] == "32"
        assert 0.0 <= metrics["final_map"] <= 1.0
        maps = client.get_metric_history(run.info.run_id, "map")
        assert [m.step for m in maps] == [4] and maps[0].value == metrics["final_map"]
        assert sorted(m.step for m in client.get_metric_history(run.info.run_id, "loss")) == [1, 2, 3, 4]


@pytest.mark.parametrize(
    "name", sorted(p.name for p in (REPO / "studies").glob("*.yaml") if "shared/data/kangaroo" in p.read_text())
)
def test_the_shipped_studies_find_the_photos_beside_the_checkout(name):
    """Their root is ``../../shared/data/kangaroo``, relative to studies/: a shipped study cannot name
    /work/shared. Checked where the photos are beside this checkout (CI; not in a git worktree elsewhere)."""
    from lossscale_bench.study import load_study

    beside = REPO.parent / "shared" / "data" / "kangaroo"
    if not beside.is_dir():
        pytest.skip(f"no {beside} beside this checkout")
    assert Path(load_study(REPO / "studies" / name).dataset.root).resolve() == beside.resolve()
    r = lsbench("validate", REPO / "studies" / name)
    assert r.returncode == 0, r.stderr
