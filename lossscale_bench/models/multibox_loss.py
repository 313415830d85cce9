"""SSD's anchor matching and multibox loss over the whole batch at once.

Why: torchvision's ``SSD.forward`` matches anchors image by image and
``SSD.compute_loss`` loops over the images in Python, each image costing a
``torch.where`` (a host sync on an accelerator) and a dozen small kernels. Here
the targets are padded to ``[B, G]`` and matching and loss run as a few batched
ops. On an accelerator every selection is a mask (no data-dependent shape, so no
host sync; tested on the meta device); on the CPU, where reading a mask is free,
the regression is indexed to the matched anchors instead (less work).

It computes torchvision's loss, rule for rule (torchvision 0.29,
``models/detection/ssd.py`` and ``_utils.SSDMatcher``):

* IoU ``[B, G, A]`` with torchvision's ``box_iou``; padded ground truths get
  IoU -1, below any real IoU, so they never win a maximum.
* ``SSDMatcher(0.5)``: each anchor takes its best ground truth (first index on
  ties, as ``torch.max``), background below the threshold; then every ground
  truth forces its best anchor (first on ties) onto itself. Where two ground
  truths force the same anchor, the higher index wins: what torchvision's
  ``matches[idx] = arange(G)`` does on CPU (its CUDA result is unspecified).
* Regression: smooth L1 (beta 1) against ``BoxCoder((10, 10, 5, 5)).encode_single``
  on matched anchors, summed; classification: cross-entropy on every anchor;
  foreground for classification is ``label > 0`` (not "matched"), as torchvision.
* Hard negatives: ``neg_to_pos_ratio * positives`` per image from the same
  descending sort of the loss (so ties break exactly as torchvision's sort);
  the rank comes from inverting the sort permutation instead of sorting the
  indices again (a permutation's argsort *is* its inverse, so this is exact).
  An image without boxes has no positives, so no negatives: it adds nothing.
* Both terms divided by ``max(1, matched anchors in the batch)``.

Equal to torchvision's loss within float tolerance, not bitwise: the
regression sum runs over the batch in another order
(tests/models/test_multibox_loss.py compares the two on random batches).
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor
from torch.nn.utils.rnn import pad_sequence
from torchvision.models.detection.ssd import SSD
from torchvision.ops import boxes as box_ops

from ..core.host_path import on_host


def pad_targets(targets: list[dict[str, Tensor]], device: torch.device) -> tuple[Tensor, Tensor, Tensor]:
    """``boxes [B, G, 4]``, ``labels [B, G]`` and ``valid [B, G]`` (False where padded), G the most boxes
    of any image. Built from shapes only (known on the host): no device read."""
    boxes = pad_sequence([t["boxes"].reshape(-1, 4) for t in targets], batch_first=True)
    labels = pad_sequence([t["labels"].reshape(-1) for t in targets], batch_first=True)
    valid = pad_sequence(
        [torch.ones(t["boxes"].shape[0], dtype=torch.bool, device=device) for t in targets], batch_first=True
    )
    return boxes.to(device), labels.to(device), valid


def match_anchors(gt_boxes: Tensor, valid: Tensor, anchors: Tensor, iou_thresh: float) -> Tensor:
    """torchvision's ``SSDMatcher(iou_thresh)`` for a batch: ``[B, A]`` ground-truth index per anchor, -1 for
    background. ``gt_boxes [B, G, 4]``, ``valid [B, G]``, ``anchors [B, A, 4]``."""
    b, g = valid.shape
    a = anchors.shape[1]
    if g == 0:
        return torch.full((b, a), -1, dtype=torch.int64, device=anchors.device)
    iou = box_ops.box_iou(gt_boxes, anchors).masked_fill_(~valid[..., None], -1.0)  # [B, G, A]
    matched_vals, matches = iou.max(dim=1)  # best gt per anchor
    matches.masked_fill_(matched_vals < iou_thresh, -1)
    # every ground truth takes its best anchor; a padded one forces nothing (-1 never wins amax)
    _, best_anchor = iou.max(dim=2)  # [B, G]
    gt_index = torch.arange(g, device=anchors.device).expand(b, g)
    src = torch.where(valid, gt_index, torch.full_like(gt_index, -1))
    forced = torch.full((b, a), -1, dtype=torch.int64, device=anchors.device)
    forced.scatter_reduce_(1, best_anchor, src, reduce="amax", include_self=True)
    return torch.where(forced >= 0, forced, matches)


def multibox_loss(
    bbox_regression: Tensor,
    cls_logits: Tensor,
    anchors: Tensor,
    gt_boxes: Tensor,
    gt_labels: Tensor,
    matched: Tensor,
    box_coder,
    neg_to_pos_ratio: float,
    dense: bool | None = None,
) -> dict[str, Tensor]:
    """torchvision's ``SSD.compute_loss`` on padded targets: ``bbox_regression [B, A, 4]``,
    ``cls_logits [B, A, C]``, ``anchors [B, A, 4]``, ``matched [B, A]`` from :func:`match_anchors`.

    ``dense`` (default: on any device but the CPU) computes the regression over every anchor
    and masks, and sums the classification terms through masks: no data-dependent shape, so no
    host sync. On the CPU, where reading a mask costs nothing, boolean indexing does less work
    (only the matched anchors are encoded). Both give the same loss (tests run both).
    """
    b, a = matched.shape
    if dense is None:
        dense = not on_host(bbox_regression)
    matched_fg = matched >= 0
    idx = matched.clamp(min=0)
    if gt_boxes.shape[1] == 0:  # no box in the whole batch: every anchor is background
        gt_boxes = anchors[:, :1]
        gt_labels = torch.zeros((b, 1), dtype=gt_labels.dtype, device=gt_labels.device)
    if dense:
        matched_boxes = torch.gather(gt_boxes, 1, idx[..., None].expand(b, a, 4))
        # background anchors encode against themselves: a finite (zero) target, masked out below
        matched_boxes = torch.where(matched_fg[..., None], matched_boxes.to(anchors.dtype), anchors)
        target = box_coder.encode_single(matched_boxes.reshape(-1, 4), anchors.reshape(-1, 4)).reshape(b, a, 4)
        # where(), not a multiply: a non-finite prediction on a background anchor must not reach the
        # sum (torchvision indexes it away), nor its gradient
        pred = torch.where(matched_fg[..., None], bbox_regression, target.to(bbox_regression.dtype))
        bbox_loss = F.smooth_l1_loss(pred, target, reduction="none")
        bbox_loss = torch.where(matched_fg[..., None], bbox_loss, torch.zeros_like(bbox_loss)).sum()
    else:
        bi, ai = matched_fg.nonzero(as_tuple=True)
        target = box_coder.encode_single(gt_boxes[bi, matched[bi, ai]], anchors[bi, ai])
        bbox_loss = F.smooth_l1_loss(bbox_regression[bi, ai], target, reduction="sum")

    cls_targets = torch.where(matched_fg, torch.gather(gt_labels, 1, idx), torch.zeros_like(idx))
    num_classes = cls_logits.size(-1)
    cls_loss = F.cross_entropy(cls_logits.reshape(-1, num_classes), cls_targets.reshape(-1), reduction="none").view(
        cls_targets.size()
    )

    # hard negative mining, as torchvision: same sort, so the same choice among equal losses
    foreground = cls_targets > 0
    num_negative = neg_to_pos_ratio * foreground.sum(1, keepdim=True)
    # masked_fill, not torchvision's ``loss[mask] = -inf``: a boolean-index write goes through
    # nonzero(), a host sync on CUDA; the values are the same
    # (detached: only the order is used, torchvision's clone carried a graph for nothing)
    negative_loss = cls_loss.detach().masked_fill(foreground, -float("inf"))
    _, order = negative_loss.sort(1, descending=True)
    rank = torch.empty_like(order)
    rank.scatter_(1, order, torch.arange(a, device=order.device).expand(b, a))
    background = rank < num_negative

    n = matched_fg.sum().clamp(min=1)
    if dense:
        zero = torch.zeros_like(cls_loss)
        cls_sum = torch.where(foreground, cls_loss, zero).sum() + torch.where(background, cls_loss, zero).sum()
    else:
        cls_sum = cls_loss[foreground].sum() + cls_loss[background].sum()
    return {"bbox_regression": bbox_loss / n, "classification": cls_sum / n}


def _check_boxes(targets: list[dict[str, Tensor]]) -> None:
    """torchvision's degenerate-box assertion, for host tensors only: reading a device tensor's
    verdict is a host sync per step. On an accelerator the batched path instead leaves such a box
    out of matching (the loaders never produce one: coco/voc drop them, the crops keep a minimum size)."""
    for target_idx, target in enumerate(targets):
        boxes = target["boxes"]
        if not on_host(boxes) or boxes.numel() == 0:
            continue
        bad = (boxes[:, 2:] <= boxes[:, :2]).any(dim=1)
        if bad.any():
            degen = boxes[int(torch.nonzero(bad)[0, 0])].tolist()
            raise AssertionError(
                "All bounding boxes should have positive height and width."
                f" Found invalid box {degen} for target at index {target_idx}."
            )


def fixed_size_transform(transform, images: list[Tensor], targets: list[dict[str, Tensor]]):
    """torchvision's ``GeneralizedRCNNTransform`` for a batch whose images already have its fixed
    size: one normalisation over the stacked batch instead of, per image, a normalisation, a
    same-size bilinear resize (``x * 1 + x_next * 0``: the same values for finite pixels) and a copy
    into the batch; boxes scale by exactly 1, so they are passed on. The same ``ImageList`` bit for
    bit (tests). None where that does not hold (other sizes, padding, masks or keypoints): the
    caller then runs the transform itself."""
    from torchvision.models.detection.image_list import ImageList
    from torchvision.models.detection.transform import GeneralizedRCNNTransform

    fixed = getattr(transform, "fixed_size", None)
    if type(transform) is not GeneralizedRCNNTransform or fixed is None or not images:
        return None
    h, w = int(fixed[1]), int(fixed[0])
    first = images[0]
    if h % transform.size_divisible or w % transform.size_divisible:
        return None
    for im in images:
        if (
            im.dim() != 3
            or tuple(im.shape[-2:]) != (h, w)
            or not im.is_floating_point()
            or im.dtype != first.dtype
            or im.device != first.device
            or im.shape[0] != first.shape[0]
        ):
            return None
    for t in targets:
        if "masks" in t or "keypoints" in t or not t["boxes"].is_floating_point():
            return None
    mean = torch.as_tensor(transform.image_mean, dtype=first.dtype, device=first.device)
    std = torch.as_tensor(transform.image_std, dtype=first.dtype, device=first.device)
    batch = (torch.stack(images) - mean[None, :, None, None]) / std[None, :, None, None]
    return ImageList(batch, [(h, w)] * len(images)), [dict(t) for t in targets]


class BatchedLossSSD(SSD):
    """torchvision's ``SSD`` whose training forward matches and computes the loss over the whole batch
    (:func:`match_anchors`, :func:`multibox_loss`). No parameters or buffers of its own: a built
    ``SSD`` becomes one by class assignment (``models.ssd.build_model``), state dicts unchanged.
    Evaluation is torchvision's forward, untouched."""

    def forward(self, images: list[Tensor], targets: list[dict[str, Tensor]] | None = None) -> Any:
        if not self.training:
            return super().forward(images, targets)
        if targets is None:
            raise ValueError("targets should not be none when in training mode")
        for target in targets:
            boxes = target["boxes"]
            if not isinstance(boxes, Tensor) or boxes.dim() != 2 or boxes.shape[-1] != 4:
                raise ValueError(
                    f"Expected target boxes to be a tensor of shape [N, 4], got {getattr(boxes, 'shape', type(boxes))}."
                )
        fast = fixed_size_transform(self.transform, images, targets)
        images_t, targets = fast if fast is not None else self.transform(images, targets)
        _check_boxes(targets)
        features = self.backbone(images_t.tensors)
        if isinstance(features, Tensor):
            features = OrderedDict([("0", features)])
        features = list(features.values())
        head_outputs = self.head(features)
        anchors = torch.stack(self.anchor_generator(images_t, features))
        device = anchors.device
        gt_boxes, gt_labels, valid = pad_targets(targets, device)
        if gt_boxes.shape[1]:
            valid = valid & (gt_boxes[..., 2:] > gt_boxes[..., :2]).all(-1)  # see _check_boxes
        matched = match_anchors(gt_boxes, valid, anchors, self.proposal_matcher.high_threshold)
        return multibox_loss(
            head_outputs["bbox_regression"],
            head_outputs["cls_logits"],
            anchors,
            gt_boxes,
            gt_labels,
            matched,
            self.box_coder,
            self.neg_to_pos_ratio,
        )
