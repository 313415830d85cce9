"""Notices about a valid study: combinations that run, but may not mean what the author thinks.

Why not errors: a loss scale in bf16 or fp32 is a legitimate control row (it shows the
scaling code itself changes nothing where there is nothing to rescue), so refusing it would
be wrong; accepting it without a word let a researcher believe a bf16 "fixed 128" row
tested loss scaling. ``lsbench validate`` and ``lsbench run`` print these on stderr.
"""

from __future__ import annotations

from .precisions import PRECISION_SPECS


def study_notices(study) -> list[str]:
    """One line per scaling entry whose method scales gradients in a precision that has fp32's range."""
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
    return out
