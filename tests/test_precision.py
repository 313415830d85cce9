"""fp16-emulated: the underflow/overflow that loss scaling exists to fix, at fp32 speed."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from lossscale_bench.precision import get_precision, install_fp16_emulation, round_fp16
from lossscale_bench.scaling import FixedLossScaler


def test_round_fp16_limits():
    x = torch.tensor([1e-9, 6e-8, 1.0, 65504.0, 70000.0, -70000.0])
    y = round_fp16(x)
    assert y[0] == 0.0                       # below the smallest subnormal: flushed
    assert y[1] > 0                          # ~ the smallest subnormal survives
    assert y[2] == 1.0 and y[3] == 65504.0
    assert torch.isinf(y[4]) and torch.isinf(y[5]) and y[5] < 0
    assert y.dtype == torch.float32


def _model():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 1))


def _grads_with(scale: float):
    """Backward of a loss whose gradients are ~1e-9, through the emulation, with a given loss scale."""
    model = _model()
    handle = install_fp16_emulation(model)
    opt = torch.optim.SGD(model.parameters(), lr=0.0)
    scaler = FixedLossScaler(scale)
    x = torch.ones(2, 4)
    loss = model(x).sum() * 1e-9
    scaler.scale(loss).backward()
    scaler.unscale_(opt)
    grads = {n: p.grad.clone() for n, p in model.named_parameters()}
    handle.remove()
    return grads


def test_tiny_gradient_flushes_unscaled_and_survives_scaled():
    ref_model = _model()
    (ref_model(torch.ones(2, 4)).sum() * 1e-9).backward()
    ref = {n: p.grad for n, p in ref_model.named_parameters()}
    assert ref["2.bias"].abs().item() == pytest.approx(2e-9)

    unscaled = _grads_with(1.0)
    assert unscaled["2.bias"].abs().item() == 0.0           # 2e-9 < 6e-8: flushed to zero in fp16
    scaled = _grads_with(1024.0)
    # 2e-9 * 1024 ~ 2.05e-6 is an fp16 subnormal (spacing 6e-8): it survives, within 3 %
    assert scaled["2.bias"].item() == pytest.approx(ref["2.bias"].item(), rel=3e-2)
    assert scaled["2.weight"].abs().sum() > 0


def test_emulation_rounds_activations_and_gradients_between_layers():
    model = _model()
    handle = install_fp16_emulation(model)
    seen = {}
    x = torch.full((1, 4), 1e5)  # forward overflow: the first Linear's output exceeds 65504
    out = model[0](x)
    assert torch.isinf(out).any()
    handle.remove()
    assert len(handle) == 0
    out = model[0](x)
    assert torch.isfinite(out).all()  # hooks gone
    seen["ok"] = True
    assert seen


def test_precision_table():
    assert get_precision("fp16-emulated").emulated and get_precision("fp16-emulated").needs_scaler
    assert get_precision("mixed16").autocast_dtype == torch.float16
    assert get_precision("bf16").autocast_dtype == torch.bfloat16 and not get_precision("bf16").needs_scaler
    assert get_precision("fp32").autocast_dtype is None
    with pytest.raises(ValueError, match="allowed"):
        get_precision("fp8")
