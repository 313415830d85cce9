"""Small, dependency-free image/box transforms used by the data sets.

Boxes are ``float32 [N, 4]`` in xyxy pixel coordinates, continuous: a box
covering pixel columns ``a..b`` inclusive is ``[a, ., b + 1, .]``, so a flip
across an image of width ``W`` maps ``x`` to ``W - x``.
"""

from __future__ import annotations

import io
import sys

import numpy as np
import torch
from PIL import Image, ImageOps


class CorruptImage(ValueError):
    """An image file exists but cannot be decoded; the message names the file."""


#: EXIF orientations (tag 0x0112) that swap width and height: transposed, rotated 90 or 270 degrees
_SWAPPING_ORIENTATIONS = (5, 6, 7, 8)


def exif_orientation(img: Image.Image) -> int:
    """The image's EXIF orientation, 1 (as stored) where absent or not one of the eight defined values
    (real photos carry 0 and 65537: the kangaroo set has both; a viewer ignores them, so do we)."""
    try:
        value = img.getexif().get(0x0112)
    except Exception:  # a malformed EXIF block: the pixels are still good
        return 1
    return value if isinstance(value, int) and 1 <= value <= 8 else 1


def read_image(path, size: tuple[int, int] | None = None) -> torch.Tensor:
    """Decode an image file to a float tensor, or raise ``CorruptImage`` naming it (never a bare PIL error).

    ``size``: the ``(width, height)`` its annotation gives. The boxes are in the frame the annotator saw,
    which is the stored pixels (the VOC devkit, labelImg, PIL and torchvision read no EXIF) unless the
    image carries an EXIF rotation by 90 or 270 degrees and ``size`` is the rotated frame's and not the
    stored one's (a tool that showed the photo upright, as browsers and CVAT do): then the pixels are
    rotated to match. Rotations by 180 degrees and mirrors keep the size, cannot be told apart, and stay
    as stored. A JPEG whose end is missing is decoded as libjpeg does (the missing blocks grey) with a
    note naming it (once per process), not refused: a photo short of its last bytes (the kangaroo set's 00090.jpg, whose
    last 16x16 block is all it lacks) would otherwise fail the whole trial.
    """
    return pixels_to_float(read_pixels(path, size))


def read_pixels(path, size: tuple[int, int] | None = None) -> torch.Tensor:
    """:func:`read_image` before the conversion to float: ``uint8 [3, H, W]`` (a channel-first view of
    the decoded rows, the layout :func:`pixels_to_float` expects), or ``float32`` for 16-bit grayscale.
    What :class:`PixelCache` keeps: a quarter of the float image's bytes."""
    try:
        img, truncated = _decoded(path)
        with img:
            if size and exif_orientation(img) in _SWAPPING_ORIENTATIONS:
                stored, rotated = (img.width, img.height), (img.height, img.width)
                if tuple(size) == rotated != stored:
                    img = ImageOps.exif_transpose(img)
            pixels = pil_to_pixels(img)
    except (OSError, SyntaxError, ValueError) as exc:
        raise CorruptImage(f"corrupt or unreadable image {path}: {type(exc).__name__}: {exc}") from None
    if truncated:
        _note_truncated(path)
    return pixels


#: the truncated images already named in this process (a trial reads each image every epoch)
_NOTED: set[str] = set()


def _note_truncated(path) -> None:
    """One ``lsbench: note:`` line on stderr per truncated image and process, as the CLI writes its
    notes (it was a Python ``UserWarning`` with the source line under it, on every read)."""
    key = str(path)
    if key in _NOTED:
        return
    _NOTED.add(key)
    print(
        f"lsbench: note: {path}: the JPEG file is truncated (its end is missing); decoded with the missing "
        "blocks grey, as libjpeg does",
        file=sys.stderr,
        flush=True,
    )


class PixelCache:
    """Decoded images kept in memory, up to ``max_bytes`` in all, so that a training set small enough to
    fit is decoded once per process, not once per epoch.

    Why: on the kangaroo photos (132 training images, ~450x320) decoding was 7 ms of the 45 ms an
    augmented photo costs, at 1500 iterations of batch 8 about 90 s of a 2-core trial. The pixels are
    the decoder's own bytes, converted to float on each read exactly as an uncached read converts them,
    so a cached and an uncached load give the same tensor bit for bit (tested). Images past the budget
    are decoded on every read, as before; a large set (VOC0712, COCO) simply fills the budget and stops.
    ``LSBENCH_DECODE_CACHE_MB`` sets the default budget (0 turns the cache off).
    """

    def __init__(self, max_bytes: int | None = None) -> None:
        if max_bytes is None:
            from ..core.env_vars import env_number

            max_bytes = int(float(env_number("LSBENCH_DECODE_CACHE_MB", DEFAULT_DECODE_CACHE_MB)) * 2**20)
        self.max_bytes = max(0, int(max_bytes))
        self.bytes = 0
        self._store: dict = {}
        #: read_scaled: the size each photo had as decoded (kept even when its pixels are not)
        self._decoded_size: dict = {}

    def read(self, path, size: tuple[int, int] | None = None) -> torch.Tensor:
        """:func:`read_image`'s float tensor (a new one on every call: callers may write into it)."""
        key = (str(path), tuple(size) if size else None)
        pixels = self._store.get(key)
        if pixels is None:
            pixels = self._keep(key, read_pixels(path, size))
        return pixels_to_float(pixels)

    def read_scaled(self, path, size: tuple[int, int] | None, max_side: int) -> tuple[torch.Tensor, tuple[int, int]]:
        """``(image, (width, height) as decoded)``: :meth:`read`'s image shrunk so that its longer side is
        at most ``max_side`` (bilinear, antialiased, aspect kept, each side rounded to the nearest pixel;
        a smaller image unchanged); what is kept is the shrunk float image, so a later read costs a copy
        (every call returns a tensor of its own, as :meth:`read` does). The decoded size is returned so
        that callers check it against their annotation and scale boxes."""
        key = (str(path), tuple(size) if size else None, int(max_side))
        image = self._store.get(key)
        if image is None:
            decoded = pixels_to_float(read_pixels(path, size))
            image = self._keep(key, shrink_to(decoded, max_side))
            self._decoded_size[key] = (int(decoded.shape[-1]), int(decoded.shape[-2]))
        return image.clone(), self._decoded_size[key]

    def _keep(self, key, tensor: torch.Tensor) -> torch.Tensor:
        """``tensor``, stored under ``key`` if the budget still has room for it."""
        nbytes = tensor.numel() * tensor.element_size()
        if self.bytes + nbytes <= self.max_bytes:
            self._store[key] = tensor
            self.bytes += nbytes
        return tensor

    def __len__(self) -> int:
        return len(self._store)

    def __getstate__(self):  # a DataLoader worker or a pickled dataset starts empty, with the same budget
        return {"max_bytes": self.max_bytes, "bytes": 0, "_store": {}, "_decoded_size": {}}


def shrink_to(image: torch.Tensor, max_side: int) -> torch.Tensor:
    """A float ``[C, H, W]`` image with its longer side brought down to ``max_side`` (bilinear with
    antialiasing, as PIL's and torchvision's resize do when shrinking; sides rounded to the nearest
    pixel, at least 1); an image already that small is returned as it is."""
    h, w = int(image.shape[-2]), int(image.shape[-1])
    if max(h, w) <= int(max_side):
        return image
    f = int(max_side) / max(h, w)
    out = (max(1, round(h * f)), max(1, round(w * f)))
    return torch.nn.functional.interpolate(image[None], size=out, mode="bilinear", align_corners=False, antialias=True)[
        0
    ].clamp_(0, 1)


#: default :class:`PixelCache` budget per dataset and process, in MiB (the kangaroo training photos take ~60)
DEFAULT_DECODE_CACHE_MB = 512


def _decoded(path) -> tuple[Image.Image, bool]:
    """The decoded image and whether it is a truncated JPEG, decoded after appending the end-of-image
    marker (the pixels ``ImageFile.LOAD_TRUNCATED_IMAGES`` gives, without setting that process-wide flag)."""
    img = Image.open(path)
    try:
        img.load()
        return img, False
    except OSError as exc:
        img.close()
        if img.format != "JPEG" or "truncated" not in str(exc):
            raise
    with open(path, "rb") as f:
        data = f.read()
    img = Image.open(io.BytesIO(data + b"\xff\xd9"))
    img.load()  # a JPEG broken elsewhere raises here, and is refused as before
    return img, True


#: PIL's modes of 16-bit grayscale (PNG); ``convert("RGB")`` clips them at 255, which whitens the image
_GRAY16_MODES = ("I;16", "I;16L", "I;16B", "I;16N")


def pil_to_tensor(img: Image.Image) -> torch.Tensor:
    """PIL image of any mode (grayscale, palette, CMYK, RGBA) -> float32 RGB ``[3, H, W]`` in 0..1.

    A 16-bit grayscale image is scaled by 1/65535, not clipped at 255 as PIL's RGB conversion does
    (which turns everything above 1/256 of full scale white)."""
    return pixels_to_float(pil_to_pixels(img))


def pil_to_pixels(img: Image.Image) -> torch.Tensor:
    """:func:`pil_to_tensor` before the float conversion: ``uint8 [3, H, W]``, a channel-first view of the
    RGB rows; ``float32`` in 0..1 for 16-bit grayscale, which has no exact 8-bit form."""
    if img.mode in _GRAY16_MODES:
        gray = torch.from_numpy(np.asarray(img, dtype=np.float32).copy()).div_(65535.0).clamp_(0, 1)
        return gray.unsqueeze(0).expand(3, -1, -1).contiguous()
    arr = np.asarray(img.convert("RGB"), dtype=np.uint8)
    return torch.from_numpy(arr.copy()).permute(2, 0, 1)


def pixels_to_float(pixels: torch.Tensor) -> torch.Tensor:
    """:func:`pil_to_pixels`' tensor as float32 in 0..1, always a new tensor (the layout is the view's:
    the same strides an uncached read gives, so every later op sees the same input)."""
    if pixels.dtype == torch.uint8:
        return pixels.float().div_(255.0)
    return pixels.clone()


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
