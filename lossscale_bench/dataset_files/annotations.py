"""What makes an annotation unusable, and what happens to it: the rules the loaders and ``lsbench
validate`` share (:mod:`.voc_xml`, :mod:`.coco_json` apply them per format).

Why one set of rules in the schema layer: an object whose class is not in the class list, a box
with ``xmin > xmax``, a ``nan`` coordinate or a box wholly outside its image used to be dropped
(or, NaN, kept) without a word, and the mAP moved (2.37 -> 4.71 for ``square`` -> ``Square``).
Now each is an :class:`AnnotationError` naming the file, the record and the value, raised
before training where ``lsbench validate`` / ``run`` can see it (torch-free, so here) and by the
loader otherwise (a ``failed`` trial with that line). ``dataset.bad_annotations: drop`` drops
them instead; :class:`Drops` counts them by reason, and the counts go to the trial's run tags.

Not errors (tolerated as the reference pipelines do, and unchanged): a box partly outside its
image is clipped to it; a COCO box of at most 1 px after clipping is skipped and counted
(``skipped_boxes``, torchvision's rule: real COCO has a few); crowd boxes are not trained on.
A file that cannot be read at all (not JSON or XML, no ``categories``) is an error whatever the
option says: there is nothing to drop it to.

Standard library only (the schema layer).
"""

from __future__ import annotations

import math
from collections import Counter

from ..core.wording import suggest as _suggest

__all__ = [
    "BAD_ANNOTATIONS",
    "AnnotationError",
    "Drops",
    "DROP_HINT",
    "number",
    "unknown_class_problem",
    "finite",
    "outside",
    "size_mismatch",
]

#: values of ``dataset.bad_annotations``
BAD_ANNOTATIONS = ("error", "drop")
#: what a droppable error adds, so the line says how to go on
DROP_HINT = "set dataset.bad_annotations: drop to drop and count such annotations instead"


class AnnotationError(ValueError):
    """An annotation file, or one record in it, that cannot be used as written; ``str(e)`` is one
    line ``<file>: <record>: <problem>``.

    ``reason`` is the key it is counted under when dropped (``unknown_class``, ``non_finite``,
    ``bad_box``, ``outside_image``, ``unknown_image``, ``bad_value``); ``droppable`` is False for
    a problem with the file itself (not JSON, no class list, an empty split), which no option
    drops.
    """

    def __init__(
        self, file, record: str, problem: str, *, reason: str = "bad_value", droppable: bool = True, hint: bool = True
    ) -> None:
        self.file, self.record, self.problem = str(file), record, " ".join(str(problem).split())
        self.reason, self.droppable = reason, droppable
        self.bare = f"{self.file}: {record}: {self.problem}" if record else f"{self.file}: {self.problem}"
        super().__init__(self.bare + (f"; {DROP_HINT}" if droppable and hint else ""))


class Drops:
    """Where a loader sends each bad annotation: raised (``error``) or counted and dropped (``drop``).

    ``counts`` by reason, ``unknown_names`` (the class names dropped, by name), ``first`` (the
    first one dropped, for a message) and ``total``.
    """

    def __init__(self, policy: str = "error") -> None:
        if policy not in BAD_ANNOTATIONS:
            raise ValueError(f"bad_annotations {policy!r}; allowed: {', '.join(BAD_ANNOTATIONS)}")
        self.policy = policy
        self.counts: Counter = Counter()
        self.unknown_names: Counter = Counter()
        self.first: AnnotationError | None = None

    def bad(self, err: AnnotationError, unknown_name: str | None = None) -> None:
        """Raise ``err`` (policy ``error``, or a problem no option drops), else count it."""
        if self.policy == "error" or not err.droppable:
            raise err
        self.counts[err.reason] += 1
        if unknown_name is not None:
            self.unknown_names[unknown_name] += 1
        if self.first is None:
            self.first = err

    @property
    def total(self) -> int:
        return sum(self.counts.values())

    def as_dict(self) -> dict[str, int]:
        """``{reason: count}``, sorted: what the run tag records."""
        return dict(sorted(self.counts.items()))


def number(value) -> float | None:
    """``value`` as a float (a numeric string too: XML holds text), or None when it is none."""
    if isinstance(value, bool) or value is None:
        return None
    try:
        return float(value)  # a string's surrounding blanks are allowed, as the XML may have them
    except (TypeError, ValueError):
        return None


def unknown_class_problem(name, classes) -> str:
    """``class 'Square' is not in dataset.classes (did you mean 'square'?)``."""
    shown = ", ".join(repr(c) for c in list(classes)[:6]) + (", ..." if len(classes) > 6 else "")
    return f"class {name!r} is not in dataset.classes [{shown}]{_suggest(name, classes)}"


def finite(values) -> bool:
    isfinite = math.isfinite
    return all([isfinite(v) for v in values])


def outside(x1: float, y1: float, x2: float, y2: float, width: float, height: float) -> bool:
    """Whether the continuous box has no area inside a ``width`` x ``height`` image (sizes > 0)."""
    return x1 >= width or y1 >= height or x2 <= 0 or y2 <= 0


def size_mismatch(
    ann_file, record: str, size: tuple[int, int], image_file, image_size: tuple[int, int]
) -> AnnotationError:
    """The error of an annotation whose image size is not its image's (in either EXIF frame): its boxes
    were drawn on other pixels (a resized or replaced image), and clipping them to this one, as the
    loaders once did without a word, trains on boxes that miss their objects. No option drops it."""
    return AnnotationError(
        ann_file,
        record,
        f"{size[0]}x{size[1]} (width x height), but the image {image_file} is "
        f"{image_size[0]}x{image_size[1]}; the boxes cannot be placed on it: correct the size and "
        "the boxes, or the image",
        droppable=False,
    )
