"""Schedule and optimizer options of the published recipes (engine/schedule.py, the schema's schedule section)."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from lossscale_bench.engine.schedule import build_optimizer, build_scheduler, lr_lambda, param_groups
from lossscale_bench.study import StudyError, load_study_text

BASE = """\
name: sched
dataset: {name: synthetic}
model: ssd_tiny
batch_size: 8
precision: fp16-emulated
scaling: [none]
schedule: {iterations: 100, lr: 1e-3%s}
"""


def _chainerlp_exponential_shift(lr, iterations, ratio, warmup_n, steps, rate=0.1):
    """The lr each update of the authors' chainer SSD script runs with, simulated step by step:
    kumasento/gradient-scaling chainerlp/extensions/exponential_shift.py ``ExponentialShift``
    (``init=lr*ratio``, ``warmup_n_epoch``, ``schedule``), triggered after every update (Chainer
    runs extensions after ``updater.update()``; ``initialize`` sets the optimizer's lr to init)."""
    init = lr * ratio
    cur, t, it, out = init, 0, 0, []
    for _ in range(iterations):
        out.append(cur)  # this update runs with the optimizer's current lr
        it += 1  # __call__ after the update
        if it == warmup_n:
            init = init / ratio
            cur = init
        elif it in steps:
            t += 1
            cur = init * rate**t  # chainer's ExponentialShift: init * rate ** t
    return out


def test_constant_warmup_is_the_authors_chainer_schedule():
    # 1e-4 for updates 1..10, then 1e-3, x0.1 after updates 30 and 40 (the recipe at 1/100 scale)
    ref = _chainerlp_exponential_shift(1e-3, 50, 0.1, 10, [30, 40])
    f = lr_lambda(10, 0.1, [30, 40], 0.1, "constant")
    ours = [1e-3 * f(i) for i in range(50)]
    assert ours == pytest.approx(ref, rel=1e-12)
    assert ours[9] == pytest.approx(1e-4) and ours[10] == pytest.approx(1e-3)


def test_linear_warmup_from_zero_is_nvidias():
    # DeepLearningExamples PyTorch/Detection/SSD/ssd/train.py:warmup: lr = base_lr / warmup_iters * iteration
    base, warm = 5.2e-3, 300
    f = lr_lambda(warm, 0.0, [], 0.1, "linear")
    for it in (0, 1, 150, 299):
        assert base * f(it) == pytest.approx(base / warm * it, abs=1e-15)
    assert f(300) == 1.0


def test_default_linear_warmup_unchanged():
    f = lr_lambda(100, 0.1, [500], 0.1)
    assert f(0) == pytest.approx(0.1) and f(50) == pytest.approx(0.55) and f(100) == 1.0 and f(500) == 0.1


def test_scheduler_reads_warmup_mode():
    opt = torch.optim.SGD([nn.Parameter(torch.zeros(1))], lr=1e-3)
    sch = build_scheduler(opt, {"lr": 1e-3, "warmup_iterations": 3, "warmup_factor": 0.1, "warmup_mode": "constant"})
    seen = []
    for _ in range(5):
        seen.append(opt.param_groups[0]["lr"])
        opt.step()
        sch.step()
    assert seen == pytest.approx([1e-4, 1e-4, 1e-4, 1e-3, 1e-3])


class _Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(2, 2, 3)
        self.bn = nn.BatchNorm2d(2)
        self.scale_weight = nn.Parameter(torch.full((2,), 20.0))  # like the VGG extractor's L2Norm


def _decayed(model, exclude):
    """Parameters that move under a zero gradient: weight decay acted on them."""
    opt = build_optimizer(model, {"lr": 0.1, "momentum": 0.0, "weight_decay": 0.5, "weight_decay_exclude": exclude})
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    with torch.no_grad():
        model.bn.bias.fill_(1.0)
        before["bn.bias"] = model.bn.bias.detach().clone()
        model.conv.bias.fill_(1.0)
        before["conv.bias"] = model.conv.bias.detach().clone()
    for p in model.parameters():
        p.grad = torch.zeros_like(p)
    opt.step()
    return {n for n, p in model.named_parameters() if not torch.equal(p, before[n])}


def test_weight_decay_on_everything_by_default():
    assert _decayed(_Net(), []) == {"conv.weight", "conv.bias", "bn.weight", "bn.bias", "scale_weight"}
    assert len(build_optimizer(_Net(), {"lr": 0.1}).param_groups) == 1


def test_weight_decay_exclude_bias_is_chainercvs():
    # chainercv / the authors' script: WeightDecay on every parameter not named 'b' (L2Norm scale decayed)
    assert _decayed(_Net(), ["bias"]) == {"conv.weight", "bn.weight", "scale_weight"}


def test_weight_decay_exclude_1d_is_nvidias_tencent_trick():
    # NVIDIA: len(param.shape) == 1 or name.endswith(".bias") -> no decay
    assert _decayed(_Net(), ["bias", "1d"]) == {"conv.weight"}
    groups = param_groups(_Net(), 5e-4, ["1d"])
    assert [len(g["params"]) for g in groups] == [1, 4] and groups[1]["weight_decay"] == 0.0


def test_frozen_parameters_stay_out():
    m = _Net()
    m.conv.weight.requires_grad_(False)
    assert sum(len(g["params"]) for g in param_groups(m, 1e-4, ["bias"])) == 4


def test_unknown_exclude_raises():
    with pytest.raises(ValueError, match="weight_decay_exclude"):
        param_groups(_Net(), 1e-4, ["weights"])


# --------------------------------------------------------------------------- schema


def _only(extra):
    (t,) = load_study_text(BASE % extra).trials()
    return t


def test_new_options_at_default_keep_trial_ids():
    plain = _only("")
    explicit = _only(", warmup_mode: linear, weight_decay_exclude: []")
    assert explicit.trial_id == plain.trial_id
    assert "warmup_mode" not in plain.schedule and "weight_decay_exclude" not in plain.schedule


def test_new_options_reach_the_trial_and_change_its_id():
    t = _only(", warmup_iterations: 10, warmup_mode: constant, weight_decay_exclude: [bias, 1d]")
    assert t.schedule["warmup_mode"] == "constant" and t.schedule["weight_decay_exclude"] == ["bias", "1d"]
    assert t.trial_id != _only(", warmup_iterations: 10").trial_id
    assert _only(", weight_decay_exclude: bias").schedule["weight_decay_exclude"] == ["bias"]
    assert _only(", warmup_iterations: 10, warmup_factor: 0").schedule["warmup_factor"] == 0


@pytest.mark.parametrize(
    "extra, field, words",
    [
        (", warmup_mode: step", "schedule.warmup_mode", "linear, constant"),
        (", weight_decay_exclude: [bias, weights]", "schedule.weight_decay_exclude", "bias, 1d"),
        (", warmup_iterations: 10, warmup_mode: constant, warmup_factor: 0", "schedule.warmup_factor", "lr 0"),
        (", warmup_factor: -0.1", "schedule.warmup_factor", "0 <= x <= 1"),
    ],
)
def test_bad_schedule_options_are_one_line_errors(extra, field, words):
    with pytest.raises(StudyError) as ei:
        load_study_text(BASE % extra)
    msg = str(ei.value)
    assert "\n" not in msg and field in msg and words in msg, msg


# --------------------------------------------------------------------------- momentum style


def _trajectory(style, lrs, grad=1.0, p0=1.0, momentum=0.9, wd=0.0):
    p = nn.Parameter(torch.tensor([p0], dtype=torch.float64))
    model = nn.Module()
    model.w = p
    opt = build_optimizer(model, {"lr": lrs[0], "momentum": momentum, "weight_decay": wd, "momentum_style": style})
    out = []
    for lr in lrs:
        for g in opt.param_groups:
            g["lr"] = lr
        p.grad = torch.tensor([grad], dtype=torch.float64)
        opt.step()
        out.append(float(p.detach()))
    return out


def test_chainer_momentum_by_hand():
    # chainer MomentumSGD: v <- 0.9 v - lr g; p <- p + v. lr 0.1, 0.1, then 1.0 (the warm-up jump):
    # v = -0.1, -0.19, -1.171 -> p = 0.9, 0.71, -0.461
    assert _trajectory("chainer", [0.1, 0.1, 1.0]) == pytest.approx([0.9, 0.71, -0.461], abs=1e-12)
    # torch SGD: buf = 1, 1.9, 2.71 -> p = 0.9, 0.71, 0.71 - 2.71 = -2.0: the same until lr changes
    assert _trajectory("torch", [0.1, 0.1, 1.0]) == pytest.approx([0.9, 0.71, -2.0], abs=1e-12)
    # constant lr: both styles take the same steps
    assert _trajectory("chainer", [0.1] * 5) == pytest.approx(_trajectory("torch", [0.1] * 5), abs=1e-12)
    # WeightDecay first: grad + 0.5 * p = 1.0 at p = 2, zero gradient: v = -0.1, p = 1.9
    assert _trajectory("chainer", [0.1], grad=0.0, p0=2.0, momentum=0.0, wd=0.5) == pytest.approx([1.9])


def test_chainer_momentum_state_round_trips():
    model = _Net()
    sched = {"lr": 0.1, "momentum_style": "chainer", "weight_decay_exclude": ["bias"]}
    opt = build_optimizer(model, sched)
    for p in model.parameters():
        p.grad = torch.ones_like(p)
    opt.step()
    other = build_optimizer(model, sched)
    other.load_state_dict(opt.state_dict())
    assert torch.equal(other.state[model.conv.weight]["velocity"], opt.state[model.conv.weight]["velocity"])
    assert [g["weight_decay"] for g in other.param_groups] == [5e-4, 0.0]


def test_momentum_style_in_the_schema():
    assert "momentum_style" not in _only("").schedule
    assert _only(", momentum_style: torch").trial_id == _only("").trial_id
    assert _only(", momentum_style: chainer").schedule["momentum_style"] == "chainer"
    with pytest.raises(StudyError) as ei:
        load_study_text(BASE % ", momentum_style: keras")
    assert "schedule.momentum_style" in str(ei.value) and "torch, chainer" in str(ei.value)
