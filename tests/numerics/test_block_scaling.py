"""Block-scaled round trips against the rules written out here in plain Python floats.

The MX reference is OCP Microscaling v1.0's rule (shared exponent floor(log2(amax)) - emax_elem,
clamped to [-127, 127], elements cast with saturation), with the other rounding modes as torchao
defines them; the tensor/tile reference is Transformer Engine's ``compute_scale_from_amax``. The
element cast in the references is torch's own cast of one fp32 value; everything else is Python
float arithmetic (exact in float64 for the products and powers of two used here) rounded to fp32
with ``struct``.
"""

from __future__ import annotations

import math
import struct

import pytest
import torch

from lossscale_bench.numerics import lazy_compile
from lossscale_bench.numerics.block_scales import ELEMENTS, MX_MODES, amax_scale, mx_exponent
from lossscale_bench.numerics.block_scaling import _kernel, block_round
from lossscale_bench.numerics.flush_counts import count_flush_saturate

FMAX = {"e4m3": 448.0, "e5m2": 57344.0, "fp16": 65504.0}
EMAX = {"e4m3": 8, "e5m2": 15, "fp16": 15}
MBITS = {"e4m3": 3, "e5m2": 2, "fp16": 10}
DTYPE = {"e4m3": torch.float8_e4m3fn, "e5m2": torch.float8_e5m2, "fp16": torch.float16}
FLT_MAX = 3.4028234663852886e38


def f32(v: float) -> float:
    """``v`` rounded to fp32 (round to nearest even, subnormals included)."""
    return struct.unpack("<f", struct.pack("<f", v))[0]


def f32_sat(v: float) -> float:
    """A dequantised value in fp32, clamped to +-FLT_MAX (block_scaling's module doc)."""
    return math.copysign(FLT_MAX, v) if abs(v) > FLT_MAX else f32(v)


def elem_cast(values: list[float], fmt: str) -> list[float]:
    """Saturating cast of scaled values to the element format: clamp, then torch's cast."""
    t = torch.tensor(values, dtype=torch.float64).float().clamp(-FMAX[fmt], FMAX[fmt])
    return t.to(DTYPE[fmt]).double().tolist()


def floor_log2(a: float) -> int:
    return math.frexp(a)[1] - 1  # a = m * 2^ex with m in [0.5, 1)


def ceil_log2(a: float) -> int:
    m, ex = math.frexp(a)
    return ex - 1 if m == 0.5 else ex


def mx_ref(block: list[float], fmt: str, mode: str) -> tuple[int, list[float]]:
    """OCP MX v1.0 shared exponent (and torchao's ceil/even/rceil variants), then the block."""
    amax = max(abs(v) for v in block)
    if amax == 0:
        e = -127
    elif mode == "floor":
        e = floor_log2(amax) - EMAX[fmt]
    elif mode == "ceil":
        e = ceil_log2(amax) - EMAX[fmt]
    elif mode == "even":  # amax's significand rounded half up to the element's bits
        m, ex = math.frexp(amax)
        steps = 2 ** MBITS[fmt]
        rounded = math.floor(2 * m * steps + 0.5) / steps
        e = ex - 1 + (rounded >= 2) - EMAX[fmt]
    else:  # rceil: ceil(log2(amax / fmt_max)), the ratio in fp32
        d = f32(amax / FMAX[fmt])
        e = -127 if d == 0 else ceil_log2(d)
    e = max(-127, min(127, e))
    x = 2.0**e
    return e, [f32_sat(q * x) for q in elem_cast([v / x for v in block], fmt)]


def amax_ref(group: list[float], fmt: str, pow2: bool, amax_floor: float = 0.0) -> list[float]:
    """Transformer Engine's current/block scaling of one group (tensor or tile)."""
    a = max(max(abs(v) for v in group), amax_floor)
    if a == 0:
        s = 1.0
    else:
        q = FMAX[fmt] / a
        s = FLT_MAX if q >= FLT_MAX else f32(q)
    if pow2:
        s = 2.0 ** floor_log2(s)
    inv = f32(1.0 / s)
    return [f32_sat(q * inv) for q in elem_cast([f32(v * s) for v in group], fmt)]


def same(a: torch.Tensor, b) -> bool:
    """Bit for bit (so -0.0 counts), NaN positions equal whatever their payload."""
    b = torch.as_tensor(b, dtype=torch.float32)
    na, nb = torch.isnan(a), torch.isnan(b)
    return torch.equal(na, nb) and torch.equal(a[~na].view(torch.int32), b[~nb].view(torch.int32))


def random_blocks(n_blocks: int, seed: int, block: int = 32) -> torch.Tensor:
    """Blocks whose magnitudes sit anywhere from fp32 subnormals to 2^120, with a spread of
    2^-12..2^2 inside each block (so some elements flush and block maxima vary)."""
    g = torch.Generator().manual_seed(seed)
    level = torch.randint(-150, 120, (n_blocks, 1), generator=g).float()
    spread = torch.randint(-12, 3, (n_blocks, block), generator=g).float()
    x = torch.randn(n_blocks, block, generator=g) * torch.exp2(level + spread)
    return x.reshape(-1)


HAND_BLOCKS = {
    "zeros": [0.0] * 32,
    "signed zeros": [-0.0, 0.0] * 16,
    "subnormal only": [2.0**-130, -3 * 2.0**-135, 2.0**-140, 2.0**-149] + [0.0] * 28,
    "e4m3 max mixed": [448.0, -448.0, 1.0, -1.0, 0.5, 2.0**-9, -(2.0**-10)] + [3.0] * 25,
    "fp32 max mixed": [FLT_MAX, -FLT_MAX, 1.0, -1e30] + [0.0] * 28,
    "amax 2^-140": [2.0**-140, -(2.0**-141)] + [0.0] * 30,
    "amax 1.9 * 2^127": [1.9 * 2.0**127, -(2.0**100), 1.0] + [0.0] * 29,
    "max 1.9": [1.9, -0.5, 1e-6, 0.01] + [0.25] * 28,
    "max 1.95": [1.95, -0.5, 1e-6, 0.01] + [0.25] * 28,
    "ties": [1.0, 1.0625, 1.1875, 2.0**-14 * 1.5, 17.0, 19.0, 3.0 * 2**-11] + [0.125] * 25,
}


@pytest.mark.parametrize("mode", MX_MODES)
@pytest.mark.parametrize("fmt", ["e4m3", "e5m2", "fp16"])
def test_mx32_follows_the_spec_rule_block_by_block(fmt, mode):
    seed = 10 * MX_MODES.index(mode) + list(FMAX).index(fmt)
    x = torch.cat([torch.tensor(sum(HAND_BLOCKS.values(), [])), random_blocks(200, seed=seed)])
    blocks = x.view(-1, 32).tolist()
    want_e, want = zip(*(mx_ref(b, fmt, mode) for b in blocks))
    got_e = mx_exponent(x.view(-1, 32).abs().amax(1), fmt, mode)
    assert got_e.tolist() == list(want_e)
    for compiled in (False, True):
        assert same(block_round(x, fmt, "mx32", mode=mode, compiled=compiled), sum(want, [])), compiled


def test_mx32_hand_made_blocks_e4m3():
    r = {name: block_round(torch.tensor(b), "e4m3", "mx32", mode="floor") for name, b in HAND_BLOCKS.items()}
    assert same(r["zeros"], HAND_BLOCKS["zeros"]) and same(r["signed zeros"], HAND_BLOCKS["signed zeros"])
    # e = -127 and the scale 2^-127 is exact: 2^-130 -> 2^-3 and 3 * 2^-135 -> 3 * 2^-8 survive in
    # E4M3, 2^-140 -> 2^-13 and 2^-149 -> 2^-22 are below 2^-10 and flush
    assert same(r["subnormal only"], [2.0**-130, -3 * 2.0**-135, 0.0, 0.0] + [0.0] * 28)
    assert same(r["e4m3 max mixed"], [448.0, -448.0, 1.0, -1.0, 0.5, 2.0**-9, -0.0] + [3.0] * 25)
    # FLT_MAX = (2 - 2^-23) * 2^127: e = 119, scaled 511.99997 saturates to 448 = 1.75 * 2^8;
    # 1 and -1e30 are below 2^-10 once divided by 2^119 and flush (keeping their sign)
    assert same(r["fp32 max mixed"], [1.75 * 2.0**127, -1.75 * 2.0**127, 0.0, -0.0] + [0.0] * 28)
    assert same(r["amax 2^-140"], [0.0, -0.0] + [0.0] * 30)  # clamped to e = -127, then flushed
    assert torch.isfinite(torch.cat(list(r.values()))).all()


def test_exponent_clamp_and_the_largest_blocks():
    amax = torch.tensor([2.0**-140, 1e-45, 0.0, 1.9 * 2.0**127, FLT_MAX])
    assert mx_exponent(amax, "e4m3", "floor").tolist() == [-127, -127, -127, 119, 119]
    assert mx_exponent(amax, "e4m3", "ceil").tolist() == [-127, -127, -127, 120, 120]
    assert mx_exponent(amax, "e5m2", "floor").tolist() == [-127, -127, -127, 112, 112]
    big = torch.tensor(HAND_BLOCKS["amax 1.9 * 2^127"])
    # floor: 1.9 * 2^8 = 486.4 saturates to 448; ceil: 243.2 rounds to 240 = 1.875 * 2^7
    assert block_round(big, "e4m3", "mx32", mode="floor")[0].item() == 1.75 * 2.0**127
    assert block_round(big, "e4m3", "mx32", mode="ceil")[0].item() == 1.875 * 2.0**127
    # e5m2 keeps 2^-140 (2^-140 / 2^-127 = 2^-13 >= 2^-16)
    assert block_round(torch.tensor(HAND_BLOCKS["amax 2^-140"]), "e5m2", "mx32")[0].item() == 2.0**-140


def test_floor_saturates_a_block_max_that_ceil_keeps():
    x = torch.tensor(HAND_BLOCKS["max 1.9"])
    floor, cf = block_round(x, "e4m3", "mx32", mode="floor", counts=True)
    ceil, cc = block_round(x, "e4m3", "mx32", mode="ceil", counts=True)
    assert floor[0].item() == 1.75 and cf.saturated.item() == 1  # 1.9 * 2^8 = 486.4 > 448
    assert ceil[0].item() == 1.875 and cc.saturated.item() == 0  # 1.9 * 2^7 = 243.2 -> 240
    # even: 1.9 rounds to 1.875 at 3 bits (floor's exponent, saturates); 1.95 rounds to 2 (ceil's
    # exponent: 1.95 * 2^7 = 249.6, which E4M3 rounds to 256, i.e. 2.0)
    assert block_round(x, "e4m3", "mx32", mode="even")[0].item() == 1.75
    assert block_round(torch.tensor(HAND_BLOCKS["max 1.95"]), "e4m3", "mx32", mode="even")[0].item() == 2.0
    # flush: 1e-6 * 2^8 < 2^-10 under floor; 0.01 * 2^8 = 2.56 survives
    assert cf.flushed.item() == 1 and cf.nonzero.item() == 32


@pytest.mark.parametrize("fmt", ["e4m3", "e5m2", "fp16"])
@pytest.mark.parametrize(
    "granularity,pow2", [("tensor", False), ("tensor", True), ("tile128", True), ("tile128", False)]
)
def test_tensor_and_tile_scaling_follow_transformer_engine(fmt, granularity, pow2):
    g = torch.Generator().manual_seed(7)
    x = torch.randn(6, 200, generator=g) * torch.exp2(torch.randint(-40, 20, (6, 1), generator=g).float())
    x[2, 128:] = 0.0  # an all-zero ragged tile
    x[3] *= torch.exp2(torch.randint(-20, 0, (200,), generator=g).float())
    groups = (
        [x.reshape(-1).tolist()]
        if granularity == "tensor"
        else [row[:128] for row in x.tolist()] + [row[128:] for row in x.tolist()]
    )
    want = {}
    for i, grp in enumerate(groups):
        want[i] = amax_ref(grp, fmt, pow2)
    if granularity == "tensor":
        expected = torch.tensor(want[0]).view(6, 200)
    else:
        expected = torch.tensor([want[r] + want[6 + r] for r in range(6)])
    for compiled in (False, True):
        got = block_round(x, fmt, granularity, pow2=pow2, compiled=compiled)
        assert got.shape == x.shape
        assert same(got, expected), compiled


def test_ragged_tiles_use_only_their_own_elements():
    x = torch.zeros(3, 200)
    x[:, :128] = 1000.0
    x[:, 128:] = torch.linspace(-3.0, 3.0, 72)
    out = block_round(x, "e4m3", "tile128", pow2=True)
    # first tile: s = 2^floor(log2(448 / 1000)) = 1/4, 250 rounds to 256 in E4M3, so 1024
    assert (out[:, :128] == 1024.0).all()
    # the ragged 72-element tile is scaled by its own amax 3 (s = 128), not by the 1000s'
    # s = 1/4 and not by anything in the padding
    assert out[:, 128:].tolist() == [amax_ref(x[0, 128:].tolist(), "e4m3", True)] * 3
    assert out[0, 128:].tolist() != amax_ref([1000.0] + x[0, 128:].tolist(), "e4m3", True)[1:]
    assert block_round(torch.randn(5, 3, 7), "e4m3", "tile128").shape == (5, 3, 7)
    assert block_round(torch.randn(5), "e4m3", "tile128").shape == (5,)
    assert block_round(torch.randn(45), "e4m3", "mx32").shape == (45,)  # ragged MX block


def test_tiny_zero_and_huge_groups_give_no_nan_or_inf():
    for granularity in ("tensor", "tile128", "mx32"):
        for x in (
            torch.zeros(300),
            torch.full((300,), 1e-45),
            torch.full((300,), 2.0**-140),
            torch.full((300,), FLT_MAX),
            FLT_MAX * torch.linspace(-1.0, 1.0, 300),
        ):
            for fmt in ("e4m3", "e5m2", "fp16"):
                assert torch.isfinite(block_round(x, fmt, granularity)).all(), (granularity, fmt, x[0])
    assert (block_round(torch.zeros(300), "e4m3", "tensor") == 0).all()
    # TE's rule for a tiny amax: s overflows to FLT_MAX (2^127 with pow2), so 1e-45 * 2^127 ~ 2^-22 flushes
    assert amax_scale(torch.tensor([1e-45]), "e4m3", pow2=True).item() == 2.0**127
    assert amax_scale(torch.tensor([1e-45]), "e4m3", pow2=False).item() == FLT_MAX
    assert amax_scale(torch.tensor([0.0]), "e4m3", pow2=False).item() == 1.0
    assert amax_scale(torch.tensor([1e-6]), "e4m3", pow2=False, amax_floor=1e-4).item() == f32(448.0 / f32(1e-4))


def test_amax_floor_caps_the_scale():
    x = torch.tensor([1e-6, -5e-7, 2e-7, 0.0])
    out = block_round(x, "e4m3", "tensor", amax_floor=1e-4)
    assert same(out, amax_ref(x.tolist(), "e4m3", False, amax_floor=f32(1e-4)))


@pytest.mark.parametrize("granularity", ["tensor", "tile128", "mx32"])
def test_a_nan_or_inf_group_becomes_nan_and_only_that_group(granularity):
    x = torch.ones(4, 128)
    x[1, 5] = math.nan
    x[2, 7] = -math.inf
    out = block_round(x, "e4m3", granularity)
    if granularity == "tensor":
        assert torch.isnan(out).all()
        return
    assert torch.isnan(out[1:3]).all() if granularity == "tile128" else torch.isnan(out[1, :32]).all()
    assert (out[0] == 1).all() and (out[3] == 1).all()
    if granularity == "mx32":
        assert (out[1, 32:] == 1).all() and torch.isnan(out[2, :32]).all() and (out[2, 32:] == 1).all()


def test_counts_on_a_known_tensor():
    # one MX block: amax 1.9 -> e = -8 (floor); 1.9 saturates, 1e-6 flushes, exact zeros are not counted
    x = torch.tensor([1.9, 1e-6, -2e-6, 0.0, 0.0, 0.5] + [0.25] * 26 + [0.0] * 32)
    _, c = block_round(x, "e4m3", "mx32", counts=True)
    assert (c.nonzero.item(), c.flushed.item(), c.saturated.item()) == (30, 2, 1)
    # plain cast to E4M3: 1e-4 flushes (< 2^-10), 500 and -inf are past 448, NaN is neither
    before = torch.tensor([0.0, 1e-4, 500.0, -math.inf, math.nan, 1.0, -3e-4, 2.0**-9])
    after = before.to(torch.float8_e4m3fn).float()
    c = count_flush_saturate(before, after, 448.0)
    assert (c.nonzero.item(), c.flushed.item(), c.saturated.item()) == (5, 2, 2)
    big = torch.cat([before] * 1000)
    c = count_flush_saturate(big, big.to(torch.float8_e4m3fn).float(), 448.0)  # compiled path
    assert (c.nonzero.item(), c.flushed.item(), c.saturated.item()) == (5000, 2000, 2000)
    with pytest.raises(ValueError):
        count_flush_saturate(before, after[:3], 448.0)


def test_counts_are_the_same_compiled_and_eager():
    x = random_blocks(64, seed=3, block=32) * 1e3
    for mode in MX_MODES:
        a, ca = block_round(x, "e4m3", "mx32", mode=mode, counts=True, compiled=False)
        b, cb = block_round(x, "e4m3", "mx32", mode=mode, counts=True, compiled=True)
        assert same(a, b) and [int(v) for v in ca] == [int(v) for v in cb]
    a, ca = block_round(x, "e5m2", "tile128", counts=True, compiled=False)
    b, cb = block_round(x, "e5m2", "tile128", counts=True, compiled=True)
    assert same(a, b) and [int(v) for v in ca] == [int(v) for v in cb]


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_inputs_come_back_in_their_dtype(dtype):
    x = (torch.randn(4, 64) * 3).to(dtype)
    out = block_round(x, "e4m3", "mx32", mode="ceil")
    assert out.dtype == dtype
    assert torch.equal(out, block_round(x.float(), "e4m3", "mx32", mode="ceil").to(dtype))


def test_one_compiled_graph_for_twenty_shapes():
    k = _kernel("mx32", ELEMENTS["e4m3"], "floor", True, 0.0, False)
    shapes = [
        (64,),
        (96,),
        (100,),
        (2, 64),
        (3, 3, 3, 3),
        (64, 3, 3, 3),
        (16,),
        (2, 16, 32, 32),
        (1000,),
        (7, 33),
        (128, 128),
        (5, 200),
        (33,),
        (65,),
        (31, 31),
        (10, 10, 10),
        (4096,),
        (9, 8, 7),
        (1, 640),
        (257,),
    ]
    for i, shape in enumerate(shapes):
        x = torch.randn(shape, generator=torch.Generator().manual_seed(i))
        assert same(block_round(x, "e4m3", "mx32"), block_round(x, "e4m3", "mx32", compiled=False))
    if lazy_compile.compile_disabled() or k.broken:
        pytest.skip(f"torch.compile not used here ({k.broken or 'LSBENCH_NO_COMPILE'})")
    assert k.graphs == 1


def test_bad_arguments_are_refused():
    x = torch.ones(64)
    with pytest.raises(ValueError, match="granularity"):
        block_round(x, "e4m3", "row")
    with pytest.raises(ValueError, match="element format"):
        block_round(x, "int8", "mx32")
    with pytest.raises(ValueError, match="mode"):
        block_round(x, "e4m3", "mx32", mode="nearest")
    with pytest.raises(ValueError, match="pow2"):
        block_round(x, "e4m3", "mx32", pow2=True)
    with pytest.raises(ValueError, match="mode"):
        block_round(x, "e4m3", "tile128", mode="ceil")
    assert block_round(torch.empty(0, 4), "e4m3", "tile128").shape == (0, 4)


# --- torchao (optional): the maintained implementation, bit for bit ---------------------------


def _torchao():
    return pytest.importorskip(
        "torchao.prototype.mx_formats.mx_tensor",
        reason="torchao is not installed (optional: pip install torchao==0.18.0)",
    )


@pytest.mark.parametrize("mode", MX_MODES)
@pytest.mark.parametrize("fmt", ["e4m3", "e5m2"])
def test_mx32_matches_torchao(fmt, mode):
    """Same shared exponents as torchao's ``to_mx`` on every finite block, and the same
    dequantised values (``to_dtype``) on every block except those torchao 0.18 handles
    differently by design or by bug (module doc of block_scaling): blocks with e = -127 and a
    non-zero amax (torchao quantises with 2^-126 or 1 but dequantises with 2^-127) and blocks
    containing inf (torchao: a finite scale; here: NaN). NaN blocks are NaN in both. Where
    torchao's dequantised value overflows fp32 (an element rounded up to 2^(emax+1) in a block
    whose max is near FLT_MAX) it gives inf and we give +-FLT_MAX, so its values are compared
    after that clamp."""
    mx = _torchao()
    from torchao.prototype.mx_formats.config import ScaleCalculationMode

    hand = torch.tensor(sum(HAND_BLOCKS.values(), []) + [math.nan] + [1.0] * 31)
    x = torch.cat([hand, random_blocks(2000, seed=11)])
    scale, data = mx.to_mx(x.view(-1, 32), DTYPE[fmt], 32, ScaleCalculationMode(mode))
    theirs = mx.to_dtype(data, scale, DTYPE[fmt], 32, torch.float32).view(-1, 32)
    ours = block_round(x, fmt, "mx32", mode=mode).view(-1, 32)
    amax = x.view(-1, 32).abs().amax(1)
    e = mx_exponent(amax, fmt, mode)
    finite = torch.isfinite(amax)
    assert torch.equal((e + 127)[finite], scale.view(torch.uint8).view(-1).int()[finite])
    compared = finite & ~((e == -127) & (amax > 0))
    compared |= torch.isnan(amax)
    assert compared.sum() > 1500
    assert same(ours[compared], theirs[compared].clamp(-FLT_MAX, FLT_MAX))
    assert torch.isnan(ours[torch.isinf(amax)]).all()
