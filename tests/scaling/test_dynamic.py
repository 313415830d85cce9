"""Dynamic loss scaling: torch style against torch.amp.GradScaler itself, chainer style by its rules."""

from __future__ import annotations

import math
import random

import pytest
import torch

from lossscale_bench.scaling import DynamicLossScaler, FixedLossScaler, NoLossScaler, build_scaler


def _drive(scaler_step, pattern, param, opt):
    """Feed a sequence of overflow flags; return (scales, skipped) as the scaler saw them."""
    scales, skipped = [], []
    for overflow in pattern:
        opt.zero_grad()
        before = param.detach().clone()
        g = torch.full_like(param, float("inf") if overflow else 1.0)
        scale = scaler_step(g)
        scales.append(scale)
        skipped.append(torch.equal(before, param.detach()))
    return scales, skipped


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_torch_style_matches_gradscaler(seed):
    rng = random.Random(seed)
    pattern = [rng.random() < 0.3 for _ in range(60)] + [False] * 10
    interval = 3

    p1 = torch.nn.Parameter(torch.zeros(4))
    o1 = torch.optim.SGD([p1], lr=0.1)
    gs = torch.amp.GradScaler("cpu", init_scale=2.0**16, growth_interval=interval)

    def gs_step(g):
        gs.scale(torch.ones(()))  # GradScaler creates its scale lazily in scale()
        scale = gs.get_scale()
        # the gradient a scaled backward would produce
        p1.grad = g * scale
        gs.step(o1)
        gs.update()
        return scale

    p2 = torch.nn.Parameter(torch.zeros(4))
    o2 = torch.optim.SGD([p2], lr=0.1)
    ours = DynamicLossScaler(style="torch", interval=interval)
    results = []

    def our_step(g):
        scale = ours.current_scale()
        p2.grad = g * scale
        ours.step(o2)
        results.append(ours.last_step)
        ours.update()
        return scale

    s1, k1 = _drive(gs_step, pattern, p1, o1)
    s2, k2 = _drive(our_step, pattern, p2, o2)
    assert s1 == s2
    assert k1 == k2 == pattern
    assert [r.skipped for r in results] == pattern
    assert [r.overflow for r in results] == pattern
    assert torch.equal(p1, p2)


def test_chainer_style_rules():
    s = DynamicLossScaler(style="chainer", interval=4)
    p = torch.nn.Parameter(torch.zeros(2))
    opt = torch.optim.SGD([p], lr=0.1)
    seen = []
    for overflow in [False, False, False, True, False, False, False, False, True]:
        seen.append(s.current_scale())
        p.grad = torch.full_like(p, float("nan") if overflow else 1.0)
        s.step(opt)
        res = s.last_step
        assert res.skipped == overflow
        s.update()
    # doubles until the first overflow: 1, 2, 4, 8 (overflow) -> 4, then x 2**(1/4) per clean step
    assert seen[:4] == [1.0, 2.0, 4.0, 8.0]
    assert seen[4] == 4.0
    for i in range(5, 9):
        assert seen[i] == pytest.approx(4.0 * 2 ** ((i - 4) / 4))
    assert s.current_scale() == pytest.approx(seen[8] / 2)


def test_chainer_style_clamps():
    s = DynamicLossScaler(style="chainer", interval=10)
    p = torch.nn.Parameter(torch.zeros(1))
    opt = torch.optim.SGD([p], lr=0.1)
    for _ in range(40):
        p.grad = torch.ones(1)
        s.step(opt)
        s.update()
    assert s.current_scale() == 65504.0
    for _ in range(40):
        p.grad = torch.full((1,), float("inf"))
        s.step(opt)
        s.update()
    assert s.current_scale() == 1.0


def test_state_dict_roundtrip():
    s = DynamicLossScaler(style="torch", interval=5)
    p = torch.nn.Parameter(torch.zeros(1))
    opt = torch.optim.SGD([p], lr=0.1)
    for flag in [False, True, False, False]:
        p.grad = torch.full((1,), math.inf if flag else 1.0)
        s.step(opt)
        s.update()
    t = DynamicLossScaler(style="torch", interval=5)
    t.load_state_dict(s.state_dict())
    assert t.state_dict() == s.state_dict()


def test_fixed_skips_and_none_does_not():
    p = torch.nn.Parameter(torch.zeros(1))
    opt = torch.optim.SGD([p], lr=1.0)
    fixed = FixedLossScaler(128)
    p.grad = torch.full((1,), 128.0)
    fixed.step(opt)
    r = fixed.last_step
    fixed.update()  # GradScaler's rule: one step per optimizer between updates
    assert (r.skipped, r.overflow, r.scale) == (False, False, 128.0)
    assert p.item() == pytest.approx(-1.0)  # unscaled before the step
    p.grad = torch.full((1,), math.inf)
    fixed.step(opt)
    r = fixed.last_step
    fixed.update()
    assert r.skipped and r.overflow and p.item() == pytest.approx(-1.0)

    none = NoLossScaler()
    p.grad = torch.full((1,), math.inf)
    none.step(opt)
    r = none.last_step
    assert r.overflow and not r.skipped and math.isinf(p.item())


def test_build_scaler_from_entries():
    assert isinstance(build_scaler({"method": "none"}), NoLossScaler)
    assert build_scaler({"method": "fixed", "scale": 8}).current_scale() == 8
    d = build_scaler({"method": "dynamic", "style": "torch", "interval": 2000, "init_scale": 65536.0})
    assert d.current_scale() == 65536.0 and d.interval == 2000
    with pytest.raises(ValueError):
        FixedLossScaler(0)
