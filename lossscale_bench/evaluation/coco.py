"""COCO box mAP: pycocotools' numbers, computed by ``fast_coco`` (or pycocotools itself, silenced).

``evaluate_coco`` runs a torchvision detector over a ``CocoDetection`` (or
the fake one), maps contiguous labels back to COCO category ids and scores
the detections; ``evaluate_detections`` is the scoring part alone, with
``fast_coco.coco_box_stats`` (``reference=True``: pycocotools' ``COCOeval``).
"""

from __future__ import annotations

import contextlib
import io

import numpy as np
import torch

from .fast_coco import coco_box_stats
from .predict import predictions


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


@torch.no_grad()
def evaluate_coco(model, dataset, *, device="cpu", batch_size: int = 8, max_images=None, autocast=None) -> dict:
    """COCO mAP of ``model`` on the first ``max_images`` images of ``dataset`` (all by default).

    Returns ``{"map": AP@[.5:.95], "map_50": AP@.5, "map_75", "num_images", "num_detections"}``.
    The model runs in eval mode and gets its previous train/eval mode back.
    ``autocast``: optional factory returning a context manager, entered around
    each forward (e.g. ``lambda: torch.autocast("cpu", torch.bfloat16)``).
    """
    detections: list[dict] = []
    img_ids: list[int] = []
    for target, out in predictions(
        model, dataset, device=device, batch_size=batch_size, max_images=max_images, autocast=autocast
    ):
        image_id = int(target["image_id"])
        img_ids.append(image_id)
        boxes = out["boxes"].detach().float().cpu()
        if boxes.numel() == 0:
            continue
        xywh = torch.cat([boxes[:, :2], boxes[:, 2:] - boxes[:, :2]], dim=1).tolist()
        labels = out["labels"].detach().cpu().tolist()
        scores = out["scores"].detach().float().cpu().tolist()
        for b, lab, s in zip(xywh, labels, scores):
            cat = dataset.label_to_cat.get(int(lab))
            if cat is None:  # background or out-of-range label: not a COCO class
                continue
            detections.append({"image_id": image_id, "category_id": int(cat), "bbox": b, "score": s})
    n = len(img_ids)
    if n == 0:
        return _zero(0)
    if not detections:
        return _zero(n)
    # already plain Python values (tolist), so evaluate_detections' normalising copy is skipped
    return _score(dataset.coco, detections, sorted(img_ids))
