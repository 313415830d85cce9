"""Flush and saturation counts for the telemetry: how many elements a rounding sent to zero or past the max.

:class:`FlushSaturate` is the counts' shape, shared by every rounding that reports them
(:func:`~.block_scaling.block_round` and the FP4 roundings with ``counts=True``);
:func:`count_flush_saturate` counts them for a plain (unscaled) cast, compiled by Inductor on first use.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from .lazy_compile import LazyCompiled

__all__ = ["F32_MAX", "FlushSaturate", "count_flush_saturate"]

#: the largest finite fp32 value: an element above it in magnitude is inf (not counted as non-zero)
F32_MAX = float(torch.finfo(torch.float32).max)


class FlushSaturate(NamedTuple):
    """Element counts for the telemetry, as 0-d int64 tensors (no host synchronisation).

    ``nonzero``: finite non-zero elements before rounding (the denominator of a flush share:
    exact zeros, common in SSD heads' gradients, cannot underflow). ``flushed``: of those, the
    ones that came out zero. ``saturated``: elements whose magnitude, in the domain the cast
    saw, exceeded the format's max: clipped to +-max, or overflowed to inf/NaN by a
    non-saturating cast. Elements just above max that round to it count too.
    """

    nonzero: torch.Tensor
    flushed: torch.Tensor
    saturated: torch.Tensor


def _count_core(before: torch.Tensor, after: torch.Tensor, fmt_max: float) -> tuple:
    nonzero = (before != 0) & (before.abs() <= F32_MAX)
    return nonzero.sum(), (nonzero & (after == 0)).sum(), (before.abs() > fmt_max).sum()


_COUNTS = LazyCompiled(_count_core, "count_flush_saturate")


def count_flush_saturate(x_before: torch.Tensor, x_after: torch.Tensor, fmt_max: float) -> FlushSaturate:
    """Flush and saturation counts of a plain (unscaled) cast ``x_after = round(x_before)``.

    ``nonzero``: finite non-zero elements of ``x_before``; ``flushed``: those that are zero in
    ``x_after``; ``saturated``: elements with ``|x_before| > fmt_max`` (clipped by a saturating
    cast, inf/NaN after a non-saturating one; inf inputs included, NaN not). For block-scaled
    rounding use ``block_round(..., counts=True)``: there the threshold is per block.
    Both tensors must have the same shape; counts are 0-d int64 tensors (no host sync).
    """
    before = x_before.reshape(-1).float().detach()
    after = x_after.reshape(-1).float().detach()
    if before.shape != after.shape:
        raise ValueError(f"shapes differ: {tuple(x_before.shape)} vs {tuple(x_after.shape)}")
    if before.numel() < 2:
        return FlushSaturate(*_count_core(before, after, float(fmt_max)))
    return FlushSaturate(*_COUNTS(before, after, float(fmt_max)))
