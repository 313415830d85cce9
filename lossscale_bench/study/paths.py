"""The paths a study names, and whether they are there: ``lsbench validate`` and ``lsbench run`` check them.

A study can be valid as a schema and still useless on this machine: a
missing backbone weights file used to fail every trial one by one after Ray
had started (and ``run`` exited 0). :func:`path_problems` looks at every
path-like field of the schema (``dataset.root``, ``model_options.backbone_weights``)
with ``os.path`` alone (this package stays free of torch), and returns one
:class:`StudyError` per missing path, naming the file, the field and the path.

What a dataset root must hold: VOC's folders and split lists are defined once in
:mod:`.voc_layout` (the VOC loader reads them from there); COCO's mirror
``data._coco2017_paths``, which this layer may not import
(``tests/study/test_hostile_input.py`` checks that they agree). When every path
is there, :func:`.data_check.data_problems` looks inside: an empty or
object-less evaluation split, or a bad annotation, is one line too.

Paths that need not exist: a synthetic root (the set is generated there on
first use: its cache, ``dataset.root`` or ``$LSBENCH_DATA``, must then be a
folder that can be written, :mod:`.synthetic_cache`) and a ``coco2017`` root
with ``fake_data: true`` (never read). No
dataset of the schema downloads itself: missing data is fetched with
``lsbench data``, which the message names.
"""

from __future__ import annotations

import os

from ..dataset_files.synthetic_cache import cache_problem
from ..dataset_files.voc_layout import exists as _exists
from ..dataset_files.voc_layout import required_paths
from .data_check import data_problems
from .errors import StudyError

__all__ = ["path_problems", "check_paths"]

_COCO_NEEDS = (
    ("annotations/instances_train2017.json", "file"),
    ("annotations/instances_val2017.json", "file"),
    ("train2017", "dir"),
    ("val2017", "dir"),
)


def _voc_needs(ds) -> list[tuple[str, str]]:
    """(path, kind) a ``voc``/``voc0712`` dataset reads, in the order worth reporting (:mod:`.voc_layout`)."""
    return [(str(p), kind) for p, kind in required_paths(ds.model_dump())]


def _fetch_hint(ds) -> str:
    if ds.name == "coco2017":
        return f" (fetch it with: lsbench data coco --root {ds.root})"
    if ds.name == "voc0712":
        # `lsbench data voc --root DIR` makes DIR/VOCdevkit/VOC2007 and VOC2012
        parent = os.path.dirname(ds.root) if os.path.basename(ds.root) == "VOCdevkit" else ds.root
        return f" (fetch it with: lsbench data voc --root {parent})"
    return " (a VOC-format folder needs Annotations/, JPEGImages/ and ImageSets/Main/<split>.txt)"


def path_problems(study) -> list[StudyError]:
    """One :class:`StudyError` per path of ``study`` that is missing here (empty: every path is there).

    When the data's paths are all there and what they hold is unusable
    (:func:`.data_check.data_problems`), that :class:`StudyError` is raised.
    """
    src = study.source
    out: list[StudyError] = []
    ds = study.dataset
    if ds.name == "synthetic":
        problem = cache_problem(ds)
        if problem:
            out.append(StudyError(src, "dataset.root" if ds.root is not None else "dataset", problem))
    needs_root = ds.name in ("voc", "voc0712") or (ds.name == "coco2017" and not ds.fake_data)
    if needs_root:
        if not os.path.isdir(ds.root):
            what = "not a folder" if os.path.exists(ds.root) else "not found"
            out.append(StudyError(src, "dataset.root", f"{what}: {ds.root}{_fetch_hint(ds)}"))
        else:
            needs = _COCO_NEEDS if ds.name == "coco2017" else None
            pairs = [(os.path.join(ds.root, rel), kind) for rel, kind in needs] if needs is not None else _voc_needs(ds)
            for path, kind in pairs:
                if not _exists(path, kind):
                    out.append(
                        StudyError(
                            src,
                            "dataset.root",
                            f"{ds.root} does not look like a {ds.name} dataset: "
                            f"{'folder' if kind == 'dir' else 'file'} not found: {path}"
                            f"{_fetch_hint(ds)}",
                        )
                    )
        if not out:  # every path is there: is what they hold usable (not empty, no bad annotation)?
            # raised, not listed: the data is here, so `validate`'s "a study meant for another
            # machine? try --schema-only" advice after path problems does not apply
            for problem in data_problems(study):
                raise problem
    weights = study.model_options.backbone_weights
    if weights is not None and not os.path.isfile(weights):
        what = "not a file" if os.path.exists(weights) else "file not found"
        out.append(StudyError(src, "model_options.backbone_weights", f"{what}: {weights}"))
    return out


def check_paths(study) -> None:
    """Raise the first of :func:`path_problems` as one line (saying how many more there are)."""
    problems = path_problems(study)
    if not problems:
        return
    first = problems[0]
    more = len(problems) - 1
    if more:
        raise StudyError(
            first.file,
            first.path,
            f"{first.problem} (and {more} more missing path"
            f"{'s' if more > 1 else ''}: lsbench validate {first.file} lists them)",
            first.allowed,
        )
    raise first
