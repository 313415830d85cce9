"""Small, dependency-free image/box transforms used by the data sets.

Boxes are ``float32 [N, 4]`` in xyxy pixel coordinates, continuous: a box
covering pixel columns ``a..b`` inclusive is ``[a, ., b + 1, .]``, so a flip
across an image of width ``W`` maps ``x`` to ``W - x``.
"""

from __future__ import annotations

import numpy as np
import torch
from PIL import Image


class CorruptImage(ValueError):
    """An image file exists but cannot be decoded; the message names the file."""


def read_image(path) -> "torch.Tensor":
    """Decode an image file to a float tensor, or raise ``CorruptImage`` naming it (never a bare PIL error)."""
    from PIL import Image

    try:
        with Image.open(path) as img:
            img.load()
            return pil_to_tensor(img)
    except (OSError, SyntaxError, ValueError) as exc:
        raise CorruptImage(f"corrupt or unreadable image {path}: {type(exc).__name__}: {exc}") from None


def pil_to_tensor(img: Image.Image) -> torch.Tensor:
    """RGB PIL image -> float32 ``[3, H, W]`` in 0..1."""
    arr = np.asarray(img.convert("RGB"), dtype=np.uint8)
    return torch.from_numpy(arr.copy()).permute(2, 0, 1).float().div_(255.0)


def xywh_to_xyxy(boxes: torch.Tensor) -> torch.Tensor:
    boxes = boxes.reshape(-1, 4)
    return torch.cat([boxes[:, :2], boxes[:, :2] + boxes[:, 2:]], dim=1)


def xyxy_to_xywh(boxes: torch.Tensor) -> torch.Tensor:
    boxes = boxes.reshape(-1, 4)
    return torch.cat([boxes[:, :2], boxes[:, 2:] - boxes[:, :2]], dim=1)


def clip_boxes(boxes: torch.Tensor, width: int, height: int) -> torch.Tensor:
    boxes = boxes.clone()
    boxes[:, 0::2] = boxes[:, 0::2].clamp(0, width)
    boxes[:, 1::2] = boxes[:, 1::2].clamp(0, height)
    return boxes


def valid_box_mask(boxes: torch.Tensor, min_size: float = 1.0) -> torch.Tensor:
    """True where both width and height exceed ``min_size`` pixels."""
    wh = boxes[:, 2:] - boxes[:, :2]
    return (wh > min_size).all(dim=1)


def hflip(image: torch.Tensor, boxes: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Mirror a ``[C, H, W]`` image and its xyxy boxes left-right."""
    width = image.shape[-1]
    flipped = boxes.clone()
    flipped[:, 0] = width - boxes[:, 2]
    flipped[:, 2] = width - boxes[:, 0]
    return image.flip(-1), flipped


def flip_decision(aug_seed: int, p: float = 0.5) -> bool:
    """A deterministic coin for one sample: same ``aug_seed`` -> same answer, any process."""
    g = torch.Generator().manual_seed(int(aug_seed) % (2**63))
    return bool(torch.rand((), generator=g) < p)
