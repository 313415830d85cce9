"""A COCO annotation JSON, read by the rules of :mod:`.annotations`: what ``data.coco`` trains and
scores on, and what ``lsbench validate`` checks in the evaluation file before a trial starts.

The file must be a JSON object with a non-empty ``categories`` list, an ``images`` list
(non-empty in the evaluation file) and an ``annotations`` list; an image record needs an
integer ``id`` (unique), a ``file_name`` and a positive ``width`` and ``height``; a category an
integer ``id`` (unique) and a ``name``. Anything else about the file is an error no option
drops (it names the file and the record: ``images[3]: no 'file_name'``), because a reader that
guesses gives "0 samples" or a traceback (``KeyError: 'bbox'``, as it did).

An annotation record (``annotations[i] (id N, image M)``) is bad, and goes to :class:`~.annotations.Drops`,
when its ``image_id`` is not an image of the file, its ``category_id`` not a category, its
``bbox`` not four finite numbers ``[x, y, w, h]`` with ``w, h >= 0``, its box (of positive size)
wholly outside its image, or, in the evaluation file (which pycocotools scores), its ``id`` is
missing or repeated (pycocotools would keep one of two records with one id) or its ``area`` is
not a number. A record without ``iscrowd`` is not crowd, as the loader has always read it; the
index pycocotools scores gets ``iscrowd: 0`` (and ``area: w*h`` where ``area`` is absent in a
training file) so that it reads the record as the loader did.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

from .annotations import AnnotationError, Drops, finite, outside

__all__ = ["CocoIndex", "load_coco_json", "index_coco"]


@dataclass
class CocoIndex:
    """The usable part of a COCO file: categories by id, images by id, kept annotations."""

    categories: list[tuple[int, str]]  # (id, name), ascending id
    images: dict[int, dict]  # id -> image record
    per_image: dict[int, list] = field(default_factory=dict)  # image id -> kept annotations, file order
    kept: list = field(default_factory=list)  # every kept annotation, as pycocotools reads it


def _int(v) -> int | None:
    return v if isinstance(v, int) and not isinstance(v, bool) else None


def _num(v) -> float | None:
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else None


def load_coco_json(path) -> dict:
    """The file's JSON object; not JSON, not an object or unreadable is an error naming the file."""
    try:
        with open(path, "rb") as f:
            data = json.load(f)
    except json.JSONDecodeError as exc:
        raise AnnotationError(
            path, f"line {exc.lineno}, column {exc.colno}", f"not valid JSON: {exc.msg}", droppable=False
        ) from None
    except UnicodeDecodeError:
        raise AnnotationError(path, "", "not UTF-8 text, so not a COCO JSON file", droppable=False) from None
    except OSError as exc:
        raise AnnotationError(path, "", f"cannot be read: {exc.strerror or exc}", droppable=False) from None
    if not isinstance(data, dict):
        raise AnnotationError(
            path,
            "",
            f"holds a JSON {type(data).__name__}, not an object with 'images', 'annotations' and 'categories'",
            droppable=False,
        )
    return data


def _list(data: dict, key: str, file, *, empty_ok: bool) -> list:
    if key not in data:
        raise AnnotationError(
            file, "", f"no {key!r} list (a COCO file has 'images', 'annotations' and 'categories')", droppable=False
        )
    value = data[key]
    if not isinstance(value, list):
        raise AnnotationError(file, key, f"is a JSON {type(value).__name__}, not a list", droppable=False)
    if not value and not empty_ok:
        why = "nothing to score (mAP would be 0)" if key == "images" else "no class to train or score"
        raise AnnotationError(file, key, f"is empty: {why}", droppable=False)
    return value


def _categories(data: dict, file) -> list[tuple[int, str]]:
    seen: dict[int, int] = {}
    for i, c in enumerate(_list(data, "categories", file, empty_ok=False)):
        cid = _int(c.get("id")) if isinstance(c, dict) else None
        if cid is None or not isinstance(c.get("name"), (str, int, float)):
            raise AnnotationError(
                file,
                f"categories[{i}]",
                f"{_short(c)} is not a category with an integer 'id' and a 'name'",
                droppable=False,
            )
        if cid in seen:
            raise AnnotationError(
                file, f"categories[{i}]", f"id {cid} is also categories[{seen[cid]}]", droppable=False
            )
        seen[cid] = i
    return sorted((int(c["id"]), str(c["name"])) for c in data["categories"])


def _images(data: dict, file, evaluation: bool) -> dict[int, dict]:
    out: dict[int, dict] = {}
    where: dict[int, int] = {}
    for i, im in enumerate(_list(data, "images", file, empty_ok=not evaluation)):
        rec = f"images[{i}]"
        if not isinstance(im, dict):
            raise AnnotationError(file, rec, f"{_short(im)} is not an image record", droppable=False)
        iid = _int(im.get("id"))
        if iid is None:
            raise AnnotationError(file, rec, f"'id' {_short(im.get('id'))} is not an integer", droppable=False)
        if iid in out:
            raise AnnotationError(file, rec, f"id {iid} is also images[{where[iid]}]", droppable=False)
        if not isinstance(im.get("file_name"), str) or not im["file_name"]:
            raise AnnotationError(file, f"{rec} (id {iid})", "no 'file_name'", droppable=False)
        for key in ("width", "height"):
            v = _num(im.get(key))
            if v is None or not finite([v]) or v <= 0:
                raise AnnotationError(
                    file, f"{rec} (id {iid})", f"{key!r} {_short(im.get(key))} is not a size in pixels", droppable=False
                )
        out[iid], where[iid] = im, i
    return out


def _short(v) -> str:
    s = json.dumps(v, default=str) if not isinstance(v, str) else repr(v)
    return s if len(s) <= 60 else s[:57] + "..."


def _bbox_problem(ann: dict, image: dict) -> tuple[str, str] | None:
    """``(reason, problem)`` of the record's bbox, or None when it is usable."""
    b = ann.get("bbox")
    if "bbox" not in ann:
        return "bad_box", "no 'bbox'"
    vals = [_num(v) for v in b] if isinstance(b, list) and len(b) == 4 else None
    if vals is None or any(v is None for v in vals):
        return "bad_box", f"bbox {_short(b)} is not four numbers [x, y, w, h]"
    if not finite(vals):
        return "non_finite", f"bbox {_short(b)} has a non-finite number"
    x, y, w, h = vals
    if w < 0 or h < 0:
        return "bad_box", f"bbox {_short(b)} has a negative {'width' if w < 0 else 'height'}"
    if w > 0 and h > 0 and outside(x, y, x + w, y + h, float(image["width"]), float(image["height"])):
        return "outside_image", f"bbox {_short(b)} lies outside the {image['width']}x{image['height']} image"
    return None


def _annotation_problem(ann, images: dict, cats: dict, ids: dict, i: int, evaluation: bool):
    """``(reason, problem)`` of one annotation record, or None when it is usable."""
    if not isinstance(ann, dict):
        return "bad_value", f"{_short(ann)} is not an annotation record"
    iid = ann.get("image_id")
    if _int(iid) is None or iid not in images:
        return "unknown_image", f"image_id {_short(iid)} is not an image of the file"
    cid = ann.get("category_id")
    if _int(cid) is None or cid not in cats:
        shown = ", ".join(str(c) for c in list(cats)[:8]) + (", ..." if len(cats) > 8 else "")
        return "unknown_class", f"category_id {_short(cid)} is not in categories (ids {shown})"
    if ann.get("iscrowd", 0) not in (0, 1):
        return "bad_value", f"iscrowd {_short(ann.get('iscrowd'))} is neither 0 nor 1"
    bad = _bbox_problem(ann, images[iid])
    if bad is not None or not evaluation:
        return bad
    aid = ann.get("id")
    if _int(aid) is None:
        return "bad_value", f"'id' {_short(aid)} is not an integer (pycocotools scores records by id)"
    if aid in ids:
        return "bad_value", f"id {aid} is also annotations[{ids[aid]}] (pycocotools would keep one of them)"
    area = _num(ann.get("area"))
    if area is None or not finite([area]) or area < 0:
        return "bad_value", f"'area' {_short(ann.get('area'))} is not a number >= 0"
    return None


def _record_ids(ann) -> str:
    """`` (id 17, image 42)``: the record's own id and its image's, where it has them."""
    if not isinstance(ann, dict):
        return ""
    ids = [f"{k} {_short(ann[key])}" for k, key in (("id", "id"), ("image", "image_id")) if key in ann]
    return f" ({', '.join(ids)})" if ids else ""


def _as_scored(ann: dict) -> dict:
    """The record as pycocotools should read it: the loader's defaults where keys are absent."""
    if "iscrowd" in ann and "area" in ann:
        return ann
    w, h = float(ann["bbox"][2]), float(ann["bbox"][3])
    return {"iscrowd": 0, "area": w * h, **ann}


def index_coco(data: dict, file, drops: Drops, *, evaluation: bool) -> CocoIndex:
    """Check ``data`` (from :func:`load_coco_json`) and index what is usable.

    ``evaluation``: the file pycocotools scores (stricter about ``id`` and ``area``).
    Bad annotation records go to ``drops`` (raised or counted there).
    """
    index = CocoIndex(categories=_categories(data, file), images=_images(data, file, evaluation))
    cats = {cid: name for cid, name in index.categories}
    index.per_image = {iid: [] for iid in index.images}
    ids: dict[int, int] = {}
    for i, ann in enumerate(_list(data, "annotations", file, empty_ok=True)):
        bad = _annotation_problem(ann, index.images, cats, ids, i, evaluation)
        if bad is not None:
            record = f"annotations[{i}]" + _record_ids(ann)
            drops.bad(
                AnnotationError(file, record, bad[1], reason=bad[0]),
                unknown_name=str(ann.get("category_id")) if bad[0] == "unknown_class" else None,
            )
            continue
        if evaluation:
            ids[ann["id"]] = i
        ann = _as_scored(ann)
        index.per_image[ann["image_id"]].append(ann)
        index.kept.append(ann)
    return index
