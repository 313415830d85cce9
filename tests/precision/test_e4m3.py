"""E4M3 everywhere (TE's Format.E4M3): flush point, saturation, the non-saturating option that
overflow-driven scalers can see, the saturation telemetry, block-scaled gradient precisions."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from helpers import one_entry_study
from lossscale_bench.precision import get_precision
from lossscale_bench.precision.formats import E4M3, E4M3_NAN, BlockScaledFormat
from lossscale_bench.precision.telemetry import UnderflowProbe
from lossscale_bench.scaling import build_scaler
from lossscale_bench.study import StudyError, load_study_text


def test_e4m3_gradient_flush_point_and_saturation():
    p = get_precision("fp8-e4m3-emulated")
    assert p.grad_format is E4M3 and p.forward_format is E4M3 and p.emulated and p.needs_scaler
    sub = 2.0**-9  # E4M3's smallest subnormal
    x = torch.tensor([sub / 2, sub / 2 * 1.01, sub, 2.0**-6, 448.0, 464.0, 500.0, float("inf"), -1e9])
    y = p.grad_format.round(x)
    assert y.tolist()[:4] == [0.0, sub, sub, 2.0**-6]  # half the subnormal ties to even: 0
    assert y.tolist()[4:] == [448.0, 448.0, 448.0, 448.0, -448.0]  # saturates, even inf
    assert torch.equal(y, x.to(torch.float8_e4m3fn).float())  # exactly torch's cast


def test_non_saturating_option_gives_nan():
    p = get_precision("fp8-e4m3-emulated", grad_overflow="nan")
    assert p.grad_format is E4M3_NAN and p.forward_format is E4M3
    y = p.grad_format.round(torch.tensor([448.0, 460.0, 500.0, -1e9, 1.0]))
    assert y[0] == 448.0 and y[1] == 448.0 and math.isnan(y[2]) and math.isnan(y[3]) and y[4] == 1.0


def _overflowing_step(precision_kw):
    """A model under the E4M3 emulation trained at a loss scale that pushes gradients past 448."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 1))
    prec = get_precision("fp8-e4m3-emulated", **precision_kw)
    prec.prepare(model)
    scaler = build_scaler({"method": "dynamic", "style": "torch", "init_scale": 2.0**16}, model, prec.grad_format)
    opt = torch.optim.SGD(model.parameters(), lr=0.0)
    loss = model(torch.randn(16, 8) * 4).pow(2).mean()
    scaler.scale(loss).backward()
    scaler.step(opt)
    res = scaler.last_step
    scaler.update()
    return res, scaler.current_scale()


def test_dynamic_scaler_sees_overflow_only_when_e4m3_does_not_saturate():
    saturated, scale_sat = _overflowing_step({})
    assert not saturated.overflow and scale_sat == 2.0**16  # clipped at 448: nothing to see
    nan, scale_nan = _overflowing_step({"grad_overflow": "nan"})
    assert nan.overflow and nan.skipped and scale_nan == 2.0**15  # backed off


def test_saturation_telemetry_counts_a_known_tensor():
    g = torch.tensor([0.0, 2.0**-12, 2.0**-8, 1.0, 500.0, -600.0, float("inf")])
    nonzero, subnormal, flushed, saturated = E4M3.census(g).tolist()
    # 6 non-zero; below 2^-6: 2^-12 and 2^-8; at or below 2^-10: 2^-12; past 448: 500, -600, inf
    assert (nonzero, subnormal, flushed, saturated) == (6, 2, 1, 3)


def test_probe_reports_saturate_rate_per_layer():
    model = nn.Sequential(nn.Linear(4, 4))
    probe = UnderflowProbe(model, fmt=E4M3)
    probe.arm()
    out = model(torch.ones(2, 4))
    (out * 1e5).sum().backward()  # every output gradient is 1e5 > 448
    rates = probe.read()["0"]
    assert rates["saturate_rate"] == 1.0 and rates["flush_rate"] == 0.0


def test_probe_counts_parameter_gradients_before_the_emulation_rounds_them():
    """A weight gradient is a sum over the batch: it saturates where no activation gradient does.

    Linear(4, 1) on 64 rows of ones with output gradient 10 (below 448): the bias and weight
    gradients are 64 * 10 = 640 > 448. The emulation then clips them to 448, so a probe looking
    after the rounding could not tell; it is handed them before."""
    model = nn.Sequential(nn.Linear(4, 1))
    prec = get_precision("fp8-e4m3-emulated")
    emulation = prec.prepare(model)
    probe = UnderflowProbe(model, fmt=E4M3, emulation=emulation)
    probe.arm()
    (model(torch.ones(64, 4)) * 10.0).sum().backward()
    rates = probe.read()["0"]
    assert rates["saturate_rate"] == 0.0 and rates["param_saturate_rate"] == 1.0
    assert model[0].weight.grad.abs().max().item() == 448.0  # rounded (saturated) after the count
    probe.disarm()
    for p in model.parameters():
        p.grad = None
    probe.arm()
    (model(torch.ones(64, 4)) * 1e-3).sum().backward()  # 64e-3 per weight: neither flushed nor saturated
    rates = probe.read()["0"]
    assert rates["param_saturate_rate"] == 0.0 and rates["param_flush_rate"] == 0.0
    from lossscale_bench.precision.telemetry import summarize

    assert summarize({"0": rates})["param_saturate_rate_max"] == 0.0


def test_probe_without_an_emulation_hooks_parameter_gradients_itself():
    model = nn.Sequential(nn.Linear(4, 1))
    probe = UnderflowProbe(model, fmt=E4M3)  # fp32 training counted against E4M3
    probe.arm()
    (model(torch.ones(64, 4)) * 10.0).sum().backward()
    assert probe.read()["0"]["param_saturate_rate"] == 1.0
    assert model[0].weight.grad.abs().max().item() == 640.0  # nothing rounded
    other = nn.Sequential(nn.Linear(4, 1))
    off = UnderflowProbe(other, fmt=E4M3, param_grads=False)
    off.arm()
    (other(torch.ones(64, 4)) * 10.0).sum().backward()
    rates = off.read()["0"]
    assert rates["saturate_rate"] == 0.0 and "param_saturate_rate" not in rates


def test_block_scaled_gradient_precision():
    p = get_precision("fp8-e4m3-emulated", grad_blocks="mx32", block_rounding="floor")
    assert isinstance(p.grad_format, BlockScaledFormat) and p.grad_format.mode == "floor"
    g = torch.full((64,), 2.0**-14)  # flushes in plain E4M3, survives with a per-block scale
    assert E4M3.round(g).abs().sum() == 0
    assert torch.equal(p.grad_format.round(g), g)
    nonzero, _, flushed, saturated = p.grad_format.census(g).tolist()
    assert (nonzero, flushed, saturated) == (64, 0, 0)


@pytest.mark.parametrize(
    "precision,entry,path",
    [
        ("fp16-emulated", "{method: none, grad_blocks: mx32}", "scaling[0].grad_blocks"),
        ("fp8-e4m3-emulated", "{method: none, block_rounding: floor}", "scaling[0].block_rounding"),
        (
            "fp8-e4m3-emulated",
            "{method: none, grad_blocks: tile128, block_rounding: floor}",
            "scaling[0].block_rounding",
        ),
        ("fp8-emulated", "{method: dynamic, grad_overflow: nan}", "scaling[0].grad_overflow"),
        ("fp32", "{method: none, grad_overflow: nan}", "scaling[0].grad_overflow"),
    ],
)
def test_gradient_format_options_only_where_they_mean_something(precision, entry, path):
    with pytest.raises(StudyError) as err:
        load_study_text(one_entry_study(entry, precision), source="x.yaml")
    assert str(err.value).startswith(f"x.yaml: {path}: ")


def test_gradient_format_options_enter_the_trial_id_only_when_set():
    def trial(entry):
        return load_study_text(one_entry_study(entry, "fp8-e4m3-emulated")).trials()[0]

    plain, sat = trial("{method: none}"), trial("{method: none, grad_overflow: saturate}")
    assert plain.trial_id == sat.trial_id  # the default is the same trial
    mx = trial("{method: none, grad_blocks: mx32}")
    assert mx.trial_id != plain.trial_id and mx.label == "no loss scale (MX32 block scaled, ceil grads)"
    assert trial("{method: none, grad_overflow: nan}").label == "no loss scale (grad overflow -> NaN)"
