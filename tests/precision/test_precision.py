"""fp16-emulated: the underflow/overflow that loss scaling exists to fix, at fp32 speed."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

from lossscale_bench.precision import get_precision, install_fp16_emulation, round_fp16
from lossscale_bench.scaling import FixedLossScaler
from lossscale_bench.study.precisions import EMULATED_PRECISIONS, PRECISION_SPECS

#: every emulated precision that rounds gradients element by element to nearest (from the table: a new
#: one is tested too); the FP4 precisions round in blocks or stochastically, through their own layers
#: (tests/precision/test_precision_fp4.py), so "the gradient rounded on its own" is not ``grad_format.round`` there
GRAD_ROUNDING_EMULATIONS = [
    n
    for n in EMULATED_PRECISIONS
    if PRECISION_SPECS[n].grad_format
    and not PRECISION_SPECS[n].options
    and PRECISION_SPECS[n].grad_scaling is None
    and PRECISION_SPECS[n].forward_scaling is None
]


def test_round_fp16_limits():
    x = torch.tensor([1e-9, 6e-8, 1.0, 65504.0, 70000.0, -70000.0])
    y = round_fp16(x)
    assert y[0] == 0.0  # below the smallest subnormal: flushed
    assert y[1] > 0  # ~ the smallest subnormal survives
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
    assert unscaled["2.bias"].abs().item() == 0.0  # 2e-9 < 6e-8: flushed to zero in fp16
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


def _bits(t: torch.Tensor) -> torch.Tensor:
    """Bit patterns, so NaNs compare and -0.0 differs from 0.0."""
    return t.contiguous().view({torch.float32: torch.int32, torch.float64: torch.int64}.get(t.dtype, t.dtype))


@pytest.mark.parametrize("fmt_name", ["fp16", "e4m3", "e4m3-nan", "e5m2"])
def test_round_grads_together_equals_one_call_per_tensor(fmt_name):
    """round_grads_ rounds many gradients in one call; each must come out bit for bit as its own
    ``fmt.round`` gives it, layout kept: channels_last, plain, a non-contiguous view, another dtype,
    values that flush, saturate or overflow."""
    from lossscale_bench.precision.formats import FORMATS
    from lossscale_bench.precision.grad_rounding import round_grads_

    fmt = FORMATS[fmt_name]
    g = torch.Generator().manual_seed(3)
    base = torch.randn(6, 4, 8, 3, 3, generator=g)
    grads = [
        torch.randn(8, 16, 5, 5, generator=g).mul(300).to(memory_format=torch.channels_last),
        torch.randn(16, generator=g).mul(1e-3),
        torch.randn(3, 7, generator=g).mul(1e-6),
        base[:, :, 1],  # a non-contiguous view
        torch.randn(5, generator=g).mul(7e4).double(),
    ]
    want = [fmt.round(t) for t in grads]
    round_grads_(fmt, grads)
    for got, ref in zip(grads, want):
        assert got.dtype == ref.dtype and torch.equal(_bits(got), _bits(ref))
    assert grads[0].is_contiguous(memory_format=torch.channels_last)
    assert torch.equal(_bits(base[:, :, 1]), _bits(want[3]))  # written through the view


def _small_model_grads(forward_format, grad_format, round_params: bool):
    """``(parameter gradients, what the observer saw, parameters)`` of one backward of a small
    channels_last conv net under the emulation (parameter gradients rounded or not)."""
    from lossscale_bench.precision import install_emulation

    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 8, 3), nn.ReLU(), nn.Conv2d(8, 4, 3), nn.Flatten(), nn.Linear(4 * 4 * 4, 1))
    model.to(memory_format=torch.channels_last)
    handle = install_emulation(model, forward_format, grad_format, round_param_grads=round_params)
    seen = {}
    if round_params:
        handle.observe_param_grads(lambda p, g: seen.__setitem__(id(p), g.clone()))
    x = torch.randn(2, 3, 8, 8).to(memory_format=torch.channels_last)
    (model(x).sum() * 1e-3).backward()
    return [p.grad.clone() for p in model.parameters()], seen, list(model.parameters())


@pytest.mark.parametrize("precision", GRAD_ROUNDING_EMULATIONS)
def test_emulation_rounds_parameter_gradients_once_at_the_end_of_backward(precision):
    """The emulation rounds all parameter gradients of a backward in one call at its end: the result
    must be each accumulated gradient rounded on its own (as the per-parameter hook did), and the
    telemetry's observer must see them unrounded."""
    prec = get_precision(precision)

    raw, _, _ = _small_model_grads(prec.forward_format, prec.grad_format, False)
    rounded, seen, params = _small_model_grads(prec.forward_format, prec.grad_format, True)
    assert any(not torch.equal(prec.grad_format.round(r), r) for r in raw)  # the rounding changes something
    for r, got, p in zip(raw, rounded, params):
        assert torch.equal(_bits(got), _bits(prec.grad_format.round(r)))
        assert torch.equal(_bits(seen[id(p)]), _bits(r))


@pytest.mark.parametrize("layout", ["nchw", "channels_last"])
def test_emulation_allows_in_place_ops_after_rounded_layers(layout):
    """VGG's in-place ReLU after every rounded conv (SSD300/SSD512) used to fail: the rounding
    returned a view, which autograd forbids modifying in place (found on an H200). The
    gradients must also be what the same model with out-of-place ReLUs gets."""
    from lossscale_bench.precision import get_precision
    from lossscale_bench.study.precisions import EMULATED_PRECISIONS

    def net(inplace):
        torch.manual_seed(0)
        m = torch.nn.Sequential(
            torch.nn.Conv2d(3, 8, 3, padding=1),
            torch.nn.ReLU(inplace=inplace),
            torch.nn.Conv2d(8, 4, 3, padding=1),
            torch.nn.ReLU(inplace=inplace),
        )
        return m.to(memory_format=torch.channels_last) if layout == "channels_last" else m

    x = torch.randn(2, 3, 9, 9)
    if layout == "channels_last":
        x = x.to(memory_format=torch.channels_last)
    for name in EMULATED_PRECISIONS:
        grads = []
        for inplace in (True, False):
            m = net(inplace)
            handle = get_precision(name).prepare(m)
            m(x).square().sum().backward()
            grads.append([q.grad.clone() for q in m.parameters()])
            if handle is not None:
                handle.remove()
        assert all(torch.equal(a, b) for a, b in zip(*grads)), name


def test_an_emulated_precision_may_leave_either_direction_in_fp32():
    """A precision entry with ``forward_format`` None ("fp32") validated and then failed every
    trial in the round-through; either format may be None, and that direction is then exactly fp32."""
    from lossscale_bench.precision import Precision
    from lossscale_bench.precision.formats import E4M3

    torch.manual_seed(0)
    ref = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.ReLU(inplace=True), torch.nn.Conv2d(4, 2, 3))
    x = torch.randn(2, 3, 8, 8) * 3

    def run(fwd, bwd):
        m = copy.deepcopy(ref)
        handle = Precision("t", None, needs_scaler=True, emulated=True, forward_format=fwd, grad_format=bwd).prepare(m)
        y = m(x)
        y.square().sum().backward()
        handle.remove()
        return y.detach(), [q.grad for q in m.parameters()]

    y32, g32 = run(None, None)
    y_fwd_fp32, g_rounded = run(None, E4M3)
    assert torch.equal(y_fwd_fp32, y32)  # forward untouched
    assert all(torch.equal(E4M3.round(g), g) for g in g_rounded)  # gradients in E4M3
    assert not all(torch.equal(a, b) for a, b in zip(g_rounded, g32))
    y_rounded, g_bwd_fp32 = run(E4M3, None)
    assert not torch.equal(y_rounded, y32) and torch.equal(E4M3.round(y_rounded), y_rounded)


@pytest.mark.parametrize("mode", ["ceil", "floor", "even", "rceil"])
@pytest.mark.parametrize("element", ["e4m3", "e5m2"])
def test_round_block_grads_together_equals_one_call_per_tensor(element, mode):
    """mx32 parameter gradients rounded in one call, each tensor zero-padded to whole blocks: bit for bit
    each tensor's own ``fmt.round``, layout kept, whatever the tails (sizes not a multiple of 32, a
    1-element tensor), a NaN confined to its own tensor's block, another dtype grouped apart."""
    from lossscale_bench.precision.formats import FORMATS, block_scaled
    from lossscale_bench.precision.grad_rounding import round_block_grads_

    fmt = block_scaled(FORMATS[element], "mx32", mode)
    assert fmt.concat_block == 32 and block_scaled(FORMATS[element], "tile128").concat_block is None
    g = torch.Generator().manual_seed(5)
    base = torch.randn(6, 4, 8, 3, 3, generator=g)
    nan = torch.randn(37, generator=g)
    nan[36] = float("nan")  # its tail block is NaN; the next tensor's first block must not be
    grads = [
        torch.randn(8, 16, 5, 5, generator=g).mul(300).to(memory_format=torch.channels_last),
        torch.randn(16, generator=g).mul(1e-3),
        nan,
        torch.randn(3, 7, generator=g).mul(1e-6),
        torch.randn(1, generator=g),
        base[:, :, 1],
        torch.randn(45, generator=g).mul(7e4).double(),
        torch.randn(33, generator=g).mul(2.0) ** 9,
    ]
    want = [fmt.round(t) for t in grads]
    round_block_grads_(fmt, grads)
    for got, ref in zip(grads, want):
        assert got.dtype == ref.dtype and torch.equal(_bits(got), _bits(ref))
    assert grads[0].is_contiguous(memory_format=torch.channels_last)
    assert torch.equal(_bits(base[:, :, 1]), _bits(want[3 + 2]))  # written through the view
    assert torch.isnan(grads[2][32:]).all() and not torch.isnan(grads[2][:32]).any()
    assert not torch.isnan(grads[3]).any()


def test_round_block_grads_refuses_a_format_whose_scale_spans_the_tensor():
    from lossscale_bench.precision.formats import FORMATS, block_scaled
    from lossscale_bench.precision.grad_rounding import round_block_grads_

    with pytest.raises(ValueError, match="one tensor at a time"):
        round_block_grads_(block_scaled(FORMATS["e4m3"], "tensor"), [torch.ones(3)])


def test_mx32_parameter_gradients_are_rounded_in_one_call_at_the_end_of_backward(monkeypatch):
    """With mx32 gradients the parameter gradients go through round_block_grads_ (one block_round
    call for all of them): each must be its own accumulated gradient rounded alone, and the
    telemetry's observer must still see every one unrounded."""
    from lossscale_bench.numerics import block_scaling
    from lossscale_bench.precision.formats import E4M3, block_scaled

    fmt = block_scaled(E4M3, "mx32", "ceil")
    raw, _, _ = _small_model_grads(E4M3, fmt, False)
    calls = []
    real = block_scaling.block_round
    monkeypatch.setattr(block_scaling, "block_round", lambda x, *a, **k: (calls.append(x.numel()), real(x, *a, **k))[1])
    rounded, seen, params = _small_model_grads(E4M3, fmt, True)
    monkeypatch.setattr(block_scaling, "block_round", real)
    n_params = sum(-(-p.numel() // 32) * 32 for p in params)
    assert n_params in calls and calls.count(n_params) == 1  # all parameters padded, in one call
    assert any(not torch.equal(fmt.round(r), r) for r in raw)
    for r, got, p in zip(raw, rounded, params):
        assert torch.equal(_bits(got), _bits(fmt.round(r)))
        assert torch.equal(_bits(seen[id(p)]), _bits(r))
