"""Number formats and the fp8-emulated precision: rounding points, ranges, telemetry thresholds."""

import math

import pytest
import torch
from torch import nn

from lossscale_bench.precision import get_precision
from lossscale_bench.precision.formats import E4M3, E5M2, FORMATS, FP16
from lossscale_bench.precision.telemetry import UnderflowProbe
from lossscale_bench.scaling import build_scaler
from lossscale_bench.scaling.adaptive_rule import unbounded_scale_tensor


def test_format_constants_match_torch_finfo():
    for fmt in (FP16, E4M3, E5M2):
        fi = torch.finfo(fmt.dtype)
        assert fmt.max == fi.max
        assert fmt.min_normal == fi.smallest_normal
        # the smallest subnormal survives a cast, half of it does not
        tiny = torch.tensor([fmt.min_subnormal, fmt.min_subnormal / 2])
        assert fmt.round(tiny).tolist() == [fmt.min_subnormal, 0.0]
    assert set(FORMATS) >= {"fp16", "e4m3", "e5m2"}


def test_e5m2_flushes_below_smallest_subnormal_and_overflows_to_inf():
    x = torch.tensor([2.0**-16, 2.0**-17, 2.0**-17 * 1.01, 1e-7, 57344.0, 61440.0, -1e6])
    y = E5M2.round(x)
    assert y[0] == 2.0**-16  # smallest subnormal kept
    assert y[1] == 0.0  # exactly half: ties to even -> 0
    assert y[2] == 2.0**-16  # just above half rounds up
    assert y[3] == 0.0  # 1e-7: kept by fp16, flushed by E5M2
    assert FP16.round(x)[3] != 0.0
    assert y[4] == 57344.0
    assert math.isinf(y[5]) and math.isinf(y[6]) and y[6] < 0


def test_e4m3_saturates_as_torch_does():
    x = torch.tensor([448.0, 464.0, 1000.0, -1e6, 2.0**-9, 2.0**-10, 0.3])
    y = E4M3.round(x)
    assert torch.equal(y, x.to(torch.float8_e4m3fn).float())  # exactly torch's cast
    assert y[:4].tolist() == [448.0, 448.0, 448.0, -448.0]  # saturation, no inf/nan
    assert y[4] == 2.0**-9 and y[5] == 0.0
    assert y[6] == 0.3125  # 3 mantissa bits: 0.3 -> 0.3125


def _net():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))


def test_fp8_emulated_rounds_forward_e4m3_and_gradients_e5m2():
    prec = get_precision("fp8-emulated")
    assert prec.emulated and prec.needs_scaler
    assert prec.forward_format is E4M3 and prec.grad_format is E5M2
    net = _net()
    handle = prec.prepare(net)
    seen = {}
    net[0].register_forward_hook(lambda m, i, o: seen.__setitem__("out", o))
    x = torch.randn(16, 4)
    out = net(x)
    assert torch.equal(seen["out"], E4M3.round(seen["out"]))  # forward output on E4M3's grid
    assert torch.equal(out, E4M3.round(out))
    seen["out"].register_hook(lambda g: seen.__setitem__("g", g))
    (out.sum() * 1e-3).backward()
    for p in net.parameters():  # parameter gradients on E5M2's grid
        assert torch.equal(p.grad, E5M2.round(p.grad))
    handle.remove()
    assert len(net[0]._forward_hooks) == 1 and not net[2]._forward_hooks  # only the test's own hook left


def test_fixed_1024_rescues_a_gradient_that_flushes_unscaled_in_fp8():
    """A weight gradient of ~1e-7 flushes in E5M2 (smallest subnormal 1.5e-5); x1024 keeps it."""
    grads = {}
    for scale in (1.0, 1024.0):
        lin = nn.Linear(1, 1, bias=False)
        with torch.no_grad():
            lin.weight.fill_(1.0)
        get_precision("fp8-emulated").prepare(lin)
        scaler = build_scaler({"method": "fixed", "scale": scale}, lin)
        opt = torch.optim.SGD(lin.parameters(), lr=0.0)
        x = torch.ones(1, 1)
        loss = lin(x).sum() * 1e-7
        scaler.scale(loss).backward()
        scaler.unscale_(opt)
        grads[scale] = float(lin.weight.grad)
    assert grads[1.0] == 0.0
    assert grads[1024.0] == pytest.approx(1e-7, rel=0.25)  # E5M2 keeps 2 mantissa bits


def test_adaptive_range_follows_the_gradient_format():
    torch.manual_seed(0)
    g = torch.randn(4, 8, 6, 6) * 1e-9
    w = torch.randn(8, 4, 3, 3) * 0.1
    fp16 = unbounded_scale_tensor(g, w)
    e5m2 = unbounded_scale_tensor(g, w, u_min=E5M2.u_min, u_max=E5M2.u_max)
    assert float(e5m2 / fp16) == pytest.approx(E5M2.u_min / FP16.u_min, rel=1e-5)  # ~254x
    # the scaler built for a precision takes that precision's gradient format
    net = _net()
    scaler = build_scaler({"method": "adaptive"}, net, grad_format=get_precision("fp8-emulated").grad_format)
    assert scaler.grad_format is E5M2
    scaler.remove()
    scaler = build_scaler({"method": "adaptive"}, net)
    assert scaler.grad_format is FP16
    scaler.remove()


def test_adaptive_overflow_cap_uses_the_format_max():
    g = torch.full((2, 4), 100.0)
    w = torch.full((4, 4), 1.0)
    s16 = unbounded_scale_tensor(g, w, u_min=1e3)  # forced underflow scale, capped by u_max
    s8 = unbounded_scale_tensor(g, w, u_min=1e3, u_max=E5M2.u_max)
    assert float(s16) == pytest.approx((FP16.u_max / 4) / 100.0)
    assert float(s8) == pytest.approx((E5M2.u_max / 4) / 100.0)


def test_telemetry_counts_against_the_gradient_format():
    net = _net()
    x = torch.randn(32, 4)
    rates = {}
    for fmt in (FP16, E5M2):
        probe = UnderflowProbe(net, fmt=fmt)
        probe.arm()
        net.zero_grad()
        (net(x).sum() * 1e-7).backward()  # output gradients of 1e-7: subnormal in both, flushed in E5M2 only
        rates[fmt.name] = probe.read()
        probe.remove()
    last = "2"  # the output layer: its incoming gradient is exactly 1e-7
    assert rates["fp16"][last]["underflow_rate"] == rates["e5m2"][last]["underflow_rate"] == 1.0  # < 2**-14
    assert rates["e5m2"][last]["flush_rate"] == 1.0  # 1e-7 <= 2**-17
    assert rates["fp16"][last]["flush_rate"] == 0.0  # 1e-7 > 2**-25
