"""The precision table (study/precisions.py) accepts only entries that work at run time.

Why: an entry the table took could still fail every trial (a format name the runtime
does not know, forward_format None, before the runtime accepted it) or say what a trial does not do (formats on a
precision nothing rounds to them). ``PrecisionSpec`` now refuses those when the table is imported,
and every entry shape it accepts is built and run here.
"""

from __future__ import annotations

import itertools

import pytest

from lossscale_bench.study.precisions import FORMAT_NAMES, PRECISION_SPECS, PrecisionSpec

NOTE = "an emulation (test)"


@pytest.mark.parametrize(
    "fields, problem",
    [
        ({"grad_format": "fp32", "emulated": True, "note": NOTE}, "grad_format 'fp32' is not a format"),
        ({"forward_format": "fp12", "emulated": True, "note": NOTE}, "forward_format 'fp12' is not a format"),
        ({"autocast": "float8_e4m3fn", "forward_format": "e4m3", "grad_format": "e4m3"}, "autocast 'float8_e4m3fn'"),
        ({"forward_format": "fp16", "grad_format": "fp16"}, "without emulation nothing rounds"),
        ({"autocast": "float16", "forward_format": "fp16", "grad_format": "e5m2"}, "without emulation nothing rounds"),
        ({"emulated": True, "note": NOTE}, "an emulation rounds something"),
        ({"emulated": True, "grad_format": "fp16"}, "an emulation says so under its rows"),
        ({"emulated": True, "autocast": "bfloat16", "grad_format": "e5m2", "note": NOTE}, "computes in fp32"),
        ({"needs_scaler": True}, "needs_scaler without a grad_format"),
    ],
)
def test_an_entry_that_cannot_work_is_refused_in_one_line(fields, problem):
    with pytest.raises(ValueError, match="precision table entry 'x': ") as err:
        PrecisionSpec("x", **fields)
    assert problem in str(err.value) and "\n" not in str(err.value)


def test_the_shipped_entries_are_accepted():
    assert all(isinstance(spec, PrecisionSpec) for spec in PRECISION_SPECS.values())


EMULATED_SHAPES = [(f, g) for f, g in itertools.product((None, *FORMAT_NAMES), repeat=2) if f or g]


@pytest.mark.parametrize("forward_format, grad_format", EMULATED_SHAPES)
def test_every_emulation_the_table_accepts_trains_a_step(monkeypatch, forward_format, grad_format):
    """Each (forward, gradient) format pair of an emulated entry: built, prepared on a model, one scaled
    backward and step; the parameter gradients end in the gradient format (or fp32) and finite."""
    import torch
    from torch import nn

    from lossscale_bench.precision import get_precision
    from lossscale_bench.scaling import build_scaler

    spec = PrecisionSpec(
        "x",
        forward_format=forward_format,
        grad_format=grad_format,
        emulated=True,
        needs_scaler=grad_format is not None,
        note=NOTE,
    )
    monkeypatch.setitem(PRECISION_SPECS, "x", spec)
    prec = get_precision("x")
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 4, 3), nn.ReLU(), nn.Flatten(), nn.Linear(4 * 6 * 6, 2))
    handle = prec.prepare(model)
    scaler = build_scaler({"method": "fixed", "scale": 8.0})
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    scaler.scale(model(torch.randn(2, 3, 8, 8)).square().mean()).backward()
    scaled = [p.grad.clone() for p in model.parameters()]
    scaler.step(opt)
    assert not scaler.last_step.skipped
    handle.remove()
    for g in scaled:
        assert torch.isfinite(g).all()
        if prec.grad_format is not None:  # rounded to the format while they carried the scale
            assert torch.equal(prec.grad_format.round(g), g)
