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

from collections.abc import Callable
from dataclasses import dataclass, field, replace

import torch

from ..core.float_ranges import RANGES


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
    #: a faster (or non-saturating) rounding than torch's eager cast, bit-identical where they
    #: overlap (:mod:`lossscale_bench.numerics.fp8`); None: the cast through ``dtype``
    rounder: Callable[[torch.Tensor], torch.Tensor] | None = field(default=None, compare=False, repr=False)
    #: how values past ``max`` end: "saturate" (+-max), "inf" (fp16, E5M2) or "nan" (non-saturating E4M3)
    overflow: str = "inf"
    #: each element rounds on its own (no block or tensor scale): tensors may be rounded concatenated
    elementwise: bool = True

    @property
    def concat_block(self) -> int | None:
        """Tensors may be rounded together, each flattened in logical order and zero-padded to a
        multiple of this many elements: 1 for element-wise formats (same values as one rounding per
        tensor; a stochastic E2M1 rounding then draws its key once for the concatenation), the block
        size for formats whose blocks are consecutive elements of the flattened tensor with no scale
        shared beyond the block (mx32: same values, tested); None where a scale spans more than a
        block (per-tensor, 1x128 tiles, NVFP4's global scale) or a block format draws keys per call
        (stochastic MXFP4): those are rounded one tensor at a time."""
        return 1 if self.elementwise else None

    def next_key(self):
        """The random key the next :meth:`round` call draws (None: this format draws none). A caller that
        rounds later than it would have (:meth:`round_each_`) draws it at the time, so the stream, and
        every value, is the same as with a call per tensor."""
        return None

    def round_each_(self, tensors: list[torch.Tensor], keys: list) -> None:
        """Round each tensor in place, tensor ``i`` as :meth:`round` would with ``keys[i]`` (from
        :meth:`next_key`): the parameter gradients of a format that cannot round them concatenated
        (``concat_block`` None), one backward's worth at a time. A format may do it with less dispatch."""
        for t in tensors:
            t.copy_(self.round(t))

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
        if self.rounder is not None:
            return self.rounder(t)
        return t.to(self.dtype).to(t.dtype)

    def census(self, g: torch.Tensor) -> torch.Tensor:
        """``[non-zero, subnormal, flushed, saturated]`` element counts of ``g`` in this format, on
        the device: flushed = non-zero that round to 0, saturated = past ``max`` (clipped to it,
        or inf/NaN: an overflow), counted among the non-zero. Thresholds, not a round trip: cheap."""
        from ..numerics.census import census

        return census(g, self.min_normal, self.flush_threshold, self.max)

    @property
    def thresholds(self) -> dict[str, float]:
        """What the telemetry's rates count against, for labels and the layer history."""
        return {
            "subnormal_below": self.min_normal,
            "flush_at_or_below": self.flush_threshold,
            "saturate_above": self.max,
        }


#: the ranges come from :mod:`lossscale_bench.core.float_ranges` (torch-free: validation bounds options by them)
FP16 = FloatFormat("fp16", torch.float16, **RANGES["fp16"].fields(), reference_u_min=6.0e-8)


def _round_e4m3(t: torch.Tensor) -> torch.Tensor:
    from ..numerics.fp8 import round_e4m3

    return round_e4m3(t, saturate=True)


def _round_e4m3_nan(t: torch.Tensor) -> torch.Tensor:
    from ..numerics.fp8 import round_e4m3

    return round_e4m3(t, saturate=False)


#: FP8 recipes' forward format (and every tensor's in TE's Format.E4M3): 4 exponent bits, 3 mantissa
#: bits, no inf. torch's cast saturates (+-448, even for inf): an overflow leaves no trace
E4M3 = FloatFormat(
    "e4m3", torch.float8_e4m3fn, **RANGES["e4m3"].fields(), saturates=True, rounder=_round_e4m3, overflow="saturate"
)
#: E4M3 whose overflow is NaN (OCP's non-saturating conversion): what an overflow-driven scaler needs to see
E4M3_NAN = replace(E4M3, name="e4m3-nan", saturates=False, rounder=_round_e4m3_nan, overflow="nan")
#: gradients of FP8 recipes: 5 exponent bits (fp16's range), 2 mantissa bits
E5M2 = FloatFormat("e5m2", torch.float8_e5m2, **RANGES["e5m2"].fields())

#: bf16 autocast: fp32's exponent range, so loss scaling has nothing to rescue
BF16 = FloatFormat("bf16", torch.bfloat16, **RANGES["bf16"].fields())


def _round_e2m1(t: torch.Tensor) -> torch.Tensor:
    from ..numerics.fp4 import round_e2m1

    return round_e2m1(t)


#: FP4 with no scale but the loss scale: +-{0, 0.5, 1, 1.5, 2, 3, 4, 6}, saturating (E2M1 has no inf);
#: round to nearest even (:class:`Fp4Format` for its stochastic and block-scaled variants). ``dtype``
#: is torch's packed fp4 dtype, which no tensor the emulation rounds has (torch cannot cast to it)
E2M1 = FloatFormat(
    "e2m1", torch.float4_e2m1fn_x2, **RANGES["e2m1"].fields(), saturates=True, rounder=_round_e2m1, overflow="saturate"
)

FORMATS: dict[str, FloatFormat] = {f.name: f for f in (FP16, BF16, E4M3, E4M3_NAN, E5M2, E2M1)}


@dataclass(frozen=True)
class BlockScaledFormat(FloatFormat):
    """Gradients in ``element`` format, each block scaled before the cast and unscaled right after
    (:func:`lossscale_bench.numerics.block_scaling.block_round`): per tensor (``tensor``), 1x128
    tiles (``tile128``, DeepSeek-V3) or 32-element blocks with a power-of-two E8M0 scale (``mx32``,
    OCP Microscaling). How FP8/MX training since 2024 avoids a loss scale. The thresholds of the
    element format hold per block, not on the unscaled values: :meth:`census` counts flushed and
    saturated elements from the round trip itself, and has no subnormal count (-1)."""

    element: str = "e4m3"
    granularity: str = "mx32"
    elementwise: bool = False
    #: mx32's shared-exponent rounding: floor (the spec), ceil (TE's MXFP8: never saturates), even, rceil
    mode: str = "ceil"

    def round(self, t: torch.Tensor) -> torch.Tensor:
        from ..numerics.block_scaling import block_round

        return block_round(t, self.element, self.granularity, **self._mode_kw())

    @property
    def concat_block(self) -> int | None:
        """mx32: 32 (a block is 32 consecutive elements of the flattened tensor, a ragged last block
        zero-padded, which changes no amax); tiles and tensors scale across a row or the whole tensor."""
        return 32 if self.granularity == "mx32" else None

    def census(self, g: torch.Tensor) -> torch.Tensor:
        from ..numerics.block_scaling import block_round

        _, c = block_round(g.detach(), self.element, self.granularity, counts=True, **self._mode_kw())
        return torch.stack([c.nonzero, torch.full_like(c.nonzero, -1), c.flushed, c.saturated])

    def _mode_kw(self) -> dict:
        return {"mode": self.mode} if self.granularity == "mx32" else {}

    @property
    def thresholds(self) -> dict[str, float]:
        return {}


def block_scaled(element: FloatFormat, granularity: str, mode: str = "ceil") -> BlockScaledFormat:
    """``element`` (E4M3, E5M2, fp16) with block scaling of the given granularity."""
    name = f"{element.name}-{granularity}" + (f"-{mode}" if granularity == "mx32" else "")
    base = {k: getattr(element, k) for k in ("dtype", "max", "min_normal", "min_subnormal", "reference_u_min")}
    return BlockScaledFormat(
        name,
        **base,
        saturates=True,
        overflow="saturate",
        element=element.name.split("-")[0],
        granularity=granularity,
        mode=mode,
    )


@dataclass(frozen=True)
class Fp4Format(FloatFormat):
    """E2M1 values with NVFP4 or MXFP4 block scales, or none (``kind`` ``e2m1``), rounded to nearest
    or stochastically (:mod:`lossscale_bench.numerics.fp4`). The range fields are E2M1's: for the
    block formats they hold per block, in the scaled domain, so :meth:`census` counts flushed and
    saturated elements from the round trip itself (no subnormal count: -1), as for MX32.

    ``stream`` hands out the stochastic rounding's keys, seeded from the trial's seed; the census
    rounds to nearest and draws none, so logging a step does not change what the next rounding
    draws. With stochastic rounding the census (the plain format's thresholds included) therefore
    counts what rounding to nearest would flush: the expected share of a value below the smallest
    subnormal 0.5 that flushes is ``1 - |x| / 0.5``, not 0 or 1."""

    kind: str = "e2m1"
    stochastic: bool = False
    #: MXFP4's shared-exponent rounding: floor (the spec), ceil (never saturates), even, rceil
    mode: str = "floor"
    #: NVFP4 weights: 16x16 tiles instead of 1x16 blocks
    weight: bool = False
    stream: object = field(default=None, compare=False, repr=False)

    def round(self, t: torch.Tensor) -> torch.Tensor:
        from ..numerics.fp4 import fp4_round

        return fp4_round(
            t, self.kind, stochastic=self.stochastic, key=self.next_key(), mode=self.mode, weight=self.weight
        )

    def next_key(self):
        return self.stream.next_key() if self.stochastic else None

    def round_each_(self, tensors: list[torch.Tensor], keys: list) -> None:
        """:meth:`FloatFormat.round_each_` through ``fp4_round_each_``: the C loop looked up once for all
        tensors, ~50 us a tensor less dispatch than a ``round`` each, same values."""
        from ..numerics.fp4 import fp4_round_each_

        fp4_round_each_(tensors, keys, self.kind, stochastic=self.stochastic, mode=self.mode, weight=self.weight)

    def census(self, g: torch.Tensor) -> torch.Tensor:
        if self.kind == "e2m1":
            return super().census(g)
        from ..numerics.fp4 import fp4_round

        _, c = fp4_round(g.detach(), self.kind, mode=self.mode, weight=self.weight, counts=True)
        return torch.stack([c.nonzero, torch.full_like(c.nonzero, -1), c.flushed, c.saturated])

    @property
    def thresholds(self) -> dict[str, float]:
        return super().thresholds if self.kind == "e2m1" else {}


def fp4_format(
    kind: str, stochastic: bool = False, mode: str = "floor", weight: bool = False, seed: int = 0
) -> Fp4Format:
    """An FP4 format (``kind`` ``e2m1``, ``nvfp4``, ``mxfp4``), named after what it is
    (``nvfp4-sr``, ``mxfp4-ceil``, ``nvfp4-w16x16``); stochastic ones draw from a stream seeded by ``seed``."""
    from ..numerics.fp4 import Fp4Stream

    name = (
        kind + ("-w16x16" if weight else "") + (f"-{mode}" if kind == "mxfp4" else "") + ("-sr" if stochastic else "")
    )
    return Fp4Format(
        name,
        E2M1.dtype,
        **RANGES["e2m1"].fields(),
        saturates=True,
        overflow="saturate",
        elementwise=kind == "e2m1",
        kind=kind,
        stochastic=stochastic,
        mode=mode,
        weight=weight,
        stream=Fp4Stream(seed) if stochastic else None,
    )
