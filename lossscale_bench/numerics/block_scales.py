"""The scales of block-scaled formats: the element formats, MX's shared exponent, TE's amax scale.

:mod:`.block_scaling` rounds with them (and :mod:`.fp4` for MXFP4); the definitions of each mode
are in :mod:`.block_scaling`'s docstring.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .fp8_formats import E4M3, E5M2, Fp8Spec

__all__ = ["ELEMENTS", "FP16", "MX_MODES", "ElementFormat", "amax_scale", "exp2i", "mx_exponent"]

#: how an MX block's shared exponent is taken from its amax (:func:`mx_exponent`)
MX_MODES = ("floor", "ceil", "even", "rceil")
_F32_MAX = float(torch.finfo(torch.float32).max)


#: fp16 described like the fp8 formats, so the compiled kernels round it with the bit-level
#: code: Inductor drops an fp32 -> fp16 -> fp32 round trip inside a fused kernel (its
#: ``emulate_precision_casts`` is off by default), so ``.half().float()`` compiles to nothing
FP16 = Fp8Spec("fp16", torch.float16, mbits=10, emin=-14, emax=15, max=65504.0, has_inf=True, nan_bits=0x7FFFFFFF)


@dataclass(frozen=True)
class ElementFormat:
    """An element format a block-scaled tensor can be cast to."""

    name: str
    spec: Fp8Spec

    @property
    def max(self) -> float:
        """Largest finite value."""
        return self.spec.max

    @property
    def emax(self) -> int:
        """Exponent of the largest binade (OCP MX's ``emax_elem``)."""
        return self.spec.emax

    @property
    def mbits(self) -> int:
        """Significand bits after the leading one (the ``even`` mode rounds amax to them)."""
        return self.spec.mbits


ELEMENTS: dict[str, ElementFormat] = {
    "e4m3": ElementFormat("e4m3", E4M3),
    "e5m2": ElementFormat("e5m2", E5M2),
    "fp16": ElementFormat("fp16", FP16),
}


def exp2i(e: torch.Tensor) -> torch.Tensor:
    """``2^e`` as fp32, exactly, for int32 ``e`` in [-127, 127] (``2^-127`` is subnormal)."""
    normal = ((e.clamp(min=-126) + 127) << 23).view(torch.float32)
    return torch.where(e == -127, 2.0**-127, normal)


def mx_exponent(amax: torch.Tensor, elem: ElementFormat | str, mode: str = "floor") -> torch.Tensor:
    """The shared exponent ``e`` (int32, in [-127, 127]) of blocks with max magnitude ``amax``.

    Read from the fp32 bits, so it is exact where ``log2`` would round. For a zero or
    fp32-subnormal amax the biased exponent field is 0, i.e. ``floor(log2)`` is taken as -127,
    as torchao does; the clamp makes that immaterial. Meaningless (but finite) for NaN/inf amax:
    :func:`block_round` turns those blocks into NaN.
    """
    elem = ELEMENTS[elem] if isinstance(elem, str) else elem
    bits = amax.float().view(torch.int32)
    if mode == "rceil":
        d = (amax.float() / elem.max).view(torch.int32)
        field, mant = (d >> 23) & 0xFF, d & 0x7FFFFF
        # a normal d rounds up when any mantissa bit is set; an fp32-subnormal d (< 2^-126)
        # needs 2^-126 only when it is above 2^-127
        up = torch.where(field == 0, mant > 0x400000, mant != 0)
        e = field - 127 + up.int()
    elif mode in ("floor", "ceil", "even"):
        if mode == "even":  # clamp first: a NaN's bits plus the rounding bias would wrap
            bits = bits.clamp(max=0x7F800000) + (1 << (22 - elem.mbits))
        e = ((bits >> 23) & 0xFF) - 127 - elem.emax
        if mode == "ceil":
            e = e + ((bits & 0x7FFFFF) != 0).int()
    else:
        raise ValueError(f"unknown MX scale mode {mode!r}; allowed: {', '.join(MX_MODES)}")
    return e.clamp(-127, 127)


def amax_scale(amax: torch.Tensor, elem: ElementFormat | str, pow2: bool, amax_floor: float = 0.0) -> torch.Tensor:
    """TE's ``compute_scale_from_amax``: ``s = fmt_max / max(amax, amax_floor)``; 1 for a zero
    amax, ``FLT_MAX`` where that overflows; rounded down to a power of two if ``pow2``."""
    elem = ELEMENTS[elem] if isinstance(elem, str) else elem
    a = amax.clamp(min=amax_floor) if amax_floor > 0 else amax
    # full_like(max) / a, not max / a: torch evaluates ``scalar / tensor`` as
    # ``tensor.reciprocal() * scalar``, which rounds twice and is not TE's correctly rounded ratio
    s = torch.where(a == 0, 1.0, (torch.full_like(a, elem.max) / a).clamp(max=_F32_MAX))
    if pow2:
        s = (s.view(torch.int32) & 0x7F800000).view(torch.float32)
    return s
