"""fast_coco.coco_box_stats against pycocotools' COCOeval: all 12 stats equal, bit for bit.

Every comparison is ``np.array_equal`` on the two float64 arrays (-1 entries included): no tolerance.
The cases: random detections on the synthetic val set (many per image, score ties, exact duplicates,
tiny, huge, degenerate and area-boundary boxes, more than 100 per image and category); hand-built
ground truth with crowd annotations, gt ``area`` unlike the box area, large objects, a gt with id 0
and detections on and around crowds; categories and images without ground truth, detections on
images outside ``img_ids`` and of categories the ground truth lacks; non-finite boxes and scores;
an untrained SSD's output.
"""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch
from pycocotools.coco import COCO

from lossscale_bench.data import build_datasets
from lossscale_bench.evaluation import evaluate_detections
from lossscale_bench.evaluation.coco import pycocotools_box_stats
from lossscale_bench.evaluation.fast_coco import _box_iou, coco_box_stats

SEEDS = [0, 1, 2, 3]


@pytest.fixture(scope="module")
def val_ds(tmp_path_factory):
    """The default study's kind of val set (96 px synthetic shapes), 48 images."""
    root = tmp_path_factory.mktemp("synth")
    _, val, _ = build_datasets(
        {"name": "synthetic", "root": str(root), "train_images": 0, "val_images": 48, "image_size": 96, "seed": 0}
    )
    return val


def _both(coco, dets, img_ids=None):
    """``(ours, pycocotools')`` stats; pycocotools gets a copy (loadRes writes into the dicts)."""
    got = coco_box_stats(coco, dets, img_ids)
    ref = pycocotools_box_stats(coco, copy.deepcopy(dets), img_ids)
    return got, ref


def _assert_same(got, ref):
    assert got.dtype == ref.dtype == np.float64 and got.shape == ref.shape == (12,)
    assert np.array_equal(got, ref), f"\nours        {got.tolist()}\npycocotools {ref.tolist()}\ndiff {got - ref}"


def _score(rng, good: bool) -> float:
    """Scores with many ties: 1 or 2 decimals, or a float32 value; higher on average when ``good``."""
    s = float(rng.random() ** (0.4 if good else 2.0))
    kind = rng.integers(3)
    return round(s, 1) if kind == 0 else round(s, 2) if kind == 1 else float(np.float32(s))


def _random_detections(coco, seed: int, max_per_image: int = 260) -> list[dict]:
    rng = np.random.default_rng(seed)
    cats = sorted(coco.cats)
    dets = []
    for img_id, img in coco.imgs.items():
        size = float(img["width"])
        gts = coco.imgToAnns[img_id]
        for _ in range(int(rng.integers(0, max_per_image))):
            kind = rng.random()
            good = False
            cat = int(cats[0]) if rng.random() < 0.4 else int(rng.choice(cats))  # push one category past 100
            if gts and kind < 0.35:  # around a gt: exact copy to far off, usually its category
                a = gts[int(rng.integers(len(gts)))]
                jitter = float(rng.choice([0.0, 0.5, 2.0, 6.0]))
                box = [v + jitter * rng.normal() for v in a["bbox"]]
                if rng.random() < 0.85:
                    cat, good = a["category_id"], True
            elif kind < 0.5:  # tiny
                box = [rng.uniform(0, size), rng.uniform(0, size), rng.uniform(0.1, 6), rng.uniform(0.1, 6)]
            elif kind < 0.6:  # huge, beyond the image (the 'large' range)
                box = [rng.uniform(-60, 20), rng.uniform(-60, 20), rng.uniform(90, 260), rng.uniform(90, 260)]
            elif kind < 0.66:  # exactly on an area-range boundary (32^2, 96^2) or empty
                side = float(rng.choice([32.0, 96.0, 0.0]))
                box = [rng.uniform(0, size / 2), rng.uniform(0, size / 2), side, side]
            elif kind < 0.7:  # negative width or height
                box = [rng.uniform(0, size), rng.uniform(0, size), rng.uniform(-20, 20), rng.uniform(-20, 0)]
            else:  # anywhere, small to medium
                box = [rng.uniform(-5, size), rng.uniform(-5, size), rng.uniform(2, 60), rng.uniform(2, 60)]
            dets.append(
                {"image_id": img_id, "category_id": cat, "bbox": [float(v) for v in box], "score": _score(rng, good)}
            )
    # exact duplicates (same box and score: ties in the sort and in the IoUs), then a shuffled order
    dets += [dict(dets[i]) for i in rng.integers(0, len(dets), len(dets) // 10)]
    return [dets[i] for i in rng.permutation(len(dets))]


@pytest.mark.parametrize("seed", SEEDS)
def test_random_detections_on_the_synthetic_val_set(val_ds, seed):
    coco = val_ds.coco
    dets = _random_detections(coco, seed)
    per_group: dict = {}
    for d in dets:
        per_group[d["image_id"], d["category_id"]] = per_group.get((d["image_id"], d["category_id"]), 0) + 1
    assert max(per_group.values()) > 100  # COCOeval's maxDets truncation is exercised
    got, ref = _both(coco, dets)
    _assert_same(got, ref)
    assert 0.05 < got[0] < 0.95 and 0.05 < got[1] < 0.95  # a non-trivial AP: the equality means something
    assert (got[3:5] > 0).all() and (got[6:11] > 0).all()


@pytest.mark.parametrize("seed", SEEDS[:2])
def test_random_detections_on_part_of_the_images(val_ds, seed):
    coco = val_ds.coco
    dets = _random_detections(coco, seed + 10, max_per_image=120)
    ids = sorted(coco.imgs)[::3]
    _assert_same(*_both(coco, dets, ids))


def test_evaluate_detections_equals_its_pycocotools_path(val_ds):
    dets = _random_detections(val_ds.coco, 5)
    fast = evaluate_detections(val_ds.coco, dets)
    ref = evaluate_detections(val_ds.coco, dets, reference=True)
    assert fast == ref and 0.05 < fast["map"] < 0.95


def _crowd_coco(seed: int, *, first_id: int = 1):
    """Hand-built ground truth: 3 categories (sparse ids), crowd boxes with objects inside them, gt
    ``area`` smaller than the box (a segmentation's), small to large objects, an image without any."""
    rng = np.random.default_rng(seed)
    images = [{"id": i, "width": 240, "height": 240, "file_name": f"{i}.png"} for i in range(1, 15)]
    cats = [1, 4, 7]
    anns = []

    def add(img, cat, box, crowd):
        w, h = box[2], box[3]
        area = w * h * (1.0 if rng.random() < 0.5 else float(rng.uniform(0.4, 1.0)))
        anns.append(
            {
                "id": first_id + len(anns),
                "image_id": img,
                "category_id": cat,
                "bbox": [float(v) for v in box],
                "area": float(area),
                "iscrowd": int(crowd),
            }
        )

    for img in range(1, 14):  # image 14: no annotations
        for _ in range(int(rng.integers(0, 4))):  # crowds, each with 0-3 objects of its category inside
            cat = int(rng.choice(cats))
            w, h = rng.uniform(20, 200, 2)
            x, y = rng.uniform(0, 240 - w), rng.uniform(0, 240 - h)
            add(img, cat, [x, y, w, h], True)
            for _ in range(int(rng.integers(0, 4))):
                ow, oh = rng.uniform(3, w), rng.uniform(3, h)
                add(img, cat, [x + rng.uniform(0, w - ow), y + rng.uniform(0, h - oh), ow, oh], False)
        for _ in range(int(rng.integers(0, 5))):  # objects, 3 px to 230 px (small, medium, large)
            w, h = np.exp(rng.uniform(np.log(3), np.log(230), 2))
            add(img, int(rng.choice(cats)), [rng.uniform(0, 240 - w), rng.uniform(0, 240 - h), w, h], False)
    coco = COCO()
    coco.dataset = {"images": images, "annotations": anns, "categories": [{"id": c, "name": str(c)} for c in (7, 1, 4)]}
    coco.createIndex()
    return coco


def _crowd_detections(coco, seed: int) -> list[dict]:
    """Around every gt (crowd ones included), inside crowds (several per crowd: a crowd matches
    again and again), straddling a crowd and an object, and noise."""
    rng = np.random.default_rng(seed)
    cats = sorted(coco.cats)
    dets = []

    def det(img, cat, box, good=False):
        dets.append(
            {"image_id": img, "category_id": int(cat), "bbox": [float(v) for v in box], "score": _score(rng, good)}
        )

    for a in coco.dataset["annotations"]:
        x, y, w, h = a["bbox"]
        for _ in range(int(rng.integers(1, 4))):
            det(
                a["image_id"],
                a["category_id"],
                [
                    x + rng.normal() * w / 10,
                    y + rng.normal() * h / 10,
                    w * rng.uniform(0.8, 1.2),
                    h * rng.uniform(0.8, 1.2),
                ],
                True,
            )
        if a["iscrowd"]:
            for _ in range(int(rng.integers(2, 8))):  # inside the crowd: IoU (= inter / det area) near 1
                dw, dh = rng.uniform(1, w), rng.uniform(1, h)
                det(a["image_id"], a["category_id"], [x + rng.uniform(-2, w - dw), y + rng.uniform(-2, h - dh), dw, dh])
            det(a["image_id"], a["category_id"], [x - w / 2, y, w, h])  # half in
    for img in coco.imgs:
        for _ in range(int(rng.integers(0, 40))):
            w, h = np.exp(rng.uniform(np.log(1), np.log(240), 2))
            det(img, rng.choice(cats), [rng.uniform(-10, 240), rng.uniform(-10, 240), w, h])
    return [dets[i] for i in rng.permutation(len(dets))]


@pytest.mark.parametrize("seed", SEEDS)
def test_crowds_and_hand_built_ground_truth(seed):
    coco = _crowd_coco(seed)
    assert any(a["iscrowd"] for a in coco.anns.values())
    dets = _crowd_detections(coco, seed)
    got, ref = _both(coco, dets)
    _assert_same(got, ref)
    assert 0.05 < got[0] < 0.95
    assert (got[3:6] > -1).all()  # small, medium and large objects


def test_a_gt_with_id_0():
    """COCOeval stores matched gt ids in dtMatches and tests ``dtm != 0``: a match to gt id 0
    counts as no match there (a false positive, or ignored outside the area range). Reproduced."""
    coco = _crowd_coco(4)
    dets = _crowd_detections(coco, 4)
    with_id_1 = coco_box_stats(coco, dets)
    first = next(a for a in coco.dataset["annotations"] if not a["iscrowd"])
    first["id"] = 0
    coco.createIndex()
    got, ref = _both(coco, dets)
    _assert_same(got, ref)
    assert not np.array_equal(got, with_id_1)  # the quirk shows


def test_equal_ious_go_to_the_later_gt():
    """A detection exactly between two gts (integer boxes: the IoUs are equal floats) takes the later
    one (COCOeval's ``<`` continue); a lower-scored detection that overlaps only the earlier gt enough
    then finds it free. Random sizes put the pairs in every area range."""
    rng = np.random.default_rng(0)
    images, anns, dets = [], [], []
    for img in range(1, 41):
        images.append({"id": img, "width": 300, "height": 300})
        w, h = (int(v) for v in rng.integers(4, 140, 2))
        s = max(1, w // 10)
        x, y = int(rng.integers(2 * s, 300 - w - 3 * s)), int(rng.integers(0, 300 - h))
        crowd = int(rng.random() < 0.2)
        for dx in (s, -s):  # the earlier gt right of the detection, the later one left of it
            anns.append(
                {
                    "id": len(anns) + 1,
                    "image_id": img,
                    "category_id": 1,
                    "bbox": [x + dx, y, w, h],
                    "area": float(w * h * rng.choice([1.0, 0.5])),
                    "iscrowd": crowd if dx < 0 else 0,
                }
            )
        dets.append({"image_id": img, "category_id": 1, "bbox": [float(x), float(y), float(w), float(h)], "score": 0.9})
        dets.append(
            {"image_id": img, "category_id": 1, "bbox": [float(x + 3 * s), float(y), float(w), float(h)], "score": 0.8}
        )
    coco = COCO()
    coco.dataset = {"images": images, "annotations": anns, "categories": [{"id": 1, "name": "a"}]}
    coco.createIndex()
    iou = _box_iou(np.array(dets[0]["bbox"])[None, :], np.array([a["bbox"] for a in anns[:2]]), np.zeros(2, bool))
    assert iou[0] == iou[1] >= 0.5  # a tie
    got, ref = _both(coco, dets)
    _assert_same(got, ref)
    assert got[1] > 0.5


def test_categories_and_images_without_ground_truth_and_restricted_img_ids():
    coco = _crowd_coco(5)
    coco.dataset["categories"].append({"id": 9, "name": "never annotated"})
    coco.createIndex()
    dets = _crowd_detections(coco, 5)
    rng = np.random.default_rng(5)
    for img in (14, 3):  # image 14 has no gt
        for _ in range(30):
            dets.append(
                {
                    "image_id": img,
                    "category_id": int(rng.choice([1, 4, 7, 9, 12])),  # 12: not in the gt
                    "bbox": [float(v) for v in rng.uniform(0, 120, 4)],
                    "score": float(rng.random()),
                }
            )
    got, ref = _both(coco, dets)
    _assert_same(got, ref)
    assert got[0] > 0
    for ids in ([1, 2, 3, 14], [14], [2, 14, 999], list(range(1, 15))[::2]):  # 999: not an image of the gt
        _assert_same(*_both(coco, dets, ids))
    got, ref = _both(coco, dets, [14])  # no ground truth at all: -1 everywhere
    assert (got == -1).all()


def test_detections_only_of_other_categories():
    coco = _crowd_coco(6)
    dets = [{"image_id": 1, "category_id": 12, "bbox": [1.0, 2.0, 3.0, 4.0], "score": 0.5}]
    got, ref = _both(coco, dets)
    _assert_same(got, ref)
    assert np.array_equal(coco_box_stats(coco, []), ref)  # the same as no detections at all


def test_detections_on_an_image_the_ground_truth_lacks_are_an_error():
    coco = _crowd_coco(7)
    dets = [{"image_id": 1234, "category_id": 1, "bbox": [1.0, 2.0, 3.0, 4.0], "score": 0.5}]
    with pytest.raises(AssertionError):
        pycocotools_box_stats(coco, copy.deepcopy(dets))
    with pytest.raises(ValueError, match="1234"):
        coco_box_stats(coco, dets, img_ids=[1, 2])


@pytest.mark.parametrize("seed", SEEDS[:2])
def test_non_finite_boxes_and_scores(seed):
    """NaN/inf coordinates (a diverged FP8 run's boxes) and NaN scores: a NaN IoU makes COCOeval's
    greedy loop irregular; such groups take the line-by-line port of it."""
    coco = _crowd_coco(seed + 20)
    dets = _crowd_detections(coco, seed + 20)
    rng = np.random.default_rng(seed)
    for i in rng.choice(len(dets), 40, replace=False):
        d = dets[i]
        j = int(rng.integers(4))
        d["bbox"][j] = float(rng.choice([np.nan, np.inf, -np.inf]))
        if rng.random() < 0.3:
            d["score"] = float("nan")
    _assert_same(*_both(coco, dets))


def test_box_iou_is_mask_utils_iou():
    from pycocotools import mask as mask_utils

    rng = np.random.default_rng(0)
    d = np.concatenate([rng.uniform(-20, 100, (300, 2)), rng.uniform(-5, 60, (300, 2))], axis=1)
    g = np.concatenate([rng.uniform(-20, 100, (40, 2)), rng.uniform(0.1, 60, (40, 2))], axis=1)
    d[::7] = g[rng.integers(0, 40, len(d[::7]))] + rng.normal(0, 1e-9, (len(d[::7]), 4))  # near-equal boxes
    crowd = rng.random(40) < 0.3
    ref = np.asarray(mask_utils.iou(d.tolist(), g.tolist(), crowd.astype(int).tolist()))
    got = _box_iou(d[:, None, :], g[None, :, :], crowd[None, :])
    assert np.array_equal(got, ref) and (ref > 0.5).sum() > 10


def test_untrained_ssd_output(val_ds):
    """What an evaluation of the study sees first: an untrained ssd_tiny's up to 200 detections per image."""
    from lossscale_bench.evaluation.predict import predictions
    from lossscale_bench.models import build_model

    torch.manual_seed(0)
    model = build_model("ssd_tiny", num_classes=val_ds.num_classes + 1, image_size=96, width=8)
    dets = []
    for target, out in predictions(model, val_ds, batch_size=16, max_images=24):
        boxes = out["boxes"].float()
        xywh = torch.cat([boxes[:, :2], boxes[:, 2:] - boxes[:, :2]], dim=1).tolist()
        for b, lab, s in zip(xywh, out["labels"].tolist(), out["scores"].float().tolist()):
            cat = val_ds.label_to_cat.get(int(lab))
            if cat is not None:
                dets.append({"image_id": int(target["image_id"]), "category_id": cat, "bbox": b, "score": s})
    assert len(dets) > 24 * 50
    ids = [int(i) for i in sorted(val_ds.coco.imgs)[:24]]
    _assert_same(*_both(val_ds.coco, dets, ids))
