"""Low-precision number formats, described once.

Everything that depends on a format (the emulation's rounding, the adaptive
rule's ``u_min``/``u_max``, the telemetry's subnormal and flush thresholds,
the report's footnote) reads it from a :class:`FloatFormat`, so a new format
is one entry here, not a hunt for ``65504`` and ``6e-8`` across the package.

Rounding goes through torch's own dtypes (``t.to(dtype).to(float32)``), so the
emulation rounds exactly as a real cast does, including its edge cases:
fp16 and E5M2 overflow to inf, while torch's ``float8_e4m3fn`` (a format with
no inf) *saturates* to +-448 on CPU; values below half the smallest subnormal
flush to zero (round to nearest even).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class FloatFormat:
    #: short name used in reports and telemetry ("fp16", "e4m3", "e5m2")
    name: str
    #: the torch dtype that rounds to this format
    dtype: torch.dtype
    #: largest finite value
    max: float
    #: smallest positive normal value (below it values are subnormal: precision is lost)
    min_normal: float
    #: smallest positive subnormal value (the reference's ``u_min``: ``get_range(dtype)``)
    min_subnormal: float
    #: True if values past ``max`` become +-max instead of inf (E4M3 "fn" on torch's CPU cast)
    saturates: bool = False
    #: the adaptive rule's ``u_min``; the reference (``AdaLoss.get_u_min``) uses 6.0e-8 for fp16,
    #: a rounded 2**-24; None means the smallest subnormal
    reference_u_min: float | None = None

    @property
    def u_min(self) -> float:
        """Lower end of the range the adaptive rule keeps gradients in (``get_range(dtype)[0]``)."""
        return self.min_subnormal if self.reference_u_min is None else self.reference_u_min

    @property
    def u_max(self) -> float:
        """Upper end of that range: the largest finite value."""
        return self.max

    @property
    def flush_threshold(self) -> float:
        """Magnitudes at or below this round to zero (half the smallest subnormal, ties to even)."""
        return self.min_subnormal / 2

    def round(self, t: torch.Tensor) -> torch.Tensor:
        """Round ``t`` to this format and back to ``t``'s dtype (a no-op if ``t`` already is it)."""
        if t.dtype == self.dtype:
            return t
        return t.to(self.dtype).to(t.dtype)


FP16 = FloatFormat("fp16", torch.float16, max=65504.0, min_normal=2.0 ** -14, min_subnormal=2.0 ** -24,
                   reference_u_min=6.0e-8)
#: forward activations of FP8 recipes: 4 exponent bits, 3 mantissa bits, no inf
E4M3 = FloatFormat("e4m3", torch.float8_e4m3fn, max=448.0, min_normal=2.0 ** -6, min_subnormal=2.0 ** -9,
                   saturates=True)
#: gradients of FP8 recipes: 5 exponent bits (fp16's range), 2 mantissa bits
E5M2 = FloatFormat("e5m2", torch.float8_e5m2, max=57344.0, min_normal=2.0 ** -14, min_subnormal=2.0 ** -16)

#: bf16 autocast: fp32's exponent range, so loss scaling has nothing to rescue
BF16 = FloatFormat("bf16", torch.bfloat16, max=float(torch.finfo(torch.bfloat16).max),
                   min_normal=float(torch.finfo(torch.bfloat16).tiny), min_subnormal=2.0 ** -133)

FORMATS: dict[str, FloatFormat] = {f.name: f for f in (FP16, BF16, E4M3, E5M2)}
