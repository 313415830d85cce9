"""A dynamic scale halved to nothing ends the trial ``diverged`` with the reason,
not a ``ZeroDivisionError`` when the next step unscales by 1/0."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from lossscale_bench.backends import get_backend
from lossscale_bench.engine import DivergenceHook, MetricsHook, Trainer, TrialDiverged
from lossscale_bench.engine.hooks import SCALE_FLOOR
from lossscale_bench.engine.sink import MemorySink
from lossscale_bench.precision import get_precision
from lossscale_bench.scaling import build_scaler


class _InfGrad(torch.autograd.Function):
    """Identity forward, an infinite gradient backward: every step overflows, the loss stays finite."""

    @staticmethod
    def forward(ctx, x):
        return x.clone()

    @staticmethod
    def backward(ctx, g):
        return torch.full_like(g, float("inf"))


class _AlwaysOverflows(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.ones(()))

    def forward(self, images, targets):
        return {"main": _InfGrad.apply(self.w) * torch.stack(images).mean()}


def _batches():
    i = 0
    while True:
        i += 1
        yield i, [torch.full((3, 2, 2), 0.5)], [{}]


@pytest.mark.parametrize("policy", ["stop", "continue"])
def test_collapsed_dynamic_scale_is_a_divergence(policy):
    model = _AlwaysOverflows()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    sink = MemorySink()
    # torch style has no floor (min_scale 0); max_consecutive_skips is set past the collapse
    scaler = build_scaler({"method": "dynamic", "style": "torch", "init_scale": 1024.0})
    div = DivergenceHook(sink, patience=10, max_consecutive_skips=10_000, policy=policy, check_every=10)
    tr = Trainer(
        model=model,
        optimizer=opt,
        scheduler=torch.optim.lr_scheduler.LambdaLR(opt, lambda i: 1.0),
        scaler=scaler,
        backend=get_backend("cpu"),
        precision=get_precision("fp32"),
        batches=_batches(),
        iterations=1000,
        hooks=[MetricsHook(sink, 10), div],
        sync_every=10,
    )
    with pytest.raises(TrialDiverged) as err:
        tr.run()
    assert "loss scale collapsed" in err.value.reason
    assert scaler.current_scale() < SCALE_FLOOR
    # 1024 = 2^10 halves below 2^-126 after 137 overflowing steps: stopped right there
    assert err.value.step == tr.state.step == 137
    assert sink.tag_values["lsbench.diverged_reason"] == err.value.reason
