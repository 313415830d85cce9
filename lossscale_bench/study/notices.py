"""Notices about a valid study: combinations that run, but may not mean what the author thinks.

Why not errors: a loss scale in bf16 or fp32 is a legitimate control row (it shows the
scaling code itself changes nothing where there is nothing to rescue), so refusing it would
be wrong; accepting it without a word let a researcher believe a bf16 "fixed 128" row
tested loss scaling. ``lsbench validate`` and ``lsbench run`` print these on stderr.

The same holds for a VOC study whose evaluation split shares images with its training split: scoring
the training images themselves is a legitimate check (can the model fit what it saw?), so it is not
refused, but the mAP of such a study is no validation score, and a note says how many images are shared.
"""

from __future__ import annotations

from ..dataset_files.voc_layout import split_id_lines, split_list, split_names, voc_sources
from .precisions import PRECISION_SPECS


def _ids(sources) -> dict[tuple[str, str], str]:
    """``(year dir, image id) -> list file`` of one side's lists (what exists of them)."""
    out: dict[tuple[str, str], str] = {}
    for year_dir, split in sources:
        for name in split_names(split):
            list_file = split_list(year_dir, name)
            for _, img_id in split_id_lines(list_file):
                out.setdefault((str(year_dir), img_id), str(list_file))
    return out


def shared_images_notice(study) -> str | None:
    """A line when a VOC study's evaluation images are also training images; None otherwise (or when a
    list cannot be read here: the path and data checks name that)."""
    if study.dataset.name not in ("voc", "voc0712"):
        return None
    try:
        train_src, val_src = voc_sources(study.dataset.model_dump())
        train, val = _ids(train_src), _ids(val_src)
    except (OSError, ValueError):
        return None
    shared = [key for key in val if key in train]
    if not shared:
        return None
    src = getattr(study, "source", None) or "study"
    first = shared[0]
    return (
        f"{src}: dataset.val_split: {len(shared)} of its {len(val)} images are also training images "
        f"({first[1]!r} is in {val[first]} and {train[first]}): their mAP is how well the model fits images "
        "it trained on, not a validation score; use disjoint split lists unless that is what you measure"
    )


def study_notices(study) -> list[str]:
    """One line per scaling entry whose method scales gradients in a precision that has fp32's range, and
    one when the evaluation images are also training images (:func:`shared_images_notice`)."""
    out = []
    src = getattr(study, "source", None) or "study"
    for k, entry in enumerate(study.scaling):
        precision = entry.overrides().get("precision", study.precision)
        spec = PRECISION_SPECS[precision]
        if entry.method == "none" or spec.needs_scaler:
            continue
        grads = (
            "fp32 gradients"
            if spec.grad_format is None
            else f"{spec.grad_format} gradients, which have fp32's exponent range"
        )
        out.append(
            f"{src}: scaling[{k}] ({entry.method}) in {precision}: {grads}, so a loss scale has "
            "nothing to rescue; the row runs as a control"
        )
    shared = shared_images_notice(study)
    return out + ([shared] if shared else [])
