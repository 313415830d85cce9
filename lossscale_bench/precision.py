"""Numeric precisions: fp32 | mixed16 | bf16 | fp16-emulated | fp8-emulated.

A ``Precision`` says which dtype autocast uses, whether a loss scaler is
meaningful, and in which formats (:mod:`lossscale_bench.formats`) its forward
values and its gradients live; it does not know devices (the backend opens
the autocast region).

The emulated precisions exist because real fp16 on CPU is ~45x slower than
fp32 (FIELD-NOTES.md) and CPUs have no fp8 arithmetic at all. They compute in
fp32 but round, through the format's torch dtype and back, every conv/linear
output in forward (``forward_format``), every activation gradient arriving at
a conv/linear output in backward, and every parameter gradient once it has
been accumulated (``grad_format``; before the scaler unscales it, as a real
low-precision gradient would be rounded before its fp32 master copy sees it).
Values below half the format's smallest subnormal flush to zero and values
past its maximum become inf (E4M3 saturates, as torch's cast does), so the
underflow and overflow that loss scaling exists to fix appear at fp32 speed.

* ``fp16-emulated``: fp16 everywhere (Chainer's / PyTorch AMP's mixed16).
* ``fp8-emulated``: forward outputs in E4M3, gradients in E5M2, fp32 master
  weights (the split FP8 training recipes use). E5M2's smallest subnormal is
  2**-16 ~ 1.5e-5, 256x fp16's, so gradients a small model's fp16 keeps
  flush here: underflow is real at CPU scale.

They are emulations, and reports say so.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial
from typing import Callable

import torch
from torch import nn

from .formats import BF16, E4M3, E5M2, FP16, FloatFormat
from .registry import PRECISIONS

#: layer types whose outputs (and the gradients arriving at them) are rounded
EMULATED_LAYERS = (nn.Conv2d, nn.Linear, nn.ConvTranspose2d)


def round_fp16(t: torch.Tensor) -> torch.Tensor:
    """Round through fp16 and back: flush-to-zero below 2**-25, inf past 65504."""
    return FP16.round(t)


class _RoundThrough(torch.autograd.Function):
    """Identity up to rounding: the value to ``fwd`` in forward, its gradient to ``bwd`` in backward."""

    @staticmethod
    def forward(ctx, x, fwd: FloatFormat, bwd: FloatFormat):  # type: ignore[override]
        ctx.bwd = bwd
        return fwd.round(x)

    @staticmethod
    def backward(ctx, g):  # type: ignore[override]
        return ctx.bwd.round(g), None, None


def round_through(x: torch.Tensor, fwd: FloatFormat = FP16, bwd: FloatFormat = FP16) -> torch.Tensor:
    return _RoundThrough.apply(x, fwd, bwd)


def fp16_round_through(x: torch.Tensor) -> torch.Tensor:
    return round_through(x, FP16, FP16)


class EmulationHandle:
    """The hooks an emulated precision installed; ``remove()`` restores the model."""

    def __init__(self, handles: list) -> None:
        self._handles = handles

    def remove(self) -> None:
        for h in self._handles:
            h.remove()
        self._handles = []

    def __len__(self) -> int:
        return len(self._handles)


def install_emulation(model: nn.Module, forward_format: FloatFormat, grad_format: FloatFormat) -> EmulationHandle:
    """Round layer outputs to ``forward_format``, their incoming gradients and parameter
    gradients to ``grad_format``."""
    handles = []

    def out_hook(module, inputs, output):
        if isinstance(output, torch.Tensor) and output.is_floating_point():
            return round_through(output, forward_format, grad_format)
        return output

    for m in model.modules():
        if isinstance(m, EMULATED_LAYERS):
            handles.append(m.register_forward_hook(out_hook))

    def grad_hook(p: torch.Tensor) -> None:
        if p.grad is not None:
            p.grad.copy_(grad_format.round(p.grad))

    for p in model.parameters():
        if p.requires_grad:
            handles.append(p.register_post_accumulate_grad_hook(grad_hook))
    return EmulationHandle(handles)


install_fp16_emulation = partial(install_emulation, forward_format=FP16, grad_format=FP16)
install_fp16_emulation.__doc__ = "Round layer outputs, their incoming gradients and parameter gradients to fp16."


@dataclass(frozen=True)
class Precision:
    name: str
    #: dtype for autocast, or None for no autocast region
    autocast_dtype: torch.dtype | None
    #: whether low-precision underflow/overflow exists, so a loss scaler matters
    needs_scaler: bool
    #: emulated in fp32 (CPU), to be labelled as such
    emulated: bool = False
    #: format of conv/linear outputs (None: fp32)
    forward_format: FloatFormat | None = None
    #: format of activation and parameter gradients (None: fp32); the adaptive rule's range and
    #: the telemetry's thresholds come from it
    grad_format: FloatFormat | None = None

    def prepare(self, model: nn.Module) -> EmulationHandle | None:
        """Install whatever the precision needs on the model (the emulation's rounding hooks)."""
        if self.emulated:
            return install_emulation(model, self.forward_format, self.grad_format)
        return None

    @property
    def telemetry_format(self) -> FloatFormat:
        """The format underflow is counted against: the gradient format, else fp16 (what an
        fp32 baseline's gradients would lose if they were fp16)."""
        return self.grad_format or FP16


_PRECISIONS: dict[str, Callable[[], Precision]] = {
    "fp32": lambda: Precision("fp32", None, needs_scaler=False),
    "mixed16": lambda: Precision("mixed16", torch.float16, needs_scaler=True, forward_format=FP16, grad_format=FP16),
    "bf16": lambda: Precision("bf16", torch.bfloat16, needs_scaler=False, forward_format=BF16, grad_format=BF16),
    "fp16-emulated": lambda: Precision("fp16-emulated", None, needs_scaler=True, emulated=True,
                                       forward_format=FP16, grad_format=FP16),
    "fp8-emulated": lambda: Precision("fp8-emulated", None, needs_scaler=True, emulated=True,
                                      forward_format=E4M3, grad_format=E5M2),
}
assert tuple(_PRECISIONS) == PRECISIONS


def get_precision(name: str) -> Precision:
    try:
        return _PRECISIONS[name]()
    except KeyError:
        raise ValueError(f"unknown precision {name!r}; allowed: {', '.join(PRECISIONS)}") from None
