"""Every data set the study schema names, scored with every eval metric it names: each pair trains a few
steps of ssd_tiny at 64 px and scores its validation images (COCO mAP on VOC-layout data used to fail
after training: ``'VOCDetection' object has no attribute 'label_to_cat'``). And the ground truth COCO mAP
builds from a VOC set's targets: its categories, its difficult objects, pycocotools' own numbers."""

from __future__ import annotations

import pytest
import torch

from helpers import coco_from_synthetic, kangaroo_root, study_yaml
from lossscale_bench.core.registry import EVAL_METRICS
from lossscale_bench.data.voc import make_tiny_voc
from lossscale_bench.engine.sink import MemorySink
from lossscale_bench.evaluation.coco import evaluate_detections, ground_truth_from_targets
from lossscale_bench.study import load_study_text
from lossscale_bench.study.datasets import DATASET_NAMES
from lossscale_bench.trial import run_trial

KANGAROO, WHY = kangaroo_root()


@pytest.fixture(scope="module")
def datasets(tmp_path_factory) -> dict[str, dict]:
    """A ``dataset`` section per data set: tiny generated folders, and the kangaroo photos (VOC layout)."""
    tmp = tmp_path_factory.mktemp("data")
    coco_root, _ = coco_from_synthetic(tmp, train_images=8, val_images=4, seed=0)
    devkit = tmp / "VOCdevkit"
    for year, seed in (("VOC2007", 0), ("VOC2012", 1)):
        make_tiny_voc(devkit / year, {"trainval": 4, "test": 4}, seed=seed, size=(64, 80))
    out = {
        "synthetic": {"name": "synthetic", "train_images": 8, "val_images": 4, "image_size": 64, "seed": 0},
        "coco2017": {"name": "coco2017", "root": str(coco_root)},
        "coco2017 fake_data": {"name": "coco2017", "fake_data": True},
        "voc0712": {"name": "voc0712", "root": str(devkit), "classes": "[square, disc]"},
    }
    if KANGAROO is not None:
        out["voc"] = {
            "name": "voc",
            "root": str(KANGAROO),
            "classes": "[kangaroo]",
            "train_split": "train",
            "val_split": "test",
            "train_max_side": 128,
        }
    return out


PAIRS = [(d, m) for d in [*DATASET_NAMES, "coco2017 fake_data"] for m in EVAL_METRICS]


def test_the_pairs_cover_every_data_set_and_metric_of_the_schema():
    assert {d for d, _ in PAIRS} >= set(DATASET_NAMES) and {m for _, m in PAIRS} == set(EVAL_METRICS)


@pytest.mark.parametrize("dataset,metric", PAIRS)
def test_every_data_set_trains_and_is_scored_with_every_metric(datasets, tmp_path, dataset, metric):
    if dataset not in datasets:
        pytest.skip(WHY)
    text = study_yaml(
        dataset=datasets[dataset],
        model_options={"width": 8, "image_size": 64},
        batch_size=2,
        schedule={"iterations": 2, "lr": "1.0e-3"},
        eval=f"{{metric: {metric}, max_images: 4}}",
    )
    (cfg,) = load_study_text(text, str(tmp_path / "s.yaml")).trials()
    sink = MemorySink()
    out = run_trial(cfg, sink=sink, trial_dir=tmp_path / "trial", threads=1)
    assert out.status == "finished", out.error
    (final,) = [v for _, v in sink.history("map")]
    assert 0.0 <= final <= 1.0 and sink.history("map_50")


def _voc_like_targets():
    """Two images' VOC targets (labels 1..2, one difficult box), and detections equal to the boxes."""
    targets = [
        (0, {"boxes": torch.tensor([[2.0, 3.0, 30.0, 40.0], [40.0, 5.0, 60.0, 25.0]]), "labels": torch.tensor([1, 2])}),
        (
            1,
            {
                "boxes": torch.tensor([[10.0, 10.0, 50.0, 50.0], [0.0, 0.0, 20.0, 12.0]]),
                "labels": torch.tensor([2, 1]),
                "difficult": torch.tensor([False, True]),
            },
        ),
    ]
    dets = [
        {"image_id": i, "category_id": int(lab), "bbox": [b[0], b[1], b[2] - b[0], b[3] - b[1]], "score": 0.9}
        for i, t in targets
        for b, lab in zip(t["boxes"].tolist(), t["labels"].tolist())
    ]
    return targets, dets


def test_the_ground_truth_of_voc_targets_names_the_classes_and_ignores_difficult_objects_as_crowds():
    targets, dets = _voc_like_targets()
    gt = ground_truth_from_targets(targets, ["square", "disc"])
    assert {c["id"]: c["name"] for c in gt.loadCats(gt.getCatIds())} == {1: "square", 2: "disc"}
    assert sorted(gt.getImgIds()) == [0, 1] and min(gt.getAnnIds()) == 1
    assert [a["iscrowd"] for a in gt.loadAnns(gt.getAnnIds())] == [0, 0, 0, 1]
    perfect = evaluate_detections(gt, dets)
    assert perfect["map"] == pytest.approx(1.0)  # the detection on the difficult box is not a false positive
    assert evaluate_detections(gt, dets, reference=True) == perfect  # pycocotools' own COCOeval agrees
    missed = evaluate_detections(gt, dets[:3])  # the difficult box missed: nothing lost
    assert missed["map"] == pytest.approx(1.0)
    wrong = [{**d, "category_id": 3 - d["category_id"]} for d in dets]  # every class swapped
    assert evaluate_detections(gt, wrong)["map"] == 0.0
