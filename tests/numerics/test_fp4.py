"""FP4 round trips against the formats' definitions written out here in plain Python.

E2M1 is the list of its 8 magnitudes: nearest value, ties to the even code (the code whose
mantissa bit is 0), +-6 past 6. NVFP4 is the definition in arXiv 2509.25149 (numerics.fp4's
module doc) op by op in Python floats rounded to fp32 with ``struct``, the E4M3 block scale by
torch's own cast of one value; MXFP4 is OCP MX v1.0's shared exponent and saturating element
cast. Stochastic rounding is tested statistically: its mean over many keys is the input.
"""

from __future__ import annotations

import math

import pytest
import torch

from lossscale_bench.numerics import lazy_compile
from lossscale_bench.numerics.fp4 import E2M1_VALUES, Fp4Stream, _kernel, fp4_round, round_e2m1, uniform

FLT_MAX = 3.4028234663852886e38
GRID = list(E2M1_VALUES)


def f32(v: float) -> float:
    """``v`` rounded to fp32 (to nearest even; inf past fp32's range)."""
    return torch.tensor(v, dtype=torch.float64).float().item()


def f32_sat(v: float) -> float:
    """A dequantised value: fp32, clamped to +-FLT_MAX (as block_scaling's and fp4's cores do)."""
    return math.copysign(FLT_MAX, v) if abs(v) > FLT_MAX else f32(v)


def e2m1_ref(v: float) -> float:
    """Nearest E2M1 value, ties to the even code, saturating at 6 (inf too), NaN stays NaN."""
    if math.isnan(v):
        return math.nan
    a = min(abs(v), 6.0)
    best = min(range(8), key=lambda i: (abs(GRID[i] - a), i % 2))  # distance, then the even code
    return math.copysign(GRID[best], v)


def e4m3_ref(v: float) -> float:
    return torch.tensor([min(v, 448.0)], dtype=torch.float32).to(torch.float8_e4m3fn).item()


def nvfp4_ref(x: list[float], block: int = 16) -> list[float]:
    """The paper's NVFP4 definition on a flat list (whole blocks; tensor scale from all of it)."""
    amax = max(abs(v) for v in x)
    if not math.isfinite(amax):
        return [math.nan] * len(x)
    s_enc = 1.0 if amax == 0 else min(f32(448.0 * 6.0 / amax), FLT_MAX)
    out = []
    for i in range(0, len(x), block):
        blk = x[i : i + block]
        dec = min(f32(f32(max(abs(v) for v in blk) / 6.0) * s_enc), FLT_MAX)
        s_b = e4m3_ref(dec)
        enc = FLT_MAX if s_b == 0 else min(f32(s_enc / s_b), FLT_MAX)
        out += [f32(f32(e2m1_ref(f32(v * enc)) * s_b) / s_enc) for v in blk]
    return out


def floor_log2(a: float) -> int:
    return math.frexp(a)[1] - 1


def mxfp4_ref(x: list[float], mode: str) -> list[float]:
    out = []
    for i in range(0, len(x), 32):
        blk = x[i : i + 32]
        amax = max(abs(v) for v in blk)
        if not math.isfinite(amax):
            out += [math.nan] * 32
            continue
        if amax == 0:
            e = -127
        else:
            m, ex = math.frexp(amax)
            e = (floor_log2(amax) if mode == "floor" else (ex - 1 if m == 0.5 else ex)) - 2
        e = max(-127, min(127, e))
        out += [f32_sat(e2m1_ref(f32(v * 2.0**-e)) * 2.0**e) for v in blk]
    return out


def same(a: torch.Tensor, b) -> bool:
    b = b if isinstance(b, torch.Tensor) else torch.tensor(b, dtype=torch.float32)
    return lazy_compile.same_values(a.float().reshape(-1), b.float().reshape(-1))


# --- E2M1 --------------------------------------------------------------------------------------


def test_every_e2m1_code_is_kept_and_the_ties_go_to_the_even_code():
    codes = GRID + [-v for v in GRID]
    assert same(round_e2m1(torch.tensor(codes)), codes)  # -0.0 stays -0.0
    ties = [0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0]
    assert round_e2m1(torch.tensor(ties)).tolist() == [0.0, 1.0, 1.0, 2.0, 2.0, 4.0, 4.0]
    above = torch.nextafter(torch.tensor(ties), torch.tensor(9.0))  # the next fp32 up
    assert round_e2m1(above).tolist() == [0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0]


def test_e2m1_saturates_past_six_and_keeps_nan():
    x = torch.tensor([6.0, 6.5, 7.0, 8.0, 1e30, FLT_MAX, math.inf, -math.inf, -7.0, math.nan, -math.nan])
    y = round_e2m1(x)
    assert y[:9].tolist() == [6.0] * 7 + [-6.0, -6.0]
    assert torch.isnan(y[9:]).all()


@pytest.mark.parametrize("compiled", [False, True])
def test_e2m1_matches_the_definition_on_random_and_tiny_values(compiled):
    g = torch.Generator().manual_seed(0)
    x = torch.cat(
        [
            torch.randn(3000, generator=g) * 4,
            torch.randn(500, generator=g) * 2.0**-100,
            torch.tensor([2.0**-149, -(2.0**-126), 0.25000003, 0.24999999]),
        ]
    )
    out = fp4_round(x, "e2m1", compiled=compiled)
    assert same(out, [e2m1_ref(v) for v in x.tolist()])


def test_e2m1_range_is_the_one_validation_uses():
    from lossscale_bench.core.float_ranges import RANGES

    r = RANGES["e2m1"]
    assert (r.max, r.min_normal, r.min_subnormal) == (max(GRID), 1.0, min(v for v in GRID if v > 0))


# --- NVFP4 -------------------------------------------------------------------------------------


def _nvfp4_cases() -> dict[str, list[float]]:
    g = torch.Generator().manual_seed(1)
    wide = (torch.randn(256, generator=g) * torch.exp(torch.randn(256, generator=g) * 3)).tolist()
    return {
        "random": wide,
        "all zero": [0.0] * 32,
        "zero block among others": [0.0] * 16 + [1.0, -3.0] + [0.5] * 14,
        # the E4M3 scale rounds down (amax 6.9 / 6 * s_enc): the block max saturates at 6 after scaling
        "block max past six": [1000.0] + [0.0] * 15 + [6.2 * 6.0 / 2.688] + [2.0] * 15,
        "tiny next to huge": [1e4] + [0.0] * 15 + [1e-6, 3e-7] + [0.0] * 14,
        "fp32 subnormals only": [2.0**-140, -3 * 2.0**-145] + [0.0] * 14,
        "near fp32 max": [FLT_MAX, -FLT_MAX / 3] + [1.0] * 14,
    }


@pytest.mark.parametrize("case", list(_nvfp4_cases()))
def test_nvfp4_matches_the_definition(case):
    x = _nvfp4_cases()[case]
    assert same(fp4_round(torch.tensor(x), "nvfp4", compiled=False), nvfp4_ref(x))


def test_nvfp4_documented_edges():
    cases = _nvfp4_cases()
    assert fp4_round(torch.tensor(cases["fp32 subnormals only"]), "nvfp4").abs().sum() == 0  # s_enc capped
    out, c = fp4_round(torch.tensor(cases["block max past six"]), "nvfp4", counts=True)
    assert c.saturated.item() >= 1 and (c.nonzero.item(), c.flushed.item()) == (17, 0)
    assert fp4_round(torch.tensor(cases["tiny next to huge"]), "nvfp4")[16:18].abs().sum() == 0  # s_b underflows
    for bad in (math.inf, math.nan):
        assert torch.isnan(fp4_round(torch.tensor([1.0, bad] + [0.0] * 30), "nvfp4")).all()


def test_nvfp4_weight_tiles_are_16x16():
    """One tile's scale is set by its own 16x16 maximum: a large value in one tile leaves the
    neighbouring tile (same rows, next 16 columns) exact."""
    w = torch.full((16, 32), 0.5)
    w[3, 5] = 2688.0  # the tensor scale is 1; this tile's E4M3 scale 448 flushes its 0.5s
    w[:, 16:] = 0.375  # 0.375 = 6 * 2^-4: exact in its own tile (scale 2^-4)
    out = fp4_round(w, "nvfp4", weight=True)
    assert torch.equal(out[:, 16:], w[:, 16:]) and out[:, :16].abs().sum() == 2688.0
    tile = w.reshape(1, 16, 2, 16).permute(0, 2, 1, 3).reshape(-1)
    assert same(out, torch.tensor(nvfp4_ref(tile.tolist(), 256)).view(2, 16, 16).permute(1, 0, 2).reshape(16, 32))
    w4 = torch.randn(20, 5, 3, 3, generator=torch.Generator().manual_seed(9))  # ragged: [20, 45] padded to [32, 48]
    padded = torch.nn.functional.pad(w4.reshape(20, 45), (0, 3, 0, 12))
    ref = torch.tensor(nvfp4_ref(padded.view(2, 16, 3, 16).permute(0, 2, 1, 3).reshape(-1).tolist(), 256))
    ref = ref.view(2, 3, 16, 16).permute(0, 2, 1, 3).reshape(32, 48)[:20, :45].reshape(w4.shape)
    assert same(fp4_round(w4, "nvfp4", weight=True), ref)


# --- MXFP4 -------------------------------------------------------------------------------------


@pytest.mark.parametrize("mode", ["floor", "ceil"])
def test_mxfp4_matches_the_spec(mode):
    g = torch.Generator().manual_seed(2)
    blocks = [
        [0.0] * 32,
        [2.0**-130, -(2.0**-140)] + [0.0] * 30,
        [1.75 * 8, 1.0] + [0.1] * 30,
        [FLT_MAX, 1.0] + [0.0] * 30,
        [6.0, -6.0] + [0.0] * 30,
    ]
    x = (
        sum(blocks, [])
        + (torch.randn(32 * 40, generator=g) * torch.exp(torch.randn(32 * 40, generator=g) * 3)).tolist()
    )
    assert same(fp4_round(torch.tensor(x), "mxfp4", mode=mode, compiled=False), mxfp4_ref(x, mode))
    _, c = fp4_round(torch.tensor(blocks[2]), "mxfp4", mode=mode, counts=True)
    assert c.saturated.item() == (1 if mode == "floor" else 0)  # 1.75 * 2^3 scaled to 7 by the spec's floor


def test_mxfp4_nan_and_inf_blocks_are_nan():
    x = torch.tensor([1.0, math.inf] + [0.0] * 30 + [1.0] * 32)
    out = fp4_round(x, "mxfp4")
    assert torch.isnan(out[:32]).all() and torch.equal(out[32:], x[32:])


# --- stochastic rounding -----------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["e2m1", "nvfp4", "mxfp4"])
def test_stochastic_rounding_is_unbiased_and_reproducible(kind):
    """Over 4000 keys the mean of each element is the element: within 6 standard errors of the
    draw (each draw is within one E2M1 spacing ``q`` of the value, so its standard deviation is at
    most ``q / 2``) plus the bias the 24-bit random numbers allow (``2^-24 q``), ``q`` scaled back
    by the block's scale. Each draw is one of the value's two neighbours."""
    g = torch.Generator().manual_seed(3)
    x = (torch.rand(64, generator=g) * 5.5 + 0.01) * torch.where(torch.rand(64, generator=g) < 0.5, -1.0, 1.0)
    x[::16] = 5.9  # every block's max: no block scale rounds down, so nothing saturates (which would bias)
    nearest = fp4_round(x, kind)
    n = 4000
    stream = Fp4Stream(7)
    draws = torch.stack([fp4_round(x, kind, stochastic=True, key=stream.next_key()) for _ in range(n)])
    spacing = (draws.max(0).values - draws.min(0).values).clamp(min=1e-30)  # the neighbours' distance
    assert ((draws == draws.max(0).values) | (draws == draws.min(0).values)).all()
    assert ((nearest == draws.max(0).values) | (nearest == draws.min(0).values)).all()
    err = (draws.double().mean(0) - x.double()).abs()
    assert (err <= 6 * spacing / 2 / math.sqrt(n) + spacing * 2.0**-24 + 1e-6 * x.abs()).all(), err.max()
    key = torch.tensor(12345)
    assert torch.equal(fp4_round(x, kind, stochastic=True, key=key), fp4_round(x, kind, stochastic=True, key=key))


def test_stochastic_rounding_of_a_value_below_the_subnormal_keeps_it_in_expectation():
    """0.1 flushes to 0 when rounded to nearest; stochastically it is 0.5 with probability 0.2."""
    x = torch.full((200_000,), 0.1)
    y = round_e2m1(x, stochastic=True, key=torch.tensor(99))
    assert set(y.unique().tolist()) == {0.0, 0.5} and abs(y.mean().item() - 0.1) < 6 * 0.2 / math.sqrt(2e5)


def test_uniform_numbers_are_uniform_and_key_dependent():
    u = uniform(1 << 16, torch.tensor(1))
    assert u.min() >= 0 and u.max() < 1 and abs(u.mean().item() - 0.5) < 0.01
    assert torch.histc(u, 16, 0, 1).min() > (1 << 16) / 16 * 0.9
    assert not torch.equal(u, uniform(1 << 16, torch.tensor(2)))
    s1, s2 = Fp4Stream(0), Fp4Stream(0)
    assert [s1.next_key().item() for _ in range(3)] == [s2.next_key().item() for _ in range(3)]
    assert Fp4Stream(1).next_key().item() != Fp4Stream(0).next_key().item()


def test_stochastic_rounding_needs_a_key_and_formats_are_checked():
    with pytest.raises(ValueError, match="key"):
        fp4_round(torch.ones(4), "e2m1", stochastic=True)
    with pytest.raises(ValueError, match="FP4 format"):
        fp4_round(torch.ones(4), "fp4")
    with pytest.raises(ValueError, match="16x16"):
        fp4_round(torch.ones(4), "mxfp4", weight=True)
    assert fp4_round(torch.empty(0, 3), "nvfp4").shape == (0, 3)


# --- compiled kernels: the same values as eager ------------------------------------------------


@pytest.mark.parametrize("kind,stochastic", [("nvfp4", True), ("mxfp4", False)])
def test_compiled_kernel_equals_eager(kind, stochastic, monkeypatch):
    monkeypatch.delenv(lazy_compile.NO_COMPILE_ENV, raising=False)
    g = torch.Generator().manual_seed(5)
    x = torch.randn(8, 16, 12, 12, generator=g) * torch.exp(torch.randn(8, 1, 1, 1, generator=g) * 4)
    # a large value, not 1e30: NVFP4's tensor scale follows the tensor's max, and next to 1e30 every other
    # block's E4M3 scale underflows and rounds it to 0, whatever the kernel does with the elements
    x[0, 0, 0, :3] = torch.tensor([0.0, 2.0**-140, 1e4])
    key = torch.tensor(77)
    got = fp4_round(x, kind, stochastic=stochastic, key=key, counts=True, compiled=True)
    want = fp4_round(x, kind, stochastic=stochastic, key=key, counts=True, compiled=False)
    k = _kernel(kind, 16 if kind == "nvfp4" else 32, "floor" if kind == "mxfp4" else "", stochastic, True)
    assert k.broken is None and k.graphs >= 1
    assert same(got[0], want[0]) and [int(v) for v in got[1]] == [int(v) for v in want[1]]


# --- torchao (optional): the maintained implementation -----------------------------------------


def _torchao(module: str):
    return pytest.importorskip(
        f"torchao.prototype.mx_formats.{module}",
        reason="torchao is not installed (optional: pip install torchao==0.18.0)",
    )


@pytest.mark.parametrize("mode", ["floor", "ceil", "even", "rceil"])
def test_mxfp4_matches_torchao(mode):
    """Bit for bit on every finite block except those torchao 0.18 scales with 2^-126 or 1 while
    dequantising with 2^-127 (amax below about 2^-118: see block_scaling's module doc)."""
    mx = _torchao("mx_tensor")
    from torchao.prototype.mx_formats.config import ScaleCalculationMode

    g = torch.Generator().manual_seed(6)
    x = torch.randn(32 * 2000, generator=g) * torch.exp(torch.randn(32 * 2000, generator=g) * 3)
    scale, data = mx.to_mx(x.view(-1, 32), torch.float4_e2m1fn_x2, 32, ScaleCalculationMode(mode))
    theirs = mx.to_dtype(data, scale, torch.float4_e2m1fn_x2, 32, torch.float32).view(-1, 32)
    ours = fp4_round(x, "mxfp4", mode=mode).view(-1, 32)
    assert same(ours, theirs)


def test_e2m1_matches_torchao():
    """torchao's element cast agrees on every finite value (it has no NaN: it gives a code for NaN
    inputs, which we keep as NaN instead; module doc of numerics.fp4)."""
    k = _torchao("kernels")
    g = torch.Generator().manual_seed(7)
    x = torch.cat(
        [torch.tensor(GRID + [0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, 7.0, 1e9]), torch.randn(5000, generator=g) * 3]
    )
    x = torch.cat([x, -x])
    assert same(round_e2m1(x), k.f4_unpacked_to_f32(k.f32_to_f4_unpacked(x)))


def test_nvfp4_differs_from_torchao_only_where_documented():
    """torchao 0.18's ``nvfp4_quantize`` with a per-tensor scale: the same E4M3 block scales
    wherever ours is at least E4M3's smallest normal 2^-6 (torchao clamps smaller block scales up
    to 2^-6, keeping such blocks coarsely where ours keeps them in E4M3 subnormals or flushes
    them), and there the same values up to one fp32 rounding of the dequantisation (it multiplies
    by ``amax / 2688 * s_b``, the definition divides by ``2688 / amax``)."""
    nv = _torchao("nvfp4_tensor")
    k = _torchao("kernels")
    g = torch.Generator().manual_seed(8)
    x = torch.randn(1024, 64, generator=g) * torch.exp(torch.randn(1024, 1, generator=g) * 2)
    pts = nv.per_tensor_amax_to_scale(x.abs().max())
    sc, data = nv.nvfp4_quantize(x, 16, pts)
    q = k.f4_unpacked_to_f32(k.unpack_uint4(data)).view(1024, 4, 16)
    theirs = (q * (pts * sc.float()).unsqueeze(-1)).view(1024, 64)
    ours = fp4_round(x, "nvfp4")
    amax_b = x.view(1024, 4, 16).abs().amax(-1)
    mine = ((amax_b / 6) * (2688.0 / x.abs().max())).to(torch.float8_e4m3fn).float()
    normal = mine >= 2.0**-6
    assert 0.5 < normal.float().mean() < 1 and torch.equal(sc.float()[normal], mine[normal])
    el = normal.unsqueeze(-1).expand(-1, -1, 16).reshape(1024, 64)
    rel = ((theirs - ours).abs() / ours.abs().clamp(min=1e-38))[el]
    assert (rel <= 2.0**-23).all()
    assert not torch.equal(sc.float()[~normal], mine[~normal])  # the documented difference is real
