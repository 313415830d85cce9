"""No host read of the loss per step (``Trainer(sync_every=N)``): losses stay on the device until the
metrics/divergence hooks read a window at once; the logged history and the divergence verdict are the
ones of a step-by-step read, and a ``stop`` lands at the end of the window."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from lossscale_bench.backends import get_backend
from lossscale_bench.engine import DivergenceHook, MetricsHook, Trainer, TrialDiverged
from lossscale_bench.engine.hooks import Hook
from lossscale_bench.engine.loop import StopTraining
from lossscale_bench.engine.sink import MemorySink
from lossscale_bench.precision import get_precision
from lossscale_bench.scaling.fixed import NoLossScaler


class _Toy(nn.Module):
    """loss = w * mean(image): an image of inf at step ``bad_from`` makes that loss and gradient inf."""

    def __init__(self) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.ones(()))

    def forward(self, images, targets):
        x = torch.stack(images).mean()
        return {"main": self.w * x, "aux": 0.5 * self.w * self.w}


def _batches(bad_from: int | None):
    i = 0
    while True:
        i += 1
        val = math.inf if bad_from is not None and i >= bad_from else 0.1 * i
        yield i, [torch.full((3, 2, 2), val)], [{}]


class _Seen(Hook):
    """Notes, before the metrics hook runs, whether each step's loss had already reached the host."""

    def __init__(self) -> None:
        self.read_at_step: dict[int, bool] = {}

    def after_step(self, trainer, record) -> None:
        self.read_at_step[record.step] = record.is_read


class _StopAt(Hook):
    def __init__(self, step: int) -> None:
        self.step = step

    def after_step(self, trainer, record) -> None:
        if record.step == self.step:
            raise StopTraining("asked to")


def _run(sync_every: int, iterations: int = 12, bad_from=None, patience=2, extra_hooks=(), policy="stop"):
    torch.manual_seed(0)
    model = _Toy()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda i: 1.0)
    sink = MemorySink()
    seen = _Seen()
    div = DivergenceHook(sink, patience=patience, policy=policy, check_every=sync_every)
    hooks = [seen, MetricsHook(sink, log_every=sync_every), div, *extra_hooks]
    tr = Trainer(
        model=model,
        optimizer=opt,
        scheduler=sched,
        scaler=NoLossScaler(),
        backend=get_backend("cpu"),
        precision=get_precision("fp32"),
        batches=_batches(bad_from),
        iterations=iterations,
        hooks=hooks,
        sync_every=sync_every,
    )
    stopped = None
    try:
        tr.run()
    except StopTraining as exc:
        stopped = exc
    return tr, sink, seen, div, stopped


def test_losses_read_a_window_at_a_time_same_history():
    _, eager, seen1, _, _ = _run(1, iterations=10)
    _, lazy, seen4, _, _ = _run(4, iterations=10)
    assert all(seen1.read_at_step.values())
    # steps 1..10 with windows closing at 4, 8 and the last step: no step's loss was on the host yet
    assert not any(seen4.read_at_step.values())
    for key in ("loss", "loss_main", "loss_aux", "skipped_steps", "loss_scale", "lr"):
        assert lazy.history(key) == eager.history(key), key
    assert [s for s, _ in lazy.history("loss")] == list(range(1, 11))


def test_images_per_sec_is_the_window_throughput():
    _, sink, _, _, _ = _run(4, iterations=10)
    rate = dict(sink.history("images_per_sec"))
    assert rate[1] == rate[2] == rate[3] == rate[4] and rate[5] == rate[8] and rate[9] == rate[10]
    assert all(0 < v < math.inf for v in rate.values())


@pytest.mark.parametrize("sync_every", [1, 4, 5])
def test_diverged_step_exact_stop_at_the_window_end(sync_every):
    tr, sink, _, div, stopped = _run(sync_every, bad_from=5, patience=2)
    assert isinstance(stopped, TrialDiverged)
    assert stopped.step == sink.tag_values["lsbench.diverged_step"] == 5
    assert "from step 5" in stopped.reason
    # judged at step 6 (patience 2); acted on when the window that holds step 6 closes
    assert tr.state.step == {1: 6, 4: 8, 5: 10}[sync_every]
    loss = dict(sink.history("loss"))
    assert math.isfinite(loss[4]) and not math.isfinite(loss[5])


def test_steps_left_in_a_window_are_judged_when_another_hook_stops():
    tr, sink, _, div, stopped = _run(4, bad_from=5, patience=2, extra_hooks=[_StopAt(6)])
    assert tr.state.step == 6 and not isinstance(stopped, TrialDiverged)
    assert div.diverged is not None and div.diverged.step == 5  # recorded, not raised
    assert sink.tag_values["lsbench.diverged_step"] == 5
    assert [s for s, _ in sink.history("loss")] == list(range(1, 7))


def test_policy_continue_trains_on_and_records_once():
    tr, sink, _, div, stopped = _run(4, bad_from=5, patience=2, policy="continue")
    assert stopped is None and tr.state.step == 12 and div.diverged.step == 5
