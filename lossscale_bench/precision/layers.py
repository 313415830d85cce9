"""The emulation's rounding on a model: layer outputs, the gradients arriving at them, parameter gradients.

The emulated precisions compute in fp32 but round, through the format's torch dtype and back, every
conv/linear output in forward (``forward_format``), every activation gradient arriving at a
conv/linear output in backward, and every parameter gradient once it has been accumulated
(``grad_format``; before the scaler unscales it, as a real low-precision gradient would be rounded
before its fp32 master copy sees it, unless the precision rounds ``after_unscale``:
:mod:`.runtime`). Values below half the format's smallest subnormal flush to zero and values past
its maximum become inf (E4M3 saturates, as torch's cast does), so the underflow and overflow that
loss scaling exists to fix appear at fp32 speed.

:func:`install_emulation` installs the hooks; :class:`EmulationHandle` removes them. The FP4 recipes'
split backward (weights rounded in the forward product, a Hadamard transform on the weight-gradient
path) is :mod:`.fp4_layers`; the rounding of a list of gradients in one call is :mod:`.grad_rounding`.
"""

from __future__ import annotations

from functools import partial

import torch
from torch import nn

from ..numerics.layout import not_a_view
from .formats import FP16, FloatFormat
from .fp4_layers import fp4_layer, round_weight, supported
from .grad_rounding import round_block_grads_, round_grads_

__all__ = [
    "EMULATED_LAYERS",
    "EmulationHandle",
    "fp16_round_through",
    "install_emulation",
    "install_fp16_emulation",
    "round_fp16",
    "round_through",
]

#: layer types whose outputs (and the gradients arriving at them) are rounded
EMULATED_LAYERS = (nn.Conv2d, nn.Linear, nn.ConvTranspose2d)


def round_fp16(t: torch.Tensor) -> torch.Tensor:
    """Round through fp16 and back: flush-to-zero below 2**-25, inf past 65504."""
    return FP16.round(t)


class _RoundThrough(torch.autograd.Function):
    """Identity up to rounding: the value to ``fwd`` in forward, its gradient to ``bwd`` in backward
    (either None: that direction stays fp32, as a precision entry with ``forward_format`` or
    ``grad_format`` None asks)."""

    @staticmethod
    def forward(ctx, x, fwd: FloatFormat | None, bwd: FloatFormat | None):  # type: ignore[override]
        ctx.bwd = bwd
        return not_a_view(x if fwd is None else fwd.round(x), x)

    @staticmethod
    def backward(ctx, g):  # type: ignore[override]
        return (g if ctx.bwd is None else ctx.bwd.round(g)), None, None


def round_through(x: torch.Tensor, fwd: FloatFormat = FP16, bwd: FloatFormat = FP16) -> torch.Tensor:
    """``x`` with its value rounded to ``fwd`` and the gradient arriving at it rounded to ``bwd``
    (either None: that direction stays fp32)."""
    return _RoundThrough.apply(x, fwd, bwd)


def fp16_round_through(x: torch.Tensor) -> torch.Tensor:
    """:func:`round_through` with fp16 both ways."""
    return round_through(x, FP16, FP16)


class EmulationHandle:
    """The hooks an emulated precision installed; ``remove()`` restores the model.

    ``observe_param_grads(fn)``: ``fn(param, grad)`` is called with each accumulated parameter
    gradient just *before* the emulation rounds it (the telemetry counts what the rounding will
    flush or saturate; a hook of its own would run after the rounding, whose results it cannot
    tell from true zeros and true maxima).
    """

    def __init__(self, handles: list, param_observers: list | None = None) -> None:
        self._handles = handles
        self._param_observers = param_observers if param_observers is not None else []
        #: whether parameter gradients are rounded by these hooks (not with ``after_unscale``)
        self.rounds_param_grads = param_observers is not None

    def observe_param_grads(self, fn) -> None:
        """Call ``fn(param, grad)`` with each accumulated parameter gradient before it is rounded."""
        self._param_observers.append(fn)

    def remove(self) -> None:
        """Remove every hook: the model computes in fp32 again."""
        for h in self._handles:
            h.remove()
        self._handles = []

    def __len__(self) -> int:
        return len(self._handles)


def install_emulation(
    model: nn.Module,
    forward_format: FloatFormat | None,
    grad_format: FloatFormat | None,
    round_param_grads: bool = True,
    weight_format: FloatFormat | None = None,
    wgrad_hadamard: bool = False,
) -> EmulationHandle:
    """Round layer outputs to ``forward_format``, their incoming gradients and (unless
    ``round_param_grads`` is false: ``grad_rounding: after_unscale``) the accumulated parameter
    gradients to ``grad_format``. A format that is None leaves its direction in fp32 (the precision
    table allows either: an fp32 forward with rounded gradients, say). ``weight_format`` (weights
    rounded in the forward product, evaluation included) and ``wgrad_hadamard`` go through
    :mod:`.fp4_layers`."""
    if grad_format is None:
        round_param_grads = False
    handles = _layer_hooks(model, forward_format, grad_format, weight_format, wgrad_hadamard)
    observers: list = []
    if round_param_grads:
        handles += _param_grad_hooks(model, grad_format, observers)
    return EmulationHandle(handles, observers if round_param_grads else None)


def _layer_hooks(
    model: nn.Module,
    forward_format: FloatFormat | None,
    grad_format: FloatFormat | None,
    weight_format: FloatFormat | None,
    wgrad_hadamard: bool,
) -> list:
    """The forward hooks of every emulated layer: its output rounded (and the gradient arriving at it),
    or, for the FP4 recipes, the layer's product split by :func:`.fp4_layers.fp4_layer`."""
    handles = []

    def out_hook(module, inputs, output):
        if isinstance(output, torch.Tensor) and output.is_floating_point():
            return round_through(output, forward_format, grad_format)
        return output

    #: module -> (its weight parameter, the rounded weight standing in for it during the module's forward)
    swapped: dict[nn.Module, tuple[torch.Tensor, torch.Tensor]] = {}

    def weight_hook(module, inputs):
        # the forward product computed once, with the rounded weight in the parameter's place (a forward
        # hook that recomputed it would cost a second product per layer); the split hook puts
        # the parameter back, also when the forward raised (always_call)
        param = module._parameters["weight"]
        wq = round_weight(module, weight_format)
        swapped[module] = (param, wq)
        module._parameters["weight"] = wq

    def split_hook(module, inputs, output):  # fp4_layers: the weight rounded, or the wgrad path transformed
        wq = None
        if module in swapped:
            param, wq = swapped.pop(module)
            module._parameters["weight"] = param
        if isinstance(output, torch.Tensor) and output.is_floating_point():
            return fp4_layer(module, inputs[0], output, forward_format, grad_format, wq, wgrad_hadamard)
        return out_hook(module, inputs, output)

    split = weight_format is not None or wgrad_hadamard
    for m in model.modules():
        if isinstance(m, EMULATED_LAYERS):
            if split and supported(m):
                if weight_format is not None:
                    handles.append(m.register_forward_pre_hook(weight_hook))
                handles.append(m.register_forward_hook(split_hook, always_call=True))
            else:
                handles.append(m.register_forward_hook(out_hook))
    return handles


def _param_grad_hooks(model: nn.Module, grad_format: FloatFormat, observers: list) -> list:
    """Hooks that round every accumulated parameter gradient to ``grad_format`` at the end of the
    backward that made it, after ``observers`` (``fn(param, grad)``) have seen it unrounded."""
    handles = []
    pending: list[torch.Tensor] = []
    keys: list = []

    def round_pending() -> None:
        drawn = keys[:] if grad_format.concat_block is None else [None] * len(pending)
        params = [(p, k) for p, k in zip(pending, drawn) if p.grad is not None]
        pending.clear()
        keys.clear()
        for observe in observers:
            for p, _ in params:
                observe(p, p.grad)
        grads = [p.grad for p, _ in params]
        if grad_format.elementwise:
            round_grads_(grad_format, grads)
        elif grad_format.concat_block is not None:
            round_block_grads_(grad_format, grads)
        else:
            grad_format.round_each_(grads, [k for _, k in params])

    def grad_hook(p: torch.Tensor) -> None:
        if p.grad is None:
            return
        # every parameter gradient of this backward rounded at its end: in one call where the format
        # allows it (element-wise, mx32 blocks: round_grads_, round_block_grads_) instead of one
        # kernel call (~0.2 ms of dispatch, and for blocks a layout copy) per parameter; else one tensor
        # at a time through the format's round_each_, with the random key each would have drawn here
        # (drawn now, between the activation gradients' roundings, so the stream and the values are
        # those of a rounding per parameter)
        if not pending:
            torch.autograd.Variable._execution_engine.queue_callback(round_pending)
        pending.append(p)
        if grad_format.concat_block is None:
            keys.append(grad_format.next_key())

    for p in model.parameters():
        if p.requires_grad:
            handles.append(p.register_post_accumulate_grad_hook(grad_hook))
    return handles


install_fp16_emulation = partial(install_emulation, forward_format=FP16, grad_format=FP16)
install_fp16_emulation.__doc__ = "Round layer outputs, their incoming gradients and parameter gradients to fp16."
