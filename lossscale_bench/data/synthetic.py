"""Synthetic shapes in COCO format: a detection task a tiny SSD learns in minutes on CPU.

Each image holds 1-3 filled shapes (the class is the *shape*; colour, size,
aspect ratio and position are random and independent of it) on a textured,
noisy background: a colour gradient, low-frequency blotches and per-pixel
noise, which also covers the shapes. Object sizes (about 20-80 px on a 128 px
image) span the ``ssd_tiny`` default boxes (12.8 / 47 / 81 / 115 px at
128 px). Shapes may overlap, but by at most half of the smaller box (IoU <= 0.3),
and a shape's colour differs from the background and from the shapes it
overlaps, so every annotated object stays visible and separable.

``ensure_synthetic`` generates a data set once per parameter set into a cache
folder: it is written to a temporary directory and ``os.rename``'d into
place, so concurrent trials either see a complete data set or none, and a
process that loses the rename race uses the winner's copy (same bytes: the
generator is deterministic by seed). Where the cache is, and the version in
the folder name (bump ``GENERATOR_VERSION`` there when the output changes),
live in ``dataset_files.synthetic_cache``: ``lsbench validate`` checks the cache too.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path

import numpy as np
from PIL import Image, ImageDraw

# GENERATOR_VERSION, default_root and dataset_dirname stay importable from here
from ..dataset_files.synthetic_cache import GENERATOR_VERSION, cache_root, dataset_dirname, default_root  # noqa: F401

CLASSES = ("rectangle", "ellipse", "triangle")

_MIN_OBJECTS, _MAX_OBJECTS = 1, 3
_MAX_IOU = 0.3  # between any two boxes
_MAX_COVERED = 0.5  # max overlap as a fraction of the smaller of two boxes
_MIN_COLOUR_DIST = 0.5  # RGB distance (0..1 scale) from the background and overlapped shapes
_MIN_SIZE, _MAX_SIZE = 20, 80  # geometric-mean side in px at 128 px (scaled with image_size)
_BLOT_SIGMA = (0.02, 0.05)  # low-frequency background blotches
_NOISE_SIGMA = (0.01, 0.04)  # per-pixel noise over the whole image


def _paths(final: Path) -> dict:
    return {
        "root": final,
        "train_images": final / "train",
        "train_ann": final / "annotations" / "train.json",
        "val_images": final / "val",
        "val_ann": final / "annotations" / "val.json",
        "classes": list(CLASSES),
    }


def ensure_synthetic(
    root=None, *, train_images: int = 512, val_images: int = 128, image_size: int = 128, seed: int = 0
) -> dict:
    """Generate (once) and return the paths of a synthetic shapes data set.

    Returns ``{"train_images", "train_ann", "val_images", "val_ann"}`` (Paths),
    ``"classes"`` (list of names, label ``i`` <-> ``classes[i-1]``, COCO
    category id ``i``) and ``"root"`` (the data set folder).
    """
    if image_size < 32:
        raise ValueError(f"image_size must be >= 32, got {image_size}")
    if train_images < 0 or val_images < 0:
        raise ValueError("train_images and val_images must be >= 0")
    base = cache_root(root)
    final = base / dataset_dirname(train_images=train_images, val_images=val_images, image_size=image_size, seed=seed)
    paths = _paths(final)
    if paths["val_ann"].is_file():  # rename is atomic: a visible folder is complete
        return paths
    base.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{final.name}.tmp-", dir=base))
    try:
        os.chmod(tmp, 0o755)  # mkdtemp makes it private; the cache is shared
        _write_dataset(tmp, train_images=train_images, val_images=val_images, image_size=image_size, seed=seed)
        try:
            os.rename(tmp, final)
        except OSError:
            # Another process won the race (the target exists and is not empty): use theirs.
            if not paths["val_ann"].is_file():
                raise
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return paths


# ---------------------------------------------------------------------------
def _write_dataset(out: Path, *, train_images: int, val_images: int, image_size: int, seed: int) -> None:
    (out / "annotations").mkdir()
    for split, n, stream in (("train", train_images, 0), ("val", val_images, 1)):
        img_dir = out / split
        img_dir.mkdir()
        rng = np.random.default_rng(np.random.SeedSequence([seed, stream]))
        images, annotations = [], []
        for i in range(1, n + 1):
            pixels, objects = render_image(rng, image_size)
            name = f"{i:06d}.png"
            Image.fromarray(pixels).save(img_dir / name, format="PNG", compress_level=6)
            images.append({"id": i, "file_name": name, "width": image_size, "height": image_size})
            for label, (x0, y0, x1, y1) in objects:
                w, h = float(x1 - x0), float(y1 - y0)
                annotations.append(
                    {
                        "id": len(annotations) + 1,
                        "image_id": i,
                        "category_id": label,
                        "bbox": [float(x0), float(y0), w, h],
                        "area": w * h,
                        "iscrowd": 0,
                    }
                )
        doc = {
            "info": {
                "description": f"lossscale_bench synthetic shapes v{GENERATOR_VERSION}",
                "version": str(GENERATOR_VERSION),
                "year": 2026,
            },
            "licenses": [],
            "images": images,
            "annotations": annotations,
            "categories": [
                {"id": k, "name": name, "supercategory": "shape"} for k, name in enumerate(CLASSES, start=1)
            ],
        }
        with open(out / "annotations" / f"{split}.json", "w") as f:
            json.dump(doc, f, separators=(",", ":"))


def _background(rng: np.random.Generator, size: int) -> np.ndarray:
    """Float RGB in 0..1: a two-colour gradient plus low-frequency colour blotches."""
    c0, c1 = rng.uniform(0.0, 1.0, 3), rng.uniform(0.0, 1.0, 3)
    angle = rng.uniform(0, 2 * np.pi)
    yy, xx = np.mgrid[0:size, 0:size] / (size - 1)
    t = np.cos(angle) * xx + np.sin(angle) * yy
    t = (t - t.min()) / max(t.max() - t.min(), 1e-6)
    img = c0 * (1 - t[..., None]) + c1 * t[..., None]
    grid = int(rng.integers(3, 9))
    blot = rng.normal(0.0, rng.uniform(*_BLOT_SIGMA), (grid, grid, 3)).astype(np.float32)
    blot_img = np.stack(
        [np.asarray(Image.fromarray(blot[..., c]).resize((size, size), Image.BICUBIC)) for c in range(3)], axis=-1
    )
    return img + blot_img


def _sample_box(rng: np.random.Generator, size: int) -> tuple[int, int, int, int]:
    scale = size / 128.0
    s = np.exp(rng.uniform(np.log(_MIN_SIZE * scale), np.log(_MAX_SIZE * scale)))
    aspect = np.exp(rng.uniform(np.log(0.5), np.log(2.0)))
    w = int(np.clip(round(s * np.sqrt(aspect)), 8, size - 2))
    h = int(np.clip(round(s / np.sqrt(aspect)), 8, size - 2))
    x0 = int(rng.integers(0, size - w + 1))
    y0 = int(rng.integers(0, size - h + 1))
    return x0, y0, x0 + w, y0 + h


def _box_ok(box, placed) -> bool:
    x0, y0, x1, y1 = box
    area = (x1 - x0) * (y1 - y0)
    for _, (a0, b0, a1, b1) in placed:
        iw = max(0, min(x1, a1) - max(x0, a0))
        ih = max(0, min(y1, b1) - max(y0, b0))
        inter = iw * ih
        if inter == 0:
            continue
        other = (a1 - a0) * (b1 - b0)
        if inter / (area + other - inter) > _MAX_IOU or inter / min(area, other) > _MAX_COVERED:
            return False
    return True


def _overlaps(a, b) -> bool:
    return min(a[2], b[2]) > max(a[0], b[0]) and min(a[3], b[3]) > max(a[1], b[1])


def _triangle(rng: np.random.Generator, box) -> list[tuple[float, float]]:
    """A triangle whose tight bounding box is ``box``: a base on one side, apex on the opposite one."""
    x0, y0, x1, y1 = box
    xr, yb = x1 - 1, y1 - 1  # last pixel row/column inside the box
    t = rng.uniform(0.0, 1.0)
    side = int(rng.integers(4))
    if side == 0:  # apex up
        return [(x0, yb), (xr, yb), (x0 + t * (xr - x0), y0)]
    if side == 1:  # apex down
        return [(x0, y0), (xr, y0), (x0 + t * (xr - x0), yb)]
    if side == 2:  # apex left
        return [(xr, y0), (xr, yb), (x0, y0 + t * (yb - y0))]
    return [(x0, y0), (x0, yb), (xr, y0 + t * (yb - y0))]  # apex right


def render_image(rng: np.random.Generator, size: int):
    """One image: ``(uint8 [size,size,3], [(label 1..K, (x0,y0,x1,y1) pixel box), ...])``."""
    bg = _background(rng, size)
    canvas = Image.fromarray((np.clip(bg, 0, 1) * 255).round().astype(np.uint8))
    draw = ImageDraw.Draw(canvas)
    n = int(rng.integers(_MIN_OBJECTS, _MAX_OBJECTS + 1))
    objects: list = []
    colours: list = []
    for _ in range(n):
        for _attempt in range(50):
            box = _sample_box(rng, size)
            if _box_ok(box, objects):
                break
        else:
            continue
        label = int(rng.integers(1, len(CLASSES) + 1))
        x0, y0, x1, y1 = box
        # contrast with what it is drawn over: the background and any overlapping earlier shape
        under = [np.asarray(canvas.crop(box), dtype=np.float64).reshape(-1, 3).mean(axis=0) / 255.0]
        under += [c for c, (_, b) in zip(colours, objects) if _overlaps(box, b)]
        for _attempt in range(100):
            colour = rng.uniform(0.0, 1.0, 3)
            if all(np.linalg.norm(colour - u) >= _MIN_COLOUR_DIST for u in under):
                break
        else:
            colour = 1.0 - np.round(under[0])
        fill = tuple(int(round(c * 255)) for c in colour)
        # PIL's xy corners are inclusive pixels: box (x0,y0,x1,y1) covers x0..x1-1
        name = CLASSES[label - 1]
        if name == "rectangle":
            draw.rectangle([x0, y0, x1 - 1, y1 - 1], fill=fill)
        elif name == "ellipse":
            draw.ellipse([x0, y0, x1 - 1, y1 - 1], fill=fill)
        else:
            draw.polygon(_triangle(rng, box), fill=fill)
        objects.append((label, box))
        colours.append(colour)
    img = np.asarray(canvas, dtype=np.float32) / 255.0
    img = img + rng.normal(0.0, rng.uniform(*_NOISE_SIGMA), img.shape)
    return (np.clip(img, 0, 1) * 255).round().astype(np.uint8), objects
