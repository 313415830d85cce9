"""The facts about the two 8-bit float formats, E4M3 (``float8_e4m3fn``) and E5M2 (``float8_e5m2``).

:class:`Fp8Spec` holds what the bit-level rounding of :mod:`.fp8` needs (significand bits, exponent
range, largest value, inf or not, the NaN bit pattern torch's cast gives); :data:`E4M3`, :data:`E5M2`
and :data:`SPECS` (name -> spec) are the two formats.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field

import torch

__all__ = ["E4M3", "E5M2", "SPECS", "Fp8Spec"]


def _f32_bits(v: float) -> int:
    """The int32 bit pattern of ``v`` as fp32."""
    return struct.unpack("<i", struct.pack("<f", v))[0]


@dataclass(frozen=True)
class Fp8Spec:
    """The facts about an 8-bit float format that the bit-level rounding needs."""

    name: str
    dtype: torch.dtype
    #: significand bits after the leading one
    mbits: int
    #: exponent of the smallest normal (2^emin) and of the largest binade (2^emax)
    emin: int
    emax: int
    #: largest finite value
    max: float
    #: whether the format has inf (E5M2) or uses the top codes for NaN only (E4M3 "fn")
    has_inf: bool
    #: fp32 bit pattern of the format's NaN after torch widens it back to fp32 (positive sign)
    nan_bits: int
    #: fp32 bit pattern of ``max``, computed here once: Dynamo cannot trace ``struct.pack``
    max_bits: int = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "max_bits", _f32_bits(self.max))

    @property
    def min_subnormal(self) -> float:
        return 2.0 ** (self.emin - self.mbits)

    @property
    def overflow_midpoint(self) -> float:
        """Magnitudes strictly above this round past ``max`` (ties go to the even code ``max``)."""
        return self.max + 2.0 ** (self.emax - self.mbits - 1)


E4M3 = Fp8Spec("e4m3", torch.float8_e4m3fn, mbits=3, emin=-6, emax=8, max=448.0, has_inf=False, nan_bits=0x7FF00000)
E5M2 = Fp8Spec("e5m2", torch.float8_e5m2, mbits=2, emin=-14, emax=15, max=57344.0, has_inf=True, nan_bits=0x7FE00000)
SPECS: dict[str, Fp8Spec] = {"e4m3": E4M3, "e5m2": E5M2}
