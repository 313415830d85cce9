"""COCO-format detection data sets (real COCO 2017 or the synthetic shapes) and a fake one.

Targets follow torchvision's detection convention: ``boxes`` float32
``[N, 4]`` xyxy pixels, ``labels`` int64 in ``1..K`` (0 is background).
COCO category ids (sparse for real COCO) map to contiguous labels in
ascending id order: ``label_to_cat`` / ``cat_to_label`` convert, and
``class_names[label - 1]`` names a label.

Sample keys: ``ds[i]`` flips with torch's global RNG (when ``train`` and
``hflip``); ``ds[(i, aug_seed)]`` decides the flip from ``aug_seed`` alone,
which is what ``make_loader`` / ``infinite_batches`` use so the augmentation
is reproducible and resumable whatever the worker layout.
"""

from __future__ import annotations

import contextlib
import io
from pathlib import Path

import torch
from torch.utils.data import Dataset

from ..dataset_files.annotations import AnnotationError, Drops, size_mismatch
from ..dataset_files.coco_json import index_coco, load_coco_json
from .transforms import PixelCache, clip_boxes, flip_decision, hflip, valid_box_mask, xywh_to_xyxy


class DataNotFound(FileNotFoundError):
    """A data set folder or annotation file is missing; the message names the path looked at."""


def require_ground_truth(val, source) -> None:
    """Refuse an evaluation set that cannot give a real mAP (no image, or no object a metric counts).

    Such a set used to give a *finished* trial with mAP 0.00; ``lsbench validate`` catches the
    usual cases before training, this catches the rest (``eval.max_images`` images without
    objects, data changed since): the trial fails with this line, naming ``source``.
    """
    if len(val) == 0:
        raise AnnotationError(source, "", "the evaluation split has no images: nothing to score", droppable=False)
    if getattr(val, "objects_scored", 1) == 0:
        raise AnnotationError(
            source,
            "",
            f"no objects to score (none, or only difficult/crowd ones) in the {len(val)} "
            "evaluated images: mAP would be 0",
            droppable=False,
        )


def silent_coco(dataset: dict):
    """A pycocotools ``COCO`` built from an in-memory dict without its prints."""
    from pycocotools.coco import COCO

    coco = COCO()
    coco.dataset = dataset
    with contextlib.redirect_stdout(io.StringIO()):
        coco.createIndex()
    return coco


def _split_key(key):
    if isinstance(key, tuple):
        return int(key[0]), int(key[1])
    return int(key), None


class _SeededFlip:
    """``ds[i]`` or ``ds[(i, aug_seed)]``: the sample, mirrored when ``hflip`` and the seed say so
    (a seeded decision, so a resumed trial sees the same flips)."""

    hflip = False

    def __getitem__(self, key):
        index, aug_seed = _split_key(key)
        flip = False
        if self.hflip:
            flip = flip_decision(aug_seed) if aug_seed is not None else bool(torch.rand(()) < 0.5)
        return self.load(index, flip)


class CocoDetection(_SeededFlip, Dataset):
    """Images from ``image_dir`` with the annotations of the COCO json ``ann_file``.

    ``train=True`` drops images without any usable (non-crowd, non-degenerate)
    box, as torchvision's references do, and enables the horizontal flip
    (p=0.5) when ``hflip``. ``train=False`` keeps every image (in id order)
    and never flips. ``max_images`` keeps the first images by id.
    ``skipped_boxes`` counts non-crowd boxes dropped as degenerate (width or
    height <= 1 px after clipping to the image), plus the bad ones dropped.

    A file that is not a COCO file, or a bad annotation record (an unknown
    category or image, a bbox that is not four finite numbers, negative or
    wholly outside the image: :mod:`lossscale_bench.dataset_files.coco_json`),
    raises an ``AnnotationError`` naming the file and the record; with
    ``bad_annotations="drop"`` bad records are dropped and counted instead
    (``dropped_annotations`` by reason, ``unknown_objects`` by category id),
    also from what pycocotools scores.
    """

    supports_aug_seed = True

    def __init__(
        self, image_dir, ann_file, *, train: bool, hflip: bool = True, max_images=None, bad_annotations: str = "error"
    ) -> None:
        self.image_dir = Path(image_dir).expanduser()
        self.ann_file = Path(ann_file).expanduser()
        self._pixels = PixelCache()  # decoded once per process while the budget lasts: transforms.PixelCache
        if not self.image_dir.is_dir():
            raise DataNotFound(f"image folder not found: {self.image_dir}")
        if not self.ann_file.is_file():
            raise DataNotFound(f"annotation file not found: {self.ann_file}")
        self.train = bool(train)
        self.hflip = bool(hflip) and self.train
        self._drops = Drops(bad_annotations)
        data = load_coco_json(self.ann_file)
        index = index_coco(data, self.ann_file, self._drops, evaluation=not self.train)
        self._gt = {**data, "annotations": index.kept}  # what pycocotools scores: the records kept
        self._coco = None
        self.label_to_cat: dict[int, int] = {i: c for i, (c, _) in enumerate(index.categories, start=1)}
        self.cat_to_label: dict[int, int] = {c: lab for lab, c in self.label_to_cat.items()}
        self.class_names: list[str] = [n for _, n in index.categories]
        self.skipped_boxes = self._drops.total
        self.crowd_boxes = 0
        self._records = []
        for img_id in sorted(index.images):
            rec = self._record(index.images[img_id], index.per_image[img_id])
            if self.train and len(rec["labels"]) == 0:
                continue
            self._records.append(rec)
            if max_images is not None and len(self._records) >= int(max_images):
                break
        if self.train and index.images and not self._records:
            raise AnnotationError(
                self.ann_file,
                "",
                "no image has an annotation (other than crowd) of its categories: nothing to train on",
                droppable=False,
            )
        self.image_ids: list[int] = [r["id"] for r in self._records]

    def _record(self, im: dict, anns: list) -> dict:
        """One image's targets: crowd boxes counted and left out, boxes clipped, degenerate ones skipped."""
        boxes, labels = [], []
        for ann in anns:
            if ann.get("iscrowd", 0):
                self.crowd_boxes += 1
                continue
            boxes.append(ann["bbox"])
            labels.append(self.cat_to_label[int(ann["category_id"])])
        w, h = int(im["width"]), int(im["height"])
        b = xywh_to_xyxy(torch.tensor(boxes, dtype=torch.float32).reshape(-1, 4))
        b = clip_boxes(b, w, h)
        keep = valid_box_mask(b, 1.0)
        self.skipped_boxes += int((~keep).sum())
        return {
            "id": int(im["id"]),
            "file_name": im["file_name"],
            "width": w,
            "height": h,
            "boxes": b[keep],
            "labels": torch.tensor(labels, dtype=torch.int64)[keep],
            "objects_scored": len(labels),
        }  # pycocotools scores the tiny boxes too

    @property
    def dropped_annotations(self) -> dict[str, int]:
        """Bad annotation records dropped (``bad_annotations="drop"``), by reason."""
        return self._drops.as_dict()

    @property
    def unknown_objects(self):
        """Records dropped for a category outside the file's categories, by category id."""
        return self._drops.unknown_names

    @property
    def objects_scored(self) -> int:
        """Annotations pycocotools scores (not crowd) on the images kept."""
        return sum(r["objects_scored"] for r in self._records)

    # ------------------------------------------------------------------
    @property
    def coco(self):
        """pycocotools ``COCO`` of the whole annotation file (built on first use, silently)."""
        if self._coco is None:
            self._coco = silent_coco(self._gt)
        return self._coco

    @property
    def num_classes(self) -> int:
        """Object classes K (a detector needs ``K + 1`` outputs with the background)."""
        return len(self.class_names)

    def __len__(self) -> int:
        return len(self._records)

    def load(self, index: int, flip: bool = False):
        rec = self._records[index]
        path, size = self.image_dir / rec["file_name"], (rec["width"], rec["height"])
        image = self._pixels.read(path, size)  # the frame the JSON's size names (an EXIF rotation may be applied)
        if (image.shape[-1], image.shape[-2]) != size:  # the boxes were clipped to the JSON's size
            raise size_mismatch(
                self.ann_file, f"image {rec['id']} width, height", size, path, (image.shape[-1], image.shape[-2])
            )
        boxes = rec["boxes"].clone()
        if flip:
            image, boxes = hflip(image, boxes)
        return image, {"boxes": boxes, "labels": rec["labels"].clone(), "image_id": rec["id"]}

    def __repr__(self) -> str:
        return (
            f"CocoDetection({self.image_dir}, {len(self)} images, {self.num_classes} classes, "
            f"train={self.train}, hflip={self.hflip})"
        )


class FakeCocoDetection(_SeededFlip, Dataset):
    """Random images with random valid boxes, generated per index from the seed; nothing on disk.

    Exposes the same surface as ``CocoDetection`` (``coco``, ``label_to_cat``,
    ``class_names``, ``load``), so training *and* evaluation code paths run.
    """

    supports_aug_seed = True

    def __init__(
        self, num_images: int, image_size: int, num_classes: int, seed: int, *, train: bool = True, max_boxes: int = 5
    ) -> None:
        self.num_images, self.image_size, self.seed = int(num_images), int(image_size), int(seed)
        self.train, self.hflip, self.max_boxes = bool(train), bool(train), int(max_boxes)
        self.label_to_cat = {k: k for k in range(1, num_classes + 1)}
        self.cat_to_label = dict(self.label_to_cat)
        self.class_names = [f"class{k}" for k in range(1, num_classes + 1)]
        self.skipped_boxes = 0
        self.image_ids = list(range(1, self.num_images + 1))
        self._coco = None

    @property
    def num_classes(self) -> int:
        return len(self.class_names)

    def __len__(self) -> int:
        return self.num_images

    def _target(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        g = torch.Generator().manual_seed(self.seed * 1_000_003 + index)
        s = self.image_size
        n = int(torch.randint(1, self.max_boxes + 1, (), generator=g))
        wh = torch.empty(n, 2).uniform_(0.1, 0.6, generator=g) * s
        xy = torch.rand(n, 2, generator=g) * (s - wh)
        boxes = torch.cat([xy, xy + wh], dim=1).floor()
        labels = torch.randint(1, self.num_classes + 1, (n,), generator=g)
        return boxes, labels

    def load(self, index: int, flip: bool = False):
        if not 0 <= index < self.num_images:
            raise IndexError(index)
        boxes, labels = self._target(index)
        g = torch.Generator().manual_seed(self.seed * 1_000_003 + index + 7)
        image = torch.rand(3, self.image_size, self.image_size, generator=g)
        if flip:
            image, boxes = hflip(image, boxes)
        return image, {"boxes": boxes, "labels": labels, "image_id": index + 1}

    @property
    def coco(self):
        if self._coco is None:
            anns = []
            for i in range(self.num_images):
                boxes, labels = self._target(i)
                for b, lab in zip(boxes.tolist(), labels.tolist()):
                    w, h = b[2] - b[0], b[3] - b[1]
                    anns.append(
                        {
                            "id": len(anns) + 1,
                            "image_id": i + 1,
                            "category_id": lab,
                            "bbox": [b[0], b[1], w, h],
                            "area": w * h,
                            "iscrowd": 0,
                        }
                    )
            self._coco = silent_coco(
                {
                    "images": [
                        {"id": i, "file_name": f"{i:06d}.png", "width": self.image_size, "height": self.image_size}
                        for i in self.image_ids
                    ],
                    "annotations": anns,
                    "categories": [{"id": k, "name": n} for k, n in zip(self.label_to_cat.values(), self.class_names)],
                }
            )
        return self._coco


def fake_coco(
    num_images: int, image_size: int, num_classes: int, seed: int, *, train: bool = True
) -> FakeCocoDetection:
    """Random tensors with random valid boxes (``--fake_data``): no disk, deterministic by seed."""
    return FakeCocoDetection(num_images, image_size, num_classes, seed, train=train)
