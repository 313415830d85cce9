"""Content fingerprints of what a trial reads: its data set's files and its backbone weights.

Why content, not path. A trial id must change whenever the trial's result
can (otherwise ``lsbench run`` skips it as "already finished" and the report
shows the old number), and must not change when nothing that matters did
(otherwise a study moved to another machine, or a data folder moved on the
same one, re-runs everything). A path does neither: the same path may hold
other data tomorrow (a VOC folder re-extracted with other split lists) and
the same data sits under other paths on other machines. So the trial id
(:func:`lossscale_bench.study.grid.trial_identity`) holds no paths, only these
fingerprints of what is under them.

What is fingerprinted is exactly what the loaders read (``data/voc.py``,
``data/__init__.py``; VOC's file rules are :mod:`.voc_layout`, shared with the
loader), cheaply:

* ``voc`` / ``voc0712``: for every (year folder, split) of the training and
  the evaluation side, the split list's sha256, and for each image id in it
  the sha256 of ``Annotations/<id>.xml`` (its *content*: a box edited from
  ``37`` to ``73`` keeps the file's size, and used to keep the trial id, so the
  old result was reused for other data) and the size of the image file.
  Images by size (and name), not content: VOC07+12's 16.5k JPEGs are 0.9 GB,
  seconds to hash at best and a minute from a cold disk, on every ``validate``
  and ``run``; a JPEG edited without changing its size is a far rarer event
  than an annotation fix. The XMLs cost 0.4 s for VOC07+12's 21.5k listed
  files with a warm page cache, as the sizes did, and 2.8 s cold (2 busy cores;
  ``benchmarks/fingerprint_speed.py``, ``docs/records/index.md``), which needs no
  cache: a cache keyed by (path, size, mtime) would still ``stat`` every file,
  save only the reads, and trust mtimes that ``cp -p`` and ``tar`` restore.
* ``coco2017``: the sha256 of both annotation JSONs (what every box comes
  from) and the names and sizes in ``train2017/`` and ``val2017/``.
* ``synthetic`` and ``coco2017`` with ``fake_data``: nothing; the data is
  generated from options that are already in the id.
* a data set named by import path, with a ``root``: every file under it by
  relative path and size, annotation-like files (``.xml``, ``.json``, ``.txt``,
  ``.csv``, ``.yaml``) by content; its code is covered by the plug-in's digest.
* backbone weights: the file's sha256.

A root or file that is not there gives ``missing`` (or ``incomplete:<hash>``
when only part is), which never equals a real fingerprint, so a dry run on a
machine without the data still lists the grid (with ids that differ from the
machine that has it); ``lsbench run`` refuses to start without the data.

sha256 of a large file (VGG weights: 0.5 GB; COCO's train annotations: 0.45 GB)
costs about a second, so file digests are cached in-process by (path, size,
mtime): expanding a grid of many trials hashes each file once.

Standard library only: this is the schema layer, which ``lsbench validate``
imports without torch.
"""

from __future__ import annotations

import hashlib
import json
import os
import stat
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from ..dataset_files.voc_layout import (
    annotation_file,
    image_candidates,
    read_split_ids,
    split_list,
    split_names,
    voc_sources,
)

__all__ = ["MISSING", "data_fingerprint", "weights_fingerprint", "file_sha256", "trial_fingerprint"]

#: the marker of a root or file that is not there; no real fingerprint has this form
MISSING = "missing"
_INCOMPLETE = "incomplete:"
_DIGEST_LEN = 16  # hex characters kept: 64 bits, plenty to tell data sets apart

# (realpath, size, mtime_ns) -> sha256 hex
_FILE_CACHE: dict[tuple[str, int, int], str] = {}


def file_sha256(path) -> str | None:
    """The file's sha256 (hex), or None when it is not a readable regular file; cached by (path, size, mtime)."""
    try:
        real = os.path.realpath(os.fspath(path))
        st = os.stat(real)
    except (OSError, ValueError):
        return None
    if not os.path.isfile(real):
        return None
    key = (real, st.st_size, st.st_mtime_ns)
    hit = _FILE_CACHE.get(key)
    if hit is not None:
        return hit
    h = hashlib.sha256()
    try:
        with open(real, "rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                h.update(block)
    except OSError:
        return None
    _FILE_CACHE[key] = h.hexdigest()
    return _FILE_CACHE[key]


def _size(path) -> int:
    """A regular file's size, -1 when it is not there (one ``stat``; plain strings: ~20k calls per VOC)."""
    try:
        st = os.stat(path)
    except (OSError, ValueError):
        return -1
    return st.st_size if stat.S_ISREG(st.st_mode) else -1


def _digest(lines: Iterable[str]) -> str:
    h = hashlib.sha256()
    for line in lines:
        h.update(line.encode("utf-8", "surrogateescape"))
        h.update(b"\n")
    return h.hexdigest()[:_DIGEST_LEN]


# --------------------------------------------------------------------------- VOC


def _content_digest(path: str) -> str | None:
    """sha256 (first 16 hex) of a small file's bytes, None when it is not a readable regular file.

    Not :func:`file_sha256`: its realpath and cache bookkeeping cost more than reading a 1 kB XML.
    """
    try:
        with open(path, "rb") as f:
            return hashlib.sha256(f.read()).hexdigest()[:_DIGEST_LEN]
    except (OSError, ValueError):
        return None


def _image_size(year_dir: str, img_id: str) -> int:
    """The size of the first image candidate there (as the loader looks, but the XML's <filename>)."""
    for p in image_candidates(year_dir, img_id):
        n = _size(p)
        if n >= 0:
            return n
    return -1


def _voc(cfg: dict) -> str:
    root = Path(str(cfg["root"])).expanduser()
    if not root.is_dir():
        return MISSING
    train, val = voc_sources(cfg)
    lines: list[str] = []
    complete = True
    for side, sources in (("train", train), ("val", val)):
        for year_dir, split in sources:
            # the year folder by its name (VOC2007), never by its path
            where = year_dir.name if cfg.get("name") == "voc0712" else "."
            for name in split_names(split):
                list_file = split_list(year_dir, name)
                digest = file_sha256(list_file)
                lines.append(f"{side} {where} {name} {digest or MISSING}")
                if digest is None:
                    complete = False
                    continue
                year = str(year_dir)
                for img_id in read_split_ids(list_file):
                    ann = _content_digest(annotation_file(year, img_id))
                    img = _image_size(year, img_id)
                    complete = complete and ann is not None and img >= 0
                    lines.append(f"{img_id} {ann or MISSING} {img}")
    digest = _digest(lines)
    return f"voc:{digest}" if complete else f"{_INCOMPLETE}{digest}"


# --------------------------------------------------------------------------- COCO


def _listing(folder: Path) -> list[str]:
    """``name size`` of every file in ``folder``, sorted (os.scandir: one stat per entry)."""
    out = []
    with os.scandir(folder) as it:
        for e in it:
            try:
                if e.is_file():
                    out.append(f"{e.name} {e.stat().st_size}")
            except OSError:
                continue
    return sorted(out)


def _coco(cfg: dict) -> str:
    root = Path(str(cfg["root"])).expanduser()
    if not root.is_dir():
        return MISSING
    lines: list[str] = []
    complete = True
    for split in ("train2017", "val2017"):
        digest = file_sha256(root / "annotations" / f"instances_{split}.json")
        lines.append(f"annotations {split} {digest or MISSING}")
        complete = complete and digest is not None
        folder = root / split
        if folder.is_dir():
            lines.append(f"images {split}")
            lines += _listing(folder)
        else:
            lines.append(f"images {split} {MISSING}")
            complete = False
    digest = _digest(lines)
    return f"coco:{digest}" if complete else f"{_INCOMPLETE}{digest}"


#: the files of a data set named by import path read by content (annotations, lists); others by size
_TEXT_SUFFIXES = (".xml", ".json", ".txt", ".csv", ".yaml", ".yml")


def _folder(root: str) -> str:
    """A data set named by import path: its ``root``'s files, every one by relative path and size and
    the annotation-like ones (:data:`_TEXT_SUFFIXES`) by content, as VOC's XMLs are."""
    base = Path(root).expanduser()
    if not base.is_dir():
        return MISSING
    lines = []
    for folder, dirs, files in os.walk(base):
        dirs.sort()
        for name in sorted(files):
            path = os.path.join(folder, name)
            rel = os.path.relpath(path, base)
            text = _content_digest(path) if name.lower().endswith(_TEXT_SUFFIXES) else None
            lines.append(f"{rel} {_size(path)}" + (f" {text}" if text else ""))
    return f"folder:{_digest(lines)}"


# --------------------------------------------------------------------------- entry points


def data_fingerprint(dataset: dict) -> str:
    """The fingerprint of the files a ``dataset`` section makes a trial read; ``""`` when it reads none."""
    name = dataset.get("name")
    if name in ("voc", "voc0712"):
        return _voc(dataset) if dataset.get("root") else MISSING
    if name == "coco2017" and not dataset.get("fake_data"):
        return _coco(dataset) if dataset.get("root") else MISSING
    if ":" in str(name) and dataset.get("root"):  # named by import path: its code is in the plug-in's digest
        return _folder(str(dataset["root"]))
    return ""


def weights_fingerprint(path) -> str:
    """``sha256:<16 hex>`` of a weights file; ``missing:<file name>`` when absent; ``""`` for no file."""
    if not path:
        return ""
    digest = file_sha256(path)
    if digest is None:
        return f"{MISSING}:{os.path.basename(str(path))}"
    return f"sha256:{digest[:_DIGEST_LEN]}"


def trial_fingerprint(dataset: dict, model_options: dict) -> dict[str, Any]:
    """``{"data": ..., "weights": ...}`` with only the non-empty ones: what a trial's id holds for its files.

    Empty for a trial that reads no file (synthetic data, no weights), so such
    trials keep the ids they had before fingerprints existed.
    """
    out = {"data": data_fingerprint(dataset), "weights": weights_fingerprint(model_options.get("backbone_weights"))}
    return {k: v for k, v in out.items() if v}


def canonical_json(value: Any) -> str:
    """The one JSON text hashed for ids: sorted keys, no spaces, ASCII."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=True)
