"""Block-scaled round trips of a gradient: scale each block, cast it, unscale right after.

This is what a block-scaled FP8 gradient dequantises to. Recipes that scale gradients this way
(Transformer Engine's current and block scaling, DeepSeek-V3, OCP Microscaling) need no loss
scale: every block's largest element is moved next to the element format's maximum before the
cast, so underflow only hits elements far below their block's maximum. The emulation applies
:func:`block_round` where it would otherwise apply a plain cast, and the study asks whether a
loss scale still helps on top.

Granularities
-------------
* ``"tensor"``: one scale for the whole tensor, ``s = fmt_max / amax`` (Transformer Engine's
  ``Float8CurrentScaling``); the cast sees ``x * s`` and the result is multiplied by ``1 / s``
  (TE's ``scale_inv``). ``pow2=True`` rounds ``s`` *down* to a power of two, as TE's
  ``Float8BlockScaling`` does (``scale_bits & 0xFF800000``), which makes the round trip exact
  up to the element cast.
* ``"tile128"``: the same rule per 1x128 tile along the last dimension of the tensor viewed as
  ``[rows, cols]`` (all leading dimensions flattened; DeepSeek-V3's activation/gradient tiles,
  TE's ``Float8BlockScaling`` 1D blocks). A ragged last tile is padded with zeros, which cannot
  change its amax, and the padding is dropped afterwards. For an NCHW convolution gradient the
  last dimension is W, so a tile is (part of) one image row. ``pow2`` defaults to True here (TE's
  block-scaling default) and to False for ``"tensor"``.
  As in TE's ``compute_scale_from_amax``: an all-zero group gets ``s = 1``, and an amax so small
  that ``fmt_max / amax`` overflows fp32 gets ``s = FLT_MAX`` (then ``2^127`` with ``pow2``). An
  optional ``amax_floor`` (TE's epsilon, DeepGEMM's ``amax.clamp(1e-4)``) caps ``s``.
* ``"mx32"``: 32 consecutive elements of the flattened tensor share an E8M0 power-of-two scale
  ``X = 2^e`` (OCP Microscaling v1.0, section 6.3). The spec's shared exponent is
  ``e = floor(log2(amax)) - emax_elem`` (``emax_elem`` = 8 for E4M3, 15 for E5M2 and fp16: the
  exponent of the element format's largest binade), clamped to E8M0's range [-127, 127]; the
  elements are ``x / X`` cast with saturation to the element format (the spec clamps normals
  to the element maximum). A ragged last block is zero-padded like a tile. ``mode`` picks how
  ``e`` is rounded, as torchao's ``ScaleCalculationMode`` defines it:

  - ``"floor"``: the spec's rule. **Warning** (FIELD-NOTES, torchao's docs): with a block max
    ``amax = m * 2^k``, ``m`` in [1, 2), the scaled max is ``m * 2^emax_elem``, which exceeds the
    element max (1.75 * 2^8 = 448 for E4M3) whenever ``m > 1.75``, so the block's largest
    gradient elements *saturate*. The spec's rule is not the one to lead with for gradients.
  - ``"ceil"``: ``e = ceil(log2(amax)) - emax_elem``: never saturates, costs one bit of
    resolution at the bottom of blocks whose max is not a power of two.
  - ``"even"``: ``amax`` is first rounded to the element format's precision (round half up on
    its fp32 bits, as torchao does), then the floor rule applies: a block saturates only by what
    rounding would have lost anyway.
  - ``"rceil"``: cuBLAS / TE MXFP8: ``e = ceil(log2(amax / fmt_max))``, the division rounded in
    fp32 (torchao 0.18 divides; TE and later torchao multiply by a rounded reciprocal, which can
    differ by one ulp right at powers of two).

  For every mode, ``e = -127`` uses the scale ``2^-127`` exactly (an fp32 subnormal, exact both
  ways), so blocks of fp32-subnormal or tiny gradients keep what E4M3 can represent. torchao
  0.18 differs there: it quantises such blocks with ``2^-126`` (floor/ceil/even) or ``1``
  (rceil) and dequantises with ``2^-127``, so its outputs for blocks with amax below about
  ``2^-118`` are half or zero; the comparison test skips those blocks and says so.

Zeros, NaN and inf
------------------
Zero blocks stay zero (no 0/0): ``s = 1`` or ``e = -127``. A block (tile, tensor) whose amax is
NaN or inf dequantises to **all NaN**: a non-finite gradient must stay visible to the dynamic
loss scalers, which skip the step and back off on it (the OCP spec likewise gives such a block
the E8M0 NaN scale). TE instead uses ``s = 1`` there, and torchao 0.18's floor mode gives an inf
block a finite scale and saturates the inf away; both would hide an overflow from the scalers.

One more edge: with ``ceil``, ``even``, ``rceil`` and the amax scalings, an element can round
*up* past its block's amax (255.99 -> 256 in E4M3); in a block whose max is within an element ulp
of fp32's largest value that product is 2^128, which is inf in fp32. Dequantised values are
therefore clamped to +-FLT_MAX, so a finite block never produces inf: only NaN/inf inputs do.

Cost: on the CPU, MX32 runs as a C loop (:class:`NativeBlock`, :mod:`.native`) over the tensor as it
lies, contiguous or channels_last, checked bit for bit against the eager kernel on the probe before
first use; elsewhere (CUDA, tiles and tensor scales, ``LSBENCH_NO_NATIVE=1``, no C compiler) vectorised
ops on a ``[n_blocks, block]`` view, compiled lazily by Inductor like the fp8 kernels
(``LSBENCH_NO_COMPILE=1`` or a compiler failure falls back to the same code in eager).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from .block_scales import ELEMENTS, MX_MODES, ElementFormat, amax_scale, exp2i, mx_exponent
from .flush_counts import F32_MAX, FlushSaturate
from .fp8 import fastest_eager, native_fits, round_bits_fused
from .fp8_formats import Fp8Spec
from .layout import is_channels_last
from .lazy_compile import LazyCompiled, same_values
from .native import ProbeChecked
from .native import disabled as native_disabled

__all__ = ["GRANULARITIES", "PROBE", "block_round", "native_block", "native_takes", "NativeBlock"]

GRANULARITIES = ("tensor", "tile128", "mx32")
_BLOCK = {"tile128": 128, "mx32": 32}


def _round_elem(v: torch.Tensor, elem: ElementFormat, eager: bool) -> torch.Tensor:
    """Saturating cast of scaled values to the element format and back to fp32: the bit-level
    rounding when compiled; eager, the fastest exact eager code (see ``fp8``)."""
    if not eager:
        return round_bits_fused(v, elem.spec, True)
    if elem.name == "fp16":
        return v.clamp(-elem.max, elem.max).half().float()
    return fastest_eager(elem.spec)(v, elem.spec, True)


def _counts(x2, out2, scaled, finite, elem) -> FlushSaturate:
    nonzero = (x2 != 0) & (x2.abs() <= F32_MAX)
    return FlushSaturate(nonzero.sum(), (nonzero & (out2 == 0)).sum(), ((scaled.abs() > elem.max) & finite).sum())


def _mx_core(x1, elem: ElementFormat, mode: str, with_counts: bool, eager: bool):
    """MX round trip of a flat fp32 tensor whose length is a multiple of 32."""
    x2 = x1.view(-1, 32)
    amax = x2.abs().amax(dim=1, keepdim=True)
    e = mx_exponent(amax, elem, mode)
    scaled = x2 * exp2i(-e)
    out2 = (_round_elem(scaled, elem, eager) * exp2i(e)).clamp(-F32_MAX, F32_MAX)
    out2 = out2 * ((amax - amax) + 1.0)  # 1 for a finite block, NaN for a NaN/inf block
    if not with_counts:
        return out2.view(-1)
    return out2.view(-1), *_counts(x2, out2, scaled, amax <= F32_MAX, elem)


def _amax_core(x1, block: int, elem: ElementFormat, pow2: bool, amax_floor: float, with_counts: bool, eager: bool):
    """Per-tensor (``block`` 0) or per-tile scaling of a flat fp32 tensor."""
    x2 = x1.view(1, -1) if block == 0 else x1.view(-1, block)
    amax = x2.abs().amax(dim=1, keepdim=True)
    s = amax_scale(amax, elem, pow2, amax_floor)
    scaled = x2 * s
    out2 = (_round_elem(scaled, elem, eager) * torch.reciprocal(s)).clamp(-F32_MAX, F32_MAX)
    out2 = out2 * ((amax - amax) + 1.0)  # 1 for a finite group, NaN for a NaN/inf one
    if not with_counts:
        return out2.view(-1)
    return out2.view(-1), *_counts(x2, out2, scaled, amax <= F32_MAX, elem)


class NativeBlock(ProbeChecked):
    """A block round trip as the C loop ``lsb_block_round`` (:mod:`.native`), for one configuration,
    checked bit for bit (values and counts) against its eager torch kernel on the probe before first use.

    Why: the compiled kernels cost ~0.2 ms of Python and Dynamo per call before they touch an
    element, and a block-scaled row makes ~33 calls a step; and a channels_last gradient (every conv's, on
    the CPU) was copied into logical order for its blocks and back, two passes over memory that cost more
    than the rounding. The C loop takes the tensor as it lies (contiguous, or channels_last: by columns
    where H*W is a multiple of the block, else each image transposed into logical order in 16x16 tiles in a
    per-thread buffer and back; a ragged last block is padded inside),
    and returns a new tensor with the same shape and strides, plus the counts where asked: what the torch
    kernel returns for the flattened, padded tensor, undone. ``kind``: 0 no scale (element-wise, memory
    order), 1 a power-of-two scale per ``block`` (MX, ``mode``), 2 NVFP4's two-level scale.
    ``stochastic``: stochastic E2M1 elements with the call's key (:mod:`.fp4`)."""

    _MODES = {"": 0, "floor": 0, "ceil": 1, "even": 2, "rceil": 3}
    function = "lsb_block_round"

    def __init__(
        self, kind: int, block: int, mode: str, spec: Fp8Spec, stochastic: bool, with_counts: bool, eager, probe: tuple
    ) -> None:
        super().__init__()
        self.kind = kind
        self._args = (
            block,
            kind,
            self._MODES[mode],
            spec.mbits,
            spec.emin,
            spec.emax,
            spec.max,
            spec.max_bits,
            spec.nan_bits,
            int(stochastic),
        )
        self.with_counts = with_counts
        self._eager, self._probe = eager, probe

    def describe(self) -> str:
        return f"block rounding {self._args}"

    def matches_probe(self) -> bool:
        """The probe as it is and without its values past 2^64 (NVFP4's tensor scale follows the largest
        value: with fp32's max in the tensor every other block's E4M3 scale underflows and every other
        output is 0, so the probe alone would not see the elements' rounding); each flat and (scaled kinds)
        as channels_last [n, 8, 4, 8] and [n, 32, 2, 4] images: H*W = 32 takes the loop's channels_last pass
        by columns for 16- and 32-element blocks, H*W = 8 its transposes of planes smaller than a tile
        (a 3x3 weight gradient's), which must agree too; and [1, 16|32|64, 4, 8] images of the probe repeated,
        the by-columns pass the loop compiles for those channel counts."""
        x, *rest = self._probe
        for v in (x, torch.where(x.abs() < 2.0**64, x, torch.zeros_like(x))):
            want = self._eager(v, *rest)
            if not same_values(self(v, *rest), want):
                return False
            if self.kind == 0 or v.numel() % 256:
                continue
            # [16|32|64, 4, 8]: the by-columns pass with the channel counts the loop has as constants (the probe
            # repeated to fill one image; its blocks then repeat too, and so does the tensor's amax)
            for shape in ((8, 4, 8), (32, 2, 4), (16, 4, 8), (32, 4, 8), (64, 4, 8)):
                reps = max(1, shape[0] * shape[1] * shape[2] // v.numel())
                vv = v.repeat(reps)
                ref = want if reps == 1 else self._eager(vv, *rest)
                got = self(vv.view(-1, *shape).contiguous(memory_format=torch.channels_last), *rest)
                got = (got[0].contiguous().view(-1), *got[1:]) if isinstance(got, tuple) else got.contiguous().view(-1)
                if not same_values(got, ref):
                    return False
        return True

    def __call__(self, x: torch.Tensor, key: torch.Tensor | None = None):
        """``x``: fp32 on the CPU, contiguous or channels_last (:func:`native_takes`)."""
        cl = self.kind != 0 and is_channels_last(x)
        _, c, h, w = x.shape if cl else (0, 1, 1, 1)
        return self._run(x, int(cl), c, h, w, key)

    def _run(self, x: torch.Tensor, layout: int, c: int, h: int, w: int, key: torch.Tensor | None):
        """``lsb_block_round`` on ``x`` with its layout code (0 dense, 1 channels_last, 2/3 weight tiles)."""
        y = torch.empty_like(x)
        counts = torch.zeros(3, dtype=torch.int64) if self.with_counts else None
        if self._fn(
            x.data_ptr(),
            y.data_ptr(),
            x.numel(),
            layout,
            c,
            h,
            w,
            *self._args,
            int(key) if key is not None else 0,
            counts.data_ptr() if counts is not None else None,
        ):
            raise MemoryError(f"the C block rounding could not allocate {2 * 4 * x.numel()} bytes")
        return (y, *counts.unbind()) if counts is not None else y

    def weight_tiles(self, w: torch.Tensor, key: torch.Tensor | None = None):
        """NVFP4's 16x16 weight tiles of a 2-D or 4-D ``w`` (fp32 CPU, contiguous or channels_last) as it lies:
        what the configuration (block 256, kind 2) returns for ``fp4._flatten(w, 256, weight=True)``, undone,
        without the layout copies around it (~130 us a weight a step). fp4.py checks it against that
        path on its own probe before using it."""
        c, h, wd = (w.shape[1], w.shape[2], w.shape[3]) if w.dim() == 4 else (w.shape[1], 1, 1)
        return self._run(w, 3 if is_channels_last(w) else 2, c, h, wd, key)


_NATIVE_BLOCKS: dict[tuple, NativeBlock] = {}


def native_block(key: tuple, make) -> NativeBlock | None:
    """The probe-checked C loop stored under ``key`` (``make()`` builds it on first use), or None where
    C kernels are turned off (``LSBENCH_NO_NATIVE``, ``LSBENCH_NO_COMPILE``) or failed."""
    if native_disabled():
        return None
    k = _NATIVE_BLOCKS.get(key)
    if k is None:
        k = _NATIVE_BLOCKS.setdefault(key, make())
    return k if k.ready() else None


def native_takes(x: torch.Tensor) -> bool:
    """A tensor the C loop takes as it lies: fp32 on the CPU, contiguous or channels_last, at a size where
    it beats Inductor's parallel kernel (``fp8.NATIVE_SERIAL_MAX``)."""
    return (
        x.dtype == torch.float32 and (x.is_contiguous() or is_channels_last(x)) and native_fits(x) and x.numel() < 2**31
    )


def _probe_blocks() -> torch.Tensor:
    """256 finite values (8 MX blocks, 2 tiles) the compiled kernels must reproduce exactly
    before use: a zero block, an fp32-subnormal block, blocks whose max saturates under floor,
    a block at fp32's max, and ordinary and fp8 edge values."""

    def block(head: list[float]) -> list[float]:
        return head + [0.0] * (32 - len(head))

    blocks = [
        block([-0.0]),
        block([2.0**-130, -3 * 2.0**-135, 2.0**-140, 2.0**-149]),
        block([1.9, -0.5, 1e-6, 0.01] + [0.25] * 28),
        block([1.95, -0.5, 1e-6, 0.01] + [0.25] * 28),
        block([F32_MAX, -F32_MAX, 1.0, -1e30]),
        (torch.linspace(-3.0, 3.0, 32) * 2.0**-20).tolist(),
        (torch.linspace(-1.0, 1.0, 32) * 1e5).tolist(),
        block([448.0, -448.0, 464.0, 17.0, 19.0, 0.3, 2.0**-9, 1.5 * 2.0**-9, 65504.0, 57344.0]),
    ]
    return torch.tensor(sum(blocks, []), dtype=torch.float32)


PROBE = _probe_blocks()
_KERNELS: dict[tuple, LazyCompiled] = {}


def _kernel(
    granularity: str, elem: ElementFormat, mode: str, pow2: bool, amax_floor: float, with_counts: bool
) -> LazyCompiled:
    """The compiled kernel for one configuration (its own code object: see ``_compile``)."""
    key = (granularity, elem.name, mode, pow2, amax_floor, with_counts)
    k = _KERNELS.get(key)
    if k is not None:
        return k
    if granularity == "mx32":

        def fused(x1):
            return _mx_core(x1, elem, mode, with_counts, False)

        def eager(x1):
            return _mx_core(x1, elem, mode, with_counts, True)

        tag = f"mx32_{elem.name}_{mode}"
    else:
        block = _BLOCK.get(granularity, 0)

        def fused(x1):
            return _amax_core(x1, block, elem, pow2, amax_floor, with_counts, False)

        def eager(x1):
            return _amax_core(x1, block, elem, pow2, amax_floor, with_counts, True)

        tag = f"{granularity}_{elem.name}_{'pow2' if pow2 else 'exact'}_{amax_floor:g}"
    tag += "_counts" if with_counts else ""
    return _KERNELS.setdefault(key, LazyCompiled(fused, tag, eager=eager, probe=(PROBE,)))


def _flatten(x: torch.Tensor, granularity: str) -> tuple[torch.Tensor, tuple[int, int, int]]:
    """fp32, flat, zero-padded to whole blocks; returns the layout needed to undo it."""
    xf = x.detach().to(torch.float32)
    # flat tensors are detached last: a view's ``_base`` makes Dynamo guard on the base's shape
    if granularity == "tensor":
        return xf.reshape(-1).detach(), (0, 0, 0)
    block = _BLOCK[granularity]
    if granularity == "mx32":
        rows, cols = 1, xf.numel()
    else:
        cols = xf.shape[-1] if xf.dim() else 1
        rows = xf.numel() // max(cols, 1)
    x2 = xf.reshape(rows, cols)
    pad = -cols % block
    if pad:
        x2 = F.pad(x2, (0, pad))
    return x2.reshape(-1).detach(), (rows, cols, pad)


def block_round(
    x: torch.Tensor,
    fmt: str = "e4m3",
    granularity: str = "mx32",
    *,
    mode: str | None = None,
    pow2: bool | None = None,
    amax_floor: float = 0.0,
    counts: bool = False,
    compiled: bool | None = None,
):
    """Block-scaled round trip of ``x`` (module doc): what the block-scaled ``fmt`` gradient
    dequantises to, in ``x``'s shape and dtype, with no autograd history.

    ``fmt``: element format, ``"e4m3"``, ``"e5m2"`` or ``"fp16"``; element casts saturate.
    ``granularity``: ``"tensor"``, ``"tile128"`` or ``"mx32"``. ``mode`` (mx32 only; None is
    ``"floor"``, the spec's rule, which saturates block maxima above 1.75 * 2^emax_elem):
    ``"floor"``, ``"ceil"``, ``"even"``, ``"rceil"``. ``pow2`` and ``amax_floor``: tensor and
    tile128 only (``pow2`` None: True for tile128, False for tensor). ``counts``: also return
    :class:`FlushSaturate` counts (flush and saturation judged in the scaled domain the cast
    saw). ``compiled``: False runs the eager kernel; True the compiled one (unless
    ``LSBENCH_NO_COMPILE=1`` or compiling failed, then eager); None: for mx32 on the CPU the C loop
    (:class:`NativeBlock`) where it is available, else compiled where possible; the same values.
    Blocks of fewer than 2 (tensors of fewer than 2 elements) always run eager. fp16/bf16
    inputs are computed in fp32 and rounded back to their dtype.
    """
    if granularity not in GRANULARITIES:
        raise ValueError(f"unknown granularity {granularity!r}; allowed: {', '.join(GRANULARITIES)}")
    if fmt not in ELEMENTS:
        raise ValueError(f"unknown element format {fmt!r}; allowed: {', '.join(ELEMENTS)}")
    if granularity == "mx32":
        mode = "floor" if mode is None else mode
        if mode not in MX_MODES:
            raise ValueError(f"unknown MX scale mode {mode!r}; allowed: {', '.join(MX_MODES)}")
        if pow2 is not None or amax_floor:
            raise ValueError("pow2 and amax_floor apply to the tensor and tile128 granularities")
        pow2 = True
    elif mode is not None:
        raise ValueError("mode applies to the mx32 granularity only")
    elif pow2 is None:
        pow2 = granularity == "tile128"
    elem = ELEMENTS[fmt]
    if x.numel() == 0:
        out = x.detach().clone()
        return (out, FlushSaturate(*(torch.zeros((), dtype=torch.int64) for _ in range(3)))) if counts else out
    k = _kernel(granularity, elem, mode or "", pow2, float(amax_floor), counts)

    def c_loop() -> NativeBlock | None:
        return native_block(
            ("mx32", elem.name, mode, counts),
            lambda: NativeBlock(1, 32, mode, elem.spec, False, counts, k.eager, (PROBE,)),
        )

    if compiled is None and granularity == "mx32" and native_takes(x) and (nk := c_loop()) is not None:
        res = nk(x.detach())  # the tensor as it lies: no flattening, padding or layout copies
        return (res[0], FlushSaturate(*res[1:])) if counts else res
    x1, (rows, cols, pad) = _flatten(x, granularity)
    # Dynamo specialises sizes 0 and 1: a single block (or a 1-element tensor) runs eager
    # rather than costing a second compiled graph
    small = x1.numel() < 2 if granularity == "tensor" else x1.numel() < 2 * _BLOCK[granularity]
    use_compiled = (k.uses_compiled() if compiled is None else compiled) and not small
    # strided or fp16/bf16 inputs, flattened: the C loop still takes the flat copy
    nk = c_loop() if compiled is None and granularity == "mx32" and native_takes(x1) else None
    res = nk(x1) if nk is not None else k(x1) if use_compiled else k.eager(x1)
    out1, extra = (res[0], FlushSaturate(*res[1:])) if counts else (res, None)
    if pad:
        out1 = out1.view(rows, cols + pad)[:, :cols]
    out = out1.reshape(x.shape).to(x.dtype)
    if is_channels_last(x):
        # blocks follow the logical (NCHW) order, so the data went through a copy; handing a
        # channels_last model its layout back costs one copy here instead of conversions in
        # every op after (numerics.layout.memory_order_flat has the measurement)
        out = out.contiguous(memory_format=torch.channels_last)
    return (out, extra) if counts else out
