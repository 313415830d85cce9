"""Pascal VOC (and any data set in its format) for the detectors.

Layout (the VOCdevkit tarballs, or any folder in the same format; defined once, for this
loader, ``lsbench validate`` and the trial-id fingerprint, in
:mod:`lossscale_bench.dataset_files.voc_layout`)::

    <year dir>/Annotations/<id>.xml          objects: name, difficult, bndbox
    <year dir>/ImageSets/Main/<split>.txt    one image id per line
    <year dir>/JPEGImages/<id>.jpg

``voc0712`` trains on VOC2007 + VOC2012 ``trainval`` and evaluates on VOC2007
``test`` (the SSD papers' and chainercv's protocol); its ``root`` is the
``VOCdevkit`` folder or the folder that holds it (``lsbench data voc --root
DIR`` extracts to ``DIR/VOCdevkit``). ``voc`` is any one VOC-format folder
with the class list given by the study; a split may join several lists with
``+`` (``train+val``).

Targets follow ``CocoDetection``: ``boxes`` float32 ``[N, 4]`` xyxy,
``labels`` int64 ``1..K`` (``class_names[label - 1]``), plus ``difficult``
bool ``[N]`` and ``image_id`` (the sample's index). The devkit's boxes are
1-based inclusive pixel indices; they become continuous coordinates
``(xmin - 1, ymin - 1, xmax, ymax)`` (a box of one pixel has width 1), the
convention ``evaluation.voc`` scores without any ``+1``.

As in chainercv, training splits drop *difficult* objects (and then images
left without objects) and evaluation splits keep them, flagged. Each XML is
read by :func:`lossscale_bench.dataset_files.voc_xml.parse_voc`, whose rules
(an unknown class or an impossible box is an error, or dropped and counted)
``lsbench validate`` applies before any trial.
"""

from __future__ import annotations

import os
import xml.etree.ElementTree as ET
from collections import Counter
from collections.abc import Callable, Sequence
from pathlib import Path

import torch
from PIL import Image
from torch.utils.data import Dataset

from ..core.registry import VOC_CLASSES
from ..dataset_files.annotations import Drops, size_mismatch
from ..dataset_files.voc_layout import (
    annotation_file,
    image_candidates,
    required_paths,
    side_ids,
    split_list,
    split_names,
    voc_sources,
)
from ..dataset_files.voc_xml import parse_voc
from .coco import DataNotFound, require_ground_truth
from .transforms import PixelCache, flip_decision, hflip

__all__ = ["VOCDetection", "voc_required_paths", "build_voc_datasets", "make_tiny_voc", "FETCH_VOC"]

FETCH_VOC = "lsbench data voc --root {root}"


def voc_required_paths(cfg: dict) -> list[Path]:
    """Every folder and split list a ``voc``/``voc0712`` study needs, in the order worth reporting."""
    return [p for p, _ in required_paths(cfg)]


class VOCDetection(Dataset):
    """Images and boxes of one or more ``(year dir, split)`` sources, in list order.

    ``train=True``: difficult objects are dropped unless ``use_difficult``,
    then images without objects; ``augment`` (``(image, target, seed) ->
    (image, target)``, e.g. :class:`~.augment.SSDAugment`) is applied, or
    else a horizontal flip with p 0.5 when ``hflip``. ``train=False`` keeps
    everything, flags difficult objects and never transforms. ``max_images``
    keeps the first images.

    Bad annotations (a class outside ``classes``, an impossible, non-finite or
    wholly-outside box: :mod:`lossscale_bench.dataset_files.annotations`) raise an
    ``AnnotationError`` naming file, object and value, or with
    ``bad_annotations="drop"`` are dropped and counted: ``dropped_annotations``
    by reason, ``unknown_objects`` by class name, ``skipped_boxes`` (the boxes
    dropped), the attributes the trial's run tags report. An XML ``<size>`` that is not its image's
    (in the stored or, for a 90/270 degree EXIF rotation, the upright frame: ``transforms.read_image``)
    is an ``AnnotationError`` when the image is loaded: its boxes were drawn on other pixels.
    """

    supports_aug_seed = True

    def __init__(
        self,
        sources: Sequence[tuple],
        classes: Sequence[str],
        *,
        train: bool,
        use_difficult: bool | None = None,
        augment: Callable | None = None,
        hflip: bool = True,
        max_images=None,
        bad_annotations: str = "error",
        max_side: int | None = None,
    ) -> None:
        self.class_names = [str(c) for c in classes]
        #: photos shrunk to this longer side when read (``dataset.train_max_side``), boxes alike
        self.max_side = int(max_side) if max_side else None
        if not self.class_names:
            raise ValueError("VOCDetection: the class list is empty")
        self._label = {c: i for i, c in enumerate(self.class_names, start=1)}
        self.train = bool(train)
        self.use_difficult = (not self.train) if use_difficult is None else bool(use_difficult)
        self.augment = augment if self.train else None
        self.hflip = bool(hflip) and self.train and self.augment is None
        self.sources = [(Path(d).expanduser(), str(s)) for d, s in sources]
        self._drops = Drops(bad_annotations)
        self.dropped_difficult = 0
        self._records: list[dict] = []
        for year_dir, split in self.sources:
            names = split_names(split)
            if not names:
                raise ValueError(f"empty split name {split!r}")
            for name in names:
                if not split_list(year_dir, name).is_file():
                    raise DataNotFound(f"VOC split list not found: {split_list(year_dir, name)}")
        for year_dir, _, img_id in side_ids(self.sources):  # an image listed twice: AnnotationError
            if max_images is not None and len(self._records) >= int(max_images):
                break
            rec = self._parse(year_dir, Path(annotation_file(year_dir, img_id)), img_id)
            if not (self.train and len(rec["labels"]) == 0):
                self._records.append(rec)
        self.image_ids = list(range(len(self._records)))
        self._pixels = PixelCache()  # decoded once per process while the budget lasts: transforms.PixelCache

    @property
    def dropped_annotations(self) -> dict[str, int]:
        """Bad annotations dropped (``bad_annotations="drop"``), by reason."""
        return self._drops.as_dict()

    @property
    def unknown_objects(self) -> Counter:
        """Objects dropped for a class outside the class list, by name."""
        return self._drops.unknown_names

    @property
    def objects_scored(self) -> int:
        """Objects a VOC metric counts (not difficult), over the images kept."""
        return sum(int((~r["difficult"]).sum()) for r in self._records)

    @property
    def skipped_boxes(self) -> int:
        """Objects dropped for their box (impossible, non-finite, outside the image, missing)."""
        return self._drops.total - sum(self._drops.unknown_names.values())

    # ------------------------------------------------------------------
    def _parse(self, year_dir: Path, xml_path: Path, img_id: str) -> dict:
        if not xml_path.is_file():
            raise DataNotFound(f"VOC annotation not found: {xml_path}")
        ann = parse_voc(xml_path, self._label, self._drops)
        objects = ann["objects"]
        if not self.use_difficult:
            self.dropped_difficult += sum(1 for *_, diff in objects if diff)
            objects = [o for o in objects if not o[2]]
        return {
            "dir": year_dir,
            "id": img_id,
            "file_name": ann["file_name"],
            "width": ann["width"],
            "height": ann["height"],
            "boxes": torch.tensor([o[1] for o in objects], dtype=torch.float32).reshape(-1, 4),
            "labels": torch.tensor([o[0] for o in objects], dtype=torch.int64),
            "difficult": torch.tensor([o[2] for o in objects], dtype=torch.bool),
        }

    def _image_path(self, rec: dict) -> Path:
        cands = list(image_candidates(rec["dir"], rec["id"], rec.get("file_name")))
        for p in cands:
            if os.path.isfile(p):
                return Path(p)
        raise DataNotFound(f"VOC image not found: {cands[0]}")

    # ------------------------------------------------------------------
    @property
    def num_classes(self) -> int:
        return len(self.class_names)

    @property
    def ids(self) -> list[str]:
        return [r["id"] for r in self._records]

    def __len__(self) -> int:
        return len(self._records)

    def load(self, index: int, flip: bool = False):
        """Sample ``index`` without augmentation (optionally mirrored)."""
        rec = self._records[index]
        path = self._image_path(rec)
        size = (rec["width"], rec["height"]) if rec["width"] > 0 and rec["height"] > 0 else None
        # the frame the XML's size names (an EXIF rotation may be applied)
        if self.max_side:
            image, (w, h) = self._pixels.read_scaled(path, size, self.max_side)
        else:
            image = self._pixels.read(path, size)
            h, w = image.shape[-2:]
        boxes = rec["boxes"].clone()
        if size is None:  # no <size>: the boxes were not clipped while parsing; the image decides
            boxes[:, 0::2] = boxes[:, 0::2].clamp(0, w)
            boxes[:, 1::2] = boxes[:, 1::2].clamp(0, h)
        elif size != (w, h):
            raise size_mismatch(annotation_file(rec["dir"], rec["id"]), "size", size, path, (w, h))
        if (image.shape[-1], image.shape[-2]) != (w, h):  # shrunk: the boxes follow the pixels
            sx, sy = image.shape[-1] / w, image.shape[-2] / h
            boxes = boxes * torch.tensor([sx, sy, sx, sy], dtype=boxes.dtype)
        target = {
            "boxes": boxes,
            "labels": rec["labels"].clone(),
            "difficult": rec["difficult"].clone(),
            "image_id": index,
        }
        if flip:
            image, target["boxes"] = hflip(image, target["boxes"])
        return image, target

    def __getitem__(self, key):
        if isinstance(key, tuple):
            index, aug_seed = int(key[0]), int(key[1])
        else:
            index, aug_seed = int(key), None
        if self.augment is not None:
            if aug_seed is None:
                aug_seed = int(torch.randint(0, 2**62, ()))
            image, target = self.load(index)
            return self.augment(image, target, aug_seed)
        flip = False
        if self.hflip:
            flip = flip_decision(aug_seed) if aug_seed is not None else bool(torch.rand(()) < 0.5)
        return self.load(index, flip)

    def __repr__(self) -> str:
        src = ", ".join(f"{d}:{s}" for d, s in self.sources)
        return f"VOCDetection({src}, {len(self)} images, {self.num_classes} classes, train={self.train})"


def build_voc_datasets(cfg: dict, *, image_size: int | None = None, max_val_images=None):
    """``(train, val, class_names)`` for a ``voc`` / ``voc0712`` dataset section.

    Optional keys beyond the schema (for tests and scripts): ``augment``
    (default true: chainercv's SSD augmentation on the training split),
    ``hflip`` (true), ``max_train_images``, ``max_val_images``.
    """
    from .augment import SSDAugment

    name = cfg.get("name")
    classes = list(cfg.get("classes") or (VOC_CLASSES if name == "voc0712" else ()))
    if not classes:
        raise ValueError(f"dataset {name}: 'classes' must list the object classes")
    missing = [p for p in voc_required_paths(cfg) if not p.exists()]
    if missing:
        raise DataNotFound(
            f"dataset {name}: not found: {missing[0]}"
            + (
                f" (fetch it with: {FETCH_VOC.format(root=cfg['root'])})"
                if name == "voc0712"
                else " (a VOC-format folder needs Annotations/, JPEGImages/ and ImageSets/Main/<split>.txt)"
            )
        )
    train_src, val_src = voc_sources(cfg)
    hflip_on = bool(cfg.get("hflip", True))
    augment = SSDAugment(flip=hflip_on, out_size=image_size) if cfg.get("augment", True) else None
    max_val = max_val_images if max_val_images is not None else cfg.get("max_val_images")
    policy = cfg.get("bad_annotations", "error")
    train = VOCDetection(
        train_src,
        classes,
        train=True,
        augment=augment,
        hflip=hflip_on,
        max_images=cfg.get("max_train_images"),
        bad_annotations=policy,
        max_side=cfg.get("train_max_side"),
    )
    if len(train) == 0:
        seen = ", ".join(f"{k!r}" for k, _ in train.unknown_objects.most_common(5))
        raise DataNotFound(
            f"dataset {name}: no objects of the classes {classes[:5]}{'...' if len(classes) > 5 else ''} "
            f"in {', '.join(f'{d}/{s}' for d, s in train_src)}" + (f"; names found: {seen}" if seen else "")
        )
    val = VOCDetection(val_src, classes, train=False, max_images=max_val, bad_annotations=policy)
    require_ground_truth(val, " + ".join(str(split_list(d, n)) for d, s in val_src for n in split_names(s)))
    return train, val, list(classes)


# --------------------------------------------------------------------------- tiny VOC-format data
def make_tiny_voc(
    year_dir,
    splits: dict[str, int] | None = None,
    *,
    classes: Sequence[str] = ("square", "disc"),
    size: tuple[int, int] = (96, 128),
    seed: int = 0,
    difficult_every: int = 5,
) -> dict[str, list[str]]:
    """Write a small VOC-format data set of coloured shapes into ``year_dir``: JPEGs, XML
    annotations (every ``difficult_every``-th object flagged difficult) and split lists.

    ``splits`` maps split name to image count (default ``{"trainval": 8, "test": 4}``);
    ``train``/``val`` lists are written too when ``trainval`` is given. Class ``k``
    is drawn as a filled shape of a fixed colour (squares for even ``k``, discs for
    odd). Deterministic in ``seed``. Returns ``{split: [ids]}``. For tests and demos.
    """
    import numpy as np

    splits = dict(splits or {"trainval": 8, "test": 4})
    year_dir = Path(year_dir)
    for sub in ("Annotations", "JPEGImages", "ImageSets/Main"):
        (year_dir / sub).mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    palette = [(220, 40, 40), (40, 200, 60), (50, 80, 230), (230, 200, 40), (200, 60, 220), (40, 200, 220)]
    h, w = size
    out: dict[str, list[str]] = {}
    counter = 0
    n_obj = 0
    for split, count in splits.items():
        ids = []
        for _ in range(int(count)):
            img_id = f"{seed:02d}{counter:05d}"
            counter += 1
            ids.append(img_id)
            img = (rng.uniform(90, 140, size=(h, w, 3)) + rng.normal(0, 8, size=(h, w, 3))).clip(0, 255)
            yy, xx = np.mgrid[0:h, 0:w]
            objs = []
            for _ in range(int(rng.integers(1, 4))):
                k = int(rng.integers(len(classes)))
                bw, bh = int(rng.integers(w // 6, w // 2)), int(rng.integers(h // 6, h // 2))
                x0, y0 = int(rng.integers(0, w - bw)), int(rng.integers(0, h - bh))
                colour = np.array(palette[k % len(palette)], dtype=float)
                if k % 2 == 0:
                    mask = (xx >= x0) & (xx < x0 + bw) & (yy >= y0) & (yy < y0 + bh)
                else:
                    cx, cy = x0 + bw / 2, y0 + bh / 2
                    mask = ((xx + 0.5 - cx) / (bw / 2)) ** 2 + ((yy + 0.5 - cy) / (bh / 2)) ** 2 <= 1
                img[mask] = colour
                n_obj += 1
                # VOC boxes: 1-based inclusive pixel indices
                objs.append((classes[k], x0 + 1, y0 + 1, x0 + bw, y0 + bh, n_obj % difficult_every == 0))
            Image.fromarray(img.astype(np.uint8)).save(year_dir / "JPEGImages" / f"{img_id}.jpg", quality=92)
            root = ET.Element("annotation")
            ET.SubElement(root, "folder").text = year_dir.name
            ET.SubElement(root, "filename").text = f"{img_id}.jpg"
            sz = ET.SubElement(root, "size")
            for tag, v in (("width", w), ("height", h), ("depth", 3)):
                ET.SubElement(sz, tag).text = str(v)
            for name, x1, y1, x2, y2, diff in objs:
                o = ET.SubElement(root, "object")
                ET.SubElement(o, "name").text = name
                ET.SubElement(o, "pose").text = "Unspecified"
                ET.SubElement(o, "truncated").text = "0"
                ET.SubElement(o, "difficult").text = "1" if diff else "0"
                bb = ET.SubElement(o, "bndbox")
                for tag, v in (("xmin", x1), ("ymin", y1), ("xmax", x2), ("ymax", y2)):
                    ET.SubElement(bb, tag).text = str(v)
            ET.ElementTree(root).write(year_dir / "Annotations" / f"{img_id}.xml")
        out[split] = ids
        (year_dir / "ImageSets" / "Main" / f"{split}.txt").write_text("".join(i + "\n" for i in ids))
    if "trainval" in out and "train" not in splits:
        ids = out["trainval"]
        half = max(1, len(ids) // 2)
        (year_dir / "ImageSets" / "Main" / "train.txt").write_text("".join(i + "\n" for i in ids[:half]))
        (year_dir / "ImageSets" / "Main" / "val.txt").write_text("".join(i + "\n" for i in ids[half:]))
    return out
