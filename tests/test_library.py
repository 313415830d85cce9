"""The public factory in a loop written for torch.amp.GradScaler (lossscale_bench/library.py, scaling/base.py)."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch
from torch import nn

import lossscale_bench
from lossscale_bench import create_precision, create_scaler, layer_telemetry

GS = {"init_scale": 2.0**10, "growth_factor": 2.0, "backoff_factor": 0.5, "growth_interval": 3}
OVERFLOW_STEPS = {2, 3, 9}  # an inf put into a gradient on these steps


def _model(seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(4, 16), nn.ReLU(), nn.Linear(16, 3))


def _data(step: int):
    g = torch.Generator().manual_seed(100 + step)
    return torch.randn(8, 4, generator=g), torch.randn(8, 3, generator=g)


def gradscaler_loop(scaler, model, opt, steps, start=0):
    """The loop as written for GradScaler: scale, backward, unscale_, clip, step, update."""
    scales = []
    for step in range(start, start + steps):
        x, y = _data(step)
        opt.zero_grad(set_to_none=True)
        loss = nn.functional.mse_loss(model(x), y)
        scaler.scale(loss).backward()
        if step in OVERFLOW_STEPS:
            next(model.parameters()).grad[0, 0] = float("inf")
        scaler.unscale_(opt)
        nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        scaler.step(opt)
        scaler.update()
        scales.append(scaler.get_scale())
    return scales


def _weights(model):
    return [p.detach().clone() for p in model.parameters()]


def test_dynamic_torch_style_is_gradscaler_step_for_step():
    ref_model, our_model = _model(), _model()
    ref_opt = torch.optim.SGD(ref_model.parameters(), lr=0.1, momentum=0.9)
    our_opt = torch.optim.SGD(our_model.parameters(), lr=0.1, momentum=0.9)
    ref = torch.amp.GradScaler("cpu", **GS)
    ours = create_scaler("dynamic", style="torch", **GS)
    ref_scales = gradscaler_loop(ref, ref_model, ref_opt, 12)
    our_scales = gradscaler_loop(ours, our_model, our_opt, 12)
    assert our_scales == ref_scales
    assert len(set(ref_scales)) > 2  # the scale backed off and grew: the comparison means something
    assert all(torch.equal(a, b) for a, b in zip(_weights(ref_model), _weights(our_model)))


def test_state_dict_round_trip_in_the_middle_continues_identically():
    ref_model, our_model = _model(), _model()
    ref_opt = torch.optim.SGD(ref_model.parameters(), lr=0.1)
    our_opt = torch.optim.SGD(our_model.parameters(), lr=0.1)
    ref = torch.amp.GradScaler("cpu", **GS)
    ours = create_scaler("dynamic", style="torch", **GS)
    ref_scales = gradscaler_loop(ref, ref_model, ref_opt, 6)
    our_scales = gradscaler_loop(ours, our_model, our_opt, 6)
    resumed = create_scaler("dynamic", style="torch", **GS)
    resumed.load_state_dict(ours.state_dict())
    ref_scales += gradscaler_loop(ref, ref_model, ref_opt, 8, start=6)
    our_scales += gradscaler_loop(resumed, our_model, our_opt, 8, start=6)
    assert our_scales == ref_scales
    assert all(torch.equal(a, b) for a, b in zip(_weights(ref_model), _weights(our_model)))


def _hooks_and_patches(model: nn.Module) -> list[str]:
    found = []
    for name, m in model.named_modules():
        if "forward" in m.__dict__:
            found.append(f"{name}: instance forward")
        for attr in ("_forward_hooks", "_forward_pre_hooks", "_backward_hooks", "_backward_pre_hooks"):
            if getattr(m, attr):
                found.append(f"{name}: {attr}")
    for name, p in model.named_parameters():
        if getattr(p, "_post_accumulate_grad_hooks", None) or p._backward_hooks:
            found.append(f"{name}: parameter hook")
    return found


def test_adaptive_runs_in_the_same_loop_as_a_context_manager_and_leaves_nothing():
    model = _model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with create_scaler("adaptive", model) as scaler:
        assert _hooks_and_patches(model)  # patched inside the block
        scales = gradscaler_loop(scaler, model, opt, 5)
        assert scaler.last_step is not None and scales == [1.0] * 5
        assert len(scaler.layer_table()) == 2
    assert _hooks_and_patches(model) == []
    assert all(torch.isfinite(p).all() for p in model.parameters())


def test_per_layer_scaler_is_removed_on_an_exception_and_a_second_one_is_refused():
    model = _model()
    with pytest.raises(KeyError):
        with create_scaler("amax", model):
            raise KeyError("boom")
    assert _hooks_and_patches(model) == []
    first = create_scaler("adaptive", model)
    with pytest.raises(ValueError, match=r"already held by <AdaptiveLossScaler method='adaptive'.*remove\(\)"):
        create_scaler("layerwise_dynamic", model)
    first.remove()
    create_scaler("layerwise_dynamic", model).remove()
    assert _hooks_and_patches(model) == []


def test_factory_errors_are_one_clear_line():
    with pytest.raises(ValueError, match=r"create_scaler\('adaptive'\) needs the model"):
        create_scaler("adaptive")
    with pytest.raises(TypeError, match=r"unknown option 'grow'; allowed: .*interval"):
        create_scaler("dynamic", grow=2)
    with pytest.raises(TypeError, match="not both"):
        create_scaler("dynamic", interval=3, growth_interval=3)
    with pytest.raises(ValueError, match="unknown scaling method 'nope'"):
        create_scaler("nope")


def test_precision_gives_the_gradient_format():
    model = _model()
    with create_scaler("adaptive", model) as plain:
        assert plain.grad_format.name == "fp16"  # the documented default without a precision
    with create_scaler("adaptive", model, precision="fp8-emulated") as fp8:
        assert fp8.grad_format.name == create_precision("fp8-emulated").grad_format.name == "e5m2"
    assert create_scaler("saturation", precision="fp8-e4m3-emulated").grad_format.max == 448.0


def test_gradscaler_interface_details():
    model = _model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    scaler = create_scaler("fixed", scale=8.0)
    assert scaler.is_enabled() and scaler.get_scale() == 8.0
    x, y = _data(0)
    a, b = scaler.scale([model(x).sum(), (model(x).mean(),)])
    assert isinstance(b, tuple) and a.grad_fn is not None
    scaler.scale(nn.functional.mse_loss(model(x), y)).backward()
    scaler.unscale_(opt)
    with pytest.raises(RuntimeError, match="already been called on this optimizer"):
        scaler.unscale_(opt)
    out = scaler.step(opt)
    assert out is None and not scaler.last_step.skipped  # SGD.step returns None (its loss without a closure)
    with pytest.raises(RuntimeError, match="after step"):
        scaler.unscale_(opt)
    scaler.update(new_scale=32.0)
    assert scaler.get_scale() == 32.0

    off = create_scaler("adaptive", model, enabled=False)
    assert not off.is_enabled() and off.get_scale() == 1.0 and off.state_dict() == {}
    loss = model(x).sum()
    assert off.scale(loss) is loss and _hooks_and_patches(model) == []


class _Returns(torch.optim.SGD):
    def step(self, closure=None):
        super().step()
        return "stepped"


def test_step_returns_the_optimizers_result_and_none_when_skipped():
    model = _model()
    opt = _Returns(model.parameters(), lr=0.1)
    scaler = create_scaler("dynamic", style="torch", init_scale=4.0)
    x, y = _data(0)
    scaler.scale(nn.functional.mse_loss(model(x), y)).backward()
    assert scaler.step(opt) == "stepped"
    scaler.update()
    scaler.scale(nn.functional.mse_loss(model(x), y)).backward()
    next(model.parameters()).grad[0, 0] = float("nan")
    assert scaler.step(opt) is None and scaler.last_step.skipped
    scaler.update()
    assert scaler.get_scale() == 2.0


def test_several_optimizers_in_one_step_as_gradscaler():
    ref_model, our_model = _model(), _model()

    def opts(m):
        return [torch.optim.SGD(m[0].parameters(), lr=0.1), torch.optim.SGD(m[2].parameters(), lr=0.1)]

    ref_opts, our_opts = opts(ref_model), opts(our_model)
    ref = torch.amp.GradScaler("cpu", **GS)
    ours = create_scaler("dynamic", style="torch", **GS)
    for step in range(6):
        for scaler, model, os in ((ref, ref_model, ref_opts), (ours, our_model, our_opts)):
            x, y = _data(step)
            for o in os:
                o.zero_grad()
            scaler.scale(nn.functional.mse_loss(model(x), y)).backward()
            if step == 2:  # an overflow in the first optimizer's gradients: it skips, the second steps,
                # and the scale backs off (GradScaler's flags: one per optimizer, all of them for update)
                model[0].weight.grad[0, 0] = float("inf")
            scaler.unscale_(os[0])
            for o in os:
                scaler.step(o)
            scaler.update()
        assert ref.get_scale() == ours.get_scale()
    assert all(torch.equal(a, b) for a, b in zip(_weights(ref_model), _weights(our_model)))


def test_layer_telemetry_gives_plain_numbers_per_layer():
    model = _model()
    precision = create_precision("fp8-emulated")
    handle = precision.prepare(model)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with create_scaler("adaptive", model, precision=precision) as scaler:
        with layer_telemetry(model, scaler=scaler, precision=precision, emulation=handle) as tel:
            tel.arm()
            gradscaler_loop(scaler, model, opt, 1)
            rows = tel.read()
    handle.remove()
    assert set(rows) == {"0", "2"}
    for row in rows.values():
        assert all(type(v) is float for v in row.values())
        assert {"flush_rate", "saturate_rate", "scale", "accum_scale"} <= set(row)
    assert "flush_rate_max" in tel.summary(rows)


def test_importing_the_package_stays_torch_free():
    code = "import sys, lossscale_bench; assert 'torch' not in sys.modules; print(lossscale_bench.__all__)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "create_scaler" in out.stdout
    assert lossscale_bench.create_scaler is create_scaler


def test_a_per_layer_rule_learns_of_a_skipped_step_through_the_public_hook():
    from lossscale_bench.scaling.per_layer import PerLayerLossScaler

    class Recording(PerLayerLossScaler):
        method = "recording"

        def __init__(self, model):
            super().__init__(model)
            self.outcomes = []

        def layer_factor(self, it, layer, grad, weight, incoming):
            return torch.ones((), dtype=torch.float32)

        def after_step(self, result):
            self.outcomes.append((result.skipped, self.overflowed))

    model = _model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with Recording(model) as scaler:
        gradscaler_loop(scaler, model, opt, 4)  # an inf on steps 2 and 3
    assert scaler.outcomes == [(False, False), (False, False), (True, True), (True, True)]
