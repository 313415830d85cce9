"""COCO mAP: perfect, empty and shifted detections; evaluate_coco end to end."""

from __future__ import annotations

import contextlib

import pytest
import torch
from torch import nn

from lossscale_bench.data import build_datasets
from lossscale_bench.evaluation import evaluate_coco, evaluate_detections


@pytest.fixture(scope="module")
def val_ds(tmp_path_factory):
    root = tmp_path_factory.mktemp("synth")
    _, val, _ = build_datasets(
        {"name": "synthetic", "root": str(root), "train_images": 0, "val_images": 12, "image_size": 64, "seed": 0}
    )
    return val


def _gt_detections(coco, dx=0.0, score=1.0):
    return [
        {
            "image_id": a["image_id"],
            "category_id": a["category_id"],
            "bbox": [a["bbox"][0] + dx, a["bbox"][1], a["bbox"][2], a["bbox"][3]],
            "score": score,
        }
        for a in coco.dataset["annotations"]
    ]


def test_perfect_predictions(val_ds):
    r = evaluate_detections(val_ds.coco, _gt_detections(val_ds.coco))
    assert r["map"] == pytest.approx(1.0, abs=1e-6) and r["map_50"] == pytest.approx(1.0, abs=1e-6)
    assert r["num_images"] == 12


def test_empty_predictions(val_ds):
    r = evaluate_detections(val_ds.coco, [])
    assert r["map"] == 0.0 and r["map_50"] == 0.0 and r["num_images"] == 12


def test_shifted_boxes_score_lower(val_ds):
    perfect = evaluate_detections(val_ds.coco, _gt_detections(val_ds.coco))["map"]
    small = evaluate_detections(val_ds.coco, _gt_detections(val_ds.coco, dx=2.0))["map"]
    large = evaluate_detections(val_ds.coco, _gt_detections(val_ds.coco, dx=8.0))["map"]
    assert perfect > small > large


def test_wrong_category_scores_zero(val_ds):
    dets = _gt_detections(val_ds.coco)
    for d in dets:
        d["category_id"] = d["category_id"] % 3 + 1
    assert evaluate_detections(val_ds.coco, dets)["map"] == pytest.approx(0.0)


def test_img_ids_restrict_the_evaluation(val_ds):
    dets = [d for d in _gt_detections(val_ds.coco) if d["image_id"] <= 4]
    assert evaluate_detections(val_ds.coco, dets, img_ids=[1, 2, 3, 4])["map"] == pytest.approx(1.0)
    assert evaluate_detections(val_ds.coco, dets)["map"] < 0.9


class _OracleModel(nn.Module):
    """Returns the ground truth of the images it is shown, in data set order, as detections."""

    def __init__(self, ds):
        super().__init__()
        self.targets = [ds.load(i)[1] for i in range(len(ds))]
        self.calls = 0
        self.lin = nn.Linear(1, 1)

    def forward(self, images):
        assert not self.training
        out = []
        for _ in images:
            t = self.targets[self.calls]
            self.calls += 1
            out.append({"boxes": t["boxes"], "labels": t["labels"], "scores": torch.ones(len(t["labels"]))})
        return out


def test_evaluate_coco_maps_labels_back_to_category_ids(tmp_path):
    """Sparse COCO category ids: a perfect model must score 1.0 only if labels are mapped back."""
    import json

    import numpy as np
    from PIL import Image

    from lossscale_bench.data import CocoDetection

    (tmp_path / "img").mkdir()
    images, anns = [], []
    for i in range(1, 5):
        Image.fromarray(np.zeros((32, 32, 3), np.uint8)).save(tmp_path / "img" / f"{i}.png")
        images.append({"id": i, "file_name": f"{i}.png", "width": 32, "height": 32})
        for k, cat in enumerate((5, 90)):
            anns.append(
                {
                    "id": len(anns) + 1,
                    "image_id": i,
                    "category_id": cat,
                    "bbox": [2 + 12 * k, 4, 10, 12],
                    "area": 120,
                    "iscrowd": 0,
                }
            )
    (tmp_path / "a.json").write_text(
        json.dumps(
            {"images": images, "annotations": anns, "categories": [{"id": 90, "name": "z"}, {"id": 5, "name": "y"}]}
        )
    )
    ds = CocoDetection(tmp_path / "img", tmp_path / "a.json", train=False)
    model = _OracleModel(ds)
    r = evaluate_coco(model, ds, batch_size=3)
    assert r["map"] == pytest.approx(1.0) and r["num_images"] == 4 and model.calls == 4


def test_evaluate_coco_ssd_tiny_end_to_end(val_ds):
    from lossscale_bench.models import build_model

    torch.manual_seed(0)
    model = build_model("ssd_tiny", num_classes=val_ds.num_classes + 1, image_size=64, width=8)
    model.train()
    entered = []

    @contextlib.contextmanager
    def autocast():
        entered.append(1)
        yield

    r = evaluate_coco(model, val_ds, batch_size=4, max_images=6, autocast=autocast)
    assert model.training  # mode restored
    assert r["num_images"] == 6 and len(entered) == 2
    assert 0.0 <= r["map"] <= r["map_50"] <= 1.0
    model.eval()
    evaluate_coco(model, val_ds, batch_size=8, max_images=2)
    assert not model.training


def test_evaluate_coco_no_detections_is_zero(val_ds):
    class Nothing(nn.Module):
        def forward(self, images):
            return [
                {"boxes": torch.zeros(0, 4), "labels": torch.zeros(0, dtype=torch.int64), "scores": torch.zeros(0)}
                for _ in images
            ]

    r = evaluate_coco(Nothing(), val_ds, max_images=5)
    assert r == {**r, "map": 0.0, "map_50": 0.0, "num_images": 5}


def test_evaluate_coco_on_fake_data():
    from lossscale_bench.data import fake_coco

    ds = fake_coco(4, 32, 3, seed=0, train=False)
    r = evaluate_coco(_OracleModel(ds), ds)
    assert r["map"] == pytest.approx(1.0)


def _pycocotools_stats(coco_gt, dets):
    """COCOeval's stats on every detection, untruncated: the reference the fast path must match."""
    import io

    import numpy as np
    from pycocotools.cocoeval import COCOeval

    with contextlib.redirect_stdout(io.StringIO()):
        ev = COCOeval(coco_gt, coco_gt.loadRes(dets), "bbox")
        ev.params.imgIds = sorted(coco_gt.getImgIds())
        ev.evaluate()
        ev.accumulate()
        ev.summarize()
    return [float(s) if s >= 0 else 0.0 for s in np.asarray(ev.stats, dtype=float)]


def test_keeping_the_top_100_per_image_and_category_changes_no_ap(val_ds):
    """evaluate_detections hands COCOeval only the 100 best detections per (image, category), which is
    all COCOeval scores: mAP, mAP@.5 and mAP@.75 must equal pycocotools' on the full list. The
    detections: 260 per image over three categories (so groups pass 100), near-copies of the true
    boxes and noise, scores with ties across the 100th place, in shuffled order."""
    from lossscale_bench.evaluation.coco import top_per_image_category

    coco = val_ds.coco
    g = torch.Generator().manual_seed(7)
    cats = sorted(coco.getCatIds())
    dets = []
    for img in coco.dataset["images"]:
        gts = [a for a in coco.dataset["annotations"] if a["image_id"] == img["id"]]
        for j in range(260):
            if gts and j % 3 == 0:
                a = gts[j % len(gts)]
                box = [v + float(torch.randn(1, generator=g)) * 2 for v in a["bbox"]]
                cat = a["category_id"] if j % 5 else cats[j % len(cats)]
            else:
                xy = torch.rand(2, generator=g) * 40
                box = [float(xy[0]), float(xy[1]), 4 + float(torch.rand(1, generator=g)) * 20, 6.0]
                cat = cats[0] if j % 2 else cats[j % len(cats)]
            score = round(float(torch.rand(1, generator=g)), 2)  # two digits: many ties
            dets.append({"image_id": img["id"], "category_id": cat, "bbox": box, "score": score})
    order = torch.randperm(len(dets), generator=g).tolist()
    dets = [dets[i] for i in order]
    kept = top_per_image_category(dets)
    assert len(kept) < len(dets)  # the test exercises the truncation
    ref = _pycocotools_stats(coco, dets)
    got = evaluate_detections(coco, dets)
    assert ref[0] > 0 and (got["map"], got["map_50"], got["map_75"]) == (ref[0], ref[1], ref[2])


def test_evaluate_coco_scores_what_evaluate_detections_scores(val_ds):
    # evaluate_coco skips evaluate_detections' normalising copy (its detections are plain Python values already,
    # so the copy only cost time): the same numbers as the public path on the same predictions, for an untrained
    # SSD (~200 detections an image)
    from lossscale_bench.evaluation.predict import predictions
    from lossscale_bench.models import build_model

    torch.manual_seed(3)
    model = build_model("ssd_tiny", num_classes=val_ds.num_classes + 1, image_size=64, width=8)
    got = evaluate_coco(model, val_ds, batch_size=4)
    dets, ids = [], []
    for target, out in predictions(model, val_ds, batch_size=4):
        ids.append(int(target["image_id"]))
        b = out["boxes"]
        for box, label, score in zip(
            torch.cat([b[:, :2], b[:, 2:] - b[:, :2]], 1).tolist(), out["labels"].tolist(), out["scores"].tolist()
        ):
            if val_ds.label_to_cat.get(int(label)) is not None:
                dets.append(
                    {"image_id": ids[-1], "category_id": val_ds.label_to_cat[int(label)], "bbox": box, "score": score}
                )
    want = evaluate_detections(val_ds.coco, dets, img_ids=ids)
    assert got == want and got["num_detections"] > 0
