"""scaling/host_fp32: the float stand-ins for torch's 0-d fp32 operations, against torch itself."""

from __future__ import annotations

import math
import random

import torch

from lossscale_bench.scaling.host_fp32 import f32, floor_pow2_log2, fmin, recip


def _torch_floor_pow2(x: float) -> float:
    return float(torch.exp2(torch.floor(torch.log2(torch.tensor(x, dtype=torch.float32)))))


def _neighbours(x: float, k: int = 3) -> list[float]:
    """x and its k fp32 neighbours on each side (positive finite ones only)."""
    t = torch.tensor(x, dtype=torch.float32)
    bits = int(t.view(torch.int32))
    out = [
        float(torch.tensor(b, dtype=torch.int32).view(torch.float32))
        for b in range(bits - k, bits + k + 1)
        if 0 < b < 0x7F800000
    ]
    return out


def test_floor_pow2_log2_is_torchs_exp2_floor_log2_at_every_power_of_two_and_its_neighbours():
    values = [v for e in range(-149, 128) for v in _neighbours(math.ldexp(1.0, e))]
    rng = random.Random(3)
    values += [f32(math.ldexp(rng.uniform(0.5, 1.0), rng.randint(-148, 128))) for _ in range(20000)]
    values = [v for v in values if 0.0 < v < math.inf]
    assert len(values) > 21000
    mismatched = [v for v in values if floor_pow2_log2(v) != _torch_floor_pow2(v)]
    assert not mismatched, mismatched[:5]
    # and it is 2**floor(log2 x) away from the powers of two (where torch is not asked)
    assert floor_pow2_log2(3.0) == 2.0 and floor_pow2_log2(0.75) == 0.5 and floor_pow2_log2(1e-40) == 2.0**-133


def test_f32_rounds_once_to_nearest_even_and_overflows_to_inf():
    assert f32(1.0 + 2.0**-24) == 1.0 and f32(1.0 + 3 * 2.0**-24) == 1.0 + 2.0**-22
    assert f32(3.5e38) == math.inf and f32(-3.5e38) == -math.inf
    assert f32(2.0**-150) == 0.0 and f32(3 * 2.0**-151) == 2.0**-149
    assert math.isnan(f32(math.nan))


def test_recip_and_fmin_are_torchs():
    for x in (0.0, -0.0, 3.0, 1e-45, 3e38, math.inf, -math.inf):
        want = float(torch.tensor(x, dtype=torch.float32).reciprocal())
        assert recip(f32(x)) == want and math.copysign(1.0, recip(f32(x))) == math.copysign(1.0, want), x
    for a, b in ((1.0, 2.0), (2.0, 1.0), (math.nan, 1.0), (1.0, math.nan), (-math.inf, 0.0)):
        want = float(torch.minimum(torch.tensor(a), torch.tensor(b)))
        got = fmin(a, b)
        assert (math.isnan(got) and math.isnan(want)) or got == want, (a, b)
