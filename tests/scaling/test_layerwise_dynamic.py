"""layerwise_dynamic: per-point backoff/growth as fairscale's LayerwiseGradientScaler, exact unscaling,
placement of the scales on a chain, checkpoint continuation, telemetry.

The reference rule is ``LayerwiseGradientScaler._update_scale`` and ``step`` in
``fairscale/optim/layerwise_gradient_scaler.py`` (facebookresearch/fairscale
146f1602, 2025-04-26), transcribed in :func:`_fairscale_update`.
"""

from __future__ import annotations

import math
import random

import pytest
import torch
from torch import nn

from lossscale_bench.models import build_model
from lossscale_bench.precision import install_fp16_emulation
from lossscale_bench.scaling import build_scaler
from lossscale_bench.scaling.layerwise_dynamic import LayerwiseDynamicLossScaler
from lossscale_bench.scaling.per_layer import LOSS_POINT


def _through_checkpoint(state):
    """What trial.py does with a scaler's state: torch.save, then torch.load(weights_only=True)."""
    import io

    buf = io.BytesIO()
    torch.save({"scaler": state}, buf)
    buf.seek(0)
    return torch.load(buf, map_location="cpu", weights_only=True)["scaler"]


def _chain():
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Conv2d(3, 4, 3), nn.ReLU(), nn.Conv2d(4, 4, 3), nn.ReLU(), nn.Flatten(), nn.Linear(4 * 4 * 4, 5)
    )


def _chain_loss(model, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(2, 3, 8, 8, generator=g)
    return (model(x) ** 2).mean()


# which point's scale each layer's parameters carry on the chain (the layer below it in backward)
CARRIES = {"0": "2", "2": "5", "5": LOSS_POINT}


def _fairscale_update(layers, backoff=0.5, growth=2.0, interval=3, lo=0.0, hi=float("inf")):
    """fairscale LayerwiseGradientScaler._update_scale, over dicts with found_inf_or_nan/scaling_factor/growth_tracker."""
    for layer in layers:
        if layer["found_inf_or_nan"]:
            layer["scaling_factor"] = max(lo, min(backoff * layer["scaling_factor"], hi))
            layer["growth_tracker"] = 0
        else:
            layer["growth_tracker"] += 1
            if layer["growth_tracker"] == interval:
                layer["scaling_factor"] = max(lo, min(growth * layer["scaling_factor"], hi))
                layer["growth_tracker"] = 0


def test_parameters_carry_their_points_scale_and_unscale_exactly():
    model = _chain()
    _chain_loss(model).backward()
    ref = {n: p.grad.clone() for n, p in model.named_parameters()}
    model.zero_grad(set_to_none=True)
    scaler = LayerwiseDynamicLossScaler(model, init_scale=1.0)
    scaler._scales = [2.0**5, 2.0**-3, 2.0**9, 2.0**2]  # points: loss, "0", "2", "5"
    pts = dict(zip(scaler.points, scaler._scales))
    scaler.scale(_chain_loss(model)).backward()
    for n, p in model.named_parameters():
        assert torch.equal(p.grad, ref[n] * pts[CARRIES[n.split(".")[0]]]), n
    scaler.step(torch.optim.SGD(model.parameters(), lr=0.0))
    res = scaler.last_step
    assert (res.skipped, res.overflow, res.scale) == (False, False, 2.0**5)
    for n, p in model.named_parameters():
        assert torch.equal(p.grad, ref[n]), n
    scaler.remove()


@pytest.mark.parametrize("seed", [0, 1])
def test_each_point_backs_off_on_its_own_overflow_and_grows_on_its_own_interval(seed):
    model = _chain()
    scaler = LayerwiseDynamicLossScaler(model, init_scale=2.0**8, interval=3)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    layer_of = {"0": model[0], "2": model[2], "5": model[5]}
    # reference state: the points that carry parameters (point "0" carries none: the input needs no gradient)
    ref = {
        name: {"found_inf_or_nan": False, "scaling_factor": 2.0**8, "growth_tracker": 0}
        for name in (LOSS_POINT, "2", "5")
    }
    rng = random.Random(seed)
    for step in range(40):
        bad = {n for n in ("0", "2", "5") if rng.random() < 0.15}
        before = [p.detach().clone() for p in model.parameters()]
        opt.zero_grad(set_to_none=True)
        scaler.scale(_chain_loss(model, step)).backward()
        for n in bad:  # an overflow in this layer's own weight gradient
            layer_of[n].weight.grad[0].fill_(math.inf)
        scaler.step(opt)
        res = scaler.last_step
        scaler.update()
        for n in ref:
            ref[n]["found_inf_or_nan"] = any(CARRIES[layer] == n for layer in bad)
        _fairscale_update(list(ref.values()), interval=3)
        # fairscale's step: skipped when any layer found an inf/NaN
        assert res.skipped == res.overflow == bool(bad)
        assert all(torch.equal(a, b) for a, b in zip(before, model.parameters())) == bool(bad)
        got = scaler.point_scales()
        assert {n: got[n] for n in ref} == {n: r["scaling_factor"] for n, r in ref.items()}, step
        assert got["0"] == 2.0**8  # never carried anything: neither grows nor backs off
    scaler.remove()


def _tiny_batch(n=2, size=128, seed=1):
    g = torch.Generator().manual_seed(seed)
    images = [torch.rand(3, size, size, generator=g) for _ in range(n)]
    targets = [
        {"boxes": torch.tensor([[10.0, 12.0, 60.0, 70.0], [40.0, 30.0, 120.0, 100.0]]), "labels": torch.tensor([1, 2])}
        for _ in range(n)
    ]
    return images, targets


def test_ssd_tiny_exact_with_random_point_scales():
    """On a real SSD (branches, merges, BatchNorm): any power-of-two point scales unscale exactly."""
    torch.manual_seed(0)
    model = build_model("ssd_tiny", num_classes=4)
    model.train()
    images, targets = _tiny_batch()
    sum(model(images, targets).values()).backward()
    ref = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    model.zero_grad(set_to_none=True)
    scaler = LayerwiseDynamicLossScaler(model)
    rng = random.Random(3)
    scaler._scales = [2.0 ** rng.randint(-4, 12) for _ in scaler.points]
    scaler.scale(sum(model(images, targets).values())).backward()
    scaler.step(torch.optim.SGD(model.parameters(), lr=0.0))
    res = scaler.last_step
    assert not res.overflow
    for n, p in model.named_parameters():
        if n in ref:
            assert torch.allclose(p.grad, ref[n], rtol=1e-5, atol=1e-12), n
    scaler.remove()


def _train(model, scaler, steps, start=0):
    opt = torch.optim.SGD(model.parameters(), lr=1e-3, momentum=0.9)
    results = []
    for i in range(start, start + steps):
        images, targets = _tiny_batch(seed=i)
        opt.zero_grad(set_to_none=True)
        scaler.scale(sum(model(images, targets).values())).backward()
        scaler.step(opt)
        results.append(scaler.last_step)
        scaler.update()
    return opt, results


def test_fp16_overflow_backs_off_and_checkpoint_continues_identically():
    """Under fp16 emulation a huge start overflows; points back off until steps go through. A state
    saved mid-way and loaded into a fresh scaler (and model/optimizer) continues bit for bit."""

    def fresh():
        torch.manual_seed(0)
        m = build_model("ssd_tiny", num_classes=4)
        m.train()
        install_fp16_emulation(m)
        return m, LayerwiseDynamicLossScaler(m, init_scale=2.0**20, interval=3)

    model, scaler = fresh()
    opt, res = _train(model, scaler, 6)
    assert res[0].skipped and res[0].overflow
    assert not all(r.skipped for r in res)
    assert res[-1].scale < 2.0**20 and min(scaler.point_scales().values()) < 2.0**20
    saved = (scaler.state_dict(), {k: v.clone() for k, v in model.state_dict().items()}, opt.state_dict())
    _, more = _train(model, scaler, 4, start=6)
    final = {k: v.clone() for k, v in model.state_dict().items()}

    model2, scaler2 = fresh()
    model2.load_state_dict(saved[1])
    scaler2.load_state_dict(_through_checkpoint(saved[0]))
    assert scaler2.state_dict() == saved[0]
    opt2 = torch.optim.SGD(model2.parameters(), lr=1e-3, momentum=0.9)
    opt2.load_state_dict(saved[2])
    for i in range(6, 10):
        images, targets = _tiny_batch(seed=i)
        opt2.zero_grad(set_to_none=True)
        scaler2.scale(sum(model2(images, targets).values())).backward()
        scaler2.step(opt2)
        r = scaler2.last_step
        scaler2.update()
        assert (r.skipped, r.scale) == (more[i - 6].skipped, more[i - 6].scale)
    assert scaler2.state_dict() == scaler.state_dict()
    assert all(torch.equal(final[k], v) for k, v in model2.state_dict().items())


def test_telemetry_and_factory():
    torch.manual_seed(0)
    model = build_model("ssd_tiny", num_classes=4)
    model.train()
    scaler = build_scaler({"method": "layerwise_dynamic", "init_scale": 1024.0, "interval": 5}, model)
    assert isinstance(scaler, LayerwiseDynamicLossScaler) and scaler.interval == 5
    _train(model, scaler, 1)
    m = scaler.metrics()
    assert m["loss_scale"] == 1024.0
    assert {
        "lw_point_scale_log2_min",
        "lw_point_scale_log2_max",
        "lw_points_backed_off",
        "lw_scale_log2_median",
        "lw_merge_points",
    } <= set(m)
    rows = scaler.layer_table()
    assert rows and all({"layer", "scale", "accum_scale", "point_scale", "growth_tracker"} <= set(r) for r in rows)
    applied = [r for r in rows if r["applied"]]
    # a layer's factor brings the arriving scale to its point's scale
    assert all(r["accum_scale"] == r["point_scale"] for r in applied)
    scaler.remove()
    assert all("forward" not in mod.__dict__ for mod in model.modules())
