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
from collections.abc import Iterator
from pathlib import Path

from .annotations import AnnotationError

__all__ = [
    "IMAGE_EXTS",
    "split_names",
    "resolve_devkit",
    "voc_sources",
    "split_list",
    "annotation_file",
    "image_candidates",
    "read_split_ids",
    "split_id_lines",
    "side_ids",
    "required_paths",
]

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
        return (
            [(devkit / "VOC2007", train_split), (devkit / "VOC2012", train_split)],
            [(devkit / "VOC2007", val_split)],
        )
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


def split_id_lines(list_file) -> list[tuple[int, str]]:
    """``(line number, image id)`` of a split list: the first word of each non-blank line (a UTF-8 byte
    order mark at the start of the file is not part of the first id). A byte order mark further down
    (lists joined with ``cat``, one saved with a BOM) is an :class:`~.annotations.AnnotationError` naming
    its line: it is invisible, and the id it sticks to names no file."""
    with open(list_file, encoding="utf-8-sig", errors="surrogateescape") as f:
        out = [(n, line.split()[0]) for n, line in enumerate(f, start=1) if line.strip()]
    for n, img_id in out:
        if "\ufeff" in img_id:
            raise AnnotationError(
                list_file,
                f"line {n}",
                f"a byte order mark (U+FEFF, invisible) is inside the image id {img_id!r}, in the middle of the "
                "list (lists joined, one of them saved with a BOM?); remove it",
                droppable=False,
            )
    return out


def read_split_ids(list_file) -> list[str]:
    """The image ids of a split list: the first word of each non-blank line."""
    return [img_id for _, img_id in split_id_lines(list_file)]


def side_ids(sources) -> Iterator[tuple[Path, Path, str]]:
    """``(year dir, list file, image id)`` of every image one side of a study reads (its ``(year dir,
    split)`` sources, a split joining lists with ``+``), in list order.

    An image listed twice on one side, in one list or in two lists it joins, is refused with an
    :class:`~.annotations.AnnotationError` naming both lines: listed twice for evaluation, its ground
    truth would count twice in the mAP (a different number, silently); for training, it would be seen
    twice as often as the others.
    """
    seen: dict[tuple[str, str], tuple[Path, int]] = {}
    for year_dir, split in sources:
        for name in split_names(split):
            list_file = split_list(year_dir, name)
            for line, img_id in split_id_lines(list_file):
                key = (str(Path(year_dir)), img_id)
                if key in seen:
                    first_file, first_line = seen[key]
                    where = f"line {first_line}" if first_file == list_file else f"{first_file} line {first_line}"
                    raise AnnotationError(
                        list_file,
                        f"line {line}",
                        f"image id {img_id!r} is listed twice (first at {where}); list each image once",
                        reason="duplicate_id",
                        droppable=False,
                    )
                seen[key] = (list_file, line)
                yield Path(year_dir), list_file, img_id


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
