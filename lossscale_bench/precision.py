"""Numeric precisions: fp32 | mixed16 | bf16 | fp16-emulated.

A ``Precision`` says which dtype autocast uses and whether a loss scaler is
meaningful; it does not know devices (the backend opens the autocast region).

``fp16-emulated`` exists because real fp16 on CPU is ~45x slower than fp32
(FIELD-NOTES.md). It computes in fp32 but rounds, through fp16 and back,
every conv/linear output in forward, every activation gradient arriving at a
conv/linear output in backward, and every parameter gradient once it has been
accumulated (before the scaler unscales it, as a real fp16 gradient would be
rounded before its fp32 master copy sees it). Values below fp16's smallest
subnormal flush to zero and values past 65504 become inf, so the underflow and
overflow that loss scaling exists to fix appear at fp32 speed. It is an
emulation, and reports say so.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch
from torch import nn

from .registry import PRECISIONS

#: layer types whose outputs (and the gradients arriving at them) are rounded
EMULATED_LAYERS = (nn.Conv2d, nn.Linear, nn.ConvTranspose2d)


def round_fp16(t: torch.Tensor) -> torch.Tensor:
    """Round through fp16 and back: flush-to-zero below 2**-25, inf past 65504."""
    if t.dtype == torch.float16:
        return t
    return t.to(torch.float16).to(t.dtype)


class _Fp16Round(torch.autograd.Function):
    """Identity in value up to fp16 rounding, in both directions."""

    @staticmethod
    def forward(ctx, x):  # type: ignore[override]
        return round_fp16(x)

    @staticmethod
    def backward(ctx, g):  # type: ignore[override]
        return round_fp16(g)


def fp16_round_through(x: torch.Tensor) -> torch.Tensor:
    return _Fp16Round.apply(x)


class EmulationHandle:
    """The hooks ``fp16-emulated`` installed; ``remove()`` restores the model."""

    def __init__(self, handles: list) -> None:
        self._handles = handles

    def remove(self) -> None:
        for h in self._handles:
            h.remove()
        self._handles = []

    def __len__(self) -> int:
        return len(self._handles)


def install_fp16_emulation(model: nn.Module) -> EmulationHandle:
    """Round layer outputs, their incoming gradients and parameter gradients to fp16."""
    handles = []

    def out_hook(module, inputs, output):
        if isinstance(output, torch.Tensor) and output.is_floating_point():
            return fp16_round_through(output)
        return output

    for m in model.modules():
        if isinstance(m, EMULATED_LAYERS):
            handles.append(m.register_forward_hook(out_hook))

    def grad_hook(p: torch.Tensor) -> None:
        if p.grad is not None:
            p.grad.copy_(round_fp16(p.grad))

    for p in model.parameters():
        if p.requires_grad:
            handles.append(p.register_post_accumulate_grad_hook(grad_hook))
    return EmulationHandle(handles)


@dataclass(frozen=True)
class Precision:
    name: str
    #: dtype for autocast, or None for no autocast region
    autocast_dtype: torch.dtype | None
    #: whether fp16 underflow/overflow exists, so a loss scaler matters
    fp16: bool
    #: emulated in fp32 (CPU), to be labelled as such
    emulated: bool = False

    def prepare(self, model: nn.Module) -> EmulationHandle | None:
        """Install whatever the precision needs on the model (fp16 emulation hooks)."""
        if self.emulated:
            return install_fp16_emulation(model)
        return None

    @property
    def needs_scaler(self) -> bool:
        return self.fp16


_PRECISIONS: dict[str, Callable[[], Precision]] = {
    "fp32": lambda: Precision("fp32", None, fp16=False),
    "mixed16": lambda: Precision("mixed16", torch.float16, fp16=True),
    "bf16": lambda: Precision("bf16", torch.bfloat16, fp16=False),
    "fp16-emulated": lambda: Precision("fp16-emulated", None, fp16=True, emulated=True),
}
assert tuple(_PRECISIONS) == PRECISIONS


def get_precision(name: str) -> Precision:
    try:
        return _PRECISIONS[name]()
    except KeyError:
        raise ValueError(f"unknown precision {name!r}; allowed: {', '.join(PRECISIONS)}") from None
