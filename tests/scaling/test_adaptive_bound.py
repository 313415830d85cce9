"""The adaptive bound in parts (scaling/adaptive_bound.py) equals steps 7-9 in one piece, bit for bit.

Two identities carry the split: ``R(F(min(u, A/P, U))) == min(R(F(min(u, U))), R(F(A/P)))`` (F and R are
monotone), and the headroom of ``P * s`` is ``F(A/P) / s`` for a layer scale ``s`` (a power of two, 0 or inf).
Both are checked elementwise on a grid of values the rule meets (scales from 2^-30 to 2^30, arbitrary and
power-of-two arriving scales, bounds that are and are not powers of two) and on the edges (0, inf, NaN, fp32
subnormals, values around fp16's overflow), compared as bit patterns. The weights of whole trials on the
accelerator's path, before and after the split, are compared with ``tools/weights_digest.py --device-path``.
"""

from __future__ import annotations

import math

import pytest
import torch

from lossscale_bench.scaling.adaptive_bound import bound_from_parts, headroom, layer_cap, pass_headroom
from lossscale_bench.scaling.adaptive_rule import bound_scale_tensor

EDGES = [0.0, float("inf"), float("nan"), 1e-45, 1e-40, 2.0**-126, 65504.0, 65519.9, 65520.0, 65536.0]
#: arriving scales may also be negative or -0 (never made by the rule; the split must not care). An unbounded scale
#: is never below zero (steps 1-6 end in max(s, 1) and a positive bound), and min(-0.0, 0.0) is either zero
ARRIVING_EDGES = [-0.0, -1.0]


def _values(seed: int, n: int, low: int = -30, high: int = 30, edges: tuple = ()) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    logs = torch.rand(n, generator=g, dtype=torch.float64) * (high - low) + low
    arbitrary = torch.exp2(logs).to(torch.float32)
    pow2 = torch.exp2(torch.floor(logs)).to(torch.float32)
    return torch.cat([arbitrary, pow2, torch.tensor(EDGES + list(edges), dtype=torch.float32)])


def _same_bits(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Elementwise: equal bit patterns, or both NaN."""
    return (a.view(torch.int32) == b.view(torch.int32)) | (a.isnan() & b.isnan())


@pytest.mark.parametrize("accum", [1024.0, 1000.0, 3.0])
@pytest.mark.parametrize("upper", [16.0, 8.5, 1e6])
def test_the_parts_give_the_bound_bit_for_bit(accum, upper):
    u = _values(0, 400)
    p = _values(1, 400, edges=ARRIVING_EDGES)
    uu, pp = torch.meshgrid(u, p, indexing="ij")
    whole = bound_scale_tensor(uu, pp, scale_upper_bound=upper, accum_upper_bound=accum)
    parts = bound_from_parts(layer_cap(uu, scale_upper_bound=upper), headroom(pp, accum_upper_bound=accum))
    same = _same_bits(whole, parts)
    bad = (~same).nonzero()[:3].tolist()
    assert bool(same.all()), [
        (uu[i, j].item(), pp[i, j].item(), whole[i, j].item(), parts[i, j].item()) for i, j in bad
    ]


@pytest.mark.parametrize("accum", [1024.0, 1000.0, 3.0])
def test_the_headroom_passed_upstream_is_the_headroom_of_the_scale_sent(accum):
    # s as the rule makes it: every power of two fp16 holds, 0, inf and NaN; P over the scales a backward carries
    s = torch.cat([torch.exp2(torch.arange(-24.0, 16.0)), torch.tensor([0.0, float("inf"), float("nan")])])
    p = _values(2, 600, low=-40, high=40, edges=ARRIVING_EDGES)
    # the domain of the identity (adaptive_bound's module doc): A / P finite, i.e. P not within A / 2^128 of zero
    p = p[~((accum / p).isinf() & (p != 0))]
    pp, ss = torch.meshgrid(p, s, indexing="ij")
    direct = headroom(pp * ss, accum_upper_bound=accum)
    passed = pass_headroom(headroom(pp, accum_upper_bound=accum), ss)
    same = _same_bits(direct, passed)
    bad = (~same).nonzero()[:3].tolist()
    assert bool(same.all()), [
        (pp[i, j].item(), ss[i, j].item(), direct[i, j].item(), passed[i, j].item()) for i, j in bad
    ]


def test_a_chain_of_layers_gets_the_same_scales_as_the_rule_in_one_piece():
    # a backward through 40 layers with statistics reused: the scales and the accumulated scale at every layer
    g = torch.Generator().manual_seed(3)
    for trial in range(50):
        unb = torch.exp2(torch.rand(40, generator=g) * 12 - 4)
        prev_whole = prev_parts = torch.tensor(2.0 ** (trial % 7 - 3) * (1.3 if trial % 2 else 1.0))
        head = None
        for u in unb:
            s_whole = bound_scale_tensor(u, prev_whole)
            head = headroom(prev_parts, accum_upper_bound=1024.0) if head is None else head
            s_parts = bound_from_parts(layer_cap(u, scale_upper_bound=16.0), head)
            head = pass_headroom(head, s_parts)
            assert s_whole.item() == s_parts.item() or math.isnan(s_whole.item())
            prev_whole, prev_parts = prev_whole * s_whole, prev_parts * s_parts
            assert prev_whole.item() == prev_parts.item()


def test_outside_that_domain_the_scales_still_agree_unless_a_layer_scale_is_inf():
    # P within A / 2^128 of zero: A / P overflows and the carried headroom is inf where the direct one is a large
    # finite power of two; both are inf in fp16, so the next layer's scale is the same. Only an inf layer scale
    # (a scale_upper_bound of 65520 or more) tells them apart: inf * tiny P is inf, whose headroom is 0.
    s = torch.cat([torch.exp2(torch.arange(-24.0, 16.0)), torch.tensor([0.0, float("nan")])])
    p = torch.tensor([1e-45, 1e-40, 2.0**-126, 1e-37, 2.0**-120], dtype=torch.float32)
    pp, ss = torch.meshgrid(p, s, indexing="ij")
    for accum in (1024.0, 1000.0, 3.0):
        cap = torch.full_like(pp, 16.0)
        direct = bound_from_parts(cap, headroom(pp * ss, accum_upper_bound=accum))
        passed = bound_from_parts(cap, pass_headroom(headroom(pp, accum_upper_bound=accum), ss))
        assert bool(_same_bits(direct, passed).all()), accum


def test_floor_pow2_is_ldexp_of_the_exponent_on_every_kind_of_float():
    from lossscale_bench.scaling.adaptive_rule import floor_pow2

    g = torch.Generator().manual_seed(4)
    bits = torch.randint(-(2**31), 2**31 - 1, (2_000_000,), generator=g, dtype=torch.int64).to(torch.int32)
    x = torch.cat([bits.view(torch.float32), torch.tensor(EDGES + ARRIVING_EDGES + [-float("inf"), 3.4028235e38])])
    _, e = torch.frexp(x)
    want = torch.where((x > 0) & torch.isfinite(x), torch.ldexp(torch.ones_like(x), e - 1), x)
    assert bool(_same_bits(floor_pow2(x), want).all())
