"""The per-layer base's contract (scaling/per_layer/scaler.py), as a new method sees it.

Why: README's recipe tells a new per-layer method to write only ``point_scale`` (or
``layer_factor``); these tests hold the base to what its docstrings promise: a point's absolute
scale is the scale the gradient it sends upstream carries, parameter gradients come back unscaled,
the metrics and table name the points, and a rule left unwritten is refused at construction.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

from lossscale_bench.core.registry import LAYER_SCALE_SUFFIX
from lossscale_bench.scaling.per_layer import LOSS_POINT, PerLayerLossScaler, PointLossScaler

#: a different power of two per point (the loss first), so a misplaced scale shows
SCALES = {LOSS_POINT: 2.0**3, "0": 2.0**9, "2": 2.0**-2, "5": 2.0**6}


class _Fixed(PointLossScaler):
    method = "fixed_points"
    metric_prefix = "fp_"

    def __init__(self, model, **kwargs):
        super().__init__(model, init_scale=SCALES[LOSS_POINT], **kwargs)
        self.seen: dict[str, float] = {}  # point -> the scale that arrived at its layer

    def point_scale(self, k, grad, incoming, from_loss):
        self.seen[self.points[k]] = (float(incoming), from_loss)
        return torch.tensor(SCALES[self.points[k]])

    def point_scales(self):
        return dict(SCALES)

    def current_scale(self):
        return SCALES[LOSS_POINT]


def _chain():
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Conv2d(3, 4, 3), nn.ReLU(), nn.Conv2d(4, 4, 3), nn.ReLU(), nn.Flatten(), nn.Linear(4 * 4 * 4, 5)
    )


def _loss(model):
    x = torch.randn(2, 3, 8, 8, generator=torch.Generator().manual_seed(0))
    return (model(x) ** 2).mean()


def test_point_scales_are_what_the_gradients_carry_and_unscale_exactly():
    model = _chain()
    _loss(model).backward()
    ref = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    scaler = _Fixed(model)
    scaler.scale(_loss(model)).backward()
    # the Linear (5) gets the loss's scale, the conv below it the Linear's point's; the first conv sends
    # nothing upstream (its input needs no gradient), so it is not asked: its parameters carry point 2's
    assert scaler.seen == {"5": (SCALES[LOSS_POINT], True), "2": (SCALES["5"], False)}
    scaler.step(torch.optim.SGD(model.parameters(), lr=0.0))
    for got, want in zip((p.grad for p in model.parameters()), ref):
        torch.testing.assert_close(got, want, rtol=1e-6, atol=0)
    rows = {r["layer"]: r for r in scaler.layer_table()}
    assert {n: r["point_scale"] for n, r in rows.items()} == {n: SCALES[n] for n in ("0", "2", "5")}
    assert rows["2"]["scale"] == SCALES["2"] / SCALES["5"]  # the factor: the point's scale over the arrived one
    m = scaler.metrics()
    assert m["loss_scale"] == SCALES[LOSS_POINT] and f"fp_point_{LAYER_SCALE_SUFFIX}" in m
    assert m[f"fp_{LAYER_SCALE_SUFFIX}"] == -2.5  # log2 of the factors applied: 3 (2^6 / 2^3), -8 (2^-2 / 2^6)
    scaler.update()
    scaler.remove()
    assert all("forward" not in mod.__dict__ for mod in model.modules())


def test_a_rule_left_unwritten_is_refused_and_leaves_the_model_alone():
    class NoRule(PerLayerLossScaler):
        method = "no_rule"

    model = _chain()
    with pytest.raises(TypeError, match="layer_factor"):
        NoRule(model)
    assert all("forward" not in mod.__dict__ for mod in model.modules())
    with pytest.raises(ValueError, match="needs the model"):
        _Fixed(None)


@pytest.mark.parametrize("scale", [1.0, 3.0, 2.0**20, 2.0**-130, 1e-45, 0.0, -0.0, float("inf"), float("nan"), 0.1])
def test_unscale_group_on_the_host_is_the_tensor_path(scale):
    # the CPU path computes the reciprocal and its flag on the host (2 dispatches instead of 6 a group); a 0-d
    # float64 scale takes the tensor path, whose reciprocal of the same fp32 value must give the same gradients and flag
    from lossscale_bench.scaling.base import unscale_group_

    gen = torch.Generator().manual_seed(1)
    base = [torch.randn(5, 3, generator=gen) * 1e3, torch.randn(7, generator=gen)]
    base[1][2] = float("inf") if scale == 3.0 else base[1][2]
    results = []
    for s in (torch.tensor(scale, dtype=torch.float32), torch.tensor(scale, dtype=torch.float32).double()):
        grads, found = [g.clone() for g in base], torch.zeros(1)
        unscale_group_(grads, s, found)
        results.append((grads, float(found)))
    (host, host_found), (tensor, tensor_found) = results
    assert host_found == tensor_found
    # flagged: a non-finite gradient (planted for 3.0) or a reciprocal that is not finite in fp32 (0, 2**-130, NaN)
    expect_bad = scale == 3.0 or scale == 0.0 or scale != scale or abs(scale) < 2.0**-128
    assert host_found == (1.0 if expect_bad else 0.0)
    for a, b in zip(host, tensor):
        assert torch.equal(a.isnan(), b.isnan()) and torch.equal(a.nan_to_num(), b.nan_to_num())
