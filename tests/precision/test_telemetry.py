"""Underflow telemetry: counts what fp16 would lose, per layer, before emulated rounding."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from lossscale_bench.precision import install_fp16_emulation
from lossscale_bench.precision.telemetry import LayerHistory, UnderflowProbe, summarize


def _net():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 4))


def test_rates_for_known_gradients():
    model = _net()
    install_fp16_emulation(model)
    probe = UnderflowProbe(model)
    probe.arm()
    out = model(torch.randn(3, 8))
    g = torch.zeros_like(out)
    g[0] = torch.tensor([1e-9, 1e-6, 1.0, 0.0])  # flushed, subnormal, normal, exact zero
    out.backward(g)
    rates = probe.read()
    last = rates["2"]
    assert last["nonzero"] == 3
    assert abs(last["underflow_rate"] - 2 / 3) < 1e-9  # 1e-9 and 1e-6 are below 2**-14
    assert abs(last["flush_rate"] - 1 / 3) < 1e-9  # only 1e-9 rounds to 0 (seen before rounding)
    s = summarize(rates)
    assert s["underflow_rate_max"] >= 2 / 3


def test_disarmed_probe_records_nothing_and_remove_cleans_up(tmp_path):
    model = _net()
    probe = UnderflowProbe(model)
    model(torch.randn(2, 8)).sum().backward()
    assert probe.read() == {}
    probe.remove()
    assert all(not m._forward_hooks for m in model.modules())


def test_history_truncates_on_resume(tmp_path):
    h = LayerHistory(tmp_path / "h.csv")
    rates = {"a": {"nonzero": 1.0, "underflow_rate": 0.5, "flush_rate": 0.0}}
    for step in (10, 20, 30):
        h.append(step, rates, [{"layer": "a", "scale": 2.0, "accum_scale": 4.0}])
    h.truncate_after(20)
    rows = (tmp_path / "h.csv").read_text().strip().splitlines()
    assert len(rows) == 3 and rows[-1].startswith("20,a,0.5")


@pytest.mark.parametrize("native", ["C loop", "compiled"])
def test_compiled_census_counts_like_the_eager_expression(native, monkeypatch):
    """The fused census kernels (numerics.census: the C loop where it builds, else and with
    LSBENCH_NO_NATIVE Inductor's) against the same counts written as eager ops, for each gradient
    format's thresholds, on random tensors of several layouts and on the edge values (the
    thresholds themselves, inf, NaN, -0.0)."""
    from lossscale_bench.precision.formats import FORMATS

    if native == "compiled":
        monkeypatch.setenv("LSBENCH_NO_NATIVE", "1")

    g = torch.Generator().manual_seed(0)
    edges = torch.tensor(
        [
            0.0,
            -0.0,
            2.0**-25,
            2.0**-24,
            2.0**-17,
            2.0**-10,
            2.0**-6,
            2.0**-14,
            448.0,
            448.0001,
            57344.0,
            65504.0,
            float("inf"),
            -float("inf"),
            float("nan"),
        ]
    )
    tensors = [
        edges,
        torch.randn(8, 16, 12, 12, generator=g).mul(1e-4).to(memory_format=torch.channels_last),
        torch.randn(1000, generator=g).mul(500),
        torch.randn(37, 3, generator=g).mul(1e-7),
        torch.tensor([3.0]),
        # past COMPILED_FROM, so the compiled kernel (not only the eager fallback) is checked
        torch.cat([edges, torch.randn(2**18, generator=g).mul(3e-4)]).view(-1, 1),
    ]
    for fmt in (FORMATS["fp16"], FORMATS["e4m3"], FORMATS["e5m2"]):
        for t in tensors:
            a = t.abs()
            nz = a != 0
            want = [
                int(nz.sum()),
                int((nz & (a < fmt.min_normal)).sum()),
                int((nz & (a <= fmt.flush_threshold)).sum()),
                int((nz & ~(a <= fmt.max)).sum()),
            ]
            assert fmt.census(t).tolist() == want, (fmt.name, t.shape)
    assert FORMATS["e4m3"].census(edges).tolist()[3] == 6  # 448.0001, 57344, 65504, +-inf, NaN
