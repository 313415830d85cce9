"""``grad_rounding``: when an emulated precision rounds parameter gradients (precision/runtime.py's module doc).

before_unscale (PyTorch AMP's order, the default): rounded at scale P, unscaled in fp32.
after_unscale (Chainer's): unscaled, then rounded. They differ exactly where a gradient fits the
format only while it carries P (or only without it), and agree (bit for bit, P a power of two)
everywhere else. Driven through the real training loop, precision hooks and scalers.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

from lossscale_bench.backends import get_backend
from lossscale_bench.engine.loop import Trainer
from lossscale_bench.precision import get_precision
from lossscale_bench.scaling import AdaptiveLossScaler, FixedLossScaler
from lossscale_bench.study import StudyError, load_study_text


class _Probe(nn.Module):
    """loss = linear(c) = sum(W * c): the weight gradient is exactly c (times the loss scale P)."""

    def __init__(self, c: torch.Tensor):
        super().__init__()
        self.lin = nn.Linear(c.numel(), 1, bias=False)
        self.register_buffer("c", c.reshape(1, -1))

    def forward(self, images, targets):
        return {"loss": self.lin(self.c).sum()}


def _grad_after_step(c, precision_name, rounding, scaler):
    torch.manual_seed(0)
    model = _Probe(torch.as_tensor(c, dtype=torch.float32))
    prec = get_precision(precision_name, rounding)
    prec.prepare(model)
    if scaler == "adaptive":
        scaler = AdaptiveLossScaler(model, init_scale=1024.0, grad_format=prec.grad_format)
    opt = torch.optim.SGD(model.parameters(), lr=0.0)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda i: 1.0)
    batches = iter([(0, [torch.zeros(3, 4, 4)], [{}])] * 4)
    trainer = Trainer(
        model=model,
        optimizer=opt,
        scheduler=sched,
        scaler=scaler,
        backend=get_backend("cpu"),
        precision=prec,
        batches=batches,
        iterations=1,
    )
    _, images, targets = next(trainer.batches)
    rec = trainer.train_step(images, targets)
    return model.lin.weight.grad.reshape(-1).clone(), rec.result


# a true gradient of 1e-8 is below fp16's half-smallest-subnormal (2**-25 ~ 3e-8) but 1e-8 * 1024 is not
TINY = [1e-8, -2e-8, 1.5e-8]


def test_underflow_only_after_unscaling_differs():
    before, _ = _grad_after_step(TINY, "fp16-emulated", "before_unscale", FixedLossScaler(1024.0))
    after, _ = _grad_after_step(TINY, "fp16-emulated", "after_unscale", FixedLossScaler(1024.0))
    # AMP order: rounded at 1024x (fp16 subnormal spacing 2**-24 at that size), then unscaled in fp32
    expect = torch.tensor(TINY).mul(1024.0).half().float().div(1024.0)
    assert torch.equal(before, expect) and (before != 0).all()
    # Chainer's order: divided by P first, then stored in fp16: flushed
    assert torch.equal(after, torch.zeros(3))


def test_default_is_the_amp_order():
    default, _ = _grad_after_step(TINY, "fp16-emulated", None, FixedLossScaler(1024.0))
    before, _ = _grad_after_step(TINY, "fp16-emulated", "before_unscale", FixedLossScaler(1024.0))
    assert torch.equal(default, before) and get_precision("fp16-emulated").grad_rounding == "before_unscale"


@pytest.mark.parametrize(
    "name, values", [("fp16-emulated", [1e-3, -0.25, 3.0, 1e-2 / 3]), ("fp8-emulated", [1e-3, -0.25, 3.0, 1e-2 / 3])]
)
def test_both_orders_agree_in_range(name, values):
    """Rounding commutes with a power-of-two scale in the normal range: identical gradients."""
    before, _ = _grad_after_step(values, name, "before_unscale", FixedLossScaler(1024.0))
    after, _ = _grad_after_step(values, name, "after_unscale", FixedLossScaler(1024.0))
    assert torch.equal(before, after)
    fmt = get_precision(name).grad_format
    assert torch.equal(after, fmt.round(torch.tensor(values)))


def test_fp8_gradient_flushes_only_after_unscaling():
    vals = [1e-6, -3e-6]  # below E5M2's half-smallest-subnormal (2**-17), but not at 1024x
    before, _ = _grad_after_step(vals, "fp8-emulated", "before_unscale", FixedLossScaler(1024.0))
    after, _ = _grad_after_step(vals, "fp8-emulated", "after_unscale", FixedLossScaler(1024.0))
    assert (before != 0).all() and torch.equal(after, torch.zeros(2))


def test_overflow_after_unscaling_skips_the_step():
    """A true gradient past fp16's maximum: stored in fp16 after unscaling it is inf (step skipped);
    rounded at scale 2**-4 it fits, and the fp32 unscale keeps it."""
    big = [1.0e5]
    before, res_b = _grad_after_step(big, "fp16-emulated", "before_unscale", FixedLossScaler(2.0**-4))
    after, res_a = _grad_after_step(big, "fp16-emulated", "after_unscale", FixedLossScaler(2.0**-4))
    assert torch.isfinite(before).all() and not res_b.skipped
    assert torch.isinf(after).all() and res_a.skipped and res_a.overflow


def test_adaptive_scaler_with_chainer_order():
    """Per-layer scales: the weight gradient carries P = init_scale until unscale_, then is rounded."""
    before, _ = _grad_after_step(TINY, "fp16-emulated", "before_unscale", "adaptive")
    after, _ = _grad_after_step(TINY, "fp16-emulated", "after_unscale", "adaptive")
    assert (before != 0).all() and torch.equal(after, torch.zeros(3))


def test_get_precision_refuses_real_precisions():
    with pytest.raises(ValueError, match="emulated"):
        get_precision("mixed16", "after_unscale")
    with pytest.raises(ValueError, match="before_unscale, after_unscale"):
        get_precision("fp16-emulated", "sideways")
    assert not get_precision("fp16-emulated").rounds_after_unscale
    assert get_precision("fp8-emulated", "after_unscale").rounds_after_unscale


STUDY = """\
name: order
dataset: synthetic
model: ssd_tiny
batch_size: 8
precision: fp16-emulated
scaling:
  - {method: fixed, scale: 128}
  - {method: fixed, scale: 128, grad_rounding: %s}
schedule: {iterations: 10, lr: 1e-3}
"""


def test_schema_option_labels_and_ids():
    a, b = load_study_text(STUDY % "after_unscale").trials()
    assert b.scaling["grad_rounding"] == "after_unscale" and "grad_rounding" not in a.scaling
    assert a.trial_id != b.trial_id and b.label == "loss scale (128) (grads rounded after unscale)"
    # the default order named explicitly is the same trial as the entry without it
    # (alone: in one study with the entry without it, the two would repeat each other and be refused)
    (only,) = load_study_text((STUDY % "before_unscale").replace("  - {method: fixed, scale: 128}\n", "")).trials()
    assert only.trial_id == a.trial_id


@pytest.mark.parametrize("value, words", [("sideways", "before_unscale, after_unscale"), ("after_unscale", "fp32")])
def test_schema_errors_are_one_line(value, words):
    text = STUDY % value
    if value == "after_unscale":
        text = text.replace("grad_rounding: after_unscale", "grad_rounding: after_unscale, precision: fp32")
    with pytest.raises(StudyError) as ei:
        load_study_text(text)
    msg = str(ei.value)
    assert "scaling[1].grad_rounding" in msg and words in msg and "\n" not in msg, msg
