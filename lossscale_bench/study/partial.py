"""Every problem of a study file in one ``lsbench validate``: the checks behind a failed one still run.

Validation comes in layers: each field on its own (pydantic: all of them at once), then the checks
across fields (a warm-up longer than the schedule, a batch size the devices do not divide), which
pydantic runs only once every field is valid, then the grid's repeats, then the data the study names
(``paths``, ``data_check``). A file with problems in every layer was told them one layer at a time:
fix eleven lines, run again, get two more, then three.

So :func:`load.load_study_text` validates again without what failed: each failing key is left out
(:func:`drop`; a list whose element failed goes whole, a required key left out ends the retries)
until the study validates or nothing new is found, collecting every round's problems. A later
round's problem is kept only when it cannot be an effect of what was left out
(:func:`independent`): not at or under a key left out, nor elsewhere in the scaling entry that held
it, nor a required-key complaint about it. The data checks run on the result only when no key of
``dataset`` nor ``eval.max_images`` was left out (a default there, ``bad_annotations: error`` for one, would
judge other data than the file names).
"""

from __future__ import annotations

import re
from typing import Any

__all__ = ["MAX_ROUNDS", "drop", "independent", "path_segments", "touches_data"]

#: validation rounds at most (field errors, cross-field checks, nested model checks, the grid's repeats)
MAX_ROUNDS = 6

_SEG = re.compile(r"([^.\[\]]+)|\[(\d+)\]")


def path_segments(path: str) -> list:
    """``"scaling[2].scale"`` -> ``["scaling", 2, "scale"]`` (a :class:`StudyError`'s ``path``)."""
    if not path or path.startswith(("(", "line ")):
        return []
    return [int(i) if i else k for k, i in _SEG.findall(path)]


def drop(raw: dict, segs: list) -> tuple[dict, list] | None:
    """A copy of ``raw`` without the key at ``segs`` (its deepest mapping key; a list whose element it names
    goes whole), and the segments of what went; None when nothing can go (the top level)."""
    out = dict(raw)  # the containers along the path are copied, nothing else (the values stay as read)
    node: Any = out
    keyed: list[tuple[dict, str, int]] = []  # (mapping, key, depth) along the path
    for depth, seg in enumerate(segs):
        if isinstance(node, dict) and seg in node:
            keyed.append((node, seg, depth))
            child = node[seg]
        elif isinstance(node, list) and isinstance(seg, int) and 0 <= seg < len(node):
            child = node[seg]
        else:
            break
        if isinstance(child, (dict, list)):
            child = dict(child) if isinstance(child, dict) else list(child)
            node[seg] = child
        node = child
    if not keyed:
        return None
    parent, key, depth = keyed[-1]
    del parent[key]
    return out, segs[: depth + 1]


def _under(segs: list, prefix: list) -> bool:
    return segs[: len(prefix)] == prefix


def independent(path: str, dropped: list[list]) -> bool:
    """Whether a problem at ``path`` found after ``dropped`` keys were left out is the file's own: not at or
    under one, and not in the scaling entry (``scaling[k]``) that held one."""
    segs = path_segments(path)
    for gone in dropped:
        if _under(segs, gone) or (segs and _under(gone, segs)):
            return False
        if len(gone) > 2 and gone[0] == "scaling" and isinstance(gone[1], int) and _under(segs, gone[:2]):
            return False
    return bool(segs) or not dropped


def touches_data(dropped: list[list]) -> bool:
    """Whether a key the data checks read was left out (the data section, ``eval.max_images``)."""
    return any(gone[:1] == ["dataset"] or gone in (["eval"], ["eval", "max_images"]) for gone in dropped)
