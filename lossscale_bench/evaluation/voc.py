"""Pascal VOC detection metric (chainercv's conventions) and the evaluator the trials call.

``eval_detection_voc`` follows ``chainercv.evaluations.eval_detection_voc``,
because the published SSD512 table (the Chainer study's) was scored with it:

* per image and class, detections are taken in descending score order and
  each is matched to the ground truth box of highest IoU; IoU >= ``iou_thresh``
  is a match. A match with a ground truth box already taken is a false
  positive (no fall-back to the second best box);
* a detection matched to a *difficult* box is ignored (neither true nor false
  positive) and difficult boxes are not counted as positives;
* the 11-point interpolated AP (VOC2007 devkit) when ``use_07_metric``, else
  the area under the monotone precision envelope (VOC2010+);
* a class with no (non-difficult) ground truth gets AP ``NaN`` and is left
  out of the mean (``np.nanmean``); ``ap[l]`` is indexed by label value, so
  with labels ``1..K`` entry 0 (background) is always ``NaN``.

Coordinates are continuous ``(x1, y1, x2, y2)`` — the box of width ``x2 - x1``
— with no ``+1`` pixel. chainercv adds 1 to ``x2, y2`` inside its evaluator
because its VOC loader stores the devkit's 1-based *inclusive* pixel indices
shifted by -1; our loader (``lossscale_bench.data.voc``) converts them to
continuous coordinates instead (``xmin - 1, ymin - 1, xmax, ymax``), so the
boxes compared here are exactly the ones chainercv compares.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable

import numpy as np
import torch

from .predict import predictions

__all__ = ["bbox_iou", "calc_detection_voc_prec_rec", "calc_detection_voc_ap", "eval_detection_voc", "evaluate_voc"]


def bbox_iou(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """IoU matrix ``[len(a), len(b)]`` of continuous xyxy boxes."""
    a = np.asarray(a, dtype=np.float64).reshape(-1, 4)
    b = np.asarray(b, dtype=np.float64).reshape(-1, 4)
    tl = np.maximum(a[:, None, :2], b[None, :, :2])
    br = np.minimum(a[:, None, 2:], b[None, :, 2:])
    inter = np.prod(np.clip(br - tl, 0, None), axis=2)
    area_a = np.prod(np.clip(a[:, 2:] - a[:, :2], 0, None), axis=1)
    area_b = np.prod(np.clip(b[:, 2:] - b[:, :2], 0, None), axis=1)
    union = area_a[:, None] + area_b[None, :] - inter
    with np.errstate(divide="ignore", invalid="ignore"):
        iou = np.where(union > 0, inter / np.where(union > 0, union, 1.0), 0.0)
    return iou


def _np(x, dtype=None, shape=None) -> np.ndarray:
    if isinstance(x, torch.Tensor):
        x = x.detach().float().cpu().numpy() if x.is_floating_point() else x.detach().cpu().numpy()
    arr = np.asarray(x) if dtype is None else np.asarray(x, dtype=dtype)
    if shape is not None:
        arr = arr.reshape(shape)
    return arr


def _per_image_inputs(pred_bboxes, pred_labels, pred_scores, gt_bboxes, gt_labels, gt_difficults) -> list:
    """The inputs as lists of one entry per image (``None`` difficults: nothing is difficult)."""
    pred_bboxes, pred_labels, pred_scores = list(pred_bboxes), list(pred_labels), list(pred_scores)
    gt_bboxes, gt_labels = list(gt_bboxes), list(gt_labels)
    n = len(gt_bboxes)
    gt_difficults = [None] * n if gt_difficults is None else list(gt_difficults)
    lengths = {len(pred_bboxes), len(pred_labels), len(pred_scores), n, len(gt_labels), len(gt_difficults)}
    if len(lengths) != 1:
        raise ValueError(
            f"eval_detection_voc: all inputs must have one entry per image (got lengths {sorted(lengths)})"
        )
    return [pred_bboxes, pred_labels, pred_scores, gt_bboxes, gt_labels, gt_difficults]


def _match_image(pb, pl, ps, gb, gl, gd, iou_thresh: float, n_pos: dict, score: dict, match: dict) -> None:
    """Add one image's detections to ``score``/``match`` and its positives to ``n_pos``, per class.

    ``match`` entries: 1 true positive, 0 false positive, -1 matched a difficult box (ignored).
    """
    pb, pl, ps = _np(pb, np.float64, (-1, 4)), _np(pl, np.int64, (-1,)), _np(ps, np.float64, (-1,))
    gb, gl = _np(gb, np.float64, (-1, 4)), _np(gl, np.int64, (-1,))
    gd = np.zeros(len(gb), dtype=bool) if gd is None else _np(gd, bool, (-1,))
    if not (len(pb) == len(pl) == len(ps)) or not (len(gb) == len(gl) == len(gd)):
        raise ValueError("eval_detection_voc: boxes, labels, scores (and difficults) of an image differ in length")
    for lab in np.unique(np.concatenate([pl, gl])):
        lab = int(lab)
        pm = pl == lab
        pb_l, ps_l = pb[pm], ps[pm]
        order = ps_l.argsort(kind="stable")[::-1]
        pb_l, ps_l = pb_l[order], ps_l[order]
        gm = gl == lab
        gb_l, gd_l = gb[gm], gd[gm]
        n_pos[lab] += int(np.logical_not(gd_l).sum())
        score[lab].extend(ps_l.tolist())
        if len(pb_l) == 0:
            continue
        if len(gb_l) == 0:
            match[lab].extend([0] * len(pb_l))
            continue
        iou = bbox_iou(pb_l, gb_l)
        gt_index = iou.argmax(axis=1)
        gt_index[iou.max(axis=1) < iou_thresh] = -1
        taken = np.zeros(len(gb_l), dtype=bool)
        for g in gt_index:
            if g >= 0:
                match[lab].append(-1 if gd_l[g] else (0 if taken[g] else 1))
                taken[g] = True
            else:
                match[lab].append(0)


def _prec_rec(n_pos: dict, score: dict, match: dict) -> tuple[list, list]:
    """Precision and recall per class from the pooled matches, in descending score order."""
    n_fg_class = max(n_pos) + 1
    prec: list = [None] * n_fg_class
    rec: list = [None] * n_fg_class
    for lab in n_pos:
        score_l = np.asarray(score[lab], dtype=np.float64)
        match_l = np.asarray(match[lab], dtype=np.int8)
        order = score_l.argsort(kind="stable")[::-1]
        match_l = match_l[order]
        tp = np.cumsum(match_l == 1)
        fp = np.cumsum(match_l == 0)
        with np.errstate(divide="ignore", invalid="ignore"):
            prec[lab] = tp / (fp + tp)  # NaN where only ignored (difficult) matches so far
        if n_pos[lab] > 0:
            rec[lab] = tp / n_pos[lab]
    return prec, rec


def calc_detection_voc_prec_rec(
    pred_bboxes: Iterable,
    pred_labels: Iterable,
    pred_scores: Iterable,
    gt_bboxes: Iterable,
    gt_labels: Iterable,
    gt_difficults: Iterable | None = None,
    iou_thresh: float = 0.5,
):
    """Per-class precision and recall arrays (``None`` for a class absent from the inputs or,
    for recall, without non-difficult ground truth). Inputs are iterables over images."""
    per_image = _per_image_inputs(pred_bboxes, pred_labels, pred_scores, gt_bboxes, gt_labels, gt_difficults)
    n_pos: dict[int, int] = defaultdict(int)
    score: dict[int, list] = defaultdict(list)
    match: dict[int, list] = defaultdict(list)
    for pb, pl, ps, gb, gl, gd in zip(*per_image):
        _match_image(pb, pl, ps, gb, gl, gd, iou_thresh, n_pos, score, match)
    if not n_pos:
        return [], []
    return _prec_rec(n_pos, score, match)


def calc_detection_voc_ap(prec: list, rec: list, use_07_metric: bool = False) -> np.ndarray:
    """AP per class from :func:`calc_detection_voc_prec_rec`; ``NaN`` where either is ``None``."""
    ap = np.full(len(prec), np.nan, dtype=np.float64)
    for lab in range(len(prec)):
        if prec[lab] is None or rec[lab] is None:
            continue
        p = np.nan_to_num(prec[lab])
        r = rec[lab]
        if use_07_metric:
            total = 0.0
            for t in np.arange(0.0, 1.1, 0.1):
                total += (np.max(p[r >= t]) if np.any(r >= t) else 0.0) / 11
            ap[lab] = total
        else:
            mpre = np.concatenate(([0.0], p, [0.0]))
            mrec = np.concatenate(([0.0], r, [1.0]))
            mpre = np.maximum.accumulate(mpre[::-1])[::-1]
            i = np.where(mrec[1:] != mrec[:-1])[0]
            ap[lab] = float(np.sum((mrec[i + 1] - mrec[i]) * mpre[i + 1]))
    return ap


def eval_detection_voc(
    pred_bboxes,
    pred_labels,
    pred_scores,
    gt_bboxes,
    gt_labels,
    gt_difficults=None,
    iou_thresh: float = 0.5,
    use_07_metric: bool = False,
) -> dict:
    """VOC AP per class and mAP, as ``chainercv.evaluations.eval_detection_voc`` (see module doc).

    Each argument is a sequence with one entry per image: ``pred_bboxes[i]``
    ``(R, 4)`` xyxy, ``pred_labels[i]`` ``(R,)``, ``pred_scores[i]`` ``(R,)``,
    ``gt_bboxes[i]`` ``(G, 4)``, ``gt_labels[i]`` ``(G,)``, ``gt_difficults[i]``
    ``(G,)`` bool (``None``: nothing is difficult). numpy arrays, tensors or
    lists. Returns ``{"ap": ndarray indexed by label, "map": float}``; ``map``
    is ``NaN`` when no class has ground truth.
    """
    prec, rec = calc_detection_voc_prec_rec(
        pred_bboxes, pred_labels, pred_scores, gt_bboxes, gt_labels, gt_difficults, iou_thresh=iou_thresh
    )
    ap = calc_detection_voc_ap(prec, rec, use_07_metric=use_07_metric)
    valid = ap[~np.isnan(ap)]
    return {"ap": ap, "map": float(valid.mean()) if valid.size else float("nan")}


# ---------------------------------------------------------------------------
@torch.no_grad()
def evaluate_voc(
    model,
    dataset,
    *,
    device="cpu",
    max_images=None,
    autocast=None,
    use_07_metric: bool = False,
    batch_size: int = 8,
    iou_thresh: float = 0.5,
) -> dict:
    """VOC mAP of a torchvision-style detector on the first ``max_images`` images of ``dataset``.

    Works with any data set whose targets carry ``boxes`` (xyxy pixels) and
    ``labels``; ``difficult`` is used when present. Returns ``{"map",
    "map_50", "num_images", "num_detections", "ap"}``: for VOC ``map`` and
    ``map_50`` are the same number, the mAP at IoU ``iou_thresh`` (0.5);
    ``ap`` lists the per-class AP for labels ``1..K`` (``NaN``: no ground truth).
    A data set with no ground truth at all scores 0.0. The model runs in eval
    mode and gets its previous mode back. ``autocast``: optional factory
    returning a context manager entered around each forward.
    """
    preds_b, preds_l, preds_s, gts_b, gts_l, gts_d = [], [], [], [], [], []
    num_det = 0
    n = 0
    for target, out in predictions(
        model, dataset, device=device, batch_size=batch_size, max_images=max_images, autocast=autocast
    ):
        n += 1
        boxes = out["boxes"].detach().float().cpu().numpy().reshape(-1, 4)
        preds_b.append(boxes)
        preds_l.append(out["labels"].detach().cpu().numpy().reshape(-1))
        preds_s.append(out["scores"].detach().float().cpu().numpy().reshape(-1))
        num_det += len(boxes)
        gb = _np(target["boxes"], np.float64, (-1, 4))
        gts_b.append(gb)
        gts_l.append(_np(target["labels"], np.int64, (-1,)))
        d = target.get("difficult")
        gts_d.append(np.zeros(len(gb), dtype=bool) if d is None else _np(d, bool, (-1,)))
    res = eval_detection_voc(
        preds_b, preds_l, preds_s, gts_b, gts_l, gts_d, iou_thresh=iou_thresh, use_07_metric=use_07_metric
    )
    m = res["map"] if np.isfinite(res["map"]) else 0.0
    k = getattr(dataset, "num_classes", None)
    ap = res["ap"]
    if k is not None:
        full = np.full(int(k) + 1, np.nan)
        full[: min(len(ap), len(full))] = ap[: len(full)]
        ap = full
    return {
        "map": float(m),
        "map_50": float(m),
        "num_images": n,
        "num_detections": num_det,
        "ap": [float(x) for x in ap[1:]],
    }
