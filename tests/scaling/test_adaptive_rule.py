"""The per-layer rule of adaptive loss scaling (scaling/adaptive_rule.py), on its own: no scaler, no model.

ADAPTIVE.md steps 1-9 on hand-computed cases; the host versions of the rule against the tensor ones, bit for bit;
the branch merge target. Then the bound in parts equals steps 7-9 in one piece, bit for bit. Two identities carry
the split: ``R(F(min(u, A/P, U))) == min(R(F(min(u, U))), R(F(A/P)))`` (F and R are monotone), and the headroom
of ``P * s`` is ``F(A/P) / s`` for a layer scale ``s`` (a power of two, 0 or inf). Both are checked elementwise on
a grid of values the rule meets (scales from 2^-30 to 2^30, arbitrary and power-of-two arriving scales, bounds
that are and are not powers of two) and on the edges (0, inf, NaN, fp32 subnormals, values around fp16's
overflow), compared as bit patterns. The weights of whole trials on the accelerator's path, before and after the
split, are compared with ``tools/weights_digest.py --device-path``.
"""

from __future__ import annotations

import math
import random

import pytest
import torch

from lossscale_bench.scaling.adaptive_rule import (
    U_MAX,
    U_MIN,
    approx_range_scale,
    approx_range_scale_tensor,
    backward_fan_in,
    bound_from_parts,
    bound_scale_host,
    bound_scale_tensor,
    branch_fallback_scale_host,
    branch_target_scale,
    branch_target_scale_host,
    floor_pow2,
    headroom,
    layer_cap,
    pass_headroom,
    unbounded_scale_host,
    unbounded_scale_tensor,
    underflow_k,
)

K = math.sqrt(2.0) * float(torch.special.erfinv(torch.tensor(1e-3, dtype=torch.float64)))


def _pow2_floor(x: float) -> float:
    return 2.0 ** math.floor(math.log2(x))


def _fp16(x: float) -> float:
    return float(torch.tensor(x, dtype=torch.float32).half())


# ---------------------------------------------------------------------------
# approx_range_scale: ADAPTIVE.md steps 1-9 on hand-computed cases
def test_k_constant():
    assert underflow_k(1e-3) == pytest.approx(1.2533e-3, rel=1e-4)
    assert underflow_k(1e-3) == pytest.approx(K, rel=1e-12)


def test_all_zero_gradient_gives_one():
    w = torch.randn(8, 4, 3, 3)
    assert approx_range_scale(torch.zeros(2, 8, 5, 5), w) == 1.0
    # the bounds still apply to the unbounded 1: P = 4096 -> accum bound 1024/4096
    assert approx_range_scale(torch.zeros(2, 8, 5, 5), w, prev_scale=4096.0) == 0.25


def _const_linear(g0: float, w0: float, out: int = 2, n: int = 3, inp: int = 5):
    """Constant tensors: E[g^2] = g0^2, E[W^2] = w0^2, o_max = |g0 w0|, fan_in = out."""
    return torch.full((n, out), g0), torch.full((out, inp), w0)


def test_underflow_scale_is_the_active_bound():
    g, w = _const_linear(1e-5, 0.5)  # sigma_o = 5e-6 * sqrt(0.5 * 2) = 5e-6
    s_uf = U_MIN / (K * 5e-6)  # ~9.57: below 16, 1024/P and the overflow cap
    assert 8 < s_uf < 16
    assert approx_range_scale(g, w) == _pow2_floor(s_uf) == 8.0
    assert approx_range_scale(g, w, power_of_two=False) == pytest.approx(_fp16(s_uf), rel=0, abs=0)


def test_scale_upper_bound_is_active():
    g, w = _const_linear(1e-6, 0.5)  # sigma_o = 5e-7 -> s_uf ~95.7
    s_uf = U_MIN / (K * 5e-7)
    assert approx_range_scale(g, w) == 16.0
    assert approx_range_scale(g, w, scale_upper_bound=64.0) == 64.0
    # non-power-of-two: the value is rounded to fp16's precision (spacing 1/16 between 64 and 128)
    got = approx_range_scale(g, w, scale_upper_bound=1000.0, power_of_two=False)
    assert got == _fp16(s_uf) and got != pytest.approx(s_uf, rel=1e-6)


def test_accum_upper_bound_uses_prev_scale():
    g, w = _const_linear(1e-6, 0.5)  # unbounded ~95.7
    assert approx_range_scale(g, w, prev_scale=256.0) == 4.0  # 1024 / 256
    assert approx_range_scale(g, w, prev_scale=512.0, accum_upper_bound=4096.0) == 8.0
    assert approx_range_scale(g, w, prev_scale=2048.0) == 0.5  # may scale down


def test_overflow_cap_is_active_with_signed_extremes():
    # Linear with fan_in = out_features = 16384; g in [-3, 1], W in [-2, 0.5]
    out = 16384
    g = torch.zeros(1, out)
    g[0, 0], g[0, 1] = -3.0, 1.0
    w = torch.zeros(out, 1)
    w[0, 0], w[1, 0] = -2.0, 0.5
    # products of the signed extremes: 0.5, 6, -2, -1.5 -> o_max = 6 (not max*max = 0.5)
    cap = (U_MAX / out) / 6.0
    assert cap < 1.0
    assert approx_range_scale(g, w) == _pow2_floor(cap) == 0.5
    assert approx_range_scale(g, w, power_of_two=False) == _fp16(cap)


def test_overflow_cap_conv():
    g = torch.full((1, 64, 4, 4), 200.0)
    w = torch.full((64, 8, 3, 3), 1.0)
    assert backward_fan_in(w) == 64 * 9
    cap = (U_MAX / 576) / 200.0  # ~0.57; the underflow scale clamps to 1
    assert approx_range_scale(g, w) == 0.5
    assert approx_range_scale(g, w, power_of_two=False) == _fp16(cap)


def test_linear_and_conv_fan_in():
    assert backward_fan_in(torch.empty(8, 5)) == 8  # Linear: out_features
    assert backward_fan_in(torch.empty(8, 3, 3, 3)) == 72  # Conv: out_channels * kh * kw
    g0, w0 = 1e-6, 0.25
    lin = approx_range_scale(torch.full((4, 8), g0), torch.full((8, 5), w0), power_of_two=False, scale_upper_bound=1e9)
    conv = approx_range_scale(
        torch.full((2, 8, 3, 3), g0), torch.full((8, 3, 3, 3), w0), power_of_two=False, scale_upper_bound=1e9
    )
    assert lin == _fp16(U_MIN / (K * g0 * w0 * math.sqrt(0.5 * 8)))
    assert conv == _fp16(U_MIN / (K * g0 * w0 * math.sqrt(0.5 * 72)))


def test_tensor_variant_matches_and_stays_on_device():
    g, w = torch.randn(2, 16, 6, 6) * 1e-5, torch.randn(16, 8, 3, 3) * 0.1
    t = approx_range_scale_tensor(g, w, torch.tensor(4.0))
    assert isinstance(t, torch.Tensor) and t.dim() == 0 and t.dtype == torch.float32
    assert float(t) == approx_range_scale(g, w, 4.0)
    # fp16 gradients give the same statistics (computed in fp32)
    assert float(approx_range_scale_tensor(g.half(), w)) == approx_range_scale(g.half().float(), w)


def _unbounded_with_signed_extremes(g, w, fan_in, u_min=U_MIN, u_max=U_MAX, t=1e-3):
    """Steps 1-6 as ADAPTIVE.md writes step 6: the largest |product| of the four signed extremes."""
    rms_g = torch.linalg.vector_norm(g, dtype=torch.float32) / math.sqrt(g.numel())
    rms_w = torch.linalg.vector_norm(w, dtype=torch.float32) / math.sqrt(w.numel())
    sigma_o = rms_g * rms_w * math.sqrt(0.5 * fan_in)
    (g_lo, g_hi), (w_lo, w_hi) = torch.aminmax(g), torch.aminmax(w)
    o_max = torch.stack([g_hi * w_hi, g_lo * w_lo, g_hi * w_lo, g_lo * w_hi]).abs().amax()
    under, cap = (u_min / (K * sigma_o)).clamp(min=1.0), (u_max / fan_in) / o_max
    ok = (sigma_o > 0) & torch.isfinite(sigma_o) & torch.isfinite(o_max)
    return torch.where(ok, torch.minimum(under, cap), torch.ones_like(cap)), bool(ok & (cap < under))


def test_overflow_operand_as_max_abs_product_is_the_signed_extremes_bit_for_bit():
    # the rule computes step 6 as max|g| * max|W| (one pass each); the four signed products give the same
    # fp32 value: on random signs and magnitudes that put the overflow cap in force, subnormals, zeros,
    # and non-finite gradients or weights (the scale is 1 there either way)
    gen = torch.Generator().manual_seed(11)
    capped = 0
    for case in range(600):
        g = torch.randn(3, 8, 5, 5, generator=gen) * 10.0 ** float(torch.randint(-40, 5, (), generator=gen))
        w = torch.randn(8, 4, 3, 3, generator=gen) * 10.0 ** float(torch.randint(-3, 3, (), generator=gen))
        if case % 3 == 0:  # one sign only, or a lone large element of either sign
            g = g.abs() * (-1 if case % 2 else 1)
        if case % 5 == 0:
            g.view(-1)[case % g.numel()] = float(torch.randn((), generator=gen)) * 1e4
        if case % 7 == 0:
            w = w.abs()
        fan_in = backward_fan_in(w)
        want, cap_active = _unbounded_with_signed_extremes(g, w, fan_in)
        got = unbounded_scale_tensor(g, w)
        assert got.view(torch.int32) == want.view(torch.int32), (case, float(got), float(want))
        capped += cap_active
    edge = [
        (torch.zeros(2, 8, 3, 3), torch.ones(8, 2, 3, 3)),
        (torch.full((2, 8, 3, 3), 2.0**-149), -torch.ones(8, 2, 3, 3)),
        (torch.tensor([[float("inf"), -1.0]]).expand(8, 2).reshape(2, 8), torch.zeros(8, 3)),
        (
            torch.tensor([[-float("inf"), 5.0]]).expand(8, 2).reshape(2, 8),
            torch.tensor([[0.0], [2.0]]).expand(2, 3).repeat(4, 1),
        ),
        (torch.tensor([[float("nan"), 1.0]]).expand(8, 2).reshape(2, 8), torch.ones(8, 3)),
        (torch.full((2, 8), 1e-3), torch.tensor([[float("inf")], [0.0]]).expand(2, 3).repeat(4, 1)),
    ]
    for g, w in edge:
        want, got = _unbounded_with_signed_extremes(g, w, backward_fan_in(w))[0], unbounded_scale_tensor(g, w)
        assert got.view(torch.int32) == want.view(torch.int32), (g, w, float(got), float(want))
    assert capped > 60, capped  # the cap decides ~1 case in 6 here


def _same_fp32(host: float, tensor: torch.Tensor) -> bool:
    return bool(torch.tensor(host, dtype=torch.float32).view(torch.int32) == tensor.view(torch.int32))


def test_the_host_rule_is_the_tensor_rule_bit_for_bit():
    # unbounded_scale_host / bound_scale_host (the CPU path) against the tensor versions: random magnitudes
    # over the fp32 range (sigma_o subnormal to huge), four gradient formats' ranges, thresholds, previous
    # scales (powers of two, arbitrary, 0, inf) and bounds, with and without power-of-two rounding
    rng, gen = random.Random(1), torch.Generator().manual_seed(5)
    seen = {"under": 0, "cap": 0, "one": 0, "accum": 0, "upper": 0}
    for case in range(1500):
        shape = rng.choice([(2, 8, 5, 5), (3, 16), (1, 4, 3, 3)])
        g = torch.randn(shape, generator=gen) * 10.0 ** rng.uniform(-45, 6)
        w = torch.randn((shape[1], 3, 3, 3) if len(shape) == 4 else (shape[1], 5), generator=gen) * 10.0 ** rng.uniform(
            -4, 3
        )
        u_min, u_max = rng.choice([(U_MIN, U_MAX), (2.0**-9, 448.0), (2.0**-16, 57344.0), (0.5, 6.0)])
        t = rng.choice([1e-3, 1e-2, 0.3])
        want = unbounded_scale_tensor(g, w, n_uf_threshold=t, u_min=u_min, u_max=u_max)
        assert _same_fp32(unbounded_scale_host(g, w, n_uf_threshold=t, u_min=u_min, u_max=u_max), want), case
        o_max = float(g.abs().max() * w.abs().max())
        u, cap = float(want), (u_max / backward_fan_in(w)) / o_max if o_max else math.inf
        seen["one" if u == 1.0 else ("cap" if math.isclose(u, cap, rel_tol=1e-5) else "under")] += 1
        for prev in (1.0, 2.0 ** rng.randint(-20, 20), rng.uniform(0.01, 5000.0), 0.0, math.inf):
            prev = float(torch.tensor(prev, dtype=torch.float32))
            sub, acc = rng.choice([(16.0, 1024.0), (1e9, 1e9), (2.0, 3.0)])
            for p2 in (True, False):
                b = bound_scale_tensor(
                    want, torch.tensor(prev), scale_upper_bound=sub, accum_upper_bound=acc, power_of_two=p2
                )
                assert _same_fp32(
                    bound_scale_host(u, prev, scale_upper_bound=sub, accum_upper_bound=acc, power_of_two=p2), b
                ), (case, u, prev, sub, acc, p2)
            seen["accum"] += acc / prev < min(u, sub) if prev > 0 else 0
            seen["upper"] += sub < min(u, acc / prev) if prev > 0 else 0
    assert min(seen.values()) > 50, seen
    # all-zero, NaN and inf gradients, inf and zero weights, empty tensors: 1 (or the tensor version's value)
    for g, w in [
        (torch.zeros(2, 8, 3, 3), torch.ones(8, 2, 3, 3)),
        (torch.full((2, 8), float("nan")), torch.ones(8, 3)),
        (torch.tensor([[float("inf"), 1.0]]).repeat(1, 4), torch.ones(8, 3)),
        (torch.full((2, 8), 1e-3), torch.tensor([[float("inf")], [0.0]]).repeat(4, 3)),
        (torch.full((2, 8), 1e-3), torch.zeros(8, 3)),
        (torch.full((2, 8), 2.0**-149), torch.ones(8, 3)),
        (torch.empty(0, 8), torch.ones(8, 3)),
    ]:
        assert _same_fp32(unbounded_scale_host(g, w), unbounded_scale_tensor(g, w)), (g, w)


def test_non_finite_statistics_give_one():
    g = torch.full((2, 4), 1e-6)
    g[0, 0] = float("inf")
    assert approx_range_scale(g, torch.ones(4, 3), scale_upper_bound=1e9, accum_upper_bound=1e9) == 1.0


def test_branch_target_scale():
    t = branch_target_scale
    # the largest branch scale fits: m = max(1/4, 1/16) -> 16 * 0.25 < 65504
    assert float(t(torch.tensor([1.0, 1.0]), torch.tensor([4.0, 16.0]))) == 16.0
    # the largest does not: m = 30000 -> 16 overflows, 2 fits
    assert float(t(torch.tensor([60000.0, 10.0]), torch.tensor([2.0, 16.0]))) == 2.0
    # none fits: halve min(scales) = 1 until it does: 0.5 * 1e5 < 65504
    assert float(t(torch.tensor([1e5, 1.0]), torch.tensor([1.0, 4.0]))) == 0.5
    # not below 1/8 (the overflow is then left to the non-finite check)
    assert float(t(torch.tensor([1e6, 1.0]), torch.tensor([1.0, 2.0]))) == 0.125
    # all-zero branches: the largest scale
    assert float(t(torch.tensor([0.0, 0.0]), torch.tensor([1.0, 8.0]))) == 8.0


def _host_cases():
    """(max_abs, scales, u_max): the cases above, edges (zero, inf, NaN, fp32 overflow of m * s, a product
    at u_max exactly, ties, subnormals, scales that are not powers of two) and random fp32 values."""
    inf, nan = float("inf"), float("nan")
    cases = [
        ([1.0, 1.0], [4.0, 16.0], 65504.0),
        ([60000.0, 10.0], [2.0, 16.0], 65504.0),
        ([1e5, 1.0], [1.0, 4.0], 65504.0),
        ([0.0, 0.0], [1.0, 8.0], 65504.0),
        ([inf, 1.0], [1.0, 2.0], 448.0),
        ([nan, 1.0], [1.0, 2.0], 448.0),
        ([3e38, 1.0], [2.0**-100, 2.0**100], 448.0),
        ([448.0, 0.0], [1.0, 2.0], 448.0),
        ([224.0, 0.0], [1.0, 2.0], 448.0),
        ([1.0, 1.0, 1.0], [8.0, 8.0, 2.0], 6.0),
        ([2.0**-149, 1e-40], [2.0**-126, 3.0], 448.0),
        ([0.3, 0.7], [1.5, 0.1], 6.0),
        ([1.0, 2.0], [0.0, 1.0], 6.0),
        # fp32 rounding decides: 149.33333 * 3 is 447.99998 exactly but 448.0 in fp32; 447.99997 / 3 * 3
        ([149.3333282470703, 0.0], [1.0, 3.0], 448.0),
        ([447.9999694824219, 0.0], [3.0, 3.0], 448.0),
    ]
    gen = torch.Generator().manual_seed(5)
    for _ in range(3000):
        n = int(torch.randint(2, 5, (), generator=gen))
        a = (torch.randn(n, generator=gen) * 2.0 ** torch.randint(-30, 30, (n,), generator=gen).float()).abs()
        scales = 2.0 ** torch.randint(-10, 20, (n,), generator=gen).float()
        if torch.rand((), generator=gen) < 0.3:
            scales = scales * torch.rand(n, generator=gen)  # not powers of two
        cases.append(
            (a.tolist(), scales.tolist(), [65504.0, 448.0, 57344.0, 6.0][int(torch.randint(4, (), generator=gen))])
        )
    return cases


def _fallback_cases():
    """Cases where no branch fits: ``mn * m / u_max`` at and next to powers of two (where fp32 ``log2`` may
    round up), below 1, inf and NaN maxima, the smallest scale at and below 1/8, halvings past 2**-100."""
    inf, nan = float("inf"), float("nan")
    cases = [
        ([1e5, 1.0], [1.0, 4.0], 65504.0),
        ([1e6, 1.0], [1.0, 2.0], 65504.0),
        ([inf, 1.0], [1.0, 2.0], 448.0),
        ([nan, 1.0], [1.0, 2.0], 448.0),
        ([1.0, nan], [0.1, 2.0], 448.0),
        ([500.0, 0.0], [0.125, 2.0], 448.0),
        ([500.0, 0.0], [0.0625, 2.0], 448.0),
        ([3e38, 1.0], [2.0**60, 2.0**100], 448.0),
        ([3e38, 3e38], [3e38, 1e38], 6.0),
        ([1e30, 1.0], [2.0**90, 2.0**91], 448.0),
    ]
    for k in range(1, 24):  # mn * m / u_max = x next to 2**k, with mn = 2**24 so that the halving shows
        for ulps in (-3, -2, -1, 0, 1, 2):
            x = torch.tensor(2.0**k, dtype=torch.float32)
            for _ in range(abs(ulps)):
                x = torch.nextafter(x, torch.tensor(0.0 if ulps < 0 else float("inf")))
            for u in (448.0, 65504.0):
                cases.append(([float(x) * u, 0.0], [2.0**24, 2.0**26], u))
    gen = torch.Generator().manual_seed(6)
    for _ in range(2000):
        n = int(torch.randint(2, 5, (), generator=gen))
        a = (torch.randn(n, generator=gen) * 2.0 ** torch.randint(0, 40, (n,), generator=gen).float()).abs()
        scales = 2.0 ** torch.randint(-5, 20, (n,), generator=gen).float()
        if torch.rand((), generator=gen) < 0.3:
            scales = scales * torch.rand(n, generator=gen)
        cases.append(
            (a.tolist(), scales.tolist(), [65504.0, 448.0, 57344.0, 6.0][int(torch.randint(4, (), generator=gen))])
        )
    return cases


def test_branch_target_scale_host_is_the_tensor_version():
    # where the host version answers, it answers exactly what the tensor version computes; where no branch
    # fits (or a max is NaN), the host fallback gives the tensor version's value; where neither answers, the
    # merge runs the tensor version
    answered = fallbacks = 0
    for a, s, u in _host_cases() + _fallback_cases():
        want = float(branch_target_scale(torch.tensor(a), torch.tensor(s), u))
        a32, s32 = [float(torch.tensor(v)) for v in a], [float(torch.tensor(v)) for v in s]
        i = branch_target_scale_host(a32, s32, u)
        if i is None:
            fits = (torch.tensor(a) / torch.tensor(s)).amax() * torch.tensor(s) < u
            assert not fits.any() or not all(v > 0 for v in s)
            value = branch_fallback_scale_host(a32, s32, u)
            if value is not None:
                fallbacks += 1
                assert value == want or (value != value and want != want), (a, s, u, value, want)
            continue
        answered += 1
        assert float(torch.tensor(s)[i]) == want, (a, s, u)
    assert answered > 1000 and fallbacks > 1000


# ---------------------------------------------------------------------------
# steps 7-9 in two parts (layer_cap, headroom, bound_from_parts, pass_headroom) against bound_scale_tensor
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
    # the domain of the identity (adaptive_rule's module doc): A / P finite, i.e. P not within A / 2^128 of zero
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
    g = torch.Generator().manual_seed(4)
    bits = torch.randint(-(2**31), 2**31 - 1, (2_000_000,), generator=g, dtype=torch.int64).to(torch.int32)
    x = torch.cat([bits.view(torch.float32), torch.tensor(EDGES + ARRIVING_EDGES + [-float("inf"), 3.4028235e38])])
    _, e = torch.frexp(x)
    want = torch.where((x > 0) & torch.isfinite(x), torch.ldexp(torch.ones_like(x), e - 1), x)
    assert bool(_same_bits(floor_pow2(x), want).all())
