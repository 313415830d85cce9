"""Bad data gives a clear error or a counted, logged skip; never a silently wrong number."""

from __future__ import annotations

import json

import pytest

from helpers import coco_from_synthetic
from lossscale_bench.data.coco import CocoDetection
from lossscale_bench.data.transforms import CorruptImage
from lossscale_bench.dataset_files.annotations import AnnotationError
from lossscale_bench.engine.sink import MemorySink
from lossscale_bench.study import load_study_text
from lossscale_bench.trial import data_report, run_trial


@pytest.fixture()
def coco_root(tmp_path):
    """A COCO-2017-layout folder made from the synthetic set, with bad annotations added."""
    root, p = coco_from_synthetic(tmp_path, train_images=8, val_images=4, seed=5)
    ann = json.loads(p["train_ann"].read_text())
    img = ann["images"][0]
    nid = max(a["id"] for a in ann["annotations"]) + 1
    ann["annotations"] += [
        {"id": nid, "image_id": img["id"], "category_id": 1, "bbox": [500, 500, 10, 10], "area": 100, "iscrowd": 0},
        {"id": nid + 1, "image_id": img["id"], "category_id": 1, "bbox": [30, 30, -12, 8], "area": 96, "iscrowd": 0},
        {"id": nid + 2, "image_id": img["id"], "category_id": 999, "bbox": [5, 5, 10, 10], "area": 100, "iscrowd": 0},
    ]
    (root / "annotations" / "instances_train2017.json").write_text(json.dumps(ann))
    return root


def test_bad_boxes_and_unknown_classes_are_errors_naming_file_and_record(coco_root):
    """Once dropped without a word; now the first one is the error, with its record and value."""
    ann = coco_root / "annotations" / "instances_train2017.json"
    with pytest.raises(AnnotationError) as e:
        CocoDetection(coco_root / "train2017", ann, train=True)
    msg = str(e.value)
    assert msg.startswith(f"{ann}: annotations[") and "bbox [500, 500, 10, 10] lies outside the 64x64 image" in msg
    assert "dataset.bad_annotations: drop" in msg and "\n" not in msg


def test_bad_boxes_and_unknown_classes_are_dropped_and_counted_on_request(coco_root):
    ds = CocoDetection(
        coco_root / "train2017",
        coco_root / "annotations" / "instances_train2017.json",
        train=True,
        bad_annotations="drop",
    )
    assert ds.skipped_boxes == 3  # outside the image, x2 < x1, unknown category
    assert ds.dropped_annotations == {"bad_box": 1, "outside_image": 1, "unknown_class": 1}
    assert dict(ds.unknown_objects) == {"999": 1}
    for i in range(len(ds)):
        _, t = ds.load(i)
        b = t["boxes"]
        assert (b[:, 2] > b[:, 0]).all() and (b[:, 3] > b[:, 1]).all() and (b >= 0).all() and (b <= 64).all()
    tags = data_report(ds, ds)
    assert tags["lsbench.data.train.skipped_boxes"] == 3
    assert json.loads(tags["lsbench.data.train.unknown_objects"]) == {"999": 1}


def test_corrupt_image_is_a_clear_error_naming_the_file(coco_root):
    ds = CocoDetection(
        coco_root / "train2017",
        coco_root / "annotations" / "instances_train2017.json",
        train=True,
        bad_annotations="drop",
    )
    bad = coco_root / "train2017" / ds._records[0]["file_name"]
    bad.write_bytes(b"\x89PNG\r\n\x1a\n garbage")
    with pytest.raises(CorruptImage, match=str(bad)):
        ds.load(0)


def test_trial_logs_skips_and_fails_clearly_on_a_corrupt_image(coco_root, tmp_path):
    cfg = load_study_text(f"""
name: bad
dataset: {{name: coco2017, root: {coco_root}, bad_annotations: drop}}
model: ssd_tiny
model_options: {{width: 8, image_size: 64}}
batch_size: 4
precision: fp32
scaling: [{{method: none}}]
schedule: {{iterations: 2, lr: 0.01}}
""").trials()[0]
    sink = MemorySink()
    out = run_trial(cfg, sink=sink, trial_dir=tmp_path / "t1")
    assert out.status == "finished", out.error
    assert sink.tag_values["lsbench.data.train.skipped_boxes"] == 3
    # now break every training image: the trial fails with the file named, the study would go on
    for f in (coco_root / "train2017").iterdir():
        f.write_bytes(b"not an image")
    sink = MemorySink()
    out = run_trial(cfg, sink=sink, trial_dir=tmp_path / "t2")
    assert out.status == "failed"
    assert "corrupt or unreadable image" in out.error and "train2017" in out.error
    assert sink.tag_values["lsbench.status"] == "failed"
