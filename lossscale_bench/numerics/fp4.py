"""FP4 (E2M1) round trips: the element format alone and its two block-scaled formats.

E2M1 holds +-{0, 0.5, 1, 1.5, 2, 3, 4, 6} and nothing else: no inf, no NaN, one subnormal
(0.5). Three ways of putting a gradient in it, the ones a 4-bit training recipe picks from:

* ``"e2m1"``: the element format alone, no block scale. Whatever keeps gradients inside
  [0.25, 6] must be the loss scale: this is the format that asks "does loss scaling still matter
  at 4 bits" most directly (10 binades: values at or below 0.25 flush, past 6 saturate).
* ``"nvfp4"``: NVIDIA's NVFP4 (Transformer Engine ``NVFP4BlockScaling``; arXiv 2509.25149):
  an fp32 scale per tensor and an E4M3 scale per 16 consecutive elements (``weight=True``:
  per 16x16 tile of the weight viewed as ``[out, in*kh*kw]``, so one quantised weight serves
  the forward and the transposed (dgrad) product). The paper's definition, which this follows
  op for op in fp32 (each op rounded to nearest even)::

      s_enc   = min(448 * 6 / amax(tensor), FLT_MAX)     (1 when amax is 0)
      s_b     = e4m3(amax(block) / 6 * s_enc)            (saturating, round to nearest even)
      x_q     = e2m1(x * min(s_enc / s_b, FLT_MAX))       (saturating at +-6)
      x_out   = x_q * s_b / s_enc

  A block whose ``s_b`` underflows E4M3 (its amax below about 2^-10 / 2688 of the tensor's)
  dequantises to zero, and a tensor whose amax is below about 2^-115 has ``s_enc`` clamped to
  FLT_MAX, so its blocks underflow the same way: the two-level scale cannot follow such tiny
  gradients, which is where a loss scale could still matter. A block max can exceed 6 after
  scaling where ``e4m3`` rounded ``s_b`` down: those elements saturate (counted).
* ``"mxfp4"``: OCP Microscaling v1.0 MXFP4: E2M1 with an E8M0 power-of-two scale per 32
  elements, shared exponent ``floor(log2(amax)) - 2`` (``mode="floor"``, the spec; a block max
  with significand above 1.5 then saturates at 6) or ``ceil(log2(amax)) - 2`` (``"ceil"``, the
  rounded-up variant that never saturates); ``"even"`` and ``"rceil"`` as for MX32
  (:mod:`.block_scaling`, whose exponent code and zero/subnormal rules are reused).

Rounding of the E2M1 elements: to nearest even (``stochastic=False``), or stochastic: a value
between two neighbours ``lo < x < hi`` rounds to ``hi`` with probability ``(x - lo) / (hi -
lo)`` (to 6 past 6), so its expectation is ``x`` itself for ``|x| <= 6`` (in the block formats:
in the scaled domain) up to the random numbers' resolution: 24 bits, a bias of at most
``2^-24 * (hi - lo)`` per element. FP4 training recipes round gradients stochastically (NVIDIA
above; MXFP4 training, arXiv 2502.20586) because rounding to nearest biases the small
contributions of a sum to zero. The random numbers are a counter-based hash of the element's
index and a 64-bit key, computed inside the kernel: the same key gives the same values compiled,
eager or in the C loop, on any device, and nothing touches torch's global generator (a stochastic row draws
no numbers that would shift its seed's data order against a nearest row's).
:class:`Fp4Stream` hands out one key per call from the trial's seed.

NaN and inf: E2M1 has neither. The plain format saturates +-inf to +-6 and keeps NaN as NaN
(a non-finite gradient must stay visible to the scalers that skip on it, as in
:mod:`.block_scaling`); in the block formats a block (NVFP4: the tensor, whose amax sets the
tensor scale) holding NaN or inf dequantises to all NaN.

torchao 0.18 (``torchao.prototype.mx_formats``) implements both block formats; the tests compare
(tests/numerics/test_fp4.py). Where it differs, by design or by bug:

* E2M1 element cast (``f32_to_f4_unpacked``): identical on every finite value and on +-inf
  (+-6); NaN has no E2M1 code and torchao returns +-1.5 for it, we keep NaN.
* MXFP4 (``to_mx`` / ``to_dtype`` with ``float4_e2m1fn_x2``): bit for bit in all four scale
  modes, except (as for MX32, :mod:`.block_scaling`) blocks whose amax is below about 2^-118,
  which torchao quantises with one scale and dequantises with another.
* NVFP4 (``nvfp4_quantize`` with a per-tensor scale): torchao clamps every block scale up to
  E4M3's smallest *normal* 2^-6 (its ``E4M3_EPS`` is ``finfo.tiny``), so blocks whose max is below
  about 2^-15 of the tensor's keep coarse values there, where the definition keeps them in
  E4M3's subnormal scales or flushes them (seen on about 15% of blocks of a wide-range gradient);
  it also dequantises with ``amax / 2688 * s_b`` where the definition divides by
  ``2688 / amax``: the same E4M3 scales and codes elsewhere, values within one fp32 rounding.
"""

from __future__ import annotations

import math
import warnings
from typing import NamedTuple

import torch
import torch.nn.functional as F

from .block_scales import MX_MODES, ElementFormat, exp2i, mx_exponent
from .block_scaling import NativeBlock, native_block, native_takes
from .flush_counts import F32_MAX, FlushSaturate
from .fp8 import round_bits_eager, round_bits_fused, rounding_magic
from .fp8_formats import E4M3, Fp8Spec
from .layout import is_channels_last, memory_order_flat
from .lazy_compile import LazyCompiled, same_values

#: E2M1 described like the fp8 formats, so the bit-level rounding of :mod:`.fp8` applies as it is
#: (its ``dtype`` is only a placeholder: torch has no castable fp4 dtype; no NaN code, see module doc)
E2M1 = Fp8Spec("e2m1", torch.float32, mbits=1, emin=0, emax=2, max=6.0, has_inf=False, nan_bits=0x7FC00000)
E2M1_ELEMENT = ElementFormat("e2m1", E2M1)
#: every non-negative E2M1 value
E2M1_VALUES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)
KINDS = ("e2m1", "nvfp4", "mxfp4")
_BLOCK = {"e2m1": 1, "nvfp4": 16, "mxfp4": 32}
#: NVFP4's tensor-scale numerator: the largest E4M3 scale times the largest E2M1 value
NVFP4_RANGE = 448.0 * 6.0
_M32 = 0xFFFFFFFF


class Fp4Stream:
    """Keys for the stochastic rounding, one per call: ``seed`` (the trial's) and a call counter.

    Reproducible because a trial's calls come in the same order every run (one autograd thread on
    the CPU). Its position is part of a trial's checkpoint (:meth:`state_dict`), so a resumed trial
    draws the keys the uninterrupted one drew.
    """

    def __init__(self, seed: int = 0) -> None:
        self.seed = int(seed)
        self.calls = 0

    def state_dict(self) -> dict[str, int]:
        """The stream's seed and position."""
        return {"seed": self.seed, "calls": self.calls}

    def load_state_dict(self, state: dict[str, int]) -> None:
        """Continue from ``state``; a stream of another seed is refused (it would be another trial's)."""
        if int(state["seed"]) != self.seed:
            raise ValueError(
                f"stochastic-rounding stream of seed {state['seed']} cannot continue a stream of seed {self.seed}"
            )
        self.calls = int(state["calls"])

    def next_key(self) -> torch.Tensor:
        self.calls += 1
        key = (self.seed * 0x9E3779B97F4A7C15 + self.calls * 0xD1B54A32D192ED03) % (1 << 63)
        return torch.tensor(key, dtype=torch.int64)


def _mul32(x: torch.Tensor, c: int) -> torch.Tensor:
    """``x * c mod 2^32`` for int64 ``x`` in [0, 2^32), in two 16-bit halves: no product reaches
    2^63 (a signed overflow the C++ compiler may assume away)."""
    return (x * (c & 0xFFFF) + (((x * (c >> 16)) & 0xFFFF) << 16)) & _M32


def _mix(x: torch.Tensor) -> torch.Tensor:
    """Chris Wellons' ``lowbias32`` integer hash on int64 values in [0, 2^32)."""
    x = x ^ (x >> 16)
    x = _mul32(x, 0x7FEB352D)
    x = x ^ (x >> 15)
    x = _mul32(x, 0x846CA68B)
    return x ^ (x >> 16)


def uniform(n: int, key: torch.Tensor, device=None) -> torch.Tensor:
    """``n`` fp32 values in [0, 1), multiples of 2^-24, from the 64-bit ``key`` (module doc)."""
    i = torch.arange(n, dtype=torch.int64, device=device)
    h = _mix(((i ^ ((key >> 32) & _M32)) + (key & _M32)) & _M32)
    return (h >> 8).to(torch.float32) * 2.0**-24


def _e2m1_nearest(v: torch.Tensor, eager: bool) -> torch.Tensor:
    """Saturating round to nearest even; NaN stays NaN (the bit-level code of :mod:`.fp8`)."""
    return round_bits_eager(v, E2M1, True) if eager else round_bits_fused(v, E2M1, True)


def _e2m1_stochastic(v: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """Stochastic rounding with uniforms ``u`` (module doc). ``q`` is the spacing of E2M1 values
    around ``|v|`` (0.5 below 2, 1 below 4, 2 above), a power of two, so ``|v| / q``, its floor and
    the fraction are exact; inf gives a NaN fraction, never rounds up, and is clamped to 6."""
    a = v.abs()
    q = rounding_magic(a, E2M1) * 2.0**-23
    t = a / q
    f = torch.floor(t)
    r = ((f + ((t - f) > u).to(torch.float32)) * q).clamp(max=E2M1.max)
    return torch.copysign(r, v)


def _elements(v: torch.Tensor, key, stochastic: bool, eager: bool) -> torch.Tensor:
    if not stochastic:
        return _e2m1_nearest(v, eager)
    return _e2m1_stochastic(v, uniform(v.numel(), key, v.device).view(v.shape))


def _counts(x2, out2, scaled, finite) -> FlushSaturate:
    nonzero = (x2 != 0) & (x2.abs() <= F32_MAX)
    return FlushSaturate(nonzero.sum(), (nonzero & (out2 == 0)).sum(), ((scaled.abs() > E2M1.max) & finite).sum())


def _e2m1_core(x1, key, stochastic: bool, with_counts: bool, eager: bool):
    out = _elements(x1, key, stochastic, eager)
    if not with_counts:
        return out
    return out, *_counts(x1, out, x1, x1 == x1)


def _nvfp4_core(x1, key, block: int, stochastic: bool, with_counts: bool, eager: bool):
    """NVFP4 round trip of a flat fp32 tensor of whole ``block``-element groups (module doc)."""
    x2 = x1.view(-1, block)
    amax_b = x2.abs().amax(dim=1, keepdim=True)
    amax = amax_b.amax()
    s_enc = torch.where(amax == 0, 1.0, (torch.full_like(amax, NVFP4_RANGE) / amax).clamp(max=F32_MAX))
    dec = ((amax_b / E2M1.max) * s_enc).clamp(max=F32_MAX)
    s_b = round_bits_eager(dec, E4M3, True) if eager else round_bits_fused(dec, E4M3, True)
    scaled = x2 * (s_enc / s_b).clamp(max=F32_MAX)
    out2 = (_elements(scaled, key, stochastic, eager) * s_b) / s_enc
    out2 = out2 * ((amax - amax) + 1.0)  # 1 for a finite tensor, NaN if any element is NaN or inf
    if not with_counts:
        return out2.view(-1)
    # a block whose E4M3 scale underflowed is flushed, not saturated (its encode scale is FLT_MAX)
    return out2.view(-1), *_counts(x2, out2, scaled, (amax <= F32_MAX) & (s_b > 0))


def _mxfp4_core(x1, key, mode: str, stochastic: bool, with_counts: bool, eager: bool):
    """MXFP4 round trip of a flat fp32 tensor of whole 32-element blocks."""
    x2 = x1.view(-1, 32)
    amax = x2.abs().amax(dim=1, keepdim=True)
    e = mx_exponent(amax, E2M1_ELEMENT, mode)
    scaled = x2 * exp2i(-e)
    out2 = (_elements(scaled, key, stochastic, eager) * exp2i(e)).clamp(-F32_MAX, F32_MAX)
    out2 = out2 * ((amax - amax) + 1.0)  # NaN for a block holding NaN or inf
    if not with_counts:
        return out2.view(-1)
    return out2.view(-1), *_counts(x2, out2, scaled, amax <= F32_MAX)


def _probe() -> tuple[torch.Tensor, torch.Tensor]:
    """512 finite values a compiled kernel must round like the eager one before use: every E2M1
    value and its midpoints at several scales, a zero block, fp32 subnormals, fp32's max, values
    whose scaled block max saturates, and random values; and one key for the stochastic kernels."""
    grid = torch.tensor(E2M1_VALUES + (0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, 7.0))
    hand = torch.cat(
        [
            grid,
            -grid,
            grid * 2.0**-20,
            grid * 1e6,
            torch.zeros(32),
            torch.tensor([2.0**-130, -3 * 2.0**-140, 2.0**-149, F32_MAX, -F32_MAX, 1.0]),
            torch.tensor([1.75, 0.3, -0.1] * 10),
        ]
    )
    rand = torch.randn(512 - hand.numel(), generator=torch.Generator().manual_seed(4)) * 3.0
    return torch.cat([hand, rand]).float(), torch.tensor(0x123456789ABCDEF, dtype=torch.int64)


PROBE = _probe()
_KERNELS: dict[tuple, LazyCompiled] = {}


def _kernel(kind: str, block: int, mode: str, stochastic: bool, with_counts: bool) -> LazyCompiled:
    """The lazily compiled kernel of one configuration (its own code object: see ``_compile``)."""
    key = (kind, block, mode, stochastic, with_counts)
    k = _KERNELS.get(key)
    if k is not None:
        return k

    def run(x1, seed, eager):
        if kind == "nvfp4":
            return _nvfp4_core(x1, seed, block, stochastic, with_counts, eager)
        if kind == "mxfp4":
            return _mxfp4_core(x1, seed, mode, stochastic, with_counts, eager)
        return _e2m1_core(x1, seed, stochastic, with_counts, eager)

    def fused(x1, seed):
        return run(x1, seed, False)

    def eager(x1, seed):
        return run(x1, seed, True)

    tag = f"{kind}{block}_{mode or 'x'}_{'sr' if stochastic else 'rne'}{'_counts' if with_counts else ''}"
    return _KERNELS.setdefault(key, LazyCompiled(fused, tag, eager=eager, probe=PROBE))


class Layout(NamedTuple):
    """How a tensor was flattened into whole blocks, to undo it."""

    shape: torch.Size
    rows: int
    cols: int
    tiles16: bool
    #: element-wise rounding in memory order: the inverse of layout.memory_order_flat
    unflatten: object


def _flatten(x: torch.Tensor, block: int, weight: bool) -> tuple[torch.Tensor, Layout]:
    """fp32, flat, zero-padded to whole blocks (zeros cannot change an amax). 1-D blocks take
    consecutive elements in logical order (as MX32 does); ``weight`` lays 16x16 tiles of the
    ``[out, rest]`` view out one after another."""
    xf = x.detach().to(torch.float32)
    if block == 1:  # element-wise: memory order, no layout copy of a channels_last tensor (layout.memory_order_flat)
        flat, unflatten = memory_order_flat(xf)
        return flat.contiguous().detach(), Layout(x.shape, 0, flat.numel(), False, unflatten)
    if not weight:
        flat = xf.reshape(-1)
        pad = -flat.numel() % block
        return (F.pad(flat, (0, pad)) if pad else flat).detach(), Layout(x.shape, 1, flat.numel(), False, None)
    rows = xf.shape[0] if xf.dim() else 1
    cols = xf.numel() // max(rows, 1)
    x2 = F.pad(xf.reshape(rows, cols), (0, -cols % 16, 0, -rows % 16))
    r, c = x2.shape
    tiles = x2.view(r // 16, 16, c // 16, 16).permute(0, 2, 1, 3).reshape(-1)
    return tiles.detach(), Layout(x.shape, rows, cols, True, None)


def _unflatten(out1: torch.Tensor, lay: Layout) -> torch.Tensor:
    if lay.unflatten is not None:
        return lay.unflatten(out1)
    if not lay.tiles16:
        return out1[: lay.cols].reshape(lay.shape)
    r, c = lay.rows + (-lay.rows % 16), lay.cols + (-lay.cols % 16)
    x2 = out1.view(r // 16, c // 16, 16, 16).permute(0, 2, 1, 3).reshape(r, c)
    return x2[: lay.rows, : lay.cols].reshape(lay.shape)


def fp4_round(
    x: torch.Tensor,
    kind: str = "nvfp4",
    *,
    stochastic: bool = False,
    key: torch.Tensor | None = None,
    mode: str = "floor",
    weight: bool = False,
    counts: bool = False,
    compiled: bool | None = None,
):
    """FP4 round trip of ``x`` (module doc): ``kind`` ``"e2m1"``, ``"nvfp4"`` or ``"mxfp4"``; in
    ``x``'s shape, dtype and layout, no autograd history. ``stochastic``: stochastic rounding of
    the elements with the 0-d int64 ``key`` (:class:`Fp4Stream`; required then). ``mode``: the
    MXFP4 shared-exponent rounding (``floor`` is the spec). ``weight``: NVFP4's 16x16 tiles.
    ``counts``: also return :class:`~.flush_counts.FlushSaturate` counts, flush and saturation
    judged in the scaled domain the E2M1 cast saw. ``compiled`` as in ``block_round``; None (the default)
    on the CPU runs the C loop (:class:`~.block_scaling.NativeBlock`) where it is available, same values."""
    if kind not in KINDS:
        raise ValueError(f"unknown FP4 format {kind!r}; allowed: {', '.join(KINDS)}")
    if kind == "mxfp4" and mode not in MX_MODES:
        raise ValueError(f"unknown MX scale mode {mode!r}; allowed: {', '.join(MX_MODES)}")
    if weight and kind != "nvfp4":
        raise ValueError("16x16 weight tiles are NVFP4's only")
    if stochastic and key is None:
        raise ValueError("stochastic rounding needs a key (Fp4Stream.next_key())")
    if x.numel() == 0:
        out = x.detach().clone()
        return (out, FlushSaturate(*(torch.zeros((), dtype=torch.int64) for _ in range(3)))) if counts else out
    block = 256 if weight else _BLOCK[kind]
    mode = mode if kind == "mxfp4" else ""
    k = _kernel(kind, block, mode, stochastic, counts)
    seed = key if key is not None else PROBE[1]

    if (
        compiled is None
        and not weight
        and native_takes(x)
        and (nk := _c_loop(kind, block, mode, stochastic, counts)) is not None
    ):
        res = nk(x.detach(), seed)  # the tensor as it lies: no flattening, padding or layout copies
        return (res[0], FlushSaturate(*res[1:])) if counts else res
    if (
        weight
        and compiled is None
        and x.dim() in (2, 4)
        and native_takes(x)
        and (nk := _c_loop(kind, block, mode, stochastic, counts)) is not None
        and _weight_tiles_ok(nk)
    ):
        res = nk.weight_tiles(x.detach(), seed)  # the tiles gathered and scattered in C: no layout copies
        return (res[0], FlushSaturate(*res[1:])) if counts else res
    x1, lay = _flatten(x, block, weight)
    seed = seed.to(x1.device)
    # Dynamo specialises sizes 0 and 1: a single block runs eager instead of a second graph
    small = x1.numel() < 2 * block
    # NVFP4's 16x16 weight tiles, laid out
    nk = _c_loop(kind, block, mode, stochastic, counts) if compiled is None and native_takes(x1) else None
    if nk is not None:
        res = nk(x1, seed)
    else:
        res = k(x1, seed) if (k.uses_compiled() if compiled is None else compiled) and not small else k.eager(x1, seed)
    out1, extra = (res[0], FlushSaturate(*res[1:])) if counts else (res, None)
    out = _unflatten(out1, lay).to(x.dtype)
    if is_channels_last(x) and not out.is_contiguous(memory_format=torch.channels_last):  # its layout back
        out = out.contiguous(memory_format=torch.channels_last)
    return (out, extra) if counts else out


#: id(NativeBlock) -> whether its weight_tiles matched the flattening path on the probe weights
_WEIGHT_TILES_OK: dict[int, bool] = {}


def _weight_tiles_ok(nk: NativeBlock) -> bool:
    """Whether ``nk.weight_tiles`` gives what the layout path (``_flatten``, the same C loop, ``_unflatten``)
    gives, bit for bit with its counts, on weights made of the probe values: 2-D and 4-D, contiguous and
    channels_last, sizes that are and are not multiples of 16. Checked once per configuration; a failure
    warns once and keeps the layout path."""
    ok = _WEIGHT_TILES_OK.get(id(nk))
    if ok is None:
        x, key = PROBE
        v = torch.cat([x, torch.where(x.abs() < 2.0**64, x, torch.zeros_like(x))])
        ok = True
        for shape in ((20, 3, 3, 3), (16, 8, 2, 2), (33, 5, 1, 3), (17, 29), (32, 16)):
            n = math.prod(shape)
            w = v.repeat(n // v.numel() + 1)[:n].reshape(shape)
            for layout in (w, w.contiguous(memory_format=torch.channels_last)) if w.dim() == 4 else (w,):
                got = nk.weight_tiles(layout, key)
                x1, lay = _flatten(layout, 256, True)
                res = nk(x1, key)
                want = (_unflatten(res[0], lay), *res[1:]) if isinstance(res, tuple) else _unflatten(res, lay)
                pairs = zip(got, want) if isinstance(got, tuple) else [(got, want)]
                ok = ok and all(a.shape == b.shape and same_values(a.contiguous(), b.contiguous()) for a, b in pairs)
        _WEIGHT_TILES_OK[id(nk)] = ok
        if not ok:
            warnings.warn(
                "lossscale_bench.numerics: the C NVFP4 weight tiles differ from the layout path on the "
                "probe weights; using the layout path (same results)",
                RuntimeWarning,
                stacklevel=3,
            )
    return ok


def _c_loop(kind: str, block: int, mode: str, stochastic: bool, counts: bool) -> NativeBlock | None:
    """The probe-checked C loop of one FP4 configuration (``mode`` "" but for MXFP4), or None."""
    return native_block(
        ("fp4", kind, block, mode, stochastic, counts),
        lambda: NativeBlock(
            ("e2m1", "mxfp4", "nvfp4").index(kind),
            block,
            mode,
            E2M1,
            stochastic,
            counts,
            _kernel(kind, block, mode, stochastic, counts).eager,
            PROBE,
        ),
    )


def fp4_round_each_(
    xs: list[torch.Tensor],
    keys: list,
    kind: str = "nvfp4",
    *,
    stochastic: bool = False,
    mode: str = "floor",
    weight: bool = False,
) -> None:
    """``x.copy_(fp4_round(x, kind, key=keys[i], ...))`` for every ``xs[i]``, the same values, with the C
    loop looked up once: what a backward's parameter gradients cost in dispatch (``fp4_round``'s checks
    and lookups, ~40 us a call) is paid once, not per tensor. Tensors the loop does not take go through
    ``fp4_round``."""
    nk = None
    if not weight and xs and (kind in KINDS) and (kind != "mxfp4" or mode in MX_MODES):
        nk = _c_loop(kind, _BLOCK[kind], mode if kind == "mxfp4" else "", stochastic, False)
    for x, key in zip(xs, keys):
        if stochastic and key is None:
            raise ValueError("stochastic rounding needs a key (Fp4Stream.next_key())")
        if nk is not None and x.numel() and native_takes(x):
            x.copy_(nk(x.detach(), key if key is not None else PROBE[1]))
        else:
            x.copy_(fp4_round(x, kind, stochastic=stochastic, key=key, mode=mode, weight=weight))


def round_e2m1(x: torch.Tensor, stochastic: bool = False, key: torch.Tensor | None = None) -> torch.Tensor:
    """``x`` rounded to E2M1 and back, no scale: saturating at +-6 (inf too), NaN stays NaN."""
    return fp4_round(x, "e2m1", stochastic=stochastic, key=key)
