"""COCO box mAP: pycocotools' numbers, computed by ``fast_coco`` (or pycocotools itself, silenced).

``evaluate_coco`` runs a torchvision detector over a ``CocoDetection`` (or
the fake one), maps contiguous labels back to COCO category ids and scores
the detections; ``evaluate_detections`` is the scoring part alone, with
``fast_coco.coco_box_stats`` (``reference=True``: pycocotools' ``COCOeval``).

A data set without a COCO annotation file (VOC layout: ``data.voc.VOCDetection``) is scored against
the ground truth :func:`ground_truth_from_targets` builds from the evaluated images' own targets, the
boxes the VOC metric compares: category ``k`` is the class list's ``k``-th name (labels ``1..K``), a box's
``area`` is its width times its height, and a *difficult* object is a crowd region (``iscrowd: 1``),
which COCOeval ignores as the VOC metric ignores a difficult one (a detection on it is neither a true nor
a false positive; COCOeval measures the overlap with a crowd region as the share of the detection inside
it, where VOC uses the IoU).
"""

from __future__ import annotations

import contextlib
import io

import numpy as np
import torch

from .fast_coco import coco_box_stats
from .predict import predictions

__all__ = [
    "MAX_DETS",
    "evaluate_coco",
    "evaluate_detections",
    "ground_truth_from_targets",
    "pycocotools_box_stats",
    "top_per_image_category",
]


def _zero(num_images: int, num_detections: int = 0) -> dict:
    return {"map": 0.0, "map_50": 0.0, "map_75": 0.0, "num_images": num_images, "num_detections": num_detections}


#: COCOeval's largest ``maxDets``: it scores at most this many detections per image and category
MAX_DETS = 100


def top_per_image_category(dets: list[dict], k: int = MAX_DETS) -> list[dict]:
    """The detections COCOeval can score: the ``k`` highest per (image, category), in input order.

    Why: ``COCOeval.evaluateImg`` (and ``computeIoU``) sort each image's detections of a category by
    score, stably (``np.argsort(-score, kind="mergesort")``), and keep the first ``maxDets[-1]`` =
    100; the rest only cost time (``loadRes`` builds a record for each, ``computeIoU`` is skipped
    for them anyway). An untrained SSD gives 200 detections per image, many of one class. Keeping
    the same ``k`` per group with the same stable order of ties, and the survivors in their input
    order (``loadRes`` numbers them in that order), gives COCOeval exactly the detections it
    scores: every AP it reports is unchanged (tested against the untruncated evaluation).
    """
    groups: dict[tuple[int, int], list[int]] = {}
    for i, d in enumerate(dets):
        groups.setdefault((d["image_id"], d["category_id"]), []).append(i)
    if all(len(idx) <= k for idx in groups.values()):
        return dets
    keep: list[int] = []
    for idx in groups.values():
        keep.extend(sorted(idx, key=lambda i: -dets[i]["score"])[:k] if len(idx) > k else idx)
    keep.sort()
    return [dets[i] for i in keep]


def pycocotools_box_stats(coco_gt, detections: list[dict], img_ids=None) -> np.ndarray:
    """The 12 ``COCOeval.stats`` of pycocotools itself (bbox, ``params.imgIds = img_ids``), silenced.

    The reference that :func:`~lossscale_bench.evaluation.fast_coco.coco_box_stats` reproduces bit
    for bit (tests, ``benchmarks/coco_eval_speed.py``). ``detections`` must be non-empty
    (``loadRes`` needs one); ``loadRes`` adds ``id``/``area``/``iscrowd``/``segmentation`` to them.
    """
    from pycocotools.cocoeval import COCOeval

    ids = sorted(coco_gt.getImgIds()) if img_ids is None else sorted(int(i) for i in img_ids)
    with contextlib.redirect_stdout(io.StringIO()):
        coco_dt = coco_gt.loadRes(detections)
        ev = COCOeval(coco_gt, coco_dt, "bbox")
        ev.params.imgIds = ids
        ev.evaluate()
        ev.accumulate()
        ev.summarize()
    return np.asarray(ev.stats, dtype=float)


def evaluate_detections(coco_gt, detections: list[dict], img_ids=None, *, reference: bool = False) -> dict:
    """Box AP of ``detections`` (COCO result dicts: ``image_id``, ``category_id``,
    ``bbox`` [x, y, w, h], ``score``) against the pycocotools ``coco_gt``.

    ``img_ids`` restricts the evaluation to those images (default: all of
    ``coco_gt``). No detections -> all zeros, not an exception. An AP that
    pycocotools leaves undefined (no ground truth at all) is reported as 0.0.
    The numbers are pycocotools' ``COCOeval`` (bbox) ones, computed by the NumPy
    :func:`~lossscale_bench.evaluation.fast_coco.coco_box_stats` (the same floats, bit for bit;
    ~19x faster than COCOeval on the default study's val set, ``benchmarks/coco_eval_speed.py``);
    ``reference=True`` runs pycocotools itself instead.
    """
    ids = sorted(coco_gt.getImgIds()) if img_ids is None else sorted(int(i) for i in img_ids)
    if not detections:
        return _zero(len(ids))
    dets = [
        {
            "image_id": int(d["image_id"]),
            "category_id": int(d["category_id"]),
            "bbox": [float(v) for v in d["bbox"]],
            "score": float(d["score"]),
        }
        for d in detections
    ]
    return _score(coco_gt, dets, ids, reference)


def _score(coco_gt, dets: list[dict], ids: list[int], reference: bool = False) -> dict:
    """:func:`evaluate_detections` for detections already in plain Python types (ints, a list of floats, a
    float) and sorted image ids: what :func:`evaluate_coco` builds, so it skips the copy that makes them so
    (~0.3 s for the ~100 k detections of an untrained SSD on 512 images; docs/records/index.md)."""
    dets = top_per_image_category(dets, MAX_DETS)
    if reference:
        raw = pycocotools_box_stats(coco_gt, dets, ids)
    else:
        raw = coco_box_stats(coco_gt, dets, ids)
    stats = [float(s) if s >= 0 else 0.0 for s in raw]
    return {
        "map": stats[0],
        "map_50": stats[1],
        "map_75": stats[2],
        "num_images": len(ids),
        "num_detections": len(dets),
    }


def ground_truth_from_targets(targets: list[tuple[int, dict]], class_names) -> object:
    """A pycocotools ``COCO`` of ``targets`` (``(image id, target)`` pairs; a target's ``boxes`` xyxy
    pixels, ``labels`` ``1..K``, ``difficult`` when present) with the categories ``1..K`` named by
    ``class_names``: a difficult object becomes a crowd region (module doc)."""
    from pycocotools.coco import COCO

    anns: list[dict] = []
    for image_id, t in targets:
        boxes = t["boxes"].detach().double().cpu().reshape(-1, 4).tolist()
        labels = t["labels"].detach().cpu().reshape(-1).tolist()
        hard = t.get("difficult")
        hard = [False] * len(boxes) if hard is None else hard.detach().cpu().reshape(-1).tolist()
        for (x1, y1, x2, y2), lab, d in zip(boxes, labels, hard):
            w, h = x2 - x1, y2 - y1
            anns.append(
                {
                    "id": len(anns) + 1,  # COCOeval takes a match to id 0 for none
                    "image_id": int(image_id),
                    "category_id": int(lab),
                    "bbox": [x1, y1, w, h],
                    "area": w * h,
                    "iscrowd": int(bool(d)),
                }
            )
    coco = COCO()
    coco.dataset = {
        "images": [{"id": int(i)} for i, _ in targets],
        "annotations": anns,
        "categories": [{"id": k, "name": str(n)} for k, n in enumerate(class_names, start=1)],
    }
    with contextlib.redirect_stdout(io.StringIO()):  # createIndex prints
        coco.createIndex()
    return coco


@torch.no_grad()
def evaluate_coco(
    model, dataset, *, device="cpu", batch_size: int = 8, max_images=None, autocast=None, class_names=None
) -> dict:
    """COCO mAP of ``model`` on the first ``max_images`` images of ``dataset`` (all by default).

    Returns ``{"map": AP@[.5:.95], "map_50": AP@.5, "map_75", "num_images", "num_detections"}``.
    The model runs in eval mode and gets its previous train/eval mode back.
    ``autocast``: optional factory returning a context manager, entered around
    each forward (e.g. ``lambda: torch.autocast("cpu", torch.bfloat16)``).
    A data set without ``coco`` and ``label_to_cat`` (VOC layout) is scored against its targets
    (:func:`ground_truth_from_targets`; its labels are the category ids, named by ``class_names``,
    else by the data set's ``class_names``).
    """
    own_gt = hasattr(type(dataset), "coco") and hasattr(dataset, "label_to_cat")
    label_to_cat = dataset.label_to_cat if own_gt else None
    detections: list[dict] = []
    targets: list[tuple[int, dict]] = []
    for target, out in predictions(
        model, dataset, device=device, batch_size=batch_size, max_images=max_images, autocast=autocast
    ):
        image_id = int(target["image_id"])
        targets.append((image_id, {} if own_gt else target))
        boxes = out["boxes"].detach().float().cpu()
        if boxes.numel() == 0:
            continue
        xywh = torch.cat([boxes[:, :2], boxes[:, 2:] - boxes[:, :2]], dim=1).tolist()
        labels = out["labels"].detach().cpu().tolist()
        scores = out["scores"].detach().float().cpu().tolist()
        for b, lab, s in zip(xywh, labels, scores):
            cat = label_to_cat.get(int(lab)) if own_gt else (int(lab) if int(lab) >= 1 else None)
            if cat is None:  # background or out-of-range label: not a COCO class
                continue
            detections.append({"image_id": image_id, "category_id": int(cat), "bbox": b, "score": s})
    n = len(targets)
    if n == 0:
        return _zero(0)
    if not detections:
        return _zero(n)
    gt = dataset.coco if own_gt else ground_truth_from_targets(targets, class_names or dataset.class_names)
    # already plain Python values (tolist), so evaluate_detections' normalising copy is skipped
    return _score(gt, detections, sorted(i for i, _ in targets))
