"""Where a VOC-format data set keeps its files: the one definition the loader, the path check and
the fingerprint share.

Layout (the VOCdevkit tarballs, or any folder in the same format)::

    <year dir>/Annotations/<id>.xml          objects: name, difficult, bndbox
    <year dir>/ImageSets/Main/<split>.txt    one image id per line (first word)
    <year dir>/JPEGImages/<id>.jpg           (or the XML's <filename>, or another extension)

``voc0712`` trains on VOC2007 + VOC2012 ``<train_split>`` and evaluates on
VOC2007 ``<val_split>``; its ``root`` is the ``VOCdevkit`` folder or the folder
holding it. ``voc`` is one VOC-format folder. A split may join several lists
with ``+`` (``train+val``).

Why here, in the schema layer: ``lsbench validate`` checks these paths and
:mod:`.fingerprint` hashes these files without torch, and ``data.voc`` (which
imports torch) reads them; three copies of the rules (as there were) could
drift apart, and then the trial id would cover other files than the trial
reads. Standard library only.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Iterator

__all__ = ["IMAGE_EXTS", "split_names", "resolve_devkit", "voc_sources", "split_list", "annotation_file",
           "image_candidates", "read_split_ids", "required_paths"]

#: the image file extensions looked for, in order (``<id>.jpg`` first, as the devkit has it)
IMAGE_EXTS = (".jpg", ".jpeg", ".png", ".JPG", ".JPEG", ".PNG", ".bmp")


def split_names(split) -> list[str]:
    """``"train+val"`` -> ``["train", "val"]`` (blank parts ignored)."""
    return [s.strip() for s in str(split).split("+") if s.strip()]


def resolve_devkit(root) -> Path:
    """The folder holding ``VOC2007``/``VOC2012``: ``root`` itself or ``root/VOCdevkit``."""
    root = Path(str(root)).expanduser()
    for cand in (root, root / "VOCdevkit"):
        if (cand / "VOC2007").is_dir() or (cand / "VOC2012").is_dir():
            return cand
    return root / "VOCdevkit" if (root / "VOCdevkit").is_dir() else root


def voc_sources(cfg: dict) -> tuple[list[tuple[Path, str]], list[tuple[Path, str]]]:
    """``(train, val)`` lists of ``(year dir, split)`` of a ``voc`` / ``voc0712`` dataset section."""
    root = Path(str(cfg["root"])).expanduser()
    train_split, val_split = cfg.get("train_split", "trainval"), cfg.get("val_split", "test")
    if cfg.get("name") == "voc0712":
        devkit = resolve_devkit(root)
        return ([(devkit / "VOC2007", train_split), (devkit / "VOC2012", train_split)],
                [(devkit / "VOC2007", val_split)])
    return [(root, train_split)], [(root, val_split)]


def split_list(year_dir, name: str) -> Path:
    """The list file of one split name (no ``+``)."""
    return Path(year_dir) / "ImageSets" / "Main" / f"{name}.txt"


def annotation_file(year_dir, img_id: str) -> str:
    """``<year dir>/Annotations/<id>.xml`` (a string: the fingerprint builds 21.5k of these, and
    ``os.path`` is ten times quicker at it than ``pathlib``)."""
    return os.path.join(year_dir, "Annotations", f"{img_id}.xml")


def image_candidates(year_dir, img_id: str, file_name: str | None = None) -> Iterator[str]:
    """Where the image of ``img_id`` may be, in the order the loader tries them (lazily: the first
    one usually exists)."""
    img_dir = os.path.join(year_dir, "JPEGImages")
    yield os.path.join(img_dir, f"{img_id}.jpg")
    if file_name:
        yield os.path.join(img_dir, file_name)
    for ext in IMAGE_EXTS[1:]:
        yield os.path.join(img_dir, f"{img_id}{ext}")


def read_split_ids(list_file) -> list[str]:
    """The image ids of a split list: the first word of each non-blank line. A byte-order mark
    (an editor's UTF-8 signature) is not part of the first id: it named no file and no error said so."""
    with open(list_file, encoding="utf-8-sig", errors="surrogateescape") as f:
        return [line.split()[0] for line in f if line.strip()]


def required_paths(cfg: dict) -> list[tuple[Path, str]]:
    """``(path, "dir" | "file")`` of every folder and split list a study reads, in the order worth
    reporting (training side first)."""
    train, val = voc_sources(cfg)
    out: list[tuple[Path, str]] = []
    for year_dir, split in train + val:
        needs = [(year_dir / "Annotations", "dir"), (year_dir / "JPEGImages", "dir")]
        needs += [(split_list(year_dir, name), "file") for name in split_names(split)]
        out += [n for n in needs if n not in out]
    return out


def exists(path, kind: str) -> bool:
    return os.path.isdir(path) if kind == "dir" else os.path.isfile(path)
