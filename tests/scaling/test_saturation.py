"""The saturation-aware dynamic scaler's rule, step by step (FP8-LM's automatic scaling)."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from lossscale_bench.precision.formats import E4M3
from lossscale_bench.scaling import build_scaler
from lossscale_bench.scaling.saturation import SaturationLossScaler, saturation_counts


def _step(scaler, grads):
    """One optimizer step whose parameter gradients (at the scaler's scale) are ``grads``."""
    p = nn.Parameter(torch.zeros(len(grads)))
    opt = torch.optim.SGD([p], lr=0.0)
    p.grad = torch.tensor(grads, dtype=torch.float32)
    scaler.step(opt)
    res = scaler.last_step
    scaler.update()
    return res


def test_backs_off_when_saturated_share_passes_the_threshold():
    s = SaturationLossScaler(init_scale=1024.0, interval=3, threshold=0.1, grad_format=E4M3)
    # 1 of 4 elements at E4M3's max: share 0.25 > 0.1 -> halve, step not skipped (values are finite)
    res = _step(s, [448.0, 1.0, -2.0, 0.5])
    assert not res.skipped and not res.overflow and s.current_scale() == 512.0 and s.last_share == 0.25
    # below the threshold: count clean steps, grow x2 after 3
    for expected in (512.0, 512.0, 1024.0):
        _step(s, [1.0, 2.0, 3.0, 447.0])
        assert s.current_scale() == expected
    # a saturated step resets the growth count
    _step(s, [-448.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0])
    assert s.current_scale() == 1024.0  # share 0.1 is not past 0.1: no back-off
    _step(s, [-448.0, 448.0, 1.0, 1.0])
    assert s.current_scale() == 512.0


def test_non_finite_gradient_skips_and_backs_off():
    s = SaturationLossScaler(init_scale=64.0, interval=100, threshold=0.5, grad_format=E4M3)
    res = _step(s, [float("nan"), 1.0, 1.0, 1.0])
    assert res.skipped and res.overflow and s.current_scale() == 32.0


def test_state_round_trip_and_entry_builds_it_with_the_precision_format():
    s = build_scaler({"method": "saturation", "init_scale": 8.0, "interval": 2, "threshold": 0.0}, grad_format=E4M3)
    assert isinstance(s, SaturationLossScaler) and s.grad_format is E4M3
    _step(s, [1.0, 1.0])
    t = SaturationLossScaler()
    t.load_state_dict(s.state_dict())
    assert (t.current_scale(), t._growth_tracker) == (8.0, 1)
    assert "saturated_share" in s.metrics()


@pytest.mark.parametrize("bad", [{"init_scale": 0.0}, {"interval": 0}, {"threshold": 1.0}, {"backoff_factor": 1.0}])
def test_bad_options_are_refused(bad):
    with pytest.raises(ValueError):
        SaturationLossScaler(**bad)


@pytest.mark.parametrize("limit", [448.0, 57344.0, 65504.0, 6.0])
def test_saturation_counts_are_the_eager_expression(limit):
    # the census kernel's "past the maximum" against the fp32 value just below the limit: exactly |g| >= limit
    # or NaN, on every layout the parameters come in; fp16 gradients keep the eager expression
    below = torch.nextafter(torch.tensor(limit), torch.tensor(0.0)).item()
    edge = torch.tensor(
        [limit, -limit, below, -below, limit * 2, 0.0, -0.0, float("nan"), float("inf"), -float("inf"), 1e-30, 1.0]
    )
    g = torch.Generator().manual_seed(1)
    grads = [
        edge,
        torch.randn(8, 16, 3, 3, generator=g).mul(limit).contiguous(memory_format=torch.channels_last),
        torch.randn(64, 48, generator=g).mul(limit).t(),
        torch.randn(5, generator=g).mul(limit).half(),
        (torch.randn(300_000, generator=g) * limit),
    ]
    want = sum(int((~(x.abs() < limit)).sum()) for x in grads)
    got = saturation_counts(grads, limit)
    assert got.tolist() == [float(want), float(sum(x.numel() for x in grads))]
