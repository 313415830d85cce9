"""The ranges of the number formats, from their bit layouts, without torch.

Why a module of its own: validation (``lsbench validate``, the study layer) must bound
the scale-like options of a study file by fp32's range and by the precision's gradient
format, and it never imports torch (it stays instant). :mod:`lossscale_bench.precision.formats`
builds its torch-facing :class:`~lossscale_bench.precision.formats.FloatFormat` from these same
numbers, so a range is written once, here; ``tests/precision/test_formats.py`` checks each
against ``torch.finfo``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True)
class FloatRange:
    #: the name :mod:`lossscale_bench.precision.formats` and the precisions know the format by
    name: str
    #: largest finite value
    max: float
    #: smallest positive normal value (fp32's ``finfo.tiny``)
    min_normal: float
    #: smallest positive subnormal value
    min_subnormal: float

    def fields(self) -> dict[str, float]:
        """``max``, ``min_normal``, ``min_subnormal``: the keyword arguments ``FloatFormat`` takes."""
        return {"max": self.max, "min_normal": self.min_normal, "min_subnormal": self.min_subnormal}

    def log2_span(self) -> float:
        """``log2(max / min_subnormal)``: how many binades the format holds, subnormals included."""
        return math.log2(self.max) - math.log2(self.min_subnormal)


def _binary(name: str, exponent_bits: int, mantissa_bits: int, *, inf: bool = True, nan: bool = True) -> FloatRange:
    """An IEEE-754-style binary format. ``inf=False``: the "fn" layout of E4M3 (no infinities; the
    all-ones exponent holds finite values, only its all-ones mantissa is NaN), whose top binade is
    one higher and whose largest mantissa is one step short of all ones. ``nan=False`` as well: no
    special codes at all (OCP MX's FP4 E2M1), so the all-ones code is the largest finite value."""
    bias = 2 ** (exponent_bits - 1) - 1
    top_exponent = bias if inf else bias + 1
    top_mantissa = 2.0 - 2.0**-mantissa_bits * (1 if inf or not nan else 2)
    return FloatRange(
        name,
        max=top_mantissa * 2.0**top_exponent,
        min_normal=2.0 ** (1 - bias),
        min_subnormal=2.0 ** (1 - bias - mantissa_bits),
    )


FP32 = _binary("fp32", 8, 23)
RANGES: dict[str, FloatRange] = {
    r.name: r
    for r in (
        FP32,
        _binary("fp16", 5, 10),
        _binary("bf16", 8, 7),
        _binary("e4m3", 4, 3, inf=False),
        _binary("e5m2", 5, 2),
        # FP4 (OCP MX v1.0 section 5.3.3): +-{0, 0.5, 1, 1.5, 2, 3, 4, 6}; the NVFP4 and MXFP4 gradient
        # precisions hold their elements in it too, so their loss-scale bounds are E2M1's
        _binary("e2m1", 2, 1, inf=False, nan=False),
    )
}
