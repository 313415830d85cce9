"""Is the study's data usable? Checked by ``lsbench validate`` and ``run`` before any trial starts.

Why before: an empty evaluation split, or one without objects, trained for hours and then
*finished* with mAP 0.00 (exit 0, no warning in the report); a class name in other case
(``Square``) silently removed ground truth. Both are visible in the files, so they are one line
and exit 2 now, not a result. The rules are the loaders' own (:mod:`..dataset_files.voc_xml`,
:mod:`..dataset_files.coco_json`), so what passes here loads in the trial.

What is read: every annotation XML of a VOC study's training and evaluation splits (VOC07+12: 21.5k
small files, 1.3 s on 2 busy cores), and whether each image they list is there and opens (its header,
as Pillow reads it: a missing or unreadable JPEG failed the trial after training had started), and a
COCO study's evaluation JSON
(``instances_val2017.json``: 25 MB). Not the COCO training JSON (0.45 GB, half a minute to
parse): the loader applies the same rules to it and a trial fails with the line naming the
record. Synthetic and ``fake_data`` sets are generated, never bad.

"No objects" means nothing a metric could count: for VOC no object that is not ``difficult``, for
COCO no annotation that is not crowd, among the images evaluated (the first ``eval.max_images``).
"""

from __future__ import annotations

import os
from pathlib import Path

from ..dataset_files.annotations import DROP_HINT, AnnotationError, Drops
from ..dataset_files.coco_json import index_coco, load_coco_json
from ..dataset_files.voc_layout import annotation_file, image_candidates, side_ids, split_list, split_names, voc_sources
from ..dataset_files.voc_xml import parse_voc
from .errors import StudyError

__all__ = ["data_problems"]


def data_problems(study) -> list[StudyError]:
    """At most one :class:`StudyError` saying why the study's data cannot give a real result; empty when
    it can (or when the data is generated). Assumes :func:`.paths.path_problems` found every path."""
    ds = study.dataset
    cfg = ds.model_dump()
    try:
        if ds.name in ("voc", "voc0712"):
            _check_voc(cfg, study.eval.max_images, study.source)
        elif ds.name == "coco2017" and not ds.fake_data:
            _check_coco(cfg, study.eval.max_images, study.source)
    except StudyError as exc:
        return [exc]
    except AnnotationError as exc:  # a file no option can drop anything from
        return [StudyError(study.source, "dataset", str(exc))]
    return []


def _bad_annotations(drops: Drops, policy: str, src: str) -> None:
    """The first bad annotation, and how many more, when the study does not drop them."""
    if policy == "drop" or drops.first is None:
        return
    more = drops.total - 1
    raise StudyError(
        src,
        "dataset",
        drops.first.bare
        + (f" (and {more} more bad annotation{'s' if more > 1 else ''})" if more else "")
        + f"; fix the file, or {DROP_HINT}",
    )


def _voc_side(sources, labels: dict, drops: Drops, max_images, src: str, field: str) -> tuple[int, int, str]:
    """``(images, objects that are not difficult among the first max_images, lists read)`` of one side."""
    images = objects = 0
    lists = [str(split_list(year_dir, name)) for year_dir, split in sources for name in split_names(split)]
    try:
        for year_dir, list_file, img_id in side_ids(sources):
            xml = annotation_file(year_dir, img_id)
            if not os.path.isfile(xml):
                raise StudyError(src, field, f"{list_file} lists {img_id!r}, but {xml} is not there")
            rec = parse_voc(xml, labels, drops)
            image = next((p for p in image_candidates(year_dir, img_id, rec["file_name"]) if os.path.isfile(p)), None)
            if image is None:
                raise StudyError(
                    src,
                    field,
                    f"{list_file} line {_line_of(list_file, img_id)} lists "
                    f"{img_id!r}, but its image is not there: "
                    f"{next(image_candidates(year_dir, img_id))}",
                )
            if (why := _unopenable(image)) is not None:
                raise StudyError(
                    src,
                    field,
                    f"{list_file} line {_line_of(list_file, img_id)} lists {img_id!r}, but its image "
                    f"cannot be opened: {image} ({why})",
                )
            images += 1
            if max_images is None or images <= max_images:
                objects += sum(1 for _, _, difficult in rec["objects"] if not difficult)
    except AnnotationError as exc:
        if exc.reason != "duplicate_id":
            raise
        raise StudyError(src, field, str(exc)) from None
    return images, objects, " + ".join(lists)


def _unopenable(path: str) -> str | None:
    """Why the image at ``path`` cannot be opened (its header read as the loader reads it: format and size),
    or None. The pixels are not decoded here (a truncated file is decoded by the loader, with a note)."""
    from PIL import Image, UnidentifiedImageError

    try:
        with Image.open(path) as im:
            if im.width <= 0 or im.height <= 0:
                return f"its size is {im.width}x{im.height}"
    except (UnidentifiedImageError, OSError, SyntaxError, ValueError) as exc:
        return " ".join(str(exc).split())[:160] or type(exc).__name__
    return None


def _line_of(list_file, img_id: str) -> int:
    """The line of ``list_file`` that names ``img_id`` first (for the error; read again only then)."""
    with open(list_file, encoding="utf-8-sig", errors="surrogateescape") as f:
        return next((n for n, line in enumerate(f, 1) if line.split()[:1] == [img_id]), 0)


def _check_voc(cfg: dict, max_images, src: str) -> None:
    labels = {str(c): i for i, c in enumerate(cfg.get("classes") or (), start=1)}
    train, val = voc_sources(cfg)
    drops = Drops("drop")  # collect: the first problem and the count make the message
    for side, sources, field, limit in (
        ("training", train, "dataset.train_split", None),
        ("evaluation", val, "dataset.val_split", max_images),
    ):
        images, objects, lists = _voc_side(sources, labels, drops, limit, src, field)
        if images == 0:
            raise StudyError(
                src,
                field,
                f"{lists} lists no images: nothing to "
                f"{'train' if side == 'training' else 'score (the trial would finish with mAP 0)'}",
            )
        if objects == 0:
            _bad_annotations(drops, cfg.get("bad_annotations", "error"), src)
            where = f"the first {limit} images" if limit is not None and limit < images else f"the {images} images"
            raise StudyError(
                src,
                field,
                f"no objects of dataset.classes that are not difficult in {where} of "
                f"{lists}: nothing to {'train on' if side == 'training' else 'score (mAP would be 0)'}",
            )
    _bad_annotations(drops, cfg.get("bad_annotations", "error"), src)


def _check_coco(cfg: dict, max_images, src: str) -> None:
    ann_file = Path(str(cfg["root"])).expanduser() / "annotations" / "instances_val2017.json"
    drops = Drops("drop")
    index = index_coco(load_coco_json(ann_file), ann_file, drops, evaluation=True)
    _bad_annotations(drops, cfg.get("bad_annotations", "error"), src)
    ids = sorted(index.images)[:max_images] if max_images is not None else sorted(index.images)
    objects = sum(1 for i in ids for a in index.per_image[i] if not a.get("iscrowd", 0))
    if objects == 0:
        where = f"the first {len(ids)} images" if len(ids) < len(index.images) else f"its {len(ids)} images"
        raise StudyError(
            src,
            "dataset",
            f"{ann_file}: no annotations (other than crowd) of its categories on "
            f"{where}: nothing to score (mAP would be 0)",
        )
