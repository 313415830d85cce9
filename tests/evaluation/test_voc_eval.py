"""VOC metric on hand-checked cases (chainercv's conventions, continuous coordinates)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from lossscale_bench.evaluation.voc import bbox_iou, eval_detection_voc, evaluate_voc


def _one_image(pred_boxes, pred_labels, pred_scores, gt_boxes, gt_labels, gt_difficult=None, **kw):
    a = lambda x, dt=np.float64: np.asarray(x, dtype=dt)  # noqa: E731
    gd = None if gt_difficult is None else [a(gt_difficult, bool)]
    return eval_detection_voc(
        [a(pred_boxes).reshape(-1, 4)],
        [a(pred_labels, np.int64)],
        [a(pred_scores)],
        [a(gt_boxes).reshape(-1, 4)],
        [a(gt_labels, np.int64)],
        gd,
        **kw,
    )


# three ground-truth boxes of class 1, four detections: TP .9, FP .8, TP .7, FP .6 (one box missed)
GT3 = [[0, 0, 10, 10], [20, 20, 30, 30], [40, 40, 50, 50]]
DETS = [[0, 0, 10, 10], [60, 60, 70, 70], [20, 20, 30, 30], [80, 80, 90, 90]]
SCORES = [0.9, 0.8, 0.7, 0.6]


def test_area_ap_hand_checked():
    # prec = 1, 1/2, 2/3, 1/2; rec = 1/3, 1/3, 2/3, 2/3 -> envelope 1, 1, 2/3, 2/3
    # AP = 1/3 * 1 + 1/3 * 2/3 + 1/3 * 0 = 5/9
    res = _one_image(DETS, [1, 1, 1, 1], SCORES, GT3, [1, 1, 1])
    assert res["ap"][1] == pytest.approx(5 / 9)
    assert math.isnan(res["ap"][0])  # label 0 (background) never has ground truth
    assert res["map"] == pytest.approx(5 / 9)


def test_07_eleven_point_ap_hand_checked():
    # t = 0, .1, .2, .3 -> max prec with rec >= t is 1; t = .4, .5, .6 -> 2/3; t >= .7 -> 0
    res = _one_image(DETS, [1, 1, 1, 1], SCORES, GT3, [1, 1, 1], use_07_metric=True)
    assert res["ap"][1] == pytest.approx((4 * 1 + 3 * (2 / 3)) / 11)


def test_perfect_and_empty_detections():
    res = _one_image(GT3, [1, 1, 1], [0.5, 0.4, 0.3], GT3, [1, 1, 1], use_07_metric=True)
    assert res["map"] == pytest.approx(1.0)
    res = _one_image(np.zeros((0, 4)), [], [], GT3, [1, 1, 1])
    assert res["ap"][1] == 0.0 and res["map"] == 0.0


def test_duplicate_detection_is_a_false_positive():
    # second detection of the same box: fp; prec 1, 1/2; rec 1, 1 -> area AP 1, but precision drops
    res = _one_image([[0, 0, 10, 10], [0, 0, 10, 10]], [1, 1], [0.9, 0.8], [[0, 0, 10, 10]], [1])
    assert res["ap"][1] == pytest.approx(1.0)
    # the duplicate scoring higher than the only true positive of a 2-box image
    res = _one_image(
        [[0, 0, 10, 10], [0, 0, 10, 10], [20, 20, 30, 30]],
        [1, 1, 1],
        [0.9, 0.8, 0.7],
        [[0, 0, 10, 10], [20, 20, 30, 30]],
        [1, 1],
    )
    # prec 1, 1/2, 2/3; rec 1/2, 1/2, 1 -> envelope 1, 2/3, 2/3 -> AP = 1/2 * 1 + 1/2 * 2/3
    assert res["ap"][1] == pytest.approx(0.5 + 1 / 3)


def test_difficult_objects_neither_counted_nor_penalised():
    gt = [[0, 0, 10, 10], [20, 20, 30, 30]]
    # only the difficult box is detected (twice): both detections are ignored,
    # and the one positive (the normal box) is missed -> AP 0
    dets = [[20, 20, 30, 30], [20, 20, 30, 30]]
    res = _one_image(dets, [1, 1], [0.9, 0.8], gt, [1, 1], gt_difficult=[False, True])
    assert res["ap"][1] == 0.0
    # without the difficult flag: one TP and one duplicate FP over two positives
    # prec 1, 1/2; rec 1/2, 1/2 -> AP 1/2
    res = _one_image(dets, [1, 1], [0.9, 0.8], gt, [1, 1])
    assert res["ap"][1] == pytest.approx(0.5)
    # a detection on the difficult box ranked above the true positive does not lower precision
    dets = [[20, 20, 30, 30], [0, 0, 10, 10]]
    res = _one_image(dets, [1, 1], [0.9, 0.8], gt, [1, 1], gt_difficult=[False, True], use_07_metric=True)
    assert res["ap"][1] == pytest.approx(1.0)
    # a class whose only objects are difficult has no positives: NaN, left out of the mean
    res = _one_image([[0, 0, 10, 10], [20, 20, 30, 30]], [1, 2], [0.9, 0.8], gt, [1, 2], gt_difficult=[False, True])
    assert res["ap"][1] == pytest.approx(1.0) and math.isnan(res["ap"][2])
    assert res["map"] == pytest.approx(1.0)


def test_absent_classes_are_nan_and_excluded_from_the_mean():
    # class 1: perfect; class 2: predicted but never in the ground truth -> NaN; class 3: nowhere -> NaN
    res = eval_detection_voc(
        [np.array([[0, 0, 10, 10], [50, 50, 60, 60]], float), np.array([[0, 0, 5, 5]], float)],
        [np.array([1, 2]), np.array([4])],
        [np.array([0.9, 0.8]), np.array([0.7])],
        [np.array([[0, 0, 10, 10]], float), np.zeros((0, 4))],
        [np.array([1]), np.zeros(0, int)],
    )
    ap = res["ap"]
    assert len(ap) == 5  # indexed by label value, up to the largest label seen
    assert ap[1] == pytest.approx(1.0)
    assert all(math.isnan(ap[i]) for i in (0, 2, 3, 4))
    assert res["map"] == pytest.approx(1.0)
    empty = eval_detection_voc([], [], [], [], [])
    assert math.isnan(empty["map"]) and len(empty["ap"]) == 0


def test_continuous_coordinates_without_plus_one():
    # IoU of [0,0,10,10] and [0,0,10,4.9] is 0.49 in continuous coordinates (0.536 with chainercv's +1
    # on raw inclusive indices): no match here. Exactly 0.5 is a match (>= threshold).
    assert bbox_iou([[0, 0, 10, 10]], [[0, 0, 10, 4.9]])[0, 0] == pytest.approx(0.49)
    res = _one_image([[0, 0, 10, 4.9]], [1], [0.9], [[0, 0, 10, 10]], [1])
    assert res["ap"][1] == 0.0
    res = _one_image([[0, 0, 10, 5]], [1], [0.9], [[0, 0, 10, 10]], [1])
    assert res["ap"][1] == pytest.approx(1.0)
    res = _one_image([[0, 0, 10, 5]], [1], [0.9], [[0, 0, 10, 10]], [1], iou_thresh=0.6)
    assert res["ap"][1] == 0.0


def test_several_images_pool_their_detections():
    # image 1: TP .9; image 2: FP .95 and a missed box -> sorted: FP, TP; prec 0, 1/2; rec 0, 1/2
    res = eval_detection_voc(
        [np.array([[0, 0, 10, 10]], float), np.array([[50, 50, 60, 60]], float)],
        [np.array([1]), np.array([1])],
        [np.array([0.9]), np.array([0.95])],
        [np.array([[0, 0, 10, 10]], float), np.array([[0, 0, 10, 10]], float)],
        [np.array([1]), np.array([1])],
    )
    assert res["ap"][1] == pytest.approx(0.25)  # envelope 1/2 over recall 0..1/2
    with pytest.raises(ValueError, match="one entry per image"):
        eval_detection_voc([np.zeros((0, 4))], [np.zeros(0)], [np.zeros(0)], [], [])


class _FixedDetector(torch.nn.Module):
    """Returns each image's ground truth (from a lookup by image width) as detections."""

    def __init__(self, outputs):
        super().__init__()
        self.outputs = outputs
        self.w = torch.nn.Parameter(torch.zeros(1))

    def forward(self, images):
        assert not self.training
        return [self.outputs[int(img.shape[-1])] for img in images]


class _Tiny(torch.utils.data.Dataset):
    num_classes = 2

    def __init__(self):
        self.items = [
            (
                torch.zeros(3, 8, 20),
                {
                    "boxes": torch.tensor([[0.0, 0.0, 10.0, 8.0]]),
                    "labels": torch.tensor([1]),
                    "difficult": torch.tensor([False]),
                    "image_id": 0,
                },
            ),
            (
                torch.zeros(3, 8, 30),
                {
                    "boxes": torch.tensor([[0.0, 0.0, 10.0, 8.0], [12.0, 0, 20, 8]]),
                    "labels": torch.tensor([2, 1]),
                    "difficult": torch.tensor([False, True]),
                    "image_id": 1,
                },
            ),
        ]

    def __len__(self):
        return len(self.items)

    def __getitem__(self, i):
        return self.items[i]


def test_evaluate_voc_runs_a_model_over_a_dataset():
    ds = _Tiny()
    outputs = {
        20: {
            "boxes": torch.tensor([[0.0, 0.0, 10.0, 8.0]]),
            "labels": torch.tensor([1]),
            "scores": torch.tensor([0.9]),
        },
        30: {
            "boxes": torch.tensor([[0.0, 0.0, 10.0, 8.0], [12.0, 0, 20, 8]]),
            "labels": torch.tensor([2, 1]),
            "scores": torch.tensor([0.8, 0.95]),
        },
    }
    model = _FixedDetector(outputs)
    model.train()
    res = evaluate_voc(model, ds, device="cpu", use_07_metric=True, batch_size=1)
    assert model.training  # mode restored
    assert res["map"] == pytest.approx(1.0) and res["map_50"] == res["map"]
    assert res["num_images"] == 2 and len(res["ap"]) == 2
    # only the first image: class 2 has no ground truth there -> NaN in ap, excluded from map
    res = evaluate_voc(model, ds, device="cpu", max_images=1)
    assert res["num_images"] == 1 and res["map"] == pytest.approx(1.0) and math.isnan(res["ap"][1])
