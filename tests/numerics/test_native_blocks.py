"""The C block round trips (numerics/native.py ``lsb_block_round``, block_scaling.NativeBlock): MX32 with
every element format and scale mode, and the FP4 formats (plain E2M1, MXFP4, NVFP4 in 1x16 blocks and
16x16 weight tiles, nearest and stochastic), value for value and count for count against the eager torch
kernels, which test_block_scaling.py and test_fp4.py check against the formats' definitions.

What the probe cannot show and these do: NaN and inf blocks, tensors so small that NVFP4's tensor scale
clamps, ragged last blocks, channels_last inputs, stochastic rounding's per-element index, and that the
dispatch really takes the C loop (and leaves it when told to)."""

import itertools
import warnings

import pytest
import torch

from lossscale_bench.numerics import block_scaling as bs
from lossscale_bench.numerics import fp4, native
from lossscale_bench.numerics.fp8_formats import E5M2
from lossscale_bench.numerics.lazy_compile import same_values

pytestmark = pytest.mark.skipif(native.library() is None, reason=f"no C kernel here: {native.failure()}")

F32_MAX = torch.finfo(torch.float32).max


def _gradient_like(n: int, seed: int) -> torch.Tensor:
    """Values over ~40 binades, exact zeros, and a few fp32 subnormals and maxima."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, generator=g) * torch.exp2(torch.randint(-40, 12, (n,), generator=g).float())
    x[::37] = 0.0
    x[5::101] = 2.0**-140
    x[7::211] = -F32_MAX
    return x


def _with_non_finite(x: torch.Tensor) -> torch.Tensor:
    x = x.clone()
    x[3] = float("nan")
    x[70] = float("inf")
    x[200] = -float("inf")
    return x


def _tiny(n: int) -> torch.Tensor:
    """A tensor whose amax is below 2^-115: NVFP4's tensor scale clamps to FLT_MAX, its blocks underflow."""
    return torch.randn(n, generator=torch.Generator().manual_seed(9)) * 2.0**-125


def _same(a, b) -> bool:
    return same_values(tuple(a) if isinstance(a, tuple) else a, tuple(b) if isinstance(b, tuple) else b)


def _moderate(n: int, seed: int) -> torch.Tensor:
    """_gradient_like without fp32's maxima: NVFP4's tensor scale then leaves the blocks' scales in E4M3's
    range (with a maximum in the tensor every other block rounds to 0, whatever the element rounding)."""
    x = _gradient_like(n, seed)
    return torch.where(x.abs() < 2.0**64, x, torch.full_like(x, 3.0e4))


INPUTS = {
    "wide": lambda: _gradient_like(32 * 97 + 11, 1),
    "moderate": lambda: _moderate(32 * 97 + 11, 1),
    "non-finite": lambda: _with_non_finite(_gradient_like(32 * 20, 2)),
    "tiny": lambda: _tiny(32 * 8 + 3),
}


@pytest.mark.parametrize(
    "fmt,mode,counts", list(itertools.product(["e4m3", "e5m2", "fp16"], bs.MX_MODES, [False, True]))
)
@pytest.mark.parametrize("inp", list(INPUTS))
def test_mx32_c_loop_equals_the_eager_kernel(fmt, mode, counts, inp):
    x = INPUTS[inp]()
    got = bs.block_round(x, fmt, "mx32", mode=mode, counts=counts)
    assert _same(got, bs.block_round(x, fmt, "mx32", mode=mode, counts=counts, compiled=False))
    assert bs._NATIVE_BLOCKS[("mx32", fmt, mode, counts)]._fn is not None  # the C loop ran


FP4_CASES = [
    (kind, mode, st, counts, weight)
    for kind in fp4.KINDS
    for st in (False, True)
    for counts in (False, True)
    for weight in ((False, True) if kind == "nvfp4" else (False,))
    for mode in (bs.MX_MODES if kind == "mxfp4" else ("floor",))
]


@pytest.mark.parametrize("kind,mode,stochastic,counts,weight", FP4_CASES)
@pytest.mark.parametrize("inp", list(INPUTS))
def test_fp4_c_loop_equals_the_eager_kernel(kind, mode, stochastic, counts, weight, inp):
    x = INPUTS[inp]()
    if weight:  # an [out, in, kh, kw] weight, ragged in both tile dimensions
        x = x.repeat(5)[: 20 * 7 * 3 * 3].view(20, 7, 3, 3)
    key = fp4.Fp4Stream(5).next_key()
    kw = dict(stochastic=stochastic, key=key, mode=mode, weight=weight, counts=counts)
    assert _same(fp4.fp4_round(x, kind, **kw), fp4.fp4_round(x, kind, compiled=False, **kw))
    block = 256 if weight else fp4._BLOCK[kind]
    assert bs._NATIVE_BLOCKS[("fp4", kind, block, mode if kind == "mxfp4" else "", stochastic, counts)]._fn is not None


# H*W not a multiple of the block (the tile transposes: blocks that span rows and channels, a ragged last
# block), planes smaller than a tile (a 3x3 weight gradient's, 2x2), a multiple of 16 only (NVFP4 by columns,
# MX by tiles), and of 32 (every block format by columns), with other channel counts and with 16, 32, 64
CL_SHAPES = [
    (2, 16, 5, 7),
    (3, 13, 11, 9),
    (1, 3, 40, 41),
    (20, 7, 3, 3),
    (5, 24, 2, 2),
    (2, 7, 4, 4),
    (3, 5, 4, 8),
    (2, 19, 8, 12),
    # by columns with the channel counts the loop has as constants (16, 32, 64), for both block sizes
    (2, 16, 4, 8),
    (1, 32, 8, 8),
    (2, 64, 4, 4),
    (1, 64, 8, 4),
    (3, 16, 6, 16),
    (1, 32, 2, 16),
]


@pytest.mark.parametrize("shape", CL_SHAPES)
@pytest.mark.parametrize("values", ["wide", "moderate", "non-finite"])
def test_a_channels_last_gradient_rounds_the_same_and_keeps_its_layout(shape, values):
    # blocks in logical order gathered from channels_last memory; stochastic rounding indexed by the
    # logical position
    n = shape[0] * shape[1] * shape[2] * shape[3]
    flat = {"wide": _gradient_like, "moderate": _moderate}.get(
        values, lambda n, s: _with_non_finite(_gradient_like(n, s))
    )(n, 3)
    x = flat.view(shape).contiguous(memory_format=torch.channels_last)
    key = fp4.Fp4Stream(1).next_key()
    for kind in fp4.KINDS:
        for counts in (False, True):
            got = fp4.fp4_round(x, kind, stochastic=True, key=key, counts=counts)
            want = fp4.fp4_round(x, kind, stochastic=True, key=key, counts=counts, compiled=False)
            g, w = (got[0], want[0]) if counts else (got, want)
            assert g.is_contiguous(memory_format=torch.channels_last)
            assert same_values(g.contiguous(), w.contiguous()), kind
            assert not counts or same_values(tuple(got[1:]), tuple(want[1:])), kind
    for counts in (False, True):
        got = bs.block_round(x, "e4m3", "mx32", counts=counts)
        want = bs.block_round(x, "e4m3", "mx32", counts=counts, compiled=False)
        g, w = (got[0], want[0]) if counts else (got, want)
        assert g.is_contiguous(memory_format=torch.channels_last)
        assert same_values(g.contiguous(), w.contiguous())
        assert not counts or same_values(tuple(got[1:]), tuple(want[1:]))


@pytest.mark.parametrize("shape", [(2, 7, 4, 4), (2, 19, 8, 12)])
def test_channels_last_by_columns_every_mode_and_nearest_rounding(shape):
    # the column pass (H*W a multiple of the block) with every MX scale mode, and nearest rounding
    n = shape[0] * shape[1] * shape[2] * shape[3]
    x = _with_non_finite(_gradient_like(n, 4)).view(shape).contiguous(memory_format=torch.channels_last)
    m = _moderate(n, 4).view(shape).contiguous(memory_format=torch.channels_last)
    for rounding in (False, True):  # NVFP4 on moderate values (module doc of _moderate), both roundings
        kw = dict(stochastic=rounding, key=fp4.Fp4Stream(2).next_key(), counts=True)
        got, want = fp4.fp4_round(m, "nvfp4", **kw), fp4.fp4_round(m, "nvfp4", compiled=False, **kw)
        assert same_values(got[0].contiguous(), want[0].contiguous()) and same_values(got[1:], want[1:])
    for mode in bs.MX_MODES:
        for fmt in ("e4m3", "e5m2"):
            got = bs.block_round(x, fmt, "mx32", mode=mode, counts=True)
            want = bs.block_round(x, fmt, "mx32", mode=mode, counts=True, compiled=False)
            assert same_values(got[0].contiguous(), want[0].contiguous()), (fmt, mode)
            assert same_values(tuple(got[1:]), tuple(want[1:])), (fmt, mode)
        got = fp4.fp4_round(x, "mxfp4", mode=mode, counts=True)
        want = fp4.fp4_round(x, "mxfp4", mode=mode, counts=True, compiled=False)
        assert same_values(got[0].contiguous(), want[0].contiguous()) and same_values(got[1:], want[1:]), mode
    got = fp4.fp4_round(_tiny(n).view(shape).contiguous(memory_format=torch.channels_last), "nvfp4", counts=True)
    want = fp4.fp4_round(
        _tiny(n).view(shape).contiguous(memory_format=torch.channels_last), "nvfp4", counts=True, compiled=False
    )
    assert same_values(got[0].contiguous(), want[0].contiguous()) and same_values(got[1:], want[1:])


def test_the_input_is_never_written_and_grad_is_not_recorded():
    x = _gradient_like(32 * 40, 6).view(4, 10, 4, 8).contiguous(memory_format=torch.channels_last).requires_grad_()
    before = x.detach().clone()
    for y in (
        bs.block_round(x, "e4m3", "mx32"),
        fp4.fp4_round(x, "nvfp4", stochastic=True, key=fp4.Fp4Stream(2).next_key()),
    ):
        assert torch.equal(x.detach(), before) and not y.requires_grad and y.grad_fn is None


def test_turned_off_by_the_environment(monkeypatch):
    x = _gradient_like(640, 4)
    bs.block_round(x, "e4m3", "mx32")
    monkeypatch.setenv(native.NO_NATIVE_ENV, "1")
    assert bs.native_block(("mx32", "e4m3", "floor", False), lambda: None) is None
    monkeypatch.setattr(bs.NativeBlock, "__call__", lambda *a: pytest.fail("the C loop ran while turned off"))
    assert same_values(bs.block_round(x, "e4m3", "mx32"), bs.block_round(x, "e4m3", "mx32", compiled=False))


def test_a_loop_that_fails_its_probe_is_not_used_and_says_why():
    # a real fault: E5M2's parameters handed to a kernel checked against E4M3's eager rounding
    k = bs.NativeBlock(
        1,
        32,
        "floor",
        E5M2,
        False,
        False,
        lambda x: bs._mx_core(x, bs.ELEMENTS["e4m3"], "floor", False, True),
        (bs.PROBE,),
    )
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        assert not k.ready()
    assert "differs from the eager kernel on the probe" in k.broken
    assert any("C block rounding" in str(m.message) for m in w)


# NVFP4's 16x16 weight tiles gathered and scattered in C (NativeBlock.weight_tiles): 2-D and 4-D, contiguous and
# channels_last, ragged in either tile dimension or not, a 1x1 conv (both layouts at once)
WEIGHT_SHAPES = [(20, 7, 3, 3), (64, 64, 3, 3), (16, 8, 1, 1), (33, 5, 1, 3), (17, 29), (32, 48), (3, 2, 5, 5)]


@pytest.mark.parametrize("shape", WEIGHT_SHAPES)
@pytest.mark.parametrize("stochastic,counts", [(False, False), (False, True), (True, True)])
def test_weight_tiles_in_c_equal_the_eager_kernel_and_keep_the_layout(monkeypatch, shape, stochastic, counts):
    n = 1
    for d in shape:
        n *= d
    w = (
        _with_non_finite(_gradient_like(max(n, 256), 8))[:n].view(shape)
        if n >= 256
        else _gradient_like(n, 8).view(shape)
    )
    key = fp4.Fp4Stream(3).next_key()
    fp4.fp4_round(w, "nvfp4", stochastic=stochastic, key=key, weight=True, counts=counts)  # its probe check first
    ran = []
    real = bs.NativeBlock.weight_tiles
    monkeypatch.setattr(bs.NativeBlock, "weight_tiles", lambda self, *a: ran.append(1) or real(self, *a))
    for x in (w, w.contiguous(memory_format=torch.channels_last)) if w.dim() == 4 else (w,):
        kw = dict(stochastic=stochastic, key=key, weight=True, counts=counts)
        got, want = fp4.fp4_round(x, "nvfp4", **kw), fp4.fp4_round(x, "nvfp4", compiled=False, **kw)
        g, v = (got[0], want[0]) if counts else (got, want)
        assert g.stride() == x.stride() and same_values(g.contiguous(), v.contiguous())
        assert not counts or same_values(tuple(got[1:]), tuple(want[1:]))
    assert len(ran) == (2 if w.dim() == 4 else 1), "the C weight tiles did not run"


def test_weight_tiles_that_differ_on_their_probe_are_not_used(monkeypatch):
    # a real fault in the gather (the tiles taken column-major) must be caught by fp4's probe check, warned
    # about once, and leave the layout path's values
    real = bs.NativeBlock.weight_tiles
    monkeypatch.setattr(
        bs.NativeBlock,
        "weight_tiles",
        lambda self, w, key=None: real(self, w.t().contiguous().t() if w.dim() == 2 else w.transpose(2, 3), key),
    )
    monkeypatch.setattr(fp4, "_WEIGHT_TILES_OK", {})
    w = _gradient_like(17 * 29, 9).view(17, 29)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        got = fp4.fp4_round(w, "nvfp4", weight=True)
    assert any("weight tiles differ" in str(m.message) for m in caught)
    assert same_values(got, fp4.fp4_round(w, "nvfp4", weight=True, compiled=False))
    assert list(fp4._WEIGHT_TILES_OK.values()) == [False]
