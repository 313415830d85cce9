"""SSD training augmentation, as chainercv's SSD example (and torchvision's SSD preset) does it.

Order (chainercv ``examples/ssd/train.py`` ``Transform``): photometric
distortion → expand (zoom out onto a mean-coloured canvas) → random crop
under IoU constraints → (resize, done by the detector's own transform) →
horizontal flip. Parameters are chainercv's:

* photometric (``random_distort``): brightness ±32/255 (p 0.5); then either
  contrast, saturation, hue or saturation, hue, contrast (p 0.5 each);
  contrast and saturation ×[0.5, 1.5], hue ±18/180 of the colour circle;
* expand (``random_expand``, p 0.5): canvas ratio uniform in [1, 4], the
  image at a random offset, the rest filled with the model's mean colour;
* crop (``random_crop_with_bbox_constraints``): candidates are the whole
  image plus, for each IoU constraint (min 0.1, 0.3, 0.5, 0.7, 0.9; max 1),
  the first of 50 random crops (scale 0.3–1, aspect 1/2–2) whose IoU with
  *every* box satisfies it; one candidate is then picked uniformly. (The 50
  draws of a constraint are made at once, vectorised: the same distribution
  as chainercv's loop, not its exact random stream.) Boxes
  whose centre falls outside the crop are dropped, the rest are clipped;
* flip (p 0.5).

Unlike chainercv, a candidate crop that would leave no box (or only boxes
narrower than ``min_box_size`` px) is rejected, as torchvision's
``RandomIoUCrop`` does: a non-empty target stays non-empty, every box stays
inside the image with positive width and height.

The expand canvas is never materialised: the crop is cut from the virtual
canvas directly, so a 4× zoom-out costs no more than the crop itself.

Determinism: every random choice comes from ``numpy.random.default_rng(seed)``,
so the same ``(image, target, seed)`` gives the same output in any process.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

from .transforms import hflip

__all__ = [
    "SSDAugment",
    "AugmentedDataset",
    "photometric_distort",
    "photometric_plan",
    "apply_photometric",
    "rgb_to_hsv",
    "hsv_to_rgb",
    "CHAINERCV_MEAN",
]

#: chainercv's SSD mean colour (123, 117, 104) / 255, RGB: the expand canvas fill
CHAINERCV_MEAN = (123 / 255, 117 / 255, 104 / 255)
CROP_CONSTRAINTS = ((0.1, None), (0.3, None), (0.5, None), (0.7, None), (0.9, None), (None, 1.0))


# --------------------------------------------------------------------------- colour
def rgb_to_hsv(img: torch.Tensor) -> torch.Tensor:
    """``[3, H, W]`` RGB in 0..1 -> HSV, all three in 0..1."""
    r, g, b = img.unbind(0)
    maxc = img.amax(0)
    minc = img.amin(0)
    delta = maxc - minc
    s = torch.where(maxc > 0, delta / maxc.clamp_min(1e-12), torch.zeros_like(maxc))
    d = delta.clamp_min(1e-12)
    rc, gc, bc = (maxc - r) / d, (maxc - g) / d, (maxc - b) / d
    h = torch.where(maxc == r, bc - gc, torch.where(maxc == g, 2.0 + rc - bc, 4.0 + gc - rc))
    h = torch.where(delta > 0, (h / 6.0) % 1.0, torch.zeros_like(h))
    return torch.stack([h, s, maxc])


def hsv_to_rgb(img: torch.Tensor) -> torch.Tensor:
    """``[3, H, W]`` HSV in 0..1 -> RGB: each output channel is one of ``v, p, q, t`` chosen by the hue's
    sextant (the textbook table), picked with one gather from those four planes. (It was a gather from
    all 18 planes of the table, stacked: the same values, and a third of an augmented photo's time.)"""
    h, s, v = img.unbind(0)
    i = torch.floor(h * 6.0)
    f = h * 6.0 - i
    i = i.long() % 6
    p, q, t = v * (1 - s), v * (1 - s * f), v * (1 - s * (1 - f))
    planes = torch.stack((v, p, q, t))
    return planes.gather(0, _SEXTANT_SOURCE[:, i])


#: for each RGB channel (row) and hue sextant (column), which of the planes ``v, p, q, t`` it takes:
#: sextants 0..5 are (v,t,p), (q,v,p), (p,v,t), (p,q,v), (t,p,v), (v,p,q)
_SEXTANT_SOURCE = torch.tensor([[0, 2, 1, 1, 3, 0], [3, 0, 0, 2, 1, 1], [1, 1, 3, 0, 0, 2]])


def photometric_plan(
    rng: np.random.Generator,
    *,
    brightness_delta: float = 32 / 255,
    contrast=(0.5, 1.5),
    saturation=(0.5, 1.5),
    hue_delta: int = 18,
) -> list[tuple[str, float]]:
    """chainercv ``random_distort``'s random choices, drawn in its order, as ``[(op, value), ...]`` in the
    order they apply. Drawn apart from the pixels so that :class:`SSDAugment` can apply them to only the
    part of the image its crop keeps: each op is per pixel, so that is the same result for less work
    (a third of an augmented photo's time went to distorting pixels the crop then threw away)."""
    plan: list[tuple[str, float]] = []

    def draw(op, low, high, integer=False):
        if rng.integers(2):
            plan.append((op, int(rng.integers(low, high + 1)) / 180.0 if integer else float(rng.uniform(low, high))))

    draw("brightness", -brightness_delta, brightness_delta)
    ops = (("contrast", *contrast), ("saturation", *saturation), ("hue", -hue_delta, hue_delta, True))
    for op in ops if rng.integers(2) else (ops[1], ops[2], ops[0]):
        draw(*op)
    return plan


def apply_photometric(img: torch.Tensor, plan: list[tuple[str, float]]) -> torch.Tensor:
    """``plan`` (:func:`photometric_plan`) applied to a float ``[3, H, W]`` image in 0..1 (a new tensor)."""
    img = img.float().clone()
    for op, value in plan:
        if op == "brightness":
            img = (img + value).clamp_(0, 1)
        elif op == "contrast":
            img = (img * value).clamp_(0, 1)
        else:
            hsv = rgb_to_hsv(img)
            if op == "saturation":
                hsv[1] = (hsv[1] * value).clamp_(0, 1)
            else:
                hsv[0] = (hsv[0] + value) % 1.0
            img = hsv_to_rgb(hsv)
    return img.clamp_(0, 1)


def photometric_distort(img: torch.Tensor, rng: np.random.Generator, **ranges) -> torch.Tensor:
    """chainercv ``random_distort`` on a float ``[3, H, W]`` image in 0..1 (returns a new tensor)."""
    return apply_photometric(img, photometric_plan(rng, **ranges))


# --------------------------------------------------------------------------- geometry
def _crop_keep(boxes: np.ndarray, crop: np.ndarray, min_size: float) -> tuple[np.ndarray, np.ndarray]:
    """(mask of boxes kept, their clipped coordinates relative to the crop)."""
    if len(boxes) == 0:
        return np.zeros(0, bool), boxes.reshape(0, 4)
    centre = (boxes[:, :2] + boxes[:, 2:]) / 2
    keep = np.logical_and(crop[:2] <= centre, centre < crop[2:]).all(axis=1)
    clipped = np.concatenate([np.maximum(boxes[:, :2], crop[:2]), np.minimum(boxes[:, 2:], crop[2:])], axis=1)
    clipped = clipped - np.tile(crop[:2], 2)
    keep &= ((clipped[:, 2:] - clipped[:, :2]) >= min_size).all(axis=1)
    return keep, clipped


@dataclass
class SSDAugment:
    """Callable ``(image, target, seed) -> (image, target)`` for training splits.

    ``image``: float ``[3, H, W]`` in 0..1; ``target``: ``boxes`` float
    ``[N, 4]`` xyxy pixels plus any per-box tensors (``labels``,
    ``difficult``, ...) which are filtered alongside; other entries pass
    through. ``out_size``: resize the result to ``out_size × out_size``
    (the detector resizes anyway; this only saves memory between loader and
    model). Switch parts off with the flags.
    """

    photometric: bool = True
    expand: bool = True
    crop: bool = True
    flip: bool = True
    max_expand_ratio: float = 4.0
    fill: tuple = CHAINERCV_MEAN
    min_scale: float = 0.3
    max_aspect_ratio: float = 2.0
    max_trials: int = 50
    min_box_size: float = 1.0
    out_size: int | None = None

    def __call__(self, image: torch.Tensor, target: dict, seed: int):
        rng = np.random.default_rng(int(seed) % (2**63))
        boxes_t = target["boxes"]
        n = int(boxes_t.shape[0])
        per_box = {
            k: v
            for k, v in target.items()
            if isinstance(v, torch.Tensor) and v.dim() >= 1 and v.shape[0] == n and k != "boxes"
        }
        boxes = boxes_t.detach().cpu().numpy().astype(np.float64).reshape(-1, 4)

        plan = photometric_plan(rng) if self.photometric else []  # applied in _cut, to what the crop keeps
        _, h, w = image.shape

        # expand: the image sits at (x_off, y_off) on a canvas of (ch, cw), never built
        ch, cw, y_off, x_off = h, w, 0, 0
        if self.expand and self.max_expand_ratio > 1 and rng.integers(2):
            ratio = float(rng.uniform(1, self.max_expand_ratio))
            ch, cw = int(h * ratio), int(w * ratio)
            y_off = int(rng.integers(0, ch - h + 1))
            x_off = int(rng.integers(0, cw - w + 1))
        boxes = boxes + np.array([x_off, y_off, x_off, y_off], dtype=np.float64)

        crop = np.array([0.0, 0.0, cw, ch])  # x1, y1, x2, y2 on the canvas
        if self.crop and n > 0:
            crop = self._choose_crop(rng, boxes, ch, cw)
        keep, clipped = _crop_keep(boxes, crop, self.min_box_size if n else 0.0)
        if n > 0 and not keep.any():  # only possible for the whole canvas with degenerate input boxes
            keep, clipped = _crop_keep(boxes, crop, 0.0)
        image = self._cut(image, crop, y_off, x_off, plan)

        new_boxes = torch.from_numpy(clipped[keep]).to(boxes_t.dtype).reshape(-1, 4)
        idx = torch.from_numpy(np.nonzero(keep)[0])
        out = dict(target)
        out["boxes"] = new_boxes
        for k, v in per_box.items():
            out[k] = v[idx]

        if self.out_size:
            s = int(self.out_size)
            _, hh, ww = image.shape
            image = F.interpolate(image[None], size=(s, s), mode="bilinear", align_corners=False)[0]
            out["boxes"] = out["boxes"] * torch.tensor([s / ww, s / hh, s / ww, s / hh], dtype=out["boxes"].dtype)

        if self.flip and rng.integers(2):
            image, out["boxes"] = hflip(image, out["boxes"])
        return image.contiguous(), out

    # ------------------------------------------------------------------
    def _choose_crop(self, rng: np.random.Generator, boxes: np.ndarray, ch: int, cw: int) -> np.ndarray:
        """chainercv's candidate search, with the ``max_trials`` draws of a constraint vectorised."""
        candidates = [np.array([0.0, 0.0, cw, ch])]
        trials = int(self.max_trials)
        centre = (boxes[:, :2] + boxes[:, 2:]) / 2  # [N, 2]
        area_b = np.prod(boxes[:, 2:] - boxes[:, :2], axis=1)  # [N]
        for min_iou, max_iou in CROP_CONSTRAINTS:
            lo = 0.0 if min_iou is None else min_iou
            hi = 1.0 if max_iou is None else max_iou
            scale = rng.uniform(self.min_scale, 1.0, trials)
            ar = rng.uniform(
                np.maximum(1 / self.max_aspect_ratio, scale * scale),
                np.minimum(self.max_aspect_ratio, 1 / (scale * scale)),
            )
            crop_h = np.maximum(1, (ch * scale / np.sqrt(ar)).astype(np.int64))
            crop_w = np.maximum(1, (cw * scale * np.sqrt(ar)).astype(np.int64))
            top = rng.integers(0, np.maximum(1, ch - crop_h))
            left = rng.integers(0, np.maximum(1, cw - crop_w))
            crops = np.stack([left, top, left + crop_w, top + crop_h], axis=1).astype(np.float64)  # [T, 4]
            tl = np.maximum(boxes[None, :, :2], crops[:, None, :2])
            br = np.minimum(boxes[None, :, 2:], crops[:, None, 2:])
            inter = np.prod(np.clip(br - tl, 0, None), axis=2)  # [T, N]
            area_c = np.prod(crops[:, 2:] - crops[:, :2], axis=1)
            iou = inter / np.maximum(area_b[None, :] + area_c[:, None] - inter, 1e-12)
            ok = (iou.min(axis=1) >= lo) & (iou.max(axis=1) <= hi)
            # the box survives the crop: centre inside, clipped size >= min_box_size
            inside = ((crops[:, None, :2] <= centre[None]) & (centre[None] < crops[:, None, 2:])).all(axis=2)
            big = ((br - tl) >= self.min_box_size).all(axis=2)
            ok &= (inside & big).any(axis=1)
            hits = np.flatnonzero(ok)
            if hits.size:
                candidates.append(crops[hits[0]])
        return candidates[int(rng.integers(len(candidates)))]

    def _cut(self, image: torch.Tensor, crop: np.ndarray, y_off: int, x_off: int, plan=()) -> torch.Tensor:
        """The ``crop`` window of the virtual canvas (image at the offsets, ``fill`` elsewhere), with the
        photometric ``plan`` applied to the image's part of it only (chainercv distorts before it expands,
        so the fill is never distorted)."""
        _, h, w = image.shape
        x1, y1, x2, y2 = (int(v) for v in crop)
        if (x1, y1, x2, y2) == (x_off, y_off, x_off + w, y_off + h):
            return apply_photometric(image, plan) if plan else image
        out = torch.empty(image.shape[0], y2 - y1, x2 - x1, dtype=image.dtype)
        out[:] = torch.tensor(self.fill, dtype=image.dtype).view(-1, 1, 1)
        # intersection of the crop and the image, in canvas coordinates
        ix1, iy1 = max(x1, x_off), max(y1, y_off)
        ix2, iy2 = min(x2, x_off + w), min(y2, y_off + h)
        if ix2 > ix1 and iy2 > iy1:
            part = image[:, iy1 - y_off : iy2 - y_off, ix1 - x_off : ix2 - x_off]
            out[:, iy1 - y1 : iy2 - y1, ix1 - x1 : ix2 - x1] = apply_photometric(part, plan) if plan else part
        return out


class AugmentedDataset(torch.utils.data.Dataset):
    """Wrap a training set that has ``load(index, flip=False)`` (``CocoDetection``, ``VOCDetection``)
    so that ``ds[(index, aug_seed)]`` returns ``augment(*ds.load(index), aug_seed)``.

    Everything else (``class_names``, ``coco``, ``label_to_cat``, ``load``, ...) is the wrapped
    set's, so evaluators and ``build_datasets`` callers see the same surface. For the coco2017
    training split: ``AugmentedDataset(CocoDetection(..., train=True), SSDAugment())``.
    """

    supports_aug_seed = True

    def __init__(self, dataset, augment) -> None:
        self.dataset = dataset
        self.augment = augment

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, key):
        if isinstance(key, tuple):
            index, seed = int(key[0]), int(key[1])
        else:
            index, seed = int(key), int(torch.randint(0, 2**62, ()))
        image, target = self.dataset.load(index)
        return self.augment(image, target, seed)

    def __getattr__(self, name):
        if name in ("dataset", "augment"):
            raise AttributeError(name)
        return getattr(self.dataset, name)

    def __repr__(self) -> str:
        return f"AugmentedDataset({self.dataset!r})"
